//! Leases (pins) and the "recently read" bits that steer reinsertion at eviction.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Promises not to evict keys: a pin until a time (the `pin` API), and holds taken by live
/// prefetch tickets (released when the ticket ends). Held in memory: a lease covers a
/// prefetch that decode will read within seconds, so it does not outlive a restart.
pub struct Leases {
    map: Mutex<HashMap<Vec<u8>, Lease>>,
    max: usize,
}

#[derive(Clone, Copy)]
struct Lease {
    until: Instant,
    holds: u32,
}

impl Lease {
    fn live(&self, now: Instant) -> bool {
        self.holds > 0 || self.until > now
    }
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

    fn entry<'a>(
        &self,
        m: &'a mut HashMap<Vec<u8>, Lease>,
        bkey: &[u8],
    ) -> Result<&'a mut Lease, LeasesFull> {
        if m.len() >= self.max && !m.contains_key(bkey) {
            let now = Instant::now();
            m.retain(|_, l| l.live(now));
            if m.len() >= self.max {
                return Err(LeasesFull);
            }
        }
        Ok(m.entry(bkey.to_vec()).or_insert(Lease {
            until: Instant::now(),
            holds: 0,
        }))
    }

    /// Pins `bkey` until `until` (extending, never shortening, an existing pin).
    pub fn pin(&self, bkey: &[u8], until: Instant) -> Result<(), LeasesFull> {
        let mut m = self.map.lock();
        let l = self.entry(&mut m, bkey)?;
        if l.until < until {
            l.until = until;
        }
        Ok(())
    }

    /// Ends the pin of `bkey` (holds of prefetch tickets stay).
    pub fn unpin(&self, bkey: &[u8]) -> bool {
        let mut m = self.map.lock();
        let Some(l) = m.get_mut(bkey) else {
            return false;
        };
        let was = l.until > Instant::now();
        l.until = Instant::now();
        if l.holds == 0 {
            m.remove(bkey);
        }
        was
    }

    /// One more hold on `bkey`, until [`Leases::release`].
    pub fn hold(&self, bkey: &[u8]) -> Result<(), LeasesFull> {
        let mut m = self.map.lock();
        self.entry(&mut m, bkey)?.holds += 1;
        Ok(())
    }

    pub fn release(&self, bkey: &[u8]) {
        let mut m = self.map.lock();
        if let Some(l) = m.get_mut(bkey) {
            l.holds = l.holds.saturating_sub(1);
            if !l.live(Instant::now()) {
                m.remove(bkey);
            }
        }
    }

    pub fn is_pinned(&self, bkey: &[u8]) -> bool {
        let mut m = self.map.lock();
        match m.get(bkey) {
            Some(l) if l.live(Instant::now()) => true,
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
    fn holds_outlive_pins_until_released() {
        let l = Leases::new(8);
        l.hold(b"k").expect("room");
        l.hold(b"k").expect("room");
        assert!(l.is_pinned(b"k"));
        assert!(!l.unpin(b"k"), "no pin, only holds");
        assert!(l.is_pinned(b"k"), "unpin leaves holds");
        l.release(b"k");
        assert!(l.is_pinned(b"k"), "one hold left");
        l.pin(b"k", Instant::now() + Duration::from_secs(60))
            .expect("room");
        l.release(b"k");
        assert!(l.is_pinned(b"k"), "the pin outlives the holds");
        assert!(l.unpin(b"k"));
        assert!(!l.is_pinned(b"k"));
        assert!(l.is_empty());
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
