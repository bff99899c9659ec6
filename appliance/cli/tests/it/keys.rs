//! Namespace data-key rotation against the real binary: on request (HTTP) and on its own
//! after `dek_rotate_after_writes` writes; new records are sealed under the new key id
//! (read back from the device), every block stays readable, across a restart too.

use crate::common;

use common::{block, open_device, put_all, records, Node};
use ctxpod_client::client::Client;
use ctxpod_wire::Durability;
use reqwest::Method;
use std::collections::BTreeSet;

fn key(i: u64) -> Vec<u8> {
    format!("rot{i:04}").into_bytes()
}

/// Blocks `range` (key `i`, `len` bytes), stored durably through `c`.
async fn put_range(c: &Client, range: std::ops::Range<u64>, len: usize) {
    let blocks = range.map(|i| (key(i), block(i, len)));
    put_all(c, "default", blocks, Durability::Durable).await;
}

/// A 256 MiB node in a temp dir of its own that rotates a data key after `writes` writes.
async fn rotating_after(writes: &str) -> Node {
    let env = [("CTXPOD_DEK_ROTATE_AFTER_WRITES", writes)];
    Node::fresh_with(&["--capacity", "256MiB"], &env).await
}

/// Asks `node` (HTTP) to rotate namespace `ns`'s data key; the answer.
async fn rotate_key(node: &Node, ns: &str) -> reqwest::Response {
    let path = format!("/v1/namespaces/{ns}/rotate-key");
    node.request(Method::POST, &path)
        .send()
        .await
        .expect("rotate")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_keys_seal_new_records_and_old_ones_stay_readable() {
    let mut node = rotating_after("1000").await;
    let c = node.client.clone();
    put_range(&c, 0..3, 5000).await;
    let r: serde_json::Value = rotate_key(&node, "default")
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(r["key_id"], 2);
    put_range(&c, 3..6, 5000).await;
    let missing = rotate_key(&node, "nosuch").await;
    assert_eq!(missing.status(), 404);
    node.stop();
    let recs = records(&open_device(&node.dir));
    let key_of = |i: u64| recs.get(&key(i)).expect("record on the device").1.key_id;
    assert_eq!((0..3).map(key_of).collect::<Vec<_>>(), vec![1, 1, 1]);
    assert_eq!((3..6).map(key_of).collect::<Vec<_>>(), vec![2, 2, 2]);
    node.restart().await;
    for i in 0..6 {
        let got = node.client.get("default", &key(i)).await.expect("get");
        assert_eq!(got, Some(block(i, 5000)), "block {i} after restart");
    }
    node.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worn_key_is_rotated_by_the_node() {
    let mut node = rotating_after("8").await;
    put_range(&node.client, 0..40, 3000).await;
    let m = node.client.metrics().await.expect("metrics");
    let rotations: u64 = m
        .lines()
        .find_map(|l| l.strip_prefix("ctxpod_dek_rotations_total "))
        .and_then(|v| v.trim().parse().ok())
        .expect("rotation counter");
    assert!(
        (4..=5).contains(&rotations),
        "{rotations} rotations for 40 writes"
    );
    node.stop();
    let recs = records(&open_device(&node.dir));
    let ids: Vec<u32> = (0..40).map(|i| recs[&key(i)].1.key_id).collect();
    assert!(ids.windows(2).all(|w| w[0] <= w[1]), "{ids:?}");
    let distinct: BTreeSet<u32> = ids.iter().copied().collect();
    assert!(distinct.len() >= 5, "{ids:?}");
    for id in &distinct {
        let n = ids.iter().filter(|&&x| x == *id).count();
        assert!(n <= 8, "key {id} sealed {n} records: {ids:?}");
    }
    node.restart().await;
    for i in 0..40 {
        let got = node.client.get("default", &key(i)).await.expect("get");
        assert_eq!(got, Some(block(i, 3000)), "block {i} after restart");
    }
    node.stop();
}

fn write_kek(path: &std::path::Path, byte: u8) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, format!("{}\n", hex::encode([byte; 32]))).expect("write kek");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kek_rotates_online_and_an_unfinished_rotation_completes_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data_dir = dir.path().join("n");
    let kek = dir.path().join("kek");
    let previous = dir.path().join("kek.previous");
    write_kek(&kek, 0xa1);
    let kek_arg = kek.to_str().expect("utf-8").to_string();
    let mut node = Node::start_with(
        &data_dir,
        &["--capacity", "256MiB"],
        &[("CTXPOD_KEK_FILE", &kek_arg)],
    )
    .await;
    let c = node.client.clone();
    c.create_namespace("tenant-b", None)
        .await
        .expect("namespace");
    for (ns, i) in [("default", 0), ("tenant-b", 1)] {
        c.put(ns, &key(i), block(i, 4000), Durability::Durable)
            .await
            .expect("put");
    }
    let http = node.client.http().clone();
    let post = async |path: &str| -> serde_json::Value {
        let r = http
            .post(format!("{}{path}", node.url))
            .send()
            .await
            .expect("post");
        assert_eq!(r.status(), 200, "{path}");
        r.json().await.expect("json")
    };
    post("/v1/namespaces/tenant-b/rotate-key").await;
    c.put("tenant-b", &key(2), block(2, 4000), Durability::Durable)
        .await
        .expect("put");
    // Unchanged file: nothing to do.
    assert_eq!(post("/v1/admin/rotate-kek").await["rewrapped"], 0);
    // Online: a new KEK in the file; three data keys (default 1, tenant-b 1 and 2).
    write_kek(&kek, 0xb2);
    assert_eq!(post("/v1/admin/rotate-kek").await["rewrapped"], 3);
    let all = [("default", 0), ("tenant-b", 1), ("tenant-b", 2)];
    for (ns, i) in all {
        assert_eq!(c.get(ns, &key(i)).await.expect("get"), Some(block(i, 4000)));
    }
    node.stop();
    node.restart().await;
    for (ns, i) in all {
        let got = node.client.get(ns, &key(i)).await.expect("get");
        assert_eq!(got, Some(block(i, 4000)), "after restart under the new KEK");
    }
    node.stop();
    // Offline: the file replaced while the node is down. Without the previous KEK the node
    // refuses to start; with it, it re-wraps at start and serves.
    write_kek(&kek, 0xc3);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ctxpod"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--transfer-listen",
            "127.0.0.1:0",
            "--capacity",
            "256MiB",
        ])
        .arg("--data-dir")
        .arg(&data_dir)
        .env("CTXPOD_KEK_FILE", &kek_arg)
        .output()
        .expect("run ctxpod");
    assert!(
        !out.status.success(),
        "a node whose KEK unwraps nothing must not start"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot unwrap data key"), "{err}");
    write_kek(&previous, 0xb2);
    let prev_arg = previous.to_str().expect("utf-8").to_string();
    let mut node = Node::start_with(
        &data_dir,
        &["--capacity", "256MiB"],
        &[
            ("CTXPOD_KEK_FILE", &kek_arg),
            ("CTXPOD_KEK_PREVIOUS_FILE", &prev_arg),
        ],
    )
    .await;
    node.stop();
    std::fs::remove_file(&previous).expect("rm previous");
    let node = Node::start_with(
        &data_dir,
        &["--capacity", "256MiB"],
        &[("CTXPOD_KEK_FILE", &kek_arg)],
    )
    .await;
    for (ns, i) in all {
        let got = node.client.get(ns, &key(i)).await.expect("get");
        assert_eq!(
            got,
            Some(block(i, 4000)),
            "after the rotation finished at start"
        );
    }
}

/// Every file under `dir` (recursively) that contains `needle`.
fn files_holding(dir: &std::path::Path, needle: &[u8]) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).expect("read dir").flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_holding(&p, needle));
        } else if let Ok(b) = std::fs::read(&p) {
            if b.windows(needle.len()).any(|w| w == needle) {
                out.push(p);
            }
        }
    }
    out
}

/// The wrapped data keys of namespace `name` in a stopped node's index.
fn wrapped_deks(data_dir: &std::path::Path, name: &str) -> Vec<Vec<u8>> {
    let index = data_dir.join("index");
    let cfs = rocksdb::DB::list_cf(&rocksdb::Options::default(), &index).expect("list cfs");
    let db = rocksdb::DB::open_cf_for_read_only(&rocksdb::Options::default(), &index, &cfs, false)
        .expect("open the index read-only");
    let meta = db
        .get_cf(db.cf_handle("namespaces").expect("cf"), name)
        .expect("read")
        .expect("namespace meta");
    let id = serde_json::from_slice::<serde_json::Value>(&meta).expect("json")["id"]
        .as_u64()
        .expect("id") as u32;
    db.prefix_iterator_cf(db.cf_handle("keys").expect("cf"), id.to_be_bytes())
        .map(|r| r.expect("iterate"))
        .take_while(|(k, _)| k[..4] == id.to_be_bytes())
        .map(|(_, v)| v.to_vec())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_namespace_leaves_no_copy_of_its_wrapped_keys_in_the_index_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data_dir = dir.path().join("n");
    let mut node = Node::start(&data_dir, &["--capacity", "256MiB"]).await;
    node.client
        .create_namespace("shred", None)
        .await
        .expect("namespace");
    node.client
        .put("shred", &key(1), block(1, 4000), Durability::Durable)
        .await
        .expect("put");
    rotate_key(&node, "shred").await;
    node.stop();
    let deks = wrapped_deks(&data_dir, "shred");
    assert_eq!(deks.len(), 2, "two key generations");
    let index = data_dir.join("index");
    for d in &deks {
        assert!(
            !files_holding(&index, d).is_empty(),
            "the wrapped key is in the index files"
        );
    }
    node.restart().await;
    node.client
        .delete_namespace("shred")
        .await
        .expect("delete namespace");
    // Obsolete files are deleted by RocksDB in the background: wait for them (bounded).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let left: Vec<_> = deks.iter().flat_map(|d| files_holding(&index, d)).collect();
        if left.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "wrapped data keys still in {left:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    node.stop();
}
