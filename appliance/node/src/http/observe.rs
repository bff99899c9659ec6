//! What the node tells about itself: health and readiness, `/metrics`, `/v1/stats`,
//! `/v1/cluster`, the drain, the miss-ratio curve (merged over the pod), KV events (SSE).

use crate::auth::Principal;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use ctxpod_wire::types::*;
use futures::StreamExt;
use std::time::Duration;

use super::input::NsCall;
use super::state::AppState;
use crate::errors::{ApiError, ApiResult};

pub(crate) async fn healthz() -> &'static str {
    "ok\n"
}

pub(crate) async fn readyz(State(st): State<AppState>) -> Response {
    if st.engine.ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the device failed\n",
        )
            .into_response()
    }
}

pub(crate) async fn metrics(State(st): State<AppState>) -> Response {
    pod_gauges(&st);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], {
        st.engine.publish_gauges();
        crate::metrics::render(&st.engine.metrics().registry)
    })
        .into_response()
}

pub(crate) fn pod_gauges(st: &AppState) {
    st.budgets.publish();
    let m = &st.metrics;
    m.pod_members.set(st.pod.view().members.len() as i64);
    m.pod_etcd_up.set(st.pod.etcd_up() as i64);
    m.pod_etcd_last_ok.set(st.pod.etcd_last_ok());
    m.pod_member_records_rejected
        .set(st.pod.rejected_records() as i64);
}

/// The pod as this node sees it: members (each probed on `/healthz` and asked for its
/// `/v1/stats`, 1 s at most, all at once), where the membership comes from, and whether
/// etcd answers. Members are asked with the peer token, or else the caller's own.
pub(crate) async fn cluster(
    State(st): State<AppState>,
    h: HeaderMap,
) -> Json<ctxpod_wire::types::Cluster> {
    use ctxpod_wire::types::{Cluster, ClusterMember};
    pod_gauges(&st);
    let view = st.pod.view();
    let s = st.engine.stats();
    let caller_auth = h.get(header::AUTHORIZATION).cloned();
    let probes = view.members.iter().map(|m| {
        let (st, caller_auth) = (st.clone(), caller_auth.clone());
        let me = m.id == *st.node_id;
        let used_here = s.used_bytes;
        async move {
            if me {
                return ("ok".to_string(), Some(used_here));
            }
            let timeout = std::time::Duration::from_secs(1);
            let health = st
                .peers
                .http
                .get(format!("{}/healthz", m.http))
                .timeout(timeout)
                .send();
            let mut stats = st
                .peers
                .own(
                    st.peers.http.get(format!("{}/v1/stats", m.http)),
                    &st.node_id,
                )
                .timeout(timeout);
            if let (false, Some(a)) = (st.peers.has_token(), caller_auth) {
                stats = stats.header(header::AUTHORIZATION, a);
            }
            let (health, stats) = futures::future::join(health, stats.send()).await;
            let health = match health {
                Ok(r) if r.status().is_success() => "ok".into(),
                Ok(r) => format!("status {}", r.status().as_u16()),
                Err(_) => "unreachable".into(),
            };
            let used = match stats {
                Ok(r) if r.status().is_success() => {
                    r.json::<Stats>().await.ok().map(|s| s.used_bytes)
                }
                _ => None,
            };
            (health, used)
        }
    });
    let probed = futures::future::join_all(probes).await;
    Json(Cluster {
        node_id: st.node_id.to_string(),
        source: st.pod.source().as_str().into(),
        etcd_up: st.pod.etcd_up(),
        etcd_last_ok: st.pod.etcd_last_ok(),
        revision: view.revision,
        replication: st.replication as u32,
        members: view
            .members
            .iter()
            .zip(probed)
            .map(|(m, (health, used_bytes))| ClusterMember {
                id: m.id.clone(),
                http: m.http.clone(),
                transfer: m.transfer.clone(),
                capacity_bytes: m.capacity,
                used_bytes,
                zone: m.zone.clone(),
                state: m.state.as_str().into(),
                health,
            })
            .collect(),
    })
}

/// `POST /v1/admin/drain`: this node starts draining (202), or says why it cannot (409).
pub(crate) async fn drain_start(State(st): State<AppState>) -> ApiResult<Response> {
    accepted(st.drain.start(), "cannot_drain")
}

/// 202 with the status, or 409 (`code`) with why the node cannot.
fn accepted<T: serde::Serialize>(
    r: Result<T, ctxpod_pod::drain::CannotDrain>,
    code: &'static str,
) -> ApiResult<Response> {
    match r {
        Ok(s) => Ok((StatusCode::ACCEPTED, Json(s)).into_response()),
        Err(why) => Err(ApiError::new(StatusCode::CONFLICT, code, why.to_string())),
    }
}

pub(crate) async fn drain_status(State(st): State<AppState>) -> Json<DrainStatus> {
    Json(st.drain.status())
}

/// `POST /v1/admin/repair`: this node's backfill runs a pass now (202, with the pass to
/// wait for), or says why it cannot (409: the backfill is off).
pub(crate) async fn repair_start(State(st): State<AppState>) -> ApiResult<Response> {
    accepted(st.drain.ask_repair(), "cannot_repair")
}

/// `GET /v1/admin/repair`: where this node's backfill passes stand.
pub(crate) async fn repair_status(
    State(st): State<AppState>,
) -> Json<ctxpod_wire::types::RepairStatus> {
    Json(st.drain.repair_status(false))
}

/// `DELETE /v1/admin/drain`: the node is up again.
pub(crate) async fn drain_cancel(State(st): State<AppState>) -> Json<DrainStatus> {
    Json(st.drain.cancel())
}

pub(crate) async fn stats(State(st): State<AppState>) -> Json<Stats> {
    Json(node_stats(&st))
}

/// This node's stats, with the requests in flight now and the request-latency histograms
/// (what `/v1/stats` answers).
pub(crate) fn node_stats(st: &AppState) -> Stats {
    let mut s = st.engine.stats();
    s.inflight_requests = (st.max_inflight - st.limiter.available_permits()) as u64;
    s.latency_bounds_s = ctxpod_engine::metrics::latency_buckets();
    s.latency = st.metrics.latency_by_op();
    s.received_bytes = st.metrics.received_bytes.get();
    s.sent_bytes = st.metrics.sent_bytes.get();
    s.background = st.pod_metrics.background();
    s
}

/// The node's miss-ratio curve (`ctxpod_plan::mrc`), read at 48 capacities from 16 blocks
/// to 4 times the node's capacity (log-spaced). `?scope=pod`: the pod's, merged from every
/// member's (`merge_pod_curves`).
pub(crate) async fn mrc(
    State(st): State<AppState>,
    Extension(p): Extension<Principal>,
    axum::extract::RawQuery(q): axum::extract::RawQuery,
    h: HeaderMap,
) -> ApiResult<Json<MrcResponse>> {
    match q.as_deref() {
        None | Some("") | Some("scope=node") => Ok(Json(node_mrc(&st)?)),
        Some("scope=pod") => Ok(Json(pod_mrc(&st, &p, &h).await?)),
        Some(other) => Err(ApiError::invalid(format!(
            "unknown query {other:?}: scope=node or scope=pod"
        ))),
    }
}

/// The pod's curve, merged from every member's (asked for the caller); 502 if one does not
/// give it.
pub(crate) async fn pod_mrc(st: &AppState, p: &Principal, h: &HeaderMap) -> ApiResult<MrcResponse> {
    let mine = node_mrc(st)?;
    let view = st.pod.view();
    if view.members.len() < 2 {
        return Ok(mine);
    }
    let asks = view
        .members
        .iter()
        .filter(|m| m.id != *st.node_id)
        .map(|m| {
            let req = st.member_get(&m.http, "/v1/mrc", Duration::from_secs(5), h, p);
            async move {
                match req.send().await {
                    Ok(r) if r.status().is_success() => r.json::<MrcResponse>().await.ok(),
                    _ => None,
                }
            }
        });
    let others = futures::future::join_all(asks).await;
    if others.iter().any(Option::is_none) {
        return Err(ApiError::new(
            StatusCode::BAD_GATEWAY,
            "pod_mrc",
            "a member did not give its curve: the pod's cannot be merged now",
        ));
    }
    let mut all = vec![mine];
    all.extend(others.into_iter().flatten());
    Ok(merge_pod_curves(&all))
}

/// This node's curve.
pub(crate) fn node_mrc(st: &AppState) -> ApiResult<MrcResponse> {
    let (h, rate, tracked, mean) = st.engine.mrc().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "mrc_off",
            "the miss-ratio curve is off on this node (mrc_sample_rate = 0)",
        )
    })?;
    let block = mean.max(1);
    let capacity_blocks = st.engine.stats().capacity_bytes / block;
    let points = curve_points(capacity_blocks, block, |c| h.hit_ratio(c));
    Ok(MrcResponse {
        sample_rate: rate,
        tracked_keys: tracked as u64,
        references: h.total as u64,
        mean_block_bytes: mean,
        capacity_blocks,
        references_per_s: h.total / st.engine.uptime().as_secs_f64().max(1e-3),
        points,
    })
}

/// 48 points from 16 blocks to 4 times `capacity_blocks`, log-spaced.
pub(crate) fn curve_points(
    capacity_blocks: u64,
    block: u64,
    hit: impl Fn(f64) -> f64,
) -> Vec<MrcPoint> {
    let top = (4 * capacity_blocks).max(1024) as f64;
    const POINTS: usize = 48;
    (0..POINTS)
        .map(|i| {
            let c = (16.0 * (top / 16.0).powf(i as f64 / (POINTS - 1) as f64)).round();
            MrcPoint {
                capacity_blocks: c as u64,
                capacity_bytes: c as u64 * block,
                hit_ratio: hit(c),
            }
        })
        .collect()
}

/// The pod's curve from its members': each member holds its own keys (the placement
/// partitions them) and gets its share of a pod capacity C in proportion to its own
/// capacity, so the pod's hit ratio at C is the members' at their shares of C, weighted by
/// their references.
pub fn merge_pod_curves(members: &[MrcResponse]) -> MrcResponse {
    let total_cap: u64 = members.iter().map(|m| m.capacity_blocks).sum();
    let refs: u64 = members.iter().map(|m| m.references).sum();
    let bytes: u64 = members
        .iter()
        .map(|m| m.mean_block_bytes * m.references)
        .sum();
    let mean = bytes / refs.max(1);
    // (references, share of the pod's capacity, curve points)
    type Curve = (f64, f64, Vec<(f64, f64)>);
    let curves: Vec<Curve> = members
        .iter()
        .map(|m| {
            (
                m.references as f64,
                m.capacity_blocks as f64 / total_cap.max(1) as f64,
                m.points
                    .iter()
                    .map(|p| (p.capacity_blocks as f64, p.hit_ratio))
                    .collect(),
            )
        })
        .collect();
    let hit = |c: f64| {
        if refs == 0 {
            return 0.0;
        }
        curves
            .iter()
            .map(|(r, share, pts)| r * ctxpod_plan::planner::curve_at(pts, c * share))
            .sum::<f64>()
            / refs as f64
    };
    MrcResponse {
        sample_rate: members.iter().map(|m| m.sample_rate).fold(1.0, f64::min),
        tracked_keys: members.iter().map(|m| m.tracked_keys).sum(),
        references: refs,
        mean_block_bytes: mean,
        capacity_blocks: total_cap,
        references_per_s: members.iter().map(|m| m.references_per_s).sum(),
        points: curve_points(total_cap, mean.max(1), hit),
    }
}

/// KV events of a namespace as server-sent events: `stored`, `evicted` and `deleted` with
/// `{"key": "<hex>"}`, `lost` with `{"count": n}` when this subscriber fell behind (resync
/// with MATCH), and a last `namespace-deleted` when the namespace goes.
pub(crate) async fn events(
    NsCall {
        st, p, scoped: ns, ..
    }: NsCall,
) -> ApiResult<
    axum::response::sse::Sse<
        impl futures::Stream<Item = Result<axum::response::sse::Event, std::convert::Infallible>>,
    >,
> {
    use axum::response::sse::{Event, KeepAlive, Sse};
    use ctxpod_engine::events::KvEventKind;
    use tokio::sync::broadcast::error::RecvError;
    let (ns_id, rx) = st.engine.subscribe(&ns)?;
    // State: the receiver, or `None` once the namespace is gone (the stream then ends).
    let stream = futures::stream::unfold(Some(rx), move |rx| async move {
        let mut rx = rx?;
        loop {
            let (name, data) = match rx.recv().await {
                Ok(e) if e.ns_id != ns_id => continue,
                Ok(e) if e.kind == KvEventKind::NamespaceDeleted => {
                    let ev = Event::default().event("namespace-deleted").data("{}");
                    return Some((Ok(ev), None));
                }
                Ok(e) => {
                    let name = match e.kind {
                        KvEventKind::Stored => "stored",
                        KvEventKind::Evicted => "evicted",
                        _ => "deleted",
                    };
                    (name, format!("{{\"key\":\"{}\"}}", hex::encode(&e.key)))
                }
                Err(RecvError::Lagged(n)) => ("lost", format!("{{\"count\":{n}}}")),
                Err(RecvError::Closed) => return None,
            };
            return Some((Ok(Event::default().event(name).data(data)), Some(rx)));
        }
    });
    // A token removed or changed at a reload ends its streams.
    let (auth, who) = (st.auth.clone(), p.clone());
    let revoked = async move {
        while auth.still_valid(&who) {
            tokio::time::sleep(crate::auth::REVOCATION_CHECK).await;
        }
    };
    Ok(Sse::new(stream.take_until(revoked)).keep_alive(KeepAlive::default()))
}
