//! Fault injection: one fault set per API (chat, embeddings, vector),
//! replaced through `POST /_faults`, applied by a middleware in front of the
//! API routes only, so the control endpoints keep answering while the
//! "upstream" misbehaves.
//!
//! Order within a request: count the arrival, sleep the latency, then reset
//! the connection, hang, or answer an error; otherwise serve normally. A
//! chat completion that gets through is served by the capacity model
//! (`capacity`), which decides whether the latency is spent before its
//! slot or as its service time. Two faults act later, on the SSE body of a
//! streamed completion: `stream_chunk_delay_ms` spaces its frames and
//! `stream_fail_after` cuts it short.
//!
//! The chat model's settings (`capacity`, `service_ms`, `per_token_ms`)
//! travel in the same command and follow the same rule: a command for
//! chat (or all) replaces them, absent fields back to the command line's.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    body::Bytes,
    extract::{Request, State},
    http::StatusCode,
    middleware::Next,
    response::{IntoResponse, Response},
    Json,
};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use serde_json::{json, Value};
use thiserror::Error;
use tokio::sync::watch;

use super::{
    app::AppState,
    config::{MAX_CAPACITY, MAX_PER_TOKEN_MS, MAX_SERVICE_MS},
    error::{Api, ApiError},
    server::ConnectionControl,
};

/// Longest a hung request is held before it is answered with a 503, so
/// forgotten hangs cannot pile up connections forever.
pub const HANG_MAX: Duration = Duration::from_secs(600);

/// Status of injected errors when the spec names none.
const DEFAULT_ERROR_STATUS: u16 = 500;

/// A fault command, the body of `POST /_faults`. Every field is optional;
/// the command replaces the whole fault set of its target.
///
/// Serialisable so tests can build commands with types instead of JSON.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FaultSpec {
    /// Sleep this long before answering (or before any other fault). For
    /// a chat call that gets through it is the service time, spent holding
    /// a slot, unless `service_ms` is set (then it is spent before queueing).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<u64>,
    /// Fraction of requests, 0..=1, answered with `error_status`;
    /// deterministic: request n fails iff `floor(n*rate) != floor((n-1)*rate)`,
    /// counting from the command.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_rate: Option<f64>,
    /// Status of injected errors, 400..=599; 500 when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_status: Option<u16>,
    /// Never answer: hold the request until the faults change or [`HANG_MAX`].
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub hang: bool,
    /// Close the TCP connection with an RST instead of answering.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub reset: bool,
    /// Delay between SSE chunks of streamed chat completions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream_chunk_delay_ms: Option<u64>,
    /// A streamed chat completion sends this many SSE frames, then its body
    /// fails: the connection is dropped without the terminating chunk and
    /// without `data: [DONE]`, as when an LLM dies mid-generation (0: the
    /// 200 and headers, then nothing). A stream with no more frames than
    /// this ends normally; non-streamed calls are unaffected. Chat only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream_fail_after: Option<u64>,
    /// Adds `Retry-After: N` to injected errors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_s: Option<u64>,
    /// Concurrent chat completions served (0 = unlimited); chat only.
    /// Absent: the command line's `--capacity`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity: Option<usize>,
    /// Base service time of a chat completion, holding its slot; chat
    /// only. Absent: the command line's `--service-ms`, else `latency_ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_ms: Option<u64>,
    /// Service time per completion token returned; chat only. Absent: the
    /// command line's `--per-token-ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_token_ms: Option<u64>,
    /// Which API the command is for; all of them when absent.
    pub target: FaultTarget,
}

/// The API a [`FaultSpec`] applies to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FaultTarget {
    /// Chat, embeddings and vector store alike.
    #[default]
    All,
    /// `POST /v1/chat/completions` and `GET /v1/models`.
    Chat,
    /// `POST /v1/embeddings`.
    Embeddings,
    /// The Qdrant endpoints under `/collections/`.
    Vector,
}

/// Why a fault command was refused; the message names the field.
#[derive(Debug, Error, PartialEq)]
pub enum FaultSpecError {
    /// The body is not JSON at all.
    #[error("fault spec is not valid JSON: {0}")]
    Json(String),
    /// The body is JSON but not an object.
    #[error("fault spec must be a JSON object")]
    NotAnObject,
    /// A key the simulator does not know.
    #[error("unknown field `{0}`")]
    UnknownField(String),
    /// A known key with a value of the wrong type.
    #[error("invalid value for field `{field}`: {reason}")]
    InvalidField {
        /// The offending key.
        field: &'static str,
        /// What was wrong with its value.
        reason: String,
    },
}

/// The fault set currently applied to one API.
#[derive(Debug, Clone, PartialEq, Serialize)]
struct FaultSet {
    latency_ms: u64,
    error_rate: f64,
    error_status: u16,
    hang: bool,
    reset: bool,
    stream_chunk_delay_ms: u64,
    stream_fail_after: Option<u64>,
    retry_after_s: Option<u64>,
}

/// What the SSE body of a streamed completion suffers, read once when the
/// completion is created so one stream sees one consistent fault set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct StreamFaults {
    /// Wait before every frame but the first.
    pub(crate) chunk_delay: Duration,
    /// Fail the body after this many frames.
    pub(crate) fail_after: Option<u64>,
}

#[derive(Debug, Default)]
struct Slot {
    set: FaultSet,
    /// Requests seen since the set was installed; drives `error_rate`.
    arrivals: u64,
}

/// The fault sets of all APIs and the signal that releases hung requests.
#[derive(Debug)]
pub(crate) struct Faults {
    slots: Mutex<[Slot; 3]>,
    /// Bumped whenever hung requests should give up.
    release: watch::Sender<u64>,
}

/// What the middleware does with one request.
#[derive(Debug, PartialEq)]
enum Action {
    Pass,
    Error {
        status: StatusCode,
        retry_after_s: Option<u64>,
    },
    Hang,
    Reset,
}

impl FaultSpec {
    /// Parses and validates a `POST /_faults` body.
    pub fn from_json(body: &[u8]) -> Result<Self, FaultSpecError> {
        let value: Value =
            serde_json::from_slice(body).map_err(|e| FaultSpecError::Json(e.to_string()))?;
        let Value::Object(fields) = value else {
            return Err(FaultSpecError::NotAnObject);
        };
        let mut spec = Self::default();
        for (key, value) in fields {
            match key.as_str() {
                "latency_ms" => spec.latency_ms = field("latency_ms", value)?,
                "error_rate" => spec.error_rate = field("error_rate", value)?,
                "error_status" => spec.error_status = field("error_status", value)?,
                "hang" => spec.hang = field("hang", value)?.unwrap_or(false),
                "reset" => spec.reset = field("reset", value)?.unwrap_or(false),
                "stream_chunk_delay_ms" => {
                    spec.stream_chunk_delay_ms = field("stream_chunk_delay_ms", value)?;
                }
                "stream_fail_after" => {
                    spec.stream_fail_after = field("stream_fail_after", value)?;
                }
                "retry_after_s" => spec.retry_after_s = field("retry_after_s", value)?,
                "capacity" => spec.capacity = field("capacity", value)?,
                "service_ms" => spec.service_ms = field("service_ms", value)?,
                "per_token_ms" => spec.per_token_ms = field("per_token_ms", value)?,
                "target" => spec.target = field("target", value)?.unwrap_or_default(),
                _ => return Err(FaultSpecError::UnknownField(key)),
            }
        }
        spec.validate()?;
        Ok(spec)
    }

    /// Checks value ranges, naming the bad field.
    pub fn validate(&self) -> Result<(), FaultSpecError> {
        if let Some(rate) = self.error_rate {
            if !(0.0..=1.0).contains(&rate) {
                return Err(FaultSpecError::InvalidField {
                    field: "error_rate",
                    reason: format!("must be between 0 and 1, got {rate}"),
                });
            }
        }
        if let Some(status) = self.error_status {
            if !(400..=599).contains(&status) {
                return Err(FaultSpecError::InvalidField {
                    field: "error_status",
                    reason: format!("must be an HTTP error status (400..=599), got {status}"),
                });
            }
        }
        self.validate_chat_only()
    }

    /// The chat model's fields and `stream_fail_after`: within their
    /// bounds, and only for chat (a command for embeddings or vector that
    /// sets them is a mistake, not a no-op to ignore silently).
    fn validate_chat_only(&self) -> Result<(), FaultSpecError> {
        let fields = [
            (
                "capacity",
                self.capacity.map(|c| c as u64),
                MAX_CAPACITY as u64,
            ),
            ("service_ms", self.service_ms, MAX_SERVICE_MS),
            ("per_token_ms", self.per_token_ms, MAX_PER_TOKEN_MS),
            ("stream_fail_after", self.stream_fail_after, u64::MAX),
        ];
        for (field, value, max) in fields {
            let Some(value) = value else { continue };
            if matches!(self.target, FaultTarget::Embeddings | FaultTarget::Vector) {
                return Err(FaultSpecError::InvalidField {
                    field,
                    reason: "applies to chat completions only (target chat or all)".to_owned(),
                });
            }
            if value > max {
                return Err(FaultSpecError::InvalidField {
                    field,
                    reason: format!("must be at most {max}, got {value}"),
                });
            }
        }
        Ok(())
    }
}

/// Deserialises one field; `null` counts as absent.
fn field<T: DeserializeOwned>(
    name: &'static str,
    value: Value,
) -> Result<Option<T>, FaultSpecError> {
    if value.is_null() {
        return Ok(None);
    }
    serde_json::from_value(value)
        .map(Some)
        .map_err(|e| FaultSpecError::InvalidField {
            field: name,
            reason: e.to_string(),
        })
}

impl Default for FaultSet {
    fn default() -> Self {
        Self {
            latency_ms: 0,
            error_rate: 0.0,
            error_status: DEFAULT_ERROR_STATUS,
            hang: false,
            reset: false,
            stream_chunk_delay_ms: 0,
            stream_fail_after: None,
            retry_after_s: None,
        }
    }
}

impl From<&FaultSpec> for FaultSet {
    fn from(spec: &FaultSpec) -> Self {
        Self {
            latency_ms: spec.latency_ms.unwrap_or(0),
            error_rate: spec.error_rate.unwrap_or(0.0),
            error_status: spec.error_status.unwrap_or(DEFAULT_ERROR_STATUS),
            hang: spec.hang,
            reset: spec.reset,
            stream_chunk_delay_ms: spec.stream_chunk_delay_ms.unwrap_or(0),
            stream_fail_after: spec.stream_fail_after,
            retry_after_s: spec.retry_after_s,
        }
    }
}

impl FaultSet {
    /// Whether the `n`th request (from 1) under this set gets an error.
    fn errors_on(&self, n: u64) -> bool {
        #[allow(clippy::cast_precision_loss)] // request counts stay far below 2^52
        let (now, before) = (n as f64 * self.error_rate, (n - 1) as f64 * self.error_rate);
        self.error_rate > 0.0 && now.floor() != before.floor()
    }
}

impl Faults {
    /// No faults anywhere.
    pub(crate) fn new() -> Self {
        Self {
            slots: Mutex::new(Default::default()),
            release: watch::Sender::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, [Slot; 3]> {
        self.slots.lock().expect("fault slots lock poisoned")
    }

    /// Counts an arrival for `api` and decides its latency and fate.
    fn decide(&self, api: Api) -> (Duration, Action) {
        let mut slots = self.lock();
        let slot = &mut slots[api.index()];
        slot.arrivals += 1;
        let set = &slot.set;
        let action = if set.reset {
            Action::Reset
        } else if set.hang {
            Action::Hang
        } else if set.errors_on(slot.arrivals) {
            Action::Error {
                status: StatusCode::from_u16(set.error_status)
                    .expect("error_status was validated to 400..=599"),
                retry_after_s: set.retry_after_s,
            }
        } else {
            Action::Pass
        };
        (Duration::from_millis(set.latency_ms), action)
    }

    /// Installs `spec` for its target(s), restarting their error counters.
    pub(crate) fn replace(&self, spec: &FaultSpec) {
        let apis: &[Api] = match spec.target {
            FaultTarget::All => &Api::ALL,
            FaultTarget::Chat => &[Api::Chat],
            FaultTarget::Embeddings => &[Api::Embeddings],
            FaultTarget::Vector => &[Api::Vector],
        };
        {
            let mut slots = self.lock();
            for api in apis {
                slots[api.index()] = Slot {
                    set: FaultSet::from(spec),
                    arrivals: 0,
                };
            }
        }
        self.release_hangs();
    }

    /// Removes every fault.
    pub(crate) fn clear(&self) {
        *self.lock() = Default::default();
        self.release_hangs();
    }

    /// Lets every hung request answer now (faults changed, or shutdown).
    pub(crate) fn release_hangs(&self) {
        self.release.send_modify(|generation| *generation += 1);
    }

    /// The SSE faults currently configured for `api`.
    pub(crate) fn stream_faults(&self, api: Api) -> StreamFaults {
        let set = &self.lock()[api.index()].set;
        StreamFaults {
            chunk_delay: Duration::from_millis(set.stream_chunk_delay_ms),
            fail_after: set.stream_fail_after,
        }
    }

    /// `{"chat":{..},"embeddings":{..},"vector":{..}}`.
    fn snapshot(&self) -> Value {
        let slots = self.lock();
        let mut out = serde_json::Map::new();
        for api in Api::ALL {
            out.insert(api.name().to_owned(), json!(slots[api.index()].set));
        }
        Value::Object(out)
    }
}

/// Middleware in front of the API routes: counts the request, then applies
/// its API's fault set.
pub(crate) async fn apply(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(api) = Api::classify(request.uri().path()) else {
        return next.run(request).await;
    };
    state.stats.record_arrival(api, request.headers());
    // Subscribe before deciding so a release racing with the decision is seen.
    let mut released = state.faults.release.subscribe();
    let (latency, action) = state.faults.decide(api);
    // Only completions occupy the model; a model listing is answered by
    // the API front end, like any other request.
    let completion = api == Api::Chat && request.uri().path() != "/v1/models";
    if completion && action == Action::Pass {
        return state.capacity.serve(latency, request, next).await;
    }
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    match action {
        Action::Pass => next.run(request).await,
        Action::Error {
            status,
            retry_after_s,
        } => {
            state.stats.record_error();
            ApiError::new(api, status, format!("simulated upstream error ({status})"))
                .retry_after(retry_after_s)
                .into_response()
        }
        Action::Hang => {
            state.stats.record_hang();
            tokio::select! {
                () = tokio::time::sleep(HANG_MAX) => {}
                _ = released.changed() => {}
            }
            ApiError::new(
                api,
                StatusCode::SERVICE_UNAVAILABLE,
                "simulated hang released",
            )
            .into_response()
        }
        Action::Reset => {
            state.stats.record_reset();
            match request.extensions().get::<ConnectionControl>() {
                Some(connection) => {
                    connection.reset();
                    // The connection task drops this future with the socket.
                    std::future::pending().await
                }
                None => ApiError::new(
                    api,
                    StatusCode::BAD_GATEWAY,
                    "simulated connection reset (no socket to reset outside sim::serve)",
                )
                .into_response(),
            }
        }
    }
}

/// The fault sets, the chat one with the chat model's settings.
fn snapshot(state: &AppState) -> Value {
    let mut out = state.faults.snapshot();
    if let (Some(Value::Object(chat)), Value::Object(model)) =
        (out.get_mut(Api::Chat.name()), state.capacity.settings())
    {
        chat.extend(model);
    }
    out
}

/// `GET /_faults`.
pub(crate) async fn show(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(snapshot(&state))
}

/// `POST /_faults`: replaces the fault set of the command's target (and,
/// for chat, the chat model's settings).
pub(crate) async fn replace(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    match FaultSpec::from_json(&body) {
        Ok(spec) => {
            state.faults.replace(&spec);
            state.capacity.replace(&spec);
            Json(snapshot(&state)).into_response()
        }
        Err(e) => (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": e.to_string()})),
        )
            .into_response(),
    }
}

/// `DELETE /_faults`: clears every fault and restores the command line's
/// chat model.
pub(crate) async fn clear(State(state): State<Arc<AppState>>) -> Json<Value> {
    state.faults.clear();
    state.capacity.reset();
    Json(snapshot(&state))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors_in(rate: f64, requests: u64) -> Vec<u64> {
        let set = FaultSet {
            error_rate: rate,
            ..FaultSet::default()
        };
        (1..=requests).filter(|&n| set.errors_on(n)).collect()
    }

    #[test]
    fn error_rate_is_a_deterministic_fraction() {
        assert_eq!(errors_in(0.5, 10), vec![2, 4, 6, 8, 10]);
        assert_eq!(errors_in(1.0, 3), vec![1, 2, 3]);
        assert_eq!(errors_in(0.0, 10), Vec::<u64>::new());
        assert_eq!(errors_in(0.25, 8), vec![4, 8]);
    }

    #[test]
    fn spec_errors_name_the_field() {
        let err = FaultSpec::from_json(br#"{"latency_ms": "slow"}"#).expect_err("bad type");
        assert!(err.to_string().contains("`latency_ms`"), "{err}");
        let err = FaultSpec::from_json(br#"{"error_rate": 1.5}"#).expect_err("out of range");
        assert!(err.to_string().contains("`error_rate`"), "{err}");
        let err = FaultSpec::from_json(br#"{"latncy_ms": 5}"#).expect_err("unknown");
        assert_eq!(err, FaultSpecError::UnknownField("latncy_ms".into()));
        let err = FaultSpec::from_json(br#"{"target": "llm"}"#).expect_err("bad target");
        assert!(err.to_string().contains("`target`"), "{err}");
    }

    #[test]
    fn capacity_fields_are_chat_only_and_bounded() {
        let spec =
            FaultSpec::from_json(br#"{"capacity": 2, "service_ms": 100, "per_token_ms": 3}"#)
                .expect("valid for all");
        assert_eq!(
            (spec.capacity, spec.service_ms, spec.per_token_ms),
            (Some(2), Some(100), Some(3))
        );
        let err = FaultSpec::from_json(br#"{"capacity": 2, "target": "vector"}"#)
            .expect_err("vector has no slots");
        assert!(err.to_string().contains("`capacity`"), "{err}");
        let err = FaultSpec::from_json(br#"{"service_ms": 600001}"#).expect_err("too long");
        assert!(err.to_string().contains("`service_ms`"), "{err}");
        let err = FaultSpec::from_json(br#"{"capacity": -1}"#).expect_err("negative");
        assert!(err.to_string().contains("`capacity`"), "{err}");
    }

    #[test]
    fn stream_fail_after_is_chat_only_and_reaches_the_chat_stream_faults() {
        let spec = FaultSpec::from_json(br#"{"stream_fail_after": 3, "target": "chat"}"#)
            .expect("valid for chat");
        assert_eq!(spec.stream_fail_after, Some(3));
        let all = FaultSpec::from_json(br#"{"stream_fail_after": 0}"#).expect("valid for all");
        assert_eq!(all.stream_fail_after, Some(0));
        for target in ["embeddings", "vector"] {
            let body = format!(r#"{{"stream_fail_after": 3, "target": "{target}"}}"#);
            let err = FaultSpec::from_json(body.as_bytes()).expect_err("chat only");
            assert!(err.to_string().contains("`stream_fail_after`"), "{err}");
        }
        let err = FaultSpec::from_json(br#"{"stream_fail_after": -1}"#).expect_err("negative");
        assert!(err.to_string().contains("`stream_fail_after`"), "{err}");

        let faults = Faults::new();
        faults.replace(&spec);
        assert_eq!(
            faults.stream_faults(Api::Chat),
            StreamFaults {
                chunk_delay: Duration::ZERO,
                fail_after: Some(3)
            }
        );
        assert_eq!(faults.snapshot()["chat"]["stream_fail_after"], 3);
        assert_eq!(
            faults.snapshot()["vector"]["stream_fail_after"],
            Value::Null
        );
        faults.clear();
        assert_eq!(faults.stream_faults(Api::Chat), StreamFaults::default());
    }

    #[test]
    fn replacing_one_target_leaves_the_others() {
        let faults = Faults::new();
        faults.replace(&FaultSpec {
            reset: true,
            ..FaultSpec::default()
        });
        faults.replace(&FaultSpec {
            latency_ms: Some(7),
            target: FaultTarget::Chat,
            ..FaultSpec::default()
        });
        assert_eq!(
            faults.decide(Api::Chat),
            (Duration::from_millis(7), Action::Pass)
        );
        assert_eq!(faults.decide(Api::Vector), (Duration::ZERO, Action::Reset));
    }
}
