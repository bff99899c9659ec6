//! `Meta`: what the pod asks of its coordination store — leases with keep-alive and revoke,
//! get / put / delete / prefix range / compare-and-swap, watches from a revision, and
//! compaction. etcd's model, kept to the calls the pod makes.
//!
//! Two implementations with the same semantics:
//! - [`etcd::EtcdMeta`]: the production store, etcd v3 over gRPC (`etcd-client`), with TLS,
//!   client certificates and etcd's auth (made by `crate::connect_etcd`);
//! - [`mem::MemMeta`]: an in-memory twin for the deterministic simulation (revisions,
//!   leases that expire on tokio's clock, watches that compaction breaks).
//!
//! [`conformance`] holds the checks both must pass: the twin runs them in this crate's
//! tests, etcd in the pod suite (`pod::meta::etcd_meta_passes_the_conformance_checks`).
//!
//! Errors are `anyhow` errors; two of them are recognised by the pod: [`Refused`] (every
//! endpoint refused the connection: etcd is not running, as opposed to a silence) and
//! [`Compacted`] (a watch asked for revisions compaction has removed: list again).

pub mod conformance;
pub mod etcd;
pub mod mem;

use futures::stream::BoxStream;

/// One key and its value, from a range or a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kv {
    pub key: String,
    pub value: Vec<u8>,
    /// The revision of the key's last change.
    pub mod_revision: i64,
}

/// A change seen by a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    Put(Kv),
    Delete { key: String, mod_revision: i64 },
}

/// A watch: batches of events in revision order. It ends (with an error, or `None`) when the
/// watch breaks; the caller lists again and watches from there.
pub type Watch = BoxStream<'static, anyhow::Result<Vec<WatchEvent>>>;

/// Every endpoint refused the connection: etcd is not running where it is configured (as
/// opposed to a silence: a cut link, or packets dropped). `crate::fence` counts this as
/// "etcd down for everyone".
#[derive(Debug, thiserror::Error)]
#[error("every etcd endpoint refused the connection")]
pub struct Refused;

/// Whether a failed call to the store was refused by every endpoint ([`Refused`]).
pub fn refused(e: &anyhow::Error) -> bool {
    e.downcast_ref::<Refused>().is_some()
}

/// A watch asked for a revision that compaction removed (the store keeps history from
/// `compacted_to` on).
#[derive(Debug, thiserror::Error)]
#[error("the store's history was compacted to revision {compacted_to}")]
pub struct Compacted {
    pub compacted_to: i64,
}

/// Whether an error is a [`Compacted`] watch.
pub fn compacted(e: &anyhow::Error) -> Option<i64> {
    e.downcast_ref::<Compacted>().map(|c| c.compacted_to)
}

/// The coordination store, as the pod uses it. Every call may fail (the store unreachable,
/// or refusing); none is retried here.
#[async_trait::async_trait]
pub trait Meta: Send + Sync + 'static {
    /// Where the store is, for logs and errors (`https://etcd-0:2379,…`, `memory`).
    fn describe(&self) -> String;

    /// A new lease of `ttl_s` seconds; its id.
    async fn grant(&self, ttl_s: i64) -> anyhow::Result<i64>;

    /// Renews a lease: its remaining TTL in seconds, or `None` when the lease is gone
    /// (expired or revoked).
    async fn keepalive(&self, lease: i64) -> anyhow::Result<Option<i64>>;

    /// Revokes a lease: the keys attached to it go.
    async fn revoke(&self, lease: i64) -> anyhow::Result<()>;

    /// Puts `key = value`, attached to `lease` when given (the key goes when the lease does).
    async fn put(&self, key: &str, value: &[u8], lease: Option<i64>) -> anyhow::Result<()>;

    /// Deletes one key (nothing when it does not exist).
    async fn delete(&self, key: &str) -> anyhow::Result<()>;

    /// One key's value, if it exists.
    async fn get(&self, key: &str) -> anyhow::Result<Option<Kv>>;

    /// Puts `key = value` only if the key is unchanged since it was read: its
    /// `mod_revision` is still `expected` (0: the key must not exist). False when another
    /// writer came first (read again and retry).
    async fn cas_put(&self, key: &str, value: &[u8], expected: i64) -> anyhow::Result<bool>;

    /// Every lease the store holds.
    async fn leases(&self) -> anyhow::Result<Vec<i64>>;

    /// Every key under `prefix` in key order, and the store's revision at that moment (a
    /// watch from the next revision misses nothing).
    async fn range_prefix(&self, prefix: &str) -> anyhow::Result<(i64, Vec<Kv>)>;

    /// Watches every key under `prefix` from `start_revision` on. A revision compaction
    /// removed fails the watch with [`Compacted`] (at once, or as the stream's first item).
    async fn watch_prefix(&self, prefix: &str, start_revision: i64) -> anyhow::Result<Watch>;

    /// Removes the history before `revision` (watches from earlier revisions fail).
    async fn compact(&self, revision: i64) -> anyhow::Result<()>;
}

/// The end of the range holding every key that starts with `prefix` (etcd's convention:
/// the prefix with its last byte incremented).
pub fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0] // every key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends_increment_the_last_byte() {
        assert_eq!(prefix_end("/a/"), b"/a0".to_vec());
        assert_eq!(prefix_end("ab"), b"ac".to_vec());
    }
}
