//! Namespace classes (issue #36): a `weights` namespace is never evicted, whatever churns
//! around it, across restarts; a device full of weights refuses writes and loses nothing;
//! a namespace's class is fixed when it is created.

use super::value_tests::{data, read_in, store_in};
use super::*;
use ctxpod_format::config::ByteSize;
use ctxpod_wire::types::NamespaceClass;

/// One projection of one expert of Qwen1.5-MoE-A2.7B in bf16 (hidden 2048 ×
/// moe_intermediate 1408 × 2 bytes): the shard a loader stores per key.
const SHARD_BYTES: usize = 2048 * 1408 * 2;

fn cfg(dir: &std::path::Path, capacity: u64) -> Config {
    Config {
        data_dir: dir.to_path_buf(),
        capacity: ByteSize(capacity),
        dram: ByteSize(4 << 20),
        region_bytes: Some(ByteSize(16 << 20)),
        ..Config::default()
    }
}

fn weights() -> NsSettings {
    NsSettings {
        class: Some(NamespaceClass::Weights),
        ..NsSettings::default()
    }
}

/// `bytes` of 1 MiB KV blocks into `default`, keys `c{from}…`.
async fn churn(e: &Engine, from: u64, bytes: u64) {
    let block = Bytes::from(data(99, 1 << 20));
    for i in from..from + (bytes >> 20) {
        e.put(
            "default",
            format!("c{i}").as_bytes(),
            block.clone(),
            None,
            Durability::Fast,
        )
        .await
        .expect("churn put");
    }
}

/// Every shard and the whole-expert value of `experts`, byte for byte.
async fn check_experts(e: &Engine, shards: &[Vec<u8>], expert: &[u8], when: &str) {
    for (i, s) in shards.iter().enumerate() {
        let got = e
            .get("experts", format!("0/{i}").as_bytes())
            .await
            .expect("get shard")
            .map(|b| b.0);
        assert!(
            got.as_deref() == Some(&s[..]),
            "shard 0/{i} {when}: {}",
            if got.is_some() {
                "wrong bytes"
            } else {
                "missing"
            }
        );
    }
    let got = read_in(e, "experts", b"1", None)
        .await
        .expect("read expert");
    assert!(got.as_deref() == Some(expert), "expert 1 {when}");
}

/// Expert shards (blocks) and a whole expert (a large value of three shards) in a `weights`
/// namespace stay, byte for byte, while KV blocks worth three devices churn past them, and
/// again after a restart (the class is in the index): the KV blocks written before the
/// churn are evicted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_stay_while_kv_churns_and_after_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cap: u64 = 160 << 20;
    let e = Engine::open(cfg(dir.path(), cap), Arc::new(Metrics::new()))
        .await
        .expect("open");
    let (created, info) = e
        .create_namespace_with("experts", weights())
        .await
        .expect("create");
    assert!(created);
    assert_eq!(info.class, NamespaceClass::Weights);
    let shards: Vec<Vec<u8>> = (0..6).map(|i| data(i, SHARD_BYTES)).collect();
    for (i, s) in shards.iter().enumerate() {
        e.put(
            "experts",
            format!("0/{i}").as_bytes(),
            Bytes::from(s.clone()),
            None,
            Durability::Durable,
        )
        .await
        .expect("put shard");
    }
    let expert = data(7, 3 * SHARD_BYTES);
    store_in(&e, "experts", b"1", &expert)
        .await
        .expect("store expert");
    churn(&e, 0, 3 * cap).await;
    let s = e.stats();
    assert!(s.evicted_regions >= 20, "the device turned over: {s:?}");
    assert_eq!(s.integrity_errors, 0);
    // The first device's worth of KV blocks is gone (but for those that share a region
    // with the weights, which is kept in place while they are most of it).
    let first = (0..cap >> 20)
        .filter(|i| {
            e.on_flash("default", format!("c{i}").as_bytes())
                .expect("index")
        })
        .count() as u64;
    assert!(
        first < (cap >> 20) / 4,
        "{first} of the first {} KV blocks are still on flash",
        cap >> 20
    );
    check_experts(&e, &shards, &expert, "after churn").await;
    e.shutdown().await;
    drop(e);

    let e = Engine::open(cfg(dir.path(), cap), Arc::new(Metrics::new()))
        .await
        .expect("reopen");
    assert_eq!(
        e.namespace("experts").expect("info").class,
        NamespaceClass::Weights
    );
    check_experts(&e, &shards, &expert, "after a restart").await;
    churn(&e, 1 << 20, 2 * cap).await;
    check_experts(&e, &shards, &expert, "after a restart and more churn").await;
    assert_eq!(e.stats().integrity_errors, 0);
    e.shutdown().await;
}

/// A device filled with weights answers the next writes, of either class, `NoSpace` (507)
/// and every weight stored before is still there; once the weights namespace is deleted,
/// KV writes go in again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_full_of_weights_refuses_writes_and_loses_none() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cap: u64 = 160 << 20;
    let e = Engine::open(cfg(dir.path(), cap), Arc::new(Metrics::new()))
        .await
        .expect("open");
    e.create_namespace_with("experts", weights())
        .await
        .expect("create");
    let mut stored = 0usize;
    let refused = loop {
        assert!(stored < 64, "a 160 MiB device took more than 64 shards");
        let r = e
            .put(
                "experts",
                format!("0/{stored}").as_bytes(),
                Bytes::from(data(stored as u64, SHARD_BYTES)),
                None,
                Durability::Durable,
            )
            .await;
        match r {
            Ok(PutStatus::Created) => stored += 1,
            Ok(PutStatus::Exists) => panic!("a new key exists"),
            Err(err) => break err,
        }
    };
    assert!(
        matches!(refused, EngineError::NoSpace(_)),
        "the device full of weights refuses: {refused}"
    );
    assert!(stored >= 10, "only {stored} shards went in");
    let kv = e
        .put(
            "default",
            b"kv",
            Bytes::from(data(1, 1 << 20)),
            None,
            Durability::Fast,
        )
        .await;
    assert!(
        matches!(kv, Err(EngineError::NoSpace(_))),
        "a KV write evicts no weight: {kv:?}"
    );
    for i in 0..stored {
        let got = e
            .get("experts", format!("0/{i}").as_bytes())
            .await
            .expect("get")
            .map(|b| b.0);
        assert!(
            got.as_deref() == Some(&data(i as u64, SHARD_BYTES)[..]),
            "shard {i} of {stored} lost or wrong"
        );
    }
    e.delete_namespace("experts").await.expect("delete");
    churn(&e, 0, 2 * cap).await;
    e.shutdown().await;
}

/// The class is given when a namespace is created and kept: asking for it again is fine,
/// leaving it out keeps it (a quota change), another class is refused and changes nothing.
#[tokio::test]
async fn a_namespace_class_is_fixed_at_creation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = Engine::open(cfg(dir.path(), 80 << 20), Arc::new(Metrics::new()))
        .await
        .expect("open");
    assert_eq!(
        e.namespace("default").expect("default").class,
        NamespaceClass::Kv
    );
    e.create_namespace_with("experts", weights())
        .await
        .expect("create");
    let (created, again) = e
        .create_namespace_with("experts", weights())
        .await
        .expect("same class again");
    assert!(!created);
    assert_eq!(again.class, NamespaceClass::Weights);
    let (_, quota) = e
        .create_namespace_with(
            "experts",
            NsSettings {
                quota_bytes: Some(1 << 30),
                ..NsSettings::default()
            },
        )
        .await
        .expect("a quota change");
    assert_eq!(
        (quota.class, quota.quota_bytes),
        (NamespaceClass::Weights, Some(1 << 30))
    );
    let refused = e
        .create_namespace_with(
            "experts",
            NsSettings {
                class: Some(NamespaceClass::Kv),
                ..NsSettings::default()
            },
        )
        .await;
    assert!(
        matches!(&refused, Err(EngineError::Fixed(m)) if m.contains("weights")),
        "{refused:?}"
    );
    let kept = e.namespace("experts").expect("info");
    assert_eq!(
        (kept.class, kept.quota_bytes),
        (NamespaceClass::Weights, Some(1 << 30)),
        "a refused change changes nothing"
    );
    e.delete_namespace("experts").await.expect("delete");
    let (created, kv) = e
        .create_namespace_with("experts", NsSettings::default())
        .await
        .expect("create again");
    assert!(created);
    assert_eq!(kv.class, NamespaceClass::Kv);
    e.shutdown().await;
}
