//! A record's checks on the read side (sans-IO): its header against its index entry, its
//! segment table, AES-GCM open (the whole record, or some of its segments), and the
//! plaintext's CRC32C (the whole body's, or each segment's), as the AEAD and CRC32C engines
//! run them.

use super::*;

/// Outcome of reading and checking one record.
pub(crate) enum Verified {
    Ok(Bytes),
    Bad(String),
}

/// Checks a record read from the device against its index entry and opens it. `dek` is
/// `None` on a node that stores records in plaintext.
pub(crate) fn verify_record(
    buf: AlignedBuf,
    dek: Option<&AeadKey>,
    ns_id: u32,
    key: &[u8],
    loc: &BlockLoc,
) -> Verified {
    verify_record_of(buf, dek, (ns_id, key), loc, None)
}

/// [`verify_record`] of a block (`extent` `None`) or of an extent of a large value (`loc`
/// then describes that extent's record).
pub(crate) fn verify_record_of(
    buf: AlignedBuf,
    dek: Option<&AeadKey>,
    (ns_id, key): (u32, &[u8]),
    loc: &BlockLoc,
    extent: Option<record::ExtentOf>,
) -> Verified {
    match open_record_of(buf, dek, (ns_id, key), loc, extent) {
        Ok(plain) => check_plaintext(plain, loc.crc32c),
        Err(why) => Verified::Bad(why),
    }
}

/// The plaintext's CRC32C against the one the index (and header) hold: the CRC engine's
/// half of a read's checks.
pub(crate) fn check_plaintext(plain: Bytes, crc: u32) -> Verified {
    if crc32c::crc32c(&plain) != crc {
        return Verified::Bad("plaintext CRC32C mismatch".into());
    }
    Verified::Ok(plain)
}

/// The associated data a record is sealed under: a block's, or an extent's.
pub(crate) fn record_aad(
    ns_id: u32,
    key_id: u32,
    key: &[u8],
    extent: Option<record::ExtentOf>,
) -> Vec<u8> {
    match extent {
        None => crypto::block_aad(ns_id, key_id, key),
        Some(x) => crypto::extent_aad(ns_id, key_id, key, x.value_seq, x.index),
    }
}

/// A record's header, decoded from its first bytes, against its index entry: the same
/// namespace, key, length, CRC32C, sequence number, data key and place in a value.
pub(crate) fn check_header(
    buf: &[u8],
    (ns_id, key): (u32, &[u8]),
    loc: &BlockLoc,
    extent: Option<record::ExtentOf>,
) -> Result<RecordHeader, String> {
    let h = match RecordHeader::decode(buf) {
        Ok(h) => h,
        Err(e) => return Err(format!("record header: {e}")),
    };
    if h.ns_id != ns_id
        || h.key != key
        || h.len != loc.len
        || h.crc32c != loc.crc32c
        || h.seq != loc.seq
        || h.key_id != loc.key_id
        || h.extent != extent
        || !h.nonce_ok()
        || h.record_bytes() != loc.record_len as usize
    {
        return Err("record header does not match the index".into());
    }
    Ok(h)
}

/// Which key, if any, opens a record of header `h`: with `dek` `None` (a plaintext node)
/// only plaintext records are accepted, and with a key only sealed ones.
pub(crate) fn key_for_record<'a>(
    dek: Option<&'a AeadKey>,
    h: &RecordHeader,
) -> Result<Option<&'a AeadKey>, String> {
    match (dek, h.plaintext) {
        (Some(dek), false) => Ok(Some(dek)),
        (None, true) => Ok(None),
        (Some(_), true) => Err("a plaintext record on an encrypting node".into()),
        (None, false) => Err("a sealed record on a plaintext node".into()),
    }
}

/// Opens, in place, segments `segs` of the segmented record of header `h` and segment table
/// `table`; `body` holds their ciphertext, from the first byte of segment `segs.start`.
pub(crate) fn open_segments(
    h: &RecordHeader,
    table: &[u8],
    (dek, aad): (&AeadKey, &[u8]),
    body: &mut [u8],
    segs: std::ops::Range<usize>,
) -> Result<(), String> {
    let base = h.segment_range(segs.start).start;
    let mut seg_aad = crypto::segment_aad(aad, h.len, 0);
    for i in segs {
        let r = h.segment_range(i);
        let (tag, _) = record::table_entry(table, i);
        crypto::set_segment_index(&mut seg_aad, i as u32);
        crypto::open_separate(
            dek,
            record::segment_nonce(&h.nonce, i),
            &seg_aad,
            &tag,
            &mut body[r.start - base..r.end - base],
        )
        .map_err(|_| format!("AES-GCM authentication of segment {i} failed"))?;
    }
    Ok(())
}

/// The record's header against its index entry, then AES-GCM open: the AEAD engine's half
/// of a read's checks, of a block (`extent` `None`) or of the extent `extent` of a large
/// value (whose `loc` then describes that extent's record). The plaintext still needs
/// [`check_plaintext`]. With `dek` `None` (a node formatted with `encrypt_at_rest = false`)
/// only plaintext records are accepted, and with a key only sealed ones: rewriting the
/// header's flag (its CRC is not keyed) cannot make an encrypting node release a body it
/// did not authenticate.
pub(crate) fn open_record_of(
    mut buf: AlignedBuf,
    dek: Option<&AeadKey>,
    (ns_id, key): (u32, &[u8]),
    loc: &BlockLoc,
    extent: Option<record::ExtentOf>,
) -> Result<Bytes, String> {
    let h = check_header(&buf, (ns_id, key), loc, extent)?;
    let (len, at) = (h.len as usize, h.body_offset());
    let dek = key_for_record(dek, &h)?;
    let (head, body) = buf.split_at_mut(at);
    // A segmented record's table is checked on every read, whole ones too: a range read
    // trusts its CRC32Cs.
    let Some(table) = h.segment_table(head) else {
        return Err("segment table CRC32C mismatch".into());
    };
    if let Some(c) = h.compressed {
        return open_compressed(&h, c, dek, (ns_id, key), body).map(Bytes::from);
    }
    if let Some(dek) = dek {
        let aad = record_aad(ns_id, h.key_id, key, extent);
        if h.segmented.is_some() {
            open_segments(&h, table, (dek, &aad), body, 0..h.segments())?;
        } else {
            match crypto::open(dek, h.nonce, &aad, &mut body[..len + TAG_BYTES]) {
                Ok(n) if n == len => {}
                _ => return Err("AES-GCM authentication failed".into()),
            }
        }
    }
    Ok(Bytes::from_owner(buf).slice(at..at + len))
}

/// A compressed record's body (`body`, from its first byte) opened, checked against its
/// CRC32C and decompressed: the block's plaintext, still to be checked against its CRC32C.
fn open_compressed(
    h: &RecordHeader,
    c: record::Compressed,
    dek: Option<&AeadKey>,
    (ns_id, key): (u32, &[u8]),
    body: &mut [u8],
) -> Result<Vec<u8>, String> {
    let n = c.stored_len as usize;
    if let Some(dek) = dek {
        let at = (ns_id, h.key_id, key);
        let aad = crypto::compressed_aad(at, c.codec, h.seq, (h.len, h.crc32c), h.extent);
        match crypto::open(dek, h.nonce, &aad, &mut body[..n + TAG_BYTES]) {
            Ok(m) if m == n => {}
            _ => return Err("AES-GCM authentication failed".into()),
        }
    }
    compress::open_stored(h, c, &body[..n])
}

/// Part of a segmented record, read and opened: its segments `segs` (`body`, read from the
/// device from segment `segs.start`'s first byte), checked against the record's first
/// [`record::SEGMENTED_HEAD_BYTES`] (`head`: header and segment table) and its index entry.
/// The plaintext of those segments and each one's CRC32C from the table; they still need
/// [`check_segments`]. `Ok(None)`: the record is not segmented (written before segments
/// existed): it must be read whole.
pub(crate) fn open_record_part(
    head: &[u8],
    mut body: AlignedBuf,
    dek: Option<&AeadKey>,
    (ns_id, key): (u32, &[u8]),
    (loc, extent): (&BlockLoc, Option<record::ExtentOf>),
    segs: std::ops::Range<usize>,
) -> Result<Option<(Bytes, Vec<u32>)>, String> {
    let h = check_header(head, (ns_id, key), loc, extent)?;
    if h.segmented.is_none() {
        return Ok(None);
    }
    let dek = key_for_record(dek, &h)?;
    let Some(table) = h.segment_table(head) else {
        return Err("segment table CRC32C mismatch".into());
    };
    if segs.end > h.segments() {
        return Err("a range past the record's segments".into());
    }
    if let Some(dek) = dek {
        let aad = record_aad(ns_id, h.key_id, key, extent);
        open_segments(&h, table, (dek, &aad), &mut body, segs.clone())?;
    }
    let crcs = segs
        .clone()
        .map(|i| record::table_entry(table, i).1)
        .collect();
    let bytes = h.segment_range(segs.end - 1).end - h.segment_range(segs.start).start;
    Ok(Some((Bytes::from_owner(body).slice(..bytes), crcs)))
}

/// The plaintext of consecutive segments of `segment_bytes` each against their CRC32Cs from
/// the record's table: the CRC engine's half of a part read's checks.
pub(crate) fn check_segments(plain: Bytes, crcs: &[u32], segment_bytes: usize) -> Verified {
    for (i, (chunk, &crc)) in plain.chunks(segment_bytes).zip(crcs).enumerate() {
        if crc32c::crc32c(chunk) != crc {
            return Verified::Bad(format!(
                "plaintext CRC32C mismatch in segment {i} of the part read"
            ));
        }
    }
    Verified::Ok(plain)
}
