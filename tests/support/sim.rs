//! The upstream simulator (`levee-upstream-sim`, from `chaos/`) as a child
//! process on a free loopback port, for the tests that drive Levee with
//! real clients.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A `levee-upstream-sim` process this test started (killed when dropped).
pub struct Sim {
    child: Child,
    /// Its base URL, `http://127.0.0.1:PORT`.
    pub url: String,
}

impl Sim {
    /// Starts one on a free port and waits for its listening line.
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// The same, with extra command-line arguments.
    pub async fn start_with(args: &[&str]) -> Self {
        let mut child = Command::new(sim_binary())
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn levee-upstream-sim");
        let stdout = child.stdout.take().expect("sim stdout");
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await
            .expect("levee-upstream-sim did not announce its address within 10 s")
            .expect("read sim stdout")
            .expect("levee-upstream-sim exited before listening");
        let addr = line
            .strip_prefix(levee_chaos::sim::LISTENING_PREFIX)
            .unwrap_or_else(|| panic!("unexpected sim output {line:?}"))
            .trim()
            .to_owned();
        // Keep its stdout drained for as long as it runs.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Self {
            child,
            url: format!("http://{addr}"),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("sim running")
    }

    /// Its OpenAI base URL.
    pub fn v1(&self) -> String {
        format!("{}/v1", self.url)
    }
}

/// `target/debug/levee-upstream-sim`, next to the levee binary; built
/// once if missing (it is another package's binary, so `cargo test` of
/// this crate alone does not build it).
fn sim_binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let dir = Path::new(env!("CARGO_BIN_EXE_levee"))
            .parent()
            .expect("binary directory");
        let bin = dir.join("levee-upstream-sim");
        if !bin.exists() {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
            let status = std::process::Command::new(cargo)
                .args(["build", "-p", "levee-chaos", "--bin", "levee-upstream-sim"])
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .status()
                .expect("run cargo build -p levee-chaos");
            assert!(status.success(), "building levee-upstream-sim failed");
        }
        assert!(bin.exists(), "{} missing after the build", bin.display());
        bin
    })
}
