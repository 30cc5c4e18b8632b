//! The HTTP client the OTLP/HTTP exporter sends with: Levee's own reqwest
//! (no second HTTP stack), run on the Tokio runtime that was current when
//! it was built. The SDK's batch processor exports from its own thread, so
//! each request is spawned onto the runtime and its result awaited.

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use opentelemetry_http::{HttpClient, HttpError, Request, Response};

/// Bound on one export request.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// An [`HttpClient`] backed by reqwest on a Tokio runtime.
#[derive(Debug, Clone)]
pub(crate) struct OtlpHttpClient {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

impl OtlpHttpClient {
    /// A client on the current runtime.
    pub(crate) fn new() -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        let runtime = tokio::runtime::Handle::try_current()?;
        let client = reqwest::Client::builder().timeout(EXPORT_TIMEOUT).build()?;
        Ok(Self { client, runtime })
    }
}

#[async_trait]
impl HttpClient for OtlpHttpClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = self.client.clone();
        let task = self.runtime.spawn(async move {
            let (parts, body) = request.into_parts();
            let resp = client
                .request(parts.method, parts.uri.to_string())
                .headers(parts.headers)
                .body(body)
                .send()
                .await?;
            let status = resp.status();
            let headers = resp.headers().clone();
            let body = resp.bytes().await?;
            let mut out = Response::new(body);
            *out.status_mut() = status;
            *out.headers_mut() = headers;
            Ok::<_, reqwest::Error>(out)
        });
        Ok(task.await??)
    }
}
