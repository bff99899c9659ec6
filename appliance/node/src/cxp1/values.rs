//! Values of any size over CXP1 (`api/PROTOCOL.md`, "Values"): `PutValue` pieces received
//! straight into the buffers their records are written from and handed, in order, to the
//! value's writer task; `GetValue` answered piece by piece as the value is read.
//!
//! Bounds: a value being received holds one request slot and
//! [`ctxpod_engine::VALUE_WRITE_BYTES_MAX`] (plus the piece being landed) of the ingest
//! budget from its first piece to its answer; the connection's reader waits while the
//! writer has its pieces in flight (TCP backpressure to the client). A value being sent
//! holds its share of the egress budget and at most [`PIECES_QUEUED`] pieces waiting for
//! the socket.

use crate::auth::Principal;
use crate::budget::Permit;
use bytes::Bytes;
use ctxpod_client::proto_io::FrameInput;
use ctxpod_engine::{EngineError, PutStatus, StagedBlock};
use ctxpod_wire::proto::{
    check_value_piece, status, Durability, Op, ProtoError, Response, FLAG_MORE,
    PUT_VALUE_FIXED_BYTES,
};
use ctxpod_wire::EXTENT_BYTES;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use super::conn::{Conn, Rd};
use super::{code, error};

/// How long a value's writer waits for its next piece before it gives the value up (the
/// client stalled mid-value): nothing of it is stored.
pub(crate) const PIECE_WAIT: Duration = Duration::from_secs(60);
/// Pieces of one `GetValue` answer queued for the socket at once.
pub(crate) const PIECES_QUEUED: usize = 2;

/// Values being received on one connection, by request id.
pub(crate) type Open = HashMap<u64, Receiving>;

/// A value whose pieces are arriving: who it is (each piece must repeat it) and where the
/// next piece starts.
pub(crate) struct Receiving {
    id: (String, Bytes, u64, u32, Durability),
    next: u64,
    tx: mpsc::Sender<StagedBlock>,
}

/// The fixed fields of a `PutValue` body.
struct Fixed {
    offset: u64,
    len: u64,
    crc32c: u32,
    durability: Durability,
}

/// Reads one `PutValue` frame: its head, then (when the piece is the one its value expects
/// next) its data straight into a staged block, handed to the value's writer. The first
/// piece is admitted (role, rate, slot, budgets) and starts the writer; a piece of a value
/// that is not open (refused or answered already) is skipped without an answer. False
/// when the connection is to end.
pub(crate) async fn read_piece(
    conn: &Arc<Conn>,
    input: &mut FrameInput<Rd>,
    (id, body_len, fd): (u64, usize, std::os::fd::RawFd),
    p: &Principal,
    open: &mut Open,
) -> anyhow::Result<bool> {
    let (fixed, ns, key, data_len) = match read_head(input, body_len).await? {
        Ok(h) => h,
        Err((e, left)) => {
            input.skip(left).await?;
            open.remove(&id);
            return Ok(conn.send(bad(id, &e)).await);
        }
    };
    if let Err(e) = check_value_piece(fixed.len, fixed.offset, data_len) {
        input.skip(data_len).await?;
        open.remove(&id);
        return Ok(conn.send(bad(id, &e)).await);
    }
    if fixed.offset == 0 {
        if open.contains_key(&id) {
            input.skip(data_len).await?;
            let m = format!("value {id} is already being received on this connection");
            return Ok(conn
                .send(error(Op::PutValue, id, status::BAD_REQUEST, m))
                .await);
        }
        match admit(conn, p, id, (&fixed, &ns, &key)).await {
            Ok(r) => drop(open.insert(id, r)),
            Err(answer) => {
                input.skip(data_len).await?;
                return Ok(conn.send(answer).await);
            }
        }
    }
    let Some(r) = open.get_mut(&id) else {
        // Refused or answered already: the client learns it from that answer.
        input.skip(data_len).await?;
        return Ok(true);
    };
    let same = r.id == (ns, key, fixed.len, fixed.crc32c, fixed.durability);
    if !same || r.next != fixed.offset {
        input.skip(data_len).await?;
        open.remove(&id);
        let m = "a PutValue piece out of order, or naming another value than its first piece";
        return Ok(conn
            .send(error(Op::PutValue, id, status::BAD_REQUEST, m))
            .await);
    }
    let mut piece = StagedBlock::new(data_len)?;
    input
        .read_into(&mut piece.unfilled_mut()[..data_len])
        .await?;
    piece.advance(data_len);
    r.next += data_len as u64;
    let last = r.next == fixed.len;
    // Not the last piece of a value its client gave up on (it reset the connection): its
    // writer, its pieces ended, stores nothing.
    if last && crate::conn::client_gone(fd) {
        open.remove(&id);
        conn.metrics.abandoned_writes.inc();
        return Ok(false);
    }
    // The writer takes pieces as it writes them: the reader waits meanwhile.
    if r.tx.send(piece).await.is_err() || last {
        open.remove(&id);
    }
    Ok(true)
}

/// The head of a `PutValue` body (its fixed fields, namespace, key) and the length of its
/// data; or why it is malformed, with the bytes of the body left to skip.
async fn read_head(
    input: &mut FrameInput<Rd>,
    body_len: usize,
) -> std::io::Result<Result<(Fixed, String, Bytes, usize), (ProtoError, usize)>> {
    let truncated = ProtoError::Truncated(Op::PutValue);
    if body_len < PUT_VALUE_FIXED_BYTES + 1 {
        return Ok(Err((truncated, body_len)));
    }
    let f = input.take(PUT_VALUE_FIXED_BYTES + 1).await?;
    let mut left = body_len - f.len();
    let u64_at = |i: usize| u64::from_le_bytes(f[i..i + 8].try_into().expect("8 bytes"));
    let d = f[20];
    let Some(durability) = Durability::from_u8(d) else {
        return Ok(Err((ProtoError::BadDurability(d), left)));
    };
    let fixed = Fixed {
        offset: u64_at(0),
        len: u64_at(8),
        crc32c: u32::from_le_bytes(f[16..20].try_into().expect("4 bytes")),
        durability,
    };
    let ns_len = f[PUT_VALUE_FIXED_BYTES] as usize;
    if ns_len == 0 || ns_len > ctxpod_wire::proto::NAMESPACE_BYTES_MAX {
        return Ok(Err((ProtoError::BadNamespace(ns_len), left)));
    }
    if left < ns_len + 1 {
        return Ok(Err((truncated, left)));
    }
    let nk = input.take(ns_len + 1).await?;
    left -= nk.len();
    let Ok(ns) = std::str::from_utf8(&nk[..ns_len]) else {
        return Ok(Err((ProtoError::BadNamespace(ns_len), left)));
    };
    let key_len = nk[ns_len] as usize;
    if key_len == 0 || key_len > ctxpod_wire::KEY_BYTES_MAX {
        return Ok(Err((ProtoError::BadKeyLength(key_len), left)));
    }
    if left < key_len {
        return Ok(Err((truncated, left)));
    }
    let key = input.take(key_len).await?;
    left -= key_len;
    Ok(Ok((fixed, ns.to_owned(), key, left)))
}

fn bad(id: u64, e: &ProtoError) -> Vec<Bytes> {
    error(Op::PutValue, id, status::BAD_REQUEST, e.to_string())
}

/// The first piece of a value: its principal's role and rate, a request slot, its ingest
/// budget, its namespace and its tenant's bytes; then its writer task is started. Else the
/// refusal to answer.
async fn admit(
    conn: &Arc<Conn>,
    p: &Principal,
    id: u64,
    (fixed, ns, key): (&Fixed, &str, &Bytes),
) -> Result<Receiving, Vec<Bytes>> {
    let op = Op::PutValue;
    if !p.may(super::access_of_op(op)) {
        conn.metrics.forbidden.inc();
        return Err(error(
            op,
            id,
            status::FORBIDDEN,
            "forbidden: this role may not do that",
        ));
    }
    if conn.auth.admit(p).is_err() {
        let m = "rate limited: the tenant's request rate is spent; retry later";
        return Err(error(op, id, status::TOO_MANY_REQUESTS, m));
    }
    let slot = conn.inflight.clone().try_acquire_owned().ok();
    let bytes = (fixed.len as usize).min(ctxpod_engine::VALUE_WRITE_BYTES_MAX) + EXTENT_BYTES;
    let budget = conn.budgets.ingest.try_take(bytes);
    let (Some(slot), Some(budget)) = (slot, budget) else {
        let m = "busy: too many requests in flight, retry later";
        return Err(error(op, id, status::BUSY, m));
    };
    let scoped = p
        .scope(ns)
        .map_err(|e| error(op, id, status::BAD_REQUEST, e.to_string()))?;
    if let Err(m) = conn.auth.check_tenant_bytes(&conn.engine, p, fixed.len) {
        return Err(error(op, id, status::FORBIDDEN, m));
    }
    let (tx, rx) = mpsc::channel(1);
    let w = Writing {
        conn: conn.clone(),
        ns: scoped,
        key: key.clone(),
        len: fixed.len,
        crc32c: fixed.crc32c,
        durability: fixed.durability,
        id,
    };
    tokio::spawn(w.run(rx, (slot, budget)));
    Ok(Receiving {
        id: (
            ns.to_owned(),
            key.clone(),
            fixed.len,
            fixed.crc32c,
            fixed.durability,
        ),
        next: 0,
        tx,
    })
}

/// A value's writer task: its pieces from the connection's reader into the engine, then
/// its answer.
struct Writing {
    conn: Arc<Conn>,
    ns: String,
    key: Bytes,
    len: u64,
    crc32c: u32,
    durability: Durability,
    id: u64,
}

impl Writing {
    async fn run(self, mut rx: mpsc::Receiver<StagedBlock>, held: (OwnedSemaphorePermit, Permit)) {
        let r = self.store(&mut rx).await;
        // Pieces still arriving are skipped by the reader from now on.
        drop(rx);
        let (op, id) = (Op::PutValue, self.id);
        let parts = match r {
            Ok(st) => {
                let st = match st {
                    PutStatus::Created => status::CREATED,
                    PutStatus::Exists => status::OK,
                };
                let crc32c = self.crc32c;
                vec![Response::ValueStored { crc32c }.encode(op, st, id)]
            }
            Err(e) => error(op, id, code(&e), e.to_string()),
        };
        self.conn.send(parts).await;
        drop(held);
    }

    async fn store(
        &self,
        rx: &mut mpsc::Receiver<StagedBlock>,
    ) -> ctxpod_engine::Result<PutStatus> {
        let e = &self.conn.engine;
        let mut w = e
            .begin_value(&self.ns, &self.key, self.len, self.durability)
            .await?;
        while w.next_piece_len() > 0 {
            let piece = match tokio::time::timeout(PIECE_WAIT, rx.recv()).await {
                Ok(Some(p)) => p,
                Ok(None) => {
                    return Err(EngineError::Invalid(
                        "the value's pieces stopped (the connection closed)".into(),
                    ))
                }
                Err(_) => {
                    return Err(EngineError::Invalid(format!(
                        "no piece of the value for {PIECE_WAIT:?}: nothing of it is stored"
                    )))
                }
            };
            w.write_piece(piece).await?;
        }
        w.finish(Some(self.crc32c)).await
    }
}

/// A `GetValue`: the value (or its range) sent as `GetValue` frames of one piece each,
/// the last without [`FLAG_MORE`], read as they are sent. `None`: its frames were sent
/// here; else its error frame.
pub(crate) async fn send_value(
    conn: &Arc<Conn>,
    (ns, key): (&str, &[u8]),
    (offset, len): (u64, u64),
    op: Op,
    id: u64,
) -> Option<Vec<Bytes>> {
    let hi = if len == 0 {
        u64::MAX
    } else {
        offset.saturating_add(len)
    };
    let fail = |e: &EngineError| error(op, id, code(e), e.to_string());
    let mut reader = match conn.engine.open_value(ns, key, Some((offset, hi))).await {
        Ok(Some(r)) => r,
        Ok(None) => return Some(error(op, id, status::NOT_FOUND, "no such value")),
        Err(e) => return Some(fail(&e)),
    };
    let total = reader.len();
    if offset >= total {
        let m = format!("offset {offset} is past the end of a {total}-byte value");
        return Some(error(op, id, status::RANGE_NOT_SATISFIABLE, m));
    }
    let end = hi.min(total);
    let client = {
        let who = conn.who.lock();
        let anonymous = Principal::anonymous_admin();
        crate::budget::Client::new(conn.peer, who.as_ref().unwrap_or(&anonymous))
    };
    let share = ((end - offset) as usize).min(ctxpod_engine::VALUE_READ_BYTES_MAX);
    let Some(mut egress) = conn.budgets.egress_for(Some(client)).take(share).await else {
        let m = conn.engine.metrics();
        m.busy_rejections.with_label_values(&["egress"]).inc();
        let m = "busy: too many answers waiting for their clients; retry later";
        return Some(error(op, id, status::BUSY, m));
    };
    let queued = Arc::new(Semaphore::new(PIECES_QUEUED));
    let mut at = offset;
    while at < end {
        let data = match reader.next_piece().await {
            Ok(Some(d)) => d,
            Ok(None) => return Some(error(op, id, status::INTERNAL, "the value ended early")),
            Err(e) => return Some(fail(&e)),
        };
        let turn = tokio::select! {
            t = queued.clone().acquire_owned() => t.ok(),
            _ = conn.closed.cancelled() => None,
        };
        // The connection closed: nothing more to send.
        let turn = turn?;
        let more = at + (data.len() as u64) < end;
        let piece = Response::ValuePiece {
            value_len: total,
            value_crc32c: reader.crc32c(),
            offset: at,
            crc32c: reader
                .last_piece_crc32c()
                .unwrap_or_else(|| ctxpod_wire::crc32c(&data)),
            data,
        };
        at += piece_len(&piece);
        let flags = if more { FLAG_MORE } else { 0 };
        let mut permits = vec![turn];
        if !more {
            // The answer's egress share goes back once its last piece is written.
            permits.append(&mut egress);
        }
        let parts = piece.encode_parts_flagged(op, status::OK, id, flags);
        if !conn.send_reserved(parts, 0, permits).await {
            return None;
        }
    }
    None
}

fn piece_len(r: &Response) -> u64 {
    match r {
        Response::ValuePiece { data, .. } => data.len() as u64,
        _ => 0,
    }
}
