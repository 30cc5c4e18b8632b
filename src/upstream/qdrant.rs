//! A Qdrant REST client: vector search in a named collection, passage text
//! from the payload. Query vectors come from an [`Embedder`].

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{json, Value};

use super::openai::retry_after;
use super::{Dependency, Embedder, Passage, UpstreamError, UpstreamErrorKind, VectorStore};

/// Client for one Qdrant collection.
#[derive(Clone)]
pub struct QdrantClient {
    http: reqwest::Client,
    search_url: String,
    text_field: String,
    embedder: Arc<dyn Embedder>,
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
        })
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

    async fn search(&self, query: &str, top_k: usize) -> Result<Vec<Passage>, UpstreamError> {
        let vector = self.embedder.embed(query).await?;
        let body = json!({ "vector": vector, "limit": top_k, "with_payload": true });
        let err = |e: reqwest::Error| UpstreamError::from_reqwest(Dependency::VectorStore, &e);
        let resp = self
            .http
            .post(&self.search_url)
            .json(&body)
            .send()
            .await
            .map_err(err)?;
        let status = resp.status();
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
        Ok(parsed
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
            .collect())
    }
}
