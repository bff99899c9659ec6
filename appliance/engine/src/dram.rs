//! DRAM tier: an S3-FIFO cache of decrypted, verified blocks, bounded in bytes (sans-IO).
//!
//! S3-FIFO (Yang et al., SOSP'23): new entries enter a small FIFO (10% of the bytes); an entry
//! read again before it leaves the small queue is promoted to the main FIFO, others leave
//! and their keys go to a ghost FIFO; a key found in the ghost enters main directly. The main
//! FIFO gives entries with a non-zero frequency another round (CLOCK-like). One-hit wonders —
//! most KV blocks of a one-off prompt — leave quickly without disturbing the hot prefixes.

use bytes::Bytes;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

pub type CacheKey = Arc<[u8]>;

const FREQ_MAX: u8 = 3;
/// Per-entry bookkeeping bytes counted against the limit, besides the payload and key.
const ENTRY_OVERHEAD_BYTES: usize = 96;

struct Entry {
    data: Bytes,
    crc32c: u32,
    freq: u8,
    in_main: bool,
}

pub struct S3Fifo {
    capacity_bytes: usize,
    small_target_bytes: usize,
    small_bytes: usize,
    main_bytes: usize,
    map: HashMap<CacheKey, Entry>,
    small: VecDeque<CacheKey>,
    main: VecDeque<CacheKey>,
    ghost: VecDeque<CacheKey>,
    ghost_set: HashSet<CacheKey>,
    ghost_max: usize,
}

/// Bytes an entry is charged: the memory of the whole record buffer a block read from flash
/// keeps alive (header, payload, tag and padding, in its buffer-pool capacity class), its
/// key and bookkeeping.
fn cost(key: &[u8], data: &Bytes) -> usize {
    crate::device::AlignedBuf::capacity_for(ctxpod_format::record::record_bytes(data.len()))
        + key.len()
        + ENTRY_OVERHEAD_BYTES
}

impl S3Fifo {
    pub fn new(capacity_bytes: usize) -> Self {
        S3Fifo {
            capacity_bytes,
            small_target_bytes: capacity_bytes / 10,
            small_bytes: 0,
            main_bytes: 0,
            map: HashMap::new(),
            small: VecDeque::new(),
            main: VecDeque::new(),
            ghost: VecDeque::new(),
            ghost_set: HashSet::new(),
            ghost_max: 1 << 16,
        }
    }

    pub fn used_bytes(&self) -> usize {
        self.small_bytes + self.main_bytes
    }

    pub fn capacity_bytes(&self) -> usize {
        self.capacity_bytes
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The block and its CRC32C.
    pub fn get(&mut self, key: &[u8]) -> Option<(Bytes, u32)> {
        let e = self.map.get_mut(key)?;
        e.freq = (e.freq + 1).min(FREQ_MAX);
        Some((e.data.clone(), e.crc32c))
    }

    pub fn contains(&self, key: &[u8]) -> bool {
        self.map.contains_key(key)
    }

    /// Drops every entry of namespace `ns_id` (block keys start with it): its blocks left
    /// the index when the namespace was deleted. O(entries); namespace deletes are rare.
    pub fn remove_namespace(&mut self, ns_id: u32) {
        let prefix = ns_id.to_be_bytes();
        let doomed: Vec<CacheKey> = self
            .map
            .keys()
            .filter(|k| k.starts_with(&prefix))
            .cloned()
            .collect();
        for k in doomed {
            self.remove(&k);
        }
    }

    /// Inserts a block; blocks larger than the small queue's share are not cached.
    pub fn insert(&mut self, key: CacheKey, data: Bytes, crc32c: u32) {
        let c = cost(&key, &data);
        if c > self.small_target_bytes.max(self.capacity_bytes / 4) || self.map.contains_key(&key) {
            return;
        }
        let to_main = self.ghost_set.remove(&key);
        while self.used_bytes() + c > self.capacity_bytes && !self.map.is_empty() {
            self.evict_one();
        }
        if self.used_bytes() + c > self.capacity_bytes {
            return;
        }
        if to_main {
            self.main_bytes += c;
            self.main.push_back(key.clone());
        } else {
            self.small_bytes += c;
            self.small.push_back(key.clone());
        }
        self.map.insert(
            key,
            Entry {
                data,
                crc32c,
                freq: 0,
                in_main: to_main,
            },
        );
    }

    pub fn remove(&mut self, key: &[u8]) {
        if let Some((k, e)) = self.map.remove_entry(key) {
            let c = cost(&k, &e.data);
            if e.in_main {
                self.main_bytes -= c;
            } else {
                self.small_bytes -= c;
            }
            // The queues keep the key until it reaches their head; bound that garbage.
            if self.small.len() + self.main.len() > 2 * self.map.len() + 1024 {
                let map = &self.map;
                self.small
                    .retain(|k| map.get(k).is_some_and(|e| !e.in_main));
                self.main.retain(|k| map.get(k).is_some_and(|e| e.in_main));
            }
        }
    }

    fn evict_one(&mut self) {
        if self.small_bytes > self.small_target_bytes || self.main.is_empty() {
            self.evict_small();
        } else {
            self.evict_main();
        }
    }

    fn evict_small(&mut self) {
        while let Some(k) = self.small.pop_front() {
            let Some(e) = self.map.get_mut(&k) else {
                continue;
            };
            if e.in_main {
                continue;
            }
            let c = cost(&k, &e.data);
            if e.freq > 0 {
                e.in_main = true;
                e.freq = 0;
                self.small_bytes -= c;
                self.main_bytes += c;
                self.main.push_back(k);
                return;
            }
            self.map.remove(&k);
            self.small_bytes -= c;
            self.remember_ghost(k);
            return;
        }
        self.evict_main();
    }

    fn evict_main(&mut self) {
        while let Some(k) = self.main.pop_front() {
            let Some(e) = self.map.get_mut(&k) else {
                continue;
            };
            if !e.in_main {
                continue;
            }
            if e.freq > 0 {
                e.freq -= 1;
                self.main.push_back(k);
                continue;
            }
            let c = cost(&k, &e.data);
            self.map.remove(&k);
            self.main_bytes -= c;
            return;
        }
    }

    fn remember_ghost(&mut self, k: CacheKey) {
        if self.ghost_set.insert(k.clone()) {
            self.ghost.push_back(k);
        }
        while self.ghost.len() > self.ghost_max {
            if let Some(old) = self.ghost.pop_front() {
                self.ghost_set.remove(&old);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn k(i: u32) -> CacheKey {
        i.to_be_bytes().to_vec().into()
    }

    #[test]
    fn bounded_and_consistent_under_random_ops() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut c = S3Fifo::new(1 << 20);
        let mut model: HashMap<u32, usize> = HashMap::new();
        for _ in 0..50_000 {
            let key = rng.gen_range(0..500u32);
            match rng.gen_range(0..10) {
                0..=3 => {
                    let len = rng.gen_range(1..2000);
                    let had = c.contains(&k(key));
                    c.insert(k(key), Bytes::from(vec![key as u8; len]), 0);
                    if !had {
                        model.insert(key, len);
                    }
                }
                4 => {
                    c.remove(&k(key));
                    model.remove(&key);
                }
                _ => {
                    if let Some((d, _)) = c.get(&k(key)) {
                        assert!(d.iter().all(|&b| b == key as u8), "wrong bytes for {key}");
                        assert_eq!(Some(&d.len()), model.get(&key), "length for {key}");
                    }
                }
            }
            assert!(c.used_bytes() <= c.capacity_bytes());
        }
    }

    #[test]
    fn frequently_read_entries_survive_a_scan() {
        let mut c = S3Fifo::new(100 * (8192 + 4 + ENTRY_OVERHEAD_BYTES));
        for i in 0..10 {
            c.insert(k(i), Bytes::from(vec![0u8; 100]), 0);
            c.get(&k(i));
        }
        for i in 1000..3000 {
            c.insert(k(i), Bytes::from(vec![0u8; 100]), 0);
            for hot in 0..10 {
                c.get(&k(hot));
            }
        }
        for hot in 0..10 {
            assert!(c.contains(&k(hot)), "hot key {hot} was evicted by a scan");
        }
    }
}
