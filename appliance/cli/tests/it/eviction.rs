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

/// One projection of one expert of Qwen1.5-MoE-A2.7B in bf16 (2048 × 1408 × 2 bytes).
const SHARD_BYTES: usize = 2048 * 1408 * 2;

/// A `weights` namespace through the real node: created over HTTP with its class (shown by
/// GET, kept by a settings change, another class refused 409, an unknown one 400), expert
/// shards stored over HTTP and over CXP1, then three devices' worth of KV blocks written
/// past them: every shard reads back byte for byte over both doors. Then the device is
/// filled with weights until it answers 507, and a KV write is refused too (it evicts no
/// weight): nothing stored before is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_are_never_evicted_on_any_door() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = Node::start(
        &dir.path().join("n"),
        &["--capacity", "256MiB", "--dram", "8MiB"],
    )
    .await;
    let c = node.client.clone();
    class_is_set_at_creation_and_kept(&node).await;

    // Layer 0's eight experts over HTTP, layer 1's over CXP1.
    let shard = |layer: u64, e: u64| block(1000 + layer * 8 + e, SHARD_BYTES);
    let key = |layer: u64, e: u64| format!("{layer}/{e}").into_bytes();
    for e in 0..8 {
        c.put("experts", &key(0, e), shard(0, e), Durability::Durable)
            .await
            .expect("put over HTTP");
    }
    let wire = node.wire().await;
    let l1: Vec<_> = (0..8).map(|e| (key(1, e).into(), shard(1, e))).collect();
    let codes = wire
        .put("experts", &l1, Durability::Durable)
        .await
        .expect("put over CXP1");
    assert!(codes.iter().all(|&s| s == 201), "{codes:?}");
    let check = |when: &'static str| {
        let (c, wire) = (c.clone(), &wire);
        async move {
            for layer in 0..2 {
                for e in 0..8 {
                    let http = c.get("experts", &key(layer, e)).await.expect("get");
                    assert!(
                        http == Some(shard(layer, e)),
                        "{layer}/{e} over HTTP {when}"
                    );
                    let got = wire
                        .get("experts", &[key(layer, e).into()])
                        .await
                        .expect("get over CXP1");
                    assert!(
                        got[0] == Some(shard(layer, e)),
                        "{layer}/{e} over CXP1 {when}"
                    );
                }
            }
        }
    };
    // Three devices of KV blocks, 1 MiB each.
    for chunk in (0..768u64).collect::<Vec<_>>().chunks(64) {
        let mut s = futures::stream::iter(chunk.iter().map(|&i| {
            let c = c.clone();
            async move {
                c.put(
                    "default",
                    &i.to_be_bytes(),
                    block(i, MIB as usize),
                    Durability::Fast,
                )
                .await
            }
        }))
        .buffer_unordered(4);
        while let Some(r) = s.next().await {
            r.expect("a KV put makes room by evicting KV blocks");
        }
    }
    let s = c.stats().await.expect("stats");
    assert!(s.evicted_regions > 0 && s.evicted_blocks > 0, "{s:?}");
    check("after the churn").await;
    common::metrics_contain(
        &node,
        &format!(
            "ctxpod_class_bytes{{class=\"weights\"}} {}",
            16 * SHARD_BYTES
        ),
    )
    .await;

    fill_with_weights(&c, shard, key).await;
    check("with the device full").await;
    assert_eq!(c.stats().await.expect("stats").integrity_errors, 0);
}

/// `experts` created `weights` over HTTP: shown by GET, kept by a settings change that
/// leaves the class out, another class refused (409), an unknown one 400.
async fn class_is_set_at_creation_and_kept(node: &Node) {
    use ctxpod_wire::types::{CreateNamespace, NamespaceClass};
    use reqwest::Method;
    let c = &node.client;
    let weights = CreateNamespace {
        class: Some(NamespaceClass::Weights),
        ..CreateNamespace::default()
    };
    let info = c
        .create_namespace_with("experts", &weights)
        .await
        .expect("create");
    assert_eq!(info.class, NamespaceClass::Weights);
    let info = c
        .create_namespace_with(
            "experts",
            &CreateNamespace {
                quota_bytes: Some(200 * MIB),
                ..CreateNamespace::default()
            },
        )
        .await
        .expect("a quota change keeps the class");
    assert_eq!(
        (info.class, info.quota_bytes),
        (NamespaceClass::Weights, Some(200 * MIB))
    );
    let refused = c
        .create_namespace_with(
            "experts",
            &CreateNamespace {
                class: Some(NamespaceClass::Kv),
                ..CreateNamespace::default()
            },
        )
        .await
        .expect_err("another class");
    assert_eq!(refused.status(), Some(409), "{refused}");
    let bad = node
        .request(Method::PUT, "/v1/namespaces/experts")
        .body(r#"{"class": "cold"}"#)
        .send()
        .await
        .expect("send");
    assert_eq!(bad.status(), 400);
    assert_eq!(
        c.namespace("experts").await.expect("info").class,
        NamespaceClass::Weights
    );
    assert_eq!(
        c.namespace("default").await.expect("info").class,
        NamespaceClass::Kv
    );
    c.create_namespace_with("experts", &CreateNamespace::default())
        .await
        .expect("quota back to none");
}

/// Stores shards of layers 2, 3, … into `experts` until the node refuses one (507), then
/// checks that a KV write is refused too and that every shard stored reads back.
async fn fill_with_weights(
    c: &ctxpod_client::client::Client,
    shard: impl Fn(u64, u64) -> bytes::Bytes,
    key: impl Fn(u64, u64) -> Vec<u8>,
) {
    let mut stored = Vec::new();
    let refused = 'fill: {
        for layer in 2..12 {
            for e in 0..8 {
                match c
                    .put(
                        "experts",
                        &key(layer, e),
                        shard(layer, e),
                        Durability::Durable,
                    )
                    .await
                {
                    Ok(_) => stored.push((layer, e)),
                    Err(err) => break 'fill err,
                }
            }
        }
        panic!(
            "256 MiB took {} shards of {SHARD_BYTES} bytes",
            stored.len()
        );
    };
    assert_eq!(refused.status(), Some(507), "{refused}");
    let kv = c
        .put(
            "default",
            b"after",
            block(1, MIB as usize),
            Durability::Fast,
        )
        .await
        .expect_err("a KV write when weights fill the device");
    assert_eq!(kv.status(), Some(507), "{kv}");
    for (layer, e) in stored {
        let got = c.get("experts", &key(layer, e)).await.expect("get");
        assert!(
            got == Some(shard(layer, e)),
            "{layer}/{e} with the device full"
        );
    }
}
