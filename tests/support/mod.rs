//! Shared helpers for integration tests: real processes (redis-server, the
//! levee binary, prometheus) on free loopback ports, killed by PID when
//! dropped; an in-process OTLP trace receiver.
#![allow(dead_code, unreachable_pub)]

pub mod bounded;
pub mod cluster;
pub mod levee;
pub mod otlp;
pub mod prometheus;
pub mod redis;
pub mod sim;
