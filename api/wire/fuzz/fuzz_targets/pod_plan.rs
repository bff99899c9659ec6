//! Fuzz target: the pod planner (`ctxpod_wire::pod_plan`) driven by arbitrary answers. The
//! bytes choose the pod (1 to 12 members, their capacities, which are marked down), R, the
//! keys, and then every member's answer about every entry it is asked (any answer, none, a
//! stray answer about an entry it was not asked, or twice). Properties: no panic; every
//! plan ends within its bound of rounds; no member is asked twice about an entry; a read's
//! hit and repairs name members that were asked, repairs among the key's first R; a write
//! applied on at most its copies, on members that were asked; a match no longer than its
//! chain.

#![no_main]

use ctxpod_wire::placement::{read_candidates, Member, Placement};
use ctxpod_wire::pod_plan::*;
use libfuzzer_sys::fuzz_target;
use std::collections::BTreeSet;

struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn next(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut b = Bytes(data);
    let n = 1 + (b.next() % 12) as usize;
    let placement = Placement::new((0..n).map(|i| {
        let w = b.next() as u64;
        Member::new(format!("m{i}"), w, w == 0)
    }));
    let down: Vec<bool> = (0..n).map(|_| b.next() % 4 == 0).collect();
    let r = 1 + (b.next() % 5) as usize;
    let keys: Vec<[u8; 2]> = (0..1 + b.next() % 16).map(|_| [b.next(), b.next()]).collect();

    // A read.
    let mut plan = ReadPlan::new(&placement, &down, "ns", &keys, r);
    let mut asked = BTreeSet::new();
    for round in 0.. {
        let got = plan.round();
        if got.is_empty() {
            break;
        }
        assert!(round <= read_candidates(r), "a read that does not end");
        for (m, entries) in got {
            for k in entries {
                assert!(asked.insert((k, m)), "asked twice");
                let a = match b.next() % 7 {
                    0 => ReadAnswer::Hit,
                    1 => ReadAnswer::Miss,
                    2 => ReadAnswer::Corrupt,
                    3 => ReadAnswer::Unreachable,
                    4 => ReadAnswer::Final,
                    5 => continue,
                    _ => {
                        plan.answer((m + 1) % n, k, ReadAnswer::Hit);
                        ReadAnswer::Miss
                    }
                };
                plan.answer(m, k, a);
            }
        }
    }
    for (k, o) in plan.finish().into_iter().enumerate() {
        if let ReadOutcome::Hit { member, repair } = o {
            assert!(asked.contains(&(k, member)));
            let first: Vec<usize> = placement.rank("ns", &keys[k]).into_iter().take(r).collect();
            for m in repair {
                assert!(asked.contains(&(k, m)) && first.contains(&m) && m != member);
            }
        }
    }

    // A write, then a delete.
    for delete in [false, true] {
        let mut plan = if delete {
            WritePlan::delete(&placement, &down, "ns", &keys, r)
        } else {
            WritePlan::put(&placement, &down, "ns", &keys, r)
        };
        let copies = plan.copies();
        let mut asked = BTreeSet::new();
        for round in 0.. {
            let got = plan.round();
            if got.is_empty() {
                break;
            }
            assert!(round <= n, "a write that does not end");
            for (m, entries) in got {
                for k in entries {
                    assert!(asked.insert((k, m)), "asked twice");
                    let a = match b.next() % 5 {
                        0 => WriteAnswer::Applied { changed: true },
                        1 => WriteAnswer::Applied { changed: false },
                        2 => WriteAnswer::Refused,
                        3 => WriteAnswer::Unreachable,
                        _ => continue,
                    };
                    plan.answer(m, k, a);
                }
            }
        }
        for (k, o) in plan.finish().into_iter().enumerate() {
            match o {
                WriteOutcome::Applied { members } | WriteOutcome::TooFew { members } => {
                    assert!(members.len() <= copies);
                    assert!(members.iter().all(|(m, _)| asked.contains(&(k, *m))));
                }
                WriteOutcome::Refused { member } => assert!(asked.contains(&(k, member))),
            }
        }
    }

    // A match of the keys as a chain.
    let mut plan = MatchPlan::new(&placement, &down, "ns", &keys, r);
    for round in 0.. {
        let got = plan.round();
        if got.is_empty() {
            break;
        }
        assert!(round <= 2 * keys.len() + 2, "a match that does not end");
        for (m, positions) in got {
            let held = (b.next() as usize) % (positions.len() + 2);
            plan.answer(m, held);
        }
    }
    assert!(plan.matched().expect("an answer") <= keys.len() as u64);
});
