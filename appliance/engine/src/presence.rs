//! Which keys the index holds, in memory, so that MATCH of a long chain answers without a
//! RocksDB lookup per key: per namespace, a counted set of 64-bit XXH3 fingerprints of keys
//! (about 16 bytes per block). Rebuilt from the index at start (and after the device was
//! full), kept by the writer as it indexes, deletes, quarantines and evicts: a batch's
//! changes are applied in the batch's order right after its index write (a key is never
//! "present" before a GET can read it), an eviction's before its index write.
//!
//! It answers "maybe present" with a false-positive rate of about n / 2^64 per lookup (a
//! fingerprint collision), never a false negative for a key the index holds: MATCH is
//! advisory anyway (a block may be evicted between MATCH and GET), and a GET that misses is
//! a recompute, never wrong bytes.

use parking_lot::RwLock;
use std::collections::HashMap;
use xxhash_rust::xxh3::xxh3_64;

/// One change a batch makes to the presence set, applied once its index write is done.
#[derive(Debug)]
pub enum Change {
    Insert(Vec<u8>),
    Remove(Vec<u8>),
    DropNamespace(u32),
}

#[derive(Default)]
pub struct Presence {
    by_ns: RwLock<HashMap<u32, HashMap<u64, u32>>>,
}

fn split(bkey: &[u8]) -> Option<(u32, u64)> {
    let ns = u32::from_be_bytes(bkey.get(..4)?.try_into().ok()?);
    Some((ns, xxh3_64(&bkey[4..])))
}

fn remove_from(m: &mut HashMap<u32, HashMap<u64, u32>>, bkey: &[u8]) {
    let Some((ns, fp)) = split(bkey) else { return };
    let Some(set) = m.get_mut(&ns) else { return };
    if let Some(n) = set.get_mut(&fp) {
        *n -= 1;
        if *n == 0 {
            set.remove(&fp);
        }
    }
}

impl Presence {
    /// A block key (`ns_id` ‖ key) entered the index.
    pub fn insert(&self, bkey: &[u8]) {
        if let Some((ns, fp)) = split(bkey) {
            *self
                .by_ns
                .write()
                .entry(ns)
                .or_default()
                .entry(fp)
                .or_default() += 1;
        }
    }

    /// A block key left the index.
    pub fn remove(&self, bkey: &[u8]) {
        remove_from(&mut self.by_ns.write(), bkey);
    }

    /// A batch's changes, in its order (under one lock: a MATCH sees all or none of them).
    pub fn apply(&self, changes: &[Change]) {
        if changes.is_empty() {
            return;
        }
        let mut m = self.by_ns.write();
        for c in changes {
            match c {
                Change::Insert(bkey) => {
                    if let Some((ns, fp)) = split(bkey) {
                        *m.entry(ns).or_default().entry(fp).or_default() += 1;
                    }
                }
                Change::Remove(bkey) => remove_from(&mut m, bkey),
                Change::DropNamespace(id) => drop(m.remove(id)),
            }
        }
    }

    pub fn drop_namespace(&self, ns_id: u32) {
        self.by_ns.write().remove(&ns_id);
    }

    /// How many leading keys of `chain` (keys, not block keys) namespace `ns_id` holds.
    pub fn leading(&self, ns_id: u32, chain: &[Vec<u8>]) -> usize {
        let m = self.by_ns.read();
        let Some(set) = m.get(&ns_id) else { return 0 };
        chain
            .iter()
            .take_while(|k| set.contains_key(&xxh3_64(k)))
            .count()
    }

    pub fn len(&self) -> usize {
        self.by_ns.read().values().map(|s| s.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Replaces the contents with the index's block keys.
    pub fn rebuild(&self, index: &super::index::Index) -> anyhow::Result<usize> {
        let mut m: HashMap<u32, HashMap<u64, u32>> = HashMap::new();
        let mut n = 0;
        let cf = index.cf(super::index::CF_BLOCKS);
        for item in index.db.iterator_cf(cf, rocksdb::IteratorMode::Start) {
            let (k, _) = item?;
            if let Some((ns, fp)) = split(&k) {
                *m.entry(ns).or_default().entry(fp).or_default() += 1;
                n += 1;
            }
        }
        *self.by_ns.write() = m;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bk(ns: u32, k: &[u8]) -> Vec<u8> {
        super::super::index::block_key(ns, k)
    }

    #[test]
    fn counts_namespaces_and_leading_keys() {
        let p = Presence::default();
        for k in [&b"a"[..], b"b", b"c"] {
            p.insert(&bk(1, k));
        }
        p.insert(&bk(2, b"d"));
        let chain = |ks: &[&[u8]]| ks.iter().map(|k| k.to_vec()).collect::<Vec<_>>();
        assert_eq!(p.leading(1, &chain(&[b"a", b"b", b"c", b"d"])), 3);
        assert_eq!(p.leading(2, &chain(&[b"a"])), 0, "namespaces are apart");
        p.insert(&bk(1, b"b"));
        p.remove(&bk(1, b"b"));
        assert_eq!(p.leading(1, &chain(&[b"a", b"b"])), 2, "counted");
        p.remove(&bk(1, b"b"));
        assert_eq!(p.leading(1, &chain(&[b"a", b"b", b"c"])), 1);
        p.drop_namespace(1);
        assert_eq!(p.leading(1, &chain(&[b"a"])), 0);
        assert_eq!(p.len(), 1);
    }
}
