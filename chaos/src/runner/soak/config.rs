//! The soak's levee config: API keys for four tenants, a configured model
//! for `/v1/chat/completions`, jobs on Redis with a short `result_ttl`,
//! and only 1-second limit windows, so everything Redis holds for a
//! request (limit entries, finished jobs) expires within seconds and its
//! memory reaches a steady state early in the run.
//!
//! [`Variant`] is what the reloads change: the limited tenant's limit and
//! whether a spare key exists; [`broken`] is a file a reload must refuse.

/// An API key: the secret clients send and its SHA-256 for the config.
#[derive(Debug, Clone, Copy)]
pub struct Key {
    /// `X-API-Key`.
    pub secret: &'static str,
    /// `printf %s SECRET | sha256sum`.
    pub sha256: &'static str,
}

/// Sync chat, streamed and plain completions.
pub const CHAT: Key = Key {
    secret: "soak-chat-key",
    sha256: "ad74308589765bf336b906c0794e83fba46b9d96de5510144c0d04539e766fc7",
};
/// Jobs.
pub const BATCH: Key = Key {
    secret: "soak-batch-key",
    sha256: "8c68408d182715668cfd7d83aa2dfe89926d29c9834f3c75ca25259c0dae660e",
};
/// A tenant sent more than its limit: 200 and 429.
pub const LIMITED: Key = Key {
    secret: "soak-limited-key",
    sha256: "152609ce39b8fb6babc09884a9b57c2540d00ed9e0ed8a15ffe5387e6cc55fb6",
};
/// Added and removed by reloads: 200 while configured, 401 otherwise.
pub const SPARE: Key = Key {
    secret: "soak-spare-key",
    sha256: "85a5c5a5fed7759bdc78ae9097036783b55377c602651b2b0f5af62b371fa5f3",
};
/// Never configured: always 401.
pub const UNKNOWN_SECRET: &str = "soak-unknown-key";

/// The model name clients send to `/v1/chat/completions`.
pub const MODEL: &str = "soak-model";
/// How long a finished job is kept (`jobs.result_ttl`), in seconds.
pub const RESULT_TTL_S: u64 = 10;
/// The LLM breaker's longest open time, in seconds: failures past a fault
/// by more than this (plus a probe) are not the fault's.
pub const BREAKER_MAX_OPEN_S: u64 = 4;

/// What a reload changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variant {
    /// The limited tenant's requests per second.
    pub limited_per_s: u32,
    /// Whether [`SPARE`] is configured.
    pub spare_key: bool,
}

impl Variant {
    /// The config the soak starts with.
    pub const INITIAL: Self = Self {
        limited_per_s: 2,
        spare_key: false,
    };

    /// The next variant of the reload cycle: the limit and the spare key
    /// alternate out of step, so all four combinations occur.
    pub fn next(self, n: u64) -> Self {
        if n % 2 == 0 {
            Self {
                limited_per_s: if self.limited_per_s == 2 { 3 } else { 2 },
                ..self
            }
        } else {
            Self {
                spare_key: !self.spare_key,
                ..self
            }
        }
    }
}

/// The config text for `variant`; `llm_url` is the simulator's OpenAI
/// base URL (`…/v1`), which the configured model's deployment points at.
pub fn render(variant: Variant, llm_url: &str) -> String {
    let key = |k: Key, id: &str, tier: &str| {
        format!(
            "[[identity.api_keys]]\nid = \"{id}\"\nsha256 = \"{}\"\ntenant = \"{id}\"\ntier = \"{tier}\"\n",
            k.sha256
        )
    };
    let mut text = String::from("# levee-chaos soak: rewritten by the run\n");
    text += &key(CHAT, "chat", "SOAK");
    text += &key(BATCH, "batch", "SOAK");
    text += &key(LIMITED, "limited", "LIMITED");
    if variant.spare_key {
        text += &key(SPARE, "spare", "SOAK");
    }
    let limited = variant.limited_per_s;
    let ttl = RESULT_TTL_S;
    let max_open = BREAKER_MAX_OPEN_S;
    text += &format!(
        r#"
[admin]
token_env = "LEVEE_ADMIN_TOKEN"

[[llm.models]]
name = "{MODEL}"
[[llm.models.deployments]]
url = "{llm_url}"
model = "levee-sim"

[memory]
max_turns = 6

[ratelimit]
[ratelimit.tiers.SOAK]
limits = [{{ limit = 100000, window = "1s" }}]
[ratelimit.tiers.LIMITED]
limits = [{{ limit = {limited}, window = "1s" }}]
[ratelimit.tiers.API_KEY]
limits = [{{ limit = 100000, window = "1s" }}]
[ratelimit.tiers.INTERNAL_IP]
limits = [{{ limit = 100000, window = "1s" }}]
[ratelimit.tiers.PUBLIC_IP]
limits = [{{ limit = 100000, window = "1s" }}]

[jobs]
enabled = true
workers = 8
result_ttl = "{ttl}s"
visibility_timeout = "30s"
max_deliveries = 3

# Redis on loopback answers in well under a millisecond; the default 50 ms
# attempt timeout trips its breaker when other builds starve this machine's
# two cores, which is not what a soak looks for (redis-slow does).
[resilience.redis]
attempt_timeout = "250ms"
deadline = "250ms"

[resilience.llm]
attempt_timeout = "2s"
deadline = "5s"
[resilience.llm.retry]
max_attempts = 2
[resilience.llm.breaker]
policy = "rate"
failure_rate = 0.5
window = "5s"
min_calls = 10
min_open = "1s"
max_open = "{max_open}s"
open_jitter = 0.0
"#
    );
    text
}

/// A file a reload must refuse, with the old config serving on: every
/// other one a TOML syntax error, the others a value `validate()` rejects.
pub fn broken(variant: Variant, llm_url: &str, n: u64) -> String {
    let good = render(variant, llm_url);
    if n % 2 == 0 {
        good + "\n[[[ this is not TOML\n"
    } else {
        good.replace("workers = 8", "workers = 0")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reload_cycle_visits_every_combination_and_returns() {
        let mut v = Variant::INITIAL;
        let mut seen = vec![v];
        for n in 0..4 {
            v = v.next(n);
            seen.push(v);
        }
        assert_eq!(seen[4], Variant::INITIAL);
        seen.pop();
        seen.sort_by_key(|v| (v.limited_per_s, v.spare_key));
        seen.dedup();
        assert_eq!(seen.len(), 4);
    }

    #[test]
    fn the_spare_key_is_in_the_file_only_when_asked_for() {
        let with = render(
            Variant {
                spare_key: true,
                ..Variant::INITIAL
            },
            "http://127.0.0.1:1/v1",
        );
        assert!(with.contains(SPARE.sha256));
        assert!(!render(Variant::INITIAL, "http://127.0.0.1:1/v1").contains(SPARE.sha256));
    }

    #[test]
    fn broken_files_differ_from_the_good_one() {
        let good = render(Variant::INITIAL, "http://x/v1");
        for n in 0..2 {
            let bad = broken(Variant::INITIAL, "http://x/v1", n);
            assert_ne!(bad, good);
        }
        assert!(broken(Variant::INITIAL, "http://x/v1", 1).contains("workers = 0"));
    }
}
