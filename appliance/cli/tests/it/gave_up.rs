//! Writes their client gave up on (closed or reset the connection before the node read
//! them) are not applied, through both doors of a node: a put that waited in a stalled
//! node's socket buffers must not land after whatever the client did since
//! (api/PROTOCOL.md, "Deadlines"; the pod-level case is
//! `pod::values::a_put_a_frozen_member_receives_late_never_undoes_a_delete`).
//!
//! Each request is sent with `TCP_CORK` and followed by `shutdown(SHUT_WR)`, so that its
//! last segment carries the FIN: the node never reads the request before it could know the
//! client has gone, as a frozen node never does.

use crate::common::{counter, Node};
use bytes::Bytes;
use ctxpod_wire::proto::{Hello, Request, HELLO_BYTES};
use ctxpod_wire::Durability;
use std::os::fd::AsRawFd;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const BLOCK: usize = 64 << 10;

/// Sends `bytes` on `s` and closes its sending side, the FIN in the same segment as the
/// last bytes; then reads whatever comes back until the node closes (10 s at most).
async fn send_and_close(mut s: TcpStream, bytes: &[u8]) -> Vec<u8> {
    let one: libc::c_int = 1;
    // SAFETY: a valid option value of its size, on the stream's open socket.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CORK,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "TCP_CORK");
    s.write_all(bytes).await.expect("write the request");
    s.shutdown().await.expect("shut the sending side");
    let mut back = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut back)).await;
    back
}

fn block(seed: u8) -> Bytes {
    Bytes::from((0..BLOCK).map(|i| (i as u8) ^ seed).collect::<Vec<_>>())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_whose_client_has_gone_is_not_applied_through_either_door() {
    let node = Node::fresh(&["--capacity", "256MiB"]).await;
    let addr = node.url.trim_start_matches("http://").to_string();

    // HTTP: the request whole, then the FIN.
    let http_put = |key: &[u8], data: &Bytes| {
        let mut req = format!(
            "PUT /v1/namespaces/default/blocks/{} HTTP/1.1\r\nhost: x\r\n\
             content-type: application/octet-stream\r\ncontent-length: {}\r\n\r\n",
            hex::encode(key),
            data.len()
        )
        .into_bytes();
        req.extend_from_slice(data);
        req
    };
    let s = TcpStream::connect(&addr).await.expect("connect");
    let back = send_and_close(s, &http_put(b"http-gone", &block(1))).await;
    assert!(
        !back.starts_with(b"HTTP/1.1 201"),
        "a PUT whose client had gone was answered stored: {:?}",
        String::from_utf8_lossy(&back[..back.len().min(80)])
    );
    assert!(
        !node
            .client
            .head("default", b"http-gone")
            .await
            .expect("HEAD"),
        "a PUT over HTTP whose client had gone was stored"
    );
    // The same request on a connection kept open is stored: the request itself is good.
    let mut s = TcpStream::connect(&addr).await.expect("connect");
    s.write_all(&http_put(b"http-kept", &block(2)))
        .await
        .expect("write");
    let mut head = [0u8; 12];
    s.read_exact(&mut head).await.expect("an answer");
    assert_eq!(&head, b"HTTP/1.1 201", "the control PUT");
    assert!(node
        .client
        .head("default", b"http-kept")
        .await
        .expect("HEAD"));

    // CXP1: the hello exchanged, then a Put frame and the FIN.
    let cxp1_put = |key: &'static [u8], seed: u8| {
        let data = block(seed);
        Request::Put {
            ns: "default".into(),
            durability: Durability::Durable,
            entries: vec![ctxpod_wire::proto::PutEntry {
                key: Bytes::from_static(key),
                crc32c: ctxpod_wire::crc32c(&data),
                data,
            }],
        }
        .encode(1)
    };
    let hello = Hello {
        version: ctxpod_wire::proto::VERSION,
        flags: 0,
        max_frame_bytes: ctxpod_wire::proto::FRAME_BYTES_MAX,
        value_bytes_max: 0,
    };
    let abandoned = "ctxpod_abandoned_writes_total ";
    let before = counter(&node.client.metrics().await.expect("metrics"), abandoned);
    let mut s = TcpStream::connect(node.transfer_addr())
        .await
        .expect("connect");
    s.write_all(&hello.encode()).await.expect("hello");
    let mut theirs = [0u8; HELLO_BYTES];
    s.read_exact(&mut theirs).await.expect("the node's hello");
    let back = send_and_close(s, &cxp1_put(b"cxp1-gone", 3)).await;
    assert!(back.is_empty(), "a Put whose client had gone was answered");
    assert!(
        !node
            .client
            .head("default", b"cxp1-gone")
            .await
            .expect("HEAD"),
        "a CXP1 Put whose client had gone was stored"
    );
    let after = counter(&node.client.metrics().await.expect("metrics"), abandoned);
    assert_eq!(after, before + 1, "the abandoned Put is counted");
    // And a client that stays is served.
    let tc = node.wire().await;
    let st = tc
        .put(
            "default",
            &[(Bytes::from_static(b"cxp1-kept"), block(4))],
            Durability::Durable,
        )
        .await
        .expect("the control Put");
    assert_eq!(st, [201]);
}

/// A `batch/put` whose client has gone is not applied either (the HTTP check that the
/// forwarding node's late puts showed was needed covers the batch door too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_put_whose_client_has_gone_is_not_applied() {
    let node = Node::fresh(&["--capacity", "256MiB"]).await;
    let addr = node.url.trim_start_matches("http://").to_string();
    let data = block(5);
    let mut frame = Vec::new();
    ctxpod_wire::frame::encode_header(1, &mut frame);
    ctxpod_wire::frame::encode_entry(
        &ctxpod_wire::frame::Entry {
            key: b"batch-gone",
            status: 0,
            crc32c: Some(ctxpod_wire::crc32c(&data)),
            len: data.len() as u32,
            data: Some(&data),
        },
        &mut frame,
    );
    let mut req = format!(
        "POST /v1/namespaces/default/batch/put HTTP/1.1\r\nhost: x\r\n\
         content-type: application/octet-stream\r\ncontent-length: {}\r\n\r\n",
        frame.len()
    )
    .into_bytes();
    req.extend_from_slice(&frame);
    let s = TcpStream::connect(&addr).await.expect("connect");
    let back = send_and_close(s, &req).await;
    assert!(
        !back.starts_with(b"HTTP/1.1 200"),
        "a batch/put whose client had gone was answered: {:?}",
        String::from_utf8_lossy(&back[..back.len().min(80)])
    );
    assert!(
        !node
            .client
            .head("default", b"batch-gone")
            .await
            .expect("HEAD"),
        "a batch/put over HTTP whose client had gone was stored"
    );
}
