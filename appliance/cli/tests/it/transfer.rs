//! The CXP1 transfer listener of the real binary: pipelined puts and gets on one connection,
//! byte-exact, the same blocks visible over HTTP; and abuse that must cost the abuser its
//! connection only.

use crate::common;

use bytes::Bytes;
use common::{block, Node};
use ctxpod_wire::proto::{self, status, Durability, FrameDecoder, Op, Request, Response};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_puts_and_gets_over_cxp1() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data_dir = dir.path().join("n");
    let node = Node::start(&data_dir, &["--capacity", "512MiB"]).await;
    let c = Arc::new(node.wire().await);
    c.ping().await.expect("ping");
    let key = |i: u64| Bytes::from(format!("cxp{i:03}").into_bytes());
    let len = |i: u64| 1 + (i as usize * 37_301) % 600_000;
    // Eight requests of five blocks each, all in flight at once on one connection.
    let puts = (0..8u64).map(|r| {
        let c = c.clone();
        async move {
            let blocks: Vec<(Bytes, Bytes)> = (r * 5..r * 5 + 5)
                .map(|i| (key(i), block(i, len(i))))
                .collect();
            c.put("default", &blocks, Durability::Durable).await
        }
    });
    for r in futures::future::join_all(puts).await {
        assert_eq!(r.expect("put"), vec![status::CREATED; 5]);
    }
    // Re-put: already there; a wrong CRC is refused per block (the client computes CRCs,
    // so send one block with the right key and other bytes: a conflict).
    let again = c
        .put("default", &[(key(0), block(0, len(0)))], Durability::Fast)
        .await
        .expect("re-put");
    assert_eq!(again, vec![status::OK]);
    let conflict = c
        .put("default", &[(key(1), block(99, 10))], Durability::Durable)
        .await
        .expect("conflicting put");
    assert_eq!(conflict, vec![status::CONFLICT]);
    let gets = (0..4u64).map(|r| {
        let c = c.clone();
        async move {
            let keys: Vec<Bytes> = (r * 10..r * 10 + 10).map(key).collect();
            (r, c.get("default", &keys).await)
        }
    });
    for (r, got) in futures::future::join_all(gets).await {
        let got = got.expect("get");
        for (j, g) in got.into_iter().enumerate() {
            let i = r * 10 + j as u64;
            assert_eq!(g, Some(block(i, len(i))), "block {i}");
        }
    }
    let missing = c.get("default", &[Bytes::from_static(b"nope")]).await;
    assert_eq!(missing.expect("get"), vec![None]);
    let chain: Vec<Bytes> = (0..40)
        .map(key)
        .chain([Bytes::from_static(b"zz")])
        .collect();
    assert_eq!(c.match_prefix("default", &chain).await.expect("match"), 40);
    // The same blocks over HTTP.
    let over_http = node.client.get("default", &key(7)).await.expect("http get");
    assert_eq!(over_http, Some(block(7, len(7))));
    // A namespace that does not exist: per-block 404.
    let r = c
        .put("nosuch", &[(key(0), block(0, 5))], Durability::Durable)
        .await;
    assert_eq!(r.expect("put"), vec![status::NOT_FOUND]);
    // A batch whose frame would exceed the node's 64 MiB limit is refused by the client,
    // with nothing sent: the connection, and the requests on it, carry on.
    let big: Vec<(Bytes, Bytes)> = (0..16u64)
        .map(|i| (key(100 + i), Bytes::from(vec![i as u8; 4 << 20])))
        .collect();
    let r = c.put("default", &big, Durability::Fast).await;
    assert!(
        matches!(
            r,
            Err(ctxpod_client::transfer_client::TransferError::TooLarge { .. })
        ),
        "{r:?}"
    );
    c.ping().await.expect("the connection is still up");
    assert_eq!(
        c.get("default", &[key(7)])
            .await
            .expect("get after refusal"),
        vec![Some(block(7, len(7)))]
    );
}

/// Reads until the server closes the connection (bounded in time).
async fn closed(s: &mut Box<dyn common::Io>) -> bool {
    let mut buf = vec![0u8; 4096];
    let deadline = std::time::Duration::from_secs(10);
    tokio::time::timeout(deadline, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return true,
                Ok(_) => continue,
            }
        }
    })
    .await
    .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abuse_costs_the_abuser_its_connection_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data_dir = dir.path().join("n");
    let node = Node::start(&data_dir, &["--capacity", "256MiB"]).await;
    let good = node.wire().await;
    common::put_over_wire(&good, "default", b"k", block(1, 1000)).await;

    // Not CXP1 at all.
    let mut s = node.raw_wire().await;
    s.write_all(b"GET / HTTP/1.1\r\n\r\n").await.expect("write");
    assert!(closed(&mut s).await, "a non-CXP1 peer is disconnected");

    // A frame announcing more than the limit.
    let mut s = node.raw_wire().await;
    common::cxp1_hello(&mut s).await;
    s.write_all(&(proto::FRAME_BYTES_MAX + 1).to_le_bytes())
        .await
        .expect("write");
    assert!(
        closed(&mut s).await,
        "an over-limit frame ends the connection"
    );

    // An unknown op.
    let mut s = node.raw_wire().await;
    common::cxp1_hello(&mut s).await;
    let mut f = (proto::HEADER_BYTES as u32).to_le_bytes().to_vec();
    f.push(200);
    f.extend_from_slice(&[0; 11]);
    s.write_all(&f).await.expect("write");
    assert!(closed(&mut s).await, "an unknown op ends the connection");

    // A malformed body (a key of length 0): an error answer, and the connection goes on.
    let mut s = node.raw_wire().await;
    common::cxp1_hello(&mut s).await;
    let body = [7u8, b'd', b'e', b'f', b'a', b'u', b'l', b't', 1, 0, 0, 0, 0];
    let mut f = ((proto::HEADER_BYTES + body.len()) as u32)
        .to_le_bytes()
        .to_vec();
    f.push(Op::Get as u8);
    f.push(0);
    f.extend_from_slice(&0u16.to_le_bytes());
    f.extend_from_slice(&42u64.to_le_bytes());
    f.extend_from_slice(&body);
    f.extend_from_slice(&Request::Ping.encode(43));
    s.write_all(&f).await.expect("write");
    let mut dec = FrameDecoder::new(proto::FRAME_BYTES_MAX);
    let mut got = Vec::new();
    let mut buf = vec![0u8; 4096];
    while got.len() < 2 {
        let n = s.read(&mut buf).await.expect("read");
        assert!(n > 0, "the connection stays open after a malformed body");
        dec.push(&buf[..n]);
        while let Some(fr) = dec.next_frame().expect("frames") {
            got.push((
                fr.header.request_id,
                fr.header.status,
                Response::decode(&fr),
            ));
        }
    }
    got.sort_by_key(|g| g.0);
    assert!(matches!(
        got[0],
        (42, status::BAD_REQUEST, Ok(Response::Error(_)))
    ));
    assert!(matches!(got[1], (43, status::OK, Ok(Response::Pong))));

    // Truncated: half a frame, then the peer goes away.
    let mut s = node.raw_wire().await;
    common::cxp1_hello(&mut s).await;
    let f = Request::Ping.encode(1);
    s.write_all(&f[..f.len() / 2]).await.expect("write");
    drop(s);

    // Everyone else is served as before, on both protocols.
    let got = good
        .get("default", &[Bytes::from_static(b"k")])
        .await
        .expect("get");
    assert_eq!(got, vec![Some(block(1, 1000))]);
    assert!(node.client.ready().await);
}

/// Far more requests in flight on one connection than the node runs at once (32): the node
/// answers the excess BUSY, and the client retries them with backoff until every put is
/// stored; then a pool spreads reads over several connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_is_retried_until_everything_is_stored() {
    use ctxpod_client::transfer_client::TransferPool;
    let dir = tempfile::tempdir().expect("tempdir");
    let data_dir = dir.path().join("n");
    let node = Node::start(&data_dir, &["--capacity", "512MiB"]).await;
    let addr = node.transfer_addr();
    let c = node.wire().await;
    let key = |i: u64| Bytes::from(format!("busy{i:04}").into_bytes());
    let puts = (0..300u64).map(|i| {
        let c = &c;
        async move {
            c.put(
                "default",
                &[(key(i), block(i, 30_000))],
                Durability::Durable,
            )
            .await
        }
    });
    for (i, r) in futures::future::join_all(puts)
        .await
        .into_iter()
        .enumerate()
    {
        assert_eq!(r.expect("put"), vec![status::CREATED], "put {i}");
    }
    eprintln!(
        "300 puts in flight at once: {} BUSY answers retried",
        c.busy_retries()
    );
    let pool = TransferPool::connect_with(&addr, 4, &node.how)
        .await
        .expect("pool");
    let gets = (0..300u64).map(|i| {
        let pool = &pool;
        async move { (i, pool.conn().get("default", &[key(i)]).await) }
    });
    for (i, got) in futures::future::join_all(gets).await {
        assert_eq!(got.expect("get"), vec![Some(block(i, 30_000))], "block {i}");
    }
}

/// Batch GETs whose answers together take the connection's whole output budget (64 MiB):
/// each GET reserves its blocks' bytes when it is planned, so three 32 × 1 MiB GETs in
/// flight on one connection hold it all before any is written. Each must still be answered
/// (it used to wait, with its reservation held, for more of the same budget: a deadlock
/// that `ctxpod bench --protocol cxp1 --batch 32` hit with cold reads).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_gets_that_fill_the_output_budget_are_all_answered() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = Node::start(
        &dir.path().join("n"),
        &["--capacity", "1GiB", "--dram", "16MiB"],
    )
    .await;
    let c = node.wire().await;
    let key = |i: u64| Bytes::from(format!("big{i:04}").into_bytes());
    for chunk in (0..96u64).collect::<Vec<_>>().chunks(16) {
        let blocks: Vec<(Bytes, Bytes)> =
            chunk.iter().map(|&i| (key(i), block(i, 1 << 20))).collect();
        let st = c
            .put("default", &blocks, Durability::Durable)
            .await
            .expect("put");
        assert!(st.iter().all(|&s| s == status::CREATED), "{st:?}");
    }
    let gets = (0..3u64).map(|g| {
        let (c, keys) = (&c, (g * 32..(g + 1) * 32).map(key).collect::<Vec<_>>());
        async move { (g, c.get_each("default", &keys).await) }
    });
    // A liveness bound, not a speed target: the deadlock never ends.
    let answered = tokio::time::timeout(
        std::time::Duration::from_secs(120),
        futures::future::join_all(gets),
    )
    .await
    .expect("every batch GET is answered");
    for (g, got) in answered {
        let got = got.expect("the GET");
        for (j, e) in got.into_iter().enumerate() {
            let i = g * 32 + j as u64;
            match e {
                // Entries over the frame or the budgets are answered 413 / BUSY, never lost.
                Err(ctxpod_client::transfer_client::TransferError::Refused {
                    status: s, ..
                }) => {
                    assert!(
                        s == status::TOO_LARGE || s == status::BUSY,
                        "block {i}: {s}"
                    )
                }
                r => assert_eq!(r.expect("entry"), Some(block(i, 1 << 20)), "block {i}"),
            }
        }
    }
}
