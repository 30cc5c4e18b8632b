//! Configuration loading the way `levee serve` does it (`Config::load`):
//! TOML text, then `LEVEE_*` overrides, then validation. Any input is an
//! `Ok` or a `ConfigError` naming something, never a panic; a config that
//! validates has a listen address, and serialises to TOML that loads and
//! validates again.
//!
//! Input: the TOML file. Comment lines `#! LEVEE_NAME=value` are the
//! environment (they stay comments to the TOML parser).

#![no_main]

use std::collections::HashMap;

use levee::config::Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let env: HashMap<&str, &str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("#! ")?.split_once('='))
        .collect();
    let vars = |name: &str| env.get(name).map(|v| (*v).to_owned());

    let mut config = match Config::from_toml(text) {
        Ok(config) => config,
        Err(e) => return assert!(!e.to_string().is_empty()),
    };
    if let Err(e) = levee::config::apply_env(&mut config, vars) {
        return assert!(!e.to_string().is_empty());
    }
    if let Err(e) = config.validate() {
        return assert!(!e.to_string().is_empty());
    }
    config
        .server
        .listen_addr()
        .expect("a validated listen address parses");
    let _ = config.embeddings_url();

    let Ok(saved) = toml::to_string(&config) else {
        return;
    };
    let reloaded = Config::from_toml(&saved)
        .unwrap_or_else(|e| panic!("a valid config does not reload: {e}\n{saved}"));
    reloaded
        .validate()
        .unwrap_or_else(|e| panic!("a valid config does not revalidate: {e}\n{saved}"));
});
