//! The planner against a model of the pod: exhaustive over small pods (every member
//! up/down pattern of 3 to 5 members, members marked down or not, every R), property-based
//! over larger ones (6 to 16 members, uneven capacities, answers lost).
//!
//! A simulated pod holds, per key and member, a good copy, a corrupt one or none; some
//! members are dead (every request to them fails), some are marked down (asked last), and
//! a key may be refused by one member. The plan is driven as the callers drive it (round
//! after round, every member of a round answering for its entries) and its outcomes must be
//! the model's, read straight off the rules in the module's documentation.

use super::*;
use crate::placement::Member;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Copy {
    None,
    Good,
    Corrupt,
}

#[derive(Debug, Clone)]
struct Sim {
    placement: Placement,
    dead: Vec<bool>,
    marked: Vec<bool>,
    keys: Vec<Vec<u8>>,
    /// [key][member]
    holds: Vec<Vec<Copy>>,
    /// A member that refuses the key (a read answers Final there, a write Refused).
    refuses: Vec<Option<MemberIx>>,
    /// Answers the driver drops (the member asked, never answering): (key, member).
    lost: BTreeSet<(usize, MemberIx)>,
}

const NS: &str = "ns";

fn placement(weights: &[u64]) -> Placement {
    Placement::new(
        weights
            .iter()
            .enumerate()
            .map(|(i, &w)| Member::new(format!("m{i:02}"), w, false)),
    )
}

impl Sim {
    fn random(rng: &mut impl Rng, weights: &[u64], dead: Vec<bool>, marked: Vec<bool>) -> Sim {
        let n = weights.len();
        let keys: Vec<Vec<u8>> = (0..rng.gen_range(1..24))
            .map(|_| rng.gen::<u64>().to_be_bytes().to_vec())
            .collect();
        let holds = keys
            .iter()
            .map(|_| {
                (0..n)
                    .map(|_| match rng.gen_range(0..10) {
                        0..=3 => Copy::Good,
                        4 => Copy::Corrupt,
                        _ => Copy::None,
                    })
                    .collect()
            })
            .collect();
        let refuses = keys
            .iter()
            .map(|_| rng.gen_bool(0.1).then(|| rng.gen_range(0..n)))
            .collect();
        Sim {
            placement: placement(weights),
            dead,
            marked,
            keys,
            holds,
            refuses,
            lost: BTreeSet::new(),
        }
    }

    fn n(&self) -> usize {
        self.placement.len()
    }

    /// The members to ask about key `k`, in order: its ranking cut to `take`, marked last.
    fn order(&self, k: usize, take: usize) -> Vec<(MemberIx, usize)> {
        let ranked: Vec<MemberIx> = self.placement.rank(NS, &self.keys[k]);
        let mut v: Vec<(MemberIx, usize)> = ranked
            .into_iter()
            .take(take)
            .enumerate()
            .map(|(r, m)| (m, r))
            .collect();
        v.sort_by_key(|&(m, r)| (self.marked[m], r));
        v
    }

    fn answers(&self, k: usize, m: MemberIx) -> bool {
        !self.dead[m] && !self.lost.contains(&(k, m))
    }

    /// The rules, read off directly: a read of key `k`.
    fn model_read(&self, k: usize, r: usize) -> ReadOutcome {
        let mut lacking = Vec::new();
        for (m, rank) in self.order(k, read_candidates(r)) {
            if !self.answers(k, m) {
                continue;
            }
            if self.refuses[k] == Some(m) {
                return ReadOutcome::Final { member: m };
            }
            match self.holds[k][m] {
                Copy::Good => {
                    lacking.sort_unstable();
                    return ReadOutcome::Hit {
                        member: m,
                        repair: lacking
                            .into_iter()
                            .filter(|&(rank, _)| rank < r)
                            .map(|(_, m)| m)
                            .collect(),
                    };
                }
                _ => lacking.push((rank, m)),
            }
        }
        ReadOutcome::Miss
    }

    /// A write (or delete) of key `k` to `copies` members: the first that answer, in ask
    /// order, unless one of those refuses first.
    fn model_write(&self, k: usize, copies: usize, delete: bool) -> WriteOutcome {
        let mut applied = Vec::new();
        for (m, rank) in self.order(k, usize::MAX) {
            if applied.len() == copies {
                break;
            }
            if !self.answers(k, m) {
                continue;
            }
            if self.refuses[k] == Some(m) {
                return WriteOutcome::Refused { member: m };
            }
            let changed = if delete {
                self.holds[k][m] != Copy::None
            } else {
                self.holds[k][m] == Copy::None
            };
            applied.push((rank, m, changed));
        }
        applied.sort_unstable();
        let members: Vec<(MemberIx, bool)> = applied.iter().map(|&(_, m, c)| (m, c)).collect();
        if members.len() >= copies {
            WriteOutcome::Applied { members }
        } else {
            WriteOutcome::TooFew { members }
        }
    }

    /// A MATCH of the whole key list as a chain: the leading run of keys some candidate
    /// that answers holds a good copy of.
    fn model_match(&self, r: usize) -> u64 {
        (0..self.keys.len())
            .take_while(|&k| {
                self.order(k, read_candidates(r))
                    .into_iter()
                    .any(|(m, _)| !self.dead[m] && self.holds[k][m] == Copy::Good)
            })
            .count() as u64
    }

    fn read_answer(&self, k: usize, m: MemberIx) -> ReadAnswer {
        if self.dead[m] {
            return ReadAnswer::Unreachable;
        }
        if self.refuses[k] == Some(m) {
            return ReadAnswer::Final;
        }
        match self.holds[k][m] {
            Copy::Good => ReadAnswer::Hit,
            Copy::Corrupt => ReadAnswer::Corrupt,
            Copy::None => ReadAnswer::Miss,
        }
    }
}

/// Runs a read plan against the simulated pod: its outcomes, and every (member, key) it
/// asked, checking as it goes that no member is asked twice about a key and that only a
/// key's candidates are asked.
fn drive_read(s: &Sim, r: usize) -> Vec<ReadOutcome> {
    let mut plan = ReadPlan::new(&s.placement, &s.marked, NS, &s.keys, r);
    let mut asked: BTreeSet<(usize, MemberIx)> = BTreeSet::new();
    let mut rounds = 0;
    while let Some(round) = plan.next_round() {
        rounds += 1;
        assert!(rounds <= read_candidates(r) + 1, "a read that does not end");
        for (m, entries) in round {
            assert!(entries.windows(2).all(|w| w[0] < w[1]), "entries ascending");
            for k in entries {
                assert!(asked.insert((k, m)), "member {m} asked twice about key {k}");
                let cands: Vec<MemberIx> =
                    s.order(k, read_candidates(r)).iter().map(|x| x.0).collect();
                assert!(cands.contains(&m), "member {m} is no candidate of key {k}");
                if s.lost.contains(&(k, m)) {
                    continue;
                }
                plan.answer(m, k, s.read_answer(k, m));
                // A second answer, or one about a key not asked, changes nothing.
                plan.answer(m, k, ReadAnswer::Final);
                plan.answer((m + 1) % s.n(), k, ReadAnswer::Final);
            }
        }
    }
    let dead: BTreeSet<MemberIx> = asked
        .iter()
        .filter(|(_, m)| s.dead[*m])
        .map(|x| x.1)
        .collect();
    let said: BTreeSet<MemberIx> = plan.unreachable().filter(|m| s.dead[*m]).collect();
    assert_eq!(
        said, dead,
        "every dead member asked is reported unreachable"
    );
    plan.finish()
}

fn drive_write(s: &Sim, r: usize, delete: bool) -> (Vec<WriteOutcome>, usize) {
    let mut plan = if delete {
        WritePlan::delete(&s.placement, &s.marked, NS, &s.keys, r)
    } else {
        WritePlan::put(&s.placement, &s.marked, NS, &s.keys, r)
    };
    let copies = plan.copies();
    let mut asked: BTreeSet<(usize, MemberIx)> = BTreeSet::new();
    let mut rounds = 0;
    while let Some(round) = plan.next_round() {
        rounds += 1;
        assert!(rounds <= s.n() + 1, "a write that does not end");
        if rounds == 1 {
            // All the copies at once, not one after the other.
            let mut per_key = vec![0usize; s.keys.len()];
            round.values().flatten().for_each(|&k| per_key[k] += 1);
            assert!(
                per_key.iter().all(|&c| c == copies.min(s.n())),
                "{per_key:?}"
            );
        }
        for (m, entries) in round {
            for k in entries {
                assert!(asked.insert((k, m)), "member {m} asked twice about key {k}");
                if s.lost.contains(&(k, m)) {
                    continue;
                }
                let a = if s.dead[m] {
                    WriteAnswer::Unreachable
                } else if s.refuses[k] == Some(m) {
                    WriteAnswer::Refused
                } else if delete {
                    WriteAnswer::Applied {
                        changed: s.holds[k][m] != Copy::None,
                    }
                } else {
                    WriteAnswer::Applied {
                        changed: s.holds[k][m] == Copy::None,
                    }
                };
                plan.answer(m, k, a);
            }
        }
    }
    (plan.finish(), copies)
}

fn drive_match(s: &Sim, r: usize) -> u64 {
    let mut plan = MatchPlan::new(&s.placement, &s.marked, NS, &s.keys, r);
    let mut rounds = 0;
    while let Some(round) = plan.next_round() {
        rounds += 1;
        assert!(rounds <= 2 * s.keys.len() + 2, "a match that does not end");
        for (m, positions) in round {
            let held = if s.dead[m] {
                0
            } else {
                positions
                    .iter()
                    .take_while(|&&k| s.holds[k][m] == Copy::Good)
                    .count()
            };
            plan.answer(m, held);
        }
    }
    plan.matched().expect("an answer once the rounds end")
}

/// Every plan equals the model on `s`, for every R from 1 to the pod's size.
fn check_all(s: &Sim) {
    for r in 1..=s.n().min(crate::REPLICATION_MAX as usize) {
        let got = drive_read(s, r);
        for (k, g) in got.iter().enumerate() {
            assert_eq!(*g, s.model_read(k, r), "read of key {k}, R={r}: {s:?}");
        }
        let (puts, copies) = drive_write(s, r, false);
        assert_eq!(copies, r);
        for (k, g) in puts.iter().enumerate() {
            assert_eq!(
                *g,
                s.model_write(k, r, false),
                "put of key {k}, R={r}: {s:?}"
            );
        }
        let (dels, copies) = drive_write(s, r, true);
        assert_eq!(copies, read_candidates(r).min(s.n()));
        for (k, g) in dels.iter().enumerate() {
            assert_eq!(
                *g,
                s.model_write(k, copies, true),
                "delete of key {k}, R={r}"
            );
        }
        if s.lost.is_empty() {
            assert_eq!(drive_match(s, r), s.model_match(r), "match, R={r}: {s:?}");
        }
    }
}

/// Every up/down pattern of pods of 3, 4 and 5 members, with members marked down as they
/// are dead, none marked, or the live ones marked (a stale mark), every R, 40 random
/// holdings each.
#[test]
fn every_member_pattern_of_small_pods_follows_the_rules() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(33);
    let mut plans = 0u64;
    for n in 3..=5usize {
        let weights = vec![1u64 << 30; n];
        for pattern in 0u32..(1 << n) {
            let dead: Vec<bool> = (0..n).map(|m| pattern & (1 << m) != 0).collect();
            let marks = [
                dead.clone(),
                vec![false; n],
                dead.iter().map(|d| !d).collect::<Vec<bool>>(),
            ];
            for marked in marks {
                for _ in 0..40 {
                    let s = Sim::random(&mut rng, &weights, dead.clone(), marked.clone());
                    check_all(&s);
                    plans += 1;
                }
            }
        }
    }
    assert_eq!(plans, 3 * 40 * (8 + 16 + 32));
}

#[test]
fn a_pod_with_no_members_reads_nothing_and_stores_nothing() {
    let p = Placement::new(Vec::<Member>::new());
    let mut read = ReadPlan::new(&p, &[], NS, [b"k"], 2);
    assert!(read.round().is_empty());
    assert_eq!(read.finish(), vec![ReadOutcome::Miss]);
    let mut put = WritePlan::put(&p, &[], NS, [b"k"], 2);
    assert!(put.round().is_empty());
    assert_eq!(put.finish(), vec![WriteOutcome::TooFew { members: vec![] }]);
    let mut m = MatchPlan::new(&p, &[], NS, [b"k"], 2);
    assert!(m.round().is_empty());
    assert_eq!(m.matched(), Some(0));
    assert!(fan_out(&p, &[], NS, [b"k"], 2).is_empty());
}

/// A put's status is its best-ranked copy's; a delete holds if any member held it.
#[test]
fn statuses_read_off_the_outcome() {
    let a = WriteOutcome::Applied {
        members: vec![(2, false), (0, true)],
    };
    assert_eq!(a.put_status(), Some(200));
    assert!(a.held());
    assert_eq!(WriteOutcome::Refused { member: 1 }.put_status(), None);
    assert_eq!(
        WriteOutcome::TooFew {
            members: vec![(1, true)]
        }
        .put_status(),
        None
    );
    assert!(WriteOutcome::TooFew {
        members: vec![(1, true)]
    }
    .held());
}

#[test]
fn a_fan_out_asks_the_up_candidates_and_any_yes_counts() {
    let p = placement(&[1, 1, 1, 1, 1]);
    let keys: Vec<[u8; 8]> = (0..64u64).map(|i| i.to_be_bytes()).collect();
    let down = [true, false, false, false, false];
    let round = fan_out(&p, &down, NS, &keys, 1);
    for (k, key) in keys.iter().enumerate() {
        let cands: Vec<MemberIx> = p.rank(NS, key).into_iter().take(3).collect();
        let asked: Vec<MemberIx> = round
            .iter()
            .filter(|(_, e)| e.contains(&k))
            .map(|(m, _)| *m)
            .collect();
        let mut want: Vec<MemberIx> = cands.into_iter().filter(|&m| m != 0).collect();
        want.sort_unstable();
        assert_eq!(asked, want, "key {k}");
    }
    // With every member down, every candidate is asked.
    let all = fan_out(&p, &[true; 5], NS, &keys[..1], 1);
    assert_eq!(all.values().map(|e| e.len()).sum::<usize>(), 3);
    assert_eq!(
        any_yes(
            3,
            [
                (vec![0, 2], Some(vec![false, true])),
                (vec![0], None),
                (vec![1, 0], Some(vec![false, true]))
            ]
        ),
        vec![true, false, true]
    );
}

#[test]
fn a_listing_needs_every_member_and_merges_in_order() {
    let page = |ks: &[&str], more| {
        PageAnswer::Page(
            ks.iter().map(|k| (k.as_bytes().to_vec(), ())).collect(),
            more,
        )
    };
    let keys = |v: Vec<(Vec<u8>, ())>| {
        v.into_iter()
            .map(|(k, _)| String::from_utf8(k).unwrap())
            .collect::<Vec<_>>()
    };
    let (got, more) = fold_pages(
        [
            (0, page(&["a", "c"], false)),
            (1, PageAnswer::UnknownNamespace),
            (2, page(&["b", "c"], true)),
        ],
        10,
    )
    .unwrap();
    assert_eq!(
        (keys(got), more),
        (vec!["a".to_string(), "b".into(), "c".into()], true)
    );
    assert_eq!(
        fold_pages(
            [(0, page(&["a"], false)), (1, PageAnswer::<()>::Unreachable)],
            10
        ),
        Err(ListFailure::Unreachable(1))
    );
    assert_eq!(
        fold_pages([(0, PageAnswer::<()>::UnknownNamespace)], 10),
        Err(ListFailure::UnknownNamespace)
    );
    assert_eq!(fold_pages::<()>([], 10), Ok((vec![], false)));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Larger pods with uneven capacities, members dead and marked at random, answers lost
    /// (a lost answer counts as its member unreachable for that key).
    #[test]
    fn larger_pods_follow_the_rules(
        weights in prop::collection::vec(1u64..1_000, 6..16),
        seed in any::<u64>(),
        lose in 0.0f64..0.3,
    ) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let n = weights.len();
        let dead: Vec<bool> = (0..n).map(|_| rng.gen_bool(0.3)).collect();
        let marked: Vec<bool> = dead.iter().map(|&d| if rng.gen_bool(0.8) { d } else { !d }).collect();
        let mut s = Sim::random(&mut rng, &weights, dead, marked);
        for k in 0..s.keys.len() {
            for m in 0..n {
                if rng.gen_bool(lose) {
                    s.lost.insert((k, m));
                }
            }
        }
        check_all(&s);
    }
}

/// The member answering a read asks itself first when it is a candidate (a look at its own
/// copy costs no hop), then the others in rank order; counted down, it keeps its place last.
#[test]
fn the_answering_member_is_asked_first_when_it_is_a_candidate() {
    let p = placement(&[1, 1, 1, 1, 1]);
    for i in 0..64u64 {
        let key = i.to_be_bytes();
        let ranked = p.rank_hash(block_hash(NS, &key));
        let up = vec![false; 5];
        // The third candidate of R = 2 (read candidates: 3) answers the request.
        let me = ranked[2];
        let mut plan = ReadPlan::new(&p, &up, NS, [&key[..]], 2).ask_first(me, &up);
        let mut asked = Vec::new();
        while let Some(round) = plan.next_round() {
            for m in round.into_keys() {
                asked.push(m);
                plan.answer(m, 0, ReadAnswer::Miss);
            }
        }
        assert_eq!(asked, vec![ranked[2], ranked[0], ranked[1]], "key {i}");
        // Not a candidate (fourth in rank): the order is the ranking's.
        let mut plan = ReadPlan::new(&p, &up, NS, [&key[..]], 2).ask_first(ranked[3], &up);
        let first = plan.next_round().and_then(|r| r.into_keys().next());
        assert_eq!(first, Some(ranked[0]));
        // Counted down: asked last, as any member counted down.
        let mut down = up.clone();
        down[me] = true;
        let mut plan = ReadPlan::new(&p, &down, NS, [&key[..]], 2).ask_first(me, &down);
        let mut asked = Vec::new();
        while let Some(round) = plan.next_round() {
            for m in round.into_keys() {
                asked.push(m);
                plan.answer(m, 0, ReadAnswer::Miss);
            }
        }
        assert_eq!(asked, vec![ranked[0], ranked[1], ranked[2]], "key {i}");
    }
}
