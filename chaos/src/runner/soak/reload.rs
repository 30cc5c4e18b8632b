//! Live reloads during a soak. Every [`RELOAD_EVERY`] the config file is
//! rewritten with the next [`Variant`] (the limited tenant's limit, the
//! spare key) and levee is told to re-read it, by SIGHUP and by
//! `POST /admin/reload` in turn. Each reload is checked: `GET
//! /admin/config` must report the new file's SHA-256 (and, where it shows
//! the running config, the new limit), and the spare key must answer
//! `GET /v1/models` with 200 exactly while it is configured (401
//! otherwise). Every [`BROKEN_EVERY`]-th reload writes a file levee must refuse instead: the
//! POST must answer 4xx, `levee_config_reload_failures_total` must rise by
//! one (SIGHUP too), the reported SHA-256 must stay the old file's, the
//! spare key keep its old answer; then the good file is put back.
//!
//! The contract is levee's: SIGHUP and `POST /admin/reload` re-read the
//! file; 200 JSON on success, 4xx JSON when the new file is invalid (the
//! old config keeps serving); `GET /admin/config` gives the loaded file's
//! SHA-256. A levee without `GET /admin/config` has no reload, and SIGHUP
//! would kill it, so [`supported`] is asked first.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::config::{self, Variant};
use crate::runner::procs::{signal, ADMIN_TOKEN};

/// Time between two reloads.
pub const RELOAD_EVERY: Duration = Duration::from_secs(5);
/// Every this many reloads, a broken file.
pub const BROKEN_EVERY: u64 = 6;
/// How long a SIGHUP reload may take to show in `GET /admin/config`.
const SIGHUP_WITHIN: Duration = Duration::from_secs(5);
/// Levee's counter of refused reloads.
const FAILURES: &str = "levee_config_reload_failures_total";

/// How a reload was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    /// `kill -HUP`.
    Sighup,
    /// `POST /admin/reload`.
    Post,
}

/// One reload as done and checked.
#[derive(Debug, Clone, Serialize)]
pub struct Reload {
    /// When it was asked for, seconds from the start of the run.
    pub t_s: f64,
    /// How.
    pub trigger: Trigger,
    /// A file levee must refuse.
    pub broken: bool,
    /// The variant levee should serve afterwards.
    pub limited_per_s: u32,
    /// Whether the spare key should be configured afterwards.
    pub spare_key: bool,
    /// Every check held.
    pub ok: bool,
    /// What was seen (the POST's status, the SHA-256 check, the probe).
    pub detail: String,
}

/// What the reload loop works on.
#[derive(Debug, Clone)]
pub struct Reloader {
    /// The gateway's base URL.
    pub levee: String,
    /// Its PID (for SIGHUP).
    pub pid: u32,
    /// The file it was started with.
    pub path: PathBuf,
    /// The simulator's OpenAI base URL (in the file).
    pub llm_url: String,
}

/// Whether the levee at `levee` has live reload (`GET /admin/config`
/// answers 200), with what it answered.
pub async fn supported(levee: &str) -> (bool, String) {
    let client = reqwest::Client::new();
    match client
        .get(format!("{levee}/admin/config"))
        .bearer_auth(ADMIN_TOKEN)
        .timeout(Duration::from_secs(2))
        .send()
        .await
    {
        Ok(resp) if resp.status().is_success() => (true, "GET /admin/config: 200".to_owned()),
        Ok(resp) => (false, format!("GET /admin/config: {}", resp.status())),
        Err(e) => (false, format!("GET /admin/config: {e}")),
    }
}

/// `--config PATH` of the running process `pid`, from its command line.
pub fn config_path_of(pid: u32) -> anyhow::Result<PathBuf> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
        .with_context(|| format!("reading /proc/{pid}/cmdline"))?;
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    let i = args
        .iter()
        .position(|a| *a == b"--config")
        .context("levee was not started with --config")?;
    let path = args.get(i + 1).context("--config without a path")?;
    Ok(PathBuf::from(String::from_utf8_lossy(path).into_owned()))
}

impl Reloader {
    /// Reloads every [`RELOAD_EVERY`] from `start` until `stop`; returns
    /// each reload with its checks. Ends on the config it started with.
    pub async fn run(&self, start: Instant, stop: Instant) -> anyhow::Result<Vec<Reload>> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()?;
        let mut current = Variant::INITIAL;
        let mut done = Vec::new();
        for n in 1u64.. {
            let at = start + RELOAD_EVERY * u32::try_from(n).unwrap_or(u32::MAX);
            if at + RELOAD_EVERY >= stop {
                break;
            }
            tokio::time::sleep_until(at).await;
            // Out of step with the variant's cycle, so both triggers
            // change both settings and refuse both kinds of broken file.
            let trigger = if (n / 2) % 2 == 0 {
                Trigger::Post
            } else {
                Trigger::Sighup
            };
            let t_s = start.elapsed().as_secs_f64();
            let reload = if n % BROKEN_EVERY == 0 {
                self.broken(&client, trigger, current, n / BROKEN_EVERY)
                    .await?
            } else {
                current = current.next(n);
                self.good(&client, trigger, current).await?
            };
            done.push(Reload { t_s, ..reload });
        }
        Ok(done)
    }

    /// Writes `variant`, triggers, checks the SHA-256 and the spare key.
    async fn good(
        &self,
        client: &reqwest::Client,
        trigger: Trigger,
        variant: Variant,
    ) -> anyhow::Result<Reload> {
        write(&self.path, &config::render(variant, &self.llm_url))?;
        let want = sha256_of(&self.path).await?;
        let mut detail = Vec::new();
        let mut ok = true;
        match trigger {
            Trigger::Post => {
                let (status, body) = self.post_reload(client).await;
                ok &= status == Some(200);
                detail.push(format!("POST {status:?} {body}"));
            }
            Trigger::Sighup => signal(self.pid, "HUP")?,
        }
        let seen = self.wait_for_sha(client, &want, SIGHUP_WITHIN).await;
        ok &= seen.as_deref() == Some(want.as_str());
        detail.push(format!("sha256 {}", short(seen.as_deref())));
        // The running config, as levee shows it, has the new limit.
        let limit = self.loaded(client).await.as_ref().and_then(limited_limit);
        ok &= limit.is_none_or(|l| l == u64::from(variant.limited_per_s));
        detail.push(format!("LIMITED limit shown {limit:?}"));
        let probe = self.spare_probe(client).await;
        let expect = if variant.spare_key { 200 } else { 401 };
        ok &= probe == Some(expect);
        detail.push(format!("spare key {probe:?} (want {expect})"));
        Ok(reload(trigger, false, variant, ok, &detail))
    }

    /// Writes a broken file, triggers, checks it was refused (the
    /// failures counter rose, when levee exports it) and nothing changed,
    /// restores the good file.
    async fn broken(
        &self,
        client: &reqwest::Client,
        trigger: Trigger,
        variant: Variant,
        n: u64,
    ) -> anyhow::Result<Reload> {
        let before = self.loaded_sha(client).await;
        let failures = self.failures(client).await;
        write(&self.path, &config::broken(variant, &self.llm_url, n))?;
        let mut detail = Vec::new();
        let mut ok = true;
        match trigger {
            Trigger::Post => {
                let (status, body) = self.post_reload(client).await;
                ok &= status.is_some_and(|s| (400..500).contains(&s)) && body["error"].is_string();
                detail.push(format!("POST {status:?} {body}"));
            }
            Trigger::Sighup => signal(self.pid, "HUP")?,
        }
        if let Some(failures) = failures {
            let seen = self.wait_for_failures(client, failures + 1).await;
            ok &= seen == Some(failures + 1);
            detail.push(format!("{FAILURES} {failures} -> {seen:?}"));
        } else {
            // Without the counter a SIGHUP's refusal cannot be told from
            // a SIGHUP not yet read: give it time.
            tokio::time::sleep(Duration::from_secs(1)).await;
            detail.push(format!("{FAILURES} not exported"));
        }
        let after = self.loaded_sha(client).await;
        ok &= after.is_some() && after == before;
        detail.push(format!("sha256 kept {}", short(after.as_deref())));
        let probe = self.spare_probe(client).await;
        let expect = if variant.spare_key { 200 } else { 401 };
        ok &= probe == Some(expect);
        detail.push(format!("spare key {probe:?} (want {expect})"));
        write(&self.path, &config::render(variant, &self.llm_url))?;
        Ok(reload(trigger, true, variant, ok, &detail))
    }

    /// `levee_config_reload_failures_total` from `/metrics`; `None` when
    /// it is not exported.
    async fn failures(&self, client: &reqwest::Client) -> Option<u64> {
        let text = client
            .get(format!("{}/metrics", self.levee))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        metric(&text, FAILURES)
    }

    /// Reads the failures counter until it reaches `want` or
    /// [`SIGHUP_WITHIN`] passes; the last value read.
    async fn wait_for_failures(&self, client: &reqwest::Client, want: u64) -> Option<u64> {
        let deadline = Instant::now() + SIGHUP_WITHIN;
        loop {
            let seen = self.failures(client).await;
            if seen >= Some(want) || Instant::now() >= deadline {
                return seen;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `POST /admin/reload`: its status and JSON body.
    async fn post_reload(&self, client: &reqwest::Client) -> (Option<u16>, Value) {
        let sent = client
            .post(format!("{}/admin/reload", self.levee))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await;
        match sent {
            Ok(resp) => {
                let status = resp.status().as_u16();
                (Some(status), resp.json().await.unwrap_or(Value::Null))
            }
            Err(e) => (None, json!(e.to_string())),
        }
    }

    /// `GET /admin/config`.
    async fn loaded(&self, client: &reqwest::Client) -> Option<Value> {
        client
            .get(format!("{}/admin/config", self.levee))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()
    }

    /// The SHA-256 `GET /admin/config` reports.
    async fn loaded_sha(&self, client: &reqwest::Client) -> Option<String> {
        find_sha256(&self.loaded(client).await?)
    }

    /// Reads the reported SHA-256 until it is `want` or `within` passes;
    /// the last one read.
    async fn wait_for_sha(
        &self,
        client: &reqwest::Client,
        want: &str,
        within: Duration,
    ) -> Option<String> {
        let deadline = Instant::now() + within;
        loop {
            let seen = self.loaded_sha(client).await;
            if seen.as_deref() == Some(want) || Instant::now() >= deadline {
                return seen;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The status of `GET /v1/models` with the spare key: 200 while the
    /// key is configured, 401 otherwise. The configured model list is
    /// answered by the gateway itself, so the simulator's faults do not
    /// reach the probe.
    async fn spare_probe(&self, client: &reqwest::Client) -> Option<u16> {
        let resp = client
            .get(format!("{}/v1/models", self.levee))
            .header("x-api-key", config::SPARE.secret)
            .send()
            .await
            .ok()?;
        Some(resp.status().as_u16())
    }
}

fn reload(trigger: Trigger, broken: bool, variant: Variant, ok: bool, detail: &[String]) -> Reload {
    Reload {
        t_s: 0.0,
        trigger,
        broken,
        limited_per_s: variant.limited_per_s,
        spare_key: variant.spare_key,
        ok,
        detail: detail.join("; "),
    }
}

/// Replaces `path` at once (write a sibling, rename it over), so a reload
/// never reads half a file.
fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension("toml.new");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))?;
    Ok(())
}

/// The file's SHA-256, by `sha256sum` (coreutils), lower-case hex.
async fn sha256_of(path: &Path) -> anyhow::Result<String> {
    let out = tokio::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .await
        .context("running sha256sum")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let hex = text.split_whitespace().next().unwrap_or_default();
    anyhow::ensure!(is_sha256(hex), "sha256sum printed {text:?}");
    Ok(hex.to_owned())
}

fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The first string under a key containing `sha256` that is 64 hex
/// digits, anywhere in `body` (the exact shape is levee's to choose).
fn find_sha256(body: &Value) -> Option<String> {
    match body {
        Value::Object(map) => map
            .iter()
            .find_map(|(k, v)| {
                v.as_str()
                    .filter(|s| k.contains("sha256") && is_sha256(s))
                    .map(str::to_ascii_lowercase)
            })
            .or_else(|| map.values().find_map(find_sha256)),
        Value::Array(items) => items.iter().find_map(find_sha256),
        _ => None,
    }
}

/// The value of an unlabelled series `name` of a Prometheus text
/// exposition.
fn metric(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let value = l.strip_prefix(name)?.strip_prefix(' ')?;
        value.trim().parse::<f64>().ok().map(|v| v as u64)
    })
}

/// The limited tier's first limit in the running config `GET
/// /admin/config` shows (`None` when it does not show it there).
fn limited_limit(view: &Value) -> Option<u64> {
    view["config"]["ratelimit"]["tiers"]["LIMITED"]["limits"][0]["limit"].as_u64()
}

fn short(sha: Option<&str>) -> String {
    sha.map_or_else(|| "none".to_owned(), |s| s.chars().take(12).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sha256_is_found_wherever_levee_puts_it() {
        let hex = "ab".repeat(32);
        assert_eq!(
            find_sha256(&json!({"sha256": hex, "loaded_at": "x"})),
            Some(hex.clone())
        );
        assert_eq!(
            find_sha256(&json!({"config": {"file_sha256": hex}})),
            Some(hex.clone())
        );
        assert_eq!(find_sha256(&json!({"sha256": "short"})), None);
        assert_eq!(find_sha256(&json!({"other": hex})), None);
    }

    #[test]
    fn an_unlabelled_counter_is_read_by_its_exact_name() {
        let text = "# TYPE levee_config_reload_failures_total counter\n\
            levee_config_reload_failures_total 3\n\
            levee_config_reload_failures_total_other 9\n";
        assert_eq!(metric(text, FAILURES), Some(3));
        assert_eq!(metric("", FAILURES), None);
    }

    #[test]
    fn the_config_path_is_read_from_a_command_line() {
        // This test process was not started with --config.
        assert!(config_path_of(std::process::id()).is_err());
    }
}
