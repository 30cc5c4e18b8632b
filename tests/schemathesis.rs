//! The OpenAPI document against the running gateway: the schemathesis CLI
//! (pinned in `tests/sdk/requirements.txt`, run from the venv
//! `scripts/test.sh` exports as `LEVEE_TEST_PYTHON`) reads
//! `/openapi.json` from a real levee process (a real redis-server behind
//! its limits, memory and job queues; a `levee-upstream-sim` process as
//! its LLM and deployment) and sends generated requests, valid and
//! invalid, to `/v1/chat`, `/v1/chat/completions`, `/v1/jobs`,
//! `/v1/jobs/{id}`, `/health` and `/ready`, with every check it has
//! (no 5xx, every status / content type / header / body as documented,
//! invalid input refused, valid input accepted, auth enforced …). The test
//! holds when schemathesis exits 0 and its NDJSON event report shows test
//! cases run on every one of those operations, with no failed check.
//!
//! Traffic goes to 127.0.0.1 only: job callbacks are pinned to the
//! simulator's address, and the run is bounded in examples and time.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use levee::identity::hash_key;
use serde_json::Value;
use support::bounded;
use support::levee::Levee;
use support::redis::RedisServer;
use support::sim::Sim;
use tokio::process::Command;

/// The API key schemathesis authenticates with (a generous tier, so it
/// does not spend its examples on 429s).
const KEY: &str = "schemathesis_key";
/// The model the gateway serves (from the simulator).
const MODEL: &str = "gpt-4o-mini";
/// Test cases per operation and phase.
const MAX_EXAMPLES: u32 = 50;
/// Longest the schemathesis run may take; it is killed past this.
const RUN_LIMIT: Duration = Duration::from_secs(100);
/// The operations the run must have exercised, as schemathesis labels
/// them.
const OPERATIONS: [&str; 6] = [
    "POST /v1/chat",
    "POST /v1/chat/completions",
    "POST /v1/jobs",
    "GET /v1/jobs/{id}",
    "GET /health",
    "GET /ready",
];
/// Checks that must have run (schemathesis runs all of its checks).
const REQUIRED_CHECKS: [&str; 4] = [
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
];

/// The venv's `schemathesis`, next to `LEVEE_TEST_PYTHON`; never skipped.
fn schemathesis() -> PathBuf {
    let python = std::env::var_os("LEVEE_TEST_PYTHON")
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| {
            panic!(
                "LEVEE_TEST_PYTHON is unset: run ./scripts/test.sh --test schemathesis \
                 (it builds the Python venv of tests/sdk/requirements.txt, schemathesis \
                 included, and exports its python)"
            )
        });
    let bin = Path::new(&python)
        .parent()
        .expect("LEVEE_TEST_PYTHON is a path to the venv's python")
        .join("schemathesis");
    assert!(
        bin.exists(),
        "{} is missing: the venv predates the schemathesis pin; rerun ./scripts/test.sh",
        bin.display()
    );
    bin
}

fn levee_config(sim: &Sim) -> String {
    format!(
        r#"
[llm]
url = "{v1}"

[[llm.models]]
name = "{MODEL}"
[[llm.models.deployments]]
url = "{v1}"

[[identity.api_keys]]
id = "schemathesis"
sha256 = "{hash}"
tenant = "acme"
tier = "FUZZ"

[ratelimit.tiers.FUZZ]
limits = [{{ limit = 1000000, window = "1m" }}]

[ratelimit.tiers.PUBLIC_IP]
limits = [{{ limit = 1000000, window = "1m" }}]

[ratelimit.tiers.INTERNAL_IP]
limits = [{{ limit = 1000000, window = "1m" }}]
"#,
        v1 = format!("{}/v1", sim.url),
        hash = hash_key(KEY),
    )
}

/// schemathesis.toml: realistic values where random ones would only ever
/// meet a 404 or a deployment's own 400, and the job callback pinned to
/// loopback (the simulator answers it 404; no traffic leaves the machine).
fn schemathesis_config(sim: &Sim) -> String {
    format!(
        r#"
[dictionaries.models]
values = ["{MODEL}"]

[dictionaries.roles]
values = ["user"]

[dictionaries.prefer]
values = ["respond-async"]

[parameters]
"header.Callback-Url" = "{sim}/callback"
"header.Prefer" = {{ dictionary = "prefer", probability = 0.3 }}
"body.model" = {{ dictionary = "models", probability = 0.9 }}
"body.messages[*].role" = {{ dictionary = "roles", probability = 0.8 }}

# The body passes through to the deployment, whose own rules the gateway
# does not repeat (the simulator wants the last message from `user`): a
# schema-valid body may get the deployment's documented 400.
[[operations]]
include-path = "/v1/chat/completions"
checks.positive_data_acceptance.enabled = false

# `Idempotency-Key` is only read with `respond-async`; one fixed key keeps
# the synchronous chats from being judged on a header they ignore.
[[operations]]
include-path = "/v1/chat"
parameters = {{ "header.Idempotency-Key" = "schemathesis-chat" }}
"#,
        sim = sim.url,
    )
}

/// What the NDJSON report says: test cases per operation, and per check
/// the (passed, failed) counts.
#[derive(Debug, Default)]
struct Figures {
    cases: BTreeMap<String, u64>,
    checks: BTreeMap<String, (u64, u64)>,
}

fn figures(ndjson: &str) -> Figures {
    let mut out = Figures::default();
    for line in ndjson.lines().filter(|l| !l.trim().is_empty()) {
        let event: Value = serde_json::from_str(line).expect("NDJSON line");
        let Some(finished) = event.get("ScenarioFinished") else {
            continue;
        };
        let recorder = &finished["recorder"];
        let label = recorder["label"].as_str().unwrap_or_default().to_owned();
        let cases = recorder["cases"].as_object().map_or(0, |c| c.len() as u64);
        *out.cases.entry(label).or_default() += cases;
        for results in recorder["checks"]
            .as_object()
            .into_iter()
            .flat_map(|c| c.values())
        {
            for check in results.as_array().into_iter().flatten() {
                let name = check["name"].as_str().unwrap_or_default().to_owned();
                let entry = out.checks.entry(name).or_default();
                if check["status"] == "success" {
                    entry.0 += 1;
                } else {
                    entry.1 += 1;
                }
            }
        }
    }
    out
}

#[tokio::test]
#[allow(clippy::print_stdout)]
async fn schemathesis_finds_no_server_error_and_no_schema_violation() {
    let bin = schemathesis();
    let redis = RedisServer::start().await;
    let sim = Sim::start().await;
    let levee = Levee::builder()
        .config_text(&levee_config(&sim))
        .env("LEVEE_REDIS_URL", redis.url())
        .start()
        .await;
    let dir = std::env::temp_dir().join(format!("levee-schemathesis-{}", levee.port));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("report dir");
    let config = dir.join("schemathesis.toml");
    std::fs::write(&config, schemathesis_config(&sim)).expect("write schemathesis.toml");
    let ndjson = dir.join("events.ndjson");
    let junit = dir.join("junit.xml");

    let mut cmd = Command::new(&bin);
    cmd.arg("--config-file")
        .arg(&config)
        .arg("run")
        .arg(format!("{}/openapi.json", levee.url()))
        .args(["--header", &format!("X-API-Key: {KEY}")])
        .args(["--max-examples", &MAX_EXAMPLES.to_string()])
        .args(["--seed", "1"])
        .args(["--generation-database", "none"])
        // One worker: two race in Hypothesis's lambda-description cache
        // (a spurious "Inconsistent results" error), and 2 cores are few.
        .args(["--workers", "1"])
        .args(["--request-timeout", "10"])
        .args(["--no-color", "--report", "junit,ndjson"])
        .arg("--report-ndjson-path")
        .arg(&ndjson)
        .arg("--report-junit-path")
        .arg(&junit);
    for op in OPERATIONS {
        let path = op.split_once(' ').map_or(op, |(_, p)| p);
        cmd.args(["--include-path", path]);
    }
    let command = format!("{cmd:?}");
    let run = bounded::run(
        cmd.current_dir(&dir).env("PYTHONDONTWRITEBYTECODE", "1"),
        RUN_LIMIT,
    )
    .await;
    let (status, took, stdout, stderr) = (run.status, run.took, run.stdout, run.stderr);
    println!("--- {command}\n--- schemathesis ({took:.2?})\n{stdout}\n{stderr}");
    let status = status.unwrap_or_else(|| {
        panic!("schemathesis did not finish within {RUN_LIMIT:?}\n{stdout}\n{stderr}")
    });
    assert!(
        status.success(),
        "schemathesis found problems ({status})\n{stdout}\n{stderr}"
    );

    let report = std::fs::read_to_string(&ndjson).expect("schemathesis wrote its NDJSON report");
    let figures = figures(&report);
    println!("test cases per operation: {:?}", figures.cases);
    println!("checks (passed, failed): {:?}", figures.checks);
    for op in OPERATIONS {
        let n = figures.cases.get(op).copied().unwrap_or(0);
        assert!(n > 0, "no test case ran on {op}: {:?}", figures.cases);
    }
    for check in REQUIRED_CHECKS {
        let (passed, _) = figures.checks.get(check).copied().unwrap_or_default();
        assert!(passed > 0, "{check} never ran: {:?}", figures.checks);
    }
    let failed: Vec<_> = figures.checks.iter().filter(|(_, (_, f))| *f > 0).collect();
    assert!(failed.is_empty(), "failed checks: {failed:?}");
    let junit = std::fs::read_to_string(&junit).expect("schemathesis wrote its JUnit report");
    assert!(
        junit.contains(r#"failures="0""#) && junit.contains(r#"errors="0""#),
        "JUnit report has failures or errors:\n{junit}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
