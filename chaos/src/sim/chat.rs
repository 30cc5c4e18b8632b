//! `POST /v1/chat/completions`: a deterministic extractive "LLM".
//!
//! The gateway puts retrieved passages in the system message(s); the answer
//! is the two system sentences sharing the most content words with the last
//! user message, in their original order. Plain JSON or SSE streaming, both
//! in OpenAI's exact shapes, so gateway code written against this works
//! against the real API.

use std::{
    io,
    pin::Pin,
    sync::{atomic::Ordering, Arc},
    task::{ready, Context, Poll},
};

use axum::{
    body::{Body, Bytes},
    extract::State,
    http::header,
    response::{IntoResponse, Response},
    Json,
};
use futures::{stream::BoxStream, Stream, StreamExt};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{
    app::{unix_now, AppState},
    capacity::CompletionTokens,
    config::DEFAULT_MODEL,
    error::{Api, ApiError},
    faults::StreamFaults,
    stats::OpenStream,
    text::{sentences, tokens, word_count},
};

/// The answer when no system sentence shares a word with the question.
pub(crate) const NO_ANSWER: &str = "I don't know based on the provided context.";

/// How many sentences make an answer.
const ANSWER_SENTENCES: usize = 2;

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
#[derive(Debug)]
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
    let include_usage = request
        .stream_options
        .as_ref()
        .is_some_and(|o| o.include_usage);
    if request.stream && include_usage {
        state.stats.record_include_usage();
    }
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
    // Counted now even when streamed: these are the figures its usage
    // chunk carries, whether or not the client reads that far.
    state
        .stats
        .record_completion(completion.prompt_tokens, completion.completion_tokens);
    let mut response = if request.stream {
        let faults = state.faults.stream_faults(Api::Chat);
        stream(
            &completion,
            include_usage,
            faults,
            state.stats.open_stream(),
        )
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

/// A `text/event-stream` response, waiting `faults.chunk_delay` before
/// every frame but the first, and failing in place of frame
/// `faults.fail_after` (counting from 0) if the stream has that many.
/// `open` is its `streams_open` count, held until the body ends or goes.
fn stream(c: &Completion, include_usage: bool, faults: StreamFaults, open: OpenStream) -> Response {
    let mut frames = frames(c, include_usage);
    let fail_after = faults
        .fail_after
        .and_then(|n| usize::try_from(n).ok())
        .filter(|&n| n < frames.len());
    if let Some(n) = fail_after {
        frames.truncate(n);
    }
    let delay = faults.chunk_delay;
    let pause = move |i: usize| async move {
        if i > 0 && !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
    };
    let sent = futures::stream::iter(frames.into_iter().enumerate()).then(move |(i, frame)| {
        let pause = pause(i);
        async move {
            pause.await;
            Ok(Bytes::from(frame))
        }
    });
    let failure = futures::stream::iter(fail_after).then(move |n| {
        let pause = pause(n);
        async move {
            pause.await;
            // hyper drops the connection on a body error without flushing
            // what it buffered; yielding once first lets it flush the frames
            // already sent, so the client sees them and then the failure.
            tokio::task::yield_now().await;
            Err(io::Error::other(format!(
                "simulated stream failure after {n} frames"
            )))
        }
    });
    let body = Tracked {
        frames: sent.chain(failure).boxed(),
        open: Some(open),
    };
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}

/// A streamed body that keeps its [`OpenStream`] until it ends: its last
/// frame or its failure is out, or it is dropped unfinished.
struct Tracked {
    frames: BoxStream<'static, io::Result<Bytes>>,
    open: Option<OpenStream>,
}

impl Stream for Tracked {
    type Item = io::Result<Bytes>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let item = ready!(self.frames.poll_next_unpin(cx));
        if !matches!(item, Some(Ok(_))) {
            // Finished or failed: not open any more, even if hyper (or a
            // test) keeps the body a while longer.
            self.open = None;
        }
        Poll::Ready(item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::time::Duration;

    use axum::{body::to_bytes, http::Request, Router};
    use tower::ServiceExt;

    use super::super::{app::router, config::SimConfig, server::spawn};

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

    fn chat_body(stream: bool, include_usage: bool) -> Value {
        json!({
            "messages": [
                {"role": "system", "content": CONTEXT},
                {"role": "user", "content": "How many days can I rollover?"},
            ],
            "stream": stream,
            "stream_options": {"include_usage": include_usage},
        })
    }

    async fn call(router: &Router, method: &str, path: &str, body: &Value) -> Response {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_string()))
            .expect("request builds");
        router
            .clone()
            .oneshot(request)
            .await
            .expect("router answers")
    }

    async fn json_of(response: Response) -> Value {
        let body = to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("body");
        serde_json::from_slice(&body).expect("json")
    }

    async fn llm_stats(router: &Router) -> Value {
        let stats = json_of(call(router, "GET", "/_stats", &Value::Null).await).await;
        stats["llm"].clone()
    }

    /// Every item of a body: `Ok(frame)` or the error's text.
    async fn items(response: Response) -> Vec<Result<String, String>> {
        response
            .into_body()
            .into_data_stream()
            .map(|item| {
                item.map(|b| String::from_utf8_lossy(&b).into_owned())
                    .map_err(|e| e.to_string())
            })
            .collect()
            .await
    }

    #[tokio::test]
    async fn stream_fail_after_sends_that_many_frames_then_fails_the_body() {
        let router = router(SimConfig::default());
        let spec = json!({"stream_fail_after": 2, "target": "chat"});
        let set = call(&router, "POST", "/_faults", &spec).await;
        assert_eq!(set.status(), 200);
        assert_eq!(json_of(set).await["chat"]["stream_fail_after"], 2);

        let response = call(
            &router,
            "POST",
            "/v1/chat/completions",
            &chat_body(true, true),
        )
        .await;
        assert_eq!(response.status(), 200);
        assert_eq!(llm_stats(&router).await["streams_open"], 1);
        let items = items(response).await;
        assert_eq!(items.len(), 3, "{items:?}");
        assert!(items[0]
            .as_ref()
            .is_ok_and(|f| f.contains(r#""role":"assistant""#)));
        assert!(items[1]
            .as_ref()
            .is_ok_and(|f| f.contains(r#""content":"Rollover "#)));
        let err = items[2].as_ref().expect_err("the body fails");
        assert!(
            err.contains("simulated stream failure after 2 frames"),
            "{err}"
        );
        assert_eq!(llm_stats(&router).await["streams_open"], 0);
    }

    #[tokio::test]
    async fn stream_fail_after_zero_fails_before_any_frame() {
        let router = router(SimConfig::default());
        call(
            &router,
            "POST",
            "/_faults",
            &json!({"stream_fail_after": 0}),
        )
        .await;
        let response = call(
            &router,
            "POST",
            "/v1/chat/completions",
            &chat_body(true, false),
        )
        .await;
        assert_eq!(response.status(), 200);
        let items = items(response).await;
        assert!(matches!(items.as_slice(), [Err(_)]), "{items:?}");
    }

    #[tokio::test]
    async fn stream_fail_after_spares_plain_answers_and_streams_shorter_than_it() {
        let router = router(SimConfig::default());
        call(
            &router,
            "POST",
            "/_faults",
            &json!({"stream_fail_after": 1000}),
        )
        .await;
        let long = call(
            &router,
            "POST",
            "/v1/chat/completions",
            &chat_body(true, false),
        )
        .await;
        let items = items(long).await;
        assert!(items.iter().all(Result::is_ok), "{items:?}");
        assert_eq!(
            items.last().and_then(|f| f.as_deref().ok()),
            Some("data: [DONE]\n\n")
        );

        call(
            &router,
            "POST",
            "/_faults",
            &json!({"stream_fail_after": 1}),
        )
        .await;
        let plain = call(
            &router,
            "POST",
            "/v1/chat/completions",
            &chat_body(false, false),
        )
        .await;
        assert_eq!(plain.status(), 200);
        let body = json_of(plain).await;
        assert_eq!(body["object"], "chat.completion");
        assert_eq!(body["choices"][0]["finish_reason"], "stop");
    }

    #[tokio::test]
    async fn stats_total_the_usage_of_completions_and_count_include_usage() {
        let router = router(SimConfig::default());
        let plain = json_of(
            call(
                &router,
                "POST",
                "/v1/chat/completions",
                &chat_body(false, true),
            )
            .await,
        )
        .await;
        let streamed = call(
            &router,
            "POST",
            "/v1/chat/completions",
            &chat_body(true, true),
        )
        .await;
        let frames: String = items(streamed)
            .await
            .into_iter()
            .map(|f| f.expect("no failure"))
            .collect();
        let usage_chunk: Value = frames
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .find(|c| c.get("usage").is_some())
            .expect("usage chunk");
        // Neither counts as a streamed request with include_usage.
        call(
            &router,
            "POST",
            "/v1/chat/completions",
            &chat_body(true, false),
        )
        .await;
        call(
            &router,
            "POST",
            "/v1/chat/completions",
            &json!({"stream": true}),
        )
        .await;

        let llm = llm_stats(&router).await;
        let total = |key: &str| {
            plain["usage"][key].as_u64().expect("plain usage")
                + usage_chunk["usage"][key].as_u64().expect("stream usage")
        };
        // The unread third stream counts too: it was created in full.
        let third_prompt = plain["usage"]["prompt_tokens"].as_u64().expect("usage");
        let third_completion = plain["usage"]["completion_tokens"].as_u64().expect("usage");
        assert_eq!(llm["completions"], 3);
        assert_eq!(llm["prompt_tokens"], total("prompt_tokens") + third_prompt);
        assert_eq!(
            llm["completion_tokens"],
            total("completion_tokens") + third_completion
        );
        assert_eq!(llm["include_usage_requests"], 1);
        // The third stream's body was dropped unread.
        assert_eq!(llm["streams_open"], 0);

        let reset = json_of(call(&router, "POST", "/_stats/reset", &Value::Null).await).await;
        for key in [
            "completions",
            "prompt_tokens",
            "completion_tokens",
            "include_usage_requests",
            "streams_open",
        ] {
            assert_eq!(reset["llm"][key], 0, "{key}");
        }
    }

    /// `/_stats` of a running simulator.
    async fn socket_llm_stats(client: &reqwest::Client, base: &str) -> Value {
        let stats: Value = client
            .get(format!("{base}/_stats"))
            .send()
            .await
            .expect("stats answered")
            .json()
            .await
            .expect("stats json");
        stats["llm"].clone()
    }

    /// Polls `streams_open` until it is `want`, for at most a second: the
    /// server notices a vanished client only when its next write fails.
    async fn wait_streams_open(client: &reqwest::Client, base: &str, want: u64) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
        loop {
            let open = socket_llm_stats(client, base).await["streams_open"].clone();
            if open == want {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "streams_open stayed {open}, want {want}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn stream_failure_reaches_a_real_client_as_a_body_error_without_done() {
        let sim = spawn(SimConfig::default()).await.expect("sim starts");
        let base = sim.base_url();
        let client = reqwest::Client::new();
        let set = client
            .post(format!("{base}/_faults"))
            .json(&json!({"stream_fail_after": 3, "target": "chat"}))
            .send()
            .await
            .expect("faults set");
        assert_eq!(set.status(), 200);

        let response = client
            .post(format!("{base}/v1/chat/completions"))
            .json(&chat_body(true, true))
            .send()
            .await
            .expect("headers arrive");
        assert_eq!(response.status(), 200);
        let mut body = response.bytes_stream();
        let mut received = Vec::new();
        let mut failed = false;
        while let Some(item) = body.next().await {
            match item {
                Ok(bytes) => received.extend_from_slice(&bytes),
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        assert!(failed, "the body must end in an error, not a clean EOF");
        let text = String::from_utf8_lossy(&received);
        let frames: Vec<&str> = text
            .split_terminator("\n\n")
            .filter(|f| f.starts_with("data: "))
            .collect();
        assert_eq!(frames.len(), 3, "{text}");
        assert!(!text.contains("[DONE]"), "{text}");
        assert!(!text.contains(r#""finish_reason":"stop""#), "{text}");
        wait_streams_open(&client, &base, 0).await;
        sim.shutdown().await.expect("clean shutdown");
    }

    #[tokio::test]
    async fn a_client_that_hangs_up_mid_stream_closes_its_stream() {
        let sim = spawn(SimConfig::default()).await.expect("sim starts");
        let base = sim.base_url();
        let client = reqwest::Client::new();
        client
            .post(format!("{base}/_faults"))
            .json(&json!({"stream_chunk_delay_ms": 50}))
            .send()
            .await
            .expect("faults set");

        let response = client
            .post(format!("{base}/v1/chat/completions"))
            .json(&chat_body(true, false))
            .send()
            .await
            .expect("headers arrive");
        let mut body = response.bytes_stream();
        let first = body
            .next()
            .await
            .expect("a first frame")
            .expect("not an error");
        assert!(first.starts_with(b"data: "));
        assert_eq!(socket_llm_stats(&client, &base).await["streams_open"], 1);
        drop(body);
        wait_streams_open(&client, &base, 0).await;
        sim.shutdown().await.expect("clean shutdown");
    }
}
