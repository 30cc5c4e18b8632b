//! The parts of an OpenAI request body the gateway reads: the model, the
//! stream flags and the completion allowance. Everything else passes
//! through as the client sent it; the body is only rewritten for the
//! deployment's model name and `stream_options.include_usage`.

use bytes::Bytes;
use serde_json::{Map, Value};

/// What a request body asks of the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/embeddings`.
    Embeddings,
}

impl Operation {
    /// The `gen_ai.operation.name` of the call.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Chat => "chat",
            Self::Embeddings => "embeddings",
        }
    }

    /// The upstream path, relative to a deployment's base URL.
    pub fn path(self) -> &'static str {
        match self {
            Self::Chat => "/chat/completions",
            Self::Embeddings => "/embeddings",
        }
    }
}

/// A request body that is not what the API takes: the parameter at fault
/// (`None` when the body as a whole is), and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct InvalidRequest {
    /// The body parameter at fault, as OpenAI names it (`messages`,
    /// `stream_options.include_usage` …).
    pub param: Option<String>,
    /// What is wrong with it.
    pub message: String,
}

impl InvalidRequest {
    fn param(param: &str, message: impl Into<String>) -> Self {
        Self {
            param: Some(param.to_owned()),
            message: message.into(),
        }
    }
}

/// A parsed request, with its original bytes.
#[derive(Debug, Clone)]
pub struct ApiRequest {
    operation: Operation,
    raw: Bytes,
    body: Map<String, Value>,
    model: String,
    stream: bool,
    include_usage: bool,
    completion_allowance: Option<u64>,
    choices: u64,
}

impl ApiRequest {
    /// Parses a `/v1/chat/completions` body.
    pub fn chat(raw: Bytes) -> Result<Self, InvalidRequest> {
        let body = object(&raw)?;
        let model = model(&body)?;
        match body.get("messages") {
            Some(Value::Array(messages)) if !messages.is_empty() => {
                for (i, m) in messages.iter().enumerate() {
                    let role = m.get("role");
                    if !matches!(role, Some(Value::String(_))) {
                        return Err(InvalidRequest::param(
                            &format!("messages[{i}].role"),
                            format!("'messages[{i}].role' must be a string"),
                        ));
                    }
                }
            }
            Some(Value::Array(_)) => {
                return Err(InvalidRequest::param(
                    "messages",
                    "'messages' must contain at least one message",
                ))
            }
            Some(other) => {
                return Err(InvalidRequest::param(
                    "messages",
                    format!("'messages' must be an array, got {}", kind(other)),
                ))
            }
            None => {
                return Err(InvalidRequest::param(
                    "messages",
                    "missing required parameter: 'messages'",
                ))
            }
        }
        let stream = optional_bool(&body, "stream", None)?.unwrap_or(false);
        let include_usage = match body.get("stream_options") {
            None | Some(Value::Null) => false,
            Some(Value::Object(options)) => {
                optional_bool(options, "include_usage", Some("stream_options"))?.unwrap_or(false)
            }
            Some(other) => {
                return Err(InvalidRequest::param(
                    "stream_options",
                    format!("'stream_options' must be an object, got {}", kind(other)),
                ))
            }
        };
        // `max_completion_tokens` supersedes `max_tokens` (OpenAI's newer
        // name); either bounds what the reservation must cover.
        let max_tokens = optional_count(&body, "max_tokens")?;
        let max_completion = optional_count(&body, "max_completion_tokens")?;
        let choices = optional_count(&body, "n")?.unwrap_or(1).max(1);
        Ok(Self {
            operation: Operation::Chat,
            completion_allowance: max_completion.or(max_tokens),
            raw,
            body,
            model,
            stream,
            include_usage,
            choices,
        })
    }

    /// Parses a `/v1/embeddings` body.
    pub fn embeddings(raw: Bytes) -> Result<Self, InvalidRequest> {
        let body = object(&raw)?;
        let model = model(&body)?;
        match body.get("input") {
            Some(Value::String(_)) => {}
            Some(Value::Array(items)) if !items.is_empty() => {}
            Some(Value::Array(_)) => {
                return Err(InvalidRequest::param("input", "'input' must not be empty"))
            }
            Some(other) => {
                return Err(InvalidRequest::param(
                    "input",
                    format!("'input' must be a string or an array, got {}", kind(other)),
                ))
            }
            None => {
                return Err(InvalidRequest::param(
                    "input",
                    "missing required parameter: 'input'",
                ))
            }
        }
        Ok(Self {
            operation: Operation::Embeddings,
            raw,
            body,
            model,
            stream: false,
            include_usage: false,
            completion_allowance: Some(0),
            choices: 1,
        })
    }

    /// Chat or embeddings.
    pub fn operation(&self) -> Operation {
        self.operation
    }

    /// The model the client asked for.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// Whether the client asked for a stream.
    pub fn stream(&self) -> bool {
        self.stream
    }

    /// Whether the client asked for the usage chunk of a stream.
    pub fn include_usage(&self) -> bool {
        self.include_usage
    }

    /// A generous estimate of the call's tokens: about four bytes of the
    /// body a prompt token (JSON punctuation makes that an overestimate),
    /// plus the whole completion allowance of every choice, where
    /// `default_cap` stands in when the client sets none. Settled with the
    /// real usage afterwards.
    pub fn estimated_tokens(&self, default_cap: u64) -> u64 {
        let prompt = (self.raw.len() as u64).div_ceil(4);
        let allowance = self.completion_allowance.unwrap_or(default_cap);
        prompt.saturating_add(allowance.saturating_mul(self.choices))
    }

    /// The body to send upstream: the original bytes, unless the
    /// deployment serves the model under another name or a stream needs
    /// `include_usage` (always set, so usage is settled exactly).
    pub fn upstream_body(&self, upstream_model: Option<&str>) -> Bytes {
        let rename = upstream_model.filter(|m| *m != self.model);
        let inject = self.stream && !self.include_usage;
        if rename.is_none() && !inject {
            return self.raw.clone();
        }
        let mut body = self.body.clone();
        if let Some(m) = rename {
            body.insert("model".to_owned(), Value::String(m.to_owned()));
        }
        if inject {
            let options = body
                .entry("stream_options")
                .or_insert_with(|| Value::Object(Map::new()));
            if !options.is_object() {
                *options = Value::Object(Map::new());
            }
            if let Value::Object(o) = options {
                o.insert("include_usage".to_owned(), Value::Bool(true));
            }
        }
        // Serialising a map of JSON values cannot fail.
        serde_json::to_vec(&body).map_or_else(|_| self.raw.clone(), Bytes::from)
    }
}

/// serde_json's private key for an embedded raw value (its `raw_value`
/// feature, which axum turns on): an object whose *first* key it is reads
/// as the JSON text in its string. A rewritten body's keys are sorted, so a
/// client's inert last key would lead the object sent upstream, which would
/// then no longer say what the gateway checked (found by fuzz/openai_request).
const RAW_VALUE_KEY: &str = "$serde_json::private::RawValue";

fn object(raw: &[u8]) -> Result<Map<String, Value>, InvalidRequest> {
    // A `Map`, not a `Value`, at the top: it keeps RAW_VALUE_KEY a plain key.
    let Ok(body) = serde_json::from_slice::<Map<String, Value>>(raw) else {
        return Err(not_an_object(raw));
    };
    if has_raw_value_key(&body) {
        return Err(InvalidRequest::param(
            RAW_VALUE_KEY,
            format!("'{RAW_VALUE_KEY}' is not a parameter"),
        ));
    }
    Ok(body)
}

/// Why a body that is not a JSON object was refused (the error path only).
fn not_an_object(raw: &[u8]) -> InvalidRequest {
    let message = match serde_json::from_slice::<Value>(raw) {
        Ok(other) => format!(
            "the request body must be a JSON object, got {}",
            kind(&other)
        ),
        Err(e) => format!("we could not parse the JSON body of your request: {e}"),
    };
    InvalidRequest {
        param: None,
        message,
    }
}

/// Whether RAW_VALUE_KEY is a key anywhere in `body` (bounded by
/// serde_json's nesting limit of 128).
fn has_raw_value_key(body: &Map<String, Value>) -> bool {
    fn within(value: &Value) -> bool {
        match value {
            Value::Object(map) => has_raw_value_key(map),
            Value::Array(items) => items.iter().any(within),
            _ => false,
        }
    }
    body.contains_key(RAW_VALUE_KEY) || body.values().any(within)
}

fn model(body: &Map<String, Value>) -> Result<String, InvalidRequest> {
    match body.get("model") {
        Some(Value::String(m)) if !m.is_empty() => Ok(m.clone()),
        Some(Value::String(_)) => Err(InvalidRequest::param("model", "'model' must not be empty")),
        Some(other) => Err(InvalidRequest::param(
            "model",
            format!("'model' must be a string, got {}", kind(other)),
        )),
        None => Err(InvalidRequest::param(
            "model",
            "missing required parameter: 'model'",
        )),
    }
}

fn optional_bool(
    body: &Map<String, Value>,
    name: &str,
    parent: Option<&str>,
) -> Result<Option<bool>, InvalidRequest> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => {
            let param = parent.map_or_else(|| name.to_owned(), |p| format!("{p}.{name}"));
            Err(InvalidRequest::param(
                &param,
                format!("'{param}' must be a boolean, got {}", kind(other)),
            ))
        }
    }
}

fn optional_count(body: &Map<String, Value>, name: &str) -> Result<Option<u64>, InvalidRequest> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) if n.as_u64().is_some() => Ok(n.as_u64()),
        Some(other) => Err(InvalidRequest::param(
            name,
            format!(
                "'{name}' must be a non-negative integer, got {}",
                kind(other)
            ),
        )),
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: &str) -> Result<ApiRequest, InvalidRequest> {
        ApiRequest::chat(Bytes::from(body.to_owned()))
    }

    #[test]
    fn a_plain_body_passes_through_byte_for_byte() {
        let text =
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"x_custom":{"a":1}}"#;
        let req = chat(text).expect("valid");
        assert_eq!(req.upstream_body(None), text.as_bytes());
        assert_eq!(req.upstream_body(Some("m")), text.as_bytes());
    }

    #[test]
    fn a_stream_gets_include_usage_and_keeps_unknown_fields() {
        let text = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"other":7},"top_k":3}"#;
        let req = chat(text).expect("valid");
        assert!(req.stream() && !req.include_usage());
        let sent: Value = serde_json::from_slice(&req.upstream_body(Some("up"))).expect("json");
        assert_eq!(sent["model"], "up");
        assert_eq!(sent["stream_options"]["include_usage"], true);
        assert_eq!(sent["stream_options"]["other"], 7);
        assert_eq!(sent["top_k"], 3);
    }

    #[test]
    fn a_client_that_asked_for_usage_is_sent_as_it_is() {
        let text = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}"#;
        let req = chat(text).expect("valid");
        assert!(req.include_usage());
        assert_eq!(req.upstream_body(None), text.as_bytes());
    }

    #[test]
    fn serde_json_raw_value_key_is_refused_at_any_depth() {
        // The rewrite sorts keys: this last key would lead the body upstream.
        let cases = [
            r#"{"model":"m","messages":[{"role":"user"}],"$serde_json::private::RawValue":1}"#,
            r#"{"$serde_json::private::RawValue":"{\"model\":\"m\",\"messages\":[{\"role\":\"u\"}]}"}"#,
            r#"{"model":"m","messages":[{"role":"user","\u0024serde_json::private::RawValue":"x"}]}"#,
        ];
        for text in cases {
            let err = chat(text).expect_err(text);
            assert_eq!(err.param.as_deref(), Some(RAW_VALUE_KEY), "{text}");
        }
        let err = chat("[1]").expect_err("not an object");
        assert_eq!(
            err.message,
            "the request body must be a JSON object, got an array"
        );
    }

    #[test]
    fn errors_name_the_parameter() {
        let cases = [
            (r#"{"messages":[{"role":"user"}]}"#, Some("model")),
            (r#"{"model":5,"messages":[]}"#, Some("model")),
            (r#"{"model":"m"}"#, Some("messages")),
            (r#"{"model":"m","messages":"hi"}"#, Some("messages")),
            (
                r#"{"model":"m","messages":[{"content":"x"}]}"#,
                Some("messages[0].role"),
            ),
            (
                r#"{"model":"m","messages":[{"role":"user"}],"stream":"yes"}"#,
                Some("stream"),
            ),
            (
                r#"{"model":"m","messages":[{"role":"user"}],"stream_options":{"include_usage":1}}"#,
                Some("stream_options.include_usage"),
            ),
            (
                r#"{"model":"m","messages":[{"role":"user"}],"max_tokens":-1}"#,
                Some("max_tokens"),
            ),
            (r#"{"model":"m","#, None),
            (r#"[1,2]"#, None),
        ];
        for (body, param) in cases {
            let err = chat(body).expect_err(body);
            assert_eq!(err.param.as_deref(), param, "{body}: {err}");
        }
    }

    #[test]
    fn the_estimate_covers_every_choice_and_the_default_cap() {
        let body =
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"n":2,"max_tokens":10}"#;
        let req = chat(body).expect("valid");
        let prompt = (body.len() as u64).div_ceil(4);
        assert_eq!(req.estimated_tokens(512), prompt + 20);
        let req = chat(r#"{"model":"m","messages":[{"role":"user"}]}"#).expect("valid");
        assert!(req.estimated_tokens(512) > 512);
    }

    #[test]
    fn embeddings_need_a_model_and_an_input() {
        assert!(
            ApiRequest::embeddings(Bytes::from_static(br#"{"model":"e","input":"x"}"#)).is_ok()
        );
        let err = ApiRequest::embeddings(Bytes::from_static(br#"{"model":"e","input":3}"#))
            .expect_err("bad input");
        assert_eq!(err.param.as_deref(), Some("input"));
    }
}
