//! The pod's coordination store on a real etcd (`ctxpod_pod::meta::etcd::EtcdMeta`), secured
//! as in production (TLS, client certificate, etcd auth): the checks every store passes, a
//! stopped etcd recognised as refused (within a bound), calls working again once it is back
//! (the auth token taken again), and wrong credentials failing clearly.

use crate::common::etcd::{EtcdServer, PodEtcd};
use ctxpod_pod::meta::etcd::EtcdMeta;
use ctxpod_pod::meta::{self, Meta, WatchEvent};
use futures::future::BoxFuture;
use futures::StreamExt;
use std::time::{Duration, Instant};

/// Real time, for a real etcd.
fn sleep(d: Duration) -> BoxFuture<'static, ()> {
    Box::pin(tokio::time::sleep(d))
}

/// A liveness guard, not a speed check: a call that has not ended by then hangs (one call
/// tries each endpoint for at most `CALL_TIMEOUT`).
const NEVER_HANGS: Duration = Duration::from_secs(60);

/// An endpoint that takes TCP connections and never answers, counting the connections made
/// to it (each kept open while the listener lives).
struct Silent {
    url: String,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Silent {
    fn start() -> Self {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("https://{}", l.local_addr().unwrap());
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for c in l.incoming().flatten() {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                held.push(c);
            }
        });
        Silent { url, accepted }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// `f`, which must end (with any answer) well before [`NEVER_HANGS`].
async fn ends<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(NEVER_HANGS, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: still waiting after {NEVER_HANGS:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_meta_passes_the_conformance_checks() {
    let tmp = tempfile::tempdir().unwrap();
    let etcd = EtcdServer::start(tmp.path());
    let meta = etcd.meta();
    let started = Instant::now();
    meta::conformance::check_all(&meta, "/ctxpod/conformance/", &sleep)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    eprintln!("the store checks took {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_etcd_is_refused_within_a_bound() {
    let tmp = tempfile::tempdir().unwrap();
    let mut etcd = EtcdServer::start(tmp.path());
    let meta = etcd.meta();
    let prefix = "/ctxpod/refused/";
    let key = format!("{prefix}k");
    meta.put(&key, b"v", None).await.unwrap();
    let (rev, _) = meta.range_prefix(prefix).await.unwrap();
    let mut watch = meta.watch_prefix(prefix, rev + 1).await.unwrap();

    etcd.kill();
    // The watch ends, with an error.
    let end = tokio::time::timeout(Duration::from_secs(10), watch.next())
        .await
        .expect("the watch ends when etcd stops");
    match end {
        Some(Err(e)) => eprintln!("the watch ended: {e:#}"),
        other => panic!("the watch ended without an error: {other:?}"),
    }

    // A store that was connected, and one made now (made without connecting: it
    // authenticates at its first call).
    let fresh = etcd.meta();
    for (which, m) in [("connected", &meta), ("new", &fresh)] {
        let t = Instant::now();
        let e = ends(which, m.get(&key)).await.expect_err("etcd is stopped");
        let took = t.elapsed();
        assert!(meta::refused(&e), "{which}: not refused: {e:#}");
        let e = ends(which, m.watch_prefix(prefix, rev + 1))
            .await
            .err()
            .expect("no watch");
        assert!(meta::refused(&e), "{which}: watch not refused: {e:#}");
        eprintln!("{which}: refused in {took:?}: {e:#}");
    }

    // One endpoint refusing and one silent (it takes the connection, never answers): not
    // refused by every endpoint, and an error within a call's timeout on each.
    let silent = Silent::start();
    let mut cfg = etcd.pod_config();
    cfg.etcd_endpoints = vec![etcd.url.clone(), silent.url.clone()];
    let two = EtcdMeta::from_config(&cfg).unwrap();
    let t = Instant::now();
    let e = ends("one refused, one silent", two.get(&key))
        .await
        .expect_err("no endpoint answers");
    let took = t.elapsed();
    assert!(
        !meta::refused(&e),
        "a silent endpoint is not a refusal: {e:#}"
    );
    assert!(silent.accepted() >= 1, "the silent endpoint was tried");
    let msg = format!("{e:#}");
    assert!(msg.contains(&cfg.etcd_endpoints[1]), "{msg}");
    eprintln!("one refused, one silent: {took:?}: {msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_endpoint_is_passed_over() {
    let tmp = tempfile::tempdir().unwrap();
    let etcd = EtcdServer::start(tmp.path());
    // The first endpoint takes connections and never answers; the second is etcd.
    let silent = Silent::start();
    let mut cfg = etcd.pod_config();
    cfg.etcd_endpoints = vec![silent.url.clone(), etcd.url.clone()];
    let m = EtcdMeta::from_config(&cfg).unwrap();
    let t = Instant::now();
    ends("the first call", m.put("/ctxpod/failover/k", b"v", None))
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    let first = t.elapsed();
    let tried = silent.accepted();
    assert!(tried >= 1, "the first endpoint was tried first");
    // The next calls go to the endpoint that answered: the silent one is not dialled again.
    let t = Instant::now();
    for _ in 0..3 {
        let got = ends("a next call", m.get("/ctxpod/failover/k"))
            .await
            .unwrap();
        assert_eq!(got.map(|kv| kv.value), Some(b"v".to_vec()));
    }
    assert_eq!(
        silent.accepted(),
        tried,
        "the silent endpoint was dialled again"
    );
    eprintln!(
        "first call {first:?} (the silent endpoint's timeout), next three {:?}",
        t.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_work_again_once_etcd_is_back() {
    let tmp = tempfile::tempdir().unwrap();
    let mut etcd = EtcdServer::start(tmp.path());
    let meta = etcd.meta();
    let prefix = "/ctxpod/back/";
    let key = format!("{prefix}k");
    let lease = meta.grant(60).await.unwrap();
    meta.put(&key, b"1", Some(lease)).await.unwrap();

    etcd.kill();
    let e = meta.get(&key).await.expect_err("etcd is stopped");
    assert!(meta::refused(&e), "{e:#}");
    etcd.restart();

    // etcd forgot the token it gave: the first call takes a new one, and answers.
    let t = Instant::now();
    let got = ends("the first call after the restart", meta.get(&key))
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    eprintln!("the first call after the restart took {:?}", t.elapsed());
    assert_eq!(got.map(|kv| kv.value), Some(b"1".to_vec()));
    assert!(
        meta.keepalive(lease).await.unwrap().is_some(),
        "the lease lives on"
    );

    // A watch right after another restart (etcd refuses a watch with a token it no longer
    // knows): it takes a new token too, and sees the changes.
    let (rev, _) = meta.range_prefix(prefix).await.unwrap();
    etcd.kill();
    etcd.restart();
    let mut watch = meta
        .watch_prefix(prefix, rev + 1)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    meta.put(&key, b"2", None).await.unwrap();
    let batch = tokio::time::timeout(Duration::from_secs(10), watch.next())
        .await
        .expect("the put is seen")
        .expect("the watch goes on")
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(
        matches!(&batch[..], [WatchEvent::Put(kv)] if kv.key == key && kv.value == b"2"),
        "{batch:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_fail_clearly() {
    let tmp = tempfile::tempdir().unwrap();
    let etcd = EtcdServer::start(tmp.path());
    let key = "/ctxpod/credentials/k";
    etcd.meta().put(key, b"v", None).await.unwrap();

    let fails = |cfg: ctxpod_format::config::PodConfig, what: &'static str| async move {
        let m = EtcdMeta::from_config(&cfg).unwrap();
        let t = Instant::now();
        let e = m.get(key).await.expect_err(what);
        let msg = format!("{e:#}");
        assert!(!meta::refused(&e), "{what}: {msg}");
        assert!(msg.contains(&cfg.etcd_endpoints[0]), "{what}: {msg}");
        eprintln!("{what} ({:?}): {msg}", t.elapsed());
        msg
    };

    let mut cfg = etcd.pod_config();
    let wrong = tmp.path().join("wrong.password");
    std::fs::write(&wrong, "not the password\n").unwrap();
    cfg.etcd_password_file = Some(wrong);
    let msg = fails(cfg, "a wrong password").await;
    assert!(msg.contains("authentication failed"), "{msg}");

    let mut cfg = etcd.pod_config();
    cfg.etcd_cert_file = None;
    cfg.etcd_key_file = None;
    let msg = fails(cfg, "no client certificate").await;
    assert!(msg.to_lowercase().contains("certificate"), "{msg}");

    let mut cfg = etcd.pod_config();
    let other = ctxpod_testkit::pki::Ca::new("another CA");
    cfg.etcd_ca_file = Some(other.write(&tmp.path().join("other-ca.crt")));
    let msg = fails(cfg, "another CA").await;
    assert!(msg.to_lowercase().contains("certificate"), "{msg}");

    // A user and no password is a configuration error, at once.
    let mut cfg = etcd.pod_config();
    cfg.etcd_password_file = None;
    assert!(EtcdMeta::from_config(&cfg).is_err());
}
