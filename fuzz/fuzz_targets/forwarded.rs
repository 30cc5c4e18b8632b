//! `identity::client_ip`: the client behind trusted proxies, from
//! `Forwarded` / `X-Forwarded-For`. Beyond not panicking, checks what the
//! limiter relies on: an untrusted peer is always the answer; the answer
//! is the peer or an address written in the headers; hops left of the
//! answer (client-forgeable) never change it; a hop a trusted proxy
//! appends on the right becomes the answer; `Forwarded` beats
//! `X-Forwarded-For`. Input format: `levee_fuzz` (peer / trust / headers).

#![no_main]

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use http::header::FORWARDED;
use http::{HeaderName, HeaderValue};
use ipnet::IpNet;
use levee::identity::client_ip;
use levee_fuzz::{decode, header_map};
use libfuzzer_sys::fuzz_target;

const XFF: &str = "x-forwarded-for";
const FORGED: &str = "6.6.6.6";
const APPENDED: IpAddr = IpAddr::V4(Ipv4Addr::new(203, 0, 113, 77));

fuzz_target!(|data: &[u8]| {
    let input = decode(data);
    let peer = input.peer.unwrap_or(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)));
    let trusted = &input.trusted;
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|n: &IpNet| n.contains(ip));
    let result = client_ip(peer, &input.headers, trusted);

    if !is_trusted(&peer) {
        assert_eq!(result, Ok(peer), "an untrusted peer is the client");
        return;
    }
    let has = |name: &str| input.lines.iter().any(|(n, _)| n == name);
    let kind = if has(FORWARDED.as_str()) {
        Some(FORWARDED.as_str())
    } else if has(XFF) {
        Some(XFF)
    } else {
        None
    };
    let Ok(client) = result else {
        assert!(kind.is_some(), "only a forwarding header can fail");
        return;
    };
    assert!(
        client == peer || written(&input.lines).contains(&client),
        "{client} is neither the peer nor in the headers"
    );
    if kind.is_none() {
        assert_eq!(client, peer);
    }

    if kind == Some(FORWARDED.as_str()) {
        // X-Forwarded-For is ignored once a Forwarded header is present.
        let lines: Vec<_> = input
            .lines
            .iter()
            .filter(|(n, _)| n != XFF)
            .cloned()
            .collect();
        assert_eq!(client_ip(peer, &header_map(&lines), trusted), Ok(client));
    }

    if let Some(kind) = kind {
        if !is_trusted(&client) {
            // The client controls everything left of the first untrusted hop.
            let prefix = if kind == XFF {
                format!("{FORGED}, ")
            } else {
                format!("for={FORGED}, ")
            };
            let lines = edit(
                &input.lines,
                kind,
                |v| [prefix.as_bytes(), v].concat(),
                true,
            );
            assert_eq!(
                client_ip(peer, &header_map(&lines), trusted),
                Ok(client),
                "a forged hop on the left changed the client"
            );
        }
    }

    if !is_trusted(&APPENDED) {
        // What the trusted peer itself saw connect is the client.
        let lines = match kind {
            Some(kind) => {
                let suffix = if kind == XFF {
                    format!(", {APPENDED}")
                } else {
                    format!(", for={APPENDED}")
                };
                edit(
                    &input.lines,
                    kind,
                    |v| [v, suffix.as_bytes()].concat(),
                    false,
                )
            }
            None => {
                let mut lines = input.lines.clone();
                let value =
                    HeaderValue::from_str(&APPENDED.to_string()).expect("an IP is a header value");
                lines.push((HeaderName::from_static(XFF), value));
                lines
            }
        };
        assert_eq!(
            client_ip(peer, &header_map(&lines), trusted),
            Ok(APPENDED),
            "the hop appended by the trusted peer is not the client"
        );
    }
});

/// Every address that could be read out of the forwarding headers.
fn written(lines: &[(HeaderName, HeaderValue)]) -> HashSet<IpAddr> {
    let mut ips = HashSet::new();
    for (name, value) in lines {
        if name != FORWARDED && name != XFF {
            continue;
        }
        let Ok(value) = value.to_str() else { continue };
        for token in value.split(|c: char| ",;=\"[] \t".contains(c)) {
            if let Ok(ip) = token.parse::<IpAddr>() {
                ips.insert(ip);
            } else if let Ok(sa) = token.parse::<SocketAddr>() {
                ips.insert(sa.ip());
            }
        }
    }
    ips
}

/// `lines` with the first (or last) `kind` header's value rewritten.
fn edit(
    lines: &[(HeaderName, HeaderValue)],
    kind: &str,
    f: impl Fn(&[u8]) -> Vec<u8>,
    first: bool,
) -> Vec<(HeaderName, HeaderValue)> {
    let mut lines = lines.to_vec();
    let mut positions = lines
        .iter()
        .enumerate()
        .filter(|(_, (n, _))| n == kind)
        .map(|(i, _)| i);
    let at = if first {
        positions.next()
    } else {
        positions.last()
    };
    if let Some(i) = at {
        let value = f(lines[i].1.as_bytes());
        lines[i].1 = HeaderValue::from_bytes(&value).expect("adding ASCII keeps a value valid");
    }
    lines
}
