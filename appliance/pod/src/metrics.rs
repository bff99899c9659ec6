//! The pod's Prometheus series: backfill passes, tombstones and scrub. They are registered in the
//! engine's registry (`ctxpod_engine::metrics`), so the node's `/metrics` shows them.

use ctxpod_engine::metrics::{counter, gauge, register};
use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};

pub struct PodMetrics {
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
    /// Unix time until which backfill waits before copying the blocks of a member that
    /// left the view (`pod.repair_grace_s`); 0 when it waits for none.
    pub backfill_grace_until: IntGauge,
    /// Block tombstones this node knows of (the pod's deletes still remembered in etcd).
    pub pod_tombstones: IntGauge,
    /// Tombstones applied here, by outcome (`deleted`: this node held the block and
    /// deleted it; `absent`).
    pub pod_tombstones_applied: IntCounterVec,
    /// Block deletes through the pod refused, by reason (`tombstones_full`, `etcd`).
    pub pod_deletes_refused: IntCounterVec,
    /// Times this node emptied itself on return, having been away longer than
    /// `pod.tombstone_retention_s`.
    pub pod_emptied_on_return: IntCounter,
    /// Records scrub read back, by outcome (`good`, `bad`: failed a check and quarantined).
    pub scrub_records: IntCounterVec,
    /// Record bytes scrub read from the device.
    pub scrub_bytes: IntCounter,
    /// Bad copies stored again from a good copy on another member.
    pub scrub_repaired: IntCounter,
    /// Bad copies with no good copy on any member that should hold one: the block is lost
    /// here (its KV event said evicted).
    pub scrub_lost: IntCounter,
    /// Scrub passes, by outcome (`done`, `failed`).
    pub scrub_passes: IntCounterVec,
    /// The running pass: records scrubbed so far, and the records on flash when it began.
    pub scrub_pass_records: IntGauge,
    pub scrub_pass_total: IntGauge,
    /// Unix time the last scrub pass ended (0: none yet).
    pub scrub_last_pass: IntGauge,
}

impl PodMetrics {
    /// What `/v1/stats` reports of the background passes, read from these series.
    pub fn background(&self) -> ctxpod_wire::types::BackgroundStats {
        let g = |v: &IntGauge| v.get().max(0) as u64;
        ctxpod_wire::types::BackgroundStats {
            scrub_pass_records: g(&self.scrub_pass_records),
            scrub_pass_total_records: g(&self.scrub_pass_total),
            scrub_last_pass_unix: g(&self.scrub_last_pass),
            scrub_bad_records: self.scrub_records.with_label_values(&["bad"]).get(),
            scrub_repaired: self.scrub_repaired.get(),
            scrub_lost: self.scrub_lost.get(),
            backfill_last_pass_unix: g(&self.backfill_last_pass),
            backfill_copied_blocks: self.backfill_copied_blocks.get(),
            backfill_failed_copies: self.backfill_failed.get(),
            repair_grace_until_unix: g(&self.backfill_grace_until),
        }
    }

    /// The pod's series, registered in `r`, family by family.
    pub fn new(r: &Registry) -> PodMetrics {
        let b = BackfillSeries::new(r);
        let t = TombstoneSeries::new(r);
        let s = ScrubSeries::new(r);
        PodMetrics {
            backfill_passes: b.passes,
            backfill_scanned: b.scanned,
            backfill_copied_blocks: b.copied_blocks,
            backfill_copied_bytes: b.copied_bytes,
            backfill_failed: b.failed,
            backfill_last_pass: b.last_pass,
            backfill_grace_until: b.grace_until,
            pod_tombstones: t.tombstones,
            pod_tombstones_applied: t.applied,
            pod_deletes_refused: t.deletes_refused,
            pod_emptied_on_return: t.emptied_on_return,
            scrub_records: s.records,
            scrub_bytes: s.bytes,
            scrub_repaired: s.repaired,
            scrub_lost: s.lost,
            scrub_passes: s.passes,
            scrub_pass_records: s.pass_records,
            scrub_pass_total: s.pass_total,
            scrub_last_pass: s.last_pass,
        }
    }
}

/// Backfill's series (the `backfill_*` fields of [`PodMetrics`]).
struct BackfillSeries {
    passes: IntCounterVec,
    scanned: IntCounter,
    copied_blocks: IntCounter,
    copied_bytes: IntCounter,
    failed: IntCounter,
    last_pass: IntGauge,
    grace_until: IntGauge,
}

impl BackfillSeries {
    fn new(r: &Registry) -> BackfillSeries {
        BackfillSeries {
            passes: register(r, IntCounterVec::new(
                Opts::new(
                    "ctxpod_backfill_passes_total",
                    "Backfill passes, by outcome (done, restarted, failed)"
                ),
                &["outcome"]
            )),
            scanned: counter(
                r,
                "ctxpod_backfill_scanned_keys_total",
                "Keys held here that backfill passes looked at",
            ),
            copied_blocks: counter(
                r,
                "ctxpod_backfill_copied_blocks_total",
                "Blocks backfill copied to a member that should hold them",
            ),
            copied_bytes: counter(
                r,
                "ctxpod_backfill_copied_bytes_total",
                "Bytes backfill copied to other members",
            ),
            failed: counter(
                r,
                "ctxpod_backfill_failed_copies_total",
                "Copies backfill could not make (member unreachable or refusing)",
            ),
            last_pass: gauge(
                r,
                "ctxpod_backfill_last_pass_timestamp_seconds",
                "Unix time the last backfill pass ended (0: none yet)",
            ),
            grace_until: gauge(
                r,
                "ctxpod_backfill_grace_until_timestamp_seconds",
                "Unix time until which backfill waits for a member that left to come back (0: none)",
            ),
        }
    }
}

/// The series of the pod's deletes: tombstones (the `pod_*` fields of [`PodMetrics`]).
struct TombstoneSeries {
    tombstones: IntGauge,
    applied: IntCounterVec,
    deletes_refused: IntCounterVec,
    emptied_on_return: IntCounter,
}

impl TombstoneSeries {
    fn new(r: &Registry) -> TombstoneSeries {
        TombstoneSeries {
            tombstones: gauge(
                r,
                "ctxpod_pod_tombstones",
                "Block tombstones this node knows of (pod deletes still remembered in etcd)",
            ),
            applied: register(r, IntCounterVec::new(
                Opts::new(
                    "ctxpod_pod_tombstones_applied_total",
                    "Tombstones applied here, by outcome (deleted, absent)"
                ),
                &["outcome"]
            )),
            deletes_refused: register(r, IntCounterVec::new(
                Opts::new(
                    "ctxpod_pod_deletes_refused_total",
                    "Block deletes through the pod refused, by reason (tombstones_full, etcd)"
                ),
                &["reason"]
            )),
            emptied_on_return: counter(
                r,
                "ctxpod_pod_emptied_on_return_total",
                "Times this node emptied itself on return after longer away than the tombstone retention",
            ),
        }
    }
}

/// Scrub's series (the `scrub_*` fields of [`PodMetrics`]).
struct ScrubSeries {
    records: IntCounterVec,
    bytes: IntCounter,
    repaired: IntCounter,
    lost: IntCounter,
    passes: IntCounterVec,
    pass_records: IntGauge,
    pass_total: IntGauge,
    last_pass: IntGauge,
}

impl ScrubSeries {
    fn new(r: &Registry) -> ScrubSeries {
        ScrubSeries {
            records: register(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "ctxpod_scrub_records_total",
                        "Records scrub read back and checked, by outcome (good, bad)",
                    ),
                    &["outcome"],
                ),
            ),
            bytes: counter(
                r,
                "ctxpod_scrub_read_bytes_total",
                "Record bytes scrub read from the device",
            ),
            repaired: counter(
                r,
                "ctxpod_scrub_repaired_total",
                "Bad copies scrub stored again from a good copy on another member",
            ),
            lost: counter(
                r,
                "ctxpod_scrub_lost_total",
                "Bad copies with no good copy on any member: blocks lost here",
            ),
            passes: register(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "ctxpod_scrub_passes_total",
                        "Scrub passes, by outcome (done, failed)",
                    ),
                    &["outcome"],
                ),
            ),
            pass_records: gauge(
                r,
                "ctxpod_scrub_pass_records",
                "Records the running scrub pass has checked so far",
            ),
            pass_total: gauge(
                r,
                "ctxpod_scrub_pass_total_records",
                "Records on flash when the running scrub pass began",
            ),
            last_pass: gauge(
                r,
                "ctxpod_scrub_last_pass_timestamp_seconds",
                "Unix time the last scrub pass ended (0: none yet)",
            ),
        }
    }
}
