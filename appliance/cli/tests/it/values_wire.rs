//! Large values (issue #34) over CXP1 (`PutValue` / `GetValue`) with the Rust client, on a
//! real node process: engine-sized values byte-exact across a `kill -9`, ranges, the same
//! and other bytes again, the node's limit announced in its hello and enforced, and the
//! protocol's edges on a raw connection (a value cut short, pieces out of order, a piece
//! of a value that is not open): nothing partial is ever stored and the connection goes on.

use crate::common;

use bytes::Bytes;
use common::{block, Node};
use ctxpod_client::connect::Connect;
use ctxpod_wire::proto::{self, status, Durability, Op, Request, Response, ValuePiece};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MIB: usize = 1 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_sized_values_round_trip_over_cxp1_across_kill_9() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut node = Node::start(&dir.path().join("n"), &["--capacity", "1GiB"]).await;
    let c = node.wire().await;
    assert_eq!(c.value_bytes_max(), ctxpod_wire::VALUE_BYTES_MAX_DEFAULT);
    // A Llama-3-8B LMCache chunk (chunk_size 256), a KVBM block of a 70B model, an SGLang
    // page and a layer-wise block, in one call: the large ones go as values.
    let values = [
        (Bytes::from_static(b"llama3-8b"), block(1, 32 * MIB + 28)),
        (Bytes::from_static(b"kvbm-70b"), block(2, 10 * MIB)),
        (Bytes::from_static(b"sglang-page"), block(3, 8 * MIB)),
        (Bytes::from_static(b"layer"), block(4, 64 << 10)),
    ];
    let st = c
        .put("default", &values, Durability::Durable)
        .await
        .expect("put");
    assert_eq!(st, vec![status::CREATED; 4]);
    let keys: Vec<Bytes> = values.iter().map(|(k, _)| k.clone()).collect();
    let got = c.get("default", &keys).await.expect("get");
    for ((k, v), g) in values.iter().zip(&got) {
        assert_eq!(g.as_ref(), Some(v), "{k:?}");
    }
    // A range across the first extent boundary, and one to the end.
    let (k, v) = &values[0];
    let at = (4 * MIB - 10) as u64;
    let r = c
        .get_value("default", k, Some((at, at + 20)))
        .await
        .expect("range");
    assert_eq!(r.as_deref(), Some(&v[at as usize..at as usize + 20]));
    let tail = c
        .get_value("default", k, Some((32 * MIB as u64, u64::MAX)))
        .await;
    assert_eq!(tail.expect("tail").as_deref(), Some(&v[32 * MIB..]));
    let past = c
        .get_value("default", k, Some((v.len() as u64, u64::MAX)))
        .await;
    assert!(
        matches!(
            past,
            Err(ctxpod_client::transfer_client::TransferError::Refused { status: 416, .. })
        ),
        "{past:?}"
    );
    assert_eq!(
        c.get_value("default", &Bytes::from_static(b"absent"), None)
            .await
            .expect("a miss"),
        None
    );
    node.kill9();
    node.restart().await;
    let c = node.wire().await;
    let got = c.get("default", &keys).await.expect("get after kill -9");
    for ((k, v), g) in values.iter().zip(&got) {
        assert_eq!(g.as_ref(), Some(v), "{k:?} after kill -9");
    }
    // The same bytes again: 200; other bytes under the key: 409, the stored value kept.
    let again = c.put_value("default", k, v, Durability::Durable).await;
    assert_eq!(again.expect("re-put"), status::OK);
    let other = block(9, 32 * MIB + 28);
    let conflict = c.put_value("default", k, &other, Durability::Durable).await;
    assert_eq!(conflict.expect("conflicting put"), status::CONFLICT);
    assert_eq!(
        c.get_value("default", k, None).await.expect("get").as_ref(),
        Some(v)
    );
    let s = node.client.stats().await.expect("stats");
    let total: usize = values.iter().map(|(_, v)| v.len()).sum();
    assert_eq!((s.block_count, s.live_bytes), (4, total as u64));
}

/// `get_value_into` (CXP1) and `get_into` (HTTP) land a value in the caller's buffer: one
/// shorter than the value grows, a longer one keeps its length (the value is its first
/// bytes, the rest untouched), a miss gives the buffer back unchanged, a range lands at 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_land_in_the_callers_buffer_over_cxp1_and_http() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = Node::start(&dir.path().join("n"), &["--capacity", "512MiB"]).await;
    let c = node.wire().await;
    let (k, v) = (Bytes::from_static(b"chunk"), block(5, 32 * MIB + 28));
    let small = (Bytes::from_static(b"small"), block(6, 64 << 10));
    let both = [(k.clone(), v.clone()), small.clone()];
    let st = c.put("default", &both, Durability::Durable).await;
    assert_eq!(st.expect("put"), vec![status::CREATED; 2]);
    let (buf, n) = c
        .get_value_into("default", &k, None, vec![7; 10])
        .await
        .expect("cxp1");
    assert_eq!((n, buf.len()), (Some(v.len()), v.len()));
    assert_eq!(&buf[..], &v[..]);
    let long = vec![0xAB; 40 * MIB];
    let (buf, n) = c
        .get_value_into("default", &k, None, long)
        .await
        .expect("cxp1");
    assert_eq!((n, buf.len()), (Some(v.len()), 40 * MIB));
    assert_eq!(&buf[..v.len()], &v[..]);
    assert!(
        buf[v.len()..].iter().all(|&b| b == 0xAB),
        "past the value: untouched"
    );
    let at = (8 * MIB - 3) as u64;
    let range = Some((at, at + MIB as u64));
    let (buf, n) = c
        .get_value_into("default", &k, range, buf)
        .await
        .expect("range");
    assert_eq!(n, Some(MIB));
    assert_eq!(&buf[..MIB], &v[at as usize..at as usize + MIB]);
    let absent = Bytes::from_static(b"absent");
    let (buf, n) = c
        .get_value_into("default", &absent, None, buf)
        .await
        .expect("miss");
    assert_eq!(
        (n, buf.len()),
        (None, 40 * MIB),
        "a miss gives the buffer back"
    );
    // HTTP: the same value, a small block, a miss, into one buffer read over and over.
    let (buf, n) = node
        .client
        .get_into("default", &k, Vec::new())
        .await
        .expect("http");
    assert_eq!(n, Some(v.len()));
    assert_eq!(&buf[..v.len()], &v[..]);
    let (buf, n) = node
        .client
        .get_into("default", &small.0, buf)
        .await
        .expect("http");
    assert_eq!((n, buf.len()), (Some(small.1.len()), v.len()));
    assert_eq!(&buf[..small.1.len()], &small.1[..]);
    let (buf, n) = node
        .client
        .get_into("default", b"absent", buf)
        .await
        .expect("miss");
    assert_eq!((n, buf.len()), (None, v.len()));
}

/// A node whose `value_bytes_max` is 24 MiB says so in its hello, and refuses a larger
/// value at its first piece (413), with nothing stored and the connection usable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_over_the_nodes_limit_is_refused_at_its_first_piece() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = "value_bytes_max = \"24MiB\"\n";
    let args = ["--capacity", "256MiB"];
    let node = Node::start_configured(
        &dir.path().join("n"),
        &args,
        config,
        Connect::default(),
        false,
    )
    .await;
    let c = node.wire().await;
    assert_eq!(c.value_bytes_max(), 24 << 20);
    let key = Bytes::from_static(b"too-big");
    let st = c
        .put_value(
            "default",
            &key,
            &block(5, 24 * MIB + 1),
            Durability::Durable,
        )
        .await
        .expect("answered");
    assert_eq!(st, status::TOO_LARGE);
    c.ping().await.expect("the connection goes on");
    let st = c
        .put_value("default", &key, &block(5, 24 * MIB), Durability::Fast)
        .await
        .expect("answered");
    assert_eq!(st, status::CREATED);
    let s = node.client.stats().await.expect("stats");
    assert_eq!((s.block_count, s.live_bytes), (1, 24 * MIB as u64));
}

/// One `PutValue` frame of a 12 MiB value under `key`: the piece at `offset`.
fn piece(key: &'static [u8], value: &Bytes, offset: usize, id: u64) -> Bytes {
    let n = ctxpod_wire::value_piece_len(value.len() as u64, offset as u64);
    Request::PutValue(ValuePiece {
        ns: "default".into(),
        key: Bytes::from_static(key),
        durability: Durability::Durable,
        len: value.len() as u64,
        crc32c: ctxpod_wire::crc32c(value),
        offset: offset as u64,
        data: value.slice(offset..offset + n),
    })
    .encode(id)
}

/// Reads frames until the one answering `id`.
async fn answer_to<S: tokio::io::AsyncRead + Unpin>(s: &mut S, id: u64) -> (u16, Response) {
    let mut d = proto::FrameDecoder::new(proto::FRAME_BYTES_MAX);
    let mut buf = vec![0u8; 1 << 16];
    loop {
        while let Some(f) = d.next_frame().expect("frames") {
            if f.header.request_id == id {
                return (f.header.status, Response::decode(&f).expect("a response"));
            }
        }
        let n = tokio::time::timeout(Duration::from_secs(30), s.read(&mut buf))
            .await
            .expect("answered")
            .expect("read");
        assert!(n > 0, "the node closed the connection");
        d.push(&buf[..n]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_cut_short_or_out_of_order_stores_nothing_and_the_connection_goes_on() {
    let node = Node::fresh(&["--capacity", "256MiB"]).await;
    let value = block(6, 12 * MIB);
    // Pieces out of order: the second piece before the first ends the value (400).
    let mut s = node.raw_wire().await;
    common::cxp1_hello(&mut s).await;
    s.write_all(&piece(b"ooo", &value, 0, 1))
        .await
        .expect("send");
    s.write_all(&piece(b"ooo", &value, 8 * MIB, 1))
        .await
        .expect("send");
    let (st, r) = answer_to(&mut s, 1).await;
    assert_eq!(st, status::BAD_REQUEST, "{r:?}");
    // A piece of a value that is not open is skipped without an answer; a first piece
    // that is not the first piece's size is refused.
    s.write_all(&piece(b"ooo", &value, 4 * MIB, 1))
        .await
        .expect("send");
    s.write_all(&Request::Ping.encode(2)).await.expect("ping");
    assert_eq!(answer_to(&mut s, 2).await, (status::OK, Response::Pong));
    // The first two pieces of another value, then the connection closes.
    s.write_all(&piece(b"cut", &value, 0, 3))
        .await
        .expect("send");
    s.write_all(&piece(b"cut", &value, 4 * MIB, 3))
        .await
        .expect("send");
    s.flush().await.expect("flush");
    drop(s);
    let c = &node.client;
    common::eventually(
        Duration::from_secs(10),
        "the cut value is over",
        async || c.stats().await.is_ok_and(|s| s.inflight_requests <= 1),
    )
    .await;
    for k in [&b"ooo"[..], b"cut"] {
        assert_eq!(c.get("default", k).await.expect("get"), None);
    }
    // The whole value on a new connection, in order: stored.
    let mut s = node.raw_wire().await;
    common::cxp1_hello(&mut s).await;
    for at in [0, 4 * MIB, 8 * MIB] {
        s.write_all(&piece(b"whole", &value, at, 7))
            .await
            .expect("send");
    }
    let (st, r) = answer_to(&mut s, 7).await;
    assert_eq!(st, status::CREATED, "{r:?}");
    assert_eq!(
        r,
        Response::ValueStored {
            crc32c: ctxpod_wire::crc32c(&value)
        }
    );
    assert_eq!(r.op(), Op::PutValue);
    let s = c.stats().await.expect("stats");
    assert_eq!((s.block_count, s.live_bytes), (1, 12 * MIB as u64));
}

/// A prefetch of large values lands each one piece by piece at its slot of the region
/// (CRC32C per piece), in chain order with the blocks around it; a slot too short is a 413
/// miss with nothing pushed, and a cancel in the middle of a value ends it as cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_lands_large_values_piece_by_piece_in_their_slots() {
    use ctxpod_client::region::Region;
    use ctxpod_client::transfer_client::{BlockState, PrefetchOptions};
    use ctxpod_wire::proto::PrefetchEntry;
    let (_node, c) = Node::fresh_with_wire(&["--capacity", "1GiB", "--dram", "16MiB"]).await;
    let values = [
        (Bytes::from_static(b"v0"), block(11, 32 * MIB + 28)),
        (Bytes::from_static(b"b1"), block(12, 256 << 10)),
        (Bytes::from_static(b"v2"), block(13, 10 * MIB + 3)),
        (Bytes::from_static(b"v3"), block(14, 9 * MIB)),
    ];
    let st = c
        .put("default", &values, Durability::Fast)
        .await
        .expect("put");
    assert_eq!(st, vec![status::CREATED; 4]);
    let region = Region::new(64 << 20).expect("region");
    c.register_region(&region).await.expect("register");
    // v3's slot is a byte short of it.
    let slots = [
        (0, 33 * MIB),
        (33 * MIB + 1, MIB),
        (40 * MIB, 11 * MIB),
        (52 * MIB, 9 * MIB - 1),
    ];
    let entries: Vec<PrefetchEntry> = values
        .iter()
        .zip(slots)
        .map(|((k, _), (offset, max))| PrefetchEntry {
            key: k.clone(),
            offset: offset as u64,
            max_len: max as u32,
        })
        .collect();
    let t = c
        .prefetch(
            "default",
            &region,
            entries.clone(),
            PrefetchOptions::default(),
        )
        .await
        .expect("prefetch");
    let p = t.wait().await;
    assert_eq!((p.landed, p.missed), (3, 1), "{:?}", p.blocks);
    for (i, (_, v)) in values.iter().enumerate().take(3) {
        let len = v.len() as u32;
        assert_eq!(p.blocks[i], BlockState::Landed { len });
        assert_eq!(t.data(i).expect("landed"), &v[..], "entry {i}");
    }
    assert_eq!(
        p.blocks[3],
        BlockState::Missed {
            status: status::TOO_LARGE
        }
    );
    drop(t);
    // Cancelled right after it starts: whatever was not whole by then is a 499 miss, and
    // every entry is answered once.
    let t = c
        .prefetch(
            "default",
            &region,
            entries[..1].to_vec(),
            PrefetchOptions::default(),
        )
        .await
        .expect("prefetch");
    t.cancel().await.expect("cancel");
    let p = t.wait().await;
    assert!(p.done);
    assert!(
        matches!(
            p.blocks[0],
            BlockState::Landed { len } if len as usize == values[0].1.len()
        ) || p.blocks[0] == BlockState::Missed { status: 499 },
        "{:?}",
        p.blocks[0]
    );
    if p.blocks[0] != (BlockState::Missed { status: 499 }) {
        assert_eq!(t.data(0).expect("landed"), &values[0].1[..]);
    }
}
