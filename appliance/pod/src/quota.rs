//! A namespace's quota held for the whole pod, not per member: a ledger in etcd.
//!
//! - The quota counts **logical** bytes (what the client stored once). A pod stores each
//!   block on R members (the namespace's replication, or the pod's; at most the number of
//!   members), so the namespace's physical *allowance* is `quota_bytes × R`.
//! - `/ctxpod/<pod>/quota/<ns>` holds a [`Ledger`]: the bytes each member may hold of the
//!   namespace (its *grant*). It is changed only by compare-and-swap ([`crate::meta::Meta::cas_put`]
//!   on the key's revision), and every grant is computed by [`grow`] so that the grants never
//!   sum past the allowance: the pod never holds more than `quota × R` bytes of it while
//!   etcd answers. A member holds at most its grant (the engine's check, at the writer).
//! - A new block that would take a member past its grant asks for more ([`grow`]): a chunk,
//!   `max(the block, allowance / (4 × members))`, never past `allowance − Σ others' grants`;
//!   past that it is refused with the quota's own error (403 `quota`). etcd unreachable: no
//!   new grant, so a put beyond the grant held is refused (503 `busy`), never admitted.
//! - A delete gives back what the member holds no longer ([`shrink`]: the grant comes down
//!   to the bytes held and on their way), so the room is anyone's at once.
//! - A member gone from the pod keeps its grant for `pod.tombstone_retention_s` (it may come
//!   back with its blocks); after that it empties itself on return
//!   ([`super::tombstones`]), so whoever next needs bytes takes its grant back.
//! - A namespace deleted and created again (a new incarnation) starts a new ledger.
//!
//! The rules ([`grow`], [`shrink`]) are pure; [`Ledgers`] is the etcd side, the engine's
//! [`PodQuota`].

use super::membership::Membership;
use super::meta::Meta;
use ctxpod_engine::{EngineError, Namespace, PodQuota, QuotaFuture};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

/// How many times a grant is computed again after another member changed the ledger first.
const CAS_TRIES: usize = 16;

pub fn quota_prefix(pod: &str) -> String {
    format!("/ctxpod/{pod}/quota/")
}

/// One namespace's grants, as etcd records them.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Ledger {
    /// The namespace's incarnation these grants are of (0: none).
    #[serde(default)]
    pub incarnation: u64,
    /// Bytes each member may hold of the namespace, by member id.
    #[serde(default)]
    pub grants: BTreeMap<String, u64>,
    /// When (Unix seconds) a member holding a grant was first seen gone from the pod.
    #[serde(default)]
    pub absent_since: BTreeMap<String, u64>,
}

impl Ledger {
    pub fn total(&self) -> u64 {
        self.grants.values().fold(0u64, |a, &b| a.saturating_add(b))
    }

    pub fn grant_of(&self, id: &str) -> u64 {
        self.grants.get(id).copied().unwrap_or(0)
    }
}

/// What a member asks of the ledger.
#[derive(Clone, Debug)]
pub struct Ask<'a> {
    pub me: &'a str,
    pub incarnation: u64,
    /// `quota_bytes × R`.
    pub allowance: u64,
    /// The pod's members now.
    pub members: &'a BTreeSet<String>,
    /// Bytes this member must be able to hold: held, on their way, and the new block.
    pub need: u64,
    /// The new block.
    pub len: u64,
    pub now_s: u64,
    /// How long a gone member keeps its grant.
    pub grace_s: u64,
}

/// [`grow`]'s answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Grow {
    /// The member's grant already covers the need: nothing to write.
    Holds(u64),
    /// Write this ledger; the member's new grant.
    Grant(Ledger, u64),
    /// No room in the allowance: refused. The member's grant, and a ledger to write when it
    /// recorded absences (so their grace runs) or reclaimed grants.
    Refused { grant: u64, tidied: Option<Ledger> },
}

/// The ledger as it stands for this incarnation, with gone members marked and those gone
/// past their grace dropped.
fn tidy(ledger: &Ledger, ask: &Ask) -> Ledger {
    let mut l = if ledger.incarnation == ask.incarnation {
        ledger.clone()
    } else {
        Ledger {
            incarnation: ask.incarnation,
            ..Ledger::default()
        }
    };
    let ids: Vec<String> = l.grants.keys().cloned().collect();
    for id in ids {
        if id == ask.me || ask.members.contains(&id) {
            l.absent_since.remove(&id);
            continue;
        }
        let since = *l.absent_since.entry(id.clone()).or_insert(ask.now_s);
        if ask.now_s.saturating_sub(since) >= ask.grace_s {
            l.grants.remove(&id);
            l.absent_since.remove(&id);
        }
    }
    l.absent_since.retain(|id, _| l.grants.contains_key(id));
    l.grants.retain(|_, g| *g > 0);
    l
}

/// A member asks for room: the rule that keeps `Σ grants ≤ allowance` (every ledger it
/// returns to write sums to at most the allowance, or less than the one it was given).
pub fn grow(ledger: &Ledger, ask: &Ask) -> Grow {
    let mut l = tidy(ledger, ask);
    let mine = l.grant_of(ask.me);
    if ask.need <= mine && ledger.incarnation == ask.incarnation {
        return Grow::Holds(mine);
    }
    let others = l.total().saturating_sub(mine);
    let room = ask.allowance.saturating_sub(others);
    if ask.need > room {
        // The grant stays: it covers what the member holds (a lowered quota is met by
        // deletes, not by taking grants back).
        let tidied = (l != *ledger).then_some(l);
        return Grow::Refused {
            grant: mine,
            tidied,
        };
    }
    let members = ask.members.len().max(1) as u64;
    let chunk = ask.len.max(ask.allowance / (4 * members));
    let new = ask.need.max(mine.saturating_add(chunk)).min(room);
    l.grants.insert(ask.me.to_string(), new);
    Grow::Grant(l, new)
}

/// A member gives back its grant above `keep` (the bytes it holds and has on their way).
/// `None`: nothing to give back.
pub fn shrink(ledger: &Ledger, me: &str, incarnation: u64, keep: u64) -> Option<Ledger> {
    if ledger.incarnation != incarnation || ledger.grant_of(me) <= keep {
        return None;
    }
    let mut l = ledger.clone();
    if keep == 0 {
        l.grants.remove(me);
    } else {
        l.grants.insert(me.to_string(), keep);
    }
    Some(l)
}

/// The physical allowance of a namespace: its quota times its copies (at most one per
/// member).
pub fn allowance(quota: u64, replication: usize, members: usize) -> u64 {
    quota.saturating_mul(replication.clamp(1, members.max(1)) as u64)
}

/// The etcd side: this member's grants of every namespace with a quota.
pub struct Ledgers {
    etcd: Arc<dyn Meta>,
    pod: String,
    me: String,
    membership: Arc<Membership>,
    replication: usize,
    grace_s: u64,
    /// One change of a namespace's ledger at a time from this member.
    locks: parking_lot::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn no_ledger(e: anyhow::Error) -> EngineError {
    tracing::warn!("the pod's quota ledger is not reachable in etcd: {e:#}");
    EngineError::Busy("the pod's quota ledger (etcd)")
}

impl Ledgers {
    pub fn new(
        etcd: Arc<dyn Meta>,
        pod: &str,
        me: &str,
        membership: Arc<Membership>,
        replication: usize,
        grace_s: u64,
    ) -> Ledgers {
        Ledgers {
            etcd,
            pod: pod.to_string(),
            me: me.to_string(),
            membership,
            replication,
            grace_s,
            locks: parking_lot::Mutex::new(HashMap::new()),
        }
    }

    fn key(&self, ns: &str) -> String {
        format!("{}{ns}", quota_prefix(&self.pod))
    }

    fn lock(&self, ns: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.locks.lock().entry(ns.to_string()).or_default().clone()
    }

    /// The ledger and its revision (0: none yet).
    async fn read(&self, ns: &str) -> Result<(Ledger, i64), EngineError> {
        match self.etcd.get(&self.key(ns)).await.map_err(no_ledger)? {
            None => Ok((Ledger::default(), 0)),
            Some(kv) => match serde_json::from_slice(&kv.value) {
                Ok(l) => Ok((l, kv.mod_revision)),
                // Never taken as empty: that could grant past the allowance.
                Err(e) => Err(no_ledger(anyhow::anyhow!(
                    "the ledger of {ns} does not parse: {e}"
                ))),
            },
        }
    }

    async fn write(&self, ns: &str, l: &Ledger, rev: i64) -> Result<bool, EngineError> {
        let v = serde_json::to_vec(l).map_err(|e| no_ledger(e.into()))?;
        self.etcd
            .cas_put(&self.key(ns), &v, rev)
            .await
            .map_err(no_ledger)
    }

    async fn reserve_now(&self, ns: &Namespace, len: u64) -> Result<(), EngineError> {
        let Some(quota) = ns.quota_bytes() else {
            return Ok(());
        };
        let covered = |ns: &Namespace| {
            ns.grant()
                .is_some_and(|g| ns.used_bytes() + ns.pending_bytes() <= g)
        };
        if covered(ns) {
            return Ok(());
        }
        let lock = self.lock(&ns.name);
        let _one = lock.lock().await;
        for _ in 0..CAS_TRIES {
            if covered(ns) {
                return Ok(());
            }
            let (ledger, rev) = self.read(&ns.name).await?;
            let view = self.membership.view();
            let members: BTreeSet<String> = view.members.iter().map(|m| m.id.clone()).collect();
            let r = ns
                .replication()
                .map(|r| r as usize)
                .unwrap_or(self.replication);
            let allowance = allowance(quota, r, members.len());
            let ask = Ask {
                me: &self.me,
                incarnation: ns.incarnation().unwrap_or(0),
                allowance,
                members: &members,
                need: ns.used_bytes() + ns.pending_bytes(),
                len,
                now_s: now_s(),
                grace_s: self.grace_s,
            };
            match grow(&ledger, &ask) {
                Grow::Holds(g) => {
                    ns.set_grant(g);
                    return Ok(());
                }
                Grow::Grant(l, g) => {
                    if self.write(&ns.name, &l, rev).await? {
                        ns.set_grant(g);
                        return Ok(());
                    }
                }
                Grow::Refused { grant, tidied } => {
                    ns.set_grant(grant);
                    if let Some(l) = tidied {
                        // Records the absences (their grace runs from now); if another
                        // member came first, the next ask records them.
                        let _ = self.write(&ns.name, &l, rev).await;
                    }
                    return Err(EngineError::Quota(format!(
                        "namespace {} is at its quota of {quota} bytes in the pod \
                         ({allowance} bytes with its copies)",
                        ns.name
                    )));
                }
            }
        }
        Err(EngineError::Busy("the pod's quota ledger (etcd)"))
    }

    async fn released_now(&self, ns: &Namespace) -> Result<(), EngineError> {
        let lock = self.lock(&ns.name);
        let _one = lock.lock().await;
        let keep = ns.used_bytes() + ns.pending_bytes();
        if ns.grant().is_none_or(|g| g <= keep) {
            return Ok(());
        }
        // Lowered here before the ledger is: this member never holds more than the ledger
        // grants it, whatever etcd answers. A put needing more waits on the lock above.
        ns.set_grant(keep);
        // The ledger is written until it says so: another member's write first (two
        // holders of a deleted block give back at once) is read again and shrunk again.
        // (Before, the retry saw the lowered local grant and gave up, leaving the ledger
        // full: the room freed by a delete was anyone's only after the next one.)
        for _ in 0..CAS_TRIES {
            let (ledger, rev) = self.read(&ns.name).await?;
            let Some(l) = shrink(&ledger, &self.me, ns.incarnation().unwrap_or(0), keep) else {
                return Ok(());
            };
            if self.write(&ns.name, &l, rev).await? {
                return Ok(());
            }
        }
        Ok(())
    }
}

impl PodQuota for Ledgers {
    fn reserve<'a>(&'a self, ns: &'a Namespace, len: u64) -> QuotaFuture<'a> {
        Box::pin(self.reserve_now(ns, len))
    }

    fn released<'a>(&'a self, ns: &'a Namespace) -> QuotaFuture<'a> {
        Box::pin(self.released_now(ns))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const KIB: u64 = 1024;

    fn ids(n: usize) -> BTreeSet<String> {
        (0..n).map(|i| format!("n{i}")).collect()
    }

    fn ask<'a>(me: &'a str, members: &'a BTreeSet<String>, need: u64, len: u64) -> Ask<'a> {
        Ask {
            me,
            incarnation: 7,
            allowance: 1024 * KIB,
            members,
            need,
            len,
            now_s: 1000,
            grace_s: 60,
        }
    }

    #[test]
    fn two_halves_fit_a_mebibyte_and_a_third_is_refused_wherever_it_lands() {
        let m = ids(3);
        let mut l = Ledger::default();
        let half = 512 * KIB;
        for (me, used) in [("n0", 0), ("n1", 0)] {
            match grow(&l, &ask(me, &m, used + half, half)) {
                Grow::Grant(n, g) => {
                    assert_eq!(g, half);
                    l = n;
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(l.total(), 1024 * KIB);
        for (me, used) in [("n0", half), ("n1", half), ("n2", 0)] {
            assert!(matches!(
                grow(&l, &ask(me, &m, used + half, half)),
                Grow::Refused { tidied: None, .. }
            ));
        }
        // n0 deletes its block: the room is n2's.
        l = shrink(&l, "n0", 7, 0).unwrap();
        assert!(matches!(grow(&l, &ask("n2", &m, half, half)), Grow::Grant(_, g) if g == half));
    }

    #[test]
    fn a_grant_that_covers_the_need_writes_nothing_and_chunks_are_a_share() {
        let m = ids(4);
        let mut a = ask("n0", &m, 4 * KIB, 4 * KIB);
        a.allowance = 1 << 30;
        let Grow::Grant(l, g) = grow(&Ledger::default(), &a) else {
            panic!()
        };
        assert_eq!(g, (1 << 30) / 16);
        a.need = g;
        assert_eq!(grow(&l, &a), Grow::Holds(g));
    }

    #[test]
    fn a_gone_members_grant_is_kept_for_its_grace_then_reclaimed() {
        let all = ids(3);
        let half = 512 * KIB;
        let mut l = Ledger {
            incarnation: 7,
            grants: BTreeMap::from([("n1".into(), 1024 * KIB)]),
            ..Ledger::default()
        };
        let two: BTreeSet<String> = ["n0".to_string(), "n2".to_string()].into();
        let Grow::Refused {
            tidied: Some(t), ..
        } = grow(&l, &ask("n0", &two, half, half))
        else {
            panic!()
        };
        assert_eq!(t.absent_since.get("n1"), Some(&1000));
        l = t;
        let mut later = ask("n0", &two, half, half);
        later.now_s = 1059;
        assert!(matches!(grow(&l, &later), Grow::Refused { .. }));
        later.now_s = 1060;
        let Grow::Grant(n, g) = grow(&l, &later) else {
            panic!()
        };
        assert_eq!((g, n.grant_of("n1"), n.absent_since.len()), (half, 0, 0));
        // Back within its grace: its mark goes.
        let Grow::Refused {
            tidied: Some(t), ..
        } = grow(&l, &ask("n2", &all, 2048 * KIB, half))
        else {
            panic!()
        };
        assert!(t.absent_since.is_empty());
    }

    #[test]
    fn a_new_incarnation_starts_an_empty_ledger() {
        let m = ids(3);
        let old = Ledger {
            incarnation: 3,
            grants: BTreeMap::from([("n1".into(), 1024 * KIB)]),
            ..Ledger::default()
        };
        let Grow::Grant(l, _) = grow(&old, &ask("n0", &m, 512 * KIB, 512 * KIB)) else {
            panic!()
        };
        assert_eq!((l.incarnation, l.grant_of("n1")), (7, 0));
        assert_eq!(shrink(&old, "n1", 7, 0), None);
    }

    #[test]
    fn the_allowance_is_the_quota_times_the_copies_the_pod_can_make() {
        assert_eq!(allowance(100, 2, 3), 200);
        assert_eq!(allowance(100, 3, 2), 200);
        assert_eq!(allowance(100, 0, 0), 100);
    }

    #[derive(Clone, Debug)]
    enum Op {
        /// Member, bytes wanted, whether it reads a stale copy of the ledger.
        Grow(usize, u64, bool),
        /// Member, bytes it deletes.
        Delete(usize, u64),
        /// A member leaves or comes back.
        Toggle(usize),
        Tick(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..4usize, 1..400 * KIB, any::<bool>()).prop_map(|(m, b, s)| Op::Grow(m, b, s)),
            2 => (0..4usize, 0..800 * KIB).prop_map(|(m, b)| Op::Delete(m, b)),
            1 => (0..4usize).prop_map(Op::Toggle),
            1 => (0..100u64).prop_map(Op::Tick),
        ]
    }

    proptest! {
        /// Any sequence of asks (some from a stale read, which the compare-and-swap
        /// refuses), deletes, departures and returns: the grants never sum past the
        /// allowance, and every member holds at most its grant.
        #[test]
        fn grants_never_sum_past_the_allowance(
            allowance in 1..4096 * KIB,
            ops in proptest::collection::vec(op(), 1..200),
        ) {
            let names: Vec<String> = (0..4).map(|i| format!("n{i}")).collect();
            let mut present: BTreeSet<String> = names.iter().cloned().collect();
            let (mut ledger, mut rev) = (Ledger { incarnation: 7, ..Ledger::default() }, 1i64);
            let mut stale = (ledger.clone(), rev);
            let mut used = [0u64; 4];
            let mut now = 0u64;
            for op in ops {
                match op {
                    Op::Grow(m, len, from_stale) => {
                        let (seen, seen_rev) =
                            if from_stale { stale.clone() } else { (ledger.clone(), rev) };
                        let a = Ask {
                            me: &names[m],
                            incarnation: 7,
                            allowance,
                            members: &present,
                            need: used[m] + len,
                            len,
                            now_s: now,
                            grace_s: 30,
                        };
                        let (write, admitted) = match grow(&seen, &a) {
                            Grow::Holds(g) => (None, g >= used[m] + len),
                            Grow::Grant(l, g) => { prop_assert!(g >= used[m] + len); (Some(l), true) }
                            Grow::Refused { tidied, .. } => (tidied, false),
                        };
                        let mut committed = write.is_none();
                        if let Some(l) = write {
                            prop_assert!(l.total() <= allowance.max(seen.total()));
                            if seen_rev == rev {
                                stale = (ledger.clone(), rev);
                                ledger = l;
                                rev += 1;
                                committed = true;
                            }
                        }
                        if admitted && committed && used[m] + len <= ledger.grant_of(&names[m]) {
                            used[m] += len;
                        }
                    }
                    Op::Delete(m, b) => {
                        used[m] = used[m].saturating_sub(b);
                        if let Some(l) = shrink(&ledger, &names[m], 7, used[m]) {
                            stale = (ledger.clone(), rev);
                            ledger = l;
                            rev += 1;
                        }
                    }
                    Op::Toggle(m) => {
                        if !present.remove(&names[m]) {
                            present.insert(names[m].clone());
                        }
                    }
                    Op::Tick(s) => now += s,
                }
                prop_assert!(ledger.total() <= allowance, "{ledger:?} over {allowance}");
                for (m, u) in used.iter_mut().enumerate() {
                    // A member gone past its grace lost its grant, and empties itself
                    // before it comes back.
                    if !present.contains(&names[m]) && ledger.grant_of(&names[m]) == 0 {
                        *u = 0;
                    }
                    prop_assert!(*u <= ledger.grant_of(&names[m]));
                }
                prop_assert!(used.iter().sum::<u64>() <= allowance);
            }
        }
    }
}
