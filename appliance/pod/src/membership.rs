//! Who is in the pod: a single node (the default, nothing to configure), a static list of
//! members (small or test setups), or etcd (each node registers itself under a lease and
//! renews it; everyone watches the member prefix).
//!
//! With etcd, each node's record lives at `/ctxpod/<pod>/members/<id>` as JSON
//! ([`MemberInfo`]), attached to the node's lease. A node that stops renewing (killed, cut
//! off) loses its lease after the TTL, etcd deletes the record, and every watcher drops the
//! node from its view. When etcd cannot be reached the last known view stays in force and
//! [`Membership::etcd_up`] says so (`ctxpod_pod_etcd_up` in the metrics).

use super::meta::{Meta, WatchEvent};
use ctxpod_wire::placement::{Member, Placement};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
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
    /// A member of a test's pod: `id`, at `http://<id>`, 1 GiB, up, no zone.
    #[cfg(test)]
    pub(crate) fn for_test(id: &str) -> MemberInfo {
        MemberInfo {
            id: id.to_string(),
            http: format!("http://{id}"),
            transfer: None,
            capacity: 1 << 30,
            zone: String::new(),
            state: MemberState::Up,
        }
    }

    /// The member as placement ranks it: its weight, and its failure domain (its zone, and
    /// the host of its HTTP URL, as clients derive it from `/v1/cluster`).
    fn placement_member(&self) -> Member {
        Member::new(
            self.id.clone(),
            self.capacity,
            self.state == MemberState::Draining,
        )
        .in_domain(
            self.zone.clone(),
            ctxpod_wire::placement::url_host(&self.http),
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
    /// Member records in etcd left out of the view as invalid.
    rejected: AtomicUsize,
    /// Where the records are read from: etcd, the members' prefix and the pod's scheme.
    records: Option<(Arc<dyn Meta>, String, &'static str)>,
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
            rejected: AtomicUsize::new(0),
            records: None,
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
    /// Records that do not pass [`parse_member`] with `scheme` stay out of the view (and
    /// are counted: [`Membership::rejected_records`]).
    pub async fn watch_etcd(
        etcd: Arc<dyn Meta>,
        pod: &str,
        scheme: &'static str,
        stop: tokio_util::sync::CancellationToken,
    ) -> anyhow::Result<Arc<Membership>> {
        let prefix = members_prefix(pod);
        let (rev, kvs) = etcd.range_prefix(&prefix).await?;
        let records = Records::listed(kvs, scheme);
        let m = Arc::new(Membership {
            source: Source::Etcd,
            view: watch::channel(Arc::new(PodView::new(records.members(), rev))).0,
            etcd_up: AtomicBool::new(false),
            etcd_last_ok: AtomicI64::new(0),
            rejected: AtomicUsize::new(records.rejected()),
            records: Some((etcd.clone(), prefix.clone(), scheme)),
        });
        m.etcd_ok();
        let me = m.clone();
        tokio::spawn(async move {
            tokio::select! {
                biased;
                _ = stop.cancelled() => {}
                _ = me.follow(etcd, prefix, scheme, records, rev) => {}
            }
        });
        Ok(m)
    }

    /// The pod as etcd holds it now (one range read; the view without etcd): at least as
    /// new as anything written to etcd before the call. The view this node follows is not
    /// changed (its watch does that).
    pub async fn current(&self) -> anyhow::Result<Arc<PodView>> {
        let Some((etcd, prefix, scheme)) = &self.records else {
            return Ok(self.view());
        };
        let (rev, kvs) = etcd.range_prefix(prefix).await?;
        self.etcd_ok();
        Ok(Arc::new(PodView::new(
            Records::listed(kvs, scheme).members(),
            rev,
        )))
    }

    /// Member records in etcd that are not taken into the view (they fail
    /// [`parse_member`]), as of the last change.
    pub fn rejected_records(&self) -> usize {
        self.rejected.load(Ordering::Relaxed)
    }

    /// Keeps the view current: watch from `rev + 1`; when the watch breaks, list again.
    async fn follow(
        &self,
        etcd: Arc<dyn Meta>,
        prefix: String,
        scheme: &'static str,
        mut records: Records,
        mut rev: i64,
    ) {
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
                                    records.put(kv, scheme);
                                }
                                WatchEvent::Delete { key, mod_revision } => {
                                    rev = rev.max(mod_revision);
                                    records.0.remove(&key);
                                }
                            }
                        }
                        self.publish(&records, rev);
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
                        records = Records::listed(kvs, scheme);
                        self.publish(&records, rev);
                        break;
                    }
                    Err(e) => self.etcd_failed("list", &e),
                }
            }
        }
    }

    fn publish(&self, records: &Records, rev: i64) {
        self.rejected.store(records.rejected(), Ordering::Relaxed);
        let view = PodView::new(records.members(), rev);
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

/// Every member record under the prefix, by key: checked, or why not.
struct Records(BTreeMap<String, Result<MemberInfo, BadRecord>>);

impl Records {
    fn listed(kvs: Vec<super::meta::Kv>, scheme: &'static str) -> Records {
        let mut r = Records(BTreeMap::new());
        for kv in kvs {
            r.put(kv, scheme);
        }
        r
    }

    /// A record written: it replaces the one under its key (a valid record overwritten by
    /// a bad one leaves the view).
    fn put(&mut self, kv: super::meta::Kv, scheme: &'static str) {
        let parsed = parse_member(&kv.key, &kv.value, scheme);
        if let Err(e) = &parsed {
            tracing::warn!(key = %kv.key, "member record ignored: {e}");
        }
        self.0.insert(kv.key, parsed);
    }

    fn members(&self) -> Vec<MemberInfo> {
        self.0
            .values()
            .filter_map(|r| r.as_ref().ok())
            .cloned()
            .collect()
    }

    fn rejected(&self) -> usize {
        self.0.values().filter(|r| r.is_err()).count()
    }
}

pub fn members_prefix(pod: &str) -> String {
    format!("/ctxpod/{pod}/members/")
}

fn member_key(prefix: &str, id: &str) -> String {
    format!("{prefix}{id}")
}

/// Most capacity a member record may claim (its placement weight): 4 PiB.
pub const MEMBER_CAPACITY_MAX: u64 = 1 << 52;

/// Why a member record in etcd is not taken into the view.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadRecord {
    #[error("not a member record: {0}")]
    Malformed(String),
    #[error("its id {0:?} is not valid, or not the one its key names")]
    Id(String),
    #[error("its URL {0:?} is not a base URL with the pod's scheme ({1}://)")]
    Url(String, &'static str),
    #[error("its transfer address {0:?} is not host:port")]
    Transfer(String),
    #[error("its capacity {0} is 0 or over {MEMBER_CAPACITY_MAX}")]
    Capacity(u64),
    #[error("its zone is over 64 bytes")]
    Zone,
}

/// A member record from etcd, checked: the id valid and the one its key names, the HTTP
/// URL a base URL (no credentials, query or fragment) with the pod's scheme (`https` in a TLS pod: a record naming an
/// `http://` URL would have credentials sent in the clear), a `host:port` transfer
/// address, a capacity within 1..=[`MEMBER_CAPACITY_MAX`] (a record claiming more would
/// take every block's placement).
pub fn parse_member(key: &str, v: &[u8], scheme: &'static str) -> Result<MemberInfo, BadRecord> {
    let m: MemberInfo =
        serde_json::from_slice(v).map_err(|e| BadRecord::Malformed(e.to_string()))?;
    if !ctxpod_format::config::valid_node_id(&m.id) || key.rsplit('/').next() != Some(m.id.as_str())
    {
        return Err(BadRecord::Id(m.id));
    }
    let url_ok = reqwest::Url::parse(&m.http).is_ok_and(|u| {
        u.scheme() == scheme
            && u.host_str().is_some_and(|h| !h.is_empty())
            && u.username().is_empty()
            && u.password().is_none()
            && u.query().is_none()
            && u.fragment().is_none()
    });
    if !url_ok {
        return Err(BadRecord::Url(m.http, scheme));
    }
    if let Some(t) = &m.transfer {
        let ok = t.len() <= 255
            && t.rsplit_once(':').is_some_and(|(host, port)| {
                !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
            });
        if !ok {
            return Err(BadRecord::Transfer(t.clone()));
        }
    }
    if m.capacity == 0 || m.capacity > MEMBER_CAPACITY_MAX {
        return Err(BadRecord::Capacity(m.capacity));
    }
    if m.zone.len() > 64 {
        return Err(BadRecord::Zone);
    }
    Ok(m)
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

/// What catches a member up with the pod's deletes after its record was put (again):
/// called with how long etcd had not answered it; see [`crate::fence`].
pub type CatchUp =
    Arc<dyn Fn(Duration) -> futures::future::BoxFuture<'static, anyhow::Result<()>> + Send + Sync>;

/// A member's fence and how it catches up ([`Registration::register_fenced`]).
#[derive(Clone)]
pub struct Rejoin {
    pub fence: Arc<crate::fence::Fence>,
    pub catch_up: CatchUp,
}

impl Rejoin {
    /// Catches up (the record is put) and opens the fence; how it went.
    async fn catch_up(&self, away: Duration) -> anyhow::Result<()> {
        (self.catch_up)(away).await?;
        self.fence.caught_up();
        Ok(())
    }
}

impl Registration {
    /// Registers `me` under a lease of `ttl` and keeps it registered (no fence: a client,
    /// or a test).
    pub async fn register(
        etcd: Arc<dyn Meta>,
        pod: &str,
        me: MemberInfo,
        ttl: Duration,
        membership: Option<Arc<Membership>>,
    ) -> anyhow::Result<Registration> {
        Self::register_fenced(etcd, pod, me, ttl, membership, None).await
    }

    /// [`Registration::register`] for a member that serves blocks: each answer from etcd
    /// renews its fence, and once its record is put (at first, and again after its lease
    /// was lost) it catches up with the pod's deletes before the fence opens.
    pub async fn register_fenced(
        etcd: Arc<dyn Meta>,
        pod: &str,
        me: MemberInfo,
        ttl: Duration,
        membership: Option<Arc<Membership>>,
        rejoin: Option<Rejoin>,
    ) -> anyhow::Result<Registration> {
        let key = member_key(&members_prefix(pod), &me.id);
        let ttl_s = ttl.as_secs().max(2) as i64;
        let lease_ttl = Duration::from_secs(ttl_s as u64);
        let sent = tokio::time::Instant::now();
        let lease = etcd.grant(ttl_s).await?;
        etcd.put(&key, &serde_json::to_vec(&me)?, Some(lease))
            .await?;
        let mut behind = false;
        if let Some(r) = &rejoin {
            r.fence.renewed(sent, lease_ttl);
            if let Err(e) = r.catch_up(Duration::ZERO).await {
                tracing::warn!(
                    "pod: catching up with the pod's deletes: {e:#}; fenced until it succeeds"
                );
                behind = true;
            }
        }
        let handle = RegistrationHandle {
            me: Arc::new(parking_lot::Mutex::new(me)),
            kick: Arc::new(tokio::sync::Notify::new()),
        };
        let stop = tokio_util::sync::CancellationToken::new();
        let keeper = Keeper {
            etcd,
            key,
            ttl_s,
            me: handle.clone(),
            membership,
            rejoin,
            lease: Some(lease),
            answered: tokio::time::Instant::now(),
            behind,
        };
        let task = tokio::spawn(keeper.run(stop.clone()));
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

/// The task that keeps a registration: renews the lease every third of its TTL, puts the
/// record back (or again, changed), registers again when the lease is lost, and keeps the
/// member's fence (`crate::fence`) with each answer.
struct Keeper {
    etcd: Arc<dyn Meta>,
    key: String,
    ttl_s: i64,
    me: RegistrationHandle,
    membership: Option<Arc<Membership>>,
    rejoin: Option<Rejoin>,
    lease: Option<i64>,
    /// The last answer from etcd.
    answered: tokio::time::Instant,
    /// The deletes must be caught up (the lease was lost, or the last catch-up failed).
    behind: bool,
}

impl Keeper {
    async fn run(mut self, stop: tokio_util::sync::CancellationToken) {
        let every = Duration::from_millis(self.ttl_s as u64 * 1000 / 3);
        // Rounds start every third of the TTL from the previous start, however long a round
        // took (a slow endpoint must not stretch the gap past the fence's margin).
        let mut next = tokio::time::Instant::now() + every;
        loop {
            let kicked = tokio::select! {
                biased;
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep_until(next) => false,
                _ = self.me.kick.notified() => true,
            };
            let sent = tokio::time::Instant::now();
            next = tokio::time::Instant::now() + every;
            match self.renew(kicked).await {
                Ok(l) => self.answered_at(sent, l).await,
                Err(e) => {
                    // etcd down where it runs (every endpoint refused): no lease can expire
                    // meanwhile, so the fence holds (crate::fence).
                    if let Some(r) = self.rejoin.as_ref().filter(|_| super::meta::refused(&e)) {
                        r.fence.refused(sent, self.lease_ttl());
                    }
                    if let Some(m) = &self.membership {
                        m.etcd_failed("lease keep-alive", &e);
                    }
                }
            }
        }
        if let Some(l) = self.lease {
            let _ = self.etcd.revoke(l).await;
        }
    }

    fn lease_ttl(&self) -> Duration {
        Duration::from_secs(self.ttl_s as u64)
    }

    /// One round: the lease kept alive and the record in place (put back if deleted by
    /// hand, put again if `kicked`), or a new lease and the record under it; the lease.
    async fn renew(&mut self, kicked: bool) -> anyhow::Result<i64> {
        let (etcd, key) = (&self.etcd, self.key.as_str());
        let value = serde_json::to_vec(&*self.me.me.lock()).expect("a member record encodes");
        let alive = match self.lease {
            Some(l) => etcd.keepalive(l).await?.map(|_| l),
            None => None,
        };
        if let Some(l) = alive {
            if kicked {
                etcd.put(key, &value, Some(l)).await?;
            } else if etcd.get(key).await?.is_none() {
                etcd.put(key, &value, Some(l)).await?;
                tracing::info!("pod: member record was missing; put it back");
            }
            return Ok(l);
        }
        // The lease is gone: fenced until registered again under a new one and caught up
        // with the deletes made meanwhile.
        if let Some(r) = &self.rejoin {
            r.fence.lease_lost();
        }
        self.behind = true;
        self.lease = None;
        let l = etcd.grant(self.ttl_s).await?;
        etcd.put(key, &value, Some(l)).await?;
        tracing::info!("pod: registered again under a new lease");
        Ok(l)
    }

    /// etcd answered the round sent at `sent`: the fence renewed, and the deletes caught
    /// up if this member is behind.
    async fn answered_at(&mut self, sent: tokio::time::Instant, lease: i64) {
        self.lease = Some(lease);
        let away = sent.saturating_duration_since(self.answered);
        self.answered = tokio::time::Instant::now();
        if let Some(m) = &self.membership {
            m.etcd_ok();
        }
        let Some(r) = &self.rejoin else {
            return;
        };
        r.fence.renewed(sent, self.lease_ttl());
        if !self.behind {
            return;
        }
        match r.catch_up(away).await {
            Ok(()) => {
                self.behind = false;
                tracing::info!("pod: caught up with the pod's deletes; serving again");
            }
            Err(e) => tracing::warn!(
                "pod: catching up with the pod's deletes: {e:#}; fenced until it succeeds"
            ),
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_records_are_checked_before_they_enter_the_view() {
        let rec = |id: &str, http: &str, cap: u64, transfer: Option<&str>| {
            serde_json::to_vec(&MemberInfo {
                id: id.into(),
                http: http.into(),
                transfer: transfer.map(String::from),
                capacity: cap,
                zone: String::new(),
                state: MemberState::Up,
            })
            .unwrap()
        };
        let key = |id: &str| format!("/ctxpod/p/members/{id}");
        let ok = rec("a", "https://10.0.0.1:7400", 1 << 40, Some("10.0.0.1:7401"));
        assert_eq!(parse_member(&key("a"), &ok, "https").unwrap().id, "a");
        // The scheme of the pod, and nothing else.
        let e = parse_member(&key("a"), &ok, "http").unwrap_err();
        assert!(matches!(e, BadRecord::Url(..)), "{e}");
        let plain = rec("a", "http://10.0.0.1:7400", 1 << 40, None);
        assert!(parse_member(&key("a"), &plain, "https").is_err());
        assert!(parse_member(&key("a"), &plain, "http").is_ok());
        let bad = [
            ("a", "b", "https://h:1", 1, None),        // another member's key
            ("a b", "a b", "https://h:1", 1, None),    // a bad id
            ("a", "a", "https://u:p@h:1", 1, None),    // credentials in the URL
            ("a", "a", "https://h:1/?x=1", 1, None),   // a query
            ("a", "a", "https://:1", 1, None),         // no host
            ("a", "a", "not a url", 1, None),          // not a URL
            ("a", "a", "https://h:1", 0, None),        // no capacity
            ("a", "a", "https://h:1", u64::MAX, None), // all the placement
            ("a", "a", "https://h:1", 1, Some("h")),   // no port
            ("a", "a", "https://h:1", 1, Some("h:0")), // port 0
        ];
        for (id, k, http, cap, transfer) in bad {
            let r = rec(id, http, cap, transfer);
            assert!(
                parse_member(&key(k), &r, "https").is_err(),
                "{id} {k} {http} {cap} {transfer:?}"
            );
        }
        assert!(matches!(
            parse_member(&key("a"), b"{", "https"),
            Err(BadRecord::Malformed(_))
        ));
    }
}
