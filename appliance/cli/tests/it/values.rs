//! Large values (issue #34) through the HTTP API of a real node process: the sizes real
//! engines store (an LMCache chunk of Llama-3-8B at `chunk_size` 256 is 32 MiB + its 28-byte
//! header; of Llama-3-70B, 80 MiB), byte-exact across a `kill -9`, refused cleanly over the
//! node's limit, and a crash loop killing the node in the middle of large puts: an
//! acknowledged value is there whole, any other is absent or whole, never torn.
//!
//! `CTXPOD_VALUE_CRASH_CYCLES` (default 8) and `CTXPOD_CRASH_SEED` (default 1) set the
//! loop; docs/RELIABILITY.md gives the long run.

use crate::common;

use common::{block, Node};
use ctxpod_wire::Durability;
use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MIB: usize = 1 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_sized_values_round_trip_over_http_across_kill_9() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut node = Node::start(&dir.path().join("n"), &["--capacity", "1GiB"]).await;
    let c = node.client.clone();
    // Llama-3-8B and -70B LMCache chunks, and a Dynamo KVBM block of 32 tokens of a 70B
    // model (10 MiB).
    let values = [
        (b"llama3-8b".to_vec(), block(1, 32 * MIB + 28)),
        (b"llama3-70b".to_vec(), block(2, 80 * MIB + 28)),
        (b"kvbm-70b".to_vec(), block(3, 10 * MIB)),
    ];
    for (k, v) in &values {
        let put = c.put("default", k, v.clone(), Durability::Durable).await;
        assert!(put.is_ok(), "put of {} bytes: {put:?}", v.len());
    }
    for (k, v) in &values {
        assert_eq!(c.get("default", k).await.expect("get").as_ref(), Some(v));
    }
    node.kill9();
    node.restart().await;
    let c = node.client.clone();
    for (k, v) in &values {
        let head = node
            .request(reqwest::Method::HEAD, &block_path(k))
            .send()
            .await
            .expect("head");
        let len = head.headers().get(reqwest::header::CONTENT_LENGTH);
        assert_eq!(
            len.and_then(|l| l.to_str().ok()),
            Some(v.len().to_string().as_str())
        );
        assert_eq!(
            c.get("default", k)
                .await
                .expect("get after kill -9")
                .as_ref(),
            Some(v)
        );
    }
    // The same bytes again: 200, nothing rewritten; other bytes: 409.
    let again = node
        .request(reqwest::Method::PUT, &block_path(b"llama3-8b"))
        .body(values[0].1.clone())
        .send()
        .await
        .expect("re-put");
    assert_eq!(again.status(), 200);
    let other = node
        .request(reqwest::Method::PUT, &block_path(b"llama3-8b"))
        .body(block(9, 32 * MIB + 28))
        .send()
        .await
        .expect("conflicting put");
    assert_eq!(other.status(), 409);
    let s = c.stats().await.expect("stats");
    let total: usize = values.iter().map(|(_, v)| v.len()).sum();
    assert_eq!((s.block_count, s.live_bytes), (3, total as u64));
}

fn block_path(key: &[u8]) -> String {
    format!("/v1/namespaces/default/blocks/{}", hex::encode(key))
}

/// Over the node's `value_bytes_max`: 413 before any byte of the body is read (the head
/// alone is answered), and a body cut short is refused with nothing stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_value_limit_or_cut_short_is_refused_and_nothing_is_stored() {
    let node = Node::fresh(&["--capacity", "256MiB"]).await;
    let mut io = node.raw_http().await;
    let head = format!(
        "PUT {} HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n",
        block_path(b"huge"),
        (256u64 << 20) + 1
    );
    io.write_all(head.as_bytes()).await.expect("send head");
    let mut answer = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), io.read(&mut answer))
        .await
        .expect("answered without the body")
        .expect("read");
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("value_bytes_max"), "{answer}");
    // 20 MiB announced, 12 MiB sent, then the connection closes.
    let mut io = node.raw_http().await;
    let head = format!(
        "PUT {} HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n",
        block_path(b"cut"),
        20 * MIB
    );
    io.write_all(head.as_bytes()).await.expect("send head");
    io.write_all(&block(4, 12 * MIB)).await.expect("send part");
    drop(io);
    let c = &node.client;
    common::eventually(Duration::from_secs(10), "the cut put is over", async || {
        c.stats().await.is_ok_and(|s| s.inflight_requests <= 1)
    })
    .await;
    assert_eq!(c.get("default", b"cut").await.expect("get"), None);
    let s = c.stats().await.expect("stats");
    assert_eq!((s.block_count, s.live_bytes), (0, 0));
}

/// The size of value `i` of `cycle`: 8 MiB + 1 byte to 40 MiB, so that every value is
/// stored as extents, some with a short last one.
fn value_spec(seed: u64, cycle: u32, i: u32) -> (Vec<u8>, u64, usize) {
    let key = format!("v-{cycle}-{i}").into_bytes();
    let s = seed ^ ((cycle as u64) << 32 | i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut rng = rand::rngs::StdRng::seed_from_u64(s);
    (key, s, rng.gen_range(8 * MIB + 1..=40 * MIB))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_in_the_middle_of_large_puts_leaves_no_torn_value() {
    let cycles = common::seed_from_env("CTXPOD_VALUE_CRASH_CYCLES", 8) as u32;
    let seed = common::seed_from_env("CTXPOD_CRASH_SEED", 1);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    // Room for every value of the run (at most VALUES_PER_CYCLE of 40 MiB a cycle): no
    // eviction, so every acknowledged value must be there at the end.
    let capacity = format!("{}MiB", (cycles as usize * VALUES_PER_CYCLE * 42).max(512));
    let mut node = Node::start(&dir.path().join("n"), &["--capacity", &capacity]).await;
    let mut acked_all: Vec<(u32, u32)> = Vec::new();
    let (mut cut_total, mut torn) = (0usize, 0usize);
    for cycle in 0..cycles {
        let writer = ValueWriter::spawn(node.client.clone(), seed, cycle);
        let delay = rng.gen_range(20..400);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        node.kill9();
        let mut task = writer.task;
        if tokio::time::timeout(Duration::from_secs(30), &mut task)
            .await
            .is_err()
        {
            task.abort();
        }
        node.restart().await;
        let started = writer.started.lock().clone();
        for (&i, &acked) in &started {
            let (key, s, len) = value_spec(seed, cycle, i);
            let got = node.client.get("default", &key).await;
            match got {
                Ok(Some(v)) if v == block(s, len) => {}
                Ok(None) if !acked => {}
                other => {
                    eprintln!(
                        "cycle {cycle} value {i} ({len} bytes, acked {acked}): {:?}",
                        other.map(|o| o.map(|v| v.len()))
                    );
                    torn += 1;
                }
            }
            if acked {
                acked_all.push((cycle, i));
            } else {
                cut_total += 1;
            }
        }
        assert_eq!(
            torn, 0,
            "cycle {cycle} (seed {seed}, killed after {delay} ms)"
        );
    }
    // Every acknowledged value of the whole run, once more.
    for &(cycle, i) in &acked_all {
        let (key, s, len) = value_spec(seed, cycle, i);
        let got = node.client.get("default", &key).await.expect("get");
        assert!(
            got == Some(block(s, len)),
            "cycle {cycle} value {i} lost or wrong"
        );
    }
    eprintln!(
        "{cycles} kills: {} values acknowledged, {cut_total} cut short, 0 torn",
        acked_all.len()
    );
    assert!(
        !acked_all.is_empty() && cut_total > 0,
        "the kills hit both sides"
    );
}

const VALUES_PER_CYCLE: usize = 12;

/// Puts a cycle's values, two at a time, until one fails (the node was killed): which it
/// started, and whether each was acknowledged.
struct ValueWriter {
    task: tokio::task::JoinHandle<()>,
    started: Arc<Mutex<BTreeMap<u32, bool>>>,
}

impl ValueWriter {
    fn spawn(client: ctxpod_client::client::Client, seed: u64, cycle: u32) -> ValueWriter {
        let started = Arc::new(Mutex::new(BTreeMap::new()));
        let s2 = started.clone();
        let task = tokio::spawn(async move {
            use futures::StreamExt;
            let mut s = futures::stream::iter((0..VALUES_PER_CYCLE as u32).map(|i| {
                let (c, s) = (client.clone(), s2.clone());
                async move {
                    let (key, bs, len) = value_spec(seed, cycle, i);
                    s.lock().insert(i, false);
                    let ok = c
                        .put("default", &key, block(bs, len), Durability::Durable)
                        .await
                        .is_ok();
                    if ok {
                        s.lock().insert(i, true);
                    }
                    ok
                }
            }))
            .buffer_unordered(2);
            while let Some(ok) = s.next().await {
                if !ok {
                    break;
                }
            }
        });
        ValueWriter { task, started }
    }
}
