//! Who is calling: the client IP (forwarding headers honoured only from
//! trusted proxies, IPv6 grouped by prefix), the network class (internal or
//! public, by configured CIDRs), and the API key's registered id, tenant and
//! tier. Keys are looked up by SHA-256 hash; the registry never holds a key.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use http::HeaderMap;
use ipnet::IpNet;
use sha2::{Digest, Sha256};

mod config;
mod forwarded;

pub use config::{is_plain_id, ApiKeyConfig, IdentityConfig, DEFAULT_IPV6_PREFIX};
pub use forwarded::client_ip;

/// Whether the client is on an internal network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkClass {
    /// Inside `identity.internal_networks`.
    Internal,
    /// Everyone else.
    Public,
}

/// A registered API key, as known after lookup (never the key itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyInfo {
    /// Registered id: safe for logs, metrics and Redis key names.
    pub id: String,
    /// The tenant the key belongs to.
    pub tenant: String,
    /// The key's tier.
    pub tier: String,
}

/// The resolved caller, stored in request extensions for later layers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The client address, grouped (IPv6 masked to the configured prefix).
    pub client_ip: IpAddr,
    /// Internal or public.
    pub network: NetworkClass,
    /// The API key, if one was presented and is registered.
    pub key: Option<KeyInfo>,
}

/// Why a caller could not be identified.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// An API key was presented but is not registered.
    #[error("unknown API key")]
    UnknownKey,
    /// The key header is present but unusable (empty, not visible ASCII,
    /// not a Bearer token).
    #[error("malformed API key header: {0}")]
    MalformedKey(&'static str),
    /// No usable client address (no peer, or a trusted proxy sent an
    /// unparsable forwarding header).
    #[error("cannot identify the client: {0}")]
    Unidentified(&'static str),
}

/// Resolves identities; built once from config.
#[derive(Debug, Clone)]
pub struct Resolver {
    trusted_proxies: Vec<IpNet>,
    internal: Vec<IpNet>,
    ipv6_prefix: u8,
    keys: HashMap<[u8; 32], KeyInfo>,
}

impl Resolver {
    /// Builds a resolver from validated config.
    pub fn new(config: &IdentityConfig) -> Self {
        let keys = config
            .api_keys
            .iter()
            .filter_map(|k| {
                let digest: [u8; 32] = hex::decode(&k.sha256).ok()?.try_into().ok()?;
                Some((
                    digest,
                    KeyInfo {
                        id: k.id.clone(),
                        tenant: k.tenant.clone(),
                        tier: k.tier.clone(),
                    },
                ))
            })
            .collect();
        Self {
            trusted_proxies: config.trusted_proxies.clone(),
            internal: config.internal_networks.clone(),
            ipv6_prefix: config.ipv6_prefix,
            keys,
        }
    }

    /// The client's grouped IP and network class. Used on its own for
    /// requests whose key was refused, so key guessing still counts
    /// against the IP.
    pub fn network(
        &self,
        peer: Option<SocketAddr>,
        headers: &HeaderMap,
    ) -> Result<(IpAddr, NetworkClass), IdentityError> {
        let peer = peer.ok_or(IdentityError::Unidentified("no peer address"))?;
        let ip = client_ip(peer.ip(), headers, &self.trusted_proxies)?;
        let class = if self.internal.iter().any(|n| n.contains(&ip)) {
            NetworkClass::Internal
        } else {
            NetworkClass::Public
        };
        Ok((group(ip, self.ipv6_prefix), class))
    }

    /// The API key presented, looked up by hash. `Ok(None)` when none was
    /// presented.
    pub fn key(&self, headers: &HeaderMap) -> Result<Option<KeyInfo>, IdentityError> {
        let Some(raw) = presented_key(headers)? else {
            return Ok(None);
        };
        let digest: [u8; 32] = Sha256::digest(raw.as_bytes()).into();
        self.keys
            .get(&digest)
            .cloned()
            .map(Some)
            .ok_or(IdentityError::UnknownKey)
    }
}

/// The key from `X-API-Key`, else `Authorization: Bearer`.
fn presented_key(headers: &HeaderMap) -> Result<Option<String>, IdentityError> {
    if let Some(v) = headers.get("x-api-key") {
        let key = v
            .to_str()
            .map_err(|_| IdentityError::MalformedKey("X-API-Key is not visible ASCII"))?
            .trim();
        if key.is_empty() {
            return Err(IdentityError::MalformedKey("X-API-Key is empty"));
        }
        return Ok(Some(key.to_owned()));
    }
    if let Some(v) = headers.get(http::header::AUTHORIZATION) {
        let value = v
            .to_str()
            .map_err(|_| IdentityError::MalformedKey("Authorization is not visible ASCII"))?;
        let (scheme, token) = value.trim().split_once(' ').unwrap_or((value, ""));
        if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
            return Err(IdentityError::MalformedKey(
                "Authorization must be `Bearer <key>`",
            ));
        }
        return Ok(Some(token.trim().to_owned()));
    }
    Ok(None)
}

/// Masks IPv6 clients to their prefix (one /64 is one subscriber, who can
/// otherwise rotate through 2^64 addresses); IPv4-mapped addresses become
/// IPv4.
pub fn group(ip: IpAddr, ipv6_prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return IpAddr::V4(v4);
            }
            let bits = u128::from(v6);
            let mask = if ipv6_prefix == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(ipv6_prefix.min(128)))
            };
            IpAddr::V6(Ipv6Addr::from(bits & mask))
        }
    }
}

/// SHA-256 of a key, hex: what goes in `identity.api_keys[].sha256`.
pub fn hash_key(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

#[cfg(test)]
mod tests;
