//! The scenarios: each one a config, an open-loop load, a fault schedule
//! (at t = X s inject, at t = Y s heal) and assertions stated as numbers,
//! and [`execute`], which runs one against real processes.
//!
//! # Layout
//!
//! - `catalogue`: [`Profile`], [`NAMES`], [`by_name`] and one constructor
//!   per scenario, with the config helpers they share.
//! - `execute`: [`execute`], which starts the processes, drives the load
//!   and the fault schedule and polls the breaker ([`Binaries`], [`Poll`]).
//! - `checks`: [`Check`] and its evaluation, one function per kind.
//! - `jobs`: after the load, the accepted jobs read back until terminal
//!   ([`JobsDrain`], [`JobRecord`], [`JobsObserved`]).
//!
//! This file holds the types they all share ([`Scenario`], [`Contrast`],
//! [`Step`], [`Action`]); every public item stays reachable as
//! `scenario::Item`.

use std::time::Duration;

use serde_json::Value;

use super::load::LoadSpec;
use super::proxy::ProxyMode;
use crate::sim::LlmCapacity;

mod catalogue;
mod checks;
mod cluster;
mod execute;
mod jobs;

pub use catalogue::{
    burst_absorbed, burst_absorbed_config, by_name, llm_flapping, llm_hang, llm_killed, llm_slow,
    noisy_neighbour, noisy_neighbour_config, redis_frozen, redis_killed_fail_closed,
    redis_killed_fail_open, redis_slow, replica_killed, vector_store_down, Profile, NAMES,
};
pub use checks::Check;
pub use execute::{execute, Binaries, Poll};
pub use jobs::{JobRecord, JobsDrain, JobsObserved};

/// One fault (or heal) action.
#[derive(Debug, Clone)]
pub enum Action {
    /// SIGKILL redis-server.
    KillRedis,
    /// Start redis-server again on the same port (empty).
    RestartRedis,
    /// SIGSTOP redis-server.
    FreezeRedis,
    /// SIGCONT redis-server.
    ThawRedis,
    /// Set the mode of the proxy in front of Redis.
    RedisProxy(ProxyMode),
    /// Set the mode of the proxy in front of the vector store.
    VectorProxy(ProxyMode),
    /// SIGKILL the simulator.
    KillSim,
    /// Start the simulator again on the same port.
    RestartSim,
    /// `POST /_faults` with this body; `null` = `DELETE /_faults`.
    SimFaults(Value),
    /// Take replica N out of rotation and SIGKILL it.
    KillReplica(usize),
    /// Take replica `replica` out of rotation (if still in) and SIGKILL it
    /// as soon as it gives one of `tenant`'s requests an LLM slot (its
    /// `levee_fair_queue_dispatched_total{dependency="llm"}` for the tenant
    /// rises), so it dies with that call in flight; after `within` without
    /// one, SIGKILL it anyway.
    KillReplicaMidCall {
        /// The replica.
        replica: usize,
        /// Whose call it waits for.
        tenant: &'static str,
        /// The longest wait.
        within: Duration,
    },
    /// Take replica N out of rotation and leave it running: a load
    /// balancer draining it, so that no request is in flight to it when a
    /// later [`Action::KillReplicaMidCall`] kills it (its job workers keep
    /// going).
    Unroute(usize),
    /// Start a new replica with the same config and add it to rotation.
    AddReplica,
}

/// An action at a time from the start of the load.
#[derive(Debug, Clone)]
pub struct Step {
    /// When.
    pub at: Duration,
    /// What.
    pub action: Action,
}

/// A chaos scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Name, as on the command line.
    pub name: &'static str,
    /// One line: what breaks and what must hold.
    pub summary: &'static str,
    /// Levee replicas.
    pub replicas: usize,
    /// Levee's TOML config.
    pub config: String,
    /// Load.
    pub load: LoadSpec,
    /// Put a fault proxy between levee and Redis.
    pub redis_proxy: bool,
    /// Put a fault proxy between levee and the vector store.
    pub vector_proxy: bool,
    /// Faults and heals.
    pub schedule: Vec<Step>,
    /// The fault window (shaded in the chart).
    pub fault_window: (Duration, Duration),
    /// Assertions.
    pub checks: Vec<Check>,
    /// The simulated LLM's capacity (`levee-upstream-sim --capacity ..`);
    /// the default is unlimited and instant.
    pub sim: LlmCapacity,
    /// A second run with one setting changed, reported beside this one.
    pub contrast: Option<Contrast>,
    /// Jobs to read back after the load, for the job checks.
    pub jobs: Option<JobsDrain>,
}

/// A run of the same scenario with one setting turned off, run first and
/// reported beside the main run. Its checks are evaluated and shown but do
/// not decide the verdict; the main run asserts that they fail, which is
/// what shows the scenario can fail at all.
#[derive(Debug, Clone)]
pub struct Contrast {
    /// What the contrast run is, e.g. `isolation off`.
    pub label: &'static str,
    /// What the main run is beside it, e.g. `isolation on`.
    pub main_label: &'static str,
    /// Levee's TOML config for the contrast run.
    pub config: String,
}

/// `n` milliseconds: shorthand for the schedules, bounds and timeouts of
/// every file of this module.
fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}
