//! Crash loop: a writer puts seeded blocks (three in four `durable`, one `fast`) while the
//! node is `kill -9`ed at random moments. After every restart, every acknowledged durable
//! block must be there byte for byte, and a block whose put was cut short, or that was put
//! `fast`, must be absent or intact, never wrong.
//!
//! `CTXPOD_CRASH_CYCLES` (default 50) and `CTXPOD_CRASH_SEED` (default 1) set the run; the
//! long run in docs/RELIABILITY.md uses 1000 cycles. Each cycle writes at most
//! [`BLOCKS_PER_CYCLE_MAX`] blocks and the capacity grows with the cycle count, so that no
//! eviction can happen: every acknowledged block of the whole run must still be there at the
//! end (the test checks this premise by arithmetic).

use crate::common;

use common::{block, flip, open_device, put_all, records, Node};
use ctxpod_wire::Durability;
use futures::StreamExt;
use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

const BLOCKS_PER_CYCLE_MAX: u32 = 48;

/// Every fourth block is put `fast`: acknowledged before it is durable, it may be missing
/// after a crash but must never read back wrong; the others are `durable`.
fn durability_of(i: u32) -> Durability {
    if i % 4 == 3 {
        Durability::Fast
    } else {
        Durability::Durable
    }
}
const BLOCK_BYTES_MAX: usize = 1 << 18;

fn spec(seed: u64, cycle: u32, i: u32) -> (Vec<u8>, u64, usize) {
    let mut key = cycle.to_be_bytes().to_vec();
    key.extend_from_slice(&i.to_be_bytes());
    let s = seed ^ ((cycle as u64) << 32 | i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut rng = rand::rngs::StdRng::seed_from_u64(s);
    let exp = rng.gen_range(0..=BLOCK_BYTES_MAX.ilog2());
    (key, s, rng.gen_range(1..=(1usize << exp)))
}

pub(crate) async fn verify(
    node: &Node,
    seed: u64,
    keys: &[(u32, u32)],
    must_exist: bool,
) -> (u64, u64) {
    let (mut missing, mut corrupt) = (0, 0);
    for chunk in keys.chunks(64) {
        let ks: Vec<Vec<u8>> = chunk.iter().map(|&(c, i)| spec(seed, c, i).0).collect();
        let got = node
            .client
            .batch_get("default", &ks)
            .await
            .expect("batch get");
        for (&(c, i), (_, data)) in chunk.iter().zip(got) {
            let (_, s, len) = spec(seed, c, i);
            match data {
                Some(d) if d == block(s, len) => {}
                Some(_) => {
                    eprintln!("cycle {c} block {i}: WRONG BYTES");
                    corrupt += 1;
                }
                None if must_exist => {
                    eprintln!("cycle {c} block {i}: acknowledged but missing");
                    missing += 1;
                }
                None => {}
            }
        }
    }
    (missing, corrupt)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_loop_loses_no_acknowledged_block() {
    let cycles: u32 = common::seed_from_env("CTXPOD_CRASH_CYCLES", 50) as u32;
    let seed = common::seed_from_env("CTXPOD_CRASH_SEED", 1);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    let worst_cycle =
        BLOCKS_PER_CYCLE_MAX as u64 * ctxpod_format::record::record_bytes(BLOCK_BYTES_MAX) as u64;
    // Blocks average far below the largest: a quarter of the worst case is ample.
    let capacity_gib = (cycles as u64 * worst_cycle / 4).div_ceil(1 << 30).max(2);
    let capacity = format!("{capacity_gib}GiB");
    let mut node = Node::start(
        &dir.path().join("n"),
        &["--capacity", &capacity, "--dram", "16MiB"],
    )
    .await;
    let mut run = CrashRun {
        seed,
        ..CrashRun::default()
    };
    for cycle in 0..cycles {
        let writer = Writer::spawn(node.client.clone(), seed, cycle);
        let delay = rng.gen_range(5..250);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        run.kill_restart_and_check(&mut node, writer, cycle, delay)
            .await;
    }
    run.check_the_end(&node, cycles).await;
}

/// A writer putting a cycle's blocks, four at a time, until one fails (the node was
/// killed): which it started and which were acknowledged.
pub(crate) struct Writer {
    task: tokio::task::JoinHandle<()>,
    acked: Arc<Mutex<BTreeSet<u32>>>,
    started: Arc<Mutex<BTreeSet<u32>>>,
}

impl Writer {
    /// Starts writing the blocks of `cycle` through `client`.
    pub(crate) fn spawn(client: ctxpod_client::client::Client, seed: u64, cycle: u32) -> Writer {
        let acked = Arc::new(Mutex::new(BTreeSet::new()));
        let started = Arc::new(Mutex::new(BTreeSet::new()));
        let (a2, s2) = (acked.clone(), started.clone());
        let task = tokio::spawn(async move {
            let mut s = futures::stream::iter((0..BLOCKS_PER_CYCLE_MAX).map(|i| {
                let c = client.clone();
                let (a, s) = (a2.clone(), s2.clone());
                async move {
                    let (key, bs, len) = spec(seed, cycle, i);
                    s.lock().insert(i);
                    if c.put("default", &key, block(bs, len), durability_of(i))
                        .await
                        .is_ok()
                    {
                        a.lock().insert(i);
                        true
                    } else {
                        false
                    }
                }
            }))
            .buffer_unordered(4);
            while let Some(ok) = s.next().await {
                if !ok {
                    break;
                }
            }
        });
        Writer {
            task,
            acked,
            started,
        }
    }
}

/// What the kill loop has seen so far, across cycles.
#[derive(Default)]
pub(crate) struct CrashRun {
    pub seed: u64,
    /// Bytes of every record a put was started for.
    pub started_record_bytes: u64,
    /// Records re-indexed from region tails, over all restarts.
    pub recovered: u64,
    /// Every acknowledged durable block: (cycle, index).
    pub acked_all: Vec<(u32, u32)>,
    pub acked_bytes: u64,
}

impl CrashRun {
    /// `kill -9` of `node` `delay` ms into `cycle`, a restart, and the cycle's checks:
    /// every acknowledged durable block there byte for byte, the rest absent or whole.
    pub(crate) async fn kill_restart_and_check(
        &mut self,
        node: &mut Node,
        writer: Writer,
        cycle: u32,
        delay: u64,
    ) {
        node.kill9();
        let (this, cut) = self.after_the_kill(writer, cycle).await;
        node.restart().await;
        self.recovered += node.client.stats().await.expect("stats").recovered_records;
        let (missing, corrupt) = verify(node, self.seed, &this, true).await;
        let (_, corrupt_cut) = verify(node, self.seed, &cut, false).await;
        assert_eq!(
            (missing, corrupt + corrupt_cut),
            (0, 0),
            "cycle {cycle} (seed {}, killed after {delay} ms): {} acked, {} cut short",
            self.seed,
            this.len(),
            cut.len()
        );
    }

    /// Waits (30 s at most) for the killed cycle's writer to stop, and accounts for what it
    /// did: the acknowledged durable blocks (which must be there), and the blocks cut short
    /// or put `fast` (which may be absent but never wrong).
    async fn after_the_kill(
        &mut self,
        writer: Writer,
        cycle: u32,
    ) -> (Vec<(u32, u32)>, Vec<(u32, u32)>) {
        let seed = self.seed;
        let _ = tokio::time::timeout(Duration::from_secs(30), writer.task).await;
        let acked: Vec<u32> = writer.acked.lock().iter().copied().collect();
        let started = writer.started.lock();
        let cut = started
            .iter()
            .filter(|i| !acked.contains(i))
            .map(|&i| (cycle, i));
        let fast = acked
            .iter()
            .filter(|&&i| durability_of(i) == Durability::Fast)
            .map(|&i| (cycle, i));
        let cut: Vec<(u32, u32)> = cut.chain(fast).collect();
        for &i in started.iter() {
            self.started_record_bytes +=
                ctxpod_format::record::record_bytes(spec(seed, cycle, i).2) as u64;
        }
        let this: Vec<(u32, u32)> = acked
            .iter()
            .filter(|&&i| durability_of(i) == Durability::Durable)
            .map(|&i| (cycle, i))
            .collect();
        for &(c, i) in &this {
            self.acked_bytes += spec(seed, c, i).2 as u64;
        }
        self.acked_all.extend(this.iter().copied());
        (this, cut)
    }

    /// After all the crashes: every block acknowledged in any cycle is still there, the
    /// test's premise (no eviction) held, and tail recovery was exercised.
    async fn check_the_end(&self, node: &Node, cycles: u32) {
        let (seed, started_record_bytes) = (self.seed, self.started_record_bytes);
        let (missing, corrupt) = verify(node, seed, &self.acked_all, true).await;
        let s = node.client.stats().await.expect("stats");
        eprintln!(
            "{cycles} of {cycles} crash cycles: {} blocks ({} bytes) acknowledged, {missing} \
             lost, {corrupt} corrupt reads, {} integrity errors ({started_record_bytes} bytes \
             of records started)",
            self.acked_all.len(),
            self.acked_bytes,
            s.integrity_errors,
        );
        // The premise: everything ever started fits in the regions that fill before the
        // eviction reserve (at most 4 regions) is touched, each region wasting at most one
        // largest record.
        let usable = s.region_bytes * (s.regions_total - 5)
            - s.regions_total * ctxpod_format::record::record_bytes(BLOCK_BYTES_MAX) as u64;
        assert!(
            started_record_bytes < usable,
            "test sizing: {started_record_bytes} bytes of records may have caused eviction \
             ({usable} usable)"
        );
        let recovered = self.recovered;
        eprintln!("{recovered} records re-indexed from region tails across the restarts");
        assert_eq!((missing, corrupt), (0, 0));
        assert!(recovered > 0, "the crashes never exercised tail recovery");
        assert_eq!(
            s.integrity_errors, 0,
            "kill -9 must never leave a bad record in the index"
        );
        assert!(
            self.acked_all.len() as u32 > cycles,
            "the writer acknowledged too little to mean anything"
        );
    }
}

/// Put entries live in the index without the WAL: after `kill -9` they come back from the
/// open region's tail; a delete (a synced checkpoint) is never undone by that; a clean stop
/// leaves no tail to scan.
#[tokio::test]
async fn tail_recovery_restores_puts_and_never_resurrects_deletes() {
    let mut node = Node::fresh(&["--capacity", "256MiB"]).await;
    let key = |i: u64| format!("tail{i:03}").into_bytes();
    let len = |i: u64| 1000 + i as usize * 7919;
    let blocks = |r: std::ops::Range<u64>| r.map(|i| (key(i), block(i, len(i))));
    put_all(&node.client, "default", blocks(0..30), Durability::Durable).await;
    node.restart().await; // kill -9
    let s = node.client.stats().await.expect("stats");
    assert!(s.recovered_records > 0, "nothing came back from the tail");
    assert_eq!(s.block_count, 30);
    for i in 0..30 {
        let got = node.client.get("default", &key(i)).await.expect("get");
        assert_eq!(got, Some(block(i, len(i))), "block {i} after kill -9");
    }
    // Delete some, put more, crash again: deleted stay deleted, the rest come back.
    for i in 0..5 {
        assert!(node
            .client
            .delete("default", &key(i))
            .await
            .expect("delete"));
    }
    put_all(&node.client, "default", blocks(30..40), Durability::Durable).await;
    node.restart().await;
    for i in 0..40 {
        let got = node.client.get("default", &key(i)).await.expect("get");
        let want = (i >= 5).then(|| block(i, len(i)));
        assert_eq!(got, want, "block {i} after the second kill -9");
    }
    assert_eq!(node.client.stats().await.expect("stats").block_count, 35);
    // A clean stop checkpoints: nothing to re-index at the next start.
    node.stop();
    node.restart().await;
    let s = node.client.stats().await.expect("stats");
    assert_eq!((s.recovered_records, s.block_count), (0, 35));
}

/// A crash can leave records that were written but never acknowledged behind a hole whose
/// length the scan cannot know (a torn write in front of them, made here by damaging the
/// header of the first of three records while the node is down). The tail scan stops at the
/// hole, and they are not indexed. The next life writes over the hole under a fresh tail
/// epoch, so that after another crash the scan stops at the first leftover record instead of
/// taking it for one of its own: a crash never adds blocks. (A record whose header is sound
/// and whose body is not costs that record only:
/// `tamper::a_block_stored_again_after_its_copy_went_bad_survives_kill_9`.)
#[tokio::test]
async fn records_left_past_a_hole_never_come_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data_dir = dir.path().join("n");
    let mut node = Node::start(&data_dir, &["--capacity", "256MiB"]).await;
    let len = 100_000;
    // The first put opens a region: a synced checkpoint that covers it.
    for (i, k) in [&b"base"[..], b"holeA", b"lateB", b"lateC"]
        .iter()
        .enumerate()
    {
        node.client
            .put("default", k, block(i as u64, len), Durability::Durable)
            .await
            .expect("put");
    }
    node.kill9();
    {
        let dev = open_device(&data_dir);
        let recs = records(&dev);
        let at = |k: &[u8]| recs[k].0;
        assert!(at(b"holeA") < at(b"lateB") && at(b"lateB") < at(b"lateC"));
        // A byte of the key, inside the header its own CRC covers.
        flip(&dev, at(b"holeA") + 64);
    }
    node.restart().await;
    let s = node.client.stats().await.expect("stats");
    assert_eq!(
        (s.recovered_records, s.block_count),
        (0, 1),
        "the scan stops at the hole"
    );
    for k in [&b"holeA"[..], b"lateB", b"lateC"] {
        assert_eq!(node.client.get("default", k).await.expect("get"), None);
    }
    // Same size as the damaged record: it lands in the hole, and ends where lateB begins.
    node.client
        .put("default", b"newD", block(9, len), Durability::Durable)
        .await
        .expect("put");
    node.restart().await; // kill -9
    let s = node.client.stats().await.expect("stats");
    assert_eq!(
        (s.recovered_records, s.block_count),
        (1, 2),
        "only newD comes back from the tail"
    );
    assert_eq!(
        node.client.get("default", b"newD").await.expect("get"),
        Some(block(9, len))
    );
    for k in [&b"lateB"[..], b"lateC"] {
        assert_eq!(node.client.get("default", k).await.expect("get"), None);
    }
}

/// `kill -9` while scrub passes run (1 MiB/s: every kill lands in the middle of one), with
/// one record gone bad on the drive: after every restart each good block reads back
/// byte-exact, the bad one is a miss (never wrong bytes, never back), nothing else is ever
/// found bad, and a block deleted before the loop never comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_scrub_loses_nothing_and_resurrects_nothing() {
    let cycles = common::seed_from_env("CTXPOD_SCRUB_CRASH_CYCLES", 6);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let dir = tempfile::tempdir().expect("tempdir");
    let data_dir = dir.path().join("n");
    let mut node = Node::scrubbing(&data_dir, "1MiB").await;
    let key = |i: u64| format!("sc{i:03}").into_bytes();
    let n = 200u64;
    for i in 0..n {
        common::put_durable(&node.client, "default", &key(i), block(i, 30_000)).await;
    }
    assert!(node
        .client
        .delete("default", &key(7))
        .await
        .expect("delete"));
    node.kill9();
    {
        let dev = open_device(&data_dir);
        let recs = records(&dev);
        flip(
            &dev,
            recs[&key(3)].0 + ctxpod_format::record::HEADER_BYTES as u64 + 9,
        );
        dev.sync_all().expect("sync");
    }
    let mut passes_seen = 0.0;
    for cycle in 0..cycles {
        node.restart().await;
        for i in 0..n {
            let got = node.client.get("default", &key(i)).await.expect("get");
            let want = (i != 3 && i != 7).then(|| block(i, 30_000));
            assert_eq!(got, want, "cycle {cycle}: block {i}");
        }
        let delay = rng.gen_range(1000..1600);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        let m = node.client.metrics().await.expect("metrics");
        passes_seen += common::metric_of(&m, "ctxpod_scrub_pass_records");
        assert_eq!(
            common::metric_of(&m, "ctxpod_scrub_records_total{outcome=\"bad\"}"),
            0.0
        );
        node.kill9();
    }
    assert!(passes_seen > 0.0, "no kill landed in a scrub pass");
}
