//! KV events: which keys were stored, evicted or deleted, per namespace, so a KV-aware router
//! can send a request to where its prefix lives. One bounded broadcast queue per node; a
//! subscriber that falls behind loses the oldest events and is told how many (it should
//! resynchronise, e.g. with MATCH). Emitting costs nothing while nobody listens.

use bytes::Bytes;
use tokio::sync::broadcast;

/// Events buffered per node for the slowest subscriber.
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
    tx: broadcast::Sender<KvEvent>,
}

impl Default for Events {
    fn default() -> Self {
        Events {
            tx: broadcast::channel(EVENTS_QUEUE).0,
        }
    }
}

impl Events {
    /// Emits an event for a block key (`ns_id` ‖ key, as in the index).
    pub fn block(&self, bkey: &[u8], kind: KvEventKind) {
        if self.tx.receiver_count() == 0 || bkey.len() < 4 {
            return;
        }
        let ns_id = u32::from_be_bytes(bkey[..4].try_into().expect("4 bytes"));
        let _ = self.tx.send(KvEvent {
            ns_id,
            kind,
            key: Bytes::copy_from_slice(&bkey[4..]),
        });
    }

    pub fn namespace_deleted(&self, ns_id: u32) {
        let _ = self.tx.send(KvEvent {
            ns_id,
            kind: KvEventKind::NamespaceDeleted,
            key: Bytes::new(),
        });
    }

    pub fn subscribe(&self) -> broadcast::Receiver<KvEvent> {
        self.tx.subscribe()
    }
}
