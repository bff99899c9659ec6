//! Large values between tiers (issue #36): a value's extents are promoted into `fast`
//! (asked, within the move budget, in as many calls as the budget needs) and demoted into
//! `dense` at `fast`'s reclaim, extent by extent, while readers read them: a reader that
//! opened the value before its extents moved reads them at their new places (never a
//! miss, never a quarantine), and every value reads back byte for byte after a restart; a
//! pin hints a value's promotion as it does a block's.

use super::tier_tests::{tiered_sized, tiered_with};
use super::value_tests::{data, read_in, store_in};
use super::*;
use ctxpod_format::config::ByteSize;
use std::sync::atomic::AtomicBool;

const MIB: u64 = 1 << 20;
/// A fused expert shard's size: five whole extents and a short sixth.
const VALUE_BYTES: usize = 20 * MIB as usize + 4321;
/// Blocks of 1 MiB that turn a `fast` tier of 8 regions over.
const BLOCKS: u64 = 160;

fn vkey(i: u64) -> Vec<u8> {
    format!("experts/{i}").into_bytes()
}

async fn put_block(e: &Engine, i: u64) {
    e.put(
        "default",
        format!("b{i}").as_bytes(),
        Bytes::from(data(1000 + i, MIB as usize)),
        None,
        Durability::Fast,
    )
    .await
    .expect("put");
}

/// Value `i` (and, below `blocks`, block `i`) reads back byte for byte; `Err` says how not.
async fn check_value(e: &Engine, i: u64) -> std::result::Result<(), String> {
    match read_in(e, "default", &vkey(i), None).await {
        Ok(Some(v)) if v == data(i, VALUE_BYTES) => Ok(()),
        Ok(Some(_)) => Err(format!("value {i}: wrong bytes")),
        Ok(None) => Err(format!("value {i}: missing")),
        Err(e) => Err(format!("value {i}: {e}")),
    }
}

/// Blocks `b0` to `b{n-1}` read back byte for byte.
async fn check_blocks(e: &Engine, n: u64) {
    for i in 0..n {
        let got = e
            .get("default", format!("b{i}").as_bytes())
            .await
            .expect("get")
            .expect("present");
        assert!(got.0[..] == data(1000 + i, MIB as usize)[..], "block {i}");
    }
}

impl Engine {
    /// The manifest of the large value `key`.
    fn manifest(&self, ns: &str, key: &[u8]) -> index::Manifest {
        let bkey = block_key(self.ns(ns).expect("ns").id, key);
        let m = self.core.index.get_manifest(&bkey).expect("index");
        m.expect("a large value")
    }

    /// The tier of each extent of the large value `key` (`None`: no such value).
    fn extent_tiers(&self, ns: &str, key: &[u8]) -> Option<Vec<usize>> {
        let bkey = block_key(self.ns(ns).expect("ns").id, key);
        let m = self.core.index.get_manifest(&bkey).expect("index")?;
        let g = &self.core.geometry;
        Some(m.extents.iter().map(|x| g.tier_of(x.region)).collect())
    }
}

/// A value stored on a node of two tiers goes to `dense`; promoted, every extent is in
/// `fast`; blocks put until its first extents are demoted again; a reader opened then,
/// before any extent is read, still reads the value whole after `fast` has turned over
/// (its last extents demoted too, the value's head unchanged, their old places written
/// over by blocks): it follows them through the manifest, where judging them by the head
/// alone would have quarantined the value. Nothing is quarantined
/// or evicted, and after a restart the value is whole where it was, until a pin of it has
/// the idle writer promote it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_follows_a_large_value_moved_under_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = Arc::new(Metrics::new());
    // `fast` of 8 regions: after its reserve (4) it has room for the whole value.
    let cfg = Config {
        tier_move_bytes_per_s: ByteSize(1 << 30),
        ..tiered_sized(dir.path(), 144 * MIB, 512 * MIB)
    };
    let e = Engine::open(cfg.clone(), m.clone()).await.expect("open");
    store_in(&e, "default", &vkey(0), &data(0, VALUE_BYTES))
        .await
        .expect("store");
    assert_eq!(e.extent_tiers("default", &vkey(0)), Some(vec![1; 6]));
    let fates = e.promote("default", vec![vkey(0)]).await.expect("promote");
    assert_eq!(fates, vec![Promotion::Promoted]);
    assert_eq!(e.extent_tiers("default", &vkey(0)), Some(vec![0; 6]));
    assert_eq!(m.tier.promoted_records.get(), 6);
    // Asked again: nothing left to move.
    let fates = e.promote("default", vec![vkey(0)]).await.expect("promote");
    assert_eq!(fates, vec![Promotion::Fast]);

    // Blocks put until `fast`'s reclaim has demoted the value's first region (its first
    // extents) but not its second: the value straddles the tiers, its head's place moved.
    let mut i = 0;
    while e.extent_tiers("default", &vkey(0)).expect("a value")[0] == 0 && i < BLOCKS {
        put_block(&e, i).await;
        i += 1;
    }
    let straddling = e.extent_tiers("default", &vkey(0)).expect("a value");
    assert!(
        straddling[0] == 1 && straddling[5] == 0,
        "the value in both tiers: {straddling:?}"
    );
    // Opened now, the reader's manifest has the last extents in `fast`; they are demoted
    // without the head's place changing, and `fast` turns over: every region it had is
    // written again.
    let mut reader = e
        .open_value("default", &vkey(0), None)
        .await
        .expect("open")
        .expect("present");
    for i in i..i + BLOCKS {
        put_block(&e, i).await;
    }
    let blocks = i + BLOCKS;
    assert_eq!(e.extent_tiers("default", &vkey(0)), Some(vec![1; 6]));
    assert!(m.tier.demoted_records.get() >= 6);
    let mut got = Vec::with_capacity(VALUE_BYTES);
    while let Some(p) = reader.next_piece().await.expect("a piece") {
        got.extend_from_slice(&p);
    }
    assert!(got == data(0, VALUE_BYTES), "the value read while it moved");
    assert!(
        m.tier.extent_rereads.get() >= 1,
        "the reader found its extents moved"
    );
    drop(reader);
    let s = e.stats();
    assert_eq!((s.integrity_errors, s.evicted_blocks), (0, 0));
    // Read a second time from `dense`: a hint, which may move what `fast` has room for.
    check_value(&e, 0).await.expect("read again");
    e.shutdown().await;
    let placed = e.extent_tiers("default", &vkey(0));
    drop(e);
    let e = Engine::open(cfg, Arc::new(Metrics::new()))
        .await
        .expect("restart");
    assert_eq!(
        e.extent_tiers("default", &vkey(0)),
        placed,
        "moves are durable"
    );
    check_value(&e, 0).await.expect("after a restart");
    // A pin hints the value's promotion: the idle writer moves its extents (bounded wait).
    e.pin("default", vec![vkey(0)], Duration::from_secs(60))
        .await
        .expect("pin");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while e.extent_tiers("default", &vkey(0)) != Some(vec![0; 6])
        && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        e.extent_tiers("default", &vkey(0)),
        Some(vec![0; 6]),
        "a pinned value is promoted"
    );
    check_value(&e, 0).await.expect("promoted on a pin");
    check_blocks(&e, blocks).await;
    e.shutdown().await;
}

/// Within the move budget (8 MiB a second, a second's worth at once), a value of 20 MiB is
/// promoted in several calls: each moves what the budget holds and answers `Deferred`,
/// and in between the value, in both tiers, reads back whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_value_is_promoted_within_the_move_budget() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = Config {
        tier_move_bytes_per_s: ByteSize(8 * MIB),
        ..tiered_with(dir.path(), 200 * MIB)
    };
    let e = Engine::open(cfg, Arc::new(Metrics::new()))
        .await
        .expect("open");
    store_in(&e, "default", &vkey(0), &data(0, VALUE_BYTES))
        .await
        .expect("store");
    let first = e.promote("default", vec![vkey(0)]).await.expect("promote");
    assert_eq!(first, vec![Promotion::Deferred]);
    let tiers = e.extent_tiers("default", &vkey(0)).expect("a value");
    assert!(
        tiers.contains(&0) && tiers.contains(&1),
        "partly promoted: {tiers:?}"
    );
    check_value(&e, 0).await.expect("a value in both tiers");
    // Bounded: at 8 MiB a second the rest moves within a few seconds.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut calls = 1;
    loop {
        let fate = e.promote("default", vec![vkey(0)]).await.expect("promote")[0];
        calls += 1;
        if fate == Promotion::Promoted || std::time::Instant::now() > deadline {
            break;
        }
        check_value(&e, 0).await.expect("while it is promoted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(e.extent_tiers("default", &vkey(0)), Some(vec![0; 6]));
    assert!(calls >= 3, "{calls} calls");
    check_value(&e, 0).await.expect("promoted");
    e.shutdown().await;
}

/// Three values promoted in turn while a writer churns `fast` with blocks (demoting the
/// values' extents again) and two readers read every value whole: no read misses or sees
/// wrong bytes, nothing is evicted or quarantined, and after a restart every value and
/// block reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_values_move_between_tiers_under_concurrent_reads() {
    const VALUES: u64 = 3;
    const BLOCKS_PER_ROUND: u64 = 24;
    let dir = tempfile::tempdir().expect("tempdir");
    let m = Arc::new(Metrics::new());
    // The moves under test are the promotions asked here and the demotions they cause;
    // the readers' second reads would hint more, beyond what `dense` holds without
    // evicting (hints have their own test above).
    let cfg = Config {
        tier_move_bytes_per_s: ByteSize(1 << 30),
        tier_promote_hints: false,
        ..tiered_with(dir.path(), 600 * MIB)
    };
    let e = Engine::open(cfg.clone(), m.clone()).await.expect("open");
    for i in 0..VALUES {
        store_in(&e, "default", &vkey(i), &data(i, VALUE_BYTES))
            .await
            .expect("store");
    }
    let done = AtomicBool::new(false);
    let blocks = AtomicU64::new(0);
    let work = async {
        for round in 0..2 * VALUES {
            let fates = e
                .promote("default", vec![vkey(round % VALUES)])
                .await
                .expect("promote");
            assert_ne!(fates[0], Promotion::Absent);
            for _ in 0..BLOCKS_PER_ROUND {
                put_block(&e, blocks.fetch_add(1, Ordering::SeqCst)).await;
            }
        }
        done.store(true, Ordering::SeqCst);
    };
    let readers = |seed: u64| {
        let (e, done) = (&e, &done);
        async move {
            let (mut reads, mut errors) = (0u64, Vec::new());
            let deadline = std::time::Instant::now() + Duration::from_secs(180);
            while !done.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
                if let Err(why) = check_value(e, (reads + seed) % VALUES).await {
                    errors.push(why);
                }
                reads += 1;
            }
            (reads, errors)
        }
    };
    let ((), (r1, e1), (r2, e2)) = tokio::join!(work, readers(0), readers(1));
    assert!(
        e1.is_empty() && e2.is_empty(),
        "reads during the moves: {e1:?} {e2:?}"
    );
    assert!(r1 + r2 >= 2, "{r1} + {r2} reads");
    assert!(m.tier.promoted_records.get() >= 6, "extents promoted");
    assert!(m.tier.demoted_records.get() >= 6, "extents demoted");
    let s = e.stats();
    assert_eq!((s.integrity_errors, s.evicted_blocks), (0, 0));
    let total = blocks.load(Ordering::SeqCst);
    e.shutdown().await;
    drop(e);
    let e = Engine::open(cfg, Arc::new(Metrics::new()))
        .await
        .expect("restart");
    for i in 0..VALUES {
        check_value(&e, i).await.expect("after a restart");
    }
    check_blocks(&e, total).await;
    e.shutdown().await;
}

/// Large values of a namespace with `compression = "zstd"` (a model's KV in bf16): promoted,
/// then demoted by `fast`'s reclaim, each whole extent is compressed on its way (the
/// manifest holds the shorter records) and the namespace's info counts them; the values and
/// ranges of them read back byte for byte, before and after a restart (which counts them
/// again from the manifests); a delete takes its value's compressed bytes off the counts,
/// and a bit flipped in a compressed extent's stored bytes fails the read and quarantines
/// the value (its counts gone with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_values_are_compressed_when_demoted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = Arc::new(Metrics::new());
    let cfg = Config {
        tier_move_bytes_per_s: ByteSize(1 << 30),
        tier_promote_hints: false,
        ..tiered_sized(dir.path(), 144 * MIB, 512 * MIB)
    };
    let e = Engine::open(cfg.clone(), m.clone()).await.expect("open");
    // Written before the namespace compresses (so written as they are), compressed when
    // they move down after that.
    e.create_namespace("kv", None).await.expect("namespace");
    for i in 0..2 {
        store_in(&e, "kv", &vkey(i), &kv_value(i))
            .await
            .expect("store");
    }
    zstd_namespace(&e).await;
    assert_eq!(e.namespace("kv").expect("info").compressed_bytes, 0);
    let fates = e
        .promote("kv", vec![vkey(0), vkey(1)])
        .await
        .expect("promote");
    assert_eq!(fates, vec![Promotion::Promoted; 2]);
    let tiers = |i: u64| e.extent_tiers("kv", &vkey(i)).expect("a value");
    let mut b = 0;
    while (tiers(0).contains(&0) || tiers(1).contains(&0)) && b < BLOCKS {
        put_block(&e, b).await;
        b += 1;
    }
    assert_eq!((tiers(0), tiers(1)), (vec![1; 6], vec![1; 6]));
    for i in 0..2 {
        let m = e.manifest("kv", &vkey(i));
        let short = m.extents[..5]
            .iter()
            .all(|x| (x.record_len as usize) < record::unsegmented_record_bytes(x.len as usize));
        assert!(short, "whole extents compressed: {m:?}");
        assert_eq!(
            m.head.record_len,
            m.extents.iter().map(|x| x.record_len).sum::<u32>()
        );
    }
    let info = e.namespace("kv").expect("info");
    assert!(
        info.compressed_bytes >= 10 * 4 * MIB
            && info.compressed_stored_bytes * 8 <= info.compressed_bytes * 7,
        "{info:?}"
    );
    for i in 0..2 {
        check_kv(&e, i).await;
    }
    e.shutdown().await;
    drop(e);
    let e = Engine::open(cfg, Arc::new(Metrics::new()))
        .await
        .expect("restart");
    for i in 0..2 {
        check_kv(&e, i).await;
    }
    let again = e.namespace("kv").expect("info");
    assert_eq!(
        (again.compressed_bytes, again.compressed_stored_bytes),
        (info.compressed_bytes, info.compressed_stored_bytes),
        "counted again from the manifests"
    );
    assert!(e.delete("kv", &vkey(1)).await.expect("delete"));
    let half = e.namespace("kv").expect("info");
    assert!(
        half.compressed_bytes * 2 == info.compressed_bytes,
        "{half:?} after a delete, {info:?} before"
    );
    // A bit of the first extent's stored (compressed) bytes flipped on the device.
    let x = e.manifest("kv", &vkey(0)).extents[0];
    let at = e.core.dev_offset(x.region, x.offset) + record::HEADER_BYTES as u64 + 1000;
    super::value_tests::flip_on_device(&e, at, 0x10).await;
    let got = read_in(&e, "kv", &vkey(0), None).await;
    assert!(
        matches!(got, Err(EngineError::Integrity(_))),
        "a damaged compressed extent: {got:?}"
    );
    assert!(!e.on_flash("kv", &vkey(0)).expect("index"), "quarantined");
    assert_eq!(e.stats().integrity_errors, 1);
    let none = e.namespace("kv").expect("info");
    assert_eq!(
        (none.compressed_bytes, none.compressed_stored_bytes),
        (0, 0)
    );
    e.shutdown().await;
}

/// Large values are written to `dense`: in a namespace with `compression` they are
/// compressed as they are written (not only when they move down): every whole extent of a
/// bf16 value is stored compressed, and the namespace counts it; one of random bytes is
/// stored as it is. Both read back whole and in ranges, before and after a restart (the
/// counts the same); `fast` is not written by the writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_values_are_compressed_as_they_are_written_to_dense() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = tiered_sized(dir.path(), 144 * MIB, 512 * MIB);
    let e = Engine::open(cfg.clone(), Arc::new(Metrics::new()))
        .await
        .expect("open");
    zstd_namespace(&e).await;
    store_in(&e, "kv", &vkey(0), &kv_value(0))
        .await
        .expect("store");
    let noise = data(7, VALUE_BYTES);
    store_in(&e, "kv", &vkey(9), &noise).await.expect("store");
    assert_eq!(e.extent_tiers("kv", &vkey(0)), Some(vec![1; 6]));
    let m = e.manifest("kv", &vkey(0));
    let short = |x: &crate::index::ExtentLoc| {
        (x.record_len as usize) < record::unsegmented_record_bytes(x.len as usize)
    };
    assert!(
        m.extents[..5].iter().all(short),
        "whole extents compressed: {m:?}"
    );
    assert!(
        !e.manifest("kv", &vkey(9)).extents.iter().any(short),
        "noise as it is"
    );
    let info = e.namespace("kv").expect("info");
    assert!(
        info.compressed_bytes >= 5 * 4 * MIB
            && info.compressed_bytes <= VALUE_BYTES as u64
            && info.compressed_stored_bytes * 8 <= info.compressed_bytes * 7,
        "{info:?}"
    );
    assert_eq!(
        e.stats().tiers[0].written_bytes,
        0,
        "fast not written (before reads hint a promotion)"
    );
    check_kv(&e, 0).await;
    assert_eq!(
        read_in(&e, "kv", &vkey(9), None).await.expect("read"),
        Some(noise.clone())
    );
    e.shutdown().await;
    drop(e);
    let e = Engine::open(cfg, Arc::new(Metrics::new()))
        .await
        .expect("restart");
    check_kv(&e, 0).await;
    let again = e.namespace("kv").expect("info");
    assert_eq!(
        (again.compressed_bytes, again.compressed_stored_bytes),
        (info.compressed_bytes, info.compressed_stored_bytes)
    );
    e.shutdown().await;
}

/// Compression at write is best effort: on a node storing plaintext (no sealing job), with
/// every offload AEAD job refused, a large value of a compressing namespace is stored as
/// it is (the refused compression counted as skipped), never refused, and reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_compression_job_stores_the_value_as_it_is() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = Config {
        encrypt_at_rest: false,
        ..tiered_sized(dir.path(), 144 * MIB, 512 * MIB)
    };
    let e = Engine::open(cfg, Arc::new(Metrics::new()))
        .await
        .expect("open");
    zstd_namespace(&e).await;
    e.offload().set_faults(crate::offload::OffloadFaults {
        seed: 36,
        crc_error: 0.0,
        aead_error: 1.0,
    });
    store_in(&e, "kv", &vkey(0), &kv_value(0))
        .await
        .expect("stored, uncompressed");
    e.offload()
        .set_faults(crate::offload::OffloadFaults::default());
    assert_eq!(e.namespace("kv").expect("info").compressed_bytes, 0);
    check_kv(&e, 0).await;
    e.shutdown().await;
}

/// Namespace `kv` compressing with zstd (made, or set so).
async fn zstd_namespace(e: &Engine) {
    let settings = NsSettings {
        compression: Some(Compression::Zstd),
        ..NsSettings::default()
    };
    e.create_namespace_with("kv", settings)
        .await
        .expect("namespace kv with zstd");
}

/// Large value `i` of the compression test: bf16 values of a normal spread, as a KV cache.
fn kv_value(i: u64) -> Vec<u8> {
    let mut v = super::compress_tests::bf16_normal(VALUE_BYTES.div_ceil(2), 40 + i);
    v.truncate(VALUE_BYTES);
    v
}

/// Large value `i` of namespace `kv`, and a range of it across three extents, read back
/// byte for byte.
async fn check_kv(e: &Engine, i: u64) {
    let got = read_in(e, "kv", &vkey(i), None).await.expect("read");
    assert!(got == Some(kv_value(i)), "value {i}");
    let (lo, hi) = (3 * MIB + 17, 9 * MIB + 5);
    let got = read_in(e, "kv", &vkey(i), Some((lo, hi))).await;
    let want = kv_value(i)[lo as usize..hi as usize].to_vec();
    assert!(got.expect("range") == Some(want), "a range of value {i}");
}

/// The judge of a failed extent read (`read::still_indexed`): the extent the manifest holds
/// at the place read is corrupt there; the same extent at the same place with another
/// record length (demoted compressed, then promoted back to the very place it left: an
/// extent keeps its sequence number) is another record, moved, not corrupt, and so is an
/// extent of another place or a manifest of another generation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extent_back_at_its_place_in_another_form_is_judged_moved() {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = Engine::open(tiered_with(dir.path(), 200 * MIB), Arc::new(Metrics::new()))
        .await
        .expect("open");
    store_in(&e, "default", &vkey(0), &data(0, VALUE_BYTES))
        .await
        .expect("store");
    let m = e.manifest("default", &vkey(0));
    let bkey = block_key(e.ns("default").expect("ns").id, &vkey(0));
    let rec = m.extents[1].record_loc(&m.head);
    let judge = |rec: &BlockLoc, head: BlockLoc| {
        read::still_indexed(&e.core, &bkey, rec, head, true).expect("index")
    };
    assert_eq!(judge(&rec, m.head), Some(m.head), "still there: corrupt");
    let shorter = BlockLoc {
        record_len: rec.record_len - 4096,
        ..rec
    };
    assert_eq!(judge(&shorter, m.head), None, "another form there: moved");
    let elsewhere = BlockLoc {
        offset: rec.offset + 4096,
        ..rec
    };
    assert_eq!(judge(&elsewhere, m.head), None, "another place: moved");
    let older = BlockLoc {
        seq: m.head.seq - 1,
        ..m.head
    };
    assert_eq!(judge(&rec, older), None, "another generation: moved");
    e.shutdown().await;
}
