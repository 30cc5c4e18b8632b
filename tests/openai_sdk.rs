//! The official OpenAI Python SDK against the gateway: real processes (a
//! redis-server holding the limits and token budgets, one or two
//! `levee-upstream-sim` processes as the deployments, the levee binary)
//! and one Python scenario script of `tests/sdk/` per test, run with the
//! virtualenv `scripts/py-venv.sh` makes (`LEVEE_TEST_PYTHON`, else that
//! script is run here). A script asserts what a client of the SDK relies
//! on and exits non-zero when it does not hold; its output is shown.

mod support;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use levee::identity::hash_key;
use support::bounded;
use support::levee::Levee;
use support::redis::RedisServer;
use support::sim::Sim;
use tokio::process::Command;

/// The key of tenant [`TENANT`], which has a token budget.
const TENANT_KEY: &str = "sdk_acme_key";
const TENANT: &str = "acme";
/// A key whose tier allows [`TIGHT_LIMIT`] requests per 2 s.
const TIGHT_KEY: &str = "sdk_tight_key";
const TIGHT_LIMIT: u32 = 2;
const ADMIN_TOKEN: &str = "sdk-admin-token";
/// The chat model clients name.
const MODEL: &str = "gpt-4o-mini";
const EMBEDDING_MODEL: &str = "text-embedding-3-small";
/// What the simulator lists in passthrough mode: none of the configured
/// names, so a listing that ignored the mode would show.
const UPSTREAM_MODELS: &str = "levee-sim,sim-large";
/// Longest a scenario script may run.
const SCRIPT_LIMIT: Duration = Duration::from_secs(30);

/// One scenario at a time: several measure time (Retry-After honoured, a
/// steady request rate, a drain bound), and on a 2-core machine parallel
/// scenarios would measure each other.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The virtualenv's python: `LEVEE_TEST_PYTHON`, else the last line
/// `scripts/py-venv.sh` prints (it makes the venv on first use).
fn python() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        if let Some(p) = std::env::var_os("LEVEE_TEST_PYTHON").filter(|p| !p.is_empty()) {
            return PathBuf::from(p);
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/py-venv.sh");
        let out = std::process::Command::new("bash")
            .arg(&script)
            .stderr(Stdio::inherit())
            .output()
            .expect("run scripts/py-venv.sh");
        assert!(out.status.success(), "scripts/py-venv.sh failed");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let path = stdout.lines().last().expect("py-venv.sh printed a path");
        PathBuf::from(path.trim())
    })
}

/// Runs `tests/sdk/<script>` with these environment variables and panics,
/// showing its output, unless it exits 0 within [`SCRIPT_LIMIT`]. Its
/// stdout (the numbers it measured) is printed either way, for
/// `--nocapture`.
#[allow(clippy::print_stdout)]
async fn run_script(script: &str, env: &[(&str, String)]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk");
    let run = bounded::run(
        Command::new(python())
            .arg(dir.join(script))
            .current_dir(&dir)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .env("PYTHONUNBUFFERED", "1")
            .env("PYTHONDONTWRITEBYTECODE", "1"),
        SCRIPT_LIMIT,
    )
    .await;
    let (status, took, stdout, stderr) = (run.status, run.took, run.stdout, run.stderr);
    println!("--- {script} ({took:.2?})\n{stdout}");
    match status {
        Some(s) if s.success() => {}
        Some(s) => panic!("{script} failed ({s}) after {took:.2?}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"),
        None => panic!("{script} did not finish within {SCRIPT_LIMIT:?}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"),
    }
}

/// Keys, tiers and the tenant's token budget every config starts with.
fn identity_config() -> String {
    format!(
        r#"
[[identity.api_keys]]
id = "acme"
sha256 = "{tenant}"
tenant = "{TENANT}"
tier = "TENANT"

[[identity.api_keys]]
id = "tight"
sha256 = "{tight}"
tenant = "tight"
tier = "TIGHT"

[ratelimit.tiers.TENANT]
limits = [{{ limit = 100000, window = "1m" }}]

[ratelimit.tiers.TIGHT]
limits = [{{ limit = {TIGHT_LIMIT}, window = "2s" }}]

[ratelimit.tiers.PUBLIC_IP]
limits = [{{ limit = 100000, window = "1m" }}]

[ratelimit.tenants.{TENANT}]
tokens_per_minute = 1000000
"#,
        tenant = hash_key(TENANT_KEY),
        tight = hash_key(TIGHT_KEY),
    )
}

/// `[[llm.models]]`: the chat model on these deployments (equal weight),
/// and the embedding model on the first.
fn models_config(deployments: &[&Sim]) -> String {
    let mut text = format!("[[llm.models]]\nname = \"{MODEL}\"\n");
    for sim in deployments {
        text += &format!(
            "[[llm.models.deployments]]\nurl = \"{}\"\nweight = 1\n",
            sim.v1()
        );
    }
    text += &format!(
        "[[llm.models]]\nname = \"{EMBEDDING_MODEL}\"\n[[llm.models.deployments]]\nurl = \"{}\"\n",
        deployments[0].v1()
    );
    text
}

/// The processes of one scenario.
struct Stack {
    _redis: RedisServer,
    sims: Vec<Sim>,
    levee: Levee,
}

impl Stack {
    /// Redis, `sims` simulators and levee in config mode (`[[llm.models]]`).
    async fn configured(sims: usize) -> Self {
        let redis = RedisServer::start().await;
        let mut started = Vec::new();
        for _ in 0..sims {
            started.push(Sim::start().await);
        }
        let refs: Vec<&Sim> = started.iter().collect();
        let config = format!("{}\n{}", identity_config(), models_config(&refs));
        let levee = Levee::builder()
            .config_text(&config)
            .env("LEVEE_REDIS_URL", redis.url())
            .env("LEVEE_ADMIN_TOKEN", ADMIN_TOKEN)
            .start()
            .await;
        Self {
            _redis: redis,
            sims: started,
            levee,
        }
    }

    /// Redis, one simulator listing [`UPSTREAM_MODELS`] and levee in
    /// passthrough mode (`LEVEE_LLM_URL`).
    async fn passthrough() -> Self {
        let redis = RedisServer::start().await;
        let sim = Sim::start_with(&["--models", UPSTREAM_MODELS]).await;
        let levee = Levee::builder()
            .config_text(&identity_config())
            .env("LEVEE_REDIS_URL", redis.url())
            .env("LEVEE_LLM_URL", sim.v1())
            .env("LEVEE_ADMIN_TOKEN", ADMIN_TOKEN)
            .start()
            .await;
        Self {
            _redis: redis,
            sims: vec![sim],
            levee,
        }
    }

    /// What every script reads: the gateway, the tenant, the first sim.
    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("LEVEE_URL", self.levee.url()),
            ("LEVEE_KEY", TENANT_KEY.to_owned()),
            ("LEVEE_TENANT", TENANT.to_owned()),
            ("LEVEE_MODEL", MODEL.to_owned()),
            ("SIM_URL", self.sims[0].url.clone()),
        ]
    }

    async fn run(&self, script: &str, extra: &[(&'static str, String)]) {
        let mut env = self.env();
        env.extend_from_slice(extra);
        run_script(script, &env).await;
    }
}

#[tokio::test]
async fn non_streamed_chat_returns_the_answer_with_the_upstreams_usage() {
    let _serial = SERIAL.lock().await;
    let stack = Stack::configured(1).await;
    stack.run("chat_completion.py", &[]).await;
}

#[tokio::test]
async fn stream_without_include_usage_hides_usage_yet_charges_it_exactly() {
    let _serial = SERIAL.lock().await;
    let stack = Stack::configured(1).await;
    stack.run("stream_without_usage.py", &[]).await;
}

#[tokio::test]
async fn stream_with_include_usage_ends_with_the_upstreams_usage() {
    let _serial = SERIAL.lock().await;
    let stack = Stack::configured(1).await;
    stack.run("stream_with_usage.py", &[]).await;
}

#[tokio::test]
async fn embeddings_and_models_list_the_configured_models() {
    let _serial = SERIAL.lock().await;
    let stack = Stack::configured(1).await;
    stack
        .run(
            "embeddings_and_models.py",
            &[
                ("EXPECTED_MODELS", format!("{MODEL},{EMBEDDING_MODEL}")),
                ("EMBEDDING_MODEL", EMBEDDING_MODEL.to_owned()),
            ],
        )
        .await;
}

#[tokio::test]
async fn models_list_in_passthrough_mode_is_the_upstreams() {
    let _serial = SERIAL.lock().await;
    let stack = Stack::passthrough().await;
    stack
        .run(
            "embeddings_and_models.py",
            &[
                ("EXPECTED_MODELS", UPSTREAM_MODELS.to_owned()),
                ("EMBEDDING_MODEL", EMBEDDING_MODEL.to_owned()),
            ],
        )
        .await;
}

#[tokio::test]
async fn rate_limited_key_gets_rate_limit_error_and_the_sdk_honours_retry_after() {
    let _serial = SERIAL.lock().await;
    let stack = Stack::configured(1).await;
    stack
        .run(
            "rate_limited.py",
            &[
                ("TIGHT_KEY", TIGHT_KEY.to_owned()),
                ("TIGHT_LIMIT", TIGHT_LIMIT.to_string()),
            ],
        )
        .await;
}

#[tokio::test]
async fn unknown_key_raises_authentication_error() {
    let _serial = SERIAL.lock().await;
    let stack = Stack::configured(1).await;
    stack.run("unauthorized.py", &[]).await;
}

#[tokio::test]
async fn unknown_model_raises_not_found_with_model_not_found() {
    let _serial = SERIAL.lock().await;
    let stack = Stack::configured(1).await;
    stack.run("model_not_found.py", &[]).await;
}

#[tokio::test]
async fn every_breaker_open_raises_503_with_retry_after() {
    let _serial = SERIAL.lock().await;
    let stack = Stack::configured(2).await;
    let breakers = format!("llm:{MODEL}:0,llm:{MODEL}:1");
    stack
        .run(
            "breakers_open.py",
            &[
                ("ADMIN_TOKEN", ADMIN_TOKEN.to_owned()),
                ("BREAKERS", breakers),
            ],
        )
        .await;
}

#[tokio::test]
async fn killing_one_deployment_mid_traffic_loses_no_request() {
    let _serial = SERIAL.lock().await;
    let stack = Stack::configured(2).await;
    // The script SIGKILLs this process (ours, by PID) part-way through.
    let pid = stack.sims[0].pid();
    stack
        .run(
            "fallback.py",
            &[
                ("SIM1_PID", pid.to_string()),
                ("DEPLOYMENT_1", format!("llm:{MODEL}:0")),
                ("DEPLOYMENT_2", format!("llm:{MODEL}:1")),
                ("CALLS", "60".to_owned()),
                ("RATE", "20".to_owned()),
                ("KILL_AFTER_S", "1.0".to_owned()),
            ],
        )
        .await;
}

#[tokio::test]
async fn client_hanging_up_mid_stream_closes_upstream_and_still_settles_usage() {
    let _serial = SERIAL.lock().await;
    let stack = Stack::configured(1).await;
    stack.run("client_disconnect.py", &[]).await;
}

#[tokio::test]
async fn upstream_failing_mid_stream_raises_api_error_in_the_sdk() {
    let _serial = SERIAL.lock().await;
    let stack = Stack::configured(1).await;
    stack.run("stream_failure.py", &[]).await;
}
