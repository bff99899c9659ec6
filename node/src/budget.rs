//! Node-wide byte budgets: every byte a request can make the node hold is taken from one of
//! these before the memory is allocated, and given back when the bytes are gone (stored,
//! or handed to the socket). Both listeners share them, so HTTP and CXP1 together stay
//! within what the configuration names.
//!
//! | budget | config | held from … until … |
//! |---|---|---|
//! | `ingest` | `ingest_bytes_max` | a request body is admitted … it is stored or refused |
//! | `egress` | `egress_bytes_max` | a block is admitted to an answer, before it is read … the answer's last bytes are handed to the socket |
//! | `staging` | `prefetch_staging_bytes` | a prefetch reads a block into node memory … its push is queued for the socket |
//!
//! A request that finds a budget spent is answered busy (503, CXP1 `BUSY`) at once, per
//! entry where it has entries, and counted in `ctxpod_busy_rejections_total{queue}`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A share of a [`ByteBudget`], given back when dropped.
pub type Permit = OwnedSemaphorePermit;

/// Largest single take: a semaphore takes at most `u32::MAX` permits at once.
const TAKE_BYTES_MAX: usize = u32::MAX as usize;

#[derive(Clone)]
pub struct ByteBudget {
    sem: Arc<Semaphore>,
    total: usize,
    /// The `queue` label of its refusals.
    pub name: &'static str,
}

impl ByteBudget {
    pub fn new(name: &'static str, bytes: u64) -> ByteBudget {
        let total = (bytes as usize).clamp(1, Semaphore::MAX_PERMITS);
        ByteBudget {
            sem: Arc::new(Semaphore::new(total)),
            total,
            name,
        }
    }

    fn want(bytes: usize) -> u32 {
        bytes.clamp(1, TAKE_BYTES_MAX) as u32
    }

    /// `bytes` of the budget now, or `None` when it does not have them.
    pub fn try_take(&self, bytes: usize) -> Option<Permit> {
        if bytes > self.total {
            return None;
        }
        self.sem
            .clone()
            .try_acquire_many_owned(Self::want(bytes))
            .ok()
    }

    /// `bytes` of the budget, waiting for them; `None` only if they can never be had.
    pub async fn take(&self, bytes: usize) -> Option<Permit> {
        if bytes > self.total {
            return None;
        }
        self.sem
            .clone()
            .acquire_many_owned(Self::want(bytes))
            .await
            .ok()
    }

    /// Bytes taken now.
    pub fn used(&self) -> usize {
        self.total - self.sem.available_permits()
    }

    pub fn total(&self) -> usize {
        self.total
    }
}

/// Shares of a budget per peer address: the clients of one address (one host, or all
/// behind one NAT) hold at most `share` bytes of it together, so that clients that stall
/// from one place leave the rest of the budget to everyone else.
pub struct PeerShares {
    share: usize,
    peers: parking_lot::Mutex<HashMap<IpAddr, Arc<Semaphore>>>,
}

/// Peers tracked before idle entries (no bytes taken) are let go.
const PEERS_TRACKED_MAX: usize = 4096;

impl PeerShares {
    pub fn new(share: u64) -> PeerShares {
        PeerShares {
            share: (share as usize).clamp(1, Semaphore::MAX_PERMITS),
            peers: parking_lot::Mutex::new(HashMap::new()),
        }
    }

    /// Bytes of `peer`'s share it holds now.
    pub fn held(&self, peer: IpAddr) -> usize {
        self.peers
            .lock()
            .get(&peer)
            .map_or(0, |s| self.share - s.available_permits())
    }

    /// `bytes` of `peer`'s share now, or `None` when it does not have them.
    pub fn try_take(&self, peer: IpAddr, bytes: usize) -> Option<Permit> {
        if bytes > self.share {
            return None;
        }
        let sem = {
            let mut m = self.peers.lock();
            if m.len() >= PEERS_TRACKED_MAX {
                // Only entries with nothing taken: a peer's permits always come from one
                // semaphore.
                let share = self.share;
                m.retain(|_, s| s.available_permits() < share);
            }
            m.entry(peer)
                .or_insert_with(|| Arc::new(Semaphore::new(self.share)))
                .clone()
        };
        sem.try_acquire_many_owned(ByteBudget::want(bytes)).ok()
    }
}

/// The part of the egress budget (1/this) that only peers holding no egress bytes may
/// take: the room a newcomer's first answer always finds, whoever holds the rest.
pub const EGRESS_RESERVE_DIVISOR: usize = 8;

/// The node's budgets, shared by the HTTP and CXP1 listeners.
#[derive(Clone)]
pub struct Budgets {
    pub ingest: ByteBudget,
    pub egress: ByteBudget,
    /// Each peer address's share of `egress`.
    pub egress_per_peer: Arc<PeerShares>,
    pub staging: ByteBudget,
}

impl Budgets {
    /// `bytes` of the egress budget for an answer to `peer` (when known): its address's
    /// share and the node's, or `None` (busy). A peer that already holds egress bytes
    /// leaves the node's last [`EGRESS_RESERVE_DIVISOR`]th to peers that hold none, so
    /// that clients which stall from several addresses (each within its share) still
    /// leave room for a newcomer's first answer.
    pub fn take_egress(&self, peer: Option<IpAddr>, bytes: usize) -> Option<Vec<Permit>> {
        let mut permits = Vec::with_capacity(2);
        if let Some(peer) = peer {
            let holds = self.egress_per_peer.held(peer) > 0;
            let reserve = self.egress.total() / EGRESS_RESERVE_DIVISOR;
            let free = self.egress.total() - self.egress.used();
            if holds && free < bytes.saturating_add(reserve) {
                return None;
            }
            permits.push(self.egress_per_peer.try_take(peer, bytes)?);
        }
        permits.push(self.egress.try_take(bytes)?);
        Some(permits)
    }
}

impl Budgets {
    pub fn from_config(cfg: &ctxpod_format::config::Config) -> Budgets {
        Budgets {
            // At least one largest batch/put body, or such a body could never be taken.
            ingest: ByteBudget::new(
                "ingest",
                cfg.ingest_bytes_max
                    .0
                    .max(ctxpod_wire::BATCH_BODY_BYTES_MAX as u64),
            ),
            egress: ByteBudget::new("egress", cfg.egress_bytes_max.0),
            egress_per_peer: Arc::new(PeerShares::new(cfg.egress_bytes_per_peer_max.0)),
            staging: ByteBudget::new("staging", cfg.prefetch_staging_bytes.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_are_bounded_and_given_back() {
        let b = ByteBudget::new("t", 100);
        let p = b.try_take(60).expect("60 of 100");
        assert!(b.try_take(41).is_none(), "over what is left");
        assert!(b.try_take(101).is_none(), "over the whole budget");
        assert_eq!(b.used(), 60);
        drop(p);
        assert_eq!(b.used(), 0);
        assert!(
            b.try_take(0).is_some(),
            "an empty take still takes one byte"
        );
    }

    #[test]
    fn peers_that_hold_bytes_leave_the_reserve_to_newcomers() {
        let b = Budgets {
            ingest: ByteBudget::new("ingest", 100),
            egress: ByteBudget::new("egress", 800),
            egress_per_peer: Arc::new(PeerShares::new(400)),
            staging: ByteBudget::new("staging", 100),
        };
        let ip = |i: u8| IpAddr::from([10, 0, 0, i]);
        // Two stalling peers, each within its share: the first takes its whole share, the
        // second stops where only the reserve (100 of 800) is left.
        let mut held = vec![b.take_egress(Some(ip(1)), 400).expect("a's first take")];
        held.push(b.take_egress(Some(ip(2)), 200).expect("b's first take"));
        held.push(b.take_egress(Some(ip(2)), 100).expect("b within the room"));
        assert!(
            b.take_egress(Some(ip(2)), 1).is_none(),
            "b holds bytes: not the reserve"
        );
        assert!(b.take_egress(Some(ip(1)), 1).is_none(), "a neither");
        // A newcomer's first answer finds the reserve; its second does not.
        let c = b
            .take_egress(Some(ip(3)), 60)
            .expect("the newcomer is served");
        assert!(b.take_egress(Some(ip(3)), 10).is_none());
        let d = b.take_egress(Some(ip(4)), 40).expect("so is another");
        drop((c, d));
        held.clear();
        assert_eq!(b.egress.used(), 0);
        assert!(b.take_egress(Some(ip(1)), 400).is_some(), "all given back");
    }

    #[test]
    fn one_peer_takes_only_its_share() {
        let s = PeerShares::new(100);
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let held = s.try_take(a, 100).expect("a's share");
        assert!(s.try_take(a, 1).is_none(), "a's share is spent");
        assert!(s.try_take(b, 100).is_some(), "b has its own");
        drop(held);
        assert!(s.try_take(a, 100).is_some(), "given back");
    }
}
