//! Background backfill: every node copies the blocks it holds to the members that should
//! hold them and do not.
//!
//! Read repair brings a member the blocks clients happen to read; this pass brings it the
//! rest, so that a node that comes back after missing writes, or a node that joins and now
//! ranks among a block's first R members, ends up holding its share without waiting for
//! reads. A pass, on each node, for each namespace, in key order:
//! 1. lists a batch of the keys this node holds on flash ([`Engine::keys_after`]);
//! 2. for each key, takes the first R members of its ranking (R: the namespace's own
//!    replication, else `pod.replication`), leaving this node out;
//! 3. asks each of those members which of its keys it holds (`present`, one request per
//!    member and batch);
//! 4. reads the missing blocks ([`Engine::read_for_copy`]: verified, not counted as hits)
//!    and sends them with `batch/put`, at most `pod.backfill_bytes_per_s`.
//!
//! Every holder of a block pushes it, so two holders may both copy a block to the same
//! member; a put of a block already held is idempotent (200), and the `present` check made
//! just before each copy keeps that rare. A block held by a node that is not among its
//! first R (written there while they were away, or held from before a join) is copied to
//! them too, and stays where it is until evicted: a read finds it at the first member.
//!
//! A pass runs every `pod.backfill_interval_s` and soon after each change of the view — when
//! a member left the view, only once it stayed away `pod.repair_grace_s` (a member back
//! within it gets what it missed; one that stays away has every block it held copied to
//! the members that now rank for it: re-replication) — and
//! back to back while this node drains ([`super::drain`]) until one copies nothing;
//! when the view changes during a pass, the pass stops and the next one starts over with
//! the new view. The members are asked through a [`CopyTo`]: over HTTP in production
//! ([`OverPeers`]: requests carry `x-ctxpod-forwarded-by`, so the member stores them
//! itself, and the peer token), over the simulated network in the simulation.

use super::membership::{MemberInfo, Membership};
use super::Peers;
use bytes::Bytes;
use ctxpod_engine::{Engine, EngineError};
use ctxpod_wire::frame;
use ctxpod_wire::types::{KeysRequest, PresentResponse};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Keys listed per step of a pass.
const SCAN_BATCH: usize = 256;
/// Bytes of blocks sent in one `batch/put`.
const COPY_BATCH_BYTES: usize = 16 << 20;
/// How long after a change of the view a pass starts (members often come in bursts).
const SETTLE: Duration = Duration::from_secs(2);
/// How long one request to a member may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

pub use super::PassReport;

/// How a pass asks the members it copies to (each request within [`REQUEST_TIMEOUT`]).
#[async_trait::async_trait]
pub trait CopyTo: Send + Sync {
    /// Which of `keys` (of namespace `ns`, of `tenant`) member `m` holds itself.
    async fn present(
        &self,
        m: &MemberInfo,
        tenant: Option<&str>,
        ns: &str,
        keys: &[&[u8]],
    ) -> anyhow::Result<Vec<bool>>;

    /// Stores `blocks` on `m` as copies (a copy of a block the pod deleted is refused,
    /// 410): each block's status, in order (200 or 201: stored).
    async fn put_copies(
        &self,
        m: &MemberInfo,
        tenant: Option<&str>,
        ns: &str,
        blocks: &[(&[u8], Bytes)],
    ) -> anyhow::Result<Vec<u16>>;
}

/// The members asked over HTTP, as this node (`x-ctxpod-forwarded-by`, the peer token).
pub struct OverPeers {
    pub peers: Peers,
    pub me: String,
}

impl OverPeers {
    fn request(
        &self,
        m: &MemberInfo,
        tenant: Option<&str>,
        ns: &str,
        what: &str,
    ) -> reqwest::RequestBuilder {
        let url = format!("{}/v1/namespaces/{ns}/{what}", m.http);
        let req = self
            .peers
            .own(self.peers.http.post(url), &self.me)
            .timeout(REQUEST_TIMEOUT);
        match tenant {
            Some(t) => req.header(ctxpod_wire::HEADER_TENANT, t),
            None => req,
        }
    }
}

#[async_trait::async_trait]
impl CopyTo for OverPeers {
    async fn present(
        &self,
        m: &MemberInfo,
        tenant: Option<&str>,
        ns: &str,
        keys: &[&[u8]],
    ) -> anyhow::Result<Vec<bool>> {
        let resp = self
            .request(m, tenant, ns, "present")
            .json(&KeysRequest {
                keys: keys.iter().map(hex::encode).collect(),
            })
            .send()
            .await?;
        anyhow::ensure!(resp.status().is_success(), "status {}", resp.status());
        let held = resp.json::<PresentResponse>().await?.present;
        anyhow::ensure!(held.len() == keys.len(), "an answer of the wrong length");
        Ok(held)
    }

    async fn put_copies(
        &self,
        m: &MemberInfo,
        tenant: Option<&str>,
        ns: &str,
        blocks: &[(&[u8], Bytes)],
    ) -> anyhow::Result<Vec<u16>> {
        let entries: Vec<frame::Entry> = blocks
            .iter()
            .map(|(k, d)| frame::Entry::put(k, d))
            .collect();
        let resp = self
            .request(m, tenant, ns, "batch/put")
            .header("content-type", "application/octet-stream")
            .header(ctxpod_wire::HEADER_COPY, "1")
            .body(frame::encode(&entries))
            .send()
            .await?;
        anyhow::ensure!(resp.status().is_success(), "status {}", resp.status());
        let body = resp.bytes().await?;
        let got = frame::decode(&body).map_err(|e| anyhow::anyhow!("{e}"))?;
        anyhow::ensure!(got.len() == entries.len(), "an answer of the wrong length");
        Ok(got.iter().map(|e| e.status).collect())
    }
}

pub struct Backfill {
    pub engine: Arc<Engine>,
    pub membership: Arc<Membership>,
    /// How the members are asked.
    pub to: Arc<dyn CopyTo>,
    pub me: String,
    /// The pod's replication (for namespaces that set none).
    pub replication: usize,
    pub bytes_per_s: u64,
    /// This node's drain: asks for passes, and is told how they went.
    pub drain: Arc<super::drain::Drain>,
    pub metrics: Arc<super::metrics::PodMetrics>,
    /// The pod's block deletes: a tombstoned block is never copied (and a member refuses
    /// the copy anyway).
    pub tombstones: Option<Arc<super::tombstones::Tombstones>>,
    /// How long a member gone from the view may stay away before its blocks are copied
    /// again (`pod.repair_grace_s`).
    pub grace: Duration,
}

/// The next page of at most `n` keys this node holds on flash in namespace `scoped`, after
/// `after` (which it advances); `None` at the end, or when the namespace was deleted
/// meanwhile.
pub(crate) fn next_keys(
    engine: &Engine,
    scoped: &str,
    after: &mut Option<Vec<u8>>,
    n: usize,
) -> anyhow::Result<Option<Vec<Vec<u8>>>> {
    let keys = match engine.keys_after(scoped, after.as_deref(), n) {
        Ok(k) => k,
        Err(EngineError::NotFound(_)) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let Some(last) = keys.last() else {
        return Ok(None);
    };
    *after = Some(last.clone());
    Ok(Some(keys))
}

/// The ids of the members up in `view`.
fn up_members(view: &super::membership::PodView) -> std::collections::BTreeSet<String> {
    view.members
        .iter()
        .filter(|m| m.state == super::membership::MemberState::Up)
        .map(|m| m.id.clone())
        .collect()
}

impl Backfill {
    /// Runs passes every `interval` and after each change of the view, until `stop`.
    pub fn spawn(
        self,
        interval: Duration,
        stop: tokio_util::sync::CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut changes = self.membership.subscribe();
            let mut again = false;
            // The members up in the view of the last pass (a draining one leaves on
            // purpose, its blocks copied already).
            let mut seen = up_members(&self.membership.view());
            loop {
                tokio::select! {
                    biased;
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(interval), if !again => {}
                    _ = std::future::ready(()), if again => {}
                    _ = self.drain.kick.notified() => {}
                    r = changes.changed() => {
                        if r.is_err() || !self.settle(&mut changes, &seen, &stop).await {
                            return;
                        }
                    }
                }
                changes.borrow_and_update();
                seen = up_members(&self.membership.view());
                again = false;
                let m = self.metrics.clone();
                // A pass counts for the drain when its view has this node draining and
                // another member up to take the blocks.
                let view = self.membership.view();
                let for_drain = self.drain.draining()
                    && view.members.iter().any(|m| {
                        m.id == self.me && m.state == super::membership::MemberState::Draining
                    })
                    && view
                        .members
                        .iter()
                        .any(|m| m.id != self.me && m.state == super::membership::MemberState::Up);
                self.drain.pass_started();
                let outcome = tokio::select! {
                    biased;
                    _ = stop.cancelled() => return,
                    r = self.pass() => r,
                };
                self.drain.pass_ended(outcome.as_ref().ok());
                if let (true, Ok(r)) = (for_drain, &outcome) {
                    again = self.drain.pass_done(r);
                } else if self.drain.draining() {
                    // Not counted (the view did not show the drain yet, or the pass
                    // failed): try again soon.
                    tokio::select! {
                        biased;
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(SETTLE) => {}
                    }
                    again = true;
                }
                match outcome {
                    Ok(r) => {
                        let kind = if r.restarted { "restarted" } else { "done" };
                        m.backfill_passes.with_label_values(&[kind]).inc();
                        if r.copied_blocks > 0 || r.failed > 0 {
                            tracing::info!(
                                scanned = r.scanned,
                                copied = r.copied_blocks,
                                bytes = r.copied_bytes,
                                failed = r.failed,
                                restarted = r.restarted,
                                "backfill pass"
                            );
                        }
                    }
                    Err(e) => {
                        m.backfill_passes.with_label_values(&["failed"]).inc();
                        tracing::warn!("backfill pass failed: {e:#}");
                    }
                }
                m.backfill_last_pass.set(super::membership::unix_now());
            }
        })
    }

    /// After a change of the view: waits [`SETTLE`] (members often come in bursts) or, when
    /// a member of `seen` is gone, `pod.repair_grace_s` for it to come back (shorter if it
    /// does). False when told to stop.
    async fn settle(
        &self,
        changes: &mut tokio::sync::watch::Receiver<Arc<super::membership::PodView>>,
        seen: &std::collections::BTreeSet<String>,
        stop: &tokio_util::sync::CancellationToken,
    ) -> bool {
        let gone = |now: &std::collections::BTreeSet<String>| -> Vec<String> {
            seen.difference(now).cloned().collect()
        };
        let now = self
            .membership
            .view()
            .members
            .iter()
            .map(|m| m.id.clone())
            .collect();
        let left = gone(&now);
        if left.is_empty() || self.grace.is_zero() {
            return tokio::select! {
                biased;
                _ = stop.cancelled() => false,
                _ = tokio::time::sleep(SETTLE) => true,
            };
        }
        let until = tokio::time::Instant::now() + self.grace.max(SETTLE);
        let m = &self.metrics;
        m.backfill_grace_until
            .set(super::membership::unix_now() + self.grace.max(SETTLE).as_secs() as i64);
        tracing::info!(
            gone = ?left,
            grace_s = self.grace.as_secs(),
            "members left the view: their blocks are copied again unless they return within the grace"
        );
        let go_on = loop {
            tokio::select! {
                biased;
                _ = stop.cancelled() => break false,
                _ = tokio::time::sleep_until(until) => break true,
                r = changes.changed() => {
                    if r.is_err() {
                        break false;
                    }
                    let now: std::collections::BTreeSet<String> = changes
                        .borrow_and_update()
                        .members
                        .iter()
                        .map(|m| m.id.clone())
                        .collect();
                    if left.iter().all(|id| now.contains(id)) {
                        // Back within the grace: a pass brings it what it missed.
                        break tokio::select! {
                            biased;
                            _ = stop.cancelled() => false,
                            _ = tokio::time::sleep(SETTLE) => true,
                        };
                    }
                }
            }
        };
        m.backfill_grace_until.set(0);
        go_on
    }

    /// One pass over every namespace (see the module's documentation).
    pub async fn pass(&self) -> anyhow::Result<PassReport> {
        let mut report = PassReport::default();
        let view = self.membership.view();
        if view.members.len() < 2 {
            return Ok(report);
        }
        let mut throttle = Throttle::new(self.bytes_per_s);
        for info in self.engine.namespaces() {
            let scoped = info.name;
            let (tenant, ns) = ctxpod_wire::namespace::split_scoped(&scoped);
            let r = info.replication.map_or(self.replication, |r| r as usize);
            let mut after: Option<Vec<u8>> = None;
            loop {
                if !Arc::ptr_eq(&view, &self.membership.view()) {
                    report.restarted = true;
                    return Ok(report);
                }
                let Some(keys) = next_keys(&self.engine, &scoped, &mut after, SCAN_BATCH)? else {
                    break;
                };
                report.scanned += keys.len() as u64;
                self.metrics.backfill_scanned.inc_by(keys.len() as u64);
                let mut wants: BTreeMap<&str, (&MemberInfo, Vec<usize>)> = BTreeMap::new();
                for (i, k) in keys.iter().enumerate() {
                    for m in view.ranked(ns, k).into_iter().take(r) {
                        if m.id != self.me {
                            wants.entry(&m.id).or_insert((m, Vec::new())).1.push(i);
                        }
                    }
                }
                for (m, idx) in wants.into_values() {
                    let asked: Vec<&[u8]> = idx.iter().map(|&i| &keys[i][..]).collect();
                    let missing = match self.to.present(m, tenant, ns, &asked).await {
                        Ok(held) => asked
                            .iter()
                            .zip(held)
                            .filter(|(_, h)| !h)
                            .map(|(k, _)| *k)
                            .collect::<Vec<_>>(),
                        Err(e) => {
                            tracing::debug!(member = %m.id, "backfill: present: {e:#}");
                            self.failed(&mut report, asked.len());
                            continue;
                        }
                    };
                    self.copy(m, tenant, ns, &scoped, &missing, &mut throttle, &mut report)
                        .await;
                }
            }
        }
        Ok(report)
    }

    fn failed(&self, report: &mut PassReport, n: usize) {
        report.failed += n as u64;
        self.metrics.backfill_failed.inc_by(n as u64);
    }

    /// Copies `keys` of namespace `scoped` to `m`, in batches, within the byte rate.
    #[allow(clippy::too_many_arguments)]
    async fn copy(
        &self,
        m: &MemberInfo,
        tenant: Option<&str>,
        ns: &str,
        scoped: &str,
        keys: &[&[u8]],
        throttle: &mut Throttle,
        report: &mut PassReport,
    ) {
        let mut batch: Vec<(&[u8], Bytes)> = Vec::new();
        let mut bytes = 0usize;
        for (i, k) in keys.iter().enumerate() {
            let deleted = self.tombstones.as_ref().is_some_and(|t| t.holds(scoped, k));
            let read = if deleted {
                Ok(None)
            } else {
                self.engine.read_for_copy(scoped, k).await
            };
            match read {
                Ok(Some((d, _))) => {
                    bytes += d.len();
                    batch.push((k, d));
                }
                // Evicted or deleted since it was listed (or deleted in the pod, its
                // tombstone not applied here yet): nothing to copy.
                Ok(None) | Err(EngineError::NotFound(_)) => {}
                Err(e) => {
                    tracing::warn!("backfill: read of a block to copy: {e}");
                    self.failed(report, 1);
                }
            }
            if !batch.is_empty() && (bytes >= COPY_BATCH_BYTES || i + 1 == keys.len()) {
                throttle.take(bytes).await;
                self.send(m, tenant, ns, std::mem::take(&mut batch), report)
                    .await;
                bytes = 0;
            }
        }
    }

    async fn send(
        &self,
        m: &MemberInfo,
        tenant: Option<&str>,
        ns: &str,
        batch: Vec<(&[u8], Bytes)>,
        report: &mut PassReport,
    ) {
        match self.to.put_copies(m, tenant, ns, &batch).await {
            Ok(statuses) => {
                let met = &self.metrics;
                for ((_, d), s) in batch.iter().zip(statuses) {
                    if s == 200 || s == 201 {
                        report.copied_blocks += 1;
                        report.copied_bytes += d.len() as u64;
                        met.backfill_copied_blocks.inc();
                        met.backfill_copied_bytes.inc_by(d.len() as u64);
                    } else if s == 410 {
                        // Deleted in the pod: the tombstone reaches this node too and
                        // deletes its copy.
                    } else {
                        self.failed(report, 1);
                    }
                }
            }
            Err(e) => {
                tracing::debug!(member = %m.id, "backfill: batch/put: {e:#}");
                self.failed(report, batch.len());
            }
        }
    }
}

/// Keeps a pass within its byte rate: waits before sending what would take it over.
pub(crate) struct Throttle {
    started: Instant,
    bytes_per_s: u64,
    sent: u64,
}

impl Throttle {
    pub(crate) fn new(bytes_per_s: u64) -> Throttle {
        Throttle {
            started: Instant::now(),
            bytes_per_s: bytes_per_s.max(1),
            sent: 0,
        }
    }

    /// How long to wait, `elapsed` after the start, before sending more: until what was
    /// sent so far is due at the rate.
    fn delay_for(&self, elapsed: Duration) -> Duration {
        let due = Duration::from_secs_f64(self.sent as f64 / self.bytes_per_s as f64);
        due.saturating_sub(elapsed)
    }

    /// Counts `bytes` about to be sent, after waiting for what was sent before them.
    pub(crate) async fn take(&mut self, bytes: usize) {
        let wait = self.delay_for(self.started.elapsed());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        self.sent += bytes as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_throttle_spreads_bytes_over_time_at_its_rate() {
        let mut t = Throttle::new(100 << 20);
        assert_eq!(t.delay_for(Duration::ZERO), Duration::ZERO);
        t.sent = 50 << 20;
        // 50 MiB sent at 100 MiB/s are due at 0.5 s: right at the start, wait 0.5 s.
        assert_eq!(t.delay_for(Duration::ZERO), Duration::from_millis(500));
        assert_eq!(
            t.delay_for(Duration::from_millis(200)),
            Duration::from_millis(300)
        );
        assert_eq!(t.delay_for(Duration::from_secs(1)), Duration::ZERO);
    }
}
