//! Conversation memory per thread: capped in messages and bytes, forgotten
//! a TTL after the last message. In process by default; a Redis list per
//! thread (with the same TTL) when Redis is configured, so replicas share
//! conversations.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::upstream::redis_conn::RedisConn;
use async_trait::async_trait;
use sha2::{Digest, Sha256};
use tokio::time::Instant;
use tracing::Instrument;

use super::config::MemoryConfig;
use crate::telemetry::client;
use crate::upstream::UpstreamMetrics;
use crate::upstream::{Dependency, Turn, UpstreamError, UpstreamErrorKind};

/// Identifies a conversation. Threads belong to a (tenant, user) pair, so
/// knowing someone else's `thread_id` does not reveal their conversation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ThreadKey {
    /// Tenant (or `default`).
    pub tenant: String,
    /// The user's id.
    pub user: String,
    /// The client's thread id.
    pub thread: String,
}

impl ThreadKey {
    /// A fixed-length digest used as the storage key, so ids never become
    /// raw Redis key names.
    pub fn digest(&self) -> String {
        let mut h = Sha256::new();
        for part in [&self.tenant, &self.user, &self.thread] {
            h.update(part.as_bytes());
            h.update([0u8]);
        }
        hex::encode(&h.finalize()[..16])
    }
}

/// Where conversations live.
#[async_trait]
pub trait ConversationStore: Send + Sync + 'static {
    /// `memory` or `redis`.
    fn kind(&self) -> &'static str;
    /// The thread's remembered turns, oldest first.
    async fn load(&self, key: &ThreadKey) -> Result<Vec<Turn>, UpstreamError>;
    /// Appends turns, trims to the caps and refreshes the TTL.
    async fn append(&self, key: &ThreadKey, turns: &[Turn]) -> Result<(), UpstreamError>;
}

/// Keeps the newest turns that fit both caps.
fn trim(turns: &mut Vec<Turn>, caps: &MemoryConfig) {
    let mut bytes = 0;
    let mut keep = 0;
    for t in turns.iter().rev() {
        if keep == caps.max_turns || bytes + t.content.len() > caps.max_bytes {
            break;
        }
        bytes += t.content.len();
        keep += 1;
    }
    let drop = turns.len() - keep;
    turns.drain(..drop);
}

/// In-process memory with LRU eviction past `max_threads`.
#[derive(Debug)]
pub struct InProcessMemory {
    caps: MemoryConfig,
    threads: Mutex<HashMap<ThreadKey, (Vec<Turn>, Instant)>>,
}

impl InProcessMemory {
    /// An empty store with these caps.
    pub fn new(caps: MemoryConfig) -> Self {
        Self {
            caps,
            threads: Mutex::new(HashMap::new()),
        }
    }
}

#[async_trait]
impl ConversationStore for InProcessMemory {
    fn kind(&self) -> &'static str {
        "memory"
    }

    async fn load(&self, key: &ThreadKey) -> Result<Vec<Turn>, UpstreamError> {
        let threads = self.threads.lock().unwrap_or_else(|p| p.into_inner());
        Ok(match threads.get(key) {
            Some((turns, touched)) if touched.elapsed() < self.caps.ttl => turns.clone(),
            _ => Vec::new(),
        })
    }

    async fn append(&self, key: &ThreadKey, turns: &[Turn]) -> Result<(), UpstreamError> {
        let mut threads = self.threads.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        threads.retain(|_, (_, touched)| now.duration_since(*touched) < self.caps.ttl);
        if !threads.contains_key(key) && threads.len() >= self.caps.max_threads {
            let oldest = threads
                .iter()
                .min_by_key(|(_, (_, t))| *t)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                threads.remove(&oldest);
            }
        }
        let entry = threads
            .entry(key.clone())
            .or_insert_with(|| (Vec::new(), now));
        entry.0.extend_from_slice(turns);
        trim(&mut entry.0, &self.caps);
        entry.1 = now;
        Ok(())
    }
}

/// Redis memory: one list per thread, `levee:mem:{digest}`, with a TTL.
#[derive(Clone)]
pub struct RedisMemory {
    conn: RedisConn,
    caps: MemoryConfig,
    timeout: Duration,
    metrics: Option<UpstreamMetrics>,
}

impl std::fmt::Debug for RedisMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisMemory").finish_non_exhaustive()
    }
}

impl RedisMemory {
    /// Memory on an existing connection; every command is bounded by `timeout`.
    pub fn new(conn: RedisConn, caps: MemoryConfig, timeout: Duration) -> Self {
        Self {
            conn,
            caps,
            timeout,
            metrics: None,
        }
    }

    /// Records each command's latency into `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: UpstreamMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    fn redis_key(key: &ThreadKey) -> String {
        // One key per thread, hash-tagged so a cluster spreads threads
        // over slots while each call stays in one.
        format!("levee:mem:{{{}}}", key.digest())
    }

    /// One command (`operation` names it on the CLIENT span), timed.
    async fn run<T: redis::FromRedisValue>(
        &self,
        operation: &'static str,
        cmd: &redis::Pipeline,
    ) -> Result<T, UpstreamError> {
        let span = client::redis_span(operation);
        let start = Instant::now();
        let result = self.run_inner(cmd).instrument(span.clone()).await;
        span.in_scope(|| {
            crate::upstream::trace::finish(
                self.metrics.as_ref(),
                Dependency::Redis,
                start.elapsed(),
                &result,
            );
        });
        result
    }

    async fn run_inner<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Pipeline,
    ) -> Result<T, UpstreamError> {
        let mut conn = self.conn.clone();
        match tokio::time::timeout(self.timeout, cmd.query_async::<T>(&mut conn)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(UpstreamError::new(
                Dependency::Redis,
                if e.is_timeout() {
                    UpstreamErrorKind::Timeout
                } else {
                    UpstreamErrorKind::Connect
                },
            )),
            Err(_) => Err(UpstreamError::new(
                Dependency::Redis,
                UpstreamErrorKind::Timeout,
            )),
        }
    }
}

#[async_trait]
impl ConversationStore for RedisMemory {
    fn kind(&self) -> &'static str {
        "redis"
    }

    async fn load(&self, key: &ThreadKey) -> Result<Vec<Turn>, UpstreamError> {
        let mut pipe = redis::pipe();
        pipe.lrange(Self::redis_key(key), 0, -1);
        let (raw,): (Vec<String>,) = self.run("LRANGE", &pipe).await?;
        let mut turns: Vec<Turn> = raw
            .iter()
            .filter_map(|s| serde_json::from_str(s).ok())
            .collect();
        trim(&mut turns, &self.caps);
        Ok(turns)
    }

    async fn append(&self, key: &ThreadKey, turns: &[Turn]) -> Result<(), UpstreamError> {
        let rkey = Self::redis_key(key);
        let encoded: Vec<String> = turns
            .iter()
            .filter_map(|t| serde_json::to_string(t).ok())
            .collect();
        let keep = isize::try_from(self.caps.max_turns).unwrap_or(isize::MAX);
        let mut pipe = redis::pipe();
        pipe.atomic()
            .rpush(&rkey, encoded)
            .ignore()
            .ltrim(&rkey, -keep, -1)
            .ignore()
            .expire(&rkey, self.caps.ttl.as_secs().max(1) as i64)
            .ignore();
        self.run::<()>("MULTI", &pipe).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::Role;

    fn key(thread: &str) -> ThreadKey {
        ThreadKey {
            tenant: "t".into(),
            user: "u".into(),
            thread: thread.into(),
        }
    }

    fn turn(s: &str) -> Turn {
        Turn {
            role: Role::User,
            content: s.into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn history_is_capped_in_turns_and_bytes_and_expires() {
        let caps = MemoryConfig {
            max_turns: 3,
            max_bytes: 10,
            ttl: Duration::from_secs(60),
            max_threads: 10,
        };
        let mem = InProcessMemory::new(caps);
        let k = key("a");
        mem.append(
            &k,
            &[turn("1111"), turn("2222"), turn("3333"), turn("4444")],
        )
        .await
        .unwrap();
        // 3 turns allowed but only 10 bytes: the two newest survive.
        assert_eq!(
            mem.load(&k).await.unwrap(),
            vec![turn("3333"), turn("4444")]
        );
        tokio::time::advance(Duration::from_secs(61)).await;
        assert!(mem.load(&k).await.unwrap().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn threads_of_other_users_are_separate() {
        let mem = InProcessMemory::new(MemoryConfig::default());
        mem.append(&key("a"), &[turn("secret")]).await.unwrap();
        let other = ThreadKey {
            user: "mallory".into(),
            ..key("a")
        };
        assert!(mem.load(&other).await.unwrap().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn least_recently_used_thread_is_evicted_past_the_cap() {
        let caps = MemoryConfig {
            max_threads: 2,
            ..MemoryConfig::default()
        };
        let mem = InProcessMemory::new(caps);
        for t in ["a", "b", "c"] {
            mem.append(&key(t), &[turn(t)]).await.unwrap();
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        assert!(mem.load(&key("a")).await.unwrap().is_empty());
        assert_eq!(mem.load(&key("c")).await.unwrap(), vec![turn("c")]);
    }
}
