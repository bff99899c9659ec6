//! Prometheus metrics of one node: `ctxpod_` prefix, base units, `_total` counters, bounded
//! label sets (an operation name, a tier, an engine: never a key or a namespace id).

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

pub struct Metrics {
    pub registry: Registry,
    /// Set when the node runs on a simulated device.
    pub sim: std::sync::OnceLock<SimGauges>,
    /// Request latency per operation (`put`, `get`, `head`, `delete`, `match`, `batch_get`,
    /// `batch_put`, `pin`, `unpin`, `namespace`).
    pub request_seconds: HistogramVec,
    /// Answers per operation and status class.
    pub responses: IntCounterVec,
    pub received_bytes: IntCounter,
    pub sent_bytes: IntCounter,
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
    pub device_read_bytes: IntCounter,
    /// Payload bytes users asked to store (the denominator of write amplification).
    pub user_written_bytes: IntCounter,
    pub device_flushes: IntCounter,
    pub group_commit_blocks: Histogram,
    pub flush_seconds: Histogram,
    pub index_commit_seconds: Histogram,
    pub group_commit_seconds: Histogram,
    pub busy_rejections: IntCounterVec,
    /// Connections held, by listener (`http`, `transfer`).
    pub connections: IntGaugeVec,
    /// Connections refused or closed by a limit, by listener and why (`listener`, `peer`:
    /// the caps; `idle`: the idle timeout; `handshakes`: too many TLS handshakes).
    pub connections_refused: IntCounterVec,
    /// Offload engines (`crc32c`, `aes-gcm`): operations run, seconds their workers were
    /// busy, submissions refused (queue full), operations failed by injected faults.
    pub offload: prometheus::GaugeVec,
    pub io_engine_info: IntGaugeVec,
    pub capacity_bytes: IntGauge,
    pub used_bytes: IntGauge,
    pub live_bytes: IntGauge,
    pub blocks: IntGauge,
    pub dram_used_bytes: IntGauge,
    pub dram_capacity_bytes: IntGauge,
    pub regions_free: IntGauge,
    pub leases: IntGauge,
    /// Device bytes of leased (pinned or held) records.
    pub leased_bytes: IntGauge,
    /// Leases refused, by reason (`table`, `node_bytes`, `tenant_bytes`).
    pub lease_refusals: IntCounterVec,
    /// Regions eviction kept in place because leased records fill most of them.
    pub reclaim_skipped: IntCounter,
    pub inflight_requests: IntGauge,
    pub prefetch_blocks: IntCounterVec,
    pub prefetch_pushed_bytes: IntCounter,
    pub prefetch_tickets: IntCounter,
    pub dek_rotations: IntCounter,
    pub kek_rotations: IntCounter,
    /// Credentials refused, by reason (`missing`, `malformed`, `wrong`, `unknown_identity`).
    pub auth_failures: IntCounterVec,
    /// Authenticated requests refused for their role (403).
    pub forbidden: IntCounter,
    /// Requests refused for a tenant's limits, by tenant and kind (`rate`: 429, `bytes`: 403 `quota`, `namespaces`: 403).
    pub quota_rejections: IntCounterVec,
    /// TLS handshakes that failed (bad or missing client certificate, protocol errors).
    pub tls_handshake_failures: IntCounter,
    /// Successful reloads of the TLS certificate, key and client CA.
    pub tls_reloads: IntCounter,
    /// Members of the pod in this node's view.
    pub pod_members: IntGauge,
    /// Single-block requests this node forwarded to another member, by outcome (`read`,
    /// `write`, `read_miss`: no member tried held it, `unreachable`: a member did not answer).
    pub forwarded: IntCounterVec,
    /// 1 while etcd answers (always 1 without etcd), 0 while the node serves with the last
    /// known membership.
    pub pod_etcd_up: IntGauge,
    /// Unix time of etcd's last answer (0: never, or no etcd).
    pub pod_etcd_last_ok: IntGauge,
    /// Backfill passes, by outcome (`done`, `restarted`: the membership changed during it,
    /// `failed`).
    pub backfill_passes: IntCounterVec,
    /// Keys a backfill pass looked at.
    pub backfill_scanned: IntCounter,
    /// Blocks (and bytes) backfill copied to a member that should hold them and did not.
    pub backfill_copied_blocks: IntCounter,
    pub backfill_copied_bytes: IntCounter,
    /// Copies backfill could not make (member unreachable or refusing).
    pub backfill_failed: IntCounter,
    /// Unix time the last backfill pass ended (0: none yet).
    pub backfill_last_pass: IntGauge,
    /// Member records in etcd left out of this node's view as invalid (forged or broken).
    pub pod_member_records_rejected: IntGauge,
    /// Block tombstones this node knows of (the pod's deletes still remembered in etcd).
    pub pod_tombstones: IntGauge,
    /// Tombstones applied here, by outcome (`deleted`: this node held the block and
    /// deleted it; `absent`).
    pub pod_tombstones_applied: IntCounterVec,
    /// Block deletes through the pod refused, by reason (`tombstones_full`, `etcd`).
    pub pod_deletes_refused: IntCounterVec,
    /// Copies of a deleted block refused (read repair, backfill).
    pub copies_refused: IntCounter,
    /// Times this node emptied itself on return, having been away longer than
    /// `pod.tombstone_retention_s`.
    pub pod_emptied_on_return: IntCounter,
}

/// Upper bounds of the request-latency buckets (20 µs to 2.6 s, doubling).
pub fn latency_buckets() -> Vec<f64> {
    prometheus::exponential_buckets(20e-6, 2.0, 18).expect("valid bucket parameters")
}

impl Metrics {
    /// The request-latency histogram of each operation served so far (cumulative bucket
    /// counts at [`latency_buckets`]), sorted by op.
    pub fn latency_by_op(&self) -> Vec<ctxpod_wire::types::OpLatency> {
        use prometheus::core::Collector;
        let mut out: Vec<_> = self
            .request_seconds
            .collect()
            .iter()
            .flat_map(|mf| mf.get_metric())
            .map(|m| {
                let h = m.get_histogram();
                ctxpod_wire::types::OpLatency {
                    op: m
                        .get_label()
                        .iter()
                        .find(|l| l.name() == "op")
                        .map(|l| l.value().to_string())
                        .unwrap_or_default(),
                    buckets: h
                        .get_bucket()
                        .iter()
                        .map(|b| b.cumulative_count())
                        .collect(),
                    count: h.get_sample_count(),
                }
            })
            .collect();
        out.sort_by(|a, b| a.op.cmp(&b.op));
        out
    }

    pub fn new() -> Self {
        let r = Registry::new();
        macro_rules! reg {
            ($m:expr) => {{
                let m = $m.expect("metric definitions are static and valid");
                r.register(Box::new(m.clone()))
                    .expect("each metric is registered once");
                m
            }};
        }
        let counter = |name: &str, help: &str| IntCounter::new(name, help);
        let gauge = |name: &str, help: &str| IntGauge::new(name, help);
        let latency = |name: &str, help: &str| {
            Histogram::with_opts(HistogramOpts::new(name, help).buckets(latency_buckets()))
        };
        Metrics {
            request_seconds: reg!(HistogramVec::new(
                HistogramOpts::new(
                    "ctxpod_request_duration_seconds",
                    "Request latency per operation"
                )
                .buckets(latency_buckets()),
                &["op"]
            )),
            responses: reg!(IntCounterVec::new(
                Opts::new(
                    "ctxpod_responses_total",
                    "Answers per operation and status class"
                ),
                &["op", "class"]
            )),
            received_bytes: reg!(counter(
                "ctxpod_received_bytes_total",
                "Block payload bytes received"
            )),
            sent_bytes: reg!(counter(
                "ctxpod_sent_bytes_total",
                "Block payload bytes sent"
            )),
            hits: reg!(IntCounterVec::new(
                Opts::new(
                    "ctxpod_block_hits_total",
                    "Block lookups that found the block, by tier"
                ),
                &["tier"]
            )),
            misses: reg!(counter(
                "ctxpod_block_misses_total",
                "Block lookups that found nothing"
            )),
            integrity_errors: reg!(counter(
                "ctxpod_integrity_errors_total",
                "Records that failed a header, GCM or CRC32C check and were quarantined"
            )),
            media_errors: reg!(IntCounterVec::new(
                Opts::new(
                    "ctxpod_media_errors_total",
                    "Device reads that failed outside a client's request, by what was \
                     reading; the record concerned is dropped, the node stays writable"
                ),
                &["op"]
            )),
            evicted_blocks: reg!(counter(
                "ctxpod_evicted_blocks_total",
                "Blocks dropped by eviction"
            )),
            evicted_regions: reg!(counter(
                "ctxpod_evicted_regions_total",
                "Regions reclaimed by eviction"
            )),
            reinserted_blocks: reg!(counter(
                "ctxpod_reinserted_blocks_total",
                "Blocks moved out of an evicted region (recently read or leased)"
            )),
            device_written_bytes: reg!(counter(
                "ctxpod_device_written_bytes_total",
                "Bytes written to the device"
            )),
            device_read_bytes: reg!(counter(
                "ctxpod_device_read_bytes_total",
                "Bytes read from the device"
            )),
            user_written_bytes: reg!(counter(
                "ctxpod_user_written_bytes_total",
                "Payload bytes of newly stored blocks (write amplification = device / user)"
            )),
            device_flushes: reg!(counter("ctxpod_device_flushes_total", "Device flushes")),
            group_commit_blocks: reg!(Histogram::with_opts(
                HistogramOpts::new("ctxpod_group_commit_blocks", "Writes per group commit")
                    .buckets(prometheus::exponential_buckets(1.0, 2.0, 10).expect("valid buckets"))
            )),
            group_commit_seconds: reg!(latency(
                "ctxpod_group_commit_duration_seconds",
                "Time of one group commit"
            )),
            flush_seconds: reg!(latency(
                "ctxpod_device_flush_duration_seconds",
                "Time of one device flush"
            )),
            index_commit_seconds: reg!(latency(
                "ctxpod_index_commit_duration_seconds",
                "Time of one RocksDB batch write (synced or not)"
            )),
            connections: reg!(IntGaugeVec::new(
                Opts::new("ctxpod_connections", "Connections held, by listener"),
                &["listener"]
            )),
            connections_refused: reg!(IntCounterVec::new(
                Opts::new(
                    "ctxpod_connections_refused_total",
                    "Connections refused or closed by a limit, by listener and why"
                ),
                &["listener", "why"]
            )),
            busy_rejections: reg!(IntCounterVec::new(
                Opts::new(
                    "ctxpod_busy_rejections_total",
                    "Requests refused with 503, by full queue"
                ),
                &["queue"]
            )),
            offload: reg!(prometheus::GaugeVec::new(
                Opts::new(
                    "ctxpod_offload",
                    "Offload engines: ops, busy_seconds, rejected_busy, faults (monotonic)"
                ),
                &["engine", "figure"]
            )),
            io_engine_info: reg!(IntGaugeVec::new(
                Opts::new(
                    "ctxpod_io_engine_info",
                    "The device I/O engine in use (value 1)"
                ),
                &["engine", "direct"]
            )),
            capacity_bytes: reg!(gauge("ctxpod_capacity_bytes", "Configured flash capacity")),
            used_bytes: reg!(gauge("ctxpod_used_bytes", "Device bytes in regions in use")),
            live_bytes: reg!(gauge("ctxpod_live_bytes", "Payload bytes of live blocks")),
            blocks: reg!(gauge("ctxpod_blocks", "Live blocks")),
            dram_used_bytes: reg!(gauge(
                "ctxpod_dram_used_bytes",
                "Bytes held by the DRAM tier"
            )),
            dram_capacity_bytes: reg!(gauge("ctxpod_dram_capacity_bytes", "DRAM tier limit")),
            regions_free: reg!(gauge("ctxpod_regions_free", "Free regions")),
            leases: reg!(gauge("ctxpod_leases", "Keys pinned by a lease")),
            leased_bytes: reg!(gauge(
                "ctxpod_leased_bytes",
                "Device bytes of leased (pinned or held) records"
            )),
            lease_refusals: reg!(IntCounterVec::new(
                Opts::new(
                    "ctxpod_lease_refusals_total",
                    "Leases refused, by reason (table, node_bytes, tenant_bytes)"
                ),
                &["reason"]
            )),
            reclaim_skipped: reg!(counter(
                "ctxpod_reclaim_skipped_regions_total",
                "Regions eviction kept in place because leased records fill most of them"
            )),
            inflight_requests: reg!(gauge(
                "ctxpod_inflight_requests",
                "Data requests being served"
            )),
            prefetch_blocks: reg!(IntCounterVec::new(
                Opts::new(
                    "ctxpod_prefetch_blocks_total",
                    "Prefetch entries by outcome: pushed, miss, deadline, cancelled, busy, too_large, error"
                ),
                &["outcome"]
            )),
            prefetch_pushed_bytes: reg!(counter(
                "ctxpod_prefetch_pushed_bytes_total",
                "Block bytes pushed into clients' memory regions"
            )),
            prefetch_tickets: reg!(counter(
                "ctxpod_prefetch_tickets_total",
                "Prefetch tickets completed (every entry pushed or missed)"
            )),
            dek_rotations: reg!(counter(
                "ctxpod_dek_rotations_total",
                "Namespace data keys rotated (on request, or after dek_rotate_after_writes writes)"
            )),
            kek_rotations: reg!(counter(
                "ctxpod_kek_rotations_total",
                "Key-encryption key rotations (every data key re-wrapped under the new KEK)"
            )),
            auth_failures: reg!(IntCounterVec::new(
                Opts::new(
                    "ctxpod_auth_failures_total",
                    "Credentials refused (401), by reason"
                ),
                &["reason"]
            )),
            forbidden: reg!(counter(
                "ctxpod_forbidden_total",
                "Authenticated requests refused for their role (403)"
            )),
            quota_rejections: reg!(IntCounterVec::new(
                Opts::new(
                    "ctxpod_quota_rejections_total",
                    "Requests refused for a tenant's limits: rate (429), bytes (403 quota) or namespaces (403)"
                ),
                &["tenant", "kind"]
            )),
            tls_handshake_failures: reg!(counter(
                "ctxpod_tls_handshake_failures_total",
                "TLS handshakes that failed (client certificate refused, protocol errors)"
            )),
            tls_reloads: reg!(counter(
                "ctxpod_tls_reloads_total",
                "Reloads of the TLS certificate, key and client CA"
            )),
            pod_members: reg!(gauge(
                "ctxpod_pod_members",
                "Members of the pod in this node's view"
            )),
            forwarded: reg!(IntCounterVec::new(
                Opts::new(
                    "ctxpod_forwarded_total",
                    "Single-block requests forwarded to the member holding the block, by outcome"
                ),
                &["outcome"]
            )),
            pod_etcd_up: reg!(gauge(
                "ctxpod_pod_etcd_up",
                "1 while etcd answers (or no etcd is configured); 0 while serving with the last known membership"
            )),
            pod_etcd_last_ok: reg!(gauge(
                "ctxpod_pod_etcd_last_ok_timestamp_seconds",
                "Unix time of etcd's last answer (0: never, or no etcd)"
            )),
            backfill_passes: reg!(IntCounterVec::new(
                Opts::new(
                    "ctxpod_backfill_passes_total",
                    "Backfill passes, by outcome (done, restarted, failed)"
                ),
                &["outcome"]
            )),
            backfill_scanned: reg!(counter(
                "ctxpod_backfill_scanned_keys_total",
                "Keys held here that backfill passes looked at"
            )),
            backfill_copied_blocks: reg!(counter(
                "ctxpod_backfill_copied_blocks_total",
                "Blocks backfill copied to a member that should hold them"
            )),
            backfill_copied_bytes: reg!(counter(
                "ctxpod_backfill_copied_bytes_total",
                "Bytes backfill copied to other members"
            )),
            backfill_failed: reg!(counter(
                "ctxpod_backfill_failed_copies_total",
                "Copies backfill could not make (member unreachable or refusing)"
            )),
            backfill_last_pass: reg!(gauge(
                "ctxpod_backfill_last_pass_timestamp_seconds",
                "Unix time the last backfill pass ended (0: none yet)"
            )),
            pod_member_records_rejected: reg!(gauge(
                "ctxpod_pod_member_records_rejected",
                "Member records in etcd left out of the view as invalid (forged or broken)"
            )),
            pod_tombstones: reg!(gauge(
                "ctxpod_pod_tombstones",
                "Block tombstones this node knows of (pod deletes still remembered in etcd)"
            )),
            pod_tombstones_applied: reg!(IntCounterVec::new(
                Opts::new(
                    "ctxpod_pod_tombstones_applied_total",
                    "Tombstones applied here, by outcome (deleted, absent)"
                ),
                &["outcome"]
            )),
            pod_deletes_refused: reg!(IntCounterVec::new(
                Opts::new(
                    "ctxpod_pod_deletes_refused_total",
                    "Block deletes through the pod refused, by reason (tombstones_full, etcd)"
                ),
                &["reason"]
            )),
            copies_refused: reg!(counter(
                "ctxpod_copies_refused_total",
                "Copies of a block the pod deleted refused (read repair, backfill)"
            )),
            pod_emptied_on_return: reg!(counter(
                "ctxpod_pod_emptied_on_return_total",
                "Times this node emptied itself on return after longer away than the tombstone retention"
            )),
            registry: r,
            sim: std::sync::OnceLock::new(),
        }
    }

    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("text encoding into a Vec cannot fail");
        String::from_utf8(buf).expect("the text encoder writes UTF-8")
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
