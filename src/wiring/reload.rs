//! [`Reloader`]: live reload of the config file (`SIGHUP`,
//! `POST /admin/reload`).
//!
//! The whole file is read, parsed, overridden by `LEVEE_*` and validated
//! exactly as at start-up before anything changes; a bad file changes
//! nothing. What can change live is then swapped in, each part as one
//! pointer store that the next request reads:
//!
//! - `identity` (API keys, tenants and tiers of keys, trusted proxies,
//!   internal networks, which paths need a key): the resolver's table;
//! - `ratelimit` tiers, tenants, routes, exempt paths, algorithm and key
//!   prefix: the limiter's policy. The counters in the store carry on: a
//!   limit's key names its subject, algorithm and window, not its value;
//! - fair-queue weights, queue bounds and waits (`ratelimit.tenants`):
//!   the table every fair queue and the job workers read;
//! - `max_queued_jobs` (per tenant and `jobs.max_queued_jobs`).
//!
//! Everything else (listen address, upstream URLs, resilience stacks,
//! Redis, the limiter's store, whether limits / jobs / fairness are on …)
//! was built into running parts at start-up: a change there is logged,
//! by key, as needing a restart, and the running value is kept.
//! In-flight requests keep the snapshot they started with.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use prometheus::{IntCounter, IntGauge};
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::config::Config;
use crate::error::ConfigError;
use crate::fairness::QueuePolicies;
use crate::identity::Resolver;
use crate::jobs::QueueLimits;
use crate::ratelimit::policy::Policy;
use crate::ratelimit::Limiter;
use crate::telemetry::metrics::{counter, gauge};
use crate::telemetry::Metrics;

/// Why a reload changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The gateway runs on embedded defaults: there is no file to re-read.
    #[error("no config file to reload: the gateway was started without one (embedded defaults)")]
    NoSource,
    /// The new file cannot be read, parsed or validated. The error names
    /// the key and the value at fault.
    #[error("the new config was refused, the running one is unchanged: {0}")]
    Invalid(#[from] ConfigError),
}

/// What a successful reload did.
#[derive(Debug, Clone, Serialize)]
pub struct Reloaded {
    /// SHA-256 of the file now loaded, hex.
    pub sha256: String,
    /// When it was loaded (RFC 3339).
    pub loaded_at: String,
    /// The live settings that changed (`identity.api_keys`,
    /// `ratelimit.tenants.acme.limits` …), now in force.
    pub applied: Vec<String>,
    /// Settings that changed in the file but only take effect on a
    /// restart: their running values were kept.
    pub restart_required: Vec<String>,
}

/// The loaded file, as `GET /admin/config` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct LoadedView {
    /// The file (`None`: embedded defaults).
    pub path: Option<String>,
    /// SHA-256 of its bytes, hex (`None`: embedded defaults).
    pub sha256: Option<String>,
    /// When it was loaded (RFC 3339).
    pub loaded_at: String,
    /// Successful reloads since start.
    pub reloads: u64,
    /// The running configuration, secrets removed: API-key hashes and any
    /// password in a URL.
    pub config: Value,
}

/// The parts a reload swaps.
#[derive(Debug)]
pub struct LiveParts {
    /// The identity layer's table.
    pub resolver: Arc<Resolver>,
    /// The limiter (`None` with `ratelimit.enabled = false`).
    pub limiter: Option<Arc<Limiter>>,
    /// Every fair queue's and the workers' tenant policies.
    pub queues: QueuePolicies,
    /// `max_queued_jobs` per tenant.
    pub job_limits: Arc<QueueLimits>,
}

#[derive(Debug)]
struct Loaded {
    config: Config,
    sha256: Option<String>,
    loaded_at: SystemTime,
    reloads: u64,
}

#[derive(Debug)]
struct ReloadMetrics {
    successes: IntCounter,
    failures: IntCounter,
    last_successful: IntGauge,
    loaded_at: IntGauge,
}

/// Re-reads the config file and applies what can change live.
#[derive(Debug)]
pub struct Reloader {
    parts: LiveParts,
    /// Held for a whole reload: two at once would race their swaps.
    loaded: Mutex<Loaded>,
    metrics: ReloadMetrics,
}

impl Reloader {
    /// A reloader for the gateway built from `config`.
    pub fn new(config: &Config, parts: LiveParts, metrics: &Metrics) -> Self {
        let r = metrics.registry();
        let one = |c: prometheus::IntCounterVec| c.with_label_values(&[] as &[&str]);
        let metrics = ReloadMetrics {
            successes: one(counter(
                r,
                "levee_config_reloads_total",
                "Config reloads that put a new file in force.",
                &[],
            )),
            failures: one(counter(
                r,
                "levee_config_reload_failures_total",
                "Config reloads refused (unreadable or invalid file); the running config was kept.",
                &[],
            )),
            last_successful: gauge(
                r,
                "levee_config_last_reload_successful",
                "1 if the last reload (or the start-up load) succeeded, else 0.",
                &[],
            )
            .with_label_values(&[] as &[&str]),
            loaded_at: gauge(
                r,
                "levee_config_loaded_timestamp_seconds",
                "When the running config file was loaded (Unix seconds).",
                &[],
            )
            .with_label_values(&[] as &[&str]),
        };
        let loaded_at = SystemTime::now();
        metrics.last_successful.set(1);
        metrics.loaded_at.set(unix_seconds(loaded_at));
        let sha256 = config
            .source
            .as_deref()
            .and_then(|p| std::fs::read(p).ok())
            .map(|bytes| hex::encode(Sha256::digest(&bytes)));
        Self {
            parts,
            loaded: Mutex::new(Loaded {
                config: config.clone(),
                sha256,
                loaded_at,
                reloads: 0,
            }),
            metrics,
        }
    }

    /// Re-reads the file the gateway was started with (and the
    /// environment's `LEVEE_*` overrides, as at start-up) and applies it.
    /// Blocking (reads a file): call it off the request path.
    pub fn reload(&self) -> Result<Reloaded, ReloadError> {
        let result = self.try_reload(|k| std::env::var(k).ok());
        match &result {
            Ok(done) => {
                self.metrics.successes.inc();
                self.metrics.last_successful.set(1);
                tracing::info!(
                    sha256 = %done.sha256,
                    applied = ?done.applied,
                    restart_required = ?done.restart_required,
                    "config reloaded"
                );
            }
            Err(e) => {
                self.metrics.failures.inc();
                self.metrics.last_successful.set(0);
                tracing::error!(error = %e, "config reload refused; still serving the previous config");
            }
        }
        result
    }

    fn try_reload(&self, vars: impl Fn(&str) -> Option<String>) -> Result<Reloaded, ReloadError> {
        let mut loaded = self.loaded.lock().unwrap_or_else(PoisonError::into_inner);
        let path: PathBuf = loaded.config.source.clone().ok_or(ReloadError::NoSource)?;
        let text = std::fs::read_to_string(&path)
            .map_err(|e| ConfigError::io(path.display().to_string(), e.to_string()))?;
        let new = Config::load_text(&text, &path, vars)?;
        // Everything fallible is built before anything is swapped.
        let queues = super::queue_policies(&new).map_err(|e| match e {
            super::BuildError::Config(e) => e,
            super::BuildError::Client(e) => {
                ConfigError::invalid("ratelimit.tenants", "", e.to_string())
            }
        })?;
        let running = &loaded.config;
        let effective = live_merge(running, &new);
        let restart_required = differences(&to_value(&new), &to_value(&effective));
        for key in &restart_required {
            tracing::warn!(
                key = %key,
                running = %show(lookup(&to_value(running), key)),
                file = %show(lookup(&to_value(&new), key)),
                "config key changed in the file, but only takes effect on a restart: keeping the running value"
            );
        }
        let applied = differences(&to_value(running), &to_value(&effective));

        let parts = &self.parts;
        parts.resolver.replace(&effective.identity);
        if let Some(limiter) = &parts.limiter {
            limiter.replace_policy(Policy::new(effective.ratelimit.clone()));
        }
        parts.queues.replace(&queues);
        parts.job_limits.replace(&job_limits(&effective));

        let now = SystemTime::now();
        let sha256 = hex::encode(Sha256::digest(text.as_bytes()));
        loaded.config = effective;
        loaded.sha256 = Some(sha256.clone());
        loaded.loaded_at = now;
        loaded.reloads += 1;
        self.metrics.loaded_at.set(unix_seconds(now));
        Ok(Reloaded {
            sha256,
            loaded_at: humantime::format_rfc3339_millis(now).to_string(),
            applied,
            restart_required,
        })
    }

    /// The loaded file and the running config, without secrets.
    pub fn view(&self) -> LoadedView {
        let loaded = self.loaded.lock().unwrap_or_else(PoisonError::into_inner);
        LoadedView {
            path: loaded
                .config
                .source
                .as_deref()
                .map(|p| p.display().to_string()),
            sha256: loaded.sha256.clone(),
            loaded_at: humantime::format_rfc3339_millis(loaded.loaded_at).to_string(),
            reloads: loaded.reloads,
            config: redact(to_value(&loaded.config)),
        }
    }

    /// Reloads on every `SIGHUP` until the process ends.
    pub async fn on_hangup(self: Arc<Self>) {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let mut hup = match signal(SignalKind::hangup()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(error = %e, "cannot listen for SIGHUP: reload with POST /admin/reload");
                    return;
                }
            };
            while hup.recv().await.is_some() {
                tracing::info!("SIGHUP: reloading the config file");
                let me = self.clone();
                // Errors are logged and counted by `reload`.
                let _ = tokio::task::spawn_blocking(move || me.reload()).await;
            }
        }
    }
}

/// `running` with the live parts of `new`: what the gateway runs after a
/// reload. The rest of `running` stays, since it was built into running
/// parts.
fn live_merge(running: &Config, new: &Config) -> Config {
    let mut effective = running.clone();
    effective.identity = new.identity.clone();
    let mut rl = new.ratelimit.clone();
    // Whether there is a limiter, and its store, were decided at start.
    rl.enabled = running.ratelimit.enabled;
    rl.store = running.ratelimit.store;
    effective.ratelimit = rl;
    effective.jobs.max_queued_jobs = new.jobs.max_queued_jobs;
    effective
}

/// Each tenant's `max_queued_jobs`, and the default.
pub(super) fn job_limits(config: &Config) -> QueueLimits {
    QueueLimits::new(
        config
            .ratelimit
            .tenants
            .iter()
            .filter_map(|(t, c)| Some((t.clone(), c.max_queued_jobs?)))
            .collect(),
        config.jobs.max_queued_jobs,
    )
}

fn to_value(config: &Config) -> Value {
    serde_json::to_value(config).unwrap_or(Value::Null)
}

fn unix_seconds(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// The dotted keys at which `a` and `b` differ; a changed list or a
/// changed scalar is one key (`llm.models`, `server.listen`).
fn differences(a: &Value, b: &Value) -> Vec<String> {
    fn walk(a: &Value, b: &Value, at: &str, out: &mut Vec<String>) {
        match (a, b) {
            (Value::Object(x), Value::Object(y)) => {
                let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
                keys.sort();
                keys.dedup();
                for k in keys {
                    let next = if at.is_empty() {
                        k.clone()
                    } else {
                        format!("{at}.{k}")
                    };
                    walk(
                        x.get(k).unwrap_or(&Value::Null),
                        y.get(k).unwrap_or(&Value::Null),
                        &next,
                        out,
                    );
                }
            }
            _ if a != b => out.push(at.to_owned()),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(a, b, "", &mut out);
    out
}

fn lookup<'a>(v: &'a Value, key: &str) -> &'a Value {
    key.split('.')
        .try_fold(v, |v, k| v.get(k))
        .unwrap_or(&Value::Null)
}

/// A value for a log line, secrets removed.
fn show(v: &Value) -> String {
    redact(v.clone()).to_string()
}

/// Removes what must never be shown: API-key hashes (an unsalted hash of
/// a short key can be brute-forced) and passwords in URLs (`redis.url`,
/// `redis.cluster_nodes`, upstream URLs).
fn redact(v: Value) -> Value {
    match v {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| match k.as_str() {
                    "sha256" => (k, Value::String("(redacted)".into())),
                    _ => (k, redact(v)),
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(redact).collect()),
        Value::String(s) => Value::String(redact_url(&s)),
        other => other,
    }
}

/// `scheme://user:password@host…` → `scheme://user:***@host…`; anything
/// else unchanged.
fn redact_url(s: &str) -> String {
    let Some((scheme, rest)) = s.split_once("://") else {
        return s.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return s.to_owned();
    };
    let userinfo = &rest[..at];
    let user = userinfo.split_once(':').map_or("", |(u, _)| u);
    format!("{scheme}://{user}:***{}", &rest[at..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_password() {
        assert_eq!(
            redact_url("redis://:hunter2@10.0.0.1:6379/0"),
            "redis://:***@10.0.0.1:6379/0"
        );
        assert_eq!(
            redact_url("redis://app:s3cret@host/0?x=@"),
            "redis://app:***@host/0?x=@"
        );
        assert_eq!(redact_url("http://127.0.0.1:9/v1"), "http://127.0.0.1:9/v1");
        assert_eq!(redact_url("not a url"), "not a url");
    }

    #[test]
    fn differences_name_dotted_keys() {
        let a = serde_json::json!({"server": {"listen": "a", "x": 1}, "l": [1, 2]});
        let b = serde_json::json!({"server": {"listen": "b", "x": 1}, "l": [1]});
        assert_eq!(differences(&a, &b), vec!["l", "server.listen"]);
        assert!(differences(&a, &a).is_empty());
    }
}
