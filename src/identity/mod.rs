//! Who is calling: the client IP (forwarding headers honoured only from
//! trusted proxies, IPv6 grouped by prefix), the network class (internal or
//! public, by configured CIDRs), the API key's registered id, tenant and
//! tier, and the end user (`X-User-Id`). Keys are looked up by SHA-256
//! hash; the registry never holds a key.
//!
//! [`IdentityLayer`] / [`Authenticate`] is the tower layer that does this
//! once per request, before any limit: it stores the typed [`Identity`] in
//! the request's extensions and refuses unknown or malformed keys (and,
//! with `require_api_key`, anonymous callers) whether or not any limit is
//! configured. Everything downstream reads the extension.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use arc_swap::ArcSwap;
use http::HeaderMap;
use ipnet::IpNet;
use sha2::{Digest, Sha256};

mod config;
mod forwarded;
mod future;
mod layer;
mod service;

pub use config::{is_plain_id, ApiKeyConfig, IdentityConfig, DEFAULT_IPV6_PREFIX};
pub use forwarded::client_ip;
pub use future::ResponseFuture;
pub use layer::IdentityLayer;
pub use service::{Authenticate, OnRefusal};

/// Header carrying the end user for per-user sub-limits.
pub const USER_HEADER: &str = "x-user-id";

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
/// Cheap to clone (the key and the user are shared).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The client address, grouped (IPv6 masked to the configured prefix).
    pub client_ip: IpAddr,
    /// Internal or public.
    pub network: NetworkClass,
    /// The API key, if one was presented and is registered.
    pub key: Option<Arc<KeyInfo>>,
    /// The end user named by `X-User-Id`, if any (visible ASCII, not
    /// empty). Only ever used hashed in key names.
    pub user: Option<Arc<str>>,
}

impl Identity {
    /// An anonymous caller at `client_ip`.
    pub fn anonymous(client_ip: IpAddr, network: NetworkClass) -> Self {
        Self {
            client_ip,
            network,
            key: None,
            user: None,
        }
    }

    /// The tenant of the caller's key, if keyed.
    pub fn tenant(&self) -> Option<&str> {
        self.key.as_deref().map(|k| k.tenant.as_str())
    }
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
    /// No API key was presented where one is required
    /// (`identity.require_api_key`).
    #[error("an API key is required (X-API-Key or Authorization: Bearer)")]
    KeyRequired,
}

/// Why [`Resolver::resolve`] refused a request.
#[derive(Debug)]
pub enum Refused {
    /// No usable client address: nothing to count the attempt against.
    Network(IdentityError),
    /// The client is known but its key is not (or is missing where
    /// required); `identity` is the anonymous caller, for throttling.
    Key {
        /// The caller without a key.
        identity: Identity,
        /// Why the key was refused.
        error: IdentityError,
    },
}

/// Resolves identities. Built from config, and replaced whole by a live
/// reload ([`Resolver::replace`]): a request reads one snapshot, so it sees
/// either the old keys or the new ones, never a mix.
#[derive(Debug)]
pub struct Resolver {
    table: ArcSwap<Table>,
}

/// One config's worth of what [`Resolver`] knows.
#[derive(Debug)]
struct Table {
    trusted_proxies: Vec<IpNet>,
    internal: Vec<IpNet>,
    ipv6_prefix: u8,
    keys: HashMap<[u8; 32], Arc<KeyInfo>>,
    require_key: bool,
    require_key_paths: Vec<String>,
    keyless_paths: Vec<String>,
}

impl Table {
    fn new(config: &IdentityConfig) -> Self {
        let keys = config
            .api_keys
            .iter()
            .filter_map(|k| {
                let digest: [u8; 32] = hex::decode(&k.sha256).ok()?.try_into().ok()?;
                Some((
                    digest,
                    Arc::new(KeyInfo {
                        id: k.id.clone(),
                        tenant: k.tenant.clone(),
                        tier: k.tier.clone(),
                    }),
                ))
            })
            .collect();
        Self {
            trusted_proxies: config.trusted_proxies.clone(),
            internal: config.internal_networks.clone(),
            ipv6_prefix: config.ipv6_prefix,
            keys,
            require_key: config.require_api_key,
            require_key_paths: config.require_api_key_paths.clone(),
            keyless_paths: config.keyless_paths.clone(),
        }
    }
}

impl Resolver {
    /// Builds a resolver from validated config.
    pub fn new(config: &IdentityConfig) -> Self {
        Self {
            table: ArcSwap::from_pointee(Table::new(config)),
        }
    }

    /// Replaces everything the resolver knows with validated `config`, for
    /// the next request on. Requests already past the identity layer keep
    /// the identity they were given.
    pub fn replace(&self, config: &IdentityConfig) {
        self.table.store(Arc::new(Table::new(config)));
    }

    /// How many API keys are registered.
    pub fn key_count(&self) -> usize {
        self.table.load().keys.len()
    }

    /// Resolves the whole identity of one request: address, key and user.
    /// An unknown or malformed key is refused in every configuration; a
    /// missing one only where `require_api_key` (or one of its path
    /// prefixes) asks for a key.
    pub fn resolve(
        &self,
        peer: Option<SocketAddr>,
        headers: &HeaderMap,
        path: &str,
    ) -> Result<Identity, Refused> {
        let table = self.table.load();
        let (client_ip, network) = table.network(peer, headers).map_err(Refused::Network)?;
        let mut identity = Identity::anonymous(client_ip, network);
        if table.keyless_paths.iter().any(|p| path_matches(p, path)) {
            // Probes, the scrape endpoint and the admin API (which checks
            // its own bearer token): their credentials are not API keys.
            return Ok(identity);
        }
        match table.key(headers) {
            Ok(Some(key)) => identity.key = Some(key),
            Ok(None) if table.requires_key(path) => {
                return Err(Refused::Key {
                    identity,
                    error: IdentityError::KeyRequired,
                })
            }
            Ok(None) => {}
            Err(error) => return Err(Refused::Key { identity, error }),
        }
        identity.user = headers
            .get(USER_HEADER)
            .and_then(|v| v.to_str().ok())
            .filter(|u| !u.is_empty())
            .map(Arc::from);
        Ok(identity)
    }

    /// The client's grouped IP and network class. Used on its own for
    /// requests whose key was refused, so key guessing still counts
    /// against the IP.
    pub fn network(
        &self,
        peer: Option<SocketAddr>,
        headers: &HeaderMap,
    ) -> Result<(IpAddr, NetworkClass), IdentityError> {
        self.table.load().network(peer, headers)
    }

    /// The API key presented, looked up by hash. `Ok(None)` when none was
    /// presented.
    pub fn key(&self, headers: &HeaderMap) -> Result<Option<Arc<KeyInfo>>, IdentityError> {
        self.table.load().key(headers)
    }
}

impl Table {
    /// Whether a request to `path` must present a key.
    fn requires_key(&self, path: &str) -> bool {
        self.require_key || self.require_key_paths.iter().any(|p| path_matches(p, path))
    }

    fn network(
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

    fn key(&self, headers: &HeaderMap) -> Result<Option<Arc<KeyInfo>>, IdentityError> {
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

/// The key from `X-API-Key`, else `Authorization: Bearer`. Public for the
/// fuzz target; never logged.
pub fn presented_key(headers: &HeaderMap) -> Result<Option<&str>, IdentityError> {
    if let Some(v) = headers.get("x-api-key") {
        let key = v
            .to_str()
            .map_err(|_| IdentityError::MalformedKey("X-API-Key is not visible ASCII"))?
            .trim();
        if key.is_empty() {
            return Err(IdentityError::MalformedKey("X-API-Key is empty"));
        }
        return Ok(Some(key));
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
        return Ok(Some(token.trim()));
    }
    Ok(None)
}

/// Whether `path` matches `pattern`: exactly, or by prefix when the
/// pattern ends in `*` (`/admin/*`).
pub fn path_matches(pattern: &str, path: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => path.starts_with(prefix),
        None => pattern == path,
    }
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
