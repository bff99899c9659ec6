//! Every door keeps the pod's promises: the scenario table of `ctxpod-testkit`
//! ([`ctxpod_testkit::POD_SCENARIOS_JSON`]: members down, copies missing, tombstones,
//! quota) run through each door of a real 3-node pod over etcd, with the same answers. The
//! Python SDK runs the same table (`api/python/tests/test_pod_doors.py`).

use super::{create_replicated, pod_config, wait_members, wait_views};
use crate::common::etcd::EtcdServer;
use crate::common::Node;
use bytes::Bytes;
use ctxpod_client::client::{Client, ClientError};
use ctxpod_client::connect::Connect;
use ctxpod_client::pod_client::PodClient;
use ctxpod_client::transfer_pod::TransferPod;
use ctxpod_wire::Durability;
use serde_json::Value;

const NS: &str = "doors";
const SMALL: &str = "doors-small";

/// One door's answer, as the table spells it.
fn http_answer(r: Result<(), ClientError>, ok: &str) -> String {
    match r {
        Ok(()) => ok.to_string(),
        Err(e) => match e.status() {
            Some(s) => format!("refused {s}"),
            None => format!("failed: {e}"),
        },
    }
}

/// A door of the pod, and how it spells its answers.
pub(super) enum Door {
    /// The Rust HTTP pod client.
    Http(PodClient),
    /// The CXP1 pod client (the SDK's transport).
    Cxp1(TransferPod),
    /// A plain client of node a: single-block requests the node forwards.
    Forward(Client),
    /// A plain client of node a: `batch/get` and `batch/put` it answers for the pod.
    Batch(Client),
    /// The S3 door of node a.
    S3(aws_sdk_s3::Client),
}

impl Door {
    pub(super) fn name(&self) -> &'static str {
        match self {
            Door::Http(_) => "http_client",
            Door::Cxp1(_) => "cxp1_client",
            Door::Forward(_) => "node_forwarding",
            Door::Batch(_) => "node_batch",
            Door::S3(_) => "s3_door",
        }
    }

    /// The block's bytes, or why not ("hit" when they are `want`).
    pub(super) async fn get(&self, ns: &str, key: &[u8], want: &Bytes) -> String {
        let got: Result<Option<Bytes>, String> = match self {
            Door::Http(pc) => pc.get(ns, key).await.map_err(|e| status_of(&e)),
            Door::Cxp1(tp) => match tp.get(ns, &[Bytes::copy_from_slice(key)]).await {
                Ok(mut v) => v.remove(0).map_err(|e| format!("failed: {e}")),
                Err(e) => Err(format!("failed: {e}")),
            },
            Door::Forward(c) => c.get(ns, key).await.map_err(|e| status_of(&e)),
            Door::Batch(c) => match c.batch_get(ns, &[key.to_vec()]).await {
                Ok(mut v) => Ok(v.remove(0).1),
                Err(e) => Err(status_of(&e)),
            },
            Door::S3(s3) => s3_get(s3, ns, key).await,
        };
        match got {
            Ok(Some(b)) if b == *want => "hit".into(),
            Ok(Some(b)) => format!("wrong bytes ({} of {})", b.len(), want.len()),
            Ok(None) => "miss".into(),
            Err(e) => e,
        }
    }

    pub(super) async fn put(&self, ns: &str, key: &[u8], data: Bytes) -> String {
        let d = Durability::Durable;
        let status = |s: u16| match s {
            200 | 201 => "stored".to_string(),
            s => format!("refused {s}"),
        };
        match self {
            Door::Http(pc) => http_answer(pc.put(ns, key, data, d).await.map(|_| ()), "stored"),
            Door::Cxp1(tp) => match tp.put(ns, &[(Bytes::copy_from_slice(key), data)], d).await {
                Ok(v) => status(v[0]),
                Err(e) => format!("failed: {e}"),
            },
            Door::Forward(c) => http_answer(c.put(ns, key, data, d).await.map(|_| ()), "stored"),
            Door::Batch(c) => match c.batch_put(ns, &[(key.to_vec(), data)], d).await {
                Ok(v) => status(v[0]),
                Err(e) => status_of(&e),
            },
            Door::S3(s3) => s3_put(s3, ns, key, data).await,
        }
    }

    pub(super) async fn delete(&self, ns: &str, key: &[u8]) -> String {
        let done = |r: Result<bool, ClientError>| match r {
            Ok(true) => "done".to_string(),
            Ok(false) => "miss".to_string(),
            Err(e) => status_of(&e),
        };
        match self {
            Door::Http(pc) => done(pc.delete(ns, key).await),
            Door::Cxp1(tp) => match tp.delete(ns, key).await {
                Ok(true) => "done".into(),
                Ok(false) => "miss".into(),
                Err(e) => format!("failed: {e}"),
            },
            // No batch delete: a batch client deletes through the node, one block.
            Door::Forward(c) | Door::Batch(c) => done(c.delete(ns, key).await),
            Door::S3(s3) => s3_delete(s3, ns, key).await,
        }
    }
}

/// A table key as an S3 object key (the table's keys are ASCII).
fn object_key(key: &[u8]) -> &str {
    std::str::from_utf8(key).expect("ASCII keys")
}

/// The S3 door's GET of `key` in bucket `ns`: its bytes, none (404), or why not.
async fn s3_get(s3: &aws_sdk_s3::Client, ns: &str, key: &[u8]) -> Result<Option<Bytes>, String> {
    match s3.get_object().bucket(ns).key(object_key(key)).send().await {
        Ok(o) => Ok(Some(o.body.collect().await.expect("body").into_bytes())),
        Err(e) => match e.raw_response().map(|r| r.status().as_u16()) {
            Some(404) => Ok(None),
            Some(s) => Err(format!("refused {s}")),
            None => Err(format!("failed: {e:?}")),
        },
    }
}

/// The S3 door's PUT of `data` as `key` in bucket `ns`, as the table spells its answer.
async fn s3_put(s3: &aws_sdk_s3::Client, ns: &str, key: &[u8], data: Bytes) -> String {
    let put = s3.put_object().bucket(ns).key(object_key(key));
    match put.body(data.into()).send().await {
        Ok(_) => "stored".into(),
        Err(e) => match e.raw_response().map(|r| r.status().as_u16()) {
            Some(s) => format!("refused {s}"),
            None => format!("failed: {e:?}"),
        },
    }
}

/// The S3 door's DELETE of `key` in bucket `ns`, as the table spells its answer.
async fn s3_delete(s3: &aws_sdk_s3::Client, ns: &str, key: &[u8]) -> String {
    let delete = s3.delete_object().bucket(ns).key(object_key(key));
    match delete.send().await {
        Ok(_) => "done".into(),
        Err(e) => format!("failed: {e:?}"),
    }
}

fn status_of(e: &ClientError) -> String {
    match e.status() {
        Some(s) => format!("refused {s}"),
        None => format!("failed: {e}"),
    }
}

/// A plain HTTP client (for requests no ctxpod client sends on its own).
pub(super) fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .use_preconfigured_tls(ctxpod_client::connect::untrusting_tls_config())
        .build()
        .expect("an HTTP client")
}

/// A block stored on member `url` only (marked as routed: the node stores it itself).
async fn put_on_one(url: &str, ns: &str, key: &[u8], data: &Bytes) {
    let r = http()
        .put(format!(
            "{url}/v1/namespaces/{ns}/blocks/{}",
            hex::encode(key)
        ))
        .header(ctxpod_wire::HEADER_ROUTED, "test")
        .body(data.clone())
        .send()
        .await
        .expect("a put on one member");
    assert!(r.status().is_success(), "put on {url}: {}", r.status());
}

/// A copy of `key` offered to member `url` (as read repair would): its status.
async fn offer_copy(url: &str, ns: &str, key: &[u8], data: &Bytes) -> u16 {
    http()
        .put(format!(
            "{url}/v1/namespaces/{ns}/blocks/{}",
            hex::encode(key)
        ))
        .header(ctxpod_wire::HEADER_ROUTED, "test")
        .header(ctxpod_wire::HEADER_COPY, "test")
        .body(data.clone())
        .send()
        .await
        .expect("a copy offered")
        .status()
        .as_u16()
}

/// The key of row `row` for door `door`: its first-ranked member is `first` when given.
pub(super) fn key_for(
    pc: &PodClient,
    ns: &str,
    door: &str,
    row: usize,
    first: Option<&str>,
) -> Vec<u8> {
    (0..10_000)
        .map(|n| format!("{door}/{row}/{n}").into_bytes())
        .find(|k| first.is_none_or(|f| pc.ranked(ns, k)[0] == f))
        .expect("a key placed as asked")
}

/// Puts the pod in row `row`'s state for `key` (the bytes it holds: `data`).
async fn stage(
    pc: &PodClient,
    urls: &[(String, String)],
    ns: &str,
    state: &str,
    key: &[u8],
    data: &Bytes,
) {
    let url_of = |id: &str| &urls.iter().find(|(i, _)| i == id).expect("a member").1;
    let ranked = pc.ranked(ns, key);
    match state {
        "never_stored" => {}
        "both_copies" => {
            pc.put(ns, key, data.clone(), Durability::Durable)
                .await
                .unwrap();
        }
        "first_copy_missing" => put_on_one(url_of(&ranked[1]), ns, key, data).await,
        "only_third_candidate" => put_on_one(url_of(&ranked[2]), ns, key, data).await,
        "deleted" => {
            pc.put(ns, key, data.clone(), Durability::Durable)
                .await
                .unwrap();
            assert!(pc.delete(ns, key).await.unwrap());
            // A member that missed the delete offers its copy back: refused (the tombstone).
            assert_eq!(offer_copy(url_of(&ranked[0]), ns, key, data).await, 410);
        }
        s => panic!("unknown state {s}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_door_gives_the_same_answers_to_the_pods_scenarios() {
    let table: Value = serde_json::from_str(ctxpod_testkit::POD_SCENARIOS_JSON).unwrap();
    let rows = table["rows"].as_array().unwrap();
    let block = table["block_bytes"].as_u64().unwrap() as usize;
    let large = table["large_bytes"].as_u64().unwrap() as usize;

    let tmp = tempfile::tempdir().unwrap();
    let etcd = EtcdServer::start(tmp.path());
    let DoorPod {
        mut nodes,
        urls,
        seeds,
        pc,
    } = DoorPod::start(tmp.path(), &etcd, "doors", "256MiB").await;
    create_namespaces(&nodes[0]).await;
    let doors = open_doors(&seeds, &nodes[0]).await;

    // Every row's state, for every door, before anything runs (the rows of the second
    // phase on keys whose first member is c, the member killed then).
    let mut keys = Vec::new();
    for (d, door) in doors.iter().enumerate() {
        for (r, row) in rows.iter().enumerate() {
            let ns = row["namespace"].as_str().unwrap_or(NS);
            let killed = row["phase"].as_str() == Some("member_killed");
            let key = key_for(&pc, ns, door.name(), r, killed.then_some("c"));
            let data = crate::common::block((d * 1000 + r) as u64, block);
            stage(&pc, &urls, ns, row["state"].as_str().unwrap(), &key, &data).await;
            keys.push((d, r, key, data));
        }
    }

    let mut failures = Vec::new();
    for phase in [None, Some("member_killed")] {
        if phase.is_some() {
            nodes[2].kill9();
        }
        for (d, r, key, data) in &keys {
            let row = &rows[*r];
            if row["phase"].as_str() == phase {
                let door = &doors[*d];
                failures.extend(run_row(door, row, key, data, large).await);
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} answers differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// A pod of three (a, b, c) over `etcd` with the S3 door on, every member seen by all.
pub(super) struct DoorPod {
    pub(super) nodes: Vec<Node>,
    /// (id, HTTP URL) of each member.
    pub(super) urls: Vec<(String, String)>,
    pub(super) seeds: Vec<String>,
    pub(super) pc: PodClient,
}

impl DoorPod {
    /// Leases long enough that a killed member stays in every view: each door must get
    /// past a member the pod still names.
    pub(super) async fn start(
        dir: &std::path::Path,
        etcd: &EtcdServer,
        name: &str,
        capacity: &str,
    ) -> DoorPod {
        let config = pod_config(name, etcd, "lease_ttl_s = 60\n");
        let mut nodes = Vec::new();
        for id in ["a", "b", "c"] {
            let args = ["--capacity", capacity, "--s3-listen", "127.0.0.1:0"];
            let cfg = config(id);
            let at = dir.join(id);
            let n = Node::start_configured(&at, &args, &cfg, Connect::default(), false);
            nodes.push(n.await);
        }
        wait_views(&nodes, 3).await;
        let urls: Vec<(String, String)> = ["a", "b", "c"]
            .iter()
            .zip(&nodes)
            .map(|(id, n)| (id.to_string(), n.url.clone()))
            .collect();
        let seeds: Vec<String> = nodes.iter().map(|n| n.url.clone()).collect();
        let pc = PodClient::connect(&seeds, &Connect::default())
            .await
            .unwrap();
        wait_members(&pc, 3).await;
        DoorPod {
            nodes,
            urls,
            seeds,
            pc,
        }
    }
}

/// The table's namespaces, created through `node`: `NS` (two copies of each block) and
/// `SMALL` (two copies, 1 MiB of quota).
async fn create_namespaces(node: &Node) {
    create_replicated(node, NS, 2).await;
    node.client
        .create_namespace_with(
            SMALL,
            &ctxpod_wire::types::CreateNamespace {
                quota_bytes: Some(1 << 20),
                replication: Some(2),
                class: None,
                compression: None,
            },
        )
        .await
        .unwrap();
}

/// Every door of the pod of `seeds`, the plain and S3 ones through node `a`.
pub(super) async fn open_doors(seeds: &[String], a: &Node) -> [Door; 5] {
    let s3_addr = std::fs::read_to_string(a.dir.join("ctxpod.s3.addr")).unwrap();
    let s3 = aws_sdk_s3::Client::from_conf(
        aws_sdk_s3::Config::builder()
            .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
            .endpoint_url(format!("http://{}", s3_addr.trim()))
            .force_path_style(true)
            .region(aws_sdk_s3::config::Region::new("us-east-1"))
            .credentials_provider(aws_sdk_s3::config::Credentials::new(
                "k", "s", None, None, "t",
            ))
            .build(),
    );
    [
        Door::Http(
            PodClient::connect(seeds, &Connect::default())
                .await
                .unwrap(),
        ),
        Door::Cxp1(
            TransferPod::connect(seeds, &Connect::default())
                .await
                .unwrap(),
        ),
        Door::Forward(Client::connect(&a.url, &Connect::default()).unwrap()),
        Door::Batch(Client::connect(&a.url, &Connect::default()).unwrap()),
        Door::S3(s3),
    ]
}

/// Runs `row`'s steps through `door` on `key` (staged with `data`; `large`: the size of
/// `put_large`'s block): one line per answer that differs from the table's.
async fn run_row(door: &Door, row: &Value, key: &[u8], data: &Bytes, large: usize) -> Vec<String> {
    let ns = row["namespace"].as_str().unwrap_or(NS);
    let mut failures = Vec::new();
    for step in row["steps"].as_array().unwrap() {
        let (op, want) = (step[0].as_str().unwrap(), step[1].as_str().unwrap());
        let got = match op {
            "get" => door.get(ns, key, data).await,
            "put" => door.put(ns, key, data.clone()).await,
            "put_large" => {
                let big = Bytes::from(vec![7u8; large]);
                door.put(ns, key, big).await
            }
            "delete" => door.delete(ns, key).await,
            op => panic!("unknown op {op}"),
        };
        if got != want {
            failures.push(format!(
                "{}: {:?}: {op} answered {got:?}, the table says {want:?}",
                door.name(),
                row["name"].as_str().unwrap()
            ));
        }
    }
    failures
}

/// Bytes every live node of `nodes` has read from its device so far.
async fn device_read_bytes(nodes: &[&Node]) -> u64 {
    let mut sum = 0;
    for n in nodes {
        let r = n
            .request(reqwest::Method::GET, "/metrics")
            .send()
            .await
            .unwrap();
        let text = r.text().await.unwrap();
        sum += crate::common::metric_of(&text, "ctxpod_device_read_bytes_total") as u64;
    }
    sum
}

/// A Range GET of a 2 MiB block (a vLLM block of 16 tokens of Llama-3-8B, all layers) in a
/// pod of three, R = 2, through member a, which holds no copy and forwards it: the holder
/// reads only the 4 KiB head and the two segments that hold the range; with the first
/// holder killed, the second does the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_through_a_member_without_the_block_reads_only_its_segments() {
    let tmp = tempfile::tempdir().unwrap();
    let etcd = EtcdServer::start(tmp.path());
    let DoorPod { mut nodes, pc, .. } = DoorPod::start(tmp.path(), &etcd, "ranges", "256MiB").await;
    create_replicated(&nodes[0], NS, 2).await;
    let key = (0..10_000)
        .map(|n| format!("range/{n}").into_bytes())
        .find(|k| !pc.ranked(NS, k)[..2].contains(&"a".to_string()))
        .expect("a key a holds no copy of");
    let holders: Vec<usize> = pc.ranked(NS, &key)[..2]
        .iter()
        .map(|id| ["a", "b", "c"].iter().position(|x| x == id).unwrap())
        .collect();
    let data = crate::common::block(5, 2 << 20);
    pc.put(NS, &key, data.clone(), Durability::Durable)
        .await
        .unwrap();
    let seg = ctxpod_format::record::SEGMENT_BYTES;
    let (lo, hi) = (3 * seg - 10, 3 * seg + 9);
    let path = format!("/v1/namespaces/{NS}/blocks/{}", hex::encode(&key));
    for round in ["both holders up", "the first holder killed"] {
        if round != "both holders up" {
            nodes[holders[0]].kill9();
        }
        let live: Vec<&Node> = (0..3)
            .filter(|&i| round == "both holders up" || i != holders[0])
            .map(|i| &nodes[i])
            .collect();
        let before = device_read_bytes(&live).await;
        let r = nodes[0]
            .request(reqwest::Method::GET, &path)
            .header("range", format!("bytes={lo}-{hi}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 206, "{round}");
        assert_eq!(r.bytes().await.unwrap(), data.slice(lo..hi + 1), "{round}");
        let read = device_read_bytes(&live).await - before;
        assert_eq!(
            read,
            (4096 + 2 * seg) as u64,
            "{round}: bytes read from flash"
        );
    }
}
