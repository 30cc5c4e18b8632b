use super::*;

fn no_env(_: &str) -> Option<String> {
    None
}

#[test]
fn empty_file_is_the_embedded_defaults() {
    let c = Config::from_toml("").unwrap();
    c.validate().unwrap();
    assert_eq!(c.server.listen, DEFAULT_LISTEN);
    assert_eq!(c.server.max_body_bytes, 64 * 1024);
    assert!(c.llm.url.is_empty() && c.vector_store.url.is_empty() && c.redis.url.is_empty());
}

#[test]
fn wrong_type_names_the_key() {
    let e = Config::from_toml("[server]\nmax_body_bytes = \"big\"\n").unwrap_err();
    assert_eq!(e.key(), "server.max_body_bytes");
}

#[test]
fn unknown_key_is_rejected_and_named() {
    let e = Config::from_toml("[server]\nlisten_addr = \"x\"\n").unwrap_err();
    assert!(e.to_string().contains("listen_addr"), "{e}");
}

#[test]
fn bad_value_names_key_and_value() {
    let c = Config::from_toml("[server]\nlisten = \"nowhere\"\n").unwrap();
    let e = c.validate().unwrap_err();
    assert_eq!(e.key(), "server.listen");
    assert!(e.to_string().contains("\"nowhere\""), "{e}");
}

#[test]
fn env_overrides_apply_before_validation() {
    let vars = |k: &str| match k {
        "LEVEE_LISTEN" => Some("127.0.0.1:9999".to_owned()),
        "LEVEE_LLM_URL" => Some("ftp://x".to_owned()),
        _ => None,
    };
    let e = Config::load(None, vars).unwrap_err();
    assert_eq!(e.key(), "llm.url");
    let ok = Config::load(None, |k| {
        (k == "LEVEE_LISTEN").then(|| "127.0.0.1:9999".to_owned())
    })
    .unwrap();
    assert_eq!(ok.server.listen, "127.0.0.1:9999");
    assert!(Config::load(None, no_env).is_ok());
}

#[test]
fn qdrant_without_an_embeddings_endpoint_is_rejected() {
    let e = Config::load(None, |k| {
        (k == "LEVEE_VECTOR_STORE_URL").then(|| "http://127.0.0.1:6333".to_owned())
    })
    .unwrap_err();
    assert_eq!(e.key(), "vector_store.embeddings_url");
}

#[test]
fn redis_password_is_redacted_in_errors() {
    assert_eq!(
        redact_url("http://user:hunter2@host/"),
        "http://user:***@host/"
    );
}

#[test]
fn bad_fair_queue_settings_are_refused_at_load_naming_the_key_and_value() {
    let cases = [
        ("weight = 0", "ratelimit.tenants.acme.weight", "0"),
        ("weight = 100000", "ratelimit.tenants.acme.weight", "100000"),
        ("max_queue = 0", "ratelimit.tenants.acme.max_queue", "0"),
        ("max_wait = \"0s\"", "ratelimit.tenants.acme.max_wait", "0s"),
        ("max_wait = \"2h\"", "ratelimit.tenants.acme.max_wait", "2h"),
    ];
    for (line, key, value) in cases {
        let text = format!("[ratelimit.tenants.acme]\n{line}\n");
        let err = Config::from_toml(&text)
            .and_then(|c| c.validate().map(|()| c))
            .expect_err(line);
        assert_eq!(err.key(), key, "{line}");
        assert!(err.to_string().contains(value), "{line}: {err}");
    }
    // A negative weight does not even parse, and the error names the key.
    let err = Config::from_toml("[ratelimit.tenants.acme]\nweight = -1\n").expect_err("negative");
    assert!(err.to_string().contains("weight"), "{err}");
    let err = Config::from_toml("[fairness]\ncapacity = 0\n")
        .and_then(|c| c.validate().map(|()| c))
        .expect_err("capacity 0");
    assert_eq!(err.key(), "fairness.capacity");
}

#[test]
fn llm_models_are_validated_naming_the_key() {
    let cases = [
        (
            "[[llm.models]]\nname = \"gpt 4\"\ndeployments = [{ url = \"http://127.0.0.1:1/v1\" }]\n",
            "llm.models[0].name",
        ),
        ("[[llm.models]]\nname = \"m\"\ndeployments = []\n", "llm.models[0].deployments"),
        (
            "[[llm.models]]\nname = \"m\"\ndeployments = [{ url = \"ftp://x\" }]\n",
            "llm.models[0].deployments[0].url",
        ),
        (
            "[[llm.models]]\nname = \"m\"\ndeployments = [{ url = \"http://a/v1\", weight = 0 }]\n",
            "llm.models[0].deployments[0].weight",
        ),
        (
            "[[llm.models]]\nname = \"m\"\ndeployments = [{ url = \"http://a/v1\" }]\n[[llm.models]]\nname = \"m\"\ndeployments = [{ url = \"http://b/v1\" }]\n",
            "llm.models[1].name",
        ),
        ("[redis]\nmode = \"cluster\"\n", "redis.cluster_nodes"),
        ("[jobs]\nworkers = 0\n", "jobs.workers"),
    ];
    for (text, key) in cases {
        let config: Config = toml::from_str(text).expect(text);
        let err = config.validate().expect_err(text);
        assert_eq!(err.key(), key, "{text}: {err}");
    }
}
