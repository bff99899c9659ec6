//! The writer's regions, tier by tier (docs/design/0003). A node of one device has one
//! tier; a node of two has `fast` (tier 0) and `dense` (tier 1), each with its own free,
//! sealed and open regions. Blocks are written to `fast` (to `dense` only when `fast` has
//! no room); extents of large values to `dense` (large sequential reads, which dense
//! flash serves well, and no demotion to copy them through). Reclaim of a `fast` region
//! demotes its live records into `dense` (`eviction.rs`); only `dense` evicts.

use super::*;

/// One tier's regions, as the writer keeps them.
pub(super) struct TierRegions {
    pub free: VecDeque<u32>,
    /// Sealed regions, oldest first.
    pub sealed: VecDeque<u32>,
    pub open: Option<u32>,
    /// Free regions kept in reserve so that one group commit and one reclaim always fit.
    pub reserve: usize,
    /// Its `ctxpod_tier_used_bytes` and `ctxpod_tier_regions_free` series (set at every
    /// batch, looked up once).
    used_gauge: prometheus::IntGauge,
    free_gauge: prometheus::IntGauge,
}

/// Each tier's regions from the region table. At most one region per tier is open; should
/// an older one be found open, it is sealed.
pub(super) fn load(core: &Core, regions: &[RegionMeta]) -> Vec<TierRegions> {
    let g = &core.geometry;
    let batch_regions = core.cfg.group_commit_max_bytes.0.div_ceil(g.region_bytes) as usize;
    (0..g.tier_count())
        .map(|t| {
            let range = g.tier_regions(t);
            let mut open: Vec<u32> = Vec::new();
            let mut sealed: Vec<u32> = Vec::new();
            let mut free = VecDeque::new();
            for r in range.clone() {
                match regions[r as usize].state {
                    RegionState::Free => free.push_back(r),
                    RegionState::Open => open.push(r),
                    RegionState::Sealed => sealed.push(r),
                }
            }
            open.sort_by_key(|&r| regions[r as usize].open_seq);
            let current = open.pop();
            sealed.extend(open);
            sealed.sort_by_key(|&r| regions[r as usize].open_seq);
            let n = (range.end - range.start) as usize;
            let m = &core.metrics.tier;
            TierRegions {
                free,
                sealed: sealed.into(),
                open: current,
                reserve: (batch_regions + 2).min(n / 2).max(1),
                used_gauge: m.used_bytes.with_label_values(&[g.tier_name(t)]),
                free_gauge: m.regions_free.with_label_values(&[g.tier_name(t)]),
            }
        })
        .collect()
}

impl Writer {
    /// The tier that evicts (the last: `dense`, or the only one).
    pub(super) fn evicting_tier(&self) -> usize {
        self.tiers.len() - 1
    }

    /// Space for a block's record: in `fast` (or the only tier), else in `dense`.
    pub(super) fn alloc_put(&mut self, bytes: usize) -> anyhow::Result<Option<(u32, u32)>> {
        match self.alloc(0, bytes)? {
            Some(p) => Ok(Some(p)),
            None if self.tiers.len() > 1 => self.alloc(self.evicting_tier(), bytes),
            None => Ok(None),
        }
    }

    /// Space for an extent of a large value: in `dense` (or the only tier), else `fast`.
    pub(super) fn alloc_extent(&mut self, bytes: usize) -> anyhow::Result<Option<(u32, u32)>> {
        let last = self.evicting_tier();
        match self.alloc(last, bytes)? {
            Some(p) => Ok(Some(p)),
            None if last > 0 => self.alloc(0, bytes),
            None => Ok(None),
        }
    }

    /// Space for a record of `bytes` in tier `t`'s open region, opening a new one when it is
    /// full; `None` when the tier has no free region.
    ///
    /// A region's epoch (`open_seq`, and the `tail_epoch` its records carry) is a fresh
    /// number from the node's sequence, which is never handed out twice, not even across
    /// crashes: records left over from any earlier life of the region, acknowledged or not,
    /// can never carry the current epoch. Each start gives every open region's tail a fresh
    /// epoch too (see `recovery::open`).
    pub(super) fn alloc(&mut self, t: usize, bytes: usize) -> anyhow::Result<Option<(u32, u32)>> {
        let rb = self.core.geometry.region_bytes as usize;
        loop {
            if let Some(r) = self.tiers[t].open {
                let m = &mut self.regions[r as usize];
                let wp = m.write_ptr as usize;
                if wp + bytes <= rb {
                    m.write_ptr = (wp + bytes) as u32;
                    self.touched.insert(r);
                    return Ok(Some((r, wp as u32)));
                }
                debug_assert_eq!(m.state, RegionState::Open, "only the open region is sealed");
                m.state = RegionState::Sealed;
                self.touched.insert(r);
                self.transition = true;
                self.tiers[t].sealed.push_back(r);
                self.tiers[t].open = None;
            }
            let Some(&r) = self.tiers[t].free.front() else {
                return Ok(None);
            };
            let epoch = self.core.next_seq()?;
            self.tiers[t].free.pop_front();
            self.transition = true;
            debug_assert_eq!(
                self.regions[r as usize].state,
                RegionState::Free,
                "only a free region is opened"
            );
            self.regions[r as usize] = RegionMeta::opened(epoch);
            self.touched.insert(r);
            self.tiers[t].open = Some(r);
        }
    }

    /// Bytes in use and free regions, node-wide and per tier, for stats and metrics.
    pub(super) fn publish(&self) {
        let rb = self.core.geometry.region_bytes;
        let (mut used, mut free) = (0, 0);
        for tier in &self.tiers {
            let u = tier.sealed.len() as u64 * rb
                + tier
                    .open
                    .map_or(0, |r| self.regions[r as usize].write_ptr as u64);
            tier.used_gauge.set(u as i64);
            tier.free_gauge.set(tier.free.len() as i64);
            used += u;
            free += tier.free.len() as u64;
        }
        self.core.counters.used_bytes.store(used, Ordering::Relaxed);
        self.core
            .counters
            .regions_free
            .store(free, Ordering::Relaxed);
    }
}
