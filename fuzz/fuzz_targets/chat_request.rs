//! `http::parse_chat_request`, the `POST /v1/chat` body decoder, against a
//! reference model built on `serde_json::Value`: the same bodies are
//! accepted with the same fields, and for a JSON object the error names
//! the field at fault (the first bad key in document order, else the
//! first missing field), with 422; JSON that is not an object is a 422
//! naming no field; a body that is not JSON is a 400.

#![no_main]

use std::fmt;

use http::StatusCode;
use levee::http::parse_chat_request;
use libfuzzer_sys::fuzz_target;
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::Value;

const FIELDS: [&str; 4] = ["message", "user_id", "thread_id", "tenant_id"];

fuzz_target!(|data: &[u8]| {
    let parsed = parse_chat_request(data);
    let expected = model(data);
    match (&parsed, &expected) {
        (Ok(req), Expect::Valid(fields)) => {
            assert_eq!(req.message, fields[0].as_deref().expect("message"));
            assert_eq!(req.user_id, fields[1].as_deref().expect("user_id"));
            assert_eq!(req.thread_id, fields[2].as_deref().expect("thread_id"));
            assert_eq!(req.tenant_id.as_deref(), fields[3].as_deref());
            assert!(req.queue_tenant.is_none(), "the body set the queue tenant");
        }
        (Ok(_), other) => panic!("accepted, but the model says {other:?}"),
        (Err(e), Expect::Valid(_)) => panic!("refused a valid body: {e:?}"),
        (Err(e), Expect::Invalid(field)) => {
            assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY, "{e:?}");
            if let Some(field) = field {
                assert_eq!(e.field.as_deref(), Some(field.as_str()), "{e:?}");
            }
        }
        (Err(e), Expect::NotObject) => {
            // 422 if it is JSON, 400 if not (serde_json's own judgement,
            // e.g. of a number past f64): never a field.
            assert!(
                e.status == StatusCode::UNPROCESSABLE_ENTITY || e.status == StatusCode::BAD_REQUEST,
                "{e:?}"
            );
            assert_eq!(e.field, None, "a value is not a field: {e:?}");
        }
        (Err(e), Expect::NotJson) => {
            // A syntax error, unless the decoder met a bad field first.
            assert!(
                e.status == StatusCode::BAD_REQUEST || e.status == StatusCode::UNPROCESSABLE_ENTITY,
                "{e:?}"
            );
        }
    }
    if let Err(e) = &parsed {
        assert!(!e.message.is_empty());
        if e.status == StatusCode::BAD_REQUEST {
            assert_eq!(e.code, "malformed_json");
            assert!(e.field.is_none());
        } else {
            assert_eq!(e.code, "invalid_request");
            let not_object = matches!(expected, Expect::NotObject);
            assert_eq!(e.field.is_some(), !not_object, "{e:?}");
        }
    }
});

/// The four fields.
type Fields = [Option<String>; 4];

/// What the decoder must say of a body.
#[derive(Debug)]
enum Expect {
    /// Accepted, with these fields.
    Valid(Fields),
    /// 422, naming this field where the model knows it.
    Invalid(Option<String>),
    /// Not a JSON object: 422 (or 400 when not JSON) naming no field.
    NotObject,
    /// Not JSON at all: 400, or 422 if a bad field comes first.
    NotJson,
}

fn model(data: &[u8]) -> Expect {
    if data.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Expect::NotObject;
    }
    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        return Expect::NotJson;
    };
    match value {
        Value::Object(_) => match serde_json::from_slice::<Pairs>(data) {
            Ok(Pairs(pairs)) => match object(&pairs) {
                Ok(fields) => Expect::Valid(fields),
                Err(field) => Expect::Invalid(Some(field)),
            },
            Err(_) => Expect::Invalid(None),
        },
        _ => Expect::NotObject,
    }
}

/// The fields of an object, or the field at fault.
fn object(pairs: &[(String, Value)]) -> Result<Fields, String> {
    let mut fields: Fields = Default::default();
    let mut seen = [false; 4];
    for (key, value) in pairs {
        let Some(i) = FIELDS.iter().position(|f| f == key) else {
            return Err(key.clone());
        };
        if seen[i] {
            return Err(key.clone());
        }
        seen[i] = true;
        match value {
            Value::String(s) => fields[i] = Some(s.clone()),
            Value::Null if i == 3 => {}
            _ => return Err(key.clone()),
        }
    }
    match seen[..3].iter().position(|s| !s) {
        Some(i) => Err(FIELDS[i].to_owned()),
        None => Ok(fields),
    }
}

/// A JSON object's members in document order, duplicates kept.
struct Pairs(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for Pairs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Pairs;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Pairs, A::Error> {
                let mut pairs = Vec::new();
                while let Some(pair) = map.next_entry()? {
                    pairs.push(pair);
                }
                Ok(Pairs(pairs))
            }
        }
        d.deserialize_map(V)
    }
}
