//! The client address behind trusted proxies: `Forwarded` (RFC 7239) or
//! `X-Forwarded-For`, honoured only when the TCP peer is a trusted proxy,
//! read right to left, skipping trusted hops. The first untrusted hop is
//! the client: everything left of it was written by the client itself and
//! can be forged.

use std::net::{IpAddr, SocketAddr};

use http::HeaderMap;
use ipnet::IpNet;

use super::IdentityError;

/// The client IP for a connection from `peer`.
pub fn client_ip(
    peer: IpAddr,
    headers: &HeaderMap,
    trusted: &[IpNet],
) -> Result<IpAddr, IdentityError> {
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|n| n.contains(ip));
    if !is_trusted(&peer) {
        return Ok(peer);
    }
    let Some(hops) = forwarded_hops(headers)? else {
        return Ok(peer);
    };
    let mut client = peer;
    for hop in hops.iter().rev() {
        client = *hop;
        if !is_trusted(hop) {
            break;
        }
    }
    Ok(client)
}

/// All hops listed, left to right; `Forwarded` wins over `X-Forwarded-For`.
fn forwarded_hops(headers: &HeaderMap) -> Result<Option<Vec<IpAddr>>, IdentityError> {
    let forwarded: Vec<&str> = headers
        .get_all(http::header::FORWARDED)
        .iter()
        .map(|v| v.to_str().map_err(|_| bad()))
        .collect::<Result<_, _>>()?;
    if !forwarded.is_empty() {
        let mut hops = Vec::new();
        for element in forwarded.iter().flat_map(|v| v.split(',')) {
            for pair in element.split(';') {
                let Some((name, value)) = pair.trim().split_once('=') else {
                    continue;
                };
                if name.trim().eq_ignore_ascii_case("for") {
                    hops.push(parse_node(value.trim().trim_matches('"'))?);
                }
            }
        }
        return Ok(Some(hops));
    }
    let xff: Vec<&str> = headers
        .get_all("x-forwarded-for")
        .iter()
        .map(|v| v.to_str().map_err(|_| bad()))
        .collect::<Result<_, _>>()?;
    if xff.is_empty() {
        return Ok(None);
    }
    xff.iter()
        .flat_map(|v| v.split(','))
        .map(|s| parse_node(s.trim()))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn bad() -> IdentityError {
    IdentityError::Unidentified("a trusted proxy sent an unparsable forwarding header")
}

/// `1.2.3.4`, `1.2.3.4:80`, `[2001:db8::1]`, `[2001:db8::1]:443`, `2001:db8::1`.
fn parse_node(s: &str) -> Result<IpAddr, IdentityError> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Ok(ip);
    }
    if let Ok(sa) = s.parse::<SocketAddr>() {
        return Ok(sa.ip());
    }
    let bracketed = s
        .strip_prefix('[')
        .and_then(|r| r.split_once(']'))
        .map(|(ip, _)| ip);
    bracketed.and_then(|ip| ip.parse().ok()).ok_or_else(bad)
}
