//! Levee's chaos tooling.
//!
//! # Layout
//!
//! - [`sim`]: `levee-upstream-sim`, a stand-in for an OpenAI-compatible LLM
//!   and a Qdrant vector store that speaks their real wire formats, answers
//!   deterministically, and takes fault-injection commands over HTTP
//!   (latency, errors, hangs, TCP resets, a finite LLM capacity with a
//!   queue). Tests start it in-process with
//!   [`sim::spawn`]; chaos runs and benchmarks start the binary.
//! - [`runner`]: the chaos suite behind `levee-chaos run`: real
//!   `redis-server`, simulator and `levee` processes, a TCP fault proxy, an
//!   open-loop load, scenarios with numeric assertions, JSON + SVG reports.

pub mod runner;
pub mod sim;
