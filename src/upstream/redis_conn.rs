//! [`RedisConn`]: one handle for standalone Redis and Redis Cluster, so
//! the limiter store, conversation memory and the job store are written
//! once against `ConnectionLike`.
//!
//! - Standalone: redis-rs's `ConnectionManager` (lazy, reconnects).
//! - Cluster: redis-rs's async cluster connection, which follows `MOVED`
//!   and `ASK` and refreshes its slot map when the topology changes (a
//!   replica promoted after a master died). It is made lazily on first
//!   use and retried on the next call if the cluster is unreachable, so a
//!   gateway starts (and answers under its fail-open / fail-closed
//!   policies) with the cluster down.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};
use tokio::sync::OnceCell;

/// A Redis connection: one server, or a cluster.
#[derive(Clone)]
pub enum RedisConn {
    /// One server.
    Single(ConnectionManager),
    /// A cluster, connected on first use.
    Cluster(LazyCluster),
}

impl std::fmt::Debug for RedisConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Single(_) => "RedisConn::Single",
            Self::Cluster(_) => "RedisConn::Cluster",
        })
    }
}

impl RedisConn {
    /// Whether keys of one call must share a slot.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }
}

/// A cluster client and its connection, made on first use.
#[derive(Clone)]
pub struct LazyCluster {
    inner: Arc<(ClusterClient, OnceCell<ClusterConnection>)>,
}

impl LazyCluster {
    /// A cluster reached through `nodes` (seed URLs), each command bounded
    /// by `timeout`.
    pub fn new(nodes: &[String], timeout: Duration) -> redis::RedisResult<Self> {
        let client = ClusterClient::builder(nodes.to_vec())
            .connection_timeout(timeout.max(Duration::from_millis(200)))
            .response_timeout(timeout)
            // Few, quick retries: while a master is down the breaker and
            // the failure policies answer, not a long retry loop.
            .retries(2)
            .build()?;
        Ok(Self {
            inner: Arc::new((client, OnceCell::new())),
        })
    }

    async fn get(&self) -> redis::RedisResult<ClusterConnection> {
        let (client, conn) = &*self.inner;
        conn.get_or_try_init(|| client.get_async_connection())
            .await
            .cloned()
    }
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(lazy) => Box::pin(async move {
                let mut c = lazy.get().await?;
                c.req_packed_command(cmd).await
            }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(c) => c.req_packed_commands(cmd, offset, count),
            Self::Cluster(lazy) => Box::pin(async move {
                let mut c = lazy.get().await?;
                c.req_packed_commands(cmd, offset, count).await
            }),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(_) => 0,
        }
    }
}
