//! Large values (issue #34): stored as extents, visible whole or not at all, read back
//! checked, evicted whole, across restarts and crashes.

use super::*;
use ctxpod_format::config::ByteSize;
use ctxpod_wire::EXTENT_BYTES;
use index::ExtentLoc;
use upload::PartInfo;

fn cfg(dir: &std::path::Path, capacity: u64) -> Config {
    Config {
        data_dir: dir.to_path_buf(),
        capacity: ByteSize(capacity),
        dram: ByteSize(4 << 20),
        region_bytes: Some(ByteSize(16 << 20)),
        ..Config::default()
    }
}

/// Bytes that differ at every offset and with every seed (a misplaced extent shows).
pub(crate) fn data(seed: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Writes the pieces of `v` into `w` (a value's or a part's), as a door would stage them.
async fn write_all(w: &mut impl Pieces, v: &[u8]) -> Result<()> {
    let mut at = 0;
    while w.next_piece_len() > 0 {
        let n = w.next_piece_len();
        w.write_piece(StagedBlock::copy_of(&v[at..at + n])?).await?;
        at += n;
    }
    Ok(())
}

async fn store(e: &Engine, key: &[u8], v: &[u8]) -> Result<PutStatus> {
    store_in(e, "default", key, v).await
}

/// Stores `v` as a large value under `key` in namespace `ns`, durably.
pub(crate) async fn store_in(e: &Engine, ns: &str, key: &[u8], v: &[u8]) -> Result<PutStatus> {
    let mut w = e
        .begin_value(ns, key, v.len() as u64, Durability::Durable)
        .await?;
    write_all(&mut w, v).await?;
    w.finish(Some(crc32c::crc32c(v))).await
}

/// The value's bytes in `range`, read piece by piece (`None`: absent).
async fn read(e: &Engine, key: &[u8], range: Option<(u64, u64)>) -> Result<Option<Vec<u8>>> {
    read_in(e, "default", key, range).await
}

/// [`read`] in namespace `ns`.
pub(crate) async fn read_in(
    e: &Engine,
    ns: &str,
    key: &[u8],
    range: Option<(u64, u64)>,
) -> Result<Option<Vec<u8>>> {
    let Some(mut r) = e.open_value(ns, key, range).await? else {
        return Ok(None);
    };
    let mut out = Vec::new();
    while let Some(p) = r.next_piece().await? {
        assert!(p.len() <= EXTENT_BYTES.max(ctxpod_wire::BLOCK_BYTES_MAX));
        out.extend_from_slice(&p);
    }
    Ok(Some(out))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_value_round_trips_in_extents_and_ranges() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = cfg(dir.path(), 256 << 20);
    let e = Engine::open(c.clone(), Arc::new(Metrics::new()))
        .await
        .expect("open");
    // A Llama-3-8B LMCache chunk (32 MiB + LMCache's 28-byte header), and an odd size.
    let big = data(1, (32 << 20) + 28);
    let odd = data(2, (10 << 20) + 1);
    assert_eq!(
        store(&e, b"big", &big).await.expect("put"),
        PutStatus::Created
    );
    assert_eq!(
        store(&e, b"odd", &odd).await.expect("put"),
        PutStatus::Created
    );
    assert_eq!(
        read(&e, b"big", None).await.expect("get").as_deref(),
        Some(&big[..])
    );
    assert_eq!(
        read(&e, b"odd", None).await.expect("get").as_deref(),
        Some(&odd[..])
    );
    // Ranges: within one extent, across a boundary, the tail, past the end.
    let x = EXTENT_BYTES as u64;
    for (lo, hi) in [
        (5, 17),
        (x - 3, x + 5),
        (3 * x, 8 * x + 28),
        (8 * x + 20, 1 << 40),
    ] {
        let want = &big[lo as usize..(hi as usize).min(big.len())];
        let got = read(&e, b"big", Some((lo, hi))).await.expect("range");
        assert_eq!(got.as_deref(), Some(want), "{lo}..{hi}");
    }
    let meta = e
        .block_meta("default", b"big")
        .await
        .expect("head")
        .expect("present");
    assert_eq!(
        (meta.len as usize, meta.crc32c),
        (big.len(), crc32c::crc32c(&big))
    );
    let s = e.stats();
    assert_eq!(
        (s.block_count, s.live_bytes),
        (2, (big.len() + odd.len()) as u64)
    );
    // A whole-value GET of a large value asks for a streamed read.
    assert!(matches!(
        e.get("default", b"big").await,
        Err(EngineError::TooLarge(_))
    ));
    // Stored again: the same bytes exist (and are not written again), others conflict.
    let written = e.stats().device_written_bytes;
    assert_eq!(
        store(&e, b"big", &big).await.expect("re-put"),
        PutStatus::Exists
    );
    assert_eq!(
        e.stats().device_written_bytes,
        written,
        "an existing value is not rewritten"
    );
    let mut other = big.clone();
    other[(20 << 20) + 7] ^= 1;
    assert!(matches!(
        store(&e, b"big", &other).await,
        Err(EngineError::Conflict)
    ));
    e.shutdown().await;
    drop(e);

    let e = Engine::open(c, Arc::new(Metrics::new()))
        .await
        .expect("reopen");
    assert_eq!(
        read(&e, b"big", None).await.expect("get").as_deref(),
        Some(&big[..])
    );
    assert!(e.delete("default", b"big").await.expect("delete"));
    assert_eq!(read(&e, b"big", None).await.expect("get"), None);
    let s = e.stats();
    assert_eq!((s.block_count, s.live_bytes), (1, odd.len() as u64));
    e.shutdown().await;
}

#[tokio::test]
async fn bad_large_puts_are_refused_and_leave_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = Engine::open(
        Config {
            value_bytes_max: ByteSize(64 << 20),
            ..cfg(dir.path(), 256 << 20)
        },
        Arc::new(Metrics::new()),
    )
    .await
    .expect("open");
    let v = data(3, 20 << 20);
    assert!(matches!(
        e.begin_value("default", b"k", (64 << 20) + 1, Durability::Durable)
            .await,
        Err(EngineError::TooLarge(_))
    ));
    // A wrong checksum from the client.
    let mut w = e
        .begin_value("default", b"k", v.len() as u64, Durability::Durable)
        .await
        .expect("begin");
    write_all(&mut w, &v).await.expect("pieces");
    assert!(matches!(
        w.finish(Some(crc32c::crc32c(&v) ^ 1)).await,
        Err(EngineError::Integrity(_))
    ));
    // A body that ends early, and a piece of the wrong size.
    let mut w = e
        .begin_value("default", b"k", v.len() as u64, Durability::Durable)
        .await
        .expect("begin");
    w.write_piece(StagedBlock::copy_of(&v[..EXTENT_BYTES]).expect("stage"))
        .await
        .expect("piece");
    assert!(matches!(
        w.write_piece(StagedBlock::copy_of(&v[..100]).expect("stage"))
            .await,
        Err(EngineError::Invalid(_))
    ));
    assert!(matches!(w.finish(None).await, Err(EngineError::Invalid(_))));
    // A value abandoned half-way (the client went away).
    let mut w = e
        .begin_value("default", b"k", v.len() as u64, Durability::Durable)
        .await
        .expect("begin");
    w.write_piece(StagedBlock::copy_of(&v[..EXTENT_BYTES]).expect("stage"))
        .await
        .expect("piece");
    drop(w);
    assert_eq!(read(&e, b"k", None).await.expect("get"), None);
    let s = e.stats();
    assert_eq!(
        (s.block_count, s.live_bytes),
        (0, 0),
        "nothing of them is visible"
    );
    // Over a namespace's quota: refused before any byte is written.
    e.create_namespace("small", Some(16 << 20))
        .await
        .expect("ns");
    let written = e.stats().device_written_bytes;
    assert!(matches!(
        e.begin_value("small", b"k", v.len() as u64, Durability::Durable)
            .await,
        Err(EngineError::Quota(_))
    ));
    assert_eq!(e.stats().device_written_bytes, written);
    // And then the value is stored all the same.
    assert_eq!(store(&e, b"k", &v).await.expect("put"), PutStatus::Created);
    assert_eq!(
        read(&e, b"k", None).await.expect("get").as_deref(),
        Some(&v[..])
    );
    e.shutdown().await;
}

/// A process crash (the runtime and the engine dropped without a clean stop: the index
/// loses what it holds without the WAL) in the middle of a large value's writing: after
/// restart the published value and the blocks around the unpublished one's extents are
/// there byte for byte, the unpublished value is not (recovery steps over its extents in
/// the open region's tail to find the blocks written after them).
#[test]
fn a_crash_leaves_a_large_value_whole_or_absent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = cfg(dir.path(), 256 << 20);
    let (a, v1, v2, b) = (
        data(4, 70_000),
        data(5, 13 << 20),
        data(6, 20 << 20),
        data(7, 90_000),
    );
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let e = Engine::open(c.clone(), Arc::new(Metrics::new()))
            .await
            .expect("open");
        assert_eq!(store(&e, b"a", &a).await.expect("a"), PutStatus::Created);
        assert_eq!(store(&e, b"v1", &v1).await.expect("v1"), PutStatus::Created);
        let mut w = e
            .begin_value("default", b"v2", v2.len() as u64, Durability::Durable)
            .await
            .expect("begin");
        for i in 0..3 {
            let piece = &v2[i * EXTENT_BYTES..(i + 1) * EXTENT_BYTES];
            w.write_piece(StagedBlock::copy_of(piece).expect("stage"))
                .await
                .expect("piece");
        }
        assert_eq!(store(&e, b"b", &b).await.expect("b"), PutStatus::Created);
        // The crash: nothing more of v2, no clean stop (the runtime goes with the writer
        // task; RocksDB closes without flushing what it holds without the WAL).
        drop(w);
        drop(e);
    });
    drop(rt);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let e = Engine::open(c.clone(), Arc::new(Metrics::new()))
            .await
            .expect("reopen");
        assert_eq!(
            read(&e, b"a", None).await.expect("a").as_deref(),
            Some(&a[..])
        );
        assert_eq!(
            read(&e, b"v1", None).await.expect("v1").as_deref(),
            Some(&v1[..])
        );
        assert_eq!(
            read(&e, b"b", None).await.expect("b").as_deref(),
            Some(&b[..])
        );
        assert_eq!(read(&e, b"v2", None).await.expect("v2"), None);
        let s = e.stats();
        assert_eq!(
            (s.block_count, s.live_bytes, s.integrity_errors),
            (3, (a.len() + v1.len() + b.len()) as u64, 0)
        );
        // v2 can be stored afresh.
        assert_eq!(store(&e, b"v2", &v2).await.expect("v2"), PutStatus::Created);
        assert_eq!(
            read(&e, b"v2", None).await.expect("v2").as_deref(),
            Some(&v2[..])
        );
        e.shutdown().await;
    });
}

/// Eviction takes a large value whole, whichever of its regions is reclaimed first, and
/// never frees a region under a value that is still indexed; a leased value keeps its
/// regions in place while the device turns over around it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_takes_a_large_value_whole_and_spares_a_leased_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cap = 320 << 20;
    let e = Engine::open(cfg(dir.path(), cap), Arc::new(Metrics::new()))
        .await
        .expect("open");
    // 40 MiB: ten extents over four 16 MiB regions.
    let (v, p) = (data(8, 40 << 20), data(9, 40 << 20));
    store(&e, b"v", &v).await.expect("v");
    store(&e, b"p", &p).await.expect("p");
    e.pin_each("default", vec![b"p".to_vec()], Duration::from_secs(600))
        .await
        .expect("pin");
    let churn = Bytes::from(data(10, 1 << 20));
    let mut i = 0u64;
    let mut v_gone_at = None;
    while i < 3 * (cap >> 20) {
        e.put(
            "default",
            format!("c{i}").as_bytes(),
            churn.clone(),
            None,
            Durability::Fast,
        )
        .await
        .expect("churn");
        i += 1;
        // Every time: the value is whole or absent, never anything else.
        if i.is_multiple_of(16) {
            match read(&e, b"v", None).await {
                Ok(Some(got)) => assert!(got == v, "a wrong byte of v after {i} MiB"),
                Ok(None) | Err(EngineError::NotFound(_)) => {
                    v_gone_at.get_or_insert(i);
                }
                Err(err) => panic!("reading v after {i} MiB: {err}"),
            }
        }
    }
    assert!(v_gone_at.is_some(), "the unleased value was evicted");
    assert_eq!(read(&e, b"v", None).await.expect("v"), None);
    assert!(!e.on_flash("default", b"v").expect("index"));
    assert_eq!(
        read(&e, b"p", None).await.expect("p").as_deref(),
        Some(&p[..]),
        "leased"
    );
    let s = e.stats();
    assert!(s.evicted_regions > 20, "the device turned over: {s:?}");
    assert_eq!(s.integrity_errors, 0);
    e.unpin("default", vec![b"p".to_vec()])
        .await
        .expect("unpin");
    for j in 0..2 * (cap >> 20) {
        e.put(
            "default",
            format!("d{j}").as_bytes(),
            churn.clone(),
            None,
            Durability::Fast,
        )
        .await
        .expect("churn");
    }
    assert_eq!(
        read(&e, b"p", None).await.expect("p"),
        None,
        "evicted once unleased"
    );
    // What the node counts is what the index holds.
    let listed: u64 = e
        .list_blocks("default", &[], None, 100_000)
        .expect("list")
        .iter()
        .map(|(_, m)| m.len as u64)
        .sum();
    assert_eq!(e.stats().live_bytes, listed);
    e.shutdown().await;
}

/// Flips `bits` of the byte `at` bytes into extent `x`'s body, on the device itself.
async fn rot(e: &Engine, x: ExtentLoc, at: u64, bits: u8) {
    let body = record::body_offset(x.len as usize) as u64;
    flip_on_device(e, e.core.dev_offset(x.region, x.offset) + body + at, bits).await;
}

/// Flips `bits` of the device's byte `at`, on the device itself.
pub(crate) async fn flip_on_device(e: &Engine, at: u64, bits: u8) {
    let (mut buf, r) = e
        .core
        .device
        .read_at(AlignedBuf::reused(4096), at & !4095)
        .await;
    r.expect("read");
    buf[(at & 4095) as usize] ^= bits;
    let (_, r) = e.core.device.write_at(buf, at & !4095).await;
    r.expect("write");
    e.core.device.flush().await.expect("flush");
}

/// A bit flipped in any extent of a large value: the read that reaches it fails with an
/// integrity error, the whole value is quarantined (gone from every view), scrub finds it
/// too, and a fresh copy can be stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotten_extent_quarantines_the_whole_value() {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = Engine::open(cfg(dir.path(), 256 << 20), Arc::new(Metrics::new()))
        .await
        .expect("open");
    let v = data(11, 24 << 20);
    store(&e, b"v", &v).await.expect("v");
    assert_eq!(
        e.scrub_block("default", b"v").await.expect("scrub"),
        read::Scrubbed::Good {
            record_bytes: e
                .core
                .index
                .get_block(&block_key(e.ns("default").expect("ns").id, b"v"))
                .expect("idx")
                .expect("v")
                .record_len as u64
        }
    );
    let bkey = block_key(e.ns("default").expect("ns").id, b"v");
    let m = e
        .core
        .index
        .get_manifest(&bkey)
        .expect("index")
        .expect("manifest");
    assert_eq!(m.extents.len(), 6);
    // Flip a bit in the body of extent 4.
    rot(&e, m.extents[4], 12_345, 0x10).await;
    // A range within the good extents still reads.
    let lo = EXTENT_BYTES as u64;
    assert_eq!(
        read(&e, b"v", Some((lo, 2 * lo)))
            .await
            .expect("range")
            .as_deref(),
        Some(&v[lo as usize..2 * lo as usize])
    );
    assert!(matches!(
        read(&e, b"v", None).await,
        Err(EngineError::Integrity(_))
    ));
    assert!(!e.on_flash("default", b"v").expect("index"), "quarantined");
    assert_eq!(read(&e, b"v", None).await.expect("v"), None);
    assert_eq!(e.stats().integrity_errors, 1);
    assert_eq!(e.stats().block_count, 0);
    assert_eq!(
        store(&e, b"v", &v).await.expect("v again"),
        PutStatus::Created
    );
    assert_eq!(
        read(&e, b"v", None).await.expect("v").as_deref(),
        Some(&v[..])
    );
    e.shutdown().await;
}

/// Writes part `number` of upload `id` from `v`, as a door would.
async fn put_part(e: &Engine, key: &[u8], id: u64, number: u32, v: &[u8]) -> Result<PartInfo> {
    put_part_in(e, "default", key, (id, number), v).await
}

async fn put_part_in(
    e: &Engine,
    ns: &str,
    key: &[u8],
    (id, number): (u64, u32),
    v: &[u8],
) -> Result<PartInfo> {
    let mut w = e.upload_part(ns, key, id, (number, v.len() as u64)).await?;
    write_all(&mut w, v).await?;
    w.finish(Some(crc32c::crc32c(v))).await
}

/// A multipart upload: parts of any size, written out of order and at once, one written
/// again; completed, the value is the chosen parts in order, byte for byte, across a
/// restart, with ranges across part boundaries; bad completions leave the upload to be
/// completed right; an aborted upload leaves nothing; a small one reads like a block.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multipart_uploads_assemble_their_parts_without_copying() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = cfg(dir.path(), 256 << 20);
    let e = Engine::open(c.clone(), Arc::new(Metrics::new()))
        .await
        .expect("open");
    let parts = [data(20, 8 << 20), data(21, (5 << 20) + 3), data(22, 1)];
    let id = e.create_upload("default", b"mp").await.expect("create");
    let (p3, p1) = futures::join!(
        put_part(&e, b"mp", id, 3, &parts[2]),
        put_part(&e, b"mp", id, 1, &parts[0])
    );
    p3.expect("part 3");
    p1.expect("part 1");
    put_part(&e, b"mp", id, 2, &data(99, 6 << 20))
        .await
        .expect("part 2, first try");
    put_part(&e, b"mp", id, 2, &parts[1])
        .await
        .expect("part 2 again");
    assert_eq!(e.metrics().uploads.get(), 1);
    let listed = e.list_parts("default", b"mp", id).expect("list parts");
    assert_eq!(
        listed.iter().map(|p| (p.number, p.len)).collect::<Vec<_>>(),
        vec![(1, 8 << 20), (2, (5 << 20) + 3), (3, 1)]
    );
    assert_eq!(e.list_uploads("default", b"m").expect("uploads")[0].id, id);
    for bad in [&[2, 1, 3][..], &[1, 4], &[]] {
        assert!(
            matches!(
                e.complete_upload("default", b"mp", id, bad).await,
                Err(EngineError::Invalid(_))
            ),
            "{bad:?}"
        );
    }
    let written = e.stats().device_written_bytes;
    assert_eq!(
        e.complete_upload("default", b"mp", id, &[1, 2, 3])
            .await
            .expect("complete"),
        PutStatus::Created
    );
    assert_eq!(
        e.stats().device_written_bytes,
        written,
        "completing copies no byte"
    );
    assert!(e.list_uploads("default", b"").expect("uploads").is_empty());
    assert_eq!(
        e.metrics().uploads.get(),
        0,
        "the gauge follows the uploads"
    );
    let whole: Vec<u8> = parts.concat();
    let meta = e
        .block_meta("default", b"mp")
        .await
        .expect("head")
        .expect("there");
    assert_eq!(meta.crc32c, crc32c::crc32c(&whole));
    for (lo, hi) in [
        (0, 1 << 40),
        ((8 << 20) - 2, (8 << 20) + 2),
        ((13 << 20) + 1, 1 << 40),
    ] {
        let want = &whole[lo as usize..(hi as usize).min(whole.len())];
        let got = read(&e, b"mp", Some((lo, hi))).await.expect("range");
        assert_eq!(got.as_deref(), Some(want), "{lo}..{hi}");
    }
    e.shutdown().await;
    drop(e);
    let e = Engine::open(c, Arc::new(Metrics::new()))
        .await
        .expect("reopen");
    assert_eq!(
        read(&e, b"mp", None).await.expect("mp").as_deref(),
        Some(&whole[..])
    );
    let s = e.stats();
    assert_eq!((s.block_count, s.live_bytes), (1, whole.len() as u64));
    e.shutdown().await;
}

/// An aborted upload leaves nothing and cannot be completed; a finished or unknown one
/// takes no part; one small part makes a value a whole-value GET reads like a block.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborted_unknown_and_small_uploads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = Engine::open(cfg(dir.path(), 256 << 20), Arc::new(Metrics::new()))
        .await
        .expect("open");
    let parts = [data(20, 8 << 20), data(21, (5 << 20) + 3)];
    let id = e.create_upload("default", b"mp").await.expect("create");
    put_part(&e, b"mp", id, 1, &parts[0]).await.expect("part");
    e.complete_upload("default", b"mp", id, &[1])
        .await
        .expect("complete");
    // Aborted: nothing; unknown upload: not found.
    let id2 = e.create_upload("default", b"gone").await.expect("create");
    put_part(&e, b"gone", id2, 1, &parts[0])
        .await
        .expect("part");
    assert!(e.abort_upload("default", b"gone", id2).expect("abort"));
    assert!(matches!(
        e.complete_upload("default", b"gone", id2, &[1]).await,
        Err(EngineError::NotFound(_))
    ));
    assert!(matches!(
        put_part(&e, b"mp", id, 1, &parts[0]).await,
        Err(EngineError::NotFound(_))
    ));
    // One small part: a value of one record's size that a whole-value GET reads.
    let id3 = e.create_upload("default", b"small").await.expect("create");
    put_part(&e, b"small", id3, 1, &parts[1][..100_000])
        .await
        .expect("part");
    e.complete_upload("default", b"small", id3, &[1])
        .await
        .expect("complete");
    let got = e.get("default", b"small").await.expect("get").map(|b| b.0);
    assert_eq!(got.as_deref(), Some(&parts[1][..100_000]));
    assert_eq!(e.stats().block_count, 2);
    e.shutdown().await;
}

/// The parts of a namespace's uploads count against its quota from when they are written
/// (they take device space before any completion): a part that would take the namespace's
/// written and pending bytes over its quota is refused before a byte of it is written, and
/// an aborted upload gives its parts' bytes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_parts_count_against_the_quota_as_they_are_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = Engine::open(cfg(dir.path(), 256 << 20), Arc::new(Metrics::new()))
        .await
        .expect("open");
    e.create_namespace("q", Some(24 << 20))
        .await
        .expect("namespace");
    let part = data(30, 10 << 20);
    let a = e.create_upload("q", b"a").await.expect("create a");
    let b = e.create_upload("q", b"b").await.expect("create b");
    put_part_in(&e, "q", b"a", (a, 1), &part)
        .await
        .expect("a, part 1");
    put_part_in(&e, "q", b"b", (b, 1), &part)
        .await
        .expect("b, part 1");
    let over = put_part_in(&e, "q", b"a", (a, 2), &part).await;
    assert!(matches!(over, Err(EngineError::Quota(_))), "{over:?}");
    assert!(e.abort_upload("q", b"b", b).expect("abort b"));
    put_part_in(&e, "q", b"a", (a, 2), &part)
        .await
        .expect("a, part 2 after b's abort");
    // Completed, the value's bytes are the namespace's: nothing counted twice.
    let st = e
        .complete_upload("q", b"a", a, &[1, 2])
        .await
        .expect("complete");
    assert_eq!(st, PutStatus::Created);
    let info = e.namespace("q").expect("info");
    assert_eq!(info.used_bytes, 20 << 20);
    let over = e.create_upload("q", b"c").await.expect("create c");
    let r = put_part_in(&e, "q", b"c", (over, 1), &part).await;
    assert!(matches!(r, Err(EngineError::Quota(_))), "{r:?}");
    e.shutdown().await;
}

/// A large value read again is served from the DRAM tier, extent by extent (counted as a
/// DRAM hit); scrub still reads flash (and finds a rotten extent the tier's copy hides),
/// and a value stored again under the key never meets the old one's cached extents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_large_value_is_served_from_the_dram_tier_and_scrub_reads_flash() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = Config {
        dram: ByteSize(64 << 20),
        ..cfg(dir.path(), 256 << 20)
    };
    let e = Engine::open(c, Arc::new(Metrics::new()))
        .await
        .expect("open");
    let v = data(21, 24 << 20);
    store(&e, b"v", &v).await.expect("v");
    let read_twice = async |want: &[u8]| {
        let before = e.stats().dram_hits;
        for n in 0..2 {
            let got = read(&e, b"v", None).await.expect("get");
            assert_eq!(got.as_deref(), Some(want), "read {n}");
        }
        e.stats().dram_hits - before
    };
    assert_eq!(read_twice(&v).await, 1, "the second read from DRAM");
    // Rot on flash under the cached extents: reads still get the bytes checked when they
    // were cached; scrub reads the record and quarantines the value.
    let bkey = block_key(e.ns("default").expect("ns").id, b"v");
    let m = e.core.index.get_manifest(&bkey).expect("index").expect("m");
    rot(&e, m.extents[4], 999, 0x01).await;
    assert_eq!(
        read(&e, b"v", None).await.expect("get").as_deref(),
        Some(&v[..])
    );
    assert!(matches!(
        e.scrub_block("default", b"v").await.expect("scrub"),
        read::Scrubbed::Bad { .. }
    ));
    assert_eq!(
        read(&e, b"v", None).await.expect("gone"),
        None,
        "quarantined"
    );
    // Stored again with other bytes: the new generation's extents, never the old ones.
    let w = data(22, 24 << 20);
    store(&e, b"v", &w).await.expect("w");
    assert_eq!(read_twice(&w).await, 1);
    e.shutdown().await;
}

/// A range read takes from flash only the extents that hold the range, never the whole
/// value, and of an extent (4 MiB, a segmented record) only the 64 KiB segments that hold
/// its part of the range, with the record's first 4 KiB (header and segment table); an
/// extent all of whose segments are needed is read whole (issue #35: a Range GET reads
/// what it returns, to the segment, the unit of integrity: one AES-GCM tag and CRC32C).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_reads_only_the_segments_of_the_extents_that_hold_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let metrics = Arc::new(Metrics::new());
    let e = Engine::open(cfg(dir.path(), 256 << 20), metrics.clone())
        .await
        .expect("open");
    let big = data(3, (32 << 20) + 28);
    assert_eq!(
        store(&e, b"big", &big).await.expect("put"),
        PutStatus::Created
    );
    let x = EXTENT_BYTES as u64;
    let s = record::SEGMENT_BYTES as u64;
    let record = |len: u64| ctxpod_format::record::record_bytes(len as usize) as u64;
    let part = |segments: u64| record::SEGMENTED_HEAD_BYTES as u64 + segments * s;
    // Each range with what it reads of the extents it overlaps, none of them read before.
    for (lo, hi, reads) in [
        (5, 17, vec![part(1)]),
        (2 * x - 3, 2 * x + 5, vec![part(1), part(1)]),
        (3 * x + 100, 3 * x + 3 * s, vec![part(3)]),
        (5 * x + 1, 7 * x - 1, vec![record(x), record(x)]),
        (8 * x + 20, 8 * x + 28, vec![record(28)]),
    ] {
        let before = metrics.device_read_bytes.get();
        let got = read(&e, b"big", Some((lo, hi))).await.expect("range");
        assert_eq!(
            got.as_deref(),
            Some(&big[lo as usize..hi as usize]),
            "{lo}..{hi}"
        );
        let from_flash = metrics.device_read_bytes.get() - before;
        assert_eq!(
            from_flash,
            reads.iter().sum::<u64>(),
            "{lo}..{hi}: bytes read from flash"
        );
    }
    e.shutdown().await;
}
