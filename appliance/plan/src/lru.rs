//! An exact LRU cache of block ids, the reference the node's replay and the sampled curves
//! are checked against.
//!
//! A request is served the way an inference engine uses a context tier: it looks up the
//! leading run of its blocks that the cache holds (a *prefix hit*: a block after a missing
//! one is useless, its KV depends on the missing prefix), then every block of the request is
//! used (hits refreshed, misses computed and stored), in order.

use std::collections::HashMap;

const NIL: u32 = u32::MAX;

struct Slot {
    key: u64,
    prev: u32,
    next: u32,
}

/// LRU over `u64` keys with O(1) operations: a map into a slab of doubly linked slots.
pub struct Lru {
    cap: usize,
    map: HashMap<u64, u32>,
    slots: Vec<Slot>,
    /// Most recently used.
    head: u32,
    /// Least recently used: evicted first.
    tail: u32,
}

impl Lru {
    pub fn new(capacity: usize) -> Lru {
        assert!(capacity >= 1 && capacity < NIL as usize, "LRU capacity");
        Lru {
            cap: capacity,
            map: HashMap::with_capacity(capacity.min(1 << 24)),
            slots: Vec::with_capacity(capacity.min(1 << 24)),
            head: NIL,
            tail: NIL,
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn contains(&self, key: u64) -> bool {
        self.map.contains_key(&key)
    }

    fn unlink(&mut self, i: u32) {
        let (p, n) = (self.slots[i as usize].prev, self.slots[i as usize].next);
        if p == NIL {
            self.head = n;
        } else {
            self.slots[p as usize].next = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.slots[n as usize].prev = p;
        }
    }

    fn push_front(&mut self, i: u32) {
        self.slots[i as usize].prev = NIL;
        self.slots[i as usize].next = self.head;
        if self.head != NIL {
            self.slots[self.head as usize].prev = i;
        }
        self.head = i;
        if self.tail == NIL {
            self.tail = i;
        }
    }

    /// Uses `key`: a hit moves it to the front; a miss stores it there, evicting the least
    /// recently used key when full. True on a hit.
    pub fn touch(&mut self, key: u64) -> bool {
        if let Some(&i) = self.map.get(&key) {
            self.unlink(i);
            self.push_front(i);
            return true;
        }
        let i = if self.map.len() == self.cap {
            // Reuse the evicted slot.
            let t = self.tail;
            self.unlink(t);
            let old = self.slots[t as usize].key;
            self.map.remove(&old);
            self.slots[t as usize].key = key;
            t
        } else {
            self.slots.push(Slot {
                key,
                prev: NIL,
                next: NIL,
            });
            (self.slots.len() - 1) as u32
        };
        self.map.insert(key, i);
        self.push_front(i);
        false
    }

    /// Serves one request: the number of leading blocks held (prefix hits), then every
    /// block used in order.
    pub fn request(&mut self, ids: &[u64]) -> usize {
        let hits = ids.iter().take_while(|k| self.contains(**k)).count();
        for &k in ids {
            self.touch(k);
        }
        hits
    }
}

/// Hit ratios of a trace through an LRU of `capacity` blocks.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct LruResult {
    pub capacity_blocks: u64,
    pub block_refs: u64,
    pub prefix_hits: u64,
    /// Prefix hits over block references.
    pub prefix_hit_ratio: f64,
}

pub fn simulate(reqs: &[crate::trace::Request], capacity: usize) -> LruResult {
    let mut lru = Lru::new(capacity);
    let (mut refs, mut hits) = (0u64, 0u64);
    for r in reqs {
        refs += r.hash_ids.len() as u64;
        hits += lru.request(&r.hash_ids) as u64;
    }
    LruResult {
        capacity_blocks: capacity as u64,
        block_refs: refs,
        prefix_hits: hits,
        prefix_hit_ratio: if refs == 0 {
            0.0
        } else {
            hits as f64 / refs as f64
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn evicts_the_least_recently_used() {
        let mut l = Lru::new(2);
        assert!(!l.touch(1));
        assert!(!l.touch(2));
        assert!(l.touch(1)); // 2 is now least recent
        assert!(!l.touch(3)); // evicts 2
        assert!(l.contains(1) && l.contains(3) && !l.contains(2));
        assert_eq!(l.len(), 2);
    }

    #[test]
    fn a_request_counts_only_the_leading_run() {
        let mut l = Lru::new(10);
        assert_eq!(l.request(&[1, 2, 3]), 0);
        assert_eq!(l.request(&[1, 2, 9, 3]), 2);
        assert_eq!(l.request(&[9, 1]), 2);
        assert_eq!(l.request(&[7, 1, 2]), 0);
    }

    proptest! {
        // Against the obvious model: a Vec ordered by recency.
        #[test]
        fn matches_a_naive_lru(cap in 1usize..8, keys in proptest::collection::vec(0u64..12, 0..200)) {
            let mut l = Lru::new(cap);
            let mut model: Vec<u64> = Vec::new();
            for k in keys {
                let hit = model.contains(&k);
                model.retain(|x| *x != k);
                model.insert(0, k);
                model.truncate(cap);
                prop_assert_eq!(l.touch(k), hit);
                prop_assert_eq!(l.len(), model.len());
            }
            for k in 0..12 {
                prop_assert_eq!(l.contains(k), model.contains(&k));
            }
        }
    }
}
