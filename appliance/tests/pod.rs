//! The pod against a real etcd: registration under leases, watches, lease expiry, and etcd
//! going away and coming back.

mod common;

use common::etcd::EtcdServer;
use ctxpod::pod::etcd::Etcd;
use ctxpod::pod::membership::{
    members_prefix, MemberInfo, MemberState, Membership, PodView, Registration,
};
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
