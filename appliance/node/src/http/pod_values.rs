//! A routed PUT of a value over one record (issue #34) in a pod of several: placement per
//! value, every extent of a value on the value's R members (docs/ARCHITECTURE.md, "Large
//! values"). The body is not held: each piece, as it arrives, goes to every one of the R
//! members at once (this node's own copy through the rest of its stack, the others'
//! forwarded), each through a short queue, so the request holds at most
//! `VALUE_WRITE_BYTES_MAX` of the ingest budget whatever the value's size, and the slowest
//! member sets the pace (TCP backpressure to the client).
//!
//! A member that cannot be reached is replaced by the next in rank, as for a block; the
//! body is gone by then, so the replacement's copy is streamed from a member that stored
//! the value (read back as any GET, its extents checked), not held by this node.
//!
//! Multipart uploads live in one node's memory: every request of a key's uploads goes to
//! the key's first-ranked member, its home (`to_upload_home`), which at completion copies
//! the value to the key's other members (`replicate_upload`) before it answers.

use axum::body::Body;
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use ctxpod_wire::pod_plan::{Plan, WriteAnswer, WritePlan};
use futures::StreamExt;
use std::collections::BTreeMap;
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::routed::{forward_counted, pick_answer};
use super::state::AppState;
use crate::errors::ApiError;
use crate::forward::Outgoing;

/// Pieces of the body queued for one member at most (hyper's pieces are up to a few tens of
/// KiB: a few MiB per member).
const QUEUED_PIECES: usize = 64;

type Piece = Result<Bytes, std::io::Error>;

/// Streams the PUT of a value of `len` bytes to the members of its plan's first round at
/// once; their answers make the PUT's, as a block's do.
pub(super) async fn write_value_in_pod(
    st: &AppState,
    view: &ctxpod_pod::membership::PodView,
    req: Request,
    next: Next,
    (mut plan, len): (WritePlan, u64),
    block: Option<(&str, &[u8])>,
) -> Response {
    let max = st.engine.value_bytes_max();
    if len > max {
        let m = format!(
            "a value of {len} bytes is over the node's value limit of {max} bytes (value_bytes_max)"
        );
        return ApiError::too_large(m).into_response();
    }
    let held = (len as usize).min(ctxpod_engine::VALUE_WRITE_BYTES_MAX);
    let _permit = match st.admit_body(held) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let Some(round) = plan.next_round() else {
        return pick_answer(plan.finish().pop(), BTreeMap::new(), false);
    };
    let members: Vec<usize> = round.into_keys().collect();
    let (parts, body) = req.into_parts();
    let (feeds, queues): (Vec<_>, Vec<_>) = members.iter().map(|_| queue()).unzip();
    let sends = members.iter().zip(queues).map(|(&m, (pieces, ended))| {
        let (member, parts, next) = (&view.members[m], &parts, next.clone());
        async move {
            // Answered or given up on: the pump sends this member nothing more.
            let _ended = ended;
            if member.id == *st.node_id {
                let local = Request::from_parts(parts.clone(), Body::from_stream(pieces));
                Some(next.run(local).await)
            } else {
                let body = Some(Outgoing::Stream(pieces.boxed()));
                forward_counted(st, member, parts, body, "write").await
            }
        }
    });
    let (answers, _) = futures::join!(futures::future::join_all(sends), pump(body, feeds));
    let mut by_member = BTreeMap::new();
    let mut stored = Vec::new();
    for (m, resp) in members.into_iter().zip(answers) {
        take_answer(&mut plan, &mut by_member, &mut stored, m, resp);
    }
    // Members that could not be reached: the next in rank each get a copy from one that
    // stored it.
    while let Some(round) = plan.next_round() {
        for m in round.into_keys() {
            let resp = match stored.first() {
                Some(&from) => copy_between(st, view, (&parts, &next), block, (from, m)).await,
                None => None,
            };
            take_answer(&mut plan, &mut by_member, &mut stored, m, resp);
        }
    }
    pick_answer(plan.finish().pop(), by_member, false)
}

/// Member `m`'s answer to the value's PUT, into the plan (`None`: it could not be reached).
fn take_answer(
    plan: &mut WritePlan,
    by_member: &mut BTreeMap<usize, Response>,
    stored: &mut Vec<usize>,
    m: usize,
    resp: Option<Response>,
) {
    let Some(resp) = resp else {
        plan.answer(m, 0, WriteAnswer::Unreachable);
        return;
    };
    let s = resp.status();
    let a = if s.is_success() {
        stored.push(m);
        WriteAnswer::Applied {
            changed: s == axum::http::StatusCode::CREATED,
        }
    } else {
        WriteAnswer::Refused
    };
    plan.answer(m, 0, a);
    by_member.insert(m, resp);
}

/// Streams the value from member `from`, which stored it, to member `to`, as a GET of it
/// fed into a PUT (each member checks what it reads and what it takes); `to`'s answer, or
/// `None` when either cannot be reached.
async fn copy_between(
    st: &AppState,
    view: &ctxpod_pod::membership::PodView,
    (parts, next): (&axum::http::request::Parts, &Next),
    scoped: Option<(&str, &[u8])>,
    (from, to): (usize, usize),
) -> Option<Response> {
    let mut get = parts.clone();
    get.method = axum::http::Method::GET;
    get.headers.remove(axum::http::header::CONTENT_LENGTH);
    get.headers.remove(ctxpod_wire::HEADER_CRC32C);
    let src = &view.members[from];
    let body = if src.id == *st.node_id {
        // This node's own copy, read as its GET would (`next` is the PUT's handler).
        local_value(st, scoped?).await?
    } else {
        let found = forward_counted(st, src, &get, None, "read").await?;
        if found.status() != axum::http::StatusCode::OK {
            return None;
        }
        found.into_body()
    };
    let pieces = pieces_of(body);
    let dst = &view.members[to];
    if dst.id == *st.node_id {
        let local = Request::from_parts(parts.clone(), Body::from_stream(pieces));
        Some(next.clone().run(local).await)
    } else {
        let body = Some(Outgoing::Stream(pieces.boxed()));
        forward_counted(st, dst, parts, body, "write").await
    }
}

/// The client's body, piece by piece, to every member still taking it (one that answered
/// already, a refusal, or was given up on, takes no more); a body cut short ends every
/// member's with an error.
async fn pump(body: Body, mut feeds: Vec<Feed>) {
    let mut pieces = body.into_data_stream();
    while let Some(piece) = pieces.next().await {
        let piece = piece.map_err(std::io::Error::other);
        for feed in feeds.iter_mut() {
            let Some(tx) = &feed.tx else { continue };
            let gone = tokio::select! {
                r = tx.send(clone_piece(&piece)) => r.is_err(),
                _ = feed.ended.cancelled() => true,
            };
            if gone {
                feed.tx = None;
            }
        }
        if piece.is_err() || feeds.iter().all(|f| f.tx.is_none()) {
            return;
        }
    }
}

/// The pump's end of a member's queue of pieces.
struct Feed {
    tx: Option<mpsc::Sender<Piece>>,
    /// Cancelled when the member's request has ended (answered, or given up on): a frozen
    /// member's connection may hold its queue for long after, and must not hold the pump.
    ended: CancellationToken,
}

/// A member's queue: the pump's end; and the member's, its pieces as a body (ending early
/// once the request has ended) and the guard that says so when dropped.
fn queue() -> (Feed, (impl futures::Stream<Item = Piece>, DropGuard)) {
    let (tx, rx) = mpsc::channel::<Piece>(QUEUED_PIECES);
    let ended = CancellationToken::new();
    let feed = Feed {
        tx: Some(tx),
        ended: ended.clone(),
    };
    let pieces = futures::stream::unfold((rx, ended.clone()), |(mut rx, ended)| async move {
        tokio::select! {
            p = rx.recv() => p.map(|p| (p, (rx, ended))),
            _ = ended.cancelled() => None,
        }
    });
    (feed, (pieces, ended.drop_guard()))
}

fn clone_piece(p: &Piece) -> Piece {
    match p {
        Ok(b) => Ok(b.clone()),
        Err(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
    }
}

/// The namespace and key of a multipart-upload request's path
/// (`/v1/namespaces/{ns}/blocks/{key}/uploads…`).
pub(super) fn upload_of(path: &str) -> Option<(&str, Vec<u8>)> {
    let rest = path.strip_prefix("/v1/namespaces/")?;
    let (ns, rest) = rest.split_once('/')?;
    let rest = rest.strip_prefix("blocks/")?;
    let (key, tail) = rest.split_once('/')?;
    if ns.is_empty() || !(tail == "uploads" || tail.starts_with("uploads/")) {
        return None;
    }
    Some((ns, hex::decode(key).ok()?))
}

/// A multipart-upload request in a pod of several: served by the key's first-ranked member
/// (its **home**), where the upload lives, forwarded there with its body streamed. Its home
/// unreachable, the request answers 503 (an upload lives in one node's memory: it cannot
/// move).
pub(super) async fn to_upload_home(
    st: &AppState,
    view: &ctxpod_pod::membership::PodView,
    req: Request,
    next: Next,
    (ns, key): (&str, &[u8]),
) -> Response {
    let Some(home) = view.ranked(ns, key).first().copied().cloned() else {
        return next.run(req).await;
    };
    if home.id == *st.node_id {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let has_body = matches!(
        parts.method,
        axum::http::Method::PUT | axum::http::Method::POST
    );
    let answer = if has_body {
        // The body is read to its end here (not just to its length by the HTTP client):
        // a stream that checks what passes through it (the S3 door's checksums) sees its end.
        let (feed, (pieces, ended)) = queue();
        let out = Some(Outgoing::Stream(pieces.boxed()));
        let forwarded = async move {
            let _ended = ended;
            forward_counted(st, &home, &parts, out, "upload").await
        };
        futures::join!(forwarded, pump(body, vec![feed])).0
    } else {
        forward_counted(st, &home, &parts, None, "upload").await
    };
    match answer {
        Some(r) => r,
        None => {
            let m = "the member that holds this key's uploads cannot be reached; retry";
            ApiError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                m,
            )
            .into_response()
        }
    }
}

/// After a multipart upload completed here (its home), the value copied to the key's
/// other members as a PUT would place it (the write plan over the pod: this node's copy
/// counts as one, a member that cannot be reached is replaced by the next in rank), each
/// copy streamed from this node's own. `h` and `p`: the completing caller's headers and
/// identity, under which the copies are sent. An error when fewer than the namespace's
/// copies could be made (or a member refused one).
pub(super) async fn replicate_upload(
    st: &AppState,
    (h, p): (&axum::http::HeaderMap, &crate::auth::Principal),
    (ns, key): (&str, &[u8]),
    (scoped, len): (&str, u64),
) -> Result<(), ApiError> {
    use ctxpod_pod::route::Route;
    let view = st.pod.view();
    if view.members.len() < 2 {
        return Ok(());
    }
    let copies = st.replication_of(scoped);
    let down = st.peers.missed.flags(&view);
    let Some(mut plan) = (Route::Write { copies }).write_plan(&view, &down, ns, key) else {
        return Ok(());
    };
    let mut put = Request::builder()
        .method(axum::http::Method::PUT)
        .uri(format!("/v1/namespaces/{ns}/blocks/{}", hex::encode(key)))
        .body(())
        .expect("a request")
        .into_parts()
        .0;
    put.headers = h.clone();
    for name in [
        axum::http::header::CONTENT_TYPE,
        axum::http::header::TRANSFER_ENCODING,
        axum::http::header::EXPECT,
    ] {
        put.headers.remove(name);
    }
    put.headers.remove(ctxpod_pod::route::HEADER_FORWARDED);
    put.headers
        .insert(axum::http::header::CONTENT_LENGTH, len.into());
    put.extensions.insert(p.clone());
    let mut by_member = BTreeMap::new();
    while let Some(round) = plan.next_round() {
        for m in round.into_keys() {
            let member = &view.members[m];
            if member.id == *st.node_id {
                // This node's copy: the completed value.
                plan.answer(m, 0, WriteAnswer::Applied { changed: true });
                by_member.insert(m, axum::http::StatusCode::CREATED.into_response());
                continue;
            }
            let resp = copy_local(st, &put, member, (scoped, key)).await;
            let mut stored = Vec::new();
            take_answer(&mut plan, &mut by_member, &mut stored, m, resp);
        }
    }
    let answer = pick_answer(plan.finish().pop(), by_member, false);
    if answer.status().is_success() {
        Ok(())
    } else {
        let st = answer.status();
        Err(ApiError::new(
            st,
            "not_replicated",
            format!(
                "the value is stored on this member, but its copies on the pod's other members \
                 were not all made ({st}): read repair completes them as it is read"
            ),
        ))
    }
}

/// This node's copy of a value PUT to `member`: its answer, or `None` if either end failed.
async fn copy_local(
    st: &AppState,
    put: &axum::http::request::Parts,
    member: &ctxpod_pod::membership::MemberInfo,
    (scoped, key): (&str, &[u8]),
) -> Option<Response> {
    let pieces = pieces_of(local_value(st, (scoped, key)).await?);
    let body = Some(Outgoing::Stream(pieces.boxed()));
    forward_counted(st, member, put, body, "write").await
}

/// This node's copy of a value as a body streamed from flash, as its GET sends it (its
/// share of the egress budget held); `None` when it is not here.
async fn local_value(st: &AppState, (scoped, key): (&str, &[u8])) -> Option<Body> {
    let reader = st.engine.open_value(scoped, key, None).await.ok()??;
    let held = ctxpod_engine::VALUE_READ_BYTES_MAX.min(reader.len() as usize);
    let permits = st.admit_egress(None, held).await.ok()?;
    let sent = st.metrics.sent_bytes.clone();
    Some(super::blocks::body_streaming(reader, permits, sent))
}

/// A body's pieces, as a stream another request's body is made of.
fn pieces_of(body: Body) -> impl futures::Stream<Item = Piece> {
    body.into_data_stream()
        .map(|p| p.map_err(std::io::Error::other))
}
