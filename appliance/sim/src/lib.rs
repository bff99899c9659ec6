//! A deterministic simulation of a pod (docs/design/0004-pod-simulation.md).
//!
//! One seed gives one run: a pod of N members, each the real engine on a firmware-sim
//! device (its index in RocksDB in a temporary directory) joined through the real
//! [`ctxpod_pod::Pod::join_on`] — membership, registration with its fence, tombstones —
//! over one in-memory coordination store ([`ctxpod_pod::meta::mem::MemMeta`]) reached
//! through a simulated network ([`net`]), each member running the real backfill, in three
//! zones. Clients put, delete (recorded as a tombstone and settled by the real
//! [`ctxpod_pod::settle`]), read (any member directly, or through one that asks the pod)
//! and list keys, all through the real coordinator, while the network is cut and healed,
//! etcd stopped and started, members restarted, and etcd's clock drifts within the fence's
//! margin. All of it runs on one thread with tokio's clock paused: time moves only when
//! every task waits, so the same seed gives the same run, and a run of minutes of pod time
//! takes milliseconds.
//!
//! After every read and listing the run checks the pod's promises ([`Violation`]): no
//! member serves or lists a block after the pod acknowledged its delete, no wrong bytes; at
//! the end, with the network healed, every acknowledged block that was not deleted is still
//! held, and soon after by each of its first R members, in distinct zones.
//!
//! Every event goes into a trace whose hash the run reports: the same seed must give the
//! same hash (`same_seed_same_trace` checks it).
//!
//! Here: a run's parameters, what it found, and the run itself (its members started and
//! stopped, its steps). The clients are in `workload`, the faults in `faults`, the end of
//! a run and its checks in `checks`, how members ask each other in `reach`, and the
//! network with etcd behind it in [`net`].

mod checks;
mod faults;
pub mod net;
mod reach;
#[cfg(test)]
mod scenarios;
mod workload;

use bytes::Bytes;
use ctxpod_pod::coordinator::{self, Member as _};
use ctxpod_pod::meta::mem::MemMeta;
use ctxpod_pod::meta::Meta;
use ctxpod_pod::Pod;
use net::{Net, NetMeta};
use reach::{Op, Reached, Running, SimAnswer, SimMember};
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Copies of each block.
const R: usize = 2;
/// The members' lease TTL, seconds.
const LEASE_TTL_S: u64 = 3;
/// Bytes of each block (its bytes derive from its key).
const BLOCK: usize = 4096;
/// Keys a page of a listing.
const LIST_PAGE: usize = 64;
/// Deleted blocks remembered for reads to favour.
const RECENT: usize = 8;
/// The namespace every block is written to.
const NS: &str = "default";
/// How often each member's backfill makes a pass (`pod.backfill_interval_s`).
const BACKFILL_INTERVAL_S: u64 = 30;
/// How long a member gone from the view may stay away before its blocks are copied again
/// (`pod.repair_grace_s`).
const REPAIR_GRACE_S: u64 = 10;
/// Zones of the pod: member `m` is in zone `m % ZONES`.
const ZONES: usize = 3;
/// How long after the network heals (and every member runs again) every block is back to R
/// copies on its first R members (docs/OPERATIONS.md, "Backfill"): a lease to see the view
/// again, the backfill's 2 s settle, a request in flight into a black hole at the heal
/// (`backfill::REQUEST_TIMEOUT`, 30 s), and the pass's own copying (a few MiB here).
const RESTORED_WITHIN: Duration = Duration::from_secs(LEASE_TTL_S + 2 + 30 + 5);

/// A bug planted on purpose, to show the simulation finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plant {
    /// Members serve without their fence (the pod before it had one): a member cut from
    /// etcd and its peers serves a block the pod deleted meanwhile.
    NoFence,
    /// A delete is not recorded as a tombstone, so not settled either (the pod before it
    /// had tombstones): it reaches the members that answer, and a member away keeps its
    /// copy and serves it when it returns.
    UnrecordedDeletes,
    /// No backfill: the copies a put could not place at a block's first R members (one
    /// was away or cut off) stay where they landed, and a member back after a fault
    /// misses what was written meanwhile.
    NoBackfill,
    /// etcd's clock runs twice as fast as the members' (beyond the fence's margin,
    /// `fence::CLOCK_MARGIN`): etcd expires a cut member's lease while that member still
    /// counts on it, and a delete acknowledged meanwhile is served there.
    ClockBeyondMargin,
}

impl Plant {
    pub fn name(self) -> &'static str {
        match self {
            Plant::NoFence => "no-fence",
            Plant::UnrecordedDeletes => "unrecorded-deletes",
            Plant::NoBackfill => "no-backfill",
            Plant::ClockBeyondMargin => "clock-beyond-margin",
        }
    }

    pub fn from_name(s: &str) -> Option<Plant> {
        [
            Plant::NoFence,
            Plant::UnrecordedDeletes,
            Plant::NoBackfill,
            Plant::ClockBeyondMargin,
        ]
        .into_iter()
        .find(|p| p.name() == s)
    }
}

/// The gate of [`Plant::NoFence`]: always open.
struct Unfenced;

impl ctxpod_engine::ServeGate for Unfenced {
    fn may_serve(&self) -> bool {
        true
    }
}

/// What one run is made of.
#[derive(Debug, Clone)]
pub struct Params {
    pub seed: u64,
    /// Members in the pod.
    pub members: usize,
    /// Client operations and faults, in all.
    pub steps: usize,
    pub plant: Option<Plant>,
}

impl Params {
    /// The run of `seed`: a pod of 3 to `max_members` members (the seed chooses).
    pub fn of_seed(seed: u64, max_members: usize, steps: usize) -> Params {
        let span = max_members.max(3) - 3 + 1;
        Params {
            seed,
            members: 3 + Rng::new(seed).below(span as u64) as usize,
            steps,
            plant: None,
        }
    }

    /// The command that replays this run.
    pub fn replay_command(&self) -> String {
        let plant = match self.plant {
            Some(p) => format!(" --plant {}", p.name()),
            None => String::new(),
        };
        format!(
            "cargo run -p ctxpod-sim -- --seed {} --members {} --steps {}{plant} --trace",
            self.seed, self.members, self.steps
        )
    }
}

/// A promise broken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// A member served a block after the pod acknowledged its delete.
    Resurrected { key: u64, member: usize },
    /// A member served other bytes than the block's.
    WrongBytes { key: u64, member: usize },
    /// An acknowledged block, never deleted, held by no member once the network healed.
    Lost { key: u64 },
    /// An acknowledged block, never deleted, not held by one of its first R members
    /// [`RESTORED_WITHIN`] after the network healed (its R copies, in distinct zones, not
    /// restored).
    NotRestored { key: u64, member: usize },
    /// A listing that began after a block's delete was acknowledged listed it.
    ListedDeleted { key: u64, member: usize },
    /// A block's first R members are not in distinct zones though the pod has R zones.
    SameZone { key: u64 },
}

/// What a run did and found.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// The hash of the run's trace (the same seed gives the same hash).
    pub trace_hash: u64,
    pub trace: Vec<String>,
    pub violations: Vec<Violation>,
    pub puts_acked: u64,
    pub puts_refused: u64,
    pub deletes_acked: u64,
    pub deletes_unsettled: u64,
    pub reads_hit: u64,
    pub reads_missed: u64,
    /// Listings that answered, and those refused (a member could not answer, or fenced).
    pub lists: u64,
    pub lists_refused: u64,
    pub faults: u64,
    /// Simulated time the run covered.
    pub simulated: Duration,
    /// Runs summed into this outcome (1 for one run).
    pub runs: u64,
}

impl Outcome {
    /// Adds another run's counts to these (its trace and violations are not kept).
    pub fn add(&mut self, o: &Outcome) {
        self.puts_acked += o.puts_acked;
        self.puts_refused += o.puts_refused;
        self.deletes_acked += o.deletes_acked;
        self.deletes_unsettled += o.deletes_unsettled;
        self.reads_hit += o.reads_hit;
        self.reads_missed += o.reads_missed;
        self.lists += o.lists;
        self.lists_refused += o.lists_refused;
        self.faults += o.faults;
        self.simulated += o.simulated;
        self.runs += o.runs;
    }
}

pub use ctxpod_firmware_sim::rng::Rng;

/// Runs one seed on a runtime of its own (one thread, the clock paused).
pub fn run(p: &Params) -> anyhow::Result<Outcome> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()?;
    let out = rt.block_on(async { Run::new(p)?.go().await });
    rt.shutdown_timeout(Duration::from_secs(5));
    out
}

/// One member: its device (kept across restarts), and while it runs its engine and pod.
struct Member {
    dir: std::path::PathBuf,
    dev: Arc<ctxpod_firmware_sim::SimDevice>,
    up: Option<(Arc<ctxpod_engine::Engine>, Pod)>,
}

/// What the clients know of a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Known {
    /// Its put was acknowledged.
    Stored,
    /// Its delete was acknowledged at this time.
    Deleted(Instant),
    /// A delete was sent and not acknowledged: it may or may not be gone.
    Unsure,
}

struct Run {
    p: Params,
    rng: Rng,
    _tmp: tempfile::TempDir,
    meta: Arc<MemMeta>,
    /// How fast etcd's clock runs against the members'.
    clock_rate: f64,
    net: Arc<Net>,
    members: Vec<Member>,
    /// The members that run, as the others reach them.
    running: Arc<Running>,
    blocks: BTreeMap<u64, Known>,
    next_key: u64,
    /// When the fault in force heals (one at a time).
    fault_until: Option<Instant>,
    /// The member the fault in force strikes: deletes and reads favour its blocks.
    focus: Option<usize>,
    /// The members each block was written to (reads favour them).
    holders: BTreeMap<u64, Vec<usize>>,
    /// The blocks deleted last (reads favour them).
    recent: Vec<u64>,
    trace: std::collections::hash_map::DefaultHasher,
    out: Outcome,
    started: Instant,
}

fn key_of(k: u64) -> Vec<u8> {
    format!("sim-block-{k:08}").into_bytes()
}

/// The block number of a key made by [`key_of`].
fn key_number(key: &[u8]) -> Option<u64> {
    std::str::from_utf8(key.strip_prefix(b"sim-block-")?)
        .ok()?
        .parse()
        .ok()
}

fn bytes_of(k: u64) -> Bytes {
    let seed = k.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    Bytes::from(
        (0..BLOCK)
            .map(|i| (seed >> ((i % 8) * 8)) as u8 ^ i as u8)
            .collect::<Vec<u8>>(),
    )
}

/// How fast etcd's clock runs against the members' (which share one clock): within the
/// fence's margin either way, in steps of 0.1 %.
fn clock_rate(rng: &mut Rng) -> f64 {
    let max = (ctxpod_pod::fence::CLOCK_MARGIN * 1000.0) as u64 - 1;
    1.0 + (rng.below(2 * max + 1) as f64 - max as f64) / 1000.0
}

fn address(m: usize) -> SocketAddr {
    SocketAddr::from(([10, 77, (m / 250) as u8, (m % 250) as u8 + 1], 7070))
}

impl Run {
    fn new(p: &Params) -> anyhow::Result<Run> {
        // In memory where the machine has it: a run's indexes are throwaway.
        let shm = std::path::Path::new("/dev/shm");
        let tmp = match shm.is_dir() {
            true => tempfile::Builder::new()
                .prefix("ctxpod-sim")
                .tempdir_in(shm)?,
            false => tempfile::tempdir()?,
        };
        let members = (0..p.members)
            .map(|m| {
                let dir = tmp.path().join(format!("m{m:02}"));
                std::fs::create_dir_all(&dir)?;
                let dev = Arc::new(ctxpod_firmware_sim::SimDevice::new(
                    ctxpod_firmware_sim::Profile::load("tlc").map_err(anyhow::Error::msg)?,
                    ctxpod_firmware_sim::Media::memory(64 << 20),
                    ctxpod_firmware_sim::FaultPlan::none(),
                    false,
                ));
                Ok(Member { dir, dev, up: None })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let mut rng = Rng::new(p.seed);
        let meta = Arc::new(MemMeta::new());
        let clock_rate = match p.plant {
            Some(Plant::ClockBeyondMargin) => 2.0,
            _ => clock_rate(&mut rng),
        };
        meta.set_clock_rate(clock_rate);
        Ok(Run {
            p: p.clone(),
            rng,
            _tmp: tmp,
            meta,
            clock_rate,
            net: Arc::new(Net::new(p.seed ^ 0x6e65_7477_6f72_6b00)),
            running: Arc::new(Running::new(members.len())),
            members,
            blocks: BTreeMap::new(),
            next_key: 0,
            recent: Vec::new(),
            holders: BTreeMap::new(),
            fault_until: None,
            focus: None,
            trace: std::collections::hash_map::DefaultHasher::new(),
            out: Outcome::default(),
            started: Instant::now(),
        })
    }

    fn note(&mut self, line: String) {
        let at = self.started.elapsed().as_millis();
        let line = format!("{at:>7}ms {line}");
        line.hash(&mut self.trace);
        self.out.trace.push(line);
    }

    fn config(&self, m: usize) -> ctxpod_format::config::Config {
        let mut cfg = ctxpod_format::config::Config {
            data_dir: self.members[m].dir.clone(),
            capacity: ctxpod_format::config::ByteSize(64 << 20),
            region_bytes: Some(ctxpod_format::config::ByteSize(4 << 20)),
            dram: ctxpod_format::config::ByteSize(0),
            offload_threads: 1,
            // Its index is on tmpfs, opened for every member and restart.
            index_preallocate: false,
            ..Default::default()
        };
        cfg.pod.name = "sim".into();
        cfg.pod.node_id = Some(format!("m{m:02}"));
        cfg.pod.advertise_http = Some(format!("http://{}", address(m)));
        cfg.pod.lease_ttl_s = LEASE_TTL_S;
        cfg.pod.replication = R;
        cfg.pod.backfill_interval_s = match self.p.plant {
            Some(Plant::NoBackfill) => 0,
            _ => BACKFILL_INTERVAL_S,
        };
        cfg.pod.repair_grace_s = REPAIR_GRACE_S;
        cfg.pod.zone = format!("z{}", m % ZONES);
        cfg.scrub.interval_s = 0;
        cfg
    }

    /// Starts member `m` (its engine recovers what its device and index hold) and joins it
    /// to the pod; it stays down if it cannot join now (etcd unreachable).
    async fn start(&mut self, m: usize) -> anyhow::Result<()> {
        let cfg = self.config(m);
        let dev = Arc::new(ctxpod_engine::device::sim::SimBackend::new(
            self.members[m].dev.clone(),
        ));
        let engine = Arc::new(
            ctxpod_engine::Engine::open_on(
                cfg.clone(),
                Arc::new(ctxpod_engine::metrics::Metrics::new()),
                Some(dev),
            )
            .await?,
        );
        let meta: Arc<dyn Meta> = Arc::new(NetMeta {
            inner: self.meta.clone(),
            net: self.net.clone(),
            me: m,
        });
        if self.p.plant == Some(Plant::NoFence) {
            // The engine takes the first gate it is given: the pod's fence is then not it.
            engine.set_serve_gate(Arc::new(Unfenced));
        }
        match Pod::join_on(&cfg, meta, address(m), None, &engine, None).await {
            Ok(pod) => {
                let copies = reach::SimCopies {
                    running: self.running.clone(),
                    net: self.net.clone(),
                    from: m,
                };
                pod.start_background_over(engine.clone(), &cfg, false, Arc::new(copies));
                let reached = Reached {
                    engine: engine.clone(),
                    tombstones: pod.tombstones.as_ref().map(|(t, _)| t.clone()),
                };
                self.running.set(m, Some(reached));
                self.members[m].up = Some((engine, pod));
                self.note(format!("m{m:02} joined"));
            }
            Err(e) => {
                release(m, engine).await?;
                self.note(format!("m{m:02} could not join: {}", first_line(&e)));
            }
        }
        Ok(())
    }

    /// Stops member `m` without leaving the pod (its lease runs out), as a crash would.
    async fn stop(&mut self, m: usize) -> anyhow::Result<()> {
        if let Some((engine, pod)) = self.members[m].up.take() {
            self.running.set(m, None);
            drop(pod);
            release(m, engine).await?;
            self.note(format!("m{m:02} stopped"));
        }
        Ok(())
    }

    async fn go(mut self) -> anyhow::Result<Outcome> {
        self.note(format!(
            "etcd's clock runs {:.3} times as fast",
            self.clock_rate
        ));
        for m in 0..self.p.members {
            self.start(m).await?;
        }
        for _ in 0..self.p.steps {
            let pause = Duration::from_millis(self.rng.below(500));
            tokio::time::sleep(pause).await;
            self.heal_when_due();
            match self.rng.below(100) {
                0..=29 => self.put().await,
                30..=44 => self.delete().await,
                45..=79 => self.read().await,
                80..=89 => self.list().await,
                90..=97 => self.fault().await?,
                _ => self.restart().await?,
            }
        }
        self.finish().await?;
        self.out.trace_hash = self.trace.finish();
        self.out.simulated = self.started.elapsed();
        self.out.runs = 1;
        Ok(self.out)
    }

    /// The blocks whose put was acknowledged and that were not deleted.
    fn stored(&self) -> Vec<u64> {
        self.blocks
            .iter()
            .filter(|(_, s)| **s == Known::Stored)
            .map(|(k, _)| *k)
            .collect()
    }

    fn pod(&self, m: usize) -> &Pod {
        &self.members[m].up.as_ref().expect("a running member").1
    }
}

/// A refusal's kind, for the trace (its message may hold ids in any order).
fn refusal_name(r: &coordinator::Refusal) -> &'static str {
    match r {
        coordinator::Refusal::Unavailable(_) => "unavailable",
        coordinator::Refusal::NotRecordable(_) => "not recordable",
        coordinator::Refusal::NotRecorded { .. } => "not recorded",
        coordinator::Refusal::Unsettled { .. } => "unsettled",
    }
}

/// Stops an engine whose pod was dropped: its background tasks end when they next run
/// (they were cancelled), and the index closes with the last of them. One still held after
/// 30 s of pod time is a leak, and fails the run.
async fn release(m: usize, engine: Arc<ctxpod_engine::Engine>) -> anyhow::Result<()> {
    engine.shutdown().await;
    for _ in 0..300 {
        if Arc::strong_count(&engine) == 1 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::bail!(
        "m{m:02}: its engine is still held {} times 30 s after its pod stopped",
        Arc::strong_count(&engine) - 1
    )
}

fn first_line(e: &anyhow::Error) -> String {
    format!("{e:#}").lines().next().unwrap_or("").to_string()
}
