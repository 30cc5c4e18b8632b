//! `POST /v1/embeddings`: OpenAI's embeddings API over the simulator's
//! hashed bag-of-words [`embed`], the same function that indexed the
//! built-in collection, so lexical overlap decides retrieval.

use std::sync::Arc;

use axum::{
    body::Bytes,
    extract::State,
    response::{IntoResponse, Response},
    Json,
};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{
    app::AppState,
    error::{Api, ApiError},
    text::{embed, word_count},
};

/// Model name echoed when the request names none.
const DEFAULT_MODEL: &str = "levee-sim-embedding";

/// The parts of an OpenAI embeddings request the simulator reads.
#[derive(Debug, Deserialize)]
struct EmbeddingsRequest {
    input: Option<Input>,
    model: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Input {
    One(String),
    Many(Vec<String>),
}

/// Handles `POST /v1/embeddings`.
pub(crate) async fn create(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let request: EmbeddingsRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => {
            return ApiError::bad_request(
                Api::Embeddings,
                format!("'$.input' is invalid: expected a string or an array of strings ({e})"),
            )
            .into_response()
        }
    };
    let inputs = match request.input {
        None => {
            return ApiError::bad_request(Api::Embeddings, "Missing required parameter: 'input'.")
                .into_response()
        }
        Some(Input::One(text)) => vec![text],
        Some(Input::Many(texts)) if texts.is_empty() => {
            return ApiError::bad_request(Api::Embeddings, "'$.input' must not be empty.")
                .into_response()
        }
        Some(Input::Many(texts)) => texts,
    };

    let dim = state.config.dim;
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(index, text)| {
            json!({"object": "embedding", "index": index, "embedding": embed(text, dim)})
        })
        .collect();
    let words: u64 = inputs.iter().map(|t| word_count(t)).sum();
    Json(json!({
        "object": "list",
        "data": data,
        "model": request.model.unwrap_or_else(|| DEFAULT_MODEL.to_owned()),
        "usage": {"prompt_tokens": words, "total_tokens": words},
    }))
    .into_response()
}
