//! `[resilience.<dependency>]`: the deadline, retry, breaker, bulkhead and
//! attempt-timeout settings of one dependency, with per-dependency
//! defaults ([`DependencyPolicy::llm`], [`DependencyPolicy::vector_store`],
//! [`DependencyPolicy::redis`]). [`DependencyPolicy::validate`] names the
//! bad key; the `settings()` methods turn checked values into the
//! validated types the layers take.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};
use tower::retry::budget::TpsBudget;

use super::breaker::{Backoff, BreakerSettings, SlowCallRule, TripRule};
use super::retry::RetrySettings;
use crate::error::ConfigError;

/// Default bound on a whole call, retries included.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(5);
/// Default bound on one attempt.
pub const DEFAULT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
/// Default attempts in all, the first included.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;
/// Default delay before the first retry.
pub const DEFAULT_MIN_BACKOFF: Duration = Duration::from_millis(100);
/// Default longest delay between attempts.
pub const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(1);
/// Default retries allowed per request of traffic (20%).
pub const DEFAULT_BUDGET_RATIO: f32 = 0.2;
/// Default retries per second always allowed, on top of the ratio.
pub const DEFAULT_BUDGET_MIN_PER_SEC: u32 = 1;
/// How long deposits into the retry budget count.
pub const BUDGET_TTL: Duration = Duration::from_secs(10);
/// Default consecutive failures that trip the `consecutive` policy.
pub const DEFAULT_CONSECUTIVE_FAILURES: u32 = 5;
/// Default failure rate that trips the `rate` policy.
pub const DEFAULT_FAILURE_RATE: f64 = 0.5;
/// Default window of the failure and slow-call rates.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(30);
/// Default calls a window must hold before a rate can trip.
pub const DEFAULT_MIN_CALLS: u32 = 10;
/// Default slow-call rate that trips (when a threshold is set).
pub const DEFAULT_SLOW_CALL_RATE: f64 = 0.8;
/// Default open time after the first trip.
pub const DEFAULT_MIN_OPEN: Duration = Duration::from_secs(5);
/// Default cap on the open time.
pub const DEFAULT_MAX_OPEN: Duration = Duration::from_secs(60);
/// Default jitter fraction of the open time.
pub const DEFAULT_OPEN_JITTER: f64 = 0.2;
/// Default concurrent half-open probes.
pub const DEFAULT_HALF_OPEN_PROBES: u32 = 2;
/// Default concurrent calls the bulkhead admits.
pub const DEFAULT_MAX_CONCURRENT: usize = 64;

/// `[resilience]`: one [`DependencyPolicy`] per dependency. A partial
/// table keeps that dependency's own defaults for the keys it leaves out.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ResilienceConfig {
    /// The LLM. Defaults: [`DependencyPolicy::llm`].
    pub llm: DependencyPolicy,
    /// The vector store. Defaults: [`DependencyPolicy::vector_store`].
    pub vector_store: DependencyPolicy,
    /// Redis. Defaults: [`DependencyPolicy::redis`].
    pub redis: DependencyPolicy,
}

/// How calls to one dependency are bounded, retried, broken and limited.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DependencyPolicy {
    /// Bound on a whole call, retries and backoff included. Default 5s.
    #[serde(with = "humantime_serde")]
    pub deadline: Duration,
    /// Bound on one attempt. Default 2s.
    #[serde(with = "humantime_serde")]
    pub attempt_timeout: Duration,
    /// Retries.
    pub retry: RetryConfig,
    /// The circuit breaker.
    pub breaker: BreakerConfig,
    /// The bulkhead.
    pub bulkhead: BulkheadConfig,
}

/// `retry`: budgeted retries with jittered exponential backoff.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryConfig {
    /// Retry at all. Default `true`.
    pub enabled: bool,
    /// Attempts in all, the first included. Default 3.
    pub max_attempts: u32,
    /// Delay before the first retry; doubles per retry. Default 100ms.
    #[serde(with = "humantime_serde")]
    pub min_backoff: Duration,
    /// Longest delay between attempts, and longest upstream `Retry-After`
    /// honoured. Default 1s.
    #[serde(with = "humantime_serde")]
    pub max_backoff: Duration,
    /// Add random jitter (up to 100%) to each delay. Default `true`.
    pub jitter: bool,
    /// Retries allowed per request of traffic, in `0..=1`. Default 0.2.
    pub budget_ratio: f32,
    /// Retries per second always allowed on top of the ratio. Default 1.
    pub budget_min_per_sec: u32,
}

/// Which rule trips a closed breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakerPolicyKind {
    /// `consecutive_failures` failures in a row.
    Consecutive,
    /// `failure_rate` of the calls in `window`, with `min_calls`.
    Rate,
}

/// `breaker`: when it opens, for how long, and how it probes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BreakerConfig {
    /// Use a breaker at all. Default `true`.
    pub enabled: bool,
    /// Trip rule: `consecutive` or `rate`. Default `rate`.
    pub policy: BreakerPolicyKind,
    /// Failures in a row that trip the `consecutive` rule. Default 5.
    pub consecutive_failures: u32,
    /// Failure fraction that trips the `rate` rule, in `(0, 1]`.
    /// Default 0.5.
    pub failure_rate: f64,
    /// Window of the failure and slow-call rates. Default 30s.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// Calls the window must hold before a rate can trip. Default 10.
    pub min_calls: u32,
    /// A success slower than this is a slow call; unset disables the
    /// slow-call rule. Default unset.
    #[serde(default, with = "humantime_serde")]
    pub slow_call_threshold: Option<Duration>,
    /// Slow fraction of the calls in `window` that trips, in `(0, 1]`.
    /// Default 0.8.
    pub slow_call_rate: f64,
    /// Open time after the first trip; doubles per consecutive trip.
    /// Default 5s.
    #[serde(with = "humantime_serde")]
    pub min_open: Duration,
    /// Cap on the open time. Default 60s.
    #[serde(with = "humantime_serde")]
    pub max_open: Duration,
    /// Jitter fraction of the open time, in `0..=1`. Default 0.2.
    pub open_jitter: f64,
    /// Concurrent probes while half-open; that many successes close it.
    /// Default 2.
    pub half_open_probes: u32,
}

/// `bulkhead`: the cap on concurrent calls.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BulkheadConfig {
    /// Use a bulkhead at all. Default `true`.
    pub enabled: bool,
    /// Concurrent calls admitted; more are rejected at once. Default 64.
    pub max_concurrent: usize,
}

impl Default for ResilienceConfig {
    fn default() -> Self {
        Self {
            llm: DependencyPolicy::llm(),
            vector_store: DependencyPolicy::vector_store(),
            redis: DependencyPolicy::redis(),
        }
    }
}

impl Default for DependencyPolicy {
    fn default() -> Self {
        Self {
            deadline: DEFAULT_DEADLINE,
            attempt_timeout: DEFAULT_ATTEMPT_TIMEOUT,
            retry: RetryConfig::default(),
            breaker: BreakerConfig::default(),
            bulkhead: BulkheadConfig::default(),
        }
    }
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            min_backoff: DEFAULT_MIN_BACKOFF,
            max_backoff: DEFAULT_MAX_BACKOFF,
            jitter: true,
            budget_ratio: DEFAULT_BUDGET_RATIO,
            budget_min_per_sec: DEFAULT_BUDGET_MIN_PER_SEC,
        }
    }
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            policy: BreakerPolicyKind::Rate,
            consecutive_failures: DEFAULT_CONSECUTIVE_FAILURES,
            failure_rate: DEFAULT_FAILURE_RATE,
            window: DEFAULT_WINDOW,
            min_calls: DEFAULT_MIN_CALLS,
            slow_call_threshold: None,
            slow_call_rate: DEFAULT_SLOW_CALL_RATE,
            min_open: DEFAULT_MIN_OPEN,
            max_open: DEFAULT_MAX_OPEN,
            open_jitter: DEFAULT_OPEN_JITTER,
            half_open_probes: DEFAULT_HALF_OPEN_PROBES,
        }
    }
}

impl Default for BulkheadConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_concurrent: DEFAULT_MAX_CONCURRENT,
        }
    }
}

impl DependencyPolicy {
    /// The LLM: 10s per attempt (the whole answer), 30s deadline, two
    /// retries, a rate breaker that also trips when 80% of calls take over
    /// 8s, 32 concurrent calls.
    pub fn llm() -> Self {
        Self {
            deadline: Duration::from_secs(30),
            attempt_timeout: Duration::from_secs(10),
            retry: RetryConfig {
                min_backoff: Duration::from_millis(250),
                max_backoff: Duration::from_secs(2),
                ..RetryConfig::default()
            },
            breaker: BreakerConfig {
                slow_call_threshold: Some(Duration::from_secs(8)),
                ..BreakerConfig::default()
            },
            bulkhead: BulkheadConfig {
                enabled: true,
                max_concurrent: 32,
            },
        }
    }

    /// The vector store: 1s per attempt, 3s deadline, two quick retries, a
    /// rate breaker over 10s with a 500ms slow-call threshold.
    pub fn vector_store() -> Self {
        Self {
            deadline: Duration::from_secs(3),
            attempt_timeout: Duration::from_secs(1),
            retry: RetryConfig {
                min_backoff: Duration::from_millis(50),
                max_backoff: Duration::from_millis(500),
                ..RetryConfig::default()
            },
            breaker: BreakerConfig {
                window: Duration::from_secs(10),
                slow_call_threshold: Some(Duration::from_millis(500)),
                min_open: Duration::from_secs(1),
                max_open: Duration::from_secs(30),
                ..BreakerConfig::default()
            },
            bulkhead: BulkheadConfig::default(),
        }
    }

    /// Redis: 50ms per attempt, no retry (a limiter check is on every
    /// request; its fail-open/closed policy decides instead), a breaker
    /// that opens after 3 consecutive failures for 500ms..5s and probes
    /// with one call.
    pub fn redis() -> Self {
        Self {
            deadline: Duration::from_millis(50),
            attempt_timeout: Duration::from_millis(50),
            retry: RetryConfig {
                enabled: false,
                max_attempts: 1,
                ..RetryConfig::default()
            },
            breaker: BreakerConfig {
                policy: BreakerPolicyKind::Consecutive,
                consecutive_failures: 3,
                window: Duration::from_secs(10),
                min_open: Duration::from_millis(500),
                max_open: Duration::from_secs(5),
                half_open_probes: 1,
                ..BreakerConfig::default()
            },
            bulkhead: BulkheadConfig {
                enabled: true,
                max_concurrent: 256,
            },
        }
    }

    /// Checks every value; `prefix` is this policy's key, e.g.
    /// `resilience.llm`.
    pub fn validate(&self, prefix: &str) -> Result<(), ConfigError> {
        positive(&format!("{prefix}.deadline"), self.deadline)?;
        positive(&format!("{prefix}.attempt_timeout"), self.attempt_timeout)?;
        check(
            self.attempt_timeout <= self.deadline,
            &format!("{prefix}.attempt_timeout"),
            humantime::format_duration(self.attempt_timeout),
            "must not exceed the deadline",
        )?;
        self.retry.validate(&format!("{prefix}.retry"))?;
        self.breaker.validate(&format!("{prefix}.breaker"))?;
        self.bulkhead.validate(&format!("{prefix}.bulkhead"))
    }
}

impl RetryConfig {
    /// Checks every value; `prefix` is e.g. `resilience.llm.retry`.
    pub fn validate(&self, prefix: &str) -> Result<(), ConfigError> {
        check(
            (1..=10).contains(&self.max_attempts),
            &format!("{prefix}.max_attempts"),
            self.max_attempts,
            "must be between 1 and 10",
        )?;
        check(
            self.min_backoff <= self.max_backoff,
            &format!("{prefix}.max_backoff"),
            humantime::format_duration(self.max_backoff),
            "must not be below min_backoff",
        )?;
        check(
            (0.0..=1.0).contains(&self.budget_ratio),
            &format!("{prefix}.budget_ratio"),
            self.budget_ratio,
            "must be between 0 and 1",
        )?;
        check(
            self.budget_min_per_sec <= 1_000_000,
            &format!("{prefix}.budget_min_per_sec"),
            self.budget_min_per_sec,
            "must be at most 1000000",
        )
    }

    /// The retry layer's settings, bounded by `deadline`.
    pub fn settings(&self, deadline: Duration) -> RetrySettings {
        RetrySettings {
            max_attempts: self.max_attempts,
            min_backoff: self.min_backoff,
            max_backoff: self.max_backoff,
            jitter: self.jitter,
            deadline: Some(deadline),
        }
    }

    /// A fresh retry budget: `budget_ratio` of requests plus
    /// `budget_min_per_sec`, remembered for [`BUDGET_TTL`]. Expects a
    /// validated config.
    pub fn budget(&self) -> Arc<TpsBudget> {
        Arc::new(TpsBudget::new(
            BUDGET_TTL,
            self.budget_min_per_sec,
            self.budget_ratio.clamp(0.0, 1.0),
        ))
    }
}

impl BreakerConfig {
    /// Checks every value; `prefix` is e.g. `resilience.llm.breaker`.
    pub fn validate(&self, prefix: &str) -> Result<(), ConfigError> {
        self.settings(prefix).map(|_| ())
    }

    /// The breaker's validated settings; errors name the key under
    /// `prefix`.
    pub fn settings(&self, prefix: &str) -> Result<BreakerSettings, ConfigError> {
        let key = |k: &str| format!("{prefix}.{k}");
        check(
            self.consecutive_failures >= 1,
            &key("consecutive_failures"),
            self.consecutive_failures,
            "must be at least 1",
        )?;
        fraction(&key("failure_rate"), self.failure_rate)?;
        fraction(&key("slow_call_rate"), self.slow_call_rate)?;
        check(
            self.window >= Duration::from_millis(10),
            &key("window"),
            humantime::format_duration(self.window),
            "must be at least 10ms",
        )?;
        check(
            self.min_calls >= 1,
            &key("min_calls"),
            self.min_calls,
            "must be at least 1",
        )?;
        if let Some(threshold) = self.slow_call_threshold {
            positive(&key("slow_call_threshold"), threshold)?;
        }
        check(
            self.half_open_probes >= 1,
            &key("half_open_probes"),
            self.half_open_probes,
            "must be at least 1",
        )?;
        let open =
            Backoff::try_new(self.min_open, self.max_open, self.open_jitter).map_err(|e| {
                let (k, v) = match e {
                    super::breaker::InvalidBackoff::ZeroMin => ("min_open", self.min_open),
                    super::breaker::InvalidBackoff::MaxBelowMin => ("max_open", self.max_open),
                    super::breaker::InvalidBackoff::Jitter => {
                        return ConfigError::invalid(
                            key("open_jitter"),
                            self.open_jitter.to_string(),
                            e.to_string(),
                        )
                    }
                };
                ConfigError::invalid(
                    key(k),
                    humantime::format_duration(v).to_string(),
                    e.to_string(),
                )
            })?;
        let trip = match self.policy {
            BreakerPolicyKind::Consecutive => {
                TripRule::ConsecutiveFailures(self.consecutive_failures)
            }
            BreakerPolicyKind::Rate => TripRule::FailureRate {
                rate: self.failure_rate,
                min_calls: self.min_calls,
                window: self.window,
            },
        };
        Ok(BreakerSettings {
            trip,
            slow_calls: self.slow_call_threshold.map(|threshold| SlowCallRule {
                threshold,
                rate: self.slow_call_rate,
                min_calls: self.min_calls,
                window: self.window,
            }),
            open,
            half_open_probes: self.half_open_probes,
        })
    }
}

impl BulkheadConfig {
    /// Checks every value; `prefix` is e.g. `resilience.llm.bulkhead`.
    pub fn validate(&self, prefix: &str) -> Result<(), ConfigError> {
        check(
            (1..=tokio::sync::Semaphore::MAX_PERMITS).contains(&self.max_concurrent),
            &format!("{prefix}.max_concurrent"),
            self.max_concurrent,
            "must be at least 1",
        )
    }
}

impl ResilienceConfig {
    /// Checks every dependency; `prefix` is normally `resilience`.
    pub fn validate(&self, prefix: &str) -> Result<(), ConfigError> {
        self.llm.validate(&format!("{prefix}.llm"))?;
        self.vector_store
            .validate(&format!("{prefix}.vector_store"))?;
        self.redis.validate(&format!("{prefix}.redis"))
    }
}

impl<'de> Deserialize<'de> for ResilienceConfig {
    /// Overlays each given table on that dependency's own defaults (plain
    /// `#[serde(default)]` would fill a partial table from the generic
    /// defaults, e.g. turn Redis retries on).
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Raw {
            #[serde(default)]
            llm: Option<serde_json::Value>,
            #[serde(default)]
            vector_store: Option<serde_json::Value>,
            #[serde(default)]
            redis: Option<serde_json::Value>,
        }
        let raw = Raw::deserialize(deserializer)?;
        Ok(Self {
            llm: overlay::<D>("llm", DependencyPolicy::llm(), raw.llm)?,
            vector_store: overlay::<D>(
                "vector_store",
                DependencyPolicy::vector_store(),
                raw.vector_store,
            )?,
            redis: overlay::<D>("redis", DependencyPolicy::redis(), raw.redis)?,
        })
    }
}

fn overlay<'de, D: Deserializer<'de>>(
    name: &str,
    base: DependencyPolicy,
    given: Option<serde_json::Value>,
) -> Result<DependencyPolicy, D::Error> {
    use serde::de::Error as _;
    let Some(given) = given else {
        return Ok(base);
    };
    let mut merged = serde_json::to_value(&base).map_err(D::Error::custom)?;
    merge(&mut merged, given);
    // Name the full key in the error, as every other config error does.
    serde_path_to_error::deserialize(merged).map_err(|e| {
        let path = e.path().to_string();
        D::Error::custom(format!("resilience.{name}.{path}: {}", e.into_inner()))
    })
}

fn merge(base: &mut serde_json::Value, given: serde_json::Value) {
    match (base, given) {
        (serde_json::Value::Object(base), serde_json::Value::Object(given)) => {
            for (k, v) in given {
                match base.get_mut(&k) {
                    Some(slot) => merge(slot, v),
                    None => {
                        base.insert(k, v);
                    }
                }
            }
        }
        (slot, given) => *slot = given,
    }
}

fn check(
    ok: bool,
    key: &str,
    value: impl std::fmt::Display,
    reason: &str,
) -> Result<(), ConfigError> {
    if ok {
        Ok(())
    } else {
        Err(ConfigError::invalid(key, value.to_string(), reason))
    }
}

fn positive(key: &str, value: Duration) -> Result<(), ConfigError> {
    check(
        !value.is_zero(),
        key,
        humantime::format_duration(value),
        "must be greater than zero",
    )
}

fn fraction(key: &str, value: f64) -> Result<(), ConfigError> {
    check(
        value > 0.0 && value <= 1.0,
        key,
        value,
        "must be between 0 and 1",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_default_policy_is_valid() {
        ResilienceConfig::default().validate("resilience").unwrap();
        DependencyPolicy::default().validate("x").unwrap();
    }

    #[test]
    fn a_bad_rate_names_its_key_and_value() {
        let mut policy = DependencyPolicy::llm();
        policy.breaker.failure_rate = 1.5;
        let err = policy.validate("resilience.llm").unwrap_err();
        assert_eq!(err.key(), "resilience.llm.breaker.failure_rate");
        assert_eq!(
            err.to_string(),
            "invalid config `resilience.llm.breaker.failure_rate` = 1.5: must be between 0 and 1"
        );
    }

    #[test]
    fn open_times_are_checked_through_the_backoff_type() {
        let mut policy = DependencyPolicy::redis();
        policy.breaker.max_open = Duration::from_millis(100);
        let err = policy.validate("resilience.redis").unwrap_err();
        assert_eq!(err.key(), "resilience.redis.breaker.max_open");
        policy.breaker.max_open = Duration::from_secs(5);
        policy.breaker.open_jitter = -0.1;
        let err = policy.validate("resilience.redis").unwrap_err();
        assert_eq!(err.key(), "resilience.redis.breaker.open_jitter");
    }

    #[test]
    fn an_attempt_timeout_over_the_deadline_is_refused() {
        let mut policy = DependencyPolicy::vector_store();
        policy.attempt_timeout = Duration::from_secs(4);
        let err = policy.validate("resilience.vector_store").unwrap_err();
        assert_eq!(err.key(), "resilience.vector_store.attempt_timeout");
    }

    #[test]
    fn a_partial_table_keeps_that_dependencys_defaults() {
        let cfg: ResilienceConfig = toml::from_str(
            r#"
            [redis]
            attempt_timeout = "30ms"
            [llm.breaker]
            failure_rate = 0.25
            slow_call_threshold = "5s"
            "#,
        )
        .unwrap();
        assert_eq!(cfg.redis.attempt_timeout, Duration::from_millis(30));
        assert!(!cfg.redis.retry.enabled, "redis keeps its no-retry default");
        assert_eq!(cfg.redis.breaker.policy, BreakerPolicyKind::Consecutive);
        assert_eq!(cfg.llm.breaker.failure_rate, 0.25);
        assert_eq!(
            cfg.llm.breaker.slow_call_threshold,
            Some(Duration::from_secs(5))
        );
        assert_eq!(cfg.llm.deadline, Duration::from_secs(30));
        assert_eq!(cfg.vector_store, DependencyPolicy::vector_store());
    }

    #[test]
    fn unknown_keys_are_refused() {
        let err = toml::from_str::<ResilienceConfig>("[llm.retry]\nmax_attempt = 2\n").unwrap_err();
        assert!(err.to_string().contains("max_attempt"), "{err}");
        assert!(toml::from_str::<ResilienceConfig>("[llama]\n").is_err());
    }

    #[test]
    fn defaults_round_trip_through_toml() {
        let text = toml::to_string(&ResilienceConfig::default()).unwrap();
        let back: ResilienceConfig = toml::from_str(&text).unwrap();
        assert_eq!(back, ResilienceConfig::default());
    }
}
