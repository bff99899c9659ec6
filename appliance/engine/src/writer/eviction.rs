//! Eviction: free regions kept ahead of the writer (`ensure_free`), the oldest sealed region
//! reclaimed, its recently read and kept records (leased, or of a `weights` namespace) moved
//! rather than dropped (a region mostly kept is kept in place). A large value with an extent
//! in the region is evicted whole (its other extents become dead space where they lie),
//! unless it is kept: then the region is kept in place.
//!
//! On a node of two tiers, reclaim of a `fast` region **demotes**: every live record moves
//! into `dense` (byte for byte, as any move, or compressed for a namespace with
//! `compression`: `writer::compress`), but for those read since they were written or last
//! moved (up to half a region), which stay in `fast`; only `dense` evicts. Should `dense` have
//! no room (every region of it kept), `fast` reclaims as a node of one tier would.

use super::*;

impl Writer {
    /// Reclaims the oldest sealed regions of each tier until its reserve of free regions is
    /// met (or no sealed region is left to try): the evicting tier first, so that the
    /// demotions of `fast`'s reclaim find room.
    pub(crate) async fn ensure_free(&mut self) -> anyhow::Result<()> {
        if self
            .tiers
            .iter()
            .any(|t| t.free.len() < t.reserve && !t.sealed.is_empty())
        {
            // Reclaim reads and rewrites the index: only over committed state.
            self.drain_committer().await;
        }
        let last = self.evicting_tier();
        self.reclaim_tier(last).await?;
        for t in (0..last).rev() {
            self.reclaim_tier(t).await?;
        }
        self.publish();
        Ok(())
    }

    /// Tier `t`'s reserve met, demoting into the next tier while it has room.
    async fn reclaim_tier(&mut self, t: usize) -> anyhow::Result<()> {
        // Bounded: a device whose oldest regions are mostly leased answers puts 507 at once
        // rather than scanning every region on every commit.
        let mut tries = self.tiers[t].sealed.len().min(RECLAIM_TRIES_MAX);
        while self.tiers[t].free.len() < self.tiers[t].reserve && tries > 0 {
            tries -= 1;
            let to = if t < self.evicting_tier() && self.room_for_demotion(t + 1).await? {
                t + 1
            } else {
                t
            };
            self.evict_oldest(t, to).await?;
        }
        Ok(())
    }

    /// Whether tier `t` can take one region's demotion: two free regions (the rest of its
    /// open region may be too small for the next record), its oldest reclaimed as needed.
    pub(super) async fn room_for_demotion(&mut self, t: usize) -> anyhow::Result<bool> {
        let mut tries = self.tiers[t].sealed.len().min(RECLAIM_TRIES_MAX);
        while self.tiers[t].free.len() < 2 && tries > 0 {
            tries -= 1;
            self.evict_oldest(t, t).await?;
        }
        Ok(self.tiers[t].free.len() >= 2)
    }

    /// Reclaims tier `t`'s oldest sealed region. With `to` another tier, every live block
    /// record is demoted into it but those read since they were written or last moved (up
    /// to half a region), which move to the tier's open region. Otherwise blocks that are kept, or were read since they were
    /// written (up to half a region), are moved to the tier's open region byte for byte (same
    /// sequence number, nonce and ciphertext); the rest leave the index. A region more than
    /// half of which is kept records is not rewritten: it goes to the back of the queue
    /// as it is (counted in `ctxpod_reclaim_skipped_regions_total`). So a reclaim moves at
    /// most one region's worth of records (half leased, half recently read), and a device
    /// full of leases is not rewritten over and over by every commit.
    pub(crate) async fn evict_oldest(&mut self, t: usize, to: usize) -> anyhow::Result<()> {
        let Some(r) = self.tiers[t].sealed.pop_front() else {
            return Ok(());
        };
        let demote = to != t;
        let core = self.core.clone();
        let idx = &core.index;
        let cf_br = idx.cf(index::CF_BY_REGION);
        let lo = by_region_key(r, 0);
        let hi = by_region_key(r + 1, 0);
        let (live, values) = live_records(idx, r, (&lo, &hi), usize::MAX)?;
        // Evicting, a large value goes whole; one under a lease keeps every region holding
        // one of its extents in place. Demoting, its extents here move like any record.
        if !demote && values.iter().any(|(bkey, _)| core.kept(bkey)) {
            self.tiers[t].sealed.push_back(r);
            core.metrics.reclaim_skipped.inc();
            tracing::debug!(
                region = r,
                "region holds an extent of a leased value: kept in place"
            );
            return Ok(());
        }
        let budget = core.geometry.region_bytes / 2;
        // Each record's lease, asked once.
        let pinned: Vec<bool> = live.iter().map(|(bkey, _)| core.kept(bkey)).collect();
        let leased: u64 = live
            .iter()
            .zip(&pinned)
            .filter(|(_, p)| **p)
            .map(|((_, loc), _)| loc.record_len as u64)
            .sum();
        if leased > budget && !demote {
            self.tiers[t].sealed.push_back(r);
            core.metrics.reclaim_skipped.inc();
            tracing::debug!(region = r, leased, "region mostly leased: kept in place");
            return Ok(());
        }
        let mut st = Reclaim {
            budget,
            reinsert_bytes: 0,
            wb: WriteBatch::default(),
            moved: 0,
            demoted: 0,
            written: 0,
            gone: Vec::new(),
        };
        for ((bkey, loc), pinned) in live.into_iter().zip(pinned) {
            self.reclaim_record(&core, (r, t, to), bkey, loc, pinned, &mut st)
                .await?;
        }
        for (bkey, head) in values {
            if demote && self.demote_value(&core, (r, t, to), &bkey, &mut st).await? {
                continue;
            }
            self.evict_entry(&mut st.wb, &bkey, &head);
            st.gone.push(bkey);
        }
        let Reclaim {
            mut wb,
            moved,
            demoted,
            written,
            gone,
            ..
        } = st;
        count_written(&self.core, written);
        if written > 0 {
            core.device.flush().await?;
            core.metrics.device_flushes.inc();
        }
        wb.delete_range_cf(cf_br, lo, hi);
        debug_assert_eq!(
            self.regions[r as usize].state,
            RegionState::Sealed,
            "only a sealed region is reclaimed"
        );
        self.regions[r as usize] = RegionMeta::FREE;
        self.touched.insert(r);
        self.put_touched(&mut wb);
        // A checkpoint, synced before the region can be reused: no index entry may point into
        // it afterwards, and the open region's write pointer moves past every earlier put.
        if let Some(earlier) = self.take_checkpoint() {
            idx.write(earlier, index::WriteMode::Wal { sync: false })?;
        }
        idx.write(wb, index::WriteMode::Wal { sync: true })?;
        core.dram_forget(gone.iter().map(Vec::as_slice), &[]);
        self.tiers[t].free.push_back(r);
        core.counters
            .evicted_regions
            .fetch_add(1, Ordering::Relaxed);
        core.counters
            .reinserted_blocks
            .fetch_add(moved - demoted, Ordering::Relaxed);
        core.metrics.evicted_regions.inc();
        core.metrics.reinserted_blocks.inc_by(moved - demoted);
        tracing::debug!(region = r, moved, demoted, "region reclaimed");
        Ok(())
    }

    /// One live record of region `r` at reclaim: moved to the open region when it is leased
    /// or was read recently (within `st.budget`) and reads back intact, otherwise out of the
    /// index (an unreadable or damaged one counted, a damaged one quarantined).
    ///
    /// `(r, t, to)`: the region, its tier, and the tier to move into (another one: a
    /// demotion, which moves every record that reads back intact).
    async fn reclaim_record(
        &mut self,
        core: &Core,
        (r, t, to): (u32, usize, usize),
        bkey: Vec<u8>,
        loc: BlockLoc,
        pinned: bool,
        st: &mut Reclaim,
    ) -> anyhow::Result<()> {
        let idx = &core.index;
        let demote = to != t;
        // Read since it was written or last moved (within half a region's worth): it stays
        // in its tier, moved to the open region, and must be read again to stay another
        // time (a second chance, as CLOCK gives). Demoted, a record keeps its read bit, for
        // the dense tier's own reclaim.
        let read = core.read_bits.take(&bkey);
        let hot = read && st.reinsert_bytes + loc.record_len as u64 <= st.budget;
        if read && !hot && demote {
            core.read_bits.set(&bkey);
        }
        // Where it goes: a demotion takes what was not read.
        let dest = if hot { t } else { to };
        if !(pinned || hot || demote) {
            self.evict_entry(&mut st.wb, &bkey, &loc);
            st.gone.push(bkey);
            return Ok(());
        }
        let (buf, res) = extent_moves::read_place(core, (r, loc.offset), loc.record_len).await;
        // A record the device cannot read is that record's loss only: it is dropped
        // like an unpinned one and counted; the node stays writable.
        if let Err(e) = res {
            count_unreadable_record(core, r, &loc, &e);
            self.evict_entry(&mut st.wb, &bkey, &loc);
            st.gone.push(bkey);
            return Ok(());
        }
        let intact = still_the_record(&buf, &loc, &bkey);
        // Into `dense`, a block of a compressing namespace may go compressed (`wloc`: the
        // entry of what is written).
        let (buf, wloc, intact) = match intact && dest != t {
            true => match self.compress_for_dense(core, &bkey, loc, buf, None).await? {
                Demoted::Same(b) => (b, loc, true),
                Demoted::Compressed(b, wloc) => (b, wloc, true),
                Demoted::Corrupt(b) => (b, loc, false),
            },
            false => (buf, loc, intact),
        };
        let target = match (intact, self.alloc(dest, buf.len())?) {
            (false, _) => None,
            (true, Some(place)) => Some(place),
            // A hot record its own tier has no room for is demoted after all (its read
            // bit kept, as any demoted record's).
            (true, None) if demote && dest == t => {
                core.read_bits.set(&bkey);
                self.alloc(to, buf.len())?
            }
            // A kept record the next tier cannot take stays in its own.
            (true, None) if demote && pinned => self.alloc(t, buf.len())?,
            (true, None) => None,
        };
        let Some((nr, noff)) = target else {
            // A record that no longer checks out, or no room left: it leaves the index.
            self.evict_entry(&mut st.wb, &bkey, &loc);
            if !intact {
                core.counters
                    .integrity_errors
                    .fetch_add(1, Ordering::Relaxed);
                core.metrics.integrity_errors.inc();
                st.wb
                    .put_cf(idx.cf(index::CF_QUARANTINE), &bkey, loc.encode());
            }
            st.gone.push(bkey);
            return Ok(());
        };
        if hot && !pinned && self.core.geometry.tier_of(nr) == t {
            st.reinsert_bytes += loc.record_len as u64;
        }
        if self.core.geometry.tier_of(nr) != t {
            st.demoted += 1;
            core.metrics.tier.demoted_records.inc();
            core.metrics.tier.demoted_bytes.inc_by(buf.len() as u64);
        }
        st.written += self
            .write_copy(core, &bkey, wloc, buf, (nr, noff), &mut st.wb)
            .await?;
        if wloc != loc {
            if let Some(ns) = core.ns_by_id(u32::from_be_bytes(bkey[..4].try_into()?)) {
                ns.count_compressed(&wloc, true);
            }
            // The whole record was read; `write_copy` counted the compressed one's bytes.
            core.count_tier_io(
                loc.region,
                u64::from(loc.record_len.saturating_sub(wloc.record_len)),
                false,
            );
        }
        st.moved += 1;
        Ok(())
    }

    /// The extents in region `r` (of tier `t`) of the large value `bkey` demoted into tier
    /// `to` (a kept value's stay in `t` when `to` has no room): true when done (or the
    /// value, damaged, was quarantined); false when they could not all move (the caller
    /// evicts the value whole).
    async fn demote_value(
        &mut self,
        core: &Core,
        (r, t, to): (u32, usize, usize),
        bkey: &[u8],
        st: &mut Reclaim,
    ) -> anyhow::Result<bool> {
        let idx = &core.index;
        let Some(mut m) = idx.get_manifest(bkey)? else {
            return Ok(false);
        };
        let how = extent_moves::ExtentMove {
            to,
            fallback: core.kept(bkey).then_some(t),
            room: u64::MAX,
            budgeted: false,
            compress: true,
        };
        let (before, head) = (m.extents.clone(), m.head);
        let done = self
            .move_extents(core, bkey, &mut m, |x| x.region == r, how, &mut st.wb)
            .await?;
        if done.damaged {
            // The entry as the index holds it (the copies made before are dead space).
            self.evict_entry(&mut st.wb, bkey, &head);
            core.counters
                .integrity_errors
                .fetch_add(1, Ordering::Relaxed);
            core.metrics.integrity_errors.inc();
            st.wb
                .put_cf(idx.cf(index::CF_QUARANTINE), bkey, head.encode());
            st.gone.push(bkey.to_vec());
            return Ok(true);
        }
        if done.left > 0 {
            return Ok(false);
        }
        st.wb.put_cf(idx.cf(index::CF_BLOCKS), bkey, m.encode());
        // Extents compressed on their way count toward the namespace's ratio.
        if let Some(ns) = core.ns_by_id(u32::from_be_bytes(bkey[..4].try_into()?)) {
            for (old, new) in before.iter().zip(&m.extents) {
                if new.record_len != old.record_len {
                    ns.count_compressed(&new.record_loc(&m.head), true);
                }
            }
        }
        st.moved += done.moved;
        st.written += done.written;
        let demoted = done.moved - done.fell_back;
        st.demoted += demoted;
        core.metrics.tier.demoted_records.inc_by(demoted);
        core.metrics
            .tier
            .demoted_bytes
            .inc_by(done.written - done.fell_back_bytes);
        Ok(true)
    }

    /// Writes `buf`, the record of `bkey` read from `loc`, at (`nr`, `noff`): the same
    /// record byte for byte but for the epoch of the region it now lives in (or, demoted
    /// compressed, the compressed record `loc` describes); its new place into `wb`. The
    /// bytes written.
    pub(super) async fn write_copy(
        &self,
        core: &Core,
        bkey: &[u8],
        loc: BlockLoc,
        buf: AlignedBuf,
        (nr, noff): (u32, u32),
        wb: &mut WriteBatch,
    ) -> anyhow::Result<u64> {
        let written = self.write_record(core, buf, (nr, noff)).await?;
        core.count_tier_io(loc.region, written, false);
        let nloc = BlockLoc {
            region: nr,
            offset: noff,
            ..loc
        };
        let idx = &core.index;
        wb.put_cf(idx.cf(index::CF_BLOCKS), bkey, nloc.encode());
        wb.put_cf(idx.cf(index::CF_BY_REGION), by_region_key(nr, noff), bkey);
        Ok(written)
    }
}

/// Whether `buf`, read from `loc`, is still the record of `bkey` that the index entry
/// `loc` describes (a move copies only such a record).
pub(super) fn still_the_record(buf: &[u8], loc: &BlockLoc, bkey: &[u8]) -> bool {
    RecordHeader::decode(buf).is_ok_and(|h| {
        h.seq == loc.seq && h.len == loc.len && h.crc32c == loc.crc32c && h.key == bkey[4..]
    })
}

/// What one region's reclaim has done so far, record by record.
struct Reclaim {
    /// Bytes of recently read (not leased) records that may move: half a region.
    budget: u64,
    /// Bytes of recently read records moved so far.
    reinsert_bytes: u64,
    /// The reclaim's index changes.
    wb: WriteBatch,
    moved: u64,
    /// Of `moved`, records moved into another tier.
    demoted: u64,
    /// Bytes of moved records written to the device.
    written: u64,
    /// Blocks that leave the index: their DRAM copies go once it is written.
    gone: Vec<Vec<u8>>,
}

/// A block key and its index entry (a large value's: the manifest's head).
pub(super) type Entry = (Vec<u8>, BlockLoc);

/// The index entries of region `r` (its by-region keys from `lo` to `hi`, the first `limit`
/// of them) that still point at their records there: blocks, and (apart, each once, by its
/// manifest's head) large values with at least one extent there.
pub(super) fn live_records(
    idx: &index::Index,
    r: u32,
    (lo, hi): (&[u8], &[u8]),
    limit: usize,
) -> anyhow::Result<(Vec<Entry>, Vec<Entry>)> {
    let mut live: Vec<Entry> = Vec::new();
    let mut values: Vec<Entry> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let iter = idx.db.iterator_cf(
        idx.cf(index::CF_BY_REGION),
        rocksdb::IteratorMode::From(lo, rocksdb::Direction::Forward),
    );
    for item in iter.take(limit) {
        let (k, bkey) = item?;
        if k.as_ref() >= hi {
            break;
        }
        let offset = u32::from_be_bytes(k[4..8].try_into()?);
        let Some(v) = idx.db.get_pinned_cf(idx.cf(index::CF_BLOCKS), &bkey)? else {
            continue;
        };
        match index::Manifest::decode(&v)? {
            None => {
                let loc = BlockLoc::decode(&v)?;
                if loc.region == r && loc.offset == offset {
                    live.push((bkey.to_vec(), loc));
                }
            }
            Some(m) => {
                let here = m
                    .extents
                    .iter()
                    .any(|x| x.region == r && x.offset == offset);
                if here && seen.insert(bkey.to_vec()) {
                    values.push((bkey.to_vec(), m.head));
                }
            }
        }
    }
    Ok((live, values))
}

/// A record to move at reclaim that the device could not read: logged and counted.
fn count_unreadable_record(core: &Core, r: u32, loc: &BlockLoc, e: &std::io::Error) {
    tracing::warn!(
        region = r,
        offset = loc.offset,
        error = %e,
        "a record to move at reclaim could not be read; it is dropped"
    );
    core.metrics
        .media_errors
        .with_label_values(&["reclaim"])
        .inc();
    core.counters.media_errors.fetch_add(1, Ordering::Relaxed);
}
