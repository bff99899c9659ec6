//! `ctxpod replay` of Mooncake's conversation trace through a real node, against the exact
//! LRU simulation of the same trace (issue #8).

use crate::common;

use common::Node;
use ctxpod_client::transfer_client::TransferClient;
use ctxpod_plan::{lru, mrc, trace};
use ctxpod_tools::replay::{replay, ReplayArgs};

/// Blocks of 16,112 bytes take 16 KiB records: 1,024 to a 16 MiB region.
const BLOCK_BYTES: u64 = 16_112;
const BLOCKS_PER_REGION: u64 = 1024;
/// Free regions the writer keeps in reserve with 16 MiB group commits (one commit's
/// regions + 2), plus the device's first region (superblock): not block capacity.
const RESERVED_REGIONS: u64 = 4;

/// The conversation trace's path, from the crate's directory as the test runner gives it
/// when the test runs (the path compiled in may be another checkout's: the build is shared
/// between checkouts).
fn conversation_path() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(
            || env!("CARGO_MANIFEST_DIR").into(),
            std::path::PathBuf::from,
        )
        .join("../../bench/traces/mooncake_conversation_trace.jsonl")
}

/// The replay's arguments: blocks of `block_bytes` (in parts of `part_bytes`), puts
/// acknowledged before the flush, as fast as possible.
fn fast_args(block_bytes: u64, part_bytes: Option<u64>) -> ReplayArgs {
    ReplayArgs {
        trace: "unused".into(),
        model: "llama-3.1-8b".into(),
        tokens_per_block: trace::MOONCAKE_BLOCK_TOKENS,
        block_bytes: Some(ctxpod_format::config::ByteSize(block_bytes)),
        part_bytes: part_bytes.map(ctxpod_format::config::ByteSize),
        speed: 0.0,
        limit: None,
        fast: true,
        prefetch: false,
        json: false,
    }
}

fn conversation() -> Vec<trace::Request> {
    trace::read_file(&conversation_path()).expect("the conversation trace")
}

/// For 10 k, 20 k and 50 k blocks: a node whose regions hold that many blocks (the reserve
/// left out) replays the whole trace; its prefix hit ratio is within 0.02 of an exact LRU
/// of the same capacity, and its live miss-ratio curve (1 % sampled) within 0.02 of the
/// exact curve on average.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_through_a_node_matches_the_exact_lru() {
    let reqs = conversation();
    let dir = tempfile::tempdir().unwrap();
    let caps: Vec<u64> = (0..24)
        .map(|i| (1000.0 * (100.0f64).powf(i as f64 / 23.0)) as u64)
        .collect();
    let exact = mrc::exact_curve(&reqs, &caps);
    let plan_points = match ctxpod_node::plan_args::input_of(
        &ctxpod_node::plan_args::PlanArgs {
            trace: Some(conversation_path()),
            ..Default::default()
        },
        None,
    )
    .expect("plan input")
    .reuse
    {
        ctxpod_plan::planner::Reuse::Curve { points, .. } => points,
        other => panic!("{other:?}"),
    };
    for target in [10_000u64, 20_000, 50_000] {
        let regions = (target as f64 / BLOCKS_PER_REGION as f64).round() as u64;
        let blocks = regions * BLOCKS_PER_REGION;
        let capacity = format!("{}MiB", (regions + RESERVED_REGIONS) * 16);
        let node = Node::start_with(
            &dir.path().join(format!("n{target}")),
            &["--capacity", &capacity, "--dram", "1MiB"],
            &[
                ("CTXPOD_REGION_BYTES", "16MiB"),
                ("CTXPOD_GROUP_COMMIT_MAX_BYTES", "16MiB"),
            ],
        )
        .await;
        let args = fast_args(BLOCK_BYTES, None);
        let r = replay(&node.client, None, "default", &reqs, &args, |_, _| {})
            .await
            .expect("replay");
        let want = lru::simulate(&reqs, blocks as usize).prefix_hit_ratio;
        eprintln!(
            "{target}: node holds {blocks} blocks: replay {:.4}, exact LRU {want:.4}, \
             {:.1} s, write amplification {:.3}",
            r.hit_ratio, r.elapsed_s, r.write_amplification
        );
        assert_eq!(r.block_refs, 288_500);
        assert!(
            (r.hit_ratio - want).abs() < 0.02,
            "{target}: replay {} vs LRU {want}",
            r.hit_ratio
        );
        assert!(r.tokens_saved > 0 && r.bytes_read > 0);
        // The planner's prediction for this capacity, from the trace's curve as
        // `ctxpod plan --trace` builds it, against what the node measured.
        let predicted = ctxpod_plan::planner::curve_at(&plan_points, blocks as f64);
        eprintln!("{target}: the planner predicts {predicted:.4}");
        assert!(
            (predicted - r.hit_ratio).abs() < 0.02,
            "{target}: planner {predicted} vs replay {}",
            r.hit_ratio
        );
        // The node's live curve saw the same references: GET hits and PUTs.
        let m = node.client.mrc().await.expect("mrc");
        assert_eq!(m.references, 288_500);
        let curve = |c: u64| {
            // The node reads its curve at its own points: interpolate between them.
            let p = &m.points;
            let i = p
                .iter()
                .position(|x| x.capacity_blocks >= c)
                .unwrap_or(p.len() - 1);
            if i == 0 {
                return p[0].hit_ratio;
            }
            let (a, b) = (&p[i - 1], &p[i]);
            let t = (c - a.capacity_blocks) as f64
                / (b.capacity_blocks - a.capacity_blocks).max(1) as f64;
            a.hit_ratio + t.clamp(0.0, 1.0) * (b.hit_ratio - a.hit_ratio)
        };
        let in_range: Vec<&(u64, f64)> = exact
            .iter()
            .filter(|(c, _)| *c <= m.points.last().unwrap().capacity_blocks)
            .collect();
        let mae = in_range
            .iter()
            .map(|(c, e)| (curve(*c) - e).abs())
            .sum::<f64>()
            / in_range.len() as f64;
        eprintln!("{target}: the node's sampled curve is within {mae:.4} of the exact one");
        assert!(mae < 0.02, "{target}: node MRC MAE {mae}");
    }
}

/// Blocks larger than a part are stored as parts (3 here: 8,192 + 8,192 + 3,616 bytes) and
/// a block is a hit only with all of them: on a node that evicts nothing the replay's hit
/// ratio is the trace's own (an LRU that holds everything), the node holds three parts per
/// distinct block, and a block missing one part is a miss that is written again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_larger_than_a_part_are_replayed_in_parts() {
    let reqs: Vec<trace::Request> = conversation().into_iter().take(400).collect();
    let s = trace::summary(&reqs);
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(&dir.path().join("n"), &["--capacity", "1GiB"]).await;
    let args = fast_args(20_000, Some(8192));
    let r = replay(&node.client, None, "default", &reqs, &args, |_, _| {})
        .await
        .expect("replay");
    let want = lru::simulate(&reqs, s.unique_blocks as usize).prefix_hit_ratio;
    assert_eq!(r.parts_per_block, 3);
    assert_eq!(r.block_refs, s.block_refs);
    assert_eq!(
        r.hit_ratio, want,
        "nothing is evicted: every reuse is a hit"
    );
    assert_eq!(r.bytes_written, (r.block_refs - r.prefix_hits) * 20_000);
    assert_eq!(r.bytes_read, r.prefix_hits * 20_000);
    let st = node.client.stats().await.expect("stats");
    assert_eq!(st.block_count, 3 * s.unique_blocks);
    // One part gone: the request's first block is no longer a hit, so nothing of its
    // chain is, and the block is written again whole.
    let first = reqs[0].hash_ids[0];
    let part1 = ctxpod_tools::replay::Parts::new(20_000, 8192).key(first, 1);
    assert!(node.client.delete("default", &part1).await.expect("delete"));
    let again = replay(&node.client, None, "default", &reqs[..1], &args, |_, _| {})
        .await
        .expect("replay");
    assert_eq!(again.prefix_hits, 0);
    assert_eq!(again.bytes_written, reqs[0].hash_ids.len() as u64 * 20_000);
    let back = node.client.get("default", &part1).await.expect("get");
    assert_eq!(back.map(|b| b.len()), Some(8192));

    // The same replay fetching its hits with PREFETCH over CXP1 into a memory region:
    // the same hits, every part checked as it lands.
    node.client
        .create_namespace("pf", None)
        .await
        .expect("create");
    let t = TransferClient::connect(&node.transfer_addr())
        .await
        .expect("cxp1");
    let pf = replay(&node.client, Some(t), "pf", &reqs, &args, |_, _| {})
        .await
        .expect("replay with prefetch");
    assert_eq!(
        (pf.prefix_hits, pf.bytes_read),
        (r.prefix_hits, r.bytes_read)
    );
}
