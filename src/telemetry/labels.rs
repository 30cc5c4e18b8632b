//! [`Labels`]: the bounded sets that tenant and tier label values come
//! from. Clients choose tenants (in a body) and keys; they must never
//! choose label values, so anything not configured becomes `other`.

use std::collections::BTreeSet;

/// Label value for a tenant or tier that is not configured.
pub const OTHER: &str = "other";

/// Label value for a response that carries no rate-limit tier (exempt paths,
/// limiting disabled).
pub const NO_TIER: &str = "none";

/// The configured tenants and tiers.
#[derive(Debug, Clone, Default)]
pub struct Labels {
    tenants: BTreeSet<String>,
    tiers: BTreeSet<String>,
}

impl Labels {
    /// Labels bounded by these tenants and tiers.
    pub fn new(
        tenants: impl IntoIterator<Item = String>,
        tiers: impl IntoIterator<Item = String>,
    ) -> Self {
        Self {
            tenants: tenants.into_iter().collect(),
            tiers: tiers.into_iter().collect(),
        }
    }

    /// `tenant` if it is configured, else `other`.
    pub fn tenant<'a>(&self, tenant: &'a str) -> &'a str {
        if self.tenants.contains(tenant) {
            tenant
        } else {
            OTHER
        }
    }

    /// `tier` if it is configured, else `other`; `none` when absent.
    pub fn tier<'a>(&self, tier: Option<&'a str>) -> &'a str {
        match tier {
            None => NO_TIER,
            Some(t) if self.tiers.contains(t) => t,
            Some(_) => OTHER,
        }
    }

    /// Every configured tenant.
    pub fn tenants(&self) -> impl Iterator<Item = &str> {
        self.tenants.iter().map(String::as_str)
    }

    /// Every configured tier.
    pub fn tiers(&self) -> impl Iterator<Item = &str> {
        self.tiers.iter().map(String::as_str)
    }
}
