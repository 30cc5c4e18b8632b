//! The OpenAI-compatible routes' contract through `Router::oneshot`: every
//! refusal in OpenAI's error shape (`{"error":{"message","type","param",
//! "code"}}`) with the status and headers the SDKs act on, decided before
//! any deployment is called.

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{header, HeaderMap, Request, StatusCode};
use levee::config::{Config, DeploymentConfig, ModelConfig};
use levee::http::{router, AppState};
use levee::identity::{hash_key, ApiKeyConfig};
use levee::ratelimit::LimitConfig;
use serde_json::{json, Value};
use tower::ServiceExt;

const KEY: &str = "sdk_key_123";

/// Two models on deployments nobody listens on (port 9 is discard; the
/// calls these tests make never reach them).
fn config() -> Config {
    let mut config = Config::default();
    config.identity.api_keys.push(ApiKeyConfig {
        id: "sdk".into(),
        sha256: hash_key(KEY),
        tenant: "acme".into(),
        tier: "API_KEY".into(),
    });
    for name in ["gpt-4o-mini", "llama-3.1-8b"] {
        config.llm.models.push(ModelConfig {
            name: name.into(),
            deployments: vec![
                DeploymentConfig {
                    url: "http://127.0.0.1:9/v1".into(),
                    api_key_env: None,
                    model: None,
                    weight: 1,
                };
                2
            ],
        });
    }
    config
}

fn app(config: &Config) -> axum::Router {
    let gateway = levee::wiring::build(config, &|_| None).expect("build");
    router(AppState::new(gateway, config, Some("admin-token".into())))
        .layer(axum::middleware::map_request(with_peer))
}

async fn with_peer(mut req: Request<Body>) -> Request<Body> {
    req.extensions_mut()
        .insert(ConnectInfo(SocketAddr::from(([203, 0, 113, 9], 40000))));
    req
}

async fn send(app: &axum::Router, req: Request<Body>) -> (StatusCode, Value, HeaderMap) {
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

fn post(path: &str, key: Option<&str>, body: impl Into<Body>) -> Request<Body> {
    let mut req = Request::post(path).header(header::CONTENT_TYPE, "application/json");
    if let Some(key) = key {
        req = req.header(header::AUTHORIZATION, format!("Bearer {key}"));
    }
    req.body(body.into()).expect("request")
}

fn chat_body(model: &str) -> String {
    json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}).to_string()
}

/// OpenAI's shape, and nothing of Levee's own.
fn assert_openai(body: &Value, kind: &str, code: &str, param: Option<&str>) {
    let e = &body["error"];
    assert!(e.is_object(), "not OpenAI's shape: {body}");
    assert_eq!(e["type"], kind, "{body}");
    assert_eq!(e["code"], code, "{body}");
    assert_eq!(e["param"], param.map_or(Value::Null, Value::from), "{body}");
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert_eq!(
        body.as_object().map(serde_json::Map::len),
        Some(1),
        "{body}"
    );
}

#[tokio::test]
async fn bad_bodies_are_400_naming_the_param_and_unknown_models_404() {
    let app = app(&config());
    let cases = [
        ("{\"model\":", None, "invalid_request"),
        (
            r#"{"model":"gpt-4o-mini","messages":"hi"}"#,
            Some("messages"),
            "invalid_request",
        ),
        (
            r#"{"model":7,"messages":[]}"#,
            Some("model"),
            "invalid_request",
        ),
        (
            r#"{"model":"gpt-4o-mini","messages":[{"role":"user"}],"stream":1}"#,
            Some("stream"),
            "invalid_request",
        ),
    ];
    for (body, param, code) in cases {
        let (status, json, _) = send(&app, post("/v1/chat/completions", Some(KEY), body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {json}");
        assert_openai(&json, "invalid_request_error", code, param);
    }
    let (status, json, _) = send(
        &app,
        post("/v1/chat/completions", Some(KEY), chat_body("gpt-5-turbo")),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_openai(
        &json,
        "invalid_request_error",
        "model_not_found",
        Some("model"),
    );

    let (status, json, _) = send(
        &app,
        post(
            "/v1/embeddings",
            Some(KEY),
            r#"{"model":"gpt-4o-mini","input":5}"#,
        ),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_openai(
        &json,
        "invalid_request_error",
        "invalid_request",
        Some("input"),
    );
}

#[tokio::test]
async fn oversize_bodies_are_413_and_wrong_methods_405_in_openai_shape() {
    let mut config = config();
    config.server.max_body_bytes = 4096;
    let app = app(&config);
    let big = "x".repeat(10_000);
    let (status, json, _) = send(
        &app,
        post("/v1/chat/completions", Some(KEY), chat_body(&big)),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_openai(&json, "invalid_request_error", "payload_too_large", None);

    let req = Request::get("/v1/chat/completions")
        .body(Body::empty())
        .expect("request");
    let (status, json, headers) = send(&app, req).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_openai(&json, "invalid_request_error", "method_not_allowed", None);
    assert!(headers.contains_key(header::ALLOW));
}

#[tokio::test]
async fn an_unknown_key_is_401_invalid_api_key() {
    let app = app(&config());
    let (status, json, _) = send(
        &app,
        post(
            "/v1/chat/completions",
            Some("sk-wrong"),
            chat_body("gpt-4o-mini"),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_openai(&json, "invalid_request_error", "invalid_api_key", None);
    // The same refusal on Levee's own route keeps Levee's shape.
    let (status, json, _) = send(
        &app,
        post("/v1/chat", Some("sk-wrong"), r#"{"message":"hi"}"#),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(json["error"], "unauthorized");
}

#[tokio::test]
async fn a_429_is_rate_limit_exceeded_with_retry_after_and_the_limit_headers() {
    let mut config = config();
    let tier = config.ratelimit.tiers.get_mut("API_KEY").expect("tier");
    tier.limits = vec![LimitConfig {
        limit: 1,
        window: Duration::from_secs(60),
        algorithm: None,
        burst: None,
        shadow: false,
    }];
    let app = app(&config);
    // The first is admitted (and refused later: its deployments are down).
    let (status, _, _) = send(&app, post("/v1/models", Some(KEY), "")).await;
    assert_ne!(status, StatusCode::TOO_MANY_REQUESTS);
    let (status, json, headers) = send(
        &app,
        post("/v1/chat/completions", Some(KEY), chat_body("gpt-4o-mini")),
    )
    .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{json}");
    assert_openai(&json, "requests", "rate_limit_exceeded", None);
    let retry: u64 = headers[header::RETRY_AFTER]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    assert!((1..=60).contains(&retry), "{retry}");
    assert_eq!(headers["x-ratelimit-limit"], "1");
    assert_eq!(headers["x-ratelimit-remaining"], "0");
}

#[tokio::test]
async fn every_breaker_open_is_503_with_retry_after_and_the_models_are_listed() {
    let config = config();
    let app = app(&config);
    for i in 0..2 {
        let req = Request::post(format!("/admin/breakers/llm:gpt-4o-mini:{i}/force_open"))
            .header(header::AUTHORIZATION, "Bearer admin-token")
            .body(Body::empty())
            .expect("request");
        let (status, json, _) = send(&app, req).await;
        assert_eq!(status, StatusCode::OK, "{json}");
    }
    let (status, json, headers) = send(
        &app,
        post("/v1/chat/completions", Some(KEY), chat_body("gpt-4o-mini")),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{json}");
    assert_openai(&json, "server_error", "dependency_unavailable", None);
    assert!(headers.contains_key(header::RETRY_AFTER));

    let req = Request::get("/v1/models")
        .body(Body::empty())
        .expect("request");
    let (status, json, _) = send(&app, req).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json["object"], "list");
    let ids: Vec<&str> = json["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids, ["gpt-4o-mini", "llama-3.1-8b"]);
    // Each deployment is its own breaker, listed in /ready.
    let req = Request::get("/ready").body(Body::empty()).expect("request");
    let (_, ready, _) = send(&app, req).await;
    for name in [
        "llm:gpt-4o-mini:0",
        "llm:gpt-4o-mini:1",
        "llm:llama-3.1-8b:1",
    ] {
        assert!(
            ready["dependencies"][name]["breaker"].is_object(),
            "{name}: {ready}"
        );
    }
}
