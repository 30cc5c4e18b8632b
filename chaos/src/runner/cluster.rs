//! A real Redis Cluster for one chaos run, and levee replicas on it: six
//! `redis-server --cluster-enabled yes` processes (three masters, one
//! replica each) on free loopback ports, joined by `redis-cli --cluster
//! create`, each killed by its own PID (never by name) when dropped; and
//! `levee` started with `LEVEE_REDIS_CLUSTER_NODES` (and no
//! `LEVEE_REDIS_URL`). Every wait is bounded.
//!
//! The chaos-side equivalent of `tests/support/cluster.rs`, which the
//! chaos crate cannot import; it speaks RESP itself (no redis crate here).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::procs::{free_port, LeveeEnv, ADMIN_TOKEN};

/// Masters in the cluster.
pub const MASTERS: usize = 3;
/// Redis Cluster's slot count.
pub const SLOTS: u16 = 16384;
/// `--cluster-node-timeout` in ms: a dead master is failed over after
/// about this long plus the replica's election delay (0.5-1 s).
pub const NODE_TIMEOUT_MS: u64 = 2000;

/// One node we started.
#[derive(Debug)]
struct Node {
    port: u16,
    child: Option<Child>,
}

impl Node {
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A master as `CLUSTER NODES` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Master {
    /// Its port.
    pub port: u16,
    /// Slot ranges it serves, inclusive.
    pub slots: Vec<(u16, u16)>,
}

impl Master {
    /// Whether it serves `slot`.
    pub fn owns(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| (a..=b).contains(&slot))
    }
}

/// A parsed `CLUSTER NODES` line.
#[derive(Debug, Clone)]
struct NodeLine {
    port: u16,
    master: bool,
    failed: bool,
    slots: Vec<(u16, u16)>,
}

/// A running Redis Cluster of three masters with one replica each.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<Node>,
    dir: PathBuf,
}

/// The slot of `key` (CRC16/XMODEM of its hash tag, or of the whole key,
/// mod 16384), as `CLUSTER KEYSLOT` computes it.
pub fn key_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &bytes[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16(tagged.unwrap_or(bytes)) % SLOTS
}

/// CRC16/XMODEM (poly 0x1021, init 0), Redis Cluster's key hash.
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// A free loopback port whose cluster bus port (+10000) is free too, and
/// not one of `taken`.
fn free_cluster_port(taken: &[u16]) -> anyhow::Result<u16> {
    for _ in 0..200 {
        let port = free_port()?;
        if port > 55_000 || taken.contains(&port) || taken.contains(&(port + 10_000)) {
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return Ok(port);
        }
    }
    bail!("no free port pair for a cluster node")
}

/// A RESP reply, as far as this module needs one.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// `+OK`, or a bulk string.
    Text(String),
    /// `:n`.
    Int(i64),
    /// `-ERR ...`.
    Error(String),
    /// `$-1` / `*-1`.
    Nil,
    /// An array (its elements parsed too).
    Array(Vec<Reply>),
}

impl Reply {
    /// The text of a string reply.
    pub fn text(self) -> Option<String> {
        match self {
            Self::Text(s) => Some(s),
            _ => None,
        }
    }

    /// The value of an integer reply.
    pub fn int(self) -> Option<i64> {
        match self {
            Self::Int(n) => Some(n),
            _ => None,
        }
    }
}

/// One command to the node on `port`, bounded (connect and answer within
/// 1 s); `None` when it does not answer.
pub async fn query(port: u16, args: &[&str]) -> Option<Reply> {
    let work = async {
        let conn = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        let mut conn = BufReader::new(conn);
        let mut req = format!("*{}\r\n", args.len());
        for a in args {
            req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        conn.get_mut().write_all(req.as_bytes()).await.ok()?;
        read_reply(&mut conn).await
    };
    tokio::time::timeout(Duration::from_secs(1), work)
        .await
        .ok()
        .flatten()
}

/// Reads one RESP reply.
async fn read_reply(conn: &mut BufReader<TcpStream>) -> Option<Reply> {
    let mut line = String::new();
    conn.read_line(&mut line).await.ok()?;
    let line = line.trim_end_matches(['\r', '\n']);
    let (kind, rest) = line.split_at_checked(1)?;
    Some(match kind {
        "+" => Reply::Text(rest.to_owned()),
        "-" => Reply::Error(rest.to_owned()),
        ":" => Reply::Int(rest.parse().ok()?),
        "$" => {
            let len: i64 = rest.parse().ok()?;
            if len < 0 {
                return Some(Reply::Nil);
            }
            let mut buf = vec![0u8; usize::try_from(len).ok()? + 2];
            conn.read_exact(&mut buf).await.ok()?;
            buf.truncate(buf.len() - 2);
            Reply::Text(String::from_utf8(buf).ok()?)
        }
        "*" => {
            let len: i64 = rest.parse().ok()?;
            if len < 0 {
                return Some(Reply::Nil);
            }
            let mut items = Vec::new();
            for _ in 0..len {
                items.push(Box::pin(read_reply(conn)).await?);
            }
            Reply::Array(items)
        }
        _ => return None,
    })
}

/// `field:value` of an `INFO` / `CLUSTER INFO` text.
fn info_field<'a>(text: &'a str, field: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(field)?.strip_prefix(':'))
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
    /// Starts six nodes, creates the cluster (one replica per master) and
    /// waits until every node says `cluster_state:ok` with all slots
    /// assigned, three masters and every replica's link up.
    pub async fn start() -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!(
            "levee-chaos-cluster-{}-{}",
            std::process::id(),
            free_port()?
        ));
        std::fs::create_dir_all(&dir).context("cluster temp dir")?;
        let mut cluster = Self {
            nodes: Vec::new(),
            dir,
        };
        for _ in 0..MASTERS * 2 {
            cluster.spawn_node().await?;
        }
        cluster.create().await?;
        cluster.wait_ok(Duration::from_secs(20)).await?;
        Ok(cluster)
    }

    /// Spawns one node on a free port pair and waits for PING (a port lost
    /// to a race is retried on another).
    async fn spawn_node(&mut self) -> anyhow::Result<()> {
        for _ in 0..5 {
            let taken: Vec<u16> = self.nodes.iter().map(|n| n.port).collect();
            let port = free_cluster_port(&taken)?;
            let conf = self.dir.join(format!("nodes-{port}.conf"));
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--protected-mode", "no", "--cluster-enabled", "yes"])
                .arg("--cluster-config-file")
                .arg(&conf)
                .args(["--cluster-node-timeout", &NODE_TIMEOUT_MS.to_string()])
                .args(["--save", "", "--appendonly", "no"])
                // Replicas sync at once (the default waits 5 s for more
                // replicas before a diskless transfer).
                .args(["--repl-diskless-sync-delay", "0"])
                .arg("--dir")
                .arg(&self.dir)
                .args(["--dbfilename", &format!("dump-{port}.rdb")])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting redis-server (is it installed?)")?;
            let mut node = Node {
                port,
                child: Some(child),
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                let exited = node
                    .child
                    .as_mut()
                    .is_some_and(|c| c.try_wait().ok().flatten().is_some());
                if exited {
                    break; // the port was taken meanwhile
                }
                if query(port, &["PING"]).await == Some(Reply::Text("PONG".to_owned())) {
                    self.nodes.push(node);
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            node.kill();
        }
        bail!("could not start a cluster node")
    }

    async fn create(&self) -> anyhow::Result<()> {
        let mut args: Vec<String> = vec!["--cluster".into(), "create".into()];
        args.extend(self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)));
        args.extend(["--cluster-replicas", "1", "--cluster-yes"].map(String::from));
        let run = tokio::process::Command::new("redis-cli")
            .args(&args)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(Duration::from_secs(30), run)
            .await
            .context("redis-cli --cluster create within 30 s")?
            .context("running redis-cli (is it installed?)")?;
        if !out.status.success() {
            bail!(
                "redis-cli --cluster create failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// Ports of the nodes still running.
    pub fn live_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(|n| n.port)
            .collect()
    }

    /// Seed URLs of every node (`LEVEE_REDIS_CLUSTER_NODES`, comma-joined).
    pub fn seeds(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}", n.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The PID of the node on `port` while it runs.
    pub fn pid(&self, port: u16) -> Option<u32> {
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .and_then(|n| n.child.as_ref())
            .map(Child::id)
    }

    /// `CLUSTER NODES` as the first live node that answers sees it.
    async fn nodes_view(&self) -> Option<Vec<NodeLine>> {
        for port in self.live_ports() {
            if let Some(text) = query(port, &["CLUSTER", "NODES"])
                .await
                .and_then(Reply::text)
            {
                return Some(parse_nodes(&text));
            }
        }
        None
    }

    /// The healthy masters serving slots, by first slot.
    pub async fn masters(&self) -> anyhow::Result<Vec<Master>> {
        let mut masters: Vec<Master> = self
            .nodes_view()
            .await
            .context("no cluster node answers CLUSTER NODES")?
            .into_iter()
            .filter(|n| n.master && !n.failed && !n.slots.is_empty())
            .map(|n| Master {
                port: n.port,
                slots: n.slots,
            })
            .collect();
        masters.sort_by_key(|m| m.slots.first().copied());
        Ok(masters)
    }

    /// `CLUSTER KEYSLOT key` on a live node.
    pub async fn keyslot(&self, key: &str) -> anyhow::Result<u16> {
        for port in self.live_ports() {
            if let Some(n) = query(port, &["CLUSTER", "KEYSLOT", key])
                .await
                .and_then(Reply::int)
            {
                return Ok(u16::try_from(n)?);
            }
        }
        bail!("no cluster node answers CLUSTER KEYSLOT")
    }

    /// `CLUSTER COUNTKEYSINSLOT slot` on the node on `port`.
    pub async fn keys_in_slot(&self, port: u16, slot: u16) -> Option<i64> {
        query(port, &["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()])
            .await
            .and_then(Reply::int)
    }

    /// SIGKILLs the node on `port` (ours, by PID) and reaps it.
    pub fn kill(&mut self, port: u16) {
        if let Some(node) = self.nodes.iter_mut().find(|n| n.port == port) {
            node.kill();
        }
    }

    /// Waits (polling every 50 ms, at most `limit`) until every slot of
    /// `dead` is served by another, healthy master and every live node
    /// says `cluster_state:ok`; returns that master.
    pub async fn wait_promoted(&self, dead: &Master, limit: Duration) -> anyhow::Result<Master> {
        let deadline = Instant::now() + limit;
        loop {
            let masters = self.masters().await.unwrap_or_default();
            let heir = masters
                .iter()
                .find(|m| m.port != dead.port && dead.slots.iter().all(|&(a, _)| m.owns(a)));
            if let Some(heir) = heir {
                if self.all_ok(false).await {
                    return Ok(heir.clone());
                }
            }
            if Instant::now() >= deadline {
                bail!(
                    "slots {:?} of the killed master {} not taken over within {limit:?}: masters {masters:?}",
                    dead.slots,
                    dead.port
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether every live node says `cluster_state:ok` with all slots
    /// assigned and ok (and, with `replicas`, every replica's link up).
    async fn all_ok(&self, replicas: bool) -> bool {
        let slots = SLOTS.to_string();
        for port in self.live_ports() {
            let Some(info) = query(port, &["CLUSTER", "INFO"])
                .await
                .and_then(Reply::text)
            else {
                return false;
            };
            if info_field(&info, "cluster_state") != Some("ok")
                || info_field(&info, "cluster_slots_assigned") != Some(slots.as_str())
                || info_field(&info, "cluster_slots_ok") != Some(slots.as_str())
            {
                return false;
            }
            if replicas {
                let Some(repl) = query(port, &["INFO", "replication"])
                    .await
                    .and_then(Reply::text)
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

    /// Waits until the cluster is whole: every node ok, three masters
    /// with slots, three replicas with their links up.
    async fn wait_ok(&self, limit: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            if self.all_ok(true).await {
                if let Some(view) = self.nodes_view().await {
                    let masters = view
                        .iter()
                        .filter(|n| n.master && !n.failed && !n.slots.is_empty())
                        .count();
                    let replicas = view.iter().filter(|n| !n.master && !n.failed).count();
                    if masters == MASTERS && replicas == MASTERS {
                        return Ok(());
                    }
                }
            }
            if Instant::now() >= deadline {
                bail!("cluster on {:?} not ok within {limit:?}", self.live_ports());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One levee replica on a Redis Cluster: `LEVEE_REDIS_CLUSTER_NODES` set,
/// `LEVEE_REDIS_URL` unset; SIGKILLed (by PID) when dropped.
#[derive(Debug)]
pub struct ClusterLevee {
    child: Option<Child>,
    /// Its port.
    pub port: u16,
    config_path: PathBuf,
}

impl ClusterLevee {
    /// Starts `binary serve --config <tmp file>` on the cluster reached
    /// through `seeds`, with the LLM and vector store of `env` (its
    /// `redis_url` is not used), and waits for `/health`.
    pub async fn start(
        binary: &Path,
        config: &str,
        seeds: &str,
        env: &LeveeEnv,
    ) -> anyhow::Result<Self> {
        let port = free_port()?;
        let config_path = std::env::temp_dir().join(format!(
            "levee-chaos-cluster-{}-{port}.toml",
            std::process::id()
        ));
        std::fs::write(&config_path, config).context("writing levee config")?;
        let child = Command::new(binary)
            .arg("serve")
            .arg("--config")
            .arg(&config_path)
            .env_remove("LEVEE_CONFIG")
            .env_remove("LEVEE_REDIS_URL")
            .env("LEVEE_LISTEN", format!("127.0.0.1:{port}"))
            .env("LEVEE_REDIS_CLUSTER_NODES", seeds)
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
            child: Some(child),
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

    async fn wait_healthy(&mut self) -> anyhow::Result<()> {
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let exited = self
                .child
                .as_mut()
                .is_some_and(|c| c.try_wait().ok().flatten().is_some());
            if exited {
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

impl Drop for ClusterLevee {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(&self.config_path);
    }
}

#[cfg(test)]
mod tests {
    use super::key_slot;

    #[test]
    fn key_slot_hashes_the_hash_tag_like_redis() {
        // Values of `CLUSTER KEYSLOT` on Redis 7.
        assert_eq!(key_slot("123456789"), 12739);
        assert_eq!(key_slot("foo"), 12182);
        assert_eq!(key_slot("{user1000}.following"), key_slot("user1000"));
        assert_eq!(key_slot("foo{}{bar}"), key_slot("foo{}{bar}"));
        assert_eq!(
            key_slot("levee:rl:sl:{ip:127.0.0.1}:1m"),
            key_slot("ip:127.0.0.1")
        );
    }
}
