//! Prefetch tickets as the client holds them: options, per-block state and progress,
//! waiting (all, one block, or until a deadline), the bytes landed, cancel; and KV event
//! subscriptions.

use super::*;

/// How a prefetch behaves; see `api/PROTOCOL.md` ("Prefetch policies").
#[derive(Debug, Clone, Copy)]
pub struct PrefetchOptions {
    pub policy: Policy,
    /// After this long, blocks not yet pushed are misses (status 504). Required by
    /// [`Policy::Timeout`].
    pub deadline: Option<Duration>,
    /// How long the blocks stay leased on the node after the ticket completes.
    pub lease: Duration,
}

impl Default for PrefetchOptions {
    fn default() -> Self {
        PrefetchOptions {
            policy: Policy::WaitComplete,
            deadline: None,
            lease: Duration::from_secs(10),
        }
    }
}

impl PrefetchOptions {
    /// The timeout policy with SGLang HiCache's budget: a base plus a time per block.
    pub fn timeout(base: Duration, per_block: Duration, blocks: usize) -> PrefetchOptions {
        PrefetchOptions {
            policy: Policy::Timeout,
            deadline: Some(base + per_block * blocks as u32),
            ..Default::default()
        }
    }
}

/// What became of one prefetch entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockState {
    /// Not pushed yet.
    Pending,
    /// Its `len` bytes are in the region at the entry's offset, CRC32C checked.
    Landed { len: u32 },
    /// Not delivered: 404 not on the node, 504 past the deadline, 499 cancelled, 503 no
    /// staging room (best effort), 413 longer than the entry's `max_len`, 500 node error.
    Missed { status: u16 },
    /// Arrived with a CRC32C that does not match its bytes: do not use.
    Corrupt,
    /// The connection closed before the node answered for this entry.
    Lost,
}

impl BlockState {
    pub fn is_final(&self) -> bool {
        !matches!(self, BlockState::Pending)
    }
}

/// A ticket's progress: per entry, its state; and whether the node has finished it.
#[derive(Debug, Clone)]
pub struct Progress {
    pub blocks: Vec<BlockState>,
    pub landed: u32,
    pub missed: u32,
    /// Entry indices in the order they became final (landed or missed).
    pub order: Vec<u32>,
    /// The node sent `PrefetchDone` (or the connection closed): no more pushes.
    pub done: bool,
}

impl Progress {
    pub(crate) fn new(n: usize) -> Progress {
        Progress {
            blocks: vec![BlockState::Pending; n],
            landed: 0,
            missed: 0,
            order: Vec::new(),
            done: false,
        }
    }

    pub(crate) fn set(&mut self, i: usize, s: BlockState) {
        if self.blocks[i].is_final() {
            return;
        }
        match s {
            BlockState::Landed { .. } => self.landed += 1,
            BlockState::Pending => return,
            _ => self.missed += 1,
        }
        self.blocks[i] = s;
        self.order.push(i as u32);
    }
}

pub(crate) struct TicketState {
    pub(crate) region: Arc<RegionInner>,
    /// Per entry: offset and reserved length.
    pub(crate) ranges: Vec<(u64, u64)>,
    pub(crate) progress: watch::Sender<Progress>,
    /// Set once, when the node is done with the ticket (or the connection closed): what
    /// [`Ticket::wait`] waits on, so that a waiter is woken once, not on every push.
    pub(crate) finished: watch::Sender<bool>,
    /// The caller's `Ticket` and the node's pushes: the ranges are freed when both are
    /// over, by whichever ends last, before it wakes anyone.
    pub(crate) holders: std::sync::atomic::AtomicU8,
    pub(crate) released: std::sync::atomic::AtomicBool,
    /// Entries whose large value is landing piece by piece: the bytes landed so far.
    pub(crate) landing: Mutex<HashMap<usize, u64>>,
}

impl TicketState {
    pub(crate) fn release_one(&self) {
        if self.holders.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.unreserve();
        }
    }

    pub(crate) fn unreserve(&self) {
        if !self.released.swap(true, Ordering::AcqRel) {
            self.region.unreserve(&self.ranges);
        }
    }

    /// The node is done with the ticket (or the connection closed): entries not answered
    /// are lost; the ranges are released (if the caller is done too) before waking waiters.
    pub(crate) fn finish(&self) {
        self.release_one();
        self.progress.send_modify(|p| {
            for i in 0..p.blocks.len() {
                p.set(i, BlockState::Lost);
            }
            p.done = true;
        });
        self.finished.send_replace(true);
    }
}

impl Drop for TicketState {
    fn drop(&mut self) {
        // A prefetch the node refused never had a `Ticket`.
        self.unreserve();
    }
}

/// A live prefetch. Dropping it cancels what the node has not pushed yet and ends its lease.
pub struct Ticket {
    pub(crate) id: u64,
    pub(crate) state: Arc<TicketState>,
    pub(crate) client: Arc<ClientInner>,
    /// Whether the blocks stay leased after the ticket (a lease to end when it drops).
    pub(crate) leased: bool,
    /// The caller's hold on the ranges was given back ([`Ticket::release`]).
    pub(crate) released: std::sync::atomic::AtomicBool,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        // The ticket's life ends here: the node stops pushing (if it still is) and releases
        // the lease; the region's ranges are free once the node has sent `PrefetchDone`.
        if !self.released.swap(true, Ordering::AcqRel) {
            self.state.release_one();
        }
        // Finished with no lease: there is nothing left on the node to stop.
        if !self.leased && self.state.progress.borrow().done {
            return;
        }
        let client = self.client.clone();
        let id = self.id;
        if let Ok(h) = tokio::runtime::Handle::try_current() {
            h.spawn(async move {
                let _ = client.call(&Request::Cancel { ticket: id }).await;
            });
        }
    }
}

impl Ticket {
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The ticket's state now.
    pub fn poll(&self) -> Progress {
        self.state.progress.borrow().clone()
    }

    /// Waits until `pred` holds of the progress.
    pub(crate) async fn until(&self, mut pred: impl FnMut(&Progress) -> bool) -> Progress {
        let mut rx = self.state.progress.subscribe();
        loop {
            {
                let p = rx.borrow_and_update();
                if pred(&p) {
                    return p.clone();
                }
            }
            if rx.changed().await.is_err() {
                return self.poll();
            }
        }
    }

    /// Waits for entry `i` to land or miss (decode can start on the first blocks while
    /// the rest stream in).
    pub async fn block(&self, i: usize) -> BlockState {
        self.until(|p| p.blocks.get(i).is_none_or(|b| b.is_final()) || p.done)
            .await
            .blocks
            .get(i)
            .copied()
            .unwrap_or(BlockState::Lost)
    }

    /// Waits until the node has finished the ticket (every entry landed or missed).
    pub async fn wait(&self) -> Progress {
        let mut finished = self.state.finished.subscribe();
        // An error means the sender is gone, which happens only with the ticket's state.
        let _ = finished.wait_for(|done| *done).await;
        self.poll()
    }

    /// Like [`Ticket::wait`], but returns at `timeout` with what has landed by then (the
    /// client side of a timeout policy; the node goes on unless cancelled).
    pub async fn wait_for(&self, timeout: Duration) -> Progress {
        tokio::time::timeout(timeout, self.wait())
            .await
            .unwrap_or_else(|_| self.poll())
    }

    /// Gives the ticket's ranges of the region back once the node has finished it (true if
    /// so, now or before; false while it runs): a later prefetch may then target the same
    /// bytes, and [`Ticket::data`] answers `None`. The lease is untouched (it ends when
    /// the ticket drops).
    pub fn release(&self) -> bool {
        if !self.state.progress.borrow().done {
            return false;
        }
        if !self.released.swap(true, Ordering::AcqRel) {
            self.state.release_one();
        }
        true
    }

    /// The bytes of entry `i` in the region, once landed (and until [`Ticket::release`]).
    pub fn data(&self, i: usize) -> Option<&[u8]> {
        if self.released.load(Ordering::Acquire) {
            return None;
        }
        let BlockState::Landed { len } = *self.state.progress.borrow().blocks.get(i)? else {
            return None;
        };
        let (offset, _) = self.state.ranges[i];
        // SAFETY: a landed entry of a live ticket is never written again (module docs of
        // `region`), and this ticket keeps the range reserved while `self` is borrowed.
        Some(unsafe { self.state.region.slice(offset, len as usize) })
    }

    /// Asks the node to stop: entries not pushed yet become misses (status 499), and the
    /// lease ends. Pushes already on the wire may still land; [`Ticket::wait`] then returns.
    pub async fn cancel(&self) -> Result<(), TransferError> {
        match self.client.call(&Request::Cancel { ticket: self.id }).await {
            Ok(_) => Ok(()),
            // The ticket already ended on the node.
            Err(TransferError::Refused { status, .. }) if status == status::NOT_FOUND => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// One `Event` frame's worth of KV events.
#[derive(Debug, Clone)]
pub struct EventBatch {
    /// Events the node or this client dropped before these (a slow subscriber): resync.
    pub lost: u64,
    pub events: Vec<(EventKind, Bytes)>,
}

/// A live KV event subscription; dropping it cancels it on the node.
pub struct Subscription {
    pub(crate) id: u64,
    pub(crate) rx: mpsc::Receiver<EventBatch>,
    pub(crate) lost: Arc<AtomicU64>,
    pub(crate) client: Arc<ClientInner>,
}

impl Subscription {
    /// The next batch of events; `None` when the subscription ended (namespace deleted,
    /// connection closed).
    pub async fn next(&mut self) -> Option<EventBatch> {
        let mut b = self.rx.recv().await?;
        b.lost += self.lost.swap(0, Ordering::Relaxed);
        Some(b)
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let client = self.client.clone();
        let id = self.id;
        if let Ok(h) = tokio::runtime::Handle::try_current() {
            h.spawn(async move {
                let _ = client.call(&Request::Cancel { ticket: id }).await;
                client.shared.streams.lock().expect("streams").remove(&id);
            });
        }
    }
}
