//! `[[tiers]]`: the flash tiers inside one node (issue #36, docs/design/0003).
//!
//! A node has one device (`device`, `capacity`) or two tiers: `fast` (SLC, small, many
//! program/erase cycles) and `dense` (QLC, large, few). Blocks are written to `fast`; as
//! `fast` fills, its oldest region's live records are demoted into `dense`, and only
//! `dense` evicts.

use super::ByteSize;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The two tier names, in the order of their regions on the node.
pub const TIER_NAMES: [&str; 2] = ["fast", "dense"];

/// One tier: its device and the bytes of it the node uses.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TierConfig {
    /// `fast` or `dense`.
    pub name: String,
    /// A file (created and preallocated) or raw block device, or `sim:<profile>` (a
    /// firmware-sim device whose medium is `<data_dir>/blocks.<name>.sim`). Default
    /// `<data_dir>/blocks.<name>.dev`.
    pub device: Option<PathBuf>,
    /// Bytes of the device the node uses (its superblock copy takes the first MiB).
    pub capacity: ByteSize,
}

impl TierConfig {
    /// The firmware-sim profile when the tier's device is `sim:<profile>`.
    pub fn sim_profile(&self) -> Option<String> {
        let d = self.device.as_ref()?.to_str()?;
        d.strip_prefix("sim:").map(str::to_string)
    }

    /// The tier's device file (a simulated device's medium), under `data_dir` by default.
    pub fn device_path(&self, data_dir: &Path) -> PathBuf {
        if self.sim_profile().is_some() {
            return data_dir.join(format!("blocks.{}.sim", self.name));
        }
        self.device
            .clone()
            .unwrap_or_else(|| data_dir.join(format!("blocks.{}.dev", self.name)))
    }
}

/// Checks the `[[tiers]]` list: none, or `fast` then `dense`; each at least 64 MiB.
pub fn validate(tiers: &[TierConfig], device: Option<&Path>) -> anyhow::Result<()> {
    if tiers.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = tiers.iter().map(|t| t.name.as_str()).collect();
    anyhow::ensure!(
        names == TIER_NAMES,
        "tiers must be two, named fast then dense (got {names:?})"
    );
    anyhow::ensure!(
        device.is_none(),
        "device and tiers exclude each other: with tiers, each tier names its device"
    );
    for t in tiers {
        anyhow::ensure!(
            t.capacity.0 >= 64 << 20,
            "tier {} capacity {} is below 64MiB",
            t.name,
            t.capacity
        );
    }
    Ok(())
}
