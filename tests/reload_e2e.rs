//! Live reload end to end: a real levee process on a real redis-server,
//! its config file rewritten and re-read by SIGHUP or `POST /admin/reload`.

mod support;

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use levee::identity::hash_key;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use support::levee::{signal, Levee};
use support::redis::RedisServer;
use tokio::time::Instant;

const ADMIN: &str = "reload-admin-token";

/// One API key: (raw key, id, tenant).
type Key<'a> = (&'a str, &'a str, &'a str);

/// A config with these keys, each tenant limited to `limit` requests a
/// minute (sliding log, in Redis).
fn config(redis: &RedisServer, keys: &[Key<'_>], limit: u64, extra: &str) -> String {
    let mut text = format!(
        "[redis]\nurl = \"{}\"\n\n[ratelimit]\nstore = \"redis\"\n\n\
         [ratelimit.tiers.TENANT]\nlimits = [{{ limit = 100000, window = \"1m\" }}]\n\n",
        redis.url()
    );
    let mut tenants: Vec<&str> = keys.iter().map(|k| k.2).collect();
    tenants.sort_unstable();
    tenants.dedup();
    for t in tenants {
        let _ = write!(
            text,
            "[ratelimit.tenants.{t}]\nlimits = [{{ limit = {limit}, window = \"1m\" }}]\n\n"
        );
    }
    for (raw, id, tenant) in keys {
        let _ = write!(
            text,
            "[[identity.api_keys]]\nid = \"{id}\"\nsha256 = \"{}\"\ntenant = \"{tenant}\"\ntier = \"TENANT\"\n\n",
            hash_key(raw)
        );
    }
    text.push_str(extra);
    text
}

async fn start(text: &str) -> Levee {
    Levee::builder()
        .config_text(text)
        .env("LEVEE_ADMIN_TOKEN", ADMIN)
        .start()
        .await
}

fn rewrite(levee: &Levee, text: &str) {
    let path = levee.config_path.as_ref().expect("started with a file");
    // Write then rename: a reader never sees a half-written file.
    let tmp = path.with_extension("toml.new");
    std::fs::write(&tmp, text).expect("write config");
    std::fs::rename(&tmp, path).expect("replace config");
}

async fn chat(client: &reqwest::Client, levee: &Levee, key: &str) -> u16 {
    client
        .post(format!("{}/v1/chat", levee.url()))
        .header("x-api-key", key)
        .json(&json!({ "message": "How many days of PTO do I get?", "user_id": "u1", "thread_id": "t1" }))
        .send()
        .await
        .map_or(0, |r| r.status().as_u16())
}

async fn admin(client: &reqwest::Client, levee: &Levee, method: &str, path: &str) -> (u16, Value) {
    let url = format!("{}{path}", levee.url());
    let req = match method {
        "POST" => client.post(url),
        _ => client.get(url),
    };
    let resp = req.bearer_auth(ADMIN).send().await.expect("admin call");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Polls `chat` until it answers `want`, up to `limit`; returns how long
/// that took.
async fn until_status(
    client: &reqwest::Client,
    levee: &Levee,
    key: &str,
    want: u16,
    limit: Duration,
) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if chat(client, levee, key).await == want {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

async fn metric(client: &reqwest::Client, levee: &Levee, name: &str) -> f64 {
    let text = client
        .get(format!("{}/metrics", levee.url()))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics body");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(f64::NAN)
}

#[tokio::test]
async fn a_key_added_answers_within_a_second_of_sighup_and_a_removed_key_is_401() {
    let redis = RedisServer::start().await;
    let a: Key<'_> = ("key-alpha-1111", "alpha", "acme");
    let b: Key<'_> = ("key-bravo-2222", "bravo", "globex");
    let levee = start(&config(&redis, &[a], 1000, "")).await;
    let client = reqwest::Client::new();
    assert_eq!(chat(&client, &levee, a.0).await, 200);
    assert_eq!(
        chat(&client, &levee, b.0).await,
        401,
        "b is not registered yet"
    );

    rewrite(&levee, &config(&redis, &[a, b], 1000, ""));
    signal(levee.pid(), "HUP");
    let took = until_status(&client, &levee, b.0, 200, Duration::from_secs(5)).await;
    let took = took.expect("the added key never answered 200");
    eprintln!("added key answered 200 {took:?} after SIGHUP");
    assert!(
        took < Duration::from_secs(1),
        "added key answered 200 only after {took:?}"
    );

    rewrite(&levee, &config(&redis, &[b], 1000, ""));
    signal(levee.pid(), "HUP");
    let took = until_status(&client, &levee, a.0, 401, Duration::from_secs(5)).await;
    let took = took.expect("the removed key kept answering");
    eprintln!("removed key answered 401 {took:?} after SIGHUP");
    assert!(
        took < Duration::from_secs(1),
        "removed key refused only after {took:?}"
    );
    assert_eq!(
        chat(&client, &levee, b.0).await,
        200,
        "the kept key still works"
    );
    assert_eq!(
        metric(&client, &levee, "levee_config_reloads_total").await,
        2.0
    );
}

#[tokio::test]
async fn a_tenants_new_limit_applies_to_its_next_request_and_counters_carry_on() {
    let redis = RedisServer::start().await;
    let a: Key<'_> = ("key-alpha-1111", "alpha", "acme");
    let levee = start(&config(&redis, &[a], 10, "")).await;
    let client = reqwest::Client::new();
    for i in 0..4 {
        assert_eq!(chat(&client, &levee, a.0).await, 200, "request {i}");
    }

    // 4 used: a limit of 3 refuses the very next request.
    rewrite(&levee, &config(&redis, &[a], 3, ""));
    let (status, body) = admin(&client, &levee, "POST", "/admin/reload").await;
    assert_eq!(status, 200, "{body}");
    let applied = body["reload"]["applied"].to_string();
    assert!(applied.contains("ratelimit.tenants.acme.limits"), "{body}");
    assert_eq!(
        chat(&client, &levee, a.0).await,
        429,
        "the lower limit binds at once"
    );

    // Raised to 6: the Redis counters carried on, so exactly 2 more fit.
    rewrite(&levee, &config(&redis, &[a], 6, ""));
    let (status, body) = admin(&client, &levee, "POST", "/admin/reload").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(chat(&client, &levee, a.0).await, 200);
    assert_eq!(chat(&client, &levee, a.0).await, 200);
    assert_eq!(
        chat(&client, &levee, a.0).await,
        429,
        "4 + 2 = the new limit of 6"
    );
}

#[tokio::test]
async fn a_broken_file_leaves_the_old_config_serving_and_names_the_key() {
    let redis = RedisServer::start().await;
    let a: Key<'_> = ("key-alpha-1111", "alpha", "acme");
    let b: Key<'_> = ("key-bravo-2222", "bravo", "globex");
    let good = config(&redis, &[a], 1000, "");
    let levee = start(&good).await;
    let client = reqwest::Client::new();
    let (_, before) = admin(&client, &levee, "GET", "/admin/config").await;
    let file_sha = hex::encode(Sha256::digest(good.as_bytes()));
    assert_eq!(before["sha256"], json!(file_sha), "{before}");
    assert!(before["loaded_at"]
        .as_str()
        .is_some_and(|t| t.ends_with('Z')));

    // A valid TOML file with one bad value, and a key that would be new:
    // nothing of it may apply.
    let bad = config(&redis, &[a, b], 0, "");
    rewrite(&levee, &bad);
    let (status, body) = admin(&client, &levee, "POST", "/admin/reload").await;
    assert_eq!(status, 422, "{body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("ratelimit.tenants.acme.limits[0].limit") && message.contains('0'),
        "the error must name the key and value: {message}"
    );
    assert_eq!(body["error"], "config_invalid");
    // Not TOML at all, by SIGHUP: refused, and the process lives on.
    rewrite(&levee, "[server\nlisten = ");
    signal(levee.pid(), "HUP");
    let deadline = Instant::now() + Duration::from_secs(5);
    while metric(&client, &levee, "levee_config_reload_failures_total").await < 2.0 {
        assert!(
            Instant::now() < deadline,
            "the SIGHUP reload failure was not counted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        metric(&client, &levee, "levee_config_last_reload_successful").await,
        0.0
    );
    assert_eq!(
        chat(&client, &levee, a.0).await,
        200,
        "old key still served"
    );
    assert_eq!(
        chat(&client, &levee, b.0).await,
        401,
        "the bad file's key never applied"
    );
    let (_, after) = admin(&client, &levee, "GET", "/admin/config").await;
    assert_eq!(
        after["sha256"], before["sha256"],
        "the running file is unchanged"
    );
    assert_eq!(after["reloads"], 0);

    // A setting that cannot change live is reported and kept.
    let moved = config(&redis, &[a, b], 1000, "[server]\nmax_body_bytes = 12345\n");
    rewrite(&levee, &moved);
    let (status, body) = admin(&client, &levee, "POST", "/admin/reload").await;
    assert_eq!(status, 200, "{body}");
    let restart = body["reload"]["restart_required"].to_string();
    assert!(restart.contains("server.max_body_bytes"), "{body}");
    assert_eq!(
        chat(&client, &levee, b.0).await,
        200,
        "the live part applied"
    );
    let (_, view) = admin(&client, &levee, "GET", "/admin/config").await;
    assert_eq!(
        view["config"]["server"]["max_body_bytes"],
        json!(65536),
        "kept"
    );
    assert_eq!(
        view["sha256"],
        json!(hex::encode(Sha256::digest(moved.as_bytes())))
    );
    // Secrets never shown: no key hash in the view.
    let shown = view.to_string();
    assert!(
        !shown.contains(&hash_key(a.0)) && !shown.contains(&hash_key(b.0)),
        "{shown}"
    );

    // Without the admin token: 401, and nothing reloads.
    let resp = client
        .post(format!("{}/admin/reload", levee.url()))
        .send()
        .await
        .expect("reload");
    assert_eq!(resp.status().as_u16(), 401);
}

#[tokio::test]
async fn thirty_seconds_of_load_through_twenty_reloads_fails_no_request() {
    let redis = RedisServer::start().await;
    let keys: [Key<'_>; 4] = [
        ("key-alpha-1111", "alpha", "acme"),
        ("key-bravo-2222", "bravo", "globex"),
        ("key-charlie-33", "charlie", "initech"),
        ("key-delta-4444", "delta", "acme"),
    ];
    let spare: Key<'_> = ("key-spare-5555", "spare", "umbrella");
    let base = |with_spare: bool, limit: u64| {
        let mut k = keys.to_vec();
        if with_spare {
            k.push(spare);
        }
        config(&redis, &k, limit, "")
    };
    let levee = Arc::new(start(&base(false, 1_000_000)).await);
    let run_for = Duration::from_secs(30);
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut load = Vec::new();
    for worker in 0..8 {
        let (levee, ok, failed) = (levee.clone(), ok.clone(), failed.clone());
        let key = keys[worker % keys.len()].0;
        load.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            while started.elapsed() < run_for {
                match chat(&client, &levee, key).await {
                    200 => ok.fetch_add(1, Ordering::Relaxed),
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    let client = reqwest::Client::new();
    let mut reloads = 0;
    for i in 0..20u64 {
        tokio::time::sleep(run_for / 22).await;
        // Alternate: a spare key in and out, the limits tuned, SIGHUP and
        // the admin API.
        rewrite(&levee, &base(i % 2 == 0, 1_000_000 + i));
        if i % 2 == 0 {
            signal(levee.pid(), "HUP");
        } else {
            let (status, body) = admin(&client, &levee, "POST", "/admin/reload").await;
            assert_eq!(status, 200, "{body}");
        }
        reloads += 1;
    }
    for task in load {
        task.await.expect("load task");
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while metric(&client, &levee, "levee_config_reloads_total").await < f64::from(reloads) {
        assert!(Instant::now() < deadline, "not every reload was applied");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    eprintln!("load through {reloads} reloads: {ok} ok, {failed} failed");
    assert!(ok > 100, "too little load to mean anything: {ok}");
    assert_eq!(failed, 0, "{failed} of {} requests failed", ok + failed);
    assert_eq!(
        metric(&client, &levee, "levee_config_reload_failures_total").await,
        0.0
    );
}
