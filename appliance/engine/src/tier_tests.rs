//! Tiers inside a node (issue #36): a node of two tiers formats and restarts on its two
//! devices and refuses them swapped; blocks fill `fast`, and `fast`'s reclaim demotes them
//! into `dense` byte for byte, while readers read them: none missing, none wrong; promotion
//! moves them back (asked, or hinted by a pin, a prefetch hold or a second read), within
//! its budget, while readers read and writers demote.

use super::value_tests::data;
use super::*;
use ctxpod_format::config::{ByteSize, TierConfig};
use std::sync::atomic::AtomicBool;

const MIB: u64 = 1 << 20;

/// A node of `fast` (4 regions of 16 MiB) and `dense` (12), on files in `dir`.
fn tiered(dir: &std::path::Path) -> Config {
    tiered_with(dir, 200 * MIB)
}

/// A node of `fast` (4 regions of 16 MiB) and a `dense` tier of `dense` bytes.
pub(crate) fn tiered_with(dir: &std::path::Path, dense: u64) -> Config {
    tiered_sized(dir, 80 * MIB, dense)
}

/// A node of `fast` and `dense` tiers of `fast` and `dense` bytes (regions of 16 MiB).
pub(crate) fn tiered_sized(dir: &std::path::Path, fast: u64, dense: u64) -> Config {
    let tier = |name: &str, capacity: u64| TierConfig {
        name: name.into(),
        device: None,
        capacity: ByteSize(capacity),
    };
    let mut c = Config {
        data_dir: dir.to_path_buf(),
        dram: ByteSize(4 * MIB),
        region_bytes: Some(ByteSize(16 * MIB)),
        tiers: vec![tier("fast", fast), tier("dense", dense)],
        ..Config::default()
    };
    c.settle_tiers();
    c.validate().expect("a valid tiered configuration");
    c
}

async fn put(e: &Engine, i: u64) {
    e.put(
        "default",
        format!("b{i}").as_bytes(),
        Bytes::from(data(i, MIB as usize)),
        None,
        Durability::Fast,
    )
    .await
    .expect("put");
}

/// Block `i` reads back byte for byte; `Err` says how it did not.
async fn check(e: &Engine, i: u64) -> std::result::Result<(), String> {
    match e.get("default", format!("b{i}").as_bytes()).await {
        Ok(Some((b, _))) if b[..] == data(i, MIB as usize)[..] => Ok(()),
        Ok(Some(_)) => Err(format!("b{i}: wrong bytes")),
        Ok(None) => Err(format!("b{i}: missing")),
        Err(e) => Err(format!("b{i}: {e}")),
    }
}

/// Formats on two device files (one per tier), restarts on them, and refuses to start with
/// the two files swapped, or configured as one device; put back, every block is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tiers_format_restart_and_refuse_a_swap() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = tiered(dir.path());
    let e = Engine::open(cfg.clone(), Arc::new(Metrics::new()))
        .await
        .expect("format on two tiers");
    for i in 0..8 {
        put(&e, i).await;
    }
    e.shutdown().await;
    drop(e);
    let (fast, dense) = (
        dir.path().join("blocks.fast.dev"),
        dir.path().join("blocks.dense.dev"),
    );
    // Each file holds its superblock's MiB and its tier's whole regions.
    assert_eq!(
        std::fs::metadata(&fast).expect("fast").len(),
        (1 + 4 * 16) * MIB
    );
    assert_eq!(
        std::fs::metadata(&dense).expect("dense").len(),
        (1 + 12 * 16) * MIB
    );
    let e = Engine::open(cfg.clone(), Arc::new(Metrics::new()))
        .await
        .expect("restart");
    for i in 0..8 {
        check(&e, i).await.expect("after a restart");
    }
    e.shutdown().await;
    drop(e);
    // Swapped: each file now carries the other tier's superblock.
    let tmp = dir.path().join("swap");
    std::fs::rename(&fast, &tmp).expect("swap");
    std::fs::rename(&dense, &fast).expect("swap");
    std::fs::rename(&tmp, &dense).expect("swap");
    let err = Engine::open(cfg.clone(), Arc::new(Metrics::new()))
        .await
        .err()
        .expect("swapped tiers refused");
    assert!(err.to_string().contains("tier fast"), "{err:#}");
    let one = Config {
        tiers: Vec::new(),
        device: Some(fast.clone()),
        ..cfg.clone()
    };
    let err = Engine::open(one, Arc::new(Metrics::new()))
        .await
        .err()
        .expect("one device refused");
    assert!(err.to_string().contains("tiers are fixed"), "{err:#}");
    std::fs::rename(&fast, &tmp).expect("swap back");
    std::fs::rename(&dense, &fast).expect("swap back");
    std::fs::rename(&tmp, &dense).expect("swap back");
    let e = Engine::open(cfg, Arc::new(Metrics::new()))
        .await
        .expect("restart on the right files");
    for i in 0..8 {
        check(&e, i).await.expect("after the refusals");
    }
    e.shutdown().await;
}

/// Blocks worth more than `fast` holds, with readers reading every block written so far
/// all the while: `fast`'s oldest regions are demoted into `dense`, no read misses or
/// sees wrong bytes, nothing is evicted, and after a restart every block is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_fills_and_demotes_into_dense_under_concurrent_reads() {
    const BLOCKS: u64 = 96;
    let dir = tempfile::tempdir().expect("tempdir");
    // Room in `dense` for the blocks and the dead copies that the readers' hinted
    // promotions leave there (and their demotions again): nothing may be evicted.
    let cfg = tiered_with(dir.path(), 320 * MIB);
    let e = Engine::open(cfg.clone(), Arc::new(Metrics::new()))
        .await
        .expect("open");
    let written = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    let writer = async {
        for i in 0..BLOCKS {
            put(&e, i).await;
            written.store(i + 1, Ordering::SeqCst);
        }
        done.store(true, Ordering::SeqCst);
    };
    let ((), (r1, e1), (r2, e2)) = tokio::join!(
        writer,
        read_all_until(&e, &written, &done, 0),
        read_all_until(&e, &written, &done, 3)
    );
    assert!(
        e1.is_empty() && e2.is_empty(),
        "reads during demotion: {e1:?} {e2:?}"
    );
    assert!(
        r1 + r2 > BLOCKS,
        "the readers read throughout ({r1} + {r2})"
    );
    let demoted = e.metrics().tier.demoted_records.get();
    assert!(
        demoted >= 16,
        "fast's oldest regions were demoted ({demoted} records; {:?})",
        e.stats()
    );
    assert_eq!(e.stats().evicted_blocks, 0, "nothing evicted");
    assert_eq!(e.stats().integrity_errors, 0);
    for i in 0..BLOCKS {
        check(&e, i).await.expect("after the demotions");
    }
    let used =
        |e: &Engine, tier: &str| e.metrics().tier.used_bytes.with_label_values(&[tier]).get();
    assert!(
        used(&e, "dense") > 0 && used(&e, "fast") > 0,
        "both tiers hold records"
    );
    // Per tier in the stats: traffic, moves, and no rating for drives it does not know.
    let t = e.stats().tiers;
    assert_eq!(
        t.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
        ["fast", "dense"]
    );
    let demoted_bytes = e.metrics().tier.demoted_bytes.get();
    assert_eq!(t[0].moved_out_bytes, demoted_bytes);
    assert!(
        t[0].written_bytes >= BLOCKS * MIB,
        "every put went to fast: {t:?}"
    );
    assert!(
        t[1].written_bytes >= demoted_bytes,
        "the demotions went to dense"
    );
    assert!(
        t[1].read_bytes > 0 && t[0].read_bytes > 0,
        "reads from both: {t:?}"
    );
    assert!(t[0].hits > 0 && t[1].hits > 0, "hits on both: {t:?}");
    assert_eq!((t[0].regions_total, t[1].regions_total), (4, 19));
    assert!(t.iter().all(|t| t.rated_written_bytes.is_none()));
    e.shutdown().await;
    drop(e);
    let e = Engine::open(cfg, Arc::new(Metrics::new()))
        .await
        .expect("restart");
    for i in 0..BLOCKS {
        check(&e, i).await.expect("after a restart");
    }
    e.shutdown().await;
}

/// Demotion as heat drops: while four blocks are read after every put, `fast`'s reclaim
/// keeps them in `fast` (moved to its open region, counted as reinserted) and demotes the
/// unread blocks written beside them; once nobody reads them, they are demoted in turn. Every
/// block reads back throughout, and nothing is evicted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_read_since_its_last_move_stays_in_fast() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = Arc::new(Metrics::new());
    // Promotion hints off: the reads of a demoted block would bring it back, and what is
    // under test is that it is not demoted.
    let cfg = Config {
        tier_promote_hints: false,
        ..tiered_with(dir.path(), 480 * MIB)
    };
    let e = Engine::open(cfg, m.clone()).await.expect("open");
    let tier = |i: u64| {
        e.tier_of("default", format!("b{i}").as_bytes())
            .expect("tier")
    };
    // `fast` (4 regions) turned over again and again; b0..b3 read after every put from b8
    // to b119.
    for i in 0..240 {
        put(&e, i).await;
        if (8..120).contains(&i) {
            for j in 0..4 {
                check(&e, j).await.expect("a hot block");
            }
        }
        if i == 119 {
            assert_eq!(
                (0..8).map(tier).collect::<Vec<_>>(),
                [[Some("fast"); 4], [Some("dense"); 4]].concat(),
                "read blocks stay, unread ones beside them are demoted"
            );
            assert!(
                m.reinserted_blocks.get() >= 8,
                "kept at two reclaims at least"
            );
        }
    }
    // Not read since: demoted as `fast` turned over again.
    assert_eq!((0..4).map(tier).collect::<Vec<_>>(), [Some("dense"); 4]);
    assert_eq!(e.stats().evicted_blocks, 0, "nothing evicted");
    for i in 0..240 {
        check(&e, i).await.expect("every block");
    }
    e.shutdown().await;
}

/// Blocks `b0..b80` put; the keys of the first `n` of them demoted to `dense` by then.
async fn demoted(e: &Engine, n: usize) -> Vec<Vec<u8>> {
    for i in 0..80 {
        put(e, i).await;
    }
    let keys: Vec<Vec<u8>> = (0..80)
        .map(|i| format!("b{i}").into_bytes())
        .filter(|k| e.tier_of("default", k).expect("tier") == Some("dense"))
        .take(n)
        .collect();
    assert_eq!(keys.len(), n, "{n} demoted blocks");
    keys
}

/// Readers of every block written so far (until `done`, 120 s at most): the reads and what
/// was wrong with them.
async fn read_all_until(
    e: &Engine,
    written: &AtomicU64,
    done: &AtomicBool,
    seed: u64,
) -> (u64, Vec<String>) {
    let mut reads = 0u64;
    let mut errors = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let mut round = 0u64;
    while !done.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
        let n = written.load(Ordering::SeqCst);
        if n == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            continue;
        }
        round += 1;
        let i = (round * 7 + seed) % n;
        if let Err(why) = check(e, i).await {
            errors.push(why);
        }
        reads += 1;
    }
    (reads, errors)
}

/// Demoted blocks promoted back, chunk by chunk, while readers read every block and a
/// writer puts more (which demotes `fast`'s oldest regions, promoted blocks among them):
/// no read misses or sees wrong bytes, promoted blocks are in `fast`, nothing is evicted,
/// and after a restart every block is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promotion_and_demotion_under_concurrent_reads() {
    const FIRST: u64 = 80;
    const MORE: u64 = 40;
    let dir = tempfile::tempdir().expect("tempdir");
    // Room in `dense` for the blocks and the copies the moves leave behind: nothing is
    // evicted, so every miss would be the moves'.
    // A move budget that the asked promotions do not exhaust on a loaded machine: what is
    // under test is the moves against the readers (the budget has its own test).
    let cfg = Config {
        tier_move_bytes_per_s: ByteSize(1 << 30),
        ..tiered_with(dir.path(), 400 * MIB)
    };
    let e = Engine::open(cfg.clone(), Arc::new(Metrics::new()))
        .await
        .expect("open");
    for i in 0..FIRST {
        put(&e, i).await;
    }
    let key = |i: u64| format!("b{i}").into_bytes();
    let dense: Vec<u64> = (0..FIRST)
        .filter(|&i| e.tier_of("default", &key(i)).expect("tier") == Some("dense"))
        .collect();
    assert!(dense.len() >= 16, "blocks were demoted: {}", dense.len());
    let written = AtomicU64::new(FIRST);
    let done = AtomicBool::new(false);
    let mut promoted = Vec::new();
    let work = async {
        for (n, chunk) in dense.chunks(4).enumerate() {
            let fates = e
                .promote("default", chunk.iter().map(|&i| key(i)).collect())
                .await
                .expect("promote");
            for (&i, f) in chunk.iter().zip(fates) {
                if f == Promotion::Promoted {
                    promoted.push(i);
                }
            }
            // A block between promotions: `fast` fills and demotes meanwhile.
            if (n as u64) < MORE {
                put(&e, FIRST + n as u64).await;
                written.store(FIRST + n as u64 + 1, Ordering::SeqCst);
            }
        }
        done.store(true, Ordering::SeqCst);
    };
    let ((), (r1, e1), (r2, e2)) = tokio::join!(
        work,
        read_all_until(&e, &written, &done, 0),
        read_all_until(&e, &written, &done, 5)
    );
    assert!(
        e1.is_empty() && e2.is_empty(),
        "reads during promotion: {e1:?} {e2:?}"
    );
    assert!(r1 + r2 > 0);
    assert!(
        promoted.len() >= dense.len() / 2,
        "{} of {} demoted blocks promoted",
        promoted.len(),
        dense.len()
    );
    // The readers' second reads promote too (hints).
    assert!(e.metrics().tier.promoted_records.get() >= promoted.len() as u64);
    let last = *promoted.last().expect("some promoted");
    assert_eq!(
        e.tier_of("default", &key(last)).expect("tier"),
        Some("fast")
    );
    assert_eq!(e.stats().evicted_blocks, 0, "nothing evicted");
    assert_eq!(e.stats().integrity_errors, 0);
    let total = written.load(Ordering::SeqCst);
    for i in 0..total {
        check(&e, i).await.expect("after the moves");
    }
    e.shutdown().await;
    drop(e);
    let e = Engine::open(cfg, Arc::new(Metrics::new()))
        .await
        .expect("restart");
    for i in 0..total {
        check(&e, i).await.expect("after a restart");
    }
    assert_eq!(
        e.tier_of("default", &key(last)).expect("tier"),
        Some("fast")
    );
    e.shutdown().await;
}

/// The move budget holds: at 8 MiB a second (a second's worth at once), one promotion of
/// 32 blocks of 1 MiB moves at most 8 MiB and defers the rest; a node of one tier
/// answers every present key `Fast` and an absent one `Absent`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promotion_keeps_its_budget() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = Config {
        tier_move_bytes_per_s: ByteSize(8 * MIB),
        ..tiered(dir.path())
    };
    let e = Engine::open(cfg, Arc::new(Metrics::new()))
        .await
        .expect("open");
    let keys = demoted(&e, 32).await;
    let started = std::time::Instant::now();
    let fates = e.promote("default", keys).await.expect("promote");
    let secs = started.elapsed().as_secs_f64();
    let moved = fates.iter().filter(|f| **f == Promotion::Promoted).count();
    let deferred = fates.iter().filter(|f| **f == Promotion::Deferred).count();
    assert!(
        moved >= 1 && moved + deferred == 32 && deferred > 0,
        "{moved} promoted, {deferred} deferred"
    );
    // A second's worth at once, and what the budget earned while the call ran.
    let bytes = e.metrics().tier.promoted_bytes.get();
    assert!(
        bytes as f64 <= 8.0 * MIB as f64 * (1.0 + secs),
        "{bytes} bytes promoted in {secs} s"
    );
    e.shutdown().await;
    drop(e);
    let one = tempfile::tempdir().expect("tempdir");
    let e = Engine::open(
        Config {
            data_dir: one.path().to_path_buf(),
            capacity: ByteSize(80 * MIB),
            region_bytes: Some(ByteSize(16 * MIB)),
            ..Config::default()
        },
        Arc::new(Metrics::new()),
    )
    .await
    .expect("open one tier");
    put(&e, 1).await;
    let fates = e
        .promote("default", vec![b"b1".to_vec(), b"nope".to_vec()])
        .await
        .expect("promote");
    assert_eq!(fates, vec![Promotion::Fast, Promotion::Absent]);
    let t = e.stats().tiers;
    assert!(
        t.len() == 1 && t[0].name == "device" && t[0].written_bytes >= MIB,
        "{t:?}"
    );
    e.shutdown().await;
}

/// Hints: a pinned block, a block held by a prefetch, and a block read twice from `dense`
/// are each moved to `fast` by the idle writer, without a promote call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pins_prefetch_holds_and_second_reads_promote() {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = Engine::open(tiered(dir.path()), Arc::new(Metrics::new()))
        .await
        .expect("open");
    let dense = demoted(&e, 3).await;
    e.pin("default", vec![dense[0].clone()], Duration::from_secs(60))
        .await
        .expect("pin");
    let (held, present) = e
        .hold("default", vec![Bytes::from(dense[1].clone())])
        .await
        .expect("hold");
    assert_eq!(present, vec![true]);
    for _ in 0..2 {
        e.get("default", &dense[2])
            .await
            .expect("get")
            .expect("present");
    }
    // Bounded: the idle writer moves hints within its budget, well inside 30 s.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let in_fast = |k: &[u8]| e.tier_of("default", k).expect("tier") == Some("fast");
    while !dense.iter().all(|k| in_fast(k)) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let where_: Vec<_> = dense
        .iter()
        .map(|k| e.tier_of("default", k).expect("tier"))
        .collect();
    assert_eq!(where_, vec![Some("fast"); 3], "pinned, held, read twice");
    drop(held);
    for i in 0..80 {
        check(&e, i).await.expect("after the promotions");
    }
    e.shutdown().await;
}

/// Admission: with `fast` full of blocks read often, a pin of a block read once does not
/// demote them to make it room (counted as not admitted; it stays in `dense`), while a pin
/// of a block read more often than they are does; an asked promotion is not judged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hint_does_not_push_hotter_blocks_out_of_fast() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = Arc::new(Metrics::new());
    let e = Engine::open(tiered(dir.path()), m.clone())
        .await
        .expect("open");
    let dense = demoted(&e, 3).await;
    let fast: Vec<u64> = (0..80)
        .filter(|i| {
            e.tier_of("default", format!("b{i}").as_bytes())
                .expect("tier")
                == Some("fast")
        })
        .collect();
    assert!(fast.len() >= 16, "{} blocks in fast", fast.len());
    // Hot: every block in `fast` read ten times; the cold one once, the hottest twelve.
    for _ in 0..10 {
        for &i in &fast {
            check(&e, i).await.expect("hot read");
        }
    }
    let (cold, hottest) = (&dense[0], &dense[1]);
    // Read from `dense` once each (a second read would hint it), then the hottest's heat
    // added as the sketch counts reads.
    e.get("default", cold).await.expect("get").expect("present");
    e.get("default", hottest)
        .await
        .expect("get")
        .expect("present");
    e.heat_up("default", hottest, 11);
    let in_fast = |k: &[u8]| e.tier_of("default", k).expect("tier") == Some("fast");
    let refused = || m.tier.promotions_not_admitted.get();
    let base = refused();
    e.pin("default", vec![cold.clone()], Duration::from_secs(60))
        .await
        .expect("pin");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while refused() == base && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(refused(), base + 1, "the cold block's hint was judged");
    assert!(
        !in_fast(cold),
        "a block read once does not push hot ones out"
    );
    let hot_left = fast
        .iter()
        .filter(|&&i| in_fast(format!("b{i}").as_bytes()))
        .count();
    e.pin("default", vec![hottest.clone()], Duration::from_secs(60))
        .await
        .expect("pin");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !in_fast(hottest) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(in_fast(hottest), "the hottest block is admitted");
    assert!(
        hot_left >= fast.len() - 4,
        "{hot_left} of {} hot blocks kept",
        fast.len()
    );
    // Asked, the cold block moves whatever its heat.
    let asked = e
        .promote("default", vec![cold.clone()])
        .await
        .expect("promote");
    assert_eq!(asked, vec![Promotion::Promoted]);
    for i in 0..80 {
        check(&e, i).await.expect("every block");
    }
    e.shutdown().await;
}

impl Engine {
    /// `n` reads of block `key` counted into the frequency sketch, without reading it (a
    /// read from `dense` would hint it).
    fn heat_up(&self, ns: &str, key: &[u8], n: usize) {
        let bkey = block_key(self.ns(ns).expect("ns").id, key);
        let mut h = self.core.heat.as_ref().expect("two tiers").lock();
        for _ in 0..n {
            h.add(&bkey);
        }
    }
}
