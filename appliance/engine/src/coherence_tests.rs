//! The engine against a plain model: seeded random put, re-put (same bytes and other
//! bytes), get, head, match, pin, hold, delete and namespace delete, run concurrently by
//! several workers while a churn task evicts, checked after every operation and in a
//! quiescent check after every round.
//!
//! What is checked:
//! - a GET answers `None` or the bytes of a version of the block that was stored before the
//!   GET ended and not removed (deleted, replaced after an eviction, namespace deleted)
//!   before it began: never wrong, stale or resurrected bytes;
//! - a put answers as the model says (created, exists, conflict) given what may have been
//!   evicted;
//! - when quiescent, HEAD, MATCH, pin and hold answer exactly what GET serves; a block the
//!   model holds reads back unless an eviction of it was announced (KV events).
//!
//! `CTXPOD_COHERENCE_OPS` sets the number of operations (default 100 000; docs/RELIABILITY.md
//! gives the 10^7 command), `CTXPOD_COHERENCE_SEED` the seed. A failure prints the seed.

use super::*;
use ctxpod_format::config::ByteSize;
use parking_lot::Mutex as PlMutex;
use rand::{Rng, SeedableRng};
use std::collections::HashMap as Map;

const WORKERS: usize = 4;
const KEYS_PER_NS: u32 = 48;
/// Operations between two quiescent checks.
const ROUND_OPS: usize = 2_000;
const NAMESPACES: [&str; 2] = ["default", "m1"];

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Block key `k<i>`.
fn key(i: u32) -> Vec<u8> {
    format!("k{i:03}").into_bytes()
}

/// The bytes of version `v` of key `i` of namespace slot `ns`: the version in the first
/// eight bytes, a length and filler that depend on all three, so that any two versions
/// differ in length or content.
fn content(ns: usize, i: u32, v: u64) -> Bytes {
    let seed = (ns as u64) << 48 ^ (i as u64) << 32 ^ v;
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    let len = r.gen_range(64..24_000usize);
    let mut b = vec![0u8; len.max(8)];
    b[..8].copy_from_slice(&v.to_le_bytes());
    r.fill(&mut b[8..]);
    Bytes::from(b)
}

/// What the model knows of one key. Versions of a key only grow; its mutations are made by
/// one worker (its owner), its reads by any.
#[derive(Default)]
struct KeyModel {
    /// The version the node holds unless it was evicted since (`None`: absent).
    current: Option<u64>,
    /// Every version up to this one is dead: deleted, replaced or its namespace deleted.
    dead_upto: u64,
    /// The highest version whose put has been issued.
    issued: u64,
    /// Evictions of this key announced (KV events) when `current` was stored.
    evictions_at_store: u64,
}

#[derive(Default)]
struct Model {
    keys: Map<(usize, u32), KeyModel>,
}

/// Evictions announced per (namespace id, key), counted by a subscriber of the node's KV
/// events.
#[derive(Default)]
struct Evictions {
    by_key: Map<(u32, Vec<u8>), u64>,
    lagged: bool,
    /// Markers seen, per namespace id (see `sync_events`).
    markers: Map<(u32, Vec<u8>), ()>,
}

struct World {
    e: Engine,
    model: PlMutex<Model>,
    evictions: Arc<PlMutex<Evictions>>,
    seed: u64,
    /// Namespace ids by slot, as of the last (re)creation.
    ns_ids: PlMutex<[u32; 2]>,
}

impl World {
    fn fail(&self, what: String) -> ! {
        panic!("coherence divergence (seed {}): {what}", self.seed)
    }

    fn evicted_since_store(&self, slot: usize, i: u32) -> bool {
        let id = self.ns_ids.lock()[slot];
        let ev = self.evictions.lock();
        let now = ev.by_key.get(&(id, key(i))).copied().unwrap_or(0);
        let m = self.model.lock();
        let at = m.keys.get(&(slot, i)).map_or(0, |k| k.evictions_at_store);
        ev.lagged || now > at
    }

    fn evictions_now(&self, slot: usize, i: u32) -> u64 {
        let id = self.ns_ids.lock()[slot];
        let ev = self.evictions.lock();
        ev.by_key.get(&(id, key(i))).copied().unwrap_or(0)
    }

    /// Checks the bytes a GET of (slot, i) answered: `dead` and `issued` are the model's
    /// bounds read before and after the GET.
    fn check_read(&self, slot: usize, i: u32, got: &Option<(Bytes, u32)>, dead: u64, issued: u64) {
        let Some((b, crc)) = got else { return };
        if b.len() < 8 {
            self.fail(format!("{slot}/{i}: a {}-byte block", b.len()));
        }
        let v = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
        if *b != content(slot, i, v) {
            self.fail(format!("{slot}/{i}: wrong bytes (version {v} claimed)"));
        }
        if *crc != crc32c::crc32c(b) {
            self.fail(format!("{slot}/{i}: wrong CRC32C"));
        }
        if v <= dead {
            self.fail(format!(
                "{slot}/{i}: version {v} served, dead (up to {dead}) before the GET began"
            ));
        }
        if v > issued {
            self.fail(format!("{slot}/{i}: version {v} served, never stored"));
        }
    }

    fn bounds(&self, slot: usize, i: u32) -> (u64, u64) {
        let m = self.model.lock();
        m.keys
            .get(&(slot, i))
            .map_or((0, 0), |k| (k.dead_upto, k.issued))
    }

    async fn get(&self, slot: usize, i: u32) -> Option<(Bytes, u32)> {
        let (dead, _) = self.bounds(slot, i);
        let got = self
            .e
            .get(NAMESPACES[slot], &key(i))
            .await
            .unwrap_or_else(|e| self.fail(format!("get {slot}/{i}: {e}")));
        let (_, issued) = self.bounds(slot, i);
        self.check_read(slot, i, &got, dead, issued);
        got
    }

    /// The owner's mutation of (slot, i): one of put new / put same / put other / delete.
    async fn mutate(&self, slot: usize, i: u32, op: u32) {
        let ns = NAMESPACES[slot];
        let cur = self.model.lock().keys.entry((slot, i)).or_default().current;
        match (op, cur) {
            // Store a new version when absent, or the same bytes again when present.
            (0, None) | (1, None) | (2, None) => self.put_new(slot, i).await,
            (0, Some(v)) => match self.put_version(slot, i, v).await {
                Ok(PutStatus::Exists) => {}
                // It was evicted; now stored again, the same version.
                Ok(PutStatus::Created) => self.stored(slot, i, |_| {}),
                other => self.fail(format!("re-put same {slot}/{i} v{v}: {other:?}")),
            },
            // Other bytes under a present key: a conflict, unless it was evicted, when the
            // new version replaces it.
            (1, Some(v)) => {
                let nv = self.issue(slot, i);
                match self.put_version(slot, i, nv).await {
                    Err(EngineError::Conflict) => {}
                    Ok(PutStatus::Created) => self.stored(slot, i, |k| {
                        k.current = Some(nv);
                        k.dead_upto = nv - 1;
                    }),
                    other => self.fail(format!("re-put other {slot}/{i} v{v}->{nv}: {other:?}")),
                }
            }
            (_, Some(v)) => {
                let r = self.e.delete(ns, &key(i)).await;
                match r {
                    Ok(_) => {
                        let mut m = self.model.lock();
                        let k = m.keys.get_mut(&(slot, i)).expect("key");
                        k.current = None;
                        k.dead_upto = k.issued.max(v);
                    }
                    other => self.fail(format!("delete {slot}/{i}: {other:?}")),
                }
            }
            (_, None) => {
                let r = self.e.delete(ns, &key(i)).await;
                if !matches!(r, Ok(false)) {
                    self.fail(format!("delete of absent {slot}/{i}: {r:?}"));
                }
            }
        }
    }

    async fn put_new(&self, slot: usize, i: u32) {
        let nv = self.issue(slot, i);
        match self.put_version(slot, i, nv).await {
            Ok(PutStatus::Created) => self.stored(slot, i, |k| k.current = Some(nv)),
            other => self.fail(format!("put new {slot}/{i} v{nv}: {other:?}")),
        }
    }

    /// The next version of (slot, i), counted as issued before it is put.
    fn issue(&self, slot: usize, i: u32) -> u64 {
        let mut m = self.model.lock();
        let k = m.keys.entry((slot, i)).or_default();
        k.issued += 1;
        k.issued
    }

    /// Puts version `v` of (slot, i).
    async fn put_version(&self, slot: usize, i: u32, v: u64) -> Result<PutStatus, EngineError> {
        let data = content(slot, i, v);
        let ns = NAMESPACES[slot];
        self.e.put(ns, &key(i), data, None, Durability::Fast).await
    }

    /// Records that (slot, i) was just stored (as of the evictions seen now), with `f`'s
    /// change to its model.
    fn stored(&self, slot: usize, i: u32, f: impl FnOnce(&mut KeyModel)) {
        let ev = self.evictions_now(slot, i);
        let mut m = self.model.lock();
        let k = m.keys.get_mut(&(slot, i)).expect("key");
        k.evictions_at_store = ev;
        f(k);
    }

    /// One worker's share of a round: mutations of its own keys, reads of anyone's.
    async fn work(&self, worker: usize, ops: usize, rng: &mut rand::rngs::StdRng) {
        for _ in 0..ops {
            let slot = rng.gen_range(0..NAMESPACES.len());
            let i = rng.gen_range(0..KEYS_PER_NS);
            let mine = i as usize % WORKERS == worker;
            match rng.gen_range(0..10) {
                0..=3 if mine => self.mutate(slot, i, rng.gen_range(0..4)).await,
                0..=6 => {
                    self.get(slot, i).await;
                }
                7 => {
                    let chain: Vec<Vec<u8>> = (i..KEYS_PER_NS.min(i + 8)).map(key).collect();
                    let n = self
                        .e
                        .match_prefix(NAMESPACES[slot], chain.clone())
                        .await
                        .unwrap_or_else(|e| self.fail(format!("match: {e}")));
                    if n as usize > chain.len() {
                        self.fail(format!("match answered {n} of {}", chain.len()));
                    }
                }
                _ => {
                    self.e
                        .contains(NAMESPACES[slot], &key(i))
                        .await
                        .unwrap_or_else(|e| self.fail(format!("head: {e}")));
                }
            }
        }
    }

    /// Waits until each namespace's event subscriber has seen every event emitted so far: a
    /// marker put into the namespace emits `Stored` after everything before it there.
    async fn sync_events(&self, round: usize) {
        let marker = format!("marker-{round}").into_bytes();
        for (slot, ns) in NAMESPACES.iter().enumerate() {
            self.e
                .put(
                    ns,
                    &marker,
                    Bytes::from_static(b"m"),
                    None,
                    Durability::Fast,
                )
                .await
                .expect("marker put");
            let id = self.ns_ids.lock()[slot];
            let deadline = Instant::now() + Duration::from_secs(30);
            while !self
                .evictions
                .lock()
                .markers
                .contains_key(&(id, marker.clone()))
            {
                assert!(Instant::now() < deadline, "the event subscriber stalled");
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    }

    /// Quiescent: every answer about every key agrees with GET, and GET with the model.
    async fn check_quiescent(&self, round: usize) {
        self.sync_events(round).await;
        for (slot, ns) in NAMESPACES.iter().enumerate() {
            let mut present = Vec::new();
            for i in 0..KEYS_PER_NS {
                let got = self.get(slot, i).await;
                let cur = self
                    .model
                    .lock()
                    .keys
                    .get(&(slot, i))
                    .and_then(|k| k.current);
                match (&got, cur) {
                    (Some(_), None) => self.fail(format!("{slot}/{i}: removed, yet served")),
                    (Some((b, _)), Some(v)) => {
                        let got_v = u64::from_le_bytes(b[..8].try_into().expect("8"));
                        if got_v != v {
                            self.fail(format!("{slot}/{i}: v{got_v} served, v{v} current"));
                        }
                    }
                    (None, Some(v)) => {
                        if !self.evicted_since_store(slot, i) {
                            self.fail(format!("{slot}/{i}: v{v} lost without an eviction"));
                        }
                        // Evicted: the model forgets it (a later re-put may replace it).
                        let mut m = self.model.lock();
                        let k = m.keys.get_mut(&(slot, i)).expect("key");
                        k.current = None;
                        k.dead_upto = k.issued;
                    }
                    (None, None) => {}
                }
                let head = self.e.contains(ns, &key(i)).await.expect("head");
                if head != got.is_some() {
                    self.fail(format!(
                        "{slot}/{i}: HEAD says {head}, GET {:?}",
                        got.is_some()
                    ));
                }
                present.push(got.is_some());
            }
            let chain: Vec<Vec<u8>> = (0..KEYS_PER_NS).map(key).collect();
            let matched = self.e.match_prefix(ns, chain.clone()).await.expect("match");
            let want = present.iter().take_while(|p| **p).count() as u64;
            if matched != want {
                self.fail(format!("{ns}: MATCH {matched}, GET serves {want} leading"));
            }
            let pinned = self
                .e
                .pin_each(ns, chain.clone(), Duration::from_secs(1))
                .await
                .expect("pin");
            if pinned != present {
                self.fail(format!("{ns}: pin disagrees with GET"));
            }
            self.e.unpin_each(ns, chain.clone()).await.expect("unpin");
            let keys = chain.into_iter().map(Bytes::from).collect();
            let (held, each) = self.e.hold(ns, keys).await.expect("hold");
            drop(held);
            if each != present {
                self.fail(format!("{ns}: hold disagrees with GET"));
            }
        }
    }

    /// Deletes namespace slot 1 and creates it again (a new id): every version dies.
    async fn recreate_namespace(&self) {
        self.e
            .delete_namespace(NAMESPACES[1])
            .await
            .expect("ns delete");
        {
            let mut m = self.model.lock();
            for ((slot, _), k) in m.keys.iter_mut() {
                if *slot == 1 {
                    k.current = None;
                    k.dead_upto = k.issued;
                }
            }
        }
        self.e
            .create_namespace(NAMESPACES[1], None)
            .await
            .expect("ns create");
        let id = self.e.ns(NAMESPACES[1]).expect("ns").id;
        self.ns_ids.lock()[1] = id;
    }
}

/// Counts the evictions of namespace `ns` (and its markers) in `evictions` until aborted.
fn subscribe(
    e: &Engine,
    ns: &str,
    evictions: Arc<PlMutex<Evictions>>,
) -> tokio::task::JoinHandle<()> {
    let (_, mut rx) = e.subscribe(ns).expect("subscribe");
    tokio::spawn(async move {
        loop {
            match rx.recv().await {
                Ok(ev) => {
                    let mut s = evictions.lock();
                    match ev.kind {
                        events::KvEventKind::Evicted => {
                            *s.by_key.entry((ev.ns_id, ev.key.to_vec())).or_default() += 1;
                        }
                        events::KvEventKind::Stored if ev.key.starts_with(b"marker-") => {
                            s.markers.insert((ev.ns_id, ev.key.to_vec()), ());
                        }
                        _ => {}
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    evictions.lock().lagged = true
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
            }
        }
    })
}

/// Churns `bytes` of 256 KiB `fast` blocks through namespace `churn`.
async fn churn(e: &Engine, round: usize, bytes: u64) {
    let block = Bytes::from(vec![0x5a; 256 << 10]);
    for j in 0..bytes / (256 << 10) {
        let k = format!("c{round}-{j}");
        e.put("churn", k.as_bytes(), block.clone(), None, Durability::Fast)
            .await
            .expect("churn put");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_engine_agrees_with_a_model_under_concurrency_and_eviction() {
    let ops = env_u64("CTXPOD_COHERENCE_OPS", 100_000) as usize;
    let seed = env_u64("CTXPOD_COHERENCE_SEED", 0x5eed);
    eprintln!("coherence: {ops} operations, seed {seed}");
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = Config {
        data_dir: dir.path().to_path_buf(),
        capacity: ByteSize(80 << 20),
        // Small, so the DRAM tier also evicts and readmits.
        dram: ByteSize(2 << 20),
        ..Config::default()
    };
    let e = Engine::open(cfg, Arc::new(Metrics::new()))
        .await
        .expect("open");
    for ns in ["m1", "churn"] {
        e.create_namespace(ns, None).await.expect("namespace");
    }
    let evictions = Arc::new(PlMutex::new(Evictions::default()));
    // Events come per namespace: one subscriber each (m1's again when it is recreated).
    let mut subscribers: Vec<_> = NAMESPACES
        .into_iter()
        .map(|ns| subscribe(&e, ns, evictions.clone()))
        .collect();
    let ids = [e.ns("default").expect("ns").id, e.ns("m1").expect("ns").id];
    let w = Arc::new(World {
        e,
        model: PlMutex::new(Model::default()),
        evictions,
        seed,
        ns_ids: PlMutex::new(ids),
    });
    let rounds = ops.div_ceil(ROUND_OPS);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for round in 0..rounds {
        let mut tasks = Vec::new();
        for worker in 0..WORKERS {
            let (w, mut r) = (w.clone(), rand::rngs::StdRng::seed_from_u64(rng.gen()));
            tasks.push(tokio::spawn(async move {
                w.work(worker, ROUND_OPS / WORKERS, &mut r).await
            }));
        }
        // A churn of 8 to 40 MiB a round: a region (16 MiB) is reclaimed every round or two.
        let churn_bytes = rng.gen_range(8u64..=40) << 20;
        let w2 = w.clone();
        tasks.push(tokio::spawn(async move {
            churn(&w2.e, round, churn_bytes).await
        }));
        for t in tasks {
            if let Err(e) = t.await {
                std::panic::resume_unwind(e.into_panic());
            }
        }
        w.check_quiescent(round).await;
        if round % 7 == 6 {
            w.recreate_namespace().await;
            subscribers.push(subscribe(&w.e, "m1", w.evictions.clone()));
            w.check_quiescent(round + 1_000_000).await;
        }
    }
    let s = w.e.stats();
    eprintln!(
        "coherence: {} operations in {rounds} rounds, 0 divergences; {} regions and {} blocks \
         evicted, {} DRAM hits, {} re-inserted; events lagged: {}",
        rounds * ROUND_OPS,
        s.evicted_regions,
        s.evicted_blocks,
        s.dram_hits,
        s.reinserted_blocks,
        w.evictions.lock().lagged
    );
    assert!(
        s.evicted_regions > 0 && s.dram_hits > 0,
        "the churn evicted, the DRAM tier served"
    );
    subscribers.iter().for_each(|s| s.abort());
    w.e.shutdown().await;
}
