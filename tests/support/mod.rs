//! Shared helpers for integration tests: real processes (redis-server, the
//! levee binary) on free loopback ports, killed by PID when dropped.
#![allow(dead_code, unreachable_pub)]

pub mod levee;
pub mod redis;
