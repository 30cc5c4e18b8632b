//! A real Redis Cluster for one test: six `redis-server` processes (three
//! masters, three replicas) on free loopback ports, joined by
//! `redis-cli --cluster create`, each killed (by PID, only ours) when
//! dropped. Every wait is bounded.
//!
//! Self-contained (no other support module), so benches can include it
//! with `#[path]`.

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// Masters in a cluster.
pub const MASTERS: usize = 3;
/// Redis Cluster's slot count.
pub const SLOTS: u16 = 16384;
/// `--cluster-node-timeout` in ms: a dead master is failed over after
/// about this long plus the replica's election delay.
pub const NODE_TIMEOUT_MS: u64 = 2000;

static CLUSTERS: AtomicU32 = AtomicU32::new(0);

/// One node this cluster started.
struct Node {
    port: u16,
    child: Option<Child>,
}

/// A master as `CLUSTER NODES` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Master {
    /// Its port.
    pub port: u16,
    /// Its process id (a process we started).
    pub pid: u32,
    /// Slot ranges it serves, inclusive.
    pub slots: Vec<(u16, u16)>,
}

impl Master {
    /// Whether it serves `slot`.
    pub fn owns(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| (a..=b).contains(&slot))
    }
}

/// A running Redis Cluster: three masters, by default one replica each.
pub struct RedisCluster {
    nodes: Vec<Node>,
    replicas: usize,
    dir: PathBuf,
}

/// A loopback port that is free, and whose cluster bus port (+10000) is
/// free too, and not one of `taken`.
fn free_cluster_port(taken: &[u16]) -> u16 {
    for _ in 0..200 {
        let Ok(l) = TcpListener::bind("127.0.0.1:0") else {
            continue;
        };
        let Ok(addr) = l.local_addr() else { continue };
        let port = addr.port();
        if port > 55_000 || taken.contains(&port) || taken.contains(&(port + 10_000)) {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
    panic!("no free port pair for a cluster node");
}

fn url(port: u16) -> String {
    format!("redis://127.0.0.1:{port}/")
}

/// One command to one node, bounded (connect and answer within 1 s).
pub async fn node_query<T: redis::FromRedisValue>(port: u16, cmd: &redis::Cmd) -> Option<T> {
    let client = redis::Client::open(url(port)).ok()?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_millis(500)))
        .set_response_timeout(Some(Duration::from_secs(1)));
    let work = async {
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .ok()?;
        cmd.query_async::<T>(&mut conn).await.ok()
    };
    tokio::time::timeout(Duration::from_secs(2), work)
        .await
        .ok()
        .flatten()
}

fn info_field<'a>(text: &'a str, field: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(field)?.strip_prefix(':'))
}

/// A parsed `CLUSTER NODES` line.
#[derive(Debug, Clone)]
struct NodeLine {
    port: u16,
    master: bool,
    failed: bool,
    slots: Vec<(u16, u16)>,
}

fn parse_nodes(text: &str) -> Vec<NodeLine> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 8 {
                return None;
            }
            // ip:port@cport[,hostname]
            let port = f[1].split('@').next()?.rsplit(':').next()?.parse().ok()?;
            let flags: Vec<&str> = f[2].split(',').collect();
            let slots = f[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|x| (x, x)),
                })
                .collect();
            Some(NodeLine {
                port,
                master: flags.contains(&"master"),
                failed: flags
                    .iter()
                    .any(|f| matches!(*f, "fail" | "fail?" | "noaddr" | "handshake")),
                slots,
            })
        })
        .collect()
}

impl RedisCluster {
    /// Starts six nodes (three masters, one replica each), creates the
    /// cluster and waits until every node says `cluster_state:ok` with all
    /// slots assigned and every replica in sync with its master.
    pub async fn start() -> Self {
        Self::start_with(1).await
    }

    /// Like [`Self::start`] with `replicas` replicas per master (0: three
    /// masters alone, no failover).
    pub async fn start_with(replicas: usize) -> Self {
        let n = CLUSTERS.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "levee-cluster-{}-{n}-{:x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).expect("cluster temp dir");
        let mut cluster = Self {
            nodes: Vec::new(),
            replicas,
            dir,
        };
        for _ in 0..MASTERS * (1 + replicas) {
            cluster.spawn_node().await;
        }
        cluster.create().await;
        cluster.wait_ok(Duration::from_secs(30)).await;
        cluster
    }

    /// Spawns one node on a free port pair and waits for PING (a port
    /// lost to a race is retried on another).
    async fn spawn_node(&mut self) {
        for _ in 0..5 {
            let taken: Vec<u16> = self.nodes.iter().map(|n| n.port).collect();
            let port = free_cluster_port(&taken);
            let conf = self.dir.join(format!("nodes-{port}.conf"));
            let child = Command::new("redis-server")
                .args([
                    "--port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--protected-mode",
                    "no",
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    &conf.to_string_lossy(),
                    "--cluster-node-timeout",
                    &NODE_TIMEOUT_MS.to_string(),
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    // Replicas sync at once (the default waits 5 s for
                    // more replicas before a diskless transfer).
                    "--repl-diskless-sync-delay",
                    "0",
                    "--dir",
                    &self.dir.to_string_lossy(),
                    "--dbfilename",
                    &format!("dump-{port}.rdb"),
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server must be installed (scripts/test.sh installs it)");
            let mut node = Node {
                port,
                child: Some(child),
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut up = false;
            while Instant::now() < deadline {
                if let Some(c) = node.child.as_mut() {
                    if c.try_wait().ok().flatten().is_some() {
                        break; // exited: the port was taken meanwhile
                    }
                }
                if node_query::<String>(port, &redis::cmd("PING"))
                    .await
                    .as_deref()
                    == Some("PONG")
                {
                    up = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if up {
                self.nodes.push(node);
                return;
            }
            if let Some(mut c) = node.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        panic!("could not start a cluster node");
    }

    async fn create(&self) {
        let mut args: Vec<String> = vec!["--cluster".into(), "create".into()];
        args.extend(self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)));
        args.extend([
            "--cluster-replicas".into(),
            self.replicas.to_string(),
            "--cluster-yes".into(),
        ]);
        let run = tokio::process::Command::new("redis-cli")
            .args(&args)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(Duration::from_secs(60), run)
            .await
            .expect("redis-cli --cluster create within 60 s")
            .expect("redis-cli must be installed (redis-tools)");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Ports of the nodes still running.
    pub fn live_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(|n| n.port)
            .collect()
    }

    /// Every node's port, killed ones included.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// Seed URLs of the live nodes.
    pub fn seed_urls(&self) -> Vec<String> {
        self.live_ports().into_iter().map(url).collect()
    }

    /// Seed URLs, comma-joined (`LEVEE_REDIS_CLUSTER_NODES`).
    pub fn seeds(&self) -> String {
        self.seed_urls().join(",")
    }

    fn pid(&self, port: u16) -> u32 {
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .and_then(|n| n.child.as_ref())
            .map_or(0, Child::id)
    }

    /// `CLUSTER NODES` as seen by the first live node that answers.
    async fn nodes_view(&self) -> Vec<NodeLine> {
        for port in self.live_ports() {
            if let Some(text) = node_query::<String>(port, redis::cmd("CLUSTER").arg("NODES")).await
            {
                return parse_nodes(&text);
            }
        }
        panic!("no cluster node answers CLUSTER NODES");
    }

    /// The current masters (healthy ones serving slots), by port.
    pub async fn masters(&self) -> Vec<Master> {
        let mut masters: Vec<Master> = self
            .nodes_view()
            .await
            .into_iter()
            .filter(|n| n.master && !n.failed && !n.slots.is_empty())
            .map(|n| Master {
                port: n.port,
                pid: self.pid(n.port),
                slots: n.slots,
            })
            .collect();
        masters.sort_by_key(|m| m.slots.first().copied());
        masters
    }

    /// `CLUSTER KEYSLOT key`.
    pub async fn keyslot(&self, key: &str) -> u16 {
        for port in self.live_ports() {
            if let Some(slot) =
                node_query::<u16>(port, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key)).await
            {
                return slot;
            }
        }
        panic!("no cluster node answers CLUSTER KEYSLOT");
    }

    /// The master serving `key`'s slot now.
    pub async fn master_of(&self, key: &str) -> Master {
        let slot = self.keyslot(key).await;
        self.masters()
            .await
            .into_iter()
            .find(|m| m.owns(slot))
            .unwrap_or_else(|| panic!("no master serves slot {slot}"))
    }

    /// `DBSIZE` of one node.
    pub async fn dbsize(&self, port: u16) -> u64 {
        node_query(port, &redis::cmd("DBSIZE"))
            .await
            .unwrap_or_else(|| panic!("DBSIZE on {port}"))
    }

    /// `KEYS *` of one node (assertions only).
    pub async fn keys(&self, port: u16) -> Vec<String> {
        node_query(port, redis::cmd("KEYS").arg("*"))
            .await
            .unwrap_or_else(|| panic!("KEYS on {port}"))
    }

    /// SIGKILLs one node (ours, by PID) and reaps it.
    pub fn kill(&mut self, port: u16) {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no node on {port}"));
        if let Some(mut child) = node.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGKILLs the master serving `key`; returns it.
    pub async fn kill_master_of(&mut self, key: &str) -> Master {
        let master = self.master_of(key).await;
        self.kill(master.port);
        master
    }

    /// Waits until `dead`'s slots are served by another (promoted) node
    /// and the cluster is whole again; returns how long that took.
    pub async fn wait_promoted(&self, dead: &Master, limit: Duration) -> Duration {
        let started = Instant::now();
        let deadline = started + limit;
        loop {
            let masters = self.masters().await;
            let taken_over = dead.slots.iter().all(|&(a, _)| {
                masters
                    .iter()
                    .any(|m| m.port != dead.port && m.pid != 0 && m.owns(a))
            });
            if taken_over && self.all_ok(false).await {
                return started.elapsed();
            }
            assert!(
                Instant::now() < deadline,
                "slots of the killed master {} not taken over within {limit:?}: {masters:?}",
                dead.port
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Whether every live node says `cluster_state:ok` with all slots
    /// assigned and ok (and, with `replicas`, every replica's link up).
    async fn all_ok(&self, replicas: bool) -> bool {
        for port in self.live_ports() {
            let Some(info) = node_query::<String>(port, redis::cmd("CLUSTER").arg("INFO")).await
            else {
                return false;
            };
            let slots = SLOTS.to_string();
            if info_field(&info, "cluster_state") != Some("ok")
                || info_field(&info, "cluster_slots_assigned") != Some(slots.as_str())
                || info_field(&info, "cluster_slots_ok") != Some(slots.as_str())
            {
                return false;
            }
            if replicas {
                let Some(repl) =
                    node_query::<String>(port, redis::cmd("INFO").arg("replication")).await
                else {
                    return false;
                };
                if info_field(&repl, "role") == Some("slave")
                    && info_field(&repl, "master_link_status") != Some("up")
                {
                    return false;
                }
            }
        }
        true
    }

    /// Waits until the cluster is whole: every node `cluster_state:ok`,
    /// 16384 slots assigned, three masters with slots and their replicas,
    /// whose replication links are up.
    pub async fn wait_ok(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            if self.all_ok(true).await {
                let view = self.nodes_view().await;
                let masters = view
                    .iter()
                    .filter(|n| n.master && !n.failed && !n.slots.is_empty())
                    .count();
                let replicas = view.iter().filter(|n| !n.master && !n.failed).count();
                if masters == MASTERS && replicas == MASTERS * self.replicas {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "cluster on {:?} not ok within {limit:?}",
                self.ports()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Port → role summary, for failure messages.
    pub async fn describe(&self) -> HashMap<u16, String> {
        self.nodes_view()
            .await
            .into_iter()
            .map(|n| {
                let role = match (n.master, n.failed) {
                    (_, true) => "failed".to_owned(),
                    (true, _) => format!("master {:?}", n.slots),
                    (false, _) => "replica".to_owned(),
                };
                (n.port, role)
            })
            .collect()
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
