//! The checks every [`Meta`] passes: etcd's semantics as the pod relies on them. They run
//! against [`super::mem::MemMeta`] in this crate's tests (virtual time) and against a real
//! etcd, TLS and auth on, in the node's (real time: 7 s against a local etcd 3.4, mostly
//! the lease checks' waits).
//!
//! Each check works under its own keys below the prefix given and leaves them there. They
//! count revisions, so nobody else may write to the store meanwhile; and one compacts the
//! store's history (all of it, as compaction in etcd is store-wide).

use super::{compacted, prefix_end, Kv, Meta, Watch, WatchEvent};
use anyhow::{anyhow, bail, ensure, Context};
use futures::StreamExt;
use std::fmt::Debug;
use std::time::Duration;

/// Lets `d` pass on the store's clock (real time for etcd; virtual time for the twin).
pub type Wait<'a> =
    &'a (dyn Fn(std::time::Duration) -> futures::future::BoxFuture<'static, ()> + Sync);

/// How long a watch may take to deliver the events a check waits for.
const WATCH_WAIT: Duration = Duration::from_secs(5);

/// The TTL the lease checks ask for (etcd raises it to its minimum, 2 s by default).
const TTL_S: i64 = 2;

/// How long a lease's keys may take to go once keep-alives stop: the TTL, raised, and
/// etcd's delay to revoke an expired lease.
const EXPIRY_WAIT: Duration = Duration::from_secs(15);

/// How often the expiry check looks.
const POLL: Duration = Duration::from_millis(500);

/// Runs a check; its failure names it.
macro_rules! check {
    ($f:ident($($arg:expr),*)) => {
        $f($($arg),*)
            .await
            .context(concat!("conformance check `", stringify!($f), "`"))?
    };
}

/// Runs every check under keys starting with `prefix` (which must be empty in the store),
/// failing with the name of the first check that does not hold.
pub async fn check_all(meta: &dyn super::Meta, prefix: &str, wait: Wait<'_>) -> anyhow::Result<()> {
    let p = |check: &str| format!("{prefix}{check}/");
    check!(revisions_count_changes(meta, &p("revisions")));
    check!(put_get_delete_round_trip(meta, &p("round-trip")));
    check!(range_is_the_prefix_in_key_order(meta, &p("range")));
    check!(cas_put_compares_revisions(meta, &p("cas")));
    check!(leases_lists_a_granted_lease(meta));
    check!(lease_keys_go_when_keepalives_stop(meta, &p("expiry"), wait));
    check!(keepalives_keep_the_keys(meta, &p("keepalive"), wait));
    check!(revoke_removes_the_keys_at_once(meta, &p("revoke")));
    check!(put_with_a_revoked_lease_fails(meta, &p("revoked-put")));
    check!(watch_replays_then_follows(meta, &p("watch")));
    check!(watch_below_compaction_fails(meta, &p("compaction")));
    Ok(())
}

/// Every change moves the revision on by one; a delete or a compare-and-swap that changes
/// nothing does not; a range answers the revision of the last change.
async fn revisions_count_changes(m: &dyn Meta, p: &str) -> anyhow::Result<()> {
    let (r, kvs) = m.range_prefix(p).await?;
    ensure!(kvs.is_empty(), "{p} holds keys already: {kvs:?}");
    ensure!(r >= 1, "a store's revision starts at 1, not {r}");
    let k = format!("{p}k");
    m.put(&k, b"1", None).await?;
    same(mod_revision(m, &k).await?, r + 1, "a put's mod_revision")?;
    at(m, p, r + 1, "a put").await?;
    m.put(&k, b"2", None).await?;
    at(m, p, r + 2, "a second put").await?;
    m.delete(&k).await?;
    at(m, p, r + 3, "a delete").await?;
    m.delete(&k).await?;
    at(m, p, r + 3, "a delete of a missing key").await?;
    cas(m, &k, b"3", r + 2, false).await?;
    at(m, p, r + 3, "a cas_put that failed").await?;
    cas(m, &k, b"3", 0, true).await?;
    at(m, p, r + 4, "a cas_put that wrote").await
}

/// A put reads back with its value and revision; a second put changes both; a delete
/// removes the key.
async fn put_get_delete_round_trip(m: &dyn Meta, p: &str) -> anyhow::Result<()> {
    let k = format!("{p}k");
    reads(m, &k, None, "a key never written").await?;
    m.put(&k, b"v1", None).await?;
    let r = revision(m, p).await?;
    reads(m, &k, Some(kv(&k, b"v1", r)), "a put").await?;
    m.put(&k, b"v2", None).await?;
    reads(m, &k, Some(kv(&k, b"v2", r + 1)), "a second put").await?;
    m.delete(&k).await?;
    reads(m, &k, None, "a delete").await
}

/// A prefix range holds every key under the prefix (the prefix itself included) in key
/// order, and nothing else: not the prefix's end (its last byte plus one), not the prefix
/// less its last byte, nor a key before it.
async fn range_is_the_prefix_in_key_order(m: &dyn Meta, p: &str) -> anyhow::Result<()> {
    let end = String::from_utf8(prefix_end(p)).context("the prefix's end")?;
    let less = p
        .strip_suffix('/')
        .context("a check's prefix ends with /")?;
    let outside = [
        end.clone(),
        format!("{end}x"),
        less.into(),
        format!("{less}."),
    ];
    let mut under = ["b", "a/x", "", "a"].map(|k| format!("{p}{k}"));
    for k in outside.iter().chain(&under) {
        m.put(k, k.as_bytes(), None).await?;
    }
    let last = mod_revision(m, &under[3]).await?;
    under.sort();
    let (r, kvs) = m.range_prefix(p).await?;
    same(r, last, "the range's revision")?;
    let got: Vec<(&str, &[u8])> = kvs.iter().map(|kv| (&*kv.key, &*kv.value)).collect();
    let want: Vec<(&str, &[u8])> = under.iter().map(|k| (&**k, k.as_bytes())).collect();
    same(got, want, "the keys under the prefix, and their values")
}

/// `cas_put` with 0 creates a key only if it does not exist; otherwise it writes only over
/// the key's mod_revision.
async fn cas_put_compares_revisions(m: &dyn Meta, p: &str) -> anyhow::Result<()> {
    let k = format!("{p}k");
    cas(m, &k, b"v0", 1, false).await?;
    cas(m, &k, b"v1", 0, true).await?;
    cas(m, &k, b"v2", 0, false).await?;
    let r = mod_revision(m, &k).await?;
    cas(m, &k, b"v2", r - 1, false).await?;
    cas(m, &k, b"v2", r + 1, false).await?;
    reads(m, &k, Some(kv(&k, b"v1", r)), "refused cas_puts").await?;
    cas(m, &k, b"v2", r, true).await?;
    reads(m, &k, Some(kv(&k, b"v2", r + 1)), "a cas_put").await?;
    cas(m, &k, b"v3", r, false).await
}

/// A granted lease is listed until it is revoked.
async fn leases_lists_a_granted_lease(m: &dyn Meta) -> anyhow::Result<()> {
    let lease = m.grant(60).await?;
    ensure!(lease > 0, "a lease id is positive, not {lease}");
    ensure!(listed(m, lease).await?, "lease {lease} not listed");
    m.revoke(lease).await?;
    ensure!(!listed(m, lease).await?, "revoked lease {lease} listed");
    Ok(())
}

/// A lease's keys go once keep-alives stop (not before half the TTL asked), and a
/// keep-alive then answers that the lease is gone.
async fn lease_keys_go_when_keepalives_stop(
    m: &dyn Meta,
    p: &str,
    wait: Wait<'_>,
) -> anyhow::Result<()> {
    let lease = m.grant(TTL_S).await?;
    let k = format!("{p}k");
    m.put(&k, b"v", Some(lease)).await?;
    let mut waited = Duration::ZERO;
    while m.get(&k).await?.is_some() {
        ensure!(waited < EXPIRY_WAIT, "still there after {waited:?}");
        wait(POLL).await;
        waited += POLL;
    }
    let half = Duration::from_secs(TTL_S.unsigned_abs()) / 2;
    ensure!(waited >= half, "gone after {waited:?}, TTL {TTL_S} s");
    same(m.keepalive(lease).await?, None, "a keep-alive after expiry")?;
    ensure!(!listed(m, lease).await?, "expired lease {lease} listed");
    Ok(())
}

/// Keep-alives every quarter of the TTL keep a lease's keys across twice the TTL, each
/// answering the TTL.
async fn keepalives_keep_the_keys(m: &dyn Meta, p: &str, wait: Wait<'_>) -> anyhow::Result<()> {
    let lease = m.grant(TTL_S).await?;
    let k = format!("{p}k");
    m.put(&k, b"v", Some(lease)).await?;
    let ttl = m.keepalive(lease).await?.context("a live lease: gone")?;
    ensure!(ttl >= TTL_S, "a TTL of {ttl} s, {TTL_S} s asked");
    let step = Duration::from_secs(u64::try_from(ttl)?) / 4;
    for _ in 0..8 {
        wait(step).await;
        same(m.keepalive(lease).await?, Some(ttl), "a keep-alive")?;
    }
    ensure!(m.get(&k).await?.is_some(), "the key of a kept lease went");
    m.revoke(lease).await
}

/// A revoke removes its lease's keys at once, in one revision that a watch sees as deletes
/// in key order; a key put again without the lease stays; a second revoke fails.
async fn revoke_removes_the_keys_at_once(m: &dyn Meta, p: &str) -> anyhow::Result<()> {
    let lease = m.grant(60).await?;
    let [a, b, c] = ["a", "b", "c"].map(|k| format!("{p}{k}"));
    for k in [&b, &a, &c] {
        m.put(k, b"leased", Some(lease)).await?;
    }
    m.put(&c, b"mine", None).await?;
    let r = revision(m, p).await?;
    let mut w = m.watch_prefix(p, r + 1).await?;
    m.revoke(lease).await?;
    let (after, kvs) = m.range_prefix(p).await?;
    same(after, r + 1, "the revision after the revoke")?;
    same(kvs, vec![kv(&c, b"mine", r)], "the keys left")?;
    let deletes = vec![del(&a, r + 1), del(&b, r + 1)];
    same(next_events(&mut w, 2).await?, deletes, "the events")?;
    ensure!(m.revoke(lease).await.is_err(), "a second revoke succeeded");
    Ok(())
}

/// A put with a revoked lease fails, and writes nothing.
async fn put_with_a_revoked_lease_fails(m: &dyn Meta, p: &str) -> anyhow::Result<()> {
    let lease = m.grant(60).await?;
    m.revoke(lease).await?;
    let k = format!("{p}k");
    ensure!(m.put(&k, b"v", Some(lease)).await.is_err(), "it succeeded");
    reads(m, &k, None, "the put").await
}

/// A watch from an old revision replays the changes under its prefix since then, in
/// revision order, then follows live; one from 0 starts after the current revision.
async fn watch_replays_then_follows(m: &dyn Meta, p: &str) -> anyhow::Result<()> {
    let under = format!("{p}w/");
    let [a, b, c] = ["a", "b", "c"].map(|k| format!("{under}{k}"));
    let outside = format!("{p}outside");
    m.put(&a, b"1", None).await?;
    let r = revision(m, p).await?;
    m.put(&b, b"2", None).await?;
    m.put(&outside, b"x", None).await?;
    m.delete(&a).await?;
    let mut old = m.watch_prefix(&under, r).await?;
    let mut now = m.watch_prefix(&under, 0).await?;
    let replay = vec![put(&a, b"1", r), put(&b, b"2", r + 1), del(&a, r + 3)];
    same(next_events(&mut old, 3).await?, replay, "the replay")?;
    m.put(&outside, b"y", None).await?;
    m.put(&c, b"3", None).await?;
    let live = vec![put(&c, b"3", r + 5)];
    same(next_events(&mut old, 1).await?, live.clone(), "then live")?;
    same(next_events(&mut now, 1).await?, live, "a watch from 0")
}

/// After a compaction to revision `r`, a watch from before `r` fails with
/// [`super::Compacted`] (at once, or as its first item) and one from `r` replays from `r`.
async fn watch_below_compaction_fails(m: &dyn Meta, p: &str) -> anyhow::Result<()> {
    let k = format!("{p}k");
    m.put(&k, b"1", None).await?;
    m.put(&k, b"2", None).await?;
    let r = revision(m, p).await?;
    m.compact(r).await?;
    let refused = match m.watch_prefix(p, r - 1).await {
        Err(e) => e,
        Ok(mut w) => match tokio::time::timeout(WATCH_WAIT, w.next()).await {
            Ok(Some(Err(e))) => e,
            other => bail!("a watch from below the compaction answered {other:?}"),
        },
    };
    same(compacted(&refused), Some(r), "the refusal's revision")?;
    let mut w = m.watch_prefix(p, r).await?;
    let first = vec![put(&k, b"2", r)];
    same(next_events(&mut w, 1).await?, first, "a watch from it")
}

/// The next `n` events of a watch (or more, if the last batch holds more), each batch
/// within [`WATCH_WAIT`].
async fn next_events(w: &mut Watch, n: usize) -> anyhow::Result<Vec<WatchEvent>> {
    let mut got = Vec::new();
    while got.len() < n {
        let batch = tokio::time::timeout(WATCH_WAIT, w.next())
            .await
            .map_err(|_| anyhow!("no event within {WATCH_WAIT:?}, {got:?} before"))?
            .with_context(|| format!("the watch ended, {got:?} before"))??;
        got.extend(batch);
    }
    Ok(got)
}

/// The store's revision (a range's).
async fn revision(m: &dyn Meta, p: &str) -> anyhow::Result<i64> {
    Ok(m.range_prefix(p).await?.0)
}

/// That the store's revision is `want` after `what`.
async fn at(m: &dyn Meta, p: &str, want: i64, what: &str) -> anyhow::Result<()> {
    let what = format!("the revision after {what}");
    same(revision(m, p).await?, want, &what)
}

/// That `key` reads `want` after `what`.
async fn reads(m: &dyn Meta, key: &str, want: Option<Kv>, what: &str) -> anyhow::Result<()> {
    same(m.get(key).await?, want, &format!("{key} after {what}"))
}

/// That `cas_put(key, value, expected)` answers `want`.
async fn cas(
    m: &dyn Meta,
    key: &str,
    value: &[u8],
    expected: i64,
    want: bool,
) -> anyhow::Result<()> {
    let what = format!("cas_put of {key} over revision {expected}");
    same(m.cas_put(key, value, expected).await?, want, &what)
}

async fn mod_revision(m: &dyn Meta, key: &str) -> anyhow::Result<i64> {
    let kv = m
        .get(key)
        .await?
        .with_context(|| format!("{key} missing"))?;
    Ok(kv.mod_revision)
}

async fn listed(m: &dyn Meta, lease: i64) -> anyhow::Result<bool> {
    Ok(m.leases().await?.contains(&lease))
}

fn same<T: PartialEq + Debug>(got: T, want: T, what: &str) -> anyhow::Result<()> {
    ensure!(got == want, "{what}: {got:?}, expected {want:?}");
    Ok(())
}

/// A key's value at a revision (for the twin's tests too).
pub(super) fn kv(key: &str, value: &[u8], mod_revision: i64) -> Kv {
    let (key, value) = (key.to_string(), value.to_vec());
    Kv {
        key,
        value,
        mod_revision,
    }
}

/// A put event.
pub(super) fn put(key: &str, value: &[u8], mod_revision: i64) -> WatchEvent {
    WatchEvent::Put(kv(key, value, mod_revision))
}

/// A delete event.
pub(super) fn del(key: &str, mod_revision: i64) -> WatchEvent {
    let key = key.to_string();
    WatchEvent::Delete { key, mod_revision }
}
