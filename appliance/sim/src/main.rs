//! `ctxpod-sim`: runs the pod's deterministic simulation over a range of seeds, or replays
//! one seed with its trace (docs/design/0004-pod-simulation.md).
//!
//! ```text
//! ctxpod-sim --seeds 10000 [--from 0] [--max-members 64] [--steps 120] [--hashes]
//! ctxpod-sim --seed 42 --members 7 [--steps 120] [--plant no-fence|unrecorded-deletes|no-backfill|clock-beyond-margin] [--trace]
//! ```

use ctxpod_sim::{Params, Plant};
use std::process::ExitCode;
use std::time::Instant;

struct Args {
    seeds: u64,
    from: u64,
    max_members: usize,
    steps: usize,
    one: Option<(u64, Option<usize>)>,
    plant: Option<Plant>,
    trace: bool,
    /// Prints every run's trace hash (to compare two runs of the same seeds).
    hashes: bool,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        seeds: 100,
        from: 0,
        max_members: 16,
        steps: 120,
        one: None,
        plant: None,
        trace: false,
        hashes: false,
    };
    let mut members = None;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        let number = |v: String| v.parse::<u64>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--seeds" => a.seeds = number(value()?)?,
            "--from" => a.from = number(value()?)?,
            "--max-members" => a.max_members = number(value()?)? as usize,
            "--steps" => a.steps = number(value()?)? as usize,
            "--seed" => a.one = Some((number(value()?)?, None)),
            "--members" => members = Some(number(value()?)? as usize),
            "--plant" => {
                let name = value()?;
                a.plant = Some(Plant::from_name(&name).ok_or(format!(
                    "--plant {name}: known: no-fence, unrecorded-deletes, no-backfill, \
                     clock-beyond-margin"
                ))?);
            }
            "--trace" => a.trace = true,
            "--hashes" => a.hashes = true,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if let Some((_, m)) = a.one.as_mut() {
        *m = members;
    }
    if a.max_members < 3 {
        return Err("--max-members must be at least 3".into());
    }
    Ok(a)
}

fn main() -> ExitCode {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("ctxpod-sim: {e}");
            }
            eprintln!(
                "usage: ctxpod-sim --seeds N [--from S] [--max-members M] [--steps K] [--hashes]\n       \
                 ctxpod-sim --seed S [--members M] [--steps K] [--plant no-fence|unrecorded-deletes|no-backfill|clock-beyond-margin] [--trace]"
            );
            return ExitCode::from(2);
        }
    };
    let runs: Vec<Params> = match a.one {
        Some((seed, members)) => {
            let mut p = Params::of_seed(seed, a.max_members, a.steps);
            if let Some(m) = members {
                p.members = m;
            }
            vec![p]
        }
        None => (a.from..a.from + a.seeds)
            .map(|s| Params::of_seed(s, a.max_members, a.steps))
            .collect(),
    };
    let t = Instant::now();
    let (mut failed, mut totals) = (0u64, ctxpod_sim::Outcome::default());
    for mut p in runs {
        p.plant = a.plant;
        let out = match ctxpod_sim::run(&p) {
            Ok(out) => out,
            Err(e) => {
                eprintln!("seed {}: the run could not be made: {e:#}", p.seed);
                return ExitCode::FAILURE;
            }
        };
        if a.trace {
            out.trace.iter().for_each(|l| println!("{l}"));
        }
        if !out.violations.is_empty() {
            failed += 1;
            println!(
                "seed {} ({} members): {:?}\n  replay: {}",
                p.seed,
                p.members,
                out.violations,
                p.replay_command()
            );
        }
        if a.one.is_some() || a.hashes {
            println!(
                "seed {} ({} members) trace hash {:016x}",
                p.seed, p.members, out.trace_hash
            );
        }
        totals.add(&out);
    }
    println!(
        "{} runs, {failed} failed, in {:.1} s: {} puts acknowledged ({} refused), {} deletes \
         acknowledged ({} unsettled), {} reads hit, {} missed, {} listings ({} refused), {} \
         faults, {:.0} s of pod time",
        totals.runs,
        t.elapsed().as_secs_f64(),
        totals.puts_acked,
        totals.puts_refused,
        totals.deletes_acked,
        totals.deletes_unsettled,
        totals.reads_hit,
        totals.reads_missed,
        totals.lists,
        totals.lists_refused,
        totals.faults,
        totals.simulated.as_secs_f64(),
    );
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
