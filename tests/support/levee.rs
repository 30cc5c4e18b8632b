//! The `levee` binary as a child process on a free port.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use super::redis::free_port;

/// A levee process this test started.
pub struct Levee {
    child: Option<Child>,
    /// Its listen port.
    pub port: u16,
    /// The config file it was started with, if any (rewrite it, then
    /// SIGHUP, to test a live reload).
    pub config_path: Option<std::path::PathBuf>,
}

/// Builder for a levee process.
#[derive(Default)]
pub struct LeveeBuilder {
    env: Vec<(String, String)>,
    config: Option<String>,
}

impl LeveeBuilder {
    /// Sets an environment variable.
    pub fn env(mut self, key: &str, value: impl Into<String>) -> Self {
        self.env.push((key.to_owned(), value.into()));
        self
    }

    /// Uses this TOML text as the config file.
    pub fn config_text(mut self, toml: &str) -> Self {
        self.config = Some(toml.to_owned());
        self
    }

    /// Starts the process and waits until `/health` answers.
    pub async fn start(self) -> Levee {
        let port = free_port();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_levee"));
        cmd.arg("serve")
            .env_remove("LEVEE_CONFIG")
            .env_remove("LEVEE_REDIS_URL")
            .env_remove("LEVEE_LLM_URL")
            .env_remove("LEVEE_VECTOR_STORE_URL")
            .env("LEVEE_LISTEN", format!("127.0.0.1:{port}"))
            .env("LEVEE_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        let mut config_path = None;
        if let Some(text) = &self.config {
            let path = std::env::temp_dir().join(format!("levee-test-{port}.toml"));
            std::fs::write(&path, text).expect("write test config");
            cmd.arg("--config").arg(&path);
            config_path = Some(path);
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn levee");
        let mut levee = Levee {
            child: Some(child),
            port,
            config_path,
        };
        levee.wait_healthy().await;
        levee
    }
}

impl Levee {
    /// A builder.
    pub fn builder() -> LeveeBuilder {
        LeveeBuilder::default()
    }

    /// Starts levee on embedded defaults.
    pub async fn start() -> Self {
        Self::builder().start().await
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    async fn wait_healthy(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let client = reqwest::Client::new();
        while Instant::now() < deadline {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("levee exited before becoming healthy: {status}");
            }
            if let Ok(r) = client.get(format!("{}/health", self.url())).send().await {
                if r.status().is_success() {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("levee on port {} did not become healthy", self.port);
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        signal(self.pid(), "TERM");
    }

    /// Waits for the process to exit, up to `limit`; returns its exit status.
    pub async fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(status) = self.child.as_mut()?.try_wait().expect("try_wait") {
                self.child = None;
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }
}

/// Sends a signal to one of our own processes, by PID.
pub fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill")
        .success();
    assert!(ok, "kill -{sig} {pid} failed");
}

impl Drop for Levee {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs `levee check-config FILE` and returns (exit success, stderr).
pub fn check_config(path: &Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_levee"))
        .arg("check-config")
        .arg(path)
        .env_remove("LEVEE_CONFIG")
        .output()
        .expect("run levee check-config");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
