//! ctxpod-firmware-sim: the simulated flash node below the daemon.
//!
//! - [`SimDevice`] models an NVMe-like drive: a queue-depth limit, dies on channels with
//!   read/program/erase latency distributions, a page-mapped FTL with garbage collection
//!   (write amplification, P/E cycles), an SLC cache for QLC profiles, a DRAM write cache
//!   that only a flush or FUA makes durable (unless the profile has power-loss protection),
//!   and a durable medium in memory or a sparse file.
//! - [`FaultPlan`] injects faults from a seed: bit flips and uncorrectable errors on read,
//!   program failures, misdirected writes, flush failures, latency spikes, device full, and
//!   power cuts that tear in-flight writes and lose (or persist, out of order) unflushed ones.
//! - [`Profile`] holds the numbers of a device class (`tlc`, `qlc`, or a TOML file).
//! - The CRC32C / AES-GCM offload engines (the "DPU") are production code and live in
//!   `ctxpod-engine` (`appliance/engine/src/offload.rs`); they draw their injected faults from [`rng`].
//!
//! The crate knows nothing of ctxpod: the appliance adapts [`SimDevice`] to its `Device`
//! trait (`appliance/engine/src/device/sim.rs`). Docs: `docs/FIRMWARE-SIM.md`.

pub mod device;
pub mod faults;
pub mod media;
pub mod nand;
pub mod profile;
pub mod rng;

pub use device::{Endurance, SimDevice, SimError, SimStats, Ticket};
pub use faults::{Fault, FaultPlan};
pub use media::Media;
pub use profile::Profile;

#[cfg(test)]
mod tests;
