//! An in-process OTLP trace receiver on a free loopback port, speaking both
//! OTLP/gRPC (tonic `TraceService`) and OTLP/HTTP protobuf (`POST
//! /v1/traces`), that keeps every span it receives for assertions.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::response::IntoResponse as _;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// `Span.kind` values.
pub const KIND_INTERNAL: i32 = 1;
/// A SERVER span.
pub const KIND_SERVER: i32 = 2;
/// A CLIENT span.
pub const KIND_CLIENT: i32 = 3;
/// `Status.code` of an error.
pub const STATUS_ERROR: i32 = 2;

/// One received span with the flattened attributes of its resource.
#[derive(Debug, Clone)]
pub struct Received {
    /// The span.
    pub span: Span,
    /// Its resource's attributes (`service.name` …).
    pub resource: HashMap<String, String>,
}

impl Received {
    /// Trace id, 32 hex digits.
    pub fn trace_id(&self) -> String {
        hex::encode(&self.span.trace_id)
    }

    /// Span id, 16 hex digits.
    pub fn span_id(&self) -> String {
        hex::encode(&self.span.span_id)
    }

    /// Parent span id, 16 hex digits, or empty for a root.
    pub fn parent_id(&self) -> String {
        hex::encode(&self.span.parent_span_id)
    }

    /// An attribute rendered as a string (ints and doubles in decimal).
    pub fn attr(&self, key: &str) -> Option<String> {
        attr(&self.span.attributes, key)
    }

    /// An integer attribute.
    pub fn attr_i64(&self, key: &str) -> Option<i64> {
        self.span
            .attributes
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                AnyValue::IntValue(i) => Some(*i),
                _ => None,
            })
    }

    /// The span status code (0 unset, 1 ok, 2 error).
    pub fn status_code(&self) -> i32 {
        self.span.status.as_ref().map_or(0, |s| s.code)
    }

    /// Every attribute value, for secret scans.
    pub fn all_values(&self) -> Vec<String> {
        self.span
            .attributes
            .iter()
            .filter_map(|kv| attr(&self.span.attributes, &kv.key))
            .chain(std::iter::once(self.span.name.clone()))
            .collect()
    }
}

fn attr(attrs: &[KeyValue], key: &str) -> Option<String> {
    let v = attrs.iter().find(|kv| kv.key == key)?.value.as_ref()?;
    Some(match v.value.as_ref()? {
        AnyValue::StringValue(s) => s.clone(),
        AnyValue::IntValue(i) => i.to_string(),
        AnyValue::DoubleValue(d) => d.to_string(),
        AnyValue::BoolValue(b) => b.to_string(),
        other => format!("{other:?}"),
    })
}

#[derive(Clone, Default)]
struct Store(Arc<Mutex<Vec<Received>>>);

impl Store {
    fn add(&self, req: ExportTraceServiceRequest) {
        let mut spans = self.0.lock().expect("spans lock");
        for rs in req.resource_spans {
            let resource: HashMap<String, String> = rs
                .resource
                .map(|r| {
                    r.attributes
                        .iter()
                        .filter_map(|kv| Some((kv.key.clone(), attr(&r.attributes, &kv.key)?)))
                        .collect()
                })
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for span in ss.spans {
                    spans.push(Received {
                        span,
                        resource: resource.clone(),
                    });
                }
            }
        }
    }
}

#[tonic::async_trait]
impl TraceService for Store {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.add(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// A running receiver; both servers stop when it is dropped.
pub struct OtlpReceiver {
    store: Store,
    /// gRPC port.
    pub grpc_port: u16,
    /// HTTP port.
    pub http_port: u16,
    tasks: Vec<JoinHandle<()>>,
}

impl OtlpReceiver {
    /// Starts both servers on free loopback ports.
    pub async fn start() -> Self {
        let store = Store::default();
        let grpc = TcpListener::bind("127.0.0.1:0").await.expect("bind grpc");
        let grpc_port = grpc.local_addr().expect("addr").port();
        let svc = TraceServiceServer::new(store.clone());
        let grpc_task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(grpc))
                .await;
        });
        let http = TcpListener::bind("127.0.0.1:0").await.expect("bind http");
        let http_port = http.local_addr().expect("addr").port();
        let http_store = store.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: Bytes| {
                let store = http_store.clone();
                async move {
                    match ExportTraceServiceRequest::decode(body) {
                        Ok(req) => {
                            store.add(req);
                            (
                                [(axum::http::header::CONTENT_TYPE, "application/x-protobuf")],
                                ExportTraceServiceResponse::default().encode_to_vec(),
                            )
                                .into_response()
                        }
                        Err(_) => axum::http::StatusCode::BAD_REQUEST.into_response(),
                    }
                }
            }),
        );
        let http_task = tokio::spawn(async move {
            let _ = axum::serve(http, app).await;
        });
        Self {
            store,
            grpc_port,
            http_port,
            tasks: vec![grpc_task, http_task],
        }
    }

    /// `http://127.0.0.1:GRPC_PORT`.
    pub fn grpc_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc_port)
    }

    /// `http://127.0.0.1:HTTP_PORT` (the exporter appends `/v1/traces`).
    pub fn http_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.http_port)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Received> {
        self.store.0.lock().expect("spans lock").clone()
    }

    /// Waits until `done` holds for the spans received, up to `limit`;
    /// returns them either way.
    pub async fn wait_for(
        &self,
        limit: Duration,
        done: impl Fn(&[Received]) -> bool,
    ) -> Vec<Received> {
        let deadline = Instant::now() + limit;
        loop {
            let spans = self.spans();
            if done(&spans) || Instant::now() >= deadline {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}
