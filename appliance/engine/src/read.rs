//! The read path: the DRAM tier, then the index and the device, a record's bytes given out
//! only once verified; and the key-list reads (`contains`, `keys_after`, MATCH).

use super::*;

/// A record's check on the read path.
pub(crate) enum Checked {
    Good(Bytes),
    Corrupt,
    Moved,
}

/// What scrubbing one block found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scrubbed {
    /// Its record read back whole: tag and CRC32C good.
    Good { record_bytes: u64 },
    /// Its record failed a check: quarantined (no longer served, announced as evicted).
    Bad { record_bytes: u64 },
    /// Not on flash any more (evicted, deleted, or rewritten while it was read).
    Gone,
}

/// A block a GET found, not yet read: its length, for the caller to admit against its
/// budgets before the read ([`Engine::read_found`]). Finding it took one namespace lookup
/// and one index read (none on a DRAM hit); the read takes no other.
pub struct Found {
    ns: Arc<Namespace>,
    bkey: CacheKey,
    at: FoundAt,
}

enum FoundAt {
    /// In the DRAM tier: its bytes and their CRC32C.
    Dram(Bytes, u32),
    /// On flash at `loc`; `ticket` taken before the index read (see `dram_admit`).
    Flash { loc: BlockLoc, ticket: u64 },
}

/// What a read of (part of) a block gave: the bytes of the range asked for, and the whole
/// block's CRC32C and length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockPart {
    pub bytes: Bytes,
    pub crc32c: u32,
    pub len: u64,
}

impl BlockPart {
    /// `range` (clamped) of the whole block `b`.
    fn of(b: Bytes, crc32c: u32, range: Option<(u64, u64)>) -> BlockPart {
        let len = b.len() as u64;
        let (lo, hi) = range.map_or((0, len), |(lo, hi)| (lo.min(len), hi.min(len)));
        BlockPart {
            bytes: b.slice(lo as usize..hi.max(lo) as usize),
            crc32c,
            len,
        }
    }
}

/// `part` (a slice of `whole`, a buffer just read from flash) on its own when it is
/// shorter: a small range must not keep a large read buffer alive while its answer waits for
/// a slow client (the doors hold only the range's bytes of their egress budget).
fn detached(part: Bytes, whole: &Bytes) -> Bytes {
    if part.len() < whole.len() {
        Bytes::copy_from_slice(&part)
    } else {
        part
    }
}

/// How a range of the block at `loc` is read in part: the segments that hold it, and the
/// range clamped to the block. `None`: read the record whole (no range, an empty one, one
/// that needs every segment, a record that is not segmented, a large value's manifest).
/// A record whose length on the device is a segmented one's is taken to be one; a record
/// written before segments existed may have that length too, and is then read whole
/// ([`read_checked_part`] finds it out from its header).
pub(crate) fn part_plan(
    loc: &BlockLoc,
    range: Option<(u64, u64)>,
) -> Option<(std::ops::Range<usize>, u64, u64)> {
    let (lo, hi) = range?;
    let len = loc.len as usize;
    let (lo, hi) = (lo.min(len as u64), hi.min(len as u64));
    if loc.extents > 0
        || hi <= lo
        || !record::is_segmented(len)
        || loc.record_len as usize != record::record_bytes(len)
    {
        return None;
    }
    let s = record::SEGMENT_BYTES as u64;
    let segs = (lo / s) as usize..hi.div_ceil(s) as usize;
    (segs.len() < record::segments_for(len)).then_some((segs, lo, hi))
}

impl Found {
    /// The block's length: for a value stored as extents, the whole value's.
    pub fn len(&self) -> usize {
        match &self.at {
            FoundAt::Dram(b, _) => b.len(),
            FoundAt::Flash { loc, .. } => loc.len as usize,
        }
    }

    /// Whether the block holds no bytes (an empty block is stored and served like any other).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Times a read asks the index again after the record it found moved while it was read.
/// Each try means the block moved again meanwhile (a region is reclaimed at most once per
/// batch of the writer), so a few suffice; a quarantined block ends them at once.
pub(crate) const READ_MOVED_TRIES: usize = 4;

impl Engine {
    /// The block's bytes, verified, and their CRC32C, or `None`.
    pub async fn get(&self, ns: &str, key: &[u8]) -> Result<Option<(Bytes, u32)>> {
        match self.find(ns, key)? {
            Some(f) => self.read_found(key, f).await,
            None => Ok(None),
        }
    }

    /// Where a GET of the block would find it, without reading it (`None`: absent, counted
    /// as a miss, as a GET counts it): the DRAM tier, else the index.
    pub fn find(&self, ns: &str, key: &[u8]) -> Result<Option<Found>> {
        Self::check_key(key)?;
        let ns = self.ns(ns)?;
        if !self.may_serve() {
            return Ok(None);
        }
        self.find_in(ns, key)
    }

    fn find_in(&self, ns: Arc<Namespace>, key: &[u8]) -> Result<Option<Found>> {
        let bkey: CacheKey = block_key(ns.id, key).into();
        let c = &self.core;
        if let Some((b, crc)) = c.dram.lock().get(&bkey) {
            let at = FoundAt::Dram(b, crc);
            return Ok(Some(Found { ns, bkey, at }));
        }
        let ticket = c.dram_ticket();
        match c.index.get_block(&bkey)? {
            Some(loc) => {
                let at = FoundAt::Flash { loc, ticket };
                Ok(Some(Found { ns, bkey, at }))
            }
            None => {
                c.counters.misses.fetch_add(1, Ordering::Relaxed);
                c.metrics.misses.inc();
                Ok(None)
            }
        }
    }

    /// Reads a block [`Engine::find`] found under `key`, verified, and its CRC32C. If it
    /// moved since (stored again, evicted, quarantined), the index is asked once more and
    /// what it holds now is read: `None` when that is nothing.
    pub async fn read_found(&self, key: &[u8], f: Found) -> Result<Option<(Bytes, u32)>> {
        Ok(self
            .read_found_range(key, f, None)
            .await?
            .map(|p| (p.bytes, p.crc32c)))
    }

    /// [`Engine::read_found`] of the bytes `range` of the block (all of it when `None`;
    /// clamped to the block). A range of a block on flash whose record is segmented reads
    /// and checks only the segments that hold it (and the record's first 4 KiB: header and
    /// segment table), and leaves the DRAM tier as it is; any other read reads the record
    /// whole.
    pub async fn read_found_range(
        &self,
        key: &[u8],
        f: Found,
        range: Option<(u64, u64)>,
    ) -> Result<Option<BlockPart>> {
        let ns = f.ns.clone();
        if let Some(got) = self.read_at(key, f, range).await? {
            return Ok(Some(got));
        }
        // Moved while it was read (stored again, evicted, quarantined, or moved between
        // tiers, perhaps more than once): the index is asked again, a few times at most.
        let mut got = None;
        for _ in 0..READ_MOVED_TRIES {
            let Some(f) = self.find_in(ns.clone(), key)? else {
                return Ok(None);
            };
            got = self.read_at(key, f, range).await?;
            if got.is_some() {
                break;
            }
        }
        if got.is_none() {
            self.core.counters.misses.fetch_add(1, Ordering::Relaxed);
            self.core.metrics.misses.inc();
        }
        Ok(got)
    }

    /// The read of (part of) a found block, counted as a hit; `None` (not counted) when its
    /// record no longer holds it or failed its checks.
    async fn read_at(
        &self,
        key: &[u8],
        f: Found,
        range: Option<(u64, u64)>,
    ) -> Result<Option<BlockPart>> {
        let c = &self.core;
        let (bkey, got, label) = match f.at {
            FoundAt::Dram(b, crc) => {
                c.counters.dram_hits.fetch_add(1, Ordering::Relaxed);
                (f.bkey, BlockPart::of(b, crc, range), "dram")
            }
            FoundAt::Flash { loc, ticket } => match part_plan(&loc, range) {
                Some((segs, lo, hi)) => {
                    let checked = read_checked_part(
                        &self.core,
                        &self.writer_tx,
                        (&f.ns, key, &f.bkey),
                        (loc, loc),
                        None,
                        segs.clone(),
                    )
                    .await?;
                    let b = match checked {
                        Some(Checked::Good(b)) => b,
                        Some(Checked::Corrupt | Checked::Moved) => return Ok(None),
                        // Written before segments existed: read whole.
                        None => {
                            return self
                                .read_whole_at(key, f.ns, f.bkey, (loc, ticket), range)
                                .await
                        }
                    };
                    let from = (segs.start * record::SEGMENT_BYTES) as u64;
                    let bytes = b.slice((lo - from) as usize..(hi - from) as usize);
                    let bytes = detached(bytes, &b);
                    let part = BlockPart {
                        bytes,
                        crc32c: loc.crc32c,
                        len: loc.len as u64,
                    };
                    self.core.count_tier_hit(loc.region);
                    (f.bkey, part, "flash")
                }
                None => {
                    return self
                        .read_whole_at(key, f.ns, f.bkey, (loc, ticket), range)
                        .await
                }
            },
        };
        self.count_hit(&bkey, got.len as usize, label);
        Ok(Some(got))
    }

    /// [`Engine::read_at`] of a block on flash, its record read whole (and put in the DRAM
    /// tier).
    async fn read_whole_at(
        &self,
        key: &[u8],
        ns: Arc<Namespace>,
        bkey: CacheKey,
        (loc, ticket): (BlockLoc, u64),
        range: Option<(u64, u64)>,
    ) -> Result<Option<BlockPart>> {
        let Some(b) = self.read_record(&ns, key, &bkey, loc).await? else {
            return Ok(None);
        };
        self.core
            .dram_admit(bkey.clone(), b.clone(), &loc, ticket)?;
        let mut got = BlockPart::of(b.clone(), loc.crc32c, range);
        got.bytes = detached(got.bytes, &b);
        self.core.count_tier_hit(loc.region);
        // Read from `dense` a second time: hot, a hint to promote it.
        if self.count_hit(&bkey, got.len as usize, "flash")
            && self.core.geometry.tier_of(loc.region) > 0
        {
            self.core.hint_promote(&bkey, false);
        }
        Ok(Some(got))
    }

    /// A block served: a hit, a reference for the miss-ratio curve, marked read; whether
    /// it was marked read already.
    pub(crate) fn count_hit(&self, bkey: &[u8], len: usize, tier: &str) -> bool {
        let c = &self.core;
        self.reference(bkey, len);
        if let Some(h) = &c.heat {
            h.lock().add(bkey);
        }
        let again = c.read_bits.set(bkey);
        c.counters.hits.fetch_add(1, Ordering::Relaxed);
        c.metrics.hits.with_label_values(&[tier]).inc();
        again
    }

    pub(crate) async fn read_record(
        &self,
        ns: &Arc<Namespace>,
        key: &[u8],
        bkey: &[u8],
        loc: BlockLoc,
    ) -> Result<Option<Bytes>> {
        Ok(match self.read_checked(ns, key, bkey, loc).await? {
            Checked::Good(b) => Some(b),
            Checked::Corrupt | Checked::Moved => None,
        })
    }

    /// A record read from flash and checked: see [`read_checked`].
    async fn read_checked(
        &self,
        ns: &Arc<Namespace>,
        key: &[u8],
        bkey: &[u8],
        loc: BlockLoc,
    ) -> Result<Checked> {
        if loc.extents > 0 {
            return self.read_small_value(ns, key, loc).await;
        }
        read_checked_record(
            &self.core,
            &self.writer_tx,
            (ns, key, bkey),
            (loc, loc),
            None,
        )
        .await
    }

    /// Scrub: re-reads the block's record from flash (never from DRAM, not counted as a
    /// read) and checks it as a GET would. A corrupt record is quarantined (out of the
    /// index, announced as evicted); the caller may then store a good copy again.
    pub async fn scrub_block(&self, ns: &str, key: &[u8]) -> Result<Scrubbed> {
        Self::check_key(key)?;
        let ns = self.ns(ns)?;
        let bkey = block_key(ns.id, key);
        let Some(loc) = self.core.index.get_block(&bkey)? else {
            return Ok(Scrubbed::Gone);
        };
        if loc.extents > 0 {
            return self.scrub_value(&ns, key, loc).await;
        }
        Ok(match self.read_checked(&ns, key, &bkey, loc).await? {
            Checked::Good(_) => Scrubbed::Good {
                record_bytes: loc.record_len as u64,
            },
            Checked::Corrupt => Scrubbed::Bad {
                record_bytes: loc.record_len as u64,
            },
            Checked::Moved => Scrubbed::Gone,
        })
    }

    /// A value stored as extents (`head`: its manifest's head) read whole, if it is no larger
    /// than one record (a multipart upload of small parts); larger ones are streamed
    /// ([`Engine::open_value`]).
    async fn read_small_value(
        &self,
        ns: &Arc<Namespace>,
        key: &[u8],
        head: BlockLoc,
    ) -> Result<Checked> {
        if head.len as usize > ctxpod_wire::BLOCK_BYTES_MAX {
            return Err(EngineError::TooLarge(format!(
                "a value of {} bytes in {} extents is read extent by extent (Engine::open_value)",
                head.len, head.extents
            )));
        }
        let Some(mut r) = self.open_extents(ns, key, None)? else {
            return Ok(Checked::Moved);
        };
        let mut out = bytes::BytesMut::with_capacity(head.len as usize);
        loop {
            match r.next_piece().await {
                Ok(Some(p)) => out.extend_from_slice(&p),
                Ok(None) => break,
                Err(EngineError::Integrity(_)) => return Ok(Checked::Corrupt),
                Err(EngineError::NotFound(_)) => return Ok(Checked::Moved),
                Err(e) => return Err(e),
            }
        }
        if r.crc32c() != head.crc32c || out.len() != head.len as usize {
            // Another value under the key now.
            return Ok(Checked::Moved);
        }
        Ok(Checked::Good(out.freeze()))
    }

    /// Scrub of a large value (`head`: its manifest's head): every extent read back and
    /// checked; the first bad one quarantines the whole value.
    async fn scrub_value(
        &self,
        ns: &Arc<Namespace>,
        key: &[u8],
        head: BlockLoc,
    ) -> Result<Scrubbed> {
        let record_bytes = head.record_len as u64;
        let Some(mut r) = self.open_extents(ns, key, None)? else {
            return Ok(Scrubbed::Gone);
        };
        loop {
            match r.next_piece().await {
                Ok(Some(_)) => {}
                Ok(None) => return Ok(Scrubbed::Good { record_bytes }),
                Err(EngineError::Integrity(_)) => return Ok(Scrubbed::Bad { record_bytes }),
                Err(EngineError::NotFound(_)) => return Ok(Scrubbed::Gone),
                Err(e) => return Err(e),
            }
        }
    }

    /// Whether the block is present, without reading it: what a GET would find (the DRAM
    /// tier only ever holds blocks the index holds).
    pub async fn contains(&self, ns: &str, key: &[u8]) -> Result<bool> {
        Self::check_key(key)?;
        let ns = self.ns(ns)?;
        if !self.may_serve() {
            return Ok(false);
        }
        let bkey = block_key(ns.id, key);
        Ok(self.core.index.get_block(&bkey)?.is_some())
    }

    /// Up to `limit` keys of namespace `ns` held on flash, in key order, after `after`
    /// (from the first when `None`): a cursor over the namespace for the pod's backfill.
    /// Every acknowledged put is listed (the index is written before a put is answered).
    pub fn keys_after(&self, ns: &str, after: Option<&[u8]>, limit: usize) -> Result<Vec<Vec<u8>>> {
        self.list_keys(ns, &[], after, limit)
    }

    /// Up to `limit` keys of namespace `ns` that start with `prefix`, in byte order, after
    /// `after` (from the first when `None`): one page of a key listing. A walk over
    /// RocksDB's sorted index; it reads at most `limit + 1` entries.
    pub fn list_keys(
        &self,
        ns: &str,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Vec<u8>>> {
        Ok(self
            .list_blocks(ns, prefix, after, limit)?
            .into_iter()
            .map(|(k, _)| k)
            .collect())
    }

    /// [`Self::list_keys`] with what the index says of each block.
    pub fn list_blocks(
        &self,
        ns: &str,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, BlockMeta)>> {
        let ns = self.ns(ns)?;
        let ns_prefix = ns.id.to_be_bytes();
        let mut from = block_key(ns.id, prefix);
        if let Some(after) = after {
            // The first key after `after`: `after` followed by a zero byte.
            let mut next = block_key(ns.id, after);
            next.push(0);
            from = from.max(next);
        }
        let idx = &self.core.index;
        let mut out = Vec::with_capacity(limit.min(4096));
        for item in idx.db.iterator_cf(
            idx.cf(index::CF_BLOCKS),
            rocksdb::IteratorMode::From(&from, rocksdb::Direction::Forward),
        ) {
            let (k, v) = item.map_err(anyhow::Error::from)?;
            if out.len() == limit || !k.starts_with(&ns_prefix) {
                break;
            }
            let key = &k[ns_prefix.len()..];
            if !key.starts_with(prefix) {
                break;
            }
            let l = index::BlockLoc::decode(&v)?;
            out.push((
                key.to_vec(),
                BlockMeta {
                    len: l.len,
                    crc32c: l.crc32c,
                    stored_ms: l.stored_ms,
                },
            ));
        }
        Ok(out)
    }

    /// A reference to a block (served or stored), for the miss-ratio curve.
    pub(crate) fn reference(&self, bkey: &[u8], len: usize) {
        if let Some(m) = &self.core.mrc {
            self.core
                .mrc_ref_bytes
                .fetch_add(len as u64, Ordering::Relaxed);
            m.lock().access_bytes(bkey);
        }
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
        if !self.may_serve() {
            return Ok(None);
        }
        let bkey: CacheKey = block_key(ns.id, key).into();
        match self.core.index.get_block(&bkey)? {
            Some(loc) => Ok(self
                .read_record(&ns, key, &bkey, loc)
                .await?
                .map(|b| (b, loc.crc32c))),
            None => Ok(None),
        }
    }

    /// What the index says of a block, without reading it: its length, CRC32C and when it
    /// was stored (`None`: absent). HEAD answers it.
    pub async fn block_meta(&self, ns: &str, key: &[u8]) -> Result<Option<BlockMeta>> {
        Self::check_key(key)?;
        let ns = self.ns(ns)?;
        let loc = self.core.index.get_block(&block_key(ns.id, key))?;
        Ok(loc.map(|l| BlockMeta {
            len: l.len,
            crc32c: l.crc32c,
            stored_ms: l.stored_ms,
        }))
    }

    /// The tier whose device holds the block's record (`fast`, `dense`, or `device` on a
    /// node of one); `None`: absent.
    pub fn tier_of(&self, ns: &str, key: &[u8]) -> Result<Option<&str>> {
        Self::check_key(key)?;
        let ns = self.ns(ns)?;
        let loc = self.core.index.get_block(&block_key(ns.id, key))?;
        let g = &self.core.geometry;
        Ok(loc.map(|l| g.tier_name(g.tier_of(l.region))))
    }

    /// Whether the index holds the block (it is on flash), whatever the DRAM tier holds.
    pub fn on_flash(&self, ns: &str, key: &[u8]) -> Result<bool> {
        Self::check_key(key)?;
        let ns = self.ns(ns)?;
        Ok(self.core.index.get_block(&block_key(ns.id, key))?.is_some())
    }

    /// Number of leading keys of `chain` present, from the in-memory presence set (no
    /// RocksDB lookup per key). The DRAM tier holds nothing the index does not.
    pub async fn match_prefix(&self, ns: &str, chain: Vec<Vec<u8>>) -> Result<u64> {
        for k in &chain {
            Self::check_key(k)?;
        }
        let ns = self.ns(ns)?;
        if !self.may_serve() {
            return Ok(0);
        }
        Ok(self.core.presence.leading(ns.id, &chain) as u64)
    }
}

/// A record read from flash and checked (header identity against the index, AES-GCM tag,
/// CRC32C): its plaintext, or corrupt (the index entry `entry` quarantined: out of the
/// index, announced as evicted, counted), or moved while it was read (no verdict). `rec`
/// is the record: the block's own entry, or for an extent of a large value (`extent`), that
/// extent's (then `entry` is the value's manifest head, and a bad extent quarantines the
/// whole value).
pub(crate) async fn read_checked_record(
    c: &Arc<Core>,
    writer_tx: &tokio::sync::mpsc::Sender<WriteCmd>,
    (ns, key, bkey): (&Arc<Namespace>, &[u8], &[u8]),
    (rec, entry): (BlockLoc, BlockLoc),
    extent: Option<record::ExtentOf>,
) -> Result<Checked> {
    let Some(dek) = ns.opening_key(rec.key_id, c.geometry.plaintext_at_rest) else {
        return Err(anyhow::anyhow!("no data key {} for namespace {}", rec.key_id, ns.name).into());
    };
    // Not zeroed: the read overwrites the whole buffer or fails (short transfers are
    // resubmitted), and whatever it held before cannot pass the header's identity check
    // against the index and the AEAD (or CRC32C) check.
    let buf = AlignedBuf::reused(rec.record_len as usize);
    let (buf, r) = c
        .device
        .read_at(buf, c.dev_offset(rec.region, rec.offset))
        .await;
    r.map_err(|e| anyhow::anyhow!("device read of region {}: {e}", rec.region))?;
    c.metrics.device_read_bytes.inc_by(rec.record_len as u64);
    c.count_tier_io(rec.region, rec.record_len as u64, false);
    let (ns_id, key2) = (ns.id, key.to_vec());
    let opened = open_on_aead(c, dek, rec.len as usize, move |dek| {
        open_record_of(buf, dek, (ns_id, &key2), &rec, extent)
    })
    .await?;
    let verdict = match opened {
        Ok(plain) => {
            c.offload
                .crc(rec.len as usize, move || check_plaintext(plain, rec.crc32c))
                .await?
        }
        Err(why) => Verified::Bad(why),
    };
    judge(c, writer_tx, (ns, key, bkey), (rec, entry), extent, verdict).await
}

/// Segments `segs` of the segmented record `loc` (a block's, or for an extent of a large
/// value (`extent`) that extent's, as in [`read_checked_record`]) read from flash and
/// checked: the record's first 4 KiB (header, segment table) and those segments' bytes, read
/// side by side; the header against the index, the table's CRC32C, each segment's tag and
/// CRC32C. The segments' plaintext, or corrupt (the block quarantined) or moved, as
/// [`read_checked_record`]; `None` when the record turns out not to be segmented (it was
/// written before segments existed) and must be read whole.
pub(crate) async fn read_checked_part(
    c: &Arc<Core>,
    writer_tx: &tokio::sync::mpsc::Sender<WriteCmd>,
    (ns, key, bkey): (&Arc<Namespace>, &[u8], &[u8]),
    (loc, entry): (BlockLoc, BlockLoc),
    extent: Option<record::ExtentOf>,
    segs: std::ops::Range<usize>,
) -> Result<Option<Checked>> {
    let Some(dek) = ns.opening_key(loc.key_id, c.geometry.plaintext_at_rest) else {
        return Err(anyhow::anyhow!("no data key {} for namespace {}", loc.key_id, ns.name).into());
    };
    let (s, len) = (record::SEGMENT_BYTES, loc.len as usize);
    let body_lo = record::SEGMENTED_HEAD_BYTES + segs.start * s;
    let body_hi = (record::SEGMENTED_HEAD_BYTES + (segs.end * s).min(len))
        .next_multiple_of(ctxpod_format::IO_ALIGN_BYTES);
    let at = c.dev_offset(loc.region, loc.offset);
    // Not zeroed, as in `read_checked_record`: what a failed read would leave cannot pass
    // the checks.
    let head = AlignedBuf::reused(record::SEGMENTED_HEAD_BYTES);
    let body = AlignedBuf::reused(body_hi - body_lo);
    let ((head, rh), (body, rb)) = futures::join!(
        c.device.read_at(head, at),
        c.device.read_at(body, at + body_lo as u64)
    );
    for r in [rh, rb] {
        r.map_err(|e| anyhow::anyhow!("device read of region {}: {e}", loc.region))?;
    }
    let read = (record::SEGMENTED_HEAD_BYTES + body_hi - body_lo) as u64;
    c.metrics.device_read_bytes.inc_by(read);
    c.count_tier_io(loc.region, read, false);
    c.metrics.part_reads.inc();
    let (ns_id, key2, n) = (ns.id, key.to_vec(), body_hi - body_lo);
    let opened = open_on_aead(c, dek, n, move |dek| {
        open_record_part(&head, body, dek, (ns_id, &key2), (&loc, extent), segs)
    })
    .await?;
    let verdict = match opened {
        Ok(None) => return Ok(None),
        Ok(Some((plain, crcs))) => {
            c.offload
                .crc(plain.len(), move || check_segments(plain, &crcs, s))
                .await?
        }
        Err(why) => Verified::Bad(why),
    };
    Ok(Some(
        judge(c, writer_tx, (ns, key, bkey), (loc, entry), extent, verdict).await?,
    ))
}

/// `open` run with the namespace's data key on the AEAD engine; on a node that stores
/// records in plaintext (`dek` `None`) run here: it then checks only headers, tables and
/// modes, no trip to the engine.
async fn open_on_aead<T: Send + 'static>(
    c: &Arc<Core>,
    dek: Option<Arc<AeadKey>>,
    bytes: usize,
    open: impl FnOnce(Option<&AeadKey>) -> T + Send + 'static,
) -> Result<T> {
    Ok(match dek {
        None => open(None),
        Some(dek) => c.offload.aead(bytes, move || open(Some(&dek))).await?,
    })
}

/// A read's verdict on the record `rec` (of the index entry `entry`): its plaintext, or,
/// when it failed its checks, corrupt (`entry` quarantined) or moved while it was read.
async fn judge(
    c: &Arc<Core>,
    writer_tx: &tokio::sync::mpsc::Sender<WriteCmd>,
    (ns, key, bkey): (&Arc<Namespace>, &[u8], &[u8]),
    (rec, entry): (BlockLoc, BlockLoc),
    extent: Option<record::ExtentOf>,
    verdict: Verified,
) -> Result<Checked> {
    match verdict {
        Verified::Ok(b) => Ok(Checked::Good(b)),
        Verified::Bad(why) => {
            // The record may have been moved or its region reclaimed while we read it:
            // only a record the index still points at is corrupt.
            let Some(entry) = still_indexed(c, bkey, &rec, entry, extent.is_some())? else {
                return Ok(Checked::Moved);
            };
            c.counters.integrity_errors.fetch_add(1, Ordering::Relaxed);
            c.metrics.integrity_errors.inc();
            tracing::warn!(
                namespace = %ns.name,
                key = %ctxpod_wire::key::KeyDisplay(key),
                region = rec.region,
                offset = rec.offset,
                extent = extent.map(|x| x.index),
                "integrity check failed ({why}); block quarantined and answered as a miss"
            );
            // Answered once the quarantine is in the index: a put of the block made after
            // this miss (read repair, scrub's repair) must not find the bad entry still
            // there and take it for its own copy (an `Exists` that the quarantine then
            // removes).
            let (tx, rx) = tokio::sync::oneshot::channel();
            let quarantine = WriteCmd::Quarantine {
                bkey: bkey.to_vec(),
                loc: entry,
            };
            if writer_tx.try_send(quarantine).is_ok()
                && writer_tx.try_send(WriteCmd::Barrier(tx)).is_ok()
            {
                let _ = rx.await;
            }
            Ok(Checked::Corrupt)
        }
    }
}

/// The index entry `bkey` has now if it still points at the record `rec` that a read of
/// the entry `entry` found (`None`: moved, replaced or gone since). For an extent of a
/// large value (`extent`), the value's manifest must be of the same generation and still
/// hold that extent at that place: its other extents, and with its first one the head's
/// place, may have moved between tiers meanwhile (then the current head is what a
/// quarantine must name). An extent keeps its sequence number when it moves, so its record
/// length is compared too: one demoted compressed and promoted back to the very place it
/// left is another record there.
pub(crate) fn still_indexed(
    c: &Core,
    bkey: &[u8],
    rec: &BlockLoc,
    entry: BlockLoc,
    extent: bool,
) -> Result<Option<BlockLoc>> {
    if !extent {
        return Ok((c.index.get_block(bkey)? == Some(entry)).then_some(entry));
    }
    Ok(c.index.get_manifest(bkey)?.and_then(|m| {
        let same = m.head.seq == entry.seq
            && m.extents.iter().any(|x| {
                x.seq == rec.seq
                    && x.region == rec.region
                    && x.offset == rec.offset
                    && x.record_len == rec.record_len
            });
        same.then_some(m.head)
    }))
}
