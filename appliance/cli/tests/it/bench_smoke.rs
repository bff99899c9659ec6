//! `ctxpod bench` still runs end to end: every phase of a tiny run verifies its bytes and
//! reports a rate, the machine's limits come out, and the scale check loads and reads back.
//! (Speed is the benchmark's business, never this test's.)

use std::process::Command;

fn bench(dir: &std::path::Path, args: &[&str]) -> Vec<serde_json::Value> {
    let json = dir.join("out.jsonl");
    let out = Command::new(env!("CARGO_BIN_EXE_ctxpod"))
        .arg("bench")
        .arg("--dir")
        .arg(dir)
        .arg("--json")
        .arg(&json)
        .args(args)
        .output()
        .expect("run ctxpod bench");
    assert!(
        out.status.success(),
        "ctxpod bench failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read_to_string(&json)
        .expect("json lines")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON row"))
        .collect()
}

/// A run over `bytes` of 64 KiB blocks, a 4 MiB device baseline, `limits` bytes per limit.
fn tiny<'a>(bytes: &'a str, limits: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![
        "--sizes",
        "64KiB",
        "--bytes",
        bytes,
        "--device-bytes",
        "4MiB",
        "--limits-bytes",
        limits,
        "--concurrency",
        "4",
    ];
    v.extend_from_slice(extra);
    v
}

#[test]
fn a_tiny_bench_run_measures_every_phase_and_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rows = bench(dir.path(), &tiny("2MiB", "4MiB", &["--protocol", "cxp1"]));
    let rate = |what: &str| {
        rows.iter()
            .find(|r| r["what"].as_str().is_some_and(|w| w.starts_with(what)))
            .and_then(|r| r["gb_per_s"].as_f64())
            .unwrap_or_else(|| panic!("no {what:?} row in {rows:?}"))
    };
    for what in [
        "CRC32C",
        "AES-256-GCM seal",
        "AES-256-GCM open",
        "memcpy",
        "loopback TCP",
        "PUT durable",
        "PUT fast",
        "GET cold",
        "GET hot",
    ] {
        let r = rate(what);
        assert!(r.is_finite() && r > 0.0, "{what}: {r}");
    }
    // Blocks per second agree with bytes per second and the block size.
    for r in rows.iter().filter(|r| r["run"].as_u64() > Some(0)) {
        let (gb, size, bps) = (
            r["gb_per_s"].as_f64().unwrap(),
            r["size"].as_f64().unwrap(),
            r["blocks_per_s"].as_f64().unwrap(),
        );
        assert!((bps - gb * 1e9 / size).abs() <= 1e-6 * bps.max(1.0), "{r}");
    }
    // Each node phase is set against the limit that bounds it.
    let hot = rows
        .iter()
        .find(|r| r["what"] == "GET hot (DRAM)")
        .expect("hot row");
    assert_eq!(hot["bound"], "loopback", "{hot}");
    assert!(hot["of_bound"].as_f64().is_some_and(|f| f > 0.0), "{hot}");
}

#[test]
fn the_scale_check_loads_and_reads_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rows = bench(dir.path(), &["--scale", "1K,3K", "--concurrency", "4"]);
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0]["blocks"], 1000);
    assert_eq!(rows[1]["blocks"], 3000);
    for r in &rows {
        assert!(r["get_p50_us"].as_f64().is_some_and(|v| v > 0.0), "{r}");
        assert!(r["rss_bytes"].as_u64().is_some_and(|v| v > 0), "{r}");
    }
    assert!(rows[0]["rss_per_million_blocks"].is_null());
    assert!(
        !dir.path().join("scale-3000").exists(),
        "the scale check removes its nodes"
    );
}

#[test]
fn batched_phases_run_over_http_batch_routes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rows = bench(
        dir.path(),
        &tiny("1MiB", "0", &["--protocol", "http", "--batch", "4"]),
    );
    for what in [
        "PUT durable, batch 4",
        "PUT fast, batch 4",
        "GET cold (flash), batch 4",
        "GET hot (DRAM), batch 4",
    ] {
        let r = rows
            .iter()
            .find(|r| r["what"] == what)
            .unwrap_or_else(|| panic!("no {what:?} row in {rows:?}"));
        // 16 blocks of 64 KiB in requests of 4.
        assert_eq!(r["ops"], 4, "{r}");
        assert!(r["gb_per_s"].as_f64().is_some_and(|g| g > 0.0), "{r}");
    }
}

#[test]
fn the_pod_bench_spreads_copies_over_its_nodes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rows = bench(
        dir.path(),
        &[
            "--pod",
            "1,3",
            "--pod-replication",
            "1",
            "--sizes",
            "64KiB",
            "--bytes",
            "4MiB",
            "--concurrency",
            "4",
        ],
    );
    // Three phases per pod size; every block of the phase was verified by the bench.
    assert_eq!(rows.len(), 6, "{rows:?}");
    for r in &rows {
        assert!(r["gb_per_s"].as_f64().is_some_and(|g| g > 0.0), "{r}");
        let per_node: Vec<u64> = serde_json::from_value(r["blocks_per_node"].clone()).unwrap();
        assert_eq!(per_node.len() as u64, r["nodes"].as_u64().unwrap(), "{r}");
        assert_eq!(
            per_node.iter().sum::<u64>(),
            64,
            "each block stored once: {r}"
        );
    }
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("pod"))
        .collect();
    assert!(leftovers.is_empty(), "the pod bench removes its nodes");
    // Two copies of each block with R = 2.
    let rows = bench(
        dir.path(),
        &[
            "--pod",
            "2",
            "--pod-replication",
            "2",
            "--sizes",
            "64KiB",
            "--bytes",
            "2MiB",
        ],
    );
    let per_node: Vec<u64> = serde_json::from_value(rows[0]["blocks_per_node"].clone()).unwrap();
    assert_eq!(per_node, vec![32, 32]);
}
