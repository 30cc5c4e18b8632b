//! A tiny in-memory Qdrant: collections of points with cosine search over
//! the REST shapes the gateway's client uses (`points/search`, upsert,
//! collection info), preloaded with the Acme knowledge base.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, RwLock,
    },
};

use axum::{
    body::Bytes,
    extract::{Path, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    Json,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::{
    app::AppState,
    error::{Api, ApiError},
    text::{dot, embed, normalise},
};

/// The Acme knowledge base: a JSON array of `{id, title, source, text}`.
const ACME_KB: &str = include_str!("../../../data/acme_kb.json");

/// Qdrant's default `limit` for a search.
const DEFAULT_LIMIT: usize = 10;

/// One document of the built-in knowledge base.
#[derive(Debug, Deserialize)]
struct KbDoc {
    id: String,
    title: String,
    source: String,
    text: String,
}

/// A Qdrant point id: an unsigned integer or a UUID string.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(untagged)]
enum PointId {
    Num(u64),
    Uuid(String),
}

#[derive(Debug, Clone)]
struct Point {
    /// Unit length: Qdrant normalises vectors of cosine collections on write.
    vector: Vec<f32>,
    payload: Map<String, Value>,
}

#[derive(Debug)]
struct Collection {
    dim: usize,
    points: BTreeMap<PointId, Point>,
}

/// All collections of one simulator.
#[derive(Debug)]
pub(crate) struct VectorStore {
    collections: RwLock<HashMap<String, Collection>>,
    next_operation: AtomicU64,
}

#[derive(Debug, Deserialize)]
struct SearchRequest {
    vector: VectorInput,
    limit: Option<usize>,
    #[serde(default)]
    offset: usize,
    #[serde(default)]
    with_payload: Option<WithPayload>,
    score_threshold: Option<f32>,
}

/// `vector` as a plain array or Qdrant's named form `{name, vector}`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum VectorInput {
    Plain(Vec<f32>),
    Named { vector: Vec<f32> },
}

/// `with_payload` as a flag or a list of payload keys to include.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum WithPayload {
    All(bool),
    Keys(Vec<String>),
}

#[derive(Debug, Deserialize)]
struct UpsertRequest {
    points: Vec<UpsertPoint>,
}

#[derive(Debug, Deserialize)]
struct UpsertPoint {
    id: PointId,
    vector: VectorInput,
    #[serde(default)]
    payload: Option<Map<String, Value>>,
}

#[derive(Debug, Deserialize)]
struct CreateRequest {
    vectors: VectorParams,
}

#[derive(Debug, Deserialize)]
struct VectorParams {
    size: usize,
}

impl VectorInput {
    fn into_vec(self) -> Vec<f32> {
        match self {
            VectorInput::Plain(v) | VectorInput::Named { vector: v } => v,
        }
    }
}

impl VectorStore {
    /// A store holding the Acme knowledge base as `collection`, one point per
    /// document (ids 1..=n) embedded from `title + " " + text`.
    pub(crate) fn with_knowledge_base(collection: &str, dim: usize) -> Self {
        let docs: Vec<KbDoc> =
            serde_json::from_str(ACME_KB).expect("the bundled acme_kb.json is valid");
        let points = docs
            .into_iter()
            .zip(1_u64..)
            .map(|(doc, id)| {
                let vector = embed(&format!("{} {}", doc.title, doc.text), dim);
                let payload = Map::from_iter([
                    ("text".to_owned(), Value::from(doc.text)),
                    ("title".to_owned(), Value::from(doc.title)),
                    ("source".to_owned(), Value::from(doc.source)),
                    ("doc_id".to_owned(), Value::from(doc.id)),
                ]);
                (PointId::Num(id), Point { vector, payload })
            })
            .collect();
        let collections = HashMap::from([(collection.to_owned(), Collection { dim, points })]);
        Self {
            collections: RwLock::new(collections),
            next_operation: AtomicU64::new(0),
        }
    }
}

fn not_found(name: &str) -> ApiError {
    ApiError::new(
        Api::Vector,
        StatusCode::NOT_FOUND,
        format!("Not found: Collection `{name}` doesn't exist!"),
    )
}

fn wrong_dim(expected: usize, got: usize) -> ApiError {
    ApiError::bad_request(
        Api::Vector,
        format!("Wrong input: Vector dimension error: expected dim: {expected}, got {got}"),
    )
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(Api::Vector, format!("Format error in JSON body: {e}")))
}

fn ok(result: &Value) -> Response {
    Json(json!({"result": result, "status": "ok", "time": 0.0001})).into_response()
}

/// Handles `POST /collections/{name}/points/search`.
pub(crate) async fn search(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: SearchRequest = parse(&body)?;
    let limit = request.limit.unwrap_or(DEFAULT_LIMIT);
    let mut query = request.vector.into_vec();
    normalise(&mut query);

    let collections = state
        .store
        .collections
        .read()
        .expect("vector store lock poisoned");
    let collection = collections.get(&name).ok_or_else(|| not_found(&name))?;
    if query.len() != collection.dim {
        return Err(wrong_dim(collection.dim, query.len()));
    }
    let mut hits: Vec<(f32, &PointId, &Point)> = collection
        .points
        .iter()
        .map(|(id, point)| (dot(&query, &point.vector), id, point))
        .filter(|(score, _, _)| match request.score_threshold {
            Some(threshold) => *score >= threshold,
            None => *score > 0.0,
        })
        .collect();
    hits.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1)));

    let result: Vec<Value> = hits
        .into_iter()
        .skip(request.offset)
        .take(limit)
        .map(|(score, id, point)| {
            let mut hit = json!({"id": id, "version": 0, "score": score});
            if let Some(payload) = select_payload(&point.payload, request.with_payload.as_ref()) {
                hit["payload"] = Value::Object(payload);
            }
            hit
        })
        .collect();
    Ok(ok(&Value::Array(result)))
}

/// The payload a search hit carries; Qdrant's default is none.
fn select_payload(
    payload: &Map<String, Value>,
    with: Option<&WithPayload>,
) -> Option<Map<String, Value>> {
    match with {
        None | Some(WithPayload::All(false)) => None,
        Some(WithPayload::All(true)) => Some(payload.clone()),
        Some(WithPayload::Keys(keys)) => Some(
            payload
                .iter()
                .filter(|(k, _)| keys.contains(k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
    }
}

/// Handles `PUT /collections/{name}/points`, creating the collection with
/// the first point's dimension if it does not exist.
pub(crate) async fn upsert(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: UpsertRequest = parse(&body)?;
    let points: Vec<(PointId, Point)> = request
        .points
        .into_iter()
        .map(|p| {
            let mut vector = p.vector.into_vec();
            normalise(&mut vector);
            let payload = p.payload.unwrap_or_default();
            (p.id, Point { vector, payload })
        })
        .collect();

    let mut collections = state
        .store
        .collections
        .write()
        .expect("vector store lock poisoned");
    let dim = match collections.get(&name) {
        Some(collection) => collection.dim,
        None => points
            .first()
            .map_or(state.config.dim, |(_, p)| p.vector.len()),
    };
    if let Some((_, bad)) = points.iter().find(|(_, p)| p.vector.len() != dim) {
        return Err(wrong_dim(dim, bad.vector.len()));
    }
    let collection = collections.entry(name).or_insert_with(|| Collection {
        dim,
        points: BTreeMap::new(),
    });
    collection.points.extend(points);
    let operation_id = state.store.next_operation.fetch_add(1, Ordering::Relaxed);
    Ok(ok(
        &json!({"operation_id": operation_id, "status": "completed"}),
    ))
}

/// Handles `PUT /collections/{name}`: creates an empty collection.
pub(crate) async fn create_collection(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: CreateRequest = parse(&body)?;
    if request.vectors.size == 0 {
        return Err(ApiError::bad_request(
            Api::Vector,
            "Wrong input: Vector size must be positive",
        ));
    }
    let mut collections = state
        .store
        .collections
        .write()
        .expect("vector store lock poisoned");
    if collections.contains_key(&name) {
        return Err(ApiError::new(
            Api::Vector,
            StatusCode::CONFLICT,
            format!("Wrong input: Collection `{name}` already exists!"),
        ));
    }
    collections.insert(
        name,
        Collection {
            dim: request.vectors.size,
            points: BTreeMap::new(),
        },
    );
    Ok(ok(&Value::Bool(true)))
}

/// Handles `GET /collections/{name}`.
pub(crate) async fn info(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let collections = state
        .store
        .collections
        .read()
        .expect("vector store lock poisoned");
    let collection = collections.get(&name).ok_or_else(|| not_found(&name))?;
    let count = collection.points.len();
    Ok(ok(&json!({
        "status": "green",
        "optimizer_status": "ok",
        "points_count": count,
        "indexed_vectors_count": count,
        "segments_count": 1,
        "config": {"params": {"vectors": {"size": collection.dim, "distance": "Cosine"}}},
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knowledge_base_loads_one_point_per_document() {
        let store = VectorStore::with_knowledge_base("kb", 64);
        let collections = store.collections.read().expect("not poisoned");
        let kb = &collections["kb"];
        assert_eq!(kb.points.len(), 8);
        let first = &kb.points[&PointId::Num(1)];
        assert_eq!(first.payload["doc_id"], "hr-pto");
        assert_eq!(first.vector.len(), 64);
    }
}
