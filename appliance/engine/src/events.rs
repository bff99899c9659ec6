//! KV events: which keys were stored, evicted or deleted, per namespace, so a KV-aware router
//! can send a request to where its prefix lives. One bounded broadcast queue per namespace
//! that has subscribers; a subscriber that falls behind loses the oldest events of its own
//! namespace and is told how many (it should resynchronise, e.g. with MATCH): another
//! tenant's traffic neither costs it events nor shows in its count. Emitting costs nothing
//! for a namespace nobody listens to.

use bytes::Bytes;
use std::collections::HashMap;
use tokio::sync::broadcast;

/// Events buffered per namespace for its slowest subscriber.
pub const EVENTS_QUEUE: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvEventKind {
    Stored,
    Evicted,
    Deleted,
    /// The namespace itself was deleted: its subscriptions end.
    NamespaceDeleted,
}

#[derive(Debug, Clone)]
pub struct KvEvent {
    pub ns_id: u32,
    pub kind: KvEventKind,
    /// The block's key (empty for `NamespaceDeleted`).
    pub key: Bytes,
}

pub struct Events {
    /// Namespace id → its queue, while it has (or recently had) subscribers.
    by_ns: parking_lot::RwLock<HashMap<u32, broadcast::Sender<KvEvent>>>,
    /// Most queues at once (`event_queues_max`): each holds up to [`EVENTS_QUEUE`] events
    /// of about 80 bytes and a key (≤ 128 bytes), so at most ~0.8 MiB.
    max: usize,
}

/// Every namespace that may have subscribers has a queue already (`event_queues_max`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("event queues are at event_queues_max")]
pub struct QueuesFull;

impl Default for Events {
    fn default() -> Self {
        Events::new(256)
    }
}

impl Events {
    /// Emits an event for a block key (`ns_id` ‖ key, as in the index).
    pub fn block(&self, bkey: &[u8], kind: KvEventKind) {
        if bkey.len() < 4 {
            return;
        }
        let ns_id = u32::from_be_bytes(bkey[..4].try_into().expect("4 bytes"));
        let m = self.by_ns.read();
        let Some(tx) = m.get(&ns_id).filter(|tx| tx.receiver_count() > 0) else {
            return;
        };
        let _ = tx.send(KvEvent {
            ns_id,
            kind,
            key: Bytes::copy_from_slice(&bkey[4..]),
        });
    }

    /// The namespace is gone: its subscribers are told, and its queue dropped.
    pub fn namespace_deleted(&self, ns_id: u32) {
        if let Some(tx) = self.by_ns.write().remove(&ns_id) {
            let _ = tx.send(KvEvent {
                ns_id,
                kind: KvEventKind::NamespaceDeleted,
                key: Bytes::new(),
            });
        }
    }

    pub fn new(max: usize) -> Events {
        Events {
            by_ns: Default::default(),
            max,
        }
    }

    /// A receiver of namespace `ns_id`'s events. Queues nobody listens to any more are let
    /// go here; a new queue beyond `max` is refused (the fan-out's memory is bounded:
    /// subscribers of one namespace share its queue).
    pub fn subscribe(&self, ns_id: u32) -> Result<broadcast::Receiver<KvEvent>, QueuesFull> {
        let mut m = self.by_ns.write();
        m.retain(|id, tx| *id == ns_id || tx.receiver_count() > 0);
        if !m.contains_key(&ns_id) && m.len() >= self.max {
            return Err(QueuesFull);
        }
        Ok(m.entry(ns_id)
            .or_insert_with(|| broadcast::channel(EVENTS_QUEUE).0)
            .subscribe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bkey(ns: u32, key: &[u8]) -> Vec<u8> {
        let mut k = ns.to_be_bytes().to_vec();
        k.extend_from_slice(key);
        k
    }

    /// A subscriber's losses count only its own namespace's events.
    #[test]
    fn another_namespace_costs_a_subscriber_nothing() {
        let e = Events::default();
        let mut mine = e.subscribe(1).expect("room");
        let _theirs = e.subscribe(2).expect("room");
        e.block(&bkey(1, b"a"), KvEventKind::Stored);
        for i in 0..(2 * EVENTS_QUEUE as u32) {
            e.block(&bkey(2, &i.to_be_bytes()), KvEventKind::Stored);
        }
        let ev = mine.try_recv().expect("its own event, not lagged");
        assert_eq!((ev.ns_id, &ev.key[..]), (1, &b"a"[..]));
        assert!(mine.try_recv().is_err(), "nothing of namespace 2");
        e.namespace_deleted(1);
        assert_eq!(
            mine.try_recv().expect("told").kind,
            KvEventKind::NamespaceDeleted
        );
    }

    /// The fan-out is bounded: at most `max` queues, shared by a namespace's subscribers;
    /// a queue nobody listens to makes room again.
    #[test]
    fn event_queues_are_bounded() {
        let e = Events::new(2);
        let a1 = e.subscribe(1).expect("room");
        let _a2 = e.subscribe(1).expect("the same queue");
        let b = e.subscribe(2).expect("room");
        assert_eq!(e.subscribe(3).unwrap_err(), QueuesFull);
        drop(b);
        let _c = e.subscribe(3).expect("b's queue was let go");
        drop(a1);
        assert_eq!(
            e.subscribe(4).unwrap_err(),
            QueuesFull,
            "1 still has a subscriber"
        );
    }
}
