//! `firmware-sim run`: a device profile against a workload, in virtual time — latency
//! percentiles, bandwidth, write amplification and endurance projections.
//!
//! ```text
//! firmware-sim run --profile qlc --workload rand-write --block 16KiB --bytes 8GiB
//! ```

use clap::{Parser, Subcommand, ValueEnum};
use ctxpod_firmware_sim::rng::Rng;
use ctxpod_firmware_sim::{FaultPlan, Media, Profile, SimDevice, SimError, Ticket};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

#[derive(Parser)]
#[command(
    name = "firmware-sim",
    about = "A simulated flash drive, run against a workload"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Runs a workload and prints what the drive did.
    Run(RunArgs),
    /// Prints a built-in profile as TOML (a template for your own).
    Profile { name: String },
}

#[derive(Clone, Copy, ValueEnum)]
enum Workload {
    SeqWrite,
    RandWrite,
    SeqRead,
    RandRead,
    /// 70 % random reads, 30 % random writes.
    Mixed,
}

#[derive(clap::Args)]
struct RunArgs {
    /// `tlc`, `qlc`, `tlc-noplp`, `qlc-noplp` or a profile TOML file.
    #[arg(long, default_value = "tlc")]
    profile: String,
    #[arg(long, value_enum, default_value = "seq-write")]
    workload: Workload,
    /// Simulated device size.
    #[arg(long, default_value = "16GiB", value_parser = parse_size)]
    device_bytes: u64,
    /// Bytes moved by the workload.
    #[arg(long, default_value = "8GiB", value_parser = parse_size)]
    bytes: u64,
    /// I/O size.
    #[arg(long, default_value = "128KiB", value_parser = parse_size)]
    block: u64,
    /// Commands in flight.
    #[arg(long, default_value_t = 32)]
    qd: usize,
    /// Fill the device once before a read or overwrite workload (untimed).
    #[arg(long)]
    precondition: bool,
    /// Fault plan (TOML).
    #[arg(long)]
    faults: Option<String>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print the result as JSON instead of text.
    #[arg(long)]
    json: bool,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().map_err(|_| format!("bad size {s:?}"))?;
    let m = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        u => return Err(format!("unknown unit {u:?} (B, KiB, MiB, GiB, TiB)")),
    };
    n.checked_mul(m)
        .ok_or_else(|| format!("size {s} too large"))
}

fn main() {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Run(a) => run(a),
        Cmd::Profile { name } => Profile::load(&name).and_then(|p| {
            print!("{}", toml::to_string(&p).map_err(|e| e.to_string())?);
            Ok(())
        }),
    };
    if let Err(e) = r {
        eprintln!("firmware-sim: {e}");
        std::process::exit(2);
    }
}

/// Issues `n` commands of `block` bytes, `qd` in flight, in virtual time: a new command is
/// submitted when the earliest outstanding one completes. Returns per-command latencies (ns)
/// and errors.
fn drive(
    dev: &SimDevice,
    n: u64,
    block: u64,
    qd: usize,
    mut next: impl FnMut(u64) -> (u64, bool),
) -> (Vec<u64>, u64) {
    let data = vec![0x5au8; block as usize];
    let mut buf = vec![0u8; block as usize];
    let mut inflight: BinaryHeap<Reverse<(u64, u64, u64)>> = BinaryHeap::new();
    let mut tickets: std::collections::HashMap<u64, (Ticket, u64)> = Default::default();
    let mut lat = Vec::with_capacity(n as usize);
    let mut errors = 0;
    let mut id = 0u64;
    let mut progress = 0;
    let complete = |inflight: &mut BinaryHeap<Reverse<(u64, u64, u64)>>,
                    tickets: &mut std::collections::HashMap<u64, (Ticket, u64)>,
                    lat: &mut Vec<u64>,
                    errors: &mut u64| {
        if let Some(Reverse((done, id, _))) = inflight.pop() {
            let (t, start) = tickets.remove(&id).expect("ticket");
            if dev.complete(t).is_err() {
                *errors += 1;
            }
            lat.push(done - start);
        }
    };
    for i in 0..n {
        if inflight.len() >= qd {
            complete(&mut inflight, &mut tickets, &mut lat, &mut errors);
        }
        let (offset, write) = next(i);
        let start = dev.now_ns();
        let t: Result<Ticket, SimError> = if write {
            dev.submit_write(offset, &data, false)
        } else {
            dev.submit_read(offset, &mut buf)
        };
        match t {
            Ok(t) => {
                inflight.push(Reverse((t.done_ns, id, 0)));
                tickets.insert(id, (t, start));
                id += 1;
            }
            Err(_) => errors += 1,
        }
        if i * 20 / n.max(1) > progress {
            progress = i * 20 / n.max(1);
            eprint!(
                "\r[{}{}] {}%",
                "#".repeat(progress as usize),
                " ".repeat(20 - progress as usize),
                progress * 5
            );
        }
    }
    while !inflight.is_empty() {
        complete(&mut inflight, &mut tickets, &mut lat, &mut errors);
    }
    eprintln!("\r[{}] 100%", "#".repeat(20));
    (lat, errors)
}

fn run(a: RunArgs) -> Result<(), String> {
    let profile = Profile::load(&a.profile)?;
    let plan = match &a.faults {
        Some(f) => FaultPlan::load(f)?,
        None => FaultPlan {
            seed: a.seed,
            ..FaultPlan::none()
        },
    };
    let s = profile.sector_bytes as u64;
    if a.block == 0 || !a.block.is_multiple_of(s) || a.block > a.device_bytes {
        return Err(format!(
            "--block must be a multiple of {s} within the device"
        ));
    }
    let dev = SimDevice::new(
        profile.clone(),
        Media::Discard {
            len: a.device_bytes,
        },
        plan,
        false,
    );
    let slots = a.device_bytes / a.block;
    let mut rng = Rng::new(a.seed);
    let pre = a.precondition || matches!(a.workload, Workload::SeqRead | Workload::RandRead);
    if pre {
        eprintln!("preconditioning: writing the device once");
        drive(&dev, slots, a.block, a.qd, |i| (i * a.block, true));
    }
    let before = dev.stats();
    let t0 = dev.now_ns();
    let n = (a.bytes / a.block).max(1);
    let (mut lat, errors) = drive(&dev, n, a.block, a.qd, |i| match a.workload {
        Workload::SeqWrite => ((i % slots) * a.block, true),
        Workload::SeqRead => ((i % slots) * a.block, false),
        Workload::RandWrite => (rng.below(slots) * a.block, true),
        Workload::RandRead => (rng.below(slots) * a.block, false),
        Workload::Mixed => (rng.below(slots) * a.block, rng.chance(0.3)),
    });
    let secs = (dev.now_ns() - t0) as f64 / 1e9;
    lat.sort_unstable();
    let m = Measured {
        n,
        errors,
        secs,
        lat,
        before,
        after: dev.stats(),
        e: dev.endurance(),
    };
    let out = result_json(&a, &profile, &m);
    if a.json {
        println!("{out}");
        return Ok(());
    }
    print_text(&a, &profile, &m, &out);
    Ok(())
}

/// What a run measured: `n` commands, their errors and sorted latencies (ns) over `secs`
/// of virtual time, the device's statistics before and after, its endurance.
struct Measured {
    n: u64,
    errors: u64,
    secs: f64,
    lat: Vec<u64>,
    before: ctxpod_firmware_sim::SimStats,
    after: ctxpod_firmware_sim::SimStats,
    e: ctxpod_firmware_sim::Endurance,
}

impl Measured {
    /// Latency percentile `p`, in µs (0 without commands).
    fn pct(&self, p: f64) -> f64 {
        self.lat
            .get(((self.lat.len() as f64 - 1.0) * p) as usize)
            .map_or(0.0, |&v| v as f64 / 1e3)
    }

    /// Host bytes written during the run.
    fn host(&self) -> u64 {
        self.after.wear.host_bytes_written - self.before.wear.host_bytes_written
    }

    /// NAND bytes written during the run.
    fn nand(&self) -> u64 {
        self.after.wear.nand_bytes_written - self.before.wear.nand_bytes_written
    }
}

/// The run's result as JSON (`--json` prints it; the text report reads its rates).
fn result_json(a: &RunArgs, profile: &Profile, m: &Measured) -> serde_json::Value {
    let (host, nand, secs, n) = (m.host(), m.nand(), m.secs, m.n);
    let (before, after) = (&m.before, &m.after);
    serde_json::json!({
        "profile": profile.name,
        "workload": workload_name(a.workload),
        "block_bytes": a.block,
        "qd": a.qd,
        "ops": n,
        "errors": m.errors,
        "virtual_seconds": secs,
        "gb_per_s": (n * a.block) as f64 / secs / 1e9,
        "iops": n as f64 / secs,
        "latency_us": { "p50": m.pct(0.5), "p99": m.pct(0.99), "p999": m.pct(0.999) },
        "write_amplification": if host > 0 { nand as f64 / host as f64 } else { 0.0 },
        "gc_relocated_bytes": after.wear.gc_relocated_bytes - before.wear.gc_relocated_bytes,
        "erases": after.wear.erases,
        "pe_cycles_max": after.wear.pe_cycles_max,
        "endurance": m.e,
        "rated_tbw_bytes": profile.rated_tbw_bytes(),
        "faults": after.faults,
    })
}

/// The run's result as text on stdout.
fn print_text(a: &RunArgs, profile: &Profile, m: &Measured, out: &serde_json::Value) {
    let (host, nand, e) = (m.host(), m.nand(), &m.e);
    let (before, after) = (&m.before, &m.after);
    println!(
        "{} on {} ({} GiB simulated), {} × {} KiB at QD{}",
        workload_name(a.workload),
        profile.name,
        a.device_bytes >> 30,
        m.n,
        a.block >> 10,
        a.qd
    );
    println!(
        "  {:.3} GB/s, {:.0} IOPS over {:.3} s of virtual time; {} errors",
        out["gb_per_s"].as_f64().unwrap_or(0.0),
        out["iops"].as_f64().unwrap_or(0.0),
        m.secs,
        m.errors
    );
    println!(
        "  latency p50 {:.0} µs, p99 {:.0} µs, p99.9 {:.0} µs",
        m.pct(0.5),
        m.pct(0.99),
        m.pct(0.999)
    );
    if host > 0 {
        println!(
            "  write amplification {:.2} (GC moved {} MiB), {} erases, P/E max {}",
            nand as f64 / host as f64,
            (after.wear.gc_relocated_bytes - before.wear.gc_relocated_bytes) >> 20,
            after.wear.erases,
            after.wear.pe_cycles_max
        );
        println!(
            "  at this rate: {:.1} drive writes per day, lifetime {:.0} days, {:.2} PB writable \
             at this write amplification (rated: {:.2} PB)",
            e.dwpd,
            e.projected_life_days,
            e.projected_tbw_bytes / 1e15
                * (profile.rated_capacity_bytes as f64 / a.device_bytes as f64),
            profile.rated_tbw_bytes() / 1e15
        );
    }
}

fn workload_name(w: Workload) -> &'static str {
    match w {
        Workload::SeqWrite => "sequential write",
        Workload::RandWrite => "random write",
        Workload::SeqRead => "sequential read",
        Workload::RandRead => "random read",
        Workload::Mixed => "mixed 70/30 read/write",
    }
}
