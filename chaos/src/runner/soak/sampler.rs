//! Once a second: the gateway's resident memory (`VmRSS` of
//! `/proc/<pid>/status`) and open file descriptors (entries of
//! `/proc/<pid>/fd`), Redis's `used_memory` (`INFO memory`) and keys
//! (`DBSIZE`), the
//! simulator's RSS and FDs (to tell which process grows), the breakers
//! not closed (`GET /admin/breakers`, to tell why a request failed), and
//! the requests recorded so far.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;

use super::traffic::Records;
use crate::runner::procs::ADMIN_TOKEN;

/// How often the processes are sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// One sample; a reading that failed is `None`.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Seconds from the start of the run.
    pub t_s: f64,
    /// The gateway's resident set, KiB.
    pub levee_rss_kib: Option<u64>,
    /// The gateway's open file descriptors.
    pub levee_fds: Option<u64>,
    /// Redis `used_memory`, bytes.
    pub redis_used_memory: Option<u64>,
    /// Redis `DBSIZE`.
    pub redis_keys: Option<u64>,
    /// The simulator's resident set, KiB.
    pub sim_rss_kib: Option<u64>,
    /// The simulator's open file descriptors.
    pub sim_fds: Option<u64>,
    /// Requests recorded (ended) so far.
    pub requests: u64,
    /// Breakers not closed, as `dependency:state`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub breakers_not_closed: Vec<String>,
}

/// What to sample.
#[derive(Debug, Clone)]
pub struct Targets {
    /// The gateway's PID.
    pub levee_pid: u32,
    /// The simulator's PID.
    pub sim_pid: u32,
    /// Redis.
    pub redis: SocketAddr,
    /// The gateway's base URL.
    pub levee: String,
}

/// Samples every [`SAMPLE_EVERY`] from `start` until `stop` says so.
pub async fn run(
    targets: Targets,
    records: Records,
    start: Instant,
    mut stop: watch::Receiver<bool>,
) -> Vec<Sample> {
    let mut samples = Vec::new();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap_or_default();
    let mut tick = tokio::time::interval_at(start, SAMPLE_EVERY);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return samples,
        }
        samples.push(Sample {
            t_s: start.elapsed().as_secs_f64(),
            levee_rss_kib: rss_kib(targets.levee_pid),
            levee_fds: fds(targets.levee_pid),
            redis_used_memory: used_memory(targets.redis).await,
            redis_keys: dbsize(targets.redis).await,
            sim_rss_kib: rss_kib(targets.sim_pid),
            sim_fds: fds(targets.sim_pid),
            requests: records.len() as u64,
            breakers_not_closed: breakers_not_closed(&client, &targets.levee).await,
        });
    }
}

/// The gateway's breakers that are not closed, `dependency:state`.
async fn breakers_not_closed(client: &reqwest::Client, levee: &str) -> Vec<String> {
    let read = async {
        let v: serde_json::Value = client
            .get(format!("{levee}/admin/breakers"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        Some(
            v["breakers"]
                .as_array()?
                .iter()
                .filter(|b| b["state"] != "closed")
                .map(|b| {
                    format!(
                        "{}:{}",
                        b["dependency"].as_str().unwrap_or("?"),
                        b["state"].as_str().unwrap_or("?")
                    )
                })
                .collect(),
        )
    };
    read.await.unwrap_or_default()
}

/// `VmRSS` of `/proc/<pid>/status`, KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// Entries of `/proc/<pid>/fd`.
pub fn fds(pid: u32) -> Option<u64> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64)
}

/// Redis's `used_memory` from `INFO memory`.
pub async fn used_memory(addr: SocketAddr) -> Option<u64> {
    info_field(&command(addr, b"INFO memory\r\n").await?, "used_memory")
}

/// Redis's `DBSIZE` (an integer reply, `:N`).
pub async fn dbsize(addr: SocketAddr) -> Option<u64> {
    command(addr, b"DBSIZE\r\n")
        .await?
        .trim()
        .strip_prefix(':')?
        .parse()
        .ok()
}

/// One inline command on a fresh connection, its whole reply (an integer
/// or a bulk string) within 1 s.
async fn command(addr: SocketAddr, line: &[u8]) -> Option<String> {
    let exchange = async {
        let mut conn = TcpStream::connect(addr).await.ok()?;
        conn.write_all(line).await.ok()?;
        let mut reply = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = conn.read(&mut buf).await.ok()?;
            if n == 0 {
                break;
            }
            reply.extend_from_slice(&buf[..n]);
            if reply_complete(&reply) {
                break;
            }
        }
        Some(String::from_utf8_lossy(&reply).into_owned())
    };
    tokio::time::timeout(Duration::from_secs(1), exchange)
        .await
        .ok()?
}

/// Whether `reply` holds a whole RESP reply: one line (`:N`, `+OK`,
/// `-ERR`), or a bulk string (`$LEN`, then LEN bytes and CRLF).
fn reply_complete(reply: &[u8]) -> bool {
    let Some(end) = reply.windows(2).position(|w| w == b"\r\n") else {
        return false;
    };
    if reply.first() != Some(&b'$') {
        return true;
    }
    let len: usize = std::str::from_utf8(&reply[1..end])
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    reply.len() >= end + 2 + len + 2
}

/// The value of `field:` in an `INFO` reply.
fn info_field(text: &str, field: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_fields_are_read_by_exact_name() {
        let text = "$60\r\n# Memory\r\nused_memory:1024\r\nused_memory_rss:4096\r\n";
        assert_eq!(info_field(text, "used_memory"), Some(1024));
        assert_eq!(info_field(text, "used_memory_rss"), Some(4096));
        assert_eq!(info_field(text, "used_memory_peak"), None);
    }

    #[test]
    fn a_bulk_reply_is_complete_only_with_all_its_bytes() {
        assert!(!reply_complete(b"$5\r\nab"));
        assert!(reply_complete(b"$5\r\nabcde\r\n"));
        assert!(reply_complete(b":42\r\n"));
        assert!(!reply_complete(b":42"));
    }

    #[test]
    fn this_process_has_a_resident_set_and_descriptors() {
        let pid = std::process::id();
        assert!(rss_kib(pid).is_some_and(|kib| kib > 0));
        assert!(fds(pid).is_some_and(|n| n >= 3));
    }
}
