//! PREFETCH tickets: blocks held, read and verified into node memory ahead (under the
//! staging budget), then PUSHed into the client's region in order; deadline, cancel and
//! the lease after completion.

use bytes::Bytes;
use ctxpod_engine::{EngineError, ValueReader};
use ctxpod_wire::proto::{status, Op, Policy, PrefetchEntry, Response, FLAG_MORE};
use futures::{FutureExt, StreamExt};
use std::sync::Arc;
use std::time::Duration;

use super::conn::Conn;
use super::{code, error, STAGE_AHEAD};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub(crate) struct Prefetch {
    pub(crate) ns: String,
    pub(crate) policy: Policy,
    pub(crate) deadline: Option<Instant>,
    pub(crate) lease: Duration,
    pub(crate) entries: Vec<PrefetchEntry>,
}

/// A ticket's pushes and its `PrefetchDone` are gathered while the blocks they carry are
/// staged already, up to this many bytes, and queued for the socket together: a one-block
/// prefetch of a hot block sends its block and its end in one write (its answer goes first,
/// alone, so the client's waiter wakes while the node stages).
const GATHER_BYTES: usize = 2 << 20;

/// Staging permits of a pushed block: its share of the connection's and the node's budget.
type Staged = (tokio::sync::OwnedSemaphorePermit, crate::budget::Permit);

/// The frames of one ticket gathered and not yet queued, with the staging permits of the
/// blocks they carry (given back once the frames are queued, as they were when each frame
/// was queued alone).
struct Pending<'a> {
    conn: &'a Conn,
    parts: Vec<Bytes>,
    bytes: usize,
    staged: Vec<Staged>,
}

impl Pending<'_> {
    /// Adds a frame; queues what is gathered once it reaches [`GATHER_BYTES`]. False once
    /// the connection is closing.
    async fn add(&mut self, frame: Vec<Bytes>, staged: Option<Staged>) -> bool {
        self.bytes += frame.iter().map(Bytes::len).sum::<usize>();
        self.parts.extend(frame);
        self.staged.extend(staged);
        self.bytes < GATHER_BYTES || self.flush().await
    }

    /// Queues the gathered frames as one. False once the connection is closing.
    async fn flush(&mut self) -> bool {
        if self.parts.is_empty() {
            return true;
        }
        self.bytes = 0;
        let sent = self.conn.send(std::mem::take(&mut self.parts)).await;
        self.staged.clear();
        sent
    }
}

/// Status of an entry that a cancel stopped before it was pushed.
pub const CANCELLED: u16 = 499;

/// The `prefetch_blocks` outcome label of a pushed entry's status.
fn outcome_of(st: u16) -> &'static str {
    match st {
        status::OK => "pushed",
        status::NOT_FOUND => "miss",
        status::DEADLINE => "deadline",
        CANCELLED => "cancelled",
        status::BUSY => "busy",
        status::TOO_LARGE => "too_large",
        _ => "error",
    }
}

/// One ticket's pushes: the frames gathered for the socket, the entries they answer and
/// how many were pushed and missed (for its `PrefetchDone`).
struct Pushes<'a> {
    out: Pending<'a>,
    p: &'a Prefetch,
    token: &'a CancellationToken,
    id: u64,
    pushed: u32,
    missed: u32,
}

impl Pushes<'_> {
    /// The `Push` frame of entry `i`, counted under its outcome.
    fn frame(&self, i: usize, st: u16, crc: u32, data: Bytes) -> Vec<Bytes> {
        self.out
            .conn
            .metrics
            .prefetch_blocks
            .with_label_values(&[outcome_of(st)])
            .inc();
        let e = &self.p.entries[i];
        Response::Push {
            index: i as u32,
            status: st,
            crc32c: crc,
            offset: e.offset,
            data,
        }
        .encode_parts(Op::Push, status::OK, self.id)
    }

    /// Pushes entry `i`'s block. False once the connection is closing.
    async fn hit(&mut self, i: usize, data: Bytes, crc: u32, permit: Option<Staged>) -> bool {
        self.pushed += 1;
        let m = &self.out.conn.metrics;
        m.prefetch_pushed_bytes.inc_by(data.len() as u64);
        let frame = self.frame(i, status::OK, crc, data);
        self.out.add(frame, permit).await
    }

    /// Pushes entry `i`'s large value piece by piece (each a `Push` at its place in the
    /// entry's slot, [`FLAG_MORE`] on all but the last), read from flash as it goes; a
    /// value that fails its checks, or a cancel or deadline meanwhile, ends the entry with
    /// that status instead. False once the connection is closing.
    async fn value(&mut self, i: usize, mut r: ValueReader, held: Option<Staged>) -> bool {
        if !self.out.flush().await {
            return false;
        }
        let conn = self.out.conn;
        let (mut at, len, base) = (0u64, r.len(), self.p.entries[i].offset);
        while at < len {
            let stop = if self.token.is_cancelled() {
                Some(CANCELLED)
            } else if self.p.deadline.is_some_and(|d| Instant::now() >= d) {
                Some(status::DEADLINE)
            } else {
                None
            };
            let piece = match (stop, r.next_piece().await) {
                (Some(st), _) => Err(st),
                (None, Ok(Some(d))) => Ok(d),
                (None, Ok(None)) => Err(status::INTERNAL),
                (None, Err(e)) => Err(code(&e)),
            };
            let data = match piece {
                Ok(d) => d,
                Err(st) => return self.miss(i, st, held).await && self.out.flush().await,
            };
            let n = data.len() as u64;
            let more = at + n < len;
            conn.metrics.prefetch_pushed_bytes.inc_by(n);
            let frame = Response::Push {
                index: i as u32,
                status: status::OK,
                crc32c: r
                    .last_piece_crc32c()
                    .unwrap_or_else(|| ctxpod_wire::crc32c(&data)),
                offset: base + at,
                data,
            }
            .encode_parts_flagged(
                Op::Push,
                status::OK,
                self.id,
                if more { FLAG_MORE } else { 0 },
            );
            if !conn.send(frame).await {
                return false;
            }
            at += n;
        }
        conn.metrics
            .prefetch_blocks
            .with_label_values(&[outcome_of(status::OK)])
            .inc();
        self.pushed += 1;
        drop(held);
        true
    }

    /// Pushes entry `i` as missed with status `st`. False once the connection is closing.
    async fn miss(&mut self, i: usize, st: u16, permit: Option<Staged>) -> bool {
        self.missed += 1;
        let frame = self.frame(i, st, 0, Bytes::new());
        self.out.add(frame, permit).await
    }
}

/// The staging permits of a block of up to `want` bytes: this connection's share and the
/// node's, waited for unless the policy is best effort. None when they cannot be had.
async fn staging_permits(conn: &Conn, policy: Policy, want: usize) -> Option<Staged> {
    let staging = &conn.budgets.staging;
    let mine = conn.staging_mine.clone();
    match policy {
        Policy::BestEffort => mine
            .try_acquire_many_owned(want as u32)
            .ok()
            .and_then(|a| staging.try_take(want).map(|b| (a, b))),
        _ => match mine.acquire_many_owned(want as u32).await.ok() {
            Some(a) => staging.take(want).await.map(|b| (a, b)),
            None => None,
        },
    }
}

/// What a staged entry pushes: a block read and checked, or a large value opened (read
/// extent by extent as it is pushed).
enum Found {
    Block(Bytes, u32),
    Value(ValueReader),
}

/// A staged entry: its index, what it pushes (or the status it is missed with), and the
/// staging permits it holds.
type StagedEntry = (usize, Result<Found, u16>, Option<Staged>);

/// Stages entry `i`: reads and verifies its block into node memory. A block is staged
/// under its share of the node's staging budget and of this connection's (so one client
/// that stalls its pushes cannot take the node's), both taken for the entry's `max_len`
/// before the read and cut to the block's size after it.
async fn stage(conn: &Conn, p: &Prefetch, i: usize) -> StagedEntry {
    let engine = &conn.engine;
    let e = &p.entries[i];
    let want = (e.max_len as usize).clamp(1, ctxpod_wire::BLOCK_BYTES_MAX);
    let Some(mut permits) = staging_permits(conn, p.policy, want).await else {
        engine
            .metrics()
            .busy_rejections
            .with_label_values(&["staging"])
            .inc();
        return (i, Err(status::BUSY), None);
    };
    let r = match engine.get(&p.ns, &e.key).await {
        Ok(Some((b, _))) if b.len() > e.max_len as usize => Err(status::TOO_LARGE),
        Ok(Some((b, crc))) => Ok((b, crc)),
        Ok(None) => Err(status::NOT_FOUND),
        // A value over one record is pushed piece by piece as it is read.
        Err(EngineError::TooLarge(_)) => {
            drop(permits);
            return stage_value(conn, p, i).await;
        }
        Err(e) => Err(code(&e)),
    };
    let staged = r.as_ref().map_or(1, |(b, _)| b.len().max(1));
    let r = r.map(|(b, crc)| Found::Block(b, crc));
    if staged < want {
        drop(permits.0.split(want - staged));
        drop(permits.1.split(want - staged));
    }
    (i, r, Some(permits))
}

/// Stages entry `i`, a value over one record: opened (its extents read as it is pushed,
/// a few ahead), holding the staging budget a value's reader needs
/// ([`ctxpod_engine::VALUE_READ_BYTES_MAX`]) until it is pushed.
async fn stage_value(conn: &Conn, p: &Prefetch, i: usize) -> StagedEntry {
    let e = &p.entries[i];
    let want = ctxpod_engine::VALUE_READ_BYTES_MAX;
    let Some(permits) = staging_permits(conn, p.policy, want).await else {
        let m = conn.engine.metrics();
        m.busy_rejections.with_label_values(&["staging"]).inc();
        return (i, Err(status::BUSY), None);
    };
    let r = match conn.engine.open_value(&p.ns, &e.key, None).await {
        Ok(Some(r)) if r.len() > e.max_len as u64 => Err(status::TOO_LARGE),
        Ok(Some(r)) => Ok(Found::Value(r)),
        Ok(None) => Err(status::NOT_FOUND),
        Err(e) => Err(code(&e)),
    };
    (i, r, Some(permits))
}

/// Runs one prefetch ticket: holds its blocks, answers the ticket, pushes every entry (its
/// block or a miss) in order while up to [`STAGE_AHEAD`] later blocks are read from flash
/// and verified into node memory, sends `PrefetchDone`, then keeps the blocks leased for
/// `lease` unless the ticket is cancelled or the connection ends.
pub(crate) async fn prefetch(conn: &Arc<Conn>, id: u64, p: Prefetch, token: CancellationToken) {
    let engine = &conn.engine;
    let keys = p.entries.iter().map(|e| e.key.clone()).collect();
    let (held, present) = match engine.hold(&p.ns, keys).await {
        Ok(h) => h,
        Err(e) => {
            conn.send(error(Op::Prefetch, id, code(&e), e.to_string()))
                .await;
            return;
        }
    };
    let m = &conn.metrics;
    // The answer goes at once: the client's waiter wakes while the first blocks are staged.
    if !conn
        .send_one(Response::Ticket(id).encode(Op::Prefetch, status::OK, id))
        .await
    {
        return;
    }
    let out = Pending {
        conn,
        parts: Vec::new(),
        bytes: 0,
        staged: Vec::new(),
    };
    let mut pushes = Pushes {
        out,
        p: &p,
        token: &token,
        id,
        pushed: 0,
        missed: 0,
    };
    // Keys the node does not hold are misses at once, whatever the policy.
    for i in (0..present.len()).filter(|&i| !present[i]) {
        if !pushes.miss(i, status::NOT_FOUND, None).await {
            return;
        }
    }
    let here: Vec<usize> = (0..present.len()).filter(|&i| present[i]).collect();
    if !push_held(&mut pushes, conn, &p, here, &token).await {
        return;
    }
    m.prefetch_tickets.inc();
    let (pushed, missed) = (pushes.pushed, pushes.missed);
    let done = Response::PrefetchDone { pushed, missed }.encode(Op::PrefetchDone, status::OK, id);
    let out = &mut pushes.out;
    if !out.add(vec![done], None).await || !out.flush().await {
        return;
    }
    // The lease: the blocks stay on the node while decode may still ask for them again.
    tokio::select! {
        _ = tokio::time::sleep(p.lease) => {}
        _ = token.cancelled() => {}
    }
    drop(held);
}

/// Pushes the entries the node holds (`here`), in order, each once it is staged, until the
/// ticket is cancelled or its deadline passes; the entries left then are pushed as missed
/// with that reason. False once the connection is closing.
async fn push_held(
    pushes: &mut Pushes<'_>,
    conn: &Conn,
    p: &Prefetch,
    here: Vec<usize>,
    token: &CancellationToken,
) -> bool {
    let mut staged = futures::stream::iter(here.clone())
        .map(|i| stage(conn, p, i))
        .buffered(STAGE_AHEAD);
    let deadline = async {
        match p.deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    let mut left: Vec<usize> = here.into_iter().rev().collect();
    // Why the rest of the entries will not be pushed, if they will not.
    let mut stop = None;
    while !left.is_empty() {
        if token.is_cancelled() {
            stop = Some(CANCELLED);
            break;
        }
        if p.deadline.is_some_and(|d| Instant::now() >= d) {
            stop = Some(status::DEADLINE);
            break;
        }
        // A block staged already joins the frames waiting to be queued; only when the next
        // one is not ready are they queued, together, before waiting for it.
        let next = match staged.next().now_or_never() {
            Some(n) => n,
            None => {
                if !pushes.out.flush().await {
                    return false;
                }
                tokio::select! {
                    biased;
                    _ = token.cancelled() => { stop = Some(CANCELLED); break; }
                    _ = &mut deadline => { stop = Some(status::DEADLINE); break; }
                    n = staged.next() => n,
                }
            }
        };
        let Some((i, r, permit)) = next else { break };
        left.pop();
        let sent = match r {
            Ok(Found::Block(data, crc)) => pushes.hit(i, data, crc, permit).await,
            Ok(Found::Value(reader)) => pushes.value(i, reader, permit).await,
            Err(st) => pushes.miss(i, st, permit).await,
        };
        if !sent {
            return false;
        }
    }
    drop(staged);
    if let Some(st) = stop {
        for i in left.into_iter().rev() {
            if !pushes.miss(i, st, None).await {
                return false;
            }
        }
    }
    true
}
