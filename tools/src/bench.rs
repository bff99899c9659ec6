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
use ctxpod_wire::Durability;
use futures::StreamExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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
    /// batch ops; HTTP `batch/put` and `batch/get`). At most 64 MiB of blocks per request.
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

fn row(what: &str, size: u64, bytes: u64, elapsed: Duration, mut lat: Vec<Duration>) -> Row {
    lat.sort();
    Row {
        run: 0,
        device: "file".into(),
        of_device: None,
        node_cpu_s_per_gib: None,
        client_cpu_s_per_gib: None,
        what: what.into(),
        size,
        ops: lat.len() as u64,
        gb_per_s: bytes as f64 / elapsed.as_secs_f64() / 1e9,
        p50_ms: pct(&lat, 0.5),
        p99_ms: pct(&lat, 0.99),
        p999_ms: pct(&lat, 0.999),
        ..Row::default()
    }
}

/// Sequential O_DIRECT write (then flush) and read of the device file, 1 MiB I/Os, 8 in
/// flight, through the same device layer the node uses.
async fn device_baseline(dir: &Path, bytes: u64, spec: &str) -> anyhow::Result<(Row, Row)> {
    let path = dir.join("device-baseline.dat");
    let _ = std::fs::remove_file(&path);
    let dev: std::sync::Arc<dyn device::Device> = match spec.strip_prefix("sim:") {
        Some(profile) => {
            std::sync::Arc::new(device::sim::SimBackend::open(profile, &path, bytes, None)?)
        }
        None => device::open(&path, bytes, IoEngine::Auto)?,
    };
    let how = if spec == "file" { "O_DIRECT, " } else { "" };
    let chunk = 1u64 << 20;
    let n = bytes / chunk;
    let mut fill = AlignedBuf::zeroed(chunk as usize);
    for (i, b) in fill.iter_mut().enumerate() {
        *b = (i * 7 % 251) as u8;
    }
    let pattern = fill.to_vec();
    let mut lat = Vec::new();
    let t = Instant::now();
    let mut s = futures::stream::iter((0..n).map(|i| {
        let mut b = AlignedBuf::zeroed(chunk as usize);
        b.copy_from_slice(&pattern);
        let d = dev.clone();
        async move {
            let t = Instant::now();
            let (_, r) = d.write_at(b, i * chunk).await;
            r.map(|_| t.elapsed())
        }
    }))
    .buffer_unordered(8);
    while let Some(r) = s.next().await {
        lat.push(r?);
    }
    drop(s);
    dev.flush().await?;
    let w = row(
        &format!("device seq write ({how}1 MiB, QD8)"),
        chunk,
        n * chunk,
        t.elapsed(),
        lat,
    );
    let mut lat = Vec::new();
    let t = Instant::now();
    let mut s = futures::stream::iter((0..n).map(|i| {
        let d = dev.clone();
        async move {
            let t = Instant::now();
            let (_, r) = d
                .read_at(AlignedBuf::zeroed(chunk as usize), i * chunk)
                .await;
            r.map(|_| t.elapsed())
        }
    }))
    .buffer_unordered(8);
    while let Some(r) = s.next().await {
        lat.push(r?);
    }
    drop(s);
    let r = row(
        &format!("device seq read ({how}1 MiB, QD8)"),
        chunk,
        n * chunk,
        t.elapsed(),
        lat,
    );
    drop(dev);
    let _ = std::fs::remove_file(&path);
    Ok((w, r))
}

/// fio's sequential O_DIRECT bandwidth (1 MiB, QD8, io_uring), when fio is installed.
fn fio_baseline(dir: &Path, bytes: u64) -> Option<Vec<Row>> {
    let path = dir.join("fio-baseline.dat");
    // One fio job: `rw` in `bs` I/Os at `qd` in flight over `bytes` (random ones for at
    // most 5 s), its bandwidth in bytes/s and its IOPS.
    let run = |rw: &str, bs: &str, qd: u32, extra: &[&str]| -> Option<(f64, f64)> {
        let out = Command::new("fio")
            .args([
                "--name=ctxpod-baseline",
                "--ioengine=io_uring",
                "--direct=1",
                "--output-format=json",
                "--end_fsync=1",
            ])
            .arg(format!("--rw={rw}"))
            .arg(format!("--bs={bs}"))
            .arg(format!("--iodepth={qd}"))
            .args(extra)
            .arg(format!("--size={bytes}"))
            .arg(format!("--filename={}", path.display()))
            .output()
            .ok()?;
        if !out.status.success() {
            eprintln!("fio {rw} failed: {}", String::from_utf8_lossy(&out.stderr));
            return None;
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        let side = &v["jobs"][0][if rw.contains("write") {
            "write"
        } else {
            "read"
        }];
        Some((side["bw_bytes"].as_f64()?, side["iops"].as_f64()?))
    };
    let random = ["--runtime=5", "--randrepeat=0"];
    let w = run("write", "1M", 8, &[]);
    let r = run("read", "1M", 8, &[]);
    let rr64 = run("randread", "64k", 16, &random);
    let rr4 = run("randread", "4k", 32, &random);
    let rw64 = run("randwrite", "64k", 16, &random);
    // The ceiling of a durable write path on this device: the same writes with an fdatasync
    // every 4 MiB, 16 in flight (fio keeps writing while a sync is pending).
    let ws = run("write", "1M", 16, &["--fdatasync=4"]);
    let _ = std::fs::remove_file(&path);
    let mk = |what: &str, size: u64, (bw, iops): (f64, f64)| Row {
        run: 0,
        device: "file".into(),
        of_device: None,
        node_cpu_s_per_gib: None,
        client_cpu_s_per_gib: None,
        what: what.into(),
        size,
        ops: iops.round() as u64,
        gb_per_s: bw / 1e9,
        ..Row::default()
    };
    let mut rows = vec![
        mk("fio seq write (O_DIRECT, 1 MiB, QD8)", 1 << 20, w?),
        mk(
            "fio seq write + fdatasync every 4 MiB (O_DIRECT, 1 MiB, QD16)",
            1 << 20,
            ws?,
        ),
        mk("fio seq read (O_DIRECT, 1 MiB, QD8)", 1 << 20, r?),
    ];
    // Random I/O bounds small blocks.
    for (what, size, got) in [
        ("fio rand read (O_DIRECT, 64 KiB, QD16)", 64 << 10, rr64),
        ("fio rand read (O_DIRECT, 4 KiB, QD32)", 4 << 10, rr4),
        ("fio rand write (O_DIRECT, 64 KiB, QD16)", 64 << 10, rw64),
    ] {
        if let Some(got) = got {
            rows.push(mk(what, size, got));
        }
    }
    Some(rows)
}

struct Node {
    child: Child,
    client: Client,
    /// The CXP1 listener's address.
    transfer: Option<String>,
    /// How clients reach it (TLS with `--tls`).
    how: ctxpod_client::connect::Connect,
    /// Where `--perf` profiles of this node's phases go.
    perf: Option<PathBuf>,
}

/// A system-wide `perf record` around one timed phase (`--perf`); stopped with SIGINT, so
/// that perf writes its file, when the phase ends.
struct PerfRecord(Child);

impl PerfRecord {
    fn start(dir: &Path, what: &str, size: usize) -> anyhow::Result<PerfRecord> {
        std::fs::create_dir_all(dir)?;
        let name: String = format!("{what}-{}", ByteSize(size as u64))
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let file = dir.join(format!("{name}.data"));
        let child = Command::new("perf")
            .args(["record", "-a", "-F", "999", "-q", "-o"])
            .arg(&file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("--perf: start `perf record` (is perf installed?)")?;
        Ok(PerfRecord(child))
    }

    fn stop(mut self) -> anyhow::Result<()> {
        // SAFETY: sending SIGINT to our own child process.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGINT) };
        let st = self.0.wait()?;
        // perf writes its file on SIGINT, then ends by the same signal.
        use std::os::unix::process::ExitStatusExt;
        ensure!(
            st.success() || st.signal() == Some(libc::SIGINT),
            "perf record ended with {st}"
        );
        Ok(())
    }
}

/// A CA and a server certificate for 127.0.0.1, written under `dir`; the TOML that serves
/// them, and a client TLS configuration that trusts the CA.
fn bench_tls(dir: &Path) -> anyhow::Result<(String, std::sync::Arc<rustls::ClientConfig>)> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    std::fs::create_dir_all(dir)?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "ctxpod bench CA");
    let ca_key = KeyPair::generate()?;
    let ca = ca.self_signed(&ca_key)?;
    let mut srv = CertificateParams::new(vec!["127.0.0.1".to_string()])?;
    srv.distinguished_name
        .push(DnType::CommonName, "ctxpod bench node");
    let key = KeyPair::generate()?;
    let cert = srv.signed_by(&key, &ca, &ca_key)?;
    let (cf, kf) = (dir.join("node.crt"), dir.join("node.key"));
    std::fs::write(&cf, cert.pem())?;
    std::fs::write(&kf, key.serialize_pem())?;
    let toml = format!("[tls]\ncert_file = {cf:?}\nkey_file = {kf:?}\n");
    let client = ctxpod_client::connect::tls_client_config(ca.pem().as_bytes(), None)?;
    Ok((toml, std::sync::Arc::new(client)))
}

impl Node {
    async fn start(
        data_dir: &Path,
        capacity: u64,
        dram: u64,
        device: &str,
        a: &BenchArgs,
    ) -> anyhow::Result<Node> {
        let offload_inline = a.offload_inline;
        let exe = std::env::current_exe()?;
        let _ = std::fs::remove_file(data_dir.join("ctxpod.addr"));
        let mut cmd = Command::new(exe);
        cmd.args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--transfer-listen",
            "127.0.0.1:0",
        ]);
        if device != "file" {
            cmd.args(["--device", device]);
        }
        if offload_inline {
            cmd.env("CTXPOD_OFFLOAD_INLINE", "true");
        }
        if a.no_encrypt_at_rest {
            cmd.env("CTXPOD_ENCRYPT_AT_REST", "false");
        }
        let mut how = ctxpod_client::connect::Connect::default();
        if a.tls {
            let (toml, client) = bench_tls(&data_dir.with_extension("pki"))?;
            let f = data_dir.with_extension("toml");
            std::fs::write(&f, toml)?;
            cmd.arg("--config").arg(f);
            how.tls = Some(client);
        }
        let child = spawn_serve(cmd, data_dir, capacity, dram)?;
        let deadline = Instant::now() + Duration::from_secs(60);
        let addr = loop {
            if let Ok(a) = std::fs::read_to_string(data_dir.join("ctxpod.addr")) {
                break a.trim().to_string();
            }
            ensure!(Instant::now() < deadline, "node did not start within 60 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let transfer = std::fs::read_to_string(data_dir.join("ctxpod.transfer.addr"))
            .ok()
            .map(|a| a.trim().to_string());
        let scheme = if a.tls { "https" } else { "http" };
        Ok(Node {
            child,
            client: Client::connect(format!("{scheme}://{addr}"), &how)?,
            transfer,
            how,
            perf: a.perf.clone(),
        })
    }

    fn stop(mut self) -> anyhow::Result<()> {
        // SAFETY: sending SIGTERM to our own child process.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait()?;
        Ok(())
    }
}

impl Drop for Node {
    /// A bench that fails part-way must not leave its node running (holding its stdout and
    /// stderr, and its port). After `stop` the child has been reaped: `try_wait` says so and
    /// nothing is signalled.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn block(size: usize, i: u64) -> Bytes {
    let mut v = vec![0u8; size];
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for c in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
    }
    Bytes::from(v)
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
    ensure!(
        (1..=ctxpod_wire::BATCH_ENTRIES_MAX).contains(&batch)
            && batch * size <= ctxpod_wire::BATCH_BODY_BYTES_MAX,
        "--batch {batch} of {} blocks is outside 1..=1024 blocks and 64 MiB per request",
        ByteSize(size as u64)
    );
    let client = &node.client;
    let transfer: Vec<std::sync::Arc<TransferClient>> = if cxp1 {
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
        v
    } else {
        Vec::new()
    };
    let perf = match &node.perf {
        Some(dir) if what != "warm-up" => {
            let p = PerfRecord::start(dir, what, size)?;
            // perf needs a moment to open its events on every CPU before the phase starts.
            tokio::time::sleep(Duration::from_millis(500)).await;
            Some(p)
        }
        _ => None,
    };
    let cpu0 = CpuMark::now(node);
    let pool: Vec<(Bytes, u32)> = (0..POOL)
        .map(|i| {
            let b = block(size, i);
            let crc = ctxpod_wire::crc32c(&b);
            (b, crc)
        })
        .collect();
    let t = Instant::now();
    let mut lat = Vec::with_capacity(n as usize);
    let put = what.starts_with("PUT");
    // `fast` puts store a second set of blocks (keys n..2n), acknowledged before their
    // flush; the GET phases read the durable set.
    let fast = what.starts_with("PUT fast");
    let (base, durability) = if fast {
        (n, Durability::Fast)
    } else {
        (0, Durability::Durable)
    };
    let wire_durability = match durability {
        Durability::Fast => ctxpod_wire::proto::Durability::Fast,
        Durability::Durable => ctxpod_wire::proto::Durability::Durable,
    };
    let requests = n.div_ceil(batch as u64);
    let mut s = futures::stream::iter((0..requests).map(|r| {
        let c = client.clone();
        let tc = transfer.get(r as usize % 4).cloned();
        let first = r * batch as u64;
        let idx: Vec<u64> = (first..(first + batch as u64).min(n)).collect();
        let blocks: Vec<(Vec<u8>, Bytes, u32)> = idx
            .iter()
            .map(|&i| {
                let (data, crc) = pool[(i % POOL) as usize].clone();
                (key(size, base + i), data, crc)
            })
            .collect();
        async move {
            let t = Instant::now();
            let wrong =
                |i: usize| format!("block {} of {size} bytes came back wrong", first + i as u64);
            if let Some(tc) = tc {
                if put {
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
                        ensure!(g.as_deref() == Some(&d[..]), "{}", wrong(i));
                    }
                }
            } else if batch == 1 {
                let (k, data, crc) = blocks.into_iter().next().context("a block")?;
                if put {
                    c.put_with_crc("default", &k, data.clone(), crc, durability)
                        .await?;
                } else {
                    let got = c.get("default", &k).await?;
                    ensure!(got.as_deref() == Some(&data[..]), "{}", wrong(0));
                }
            } else if put {
                let entries: Vec<(Vec<u8>, Bytes)> =
                    blocks.into_iter().map(|(k, d, _)| (k, d)).collect();
                let st = c.batch_put("default", &entries, durability).await?;
                ensure!(
                    st.iter().all(|&s| s == 201 || s == 200),
                    "batch put of blocks from {first}: statuses {st:?}"
                );
            } else {
                let keys: Vec<Vec<u8>> = blocks.iter().map(|(k, _, _)| k.clone()).collect();
                let got = c.batch_get("default", &keys).await?;
                for (i, ((_, g), (_, d, _))) in got.iter().zip(&blocks).enumerate() {
                    ensure!(g.as_deref() == Some(&d[..]), "{}", wrong(i));
                }
            }
            anyhow::Ok(t.elapsed())
        }
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
    let mut r = row(&what, size as u64, n * size as u64, elapsed, lat);
    cpu0.per_gib(node, n * size as u64, &mut r);
    Ok(r)
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
    ensure!(a.repeat > 0, "--repeat must be at least 1");
    let mut rows = Vec::new();
    if a.limits_bytes.0 > 0 {
        eprintln!("measuring the machine's limits ({} each)", a.limits_bytes);
        for l in crate::limits::measure(a.limits_bytes.0) {
            rows.push(Row {
                device: "machine".into(),
                what: l.what.into(),
                size: 1 << 20,
                ops: a.limits_bytes.0 >> 20,
                gb_per_s: l.gb_per_s,
                ..Row::default()
            });
        }
    }
    if let Some(fio) = fio_baseline(&a.dir, a.device_bytes.0) {
        rows.extend(fio);
    }
    for run in 1..=a.repeat {
        for device in &a.devices {
            if a.protocol == "compare" {
                let first = rows.len();
                compare_transfer(&a, device, &mut rows).await?;
                rows[first..].iter_mut().for_each(|r| {
                    r.run = run;
                    r.device = device.clone();
                });
                continue;
            }
            for size in &a.sizes {
                let first = rows.len();
                measure_size(&a, size.0 as usize, device, &mut rows).await?;
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
    }
    println!(
        "| run | device | what | block | ops | GB/s | blocks/s | p50 ms | p99 ms | p999 ms | of device | of bound | node CPU s/GiB | client CPU s/GiB |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let cpu = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.2}"));
    let pct = |v: Option<f64>| v.map_or(String::new(), |f| format!("{:.0} %", f * 100.0));
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {} | {:.3} | {:.0} | {:.2} | {:.2} | {:.2} | {} | {} | {} | {} |",
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
            pct(r.of_device),
            match (&r.bound, r.of_bound) {
                (Some(b), Some(f)) => format!("{:.0} % of {b}", f * 100.0),
                _ => String::new(),
            },
            cpu(r.node_cpu_s_per_gib),
            cpu(r.client_cpu_s_per_gib)
        );
    }
    if a.repeat > 1 {
        println!();
        println!("Medians of {} runs:", a.repeat);
        println!();
        println!("| device | what | block | GB/s | p50 ms | p99 ms | of device | of bound | node CPU s/GiB |");
        println!("|---|---|---|---|---|---|---|---|---|");
        let mut seen: Vec<(String, String, u64)> = Vec::new();
        for r in rows.iter().filter(|r| r.run > 0) {
            let id = (r.device.clone(), r.what.clone(), r.size);
            if seen.contains(&id) {
                continue;
            }
            seen.push(id);
            let same: Vec<&Row> = rows
                .iter()
                .filter(|o| {
                    o.run > 0 && o.device == r.device && o.what == r.what && o.size == r.size
                })
                .collect();
            let med = |f: &dyn Fn(&Row) -> Option<f64>| median(same.iter().filter_map(|r| f(r)));
            println!(
                "| {} | {} | {} | {:.3} | {:.2} | {:.2} | {} | {} | {} |",
                r.device,
                r.what,
                ByteSize(r.size),
                med(&|r| Some(r.gb_per_s)).unwrap_or(0.0),
                med(&|r| Some(r.p50_ms)).unwrap_or(0.0),
                med(&|r| Some(r.p99_ms)).unwrap_or(0.0),
                pct(med(&|r| r.of_device)),
                match (&r.bound, med(&|r| r.of_bound)) {
                    (Some(b), Some(f)) => format!("{:.0} % of {b}", f * 100.0),
                    _ => String::new(),
                },
                cpu(med(&|r| r.node_cpu_s_per_gib))
            );
        }
    }
    if let Some(p) = &a.json {
        write_json_lines(p, &rows)?;
    }
    Ok(())
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

/// The machine's limits measured at the start of the run (rows of run 0).
struct Limits {
    loopback: Option<f64>,
    /// fio's sequential write with an fdatasync every 4 MiB: the device's flushed write.
    flushed_write: Option<f64>,
    /// fio's sequential write, flushed only at the end.
    write: Option<f64>,
}

impl Limits {
    fn of(rows: &[Row]) -> Limits {
        let find = |what: &str| {
            rows.iter()
                .find(|r| r.run == 0 && r.what.starts_with(what))
                .map(|r| r.gb_per_s)
        };
        Limits {
            // iperf3's one stream where it ran, else ctxpod's own loopback stream.
            loopback: find("iperf3 loopback TCP, one stream").or(find("loopback TCP")),
            flushed_write: find("fio seq write + fdatasync"),
            write: find("fio seq write (O_DIRECT"),
        }
    }

    /// The limit that bounds a phase, as the targets name them: a durable PUT by the
    /// device's flushed sequential write, a fast one by its plain sequential write; a cold read by the lesser of the device's read
    /// (measured just before that phase) and one loopback stream; a hot read by the loopback
    /// stream. (CRC32C and AES-GCM run on the offload engine's threads at 5-20 GB/s per core,
    /// never the lesser here; they are printed as limits all the same.)
    fn bound_of(&self, r: &Row) -> Option<(String, f64)> {
        let device_read = r.of_device.map(|f| r.gb_per_s / f);
        let lesser = |a: Option<(&'static str, f64)>, b: Option<(&'static str, f64)>| match (a, b) {
            (Some(a), Some(b)) => Some(if a.1 <= b.1 { a } else { b }),
            (a, b) => a.or(b),
        };
        let w = &r.what;
        let got = if w.starts_with("PUT durable") {
            self.flushed_write.map(|g| ("flushed device write", g))
        } else if w.starts_with("PUT fast") {
            self.write.map(|g| ("device write", g))
        } else if w.contains("cold") {
            lesser(
                device_read.map(|g| ("device read", g)),
                self.loopback.map(|g| ("loopback", g)),
            )
        } else if w.contains("hot") {
            self.loopback.map(|g| ("loopback", g))
        } else {
            None
        };
        got.map(|(n, g)| (n.to_string(), g))
    }
}

fn median(it: impl Iterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = it.collect();
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| v[v.len() / 2])
}

/// The device baseline, then PUT, cold GET and hot GET of one block size.
async fn measure_size(
    a: &BenchArgs,
    size: usize,
    device: &str,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    let n = (a.bytes.0 / size as u64).max(1);
    let total = n * size as u64;
    let cxp1 = match a.protocol.as_str() {
        "http" => false,
        "cxp1" => true,
        p => anyhow::bail!("unknown protocol {p:?} (http, cxp1)"),
    };
    eprintln!(
        "{device}, {size} B blocks: device baseline ({} on {})",
        a.device_bytes,
        a.dir.display()
    );
    let (dev_w, dev_r) = device_baseline(&a.dir, a.device_bytes.0, device).await?;
    let data_dir = a.dir.join(format!("node-{size}"));
    let _ = std::fs::remove_dir_all(&data_dir);
    // Room for every block plus eviction reserve. Cold reads run with a 16 MiB DRAM tier
    // (every read from flash, the tier churning as in steady state); hot reads with a
    // DRAM tier that holds the whole set, after an untimed pass that fills it.
    let capacity = (total * 2 + (1 << 30)).next_multiple_of(1 << 20);
    let dram_small = 16 << 20;
    let dram_big = total + total / 4 + (64 << 20);
    eprintln!("{size} B blocks: {n} blocks, {} per phase", ByteSize(total));
    let node = Node::start(&data_dir, capacity, dram_small, device, a).await?;
    let mut put = phase(&node, size, n, a.concurrency, "PUT durable", cxp1, a.batch).await?;
    put.of_device = Some(put.gb_per_s / dev_w.gb_per_s);
    let mut put_fast = phase(&node, size, n, a.concurrency, "PUT fast", cxp1, a.batch).await?;
    put_fast.of_device = Some(put_fast.gb_per_s / dev_w.gb_per_s);
    let s = node.client.stats().await?;
    let m = node.client.metrics().await?;
    let metric = |name: &str| {
        m.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let commits = metric("ctxpod_group_commit_blocks_count").max(1.0);
    eprintln!(
        "  engine {} direct={} device write amplification {:.4}; {} group commits, {:.1} \
         blocks and {:.2} ms each on average",
        s.io_engine,
        s.direct_io,
        s.write_amplification,
        commits,
        metric("ctxpod_group_commit_blocks_sum") / commits,
        metric("ctxpod_group_commit_duration_seconds_sum") / commits * 1e3
    );
    eprintln!(
        "  device flush {:.2} ms, index commit {:.2} ms on average",
        metric("ctxpod_device_flush_duration_seconds_sum")
            / metric("ctxpod_device_flush_duration_seconds_count").max(1.0)
            * 1e3,
        metric("ctxpod_index_commit_duration_seconds_sum")
            / metric("ctxpod_index_commit_duration_seconds_count").max(1.0)
            * 1e3
    );
    node.stop()?;
    let node = Node::start(&data_dir, capacity, dram_small, device, a).await?;
    let mut cold = phase(
        &node,
        size,
        n,
        a.concurrency,
        "GET cold (flash)",
        cxp1,
        a.batch,
    )
    .await?;
    cold.of_device = Some(cold.gb_per_s / dev_r.gb_per_s);
    let s = node.client.stats().await?;
    eprintln!(
        "  cold: {} of {} reads from flash",
        s.hits - s.dram_hits,
        s.hits
    );
    node.stop()?;
    let node = Node::start(&data_dir, capacity, dram_big, device, a).await?;
    phase(&node, size, n, a.concurrency, "warm-up", cxp1, a.batch).await?;
    let hot = phase(
        &node,
        size,
        n,
        a.concurrency,
        "GET hot (DRAM)",
        cxp1,
        a.batch,
    )
    .await?;
    let s = node.client.stats().await?;
    eprintln!("  hot: {} of {} reads from DRAM", s.dram_hits, s.hits);
    node.stop()?;
    let _ = std::fs::remove_dir_all(&data_dir);
    eprintln!(
        "  PUT {:.3} GB/s = {:.0} % of the device's write, cold GET {:.3} GB/s = {:.0} % of its read",
        put.gb_per_s,
        put.of_device.unwrap_or(0.0) * 100.0,
        cold.gb_per_s,
        cold.of_device.unwrap_or(0.0) * 100.0
    );
    rows.extend([dev_w, dev_r, put, put_fast, cold, hot]);
    Ok(())
}

/// Blocks per batch request and per prefetch ticket: 16, fewer for blocks so large that 16
/// would not fit one 64 MiB frame.
fn batch_of(size: usize) -> usize {
    (32usize << 20).div_ceil(size).clamp(1, 16)
}

/// `--protocol compare`: per size, the device baseline and one PUT (CXP1), then three cold
/// reads of the same blocks, each on a freshly started node (16 MiB DRAM tier): batch GET
/// over HTTP, batch GET over CXP1, PREFETCH over CXP1 into registered regions (every block
/// checked byte for byte in the region); then MATCH of a 1,000-key chain over both.
async fn compare_transfer(a: &BenchArgs, device: &str, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    for size in &a.sizes {
        let size = size.0 as usize;
        let n = (a.bytes.0 / size as u64).max(1);
        let total = n * size as u64;
        eprintln!("{device}, {size} B blocks: device baseline");
        let (_, dev_r) = device_baseline(&a.dir, a.device_bytes.0, device).await?;
        let data_dir = a.dir.join(format!("node-{size}"));
        let _ = std::fs::remove_dir_all(&data_dir);
        let capacity = (total * 2 + (1 << 30)).next_multiple_of(1 << 20);
        let dram = 16 << 20;
        let node = Node::start(&data_dir, capacity, dram, device, a).await?;
        phase(&node, size, n, a.concurrency, "PUT durable", true, 1).await?;
        node.stop()?;
        let mut got = Vec::new();
        for what in [
            "batch GET cold, HTTP",
            "batch GET cold, CXP1",
            "PREFETCH cold, CXP1",
        ] {
            let node = Node::start(&data_dir, capacity, dram, device, a).await?;
            let mut r = batch_phase(&node, size, n, what).await?;
            r.of_device = Some(r.gb_per_s / dev_r.gb_per_s);
            eprintln!(
                "  {what}: {:.3} GB/s ({:.0} % of the device's read)",
                r.gb_per_s,
                r.of_device.unwrap_or(0.0) * 100.0
            );
            got.push(r);
            node.stop()?;
        }
        eprintln!(
            "  PREFETCH = {:.0} % of cold batch GET over CXP1, {:.0} % of cold batch GET over HTTP",
            got[2].gb_per_s / got[1].gb_per_s * 100.0,
            got[2].gb_per_s / got[0].gb_per_s * 100.0
        );
        let _ = std::fs::remove_dir_all(&data_dir);
        rows.push(dev_r);
        rows.extend(got);
    }
    // MATCH: a chain of 1,000 small blocks, asked 2,000 times, one request at a time.
    let data_dir = a.dir.join("node-match");
    let _ = std::fs::remove_dir_all(&data_dir);
    let node = Node::start(&data_dir, 1 << 30, 16 << 20, device, a).await?;
    let addr = node.transfer.clone().context("no transfer listener")?;
    let tc = TransferClient::connect_with(&addr, &node.how).await?;
    let chain: Vec<Bytes> = (0..1000u64)
        .map(|i| Bytes::from(format!("chain-{i:04}").into_bytes()))
        .collect();
    for part in chain.chunks(100) {
        let blocks: Vec<(Bytes, Bytes)> =
            part.iter().map(|k| (k.clone(), block(4096, 1))).collect();
        tc.put("default", &blocks, ctxpod_wire::proto::Durability::Durable)
            .await?;
    }
    let raw: Vec<Vec<u8>> = chain.iter().map(|k| k.to_vec()).collect();
    for over in ["CXP1", "HTTP"] {
        let mut lat = Vec::with_capacity(2000);
        let t = Instant::now();
        for _ in 0..2000 {
            let t = Instant::now();
            let m = if over == "CXP1" {
                tc.match_prefix("default", &chain).await? as u64
            } else {
                node.client.match_prefix("default", &raw).await?
            };
            ensure!(m == 1000, "MATCH found {m} of 1000");
            lat.push(t.elapsed());
        }
        let r = row(
            &format!("MATCH 1000-key chain, {over}"),
            0,
            0,
            t.elapsed(),
            lat,
        );
        eprintln!(
            "  MATCH over {over}: p50 {:.3} ms, p99 {:.3} ms",
            r.p50_ms, r.p99_ms
        );
        rows.push(r);
    }
    node.stop()?;
    let _ = std::fs::remove_dir_all(&data_dir);
    Ok(())
}

/// Reads blocks `0..n` of `size` back in batches (HTTP batch GET, CXP1 GET, or CXP1
/// PREFETCH into regions), 4 connections with 2 batches in flight on each, every block
/// checked.
async fn batch_phase(node: &Node, size: usize, n: u64, what: &str) -> anyhow::Result<Row> {
    use ctxpod_client::region::Region;
    use ctxpod_client::transfer_client::{BlockState, PrefetchOptions};
    use ctxpod_wire::proto::PrefetchEntry;
    const CONNS: u64 = 4;
    const DEPTH: usize = 2;
    let batch = batch_of(size) as u64;
    let addr = node.transfer.clone().context("no transfer listener")?;
    let pool: Vec<Bytes> = (0..POOL).map(|i| block(size, i)).collect();
    let cpu0 = CpuMark::now(node);
    let batches = n.div_ceil(batch);
    let t = Instant::now();
    let lanes = (0..CONNS).map(|lane| {
        let (pool, addr, http) = (&pool, addr.clone(), node.client.clone());
        let how = node.how.clone();
        async move {
            let tc = TransferClient::connect_with(&addr, &how).await?;
            let region = Region::new(DEPTH * batch as usize * size)?;
            tc.register_region(&region).await?;
            let (tc, region, http) = (&tc, &region, &http);
            let jobs = (lane..batches).step_by(CONNS as usize).enumerate();
            let mut s = futures::stream::iter(jobs.map(|(j, b)| async move {
                let ids: Vec<u64> = (b * batch..((b + 1) * batch).min(n)).collect();
                let keys: Vec<Bytes> = ids.iter().map(|&i| Bytes::from(key(size, i))).collect();
                let want = |i: u64| &pool[(i % POOL) as usize][..];
                let t = Instant::now();
                if what.ends_with("HTTP") {
                    let raw: Vec<Vec<u8>> = keys.iter().map(|k| k.to_vec()).collect();
                    for ((_, got), &i) in http.batch_get("default", &raw).await?.iter().zip(&ids) {
                        ensure!(got.as_deref() == Some(want(i)), "block {i} came back wrong");
                    }
                } else if what.starts_with("batch") {
                    for (got, &i) in tc.get("default", &keys).await?.iter().zip(&ids) {
                        ensure!(got.as_deref() == Some(want(i)), "block {i} came back wrong");
                    }
                } else {
                    // Slot j % DEPTH of the region: the ordered stream below starts batch
                    // j + DEPTH only after batch j has been yielded (its ticket dropped).
                    let base = ((j % DEPTH) * batch as usize * size) as u64;
                    let entries = keys
                        .iter()
                        .enumerate()
                        .map(|(e, k)| PrefetchEntry {
                            key: k.clone(),
                            offset: base + (e * size) as u64,
                            max_len: size as u32,
                        })
                        .collect();
                    let ticket = tc
                        .prefetch("default", region, entries, PrefetchOptions::default())
                        .await?;
                    let p = ticket.wait().await;
                    for (e, &i) in ids.iter().enumerate() {
                        ensure!(
                            p.blocks[e] == BlockState::Landed { len: size as u32 }
                                && ticket.data(e) == Some(want(i)),
                            "block {i}: {:?}",
                            p.blocks[e]
                        );
                    }
                }
                anyhow::Ok(t.elapsed())
            }))
            .buffered(DEPTH);
            let mut lat = Vec::new();
            while let Some(r) = s.next().await {
                lat.push(r?);
            }
            anyhow::Ok(lat)
        }
    });
    let mut lat = Vec::new();
    for l in futures::future::join_all(lanes).await {
        lat.extend(l?);
    }
    let mut r = row(what, size as u64, n * size as u64, t.elapsed(), lat);
    cpu0.per_gib(node, n * size as u64, &mut r);
    Ok(r)
}

fn mib(bytes: f64) -> String {
    format!("{:.1} MiB", bytes / (1u64 << 20) as f64)
}

/// Resident memory of process `pid`, from /proc.
fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Bytes free on the filesystem holding `dir`.
fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: `statvfs` is a plain C struct of integers, for which all zeroes is valid.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and a statvfs struct to fill.
    (unsafe { libc::statvfs(c.as_ptr(), &mut st) } == 0)
        .then(|| st.f_bavail as u64 * st.f_frsize as u64)
}

fn du(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => du(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

/// Key `i` of a scale check: 16 bytes, spread like the hashes engines use.
fn scale_key(i: u64) -> Bytes {
    let mut k = Vec::with_capacity(16);
    k.extend_from_slice(&i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes());
    k.extend_from_slice(&i.to_be_bytes());
    Bytes::from(k)
}

#[derive(serde::Serialize)]
struct ScaleRow {
    blocks: u64,
    block_bytes: u64,
    load_s: f64,
    load_blocks_per_s: f64,
    get_p50_us: f64,
    get_p99_us: f64,
    get_ops_per_s: f64,
    rss_bytes: u64,
    /// RSS growth per million blocks from the smallest count of the run (none for it).
    rss_per_million_blocks: Option<f64>,
    index_bytes: u64,
}

/// `--scale`: op latency and throughput against the number of blocks indexed.
async fn scale_check(a: &BenchArgs) -> anyhow::Result<()> {
    let size = a.scale_block.0 as usize;
    ensure!(
        size > 0 && size <= ctxpod_wire::BLOCK_BYTES_MAX,
        "--scale-block must be 1 byte to 8 MiB"
    );
    let record = ctxpod_format::record::record_bytes(size) as u64;
    let mut out = Vec::new();
    for &n in &a.scale {
        // Room for every record, regions to spare, and the superblock.
        let capacity = ((n * record) / 10 * 11 + (512 << 20)).next_multiple_of(1 << 20);
        if let Some(free) = free_bytes(&a.dir) {
            ensure!(
                capacity + (2 << 30) < free,
                "{n} blocks need a {} device and {} are free under {}",
                ByteSize(capacity),
                ByteSize(free),
                a.dir.display()
            );
        }
        let data_dir = a.dir.join(format!("scale-{n}"));
        let _ = std::fs::remove_dir_all(&data_dir);
        eprintln!("scale {n}: formatting a {} node", ByteSize(capacity));
        let node = Node::start(&data_dir, capacity, 16 << 20, "file", a).await?;
        let addr = node.transfer.clone().context("no transfer listener")?;
        let mut tcs = Vec::new();
        for _ in 0..4 {
            tcs.push(std::sync::Arc::new(
                TransferClient::connect_with(&addr, &node.how).await?,
            ));
        }
        let data = block(size, 7);
        const BATCH: u64 = 256;
        let t = Instant::now();
        let mut loaded = 0u64;
        let mut next_report = n / 20;
        let mut s = futures::stream::iter((0..n.div_ceil(BATCH)).map(|b| {
            let tc = tcs[b as usize % tcs.len()].clone();
            let data = data.clone();
            async move {
                let mut left: Vec<(Bytes, Bytes)> = (b * BATCH..((b + 1) * BATCH).min(n))
                    .map(|i| (scale_key(i), data.clone()))
                    .collect();
                let count = left.len() as u64;
                // Entries answered 503 (the node's write queue was full) are sent again.
                let deadline = Instant::now() + Duration::from_secs(60);
                while !left.is_empty() {
                    let st = tc
                        .put("default", &left, ctxpod_wire::proto::Durability::Fast)
                        .await?;
                    ensure!(
                        st.iter().all(|&s| s == 201 || s == 200 || s == 503),
                        "scale load: statuses {st:?}"
                    );
                    left = left
                        .into_iter()
                        .zip(st)
                        .filter(|(_, s)| *s == 503)
                        .map(|(e, _)| e)
                        .collect();
                    if !left.is_empty() {
                        ensure!(
                            Instant::now() < deadline,
                            "scale load: the node stayed busy"
                        );
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                }
                anyhow::Ok(count)
            }
        }))
        .buffer_unordered(4);
        while let Some(r) = s.next().await {
            loaded += r?;
            if loaded >= next_report {
                eprintln!(
                    "scale {n}: {loaded} blocks stored ({:.0} %, {:.0} blocks/s)",
                    loaded as f64 * 100.0 / n as f64,
                    loaded as f64 / t.elapsed().as_secs_f64()
                );
                next_report += n / 20;
            }
        }
        drop(s);
        // One durable put: every fast one before it is then on the device too.
        tcs[0]
            .put(
                "default",
                &[(scale_key(n), data.clone())],
                ctxpod_wire::proto::Durability::Durable,
            )
            .await?;
        let load_s = t.elapsed().as_secs_f64();
        // Latency: one GET at a time of uniformly random stored keys (the DRAM tier holds
        // 16 MiB, so nearly every one is an index lookup and a device read).
        let mut rng = 0x2545_F491_4F6C_DD1Du64;
        let mut pick = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let mut lat = Vec::with_capacity(5000);
        for _ in 0..5000 {
            let i = pick();
            let t = Instant::now();
            let got = tcs[0].get("default", &[scale_key(i)]).await?;
            lat.push(t.elapsed());
            ensure!(
                got[0] == Some(data.clone()),
                "scale: block {i} came back wrong"
            );
        }
        lat.sort();
        // Throughput: `--concurrency` GETs at once.
        let gets = 20_000u64;
        let keys: Vec<u64> = (0..gets).map(|_| pick()).collect();
        let t = Instant::now();
        let mut s = futures::stream::iter(keys.into_iter().enumerate().map(|(j, i)| {
            let tc = tcs[j % tcs.len()].clone();
            let data = data.clone();
            async move {
                let got = tc.get("default", &[scale_key(i)]).await?;
                ensure!(got[0] == Some(data), "scale: block {i} came back wrong");
                anyhow::Ok(())
            }
        }))
        .buffer_unordered(a.concurrency);
        while let Some(r) = s.next().await {
            r?;
        }
        drop(s);
        let get_ops_per_s = gets as f64 / t.elapsed().as_secs_f64();
        let rss = rss_bytes(node.child.id()).unwrap_or(0);
        let row = ScaleRow {
            blocks: n,
            block_bytes: size as u64,
            load_s,
            load_blocks_per_s: n as f64 / load_s,
            get_p50_us: pct(&lat, 0.5) * 1e3,
            get_p99_us: pct(&lat, 0.99) * 1e3,
            get_ops_per_s,
            rss_bytes: rss,
            rss_per_million_blocks: out.first().filter(|f: &&ScaleRow| f.blocks < n).map(
                |f: &ScaleRow| (rss as f64 - f.rss_bytes as f64) / ((n - f.blocks) as f64 / 1e6),
            ),
            index_bytes: du(&data_dir.join("index")),
        };
        eprintln!(
            "scale {n}: GET p50 {:.0} µs, p99 {:.0} µs, {:.0} GET/s; RSS {}",
            row.get_p50_us,
            row.get_p99_us,
            row.get_ops_per_s,
            mib(rss as f64)
        );
        out.push(row);
        drop(tcs);
        node.stop()?;
        let _ = std::fs::remove_dir_all(&data_dir);
    }
    println!("| blocks indexed | block | load blocks/s | GET p50 µs (1 at a time) | GET p99 µs | GET/s (concurrency {}) | node RSS | RSS growth per 1M blocks | index on disk |", a.concurrency);
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in &out {
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {} | {} | {} |",
            r.blocks,
            ByteSize(r.block_bytes),
            r.load_blocks_per_s,
            r.get_p50_us,
            r.get_p99_us,
            r.get_ops_per_s,
            mib(r.rss_bytes as f64),
            r.rss_per_million_blocks.map_or(String::new(), mib),
            mib(r.index_bytes as f64)
        );
    }
    if let (Some(first), Some(last)) = (out.first(), out.last()) {
        if out.len() > 1 {
            println!(
                "\nGET p50 at {} blocks = {:.2}× the figure at {} blocks",
                last.blocks,
                last.get_p50_us / first.get_p50_us,
                first.blocks
            );
        }
    }
    if let Some(p) = &a.json {
        write_json_lines(p, &out)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_sizes_parse_with_units_or_the_model_preset() {
        assert_eq!(parse_block_size("llama3-8b").unwrap().0, 2 << 20);
        assert_eq!(parse_block_size("64KiB").unwrap().0, 64 << 10);
        assert!(parse_block_size("llama3").is_err());
    }

    #[test]
    fn counts_parse_with_suffixes_and_refuse_the_rest() {
        assert_eq!(parse_count("10K"), Ok(10_000));
        assert_eq!(parse_count("1m"), Ok(1_000_000));
        assert_eq!(parse_count("2500"), Ok(2500));
        for bad in ["", "K", "0", "-1", "1G", "1.5M", "99999999999999999999M"] {
            assert!(parse_count(bad).is_err(), "{bad:?}");
        }
    }
}

/// One row of the `--pod` benchmark.
#[derive(serde::Serialize)]
struct PodRow {
    nodes: usize,
    replication: usize,
    what: String,
    block: u64,
    blocks: u64,
    gb_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// CPU seconds all nodes together spent per GiB moved (copies included).
    nodes_cpu_s_per_gib: f64,
    /// Blocks each node holds after the puts, and the largest over the mean.
    blocks_per_node: Vec<u64>,
    skew: f64,
}

/// Starts `ctxpod serve` (`cmd` holds the subcommand and its own flags) on `data_dir` with
/// this capacity and DRAM tier, logging only warnings.
fn spawn_serve(
    mut cmd: Command,
    data_dir: &Path,
    capacity: u64,
    dram: u64,
) -> anyhow::Result<Child> {
    cmd.arg("--data-dir")
        .arg(data_dir)
        .args([
            "--capacity",
            &capacity.to_string(),
            "--dram",
            &dram.to_string(),
        ])
        .env("CTXPOD_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .context("start ctxpod serve")
}

/// A free loopback port (bound, then released for the node to take).
fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// `--pod`: aggregate throughput of pods of 1, 2, 3… nodes on this machine through the pod
/// client, and how evenly placement spreads the blocks.
async fn pod_bench(a: &BenchArgs) -> anyhow::Result<()> {
    use ctxpod_client::pod_client::PodClient;
    let size = a.sizes.first().context("--sizes")?.0 as usize;
    let n = (a.bytes.0 / size as u64).max(1);
    let total = n * size as u64;
    let mut rows = Vec::new();
    for &count in &a.pod {
        ensure!(count >= 1, "--pod counts start at 1");
        ensure!(
            a.pod_replication <= count,
            "--pod-replication {} exceeds a pod of {count}",
            a.pod_replication
        );
        // Each node holds its share of the copies, with room to spare; DRAM for all of it
        // (the GET phase reads from the DRAM tier: what the pod serves, not the disk).
        let per_node = total * a.pod_replication as u64 / count as u64;
        let capacity = (per_node * 2 + (1 << 30)).next_multiple_of(1 << 20);
        let dram = per_node + per_node / 4 + (64 << 20);
        let ports: Vec<(u16, u16)> = (0..count)
            .map(|_| Ok((free_port()?, free_port()?)))
            .collect::<anyhow::Result<_>>()?;
        let members: String = ports
            .iter()
            .enumerate()
            .map(|(i, (h, t))| {
                format!(
                    "  {{ id = \"n{i}\", http = \"http://127.0.0.1:{h}\", transfer = \"127.0.0.1:{t}\", capacity = {capacity} }},\n"
                )
            })
            .collect();
        let mut nodes = Vec::new();
        for (i, (h, t)) in ports.iter().enumerate() {
            let dir = a.dir.join(format!("pod{count}-n{i}"));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir)?;
            let cfg = dir.with_extension("toml");
            std::fs::write(
                &cfg,
                format!(
                    "[pod]\nnode_id = \"n{i}\"\nreplication = {}\nmembers = [\n{members}]\n",
                    a.pod_replication
                ),
            )?;
            let mut cmd = Command::new(std::env::current_exe()?);
            cmd.arg("serve")
                .arg("--config")
                .arg(&cfg)
                .args(["--listen", &format!("127.0.0.1:{h}")])
                .args(["--transfer-listen", &format!("127.0.0.1:{t}")]);
            let child = spawn_serve(cmd, &dir, capacity, dram)?;
            nodes.push(PodNode { child, dir });
        }
        let urls: Vec<String> = ports
            .iter()
            .map(|(h, _)| format!("http://127.0.0.1:{h}"))
            .collect();
        for (node, url) in nodes.iter().zip(&urls) {
            let c = Client::new(url.clone());
            let deadline = Instant::now() + Duration::from_secs(60);
            while !c.ready().await {
                ensure!(
                    Instant::now() < deadline,
                    "node {} not ready within 60 s",
                    node.dir.display()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let pc = std::sync::Arc::new(PodClient::connect(&urls, &Default::default()).await?);
        let cpu = |nodes: &[PodNode]| -> f64 {
            nodes.iter().filter_map(|n| cpu_seconds(n.child.id())).sum()
        };
        let pool: Vec<Bytes> = (0..POOL).map(|i| block(size, i)).collect();
        let mut counts = Vec::new();
        // The first read of each block comes from flash (puts do not fill the DRAM tier);
        // the second from DRAM.
        for what in [
            "PUT durable",
            "GET cold (first read)",
            "GET hot (second read)",
        ] {
            let cpu0 = cpu(&nodes);
            let t = Instant::now();
            let mut progress = Progress::new(&format!("pod of {count}: {what}"), n);
            let mut lat = Vec::with_capacity(n as usize);
            let mut s = futures::stream::iter((0..n).map(|i| {
                let (pc, data) = (pc.clone(), pool[(i % POOL) as usize].clone());
                async move {
                    let t = Instant::now();
                    let k = key(size, i);
                    if what.starts_with("GET") {
                        let got = pc.get("default", &k).await?;
                        ensure!(
                            got.as_deref() == Some(&data[..]),
                            "block {i} came back wrong"
                        );
                    } else {
                        pc.put("default", &k, data, Durability::Durable).await?;
                    }
                    anyhow::Ok(t.elapsed())
                }
            }))
            .buffer_unordered(a.concurrency);
            while let Some(r) = s.next().await {
                lat.push(r?);
                progress.step(lat.len() as u64);
            }
            progress.done();
            let elapsed = t.elapsed();
            let used = cpu(&nodes) - cpu0;
            if counts.is_empty() {
                for url in &urls {
                    counts.push(Client::new(url.clone()).stats().await?.block_count);
                }
            }
            let mean = counts.iter().sum::<u64>() as f64 / counts.len() as f64;
            let r = row(what, size as u64, total, elapsed, lat);
            rows.push(PodRow {
                nodes: count,
                replication: a.pod_replication,
                what: what.into(),
                block: size as u64,
                blocks: n,
                gb_per_s: r.gb_per_s,
                p50_ms: r.p50_ms,
                p99_ms: r.p99_ms,
                nodes_cpu_s_per_gib: used / (total as f64 / (1u64 << 30) as f64),
                blocks_per_node: counts.clone(),
                skew: counts.iter().copied().max().unwrap_or(0) as f64 / mean.max(1.0),
            });
        }
        drop(nodes);
    }
    println!("| nodes | R | phase | block | GB/s (aggregate) | p50 ms | p99 ms | nodes' CPU s/GiB | blocks per node | max / mean |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {:.3} | {:.2} | {:.2} | {:.2} | {:?} | {:.3} |",
            r.nodes,
            r.replication,
            r.what,
            ByteSize(r.block),
            r.gb_per_s,
            r.p50_ms,
            r.p99_ms,
            r.nodes_cpu_s_per_gib,
            r.blocks_per_node,
            r.skew
        );
    }
    if let Some(p) = &a.json {
        write_json_lines(p, &rows)?;
    }
    Ok(())
}

/// A node of the `--pod` benchmark: stopped with SIGTERM and its data removed when dropped.
struct PodNode {
    child: Child,
    dir: PathBuf,
}

impl Drop for PodNode {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_file(self.dir.with_extension("toml"));
    }
}
