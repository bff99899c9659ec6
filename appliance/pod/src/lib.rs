//! The pod: many flash nodes as one context tier.
//!
//! - [`meta`]: what the pod asks of its coordination store (etcd over gRPC, or an
//!   in-memory twin for the simulation).
//! - [`membership`]: who is in the pod (one node, a static list, or etcd leases and watches)
//!   and the placement over them (`ctxpod_wire::placement`, capacity-weighted rendezvous).
//! - [`coordinator`]: a single-block read, put or delete served for the whole pod, over a
//!   [`coordinator::Member`] (the node's HTTP, or the simulation's network).
//! - [`route`]: where a single-block request is served: here, or the members holding the
//!   block in order (the node forwards it there); the pod-wide MATCH rounds.
//! - [`batch`]: `batch/get`, `batch/put`, `pin` and `unpin` answered for the whole pod.
//! - [`namespaces`]: a namespace created, changed or deleted through any node is so on
//!   every member (fan-out, and records in etcd for those that were away).
//! - [`backfill`]: a throttled background pass copying blocks to the members that should
//!   hold them and do not (after a restart or a join).
//! - [`drain`]: a node leaving on purpose ranks last everywhere and copies its blocks away
//!   first.
//! - [`tombstones`]: block deletes recorded in etcd, so a member that was away deletes its
//!   copy on return, and no copy of a deleted block is written back.
//! - [`fence`]: a member serves its blocks only while it can show it is in the pod (its
//!   lease provably live, the pod's deletes caught up), so no member serves a block after
//!   the pod acknowledged its delete.
//! - [`settle`]: a recorded delete is acknowledged once every member that may hold the
//!   block applied it or dropped out of the pod.
//! - [`quota`]: a namespace's quota held for the whole pod, through a ledger of grants in
//!   etcd (compare-and-swap), never the sum of per-member quotas.
//!
//! [`Pod::join`] is what `ctxpod serve` calls once its listeners are bound.

pub mod backfill;
pub mod batch;
pub mod coordinator;
pub mod drain;
pub mod fence;
pub mod listing;
pub mod membership;
pub mod meta;
pub mod metrics;
pub mod namespaces;
pub mod quota;
pub mod route;
pub mod scrub;
pub mod settle;
pub mod tombstones;

use anyhow::Context;
use membership::{MemberInfo, MemberState, Membership, Registration};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// What a backfill pass did (the backfill makes it, the drain reads it).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PassReport {
    pub scanned: u64,
    pub copied_blocks: u64,
    pub copied_bytes: u64,
    /// Copies that could not be made (member unreachable, or refusing).
    pub failed: u64,
    /// The view changed during the pass: it stopped early.
    pub restarted: bool,
}

/// This node's place in its pod.
pub struct Pod {
    pub me: MemberInfo,
    pub peers: Peers,
    /// Copies of each block (`pod.replication`).
    pub replication: usize,
    pub membership: Arc<Membership>,
    /// The pod's name and etcd, where namespaces are recorded (`None`: no etcd).
    pub records: Option<(String, Arc<dyn meta::Meta>)>,
    registration: Option<Registration>,
    /// Draining this node before it leaves (needs etcd and the backfill).
    pub drain: Arc<drain::Drain>,
    /// The pod's block deletes (with etcd), and the revision to follow them from.
    pub tombstones: Option<(Arc<tombstones::Tombstones>, i64)>,
    /// The pod's series, in the engine's registry.
    pub metrics: Arc<metrics::PodMetrics>,
    /// Whether this member serves its blocks now (with etcd).
    pub fence: Option<Arc<fence::Fence>>,
    stop: tokio_util::sync::CancellationToken,
}

/// The pod's etcd, as its configuration says (endpoints, TLS, client certificate, auth).
pub fn connect_etcd(p: &ctxpod_format::config::PodConfig) -> anyhow::Result<Arc<dyn meta::Meta>> {
    Ok(Arc::new(meta::etcd::EtcdMeta::from_config(p)?))
}

/// The scheme members reach each other with: `https` when the node serves TLS.
fn scheme_of(cfg: &ctxpod_format::config::Config) -> &'static str {
    if cfg.tls.enabled() {
        "https"
    } else {
        "http"
    }
}

/// The node's id: configured, or kept in `<data_dir>/node.id` (made on first start: `n-`
/// and 12 random hex digits).
pub fn node_id(configured: Option<&str>, data_dir: &Path) -> anyhow::Result<String> {
    if let Some(id) = configured {
        return Ok(id.to_string());
    }
    let f = data_dir.join("node.id");
    match std::fs::read_to_string(&f) {
        Ok(s) => {
            let id = s.trim().to_string();
            anyhow::ensure!(
                ctxpod_format::config::valid_node_id(&id),
                "{} holds no valid node id",
                f.display()
            );
            Ok(id)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let id = format!("n-{:012x}", rand::random::<u64>() >> 16);
            let tmp = f.with_extension("tmp");
            std::fs::write(&tmp, format!("{id}\n"))?;
            std::fs::rename(&tmp, &f)?;
            Ok(id)
        }
        Err(e) => Err(e).with_context(|| format!("read {}", f.display())),
    }
}

/// An address others can reach, unless it is a wildcard.
fn reachable(a: SocketAddr) -> Option<SocketAddr> {
    (!a.ip().is_unspecified()).then_some(a)
}

/// This node's member record: the HTTP address it advertises (configured, or its
/// listener's unless that is a wildcard) and the transfer listener's.
fn member_info(
    cfg: &ctxpod_format::config::Config,
    id: &str,
    http: SocketAddr,
    transfer: Option<SocketAddr>,
    scheme: &str,
) -> anyhow::Result<MemberInfo> {
    let p = &cfg.pod;
    let http_url = match (&p.advertise_http, reachable(http)) {
        (Some(u), _) => u.trim_end_matches('/').to_string(),
        (None, Some(a)) => format!("{scheme}://{a}"),
        (None, None) if p.etcd_endpoints.is_empty() => format!("{scheme}://{http}"),
        (None, None) => anyhow::bail!(
            "pod.advertise_http is needed: the HTTP listener {http} is a wildcard address"
        ),
    };
    Ok(MemberInfo {
        id: id.to_string(),
        http: http_url,
        transfer: p
            .advertise_transfer
            .clone()
            .or_else(|| transfer.and_then(reachable).map(|a| a.to_string())),
        capacity: cfg.capacity.0,
        zone: p.zone.clone(),
        state: MemberState::Up,
    })
}

impl Pod {
    /// A member of an etcd pod serves no block until it has joined: its fence, closed, is
    /// installed in the engine before any listener serves (`ctxpod serve` calls this once
    /// the engine is open, and hands the fence to [`Pod::join`]). `None` without etcd.
    pub fn fence_before_join(
        cfg: &ctxpod_format::config::Config,
        engine: &ctxpod_engine::Engine,
    ) -> anyhow::Result<Option<Arc<fence::Fence>>> {
        if cfg.pod.etcd_endpoints.is_empty() {
            return Ok(None);
        }
        Self::install_fence(engine).map(Some)
    }

    /// A closed fence, its series registered, installed as the engine's serve gate.
    fn install_fence(engine: &ctxpod_engine::Engine) -> anyhow::Result<Arc<fence::Fence>> {
        let fence = Arc::new(fence::Fence::new());
        fence.register(&engine.metrics().registry)?;
        engine.set_serve_gate(fence.clone());
        Ok(fence)
    }

    /// Joins the configured pod: registers in etcd and watches it, or takes the static
    /// list, or stands alone.
    pub async fn join(
        cfg: &ctxpod_format::config::Config,
        http: SocketAddr,
        transfer: Option<SocketAddr>,
        engine: &Arc<ctxpod_engine::Engine>,
        fence: Option<Arc<fence::Fence>>,
    ) -> anyhow::Result<Pod> {
        let p = &cfg.pod;
        if !p.etcd_endpoints.is_empty() {
            let meta = connect_etcd(p)?;
            return Self::join_on(cfg, meta, http, transfer, engine, fence).await;
        }
        let (me, peers, pod_metrics, stop) = Self::ground(cfg, http, transfer, engine)?;
        let membership = if p.members.is_empty() {
            Membership::single(me.clone())
        } else {
            Membership::fixed(
                p.members
                    .iter()
                    .map(|m| MemberInfo {
                        id: m.id.clone(),
                        http: m.http.trim_end_matches('/').to_string(),
                        transfer: m.transfer.clone(),
                        capacity: m.capacity.0,
                        zone: m.zone.clone(),
                        state: MemberState::Up,
                    })
                    .collect(),
            )
        };
        Ok(Pod {
            me,
            peers,
            replication: p.replication,
            membership,
            records: None,
            registration: None,
            drain: Arc::new(drain::Drain::new(None)),
            tombstones: None,
            metrics: pod_metrics,
            fence: None,
            stop,
        })
    }

    /// What every member has: its record, its way to the others, its series and the
    /// token that stops its background work.
    #[allow(clippy::type_complexity)]
    fn ground(
        cfg: &ctxpod_format::config::Config,
        http: SocketAddr,
        transfer: Option<SocketAddr>,
        engine: &Arc<ctxpod_engine::Engine>,
    ) -> anyhow::Result<(
        MemberInfo,
        Peers,
        Arc<metrics::PodMetrics>,
        tokio_util::sync::CancellationToken,
    )> {
        let p = &cfg.pod;
        let pod_metrics = Arc::new(metrics::PodMetrics::new(&engine.metrics().registry));
        let id = node_id(p.node_id.as_deref(), &cfg.data_dir)?;
        let me = member_info(cfg, &id, http, transfer, scheme_of(cfg))?;
        let peers = Peers::from_config(cfg)?;
        engine
            .metrics()
            .registry
            .register(Box::new(peers.missed.deadlines_missed.clone()))?;
        Ok((
            me,
            peers,
            pod_metrics,
            tokio_util::sync::CancellationToken::new(),
        ))
    }

    /// [`Pod::join`] through a coordination store (etcd in a node, the in-memory twin in
    /// the simulation): checks this node's own member record, watches the members, applies
    /// the block deletes made while it was away, registers (fenced: see [`fence`]), and
    /// holds namespace quotas for the pod.
    pub async fn join_on(
        cfg: &ctxpod_format::config::Config,
        etcd: Arc<dyn meta::Meta>,
        http: SocketAddr,
        transfer: Option<SocketAddr>,
        engine: &Arc<ctxpod_engine::Engine>,
        fence: Option<Arc<fence::Fence>>,
    ) -> anyhow::Result<Pod> {
        let p = &cfg.pod;
        let scheme = scheme_of(cfg);
        let fence = match fence {
            Some(f) => f,
            None => Self::install_fence(engine)?,
        };
        let (me, peers, pod_metrics, stop) = Self::ground(cfg, http, transfer, engine)?;
        // A join that fails stops what it started (the membership watch, the tombstones').
        let stop_on_failure = stop.clone().drop_guard();
        let id = &me.id;
        let ttl = Duration::from_secs(p.lease_ttl_s);
        // This node's own record must pass the check every member applies.
        membership::parse_member(
            &format!("{}{id}", membership::members_prefix(&p.name)),
            &serde_json::to_vec(&me)?,
            scheme,
        )
        .with_context(|| format!("this node's member record ({})", me.http))?;
        let membership = Membership::watch_etcd(etcd.clone(), &p.name, scheme, stop.clone())
            .await
            .with_context(|| format!("list the pod's members in etcd at {}", etcd.describe()))?;
        // Deletes made while this node was away are applied before it registers, so
        // nothing is routed to it while it still holds a deleted block.
        let tombstones = tombstones::Tombstones::open(
            engine,
            etcd.clone(),
            &p.name,
            p,
            &cfg.data_dir,
            pod_metrics.clone(),
            membership.clone(),
        )
        .await
        .context("apply the pod's block deletes (tombstones in etcd)")?;
        // Reads are fenced (since before the listeners served): served only while this
        // member's lease is provably live and the pod's deletes are caught up since its
        // record was put.
        let catch_up: membership::CatchUp = {
            let (t, engine) = (tombstones.0.clone(), engine.clone());
            Arc::new(move |away| {
                let (t, engine) = (t.clone(), engine.clone());
                Box::pin(async move { t.catch_up(&engine, away).await })
            })
        };
        let registration = Registration::register_fenced(
            etcd.clone(),
            &p.name,
            me.clone(),
            ttl,
            Some(membership.clone()),
            Some(membership::Rejoin {
                fence: fence.clone(),
                catch_up,
            }),
        )
        .await
        .with_context(|| format!("register in etcd at {}", etcd.describe()))?;
        // A namespace's quota holds for the pod: each new block within this member's
        // grant in the ledger.
        engine.set_pod_quota(Arc::new(quota::Ledgers::new(
            etcd.clone(),
            &p.name,
            id,
            membership.clone(),
            p.replication,
            p.tombstone_retention_s,
        )));
        tracing::info!(
            node = %id,
            pod = %p.name,
            members = membership.view().members.len(),
            "joined the pod through etcd"
        );
        stop_on_failure.disarm();
        Ok(Pod {
            me,
            peers,
            replication: p.replication,
            membership,
            records: Some((p.name.clone(), etcd)),
            drain: Arc::new(drain::Drain::new(Some(registration.handle()))),
            registration: Some(registration),
            tombstones: Some(tombstones),
            metrics: pod_metrics,
            fence: Some(fence),
            stop,
        })
    }

    /// The pod as a block request served through this member sees it.
    pub fn coordinator(&self) -> coordinator::Coordinator<'_> {
        coordinator::Coordinator {
            membership: &self.membership,
            me: &self.me.id,
            missed: &self.peers.missed,
            tombstones: self.tombstones.as_ref().map(|(t, _)| &**t),
        }
    }

    /// Starts the pod's background work: applying the pod's namespace records (with etcd),
    /// scrub (`scrub.interval_s`, 0: off; on a node alone too) and the backfill
    /// (`pod.backfill_interval_s`, 0: off). The backfill needs the peer
    /// token when authentication is on; without one it stays off, and says so.
    pub fn start_background(
        &self,
        engine: Arc<ctxpod_engine::Engine>,
        cfg: &ctxpod_format::config::Config,
        auth_enabled: bool,
    ) {
        let over_http = Arc::new(backfill::OverPeers {
            peers: self.peers.clone(),
            me: self.me.id.clone(),
        });
        self.start_background_over(engine, cfg, auth_enabled, over_http)
    }

    /// [`Pod::start_background`] with the backfill asking the members through `copy_to`
    /// (the simulation's network; HTTP in production).
    pub fn start_background_over(
        &self,
        engine: Arc<ctxpod_engine::Engine>,
        cfg: &ctxpod_format::config::Config,
        auth_enabled: bool,
        copy_to: Arc<dyn backfill::CopyTo>,
    ) {
        if let Some((t, rev)) = &self.tombstones {
            t.clone()
                .spawn(engine.clone(), *rev, self.stop.child_token());
        }
        if let Some((pod, etcd)) = &self.records {
            namespaces::spawn_reconcile(
                engine.clone(),
                etcd.clone(),
                pod.clone(),
                self.stop.child_token(),
            );
        }
        if cfg.scrub.interval_s > 0 {
            let repair = !auth_enabled || self.peers.has_token();
            if !repair {
                tracing::warn!(
                    "scrub repairs nothing from other members: authentication is on and \
                     pod.peer_token_file is not set (a bad copy is quarantined; read repair \
                     brings it back when it is read)"
                );
            }
            scrub::Scrub {
                engine: engine.clone(),
                membership: self.membership.clone(),
                peers: self.peers.clone(),
                me: self.me.id.clone(),
                replication: self.replication,
                bytes_per_s: cfg.scrub.bytes_per_s.0,
                tombstones: self.tombstones.as_ref().map(|(t, _)| t.clone()),
                metrics: self.metrics.clone(),
                repair,
            }
            .spawn(
                Duration::from_secs(cfg.scrub.interval_s),
                self.stop.child_token(),
            );
        }
        let p = &cfg.pod;
        if p.backfill_interval_s == 0 || (p.members.is_empty() && self.records.is_none()) {
            self.drain.backfill_off("pod.backfill_interval_s is 0");
            return;
        }
        if auth_enabled && !self.peers.has_token() {
            tracing::warn!(
                "backfill is off: authentication is on and pod.peer_token_file is not set \
                 (read repair still copies the blocks that are read)"
            );
            self.drain
                .backfill_off("authentication is on and pod.peer_token_file is not set");
            return;
        }
        backfill::Backfill {
            engine,
            membership: self.membership.clone(),
            to: copy_to,
            me: self.me.id.clone(),
            replication: self.replication,
            bytes_per_s: p.backfill_bytes_per_s.0,
            drain: self.drain.clone(),
            tombstones: self.tombstones.as_ref().map(|(t, _)| t.clone()),
            metrics: self.metrics.clone(),
            grace: Duration::from_secs(p.repair_grace_s),
        }
        .spawn(
            Duration::from_secs(p.backfill_interval_s),
            self.stop.child_token(),
        );
    }

    /// Leaves the pod: with etcd, the lease is revoked so the others drop this node at once.
    pub async fn leave(mut self) {
        if let Some(r) = self.registration.take() {
            r.leave().await;
        }
        self.stop.cancel();
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Whether an HTTP error is a refused TCP connection (ECONNREFUSED: nothing listens there),
/// as for a member's or etcd's address.
pub fn connection_refused(e: &reqwest::Error) -> bool {
    io_error_in_chain(e, std::io::ErrorKind::ConnectionRefused)
}

/// Whether an error, or one in its source chain, is an `io::Error` of this kind (a refused
/// TCP connection: `ConnectionRefused`). An `io::Error` wrapping another error is looked into
/// as well (its `source` skips the error it wraps).
pub fn io_error_in_chain(e: &(dyn std::error::Error + 'static), kind: std::io::ErrorKind) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        next = e.source();
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if io.kind() == kind {
                return true;
            }
            if let Some(inner) = io.get_ref() {
                next = Some(inner);
            }
        }
    }
    false
}

/// A TLS client configuration from files: trusting `ca` (nothing without one), presenting
/// `identity` (certificate, key) when given. `towards` names the far side in errors.
pub(crate) fn client_tls(
    ca: Option<&Path>,
    identity: Option<(&Path, &Path)>,
    towards: &str,
) -> anyhow::Result<rustls::ClientConfig> {
    let read = |p: &Path| std::fs::read(p).with_context(|| format!("read {}", p.display()));
    let Some(ca) = ca else {
        return Ok(ctxpod_client::connect::untrusting_tls_config());
    };
    let identity = match identity {
        Some((c, k)) => Some((read(c)?, read(k)?)),
        None => None,
    };
    ctxpod_client::connect::tls_client_config(
        &read(ca)?,
        identity.as_ref().map(|(c, k)| (&c[..], &k[..])),
    )
    .with_context(|| format!("TLS towards {towards} (CA {})", ca.display()))
}

/// How this node reaches the other members: one HTTP client (trusting the pod's CA and
/// presenting this node's certificate when TLS is on) and the peer token for the node's own
/// requests (backfill, namespace copies, usage in `/v1/cluster`). Forwarded client
/// requests carry the client's `Authorization` instead.
#[derive(Clone)]
pub struct Peers {
    pub http: reqwest::Client,
    token: Option<Arc<str>>,
    /// Members that missed a forward's deadline lately (asked last by routed requests).
    pub missed: Arc<route::Missed>,
}

impl Peers {
    pub fn from_config(cfg: &ctxpod_format::config::Config) -> anyhow::Result<Peers> {
        let read = |p: &Path| std::fs::read(p).with_context(|| format!("read {}", p.display()));
        let ca = cfg
            .pod
            .peer_ca_file
            .as_ref()
            .or(cfg.tls.client_ca_file.as_ref());
        let tls = client_tls(
            ca.map(PathBuf::as_path),
            cfg.tls
                .cert_file
                .as_deref()
                .zip(cfg.tls.key_file.as_deref()),
            "the pod's members",
        )?;
        let token = match &cfg.pod.peer_token_file {
            Some(f) => {
                let t = String::from_utf8(read(f)?)
                    .with_context(|| format!("{} is not UTF-8", f.display()))?;
                let t = t.trim();
                ctxpod_format::token::parse_token(t.as_bytes()).map_err(|_| {
                    anyhow::anyhow!("{} holds no token (<id>.<64 hex digits>)", f.display())
                })?;
                Some(Arc::from(t))
            }
            None => None,
        };
        Ok(Peers {
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(1))
                // A member given up on (frozen: its socket takes nothing) may still hold a
                // connection with a forward's bytes unsent; the kernel closes it once they
                // have waited this long, zero-window probes included.
                .tcp_user_timeout(6 * route::PEER_DEADLINE)
                // A TLS pod never sends a request (so never a credential) over plain
                // HTTP, whatever URL a member record names.
                .https_only(cfg.tls.enabled())
                .use_preconfigured_tls(tls)
                .build()
                .context("an HTTP client for the pod's members")?,
            token,
            missed: Arc::default(),
        })
    }

    /// The node's own request to a member: marked as routed (served where it lands) and
    /// carrying the peer token when one is configured.
    pub fn own(&self, req: reqwest::RequestBuilder, me: &str) -> reqwest::RequestBuilder {
        let req = req.header(route::HEADER_FORWARDED, me);
        match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    /// A request made for a caller, to a member: the caller's own `Authorization` and
    /// `x-ctxpod-tenant` travel with it; a caller known by its client certificate (which
    /// cannot travel) is stood for by the peer token, in the caller's tenant. The node
    /// has already checked that the caller may do what is asked.
    pub fn for_caller(
        &self,
        mut req: reqwest::RequestBuilder,
        h: &http::HeaderMap,
        caller_tenant: Option<&str>,
    ) -> reqwest::RequestBuilder {
        if let Some(a) = h.get(http::header::AUTHORIZATION) {
            req = req.header(http::header::AUTHORIZATION, a);
            if let Some(t) = h.get(ctxpod_wire::HEADER_TENANT) {
                req = req.header(ctxpod_wire::HEADER_TENANT, t);
            }
            return req;
        }
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        match caller_tenant {
            Some(t) => req.header(ctxpod_wire::HEADER_TENANT, t),
            None => req,
        }
    }

    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }
}
