//! HTTP API v1 (axum). The route table ([`routes`]) is the contract in `api/openapi.json`;
//! the router is built only from it, and a test compares the two.
//!
//! Architecture invariant: the handlers parse and bound input ([`input`]), map
//! `EngineError` kinds one to one to statuses (`crate::errors`), and never touch the device
//! or the index directly; the pod's work is asked of `ctxpod-pod`.

pub mod admin;
pub mod batch;
pub mod blocks;
pub mod dashboard;
pub mod input;
pub mod middleware;
pub mod namespaces;
pub mod observe;
mod pod_values;
mod routed;
pub mod routes;
pub mod state;
pub mod uploads;

pub use routes::{router, routes, Routes};
pub use state::AppState;

#[cfg(test)]
mod tests;
