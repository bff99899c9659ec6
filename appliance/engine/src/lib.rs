//! Block engine: namespaces, the read path, the put path up to the writer, recovery.
//!
//! Architecture invariants:
//! - The engine knows nothing of HTTP; it answers [`EngineError`] kinds that the node
//!   (`ctxpod_node::errors`) maps one to one to statuses.
//! - Bytes leave the engine only after the record header matched the index, AES-GCM opened
//!   and the plaintext CRC32C matched. Anything else is quarantined and answered as a miss.
//! - Only the writer task ([`writer`]) mutates the block index and region table.

pub mod compress;
pub mod crypto;
pub mod device;
pub mod dram;
pub mod events;
pub mod heat;
pub mod index;
mod keys;
pub mod leases;
pub mod metrics;
mod namespaces;
mod observe;
pub mod offload;
mod pinning;
pub mod presence;
mod put;
mod read;
mod verify;
use verify::*;
mod recovery;
mod staged;
mod upload;
mod value;
pub use staged::StagedBlock;
mod writer;
pub use upload::{PartInfo, PartWriter, UploadInfo, UPLOADS_MAX, UPLOAD_PARTS_MAX};
pub use value::{
    piece_len, Pieces, ValueReader, ValueWriter, VALUE_READ_BYTES_MAX, VALUE_WRITE_BYTES_MAX,
};

use crate::crypto::AeadKey;
use crate::device::{AlignedBuf, Device};
use crate::metrics::Metrics;
use crate::offload::{OffloadEngine, OffloadError};
use bytes::Bytes;
use ctxpod_format::config::Config;
use ctxpod_format::record::{self, RecordHeader, HEADER_BYTES, TAG_BYTES};
use ctxpod_wire::types::{Compression, NamespaceClass, NamespaceInfo, Stats};
use ctxpod_wire::Durability;
use dram::{CacheKey, S3Fifo};
use index::{block_key, BlockLoc, Geometry, Index, NsMeta};
use leases::{Leases, ReadBits};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, oneshot};
pub use writer::Fate as Promotion;
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
    /// A change the namespace's fixed settings refuse (its class).
    #[error("{0}")]
    Fixed(String),
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

/// What the index says of a block (HEAD, listings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockMeta {
    /// Bytes of the block.
    pub len: u32,
    /// CRC32C of its bytes.
    pub crc32c: u32,
    /// When it was stored, in ms since the Unix epoch.
    pub stored_ms: u64,
}

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
    /// Fixed at creation.
    class: NamespaceClass,
    created_ms: u64,
    keys: parking_lot::RwLock<NsKeys>,
    used_bytes: AtomicU64,
    /// Bytes of new blocks on their way to the writer (admitted by the pod's ledger, not
    /// yet counted in `used_bytes`).
    pending_bytes: AtomicU64,
    /// What the pod's quota ledger lets this node hold of the namespace ([`PodQuota`]);
    /// [`NO_QUOTA`] until the ledger was asked (or without one).
    grant: AtomicU64,
    blocks: AtomicU64,
    deleted: AtomicBool,
    /// [`NsMeta::compression`] as [`compress::setting_code`]; 0: off.
    compression: AtomicU8,
    /// Live blocks held compressed: their plaintext bytes and their records' device bytes.
    compressed_bytes: AtomicU64,
    compressed_stored: AtomicU64,
}

const NO_QUOTA: u64 = u64::MAX;

/// The boxed future a [`PodQuota`] answers with.
pub type QuotaFuture<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<()>> + Send + 'a>>;

/// A pod-wide quota (`ctxpod_pod::quota`): how much of a namespace with a quota this node
/// may hold. Without one (a node alone, a static pod) the quota applies to the node.
pub trait PodQuota: Send + Sync {
    /// Before a new block of `len` bytes goes into `ns` (which has a quota): returns once
    /// the namespace's [`Namespace::grant`] covers its used and pending bytes and `len`, or
    /// the refusal (`Quota`, or `Busy` when the pod cannot be asked).
    fn reserve<'a>(&'a self, ns: &'a Namespace, len: u64) -> QuotaFuture<'a>;
    /// After blocks of `ns` left this node (a delete): the grant above what it holds goes
    /// back to the pod.
    fn released<'a>(&'a self, ns: &'a Namespace) -> QuotaFuture<'a>;
}

/// Whether this node may serve the blocks it holds now (`ctxpod_pod::fence`): a pod member
/// that cannot show it is still in the pod may hold blocks the pod deleted meanwhile, so
/// while it is fenced every read of a block through any door answers absent (a miss: the
/// engine recomputes), and nothing is copied from it. Writes and deletes go on (a delete
/// sent to it, or a tombstone it applies, is what lets it serve again). Without one (a node
/// alone, a static pod) the node always serves.
pub trait ServeGate: Send + Sync {
    /// Whether reads may be served now; a `false` is counted by the gate.
    fn may_serve(&self) -> bool;
}

/// What `PUT /v1/namespaces/{ns}` sets: every setting, each absent one back to its default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NsSettings {
    pub quota_bytes: Option<u64>,
    /// Copies of each block in the pod (`None`: the pod's `replication`).
    pub replication: Option<u32>,
    /// The pod's incarnation of the namespace (`pod::namespaces`), recorded when given;
    /// `None` keeps the one it has.
    pub incarnation: Option<u64>,
    /// The class of a namespace created by this call (`None`: `kv`); an existing
    /// namespace keeps its own, and another one is refused ([`EngineError::Fixed`]).
    pub class: Option<NamespaceClass>,
    /// How blocks are compressed as they move to the dense tier (`None`: not).
    pub compression: Option<Compression>,
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
pub use read::{BlockPart, Found, Scrubbed};

impl Namespace {
    pub fn quota_bytes(&self) -> Option<u64> {
        Some(self.quota.load(Ordering::Relaxed)).filter(|&q| q != NO_QUOTA)
    }

    /// Bytes of the namespace's live blocks on this node.
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes.load(Ordering::Relaxed)
    }

    /// Bytes of new blocks admitted and not yet written.
    pub fn pending_bytes(&self) -> u64 {
        self.pending_bytes.load(Ordering::Relaxed)
    }

    /// What the pod's ledger lets this node hold (`None`: not asked, or no ledger).
    pub fn grant(&self) -> Option<u64> {
        Some(self.grant.load(Ordering::SeqCst)).filter(|&g| g != NO_QUOTA)
    }

    /// Set by the [`PodQuota`] only: never above what the pod's ledger records.
    pub fn set_grant(&self, bytes: u64) {
        self.grant.store(bytes.min(NO_QUOTA - 1), Ordering::SeqCst);
    }

    /// The bytes this node may hold of the namespace: its quota, and the pod's grant when
    /// a ledger gave one.
    fn limit(&self) -> Option<u64> {
        self.quota_bytes()
            .map(|q| q.min(self.grant.load(Ordering::SeqCst)))
    }

    /// Copies of each block in the pod, when the namespace sets its own.
    pub fn replication(&self) -> Option<u32> {
        Some(self.replication.load(Ordering::Relaxed)).filter(|&r| r != 0)
    }

    /// What the namespace holds: `weights` are never evicted.
    pub fn class(&self) -> NamespaceClass {
        self.class
    }

    fn info(&self) -> NamespaceInfo {
        NamespaceInfo {
            name: self.name.clone(),
            quota_bytes: self.quota_bytes(),
            replication: self.replication(),
            class: self.class,
            used_bytes: self.used_bytes.load(Ordering::Relaxed),
            block_count: self.blocks.load(Ordering::Relaxed),
            compression: self.compression(),
            compressed_bytes: self.compressed_bytes.load(Ordering::Relaxed),
            compressed_stored_bytes: self.compressed_stored.load(Ordering::Relaxed),
        }
    }

    /// How the namespace's blocks are compressed as they move to the dense tier.
    pub fn compression(&self) -> Option<Compression> {
        compress::setting_of(self.compression.load(Ordering::Relaxed))
    }

    /// A compressed block (entry `loc`; others are not counted) entering (`add`) or leaving
    /// the namespace's compressed bytes.
    pub(crate) fn count_compressed(&self, loc: &BlockLoc, add: bool) {
        if !loc.is_compressed() {
            return;
        }
        let (raw, stored) = (loc.len as u64, loc.record_len as u64);
        if add {
            self.compressed_bytes.fetch_add(raw, Ordering::Relaxed);
            self.compressed_stored.fetch_add(stored, Ordering::Relaxed);
        } else {
            self.compressed_bytes.fetch_sub(raw, Ordering::Relaxed);
            self.compressed_stored.fetch_sub(stored, Ordering::Relaxed);
        }
    }

    fn new(name: &str, meta: &NsMeta, deks: HashMap<u32, Arc<AeadKey>>) -> Namespace {
        Namespace {
            id: meta.id,
            name: name.to_string(),
            quota: AtomicU64::new(meta.quota_bytes.unwrap_or(NO_QUOTA)),
            replication: AtomicU32::new(meta.replication.unwrap_or(0)),
            incarnation: AtomicU64::new(meta.incarnation.unwrap_or(0)),
            class: meta.class,
            created_ms: meta.created_ms,
            keys: parking_lot::RwLock::new(NsKeys {
                current: meta.key_id,
                since_seq: meta.key_seq,
                deks,
            }),
            used_bytes: AtomicU64::new(0),
            pending_bytes: AtomicU64::new(0),
            grant: AtomicU64::new(NO_QUOTA),
            blocks: AtomicU64::new(0),
            deleted: AtomicBool::new(false),
            compression: AtomicU8::new(compress::setting_code(meta.compression)),
            compressed_bytes: AtomicU64::new(0),
            compressed_stored: AtomicU64::new(0),
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
            class: self.class,
            compression: self.compression(),
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

/// Promotion hints queued at most.
const PROMOTE_HINTS_MAX: usize = 4096;

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
    /// The pod's quota ledger, once the node joined a pod that keeps one.
    pod_quota: std::sync::OnceLock<Arc<dyn PodQuota>>,
    /// The pod's fence, once the node joined a pod that keeps one ([`ServeGate`]).
    serve_gate: std::sync::OnceLock<Arc<dyn ServeGate>>,
    /// Set by the writer after a commit that skipped the flush and sync (`fast` puts only),
    /// cleared by the next synced commit.
    unsynced: AtomicBool,
    /// Blocks (index keys) hinted for promotion to the fast tier (pins, prefetch holds,
    /// second reads from `dense`), moved by the writer when idle; bounded.
    promote_hints: Mutex<std::collections::VecDeque<(Vec<u8>, bool)>>,
    /// Wakes the idle writer when a hint is queued.
    promote_wake: tokio::sync::Notify,
    /// How often each block is read (a node of two tiers counts every block served), for
    /// promotion's admission (`writer::promote`); `None` on a node of one tier.
    heat: Option<Mutex<heat::Sketch>>,
    /// Each tier's `ctxpod_tier_{read,written}_bytes_total` and `ctxpod_tier_hits_total`
    /// series, looked up once: they count every record read and written, and every client
    /// read served from flash.
    tier_io: Vec<[prometheus::IntCounter; 3]>,
}

impl Core {
    /// Hints `bkey` for promotion to the fast tier (nothing on a node of one tier); a full
    /// queue drops it (counted). A `strong` hint (a pin, a prefetch hold: the block is
    /// about to be read) may demote `fast`'s oldest region to make room; a weak one (a
    /// second read) takes only room `fast` has, so that reads spread over more than `fast`
    /// holds do not churn the tiers.
    pub(crate) fn hint_promote(&self, bkey: &[u8], strong: bool) {
        if self.geometry.tiers.len() < 2 || !self.cfg.tier_promote_hints {
            return;
        }
        // A pin or a prefetch hold announces a read: it counts as one for admission.
        if let (true, Some(h)) = (strong, &self.heat) {
            h.lock().add(bkey);
        }
        let mut q = self.promote_hints.lock();
        if q.len() < PROMOTE_HINTS_MAX {
            q.push_back((bkey.to_vec(), strong));
            self.promote_wake.notify_one();
        } else {
            self.metrics.tier.promote_hints_dropped.inc();
        }
    }

    /// Whether the block `bkey` (index entry `loc`) has a record in `dense`, on a node of
    /// two tiers: its own, or for a large value any of its extents (its manifest read
    /// then; the head's place is only its first extent's).
    pub(crate) fn in_dense(&self, bkey: &[u8], loc: &BlockLoc) -> Result<bool> {
        let g = &self.geometry;
        if g.tiers.len() < 2 {
            return Ok(false);
        }
        if loc.extents == 0 {
            return Ok(g.tier_of(loc.region) > 0);
        }
        Ok(self
            .index
            .get_manifest(bkey)?
            .is_some_and(|m| m.extents.iter().any(|x| g.tier_of(x.region) > 0)))
    }

    /// Counts `bytes` read from (`write` false) or written to the tier holding `region`.
    pub(crate) fn count_tier_io(&self, region: u32, bytes: u64, write: bool) {
        self.tier_io[self.geometry.tier_of(region)][usize::from(write)].inc_by(bytes);
    }

    /// A client read served from the tier holding `region`.
    pub(crate) fn count_tier_hit(&self, region: u32) {
        self.tier_io[self.geometry.tier_of(region)][2].inc();
    }

    pub fn dev_offset(&self, region: u32, offset: u32) -> u64 {
        self.geometry.data_offset + region as u64 * self.geometry.region_bytes + offset as u64
    }

    fn ns_by_id(&self, id: u32) -> Option<Arc<Namespace>> {
        self.ns_by_id.read().get(&id).cloned()
    }

    /// Whether a reclaim must keep the block or value `bkey` (its index key): it is leased,
    /// or its namespace holds weights, which are never evicted.
    fn kept(&self, bkey: &[u8]) -> bool {
        self.leases.is_pinned(bkey) || self.holds_weights(bkey)
    }

    /// Whether `bkey`'s namespace is of class `weights`.
    fn holds_weights(&self, bkey: &[u8]) -> bool {
        bkey.get(..4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_be_bytes)
            .and_then(|id| self.ns_by_id(id))
            .is_some_and(|ns| ns.class == NamespaceClass::Weights)
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

    /// One sequence number (a value's generation, an upload's id; the nonce of an
    /// unsegmented record).
    fn next_seq(&self) -> anyhow::Result<u64> {
        self.next_seqs(1)
    }

    /// `n` consecutive sequence numbers, the first returned: a record's nonces, one per
    /// segment ([`record::seqs_for`]).
    fn next_seqs(&self, n: u64) -> anyhow::Result<u64> {
        let s = self.seq.next.fetch_add(n, Ordering::Relaxed);
        if s + n <= self.seq.reserved_fast.load(Ordering::Acquire) {
            return Ok(s);
        }
        let mut r = self.seq.reserved.lock();
        while s + n > *r {
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
    /// Multipart uploads in progress, by id (`upload`).
    uploads: Mutex<HashMap<u64, Arc<upload::Upload>>>,
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
        Self::open_on_tiers(cfg, metrics, device.map(|d| vec![d])).await
    }

    /// [`Engine::open`] on devices the caller made, one per tier (`fast` then `dense` for
    /// a node configured with two; one otherwise).
    pub async fn open_on_tiers(
        cfg: Config,
        metrics: Arc<Metrics>,
        devices: Option<Vec<Arc<dyn crate::device::Device>>>,
    ) -> anyhow::Result<Engine> {
        let core = recovery::open(cfg, metrics, devices).await?;
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
            uploads: Mutex::new(HashMap::new()),
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

    /// Time since the engine opened.
    /// The largest value this node stores (`value_bytes_max`).
    pub fn value_bytes_max(&self) -> u64 {
        self.core.cfg.value_bytes_max.0
    }

    pub fn uptime(&self) -> Duration {
        self.core.started.elapsed()
    }

    /// The offload engines (CRC32C, AES-GCM) this node's data path runs on.
    pub fn offload(&self) -> &OffloadEngine {
        &self.core.offload
    }

    /// The simulated device under this node, if it runs on one (firmware-sim).
    pub fn sim_device(&self) -> Option<&Arc<ctxpod_firmware_sim::SimDevice>> {
        self.core.device.sim()
    }

    pub fn io_engine(&self) -> &'static str {
        self.core.device.info().engine
    }
}

#[cfg(test)]
mod lease_tests;
#[cfg(test)]
mod tests;

#[cfg(test)]
mod coherence_tests;

#[cfg(test)]
mod value_tests;

#[cfg(test)]
mod class_tests;

#[cfg(test)]
mod segment_tests;

#[cfg(test)]
mod compress_tests;
#[cfg(test)]
mod tier_tests;
#[cfg(test)]
mod value_tier_tests;
