//! `GET /v1/models`: OpenAI's model listing, so a gateway that discovers
//! its upstream's models (or health-checks it with this cheap call) sees
//! the configured ids in the real shape.

use std::sync::Arc;

use axum::{extract::State, Json};
use serde_json::{json, Value};

use super::app::AppState;

/// Who owns every listed model.
const OWNED_BY: &str = "levee-sim";

/// Handles `GET /v1/models`: `{"object":"list","data":[model, ..]}` in
/// the order of `--models`. `created` is when this instance started, so
/// repeated listings are identical, as a real API's are.
pub(crate) async fn list(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(listing(&state.config.models, state.started))
}

fn listing(models: &[String], created: u64) -> Value {
    let data: Vec<Value> = models
        .iter()
        .map(|id| {
            json!({
                "id": id,
                "object": "model",
                "created": created,
                "owned_by": OWNED_BY,
            })
        })
        .collect();
    json!({"object": "list", "data": data})
}

#[cfg(test)]
mod tests {
    use super::*;

    use axum::{
        body::{to_bytes, Body},
        http::{Request, StatusCode},
        Router,
    };
    use tower::ServiceExt;

    use super::super::{app::router, config::SimConfig};

    async fn get(router: Router, path: &str) -> (StatusCode, Value) {
        let response = router
            .oneshot(
                Request::get(path)
                    .body(Body::empty())
                    .expect("request builds"),
            )
            .await
            .expect("router answers");
        let status = response.status();
        let body = to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("body");
        (status, serde_json::from_slice(&body).expect("json"))
    }

    #[tokio::test]
    async fn default_listing_is_the_one_model_chat_echoes() {
        let (status, body) = get(router(SimConfig::default()), "/v1/models").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["object"], "list");
        let data = body["data"].as_array().expect("data array");
        assert_eq!(data.len(), 1);
        assert_eq!(data[0]["id"], "levee-sim");
        assert_eq!(data[0]["object"], "model");
        assert_eq!(data[0]["owned_by"], "levee-sim");
        assert!(data[0]["created"]
            .as_u64()
            .is_some_and(|t| t > 1_600_000_000));
    }

    #[tokio::test]
    async fn configured_models_are_listed_in_order_and_counted_as_chat() {
        let router = router(SimConfig {
            models: vec!["gpt-4o".into(), "gpt-4o-mini".into()],
            ..SimConfig::default()
        });
        let (_, body) = get(router.clone(), "/v1/models").await;
        let ids: Vec<&str> = body["data"]
            .as_array()
            .expect("data array")
            .iter()
            .filter_map(|m| m["id"].as_str())
            .collect();
        assert_eq!(ids, ["gpt-4o", "gpt-4o-mini"]);
        let (_, stats) = get(router, "/_stats").await;
        assert_eq!(stats["requests"]["chat"], 1);
        // A listing is not a completion: no slot was taken.
        assert_eq!(stats["llm"]["max_in_flight"], 0);
    }

    #[tokio::test]
    async fn chat_faults_apply_to_the_listing() {
        let router = router(SimConfig::default());
        let spec = Request::post("/_faults")
            .body(Body::from(
                r#"{"error_rate": 1, "error_status": 503, "target": "chat"}"#,
            ))
            .expect("request builds");
        let response = router.clone().oneshot(spec).await.expect("router answers");
        assert_eq!(response.status(), StatusCode::OK);
        let (status, body) = get(router, "/v1/models").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body["error"]["type"], "server_error");
    }

    #[test]
    fn listing_has_openai_shape() {
        assert_eq!(
            listing(&["m".to_owned()], 7),
            json!({"object": "list", "data": [
                {"id": "m", "object": "model", "created": 7, "owned_by": "levee-sim"},
            ]})
        );
    }
}
