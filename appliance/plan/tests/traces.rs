//! The planner's simulations over the real Mooncake traces in `bench/traces/`.

use ctxpod_plan::{lru, mrc, trace};

fn load(name: &str) -> Vec<trace::Request> {
    // The crate's directory as the test runner gives it when the test runs: the path
    // compiled in may be another checkout's (the build is shared between checkouts).
    let crate_dir = std::env::var_os("CARGO_MANIFEST_DIR").map_or_else(
        || env!("CARGO_MANIFEST_DIR").into(),
        std::path::PathBuf::from,
    );
    let p = crate_dir.join("../../bench/traces").join(name);
    trace::read_file(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

const CONVERSATION: &str = "mooncake_conversation_trace.jsonl";
const SYNTHETIC: &str = "mooncake_synthetic_trace.jsonl";

#[test]
fn the_traces_are_what_their_readme_says() {
    let c = trace::summary(&load(CONVERSATION));
    assert_eq!(
        (c.requests, c.block_refs, c.unique_blocks),
        (12_031, 288_500, 182_790)
    );
    let s = trace::summary(&load(SYNTHETIC));
    assert_eq!(
        (s.requests, s.block_refs, s.unique_blocks),
        (3_993, 121_877, 43_924)
    );
}

/// The exact LRU gives the reference prefix-hit ratios of the conversation trace (issue #8:
/// 0.211 / 0.287 / 0.355 at 10 k, 20 k and 50 k blocks).
#[test]
fn exact_lru_prefix_hit_ratios_of_the_conversation_trace() {
    let reqs = load(CONVERSATION);
    for (cap, want) in [(10_000, 0.211), (20_000, 0.287), (50_000, 0.355)] {
        let r = lru::simulate(&reqs, cap);
        eprintln!("LRU {cap}: prefix hit ratio {:.4}", r.prefix_hit_ratio);
        assert!(
            (r.prefix_hit_ratio - want).abs() < 0.0015,
            "{cap}: {} vs {want}",
            r.prefix_hit_ratio
        );
    }
}

/// Capacities the curves are compared at: 40 points from 500 blocks to past the traces'
/// unique blocks.
fn capacities() -> Vec<u64> {
    (0..40)
        .map(|i| (500.0 * (400.0f64).powf(i as f64 / 39.0)) as u64)
        .collect()
}

/// SHARDS at 1 % (and with a key budget) is within 0.02 mean absolute error of the exact
/// curve on both traces (issue #8). The figures are in docs/PLANNING.md.
#[test]
fn sampled_curves_are_within_two_hundredths_of_the_exact_ones() {
    for name in [CONVERSATION, SYNTHETIC] {
        let reqs = load(name);
        let caps = capacities();
        let exact = mrc::exact_curve(&reqs, &caps);
        // 1 % as the issue asks, and 1 % under a key budget that forces the rate lower.
        for (rate, budget) in [(0.01, None), (0.01, Some(1_200))] {
            let mut s = mrc::Mrc::sampled(rate, budget);
            for r in &reqs {
                for &k in &r.hash_ids {
                    s.access(k);
                }
            }
            let h = s.histogram();
            let mae = exact
                .iter()
                .map(|&(c, e)| (h.hit_ratio(c as f64) - e).abs())
                .sum::<f64>()
                / exact.len() as f64;
            let worst = exact
                .iter()
                .map(|&(c, e)| (h.hit_ratio(c as f64) - e).abs())
                .fold(0.0, f64::max);
            eprintln!(
                "{name} rate {rate} budget {budget:?}: MAE {mae:.4}, worst {worst:.4}, \
                 {} keys tracked, final rate {:.4}",
                s.tracked(),
                s.rate()
            );
            assert!(mae < 0.02, "{name} at {rate}: MAE {mae}");
            if let Some(b) = budget {
                assert!(
                    s.tracked() <= b + ctxpod_plan::mrc::HOT_KEYS_MAX,
                    "{}",
                    s.tracked()
                );
            }
        }
    }
}
