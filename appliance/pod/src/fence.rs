//! Membership is a fence: a member serves the blocks it holds only while it can show, by
//! its own clock, that it is still in the pod — so that no member serves a block after the
//! pod acknowledged its delete.
//!
//! The pod's half of the rule is the delete's ([`crate::settle`]): a delete is acknowledged
//! once every member that may hold the block applied it, or has dropped out of the pod in
//! etcd (its lease ran out). This member's half is here:
//! - **Lease provably live.** Each keep-alive that etcd answers, sent at `t`, shows the
//!   lease lives until at least `t + TTL` on etcd's clock (etcd counts the TTL from when it
//!   receives it). The member serves until `t + TTL × (1 − `[`CLOCK_MARGIN`]`)` by its own
//!   monotonic clock: past that, etcd may have expired the lease and a delete may have
//!   been acknowledged without it.
//! - **etcd down for everyone.** When every etcd endpoint *refuses* the connection (etcd
//!   is not running there: a reset, not a silence), no lease can expire while it is down,
//!   and etcd gives every lease a whole TTL again when it starts; no delete can be
//!   acknowledged meanwhile either (its tombstone cannot be written). So a refusal while
//!   the fence is live prolongs it like an answer ([`Fence::refused`]); it never reopens
//!   a lapsed fence. A silence (a cut link, packets dropped) does not: the member is
//!   fenced a TTL after its last answer.
//! - **Caught up before serving again.** A member whose lease was lost (it was cut off
//!   longer than the TTL, or frozen) takes a new lease, puts its record, then lists the
//!   pod's tombstones and applies those it missed; only then is the fence lifted. Listing
//!   after the record is put closes the race with a delete acknowledged meanwhile: its
//!   deleter either saw this member's record (and asked it) or wrote its tombstone before
//!   the listing.
//!
//! While fenced, every read of a block through any door answers a miss
//! ([`ctxpod_engine::ServeGate`]); writes and deletes go on.
//!
//! The clock is tokio's `Instant`: `CLOCK_MONOTONIC` in a node (it runs while the process
//! is frozen, as etcd's does, so a frozen member's fence has lapsed when it thaws), the
//! virtual clock in the simulation (a runtime with paused time). A machine that suspends
//! stops `CLOCK_MONOTONIC` while etcd's clock goes on: a member must not be suspended (a
//! VM paused) for longer than the margin without being restarted.

use ctxpod_engine::ServeGate;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// The share of the lease's TTL a member does not count on: etcd's clock may run faster
/// than this member's by that much (and the TTL is in whole seconds).
pub const CLOCK_MARGIN: f64 = 0.1;

/// Whether this member may serve its blocks now (see the module's doc).
pub struct Fence {
    epoch: Instant,
    /// Milliseconds after `epoch` until which the lease is provably live (0: not now).
    live_until_ms: AtomicU64,
    /// The pod's tombstones were applied since this member's record was last put.
    caught_up: AtomicBool,
    /// Reads answered as misses while fenced.
    pub fenced_reads: prometheus::IntCounter,
    /// 1 while this member serves, 0 while it is fenced (as of the last read or renewal).
    pub serving: prometheus::IntGauge,
    /// Times the fence closed, by reason (`lease_lapsed`: no answer from etcd within the
    /// lease; `lease_lost`: etcd had expired the lease).
    pub closed: prometheus::IntCounterVec,
}

impl Fence {
    /// A fence closed until the first renewal and catch-up.
    pub fn new() -> Fence {
        Fence {
            epoch: Instant::now(),
            live_until_ms: AtomicU64::new(0),
            caught_up: AtomicBool::new(false),
            fenced_reads: prometheus::IntCounter::new(
                "ctxpod_pod_fenced_reads_total",
                "Block reads answered as misses because this member could not show it is \
                 still in the pod (its lease not provably live, or deletes not yet caught up)",
            )
            .expect("a valid metric"),
            serving: prometheus::IntGauge::new(
                "ctxpod_pod_serving",
                "1 while this member serves its blocks, 0 while it is fenced out of the pod",
            )
            .expect("a valid metric"),
            closed: prometheus::IntCounterVec::new(
                prometheus::Opts::new(
                    "ctxpod_pod_fence_closed_total",
                    "Times this member stopped serving its blocks, by reason",
                ),
                &["reason"],
            )
            .expect("a valid metric"),
        }
    }

    /// Registers its series in `r`.
    pub fn register(&self, r: &prometheus::Registry) -> prometheus::Result<()> {
        r.register(Box::new(self.fenced_reads.clone()))?;
        r.register(Box::new(self.serving.clone()))?;
        r.register(Box::new(self.closed.clone()))
    }

    fn ms(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_millis() as u64
    }

    /// etcd answered a keep-alive of a live lease sent at `sent` (or, for `refused`, every
    /// endpoint refused the connection at `sent`): the lease is live until `ttl` less the
    /// margin after it.
    pub fn renewed(&self, sent: Instant, ttl: Duration) {
        let live = ttl.mul_f64(1.0 - CLOCK_MARGIN);
        let until = self.ms(sent + live);
        let before = self.live_until_ms.fetch_max(until, Ordering::AcqRel);
        if before != 0 && before < self.ms(sent) && self.caught_up.load(Ordering::Acquire) {
            // It had lapsed before this answer came: count the gap.
            self.closed.with_label_values(&["lease_lapsed"]).inc();
        }
        self.update_gauge();
    }

    /// Every etcd endpoint refused the round sent at `sent`: etcd is down where it runs,
    /// and no lease expires while it is down, so a fence still live at `sent` is prolonged
    /// as by an answer. A fence that had lapsed is not reopened: etcd may have expired the
    /// lease before it went down (or the refusal is a firewall's, and etcd is up for the
    /// others).
    pub fn refused(&self, sent: Instant, ttl: Duration) {
        if self.ms(sent) < self.live_until_ms.load(Ordering::Acquire) {
            self.renewed(sent, ttl);
        }
    }

    /// etcd no longer has this member's lease: fenced until it registered again and caught
    /// up with the pod's deletes ([`Fence::caught_up`]).
    pub fn lease_lost(&self) {
        self.live_until_ms.store(0, Ordering::Release);
        if self.caught_up.swap(false, Ordering::AcqRel) {
            self.closed.with_label_values(&["lease_lost"]).inc();
        }
        self.update_gauge();
    }

    /// The pod's tombstones are applied since this member's record was put.
    pub fn caught_up(&self) {
        self.caught_up.store(true, Ordering::Release);
        self.update_gauge();
    }

    /// Whether this member serves now.
    pub fn open(&self) -> bool {
        self.caught_up.load(Ordering::Acquire)
            && self.ms(Instant::now()) < self.live_until_ms.load(Ordering::Acquire)
    }

    fn update_gauge(&self) {
        self.serving.set(self.open() as i64);
    }
}

impl Default for Fence {
    fn default() -> Fence {
        Fence::new()
    }
}

impl ServeGate for Fence {
    fn may_serve(&self) -> bool {
        let open = self.open();
        if !open {
            self.fenced_reads.inc();
        }
        self.serving.set(open as i64);
        open
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fence_opens_only_with_a_live_lease_and_the_deletes_caught_up() {
        let f = Fence::new();
        assert!(!f.may_serve(), "closed before the first renewal");
        let ttl = Duration::from_secs(3);
        f.renewed(Instant::now(), ttl);
        assert!(!f.may_serve(), "closed until caught up");
        f.caught_up();
        assert!(f.may_serve());
        // A renewal sent long ago proves nothing now.
        let f2 = Fence::new();
        f2.caught_up();
        f2.renewed(Instant::now() - Duration::from_secs(10), ttl);
        assert!(!f2.may_serve(), "a lease renewed 10 s ago with a 3 s TTL");
        // The margin: a renewal sent 2.8 s ago is past 3 s × 0.9.
        f2.renewed(Instant::now() - Duration::from_millis(2800), ttl);
        assert!(!f2.may_serve());
        f2.renewed(Instant::now() - Duration::from_millis(2500), ttl);
        assert!(f2.may_serve());
        // A lost lease closes it until the deletes are caught up again, renewed or not.
        f.lease_lost();
        f.renewed(Instant::now(), ttl);
        assert!(!f.may_serve());
        f.caught_up();
        assert!(f.may_serve());
        assert_eq!(f.closed.with_label_values(&["lease_lost"]).get(), 1);
        // A refusal prolongs a live fence, never reopens a lapsed one.
        let f3 = Fence::new();
        f3.caught_up();
        f3.renewed(Instant::now(), ttl);
        f3.refused(Instant::now() + Duration::from_secs(2), ttl);
        assert!(f3.may_serve());
        let f4 = Fence::new();
        f4.caught_up();
        f4.renewed(Instant::now() - Duration::from_secs(10), ttl);
        f4.refused(Instant::now(), ttl);
        assert!(!f4.may_serve(), "a refusal reopened a lapsed fence");
        assert!(f.fenced_reads.get() >= 3);
    }
}
