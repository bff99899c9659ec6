//! ctxpod's Rust clients, over the contract in `ctxpod-wire`:
//! - [`client`]: HTTP API v1, one node; [`pod_client`]: the pod, each request sent to the
//!   member that holds the block (placement computed here, R copies, read fall-back);
//! - [`transfer_client`]: CXP1, pipelined on one connection, with [`region`]s that prefetch
//!   tickets push blocks into; [`proto_io`]: CXP1 frames over tokio streams (the node's
//!   listener reads with it too);
//! - [`transfer_pod`]: CXP1 to a whole pod, each batch split by member (placement here,
//!   R copies, read fall-back), one prefetch ticket filled from every member at once;
//! - [`connect`]: the TLS client configuration both use.
//!
//! Architecture invariant: clients know nothing of the engine; the node depends on this
//! crate (its peers are reached through it), never the other way round.

pub mod client;
pub mod connect;
pub mod pod_client;
pub mod proto_io;
pub mod region;
pub mod transfer_client;
pub mod transfer_pod;

/// Attempts of a request a node answers BUSY, over HTTP and CXP1 alike (with backoff 1, 2,
/// 4, … 256 ms between: about 4 s in all).
pub const BUSY_ATTEMPTS: u32 = 20;
