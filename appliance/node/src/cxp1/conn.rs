//! A connection's state: its principal, the frames waiting for the socket (bounded in
//! bytes), its regions, live tickets and subscriptions, and the activity that keeps it
//! past its idle timeout.

use crate::auth::{Authenticator, Principal};
use crate::budget::{Budgets, Permit};
use bytes::Bytes;
use ctxpod_engine::Engine;
use ctxpod_wire::proto::{status, Op, Response};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::{OUT_BYTES_PER_CONNECTION, TICKETS_PER_CONNECTION};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The read and write halves of a connection, plain or TLS.
pub(crate) type Rd = Box<dyn tokio::io::AsyncRead + Send + Unpin>;
pub(crate) type Wr = Box<dyn tokio::io::AsyncWrite + Send + Unpin>;

/// A frame on its way to the socket, holding its share of the connection's output budget
/// and, for a Get's blocks, of the node's egress budget.
pub(crate) struct Out {
    pub(crate) parts: Vec<Bytes>,
    pub(crate) _budget: Option<OwnedSemaphorePermit>,
    pub(crate) _egress: Vec<Permit>,
}

/// What every task of one connection shares.
pub(crate) struct Conn {
    pub(crate) engine: Arc<Engine>,
    /// The node's series (prefetch pushes, refusals).
    pub(crate) metrics: Arc<crate::metrics::NodeMetrics>,
    pub(crate) auth: Arc<Authenticator>,
    pub(crate) budgets: Budgets,
    pub(crate) out: mpsc::Sender<Out>,
    pub(crate) out_bytes: Arc<Semaphore>,
    /// This connection's share of the node's staging budget ([`STAGING_PER_CONNECTION`]).
    pub(crate) staging_mine: Arc<Semaphore>,
    /// Region id → size in bytes.
    pub(crate) regions: Mutex<HashMap<u32, u64>>,
    /// Live tickets and subscriptions, by id.
    pub(crate) tickets: Mutex<HashMap<u64, CancellationToken>>,
    /// Requests running ([`INFLIGHT_PER_CONNECTION`] at most; more are answered BUSY).
    pub(crate) inflight: Arc<Semaphore>,
    pub(crate) activity: Arc<Activity>,
    /// Who authenticated on this connection: checked against reloads of the credentials.
    pub(crate) who: Mutex<Option<Principal>>,
    /// Cancelled when the connection ends: every ticket and subscription stops.
    pub(crate) closed: CancellationToken,
    pub(crate) peer_max: usize,
    /// The client's address (with its credential, its share of the node's egress budget).
    pub(crate) peer: std::net::IpAddr,
}

impl Conn {
    /// Queues a frame, waiting while the connection's output budget is spent. False once
    /// the connection is closing.
    pub(crate) async fn send(&self, parts: Vec<Bytes>) -> bool {
        self.send_reserved(parts, 0, Vec::new()).await
    }

    /// [`Conn::send`] of a frame of which `reserved` bytes already hold their share of the
    /// connection's output budget, in `permits`.
    pub(crate) async fn send_reserved(
        &self,
        parts: Vec<Bytes>,
        reserved: usize,
        permits: Vec<Permit>,
    ) -> bool {
        let bytes: usize = parts.iter().map(|p| p.len()).sum();
        let permit = if reserved > 0 {
            // The frame's data already holds its share (taken when it was planned). Its
            // framing (a few bytes per entry) is taken only if free now: waiting for it
            // while holding a reservation of the same budget deadlocks as soon as the
            // frames in flight reserved all of it (three 32 MiB batch GETs on one
            // connection).
            let rest = bytes.saturating_sub(reserved).min(OUT_BYTES_PER_CONNECTION) as u32;
            self.out_bytes.clone().try_acquire_many_owned(rest).ok()
        } else {
            let want = bytes.clamp(1, OUT_BYTES_PER_CONNECTION) as u32;
            let p = tokio::select! {
                p = self.out_bytes.clone().acquire_many_owned(want) => p.ok(),
                _ = self.closed.cancelled() => None,
            };
            if p.is_none() {
                return false;
            }
            p
        };
        if self.closed.is_cancelled() {
            return false;
        }
        self.out
            .send(Out {
                parts,
                _budget: permit,
                _egress: permits,
            })
            .await
            .is_ok()
    }

    pub(crate) async fn send_one(&self, frame: Bytes) -> bool {
        self.send(vec![frame]).await
    }

    /// Registers a ticket or subscription id; an Error frame if it cannot be.
    pub(crate) fn open_ticket(&self, op: Op, id: u64) -> Result<CancellationToken, Bytes> {
        let mut t = self.tickets.lock();
        if t.contains_key(&id) {
            return Err(
                Response::Error(format!("ticket {id} is already live on this connection")).encode(
                    op,
                    status::BAD_REQUEST,
                    id,
                ),
            );
        }
        if t.len() >= TICKETS_PER_CONNECTION {
            return Err(
                Response::Error("busy: too many live tickets on this connection".into()).encode(
                    op,
                    status::BUSY,
                    id,
                ),
            );
        }
        let token = self.closed.child_token();
        t.insert(id, token.clone());
        Ok(token)
    }

    pub(crate) fn close_ticket(&self, id: u64) {
        self.tickets.lock().remove(&id);
    }
}

/// When a connection last moved a byte (a request's header in, a frame out).
pub(crate) struct Activity {
    pub(crate) start: Instant,
    pub(crate) last_ms: std::sync::atomic::AtomicU64,
}

impl Default for Activity {
    fn default() -> Activity {
        Activity {
            start: Instant::now(),
            last_ms: Default::default(),
        }
    }
}

impl Activity {
    pub(crate) fn touch(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last_ms.store(ms, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn quiet_for(&self) -> Duration {
        let last = self.last_ms.load(std::sync::atomic::Ordering::Relaxed);
        self.start
            .elapsed()
            .saturating_sub(Duration::from_millis(last))
    }
}
