//! Shared input format of the header-driven fuzz targets: readable text,
//! so seeds are hand-written and mutations stay meaningful.
//!
//! ```text
//! peer 10.0.0.7
//! trust 10.0.0.0/8
//! forwarded: for=203.0.113.9;proto=https
//! x-forwarded-for: 198.51.100.2, 10.0.0.3
//! ```
//!
//! `peer IP` and `trust CIDR` set the connection; every other `name: value`
//! line is one header (repeat a name for several headers). Lines that are
//! neither, and names or values `http` refuses, are skipped.

use std::net::IpAddr;

use http::{HeaderMap, HeaderName, HeaderValue};
use ipnet::IpNet;

/// One decoded input.
#[derive(Debug, Default)]
pub struct Input {
    /// The TCP peer (`peer` line), if one parsed.
    pub peer: Option<IpAddr>,
    /// The trusted proxy networks (`trust` lines).
    pub trusted: Vec<IpNet>,
    /// The headers, in input order.
    pub headers: HeaderMap,
    /// The header lines as (name, value) bytes, for targets that rebuild
    /// the map with changes.
    pub lines: Vec<(HeaderName, HeaderValue)>,
}

/// Decodes `data` (see the module docs).
pub fn decode(data: &[u8]) -> Input {
    let mut input = Input::default();
    for line in data.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(ip) = line.strip_prefix(b"peer ") {
            input.peer = std::str::from_utf8(ip)
                .ok()
                .and_then(|s| s.trim().parse().ok());
        } else if let Some(net) = line.strip_prefix(b"trust ") {
            let net = std::str::from_utf8(net)
                .ok()
                .and_then(|s| s.trim().parse::<IpNet>().ok());
            input.trusted.extend(net);
        } else if let Some(colon) = line.iter().position(|&b| b == b':') {
            let value = &line[colon + 1..];
            let value = value.strip_prefix(b" ").unwrap_or(value);
            let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(&line[..colon]),
                HeaderValue::from_bytes(value),
            ) else {
                continue;
            };
            input.headers.append(name.clone(), value.clone());
            input.lines.push((name, value));
        }
    }
    input
}

/// A header map from `lines`.
pub fn header_map(lines: &[(HeaderName, HeaderValue)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in lines {
        map.append(name.clone(), value.clone());
    }
    map
}
