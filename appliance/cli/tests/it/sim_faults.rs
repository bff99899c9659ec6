//! Device faults other than power loss, on the simulated device (firmware-sim): torn records
//! at every sector, misdirected writes, bit flips and uncorrectable reads, failed writes and
//! flushes, device full; and the daemon serving on a simulated device.

use crate::common;

use common::{content, life, open_on_sim, Node};
use ctxpod_firmware_sim::{Fault, FaultPlan, Media, Profile, SimDevice};
use ctxpod_format::config::Config;
use ctxpod_wire::Durability;
use std::sync::Arc;

const CAPACITY: u64 = 80 << 20;

fn config(dir: &std::path::Path) -> Config {
    common::sim_config(dir, CAPACITY, 1 << 20)
}

/// Puts the block whose contents derive from `key`.
async fn put(
    node: &ctxpod_engine::Engine,
    key: &[u8],
    len: usize,
    d: Durability,
) -> Result<ctxpod_engine::PutStatus, ctxpod_engine::EngineError> {
    node.put("default", key, content(key, len), None, d).await
}

/// Stores the block whose contents derive from `key` durably; it must be acknowledged.
async fn stored(node: &ctxpod_engine::Engine, key: &[u8], len: usize) {
    put(node, key, len, Durability::Durable).await.expect("put");
}

/// A temp dir, a node's configuration in it, and a simulated device without faults.
fn fault_free() -> (tempfile::TempDir, Config, Arc<SimDevice>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path());
    (dir, cfg, device(FaultPlan::none()))
}

fn device(plan: FaultPlan) -> Arc<SimDevice> {
    Arc::new(SimDevice::new(
        Profile::load("tlc-noplp").expect("profile"),
        Media::memory(CAPACITY),
        plan,
        false,
    ))
}

/// Schedules `fault` at the next command the device receives.
fn next_command(dev: &SimDevice, plan: FaultPlan, fault: Fault) {
    let c = dev.stats().commands;
    dev.set_plan(plan.at(c, fault));
}

/// A record of six 4 KiB sectors torn after 0..=6 of them: the block is absent until every
/// sector made it, then whole; never mixed, and nothing else is touched.
#[test]
fn every_tear_point_of_a_record_leaves_it_whole_or_absent() {
    let sectors = 6usize;
    let len = sectors * 4096 - ctxpod_format::record::HEADER_BYTES - 16;
    assert_eq!(ctxpod_format::record::record_bytes(len), sectors * 4096);
    for keep in 0..=sectors {
        let (_dir, cfg, dev) = fault_free();
        let node = life(async {
            let node = open_on_sim(&cfg, &dev).await;
            put(&node, b"base", 5000, Durability::Durable)
                .await
                .expect("put base");
            let plan = FaultPlan {
                torn_keep_sectors: Some(keep as u32),
                ..FaultPlan::none()
            };
            next_command(&dev, plan, Fault::PowerCut);
            let r = put(&node, b"torn", len, Durability::Durable).await;
            assert!(
                r.is_err(),
                "a put whose write lost power is not acknowledged"
            );
            node
        });
        drop(node);
        dev.power_on();
        dev.set_plan(FaultPlan::none());
        life(async {
            let node = open_on_sim(&cfg, &dev).await;
            let base = node.get("default", b"base").await.expect("get base");
            assert_eq!(base.map(|b| b.0), Some(content(b"base", 5000)));
            let torn = node.get("default", b"torn").await.expect("get torn");
            let want = (keep == sectors).then(|| content(b"torn", len));
            assert_eq!(
                torn.map(|b| b.0),
                want,
                "record torn after {keep} of {sectors} sectors"
            );
            node.shutdown().await;
        });
    }
}

/// A write the device reports done but puts at another address: the block answers a miss
/// (its location holds something else, caught by the record's identity checks), and no
/// block, wherever the stray record landed, is served wrong.
#[test]
fn misdirected_writes_are_caught_by_the_record_identity() {
    let mut caught = 0;
    for seed in 0..20u64 {
        let (_dir, cfg, dev) = fault_free();
        let keys: Vec<Vec<u8>> = (0..8).map(|i| format!("k{i}").into_bytes()).collect();
        life(async {
            let node = open_on_sim(&cfg, &dev).await;
            for k in &keys {
                put(&node, k, 40_000, Durability::Durable)
                    .await
                    .expect("put");
            }
            let plan = FaultPlan {
                seed,
                ..FaultPlan::none()
            };
            next_command(&dev, plan, Fault::Misdirect);
            put(&node, b"stray", 40_000, Durability::Durable)
                .await
                .expect("the device said the write succeeded");
            node.shutdown().await;
        });
        dev.set_plan(FaultPlan::none());
        life(async {
            // A fresh node: nothing in the DRAM tier, every read from the device.
            let node = open_on_sim(&cfg, &dev).await;
            for k in keys.iter().chain([&b"stray".to_vec()]) {
                if let Some((b, _)) = node.get("default", k).await.expect("get") {
                    assert_eq!(b, content(k, 40_000), "seed {seed}: wrong bytes served");
                }
            }
            assert_eq!(
                node.get("default", b"stray").await.expect("get"),
                None,
                "seed {seed}: a block whose record went elsewhere is a miss"
            );
            let s = node.stats();
            assert!(s.integrity_errors >= 1, "seed {seed}: detection counted");
            caught += s.integrity_errors;
            node.shutdown().await;
        });
    }
    eprintln!("20 misdirected writes: 0 wrong blocks served, {caught} integrity errors counted");
}

/// A bit flipped on read is caught (a miss, counted, quarantined); an uncorrectable read is
/// an error for that request only; the node goes on serving.
#[test]
fn bad_reads_are_misses_or_errors_never_wrong_bytes() {
    let (_dir, cfg, dev) = fault_free();
    life(async {
        let node = open_on_sim(&cfg, &dev).await;
        for k in [&b"a"[..], b"b", b"c"] {
            put(&node, k, 30_000, Durability::Durable)
                .await
                .expect("put");
        }
        node.shutdown().await;
    });
    life(async {
        let node = open_on_sim(&cfg, &dev).await;
        next_command(&dev, FaultPlan::none(), Fault::BitFlip);
        assert_eq!(node.get("default", b"a").await.expect("get"), None);
        assert_eq!(node.stats().integrity_errors, 1);
        next_command(&dev, FaultPlan::none(), Fault::Uncorrectable);
        assert!(
            node.get("default", b"b").await.is_err(),
            "an unreadable block"
        );
        // The same block once the device reads it again, and the others.
        for k in [&b"b"[..], b"c"] {
            let got = node.get("default", k).await.expect("get").map(|b| b.0);
            assert_eq!(got, Some(content(k, 30_000)));
        }
        node.shutdown().await;
    });
}

/// A failed write or flush: the put it hit is not acknowledged, nothing acknowledged before
/// is lost, reads keep working, the node stops taking writes (a device that fails a flush
/// cannot be trusted with the next one); after a restart it takes writes again.
#[test]
fn failed_writes_and_flushes_are_never_acknowledged() {
    for fault in [Fault::ProgramFail, Fault::FlushFail] {
        let (_dir, cfg, dev) = fault_free();
        life(async {
            let node = open_on_sim(&cfg, &dev).await;
            stored(&node, b"before", 9000).await;
            // A flush comes with a durable put after a fast one.
            put(&node, b"fast", 9000, Durability::Fast)
                .await
                .expect("put fast");
            // The put's record write comes first; its flush (for the fast record before
            // it) right after.
            let c = dev.stats().commands;
            let at = if fault == Fault::FlushFail { c + 1 } else { c };
            dev.set_plan(FaultPlan::none().at(at, fault));
            let r = put(&node, b"hit", 9000, Durability::Durable).await;
            assert!(r.is_err(), "{fault:?}: the put it hit is not acknowledged");
            let got = node.get("default", b"before").await.expect("reads go on");
            assert_eq!(got.map(|b| b.0), Some(content(b"before", 9000)));
            assert!(!node.ready(), "{fault:?}: the node stops taking writes");
            node.shutdown().await;
        });
        dev.set_plan(FaultPlan::none());
        life(async {
            let node = open_on_sim(&cfg, &dev).await;
            let got = node.get("default", b"before").await.expect("get");
            assert_eq!(got.map(|b| b.0), Some(content(b"before", 9000)));
            if let Some((b, _)) = node.get("default", b"hit").await.expect("get") {
                assert_eq!(b, content(b"hit", 9000), "{fault:?}: never wrong bytes");
            }
            put(&node, b"after", 9000, Durability::Durable)
                .await
                .expect("writes resume after a restart");
            node.shutdown().await;
        });
    }
}

/// A full device: puts answer 507 (nothing half-stored), reads go on, and writes resume
/// as soon as the device has room again — without a restart. Everything acknowledged, before
/// and after, survives a power cut.
#[test]
fn writes_resume_when_space_returns() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path());
    let dev = device(FaultPlan {
        persist_unflushed: 0.0,
        ..FaultPlan::none()
    });
    let key = |i: u32| format!("blk{i}").into_bytes();
    let node = life(async {
        let node = open_on_sim(&cfg, &dev).await;
        let put = |i: u32| {
            let (k, node) = (key(i), &node);
            async move {
                let data = content(&k, 50_000);
                node.put("default", &k, data, None, Durability::Durable)
                    .await
            }
        };
        for i in 0..10 {
            put(i).await.expect("put");
        }
        dev.set_full(true);
        for i in 10..14 {
            let r = put(i).await;
            assert!(
                matches!(r, Err(ctxpod_engine::EngineError::NoSpace(_))),
                "a put on a full device is refused with no space: {r:?}"
            );
        }
        assert!(node.ready(), "a full device does not stop the node");
        for i in 0..10 {
            let got = node.get("default", &key(i)).await.expect("reads go on");
            assert_eq!(got.map(|b| b.0), Some(content(&key(i), 50_000)));
        }
        dev.set_full(false);
        for i in 14..30 {
            put(i).await.expect("writes resume");
        }
        for i in 10..14 {
            assert_eq!(node.get("default", &key(i)).await.expect("get"), None);
        }
        assert_eq!(node.stats().block_count, 26);
        dev.power_cut();
        node
    });
    drop(node);
    dev.power_on();
    life(async {
        let node = open_on_sim(&cfg, &dev).await;
        for i in (0..10).chain(14..30) {
            let got = node.get("default", &key(i)).await.expect("get");
            assert_eq!(
                got.map(|b| b.0),
                Some(content(&key(i), 50_000)),
                "block {i}"
            );
        }
        for i in 10..14 {
            assert_eq!(node.get("default", &key(i)).await.expect("get"), None);
        }
        node.shutdown().await;
    });
}

/// `ctxpod serve --device sim:qlc`: the daemon on a simulated device, real time, with the
/// device's wear in its metrics.
#[tokio::test]
async fn the_daemon_serves_on_a_simulated_device() {
    let node = Node::fresh(&["--device", "sim:qlc", "--capacity", "256MiB"]).await;
    let keys = (0..20u64).map(|i| format!("sim{i}").into_bytes());
    let blocks = keys.map(|k| (k.clone(), content(&k, 100_000)));
    common::put_all(&node.client, "default", blocks, Durability::Durable).await;
    for i in 0..20u64 {
        let k = format!("sim{i}").into_bytes();
        let got = node.client.get("default", &k).await.expect("get");
        assert_eq!(got, Some(content(&k, 100_000)));
    }
    let s = node.client.stats().await.expect("stats");
    assert_eq!(s.io_engine, "firmware-sim");
    let m = node.client.metrics().await.expect("metrics");
    let host_written = m
        .lines()
        .find_map(|l| l.strip_prefix("ctxpod_sim_host_written_bytes "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .expect("ctxpod_sim_host_written_bytes in /metrics");
    assert!(host_written >= 20.0 * 100_000.0, "{host_written}");
    assert!(m.contains("ctxpod_sim_endurance{figure=\"write_amplification\"}"));
}

/// The offload engine reports an error for an operation: a put it hits is not acknowledged
/// (and nothing is stored), a get it hits is an error for that request only; the node goes
/// on serving, and nothing is ever served wrong.
#[test]
fn offload_engine_faults_fail_only_their_request() {
    use ctxpod_engine::offload::OffloadFaults;
    let (_dir, cfg, dev) = fault_free();
    life(async {
        let node = open_on_sim(&cfg, &dev).await;
        stored(&node, b"ok", 20_000).await;
        // A put's work on the engines is the AES-GCM seal (its CRC32C is computed inline
        // with the landing copy).
        node.offload().set_faults(OffloadFaults {
            seed: 1,
            crc_error: 0.0,
            aead_error: 1.0,
        });
        let r = put(&node, b"failed", 20_000, Durability::Durable).await;
        assert!(r.is_err(), "a put whose seal failed is not acknowledged");
        node.offload().set_faults(OffloadFaults::default());
        assert_eq!(node.get("default", b"failed").await.expect("get"), None);
        assert!(node.ready(), "offload faults do not stop the node");
        node.shutdown().await;
    });
    // Fresh nodes (empty DRAM tier): a read the AES-GCM engine (open) or the CRC32C engine
    // (plaintext check) fails is an error for that request, and the block reads fine after.
    for (crc_error, aead_error) in [(0.0, 1.0), (1.0, 0.0)] {
        life(async {
            let node = open_on_sim(&cfg, &dev).await;
            node.offload().set_faults(OffloadFaults {
                seed: 2,
                crc_error,
                aead_error,
            });
            assert!(node.get("default", b"ok").await.is_err());
            node.offload().set_faults(OffloadFaults::default());
            let got = node.get("default", b"ok").await.expect("get");
            assert_eq!(got.map(|b| b.0), Some(content(b"ok", 20_000)));
            let (crc, aead) = node.offload().stats();
            assert_eq!(crc.faults + aead.faults, 1);
            assert!(crc.ops > 0 && aead.ops > 0);
            assert_eq!(
                node.stats().integrity_errors,
                0,
                "an engine error is not corruption"
            );
            node.shutdown().await;
        });
    }
}

/// Bad sectors under eviction: the daemon on `sim:tlc` and `sim:qlc` whose reads fail
/// (uncorrectable) 0.1 % and 1 % of the time, with hot (read) and pinned blocks that every
/// reclaim moves, under 4× the capacity of writes. A record the device cannot read costs
/// that record only: ≥ 99 % of puts are accepted, `/readyz` answers 200 throughout and after
/// a restart, and no read is ever answered with wrong bytes. (At adc7102 a read error while
/// moving a record stopped all writes: read-only after 329 of 1024 puts, across restarts.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_sectors_cost_their_records_only() {
    let mut report = Vec::new();
    for (profile, rate) in [("tlc", 0.001), ("tlc", 0.01), ("qlc", 0.001), ("qlc", 0.01)] {
        let dir = tempfile::tempdir().expect("tempdir");
        let faults = dir.path().join("faults.toml");
        std::fs::write(&faults, format!("seed = 11\nuncorrectable = {rate}\n")).expect("faults");
        let args = [
            "--device",
            &format!("sim:{profile}"),
            "--sim-faults",
            faults.to_str().expect("path"),
            "--capacity",
            "96MiB",
            "--dram",
            "4MiB",
        ];
        let mut node = Node::start(&dir.path().join("n"), &args).await;
        // `/readyz`, asked every 20 ms for the whole run.
        let readyz = ReadyzPoll::start(&node);
        let churn = churn_with_hot_and_pinned_blocks(&node.client).await;
        let s = node.client.stats().await.expect("stats");
        assert!(
            node.client.ready().await,
            "{profile} {rate}: ready after the churn"
        );
        let (asked, not_ready) = readyz.stop().await;
        node.restart().await;
        let after = content(b"after", 4096);
        node.client
            .put("default", b"after", after, Durability::Durable)
            .await
            .expect("writable after a restart");
        assert!(node.client.ready().await, "ready after a restart");
        let Churn {
            puts,
            accepted,
            wrong,
            get_errors,
            pinned_left,
        } = churn;
        let line = format!(
            "sim:{profile}, {:.1} % uncorrectable reads: {accepted} of {puts} puts accepted, \
             /readyz 200 {} of {asked}, {wrong} wrong bytes, {get_errors} read errors, \
             {} media errors at reclaim, {} of 20 pinned blocks kept, {} evicted regions",
            rate * 100.0,
            asked - not_ready,
            s.media_errors,
            pinned_left,
            s.evicted_regions
        );
        eprintln!("{line}");
        assert_eq!(wrong, 0, "{line}");
        assert_eq!(not_ready, 0, "{line}");
        assert!(accepted * 100 >= puts * 99, "{line}");
        assert!(
            s.evicted_regions >= 16,
            "{line}: the device turned over 4 times"
        );
        assert!(
            20 - pinned_left <= s.media_errors,
            "{line}: only unreadable pinned blocks are lost"
        );
        if rate >= 0.01 {
            assert!(s.media_errors > 0, "{line}: the reclaim met bad sectors");
        }
        report.push(line);
    }
    eprintln!("{}", report.join("\n"));
}

/// A node's `/readyz`, asked every 20 ms from [`ReadyzPoll::start`] until
/// [`ReadyzPoll::stop`].
struct ReadyzPoll {
    stop: Arc<std::sync::atomic::AtomicBool>,
    poll: tokio::task::JoinHandle<(u64, u64)>,
}

impl ReadyzPoll {
    fn start(node: &Node) -> ReadyzPoll {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let poll = {
            let (c, stop) = (node.client.clone(), stop.clone());
            tokio::spawn(async move {
                let (mut asked, mut not_ready) = (0u64, 0u64);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    asked += 1;
                    not_ready += !c.ready().await as u64;
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                (asked, not_ready)
            })
        };
        ReadyzPoll { stop, poll }
    }

    /// Stops asking: (times asked, times not ready).
    async fn stop(self) -> (u64, u64) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.poll.await.expect("poll")
    }
}

/// What [`churn_with_hot_and_pinned_blocks`] saw.
struct Churn {
    puts: u64,
    accepted: u64,
    /// Reads answered with wrong bytes.
    wrong: u64,
    get_errors: u64,
    /// Pinned blocks still there after the churn.
    pinned_left: u64,
}

/// 40 hot blocks (read every 8 puts) and 20 pinned ones, then 4× the capacity of 1 MiB
/// `fast` puts through `c`; the pinned blocks are read at the end.
async fn churn_with_hot_and_pinned_blocks(c: &ctxpod_client::client::Client) -> Churn {
    const CAP: u64 = 96 << 20;
    const CHURN_BLOCK: usize = 1 << 20;
    let hot: Vec<Vec<u8>> = (0..40).map(|i| format!("hot{i}").into_bytes()).collect();
    let pinned: Vec<Vec<u8>> = (0..20).map(|i| format!("pin{i}").into_bytes()).collect();
    for k in hot.iter().chain(&pinned) {
        c.put("default", k, content(k, 64 << 10), Durability::Durable)
            .await
            .expect("put hot or pinned");
    }
    assert_eq!(c.pin("default", &pinned, 600_000).await.expect("pin"), 20);
    let (mut puts, mut accepted, mut wrong, mut get_errors) = (0u64, 0u64, 0u64, 0u64);
    let check = |k: &[u8], got: Option<bytes::Bytes>| -> u64 {
        got.is_some_and(|b| b != content(k, 64 << 10)) as u64
    };
    for i in 0..(4 * CAP) as usize / CHURN_BLOCK {
        let k = format!("churn{i}").into_bytes();
        puts += 1;
        let r = c
            .put("default", &k, content(&k, CHURN_BLOCK), Durability::Fast)
            .await;
        accepted += r.is_ok() as u64;
        if i % 8 == 0 {
            for k in &hot {
                match c.get("default", k).await {
                    Ok(got) => wrong += check(k, got),
                    Err(_) => get_errors += 1,
                }
            }
        }
    }
    let mut pinned_left = 0;
    for k in &pinned {
        match c.get("default", k).await {
            Ok(got) => {
                pinned_left += got.is_some() as u64;
                wrong += check(k, got);
            }
            Err(_) => get_errors += 1,
        }
    }
    Churn {
        puts,
        accepted,
        wrong,
        get_errors,
        pinned_left,
    }
}
