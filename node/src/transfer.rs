//! The CXP1 transfer listener (`wire/PROTOCOL.md`): pipelined PUT / GET / MATCH / PIN /
//! UNPIN answered out of order, memory regions and PREFETCH tickets whose blocks are staged
//! from flash into node memory ahead of being PUSHed into the client's region, and KV event
//! subscriptions.
//!
//! Bounds, per connection: one frame of `max_frame_bytes` decoded at a time, at most
//! [`INFLIGHT_PER_CONNECTION`] requests running (more are answered BUSY), at most
//! [`OUT_BYTES_PER_CONNECTION`] of frames waiting for the socket (a client that never reads
//! stalls only its own requests, tickets and subscriptions), at most [`TICKETS_PER_CONNECTION`]
//! live tickets and subscriptions and [`REGIONS_PER_CONNECTION`] regions. Node-wide: request
//! bodies count against the ingest byte budget (as HTTP bodies do), and blocks staged for
//! pushes against the staging budget (`prefetch_staging_bytes`).

use crate::auth::{Access, Authenticator, Principal};
use crate::budget::{Budgets, Permit};
use crate::conn::Gate;
use bytes::Bytes;
use ctxpod_client::proto_io::{FrameInput, InputError};
use ctxpod_engine::events::{KvEvent, KvEventKind};
use ctxpod_engine::{Engine, EngineError, PutStatus, StagedBlock};
use ctxpod_wire::proto::{
    status, EventKind, Frame, GetEntry, Header, Hello, Op, Policy, PrefetchEntry, ProtoError,
    Request, Response, HELLO_AUTHENTICATED, HELLO_AUTH_REQUIRED, HELLO_BYTES, TOKEN_BYTES_MAX,
    VERSION,
};
use ctxpod_wire::Durability;
use futures::StreamExt;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The read and write halves of a connection, plain or TLS.
type Rd = Box<dyn tokio::io::AsyncRead + Send + Unpin>;
type Wr = Box<dyn tokio::io::AsyncWrite + Send + Unpin>;
use tokio::sync::{broadcast, mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Requests one connection runs at once; more are answered BUSY.
pub const INFLIGHT_PER_CONNECTION: usize = 32;
/// Bytes of frames one connection may have waiting for its socket.
pub const OUT_BYTES_PER_CONNECTION: usize = 64 << 20;
/// Live prefetch tickets (pushing, or holding their lease) and subscriptions per connection.
pub const TICKETS_PER_CONNECTION: usize = 1024;
pub const REGIONS_PER_CONNECTION: usize = 256;
/// Bytes of blocks one connection's prefetches may hold staged at once: its share of the
/// node's `prefetch_staging_bytes`.
pub const STAGING_PER_CONNECTION: usize = 64 << 20;
/// Blocks of one ticket staged (read and verified) ahead of the one being pushed.
pub const STAGE_AHEAD: usize = 32;
/// Events sent in one `Event` frame at most.
const EVENTS_PER_FRAME: usize = 256;
/// Largest frame this node accepts and announces.
pub const MAX_FRAME_BYTES: u32 = ctxpod_wire::proto::FRAME_BYTES_MAX;
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

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

/// A frame on its way to the socket, holding its share of the connection's output budget
/// and, for a Get's blocks, of the node's egress budget.
struct Out {
    parts: Vec<Bytes>,
    _budget: Option<OwnedSemaphorePermit>,
    _egress: Vec<Permit>,
}

/// What every task of one connection shares.
struct Conn {
    engine: Arc<Engine>,
    auth: Arc<Authenticator>,
    budgets: Budgets,
    out: mpsc::Sender<Out>,
    out_bytes: Arc<Semaphore>,
    /// This connection's share of the node's staging budget ([`STAGING_PER_CONNECTION`]).
    staging_mine: Arc<Semaphore>,
    /// Region id → size in bytes.
    regions: Mutex<HashMap<u32, u64>>,
    /// Live tickets and subscriptions, by id.
    tickets: Mutex<HashMap<u64, CancellationToken>>,
    /// Requests running ([`INFLIGHT_PER_CONNECTION`] at most; more are answered BUSY).
    inflight: Arc<Semaphore>,
    activity: Arc<Activity>,
    /// Who authenticated on this connection: checked against reloads of the credentials.
    who: Mutex<Option<Principal>>,
    /// Cancelled when the connection ends: every ticket and subscription stops.
    closed: CancellationToken,
    peer_max: usize,
    /// The client's address: its share of the node's egress budget.
    peer: std::net::IpAddr,
}

impl Conn {
    /// Queues a frame, waiting while the connection's output budget is spent. False once
    /// the connection is closing.
    async fn send(&self, parts: Vec<Bytes>) -> bool {
        self.send_reserved(parts, 0, Vec::new()).await
    }

    /// [`Conn::send`] of a frame of which `reserved` bytes already hold their share of the
    /// connection's output budget, in `permits`.
    async fn send_reserved(
        &self,
        parts: Vec<Bytes>,
        reserved: usize,
        permits: Vec<Permit>,
    ) -> bool {
        let bytes: usize = parts.iter().map(|p| p.len()).sum();
        let want = bytes
            .saturating_sub(reserved)
            .clamp(1, OUT_BYTES_PER_CONNECTION) as u32;
        let permit = tokio::select! {
            p = self.out_bytes.clone().acquire_many_owned(want) => p.ok(),
            _ = self.closed.cancelled() => None,
        };
        if permit.is_none() {
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

    async fn send_one(&self, frame: Bytes) -> bool {
        self.send(vec![frame]).await
    }

    /// Registers a ticket or subscription id; an Error frame if it cannot be.
    fn open_ticket(&self, op: Op, id: u64) -> Result<CancellationToken, Bytes> {
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

    fn close_ticket(&self, id: u64) {
        self.tickets.lock().remove(&id);
    }
}

async fn connection(
    sock: TcpStream,
    addr: std::net::SocketAddr,
    (tls, handshake): (Option<Arc<crate::tls::Tls>>, Option<OwnedSemaphorePermit>),
    engine: Arc<Engine>,
    auth: Arc<Authenticator>,
    budgets: Budgets,
    gate: Arc<Gate>,
) -> anyhow::Result<()> {
    sock.set_nodelay(true)?;
    // Who the connection is before any `Auth`: everyone's admin when authentication is off,
    // else the identity of its verified client certificate, if it maps to one.
    let mut who = (!auth.enabled()).then(Principal::anonymous_admin);
    let (mut rd, mut wr): (Rd, Wr) = match tls {
        None => {
            let (r, w) = sock.into_split();
            (Box::new(r), Box::new(w))
        }
        Some(tls) => {
            let (stream, peer) = tls.accept(sock).await?;
            drop(handshake);
            if let (None, Some(s)) = (&who, &peer.subject) {
                who = auth.identity(s).ok();
            }
            let (r, w) = tokio::io::split(stream);
            (Box::new(r), Box::new(w))
        }
    };
    let mut hello = [0u8; HELLO_BYTES];
    tokio::time::timeout(HELLO_TIMEOUT, rd.read_exact(&mut hello)).await??;
    let peer = Hello::decode(&hello)?;
    let flags = match &who {
        _ if !auth.enabled() => 0,
        Some(_) => HELLO_AUTHENTICATED,
        None => HELLO_AUTH_REQUIRED,
    };
    let ours = Hello {
        version: VERSION,
        flags,
        max_frame_bytes: MAX_FRAME_BYTES,
    };
    wr.write_all(&ours.encode()).await?;
    wr.flush().await?;
    let (tx, mut rx) = mpsc::channel::<Out>(1024);
    let closed = CancellationToken::new();
    // Cancelled when the client is let go (idle, revoked) or does not take the frames left
    // once the connection ends: the writer stops waiting on its socket.
    let abandon = CancellationToken::new();
    let activity = Arc::new(Activity::default());
    let mut writer = {
        let (abandon, activity) = (abandon.clone(), activity.clone());
        tokio::spawn(async move {
            while let Some(out) = tokio::select! {
                o = rx.recv() => o,
                _ = abandon.cancelled() => None,
            } {
                for p in &out.parts {
                    let written = tokio::select! {
                        r = wr.write_all(p) => r.is_ok(),
                        // A client that stopped reading is let go with its frames.
                        _ = abandon.cancelled() => false,
                    };
                    if !written {
                        return;
                    }
                    activity.touch();
                }
                // Over TLS a write may leave records in the session's buffer until a
                // flush: flush whenever no further frame is queued (a no-op on plain TCP).
                if rx.is_empty() && wr.flush().await.is_err() {
                    return;
                }
            }
        })
    };
    let conn = Arc::new(Conn {
        engine,
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
    // Idle: no byte either way for `idle`, no request running, no live ticket or
    // subscription (those may rightly stay quiet). Then the connection is closed.
    let idle = gate.limits.idle;
    let tick = (idle / 4).clamp(Duration::from_millis(100), crate::auth::REVOCATION_CHECK);
    let watchdog = async {
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
    };
    let (result, let_go) = tokio::select! {
        r = read_requests(&conn, FrameInput::new(rd, MAX_FRAME_BYTES), who) => (r, false),
        () = watchdog => (Ok(()), true),
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

/// When a connection last moved a byte (a request's header in, a frame out).
struct Activity {
    start: Instant,
    last_ms: std::sync::atomic::AtomicU64,
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
    fn touch(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last_ms.store(ms, std::sync::atomic::Ordering::Relaxed);
    }

    fn quiet_for(&self) -> Duration {
        let last = self.last_ms.load(std::sync::atomic::Ordering::Relaxed);
        self.start
            .elapsed()
            .saturating_sub(Duration::from_millis(last))
    }
}

/// What each request op needs.
pub fn access_of_op(op: Op) -> Access {
    match op {
        Op::Put | Op::Pin | Op::Unpin => Access::Write,
        _ => Access::Read,
    }
}

/// Puts a request's namespace in the caller's tenant ([`Principal::scope`]).
fn scope_request(req: &mut Request, p: &Principal) -> Result<(), String> {
    let ns = match req {
        Request::Get { ns, .. }
        | Request::Match { ns, .. }
        | Request::Pin { ns, .. }
        | Request::Unpin { ns, .. }
        | Request::Put { ns, .. }
        | Request::Prefetch { ns, .. }
        | Request::Subscribe { ns } => ns,
        Request::Ping
        | Request::RegisterRegion { .. }
        | Request::Cancel { .. }
        | Request::Auth { .. } => return Ok(()),
    };
    *ns = p.scope(ns).map_err(|e| e.to_string())?;
    Ok(())
}

/// Answers one frame with an error after discarding its body.
async fn refuse(
    conn: &Conn,
    input: &mut FrameInput<Rd>,
    body_len: usize,
    op: Op,
    id: u64,
    st: u16,
    msg: &str,
) -> anyhow::Result<bool> {
    input.skip(body_len).await?;
    Ok(conn
        .send_one(Response::Error(msg.into()).encode(op, st, id))
        .await)
}

/// The `Auth` exchange: the principal, or `None` once a refusal is queued (the connection
/// then closes).
async fn authenticate(
    conn: &Conn,
    input: &mut FrameInput<Rd>,
    header: Header,
    body_len: usize,
) -> anyhow::Result<Option<Principal>> {
    let id = header.request_id;
    if body_len > 2 + TOKEN_BYTES_MAX {
        conn.send_one(Response::Error("token too long".into()).encode(
            Op::Auth,
            status::BAD_REQUEST,
            id,
        ))
        .await;
        return Ok(None);
    }
    let frame = Frame {
        header,
        body: input.take(body_len).await?,
    };
    let token = match Request::decode(&frame) {
        Ok(Request::Auth { token }) => token,
        _ => Bytes::new(),
    };
    match conn.auth.bearer(&token) {
        Ok(p) => {
            let ok = Response::Authenticated {
                role: p.role,
                tenant: p.tenant.as_deref().unwrap_or("").to_string(),
            };
            conn.send_one(ok.encode(Op::Auth, status::OK, id)).await;
            Ok(Some(p))
        }
        Err(e) => {
            conn.send_one(Response::Error(format!("unauthorized: {e}")).encode(
                Op::Auth,
                status::UNAUTHORIZED,
                id,
            ))
            .await;
            Ok(None)
        }
    }
}

async fn read_requests(
    conn: &Arc<Conn>,
    mut input: FrameInput<Rd>,
    mut who: Option<Principal>,
) -> anyhow::Result<()> {
    let inflight = conn.inflight.clone();
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
        if !p.may(access_of_op(op)) {
            conn.engine.metrics().forbidden.inc();
            let msg = "forbidden: this role may not do that";
            if refuse(conn, &mut input, body_len, op, id, status::FORBIDDEN, msg).await? {
                continue;
            }
            return Ok(());
        }
        if conn.auth.admit(&p).is_err() {
            let msg = "rate limited: the tenant's request rate is spent; retry later";
            let st = status::TOO_MANY_REQUESTS;
            if refuse(conn, &mut input, body_len, op, id, st, msg).await? {
                continue;
            }
            return Ok(());
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
        let req = if op == Op::Put {
            match read_put(&mut input, body_len).await? {
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
                Ok(mut r) => match scope_request(&mut r, &p) {
                    Ok(()) => Parsed::Other(r),
                    Err(e) => Parsed::Invalid(e),
                },
                Err(e) => Parsed::Bad(e),
            }
        };
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

fn code(e: &EngineError) -> u16 {
    crate::errors::status_of(e).0.as_u16()
}

fn error(op: Op, id: u64, st: u16, msg: impl Into<String>) -> Vec<Bytes> {
    vec![Response::Error(msg.into()).encode(op, st, id)]
}

/// The response's frame (as pieces), or `None` when the handler sends its own frames.
async fn handle(conn: &Arc<Conn>, req: Request, op: Op, id: u64) -> Option<Vec<Bytes>> {
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
            let mut r = conn.regions.lock();
            if bytes == 0 {
                r.remove(&region_id);
            } else if r.len() >= REGIONS_PER_CONNECTION && !r.contains_key(&region_id) {
                return Some(error(
                    op,
                    id,
                    status::BAD_REQUEST,
                    format!("at most {REGIONS_PER_CONNECTION} regions per connection"),
                ));
            } else {
                r.insert(region_id, bytes);
            }
            vec![Response::RegionRegistered.encode(op, status::OK, id)]
        }
        Request::Prefetch {
            ns,
            region_id,
            policy,
            deadline_ms,
            lease_ms,
            entries,
        } => {
            let Some(region_bytes) = conn.regions.lock().get(&region_id).copied() else {
                return Some(error(
                    op,
                    id,
                    status::NOT_FOUND,
                    format!("region {region_id} is not registered on this connection"),
                ));
            };
            if let Some((i, e)) = entries.iter().enumerate().find(|(_, e)| {
                e.offset
                    .checked_add(e.max_len as u64)
                    .is_none_or(|end| end > region_bytes)
            }) {
                return Some(error(
                    op,
                    id,
                    status::BAD_REQUEST,
                    format!(
                        "entry {i}: {} bytes at offset {} do not fit region {region_id} of {region_bytes} bytes",
                        e.max_len, e.offset
                    ),
                ));
            }
            if policy == Policy::Timeout && deadline_ms == 0 {
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
                ns,
                policy,
                deadline: (deadline_ms > 0)
                    .then(|| Instant::now() + Duration::from_millis(deadline_ms as u64)),
                lease: Duration::from_millis(
                    (lease_ms as u64).min(ctxpod_wire::PREFETCH_LEASE_MS_MAX),
                ),
                entries,
            };
            // The ticket outlives this request (its pushes, then its lease).
            let conn = conn.clone();
            tokio::spawn(async move {
                prefetch(&conn, id, p, token).await;
                conn.close_ticket(id);
            });
            return None;
        }
        Request::Cancel { ticket } => match conn.tickets.lock().get(&ticket) {
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
        },
        Request::Auth { .. } => error(op, id, status::INTERNAL, "internal: Auth is handled first"),
        Request::Subscribe { ns } => {
            let (ns_id, rx) = match engine.subscribe(&ns) {
                Ok(s) => s,
                Err(e) => return Some(fail(&e)),
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
            return None;
        }
    })
}

/// A Get. Blocks are admitted in order while they fit the client's frame, this
/// connection's output budget and the node's egress budget, each taken before the block is
/// read; only admitted blocks are read, the others answer 413 (the frame is full: ask again
/// in a smaller batch) or BUSY without costing the node anything. The frame, the bytes of
/// it already taken from the connection's output budget, and the budgets' permits, held
/// until the frame is written.
async fn get(
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
    // Per key: the bytes admitted for it, or the status it answers without a read.
    let plan: Vec<Result<usize, u16>> = keys
        .iter()
        .map(|k| match engine.block_len(ns, k) {
            Err(e) => Err(code(&e)),
            Ok(None) => Err(status::NOT_FOUND),
            Ok(Some(len)) if len > room => Err(status::TOO_LARGE),
            Ok(Some(len)) => {
                let mine = conn
                    .out_bytes
                    .clone()
                    .try_acquire_many_owned(len.max(1) as u32)
                    .ok();
                match (mine, conn.budgets.take_egress(Some(conn.peer), len)) {
                    (Some(a), Some(b)) => {
                        room -= len;
                        reserved += len.max(1);
                        permits.push(a);
                        permits.extend(b);
                        Ok(len)
                    }
                    _ => {
                        busy += 1;
                        Err(status::BUSY)
                    }
                }
            }
        })
        .collect();
    if busy > 0 {
        engine
            .metrics()
            .busy_rejections
            .with_label_values(&["egress"])
            .inc_by(busy);
    }
    let results = futures::future::join_all(plan.iter().zip(keys).map(|(p, k)| async move {
        match p {
            Ok(len) => match engine.get(ns, k).await {
                Ok(Some((data, crc))) if data.len() <= *len => GetEntry {
                    status: status::OK,
                    crc32c: crc,
                    data,
                },
                // Stored again, larger, since it was admitted: ask again.
                Ok(Some(_)) => entry(status::BUSY),
                Ok(None) => entry(status::NOT_FOUND),
                Err(e) => entry(code(&e)),
            },
            Err(st) => entry(*st),
        }
    }))
    .await;
    let parts = Response::Get(results).encode_parts(op, status::OK, id);
    (parts, reserved, permits)
}

fn entry(status: u16) -> GetEntry {
    GetEntry {
        status,
        crc32c: 0,
        data: Bytes::new(),
    }
}

struct Prefetch {
    ns: String,
    policy: Policy,
    deadline: Option<Instant>,
    lease: Duration,
    entries: Vec<PrefetchEntry>,
}

/// Status of an entry that a cancel stopped before it was pushed.
pub const CANCELLED: u16 = 499;

/// Runs one prefetch ticket: holds its blocks, answers the ticket, pushes every entry (its
/// block or a miss) in order while up to [`STAGE_AHEAD`] later blocks are read from flash
/// and verified into node memory, sends `PrefetchDone`, then keeps the blocks leased for
/// `lease` unless the ticket is cancelled or the connection ends.
async fn prefetch(conn: &Arc<Conn>, id: u64, p: Prefetch, token: CancellationToken) {
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
    let m = engine.metrics();
    if !conn
        .send_one(Response::Ticket(id).encode(Op::Prefetch, status::OK, id))
        .await
    {
        return;
    }
    let push = |i: usize, st: u16, crc: u32, data: Bytes| {
        let outcome = match st {
            status::OK => "pushed",
            status::NOT_FOUND => "miss",
            status::DEADLINE => "deadline",
            CANCELLED => "cancelled",
            status::BUSY => "busy",
            status::TOO_LARGE => "too_large",
            _ => "error",
        };
        m.prefetch_blocks.with_label_values(&[outcome]).inc();
        let e = &p.entries[i];
        Response::Push {
            index: i as u32,
            status: st,
            crc32c: crc,
            offset: e.offset,
            data,
        }
        .encode_parts(Op::Push, status::OK, id)
    };
    let (mut pushed, mut missed) = (0u32, 0u32);
    // Keys the node does not hold are misses at once, whatever the policy.
    for i in (0..present.len()).filter(|&i| !present[i]) {
        missed += 1;
        if !conn.send(push(i, status::NOT_FOUND, 0, Bytes::new())).await {
            return;
        }
    }
    let staging = &conn.budgets.staging;
    let pr = &p;
    // A block is staged under its share of the node's staging budget and of this
    // connection's (so one client that stalls its pushes cannot take the node's), both
    // taken for the entry's `max_len` before the read and cut to the block's size after it.
    let stage = |i: usize| {
        let (p, e) = (pr, &pr.entries[i]);
        let want = (e.max_len as usize).clamp(1, ctxpod_wire::BLOCK_BYTES_MAX);
        async move {
            let mine = conn.staging_mine.clone();
            let permits = match p.policy {
                Policy::BestEffort => mine
                    .try_acquire_many_owned(want as u32)
                    .ok()
                    .and_then(|a| staging.try_take(want).map(|b| (a, b))),
                _ => match mine.acquire_many_owned(want as u32).await.ok() {
                    Some(a) => staging.take(want).await.map(|b| (a, b)),
                    None => None,
                },
            };
            let Some(mut permits) = permits else {
                engine
                    .metrics()
                    .busy_rejections
                    .with_label_values(&["staging"])
                    .inc();
                return (i, Err(status::BUSY), None);
            };
            let r = match engine.get(&p.ns, &e.key).await {
                Ok(Some((b, _))) if b.len() > e.max_len as usize => Err(status::TOO_LARGE),
                Ok(Some(found)) => Ok(found),
                Ok(None) => Err(status::NOT_FOUND),
                Err(e) => Err(code(&e)),
            };
            let staged = r.as_ref().map_or(1, |(b, _)| b.len().max(1));
            if staged < want {
                drop(permits.0.split(want - staged));
                drop(permits.1.split(want - staged));
            }
            (i, r, Some(permits))
        }
    };
    let here: Vec<usize> = (0..present.len()).filter(|&i| present[i]).collect();
    let mut staged = futures::stream::iter(here.clone())
        .map(stage)
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
        let next = tokio::select! {
            biased;
            _ = token.cancelled() => { stop = Some(CANCELLED); break; }
            _ = &mut deadline => { stop = Some(status::DEADLINE); break; }
            n = staged.next() => n,
        };
        let Some((i, r, _permit)) = next else { break };
        left.pop();
        let frame = match r {
            Ok((data, crc)) => {
                pushed += 1;
                m.prefetch_pushed_bytes.inc_by(data.len() as u64);
                push(i, status::OK, crc, data)
            }
            Err(st) => {
                missed += 1;
                push(i, st, 0, Bytes::new())
            }
        };
        if !conn.send(frame).await {
            return;
        }
    }
    drop(staged);
    if let Some(st) = stop {
        for i in left.into_iter().rev() {
            missed += 1;
            if !conn.send(push(i, st, 0, Bytes::new())).await {
                return;
            }
        }
    }
    m.prefetch_tickets.inc();
    let done = Response::PrefetchDone { pushed, missed }.encode(Op::PrefetchDone, status::OK, id);
    if !conn.send_one(done).await {
        return;
    }
    // The lease: the blocks stay on the node while decode may still ask for them again.
    tokio::select! {
        _ = tokio::time::sleep(p.lease) => {}
        _ = token.cancelled() => {}
    }
    drop(held);
}

/// Streams the KV events of namespace `ns_id` until cancelled, the connection ends or the
/// namespace is deleted.
async fn subscription(
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

enum Parsed {
    Put(StagedPut),
    Other(Request),
    Bad(ProtoError),
    /// Well-formed, but naming something the caller may not (a bad namespace name).
    Invalid(String),
}

/// A `Put` body received (`FrameInput::read_put_body`), each block in the buffer its record
/// is written from.
type StagedPut = ctxpod_client::proto_io::PutBody<StagedBlock>;

/// Receives a PUT body of `len` bytes with the codec's parser, each block straight into the
/// buffer its record will be written from (its CRC32C computed as it lands). `Ok(Err(_))`:
/// the body was consumed but is malformed (the connection goes on); `Err(_)`: the
/// connection failed.
async fn read_put<R: tokio::io::AsyncRead + Unpin>(
    input: &mut FrameInput<R>,
    len: usize,
) -> std::io::Result<Result<StagedPut, ProtoError>> {
    input
        .read_put_body(len, |n| {
            StagedBlock::new(n).map_err(|_| ProtoError::BlockTooLarge(n as u32))
        })
        .await
}

async fn handle_put(engine: &Engine, p: StagedPut, op: Op, id: u64) -> Bytes {
    let StagedPut {
        ns,
        durability,
        entries,
    } = p;
    // The wire's durability, mapped by name (never by number).
    let durability = match durability {
        ctxpod_wire::proto::Durability::Durable => Durability::Durable,
        ctxpod_wire::proto::Durability::Fast => Durability::Fast,
    };
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
