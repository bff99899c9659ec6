//! `ctxpod bench`: PUT and GET throughput and latency of a real node (this binary, started as
//! a child process on loopback), next to the device's own sequential bandwidth measured in
//! the same run on the same filesystem with O_DIRECT.
//!
//! Phases per block size: the device's own sequential write and read (through the node's
//! device layer, just before the node runs, so that a drifting virtual disk is compared
//! with itself) → durable PUT of `--bytes` → node restarted (DRAM tier empty) → cold GET
//! (every block from flash) → hot GET (every block from the DRAM tier). Every GET is checked
//! byte for byte. PUT and cold GET are also printed as a fraction of the device's write and
//! read bandwidth; `--repeat` runs everything again and prints the medians.

use anyhow::{ensure, Context};
use bytes::Bytes;
use ctxpod_client::client::Client;
use ctxpod_client::transfer_client::TransferClient;
use ctxpod_engine::device::{self, AlignedBuf, IoEngine};
use ctxpod_format::config::ByteSize;
use ctxpod_testkit::block;
use ctxpod_wire::Durability;
use futures::StreamExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod baseline;
mod nodes;
mod pod;
mod repair;
mod scale;
mod sizes;
use baseline::fio_baseline;
use nodes::{Node, PerfRecord};
use pod::pod_bench;
use repair::repair_bench;
use scale::scale_check;
use sizes::{compare_transfer, measure_size, median, Limits};

#[derive(clap::Args, Clone)]
pub struct BenchArgs {
    /// Scratch folder on the filesystem to measure (emptied of bench files at the end).
    #[arg(long, default_value = "./ctxpod-bench")]
    pub dir: PathBuf,
    /// Block sizes: bytes with a unit, or `llama3-8b`, the model-shaped size (one layer's K
    /// and V for a 512-token block of a Llama-3-8B-like model in bf16: 2 MiB).
    #[arg(long, value_delimiter = ',', default_value = "64KiB,1MiB,4MiB", value_parser = parse_block_size)]
    pub sizes: Vec<ByteSize>,
    /// Bytes written (and read back) per block size.
    #[arg(long, default_value = "2GiB")]
    pub bytes: ByteSize,
    /// Requests in flight.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Blocks per request in the size phases: 1 (one PUT or GET each), or a batch (CXP1
    /// batch ops; HTTP `batch/put` and `batch/get`), fewer for blocks so large that the batch
    /// would not fit one 64 MiB frame (15 of 4 MiB).
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Bytes of the raw device baseline.
    #[arg(long, default_value = "2GiB")]
    pub device_bytes: ByteSize,
    /// Also write results as JSON lines here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Runs of the whole measurement (device baseline and node phases); with more than one,
    /// the medians are printed too.
    #[arg(long, default_value_t = 1)]
    pub repeat: u32,
    /// Devices to measure, one after the other: `file` (a file in `--dir`, O_DIRECT) or
    /// `sim:<profile>` (firmware-sim in real time, its medium a sparse file in `--dir`).
    #[arg(long, value_delimiter = ',', default_value = "file")]
    pub devices: Vec<String>,
    /// Run the node's CRC32C and AES-GCM on its request threads instead of the offload
    /// engines (the no-DPU baseline).
    #[arg(long)]
    pub offload_inline: bool,
    /// `http` (API v1) or `cxp1` (the transfer protocol: one block per request, pipelined
    /// over 4 connections), or `compare`: per size, one PUT, then cold batch GET over HTTP,
    /// cold batch GET over CXP1 and cold PREFETCH into client memory regions, on the same
    /// data in the same run; and MATCH latency of a 1,000-key chain over both.
    #[arg(long, default_value = "http")]
    pub protocol: String,
    /// Serve both listeners over TLS and connect the clients with it (a CA and a server
    /// certificate for 127.0.0.1 are made for the run with rcgen).
    #[arg(long)]
    pub tls: bool,
    /// Format the node with `encrypt_at_rest = false`: block records stored unencrypted
    /// (the "encryption off" arm of the TLS + encryption comparison).
    #[arg(long)]
    pub no_encrypt_at_rest: bool,
    /// Bytes each of the machine's limits is measured over (one-core CRC32C, AES-256-GCM
    /// and memcpy; one loopback TCP stream), before the node runs; 0 skips them.
    #[arg(long, default_value = "2GiB")]
    pub limits_bytes: ByteSize,
    /// Scale check instead of the size phases: for each count (e.g. `10K,1M,10M`), a fresh
    /// node is loaded with that many blocks of `--scale-block` bytes, then GET latency (one
    /// at a time), GET throughput (`--concurrency` at once) and the node's RSS are measured.
    /// Each block takes at least one 4 KiB record on the device: 10M blocks need ~42 GB.
    #[arg(long, value_delimiter = ',', value_parser = parse_count)]
    pub scale: Vec<u64>,
    /// Block size of the scale check.
    #[arg(long, default_value = "1KiB")]
    pub scale_block: ByteSize,
    /// Pod benchmark instead of the size phases: for each node count (e.g. `1,2,3`), a fresh
    /// pod of that many nodes on loopback (static membership, `--pod-replication` copies),
    /// driven by the pod client (`PodClient`, HTTP, each request straight to its member):
    /// durable PUT, then two GETs (the first from flash, the second from DRAM) of `--bytes`
    /// of blocks of the first `--sizes`, at `--concurrency`; aggregate GB/s, the nodes' CPU,
    /// and the placement skew.
    #[arg(long, value_delimiter = ',')]
    pub pod: Vec<usize>,
    /// Copies of each block in the `--pod` benchmark.
    #[arg(long, default_value_t = 1)]
    pub pod_replication: usize,
    /// Repair benchmark instead of the size phases: a pod of three over a real etcd
    /// (started for the run), R = 2, `--bytes` of blocks of the first `--sizes`; one member
    /// killed for good, and the time until every block has two copies again, the bytes
    /// copied and the copy rate, with reads checked byte for byte meanwhile.
    #[arg(long)]
    pub repair: bool,
    /// `pod.backfill_bytes_per_s` of the `--repair` pod (per node; the default is the
    /// node's own default).
    #[arg(long, default_value = "64MiB")]
    pub repair_rate: ByteSize,
    /// `pod.repair_grace_s` of the `--repair` pod.
    #[arg(long, default_value_t = 0)]
    pub repair_grace: u64,
    /// Record a system-wide CPU profile (`perf record -a`, node and bench client together)
    /// of every timed phase into this folder, one `<phase>-<size>.data` file each; read one
    /// with `perf report -i FILE --sort pid,dso,sym`. Needs `perf` on the PATH.
    #[arg(long)]
    pub perf: Option<PathBuf>,
}

/// A `--sizes` entry: bytes with a unit, or a model-shaped preset.
fn parse_block_size(s: &str) -> Result<ByteSize, String> {
    match s {
        // Llama-3-8B: 32 layers, 8 KV heads of 128 dims. One 512-token block of K and V in
        // bf16 is 32 × 8 × 128 × 2 × 2 × 512 bytes = 64 MiB, above the 8 MiB block limit, so
        // engines store it per layer (as LMCache's layer-wise mode does): 2 MiB blocks.
        "llama3-8b" => Ok(ByteSize(8 * 128 * 2 * 2 * 512)),
        _ => s.parse(),
    }
}

/// A count with an optional K (10^3) or M (10^6) suffix.
fn parse_count(s: &str) -> Result<u64, String> {
    let (num, mul) = match s.trim().to_ascii_uppercase() {
        t if t.ends_with('K') => (t[..t.len() - 1].to_string(), 1_000),
        t if t.ends_with('M') => (t[..t.len() - 1].to_string(), 1_000_000),
        t => (t, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("{s:?} is not a count like 10K, 1M or 2500"))
}

#[derive(serde::Serialize, Clone, Default)]
struct Row {
    run: u32,
    device: String,
    what: String,
    size: u64,
    ops: u64,
    gb_per_s: f64,
    /// Blocks (of `size`) per second: the phase's ops/s when one request carries one block;
    /// IOPS for fio's rows.
    blocks_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    p999_ms: f64,
    /// This figure over the device's own bandwidth (write for PUT, read for cold GET),
    /// measured in the same run just before.
    of_device: Option<f64>,
    /// CPU seconds the node (all its threads) spent per GiB moved in this phase.
    node_cpu_s_per_gib: Option<f64>,
    /// CPU seconds the bench client spent per GiB moved in this phase.
    client_cpu_s_per_gib: Option<f64>,
    /// The phase's data-work floor ([`sizes::Limits::floor_of`]), CPU seconds per GiB, and
    /// the node's CPU over it.
    floor_cpu_s_per_gib: Option<f64>,
    node_cpu_of_floor: Option<f64>,
    /// The machine limit that bounds this figure (see [`bound_of`]) and the figure over it.
    bound: Option<String>,
    of_bound: Option<f64>,
}

/// CPU seconds (user + system) of process `pid` so far, from /proc.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some(ticks / hz)
}

/// CPU seconds of the node and of this process at the start of a phase.
struct CpuMark {
    node: Option<f64>,
    client: Option<f64>,
}

impl CpuMark {
    fn now(node: &Node) -> CpuMark {
        CpuMark {
            node: cpu_seconds(node.child.id()),
            client: cpu_seconds(std::process::id()),
        }
    }

    /// Fills `r`'s CPU seconds per GiB for a phase that moved `bytes`.
    fn per_gib(&self, node: &Node, bytes: u64, r: &mut Row) {
        let gib = bytes as f64 / (1u64 << 30) as f64;
        let per_gib = |before: Option<f64>, pid: u32| Some((cpu_seconds(pid)? - before?) / gib);
        r.node_cpu_s_per_gib = per_gib(self.node, node.child.id());
        r.client_cpu_s_per_gib = per_gib(self.client, std::process::id());
    }
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

impl Row {
    /// A row of `what` on `size`-byte blocks (I/Os) of the file device, its figures still
    /// to be filled in (run 0 until the run is known).
    fn of(what: &str, size: u64) -> Row {
        Row {
            device: "file".into(),
            what: what.into(),
            size,
            ..Row::default()
        }
    }
}

/// The row of a timed phase: `bytes` moved in `elapsed`, one latency per request.
fn row(what: &str, size: u64, bytes: u64, elapsed: Duration, mut lat: Vec<Duration>) -> Row {
    lat.sort();
    Row {
        ops: lat.len() as u64,
        gb_per_s: bytes as f64 / elapsed.as_secs_f64() / 1e9,
        p50_ms: pct(&lat, 0.5),
        p99_ms: pct(&lat, 0.99),
        p999_ms: pct(&lat, 0.999),
        ..Row::of(what, size)
    }
}

fn key(size: usize, i: u64) -> Vec<u8> {
    let mut k = (size as u64).to_be_bytes().to_vec();
    k.extend_from_slice(&i.to_be_bytes());
    k
}

/// Distinct block contents per size; block `i` holds `pool[i % POOL]`, so that generating
/// data does not take CPU from the node during a timed phase.
const POOL: u64 = 8;

/// One timed phase: `n` blocks of `size` bytes put or read, `batch` per request and `conc`
/// requests in flight, every byte checked (the row's `what` names the batch when above 1).
#[allow(clippy::too_many_arguments)]
async fn phase(
    node: &Node,
    size: usize,
    n: u64,
    conc: usize,
    what: &str,
    cxp1: bool,
    batch: usize,
) -> anyhow::Result<Row> {
    // One value a request may be as large as a node stores (a value over 8 MiB travels as
    // extents); a batch stays within one batch body.
    let one_value = batch == 1 && size as u64 <= ctxpod_wire::VALUE_BYTES_MAX_DEFAULT;
    ensure!(
        one_value
            || ((1..=ctxpod_wire::BATCH_ENTRIES_MAX).contains(&batch)
                && batch * size <= ctxpod_wire::BATCH_BODY_BYTES_MAX),
        "--batch {batch} of {} blocks is outside 1..=1024 blocks and 64 MiB per request \
         (a request of one value: up to 256 MiB)",
        ByteSize(size as u64)
    );
    let client = &node.client;
    let transfer = if cxp1 {
        transfer_clients(node).await?
    } else {
        Vec::new()
    };
    // The blocks and buffers are made before the CPU mark and the profile: making test data
    // is not the client's cost.
    let pool = block_pool(size);
    let kind = RequestKind::of(what, batch, size);
    let large_gets = !kind.put && batch == 1 && size > ctxpod_wire::BLOCK_BYTES_MAX;
    let buffers = &sizes::Buffers::of(if large_gets { conc } else { 0 }, size);
    let perf = start_perf(node, what, size).await?;
    let cpu0 = CpuMark::now(node);
    let t = Instant::now();
    let mut lat = Vec::with_capacity(n as usize);
    // `fast` puts store a second set of blocks (keys n..2n), acknowledged before their
    // flush; the GET phases read the durable set.
    let base = if matches!(kind.durability, Durability::Fast) {
        n
    } else {
        0
    };
    let requests = n.div_ceil(batch as u64);
    let mut s = futures::stream::iter((0..requests).map(|r| {
        let c = client.clone();
        let tc = transfer.get(r as usize % 4).cloned();
        let first = r * batch as u64;
        let idx: Vec<u64> = (first..(first + batch as u64).min(n)).collect();
        let blocks: Vec<PhaseBlock> = idx
            .iter()
            .map(|&i| {
                let (data, crc) = pool[(i % POOL) as usize].clone();
                (key(size, base + i), data, crc)
            })
            .collect();
        request(c, tc, kind, first, blocks, buffers)
    }))
    .buffer_unordered(conc);
    let mut progress = Progress::new(&format!("{what}, {}", ByteSize(size as u64)), requests);
    while let Some(r) = s.next().await {
        lat.push(r?);
        progress.step(lat.len() as u64);
    }
    progress.done();
    let elapsed = t.elapsed();
    if let Some(p) = perf {
        p.stop()?;
    }
    let what = if batch > 1 {
        format!("{what}, batch {batch}")
    } else {
        what.to_string()
    };
    // A BUSY answer costs its request a backoff (1, 2, 4, … ms): say how many there were.
    let busy: u64 = transfer.iter().map(|t| t.busy_retries()).sum();
    if busy > 0 {
        eprintln!("  {what}: {busy} requests or entries asked again after BUSY");
    }
    let mut r = row(&what, size as u64, n * size as u64, elapsed, lat);
    cpu0.per_gib(node, n * size as u64, &mut r);
    Ok(r)
}

/// A block of a phase's request: its key, its bytes and their CRC32C.
type PhaseBlock = (Vec<u8>, Bytes, u32);

/// The distinct blocks of `size` bytes (with their CRC32C) a phase cycles through.
fn block_pool(size: usize) -> Vec<(Bytes, u32)> {
    (0..POOL)
        .map(|i| {
            let b = block(i, size);
            let crc = ctxpod_wire::crc32c(&b);
            (b, crc)
        })
        .collect()
}

/// The 4 CXP1 connections a `cxp1` phase spreads its requests over.
async fn transfer_clients(node: &Node) -> anyhow::Result<Vec<std::sync::Arc<TransferClient>>> {
    let addr = node
        .transfer
        .as_deref()
        .context("the node has no transfer listener")?;
    let mut v = Vec::new();
    for _ in 0..4 {
        v.push(std::sync::Arc::new(
            TransferClient::connect_with(addr, &node.how).await?,
        ));
    }
    Ok(v)
}

/// Starts `perf record` for a timed phase when `--perf` asks for it (never for warm-up).
async fn start_perf(node: &Node, what: &str, size: usize) -> anyhow::Result<Option<PerfRecord>> {
    Ok(match &node.perf {
        Some(dir) if what != "warm-up" => {
            let p = PerfRecord::start(dir, what, size)?;
            // perf needs a moment to open its events on every CPU before the phase starts.
            tokio::time::sleep(Duration::from_millis(500)).await;
            Some(p)
        }
        _ => None,
    })
}

/// What every request of a phase does: put or get, how many blocks each, how durable.
#[derive(Clone, Copy)]
struct RequestKind {
    put: bool,
    batch: usize,
    size: usize,
    durability: Durability,
}

impl RequestKind {
    /// The requests of phase `what` (a `PUT…` phase puts; `PUT fast…` acknowledges early).
    fn of(what: &str, batch: usize, size: usize) -> RequestKind {
        let durability = if what.starts_with("PUT fast") {
            Durability::Fast
        } else {
            Durability::Durable
        };
        RequestKind {
            put: what.starts_with("PUT"),
            batch,
            size,
            durability,
        }
    }

    /// The complaint about block `first + i` of a request read back wrong, or not at all
    /// (`missing`).
    fn wrong(&self, first: u64, i: usize, missing: bool) -> String {
        let what = if missing {
            "is missing"
        } else {
            "came back wrong"
        };
        format!("block {} of {} bytes {what}", first + i as u64, self.size)
    }
}

/// One request of a phase, over CXP1 when `tc` is given, else HTTP: its latency. A GET of
/// one value over one record reads into one of `buffers`, as an engine reads into its pool.
async fn request(
    c: Client,
    tc: Option<std::sync::Arc<TransferClient>>,
    kind: RequestKind,
    first: u64,
    blocks: Vec<PhaseBlock>,
    buffers: &sizes::Buffers,
) -> anyhow::Result<Duration> {
    let t = Instant::now();
    if !kind.put && kind.batch == 1 && kind.size > ctxpod_wire::BLOCK_BYTES_MAX {
        let (k, data, _) = blocks.into_iter().next().context("a block")?;
        let got = buffers.get_into(&c, tc.as_deref(), &k, &data).await?;
        ensure!(got == Some(true), "{}", kind.wrong(first, 0, got.is_none()));
        return anyhow::Ok(t.elapsed());
    }
    match tc {
        Some(tc) => wire_request(&tc, kind, first, blocks).await?,
        None => http_request(&c, kind, first, blocks).await?,
    }
    anyhow::Ok(t.elapsed())
}

/// A request of a `cxp1` phase: one batch PUT or GET over the transfer protocol.
async fn wire_request(
    tc: &TransferClient,
    kind: RequestKind,
    first: u64,
    blocks: Vec<PhaseBlock>,
) -> anyhow::Result<()> {
    if kind.put {
        let wire_durability = match kind.durability {
            Durability::Fast => ctxpod_wire::proto::Durability::Fast,
            Durability::Durable => ctxpod_wire::proto::Durability::Durable,
        };
        let entries: Vec<(Bytes, Bytes)> = blocks
            .into_iter()
            .map(|(k, d, _)| (Bytes::from(k), d))
            .collect();
        let st = tc.put("default", &entries, wire_durability).await?;
        ensure!(
            st.iter().all(|&s| s == 201 || s == 200),
            "put of blocks from {first}: statuses {st:?}"
        );
    } else {
        let keys: Vec<Bytes> = blocks
            .iter()
            .map(|(k, _, _)| Bytes::from(k.clone()))
            .collect();
        let got = tc.get("default", &keys).await?;
        for (i, (g, (_, d, _))) in got.iter().zip(&blocks).enumerate() {
            ensure!(
                g.as_deref() == Some(&d[..]),
                "{}",
                kind.wrong(first, i, g.is_none())
            );
        }
    }
    Ok(())
}

/// A request of an `http` phase: one PUT or GET, or with a batch above 1 a batch PUT or GET.
async fn http_request(
    c: &Client,
    kind: RequestKind,
    first: u64,
    blocks: Vec<PhaseBlock>,
) -> anyhow::Result<()> {
    let durability = kind.durability;
    if kind.batch == 1 {
        let (k, data, crc) = blocks.into_iter().next().context("a block")?;
        if kind.put {
            c.put_with_crc("default", &k, data.clone(), crc, durability)
                .await?;
        } else {
            let got = c.get("default", &k).await?;
            ensure!(
                got.as_deref() == Some(&data[..]),
                "{}",
                kind.wrong(first, 0, got.is_none())
            );
        }
    } else if kind.put {
        let entries: Vec<(Vec<u8>, Bytes)> = blocks.into_iter().map(|(k, d, _)| (k, d)).collect();
        let st = c.batch_put("default", &entries, durability).await?;
        ensure!(
            st.iter().all(|&s| s == 201 || s == 200),
            "batch put of blocks from {first}: statuses {st:?}"
        );
    } else {
        let keys: Vec<Vec<u8>> = blocks.iter().map(|(k, _, _)| k.clone()).collect();
        let got = c.batch_get("default", &keys).await?;
        for (i, ((_, g), (_, d, _))) in got.iter().zip(&blocks).enumerate() {
            ensure!(
                g.as_deref() == Some(&d[..]),
                "{}",
                kind.wrong(first, i, g.is_none())
            );
        }
    }
    Ok(())
}

/// Progress of a long phase on stderr: a line redrawn in place on a terminal, a line every
/// 10 % otherwise (logs), nothing for phases under two seconds.
struct Progress {
    label: String,
    total: u64,
    started: Instant,
    shown_tenths: u64,
    tty: bool,
    drawn: bool,
}

impl Progress {
    fn new(label: &str, total: u64) -> Progress {
        use std::io::IsTerminal;
        Progress {
            label: label.to_string(),
            total: total.max(1),
            started: Instant::now(),
            shown_tenths: 0,
            tty: std::io::stderr().is_terminal(),
            drawn: false,
        }
    }

    fn step(&mut self, done: u64) {
        let elapsed = self.started.elapsed();
        if elapsed < Duration::from_secs(2) {
            return;
        }
        let tenths = done * 10 / self.total;
        let rate = done as f64 / elapsed.as_secs_f64();
        if self.tty {
            let width = 30;
            let filled = (done * width / self.total) as usize;
            eprint!(
                "\r  {} [{}{}] {done}/{} ({rate:.0}/s)",
                self.label,
                "#".repeat(filled),
                " ".repeat(width as usize - filled),
                self.total
            );
            self.drawn = true;
        } else if tenths > self.shown_tenths {
            self.shown_tenths = tenths;
            eprintln!(
                "  {}: {} % ({done} of {}, {rate:.0}/s)",
                self.label,
                tenths * 10,
                self.total
            );
        }
    }

    fn done(&self) {
        if self.drawn {
            eprintln!();
        }
    }
}

pub async fn run(a: BenchArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&a.dir)?;
    if !a.scale.is_empty() {
        return scale_check(&a).await;
    }
    if !a.pod.is_empty() {
        return pod_bench(&a).await;
    }
    if a.repair {
        return repair_bench(&a).await;
    }
    ensure!(a.repeat > 0, "--repeat must be at least 1");
    let mut rows = limit_rows(&a);
    if let Some(fio) = fio_baseline(&a.dir, a.device_bytes.0) {
        rows.extend(fio);
    }
    for run in 1..=a.repeat {
        measure_run(&a, run, &mut rows).await?;
    }
    for r in rows.iter_mut() {
        r.blocks_per_s = r.gb_per_s * 1e9 / r.size.max(1) as f64;
    }
    let limits = Limits::of(&rows);
    for r in rows.iter_mut().filter(|r| r.run > 0) {
        if let Some((name, gb)) = limits.bound_of(r) {
            r.of_bound = Some(r.gb_per_s / gb);
            r.bound = Some(name);
        }
        r.floor_cpu_s_per_gib = limits.floor_of(&r.what, !a.no_encrypt_at_rest);
        r.node_cpu_of_floor = r
            .node_cpu_s_per_gib
            .zip(r.floor_cpu_s_per_gib)
            .map(|(n, f)| n / f);
    }
    print_rows(&rows);
    if a.repeat > 1 {
        print_medians(&rows, a.repeat);
    }
    if let Some(p) = &a.json {
        write_json_lines(p, &rows)?;
    }
    Ok(())
}

/// The rows of the machine's limits (`--limits-bytes`; none when 0).
fn limit_rows(a: &BenchArgs) -> Vec<Row> {
    let mut rows = Vec::new();
    if a.limits_bytes.0 > 0 {
        eprintln!("measuring the machine's limits ({} each)", a.limits_bytes);
        for l in crate::limits::measure(a.limits_bytes.0) {
            rows.push(Row {
                device: "machine".into(),
                ops: a.limits_bytes.0 >> 20,
                gb_per_s: l.gb_per_s,
                ..Row::of(l.what, 1 << 20)
            });
        }
    }
    rows
}

/// Run number `run` of the measurement: every device, every size (or the comparison),
/// its rows appended to `rows` and labelled with the run and the device.
async fn measure_run(a: &BenchArgs, run: u32, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    for device in &a.devices {
        if a.protocol == "compare" {
            let first = rows.len();
            compare_transfer(a, device, rows).await?;
            rows[first..].iter_mut().for_each(|r| {
                r.run = run;
                r.device = device.clone();
            });
            continue;
        }
        for size in &a.sizes {
            let first = rows.len();
            measure_size(a, size.0 as usize, device, rows).await?;
            let label = match a.protocol.as_str() {
                "http" => device.clone(),
                p => format!("{device} over {p}"),
            };
            rows[first..].iter_mut().for_each(|r| {
                r.run = run;
                r.device = label.clone();
            });
        }
    }
    Ok(())
}

/// A CPU-seconds-per-GiB cell: blank when unknown.
fn fmt_cpu(v: Option<f64>) -> String {
    v.map_or(String::new(), |v| format!("{v:.2}"))
}

/// A fraction as a percentage cell: blank when unknown.
fn fmt_pct(v: Option<f64>) -> String {
    v.map_or(String::new(), |f| format!("{:.0} %", f * 100.0))
}

/// A node-CPU cell: seconds per GiB, and the multiple of the phase's data-work floor.
fn fmt_node_cpu(v: Option<f64>, of_floor: Option<f64>) -> String {
    match (v, of_floor) {
        (Some(v), Some(f)) => format!("{v:.2} ({f:.1}× floor)"),
        (v, _) => fmt_cpu(v),
    }
}

/// The "of bound" cell: the fraction of the named bound, blank without either.
fn fmt_bound(bound: &Option<String>, of_bound: Option<f64>) -> String {
    match (bound, of_bound) {
        (Some(b), Some(f)) => format!("{:.0} % of {b}", f * 100.0),
        _ => String::new(),
    }
}

/// Prints every row as a Markdown table on stdout.
fn print_rows(rows: &[Row]) {
    println!(
        "| run | device | what | block | ops | GB/s | blocks/s | p50 ms | p99 ms | p999 ms | of device | of bound | node CPU s/GiB | floor s/GiB | client CPU s/GiB |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {} | {} | {} | {} | {:.3} | {:.0} | {:.2} | {:.2} | {:.2} | {} | {} | {} | {} | {} |",
            r.run,
            r.device,
            r.what,
            ByteSize(r.size),
            r.ops,
            r.gb_per_s,
            r.blocks_per_s,
            r.p50_ms,
            r.p99_ms,
            r.p999_ms,
            fmt_pct(r.of_device),
            fmt_bound(&r.bound, r.of_bound),
            fmt_node_cpu(r.node_cpu_s_per_gib, r.node_cpu_of_floor),
            fmt_cpu(r.floor_cpu_s_per_gib),
            fmt_cpu(r.client_cpu_s_per_gib)
        );
    }
}

/// Prints the medians over the `repeat` runs of each (device, what, size), as a table.
fn print_medians(rows: &[Row], repeat: u32) {
    println!();
    println!("Medians of {} runs:", repeat);
    println!();
    println!("| device | what | block | GB/s | p50 ms | p99 ms | of device | of bound | node CPU s/GiB | floor s/GiB |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut seen: Vec<(String, String, u64)> = Vec::new();
    for r in rows.iter().filter(|r| r.run > 0) {
        let id = (r.device.clone(), r.what.clone(), r.size);
        if seen.contains(&id) {
            continue;
        }
        seen.push(id);
        let same: Vec<&Row> = rows
            .iter()
            .filter(|o| o.run > 0 && o.device == r.device && o.what == r.what && o.size == r.size)
            .collect();
        let med = |f: &dyn Fn(&Row) -> Option<f64>| median(same.iter().filter_map(|r| f(r)));
        println!(
            "| {} | {} | {} | {:.3} | {:.2} | {:.2} | {} | {} | {} | {} |",
            r.device,
            r.what,
            ByteSize(r.size),
            med(&|r| Some(r.gb_per_s)).unwrap_or(0.0),
            med(&|r| Some(r.p50_ms)).unwrap_or(0.0),
            med(&|r| Some(r.p99_ms)).unwrap_or(0.0),
            fmt_pct(med(&|r| r.of_device)),
            fmt_bound(&r.bound, med(&|r| r.of_bound)),
            fmt_node_cpu(
                med(&|r| r.node_cpu_s_per_gib),
                med(&|r| r.node_cpu_of_floor)
            ),
            fmt_cpu(med(&|r| r.floor_cpu_s_per_gib))
        );
    }
}

/// `rows` as JSON lines in `path` (`--json`).
fn write_json_lines<T: serde::Serialize>(path: &Path, rows: &[T]) -> anyhow::Result<()> {
    let mut text = String::new();
    for r in rows {
        text.push_str(&serde_json::to_string(r)?);
        text.push('\n');
    }
    std::fs::write(path, text).with_context(|| format!("write {}", path.display()))
}
