//! `POST /v1/chat/completions`: a deterministic extractive "LLM".
//!
//! The gateway puts retrieved passages in the system message(s); the answer
//! is the two system sentences sharing the most content words with the last
//! user message, in their original order. Plain JSON or SSE streaming, both
//! in OpenAI's exact shapes, so gateway code written against this works
//! against the real API.

use std::{
    convert::Infallible,
    sync::{atomic::Ordering, Arc},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use axum::{
    body::{Body, Bytes},
    extract::State,
    http::header,
    response::{IntoResponse, Response},
    Json,
};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{
    app::AppState,
    capacity::CompletionTokens,
    error::{Api, ApiError},
    text::{sentences, tokens, word_count},
};

/// The answer when no system sentence shares a word with the question.
pub(crate) const NO_ANSWER: &str = "I don't know based on the provided context.";

/// How many sentences make an answer.
const ANSWER_SENTENCES: usize = 2;

/// Model name echoed when the request names none.
const DEFAULT_MODEL: &str = "levee-sim";

/// The parts of an OpenAI chat request the simulator reads.
#[derive(Debug, Deserialize)]
struct ChatRequest {
    model: Option<String>,
    messages: Option<Vec<Message>>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
}

#[derive(Debug, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// One chat message; `content` is a string or an array of text parts.
#[derive(Debug, Deserialize)]
struct Message {
    role: String,
    #[serde(default)]
    content: Content,
}

#[derive(Debug, Default, Deserialize)]
#[serde(untagged)]
enum Content {
    #[default]
    Missing,
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
struct Part {
    #[serde(default)]
    text: Option<String>,
}

impl Message {
    fn text(&self) -> String {
        match &self.content {
            Content::Missing => String::new(),
            Content::Text(text) => text.clone(),
            Content::Parts(parts) => parts
                .iter()
                .filter_map(|p| p.text.as_deref())
                .collect::<Vec<_>>()
                .join(" "),
        }
    }
}

/// Everything a response needs, computed once for both wire formats.
struct Completion {
    id: String,
    created: u64,
    model: String,
    answer: String,
    prompt_tokens: u64,
    completion_tokens: u64,
}

/// Handles `POST /v1/chat/completions`.
pub(crate) async fn completions(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let request: ChatRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => {
            return ApiError::bad_request(
                Api::Chat,
                format!("We could not parse the JSON body of your request: {e}"),
            )
            .into_response()
        }
    };
    let Some(messages) = request.messages.as_deref() else {
        return ApiError::bad_request(Api::Chat, "Missing required parameter: 'messages'.")
            .into_response();
    };
    match messages.last() {
        None => {
            return ApiError::bad_request(
                Api::Chat,
                "'messages' must contain at least one message.",
            )
            .into_response()
        }
        Some(last) if last.role != "user" => {
            return ApiError::bad_request(
                Api::Chat,
                format!(
                    "The last message must have role 'user', got '{}'.",
                    last.role
                ),
            )
            .into_response()
        }
        Some(_) => {}
    }

    let texts: Vec<(&str, String)> = messages
        .iter()
        .map(|m| (m.role.as_str(), m.text()))
        .collect();
    let answer = answer(&texts);
    let completion = Completion {
        id: format!(
            "chatcmpl-sim-{}",
            state.next_id.fetch_add(1, Ordering::Relaxed) + 1
        ),
        created: unix_now(),
        model: request
            .model
            .clone()
            .unwrap_or_else(|| DEFAULT_MODEL.to_owned()),
        prompt_tokens: texts.iter().map(|(_, t)| word_count(t)).sum(),
        completion_tokens: word_count(&answer),
        answer,
    };
    let mut response = if request.stream {
        let include_usage = request.stream_options.is_some_and(|o| o.include_usage);
        let delay = state.faults.stream_chunk_delay(Api::Chat);
        stream(&completion, include_usage, delay)
    } else {
        Json(full(&completion)).into_response()
    };
    // The capacity model charges the service time per token from this.
    response
        .extensions_mut()
        .insert(CompletionTokens(completion.completion_tokens));
    response
}

/// The extractive answer to `messages` (role, text) in conversation order.
fn answer(messages: &[(&str, String)]) -> String {
    let users: Vec<&str> = messages
        .iter()
        .filter(|(role, _)| *role == "user")
        .map(|(_, text)| text.as_str())
        .collect();
    let question = tokens(users.last().copied().unwrap_or_default());
    let candidates: Vec<&str> = messages
        .iter()
        .filter(|(role, _)| *role == "system")
        .flat_map(|(_, text)| sentences(text))
        .collect();

    let mut scored: Vec<(usize, usize)> = candidates
        .iter()
        .enumerate()
        .map(|(i, sentence)| {
            let words = tokens(sentence);
            let overlap = question
                .iter()
                .enumerate()
                // Count each distinct question word once.
                .filter(|(j, q)| !question[..*j].contains(q) && words.contains(q))
                .count();
            (i, overlap)
        })
        .filter(|&(_, overlap)| overlap > 0)
        .collect();
    // Best first; ties go to the earlier sentence.
    scored.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    scored.truncate(ANSWER_SENTENCES);
    scored.sort_by_key(|&(i, _)| i);

    let body = if scored.is_empty() {
        NO_ANSWER.to_owned()
    } else {
        scored
            .iter()
            .map(|&(i, _)| candidates[i])
            .collect::<Vec<_>>()
            .join(" ")
    };
    match users.len().checked_sub(2).map(|i| users[i]) {
        Some(previous) => {
            let first = sentences(previous).first().copied().unwrap_or_default();
            format!("Following up on \"{first}\": {body}")
        }
        None => body,
    }
}

/// The non-streaming `chat.completion` object.
fn full(c: &Completion) -> Value {
    json!({
        "id": c.id,
        "object": "chat.completion",
        "created": c.created,
        "model": c.model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": c.answer},
            "finish_reason": "stop",
        }],
        "usage": usage(c),
    })
}

fn usage(c: &Completion) -> Value {
    json!({
        "prompt_tokens": c.prompt_tokens,
        "completion_tokens": c.completion_tokens,
        "total_tokens": c.prompt_tokens + c.completion_tokens,
    })
}

/// One `chat.completion.chunk` with a single choice.
fn chunk(c: &Completion, delta: &Value, finish_reason: Option<&str>) -> Value {
    json!({
        "id": c.id,
        "object": "chat.completion.chunk",
        "created": c.created,
        "model": c.model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    })
}

/// The SSE frames of a streamed completion, in order.
fn frames(c: &Completion, include_usage: bool) -> Vec<String> {
    let mut events = vec![chunk(c, &json!({"role": "assistant", "content": ""}), None)];
    // Each word keeps its trailing whitespace so the deltas concatenate back
    // to exactly the non-streaming answer.
    events.extend(
        c.answer
            .split_inclusive(char::is_whitespace)
            .map(|word| chunk(c, &json!({"content": word}), None)),
    );
    events.push(chunk(c, &json!({}), Some("stop")));
    if include_usage {
        events.push(json!({
            "id": c.id,
            "object": "chat.completion.chunk",
            "created": c.created,
            "model": c.model,
            "choices": [],
            "usage": usage(c),
        }));
    }
    let mut frames: Vec<String> = events.iter().map(|e| format!("data: {e}\n\n")).collect();
    frames.push("data: [DONE]\n\n".to_owned());
    frames
}

/// A `text/event-stream` response, waiting `delay` before every frame but
/// the first.
fn stream(c: &Completion, include_usage: bool, delay: Duration) -> Response {
    let frames = frames(c, include_usage);
    let body =
        futures::stream::iter(frames.into_iter().enumerate()).then(move |(i, frame)| async move {
            if i > 0 && !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            Ok::<_, Infallible>(Bytes::from(frame))
        });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgs(list: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
        list.iter().map(|(r, t)| (*r, (*t).to_owned())).collect()
    }

    const CONTEXT: &str = "Employees get 25 days of paid time off. \
        Rollover is permitted up to 5 days. Laptops are replaced every 3 years. \
        Unused days above the rollover cap are forfeited.";

    #[test]
    fn answer_is_the_two_best_sentences_in_original_order() {
        let m = msgs(&[
            ("system", CONTEXT),
            ("user", "How many days can I rollover?"),
        ]);
        assert_eq!(
            answer(&m),
            "Rollover is permitted up to 5 days. Unused days above the rollover cap are forfeited."
        );
    }

    #[test]
    fn answer_without_overlap_admits_ignorance() {
        let m = msgs(&[("system", CONTEXT), ("user", "Who won the match?")]);
        assert_eq!(answer(&m), NO_ANSWER);
    }

    #[test]
    fn follow_up_names_the_previous_question() {
        let m = msgs(&[
            ("system", CONTEXT),
            ("user", "What about laptops? Tell me."),
            ("assistant", "Laptops are replaced every 3 years."),
            ("user", "How often are laptops replaced?"),
        ]);
        assert_eq!(
            answer(&m),
            "Following up on \"What about laptops?\": Laptops are replaced every 3 years."
        );
    }

    #[test]
    fn stream_deltas_concatenate_to_the_answer() {
        let c = Completion {
            id: "chatcmpl-sim-1".into(),
            created: 0,
            model: "m".into(),
            answer: "Two words.".into(),
            prompt_tokens: 1,
            completion_tokens: 2,
        };
        let frames = frames(&c, true);
        assert_eq!(frames.len(), 1 + 2 + 1 + 1 + 1);
        assert!(frames[1].contains(r#""content":"Two ""#));
        assert!(frames[2].contains(r#""content":"words.""#));
        assert_eq!(frames.last().map(String::as_str), Some("data: [DONE]\n\n"));
    }
}
