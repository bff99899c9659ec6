//! Namespaces across the pod: a namespace created, changed or deleted through any node is
//! so on every member.
//!
//! - The node a client asks applies the change itself, then sends it to every other member
//!   at once (marked as routed, with the caller's credentials and the namespace's
//!   *incarnation*). A member that cannot be reached then catches up from etcd.
//! - With etcd, the node first records the namespace under
//!   `/ctxpod/<pod>/namespaces/<name>` ([`NsRecord`]: settings, incarnation, or a tombstone
//!   once deleted, which expires with the block tombstones after
//!   `pod.tombstone_retention_s`: a node away longer than that drops, on return, the
//!   namespaces the pod has no record of). Every node applies the records when it starts and every
//!   [`RECONCILE_EVERY`] after ([`reconcile`]), so a member that was away, or one that joins
//!   later, ends with the same namespaces. The change is refused (503) while etcd cannot
//!   record it.
//! - An incarnation (a random number given when a namespace is created, kept by changes of
//!   its settings) tells a namespace from an earlier one of the same name: a member holding
//!   an older incarnation (the namespace was deleted and created again while it was away)
//!   deletes it, with its blocks and data key, before taking the new one. Deleting `default`
//!   empties it: it comes back at once under a new incarnation.
//! - Without etcd (a static pod), the fan-out is all there is: a member down during a
//!   change is given it by repeating the change (it is idempotent).

use super::meta::Meta;
use ctxpod_engine::{Engine, EngineError, NsSettings};
use ctxpod_wire::types::{Compression, NamespaceClass};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

/// Carries a namespace's incarnation on a change sent from node to node.
pub const HEADER_NS_INCARNATION: &str = "x-ctxpod-ns-incarnation";
/// How often a node applies the pod's namespace records.
pub const RECONCILE_EVERY: Duration = Duration::from_secs(10);

/// A namespace as the pod records it in etcd.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct NsRecord {
    #[serde(default)]
    pub quota_bytes: Option<u64>,
    #[serde(default)]
    pub replication: Option<u32>,
    pub incarnation: u64,
    /// The namespace's class, fixed when it was created (records written before classes:
    /// `kv`).
    #[serde(default, skip_serializing_if = "NamespaceClass::is_kv")]
    pub class: NamespaceClass,
    /// How its blocks are compressed as they move to a member's dense tier (absent: not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<Compression>,
    /// Deleted: members holding this incarnation delete it.
    #[serde(default)]
    pub deleted: bool,
}

impl NsRecord {
    pub fn settings(&self) -> NsSettings {
        NsSettings {
            quota_bytes: self.quota_bytes,
            replication: self.replication,
            incarnation: Some(self.incarnation),
            class: Some(self.class),
            compression: self.compression,
        }
    }
}

pub fn namespaces_prefix(pod: &str) -> String {
    format!("/ctxpod/{pod}/namespaces/")
}

/// A new incarnation (never 0, which means none).
pub fn new_incarnation() -> u64 {
    rand::random::<u64>() | 1
}

/// One namespace change at a time on this node: a change sent by a member and the
/// reconcile's (which reads the record again under it) never interleave, so a record read
/// before a change cannot undo it.
static APPLYING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Applies a namespace's settings under incarnation `inc`: an older incarnation held here
/// is deleted first. Returns whether the namespace was created, and its state.
pub async fn apply(
    engine: &Engine,
    name: &str,
    settings: NsSettings,
) -> Result<(bool, ctxpod_wire::types::NamespaceInfo), EngineError> {
    let _one = APPLYING.lock().await;
    apply_now(engine, name, settings).await
}

async fn apply_now(
    engine: &Engine,
    name: &str,
    settings: NsSettings,
) -> Result<(bool, ctxpod_wire::types::NamespaceInfo), EngineError> {
    if let (Some(Some(held)), Some(inc)) =
        (engine.namespace_incarnation(name), settings.incarnation)
    {
        if held != inc {
            tracing::info!(namespace = name, "an older incarnation is deleted");
            engine.delete_namespace(name).await?;
        }
    }
    engine.create_namespace_with(name, settings).await
}

/// Applies a deletion of incarnation `inc` (any, when `None`): `default` comes back empty,
/// under `renewed` when given.
pub async fn apply_delete(
    engine: &Engine,
    name: &str,
    inc: Option<u64>,
    renewed: Option<u64>,
) -> Result<bool, EngineError> {
    let _one = APPLYING.lock().await;
    apply_delete_now(engine, name, inc, renewed).await
}

async fn apply_delete_now(
    engine: &Engine,
    name: &str,
    inc: Option<u64>,
    renewed: Option<u64>,
) -> Result<bool, EngineError> {
    let held = match engine.namespace_incarnation(name) {
        None => return Ok(false),
        Some(h) => h,
    };
    if inc.is_some() && held.is_some() && held != inc {
        // Already a newer namespace of that name here.
        return Ok(false);
    }
    engine.delete_namespace(name).await?;
    if let (true, Some(r)) = (name == "default", renewed) {
        engine
            .create_namespace_with(
                name,
                NsSettings {
                    incarnation: Some(r),
                    ..NsSettings::default()
                },
            )
            .await?;
    }
    Ok(true)
}

/// The record of namespace `name`, if etcd has one.
pub async fn record(etcd: &dyn Meta, pod: &str, name: &str) -> anyhow::Result<Option<NsRecord>> {
    let key = format!("{}{name}", namespaces_prefix(pod));
    Ok(match etcd.get(&key).await? {
        Some(kv) => serde_json::from_slice(&kv.value).ok(),
        None => None,
    })
}

/// Writes a namespace's record; a deletion's under `lease` (so etcd drops it when the
/// pod's tombstones expire: [`super::tombstones`]).
pub async fn publish(
    etcd: &dyn Meta,
    pod: &str,
    name: &str,
    rec: &NsRecord,
    lease: Option<i64>,
) -> anyhow::Result<()> {
    let key = format!("{}{name}", namespaces_prefix(pod));
    etcd.put(&key, &serde_json::to_vec(rec)?, lease).await
}

/// Applies every namespace record of the pod here; how many changed something. Each
/// record is read again, under [`APPLYING`], just before it is applied.
pub async fn reconcile(engine: &Engine, etcd: &dyn Meta, pod: &str) -> anyhow::Result<usize> {
    let prefix = namespaces_prefix(pod);
    let (_, kvs) = etcd.range_prefix(&prefix).await?;
    let mut changed = 0;
    for kv in kvs {
        let Some(name) = kv.key.strip_prefix(&prefix) else {
            continue;
        };
        if ctxpod_wire::namespace::check_scoped_name(name).is_err() {
            continue;
        }
        let _one = APPLYING.lock().await;
        let rec = match record(etcd, pod, name).await? {
            Some(r) => r,
            None => {
                tracing::warn!(
                    key = name,
                    "a namespace record that does not parse is skipped"
                );
                continue;
            }
        };
        let held = engine.namespace_incarnation(name);
        if rec.deleted {
            if held == Some(Some(rec.incarnation)) {
                apply_delete_now(engine, name, Some(rec.incarnation), None).await?;
                changed += 1;
            }
            continue;
        }
        let same = held == Some(Some(rec.incarnation))
            && engine.namespace(name).is_ok_and(|i| {
                i.quota_bytes == rec.quota_bytes && i.replication == rec.replication
            });
        if !same {
            apply_now(engine, name, rec.settings()).await?;
            changed += 1;
        }
    }
    Ok(changed)
}

/// Applies the records now and every [`RECONCILE_EVERY`], until `stop`.
pub fn spawn_reconcile(
    engine: std::sync::Arc<Engine>,
    etcd: Arc<dyn Meta>,
    pod: String,
    stop: tokio_util::sync::CancellationToken,
) {
    tokio::spawn(async move {
        loop {
            match reconcile(&engine, etcd.as_ref(), &pod).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(changed = n, "namespaces brought in line with the pod"),
                Err(e) => tracing::debug!("namespace records not read: {e:#}"),
            }
            tokio::select! {
                biased;
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(RECONCILE_EVERY) => {}
            }
        }
    });
}
