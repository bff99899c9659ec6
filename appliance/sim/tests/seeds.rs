//! The pod's simulation in the test suite: many seeds across pods of 3 to 16 members, the
//! same seed giving the same trace, and a planted bug found.
//!
//! The long run (docs/RELIABILITY.md): `cargo run --release -p ctxpod-sim -- --seeds 10000
//! --max-members 64`. CTXPOD_SIM_SEEDS sets this suite's count (default 500).

use ctxpod_sim::{Params, Plant};

fn seeds() -> u64 {
    std::env::var("CTXPOD_SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500)
}

/// Steps per run: enough for cuts to be healed and members restarted several times.
const STEPS: usize = 80;

#[test]
fn five_hundred_seeds_keep_every_promise() {
    let mut failed = Vec::new();
    let mut total = ctxpod_sim::Outcome::default();
    for seed in 0..seeds() {
        let p = Params::of_seed(seed, 16, STEPS);
        let out = ctxpod_sim::run(&p).expect("the run is made");
        if !out.violations.is_empty() {
            failed.push(format!(
                "seed {}: {:?}\n  replay: {}",
                seed,
                out.violations,
                p.replay_command()
            ));
        }
        total.add(&out);
    }
    eprintln!("{total:?}");
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    // The runs did what they are for: blocks deleted and read back, faults injected.
    assert!(total.deletes_acked > 0 && total.reads_hit > 0 && total.faults > 0);
}

#[test]
fn same_seed_same_trace() {
    for seed in [3, 17] {
        let p = Params::of_seed(seed, 16, STEPS);
        let a = ctxpod_sim::run(&p).expect("first run");
        let b = ctxpod_sim::run(&p).expect("second run");
        assert_eq!(a.trace, b.trace, "seed {seed}: the traces differ");
        assert_eq!(a.trace_hash, b.trace_hash);
    }
}

/// The number of seeds within which the planted bug must be found (docs/RELIABILITY.md).
const PLANT_FOUND_WITHIN: u64 = 20;

#[test]
fn a_member_serving_without_its_fence_is_found() {
    let found = (0..PLANT_FOUND_WITHIN).find(|&seed| {
        let mut p = Params::of_seed(seed, 16, STEPS);
        p.plant = Some(Plant::NoFence);
        let out = ctxpod_sim::run(&p).expect("the run is made");
        out.violations
            .iter()
            .any(|v| matches!(v, ctxpod_sim::Violation::Resurrected { .. }))
    });
    assert!(
        found.is_some(),
        "the planted bug was not found within {PLANT_FOUND_WITHIN} seeds"
    );
}
