//! The TCP fault proxy against a local echo server: each mode does what
//! its name says, and a mode change reaches existing connections.

use std::time::Duration;

use levee_chaos::runner::proxy::{FaultProxy, ProxyMode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

async fn echo_server() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n) = conn.read(&mut buf).await {
                    if n == 0 || conn.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

/// Sends "ping" and reads the echo, within 1 s.
async fn round_trip(conn: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    conn.write_all(b"ping").await?;
    let mut buf = [0u8; 4];
    match tokio::time::timeout(Duration::from_secs(1), conn.read_exact(&mut buf)).await {
        Ok(read) => read.map(|_| buf.to_vec()),
        Err(_) => Err(std::io::ErrorKind::TimedOut.into()),
    }
}

#[tokio::test]
async fn proxy_passes_delays_blackholes_and_resets() {
    let proxy = FaultProxy::start(echo_server().await).await.unwrap();
    let mut conn = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(round_trip(&mut conn).await.unwrap(), b"ping");

    proxy.set_mode(ProxyMode::Latency(Duration::from_millis(100)));
    let started = Instant::now();
    assert_eq!(round_trip(&mut conn).await.unwrap(), b"ping");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(200),
        "100 ms each way: {took:?}"
    );
    assert!(took < Duration::from_millis(600), "{took:?}");

    proxy.set_mode(ProxyMode::Blackhole);
    let mut fresh = TcpStream::connect(proxy.addr()).await.unwrap();
    let err = round_trip(&mut fresh).await.unwrap_err();
    assert_eq!(
        err.kind(),
        std::io::ErrorKind::TimedOut,
        "accepted, never answered"
    );

    proxy.set_mode(ProxyMode::Reset);
    // Existing connections are reset, not closed cleanly.
    let err = round_trip(&mut conn).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
    let mut new = TcpStream::connect(proxy.addr()).await.unwrap();
    let err = round_trip(&mut new).await.unwrap_err();
    assert!(
        matches!(
            err.kind(),
            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
        ),
        "{err}"
    );

    proxy.set_mode(ProxyMode::Pass);
    let mut healed = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(round_trip(&mut healed).await.unwrap(), b"ping");
}
