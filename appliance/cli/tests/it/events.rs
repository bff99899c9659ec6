//! KV events of the real binary, over both carriers: the CXP1 `Subscribe` op and server-sent
//! events on HTTP. Stored, deleted and evicted keys of the subscribed namespace arrive (and
//! no other namespace's); deleting the namespace ends both streams.

use crate::common;

use bytes::Bytes;
use common::{answered, block, Node};
use ctxpod_client::transfer_client::Subscription;
use ctxpod_wire::proto::{Durability, EventKind};
use futures::StreamExt;
use reqwest::Method;
use std::collections::HashSet;
use std::time::Duration;

/// Reads SSE events from `/v1/namespaces/{ns}/events` into a channel (name, data).
async fn sse(node: &Node, ns: &str) -> tokio::sync::mpsc::Receiver<(String, String)> {
    let path = format!("/v1/namespaces/{ns}/events");
    let resp = answered(node.request(Method::GET, &path), 200).await;
    assert_eq!(
        resp.headers()["content-type"].to_str().expect("ascii"),
        "text/event-stream"
    );
    let (tx, rx) = tokio::sync::mpsc::channel(100_000);
    tokio::spawn(async move {
        let mut body = resp.bytes_stream();
        let mut buf = String::new();
        let (mut name, mut data) = (String::new(), String::new());
        while let Some(Ok(chunk)) = body.next().await {
            buf.push_str(std::str::from_utf8(&chunk).expect("utf-8"));
            while let Some(nl) = buf.find('\n') {
                let line: String = buf.drain(..=nl).collect();
                let line = line.trim_end_matches('\n');
                if let Some(v) = line.strip_prefix("event:") {
                    name = v.trim().to_string();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data = v.trim().to_string();
                } else if line.is_empty() && !name.is_empty() {
                    let ev = (std::mem::take(&mut name), std::mem::take(&mut data));
                    if tx.send(ev).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    rx
}

fn key(i: usize) -> Bytes {
    Bytes::from(format!("ev{i:05}").into_bytes())
}

/// Collects events from a subscription until `want` of them arrived (bounded in time).
async fn collect(sub: &mut Subscription, want: usize) -> Vec<(EventKind, Bytes)> {
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), async {
        while out.len() < want {
            let b = sub.next().await.expect("the subscription is live");
            assert_eq!(b.lost, 0, "a subscriber that keeps up loses nothing");
            out.extend(b.events);
        }
    })
    .await
    .expect("events within a minute");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_deleted_and_evicted_keys_reach_subscribers_of_their_namespace_only() {
    let node = Node::fresh(&["--capacity", "128MiB", "--dram", "1MiB"]).await;
    node.client
        .create_namespace("tenant-a", None)
        .await
        .expect("namespace");
    let c = node.wire().await;
    let mut sub = c.subscribe("tenant-a").await.expect("subscribe");
    let mut http = sse(&node, "tenant-a").await;
    // Another namespace's traffic is not seen.
    c.put("default", &[(key(0), block(0, 100))], Durability::Durable)
        .await
        .expect("put");
    // Stored, re-put (no event), deleted.
    let blocks: Vec<(Bytes, Bytes)> = (0..3).map(|i| (key(i), block(i as u64, 1000))).collect();
    c.put("tenant-a", &blocks, Durability::Durable)
        .await
        .expect("put");
    c.put("tenant-a", &blocks[..1], Durability::Durable)
        .await
        .expect("re-put");
    assert!(node
        .client
        .delete("tenant-a", &key(1))
        .await
        .expect("delete"));
    let got = collect(&mut sub, 4).await;
    let stored: HashSet<Bytes> = got
        .iter()
        .filter(|(k, _)| *k == EventKind::Stored)
        .map(|(_, key)| key.clone())
        .collect();
    assert_eq!(stored, (0..3).map(key).collect());
    assert_eq!(got[3], (EventKind::Deleted, key(1)), "{got:?}");
    // The same over HTTP.
    sse_says_stored_3_then_deleted_1(&mut http).await;
    // Churn past the capacity: the first blocks are evicted, and the events say so.
    let evicted = churn_until_0_and_2_are_evicted(&c, &mut sub).await;
    let stats = node.client.stats().await.expect("stats");
    assert!(evicted.len() as u64 <= stats.evicted_blocks);
    // Deleting the namespace ends both streams.
    node.client
        .delete_namespace("tenant-a")
        .await
        .expect("delete namespace");
    tokio::time::timeout(Duration::from_secs(60), async {
        while sub.next().await.is_some() {}
        loop {
            match http.recv().await {
                Some((n, _)) if n == "namespace-deleted" => break,
                Some(_) => continue,
                None => panic!("the SSE stream ended without namespace-deleted"),
            }
        }
    })
    .await
    .expect("both streams end");
    // Subscribing to a namespace that does not exist is refused on both carriers.
    assert!(c.subscribe("nosuch").await.is_err());
    answered(
        node.request(Method::GET, "/v1/namespaces/nosuch/events"),
        404,
    )
    .await;
}

/// The next four SSE events: three keys stored, then key 1 deleted.
async fn sse_says_stored_3_then_deleted_1(
    http: &mut tokio::sync::mpsc::Receiver<(String, String)>,
) {
    let mut seen = Vec::new();
    for _ in 0..4 {
        let e = tokio::time::timeout(Duration::from_secs(60), http.recv()).await;
        seen.push(
            e.expect("an SSE event within a minute")
                .expect("an SSE event"),
        );
    }
    assert_eq!(
        seen.iter().filter(|(n, _)| n == "stored").count(),
        3,
        "{seen:?}"
    );
    assert_eq!(
        seen[3],
        (
            "deleted".to_string(),
            format!("{{\"key\":\"{}\"}}", hex::encode(key(1)))
        )
    );
}

/// Churns 400 blocks of 512 KiB into `tenant-a` through `c` (past the capacity) until `sub`
/// announced keys 0 and 2 evicted; the keys announced evicted. The subscription is read
/// while the churn goes on, as a subscriber that keeps up does (the client buffers 64
/// batches; beyond that it counts events as lost).
async fn churn_until_0_and_2_are_evicted(
    c: &ctxpod_client::transfer_client::TransferClient,
    sub: &mut Subscription,
) -> HashSet<Bytes> {
    let churn: Vec<(Bytes, Bytes)> = (100..500)
        .map(|i| (key(i), block(i as u64, 512 << 10)))
        .collect();
    let puts = async {
        for chunk in churn.chunks(16) {
            c.put("tenant-a", chunk, Durability::Fast)
                .await
                .expect("churn put");
        }
    };
    let mut evicted = HashSet::new();
    let watch = async {
        while !(evicted.contains(&key(0)) && evicted.contains(&key(2))) {
            let b = sub.next().await.expect("live");
            assert_eq!(b.lost, 0, "a subscriber that keeps up loses nothing");
            for (k, key) in b.events {
                if k == EventKind::Evicted {
                    evicted.insert(key);
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), async { tokio::join!(puts, watch) })
        .await
        .expect("eviction events for the first blocks");
    evicted
}
