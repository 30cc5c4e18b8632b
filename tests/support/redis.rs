//! A real redis-server on a free loopback port, started for one test and
//! killed (by PID, only ours) when dropped.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

/// A redis-server process this test started.
pub struct RedisServer {
    child: Child,
    /// Its port.
    pub port: u16,
    /// With `appendonly yes` / `appendfsync always`: its data directory.
    durable: Option<std::path::PathBuf>,
}

/// A free loopback port (bind to 0, read, release).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind 127.0.0.1:0")
        .local_addr()
        .expect("local addr")
        .port()
}

impl RedisServer {
    /// Starts redis-server with no persistence and waits until it answers.
    pub async fn start() -> Self {
        Self::start_on(free_port()).await
    }

    /// Starts redis-server on `port` (used to restart on the same port).
    pub async fn start_on(port: u16) -> Self {
        Self::spawn(port, None).await
    }

    /// Starts redis-server with `appendonly yes` and `appendfsync always`
    /// in `dir`: every acknowledged write is on disk, and a restart on the
    /// same port (after `kill`) reads it back.
    #[allow(dead_code)]
    pub async fn start_durable(dir: std::path::PathBuf) -> Self {
        Self::spawn(free_port(), Some(dir)).await
    }

    async fn spawn(port: u16, durable: Option<std::path::PathBuf>) -> Self {
        let port_s = port.to_string();
        let mut args = vec!["--port", &port_s, "--bind", "127.0.0.1", "--save", ""];
        let dir_s;
        match &durable {
            Some(dir) => {
                std::fs::create_dir_all(dir).expect("redis data dir");
                dir_s = dir.to_string_lossy().into_owned();
                args.extend([
                    "--appendonly",
                    "yes",
                    "--appendfsync",
                    "always",
                    "--dir",
                    &dir_s,
                ]);
            }
            None => args.extend(["--appendonly", "no"]),
        }
        args.extend(["--protected-mode", "no"]);
        let child = Command::new("redis-server")
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (the README's test command installs it)");
        let server = Self {
            child,
            port,
            durable,
        };
        server.wait_ready().await;
        server
    }

    /// `redis://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(mut conn) = redis::Client::open(self.url()).and_then(|c| c.get_connection()) {
                if redis::cmd("PING").query::<String>(&mut conn).is_ok() {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("redis-server on port {} did not start", self.port);
    }

    /// A blocking connection for assertions.
    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection())
            .expect("connect to test redis")
    }

    /// SIGKILLs the server (ours, by PID) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts a fresh server on the same port (after `kill`).
    pub async fn restart(&mut self) {
        let fresh = Self::spawn(self.port, self.durable.clone()).await;
        // The old child is already reaped; dropping it is a no-op kill.
        let old = std::mem::replace(self, fresh);
        drop(old);
    }

    /// Every key currently stored.
    pub fn keys(&self) -> Vec<String> {
        redis::cmd("KEYS")
            .arg("*")
            .query(&mut self.conn())
            .expect("KEYS")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
