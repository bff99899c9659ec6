//! What a pod-wide call hands back while it runs: the merged KV-event stream of every
//! member ([`PodSubscription`]) and a prefetch over several members ([`PodTicket`]).

use crate::transfer_client::{
    BlockState, EventBatch, Progress, Subscription, Ticket, TransferError,
};
use std::time::Duration;
use tokio::sync::mpsc;

/// Moves one member's events into the merged stream until either end goes away.
pub(super) async fn forward(mut sub: Subscription, tx: mpsc::Sender<EventBatch>) {
    loop {
        tokio::select! {
            b = sub.next() => match b {
                Some(b) => {
                    if tx.send(b).await.is_err() {
                        return;
                    }
                }
                None => return,
            },
            _ = tx.closed() => return,
        }
    }
}

/// The KV events of every member of a pod; dropping it ends each member's subscription.
pub struct PodSubscription {
    pub(super) rx: mpsc::Receiver<EventBatch>,
}

impl PodSubscription {
    /// The next batch of events from any member; `None` once every member's subscription
    /// ended.
    pub async fn next(&mut self) -> Option<EventBatch> {
        self.rx.recv().await
    }
}

/// A prefetch over several members (and regions): one ticket per (member, region) inside.
/// Dropping it cancels what is not pushed yet, on every member.
pub struct PodTicket {
    pub(super) parts: Vec<(Ticket, Vec<usize>)>,
    /// Entry → (part, its index in the part).
    pub(super) index: Vec<(usize, usize)>,
}

impl PodTicket {
    /// Entries of the prefetch.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The state now, over every member: `order` lists each member's entries in the order
    /// they became final, member after member.
    pub fn poll(&self) -> Progress {
        let mut all = Progress::new(self.index.len());
        let mut done = true;
        for (t, idx) in &self.parts {
            let p = t.poll();
            done &= p.done;
            for &local in &p.order {
                all.set(idx[local as usize], p.blocks[local as usize]);
            }
        }
        all.done = done;
        all
    }

    /// Waits until every member has finished its part.
    pub async fn wait(&self) -> Progress {
        for (t, _) in &self.parts {
            t.wait().await;
        }
        self.poll()
    }

    /// Like [`PodTicket::wait`], but returns at `timeout` with what has landed by then.
    pub async fn wait_for(&self, timeout: Duration) -> Progress {
        tokio::time::timeout(timeout, self.wait())
            .await
            .unwrap_or_else(|_| self.poll())
    }

    /// Waits for entry `i` to land or miss.
    pub async fn block(&self, i: usize) -> BlockState {
        match self.index.get(i) {
            Some(&(p, local)) => self.parts[p].0.block(local).await,
            None => BlockState::Lost,
        }
    }

    /// The bytes of entry `i` in its region, once landed.
    pub fn data(&self, i: usize) -> Option<&[u8]> {
        let &(p, local) = self.index.get(i)?;
        self.parts[p].0.data(local)
    }

    /// [`Ticket::release`] of every part: true once all are finished and released.
    pub fn release(&self) -> bool {
        self.parts
            .iter()
            .fold(true, |all, (t, _)| t.release() && all)
    }

    /// Asks every member to stop (see [`Ticket::cancel`]).
    pub async fn cancel(&self) -> Result<(), TransferError> {
        for (t, _) in &self.parts {
            t.cancel().await?;
        }
        Ok(())
    }
}
