//! The requests: PUT (bodies received straight into staged blocks), GET (admitted against
//! the frame, the connection's output and the egress budget before any read), MATCH,
//! PIN, UNPIN, regions, and the error answers.

use crate::budget::Permit;
use bytes::Bytes;
use ctxpod_client::proto_io::FrameInput;
use ctxpod_engine::{Engine, EngineError, PutStatus, StagedBlock};
use ctxpod_wire::proto::{
    status, GetEntry, Op, Policy, PrefetchRequest, ProtoError, Request, Response,
};
use std::sync::Arc;
use std::time::Duration;

use super::conn::Conn;
use super::prefetch::{prefetch, Prefetch};
use super::subscribe::subscription;
use super::{code, error, REGIONS_PER_CONNECTION};
use tokio::time::Instant;

/// The response's frame (as pieces), or `None` when the handler sends its own frames.
pub(crate) async fn handle(conn: &Arc<Conn>, req: Request, op: Op, id: u64) -> Option<Vec<Bytes>> {
    let engine = &conn.engine;
    let fail = |e: &EngineError| error(op, id, code(e), e.to_string());
    let count = |r: ctxpod_engine::Result<u64>| match r {
        Ok(n) => vec![Response::Count(n as u32).encode(op, status::OK, id)],
        Err(e) => fail(&e),
    };
    Some(match req {
        Request::Ping => vec![Response::Pong.encode(op, status::OK, id)],
        // PUT bodies never get here: `read_put` stages them as they arrive.
        Request::Put { .. } => error(op, id, status::INTERNAL, "internal: PUT decoded whole"),
        // Answered by `get`, which holds budgets until its frame is written.
        Request::Get { .. } => error(op, id, status::INTERNAL, "internal: Get in handle"),
        Request::Match { ns, keys } => count(
            engine
                .match_prefix(&ns, keys.iter().map(|k| k.to_vec()).collect())
                .await,
        ),
        Request::Pin { ns, ttl_ms, keys } => {
            let ttl = Duration::from_millis(ttl_ms.min(ctxpod_wire::LEASE_MS_MAX));
            count(
                engine
                    .pin(&ns, keys.iter().map(|k| k.to_vec()).collect(), ttl)
                    .await,
            )
        }
        Request::Unpin { ns, keys } => count(
            engine
                .unpin(&ns, keys.iter().map(|k| k.to_vec()).collect())
                .await,
        ),
        Request::RegisterRegion { region_id, bytes } => {
            register_region(conn, op, id, region_id, bytes)
        }
        Request::Prefetch(req) => return start_prefetch(conn, req, op, id),
        Request::Cancel { ticket } => cancel(conn, op, id, ticket),
        Request::Auth { .. } => error(op, id, status::INTERNAL, "internal: Auth is handled first"),
        Request::Subscribe { ns } => return start_subscription(conn, &ns, op, id),
        // Its pieces are received by `values::read_piece`.
        Request::PutValue(_) => error(op, id, status::INTERNAL, "internal: PutValue decoded whole"),
        Request::GetValue {
            ns,
            key,
            offset,
            len,
        } => return super::values::send_value(conn, (&ns, &key), (offset, len), op, id).await,
    })
}

/// A RegisterRegion: records (or, at 0 bytes, forgets) the region, up to
/// [`REGIONS_PER_CONNECTION`] per connection.
fn register_region(conn: &Conn, op: Op, id: u64, region_id: u32, bytes: u64) -> Vec<Bytes> {
    let mut r = conn.regions.lock();
    if bytes == 0 {
        r.remove(&region_id);
    } else if r.len() >= REGIONS_PER_CONNECTION && !r.contains_key(&region_id) {
        return error(
            op,
            id,
            status::BAD_REQUEST,
            format!("at most {REGIONS_PER_CONNECTION} regions per connection"),
        );
    } else {
        r.insert(region_id, bytes);
    }
    vec![Response::RegionRegistered.encode(op, status::OK, id)]
}

/// A Prefetch: checked against its region and policy, then run as a ticket of its own
/// (`None`: the ticket sends its frames), or refused (its error frame).
fn start_prefetch(conn: &Arc<Conn>, req: PrefetchRequest, op: Op, id: u64) -> Option<Vec<Bytes>> {
    let Some(region_bytes) = conn.regions.lock().get(&req.region_id).copied() else {
        return Some(error(
            op,
            id,
            status::NOT_FOUND,
            format!(
                "region {} is not registered on this connection",
                req.region_id
            ),
        ));
    };
    if let Some((i, e)) = req.entries.iter().enumerate().find(|(_, e)| {
        e.offset
            .checked_add(e.max_len as u64)
            .is_none_or(|end| end > region_bytes)
    }) {
        return Some(error(
            op,
            id,
            status::BAD_REQUEST,
            format!(
                "entry {i}: {} bytes at offset {} do not fit region {} of {region_bytes} bytes",
                e.max_len, e.offset, req.region_id
            ),
        ));
    }
    if req.policy == Policy::Timeout && req.deadline_ms == 0 {
        return Some(error(
            op,
            id,
            status::BAD_REQUEST,
            "the timeout policy needs a deadline",
        ));
    }
    let token = match conn.open_ticket(op, id) {
        Ok(t) => t,
        Err(f) => return Some(vec![f]),
    };
    let p = Prefetch {
        policy: req.policy,
        deadline: (req.deadline_ms > 0)
            .then(|| Instant::now() + Duration::from_millis(req.deadline_ms as u64)),
        lease: Duration::from_millis((req.lease_ms as u64).min(ctxpod_wire::PREFETCH_LEASE_MS_MAX)),
        ns: req.ns,
        entries: req.entries,
    };
    // The ticket outlives this request (its pushes, then its lease).
    let conn = conn.clone();
    tokio::spawn(async move {
        prefetch(&conn, id, p, token).await;
        conn.close_ticket(id);
    });
    None
}

/// A Subscribe: its events are sent under a ticket of their own (`None`: the ticket sends
/// its frames), or it is refused (its error frame).
fn start_subscription(conn: &Arc<Conn>, ns: &str, op: Op, id: u64) -> Option<Vec<Bytes>> {
    let (ns_id, rx) = match conn.engine.subscribe(ns) {
        Ok(s) => s,
        Err(e) => return Some(error(op, id, code(&e), e.to_string())),
    };
    let token = match conn.open_ticket(op, id) {
        Ok(t) => t,
        Err(f) => return Some(vec![f]),
    };
    let conn = conn.clone();
    tokio::spawn(async move {
        if conn
            .send_one(Response::Ticket(id).encode(op, status::OK, id))
            .await
        {
            subscription(&conn, id, ns_id, rx, token).await;
        }
        conn.close_ticket(id);
    });
    None
}

/// A Cancel: cancels the live ticket (or subscription) of that id on this connection.
fn cancel(conn: &Conn, op: Op, id: u64, ticket: u64) -> Vec<Bytes> {
    match conn.tickets.lock().get(&ticket) {
        Some(t) => {
            t.cancel();
            vec![Response::Cancelled.encode(op, status::OK, id)]
        }
        None => error(
            op,
            id,
            status::NOT_FOUND,
            format!("no live ticket {ticket} on this connection"),
        ),
    }
}

/// A Get. Blocks are admitted in order while they fit the client's frame, this
/// connection's output budget and the node's egress budget, each taken before the block is
/// read; only admitted blocks are read, the others answer 413 (the frame is full: ask again
/// in a smaller batch) or BUSY without costing the node anything. The frame, the bytes of
/// it already taken from the connection's output budget, and the budgets' permits, held
/// until the frame is written.
pub(crate) async fn get(
    conn: &Arc<Conn>,
    ns: &str,
    keys: &[Bytes],
    op: Op,
    id: u64,
) -> (Vec<Bytes>, usize, Vec<Permit>) {
    let engine = &conn.engine;
    let mut room = conn.peer_max.saturating_sub(64 + keys.len() * 10);
    let (mut reserved, mut permits) = (0usize, Vec::new());
    let mut busy = 0u64;
    // The connection's credential on its address (a Get comes only after authentication).
    let client = {
        let who = conn.who.lock();
        let anonymous = crate::auth::Principal::anonymous_admin();
        crate::budget::Client::new(conn.peer, who.as_ref().unwrap_or(&anonymous))
    };
    let mut egress = conn.budgets.egress_for(Some(client));
    // Per key: the block found (one index read) and admitted, or the status it answers
    // without a read.
    let mut plan: Vec<Result<ctxpod_engine::Found, u16>> = Vec::with_capacity(keys.len());
    for k in keys {
        plan.push(match engine.find(ns, k) {
            Err(e) => Err(code(&e)),
            Ok(None) => Err(status::NOT_FOUND),
            // Over the frame, or a value over one record (read with `GetValue`).
            Ok(Some(f)) if f.len() > room || f.len() > ctxpod_wire::BLOCK_BYTES_MAX => {
                Err(status::TOO_LARGE)
            }
            Ok(Some(f)) => {
                let len = f.len();
                let mine = conn
                    .out_bytes
                    .clone()
                    .try_acquire_many_owned(len.max(1) as u32)
                    .ok();
                // The client's share may be waited for (not past the connection's end).
                let node = match mine {
                    None => None,
                    Some(_) => tokio::select! {
                        got = egress.take(len) => got,
                        _ = conn.closed.cancelled() => None,
                    },
                };
                match (mine, node) {
                    (Some(a), Some(b)) => {
                        room -= len;
                        reserved += len.max(1);
                        permits.push(a);
                        permits.extend(b);
                        Ok(f)
                    }
                    _ => {
                        busy += 1;
                        Err(status::BUSY)
                    }
                }
            }
        });
    }
    if busy > 0 {
        engine
            .metrics()
            .busy_rejections
            .with_label_values(&["egress"])
            .inc_by(busy);
    }
    let results = futures::future::join_all(plan.into_iter().zip(keys).map(|(p, k)| async move {
        match p {
            Ok(f) => match (f.len(), engine.read_found(k, f).await) {
                (len, Ok(Some((data, crc)))) if data.len() <= len => GetEntry {
                    status: status::OK,
                    crc32c: crc,
                    data,
                },
                // Stored again, larger, since it was admitted: ask again.
                (_, Ok(Some(_))) => entry(status::BUSY),
                (_, Ok(None)) => entry(status::NOT_FOUND),
                (_, Err(e)) => entry(code(&e)),
            },
            Err(st) => entry(st),
        }
    }))
    .await;
    let parts = Response::Get(results).encode_parts(op, status::OK, id);
    (parts, reserved, permits)
}

pub(crate) fn entry(status: u16) -> GetEntry {
    GetEntry {
        status,
        crc32c: 0,
        data: Bytes::new(),
    }
}

pub(crate) enum Parsed {
    Put(StagedPut),
    Other(Request),
    Bad(ProtoError),
    /// Well-formed, but naming something the caller may not (a bad namespace name).
    Invalid(String),
}

/// A `Put` body received (`FrameInput::read_put_body`), each block in the buffer its record
/// is written from.
pub(crate) type StagedPut = ctxpod_client::proto_io::PutBody<StagedBlock>;

/// Receives a PUT body of `len` bytes with the codec's parser, each block straight into the
/// buffer its record will be written from (its CRC32C computed as it lands). `Ok(Err(_))`:
/// the body was consumed but is malformed (the connection goes on); `Err(_)`: the
/// connection failed.
pub(crate) async fn read_put<R: tokio::io::AsyncRead + Unpin>(
    input: &mut FrameInput<R>,
    len: usize,
) -> std::io::Result<Result<StagedPut, ProtoError>> {
    input
        .read_put_body(len, |n| {
            StagedBlock::new(n).map_err(|_| ProtoError::BlockTooLarge(n as u32))
        })
        .await
}

pub(crate) async fn handle_put(engine: &Engine, p: StagedPut, op: Op, id: u64) -> Bytes {
    let StagedPut {
        ns,
        durability,
        entries,
    } = p;
    let crcs: Vec<u32> = entries.iter().map(|e| e.1).collect();
    let results = futures::future::join_all(entries.into_iter().map(|(key, crc, staged)| {
        let ns = &ns;
        async move {
            engine
                .put_staged(ns, &key, staged, Some(crc), durability)
                .await
        }
    }))
    .await;
    let out = results
        .iter()
        .zip(crcs)
        .map(|(r, crc)| match r {
            Ok(PutStatus::Created) => (status::CREATED, crc),
            Ok(PutStatus::Exists) => (status::OK, crc),
            Err(err) => (code(err), 0),
        })
        .collect();
    Response::Put(out).encode(op, status::OK, id)
}
