//! What the engine tells about itself: its gauges, `/metrics` text, stats.

use super::*;

impl Engine {
    /// Brings the engine's gauges (capacity, use, DRAM, leases) up to date, before a scrape.
    pub fn publish_gauges(&self) {
        let c = &self.core;
        let m = &c.metrics;
        let (crc, aead) = c.offload.stats();
        for (engine, s) in [("crc32c", crc), ("aes-gcm", aead)] {
            for (figure, v) in [
                ("ops", s.ops as f64),
                ("inline_ops", s.inline_ops as f64),
                ("busy_seconds", s.busy_seconds),
                ("rejected_busy", s.rejected_busy as f64),
                ("faults", s.faults as f64),
            ] {
                m.offload.with_label_values(&[engine, figure]).set(v);
            }
        }
        if let Some(dev) = c.device.sim() {
            if m.sim.get().is_none() {
                match crate::metrics::SimGauges::register(&m.registry) {
                    Ok(g) => drop(m.sim.set(g)),
                    Err(e) => tracing::warn!("simulated device metrics not registered: {e}"),
                }
            }
            if let Some(g) = m.sim.get() {
                g.update(dev);
            }
        }
        m.capacity_bytes.set(c.geometry.capacity_bytes as i64);
        m.used_bytes
            .set(c.counters.used_bytes.load(Ordering::Relaxed) as i64);
        m.live_bytes
            .set(c.counters.live_bytes.load(Ordering::Relaxed) as i64);
        let mut by_class = [0u64; 2];
        for ns in c.namespaces.read().values() {
            by_class[usize::from(ns.class() == NamespaceClass::Weights)] += ns.used_bytes();
        }
        for (class, bytes) in [NamespaceClass::Kv, NamespaceClass::Weights]
            .into_iter()
            .zip(by_class)
        {
            m.class_bytes
                .with_label_values(&[class.as_str()])
                .set(bytes as i64);
        }
        m.blocks
            .set(c.counters.blocks.load(Ordering::Relaxed) as i64);
        m.regions_free
            .set(c.counters.regions_free.load(Ordering::Relaxed) as i64);
        let d = c.dram.lock();
        m.dram_used_bytes.set(d.used_bytes() as i64);
        m.dram_capacity_bytes.set(d.capacity_bytes() as i64);
        m.leases.set(c.leases.len() as i64);
        m.leased_bytes.set(c.leases.bytes() as i64);
    }

    pub fn stats(&self) -> Stats {
        let c = &self.core;
        let n = &c.counters;
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (dram_used, dram_cap) = {
            let d = c.dram.lock();
            (d.used_bytes() as u64, d.capacity_bytes() as u64)
        };
        let dev = ld(&n.device_written_bytes);
        let user = ld(&n.user_written_bytes);
        Stats {
            version: env!("CARGO_PKG_VERSION").to_string(),
            io_engine: c.device.info().engine.to_string(),
            direct_io: c.device.info().direct,
            capacity_bytes: c.geometry.capacity_bytes,
            used_bytes: ld(&n.used_bytes),
            live_bytes: ld(&n.live_bytes),
            block_count: ld(&n.blocks),
            region_bytes: c.geometry.region_bytes,
            regions_total: c.geometry.regions as u64,
            regions_free: ld(&n.regions_free),
            dram_capacity_bytes: dram_cap,
            dram_used_bytes: dram_used,
            hits: ld(&n.hits),
            dram_hits: ld(&n.dram_hits),
            misses: ld(&n.misses),
            integrity_errors: ld(&n.integrity_errors),
            media_errors: ld(&n.media_errors),
            evicted_blocks: ld(&n.evicted_blocks),
            evicted_regions: ld(&n.evicted_regions),
            reinserted_blocks: ld(&n.reinserted_blocks),
            device_written_bytes: dev,
            user_written_bytes: user,
            write_amplification: ctxpod_wire::types::write_amplification(dev, user),
            leases: c.leases.len() as u64,
            inflight_requests: 0,
            recovered_records: ld(&n.recovered_records),
            uptime_s: c.started.elapsed().as_secs_f64(),
            // The listeners count the bytes they move: the node fills these in.
            received_bytes: 0,
            sent_bytes: 0,
            // The request-latency histograms are the server's: `server::node_stats`.
            latency_bounds_s: Vec::new(),
            latency: Vec::new(),
            background: Default::default(),
            tiers: self.tier_stats(),
        }
    }

    /// Each tier's use, traffic, moves and (for a simulated drive) rated endurance.
    fn tier_stats(&self) -> Vec<ctxpod_wire::types::TierStats> {
        let c = &self.core;
        let g = &c.geometry;
        let m = &c.metrics.tier;
        let sims: Vec<Option<&Arc<ctxpod_firmware_sim::SimDevice>>> = match g.tiers.len() {
            0 => vec![c.device.sim()],
            _ => c.device.tier_devices().iter().map(|d| d.sim()).collect(),
        };
        (0..g.tier_count())
            .map(|t| {
                let name = g.tier_name(t);
                let regions = g.tier_regions(t);
                let capacity = (regions.end - regions.start) as u64 * g.region_bytes;
                let moved_out = match (g.tiers.len(), t) {
                    (0 | 1, _) => 0,
                    (_, 0) => m.demoted_bytes.get(),
                    _ => m.promoted_bytes.get(),
                };
                ctxpod_wire::types::TierStats {
                    name: name.to_string(),
                    capacity_bytes: capacity,
                    used_bytes: m.used_bytes.with_label_values(&[name]).get().max(0) as u64,
                    regions_total: (regions.end - regions.start) as u64,
                    regions_free: m.regions_free.with_label_values(&[name]).get().max(0) as u64,
                    read_bytes: m.read_bytes.with_label_values(&[name]).get(),
                    written_bytes: m.written_bytes.with_label_values(&[name]).get(),
                    moved_out_bytes: moved_out,
                    hits: m.hits.with_label_values(&[name]).get(),
                    rated_written_bytes: sims.get(t).copied().flatten().map(|d| {
                        let p = d.profile();
                        p.rated_dwpd * capacity as f64 * 365.0 * p.warranty_years
                    }),
                }
            })
            .collect()
    }
}
