//! Device faults other than power loss, on the simulated device (firmware-sim): torn records
//! at every sector, misdirected writes, bit flips and uncorrectable reads, failed writes and
//! flushes, device full; and the daemon serving on a simulated device.

mod common;

use common::{content, life, open_on_sim, Node};
use ctxpod::config::Config;
use ctxpod_api::Durability;
use ctxpod_firmware_sim::{Fault, FaultPlan, Media, Profile, SimDevice};
use std::sync::Arc;

const CAPACITY: u64 = 80 << 20;

fn config(dir: &std::path::Path) -> Config {
    common::sim_config(dir, CAPACITY, 1 << 20)
}

/// Puts the block whose contents derive from `key`.
async fn put(
    node: &ctxpod::engine::Engine,
    key: &[u8],
    len: usize,
    d: Durability,
) -> Result<ctxpod::engine::PutStatus, ctxpod::engine::EngineError> {
    node.put("default", key, content(key, len), None, d).await
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
    let len = sectors * 4096 - ctxpod::record::HEADER_BYTES - 16;
    assert_eq!(ctxpod::record::record_bytes(len), sectors * 4096);
    for keep in 0..=sectors {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = config(dir.path());
        let dev = device(FaultPlan::none());
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
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = config(dir.path());
        let dev = device(FaultPlan::none());
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
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path());
    let dev = device(FaultPlan::none());
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
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = config(dir.path());
        let dev = device(FaultPlan::none());
        life(async {
            let node = open_on_sim(&cfg, &dev).await;
            put(&node, b"before", 9000, Durability::Durable)
                .await
                .expect("put");
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
                matches!(r, Err(ctxpod::engine::EngineError::NoSpace(_))),
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
    let dir = tempfile::tempdir().expect("tempdir");
    let node = Node::start(
        &dir.path().join("n"),
        &["--device", "sim:qlc", "--capacity", "256MiB"],
    )
    .await;
    for i in 0..20u64 {
        let k = format!("sim{i}").into_bytes();
        node.client
            .put("default", &k, content(&k, 100_000), Durability::Durable)
            .await
            .expect("put");
    }
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
    use ctxpod_firmware_sim::offload::OffloadFaults;
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path());
    let dev = device(FaultPlan::none());
    life(async {
        let node = open_on_sim(&cfg, &dev).await;
        put(&node, b"ok", 20_000, Durability::Durable)
            .await
            .expect("put");
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
