//! Eviction: 1 GiB written into 256 MiB of capacity. The data dir stays within capacity plus
//! a small bound, the node keeps serving, pinned and recently read blocks survive, and the
//! device write amplification stays near 1.

use crate::common;

use common::{block, du, Node};
use ctxpod_wire::Durability;
use futures::StreamExt;

const MIB: u64 = 1 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_gib_into_256_mib() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data_dir = dir.path().join("n");
    let node = Node::start(&data_dir, &["--capacity", "256MiB", "--dram", "8MiB"]).await;
    let c = node.client.clone();
    let key = |i: u64| i.to_be_bytes().to_vec();
    let size = MIB as usize;
    let n = 1024u64; // 1 GiB
                     // The first four blocks are pinned for the whole run; block 4 is read often.
    for i in 0..5 {
        c.put("default", &key(i), block(i, size), Durability::Durable)
            .await
            .expect("put");
    }
    assert_eq!(
        c.pin("default", &(0..4).map(key).collect::<Vec<_>>(), 3_600_000)
            .await
            .expect("pin"),
        4
    );
    let overhead_max = 64 * MIB;
    let mut max_du = 0;
    for chunk in (5..n).collect::<Vec<_>>().chunks(64) {
        let mut s = futures::stream::iter(chunk.iter().map(|&i| {
            let c = c.clone();
            async move {
                c.put("default", &key(i), block(i, size), Durability::Durable)
                    .await
            }
        }))
        .buffer_unordered(4);
        while let Some(r) = s.next().await {
            r.expect("every put succeeds: eviction makes room");
        }
        // Block 4 is read now and then: it is reinserted when its region is reclaimed.
        assert_eq!(
            c.get("default", &key(4)).await.expect("get"),
            Some(block(4, size))
        );
        max_du = max_du.max(du(&data_dir));
    }
    let s = c.stats().await.expect("stats");
    eprintln!(
        "written {} MiB, data dir peak {} MiB, evicted {} blocks in {} regions, reinserted {}, WA {:.3}",
        s.user_written_bytes / MIB,
        max_du / MIB,
        s.evicted_blocks,
        s.evicted_regions,
        s.reinserted_blocks,
        s.write_amplification
    );
    assert_eq!(s.user_written_bytes, n * MIB);
    assert!(
        max_du <= 256 * MIB + overhead_max,
        "data dir peaked at {max_du} bytes"
    );
    assert!(s.used_bytes <= s.capacity_bytes);
    assert!(s.evicted_regions > 0 && s.evicted_blocks > 0);
    assert!(s.reinserted_blocks > 0);
    assert!(
        s.write_amplification < 1.15,
        "write amplification {}",
        s.write_amplification
    );
    assert!(s.live_bytes <= 256 * MIB);
    // Pinned blocks and the hot block survived; the newest blocks are there; the oldest
    // unpinned ones were evicted.
    for i in 0..5 {
        assert_eq!(
            c.get("default", &key(i)).await.expect("get"),
            Some(block(i, size)),
            "block {i}"
        );
    }
    for i in n - 32..n {
        assert_eq!(
            c.get("default", &key(i)).await.expect("get"),
            Some(block(i, size)),
            "recent block {i}"
        );
    }
    assert_eq!(
        c.get("default", &key(10)).await.expect("get"),
        None,
        "an old block was evicted"
    );
    assert_eq!(s.integrity_errors, 0);
    // Still serving writes.
    c.put("default", b"after", block(77, 4096), Durability::Durable)
        .await
        .expect("put after");
    assert!(c.head("default", b"after").await.expect("head"));
}
