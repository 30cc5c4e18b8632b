//! The real processes of a chaos run: `redis-server`, `levee-upstream-sim`
//! and `levee` replicas, each on a free loopback port, each killed by its
//! own PID (never by name) when dropped.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::sim::LlmCapacity;

/// How long a process may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// A free loopback port (bind to 0, read it, release it).
pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Sends `sig` (e.g. `STOP`, `CONT`, `KILL`) to one of our own children.
pub fn signal(pid: u32, sig: &str) -> anyhow::Result<()> {
    let ok = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .context("running kill")?
        .success();
    if !ok {
        bail!("kill -{sig} {pid} failed");
    }
    Ok(())
}

/// A child process that is SIGKILLed and reaped when dropped.
#[derive(Debug)]
struct Owned(Option<Child>);

impl Owned {
    fn pid(&self) -> Option<u32> {
        self.0.as_ref().map(Child::id)
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.0.take() {
            // A stopped process still dies of SIGKILL.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn exited(&mut self) -> bool {
        self.0
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_some())
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A `redis-server` without persistence.
#[derive(Debug)]
pub struct RedisProc {
    child: Owned,
    /// Its port, kept across restarts.
    pub port: u16,
}

impl RedisProc {
    /// Starts redis-server on a free port and waits for `PONG`.
    pub async fn start() -> anyhow::Result<Self> {
        let mut redis = Self {
            child: Owned(None),
            port: free_port()?,
        };
        redis.restart().await?;
        Ok(redis)
    }

    /// `redis://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Its PID while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.pid()
    }

    /// SIGKILLs it (ours, by PID) and reaps it.
    pub fn kill(&mut self) {
        self.child.kill();
    }

    /// Starts a fresh, empty server on the same port (after [`kill`](Self::kill)).
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.child.kill();
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting redis-server (is it installed?)")?;
        self.child = Owned(Some(child));
        let deadline = Instant::now() + READY_TIMEOUT;
        while Instant::now() < deadline {
            if ping(self.addr()).await {
                return Ok(());
            }
            if self.child.exited() {
                bail!("redis-server on port {} exited at start", self.port);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        bail!("redis-server on port {} did not answer PING", self.port)
    }
}

/// Whether a Redis at `addr` answers `PING` within 500 ms.
async fn ping(addr: SocketAddr) -> bool {
    let attempt = async {
        let mut conn = TcpStream::connect(addr).await.ok()?;
        conn.write_all(b"PING\r\n").await.ok()?;
        let mut buf = [0u8; 7];
        conn.read_exact(&mut buf).await.ok()?;
        Some(&buf == b"+PONG\r\n")
    };
    matches!(
        tokio::time::timeout(Duration::from_millis(500), attempt).await,
        Ok(Some(true))
    )
}

/// The upstream simulator binary, serving as LLM and vector store.
#[derive(Debug)]
pub struct SimProc {
    child: Owned,
    binary: PathBuf,
    llm: LlmCapacity,
    /// Its port, kept across restarts.
    pub port: u16,
}

impl SimProc {
    /// Starts `binary --listen 127.0.0.1:PORT` on a free port, its LLM
    /// limited to `llm` (kept across restarts).
    pub async fn start(binary: &Path, llm: LlmCapacity) -> anyhow::Result<Self> {
        let mut sim = Self {
            child: Owned(None),
            binary: binary.to_owned(),
            llm,
            port: free_port()?,
        };
        sim.restart().await?;
        Ok(sim)
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Its PID while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.pid()
    }

    /// SIGKILLs it and reaps it.
    pub fn kill(&mut self) {
        self.child.kill();
    }

    /// Starts it again on the same port and waits for its address line.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.child.kill();
        let mut command = Command::new(&self.binary);
        command
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--capacity")
            .arg(self.llm.capacity.to_string())
            .arg("--per-token-ms")
            .arg(self.llm.per_token_ms.to_string());
        if let Some(ms) = self.llm.service_ms {
            command.arg("--service-ms").arg(ms.to_string());
        }
        let mut child = command
            .env("RUST_LOG", "error")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", self.binary.display()))?;
        let stdout = child.stdout.take().context("sim stdout")?;
        self.child = Owned(Some(child));
        let stdout = tokio::process::ChildStdout::from_std(stdout)?;
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(READY_TIMEOUT, lines.next_line())
            .await
            .context("sim did not announce its address")??
            .context("sim exited before listening")?;
        if !line.starts_with(crate::sim::LISTENING_PREFIX) {
            bail!("unexpected sim output: {line}");
        }
        Ok(())
    }
}

/// One levee replica.
#[derive(Debug)]
pub struct LeveeProc {
    child: Owned,
    /// Its port.
    pub port: u16,
    config_path: PathBuf,
}

/// What a levee replica connects to.
#[derive(Debug, Clone)]
pub struct LeveeEnv {
    /// `LEVEE_REDIS_URL`.
    pub redis_url: String,
    /// `LEVEE_LLM_URL` (an OpenAI base URL ending in `/v1`).
    pub llm_url: String,
    /// `LEVEE_VECTOR_STORE_URL`.
    pub vector_store_url: String,
}

/// The admin token chaos runs give levee, to read `/admin/breakers`.
pub const ADMIN_TOKEN: &str = "levee-chaos-admin";

impl LeveeProc {
    /// Starts `binary serve --config <tmp file>` and waits for `/health`.
    pub async fn start(binary: &Path, config: &str, env: &LeveeEnv) -> anyhow::Result<Self> {
        let port = free_port()?;
        let config_path =
            std::env::temp_dir().join(format!("levee-chaos-{}-{port}.toml", std::process::id()));
        std::fs::write(&config_path, config).context("writing levee config")?;
        let child = Command::new(binary)
            .arg("serve")
            .arg("--config")
            .arg(&config_path)
            .env_remove("LEVEE_CONFIG")
            .env("LEVEE_LISTEN", format!("127.0.0.1:{port}"))
            .env("LEVEE_REDIS_URL", &env.redis_url)
            .env("LEVEE_LLM_URL", &env.llm_url)
            .env("LEVEE_VECTOR_STORE_URL", &env.vector_store_url)
            .env("LEVEE_ADMIN_TOKEN", ADMIN_TOKEN)
            .env("LEVEE_LOG", "error")
            .stdout(Stdio::null())
            // Errors only: a config levee refuses is explained here.
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let mut levee = Self {
            child: Owned(Some(child)),
            port,
            config_path,
        };
        levee.wait_healthy().await?;
        Ok(levee)
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Its PID while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.pid()
    }

    /// SIGKILLs it and reaps it.
    pub fn kill(&mut self) {
        self.child.kill();
    }

    async fn wait_healthy(&mut self) -> anyhow::Result<()> {
        let client = reqwest::Client::new();
        let deadline = Instant::now() + READY_TIMEOUT;
        while Instant::now() < deadline {
            if self.child.exited() {
                bail!("levee exited at start (check its config)");
            }
            let health = client.get(format!("{}/health", self.url())).send().await;
            if health.is_ok_and(|r| r.status().is_success()) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        bail!("levee on port {} did not become healthy", self.port)
    }
}

impl Drop for LeveeProc {
    fn drop(&mut self) {
        self.child.kill();
        let _ = std::fs::remove_file(&self.config_path);
    }
}
