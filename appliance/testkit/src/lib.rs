//! ctxpod-testkit: what the integration tests (`appliance/cli/tests/it`) and the benchmark
//! (`ctxpod bench`, in ctxpod-tools) share to run nodes and pods as processes:
//! - [`process`]: a node's published addresses, waiting for them and for a condition,
//!   free ports, disk and memory use of a process or a folder, a seccomp filter that
//!   refuses io_uring;
//! - [`pki`]: certificates made on the spot (a CA, server, node and client certificates)
//!   and a client TLS configuration that trusts them;
//! - [`etcd`]: a real, secured etcd server on loopback for pod runs;
//! - [`netns`]: hosts in network namespaces of their own on a bridge, and links cut
//!   between them with nftables (the pod's partition tests);
//! - [`data`]: deterministic block contents, a replayable seed, and the entries of a batch
//!   to send again when the node answered busy.
//!
//! For tests and benchmarks only: nothing here is meant for a production path, errors that
//! a test cannot recover from panic with a message, and the crate is not published. It
//! reaches a node only as a client does (processes, files, HTTP and CXP1), so it depends on
//! the wire contract and the clients, never on the engine, the pod or the node.

#![warn(missing_docs)]

pub mod data;
pub mod etcd;
pub mod netns;
pub mod pki;
pub mod process;

pub use data::{answered_busy, block, content, env_or, kv_content, seed_from_env};
pub use process::{du, free_port, poll_until, rss_bytes};

/// The scenario table every door of a pod runs (`appliance/testkit/pod_scenarios.json`):
/// the Rust clients, the node's forwarding and batches, the S3 door and the Python SDK
/// must give the same answers to the same rows.
pub const POD_SCENARIOS_JSON: &str = include_str!("../pod_scenarios.json");

/// The value of the series `name` (with its labels, as printed) in a Prometheus `/metrics`
/// text; 0 when absent.
pub fn metric_of(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}
