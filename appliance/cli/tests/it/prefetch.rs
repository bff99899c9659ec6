//! Prefetch into client memory regions over CXP1, against the real binary: a 1 GiB region
//! filled byte-exact at the requested offsets, blocks delivered in chain order (await one
//! block before the last has landed), cancel and deadline as documented in
//! `api/PROTOCOL.md`, leases that keep prefetched blocks through eviction churn and then
//! expire, and a client that never reads its socket costing the node bounded memory.

use crate::common;

use bytes::Bytes;
use common::{block, Node};
use ctxpod_client::region::Region;
use ctxpod_client::transfer_client::{BlockState, PrefetchOptions, TransferClient};
use ctxpod_wire::proto::{
    self, status, Durability, FrameDecoder, Policy, PrefetchEntry, PrefetchRequest, Request,
    Response,
};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MIB: usize = 1 << 20;

fn key(chain: &str, i: usize) -> Bytes {
    Bytes::from(format!("{chain}-{i:05}").into_bytes())
}

async fn put_chain(c: &TransferClient, chain: &str, n: usize, len: impl Fn(usize) -> usize) {
    for lo in (0..n).step_by(16) {
        let blocks: Vec<(Bytes, Bytes)> = (lo..n.min(lo + 16))
            .map(|i| (key(chain, i), block(seed(chain, i), len(i))))
            .collect();
        let st = c
            .put("default", &blocks, Durability::Fast)
            .await
            .expect("put");
        assert!(st.iter().all(|&s| s == status::CREATED), "{st:?}");
    }
}

/// Entries for blocks `0..n` of `chain`, block `i` at `i * len` of the region.
fn entries(chain: &str, n: usize, len: usize) -> Vec<PrefetchEntry> {
    (0..n)
        .map(|i| PrefetchEntry {
            key: key(chain, i),
            offset: (i * len) as u64,
            max_len: len as u32,
        })
        .collect()
}

fn seed(chain: &str, i: usize) -> u64 {
    chain
        .bytes()
        .fold(i as u64, |h, b| h.wrapping_mul(131) ^ b as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1gib_region_gets_every_block_byte_exact_at_its_offset_in_chain_order() {
    let (node, c) = Node::fresh_with_wire(&["--capacity", "1GiB", "--dram", "16MiB"]).await;
    // 448 blocks of varied sizes around 1 MiB (448 MiB, mostly cold: the DRAM tier is 16
    // MiB), at offsets spread over the whole 1 GiB region, none aligned, none adjacent.
    let n = 448;
    let len = |i: usize| MIB - 4096 + (i * 7919) % 8192;
    put_chain(&c, "big", n, len).await;
    let region = Region::new(1 << 30).expect("1 GiB region");
    c.register_region(&region).await.expect("register");
    let stride = ((1 << 30) - 2 * MIB) / (n + 2);
    let offset = |i: usize| (i * stride + (i * 4099) % 4096 + 1) as u64;
    // The chain asks for two more blocks than the node holds: they are misses.
    let entries: Vec<PrefetchEntry> = (0..n + 2)
        .map(|i| PrefetchEntry {
            key: key("big", i),
            offset: offset(i),
            max_len: (MIB + 8192) as u32,
        })
        .collect();
    assert_eq!(
        c.match_prefix(
            "default",
            &entries.iter().map(|e| e.key.clone()).collect::<Vec<_>>()
        )
        .await
        .expect("match"),
        n as u32
    );
    let t = c
        .prefetch("default", &region, entries, PrefetchOptions::default())
        .await
        .expect("prefetch");
    // Await the first block alone: decode could start on it.
    assert_eq!(t.block(0).await, BlockState::Landed { len: len(0) as u32 });
    assert_eq!(
        t.data(0).expect("landed"),
        &block(seed("big", 0), len(0))[..]
    );
    let p = t.wait().await;
    assert!(p.done);
    assert_eq!((p.landed, p.missed), (n as u32, 2));
    assert_eq!(p.blocks[n], BlockState::Missed { status: 404 });
    // Misses are answered first (the node knows at once), then blocks in chain order.
    assert_eq!(&p.order[..2], &[n as u32, n as u32 + 1]);
    assert_eq!(p.order[2..], (0..n as u32).collect::<Vec<_>>()[..]);
    // Every block byte-exact at its offset, and not one byte written outside the blocks.
    // SAFETY: the ticket is finished, nothing writes into the region any more.
    let mem = unsafe { std::slice::from_raw_parts(region.as_ptr(), region.len()) };
    let mut end = 0usize;
    for i in 0..n {
        let (o, l) = (offset(i) as usize, len(i));
        assert!(
            mem[end..o].iter().all(|&b| b == 0),
            "bytes before block {i}"
        );
        assert!(
            mem[o..o + l] == block(seed("big", i), l)[..],
            "block {i} at offset {o}"
        );
        assert_eq!(t.data(i).expect("landed").as_ptr(), mem[o..].as_ptr());
        end = o + l;
    }
    assert!(
        mem[end..].iter().all(|&b| b == 0),
        "bytes after the last block"
    );
    let m = node.client.metrics().await.expect("metrics");
    assert!(
        m.contains("ctxpod_prefetch_blocks_total{outcome=\"pushed\"} 448"),
        "{m}"
    );
}

/// A raw CXP1 connection, for what the client library will not do (stop reading).
struct Raw {
    s: TcpStream,
    dec: FrameDecoder,
}

impl Raw {
    async fn connect(addr: &str) -> Raw {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        common::cxp1_hello(&mut s).await;
        Raw {
            s,
            dec: FrameDecoder::new(proto::FRAME_BYTES_MAX),
        }
    }

    async fn send(&mut self, id: u64, r: &Request) {
        self.s.write_all(&r.encode(id)).await.expect("send");
    }

    /// The next frame (bounded in time).
    async fn next(&mut self) -> (proto::Header, Response) {
        let mut buf = vec![0u8; 1 << 20];
        tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                if let Some(f) = self.dec.next_frame().expect("valid framing") {
                    return (f.header, Response::decode(&f).expect("valid response"));
                }
                let n = self.s.read(&mut buf).await.expect("read");
                assert!(n > 0, "the node closed the connection");
                self.dec.push(&buf[..n]);
            }
        })
        .await
        .expect("a frame within a minute")
    }
}

/// The caller's own memory as the region (a buffer it filled with a marker beforehand, and
/// memory it keeps owning and only lends): blocks land there in place, the caller's other bytes
/// are never touched, and the memory is released only once the ticket is gone too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_land_in_the_callers_own_memory_and_nothing_else_is_touched() {
    let (_node, c) = Node::fresh_with_wire(&["--capacity", "256MiB", "--dram", "16MiB"]).await;
    let (n, len) = (24, 100_000);
    put_chain(&c, "own", n, |_| len).await;
    let stride = len + 777;
    let check = |mem: &[u8], what: &str| {
        for i in 0..n {
            let o = i * stride;
            assert!(
                mem[o..o + len] == block(seed("own", i), len)[..],
                "{what}: block {i}"
            );
            let gap = &mem[o + len..(o + stride).min(mem.len())];
            assert!(
                gap.iter().all(|&b| b == 0xAA),
                "{what}: bytes after block {i}"
            );
        }
    };
    let ents: Vec<PrefetchEntry> = (0..n)
        .map(|i| PrefetchEntry {
            key: key("own", i),
            offset: (i * stride) as u64,
            max_len: len as u32,
        })
        .collect();
    // A buffer handed over.
    let buf = vec![0xAAu8; n * stride];
    let at = buf.as_ptr();
    let region = Region::from_vec(buf).expect("region");
    c.register_region(&region).await.expect("register");
    let t = c
        .prefetch("default", &region, ents.clone(), PrefetchOptions::default())
        .await
        .expect("prefetch");
    assert_eq!(t.wait().await.landed, n as u32);
    assert_eq!(
        t.data(3).expect("landed").as_ptr(),
        at.wrapping_add(3 * stride)
    );
    // SAFETY: the ticket is finished; nothing writes into the region any more.
    check(
        unsafe { std::slice::from_raw_parts(region.as_ptr(), region.len()) },
        "from_vec",
    );
    drop(t);

    // Memory the caller keeps owning, lent with a keep-alive that says when it is released.
    let mut mine = vec![0xAAu8; n * stride];
    let (released_tx, released_rx) = std::sync::mpsc::channel::<()>();
    struct Released(std::sync::mpsc::Sender<()>);
    impl Drop for Released {
        fn drop(&mut self) {
            let _ = self.0.send(());
        }
    }
    // SAFETY: `mine` is neither read nor written until `Released` is dropped (received below).
    let lent = unsafe {
        Region::from_raw(
            mine.as_mut_ptr(),
            mine.len(),
            Box::new(Released(released_tx)),
        )
    }
    .expect("region");
    c.register_region(&lent).await.expect("register");
    let t = c
        .prefetch("default", &lent, ents, PrefetchOptions::default())
        .await
        .expect("prefetch");
    // The connection holds a registered region until it is let go; the ticket holds it
    // until it is finished and dropped.
    assert!(c.unregister_region(&lent).await.expect("unregister"));
    assert!(!c
        .unregister_region(&lent)
        .await
        .expect("again: not registered"));
    // The node forgot it: a connection registers and lets go of more regions, one after the
    // other, than it may hold at once (256).
    for _ in 0..300 {
        let r = Region::new(4096).expect("region");
        c.register_region(&r).await.expect("register");
        assert!(c.unregister_region(&r).await.expect("unregister"));
    }
    drop(lent);
    assert_eq!(
        t.wait().await.landed,
        n as u32,
        "the ticket keeps the region"
    );
    assert!(
        released_rx.try_recv().is_err(),
        "still in use by the ticket"
    );
    drop(t);
    released_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("released once the ticket is gone");
    check(&mine, "from_raw");
}

/// Runs a prefetch of `n` 1 MiB blocks on a connection that stops reading after the ticket
/// (so the node cannot push more than its per-connection output budget plus socket
/// buffers), does `meanwhile`, then reads everything: per entry, its push status.
async fn stalled_prefetch(
    addr: &str,
    n: usize,
    policy: Policy,
    deadline_ms: u32,
    meanwhile: impl AsyncFnOnce(&mut Raw),
) -> Vec<u16> {
    let mut r = Raw::connect(addr).await;
    r.send(
        1,
        &Request::RegisterRegion {
            region_id: 7,
            bytes: (n * MIB) as u64,
        },
    )
    .await;
    assert!(matches!(r.next().await.1, Response::RegionRegistered));
    let req = Request::Prefetch(PrefetchRequest {
        ns: "default".into(),
        region_id: 7,
        policy,
        deadline_ms,
        lease_ms: 0,
        entries: entries("stall", n, MIB),
    });
    r.send(99, &req).await;
    let (h, resp) = r.next().await;
    assert_eq!((h.request_id, resp), (99, Response::Ticket(99)));
    meanwhile(&mut r).await;
    let mut got = vec![0u16; n];
    loop {
        let (h, resp) = r.next().await;
        match resp {
            Response::Push {
                index,
                status: st,
                data,
                crc32c,
                ..
            } => {
                assert_eq!(h.request_id, 99);
                assert_eq!(got[index as usize], 0, "entry {index} answered twice");
                got[index as usize] = st;
                if st == status::OK {
                    assert_eq!(data, block(seed("stall", index as usize), MIB));
                    assert_eq!(crc32c, ctxpod_wire::crc32c(&data));
                }
            }
            Response::PrefetchDone { pushed, missed } => {
                assert_eq!(h.request_id, 99);
                let ok = got.iter().filter(|&&s| s == status::OK).count();
                assert_eq!((pushed as usize, missed as usize), (ok, n - ok));
                assert!(got.iter().all(|&s| s != 0), "every entry answered");
                return got;
            }
            Response::Cancelled => {}
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// A node (1 GiB, a 16 MiB DRAM tier) holding blocks `0..n` of chain `stall`, 1 MiB each; a
/// CXP1 client of it, and its CXP1 address.
async fn holding_stall_chain(n: usize) -> (Node, TransferClient, String) {
    let (node, c) = Node::fresh_with_wire(&["--capacity", "1GiB", "--dram", "16MiB"]).await;
    put_chain(&c, "stall", n, |_| MIB).await;
    let addr = node.transfer_addr();
    (node, c, addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_makes_late_blocks_misses_and_cancel_stops_the_rest() {
    let n = 200;
    let (_node, c, addr) = holding_stall_chain(n).await;

    // Timeout policy, 300 ms: the client reads nothing for a second after the ticket, so
    // the node cannot push 200 MiB by then; what it has not pushed at the deadline is a
    // miss (504), in order, and nothing stalls.
    let got = stalled_prefetch(&addr, n, Policy::Timeout, 300, async |_: &mut Raw| {
        tokio::time::sleep(Duration::from_millis(1000)).await;
    })
    .await;
    let first_late = got
        .iter()
        .position(|&s| s != status::OK)
        .expect("a late block");
    assert!(first_late > 0, "blocks before the deadline are pushed");
    assert!(
        got[first_late..].iter().all(|&s| s == status::DEADLINE),
        "after the first late block every block is a deadline miss: {:?}",
        &got[first_late..first_late + 5]
    );

    // Cancel: the same stall, then a cancel; the rest are misses with status 499.
    let got = stalled_prefetch(&addr, n, Policy::WaitComplete, 0, async |r: &mut Raw| {
        r.send(100, &Request::Cancel { ticket: 99 }).await;
    })
    .await;
    let first = got
        .iter()
        .position(|&s| s != status::OK)
        .expect("cancelled");
    assert!(
        got[first..].iter().all(|&s| s == 499),
        "{:?}",
        &got[first..]
    );

    // Through the library: cancel after the first block; every entry ends final, those
    // not pushed are 499, and waiting returns.
    let region = Region::new(n * MIB).expect("region");
    c.register_region(&region).await.expect("register");
    let t = c
        .prefetch(
            "default",
            &region,
            entries("stall", n, MIB),
            PrefetchOptions::default(),
        )
        .await
        .expect("prefetch");
    assert!(matches!(t.block(0).await, BlockState::Landed { .. }));
    t.cancel().await.expect("cancel");
    let p = t.wait().await;
    assert_eq!(p.landed + p.missed, n as u32);
    assert!(p.blocks.iter().all(|b| matches!(
        b,
        BlockState::Landed { .. } | BlockState::Missed { status: 499 }
    )));
    // A ticket that ended is unknown to the node: cancelling it again is not an error.
    t.cancel().await.expect("cancel again");

    // A timeout prefetch without a deadline, or into a range past the region, is refused.
    let bad = c
        .prefetch(
            "default",
            &region,
            vec![PrefetchEntry {
                key: key("stall", 0),
                offset: ((n - 1) * MIB) as u64 + 1,
                max_len: MIB as u32,
            }],
            PrefetchOptions::default(),
        )
        .await;
    assert!(bad.is_err(), "out of the region");
    let bad = c
        .prefetch(
            "default",
            &region,
            vec![],
            PrefetchOptions {
                policy: Policy::Timeout,
                deadline: None,
                ..Default::default()
            },
        )
        .await;
    assert!(
        matches!(
            bad,
            Err(ctxpod_client::transfer_client::TransferError::Refused { status: 400, .. })
        ),
        "{:?}",
        bad.err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_keep_prefetched_blocks_through_churn_and_then_expire() {
    let (node, c) = Node::fresh_with_wire(&["--capacity", "128MiB", "--dram", "1MiB"]).await;
    // 256 KiB blocks are over a quarter of the 1 MiB DRAM tier: never cached there, so a
    // GET answers from flash only and tells what eviction kept.
    let blk = 256 << 10;
    put_chain(&c, "leased", 8, |_| blk).await;
    put_chain(&c, "short", 8, |_| blk).await;
    put_chain(&c, "plain", 8, |_| blk).await;
    let region = Region::new(16 * blk).expect("region");
    c.register_region(&region).await.expect("register");
    // The 8 blocks of `chain` into the region from block `base` on, under `lease`.
    let prefetch_leased = async |chain: &str, base: usize, lease: Duration| {
        let mut es = entries(chain, 8, blk);
        es.iter_mut().for_each(|e| e.offset += (base * blk) as u64);
        let options = PrefetchOptions {
            lease,
            ..Default::default()
        };
        c.prefetch("default", &region, es, options)
            .await
            .expect("prefetch")
    };
    let long = prefetch_leased("leased", 0, Duration::from_secs(600)).await;
    assert_eq!(long.wait().await.landed, 8);
    let short = prefetch_leased("short", 8, Duration::from_millis(200)).await;
    assert_eq!(short.wait().await.landed, 8);
    // Let the short lease run out (a sleep, not a timing assertion: the lease is 200 ms).
    tokio::time::sleep(Duration::from_millis(600)).await;
    // Churn: 4x the capacity in other blocks, so every region is reclaimed several times.
    let churn = async |from: usize| {
        put_chain(&c, &format!("churn{from}"), 2048, |_| blk).await;
    };
    churn(0).await;
    let present = async |chain: &str| -> usize {
        let keys: Vec<Bytes> = (0..8).map(|i| key(chain, i)).collect();
        let got = c.get("default", &keys).await.expect("get");
        for (i, g) in got.iter().enumerate() {
            if let Some(g) = g {
                assert_eq!(g, &block(seed(chain, i), blk));
            }
        }
        got.iter().filter(|g| g.is_some()).count()
    };
    assert_eq!(
        present("leased").await,
        8,
        "leased blocks survive the churn"
    );
    assert_eq!(present("plain").await, 0, "unleased blocks are evicted");
    assert_eq!(
        present("short").await,
        0,
        "an expired lease protects nothing"
    );
    let s = node.client.stats().await.expect("stats");
    assert!(s.evicted_regions > 8, "the churn reclaimed regions: {s:?}");
    // Dropping the ticket ends its lease: the next churn may evict the blocks.
    drop(long);
    drop(short);
    tokio::time::sleep(Duration::from_millis(200)).await;
    churn(1).await;
    churn(2).await;
    assert_eq!(
        present("leased").await,
        0,
        "the lease ended with its ticket"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_costs_bounded_memory_and_others_are_served() {
    let n = 512;
    let (node, c, addr) = holding_stall_chain(n).await;
    let rss = || common::rss_bytes(node.pid());
    let before = rss();
    // Three connections each ask for 512 MiB and never read a byte of it.
    let mut stalled = Vec::new();
    for _ in 0..3 {
        let mut r = Raw::connect(&addr).await;
        r.send(
            1,
            &Request::RegisterRegion {
                region_id: 1,
                bytes: (n * MIB) as u64,
            },
        )
        .await;
        let req = Request::Prefetch(PrefetchRequest {
            ns: "default".into(),
            region_id: 1,
            policy: Policy::WaitComplete,
            deadline_ms: 0,
            lease_ms: 0,
            entries: entries("stall", n, MIB),
        });
        r.send(2, &req).await;
        stalled.push(r);
    }
    // Meanwhile another client is served: its puts, gets and prefetches complete.
    for round in 0..8 {
        let keys: Vec<Bytes> = (round * 8..round * 8 + 8)
            .map(|i| key("stall", i))
            .collect();
        let got = c
            .get("default", &keys)
            .await
            .expect("get while others stall");
        assert!(got.iter().all(|g| g.is_some()));
    }
    let region = Region::new(8 * MIB).expect("region");
    c.register_region(&region).await.expect("register");
    let t = c
        .prefetch(
            "default",
            &region,
            entries("stall", 8, MIB),
            PrefetchOptions::default(),
        )
        .await
        .expect("prefetch while others stall");
    assert_eq!(t.wait().await.landed, 8);
    // 1.5 GiB asked for and unread: the node holds at most, per stalled connection, its
    // output budget (64 MiB) and the blocks staged ahead, bounded node-wide by the staging
    // budget (256 MiB).
    let grown = rss().saturating_sub(before);
    eprintln!("node RSS grew by {} MiB", grown >> 20);
    assert!(
        grown < (3 * 64 + 256 + 64) << 20,
        "node RSS grew by {} MiB",
        grown >> 20
    );
    drop(stalled);
    // The stalled connections are gone: their tickets end and the node serves on.
    c.ping().await.expect("ping");
}

/// Runs the `ctxpod` CLI; its exit code and stdout.
fn cli(args: &[&str]) -> (i32, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ctxpod"))
        .args(args)
        .output()
        .expect("run ctxpod");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_match_prefetch_events_and_hash_over_cxp1() {
    let node = Node::fresh(&["--capacity", "256MiB"]).await;
    let addr = node.transfer_addr();
    // Keys from the chained block hash of 48 tokens, 16 per block.
    let tokens: Vec<String> = (0..48).map(|t| t.to_string()).collect();
    let mut args = vec!["hash", "--block-size", "16", "--salt", "model-a"];
    args.extend(tokens.iter().map(|s| s.as_str()));
    let (code, out) = cli(&args);
    assert_eq!(code, 0);
    let keys: Vec<&str> = out.lines().collect();
    assert_eq!(keys.len(), 3);
    let t: Vec<u32> = (0..48).collect();
    let want = ctxpod_wire::block_hash::sequence_hashes(
        &t,
        16,
        ctxpod_wire::block_hash::salt_hash(Some("model-a"), None),
    );
    assert_eq!(
        keys[2],
        hex::encode(ctxpod_wire::block_hash::key_of(want[2]))
    );
    let c = TransferClient::connect(&addr).await.expect("connect");
    let mut sub = c.subscribe("default").await.expect("subscribe");
    let blocks: Vec<(Bytes, Bytes)> = keys[..2]
        .iter()
        .enumerate()
        .map(|(i, k)| {
            (
                Bytes::from(hex::decode(k).expect("hex")),
                block(i as u64, 5000),
            )
        })
        .collect();
    c.put("default", &blocks, Durability::Durable)
        .await
        .expect("put");
    let (code, out) = cli(&["match", "--transfer", &addr, keys[0], keys[1], keys[2]]);
    assert_eq!((code, out.trim()), (0, "2"));
    let got = node.scratch().join("out");
    let (code, out) = cli(&[
        "prefetch",
        "--transfer",
        &addr,
        "--max-len",
        "64KiB",
        "-o",
        got.to_str().expect("utf-8"),
        keys[0],
        keys[1],
        keys[2],
    ]);
    assert_eq!(code, 4, "one block missed: {out}");
    assert!(out.starts_with("2 landed, 1 missed"), "{out}");
    for (i, k) in keys[..2].iter().enumerate() {
        let b = std::fs::read(got.join(k)).expect("landed block file");
        assert_eq!(b, block(i as u64, 5000));
    }
    assert!(!got.join(keys[2]).exists());
    // Both stores are events (in one batch or two).
    let mut stored = 0;
    while stored < 2 {
        let b = sub.next().await.expect("events");
        assert!(b
            .events
            .iter()
            .all(|(k, _)| *k == ctxpod_wire::proto::EventKind::Stored));
        stored += b.events.len();
    }
    assert_eq!(stored, 2);
    let events = tokio::task::spawn_blocking({
        let addr = addr.clone();
        move || cli(&["events", "--transfer", &addr, "--count", "1"])
    });
    // The CLI subscribes, then sees the next stored key.
    let mut tries = 0;
    let (code, out) = loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let k = Bytes::from(format!("late{tries}").into_bytes());
        c.put("default", &[(k, block(9, 10))], Durability::Durable)
            .await
            .expect("put");
        tries += 1;
        if events.is_finished() || tries > 100 {
            break events.await.expect("cli task");
        }
    };
    assert_eq!(code, 0);
    assert!(out.starts_with("stored 6c617465"), "{out}");
}
