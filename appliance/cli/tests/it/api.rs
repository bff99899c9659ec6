//! HTTP API v1 against the real binary: round trips, batches, match, pins, namespaces, and
//! every status code the contract lists.

use crate::common;

use common::{answered, block, eventually, metrics_contain, namespace_names, past_busy, Node};
use ctxpod_client::client::{ClientError, PutOutcome};
use ctxpod_wire::{frame, Durability};
use rand::{Rng, SeedableRng};
use reqwest::Method;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A key of 129 bytes, one over the limit.
const LONG_KEY_PATH: &str = concat!(
    "/v1/namespaces/default/blocks/",
    "abababababababababababababababababababababababababababababababab",
    "abababababababababababababababababababababababababababababababab",
    "abababababababababababababababababababababababababababababababab",
    "abababababababababababababababababababababababababababababababab",
    "ab"
);

/// How long a node has to get to a state the test waits for.
const SECS_20: Duration = Duration::from_secs(20);

/// Waits until `node` counts `n` requests in flight; fails with `what` after 20 s.
async fn inflight_becomes(node: &Node, n: u64, what: &str) {
    let inflight = async || node.client.stats().await.expect("stats").inflight_requests;
    eventually(SECS_20, what, async || inflight().await == n).await;
}

/// A 256 MiB node in a temp dir of its own, with environment variable `var` set to `value`.
async fn node_of_256mib_with(var: &str, value: &str) -> Node {
    Node::fresh_with(&["--capacity", "256MiB"], &[(var, value)]).await
}

fn status(e: ClientError) -> u16 {
    e.status()
        .unwrap_or_else(|| panic!("expected an HTTP status, got {e}"))
}

#[tokio::test]
async fn round_trip_random_blocks_from_1_byte_to_8_mib() {
    let node = Node::fresh(&["--capacity", "512MiB", "--dram", "32MiB"]).await;
    let c = &node.client;
    let seed = common::seed_from_env("CTXPOD_TEST_SEED", 1);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut sizes = vec![1, 2, 4095, 4096, 4097, 65_536, (1 << 20) + 7, 8 << 20];
    for _ in 0..24 {
        let exp = rng.gen_range(0..=23);
        sizes.push(rng.gen_range(1..=(1usize << exp)).min(8 << 20));
    }
    for (i, &len) in sizes.iter().enumerate() {
        let key = format!("rt{i:04}").into_bytes();
        let data = block(seed * 1000 + i as u64, len);
        assert_eq!(
            c.put("default", &key, data.clone(), Durability::Durable)
                .await
                .expect("put"),
            PutOutcome::Created,
            "size {len}"
        );
    }
    for (i, &len) in sizes.iter().enumerate() {
        let key = format!("rt{i:04}").into_bytes();
        let got = c.get("default", &key).await.expect("get").expect("present");
        assert_eq!(got, block(seed * 1000 + i as u64, len), "size {len}");
        assert!(c.head("default", &key).await.expect("head"));
    }
    // After a restart the DRAM tier is empty: every read comes from flash.
    let mut node = node;
    node.restart().await;
    let c = &node.client;
    for (i, &len) in sizes.iter().enumerate() {
        let key = format!("rt{i:04}").into_bytes();
        let got = c
            .get("default", &key)
            .await
            .expect("get")
            .expect("present after restart");
        assert_eq!(
            got,
            block(seed * 1000 + i as u64, len),
            "size {len} after restart"
        );
    }
    let s = c.stats().await.expect("stats");
    assert_eq!(
        s.hits - s.dram_hits,
        sizes.len() as u64,
        "reads after restart come from flash"
    );
    assert_eq!(s.integrity_errors, 0);
    // Embedded mode created the key-encryption key, readable by its owner only.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(node.dir.join("kek"))
        .expect("kek")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    // Blocks are sealed on the device: the first bytes of a stored block's plaintext are
    // nowhere a record's payload starts (every 4 KiB, after the 256-byte header).
    let dev = std::fs::read(node.dir.join("blocks.dev")).expect("device file");
    let plain = block(seed * 1000 + 6, (1 << 20) + 7);
    let needle = &plain[..64];
    let leaked = (0..dev.len() - 4096)
        .step_by(4096)
        .any(|p| &dev[p + 256..p + 256 + 64] == needle);
    assert!(!leaked, "plaintext found on the device");
}

#[tokio::test]
async fn put_semantics_and_error_codes() {
    let node = Node::fresh(&["--capacity", "256MiB"]).await;
    let c = &node.client;
    let data = block(7, 100_000);

    // 201 new, 200 same content, 409 different content.
    assert_eq!(
        c.put("default", b"k1", data.clone(), Durability::Durable)
            .await
            .expect("put"),
        PutOutcome::Created
    );
    assert_eq!(
        c.put("default", b"k1", data.clone(), Durability::Durable)
            .await
            .expect("re-put"),
        PutOutcome::Exists
    );
    assert_eq!(
        status(
            c.put("default", b"k1", block(8, 100_000), Durability::Durable)
                .await
                .unwrap_err()
        ),
        409
    );
    assert_eq!(
        c.get("default", b"k1").await.expect("get"),
        Some(data.clone()),
        "conflict left the block alone"
    );
    crc_mismatches_answer_422(&node, &data).await;
    bodies_over_the_limit_answer_413(&node).await;
    malformed_requests_answer_400(&node).await;

    // 404: unknown namespace and unknown block.
    assert_eq!(
        status(
            c.put("nope", b"k", data.clone(), Durability::Durable)
                .await
                .unwrap_err()
        ),
        404
    );
    assert_eq!(status(c.get("nope", b"k").await.unwrap_err()), 404);
    assert_eq!(c.get("default", b"absent").await.expect("get"), None);
    assert!(!c.head("default", b"absent").await.expect("head"));
    assert!(!c.delete("default", b"absent").await.expect("delete"));
    namespace_quota_answers_403(c).await;

    // Unknown routes and methods.
    let r = node
        .request(Method::GET, "/v2/nothing")
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 404);
    assert_eq!(
        r.json::<serde_json::Value>().await.expect("json")["error"],
        "no_route"
    );
    answered(
        node.request(Method::PATCH, "/v1/namespaces/default/blocks/00"),
        405,
    )
    .await;

    // Delete: 204 then 404.
    assert!(c.delete("default", b"k1").await.expect("delete"));
    assert_eq!(c.get("default", b"k1").await.expect("get"), None);
    assert!(!c.delete("default", b"k1").await.expect("delete"));
}

/// 422: a CRC header (or the client's own CRC) that does not match `data`; nothing stored.
/// The right CRC, in uppercase hex, with fast durability, is taken, and a GET answers it.
async fn crc_mismatches_answer_422(node: &Node, data: &bytes::Bytes) {
    let c = &node.client;
    let block_6b32 = "/v1/namespaces/default/blocks/6b32";
    let r = answered(
        node.request(Method::PUT, block_6b32)
            .header("x-ctxpod-crc32c", "00000000")
            .body(data.clone()),
        422,
    )
    .await;
    assert_eq!(
        r.json::<serde_json::Value>().await.expect("json")["error"],
        "integrity"
    );
    assert_eq!(
        c.get("default", b"k2").await.expect("get"),
        None,
        "nothing stored on a CRC mismatch"
    );
    // The client's own CRC path: a wrong CRC is refused the same way.
    let e = c
        .put_with_crc(
            "default",
            b"k3",
            data.clone(),
            ctxpod_wire::crc32c(data) ^ 1,
            Durability::Durable,
        )
        .await
        .unwrap_err();
    assert_eq!(status(e), 422);
    assert_eq!(c.get("default", b"k3").await.expect("get"), None);
    // The right CRC, uppercase hex accepted, and fast durability.
    let crc = format!("{:08X}", ctxpod_wire::crc32c(data));
    answered(
        node.request(Method::PUT, block_6b32)
            .header("x-ctxpod-crc32c", crc)
            .header("x-ctxpod-durability", "fast")
            .body(data.clone()),
        201,
    )
    .await;
    let r = answered(node.request(Method::GET, block_6b32), 200).await;
    assert_eq!(
        r.headers()["x-ctxpod-crc32c"].to_str().expect("ascii"),
        format!("{:08x}", ctxpod_wire::crc32c(data))
    );
}

/// A body one byte over one record's limit is a large value when it announces its length
/// (stored as extents), and answers 413 when it does not (chunked); nothing of that one is
/// stored. (Over the node's `value_bytes_max`: `values.rs`.)
async fn bodies_over_the_limit_answer_413(node: &Node) {
    let big = bytes::Bytes::from(vec![1u8; ctxpod_wire::BLOCK_BYTES_MAX + 1]);
    let path = "/v1/namespaces/default/blocks/b16a";
    answered(node.request(Method::PUT, path).body(big.clone()), 201).await;
    let got = node.client.get("default", &[0xb1, 0x6a]).await;
    assert_eq!(got.expect("get"), Some(big.clone()));
    let path = "/v1/namespaces/default/blocks/b16b";
    let stream = futures::stream::iter(
        big.chunks(1 << 20)
            .map(|c| Ok::<_, std::io::Error>(bytes::Bytes::copy_from_slice(c)))
            .collect::<Vec<_>>(),
    );
    let r = node
        .request(Method::PUT, path)
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 413, "chunked body over the limit");
    let got = node.client.get("default", &[0xb1, 0x6b]).await;
    assert_eq!(got.expect("get"), None);
}

/// 400: malformed key, header, JSON, namespace name; an empty block.
async fn malformed_requests_answer_400(node: &Node) {
    for (method, path, hdr) in [
        ("PUT", "/v1/namespaces/default/blocks/xyz", None),
        ("PUT", "/v1/namespaces/default/blocks/abc", None),
        ("GET", "/v1/namespaces/default/blocks/ABCD", None),
        (
            "PUT",
            "/v1/namespaces/default/blocks/abcd",
            Some(("x-ctxpod-durability", "maybe")),
        ),
        (
            "PUT",
            "/v1/namespaces/default/blocks/abcd",
            Some(("x-ctxpod-crc32c", "123")),
        ),
        ("PUT", "/v1/namespaces/Bad_Name/blocks/abcd", None),
        ("PUT", LONG_KEY_PATH, None),
        ("GET", LONG_KEY_PATH, None),
    ] {
        let mut rb = node
            .request(method.parse().expect("method"), path)
            .body("x");
        if let Some((k, v)) = hdr {
            rb = rb.header(k, v);
        }
        let r = rb.send().await.expect("send");
        assert_eq!(r.status(), 400, "{method} {path} {hdr:?}");
    }
    let bad_json = node.request(Method::POST, "/v1/namespaces/default/match");
    answered(bad_json.body("{not json"), 400).await;
    let r = node
        .request(Method::PUT, "/v1/namespaces/default/blocks/00")
        .body("")
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 400, "empty block");
}

/// 403 `quota`: namespace quota (a policy on the caller, not a full device); room made by
/// a delete takes the put.
async fn namespace_quota_answers_403(c: &ctxpod_client::client::Client) {
    c.create_namespace("small", Some(150_000))
        .await
        .expect("create");
    assert_eq!(
        c.put("small", b"a", block(1, 100_000), Durability::Durable)
            .await
            .expect("put"),
        PutOutcome::Created
    );
    let e = c
        .put("small", b"b", block(2, 100_000), Durability::Durable)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("quota"), "{e}");
    assert_eq!(status(e), 403);
    assert!(c.delete("small", b"a").await.expect("delete"));
    assert_eq!(
        c.put("small", b"b", block(2, 100_000), Durability::Durable)
            .await
            .expect("put"),
        PutOutcome::Created
    );
}

/// 503 with Retry-After when the in-flight limit is reached, then service resumes.
#[tokio::test]
async fn busy_answers_503_with_retry_after() {
    let node = node_of_256mib_with("CTXPOD_MAX_INFLIGHT_REQUESTS", "1").await;
    // A PUT whose body never finishes holds the only slot.
    let mut slow = node.raw_http().await;
    slow.write_all(
        b"PUT /v1/namespaces/default/blocks/aa HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n0123456789",
    )
    .await
    .expect("write");
    slow.flush().await.expect("flush");
    inflight_becomes(&node, 1, "the slow PUT never became in flight").await;
    let r = answered(
        node.request(Method::GET, "/v1/namespaces/default/blocks/aa"),
        503,
    )
    .await;
    assert_eq!(r.headers()["retry-after"], "1");
    assert_eq!(
        r.json::<serde_json::Value>().await.expect("json")["error"],
        "busy"
    );
    // Finish the slow request: it is stored, and the slot frees.
    slow.write_all(&[b'x'; 990]).await.expect("write rest");
    let mut buf = [0u8; 12];
    slow.read_exact(&mut buf).await.expect("read status");
    assert_eq!(&buf, b"HTTP/1.1 201");
    drop(slow);
    let after = past_busy(SECS_20, async || node.client.get("default", &[0xaa]).await).await;
    match after {
        Ok(Some(b)) => assert_eq!(b.len(), 1000),
        other => panic!("after the slot freed: {other:?}"),
    }
    metrics_contain(&node, "ctxpod_busy_rejections_total{queue=\"requests\"} 1").await;
}

#[tokio::test]
async fn batches_match_pins_and_namespaces() {
    let node = Node::fresh(&["--capacity", "256MiB"]).await;
    let c = &node.client;
    let (blocks, keys) = batch_puts_and_gets(c).await;

    // Match: the chain's first 25 keys are present, then a gap.
    let mut chain: Vec<Vec<u8>> = keys
        .iter()
        .filter(|k| *k != b"missing")
        .take(25)
        .cloned()
        .collect();
    assert_eq!(c.match_prefix("default", &chain).await.expect("match"), 25);
    chain.push(b"gap".to_vec());
    chain.push(blocks[30].0.clone());
    assert_eq!(c.match_prefix("default", &chain).await.expect("match"), 25);
    assert_eq!(c.match_prefix("default", &[]).await.expect("match"), 0);
    assert_eq!(
        c.match_prefix("default", &[b"gap".to_vec()])
            .await
            .expect("match"),
        0
    );

    // Pins count present keys only.
    let pk = vec![blocks[1].0.clone(), blocks[2].0.clone(), b"absent".to_vec()];
    assert_eq!(c.pin("default", &pk, 60_000).await.expect("pin"), 2);
    assert_eq!(c.stats().await.expect("stats").leases, 2);
    assert_eq!(c.unpin("default", &pk).await.expect("unpin"), 2);
    assert_eq!(status(c.pin("default", &pk, 0).await.unwrap_err()), 400);
    assert_eq!(
        status(
            c.pin("default", &pk, ctxpod_wire::LEASE_MS_MAX + 1)
                .await
                .unwrap_err()
        ),
        400
    );
    namespaces_are_isolated(c, &blocks[0]).await;

    let m = c.metrics().await.expect("metrics");
    for name in [
        "ctxpod_request_duration_seconds_bucket{op=\"put\"",
        "ctxpod_block_hits_total",
        "ctxpod_device_written_bytes_total",
        "ctxpod_io_engine_info{",
        "ctxpod_integrity_errors_total 0",
    ] {
        assert!(m.contains(name), "metrics lack {name}");
    }
}

/// 40 blocks batch-put (201 each), again (200 each), a batch with a conflicting and a new
/// block (409, 201), then batch-got with a missing key at index 5. The blocks, and the keys
/// asked for (the missing one among them).
async fn batch_puts_and_gets(
    c: &ctxpod_client::client::Client,
) -> (Vec<(Vec<u8>, bytes::Bytes)>, Vec<Vec<u8>>) {
    let blocks: Vec<(Vec<u8>, bytes::Bytes)> = (0..40u64)
        .map(|i| {
            (
                i.to_be_bytes().to_vec(),
                block(100 + i, 1 + (i as usize * 37_123) % 300_000),
            )
        })
        .collect();
    let st = c
        .batch_put("default", &blocks, Durability::Durable)
        .await
        .expect("batch put");
    assert_eq!(st, vec![201; 40]);
    let st = c
        .batch_put("default", &blocks, Durability::Fast)
        .await
        .expect("batch re-put");
    assert_eq!(st, vec![200; 40]);
    // A batch with one conflicting and one new block.
    let mixed = vec![
        (blocks[0].0.clone(), block(999, 10)),
        (b"new".to_vec(), block(5, 10)),
    ];
    assert_eq!(
        c.batch_put("default", &mixed, Durability::Durable)
            .await
            .expect("mixed"),
        vec![409, 201]
    );
    let mut keys: Vec<Vec<u8>> = blocks.iter().map(|(k, _)| k.clone()).collect();
    keys.insert(5, b"missing".to_vec());
    let got = c.batch_get("default", &keys).await.expect("batch get");
    assert_eq!(got.len(), 41);
    for (i, (k, d)) in got.iter().enumerate() {
        assert_eq!(k, &keys[i]);
        if i == 5 {
            assert!(d.is_none());
        } else {
            let j = if i < 5 { i } else { i - 1 };
            assert_eq!(d.as_ref(), Some(&blocks[j].1), "batch get entry {i}");
        }
    }
    (blocks, keys)
}

/// Namespaces are isolated: the same key (`first`'s, stored in `default`) holds different
/// content in `tenant-a`; deleting the namespace deletes its blocks, and a namespace of the
/// same name made again is empty.
async fn namespaces_are_isolated(
    c: &ctxpod_client::client::Client,
    first: &(Vec<u8>, bytes::Bytes),
) {
    let (key, data) = first;
    let info = c.create_namespace("tenant-a", None).await.expect("create");
    assert_eq!(info.block_count, 0);
    c.create_namespace("tenant-a", None)
        .await
        .expect("create again");
    assert_eq!(
        c.put("tenant-a", key, block(4242, 1000), Durability::Durable)
            .await
            .expect("put"),
        PutOutcome::Created
    );
    assert_eq!(
        c.get("default", key).await.expect("get"),
        Some(data.clone())
    );
    assert_eq!(
        c.get("tenant-a", key).await.expect("get"),
        Some(block(4242, 1000))
    );
    let names = namespace_names(c).await;
    assert_eq!(names, vec!["default".to_string(), "tenant-a".to_string()]);
    assert_eq!(c.namespace("tenant-a").await.expect("info").block_count, 1);
    c.delete_namespace("tenant-a").await.expect("delete ns");
    assert_eq!(status(c.get("tenant-a", key).await.unwrap_err()), 404);
    assert_eq!(
        status(c.delete_namespace("tenant-a").await.unwrap_err()),
        404
    );
    // Recreated: empty, with a new key; the old blocks do not come back.
    c.create_namespace("tenant-a", None)
        .await
        .expect("recreate");
    assert_eq!(c.get("tenant-a", key).await.expect("get"), None);
    assert_eq!(
        c.get("default", key).await.expect("get"),
        Some(data.clone())
    );
}

/// Every (method, path) of the OpenAPI document is routed by the live server, and its other
/// methods answer 405.
#[tokio::test]
async fn live_routes_match_the_spec() {
    let node = Node::fresh(&["--capacity", "256MiB"]).await;
    let http = node.client.http().clone();
    let spec: serde_json::Value = serde_json::from_str(ctxpod_wire::OPENAPI_JSON).expect("spec");
    let all = ["GET", "PUT", "POST", "DELETE", "HEAD", "PATCH"];
    for (path, item) in spec["paths"].as_object().expect("paths") {
        let concrete = path.replace("{ns}", "probe").replace("{key}", "00");
        for m in all {
            // HTTP: HEAD is answered wherever GET is.
            let declared =
                item.get(m.to_lowercase()).is_some() || (m == "HEAD" && item.get("get").is_some());
            let r = http
                .request(
                    m.parse().expect("method"),
                    format!("{}{concrete}", node.url),
                )
                .body(Vec::<u8>::new())
                .send()
                .await
                .expect("send");
            let s = r.status().as_u16();
            if declared {
                assert_ne!(s, 405, "{m} {path} is in the spec but not routed");
                if s == 404 && m != "HEAD" {
                    let body: serde_json::Value = r.json().await.expect("json");
                    assert_ne!(
                        body["error"], "no_route",
                        "{m} {path} is in the spec but not routed"
                    );
                }
            } else {
                assert_eq!(s, 405, "{m} {path} is routed but not in the spec");
            }
        }
    }
}

/// Found by the contract fuzzer (scripts/contract.sh): a JSON body must be an object (serde
/// takes an array for a struct, so `[null, null]` created a namespace), and a path that is
/// not UTF-8 answers the JSON error like every other 400.
#[tokio::test]
async fn json_bodies_are_objects_and_bad_paths_answer_json() {
    let node = Node::fresh(&["--capacity", "256MiB"]).await;
    let http = node.client.http().clone();
    for (method, path, body) in [
        ("PUT", "/v1/namespaces/arr", "[null, null]"),
        ("POST", "/v1/namespaces/default/match", r#"[["00ff"]]"#),
        ("POST", "/v1/namespaces/default/present", r#"[["00ff"]]"#),
        ("POST", "/v1/namespaces/default/pin", r#"[["00ff"], 1000]"#),
        ("POST", "/v1/namespaces/default/unpin", r#"[["00ff"]]"#),
        ("POST", "/v1/namespaces/default/batch/get", r#"[["00ff"]]"#),
        ("POST", "/v1/plan", r#"[0.5, 1, 512, 60]"#),
        ("GET", "/v1/namespaces/%FF", ""),
        ("GET", "/v1/namespaces/default/blocks/%FF%FE", ""),
    ] {
        let r = http
            .request(method.parse().unwrap(), format!("{}{path}", node.url))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .expect("send");
        assert_eq!(r.status().as_u16(), 400, "{method} {path} {body}");
        let e: serde_json::Value = r.json().await.unwrap_or_else(|e| {
            panic!("{method} {path}: not a JSON error: {e}");
        });
        assert_eq!(e["error"], "invalid", "{method} {path}: {e}");
    }
    let e = node.client.namespace("arr").await.unwrap_err();
    assert_eq!(status(e), 404, "no namespace was made from an array");
}

/// Truncated and malformed batch frames are refused with 400; the node goes on serving.
#[tokio::test]
async fn malformed_batch_frames() {
    let node = Node::fresh(&["--capacity", "256MiB"]).await;
    let c = &node.client;
    c.put("default", b"keep", block(1, 5000), Durability::Durable)
        .await
        .expect("put");
    let d = block(2, 3000);
    let good = frame::encode(&[frame::Entry::put(b"x1", &d), frame::Entry::put(b"x2", &d)]);
    let http = node.client.http().clone();
    let url = format!("{}/v1/namespaces/default/batch/put", node.url);
    for cut in [0, 3, 8, 15, 20, good.len() - 1] {
        let r = http
            .post(&url)
            .body(good[..cut].to_vec())
            .send()
            .await
            .expect("send");
        assert_eq!(r.status(), 400, "frame cut at {cut}");
    }
    let mut bad_magic = good.clone();
    bad_magic[0] = b'X';
    assert_eq!(
        http.post(&url)
            .body(bad_magic)
            .send()
            .await
            .expect("send")
            .status(),
        400
    );
    let mut trailing = good.clone();
    trailing.push(0);
    assert_eq!(
        http.post(&url)
            .body(trailing)
            .send()
            .await
            .expect("send")
            .status(),
        400
    );
    // An entry whose CRC is wrong is refused alone, with 422 in the answer frame.
    let mut bad_crc = frame::Entry::put(b"x3", &d);
    bad_crc.crc32c = Some(1);
    let body = frame::encode(&[bad_crc, frame::Entry::put(b"x4", &d)]);
    let r = http.post(&url).body(body).send().await.expect("send");
    assert_eq!(r.status(), 200);
    let b = r.bytes().await.expect("body");
    let st: Vec<u16> = frame::decode(&b)
        .expect("frame")
        .iter()
        .map(|e| e.status)
        .collect();
    assert_eq!(st, vec![422, 201]);
    // Batch get with more keys than the spec's maxItems: 400, as the spec says (413 is for a
    // body over its byte limit).
    let keys: Vec<Vec<u8>> = (0..ctxpod_wire::BATCH_ENTRIES_MAX as u32 + 1)
        .map(|i| i.to_be_bytes().to_vec())
        .collect();
    assert_eq!(
        status(c.batch_get("default", &keys).await.unwrap_err()),
        400
    );
    // The same for match and present (4096 keys at most).
    for op in ["match", "present"] {
        let keys: Vec<String> = (0..ctxpod_wire::MATCH_KEYS_MAX as u32 + 1)
            .map(|i| hex::encode(i.to_be_bytes()))
            .collect();
        let r = http
            .post(format!("{}/v1/namespaces/default/{op}", node.url))
            .json(&serde_json::json!({ "keys": keys }))
            .send()
            .await
            .expect("send");
        assert_eq!(r.status(), 400, "{op}");
    }
    // None of it disturbed the node.
    assert_eq!(
        c.get("default", b"keep").await.expect("get"),
        Some(block(1, 5000))
    );
    assert_eq!(c.get("default", b"x1").await.expect("get"), None);
    assert_eq!(c.get("default", b"x4").await.expect("get"), Some(d));
}

/// PUT bodies in flight are bounded in bytes: past the ingest budget, 503.
#[tokio::test]
async fn ingest_budget_answers_503() {
    let node = node_of_256mib_with("CTXPOD_INGEST_BYTES_MAX", "64MiB").await;
    // Eight 8 MiB bodies that never finish spend the 64 MiB budget.
    let mut held = Vec::new();
    for i in 0..8 {
        let mut s = node.raw_http().await;
        let head = format!(
            "PUT /v1/namespaces/default/blocks/{i:02x} HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\nabc",
            8 << 20
        );
        s.write_all(head.as_bytes()).await.expect("write");
        s.flush().await.expect("flush");
        held.push(s);
    }
    inflight_becomes(&node, 8, "the held PUTs never became in flight").await;
    let e = node
        .client
        .put("default", b"more", block(1, 1000), Durability::Durable)
        .await
        .unwrap_err();
    assert_eq!(status(e), 503);
    // Reads are not held back by the ingest budget.
    assert_eq!(
        node.client.get("default", b"more").await.expect("get"),
        None
    );
    drop(held);
    let more = async || {
        let c = &node.client;
        c.put("default", b"more", block(1, 1000), Durability::Durable)
            .await
    };
    if let Err(e) = past_busy(SECS_20, more).await {
        panic!("after the held bodies closed: {e}");
    }
    metrics_contain(&node, "ctxpod_busy_rejections_total{queue=\"ingest\"}").await;
}

/// Where io_uring is refused (a seccomp profile), the node falls back to pread/pwrite, says
/// so in its log, its stats and its metrics, and serves as usual.
#[tokio::test]
async fn falls_back_to_pread_pwrite_where_io_uring_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut node =
        Node::start_without_io_uring(&dir.path().join("n"), &["--capacity", "256MiB"]).await;
    let c = node.client.clone();
    let s = c.stats().await.expect("stats");
    assert_eq!(s.io_engine, "sync");
    let m = c.metrics().await.expect("metrics");
    assert!(
        m.contains("ctxpod_io_engine_info{direct=\"true\",engine=\"sync\"} 1"),
        "{m}"
    );
    assert!(
        node.log().contains("falling back to pread/pwrite"),
        "{}",
        node.log()
    );
    for i in 0..20u64 {
        let d = block(i, 1 + (i as usize * 99_991) % 2_000_000);
        c.put("default", &i.to_be_bytes(), d, Durability::Durable)
            .await
            .expect("put");
    }
    node.restart().await;
    let c = node.client.clone();
    for i in 0..20u64 {
        let d = block(i, 1 + (i as usize * 99_991) % 2_000_000);
        assert_eq!(
            c.get("default", &i.to_be_bytes()).await.expect("get"),
            Some(d)
        );
    }
    // Asked for io_uring explicitly, the node refuses to start rather than degrade silently.
    node.kill9();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ctxpod"));
    cmd.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--capacity",
        "256MiB",
        "--io-engine",
        "io_uring",
        "--data-dir",
    ])
    .arg(dir.path().join("n"));
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: the hook only makes prctl calls between fork and exec.
        unsafe {
            cmd.pre_exec(common::deny_io_uring_setup);
        }
    }
    let out = cmd.output().expect("run");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("io_uring"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The node's miss-ratio curve follows its block references: 1,000 blocks stored, then read
/// twice in the same order, hit in an LRU cache exactly when it holds all 1,000 (every
/// key tracked here, `mrc_sample_rate = 1`), and the default sampled node reports one too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_miss_ratio_curve_follows_the_references() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start_with(
        &dir.path().join("n"),
        &["--capacity", "256MiB"],
        &[("CTXPOD_MRC_SAMPLE_RATE", "1")],
    )
    .await;
    let c = &node.client;
    let keys: Vec<Vec<u8>> = (0..1000u32).map(|i| i.to_be_bytes().to_vec()).collect();
    for (i, k) in keys.iter().enumerate() {
        c.put("default", k, block(i as u64, 4096), Durability::Fast)
            .await
            .unwrap();
    }
    for _ in 0..2 {
        for k in &keys {
            assert!(c.get("default", k).await.unwrap().is_some());
        }
    }
    let m = c.mrc().await.unwrap();
    assert_eq!(m.references, 3000);
    assert_eq!(m.tracked_keys, 1000);
    assert_eq!(m.mean_block_bytes, 4096);
    assert_eq!(m.points.len(), 48);
    for p in &m.points {
        // Distances of about 1,000 fall in a bin 1.1 % wide: read around it, not in it.
        let want = if p.capacity_blocks < 985 {
            0.0
        } else if p.capacity_blocks >= 1015 {
            2.0 / 3.0
        } else {
            continue;
        };
        assert!((p.hit_ratio - want).abs() < 1e-6, "{p:?}");
        assert_eq!(p.capacity_bytes, p.capacity_blocks * 4096);
    }
    // A node with the default 1 % sampling answers too; one with it off says so.
    let sampled = Node::start(&dir.path().join("s"), &["--capacity", "256MiB"]).await;
    sampled
        .client
        .put("default", b"k", block(1, 4096), Durability::Fast)
        .await
        .unwrap();
    let m = sampled.client.mrc().await.unwrap();
    assert_eq!(m.references, 1);
    assert!((m.sample_rate - 0.01).abs() < 1e-6, "{}", m.sample_rate);
    let off = Node::start_with(
        &dir.path().join("o"),
        &["--capacity", "256MiB"],
        &[("CTXPOD_MRC_SAMPLE_RATE", "0")],
    )
    .await;
    assert_eq!(status(off.client.mrc().await.unwrap_err()), 404);
}

/// A batch GET larger than the caller's share of the egress budget: the node answers the
/// entries it cannot admit 503 (busy) and the client asks again for just those, until every
/// block is back byte for byte. (`ctxpod bench --protocol http --batch 32` failed its cold
/// 1 MiB reads on the first deferred entry, 2026-12-02.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_get_over_the_egress_share_gets_every_block() {
    let node = Node::fresh_with(
        &["--capacity", "256MiB", "--dram", "8MiB"],
        &[("CTXPOD_EGRESS_BYTES_PER_PEER_MAX", "8MiB")],
    )
    .await;
    let c = &node.client;
    let blocks: Vec<(Vec<u8>, bytes::Bytes)> = (0..32u64)
        .map(|i| (format!("e{i:02}").into_bytes(), block(i, 1 << 20)))
        .collect();
    for chunk in blocks.chunks(2) {
        let st = c
            .batch_put("default", chunk, Durability::Durable)
            .await
            .expect("batch put");
        assert_eq!(st, vec![201; chunk.len()]);
    }
    let keys: Vec<Vec<u8>> = blocks.iter().map(|(k, _)| k.clone()).collect();
    let before = c.busy_retries();
    let got = c.batch_get("default", &keys).await.expect("batch get");
    assert_eq!(got.len(), 32);
    for (i, (k, d)) in got.iter().enumerate() {
        assert_eq!(k, &keys[i]);
        assert_eq!(d.as_ref(), Some(&blocks[i].1), "entry {i}");
    }
    // 32 MiB through an 8 MiB share: the node deferred entries and the client asked again.
    assert!(c.busy_retries() > before, "no entry was deferred");
}

/// `GET /v1/namespaces/{ns}/blocks`: pages in byte order under a prefix, each acknowledged
/// put listed and each delete gone, the page limit, and bad queries refused with the JSON
/// 400 (nothing else changes).
#[tokio::test]
async fn keys_are_listed_in_pages_by_prefix() {
    let node = Node::fresh(&["--capacity", "256MiB"]).await;
    let c = &node.client;
    let mut keys: Vec<Vec<u8>> = (0..1500u32)
        .map(|i| [&[0x0a], &i.to_be_bytes()[..]].concat())
        .collect();
    keys.extend([vec![0x00], vec![0x0b, 0x01], vec![0xff; 128]]);
    for chunk in keys.chunks(500) {
        let blocks: Vec<(Vec<u8>, bytes::Bytes)> = chunk
            .iter()
            .map(|k| (k.clone(), block(k.len() as u64, 100)))
            .collect();
        let st = c
            .batch_put("default", &blocks, Durability::Fast)
            .await
            .expect("batch put");
        assert!(st.iter().all(|s| *s == 201), "{st:?}");
    }
    let mut sorted = keys.clone();
    sorted.sort();
    // The whole namespace, a page of the largest size at a time.
    let (got, pages) = list_all_keys(c).await;
    assert_eq!(got, sorted);
    assert_eq!(pages, 2);
    // Under a prefix; a full last page says there is no more when there is none.
    let page = c
        .list_keys("default", &[0x0a, 0, 0, 0x05], None, 256)
        .await
        .expect("prefix");
    assert_eq!(
        page.keys.len(),
        220,
        "0x0a000005dc..0x0a0005ff: 1500 - 0x500 = 220"
    );
    assert_eq!(page.next, None);
    let page = c.list_keys("default", &[0x0b], None, 1).await.expect("one");
    assert_eq!(page.keys, vec![vec![0x0b, 0x01]]);
    assert_eq!(
        page.next, None,
        "exactly one key under the prefix: no next page"
    );
    // A delete leaves the listing.
    assert!(c.delete("default", &[0x0b, 0x01]).await.expect("delete"));
    let page = c
        .list_keys("default", &[0x0b], None, 10)
        .await
        .expect("after delete");
    assert!(page.keys.is_empty() && page.next.is_none());
    // Another namespace is empty; an unknown one is 404.
    c.create_namespace("empty", None).await.expect("namespace");
    assert_eq!(
        c.list_keys("empty", &[], None, 10).await.expect("empty"),
        Default::default()
    );
    assert_eq!(
        status(c.list_keys("nope", &[], None, 10).await.unwrap_err()),
        404
    );
    bad_list_queries_answer_400(&node).await;
    // Measured as an operation of its own.
    metrics_contain(&node, "ctxpod_request_duration_seconds_count{op=\"list\"}").await;
}

/// Every key of namespace `default`, listed a page of the largest size at a time (each
/// page's `next` is its last key); and how many pages that took.
async fn list_all_keys(c: &ctxpod_client::client::Client) -> (Vec<Vec<u8>>, usize) {
    let mut got = Vec::new();
    let mut after: Option<Vec<u8>> = None;
    let mut pages = 0;
    loop {
        let page = c
            .list_keys("default", &[], after.as_deref(), ctxpod_wire::LIST_KEYS_MAX)
            .await
            .expect("list");
        pages += 1;
        got.extend(page.keys.iter().cloned());
        match page.next {
            Some(n) => {
                assert_eq!(Some(&n), page.keys.last());
                after = Some(n);
            }
            None => break,
        }
    }
    (got, pages)
}

/// Bad queries of a key listing: the JSON 400, naming what is wrong.
async fn bad_list_queries_answer_400(node: &Node) {
    let http = node.client.http().clone();
    let long_after = format!("after={}", "ab".repeat(129));
    for (query, says) in [
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("limit=x", "bad query"),
        ("prefix=0", "prefix"),
        ("prefix=AB", "prefix"),
        ("after=", "after"),
        ("after=zz", "after"),
        (long_after.as_str(), "after"),
        ("max-keys=5", "bad query"),
    ] {
        let r = http
            .get(format!("{}/v1/namespaces/default/blocks?{query}", node.url))
            .send()
            .await
            .expect("send");
        assert_eq!(r.status().as_u16(), 400, "{query}");
        let e: serde_json::Value = r.json().await.expect("a JSON error");
        assert_eq!(e["error"], "invalid", "{query}: {e}");
        assert!(
            e["message"].as_str().unwrap_or_default().contains(says),
            "{query}: {e}"
        );
    }
}
