//! API-key headers: `identity::presented_key` and the `Resolver`'s lookup
//! by hash. Checks that a key read is non-empty, trimmed and taken from
//! the header that wins (`X-API-Key` over `Authorization: Bearer`); that a
//! registered key resolves to its entry and an unregistered one never
//! does; that a keyless path never reads the headers; and that a required
//! key is refused when absent. Input format: `levee_fuzz` (headers; `peer`
//! optional).

#![no_main]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use http::header::AUTHORIZATION;
use levee::identity::{
    hash_key, presented_key, ApiKeyConfig, IdentityConfig, IdentityError, Refused, Resolver,
    USER_HEADER,
};
use levee_fuzz::{decode, header_map};
use libfuzzer_sys::fuzz_target;

const API_KEY: &str = "x-api-key";

fuzz_target!(|data: &[u8]| {
    let input = decode(data);
    let headers = &input.headers;
    let presented = presented_key(headers);

    let winner = if headers.contains_key(API_KEY) {
        Some(API_KEY)
    } else if headers.contains_key(AUTHORIZATION) {
        Some(AUTHORIZATION.as_str())
    } else {
        None
    };
    match (&presented, winner) {
        (Ok(None), None) => {}
        (Ok(Some(key)), Some(name)) => {
            assert!(
                !key.is_empty() && *key == key.trim(),
                "key {key:?} not trimmed"
            );
            let value = headers
                .get(name)
                .expect("winner present")
                .to_str()
                .expect("read");
            assert!(value.contains(key), "{key:?} is not from {name}");
            if name == AUTHORIZATION {
                let scheme = value.trim_start().get(..6).expect("Bearer <key>");
                assert!(scheme.eq_ignore_ascii_case("bearer"));
            }
        }
        (Err(IdentityError::MalformedKey(_)), Some(_)) => {}
        other => panic!("unexpected {other:?}"),
    }
    if winner == Some(API_KEY) {
        // Authorization is not looked at when X-API-Key is present.
        let lines: Vec<_> = input
            .lines
            .iter()
            .filter(|(n, _)| n != AUTHORIZATION)
            .cloned()
            .collect();
        assert_eq!(presented_key(&header_map(&lines)), presented);
    }

    // The resolver: one fixed key, and the presented one, registered.
    let mut config = IdentityConfig::default();
    config.api_keys.push(entry("fixed", "sk-fuzz-fixed"));
    if let Ok(Some(key)) = presented
        .clone()
        .map(|k| k.filter(|k| *k != "sk-fuzz-fixed"))
    {
        config.api_keys.push(entry("presented", key));
    }
    let resolver = Resolver::new(&config);
    let empty = Resolver::new(&IdentityConfig::default());
    match presented {
        Ok(Some(key)) => {
            let info = resolver
                .key(headers)
                .expect("registered")
                .expect("presented");
            let want = if key == "sk-fuzz-fixed" {
                "fixed"
            } else {
                "presented"
            };
            assert_eq!(info.id, want);
            assert_eq!(empty.key(headers), Err(IdentityError::UnknownKey));
        }
        Ok(None) => assert_eq!(resolver.key(headers), Ok(None)),
        Err(ref e) => assert_eq!(resolver.key(headers).as_ref(), Err(e)),
    }

    let peer = SocketAddr::new(input.peer.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)), 40000);
    match resolver.resolve(Some(peer), headers, "/health") {
        Ok(identity) => assert!(identity.key.is_none(), "a keyless path read a key"),
        Err(Refused::Network(_)) => {}
        Err(Refused::Key { error, .. }) => panic!("a keyless path refused a key: {error}"),
    }
    config.require_api_key = true;
    let strict = Resolver::new(&config);
    match strict.resolve(Some(peer), headers, "/v1/chat") {
        Ok(identity) => {
            assert!(matches!(presented, Ok(Some(_))) && identity.key.is_some());
            if let Some(user) = identity.user.as_deref() {
                assert!(!user.is_empty());
                assert_eq!(
                    headers.get(USER_HEADER).and_then(|v| v.to_str().ok()),
                    Some(user)
                );
            }
        }
        Err(Refused::Network(_)) => {}
        Err(Refused::Key { error, .. }) => match presented {
            Ok(None) => assert_eq!(error, IdentityError::KeyRequired),
            Err(e) => assert_eq!(error, e),
            Ok(Some(_)) => panic!("a registered key was refused: {error}"),
        },
    }
});

fn entry(id: &str, key: &str) -> ApiKeyConfig {
    ApiKeyConfig {
        id: id.to_owned(),
        sha256: hash_key(key),
        tenant: "t".to_owned(),
        tier: "API_KEY".to_owned(),
    }
}
