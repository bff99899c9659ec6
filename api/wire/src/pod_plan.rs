//! The pod planner: the pod's rules for an operation over keys, once, sans-IO.
//!
//! Every path that serves a pod (the Rust HTTP and CXP1 clients, the SDK through them, a
//! node forwarding a request or fanning out a batch, the S3 door through the node) drives
//! one of these plans with its own I/O: it asks the plan for a [`Round`] (which member gets
//! which entries), sends each member its entries at once, feeds each answer back, and
//! repeats until the round is empty; then it reads each entry's outcome. No sockets, no
//! clock, no runtime: the same rules whoever runs them.
//!
//! Members are named by their index in the pod's member list sorted by id (the order
//! [`Placement`] ranks over); `down[i]` marks a member that missed a deadline or refused a
//! connection lately: asked after the members that are up, never skipped.
//!
//! The rules, with R copies of each block (the namespace's replication):
//! - **Read** ([`ReadPlan`]): each key is asked of its read candidates
//!   ([`read_candidates`]`(R)` members in rank order, those up first), one at a time, until
//!   one holds it. A miss, a corrupt copy or a member that cannot be reached moves on to the
//!   next candidate; any other answer (a refusal) is the key's answer. A key found is
//!   written back to each of its first R members that answered a miss or a corrupt copy
//!   (read repair, marked as a copy: a member that holds a tombstone refuses it).
//! - **Write** ([`WritePlan::put`]): each block goes to its first R members that can be
//!   reached, in rank order (up first), all R at once; one that cannot be reached is
//!   replaced by the next. Stored once R members stored it; a refusal is its answer; fewer
//!   than R reachable is [`WriteOutcome::TooFew`].
//! - **Delete** ([`WritePlan::delete`]): to the first `read_candidates(R)` members that can
//!   be reached (every member a read would look at), recorded as a tombstone by the caller
//!   once they answered; held if any of them held it.
//! - **Match** ([`MatchPlan`]): how many leading keys of a chain the pod holds, each member
//!   asked only about its own keys, all at once; the first key its first member lacks is
//!   asked of its other candidates before the chain is cut there.
//! - **Fan-out** ([`fan_out`]): pin, unpin, presence: each key to every read candidate that
//!   is up (all of them when none is), each member asked about all its keys at once; a key
//!   counts if any member says yes.
//! - **Listing** ([`fold_pages`]): every member's page of the same listing, merged in key
//!   order; a member that cannot be reached fails the listing (a page without its keys would
//!   look complete), one that does not know the namespace holds none of its keys.
//!
//! An answer the plan did not ask for is ignored; an entry asked and not answered by the
//! next round counts as its member unreachable. So a plan always ends, after at most as many
//! rounds as a key has members, and never asks a member twice about the same entry.

use crate::placement::{block_hash, read_candidates, Placement};
use std::collections::{BTreeMap, BTreeSet};

/// A member, by its index in the id-sorted member list ([`Placement::members`]).
pub type MemberIx = usize;

/// One round of a plan: each member asked, with the entries (indices into the plan's keys,
/// ascending) it is asked about.
pub type Round = BTreeMap<MemberIx, Vec<usize>>;

/// Members in the order to ask them about a block: its ranking cut to `take`, those up
/// first, each with its rank.
fn ask_order(
    placement: &Placement,
    down: &[bool],
    ns: &str,
    key: &[u8],
    take: usize,
) -> Vec<(MemberIx, usize)> {
    let ranked = placement.rank_hash(block_hash(ns, key));
    let is_down = |m: &MemberIx| down.get(*m).copied().unwrap_or(false);
    let (mut up, later): (Vec<_>, Vec<_>) = ranked
        .into_iter()
        .take(take)
        .enumerate()
        .map(|(rank, m)| (m, rank))
        .partition(|(m, _)| !is_down(m));
    up.extend(later);
    up
}

/// What every plan of entries does: rounds out, answers in.
pub trait Plan {
    /// One member's answer about one entry.
    type Answer: Copy;

    /// The next round (empty when every entry has its outcome). An entry asked in the
    /// previous round and not answered since counts as its member unreachable.
    fn round(&mut self) -> Round;

    /// Member `member`'s answer about entry `entry`. Ignored unless the plan asked it.
    fn answer(&mut self, member: MemberIx, entry: usize, a: Self::Answer);

    /// [`Self::round`], `None` once it is empty: `while let Some(r) = plan.next_round()`.
    fn next_round(&mut self) -> Option<Round> {
        let r = self.round();
        (!r.is_empty()).then_some(r)
    }

    /// The same answer for every entry of `entries` (a whole request that failed, or a
    /// member that does not know the namespace: a miss).
    fn answer_all(&mut self, member: MemberIx, entries: &[usize], a: Self::Answer) {
        for &i in entries {
            self.answer(member, i, a);
        }
    }
}

/// One member's answer about one entry of a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadAnswer {
    /// It holds a good copy: the caller keeps the bytes, the plan records who.
    Hit,
    /// It holds none.
    Miss,
    /// Its copy failed its check (CRC32C, AES-GCM tag): like a miss, and repaired.
    Corrupt,
    /// It could not be reached, or missed its deadline.
    Unreachable,
    /// Anything else (a refusal: 403, 413, 503): the entry's answer, as the caller keeps it.
    Final,
}

/// How a read of one entry ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadOutcome {
    /// Found on `member`; `repair`: the members among its first R that answered a miss or a
    /// corrupt copy, to be given a copy (best rank first).
    Hit {
        member: MemberIx,
        repair: Vec<MemberIx>,
    },
    /// `member` answered something else than a hit or a miss: that is the answer.
    Final { member: MemberIx },
    /// No candidate held it (or none could be reached).
    Miss,
}

#[derive(Debug, Clone)]
struct ReadKey {
    order: Vec<(MemberIx, usize)>,
    next: usize,
    asked: Option<MemberIx>,
    lacking: Vec<(usize, MemberIx)>,
    done: Option<ReadOutcome>,
}

/// A read (GET, HEAD, `batch/get`, `exists`) of keys across the pod.
#[derive(Debug, Clone)]
pub struct ReadPlan {
    copies: usize,
    keys: Vec<ReadKey>,
    unreachable: BTreeSet<MemberIx>,
}

impl ReadPlan {
    /// A read of `keys` of namespace `ns` (as placed: the name the pod places it under),
    /// whose blocks have `copies` copies.
    pub fn new<K: AsRef<[u8]>>(
        placement: &Placement,
        down: &[bool],
        ns: &str,
        keys: impl IntoIterator<Item = K>,
        copies: usize,
    ) -> ReadPlan {
        let copies = copies.max(1);
        let take = read_candidates(copies);
        ReadPlan {
            copies,
            keys: keys
                .into_iter()
                .map(|k| ReadKey {
                    order: ask_order(placement, down, ns, k.as_ref(), take),
                    next: 0,
                    asked: None,
                    lacking: Vec::new(),
                    done: None,
                })
                .collect(),
            unreachable: BTreeSet::new(),
        }
    }

    /// Asks `member` first about each key it is a candidate for, whatever its rank (the
    /// member answering the request: a look at its own copy costs no hop). A member counted
    /// down is never moved.
    pub fn ask_first(mut self, member: MemberIx, down: &[bool]) -> ReadPlan {
        if down.get(member).copied().unwrap_or(false) {
            return self;
        }
        for k in &mut self.keys {
            if let Some(at) = k.order.iter().position(|&(m, _)| m == member) {
                let mine = k.order.remove(at);
                k.order.insert(0, mine);
            }
        }
        self
    }

    /// Members that could not be reached (the caller counts them down and reads the view
    /// again).
    pub fn unreachable(&self) -> impl Iterator<Item = MemberIx> + '_ {
        self.unreachable.iter().copied()
    }

    /// Each entry's outcome, in the order of the keys (entries still open are misses).
    pub fn finish(self) -> Vec<ReadOutcome> {
        self.keys
            .into_iter()
            .map(|k| k.done.unwrap_or(ReadOutcome::Miss))
            .collect()
    }
}

impl Plan for ReadPlan {
    type Answer = ReadAnswer;

    /// The next round: each open entry to its next candidate. Empty when every entry has
    /// its outcome.
    fn round(&mut self) -> Round {
        let mut round = Round::new();
        for i in 0..self.keys.len() {
            if let Some(m) = self.keys[i].asked {
                // Asked and not answered: as if its member could not be reached.
                self.answer(m, i, ReadAnswer::Unreachable);
            }
            let k = &mut self.keys[i];
            if k.done.is_some() {
                continue;
            }
            match k.order.get(k.next) {
                Some(&(m, _)) => {
                    k.next += 1;
                    k.asked = Some(m);
                    round.entry(m).or_default().push(i);
                }
                None => k.done = Some(ReadOutcome::Miss),
            }
        }
        round
    }

    /// Member `member`'s answer about entry `entry`. Ignored unless the plan asked it.
    fn answer(&mut self, member: MemberIx, entry: usize, a: ReadAnswer) {
        let Some(k) = self.keys.get_mut(entry) else {
            return;
        };
        if k.asked != Some(member) || k.done.is_some() {
            return;
        }
        k.asked = None;
        let rank = k.order[k.next - 1].1;
        match a {
            ReadAnswer::Hit => {
                k.lacking.sort_unstable();
                let repair = k
                    .lacking
                    .iter()
                    .filter(|(r, _)| *r < self.copies)
                    .map(|&(_, m)| m)
                    .collect();
                k.done = Some(ReadOutcome::Hit { member, repair });
            }
            ReadAnswer::Miss | ReadAnswer::Corrupt => k.lacking.push((rank, member)),
            ReadAnswer::Unreachable => {
                self.unreachable.insert(member);
            }
            ReadAnswer::Final => k.done = Some(ReadOutcome::Final { member }),
        }
    }
}

/// One member's answer about one entry of a write (or delete).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteAnswer {
    /// Done there; `changed`: a put stored a new block (201, not 200), a delete removed one.
    Applied { changed: bool },
    /// Refused (the caller keeps the status): the entry's answer.
    Refused,
    /// It could not be reached, or missed its deadline: the next member is asked instead.
    Unreachable,
}

/// How a write (or delete) of one entry ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteOutcome {
    /// Applied on the members wanted, best rank first, each with whether it changed there.
    Applied { members: Vec<(MemberIx, bool)> },
    /// `member` refused it: that is the answer.
    Refused { member: MemberIx },
    /// Too few members could be reached: applied only on these.
    TooFew { members: Vec<(MemberIx, bool)> },
}

impl WriteOutcome {
    /// A put's status: 201 when its best-ranked copy is new, 200 when it was there, `None`
    /// when refused (the member's answer is the status) or too few members stored it.
    pub fn put_status(&self) -> Option<u16> {
        match self {
            WriteOutcome::Applied { members } => Some(if members.first().is_some_and(|m| m.1) {
                201
            } else {
                200
            }),
            _ => None,
        }
    }

    /// For a delete: whether any member held the block.
    pub fn held(&self) -> bool {
        match self {
            WriteOutcome::Applied { members } | WriteOutcome::TooFew { members } => {
                members.iter().any(|m| m.1)
            }
            WriteOutcome::Refused { .. } => false,
        }
    }
}

#[derive(Debug, Clone)]
struct WriteKey {
    order: Vec<(MemberIx, usize)>,
    next: usize,
    asked: Vec<MemberIx>,
    /// (rank, member, changed)
    applied: Vec<(usize, MemberIx, bool)>,
    done: Option<WriteOutcome>,
}

/// A write (PUT, `batch/put`) or delete of keys across the pod.
#[derive(Debug, Clone)]
pub struct WritePlan {
    copies: usize,
    delete: bool,
    keys: Vec<WriteKey>,
    unreachable: BTreeSet<MemberIx>,
}

impl WritePlan {
    /// A put of `keys` with `copies` copies each.
    pub fn put<K: AsRef<[u8]>>(
        placement: &Placement,
        down: &[bool],
        ns: &str,
        keys: impl IntoIterator<Item = K>,
        copies: usize,
    ) -> WritePlan {
        Self::new(placement, down, ns, keys, copies.max(1), false)
    }

    /// A delete of `keys`, whose blocks have `copies` copies: every member a read would
    /// look at.
    pub fn delete<K: AsRef<[u8]>>(
        placement: &Placement,
        down: &[bool],
        ns: &str,
        keys: impl IntoIterator<Item = K>,
        copies: usize,
    ) -> WritePlan {
        let wanted = read_candidates(copies.max(1)).min(placement.len().max(1));
        Self::new(placement, down, ns, keys, wanted, true)
    }

    fn new<K: AsRef<[u8]>>(
        placement: &Placement,
        down: &[bool],
        ns: &str,
        keys: impl IntoIterator<Item = K>,
        copies: usize,
        delete: bool,
    ) -> WritePlan {
        WritePlan {
            copies,
            delete,
            keys: keys
                .into_iter()
                .map(|k| WriteKey {
                    order: ask_order(placement, down, ns, k.as_ref(), usize::MAX),
                    next: 0,
                    asked: Vec::new(),
                    applied: Vec::new(),
                    done: None,
                })
                .collect(),
            unreachable: BTreeSet::new(),
        }
    }

    /// Copies each entry goes to (R for a put; the read candidates for a delete).
    pub fn copies(&self) -> usize {
        self.copies
    }

    /// Whether this plan is a delete.
    pub fn is_delete(&self) -> bool {
        self.delete
    }

    /// Members that could not be reached.
    pub fn unreachable(&self) -> impl Iterator<Item = MemberIx> + '_ {
        self.unreachable.iter().copied()
    }

    /// Each entry's outcome, in the order of the keys. Call after [`Self::round`] came
    /// back empty (entries still open count as too few).
    pub fn finish(self) -> Vec<WriteOutcome> {
        self.keys
            .into_iter()
            .map(|mut k| {
                k.done.unwrap_or_else(|| {
                    k.applied.sort_unstable();
                    WriteOutcome::TooFew {
                        members: k.applied.iter().map(|&(_, m, c)| (m, c)).collect(),
                    }
                })
            })
            .collect()
    }
}

impl Plan for WritePlan {
    type Answer = WriteAnswer;

    /// The next round: each open entry to as many further members as it lacks copies.
    fn round(&mut self) -> Round {
        let mut round = Round::new();
        for i in 0..self.keys.len() {
            for m in std::mem::take(&mut self.keys[i].asked) {
                self.keys[i].asked.push(m);
                self.answer(m, i, WriteAnswer::Unreachable);
            }
            let k = &mut self.keys[i];
            if k.done.is_some() {
                continue;
            }
            let want = self.copies.saturating_sub(k.applied.len());
            for _ in 0..want {
                let Some(&(m, _)) = k.order.get(k.next) else {
                    break;
                };
                k.next += 1;
                k.asked.push(m);
                round.entry(m).or_default().push(i);
            }
            if k.asked.is_empty() {
                k.applied.sort_unstable();
                let members = k.applied.iter().map(|&(_, m, c)| (m, c)).collect();
                k.done = Some(if k.applied.len() >= self.copies {
                    WriteOutcome::Applied { members }
                } else {
                    WriteOutcome::TooFew { members }
                });
            }
        }
        round
    }

    /// Member `member`'s answer about entry `entry`. Ignored unless the plan asked it.
    fn answer(&mut self, member: MemberIx, entry: usize, a: WriteAnswer) {
        let Some(k) = self.keys.get_mut(entry) else {
            return;
        };
        let Some(at) = k.asked.iter().position(|&m| m == member) else {
            return;
        };
        if k.done.is_some() {
            return;
        }
        k.asked.swap_remove(at);
        let rank = k
            .order
            .iter()
            .find(|(m, _)| *m == member)
            .map_or(usize::MAX, |&(_, r)| r);
        match a {
            WriteAnswer::Applied { changed } => k.applied.push((rank, member, changed)),
            WriteAnswer::Refused => {
                k.asked.clear();
                k.done = Some(WriteOutcome::Refused { member });
            }
            WriteAnswer::Unreachable => {
                self.unreachable.insert(member);
            }
        }
    }
}

/// Fan-out (pin, unpin, presence): each member with the entries it is a read candidate of
/// (those up; all of them for a key whose candidates are all down). Fold the answers with
/// [`any_yes`].
pub fn fan_out<K: AsRef<[u8]>>(
    placement: &Placement,
    down: &[bool],
    ns: &str,
    keys: impl IntoIterator<Item = K>,
    copies: usize,
) -> Round {
    let take = read_candidates(copies.max(1));
    let mut round = Round::new();
    for (i, k) in keys.into_iter().enumerate() {
        let order = ask_order(placement, down, ns, k.as_ref(), take);
        let up: Vec<MemberIx> = order
            .iter()
            .filter(|(m, _)| !down.get(*m).copied().unwrap_or(false))
            .map(|&(m, _)| m)
            .collect();
        let ask = if up.is_empty() {
            order.iter().map(|&(m, _)| m).collect()
        } else {
            up
        };
        for m in ask {
            round.entry(m).or_default().push(i);
        }
    }
    round
}

/// Folds a fan-out's answers: per entry, whether any member said yes. `answers`: each
/// member's entries and its answer per entry (`None`: it could not answer, and holds no
/// copy that the call changed).
pub fn any_yes(
    n: usize,
    answers: impl IntoIterator<Item = (Vec<usize>, Option<Vec<bool>>)>,
) -> Vec<bool> {
    let mut any = vec![false; n];
    for (entries, got) in answers {
        for (i, yes) in entries.into_iter().zip(got.unwrap_or_default()) {
            if let Some(a) = any.get_mut(i) {
                *a |= yes;
            }
        }
    }
    any
}

/// One member's page of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PageAnswer<T> {
    /// Its keys (in order) and whether it has more after them.
    Page(Vec<(Vec<u8>, T)>, bool),
    /// It does not know the namespace (yet): it holds none of its keys.
    UnknownNamespace,
    /// It could not be reached, or its answer broke the contract.
    Unreachable,
}

/// Why a listing across the pod has no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListFailure {
    /// A member (this one) could not give its page: the listing would look complete
    /// without its keys.
    Unreachable(MemberIx),
    /// No member knows the namespace.
    UnknownNamespace,
}

/// Merges the members' pages of one listing (each member's answer, by member): the first
/// `limit` keys of the pod in key order, each once, and whether the listing goes on.
#[allow(clippy::type_complexity)]
pub fn fold_pages<T>(
    answers: impl IntoIterator<Item = (MemberIx, PageAnswer<T>)>,
    limit: usize,
) -> Result<(Vec<(Vec<u8>, T)>, bool), ListFailure> {
    let mut pages = Vec::new();
    let mut unknown = false;
    let mut failed = None;
    for (m, a) in answers {
        match a {
            PageAnswer::Page(keys, more) => pages.push((keys, more)),
            PageAnswer::UnknownNamespace => unknown = true,
            PageAnswer::Unreachable => {
                failed.get_or_insert(m);
            }
        }
    }
    if let Some(m) = failed {
        return Err(ListFailure::Unreachable(m));
    }
    if pages.is_empty() && unknown {
        return Err(ListFailure::UnknownNamespace);
    }
    Ok(crate::key::merge_pages(pages, limit))
}

#[derive(Debug, Clone)]
enum MatchPhase {
    /// Asking members about their keys from their cursors: who was asked, from where.
    Primary(BTreeMap<MemberIx, usize>),
    /// Asking a gap's other candidates about it: who was asked, and whether one holds it.
    Gap {
        gap: usize,
        asked: BTreeSet<MemberIx>,
        held: bool,
        issued: bool,
    },
    Done(u64),
}

/// MATCH across the pod: how many leading keys of a chain some member holds.
///
/// Each key's first candidate (in ask order: up first) is asked about it, every member
/// about its own keys in chain order from where it stopped, all at once. The first key its
/// first member lacks (or that could not be asked) is then asked of its other candidates:
/// if none holds it the chain ends there, else its member goes on past it.
#[derive(Debug, Clone)]
pub struct MatchPlan {
    cands: Vec<Vec<MemberIx>>,
    /// Keys by first candidate, in chain order.
    groups: BTreeMap<MemberIx, Vec<usize>>,
    /// Per member: how many of its keys it has confirmed (or passed over).
    cursor: BTreeMap<MemberIx, usize>,
    /// Members whose cursor moved since they were last asked.
    stale: BTreeSet<MemberIx>,
    phase: MatchPhase,
}

impl MatchPlan {
    pub fn new<K: AsRef<[u8]>>(
        placement: &Placement,
        down: &[bool],
        ns: &str,
        chain: impl IntoIterator<Item = K>,
        copies: usize,
    ) -> MatchPlan {
        let take = read_candidates(copies.max(1));
        let cands: Vec<Vec<MemberIx>> = chain
            .into_iter()
            .map(|k| {
                ask_order(placement, down, ns, k.as_ref(), take)
                    .into_iter()
                    .map(|(m, _)| m)
                    .collect()
            })
            .collect();
        let mut groups: BTreeMap<MemberIx, Vec<usize>> = BTreeMap::new();
        // A key no member could hold ends the chain there.
        let end = cands
            .iter()
            .position(|c| c.is_empty())
            .unwrap_or(cands.len());
        for (i, c) in cands.iter().enumerate().take(end) {
            groups.entry(c[0]).or_default().push(i);
        }
        let cursor = groups.keys().map(|&m| (m, 0)).collect();
        let stale = groups.keys().copied().collect();
        let phase = if end == 0 {
            MatchPhase::Done(0)
        } else {
            MatchPhase::Primary(BTreeMap::new())
        };
        let mut cands = cands;
        cands.truncate(end);
        MatchPlan {
            cands,
            groups,
            cursor,
            stale,
            phase,
        }
    }

    /// The next round: each member asked and the chain positions (ascending) it is asked
    /// about; it answers how many of them, from the first, it holds. Empty once the answer
    /// is known.
    pub fn round(&mut self) -> Round {
        loop {
            match &mut self.phase {
                MatchPhase::Done(_) => return Round::new(),
                MatchPhase::Primary(asked) if !asked.is_empty() => {
                    // Members that did not answer hold nothing from their cursor.
                    asked.clear();
                    self.next_gap();
                }
                MatchPhase::Primary(asked) => {
                    let mut round = Round::new();
                    for m in std::mem::take(&mut self.stale) {
                        let from = self.cursor[&m];
                        let keys = &self.groups[&m];
                        if from < keys.len() {
                            asked.insert(m, from);
                            round.insert(m, keys[from..].to_vec());
                        }
                    }
                    if !round.is_empty() {
                        return round;
                    }
                    self.next_gap();
                }
                MatchPhase::Gap {
                    gap,
                    asked,
                    held,
                    issued,
                } => {
                    if *issued {
                        // The gap's candidates answered (those that did not hold nothing).
                        let (gap, held) = (*gap, *held);
                        self.close_gap(gap, held);
                        continue;
                    }
                    *issued = true;
                    let others: Vec<MemberIx> = self.cands[*gap].iter().skip(1).copied().collect();
                    if others.is_empty() {
                        let gap = *gap;
                        self.close_gap(gap, false);
                        continue;
                    }
                    let mut round = Round::new();
                    for m in others {
                        asked.insert(m);
                        round.insert(m, vec![*gap]);
                    }
                    return round;
                }
            }
        }
    }

    /// [`Self::round`], `None` once it is empty.
    pub fn next_round(&mut self) -> Option<Round> {
        let r = self.round();
        (!r.is_empty()).then_some(r)
    }

    /// Member `member` holds the first `held` of the positions it was asked about (0 when
    /// it could not be reached). Ignored unless the plan asked it.
    pub fn answer(&mut self, member: MemberIx, held: usize) {
        match &mut self.phase {
            MatchPhase::Primary(asked) => {
                if let Some(from) = asked.remove(&member) {
                    let keys = &self.groups[&member];
                    let c = self.cursor.get_mut(&member).expect("a member with keys");
                    *c = (from + held).min(keys.len());
                }
                if asked.is_empty() {
                    self.next_gap();
                }
            }
            MatchPhase::Gap { asked, held: h, .. } => {
                if asked.remove(&member) && held >= 1 {
                    *h = true;
                }
            }
            MatchPhase::Done(_) => {}
        }
    }

    /// After a primary round: the lowest key some first member lacks, or the whole chain.
    fn next_gap(&mut self) {
        let gap = self
            .groups
            .iter()
            .filter_map(|(m, keys)| keys.get(self.cursor[m]).copied())
            .min();
        self.phase = match gap {
            None => MatchPhase::Done(self.cands.len() as u64),
            Some(gap) => MatchPhase::Gap {
                gap,
                asked: BTreeSet::new(),
                held: false,
                issued: false,
            },
        };
    }

    fn close_gap(&mut self, gap: usize, held: bool) {
        if !held {
            self.phase = MatchPhase::Done(gap as u64);
            return;
        }
        // Go on past it: its first member moves on from it, and is asked again.
        let first = self.cands[gap][0];
        *self.cursor.get_mut(&first).expect("its first member") += 1;
        self.stale.insert(first);
        self.phase = MatchPhase::Primary(BTreeMap::new());
    }

    /// The answer, once [`Self::round`] came back empty.
    pub fn matched(&self) -> Option<u64> {
        match self.phase {
            MatchPhase::Done(n) => Some(n),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests;
