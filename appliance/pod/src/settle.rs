//! A recorded delete, settled: the pod acknowledges a block's delete once every member that
//! may hold the block — every member of the pod as etcd holds it *now*, which is newer than
//! the delete's tombstone — has applied it, refused the connection (nothing listens there:
//! it catches up on the tombstones before it serves again), or dropped out of the pod (its
//! lease ran out, and a member fences itself before that: [`crate::fence`]). Every member,
//! not only the block's read candidates: a copy may sit beyond them (a put's stand-in for a
//! member it could not reach, a copy left where the block ranked before a member joined),
//! and a member that holds one serves it to a request sent to it directly until it applies
//! the tombstone from its watch.
//! Until then the delete is not acknowledged, so no member serves a block after the pod
//! acknowledged its delete.
//!
//! The members are asked through [`AskDelete`]: the coordinator's (the request itself,
//! marked as recorded, asked of a `crate::coordinator::Member`: the node's routed HTTP in
//! production, the simulated network in the simulation). Each is asked once the tombstone
//! is recorded, a member that applied the delete's first round too: a copy of the block
//! sent by a backfill pass or a read repair that read it before may have landed there in
//! between, when nothing refused it; asked as recorded, a member takes the tombstone and
//! refuses copies from then on. Pending members are asked all at once each round, every
//! ask bounded by the deadline, so one silent member cannot make the others wait.

use crate::membership::{MemberInfo, Membership};
use crate::route::Missed;
use std::collections::BTreeSet;
use std::time::Duration;
use tokio::time::Instant;

/// The longest a delete waits, from its start, for the members that may hold the block:
/// within a client's request deadline (10 s), with room for its answer.
pub const SETTLE_MAX: Duration = Duration::from_secs(8);

/// How long a delete started at `started` may settle: [`SETTLE_MAX`], or the lease TTL and
/// a second (a silent member's lease has run out by then), whichever is shorter.
pub fn deadline(started: Instant, lease_ttl: Duration) -> Instant {
    started + SETTLE_MAX.min(lease_ttl + Duration::from_secs(1))
}

/// A member's answer to "delete your copy".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asked {
    /// Deleted, or it held no copy.
    Applied,
    /// The connection was refused: nothing listens there (it catches up before serving).
    Refused,
    /// No answer, or an error: ask again.
    Failed,
}

/// How a member is asked to delete its copy of the block being settled.
#[async_trait::async_trait]
pub trait AskDelete: Sync {
    /// Asks `m` (this member too, when it is pending) to delete its copy.
    async fn ask(&self, m: &MemberInfo) -> Asked;
}

/// A delete recorded as a tombstone, to settle.
pub struct Settling<'a> {
    pub membership: &'a Membership,
    /// Members that missed a deadline lately: not asked (their lease runs out, or they
    /// answer a later round).
    pub missed: &'a Missed,
    /// The block as placed.
    pub ns: &'a str,
    pub key: &'a [u8],
}

/// How often the pending members are asked again.
const ROUND: Duration = Duration::from_millis(250);

impl Settling<'_> {
    /// Settles the delete by `until`: `applied` holds the members that already applied it
    /// and gains those that do. The ids of the members still pending when it gives up.
    pub async fn settle(
        &self,
        ask: &dyn AskDelete,
        applied: &mut BTreeSet<String>,
        until: Instant,
    ) -> Result<(), Vec<String>> {
        loop {
            let view = match self.membership.current().await {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!("settling a delete: etcd: {e:#}");
                    return Err(vec!["(the pod's members: etcd did not answer)".into()]);
                }
            };
            // Every member: a copy may sit beyond the read candidates (a put's stand-in for
            // a member it could not reach, a copy left where it ranked before a join).
            let pending: Vec<&MemberInfo> = view
                .ranked(self.ns, self.key)
                .into_iter()
                .filter(|m| !applied.contains(&m.id))
                .collect();
            if pending.is_empty() {
                return Ok(());
            }
            let down = self.missed.flags(&view);
            let asked = futures::future::join_all(
                pending
                    .iter()
                    .filter(|m| {
                        let ix = view.members.iter().position(|v| v.id == m.id);
                        !ix.is_some_and(|i| down[i])
                    })
                    .map(|m| async move {
                        let answer = tokio::time::timeout_at(until, ask.ask(m)).await;
                        (m.id.clone(), answer.unwrap_or(Asked::Failed))
                    }),
            )
            .await;
            for (id, answer) in asked {
                if answer != Asked::Failed {
                    applied.insert(id);
                }
            }
            let still: Vec<String> = pending
                .iter()
                .filter(|m| !applied.contains(&m.id))
                .map(|m| m.id.clone())
                .collect();
            if still.is_empty() {
                continue; // listed again: a member may have joined meanwhile
            }
            if Instant::now() >= until {
                return Err(still);
            }
            tokio::time::sleep_until((Instant::now() + ROUND).min(until)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Members that apply the delete, but for one that never answers.
    struct Asks {
        silent: String,
        asked: Mutex<Vec<String>>,
    }

    #[async_trait::async_trait]
    impl AskDelete for Asks {
        async fn ask(&self, m: &MemberInfo) -> Asked {
            self.asked.lock().unwrap().push(m.id.clone());
            match m.id == self.silent {
                true => Asked::Failed,
                false => Asked::Applied,
            }
        }
    }

    /// Found by the pod's simulation (seeds 230 and 442 of its suite): a copy a put left on
    /// a member ranked beyond the read candidates was served there after its delete was
    /// acknowledged. The delete now waits for that member too.
    #[tokio::test(start_paused = true)]
    async fn a_delete_waits_for_every_member_not_only_the_read_candidates() {
        let ids = ["a", "b", "c", "d", "e", "f"];
        let pod = Membership::fixed(ids.iter().map(|id| MemberInfo::for_test(id)).collect());
        let key = b"k";
        let order: Vec<String> = pod
            .view()
            .ranked("ns", key)
            .into_iter()
            .map(|m| m.id.clone())
            .collect();
        let last = order.last().expect("members").clone();
        let asks = Asks {
            silent: last.clone(),
            asked: Mutex::new(Vec::new()),
        };
        let missed = Missed::default();
        let settling = Settling {
            membership: &pod,
            missed: &missed,
            ns: "ns",
            key,
        };
        // The delete's first round reached the read candidates.
        let candidates = crate::route::read_candidates(2);
        let mut applied: BTreeSet<String> = order[..candidates].iter().cloned().collect();
        let until = Instant::now() + Duration::from_secs(2);
        let settled = settling.settle(&asks, &mut applied, until).await;
        assert_eq!(settled, Err(vec![last.clone()]));
        let asked = asks.asked.lock().unwrap().clone();
        for m in &order[candidates..] {
            assert!(asked.contains(m), "{m} was not asked");
        }
        assert_eq!(applied.len(), ids.len() - 1);
    }
}
