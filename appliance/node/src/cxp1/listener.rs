//! The CXP1 listener: connections accepted (and their TLS), the hello and authentication,
//! then one task reading requests and one writing frames per connection.

use crate::auth::{Access, Authenticator, Principal};
use crate::budget::Budgets;
use crate::conn::Gate;
use bytes::Bytes;
use ctxpod_client::proto_io::{write_parts, FrameInput, InputError};
use ctxpod_engine::Engine;
use ctxpod_wire::proto::{
    status, Frame, Header, Hello, Op, Request, Response, HELLO_AUTHENTICATED, HELLO_AUTH_REQUIRED,
    HELLO_BYTES, VERSION,
};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::conn::{Activity, Conn, Out, Rd, Wr};
use super::error;
use super::handshake::{access_of_op, authenticate, refuse, scope_request};
use super::ops::{get, handle, handle_put, read_put, Parsed};
use super::{
    HELLO_TIMEOUT, INFLIGHT_PER_CONNECTION, MAX_FRAME_BYTES, OUT_BYTES_PER_CONNECTION,
    STAGING_PER_CONNECTION, WRITE_BATCH_BYTES, WRITE_BATCH_FRAMES,
};
use crate::conn::client_gone;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// Accepts connections until the task is dropped.
pub async fn serve(
    listener: TcpListener,
    engine: Arc<Engine>,
    auth: Arc<Authenticator>,
    tls: Option<Arc<crate::tls::Tls>>,
    budgets: Budgets,
    gate: Arc<Gate>,
    handshakes: Arc<crate::conn::Handshakes>,
) {
    loop {
        let (sock, peer, place) = gate.accept(&listener).await;
        let handshake = match &tls {
            Some(_) => match handshakes.try_start() {
                Some(p) => Some(p),
                None => {
                    gate.count("handshakes");
                    continue;
                }
            },
            None => None,
        };
        let (engine, auth, budgets) = (engine.clone(), auth.clone(), budgets.clone());
        let (tls, gate) = (tls.clone(), gate.clone());
        tokio::spawn(async move {
            let _place = place;
            let r = connection(sock, peer, (tls, handshake), engine, auth, budgets, gate).await;
            if let Err(e) = r {
                tracing::debug!(%peer, "transfer connection closed: {e}");
            }
        });
    }
}

pub(crate) async fn connection(
    sock: TcpStream,
    addr: std::net::SocketAddr,
    (tls, mut handshake): (Option<Arc<crate::tls::Tls>>, Option<OwnedSemaphorePermit>),
    engine: Arc<Engine>,
    auth: Arc<Authenticator>,
    budgets: Budgets,
    gate: Arc<Gate>,
) -> anyhow::Result<()> {
    sock.set_nodelay(true)?;
    // Open as long as the read half is, which `read_requests` owns.
    let fd = std::os::fd::AsRawFd::as_raw_fd(&sock);
    // Who the connection is before any `Auth`: everyone's admin when authentication is off,
    // else the identity of its verified client certificate, if it maps to one.
    let mut who = (!auth.enabled()).then(Principal::anonymous_admin);
    let (mut rd, mut wr) = halves(sock, tls, &mut handshake, &auth, &mut who).await?;
    let peer = exchange_hellos((&mut rd, &mut wr), &auth, &who, engine.value_bytes_max()).await?;
    let (tx, rx) = mpsc::channel::<Out>(1024);
    let closed = CancellationToken::new();
    // Cancelled when the client is let go (idle, revoked) or does not take the frames left
    // once the connection ends: the writer stops waiting on its socket.
    let abandon = CancellationToken::new();
    let activity = Arc::new(Activity::default());
    let mut writer = tokio::spawn(write_frames(rx, wr, abandon.clone(), activity.clone()));
    let conn = Arc::new(Conn {
        engine,
        metrics: gate.metrics.clone(),
        auth,
        budgets,
        out: tx,
        out_bytes: Arc::new(Semaphore::new(OUT_BYTES_PER_CONNECTION)),
        staging_mine: Arc::new(Semaphore::new(STAGING_PER_CONNECTION)),
        regions: Mutex::new(HashMap::new()),
        tickets: Mutex::new(HashMap::new()),
        inflight: Arc::new(Semaphore::new(INFLIGHT_PER_CONNECTION)),
        activity,
        who: Mutex::new(who.clone()),
        closed,
        peer_max: peer.max_frame_bytes.min(MAX_FRAME_BYTES) as usize,
        peer: addr.ip(),
    });
    let idle = gate.limits.idle;
    let (result, let_go) = tokio::select! {
        r = read_requests(&conn, (FrameInput::new(rd, MAX_FRAME_BYTES), fd), who) => (r, false),
        () = watchdog(&conn, &gate, idle) => (Ok(()), true),
    };
    conn.closed.cancel();
    drop(conn);
    if let_go {
        abandon.cancel();
    }
    // Frames already queued (a last answer, an error) still go out, if the client takes
    // them within the idle timeout.
    if tokio::time::timeout(idle, &mut writer).await.is_err() {
        abandon.cancel();
        let _ = writer.await;
    }
    result
}

/// The connection's read and write halves, after its TLS handshake (whose permit goes
/// back once it is done) if it has one; a verified client certificate that maps to an
/// identity makes `who` that identity.
async fn halves(
    sock: TcpStream,
    tls: Option<Arc<crate::tls::Tls>>,
    handshake: &mut Option<OwnedSemaphorePermit>,
    auth: &Authenticator,
    who: &mut Option<Principal>,
) -> anyhow::Result<(Rd, Wr)> {
    Ok(match tls {
        None => {
            let (r, w) = sock.into_split();
            (Box::new(r), Box::new(w))
        }
        Some(tls) => {
            let (stream, peer) = tls.accept(sock).await?;
            drop(handshake.take());
            if let (None, Some(s)) = (&*who, &peer.subject) {
                *who = auth.identity(s).ok();
            }
            let (r, w) = tokio::io::split(stream);
            (Box::new(r), Box::new(w))
        }
    })
}

/// Reads the client's hello (within [`HELLO_TIMEOUT`]) and answers with the node's, which
/// says whether the connection is authenticated already; the client's hello.
async fn exchange_hellos(
    (rd, wr): (&mut Rd, &mut Wr),
    auth: &Authenticator,
    who: &Option<Principal>,
    value_bytes_max: u64,
) -> anyhow::Result<Hello> {
    let mut hello = [0u8; HELLO_BYTES];
    tokio::time::timeout(HELLO_TIMEOUT, rd.read_exact(&mut hello)).await??;
    let peer = Hello::decode(&hello)?;
    let flags = match who {
        _ if !auth.enabled() => 0,
        Some(_) => HELLO_AUTHENTICATED,
        None => HELLO_AUTH_REQUIRED,
    };
    let ours = Hello {
        version: VERSION,
        flags,
        max_frame_bytes: MAX_FRAME_BYTES,
        value_bytes_max: value_bytes_max.min(u32::MAX as u64) as u32,
    };
    wr.write_all(&ours.encode()).await?;
    wr.flush().await?;
    Ok(peer)
}

/// The connection's writer: writes the frames queued for the socket until the queue
/// closes, a write fails, or the connection is abandoned.
async fn write_frames(
    mut rx: mpsc::Receiver<Out>,
    mut wr: Wr,
    abandon: CancellationToken,
    activity: Arc<Activity>,
) {
    let mut batch: Vec<Out> = Vec::new();
    while let Some(out) = tokio::select! {
        o = rx.recv() => o,
        _ = abandon.cancelled() => None,
    } {
        // The frames queued now leave together, in as few writes as the socket
        // takes: a prefetch's ticket, pushes and `PrefetchDone`, or the answers
        // of pipelined requests, are one wake-up of the client, not one a part.
        let mut bytes = out.parts.iter().map(Bytes::len).sum::<usize>();
        batch.push(out);
        while bytes < WRITE_BATCH_BYTES && batch.len() < WRITE_BATCH_FRAMES {
            let Ok(o) = rx.try_recv() else { break };
            bytes += o.parts.iter().map(Bytes::len).sum::<usize>();
            batch.push(o);
        }
        let parts: Vec<&[u8]> = batch
            .iter()
            .flat_map(|o| o.parts.iter().map(|p| &p[..]))
            .collect();
        let written = tokio::select! {
            r = write_parts(&mut wr, &parts) => r.is_ok(),
            // A client that stopped reading is let go with its frames.
            _ = abandon.cancelled() => false,
        };
        drop(parts);
        // Their shares of the output and egress budgets go back once written.
        batch.clear();
        if !written {
            return;
        }
        activity.touch();
        // Over TLS a write may leave records in the session's buffer until a
        // flush: flush whenever no further frame is queued (a no-op on plain TCP).
        if rx.is_empty() && wr.flush().await.is_err() {
            return;
        }
    }
}

/// Idle: no byte either way for `idle`, no request running, no live ticket or
/// subscription (those may rightly stay quiet). Then the connection is closed. Returns
/// when the connection is to be let go: idle, or its credential revoked.
async fn watchdog(conn: &Conn, gate: &Gate, idle: Duration) {
    let tick = (idle / 4).clamp(Duration::from_millis(100), crate::auth::REVOCATION_CHECK);
    loop {
        tokio::time::sleep(tick).await;
        // A credential removed or changed at a reload ends its live connections.
        let revoked = conn
            .who
            .lock()
            .as_ref()
            .is_some_and(|p| !conn.auth.still_valid(p));
        if revoked {
            gate.count("revoked");
            return;
        }
        let busy = conn.inflight.available_permits() < INFLIGHT_PER_CONNECTION
            || !conn.tickets.lock().is_empty();
        if !busy && conn.activity.quiet_for() >= idle {
            gate.count("idle");
            return;
        }
    }
}

/// Reads and dispatches a connection's requests until it ends. `fd` is its socket, open
/// while `input` (its read half) lives: a write request read after the client closed or
/// reset the connection ([`client_gone`]) is not applied, and the connection ends.
pub(crate) async fn read_requests(
    conn: &Arc<Conn>,
    (mut input, fd): (FrameInput<Rd>, std::os::fd::RawFd),
    mut who: Option<Principal>,
) -> anyhow::Result<()> {
    let inflight = conn.inflight.clone();
    // Values being received on this connection (`PutValue`), by request id.
    let mut open = super::values::Open::default();
    loop {
        // A framing error (over the limit, unknown op) ends the connection: its byte stream
        // can no longer be trusted.
        let (header, body_len) = match input.next_header().await {
            Ok(Some(h)) => h,
            Ok(None) => return Ok(()),
            Err(InputError::Io(e)) => return Err(e.into()),
            Err(InputError::Framing(e)) => return Err(e.into()),
        };
        conn.activity.touch();
        let (op, id) = (header.op, header.request_id);
        if op == Op::Auth {
            match authenticate(conn, &mut input, header, body_len).await? {
                Some(p) => {
                    *conn.who.lock() = Some(p.clone());
                    who = Some(p);
                }
                // A wrong credential ends the connection: no guessing on one connection.
                None => return Ok(()),
            }
            continue;
        }
        // Nothing but `Auth` before authentication: refused, and the connection closed
        // without reading the body.
        let Some(p) = who.clone() else {
            let f = Response::Error("unauthorized: authenticate first (Auth)".into()).encode(
                op,
                status::UNAUTHORIZED,
                id,
            );
            conn.send_one(f).await;
            return Ok(());
        };
        // A value's pieces are received into its writer, admitted once, at its first piece.
        if op == Op::PutValue {
            let piece = (id, body_len, fd);
            if !super::values::read_piece(conn, &mut input, piece, &p, &mut open).await? {
                return Ok(());
            }
            continue;
        }
        match refusal(conn, &mut input, body_len, op, id, &p).await? {
            None => {}
            Some(true) => continue,
            Some(false) => return Ok(()),
        }
        let slot = inflight.clone().try_acquire_owned();
        let budget = conn.budgets.ingest.try_take(body_len);
        let (Ok(slot), Some(budget)) = (slot, budget) else {
            input.skip(body_len).await?;
            let f = Response::Error("busy: too many requests in flight, retry later".into())
                .encode(op, status::BUSY, id);
            if !conn.send_one(f).await {
                return Ok(());
            }
            continue;
        };
        // PUT bodies are received straight into their records' buffers; other requests
        // are small and decoded whole.
        let req = parse(&mut input, header, body_len, &p).await?;
        if access_of_op(op) == Access::Write && client_gone(fd) {
            conn.metrics.abandoned_writes.inc();
            return Ok(());
        }
        let conn = conn.clone();
        tokio::spawn(async move {
            let parts = match req {
                Parsed::Put(put) => {
                    let bytes = put.entries.iter().map(|e| e.2.len() as u64).sum();
                    match conn.auth.check_tenant_bytes(&conn.engine, &p, bytes) {
                        Ok(()) => vec![handle_put(&conn.engine, put, op, id).await],
                        Err(m) => error(op, id, status::FORBIDDEN, m),
                    }
                }
                Parsed::Other(Request::Get { ns, keys }) => {
                    let (parts, reserved, permits) = get(&conn, &ns, &keys, op, id).await;
                    drop(budget);
                    conn.send_reserved(parts, reserved, permits).await;
                    drop(slot);
                    return;
                }
                Parsed::Other(r) => match handle(&conn, r, op, id).await {
                    Some(parts) => parts,
                    None => return,
                },
                Parsed::Bad(e) => {
                    vec![Response::Error(e.to_string()).encode(op, status::BAD_REQUEST, id)]
                }
                Parsed::Invalid(m) => error(op, id, status::BAD_REQUEST, m),
            };
            drop(budget);
            conn.send(parts).await;
            drop(slot);
        });
    }
}

/// Refuses a request its principal may not make (its role) or not now (its tenant's
/// request rate), skipping its body: `None` when it is admitted, else whether the
/// connection goes on.
pub(super) async fn refusal(
    conn: &Conn,
    input: &mut FrameInput<Rd>,
    body_len: usize,
    op: Op,
    id: u64,
    p: &Principal,
) -> anyhow::Result<Option<bool>> {
    if !p.may(access_of_op(op)) {
        conn.metrics.forbidden.inc();
        let msg = "forbidden: this role may not do that";
        return Ok(Some(
            refuse(conn, input, body_len, op, id, status::FORBIDDEN, msg).await?,
        ));
    }
    if conn.auth.admit(p).is_err() {
        let msg = "rate limited: the tenant's request rate is spent; retry later";
        let st = status::TOO_MANY_REQUESTS;
        return Ok(Some(refuse(conn, input, body_len, op, id, st, msg).await?));
    }
    Ok(None)
}

/// Reads an admitted request's body. PUT bodies are received straight into their records'
/// buffers; other requests are small and decoded whole. Either is scoped to `p`'s
/// namespaces.
async fn parse(
    input: &mut FrameInput<Rd>,
    header: Header,
    body_len: usize,
    p: &Principal,
) -> anyhow::Result<Parsed> {
    Ok(if header.op == Op::Put {
        match read_put(input, body_len).await? {
            Ok(mut put) => match p.scope(&put.ns) {
                Ok(ns) => {
                    put.ns = ns;
                    Parsed::Put(put)
                }
                Err(e) => Parsed::Invalid(e.to_string()),
            },
            Err(e) => Parsed::Bad(e),
        }
    } else {
        let frame = Frame {
            header: Header {
                status: 0,
                ..header
            },
            body: input.take(body_len).await?,
        };
        match Request::decode(&frame) {
            Ok(mut r) => match scope_request(&mut r, p) {
                Ok(()) => Parsed::Other(r),
                Err(e) => Parsed::Invalid(e),
            },
            Err(e) => Parsed::Bad(e),
        }
    })
}
