//! The CXP1 client for KV block managers: requests pipelined by id on one connection and
//! answered in any order; a request refused BUSY retried with exponential backoff; CRC32C
//! computed on puts and checked on gets and pushes; memory regions into which prefetched
//! blocks are read straight from the socket ([`TransferClient::prefetch`] returns a
//! [`Ticket`] to await whole, block by block, poll or cancel); KV event subscriptions.
//! [`TransferPool`] spreads requests over several connections.

use crate::proto_io::{write_parts, FrameInput, InputError};
use crate::region::{Region, RegionError, RegionInner};
use bytes::Bytes;
use ctxpod_wire::proto::{
    self, status, Durability, EventKind, GetEntry, Hello, Op, Policy, PrefetchEntry,
    PrefetchRequest, PutEntry, Request, Response, HELLO_BYTES,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub mod direct;
mod pool;
mod reader;
mod ticket;
mod values;
pub use pool::TransferPool;
use reader::read_loop;
use ticket::TicketState;
pub use ticket::{BlockState, EventBatch, PrefetchOptions, Progress, Subscription, Ticket};

/// The read and write halves of a connection, plain or TLS.
pub(crate) type Rd = Box<dyn tokio::io::AsyncRead + Send + Unpin>;
pub(crate) type Wr = Box<dyn tokio::io::AsyncWrite + Send + Unpin>;
use tokio::sync::{mpsc, oneshot, watch};

#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("protocol: {0}")]
    Proto(#[from] proto::ProtoError),
    #[error("the connection closed")]
    Closed,
    #[error("the node refused the request (status {status}): {message}")]
    Refused { status: u16, message: String },
    #[error("block {0} came back with a CRC32C that does not match its bytes")]
    Corrupt(usize),
    #[error("unexpected response {0:?}")]
    Unexpected(Op),
    #[error("region: {0}")]
    Region(#[from] RegionError),
    #[error("region {0} is not registered on this connection")]
    UnknownRegion(u32),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("the node requires authentication: give a token or a client certificate")]
    AuthRequired,
    #[error("{0}")]
    Http(#[from] crate::client::ClientError),
    #[error("the request's frame is {bytes} bytes, over the node's limit of {max}: send fewer or smaller blocks per request")]
    TooLarge { bytes: usize, max: usize },
    /// A deadline of [`Deadlines`](crate::connect::Deadlines) passed: the node counts as
    /// unreachable for this call (and the connection is closed).
    #[error("{what} got no answer within {after:?} (the {which} deadline): the node counts as unreachable")]
    TimedOut {
        what: String,
        which: &'static str,
        after: Duration,
    },
}

pub use crate::BUSY_ATTEMPTS;
/// KV events buffered per subscription in the client; beyond it they are counted as lost.
pub const EVENTS_BUFFER: usize = 64;

pub(crate) type Pending = HashMap<u64, oneshot::Sender<(u16, Response)>>;

/// What the connection's reader and its callers share.
pub(crate) struct Shared {
    /// Requests waiting for their response; `None` once the connection is gone.
    pending: Mutex<Option<Pending>>,
    /// Live prefetch tickets and subscriptions, by id.
    streams: Mutex<HashMap<u64, Stream>>,
    regions: Mutex<HashMap<u32, Region>>,
}

pub(crate) enum Stream {
    Prefetch(Arc<TicketState>),
    Events(mpsc::Sender<EventBatch>, Arc<AtomicU64>),
    /// A `GetValue` answer, landing piece by piece.
    Value(Arc<values::ValueSink>),
}

pub(crate) struct ClientInner {
    wr: tokio::sync::Mutex<Wr>,
    /// The largest frame the node takes (its hello, capped by ours).
    peer_max_frame: usize,
    /// The largest value the node stores (its hello; 0: it takes blocks only).
    value_bytes_max: u64,
    shared: Arc<Shared>,
    next_id: AtomicU64,
    busy_retries: AtomicU64,
    /// One request's deadline ([`Deadlines::request`](crate::connect::Deadlines)).
    request_deadline: Duration,
    /// The TCP socket's descriptor, open as long as `wr` (which owns the socket, or shares
    /// its TLS stream) lives: reset at a request's deadline.
    fd: std::os::fd::RawFd,
    /// Connections for calls answered on the calling thread ([`direct`]); `None` over TLS.
    direct: Option<direct::Lane>,
}

pub struct TransferClient {
    inner: Arc<ClientInner>,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for TransferClient {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl ClientInner {
    fn id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Gives the connection up at a deadline: every request on it fails, and it is reset
    /// ([`reset`]), so the node applies nothing more of what it sent.
    pub(crate) fn give_up(&self) {
        self.shared.pending.lock().expect("pending map").take();
        reset(self.fd);
    }

    /// Sends `req` under `id` and waits for its response, within the request deadline. A
    /// request past it closes the connection (a frame may be half written, and a node that
    /// does not answer one request will not answer the next): every request on it fails,
    /// and a pod client opens a new one, or asks another member.
    async fn call_as(&self, id: u64, req: &Request) -> Result<Response, TransferError> {
        if let Some(lane) = self.direct.as_ref().filter(|l| l.takes(req)) {
            let parts = req.encode_parts(id);
            let len: usize = parts.iter().map(|p| p.len()).sum();
            if len <= self.peer_max_frame {
                let slices: Vec<&[u8]> = parts.iter().map(|p| &p[..]).collect();
                if let Some(r) = lane.call(id, req, &slices).await {
                    return answered(r?);
                }
            }
        }
        match tokio::time::timeout(self.request_deadline, self.call_as_now(id, req)).await {
            Ok(r) => r,
            Err(_) => {
                self.give_up();
                Err(TransferError::TimedOut {
                    what: format!("a CXP1 {:?} request", req.op()),
                    which: "request",
                    after: self.request_deadline,
                })
            }
        }
    }

    async fn call_as_now(&self, id: u64, req: &Request) -> Result<Response, TransferError> {
        // Block data is written from the caller's buffers, not copied into a frame.
        let parts = req.encode_parts(id);
        // A frame over the node's limit would make it drop the connection, failing every
        // request on it: refuse it here, with nothing sent.
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len > self.peer_max_frame {
            return Err(TransferError::TooLarge {
                bytes: len,
                max: self.peer_max_frame,
            });
        }
        let (tx, rx) = oneshot::channel();
        match self.shared.pending.lock().expect("pending map").as_mut() {
            Some(m) => m.insert(id, tx),
            None => return Err(TransferError::Closed),
        };
        let mut wr = self.wr.lock().await;
        // One vectored write for the frame's parts. The flush matters over TLS: a write may
        // leave records in the TLS session's buffer, and only a flush (or a later write)
        // sends them.
        let slices: Vec<&[u8]> = parts.iter().map(|p| &p[..]).collect();
        let written = match write_parts(&mut *wr, &slices).await {
            Ok(()) => wr.flush().await,
            Err(e) => Err(e),
        };
        drop(wr);
        if let Err(e) = written {
            self.shared
                .pending
                .lock()
                .expect("pending map")
                .as_mut()
                .map(|m| m.remove(&id));
            return Err(e.into());
        }
        answered(rx.await.map_err(|_| TransferError::Closed)?)
    }

    /// Runs `attempt` with a fresh id until the node stops answering BUSY (backoff 1 → 256
    /// ms, [`BUSY_ATTEMPTS`] attempts).
    async fn retry_busy<T, F, Fut>(&self, mut attempt: F) -> Result<T, TransferError>
    where
        F: FnMut(u64) -> Fut,
        Fut: std::future::Future<Output = Result<T, TransferError>>,
    {
        let mut backoff = Duration::from_millis(1);
        for n in 1..=BUSY_ATTEMPTS {
            match attempt(self.id()).await {
                Err(TransferError::Refused { status, .. })
                    if status == status::BUSY && n < BUSY_ATTEMPTS =>
                {
                    self.busy_retries.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(256));
                }
                r => return r,
            }
        }
        unreachable!("the last attempt returns")
    }

    async fn call(&self, req: &Request) -> Result<Response, TransferError> {
        self.retry_busy(|id| self.call_as(id, req)).await
    }

    /// Sends a request that opens a ticket or subscription (answered `Ticket`), with its
    /// stream registered under the request's id before the request leaves (its frames may
    /// follow the answer at once); the id.
    async fn open_stream(
        &self,
        req: &Request,
        stream: impl Fn() -> Stream,
    ) -> Result<u64, TransferError> {
        let streams = &self.shared.streams;
        self.retry_busy(|id| {
            streams.lock().expect("streams").insert(id, stream());
            async move {
                let r = self.call_as(id, req).await;
                if r.is_err() {
                    streams.lock().expect("streams").remove(&id);
                }
                match r? {
                    Response::Ticket(_) => Ok(id),
                    r => Err(TransferError::Unexpected(r.op())),
                }
            }
        })
        .await
    }
}

/// Sends our hello and reads the node's.
pub(crate) async fn exchange_hellos<R, W>(rd: &mut R, wr: &mut W) -> Result<Hello, TransferError>
where
    R: tokio::io::AsyncRead + Unpin + ?Sized,
    W: tokio::io::AsyncWrite + Unpin + ?Sized,
{
    let ours = Hello {
        version: proto::VERSION,
        flags: 0,
        max_frame_bytes: proto::FRAME_BYTES_MAX,
        value_bytes_max: 0,
    };
    wr.write_all(&ours.encode()).await?;
    wr.flush().await?;
    let mut h = [0u8; HELLO_BYTES];
    rd.read_exact(&mut h).await?;
    Ok(Hello::decode(&h)?)
}

/// A request's answer: its response, or the node's refusal.
fn answered((st, resp): (u16, Response)) -> Result<Response, TransferError> {
    match resp {
        Response::Error(message) => Err(TransferError::Refused {
            status: st,
            message,
        }),
        r => Ok(r),
    }
}

/// Resets a connection given up on: `connect` with `AF_UNSPEC` dissolves a TCP socket's
/// association without closing its descriptor (which the reader and writer halves still
/// hold), sending an RST at once and dropping what was not sent yet. The node then finds the
/// connection reset when it gets to it, and applies none of the requests that still wait in
/// its socket buffers (a node frozen, or too slow, past the deadline): a put the client gave
/// up on cannot land after a delete it made since (api/PROTOCOL.md, "Deadlines").
fn reset(fd: std::os::fd::RawFd) {
    // SAFETY: a zeroed `sockaddr` is a valid value; only its family is read for AF_UNSPEC.
    let mut addr: libc::sockaddr = unsafe { std::mem::zeroed() };
    addr.sa_family = libc::AF_UNSPEC as libc::sa_family_t;
    // SAFETY: `fd` is this connection's socket, open while the client holds its halves;
    // `addr` is a live sockaddr of the length given. A failure leaves the socket as it was
    // (already closed by the node, say), which is as good.
    unsafe {
        libc::connect(
            fd,
            &addr,
            std::mem::size_of::<libc::sockaddr>() as libc::socklen_t,
        )
    };
}

impl TransferClient {
    /// A plain TCP connection without credentials.
    pub async fn connect(addr: &str) -> Result<TransferClient, TransferError> {
        Self::connect_with(addr, &crate::connect::Connect::default()).await
    }

    /// A connection with a bearer token and/or TLS (`addr` is `host:port`; the host is the
    /// name the node's certificate must carry).
    ///
    /// The whole of it (TCP, TLS, the hello and `Auth`) within the connect deadline.
    pub async fn connect_with(
        addr: &str,
        how: &crate::connect::Connect,
    ) -> Result<TransferClient, TransferError> {
        Self::connect_counting(addr, how, Arc::default()).await
    }

    /// [`Self::connect_with`], counting its direct calls into `direct_calls` (a pod
    /// client's count outlives the connections it replaces).
    pub(crate) async fn connect_counting(
        addr: &str,
        how: &crate::connect::Connect,
        direct_calls: Arc<AtomicU64>,
    ) -> Result<TransferClient, TransferError> {
        how.deadlines
            .check()
            .map_err(|e| TransferError::Http(crate::client::ClientError::Invalid(e)))?;
        let after = how.deadlines.connect;
        tokio::time::timeout(after, Self::connect_now(addr, how, direct_calls))
            .await
            .map_err(|_| TransferError::TimedOut {
                what: format!("connecting to {addr}"),
                which: "connect",
                after,
            })?
    }

    async fn connect_now(
        addr: &str,
        how: &crate::connect::Connect,
        direct_calls: Arc<AtomicU64>,
    ) -> Result<TransferClient, TransferError> {
        let sock = TcpStream::connect(addr).await?;
        sock.set_nodelay(true)?;
        let fd = std::os::fd::AsRawFd::as_raw_fd(&sock);
        let (mut rd, mut wr): (Rd, Wr) = match &how.tls {
            None => {
                let (r, w) = sock.into_split();
                (Box::new(r), Box::new(w))
            }
            Some(cfg) => {
                let host = addr
                    .rsplit_once(':')
                    .map_or(addr, |(h, _)| h)
                    .trim_start_matches('[')
                    .trim_end_matches(']');
                let name = rustls_pki_types::ServerName::try_from(host.to_string())
                    .map_err(|e| TransferError::Tls(format!("server name {host:?}: {e}")))?;
                let tls = tokio_rustls::TlsConnector::from(cfg.clone())
                    .connect(name, sock)
                    .await?;
                let (r, w) = tokio::io::split(tls);
                (Box::new(r), Box::new(w))
            }
        };
        let theirs = exchange_hellos(&mut rd, &mut wr).await?;
        if theirs.flags & proto::HELLO_AUTH_REQUIRED != 0 && how.token.is_none() {
            return Err(TransferError::AuthRequired);
        }
        let shared = Arc::new(Shared {
            pending: Mutex::new(Some(HashMap::new())),
            streams: Mutex::new(HashMap::new()),
            regions: Mutex::new(HashMap::new()),
        });
        let reader = tokio::spawn(read_loop(
            FrameInput::new(rd, proto::FRAME_BYTES_MAX),
            shared.clone(),
        ));
        let client = TransferClient {
            inner: Arc::new(ClientInner {
                wr: tokio::sync::Mutex::new(wr),
                peer_max_frame: theirs.max_frame_bytes.min(proto::FRAME_BYTES_MAX) as usize,
                value_bytes_max: theirs.value_bytes_max as u64,
                shared,
                next_id: AtomicU64::new(1),
                busy_retries: AtomicU64::new(0),
                request_deadline: how.deadlines.request,
                fd,
                direct: direct::Lane::new(addr, how, direct_calls),
            }),
            reader,
        };
        if let Some(t) = &how.token {
            client.authenticate(t.as_bytes()).await?;
        }
        Ok(client)
    }

    /// Presents a bearer token; the role and tenant it grants. A refused token closes the
    /// connection.
    pub async fn authenticate(&self, token: &[u8]) -> Result<(proto::Role, String), TransferError> {
        let req = Request::Auth {
            token: Bytes::copy_from_slice(token),
        };
        match self.inner.call_as(self.inner.id(), &req).await? {
            Response::Authenticated { role, tenant } => Ok((role, tenant)),
            r => Err(TransferError::Unexpected(r.op())),
        }
    }

    /// Requests, and entries of batch GETs, sent again because the node answered BUSY.
    pub fn busy_retries(&self) -> u64 {
        self.inner.busy_retries.load(Ordering::Relaxed)
    }

    /// Calls answered on the calling thread ([`direct`]).
    pub fn direct_calls(&self) -> u64 {
        self.inner
            .direct
            .as_ref()
            .map_or(0, |l| l.calls.load(Ordering::Relaxed))
    }

    /// Whether the connection has closed (the node went away, or a refused token): every
    /// request on it now fails with [`TransferError::Closed`].
    pub fn is_closed(&self) -> bool {
        self.inner
            .shared
            .pending
            .lock()
            .expect("pending map")
            .is_none()
    }

    /// The largest frame the node takes from this client: a batch put must fit in it.
    pub fn max_frame_bytes(&self) -> usize {
        self.inner.peer_max_frame
    }

    /// Whether `region` is registered on this connection.
    pub fn has_region(&self, region: &Region) -> bool {
        self.inner
            .shared
            .regions
            .lock()
            .expect("regions")
            .contains_key(&region.id())
    }

    async fn call(&self, req: &Request) -> Result<Response, TransferError> {
        self.inner.call(req).await
    }

    pub async fn ping(&self) -> Result<(), TransferError> {
        match self.call(&Request::Ping).await? {
            Response::Pong => Ok(()),
            r => Err(TransferError::Unexpected(r.op())),
        }
    }

    /// Stores blocks; per block, the status (201 stored, 200 already there, 409, 422, 503,
    /// 507, …).
    pub async fn put(
        &self,
        ns: &str,
        blocks: &[(Bytes, Bytes)],
        durability: Durability,
    ) -> Result<Vec<u16>, TransferError> {
        if blocks
            .iter()
            .any(|(_, d)| d.len() > ctxpod_wire::BLOCK_BYTES_MAX)
        {
            return self.put_mixed(ns, blocks, durability).await;
        }
        let entries = blocks
            .iter()
            .map(|(k, d)| PutEntry {
                key: k.clone(),
                crc32c: ctxpod_wire::crc32c(d),
                data: d.clone(),
            })
            .collect();
        let req = Request::Put {
            ns: ns.into(),
            durability,
            entries,
        };
        match self.call(&req).await? {
            Response::Put(es) => Ok(es.into_iter().map(|(s, _)| s).collect()),
            r => Err(TransferError::Unexpected(r.op())),
        }
    }

    /// Blocks by key: `Some(bytes)` (CRC32C checked) or `None` for a miss. Entries the node
    /// defers (413: over the answer's frame; BUSY) are asked again ([`TransferClient::get_all`]);
    /// the first entry it still refuses fails the whole call.
    pub async fn get(&self, ns: &str, keys: &[Bytes]) -> Result<Vec<Option<Bytes>>, TransferError> {
        self.get_all(ns, keys).await?.into_iter().collect()
    }

    /// [`TransferClient::get_each`] of any number of keys, until each entry has its answer:
    /// lists split at the protocol's limit, entries the node answers 413 (the frame is full)
    /// asked again at once, entries it answers BUSY (its egress or the connection's output
    /// budget is spent) after a backoff, [`BUSY_ATTEMPTS`] rounds at most.
    pub async fn get_all(
        &self,
        ns: &str,
        keys: &[Bytes],
    ) -> Result<Vec<Result<Option<Bytes>, TransferError>>, TransferError> {
        let c = self;
        let mut out: Vec<Option<Result<Option<Bytes>, TransferError>>> =
            (0..keys.len()).map(|_| None).collect();
        let mut todo: Vec<usize> = (0..keys.len()).collect();
        let mut backoff = Duration::from_millis(1);
        for round in 1..=BUSY_ATTEMPTS {
            let mut es = Vec::with_capacity(todo.len());
            for chunk in todo.chunks(ctxpod_wire::MATCH_KEYS_MAX) {
                let ks: Vec<Bytes> = chunk.iter().map(|&i| keys[i].clone()).collect();
                es.extend(c.get_each(ns, &ks).await?);
            }
            let (mut again, mut busy, mut values) = (Vec::new(), false, Vec::new());
            for (i, e) in todo.iter().copied().zip(es) {
                match e {
                    // Over what one answer frame holds (a large value, or a full frame):
                    // read as a value, piece by piece (all of them at once, below).
                    Err(TransferError::Refused { status: s, .. })
                        if s == status::TOO_LARGE && self.value_bytes_max() > 0 =>
                    {
                        values.push(i);
                    }
                    Err(TransferError::Refused { status: s, .. })
                        if s == status::BUSY && round < BUSY_ATTEMPTS =>
                    {
                        busy = true;
                        self.inner.busy_retries.fetch_add(1, Ordering::Relaxed);
                        again.push(i);
                    }
                    e => out[i] = Some(e),
                }
            }
            let got = futures::future::join_all(
                values.iter().map(|&i| self.get_value(ns, &keys[i], None)),
            )
            .await;
            for (i, g) in values.into_iter().zip(got) {
                out[i] = Some(g);
            }
            if again.is_empty() {
                break;
            }
            if busy {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(256));
            }
            todo = again;
        }
        Ok(out
            .into_iter()
            .map(|o| {
                o.unwrap_or(Err(TransferError::Refused {
                    status: status::BUSY,
                    message: "still busy".into(),
                }))
            })
            .collect())
    }

    /// Like [`TransferClient::get`], with an outcome per entry: a refused entry (413: over
    /// what fits the frame, ask again in a smaller batch; 503: the node's egress budget is
    /// spent, ask again later; …) or a corrupt one fails only itself.
    pub async fn get_each(
        &self,
        ns: &str,
        keys: &[Bytes],
    ) -> Result<Vec<Result<Option<Bytes>, TransferError>>, TransferError> {
        let req = Request::Get {
            ns: ns.into(),
            keys: keys.to_vec(),
        };
        let es = match self.call(&req).await? {
            Response::Get(es) => es,
            r => return Err(TransferError::Unexpected(r.op())),
        };
        if es.len() != keys.len() {
            return Err(TransferError::Unexpected(Op::Get));
        }
        Ok(es
            .into_iter()
            .enumerate()
            .map(
                |(
                    i,
                    GetEntry {
                        status: s,
                        crc32c,
                        data,
                    },
                )| match s {
                    status::OK if ctxpod_wire::crc32c(&data) == crc32c => Ok(Some(data)),
                    status::OK => Err(TransferError::Corrupt(i)),
                    status::NOT_FOUND => Ok(None),
                    s => Err(TransferError::Refused {
                        status: s,
                        message: format!("block {i}"),
                    }),
                },
            )
            .collect())
    }

    /// How many leading keys of the chain the node holds.
    pub async fn match_prefix(&self, ns: &str, chain: &[Bytes]) -> Result<u32, TransferError> {
        let req = Request::Match {
            ns: ns.into(),
            keys: chain.to_vec(),
        };
        self.count(&req).await
    }

    /// Pins the present keys for `ttl`; how many were pinned.
    pub async fn pin(&self, ns: &str, keys: &[Bytes], ttl: Duration) -> Result<u32, TransferError> {
        let req = Request::Pin {
            ns: ns.into(),
            ttl_ms: ttl.as_millis().min(u64::MAX as u128) as u64,
            keys: keys.to_vec(),
        };
        self.count(&req).await
    }

    pub async fn unpin(&self, ns: &str, keys: &[Bytes]) -> Result<u32, TransferError> {
        let req = Request::Unpin {
            ns: ns.into(),
            keys: keys.to_vec(),
        };
        self.count(&req).await
    }

    async fn count(&self, req: &Request) -> Result<u32, TransferError> {
        match self.call(req).await? {
            Response::Count(n) => Ok(n),
            r => Err(TransferError::Unexpected(r.op())),
        }
    }

    /// Registers `region` with the node on this connection: prefetches on this connection
    /// may then push into it.
    pub async fn register_region(&self, region: &Region) -> Result<(), TransferError> {
        let req = Request::RegisterRegion {
            region_id: region.id(),
            bytes: region.len() as u64,
        };
        match self.call(&req).await? {
            Response::RegionRegistered => {}
            r => return Err(TransferError::Unexpected(r.op())),
        }
        self.inner
            .shared
            .regions
            .lock()
            .expect("regions")
            .insert(region.id(), region.clone());
        Ok(())
    }

    /// Stops using `region` on this connection: the node forgets it (`RegisterRegion` of 0
    /// bytes, which frees one of its 256 per connection) and no new prefetch may name it, and
    /// the connection lets go of it, so that caller memory ([`Region::from_raw`]) is released
    /// once the caller's clones and every ticket into it are gone too (a ticket holds its
    /// region until the node has finished it and it is dropped). Live tickets go on landing
    /// their blocks. False if it was not registered here.
    pub async fn unregister_region(&self, region: &Region) -> Result<bool, TransferError> {
        let held = self
            .inner
            .shared
            .regions
            .lock()
            .expect("regions")
            .remove(&region.id())
            .is_some();
        if !held {
            return Ok(false);
        }
        let req = Request::RegisterRegion {
            region_id: region.id(),
            bytes: 0,
        };
        match self.call(&req).await? {
            Response::RegionRegistered => Ok(true),
            r => Err(TransferError::Unexpected(r.op())),
        }
    }

    /// Asks the node to push the blocks of `entries` into `region` (registered on this
    /// connection): entry `i` lands at `entries[i].offset`, at most `max_len` bytes. Returns
    /// at once with a ticket; the blocks arrive in order, each read from the socket straight
    /// into the region and its CRC32C checked.
    pub async fn prefetch(
        &self,
        ns: &str,
        region: &Region,
        entries: Vec<PrefetchEntry>,
        opts: PrefetchOptions,
    ) -> Result<Ticket, TransferError> {
        if !self
            .inner
            .shared
            .regions
            .lock()
            .expect("regions")
            .contains_key(&region.id())
        {
            return Err(TransferError::UnknownRegion(region.id()));
        }
        let ranges: Vec<(u64, u64)> = entries
            .iter()
            .map(|e| (e.offset, e.max_len as u64))
            .collect();
        region.inner.reserve(&ranges)?;
        let state = Arc::new(TicketState {
            region: region.inner.clone(),
            ranges,
            progress: watch::channel(Progress::new(entries.len())).0,
            finished: watch::channel(false).0,
            holders: std::sync::atomic::AtomicU8::new(2),
            released: std::sync::atomic::AtomicBool::new(false),
            landing: Mutex::new(HashMap::new()),
        });
        let req = Request::Prefetch(PrefetchRequest {
            ns: ns.into(),
            region_id: region.id(),
            policy: opts.policy,
            deadline_ms: opts
                .deadline
                .map_or(0, |d| d.as_millis().clamp(1, u32::MAX as u128) as u32),
            lease_ms: opts.lease.as_millis().min(u32::MAX as u128) as u32,
            entries,
        });
        let id = self
            .inner
            .open_stream(&req, || Stream::Prefetch(state.clone()))
            .await?;
        Ok(Ticket {
            id,
            state,
            client: self.inner.clone(),
            leased: !opts.lease.is_zero(),
            released: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// KV events (stored, evicted, deleted keys) of namespace `ns`, from now on.
    pub async fn subscribe(&self, ns: &str) -> Result<Subscription, TransferError> {
        let req = Request::Subscribe { ns: ns.into() };
        let (tx, rx) = mpsc::channel(EVENTS_BUFFER);
        let lost = Arc::new(AtomicU64::new(0));
        let id = self
            .inner
            .open_stream(&req, || Stream::Events(tx.clone(), lost.clone()))
            .await?;
        Ok(Subscription {
            id,
            rx,
            lost,
            client: self.inner.clone(),
        })
    }
}
