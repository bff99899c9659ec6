//! The CXP1 transfer listener (`api/PROTOCOL.md`): pipelined PUT / GET / MATCH / PIN /
//! UNPIN answered out of order, memory regions and PREFETCH tickets whose blocks are staged
//! from flash into node memory ahead of being PUSHed into the client's region, and KV event
//! subscriptions.
//!
//! Bounds, per connection: one frame of `max_frame_bytes` decoded at a time, at most
//! [`INFLIGHT_PER_CONNECTION`] requests running (more are answered BUSY), at most
//! [`OUT_BYTES_PER_CONNECTION`] of frames waiting for the socket (a client that never reads
//! stalls only its own requests, tickets and subscriptions), at most [`TICKETS_PER_CONNECTION`]
//! live tickets and subscriptions and [`REGIONS_PER_CONNECTION`] regions. Node-wide: request
//! bodies count against the ingest byte budget (as HTTP bodies do), and blocks staged for
//! pushes against the staging budget (`prefetch_staging_bytes`).

mod conn;
mod handshake;
mod listener;
mod ops;
mod prefetch;
mod subscribe;
mod values;

pub use handshake::access_of_op;
pub use listener::serve;
pub use prefetch::CANCELLED;

use bytes::Bytes;
use ctxpod_engine::EngineError;
use ctxpod_wire::proto::{Op, Response};
use std::time::Duration;

/// The CXP1 status of an engine error (the HTTP status's number).
pub(crate) fn code(e: &EngineError) -> u16 {
    crate::errors::status_of(e).0.as_u16()
}

/// An `Error` answer to request `id` of `op`: its frame.
pub(crate) fn error(op: Op, id: u64, st: u16, msg: impl Into<String>) -> Vec<Bytes> {
    vec![Response::Error(msg.into()).encode(op, st, id)]
}

/// Requests one connection runs at once; more are answered BUSY.
pub const INFLIGHT_PER_CONNECTION: usize = 32;
/// Bytes of frames one connection may have waiting for its socket.
pub const OUT_BYTES_PER_CONNECTION: usize = 64 << 20;
/// Live prefetch tickets (pushing, or holding their lease) and subscriptions per connection.
pub const TICKETS_PER_CONNECTION: usize = 1024;
pub const REGIONS_PER_CONNECTION: usize = 256;
/// Bytes of blocks one connection's prefetches may hold staged at once: its share of the
/// node's `prefetch_staging_bytes`.
pub const STAGING_PER_CONNECTION: usize = 64 << 20;
/// Blocks of one ticket staged (read and verified) ahead of the one being pushed.
pub const STAGE_AHEAD: usize = 32;
/// Events sent in one `Event` frame at most.
pub(crate) const EVENTS_PER_FRAME: usize = 256;
/// A connection's writer gathers the frames queued for its socket into one vectored write
/// while they add up to less than this many bytes and frames.
pub(crate) const WRITE_BATCH_BYTES: usize = 4 << 20;
pub(crate) const WRITE_BATCH_FRAMES: usize = 64;
/// Largest frame this node accepts and announces.
pub const MAX_FRAME_BYTES: u32 = ctxpod_wire::proto::FRAME_BYTES_MAX;
pub(crate) const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
