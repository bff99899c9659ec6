//! The pod's coordination store on a real etcd (`ctxpod_pod::meta::etcd::EtcdMeta`), secured
//! as in production (TLS, client certificate, etcd auth): the checks every store passes, a
//! stopped etcd recognised as refused (within a bound), calls working again once it is back
//! (the auth token taken again), and wrong credentials failing clearly.

use crate::common::etcd::{EtcdServer, PodEtcd};
use anyhow::{ensure, Context};
use ctxpod_pod::meta::etcd::EtcdMeta;
use ctxpod_pod::meta::{self, Kv, Meta, WatchEvent};
use futures::future::BoxFuture;
use futures::StreamExt;
use std::time::{Duration, Instant};

/// How the checks wait for time to pass (etcd's leases run on its own clock).
type Wait<'a> = &'a (dyn Fn(Duration) -> BoxFuture<'static, ()> + Sync);

/// Real time, for a real etcd.
fn sleep(d: Duration) -> BoxFuture<'static, ()> {
    Box::pin(tokio::time::sleep(d))
}

/// How long a refused call may take: the connection is refused at once, so well under one
/// call's timeout.
const REFUSED_WITHIN: Duration = Duration::from_secs(3);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_meta_passes_the_store_checks_over_tls_and_auth() {
    let tmp = tempfile::tempdir().unwrap();
    let etcd = EtcdServer::start(tmp.path());
    let meta = etcd.meta();
    let started = Instant::now();
    check_all_until_merged(&meta, "/ctxpod/conformance/", &sleep)
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
        let e = m.get(&key).await.expect_err("etcd is stopped");
        let took = t.elapsed();
        assert!(meta::refused(&e), "{which}: not refused: {e:#}");
        assert!(took < REFUSED_WITHIN, "{which}: refused after {took:?}");
        let t = Instant::now();
        let e = m
            .watch_prefix(prefix, rev + 1)
            .await
            .err()
            .expect("no watch");
        assert!(meta::refused(&e), "{which}: watch not refused: {e:#}");
        assert!(t.elapsed() < REFUSED_WITHIN);
        eprintln!("{which}: refused in {took:?}: {e:#}");
    }

    // One endpoint refusing and one silent (it takes the connection, never answers): not
    // refused by every endpoint, and an error within a call's timeout on each.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut cfg = etcd.pod_config();
    cfg.etcd_endpoints = vec![
        etcd.url.clone(),
        format!("https://{}", silent.local_addr().unwrap()),
    ];
    let two = EtcdMeta::from_config(&cfg).unwrap();
    let t = Instant::now();
    let e = two.get(&key).await.expect_err("no endpoint answers");
    let took = t.elapsed();
    assert!(
        !meta::refused(&e),
        "a silent endpoint is not a refusal: {e:#}"
    );
    assert!(
        took < ctxpod_pod::meta::etcd::CALL_TIMEOUT + REFUSED_WITHIN,
        "took {took:?}"
    );
    let msg = format!("{e:#}");
    assert!(msg.contains(&cfg.etcd_endpoints[1]), "{msg}");
    eprintln!("one refused, one silent: {took:?}: {msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_endpoint_is_passed_over() {
    let tmp = tempfile::tempdir().unwrap();
    let etcd = EtcdServer::start(tmp.path());
    // The first endpoint takes connections and never answers; the second is etcd.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut cfg = etcd.pod_config();
    cfg.etcd_endpoints = vec![
        format!("https://{}", silent.local_addr().unwrap()),
        etcd.url.clone(),
    ];
    let m = EtcdMeta::from_config(&cfg).unwrap();
    let t = Instant::now();
    m.put("/ctxpod/failover/k", b"v", None)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    let first = t.elapsed();
    assert!(first >= ctxpod_pod::meta::etcd::CALL_TIMEOUT, "{first:?}");
    // The next calls go to the endpoint that answered.
    let t = Instant::now();
    let got = m.get("/ctxpod/failover/k").await.unwrap();
    assert_eq!(got.map(|kv| kv.value), Some(b"v".to_vec()));
    let next = t.elapsed();
    assert!(next < Duration::from_secs(1), "{next:?}");
    eprintln!("first call {first:?} (the silent endpoint's timeout), next {next:?}");
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
    let got = meta.get(&key).await.unwrap_or_else(|e| panic!("{e:#}"));
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

/// The store checks, until `ctxpod_pod::meta::conformance::check_all` (same signature,
/// written alongside the in-memory store) is merged: the merge makes this a call to it.
async fn check_all_until_merged(
    meta: &dyn Meta,
    prefix: &str,
    wait: Wait<'_>,
) -> anyhow::Result<()> {
    keys(meta, prefix).await.context("keys")?;
    compare_and_swap(meta, prefix)
        .await
        .context("compare-and-swap")?;
    leases(meta, prefix, wait).await.context("leases")?;
    watches(meta, prefix).await.context("watches")?;
    compaction(meta, prefix).await.context("compaction")?;
    Ok(())
}

/// A key just past every key under `prefix` (its range's end).
fn past(prefix: &str) -> String {
    String::from_utf8(meta::prefix_end(prefix)).expect("an ASCII prefix")
}

async fn keys(meta: &dyn Meta, prefix: &str) -> anyhow::Result<()> {
    let p = format!("{prefix}keys/");
    let (a, b, cd) = (format!("{p}a"), format!("{p}b"), format!("{p}c/d"));
    ensure!(meta.get(&a).await?.is_none(), "a key never put");
    meta.put(&a, b"1", None).await?;
    let first = meta.get(&a).await?.context("a put key")?;
    ensure!(first.value == b"1" && first.key == a, "{first:?}");
    ensure!(first.mod_revision > 0);
    meta.put(&a, b"2", None).await?;
    let second = meta.get(&a).await?.context("a put key")?;
    ensure!(second.value == b"2", "{second:?}");
    ensure!(
        second.mod_revision > first.mod_revision,
        "{second:?} after {first:?}"
    );
    meta.put(&cd, b"", None).await?;
    meta.put(&b, b"3", None).await?;
    meta.put(&past(&p), b"outside", None).await?;
    let (rev, kvs) = meta.range_prefix(&p).await?;
    let listed: Vec<(&str, &[u8])> = kvs
        .iter()
        .map(|kv| (kv.key.as_str(), &kv.value[..]))
        .collect();
    ensure!(
        listed == [(&a[..], &b"2"[..]), (&b[..], b"3"), (&cd[..], b"")],
        "{listed:?}"
    );
    let newest = kvs.iter().map(|kv| kv.mod_revision).max().unwrap_or(0);
    ensure!(rev >= newest, "range revision {rev} before {newest}");
    meta.delete(&a).await?;
    ensure!(meta.get(&a).await?.is_none(), "a deleted key");
    meta.delete(&a).await.context("deleting a missing key")?;
    let (_, kvs) = meta.range_prefix(&p).await?;
    ensure!(kvs.len() == 2, "{kvs:?}");
    for k in [b, cd, past(&p)] {
        meta.delete(&k).await?;
    }
    Ok(())
}

async fn compare_and_swap(meta: &dyn Meta, prefix: &str) -> anyhow::Result<()> {
    let k = format!("{prefix}cas");
    ensure!(meta.cas_put(&k, b"1", 0).await?, "created when absent");
    ensure!(!meta.cas_put(&k, b"x", 0).await?, "not created twice");
    let Kv { mod_revision, .. } = meta.get(&k).await?.context("the key")?;
    ensure!(
        meta.cas_put(&k, b"2", mod_revision).await?,
        "swapped when unchanged"
    );
    ensure!(
        !meta.cas_put(&k, b"3", mod_revision).await?,
        "not swapped when changed"
    );
    let now = meta.get(&k).await?.context("the key")?;
    ensure!(now.value == b"2", "{now:?}");
    meta.delete(&k).await?;
    Ok(())
}

async fn leases(meta: &dyn Meta, prefix: &str, wait: Wait<'_>) -> anyhow::Result<()> {
    let k = format!("{prefix}leased");
    let l = meta.grant(60).await?;
    ensure!(
        meta.leases().await?.contains(&l),
        "a granted lease is listed"
    );
    meta.put(&k, b"v", Some(l)).await?;
    let ttl = meta.keepalive(l).await?.context("a live lease")?;
    ensure!(ttl > 0 && ttl <= 60, "ttl {ttl}");
    meta.revoke(l).await?;
    ensure!(meta.get(&k).await?.is_none(), "a revoked lease's key");
    ensure!(
        meta.keepalive(l).await?.is_none(),
        "a revoked lease renewed"
    );
    ensure!(!meta.leases().await?.contains(&l), "a revoked lease listed");

    // A lease not renewed expires, and its key goes.
    let short = meta.grant(2).await?;
    meta.put(&k, b"v", Some(short)).await?;
    wait(Duration::from_secs(5)).await;
    ensure!(meta.get(&k).await?.is_none(), "an expired lease's key");
    ensure!(
        meta.keepalive(short).await?.is_none(),
        "an expired lease renewed"
    );
    Ok(())
}

/// The next `n` events of a watch (within 10 s).
async fn next_events(w: &mut meta::Watch, n: usize) -> anyhow::Result<Vec<WatchEvent>> {
    let mut out = Vec::new();
    while out.len() < n {
        let batch = tokio::time::timeout(Duration::from_secs(10), w.next())
            .await
            .context("no event within 10 s")?
            .context("the watch ended")??;
        ensure!(!batch.is_empty(), "an empty batch");
        out.extend(batch);
    }
    Ok(out)
}

async fn watches(meta: &dyn Meta, prefix: &str) -> anyhow::Result<()> {
    let p = format!("{prefix}watched/");
    let (w1, w2) = (format!("{p}1"), format!("{p}2"));
    let (rev, _) = meta.range_prefix(&p).await?;
    let mut w = meta.watch_prefix(&p, rev + 1).await?;
    meta.put(&w1, b"x", None).await?;
    meta.put(&past(&p), b"outside", None).await?;
    meta.put(&w2, b"y", None).await?;
    meta.delete(&w1).await?;
    let seen = next_events(&mut w, 3).await?;
    let check = |seen: &[WatchEvent]| -> anyhow::Result<()> {
        match seen {
            [WatchEvent::Put(a), WatchEvent::Put(b), WatchEvent::Delete { key, mod_revision }] => {
                ensure!(a.key == w1 && a.value == b"x", "{seen:?}");
                ensure!(b.key == w2 && b.value == b"y", "{seen:?}");
                ensure!(key == &w1, "{seen:?}");
                ensure!(rev < a.mod_revision && a.mod_revision < b.mod_revision);
                ensure!(b.mod_revision < *mod_revision, "{seen:?}");
                Ok(())
            }
            _ => anyhow::bail!("{seen:?}"),
        }
    };
    check(&seen)?;
    // From the same revision again: the same history.
    let mut again = meta.watch_prefix(&p, rev + 1).await?;
    check(&next_events(&mut again, 3).await?).context("watched again")?;
    for k in [w2, past(&p)] {
        meta.delete(&k).await?;
    }
    Ok(())
}

async fn compaction(meta: &dyn Meta, prefix: &str) -> anyhow::Result<()> {
    let k = format!("{prefix}compacted");
    meta.put(&k, b"1", None).await?;
    let (before, _) = meta.range_prefix(prefix).await?;
    meta.put(&k, b"2", None).await?;
    let (now, _) = meta.range_prefix(prefix).await?;
    meta.compact(now).await?;
    let compacted = match meta.watch_prefix(prefix, before).await {
        Err(e) => e,
        Ok(mut w) => match tokio::time::timeout(Duration::from_secs(10), w.next()).await {
            Ok(Some(Err(e))) => e,
            other => anyhow::bail!("a watch from a compacted revision: {other:?}"),
        },
    };
    ensure!(
        meta::compacted(&compacted) == Some(now),
        "not compacted to {now}: {compacted:#}"
    );
    // From the compaction on, watches work.
    let mut w = meta.watch_prefix(prefix, now + 1).await?;
    meta.put(&k, b"3", None).await?;
    let seen = next_events(&mut w, 1).await?;
    ensure!(
        matches!(&seen[..], [WatchEvent::Put(kv)] if kv.value == b"3"),
        "{seen:?}"
    );
    meta.delete(&k).await?;
    Ok(())
}
