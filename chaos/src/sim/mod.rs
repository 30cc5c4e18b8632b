//! The upstream simulator: a fake OpenAI chat / embeddings API and a fake
//! Qdrant REST API in one HTTP server, with injectable faults.
//!
//! # Layout
//!
//! - `config`: [`SimConfig`], what the simulator serves, and
//!   [`LlmCapacity`], how much of it at once.
//! - `capacity`: the finite-capacity chat model: N slots, a FIFO queue,
//!   service time per call.
//! - `text`: tokenising, sentence splitting and the hashed bag-of-words
//!   embedding shared by the LLM and the vector store.
//! - `chat`, `models`, `embeddings`, `vector`: the OpenAI and Qdrant endpoints.
//! - `faults`: the fault set per API ([`FaultSpec`] on the wire) and the
//!   middleware that applies it.
//! - `stats`: request counters and captured `traceparent` headers.
//! - `error`: the one place API errors get their OpenAI or Qdrant body.
//! - `app`: the router and the state it shares.
//! - `server`: the accept loop, one task per connection, which is what makes
//!   abrupt TCP resets possible; [`spawn`] and [`serve`].
//!
//! # Endpoints
//!
//! | Method | Path | What |
//! |---|---|---|
//! | POST | `/v1/chat/completions` | extractive answer from the system messages, optional SSE |
//! | GET | `/v1/models` | the `--models` ids in OpenAI's list shape (chat's faults and counter) |
//! | POST | `/v1/embeddings` | deterministic hashed bag-of-words vectors |
//! | POST | `/collections/{name}/points/search` | cosine search |
//! | PUT | `/collections/{name}/points` | upsert (creates the collection) |
//! | GET / PUT | `/collections/{name}` | collection info / create |
//! | GET / POST / DELETE | `/_faults` | show / replace / clear faults (and the chat model's capacity) |
//! | GET | `/_stats`, POST `/_stats/reset` | counters, traceparents, chat slots in flight / queued |
//! | GET | `/healthz` | liveness |

mod app;
mod capacity;
mod chat;
mod config;
mod embeddings;
mod error;
mod faults;
mod models;
mod server;
mod stats;
mod text;
mod vector;

pub use app::router;
pub use config::{
    ConfigError, LlmCapacity, SimConfig, DEFAULT_COLLECTION, DEFAULT_DIM, DEFAULT_MODEL,
};
pub use faults::{FaultSpec, FaultSpecError, FaultTarget, HANG_MAX};
pub use server::{serve, spawn, spawn_on, SimHandle, DRAIN_TIMEOUT, LISTENING_PREFIX};
pub use text::embed;
