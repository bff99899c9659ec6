//! The planner: from a model, traffic, reuse and hardware to capacity, bandwidth, nodes,
//! drive wear and the prefill GPU time saved. Every figure is arithmetic on the inputs,
//! written out in [`Plan`]; the unit tests check it against cases worked by hand.
//!
//! Reuse comes as a hit-ratio curve over capacity in blocks ([`Reuse::Curve`]: from a
//! trace's exact or sampled curve, or a node's live one), measured at some request rate.
//! The planned traffic is assumed to have the same reuse at its own rate: stack distances,
//! counted in blocks, grow in proportion to the request rate (twice the users, twice the
//! distinct blocks between two uses of a block), so the capacity a hit ratio needs scales
//! with the rate. Or a stated prefix-sharing ratio ([`Reuse::Sharing`]): that share of
//! prompt blocks is reused within the retention time; the capacity holds what is written in
//! the retention time.

pub use crate::curve::{capacity_for, curve_at};
pub use crate::hardware::{Drive, NodeShape};
use crate::model::ModelShape;
use crate::tiers::{FastTier, Sizing, TierPlan};
use serde::{Deserialize, Serialize};

/// How blocks are reused.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reuse {
    /// Hit ratio by capacity in blocks (increasing capacities), measured at
    /// `at_requests_per_s`.
    Curve {
        points: Vec<(f64, f64)>,
        at_requests_per_s: f64,
    },
    /// This share of prompt blocks is found in the tier when kept for the retention time.
    Sharing { ratio: f64 },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanInput {
    pub model: ModelShape,
    /// The model's parameters used per token (billions; active parameters for MoE), for
    /// the prefill compute a hit saves: 2 FLOPs per parameter per token.
    pub active_params_b: f64,
    pub tokens_per_block: u64,
    pub requests_per_s: f64,
    pub mean_input_tokens: f64,
    pub reuse: Reuse,
    /// The hit ratio aimed at (with a curve), in blocks.
    pub target_hit_ratio: f64,
    /// Seconds a block should stay at least (0: no requirement).
    pub retention_s: f64,
    pub node: NodeShape,
    /// Device bytes per block byte written (measured: 1.2 to 1.25 in `ctxpod replay`).
    pub write_amplification: f64,
    /// Copies of each block (R).
    pub replication: u32,
    /// A GPU's dense bf16 FLOP/s and the share of it prefill reaches.
    pub gpu_flops: f64,
    pub gpu_mfu: f64,
    /// A fast tier in front of the node's drives (`None`: one tier).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fast: Option<FastTier>,
}

/// What the planner found. Bandwidths in bytes per second.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub kv_bytes_per_token: u64,
    pub block_bytes: u64,
    pub blocks_per_request: f64,
    pub hit_ratio: f64,
    /// Blocks the tier must hold (one copy), and bytes with R copies.
    pub capacity_blocks: f64,
    pub capacity_bytes: f64,
    pub read_bytes_per_s: f64,
    /// Block bytes written per second (all copies).
    pub write_bytes_per_s: f64,
    pub nodes: u32,
    /// Which need sets the node count: `capacity`, `read`, or `write`.
    pub bound_by: String,
    pub nodes_for_capacity: f64,
    pub nodes_for_read: f64,
    pub nodes_for_write: f64,
    /// Device writes per day over the pod's raw drive capacity.
    pub dwpd: f64,
    /// Years until the drives' rated writes are spent (rated DWPD × warranty / DWPD).
    pub drive_lifetime_years: f64,
    pub prefill_tokens_saved_per_s: f64,
    /// GPUs kept busy by the prefill the tier saves.
    pub gpus_saved: f64,
    /// Notes on the inputs (a target beyond what the reuse allows, ...).
    pub notes: Vec<String>,
    /// With a fast tier: each tier's size, hits, node needs and wear (`dwpd` and
    /// `drive_lifetime_years` above are then the dense drives').
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tiers: Option<TierPlan>,
}

pub fn plan(i: &PlanInput) -> Result<Plan, String> {
    check_input(i)?;
    let mut notes = Vec::new();
    let kv = i.model.kv_bytes_per_token();
    let block = kv.saturating_mul(i.tokens_per_block);
    // A request has at least one block, however few its tokens.
    let blocks_per_request = (i.mean_input_tokens / i.tokens_per_block as f64)
        .ceil()
        .max(1.0);
    let blocks_per_s = i.requests_per_s * blocks_per_request;
    let (hit, mut capacity_blocks) = hit_and_capacity(i, &mut notes)?;
    // What is written in the retention time must fit.
    let written_blocks_per_s = blocks_per_s * (1.0 - hit);
    let for_retention = written_blocks_per_s * i.retention_s;
    if for_retention > capacity_blocks {
        if capacity_blocks > 0.0 {
            notes.push(format!(
                "retention of {} s needs {for_retention:.0} blocks, more than the hit ratio does",
                i.retention_s
            ));
        }
        capacity_blocks = for_retention;
    }
    let r = i.replication as f64;
    let capacity_bytes = capacity_blocks * block as f64 * r;
    let read = blocks_per_s * hit * block as f64;
    let write = written_blocks_per_s * block as f64 * r;
    let mut tiers = tiers_of(i, (hit, capacity_blocks), block as f64, write)?;
    let for_capacity = match &tiers {
        Some(t) => t.nodes_for_fast_capacity.max(t.nodes_for_dense_capacity),
        None => capacity_bytes / i.node.capacity_bytes(),
    };
    let for_read = read / i.node.read_bytes_per_s();
    let for_write = (write / i.node.write_bytes_per_s(i.write_amplification))
        .max(tiers.as_ref().map_or(0.0, |t| t.nodes_for_fast_write));
    let need = for_capacity.max(for_read).max(for_write);
    // At least R nodes, for R copies on distinct nodes.
    let nodes = (need.ceil() as u32).max(i.replication);
    let bound_by = if (need.ceil() as u32) < i.replication {
        "replication"
    } else if need == for_capacity {
        "capacity"
    } else if need == for_read {
        "read"
    } else {
        "write"
    };
    let raw = nodes as f64 * i.node.drives as f64 * i.node.drive.capacity_bytes as f64;
    let dwpd = write * i.write_amplification * 86_400.0 / raw;
    let lifetime = if dwpd > 0.0 {
        i.node.drive.rated_dwpd * i.node.drive.warranty_years / dwpd
    } else {
        f64::INFINITY
    };
    if let (Some(t), Some(f)) = (tiers.as_mut(), &i.fast) {
        t.wear(f, &i.node, nodes, write * i.write_amplification);
        if t.fast_lifetime_years < f.drive.warranty_years {
            notes.push(format!(
                "the fast tier's rated writes last {:.1} years, less than its {} years of \
                 warranty: every block is written to it first (more or larger fast drives \
                 spread the writes)",
                t.fast_lifetime_years, f.drive.warranty_years
            ));
        }
    }
    let tokens_saved = (blocks_per_s * hit * i.tokens_per_block as f64)
        .min(i.requests_per_s * i.mean_input_tokens);
    let flops = tokens_saved * 2.0 * i.active_params_b * 1e9;
    Ok(Plan {
        kv_bytes_per_token: kv,
        block_bytes: block,
        blocks_per_request,
        hit_ratio: hit,
        capacity_blocks,
        capacity_bytes,
        read_bytes_per_s: read,
        write_bytes_per_s: write,
        nodes,
        bound_by: bound_by.into(),
        nodes_for_capacity: for_capacity,
        nodes_for_read: for_read,
        nodes_for_write: for_write,
        dwpd,
        drive_lifetime_years: lifetime,
        prefill_tokens_saved_per_s: tokens_saved,
        gpus_saved: flops / (i.gpu_flops * i.gpu_mfu),
        notes,
        tiers,
    })
}

/// The two tiers' plan for `hit` and `capacity_blocks`, when the input has a fast tier: it
/// is sized from a reuse curve.
fn tiers_of(
    i: &PlanInput,
    (hit, capacity_blocks): (f64, f64),
    block_bytes: f64,
    write_bytes_per_s: f64,
) -> Result<Option<TierPlan>, String> {
    let Some(f) = &i.fast else {
        return Ok(None);
    };
    let Reuse::Curve {
        points,
        at_requests_per_s,
    } = &i.reuse
    else {
        return Err(
            "a fast tier is sized from a reuse curve: give a trace or the live curve".into(),
        );
    };
    let sizing = Sizing {
        curve: points,
        scale: i.requests_per_s / at_requests_per_s,
        hit,
        capacity_blocks,
        block_bytes,
        copies: i.replication as f64,
        write_bytes_per_s,
        write_amplification: i.write_amplification,
    };
    TierPlan::size(f, &i.node, &sizing).map(Some)
}

/// Refuses inputs the arithmetic cannot take: rates and shares not positive, counts of 0,
/// a target hit ratio outside 0..=1, a negative retention.
fn check_input(i: &PlanInput) -> Result<(), String> {
    let positive = [
        ("requests_per_s", i.requests_per_s),
        ("mean_input_tokens", i.mean_input_tokens),
        ("write_amplification", i.write_amplification),
        ("gpu_flops", i.gpu_flops),
        ("gpu_mfu", i.gpu_mfu),
        ("node.usable_fraction", i.node.usable_fraction),
    ];
    for (name, v) in positive {
        if !(v.is_finite() && v > 0.0) {
            return Err(format!("{name} must be a positive number"));
        }
    }
    if i.tokens_per_block == 0 || i.replication == 0 || i.node.drives == 0 || i.node.nics == 0 {
        return Err("tokens_per_block, replication, drives and nics must be at least 1".into());
    }
    if !(0.0..=1.0).contains(&i.target_hit_ratio) || i.retention_s < 0.0 {
        return Err("target_hit_ratio must be within 0..=1 and retention_s not negative".into());
    }
    Ok(())
}

/// The hit ratio the reuse allows (the target, or a curve's top with a note) and the
/// capacity in blocks it needs at the planned rate (0 for a sharing ratio: the retention
/// time sizes that).
fn hit_and_capacity(i: &PlanInput, notes: &mut Vec<String>) -> Result<(f64, f64), String> {
    match &i.reuse {
        Reuse::Curve {
            points,
            at_requests_per_s,
        } => {
            if points.is_empty() || *at_requests_per_s <= 0.0 {
                return Err(
                    "a reuse curve needs points and the request rate it was measured at".into(),
                );
            }
            let scale = i.requests_per_s / at_requests_per_s;
            Ok(match capacity_for(points, i.target_hit_ratio) {
                Some(c) => (i.target_hit_ratio, c * scale),
                None => {
                    let (c, h) = *points.last().expect("not empty");
                    notes.push(format!(
                        "the reuse tops out at a hit ratio of {h:.3}: planned for that, not {:.3}",
                        i.target_hit_ratio
                    ));
                    (h, c * scale)
                }
            })
        }
        Reuse::Sharing { ratio } => {
            if !(0.0..=1.0).contains(ratio) {
                return Err("the sharing ratio must be within 0..=1".into());
            }
            if i.retention_s == 0.0 {
                return Err("a sharing ratio needs a retention time".into());
            }
            Ok((*ratio, 0.0))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qlc_node() -> NodeShape {
        NodeShape {
            drives: 8,
            drive: Drive {
                name: "qlc".into(),
                capacity_bytes: 61_440_000_000_000,
                read_bytes_per_s: 7.0e9,
                write_bytes_per_s: 3.3e9,
                rated_dwpd: 0.58,
                warranty_years: 5.0,
            },
            nics: 1,
            nic_gbit_per_s: 400.0,
            usable_fraction: 0.9,
        }
    }

    fn llama70(reuse: Reuse, target: f64, retention_s: f64) -> PlanInput {
        PlanInput {
            model: crate::model::shape("llama-3.1-70b").unwrap(),
            active_params_b: 70.0,
            tokens_per_block: 512,
            requests_per_s: 10.0,
            mean_input_tokens: 8192.0,
            reuse,
            target_hit_ratio: target,
            retention_s,
            node: qlc_node(),
            write_amplification: 1.25,
            replication: 1,
            gpu_flops: 989e12,
            gpu_mfu: 0.5,
            fast: None,
        }
    }

    /// Inputs a request may carry (absurd but well-formed) give a plan or a reason, never
    /// an overflow: a block of 10^14 tokens, the largest custom shape, a request of
    /// a fraction of a token.
    #[test]
    fn absurd_inputs_never_overflow() {
        let sharing = || Reuse::Sharing { ratio: 0.5 };
        let mut big_block = llama70(sharing(), 0.5, 60.0);
        big_block.tokens_per_block = 100_000_000_000_000;
        let mut big_shape = llama70(sharing(), 0.5, 60.0);
        big_shape.model = crate::model::ModelShape::parse_custom(
            "layers=1048576,kv_heads=1048576,head_dim=1048576,dtype=fp32",
        )
        .unwrap();
        big_shape.tokens_per_block = 1 << 20;
        let mut tiny = llama70(sharing(), 0.5, 60.0);
        tiny.mean_input_tokens = 5e-324;
        for i in [big_block, big_shape, tiny] {
            if let Ok(p) = plan(&i) {
                assert!(p.block_bytes > 0);
            }
        }
    }

    #[test]
    fn llama_70b_by_hand() {
        // 320 KiB per token, 512 tokens: 160 MiB blocks; 8192 tokens: 16 blocks a request.
        // Curve: 0.5 at 100,000 blocks measured at 5 req/s; at 10 req/s: 200,000 blocks.
        let curve = Reuse::Curve {
            points: vec![(50_000.0, 0.25), (100_000.0, 0.5), (400_000.0, 0.6)],
            at_requests_per_s: 5.0,
        };
        let p = plan(&llama70(curve, 0.5, 0.0)).unwrap();
        let block = 160.0 * 1048576.0;
        assert_eq!(p.kv_bytes_per_token, 327_680);
        assert_eq!(p.block_bytes, 167_772_160);
        assert_eq!(p.blocks_per_request, 16.0);
        assert!((p.capacity_blocks - 200_000.0).abs() < 1e-6);
        // 200,000 × 160 MiB = 33.55 TB.
        assert!((p.capacity_bytes - 200_000.0 * block).abs() < 1.0);
        // 10 req/s × 16 blocks × 0.5 × 160 MiB = 13.42 GB/s read, the same written.
        assert!((p.read_bytes_per_s - 80.0 * block).abs() < 1.0);
        assert!((p.write_bytes_per_s - 80.0 * block).abs() < 1.0);
        // A node: 8 × 61.44 TB × 0.9 = 442.4 TB; reads min(56, 50) GB/s = 50 GB/s (the NIC);
        // writes min(8 × 3.3 / 1.25 = 21.12, 50) GB/s.
        assert!((p.nodes_for_capacity - 200_000.0 * block / 442.368e12).abs() < 1e-9);
        assert!((p.nodes_for_read - 80.0 * block / 50e9).abs() < 1e-9);
        assert!((p.nodes_for_write - 80.0 * block / 21.12e9).abs() < 1e-9);
        assert_eq!((p.nodes, p.bound_by.as_str()), (1, "write"));
        // DWPD: 13.42 GB/s × 1.25 × 86,400 s over 491.52 TB raw = 2.95 a day; the drives'
        // 0.58 × 5 years of writes last 0.98 years.
        let dwpd = 80.0 * block * 1.25 * 86_400.0 / 491.52e12;
        assert!((p.dwpd - dwpd).abs() < 1e-9, "{}", p.dwpd);
        assert!((p.drive_lifetime_years - 0.58 * 5.0 / dwpd).abs() < 1e-9);
        // Saved: 80 blocks/s × 512 tokens = 40,960 tokens/s × 2 × 70e9 FLOPs = 5.73 PFLOP/s,
        // over 989 TFLOP/s × 0.5: 11.6 GPUs.
        assert!((p.prefill_tokens_saved_per_s - 40_960.0).abs() < 1e-6);
        assert!((p.gpus_saved - 40_960.0 * 140e9 / 494.5e12).abs() < 1e-9);
    }

    #[test]
    fn sharing_and_retention_by_hand() {
        // 30 % of 160 blocks/s reused: 112 blocks/s written; kept 1 hour: 403,200 blocks.
        let p = plan(&llama70(Reuse::Sharing { ratio: 0.3 }, 0.0, 3600.0)).unwrap();
        assert!((p.capacity_blocks - 403_200.0).abs() < 1e-6);
        assert!((p.hit_ratio - 0.3).abs() < 1e-12);
        // R = 2 doubles capacity and writes, not reads.
        let mut i = llama70(Reuse::Sharing { ratio: 0.3 }, 0.0, 3600.0);
        i.replication = 2;
        let p2 = plan(&i).unwrap();
        assert!((p2.capacity_bytes - 2.0 * p.capacity_bytes).abs() < 1.0);
        assert!((p2.write_bytes_per_s - 2.0 * p.write_bytes_per_s).abs() < 1.0);
        assert_eq!(p2.read_bytes_per_s, p.read_bytes_per_s);
        assert!(p2.nodes >= 2);
    }

    #[test]
    fn a_target_beyond_the_reuse_is_said_and_bad_inputs_refused() {
        let curve = Reuse::Curve {
            points: vec![(1000.0, 0.1), (2000.0, 0.2)],
            at_requests_per_s: 10.0,
        };
        let p = plan(&llama70(curve.clone(), 0.9, 0.0)).unwrap();
        assert_eq!(p.hit_ratio, 0.2);
        assert!(p.notes[0].contains("tops out"));
        let mut bad = llama70(curve, 0.5, 0.0);
        bad.requests_per_s = -1.0;
        assert!(plan(&bad).is_err());
        assert!(plan(&llama70(Reuse::Sharing { ratio: 0.3 }, 0.0, 0.0)).is_err());
        assert!(plan(&llama70(Reuse::Sharing { ratio: 1.3 }, 0.0, 60.0)).is_err());
    }

    #[test]
    fn two_tiers_by_hand() {
        // The llama_70b_by_hand plan (0.5 of 200,000 blocks of 160 MiB at 10 req/s, 13.42 GB/s
        // written) with two SLC drives of 3.84 TB in front of the eight QLC ones, to serve
        // half the hits: 0.25, which the curve reaches at 50,000 blocks at 5 req/s, so
        // 100,000 blocks at 10 req/s in `fast` (16.78 TB) and the other 100,000 in `dense`.
        let curve = Reuse::Curve {
            points: vec![(50_000.0, 0.25), (100_000.0, 0.5), (400_000.0, 0.6)],
            at_requests_per_s: 5.0,
        };
        let slc = Drive {
            name: "slc".into(),
            capacity_bytes: 3_840_000_000_000,
            read_bytes_per_s: 7.0e9,
            write_bytes_per_s: 6.0e9,
            rated_dwpd: 60.0,
            warranty_years: 5.0,
        };
        let mut i = llama70(curve, 0.5, 0.0);
        i.fast = Some(FastTier {
            drives: 2,
            drive: slc,
            hit_share: 0.5,
        });
        let p = plan(&i).unwrap();
        let t = p.tiers.clone().expect("two tiers");
        let block = 160.0 * 1048576.0;
        assert!((t.fast_capacity_blocks - 100_000.0).abs() < 1e-6);
        assert!((t.fast_capacity_bytes - 100_000.0 * block).abs() < 1.0);
        assert!((t.dense_capacity_bytes - 100_000.0 * block).abs() < 1.0);
        assert!(
            (t.fast_hit_ratio - 0.25).abs() < 1e-12 && (t.dense_hit_ratio - 0.25).abs() < 1e-12
        );
        // `fast` per node: 2 × 3.84 TB × 0.9 = 6.912 TB, so 2.43 nodes for its 16.78 TB;
        // its drives take min(2 × 6 / 1.25, 50) = 9.6 GB/s of the 13.42 written: 1.40 nodes.
        assert!((t.nodes_for_fast_capacity - 100_000.0 * block / 6.912e12).abs() < 1e-9);
        assert!((t.nodes_for_dense_capacity - 100_000.0 * block / 442.368e12).abs() < 1e-9);
        assert!((t.nodes_for_fast_write - 80.0 * block / 9.6e9).abs() < 1e-9);
        assert_eq!((p.nodes, p.bound_by.as_str()), (3, "capacity"));
        // Wear at 3 nodes: 16.78 GB/s of device writes a day over 23.04 TB of SLC is 62.9
        // DWPD (60 × 5 years last 4.77 years), over 1.47 PB of QLC 0.98.
        let per_day = 80.0 * block * 1.25 * 86_400.0;
        assert!(
            (t.fast_dwpd - per_day / 23.04e12).abs() < 1e-9,
            "{}",
            t.fast_dwpd
        );
        assert!((t.fast_lifetime_years - 300.0 / t.fast_dwpd).abs() < 1e-9);
        assert!((t.dense_dwpd - per_day / 1474.56e12).abs() < 1e-9);
        assert!(
            (p.dwpd - t.dense_dwpd).abs() < 1e-12,
            "the plan's DWPD is the dense drives'"
        );
        // A sharing ratio gives no curve to size `fast` from; a share of 0 is refused.
        let mut sharing = llama70(Reuse::Sharing { ratio: 0.3 }, 0.0, 3600.0);
        sharing.fast.clone_from(&i.fast);
        assert!(plan(&sharing).unwrap_err().contains("reuse curve"));
        let mut zero = i.clone();
        zero.fast.as_mut().unwrap().hit_share = 0.0;
        assert!(plan(&zero).is_err());
    }

    #[test]
    fn curves_read_and_invert() {
        let pts = [(100.0, 0.1), (200.0, 0.3)];
        assert!((curve_at(&pts, 150.0) - 0.2).abs() < 1e-12);
        assert!((capacity_for(&pts, 0.2).unwrap() - 150.0).abs() < 1e-9);
        assert_eq!(curve_at(&pts, 1e9), 0.3);
        assert!(capacity_for(&pts, 0.5).is_none());
    }
}
