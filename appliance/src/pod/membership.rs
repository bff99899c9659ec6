//! Who is in the pod: a single node (the default, nothing to configure), a static list of
//! members (small or test setups), or etcd (each node registers itself under a lease and
//! renews it; everyone watches the member prefix).
//!
//! With etcd, each node's record lives at `/ctxpod/<pod>/members/<id>` as JSON
//! ([`MemberInfo`]), attached to the node's lease. A node that stops renewing (killed, cut
//! off) loses its lease after the TTL, etcd deletes the record, and every watcher drops the
//! node from its view. When etcd cannot be reached the last known view stays in force and
//! [`Membership::etcd_up`] says so (`ctxpod_pod_etcd_up` in the metrics).

use super::etcd::{Etcd, WatchEvent};
use ctxpod_api::placement::{Member, Placement};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// One node as the pod sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberInfo {
    /// Stable id (the node id, kept in its data directory).
    pub id: String,
    /// Base URL of its HTTP API (`http://10.0.0.5:8480`).
    pub http: String,
    /// Address of its transfer (CXP1) listener, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transfer: Option<String>,
    /// Bytes of block capacity: its placement weight.
    pub capacity: u64,
    #[serde(default)]
    pub zone: String,
    #[serde(default)]
    pub state: MemberState,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemberState {
    /// Takes reads and writes.
    #[default]
    Up,
    /// Leaving: ranks last for every block (weight 0), still serves what it holds.
    Draining,
}

impl MemberState {
    /// The name `/v1/cluster` and the member records use.
    pub fn as_str(self) -> &'static str {
        match self {
            MemberState::Up => "up",
            MemberState::Draining => "draining",
        }
    }
}

impl MemberInfo {
    fn placement_member(&self) -> Member {
        Member::new(
            self.id.clone(),
            self.capacity,
            self.state == MemberState::Draining,
        )
    }
}

/// A snapshot of the pod: members sorted by id, and the placement over them.
#[derive(Debug, Clone, Default)]
pub struct PodView {
    pub members: Vec<MemberInfo>,
    pub placement: Placement,
    /// etcd's revision this view reflects (0 without etcd).
    pub revision: i64,
}

impl PodView {
    pub fn new(members: impl IntoIterator<Item = MemberInfo>, revision: i64) -> PodView {
        let by_id: BTreeMap<String, MemberInfo> =
            members.into_iter().map(|m| (m.id.clone(), m)).collect();
        let members: Vec<MemberInfo> = by_id.into_values().collect();
        PodView {
            placement: Placement::new(members.iter().map(MemberInfo::placement_member)),
            members,
            revision,
        }
    }

    pub fn member(&self, id: &str) -> Option<&MemberInfo> {
        self.members.iter().find(|m| m.id == id)
    }

    /// The members that hold a block, best first: the `r` replicas, then the rest of the
    /// ranking (where reads fall back).
    pub fn ranked(&self, ns: &str, key: &[u8]) -> Vec<&MemberInfo> {
        // Placement and `members` are both sorted by id, so indices agree.
        self.placement
            .rank(ns, key)
            .into_iter()
            .map(|i| &self.members[i])
            .collect()
    }
}

/// Where the membership comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    Single,
    Static,
    Etcd,
}

impl Source {
    /// The name `/v1/cluster` uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Single => "single",
            Source::Static => "static",
            Source::Etcd => "etcd",
        }
    }
}

/// The live membership: a view that changes, and how fresh it is.
pub struct Membership {
    source: Source,
    view: watch::Sender<Arc<PodView>>,
    etcd_up: AtomicBool,
    /// Unix seconds of the last answer from etcd (0: never).
    etcd_last_ok: AtomicI64,
}

pub(crate) fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

impl Membership {
    fn with(source: Source, view: PodView) -> Arc<Membership> {
        Arc::new(Membership {
            source,
            view: watch::channel(Arc::new(view)).0,
            etcd_up: AtomicBool::new(source != Source::Etcd),
            etcd_last_ok: AtomicI64::new(0),
        })
    }

    /// A pod of one: this node.
    pub fn single(me: MemberInfo) -> Arc<Membership> {
        Self::with(Source::Single, PodView::new([me], 0))
    }

    /// A fixed list of members.
    pub fn fixed(members: Vec<MemberInfo>) -> Arc<Membership> {
        Self::with(Source::Static, PodView::new(members, 0))
    }

    pub fn source(&self) -> Source {
        self.source
    }

    pub fn view(&self) -> Arc<PodView> {
        self.view.borrow().clone()
    }

    /// A receiver that sees every new view.
    pub fn subscribe(&self) -> watch::Receiver<Arc<PodView>> {
        self.view.subscribe()
    }

    /// Whether etcd answered the last call (always true without etcd).
    pub fn etcd_up(&self) -> bool {
        self.etcd_up.load(Ordering::Relaxed)
    }

    /// Unix seconds of etcd's last answer (0: never, or no etcd).
    pub fn etcd_last_ok(&self) -> i64 {
        self.etcd_last_ok.load(Ordering::Relaxed)
    }

    fn etcd_ok(&self) {
        self.etcd_up.store(true, Ordering::Relaxed);
        self.etcd_last_ok.store(unix_now(), Ordering::Relaxed);
    }

    fn etcd_failed(&self, what: &str, e: &anyhow::Error) {
        if self.etcd_up.swap(false, Ordering::Relaxed) {
            tracing::warn!(
                "etcd unreachable ({what}: {e:#}); serving with the last known membership"
            );
        }
    }

    /// Watches the pod's members in etcd (a client, or a node after registering). The
    /// first view is listed before this returns; a task keeps it current until `stop`.
    pub async fn watch_etcd(
        etcd: Etcd,
        pod: &str,
        stop: tokio_util::sync::CancellationToken,
    ) -> anyhow::Result<Arc<Membership>> {
        let prefix = members_prefix(pod);
        let (rev, kvs) = etcd.range_prefix(&prefix).await?;
        let members = kvs
            .iter()
            .filter_map(|kv| parse_member(&kv.value))
            .collect::<Vec<_>>();
        let m = Self::with(Source::Etcd, PodView::new(members, rev));
        m.etcd_ok();
        let me = m.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = me.follow(etcd, prefix, rev) => {}
            }
        });
        Ok(m)
    }

    /// Keeps the view current: watch from `rev + 1`; when the watch breaks, list again.
    async fn follow(&self, etcd: Etcd, prefix: String, mut rev: i64) {
        let mut members: BTreeMap<String, MemberInfo> = self
            .view()
            .members
            .iter()
            .map(|m| (member_key(&prefix, &m.id), m.clone()))
            .collect();
        loop {
            match etcd.watch_prefix(&prefix, rev + 1).await {
                Ok(stream) => {
                    self.etcd_ok();
                    let mut stream = std::pin::pin!(stream);
                    while let Some(batch) = futures::StreamExt::next(&mut stream).await {
                        let events = match batch {
                            Ok(ev) => ev,
                            Err(e) => {
                                self.etcd_failed("watch", &e);
                                break;
                            }
                        };
                        self.etcd_ok();
                        for ev in events {
                            match ev {
                                WatchEvent::Put(kv) => {
                                    rev = rev.max(kv.mod_revision);
                                    if let Some(m) = parse_member(&kv.value) {
                                        members.insert(kv.key, m);
                                    }
                                }
                                WatchEvent::Delete { key, mod_revision } => {
                                    rev = rev.max(mod_revision);
                                    members.remove(&key);
                                }
                            }
                        }
                        self.publish(&members, rev);
                    }
                }
                Err(e) => self.etcd_failed("watch", &e),
            }
            // The watch ended: list again (it may have missed events), then watch on.
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                match etcd.range_prefix(&prefix).await {
                    Ok((r, kvs)) => {
                        self.etcd_ok();
                        rev = r;
                        members = kvs
                            .into_iter()
                            .filter_map(|kv| parse_member(&kv.value).map(|m| (kv.key, m)))
                            .collect();
                        self.publish(&members, rev);
                        break;
                    }
                    Err(e) => self.etcd_failed("list", &e),
                }
            }
        }
    }

    fn publish(&self, members: &BTreeMap<String, MemberInfo>, rev: i64) {
        let view = PodView::new(members.values().cloned(), rev);
        let changed = view.members != self.view.borrow().members;
        self.view.send_modify(|v| *v = Arc::new(view));
        if changed {
            tracing::info!(
                "pod membership: {} members at revision {rev}",
                self.view.borrow().members.len()
            );
        }
    }
}

pub fn members_prefix(pod: &str) -> String {
    format!("/ctxpod/{pod}/members/")
}

fn member_key(prefix: &str, id: &str) -> String {
    format!("{prefix}{id}")
}

fn parse_member(v: &[u8]) -> Option<MemberInfo> {
    match serde_json::from_slice(v) {
        Ok(m) => Some(m),
        Err(e) => {
            tracing::warn!("ignoring a malformed member record: {e}");
            None
        }
    }
}

/// A node's registration in etcd: its record under a lease, renewed every third of the TTL.
/// If the lease is lost (the node was cut off longer than the TTL, or it was revoked) it
/// registers again under a new one; if the record alone was deleted, it is put back. Dropping it (or `leave`) revokes the lease, so the node leaves at once.
pub struct Registration {
    stop: tokio_util::sync::CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
    handle: RegistrationHandle,
}

/// Changes this node's member record while registered (its `state`: draining or up).
#[derive(Clone)]
pub struct RegistrationHandle {
    me: Arc<parking_lot::Mutex<MemberInfo>>,
    /// Puts the record again now.
    kick: Arc<tokio::sync::Notify>,
}

impl RegistrationHandle {
    /// Sets the record's state; it is put again at once under the node's lease.
    pub fn set_state(&self, state: MemberState) {
        self.me.lock().state = state;
        self.kick.notify_one();
    }
}

impl Registration {
    pub async fn register(
        etcd: Etcd,
        pod: &str,
        me: MemberInfo,
        ttl: Duration,
        membership: Option<Arc<Membership>>,
    ) -> anyhow::Result<Registration> {
        let key = member_key(&members_prefix(pod), &me.id);
        let ttl_s = ttl.as_secs().max(2) as i64;
        let lease = etcd.grant(ttl_s).await?;
        etcd.put(&key, &serde_json::to_vec(&me)?, Some(lease))
            .await?;
        let handle = RegistrationHandle {
            me: Arc::new(parking_lot::Mutex::new(me)),
            kick: Arc::new(tokio::sync::Notify::new()),
        };
        let stop = tokio_util::sync::CancellationToken::new();
        let s = stop.clone();
        let h = handle.clone();
        let task = tokio::spawn(async move {
            let mut lease = Some(lease);
            let every = Duration::from_millis(ttl_s as u64 * 1000 / 3);
            loop {
                let kicked = tokio::select! {
                    _ = s.cancelled() => break,
                    _ = tokio::time::sleep(every) => false,
                    _ = h.kick.notified() => true,
                };
                let value = serde_json::to_vec(&*h.me.lock()).expect("a member record encodes");
                let r = match lease {
                    Some(l) => etcd.keepalive(l).await.map(|ttl| ttl.map(|_| l)),
                    None => Ok(None),
                };
                // The lease lives but the record may not (deleted by hand), or has changed
                // (kicked): put it (back).
                let r = match r {
                    Ok(Some(l)) if kicked => etcd.put(&key, &value, Some(l)).await.map(|_| Some(l)),
                    Ok(Some(l)) => match etcd.get(&key).await {
                        Ok(Some(_)) => Ok(Some(l)),
                        Ok(None) => etcd.put(&key, &value, Some(l)).await.map(|_| {
                            tracing::info!("pod: member record was missing; put it back");
                            Some(l)
                        }),
                        Err(e) => Err(e),
                    },
                    other => other,
                };
                let r = match r {
                    Ok(Some(l)) => Ok(l),
                    // The lease is gone: register again under a new one.
                    Ok(None) => match etcd.grant(ttl_s).await {
                        Ok(l) => etcd.put(&key, &value, Some(l)).await.map(|_| {
                            tracing::info!("pod: registered again under a new lease");
                            l
                        }),
                        Err(e) => Err(e),
                    },
                    Err(e) => Err(e),
                };
                match r {
                    Ok(l) => {
                        lease = Some(l);
                        if let Some(m) = &membership {
                            m.etcd_ok();
                        }
                    }
                    Err(e) => {
                        if let Some(m) = &membership {
                            m.etcd_failed("lease keep-alive", &e);
                        }
                    }
                }
            }
            if let Some(l) = lease {
                let _ = etcd.revoke(l).await;
            }
        });
        Ok(Registration {
            stop,
            task: Some(task),
            handle,
        })
    }

    /// A handle that changes the registered record.
    pub fn handle(&self) -> RegistrationHandle {
        self.handle.clone()
    }

    /// Leaves the pod now: the lease is revoked and the record goes with it.
    pub async fn leave(mut self) {
        self.stop.cancel();
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
