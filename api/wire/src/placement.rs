//! Placement: which nodes of a pod hold a block.
//!
//! Capacity-weighted rendezvous hashing (highest random weight) of `(namespace, key)` over
//! the pod's live members. Every member gets a score for a block; the block lives on the
//! `R` members with the highest scores (`R` is the namespace's replication factor), and
//! reads fall back along that ranking. The client computes it (no proxy hop), and so does
//! every node (to forward requests sent to the wrong node, and to repair).
//!
//! - Score of member `m` for block `b`: `w(m) / -ln(u(m, b))`, with `u` uniform in (0, 1)
//!   from XXH3-64 of the block's hash seeded with the member's id hash. Member `m` ranks
//!   first with probability `w(m) / Σw` (the exponential-race form of weighted rendezvous,
//!   as in Resch's "weighted rendezvous hashing"), so capacity sets the share.
//! - Only scores are compared, so the ranking of a block is the same whatever order the
//!   members are listed in, and whoever computes it.
//! - A join takes from every old member only the blocks whose new top score is the joiner's;
//!   a leave moves only the leaver's blocks, each to its next-ranked member. Nothing else
//!   moves: a member's score for a block does not depend on the other members.
//! - Pure: no I/O, no clock. A member with weight 0 (draining) ranks after every member with
//!   capacity, and among themselves by score.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Seed of the block hash (any fixed value; changing it would move every block).
const BLOCK_SEED: u64 = 0x6374_7870_6f64_0001; // "ctxpod" and a version

/// The hash that places a block: XXH3-64 of the namespace's length, the namespace and the
/// key (length-prefixed, so `("ab", "c")` and `("a", "bc")` differ).
pub fn block_hash(ns: &str, key: &[u8]) -> u64 {
    let mut buf = Vec::with_capacity(2 + ns.len() + key.len());
    buf.extend_from_slice(&(ns.len() as u16).to_le_bytes());
    buf.extend_from_slice(ns.as_bytes());
    buf.extend_from_slice(key);
    xxh3_64_with_seed(&buf, BLOCK_SEED)
}

/// One member as placement sees it: a stable id (the node id) and its weight (capacity in
/// bytes; 0 while draining).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub id: String,
    pub weight: u64,
}

impl Member {
    /// A member of this capacity: its weight is the capacity, or 0 while it drains. Nodes
    /// and clients both build members with this, so they rank blocks alike.
    pub fn new(id: impl Into<String>, capacity: u64, draining: bool) -> Member {
        Member {
            id: id.into(),
            weight: if draining { 0 } else { capacity },
        }
    }
}

/// Ranked members a read (or a MATCH) tries before it answers a miss, at least.
pub const READ_FALLBACK: usize = 3;

/// Ranked members a read looks at with `r` copies per block: the copies and one more, and
/// at least [`READ_FALLBACK`] (after a join, or a write while a member was away, a block
/// lives further down its ranking).
pub fn read_candidates(r: usize) -> usize {
    READ_FALLBACK.max(r + 1)
}

/// The members of a pod, ready to rank blocks over.
#[derive(Debug, Clone, Default)]
pub struct Placement {
    /// Sorted by id; each with its id's hash (the seed of its scores).
    members: Vec<(Member, u64)>,
}

impl Placement {
    /// A placement over these members. Ids must be unique; a repeated id keeps its first
    /// entry (after sorting by id and weight, so the choice does not depend on input order).
    pub fn new(members: impl IntoIterator<Item = Member>) -> Placement {
        let mut v: Vec<Member> = members.into_iter().collect();
        v.sort_by(|a, b| a.id.cmp(&b.id).then(b.weight.cmp(&a.weight)));
        v.dedup_by(|b, a| a.id == b.id);
        Placement {
            members: v
                .into_iter()
                .map(|m| {
                    let seed = xxh3_64_with_seed(m.id.as_bytes(), 0);
                    (m, seed)
                })
                .collect(),
        }
    }

    pub fn members(&self) -> impl Iterator<Item = &Member> {
        self.members.iter().map(|(m, _)| m)
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Member `i`'s score for a block hash; higher ranks first.
    fn score(&self, i: usize, block: u64) -> (bool, f64, u64) {
        let (m, seed) = &self.members[i];
        let h = xxh3_64_with_seed(&block.to_le_bytes(), *seed);
        // u in (0, 1): the top 53 bits, centred in their interval.
        let u = ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        let s = -1.0 / u.ln(); // in (0, inf)
                               // Members with capacity first; then the weighted score; the raw hash breaks the
                               // (astronomically unlikely) ties so the order is total.
        (m.weight > 0, m.weight.max(1) as f64 * s, h)
    }

    /// Every member's index, highest score first, for a block.
    pub fn rank(&self, ns: &str, key: &[u8]) -> Vec<usize> {
        self.rank_hash(block_hash(ns, key))
    }

    /// [`Self::rank`] for a block hash computed once ([`block_hash`]).
    pub fn rank_hash(&self, block: u64) -> Vec<usize> {
        let mut scored: Vec<((bool, f64, u64), usize)> = (0..self.members.len())
            .map(|i| (self.score(i, block), i))
            .collect();
        scored.sort_by(|a, b| {
            b.0 .0
                .cmp(&a.0 .0)
                .then(b.0 .1.total_cmp(&a.0 .1))
                .then(b.0 .2.cmp(&a.0 .2))
        });
        scored.into_iter().map(|(_, i)| i).collect()
    }

    /// The `r` members that hold a block, highest score first (fewer when the pod is
    /// smaller than `r`).
    pub fn replicas(&self, ns: &str, key: &[u8], r: usize) -> Vec<&Member> {
        self.rank(ns, key)
            .into_iter()
            .take(r)
            .map(|i| &self.members[i].0)
            .collect()
    }

    /// The member that ranks first for a block, if the pod has any.
    pub fn primary(&self, ns: &str, key: &[u8]) -> Option<&Member> {
        self.replicas(ns, key, 1).into_iter().next()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn pod(weights: &[u64]) -> Vec<Member> {
        weights
            .iter()
            .enumerate()
            .map(|(i, &w)| Member {
                id: format!("node-{i}"),
                weight: w,
            })
            .collect()
    }

    fn key(i: u64) -> [u8; 8] {
        i.to_be_bytes()
    }

    /// Ids of the `r` replicas of block `i`.
    fn ids(p: &Placement, i: u64, r: usize) -> Vec<String> {
        p.replicas("default", &key(i), r)
            .into_iter()
            .map(|m| m.id.clone())
            .collect()
    }

    #[test]
    fn the_namespace_is_part_of_the_block() {
        assert_ne!(block_hash("ab", b"c"), block_hash("a", b"bc"));
        assert_ne!(block_hash("a", b"k"), block_hash("b", b"k"));
        assert_eq!(block_hash("a", b"k"), block_hash("a", b"k"));
    }

    #[test]
    fn an_empty_pod_places_nothing() {
        let p = Placement::new(vec![]);
        assert!(p.primary("default", b"k").is_none());
        assert!(p.replicas("default", b"k", 2).is_empty());
    }

    /// Shares follow capacity: with weights 1, 2, 3 and 3 equal nodes, each member's share
    /// of 60,000 blocks is within 1.5 points of its weight's share. (Deterministic keys: the
    /// figures are the same on every run.)
    #[test]
    fn shares_follow_capacity() {
        for weights in [vec![1u64, 2, 3], vec![5, 5, 5], vec![1, 1, 1, 1, 4]] {
            let p = Placement::new(pod(&weights));
            let n = 60_000u64;
            let mut count: HashMap<String, u64> = HashMap::new();
            for i in 0..n {
                *count.entry(ids(&p, i, 1)[0].clone()).or_default() += 1;
            }
            let total: u64 = weights.iter().sum();
            for (i, &w) in weights.iter().enumerate() {
                let got = count.get(&format!("node-{i}")).copied().unwrap_or(0) as f64 / n as f64;
                let want = w as f64 / total as f64;
                assert!(
                    (got - want).abs() < 0.015,
                    "weights {weights:?}: node-{i} got {got:.4}, want {want:.4}"
                );
            }
        }
    }

    #[test]
    fn a_draining_member_ranks_last() {
        let p = Placement::new(pod(&[0, 1, 1]));
        for i in 0..2_000 {
            let r = ids(&p, i, 3);
            assert_eq!(r.len(), 3);
            assert_eq!(r[2], "node-0", "block {i}: {r:?}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// The ranking does not depend on the order members are listed in.
        #[test]
        fn order_of_members_does_not_matter(
            weights in prop::collection::vec(1u64..1_000, 1..12),
            rot in 0usize..12,
            keys in prop::collection::vec(any::<u64>(), 1..50),
        ) {
            let a = Placement::new(pod(&weights));
            let mut m = pod(&weights);
            let k = rot % m.len();
            m.rotate_left(k);
            m.reverse();
            let b = Placement::new(m);
            for i in keys {
                prop_assert_eq!(ids(&a, i, 3), ids(&b, i, 3));
            }
        }

        /// A join moves only what it must: a block's primary changes only to the joiner, and
        /// every block's old replicas that are still in its top R stay there in order.
        #[test]
        fn a_join_moves_blocks_only_to_the_joiner(
            weights in prop::collection::vec(1u64..1_000, 1..10),
            joiner in 1u64..1_000,
            r in 1usize..4,
            keys in prop::collection::vec(any::<u64>(), 1..200),
        ) {
            let before = Placement::new(pod(&weights));
            let mut m = pod(&weights);
            m.push(Member { id: "joiner".into(), weight: joiner });
            let after = Placement::new(m);
            for i in keys {
                let old = ids(&before, i, r);
                let new = ids(&after, i, r);
                let without: Vec<&String> = new.iter().filter(|id| *id != "joiner").collect();
                // The new set is the old one with the joiner inserted (and the last one
                // pushed out when the set was full).
                let kept: Vec<&String> = old.iter().take(without.len()).collect();
                prop_assert_eq!(without, kept);
            }
        }

        /// A leave moves only the leaver's blocks: every other replica stays, in order.
        #[test]
        fn a_leave_moves_only_the_leavers_blocks(
            weights in prop::collection::vec(1u64..1_000, 2..10),
            leaver in 0usize..10,
            r in 1usize..4,
            keys in prop::collection::vec(any::<u64>(), 1..200),
        ) {
            let before = Placement::new(pod(&weights));
            let gone = format!("node-{}", leaver % weights.len());
            let after = Placement::new(pod(&weights).into_iter().filter(|m| m.id != gone));
            for i in keys {
                let old: Vec<String> = ids(&before, i, r).into_iter().filter(|id| *id != gone).collect();
                let new = ids(&after, i, r);
                prop_assert_eq!(&new[..old.len()], &old[..]);
            }
        }
    }
}
