//! The pod: many flash nodes as one context tier (issue #7, in progress).
//!
//! - [`etcd`]: a small etcd v3 client over etcd's JSON gateway.
//! - [`membership`]: who is in the pod (one node, a static list, or etcd leases and watches)
//!   and the placement over them (`ctxpod_api::placement`, capacity-weighted rendezvous).

pub mod etcd;
pub mod membership;
