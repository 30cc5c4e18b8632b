//! The HTTP contract through `Router::oneshot` (no sockets): bad input gets
//! the right status and a JSON error naming the problem, and the app keeps
//! serving.

use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{header, Request, StatusCode};
use levee::config::Config;
use serde_json::{json, Value};
use tower::ServiceExt;

async fn app() -> axum::Router {
    let state = levee::server::build(&Config::default(), |_| None)
        .await
        .expect("build");
    // Router::oneshot has no socket: give requests a peer address as a
    // connection would (a private one, so the internal tier applies).
    levee::http::router(state).layer(axum::middleware::map_request(with_peer))
}

async fn with_peer(mut req: Request<Body>) -> Request<Body> {
    req.extensions_mut()
        .insert(ConnectInfo(SocketAddr::from(([10, 0, 0, 7], 40000))));
    req
}

async fn send(
    app: &axum::Router,
    req: Request<Body>,
) -> (StatusCode, Value, axum::http::HeaderMap) {
    let resp = app.clone().oneshot(req).await.expect("infallible");
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .expect("body");
    let body = serde_json::from_slice(&bytes).unwrap_or_else(|_| {
        panic!(
            "non-JSON body for {status}: {}",
            String::from_utf8_lossy(&bytes)
        )
    });
    (status, body, headers)
}

fn post_chat(body: impl Into<Body>) -> Request<Body> {
    Request::post("/v1/chat")
        .header(header::CONTENT_TYPE, "application/json")
        .body(body.into())
        .expect("request")
}

#[tokio::test]
async fn bad_input_gets_the_right_status_and_a_json_error_naming_the_problem() {
    let app = app().await;
    let cases: Vec<(Request<Body>, StatusCode, &str, Option<&str>)> = vec![
        (
            post_chat("{\"message\": "),
            StatusCode::BAD_REQUEST,
            "malformed_json",
            None,
        ),
        (
            post_chat("not json"),
            StatusCode::BAD_REQUEST,
            "malformed_json",
            None,
        ),
        (
            post_chat(r#"{"message":"hi","user_id":"u"}"#),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
            Some("thread_id"),
        ),
        (
            post_chat(r#"{"message":5,"user_id":"u","thread_id":"t"}"#),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
            Some("message"),
        ),
        (
            post_chat(r#"{"message":"hi","user_id":["u"],"thread_id":"t"}"#),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
            Some("user_id"),
        ),
        (
            post_chat(r#"{"message":"hi","user_id":"u","thread_id":"t","admin":true}"#),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
            Some("admin"),
        ),
        (
            post_chat(r#"{"message":"   ","user_id":"u","thread_id":"t"}"#),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
            Some("message"),
        ),
        (
            post_chat(r#"{"message":"hi","user_id":"u u","thread_id":"t"}"#),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
            Some("user_id"),
        ),
        (
            post_chat(format!(
                r#"{{"message":"{}","user_id":"u","thread_id":"t"}}"#,
                "a".repeat(70 * 1024)
            )),
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            None,
        ),
        (
            Request::post("/v1/chat")
                .header(header::CONTENT_TYPE, "text/plain")
                .body(Body::from("{}"))
                .expect("request"),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            None,
        ),
        (
            Request::get("/v2/nothing")
                .body(Body::empty())
                .expect("request"),
            StatusCode::NOT_FOUND,
            "not_found",
            None,
        ),
        (
            Request::get("/v1/chat")
                .body(Body::empty())
                .expect("request"),
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            None,
        ),
    ];
    for (req, status, code, field) in cases {
        let what = format!("{} {}", req.method(), req.uri());
        let (got, body, _) = send(&app, req).await;
        assert_eq!(got, status, "{what}: {body}");
        assert_eq!(body["error"], code, "{what}: {body}");
        assert!(
            body["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{body}"
        );
        if let Some(field) = field {
            assert_eq!(body["field"], field, "{what}: {body}");
            assert!(
                body["message"].as_str().unwrap_or("").contains(field),
                "message names the field: {body}"
            );
        }
    }
    // ...and the app still answers.
    let (status, body, _) = send(
        &app,
        post_chat(
            json!({"message":"What is the PTO policy?","user_id":"u","thread_id":"t"}).to_string(),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn wrong_method_lists_the_allowed_one() {
    let app = app().await;
    let (status, _, headers) = send(
        &app,
        Request::delete("/v1/chat")
            .body(Body::empty())
            .expect("request"),
    )
    .await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(
        headers.get(header::ALLOW).map(|v| v.as_bytes()),
        Some(&b"POST"[..])
    );
}

#[tokio::test]
async fn greetings_skip_retrieval() {
    let app = app().await;
    let (status, body, _) = send(
        &app,
        post_chat(json!({"message":"Hello!","user_id":"u","thread_id":"g"}).to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body["metadata"]["agents_used"],
        json!(["router", "synthesizer"])
    );
    assert_eq!(body["metadata"]["route"], "direct");
    assert_eq!(body["metadata"]["sources"], json!([]));
}

#[tokio::test]
async fn health_and_ready_answer_json() {
    let app = app().await;
    let (status, body, _) = send(
        &app,
        Request::get("/health").body(Body::empty()).expect("req"),
    )
    .await;
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::OK, Some("ok"))
    );
    let (status, body, _) = send(
        &app,
        Request::get("/ready").body(Body::empty()).expect("req"),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["dependencies"]["llm"]["state"], "embedded");
}
