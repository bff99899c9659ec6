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
//! entry where it has entries, and counted in `ctxpod_busy_rejections_total{queue}`, with
//! one exception: a client over its own share of `egress` ([`ClientShares`]) waits for it,
//! up to `egress_wait_ms`, when the request holds none of it yet ([`EgressTaker`]).

use crate::auth::Principal;
use ctxpod_engine::metrics::register;
use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

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

/// Who an answer's bytes are charged to: one credential on one address. With
/// authentication off every caller is `anonymous`, so the clients of one address are one
/// client; with it on, two tokens (or certificates) on one address are two clients, and one
/// token used from two addresses is two.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Client {
    pub addr: IpAddr,
    /// The token id or certificate subject.
    pub id: Arc<str>,
    /// The credential's fingerprint ([`Principal::credential`]): a token re-created under the
    /// same id is another client.
    pub credential: u64,
}

impl Client {
    pub fn new(addr: IpAddr, p: &Principal) -> Client {
        Client {
            addr,
            id: p.id.clone(),
            credential: p.credential,
        }
    }

    /// The client of `p` at `addr`, when the listener gave the address.
    pub fn at(addr: Option<IpAddr>, p: &Principal) -> Option<Client> {
        addr.map(|a| Client::new(a, p))
    }
}

/// Shares of a budget per [`Client`]: a client holds at most `share` bytes of it, so that
/// a client that stalls leaves the rest of the budget to everyone else.
pub struct ClientShares {
    share: usize,
    clients: parking_lot::Mutex<HashMap<Client, Arc<Semaphore>>>,
}

/// Clients tracked before idle entries (nothing held, nobody waiting) are let go.
pub const CLIENTS_TRACKED_MAX: usize = 4096;

impl ClientShares {
    pub fn new(share: u64) -> ClientShares {
        ClientShares {
            share: (share as usize).clamp(1, Semaphore::MAX_PERMITS),
            clients: parking_lot::Mutex::new(HashMap::new()),
        }
    }

    pub fn share(&self) -> usize {
        self.share
    }

    /// Clients tracked now.
    pub fn tracked(&self) -> usize {
        self.clients.lock().len()
    }

    /// `client`'s share. Every permit of a client's comes from this one semaphore: an entry
    /// is let go only when nothing but the map holds it (a permit and a waiter each hold
    /// the `Arc`).
    fn of(&self, client: &Client) -> Arc<Semaphore> {
        let mut m = self.clients.lock();
        if m.len() >= CLIENTS_TRACKED_MAX && !m.contains_key(client) {
            m.retain(|_, s| Arc::strong_count(s) > 1);
        }
        m.entry(client.clone())
            .or_insert_with(|| Arc::new(Semaphore::new(self.share)))
            .clone()
    }

    /// Bytes of `client`'s share it holds now.
    pub fn held(&self, client: &Client) -> usize {
        self.clients
            .lock()
            .get(client)
            .map_or(0, |s| self.share - s.available_permits())
    }

    /// `bytes` of `client`'s share now, or `None` when it does not have them.
    pub fn try_take(&self, client: &Client, bytes: usize) -> Option<Permit> {
        if bytes > self.share {
            return None;
        }
        self.of(client)
            .try_acquire_many_owned(ByteBudget::want(bytes))
            .ok()
    }
}

/// The part of the egress budget (1/this) that only clients holding no egress bytes may
/// take: the room a newcomer's first answer always finds, whoever holds the rest.
pub const EGRESS_RESERVE_DIVISOR: usize = 8;

/// Requests waiting for their client's share at once, node-wide; more are answered busy at
/// once (`ctxpod_budget_waits_total{outcome="full"}`).
pub const EGRESS_WAITERS_MAX: usize = 1024;

/// The budgets' own series: how full each is, who waits.
#[derive(Clone)]
pub struct BudgetMetrics {
    /// `ctxpod_budget_used_bytes{budget}`, set at each scrape ([`Budgets::publish`]).
    used: IntGaugeVec,
    /// `ctxpod_budget_limit_bytes{budget}`.
    limit: IntGaugeVec,
    /// `ctxpod_budget_clients{budget}`: clients whose share is tracked.
    clients: IntGaugeVec,
    /// `ctxpod_budget_waiting{queue}`: requests waiting for their client's share now.
    waiting: IntGaugeVec,
    /// `ctxpod_budget_waits_total{queue, outcome}`: `served`, `timed_out`, `full`.
    waits: IntCounterVec,
}

impl BudgetMetrics {
    pub fn new(r: &Registry) -> BudgetMetrics {
        let gauges = |name: &str, help: &str, label: &str| {
            register(r, IntGaugeVec::new(Opts::new(name, help), &[label]))
        };
        BudgetMetrics {
            used: gauges(
                "ctxpod_budget_used_bytes",
                "Bytes of each byte budget taken now (ingest, egress, staging)",
                "budget",
            ),
            limit: gauges(
                "ctxpod_budget_limit_bytes",
                "Each byte budget's size (egress_share: one client's share of egress)",
                "budget",
            ),
            clients: gauges(
                "ctxpod_budget_clients",
                "Clients (a credential on an address) whose share of the budget is tracked",
                "budget",
            ),
            waiting: gauges(
                "ctxpod_budget_waiting",
                "Requests waiting for their client's share of the budget",
                "queue",
            ),
            waits: register(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "ctxpod_budget_waits_total",
                        "Waits for a client's share, by outcome: served, timed_out, full (too many waiting)",
                    ),
                    &["queue", "outcome"],
                ),
            ),
        }
    }
}

/// The node's budgets, shared by the HTTP and CXP1 listeners.
#[derive(Clone)]
pub struct Budgets {
    pub ingest: ByteBudget,
    pub egress: ByteBudget,
    /// Each client's share of `egress`.
    pub egress_per_client: Arc<ClientShares>,
    /// How long a request over its client's share may wait for it (zero: not at all).
    pub egress_wait: Duration,
    pub staging: ByteBudget,
    waiters: Arc<AtomicUsize>,
    metrics: BudgetMetrics,
}

impl Budgets {
    /// Budgets of these sizes (bytes), their series registered in `r`.
    pub fn new(
        r: &Registry,
        [ingest, egress, share, staging]: [u64; 4],
        egress_wait: Duration,
    ) -> Budgets {
        let b = Budgets {
            ingest: ByteBudget::new("ingest", ingest),
            egress: ByteBudget::new("egress", egress),
            egress_per_client: Arc::new(ClientShares::new(share)),
            egress_wait,
            staging: ByteBudget::new("staging", staging),
            waiters: Arc::new(AtomicUsize::new(0)),
            metrics: BudgetMetrics::new(r),
        };
        for (name, bytes) in [
            ("ingest", b.ingest.total()),
            ("egress", b.egress.total()),
            ("egress_share", b.egress_per_client.share()),
            ("staging", b.staging.total()),
        ] {
            b.metrics.limit.with_label_values(&[name]).set(bytes as i64);
        }
        b.publish();
        b
    }

    pub fn from_config(cfg: &ctxpod_format::config::Config, r: &Registry) -> Budgets {
        Budgets::new(
            r,
            [
                // At least one largest batch/put body, or such a body could never be taken.
                cfg.ingest_bytes_max
                    .0
                    .max(ctxpod_wire::BATCH_BODY_BYTES_MAX as u64),
                cfg.egress_bytes_max.0,
                cfg.egress_bytes_per_peer_max.0,
                cfg.prefetch_staging_bytes.0,
            ],
            Duration::from_millis(cfg.egress_wait_ms),
        )
    }

    /// Sets the gauges of how full each budget is (at each scrape).
    pub fn publish(&self) {
        let m = &self.metrics;
        for b in [&self.ingest, &self.egress, &self.staging] {
            m.used.with_label_values(&[b.name]).set(b.used() as i64);
        }
        m.clients
            .with_label_values(&["egress"])
            .set(self.egress_per_client.tracked() as i64);
    }

    /// One request's takes from the egress budget, charged to `client` (when the listener
    /// knows who it is); it may wait for the client's share until `egress_wait` from now.
    pub fn egress_for(&self, client: Option<Client>) -> EgressTaker<'_> {
        EgressTaker {
            budgets: self,
            client,
            until: Instant::now() + self.egress_wait,
            held: false,
        }
    }
}

/// Takes one request's answer bytes from the egress budget ([`Budgets::egress_for`]), block
/// by block: each from the client's share and then the node's.
///
/// - A client over its share **waits** for it (FIFO, until the request's deadline), but only
///   while this request holds none of the share: a request never waits holding bytes, so
///   requests of one client cannot wait on each other. Its later blocks are taken only if
///   they fit at once (503 / `BUSY` for the rest: ask again).
/// - A client that holds egress bytes (this request's or others') leaves the node's last
///   [`EGRESS_RESERVE_DIVISOR`]th to clients that hold none, so that clients which stall
///   from several places (each within its share) still leave room for a newcomer's first
///   answer.
/// - The node's budget spent by others: busy at once.
pub struct EgressTaker<'a> {
    budgets: &'a Budgets,
    client: Option<Client>,
    until: Instant,
    /// Whether this request took bytes already.
    held: bool,
}

impl EgressTaker<'_> {
    /// `bytes` for one block of the answer, or `None` (busy).
    pub async fn take(&mut self, bytes: usize) -> Option<Vec<Permit>> {
        let b = self.budgets;
        let mut permits = Vec::with_capacity(2);
        if let Some(client) = &self.client {
            let shares = &b.egress_per_client;
            if bytes > shares.share() {
                return None;
            }
            let sem = shares.of(client);
            let want = ByteBudget::want(bytes);
            let mine = match sem.clone().try_acquire_many_owned(want) {
                Ok(p) => p,
                Err(_) if !self.held && b.egress_wait > Duration::ZERO => {
                    self.wait_for(sem.clone(), want).await?
                }
                Err(_) => return None,
            };
            // Held before this take: the share less what is free, less this take.
            let held_before =
                (shares.share() - sem.available_permits()).saturating_sub(want as usize);
            let reserve = b.egress.total() / EGRESS_RESERVE_DIVISOR;
            let free = b.egress.total() - b.egress.used();
            if held_before > 0 && free < bytes.saturating_add(reserve) {
                return None;
            }
            permits.push(mine);
        }
        permits.push(b.egress.try_take(bytes)?);
        self.held = true;
        Some(permits)
    }

    /// Waits for `want` bytes of the client's share `sem` until the deadline.
    async fn wait_for(&self, sem: Arc<Semaphore>, want: u32) -> Option<Permit> {
        let b = self.budgets;
        let m = &b.metrics;
        let outcome = |o: &str| m.waits.with_label_values(&["egress", o]).inc();
        if b.waiters.fetch_add(1, Ordering::Relaxed) >= EGRESS_WAITERS_MAX {
            b.waiters.fetch_sub(1, Ordering::Relaxed);
            outcome("full");
            return None;
        }
        // Counted out however the wait ends (a dropped request included).
        let _waiting = Waiting::new(b);
        match tokio::time::timeout_at(self.until, sem.acquire_many_owned(want)).await {
            Ok(Ok(p)) => {
                outcome("served");
                Some(p)
            }
            _ => {
                outcome("timed_out");
                None
            }
        }
    }
}

/// One request counted in `ctxpod_budget_waiting` (and [`EGRESS_WAITERS_MAX`]) while it
/// lives.
struct Waiting<'a>(&'a Budgets);

impl<'a> Waiting<'a> {
    fn new(b: &'a Budgets) -> Waiting<'a> {
        b.metrics.waiting.with_label_values(&["egress"]).inc();
        Waiting(b)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.metrics.waiting.with_label_values(&["egress"]).dec();
        self.0.waiters.fetch_sub(1, Ordering::Relaxed);
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

    /// Budgets of 800 egress bytes, 400 a client, waits of `wait_ms`.
    fn budgets(wait_ms: u64) -> Budgets {
        Budgets::new(
            &Registry::new(),
            [100, 800, 400, 100],
            Duration::from_millis(wait_ms),
        )
    }

    fn client(i: u8, id: &str) -> Client {
        Client {
            addr: IpAddr::from([10, 0, 0, i]),
            id: Arc::from(id),
            credential: 0,
        }
    }

    /// `a`'s whole share (400 bytes), taken by a fresh request.
    async fn whole_share(b: &Budgets, a: &Client) -> Vec<Permit> {
        b.egress_for(Some(a.clone()))
            .take(400)
            .await
            .expect("a's share")
    }

    /// Waits for the egress budget that ended with `outcome` (`served`, `timed_out`).
    fn egress_waits(b: &Budgets, outcome: &str) -> u64 {
        b.metrics
            .waits
            .with_label_values(&["egress", outcome])
            .get()
    }

    /// A take that does not wait (a fresh request each, with no waiting).
    fn now(b: &Budgets, c: &Client, bytes: usize) -> Option<Vec<Permit>> {
        let mut t = b.egress_for(Some(c.clone()));
        t.held = true;
        futures::executor::block_on(t.take(bytes))
    }

    #[test]
    fn clients_that_hold_bytes_leave_the_reserve_to_newcomers() {
        let b = budgets(0);
        let ip = |i: u8| client(i, "anonymous");
        // Two stalling clients, each within its share: the first takes its whole share,
        // the second stops where only the reserve (100 of 800) is left.
        let mut held = vec![now(&b, &ip(1), 400).expect("a's first take")];
        held.push(now(&b, &ip(2), 200).expect("b's first take"));
        held.push(now(&b, &ip(2), 100).expect("b within the room"));
        assert!(
            now(&b, &ip(2), 1).is_none(),
            "b holds bytes: not the reserve"
        );
        assert!(now(&b, &ip(1), 1).is_none(), "a neither");
        // A newcomer's first answer finds the reserve; its second does not.
        let c = now(&b, &ip(3), 60).expect("the newcomer is served");
        assert!(now(&b, &ip(3), 10).is_none());
        let d = now(&b, &ip(4), 40).expect("so is another");
        drop((c, d));
        held.clear();
        assert_eq!(b.egress.used(), 0);
        assert!(now(&b, &ip(1), 400).is_some(), "all given back");
    }

    #[test]
    fn one_client_takes_only_its_share() {
        let s = ClientShares::new(100);
        let (a, b) = (client(1, "anonymous"), client(2, "anonymous"));
        let held = s.try_take(&a, 100).expect("a's share");
        assert!(s.try_take(&a, 1).is_none(), "a's share is spent");
        assert!(s.try_take(&b, 100).is_some(), "b has its own");
        // Another credential on a's address is another client.
        assert!(
            s.try_take(&client(1, "t2"), 100).is_some(),
            "t2 on a's address"
        );
        drop(held);
        assert!(s.try_take(&a, 100).is_some(), "given back");
    }

    /// A request over its client's share that holds none of it waits, and is served when
    /// the share comes back; one that holds some does not wait; a wait ends at the
    /// deadline; the series say so.
    #[tokio::test(start_paused = true)]
    async fn a_client_over_its_share_waits_holding_nothing() {
        let b = budgets(5_000);
        let a = client(1, "a");
        let first = whole_share(&b, &a).await;
        // A second request of a's waits; a's first answer is written out meanwhile.
        let waiter = {
            let b = b.clone();
            let a = a.clone();
            tokio::spawn(async move { b.egress_for(Some(a)).take(300).await.is_some() })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(b.metrics.waiting.with_label_values(&["egress"]).get(), 1);
        assert!(!waiter.is_finished(), "waits for its share");
        drop(first);
        assert!(
            waiter.await.expect("waiter"),
            "served once the share came back"
        );
        assert_eq!(egress_waits(&b, "served"), 1);
        assert_eq!(b.metrics.waiting.with_label_values(&["egress"]).get(), 0);
        // A request that holds bytes already is refused at once over its share (it could
        // otherwise wait on itself, or a sibling on it).
        let mut t = b.egress_for(Some(a.clone()));
        let _p = t.take(300).await.expect("within the share");
        let started = Instant::now();
        assert!(t.take(200).await.is_none(), "holding bytes: no wait");
        assert_eq!(started.elapsed(), Duration::ZERO);
        // Without the share coming back, a wait ends at its deadline.
        let started = Instant::now();
        assert!(b.egress_for(Some(a.clone())).take(200).await.is_none());
        assert_eq!(started.elapsed(), Duration::from_millis(5_000));
        assert_eq!(egress_waits(&b, "timed_out"), 1);
        // Others are served at once meanwhile.
        assert!(b.egress_for(Some(client(1, "b"))).take(200).await.is_some());
        // More than the share can never be had: refused without a wait.
        assert!(b.egress_for(Some(client(3, "c"))).take(401).await.is_none());
    }

    /// With waits off, a client over its share is refused at once.
    #[tokio::test(start_paused = true)]
    async fn no_wait_when_waits_are_off() {
        let b = budgets(0);
        let a = client(1, "a");
        let _p = whole_share(&b, &a).await;
        let started = Instant::now();
        assert!(b.egress_for(Some(a)).take(1).await.is_none());
        assert_eq!(started.elapsed(), Duration::ZERO);
        assert_eq!(egress_waits(&b, "timed_out"), 0);
    }

    /// Past the tracked-clients bound, idle entries go and busy ones stay (a holder keeps
    /// its one semaphore, so it never gets a second share).
    #[test]
    fn idle_clients_are_let_go_and_holders_kept() {
        let s = ClientShares::new(10);
        let holder = client(0, "holder");
        let held = s.try_take(&holder, 10).expect("holder's share");
        for i in 0..CLIENTS_TRACKED_MAX {
            let c = Client {
                addr: IpAddr::from([10, 1, (i >> 8) as u8, i as u8]),
                id: Arc::from("x"),
                credential: 0,
            };
            drop(s.try_take(&c, 1).expect("an idle client's take"));
        }
        assert!(s.tracked() <= CLIENTS_TRACKED_MAX);
        assert!(
            s.try_take(&holder, 1).is_none(),
            "the holder's share is still spent"
        );
        assert_eq!(s.held(&holder), 10);
        drop(held);
        assert_eq!(s.held(&holder), 0);
    }
}
