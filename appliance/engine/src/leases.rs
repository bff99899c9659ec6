//! Leases (pins) and the "recently read" bits that steer reinsertion at eviction.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Promises not to evict keys: a pin until a time (the `pin` API), and holds taken by live
/// prefetch tickets (released when the ticket ends). Held in memory: a lease covers a
/// prefetch that decode will read within seconds, so it does not outlive a restart.
///
/// Leased blocks cost device room that eviction cannot take back, so their bytes are
/// bounded: node-wide (`leased_bytes_max`) and per owner (a tenant: its
/// `leased_bytes_max`). A lease counts the device bytes of its record from when it is
/// taken until it ends (an expired pin until the next sweep).
pub struct Leases {
    state: Mutex<State>,
    max: usize,
    bytes_max: u64,
}

#[derive(Default)]
struct State {
    map: HashMap<Vec<u8>, Lease>,
    bytes: u64,
    by_owner: HashMap<Arc<str>, u64>,
}

#[derive(Clone)]
struct Lease {
    until: Instant,
    holds: u32,
    bytes: u64,
    owner: Option<Arc<str>>,
}

impl Lease {
    fn live(&self, now: Instant) -> bool {
        self.holds > 0 || self.until > now
    }
}

/// Why a lease was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseRefused {
    #[error("too many leases")]
    Table,
    #[error("leased blocks take the node's leased_bytes_max")]
    NodeBytes,
    #[error("tenant {0}'s leased blocks take its leased_bytes_max")]
    OwnerBytes(Arc<str>),
}

impl LeaseRefused {
    /// The label of `ctxpod_lease_refusals_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            LeaseRefused::Table => "table",
            LeaseRefused::NodeBytes => "node_bytes",
            LeaseRefused::OwnerBytes(_) => "tenant_bytes",
        }
    }
}

/// Who a lease is charged to, and how many bytes that owner may have leased.
#[derive(Clone, Copy)]
pub struct Owner<'a> {
    pub name: &'a Arc<str>,
    pub bytes_max: u64,
}

impl State {
    fn remove(&mut self, bkey: &[u8]) {
        if let Some(l) = self.map.remove(bkey) {
            self.uncount(&l);
        }
    }

    fn uncount(&mut self, l: &Lease) {
        self.bytes -= l.bytes;
        if let Some(o) = &l.owner {
            let left = self.by_owner.get_mut(o).map(|b| {
                *b -= l.bytes;
                *b
            });
            if left == Some(0) {
                self.by_owner.remove(o);
            }
        }
    }

    /// Drops every lease that ended.
    fn sweep(&mut self, now: Instant) {
        let dead: Vec<Vec<u8>> = self
            .map
            .iter()
            .filter(|(_, l)| !l.live(now))
            .map(|(k, _)| k.clone())
            .collect();
        for k in dead {
            self.remove(&k);
        }
    }

    fn room(
        &self,
        max: usize,
        bytes_max: u64,
        bytes: u64,
        owner: Option<&Owner>,
    ) -> Result<(), LeaseRefused> {
        if self.map.len() >= max {
            return Err(LeaseRefused::Table);
        }
        if self.bytes + bytes > bytes_max {
            return Err(LeaseRefused::NodeBytes);
        }
        if let Some(o) = owner {
            if self.by_owner.get(o.name).copied().unwrap_or(0) + bytes > o.bytes_max {
                return Err(LeaseRefused::OwnerBytes(o.name.clone()));
            }
        }
        Ok(())
    }
}

impl Leases {
    pub fn new(max: usize, bytes_max: u64) -> Leases {
        Leases {
            state: Mutex::new(State::default()),
            max,
            bytes_max,
        }
    }

    /// The lease of `bkey`, taken if there is none (its `bytes` charged to the node and
    /// to `owner`, after a sweep of ended leases if the limits are reached).
    fn entry<'a>(
        &self,
        st: &'a mut State,
        bkey: &[u8],
        bytes: u64,
        owner: Option<Owner>,
    ) -> Result<&'a mut Lease, LeaseRefused> {
        let owner = owner.as_ref();
        let now = Instant::now();
        match st.map.get(bkey) {
            Some(l) if l.live(now) => {}
            Some(_) => st.remove(bkey),
            None => {}
        }
        if !st.map.contains_key(bkey) {
            if st.room(self.max, self.bytes_max, bytes, owner).is_err() {
                st.sweep(now);
                st.room(self.max, self.bytes_max, bytes, owner)?;
            }
            st.bytes += bytes;
            if let Some(o) = owner {
                *st.by_owner.entry(o.name.clone()).or_default() += bytes;
            }
            st.map.insert(
                bkey.to_vec(),
                Lease {
                    until: now,
                    holds: 0,
                    bytes,
                    owner: owner.map(|o| o.name.clone()),
                },
            );
        }
        Ok(st.map.get_mut(bkey).expect("inserted"))
    }

    /// Pins `bkey` (a record of `bytes` device bytes) until `until`, extending, never
    /// shortening, an existing pin.
    pub fn pin(
        &self,
        bkey: &[u8],
        until: Instant,
        bytes: u64,
        owner: Option<Owner>,
    ) -> Result<(), LeaseRefused> {
        let mut st = self.state.lock();
        let l = self.entry(&mut st, bkey, bytes, owner)?;
        if l.until < until {
            l.until = until;
        }
        Ok(())
    }

    /// Ends the pin of `bkey` (holds of prefetch tickets stay).
    pub fn unpin(&self, bkey: &[u8]) -> bool {
        let mut st = self.state.lock();
        let Some(l) = st.map.get_mut(bkey) else {
            return false;
        };
        let was = l.until > Instant::now();
        l.until = Instant::now();
        if l.holds == 0 {
            st.remove(bkey);
        }
        was
    }

    /// One more hold on `bkey`, until [`Leases::release`].
    pub fn hold(&self, bkey: &[u8], bytes: u64, owner: Option<Owner>) -> Result<(), LeaseRefused> {
        let mut st = self.state.lock();
        self.entry(&mut st, bkey, bytes, owner)?.holds += 1;
        Ok(())
    }

    pub fn release(&self, bkey: &[u8]) {
        let mut st = self.state.lock();
        if let Some(l) = st.map.get_mut(bkey) {
            l.holds = l.holds.saturating_sub(1);
            if !l.live(Instant::now()) {
                st.remove(bkey);
            }
        }
    }

    pub fn is_pinned(&self, bkey: &[u8]) -> bool {
        let mut st = self.state.lock();
        match st.map.get(bkey) {
            Some(l) if l.live(Instant::now()) => true,
            Some(_) => {
                st.remove(bkey);
                false
            }
            None => false,
        }
    }

    pub fn len(&self) -> usize {
        self.state.lock().map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Device bytes of the leased records (ended pins not yet swept included).
    pub fn bytes(&self) -> u64 {
        self.state.lock().bytes
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

    /// Sets `bkey`'s bit; whether it was set already (read before, since its region was
    /// last reclaimed).
    pub fn set(&self, bkey: &[u8]) -> bool {
        let (w, m) = self.slot(bkey);
        self.words[w].fetch_or(m, Ordering::Relaxed) & m != 0
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
        let l = Leases::new(2, u64::MAX);
        let now = Instant::now();
        l.pin(b"a", now + Duration::from_secs(60), 1, None)
            .expect("room");
        l.pin(b"b", now - Duration::from_secs(1), 1, None)
            .expect("room");
        assert!(l.is_pinned(b"a"));
        assert!(!l.is_pinned(b"b"), "expired lease");
        l.pin(b"c", now + Duration::from_secs(60), 1, None)
            .expect("room after expiry");
        assert_eq!(
            l.pin(b"d", now + Duration::from_secs(60), 1, None),
            Err(LeaseRefused::Table)
        );
        assert!(l.unpin(b"a"));
        assert!(!l.is_pinned(b"a"));
    }

    #[test]
    fn holds_outlive_pins_until_released() {
        let l = Leases::new(8, u64::MAX);
        l.hold(b"k", 1, None).expect("room");
        l.hold(b"k", 1, None).expect("room");
        assert!(l.is_pinned(b"k"));
        assert!(!l.unpin(b"k"), "no pin, only holds");
        assert!(l.is_pinned(b"k"), "unpin leaves holds");
        l.release(b"k");
        assert!(l.is_pinned(b"k"), "one hold left");
        l.pin(b"k", Instant::now() + Duration::from_secs(60), 1, None)
            .expect("room");
        l.release(b"k");
        assert!(l.is_pinned(b"k"), "the pin outlives the holds");
        assert!(l.unpin(b"k"));
        assert!(!l.is_pinned(b"k"));
        assert!(l.is_empty());
    }

    /// Leased bytes are bounded for the node and each owner; a lease taken again costs
    /// nothing more; ended leases give their bytes back.
    #[test]
    fn leased_bytes_are_bounded_per_node_and_owner() {
        let l = Leases::new(100, 100);
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let oa = Owner {
            name: &a,
            bytes_max: 60,
        };
        let ob = Owner {
            name: &b,
            bytes_max: 60,
        };
        let later = Instant::now() + Duration::from_secs(60);
        l.pin(b"a1", later, 40, Some(oa)).expect("room");
        l.pin(b"a1", later, 40, Some(oa))
            .expect("again: no more bytes");
        l.hold(b"a1", 40, Some(oa)).expect("a hold on a pinned key");
        assert_eq!(l.bytes(), 40);
        assert_eq!(
            l.pin(b"a2", later, 30, Some(oa)),
            Err(LeaseRefused::OwnerBytes(a.clone()))
        );
        l.hold(b"b1", 50, Some(ob)).expect("room");
        assert_eq!(
            l.pin(b"b2", later, 20, Some(ob)),
            Err(LeaseRefused::NodeBytes)
        );
        l.release(b"b1");
        assert_eq!(l.bytes(), 40);
        l.pin(b"b2", later, 20, Some(ob)).expect("room again");
        assert!(l.unpin(b"a1"));
        assert!(l.is_pinned(b"a1"), "the hold stays");
        l.release(b"a1");
        assert_eq!(l.bytes(), 20);
        // An expired pin's bytes come back at the next refusal's sweep.
        l.pin(b"x", Instant::now(), 80, None).expect("room");
        l.pin(b"y", later, 80, None).expect("after a sweep");
        assert_eq!(l.bytes(), 100);
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
