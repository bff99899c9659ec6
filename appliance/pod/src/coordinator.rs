//! One block's request served for the whole pod: a read asked of the block's read
//! candidates (this member first when it is one), a put sent to its R members, a delete sent
//! to every member a read would look at, then recorded as a tombstone and settled
//! ([`crate::settle`]). The rules live here; how one member is asked is a [`Member`]: the
//! node's HTTP stack in production (its own stack for itself, a forward for the others),
//! the simulated network in the simulation, so both run this same code.
//!
//! A namespace's keys are listed for the pod by [`Coordinator::list`] ([`crate::listing`]);
//! pin, unpin, presence and promote ask every read candidate
//! ([`Coordinator::any_candidate`]); MATCH asks each member about its own keys
//! ([`Coordinator::match_chain`]). What does not go through the coordinator yet: a value
//! over one record (streamed to its members as it arrives), multipart uploads and batches (the node drives
//! those from the plans in [`ctxpod_wire::pod_plan`] and [`crate::batch`]).

use crate::membership::{MemberInfo, Membership, PodView};
use crate::route::{Missed, Route};
use crate::settle::{AskDelete, Asked, Settling};
use crate::tombstones::Tombstones;
use ctxpod_wire::pod_plan::{Plan, ReadAnswer, WriteAnswer, WriteOutcome, WritePlan};
use http::Method;
use std::collections::{BTreeMap, BTreeSet};
use tokio::time::Instant;

/// Why a member gave no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unreached {
    /// The connection failed, or the bytes it answered do not match their CRC32C: the next
    /// member is asked.
    Unreachable,
    /// The connection was refused: nothing listens there (it catches up on the pod's
    /// deletes before it serves again).
    Refused,
    /// It missed a deadline: the next member is asked, and this one is asked last for a
    /// while ([`Missed`]).
    TimedOut,
}

/// What a member's answer says, as the pod's rules read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Said {
    /// Done: the block read, a put stored (`created`: the block is new there), a delete
    /// applied to a copy.
    Done { created: bool },
    /// No such block there.
    NotFound,
    /// Anything else: a refusal or an error, passed on as it is.
    Other,
}

/// The request being served, as any member of the pod is asked it: this member through
/// its own stack (`mine`), the others across the network. The request is marked as routed
/// so that the member serves it itself.
#[async_trait::async_trait]
pub trait Member: Sync {
    /// A member's answer, passed on to the client as it is.
    type Answer: Send;

    /// Asks member `m`.
    async fn ask(&self, m: &MemberInfo, mine: bool) -> Result<Self::Answer, Unreached>;

    /// Asks member `m` to apply a block delete the pod has recorded (settling it): as
    /// [`Member::ask`], and `m` takes the tombstone at once
    /// ([`ctxpod_wire::HEADER_DELETE_RECORDED`]), so that it refuses a copy of the block from
    /// then on, whatever its watch has delivered.
    async fn ask_recorded(&self, m: &MemberInfo, mine: bool) -> Result<Self::Answer, Unreached>;

    /// What `a` says.
    fn said(&self, a: &Self::Answer) -> Said;
}

/// Why a routed write was not acknowledged.
#[derive(Debug)]
pub enum Refusal {
    /// Too few of the members that must take it could be reached (503, retry).
    Unavailable(&'static str),
    /// The delete cannot be recorded (etcd unreachable, or too many tombstones pending):
    /// nothing was sent, nothing done.
    NotRecordable(crate::tombstones::Refused),
    /// The delete reached the copies on `removed` but could not be recorded: send it
    /// again.
    NotRecorded {
        error: crate::tombstones::Refused,
        removed: Vec<String>,
    },
    /// The delete is recorded and applied on `applied`; `pending` may hold the block, are
    /// still in the pod and did not answer by the deadline.
    Unsettled {
        applied: BTreeSet<String>,
        pending: Vec<String>,
    },
}

/// The pod as one request sees it, from one member.
pub struct Coordinator<'a> {
    pub membership: &'a Membership,
    /// This member's id.
    pub me: &'a str,
    /// Members that missed a deadline lately (asked last).
    pub missed: &'a Missed,
    /// The pod's block deletes (with etcd).
    pub tombstones: Option<&'a Tombstones>,
}

/// A routed write's block: its namespace as placed (the caller's name for it), its key,
/// and the copies a delete looks for.
#[derive(Debug, Clone, Copy)]
pub struct Placed<'a> {
    pub ns: &'a str,
    pub key: &'a [u8],
    pub copies: usize,
    /// The namespace's name in the engine (the tenant's scope applied), under which a
    /// delete's tombstone is recorded; `None` when the name is not a valid one (then the
    /// members refuse the request, and nothing is recorded).
    pub stored_ns: Option<&'a str>,
}

impl Coordinator<'_> {
    /// Whether a request with `method` may be served by other members than this one: a
    /// pod of one serves everything here, except that with etcd a block delete is recorded
    /// and settled whatever the view's size (a member out of the view now may hold the
    /// block and come back).
    pub fn may_route(&self, view: &PodView, method: &Method) -> bool {
        view.members.len() >= 2 || self.records_deletes(method)
    }

    fn records_deletes(&self, method: &Method) -> bool {
        self.tombstones.is_some() && *method == Method::DELETE
    }

    /// Where a request for block `key` of `ns` (kept in `replication` copies) is served.
    pub fn route(
        &self,
        view: &PodView,
        method: &Method,
        ns: &str,
        key: &[u8],
        replication: usize,
    ) -> Route {
        match crate::route::route(view, self.me, method, ns, key, replication) {
            Route::Local if self.records_deletes(method) => Route::Delete {
                copies: replication.max(1),
            },
            route => route,
        }
    }

    /// A read: the block's read candidates asked in order (this member first when it is
    /// one: its own copy costs no hop; a member counted down last); the first answer that
    /// is not a miss is the answer. `None`: every candidate missed or could not be reached.
    pub async fn read<M: Member>(
        &self,
        view: &PodView,
        ns: &str,
        key: &[u8],
        copies: usize,
        member: &M,
    ) -> Option<M::Answer> {
        let down = self.missed.flags(view);
        let mut plan = Route::read_plan(view, &down, ns, key, copies);
        if let Some(me) = view.members.iter().position(|m| m.id == self.me) {
            plan = plan.ask_first(me, &down);
        }
        let mut answer = None;
        while let Some(round) = plan.next_round() {
            for m in round.into_keys() {
                let info = &view.members[m];
                match self.ask(member, info, false).await {
                    Err(_) => plan.answer(m, 0, ReadAnswer::Unreachable),
                    // A miss here may be a hit further down the ranking (a block written
                    // while its first member was away); anything else is the answer.
                    Ok(a) if member.said(&a) == Said::NotFound => {
                        plan.answer(m, 0, ReadAnswer::Miss)
                    }
                    Ok(a) => {
                        plan.answer(m, 0, ReadAnswer::Final);
                        answer = Some(a);
                    }
                }
            }
        }
        answer
    }

    /// A per-key question (pin, unpin, presence) asked of every member a read of each key
    /// would try, each member about its keys at once (`ask(member, key indexes)`, this
    /// member included), blocks kept in `copies` copies: per key, whether any member said
    /// yes. A member answering `None` said no to all of its keys. A member counted down (it
    /// missed a deadline lately) is left out, unless every candidate of a key is: one
    /// deadline, not one per call.
    pub async fn any_candidate<'m, F, Fut>(
        &self,
        view: &'m PodView,
        ns: &str,
        keys: &[Vec<u8>],
        copies: usize,
        ask: F,
    ) -> Vec<bool>
    where
        F: Fn(&'m MemberInfo, Vec<usize>) -> Fut,
        Fut: std::future::Future<Output = Option<Vec<bool>>>,
    {
        let down = self.missed.flags(view);
        let round = ctxpod_wire::pod_plan::fan_out(&view.placement, &down, ns, keys, copies);
        let answers = futures::future::join_all(round.into_iter().map(|(m, idx)| {
            let asked = ask(&view.members[m], idx.clone());
            async move { (idx, asked.await) }
        }))
        .await;
        ctxpod_wire::pod_plan::any_yes(keys.len(), answers)
    }

    /// How many leading keys of `chain` (a prefix's blocks, kept in `copies` copies) the
    /// pod holds: each member asked about its own keys, all at once, the first key its
    /// first member lacks asked of its other candidates before the chain is cut there
    /// ([`ctxpod_wire::pod_plan::MatchPlan`]), members counted down asked last.
    /// `ask(member, positions)`: how many of those keys, in order, the member holds (this
    /// member included); its error fails the match.
    pub async fn match_chain<'m, F, Fut, E>(
        &self,
        view: &'m PodView,
        ns: &str,
        chain: &[Vec<u8>],
        copies: usize,
        ask: F,
    ) -> Result<usize, E>
    where
        F: Fn(&'m MemberInfo, Vec<usize>) -> Fut,
        Fut: std::future::Future<Output = Result<usize, E>>,
    {
        let down = self.missed.flags(view);
        let mut plan =
            ctxpod_wire::pod_plan::MatchPlan::new(&view.placement, &down, ns, chain, copies);
        while let Some(round) = plan.next_round() {
            let asked = futures::future::join_all(round.into_iter().map(|(m, pos)| {
                let held = ask(&view.members[m], pos);
                async move { (m, held.await) }
            }))
            .await;
            for (m, held) in asked {
                plan.answer(m, held?);
            }
        }
        Ok(plan.matched().unwrap_or(0) as usize)
    }

    /// The plan of a routed put or delete (`route` a write's), over `view`.
    pub fn write_plan(
        &self,
        view: &PodView,
        route: Route,
        ns: &str,
        key: &[u8],
    ) -> Option<WritePlan> {
        route.write_plan(view, &self.missed.flags(view), ns, key)
    }

    /// A routed put or delete, driven by its plan: sent to the members the plan asks,
    /// round by round, each round's at once. A delete (with etcd) is then recorded as a
    /// tombstone — after the members answered, which tells whether one held the block —
    /// and settled: every member that may hold it applied it or is out of the pod. The
    /// answer passed on: a put's best-ranked copy's, a delete's from a member that held it.
    pub async fn write<M: Member>(
        &self,
        view: &PodView,
        mut plan: WritePlan,
        placed: Placed<'_>,
        member: &M,
    ) -> Result<M::Answer, Refusal> {
        let started = Instant::now();
        let is_delete = plan.is_delete();
        let recorded = self.tombstones.filter(|_| is_delete).zip(placed.stored_ns);
        if let Some((t, stored_ns)) = recorded {
            t.room_for(stored_ns, placed.key)
                .map_err(Refusal::NotRecordable)?;
        }
        let mut answers: BTreeMap<usize, M::Answer> = BTreeMap::new();
        let mut said: Vec<(usize, Said)> = Vec::new();
        while let Some(round) = plan.next_round() {
            let sent = futures::future::join_all(
                round
                    .into_keys()
                    .map(|m| async move { (m, self.ask(member, &view.members[m], false).await) }),
            )
            .await;
            for (m, answer) in sent {
                let Ok(answer) = answer else {
                    plan.answer(m, 0, WriteAnswer::Unreachable);
                    continue;
                };
                said.push((m, member.said(&answer)));
                let a = match (is_delete, member.said(&answer)) {
                    (_, Said::Done { created }) => WriteAnswer::Applied {
                        changed: is_delete || created,
                    },
                    (true, Said::NotFound) => WriteAnswer::Applied { changed: false },
                    _ => WriteAnswer::Refused,
                };
                plan.answer(m, 0, a);
                answers.insert(m, answer);
            }
        }
        if let Some((t, stored_ns)) = recorded {
            self.record_and_settle((t, stored_ns), view, &said, placed, member, started)
                .await?;
        }
        pick_answer(plan.finish().pop(), answers, is_delete)
    }

    /// A delete's tombstone recorded (members away delete their copy when they return,
    /// every member deletes any copy taken meanwhile, and no copy of it is taken back),
    /// then settled.
    async fn record_and_settle<M: Member>(
        &self,
        (t, stored_ns): (&Tombstones, &str),
        view: &PodView,
        said: &[(usize, Said)],
        placed: Placed<'_>,
        member: &M,
        started: Instant,
    ) -> Result<(), Refusal> {
        let removed: Vec<String> = said
            .iter()
            .filter(|(_, said)| matches!(said, Said::Done { .. }))
            .map(|&(m, _)| view.members[m].id.clone())
            .collect();
        if let Err(error) = t.record(stored_ns, placed.key).await {
            tracing::warn!("block delete not recorded: {error}");
            return Err(Refusal::NotRecorded { error, removed });
        }
        // Every member is asked again once the tombstone is recorded, those that applied
        // the first round too: a copy of the block (a backfill pass or a read repair that
        // read it before) may have landed there since, and nothing refused it then. Asked
        // as recorded, each takes the tombstone and refuses copies from then on. A member
        // that refuses the connection counts (it lists the tombstones when it starts).
        let mut applied: BTreeSet<String> = BTreeSet::new();
        let until = crate::settle::deadline(started, t.lease_ttl());
        let settling = Settling {
            membership: self.membership,
            missed: self.missed,
            ns: placed.ns,
            key: placed.key,
        };
        let ask = Asking {
            coordinator: self,
            member,
        };
        if let Err(pending) = settling.settle(&ask, &mut applied, until).await {
            t.unsettled();
            return Err(Refusal::Unsettled { applied, pending });
        }
        Ok(())
    }

    /// Asks `m` (through its own stack when it is this member; `recorded`: to apply a
    /// recorded delete), noting whether it met its deadline.
    async fn ask<M: Member>(
        &self,
        member: &M,
        m: &MemberInfo,
        recorded: bool,
    ) -> Result<M::Answer, Unreached> {
        let mine = m.id == self.me;
        let answer = match recorded {
            true => member.ask_recorded(m, mine).await,
            false => member.ask(m, mine).await,
        };
        if !mine {
            match &answer {
                Ok(_) => self.missed.note(&m.id, true),
                Err(Unreached::TimedOut) => self.missed.note(&m.id, false),
                Err(_) => {}
            }
        }
        answer
    }
}

/// A settling delete's members asked the request itself.
struct Asking<'a, M> {
    coordinator: &'a Coordinator<'a>,
    member: &'a M,
}

#[async_trait::async_trait]
impl<M: Member> AskDelete for Asking<'_, M> {
    async fn ask(&self, m: &MemberInfo) -> Asked {
        match self.coordinator.ask(self.member, m, true).await {
            Ok(a) if self.member.said(&a) != Said::Other => Asked::Applied,
            Err(Unreached::Refused) => Asked::Refused,
            _ => Asked::Failed,
        }
    }
}

/// The answer to a routed write, from its plan's outcome and the members' answers: a
/// refused write's refusal, a delete's from a member that held the block (else the best
/// ranked's), a put's from its best-ranked copy; `Unavailable` when too few could be
/// reached.
pub fn pick_answer<A>(
    outcome: Option<WriteOutcome>,
    mut answers: BTreeMap<usize, A>,
    is_delete: bool,
) -> Result<A, Refusal> {
    const NONE_REACHED: &str = "no member that may hold this block can be reached";
    let picked = match outcome {
        Some(WriteOutcome::Refused { member }) => answers.remove(&member),
        // A delete: the answer of a member that held it, else of the best ranked.
        Some(WriteOutcome::Applied { members } | WriteOutcome::TooFew { members }) if is_delete => {
            let held = members.iter().find(|m| m.1).or(members.first());
            held.and_then(|&(m, _)| answers.remove(&m))
        }
        // A put: its best-ranked copy's answer.
        Some(WriteOutcome::Applied { members }) => {
            members.first().and_then(|&(m, _)| answers.remove(&m))
        }
        Some(WriteOutcome::TooFew { .. }) => {
            return Err(Refusal::Unavailable(
                "fewer members than the pod's replication factor can be reached",
            ))
        }
        None => None,
    };
    picked.ok_or(Refusal::Unavailable(NONE_REACHED))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    /// Members that answer as scripted, and the order they were asked in.
    struct Script {
        answers: HashMap<String, Result<Said, Unreached>>,
        asked: Mutex<Vec<String>>,
    }

    impl Script {
        fn new(answers: &[(&str, Result<Said, Unreached>)]) -> Script {
            Script {
                answers: answers.iter().map(|(id, a)| (id.to_string(), *a)).collect(),
                asked: Mutex::new(Vec::new()),
            }
        }

        fn asked(&self) -> Vec<String> {
            std::mem::take(&mut *self.asked.lock().unwrap())
        }
    }

    #[async_trait::async_trait]
    impl Member for Script {
        /// Who answered, and what.
        type Answer = (String, Said);

        async fn ask(&self, m: &MemberInfo, _mine: bool) -> Result<(String, Said), Unreached> {
            self.asked.lock().unwrap().push(m.id.clone());
            let a = self
                .answers
                .get(&m.id)
                .copied()
                .unwrap_or(Ok(Said::NotFound));
            a.map(|said| (m.id.clone(), said))
        }

        async fn ask_recorded(
            &self,
            m: &MemberInfo,
            mine: bool,
        ) -> Result<(String, Said), Unreached> {
            self.ask(m, mine).await
        }

        fn said(&self, a: &(String, Said)) -> Said {
            a.1
        }
    }

    fn membership(ids: &[&str]) -> Arc<Membership> {
        Membership::fixed(ids.iter().map(|id| MemberInfo::for_test(id)).collect())
    }

    const HIT: Result<Said, Unreached> = Ok(Said::Done { created: false });
    const STORED: Result<Said, Unreached> = Ok(Said::Done { created: true });

    /// A pod of `ids` and one key: its members in rank, and the coordinator of any of them.
    struct Fixture {
        pod: Arc<Membership>,
        missed: Missed,
        /// The key's members, in rank.
        order: Vec<String>,
    }

    impl Fixture {
        fn new(ids: &[&str], key: &[u8]) -> Fixture {
            let pod = membership(ids);
            let order = pod
                .view()
                .ranked("ns", key)
                .into_iter()
                .map(|m| m.id.clone())
                .collect();
            Fixture {
                pod,
                missed: Missed::default(),
                order,
            }
        }

        /// The coordinator of the key's member of rank `rank`.
        fn at(&self, rank: usize) -> Coordinator<'_> {
            Coordinator {
                membership: &self.pod,
                me: &self.order[rank],
                missed: &self.missed,
                tombstones: None,
            }
        }
    }

    #[tokio::test]
    async fn a_read_asks_this_member_first_when_it_is_a_candidate() {
        let key = b"k1";
        let f = Fixture::new(&["a", "b", "c", "d", "e"], key);
        let (pod, order) = (&f.pod, &f.order);
        // This member is the second candidate; it holds the block.
        let c = f.at(1);
        let me = order[1].clone();
        let script = Script::new(&[(me.as_str(), HIT)]);
        let view = pod.view();
        let got = c.read(&view, "ns", key, 2, &script).await;
        assert_eq!(got.map(|a| a.0), Some(me.clone()));
        assert_eq!(script.asked(), vec![me]);
    }

    #[tokio::test]
    async fn a_miss_falls_through_to_the_next_candidate_and_a_hit_ends_the_read() {
        let key = b"k2";
        let f = Fixture::new(&["a", "b", "c", "d", "e"], key);
        let (pod, order) = (&f.pod, &f.order);
        // Asked through a member that is not a candidate.
        let c = f.at(4);
        let script = Script::new(&[(order[1].as_str(), HIT), (order[2].as_str(), HIT)]);
        let view = pod.view();
        let got = c.read(&view, "ns", key, 2, &script).await;
        assert_eq!(got.map(|a| a.0), Some(order[1].clone()));
        assert_eq!(script.asked(), vec![order[0].clone(), order[1].clone()]);

        // Nobody holds it: every candidate is asked, and the read is a miss.
        let script = Script::new(&[]);
        assert!(c.read(&view, "ns", key, 2, &script).await.is_none());
        let candidates = crate::route::read_candidates(2).min(order.len());
        assert_eq!(script.asked(), order[..candidates].to_vec());
    }

    #[tokio::test]
    async fn a_member_that_missed_a_deadline_is_asked_last_for_a_while() {
        let key = b"k3";
        let f = Fixture::new(&["a", "b", "c", "d", "e"], key);
        let (pod, order) = (&f.pod, &f.order);
        let c = f.at(4);
        let view = pod.view();
        let script = Script::new(&[
            (order[0].as_str(), Err(Unreached::TimedOut)),
            (order[1].as_str(), HIT),
        ]);
        let got = c.read(&view, "ns", key, 2, &script).await;
        assert_eq!(got.map(|a| a.0), Some(order[1].clone()));
        assert_eq!(script.asked()[0], order[0]);
        // The next read asks the member that timed out after the others.
        let got = c.read(&view, "ns", key, 2, &script).await;
        assert_eq!(got.map(|a| a.0), Some(order[1].clone()));
        assert_eq!(script.asked(), vec![order[1].clone()]);
        // A refused connection costs nothing: it is not counted down.
        let missed = Missed::default();
        let c = Coordinator {
            missed: &missed,
            ..c
        };
        let script = Script::new(&[
            (order[0].as_str(), Err(Unreached::Refused)),
            (order[1].as_str(), HIT),
        ]);
        c.read(&view, "ns", key, 2, &script).await;
        c.read(&view, "ns", key, 2, &script).await;
        assert_eq!(script.asked()[2], order[0], "asked first again");
    }

    #[tokio::test]
    async fn a_put_goes_to_the_next_member_when_one_cannot_be_reached() {
        let key = b"k4";
        let f = Fixture::new(&["a", "b", "c", "d"], key);
        let (pod, order) = (&f.pod, &f.order);
        let c = f.at(3);
        let view = pod.view();
        let placed = Placed {
            ns: "ns",
            key,
            copies: 0,
            stored_ns: Some("ns"),
        };
        let route = c.route(&view, &Method::PUT, "ns", key, 2);
        assert_eq!(route, Route::Write { copies: 2 });
        let plan = || c.write_plan(&view, route, "ns", key).expect("a write");

        // The first member refuses the connection: the third in rank takes its copy; the
        // answer is the best-ranked copy's.
        let script = Script::new(&[
            (order[0].as_str(), Err(Unreached::Refused)),
            (order[1].as_str(), STORED),
            (order[2].as_str(), STORED),
        ]);
        let got = c.write(&view, plan(), placed, &script).await;
        assert_eq!(got.expect("acknowledged").0, order[1]);
        let mut asked = script.asked();
        asked.sort();
        let mut want = order[..3].to_vec();
        want.sort();
        assert_eq!(asked, want);

        // Only one member can be reached: fewer than R copies, refused.
        let script = Script::new(&[
            (order[0].as_str(), Err(Unreached::Refused)),
            (order[1].as_str(), STORED),
            (order[2].as_str(), Err(Unreached::Unreachable)),
            (order[3].as_str(), Err(Unreached::Unreachable)),
        ]);
        match c.write(&view, plan(), placed, &script).await {
            Err(Refusal::Unavailable(_)) => {}
            other => panic!("not refused: {:?}", other.map(|a| a.0)),
        }

        // A member that refuses the write (full, or over its quota): its answer is passed on.
        let script = Script::new(&[
            (order[0].as_str(), Ok(Said::Other)),
            (order[1].as_str(), STORED),
        ]);
        let got = c.write(&view, plan(), placed, &script).await;
        assert_eq!(got.expect("an answer").0, order[0]);
    }

    #[tokio::test]
    async fn a_delete_answers_from_a_member_that_held_the_block() {
        let key = b"k5";
        let f = Fixture::new(&["a", "b", "c", "d"], key);
        let (pod, order) = (&f.pod, &f.order);
        let c = f.at(0);
        let view = pod.view();
        let route = c.route(&view, &Method::DELETE, "ns", key, 2);
        let plan = c.write_plan(&view, route, "ns", key).expect("a delete");
        let placed = Placed {
            ns: "ns",
            key,
            copies: 2,
            stored_ns: Some("ns"),
        };
        // Only the second holds it (the first never had it).
        let script = Script::new(&[(order[1].as_str(), HIT)]);
        let got = c.write(&view, plan, placed, &script).await;
        assert_eq!(got.expect("deleted").0, order[1]);
        // Every read candidate was asked.
        let candidates = crate::route::read_candidates(2).min(order.len());
        assert_eq!(script.asked().len(), candidates);
    }
}
