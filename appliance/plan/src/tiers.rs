//! Planning a node of two tiers (issue #36, docs/design/0003): a fast tier (SLC) in front
//! of the node's dense drives (QLC). Every block is written to `fast` and, unless deleted
//! there, demoted to `dense` once as `fast` fills; promotion brings the most read back. So:
//!
//! - `fast` is sized from the reuse curve: the capacity at which an LRU of that many blocks
//!   reaches `hit_share` of the planned hit ratio (the curve's own arithmetic, scaled to the
//!   planned rate like the whole tier's). `fast` is a log of the newest blocks plus the
//!   promoted ones, close to an LRU for KV reuse, which is mostly recent.
//! - `dense` holds the rest of the capacity the hit ratio needs.
//! - Writes: the whole write stream lands on `fast`'s drives, and again on `dense`'s as
//!   demotions, so each tier's drives must take it (bandwidth) and wear by it (DWPD over
//!   each tier's raw bytes).
//!
//! Reads are not split: a node's read bandwidth stays its dense drives' and NICs' (what
//! `fast` serves comes on top), so the read bound is the one-tier plan's.

use crate::curve::capacity_for;
use crate::hardware::{Drive, NodeShape};
use serde::{Deserialize, Serialize};

/// A fast tier in front of the node's drives.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FastTier {
    pub drives: u32,
    pub drive: Drive,
    /// The share of the planned hits the fast tier should serve (0 < share ≤ 1).
    pub hit_share: f64,
}

/// What two tiers need, beside the plan's totals.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TierPlan {
    /// Blocks the fast tier holds (one copy), and bytes with R copies.
    pub fast_capacity_blocks: f64,
    pub fast_capacity_bytes: f64,
    /// Bytes (R copies) the dense tier holds: the rest of the plan's capacity.
    pub dense_capacity_bytes: f64,
    /// Hit ratios served from each tier (their sum is the plan's).
    pub fast_hit_ratio: f64,
    pub dense_hit_ratio: f64,
    /// Nodes each tier's capacity needs, and each tier's drives' write bandwidth.
    pub nodes_for_fast_capacity: f64,
    pub nodes_for_dense_capacity: f64,
    pub nodes_for_fast_write: f64,
    /// Device writes per day over each tier's raw drive capacity at the planned node
    /// count, and the years their rated writes last.
    pub fast_dwpd: f64,
    pub fast_lifetime_years: f64,
    pub dense_dwpd: f64,
    pub dense_lifetime_years: f64,
}

/// What the two tiers need for a plan of `hit` and `capacity_blocks` (at the planned rate;
/// `curve` and `scale`: the reuse curve and planned over measured rate), blocks of `block`
/// bytes in `r` copies, `write` block bytes per second. `nodes` is filled in by
/// [`TierPlan::wear`] once the node count is known.
pub struct Sizing<'a> {
    pub curve: &'a [(f64, f64)],
    pub scale: f64,
    pub hit: f64,
    pub capacity_blocks: f64,
    pub block_bytes: f64,
    pub copies: f64,
    pub write_bytes_per_s: f64,
    pub write_amplification: f64,
}

impl TierPlan {
    /// The fast tier's size, each tier's capacity and the node counts they need.
    pub fn size(f: &FastTier, node: &NodeShape, s: &Sizing<'_>) -> Result<TierPlan, String> {
        if !(f.hit_share > 0.0 && f.hit_share <= 1.0) || f.drives == 0 {
            return Err(
                "a fast tier needs a hit share within (0, 1] and at least one drive".into(),
            );
        }
        let fast_hit = s.hit * f.hit_share;
        let fast_blocks =
            (capacity_for(s.curve, fast_hit).unwrap_or(0.0) * s.scale).min(s.capacity_blocks);
        let fast_bytes = fast_blocks * s.block_bytes * s.copies;
        let dense_bytes = (s.capacity_blocks - fast_blocks) * s.block_bytes * s.copies;
        let fast_node = f.drives as f64 * f.drive.capacity_bytes as f64 * node.usable_fraction;
        let fast_write_node = (f.drives as f64 * f.drive.write_bytes_per_s / s.write_amplification)
            .min(node.nic_bytes_per_s());
        Ok(TierPlan {
            fast_capacity_blocks: fast_blocks,
            fast_capacity_bytes: fast_bytes,
            dense_capacity_bytes: dense_bytes,
            fast_hit_ratio: fast_hit,
            dense_hit_ratio: s.hit - fast_hit,
            nodes_for_fast_capacity: fast_bytes / fast_node,
            nodes_for_dense_capacity: dense_bytes / node.capacity_bytes(),
            nodes_for_fast_write: s.write_bytes_per_s / fast_write_node,
            fast_dwpd: 0.0,
            fast_lifetime_years: f64::INFINITY,
            dense_dwpd: 0.0,
            dense_lifetime_years: f64::INFINITY,
        })
    }

    /// Each tier's wear at `nodes` nodes: the whole write stream (`write` block bytes per
    /// second, times the write amplification) on each tier's raw bytes.
    pub fn wear(&mut self, f: &FastTier, node: &NodeShape, nodes: u32, device_writes: f64) {
        let per_day = device_writes * 86_400.0;
        let years = |d: &Drive, dwpd: f64| {
            if dwpd > 0.0 {
                d.rated_dwpd * d.warranty_years / dwpd
            } else {
                f64::INFINITY
            }
        };
        let fast_raw = nodes as f64 * f.drives as f64 * f.drive.capacity_bytes as f64;
        let dense_raw = nodes as f64 * node.drives as f64 * node.drive.capacity_bytes as f64;
        self.fast_dwpd = per_day / fast_raw;
        self.fast_lifetime_years = years(&f.drive, self.fast_dwpd);
        self.dense_dwpd = per_day / dense_raw;
        self.dense_lifetime_years = years(&node.drive, self.dense_dwpd);
    }
}
