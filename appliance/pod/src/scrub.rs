//! Scrub: a background pass, on every node, that re-reads every record on flash and checks
//! it as a GET would, so that a copy gone bad on the drive is found before a client needs
//! it, and while the pod still holds a good one.
//!
//! A pass, every `scrub.interval_s` (from the start of one to the start of the next):
//! 1. for each namespace, in key order, lists a batch of the keys this node holds on flash
//!    ([`Engine::keys_after`]);
//! 2. re-reads each block's record from the device ([`Engine::scrub_block`]: never from
//!    DRAM, not counted as a read), checking its header against the index, its AES-GCM tag
//!    and its CRC32C, at most `scrub.bytes_per_s` of record bytes;
//! 3. a bad record is quarantined by the engine (out of the index, announced to KV-event
//!    subscribers as evicted, `ctxpod_integrity_errors_total`); scrub then asks the block's
//!    other members that a read would try for their copy (`GET`, marked as routed so each
//!    answers from its own flash, checked against its CRC32C on receipt) and stores the
//!    first good one here again, unless the block was deleted in the pod (tombstone). With
//!    no good copy anywhere the block is lost (`ctxpod_scrub_lost_total`): engines recompute
//!    it, as for an evicted block.
//!
//! A pass that is cut (a restart) starts over at the next interval; it only reads, so a
//! kill during one loses nothing, and the repair is an ordinary put of the pod's own bytes.

use super::membership::Membership;
use super::Peers;
use bytes::Bytes;
use ctxpod_engine::{Engine, EngineError, Scrubbed};
use ctxpod_wire::Durability;
use std::sync::Arc;
use std::time::Duration;

/// Keys listed per step of a pass.
const SCAN_BATCH: usize = 256;
/// How long asking a member for its copy may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// What one pass found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ScrubReport {
    pub good: u64,
    pub bad: u64,
    pub repaired: u64,
    pub lost: u64,
    pub bytes: u64,
}

pub struct Scrub {
    pub engine: Arc<Engine>,
    pub membership: Arc<Membership>,
    pub peers: Peers,
    pub me: String,
    /// The pod's replication (for namespaces that set none).
    pub replication: usize,
    pub bytes_per_s: u64,
    /// The pod's block deletes: a deleted block is not stored again.
    pub tombstones: Option<Arc<super::tombstones::Tombstones>>,
    pub metrics: Arc<super::metrics::PodMetrics>,
    /// Whether bad copies may be asked of the other members (off when authentication is on
    /// and there is no peer token): without, a bad copy is only quarantined, and read
    /// repair by clients brings it back.
    pub repair: bool,
}

impl Scrub {
    /// Runs a pass every `interval` (the first one interval after the start), until `stop`.
    pub fn spawn(
        self,
        interval: Duration,
        stop: tokio_util::sync::CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut next = tokio::time::Instant::now() + interval;
            loop {
                tokio::select! {
                    biased;
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep_until(next) => {}
                }
                next = tokio::time::Instant::now() + interval;
                let m = self.metrics.clone();
                let outcome = tokio::select! {
                    biased;
                    _ = stop.cancelled() => return,
                    r = self.pass() => r,
                };
                let kind = match &outcome {
                    Ok(r) if r.bad > 0 => {
                        tracing::warn!(report = ?r, "scrub pass found bad copies");
                        "done"
                    }
                    Ok(r) => {
                        tracing::info!(report = ?r, "scrub pass: clean");
                        "done"
                    }
                    Err(e) => {
                        tracing::warn!("scrub pass failed: {e:#}");
                        "failed"
                    }
                };
                m.scrub_passes.with_label_values(&[kind]).inc();
                m.scrub_last_pass.set(super::membership::unix_now());
            }
        })
    }

    /// One pass over every namespace (see the module's documentation).
    pub async fn pass(&self) -> anyhow::Result<ScrubReport> {
        let mut report = ScrubReport::default();
        let spaces = self.engine.namespaces();
        let m = &self.metrics;
        m.scrub_pass_records.set(0);
        m.scrub_pass_total
            .set(spaces.iter().map(|n| n.block_count as i64).sum());
        let mut throttle = super::backfill::Throttle::new(self.bytes_per_s);
        for info in spaces {
            let scoped = info.name;
            let r = info.replication.map_or(self.replication, |r| r as usize);
            let mut after: Option<Vec<u8>> = None;
            loop {
                let Some(keys) =
                    super::backfill::next_keys(&self.engine, &scoped, &mut after, SCAN_BATCH)?
                else {
                    break;
                };
                for k in &keys {
                    self.scrub_one(&scoped, r, k, &mut throttle, &mut report)
                        .await?;
                }
            }
        }
        Ok(report)
    }

    async fn scrub_one(
        &self,
        scoped: &str,
        r: usize,
        key: &[u8],
        throttle: &mut super::backfill::Throttle,
        report: &mut ScrubReport,
    ) -> anyhow::Result<()> {
        let m = &self.metrics;
        let found = match self.engine.scrub_block(scoped, key).await {
            Ok(s) => s,
            Err(EngineError::NotFound(_)) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let bytes = match found {
            Scrubbed::Good { record_bytes } => {
                report.good += 1;
                m.scrub_records.with_label_values(&["good"]).inc();
                record_bytes
            }
            Scrubbed::Bad { record_bytes } => {
                report.bad += 1;
                m.scrub_records.with_label_values(&["bad"]).inc();
                if self.repair_from_the_pod(scoped, r, key).await {
                    report.repaired += 1;
                    m.scrub_repaired.inc();
                } else {
                    report.lost += 1;
                    m.scrub_lost.inc();
                    tracing::warn!(
                        namespace = %scoped,
                        key = %ctxpod_wire::key::KeyDisplay(key),
                        "scrub: a bad copy and no good one on any member: the block is lost here"
                    );
                }
                record_bytes
            }
            Scrubbed::Gone => return Ok(()),
        };
        report.bytes += bytes;
        m.scrub_bytes.inc_by(bytes);
        m.scrub_pass_records.inc();
        throttle.take(bytes as usize).await;
        Ok(())
    }

    /// Stores a good copy of `key` here again, from the first member a read would try
    /// that has one. False when none has (or the block was deleted in the pod).
    async fn repair_from_the_pod(&self, scoped: &str, r: usize, key: &[u8]) -> bool {
        if !self.repair
            || self
                .tombstones
                .as_ref()
                .is_some_and(|t| t.holds(scoped, key))
        {
            return false;
        }
        let (tenant, ns) = ctxpod_wire::namespace::split_scoped(scoped);
        let view = self.membership.view();
        let tries = ctxpod_wire::placement::read_candidates(r);
        for m in view.ranked(ns, key).into_iter().take(tries) {
            if m.id == self.me {
                continue;
            }
            let Some(data) = self.copy_of(&m.http, tenant, ns, key).await else {
                continue;
            };
            let crc = ctxpod_wire::crc32c(&data);
            match self
                .engine
                .put(scoped, key, data, Some(crc), Durability::Durable)
                .await
            {
                Ok(_) => {
                    tracing::info!(
                        namespace = %scoped,
                        key = %ctxpod_wire::key::KeyDisplay(key),
                        from = %m.id,
                        "scrub: a bad copy stored again from a good one"
                    );
                    return true;
                }
                Err(e) => {
                    tracing::warn!("scrub: storing a good copy again: {e}");
                    return false;
                }
            }
        }
        false
    }

    /// Member `http`'s own copy of the block, checked against its CRC32C; `None` when it
    /// has none, cannot be reached, or sends bytes that fail the check.
    async fn copy_of(
        &self,
        http: &str,
        tenant: Option<&str>,
        ns: &str,
        key: &[u8],
    ) -> Option<Bytes> {
        let url = format!("{http}/v1/namespaces/{ns}/blocks/{}", hex::encode(key));
        let mut req = self
            .peers
            .own(self.peers.http.get(url), &self.me)
            .timeout(REQUEST_TIMEOUT);
        if let Some(t) = tenant {
            req = req.header(ctxpod_wire::HEADER_TENANT, t);
        }
        let resp = req.send().await.ok()?;
        if !resp.status().is_success() {
            return None;
        }
        let want = resp
            .headers()
            .get(ctxpod_wire::HEADER_CRC32C)
            .and_then(|v| v.to_str().ok())
            .and_then(ctxpod_wire::parse_crc32c_hex)?;
        let body = resp.bytes().await.ok()?;
        (ctxpod_wire::crc32c(&body) == want).then_some(body)
    }
}
