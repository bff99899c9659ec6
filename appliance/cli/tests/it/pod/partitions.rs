//! The pod under real network partitions: etcd and nodes a, b and c each in a network
//! namespace of their own on one bridge (`ctxpod_testkit::netns`), links cut with nftables
//! (packets dropped both ways: a black hole, as a failed switch port or a firewall makes),
//! while blocks are deleted through the members that can still reach etcd.
//!
//! The promise held (docs/OPERATIONS.md, "Consistency under partitions"): no member serves
//! a block after the pod acknowledged its delete, whether it was cut off from everyone or
//! only from etcd and its peers while clients still reach it, during the cut and after it
//! heals; no acknowledged block that was not deleted is lost, and no byte is wrong.

use super::{held_here, wait_views};
use crate::common::etcd::EtcdServer;
use crate::common::Node;
use ctxpod_testkit::netns::Lan;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Blocks written before the cut.
const BLOCKS: u64 = 90;
/// A block's bytes (16 KiB, derived from its key).
const BLOCK_BYTES: usize = 16 << 10;
/// How long the cut lasts.
const CUT: Duration = Duration::from_secs(10);

fn key(i: u64) -> Vec<u8> {
    format!("part-{i:04}").into_bytes()
}

fn data(k: &[u8]) -> bytes::Bytes {
    ctxpod_testkit::content(k, BLOCK_BYTES)
}

/// A pod of a, b and c (R = 2, 3 s leases) over etcd, each on its own host of `lan`.
struct CutPod {
    // Dropped in this order: the nodes, etcd, then the network they ran on.
    nodes: Vec<Node>,
    etcd: EtcdServer,
    _tmp: tempfile::TempDir,
    lan: Lan,
    http: reqwest::Client,
}

impl CutPod {
    async fn start(name: &str) -> CutPod {
        Self::start_with(name, "").await
    }

    /// [`CutPod::start`] with `extra` lines of `[pod]`.
    async fn start_with(name: &str, extra: &str) -> CutPod {
        let lan = Lan::new(&["etcd", "a", "b", "c"]);
        let tmp = tempfile::tempdir().unwrap();
        let etcd = EtcdServer::start_on(tmp.path(), Some(lan.host("etcd")));
        let mut nodes = Vec::new();
        for id in ["a", "b", "c"] {
            // Plain HTTP, no tokens, on the bridge's addresses: a test network of its own.
            let config = format!(
                "[pod]\nname = \"{name}\"\nnode_id = \"{id}\"\nlease_ttl_s = 3\nreplication = 2\n{extra}{}\
                 [tls]\nallow_plaintext = true\n[auth]\nallow_unauthenticated = true\n",
                etcd.pod_lines()
            );
            let dir = tmp.path().join(id);
            nodes
                .push(Node::start_on(lan.host(id), &dir, &["--capacity", "256MiB"], &config).await);
        }
        wait_views(&nodes, 3).await;
        let http = reqwest::Client::builder()
            .use_preconfigured_tls(ctxpod_client::connect::untrusting_tls_config())
            .timeout(Duration::from_secs(15))
            .build()
            .unwrap();
        CutPod {
            nodes,
            etcd,
            _tmp: tmp,
            lan,
            http,
        }
    }

    fn url(&self, node: usize, k: &[u8]) -> String {
        format!(
            "{}/v1/namespaces/default/blocks/{}",
            self.nodes[node].url,
            hex::encode(k)
        )
    }

    /// Blocks `0..BLOCKS` put through a, each acknowledged (two copies).
    async fn fill(&self) -> Vec<Vec<u8>> {
        let keys: Vec<Vec<u8>> = (0..BLOCKS).map(key).collect();
        for k in &keys {
            let r = self
                .http
                .put(self.url(0, k))
                .body(data(k))
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success(), "put: {}", r.status());
        }
        keys
    }

    /// Which of `keys` node c holds (a third of them and more: the test needs them).
    async fn held_by_c(&self, keys: &[Vec<u8>]) -> Vec<Vec<u8>> {
        let on_c: Vec<Vec<u8>> = keys
            .iter()
            .zip(held_here(&self.nodes[2], "default", keys).await)
            .filter(|(_, held)| *held)
            .map(|(k, _)| k.clone())
            .collect();
        assert!(on_c.len() >= 30, "c holds {} of {BLOCKS}", on_c.len());
        on_c
    }

    /// Deletes `k` through node `through`, sent again while it answers 503 (30 s at most,
    /// a liveness bound): when it was acknowledged.
    async fn delete_acknowledged(&self, through: usize, k: &[u8]) -> Instant {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let r = self.http.delete(self.url(through, k)).send().await;
            match r {
                Ok(r) if r.status().is_success() || r.status() == 404 => return Instant::now(),
                Ok(r) if r.status() == 503 => {}
                Ok(r) => panic!("delete through {through}: {}", r.status()),
                Err(e) if e.is_timeout() => {}
                Err(e) => panic!("delete through {through}: {e}"),
            }
            assert!(Instant::now() < deadline, "delete not acknowledged in 30 s");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// A read of `k` through node `node`: `Some(bytes)` on 200, `None` on a miss or any
    /// other answer (an unreachable member, a timeout: not a block served).
    async fn read(&self, node: usize, k: &[u8]) -> Option<bytes::Bytes> {
        let r = self.http.get(self.url(node, k)).send().await.ok()?;
        if r.status() != 200 {
            return None;
        }
        r.bytes().await.ok()
    }
}

/// What reads saw: deleted blocks served after their delete was acknowledged, kept blocks
/// missing, wrong bytes.
#[derive(Debug, Default)]
struct Seen {
    reads: u64,
    resurrected: Vec<(usize, String)>,
    lost: Vec<(usize, String)>,
    wrong: u64,
}

/// `reads` in a few words: how many, of how many blocks, the first few.
fn summary(reads: &[(usize, String)]) -> String {
    let blocks: std::collections::BTreeSet<&str> = reads.iter().map(|r| r.1.as_str()).collect();
    let first: Vec<_> = reads.iter().take(8).collect();
    format!(
        "{} reads of {} blocks (node, block), first: {first:?}",
        reads.len(),
        blocks.len()
    )
}

impl Seen {
    /// Fails the test with what `when` saw if a deleted block was served after its delete
    /// was acknowledged, a kept block was missing, or a byte was wrong.
    fn assert_clean(&self, when: &str) {
        assert!(
            self.resurrected.is_empty(),
            "{when}: deleted blocks served: {}",
            summary(&self.resurrected)
        );
        assert!(
            self.lost.is_empty(),
            "{when}: kept blocks missing: {}",
            summary(&self.lost)
        );
        assert_eq!(self.wrong, 0, "{when}: wrong bytes served");
    }

    /// One read of `k` through `node`, started at `at`; `deleted_at`: when its delete was
    /// acknowledged, if it was.
    fn note(
        &mut self,
        node: usize,
        k: &[u8],
        got: Option<bytes::Bytes>,
        at: Instant,
        deleted_at: Option<Instant>,
    ) {
        self.reads += 1;
        let name = String::from_utf8_lossy(k).to_string();
        match (got, deleted_at) {
            (Some(b), _) if b != data(k) => self.wrong += 1,
            (Some(_), Some(d)) if at > d => self.resurrected.push((node, name)),
            (None, None) => self.lost.push((node, name)),
            _ => {}
        }
    }
}

/// c cut off from everyone (etcd, a, b and the clients) for 10 s while every block it
/// holds is deleted through a and b: once the link is back, no member, c included, serves
/// one of them, and every other block reads back whole from a and b.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_isolated_for_10s_serves_no_deleted_block_after_the_heal() {
    let pod = CutPod::start("isolated").await;
    let keys = pod.fill().await;
    let on_c = pod.held_by_c(&keys).await;
    let cut_at = Instant::now();
    pod.lan.isolate("c");
    let mut deleted: HashMap<Vec<u8>, Instant> = HashMap::new();
    for (i, k) in on_c.iter().enumerate() {
        let at = pod.delete_acknowledged(i % 2, k).await;
        deleted.insert(k.clone(), at);
    }
    let deletes_took = cut_at.elapsed();
    tokio::time::sleep(CUT.saturating_sub(cut_at.elapsed())).await;
    pod.lan.heal("c");
    let healed = Instant::now();
    // For 10 s after the heal (c rejoins meanwhile): every block through every member.
    let mut seen = Seen::default();
    while healed.elapsed() < Duration::from_secs(10) {
        for k in &keys {
            for node in 0..3 {
                let at = Instant::now();
                let got = pod.read(node, k).await;
                // A kept block must read from a and b; c may still be rejoining.
                let lost_counts = node < 2 || got.is_some();
                let d = deleted.get(k).copied();
                if d.is_some() || lost_counts {
                    seen.note(node, k, got, at, d);
                }
            }
        }
    }
    eprintln!(
        "isolated c: {} blocks deleted during a {CUT:?} cut (deletes took {deletes_took:?}); \
         after the heal {} reads: {} resurrected, {} lost, {} wrong",
        deleted.len(),
        seen.reads,
        seen.resurrected.len(),
        seen.lost.len(),
        seen.wrong
    );
    seen.assert_clean("after the heal");
}

/// c cut off from etcd and from a and b, while clients still reach it, for 10 s; blocks
/// it holds are deleted through a meanwhile, and a client reads them through c all along
/// and for 5 s after the heal: not one is served after its delete was acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_cut_from_etcd_and_peers_but_reachable_serves_no_deleted_block() {
    let pod = Arc::new(CutPod::start("cutoff").await);
    let keys = pod.fill().await;
    let on_c = pod.held_by_c(&keys).await;
    let deleted: Arc<Mutex<HashMap<Vec<u8>, Instant>>> = Arc::default();
    pod.lan.cut("c", &["etcd", "a", "b"]);
    let cut_at = Instant::now();
    // The reader: every block c holds, through c, over and over until 5 s after the heal.
    let reading = {
        let (pod, deleted, on_c) = (pod.clone(), deleted.clone(), on_c.clone());
        tokio::spawn(async move {
            let mut seen = Seen::default();
            while cut_at.elapsed() < CUT + Duration::from_secs(5) {
                for k in &on_c {
                    let at = Instant::now();
                    let got = pod.read(2, k).await;
                    let d = deleted.lock().unwrap().get(k).copied();
                    // A miss through c is no loss: c may be out of the pod.
                    if got.is_some() {
                        seen.note(2, k, got, at, d);
                    } else {
                        seen.reads += 1;
                    }
                }
            }
            seen
        })
    };
    // Two thirds of c's blocks deleted through a, during the cut.
    for (i, k) in on_c.iter().enumerate() {
        if i % 3 == 2 {
            continue;
        }
        let at = pod.delete_acknowledged(0, k).await;
        deleted.lock().unwrap().insert(k.clone(), at);
    }
    let deletes_took = cut_at.elapsed();
    tokio::time::sleep(CUT.saturating_sub(cut_at.elapsed())).await;
    pod.lan.heal("c");
    let seen = reading.await.unwrap();
    // After the heal, every block c kept reads back whole through every member.
    let mut after = Seen::default();
    for (i, k) in on_c.iter().enumerate() {
        let d = deleted.lock().unwrap().get(k).copied();
        for node in 0..3 {
            let at = Instant::now();
            let got = pod.read(node, k).await;
            // A kept block must read from a and b; c may still be rejoining.
            if (i % 3 == 2 && node < 2) || got.is_some() {
                after.note(node, k, got, at, d);
            }
        }
    }
    eprintln!(
        "c cut from etcd and peers for {CUT:?}: {} deleted through a (in {deletes_took:?}); \
         {} reads through c: {} served after their delete; then {} reads: {} resurrected, \
         {} lost, {} wrong",
        deleted.lock().unwrap().len(),
        seen.reads,
        seen.resurrected.len(),
        after.reads,
        after.resurrected.len(),
        after.lost.len(),
        after.wrong + seen.wrong
    );
    seen.assert_clean("reads through c during the cut and after");
    after.assert_clean("after the heal");
}

/// etcd down for every member (killed: its address refuses connections), then started
/// again: reads go on through every member for longer than the lease TTL, deletes are
/// refused (503: no delete can be acknowledged without etcd) and remove nothing they do not
/// say; once etcd is back, deletes are acknowledged and stay deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_down_for_everyone_keeps_reads_and_acknowledges_no_delete() {
    let mut pod = CutPod::start("etcddown").await;
    let keys = pod.fill().await;
    pod.etcd.kill();
    let down_at = Instant::now();
    // Three lease TTLs without etcd: every block still reads through every member.
    let mut seen = Seen::default();
    while down_at.elapsed() < Duration::from_secs(9) {
        for k in keys.iter().step_by(3) {
            for node in 0..3 {
                let at = Instant::now();
                let got = pod.read(node, k).await;
                seen.note(node, k, got, at, None);
            }
        }
    }
    // A delete: 503, never acknowledged, and it says what it did.
    let r = pod.http.delete(pod.url(0, &keys[0])).send().await.unwrap();
    let status = r.status();
    let body = r.text().await.unwrap();
    assert_eq!(status, 503, "a delete without etcd: {body}");
    assert!(body.contains("not recorded"), "{body}");
    pod.etcd.restart();
    // Deletes are acknowledged again once the members hear from etcd.
    let mut deleted = HashMap::new();
    for (i, k) in keys.iter().enumerate().filter(|(i, _)| i % 3 == 1) {
        deleted.insert(k.clone(), pod.delete_acknowledged(i % 3, k).await);
    }
    let mut after = Seen::default();
    for k in &keys[1..] {
        for node in 0..3 {
            let at = Instant::now();
            let got = pod.read(node, k).await;
            let d = deleted.get(k).copied();
            after.note(node, k, got, at, d);
        }
    }
    eprintln!(
        "etcd down for everyone for {:?}: {} reads, {} missing, {} wrong; after its return \
         {} deleted, {} reads: {} resurrected, {} lost",
        down_at.elapsed(),
        seen.reads,
        seen.lost.len(),
        seen.wrong,
        deleted.len(),
        after.reads,
        after.resurrected.len(),
        after.lost.len()
    );
    seen.assert_clean("while etcd was down");
    after.assert_clean("after etcd returned");
}

/// c cut one way (what it sends to etcd, a and b is dropped; what they send arrives) in the
/// middle of puts and deletes through a and b, healed in the middle of them again: every
/// acknowledged put reads back whole, no deleted block is served after its delete was
/// acknowledged, through any member, during the cut or after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_way_cut_healed_amid_puts_and_deletes_loses_and_resurrects_nothing() {
    let pod = Arc::new(CutPod::start("oneway").await);
    let keys = pod.fill().await;
    let deleted: Arc<Mutex<HashMap<Vec<u8>, Instant>>> = Arc::default();
    let put: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let run = Duration::from_secs(14);
    let started = Instant::now();
    let writer = {
        let (pod, put) = (pod.clone(), put.clone());
        tokio::spawn(async move {
            let mut i = 1000;
            while started.elapsed() < run {
                let k = key(i);
                let r = pod
                    .http
                    .put(pod.url(i as usize % 2, &k))
                    .body(data(&k))
                    .send()
                    .await;
                if r.is_ok_and(|r| r.status().is_success()) {
                    put.lock().unwrap().push(k);
                }
                i += 1;
            }
        })
    };
    let deleter = {
        let (pod, deleted, keys) = (pod.clone(), deleted.clone(), keys.clone());
        tokio::spawn(async move {
            for (i, k) in keys.iter().enumerate().filter(|(i, _)| i % 2 == 0) {
                if started.elapsed() >= run {
                    break;
                }
                let at = pod.delete_acknowledged(1 - i % 2, k).await;
                deleted.lock().unwrap().insert(k.clone(), at);
            }
        })
    };
    let reader = {
        let (pod, deleted, keys) = (pod.clone(), deleted.clone(), keys.clone());
        tokio::spawn(async move {
            let mut seen = Seen::default();
            let mut n = 0usize;
            while started.elapsed() < run + Duration::from_secs(3) {
                let k = &keys[n % keys.len()];
                let node = n % 3;
                n += 1;
                let at = Instant::now();
                let got = pod.read(node, k).await;
                let d = deleted.lock().unwrap().get(k).copied();
                if got.is_some() {
                    seen.note(node, k, got, at, d);
                } else {
                    seen.reads += 1;
                }
            }
            seen
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    pod.lan.cut_one_way("c", &["etcd", "a", "b"]);
    tokio::time::sleep(Duration::from_secs(8)).await;
    pod.lan.heal("c");
    writer.await.unwrap();
    deleter.await.unwrap();
    let seen = reader.await.unwrap();
    // Every acknowledged put, and every block not deleted, reads back whole through a and b.
    let put = put.lock().unwrap().clone();
    let deleted = deleted.lock().unwrap().clone();
    let mut after = Seen::default();
    for k in keys.iter().chain(put.iter()) {
        for node in 0..2 {
            let at = Instant::now();
            let got = pod.read(node, k).await;
            after.note(node, k, got, at, deleted.get(k).copied());
        }
    }
    eprintln!(
        "one-way cut of c amid {} puts and {} deletes: {} reads during, {} stale, {} wrong; \
         after: {} reads, {} resurrected, {} lost, {} wrong",
        put.len(),
        deleted.len(),
        seen.reads,
        seen.resurrected.len(),
        seen.wrong,
        after.reads,
        after.resurrected.len(),
        after.lost.len(),
        after.wrong
    );
    seen.assert_clean("amid the puts and deletes");
    after.assert_clean("after the heal");
}

/// c cut off from everyone for longer than `pod.tombstone_retention_s` while the blocks it
/// holds are deleted, killed while still cut off, then started again after the heal: the
/// deletes' tombstones have expired meanwhile, so c cannot know what it missed and must
/// empty itself before it rejoins. It counts the time it was away from its last answer
/// from etcd, not from the last time it wrote its state file (which it went on doing while
/// cut off).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_cut_off_past_the_retention_then_restarted_comes_back_empty() {
    let mut pod = CutPod::start_with("retention", "tombstone_retention_s = 10\n").await;
    let keys = pod.fill().await;
    let on_c = pod.held_by_c(&keys).await;
    pod.lan.isolate("c");
    let mut deleted = HashMap::new();
    for (i, k) in on_c.iter().enumerate() {
        deleted.insert(k.clone(), pod.delete_acknowledged(i % 2, k).await);
    }
    // The tombstones expire (the retention and a sixteenth, plus etcd's lease clock).
    let metrics = format!("{}/metrics", pod.nodes[0].url);
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let m = pod
            .http
            .get(&metrics)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if ctxpod_testkit::metric_of(&m, "ctxpod_pod_tombstones") == 0.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "tombstones still held 40 s later"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    pod.nodes[2].kill9();
    pod.lan.heal("c");
    pod.nodes[2].restart().await;
    wait_views(&pod.nodes, 3).await;
    let m = pod.nodes[2].client.metrics().await.unwrap();
    let emptied = ctxpod_testkit::metric_of(&m, "ctxpod_pod_emptied_on_return_total");
    let mut seen = Seen::default();
    let back = Instant::now();
    while back.elapsed() < Duration::from_secs(5) {
        for k in &on_c {
            for node in 0..3 {
                let at = Instant::now();
                let got = pod.read(node, k).await;
                seen.note(node, k, got, at, deleted.get(k).copied());
            }
        }
    }
    eprintln!(
        "c cut off past the retention, restarted: emptied {emptied}; {} reads of its {} \
         deleted blocks: {} resurrected",
        seen.reads,
        on_c.len(),
        seen.resurrected.len()
    );
    seen.assert_clean("after c's return");
    assert_eq!(emptied, 1.0, "c did not empty itself on return");
}

/// A member cut from etcd and its peers (still reachable by clients) cannot show it is in
/// the pod: as it serves no block (a miss), it lists no key (503: it cannot say what the
/// pod holds), so a block deleted meanwhile is never listed through it, neither in its own
/// listing nor in its page of a pod's listing (a request marked as routed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_cut_from_etcd_and_peers_lists_no_deleted_key() {
    let pod = CutPod::start("fencedlist").await;
    let keys = pod.fill().await;
    let on_c = pod.held_by_c(&keys).await;
    assert!(!on_c.is_empty(), "c holds some of the blocks");
    pod.lan.cut("c", &["etcd", "a", "b"]);
    // Acknowledged once c dropped out of the pod (its lease ran out): c keeps its copies.
    for k in &on_c {
        pod.delete_acknowledged(0, k).await;
    }
    let list = format!("{}/v1/namespaces/default/blocks", pod.nodes[2].url);
    let deleted: Vec<String> = on_c.iter().map(hex::encode).collect();
    let mut answers = Vec::new();
    for routed in [false, true] {
        let mut req = pod.http.get(&list);
        if routed {
            req = req.header(ctxpod_wire::HEADER_ROUTED, "a");
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let body: serde_json::Value = r.json().await.unwrap_or_default();
        let listed: Vec<String> = body["keys"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|k| k.as_str().map(str::to_string))
            .filter(|k| deleted.contains(k))
            .collect();
        eprintln!(
            "c's listing (routed: {routed}): {status}, {} deleted keys listed",
            listed.len()
        );
        assert!(
            listed.is_empty(),
            "c listed deleted keys (routed: {routed}): {listed:?}"
        );
        answers.push(status);
    }
    // Its own reads miss meanwhile (marked as routed: c alone answers).
    for k in &on_c {
        let r = pod.http.get(pod.url(2, k));
        let r = r
            .header(ctxpod_wire::HEADER_ROUTED, "a")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "c served a deleted block");
    }
    assert_eq!(
        answers,
        [503, 503],
        "a fenced member cannot say what it holds"
    );
    pod.lan.heal("c");
}
