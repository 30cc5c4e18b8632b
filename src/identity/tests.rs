use std::net::{IpAddr, SocketAddr};

use http::{HeaderMap, HeaderValue};

use super::*;

fn resolver(trusted: &[&str]) -> Resolver {
    let mut config = IdentityConfig {
        trusted_proxies: trusted.iter().map(|s| s.parse().unwrap()).collect(),
        ..IdentityConfig::default()
    };
    config.api_keys.push(ApiKeyConfig {
        id: "partner".into(),
        sha256: hash_key("partner_key_123"),
        tenant: "acme".into(),
        tier: "API_KEY".into(),
    });
    Resolver::new(&config)
}

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(*k, HeaderValue::from_str(v).unwrap());
    }
    h
}

fn peer(ip: &str) -> Option<SocketAddr> {
    Some(SocketAddr::new(ip.parse().unwrap(), 40000))
}

#[test]
fn forwarded_for_from_an_untrusted_peer_is_ignored() {
    let r = resolver(&[]);
    let (ip, class) = r
        .network(
            peer("203.0.113.9"),
            &headers(&[("x-forwarded-for", "10.0.0.1")]),
        )
        .unwrap();
    assert_eq!(ip, "203.0.113.9".parse::<IpAddr>().unwrap());
    assert_eq!(class, NetworkClass::Public);
}

#[test]
fn trusted_proxy_chain_yields_the_rightmost_untrusted_hop() {
    let r = resolver(&["127.0.0.1/32", "10.9.0.0/16"]);
    // The client forged "10.0.0.1" on the left; 198.51.100.7 is who reached
    // our proxies.
    let h = headers(&[("x-forwarded-for", "10.0.0.1, 198.51.100.7, 10.9.1.1")]);
    let (ip, class) = r.network(peer("127.0.0.1"), &h).unwrap();
    assert_eq!(ip, "198.51.100.7".parse::<IpAddr>().unwrap());
    assert_eq!(class, NetworkClass::Public);
}

#[test]
fn rfc7239_forwarded_is_understood() {
    let r = resolver(&["127.0.0.1/32"]);
    let h = headers(&[(
        "forwarded",
        "for=192.0.2.60;proto=http, for=\"[2001:db8:cafe::17]:4711\"",
    )]);
    let (ip, _) = r.network(peer("127.0.0.1"), &h).unwrap();
    assert_eq!(
        ip,
        "2001:db8:cafe::".parse::<IpAddr>().unwrap(),
        "grouped to /64"
    );
}

#[test]
fn internal_networks_are_cidrs_not_string_prefixes() {
    let r = resolver(&["127.0.0.1/32"]);
    for (xff, class) in [
        ("10.1.2.3", NetworkClass::Internal),
        ("172.16.5.4", NetworkClass::Internal),
        ("172.32.0.1", NetworkClass::Public), // "172.3…" is not 172.16/12
        ("100.10.0.1", NetworkClass::Public), // contains "10." but is public
        ("192.168.1.1", NetworkClass::Internal),
    ] {
        let (_, got) = r
            .network(peer("127.0.0.1"), &headers(&[("x-forwarded-for", xff)]))
            .unwrap();
        assert_eq!(got, class, "{xff}");
    }
}

#[test]
fn garbage_forwarding_header_from_a_trusted_proxy_is_unidentified() {
    let r = resolver(&["127.0.0.1/32"]);
    let e = r
        .network(
            peer("127.0.0.1"),
            &headers(&[("x-forwarded-for", "not-an-ip")]),
        )
        .unwrap_err();
    assert!(matches!(e, IdentityError::Unidentified(_)));
    assert!(r.network(None, &HeaderMap::new()).is_err());
}

#[test]
fn ipv6_clients_are_grouped_by_prefix() {
    let a = group("2001:db8:1:2:aaaa::1".parse().unwrap(), 64);
    let b = group("2001:db8:1:2:bbbb::9".parse().unwrap(), 64);
    assert_eq!(a, b);
    assert_eq!(
        group("::ffff:192.0.2.1".parse().unwrap(), 64),
        "192.0.2.1".parse::<IpAddr>().unwrap()
    );
}

#[test]
fn keys_are_found_by_hash_from_either_header() {
    let r = resolver(&[]);
    let via_header = r
        .key(&headers(&[("x-api-key", "partner_key_123")]))
        .unwrap();
    let via_bearer = r
        .key(&headers(&[("authorization", "Bearer partner_key_123")]))
        .unwrap();
    assert_eq!(via_header.as_ref().map(|k| k.id.as_str()), Some("partner"));
    assert_eq!(via_header, via_bearer);
    assert_eq!(r.key(&HeaderMap::new()).unwrap(), None);
    assert_eq!(
        r.key(&headers(&[("x-api-key", "random")])),
        Err(IdentityError::UnknownKey)
    );
    assert!(matches!(
        r.key(&headers(&[("authorization", "Basic abc")])),
        Err(IdentityError::MalformedKey(_))
    ));
}

mod layer {
    //! The layer against `tower_test::mock`: readiness, what reaches the
    //! inner service, and refusals that never do.

    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use axum::extract::ConnectInfo;
    use http::{Request, Response};
    use std::task::Poll;
    use tower::{BoxError, Layer, Service};
    use tower_test::mock;

    use super::super::*;

    fn layer(require: bool) -> IdentityLayer {
        let mut config = IdentityConfig {
            require_api_key: require,
            ..IdentityConfig::default()
        };
        config.api_keys.push(ApiKeyConfig {
            id: "partner".into(),
            sha256: hash_key("partner_key_123"),
            tenant: "acme".into(),
            tier: "API_KEY".into(),
        });
        IdentityLayer::new(Arc::new(Resolver::new(&config)))
    }

    fn request(key: Option<&str>) -> Request<()> {
        let mut req = Request::get("/v1/chat").body(()).unwrap();
        req.extensions_mut()
            .insert(ConnectInfo(SocketAddr::from(([203, 0, 113, 9], 1))));
        if let Some(k) = key {
            req.headers_mut().insert("x-api-key", k.parse().unwrap());
        }
        req
    }

    #[tokio::test]
    async fn readiness_is_the_inner_services_and_wakes_with_it() {
        let (mut svc, mut handle) = mock::spawn_layer::<Request<()>, Response<()>, _>(layer(false));
        handle.allow(0);
        assert!(matches!(svc.poll_ready(), Poll::Pending));
        handle.allow(1);
        assert!(
            svc.is_woken(),
            "the inner service's readiness wakes the caller"
        );
        assert!(matches!(svc.poll_ready(), Poll::Ready(Ok(()))));
    }

    #[tokio::test]
    async fn an_admitted_request_reaches_the_inner_service_with_its_identity() {
        let (mut svc, mut handle) = mock::spawn_layer::<Request<()>, Response<()>, _>(layer(false));
        handle.allow(1);
        assert!(matches!(svc.poll_ready(), Poll::Ready(Ok(()))));
        let fut = svc.call(request(Some("partner_key_123")));
        let (req, send) = handle.next_request().await.expect("forwarded");
        let identity = req
            .extensions()
            .get::<Identity>()
            .expect("identity extension");
        assert_eq!(identity.tenant(), Some("acme"));
        assert_eq!(identity.client_ip, IpAddr::from([203, 0, 113, 9]));
        send.send_response(Response::new(()));
        fut.await.expect("answered");
    }

    #[tokio::test]
    async fn unknown_malformed_and_missing_keys_never_reach_the_inner_service() {
        for (require, key, expected) in [
            (false, Some("nonsense"), IdentityError::UnknownKey),
            (
                false,
                Some("   "),
                IdentityError::MalformedKey("X-API-Key is empty"),
            ),
            (true, None, IdentityError::KeyRequired),
        ] {
            let (mut svc, mut handle) =
                mock::spawn_layer::<Request<()>, Response<()>, _>(layer(require));
            handle.allow(1);
            assert!(matches!(svc.poll_ready(), Poll::Ready(Ok(()))));
            let err: BoxError = svc.call(request(key)).await.expect_err("refused");
            assert_eq!(err.downcast_ref::<IdentityError>(), Some(&expected));
            drop(svc);
            assert!(handle.next_request().await.is_none(), "{key:?}");
        }
    }

    /// Counts consultations, and answers a fixed error.
    struct Counting(AtomicUsize);

    #[async_trait::async_trait]
    impl OnRefusal for Counting {
        async fn refused(&self, identity: Identity, error: IdentityError) -> BoxError {
            assert!(
                identity.key.is_none(),
                "the hook sees the caller without a key"
            );
            self.0.fetch_add(1, Ordering::SeqCst);
            Box::new(error)
        }
    }

    #[tokio::test]
    async fn a_refused_key_consults_the_hook_once_and_an_accepted_one_never() {
        let hook = Arc::new(Counting(AtomicUsize::new(0)));
        let layer = layer(false).with_refusal_hook(hook.clone());
        let (svc, mut handle) = mock::pair::<Request<()>, Response<()>>();
        let mut svc = layer.layer(svc);
        handle.allow(2);
        let err = tower::ServiceExt::ready(&mut svc)
            .await
            .unwrap()
            .call(request(Some("nonsense")))
            .await
            .expect_err("refused");
        assert!(err.is::<IdentityError>());
        assert_eq!(hook.0.load(Ordering::SeqCst), 1);
        let fut = tower::ServiceExt::ready(&mut svc)
            .await
            .unwrap()
            .call(request(None));
        let (_, send) = handle.next_request().await.expect("anonymous is served");
        send.send_response(Response::new(()));
        fut.await.unwrap();
        assert_eq!(hook.0.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_cancelled_request_leaves_nothing_behind_in_the_inner_service() {
        let (mut svc, mut handle) = mock::spawn_layer::<Request<()>, Response<()>, _>(layer(false));
        handle.allow(1);
        assert!(matches!(svc.poll_ready(), Poll::Ready(Ok(()))));
        let fut = svc.call(request(None));
        let (_, send) = handle.next_request().await.expect("forwarded");
        drop(fut);
        // The client went away: the inner call's response has nobody to
        // go to, and sending it does not panic or block.
        send.send_response(Response::new(()));
    }
}
