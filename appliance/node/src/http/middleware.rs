//! The middleware every request passes, in order (`routes::router` layers them): admission
//! and measurement ([`admit_and_measure`]), authentication ([`authenticate`]) with
//! authorisation by route ([`access_of`]) and the tenant's rate, then pod routing
//! ([`route_in_pod`]: a block this node does not hold is forwarded).

use crate::auth::{Access, AuthError, Limited, Principal};
use crate::metrics::NodeMetrics;
use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use ctxpod_wire::pod_plan::{Plan, ReadAnswer, WriteAnswer, WritePlan};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use super::routed::{count_forwarded, forward_counted, pick_answer};
use super::state::AppState;
use crate::errors::ApiError;

pub(crate) fn op_name(method: &Method, path: &str) -> &'static str {
    match (method.as_str(), path) {
        ("PUT", p) if p.ends_with("/blocks/{key}") => "put",
        ("GET", p) if p.ends_with("/blocks/{key}") => "get",
        ("HEAD", _) => "head",
        ("DELETE", p) if p.ends_with("/blocks/{key}") => "delete",
        (_, p) if p.ends_with("/match") => "match",
        (_, p) if p.ends_with("/batch/get") => "batch_get",
        (_, p) if p.ends_with("/batch/put") => "batch_put",
        (_, p) if p.ends_with("/unpin") => "unpin",
        (_, p) if p.ends_with("/promote") => "promote",
        (_, p) if p.ends_with("/pin") => "pin",
        ("GET", p) if p.ends_with("/blocks") => "list",
        (_, p) if p.ends_with("/events") => "events",
        (_, p) if p.starts_with("/v1/namespaces") => "namespace",
        (_, p) if p.starts_with("/ui") => "ui",
        _ => "admin",
    }
}

/// What each route needs ([`Access`]); `None` for a (method, path) the route table does not
/// have (the router answers 405 to an authenticated caller). A unit test checks that every
/// route of the table is here.
pub fn access_of(method: &Method, path: &str) -> Option<Access> {
    use Access::*;
    const BLOCK: &str = "/v1/namespaces/{ns}/blocks/{key}";
    Some(match (method.as_str(), path) {
        ("GET" | "HEAD", "/healthz" | "/readyz") => Public,
        // The dashboard's files hold no data: what it shows comes through the API.
        ("GET" | "HEAD", "/ui" | "/ui/{file}") => Public,
        // Access patterns span tenants: the operator's (an admin, or a viewer).
        ("GET" | "HEAD", "/metrics" | "/v1/stats" | "/v1/mrc" | "/v1/overview") => Monitor,
        // Clients route by the members' addresses: any caller may read them; anyone may
        // plan.
        ("GET" | "HEAD", "/v1/cluster") | ("POST", "/v1/plan") => Look,
        ("POST", "/v1/admin/rotate-kek" | "/v1/namespaces/{ns}/rotate-key") => Admin,
        ("POST" | "GET" | "HEAD" | "DELETE", "/v1/admin/drain") => Admin,
        ("POST" | "GET" | "HEAD", "/v1/admin/repair") => Admin,
        // The list: each caller sees its own (a viewer sees every tenant's).
        ("GET" | "HEAD", "/v1/namespaces") => Look,
        ("GET" | "HEAD", "/v1/namespaces/{ns}") => Read,
        ("PUT" | "DELETE", "/v1/namespaces/{ns}") => Write,
        ("GET" | "HEAD", BLOCK) => Read,
        ("GET" | "HEAD", "/v1/namespaces/{ns}/blocks") => Read,
        ("PUT" | "DELETE", BLOCK) => Write,
        ("POST", "/v1/namespaces/{ns}/blocks/{key}/uploads") => Write,
        ("POST" | "DELETE", "/v1/namespaces/{ns}/blocks/{key}/uploads/{upload}") => Write,
        ("GET" | "HEAD", "/v1/namespaces/{ns}/blocks/{key}/uploads/{upload}") => Read,
        ("PUT", "/v1/namespaces/{ns}/blocks/{key}/uploads/{upload}/parts/{part}") => Write,
        ("GET" | "HEAD", "/v1/namespaces/{ns}/uploads") => Read,
        (
            "POST",
            "/v1/namespaces/{ns}/match"
            | "/v1/namespaces/{ns}/present"
            | "/v1/namespaces/{ns}/batch/get",
        ) => Read,
        ("GET" | "HEAD", "/v1/namespaces/{ns}/events") => Read,
        (
            "POST",
            "/v1/namespaces/{ns}/batch/put"
            | "/v1/namespaces/{ns}/pin"
            | "/v1/namespaces/{ns}/unpin"
            | "/v1/namespaces/{ns}/promote",
        ) => Write,
        _ => return None,
    })
}

pub(crate) fn unauthorized(e: AuthError) -> Response {
    let mut r = ApiError::new(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        format!("authentication required: {e}"),
    )
    .into_response();
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"ctxpod\""),
    );
    r
}

/// Who is calling: a bearer token (`Authorization: Bearer <token>`) or the connection's
/// verified client certificate; `x-ctxpod-tenant` lets an admin act in a tenant's namespaces.
pub(crate) fn principal_of(st: &AppState, req: &Request) -> Result<Principal, Box<Response>> {
    // A request the S3 door sends for a caller it authenticated (an extension: only this
    // process can set one).
    if let Some(v) = req.extensions().get::<crate::s3::Vouched>() {
        return Ok(v.0.clone());
    }
    if !st.auth.enabled() {
        return Ok(Principal::anonymous_admin());
    }
    let mut p = if let Some(h) = req.headers().get(header::AUTHORIZATION) {
        let b = h.as_bytes();
        let token = b
            .strip_prefix(b"Bearer ")
            .or_else(|| b.strip_prefix(b"bearer "))
            .ok_or(AuthError::Malformed);
        token
            .and_then(|t| st.auth.bearer(t))
            .map_err(|e| Box::new(unauthorized(e)))?
    } else if let Some(s) = req
        .extensions()
        .get::<axum::extract::ConnectInfo<crate::conn::PeerInfo>>()
        .and_then(|c| c.0.subject.clone())
    {
        st.auth
            .identity(&s)
            .map_err(|e| Box::new(unauthorized(e)))?
    } else {
        return Err(Box::new(unauthorized(AuthError::Missing)));
    };
    if let Some(t) = req.headers().get(ctxpod_wire::HEADER_TENANT) {
        if p.role != crate::auth::Role::Admin {
            return Err(Box::new(forbidden(
                &st.metrics,
                "only an admin may act for another tenant",
            )));
        }
        let t = t
            .to_str()
            .ok()
            .filter(|t| ctxpod_wire::namespace::check_tenant_name(t).is_ok())
            .ok_or_else(|| {
                Box::new(ApiError::invalid("x-ctxpod-tenant must be a tenant name").into_response())
            })?;
        p.tenant = Some(Arc::from(t));
    }
    Ok(p)
}

pub(crate) fn forbidden(metrics: &NodeMetrics, why: &str) -> Response {
    metrics.forbidden.inc();
    ApiError::new(StatusCode::FORBIDDEN, "forbidden", why).into_response()
}

/// Authentication, authorisation by route ([`access_of`]) and the tenant's request rate.
/// Any node answers (`ctxpod_pod::route`, `forward`): a single-block request for a block this node does not
/// hold goes to the member that does. Runs after authentication, so a refused caller is
/// refused here; a request already forwarded is served here.
pub(crate) async fn route_in_pod(State(st): State<AppState>, req: Request, next: Next) -> Response {
    use ctxpod_pod::route::{self as forward, Route};
    // A pod of one (the default) pays one look at the view, nothing more.
    let view = st.pod.view();
    // In an etcd pod a block delete is recorded and settled whatever the view's size (a
    // member out of the view now may hold the block and come back).
    let pod_delete = st.tombstones.is_some() && req.method() == Method::DELETE;
    if (view.members.len() < 2 && !pod_delete)
        || req.headers().contains_key(forward::HEADER_FORWARDED)
    {
        return next.run(req).await;
    }
    // A multipart upload lives on its key's first member.
    if let Some((ns, key)) = super::pod_values::upload_of(req.uri().path()) {
        let ns = ns.to_string();
        return super::pod_values::to_upload_home(&st, &view, req, next, (&ns, &key)).await;
    }
    // The block, by its namespace's node-side name.
    let mut block = None;
    let mut placed = None;
    let route = match forward::block_of(req.uri().path()) {
        Some((ns, key)) => {
            let scoped = req
                .extensions()
                .get::<Principal>()
                .and_then(|p| p.scope(ns).ok());
            // The namespace's own replication, if it sets one.
            let r = scoped
                .as_ref()
                .map_or(st.replication, |scoped| st.replication_of(scoped));
            let route = match forward::route(&view, &st.node_id, req.method(), ns, &key, r) {
                Route::Local if pod_delete => Route::Delete { copies: r.max(1) },
                route => route,
            };
            placed = Some((ns.to_string(), key.clone()));
            block = scoped.map(|s| (s, key));
            route
        }
        None => Route::Local,
    };
    let Some((ns, key)) = placed.filter(|_| route != Route::Local) else {
        return next.run(req).await;
    };
    match route {
        Route::Local => next.run(req).await,
        Route::Read { copies } => {
            let (parts, _) = req.into_parts();
            let down = st.peers.missed.flags(&view);
            let mut plan = Route::read_plan(&view, &down, &ns, &key, copies);
            // This node first when it is a candidate: its own copy costs no hop.
            if let Some(me) = view.members.iter().position(|m| m.id == *st.node_id) {
                plan = plan.ask_first(me, &down);
            }
            let mut answer = None;
            while let Some(round) = plan.next_round() {
                for m in round.into_keys() {
                    let member = &view.members[m];
                    let resp = if member.id == *st.node_id {
                        let local = Request::from_parts(parts.clone(), Body::empty());
                        next.clone().run(local).await
                    } else {
                        match forward_counted(&st, member, &parts, None, "read").await {
                            Some(r) => r,
                            None => {
                                plan.answer(m, 0, ReadAnswer::Unreachable);
                                continue;
                            }
                        }
                    };
                    // A miss here may be a hit further down the ranking (a block written
                    // while its first member was away); anything else is the answer.
                    if resp.status() == StatusCode::NOT_FOUND {
                        plan.answer(m, 0, ReadAnswer::Miss);
                    } else {
                        plan.answer(m, 0, ReadAnswer::Final);
                        answer = Some(resp);
                    }
                }
            }
            answer.unwrap_or_else(|| {
                count_forwarded(&st, "read_miss");
                ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such block").into_response()
            })
        }
        Route::Write { .. } | Route::Delete { .. } => {
            let down = st.peers.missed.flags(&view);
            let plan = route.write_plan(&view, &down, &ns, &key);
            let plan = plan.expect("a write route");
            let copies = match route {
                Route::Delete { copies } => copies,
                _ => 0,
            };
            let placed = (ns.as_str(), &key[..], copies);
            write_in_pod(&st, &view, req, next, plan, block.as_ref(), placed).await
        }
    }
}

/// A routed put or delete: the body held (within the ingest budget) so that it can go to
/// several members at once, or to the next one if a member cannot be reached, driven by
/// its plan ([`WritePlan`]); a delete is then recorded as a tombstone and settled
/// ([`ctxpod_pod::settle`]). `placed`: the namespace and key as placed, and a delete's copies.
async fn write_in_pod(
    st: &AppState,
    view: &ctxpod_pod::membership::PodView,
    req: Request,
    next: Next,
    mut plan: WritePlan,
    block: Option<&(String, Vec<u8>)>,
    placed: (&str, &[u8], usize),
) -> Response {
    let started = Instant::now();
    if let Some(len) = large_put(&req) {
        return super::pod_values::write_value_in_pod(st, view, req, next, (plan, len), block)
            .await;
    }
    let len = match body_charge(&req) {
        Ok(len) => len,
        Err(e) => return e.into_response(),
    };
    let _permit = match st.admit_body(len) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let (parts, body) = req.into_parts();
    let Ok(body) = axum::body::to_bytes(body, ctxpod_wire::BLOCK_BYTES_MAX + 1).await else {
        return ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            "block body over the limit, or cut short",
        )
        .into_response();
    };
    let is_delete = plan.is_delete();
    let tombstones = st.tombstones.as_ref().filter(|_| is_delete).zip(block);
    if let Some((t, (ns, key))) = tombstones {
        if let Err(e) = t.room_for(ns, key) {
            return delete_not_recorded(e);
        }
    }
    let sending = Sending {
        st,
        view,
        parts: &parts,
        body: &body,
        next: &next,
    };
    let answers = sending.send(&mut plan, is_delete).await;
    // A delete is then recorded (a tombstone, with etcd): members that are away delete
    // their copy when they return, every member deletes any copy taken meanwhile, and no
    // copy of it is taken back. Recorded after the members answered, which tells whether
    // one held the block (every member applies a tombstone as it learns of it); a delete
    // not recorded answers 503 and the client sends it again. Then it is settled: every
    // member that may hold the block applied it, or is out of the pod.
    if let Some((t, (ns, key))) = tombstones {
        // A member that refused the connection counts only if it still does after the
        // tombstone is recorded (then it lists the tombstones when it starts): settling
        // asks it again.
        let mut applied: BTreeSet<String> = BTreeSet::new();
        let mut removed = Vec::new();
        for (&m, r) in &answers {
            if r.status().is_success() || r.status() == StatusCode::NOT_FOUND {
                applied.insert(view.members[m].id.clone());
            }
            if r.status().is_success() {
                removed.push(view.members[m].id.as_str());
            }
        }
        if let Err(e) = t.record(ns, key).await {
            tracing::warn!("block delete not recorded: {e}");
            // It says what was done: the copies it reached are gone, nothing recorded.
            let message = format!(
                "{e}; the copies on {removed:?} were deleted, the delete is not recorded: \
                 send it again"
            );
            return ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
                .into_response();
        }
        let until = ctxpod_pod::settle::deadline(started.into(), t.lease_ttl());
        let (ns, key, copies) = placed;
        let settling = ctxpod_pod::settle::Settling {
            membership: &st.pod,
            missed: &st.peers.missed,
            ns,
            key,
            copies,
        };
        let ask = AskOverHttp { st, parts: &parts };
        if let Err(pending) = settling.settle(&ask, &mut applied, until).await {
            return delete_unsettled(t, &applied, &pending);
        }
    }
    pick_answer(plan.finish().pop(), answers, is_delete)
}

/// A settling delete's members asked through the routed HTTP path, with the request's
/// own head (this member too, when it is pending: its own stack applies it).
struct AskOverHttp<'a> {
    st: &'a AppState,
    parts: &'a axum::http::request::Parts,
}

#[async_trait::async_trait]
impl ctxpod_pod::settle::AskDelete for AskOverHttp<'_> {
    async fn ask(&self, m: &ctxpod_pod::membership::MemberInfo) -> ctxpod_pod::settle::Asked {
        use ctxpod_pod::settle::Asked;
        match super::routed::forward_why(self.st, m, self.parts, None, "write").await {
            Ok(r) if r.status().is_success() || r.status() == StatusCode::NOT_FOUND => {
                Asked::Applied
            }
            Err(crate::forward::ForwardError::Refused) => Asked::Refused,
            _ => Asked::Failed,
        }
    }
}

/// 503 for a delete recorded but not settled: what was done, and what is pending.
fn delete_unsettled(
    t: &ctxpod_pod::tombstones::Tombstones,
    applied: &BTreeSet<String>,
    pending: &[String],
) -> Response {
    t.unsettled();
    let message = format!(
        "the delete is recorded (a tombstone) and settled on {applied:?} (applied, or nothing \
         listens there), but {pending:?} \
         may hold the block and have not applied it: they are still in the pod and could not \
         be reached; it completes when they answer or their lease runs out (within \
         pod.lease_ttl_s); send it again"
    );
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message).into_response()
}

/// The announced length of a routed PUT of a value over one record (streamed to its members
/// as it arrives, not held).
fn large_put(req: &Request) -> Option<u64> {
    let n = req
        .headers()
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse::<u64>()
        .ok()?;
    (req.method() == Method::PUT && n > ctxpod_wire::BLOCK_BYTES_MAX as u64).then_some(n)
}

/// What a routed write is charged against the ingest budget, the most it may hold, before
/// any byte is read: its announced length (over the block limit: 413 at once), or a whole
/// block when it announces none (chunked); or why it is refused.
fn body_charge(req: &Request) -> Result<usize, ApiError> {
    let announced = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .map(|v| v.to_str().ok().and_then(|v| v.parse::<u64>().ok()));
    Ok(match announced {
        Some(Some(n)) if n > ctxpod_wire::BLOCK_BYTES_MAX as u64 => {
            return Err(ApiError::too_large(format!(
                "a block of {n} bytes is over the limit of {}",
                ctxpod_wire::BLOCK_BYTES_MAX
            )))
        }
        Some(Some(n)) => n as usize,
        Some(None) => return Err(ApiError::invalid("content-length is not a number")),
        None if req.method() == Method::DELETE => 0,
        None => ctxpod_wire::BLOCK_BYTES_MAX,
    })
}

/// A routed write on its way to the members: the request's head and held body, and the
/// rest of this node's stack for its own copy.
struct Sending<'a> {
    st: &'a AppState,
    view: &'a ctxpod_pod::membership::PodView,
    parts: &'a axum::http::request::Parts,
    body: &'a Bytes,
    next: &'a Next,
}

impl Sending<'_> {
    /// Sends the write to the members its plan asks, round by round, each round's at
    /// once; every answer taken into the plan. The members' answers, by member.
    async fn send(&self, plan: &mut WritePlan, is_delete: bool) -> BTreeMap<usize, Response> {
        let st = self.st;
        let mut answers: BTreeMap<usize, Response> = BTreeMap::new();
        while let Some(round) = plan.next_round() {
            let sent = futures::future::join_all(round.into_keys().map(|m| {
                let (member, parts, body, next) = (
                    &self.view.members[m],
                    self.parts,
                    self.body,
                    self.next.clone(),
                );
                async move {
                    let resp = if member.id == *st.node_id {
                        let local = Request::from_parts(parts.clone(), Body::from(body.clone()));
                        Ok(next.run(local).await)
                    } else {
                        let body = Some(crate::forward::Outgoing::Whole(body.clone()));
                        super::routed::forward_why(st, member, parts, body, "write").await
                    };
                    (m, resp)
                }
            }))
            .await;
            for (m, resp) in sent {
                let Ok(resp) = resp else {
                    plan.answer(m, 0, WriteAnswer::Unreachable);
                    continue;
                };
                let s = resp.status();
                let a = match (is_delete, s) {
                    (true, s) if s.is_success() => WriteAnswer::Applied { changed: true },
                    (true, StatusCode::NOT_FOUND) => WriteAnswer::Applied { changed: false },
                    (false, s) if s.is_success() => WriteAnswer::Applied {
                        changed: s == StatusCode::CREATED,
                    },
                    _ => WriteAnswer::Refused,
                };
                plan.answer(m, 0, a);
                answers.insert(m, resp);
            }
        }
        answers
    }
}

/// 503 (retry after a second) for a block delete the pod cannot record.
pub(crate) fn delete_not_recorded(e: ctxpod_pod::tombstones::Refused) -> Response {
    tracing::warn!("block delete refused: {e}");
    // A 503 carries Retry-After (`ApiError::into_response`).
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        e.to_string(),
    )
    .into_response()
}

pub(crate) async fn authenticate(
    State(st): State<AppState>,
    mut req: Request,
    next: Next,
) -> Response {
    let access = req
        .extensions()
        .get::<MatchedPath>()
        .and_then(|p| access_of(req.method(), p.as_str()))
        // No such route (or method): only an authenticated caller learns that.
        .unwrap_or(Access::Look);
    if access == Access::Public {
        return next.run(req).await;
    }
    let p = match principal_of(&st, &req) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    if !p.may(access) {
        return forbidden(&st.metrics, "this role may not do that");
    }
    if let Err(Limited::Rate) = st.auth.admit(&p) {
        let mut r = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            "the tenant's request rate is spent; retry later",
        )
        .into_response();
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        return r;
    }
    req.extensions_mut().insert(p);
    next.run(req).await
}

/// Admission (a bounded number of data requests at once, else 503) and per-op metrics.
pub(crate) async fn admit_and_measure(
    State(st): State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    let path = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string());
    let op = path
        .as_deref()
        .map_or("unrouted", |p| op_name(req.method(), p));
    let data = path
        .as_deref()
        .is_some_and(|p| p.starts_with("/v1/namespaces"));
    let permit = if data {
        match st.limiter.clone().try_acquire_owned() {
            Ok(p) => Some(p),
            Err(_) => {
                let busy = &st.engine.metrics().busy_rejections;
                busy.with_label_values(&["requests"]).inc();
                st.metrics.responses.with_label_values(&[op, "5xx"]).inc();
                return ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "busy",
                    "too many requests in flight; retry later",
                )
                .into_response();
            }
        }
    } else {
        None
    };
    let resp = next.run(req).await;
    drop(permit);
    let m: &NodeMetrics = &st.metrics;
    let class = match resp.status().as_u16() {
        200..=299 => "2xx",
        400..=499 => "4xx",
        _ => "5xx",
    };
    m.responses.with_label_values(&[op, class]).inc();
    m.request_seconds
        .with_label_values(&[op])
        .observe(started.elapsed().as_secs_f64());
    resp
}
