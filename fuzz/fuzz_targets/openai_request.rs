//! `proxy::ApiRequest`, the OpenAI-compatible request decoder
//! (`/v1/chat/completions` and `/v1/embeddings` bodies). Checks the facts
//! it reports against the JSON itself, that an error names a parameter
//! or the body, and that the body it sends upstream (renamed model,
//! `include_usage` forced on streams) is again a valid request of the
//! same kind, with the same flags, and the original bytes when nothing
//! needs rewriting.

#![no_main]

use bytes::Bytes;
use levee::proxy::{ApiRequest, InvalidRequest, Operation};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

const RENAMED: &str = "upstream-model-7";

fuzz_target!(|data: &[u8]| {
    let raw = Bytes::copy_from_slice(data);
    let json: Option<Value> = serde_json::from_slice(data).ok();
    check(
        ApiRequest::chat(raw.clone()),
        json.as_ref(),
        Operation::Chat,
        &raw,
    );
    check(
        ApiRequest::embeddings(raw.clone()),
        json.as_ref(),
        Operation::Embeddings,
        &raw,
    );
});

fn check(
    parsed: Result<ApiRequest, InvalidRequest>,
    json: Option<&Value>,
    op: Operation,
    raw: &Bytes,
) {
    let req = match parsed {
        Ok(req) => req,
        Err(e) => {
            assert!(!e.message.is_empty());
            if let Some(param) = &e.param {
                assert!(!param.is_empty());
            } else {
                // Only the body as a whole: not JSON, or not an object.
                assert!(!matches!(json, Some(Value::Object(_))), "{e:?}");
            }
            return;
        }
    };
    let body = json
        .and_then(Value::as_object)
        .expect("accepted a body that is not a JSON object");
    assert_eq!(req.operation(), op);
    assert_eq!(Some(req.model()), body.get("model").and_then(Value::as_str));
    assert!(!req.model().is_empty());
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    assert_eq!(req.stream(), op == Operation::Chat && stream);
    if !req.stream() {
        assert_eq!(
            req.upstream_body(None),
            *raw,
            "rewrote a body that needed nothing"
        );
    }
    // Saturating, whatever the counts.
    let _ = req.estimated_tokens(u64::MAX);
    let _ = req.estimated_tokens(0);

    for rename in [None, Some(RENAMED), Some(req.model().to_owned()).as_deref()] {
        let upstream = req.upstream_body(rename);
        let again = match op {
            Operation::Chat => ApiRequest::chat(upstream.clone()),
            Operation::Embeddings => ApiRequest::embeddings(upstream.clone()),
        };
        let again =
            again.unwrap_or_else(|e| panic!("upstream body {upstream:?} is invalid: {e:?}"));
        assert_eq!(again.model(), rename.unwrap_or(req.model()));
        assert_eq!(again.stream(), req.stream());
        assert_eq!(again.include_usage(), req.include_usage() || req.stream());
    }
}
