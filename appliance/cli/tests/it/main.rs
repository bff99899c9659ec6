//! The integration tests, one binary (one link of RocksDB and the rest, not fifteen): each
//! module drives the real `ctxpod` binary (or the engine) through one concern. The process
//! harness is in [`common`], built on ctxpod-testkit (PKI, etcd, process utilities, block
//! contents), which the bench shares.

mod api;
mod auth;
mod bench_smoke;
mod common;
mod crash;
mod events;
mod eviction;
mod gave_up;
mod hostile;
mod keys;
mod layers;
mod pod;
mod power_loss;
mod prefetch;
mod replay;
mod s3;
mod sim_faults;
mod tamper;
mod tiers;
mod tls;
mod transfer;
mod values;
mod values_wire;
