//! Segmented records (issue #35): a range of a block reads and checks only the segments that
//! hold it (and the record's first 4 KiB: header and segment table); each segment is bound
//! to its record and its place in it.

use super::*;
use ctxpod_format::config::ByteSize;
use record::{SEGMENTED_HEAD_BYTES, SEGMENT_BYTES};

const S: u64 = SEGMENT_BYTES as u64;

async fn open(dir: &std::path::Path, encrypt: bool) -> (Engine, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::new());
    let cfg = Config {
        data_dir: dir.to_path_buf(),
        capacity: ByteSize(160 << 20),
        dram: ByteSize(4 << 20),
        encrypt_at_rest: encrypt,
        ..Config::default()
    };
    let e = Engine::open(cfg, metrics.clone()).await.expect("open");
    (e, metrics)
}

/// Bytes that differ at every offset and with every seed (a misplaced segment shows).
fn data(seed: u64, len: usize) -> Bytes {
    crate::value_tests::data(seed, len).into()
}

/// Bytes `lo..hi` of block `key` through the GET path (`find`, `read_found_range`).
async fn range(e: &Engine, key: &[u8], lo: u64, hi: u64) -> Option<BlockPart> {
    let f = e.find("default", key).expect("find")?;
    e.read_found_range(key, f, Some((lo, hi)))
        .await
        .expect("read")
}

fn loc(e: &Engine, key: &[u8]) -> Option<BlockLoc> {
    let bkey = block_key(e.ns("default").expect("ns").id, key);
    e.core.index.get_block(&bkey).expect("index")
}

/// The device bytes a part read of segments `segs` of a `len`-byte block takes: the
/// record's first 4 KiB and those segments, the last rounded up to 4 KiB.
fn part_bytes(len: u64, segs: std::ops::Range<u64>) -> u64 {
    let body = (segs.end * S).min(len) - segs.start * S;
    SEGMENTED_HEAD_BYTES as u64 + body.next_multiple_of(4096)
}

/// Blocks of the sizes engines send (a vLLM block of 16 tokens of Llama-3-8B, all layers,
/// is 2 MiB; the largest block is 8 MiB; 1 MiB + 100 ends in a short segment), on nodes
/// that seal and that do not: every range returns its bytes and reads from flash only the
/// segments that hold it; a range that needs every segment, or the whole block, reads the
/// record whole; a range leaves the DRAM tier as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_of_a_block_reads_only_the_segments_that_hold_it() {
    for encrypt in [true, false] {
        let dir = tempfile::tempdir().expect("tempdir");
        let (e, metrics) = open(dir.path(), encrypt).await;
        for (seed, len) in [
            (1, 2u64 << 20),
            (2, ctxpod_wire::BLOCK_BYTES_MAX as u64),
            (3, (1 << 20) + 100),
        ] {
            let key = format!("b{seed}");
            let v = data(seed, len as usize);
            let put = e.put(
                "default",
                key.as_bytes(),
                v.clone(),
                None,
                Durability::Durable,
            );
            assert_eq!(put.await.expect("put"), PutStatus::Created);
            let record = record::record_bytes(len as usize) as u64;
            assert_eq!(
                loc(&e, key.as_bytes()).expect("stored").record_len as u64,
                record
            );
            let n = len.div_ceil(S);
            for (lo, hi, read) in [
                (5, 17, part_bytes(len, 0..1)),
                (S - 3, S + 5, part_bytes(len, 0..2)),
                (3 * S + 1, 7 * S - 1, part_bytes(len, 3..7)),
                (len - 28, len, part_bytes(len, n - 1..n)),
                (len - 28, len + 1_000, part_bytes(len, n - 1..n)),
                (1, len - 1, record),
                (0, len, record),
            ] {
                let before = metrics.device_read_bytes.get();
                let got = range(&e, key.as_bytes(), lo, hi).await.expect("present");
                let hi = hi.min(len);
                assert_eq!(
                    got.bytes,
                    v.slice(lo as usize..hi as usize),
                    "{len}: {lo}..{hi}"
                );
                assert_eq!((got.len, got.crc32c), (len, crc32c::crc32c(&v)));
                let from_flash = metrics.device_read_bytes.get() - before;
                assert_eq!(
                    from_flash, read,
                    "{len} encrypt {encrypt}: {lo}..{hi} from flash"
                );
                // The whole reads put a block that fits in the DRAM tier there: out again.
                let bkey = block_key(e.ns("default").expect("ns").id, key.as_bytes());
                e.core.dram_forget([&bkey[..]], &[]);
            }
            // Through the value reader (what the CXP1 `GetValue` and a value's HTTP GET use).
            let before = metrics.device_read_bytes.get();
            let mut r = e
                .open_value("default", key.as_bytes(), Some((S + 1, 2 * S + 9)))
                .await
                .expect("open")
                .expect("present");
            assert_eq!(r.len(), len);
            let piece = r.next_piece().await.expect("piece").expect("bytes");
            assert_eq!(piece, v.slice((S + 1) as usize..(2 * S + 9) as usize));
            assert_eq!(r.next_piece().await.expect("end"), None);
            assert_eq!(
                metrics.device_read_bytes.get() - before,
                part_bytes(len, 1..3)
            );
        }
        // Per block: five of the ranges above, and the value reader's.
        assert_eq!(metrics.part_reads.get(), 3 * 6);
        assert_eq!(metrics.integrity_errors.get(), 0);
        e.shutdown().await;
    }
}

/// Reads the record's first 4 KiB, and writes them back after `edit`.
async fn edit_head(e: &Engine, l: &BlockLoc, edit: impl FnOnce(&mut [u8])) {
    let at = e.core.dev_offset(l.region, l.offset);
    let (mut buf, r) = e.core.device.read_at(AlignedBuf::reused(4096), at).await;
    r.expect("read");
    edit(&mut buf);
    let (_, r) = e.core.device.write_at(buf, at).await;
    r.expect("write");
    e.core.device.flush().await.expect("flush");
}

/// Rewrites a record head's table CRC32C (of its first `entries` entries) and its header
/// CRC to match what the head now holds, as someone with the drive could.
fn table_crc_made_right(h: &mut [u8], entries: usize) {
    let t = record::HEADER_BYTES;
    let mut head = RecordHeader::decode(h).expect("header");
    let table = &h[t..t + entries * record::SEGMENT_ENTRY_BYTES];
    head.segmented.as_mut().expect("segmented").table_crc = crc32c::crc32c(table);
    head.encode(h);
}

/// Flips a bit of the byte `at` bytes into the block's body, on the device itself.
async fn rot_body(e: &Engine, l: &BlockLoc, at: u64) {
    let at = e.core.dev_offset(l.region, l.offset) + SEGMENTED_HEAD_BYTES as u64 + at;
    crate::value_tests::flip_on_device(e, at, 0x08).await;
}

/// A bit flipped in one segment, sealed or not: ranges over the other segments still read
/// (they check only what they return); the first range that reaches it finds it, counts an
/// integrity error and quarantines the block (a miss from then on, for every read). A bit
/// flipped in the segment table fails every read, whole or part, by the table's CRC32C.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotten_segment_or_table_is_found_by_the_reads_that_need_it() {
    for encrypt in [true, false] {
        let dir = tempfile::tempdir().expect("tempdir");
        let (e, metrics) = open(dir.path(), encrypt).await;
        let len = 2u64 << 20;
        let v = data(7, len as usize);
        for key in [&b"body"[..], b"table-part", b"table-whole"] {
            let put = e.put("default", key, v.clone(), None, Durability::Durable);
            assert_eq!(put.await.expect("put"), PutStatus::Created);
        }
        let l = loc(&e, b"body").expect("stored");
        rot_body(&e, &l, 5 * S + 77).await;
        let good = range(&e, b"body", 2 * S, 4 * S + 1)
            .await
            .expect("good segments");
        assert_eq!(good.bytes, v.slice(2 * S as usize..(4 * S + 1) as usize));
        assert_eq!(metrics.integrity_errors.get(), 0);
        assert_eq!(range(&e, b"body", 5 * S + 70, 5 * S + 80).await, None);
        assert_eq!(metrics.integrity_errors.get(), 1, "encrypt {encrypt}");
        assert_eq!(loc(&e, b"body"), None, "quarantined");
        assert_eq!(range(&e, b"body", 0, 10).await, None);
        assert_eq!(e.get("default", b"body").await.expect("get"), None);

        // A CRC32C in the table (segment 3's), then a whole read and a part read elsewhere.
        for (key, lo, hi) in [
            (&b"table-part"[..], 9 * S, 9 * S + 1),
            (b"table-whole", 0, len),
        ] {
            let l = loc(&e, key).expect("stored");
            edit_head(&e, &l, |h| h[record::HEADER_BYTES + 3 * 20 + 17] ^= 1).await;
            let errors = metrics.integrity_errors.get();
            assert_eq!(range(&e, key, lo, hi).await, None, "{lo}..{hi}");
            assert_eq!(metrics.integrity_errors.get(), errors + 1);
            assert_eq!(loc(&e, key), None, "quarantined");
        }
        e.shutdown().await;
    }
}

/// Segments cannot be moved: two segments swapped with their table entries (the table's
/// CRC32C made right again, as someone with the drive could) fail their tags, in a part
/// read and in a whole one; so does a segment moved into another record at the same
/// place. A record takes one sequence number (nonce) per segment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_segments_are_bound_to_their_record_and_place() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (e, metrics) = open(dir.path(), true).await;
    let len = 1u64 << 20;
    let (a, b) = (data(1, len as usize), data(2, len as usize));
    for (key, v) in [(&b"a"[..], &a), (b"b", &b), (b"c", &a)] {
        let put = e.put("default", key, v.clone(), None, Durability::Durable);
        assert_eq!(put.await.expect("put"), PutStatus::Created);
    }
    let (la, lb) = (loc(&e, b"a").expect("a"), loc(&e, b"b").expect("b"));
    assert!(lb.seq >= la.seq + len / S, "{} then {}", la.seq, lb.seq);

    let dev = &e.core.device;
    let seg_at = |l: &BlockLoc, i: u64| {
        e.core.dev_offset(l.region, l.offset) + SEGMENTED_HEAD_BYTES as u64 + i * S
    };
    let read_seg = |at: u64| async move {
        let (buf, r) = dev.read_at(AlignedBuf::reused(S as usize), at).await;
        r.expect("read");
        buf
    };
    // Swap segments 1 and 2 of `a`, and their table entries.
    let (s1, s2) = (
        read_seg(seg_at(&la, 1)).await,
        read_seg(seg_at(&la, 2)).await,
    );
    for (buf, at) in [(s2, seg_at(&la, 1)), (s1, seg_at(&la, 2))] {
        dev.write_at(buf, at).await.1.expect("write");
    }
    edit_head(&e, &la, |h| {
        let t = record::HEADER_BYTES;
        let (e1, e2) = (t + 20, t + 40);
        let saved: Vec<u8> = h[e1..e1 + 20].to_vec();
        h.copy_within(e2..e2 + 20, e1);
        h[e2..e2 + 20].copy_from_slice(&saved);
        table_crc_made_right(h, 16);
    })
    .await;
    // Segment 3 of `b` into `c` (same length, same place, another record): with its table
    // entry, the table's CRC32C made right.
    let lc = loc(&e, b"c").expect("c");
    dev.write_at(read_seg(seg_at(&lb, 3)).await, seg_at(&lc, 3))
        .await
        .1
        .expect("write");
    let (hb, r) = dev
        .read_at(
            AlignedBuf::reused(4096),
            e.core.dev_offset(lb.region, lb.offset),
        )
        .await;
    r.expect("read");
    edit_head(&e, &lc, |h| {
        let t = record::HEADER_BYTES;
        h[t + 60..t + 80].copy_from_slice(&hb[t + 60..t + 80]);
        table_crc_made_right(h, 16);
    })
    .await;
    dev.flush().await.expect("flush");

    // Segment 0 of `a` is where it was: it reads.
    assert_eq!(
        range(&e, b"a", 0, 100).await.expect("a").bytes,
        a.slice(..100)
    );
    assert_eq!(metrics.integrity_errors.get(), 0);
    assert_eq!(
        range(&e, b"a", S + 1, S + 2).await,
        None,
        "a moved segment opens"
    );
    assert_eq!(
        range(&e, b"c", 3 * S, 3 * S + 2).await,
        None,
        "another record's segment opens"
    );
    assert_eq!(metrics.integrity_errors.get(), 2);
    assert_eq!((loc(&e, b"a"), loc(&e, b"c")), (None, None));
    // `b` itself is untouched.
    assert_eq!(e.get("default", b"b").await.expect("get").expect("b").0, b);
    e.shutdown().await;
}

/// Bit rot in a segmented record (two segments: 64 KiB and 3000 bytes): every single-bit flip
/// of its header and segment table, of the bytes around its segments' boundary and ends,
/// 20 000 random flips of its body, and 20 000 random multi-bit corruptions anywhere in
/// what it holds, are caught by the whole read's checks; flips in its padding (after the
/// table, after the body) are never served. Nothing is answered with wrong bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bit_rot_in_a_segmented_record_is_always_detected() {
    use rand::{Rng, SeedableRng};
    let dir = tempfile::tempdir().expect("tempdir");
    let (e, _) = open(dir.path(), true).await;
    let len = SEGMENT_BYTES + 3000;
    let d = data(5, len);
    let put = e.put("default", b"rot", d.clone(), None, Durability::Durable);
    assert_eq!(put.await.expect("put"), PutStatus::Created);
    let ns = e.ns("default").expect("ns");
    let (l, stored) = crate::tests::stored_record(&e, &block_key(ns.id, b"rot")).await;
    let dek = ns.dek(l.key_id).expect("dek");
    let stored = stored.to_vec();
    let table_end = record::HEADER_BYTES + 2 * record::SEGMENT_ENTRY_BYTES;
    let body = SEGMENTED_HEAD_BYTES..SEGMENTED_HEAD_BYTES + len;
    let held = |byte: usize| byte < table_end || body.contains(&byte);
    let check = |bytes: &[u8]| -> bool {
        let mut b = AlignedBuf::zeroed(bytes.len());
        b.copy_from_slice(bytes);
        match verify_record(b, Some(&dek), ns.id, b"rot", &l) {
            Verified::Ok(got) => {
                assert_eq!(got, d, "a corrupted record was answered with wrong bytes");
                false
            }
            Verified::Bad(_) => true,
        }
    };
    assert!(!check(&stored), "the intact record verifies");
    let edges = [body.start, body.start + SEGMENT_BYTES, body.end];
    let bytes = (0..SEGMENTED_HEAD_BYTES + 64)
        .chain(edges.iter().flat_map(|&x| x - 64..x + 64))
        .chain(stored.len() - 64..stored.len());
    let mut rng = rand::rngs::StdRng::seed_from_u64(12);
    let random: Vec<(usize, u32)> = (0..20_000)
        .map(|_| (rng.gen_range(body.clone()), rng.gen_range(0..8)))
        .collect();
    let every_bit = bytes.flat_map(|byte| (0..8).map(move |bit| (byte, bit)));
    for (byte, bit) in every_bit.chain(random) {
        let mut b = stored.clone();
        b[byte] ^= 1 << bit;
        assert_eq!(check(&b), held(byte), "flip of bit {bit} of byte {byte}");
    }
    let held_bits: Vec<usize> = (0..stored.len() * 8).filter(|b| held(b / 8)).collect();
    for i in 0..20_000 {
        let mut b = stored.clone();
        for _ in 0..rng.gen_range(2..=64) {
            let bit = held_bits[rng.gen_range(0..held_bits.len())];
            b[bit / 8] ^= 1 << (bit % 8);
        }
        // Flips can cancel out (the same bit twice): then the record is intact again.
        if b != stored {
            assert!(check(&b), "random corruption {i} not detected");
        }
    }
    e.shutdown().await;
}

/// A record written before segments existed (unsegmented, one tag, at a length where the
/// two layouts take the same room on the device, so the index cannot tell them apart): a
/// range read finds it out from its header and reads it whole; whole reads, ranges through
/// the value reader and scrub read it as always.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_written_before_segments_still_reads_whole_and_in_ranges() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (e, metrics) = open(dir.path(), true).await;
    let len = 1usize << 20;
    assert_eq!(
        record::record_bytes(len),
        record::unsegmented_record_bytes(len)
    );
    let v = data(9, len);
    let put = e.put("default", b"old", v.clone(), None, Durability::Durable);
    assert_eq!(put.await.expect("put"), PutStatus::Created);
    let ns = e.ns("default").expect("ns");
    let l = loc(&e, b"old").expect("stored");
    // The same block, sealed as it was before: one tag over the whole body, right after it.
    let at = e.core.dev_offset(l.region, l.offset);
    let (head, r) = e.core.device.read_at(AlignedBuf::reused(4096), at).await;
    r.expect("read");
    let h = RecordHeader::decode(&head).expect("header");
    let mut rec = AlignedBuf::zeroed(l.record_len as usize);
    rec[record::HEADER_BYTES..record::HEADER_BYTES + len].copy_from_slice(&v);
    let dek = ns.dek(l.key_id).expect("dek");
    let aad = crypto::block_aad(ns.id, l.key_id, b"old");
    let body = &mut rec[record::HEADER_BYTES..record::HEADER_BYTES + len];
    let tag = crypto::seal(&dek, h.nonce, &aad, body);
    rec[record::HEADER_BYTES + len..record::HEADER_BYTES + len + 16].copy_from_slice(&tag);
    RecordHeader {
        segmented: None,
        ..h
    }
    .encode(&mut rec[..record::HEADER_BYTES]);
    e.core.device.write_at(rec, at).await.1.expect("write");
    e.core.device.flush().await.expect("flush");

    let before = metrics.device_read_bytes.get();
    let got = range(&e, b"old", 3 * S + 5, 3 * S + 100)
        .await
        .expect("present");
    assert_eq!(
        got.bytes,
        v.slice((3 * S + 5) as usize..(3 * S + 100) as usize)
    );
    let part = part_bytes(len as u64, 3..4);
    let read = metrics.device_read_bytes.get() - before;
    assert_eq!(
        read,
        part + l.record_len as u64,
        "the part read, then the whole record"
    );
    let bkey = block_key(ns.id, b"old");
    e.core.dram_forget([&bkey[..]], &[]);
    let mut r = e
        .open_value("default", b"old", Some((S - 1, S + 1)))
        .await
        .expect("open")
        .expect("present");
    assert_eq!(
        r.next_piece().await.expect("piece"),
        Some(v.slice((S - 1) as usize..(S + 1) as usize))
    );
    assert_eq!(
        e.get("default", b"old").await.expect("get").expect("old").0,
        v
    );
    assert!(matches!(
        e.scrub_block("default", b"old").await.expect("scrub"),
        read::Scrubbed::Good { .. }
    ));
    assert_eq!(metrics.integrity_errors.get(), 0);
    e.shutdown().await;
}

/// A segmented record's header rewritten to claim another segment size (128 KiB), its
/// table's and header's CRCs recomputed (they are not keyed: anyone with the drive can): the range read
/// that meets it fails its checks, counts an integrity error and quarantines the block; it
/// never plans a read by one size and slices by the other. (Before the header refused any
/// size but 64 KiB, `bytes=0-0` of such an 8 MiB block panicked in the AEAD stage.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_claiming_another_segment_size_fails_its_checks() {
    for encrypt in [true, false] {
        let dir = tempfile::tempdir().expect("tempdir");
        let (e, metrics) = open(dir.path(), encrypt).await;
        let v = data(3, ctxpod_wire::BLOCK_BYTES_MAX);
        let put = e.put("default", b"b", v.clone(), None, Durability::Durable);
        assert_eq!(put.await.expect("put"), PutStatus::Created);
        let l = loc(&e, b"b").expect("stored");
        edit_head(&e, &l, |h| {
            // 64 segments of 128 KiB: the table's first 64 entries, their CRC32C in place.
            h[192..196].copy_from_slice(&(2 * SEGMENT_BYTES as u32).to_le_bytes());
            let t = record::HEADER_BYTES;
            let table_crc = crc32c::crc32c(&h[t..t + 64 * record::SEGMENT_ENTRY_BYTES]);
            h[196..200].copy_from_slice(&table_crc.to_le_bytes());
            let crc = crc32c::crc32c(&h[..252]);
            h[252..256].copy_from_slice(&crc.to_le_bytes());
        })
        .await;
        assert_eq!(range(&e, b"b", 0, 1).await, None, "encrypt {encrypt}");
        assert_eq!(metrics.integrity_errors.get(), 1);
        assert_eq!(loc(&e, b"b"), None, "quarantined");
        e.shutdown().await;
    }
}
