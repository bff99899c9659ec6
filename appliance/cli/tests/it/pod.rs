//! The pod against a real etcd: registration under leases, watches, lease expiry, and etcd
//! going away and coming back.

use crate::common;

mod doors;
mod meta;
mod partitions;
mod values;
mod zones;

use common::etcd::{EtcdServer, PodEtcd};
use common::metric_of;
use common::Node;
use ctxpod_client::connect::Connect;
use ctxpod_client::pod_client::PodClient;
use ctxpod_pod::membership::{
    members_prefix, MemberInfo, MemberState, Membership, PodView, Registration,
};
use ctxpod_wire::types::{Cluster, NamespaceInfo};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// A durable put through the pod client, which must be acknowledged.
async fn put_durable(pc: &PodClient, key: &[u8], data: bytes::Bytes) {
    pc.put("default", key, data, ctxpod_wire::Durability::Durable)
        .await
        .expect("an acknowledged put");
}

/// A real node with 256 MiB of capacity and this configuration, its data in `dir/<id>`.
async fn pod_node(dir: &std::path::Path, id: &str, config: &str) -> Node {
    Node::start_configured(
        &dir.join(id),
        &["--capacity", "256MiB"],
        config,
        Connect::default(),
        false,
    )
    .await
}

fn member(id: &str, capacity: u64) -> MemberInfo {
    MemberInfo {
        id: id.into(),
        http: format!("http://127.0.0.1:1/{id}"),
        transfer: None,
        capacity,
        zone: "z1".into(),
        state: MemberState::Up,
    }
}

fn ids(v: &PodView) -> Vec<String> {
    v.members.iter().map(|m| m.id.clone()).collect()
}

/// Waits (at most `secs`, a liveness bound) until the view satisfies `ok`.
async fn wait_for(m: &Arc<Membership>, secs: u64, what: &str, ok: impl Fn(&PodView) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut rx = m.subscribe();
    loop {
        if ok(&rx.borrow_and_update()) {
            return;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "{what}: not within {secs} s; view {:?}",
            ids(&m.view())
        );
        let _ = tokio::time::timeout(left.min(Duration::from_millis(200)), rx.changed()).await;
    }
}

/// Calls `check` every `every` until it answers `Ok`, for `bound` at most: a liveness
/// bound, past which the test fails with `check`'s last `Err`. Its `Ok`.
async fn poll<T>(
    bound: Duration,
    every: Duration,
    mut check: impl AsyncFnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + bound;
    loop {
        match check().await {
            Ok(v) => return v,
            Err(why) => assert!(Instant::now() < deadline, "{why}"),
        }
        tokio::time::sleep(every).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_join_leave_and_expire_through_etcd_leases() {
    let tmp = tempfile::tempdir().unwrap();
    let mut etcd = EtcdServer::start(tmp.path());
    let client = etcd.client();
    let stop = CancellationToken::new();
    let watcher = Membership::watch_etcd(client.clone(), "t", "http", stop.clone())
        .await
        .unwrap();
    assert!(watcher.view().members.is_empty());
    assert!(watcher.etcd_up());

    let ttl = Duration::from_secs(3);
    let mut regs = Vec::new();
    for (id, cap) in [("a", 100), ("b", 200), ("c", 300)] {
        regs.push(
            Registration::register(client.clone(), "t", member(id, cap), ttl, None)
                .await
                .unwrap(),
        );
    }
    wait_for(&watcher, 10, "three members", |v| ids(v) == ["a", "b", "c"]).await;
    let v = watcher.view();
    assert_eq!(v.member("b").unwrap().capacity, 200);
    assert_eq!(v.placement.len(), 3);
    // Registrations renew their leases: after twice the TTL, all three are still there.
    tokio::time::sleep(ttl * 2).await;
    assert_eq!(ids(&watcher.view()), ["a", "b", "c"]);

    // A node that leaves revokes its lease: it is gone well before its TTL would end.
    let b = regs.remove(1);
    b.leave().await;
    wait_for(&watcher, 2, "b left", |v| ids(v) == ["a", "c"]).await;

    // A node that stops renewing (as after kill -9: no revoke) is dropped when its lease
    // expires. Here a record under a 2 s lease that nobody renews.
    let lease = client.grant(2).await.unwrap();
    let rec = serde_json::to_vec(&member("d", 50)).unwrap();
    client
        .put(&format!("{}d", members_prefix("t")), &rec, Some(lease))
        .await
        .unwrap();
    wait_for(&watcher, 5, "d joined", |v| ids(v) == ["a", "c", "d"]).await;
    wait_for(&watcher, 15, "d expired", |v| ids(v) == ["a", "c"]).await;

    // A malformed record is ignored, not fatal.
    client
        .put(&format!("{}junk", members_prefix("t")), b"not json", None)
        .await
        .unwrap();

    // etcd goes away: the watcher keeps the last view and says etcd is down.
    etcd.kill();
    let deadline = Instant::now() + Duration::from_secs(15);
    while watcher.etcd_up() {
        assert!(Instant::now() < deadline, "etcd down not noticed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(ids(&watcher.view()), ["a", "c"]);
    let seen = watcher.etcd_last_ok();
    assert!(seen > 0);

    // etcd comes back (same data): the watcher lists again and the registrations renew.
    etcd.restart();
    let deadline = Instant::now() + Duration::from_secs(15);
    while !watcher.etcd_up() {
        assert!(Instant::now() < deadline, "etcd's return not noticed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_for(&watcher, 15, "members after etcd's return", |v| {
        ids(v) == ["a", "c"]
    })
    .await;
    tokio::time::sleep(ttl * 2).await;
    assert_eq!(
        ids(&watcher.view()),
        ["a", "c"],
        "leases renewed after the restart"
    );

    for r in regs {
        r.leave().await;
    }
    wait_for(&watcher, 5, "everyone left", |v| v.members.is_empty()).await;
    stop.cancel();
}

#[tokio::test]
async fn a_lost_lease_is_taken_again() {
    let tmp = tempfile::tempdir().unwrap();
    let _etcd = EtcdServer::start(tmp.path());
    let client = _etcd.client();
    let stop = CancellationToken::new();
    let watcher = Membership::watch_etcd(client.clone(), "t", "http", stop.clone())
        .await
        .unwrap();
    let reg = Registration::register(
        client.clone(),
        "t",
        member("a", 1),
        Duration::from_secs(3),
        None,
    )
    .await
    .unwrap();
    wait_for(&watcher, 5, "a joined", |v| ids(v) == ["a"]).await;
    // The record is deleted by hand: the registration puts it back.
    let (_, kvs) = client.range_prefix(&members_prefix("t")).await.unwrap();
    assert_eq!(kvs.len(), 1);
    client.delete(&kvs[0].key).await.unwrap();
    wait_for(&watcher, 5, "a deleted", |v| v.members.is_empty()).await;
    wait_for(&watcher, 10, "a put back", |v| ids(v) == ["a"]).await;
    // Its lease is revoked (as after a partition longer than the TTL): it registers again
    // under a new lease.
    let before = client.leases().await.unwrap();
    assert_eq!(before.len(), 1);
    client.revoke(before[0]).await.unwrap();
    wait_for(&watcher, 5, "a's lease revoked", |v| v.members.is_empty()).await;
    wait_for(&watcher, 10, "a registered again", |v| ids(v) == ["a"]).await;
    let after = client.leases().await.unwrap();
    assert_eq!(after.len(), 1);
    assert_ne!(after, before);
    reg.leave().await;
    wait_for(&watcher, 5, "a left", |v| v.members.is_empty()).await;
    assert!(client.leases().await.unwrap().is_empty());
    stop.cancel();
}

/// Requests forwarded by the nodes whose `/metrics` texts these are, every outcome.
fn forwarded(texts: &[String]) -> f64 {
    let outcomes = ["read", "write", "read_miss", "unreachable"];
    texts
        .iter()
        .flat_map(|t| {
            outcomes
                .iter()
                .map(move |o| metric_of(t, &format!("ctxpod_forwarded_total{{outcome=\"{o}\"}}")))
        })
        .sum()
}

/// Every node's `/metrics` text.
async fn all_metrics(nodes: &[Node]) -> Vec<String> {
    let mut v = Vec::new();
    for n in nodes {
        v.push(n.client.metrics().await.unwrap());
    }
    v
}

/// Every node sees a, b and c, healthy, with their advertised addresses, zones and
/// capacities, from etcd (10 s at most).
async fn see_all_three_healthy(nodes: &[Node]) {
    for n in nodes {
        let c = wait_cluster(n, 10, 100, &n.url, |c| {
            member_ids(c) == ["a", "b", "c"] && c.members.iter().all(|m| m.health == "ok")
        })
        .await;
        assert_eq!(c.source, "etcd");
        assert!(c.etcd_up);
        assert!(c.revision > 0);
        let me = c.members.iter().find(|m| m.id == c.node_id).unwrap();
        assert_eq!(me.http, n.url);
        assert!(me.used_bytes.is_some());
        assert_eq!(me.zone, format!("z-{}", c.node_id));
        assert_eq!(me.capacity_bytes, 256 << 20);
    }
}

/// Three real nodes join a pod through a real etcd: each one's `/v1/cluster` lists all
/// three, healthy; a node killed with kill -9 leaves every view within its lease TTL; a
/// restarted node joins again; with etcd down the nodes keep serving with the last view
/// and say so in `/v1/cluster` and the metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_form_a_pod_through_etcd() {
    let tmp = tempfile::tempdir().unwrap();
    let mut etcd = EtcdServer::start(tmp.path());
    let config = |id: &str| {
        format!(
            "[pod]\nname = \"p3\"\nnode_id = \"{id}\"\nzone = \"z-{id}\"\n\
             {}lease_ttl_s = 3\n",
            etcd.pod_lines()
        )
    };
    let mut nodes = Vec::new();
    for id in ["a", "b", "c"] {
        nodes.push(pod_node(tmp.path(), id, &config(id)).await);
    }
    see_all_three_healthy(&nodes).await;
    let m = nodes[0].client.metrics().await.unwrap();
    assert_eq!(series(&m, "ctxpod_pod_members"), 3.0);
    assert_eq!(series(&m, "ctxpod_pod_etcd_up"), 1.0);

    // Any node answers: 300 blocks put through a, one plain HTTP client, land on their
    // placement's first member; every node serves every block.
    let n_blocks = 300u64;
    let held = put_through_a_served_by_all(&nodes, n_blocks).await;
    // The pod client routes every request itself: it reads every block and stores 300
    // more, each on its first-ranked member, and no node forwards any of them.
    let owned = pod_client_routes_itself(&nodes, &held, n_blocks).await;
    let on_c = held[2] + owned.get("c").copied().unwrap_or(0);
    let n_blocks = 2 * n_blocks;
    // MATCH of a chain spread over the three nodes, through any node: every member is asked
    // about its own keys; the first missing key stops it.
    let chain = match_through_any_node(&nodes, n_blocks).await;

    // kill -9 c: no revoke; it leaves the others' views when its 3 s lease runs out.
    nodes[2].kill9();
    c_blocks_miss_while_it_is_down(&nodes, &chain, on_c).await;
    for n in &nodes[..2] {
        wait_cluster(n, 15, 200, "c still listed", |c| {
            member_ids(c) == ["a", "b"]
        })
        .await;
    }
    // c comes back (a new port): it registers again and everyone sees its new address.
    nodes[2].restart().await;
    c_rejoins_and_serves_again(&nodes, n_blocks).await;

    // etcd down: the nodes keep serving, with the last view, and say etcd is down.
    etcd.kill();
    serves_with_the_last_view_while_etcd_is_down(&nodes[1]).await;
    // etcd back: the nodes notice, and the view is whole again.
    etcd.restart();
    for n in &nodes {
        wait_cluster(n, 20, 200, &n.url, |c| {
            c.etcd_up && member_ids(c) == ["a", "b", "c"]
        })
        .await;
    }
    // A clean stop revokes the lease: the node leaves at once, not after the TTL.
    nodes[0].stop();
    let what = "a still listed after a clean stop";
    wait_cluster(&nodes[1], 2, 100, what, |c| member_ids(c) == ["b", "c"]).await;
}

/// The value of the series `name` (labels included) in a `/metrics` text; NaN when absent,
/// so that no expected value, 0 included, matches a missing series.
fn series(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(f64::NAN)
}

/// The ids of a `/v1/cluster` answer's members, in its order.
fn member_ids(c: &Cluster) -> Vec<String> {
    c.members.iter().map(|m| m.id.clone()).collect()
}

/// Waits (`secs` at most, asking every `every_ms`) until `node`'s `/v1/cluster` answer
/// satisfies `ok`; fails with `what` and the last answer. That answer.
async fn wait_cluster(
    node: &Node,
    secs: u64,
    every_ms: u64,
    what: &str,
    ok: impl Fn(&Cluster) -> bool,
) -> Cluster {
    let (within, every) = (Duration::from_secs(secs), Duration::from_millis(every_ms));
    poll(within, every, async || {
        let c = node.client.cluster().await.unwrap();
        if ok(&c) {
            Ok(c)
        } else {
            Err(format!("{what}: {c:?}"))
        }
    })
    .await
}

/// `blk-` block `i`'s key.
fn blk_key(i: u64) -> Vec<u8> {
    format!("blk-{i:04}").into_bytes()
}

/// Puts blocks `0..n` (4 KiB) through node a, a plain HTTP client: each is stored once,
/// every node holds within 25 % of the mean, and every node serves every block (b by
/// forwarding reads). How many blocks each node holds.
async fn put_through_a_served_by_all(nodes: &[Node], n_blocks: u64) -> Vec<u64> {
    for i in 0..n_blocks {
        let data = common::block(i, 4096);
        let crc = ctxpod_wire::crc32c(&data);
        nodes[0]
            .client
            .put_with_crc(
                "default",
                &blk_key(i),
                data,
                crc,
                ctxpod_wire::Durability::Durable,
            )
            .await
            .unwrap();
    }
    let mut held = Vec::new();
    for n in nodes {
        held.push(n.client.stats().await.unwrap().block_count);
    }
    eprintln!("blocks per node: {held:?}");
    assert_eq!(
        held.iter().sum::<u64>(),
        n_blocks,
        "each block stored once: {held:?}"
    );
    // Stated skew: every node holds within 25 % of the mean (equal capacities).
    let mean = n_blocks as f64 / 3.0;
    for h in &held {
        assert!(
            (*h as f64 - mean).abs() <= 0.25 * mean,
            "blocks per node {held:?}, mean {mean:.0}"
        );
    }
    for n in nodes {
        for i in 0..n_blocks {
            let got = n.client.get("default", &blk_key(i)).await.unwrap();
            assert_eq!(got, Some(common::block(i, 4096)), "block {i} via {}", n.url);
        }
    }
    let fwd = series(
        &nodes[1].client.metrics().await.unwrap(),
        "ctxpod_forwarded_total{outcome=\"read\"}",
    );
    assert!(fwd > 0.0, "b forwarded reads");
    held
}

/// A pod client reads blocks `0..n` and stores `n..2n`, each on its first-ranked member
/// (the nodes held `held` before), and no node forwards any of them. How many of the new
/// blocks each member got.
async fn pod_client_routes_itself(
    nodes: &[Node],
    held: &[u64],
    n_blocks: u64,
) -> std::collections::HashMap<String, u64> {
    let before = forwarded(&all_metrics(nodes).await);
    let pc = PodClient::connect(&[nodes[1].url.clone()], &Connect::default())
        .await
        .unwrap();
    assert_eq!(pc.members().len(), 3);
    for i in 0..n_blocks {
        let got = pc.get("default", &blk_key(i)).await.unwrap();
        assert_eq!(
            got,
            Some(common::block(i, 4096)),
            "block {i} via the pod client"
        );
    }
    let mut owned = std::collections::HashMap::<String, u64>::new();
    for i in n_blocks..2 * n_blocks {
        put_durable(&pc, &blk_key(i), common::block(i, 4096)).await;
        *owned
            .entry(pc.ranked("default", &blk_key(i))[0].clone())
            .or_default() += 1;
    }
    assert_eq!(
        forwarded(&all_metrics(nodes).await),
        before,
        "nothing was forwarded"
    );
    for (n, (id, h)) in nodes.iter().zip(["a", "b", "c"].iter().zip(held)) {
        let now = n.client.stats().await.unwrap().block_count;
        assert_eq!(now - h, owned.get(*id).copied().unwrap_or(0), "node {id}");
    }
    owned
}

/// MATCH of the chain of blocks `0..n` through every node finds it whole; with a missing
/// key at 250, it stops there. The chain.
async fn match_through_any_node(nodes: &[Node], n_blocks: u64) -> Vec<Vec<u8>> {
    let mut chain: Vec<Vec<u8>> = (0..n_blocks).map(blk_key).collect();
    for n in nodes {
        assert_eq!(
            n.client.match_prefix("default", &chain).await.unwrap(),
            n_blocks
        );
    }
    chain.insert(250, b"no-such-block".to_vec());
    for n in nodes {
        assert_eq!(n.client.match_prefix("default", &chain).await.unwrap(), 250);
    }
    chain.remove(250);
    chain
}

/// While c is down (killed, still listed): its `on_c` blocks of `chain` are misses through
/// a (c unreachable, the fallback members do not hold them), never errors; everything else
/// is served; MATCH through b stops at c's first block.
async fn c_blocks_miss_while_it_is_down(nodes: &[Node], chain: &[Vec<u8>], on_c: u64) {
    let mut misses = 0;
    let mut first_miss = None;
    for i in 0..chain.len() as u64 {
        match nodes[0].client.get("default", &blk_key(i)).await.unwrap() {
            Some(b) => assert_eq!(b, common::block(i, 4096)),
            None => {
                misses += 1;
                first_miss.get_or_insert(i);
            }
        }
    }
    assert_eq!(misses, on_c, "exactly c's blocks became misses");
    // MATCH stops at c's first block: a member that cannot answer holds nothing.
    assert_eq!(
        nodes[1]
            .client
            .match_prefix("default", chain)
            .await
            .unwrap(),
        first_miss.unwrap()
    );
}

/// c, restarted on a new port, is listed by a with its new address, healthy; its blocks
/// (on its own device) are served again through a.
async fn c_rejoins_and_serves_again(nodes: &[Node], n_blocks: u64) {
    let c_url = nodes[2].url.clone();
    wait_cluster(&nodes[0], 10, 100, "c did not rejoin", |c| {
        c.members
            .iter()
            .any(|m| m.id == "c" && m.http == c_url && m.health == "ok")
    })
    .await;
    for i in 0..n_blocks {
        let got = nodes[0].client.get("default", &blk_key(i)).await.unwrap();
        assert_eq!(
            got,
            Some(common::block(i, 4096)),
            "block {i} after c's return"
        );
    }
}

/// With etcd down, `node` keeps the last view of a, b and c, says etcd is down in
/// `/v1/cluster` and its metrics, and still takes a durable put.
async fn serves_with_the_last_view_while_etcd_is_down(node: &Node) {
    let c = wait_cluster(node, 15, 200, "etcd down not noticed", |c| !c.etcd_up).await;
    assert_eq!(member_ids(&c), ["a", "b", "c"], "the last known view stays");
    assert!(c.etcd_last_ok > 0);
    let m = node.client.metrics().await.unwrap();
    assert_eq!(series(&m, "ctxpod_pod_etcd_up"), 0.0);
    assert_eq!(series(&m, "ctxpod_pod_members"), 3.0);
    node.client
        .put_with_crc(
            "default",
            b"still-serving",
            bytes::Bytes::from_static(b"x"),
            ctxpod_wire::crc32c(b"x"),
            ctxpod_wire::Durability::Durable,
        )
        .await
        .expect("a put while etcd is down");
}

/// A node alone needs no configuration: a pod of one, itself.
#[tokio::test]
async fn a_single_node_is_a_pod_of_one() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("n");
    let mut n = Node::start(&dir, &["--capacity", "128MiB"]).await;
    let c = n.client.cluster().await.unwrap();
    assert_eq!(c.source, "single");
    assert!(c.etcd_up);
    assert_eq!(c.members.len(), 1);
    assert_eq!(c.members[0].id, c.node_id);
    assert_eq!(c.members[0].http, n.url);
    // The id is kept in the data directory across restarts.
    let id = std::fs::read_to_string(dir.join("node.id")).unwrap();
    assert_eq!(id.trim(), c.node_id);
    n.restart().await;
    assert_eq!(n.client.cluster().await.unwrap().node_id, c.node_id);
    // Nothing to drain to, and no record to say so: refused, with the reason.
    let e = n.client.drain().await.unwrap_err().to_string();
    assert!(e.contains("etcd"), "{e}");
    assert_eq!(n.client.drain_status().await.unwrap().state, "up");
}

/// A fourth node joins a 3-node pod under a read load: about a quarter of the blocks now
/// rank it first (and only those move), no read fails meanwhile (blocks not yet on the new
/// node are found on their previous member), and new writes take the new node's share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fourth_node_joins_under_load() {
    let tmp = tempfile::tempdir().unwrap();
    let etcd = EtcdServer::start(tmp.path());
    let config = |id: &str| {
        format!(
            "[pod]\nname = \"p4\"\nnode_id = \"{id}\"\n{}lease_ttl_s = 3\n",
            etcd.pod_lines()
        )
    };
    let mut nodes = Vec::new();
    for id in ["a", "b", "c"] {
        nodes.push(pod_node(tmp.path(), id, &config(id)).await);
    }
    let pc = Arc::new(
        PodClient::connect(&[nodes[0].url.clone()], &Connect::default())
            .await
            .unwrap(),
    );
    wait_members(&pc, 3).await;
    let n_blocks = 400u64;
    let mut before = Vec::new();
    for i in 0..n_blocks {
        put_durable(&pc, &join_key(i), common::block(i, 2048)).await;
        before.push(pc.ranked("default", &join_key(i))[0].clone());
    }
    // Readers, through the pod client and through a plain HTTP client of node a, until told
    // to stop (30 s at most); every miss or error is a failure.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let plain = nodes[0].client.clone();
    let reader = spawn_join_reader(pc.clone(), plain, stop.clone(), n_blocks);
    nodes.push(pod_node(tmp.path(), "d", &config("d")).await);
    poll(
        Duration::from_secs(10),
        Duration::from_millis(100),
        async || {
            pc.refresh().await.unwrap();
            let mut all = pc.members().len() == 4;
            for n in &nodes {
                all &= n.client.cluster().await.unwrap().members.len() == 4;
            }
            all.then_some(())
                .ok_or_else(|| "the fourth node not seen by everyone".to_string())
        },
    )
    .await;
    // Let the readers run over the new view for a while.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (reads, failures) = reader.await.unwrap();
    no_read_failed(reads, &failures);

    // Only blocks that now rank d first changed owner: about a quarter of them.
    only_blocks_ranking_d_first_moved(&pc, &before);
    // Every block is still read, through the pod client and through every node.
    for i in 0..n_blocks {
        assert_eq!(
            pc.get("default", &join_key(i)).await.unwrap(),
            Some(common::block(i, 2048))
        );
        for n in &nodes {
            let got = n.client.get("default", &join_key(i)).await.unwrap();
            assert_eq!(got, Some(common::block(i, 2048)), "block {i} via {}", n.url);
        }
    }
    // MATCH finds the chain whole through any node, the new one included: blocks not yet on
    // their new first member are found on their previous one.
    let chain: Vec<Vec<u8>> = (0..n_blocks).map(join_key).collect();
    for n in &nodes {
        assert_eq!(
            n.client.match_prefix("default", &chain).await.unwrap(),
            n_blocks
        );
    }
    // New writes: the new node takes its share.
    let d_before = nodes[3].client.stats().await.unwrap().block_count;
    let mut to_d = 0;
    for i in n_blocks..n_blocks + 200 {
        put_durable(&pc, &join_key(i), common::block(i, 2048)).await;
        to_d += (pc.ranked("default", &join_key(i))[0] == "d") as u64;
    }
    assert!(to_d > 0);
    assert_eq!(
        nodes[3].client.stats().await.unwrap().block_count - d_before,
        to_d
    );
}

/// `join-` block `i`'s key.
fn join_key(i: u64) -> Vec<u8> {
    format!("join-{i:04}").into_bytes()
}

/// A reader of join blocks `0..n` (2 KiB), through the pod client and through `plain`,
/// until `stop` (30 s at most): (reads, failures), a failure being a miss or an error.
fn spawn_join_reader(
    pc: Arc<PodClient>,
    plain: ctxpod_client::client::Client,
    stop: Arc<std::sync::atomic::AtomicBool>,
    n_blocks: u64,
) -> tokio::task::JoinHandle<(u64, Vec<(u64, String)>)> {
    tokio::spawn(async move {
        let (mut reads, mut failures) = (0u64, Vec::new());
        let t0 = Instant::now();
        'outer: while t0.elapsed() < Duration::from_secs(30) {
            for i in 0..n_blocks {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break 'outer;
                }
                let want = common::block(i, 2048);
                let k = join_key(i);
                for got in [pc.get("default", &k).await, plain.get("default", &k).await] {
                    reads += 1;
                    if got.as_ref().ok().and_then(|g| g.as_ref()) != Some(&want) {
                        failures.push((i, format!("{got:?}").chars().take(80).collect::<String>()));
                    }
                }
            }
        }
        (reads, failures)
    })
}

/// Of the join blocks whose first-ranked member was `before[i]`, only those that now rank
/// d (the new node) first changed owner: about a quarter of them.
fn only_blocks_ranking_d_first_moved(pc: &PodClient, before: &[String]) {
    let n_blocks = before.len();
    let mut moved = 0;
    for (i, old) in before.iter().enumerate() {
        let now = pc.ranked("default", &join_key(i as u64))[0].clone();
        if &now != old {
            assert_eq!(
                now, "d",
                "block {i} moved from {old} to {now}, not to the new node"
            );
            moved += 1;
        }
    }
    let share = moved as f64 / n_blocks as f64;
    eprintln!("blocks that rank the new node first: {moved} of {n_blocks}");
    assert!(
        (0.15..=0.35).contains(&share),
        "{moved} of {n_blocks} moved"
    );
}

/// Node loss with two copies of every block: a 3-node pod, R = 2, under a write and read
/// load; one node at a time is killed with kill -9 and restarted, `CTXPOD_POD_CYCLES` times
/// (5 in CI). No acknowledged block is lost, every read succeeds while a node is down
/// (from the other copy), and a node that comes back gets the copies it missed by read
/// repair.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_loss_with_two_copies_loses_no_acknowledged_block() {
    let cycles: usize = common::env_or("CTXPOD_POD_CYCLES", 5);
    let tmp = tempfile::tempdir().unwrap();
    let etcd = EtcdServer::start(tmp.path());
    let config = |id: &str| {
        format!(
            "[pod]\nname = \"r2\"\nnode_id = \"{id}\"\n{}\
             lease_ttl_s = 3\nreplication = 2\n",
            etcd.pod_lines()
        )
    };
    let mut nodes = Vec::new();
    for id in ["a", "b", "c"] {
        nodes.push(pod_node(tmp.path(), id, &config(id)).await);
    }
    let pc = PodClient::connect(&[nodes[0].url.clone()], &Connect::default())
        .await
        .unwrap();
    wait_members(&pc, 3).await;
    assert_eq!(pc.replication(), 2);
    // A plain HTTP client's puts, sent to one node, are stored twice as well.
    plain_puts_are_stored_twice(&nodes).await;
    let acked = r2_write(&pc, 0, 100).await;
    assert_eq!(acked, 100);
    // The load: a writer and a reader through the pod client, running across every kill
    // and restart (bounded: they stop when told, or after 120 s).
    let pc = Arc::new(pc);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let acked_to = Arc::new(std::sync::atomic::AtomicU64::new(acked));
    let writer = spawn_r2_writer(pc.clone(), stop.clone(), acked_to.clone());
    let reader = spawn_r2_reader(pc.clone(), stop.clone(), acked_to.clone());
    for cycle in 0..cycles {
        kill_and_restart_under_load(&mut nodes, cycle, &pc, &acked_to).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let refused = writer.await.unwrap();
    let (reads, failures) = reader.await.unwrap();
    let acked = acked_to.load(std::sync::atomic::Ordering::Relaxed);
    assert!(acked > 100, "the writer made progress");
    no_read_failed(reads, &failures);
    // No acknowledged block is lost; reading each one through every node repairs the
    // copies a restarted node missed.
    for n in &nodes {
        r2_check_all(&pc, &n.client, acked).await;
    }
    eprintln!("writes not acknowledged (retried): {}", refused.len());
    // Every node now holds a copy of every block it ranks among the first two (read repair
    // put back what it missed while it was down).
    for (n, id) in nodes.iter().zip(["a", "b", "c"]) {
        let should = (0..acked)
            .filter(|&i| pc.ranked("default", &r2_key(i))[..2].contains(&id.to_string()))
            .count() as u64;
        let has = n.client.stats().await.unwrap().block_count;
        assert!(
            has >= should,
            "{id} holds {has} blocks, should hold at least {should}"
        );
    }
    assert!(pc.repairs() > 0, "read repair wrote missing copies back");
    eprintln!(
        "{cycles} kill -9 cycles: {acked} acknowledged blocks, none lost; {} copies repaired",
        pc.repairs()
    );
}

/// Blocks held by all of `nodes` together.
async fn blocks_on_all(nodes: &[Node]) -> u64 {
    let mut t = 0;
    for n in nodes {
        t += n.client.stats().await.unwrap().block_count;
    }
    t
}

/// 50 durable puts sent to node a by a plain HTTP client (R = 2): 100 more blocks in the
/// pod, two copies of each.
async fn plain_puts_are_stored_twice(nodes: &[Node]) {
    let before = blocks_on_all(nodes).await;
    for i in 0..50u64 {
        let k = format!("plain-{i}").into_bytes();
        let d = common::block(i, 3000);
        nodes[0]
            .client
            .put_with_crc(
                "default",
                &k,
                d.clone(),
                ctxpod_wire::crc32c(&d),
                ctxpod_wire::Durability::Durable,
            )
            .await
            .unwrap();
    }
    assert_eq!(
        blocks_on_all(nodes).await - before,
        100,
        "two copies of each"
    );
}

/// A writer through the pod client, until `stop` (120 s at most): r2 block `acked_to` on,
/// one at a time (paced, at most [`R2_BLOCKS_MAX`]), moving `acked_to` past each block
/// acknowledged and retrying the others; the refusals.
fn spawn_r2_writer(
    pc: Arc<PodClient>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    acked_to: Arc<std::sync::atomic::AtomicU64>,
) -> tokio::task::JoinHandle<Vec<String>> {
    tokio::spawn(async move {
        let t0 = Instant::now();
        let mut refused = Vec::new();
        while !stop.load(std::sync::atomic::Ordering::Relaxed)
            && t0.elapsed() < Duration::from_secs(120)
        {
            let i = acked_to.load(std::sync::atomic::Ordering::Relaxed);
            // Bounded: the blocks must fit the nodes' capacity, or eviction (not loss)
            // would take the oldest. Paced, so every cycle sees writes.
            if i >= R2_BLOCKS_MAX {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
            match r2_put(&pc, "default", i).await {
                Ok(_) => acked_to.store(i + 1, std::sync::atomic::Ordering::Relaxed),
                // Not acknowledged: retried (the same block) after a moment.
                Err(e) => {
                    refused.push(e.to_string());
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        refused
    })
}

/// Cycle `cycle` of the node-loss test: one node (a, b, c in turn) killed with kill -9,
/// the acknowledged blocks (below `acked_to`) checked meanwhile, then restarted, until the
/// pod client sees it back at its new address (10 s at most).
async fn kill_and_restart_under_load(
    nodes: &mut [Node],
    cycle: usize,
    pc: &PodClient,
    acked_to: &std::sync::atomic::AtomicU64,
) {
    let victim = cycle % 3;
    let live = (victim + 1) % 3;
    let id = ["a", "b", "c"][victim];
    tokio::time::sleep(Duration::from_millis(300)).await;
    nodes[victim].kill9();
    // While it is down (still listed until its lease runs out): writes go on being
    // acknowledged with two copies, and every acknowledged block reads back, through
    // the pod client and through a live node.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let upto = acked_to.load(std::sync::atomic::Ordering::Relaxed);
    r2_check_all(pc, &nodes[live].client, upto).await;
    nodes[victim].restart().await;
    let url = &nodes[victim].url;
    poll(
        Duration::from_secs(10),
        Duration::from_millis(100),
        async || {
            pc.refresh().await.unwrap();
            let back = pc.members().iter().any(|m| m.id == id && &m.http == url);
            back.then_some(())
                .ok_or_else(|| format!("cycle {cycle}: {id} did not rejoin"))
        },
    )
    .await;
}

/// Most blocks the node-loss test writes: about 16 MB per copy, well within 256 MiB nodes.
const R2_BLOCKS_MAX: u64 = 2_000;

/// A reader through the pod client, until `stop` (120 s at most): r2 blocks below `upto`
/// (read as it grows), stepping through them; (reads, failures), a failure being anything
/// but the block's own bytes.
fn spawn_r2_reader(
    pc: Arc<PodClient>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    upto: Arc<std::sync::atomic::AtomicU64>,
) -> tokio::task::JoinHandle<(u64, Vec<(u64, String)>)> {
    tokio::spawn(async move {
        let t0 = Instant::now();
        let (mut reads, mut failures) = (0u64, Vec::new());
        let mut i = 0u64;
        while !stop.load(std::sync::atomic::Ordering::Relaxed)
            && t0.elapsed() < Duration::from_secs(120)
        {
            let upto = upto.load(std::sync::atomic::Ordering::Relaxed);
            i = (i + 7919) % upto.max(1);
            reads += 1;
            match pc.get("default", &r2_key(i)).await {
                Ok(Some(b)) if b == r2_data(i) => {}
                other => {
                    failures.push((i, format!("{other:?}").chars().take(60).collect::<String>()))
                }
            }
        }
        (reads, failures)
    })
}

fn r2_key(i: u64) -> Vec<u8> {
    format!("r2-{i:05}").into_bytes()
}

fn r2_data(i: u64) -> bytes::Bytes {
    common::block(i, 1024 + (i as usize * 97) % 8192)
}

/// A background reader's outcome, `(block, answer)` per failed read: it read, and no read
/// failed (the first five failures shown).
fn no_read_failed(reads: u64, failures: &[(u64, String)]) {
    assert!(reads > 0);
    assert!(
        failures.is_empty(),
        "{} of {reads} reads failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
}

/// Puts block `i` (r2 key and data) durably into `ns` through the pod client.
async fn r2_put(
    pc: &PodClient,
    ns: &str,
    i: u64,
) -> Result<ctxpod_client::client::PutOutcome, ctxpod_client::client::ClientError> {
    let durable = ctxpod_wire::Durability::Durable;
    pc.put(ns, &r2_key(i), r2_data(i), durable).await
}

/// Puts blocks `from..from + n` through the pod client; how many were acknowledged before
/// the first failure.
async fn r2_write(pc: &PodClient, from: u64, n: u64) -> u64 {
    let mut ok = 0;
    for i in from..from + n {
        match r2_put(pc, "default", i).await {
            Ok(_) => ok += 1,
            Err(e) => {
                eprintln!("put {i}: {e}");
                break;
            }
        }
    }
    ok
}

/// Every acknowledged block reads back, through the pod client and through a node.
async fn r2_check_all(pc: &PodClient, plain: &ctxpod_client::client::Client, upto: u64) {
    for i in 0..upto {
        let want = r2_data(i);
        let got = pc
            .get("default", &r2_key(i))
            .await
            .expect("pod client read");
        assert_eq!(got.as_ref(), Some(&want), "block {i} via the pod client");
        let got = plain.get("default", &r2_key(i)).await.expect("plain read");
        assert_eq!(got.as_ref(), Some(&want), "block {i} via a node");
    }
}

/// The configuration of node `id` in pod `name` through `etcd` (3 s leases unless `extra`
/// sets `lease_ttl_s`), plus `extra` lines of `[pod]`.
fn pod_config<'a>(
    name: &'a str,
    etcd: &'a EtcdServer,
    extra: &'a str,
) -> impl Fn(&str) -> String + 'a {
    move |id: &str| {
        let lease = if extra.contains("lease_ttl_s") {
            ""
        } else {
            "lease_ttl_s = 3\n"
        };
        format!(
            "[pod]\nname = \"{name}\"\nnode_id = \"{id}\"\n{}{lease}{extra}",
            etcd.pod_lines()
        )
    }
}

/// Nodes a, b and c with `config`, and a pod client that sees all three.
async fn three_nodes(
    dir: &std::path::Path,
    config: &impl Fn(&str) -> String,
) -> (Vec<Node>, PodClient) {
    let mut nodes = Vec::new();
    for id in ["a", "b", "c"] {
        nodes.push(pod_node(dir, id, &config(id)).await);
    }
    let pc = PodClient::connect(&[nodes[0].url.clone()], &Connect::default())
        .await
        .unwrap();
    wait_members(&pc, 3).await;
    (nodes, pc)
}

/// What a pod made by [`pod_of_three`] runs on: its etcd, its temp dir, and its nodes'
/// configuration (dropped after the nodes, when declared before them).
struct PodGround {
    name: String,
    extra: String,
    etcd: EtcdServer,
    tmp: tempfile::TempDir,
}

impl PodGround {
    /// Node `id`'s configuration ([`pod_config`]).
    fn config(&self, id: &str) -> String {
        pod_config(&self.name, &self.etcd, &self.extra)(id)
    }
}

/// Pod `name` of nodes a, b and c over a fresh etcd, in a temp dir (`extra`: more lines of
/// `[pod]`); and a pod client that sees all three.
async fn pod_of_three(name: &str, extra: &str) -> (PodGround, Vec<Node>, PodClient) {
    let tmp = tempfile::tempdir().unwrap();
    let ground = PodGround {
        name: name.into(),
        extra: extra.into(),
        etcd: EtcdServer::start(tmp.path()),
        tmp,
    };
    let config = |id: &str| ground.config(id);
    let (nodes, pc) = three_nodes(ground.tmp.path(), &config).await;
    (ground, nodes, pc)
}

/// [`pod_of_three`] holding blocks `0..n` (r2 keys and data, every put acknowledged); their
/// keys.
async fn pod_holding(
    name: &str,
    extra: &str,
    n: u64,
) -> (PodGround, Vec<Node>, PodClient, Vec<Vec<u8>>) {
    let (ground, nodes, pc) = pod_of_three(name, extra).await;
    assert_eq!(r2_write(&pc, 0, n).await, n);
    (ground, nodes, pc, (0..n).map(r2_key).collect())
}

/// Creates namespace `name` with `copies` copies of each block through `node`.
async fn create_replicated(node: &Node, name: &str, copies: u32) -> NamespaceInfo {
    let c = &node.client;
    c.create_namespace_with(name, &replicated(copies))
        .await
        .unwrap()
}

/// A namespace of the pod's default quota with `copies` copies of each block.
fn replicated(copies: u32) -> ctxpod_wire::types::CreateNamespace {
    ctxpod_wire::types::CreateNamespace {
        quota_bytes: None,
        replication: Some(copies),
        class: None,
        compression: None,
    }
}

/// Waits (10 s at most) until every node's view has `n` members.
async fn wait_views(nodes: &[Node], n: usize) {
    for node in nodes {
        let deadline = Instant::now() + Duration::from_secs(10);
        while node.client.cluster().await.unwrap().members.len() < n {
            assert!(
                Instant::now() < deadline,
                "{}: {n} members not seen",
                node.url
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Waits (10 s at most) until the pod client's view has `n` members.
async fn wait_members(pc: &PodClient, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while pc.members().len() < n {
        assert!(Instant::now() < deadline, "{n} members not seen");
        tokio::time::sleep(Duration::from_millis(100)).await;
        pc.refresh().await.unwrap();
    }
}

/// Puts blocks `range` (r2 keys and data) one by one through a plain client.
async fn put_each(c: &ctxpod_client::client::Client, ns: &str, range: std::ops::Range<u64>) {
    for i in range {
        c.put(ns, &r2_key(i), r2_data(i), ctxpod_wire::Durability::Durable)
            .await
            .unwrap();
    }
}

/// Puts blocks `range` (r2 keys and data) durably one by one through the pod client.
async fn pod_put_each(pc: &PodClient, ns: &str, range: std::ops::Range<u64>) {
    for i in range {
        r2_put(pc, ns, i).await.unwrap();
    }
}

/// Which of `keys` node `n` holds itself (`present` marked as routed: no fan-out).
async fn held_here(n: &Node, ns: &str, keys: &[Vec<u8>]) -> Vec<bool> {
    let http = reqwest::Client::builder()
        .use_preconfigured_tls(ctxpod_client::connect::untrusting_tls_config())
        .build()
        .unwrap();
    let mut out = Vec::new();
    for chunk in keys.chunks(1000) {
        let r = http
            .post(format!("{}/v1/namespaces/{ns}/present", n.url))
            .header(ctxpod_wire::HEADER_ROUTED, "test")
            .json(&ctxpod_wire::types::KeysRequest {
                keys: chunk.iter().map(hex::encode).collect(),
            })
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "present: {}", r.status());
        let p: ctxpod_wire::types::PresentResponse = r.json().await.unwrap();
        assert_eq!(p.present.len(), chunk.len());
        out.extend(p.present);
    }
    out
}

/// How many of `keys` that `id` ranks among the first `r` it does not hold itself.
async fn missing_share(
    pc: &PodClient,
    n: &Node,
    id: &str,
    ns: &str,
    keys: &[Vec<u8>],
    r: usize,
) -> usize {
    let mine: Vec<Vec<u8>> = keys
        .iter()
        .filter(|k| pc.ranked(ns, k)[..r].contains(&id.to_string()))
        .cloned()
        .collect();
    held_here(n, ns, &mine)
        .await
        .iter()
        .filter(|h| !**h)
        .count()
}

/// Waits (60 s at most, a liveness bound) until member `id` holds every one of `keys` it
/// ranks among the first two in `default`.
async fn wait_backfilled(pc: &PodClient, n: &Node, id: &str, keys: &[Vec<u8>]) {
    // Its share is counted from the client's ranking: with `id` in it, or it is empty.
    assert!(
        pc.members().iter().any(|m| m.id == id),
        "{id} is not in the client's view"
    );
    poll(
        Duration::from_secs(60),
        Duration::from_millis(500),
        async || match missing_share(pc, n, id, "default", keys, 2).await {
            0 => Ok(()),
            left => Err(format!("{id} still misses {left} of its blocks after 60 s")),
        },
    )
    .await;
}

/// Backfill without reads: a node killed while writes went on, then restarted, and a node
/// that joins, each end up holding every block they rank among the first R, with no
/// client reading anything (read repair never runs), within the backfill's byte rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_brings_a_restarted_and_a_new_node_their_share_without_reads() {
    let backfill = "replication = 2\nbackfill_interval_s = 1\nbackfill_bytes_per_s = \"8MiB\"\n";
    let (ground, mut nodes, pc) = pod_of_three("bf", backfill).await;
    let keys: Vec<Vec<u8>> = (0..600).map(r2_key).collect();
    assert_eq!(r2_write(&pc, 0, 300).await, 300);
    // c dies; 300 more blocks are written while it is away (each to the two reachable
    // members first in its ranking). Its share of them is counted with c in the view
    // (before it dies: its lease may expire while the writes go on, and the view drop it).
    let missed = keys[300..]
        .iter()
        .filter(|k| pc.ranked("default", k)[..2].contains(&"c".to_string()))
        .count();
    nodes[2].kill9();
    assert_eq!(r2_write(&pc, 300, 300).await, 300);
    assert!(
        missed > 100,
        "c ranks among the first two for {missed} of the new blocks"
    );
    nodes[2].restart().await;
    // The client's view has c again (it may have dropped it while c was away), so c's
    // share below is counted with c in the ranking.
    wait_members(&pc, 3).await;
    wait_backfilled(&pc, &nodes[2], "c", &keys).await;
    // Copied by a's and b's passes (either may have copied a block first).
    let mut copied = 0.0;
    for n in &nodes[..2] {
        let m = reqwest_text(&format!("{}/metrics", n.url)).await;
        copied += metric_of(&m, "ctxpod_backfill_copied_blocks_total");
    }
    assert!(
        copied >= missed as f64,
        "backfill copied {copied} blocks for the {missed} c missed"
    );
    assert_eq!(pc.repairs(), 0, "no read, no read repair");

    // A fourth node joins: it receives the blocks it now ranks among the first two.
    nodes.push(pod_node(ground.tmp.path(), "d", &ground.config("d")).await);
    wait_members(&pc, 4).await;
    let share = keys
        .iter()
        .filter(|k| pc.ranked("default", k)[..2].contains(&"d".to_string()))
        .count();
    assert!(
        share > 150,
        "d ranks among the first two for {share} of 600"
    );
    wait_backfilled(&pc, &nodes[3], "d", &keys).await;
    // Every block still reads back, and every member holds its share.
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(pc.get("default", k).await.unwrap(), Some(r2_data(i as u64)));
    }
    for (n, id) in nodes.iter().zip(["a", "b", "c", "d"]) {
        assert_eq!(
            missing_share(&pc, n, id, "default", &keys, 2).await,
            0,
            "{id}"
        );
    }
    eprintln!("backfill: {missed} blocks missed by c, {share} now ranked on d, all copied");
}

async fn reqwest_text(url: &str) -> String {
    reqwest::Client::builder()
        .use_preconfigured_tls(ctxpod_client::connect::untrusting_tls_config())
        .build()
        .unwrap()
        .get(url)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// c, back, has caught up from etcd with what changed while it was away (30 s at most).
async fn c_caught_up(c: &ctxpod_client::client::Client) {
    use ctxpod_wire::types::NamespaceClass;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let new = c.namespace("new").await.ok().and_then(|i| i.quota_bytes);
        let experts = c.namespace("experts").await.ok().map(|i| i.class);
        let hot_gone = c.namespace("hot").await.is_err();
        // Absent for a moment while c replaces the old incarnation with the new one.
        let late = c.namespace("late").await.ok();
        let caught_up =
            new == Some(1 << 30) && hot_gone && experts == Some(NamespaceClass::Weights);
        if let (true, Some(l)) = (caught_up, &late) {
            if l.replication == Some(2) {
                assert_eq!(l.block_count, 0, "the old incarnation's blocks are gone");
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "c did not catch up: new {new:?}, experts {experts:?}, hot gone {hot_gone}, late {late:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `moe`, created `weights` through b: so on every member, and c cannot make it `kv`.
async fn a_class_is_the_same_on_every_member(nodes: &[Node]) {
    use ctxpod_wire::types::{CreateNamespace, NamespaceClass};
    let class = |c: NamespaceClass| CreateNamespace {
        class: Some(c),
        ..CreateNamespace::default()
    };
    nodes[1]
        .client
        .create_namespace_with("moe", &class(NamespaceClass::Weights))
        .await
        .unwrap();
    let refused = nodes[2]
        .client
        .create_namespace_with("moe", &class(NamespaceClass::Kv))
        .await
        .expect_err("another class through another member");
    assert_eq!(refused.status(), Some(409), "{refused}");
    for n in nodes {
        assert_eq!(
            n.client.namespace("moe").await.unwrap().class,
            NamespaceClass::Weights
        );
    }
    // Its compression, set through a third member, is every member's too.
    let zstd = CreateNamespace {
        compression: Some(ctxpod_wire::types::Compression::Zstd),
        ..class(NamespaceClass::Weights)
    };
    nodes[0]
        .client
        .create_namespace_with("moe", &zstd)
        .await
        .unwrap();
    for n in nodes {
        let info = n.client.namespace("moe").await.unwrap();
        assert_eq!(
            (info.class, info.compression),
            (
                NamespaceClass::Weights,
                Some(ctxpod_wire::types::Compression::Zstd)
            )
        );
    }
}

/// Namespaces are the pod's: created, changed and deleted through any node on every
/// member; a member that was away catches up from etcd (a namespace created, one deleted,
/// one deleted and created again, which drops the old blocks; one created with its class);
/// a namespace's own replication holds for plain clients (forwarded) and the pod client
/// alike; a namespace's class is the same on every member and cannot be changed through
/// any of them; its compression is every member's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_and_their_replication_are_the_pods() {
    use ctxpod_wire::types::{CreateNamespace, NamespaceClass};
    let (_ground, mut nodes, pc) = pod_of_three("ns", "").await;
    // Every node's view must list all three before a namespace change goes out.
    wait_views(&nodes, 3).await;
    a_class_is_the_same_on_every_member(&nodes).await;
    let info = create_replicated(&nodes[0], "hot", 3).await;
    assert_eq!(info.replication, Some(3));
    for n in &nodes {
        assert_eq!(
            n.client.namespace("hot").await.unwrap().replication,
            Some(3)
        );
    }
    let bad = replicated(9);
    assert!(nodes[1]
        .client
        .create_namespace_with("bad", &bad)
        .await
        .is_err());
    for n in &nodes {
        assert!(n.client.namespace("bad").await.is_err(), "nothing recorded");
    }
    // A plain client's puts sent to b, and the pod client's: three copies each in `hot`;
    // `default` keeps the pod's one.
    for i in 0..40u64 {
        let (k, d) = (r2_key(i), r2_data(i));
        nodes[1]
            .client
            .put("hot", &k, d, ctxpod_wire::Durability::Durable)
            .await
            .unwrap();
    }
    assert_eq!(pc.replication_of("hot").await, 3);
    assert_eq!(pc.replication_of("default").await, 1);
    pod_put_each(&pc, "hot", 40..80u64).await;
    for i in 0..60u64 {
        put_durable(&pc, &r2_key(i), r2_data(i)).await;
    }
    let mut in_default = 0;
    for n in &nodes {
        assert_eq!(n.client.namespace("hot").await.unwrap().block_count, 80);
        in_default += n.client.namespace("default").await.unwrap().block_count;
    }
    assert_eq!(in_default, 60, "one copy each in default");
    // `late` exists before c goes away, with blocks on c.
    nodes[0]
        .client
        .create_namespace("late", None)
        .await
        .unwrap();
    pod_put_each(&pc, "late", 0..60u64).await;
    assert!(nodes[2].client.namespace("late").await.unwrap().block_count > 0);

    // c is away while `new` is created, `hot` deleted and `late` deleted and created
    // again with other settings.
    nodes[2].kill9();
    nodes[0]
        .client
        .create_namespace("new", Some(1 << 30))
        .await
        .unwrap();
    nodes[1].client.delete_namespace("hot").await.unwrap();
    nodes[0].client.delete_namespace("late").await.unwrap();
    create_replicated(&nodes[1], "late", 2).await;
    nodes[0]
        .client
        .create_namespace_with(
            "experts",
            &CreateNamespace {
                class: Some(NamespaceClass::Weights),
                ..CreateNamespace::default()
            },
        )
        .await
        .unwrap();
    for n in &nodes[..2] {
        assert!(n.client.namespace("hot").await.is_err());
        assert_eq!(
            n.client.namespace("new").await.unwrap().quota_bytes,
            Some(1 << 30)
        );
        let l = n.client.namespace("late").await.unwrap();
        assert_eq!((l.replication, l.block_count), (Some(2), 0));
    }
    nodes[2].restart().await;
    c_caught_up(&nodes[2].client).await;
    // Deleting `default` through one node empties it on every node.
    nodes[1].client.delete_namespace("default").await.unwrap();
    for n in &nodes {
        assert_eq!(n.client.namespace("default").await.unwrap().block_count, 0);
    }
}

/// Batches sent to any node are answered for the whole pod: `batch/put` stores each block
/// on its R first-ranked members (R of the namespace), `batch/get` and `present` find
/// every block wherever it lives, `pin` and `unpin` reach the members holding the keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_sent_to_any_node_are_answered_for_the_pod() {
    let (_ground, mut nodes, pc) = pod_of_three("bt", "").await;
    wait_views(&nodes, 3).await;
    create_replicated(&nodes[0], "r2", 2).await;
    let keys: Vec<Vec<u8>> = (0..120).map(r2_key).collect();
    let blocks: Vec<(Vec<u8>, bytes::Bytes)> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (k.clone(), r2_data(i as u64)))
        .collect();
    for (ns, via, copies) in [("default", 1, 1), ("r2", 2, 2)] {
        batch_put_lands_on_the_first_ranked(&nodes, &pc, (ns, via, copies), &blocks).await;
    }
    let absent: Vec<Vec<u8>> = (0..10)
        .map(|i| format!("absent-{i}").into_bytes())
        .collect();
    let asked: Vec<Vec<u8>> = keys.iter().chain(&absent).cloned().collect();
    for ns in ["default", "r2"] {
        for n in &nodes {
            let got = n.client.batch_get(ns, &asked).await.unwrap();
            assert_eq!(got.len(), 130);
            for (i, (k, d)) in got.iter().enumerate() {
                assert_eq!(k, &asked[i]);
                let want = (i < 120).then(|| r2_data(i as u64));
                assert_eq!(d.as_ref(), want.as_ref(), "{ns} via {}: block {i}", n.url);
            }
            let p = n.client.present(ns, &asked).await.unwrap();
            assert_eq!(p, (0..130).map(|i| i < 120).collect::<Vec<_>>());
        }
    }
    assert_eq!(
        nodes[1].client.pin("r2", &asked, 60_000).await.unwrap(),
        120
    );
    assert_eq!(nodes[2].client.unpin("r2", &asked).await.unwrap(), 120);
    assert_eq!(nodes[0].client.unpin("r2", &asked).await.unwrap(), 0);
    // Promotion through any member reaches every member holding a copy (of one tier
    // each: every present block counts as in the fast tier, none moves).
    let pr = nodes[2].client.promote("r2", &asked).await.unwrap();
    assert_eq!((pr.promoted, pr.fast), (0, 120), "{pr:?}");
    pod_curve_and_overview_sum_the_members(&nodes).await;
    // With a member down, the R = 2 blocks are still all found, and a batch put still
    // stores two copies (the next member in rank order stands in).
    nodes[2].kill9();
    let got = nodes[0].client.batch_get("r2", &keys).await.unwrap();
    assert!(got
        .iter()
        .enumerate()
        .all(|(i, (_, d))| d.as_ref() == Some(&r2_data(i as u64))));
    let more: Vec<(Vec<u8>, bytes::Bytes)> = (120..160).map(|i| (r2_key(i), r2_data(i))).collect();
    let st = nodes[1]
        .client
        .batch_put("r2", &more, ctxpod_wire::Durability::Durable)
        .await
        .unwrap();
    assert!(st.iter().all(|s| *s == 201), "{st:?}");
    let more_keys: Vec<Vec<u8>> = more.iter().map(|(k, _)| k.clone()).collect();
    let on_a = held_here(&nodes[0], "r2", &more_keys).await;
    let on_b = held_here(&nodes[1], "r2", &more_keys).await;
    assert!(
        on_a.iter().zip(&on_b).all(|(a, b)| *a && *b),
        "two copies on a and b"
    );
}

/// A `batch/put` of `blocks` into `ns` sent to node `via` (of a, b, c): every block
/// stored, each on its first `copies` ranked members and nowhere else.
async fn batch_put_lands_on_the_first_ranked(
    nodes: &[Node],
    pc: &PodClient,
    (ns, via, copies): (&str, usize, usize),
    blocks: &[(Vec<u8>, bytes::Bytes)],
) {
    let st = nodes[via]
        .client
        .batch_put(ns, blocks, ctxpod_wire::Durability::Durable)
        .await
        .unwrap();
    assert!(st.iter().all(|s| *s == 201), "{ns}: {st:?}");
    // Each block is on its first `copies` ranked members and nowhere else.
    let keys: Vec<Vec<u8>> = blocks.iter().map(|(k, _)| k.clone()).collect();
    let mut held = Vec::new();
    for n in nodes {
        held.push(held_here(n, ns, &keys).await);
    }
    for (i, k) in keys.iter().enumerate() {
        let ranked = pc.ranked(ns, k);
        for (j, id) in ["a", "b", "c"].iter().enumerate() {
            let should = ranked[..copies].contains(&id.to_string());
            assert_eq!(held[j][i], should, "{ns}: block {i} on {id}");
        }
    }
}

/// The pod's miss-ratio curve and the dashboard's overview, asked of one node, sum every
/// member's: 120 blocks once in `default` and twice in `r2`.
async fn pod_curve_and_overview_sum_the_members(nodes: &[Node]) {
    // The pod's miss-ratio curve, merged by the node asked from every member's.
    let pod_curve = nodes[1].client.pod_mrc().await.unwrap();
    let (mut refs, mut cap) = (0, 0);
    for n in nodes {
        let m = n.client.mrc().await.unwrap();
        refs += m.references;
        cap += m.capacity_blocks;
    }
    assert!(refs > 0);
    assert_eq!(
        (pod_curve.references, pod_curve.capacity_blocks),
        (refs, cap)
    );
    assert_eq!(pod_curve.points.last().unwrap().capacity_blocks, 4 * cap);
    // The dashboard's overview, asked of any node: every member with its stats, and each
    // namespace's blocks summed over the members (120 blocks once, and twice in r2).
    let o = nodes[2].client.overview().await.unwrap();
    assert_eq!(o.members.len(), 3);
    let mut blocks = 0;
    for (m, n) in o.members.iter().zip(nodes) {
        assert_eq!(m.health, "ok", "{m:?}");
        let s = m.stats.as_ref().expect("stats");
        assert_eq!(s.block_count, n.client.stats().await.unwrap().block_count);
        blocks += s.block_count;
    }
    let ns_blocks = |name: &str| {
        o.namespaces
            .iter()
            .find(|n| n.name == name)
            .map(|n| n.block_count)
    };
    assert_eq!(
        (ns_blocks("default"), ns_blocks("r2")),
        (Some(120), Some(240))
    );
    assert_eq!(blocks, 360);
}

/// A pod over mTLS with tokens: nodes reach each other over https (trusting the pod's CA,
/// presenting their own certificates), forward a tenant's requests in its own namespace,
/// copy namespaces and backfill with the peer token, and report every member's usage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_over_mtls_with_tokens() {
    let tmp = tempfile::tempdir().unwrap();
    let etcd = EtcdServer::start(tmp.path());
    let pod = TlsPod::new(tmp.path());
    let acme_tok = pod.acme_tok.clone();
    let how = |token: &str| pod.how(token);
    let mut nodes = Vec::new();
    for id in ["a", "b", "c"] {
        nodes.push(pod.node(tmp.path(), id, &etcd).await);
    }
    wait_views(&nodes, 3).await;
    // Usage of every member, asked over mTLS with the peer token.
    let c = nodes[0].client.cluster().await.unwrap();
    assert!(
        c.members
            .iter()
            .all(|m| m.health == "ok" && m.used_bytes.is_some()),
        "{c:?}"
    );
    // The tenant's namespace, created through b, exists on every node (copied over https
    // with the tenant's token).
    nodes[1].client.create_namespace("kv", None).await.unwrap();
    for n in &nodes {
        assert_eq!(n.client.namespace("kv").await.unwrap().block_count, 0);
    }
    // Single-block puts sent to a are forwarded over https, two copies each, in the
    // tenant's namespace.
    let keys: Vec<Vec<u8>> = (0..120).map(r2_key).collect();
    put_each(&nodes[0].client, "kv", 0..60u64).await;
    let count = |nodes: &[Node]| {
        let cs: Vec<_> = nodes.iter().map(|n| n.client.clone()).collect();
        async move {
            let mut v = Vec::new();
            for c in cs {
                v.push(c.namespace("kv").await.unwrap().block_count);
            }
            v
        }
    };
    assert_eq!(count(&nodes).await.iter().sum::<u64>(), 120);
    // c misses 60 writes; backfill (peer token, tenant header, over https) gives them back.
    nodes[2].kill9();
    put_each(&nodes[0].client, "kv", 60..120u64).await;
    nodes[2].restart().await;
    let pc = PodClient::connect(&[nodes[0].url.clone()], &how(&acme_tok))
        .await
        .unwrap();
    wait_members(&pc, 3).await;
    let on_c = keys
        .iter()
        .filter(|k| pc.ranked("kv", k)[..2].contains(&"c".to_string()))
        .count() as u64;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n = count(&nodes[2..]).await[0];
        if n == on_c {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "c holds {n} of its {on_c} blocks"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(
            nodes[2].client.get("kv", k).await.unwrap(),
            Some(r2_data(i as u64)),
            "block {i} through c"
        );
    }
    // Two copies of each, plus the third copy of each block written while c was away
    // that ranks c among its first two (it stays where it was put until evicted).
    let stand_ins = keys[60..]
        .iter()
        .filter(|k| pc.ranked("kv", k)[..2].contains(&"c".to_string()))
        .count() as u64;
    assert_eq!(count(&nodes).await.iter().sum::<u64>(), 240 + stand_ins);
}

/// A pod over mTLS with tokens: one CA signs every node's certificate and an engine's
/// client certificate; `peer` (admin) is the peer token, `acme-rw` a tenant's.
struct TlsPod {
    ca: common::pki::Ca,
    pki: std::path::PathBuf,
    ca_file: std::path::PathBuf,
    peer_file: std::path::PathBuf,
    peer_hash: String,
    peer_tok: String,
    acme_tok: String,
    acme_hash: String,
    client_cert: common::pki::Files,
}

impl TlsPod {
    fn new(dir: &std::path::Path) -> TlsPod {
        let pki = dir.join("pki");
        std::fs::create_dir_all(&pki).unwrap();
        let ca = common::pki::Ca::new("pod CA");
        let ca_file = ca.write(&pki.join("ca.crt"));
        let (peer_tok, peer_hash) = ctxpod_node::auth::new_token("peer").unwrap();
        let (acme_tok, acme_hash) = ctxpod_node::auth::new_token("acme-rw").unwrap();
        let peer_file = pki.join("peer-token");
        std::fs::write(&peer_file, format!("{}\n", *peer_tok)).unwrap();
        let client_cert = ca.client(&pki, "engine-7", false);
        TlsPod {
            ca,
            pki,
            ca_file,
            peer_file,
            peer_hash: peer_hash.to_string(),
            peer_tok: peer_tok.to_string(),
            acme_tok: acme_tok.to_string(),
            acme_hash: acme_hash.to_string(),
            client_cert,
        }
    }

    fn how(&self, token: &str) -> Connect {
        Connect {
            token: Some(token.to_string()),
            tls: Some(common::pki::client_tls(&self.ca, Some(&self.client_cert))),
            ..Default::default()
        }
    }

    /// Node `id`'s configuration: pod `tls` through `etcd`, R = 2, 1 s backfill passes.
    fn config(&self, id: &str, etcd: &EtcdServer) -> String {
        let cert = self.ca.node(&self.pki, id);
        format!(
            "[tls]\ncert_file = {:?}\nkey_file = {:?}\nclient_ca_file = {:?}\n\
             [[auth.tokens]]\nid = \"peer\"\nrole = \"admin\"\nhash = \"{}\"\n\
             [[auth.tokens]]\nid = \"acme-rw\"\nrole = \"tenant-rw\"\ntenant = \"acme\"\n\
             hash = \"{}\"\n[[tenants]]\nname = \"acme\"\n\
             [pod]\nname = \"tls\"\nnode_id = \"{id}\"\n{}\
             lease_ttl_s = 3\nreplication = 2\nbackfill_interval_s = 1\n\
             peer_token_file = {:?}\n",
            cert.cert,
            cert.key,
            self.ca_file,
            self.peer_hash,
            self.acme_hash,
            etcd.pod_lines(),
            self.peer_file
        )
    }

    async fn node(&self, dir: &std::path::Path, id: &str, etcd: &EtcdServer) -> Node {
        let n = Node::start_configured(
            &dir.join(id),
            &["--capacity", "256MiB"],
            &self.config(id, etcd),
            self.how(&self.acme_tok),
            true,
        )
        .await;
        assert!(n.url.starts_with("https://"));
        n
    }
}

/// A listener standing for a forged member: counts the connections it is offered and,
/// with `tls` (a certificate from a CA the pod does not trust), the handshakes that
/// complete, and keeps every byte of HTTP it receives.
struct Impostor {
    url: String,
    connections: Arc<std::sync::atomic::AtomicU64>,
    handshakes: Arc<std::sync::atomic::AtomicU64>,
    received: Arc<std::sync::Mutex<Vec<u8>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Impostor {
    async fn start(tls: Option<&common::pki::Files>) -> Impostor {
        use rustls_pki_types::pem::PemObject;
        use std::sync::atomic::Ordering::Relaxed;
        use tokio::io::AsyncReadExt;
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let url = format!("{scheme}://{}", l.local_addr().unwrap());
        let acceptor = tls.map(|f| {
            let certs = rustls_pki_types::CertificateDer::pem_file_iter(&f.cert)
                .unwrap()
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = rustls_pki_types::PrivateKeyDer::from_pem_file(&f.key).unwrap();
            let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
                rustls::crypto::aws_lc_rs::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
            tokio_rustls::TlsAcceptor::from(Arc::new(cfg))
        });
        let connections = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let handshakes = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let received = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (c, h, r) = (connections.clone(), handshakes.clone(), received.clone());
        let task = tokio::spawn(async move {
            while let Ok((sock, _)) = l.accept().await {
                c.fetch_add(1, Relaxed);
                let (acceptor, h, r) = (acceptor.clone(), h.clone(), r.clone());
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 << 10];
                    let read = tokio::time::timeout(Duration::from_secs(5), async {
                        match acceptor {
                            Some(a) => {
                                let Ok(mut s) = a.accept(sock).await else {
                                    return;
                                };
                                h.fetch_add(1, Relaxed);
                                while let Ok(n @ 1..) = s.read(&mut buf).await {
                                    r.lock().unwrap().extend_from_slice(&buf[..n]);
                                }
                            }
                            None => {
                                let mut s = sock;
                                while let Ok(n @ 1..) = s.read(&mut buf).await {
                                    r.lock().unwrap().extend_from_slice(&buf[..n]);
                                }
                            }
                        }
                    });
                    let _ = read.await;
                });
            }
        });
        Impostor {
            url,
            connections,
            handshakes,
            received,
            task,
        }
    }
}

impl Drop for Impostor {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Forged member records in etcd: one naming a plain `http://` URL in a TLS pod, one that
/// claims another node's id, one claiming all the placement, and one naming an `https://`
/// server whose certificate the pod's CA did not sign. The first three never enter any
/// view; the last does, and is tried, but no credential and no request reaches it. Every
/// block put through a node (two copies each, in a tenant's namespace) reads back right
/// through every node and the pod client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_member_records_get_no_credential_and_cause_no_wrong_byte() {
    let tmp = tempfile::tempdir().unwrap();
    let etcd = EtcdServer::start(tmp.path());
    let pod = TlsPod::new(tmp.path());
    let mut nodes = Vec::new();
    for id in ["a", "b", "c"] {
        nodes.push(pod.node(tmp.path(), id, &etcd).await);
    }
    wait_views(&nodes, 3).await;
    let plain = Impostor::start(None).await;
    let evil_ca = common::pki::Ca::new("not the pod's CA");
    let evil_cert = evil_ca.server(&pod.pki, "impostor");
    let tls = Impostor::start(Some(&evil_cert)).await;
    let e = etcd.client();
    let prefix = members_prefix("tls");
    for (k, v) in &forged_records(&plain.url, &tls.url) {
        e.put(&format!("{prefix}{k}"), v.as_bytes(), None)
            .await
            .unwrap();
    }
    // Every view: the three nodes and evil-tls; three records rejected.
    for node in &nodes {
        let admin =
            ctxpod_client::client::Client::connect(node.url.clone(), &pod.how(&pod.peer_tok))
                .unwrap();
        poll(
            Duration::from_secs(10),
            Duration::from_millis(200),
            async || {
                let ids = member_ids(&node.client.cluster().await.unwrap());
                let m = admin.metrics().await.unwrap();
                if ids == ["a", "b", "c", "evil-tls"]
                    && metric_of(&m, "ctxpod_pod_member_records_rejected") == 3.0
                {
                    Ok(())
                } else {
                    Err(format!("{}: view {ids:?}", node.url))
                }
            },
        )
        .await;
    }
    nodes[1].client.create_namespace("kv", None).await.unwrap();
    let pc = PodClient::connect(&[nodes[0].url.clone()], &pod.how(&pod.acme_tok))
        .await
        .unwrap();
    wait_members(&pc, 4).await;
    let keys: Vec<Vec<u8>> = (0..60).map(r2_key).collect();
    let on_evil = keys
        .iter()
        .filter(|k| pc.ranked("kv", k)[..2].contains(&"evil-tls".to_string()))
        .count();
    assert!(
        on_evil >= 10,
        "evil-tls ranks first or second for {on_evil} of 60"
    );
    put_each(&nodes[0].client, "kv", 0..60).await;
    for (i, k) in keys.iter().enumerate() {
        let want = Some(r2_data(i as u64));
        assert_eq!(pc.get("kv", k).await.unwrap(), want, "block {i}");
        for node in &nodes {
            assert_eq!(node.client.get("kv", k).await.unwrap(), want, "block {i}");
        }
    }
    impostors_got_nothing(&plain, &tls, on_evil);
}

/// The forged member records (name under the pod's prefix, JSON): a plain `http://` URL
/// in a TLS pod, another node's id, all the placement, and an `https://` server whose
/// certificate the pod's CA did not sign.
fn forged_records(plain_url: &str, tls_url: &str) -> [(&'static str, String); 4] {
    [
        (
            "evil-plain",
            format!(r#"{{"id":"evil-plain","http":"{plain_url}","capacity":1099511627776}}"#),
        ),
        (
            "zz",
            format!(r#"{{"id":"a","http":"{tls_url}","capacity":1099511627776}}"#),
        ),
        (
            "evil-huge",
            format!(r#"{{"id":"evil-huge","http":"{tls_url}","capacity":18446744073709551615}}"#),
        ),
        (
            "evil-tls",
            format!(r#"{{"id":"evil-tls","http":"{tls_url}","capacity":1099511627776}}"#),
        ),
    ]
}

/// The `http://` impostor was never offered a connection; the `https://` one was, but no
/// handshake with it completed; neither received a byte of HTTP (no credential, no
/// request). `on_evil`: the blocks ranked on the latter, for the log.
fn impostors_got_nothing(plain: &Impostor, tls: &Impostor, on_evil: usize) {
    use std::sync::atomic::Ordering::Relaxed;
    assert_eq!(
        plain.connections.load(Relaxed),
        0,
        "the http:// record was used"
    );
    assert!(
        tls.connections.load(Relaxed) > 0,
        "evil-tls was never tried"
    );
    assert_eq!(
        tls.handshakes.load(Relaxed),
        0,
        "a handshake with evil-tls completed"
    );
    assert!(plain.received.lock().unwrap().is_empty() && tls.received.lock().unwrap().is_empty());
    eprintln!(
        "forged members: 3 records rejected, evil-tls offered {} connections, 0 handshakes, \
         {on_evil} of 60 blocks ranked on it all read back",
        tls.connections.load(Relaxed)
    );
}

/// Draining a node before it leaves: once asked, it ranks last for every block (new
/// blocks land elsewhere), its backfill copies what it holds to the blocks' first members,
/// and when it says `drained` it can be stopped for good without losing a block, although
/// with one copy (R = 1) a third of the blocks were held by it alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_node_leaves_without_losing_a_block() {
    // Passes only when asked (drain) or when the view changes: not on a timer.
    let (_ground, mut nodes, pc) = pod_of_three("dr", "backfill_interval_s = 3600\n").await;
    let keys: Vec<Vec<u8>> = (0..350).map(r2_key).collect();
    for (i, k) in keys[..300].iter().enumerate() {
        put_durable(&pc, k, r2_data(i as u64)).await;
    }
    let only_on_c = held_here(&nodes[2], "default", &keys[..300])
        .await
        .iter()
        .filter(|h| **h)
        .count();
    assert!(only_on_c > 60, "c holds {only_on_c} of 300 blocks");
    assert_eq!(nodes[2].client.drain_status().await.unwrap().state, "up");
    assert_eq!(nodes[2].client.drain().await.unwrap().state, "draining");
    // Every view ranks c last.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        pc.refresh().await.unwrap();
        if keys
            .iter()
            .all(|k| pc.ranked("default", k).last().map(String::as_str) == Some("c"))
        {
            break;
        }
        assert!(Instant::now() < deadline, "c is not ranked last everywhere");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let c = nodes[0].client.cluster().await.unwrap();
    assert_eq!(
        c.members.iter().find(|m| m.id == "c").unwrap().state,
        "draining"
    );
    // New blocks land elsewhere.
    for (i, k) in keys.iter().enumerate().skip(300) {
        put_durable(&pc, k, r2_data(i as u64)).await;
    }
    assert!(held_here(&nodes[2], "default", &keys[300..])
        .await
        .iter()
        .all(|h| !h));
    // Drained within a liveness bound; then c stops for good.
    let deadline = Instant::now() + Duration::from_secs(60);
    let s = loop {
        let s = nodes[2].client.drain_status().await.unwrap();
        if s.state == "drained" {
            break s;
        }
        assert!(Instant::now() < deadline, "not drained after 60 s: {s:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        s.passes >= 1 && s.last_copied_blocks == 0 && s.last_failed == 0,
        "{s:?}"
    );
    nodes[2].kill9();
    // Its lease expires (3 s): the pod is a and b.
    let deadline = Instant::now() + Duration::from_secs(15);
    while pc.members().len() > 2 {
        assert!(Instant::now() < deadline, "c is still a member");
        tokio::time::sleep(Duration::from_millis(200)).await;
        pc.refresh().await.unwrap();
    }
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(
            pc.get("default", k).await.unwrap(),
            Some(r2_data(i as u64)),
            "block {i} after c left"
        );
    }
    eprintln!(
        "drain: c held {only_on_c} blocks alone; drained in {} passes",
        s.passes
    );
}

/// Kills node `i` (of three) and waits (20 s at most) until node 0's view has dropped it.
async fn kill_until_gone(nodes: &mut [Node], i: usize) {
    nodes[i].kill9();
    wait_cluster(
        &nodes[0],
        20,
        200,
        "the killed node's lease did not expire",
        |c| c.members.len() <= 2,
    )
    .await;
}

/// Deletes reach a member that was down: blocks are deleted through one node while one of
/// their two holders is dead; the holder comes back, backfill passes run on every node and
/// the pod client reads every block (read repair). No read, through any node or the pod
/// client, ever returns a deleted block.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_deleted_while_a_holder_is_down_never_reads_back() {
    let n = 40u64;
    let extra = "replication = 2\nbackfill_interval_s = 1\n";
    let (_ground, mut nodes, pc, keys) = pod_holding("del", extra, n).await;
    let on_c = keys
        .iter()
        .filter(|k| pc.ranked("default", k)[..2].contains(&"c".to_string()))
        .count();
    assert!(on_c >= 10, "c holds {on_c} of {n}");
    // c dies and leaves the view (its lease expires); every block is deleted through a.
    kill_until_gone(&mut nodes, 2).await;
    // Half through a plain client of a, half through the pod client (which sends each to
    // a member that records it).
    for (i, k) in keys.iter().enumerate() {
        let held = if i % 2 == 0 {
            nodes[0].client.delete("default", k).await.unwrap()
        } else {
            pc.delete("default", k).await.unwrap()
        };
        assert!(held, "block {i} was held");
    }
    // c comes back; every node runs backfill passes that start after c's return, and the
    // pod client reads each block (a hit on c would be repaired onto the others).
    nodes[2].restart().await;
    wait_views(&nodes, 3).await;
    wait_members(&pc, 3).await;
    let back = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut came_back = 0;
    for round in 0..3 {
        for node in &nodes {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let m = reqwest_text(&format!("{}/metrics", node.url)).await;
                if metric_of(&m, "ctxpod_backfill_last_pass_timestamp_seconds") as u64
                    > back + round
                {
                    break;
                }
                assert!(Instant::now() < deadline, "{}: no backfill pass", node.url);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        for k in &keys {
            came_back += pc.get("default", k).await.unwrap().is_some() as usize;
            for node in &nodes {
                came_back += node.client.get("default", k).await.unwrap().is_some() as usize;
            }
        }
    }
    assert_eq!(
        came_back,
        0,
        "deleted blocks read back {came_back} times (of {} reads)",
        keys.len() * 4 * 3
    );
    // c deleted its copies on return (before it registered), from the tombstones.
    let m = reqwest_text(&format!("{}/metrics", nodes[2].url)).await;
    let applied = metric_of(
        &m,
        "ctxpod_pod_tombstones_applied_total{outcome=\"deleted\"}",
    );
    assert!(
        applied >= on_c as f64,
        "c applied {applied} tombstones to its {on_c} blocks"
    );
    assert_eq!(metric_of(&m, "ctxpod_pod_tombstones"), n as f64);
    // A copy of a deleted block is refused (read repair's put); the client's own put of
    // the key is stored.
    for node in &nodes {
        let e = node
            .client
            .put_copy("default", &keys[0], r2_data(0))
            .await
            .unwrap_err();
        assert_eq!(e.status(), Some(410), "{}: {e}", node.url);
    }
    put_durable(&pc, &keys[0], r2_data(0)).await;
    assert_eq!(pc.get("default", &keys[0]).await.unwrap(), Some(r2_data(0)));
    eprintln!(
        "deletes: {n} deleted with c away ({on_c} held by c), 0 of {} reads came back",
        keys.len() * 4 * 3
    );
}

/// Tombstones expire after `pod.tombstone_retention_s`, and a node away longer than that
/// comes back empty (it cannot know what was deleted meanwhile): a block deleted while it
/// was away does not come back, even with its tombstone gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tombstones_expire_and_a_node_away_longer_comes_back_empty() {
    let n = 20u64;
    let extra = "replication = 2\nbackfill_interval_s = 1\ntombstone_retention_s = 10\n";
    let (ground, mut nodes, pc, keys) = pod_holding("ttl", extra, n).await;
    nodes[0]
        .client
        .create_namespace("gone", None)
        .await
        .unwrap();
    kill_until_gone(&mut nodes, 2).await;
    for k in &keys[..n as usize / 2] {
        pc.delete("default", k).await.unwrap();
    }
    // A namespace deleted while c is away: its record is a tombstone that expires too.
    nodes[0].client.delete_namespace("gone").await.unwrap();
    let ns_deleted_at = Instant::now();
    let e = ground.etcd.client();
    let gone_key = "/ctxpod/ttl/namespaces/gone";
    assert!(
        e.get(gone_key).await.unwrap().is_some(),
        "the deletion is recorded"
    );
    let tombstones = |node: &Node| {
        let url = format!("{}/metrics", node.url);
        async move { metric_of(&reqwest_text(&url).await, "ctxpod_pod_tombstones") }
    };
    assert_eq!(tombstones(&nodes[0]).await, (n / 2) as f64);
    // Gone within the retention and a sixteenth (plus etcd's lease clock).
    let deadline = Instant::now() + Duration::from_secs(25);
    while tombstones(&nodes[0]).await > 0.0 {
        assert!(
            Instant::now() < deadline,
            "tombstones still held 25 s later"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // c has been away longer than the retention: it empties itself, then takes its share
    // of the blocks still in the pod back from backfill.
    nodes[2].restart().await;
    wait_views(&nodes, 3).await;
    wait_members(&pc, 3).await;
    let m = reqwest_text(&format!("{}/metrics", nodes[2].url)).await;
    assert_eq!(metric_of(&m, "ctxpod_pod_emptied_on_return_total"), 1.0);
    // The namespace's record expires on its own lease, which may be a newer one than the
    // blocks' (a tombstone lease serves for a sixteenth of the retention): within the
    // retention and a sixteenth of its delete (plus etcd's lease clock).
    while e.get(gone_key).await.unwrap().is_some() {
        assert!(
            ns_deleted_at.elapsed() < Duration::from_secs(25),
            "the namespace tombstone still held 25 s after the delete"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for node in &nodes {
        let e = node.client.namespace("gone").await.unwrap_err();
        assert_eq!(e.status(), Some(404), "{}: {e}", node.url);
    }
    wait_backfilled(&pc, &nodes[2], "c", &keys[n as usize / 2..]).await;
    for (i, k) in keys.iter().enumerate() {
        let want = (i >= n as usize / 2).then(|| r2_data(i as u64));
        assert_eq!(pc.get("default", k).await.unwrap(), want, "block {i}");
        for node in &nodes {
            assert_eq!(
                node.client.get("default", k).await.unwrap(),
                want,
                "block {i}"
            );
        }
    }
}

/// Runs `call`, which must end within `bound` (its deadlines plus slack for this machine):
/// a liveness bound, so a hang fails the test instead of stalling it. How long it took.
async fn within<T>(
    bound: Duration,
    what: &str,
    call: impl std::future::Future<Output = T>,
) -> (T, Duration) {
    let t0 = Instant::now();
    match tokio::time::timeout(bound, call).await {
        Ok(v) => (v, t0.elapsed()),
        Err(_) => panic!("{what}: still waiting after {bound:?}, past its deadlines"),
    }
}

/// A member frozen (SIGSTOP: it accepts connections and never answers), then killed for
/// good, under clients that were up before: every call ends within its deadlines; the
/// frozen member is counted down at its first missed deadline and asked last afterwards;
/// every R=2 block still reads, over HTTP and CXP1; namespace calls fail over past it; and
/// a client started with the frozen (then the dead) member as its first seed is up within
/// one deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_or_killed_member_costs_one_deadline_not_a_hang() {
    use ctxpod_client::connect::Deadlines;
    use ctxpod_client::transfer_pod::TransferPod;
    // Leases long enough that the frozen member stays in every view meanwhile: what the
    // clients must get past is a member the pod still names.
    let (_ground, mut nodes, _) = pod_of_three("fz", "lease_ttl_s = 60\n").await;
    wait_views(&nodes, 3).await;
    create_replicated(&nodes[1], "r2", 2).await;
    let d = Deadlines {
        connect: Duration::from_secs(1),
        request: Duration::from_secs(2),
        down_for: Duration::from_secs(60),
    };
    let how = Connect {
        deadlines: d,
        ..Default::default()
    };
    // One call's bound: a connect and a request deadline, and slack for a loaded machine.
    let one = d.connect + d.request + Duration::from_secs(3);
    let seeds: Vec<String> = nodes.iter().map(|n| n.url.clone()).collect();
    let pc = PodClient::connect(&seeds, &how).await.unwrap();
    let tp = TransferPod::connect(&seeds, &how).await.unwrap();
    let n = 60u64;
    pod_put_each(&pc, "r2", 0..n).await;
    let keys: Vec<bytes::Bytes> = (0..n).map(|i| r2_key(i).into()).collect();
    // Both clients have used the namespace and every member before the failure.
    assert_eq!(
        tp.exists("r2", &keys).await.unwrap(),
        vec![true; n as usize]
    );

    nodes[0].freeze();
    past_a_frozen_member(&pc, &tp, &keys, one).await;
    // Started with the frozen member as its first seed: up within one deadline.
    let first_frozen = [nodes[0].url.clone(), nodes[1].url.clone()];
    fresh_clients_past_a_frozen_first_seed(&first_frozen, &how, &keys, one).await;

    // Killed for good (still named by the pod for its lease): refused at once.
    nodes[0].kill9();
    for i in 0..n + 20 {
        let (got, _) = within(one, "an HTTP read, a dead", pc.get("r2", &r2_key(i))).await;
        assert_eq!(got.unwrap(), Some(r2_data(i)), "block {i}");
    }
    let (got, _) = within(2 * one, "a CXP1 read, a dead", tp.get("r2", &keys)).await;
    assert!(got.unwrap().into_iter().all(|g| g.unwrap().is_some()));
    let (fresh, _) = within(
        one,
        "connecting with a dead first seed",
        PodClient::connect(&first_frozen, &how),
    )
    .await;
    fresh.unwrap();
}

/// With member a frozen, clients that were up before (`pc` over HTTP, `tp` over CXP1; `keys`
/// the r2 blocks they wrote) each end every call within its bound (`one` a call): `pc`
/// reads every block, counts a down, fails a namespace call over past it and writes 20
/// more blocks; `tp` reads and matches the whole chain and fails a namespace call over.
async fn past_a_frozen_member(
    pc: &PodClient,
    tp: &ctxpod_client::transfer_pod::TransferPod,
    keys: &[bytes::Bytes],
    one: Duration,
) {
    let n = keys.len() as u64;
    let mut slowest = Duration::ZERO;
    for i in 0..n {
        let (got, took) = within(one, "an HTTP read", pc.get("r2", &r2_key(i))).await;
        assert_eq!(got.unwrap(), Some(r2_data(i)), "block {i}");
        slowest = slowest.max(took);
    }
    assert_eq!(pc.down_members(), vec!["a".to_string()]);
    eprintln!("HTTP reads with a frozen: the slowest took {slowest:?}");
    let call = pc.on_any_member(|c| async move { c.namespace("r2").await });
    two_copies_within(one, "a namespace call", call).await;
    // Writes go to the members that answer.
    for i in n..n + 20 {
        let (r, _) = within(one, "an HTTP put", r2_put(pc, "r2", i)).await;
        r.unwrap();
    }
    let (got, took) = within(2 * one, "a CXP1 batch read", tp.get("r2", keys)).await;
    eprintln!("a CXP1 batch read of {n} blocks with a frozen: {took:?}");
    for (i, g) in got.unwrap().into_iter().enumerate() {
        assert_eq!(g.unwrap(), Some(r2_data(i as u64)), "block {i} over CXP1");
    }
    let (held, _) = within(one, "a CXP1 prefix match", tp.match_prefix("r2", keys)).await;
    assert_eq!(held.unwrap(), n as u32, "the whole chain still hits");
    let call = tp.on_any_member(|c| async move { c.namespace("r2").await });
    two_copies_within(one, "a namespace call over the CXP1 pod", call).await;
}

/// A call for namespace `r2`'s settings, which must end within `one` ([`within`]) and say
/// two copies of each block.
async fn two_copies_within<E: std::fmt::Debug>(
    one: Duration,
    what: &str,
    call: impl std::future::Future<Output = Result<NamespaceInfo, E>>,
) {
    let (info, _) = within(one, what, call).await;
    assert_eq!(info.unwrap().replication, Some(2));
}

/// Clients started with the frozen member first among `seeds` are up within one call's
/// bound (`one`): a pod client that sees all three members, and a CXP1 pod whose first
/// calls (a prefix match, which meets the frozen member unwarned, and a batch read of
/// `keys`) hit every block.
async fn fresh_clients_past_a_frozen_first_seed(
    seeds: &[String],
    how: &Connect,
    keys: &[bytes::Bytes],
    one: Duration,
) {
    use ctxpod_client::transfer_pod::TransferPod;
    let (fresh, took) = within(
        one,
        "connecting with a frozen first seed",
        PodClient::connect(seeds, how),
    )
    .await;
    eprintln!("a pod client up with a frozen first seed in {took:?}");
    assert_eq!(fresh.unwrap().members().len(), 3);
    let (fresh, _) = within(
        one,
        "a CXP1 pod with a frozen first seed",
        TransferPod::connect(seeds, how),
    )
    .await;
    let fresh = fresh.unwrap();
    // Its first call a prefix match, which meets the frozen member unwarned.
    let (held, _) = within(
        2 * one,
        "its first prefix match",
        fresh.match_prefix("r2", keys),
    )
    .await;
    assert_eq!(
        held.unwrap(),
        keys.len() as u32,
        "a new client's chain hits too"
    );
    let (got, _) = within(2 * one, "its first batch read", fresh.get("r2", keys)).await;
    assert!(got.unwrap().into_iter().all(|g| g.unwrap().is_some()));
}

/// Scrub on a 3-node pod: copies flipped on one member's drive (while it runs) are found by
/// its scrub pass, quarantined, and stored again from the good copy on another member
/// (R = 2; backfill off, and no client reads meanwhile, so nothing else repairs them);
/// a block whose only copy went bad (R = 1) is counted lost and reads as a miss, never as
/// wrong bytes. After a restart (no DRAM copy left) every repaired block reads back from
/// the member's own flash, byte-exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrub_repairs_a_bad_copy_from_a_good_one_and_counts_the_lost() {
    let extra = "backfill_interval_s = 0\n[scrub]\ninterval_s = 1\nbytes_per_s = \"256MiB\"\n";
    let (_ground, mut nodes, pc) = pod_of_three("sc", extra).await;
    wait_views(&nodes, 3).await;
    create_replicated(&nodes[0], "r2", 2).await;
    let n = 60u64;
    pod_put_each(&pc, "r2", 0..n).await;
    let keys: Vec<Vec<u8>> = (0..n).map(r2_key).collect();
    // Three blocks a holds (with a copy elsewhere), and one only a holds (R = 1).
    let held = held_here(&nodes[0], "r2", &keys).await;
    let bad: Vec<u64> = (0..n).filter(|&i| held[i as usize]).take(3).collect();
    assert_eq!(bad.len(), 3);
    let lone = (1000u64..)
        .find(|&i| pc.ranked("default", &r2_key(i))[0] == "a")
        .unwrap();
    nodes[0]
        .client
        .put(
            "default",
            &r2_key(lone),
            r2_data(lone),
            ctxpod_wire::Durability::Durable,
        )
        .await
        .unwrap();
    flip_on_drive(&nodes[0], &[bad[0], bad[1], bad[2], lone]);
    poll(
        Duration::from_secs(60),
        Duration::from_millis(300),
        async || {
            let m = nodes[0].client.metrics().await.unwrap();
            let (repaired, lost) = (
                metric_of(&m, "ctxpod_scrub_repaired_total"),
                metric_of(&m, "ctxpod_scrub_lost_total"),
            );
            if repaired >= 3.0 && lost >= 1.0 {
                assert_eq!((repaired, lost), (3.0, 1.0), "only the flipped copies");
                assert!(metric_of(&m, "ctxpod_scrub_read_bytes_total") > 0.0);
                assert!(metric_of(&m, "ctxpod_scrub_last_pass_timestamp_seconds") > 0.0);
                return Ok(());
            }
            Err(format!(
                "scrub repaired {repaired} and lost {lost} within 60 s"
            ))
        },
    )
    .await;
    // The others' passes find nothing bad.
    for other in &nodes[1..] {
        scrub_finds_nothing_bad(other).await;
    }
    // From a's own flash, after a restart: every block it held, byte-exact; the lost one a
    // miss.
    nodes[0].kill9();
    nodes[0].restart().await;
    for i in (0..n).filter(|&i| held[i as usize]) {
        let r = routed_get(&nodes[0], "r2", &r2_key(i)).await;
        assert_eq!(r.status(), 200, "block {i} on a");
        assert_eq!(r.bytes().await.unwrap(), r2_data(i), "block {i} on a");
    }
    let r = routed_get(&nodes[0], "default", &r2_key(lone)).await;
    assert_eq!(r.status(), 404, "the lost block is a miss, not wrong bytes");
    for i in 0..n {
        assert_eq!(pc.get("r2", &r2_key(i)).await.unwrap(), Some(r2_data(i)));
    }
}

/// Flips a byte in the data of each of r2 blocks `blocks` on `node`'s drive (it may run
/// meanwhile), synced.
fn flip_on_drive(node: &Node, blocks: &[u64]) {
    let dev = common::open_device(&node.dir);
    let recs = common::records(&dev);
    let hb = ctxpod_format::record::HEADER_BYTES as u64;
    for &i in blocks {
        common::flip(&dev, recs[&r2_key(i)].0 + hb + 100);
    }
    dev.sync_all().unwrap();
}

/// `node`'s scrub passes (one at least, within 30 s) find no bad record and repair nothing.
async fn scrub_finds_nothing_bad(node: &Node) {
    let text = async || node.client.metrics().await.unwrap();
    common::eventually(
        Duration::from_secs(30),
        "a scrub pass on b and c",
        async || {
            let m = text().await;
            metric_of(&m, "ctxpod_scrub_records_total{outcome=\"good\"}") > 0.0
        },
    )
    .await;
    let m = text().await;
    assert_eq!(
        metric_of(&m, "ctxpod_scrub_records_total{outcome=\"bad\"}"),
        0.0
    );
    assert_eq!(metric_of(&m, "ctxpod_scrub_repaired_total"), 0.0);
}

/// `node`'s own copy of `key` in `ns` (asked as routed: no forwarding, no fan-out).
async fn routed_get(node: &Node, ns: &str, key: &[u8]) -> reqwest::Response {
    node.request(
        reqwest::Method::GET,
        &format!("/v1/namespaces/{ns}/blocks/{}", hex::encode(key)),
    )
    .header(ctxpod_wire::HEADER_ROUTED, "test")
    .send()
    .await
    .unwrap()
}

/// Re-replication: R = 2 on three nodes holding 1,000 blocks; c is killed for good and
/// leaves every view when its lease runs out; once it stayed away its grace
/// (`pod.repair_grace_s`, 3 s here), the backfill passes of a and b make every block's two
/// copies again (with two members left, each
/// holds every block: counted from their own listings), while a reader through the pod
/// client never misses and never reads wrong bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_lost_for_good_is_re_replicated_while_reads_never_miss() {
    let n = 1000u64;
    let extra = "replication = 2\nbackfill_interval_s = 600\nrepair_grace_s = 3\n\
                 [scrub]\ninterval_s = 1\nbytes_per_s = \"256MiB\"\n";
    let (_ground, mut nodes, pc, keys) = pod_holding("rr", extra, n).await;
    let before = lacking(&nodes, &keys).await;
    // Two copies of 1,000 blocks over three members: 2,000 held, 1,000 lacking.
    assert_eq!(
        before.iter().map(|l| n as usize - l).sum::<usize>(),
        2 * n as usize
    );
    let pc = Arc::new(pc);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let upto = Arc::new(std::sync::atomic::AtomicU64::new(n));
    let reader = spawn_r2_reader(pc.clone(), stop.clone(), upto);
    let copied_before: f64 = {
        let mut s = 0.0;
        for node in &nodes[..2] {
            s += metric_of(
                &node.client.metrics().await.unwrap(),
                "ctxpod_backfill_copied_bytes_total",
            );
        }
        s
    };
    let t0 = Instant::now();
    kill_until_gone(&mut nodes, 2).await;
    let gone_after = t0.elapsed();
    // a and b wait out c's grace before copying (`pod.repair_grace_s`), and say so.
    let grace = "ctxpod_backfill_grace_until_timestamp_seconds";
    common::eventually(
        Duration::from_secs(10),
        "a waits out c's grace",
        async || metric_of(&nodes[0].client.metrics().await.unwrap(), grace) > 0.0,
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let left = lacking(&nodes[..2], &keys).await;
        if left == [0, 0] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a and b still lack {left:?} of {n} blocks 90 s after c left"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let whole_after = t0.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (reads, failures) = reader.await.unwrap();
    no_read_failed(reads, &failures);
    let mut copied = -copied_before;
    for node in &nodes[..2] {
        copied += metric_of(
            &node.client.metrics().await.unwrap(),
            "ctxpod_backfill_copied_bytes_total",
        );
    }
    let repair_s = (whole_after - gone_after).as_secs_f64();
    eprintln!(
        "re-replication: c gone from the view {gone_after:.1?} after kill -9; 2 copies of \
         all {n} blocks {whole_after:.1?} after it; {copied} bytes copied in {repair_s:.1} s \
         ({:.1} MB/s, settle included); {reads} reads meanwhile, 0 failed",
        copied / repair_s / 1e6
    );
    flip_then_scrub(&nodes[0], &pc, 7).await;
}

/// Flips a byte of block `i`'s copy on `node`'s drive (it runs meanwhile): its scrub pass
/// finds the bad copy and stores it again from the good one on another member; the node's
/// own copy then reads back byte-exact, and so does the block through the pod.
async fn flip_then_scrub(node: &Node, pc: &PodClient, i: u64) {
    let repaired = |m: &str| metric_of(m, "ctxpod_scrub_repaired_total");
    let before = repaired(&node.client.metrics().await.unwrap());
    let t0 = Instant::now();
    flip_on_drive(node, &[i]);
    common::eventually(
        Duration::from_secs(60),
        "scrub repairs the flipped copy",
        async || repaired(&node.client.metrics().await.unwrap()) > before,
    )
    .await;
    eprintln!(
        "scrub: the flipped copy of block {i} repaired {:.1?} after the flip",
        t0.elapsed()
    );
    let r = routed_get(node, "default", &r2_key(i)).await;
    assert_eq!(r.status(), 200, "the repaired copy on {}", node.url);
    assert_eq!(r.bytes().await.unwrap(), r2_data(i), "the repaired copy");
    assert_eq!(
        pc.get("default", &r2_key(i)).await.unwrap(),
        Some(r2_data(i))
    );
}

/// How many of `keys` (in `default`) each node does not hold itself.
async fn lacking(nodes: &[Node], keys: &[Vec<u8>]) -> Vec<usize> {
    let mut out = Vec::new();
    for node in nodes {
        let held = held_here(node, "default", keys).await;
        out.push(held.iter().filter(|h| !**h).count());
    }
    out
}

/// `kill -9` during repair: R = 2 on three nodes holding 1,000 blocks, 59 of them deleted
/// through the pod first (tombstones); c is killed for good, and a and b start copying its
/// blocks again at 512 KiB/s each, so a pass takes seconds; once a has copied some, a is
/// killed with `kill -9` in the middle of its pass and started again. Nothing is lost: the
/// repair completes (a and b each end up holding every live block, counted from their own
/// listings) and every live block reads back byte-exact through the pod client and from each
/// of them; nothing resurrects: no deleted block is on a or b, nor reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_repair_loses_nothing_and_resurrects_nothing() {
    let n = 1000u64;
    let extra = "replication = 2\nbackfill_interval_s = 2\nrepair_grace_s = 1\n\
                 backfill_bytes_per_s = \"1MiB\"\n";
    let (_ground, mut nodes, pc, _) = pod_holding("kr", extra, n).await;
    let deleted: Vec<u64> = (0..n).step_by(17).collect();
    for &i in &deleted {
        assert!(pc.delete("default", &r2_key(i)).await.unwrap(), "block {i}");
    }
    // And 160 blocks of 64 KiB, so that a pass takes seconds at 1 MiB/s.
    let mut live: Vec<(Vec<u8>, bytes::Bytes)> = (0..n)
        .filter(|i| i % 17 != 0)
        .map(|i| (r2_key(i), r2_data(i)))
        .collect();
    for i in 0..160u64 {
        let (k, d) = (r2_key(10_000 + i), common::block(i, 64 << 10));
        put_durable(&pc, &k, d.clone()).await;
        live.push((k, d));
    }
    let live_keys: Vec<Vec<u8>> = live.iter().map(|(k, _)| k.clone()).collect();
    let copied = |m: &str| metric_of(m, "ctxpod_backfill_copied_bytes_total");
    let before = copied(&nodes[0].client.metrics().await.unwrap());
    kill_until_gone(&mut nodes, 2).await;
    common::eventually(
        Duration::from_secs(30),
        "a copies c's blocks again",
        async || copied(&nodes[0].client.metrics().await.unwrap()) > before,
    )
    .await;
    let lacked = lacking(&nodes[..2], &live_keys).await;
    nodes[0].restart().await;
    eprintln!(
        "repair: a killed mid-pass, a and b lacking {lacked:?} of {}",
        live.len()
    );
    assert!(
        lacked.iter().any(|&l| l > 0),
        "the kill came after the repair"
    );
    // `ctxpod repair --wait` returns once a pass on each member, begun after it asked,
    // found nothing to copy: then every block has its two copies.
    let t0 = Instant::now();
    let said = ctxpod_repair_wait(&nodes[1].url).await;
    assert_eq!(
        lacking(&nodes[..2], &live_keys).await,
        [0, 0],
        "after {said}"
    );
    eprintln!(
        "repair: `ctxpod repair --wait` done {:.1?} after the restart: {}",
        t0.elapsed(),
        said.trim().rsplit('\r').next().unwrap_or_default()
    );
    no_deleted_block_held(&nodes[..2], &deleted).await;
    for (k, d) in &live {
        let got = pc.get("default", k).await.unwrap();
        assert_eq!(got.as_ref(), Some(d), "block {}", hex::encode(k));
        for node in &nodes[..2] {
            let r = routed_get(node, "default", k).await;
            assert_eq!(
                r.bytes().await.unwrap(),
                d,
                "{} on {}",
                hex::encode(k),
                node.url
            );
        }
    }
    for &i in &deleted {
        assert_eq!(
            pc.get("default", &r2_key(i)).await.unwrap(),
            None,
            "deleted block {i}"
        );
    }
}

/// Runs `ctxpod repair --wait` (90 s at most) against the node at `addr`, which must
/// succeed and say a pass found nothing to copy; what it said (its stderr).
async fn ctxpod_repair_wait(addr: &str) -> String {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_ctxpod"))
        .args(["repair", "--wait", "--timeout", "90", "--addr", addr])
        .output()
        .await
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "ctxpod repair --wait: {said}");
    assert!(said.contains("found nothing to copy"), "{said}");
    said
}

/// None of blocks `deleted` (r2 keys) is held by any of `nodes` itself.
async fn no_deleted_block_held(nodes: &[Node], deleted: &[u64]) {
    let deleted_keys: Vec<Vec<u8>> = deleted.iter().map(|&i| r2_key(i)).collect();
    for node in nodes {
        let held = held_here(node, "default", &deleted_keys).await;
        assert!(
            !held.contains(&true),
            "a deleted block is back on {}",
            node.url
        );
    }
}
