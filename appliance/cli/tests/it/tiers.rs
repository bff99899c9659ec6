//! A node of two tiers (issue #36): blocks fill `fast`, `fast`'s reclaim demotes them into
//! `dense` (compressed, for a namespace with `compression`, when that pays), promotion
//! moves them back. A crash in the middle of a move — `kill -9` of the real node, or a
//! power cut on a simulated SLC + QLC pair without power-loss protection — loses no
//! acknowledged durable block and serves no wrong bytes.
//!
//! `CTXPOD_TIER_CRASH_CYCLES` (default 20) and `CTXPOD_TIER_POWER_SEEDS` (default 12) set
//! the runs; `CTXPOD_CRASH_SEED` / `CTXPOD_TIER_POWER_SEED` the first seed.

use crate::common;
use crate::crash::{verify, CrashRun, Writer};

use common::{content, kv_content, life, metric_of, Node};
use ctxpod_firmware_sim::rng::Rng;
use ctxpod_firmware_sim::{Fault, FaultPlan, Media, Profile, SimDevice};
use ctxpod_format::config::{ByteSize, Config, TierConfig};
use ctxpod_wire::Durability;
use rand::{Rng as _, SeedableRng};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

const MIB: u64 = 1 << 20;
/// `fast`: 4 regions of 16 MiB; `dense`: 16.
const FAST_BYTES: u64 = 65 * MIB;
const DENSE_BYTES: u64 = 257 * MIB;

/// The kill loop's prefill and its filler's blocks per cycle (1 MiB each), and the most a
/// cycle's writer puts (48 blocks of at most 256 KiB).
const PREFILL_BLOCKS: u64 = 56;
const FILLER_BLOCKS: u64 = 8;
const WRITER_CYCLE_BYTES_MAX: u64 = 12 * MIB;
/// Large values of the kill loop's prefill (fused expert shards: three extents each), one
/// promoted back per cycle: kills land in their extents' moves both ways.
const VALUES: u64 = 2;
const VALUE_BYTES: usize = 9 * MIB as usize + 11;

/// The kill loop's `dense` tier: room for everything `cycles` cycles may write, and its
/// reserve and a region's worth of slack besides, so that nothing is ever evicted.
fn kill_dense_bytes(cycles: u32) -> u64 {
    let most = (PREFILL_BLOCKS + cycles as u64 * FILLER_BLOCKS) * (MIB + 4096)
        + cycles as u64 * WRITER_CYCLE_BYTES_MAX
        + (VALUES + cycles as u64) * (VALUE_BYTES as u64 + 3 * 4096);
    MIB + (most.div_ceil(16 * MIB) + 8) * 16 * MIB
}

fn tiers_toml(fast: &str, dense: &str, dense_bytes: u64) -> String {
    format!(
        "region_bytes = \"16MiB\"\n\
         [[tiers]]\nname = \"fast\"\ndevice = \"{fast}\"\ncapacity = \"{FAST_BYTES}\"\n\
         [[tiers]]\nname = \"dense\"\ndevice = \"{dense}\"\ncapacity = \"{dense_bytes}\"\n"
    )
}

/// Blocks of 1 MiB of a KV cache's bytes ([`kv_content`]: they compress) put `fast`
/// through `client`, keys `{tag}-{i}`, `count` at most, until one fails (the node was
/// killed): what keeps `fast` full and its regions demoting. With `promote`, after each put
/// two blocks of the prefill (demoted by then) are promoted back, and with the first put
/// the large value `promote` names: kills land in promotions too.
async fn fill(
    client: ctxpod_client::client::Client,
    tag: String,
    (count, durability): (u64, Durability),
    promote: Option<Vec<u8>>,
) -> u64 {
    for i in 0..count {
        let key = format!("{tag}-{i}").into_bytes();
        let put = client.put("default", &key, kv_content(&key, MIB as usize), durability);
        if put.await.is_err() {
            return i;
        }
        let Some(value) = &promote else {
            continue;
        };
        let back: Vec<Vec<u8>> = (0..2)
            .map(|j| {
                format!(
                    "fill-{}",
                    (i * 7 + j * 13 + tag.len() as u64) % PREFILL_BLOCKS
                )
            })
            .map(String::into_bytes)
            .chain((i == 0).then(|| value.clone()))
            .collect();
        if client.promote("default", &back).await.is_err() {
            return i + 1;
        }
    }
    count
}

/// Prefilled to `fast`'s size (durable KV blocks of a namespace compressed with zstd, and
/// two large values whose extents `fast`'s reclaim demotes and each cycle promotes), the
/// node is killed at random moments while a writer puts blocks and a filler 8 MiB more:
/// kills land before, during and after demotions of `fast` regions (compressed, or moved as
/// they are for the writer's random bytes) and promotions. After every restart every
/// acknowledged durable block is there byte for byte, and the rest are absent or whole;
/// at the end every prefill block reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_demotion_loses_nothing() {
    let cycles = common::seed_from_env("CTXPOD_TIER_CRASH_CYCLES", 20) as u32;
    let seed = common::seed_from_env("CTXPOD_CRASH_SEED", 1);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("n");
    std::fs::create_dir_all(&data).expect("data dir");
    let (fast, dense) = (data.join("fast.dev"), data.join("dense.dev"));
    let config = tiers_toml(
        &fast.to_string_lossy(),
        &dense.to_string_lossy(),
        kill_dense_bytes(cycles),
    );
    let mut node = Node::start_configured(
        &data,
        &["--dram", "8MiB"],
        &config,
        Default::default(),
        false,
    )
    .await;
    let zstd = ctxpod_wire::types::CreateNamespace {
        compression: Some(ctxpod_wire::types::Compression::Zstd),
        ..Default::default()
    };
    node.client
        .create_namespace_with("default", &zstd)
        .await
        .expect("compression on");
    let prefill = (PREFILL_BLOCKS, Durability::Durable);
    let prefilled = fill(node.client.clone(), "fill".into(), prefill, None).await;
    assert_eq!(prefilled, PREFILL_BLOCKS);
    for v in 0..VALUES {
        let key = value_key(v);
        let value = kv_content(&key, VALUE_BYTES);
        node.client
            .put("default", &key, value, Durability::Durable)
            .await
            .expect("a large value");
    }
    let mut run = CrashRun {
        seed,
        ..CrashRun::default()
    };
    let (mut demoted, mut promoted, mut evicted, mut compressed) = (0.0, 0.0, 0.0, 0.0);
    for cycle in 0..cycles {
        let writer = Writer::spawn(node.client.clone(), seed, cycle);
        // 8 MiB more a cycle: every other cycle or so demotes a region of `fast`.
        let filler = tokio::spawn(fill(
            node.client.clone(),
            format!("c{cycle}"),
            (FILLER_BLOCKS, Durability::Fast),
            Some(value_key(u64::from(cycle) % VALUES)),
        ));
        let delay = rng.gen_range(20..400);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        // What this life did so far (its counters start at 0 with it).
        let m = node.client.metrics().await.unwrap_or_default();
        demoted += metric_of(&m, "ctxpod_tier_demoted_records_total");
        promoted += metric_of(&m, "ctxpod_tier_promoted_records_total");
        evicted += metric_of(&m, "ctxpod_evicted_blocks_total");
        compressed += metric_of(&m, "ctxpod_compression_records_total{codec=\"zstd\"}");
        run.kill_restart_and_check(&mut node, writer, cycle, delay)
            .await;
        let _ = tokio::time::timeout(Duration::from_secs(30), filler).await;
    }
    let (missing, corrupt) = verify(&node, seed, &run.acked_all, true).await;
    let prefill_wrong = prefill_wrong(&node.client).await;
    let info = node.client.namespace("default").await.expect("info");
    let s = node.client.stats().await.expect("stats");
    let m = node.client.metrics().await.expect("metrics");
    let dense_used = metric_of(&m, "ctxpod_tier_used_bytes{tier=\"dense\"}");
    eprintln!(
        "{cycles} kill -9 cycles on two tiers: {} blocks acknowledged durable, {missing} \
         lost, {corrupt} corrupt; {demoted} records demoted and {promoted} promoted before \
         the kills ({compressed} compressed), dense holds {dense_used} bytes, {evicted} \
         evicted, {} re-indexed from tails; {} bytes held compressed in {}",
        run.acked_all.len(),
        run.recovered,
        info.compressed_bytes,
        info.compressed_stored_bytes
    );
    assert_eq!((missing, corrupt), (0, 0));
    assert_eq!(
        prefill_wrong,
        Vec::<String>::new(),
        "durable prefill blocks"
    );
    assert!(compressed > 0.0, "no kill came after a compressed demotion");
    assert!(demoted > 0.0, "no kill came after a demotion");
    assert!(promoted > 0.0, "no kill came after a promotion");
    assert!(dense_used > 0.0, "the dense tier holds the demoted records");
    assert_eq!(
        evicted + s.evicted_blocks as f64,
        0.0,
        "test sizing: nothing may be evicted"
    );
    assert_eq!(s.integrity_errors, 0);
}

/// What of the kill loop's durable prefill (its blocks and large values) does not read
/// back byte for byte.
async fn prefill_wrong(client: &ctxpod_client::client::Client) -> Vec<String> {
    let mut wrong = Vec::new();
    for i in 0..PREFILL_BLOCKS {
        let key = format!("fill-{i}").into_bytes();
        match client.get("default", &key).await {
            Ok(Some(b)) if b == kv_content(&key, MIB as usize) => {}
            other => wrong.push(format!("fill-{i}: {:?}", other.map(|b| b.is_some()))),
        }
    }
    for v in 0..VALUES {
        let key = value_key(v);
        match client.get("default", &key).await {
            Ok(Some(b)) if b == kv_content(&key, VALUE_BYTES) => {}
            other => wrong.push(format!("value {v}: {:?}", other.map(|b| b.is_some()))),
        }
    }
    wrong
}

fn value_key(v: u64) -> Vec<u8> {
    format!("experts/{v}").into_bytes()
}

/// The HTTP door: a namespace's `compression` is set by `PUT /v1/namespaces/{ns}` (an
/// unknown codec refused), its demoted blocks are held compressed and its info says how
/// much; `POST /v1/namespaces/{ns}/promote` moves demoted blocks back to `fast` and says how
/// many moved and how many are in `fast` now (a large value's extents all moved); bad input
/// is refused with nothing moved; every block still reads back byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promote_and_compression_through_http() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("n");
    std::fs::create_dir_all(&data).expect("data dir");
    let (fast, dense) = (data.join("fast.dev"), data.join("dense.dev"));
    let config = tiers_toml(&fast.to_string_lossy(), &dense.to_string_lossy(), 257 * MIB);
    let node = Node::start_configured(&data, &[], &config, Default::default(), false).await;
    let ns_url = format!("{}/v1/namespaces/default", node.url);
    let http = node.client.http();
    common::answered(
        http.put(&ns_url)
            .json(&serde_json::json!({"compression": "gzip"})),
        400,
    )
    .await;
    common::answered(
        http.put(&ns_url)
            .json(&serde_json::json!({"compression": "zstd"})),
        200,
    )
    .await;
    let filled = fill(
        node.client.clone(),
        "fill".into(),
        (80, Durability::Fast),
        None,
    );
    assert_eq!(filled.await, 80);
    let info = node.client.namespace("default").await.expect("info");
    assert_eq!(
        info.compression,
        Some(ctxpod_wire::types::Compression::Zstd)
    );
    assert!(
        info.compressed_bytes >= 8 * MIB
            && info.compressed_stored_bytes * 8 < info.compressed_bytes * 7,
        "{info:?}"
    );
    let keys: Vec<Vec<u8>> = (0..80).map(|i| format!("fill-{i}").into_bytes()).collect();
    let mut asked = keys.clone();
    asked.push(b"absent".to_vec());
    let c = &node.client;
    let r = c.promote("default", &asked).await.expect("promote");
    assert!(
        r.promoted >= 1 && r.fast >= r.promoted && r.fast <= 80 && r.each.is_none(),
        "{r:?}"
    );
    let m = c.metrics().await.expect("metrics");
    assert_eq!(
        metric_of(&m, "ctxpod_tier_promoted_records_total"),
        r.promoted as f64
    );
    let url = format!("{}/v1/namespaces/default/promote", node.url);
    let many: Vec<String> = (0..1025).map(|i| format!("{i:04x}")).collect();
    common::answered(
        http.post(&url).json(&serde_json::json!({ "keys": many })),
        400,
    )
    .await;
    common::answered(http.post(&url).body("{"), 400).await;
    let nope = format!("{}/v1/namespaces/nope/promote", node.url);
    common::answered(
        http.post(&nope).json(&serde_json::json!({ "keys": [] })),
        404,
    )
    .await;
    let m = c.metrics().await.expect("metrics");
    assert_eq!(
        metric_of(&m, "ctxpod_tier_promoted_records_total"),
        r.promoted as f64,
        "refused requests moved nothing"
    );
    for k in &keys {
        let got = c.get("default", k).await.expect("get");
        assert!(got.is_some_and(|b| b == kv_content(k, MIB as usize)));
    }
    // A large value (written to `dense`) is promoted whole: each of its extents moves.
    let key = b"experts/0".to_vec();
    let value = kv_content(&key, VALUE_BYTES);
    c.put("default", &key, value.clone(), Durability::Durable)
        .await
        .expect("a large value");
    let r = c
        .promote("default", std::slice::from_ref(&key))
        .await
        .expect("promote");
    assert_eq!((r.promoted, r.fast), (1, 1), "{r:?}");
    let m = c.metrics().await.expect("metrics");
    let before = metric_of(&m, "ctxpod_tier_promoted_records_total");
    let r = c
        .promote("default", std::slice::from_ref(&key))
        .await
        .expect("promote");
    assert_eq!((r.promoted, r.fast), (0, 1), "in fast already: {r:?}");
    let m = c.metrics().await.expect("metrics");
    assert_eq!(metric_of(&m, "ctxpod_tier_promoted_records_total"), before);
    let got = c.get("default", &key).await.expect("get");
    assert!(got.is_some_and(|b| b == value), "the promoted value");
}

/// The node's configuration on two simulated tiers in `dir` (the devices come with it).
fn sim_tiers(dir: &std::path::Path) -> Config {
    let tier = |name: &str, bytes: u64| TierConfig {
        name: name.into(),
        device: None,
        capacity: ByteSize(bytes),
    };
    let mut c = Config {
        data_dir: dir.to_path_buf(),
        region_bytes: Some(ByteSize(16 * MIB)),
        dram: ByteSize(4 * MIB),
        offload_threads: 1,
        tiers: vec![tier("fast", FAST_BYTES), tier("dense", DENSE_BYTES)],
        ..Config::default()
    };
    c.settle_tiers();
    c
}

async fn open_tiers(
    cfg: &Config,
    devs: &[Arc<SimDevice>; 2],
) -> anyhow::Result<ctxpod_engine::Engine> {
    ctxpod_engine::Engine::open_on_tiers(
        cfg.clone(),
        Arc::new(ctxpod_engine::metrics::Metrics::new()),
        Some(
            devs.iter()
                .map(|d| {
                    Arc::new(ctxpod_engine::device::sim::SimBackend::new(d.clone()))
                        as Arc<dyn ctxpod_engine::device::Device>
                })
                .collect(),
        ),
    )
    .await
}

/// What one seed of the power-cut run found.
#[derive(Default)]
struct Cut {
    acked_durable: u64,
    demoted: u64,
    promoted: u64,
    /// Records compressed as they were demoted.
    compressed: u64,
    /// The cut came from the plan, at one of the dense drive's commands past its format:
    /// a demotion's write or flush, or a promotion's read.
    mid_move: bool,
    failures: Vec<String>,
}

/// One seed: puts of 256 KiB to 1 MiB (all durable, or three in four; every other one a KV
/// block's bytes, in a namespace compressed with zstd), and every eighth put a promotion of
/// four earlier blocks, until the dense drive loses power at a seeded
/// command (its commands are the demotions' writes and flushes and the promotions' reads),
/// the fast drive with it; then recovery, and every block checked.
fn power_cut_seed(seed: u64) -> Cut {
    let mut rng = Rng::new(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = sim_tiers(dir.path());
    let plan = FaultPlan {
        seed,
        persist_unflushed: 0.5,
        ..FaultPlan::none()
    }
    .at(3 + rng.below(160), Fault::PowerCut);
    let dev = |profile: &str, bytes: u64, plan: FaultPlan| {
        let p = Profile::load(profile).expect("profile");
        Arc::new(SimDevice::new(p, Media::memory(bytes), plan, false))
    };
    let devs = [
        dev("slc-noplp", FAST_BYTES, FaultPlan::none()),
        dev("qlc-noplp", DENSE_BYTES, plan),
    ];
    let mut out = Cut::default();
    // Key → (length, acknowledged durable).
    let mut ledger: BTreeMap<Vec<u8>, (usize, bool)> = BTreeMap::new();
    let held = life(async {
        let node = open_tiers(&cfg, &devs).await.expect("format");
        let zstd = ctxpod_engine::NsSettings {
            compression: Some(ctxpod_wire::types::Compression::Zstd),
            ..Default::default()
        };
        node.create_namespace_with("default", zstd)
            .await
            .expect("compression on");
        for i in 0..200u64 {
            let key = format!("p{seed}-{i}").into_bytes();
            let len = (256 << 10) + rng.below(768 << 10) as usize;
            // Odd seeds put only durable blocks: no commit flushes the drives then, so
            // a demotion's own flush is all that makes its copies durable.
            let d = if seed % 2 == 1 || rng.below(4) > 0 {
                Durability::Durable
            } else {
                Durability::Fast
            };
            let r = node.put("default", &key, body(&key, len), None, d).await;
            ledger.insert(key, (len, r.is_ok() && d == Durability::Durable));
            // Every fiftieth put a large value too (durable, in `dense`; promoted below):
            // its extents move both ways.
            if r.is_err() || (i % 50 == 0 && !put_ledgered(&node, seed, i, &mut ledger).await) {
                break;
            }
            // Every eighth put, four earlier blocks (demoted by then) promoted back: the
            // dense drive's reads of a promotion are commands the cut may land on too.
            if i % 8 == 7 {
                let value = format!("v{seed}-{}", i / 50 * 50).into_bytes();
                let back = (0..4)
                    .map(|_| format!("p{seed}-{}", rng.below(i)).into_bytes())
                    .chain((i % 16 == 15).then_some(value))
                    .collect();
                if node.promote("default", back).await.is_err() {
                    break;
                }
            }
        }
        out.mid_move = !devs[1].is_powered();
        for d in &devs {
            if d.is_powered() {
                d.power_cut();
            }
        }
        out.demoted = node.metrics().tier.demoted_records.get();
        out.promoted = node.metrics().tier.promoted_records.get();
        out.compressed = node
            .metrics()
            .compression
            .records
            .with_label_values(&["zstd"])
            .get();
        let held: BTreeMap<Vec<u8>, bool> = ledger
            .keys()
            .map(|k| (k.clone(), node.on_flash("default", k).unwrap_or(false)))
            .collect();
        (node, held)
    });
    drop(held.0);
    for d in &devs {
        d.power_on();
        d.set_plan(FaultPlan::none());
    }
    life(async {
        let node = open_tiers(&cfg, &devs).await.expect("recover");
        for (key, &(len, durable)) in &ledger {
            let name = String::from_utf8_lossy(key).into_owned();
            match get_value(&node, key).await {
                Ok(Some(b)) if b != body(key, len) => {
                    out.failures.push(format!("{name}: wrong bytes"));
                }
                Ok(None) if durable && held.1.get(key) == Some(&true) => {
                    out.failures
                        .push(format!("{name}: acknowledged durable, lost"));
                }
                Err(e) => out.failures.push(format!("{name}: {e}")),
                _ => {}
            }
            out.acked_durable += u64::from(durable);
        }
        recovered_node_works(&node, &mut out.failures).await;
        node.shutdown().await;
    });
    out
}

/// The power-cut run's large value `v{seed}-{i}` stored and put in the ledger; whether it
/// was acknowledged.
async fn put_ledgered(
    node: &ctxpod_engine::Engine,
    seed: u64,
    i: u64,
    ledger: &mut BTreeMap<Vec<u8>, (usize, bool)>,
) -> bool {
    let key = format!("v{seed}-{i}").into_bytes();
    let ok = put_value(node, &key, &body(&key, VALUE_BYTES))
        .await
        .is_ok();
    ledger.insert(key, (VALUE_BYTES, ok));
    ok
}

/// Stores `v` under `key` durably, piece by piece as a door would (a large value when it
/// is over 8 MiB).
async fn put_value(node: &ctxpod_engine::Engine, key: &[u8], v: &[u8]) -> anyhow::Result<()> {
    let mut w = node
        .begin_value("default", key, v.len() as u64, Durability::Durable)
        .await?;
    let mut at = 0;
    while w.next_piece_len() > 0 {
        let n = w.next_piece_len();
        w.write_piece(ctxpod_engine::StagedBlock::copy_of(&v[at..at + n])?)
            .await?;
        at += n;
    }
    w.finish(Some(ctxpod_wire::crc32c(v))).await?;
    Ok(())
}

/// The block or value under `key`, read piece by piece (`None`: absent).
async fn get_value(
    node: &ctxpod_engine::Engine,
    key: &[u8],
) -> anyhow::Result<Option<bytes::Bytes>> {
    let Some(mut r) = node.open_value("default", key, None).await? else {
        return Ok(None);
    };
    let mut out = bytes::BytesMut::new();
    while let Some(p) = r.next_piece().await? {
        out.extend_from_slice(&p);
    }
    Ok(Some(out.freeze()))
}

/// Block `key`'s bytes in the power-cut run: a KV block's (they compress) for keys ending
/// in an even digit, random ones (they do not) for the others.
fn body(key: &[u8], len: usize) -> bytes::Bytes {
    if key.last().is_some_and(|d| d % 2 == 0) {
        kv_content(key, len)
    } else {
        content(key, len)
    }
}

/// The recovered node takes a put, and its stats give each simulated tier its rated
/// lifetime writes (SLC's 60 DWPD against QLC's 0.58, per byte of the tier).
async fn recovered_node_works(node: &ctxpod_engine::Engine, failures: &mut Vec<String>) {
    let key = b"after".to_vec();
    let put = node
        .put(
            "default",
            &key,
            content(&key, 70_000),
            None,
            Durability::Durable,
        )
        .await;
    if put.is_err() {
        failures.push("the recovered node takes no put".into());
    }
    let t = node.stats().tiers;
    let per_byte: Vec<f64> = t
        .iter()
        .filter_map(|t| Some(t.rated_written_bytes? / t.capacity_bytes as f64))
        .collect();
    if per_byte.len() != 2 || per_byte[0] < 50.0 * per_byte[1] {
        failures.push(format!("tier ratings: {t:?}"));
    }
}

#[test]
fn power_cuts_during_demotion_lose_nothing() {
    let seeds = common::seed_from_env("CTXPOD_TIER_POWER_SEEDS", 12);
    let first = common::seed_from_env("CTXPOD_TIER_POWER_SEED", 1);
    let (mut acked, mut demoted, mut promoted, mut mid_move) = (0, 0, 0, 0);
    let mut compressed = 0;
    let mut failed = Vec::new();
    for seed in first..first + seeds {
        let c = power_cut_seed(seed);
        if !c.failures.is_empty() {
            eprintln!(
                "seed {seed} FAILED: {:?}\n  replay: CTXPOD_TIER_POWER_SEED={seed} \
                 CTXPOD_TIER_POWER_SEEDS=1 cargo nextest run -p ctxpod --test it \
                 tiers::power --no-capture",
                c.failures
            );
            failed.push(seed);
        }
        acked += c.acked_durable;
        demoted += c.demoted;
        promoted += c.promoted;
        compressed += c.compressed;
        mid_move += u64::from(c.mid_move);
    }
    eprintln!(
        "{} of {seeds} power cuts on an SLC + QLC pair passed: {acked} acknowledged durable \
         blocks checked, {demoted} records demoted ({compressed} compressed) and {promoted} \
         promoted before the cuts, {mid_move} cuts in the middle of a move",
        seeds - failed.len() as u64
    );
    assert!(failed.is_empty(), "failing seeds: {failed:?}");
    assert!(compressed > 0, "no demotion was compressed");
    assert!(promoted > 0, "no cut came after a promotion");
    assert!(
        mid_move * 2 >= seeds,
        "most cuts must land in a demotion ({mid_move} of {seeds})"
    );
}
