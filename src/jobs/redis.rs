//! [`RedisJobStore`]: one stream per tenant (`levee:jobs:{<tenant>}:stream`),
//! read by one consumer group (`workers`) for the whole fleet, and one hash
//! per job (`levee:jobs:{<tenant>}:job:<id>`). Every key one script touches
//! carries the tenant's hash tag, so each call is one slot on a cluster.
//!
//! - `submit` is one script: the idempotency key, the tenant's depth, the
//!   record and the `XADD`. Its reply is the acknowledgement a 202 waits
//!   for; with `appendonly yes` and `appendfsync always` Redis has fsynced
//!   it by then.
//! - `start` counts the delivery and marks the job running, unless it is
//!   already finished (a job taken over after its first worker finished
//!   it), in which case the entry is just acknowledged.
//! - `finish` writes the result only if none is there yet, then `XACK`s and
//!   `XDEL`s the entry, so the stream holds queued and running jobs only.
//! - Jobs a crashed worker held are taken over with `XAUTOCLAIM` once idle
//!   for the visibility timeout.

use std::time::Duration;

use crate::upstream::redis_conn::RedisConn;
use ::redis::{RedisError, Script, Value};
use async_trait::async_trait;
use sha2::{Digest, Sha256};

use super::{
    Delivery, JobStatus, JobStore, JobStoreError, JobView, NewJob, Outcome, Started, Submitted,
    Submitter,
};

/// The consumer group every replica's workers read through.
const GROUP: &str = "workers";
/// The set of tenants that have queued jobs (workers discover streams here).
const TENANTS: &str = "levee:jobs:tenants";

const SUBMIT: &str = r"
local stream, job, idem = KEYS[1], KEYS[2], KEYS[3]
if ARGV[1] == '1' then
  local existing = redis.call('GET', idem)
  if existing and redis.call('EXISTS', KEYS[4] .. existing) == 1 then
    return {1, existing}
  end
end
local depth = redis.call('XLEN', stream)
if depth >= tonumber(ARGV[2]) then
  return {2, ''}
end
pcall(redis.call, 'XGROUP', 'CREATE', stream, 'workers', '0', 'MKSTREAM')
redis.call('HSET', job, 'status', 'queued', 'body', ARGV[4], 'submitter', ARGV[5],
  'callback', ARGV[6], 'traceparent', ARGV[7], 'enqueued_at', ARGV[8], 'attempts', 0)
redis.call('PEXPIRE', job, ARGV[9])
redis.call('XADD', stream, '*', 'id', ARGV[3], 's', ARGV[5])
if ARGV[1] == '1' then
  redis.call('SET', idem, ARGV[3], 'PX', ARGV[9])
end
return {0, ARGV[3]}
";

const START: &str = r"
local stream, job = KEYS[1], KEYS[2]
local status = redis.call('HGET', job, 'status')
if (not status) or status == 'succeeded' or status == 'failed' or status == 'dead' then
  redis.call('XACK', stream, 'workers', ARGV[1])
  redis.call('XDEL', stream, ARGV[1])
  return {0}
end
local attempts = redis.call('HINCRBY', job, 'attempts', 1)
redis.call('HSET', job, 'status', 'running', 'started_at', ARGV[2])
local f = redis.call('HMGET', job, 'body', 'submitter', 'callback', 'traceparent', 'enqueued_at')
return {1, attempts, f[1], f[2], f[3], f[4], f[5]}
";

const FINISH: &str = r"
local stream, job = KEYS[1], KEYS[2]
local status = redis.call('HGET', job, 'status')
local wrote = 0
if status and status ~= 'succeeded' and status ~= 'failed' and status ~= 'dead' then
  redis.call('HSET', job, 'status', ARGV[2], ARGV[3], ARGV[4], 'finished_at', ARGV[5])
  redis.call('HDEL', job, 'body')
  redis.call('PEXPIRE', job, ARGV[6])
  wrote = 1
end
redis.call('XACK', stream, 'workers', ARGV[1])
redis.call('XDEL', stream, ARGV[1])
return wrote
";

const REQUEUE: &str = r"
local stream, job = KEYS[1], KEYS[2]
local acked = redis.call('XACK', stream, 'workers', ARGV[1])
redis.call('XDEL', stream, ARGV[1])
local status = redis.call('HGET', job, 'status')
if acked == 1 and status and (status == 'running' or status == 'queued') then
  redis.call('HSET', job, 'status', 'queued')
  if ARGV[3] ~= '' then redis.call('HSET', job, 'error', ARGV[3]) end
  redis.call('XADD', stream, '*', 'id', ARGV[2], 's', redis.call('HGET', job, 'submitter'))
  return 1
end
return 0
";

/// Jobs in Redis.
#[derive(Clone)]
pub struct RedisJobStore {
    conn: RedisConn,
    /// Redis's breaker (shared with the limiter and memory): while it is
    /// open a submission is refused at once instead of waiting out the
    /// store timeout.
    breaker: Option<crate::resilience::Breaker>,
    timeout: Duration,
    submit: Script,
    start: Script,
    finish: Script,
    requeue: Script,
}

impl std::fmt::Debug for RedisJobStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisJobStore")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

fn stream_key(tenant: &str) -> String {
    format!("levee:jobs:{{{tenant}}}:stream")
}

fn job_prefix(tenant: &str) -> String {
    format!("levee:jobs:{{{tenant}}}:job:")
}

fn idem_key(tenant: &str, key: Option<&str>) -> String {
    // The client's key is hashed: it may be anything, and key names are
    // visible to whoever can list Redis.
    let digest = key.map_or_else(String::new, |k| hex::encode(Sha256::digest(k.as_bytes())));
    format!("levee:jobs:{{{tenant}}}:idem:{digest}")
}

fn unavailable(err: &RedisError) -> JobStoreError {
    JobStoreError {
        reason: match err.code() {
            Some(code) => format!("redis replied with an error ({code})"),
            None => format!("redis call failed ({:?})", err.kind()),
        },
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        other => text(other)?.parse().ok(),
    }
}

impl RedisJobStore {
    /// A store on `conn`, each call bounded by `timeout`.
    pub fn new(conn: RedisConn, timeout: Duration) -> Self {
        Self {
            conn,
            breaker: None,
            timeout,
            submit: Script::new(SUBMIT),
            start: Script::new(START),
            finish: Script::new(FINISH),
            requeue: Script::new(REQUEUE),
        }
    }

    /// Fails submissions fast while Redis's `breaker` is open.
    #[must_use]
    pub fn with_breaker(mut self, breaker: Option<crate::resilience::Breaker>) -> Self {
        self.breaker = breaker;
        self
    }

    async fn bounded<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, RedisError>>,
    ) -> Result<T, JobStoreError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(unavailable(&e)),
            Err(_) => Err(JobStoreError {
                reason: format!(
                    "redis did not answer within {} ms",
                    self.timeout.as_millis()
                ),
            }),
        }
    }

    fn entries(reply: &Value, tenant: &str) -> Vec<Delivery> {
        // [[entry_id, [field, value, ...]], ...]
        let Value::Array(entries) = reply else {
            return Vec::new();
        };
        entries
            .iter()
            .filter_map(|e| {
                let Value::Array(parts) = e else { return None };
                let handle = text(parts.first()?)?;
                let Value::Array(fields) = parts.get(1)? else {
                    return None;
                };
                let field = |name: &str| {
                    fields
                        .chunks(2)
                        .find(|kv| kv.first().and_then(text).as_deref() == Some(name))
                        .and_then(|kv| kv.get(1).and_then(text))
                };
                Some(Delivery {
                    tenant: tenant.to_owned(),
                    id: field("id")?,
                    handle,
                    submitter: field("s").and_then(|s| serde_json::from_str(&s).ok()),
                })
            })
            .collect()
    }
}

#[async_trait]
impl JobStore for RedisJobStore {
    fn kind(&self) -> &'static str {
        "redis"
    }

    fn durable(&self) -> bool {
        true
    }

    async fn submit(&self, job: NewJob, max_queued: u64) -> Result<Submitted, JobStoreError> {
        use crate::resilience::BreakerState;
        if let Some(b) = &self.breaker {
            if matches!(
                b.state(),
                BreakerState::Open { .. } | BreakerState::ForcedOpen
            ) {
                return Err(JobStoreError {
                    reason: "redis is down (its circuit breaker is open)".into(),
                });
            }
        }
        let tenant = &job.submitter.tenant;
        let mut conn = self.conn.clone();
        let submitter = serde_json::to_string(&job.submitter).map_err(|e| JobStoreError {
            reason: e.to_string(),
        })?;
        // Discovery first: a tenant listed with an empty stream costs a
        // worker one empty read; a stream nobody lists would be lost.
        let _: i64 = self
            .bounded(
                ::redis::cmd("SADD")
                    .arg(TENANTS)
                    .arg(tenant)
                    .query_async(&mut conn),
            )
            .await?;
        let mut call = self.submit.prepare_invoke();
        call.key(stream_key(tenant))
            .key(format!("{}{}", job_prefix(tenant), job.id))
            .key(idem_key(tenant, job.idempotency_key.as_deref()))
            .key(job_prefix(tenant))
            .arg(u8::from(job.idempotency_key.is_some()).to_string())
            .arg(max_queued)
            .arg(&job.id)
            .arg(&job.body)
            .arg(submitter)
            .arg(job.callback.as_deref().unwrap_or(""))
            .arg(job.traceparent.as_deref().unwrap_or(""))
            .arg(job.enqueued_at)
            // Queued jobs are kept as long as results: a job nobody can
            // process for a day is not worth keeping forever.
            .arg(u64::try_from(self_ttl_ms()).unwrap_or(u64::MAX));
        let reply: Vec<Value> = self.bounded(call.invoke_async(&mut conn)).await?;
        let code = reply.first().and_then(int);
        let id = reply.get(1).and_then(text).unwrap_or_default();
        match code {
            Some(0) => Ok(Submitted::Queued(id)),
            Some(1) => Ok(Submitted::Existing(id)),
            Some(2) => Ok(Submitted::Full),
            _ => Err(JobStoreError {
                reason: "unexpected submit reply".into(),
            }),
        }
    }

    async fn get(&self, tenant: &str, id: &str) -> Result<Option<JobView>, JobStoreError> {
        let mut conn = self.conn.clone();
        let key = format!("{}{id}", job_prefix(tenant));
        let fields: Vec<Option<String>> = self
            .bounded(
                ::redis::cmd("HMGET")
                    .arg(&key)
                    .arg(&[
                        "status",
                        "result",
                        "error",
                        "attempts",
                        "enqueued_at",
                        "started_at",
                        "finished_at",
                    ])
                    .query_async(&mut conn),
            )
            .await?;
        let get = |i: usize| fields.get(i).cloned().flatten();
        let Some(status) = get(0).as_deref().and_then(JobStatus::parse) else {
            return Ok(None);
        };
        let ms = |i: usize| get(i).and_then(|v| v.parse::<u64>().ok());
        Ok(Some(JobView {
            job_id: id.to_owned(),
            status,
            result: get(1).and_then(|r| serde_json::from_str(&r).ok()),
            error: get(2),
            attempts: get(3).and_then(|a| a.parse().ok()).unwrap_or(0),
            enqueued_at: super::rfc3339(ms(4).unwrap_or(0)),
            started_at: ms(5).map(super::rfc3339),
            finished_at: ms(6).map(super::rfc3339),
        }))
    }

    async fn tenants(&self) -> Result<Vec<String>, JobStoreError> {
        let mut conn = self.conn.clone();
        self.bounded(::redis::cmd("SMEMBERS").arg(TENANTS).query_async(&mut conn))
            .await
    }

    async fn next(&self, tenant: &str, consumer: &str) -> Result<Option<Delivery>, JobStoreError> {
        let mut conn = self.conn.clone();
        let reply: Value = self
            .bounded(
                ::redis::cmd("XREADGROUP")
                    .arg("GROUP")
                    .arg(GROUP)
                    .arg(consumer)
                    .arg("COUNT")
                    .arg(1)
                    .arg("STREAMS")
                    .arg(stream_key(tenant))
                    .arg(">")
                    .query_async(&mut conn),
            )
            .await?;
        // [[stream, [[id, [field, value]]]]] or nil
        let Value::Array(streams) = reply else {
            return Ok(None);
        };
        let Some(Value::Array(first)) = streams.first() else {
            return Ok(None);
        };
        let Some(entries) = first.get(1) else {
            return Ok(None);
        };
        Ok(Self::entries(entries, tenant).into_iter().next())
    }

    async fn reclaim(
        &self,
        tenant: &str,
        consumer: &str,
        idle: Duration,
    ) -> Result<Vec<Delivery>, JobStoreError> {
        let mut conn = self.conn.clone();
        let reply: Value = self
            .bounded(
                ::redis::cmd("XAUTOCLAIM")
                    .arg(stream_key(tenant))
                    .arg(GROUP)
                    .arg(consumer)
                    .arg(u64::try_from(idle.as_millis()).unwrap_or(u64::MAX))
                    .arg("0-0")
                    .arg("COUNT")
                    .arg(16)
                    .query_async(&mut conn),
            )
            .await?;
        // [next-cursor, [[id, fields]...], [deleted ids]]
        let Value::Array(parts) = reply else {
            return Ok(Vec::new());
        };
        Ok(parts
            .get(1)
            .map(|e| Self::entries(e, tenant))
            .unwrap_or_default())
    }

    async fn touch(&self, d: &Delivery, consumer: &str) -> Result<(), JobStoreError> {
        let mut conn = self.conn.clone();
        // Claiming an entry one already owns with min-idle 0 resets its
        // idle time; JUSTID leaves the delivery count alone.
        let _: Value = self
            .bounded(
                ::redis::cmd("XCLAIM")
                    .arg(stream_key(&d.tenant))
                    .arg(GROUP)
                    .arg(consumer)
                    .arg(0)
                    .arg(&d.handle)
                    .arg("JUSTID")
                    .query_async(&mut conn),
            )
            .await?;
        Ok(())
    }

    async fn start(&self, d: &Delivery, now: u64) -> Result<Option<Started>, JobStoreError> {
        let mut conn = self.conn.clone();
        let mut call = self.start.prepare_invoke();
        call.key(stream_key(&d.tenant))
            .key(format!("{}{}", job_prefix(&d.tenant), d.id))
            .arg(&d.handle)
            .arg(now);
        let reply: Vec<Value> = self.bounded(call.invoke_async(&mut conn)).await?;
        if reply.first().and_then(int) != Some(1) {
            return Ok(None);
        }
        let field = |i: usize| reply.get(i).and_then(text).filter(|s| !s.is_empty());
        let submitter: Submitter = field(3)
            .and_then(|s| serde_json::from_str(&s).ok())
            .ok_or_else(|| JobStoreError {
                reason: format!("job {} has no readable submitter", d.id),
            })?;
        Ok(Some(Started {
            attempts: reply
                .get(1)
                .and_then(int)
                .and_then(|a| u32::try_from(a).ok())
                .unwrap_or(1),
            body: field(2).unwrap_or_default(),
            submitter,
            callback: field(4),
            traceparent: field(5),
            enqueued_at: field(6).and_then(|v| v.parse().ok()).unwrap_or(0),
        }))
    }

    async fn finish(
        &self,
        d: &Delivery,
        outcome: &Outcome,
        now: u64,
        ttl: Duration,
    ) -> Result<(), JobStoreError> {
        let (status, field, value) = match outcome {
            Outcome::Succeeded(v) => (JobStatus::Succeeded, "result", v),
            Outcome::Failed(e) => (JobStatus::Failed, "error", e),
            Outcome::Dead(e) => (JobStatus::Dead, "error", e),
        };
        let mut conn = self.conn.clone();
        let mut call = self.finish.prepare_invoke();
        call.key(stream_key(&d.tenant))
            .key(format!("{}{}", job_prefix(&d.tenant), d.id))
            .arg(&d.handle)
            .arg(status.as_str())
            .arg(field)
            .arg(value)
            .arg(now)
            .arg(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX));
        let _: i64 = self.bounded(call.invoke_async(&mut conn)).await?;
        Ok(())
    }

    async fn requeue(&self, d: &Delivery, error: Option<&str>) -> Result<(), JobStoreError> {
        let mut conn = self.conn.clone();
        let mut call = self.requeue.prepare_invoke();
        call.key(stream_key(&d.tenant))
            .key(format!("{}{}", job_prefix(&d.tenant), d.id))
            .arg(&d.handle)
            .arg(&d.id)
            .arg(error.unwrap_or(""));
        let _: i64 = self.bounded(call.invoke_async(&mut conn)).await?;
        Ok(())
    }

    async fn depth(&self, tenant: &str) -> Result<(u64, Duration), JobStoreError> {
        let mut conn = self.conn.clone();
        let key = stream_key(tenant);
        let (len, first): (u64, Value) = self
            .bounded(
                ::redis::pipe()
                    .cmd("XLEN")
                    .arg(&key)
                    .cmd("XRANGE")
                    .arg(&key)
                    .arg("-")
                    .arg("+")
                    .arg("COUNT")
                    .arg(1)
                    .query_async(&mut conn),
            )
            .await?;
        // An entry id is `<ms>-<seq>`: the oldest entry's age from its id.
        let oldest = Self::entries(&first, tenant)
            .first()
            .and_then(|d| d.handle.split('-').next()?.parse::<u64>().ok())
            .map_or(Duration::ZERO, |ms| {
                Duration::from_millis(super::now_ms().saturating_sub(ms))
            });
        Ok((len, oldest))
    }
}

/// How long a queued job's record is kept: a week, well past any backlog
/// a tenant's `max_queued_jobs` allows at any sane rate.
fn self_ttl_ms() -> u128 {
    Duration::from_secs(7 * 24 * 3600).as_millis()
}
