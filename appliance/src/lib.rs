//! ctxpod appliance: the daemon of one flash node of a pod-level context-memory tier.
//!
//! Layers, top to bottom (see docs/ARCHITECTURE.md):
//! - [`cli`] and [`server`]: the command line and HTTP API v1; the only code that knows HTTP.
//!   [`transfer`]: the CXP1 listener. [`errors`]: the error → status map both listeners
//!   answer with.
//! - [`auth`] and [`tls`]: who is calling (tokens, client certificates → tenant and role),
//!   what each request may do, tenant quotas; rustls on both listeners.
//! - [`engine`]: namespaces, the put/get paths, group commit, eviction, leases, DRAM tier,
//!   recovery; the RocksDB index lives in [`engine::index`].
//! - the CRC32C / AES-GCM work runs on `ctxpod_engine::offload::OffloadEngine` (the
//!   "DPU firmware"), whatever the device.
//! - [`record`] (from `ctxpod-format`, with [`config`]) and [`crypto`]: sans-IO codecs of the
//!   on-device record and its envelope.
//! - [`replay`]: `ctxpod replay`, a request trace replayed through the client (capacity
//!   planning, with the `ctxpod-plan` crate).
//! - [`device`]: 4 KiB-aligned async I/O through io_uring (or pread/pwrite); nothing else
//!   touches the device.

pub mod auth;
pub mod bench;
pub mod budget;
pub mod cli;
pub use ctxpod_format::config;
pub mod conn;
pub mod dashboard;
pub mod errors;
pub mod forward;
pub mod limits;
pub mod plan_cli;
pub use ctxpod_format::record;
pub mod replay;
pub mod server;
pub mod tls;
pub mod transfer;
