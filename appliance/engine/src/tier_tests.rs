//! Tiers inside a node (issue #36): a node of two tiers formats and restarts on its two
//! devices and refuses them swapped; blocks fill `fast`, and `fast`'s reclaim demotes them
//! into `dense` byte for byte, while readers read them: none missing, none wrong.

use super::value_tests::data;
use super::*;
use ctxpod_format::config::{ByteSize, TierConfig};
use std::sync::atomic::AtomicBool;

const MIB: u64 = 1 << 20;

/// A node of `fast` (4 regions of 16 MiB) and `dense` (12), on files in `dir`.
fn tiered(dir: &std::path::Path) -> Config {
    let tier = |name: &str, capacity: u64| TierConfig {
        name: name.into(),
        device: None,
        capacity: ByteSize(capacity),
    };
    let mut c = Config {
        data_dir: dir.to_path_buf(),
        dram: ByteSize(4 * MIB),
        region_bytes: Some(ByteSize(16 * MIB)),
        tiers: vec![tier("fast", 80 * MIB), tier("dense", 200 * MIB)],
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
    let cfg = tiered(dir.path());
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
    let reader = |seed: u64| {
        let (e, written, done) = (&e, &written, &done);
        async move {
            let mut reads = 0u64;
            let mut errors = Vec::new();
            // Bounded in time: every block written so far, over and over, until the
            // writer ends.
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
    };
    let ((), (r1, e1), (r2, e2)) = tokio::join!(writer, reader(0), reader(3));
    assert!(
        e1.is_empty() && e2.is_empty(),
        "reads during demotion: {e1:?} {e2:?}"
    );
    assert!(
        r1 + r2 > BLOCKS,
        "the readers read throughout ({r1} + {r2})"
    );
    let demoted = e.metrics().tier_demoted_records.get();
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
        |e: &Engine, tier: &str| e.metrics().tier_used_bytes.with_label_values(&[tier]).get();
    assert!(
        used(&e, "dense") > 0 && used(&e, "fast") > 0,
        "both tiers hold records"
    );
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
