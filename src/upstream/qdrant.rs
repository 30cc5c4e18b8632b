//! A Qdrant REST client: vector search in a named collection, passage text
//! from the payload. Query vectors come from an [`Embedder`].

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::time::Instant;
use tracing::Instrument;

use super::metrics::UpstreamMetrics;
use super::openai::retry_after;
use super::{Dependency, Embedder, Passage, UpstreamError, UpstreamErrorKind, VectorStore};
use crate::telemetry::client::{self, ServerAddr};
use crate::telemetry::propagation;

/// Client for one Qdrant collection.
#[derive(Clone)]
pub struct QdrantClient {
    http: reqwest::Client,
    search_url: String,
    text_field: String,
    embedder: Arc<dyn Embedder>,
    /// Collection, host and port for span attributes.
    collection: String,
    server: ServerAddr,
    metrics: Option<UpstreamMetrics>,
}

impl std::fmt::Debug for QdrantClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QdrantClient")
            .field("search_url", &self.search_url)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct SearchResponse {
    result: Vec<ScoredPoint>,
}

#[derive(Deserialize)]
struct ScoredPoint {
    id: Value,
    score: f32,
    #[serde(default)]
    payload: Option<serde_json::Map<String, Value>>,
}

impl QdrantClient {
    /// Builds a client searching `collection` at `base_url`.
    pub fn new(
        base_url: &str,
        collection: &str,
        text_field: &str,
        timeout: Duration,
        connect_timeout: Duration,
        embedder: Arc<dyn Embedder>,
    ) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            .connect_timeout(connect_timeout)
            .timeout(timeout)
            .build()?;
        Ok(Self {
            http,
            search_url: format!(
                "{}/collections/{collection}/points/search",
                base_url.trim_end_matches('/')
            ),
            text_field: text_field.to_owned(),
            embedder,
            collection: collection.to_owned(),
            server: ServerAddr::from_url(base_url),
            metrics: None,
        })
    }

    /// Records each search's latency into `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: UpstreamMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The points search inside its CLIENT span, timed, carrying the trace
    /// context.
    async fn search_points(
        &self,
        vector: Vec<f32>,
        top_k: usize,
    ) -> Result<Vec<Passage>, UpstreamError> {
        let span = client::vector_span(&self.collection, &self.server);
        let start = Instant::now();
        let result = self
            .search_points_inner(vector, top_k)
            .instrument(span.clone())
            .await;
        span.in_scope(|| {
            if let Ok(found) = &result {
                span.record("levee.vector.results", client::int(found.len()));
            }
            super::trace::finish(
                self.metrics.as_ref(),
                Dependency::VectorStore,
                start.elapsed(),
                &result,
            );
        });
        result
    }

    async fn search_points_inner(
        &self,
        vector: Vec<f32>,
        top_k: usize,
    ) -> Result<Vec<Passage>, UpstreamError> {
        let body = json!({ "vector": vector, "limit": top_k, "with_payload": true });
        let err = |e: reqwest::Error| UpstreamError::from_reqwest(Dependency::VectorStore, &e);
        let mut trace_headers = reqwest::header::HeaderMap::new();
        propagation::inject_current(&mut trace_headers);
        let resp = self
            .http
            .post(&self.search_url)
            .headers(trace_headers)
            .json(&body)
            .send()
            .await
            .map_err(err)?;
        let status = resp.status();
        tracing::Span::current().record("http.response.status_code", client::int(status.as_u16()));
        if !status.is_success() {
            return Err(UpstreamError::new(
                Dependency::VectorStore,
                UpstreamErrorKind::Status {
                    status: status.as_u16(),
                    retry_after: retry_after(resp.headers()),
                },
            ));
        }
        let parsed: SearchResponse = resp.json().await.map_err(err)?;
        Ok(self.passages(parsed))
    }

    fn passages(&self, parsed: SearchResponse) -> Vec<Passage> {
        parsed
            .result
            .into_iter()
            .filter_map(|point| {
                let payload = point.payload?;
                let text = payload_str(&payload, &self.text_field)?;
                let id = payload_str(&payload, "doc_id").unwrap_or_else(|| match &point.id {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                });
                Some(Passage {
                    title: payload_str(&payload, "title").unwrap_or_else(|| id.clone()),
                    source: payload_str(&payload, "source").unwrap_or_default(),
                    id,
                    text,
                    score: point.score,
                })
            })
            .collect()
    }
}

fn payload_str(payload: &serde_json::Map<String, Value>, key: &str) -> Option<String> {
    payload.get(key).and_then(Value::as_str).map(str::to_owned)
}

#[async_trait]
impl VectorStore for QdrantClient {
    fn kind(&self) -> &'static str {
        "qdrant"
    }

    async fn search(
        &self,
        query: &str,
        top_k: usize,
        _tenant: &str,
    ) -> Result<Vec<Passage>, UpstreamError> {
        let vector = self.embedder.embed(query).await?;
        self.search_points(vector, top_k).await
    }
}
