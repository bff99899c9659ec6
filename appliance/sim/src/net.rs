//! The simulated network: which member reaches etcd, which reaches which, and whether etcd
//! runs at all. A cut is a black hole (a call waits out its timeout, as over a cut link);
//! etcd down refuses at once (a reset, as when nothing listens). A call whose answer would
//! cross a link cut while it was in flight is lost after it took effect, as on a real
//! network. Every call across it takes a moment, derived from the run's seed, the moment
//! it is sent and its two ends (not drawn from one stream: the order in which tasks waiting
//! on the same instant run must not change the run): most from 50 µs to 3 ms, one in 50 up
//! to 200 ms (a queue, a retransmit), so that calls made together arrive in any order; one
//! in 1,000 is lost on its way (a black hole for that call alone) until the network is
//! healed for good.

use ctxpod_firmware_sim::rng::Rng;
use ctxpod_pod::meta::{Kv, Meta, Refused, Watch};
use futures::StreamExt;
use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

/// How long a call into a black hole waits before it fails (the etcd client's per-call
/// timeout, and the node's forward deadline for a delete).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// How often a stalled watch looks whether its link is back.
const STALL_POLL: Duration = Duration::from_millis(100);

#[derive(Default)]
struct State {
    /// Members cut from etcd.
    from_meta: BTreeSet<usize>,
    /// One-way cuts between members: `(from, to)` loses what `from` sends `to`.
    links: BTreeSet<(usize, usize)>,
    /// etcd is not running (every call refused).
    meta_down: bool,
    /// No call is lost any more (healed for good).
    lossless: bool,
}

/// The network of one simulated pod.
pub struct Net {
    state: Mutex<State>,
    /// Each call's delay, and whether it is lost, derive from it.
    seed: u64,
    started: tokio::time::Instant,
}

/// What a member's call to etcd meets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    Up,
    /// A black hole.
    Silent,
    /// Refused at once.
    Refused,
}

impl Net {
    pub fn new(seed: u64) -> Net {
        Net {
            state: Mutex::new(State::default()),
            seed,
            started: tokio::time::Instant::now(),
        }
    }

    /// The way across of a call from `from` to `to` (`None`: etcd) sent now: waits its
    /// delay; `false` when the call is lost.
    pub async fn cross(&self, from: usize, to: Option<usize>) -> bool {
        let at = self.started.elapsed().as_nanos() as u64;
        let to = to.map_or(u64::MAX, |t| t as u64);
        let mut rng = Rng::new(self.seed ^ at.rotate_left(17) ^ (from as u64).rotate_left(41) ^ to);
        let us = match rng.below(50) {
            0 => 3_000 + rng.below(197_000),
            _ => 50 + rng.below(2_950),
        };
        let lost = rng.below(1_000) == 0 && !self.state.lock().lossless;
        tokio::time::sleep(Duration::from_micros(us)).await;
        !lost
    }

    /// From now on no call is lost (delays stay).
    pub fn lossless(&self) {
        self.state.lock().lossless = true;
    }

    pub fn meta(&self, m: usize) -> Reach {
        let s = self.state.lock();
        if s.meta_down {
            Reach::Refused
        } else if s.from_meta.contains(&m) {
            Reach::Silent
        } else {
            Reach::Up
        }
    }

    /// Whether a request from `a` to `b` and its answer both get through.
    pub fn both_ways(&self, a: usize, b: usize) -> bool {
        let s = self.state.lock();
        a == b || !(s.links.contains(&(a, b)) || s.links.contains(&(b, a)))
    }

    pub fn cut_from_meta(&self, m: usize) {
        self.state.lock().from_meta.insert(m);
    }

    /// Cuts `m` from etcd and from every other member, both ways (clients still reach it).
    pub fn isolate(&self, m: usize, members: usize) {
        let mut s = self.state.lock();
        s.from_meta.insert(m);
        for o in (0..members).filter(|&o| o != m) {
            s.links.insert((m, o));
            s.links.insert((o, m));
        }
    }

    /// Loses what `from` sends `to` (answers included).
    pub fn cut_one_way(&self, from: usize, to: usize) {
        self.state.lock().links.insert((from, to));
    }

    pub fn is_meta_down(&self) -> bool {
        self.state.lock().meta_down
    }

    pub fn meta_down(&self, down: bool) {
        self.state.lock().meta_down = down;
    }

    /// Every cut healed (etcd's state is left as it is).
    pub fn heal(&self) {
        let mut s = self.state.lock();
        s.from_meta.clear();
        s.links.clear();
    }
}

/// A member's view of the coordination store, through the simulated network.
pub struct NetMeta {
    pub inner: Arc<dyn Meta>,
    pub net: Arc<Net>,
    pub me: usize,
}

impl NetMeta {
    /// Before a call: it takes its time across and may be lost on the way; then refused
    /// at once, or a black hole (waits out the timeout).
    async fn send(&self) -> anyhow::Result<()> {
        if !self.net.cross(self.me, None).await {
            tokio::time::sleep(CALL_TIMEOUT).await;
            anyhow::bail!("etcd (simulated): the call was lost");
        }
        match self.net.meta(self.me) {
            Reach::Up => Ok(()),
            Reach::Refused => {
                Err(anyhow::anyhow!("etcd (simulated): connection refused").context(Refused))
            }
            Reach::Silent => {
                tokio::time::sleep(CALL_TIMEOUT).await;
                anyhow::bail!("etcd (simulated): no answer within {CALL_TIMEOUT:?}")
            }
        }
    }

    /// After a call took effect: its answer is lost if the link went meanwhile.
    async fn answer<T>(&self, r: anyhow::Result<T>) -> anyhow::Result<T> {
        match self.net.meta(self.me) {
            Reach::Up => r,
            _ => {
                tokio::time::sleep(CALL_TIMEOUT).await;
                anyhow::bail!("etcd (simulated): the answer was lost")
            }
        }
    }
}

#[async_trait::async_trait]
impl Meta for NetMeta {
    fn describe(&self) -> String {
        format!("simulated network to {}", self.inner.describe())
    }
    async fn grant(&self, ttl_s: i64) -> anyhow::Result<i64> {
        self.send().await?;
        self.answer(self.inner.grant(ttl_s).await).await
    }
    async fn keepalive(&self, lease: i64) -> anyhow::Result<Option<i64>> {
        self.send().await?;
        self.answer(self.inner.keepalive(lease).await).await
    }
    async fn revoke(&self, lease: i64) -> anyhow::Result<()> {
        self.send().await?;
        self.answer(self.inner.revoke(lease).await).await
    }
    async fn put(&self, key: &str, value: &[u8], lease: Option<i64>) -> anyhow::Result<()> {
        self.send().await?;
        self.answer(self.inner.put(key, value, lease).await).await
    }
    async fn delete(&self, key: &str) -> anyhow::Result<()> {
        self.send().await?;
        self.answer(self.inner.delete(key).await).await
    }
    async fn get(&self, key: &str) -> anyhow::Result<Option<Kv>> {
        self.send().await?;
        self.answer(self.inner.get(key).await).await
    }
    async fn cas_put(&self, key: &str, value: &[u8], expected: i64) -> anyhow::Result<bool> {
        self.send().await?;
        self.answer(self.inner.cas_put(key, value, expected).await)
            .await
    }
    async fn leases(&self) -> anyhow::Result<Vec<i64>> {
        self.send().await?;
        self.answer(self.inner.leases().await).await
    }
    async fn range_prefix(&self, prefix: &str) -> anyhow::Result<(i64, Vec<Kv>)> {
        self.send().await?;
        self.answer(self.inner.range_prefix(prefix).await).await
    }
    async fn watch_prefix(&self, prefix: &str, start: i64) -> anyhow::Result<Watch> {
        self.send().await?;
        let inner = self
            .answer(self.inner.watch_prefix(prefix, start).await)
            .await?;
        // A watch over a cut link stalls (its events wait until the link is back); etcd
        // going down resets it.
        let stalled = Stalled {
            inner,
            net: self.net.clone(),
            me: self.me,
            held: None,
            done: false,
        };
        Ok(Box::pin(futures::stream::unfold(
            stalled,
            |mut w| async move {
                let item = w.next().await?;
                Some((item, w))
            },
        )))
    }
    async fn compact(&self, revision: i64) -> anyhow::Result<()> {
        self.send().await?;
        self.answer(self.inner.compact(revision).await).await
    }
}

/// A watch seen through the simulated network.
struct Stalled {
    inner: Watch,
    net: Arc<Net>,
    me: usize,
    /// An event batch that arrived while the link was cut.
    held: Option<anyhow::Result<Vec<ctxpod_pod::meta::WatchEvent>>>,
    done: bool,
}

impl Stalled {
    async fn next(&mut self) -> Option<anyhow::Result<Vec<ctxpod_pod::meta::WatchEvent>>> {
        if self.done {
            return None;
        }
        loop {
            match self.net.meta(self.me) {
                Reach::Refused => {
                    self.done = true;
                    return Some(Err(anyhow::anyhow!("etcd (simulated): watch reset")));
                }
                Reach::Silent => {
                    tokio::time::sleep(STALL_POLL).await;
                    continue;
                }
                Reach::Up => {}
            }
            if let Some(item) = self.held.take() {
                return Some(item);
            }
            tokio::select! {
                biased;
                item = self.inner.next() => match item {
                    None => {
                        self.done = true;
                        return None;
                    }
                    Some(item) => self.held = Some(item),
                },
                _ = tokio::time::sleep(STALL_POLL) => {}
            }
        }
    }
}
