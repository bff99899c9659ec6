//! ctxpod's tools beside the daemon, run by the `ctxpod` binary:
//! - [`bench`]: `ctxpod bench`, the node measured against the machine's own limits
//!   ([`limits`]: what the device, the CPU's CRC32C / AES-GCM and loopback give on their own);
//! - [`replay`]: `ctxpod replay`, a request trace replayed through the client (capacity
//!   planning, with `ctxpod-plan`).
//!
//! Architecture invariant: a tool reaches a node only as a client does (a process started,
//! HTTP or CXP1), and the node never depends on a tool; the bench's device probes use the
//! engine's device layer directly.

pub mod bench;
pub mod limits;
pub mod replay;
