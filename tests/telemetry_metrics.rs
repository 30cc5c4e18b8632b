//! Metrics end to end. After a short load with 200s, 429s and an upstream
//! failure: `/metrics` passes `promtool check metrics`, parses as the
//! Prometheus text format, has every family the README documents and counts
//! what happened; a real Prometheus scraping levee accepts every query of
//! every dashboard in `dashboards/` (and the core panels have data); every
//! shipped Prometheus config passes `promtool check config`.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use levee_chaos::sim::{self, SimConfig, SimHandle};
use prometheus_parse::{Scrape, Value as PromValue};
use serde_json::json;
use sha2::{Digest, Sha256};
use support::levee::Levee;
use support::prometheus::{self as prom, promtool, Prometheus};

/// Every family documented in the README's metrics reference.
const FAMILIES: &[&str] = &[
    "levee_http_requests_total",
    "levee_http_request_duration_seconds",
    "levee_ratelimit_decisions_total",
    "levee_ratelimit_tenant_decisions_total",
    "levee_ratelimit_store_duration_seconds",
    "levee_ratelimit_store_errors_total",
    "levee_breaker_state",
    "levee_breaker_transitions_total",
    "levee_breaker_calls_total",
    "levee_bulkhead_rejections_total",
    "levee_retries_total",
    "levee_retry_budget_exhausted_total",
    "levee_upstream_duration_seconds",
    "levee_llm_tokens_total",
    "levee_config_reloads_total",
    "levee_config_reload_failures_total",
    "levee_config_last_reload_successful",
    "levee_config_loaded_timestamp_seconds",
];

const KEY: &str = "acme_key_for_metrics_test";

/// One key of tenant `acme` (API_KEY tier: 4/min); anonymous loopback
/// callers get 100/min plus a 1/min shadow limit.
fn config() -> String {
    let sha = hex::encode(Sha256::digest(KEY.as_bytes()));
    format!(
        r#"
[[identity.api_keys]]
id = "acme-key"
sha256 = "{sha}"
tenant = "acme"
tier = "API_KEY"

[ratelimit.tiers.API_KEY]
limits = [{{ limit = 4, window = "1m" }}]

[ratelimit.tiers.PUBLIC_IP]
limits = [{{ limit = 100, window = "1m" }}, {{ limit = 1, window = "1m", shadow = true }}]

[ratelimit.tenants.acme]
tokens_per_minute = 100000
"#
    )
}

async fn chat(levee: &Levee, key: Option<&str>) -> u16 {
    let mut req = reqwest::Client::new()
        .post(format!("{}/v1/chat", levee.url()))
        .json(&json!({"message": "What is the PTO policy?", "user_id": "u1", "thread_id": "t1"}));
    if let Some(k) = key {
        req = req.header("X-API-Key", k);
    }
    req.send().await.expect("chat").status().as_u16()
}

async fn set_faults(sim: &SimHandle, faults: Option<serde_json::Value>) {
    let c = reqwest::Client::new();
    let url = format!("{}/_faults", sim.base_url());
    let req = match faults {
        Some(f) => c.post(url).json(&f),
        None => c.delete(url),
    };
    assert!(req.send().await.expect("faults").status().is_success());
}

/// The value of the one sample of `metric` whose labels include `labels`
/// (for a histogram: its observation count).
fn value(scrape: &Scrape, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == metric)
        .find(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match &s.value {
            PromValue::Counter(v) | PromValue::Gauge(v) | PromValue::Untyped(v) => *v,
            PromValue::Histogram(buckets) => buckets
                .iter()
                .find(|b| b.less_than.is_infinite())
                .map_or(0.0, |b| b.count),
            PromValue::Summary(_) => f64::NAN,
        })
}

/// Drives the load every metrics test relies on; returns the statuses.
async fn mixed_load(levee: &Levee, sim: &SimHandle) -> Vec<u16> {
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(chat(levee, Some(KEY)).await);
    }
    set_faults(
        sim,
        Some(json!({"error_rate": 1.0, "error_status": 500, "target": "chat"})),
    )
    .await;
    statuses.push(chat(levee, Some(KEY)).await);
    set_faults(sim, None).await;
    for _ in 0..2 {
        statuses.push(chat(levee, Some(KEY)).await);
    }
    for _ in 0..2 {
        statuses.push(chat(levee, None).await);
    }
    statuses
}

async fn start() -> (SimHandle, Levee) {
    let sim = sim::spawn(SimConfig::default()).await.expect("spawn sim");
    let levee = Levee::builder()
        .config_text(&config())
        .env("LEVEE_LLM_URL", format!("{}/v1", sim.base_url()))
        .env("LEVEE_VECTOR_STORE_URL", sim.base_url())
        .start()
        .await;
    (sim, levee)
}

#[tokio::test]
async fn metrics_parse_and_count_every_documented_family_after_mixed_load() {
    let (sim, levee) = start().await;
    let statuses = mixed_load(&levee, &sim).await;
    assert_eq!(statuses[..3], [200, 200, 200]);
    assert!(statuses[3] >= 500, "upstream failure: {statuses:?}");
    assert_eq!(statuses[4..], [429, 429, 200, 200]);

    let resp = reqwest::get(format!("{}/metrics", levee.url()))
        .await
        .expect("scrape");
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    assert!(
        !resp.headers().contains_key("x-ratelimit-limit"),
        "/metrics is exempt"
    );
    let text = resp.text().await.expect("body");

    // promtool is a strict consumer: format and naming lints.
    let (ok, out) = promtool(&["check", "metrics"], Some(&text));
    assert!(ok, "promtool check metrics:\n{out}");

    let scrape = Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).expect("text format");
    for family in FAMILIES {
        assert!(scrape.docs.contains_key(*family), "{family} has no HELP");
        assert!(
            scrape.samples.iter().any(|s| s.metric == *family),
            "{family} has no sample"
        );
    }
    assert!(
        scrape
            .samples
            .iter()
            .all(|s| s.metric.starts_with("levee_")),
        "only levee_ families"
    );

    let chat_route = ("route", "/v1/chat");
    let v = |metric: &str, labels: &[(&str, &str)]| value(&scrape, metric, labels);
    let req = "levee_http_requests_total";
    assert_eq!(
        v(
            req,
            &[
                chat_route,
                ("status", "200"),
                ("tier", "API_KEY"),
                ("method", "POST")
            ]
        ),
        Some(3.0)
    );
    assert_eq!(
        v(req, &[chat_route, ("status", "429"), ("tier", "API_KEY")]),
        Some(2.0)
    );
    assert_eq!(
        v(req, &[chat_route, ("status", "200"), ("tier", "PUBLIC_IP")]),
        Some(2.0)
    );
    assert_eq!(
        v(
            "levee_http_request_duration_seconds",
            &[chat_route, ("status", "429")]
        ),
        Some(2.0)
    );

    let dec = "levee_ratelimit_decisions_total";
    let identity = ("layer", "identity");
    assert_eq!(
        v(
            dec,
            &[identity, ("tier", "API_KEY"), ("decision", "allowed")]
        ),
        Some(4.0)
    );
    assert_eq!(
        v(
            dec,
            &[identity, ("tier", "API_KEY"), ("decision", "limited")]
        ),
        Some(2.0)
    );
    let network = ("layer", "network");
    assert_eq!(
        v(
            dec,
            &[network, ("tier", "PUBLIC_IP"), ("decision", "allowed")]
        ),
        Some(1.0)
    );
    assert_eq!(
        v(
            dec,
            &[
                network,
                ("tier", "PUBLIC_IP"),
                ("decision", "shadow_limited")
            ]
        ),
        Some(1.0)
    );
    assert_eq!(
        v(dec, &[("layer", "tokens"), ("decision", "allowed")]),
        Some(4.0)
    );

    let tenant = "levee_ratelimit_tenant_decisions_total";
    assert_eq!(
        v(tenant, &[("tenant", "acme"), ("decision", "allowed")]),
        Some(4.0)
    );
    assert_eq!(
        v(tenant, &[("tenant", "acme"), ("decision", "limited")]),
        Some(2.0)
    );

    // 6 admissions + 4 token reservations + 3 settlements, none failed.
    let store_calls = v(
        "levee_ratelimit_store_duration_seconds",
        &[("store", "memory")],
    );
    assert!(store_calls >= Some(10.0), "{store_calls:?}");
    assert_eq!(
        v("levee_ratelimit_store_errors_total", &[("store", "memory")]),
        Some(0.0)
    );

    let up = "levee_upstream_duration_seconds";
    assert!(v(up, &[("dependency", "llm"), ("outcome", "error")]) >= Some(1.0));
    // 5 answers: 5 completions and 5 query embeddings, all from the LLM.
    assert!(v(up, &[("dependency", "llm"), ("outcome", "success")]) >= Some(10.0));
    assert!(
        v(
            up,
            &[("dependency", "vector_store"), ("outcome", "success")]
        ) >= Some(5.0)
    );

    let tokens = "levee_llm_tokens_total";
    assert!(v(tokens, &[("tenant", "acme"), ("kind", "prompt")]) > Some(0.0));
    assert!(v(tokens, &[("tenant", "acme"), ("kind", "completion")]) > Some(0.0));
    // Anonymous callers' tenant is not configured: `other`.
    assert!(v(tokens, &[("tenant", "other"), ("kind", "prompt")]) > Some(0.0));
    assert_eq!(
        v(
            "levee_breaker_state",
            &[("dependency", "llm"), ("state", "closed")]
        )
        .map(|s| s
            + v(
                "levee_breaker_state",
                &[("dependency", "llm"), ("state", "open")]
            )
            .unwrap_or(0.0)
            + v(
                "levee_breaker_state",
                &[("dependency", "llm"), ("state", "half_open")]
            )
            .unwrap_or(0.0)),
        Some(1.0),
        "exactly one current breaker state"
    );
    // The key never appears; only its id could (and ids are not labels).
    assert!(!text.contains(KEY));
}

fn repo_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// Every dashboard JSON in `dashboards/`, with its file name.
fn dashboards() -> Vec<(String, serde_json::Value)> {
    let mut out: Vec<(String, serde_json::Value)> = std::fs::read_dir(repo_path("dashboards"))
        .expect("dashboards/")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("read dashboard");
            let json = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{} is not JSON: {e}", p.display()));
            (
                p.file_name().expect("name").to_string_lossy().into_owned(),
                json,
            )
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Panels, including those nested in rows.
fn panels(dashboard: &serde_json::Value) -> Vec<&serde_json::Value> {
    let mut out = Vec::new();
    let mut stack: Vec<&serde_json::Value> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .collect();
    while let Some(p) = stack.pop() {
        if let Some(nested) = p["panels"].as_array() {
            stack.extend(nested);
        }
        if p["type"] != "row" {
            out.push(p);
        }
    }
    out
}

/// Grafana's variables as Prometheus sees them: `$__rate_interval` → 1m,
/// template variables → the match-all regex.
fn substitute(expr: &str, variables: &[String]) -> String {
    let mut e = expr
        .replace("$__rate_interval", "1m")
        .replace("${__rate_interval}", "1m")
        .replace("$__interval", "1m")
        .replace("$__range", "1h");
    for v in variables {
        e = e
            .replace(&format!("${{{v}}}"), ".*")
            .replace(&format!("${v}"), ".*");
    }
    assert!(!e.contains('$'), "unsubstituted variable in {e}");
    e
}

#[test]
fn dashboards_select_prometheus_through_the_datasource_variable() {
    let all = dashboards();
    assert_eq!(
        all.len(),
        4,
        "{:?}",
        all.iter().map(|d| &d.0).collect::<Vec<_>>()
    );
    let mut uids = Vec::new();
    for (file, d) in &all {
        let vars = d["templating"]["list"].as_array().expect("templating");
        assert!(
            vars.iter().any(|v| v["name"] == "datasource"
                && v["type"] == "datasource"
                && v["query"] == "prometheus"),
            "{file}: no `datasource` variable"
        );
        uids.push(d["uid"].as_str().expect("uid").to_owned());
        let mut ids = Vec::new();
        for p in panels(d) {
            let title = p["title"].as_str().unwrap_or("?");
            assert_eq!(p["datasource"]["uid"], "${datasource}", "{file}: {title}");
            ids.push(p["id"].as_u64().expect("panel id"));
            let targets = p["targets"].as_array().expect("targets");
            assert!(!targets.is_empty(), "{file}: {title} has no query");
            for t in targets {
                assert_eq!(t["datasource"]["uid"], "${datasource}", "{file}: {title}");
                assert!(
                    t["expr"].as_str().is_some_and(|e| e.contains("levee_")),
                    "{file}: {title}"
                );
            }
        }
        let n = ids.len();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), n, "{file}: panel ids are unique");
    }
    uids.sort();
    uids.dedup();
    assert_eq!(uids.len(), all.len(), "dashboard uids are unique");
    for f in [
        "dashboards/provisioning/datasources/prometheus.yaml",
        "dashboards/provisioning/dashboards/levee.yaml",
    ] {
        let text = std::fs::read_to_string(repo_path(f)).expect(f);
        assert!(text.contains("apiVersion: 1"), "{f}");
    }
}

#[test]
fn shipped_prometheus_configs_pass_promtool() {
    prom::check_config(&repo_path("otel/prometheus.yml"));
}

#[tokio::test]
async fn every_dashboard_query_runs_on_a_real_prometheus_scraping_levee() {
    let (sim, levee) = start().await;
    let prometheus = Prometheus::start(&[format!("127.0.0.1:{}", levee.port)]).await;
    prom::check_config(&prometheus.config_path());
    mixed_load(&levee, &sim).await;
    prometheus.wait_scraped(3, Duration::from_secs(20)).await;
    // Keep traffic flowing across a few scrapes so rates are not zero.
    for _ in 0..4 {
        chat(&levee, None).await;
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;

    let core = [
        "Requests per second by status",
        "Latency p50 / p95 / p99",
        "Decisions by tier and layer",
    ];
    let mut seen_core = Vec::new();
    let mut queries = 0;
    for (file, d) in dashboards() {
        let vars: Vec<String> = d["templating"]["list"]
            .as_array()
            .expect("templating")
            .iter()
            .filter_map(|v| v["name"].as_str().map(str::to_owned))
            .collect();
        // Template variable queries: label_values(metric, label).
        for v in d["templating"]["list"].as_array().expect("templating") {
            let Some(def) = v["definition"].as_str() else {
                continue;
            };
            let inner = def
                .strip_prefix("label_values(")
                .and_then(|s| s.strip_suffix(')'))
                .unwrap_or_else(|| panic!("{file}: unsupported variable query {def}"));
            let (metric, label) = inner.split_once(',').expect("label_values(metric, label)");
            let q = format!("count by ({}) ({})", label.trim(), metric.trim());
            let answer = prometheus.query(&q).await;
            assert_eq!(answer["status"], "success", "{file}: {q}: {answer}");
            assert!(
                !answer["data"]["result"]
                    .as_array()
                    .expect("result")
                    .is_empty(),
                "{file}: variable {} has no values ({q})",
                v["name"]
            );
        }
        for p in panels(&d) {
            let title = p["title"].as_str().unwrap_or("?").to_owned();
            for t in p["targets"].as_array().expect("targets") {
                let expr = substitute(t["expr"].as_str().expect("expr"), &vars);
                let answer = prometheus.query(&expr).await;
                queries += 1;
                assert_eq!(
                    answer["status"], "success",
                    "{file}: {title}: {expr}: {answer}"
                );
                if core.contains(&title.as_str()) {
                    let result = answer["data"]["result"].as_array().expect("result");
                    assert!(!result.is_empty(), "{file}: {title}: no data for {expr}");
                    seen_core.push(title.clone());
                }
            }
        }
    }
    assert!(queries >= 25, "{queries} queries");
    for c in core {
        assert!(seen_core.iter().any(|s| s == c), "core panel {c:?} missing");
    }
    // The request rate is real traffic, not just a defined series.
    let rps = prometheus
        .query("sum(rate(levee_http_requests_total{route=\"/v1/chat\"}[1m]))")
        .await;
    let v: f64 = rps["data"]["result"][0]["value"][1]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("a rate");
    assert!(v > 0.0, "{rps}");
}
