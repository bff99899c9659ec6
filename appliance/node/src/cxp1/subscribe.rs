//! Subscribe: a namespace's KV events as frames, with what a slow subscriber lost.

use bytes::Bytes;
use ctxpod_engine::events::{KvEvent, KvEventKind};
use ctxpod_wire::proto::{status, EventKind, Op, Response};
use std::sync::Arc;

use super::conn::Conn;
use super::EVENTS_PER_FRAME;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

/// Streams the KV events of namespace `ns_id` until cancelled, the connection ends or the
/// namespace is deleted.
pub(crate) async fn subscription(
    conn: &Arc<Conn>,
    id: u64,
    ns_id: u32,
    mut rx: broadcast::Receiver<KvEvent>,
    token: CancellationToken,
) {
    let mut lost = 0u64;
    loop {
        let first = tokio::select! {
            _ = token.cancelled() => return,
            r = rx.recv() => r,
        };
        let mut events = Vec::new();
        let mut gone = false;
        let mut take = |r: Result<KvEvent, _>, events: &mut Vec<(EventKind, Bytes)>| match r {
            Ok(KvEvent { ns_id: n, .. }) if n != ns_id => true,
            Ok(KvEvent {
                kind: KvEventKind::NamespaceDeleted,
                ..
            }) => {
                gone = true;
                false
            }
            Ok(KvEvent { kind, key, .. }) => {
                let kind = match kind {
                    KvEventKind::Stored => EventKind::Stored,
                    KvEventKind::Evicted => EventKind::Evicted,
                    _ => EventKind::Deleted,
                };
                events.push((kind, key));
                true
            }
            Err(broadcast::error::RecvError::Lagged(n)) => {
                lost += n;
                true
            }
            Err(broadcast::error::RecvError::Closed) => false,
        };
        let mut more = take(first, &mut events);
        while more && events.len() < EVENTS_PER_FRAME {
            match rx.try_recv() {
                Ok(e) => more = take(Ok(e), &mut events),
                Err(broadcast::error::TryRecvError::Lagged(n)) => {
                    more = take(Err(broadcast::error::RecvError::Lagged(n)), &mut events)
                }
                Err(_) => break,
            }
        }
        if !events.is_empty() || lost > 0 {
            let f = Response::Events {
                lost,
                events: std::mem::take(&mut events),
            }
            .encode(Op::Event, status::OK, id);
            lost = 0;
            if !conn.send_one(f).await {
                return;
            }
        }
        if gone {
            conn.send_one(Response::Error("the namespace was deleted".into()).encode(
                Op::Subscribe,
                status::NOT_FOUND,
                id,
            ))
            .await;
            return;
        }
        if !more {
            return;
        }
    }
}
