//! The jobs of a run: after the load, every job a submission got 202 for
//! is read back (`GET /v1/jobs/{id}` with the submitting key, through the
//! live replicas) until all are terminal or a deadline passes, and the
//! gateway's timestamps are put on the load's clock (seconds from its
//! start) so the checks can set them against send times. The surviving
//! replicas' `levee_jobs_total` counters are read last.
//!
//! Kept apart from `execute` because it is the one part of a run that
//! happens after the load, and from `checks` because it touches real
//! processes.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use serde_json::Value;
use tokio::time::Instant;

use super::super::load::{Outcome, Sample, Targets};
use super::ms;

/// Reads of job records in flight at once while polling.
const POLL_CONCURRENCY: usize = 8;
/// Pause between two rounds of reads of the unfinished jobs.
const POLL_ROUND: Duration = Duration::from_millis(500);

/// What to read back after the load.
#[derive(Debug, Clone)]
pub struct JobsDrain {
    /// The tenant label of the stream that submitted the jobs.
    pub tenant: &'static str,
    /// Its API key (only the submitting tenant can read a job).
    pub api_key: &'static str,
    /// Stop polling at this time from the start of the load (jobs still
    /// unfinished then are reported so).
    pub deadline: Duration,
}

/// One accepted job, as last read.
#[derive(Debug, Clone, Default)]
pub struct JobRecord {
    /// Its id (from the 202).
    pub id: String,
    /// When its submission was sent, from the start of the load.
    pub sent: Duration,
    /// The replica that accepted it.
    pub replica: usize,
    /// `status` of the last successful read; `None` if never read.
    pub status: Option<String>,
    /// Why the last read failed (`404`, `timeout`...), if it did.
    pub read_error: Option<String>,
    /// Deliveries so far (a job taken over from a dead replica has 2 when
    /// it was running there, 1 when it was only held).
    pub attempts: u64,
    /// `started_at` (its last start) on the load's clock.
    pub started: Option<Duration>,
    /// `finished_at` on the load's clock.
    pub finished: Option<Duration>,
}

/// The jobs of a run.
#[derive(Debug, Clone, Default)]
pub struct JobsObserved {
    /// Every accepted job.
    pub jobs: Vec<JobRecord>,
    /// The tenant's `levee_jobs_total` by outcome, summed over the
    /// replicas alive at the end (the killed one's counts died with it).
    pub counters: BTreeMap<String, u64>,
    /// When polling gave up or ended, from the start of the load.
    pub polled_until: Duration,
}

impl JobRecord {
    /// Whether it reached a final state.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self.status.as_deref(),
            Some("succeeded" | "failed" | "dead")
        )
    }
}

/// Milliseconds since the Unix epoch now: the gateway stamps jobs with
/// the same wall clock.
pub(super) fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Reads every job `drain.tenant`'s submissions got 202 for until all are
/// terminal or `drain.deadline`; `epoch_ms` is the load's start in Unix
/// milliseconds, `start` the same moment on tokio's clock.
pub(super) async fn poll_jobs(
    drain: &JobsDrain,
    samples: &[Sample],
    targets: &Targets,
    start: Instant,
    epoch_ms: u64,
) -> JobsObserved {
    let mut jobs: Vec<JobRecord> = samples
        .iter()
        .filter(|s| s.tenant.as_deref() == Some(drain.tenant))
        .filter(|s| s.outcome == Outcome::Status(202))
        .filter_map(|s| {
            Some(JobRecord {
                id: s.job_id.clone()?,
                sent: s.sent,
                replica: s.replica,
                ..JobRecord::default()
            })
        })
        .collect();
    let client = reqwest::Client::builder()
        .timeout(ms(2000))
        .build()
        .unwrap_or_default();
    let deadline = start + drain.deadline;
    let mut round = 0u64;
    loop {
        let pending: Vec<usize> = (0..jobs.len())
            .filter(|&i| !jobs[i].is_terminal())
            .collect();
        if pending.is_empty() {
            break;
        }
        let reads = futures::stream::iter(pending.into_iter().enumerate())
            .map(|(n, i)| {
                let url = targets.pick(round + n as u64).map(|(_, url)| url);
                let (client, id) = (&client, jobs[i].id.clone());
                async move { (i, read(client, url, &id, drain.api_key).await) }
            })
            .buffer_unordered(POLL_CONCURRENCY)
            .collect::<Vec<_>>()
            .await;
        for (i, read) in reads {
            apply(&mut jobs[i], read, epoch_ms);
        }
        round += 1;
        if Instant::now() + POLL_ROUND >= deadline {
            break;
        }
        tokio::time::sleep(POLL_ROUND).await;
    }
    let polled_until = start.elapsed();
    let counters = counters(&client, targets, drain.tenant).await;
    JobsObserved {
        jobs,
        counters,
        polled_until,
    }
}

/// `GET {url}/v1/jobs/{id}`: the record, or why it could not be read.
async fn read(
    client: &reqwest::Client,
    url: Option<String>,
    id: &str,
    key: &str,
) -> Result<Value, String> {
    let url = url.ok_or("no live replica")?;
    let resp = client
        .get(format!("{url}/v1/jobs/{id}"))
        .header("x-api-key", key)
        .send()
        .await
        .map_err(|e| {
            if e.is_timeout() {
                "timeout"
            } else {
                "transport error"
            }
            .to_owned()
        })?;
    let status = resp.status().as_u16();
    if status != 200 {
        return Err(status.to_string());
    }
    resp.json().await.map_err(|_| "unreadable body".to_owned())
}

/// Puts one read into `job`.
fn apply(job: &mut JobRecord, read: Result<Value, String>, epoch_ms: u64) {
    let view = match read {
        Ok(view) => view,
        Err(e) => {
            job.read_error = Some(e);
            return;
        }
    };
    let at = |field: &str| {
        let t = parse_rfc3339_ms(view[field].as_str()?)?;
        Some(Duration::from_millis(t.saturating_sub(epoch_ms)))
    };
    job.read_error = None;
    job.status = view["status"].as_str().map(str::to_owned);
    job.attempts = view["attempts"].as_u64().unwrap_or(0);
    job.started = at("started_at");
    job.finished = at("finished_at");
}

/// The tenant's `levee_jobs_total` by outcome, summed over the live
/// replicas' `/metrics`.
async fn counters(
    client: &reqwest::Client,
    targets: &Targets,
    tenant: &str,
) -> BTreeMap<String, u64> {
    let mut sum = BTreeMap::new();
    for url in targets.live() {
        let Ok(resp) = client.get(format!("{url}/metrics")).send().await else {
            continue;
        };
        let Ok(text) = resp.text().await else {
            continue;
        };
        for (outcome, n) in jobs_total(&text, tenant) {
            *sum.entry(outcome).or_default() += n;
        }
    }
    sum
}

/// `levee_jobs_total{...,outcome="X",tenant="T"} N` lines of a Prometheus
/// text exposition for `tenant`, as `(X, N)`.
fn jobs_total(text: &str, tenant: &str) -> Vec<(String, u64)> {
    let tenant_label = format!("tenant=\"{tenant}\"");
    series(text, "levee_jobs_total")
        .filter(|(labels, _)| labels.contains(&tenant_label.as_str()))
        .filter_map(|(labels, n)| {
            let outcome = labels
                .iter()
                .find_map(|l| l.strip_prefix("outcome=\""))?
                .trim_end_matches('"');
            Some((outcome.to_owned(), n as u64))
        })
        .collect()
}

/// The sum of the `name` series of a Prometheus text exposition that
/// carry every one of `labels` (each `key="value"`).
pub(super) fn counter_sum(text: &str, name: &str, labels: &[String]) -> f64 {
    series(text, name)
        .filter(|(have, _)| labels.iter().all(|l| have.contains(&l.as_str())))
        .map(|(_, n)| n)
        .sum()
}

/// The labelled series of `name`: their `key="value"` labels and value.
fn series<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = (Vec<&'a str>, f64)> + 'a {
    text.lines().filter_map(move |line| {
        let rest = line.strip_prefix(name)?.strip_prefix('{')?;
        let (labels, value) = rest.split_once('}')?;
        Some((labels.split(',').collect(), value.trim().parse().ok()?))
    })
}

/// Unix milliseconds of an RFC 3339 UTC time as levee writes it
/// (`2025-01-31T12:34:56.789Z`; the fraction optional).
fn parse_rfc3339_ms(s: &str) -> Option<u64> {
    let s = s.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.splitn(3, '-').map(str::parse::<i64>);
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.splitn(3, ':').map(str::parse::<i64>);
    let (h, min, sec) = (t.next()?.ok()?, t.next()?.ok()?, t.next()?.ok()?);
    let millis = match frac.len() {
        0 => 0,
        n => frac.get(..3.min(n))?.parse::<i64>().ok()? * 10_i64.pow(3 - 3.min(n) as u32),
    };
    let days = days_from_civil(y, m, day);
    let total = ((days * 24 + h) * 60 + min) * 60 + sec;
    u64::try_from(total * 1000 + millis).ok()
}

/// Days from 1970-01-01 to `y-m-d` (proleptic Gregorian; Howard
/// Hinnant's `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_times_as_levee_writes_them_parse_to_unix_milliseconds() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00.000Z"), Some(0));
        // `date -u -d 2025-01-31T12:34:56Z +%s` = 1738326896.
        assert_eq!(
            parse_rfc3339_ms("2025-01-31T12:34:56.789Z"),
            Some(1_738_326_896_789)
        );
        assert_eq!(
            parse_rfc3339_ms("2024-02-29T00:00:01Z"),
            Some(1_709_164_801_000)
        );
        assert_eq!(parse_rfc3339_ms("2024-02-29 00:00:01"), None);
    }

    #[test]
    fn jobs_total_reads_one_tenants_outcomes() {
        let text = "# TYPE levee_jobs_total counter\n\
            levee_jobs_total{outcome=\"reclaimed\",tenant=\"noisy\"} 2\n\
            levee_jobs_total{outcome=\"succeeded\",tenant=\"noisy\"} 40\n\
            levee_jobs_total{outcome=\"succeeded\",tenant=\"quiet\"} 7\n\
            levee_jobs_queue_depth{tenant=\"noisy\"} 3\n";
        assert_eq!(
            jobs_total(text, "noisy"),
            [("reclaimed".to_owned(), 2), ("succeeded".to_owned(), 40)]
        );
        let noisy = [r#"tenant="noisy""#.to_owned()];
        assert_eq!(counter_sum(text, "levee_jobs_total", &noisy), 42.0);
        assert_eq!(counter_sum(text, "levee_jobs", &noisy), 0.0);
    }
}
