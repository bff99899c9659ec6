//! The state every handler shares ([`AppState`]): the engine, the pod, the budgets and
//! limits, and the admission helpers (tenant bytes, egress, ingest) handlers call.

use crate::auth::{Authenticator, Principal};
use axum::http::{HeaderMap, StatusCode};
use ctxpod_engine::Engine;
use ctxpod_pod::batch as pod_batch;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

use crate::errors::{ApiError, ApiResult};

/// Largest JSON body (a `match` of 4096 keys of 128 bytes is about 1 MiB).
pub const JSON_BODY_BYTES_MAX: usize = 2 << 20;
/// Most blocks a `batch/get` answers with data; further present blocks answer 413 in the frame.
pub const BATCH_GET_BYTES_MAX: usize = 64 << 20;
/// Blocks of one batch served concurrently.
pub(crate) const BATCH_CONCURRENCY: usize = 16;

#[derive(Clone)]
pub struct AppState {
    pub engine: Arc<Engine>,
    /// The node's series (the engine's are `engine.metrics()`).
    pub metrics: Arc<crate::metrics::NodeMetrics>,
    pub(crate) limiter: Arc<Semaphore>,
    pub(crate) max_inflight: usize,
    /// The node's byte budgets (request bodies, answers, staging), shared with CXP1.
    pub budgets: crate::budget::Budgets,
    pub auth: Arc<Authenticator>,
    /// The pod this node is in, and its own id there.
    pub pod: Arc<ctxpod_pod::membership::Membership>,
    pub node_id: Arc<str>,
    /// How this node reaches the other members.
    pub peers: ctxpod_pod::Peers,
    /// The pod's name and etcd, where namespaces are recorded (`None`: no etcd).
    pub ns_records: Option<Arc<(String, Arc<dyn ctxpod_pod::meta::Meta>)>>,
    /// Copies of each block in the pod (`pod.replication`).
    pub replication: usize,
    /// This node's drain (`/v1/admin/drain`).
    pub drain: Arc<ctxpod_pod::drain::Drain>,
    /// The pod's block deletes (`None`: no etcd).
    pub tombstones: Option<Arc<ctxpod_pod::tombstones::Tombstones>>,
    /// The pod's series (backfill, scrub), for `/v1/stats`.
    pub pod_metrics: Arc<ctxpod_pod::metrics::PodMetrics>,
}

impl AppState {
    /// The pod as a block request served through this node sees it.
    pub(crate) fn coordinator(&self) -> ctxpod_pod::coordinator::Coordinator<'_> {
        ctxpod_pod::coordinator::Coordinator {
            membership: &self.pod,
            me: &self.node_id,
            missed: &self.peers.missed,
            tombstones: self.tombstones.as_deref(),
        }
    }

    /// A copy ([`ctxpod_wire::HEADER_COPY`]: read repair, backfill) of a block the pod
    /// deleted is refused: 410 `deleted`.
    pub(crate) fn refuse_deleted_copy(&self, h: &HeaderMap, ns: &str, key: &[u8]) -> ApiResult<()> {
        match &self.tombstones {
            Some(t) if h.contains_key(ctxpod_wire::HEADER_COPY) && t.holds(ns, key) => {
                self.metrics.copies_refused.inc();
                Err(ApiError::new(
                    StatusCode::GONE,
                    "deleted",
                    "the pod deleted this block: copies of it are refused",
                ))
            }
            _ => Ok(()),
        }
    }

    /// After a copy ([`ctxpod_wire::HEADER_COPY`]) was stored: refused after all (410
    /// `deleted`, the copy deleted again) if the block's tombstone arrived while it was
    /// being stored ([`ctxpod_pod::tombstones::Tombstones::undo_copy_of_deleted`]).
    pub(crate) async fn undo_deleted_copy(
        &self,
        h: &HeaderMap,
        ns: &str,
        key: &[u8],
    ) -> ApiResult<()> {
        let Some(t) = &self.tombstones else {
            return Ok(());
        };
        if !h.contains_key(ctxpod_wire::HEADER_COPY)
            || !t.undo_copy_of_deleted(&self.engine, ns, key).await
        {
            return Ok(());
        }
        self.refuse_deleted_copy(h, ns, key)
    }

    /// A GET of `path` on the member at `base` for the caller (its credentials, or the
    /// peer token standing in: [`ctxpod_pod::Peers::for_caller`]), marked as sent by this
    /// node.
    pub(crate) fn member_get(
        &self,
        base: &str,
        path: &str,
        timeout: Duration,
        h: &HeaderMap,
        p: &Principal,
    ) -> reqwest::RequestBuilder {
        let req = self
            .peers
            .http
            .get(format!("{base}{path}"))
            .timeout(timeout)
            .header(ctxpod_pod::route::HEADER_FORWARDED, self.node_id.as_ref());
        self.peers.for_caller(req, h, p.tenant.as_deref())
    }

    /// Copies of each block of namespace `scoped` (node-side name): its own setting, else
    /// the pod's.
    pub fn replication_of(&self, scoped: &str) -> usize {
        self.engine
            .namespace_replication(scoped)
            .map_or(self.replication, |r| r as usize)
    }
}

/// Holds a share of the ingest budget until the body is stored (or refused).
pub(crate) type IngestPermit = tokio::sync::OwnedSemaphorePermit;

impl AppState {
    /// Refuses (403 `quota`) a write that would take the caller's tenant over its byte
    /// quota.
    pub(crate) fn check_tenant_bytes(&self, p: &Principal, bytes: usize) -> ApiResult<()> {
        self.auth
            .check_tenant_bytes(&self.engine, p, bytes as u64)
            .map_err(|m| ApiError::new(StatusCode::FORBIDDEN, "quota", m))
    }

    /// Takes `bytes` of the egress budget for a one-block answer to `client` (its share,
    /// waiting for it if need be, and the node's), or answers 503 when it is spent.
    pub(crate) async fn admit_egress(
        &self,
        client: Option<crate::budget::Client>,
        bytes: usize,
    ) -> ApiResult<Vec<crate::budget::Permit>> {
        let taken = self.budgets.egress_for(client).take(bytes).await;
        taken.ok_or_else(|| {
            self.engine
                .metrics()
                .busy_rejections
                .with_label_values(&["egress"])
                .inc();
            ApiError::busy("too many answers waiting for their clients; retry later")
        })
    }

    /// Reserves room for a body of `bytes`, or answers 503 when the ingest budget is spent.
    pub(crate) fn admit_body(&self, bytes: usize) -> ApiResult<IngestPermit> {
        self.budgets.ingest.try_take(bytes).ok_or_else(|| {
            self.engine
                .metrics()
                .busy_rejections
                .with_label_values(&["ingest"])
                .inc();
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "busy",
                "too many request bodies in flight; retry later",
            )
        })
    }
}

impl AppState {
    /// Whether a request here is answered for the whole pod: the node is in a pod of
    /// several and the request was not routed here by a member or a pod-aware client.
    pub(crate) fn answers_for_pod(&self, h: &HeaderMap) -> bool {
        self.pod.view().members.len() >= 2 && !h.contains_key(ctxpod_pod::route::HEADER_FORWARDED)
    }

    /// A per-key question asked of every member a read of each key would try, each member
    /// about its keys at once (`ask(member, key indexes)`, this node included): per key,
    /// whether any member said yes. A member answering `None` said no to all of its keys.
    pub(crate) async fn any_candidate<'m, F, Fut>(
        &self,
        view: &'m ctxpod_pod::membership::PodView,
        ns: &str,
        scoped: &str,
        keys: &[Vec<u8>],
        ask: F,
    ) -> Vec<bool>
    where
        F: Fn(&'m ctxpod_pod::membership::MemberInfo, Vec<usize>) -> Fut,
        Fut: std::future::Future<Output = Option<Vec<bool>>>,
    {
        let copies = self.replication_of(scoped);
        self.coordinator()
            .any_candidate(view, ns, keys, copies, ask)
            .await
    }

    /// Asks members on behalf of the caller `p` of this request.
    pub(crate) fn asker<'a>(
        &'a self,
        ns: &'a str,
        h: &'a HeaderMap,
        p: &'a Principal,
    ) -> pod_batch::Asker<'a> {
        pod_batch::Asker {
            peers: &self.peers,
            me: &self.node_id,
            ns,
            headers: h,
            caller_tenant: p.tenant.as_deref(),
        }
    }

    /// Whether a namespace change made here is the pod's: with etcd, or with other members.
    pub(crate) fn pod_wide(&self) -> bool {
        self.ns_records.is_some() || self.pod.view().members.len() >= 2
    }
}
