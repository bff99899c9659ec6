//! The start-up scan of each open region's tail (see `recovery`'s module docs, step 3).

use super::*;

/// Re-indexes the records past the open region's checkpointed write pointer: put entries
/// are written without the WAL, so after a crash the index may lack them, but their records
/// are on the device. A record counts only if its header decodes, carries this region's
/// epoch (not a previous life's), and it opens and checks out under its namespace's key; the
/// scan stops at the first that does not. Every acknowledged put lies before that point: a
/// durable put is acknowledged only once it and every record before it are on stable media
/// (its batch was written `RWF_DSYNC`, and a flush covered any earlier `fast` records).
///
/// A node of two tiers has an open region in each (puts write `fast`'s, demotions
/// `dense`'s): each one's tail is scanned.
pub(super) async fn recover_open_tail(
    dev: &dyn Device,
    index: &Index,
    g: &Geometry,
    regions: &mut [RegionMeta],
    namespaces: &HashMap<u32, Arc<Namespace>>,
    stop_at: Option<(u32, u32)>,
) -> anyhow::Result<TailScan> {
    let mut scan = TailScan::default();
    for t in 0..g.tier_count() {
        if let Some(r) = newest_open_region(regions, g.tier_regions(t)) {
            let s = scan_tail(dev, index, g, regions, namespaces, stop_at, r).await?;
            scan.records += s.records;
            scan.media_errors += s.media_errors;
            scan.bad_records += s.bad_records;
            scan.extents += s.extents;
        }
    }
    Ok(scan)
}

/// The tail scan of open region `r` (see [`recover_open_tail`]).
async fn scan_tail(
    dev: &dyn Device,
    index: &Index,
    g: &Geometry,
    regions: &mut [RegionMeta],
    namespaces: &HashMap<u32, Arc<Namespace>>,
    stop_at: Option<(u32, u32)>,
    r: usize,
) -> anyhow::Result<TailScan> {
    let m = regions[r];
    let base = g.data_offset + r as u64 * g.region_bytes;
    let mut pos = m.write_ptr as u64;
    let mut wb = rocksdb::WriteBatch::default();
    let (cf_blocks, cf_br) = (index.cf(index::CF_BLOCKS), index.cf(index::CF_BY_REGION));
    let mut scan = TailScan::default();
    let end = match stop_at {
        Some((sr, so)) if sr as usize == r => so as u64,
        _ => g.region_bytes,
    };
    while pos + IO_ALIGN_BYTES as u64 <= end {
        // An unreadable header ends the scan (the record's length is unknown), after the
        // drive's own retries and ours; the node starts and stays writable.
        let Some(buf) =
            read_retrying(dev, IO_ALIGN_BYTES, base + pos, &mut scan.media_errors).await
        else {
            tracing::warn!(
                region = r,
                offset = pos,
                "the open region's tail is unreadable here; the scan ends"
            );
            break;
        };
        let Ok(h) = RecordHeader::decode(&buf) else {
            break;
        };
        let record_len = h.record_bytes() as u64;
        if h.region_epoch != m.tail_epoch || pos + record_len > end {
            break;
        }
        if h.extent.is_some() {
            // An extent of a large value is indexed only by its value's manifest, written
            // in a checkpoint once every extent is durable: one in the tail belongs to a
            // value never published (or published since the checkpoint's write pointer,
            // which covers it). Either way nothing to index: the scan steps over it.
            scan.extents += 1;
            pos += record_len;
            continue;
        }
        let Some(dek) = namespaces
            .get(&h.ns_id)
            .and_then(|ns| ns.opening_key(h.key_id, g.plaintext_at_rest))
        else {
            break;
        };
        let loc = tail_loc(r, pos, record_len, &h);
        // An unreadable body costs that record only: its header (checked, of this epoch)
        // says where the next one begins.
        let Some(buf) =
            read_retrying(dev, record_len as usize, base + pos, &mut scan.media_errors).await
        else {
            tracing::warn!(
                region = r,
                offset = pos,
                "a record of the open region's tail is unreadable; it is skipped"
            );
            pos += record_len;
            continue;
        };
        debug_assert_eq!(
            RecordHeader::decode(&buf).ok().as_ref(),
            Some(&h),
            "a record's header, read again with its body, decodes as its first read did"
        );
        if let crate::Verified::Bad(why) =
            crate::verify_record(buf, dek.as_deref(), h.ns_id, &h.key, &loc)
        {
            // A sound header of this tail with a body that fails its checks: bit rot, or a
            // write torn by the crash (then nothing after it was acknowledged, and what
            // follows is another epoch's or nothing, which ends the scan). Either way it
            // costs that record only: ending the scan here would drop every acknowledged
            // record after it.
            tracing::warn!(
                region = r,
                offset = pos,
                "a record of the open region's tail fails its checks ({why}); it is skipped"
            );
            scan.bad_records += 1;
            pos += record_len;
            continue;
        }
        let bkey = index::block_key(h.ns_id, &h.key);
        wb.put_cf(cf_blocks, &bkey, loc.encode());
        wb.put_cf(cf_br, index::by_region_key(r as u32, pos as u32), &bkey);
        scan.records += 1;
        pos += record_len;
    }
    if pos > m.write_ptr as u64 {
        extend_tail(index, g, regions, r, pos, wb)?;
    }
    Ok(scan)
}

/// The open region with the newest epoch among `within` (a tier's regions), if any: the
/// one whose tail is scanned.
fn newest_open_region(regions: &[RegionMeta], within: std::ops::Range<u32>) -> Option<usize> {
    regions
        .iter()
        .enumerate()
        .filter(|(r, m)| m.state == RegionState::Open && within.contains(&(*r as u32)))
        .max_by_key(|(_, m)| m.open_seq)
        .map(|(r, _)| r)
}

/// The index entry of the tail record at `pos` of region `r`, as its header `h` describes it.
fn tail_loc(r: usize, pos: u64, record_len: u64, h: &RecordHeader) -> BlockLoc {
    BlockLoc {
        region: r as u32,
        offset: pos as u32,
        record_len: record_len as u32,
        len: h.len,
        crc32c: h.crc32c,
        key_id: h.key_id,
        seq: h.seq,
        stored_ms: crate::now_ms(),
        extents: 0,
    }
}

/// Moves region `r`'s write pointer to `pos`, past the re-indexed tail, and writes it with
/// the tail's entries (`wb`), synced.
fn extend_tail(
    index: &Index,
    g: &Geometry,
    regions: &mut [RegionMeta],
    r: usize,
    pos: u64,
    mut wb: rocksdb::WriteBatch,
) -> anyhow::Result<()> {
    // The writer's pair: only the open region has a tail, and it ends in the region.
    debug_assert_eq!(
        regions[r].state,
        RegionState::Open,
        "a tail is the open region's"
    );
    debug_assert!(pos <= g.region_bytes, "a region's tail ends inside it");
    regions[r].write_ptr = pos as u32;
    wb.put_cf(
        index.cf(index::CF_REGIONS),
        (r as u32).to_be_bytes(),
        regions[r].encode(),
    );
    index.write(wb, index::WriteMode::Wal { sync: true })?;
    Ok(())
}

/// What a scan of the open region's tail found.
#[derive(Default)]
pub(super) struct TailScan {
    /// Records re-indexed.
    pub records: u64,
    /// Reads that failed every try.
    pub media_errors: u64,
    /// Records with a sound header whose body failed its checks (skipped).
    pub bad_records: u64,
    /// Extents of large values stepped over (indexed by their manifests, if published).
    pub extents: u64,
}

/// Reads at start-up (the superblock, the open region's tail) are tried this many times
/// before the range counts as unreadable.
pub(super) const TAIL_READ_TRIES: u32 = 3;

/// `len` bytes at `off`, tried [`TAIL_READ_TRIES`] times; `None` (counted in `errors`) if
/// every try failed.
pub(super) async fn read_retrying(
    dev: &dyn Device,
    len: usize,
    off: u64,
    errors: &mut u64,
) -> Option<AlignedBuf> {
    for _ in 0..TAIL_READ_TRIES {
        let (buf, res) = dev.read_at(AlignedBuf::reused(len), off).await;
        if res.is_ok() {
            return Some(buf);
        }
    }
    *errors += 1;
    None
}
