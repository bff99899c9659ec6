//! Capacity planning for a context tier, without I/O (issue #8):
//!
//! - [`model`]: KV-cache bytes per token of a model, from its shape (layers, KV heads, head
//!   dimension, dtype; or an MLA latent), with presets from public model configs;
//! - [`trace`]: request traces in Mooncake's JSONL format (512-token blocks, chained hash ids);
//! - [`lru`]: an exact LRU cache simulation over block ids, with prefix hits as an engine
//!   sees them (the leading run of a request's blocks held);
//! - [`mrc`]: miss-ratio curves: exact (Mattson stack distances) and sampled (SHARDS: spatial
//!   sampling by key hash, bounded memory), mergeable across nodes;
//! - [`planner`]: capacity, bandwidth, nodes, drive wear and prefill GPU time saved, from a
//!   model, traffic, reuse and hardware.
//!
//! The node (live key stream), `ctxpod replay`, `ctxpod plan` and the dashboard all use this
//! one crate, so the curve a node reports and the one computed offline over a trace are the
//! same code.

pub mod curve;
pub mod hardware;
pub mod lru;
pub mod model;
pub mod mrc;
pub mod planner;
pub mod tiers;
pub mod trace;
