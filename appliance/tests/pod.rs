//! The pod against a real etcd: registration under leases, watches, lease expiry, and etcd
//! going away and coming back.

mod common;

use common::etcd::EtcdServer;
use common::Node;
use ctxpod::pod::etcd::Etcd;
use ctxpod::pod::membership::{
    members_prefix, MemberInfo, MemberState, Membership, PodView, Registration,
};
use ctxpod_api::connect::Connect;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_join_leave_and_expire_through_etcd_leases() {
    let tmp = tempfile::tempdir().unwrap();
    let mut etcd = EtcdServer::start(tmp.path());
    let client = Etcd::new(vec![etcd.url.clone()]).unwrap();
    let stop = CancellationToken::new();
    let watcher = Membership::watch_etcd(client.clone(), "t", stop.clone())
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
    let client = Etcd::new(vec![_etcd.url.clone()]).unwrap();
    let stop = CancellationToken::new();
    let watcher = Membership::watch_etcd(client.clone(), "t", stop.clone())
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
             etcd_endpoints = [\"{}\"]\nlease_ttl_s = 3\n",
            etcd.url
        )
    };
    let mut nodes = Vec::new();
    for id in ["a", "b", "c"] {
        nodes.push(
            Node::start_configured(
                &tmp.path().join(id),
                &["--capacity", "256MiB"],
                &config(id),
                Connect::default(),
                false,
            )
            .await,
        );
    }
    let ids = |c: &ctxpod_api::types::Cluster| -> Vec<String> {
        c.members.iter().map(|m| m.id.clone()).collect()
    };
    // Every node sees all three, healthy, with their advertised addresses.
    for n in &nodes {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let c = n.client.cluster().await.unwrap();
            if ids(&c) == ["a", "b", "c"] && c.members.iter().all(|m| m.health == "ok") {
                assert_eq!(c.source, "etcd");
                assert!(c.etcd_up);
                assert!(c.revision > 0);
                let me = c.members.iter().find(|m| m.id == c.node_id).unwrap();
                assert_eq!(me.http, n.url);
                assert!(me.used_bytes.is_some());
                assert_eq!(me.zone, format!("z-{}", c.node_id));
                assert_eq!(me.capacity_bytes, 256 << 20);
                break;
            }
            assert!(Instant::now() < deadline, "{}: {c:?}", n.url);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let metric = |text: &str, name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or(f64::NAN)
    };
    let m = nodes[0].client.metrics().await.unwrap();
    assert_eq!(metric(&m, "ctxpod_pod_members"), 3.0);
    assert_eq!(metric(&m, "ctxpod_pod_etcd_up"), 1.0);

    // Any node answers: 300 blocks put through a, one plain HTTP client, land on their
    // placement's first member; every node serves every block.
    let n_blocks = 300u64;
    let key = |i: u64| format!("blk-{i:04}").into_bytes();
    for i in 0..n_blocks {
        let data = common::block(i, 4096);
        let crc = ctxpod_api::crc32c(&data);
        nodes[0]
            .client
            .put_with_crc(
                "default",
                &key(i),
                data,
                crc,
                ctxpod_api::Durability::Durable,
            )
            .await
            .unwrap();
    }
    let mut held = Vec::new();
    for n in &nodes {
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
    for n in &nodes {
        for i in 0..n_blocks {
            let got = n.client.get("default", &key(i)).await.unwrap();
            assert_eq!(got, Some(common::block(i, 4096)), "block {i} via {}", n.url);
        }
    }
    let fwd = metric(
        &nodes[1].client.metrics().await.unwrap(),
        "ctxpod_forwarded_total{outcome=\"read\"}",
    );
    assert!(fwd > 0.0, "b forwarded reads");
    let on_c = held[2];

    // kill -9 c: no revoke; it leaves the others' views when its 3 s lease runs out.
    nodes[2].kill9();
    // Meanwhile c's blocks are misses through a and b (c unreachable, the fallback
    // members do not hold them), never errors; everything else is served.
    let mut misses = 0;
    for i in 0..n_blocks {
        match nodes[0].client.get("default", &key(i)).await.unwrap() {
            Some(b) => assert_eq!(b, common::block(i, 4096)),
            None => misses += 1,
        }
    }
    assert_eq!(misses, on_c, "exactly c's blocks became misses");
    for n in &nodes[..2] {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let c = n.client.cluster().await.unwrap();
            if ids(&c) == ["a", "b"] {
                break;
            }
            assert!(Instant::now() < deadline, "c still listed: {c:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // c comes back (a new port): it registers again and everyone sees its new address.
    nodes[2].restart().await;
    let c_url = nodes[2].url.clone();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let c = nodes[0].client.cluster().await.unwrap();
        if c.members
            .iter()
            .any(|m| m.id == "c" && m.http == c_url && m.health == "ok")
        {
            break;
        }
        assert!(Instant::now() < deadline, "c did not rejoin: {c:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Its blocks (on its own device) are served again, through any node.
    for i in 0..n_blocks {
        let got = nodes[0].client.get("default", &key(i)).await.unwrap();
        assert_eq!(
            got,
            Some(common::block(i, 4096)),
            "block {i} after c's return"
        );
    }

    // etcd down: the nodes keep serving, with the last view, and say etcd is down.
    etcd.kill();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let c = nodes[1].client.cluster().await.unwrap();
        if !c.etcd_up {
            assert_eq!(ids(&c), ["a", "b", "c"], "the last known view stays");
            assert!(c.etcd_last_ok > 0);
            break;
        }
        assert!(Instant::now() < deadline, "etcd down not noticed: {c:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let m = nodes[1].client.metrics().await.unwrap();
    assert_eq!(metric(&m, "ctxpod_pod_etcd_up"), 0.0);
    assert_eq!(metric(&m, "ctxpod_pod_members"), 3.0);
    nodes[1]
        .client
        .put_with_crc(
            "default",
            b"still-serving",
            bytes::Bytes::from_static(b"x"),
            ctxpod_api::crc32c(b"x"),
            ctxpod_api::Durability::Durable,
        )
        .await
        .expect("a put while etcd is down");
    // etcd back: the nodes notice, and the view is whole again.
    etcd.restart();
    for n in &nodes {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let c = n.client.cluster().await.unwrap();
            if c.etcd_up && ids(&c) == ["a", "b", "c"] {
                break;
            }
            assert!(Instant::now() < deadline, "{}: {c:?}", n.url);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // A clean stop revokes the lease: the node leaves at once, not after the TTL.
    nodes[0].stop();
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let c = nodes[1].client.cluster().await.unwrap();
        if ids(&c) == ["b", "c"] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a still listed after a clean stop: {c:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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
}
