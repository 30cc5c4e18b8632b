//! Last-known state of each dependency, for `/ready`: updated from the
//! outcome of real calls, so readiness never adds load to a dependency.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use serde::Serialize;

use crate::upstream::Dependency;

// 0 (the Default) means not called yet.
const UP: u8 = 1;
const DOWN: u8 = 2;

/// Shared dependency states plus the process's own draining flag.
#[derive(Debug, Default)]
pub struct DependencyHealth {
    llm: AtomicU8,
    vector_store: AtomicU8,
    redis: AtomicU8,
    draining: AtomicBool,
}

/// One dependency's state as reported by `/ready`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DependencyState {
    /// Built in: always available.
    Embedded,
    /// Not called yet.
    Unknown,
    /// The last call succeeded.
    Up,
    /// The last call failed.
    Down,
}

impl DependencyHealth {
    fn slot(&self, dep: Dependency) -> &AtomicU8 {
        match dep {
            Dependency::Llm => &self.llm,
            Dependency::VectorStore => &self.vector_store,
            Dependency::Redis => &self.redis,
        }
    }

    /// Records the outcome of one call.
    pub fn record(&self, dep: Dependency, ok: bool) {
        self.slot(dep)
            .store(if ok { UP } else { DOWN }, Ordering::Relaxed);
    }

    /// The last-known state of a remote dependency.
    pub fn state(&self, dep: Dependency) -> DependencyState {
        match self.slot(dep).load(Ordering::Relaxed) {
            UP => DependencyState::Up,
            DOWN => DependencyState::Down,
            _ => DependencyState::Unknown,
        }
    }

    /// Marks the process as shutting down: `/ready` turns 503 so load
    /// balancers stop sending new work while in-flight requests drain.
    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// Whether shutdown has begun.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }
}
