//! The transfer protocol (CXP1): a sans-IO codec. Pure functions and a streaming frame
//! decoder over bytes; no sockets, no clocks. The wire format is specified in
//! `wire/PROTOCOL.md` precisely enough to write a client in another language; this module is
//! its reference implementation.
//!
//! ```text
//! hello   := magic "CXP1" | version: u16 | flags: u16 | max_frame_bytes: u32 | reserved: u32
//! frame   := len: u32 | op: u8 | flags: u8 | status: u16 | request_id: u64 | body
//!            (len counts the 12 header bytes and the body; integers little-endian)
//! ```
//!
//! Every length is bounded before anything is allocated for it: a frame over the
//! negotiated `max_frame_bytes`, a key over 128 bytes, more than
//! [`BATCH_ENTRIES_MAX`](crate::BATCH_ENTRIES_MAX) entries or a block over
//! [`BLOCK_BYTES_MAX`](crate::BLOCK_BYTES_MAX) is an error, never a large buffer.

use bytes::{Buf, BufMut, Bytes, BytesMut};

pub const MAGIC: &[u8; 4] = b"CXP1";
pub const VERSION: u16 = 1;
pub const HELLO_BYTES: usize = 16;
/// Bytes of the frame header after the length prefix.
pub const HEADER_BYTES: usize = 12;
/// Largest frame a peer may announce: a full batch of the largest blocks.
pub const FRAME_BYTES_MAX: u32 = 64 << 20;
/// Longest namespace name on the wire.
pub const NAMESPACE_BYTES_MAX: usize = 63;
/// Longest bearer token an `Auth` request may carry.
pub const TOKEN_BYTES_MAX: usize = 512;
/// Hello flag (server → client): every op but `Auth` is refused until the connection has
/// authenticated (by an `Auth` request, or by its TLS client certificate).
pub const HELLO_AUTH_REQUIRED: u16 = 1;
/// Hello flag (server → client): the connection is already authenticated by its TLS client
/// certificate.
pub const HELLO_AUTHENTICATED: u16 = 2;

/// Per-block and per-frame statuses (HTTP-like numbers, so logs read the same).
pub mod status {
    pub const OK: u16 = 200;
    pub const CREATED: u16 = 201;
    pub const BAD_REQUEST: u16 = 400;
    /// No valid credentials: the connection has not authenticated (or failed to).
    pub const UNAUTHORIZED: u16 = 401;
    /// Authenticated, but the role does not allow the op.
    pub const FORBIDDEN: u16 = 403;
    pub const NOT_FOUND: u16 = 404;
    pub const CONFLICT: u16 = 409;
    pub const TOO_LARGE: u16 = 413;
    pub const CRC_MISMATCH: u16 = 422;
    /// The tenant's request rate is spent: retry later.
    pub const TOO_MANY_REQUESTS: u16 = 429;
    pub const INTERNAL: u16 = 500;
    /// Backpressure: retry later (the HTTP API's 503 + Retry-After).
    pub const BUSY: u16 = 503;
    /// Past the prefetch's deadline: a miss, not a stall.
    pub const DEADLINE: u16 = 504;
    pub const NO_SPACE: u16 = 507;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    Ping = 1,
    Put = 2,
    Get = 3,
    Match = 4,
    Pin = 5,
    Unpin = 6,
    RegisterRegion = 7,
    Prefetch = 8,
    /// Server → client: one prefetched block, to be written at its region offset.
    Push = 9,
    /// Server → client: a prefetch ticket is complete.
    PrefetchDone = 10,
    Cancel = 11,
    /// Response to any request that failed as a whole (status + message).
    Error = 12,
    /// Subscribe to a namespace's KV events (stored / evicted / deleted keys).
    Subscribe = 13,
    /// Server → client: a batch of KV events of a subscription.
    Event = 14,
    /// Presents a bearer token; answered with the tenant and role it grants.
    Auth = 15,
}

impl Op {
    pub fn from_u8(v: u8) -> Option<Op> {
        Some(match v {
            1 => Op::Ping,
            2 => Op::Put,
            3 => Op::Get,
            4 => Op::Match,
            5 => Op::Pin,
            6 => Op::Unpin,
            7 => Op::RegisterRegion,
            8 => Op::Prefetch,
            9 => Op::Push,
            10 => Op::PrefetchDone,
            11 => Op::Cancel,
            12 => Op::Error,
            13 => Op::Subscribe,
            14 => Op::Event,
            15 => Op::Auth,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    #[error("not a CXP1 peer (bad magic)")]
    BadMagic,
    #[error("protocol version {0} is not supported (this side speaks 1)")]
    BadVersion(u16),
    #[error("frame of {0} bytes is over the limit of {1}")]
    FrameTooLarge(u32, u32),
    #[error("frame of {0} bytes is shorter than its header")]
    FrameTooShort(u32),
    #[error("unknown op {0}")]
    UnknownOp(u8),
    #[error("op {0:?} is not a request")]
    NotARequest(Op),
    #[error("op {0:?} is not a response")]
    NotAResponse(Op),
    #[error("body of op {0:?} is truncated")]
    Truncated(Op),
    #[error("body of op {0:?} has {1} trailing bytes")]
    Trailing(Op, usize),
    #[error("key length {0} is not within 1..=128")]
    BadKeyLength(usize),
    #[error("namespace name of {0} bytes is not within 1..=63, or not UTF-8")]
    BadNamespace(usize),
    #[error("{0} entries: more than the limit")]
    TooManyEntries(usize),
    #[error("block of {0} bytes is over the block limit")]
    BlockTooLarge(u32),
    #[error("an empty block: a block is 1 byte to 8 MiB")]
    EmptyBlock,
    #[error("unknown durability {0}")]
    BadDurability(u8),
    #[error("unknown prefetch policy {0}")]
    BadPolicy(u8),
    #[error("unknown event kind {0}")]
    BadEventKind(u8),
    #[error("token of {0} bytes is not within 1..=512")]
    BadToken(usize),
    #[error("unknown role {0}")]
    BadRole(u8),
}

/// The first 16 bytes each side sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    pub version: u16,
    pub flags: u16,
    /// Largest frame this side accepts.
    pub max_frame_bytes: u32,
}

impl Hello {
    pub fn encode(&self) -> [u8; HELLO_BYTES] {
        let mut b = [0u8; HELLO_BYTES];
        b[..4].copy_from_slice(MAGIC);
        b[4..6].copy_from_slice(&self.version.to_le_bytes());
        b[6..8].copy_from_slice(&self.flags.to_le_bytes());
        b[8..12].copy_from_slice(&self.max_frame_bytes.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; HELLO_BYTES]) -> Result<Hello, ProtoError> {
        if &b[..4] != MAGIC {
            return Err(ProtoError::BadMagic);
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != VERSION {
            return Err(ProtoError::BadVersion(version));
        }
        Ok(Hello {
            version,
            flags: u16::from_le_bytes([b[6], b[7]]),
            max_frame_bytes: u32::from_le_bytes([b[8], b[9], b[10], b[11]]),
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub op: Op,
    pub flags: u8,
    pub status: u16,
    pub request_id: u64,
}

/// A frame cut out of the stream: its header and its body (zero-copy from the stream).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub header: Header,
    pub body: Bytes,
}

/// Streaming frame decoder: feed it bytes as they arrive, take frames as they complete. It
/// never buffers more than one frame of at most `max_frame_bytes` (plus what was fed).
pub struct FrameDecoder {
    buf: BytesMut,
    max_frame_bytes: u32,
}

impl FrameDecoder {
    pub fn new(max_frame_bytes: u32) -> FrameDecoder {
        FrameDecoder {
            buf: BytesMut::new(),
            max_frame_bytes: max_frame_bytes.min(FRAME_BYTES_MAX),
        }
    }

    /// Appends received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes received and not yet framed.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The next complete frame, `None` if more bytes are needed. An error poisons the
    /// stream: the connection must be closed (its framing can no longer be trusted).
    pub fn next_frame(&mut self) -> Result<Option<Frame>, ProtoError> {
        if self.buf.len() < 4 {
            return Ok(None);
        }
        let body = frame_body_len(
            self.buf[..4].try_into().expect("4 bytes"),
            self.max_frame_bytes,
        )?;
        let len = HEADER_BYTES + body;
        if self.buf.len() < 4 + len {
            self.buf.reserve(4 + len - self.buf.len());
            return Ok(None);
        }
        self.buf.advance(4);
        let mut frame = self.buf.split_to(len).freeze();
        let header = Header::decode(frame[..HEADER_BYTES].try_into().expect("a header"))?;
        frame.advance(HEADER_BYTES);
        Ok(Some(Frame {
            header,
            body: frame,
        }))
    }
}

/// A frame's length prefix, checked: the length of its body (after the header). Every
/// reader of frames (the node's `proto_io::FrameInput`, [`FrameDecoder`]) asks this.
pub fn frame_body_len(prefix: [u8; 4], max_frame_bytes: u32) -> Result<usize, ProtoError> {
    let len = u32::from_le_bytes(prefix);
    let max = max_frame_bytes.min(FRAME_BYTES_MAX);
    if len > max {
        return Err(ProtoError::FrameTooLarge(len, max));
    }
    if (len as usize) < HEADER_BYTES {
        return Err(ProtoError::FrameTooShort(len));
    }
    Ok(len as usize - HEADER_BYTES)
}

impl Header {
    /// The 12 header bytes that follow the length prefix.
    pub fn decode(b: &[u8; HEADER_BYTES]) -> Result<Header, ProtoError> {
        let op = Op::from_u8(b[0]).ok_or(ProtoError::UnknownOp(b[0]))?;
        Ok(Header {
            op,
            flags: b[1],
            status: u16::from_le_bytes([b[2], b[3]]),
            request_id: u64::from_le_bytes(b[4..12].try_into().expect("8 bytes")),
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    Durable = 0,
    Fast = 1,
}

/// What a prefetch does with blocks that are not ready by its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Push what is cheap now: blocks in node DRAM, and flash reads only while the node's
    /// staging budget has room; anything else is a miss (BUSY or NOT_FOUND) at once.
    BestEffort = 0,
    /// Push every block that exists, waiting for staging room and flash reads as long as
    /// it takes (or until the deadline, if one is given).
    WaitComplete = 1,
    /// Wait-complete bounded by a deadline (required): a block not pushed by then is a
    /// miss with status `DEADLINE`, never a stall.
    Timeout = 2,
}

impl Policy {
    pub fn from_u8(v: u8) -> Option<Policy> {
        Some(match v {
            0 => Policy::BestEffort,
            1 => Policy::WaitComplete,
            2 => Policy::Timeout,
            _ => return None,
        })
    }
}

/// What happened to a key, in a KV event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Stored = 1,
    Evicted = 2,
    Deleted = 3,
}

impl EventKind {
    pub fn from_u8(v: u8) -> Option<EventKind> {
        Some(match v {
            1 => EventKind::Stored,
            2 => EventKind::Evicted,
            3 => EventKind::Deleted,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            EventKind::Stored => "stored",
            EventKind::Evicted => "evicted",
            EventKind::Deleted => "deleted",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutEntry {
    pub key: Bytes,
    pub crc32c: u32,
    pub data: Bytes,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefetchEntry {
    pub key: Bytes,
    /// Where in the client's region the block's bytes go.
    pub offset: u64,
    /// Bytes reserved at `offset`: a longer block is not pushed (status TOO_LARGE).
    pub max_len: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Ping,
    Put {
        ns: String,
        durability: Durability,
        entries: Vec<PutEntry>,
    },
    Get {
        ns: String,
        keys: Vec<Bytes>,
    },
    Match {
        ns: String,
        keys: Vec<Bytes>,
    },
    Pin {
        ns: String,
        ttl_ms: u64,
        keys: Vec<Bytes>,
    },
    Unpin {
        ns: String,
        keys: Vec<Bytes>,
    },
    RegisterRegion {
        region_id: u32,
        bytes: u64,
    },
    Prefetch {
        ns: String,
        region_id: u32,
        policy: Policy,
        /// Milliseconds from receipt after which an unpushed block is a miss; 0: none.
        deadline_ms: u32,
        /// Milliseconds the ticket's blocks stay leased on the node after the prefetch
        /// completes (until then they are leased anyway); capped by the node.
        lease_ms: u32,
        entries: Vec<PrefetchEntry>,
    },
    /// Cancels a prefetch ticket (its unpushed blocks become misses and its lease ends) or
    /// a subscription.
    Cancel {
        ticket: u64,
    },
    Subscribe {
        ns: String,
    },
    /// Authenticates the connection with a bearer token (`wire/PROTOCOL.md`, "Auth").
    Auth {
        token: Bytes,
    },
}

/// What an authenticated connection may do (the HTTP API's roles).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Everything, in every tenant, and the admin operations.
    Admin = 1,
    /// Read and write the tenant's namespaces.
    TenantRw = 2,
    /// Read the tenant's namespaces.
    TenantRo = 3,
    /// The operator's read-only view (the dashboard's): stats, metrics, miss-ratio curves,
    /// membership, the planner and every tenant's namespace usage; no block, no write.
    Viewer = 4,
}

impl Role {
    pub fn from_u8(v: u8) -> Option<Role> {
        Some(match v {
            1 => Role::Admin,
            2 => Role::TenantRw,
            3 => Role::TenantRo,
            4 => Role::Viewer,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::TenantRw => "tenant-rw",
            Role::TenantRo => "tenant-ro",
            Role::Viewer => "viewer",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        [Role::Admin, Role::TenantRw, Role::TenantRo, Role::Viewer]
            .into_iter()
            .find(|r| r.name() == s)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetEntry {
    pub status: u16,
    pub crc32c: u32,
    /// The block's bytes when `status` is OK.
    pub data: Bytes,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    Pong,
    /// Per entry: status and the CRC32C of what is stored.
    Put(Vec<(u16, u32)>),
    Get(Vec<GetEntry>),
    /// Leading keys present (`Match`), or keys affected (`Pin`, `Unpin`).
    Count(u32),
    RegionRegistered,
    /// A prefetch or subscription was accepted: its ticket is the request's id; `Push`
    /// frames and then `PrefetchDone` (or `Event` frames) follow under that id.
    Ticket(u64),
    /// One entry of a prefetch (the frame's request id is the ticket): its bytes, to be
    /// written at `offset` of the region, or a miss (`status` not OK, no data).
    Push {
        index: u32,
        status: u16,
        crc32c: u32,
        offset: u64,
        data: Bytes,
    },
    PrefetchDone {
        pushed: u32,
        missed: u32,
    },
    Cancelled,
    /// KV events of a subscription; `lost`: events dropped before these because the
    /// subscriber fell behind (it should resynchronise, e.g. by MATCH).
    Events {
        lost: u64,
        events: Vec<(EventKind, Bytes)>,
    },
    /// The request failed as a whole; the frame's status says how (BUSY, BAD_REQUEST, …).
    Error(String),
    /// The connection is authenticated: as this role, in this tenant (empty for an admin).
    Authenticated {
        role: Role,
        tenant: String,
    },
}

struct Writer {
    b: BytesMut,
    /// With `by_ref`: the frame so far, as pieces (the first one still open for the
    /// length prefix), block data referenced rather than copied.
    first: Option<BytesMut>,
    parts: Vec<Bytes>,
    by_ref: bool,
}

impl Writer {
    fn frame(op: Op, status: u16, request_id: u64, body_hint: usize) -> Writer {
        let mut b = BytesMut::with_capacity(4 + HEADER_BYTES + body_hint);
        b.put_u32_le(0);
        b.put_u8(op as u8);
        b.put_u8(0);
        b.put_u16_le(status);
        b.put_u64_le(request_id);
        Writer {
            b,
            first: None,
            parts: Vec::new(),
            by_ref: false,
        }
    }

    /// Block data: copied into the frame, or (`by_ref`) referenced as a piece of it.
    fn data(&mut self, d: &Bytes) {
        if !self.by_ref || d.is_empty() {
            self.b.put_slice(d);
            return;
        }
        let head = self.b.split();
        match self.first {
            None => self.first = Some(head),
            Some(_) => self.parts.push(head.freeze()),
        }
        self.parts.push(d.clone());
    }

    /// The frame as pieces that, written one after the other, are the frame.
    fn finish_parts(mut self) -> Vec<Bytes> {
        let Some(mut first) = self.first.take() else {
            return vec![self.finish()];
        };
        let total = first.len() + self.parts.iter().map(|p| p.len()).sum::<usize>() + self.b.len();
        first[..4].copy_from_slice(&((total - 4) as u32).to_le_bytes());
        let mut out = Vec::with_capacity(self.parts.len() + 2);
        out.push(first.freeze());
        out.append(&mut self.parts);
        if !self.b.is_empty() {
            out.push(self.b.freeze());
        }
        out
    }

    fn ns(&mut self, ns: &str) {
        self.b.put_u8(ns.len() as u8);
        self.b.put_slice(ns.as_bytes());
    }

    fn key(&mut self, k: &[u8]) {
        self.b.put_u8(k.len() as u8);
        self.b.put_slice(k);
    }

    fn keys(&mut self, keys: &[Bytes]) {
        self.b.put_u32_le(keys.len() as u32);
        keys.iter().for_each(|k| self.key(k));
    }

    fn finish(mut self) -> Bytes {
        let len = (self.b.len() - 4) as u32;
        self.b[..4].copy_from_slice(&len.to_le_bytes());
        self.b.freeze()
    }
}

impl Request {
    pub fn op(&self) -> Op {
        match self {
            Request::Ping => Op::Ping,
            Request::Put { .. } => Op::Put,
            Request::Get { .. } => Op::Get,
            Request::Match { .. } => Op::Match,
            Request::Pin { .. } => Op::Pin,
            Request::Unpin { .. } => Op::Unpin,
            Request::RegisterRegion { .. } => Op::RegisterRegion,
            Request::Prefetch { .. } => Op::Prefetch,
            Request::Cancel { .. } => Op::Cancel,
            Request::Subscribe { .. } => Op::Subscribe,
            Request::Auth { .. } => Op::Auth,
        }
    }

    /// The whole frame, length prefix included.
    pub fn encode(&self, request_id: u64) -> Bytes {
        let hint = match self {
            Request::Put { entries, .. } => entries.iter().map(|e| e.data.len() + 140).sum(),
            _ => 256,
        };
        let mut w = Writer::frame(self.op(), 0, request_id, hint);
        match self {
            Request::Ping => {}
            Request::Put {
                ns,
                durability,
                entries,
            } => {
                w.ns(ns);
                w.b.put_u8(*durability as u8);
                w.b.put_u32_le(entries.len() as u32);
                for e in entries {
                    w.key(&e.key);
                    w.b.put_u32_le(e.crc32c);
                    w.b.put_u32_le(e.data.len() as u32);
                    w.data(&e.data);
                }
            }
            Request::Get { ns, keys }
            | Request::Match { ns, keys }
            | Request::Unpin { ns, keys } => {
                w.ns(ns);
                w.keys(keys);
            }
            Request::Pin { ns, ttl_ms, keys } => {
                w.ns(ns);
                w.b.put_u64_le(*ttl_ms);
                w.keys(keys);
            }
            Request::RegisterRegion { region_id, bytes } => {
                w.b.put_u32_le(*region_id);
                w.b.put_u64_le(*bytes);
            }
            Request::Prefetch {
                ns,
                region_id,
                policy,
                deadline_ms,
                lease_ms,
                entries,
            } => {
                w.ns(ns);
                w.b.put_u32_le(*region_id);
                w.b.put_u8(*policy as u8);
                w.b.put_u32_le(*deadline_ms);
                w.b.put_u32_le(*lease_ms);
                w.b.put_u32_le(entries.len() as u32);
                for e in entries {
                    w.key(&e.key);
                    w.b.put_u64_le(e.offset);
                    w.b.put_u32_le(e.max_len);
                }
            }
            Request::Cancel { ticket } => w.b.put_u64_le(*ticket),
            Request::Subscribe { ns } => w.ns(ns),
            Request::Auth { token } => {
                w.b.put_u16_le(token.len() as u16);
                w.b.put_slice(token);
            }
        }
        w.finish()
    }

    /// The same frame as [`Request::encode`], in pieces that reference block data instead
    /// of copying it: written one after the other (or vectored), they are the frame.
    pub fn encode_parts(&self, request_id: u64) -> Vec<Bytes> {
        let Request::Put {
            ns,
            durability,
            entries,
        } = self
        else {
            return vec![self.encode(request_id)];
        };
        let body: usize = 1
            + ns.len()
            + 1
            + 4
            + entries
                .iter()
                .map(|e| 1 + e.key.len() + 8 + e.data.len())
                .sum::<usize>();
        let mut w = BytesMut::with_capacity(4 + HEADER_BYTES + 64);
        w.put_u32_le((HEADER_BYTES + body) as u32);
        w.put_u8(Op::Put as u8);
        w.put_u8(0);
        w.put_u16_le(0);
        w.put_u64_le(request_id);
        w.put_u8(ns.len() as u8);
        w.put_slice(ns.as_bytes());
        w.put_u8(*durability as u8);
        w.put_u32_le(entries.len() as u32);
        let mut parts = Vec::with_capacity(2 * entries.len() + 1);
        for e in entries {
            w.put_u8(e.key.len() as u8);
            w.put_slice(&e.key);
            w.put_u32_le(e.crc32c);
            w.put_u32_le(e.data.len() as u32);
            parts.push(w.split().freeze());
            parts.push(e.data.clone());
        }
        if !w.is_empty() {
            parts.push(w.freeze());
        }
        parts
    }

    pub fn decode(frame: &Frame) -> Result<Request, ProtoError> {
        let op = frame.header.op;
        let mut r = Reader::new(frame);
        let req = match op {
            Op::Ping => Request::Ping,
            Op::Put => {
                // The node's own parser ([`PutBodyParser`]), over the body in memory.
                let (ns, durability, entries) = decode_put_body(&frame.body)?;
                r.b.advance(frame.body.len());
                Request::Put {
                    ns,
                    durability,
                    entries,
                }
            }
            Op::Get | Op::Match | Op::Unpin => {
                let (ns, keys) = (r.ns()?, r.keys()?);
                match op {
                    Op::Get => Request::Get { ns, keys },
                    Op::Match => Request::Match { ns, keys },
                    _ => Request::Unpin { ns, keys },
                }
            }
            Op::Pin => Request::Pin {
                ns: r.ns()?,
                ttl_ms: r.u64()?,
                keys: r.keys()?,
            },
            Op::RegisterRegion => Request::RegisterRegion {
                region_id: r.u32()?,
                bytes: r.u64()?,
            },
            Op::Prefetch => {
                let ns = r.ns()?;
                let region_id = r.u32()?;
                let p = r.u8()?;
                let policy = Policy::from_u8(p).ok_or(ProtoError::BadPolicy(p))?;
                let deadline_ms = r.u32()?;
                let lease_ms = r.u32()?;
                let entries = r.list(|r| {
                    Ok(PrefetchEntry {
                        key: r.key()?,
                        offset: r.u64()?,
                        max_len: r.u32()?,
                    })
                })?;
                Request::Prefetch {
                    ns,
                    region_id,
                    policy,
                    deadline_ms,
                    lease_ms,
                    entries,
                }
            }
            Op::Cancel => Request::Cancel { ticket: r.u64()? },
            Op::Subscribe => Request::Subscribe { ns: r.ns()? },
            Op::Auth => {
                let n = r.u16()? as usize;
                if n == 0 || n > TOKEN_BYTES_MAX {
                    return Err(ProtoError::BadToken(n));
                }
                Request::Auth { token: r.bytes(n)? }
            }
            op => return Err(ProtoError::NotARequest(op)),
        };
        r.end()?;
        Ok(req)
    }
}

impl Response {
    pub fn op(&self) -> Op {
        match self {
            Response::Pong => Op::Ping,
            Response::Put(_) => Op::Put,
            Response::Get(_) => Op::Get,
            Response::Count(_) => Op::Match,
            Response::RegionRegistered => Op::RegisterRegion,
            Response::Ticket(_) => Op::Prefetch,
            Response::Push { .. } => Op::Push,
            Response::PrefetchDone { .. } => Op::PrefetchDone,
            Response::Cancelled => Op::Cancel,
            Response::Events { .. } => Op::Event,
            Response::Error(_) => Op::Error,
            Response::Authenticated { .. } => Op::Auth,
        }
    }

    /// The whole frame. `op` is the request's op (it tells `Count` answers to `Match`, `Pin`
    /// and `Unpin` apart; an `Error` is always sent as op `Error`); `status` is the frame's
    /// (OK, or why the request failed as a whole).
    pub fn encode(&self, op: Op, status: u16, request_id: u64) -> Bytes {
        self.writer(op, status, request_id, false).finish()
    }

    /// The same frame as [`Response::encode`], in pieces that reference block data instead
    /// of copying it.
    pub fn encode_parts(&self, op: Op, status: u16, request_id: u64) -> Vec<Bytes> {
        self.writer(op, status, request_id, true).finish_parts()
    }

    fn writer(&self, op: Op, status: u16, request_id: u64, by_ref: bool) -> Writer {
        let hint = match self {
            Response::Get(es) => es.iter().map(|e| e.data.len() + 10).sum(),
            Response::Push { data, .. } => data.len() + 32,
            _ => 64,
        };
        // An error travels as op `Error` whatever the request was.
        let op = if matches!(self, Response::Error(_)) {
            Op::Error
        } else {
            op
        };
        let mut w = Writer::frame(op, status, request_id, if by_ref { 64 } else { hint });
        w.by_ref = by_ref;
        match self {
            Response::Pong | Response::RegionRegistered | Response::Cancelled => {}
            Response::Put(es) => {
                w.b.put_u32_le(es.len() as u32);
                for (s, crc) in es {
                    w.b.put_u16_le(*s);
                    w.b.put_u32_le(*crc);
                }
            }
            Response::Get(es) => {
                w.b.put_u32_le(es.len() as u32);
                for e in es {
                    w.b.put_u16_le(e.status);
                    w.b.put_u32_le(e.crc32c);
                    w.b.put_u32_le(e.data.len() as u32);
                    w.data(&e.data);
                }
            }
            Response::Count(n) => w.b.put_u32_le(*n),
            Response::Ticket(t) => w.b.put_u64_le(*t),
            Response::Push {
                index,
                status,
                crc32c,
                offset,
                data,
            } => {
                w.b.put_u32_le(*index);
                w.b.put_u16_le(*status);
                w.b.put_u32_le(*crc32c);
                w.b.put_u64_le(*offset);
                w.b.put_u32_le(data.len() as u32);
                w.data(data);
            }
            Response::PrefetchDone { pushed, missed } => {
                w.b.put_u32_le(*pushed);
                w.b.put_u32_le(*missed);
            }
            Response::Events { lost, events } => {
                w.b.put_u64_le(*lost);
                w.b.put_u32_le(events.len() as u32);
                for (kind, key) in events {
                    w.b.put_u8(*kind as u8);
                    w.key(key);
                }
            }
            Response::Error(msg) => {
                let m = &msg.as_bytes()[..msg.len().min(1024)];
                w.b.put_u16_le(m.len() as u16);
                w.b.put_slice(m);
            }
            Response::Authenticated { role, tenant } => {
                w.b.put_u8(*role as u8);
                w.ns(tenant);
            }
        }
        w
    }

    pub fn decode(frame: &Frame) -> Result<Response, ProtoError> {
        let op = frame.header.op;
        let mut r = Reader::new(frame);
        let resp = match op {
            Op::Ping => Response::Pong,
            Op::RegisterRegion => Response::RegionRegistered,
            Op::Cancel => Response::Cancelled,
            Op::Put => Response::Put(r.list(|r| Ok((r.u16()?, r.u32()?)))?),
            Op::Get => Response::Get(r.list(|r| {
                Ok(GetEntry {
                    status: r.u16()?,
                    crc32c: r.u32()?,
                    data: r.block()?,
                })
            })?),
            Op::Match | Op::Pin | Op::Unpin => Response::Count(r.u32()?),
            Op::Prefetch | Op::Subscribe => Response::Ticket(r.u64()?),
            Op::Push => Response::Push {
                index: r.u32()?,
                status: r.u16()?,
                crc32c: r.u32()?,
                offset: r.u64()?,
                data: r.block()?,
            },
            Op::PrefetchDone => Response::PrefetchDone {
                pushed: r.u32()?,
                missed: r.u32()?,
            },
            Op::Event => Response::Events {
                lost: r.u64()?,
                events: r.list(|r| {
                    let k = r.u8()?;
                    let kind = EventKind::from_u8(k).ok_or(ProtoError::BadEventKind(k))?;
                    Ok((kind, r.key()?))
                })?,
            },
            Op::Error => {
                let n = r.u16()? as usize;
                let m = r.bytes(n)?;
                Response::Error(String::from_utf8_lossy(&m).into_owned())
            }
            Op::Auth => {
                let r8 = r.u8()?;
                Response::Authenticated {
                    role: Role::from_u8(r8).ok_or(ProtoError::BadRole(r8))?,
                    tenant: r.name()?,
                }
            }
        };
        r.end()?;
        Ok(resp)
    }
}

/// Bounded reads from a frame body: every read checks the bytes are there.
struct Reader {
    b: Bytes,
    op: Op,
}

impl Reader {
    fn new(frame: &Frame) -> Reader {
        Reader {
            b: frame.body.clone(),
            op: frame.header.op,
        }
    }

    /// `len: u32` then that many bytes of block data, at most the block limit.
    fn block(&mut self) -> Result<Bytes, ProtoError> {
        let len = self.u32()?;
        if len as usize > crate::BLOCK_BYTES_MAX {
            return Err(ProtoError::BlockTooLarge(len));
        }
        self.bytes(len as usize)
    }

    fn need(&self, n: usize) -> Result<(), ProtoError> {
        if self.b.remaining() < n {
            Err(ProtoError::Truncated(self.op))
        } else {
            Ok(())
        }
    }

    fn u8(&mut self) -> Result<u8, ProtoError> {
        self.need(1)?;
        Ok(self.b.get_u8())
    }

    fn u16(&mut self) -> Result<u16, ProtoError> {
        self.need(2)?;
        Ok(self.b.get_u16_le())
    }

    fn u32(&mut self) -> Result<u32, ProtoError> {
        self.need(4)?;
        Ok(self.b.get_u32_le())
    }

    fn u64(&mut self) -> Result<u64, ProtoError> {
        self.need(8)?;
        Ok(self.b.get_u64_le())
    }

    fn bytes(&mut self, n: usize) -> Result<Bytes, ProtoError> {
        self.need(n)?;
        Ok(self.b.split_to(n))
    }

    fn count(&mut self) -> Result<usize, ProtoError> {
        let n = self.u32()? as usize;
        if n > crate::MATCH_KEYS_MAX.max(crate::BATCH_ENTRIES_MAX) {
            return Err(ProtoError::TooManyEntries(n));
        }
        Ok(n)
    }

    fn ns(&mut self) -> Result<String, ProtoError> {
        let n = self.u8()? as usize;
        if n == 0 || n > NAMESPACE_BYTES_MAX {
            return Err(ProtoError::BadNamespace(n));
        }
        let b = self.bytes(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| ProtoError::BadNamespace(n))
    }

    /// A tenant name: like a namespace name, but may be empty (an admin has none).
    fn name(&mut self) -> Result<String, ProtoError> {
        let n = self.u8()? as usize;
        if n > NAMESPACE_BYTES_MAX {
            return Err(ProtoError::BadNamespace(n));
        }
        let b = self.bytes(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| ProtoError::BadNamespace(n))
    }

    fn key(&mut self) -> Result<Bytes, ProtoError> {
        let n = self.u8()? as usize;
        if n == 0 || n > crate::KEY_BYTES_MAX {
            return Err(ProtoError::BadKeyLength(n));
        }
        self.bytes(n)
    }

    fn keys(&mut self) -> Result<Vec<Bytes>, ProtoError> {
        self.list(|r| r.key())
    }

    /// `count` then that many items read by `item`.
    fn list<T>(
        &mut self,
        mut item: impl FnMut(&mut Reader) -> Result<T, ProtoError>,
    ) -> Result<Vec<T>, ProtoError> {
        let n = self.count()?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(item(self)?);
        }
        Ok(out)
    }

    fn end(&self) -> Result<(), ProtoError> {
        match self.b.remaining() {
            0 => Ok(()),
            n => Err(ProtoError::Trailing(self.op, n)),
        }
    }
}

mod put;
pub use put::{decode_put_body, PutBodyParser, PutStep};

#[cfg(test)]
mod tests;

/// Where a block's bytes are received: its unfilled part, then how much was landed (the
/// node's `StagedBlock`, which checksums what lands).
pub trait Landing {
    fn unfilled_mut(&mut self) -> &mut [u8];
    fn advance(&mut self, n: usize);
}
