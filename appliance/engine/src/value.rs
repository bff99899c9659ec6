//! Values of any size up to the node's `value_bytes_max`, streamed in and out piece by
//! piece. A value of at most `BLOCK_BYTES_MAX` is one record, as a block always was; a
//! larger one is a sequence of `EXTENT_BYTES` extents (`format::record`), written as they
//! arrive (a few in flight) and published at the end as one manifest in the index
//! (`writer::values`): it is visible whole or not at all, whatever crashes when. A read
//! checks every extent it gives out and reads a few ahead; a range read touches only the
//! extents it needs. Neither side ever holds more than a few extents of a value.

use super::*;
use crate::index::{ExtentLoc, Manifest};
use crate::read::{read_checked_record, Checked};
use crate::writer::{ExtentReq, Placed, PublishReq};
use ctxpod_wire::{BLOCK_BYTES_MAX, EXTENT_BYTES};
use std::collections::VecDeque;

/// Extents of one value being written (sealed, queued or being written) at once.
const EXTENTS_IN_FLIGHT: usize = 4;
/// Extents of one value a reader reads ahead of what it gave out.
const EXTENTS_READ_AHEAD: usize = 2;
/// The most memory one value's write holds: its extents in flight and the one being
/// received. What a door charges a large PUT against its ingest budget.
pub const VALUE_WRITE_BYTES_MAX: usize = (EXTENTS_IN_FLIGHT + 1) * EXTENT_BYTES;
/// The most memory one value's read holds: its extents read ahead and the one being sent.
/// What a door charges a large GET against its egress budget.
pub const VALUE_READ_BYTES_MAX: usize = (EXTENTS_READ_AHEAD + 1) * EXTENT_BYTES;

/// Bytes of the piece of a value of `len` bytes that starts at `received`: the whole value
/// when it is one record, otherwise an extent (the last one shorter); 0 once complete.
pub fn piece_len(len: u64, received: u64) -> usize {
    ctxpod_wire::value_piece_len(len, received)
}

/// What takes a value's (or a part's) body piece by piece, as a door receives it.
pub trait Pieces {
    /// Bytes of the next piece to stage (0: complete).
    fn next_piece_len(&self) -> usize;
    /// Takes the next piece, staged whole.
    fn write_piece(
        &mut self,
        piece: StagedBlock,
    ) -> impl std::future::Future<Output = Result<()>> + Send;
}

impl Pieces for ValueWriter<'_> {
    fn next_piece_len(&self) -> usize {
        ValueWriter::next_piece_len(self)
    }

    fn write_piece(
        &mut self,
        piece: StagedBlock,
    ) -> impl std::future::Future<Output = Result<()>> + Send {
        ValueWriter::write_piece(self, piece)
    }
}

/// A value being stored: [`Engine::begin_value`], then [`ValueWriter::write_piece`] for
/// every piece ([`ValueWriter::next_piece_len`] bytes each, staged as the door receives
/// them), then [`ValueWriter::finish`]. Dropped before `finish`, nothing of it is visible.
pub struct ValueWriter<'a> {
    engine: &'a Engine,
    ns: Arc<Namespace>,
    key: Vec<u8>,
    bkey: Vec<u8>,
    len: u64,
    durability: Durability,
    received: u64,
    /// CRC32C of the pieces received so far.
    crc: u32,
    state: WriterState,
}

enum WriterState {
    /// The value fits one record: its body, once staged, is put at `finish`.
    Single(Option<StagedBlock>),
    /// The key holds a value already: the body is only checksummed, to answer `Exists` or
    /// `Conflict` at `finish` without writing it again.
    Existing(BlockLoc),
    Extents(Box<Extents>),
}

pub(crate) struct Extents {
    pub value_seq: u64,
    pub key_id: u32,
    pub dek: Option<Arc<AeadKey>>,
    /// Extents written, in order, with the epochs of their regions.
    pub done: Vec<(ExtentLoc, u64)>,
    /// Extents handed to the writer, oldest first: what each must be, and its answer.
    pub in_flight: VecDeque<(ExtentLoc, oneshot::Receiver<Result<Placed>>)>,
    /// The value's bytes, counted against its namespace's quota until published.
    pub _pending: Option<put::Pending>,
}

impl Engine {
    /// Starts storing a value of `len` bytes under `key`; refuses an empty one, one over
    /// the node's `value_bytes_max`, and one over its namespace's quota, before any byte
    /// of it is written.
    pub async fn begin_value(
        &self,
        ns: &str,
        key: &[u8],
        len: u64,
        durability: Durability,
    ) -> Result<ValueWriter<'_>> {
        Self::check_key(key)?;
        self.check_not_failed()?;
        let max = self.core.cfg.value_bytes_max.0;
        if len > max {
            return Err(EngineError::TooLarge(format!(
                "value of {len} bytes is over the node's value limit of {max} bytes \
                 (value_bytes_max)"
            )));
        }
        if len == 0 {
            return Err(EngineError::Invalid("empty block".into()));
        }
        let ns = self.ns(ns)?;
        let bkey = block_key(ns.id, key);
        let state = match self.core.index.get_block(&bkey)? {
            Some(loc) => WriterState::Existing(loc),
            None if len <= BLOCK_BYTES_MAX as u64 => WriterState::Single(None),
            None => WriterState::Extents(Box::new(self.new_extents(&ns, len).await?)),
        };
        if !matches!(state, WriterState::Single(_)) {
            // A one-record value is referenced by its put.
            self.reference(&bkey, len as usize);
        }
        Ok(ValueWriter {
            engine: self,
            ns,
            key: key.to_vec(),
            bkey,
            len,
            durability,
            received: 0,
            crc: 0,
            state,
        })
    }

    /// A large value's write state: its quota asked for, its sequence number (its
    /// generation, bound into every extent) and data key taken.
    async fn new_extents(&self, ns: &Arc<Namespace>, len: u64) -> Result<Extents> {
        let pending = ns
            .quota_bytes()
            .is_some()
            .then(|| put::Pending::new(ns.clone(), len));
        self.check_quota(ns, len as usize).await?;
        let value_seq = self.core.next_seq()?;
        self.rotate_if_worn(ns, value_seq).await?;
        let (key_id, dek) = ns
            .current_key()
            .ok_or_else(|| anyhow::anyhow!("namespace {} has no current data key", ns.name))?;
        Ok(Extents {
            value_seq,
            key_id,
            dek: (!self.core.geometry.plaintext_at_rest).then_some(dek),
            done: Vec::new(),
            in_flight: VecDeque::new(),
            _pending: pending,
        })
    }
}

impl ValueWriter<'_> {
    /// The value's length.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Never true: an empty value is refused at [`Engine::begin_value`].
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of the next piece to stage (0: every piece was written).
    pub fn next_piece_len(&self) -> usize {
        piece_len(self.len, self.received)
    }

    /// Takes the next piece of the value, staged whole; a piece of a large value is sealed
    /// and handed to the writer at once (this waits while `EXTENTS_IN_FLIGHT` are).
    pub async fn write_piece(&mut self, piece: StagedBlock) -> Result<()> {
        let want = self.next_piece_len();
        if !piece.is_complete() || piece.len() != want {
            return Err(EngineError::Invalid(format!(
                "a piece of {} bytes ({} received) where the value's next piece is {want} bytes",
                piece.len(),
                piece.payload().len()
            )));
        }
        self.crc = ctxpod_wire::crc32c_combine(self.crc, piece.crc32c(), piece.len());
        let offset = self.received;
        self.received += piece.len() as u64;
        match &mut self.state {
            WriterState::Single(slot) => *slot = Some(piece),
            WriterState::Existing(_) => {}
            WriterState::Extents(x) => {
                let index = (offset / EXTENT_BYTES as u64) as u32;
                let engine = self.engine;
                let (ns, key) = (&self.ns, &self.key);
                engine.send_extent(ns, key, x, index, piece).await?;
            }
        }
        Ok(())
    }

    /// Completes the value: every byte received and (when `client_crc` is given) its
    /// CRC32C matching, every extent written; then it becomes visible (`Created`), or is
    /// found there already with the same bytes (`Exists`) or other ones (`Conflict`).
    pub async fn finish(self, client_crc: Option<u32>) -> Result<PutStatus> {
        if self.received != self.len {
            return Err(EngineError::Invalid(format!(
                "the value ended after {} of its {} bytes",
                self.received, self.len
            )));
        }
        let crc = self.crc;
        if client_crc.is_some_and(|c| c != crc) {
            return Err(EngineError::Integrity(format!(
                "body CRC32C is {crc:08x}, not the {:08x} the client sent",
                client_crc.unwrap_or_default()
            )));
        }
        let e = self.engine;
        match self.state {
            WriterState::Single(piece) => {
                let piece = piece.expect("a complete one-record value has its piece");
                e.put_staged(&self.ns.name, &self.key, piece, Some(crc), self.durability)
                    .await
            }
            WriterState::Existing(loc) => {
                e.confirm_existing(&loc, crc, self.len as usize, self.durability)
                    .await
            }
            WriterState::Extents(mut x) => {
                while let Some(front) = x.in_flight.pop_front() {
                    x.done.push(settle(front).await?);
                }
                let status = e
                    .publish_value(self.ns.clone(), self.bkey.clone(), *x, (self.len, crc))
                    .await?;
                if status == PutStatus::Created {
                    e.count_stored(&self.bkey, self.len as usize);
                }
                Ok(status)
            }
        }
    }
}

/// An extent's answer from the writer: where it was written, and its region's epoch.
pub(crate) async fn settle(
    (mut loc, rx): (ExtentLoc, oneshot::Receiver<Result<Placed>>),
) -> Result<(ExtentLoc, u64)> {
    let placed = rx
        .await
        .map_err(|_| anyhow::anyhow!("writer stopped before answering"))??;
    loc.region = placed.region;
    loc.offset = placed.offset;
    Ok((loc, placed.open_seq))
}

impl Engine {
    /// Seals extent `index` of a large value and hands it to the writer, first waiting for
    /// the oldest extent in flight when `EXTENTS_IN_FLIGHT` are.
    pub(crate) async fn send_extent(
        &self,
        ns: &Arc<Namespace>,
        key: &[u8],
        x: &mut Extents,
        index: u32,
        piece: StagedBlock,
    ) -> Result<()> {
        while x.in_flight.len() >= EXTENTS_IN_FLIGHT {
            let front = x.in_flight.pop_front().expect("extents in flight");
            x.done.push(settle(front).await?);
        }
        let seq = self.core.next_seqs(record::seqs_for(piece.len()))?;
        let (len, crc) = (piece.len(), piece.crc32c());
        let of = record::ExtentOf {
            value_seq: x.value_seq,
            index,
        };
        let (ns_id, key_id, salt) = (ns.id, x.key_id, self.core.nonce_salt);
        // A compressing namespace's extents on a node of two tiers are written to `dense`:
        // compressed now, as a demotion would have (its plaintext kept for that).
        let squeeze = match ns.compression() {
            Some(c) if self.core.geometry.tier_count() > 1 => {
                Some((c, Arc::new(piece.payload().to_vec())))
            }
            _ => None,
        };
        let record = match x.dek.clone() {
            None => piece.seal(ns_id, (key_id, None), key, (seq, salt), crc, Some(of)),
            Some(dek) => {
                let key = key.to_vec();
                self.core
                    .offload
                    .aead(len, move || {
                        piece.seal(
                            ns_id,
                            (key_id, Some(&dek)),
                            &key,
                            (seq, salt),
                            crc,
                            Some(of),
                        )
                    })
                    .await?
            }
        };
        let record = match squeeze {
            Some((setting, plain)) => {
                let at = (ns_id, key, x.dek.clone());
                crate::writer::compress_extent(&self.core, at, setting, record, plain).await?
            }
            None => record,
        };
        let loc = ExtentLoc {
            region: 0,
            offset: 0,
            record_len: record.len() as u32,
            len: len as u32,
            crc32c: crc,
            seq,
            index,
        };
        let (tx, rx) = oneshot::channel();
        let cmd = WriteCmd::Extent(ExtentReq {
            ns: ns.clone(),
            record,
            reply: tx,
        });
        // Waits for room in the writer's queue rather than answering busy: the value's
        // earlier extents are already written.
        self.writer_tx
            .send(cmd)
            .await
            .map_err(|_| anyhow::anyhow!("writer stopped"))?;
        x.in_flight.push_back((loc, rx));
        Ok(())
    }

    /// Hands a large value's manifest to the writer and waits for its answer.
    pub(crate) async fn publish_value(
        &self,
        ns: Arc<Namespace>,
        bkey: Vec<u8>,
        x: Extents,
        (len, crc): (u64, u32),
    ) -> Result<PutStatus> {
        let (extents, epochs): (Vec<ExtentLoc>, Vec<u64>) = x.done.into_iter().unzip();
        let first = extents[0];
        let head = BlockLoc {
            region: first.region,
            offset: first.offset,
            record_len: extents.iter().map(|e| e.record_len).sum(),
            len: len as u32,
            crc32c: crc,
            key_id: x.key_id,
            seq: x.value_seq,
            stored_ms: now_ms(),
            extents: extents.len() as u32,
        };
        let (tx, rx) = oneshot::channel();
        let cmd = WriteCmd::Publish(PublishReq {
            ns,
            bkey,
            manifest: Manifest { head, extents },
            epochs,
            durability: Durability::Durable,
            reply: tx,
        });
        self.writer_tx
            .send(cmd)
            .await
            .map_err(|_| anyhow::anyhow!("writer stopped"))?;
        rx.await
            .map_err(|_| anyhow::anyhow!("writer stopped before answering"))?
    }
}

/// A value being read: [`Engine::open_value`], then [`ValueReader::next_piece`] until
/// `None`. Every piece given out was checked; a piece that fails its checks ends the read
/// with an error and quarantines the whole value.
pub struct ValueReader {
    len: u64,
    crc32c: u32,
    stored_ms: u64,
    body: ReadBody,
}

enum ReadBody {
    /// A value of one record, already read and checked (or served from DRAM): the part of
    /// it still to give out.
    Single(Option<Bytes>),
    Extents(Box<ExtentReads>),
}

/// A read of (part of) an extent under way: its bytes from the offset in it they begin at.
type ExtentRead = tokio::task::JoinHandle<Result<(u64, Checked)>>;

struct ExtentReads {
    core: Arc<Core>,
    writer_tx: mpsc::Sender<WriteCmd>,
    ns: Arc<Namespace>,
    key: Vec<u8>,
    bkey: Vec<u8>,
    manifest: Manifest,
    /// Where each extent begins in the value.
    starts: Vec<u64>,
    /// The byte range still to give out.
    pos: u64,
    end: u64,
    /// The next extent to start reading.
    next: usize,
    /// Reads started, in order: each extent's index and its read (from where in it).
    ahead: VecDeque<(usize, ExtentRead)>,
    /// Whether extents are taken from, and put into, the DRAM tier (a GET's read; not a
    /// scrub's, which must read flash and must not fill the tier).
    cached: bool,
    /// The CRC32C of the piece given out last, when it was a whole extent (its manifest's).
    last_crc: Option<u32>,
}

/// The DRAM tier's key of extent `index` of the value of generation `value_seq` in
/// namespace `ns_id`: longer than any block's key (`ns_id ‖ key`, at most 4 +
/// `KEY_BYTES_MAX` bytes), so never one, and starting with `ns_id`, so dropped with the
/// namespace. A generation's sequence number is the node's alone: a value stored again, or
/// another value, never meets an extent cached for this one.
pub(crate) fn extent_cache_key(ns_id: u32, value_seq: u64, index: u32) -> CacheKey {
    let mut k = Vec::with_capacity(4 + ctxpod_wire::KEY_BYTES_MAX + 1);
    k.extend_from_slice(&ns_id.to_be_bytes());
    k.extend_from_slice(&value_seq.to_be_bytes());
    k.extend_from_slice(&index.to_be_bytes());
    k.resize(4 + ctxpod_wire::KEY_BYTES_MAX + 1, 0);
    k.into()
}

impl Drop for ExtentReads {
    fn drop(&mut self) {
        for (_, h) in &self.ahead {
            h.abort();
        }
    }
}

impl Engine {
    /// Opens a value for reading (`None`: absent, counted as a miss), the byte range
    /// `range` of it (the whole value when `None`; clamped to the value). A value of one
    /// record is read (or taken from DRAM) here; a large one extent by extent, as it is
    /// given out, only the extents that hold the range.
    pub async fn open_value(
        &self,
        ns: &str,
        key: &[u8],
        range: Option<(u64, u64)>,
    ) -> Result<Option<ValueReader>> {
        Self::check_key(key)?;
        let nsa = self.ns(ns)?;
        if !self.may_serve() {
            return Ok(None);
        }
        let bkey = block_key(nsa.id, key);
        let Some(manifest) = self.core.index.get_manifest(&bkey)? else {
            // One record: a range of it reads only the segments that hold the range.
            let Some(found) = self.find(ns, key)? else {
                return Ok(None);
            };
            let Some(part) = self.read_found_range(key, found, range).await? else {
                return Ok(None);
            };
            let meta = self.block_meta(ns, key).await?;
            let b = part.bytes;
            return Ok(Some(ValueReader {
                len: part.len,
                crc32c: part.crc32c,
                stored_ms: meta.map_or(0, |m| m.stored_ms),
                body: ReadBody::Single((!b.is_empty()).then_some(b)),
            }));
        };
        let c = &self.core;
        let (head, g) = (manifest.head, &c.geometry);
        let in_dense = manifest.extents.iter().any(|x| g.tier_of(x.region) > 0);
        let reader = self.reader_of(nsa, key, bkey.clone(), manifest, range, true);
        // A large value's read counts as a DRAM hit when its first extent is in the tier.
        let from_dram = match &reader.body {
            ReadBody::Extents(r) => r.cached_extent(r.next).is_some(),
            ReadBody::Single(_) => false,
        };
        if from_dram {
            c.counters.dram_hits.fetch_add(1, Ordering::Relaxed);
        } else {
            c.count_tier_hit(head.region);
        }
        let tier = if from_dram { "dram" } else { "flash" };
        // Read a second time with extents in `dense`: hot, a hint to promote it.
        if self.count_hit(&bkey, head.len as usize, tier) && in_dense {
            c.hint_promote(&bkey, false);
        }
        Ok(Some(reader))
    }

    /// A reader of the large value `key` as the index holds it now (`None`: absent, or not
    /// a large value), not counted as a read: for scrub.
    pub(crate) fn open_extents(
        &self,
        ns: &Arc<Namespace>,
        key: &[u8],
        range: Option<(u64, u64)>,
    ) -> Result<Option<ValueReader>> {
        let bkey = block_key(ns.id, key);
        Ok(self
            .core
            .index
            .get_manifest(&bkey)?
            .map(|m| self.reader_of(ns.clone(), key, bkey, m, range, false)))
    }

    fn reader_of(
        &self,
        nsa: Arc<Namespace>,
        key: &[u8],
        bkey: Vec<u8>,
        manifest: Manifest,
        range: Option<(u64, u64)>,
        cached: bool,
    ) -> ValueReader {
        let c = &self.core;
        let head = manifest.head;
        let (pos, end) = clamp(range, head.len as u64);
        let starts: Vec<u64> = manifest
            .extents
            .iter()
            .scan(0u64, |at, x| {
                let start = *at;
                *at += x.len as u64;
                Some(start)
            })
            .collect();
        // The extent holding `pos`: the last that starts at or before it.
        let next = starts.partition_point(|&s| s <= pos).saturating_sub(1);
        ValueReader {
            len: head.len as u64,
            crc32c: head.crc32c,
            stored_ms: head.stored_ms,
            body: ReadBody::Extents(Box::new(ExtentReads {
                core: c.clone(),
                writer_tx: self.writer_tx.clone(),
                ns: nsa,
                key: key.to_vec(),
                bkey,
                manifest,
                starts,
                pos,
                end,
                next,
                ahead: VecDeque::new(),
                cached,
                last_crc: None,
            })),
        }
    }
}

/// `range` within a value of `len` bytes (the whole value when `None`).
fn clamp(range: Option<(u64, u64)>, len: u64) -> (u64, u64) {
    let (lo, hi) = range.unwrap_or((0, len));
    let hi = hi.min(len);
    (lo.min(hi), hi)
}

impl ValueReader {
    /// The whole value's length (not the range's).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Never true: no empty value is stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// CRC32C of the whole value.
    pub fn crc32c(&self) -> u32 {
        self.crc32c
    }

    /// When the value was stored (ms since the Unix epoch).
    pub fn stored_ms(&self) -> u64 {
        self.stored_ms
    }

    /// The CRC32C of the piece [`ValueReader::next_piece`] gave out last, when it is known
    /// without reading it again (a whole extent: its manifest's, checked when it was read).
    pub fn last_piece_crc32c(&self) -> Option<u32> {
        match &self.body {
            ReadBody::Extents(r) => r.last_crc,
            ReadBody::Single(_) => None,
        }
    }

    /// Whether the value is stored as extents (read from flash as it is given out).
    pub fn is_extents(&self) -> bool {
        matches!(self.body, ReadBody::Extents(_))
    }

    /// The next checked piece of the range (`None`: all of it was given out). An error
    /// ends the read: an extent failed its checks (the value is quarantined), or the value
    /// was evicted, deleted or replaced while it was read.
    pub async fn next_piece(&mut self) -> Result<Option<Bytes>> {
        match &mut self.body {
            ReadBody::Single(b) => Ok(b.take()),
            ReadBody::Extents(r) => r.next_piece().await,
        }
    }
}

impl ExtentReads {
    async fn next_piece(&mut self) -> Result<Option<Bytes>> {
        if self.pos >= self.end {
            return Ok(None);
        }
        let last = self.starts.partition_point(|&s| s < self.end) - 1;
        while self.ahead.len() < EXTENTS_READ_AHEAD && self.next <= last {
            let i = self.next;
            self.next += 1;
            self.ahead.push_back((i, self.start_read(i)));
        }
        let mut tries = 0;
        let (i, from, b) = loop {
            let (i, h) = self.ahead.pop_front().expect("a read is started");
            let (from, checked) = h
                .await
                .map_err(|e| anyhow::anyhow!("extent read task: {e}"))??;
            match checked {
                Checked::Good(b) => break (i, from, b),
                Checked::Corrupt => {
                    return Err(EngineError::Integrity(format!(
                        "extent {i} of the value failed its checks; the value is quarantined"
                    )))
                }
                // An extent moved between tiers while it was read: read again where the
                // value's manifest, still of the same generation, says it is now.
                Checked::Moved if tries < read::READ_MOVED_TRIES && self.reload()? => {
                    tries += 1;
                    self.core.metrics.tier.extent_rereads.inc();
                    let again = self.start_read(i);
                    self.ahead.push_front((i, again));
                }
                Checked::Moved => {
                    return Err(EngineError::NotFound(
                        "the value was evicted, deleted or replaced while it was read".into(),
                    ))
                }
            }
        };
        // `b` holds the extent's bytes from `from` on (all of them, or the segments a part
        // read took).
        let start = self.starts[i] + from;
        let lo = (self.pos - start) as usize;
        let hi = ((self.end - start) as usize).min(b.len());
        self.pos = start + hi as u64;
        let whole = from == 0 && b.len() == self.manifest.extents[i].len as usize;
        self.last_crc =
            (whole && lo == 0 && hi == b.len()).then_some(self.manifest.extents[i].crc32c);
        Ok(Some(b.slice(lo..hi)))
    }

    /// The value's manifest as the index holds it now, if it is still the same value (the
    /// same generation): its extents' places may have changed (moved between tiers).
    /// False when the value is gone or another one is stored under the key.
    fn reload(&mut self) -> Result<bool> {
        let Some(m) = self.core.index.get_manifest(&self.bkey)? else {
            return Ok(false);
        };
        let (a, b) = (&m.head, &self.manifest.head);
        let same = a.seq == b.seq
            && a.len == b.len
            && a.crc32c == b.crc32c
            && m.extents.len() == self.manifest.extents.len();
        if same {
            self.manifest = m;
        }
        Ok(same)
    }

    /// Extent `i`'s bytes in the DRAM tier (checked when they were read from flash), when
    /// this read takes from the tier.
    fn cached_extent(&self, i: usize) -> Option<Bytes> {
        let x = self.manifest.extents.get(i)?;
        let k = extent_cache_key(self.ns.id, self.manifest.head.seq, x.index);
        self.cached
            .then(|| self.core.dram.lock().get(&k).map(|(b, _)| b))
            .flatten()
    }

    /// Starts reading and checking extent `i`: from the DRAM tier when it holds it, else
    /// from flash: only the segments that hold the part of it still to give out when that
    /// is not all of it, else whole (and then into the tier, for a GET's read). Its bytes
    /// from the offset in the extent they begin at.
    fn start_read(&self, i: usize) -> ExtentRead {
        if let Some(b) = self.cached_extent(i) {
            return tokio::spawn(async move { Ok((0, Checked::Good(b))) });
        }
        let x = self.manifest.extents[i];
        let head = self.manifest.head;
        let rec = x.record_loc(&head);
        let of = record::ExtentOf {
            value_seq: head.seq,
            index: x.index,
        };
        // The part of the extent still to give out: reads ahead start at its beginning.
        let start = self.starts[i];
        let want = (
            self.pos.saturating_sub(start),
            (self.end - start).min(x.len as u64),
        );
        let plan = read::part_plan(&rec, Some(want));
        let (core, tx, ns) = (self.core.clone(), self.writer_tx.clone(), self.ns.clone());
        let (key, bkey) = (self.key.clone(), self.bkey.clone());
        let cache_as = self
            .cached
            .then(|| extent_cache_key(ns.id, head.seq, x.index));
        tokio::spawn(async move {
            let at = (&ns, &key[..], &bkey[..]);
            if let Some((segs, _, _)) = plan {
                let from = (segs.start * record::SEGMENT_BYTES) as u64;
                let r = read::read_checked_part(&core, &tx, at, (rec, head), Some(of), segs);
                if let Some(r) = r.await? {
                    return Ok((from, r));
                }
                // Written before segments existed: read whole.
            }
            let r = read_checked_record(&core, &tx, at, (rec, head), Some(of)).await?;
            if let (Some(k), Checked::Good(b)) = (cache_as, &r) {
                core.dram.lock().insert(k, b.clone(), x.crc32c);
            }
            Ok((0, r))
        })
    }
}
