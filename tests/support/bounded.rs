//! A child process run to its end, or killed (by its own handle) past a
//! time bound, with its output collected: how the tests run the Python
//! clients written by others (the openai SDK, schemathesis).

use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;
use tokio::time::Instant;

/// What a bounded run left.
pub struct Finished {
    /// Its exit status; `None` when it was killed at the bound.
    pub status: Option<ExitStatus>,
    /// Everything it wrote to stdout.
    pub stdout: String,
    /// Everything it wrote to stderr.
    pub stderr: String,
    /// How long it ran.
    pub took: Duration,
}

/// Runs `cmd` (stdin closed, stdout and stderr collected) until it exits
/// or `limit` passes.
pub async fn run(cmd: &mut Command, limit: Duration) -> Finished {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let stdout = tokio::spawn(read_all(child.stdout.take().expect("stdout")));
    let stderr = tokio::spawn(read_all(child.stderr.take().expect("stderr")));
    let started = Instant::now();
    let status = match tokio::time::timeout(limit, child.wait()).await {
        Ok(status) => Some(status.expect("wait for the child")),
        Err(_) => {
            // Ours, by its handle.
            let _ = child.kill().await;
            None
        }
    };
    Finished {
        status,
        took: started.elapsed(),
        stdout: stdout.await.unwrap_or_default(),
        stderr: stderr.await.unwrap_or_default(),
    }
}

async fn read_all(mut pipe: impl AsyncRead + Unpin) -> String {
    let mut buf = Vec::new();
    let _ = pipe.read_to_end(&mut buf).await;
    String::from_utf8_lossy(&buf).into_owned()
}
