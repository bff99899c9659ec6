//! Block engine: namespaces, the read path, the put path up to the writer, recovery.
//!
//! Architecture invariants:
//! - The engine knows nothing of HTTP; it answers [`EngineError`] kinds that the node
//!   (`ctxpod_node::errors`) maps one to one to statuses.
//! - Bytes leave the engine only after the record header matched the index, AES-GCM opened
//!   and the plaintext CRC32C matched. Anything else is quarantined and answered as a miss.
//! - Only the writer task ([`writer`]) mutates the block index and region table.

pub mod crypto;
pub mod device;
pub mod dram;
pub mod events;
pub mod index;
pub mod leases;
pub mod metrics;
pub mod offload;
pub mod presence;
mod recovery;
mod writer;

use crate::crypto::AeadKey;
use crate::device::{AlignedBuf, Device};
use crate::metrics::Metrics;
use crate::offload::{OffloadEngine, OffloadError};
use bytes::Bytes;
use ctxpod_format::config::Config;
use ctxpod_format::record::{self, RecordHeader, HEADER_BYTES, TAG_BYTES};
use ctxpod_wire::types::{NamespaceInfo, Stats};
use ctxpod_wire::Durability;
use dram::{CacheKey, S3Fifo};
use index::{block_key, BlockLoc, Geometry, Index, NsMeta};
use leases::{Leases, ReadBits};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, oneshot};
use writer::WriteCmd;

/// What went wrong, as the caller must act on it.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    NotFound(String),
    #[error("the key holds a block with different content")]
    Conflict,
    #[error("{0}")]
    Integrity(String),
    #[error("{0}")]
    TooLarge(String),
    #[error("{0}")]
    NoSpace(String),
    /// Over a namespace's byte quota: a refusal of the caller's write, not a full device.
    #[error("{0}")]
    Quota(String),
    #[error("busy: {0} is full, retry later")]
    Busy(&'static str),
    #[error("internal error: {0:#}")]
    Internal(anyhow::Error),
}

impl From<anyhow::Error> for EngineError {
    fn from(e: anyhow::Error) -> Self {
        EngineError::Internal(e)
    }
}

impl From<OffloadError> for EngineError {
    fn from(e: OffloadError) -> Self {
        match e {
            OffloadError::Busy(_) => EngineError::Busy("offload queue"),
            e => EngineError::Internal(anyhow::anyhow!("{e}")),
        }
    }
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

/// Outcome of a successful put.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutStatus {
    Created,
    Exists,
}

pub struct Namespace {
    pub id: u32,
    pub name: String,
    /// Quota in bytes; [`NO_QUOTA`] when unbounded.
    quota: AtomicU64,
    /// Copies in the pod; 0: the pod's default.
    replication: AtomicU32,
    /// [`NsMeta::incarnation`]; 0: none.
    incarnation: AtomicU64,
    created_ms: u64,
    keys: parking_lot::RwLock<NsKeys>,
    used_bytes: AtomicU64,
    blocks: AtomicU64,
    deleted: AtomicBool,
}

const NO_QUOTA: u64 = u64::MAX;

/// What `PUT /v1/namespaces/{ns}` sets: every setting, each absent one back to its default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NsSettings {
    pub quota_bytes: Option<u64>,
    /// Copies of each block in the pod (`None`: the pod's `replication`).
    pub replication: Option<u32>,
    /// The pod's incarnation of the namespace (`pod::namespaces`), recorded when given;
    /// `None` keeps the one it has.
    pub incarnation: Option<u64>,
}

/// A namespace's data keys: the current generation (new writes) and every generation still
/// readable, by key id.
struct NsKeys {
    current: u32,
    /// Sequence number when `current` became current ([`NsMeta::key_seq`]).
    since_seq: u64,
    deks: HashMap<u32, Arc<AeadKey>>,
}

pub use ctxpod_format::config::DEK_ROTATE_AFTER_WRITES;

impl Namespace {
    pub fn quota_bytes(&self) -> Option<u64> {
        Some(self.quota.load(Ordering::Relaxed)).filter(|&q| q != NO_QUOTA)
    }

    /// Copies of each block in the pod, when the namespace sets its own.
    pub fn replication(&self) -> Option<u32> {
        Some(self.replication.load(Ordering::Relaxed)).filter(|&r| r != 0)
    }

    fn info(&self) -> NamespaceInfo {
        NamespaceInfo {
            name: self.name.clone(),
            quota_bytes: self.quota_bytes(),
            replication: self.replication(),
            used_bytes: self.used_bytes.load(Ordering::Relaxed),
            block_count: self.blocks.load(Ordering::Relaxed),
        }
    }

    fn new(name: &str, meta: &NsMeta, deks: HashMap<u32, Arc<AeadKey>>) -> Namespace {
        Namespace {
            id: meta.id,
            name: name.to_string(),
            quota: AtomicU64::new(meta.quota_bytes.unwrap_or(NO_QUOTA)),
            replication: AtomicU32::new(meta.replication.unwrap_or(0)),
            incarnation: AtomicU64::new(meta.incarnation.unwrap_or(0)),
            created_ms: meta.created_ms,
            keys: parking_lot::RwLock::new(NsKeys {
                current: meta.key_id,
                since_seq: meta.key_seq,
                deks,
            }),
            used_bytes: AtomicU64::new(0),
            blocks: AtomicU64::new(0),
            deleted: AtomicBool::new(false),
        }
    }

    fn dek(&self, key_id: u32) -> Option<Arc<AeadKey>> {
        self.keys.read().deks.get(&key_id).cloned()
    }

    /// What opens a record of key generation `key_id`: `Some(None)` on a node that stores
    /// records in plaintext (no key is needed), `Some(Some(key))`, or `None` when the
    /// namespace has no such key.
    fn opening_key(&self, key_id: u32, plaintext_at_rest: bool) -> Option<Option<Arc<AeadKey>>> {
        if plaintext_at_rest {
            Some(None)
        } else {
            self.dek(key_id).map(Some)
        }
    }

    /// The current key generation and its key, for a new write.
    fn current_key(&self) -> Option<(u32, Arc<AeadKey>)> {
        let k = self.keys.read();
        Some((k.current, k.deks.get(&k.current)?.clone()))
    }

    /// Generation of the data key new writes use.
    pub fn key_id(&self) -> u32 {
        self.keys.read().current
    }

    fn meta(&self) -> NsMeta {
        let k = self.keys.read();
        NsMeta {
            id: self.id,
            quota_bytes: self.quota_bytes(),
            key_id: k.current,
            created_ms: self.created_ms,
            key_seq: k.since_seq,
            replication: self.replication(),
            incarnation: self.incarnation(),
        }
    }

    /// Which creation of the namespace in the pod this is, if the pod spoke of it.
    pub fn incarnation(&self) -> Option<u64> {
        Some(self.incarnation.load(Ordering::Relaxed)).filter(|&i| i != 0)
    }
}

/// Counters shared by the request path and the writer.
#[derive(Default)]
pub(crate) struct Counters {
    live_bytes: AtomicU64,
    blocks: AtomicU64,
    used_bytes: AtomicU64,
    regions_free: AtomicU64,
    hits: AtomicU64,
    dram_hits: AtomicU64,
    misses: AtomicU64,
    integrity_errors: AtomicU64,
    media_errors: AtomicU64,
    evicted_blocks: AtomicU64,
    evicted_regions: AtomicU64,
    reinserted_blocks: AtomicU64,
    device_written_bytes: AtomicU64,
    user_written_bytes: AtomicU64,
    recovered_records: AtomicU64,
}

/// Sequence numbers (record nonces): handed out from a range whose upper bound is persisted
/// (synced) before any number in it is used, so a restart never reuses one.
struct SeqAlloc {
    next: AtomicU64,
    reserved: Mutex<u64>,
    reserved_fast: AtomicU64,
}

const SEQ_CHUNK: u64 = 1 << 20;

pub(crate) struct Core {
    pub cfg: Config,
    pub geometry: Geometry,
    pub device: Arc<dyn Device>,
    pub index: Index,
    kek: parking_lot::RwLock<Arc<AeadKey>>,
    /// [`crypto::fingerprint`] of the KEK in use.
    kek_fingerprint: parking_lot::Mutex<[u8; 8]>,
    namespaces: RwLock<HashMap<String, Arc<Namespace>>>,
    ns_by_id: RwLock<HashMap<u32, Arc<Namespace>>>,
    /// Verified plaintext of blocks the index holds. Never holds a block the index does not
    /// (or holds under another record): the writer drops entries right after the index
    /// write that removes them ([`Core::dram_forget`]), and a read admits what it read only
    /// if no such removal ran since it read the index ([`Core::dram_admit`]).
    dram: Mutex<S3Fifo>,
    /// Bumped, under the `dram` lock, by every [`Core::dram_forget`].
    dram_invalidations: AtomicU64,
    pub leases: Leases,
    /// The miss-ratio curve of the node's block references (GET hits and PUTs), sampled.
    pub mrc: Option<Mutex<ctxpod_plan::mrc::Mrc>>,
    /// Bytes of the blocks referenced, to turn blocks into bytes.
    pub mrc_ref_bytes: AtomicU64,
    /// When the engine opened: the curve's window, and the node's uptime.
    pub started: std::time::Instant,
    pub events: events::Events,
    pub presence: presence::Presence,
    pub read_bits: ReadBits,
    seq: SeqAlloc,
    /// Drawn at random at every start: the last 4 bytes of every nonce this incarnation
    /// seals under ([`record::nonce_for`]).
    nonce_salt: [u8; 4],
    offload: OffloadEngine,
    pub metrics: Arc<Metrics>,
    pub counters: Counters,
    /// A record write found the device full: batches are answered 507 until the writer
    /// has re-read its state from the index and the device (`Writer::reopen`). Holds where
    /// the first failed batch began.
    no_space: Mutex<Option<(u32, u32)>>,
    failed: AtomicBool,
    /// Set by the writer after a commit that skipped the flush and sync (`fast` puts only),
    /// cleared by the next synced commit.
    unsynced: AtomicBool,
}

impl Core {
    pub fn dev_offset(&self, region: u32, offset: u32) -> u64 {
        self.geometry.data_offset + region as u64 * self.geometry.region_bytes + offset as u64
    }

    fn ns_by_id(&self, id: u32) -> Option<Arc<Namespace>> {
        self.ns_by_id.read().get(&id).cloned()
    }

    fn fail(&self, what: &str, e: &anyhow::Error) {
        if !self.failed.swap(true, Ordering::SeqCst) {
            tracing::error!(error = %format!("{e:#}"), "{what} failed; the node stops accepting writes");
        }
    }

    /// Drops the DRAM copies of blocks whose index entries were removed (evicted, deleted,
    /// quarantined) and of every block of the namespaces in `namespaces`. Called once that
    /// index write is done, before anyone is told of it.
    pub(crate) fn dram_forget<'a>(
        &self,
        bkeys: impl IntoIterator<Item = &'a [u8]>,
        namespaces: &[u32],
    ) {
        let mut d = self.dram.lock();
        self.dram_invalidations.fetch_add(1, Ordering::SeqCst);
        for k in bkeys {
            d.remove(k);
        }
        for &id in namespaces {
            d.remove_namespace(id);
        }
    }

    /// A ticket for [`Core::dram_admit`], taken before the index is read.
    fn dram_ticket(&self) -> u64 {
        self.dram_invalidations.load(Ordering::SeqCst)
    }

    /// Puts a block just read from `loc` into the DRAM tier, unless the index no longer
    /// holds that record. `ticket` was taken before the index lookup that gave `loc`: if no
    /// removal ran since, the entry is current (a removal that comes later drops it);
    /// otherwise the index is asked again, under the lock the removals take.
    fn dram_admit(&self, bkey: CacheKey, data: Bytes, loc: &BlockLoc, ticket: u64) -> Result<()> {
        let mut d = self.dram.lock();
        if self.dram_invalidations.load(Ordering::SeqCst) != ticket
            && self.index.get_block(&bkey)?.map(|l| l.seq) != Some(loc.seq)
        {
            return Ok(());
        }
        d.insert(bkey, data, loc.crc32c);
        Ok(())
    }

    fn next_seq(&self) -> anyhow::Result<u64> {
        let s = self.seq.next.fetch_add(1, Ordering::Relaxed);
        if s < self.seq.reserved_fast.load(Ordering::Acquire) {
            return Ok(s);
        }
        let mut r = self.seq.reserved.lock();
        while s >= *r {
            let hi = *r + SEQ_CHUNK;
            let mut wo = rocksdb::WriteOptions::default();
            wo.set_sync(true);
            self.index
                .db
                .put_opt(index::META_SEQ_RESERVED, hi.to_le_bytes(), &wo)
                .map_err(|e| anyhow::anyhow!("persist nonce reservation: {e}"))?;
            *r = hi;
        }
        self.seq.reserved_fast.store(*r, Ordering::Release);
        Ok(s)
    }
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

pub struct Engine {
    core: Arc<Core>,
    writer_tx: mpsc::Sender<WriteCmd>,
    writer: Mutex<Option<tokio::task::JoinHandle<()>>>,
    ns_lock: tokio::sync::Mutex<()>,
}

/// Outcome of reading and checking one record.
enum Verified {
    Ok(Bytes),
    Bad(String),
}

/// Checks a record read from the device against its index entry and opens it. `dek` is
/// `None` on a node that stores records in plaintext.
fn verify_record(
    buf: AlignedBuf,
    dek: Option<&AeadKey>,
    ns_id: u32,
    key: &[u8],
    loc: &BlockLoc,
) -> Verified {
    match open_record(buf, dek, ns_id, key, loc) {
        Ok(plain) => check_plaintext(plain, loc.crc32c),
        Err(why) => Verified::Bad(why),
    }
}

/// The plaintext's CRC32C against the one the index (and header) hold: the CRC engine's
/// half of a read's checks.
fn check_plaintext(plain: Bytes, crc: u32) -> Verified {
    if crc32c::crc32c(&plain) != crc {
        return Verified::Bad("plaintext CRC32C mismatch".into());
    }
    Verified::Ok(plain)
}

/// The record's header against its index entry, then AES-GCM open: the AEAD engine's half
/// of a read's checks. The plaintext still needs [`check_plaintext`]. With `dek` `None` (a
/// node formatted with `encrypt_at_rest = false`) only plaintext records are accepted, and
/// with a key only sealed ones: rewriting the header's flag (its CRC is not keyed) cannot
/// make an encrypting node release a body it did not authenticate.
fn open_record(
    mut buf: AlignedBuf,
    dek: Option<&AeadKey>,
    ns_id: u32,
    key: &[u8],
    loc: &BlockLoc,
) -> Result<Bytes, String> {
    let h = match RecordHeader::decode(&buf) {
        Ok(h) => h,
        Err(e) => return Err(format!("record header: {e}")),
    };
    if h.ns_id != ns_id
        || h.key != key
        || h.len != loc.len
        || h.crc32c != loc.crc32c
        || h.seq != loc.seq
        || h.key_id != loc.key_id
        || !record::nonce_matches(h.seq, &h.nonce)
    {
        return Err("record header does not match the index".into());
    }
    let len = h.len as usize;
    match (dek, h.plaintext) {
        (Some(dek), false) => {
            let aad = crypto::block_aad(ns_id, h.key_id, key);
            match crypto::open(
                dek,
                h.nonce,
                &aad,
                &mut buf[HEADER_BYTES..HEADER_BYTES + len + TAG_BYTES],
            ) {
                Ok(n) if n == len => {}
                _ => return Err("AES-GCM authentication failed".into()),
            }
        }
        (None, true) => {}
        (Some(_), true) => return Err("a plaintext record on an encrypting node".into()),
        (None, false) => return Err("a sealed record on a plaintext node".into()),
    }
    Ok(Bytes::from_owner(buf).slice(HEADER_BYTES..HEADER_BYTES + len))
}

/// A block body received straight into the buffer its record will be written from (at the
/// payload's offset), so that ingest costs no copy beyond the network's.
pub struct StagedBlock {
    buf: AlignedBuf,
    len: usize,
    /// Payload bytes received so far.
    filled: usize,
    /// CRC32C of the payload received so far, computed inline with the landing copy (as a
    /// DPU computes it inline with the DMA that lands the data), while the bytes are still
    /// in cache: the body is not read again to check it.
    crc: u32,
}

impl StagedBlock {
    /// Room for a body of `len` bytes; refuses empty and over-limit bodies.
    pub fn new(len: usize) -> Result<StagedBlock> {
        if len > ctxpod_wire::BLOCK_BYTES_MAX {
            return Err(EngineError::TooLarge(format!(
                "block of {len} bytes is over the limit of {}",
                ctxpod_wire::BLOCK_BYTES_MAX
            )));
        }
        if len == 0 {
            return Err(EngineError::Invalid("empty block".into()));
        }
        Ok(StagedBlock {
            buf: AlignedBuf::reused(record::record_bytes(len)),
            len,
            filled: 0,
            crc: 0,
        })
    }

    /// A copy of `data`, staged.
    pub fn copy_of(data: &[u8]) -> Result<StagedBlock> {
        let mut s = StagedBlock::new(data.len())?;
        s.append(data);
        Ok(s)
    }

    /// The part of the body not received yet, to receive into directly (then
    /// [`StagedBlock::advance`]).
    pub fn unfilled_mut(&mut self) -> &mut [u8] {
        &mut self.buf[HEADER_BYTES + self.filled..HEADER_BYTES + self.len]
    }

    /// Marks `n` more bytes of [`StagedBlock::unfilled_mut`] as received (and checksums
    /// them while they are in cache).
    pub fn advance(&mut self, n: usize) {
        let n = n.min(self.len - self.filled);
        let start = HEADER_BYTES + self.filled;
        self.crc = crc32c::crc32c_append(self.crc, &self.buf[start..start + n]);
        self.filled += n;
    }

    /// Appends the next piece of the body; false (and nothing appended) if it would run
    /// past the announced length.
    pub fn append(&mut self, piece: &[u8]) -> bool {
        let end = self.filled + piece.len();
        if end > self.len {
            return false;
        }
        let dst = &mut self.buf[HEADER_BYTES + self.filled..HEADER_BYTES + end];
        dst.copy_from_slice(piece);
        self.crc = crc32c::crc32c_append(self.crc, dst);
        self.filled = end;
        true
    }

    /// The body received so far.
    pub fn payload(&self) -> &[u8] {
        &self.buf[HEADER_BYTES..HEADER_BYTES + self.filled]
    }

    /// Whether the whole announced body has arrived.
    pub fn is_complete(&self) -> bool {
        self.filled == self.len
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Seals the payload in place and completes the record: header, tag, zero padding.
    /// Without a data key (a plaintext node) the body stays as received and the tag is zero.
    fn seal(
        mut self,
        ns_id: u32,
        (key_id, dek): (u32, Option<&AeadKey>),
        key: &[u8],
        (seq, salt): (u64, [u8; 4]),
        crc: u32,
    ) -> AlignedBuf {
        let len = self.len;
        let nonce = record::nonce_for(seq, salt);
        let tag = match dek {
            Some(dek) => crypto::seal(
                dek,
                nonce,
                &crypto::block_aad(ns_id, key_id, key),
                &mut self.buf[HEADER_BYTES..HEADER_BYTES + len],
            ),
            None => [0; TAG_BYTES],
        };
        self.buf[HEADER_BYTES + len..HEADER_BYTES + len + TAG_BYTES].copy_from_slice(&tag);
        self.buf[HEADER_BYTES + len + TAG_BYTES..].fill(0);
        RecordHeader {
            ns_id,
            key_id,
            len: len as u32,
            crc32c: crc,
            seq,
            nonce,
            region_epoch: 0,
            key: key.to_vec(),
            plaintext: dek.is_none(),
        }
        .encode(&mut self.buf[..HEADER_BYTES]);
        self.buf
    }
}

/// Holds on blocks (see [`Engine::hold`]), released when dropped.
pub struct Held {
    core: Arc<Core>,
    bkeys: Vec<Vec<u8>>,
}

impl Drop for Held {
    fn drop(&mut self) {
        for b in &self.bkeys {
            self.core.leases.release(b);
        }
        self.core.metrics.leases.set(self.core.leases.len() as i64);
        self.core
            .metrics
            .leased_bytes
            .set(self.core.leases.bytes() as i64);
    }
}

impl ctxpod_wire::proto::Landing for StagedBlock {
    fn unfilled_mut(&mut self) -> &mut [u8] {
        StagedBlock::unfilled_mut(self)
    }

    fn advance(&mut self, n: usize) {
        StagedBlock::advance(self, n)
    }
}

enum PutPrep {
    Crc(u32),
    Record(u32, AlignedBuf),
}

impl Engine {
    /// Opens (formatting on first start) and recovers the node's state, then starts the writer.
    pub async fn open(cfg: Config, metrics: Arc<Metrics>) -> anyhow::Result<Engine> {
        Self::open_on(cfg, metrics, None).await
    }

    /// [`Engine::open`] on a device the caller made (instead of the configured one).
    pub async fn open_on(
        cfg: Config,
        metrics: Arc<Metrics>,
        device: Option<Arc<dyn crate::device::Device>>,
    ) -> anyhow::Result<Engine> {
        let core = recovery::open(cfg, metrics, device).await?;
        let t = Instant::now();
        let n = core.presence.rebuild(&core.index)?;
        tracing::info!(
            blocks = n,
            ms = t.elapsed().as_millis() as u64,
            "presence set built"
        );
        let core = Arc::new(core);
        let (tx, rx) = mpsc::channel(core.cfg.write_queue_depth);
        let w = writer::Writer::new(core.clone())?;
        let handle = tokio::spawn(w.run(rx));
        let engine = Engine {
            core,
            writer_tx: tx,
            writer: Mutex::new(Some(handle)),
            ns_lock: tokio::sync::Mutex::new(()),
        };
        if engine
            .core
            .namespaces
            .read()
            .get(ctxpod_wire::namespace::DEFAULT_NAMESPACE)
            .is_none()
        {
            engine
                .create_namespace(ctxpod_wire::namespace::DEFAULT_NAMESPACE, None)
                .await
                .map_err(|e| anyhow::anyhow!("create the default namespace: {e}"))?;
        }
        engine.publish_gauges();
        Ok(engine)
    }

    /// Stops the writer after it has committed everything queued.
    pub async fn shutdown(&self) {
        let h = self.writer.lock().take();
        let (tx, rx) = oneshot::channel();
        if self.writer_tx.send(WriteCmd::Stop(tx)).await.is_ok() {
            let _ = rx.await;
        }
        if let Some(h) = h {
            let _ = h.await;
        }
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.core.metrics
    }

    pub fn ready(&self) -> bool {
        !self.core.failed.load(Ordering::SeqCst)
    }

    fn ns(&self, name: &str) -> Result<Arc<Namespace>> {
        self.core
            .namespaces
            .read()
            .get(name)
            .cloned()
            .ok_or_else(|| EngineError::NotFound(format!("namespace {name:?} does not exist")))
    }

    fn check_key(key: &[u8]) -> Result<()> {
        ctxpod_wire::key::check_key(key).map_err(|e| EngineError::Invalid(e.to_string()))
    }

    /// Stores a block (copied into a staging buffer). See [`Engine::put_staged`].
    pub async fn put(
        &self,
        ns: &str,
        key: &[u8],
        data: Bytes,
        client_crc: Option<u32>,
        durability: Durability,
    ) -> Result<PutStatus> {
        Self::check_key(key)?;
        let staged = StagedBlock::copy_of(&data)?;
        self.put_staged(ns, key, staged, client_crc, durability)
            .await
    }

    /// Stores a block. `client_crc`, when given, must match the body.
    pub async fn put_staged(
        &self,
        ns: &str,
        key: &[u8],
        staged: StagedBlock,
        client_crc: Option<u32>,
        durability: Durability,
    ) -> Result<PutStatus> {
        Self::check_key(key)?;
        if self.core.failed.load(Ordering::SeqCst) {
            return Err(EngineError::Internal(anyhow::anyhow!(
                "the node failed a device write or flush and accepts no writes"
            )));
        }
        if !staged.is_complete() {
            return Err(EngineError::Invalid(
                "the block's body is incomplete".into(),
            ));
        }
        let len = staged.len();
        let ns = self.ns(ns)?;
        let bkey = block_key(ns.id, key);
        self.reference(&bkey, len);
        let existing = self.core.index.get_block(&bkey)?;
        if existing.is_none() {
            if let Some(q) = ns.quota_bytes() {
                if ns.used_bytes.load(Ordering::Relaxed) + len as u64 > q {
                    return Err(EngineError::Quota(format!(
                        "namespace {} is at its quota",
                        ns.name
                    )));
                }
            }
        }
        let seq = if existing.is_none() {
            self.core.next_seq()?
        } else {
            0
        };
        if existing.is_none() {
            self.rotate_if_worn(&ns, seq).await?;
        }
        let (key_id, dek) = ns
            .current_key()
            .ok_or_else(|| anyhow::anyhow!("namespace {} has no current data key", ns.name))?;
        // The body's CRC32C was computed inline with its landing copy; the AEAD engine seals
        // it: the request thread only hands the buffer over.
        let crc = staged.crc;
        if client_crc.is_some_and(|c| c != crc) {
            return Err(EngineError::Integrity(format!(
                "body CRC32C is {crc:08x}, not the {:08x} the client sent",
                client_crc.unwrap_or_default()
            )));
        }
        let prep = if existing.is_some() {
            PutPrep::Crc(crc)
        } else {
            let (ns_id, key2, salt) = (ns.id, key.to_vec(), self.core.nonce_salt);
            let record = if self.core.geometry.plaintext_at_rest {
                // Nothing to seal: the header is written here, with no trip to the AEAD
                // engine.
                staged.seal(ns_id, (key_id, None), &key2, (seq, salt), crc)
            } else {
                self.core
                    .offload
                    .aead(move || staged.seal(ns_id, (key_id, Some(&dek)), &key2, (seq, salt), crc))
                    .await?
            };
            PutPrep::Record(crc, record)
        };
        let (crc, record) = match prep {
            PutPrep::Crc(crc) => {
                let loc = existing.expect("Crc only when the block exists");
                if loc.crc32c != crc || loc.len as usize != len {
                    return Err(EngineError::Conflict);
                }
                // The stored copy may come from a `fast` put not yet flushed: a durable
                // re-put waits for the writer's next flush and sync.
                if durability == Durability::Durable && self.core.unsynced.load(Ordering::SeqCst) {
                    let (tx, rx) = oneshot::channel();
                    self.send(WriteCmd::Barrier(tx))?;
                    rx.await
                        .map_err(|_| anyhow::anyhow!("writer stopped before answering"))??;
                }
                return Ok(PutStatus::Exists);
            }
            PutPrep::Record(crc, record) => (crc, record),
        };
        let (tx, rx) = oneshot::channel();
        let cmd = WriteCmd::Put(writer::PutReq {
            ns: ns.clone(),
            bkey: bkey.clone(),
            len: len as u32,
            crc,
            key_id,
            seq,
            record,
            durability,
            reply: tx,
        });
        self.send(cmd)?;
        let status = rx
            .await
            .map_err(|_| anyhow::anyhow!("writer stopped before answering"))??;
        if status == PutStatus::Created {
            self.core.events.block(&bkey, events::KvEventKind::Stored);
            self.core
                .counters
                .user_written_bytes
                .fetch_add(len as u64, Ordering::Relaxed);
            self.core.metrics.user_written_bytes.inc_by(len as u64);
        }
        Ok(status)
    }

    fn send(&self, cmd: WriteCmd) -> Result<()> {
        self.writer_tx.try_send(cmd).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => {
                self.core
                    .metrics
                    .busy_rejections
                    .with_label_values(&["write"])
                    .inc();
                EngineError::Busy("write queue")
            }
            mpsc::error::TrySendError::Closed(_) => {
                EngineError::Internal(anyhow::anyhow!("writer stopped"))
            }
        })
    }

    /// The block's bytes, verified, and their CRC32C, or `None`.
    pub async fn get(&self, ns: &str, key: &[u8]) -> Result<Option<(Bytes, u32)>> {
        Self::check_key(key)?;
        let ns = self.ns(ns)?;
        let bkey: CacheKey = block_key(ns.id, key).into();
        let c = &self.core;
        if let Some(b) = c.dram.lock().get(&bkey) {
            self.reference(&bkey, b.0.len());
            c.read_bits.set(&bkey);
            c.counters.hits.fetch_add(1, Ordering::Relaxed);
            c.counters.dram_hits.fetch_add(1, Ordering::Relaxed);
            c.metrics.hits.with_label_values(&["dram"]).inc();
            return Ok(Some(b));
        }
        let ticket = c.dram_ticket();
        let found = match c.index.get_block(&bkey)? {
            Some(loc) => self
                .read_record(&ns, key, &bkey, loc)
                .await?
                .map(|b| (b, loc)),
            None => None,
        };
        match found {
            Some((b, loc)) => {
                self.reference(&bkey, b.len());
                c.read_bits.set(&bkey);
                c.counters.hits.fetch_add(1, Ordering::Relaxed);
                c.metrics.hits.with_label_values(&["flash"]).inc();
                c.dram_admit(bkey, b.clone(), &loc, ticket)?;
                Ok(Some((b, loc.crc32c)))
            }
            None => {
                c.counters.misses.fetch_add(1, Ordering::Relaxed);
                c.metrics.misses.inc();
                Ok(None)
            }
        }
    }

    async fn read_record(
        &self,
        ns: &Arc<Namespace>,
        key: &[u8],
        bkey: &[u8],
        loc: BlockLoc,
    ) -> Result<Option<Bytes>> {
        let c = &self.core;
        let Some(dek) = ns.opening_key(loc.key_id, c.geometry.plaintext_at_rest) else {
            return Err(
                anyhow::anyhow!("no data key {} for namespace {}", loc.key_id, ns.name).into(),
            );
        };
        // Not zeroed: the read overwrites the whole buffer or fails (short transfers are
        // resubmitted), and whatever it held before cannot pass the header's identity check
        // against the index and the AEAD (or CRC32C) check.
        let buf = AlignedBuf::reused(loc.record_len as usize);
        let (buf, r) = c
            .device
            .read_at(buf, c.dev_offset(loc.region, loc.offset))
            .await;
        r.map_err(|e| anyhow::anyhow!("device read of region {}: {e}", loc.region))?;
        c.metrics.device_read_bytes.inc_by(loc.record_len as u64);
        let (ns_id, key2) = (ns.id, key.to_vec());
        let opened = match dek {
            // A plaintext node's read checks only the header here: no trip to the AEAD
            // engine.
            None => open_record(buf, None, ns_id, &key2, &loc),
            Some(dek) => {
                c.offload
                    .aead(move || open_record(buf, Some(&dek), ns_id, &key2, &loc))
                    .await?
            }
        };
        let verdict = match opened {
            Ok(plain) => {
                c.offload
                    .crc(move || check_plaintext(plain, loc.crc32c))
                    .await?
            }
            Err(why) => Verified::Bad(why),
        };
        match verdict {
            Verified::Ok(b) => Ok(Some(b)),
            Verified::Bad(why) => {
                // The record may have been moved or its region reclaimed while we read it:
                // only a record the index still points at is corrupt.
                if c.index.get_block(bkey)? == Some(loc) {
                    c.counters.integrity_errors.fetch_add(1, Ordering::Relaxed);
                    c.metrics.integrity_errors.inc();
                    tracing::warn!(
                        namespace = %ns.name,
                        key = %ctxpod_wire::key::KeyDisplay(key),
                        region = loc.region,
                        offset = loc.offset,
                        "integrity check failed ({why}); block quarantined and answered as a miss"
                    );
                    let _ = self.send(WriteCmd::Quarantine {
                        bkey: bkey.to_vec(),
                        loc,
                    });
                }
                Ok(None)
            }
        }
    }

    /// Whether the block is present, without reading it: what a GET would find (the DRAM
    /// tier only ever holds blocks the index holds).
    pub async fn contains(&self, ns: &str, key: &[u8]) -> Result<bool> {
        Self::check_key(key)?;
        let ns = self.ns(ns)?;
        let bkey = block_key(ns.id, key);
        Ok(self.core.index.get_block(&bkey)?.is_some())
    }

    /// Up to `limit` keys of namespace `ns` held on flash, in key order, after `after`
    /// (from the first when `None`): a cursor over the namespace for the pod's backfill.
    /// Blocks still only in DRAM (not yet committed) are not listed.
    pub fn keys_after(&self, ns: &str, after: Option<&[u8]>, limit: usize) -> Result<Vec<Vec<u8>>> {
        let ns = self.ns(ns)?;
        let prefix = ns.id.to_be_bytes();
        let mut from = block_key(ns.id, after.unwrap_or_default());
        if after.is_some() {
            // The first key after `after`: `after` followed by a zero byte.
            from.push(0);
        }
        let idx = &self.core.index;
        let mut out = Vec::with_capacity(limit.min(4096));
        for item in idx.db.iterator_cf(
            idx.cf(index::CF_BLOCKS),
            rocksdb::IteratorMode::From(&from, rocksdb::Direction::Forward),
        ) {
            let (k, _) = item.map_err(anyhow::Error::from)?;
            if out.len() == limit || !k.starts_with(&prefix) {
                break;
            }
            out.push(k[prefix.len()..].to_vec());
        }
        Ok(out)
    }

    /// A reference to a block (served or stored), for the miss-ratio curve.
    fn reference(&self, bkey: &[u8], len: usize) {
        if let Some(m) = &self.core.mrc {
            self.core
                .mrc_ref_bytes
                .fetch_add(len as u64, Ordering::Relaxed);
            m.lock().access_bytes(bkey);
        }
    }

    /// Time since the engine opened.
    pub fn uptime(&self) -> Duration {
        self.core.started.elapsed()
    }

    /// The node's miss-ratio curve so far: its histogram, sampling rate, keys tracked, and
    /// the mean size of a referenced block; `None` when off (`mrc_sample_rate = 0`).
    pub fn mrc(&self) -> Option<(ctxpod_plan::mrc::Histogram, f64, usize, u64)> {
        let m = self.core.mrc.as_ref()?.lock();
        let h = m.histogram();
        let refs = h.total as u64;
        let mean = self.core.mrc_ref_bytes.load(Ordering::Relaxed) / refs.max(1);
        Some((h, m.rate(), m.tracked(), mean))
    }

    /// A block's bytes from flash for a copy to another member (the pod's backfill):
    /// verified like any read, but not counted as a hit, not cached in DRAM and not marked
    /// read, so the node's hit ratio and eviction order stay as its clients made them.
    pub async fn read_for_copy(&self, ns: &str, key: &[u8]) -> Result<Option<(Bytes, u32)>> {
        Self::check_key(key)?;
        let ns = self.ns(ns)?;
        let bkey: CacheKey = block_key(ns.id, key).into();
        match self.core.index.get_block(&bkey)? {
            Some(loc) => Ok(self
                .read_record(&ns, key, &bkey, loc)
                .await?
                .map(|b| (b, loc.crc32c))),
            None => Ok(None),
        }
    }

    /// The length of the block a GET would serve now, without reading it (`None`: absent,
    /// counted as a miss, as a GET would count it): what an answer admits against its byte
    /// budgets before the read.
    pub fn block_len(&self, ns: &str, key: &[u8]) -> Result<Option<usize>> {
        Self::check_key(key)?;
        let ns = self.ns(ns)?;
        let bkey = block_key(ns.id, key);
        // A DRAM hit needs no index lookup: the DRAM tier holds only blocks the index holds.
        if let Some(len) = self.core.dram.lock().len_of(&bkey) {
            return Ok(Some(len));
        }
        let loc = self.core.index.get_block(&bkey)?;
        if loc.is_none() {
            self.core.counters.misses.fetch_add(1, Ordering::Relaxed);
            self.core.metrics.misses.inc();
        }
        Ok(loc.map(|l| l.len as usize))
    }

    /// Whether the index holds the block (it is on flash), whatever the DRAM tier holds.
    pub fn on_flash(&self, ns: &str, key: &[u8]) -> Result<bool> {
        Self::check_key(key)?;
        let ns = self.ns(ns)?;
        Ok(self.core.index.get_block(&block_key(ns.id, key))?.is_some())
    }

    /// The offload engines (CRC32C, AES-GCM) this node's data path runs on.
    pub fn offload(&self) -> &OffloadEngine {
        &self.core.offload
    }

    /// The simulated device under this node, if it runs on one (firmware-sim).
    pub fn sim_device(&self) -> Option<&Arc<ctxpod_firmware_sim::SimDevice>> {
        self.core.device.sim()
    }

    /// True if the block existed and is now deleted.
    pub async fn delete(&self, ns: &str, key: &[u8]) -> Result<bool> {
        Self::check_key(key)?;
        let ns = self.ns(ns)?;
        let bkey = block_key(ns.id, key);
        let (tx, rx) = oneshot::channel();
        self.send(WriteCmd::Delete {
            ns: ns.clone(),
            bkey: bkey.clone(),
            reply: tx,
        })?;
        // The writer dropped the DRAM copy once the delete was in the index.
        let existed = rx
            .await
            .map_err(|_| anyhow::anyhow!("writer stopped before answering"))??;
        if existed {
            self.core.events.block(&bkey, events::KvEventKind::Deleted);
        }
        Ok(existed)
    }

    /// Number of leading keys of `chain` present, from the in-memory presence set (no
    /// RocksDB lookup per key). The DRAM tier holds nothing the index does not.
    pub async fn match_prefix(&self, ns: &str, chain: Vec<Vec<u8>>) -> Result<u64> {
        for k in &chain {
            Self::check_key(k)?;
        }
        let ns = self.ns(ns)?;
        Ok(self.core.presence.leading(ns.id, &chain) as u64)
    }

    /// Pins the present keys among `keys` for `ttl`; returns how many were pinned.
    pub async fn pin(&self, ns: &str, keys: Vec<Vec<u8>>, ttl: Duration) -> Result<u64> {
        let each = self.pin_each(ns, keys, ttl).await?;
        Ok(each.iter().filter(|p| **p).count() as u64)
    }

    /// Pins the present keys among `keys` for `ttl`; per key, whether it was present (and
    /// is now pinned).
    pub async fn pin_each(&self, ns: &str, keys: Vec<Vec<u8>>, ttl: Duration) -> Result<Vec<bool>> {
        let ns = self.ns(ns)?;
        let until = Instant::now() + ttl;
        for k in &keys {
            Self::check_key(k)?;
        }
        let mut each = Vec::with_capacity(keys.len());
        let owner = self.lease_owner(&ns.name);
        for k in keys {
            let bkey = block_key(ns.id, &k);
            let loc = self.core.index.get_block(&bkey)?;
            if let Some(loc) = &loc {
                let taken = self.core.leases.pin(
                    &bkey,
                    until,
                    loc.record_len as u64,
                    owner.as_ref().map(|(name, max)| leases::Owner {
                        name,
                        bytes_max: *max,
                    }),
                );
                if let Err(e) = taken {
                    self.lease_gauges();
                    return Err(self.lease_refused(e));
                }
            }
            each.push(loc.is_some());
        }
        self.lease_gauges();
        Ok(each)
    }

    /// Holds the present keys among `keys` against eviction until the returned guard is
    /// dropped (a prefetch ticket's lease); per key, whether it is present and held. A key
    /// the lease table has no room for is reported absent.
    pub async fn hold(&self, ns: &str, keys: Vec<Bytes>) -> Result<(Held, Vec<bool>)> {
        for k in &keys {
            Self::check_key(k)?;
        }
        let ns = self.ns(ns)?;
        let core = self.core.clone();
        let owner = self.lease_owner(&ns.name);
        let (held, present) = tokio::task::spawn_blocking(move || -> Result<_> {
            let bkeys: Vec<Vec<u8>> = keys.iter().map(|k| block_key(ns.id, k)).collect();
            let mut held = Held {
                core: core.clone(),
                bkeys: Vec::new(),
            };
            let mut present = Vec::with_capacity(bkeys.len());
            for chunk in bkeys.chunks(256) {
                let locs = core.index.multi_get_blocks(chunk)?;
                for (bkey, loc) in chunk.iter().zip(locs) {
                    // A key the lease limits have no room for is a miss for the prefetch.
                    let ok = loc.is_some_and(|loc| {
                        core.leases
                            .hold(
                                bkey,
                                loc.record_len as u64,
                                owner.as_ref().map(|(name, max)| leases::Owner {
                                    name,
                                    bytes_max: *max,
                                }),
                            )
                            .map_err(|e| {
                                core.metrics
                                    .lease_refusals
                                    .with_label_values(&[e.reason()])
                                    .inc();
                            })
                            .is_ok()
                    });
                    if ok {
                        held.bkeys.push(bkey.clone());
                    }
                    present.push(ok);
                }
            }
            Ok((held, present))
        })
        .await
        .map_err(|e| anyhow::anyhow!("hold task: {e}"))??;
        self.lease_gauges();
        Ok((held, present))
    }

    /// Who the leases of namespace `name` are charged to (its tenant, for a tenant's
    /// `tenant/ns`), and how many bytes that tenant may lease.
    fn lease_owner(&self, name: &str) -> Option<(Arc<str>, u64)> {
        let (tenant, _) = name.split_once('/')?;
        Some((
            Arc::from(tenant),
            self.core.cfg.tenant_leased_bytes_max(tenant),
        ))
    }

    /// A refused pin: the lease table full is BUSY (503); the node's leased bytes at their
    /// limit is 507 `no_space` (leases hold the device); a tenant's, 403 `quota`.
    fn lease_refused(&self, e: leases::LeaseRefused) -> EngineError {
        self.core
            .metrics
            .lease_refusals
            .with_label_values(&[e.reason()])
            .inc();
        match e {
            leases::LeaseRefused::Table => EngineError::Busy("lease table"),
            leases::LeaseRefused::NodeBytes => EngineError::NoSpace(format!(
                "pinned and held blocks take leased_bytes_max ({} bytes)",
                self.core.cfg.leased_bytes_max()
            )),
            leases::LeaseRefused::OwnerBytes(t) => EngineError::Quota(format!(
                "tenant {t}'s pinned and held blocks take its leased_bytes_max ({} bytes)",
                self.core.cfg.tenant_leased_bytes_max(&t)
            )),
        }
    }

    fn lease_gauges(&self) {
        let m = &self.core.metrics;
        m.leases.set(self.core.leases.len() as i64);
        m.leased_bytes.set(self.core.leases.bytes() as i64);
    }

    /// KV events of namespace `ns` (see [`events`]): its id, to filter the node-wide stream
    /// by, and a receiver.
    pub fn subscribe(
        &self,
        ns: &str,
    ) -> Result<(u32, tokio::sync::broadcast::Receiver<events::KvEvent>)> {
        let ns = self.ns(ns)?;
        let rx = self.core.events.subscribe(ns.id).map_err(|_| {
            self.core
                .metrics
                .busy_rejections
                .with_label_values(&["events"])
                .inc();
            EngineError::Busy("event queues (event_queues_max)")
        })?;
        Ok((ns.id, rx))
    }

    pub async fn unpin(&self, ns: &str, keys: Vec<Vec<u8>>) -> Result<u64> {
        let each = self.unpin_each(ns, keys).await?;
        Ok(each.iter().filter(|p| **p).count() as u64)
    }

    /// Ends the pins of `keys`; per key, whether it was pinned.
    pub async fn unpin_each(&self, ns: &str, keys: Vec<Vec<u8>>) -> Result<Vec<bool>> {
        let ns = self.ns(ns)?;
        for k in &keys {
            Self::check_key(k)?;
        }
        let each = keys
            .iter()
            .map(|k| self.core.leases.unpin(&block_key(ns.id, k)))
            .collect();
        self.core.metrics.leases.set(self.core.leases.len() as i64);
        Ok(each)
    }

    /// Creates a namespace, or updates its quota if it exists. True when created.
    pub async fn create_namespace(
        &self,
        name: &str,
        quota_bytes: Option<u64>,
    ) -> Result<(bool, NamespaceInfo)> {
        self.create_namespace_with(
            name,
            NsSettings {
                quota_bytes,
                ..NsSettings::default()
            },
        )
        .await
    }

    /// Creates a namespace with these settings, or sets them if it exists. True when created.
    pub async fn create_namespace_with(
        &self,
        name: &str,
        settings: NsSettings,
    ) -> Result<(bool, NamespaceInfo)> {
        let NsSettings {
            quota_bytes,
            replication,
            incarnation,
        } = settings;
        ctxpod_wire::namespace::check_scoped_name(name)
            .map_err(|e| EngineError::Invalid(e.to_string()))?;
        if let Some(r) = replication {
            if !(1..=ctxpod_wire::REPLICATION_MAX).contains(&r) {
                return Err(EngineError::Invalid(format!(
                    "replication must be within 1..={}",
                    ctxpod_wire::REPLICATION_MAX
                )));
            }
        }
        let _g = self.ns_lock.lock().await;
        let c = &self.core;
        let cf_ns = c.index.cf(index::CF_NAMESPACES);
        let existing = c.namespaces.read().get(name).cloned();
        if let Some(ns) = existing {
            let incarnation = incarnation.or(ns.incarnation());
            if ns.quota_bytes() != quota_bytes
                || ns.replication() != replication
                || ns.incarnation() != incarnation
            {
                let meta = NsMeta {
                    quota_bytes,
                    replication,
                    incarnation,
                    ..ns.meta()
                };
                let mut wb = rocksdb::WriteBatch::default();
                wb.put_cf(
                    cf_ns,
                    name,
                    serde_json::to_vec(&meta).map_err(anyhow::Error::from)?,
                );
                c.index.write(wb, index::WriteMode::Wal { sync: true })?;
                ns.quota
                    .store(quota_bytes.unwrap_or(NO_QUOTA), Ordering::Relaxed);
                ns.replication
                    .store(replication.unwrap_or(0), Ordering::Relaxed);
                ns.incarnation
                    .store(incarnation.unwrap_or(0), Ordering::Relaxed);
            }
            return Ok((false, ns.info()));
        }
        let id = match c.index.get_meta(index::META_NEXT_NS_ID)? {
            Some(v) => u32::from_le_bytes(
                v.as_slice()
                    .try_into()
                    .map_err(|_| anyhow::anyhow!("bad next_ns_id in the index"))?,
            ),
            None => 1,
        };
        let key_id = 1;
        let dek = crypto::random_key();
        let meta = NsMeta {
            id,
            quota_bytes,
            key_id,
            created_ms: now_ms(),
            key_seq: c.seq.next.load(Ordering::Relaxed),
            replication,
            incarnation,
        };
        let mut wb = rocksdb::WriteBatch::default();
        wb.put_cf(
            cf_ns,
            name,
            serde_json::to_vec(&meta).map_err(anyhow::Error::from)?,
        );
        wb.put_cf(
            c.index.cf(index::CF_KEYS),
            index::keys_key(id, key_id),
            crypto::wrap_dek(&c.kek.read(), id, key_id, &dek),
        );
        wb.put(index::META_NEXT_NS_ID, (id + 1).to_le_bytes());
        c.index.write(wb, index::WriteMode::Wal { sync: true })?;
        let ns = Arc::new(Namespace::new(
            name,
            &meta,
            HashMap::from([(key_id, Arc::new(AeadKey::new(&dek)))]),
        ));
        c.namespaces.write().insert(name.to_string(), ns.clone());
        c.ns_by_id.write().insert(ns.id, ns.clone());
        Ok((true, ns.info()))
    }

    /// Makes a new data key current for namespace `name`: new writes use it, records under
    /// older keys stay readable by their key id. Returns the new key id.
    pub async fn rotate_data_key(&self, name: &str) -> Result<u32> {
        let _g = self.ns_lock.lock().await;
        let ns = self.ns(name)?;
        let next = self.core.seq.next.load(Ordering::Relaxed);
        self.rotate_locked(&ns, next, "requested")
    }

    /// Rotates `ns`'s data key if `seq` (a write about to be sealed) is
    /// `dek_rotate_after_writes` or more past the sequence number at which the key became
    /// current.
    async fn rotate_if_worn(&self, ns: &Arc<Namespace>, seq: u64) -> Result<()> {
        let limit = self.core.cfg.dek_rotate_after_writes.max(1);
        let worn = || seq.saturating_sub(ns.keys.read().since_seq) >= limit;
        if !worn() {
            return Ok(());
        }
        let _g = self.ns_lock.lock().await;
        // Another write may have rotated it while this one waited.
        if worn() && !ns.deleted.load(Ordering::SeqCst) {
            // This write is the new key's first.
            self.rotate_locked(ns, seq, "worn")?;
        }
        Ok(())
    }

    /// Under `ns_lock`: a fresh DEK, wrapped by the KEK, and the namespace's metadata naming
    /// it current from sequence number `from_seq` on, in one synced index write; then the
    /// in-memory switch.
    fn rotate_locked(&self, ns: &Namespace, from_seq: u64, why: &str) -> Result<u32> {
        let c = &self.core;
        let mut meta = ns.meta();
        let key_id = meta
            .key_id
            .checked_add(1)
            .ok_or_else(|| anyhow::anyhow!("namespace {} ran out of key ids", ns.name))?;
        let dek = crypto::random_key();
        meta.key_id = key_id;
        meta.key_seq = from_seq;
        let mut wb = rocksdb::WriteBatch::default();
        wb.put_cf(
            c.index.cf(index::CF_KEYS),
            index::keys_key(ns.id, key_id),
            crypto::wrap_dek(&c.kek.read(), ns.id, key_id, &dek),
        );
        wb.put_cf(
            c.index.cf(index::CF_NAMESPACES),
            &ns.name,
            serde_json::to_vec(&meta).map_err(anyhow::Error::from)?,
        );
        c.index.write(wb, index::WriteMode::Wal { sync: true })?;
        {
            let mut k = ns.keys.write();
            k.deks.insert(key_id, Arc::new(AeadKey::new(&dek)));
            k.current = key_id;
            k.since_seq = meta.key_seq;
        }
        c.metrics.dek_rotations.inc();
        tracing::info!(namespace = %ns.name, key_id, reason = why, "data key rotated");
        Ok(key_id)
    }

    /// Re-reads the key-encryption key file; if it holds a new KEK, re-wraps every data key
    /// of every namespace under it in one synced index write, then uses it. Returns how many
    /// data keys were re-wrapped (0: the file is unchanged). Until the write lands the old
    /// KEK stays in use; a node stopped before it needs `kek_previous_file` to start.
    pub async fn rotate_kek(&self) -> Result<usize> {
        let _g = self.ns_lock.lock().await;
        let c = &self.core;
        let path = c.cfg.kek_path();
        let bytes = recovery::read_kek(&path).map_err(EngineError::Internal)?;
        let fp = crypto::fingerprint(&bytes);
        if *c.kek_fingerprint.lock() == fp {
            return Ok(0);
        }
        let new = Arc::new(AeadKey::new(&bytes));
        let old = c.kek.read().clone();
        let n = recovery::rewrap_deks(&c.index, &new, Some(&old))?;
        *c.kek.write() = new;
        *c.kek_fingerprint.lock() = fp;
        c.metrics.kek_rotations.inc();
        tracing::info!(rewrapped = n, path = %path.display(), "key-encryption key rotated");
        Ok(n)
    }

    /// Whether namespace `name` exists (`None`: no), and its incarnation in the pod.
    pub fn namespace_incarnation(&self, name: &str) -> Option<Option<u64>> {
        Some(self.core.namespaces.read().get(name)?.incarnation())
    }

    /// The copies namespace `name` asks for in the pod, if it exists and sets its own.
    pub fn namespace_replication(&self, name: &str) -> Option<u32> {
        self.core.namespaces.read().get(name)?.replication()
    }

    pub fn namespace(&self, name: &str) -> Result<NamespaceInfo> {
        Ok(self.ns(name)?.info())
    }

    /// Bytes of live blocks in every namespace whose node-side name starts with `prefix`
    /// (`tenant/`: a tenant's usage, for its quota).
    pub fn used_bytes_under(&self, prefix: &str) -> u64 {
        self.core
            .namespaces
            .read()
            .iter()
            .filter(|(name, _)| name.starts_with(prefix))
            .map(|(_, n)| n.used_bytes.load(Ordering::Relaxed))
            .sum()
    }

    pub fn namespaces(&self) -> Vec<NamespaceInfo> {
        let mut v: Vec<_> = self
            .core
            .namespaces
            .read()
            .values()
            .map(|n| n.info())
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// Deletes a namespace: its data key is destroyed (crypto-shred) and its blocks freed.
    /// `default` is recreated at once, empty, with a new key.
    pub async fn delete_namespace(&self, name: &str) -> Result<()> {
        let _g = self.ns_lock.lock().await;
        let ns = self.ns(name)?;
        let (tx, rx) = oneshot::channel();
        self.send(WriteCmd::DropNamespace {
            ns: ns.clone(),
            reply: tx,
        })?;
        rx.await
            .map_err(|_| anyhow::anyhow!("writer stopped before answering"))??;
        self.core.namespaces.write().remove(name);
        self.core.ns_by_id.write().remove(&ns.id);
        self.core.events.namespace_deleted(ns.id);
        // The wrapped DEKs were deleted in the index; now out of its files too.
        let (core, id) = (self.core.clone(), ns.id);
        tokio::task::spawn_blocking(move || core.index.purge_keys(id))
            .await
            .map_err(|e| anyhow::anyhow!("purge task: {e}"))??;
        drop(_g);
        if name == ctxpod_wire::namespace::DEFAULT_NAMESPACE {
            self.create_namespace(name, None).await?;
        }
        Ok(())
    }

    fn publish_gauges(&self) {
        let c = &self.core;
        let m = &c.metrics;
        let (crc, aead) = c.offload.stats();
        for (engine, s) in [("crc32c", crc), ("aes-gcm", aead)] {
            for (figure, v) in [
                ("ops", s.ops as f64),
                ("busy_seconds", s.busy_seconds),
                ("rejected_busy", s.rejected_busy as f64),
                ("faults", s.faults as f64),
            ] {
                m.offload.with_label_values(&[engine, figure]).set(v);
            }
        }
        if let Some(dev) = c.device.sim() {
            if m.sim.get().is_none() {
                match crate::metrics::SimGauges::register(&m.registry) {
                    Ok(g) => drop(m.sim.set(g)),
                    Err(e) => tracing::warn!("simulated device metrics not registered: {e}"),
                }
            }
            if let Some(g) = m.sim.get() {
                g.update(dev);
            }
        }
        m.capacity_bytes.set(c.geometry.capacity_bytes as i64);
        m.used_bytes
            .set(c.counters.used_bytes.load(Ordering::Relaxed) as i64);
        m.live_bytes
            .set(c.counters.live_bytes.load(Ordering::Relaxed) as i64);
        m.blocks
            .set(c.counters.blocks.load(Ordering::Relaxed) as i64);
        m.regions_free
            .set(c.counters.regions_free.load(Ordering::Relaxed) as i64);
        let d = c.dram.lock();
        m.dram_used_bytes.set(d.used_bytes() as i64);
        m.dram_capacity_bytes.set(d.capacity_bytes() as i64);
        m.leases.set(c.leases.len() as i64);
        m.leased_bytes.set(c.leases.bytes() as i64);
    }

    /// Renders `/metrics` after refreshing the gauges.
    pub fn render_metrics(&self) -> String {
        self.publish_gauges();
        self.core.metrics.render()
    }

    pub fn stats(&self) -> Stats {
        let c = &self.core;
        let n = &c.counters;
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (dram_used, dram_cap) = {
            let d = c.dram.lock();
            (d.used_bytes() as u64, d.capacity_bytes() as u64)
        };
        let dev = ld(&n.device_written_bytes);
        let user = ld(&n.user_written_bytes);
        Stats {
            version: env!("CARGO_PKG_VERSION").to_string(),
            io_engine: c.device.engine().to_string(),
            direct_io: c.device.direct(),
            capacity_bytes: c.geometry.capacity_bytes,
            used_bytes: ld(&n.used_bytes),
            live_bytes: ld(&n.live_bytes),
            block_count: ld(&n.blocks),
            region_bytes: c.geometry.region_bytes,
            regions_total: c.geometry.regions as u64,
            regions_free: ld(&n.regions_free),
            dram_capacity_bytes: dram_cap,
            dram_used_bytes: dram_used,
            hits: ld(&n.hits),
            dram_hits: ld(&n.dram_hits),
            misses: ld(&n.misses),
            integrity_errors: ld(&n.integrity_errors),
            media_errors: ld(&n.media_errors),
            evicted_blocks: ld(&n.evicted_blocks),
            evicted_regions: ld(&n.evicted_regions),
            reinserted_blocks: ld(&n.reinserted_blocks),
            device_written_bytes: dev,
            user_written_bytes: user,
            write_amplification: if user == 0 {
                0.0
            } else {
                dev as f64 / user as f64
            },
            leases: c.leases.len() as u64,
            inflight_requests: 0,
            recovered_records: ld(&n.recovered_records),
            uptime_s: c.started.elapsed().as_secs_f64(),
            received_bytes: c.metrics.received_bytes.get(),
            sent_bytes: c.metrics.sent_bytes.get(),
            // The request-latency histograms are the server's: `server::node_stats`.
            latency_bounds_s: Vec::new(),
            latency: Vec::new(),
        }
    }

    pub fn io_engine(&self) -> &'static str {
        self.core.device.engine()
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod coherence_tests;
