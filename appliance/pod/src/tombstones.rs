//! Block deletes across the pod: tombstones in etcd, so that a delete reaches the members
//! that were away when it was made (issue #18, point 6).
//!
//! A delete through the pod is sent to every member a read would try, but a member that is
//! down (or out of the view) keeps its copy; without more, it serves the block again when
//! it returns, and backfill or read repair copy it back to the others. So:
//! - The node that takes a client's delete first records a tombstone in etcd under
//!   `/ctxpod/<pod>/tombstones/<namespace>/<hex key>` (503 while etcd cannot record it, or
//!   while the pod holds `pod.tombstones_max`), then sends the delete on.
//! - Every node keeps the tombstones' keys in memory and watches the prefix. Each new one is
//!   *applied*: the node deletes its own copy. A node that starts lists them **before it
//!   registers** (so before anyone routes a request to it) and applies those newer than the
//!   revision it had applied when it stopped (kept in `<data_dir>/pod.tombstones.state`);
//!   once its record is put it lists them again ([`Tombstones::catch_up`]), and does so
//!   whenever it registers again after losing its lease: only then does it serve its
//!   blocks (`crate::fence`).
//! - A delete through the pod is acknowledged only once every member that may hold the
//!   block applied it or dropped out of etcd (the node's settling of a routed delete), so
//!   that no member serves a block after its delete was acknowledged.
//! - A copy of a tombstoned block ([`ctxpod_wire::HEADER_COPY`]: read repair, backfill) is
//!   refused with 410 `deleted`, and backfill does not send one. A client's own put of the
//!   key is stored as usual: a block put again after a delete lives on the members it was
//!   written to, and is not copied elsewhere until its tombstone expires.
//! - Pruning: tombstones are attached to etcd leases (one per slice of
//!   `pod.tombstone_retention_s`), so etcd removes each one after at least the retention and
//!   at most 1/16 more. A node that comes back after being away longer than the retention
//!   (its state file says when it last heard from etcd) cannot know which deletes it missed:
//!   it empties itself before it registers, and backfill brings it its share again.
//!
//! Without etcd (a static pod) there are no tombstones: a delete reaches the members that
//! can be reached, and a member down at that moment keeps its copy (docs/OPERATIONS.md).

use super::meta::{Kv, Meta, WatchEvent};
use super::metrics::PodMetrics;
use ctxpod_engine::{Engine, EngineError};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// The file where a node keeps how far it applied the pod's tombstones.
const STATE_FILE: &str = "pod.tombstones.state";
/// How often a node notes, in its state file, that it still hears from etcd.
const SAVE_EVERY: Duration = Duration::from_secs(5);
/// Keys listed per step when a node empties itself.
const EMPTY_BATCH: usize = 1024;
/// The most block deletes a node keeps as recorded before its watch delivers them
/// ([`Tombstones::learn_recorded`]): far more than the deletes settled while one watch
/// stalls for a lease's time.
const AHEAD_OF_WATCH_MAX: usize = 4096;

pub fn tombstones_prefix(pod: &str) -> String {
    format!("/ctxpod/{pod}/tombstones/")
}

/// `<namespace>/<hex key>`: a tombstone's name under the prefix (namespaces are node-side
/// names, `tenant/ns` for a tenant's, so the key is what follows the last `/`).
fn name_of(ns: &str, key: &[u8]) -> String {
    format!("{ns}/{}", hex::encode(key))
}

/// The namespace and key a tombstone's name stands for.
fn parse_name(name: &str) -> Option<(&str, Vec<u8>)> {
    let (ns, key) = name.rsplit_once('/')?;
    let key = hex::decode(key).ok()?;
    (!ns.is_empty() && !key.is_empty()).then_some((ns, key))
}

/// How far this node applied the pod's tombstones, and when it last heard from etcd.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
struct State {
    pod: String,
    applied_revision: i64,
    seen_unix: i64,
}

/// Why a delete was not recorded.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("the pod holds pod.tombstones_max tombstones: try again once older ones expire")]
    Full,
    #[error("etcd cannot record the delete: {0:#}")]
    Etcd(anyhow::Error),
}

/// The pod's tombstones as this node knows them.
pub struct Tombstones {
    etcd: Arc<dyn Meta>,
    pod: String,
    prefix: String,
    retention: Duration,
    /// The members' lease TTL (`pod.lease_ttl_s`): how long a delete waits for a member
    /// it cannot reach to drop out of the pod.
    lease_ttl: Duration,
    max: usize,
    /// The tombstones this node knows.
    known: Mutex<Known>,
    /// Counts learnings and listings, to order them.
    marks: std::sync::atomic::AtomicU64,
    /// The lease new tombstones are attached to, and when it was granted.
    lease: tokio::sync::Mutex<Option<(i64, Instant)>>,
    state_file: PathBuf,
    metrics: Arc<PodMetrics>,
    /// The highest revision through which every tombstone was applied here (follow and
    /// catch-up share it, so neither applies again a tombstone the other applied: a block
    /// put again after its delete stays).
    applied: std::sync::atomic::AtomicI64,
    /// When etcd last answered this node (`Membership::etcd_last_ok`: keep-alives, watches,
    /// listings): what the state file records as "seen", never merely the time it is
    /// written (a node cut off goes on writing it).
    membership: Arc<super::membership::Membership>,
}

impl Tombstones {
    /// Catches up with the pod's deletes before this node registers: empties it if it was
    /// away longer than the retention, applies every tombstone newer than the revision it
    /// had applied, and returns the tombstones with the revision to watch from.
    pub async fn open(
        engine: &Engine,
        etcd: Arc<dyn Meta>,
        pod: &str,
        cfg: &ctxpod_format::config::PodConfig,
        data_dir: &Path,
        metrics: Arc<PodMetrics>,
        membership: Arc<super::membership::Membership>,
    ) -> anyhow::Result<(Arc<Tombstones>, i64)> {
        let t = Arc::new(Tombstones {
            etcd,
            pod: pod.to_string(),
            prefix: tombstones_prefix(pod),
            retention: Duration::from_secs(cfg.tombstone_retention_s),
            lease_ttl: Duration::from_secs(cfg.lease_ttl_s),
            max: cfg.tombstones_max,
            known: Mutex::new(Known::default()),
            marks: std::sync::atomic::AtomicU64::new(0),
            lease: tokio::sync::Mutex::new(None),
            state_file: data_dir.join(STATE_FILE),
            metrics,
            membership,
            applied: std::sync::atomic::AtomicI64::new(0),
        });
        let state = t.load();
        let now = super::membership::unix_now();
        let away = state.as_ref().map(|s| now - s.seen_unix);
        t.empty_if_away(engine, away).await?;
        let applied = state.map_or(0, |s| s.applied_revision);
        let mark = t.mark();
        let (rev, kvs) = t.etcd.range_prefix(&t.prefix).await?;
        let applied_now = t.relist(engine, kvs, applied, mark).await;
        t.save(rev);
        tracing::info!(
            tombstones = t.len(),
            applied = applied_now,
            revision = rev,
            "the pod's block deletes applied"
        );
        Ok((t, rev))
    }

    /// After this member's record was put again (its lease was lost): empties it if etcd
    /// had not answered for longer than the retention, then lists the pod's tombstones and
    /// applies every one newer than the revision it had applied (`crate::fence`).
    pub async fn catch_up(&self, engine: &Engine, away: Duration) -> anyhow::Result<()> {
        let state = self.load();
        self.empty_if_away(engine, Some(away.as_secs() as i64))
            .await?;
        let applied = state.map_or(0, |s| s.applied_revision);
        let mark = self.mark();
        let (rev, kvs) = self.etcd.range_prefix(&self.prefix).await?;
        let failed = self.failed_applies();
        let n = self.relist(engine, kvs, applied, mark).await;
        anyhow::ensure!(
            self.failed_applies() == failed,
            "a tombstone could not be applied here (its block could not be deleted)"
        );
        self.save(rev);
        tracing::info!(
            applied = n,
            revision = rev,
            "caught up with the pod's block deletes"
        );
        Ok(())
    }

    /// Counts a delete recorded but not settled (members that may hold the block could
    /// not be reached and are still in the pod).
    pub fn unsettled(&self) {
        self.metrics
            .pod_deletes_refused
            .with_label_values(&["holders_unreached"])
            .inc();
    }

    fn failed_applies(&self) -> u64 {
        self.metrics
            .pod_tombstones_applied
            .with_label_values(&["failed"])
            .get()
    }

    /// How long a delete waits for a member it cannot reach to drop out of the pod.
    pub fn lease_ttl(&self) -> Duration {
        self.lease_ttl
    }

    /// Empties this node when it was `away` (seconds without etcd) longer than the
    /// retention: it cannot know which deletes it missed.
    async fn empty_if_away(&self, engine: &Engine, away: Option<i64>) -> anyhow::Result<()> {
        let t = self;
        let pod = t.pod.as_str();
        if away.is_some_and(|a| a > t.retention.as_secs() as i64) {
            tracing::warn!(
                away_s = away,
                retention_s = t.retention.as_secs(),
                "away from the pod longer than pod.tombstone_retention_s: deletes made \
                 meanwhile may be forgotten, so this node empties itself before it rejoins"
            );
            let n = empty(engine).await?;
            // Namespaces deleted meanwhile: their records may have expired too. Every
            // namespace of an etcd pod has a record, so one without is gone.
            let ns_prefix = super::namespaces::namespaces_prefix(pod);
            let (_, recs) = t.etcd.range_prefix(&ns_prefix).await?;
            let known: HashSet<&str> = recs
                .iter()
                .filter_map(|kv| kv.key.strip_prefix(&ns_prefix))
                .collect();
            for ns in engine.namespaces() {
                if ns.name != "default" && !known.contains(ns.name.as_str()) {
                    tracing::info!(namespace = %ns.name, "no longer in the pod: deleted");
                    engine.delete_namespace(&ns.name).await?;
                }
            }
            t.metrics.pod_emptied_on_return.inc();
            tracing::info!(
                blocks = n,
                "emptied; backfill brings this node its share again"
            );
        }
        Ok(())
    }

    /// Keeps the tombstones current (and applies new ones) until `stop`.
    pub fn spawn(
        self: Arc<Self>,
        engine: Arc<Engine>,
        rev: i64,
        stop: tokio_util::sync::CancellationToken,
    ) {
        tokio::spawn(async move {
            tokio::select! {
                biased;
                _ = stop.cancelled() => {}
                _ = self.follow(&engine, rev) => {}
            }
        });
    }

    /// Whether the pod deleted this block within the retention.
    pub fn holds(&self, ns: &str, key: &[u8]) -> bool {
        self.known
            .lock()
            .expect("tombstones")
            .names
            .contains(&name_of(ns, key))
    }

    /// After a copy of a block ([`ctxpod_wire::HEADER_COPY`]: backfill, read repair) was
    /// stored here, having been checked against the tombstones before: whether the block's
    /// tombstone arrived meanwhile (from the watch, or from a settling delete that then
    /// deletes the block here after learning it). If so the copy is deleted again and is to
    /// be answered as refused: either this check sees the tombstone, or the settling
    /// delete's own delete comes after the copy was stored.
    pub async fn undo_copy_of_deleted(&self, engine: &Engine, ns: &str, key: &[u8]) -> bool {
        if !self.holds(ns, key) {
            return false;
        }
        self.apply(engine, &name_of(ns, key)).await;
        true
    }

    pub fn len(&self) -> usize {
        self.known.lock().expect("tombstones").names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the delete of this block can be recorded (the pod holds fewer than
    /// `pod.tombstones_max`): asked before the delete is sent to the members.
    pub fn room_for(&self, ns: &str, key: &[u8]) -> Result<(), Refused> {
        let over = {
            let known = &self.known.lock().expect("tombstones").names;
            known.len() >= self.max && !known.contains(&name_of(ns, key))
        };
        if over {
            self.metrics
                .pod_deletes_refused
                .with_label_values(&["tombstones_full"])
                .inc();
            return Err(Refused::Full);
        }
        Ok(())
    }

    /// Records the delete of a block in etcd, once the members a read would try answered.
    pub async fn record(&self, ns: &str, key: &[u8]) -> Result<(), Refused> {
        self.room_for(ns, key)?;
        let name = name_of(ns, key);
        let value = serde_json::json!({ "deleted_unix": super::membership::unix_now() });
        let r = async {
            let lease = self.lease().await?;
            self.etcd
                .put(
                    &format!("{}{name}", self.prefix),
                    value.to_string().as_bytes(),
                    Some(lease),
                )
                .await
        }
        .await;
        if let Err(e) = r {
            self.metrics
                .pod_deletes_refused
                .with_label_values(&["etcd"])
                .inc();
            // The lease may be what failed (gone early: etcd restored, revoked): take a
            // new one next time.
            *self.lease.lock().await = None;
            return Err(Refused::Etcd(e));
        }
        // Known at once here (the watch says so too, a moment later).
        self.learn_recorded(ns, key);
        Ok(())
    }

    /// Learns a block delete the pod recorded before this node's watch delivers it: this
    /// node recorded it, or the member that did asks this one to apply it while settling
    /// it ([`ctxpod_wire::HEADER_DELETE_RECORDED`]). From now on a copy of the block is
    /// refused here, whether or not the watch is flowing (a node cut from etcd, its lease
    /// not yet run out).
    pub fn learn_recorded(&self, ns: &str, key: &[u8]) {
        let name = name_of(ns, key);
        let mark = self.mark();
        let mut known = self.known.lock().expect("tombstones");
        known.learn_recorded(name, mark);
        self.metrics.pod_tombstones.set(known.names.len() as i64);
    }

    /// A new mark: learnings and listings in the order they happened.
    fn mark(&self) -> u64 {
        self.marks.fetch_add(1, std::sync::atomic::Ordering::AcqRel)
    }

    /// The lease for new tombstones (block deletes, and namespace deletion records): one
    /// per 1/16 of the retention, living the retention
    /// plus that slice, so every tombstone lives at least the retention.
    pub async fn lease(&self) -> anyhow::Result<i64> {
        let slice = (self.retention / 16).max(Duration::from_secs(1));
        let mut l = self.lease.lock().await;
        if let Some((id, at)) = *l {
            if at.elapsed() < slice {
                return Ok(id);
            }
        }
        let id = self
            .etcd
            .grant((self.retention + slice).as_secs() as i64)
            .await?;
        *l = Some((id, Instant::now()));
        Ok(id)
    }

    /// Learns a tombstone from etcd (its watch).
    fn learn_name(&self, name: String) {
        let mut known = self.known.lock().expect("tombstones");
        known.learn(name);
        self.metrics.pod_tombstones.set(known.names.len() as i64);
    }

    fn forget_name(&self, name: &str) {
        let mut known = self.known.lock().expect("tombstones");
        known.forget(name);
        self.metrics.pod_tombstones.set(known.names.len() as i64);
    }

    /// Takes a full listing, asked for at `mark`: the known set becomes it, with the
    /// deletes learned as recorded since (the listing may be older than they are), and
    /// every tombstone written after revision `applied` is applied. Returns how many were
    /// applied.
    async fn relist(&self, engine: &Engine, kvs: Vec<Kv>, applied: i64, mark: u64) -> usize {
        let applied = applied.max(self.applied.load(std::sync::atomic::Ordering::Acquire));
        let mut names = HashSet::with_capacity(kvs.len());
        let mut fresh = Vec::new();
        for kv in kvs {
            let Some(name) = kv.key.strip_prefix(&self.prefix) else {
                continue;
            };
            if kv.mod_revision > applied {
                fresh.push(name.to_string());
            }
            names.insert(name.to_string());
        }
        {
            let mut known = self.known.lock().expect("tombstones");
            known.relist(names, mark);
            self.metrics.pod_tombstones.set(known.names.len() as i64);
        }
        for name in &fresh {
            self.apply(engine, name).await;
        }
        fresh.len()
    }

    /// Deletes this node's copy of a tombstoned block.
    async fn apply(&self, engine: &Engine, name: &str) {
        let Some((ns, key)) = parse_name(name) else {
            tracing::warn!(name, "a tombstone that names no block: ignored");
            return;
        };
        let outcome = match engine.delete(ns, &key).await {
            Ok(true) => "deleted",
            Ok(false) | Err(EngineError::NotFound(_)) => "absent",
            Err(e) => {
                // Only a node whose writes fail (read-only) gets here; its copy is still
                // refused by the others, as a copy of a deleted block.
                tracing::warn!(ns, "tombstone not applied: {e}");
                "failed"
            }
        };
        self.metrics
            .pod_tombstones_applied
            .with_label_values(&[outcome])
            .inc();
    }

    /// Watch from `rev + 1`; when the watch breaks, list again (applying what is new).
    async fn follow(&self, engine: &Engine, mut rev: i64) {
        let mut tick = tokio::time::interval(SAVE_EVERY);
        loop {
            match self.etcd.watch_prefix(&self.prefix, rev + 1).await {
                Ok(stream) => {
                    let mut stream = std::pin::pin!(stream);
                    loop {
                        tokio::select! {
                            biased;
                            _ = tick.tick() => self.save(rev),
                            batch = futures::StreamExt::next(&mut stream) => {
                                let events = match batch {
                                    Some(Ok(ev)) => ev,
                                    Some(Err(e)) => {
                                        tracing::warn!("tombstone watch: {e:#}");
                                        break;
                                    }
                                    None => break,
                                };
                                for ev in events {
                                    match ev {
                                        WatchEvent::Put(kv) => {
                                            rev = rev.max(kv.mod_revision);
                                            let done = self.applied.load(std::sync::atomic::Ordering::Acquire);
                                            if let Some(name) = kv.key.strip_prefix(&self.prefix) {
                                                self.learn_name(name.to_string());
                                                if kv.mod_revision > done {
                                                    self.apply(engine, name).await;
                                                }
                                            }
                                        }
                                        WatchEvent::Delete { key, mod_revision } => {
                                            rev = rev.max(mod_revision);
                                            if let Some(name) = key.strip_prefix(&self.prefix) {
                                                self.forget_name(name);
                                            }
                                        }
                                    }
                                }
                                self.save(rev);
                            }
                        }
                    }
                }
                Err(e) => tracing::warn!("tombstone watch: {e:#}"),
            }
            // The watch ended: list again (it may have missed events), then watch on.
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let mark = self.mark();
                match self.etcd.range_prefix(&self.prefix).await {
                    Ok((r, kvs)) => {
                        self.relist(engine, kvs, rev, mark).await;
                        rev = r;
                        self.save(rev);
                        break;
                    }
                    Err(e) => tracing::warn!("tombstone listing: {e:#}"),
                }
            }
        }
    }

    fn load(&self) -> Option<State> {
        let s: State = match std::fs::read(&self.state_file) {
            Ok(b) => match serde_json::from_slice(&b) {
                Ok(s) => s,
                Err(e) => {
                    // Not trusted: treated as a node that never applied any (all applied
                    // again, nothing emptied).
                    tracing::warn!("{}: {e}; ignored", self.state_file.display());
                    return None;
                }
            },
            Err(_) => return None,
        };
        // A data directory moved to another pod: that pod's tombstones all apply.
        (s.pod == self.pod).then_some(s)
    }

    /// Notes that every tombstone up to `rev` is applied, and when etcd last answered.
    fn save(&self, rev: i64) {
        let rev = self
            .applied
            .fetch_max(rev, std::sync::atomic::Ordering::AcqRel)
            .max(rev);
        let seen = match self.membership.etcd_last_ok() {
            0 => super::membership::unix_now(),
            t => t,
        };
        let s = State {
            pod: self.pod.clone(),
            applied_revision: rev,
            seen_unix: seen,
        };
        let tmp = self.state_file.with_extension("tmp");
        let r = serde_json::to_vec(&s)
            .map_err(std::io::Error::other)
            .and_then(|b| std::fs::write(&tmp, b))
            .and_then(|()| std::fs::rename(&tmp, &self.state_file));
        if let Err(e) = r {
            tracing::warn!("{}: {e}", self.state_file.display());
        }
    }
}

/// Deletes every block this node holds (every namespace stays); how many.
async fn empty(engine: &Engine) -> anyhow::Result<u64> {
    let mut n = 0;
    for ns in engine.namespaces() {
        let mut after: Option<Vec<u8>> = None;
        loop {
            let keys = engine.keys_after(&ns.name, after.as_deref(), EMPTY_BATCH)?;
            let Some(last) = keys.last().cloned() else {
                break;
            };
            for k in keys {
                n += engine.delete(&ns.name, &k).await? as u64;
            }
            after = Some(last);
        }
    }
    Ok(n)
}

/// The tombstones a node knows: those etcd holds, as its watch and listings say, and those
/// learned from a delete recorded before the watch delivered them.
#[derive(Debug, Default)]
struct Known {
    /// Names (`<namespace>/<hex key>`).
    names: HashSet<String>,
    /// Of those, the ones learned as recorded ([`Tombstones::learn_recorded`]) that the
    /// watch has not delivered yet, each with the mark it was learned at: a listing asked
    /// for before then may not hold it, so a relist keeps it.
    ahead: std::collections::HashMap<String, u64>,
}

impl Known {
    fn learn_recorded(&mut self, name: String, mark: u64) {
        if !self.names.insert(name.clone()) {
            return;
        }
        self.ahead.insert(name, mark);
        // Bounded: a client may mark its own delete as recorded (it names a block it may
        // delete anyway); the oldest such names go first.
        if self.ahead.len() > AHEAD_OF_WATCH_MAX {
            let oldest = self
                .ahead
                .iter()
                .min_by_key(|(_, m)| **m)
                .map(|(n, _)| n.clone());
            if let Some(oldest) = oldest {
                self.ahead.remove(&oldest);
                self.names.remove(&oldest);
            }
        }
    }

    /// From etcd (the watch).
    fn learn(&mut self, name: String) {
        self.ahead.remove(&name);
        self.names.insert(name);
    }

    fn forget(&mut self, name: &str) {
        self.ahead.remove(name);
        self.names.remove(name);
    }

    /// A full listing asked for at `mark` replaces what is known, but for the names learned
    /// as recorded since (learned before: etcd held them then, so the listing has them, or
    /// they expired).
    fn relist(&mut self, mut names: HashSet<String>, mark: u64) {
        self.ahead.retain(|_, at| *at > mark);
        names.extend(self.ahead.keys().cloned());
        self.names = names;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> HashSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    /// A settling delete's tombstone, learned before the watch delivered it, survives a
    /// relist of a listing asked for before it was learned, and not one asked for after.
    #[test]
    fn a_tombstone_learned_as_recorded_outlives_an_older_listing_only() {
        let mut k = Known::default();
        k.learn("ns/01".into());
        let listing_asked = 5;
        k.learn_recorded("ns/02".into(), 7);
        k.relist(set(&["ns/01"]), listing_asked);
        assert_eq!(k.names, set(&["ns/01", "ns/02"]));
        // A later listing without it: it expired, or was never recorded.
        k.relist(set(&["ns/01"]), 9);
        assert_eq!(k.names, set(&["ns/01"]));
        // Delivered by the watch: a listing is then the word on it.
        k.learn_recorded("ns/03".into(), 10);
        k.learn("ns/03".into());
        k.relist(set(&["ns/01"]), 8);
        assert_eq!(k.names, set(&["ns/01"]));
    }

    /// Names learned as recorded are bounded; the oldest go first, a known one is no new one.
    #[test]
    fn tombstones_learned_ahead_of_the_watch_are_bounded() {
        let mut k = Known::default();
        k.learn("ns/etcd".into());
        k.learn_recorded("ns/etcd".into(), 0);
        assert!(k.ahead.is_empty(), "known from etcd already");
        for i in 0..=AHEAD_OF_WATCH_MAX as u64 {
            k.learn_recorded(format!("ns/{i:x}"), i + 1);
        }
        assert_eq!(k.ahead.len(), AHEAD_OF_WATCH_MAX);
        assert!(!k.names.contains("ns/0"), "the oldest went first");
        assert!(k.names.contains("ns/1") && k.names.contains("ns/etcd"));
    }

    #[test]
    fn a_tombstone_name_gives_back_its_namespace_and_key() {
        for (ns, key) in [("default", &b"k1"[..]), ("acme/llama", &[0u8, 1, 255][..])] {
            let name = name_of(ns, key);
            assert_eq!(parse_name(&name), Some((ns, key.to_vec())));
        }
        assert_eq!(parse_name("default"), None);
        assert_eq!(parse_name("default/zz"), None);
        assert_eq!(parse_name("/00"), None);
        assert_eq!(parse_name("default/"), None);
    }
}
