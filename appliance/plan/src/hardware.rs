//! The hardware a plan is for: a flash drive and a node of them (`planner`, `tiers`).

use serde::{Deserialize, Serialize};

/// One flash drive.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Drive {
    pub name: String,
    pub capacity_bytes: u64,
    pub read_bytes_per_s: f64,
    pub write_bytes_per_s: f64,
    /// Rated drive writes per day over the warranty.
    pub rated_dwpd: f64,
    pub warranty_years: f64,
}

/// One flash node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeShape {
    pub drives: u32,
    pub drive: Drive,
    pub nics: u32,
    pub nic_gbit_per_s: f64,
    /// Share of the drives' capacity given to blocks (the rest: the node's region
    /// reserve, over-provisioning for write amplification).
    pub usable_fraction: f64,
}

impl NodeShape {
    pub fn capacity_bytes(&self) -> f64 {
        self.drives as f64 * self.drive.capacity_bytes as f64 * self.usable_fraction
    }
    pub fn nic_bytes_per_s(&self) -> f64 {
        self.nics as f64 * self.nic_gbit_per_s * 1e9 / 8.0
    }
    pub fn read_bytes_per_s(&self) -> f64 {
        (self.drives as f64 * self.drive.read_bytes_per_s).min(self.nic_bytes_per_s())
    }
    /// Block bytes a node can take per second: its drives' write bandwidth over the write
    /// amplification, or its NICs.
    pub fn write_bytes_per_s(&self, write_amplification: f64) -> f64 {
        (self.drives as f64 * self.drive.write_bytes_per_s / write_amplification)
            .min(self.nic_bytes_per_s())
    }
}
