//! [`MemMeta`]: an in-memory twin of etcd, for the deterministic simulation of the pod.
//!
//! Its semantics are etcd v3's for every call of [`Meta`], as read in etcd's source
//! (`server/storage/mvcc/kvstore.go`, `watchable_store.go`, `watcher_group.go`,
//! `server/lease/lessor.go`, `server/etcdserver/api/v3rpc/lease.go`) and checked by
//! [`super::conformance`], the checks a real etcd passes too:
//! - one revision counter, 1 on a fresh store, moved on by one by each change: a put, a
//!   delete that removed a key, a compare-and-swap that wrote, a lease revoked or expired
//!   with keys attached (all of its keys in one revision, in key order, as etcd's `Revoke`);
//! - leases with ids 1, 2, 3, … (etcd's are unpredictable; these repeat from run to run), a
//!   TTL raised to etcd's minimum ([`MIN_TTL_S`]), expiring when the TTL passes without a
//!   keep-alive on Tokio's clock: virtual under paused time (the simulation's, or
//!   `#[tokio::test(start_paused = true)]`), the monotonic clock otherwise;
//! - a key's lease is the one given at its last put: a put without one (a compare-and-swap
//!   included: its put carries none) detaches the key;
//! - a watch replays the history kept since the last compaction, then follows live;
//!   `start_revision` 0 means the next revision, one below the compaction point fails with
//!   [`Compacted`]; compaction refuses what etcd refuses ([`Meta::compact`] below).
//!
//! Leases expire even when nobody calls: a reaper task, spawned by [`MemMeta::new`], sleeps
//! until the earliest deadline and revokes what is due, so watchers see the deletes. Every
//! call also revokes what is due first, so its answer is exact whenever the reaper runs.
//!
//! Not modelled: failures (a wrapper cuts the network for the simulation), auth, etcd's
//! delay between a lease's expiry and its revoke (up to 500 ms there, none here), slow
//! watchers (a watcher's queue is unbounded, where etcd cancels a watcher that lags). The
//! history grows until [`Meta::compact`], as etcd's does without auto-compaction.

use super::{Compacted, Kv, Meta, Watch, WatchEvent};
use anyhow::{anyhow, bail, Context};
use futures::channel::mpsc;
use futures::StreamExt;
use parking_lot::{Mutex, MutexGuard};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// etcd's shortest lease TTL with its default timing (heartbeat 100 ms, election timeout
/// 1 s): 1.5 election timeouts, rounded up to the second (`minTTL` in etcd's server). A
/// shorter TTL is raised to it, as etcd's `Grant` does.
pub const MIN_TTL_S: i64 = 2;

/// etcd's longest lease TTL (`lease.MaxLeaseTTL`); a longer one is refused.
pub const MAX_TTL_S: i64 = 9_000_000_000;

/// The in-memory twin of etcd. Cheap to clone: clones share one store, which goes (and its
/// watches end) with the last of them.
#[derive(Clone)]
pub struct MemMeta {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State>,
    /// Wakes the reaper: a lease was granted (an earlier deadline, maybe), or the store went.
    reaper: Arc<Notify>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.reaper.notify_one();
    }
}

struct Entry {
    value: Vec<u8>,
    create_revision: i64,
    mod_revision: i64,
    lease: Option<i64>,
}

struct Lease {
    ttl: i64,
    deadline: Instant,
    keys: BTreeSet<String>,
}

struct Watcher {
    prefix: String,
    /// The first revision it wants.
    from: i64,
    tx: mpsc::UnboundedSender<Vec<WatchEvent>>,
}

#[derive(Default)]
struct State {
    revision: i64,
    /// The compaction point: the history from this revision on is kept (0: never compacted).
    compacted: i64,
    kvs: BTreeMap<String, Entry>,
    leases: BTreeMap<i64, Lease>,
    last_lease: i64,
    /// Every change since the compaction point, by revision (in key order within one).
    history: BTreeMap<i64, Vec<WatchEvent>>,
    watchers: Vec<Watcher>,
    /// etcd is stopped ([`MemMeta::stop`]): no lease expires.
    stopped: bool,
    /// How fast etcd's clock runs against the callers' ([`MemMeta::set_clock_rate`]).
    clock_rate: f64,
}

fn key_of(e: &WatchEvent) -> &str {
    match e {
        WatchEvent::Put(kv) => &kv.key,
        WatchEvent::Delete { key, .. } => key,
    }
}

fn lease_not_found(lease: i64) -> anyhow::Error {
    anyhow!("etcdserver: requested lease not found (lease {lease})")
}

/// When a lease of `ttl_s` seconds of etcd's clock, which runs `rate` times as fast as
/// the callers', ends from `now`; an error past the clock's range.
fn deadline(now: Instant, ttl_s: i64, rate: f64) -> anyhow::Result<Instant> {
    let lasts = Duration::try_from_secs_f64(ttl_s.unsigned_abs() as f64 / rate).ok();
    lasts
        .and_then(|d| now.checked_add(d))
        .with_context(|| format!("a lease of {ttl_s} s ends past the clock's range"))
}

impl Watcher {
    /// Sends the events of revision `rev` under its prefix, if it wants them; false when the
    /// watch is gone (its stream dropped).
    fn send(&self, rev: i64, events: &[WatchEvent]) -> bool {
        let mine: Vec<WatchEvent> = events
            .iter()
            .filter(|e| rev >= self.from && key_of(e).starts_with(&self.prefix))
            .cloned()
            .collect();
        if mine.is_empty() {
            return !self.tx.is_closed();
        }
        self.tx.unbounded_send(mine).is_ok()
    }
}

impl State {
    /// A fresh store: revision 1, as etcd's.
    fn new() -> State {
        State {
            revision: 1,
            clock_rate: 1.0,
            ..State::default()
        }
    }

    /// Revokes every lease whose deadline has come, earliest first (then by id).
    fn expire(&mut self, now: Instant) {
        if self.stopped {
            return;
        }
        let mut due: Vec<(Instant, i64)> = self
            .leases
            .iter()
            .filter(|(_, l)| l.deadline <= now)
            .map(|(id, l)| (l.deadline, *id))
            .collect();
        due.sort_unstable();
        for (_, id) in due {
            self.revoke(id);
        }
    }

    /// Removes a lease and its keys, all in one revision; false when there is no such lease.
    fn revoke(&mut self, id: i64) -> bool {
        let Some(lease) = self.leases.remove(&id) else {
            return false;
        };
        let rev = self.revision + 1;
        let events = lease
            .keys
            .iter()
            .filter_map(|k| self.remove(k, rev))
            .collect();
        self.publish(rev, events);
        true
    }

    /// Writes `key = value` in the next revision, attached to `lease` (which exists).
    fn put(&mut self, key: &str, value: &[u8], lease: Option<i64>) {
        let rev = self.revision + 1;
        let create_revision = match self.kvs.get(key).map(|e| (e.create_revision, e.lease)) {
            Some((created, old_lease)) => {
                self.detach(key, old_lease);
                created
            }
            None => rev,
        };
        if let Some(l) = lease.and_then(|id| self.leases.get_mut(&id)) {
            l.keys.insert(key.to_string());
        }
        let entry = Entry {
            value: value.to_vec(),
            create_revision,
            mod_revision: rev,
            lease,
        };
        let event = WatchEvent::Put(entry.kv(key));
        self.kvs.insert(key.to_string(), entry);
        self.publish(rev, vec![event]);
    }

    /// Removes a key (as of revision `rev`, not yet published): its delete event, if it was
    /// there.
    fn remove(&mut self, key: &str, rev: i64) -> Option<WatchEvent> {
        let entry = self.kvs.remove(key)?;
        self.detach(key, entry.lease);
        Some(WatchEvent::Delete {
            key: key.to_string(),
            mod_revision: rev,
        })
    }

    fn detach(&mut self, key: &str, lease: Option<i64>) {
        if let Some(l) = lease.and_then(|id| self.leases.get_mut(&id)) {
            l.keys.remove(key);
        }
    }

    /// Makes `rev` the store's revision with these changes, and tells the watchers. No
    /// change, no revision.
    fn publish(&mut self, rev: i64, events: Vec<WatchEvent>) {
        if events.is_empty() {
            return;
        }
        self.revision = rev;
        self.watchers.retain(|w| w.send(rev, &events));
        self.history.insert(rev, events);
    }

    /// Every key under `prefix`, in key order.
    fn range(&self, prefix: &str) -> Vec<Kv> {
        self.kvs
            .range::<str, _>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, e)| e.kv(k))
            .collect()
    }
}

impl Entry {
    fn kv(&self, key: &str) -> Kv {
        Kv {
            key: key.to_string(),
            value: self.value.clone(),
            mod_revision: self.mod_revision,
        }
    }
}

impl MemMeta {
    /// An empty store at revision 1, and its reaper (the task that expires leases when
    /// nobody calls), spawned on the current Tokio runtime, whose clock it follows.
    ///
    /// # Panics
    /// Outside a Tokio runtime.
    pub fn new() -> MemMeta {
        let reaper = Arc::new(Notify::new());
        let inner = Arc::new(Inner {
            state: Mutex::new(State::new()),
            reaper: reaper.clone(),
        });
        tokio::spawn(reap(Arc::downgrade(&inner), reaper));
        MemMeta { inner }
    }

    /// The store, its due leases revoked.
    fn state(&self) -> MutexGuard<'_, State> {
        let mut s = self.inner.state.lock();
        s.expire(Instant::now());
        s
    }

    /// The store's revision now (for the simulation's checks; a range answers it too).
    pub fn revision(&self) -> i64 {
        self.state().revision
    }

    /// etcd stops (the simulation's "etcd down": its calls are refused by the network in
    /// front of it): no lease expires while it is stopped, as none does in an etcd that
    /// is not running.
    pub fn stop(&self) {
        self.inner.state.lock().stopped = true;
    }

    /// etcd starts again: every lease lives its whole TTL again from now, as etcd's new
    /// leader gives every lease (`lessor.Promote` in etcd's server/lease/lessor.go).
    pub fn start(&self) {
        let mut s = self.inner.state.lock();
        s.stopped = false;
        let (now, rate) = (Instant::now(), s.clock_rate);
        for l in s.leases.values_mut() {
            if let Ok(whole) = deadline(now, l.ttl, rate) {
                l.deadline = l.deadline.max(whole);
            }
        }
        drop(s);
        self.inner.reaper.notify_one();
    }

    /// etcd's clock runs `rate` times as fast as the callers' from now on (1: the same): a
    /// lease of T s granted or kept alive from now lasts T / `rate` s of theirs. The
    /// simulation drifts it within the fence's margin (`fence::CLOCK_MARGIN`), and beyond.
    ///
    /// # Panics
    /// When `rate` is not a positive finite number.
    pub fn set_clock_rate(&self, rate: f64) {
        assert!(rate.is_finite() && rate > 0.0, "a clock rate of {rate}");
        self.inner.state.lock().clock_rate = rate;
    }

    /// Every key under `prefix` now, in key order: the simulation's invariant checks read
    /// the store through this, without a call that a fault wrapper could cut.
    pub fn snapshot_prefix(&self, prefix: &str) -> Vec<Kv> {
        self.state().range(prefix)
    }
}

impl Default for MemMeta {
    /// [`MemMeta::new`] (so it panics outside a Tokio runtime).
    fn default() -> MemMeta {
        MemMeta::new()
    }
}

/// Revokes leases as their deadlines come, until the store goes.
async fn reap(inner: Weak<Inner>, wake: Arc<Notify>) {
    loop {
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let next = {
            let mut s = strong.state.lock();
            s.expire(Instant::now());
            // Stopped, nothing is due until it starts (which wakes this).
            let due = (!s.stopped).then(|| s.leases.values().map(|l| l.deadline).min());
            due.flatten()
        };
        // Not held while asleep: the last handle's drop wakes this to end it.
        drop(strong);
        // A keep-alive moves a deadline later, so it needs no wake-up: woken at the old
        // deadline, this finds nothing due and sleeps again.
        match next {
            Some(at) => tokio::select! {
                biased;
                () = tokio::time::sleep_until(at) => {}
                () = wake.notified() => {}
            },
            None => wake.notified().await,
        }
    }
}

#[async_trait::async_trait]
impl Meta for MemMeta {
    fn describe(&self) -> String {
        "memory".to_string()
    }

    async fn grant(&self, ttl_s: i64) -> anyhow::Result<i64> {
        if ttl_s > MAX_TTL_S {
            bail!("grant a lease of {ttl_s} s: etcdserver: too large lease TTL");
        }
        let ttl = ttl_s.max(MIN_TTL_S);
        let mut s = self.state();
        let deadline = deadline(Instant::now(), ttl, s.clock_rate)?;
        s.last_lease += 1;
        let id = s.last_lease;
        let keys = BTreeSet::new();
        s.leases.insert(
            id,
            Lease {
                ttl,
                deadline,
                keys,
            },
        );
        drop(s);
        self.inner.reaper.notify_one();
        Ok(id)
    }

    async fn keepalive(&self, lease: i64) -> anyhow::Result<Option<i64>> {
        let mut s = self.state();
        let rate = s.clock_rate;
        // etcd answers TTL 0 for a lease it does not hold: gone.
        let Some(l) = s.leases.get_mut(&lease) else {
            return Ok(None);
        };
        l.deadline = deadline(Instant::now(), l.ttl, rate)?;
        Ok(Some(l.ttl))
    }

    async fn revoke(&self, lease: i64) -> anyhow::Result<()> {
        if !self.state().revoke(lease) {
            return Err(lease_not_found(lease).context("revoke"));
        }
        Ok(())
    }

    async fn put(&self, key: &str, value: &[u8], lease: Option<i64>) -> anyhow::Result<()> {
        let mut s = self.state();
        if let Some(id) = lease.filter(|id| !s.leases.contains_key(id)) {
            return Err(lease_not_found(id).context(format!("put {key}")));
        }
        s.put(key, value, lease);
        Ok(())
    }

    async fn delete(&self, key: &str) -> anyhow::Result<()> {
        let mut s = self.state();
        let rev = s.revision + 1;
        if let Some(event) = s.remove(key, rev) {
            s.publish(rev, vec![event]);
        }
        Ok(())
    }

    async fn get(&self, key: &str) -> anyhow::Result<Option<Kv>> {
        Ok(self.state().kvs.get(key).map(|e| e.kv(key)))
    }

    async fn cas_put(&self, key: &str, value: &[u8], expected: i64) -> anyhow::Result<bool> {
        let mut s = self.state();
        // etcd's two comparisons, a missing key's revisions being 0.
        let (created, modified) = s
            .kvs
            .get(key)
            .map_or((0, 0), |e| (e.create_revision, e.mod_revision));
        let holds = if expected == 0 {
            created == 0
        } else {
            modified == expected
        };
        if holds {
            s.put(key, value, None);
        }
        Ok(holds)
    }

    async fn leases(&self) -> anyhow::Result<Vec<i64>> {
        Ok(self.state().leases.keys().copied().collect())
    }

    async fn range_prefix(&self, prefix: &str) -> anyhow::Result<(i64, Vec<Kv>)> {
        let s = self.state();
        Ok((s.revision, s.range(prefix)))
    }

    /// etcd's rules (`watchableStore.watch`, `watcherGroup.chooseAll`): 0 or a revision past
    /// the current one waits for the next (or that) revision; one below the compaction
    /// point (`minRev < compactRev`) is refused, the compaction point itself is watchable.
    async fn watch_prefix(&self, prefix: &str, start_revision: i64) -> anyhow::Result<Watch> {
        let mut s = self.state();
        if start_revision < 0 {
            bail!("watch {prefix} from revision {start_revision}: a negative revision");
        }
        if start_revision != 0 && start_revision < s.compacted {
            let compacted_to = s.compacted;
            return Err(anyhow::Error::new(Compacted { compacted_to })
                .context(format!("watch {prefix} from revision {start_revision}")));
        }
        let from = if start_revision == 0 {
            s.revision + 1
        } else {
            start_revision
        };
        let (tx, rx) = mpsc::unbounded();
        let prefix = prefix.to_string();
        let watcher = Watcher { prefix, from, tx };
        for (rev, events) in s.history.range(from..) {
            watcher.send(*rev, events);
        }
        s.watchers.push(watcher);
        Ok(rx.map(Ok).boxed())
    }

    /// etcd's rules (`store.updateCompactRev`): a revision at or below the compaction point
    /// is refused ("required revision has been compacted"), one past the current revision
    /// too ("required revision is a future revision"); the current revision is allowed.
    async fn compact(&self, revision: i64) -> anyhow::Result<()> {
        let mut s = self.state();
        if revision <= s.compacted {
            bail!(
                "compact to {revision}: etcdserver: mvcc: required revision has been compacted \
                 (compacted to {})",
                s.compacted
            );
        }
        if revision > s.revision {
            bail!(
                "compact to {revision}: etcdserver: mvcc: required revision is a future revision \
                 (the store is at {})",
                s.revision
            );
        }
        s.compacted = revision;
        s.history = s.history.split_off(&revision);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::compacted;
    use crate::meta::conformance::{self, del, put};
    use futures::future::BoxFuture;

    fn virtual_wait(d: Duration) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(d))
    }

    /// The next batch of a watch, within a (virtual) minute.
    async fn next(w: &mut Watch) -> Vec<WatchEvent> {
        tokio::time::timeout(Duration::from_secs(60), w.next())
            .await
            .expect("a batch within a minute")
            .expect("the watch open")
            .expect("no error")
    }

    /// The twin passes the checks a real etcd passes, in virtual time.
    #[tokio::test(start_paused = true)]
    async fn the_twin_passes_the_conformance_checks() {
        let m = MemMeta::new();
        conformance::check_all(&m, "/conformance/", &virtual_wait)
            .await
            .expect("conformance");
    }

    /// The checks can fail, and say which: a prefix that is not empty fails the first.
    #[tokio::test(start_paused = true)]
    async fn a_failed_check_is_named() {
        let m = MemMeta::new();
        m.put("/c/revisions/x", b"", None).await.unwrap();
        let e = conformance::check_all(&m, "/c/", &virtual_wait)
            .await
            .expect_err("a prefix holding a key");
        assert!(
            format!("{e:#}").contains("`revisions_count_changes`"),
            "{e:#}"
        );
    }

    /// A lease that runs out deletes its keys in one revision, and a watcher gets the
    /// deletes with nobody calling the store.
    #[tokio::test(start_paused = true)]
    async fn an_expiring_lease_reaches_a_watcher_with_nobody_calling() {
        let m = MemMeta::new();
        let lease = m.grant(5).await.unwrap();
        m.put("/l/b", b"2", Some(lease)).await.unwrap();
        m.put("/l/a", b"1", Some(lease)).await.unwrap();
        let mut w = m.watch_prefix("/l/", 0).await.unwrap();
        let t0 = Instant::now();
        assert_eq!(next(&mut w).await, vec![del("/l/a", 4), del("/l/b", 4)]);
        assert_eq!(t0.elapsed(), Duration::from_secs(5));
        assert_eq!(m.revision(), 4);
        assert!(m.snapshot_prefix("/l/").is_empty());
    }

    #[tokio::test(start_paused = true)]
    /// A stopped etcd expires no lease, and a started one gives every lease its whole TTL
    /// (the simulation's "etcd down for everyone" depends on both).
    async fn a_stopped_store_expires_nothing_and_its_start_renews_every_lease() {
        let m = MemMeta::new();
        let lease = m.grant(3).await.unwrap();
        m.put("/s/k", b"v", Some(lease)).await.unwrap();
        m.stop();
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(
            m.snapshot_prefix("/s/").len(),
            1,
            "nothing expires while stopped"
        );
        m.start();
        tokio::time::sleep(Duration::from_millis(2_900)).await;
        assert_eq!(
            m.snapshot_prefix("/s/").len(),
            1,
            "a whole TTL from the start"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(m.snapshot_prefix("/s/").len(), 0, "then it expires");
    }

    /// A lease of T s on an etcd whose clock runs twice as fast lasts T / 2 s of the
    /// callers' clock, from its grant and from each keep-alive (the simulation's clock
    /// drift).
    #[tokio::test(start_paused = true)]
    async fn a_faster_etcd_clock_ends_leases_sooner_by_its_rate() {
        let m = MemMeta::new();
        m.set_clock_rate(2.0);
        let lease = m.grant(4).await.unwrap();
        m.put("/d/k", b"v", Some(lease)).await.unwrap();
        tokio::time::advance(Duration::from_millis(1_999)).await;
        assert!(m.get("/d/k").await.unwrap().is_some(), "1.999 s of 2");
        assert_eq!(m.keepalive(lease).await.unwrap(), Some(4));
        tokio::time::advance(Duration::from_millis(1_999)).await;
        assert!(
            m.get("/d/k").await.unwrap().is_some(),
            "2 s from the keep-alive"
        );
        tokio::time::advance(Duration::from_millis(2)).await;
        assert!(m.get("/d/k").await.unwrap().is_none(), "gone at 2 s");
    }

    /// A lease ends exactly at its deadline, whoever asks first; a keep-alive moves the
    /// deadline to now + TTL; a TTL under etcd's minimum is raised to it.
    #[tokio::test(start_paused = true)]
    async fn a_lease_ends_exactly_at_its_deadline() {
        let m = MemMeta::new();
        let lease = m.grant(1).await.unwrap();
        m.put("/e/k", b"v", Some(lease)).await.unwrap();
        tokio::time::advance(Duration::from_millis(1_999)).await;
        assert!(m.get("/e/k").await.unwrap().is_some(), "raised to 2 s");
        assert_eq!(m.keepalive(lease).await.unwrap(), Some(MIN_TTL_S));
        tokio::time::advance(Duration::from_millis(1_999)).await;
        assert_eq!(m.snapshot_prefix("/e/").len(), 1, "kept alive");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(m.get("/e/k").await.unwrap(), None);
        assert_eq!(m.keepalive(lease).await.unwrap(), None);
        assert_eq!(m.leases().await.unwrap(), Vec::<i64>::new());
        let e = m.put("/e/k", b"v", Some(lease)).await.unwrap_err();
        assert!(format!("{e:#}").contains("lease not found"), "{e:#}");
        assert!(m.revoke(lease).await.is_err());
        assert!(m.grant(MAX_TTL_S + 1).await.is_err());
    }

    /// What a run of operations shows: lease ids, revisions, every event, what is left.
    async fn run_script() -> String {
        let m = MemMeta::new();
        let ids = [m.grant(3).await, m.grant(60).await, m.grant(9).await];
        let ids: Vec<i64> = ids.into_iter().map(Result::unwrap).collect();
        for i in [7, 3, 9, 1, 8, 2, 6, 0, 5, 4] {
            let k = format!("/d/{i}");
            m.put(&k, k.as_bytes(), Some(ids[i % 3])).await.unwrap();
        }
        m.revoke(ids[1]).await.unwrap();
        assert!(m.cas_put("/d/x", b"x", 0).await.unwrap());
        tokio::time::sleep(Duration::from_secs(10)).await;
        m.compact(3).await.unwrap();
        let mut w = m.watch_prefix("/d/", 3).await.unwrap();
        let mut events = Vec::new();
        while events.len() < 20 {
            events.extend(next(&mut w).await);
        }
        format!(
            "{ids:?} {} {events:?} {:?}",
            m.revision(),
            m.snapshot_prefix("/")
        )
    }

    /// The same operations give the same lease ids, revisions and events, whatever the
    /// keys' order of insertion (each lease's keys go in key order).
    #[tokio::test(start_paused = true)]
    async fn the_same_operations_give_the_same_store() {
        let first = run_script().await;
        assert_eq!(first, run_script().await);
        assert!(first.starts_with("[1, 2, 3] 15 "), "{first}");
        let revoked: String = ["1", "4", "7"]
            .map(|k| format!("{:?}, ", del(&format!("/d/{k}"), 12)))
            .concat();
        assert!(first.contains(&revoked), "{first}");
    }

    /// The compaction point a watch of /c/ from `from` is refused with.
    async fn refused(m: &MemMeta, from: i64) -> Option<i64> {
        let e = m.watch_prefix("/c/", from).await.err();
        compacted(&e.expect("a watch from below the compaction"))
    }

    /// Compaction refuses a revision at or below the compaction point or past the store's,
    /// takes the current one; watches from below it fail, from it replay; a live watch
    /// goes on.
    #[tokio::test(start_paused = true)]
    async fn compaction_follows_etcd() {
        let m = MemMeta::new();
        for v in [b"1", b"2", b"3"] {
            m.put("/c/k", v, None).await.unwrap();
        }
        let mut live = m.watch_prefix("/c/", 0).await.unwrap();
        let err = |r: anyhow::Result<()>| format!("{:#}", r.unwrap_err());
        assert!(err(m.compact(5).await).contains("future revision"));
        assert!(err(m.compact(0).await).contains("has been compacted"));
        m.compact(3).await.unwrap();
        assert!(err(m.compact(3).await).contains("has been compacted"));
        assert!(err(m.compact(2).await).contains("has been compacted"));
        assert_eq!(refused(&m, 2).await, Some(3));
        let mut from = m.watch_prefix("/c/", 3).await.unwrap();
        assert_eq!(next(&mut from).await, vec![put("/c/k", b"2", 3)]);
        assert_eq!(next(&mut from).await, vec![put("/c/k", b"3", 4)]);
        m.put("/c/k", b"4", None).await.unwrap();
        assert_eq!(next(&mut live).await, vec![put("/c/k", b"4", 5)]);
        assert_eq!(next(&mut from).await, vec![put("/c/k", b"4", 5)]);
        m.compact(5).await.unwrap();
        assert_eq!(refused(&m, 4).await, Some(5));
        assert!(m.watch_prefix("/c/", 0).await.is_ok());
    }

    /// A watch from 0 starts at the next revision; one from a later revision waits for it.
    #[tokio::test(start_paused = true)]
    async fn watches_from_zero_and_from_the_future() {
        let m = MemMeta::new();
        m.put("/z/a", b"", None).await.unwrap();
        let mut now = m.watch_prefix("/z/", 0).await.unwrap();
        let mut later = m.watch_prefix("/z/", 5).await.unwrap();
        for k in ["/z/b", "/z/c", "/z/d"] {
            m.put(k, b"", None).await.unwrap();
        }
        assert_eq!(next(&mut now).await, vec![put("/z/b", b"", 3)]);
        assert_eq!(next(&mut now).await, vec![put("/z/c", b"", 4)]);
        assert_eq!(next(&mut later).await, vec![put("/z/d", b"", 5)]);
        assert!(m.watch_prefix("/z/", -1).await.is_err());
    }

    /// The reaper ends with the last handle, and the watches with it.
    #[tokio::test(start_paused = true)]
    async fn the_reaper_ends_with_the_last_handle() {
        let tasks = || {
            tokio::runtime::Handle::current()
                .metrics()
                .num_alive_tasks()
        };
        let before = tasks();
        let m = MemMeta::new();
        let other = m.clone();
        m.grant(60).await.unwrap();
        let mut w = m.watch_prefix("/", 0).await.unwrap();
        drop(m);
        tokio::task::yield_now().await;
        assert_eq!(tasks(), before + 1, "a clone holds the store");
        drop(other);
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(tasks(), before);
        let end = tokio::time::timeout(Duration::from_secs(1), w.next()).await;
        assert!(matches!(end, Ok(None)), "the watch ended");
    }
}
