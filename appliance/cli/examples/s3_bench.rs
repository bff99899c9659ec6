//! The S3 door beside HTTP API v1 and CXP1, in one run (issue #22): PUT then GET of the same
//! number of blocks of each size through each, `--concurrency` requests in flight, the Rust
//! `aws-sdk-s3` with its default settings on the S3 side. `bench/s3.sh` starts the node and
//! runs it; docs/PERFORMANCE.md has a run. Every door's GETs land in buffers read into over
//! and over (one per GET in flight), as an engine (or NIXL) reads into its own memory.
//!
//! ```text
//! s3_bench --s3 URL --http URL --transfer ADDR --token TOKEN --ak ID --sk SECRET
//!          [--count N] [--concurrency C] [--sizes 65536,1048576,4194304]
//! ```

use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_s3::primitives::ByteStream;
use bytes::Bytes;
use ctxpod_client::client::Client;
use ctxpod_client::connect::Connect;
use ctxpod_client::transfer_client::TransferClient;
use ctxpod_wire::Durability;
use futures::StreamExt;
use std::collections::HashMap;
use std::time::Instant;

struct Args {
    s3: String,
    http: String,
    transfer: String,
    token: String,
    ak: String,
    sk: String,
    count: usize,
    concurrency: usize,
    sizes: Vec<usize>,
}

fn args() -> Args {
    let mut m: HashMap<String, String> = HashMap::new();
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        m.insert(k.trim_start_matches("--").to_string(), v);
    }
    let get = |k: &str| {
        m.get(k)
            .cloned()
            .unwrap_or_else(|| panic!("--{k} is required"))
    };
    Args {
        s3: get("s3"),
        http: get("http"),
        transfer: get("transfer"),
        token: get("token"),
        ak: get("ak"),
        sk: get("sk"),
        count: m.get("count").map_or(256, |v| v.parse().expect("--count")),
        concurrency: m
            .get("concurrency")
            .map_or(8, |v| v.parse().expect("--concurrency")),
        sizes: m
            .get("sizes")
            .map_or("65536,1048576,4194304", String::as_str)
            .split(',')
            .map(|s| s.parse().expect("--sizes"))
            .collect(),
    }
}

/// Runs `n` operations, `c` at a time: the seconds taken.
async fn timed<F, Fut>(n: usize, c: usize, op: F) -> f64
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let t = Instant::now();
    futures::stream::iter(0..n)
        .map(&op)
        .buffer_unordered(c)
        .collect::<Vec<()>>()
        .await;
    t.elapsed().as_secs_f64()
}

/// The three doors into the node, one client each; `path` picks one: `s3`, `http` or
/// (anything else) `cxp1`.
struct Doors {
    s3: aws_sdk_s3::Client,
    http: Client,
    wire: TransferClient,
    /// Buffers GETs land in, one per GET in flight.
    buffers: std::sync::Mutex<Vec<Vec<u8>>>,
}

const NS: &str = "bench";

impl Doors {
    /// Connects a client to each door (the S3 one with the `aws-sdk-s3` defaults).
    async fn connect(a: &Args) -> Doors {
        let conf = aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .endpoint_url(&a.s3)
            .force_path_style(true)
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new(&a.ak, &a.sk, None, None, "bench"))
            .build();
        let s3 = aws_sdk_s3::Client::from_conf(conf);
        let how = Connect {
            token: Some(a.token.clone()),
            tls: None,
            ..Default::default()
        };
        let http = Client::connect(a.http.clone(), &how).expect("HTTP client");
        let wire = TransferClient::connect_with(&a.transfer, &how)
            .await
            .expect("CXP1 client");
        Doors {
            s3,
            http,
            wire,
            buffers: Default::default(),
        }
    }

    /// Stores block `d` as `k` through `path`.
    async fn put(&self, path: &str, k: String, d: Bytes) {
        match path {
            "s3" => {
                self.s3
                    .put_object()
                    .bucket(NS)
                    .key(&k)
                    .body(ByteStream::from(d))
                    .send()
                    .await
                    .expect("S3 put");
            }
            "http" => {
                self.http
                    .put(NS, k.as_bytes(), d, Durability::Durable)
                    .await
                    .expect("HTTP put");
            }
            _ => {
                let st = self
                    .wire
                    .put(NS, &[(Bytes::from(k), d)], Durability::Durable)
                    .await
                    .expect("CXP1 put");
                assert!(st[0] == 201 || st[0] == 200, "CXP1 put: {st:?}");
            }
        }
    }

    /// Fetches block `k` of `size` bytes through `path` into a buffer of the pool (a CXP1
    /// block of one record: into the client's recycled buffers): its length.
    async fn get(&self, path: &str, k: String, size: usize) -> usize {
        let buf = self.buffers.lock().expect("buffers").pop();
        let (buf, n) = match path {
            "s3" => {
                let mut buf = buf.unwrap_or_default();
                let got = self.s3.get_object().bucket(NS).key(&k).send().await;
                let mut body = got.expect("S3 get").body;
                let mut at = 0;
                while let Some(piece) = body.next().await {
                    let piece = piece.expect("S3 body");
                    if buf.len() < at + piece.len() {
                        buf.resize(at + piece.len(), 0);
                    }
                    buf[at..at + piece.len()].copy_from_slice(&piece);
                    at += piece.len();
                }
                (buf, at)
            }
            "http" => {
                let got = self
                    .http
                    .get_into(NS, k.as_bytes(), buf.unwrap_or_default());
                let (buf, n) = got.await.expect("HTTP get");
                (buf, n.expect("held"))
            }
            _ if size > ctxpod_wire::BLOCK_BYTES_MAX => {
                let buf = buf.unwrap_or_default();
                let k = Bytes::from(k);
                let got = self.wire.get_value_into(NS, &k, None, buf);
                let (buf, n) = got.await.expect("CXP1 get");
                (buf, n.expect("held"))
            }
            _ => {
                let got = self.wire.get(NS, &[Bytes::from(k)]).await;
                let n = got.expect("CXP1 get")[0].as_ref().expect("held").len();
                (buf.unwrap_or_default(), n)
            }
        };
        self.buffers.lock().expect("buffers").push(buf);
        n
    }
}

/// PUTs then GETs `a.count` blocks of `size` bytes through each door and prints a row per
/// door, then the S3/HTTP ratio of GET bandwidth.
async fn bench_size(a: &Args, doors: &Doors, size: usize) {
    let data: Vec<Bytes> = (0..a.count)
        .map(|i| ctxpod_testkit::block((size + i) as u64, size))
        .collect();
    let gb = (size * a.count) as f64 / 1e9;
    let key = |path: &str, i: usize| format!("{path}-{size}-{i:06}");
    let mut get_gbps = HashMap::new();
    // The GETs' buffers, each page touched before they are timed (an engine's pool).
    *doors.buffers.lock().expect("buffers") = vec![vec![1u8; size]; a.concurrency];
    for path in ["s3", "http", "cxp1"] {
        let put = timed(a.count, a.concurrency, |i| {
            doors.put(path, key(path, i), data[i].clone())
        })
        .await;
        let get = timed(a.count, a.concurrency, |i| {
            let (k, want) = (key(path, i), data[i].len());
            async move {
                let n = doors.get(path, k, want).await;
                assert_eq!(n, want);
            }
        })
        .await;
        get_gbps.insert(path, gb / get);
        println!(
            "{size},{path},{:.3},{:.3},{:.0}",
            gb / put,
            gb / get,
            a.count as f64 / get
        );
    }
    println!(
        "{size},s3_get/http_get,{:.2}",
        get_gbps["s3"] / get_gbps["http"]
    );
}

#[tokio::main]
async fn main() {
    let a = args();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let doors = Doors::connect(&a).await;
    let _ = doors.s3.create_bucket().bucket(NS).send().await;
    println!(
        "size_bytes,path,put_gbps,get_gbps,get_ops_per_s ({} blocks, {} in flight)",
        a.count, a.concurrency
    );
    for &size in &a.sizes {
        bench_size(&a, &doors, size).await;
    }
}
