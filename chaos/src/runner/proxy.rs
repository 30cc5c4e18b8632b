//! A TCP fault proxy between levee and one of its dependencies. Levee is
//! pointed at the proxy's port; the mode changes at run time:
//! pass-through, added latency, blackhole (accept, never forward, never
//! answer) or reset (RST on new and existing connections).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// What the proxy does to traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyMode {
    /// Forward bytes as they come.
    Pass,
    /// Forward every chunk, in both directions, this much later.
    Latency(Duration),
    /// Accept connections but forward and answer nothing.
    Blackhole,
    /// Reset every connection, new and existing (`SO_LINGER` 0, then close).
    Reset,
}

/// A running proxy; stops accepting when dropped.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    mode: Arc<watch::Sender<ProxyMode>>,
    accept: JoinHandle<()>,
}

impl FaultProxy {
    /// Listens on a free loopback port, forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let mode = Arc::new(watch::Sender::new(ProxyMode::Pass));
        let accept = tokio::spawn(accept_loop(listener, upstream, mode.clone()));
        Ok(Self { addr, mode, accept })
    }

    /// The address levee should use instead of the upstream's.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Switches mode; existing connections follow at once.
    pub fn set_mode(&self, mode: ProxyMode) {
        self.mode.send_replace(mode);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        // Ends every connection task.
        self.mode.send_replace(ProxyMode::Reset);
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    mode: Arc<watch::Sender<ProxyMode>>,
) {
    while let Ok((client, _)) = listener.accept().await {
        let _ = client.set_nodelay(true);
        tokio::spawn(connection(client, upstream, mode.subscribe()));
    }
}

/// Sets `SO_LINGER` 0 so that closing sends an RST, then closes.
fn reset(stream: TcpStream) {
    let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
    drop(stream);
}

async fn connection(client: TcpStream, upstream: SocketAddr, mut mode: watch::Receiver<ProxyMode>) {
    // Blackholed until the mode changes: never connect upstream.
    loop {
        let current = *mode.borrow_and_update();
        match current {
            ProxyMode::Reset => return reset(client),
            ProxyMode::Blackhole => {
                if mode.changed().await.is_err() {
                    return reset(client);
                }
            }
            ProxyMode::Pass | ProxyMode::Latency(_) => break,
        }
    }
    let Ok(server) = TcpStream::connect(upstream).await else {
        return reset(client);
    };
    let _ = server.set_nodelay(true);
    // Linger 0 on both sockets: whenever the proxy drops them, they RST.
    for s in [&client, &server] {
        let _ = socket2::SockRef::from(s).set_linger(Some(Duration::ZERO));
    }
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let up = tokio::spawn(pipe(client_read, server_write, mode.clone()));
    let down = tokio::spawn(pipe(server_read, client_write, mode));
    let _ = (up.await, down.await);
}

/// Copies `from` to `to` through a delay line until either side closes or
/// the mode turns to reset.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<ProxyMode>,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let mut writer_mode = mode.clone();
    // The writer forwards each chunk `latency` after it arrived, so added
    // latency delays rather than throttles a pipelined connection.
    let writer = tokio::spawn(async move {
        loop {
            let next = tokio::select! {
                next = rx.recv() => next,
                () = reset_requested(&mut writer_mode) => return to.forget(),
            };
            let Some((arrived, chunk)) = next else {
                let _ = to.shutdown().await;
                return;
            };
            loop {
                let current = *writer_mode.borrow_and_update();
                match current {
                    ProxyMode::Pass => break,
                    ProxyMode::Latency(latency) => tokio::select! {
                        () = tokio::time::sleep_until(arrived + latency) => break,
                        _ = writer_mode.changed() => {}
                    },
                    ProxyMode::Blackhole => {
                        let _ = writer_mode.changed().await;
                    }
                    // Forgetting the write half skips its FIN, so the RST
                    // (linger 0) is the first thing the peer sees.
                    ProxyMode::Reset => return to.forget(),
                }
            }
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
    });
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx.send((Instant::now(), buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            },
            changed = mode.changed() => {
                if changed.is_err() || *mode.borrow() == ProxyMode::Reset {
                    // The writer forgets its half; dropping ours then
                    // closes the socket with linger 0: an RST.
                    let _ = writer.await;
                    return;
                }
            }
        }
    }
    drop(tx);
    let _ = writer.await;
}

/// Resolves once the mode is [`ProxyMode::Reset`] (or the proxy is gone).
async fn reset_requested(mode: &mut watch::Receiver<ProxyMode>) {
    loop {
        if *mode.borrow_and_update() == ProxyMode::Reset {
            return;
        }
        if mode.changed().await.is_err() {
            return;
        }
    }
}
