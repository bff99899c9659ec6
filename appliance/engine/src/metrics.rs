//! The engine's Prometheus series, and the node's one registry they live in: the pod's
//! (`ctxpod_pod::metrics`) and the node's own (`ctxpod_node::metrics`) are registered in the
//! same [`Metrics::registry`], so that `/metrics` is one page. Every series: `ctxpod_` prefix,
//! base units, `_total` counters, bounded label sets (an operation name, a tier, an engine:
//! never a key or a namespace id).

use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

/// Registers a metric that was just defined in `r` and returns it: definitions are static, and
/// each is registered once (a second registration of a name is a bug, and panics).
pub fn register<M>(r: &Registry, m: prometheus::Result<M>) -> M
where
    M: prometheus::core::Collector + Clone + 'static,
{
    let m = m.expect("metric definitions are static and valid");
    r.register(Box::new(m.clone()))
        .expect("each metric is registered once");
    m
}

/// A counter defined and registered in `r` (see [`register`]).
pub fn counter(r: &Registry, name: &str, help: &str) -> IntCounter {
    register(r, IntCounter::new(name, help))
}

/// A gauge defined and registered in `r` (see [`register`]).
pub fn gauge(r: &Registry, name: &str, help: &str) -> IntGauge {
    register(r, IntGauge::new(name, help))
}

pub struct Metrics {
    pub registry: Registry,
    /// Set when the node runs on a simulated device.
    pub sim: std::sync::OnceLock<SimGauges>,
    /// Block lookups that found the block, by tier (`dram`, `flash`).
    pub hits: IntCounterVec,
    pub misses: IntCounter,
    pub integrity_errors: IntCounter,
    /// Device reads that failed (uncorrectable), by what was reading: `reclaim` (a record
    /// eviction meant to move; it is dropped instead), `tail_scan` (start-up re-indexing).
    pub media_errors: IntCounterVec,
    pub evicted_blocks: IntCounter,
    pub evicted_regions: IntCounter,
    pub reinserted_blocks: IntCounter,
    pub device_written_bytes: IntCounter,
    /// Record writes the writer issued: a group commit's records, back to back on the
    /// device, are one vectored write.
    pub device_writes: IntCounter,
    pub device_read_bytes: IntCounter,
    /// Reads of part of a segmented record: its 4 KiB head and the segments a range needs.
    pub part_reads: IntCounter,
    /// Payload bytes users asked to store (the denominator of write amplification).
    pub user_written_bytes: IntCounter,
    pub device_flushes: IntCounter,
    pub group_commit_blocks: Histogram,
    pub flush_seconds: Histogram,
    pub index_commit_seconds: Histogram,
    pub group_commit_seconds: Histogram,
    pub busy_rejections: IntCounterVec,
    /// Offload engines (`crc32c`, `aes-gcm`): operations run, seconds their workers were
    /// busy, submissions refused (queue full), operations failed by injected faults.
    pub offload: prometheus::GaugeVec,
    pub io_engine_info: IntGaugeVec,
    pub capacity_bytes: IntGauge,
    pub used_bytes: IntGauge,
    pub live_bytes: IntGauge,
    /// Payload bytes of live blocks and values by namespace class (`kv`, `weights`).
    pub class_bytes: IntGaugeVec,
    /// Tiers inside the node: per tier use, demotions, promotions.
    pub tier: TierMetrics,
    pub compression: CompressionMetrics,
    pub blocks: IntGauge,
    pub dram_used_bytes: IntGauge,
    pub dram_capacity_bytes: IntGauge,
    pub regions_free: IntGauge,
    pub leases: IntGauge,
    /// Multipart uploads in progress (at most `UPLOADS_MAX`).
    pub uploads: IntGauge,
    /// Device bytes of leased (pinned or held) records.
    pub leased_bytes: IntGauge,
    /// Leases refused, by reason (`table`, `node_bytes`, `tenant_bytes`).
    pub lease_refusals: IntCounterVec,
    /// Regions eviction kept in place because leased records fill most of them.
    pub reclaim_skipped: IntCounter,
    pub dek_rotations: IntCounter,
    pub kek_rotations: IntCounter,
}

/// Upper bounds of the request-latency buckets (20 µs to 2.6 s, doubling).
pub fn latency_buckets() -> Vec<f64> {
    prometheus::exponential_buckets(20e-6, 2.0, 18).expect("valid bucket parameters")
}

/// A counter with labels, defined and registered in `r` (see [`register`]).
fn counter_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    register(r, IntCounterVec::new(Opts::new(name, help), labels))
}

/// A gauge with labels, defined and registered in `r` (see [`register`]).
fn int_gauge_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    register(r, IntGaugeVec::new(Opts::new(name, help), labels))
}

/// A gauge of floats with labels, defined and registered in `r` (see [`register`]).
fn gauge_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> prometheus::GaugeVec {
    register(r, prometheus::GaugeVec::new(Opts::new(name, help), labels))
}

/// A histogram over [`latency_buckets`], defined and registered in `r` (see [`register`]).
fn latency(r: &Registry, name: &str, help: &str) -> Histogram {
    register(
        r,
        Histogram::with_opts(HistogramOpts::new(name, help).buckets(latency_buckets())),
    )
}

/// Block lookups, and records found damaged or unreadable: fields of [`Metrics`], in order
/// (so registered in the order of the fields, as every family below).
fn lookup_series(r: &Registry) -> (IntCounterVec, IntCounter, IntCounter, IntCounterVec) {
    (
        // `hits`
        counter_vec(
            r,
            "ctxpod_block_hits_total",
            "Block lookups that found the block, by tier",
            &["tier"],
        ),
        // `misses`
        counter(
            r,
            "ctxpod_block_misses_total",
            "Block lookups that found nothing",
        ),
        // `integrity_errors`
        counter(
            r,
            "ctxpod_integrity_errors_total",
            "Records that failed a header, GCM or CRC32C check and were quarantined",
        ),
        // `media_errors`
        counter_vec(
            r,
            "ctxpod_media_errors_total",
            "Device reads that failed outside a client's request, by what was \
             reading; the record concerned is dropped, the node stays writable",
            &["op"],
        ),
    )
}

/// Eviction: blocks dropped, regions reclaimed, blocks moved.
fn eviction_series(r: &Registry) -> (IntCounter, IntCounter, IntCounter) {
    (
        // `evicted_blocks`
        counter(
            r,
            "ctxpod_evicted_blocks_total",
            "Blocks dropped by eviction",
        ),
        // `evicted_regions`
        counter(
            r,
            "ctxpod_evicted_regions_total",
            "Regions reclaimed by eviction",
        ),
        // `reinserted_blocks`
        counter(
            r,
            "ctxpod_reinserted_blocks_total",
            "Blocks moved out of an evicted region (recently read or leased)",
        ),
    )
}

/// Device and user traffic.
fn traffic_series(r: &Registry) -> (IntCounter, IntCounter, IntCounter, IntCounter) {
    (
        // `device_written_bytes`
        counter(
            r,
            "ctxpod_device_written_bytes_total",
            "Bytes written to the device",
        ),
        // `device_read_bytes`
        counter(
            r,
            "ctxpod_device_read_bytes_total",
            "Bytes read from the device",
        ),
        // `user_written_bytes`
        counter(
            r,
            "ctxpod_user_written_bytes_total",
            "Payload bytes of newly stored blocks (write amplification = device / user)",
        ),
        // `device_flushes`
        counter(r, "ctxpod_device_flushes_total", "Device flushes"),
    )
}

/// Group commits: their size, and the time of their phases.
fn commit_series(r: &Registry) -> (Histogram, Histogram, Histogram, Histogram) {
    (
        // `group_commit_blocks`
        register(
            r,
            Histogram::with_opts(
                HistogramOpts::new("ctxpod_group_commit_blocks", "Writes per group commit")
                    .buckets(prometheus::exponential_buckets(1.0, 2.0, 10).expect("valid buckets")),
            ),
        ),
        // `group_commit_seconds`
        latency(
            r,
            "ctxpod_group_commit_duration_seconds",
            "Time of one group commit",
        ),
        // `flush_seconds`
        latency(
            r,
            "ctxpod_device_flush_duration_seconds",
            "Time of one device flush",
        ),
        // `index_commit_seconds`
        latency(
            r,
            "ctxpod_index_commit_duration_seconds",
            "Time of one RocksDB batch write (synced or not)",
        ),
    )
}

/// Refusals of full queues, the offload engines, the device I/O engine.
fn engine_series(r: &Registry) -> (IntCounterVec, prometheus::GaugeVec, IntGaugeVec) {
    (
        // `busy_rejections`
        counter_vec(
            r,
            "ctxpod_busy_rejections_total",
            "Requests refused with 503, by full queue",
            &["queue"],
        ),
        // `offload`
        gauge_vec(
            r,
            "ctxpod_offload",
            "Offload engines: ops, inline_ops (of ops, run on the request thread), busy_seconds, rejected_busy, faults (monotonic)",
            &["engine", "figure"],
        ),
        // `io_engine_info`
        int_gauge_vec(
            r,
            "ctxpod_io_engine_info",
            "The device I/O engine in use (value 1)",
            &["engine", "direct"],
        ),
    )
}

/// Tiers inside a node (issue #36): per tier (`fast`, `dense`; `device` for a node of
/// one) device bytes in regions in use and free regions; demotions and promotions.
pub struct TierMetrics {
    pub used_bytes: IntGaugeVec,
    pub regions_free: IntGaugeVec,
    /// Records (and their device bytes) moved from `fast` to `dense` at `fast`'s reclaim.
    pub demoted_records: IntCounter,
    pub demoted_bytes: IntCounter,
    /// Records (and their device bytes) moved from `dense` to `fast` by promotion.
    pub promoted_records: IntCounter,
    pub promoted_bytes: IntCounter,
    /// Promotion hints dropped for a full queue.
    pub promote_hints_dropped: IntCounter,
    /// Hinted promotions refused: the block was read less often than those its room
    /// would have pushed out of `fast`.
    pub promotions_not_admitted: IntCounter,
    /// Record bytes read from and written to each tier.
    pub read_bytes: IntCounterVec,
    pub written_bytes: IntCounterVec,
    /// Client reads served from each tier's device.
    pub hits: IntCounterVec,
    /// Extents of large values read again at their new place: they moved between tiers
    /// while a reader read them.
    pub extent_rereads: IntCounter,
}

impl TierMetrics {
    fn register(r: &Registry) -> TierMetrics {
        TierMetrics {
            used_bytes: int_gauge_vec(
                r,
                "ctxpod_tier_used_bytes",
                "Device bytes in regions in use, by tier (fast, dense; device for a node of one)",
                &["tier"],
            ),
            regions_free: int_gauge_vec(
                r,
                "ctxpod_tier_regions_free",
                "Free regions, by tier (fast, dense; device for a node of one)",
                &["tier"],
            ),
            demoted_records: counter(
                r,
                "ctxpod_tier_demoted_records_total",
                "Records moved from the fast tier to the dense tier when a fast region was reclaimed",
            ),
            demoted_bytes: counter(
                r,
                "ctxpod_tier_demoted_bytes_total",
                "Device bytes of records moved from the fast tier to the dense tier",
            ),
            promoted_records: counter(
                r,
                "ctxpod_tier_promoted_records_total",
                "Records moved from the dense tier to the fast tier by promotion",
            ),
            promoted_bytes: counter(
                r,
                "ctxpod_tier_promoted_bytes_total",
                "Device bytes of records moved from the dense tier to the fast tier",
            ),
            promote_hints_dropped: counter(
                r,
                "ctxpod_tier_promote_hints_dropped_total",
                "Promotion hints (pins, prefetch holds, second reads) dropped: the queue was full",
            ),
            extent_rereads: counter(
                r,
                "ctxpod_tier_extent_rereads_total",
                "Extents of large values read again at their new place: moved between tiers \
                 while they were read",
            ),
            promotions_not_admitted: counter(
                r,
                "ctxpod_tier_promotions_not_admitted_total",
                "Hinted promotions refused: the block was read less often than the fast tier's \
                 oldest blocks, which its room would have demoted",
            ),
            read_bytes: counter_vec(
                r,
                "ctxpod_tier_read_bytes_total",
                "Record bytes read from each tier (fast, dense; device for a node of one)",
                &["tier"],
            ),
            written_bytes: counter_vec(
                r,
                "ctxpod_tier_written_bytes_total",
                "Record bytes written to each tier (fast, dense; device for a node of one)",
                &["tier"],
            ),
            hits: counter_vec(
                r,
                "ctxpod_tier_hits_total",
                "Client reads served from each tier's device (fast, dense; device for a node \
                 of one); DRAM hits are in ctxpod_hits_total{tier=\"dram\"}",
                &["tier"],
            ),
        }
    }
}

/// Cold compression (`compress`), by codec: at demotion, and of large values' extents as
/// they are written to the dense tier.
pub struct CompressionMetrics {
    /// Records (blocks, extents) written compressed into the dense tier.
    pub records: IntCounterVec,
    /// Device bytes of their records before and after.
    pub input_bytes: IntCounterVec,
    pub output_bytes: IntCounterVec,
    /// Records demoted (or extents written) as they were: compressing saved too little.
    pub skipped: IntCounterVec,
}

impl CompressionMetrics {
    fn register(r: &Registry) -> CompressionMetrics {
        let codec = &["codec"];
        CompressionMetrics {
            records: counter_vec(
                r,
                "ctxpod_compression_records_total",
                "Records (blocks, extents of large values) compressed as they moved to, or were \
                 written to, the dense tier, by codec",
                codec,
            ),
            input_bytes: counter_vec(
                r,
                "ctxpod_compression_input_bytes_total",
                "Device bytes of the records compressed (before), by codec",
                codec,
            ),
            output_bytes: counter_vec(
                r,
                "ctxpod_compression_output_bytes_total",
                "Device bytes of the compressed records written (after), by codec",
                codec,
            ),
            skipped: counter_vec(
                r,
                "ctxpod_compression_skipped_total",
                "Records of a compressing namespace demoted (or extents written) uncompressed: \
                 compression saved less than compression_min_saving, by codec",
                codec,
            ),
        }
    }
}

impl Metrics {
    pub fn new() -> Self {
        let r = Registry::new();
        let (hits, misses, integrity_errors, media_errors) = lookup_series(&r);
        let (evicted_blocks, evicted_regions, reinserted_blocks) = eviction_series(&r);
        let (device_written_bytes, device_read_bytes, user_written_bytes, device_flushes) =
            traffic_series(&r);
        let (group_commit_blocks, group_commit_seconds, flush_seconds, index_commit_seconds) =
            commit_series(&r);
        let (busy_rejections, offload, io_engine_info) = engine_series(&r);
        Metrics {
            hits,
            misses,
            integrity_errors,
            media_errors,
            evicted_blocks,
            evicted_regions,
            reinserted_blocks,
            device_written_bytes,
            device_writes: counter(
                &r,
                "ctxpod_device_writes_total",
                "Record writes issued to the device (a group commit's records, back to back, are one)",
            ),
            device_read_bytes,
            part_reads: counter(
                &r,
                "ctxpod_part_reads_total",
                "Range reads that read only the segments of a record holding the range (and its 4 KiB head)",
            ),
            user_written_bytes,
            device_flushes,
            group_commit_blocks,
            group_commit_seconds,
            flush_seconds,
            index_commit_seconds,
            busy_rejections,
            offload,
            io_engine_info,
            capacity_bytes: gauge(&r, "ctxpod_capacity_bytes", "Configured flash capacity"),
            used_bytes: gauge(&r, "ctxpod_used_bytes", "Device bytes in regions in use"),
            live_bytes: gauge(&r, "ctxpod_live_bytes", "Payload bytes of live blocks"),
            class_bytes: int_gauge_vec(
                &r,
                "ctxpod_class_bytes",
                "Payload bytes of live blocks by namespace class (weights are never evicted)",
                &["class"],
            ),
            tier: TierMetrics::register(&r),
            compression: CompressionMetrics::register(&r),
            blocks: gauge(&r, "ctxpod_blocks", "Live blocks"),
            dram_used_bytes: gauge(&r, "ctxpod_dram_used_bytes", "Bytes held by the DRAM tier"),
            dram_capacity_bytes: gauge(&r, "ctxpod_dram_capacity_bytes", "DRAM tier limit"),
            regions_free: gauge(&r, "ctxpod_regions_free", "Free regions"),
            leases: gauge(&r, "ctxpod_leases", "Keys pinned by a lease"),
            uploads: gauge(&r, "ctxpod_uploads", "Multipart uploads in progress"),
            leased_bytes: gauge(
                &r,
                "ctxpod_leased_bytes",
                "Device bytes of leased (pinned or held) records",
            ),
            lease_refusals: counter_vec(
                &r,
                "ctxpod_lease_refusals_total",
                "Leases refused, by reason (table, node_bytes, tenant_bytes)",
                &["reason"],
            ),
            reclaim_skipped: counter(
                &r,
                "ctxpod_reclaim_skipped_regions_total",
                "Regions eviction kept in place because leased records fill most of them",
            ),
            dek_rotations: counter(
                &r,
                "ctxpod_dek_rotations_total",
                "Namespace data keys rotated (on request, or after dek_rotate_after_writes writes)",
            ),
            kek_rotations: counter(
                &r,
                "ctxpod_kek_rotations_total",
                "Key-encryption key rotations (every data key re-wrapped under the new KEK)",
            ),
            registry: r,
            sim: std::sync::OnceLock::new(),
        }
    }
}

/// Gauges of a simulated device (firmware-sim), registered when the node runs on one.
pub struct SimGauges {
    host_written: IntGauge,
    nand_written: IntGauge,
    gc_relocated: IntGauge,
    erases: IntGauge,
    pe_max: IntGauge,
    power_cuts: IntGauge,
    faults: IntGaugeVec,
    floats: prometheus::GaugeVec,
}

impl SimGauges {
    pub fn register(r: &Registry) -> prometheus::Result<SimGauges> {
        let g = |name: &str, help: &str| -> prometheus::Result<IntGauge> {
            let m = IntGauge::new(name, help)?;
            r.register(Box::new(m.clone()))?;
            Ok(m)
        };
        let faults = IntGaugeVec::new(
            Opts::new(
                "ctxpod_sim_faults",
                "Faults the simulated device injected, by kind",
            ),
            &["kind"],
        )?;
        r.register(Box::new(faults.clone()))?;
        let floats = prometheus::GaugeVec::new(
            Opts::new(
                "ctxpod_sim_endurance",
                "Simulated device wear: write_amplification, life_used (P/E used / rated), \
                 dwpd (host writes per day / size), projected_tbw_bytes, projected_life_days",
            ),
            &["figure"],
        )?;
        r.register(Box::new(floats.clone()))?;
        Ok(SimGauges {
            host_written: g(
                "ctxpod_sim_host_written_bytes",
                "Bytes the host wrote to the simulated device",
            )?,
            nand_written: g(
                "ctxpod_sim_nand_written_bytes",
                "Bytes programmed into simulated NAND (host data, padding, GC, SLC folding)",
            )?,
            gc_relocated: g(
                "ctxpod_sim_gc_relocated_bytes",
                "Bytes moved by simulated garbage collection",
            )?,
            erases: g("ctxpod_sim_erases", "Simulated block erases")?,
            pe_max: g(
                "ctxpod_sim_pe_cycles_max",
                "Most P/E cycles of any simulated block",
            )?,
            power_cuts: g("ctxpod_sim_power_cuts", "Simulated power cuts")?,
            faults,
            floats,
        })
    }

    pub fn update(&self, dev: &ctxpod_firmware_sim::SimDevice) {
        let s = dev.stats();
        let w = &s.wear;
        self.host_written.set(w.host_bytes_written as i64);
        self.nand_written.set(w.nand_bytes_written as i64);
        self.gc_relocated.set(w.gc_relocated_bytes as i64);
        self.erases.set(w.erases as i64);
        self.pe_max.set(w.pe_cycles_max as i64);
        self.power_cuts.set(s.power_cuts as i64);
        for (kind, n) in &s.faults {
            self.faults.with_label_values(&[kind]).set(*n as i64);
        }
        let e = dev.endurance();
        for (name, v) in [
            ("write_amplification", e.write_amplification),
            ("life_used", e.life_used),
            ("dwpd", e.dwpd),
            ("projected_tbw_bytes", e.projected_tbw_bytes),
            ("projected_life_days", e.projected_life_days),
        ] {
            self.floats.with_label_values(&[name]).set(v);
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
