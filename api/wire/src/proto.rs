//! The transfer protocol (CXP1): a sans-IO codec. Pure functions and a streaming frame
//! decoder over bytes; no sockets, no clocks. The wire format is specified in
//! `api/PROTOCOL.md` precisely enough to write a client in another language; this module is
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
    /// A `GetValue` range that starts past the value's end.
    pub const RANGE_NOT_SATISFIABLE: u16 = 416;
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

wire_enum! {
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
        /// One piece of a value of any size (frames of one request id, in order).
        PutValue = 16,
        /// A value (or a byte range of it), answered piece by piece.
        GetValue = 17,
    }
}

/// Frame flag (server → client, `GetValue` and `Push`): more frames of this value follow
/// under the same request id (and, for a `Push`, the same entry).
pub const FLAG_MORE: u8 = 1;
/// Bytes of a `PutValue` body before its namespace: offset, value length, CRC32C,
/// durability.
pub const PUT_VALUE_FIXED_BYTES: usize = 8 + 8 + 4 + 1;
/// Bytes of a `GetValue` answer's body before its data: value length, value CRC32C,
/// offset, piece CRC32C, piece length.
pub const VALUE_PIECE_HEAD_BYTES: usize = 8 + 4 + 8 + 4 + 4;

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
    #[error("a value piece of {got} bytes at offset {offset} of a {len}-byte value, where the piece there is {want} bytes")]
    BadPiece {
        len: u64,
        offset: u64,
        got: usize,
        want: usize,
    },
    #[error("a value of {0} bytes: a value is 1 byte to {max} bytes", max = crate::VALUE_BYTES_MAX)]
    BadValueLength(u64),
}

/// The first 16 bytes each side sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    pub version: u16,
    pub flags: u16,
    /// Largest frame this side accepts.
    pub max_frame_bytes: u32,
    /// (server → client) The node's `value_bytes_max`: the largest value it stores
    /// (`PutValue`); 0 from a client.
    pub value_bytes_max: u32,
}

impl Hello {
    pub fn encode(&self) -> [u8; HELLO_BYTES] {
        let mut b = [0u8; HELLO_BYTES];
        b[..4].copy_from_slice(MAGIC);
        b[4..6].copy_from_slice(&self.version.to_le_bytes());
        b[6..8].copy_from_slice(&self.flags.to_le_bytes());
        b[8..12].copy_from_slice(&self.max_frame_bytes.to_le_bytes());
        b[12..16].copy_from_slice(&self.value_bytes_max.to_le_bytes());
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
            value_bytes_max: u32::from_le_bytes([b[12], b[13], b[14], b[15]]),
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

pub use crate::Durability;

wire_enum! {
    /// What a prefetch does with blocks that are not ready by its deadline.
    pub enum Policy {
        /// Push what is cheap now: blocks in node DRAM, and flash reads only while the node's
        /// staging budget has room; anything else is a miss (BUSY or NOT_FOUND) at once.
        BestEffort = 0 => "best_effort",
        /// Push every block that exists, waiting for staging room and flash reads as long as
        /// it takes (or until the deadline, if one is given).
        WaitComplete = 1 => "wait_complete",
        /// Wait-complete bounded by a deadline (required): a block not pushed by then is a
        /// miss with status `DEADLINE`, never a stall.
        Timeout = 2 => "timeout",
    }

    /// What happened to a key, in a KV event.
    pub enum EventKind {
        Stored = 1 => "stored",
        Evicted = 2 => "evicted",
        Deleted = 3 => "deleted",
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
    Prefetch(PrefetchRequest),
    /// Cancels a prefetch ticket (its unpushed blocks become misses and its lease ends) or
    /// a subscription.
    Cancel {
        ticket: u64,
    },
    Subscribe {
        ns: String,
    },
    /// Authenticates the connection with a bearer token (`api/PROTOCOL.md`, "Auth").
    Auth {
        token: Bytes,
    },
    /// One piece of a value: the first (offset 0) opens it, the one that reaches its
    /// length completes it.
    PutValue(ValuePiece),
    /// Bytes `offset..offset + len` of a value (`len` 0: to its end).
    GetValue {
        ns: String,
        key: Bytes,
        offset: u64,
        len: u64,
    },
}

/// One frame of a `PutValue`: the value's identity (repeated in every piece) and the
/// piece's bytes, [`crate::value_piece_len`] of them at `offset`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValuePiece {
    pub ns: String,
    pub key: Bytes,
    pub durability: Durability,
    /// The whole value's length and CRC32C.
    pub len: u64,
    pub crc32c: u32,
    pub offset: u64,
    pub data: Bytes,
}

impl ValuePiece {
    /// Whether this piece is the value's last.
    pub fn is_last(&self) -> bool {
        self.offset + self.data.len() as u64 >= self.len
    }
}

wire_enum! {
    /// What an authenticated connection may do (the HTTP API's roles).
    #[derive(Hash)]
    pub enum Role {
        /// Everything, in every tenant, and the admin operations.
        Admin = 1 => "admin",
        /// Read and write the tenant's namespaces.
        TenantRw = 2 => "tenant-rw",
        /// Read the tenant's namespaces.
        TenantRo = 3 => "tenant-ro",
        /// The operator's read-only view (the dashboard's): stats, metrics, miss-ratio curves,
        /// membership, the planner and every tenant's namespace usage; no block, no write.
        Viewer = 4 => "viewer",
    }
}

/// A PREFETCH: blocks pushed into a registered region of the client's memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefetchRequest {
    pub ns: String,
    pub region_id: u32,
    pub policy: Policy,
    /// Milliseconds from receipt after which an unpushed block is a miss; 0: none.
    pub deadline_ms: u32,
    /// Milliseconds the ticket's blocks stay leased on the node after the prefetch
    /// completes (until then they are leased anyway); capped by the node.
    pub lease_ms: u32,
    pub entries: Vec<PrefetchEntry>,
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
    /// A `PutValue` is complete: stored (201) or there already (200), with its CRC32C.
    ValueStored {
        crc32c: u32,
    },
    /// One piece of a `GetValue` answer (the frame's `FLAG_MORE` says whether more follow).
    ValuePiece {
        /// The whole value's length and CRC32C.
        value_len: u64,
        value_crc32c: u32,
        /// Where in the value the piece begins.
        offset: u64,
        /// CRC32C of `data`.
        crc32c: u32,
        data: Bytes,
    },
}

mod codec;
mod put;
mod request;
mod response;
pub use put::{decode_put_body, PutBodyParser, PutStep};
pub use request::check_value_piece;

#[cfg(test)]
mod tests;

/// Where a block's bytes are received: its unfilled part, then how much was landed (the
/// node's `StagedBlock`, which checksums what lands).
pub trait Landing {
    fn unfilled_mut(&mut self) -> &mut [u8];
    fn advance(&mut self, n: usize);
}
