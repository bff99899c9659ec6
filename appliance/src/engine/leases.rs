//! Leases (pins) and the "recently read" bits that steer reinsertion at eviction.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Time-bounded promises not to evict keys. Held in memory: a lease covers a prefetch that
/// decode will read within seconds, so it does not outlive a restart.
pub struct Leases {
    map: Mutex<HashMap<Vec<u8>, Instant>>,
    max: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("too many leases")]
pub struct LeasesFull;

impl Leases {
    pub fn new(max: usize) -> Leases {
        Leases {
            map: Mutex::new(HashMap::new()),
            max,
        }
    }

    /// Pins `bkey` until `until` (extending, never shortening, an existing lease).
    pub fn pin(&self, bkey: &[u8], until: Instant) -> Result<(), LeasesFull> {
        let mut m = self.map.lock();
        if m.len() >= self.max && !m.contains_key(bkey) {
            let now = Instant::now();
            m.retain(|_, t| *t > now);
            if m.len() >= self.max {
                return Err(LeasesFull);
            }
        }
        let t = m.entry(bkey.to_vec()).or_insert(until);
        if *t < until {
            *t = until;
        }
        Ok(())
    }

    pub fn unpin(&self, bkey: &[u8]) -> bool {
        self.map.lock().remove(bkey).is_some()
    }

    pub fn is_pinned(&self, bkey: &[u8]) -> bool {
        let mut m = self.map.lock();
        match m.get(bkey) {
            Some(t) if *t > Instant::now() => true,
            Some(_) => {
                m.remove(bkey);
                false
            }
            None => false,
        }
    }

    pub fn len(&self) -> usize {
        self.map.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One bit per hash bucket of block keys: set on a read, taken (read and cleared) when the
/// block's region is evicted. Fixed memory; a collision only reinserts an extra block.
pub struct ReadBits {
    words: Box<[AtomicU64]>,
}

impl ReadBits {
    pub fn new(bits: usize) -> ReadBits {
        let words = bits.div_ceil(64).max(1);
        ReadBits {
            words: (0..words).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn slot(&self, bkey: &[u8]) -> (usize, u64) {
        let h = BuildHasherDefault::<DefaultHasher>::default().hash_one(bkey);
        let bit = h % (self.words.len() as u64 * 64);
        ((bit / 64) as usize, 1 << (bit % 64))
    }

    pub fn set(&self, bkey: &[u8]) {
        let (w, m) = self.slot(bkey);
        self.words[w].fetch_or(m, Ordering::Relaxed);
    }

    pub fn take(&self, bkey: &[u8]) -> bool {
        let (w, m) = self.slot(bkey);
        self.words[w].fetch_and(!m, Ordering::Relaxed) & m != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn leases_expire_and_are_bounded() {
        let l = Leases::new(2);
        let now = Instant::now();
        l.pin(b"a", now + Duration::from_secs(60)).expect("room");
        l.pin(b"b", now - Duration::from_secs(1)).expect("room");
        assert!(l.is_pinned(b"a"));
        assert!(!l.is_pinned(b"b"), "expired lease");
        l.pin(b"c", now + Duration::from_secs(60))
            .expect("room after expiry");
        assert_eq!(l.pin(b"d", now + Duration::from_secs(60)), Err(LeasesFull));
        assert!(l.unpin(b"a"));
        assert!(!l.is_pinned(b"a"));
    }

    #[test]
    fn read_bits() {
        let r = ReadBits::new(1 << 10);
        assert!(!r.take(b"x"));
        r.set(b"x");
        assert!(r.take(b"x"));
        assert!(!r.take(b"x"), "take clears");
    }
}
