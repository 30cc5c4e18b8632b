//! A real Prometheus server (the Debian `prometheus` package) on a free
//! loopback port with its own config and TSDB directory, killed by PID when
//! dropped; and `promtool`. Neither is optional: a missing binary fails the
//! test with the command that installs it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use super::redis::free_port;

const INSTALL_HINT: &str = "is not installed: run ./scripts/test.sh, which installs the Debian \
package `prometheus` (prometheus + promtool), or `apt-get install -y prometheus`";

/// A prometheus process this test started.
pub struct Prometheus {
    child: Child,
    /// Its web port.
    pub port: u16,
    dir: PathBuf,
}

/// A fresh directory under the system temp dir, unique to this process.
fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "levee-{tag}-{}-{}",
        std::process::id(),
        free_port()
    ));
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

/// Runs `promtool ARGS…`; returns (success, stdout + stderr). Panics with
/// the install hint when promtool is missing.
pub fn promtool(args: &[&str], stdin: Option<&str>) -> (bool, String) {
    let mut cmd = Command::new("promtool");
    cmd.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("promtool {INSTALL_HINT} ({e})"));
    if let Some(input) = stdin {
        use std::io::Write as _;
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes())
            .expect("write promtool stdin");
    }
    let out = child.wait_with_output().expect("promtool output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

impl Prometheus {
    /// Starts prometheus scraping `targets` (`host:port`) every second at
    /// `/metrics`, and waits until it is ready.
    pub async fn start(targets: &[String]) -> Self {
        let port = free_port();
        let dir = temp_dir("prometheus");
        let quoted: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: levee\n    metrics_path: /metrics\n    \
             static_configs:\n      - targets: [{}]\n",
            quoted.join(", ")
        );
        let config_path = dir.join("prometheus.yml");
        std::fs::write(&config_path, config).expect("write prometheus.yml");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("prometheus {INSTALL_HINT} ({e})"));
        let mut prom = Self { child, port, dir };
        prom.wait_ready().await;
        prom
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The config file it runs with.
    pub fn config_path(&self) -> PathBuf {
        self.dir.join("prometheus.yml")
    }

    async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let client = reqwest::Client::new();
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().ok().flatten() {
                panic!("prometheus exited before becoming ready: {status}");
            }
            if let Ok(r) = client.get(format!("{}/-/ready", self.url())).send().await {
                if r.status().is_success() {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("prometheus on port {} did not become ready", self.port);
    }

    /// Runs an instant query; returns the whole JSON answer (`status`,
    /// `data` or `error`). A PromQL error is an answer, not a panic.
    pub async fn query(&self, expr: &str) -> Value {
        reqwest::Client::new()
            .get(format!("{}/api/v1/query", self.url()))
            .query(&[("query", expr)])
            .send()
            .await
            .expect("query prometheus")
            .json()
            .await
            .expect("prometheus json")
    }

    /// Waits until the scrape target is up and has been scraped at least
    /// `scrapes` times, so rates over the series are defined.
    pub async fn wait_scraped(&self, scrapes: u32, limit: Duration) {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            let v = self.query("count_over_time(up{job=\"levee\"}[1m])").await;
            let n = v["data"]["result"][0]["value"][1]
                .as_str()
                .and_then(|s| s.parse::<f64>().ok())
                .unwrap_or(0.0);
            let up = self.query("up{job=\"levee\"}").await;
            let is_up = up["data"]["result"][0]["value"][1].as_str() == Some("1");
            if is_up && n >= f64::from(scrapes) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("prometheus did not scrape levee {scrapes} times in {limit:?}");
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `promtool check config FILE` must pass.
pub fn check_config(path: &Path) {
    let (ok, out) = promtool(&["check", "config", &path.display().to_string()], None);
    assert!(
        ok,
        "promtool check config {} failed:\n{out}",
        path.display()
    );
}
