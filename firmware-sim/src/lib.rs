//! ctxpod-firmware-sim: the simulated flash node below the daemon (issue #3).
//!
//! It will model an NVMe-like device (queues, channel parallelism, latencies, SLC/QLC,
//! GC stalls, wear, faults including power loss) and the DPU offload engine, behind the
//! appliance's `Device` trait. Nothing is implemented yet: the crate exists so that the
//! workspace has its final shape and the dependency direction (appliance → firmware-sim)
//! is fixed from the start.
