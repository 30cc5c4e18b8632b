//! The error contract through `Router::oneshot` (no sockets): every status
//! of the README's error table, produced by the one error path, with its
//! JSON body and headers; and authentication that holds whether or not any
//! limit is configured.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{header, HeaderMap, Request, StatusCode};
use levee::config::Config;
use levee::http::{router, AppState};
use levee::identity::{hash_key, ApiKeyConfig};
use levee::rag::{InProcessMemory, IntentRouter, Pipeline};
use levee::ratelimit::policy::Policy;
use levee::ratelimit::store::{Decision, LimitSpec, LimitStore, StoreUnavailable};
use levee::ratelimit::{FailureMode, LimitConfig, Limiter};
use levee::resilience::{DependencyPolicy, DependencyStack, NoopObserver};
use levee::upstream::{
    Answer, Completion, Dependency, Llm, LocalIndex, UpstreamError, UpstreamErrorKind,
};
use levee::wiring::{Gateway, GuardedLlm};
use serde_json::Value;
use tower::ServiceExt;

const PARTNER_KEY: &str = "partner_key_123";

fn config() -> Config {
    let mut config = Config::default();
    config.identity.api_keys.push(ApiKeyConfig {
        id: "partner".into(),
        sha256: hash_key(PARTNER_KEY),
        tenant: "acme".into(),
        tier: "API_KEY".into(),
    });
    config
}

fn gateway(config: &Config) -> Gateway {
    levee::wiring::build(config, &|_| None).expect("build")
}

fn app_from(gateway: Gateway, config: &Config) -> axum::Router {
    router(AppState::new(gateway, config, Some("admin-token".into())))
        .layer(axum::middleware::map_request(with_peer))
}

fn app(config: &Config) -> axum::Router {
    app_from(gateway(config), config)
}

/// Router::oneshot has no socket: give requests a public peer address.
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

fn chat(key: Option<&str>) -> Request<Body> {
    let mut req = Request::post("/v1/chat").header(header::CONTENT_TYPE, "application/json");
    if let Some(key) = key {
        req = req.header("x-api-key", key);
    }
    req.body(Body::from(
        r#"{"message":"What is the PTO policy?","user_id":"u1","thread_id":"t1"}"#,
    ))
    .expect("request")
}

fn assert_error(body: &Value, code: &str) {
    assert_eq!(body["error"], code, "{body}");
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
}

#[tokio::test]
async fn without_limits_unknown_keys_are_401_and_registered_and_anonymous_are_served() {
    let mut config = config();
    config.ratelimit.enabled = false;
    let app = app(&config);

    let (status, body, headers) = send(&app, chat(Some("nonsense"))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_error(&body, "unauthorized");
    assert!(
        !headers.contains_key("x-ratelimit-limit"),
        "no limits apply"
    );

    let (status, body, _) = send(&app, chat(Some(""))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "malformed key: {body}");

    let (status, body, _) = send(&app, chat(Some(PARTNER_KEY))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["response"].as_str().is_some_and(|r| !r.is_empty()));

    let (status, _, _) = send(&app, chat(None)).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "anonymous traffic is allowed by default"
    );
}

#[tokio::test]
async fn require_api_key_refuses_anonymous_callers_with_or_without_limits() {
    for limits in [false, true] {
        let mut config = config();
        config.ratelimit.enabled = limits;
        config.identity.require_api_key = true;
        let app = app(&config);
        let (status, body, _) = send(&app, chat(None)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "limits={limits}");
        assert_error(&body, "unauthorized");
        let (status, _, _) = send(&app, chat(Some(PARTNER_KEY))).await;
        assert_eq!(status, StatusCode::OK, "limits={limits}");
    }
}

#[tokio::test]
async fn require_api_key_paths_guard_only_their_prefix() {
    let mut config = config();
    config.identity.require_api_key_paths = vec!["/v1/*".into()];
    let app = app(&config);
    let (status, _, _) = send(&app, chat(None)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let health = Request::get("/health")
        .body(Body::empty())
        .expect("request");
    let (status, _, _) = send(&app, health).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn client_mistakes_get_their_status_code_and_headers() {
    let mut config = config();
    config.server.max_body_bytes = 1024;
    let app = app(&config);
    let post = |body: &str, ctype: &str| {
        Request::post("/v1/chat")
            .header(header::CONTENT_TYPE, ctype)
            .body(Body::from(body.to_owned()))
            .expect("request")
    };
    let json = "application/json";
    let cases = [
        (post("{\"message\": ", json), 400, "malformed_json"),
        (
            post(r#"{"message":"","user_id":"u","thread_id":"t"}"#, json),
            422,
            "invalid_request",
        ),
        (post("{}", "text/plain"), 415, "unsupported_media_type"),
        (post(&"x".repeat(4096), json), 413, "payload_too_large"),
        (
            Request::get("/nope").body(Body::empty()).expect("request"),
            404,
            "not_found",
        ),
    ];
    for (req, status, code) in cases {
        let (got, body, _) = send(&app, req).await;
        assert_eq!(got.as_u16(), status, "{body}");
        assert_error(&body, code);
    }
    let (status, body, _) = send(&app, post(r#"{"message":""}"#, json)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        body["field"].is_string(),
        "the field at fault is named: {body}"
    );

    let (status, body, headers) = send(
        &app,
        Request::get("/v1/chat")
            .body(Body::empty())
            .expect("request"),
    )
    .await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_error(&body, "method_not_allowed");
    assert_eq!(headers[header::ALLOW], "POST");
}

#[tokio::test]
async fn a_garbled_forwarding_header_from_a_trusted_proxy_is_400() {
    let mut config = config();
    config.identity.trusted_proxies = vec!["203.0.113.0/24".parse().expect("cidr")];
    let app = app(&config);
    let mut req = chat(None);
    req.headers_mut()
        .insert("x-forwarded-for", "not-an-ip".parse().expect("header"));
    let (status, body, _) = send(&app, req).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_error(&body, "unidentified_client");
}

#[tokio::test]
async fn a_429_carries_retry_after_and_the_rate_limit_fields() {
    let mut config = config();
    config
        .ratelimit
        .tiers
        .get_mut("PUBLIC_IP")
        .expect("tier")
        .limits = vec![LimitConfig {
        limit: 2,
        window: Duration::from_secs(60),
        algorithm: None,
        burst: None,
        shadow: false,
    }];
    let app = app(&config);
    for _ in 0..2 {
        let (status, _, headers) = send(&app, chat(None)).await;
        assert_eq!(status, StatusCode::OK);
        assert!(headers.contains_key("x-ratelimit-remaining"));
    }
    let (status, body, headers) = send(&app, chat(None)).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_error(&body, "rate_limited");
    assert_eq!(body["tier"], "PUBLIC_IP");
    assert_eq!(body["layer"], "network");
    let retry: u64 = headers[header::RETRY_AFTER]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("secs");
    assert!((1..=60).contains(&retry), "{retry}");
    assert_eq!(body["retry_after_s"], retry);
    assert_eq!(headers["x-ratelimit-limit"], "2");
    assert_eq!(headers["x-ratelimit-remaining"], "0");
    assert_eq!(headers["x-ratelimit-tier"], "PUBLIC_IP");

    // Guessing keys counts against the same IP limit: over it, 429 not 401.
    let (status, _, _) = send(&app, chat(Some("guess"))).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
}

/// A store that is always down.
struct DownStore;

#[async_trait]
impl LimitStore for DownStore {
    fn kind(&self) -> &'static str {
        "redis"
    }

    async fn check(&self, _: &[LimitSpec], _: &str) -> Result<Decision, StoreUnavailable> {
        Err(StoreUnavailable {
            reason: "connection refused".into(),
            timeout: false,
            refused: false,
        })
    }

    async fn adjust(&self, _: &LimitSpec, _: i64) -> Result<(), StoreUnavailable> {
        Ok(())
    }
}

#[tokio::test]
async fn a_dead_store_under_fail_closed_is_503_limiter_unavailable() {
    let mut config = config();
    for tier in config.ratelimit.tiers.values_mut() {
        tier.on_store_failure = FailureMode::FailClosed;
    }
    let mut gw = gateway(&config);
    gw.limiter = Some(Arc::new(Limiter::new(
        Policy::new(config.ratelimit.clone()),
        Arc::new(DownStore),
    )));
    let app = app_from(gw, &config);
    let (status, body, headers) = send(&app, chat(None)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_error(&body, "limiter_unavailable");
    assert_eq!(headers[header::RETRY_AFTER], "1");
}

/// An LLM that fails the way it is told to, or hangs.
struct FakeLlm(fn() -> Option<UpstreamError>);

#[async_trait]
impl Llm for FakeLlm {
    fn kind(&self) -> &'static str {
        "openai"
    }

    async fn complete(&self, _: Completion<'_>) -> Result<Answer, UpstreamError> {
        match (self.0)() {
            Some(e) => Err(e),
            None => std::future::pending().await,
        }
    }
}

fn with_llm(config: &Config, llm: Arc<dyn Llm>) -> axum::Router {
    let mut gw = gateway(config);
    gw.pipeline = Pipeline::new(
        IntentRouter::new(&config.router),
        Arc::new(LocalIndex::acme()),
        llm,
        Arc::new(InProcessMemory::new(config.memory.clone())),
        config.vector_store.top_k,
        gw.health.clone(),
    );
    app_from(gw, config)
}

fn stack(policy: DependencyPolicy) -> DependencyStack {
    DependencyStack::new("llm", policy, Arc::new(NoopObserver)).expect("policy")
}

#[tokio::test]
async fn dependency_failures_are_502_504_and_503_with_retry_after() {
    let config = config();
    let failed = || {
        Some(UpstreamError::new(
            Dependency::Llm,
            UpstreamErrorKind::Status {
                status: 500,
                retry_after: None,
            },
        ))
    };
    let app = with_llm(&config, Arc::new(FakeLlm(failed)));
    let (status, body, _) = send(&app, chat(None)).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert_error(&body, "dependency_failed");
    assert!(
        body["message"].as_str().is_some_and(|m| m.contains("llm")),
        "{body}"
    );

    // Hanging LLM behind its stack: the attempt timeout makes it a 504.
    let mut policy = DependencyPolicy {
        attempt_timeout: Duration::from_millis(50),
        deadline: Duration::from_millis(200),
        ..DependencyPolicy::default()
    };
    policy.retry.enabled = false;
    let hang = GuardedLlm::new(Arc::new(FakeLlm(|| None)), &stack(policy.clone()));
    let app = with_llm(&config, Arc::new(hang));
    let (status, body, _) = send(&app, chat(None)).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    assert_error(&body, "dependency_timeout");

    // An open breaker answers 503 with when it will probe again.
    let open = stack(policy);
    open.breaker().expect("breaker").force_open();
    let app = with_llm(
        &config,
        Arc::new(GuardedLlm::new(Arc::new(FakeLlm(failed)), &open)),
    );
    let (status, body, headers) = send(&app, chat(None)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_error(&body, "dependency_unavailable");
    assert_eq!(body["dependency"], "llm");
    assert!(headers.contains_key(header::RETRY_AFTER));
}

#[tokio::test]
async fn an_error_nobody_recognises_is_500_internal_and_not_blamed_on_a_dependency() {
    let config = config();
    // A failure inside the LLM's stack that is neither the LLM's answer nor
    // a resilience refusal.
    let weird = || {
        let mut e = UpstreamError::new(Dependency::Llm, UpstreamErrorKind::Internal);
        e.source = Some(Box::new(std::io::Error::other("a bug")));
        Some(e)
    };
    let app = with_llm(&config, Arc::new(FakeLlm(weird)));
    let (status, body, _) = send(&app, chat(None)).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_error(&body, "internal_error");
    assert!(body.get("dependency").is_none(), "{body}");
    assert!(
        !body["message"].as_str().unwrap_or("").contains("a bug"),
        "details stay in the log"
    );

    // The same path answers for any error a handler or layer returns.
    let resp = levee::http::respond(&std::io::Error::other("x"));
    assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
}

#[tokio::test]
async fn probes_and_admin_do_not_read_bearer_tokens_as_api_keys() {
    let app = app(&config());
    for path in ["/health", "/ready", "/admin/breakers"] {
        let req = Request::get(path)
            .header(header::AUTHORIZATION, "Bearer admin-token")
            .body(Body::empty())
            .expect("request");
        let (status, body, _) = send(&app, req).await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
    }
}

#[tokio::test]
async fn a_full_tenant_queue_is_429_and_a_saturated_backend_503_both_with_retry_after() {
    use levee::fairness::{FairQueue, QueuePolicy};
    use levee::wiring::{FairLlm, QueuePolicies};
    let mut config = config();
    config.identity.api_keys.push(ApiKeyConfig {
        id: "other".into(),
        sha256: hash_key("other_key"),
        tenant: "globex".into(),
        tier: "API_KEY".into(),
    });
    // One slot, held by a call that never ends; short waits.
    let quick = QueuePolicy::try_new("t", 1, 4, Duration::from_millis(50)).expect("policy");
    let fair = FairLlm::new(
        Arc::new(FakeLlm(|| None)),
        FairQueue::new("llm", 1),
        QueuePolicies::new(Default::default(), quick),
        100,
        Duration::from_secs(30),
    );
    let app = with_llm(&config, Arc::new(fair));
    let hog = tokio::spawn({
        let app = app.clone();
        async move { app.oneshot(chat(Some(PARTNER_KEY))).await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;

    // The same tenant again: it holds its share, so the refusal is its own.
    let (status, body, headers) = send(&app, chat(Some(PARTNER_KEY))).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_error(&body, "tenant_queue_full");
    assert!(headers.contains_key(header::RETRY_AFTER));

    // Another tenant, holding nothing: the backend is saturated for all.
    let (status, body, headers) = send(&app, chat(Some("other_key"))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_error(&body, "overloaded");
    assert!(headers.contains_key(header::RETRY_AFTER));
    hog.abort();
}

/// A vector store that never answers.
struct HangingStore;

#[async_trait]
impl levee::upstream::VectorStore for HangingStore {
    fn kind(&self) -> &'static str {
        "qdrant"
    }

    async fn search(
        &self,
        _: &str,
        _: usize,
        _: &str,
    ) -> Result<Vec<levee::upstream::Passage>, UpstreamError> {
        std::future::pending().await
    }
}

#[tokio::test]
async fn a_remote_vector_store_has_fair_queues_too() {
    use levee::fairness::{FairQueue, QueuePolicy};
    use levee::wiring::{FairVectorStore, QueuePolicies};
    let config = config();
    let quick = QueuePolicy::try_new("t", 1, 4, Duration::from_millis(50)).expect("policy");
    let store = FairVectorStore::new(
        Arc::new(HangingStore),
        FairQueue::new("vector_store", 1),
        QueuePolicies::new(Default::default(), quick),
        Duration::from_secs(30),
    );
    let mut gw = gateway(&config);
    gw.pipeline = Pipeline::new(
        IntentRouter::new(&config.router),
        Arc::new(store),
        Arc::new(levee::upstream::ExtractiveAnswerer),
        Arc::new(InProcessMemory::new(config.memory.clone())),
        config.vector_store.top_k,
        gw.health.clone(),
    );
    let app = app_from(gw, &config);
    let hog = tokio::spawn({
        let app = app.clone();
        async move { app.oneshot(chat(Some(PARTNER_KEY))).await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (status, body, headers) = send(&app, chat(Some(PARTNER_KEY))).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_error(&body, "tenant_queue_full");
    assert_eq!(body["dependency"], "vector_store");
    assert!(headers.contains_key(header::RETRY_AFTER));
    hog.abort();
}

#[tokio::test]
async fn reload_needs_the_admin_token_and_a_file() {
    let app = app(&config());
    let reload = |token: Option<&str>| {
        let mut req = Request::post("/admin/reload");
        if let Some(t) = token {
            req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        req.body(Body::empty()).expect("request")
    };
    let (status, body, _) = send(&app, reload(None)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    // Embedded defaults: there is no file to re-read.
    let (status, body, _) = send(&app, reload(Some("admin-token"))).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"], "no_config_file");
    let config_view = Request::get("/admin/config")
        .header(header::AUTHORIZATION, "Bearer admin-token")
        .body(Body::empty())
        .expect("request");
    let (status, body, _) = send(&app, config_view).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["path"], Value::Null);
    assert_eq!(body["reloads"], 0);
    assert_eq!(
        body["config"]["identity"]["api_keys"][0]["sha256"], "(redacted)",
        "{body}"
    );
}
