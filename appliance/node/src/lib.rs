//! ctxpod's node: one flash node's daemon over the engine and the pod.
//!
//! - [`serve`]: `ctxpod serve`, the wiring of the process (no logic of its own).
//! - [`http`]: HTTP API v1 (axum): state, route table (checked against
//!   `api/openapi.json`), middleware, input, and the handlers by concern (blocks, batch,
//!   namespaces, observe, admin, the dashboard); [`forward`]: a single-block request
//!   proxied to the member that holds it; [`plan_args`]: the planner's inputs, shared by
//!   `POST /v1/plan` and `ctxpod plan`.
//! - [`cxp1`]: the CXP1 listener (listener, conn, handshake, ops, prefetch, subscribe).
//! - [`s3`]: the S3 door (an S3 listener, off by default): the `s3s` crate's protocol over
//!   the HTTP API's router, in process.
//!   [`errors`]: the error → status map both listeners answer with.
//! - [`auth`] and [`tls`]: who is calling (tokens, client certificates → tenant and role),
//!   what each request may do, tenant quotas; rustls on both listeners. [`conn`]: accepted
//!   connections, their limits and idle timeouts. [`budget`]: the node's memory for bytes
//!   in flight.
//!
//! Architecture invariant: this is the only crate that serves HTTP, CXP1 or S3; the engine and
//! the pod below it know no server (the layering test checks that they do not link axum).

pub mod auth;
pub mod budget;
pub mod conn;
pub mod cxp1;
pub mod errors;
pub mod forward;
pub mod http;
pub mod metrics;
pub mod plan_args;
pub mod s3;
pub mod serve;
pub mod tls;
