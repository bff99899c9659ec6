//! HTTP API v1 (axum). The route table is the contract in `wire/openapi.json`; the router is
//! built only from [`Routes`], whose list a test compares with the spec.
//!
//! Architecture invariant: this is the only module that knows HTTP. It parses and bounds
//! input, maps [`EngineError`] kinds one to one to statuses, and never touches the device or
//! the index directly.

use crate::auth::{Access, AuthError, Authenticator, Limited, Principal};
use crate::config::Config;
use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::handler::Handler;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, MethodRouter};
use axum::{Extension, Json, Router};
use bytes::Bytes;
use ctxpod_engine::metrics::Metrics;
use ctxpod_engine::{Engine, EngineError, NsSettings, PutStatus, StagedBlock};
use ctxpod_pod::batch as pod_batch;
use ctxpod_wire::types::*;
use ctxpod_wire::{frame, Durability};
use futures::StreamExt;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

/// Largest JSON body (a `match` of 4096 keys of 128 bytes is about 1 MiB).
pub const JSON_BODY_BYTES_MAX: usize = 2 << 20;
/// Most blocks a `batch/get` answers with data; further present blocks answer 413 in the frame.
pub const BATCH_GET_BYTES_MAX: usize = 64 << 20;
/// Blocks of one batch served concurrently.
const BATCH_CONCURRENCY: usize = 16;

#[derive(Clone)]
pub struct AppState {
    pub engine: Arc<Engine>,
    limiter: Arc<Semaphore>,
    max_inflight: usize,
    /// The node's byte budgets (request bodies, answers, staging), shared with CXP1.
    pub budgets: crate::budget::Budgets,
    pub auth: Arc<Authenticator>,
    /// The pod this node is in, and its own id there.
    pub pod: Arc<ctxpod_pod::membership::Membership>,
    pub node_id: Arc<str>,
    /// How this node reaches the other members.
    pub peers: ctxpod_pod::Peers,
    /// The pod's name and etcd, where namespaces are recorded (`None`: no etcd).
    pub ns_records: Option<Arc<(String, ctxpod_pod::etcd::Etcd)>>,
    /// Copies of each block in the pod (`pod.replication`).
    pub replication: usize,
    /// This node's drain (`/v1/admin/drain`).
    pub drain: Arc<ctxpod_pod::drain::Drain>,
    /// The pod's block deletes (`None`: no etcd).
    pub tombstones: Option<Arc<ctxpod_pod::tombstones::Tombstones>>,
}

impl AppState {
    /// A copy ([`ctxpod_wire::HEADER_COPY`]: read repair, backfill) of a block the pod
    /// deleted is refused: 410 `deleted`.
    fn refuse_deleted_copy(&self, h: &HeaderMap, ns: &str, key: &[u8]) -> ApiResult<()> {
        match &self.tombstones {
            Some(t) if h.contains_key(ctxpod_wire::HEADER_COPY) && t.holds(ns, key) => {
                self.engine.metrics().copies_refused.inc();
                Err(ApiError::new(
                    StatusCode::GONE,
                    "deleted",
                    "the pod deleted this block: copies of it are refused",
                ))
            }
            _ => Ok(()),
        }
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
type IngestPermit = tokio::sync::OwnedSemaphorePermit;

impl AppState {
    /// Refuses (403 `quota`) a write that would take the caller's tenant over its byte
    /// quota.
    fn check_tenant_bytes(&self, p: &Principal, bytes: usize) -> ApiResult<()> {
        self.auth
            .check_tenant_bytes(&self.engine, p, bytes as u64)
            .map_err(|m| ApiError::new(StatusCode::FORBIDDEN, "quota", m))
    }

    /// Takes `bytes` of the egress budget for an answer to `peer` (its address's share and
    /// the node's), or answers 503 when it is spent.
    fn admit_egress(
        &self,
        peer: Option<std::net::IpAddr>,
        bytes: usize,
    ) -> ApiResult<Vec<crate::budget::Permit>> {
        self.budgets.take_egress(peer, bytes).ok_or_else(|| {
            self.engine
                .metrics()
                .busy_rejections
                .with_label_values(&["egress"])
                .inc();
            ApiError::busy("too many answers waiting for their clients; retry later")
        })
    }

    /// Reserves room for a body of `bytes`, or answers 503 when the ingest budget is spent.
    fn admit_body(&self, bytes: usize) -> ApiResult<IngestPermit> {
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

pub(crate) use crate::errors::{status_of, ApiError, ApiResult};

/// The route table: every (method, path) the node answers, and the router built from it.
pub struct Routes<S> {
    pub list: Vec<(Method, &'static str)>,
    routers: Vec<(&'static str, MethodRouter<S>)>,
}

impl<S: Clone + Send + Sync + 'static> Routes<S> {
    fn new() -> Self {
        Routes {
            list: Vec::new(),
            routers: Vec::new(),
        }
    }

    fn add<H, T>(mut self, method: Method, path: &'static str, handler: H) -> Self
    where
        H: Handler<T, S>,
        T: 'static,
    {
        let filter = MethodFilter::try_from(method.clone()).expect("routes use standard methods");
        match self.routers.iter_mut().find(|(p, _)| *p == path) {
            Some((_, mr)) => {
                let old = std::mem::replace(mr, MethodRouter::new());
                *mr = old.on(filter, handler);
            }
            None => self
                .routers
                .push((path, MethodRouter::new().on(filter, handler))),
        }
        self.list.push((method, path));
        self
    }

    fn into_router(self) -> Router<S> {
        self.routers
            .into_iter()
            .fold(Router::new(), |r, (path, mr)| r.route(path, mr))
    }
}

/// HTTP API v1.
pub fn routes() -> Routes<AppState> {
    use Method as M;
    const BLOCK: &str = "/v1/namespaces/{ns}/blocks/{key}";
    Routes::new()
        .add(M::GET, "/healthz", healthz)
        .add(M::GET, "/readyz", readyz)
        .add(M::GET, "/metrics", metrics)
        .add(M::GET, "/v1/stats", stats)
        .add(M::GET, "/v1/mrc", mrc)
        .add(M::GET, "/v1/namespaces", list_namespaces)
        .add(M::PUT, "/v1/namespaces/{ns}", put_namespace)
        .add(M::GET, "/v1/namespaces/{ns}", get_namespace)
        .add(M::DELETE, "/v1/namespaces/{ns}", delete_namespace)
        .add(M::PUT, BLOCK, put_block)
        .add(M::GET, BLOCK, get_block)
        .add(M::HEAD, BLOCK, head_block)
        .add(M::DELETE, BLOCK, delete_block)
        .add(M::POST, "/v1/namespaces/{ns}/match", match_prefix)
        .add(M::POST, "/v1/namespaces/{ns}/present", present_keys)
        .add(M::POST, "/v1/namespaces/{ns}/batch/get", batch_get)
        .add(M::POST, "/v1/namespaces/{ns}/batch/put", batch_put)
        .add(M::POST, "/v1/namespaces/{ns}/pin", pin)
        .add(M::POST, "/v1/namespaces/{ns}/unpin", unpin)
        .add(M::GET, "/v1/namespaces/{ns}/events", events)
        .add(M::POST, "/v1/namespaces/{ns}/rotate-key", rotate_key)
        .add(M::POST, "/v1/admin/rotate-kek", rotate_kek)
        .add(M::POST, "/v1/admin/drain", drain_start)
        .add(M::GET, "/v1/admin/drain", drain_status)
        .add(M::DELETE, "/v1/admin/drain", drain_cancel)
        .add(M::GET, "/v1/cluster", cluster)
        .add(M::GET, "/v1/overview", crate::dashboard::overview)
        .add(M::POST, "/v1/plan", crate::dashboard::plan)
        .add(M::GET, "/ui", crate::dashboard::ui_index)
        .add(M::GET, "/ui/{file}", crate::dashboard::ui_file)
}

pub fn router(
    engine: Arc<Engine>,
    auth: Arc<Authenticator>,
    max_inflight: usize,
    budgets: crate::budget::Budgets,
    pod: &ctxpod_pod::Pod,
) -> Router {
    let state = AppState {
        engine,
        limiter: Arc::new(Semaphore::new(max_inflight)),
        max_inflight,
        budgets,
        auth,
        pod: pod.membership.clone(),
        node_id: pod.me.id.as_str().into(),
        peers: pod.peers.clone(),
        ns_records: pod.records.clone().map(Arc::new),
        replication: pod.replication,
        drain: pod.drain.clone(),
        tombstones: pod.tombstones.as_ref().map(|(t, _)| t.clone()),
    };
    routes()
        .into_router()
        .fallback(no_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), route_in_pod))
        .layer(middleware::from_fn_with_state(state.clone(), authenticate))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            admit_and_measure,
        ))
        .with_state(state)
}

async fn no_route() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "no_route", "no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "method not allowed on this route",
    )
}

fn op_name(method: &Method, path: &str) -> &'static str {
    match (method.as_str(), path) {
        ("PUT", p) if p.ends_with("/blocks/{key}") => "put",
        ("GET", p) if p.ends_with("/blocks/{key}") => "get",
        ("HEAD", _) => "head",
        ("DELETE", p) if p.ends_with("/blocks/{key}") => "delete",
        (_, p) if p.ends_with("/match") => "match",
        (_, p) if p.ends_with("/batch/get") => "batch_get",
        (_, p) if p.ends_with("/batch/put") => "batch_put",
        (_, p) if p.ends_with("/unpin") => "unpin",
        (_, p) if p.ends_with("/pin") => "pin",
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
        // The list: each caller sees its own (a viewer sees every tenant's).
        ("GET" | "HEAD", "/v1/namespaces") => Look,
        ("GET" | "HEAD", "/v1/namespaces/{ns}") => Read,
        ("PUT" | "DELETE", "/v1/namespaces/{ns}") => Write,
        ("GET" | "HEAD", BLOCK) => Read,
        ("PUT" | "DELETE", BLOCK) => Write,
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
            | "/v1/namespaces/{ns}/unpin",
        ) => Write,
        _ => return None,
    })
}

fn unauthorized(e: AuthError) -> Response {
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
fn principal_of(st: &AppState, req: &Request) -> Result<Principal, Box<Response>> {
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
        .get::<axum::extract::ConnectInfo<crate::tls::PeerInfo>>()
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
                &st.engine,
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

fn forbidden(engine: &Engine, why: &str) -> Response {
    engine.metrics().forbidden.inc();
    ApiError::new(StatusCode::FORBIDDEN, "forbidden", why).into_response()
}

/// Authentication, authorisation by route ([`access_of`]) and the tenant's request rate.
/// Any node answers (`ctxpod_pod::route`, `forward`): a single-block request for a block this node does not
/// hold goes to the member that does. Runs after authentication, so a refused caller is
/// refused here; a request already forwarded is served here.
async fn route_in_pod(State(st): State<AppState>, req: Request, next: Next) -> Response {
    use ctxpod_pod::route::{self as forward, Route};
    // A pod of one (the default) pays one look at the view, nothing more.
    let view = st.pod.view();
    if view.members.len() < 2 || req.headers().contains_key(forward::HEADER_FORWARDED) {
        return next.run(req).await;
    }
    // The block, by its namespace's node-side name.
    let mut block = None;
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
            let route = forward::route(&view, &st.node_id, req.method(), ns, &key, r);
            block = scoped.map(|s| (s, key));
            route
        }
        None => Route::Local,
    };
    match route {
        Route::Local => next.run(req).await,
        Route::Read(members) => {
            let (parts, _) = req.into_parts();
            for m in &members {
                let resp = if m.id == *st.node_id {
                    let local = Request::from_parts(parts.clone(), Body::empty());
                    next.clone().run(local).await
                } else {
                    match forward_counted(&st, m, &parts, None, "read").await {
                        Some(r) => r,
                        None => continue,
                    }
                };
                // A miss here may be a hit further down the ranking (a block written while
                // its first member was away); anything else is the answer.
                if resp.status() != StatusCode::NOT_FOUND {
                    return resp;
                }
            }
            count_forwarded(&st, "read_miss");
            ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such block").into_response()
        }
        Route::Write { members, copies } => {
            // The body is held (within the ingest budget) so that it can go to several
            // members, or to the next one if a member cannot be reached. It is charged the
            // most it may hold, before any byte is read: its announced length (over the
            // block limit: 413 at once), or a whole block when it announces none (chunked).
            let announced = req
                .headers()
                .get(header::CONTENT_LENGTH)
                .map(|v| v.to_str().ok().and_then(|v| v.parse::<u64>().ok()));
            let len = match announced {
                Some(Some(n)) if n > ctxpod_wire::BLOCK_BYTES_MAX as u64 => {
                    return ApiError::too_large(format!(
                        "a block of {n} bytes is over the limit of {}",
                        ctxpod_wire::BLOCK_BYTES_MAX
                    ))
                    .into_response()
                }
                Some(Some(n)) => n as usize,
                Some(None) => {
                    return ApiError::invalid("content-length is not a number").into_response()
                }
                None if req.method() == Method::DELETE => 0,
                None => ctxpod_wire::BLOCK_BYTES_MAX,
            };
            let _permit = match st.admit_body(len) {
                Ok(p) => p,
                Err(e) => return e.into_response(),
            };
            let (parts, body) = req.into_parts();
            let body = match axum::body::to_bytes(body, ctxpod_wire::BLOCK_BYTES_MAX + 1).await {
                Ok(b) => b,
                Err(_) => {
                    return ApiError::new(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "too_large",
                        "block body over the limit, or cut short",
                    )
                    .into_response()
                }
            };
            let is_delete = parts.method == Method::DELETE;
            if let (true, Some(t), Some((ns, key))) = (is_delete, &st.tombstones, &block) {
                if let Err(e) = t.room_for(ns, key) {
                    return delete_not_recorded(e);
                }
            }
            // The first `copies` members that answer each get the request, in rank order.
            let mut answers: Vec<Response> = Vec::new();
            for m in &members {
                if answers.len() == copies {
                    break;
                }
                let resp = if m.id == *st.node_id {
                    let local = Request::from_parts(parts.clone(), Body::from(body.clone()));
                    next.clone().run(local).await
                } else {
                    match forward_counted(&st, m, &parts, Some(body.clone()), "write").await {
                        Some(r) => r,
                        None => continue,
                    }
                };
                answers.push(resp);
            }
            // A delete is then recorded (a tombstone, with etcd): members that are away
            // delete their copy when they return, every member deletes any copy taken
            // meanwhile, and no copy of it is taken back. Recorded after the members
            // answered, which tells whether one held the block (every member applies a
            // tombstone as it learns of it); a delete not recorded answers 503 and the
            // client sends it again.
            if let (true, Some(t), Some((ns, key))) = (is_delete, &st.tombstones, &block) {
                if let Err(e) = t.record(ns, key).await {
                    return delete_not_recorded(e);
                }
            }
            pick_answer(answers, copies, is_delete)
        }
    }
}

/// 503 (retry after a second) for a block delete the pod cannot record.
fn delete_not_recorded(e: ctxpod_pod::tombstones::Refused) -> Response {
    tracing::warn!("block delete refused: {e}");
    // A 503 carries Retry-After (`ApiError::into_response`).
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        e.to_string(),
    )
    .into_response()
}

/// Forwards a request to `m` and counts the outcome (`ctxpod_forwarded_total`); `None`
/// when `m` cannot be reached.
async fn forward_counted(
    st: &AppState,
    m: &ctxpod_pod::membership::MemberInfo,
    parts: &axum::http::request::Parts,
    body: Option<Bytes>,
    outcome: &str,
) -> Option<Response> {
    match crate::forward::forward(
        &st.peers,
        m,
        &st.node_id,
        &parts.method,
        &parts.uri,
        &parts.headers,
        parts
            .extensions
            .get::<Principal>()
            .and_then(|p| p.tenant.as_deref()),
        body,
    )
    .await
    {
        Ok(r) => {
            count_forwarded(st, outcome);
            Some(r)
        }
        Err(crate::forward::ForwardError::Unreachable) => {
            count_forwarded(st, "unreachable");
            None
        }
    }
}

/// `ctxpod_forwarded_total{outcome}`.
fn count_forwarded(st: &AppState, outcome: &str) {
    st.engine
        .metrics()
        .forwarded
        .with_label_values(&[outcome])
        .inc();
}

/// The answer to a write sent to several members. A put is acknowledged (with the first
/// member's answer) only if `copies` members stored it; otherwise the first refusal is the
/// answer, or 503 when too few members could be reached. A delete answers 200 if any
/// member deleted the block, else the first answer (404 when none held it).
fn pick_answer(answers: Vec<Response>, copies: usize, is_delete: bool) -> Response {
    if is_delete {
        let mut first = None;
        for r in answers {
            if r.status().is_success() {
                return r;
            }
            first.get_or_insert(r);
        }
        return first
            .unwrap_or_else(|| unavailable("no member that may hold this block can be reached"));
    }
    if let Some(i) = answers.iter().position(|r| !r.status().is_success()) {
        return answers.into_iter().nth(i).expect("an index from position");
    }
    if answers.len() < copies {
        return unavailable("fewer members than the pod's replication factor can be reached");
    }
    answers
        .into_iter()
        .next()
        .unwrap_or_else(|| unavailable("no member that may hold this block can be reached"))
}

fn unavailable(message: &'static str) -> Response {
    let mut r =
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message).into_response();
    // Busy-style: clients retry after a moment (membership catches up within a lease).
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

async fn authenticate(State(st): State<AppState>, mut req: Request, next: Next) -> Response {
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
        return forbidden(&st.engine, "this role may not do that");
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
async fn admit_and_measure(State(st): State<AppState>, req: Request, next: Next) -> Response {
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
                let m = st.engine.metrics();
                m.busy_rejections.with_label_values(&["requests"]).inc();
                m.responses.with_label_values(&[op, "5xx"]).inc();
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
    let m: &Metrics = st.engine.metrics();
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

fn parse_key(s: &str) -> ApiResult<Vec<u8>> {
    ctxpod_wire::key::parse_key_hex(s).map_err(|e| ApiError::invalid(e.to_string()))
}

fn parse_keys(keys: &[String], max: usize) -> ApiResult<Vec<Vec<u8>>> {
    if keys.len() > max {
        return Err(ApiError::too_large(format!(
            "{} keys in one request; the limit is {max}",
            keys.len()
        )));
    }
    keys.iter().map(|k| parse_key(k)).collect()
}

/// The node's name of the caller's namespace `ns` (its tenant's, see [`Principal::scope`]).
fn scope(p: &Principal, ns: &str) -> ApiResult<String> {
    p.scope(ns).map_err(|e| ApiError::invalid(e.to_string()))
}

/// A namespace's info under the caller's name for it.
fn present(p: &Principal, mut info: NamespaceInfo) -> NamespaceInfo {
    if let Some(n) = p.unscope(&info.name) {
        info.name = n.to_string();
    }
    info
}

fn durability(h: &HeaderMap) -> ApiResult<Durability> {
    match h.get(ctxpod_wire::HEADER_DURABILITY) {
        None => Ok(Durability::Durable),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(Durability::parse)
            .ok_or_else(|| ApiError::invalid("x-ctxpod-durability must be durable or fast")),
    }
}

/// The request's Content-Length, if it has a valid one.
fn content_length(h: &HeaderMap) -> Option<usize> {
    h.get(header::CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}

/// Bytes of an over-limit body read and discarded before answering 413, so that the client
/// reads the answer instead of a reset connection; bodies declared larger are cut off at once.
pub const DRAIN_BYTES_MAX: u64 = 64 << 20;

/// Reads a body of at most `max` bytes. A longer body is never buffered: it is drained (up
/// to [`DRAIN_BYTES_MAX`]) and refused with 413.
pub(crate) async fn read_body(h: &HeaderMap, mut body: Body, max: usize) -> ApiResult<Bytes> {
    use http_body_util::BodyExt;
    let too_large = || ApiError::too_large(format!("body over the limit of {max} bytes"));
    let declared = content_length(h).map(|l| l as u64);
    if declared.is_some_and(|l| l > DRAIN_BYTES_MAX) {
        return Err(too_large());
    }
    let mut over = declared.is_some_and(|l| l > max as u64);
    let mut buf = bytes::BytesMut::with_capacity(if over {
        0
    } else {
        declared.unwrap_or(0) as usize
    });
    let mut seen = 0u64;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ApiError::invalid(format!("reading the body: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        seen += data.len() as u64;
        if !over && seen > max as u64 {
            over = true;
            buf = bytes::BytesMut::new();
        }
        if over {
            if seen > DRAIN_BYTES_MAX {
                break;
            }
        } else {
            buf.extend_from_slice(&data);
        }
    }
    if over {
        return Err(too_large());
    }
    Ok(buf.freeze())
}

/// Receives a body of exactly the announced length into `staged`.
async fn read_into(mut body: Body, staged: &mut StagedBlock) -> ApiResult<()> {
    use http_body_util::BodyExt;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ApiError::invalid(format!("reading the body: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if !staged.append(&data) {
            return Err(ApiError::invalid("body longer than its Content-Length"));
        }
    }
    if !staged.is_complete() {
        return Err(ApiError::invalid("body shorter than its Content-Length"));
    }
    Ok(())
}

async fn read_json<T: serde::de::DeserializeOwned>(h: &HeaderMap, body: Body) -> ApiResult<T> {
    let b = read_body(h, body, JSON_BODY_BYTES_MAX).await?;
    json_object(&b)
}

/// A JSON request body, which must be an object: serde's derived `Deserialize` takes an
/// array for a struct (its fields in order), which no client means (found by the contract
/// fuzzer: `[null, null]` created a namespace).
pub(crate) fn json_object<T: serde::de::DeserializeOwned>(b: &[u8]) -> ApiResult<T> {
    let v: serde_json::Value =
        serde_json::from_slice(b).map_err(|e| ApiError::invalid(format!("bad JSON body: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::invalid(
            "bad JSON body: a JSON object is expected",
        ));
    }
    serde_json::from_value(v).map_err(|e| ApiError::invalid(format!("bad JSON body: {e}")))
}

/// `axum::extract::Path` whose refusal (a segment that is not UTF-8, or not of its type)
/// is the JSON 400 every other bad input gets, not axum's plain text.
pub struct Path<T>(pub T);

impl<T, S> axum::extract::FromRequestParts<S> for Path<T>
where
    T: serde::de::DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(v)) => Ok(Path(v)),
            Err(e) => Err(ApiError::invalid(format!("bad path: {}", e.body_text()))),
        }
    }
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(st): State<AppState>) -> Response {
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

async fn metrics(State(st): State<AppState>) -> Response {
    pod_gauges(&st);
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        st.engine.render_metrics(),
    )
        .into_response()
}

fn pod_gauges(st: &AppState) {
    let m = st.engine.metrics();
    m.pod_members.set(st.pod.view().members.len() as i64);
    m.pod_etcd_up.set(st.pod.etcd_up() as i64);
    m.pod_etcd_last_ok.set(st.pod.etcd_last_ok());
    m.pod_member_records_rejected
        .set(st.pod.rejected_records() as i64);
}

/// The pod as this node sees it: members (each probed on `/healthz` and asked for its
/// `/v1/stats`, 1 s at most, all at once), where the membership comes from, and whether
/// etcd answers. Members are asked with the peer token, or else the caller's own.
async fn cluster(State(st): State<AppState>, h: HeaderMap) -> Json<ctxpod_wire::types::Cluster> {
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
async fn drain_start(State(st): State<AppState>) -> ApiResult<Response> {
    match st.drain.start() {
        Ok(s) => Ok((StatusCode::ACCEPTED, Json(s)).into_response()),
        Err(why) => Err(ApiError::new(StatusCode::CONFLICT, "cannot_drain", why)),
    }
}

async fn drain_status(State(st): State<AppState>) -> Json<DrainStatus> {
    Json(st.drain.status())
}

/// `DELETE /v1/admin/drain`: the node is up again.
async fn drain_cancel(State(st): State<AppState>) -> Json<DrainStatus> {
    Json(st.drain.cancel())
}

async fn stats(State(st): State<AppState>) -> Json<Stats> {
    Json(node_stats(&st))
}

/// This node's stats, with the requests in flight now and the request-latency histograms
/// (what `/v1/stats` answers).
pub(crate) fn node_stats(st: &AppState) -> Stats {
    let mut s = st.engine.stats();
    s.inflight_requests = (st.max_inflight - st.limiter.available_permits()) as u64;
    s.latency_bounds_s = ctxpod_engine::metrics::latency_buckets();
    s.latency = st.engine.metrics().latency_by_op();
    s
}

/// The node's miss-ratio curve (`ctxpod_plan::mrc`), read at 48 capacities from 16 blocks
/// to 4 times the node's capacity (log-spaced). `?scope=pod`: the pod's, merged from every
/// member's (`merge_pod_curves`).
async fn mrc(
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
fn node_mrc(st: &AppState) -> ApiResult<MrcResponse> {
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
fn curve_points(capacity_blocks: u64, block: u64, hit: impl Fn(f64) -> f64) -> Vec<MrcPoint> {
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

async fn list_namespaces(
    State(st): State<AppState>,
    Extension(p): Extension<Principal>,
) -> Json<NamespaceList> {
    Json(NamespaceList {
        namespaces: st
            .engine
            .namespaces()
            .into_iter()
            .filter(|n| p.unscope(&n.name).is_some())
            .map(|n| present(&p, n))
            .collect(),
    })
}

async fn put_namespace(
    State(st): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(ns): Path<String>,
    uri: axum::http::Uri,
    h: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    use ctxpod_pod::namespaces::{self as pns, NsRecord};
    let ns = scope(&p, &ns)?;
    let b = read_body(&h, body, JSON_BODY_BYTES_MAX).await?;
    let req: CreateNamespace = if b.iter().all(u8::is_ascii_whitespace) {
        CreateNamespace::default()
    } else {
        json_object(&b)?
    };
    if let Some(r) = req.replication {
        if !(1..=ctxpod_wire::REPLICATION_MAX).contains(&r) {
            return Err(ApiError::invalid(format!(
                "replication must be within 1..={}",
                ctxpod_wire::REPLICATION_MAX
            )));
        }
    }
    // A tenant's namespaces are bounded in number (a new one, asked by a client: a change
    // sent on by another member was bounded there).
    if let Some(max) = st.auth.namespaces_max(&p) {
        let new = st.engine.namespace(&ns).is_err() && routed_incarnation(&h)?.is_none();
        if new {
            let prefix = ns.split_once('/').map_or("", |(t, _)| t);
            let have = st
                .engine
                .namespaces()
                .iter()
                .filter(|n| n.name.split_once('/').is_some_and(|(t, _)| t == prefix))
                .count();
            if have >= max {
                st.auth.count_namespace_limit(&p);
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "namespace_limit",
                    format!("the tenant has {have} namespaces, its limit"),
                ));
            }
        }
    }
    let mut settings = NsSettings {
        quota_bytes: req.quota_bytes,
        replication: req.replication,
        incarnation: None,
    };
    let (created, info) = if let Some(inc) = routed_incarnation(&h)? {
        // A change another member made, sent on to this one.
        settings.incarnation = Some(inc);
        pns::apply(&st.engine, &ns, settings).await?
    } else if st.pod_wide() {
        // Made here for the whole pod: recorded in etcd, applied, sent to every member.
        let inc = match st.live_record(&ns).await? {
            Some(rec) => rec.incarnation,
            None => st
                .engine
                .namespace_incarnation(&ns)
                .flatten()
                .unwrap_or_else(pns::new_incarnation),
        };
        settings.incarnation = Some(inc);
        st.record_namespace(
            &ns,
            &NsRecord {
                quota_bytes: req.quota_bytes,
                replication: req.replication,
                incarnation: inc,
                deleted: false,
            },
        )
        .await?;
        let r = pns::apply(&st.engine, &ns, settings).await?;
        st.namespace_to_members(Method::PUT, &uri, &h, &p, b, inc)
            .await;
        r
    } else {
        st.engine.create_namespace_with(&ns, settings).await?
    };
    let info = present(&p, info);
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(info)).into_response())
}

async fn get_namespace(
    State(st): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(ns): Path<String>,
) -> ApiResult<Json<NamespaceInfo>> {
    let ns = scope(&p, &ns)?;
    Ok(Json(present(&p, st.engine.namespace(&ns)?)))
}

async fn delete_namespace(
    State(st): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(ns): Path<String>,
    uri: axum::http::Uri,
    h: HeaderMap,
) -> ApiResult<StatusCode> {
    use ctxpod_pod::namespaces::{self as pns, NsRecord};
    let ns = scope(&p, &ns)?;
    let is_default = ns == "default";
    if let Some(inc) = routed_incarnation(&h)? {
        // `default` comes back under the incarnation sent; another namespace's
        // incarnation `inc` is deleted.
        let (deleted, renewed) = if is_default {
            (None, Some(inc))
        } else {
            (Some(inc), None)
        };
        return match pns::apply_delete(&st.engine, &ns, deleted, renewed).await? {
            true => Ok(StatusCode::NO_CONTENT),
            false => Err(EngineError::NotFound(format!("namespace {ns:?} does not exist")).into()),
        };
    }
    if !st.pod_wide() {
        st.engine.delete_namespace(&ns).await?;
        return Ok(StatusCode::NO_CONTENT);
    }
    let held = st.engine.namespace_incarnation(&ns).ok_or_else(|| {
        ApiError::from(EngineError::NotFound(format!(
            "namespace {ns:?} does not exist"
        )))
    })?;
    let record = st.live_record(&ns).await?;
    // Recorded first, then applied here: this node's own reconcile, reading the record
    // again before it applies anything, can never bring back what was deleted.
    let rec = if is_default {
        // Emptied: it comes back at once, everywhere, under a new incarnation.
        NsRecord {
            quota_bytes: None,
            replication: None,
            incarnation: pns::new_incarnation(),
            deleted: false,
        }
    } else {
        NsRecord {
            quota_bytes: None,
            replication: None,
            incarnation: record
                .map(|r| r.incarnation)
                .or(held)
                .unwrap_or_else(pns::new_incarnation),
            deleted: true,
        }
    };
    st.record_namespace(&ns, &rec).await?;
    let sent = rec.incarnation;
    if is_default {
        pns::apply_delete(&st.engine, &ns, None, Some(sent)).await?;
    } else {
        pns::apply_delete(&st.engine, &ns, None, None).await?;
    }
    st.namespace_to_members(Method::DELETE, &uri, &h, &p, Bytes::new(), sent)
        .await;
    Ok(StatusCode::NO_CONTENT)
}

/// The namespace incarnation a member sent with a change it made (a routed request).
fn routed_incarnation(h: &HeaderMap) -> ApiResult<Option<u64>> {
    if !h.contains_key(ctxpod_pod::route::HEADER_FORWARDED) {
        return Ok(None);
    }
    match h.get(ctxpod_pod::namespaces::HEADER_NS_INCARNATION) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|&i| i != 0)
            .map(Some)
            .ok_or_else(|| ApiError::invalid("x-ctxpod-ns-incarnation must be a positive integer")),
    }
}

impl AppState {
    /// Whether a request here is answered for the whole pod: the node is in a pod of
    /// several and the request was not routed here by a member or a pod-aware client.
    fn answers_for_pod(&self, h: &HeaderMap) -> bool {
        self.pod.view().members.len() >= 2 && !h.contains_key(ctxpod_pod::route::HEADER_FORWARDED)
    }

    /// A per-key question asked of every member a read of each key would try, each member
    /// about its keys at once (`ask(member, key indexes)`, this node included): per key,
    /// whether any member said yes. A member answering `None` said no to all of its keys.
    async fn any_candidate<'m, F, Fut>(
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
        let n = ctxpod_pod::route::read_candidates(self.replication_of(scoped));
        let groups = pod_batch::group(
            keys.iter()
                .enumerate()
                .flat_map(|(i, k)| view.ranked(ns, k).into_iter().take(n).map(move |m| (i, m))),
        );
        let answers = futures::future::join_all(groups.into_values().map(|(m, idx)| {
            let asked = ask(m, idx.clone());
            async move { (idx, asked.await) }
        }))
        .await;
        let mut any = vec![false; keys.len()];
        for (idx, got) in answers {
            for (i, yes) in idx.into_iter().zip(got.unwrap_or_default()) {
                any[i] |= yes;
            }
        }
        any
    }

    /// Asks members on behalf of the caller `p` of this request.
    fn asker<'a>(
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
    fn pod_wide(&self) -> bool {
        self.ns_records.is_some() || self.pod.view().members.len() >= 2
    }

    /// The pod's live record of namespace `ns` (none without etcd, or once deleted).
    async fn live_record(&self, ns: &str) -> ApiResult<Option<ctxpod_pod::namespaces::NsRecord>> {
        let Some(r) = &self.ns_records else {
            return Ok(None);
        };
        let rec = ctxpod_pod::namespaces::record(&r.1, &r.0, ns)
            .await
            .map_err(|e| etcd_unavailable(&e))?;
        Ok(rec.filter(|r| !r.deleted))
    }

    /// Records a namespace change in etcd (with etcd); refused (503) while etcd is away.
    async fn record_namespace(
        &self,
        ns: &str,
        rec: &ctxpod_pod::namespaces::NsRecord,
    ) -> ApiResult<()> {
        let Some(r) = &self.ns_records else {
            return Ok(());
        };
        // A deletion is a tombstone: it expires with the pod's block tombstones
        // (`pod.tombstone_retention_s`), so etcd does not keep every deleted name forever.
        let lease = match (&self.tombstones, rec.deleted) {
            (Some(t), true) => Some(t.lease().await.map_err(|e| etcd_unavailable(&e))?),
            _ => None,
        };
        ctxpod_pod::namespaces::publish(&r.1, &r.0, ns, rec, lease)
            .await
            .map_err(|e| etcd_unavailable(&e))
    }

    /// Sends a namespace change made here to every other member, at once (10 s at most
    /// each), with the caller's credentials; a member that misses it catches up from etcd.
    async fn namespace_to_members(
        &self,
        method: Method,
        uri: &axum::http::Uri,
        h: &HeaderMap,
        caller: &Principal,
        body: Bytes,
        incarnation: u64,
    ) {
        let view = self.pod.view();
        let sends = view.members.iter().filter(|m| m.id != *self.node_id).map(|m| {
            let req = self
                .peers
                .http
                .request(method.clone(), format!("{}{}", m.http, uri.path()))
                .timeout(Duration::from_secs(10))
                .header(ctxpod_pod::route::HEADER_FORWARDED, self.node_id.as_ref())
                .header(
                    ctxpod_pod::namespaces::HEADER_NS_INCARNATION,
                    incarnation.to_string(),
                )
                .body(body.clone());
            let req = self.peers.for_caller(req, h, caller.tenant.as_deref());
            async move {
                match req.send().await {
                    Ok(r) if r.status().is_success() || r.status() == StatusCode::NOT_FOUND => {
                        count_forwarded(self, "namespace")
                    }
                    Ok(r) => {
                        tracing::warn!(member = %m.id, status = %r.status(), "a member refused a namespace change");
                        count_forwarded(self, "namespace_refused");
                    }
                    Err(e) => {
                        tracing::warn!(member = %m.id, "a namespace change did not reach a member: {e}");
                        count_forwarded(self, "unreachable");
                    }
                }
            }
        });
        futures::future::join_all(sends).await;
    }
}

fn etcd_unavailable(e: &anyhow::Error) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        format!("etcd cannot record the namespace change now: {e:#}"),
    )
}

async fn put_block(
    State(st): State<AppState>,
    Extension(p): Extension<Principal>,
    Path((ns, key)): Path<(String, String)>,
    h: HeaderMap,
    body: Body,
) -> ApiResult<StatusCode> {
    let ns = scope(&p, &ns)?;
    let key = parse_key(&key)?;
    let dur = durability(&h)?;
    let crc = match h.get(ctxpod_wire::HEADER_CRC32C) {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(ctxpod_wire::parse_crc32c_hex)
                .ok_or_else(|| ApiError::invalid("x-ctxpod-crc32c must be 8 hex digits"))?,
        ),
    };
    st.refuse_deleted_copy(&h, &ns, &key)?;
    let declared = content_length(&h);
    st.check_tenant_bytes(&p, declared.unwrap_or(0))?;
    let _permit = st.admit_body(
        declared
            .unwrap_or(ctxpod_wire::BLOCK_BYTES_MAX)
            .min(ctxpod_wire::BLOCK_BYTES_MAX),
    )?;
    let staged = match declared {
        // The common case: the body goes straight into the buffer its record is written from.
        Some(len) if len <= ctxpod_wire::BLOCK_BYTES_MAX => {
            let mut staged = StagedBlock::new(len)?;
            read_into(body, &mut staged).await?;
            staged
        }
        _ => StagedBlock::copy_of(&read_body(&h, body, ctxpod_wire::BLOCK_BYTES_MAX).await?)?,
    };
    st.engine
        .metrics()
        .received_bytes
        .inc_by(staged.len() as u64);
    match st.engine.put_staged(&ns, &key, staged, crc, dur).await? {
        PutStatus::Created => Ok(StatusCode::CREATED),
        PutStatus::Exists => Ok(StatusCode::OK),
    }
}

async fn get_block(
    State(st): State<AppState>,
    Extension(p): Extension<Principal>,
    Peer(peer): Peer,
    Path((ns, key)): Path<(String, String)>,
) -> ApiResult<Response> {
    let ns = scope(&p, &ns)?;
    let key = parse_key(&key)?;
    let not_found = || ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such block");
    // The block's bytes are taken from the egress budget before it is read, and given back
    // once the body is written out.
    let Some(len) = st.engine.block_len(&ns, &key)? else {
        return Err(not_found());
    };
    let permits = st.admit_egress(peer, len)?;
    match st.engine.get(&ns, &key).await? {
        Some((data, _)) if data.len() > len => Err(ApiError::busy(
            "the block was replaced while it was read; retry",
        )),
        Some((data, crc)) => {
            st.engine.metrics().sent_bytes.inc_by(data.len() as u64);
            Ok((
                [
                    (header::CONTENT_TYPE, "application/octet-stream".to_string()),
                    (
                        header::HeaderName::from_static(ctxpod_wire::HEADER_CRC32C),
                        ctxpod_wire::crc32c_hex(crc),
                    ),
                    (header::CONTENT_LENGTH, data.len().to_string()),
                ],
                body_holding(vec![data], permits),
            )
                .into_response())
        }
        None => Err(not_found()),
    }
}

/// The caller's address, when the listener gave it.
pub(crate) struct Peer(pub Option<std::net::IpAddr>);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Peer {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(Peer(
            parts
                .extensions
                .get::<axum::extract::ConnectInfo<crate::tls::PeerInfo>>()
                .map(|c| c.0.addr.ip()),
        ))
    }
}

/// Bytes of a body handed to hyper at a time: it asks for the next piece only once it has
/// room for it, so what a body holds is given back as its bytes leave.
const BODY_PIECE_BYTES: usize = 64 << 10;

/// A response body of `pieces` (cut into [`BODY_PIECE_BYTES`] slices, no copy) that holds
/// `permits` until its last piece is handed to the connection: a client that never reads
/// keeps its answer's share of the budgets, not more.
fn body_holding(pieces: Vec<Bytes>, permits: Vec<crate::budget::Permit>) -> Body {
    let mut slices = Vec::new();
    for p in pieces {
        let mut at = 0;
        while at < p.len() {
            let end = (at + BODY_PIECE_BYTES).min(p.len());
            slices.push(p.slice(at..end));
            at = end;
        }
    }
    let state = (slices.into_iter(), permits);
    Body::from_stream(futures::stream::unfold(
        state,
        |(mut it, permits)| async move {
            it.next()
                .map(|piece| (Ok::<_, std::convert::Infallible>(piece), (it, permits)))
        },
    ))
}

async fn head_block(
    State(st): State<AppState>,
    Extension(p): Extension<Principal>,
    Path((ns, key)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let ns = scope(&p, &ns)?;
    let key = parse_key(&key)?;
    if st.engine.contains(&ns, &key).await? {
        Ok(StatusCode::OK)
    } else {
        Ok(StatusCode::NOT_FOUND)
    }
}

async fn delete_block(
    State(st): State<AppState>,
    Extension(p): Extension<Principal>,
    Path((ns, key)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let ns = scope(&p, &ns)?;
    let key = parse_key(&key)?;
    if st.engine.delete(&ns, &key).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "no such block",
        ))
    }
}

async fn match_prefix(
    State(st): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(ns): Path<String>,
    h: HeaderMap,
    body: Body,
) -> ApiResult<Json<MatchResponse>> {
    let scoped = scope(&p, &ns)?;
    let req: KeysRequest = read_json(&h, body).await?;
    let keys = parse_keys(&req.keys, ctxpod_wire::MATCH_KEYS_MAX)?;
    let view = st.pod.view();
    if view.members.len() < 2 || h.contains_key(ctxpod_pod::route::HEADER_FORWARDED) {
        return Ok(Json(MatchResponse {
            matched: st.engine.match_prefix(&scoped, keys).await?,
        }));
    }
    // A chain whose blocks live on several members: each member is asked about its own
    // keys, all at once (`pod::forward::match_in_pod`).
    let n = ctxpod_pod::route::read_candidates(st.replication_of(&scoped));
    let cands: Vec<Vec<ctxpod_pod::membership::MemberInfo>> = keys
        .iter()
        .map(|k| view.ranked(&ns, k).into_iter().take(n).cloned().collect())
        .collect();
    let by_id: std::collections::HashMap<String, ctxpod_pod::membership::MemberInfo> = view
        .members
        .iter()
        .map(|m| (m.id.clone(), m.clone()))
        .collect();
    let matched = ctxpod_pod::route::match_in_pod(
        keys.len(),
        |i| cands[i].iter().map(|m| m.id.clone()).collect(),
        |member, idx| {
            let sub: Vec<Vec<u8>> = idx.iter().map(|&i| keys[i].clone()).collect();
            let (st, scoped, ns) = (st.clone(), scoped.clone(), ns.clone());
            let (h, p) = (h.clone(), p.clone());
            let m = by_id.get(&member).cloned();
            async move {
                let m = anyhow::Context::context(m, "a member of the view")?;
                if m.id == *st.node_id {
                    return Ok(st.engine.match_prefix(&scoped, sub).await?);
                }
                let req = st
                    .peers
                    .http
                    .post(format!("{}/v1/namespaces/{ns}/match", m.http))
                    .timeout(Duration::from_secs(10))
                    .header(ctxpod_pod::route::HEADER_FORWARDED, st.node_id.as_ref())
                    .json(&KeysRequest {
                        keys: sub.iter().map(hex::encode).collect(),
                    });
                match st
                    .peers
                    .for_caller(req, &h, p.tenant.as_deref())
                    .send()
                    .await
                {
                    Ok(r) if r.status().is_success() => {
                        Ok(r.json::<MatchResponse>().await?.matched)
                    }
                    // A member that cannot answer holds nothing as far as this match goes.
                    _ => Ok(0),
                }
            }
        },
    )
    .await
    .map_err(|e| {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            "pod_match",
            format!("MATCH across the pod failed: {e:#}"),
        )
    })?;
    Ok(Json(MatchResponse { matched }))
}

/// Whether each key is held: here, or in a pod by any member a read would try (each
/// member is asked about the keys it may hold, all at once; one that cannot answer holds
/// none of them).
async fn present_keys(
    State(st): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(ns): Path<String>,
    h: HeaderMap,
    body: Body,
) -> ApiResult<Json<PresentResponse>> {
    let scoped = scope(&p, &ns)?;
    let req: KeysRequest = read_json(&h, body).await?;
    let keys = parse_keys(&req.keys, ctxpod_wire::MATCH_KEYS_MAX)?;
    st.engine.namespace(&scoped)?;
    let local = |idx: Vec<usize>| {
        let (st, scoped, keys) = (&st, &scoped, &keys);
        async move {
            let mut out = Vec::with_capacity(idx.len());
            for i in idx {
                out.push(st.engine.contains(scoped, &keys[i]).await?);
            }
            Ok::<_, EngineError>(out)
        }
    };
    if !st.answers_for_pod(&h) {
        let present = local((0..keys.len()).collect()).await?;
        return Ok(Json(PresentResponse { present }));
    }
    let view = st.pod.view();
    let asker = st.asker(&ns, &h, &p);
    let present = st
        .any_candidate(&view, &ns, &scoped, &keys, |m, idx| {
            let (asker, keys, local, st) = (&asker, &keys, &local, &st);
            async move {
                if m.id == *st.node_id {
                    return local(idx).await.ok();
                }
                let ks: Vec<&[u8]> = idx.iter().map(|&i| &keys[i][..]).collect();
                asker.present(m, &ks).await.ok()
            }
        })
        .await;
    Ok(Json(PresentResponse { present }))
}

async fn batch_get(
    State(st): State<AppState>,
    Extension(p): Extension<Principal>,
    Peer(peer): Peer,
    Path(ns): Path<String>,
    h: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let scoped = scope(&p, &ns)?;
    let req: KeysRequest = read_json(&h, body).await?;
    let keys = parse_keys(&req.keys, ctxpod_wire::BATCH_ENTRIES_MAX)?;
    st.engine.namespace(&scoped)?;
    let room = match h.get(ctxpod_wire::HEADER_ANSWER_BYTES_MAX) {
        None => BATCH_GET_BYTES_MAX,
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| ApiError::invalid("x-ctxpod-answer-bytes-max must be a number"))?
            .min(BATCH_GET_BYTES_MAX as u64) as usize,
    };
    let (results, permits) = if st.answers_for_pod(&h) {
        pod_batch_get(&st, peer, &p, &ns, &scoped, &h, &keys, room).await
    } else {
        admitted_batch_get(&st, Some(peer), &scoped, &keys, room).await
    };
    let mut budget = BATCH_GET_BYTES_MAX;
    let mut out = Vec::new();
    frame::encode_header(results.len() as u32, &mut out);
    let mut sent = 0u64;
    for (k, g) in keys.iter().zip(&results) {
        let fits = g.data.as_ref().filter(|d| d.len() <= budget);
        if let Some(d) = fits {
            budget -= d.len();
            sent += d.len() as u64;
        }
        let over = g.status == 200 && fits.is_none();
        frame::encode_entry(
            &frame::Entry {
                key: k,
                status: if over { 413 } else { g.status },
                crc32c: g.crc32c,
                len: g.len,
                data: fits.map(|d| &d[..]),
            },
            &mut out,
        );
    }
    drop(results);
    st.engine.metrics().sent_bytes.inc_by(sent);
    // The frame holds the answer's egress share until it is written out.
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (header::CONTENT_LENGTH, out.len().to_string()),
        ],
        body_holding(vec![Bytes::from(out)], permits),
    )
        .into_response())
}

/// A `batch/get` served here: blocks admitted in order while they fit the answer
/// ([`BATCH_GET_BYTES_MAX`]) and the node's egress budget, each taken before the read; only
/// admitted blocks are read, the others answer 413 (the answer is full: ask again for
/// them) or 503 (busy) without costing anything.
///
/// `charge`: `Some(peer)` takes each block from the egress budget (the caller's address's
/// share and the node's); `None` when the caller reserved the room already (a pod batch's
/// own part).
async fn admitted_batch_get(
    st: &AppState,
    charge: Option<Option<std::net::IpAddr>>,
    scoped: &str,
    keys: &[Vec<u8>],
    mut room: usize,
) -> (Vec<pod_batch::Got>, Vec<crate::budget::Permit>) {
    let mut permits = Vec::new();
    let mut busy = 0u64;
    let plan: Vec<Result<usize, u16>> = keys
        .iter()
        .map(|k| match st.engine.block_len(scoped, k) {
            Err(e) => Err(status_of(&e).0.as_u16()),
            Ok(None) => Err(404),
            Ok(Some(len)) if len > room => Err(413),
            Ok(Some(len)) => match charge.map(|peer| st.budgets.take_egress(peer, len)) {
                None => {
                    room -= len;
                    Ok(len)
                }
                Some(Some(p)) => {
                    room -= len;
                    permits.extend(p);
                    Ok(len)
                }
                Some(None) => {
                    busy += 1;
                    Err(503)
                }
            },
        })
        .collect();
    if busy > 0 {
        st.engine
            .metrics()
            .busy_rejections
            .with_label_values(&["egress"])
            .inc_by(busy);
    }
    let admitted: Vec<&[u8]> = keys
        .iter()
        .zip(&plan)
        .filter(|(_, p)| p.is_ok())
        .map(|(k, _)| &k[..])
        .collect();
    let mut read = local_batch_get(st, scoped, &admitted).await.into_iter();
    let refused = |status| pod_batch::Got {
        status,
        crc32c: None,
        len: 0,
        data: None,
    };
    let got = plan
        .iter()
        .map(|p| match p {
            Ok(len) => match read.next() {
                // Stored again, larger, since it was admitted: ask again.
                Some(g) if g.data.as_ref().is_some_and(|d| d.len() > *len) => refused(503),
                Some(g) => g,
                None => refused(500),
            },
            Err(st) => refused(*st),
        })
        .collect();
    (got, permits)
}

/// This node's answers to a `batch/get` of `keys`.
async fn local_batch_get(st: &AppState, scoped: &str, keys: &[&[u8]]) -> Vec<pod_batch::Got> {
    // Owned keys: the stream's futures may not borrow from the closure's argument.
    let owned: Vec<Vec<u8>> = keys.iter().map(|k| k.to_vec()).collect();
    futures::stream::iter(owned.into_iter().map(|k| {
        let (engine, ns) = (st.engine.clone(), scoped.to_string());
        async move {
            match engine.get(&ns, &k).await {
                Ok(Some((d, crc))) => pod_batch::Got {
                    status: 200,
                    crc32c: Some(crc),
                    len: d.len() as u32,
                    data: Some(d),
                },
                Ok(None) => pod_batch::Got {
                    status: 404,
                    crc32c: None,
                    len: 0,
                    data: None,
                },
                Err(e) => pod_batch::Got {
                    status: status_of(&e).0.as_u16(),
                    crc32c: None,
                    len: 0,
                    data: None,
                },
            }
        }
    }))
    .buffered(BATCH_CONCURRENCY)
    .collect()
    .await
}

/// A `batch/get` for the whole pod (`pod::batch`): each key at its candidates in rank
/// order, one round per rank, each round's members asked at once.
///
/// Admitted before it is fetched: each round splits the answer's room left (at most
/// `room`, 64 MiB) among the members it asks (a block's worth each at least; members
/// beyond that are not asked and their keys answer 413), takes each share from the egress budget
/// before asking (a share it cannot have answers 503), tells each member its share
/// (`x-ctxpod-answer-bytes-max`; blocks beyond answer 413, as do blocks a member sends
/// beyond it), and gives back what the answers did not use. This node's own part is
/// admitted block by block within its share. So a pod batch holds at most `room` bytes of
/// blocks, whatever the members hold.
#[allow(clippy::too_many_arguments)]
async fn pod_batch_get(
    st: &AppState,
    peer: Option<std::net::IpAddr>,
    p: &Principal,
    ns: &str,
    scoped: &str,
    h: &HeaderMap,
    keys: &[Vec<u8>],
    mut room: usize,
) -> (Vec<pod_batch::Got>, Vec<crate::budget::Permit>) {
    let refused = |status| pod_batch::Got {
        status,
        crc32c: None,
        len: 0,
        data: None,
    };
    let mut held: Vec<crate::budget::Permit> = Vec::new();
    let view = st.pod.view();
    let n = ctxpod_pod::route::read_candidates(st.replication_of(scoped));
    let ranked: Vec<Vec<&ctxpod_pod::membership::MemberInfo>> = keys
        .iter()
        .map(|k| view.ranked(ns, k).into_iter().take(n).collect())
        .collect();
    let asker = st.asker(ns, h, p);
    let mut out: Vec<Option<pod_batch::Got>> = vec![None; keys.len()];
    for round in 0..n {
        let groups = pod_batch::group(
            (0..keys.len())
                .filter(|&i| out[i].is_none() && ranked[i].len() > round)
                .map(|i| (i, ranked[i][round])),
        );
        if groups.is_empty() {
            break;
        }
        // Every share holds a whole block at least, so a batch always makes progress: the
        // members that do not fit this answer's room are not asked (their keys answer 413:
        // ask again).
        let share = (room / groups.len()).max(ctxpod_wire::BLOCK_BYTES_MAX.min(room));
        let fit = room.checked_div(share).unwrap_or(0);
        let mut asks = Vec::new();
        for (g, (m, idx)) in groups.into_values().enumerate() {
            if g >= fit {
                for i in idx {
                    out[i] = Some(refused(413));
                }
                continue;
            }
            match st.budgets.take_egress(peer, share.max(1)) {
                Some(permits) => asks.push((m, idx, permits)),
                None => {
                    st.engine
                        .metrics()
                        .busy_rejections
                        .with_label_values(&["egress"])
                        .inc_by(idx.len() as u64);
                    for i in idx {
                        out[i] = Some(refused(503));
                    }
                }
            }
        }
        let answers = futures::future::join_all(asks.into_iter().map(|(m, idx, permits)| {
            let asker = &asker;
            async move {
                let r = if m.id == *st.node_id {
                    let ks: Vec<Vec<u8>> = idx.iter().map(|&i| keys[i].clone()).collect();
                    Ok(admitted_batch_get(st, None, scoped, &ks, share).await.0)
                } else {
                    let ks: Vec<&[u8]> = idx.iter().map(|&i| &keys[i][..]).collect();
                    asker.batch_get(m, &ks, share).await
                };
                (idx, r, permits)
            }
        }))
        .await;
        for (idx, r, mut permits) in answers {
            let mut used = 0usize;
            match r {
                Ok(got) => {
                    for (i, mut g) in idx.into_iter().zip(got) {
                        let len = g.data.as_ref().map_or(0, |d| d.len());
                        if used + len > share {
                            // Over the share the member was given: not kept.
                            g = refused(413);
                        } else {
                            used += len;
                        }
                        // A miss here may be a hit at the next candidate.
                        if g.status != 404 {
                            out[i] = Some(g);
                        }
                    }
                }
                // Unreachable, or without the namespace: the next candidate is asked.
                Err(None) | Err(Some(404)) => {}
                Err(Some(status)) => {
                    for i in idx {
                        out[i] = Some(refused(status));
                    }
                }
            }
            // What the answer did not use goes back to the budget.
            for permit in &mut permits {
                drop(permit.split(share.max(1) - used.min(share.max(1))));
            }
            if used > 0 {
                held.extend(permits);
            }
            room -= used;
        }
    }
    let got = out
        .into_iter()
        .map(|g| g.unwrap_or_else(|| refused(404)))
        .collect();
    (got, held)
}

async fn batch_put(
    State(st): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(ns): Path<String>,
    h: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let scoped = scope(&p, &ns)?;
    let dur = durability(&h)?;
    st.engine.namespace(&scoped)?;
    let declared = content_length(&h);
    st.check_tenant_bytes(&p, declared.unwrap_or(0))?;
    // Room for the frame and for each block's staged copy.
    let budget = 2 * declared
        .unwrap_or(ctxpod_wire::BATCH_BODY_BYTES_MAX)
        .min(ctxpod_wire::BATCH_BODY_BYTES_MAX);
    let _permit = st.admit_body(budget)?;
    let body = read_body(&h, body, ctxpod_wire::BATCH_BODY_BYTES_MAX).await?;
    let entries =
        frame::decode(&body).map_err(|e| ApiError::invalid(format!("bad batch frame: {e}")))?;
    let mut jobs = Vec::with_capacity(entries.len());
    for (i, e) in entries.iter().enumerate() {
        let Some(d) = e.data else {
            return Err(ApiError::invalid(format!(
                "batch entry {i} carries no data"
            )));
        };
        if d.len() != e.len as usize {
            return Err(ApiError::invalid(format!(
                "batch entry {i}: length mismatch"
            )));
        }
        jobs.push((e.key.to_vec(), body.slice_ref(d), e.crc32c));
    }
    st.engine.metrics().received_bytes.inc_by(body.len() as u64);
    let statuses = if st.answers_for_pod(&h) {
        pod_batch_put(&st, &p, &ns, &scoped, &h, &jobs, dur).await
    } else {
        // Copies of blocks the pod deleted are refused one by one (410); the rest stored.
        let mut statuses = vec![0u16; jobs.len()];
        let mut store = Vec::with_capacity(jobs.len());
        for (i, (k, _, _)) in jobs.iter().enumerate() {
            match st.refuse_deleted_copy(&h, &scoped, k) {
                Ok(()) => store.push(i),
                Err(e) => statuses[i] = e.status.as_u16(),
            }
        }
        for (i, s) in store
            .iter()
            .zip(local_batch_put(&st, &scoped, &jobs, &store, dur).await)
        {
            statuses[*i] = s;
        }
        statuses
    };
    let mut out = Vec::new();
    frame::encode_header(jobs.len() as u32, &mut out);
    for ((k, d, _), status) in jobs.iter().zip(statuses) {
        frame::encode_entry(
            &frame::Entry {
                key: k,
                status,
                crc32c: Some(ctxpod_wire::crc32c(d)),
                len: d.len() as u32,
                data: None,
            },
            &mut out,
        );
    }
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], out).into_response())
}

/// A block of a `batch/put`: key, bytes, the CRC32C the client gave.
type PutJob = (Vec<u8>, Bytes, Option<u32>);

/// This node stores `jobs[idx]`: per block, its status.
async fn local_batch_put(
    st: &AppState,
    scoped: &str,
    jobs: &[PutJob],
    idx: &[usize],
    dur: Durability,
) -> Vec<u16> {
    futures::future::join_all(idx.iter().map(|&i| {
        let (k, d, crc) = &jobs[i];
        let engine = st.engine.clone();
        async move {
            match engine.put(scoped, k, d.clone(), *crc, dur).await {
                Ok(PutStatus::Created) => 201,
                Ok(PutStatus::Exists) => 200,
                Err(e) => status_of(&e).0.as_u16(),
            }
        }
    }))
    .await
}

/// A `batch/put` for the whole pod (`pod::batch`): each block to its R first-ranked
/// members that can be reached, the members of a round asked at once.
async fn pod_batch_put(
    st: &AppState,
    p: &Principal,
    ns: &str,
    scoped: &str,
    h: &HeaderMap,
    jobs: &[PutJob],
    dur: Durability,
) -> Vec<u16> {
    let view = st.pod.view();
    let copies = st.replication_of(scoped);
    let ranked: Vec<Vec<&ctxpod_pod::membership::MemberInfo>> =
        jobs.iter().map(|(k, _, _)| view.ranked(ns, k)).collect();
    let asker = st.asker(ns, h, p);
    let mut states = vec![pod_batch::PutState::default(); jobs.len()];
    loop {
        let mut assign = Vec::new();
        for (i, s) in states.iter_mut().enumerate() {
            for m in s.next_members(&ranked[i], copies) {
                assign.push((i, m));
            }
        }
        if assign.is_empty() {
            break;
        }
        let answers =
            futures::future::join_all(pod_batch::group(assign).into_values().map(|(m, idx)| {
                let asker = &asker;
                async move {
                    let r = if m.id == *st.node_id {
                        Ok(local_batch_put(st, scoped, jobs, &idx, dur).await)
                    } else {
                        let blocks: Vec<(&[u8], &Bytes)> =
                            idx.iter().map(|&i| (&jobs[i].0[..], &jobs[i].1)).collect();
                        asker
                            .batch_put(m, &blocks, h.get(ctxpod_wire::HEADER_DURABILITY))
                            .await
                    };
                    (idx, r)
                }
            }))
            .await;
        for (idx, r) in answers {
            match r {
                Ok(statuses) => {
                    for (i, s) in idx.into_iter().zip(statuses) {
                        states[i].answer(s);
                    }
                }
                Err(Some(s)) => idx.into_iter().for_each(|i| states[i].answer(s)),
                // Unreachable: the next round asks the next member in rank order.
                Err(None) => {}
            }
        }
    }
    states.iter().map(|s| s.status(copies)).collect()
}

/// Makes a new data key current for the namespace (older records stay readable).
async fn rotate_key(
    State(st): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(ns): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    let ns = scope(&p, &ns)?;
    let key_id = st.engine.rotate_data_key(&ns).await?;
    Ok(Json(
        serde_json::json!({ "namespace": ns, "key_id": key_id }),
    ))
}

/// Re-reads the KEK file and, if it changed, re-wraps every data key under the new KEK.
async fn rotate_kek(State(st): State<AppState>) -> ApiResult<Json<serde_json::Value>> {
    let n = st.engine.rotate_kek().await?;
    Ok(Json(serde_json::json!({ "rewrapped": n })))
}

/// KV events of a namespace as server-sent events: `stored`, `evicted` and `deleted` with
/// `{"key": "<hex>"}`, `lost` with `{"count": n}` when this subscriber fell behind (resync
/// with MATCH), and a last `namespace-deleted` when the namespace goes.
async fn events(
    State(st): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(ns): Path<String>,
) -> ApiResult<
    axum::response::sse::Sse<
        impl futures::Stream<Item = Result<axum::response::sse::Event, std::convert::Infallible>>,
    >,
> {
    use axum::response::sse::{Event, KeepAlive, Sse};
    use ctxpod_engine::events::KvEventKind;
    use tokio::sync::broadcast::error::RecvError;
    let ns = scope(&p, &ns)?;
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

async fn pin(
    State(st): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(ns): Path<String>,
    h: HeaderMap,
    body: Body,
) -> ApiResult<Json<PinResponse>> {
    let scoped = scope(&p, &ns)?;
    let req: PinRequest = read_json(&h, body).await?;
    if req.ttl_ms == 0 || req.ttl_ms > ctxpod_wire::LEASE_MS_MAX {
        return Err(ApiError::invalid(format!(
            "ttl_ms must be within 1..={}",
            ctxpod_wire::LEASE_MS_MAX
        )));
    }
    let keys = parse_keys(&req.keys, ctxpod_wire::BATCH_ENTRIES_MAX)?;
    let (pinned, each) = pin_or_unpin(&st, &p, &ns, &scoped, &h, keys, Some(req.ttl_ms)).await?;
    Ok(Json(PinResponse { pinned, each }))
}

async fn unpin(
    State(st): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(ns): Path<String>,
    h: HeaderMap,
    body: Body,
) -> ApiResult<Json<UnpinResponse>> {
    let scoped = scope(&p, &ns)?;
    let req: KeysRequest = read_json(&h, body).await?;
    let keys = parse_keys(&req.keys, ctxpod_wire::BATCH_ENTRIES_MAX)?;
    let (unpinned, each) = pin_or_unpin(&st, &p, &ns, &scoped, &h, keys, None).await?;
    Ok(Json(UnpinResponse { unpinned, each }))
}

/// Pins (`ttl_ms` given) or unpins `keys`: here, or at every candidate member of each key
/// in a pod (`pod::batch`). How many keys were, and per key whether it was when the
/// request was routed here by another member.
async fn pin_or_unpin(
    st: &AppState,
    p: &Principal,
    ns: &str,
    scoped: &str,
    h: &HeaderMap,
    keys: Vec<Vec<u8>>,
    ttl_ms: Option<u64>,
) -> ApiResult<(u64, Option<Vec<bool>>)> {
    let local = |ks: Vec<Vec<u8>>| async move {
        match ttl_ms {
            Some(t) => {
                st.engine
                    .pin_each(scoped, ks, Duration::from_millis(t))
                    .await
            }
            None => st.engine.unpin_each(scoped, ks).await,
        }
    };
    let count = |each: &[bool]| each.iter().filter(|b| **b).count() as u64;
    if !st.answers_for_pod(h) {
        let each = local(keys).await?;
        let routed = h.contains_key(ctxpod_pod::route::HEADER_FORWARDED);
        return Ok((count(&each), routed.then_some(each)));
    }
    st.engine.namespace(scoped)?;
    let view = st.pod.view();
    let asker = st.asker(ns, h, p);
    // A member that cannot answer holds no copy that this changes.
    let each = st
        .any_candidate(&view, ns, scoped, &keys, |m, idx| {
            let (asker, keys, local) = (&asker, &keys, &local);
            async move {
                if m.id == *st.node_id {
                    return local(idx.iter().map(|&i| keys[i].clone()).collect())
                        .await
                        .ok();
                }
                let ks: Vec<&[u8]> = idx.iter().map(|&i| &keys[i][..]).collect();
                asker.pin(m, &ks, ttl_ms).await.ok()
            }
        })
        .await;
    Ok((count(&each), None))
}

/// Runs a node until SIGTERM or Ctrl-C, then stops accepting, drains and commits.
pub async fn serve(cfg: Config) -> anyhow::Result<()> {
    use anyhow::Context;
    let metrics = Arc::new(Metrics::new());
    let auth = Arc::new(Authenticator::new(&cfg, metrics.clone())?);
    let engine = Arc::new(Engine::open(cfg.clone(), metrics).await?);
    if auth.enabled() {
        tracing::info!("authentication is on: every request needs a token or a client certificate");
    } else {
        tracing::warn!(
            "authentication is OFF: every client is an admin of this node (allowed on loopback; \
             configure auth tokens or identities to turn it on)"
        );
    }
    let tls = crate::tls::Tls::load(&cfg.tls, engine.metrics().clone())?;
    match &tls {
        Some(t) => {
            tracing::info!(
                mtls = cfg.tls.client_ca_file.is_some(),
                "TLS on both listeners (files re-read on SIGHUP and on change)"
            );
            tokio::spawn(t.clone().watch());
        }
        None => tracing::warn!(
            "TLS is off: plain TCP (allowed on loopback, or with tls.allow_plaintext)"
        ),
    }
    tokio::spawn(reload_on_sighup(auth.clone(), tls.clone()));
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("listen on {}", cfg.listen))?;
    let addr = listener.local_addr()?;
    let addr_file = cfg.data_dir.join("ctxpod.addr");
    let tmp = cfg.data_dir.join("ctxpod.addr.tmp");
    tracing::info!(%addr, engine = engine.io_engine(), "ctxpod serving HTTP API v1");
    let scheme = if cfg.tls.enabled() { "https" } else { "http" };
    println!("ctxpod listening on {scheme}://{addr}");
    let budgets = crate::budget::Budgets::from_config(&cfg);
    let handshakes = crate::conn::Handshakes::new(cfg.tls_handshakes_max);
    let transfer = match cfg.transfer_listen {
        Some(at) => {
            let l = tokio::net::TcpListener::bind(at)
                .await
                .with_context(|| format!("transfer listener on {at}"))?;
            let taddr = l.local_addr()?;
            let f = cfg.data_dir.join("ctxpod.transfer.addr");
            std::fs::write(&tmp, format!("{taddr}\n"))?;
            std::fs::rename(&tmp, &f)?;
            tracing::info!(addr = %taddr, "ctxpod serving the CXP1 transfer protocol");
            Some(tokio::spawn(crate::transfer::serve(
                l,
                engine.clone(),
                auth.clone(),
                tls.clone(),
                budgets.clone(),
                crate::conn::Gate::new(
                    "transfer",
                    crate::conn::Limits::from_config(&cfg),
                    engine.metrics().clone(),
                ),
                handshakes.clone(),
            )))
        }
        None => None,
    };
    let taddr = match cfg.transfer_listen {
        Some(_) => std::fs::read_to_string(cfg.data_dir.join("ctxpod.transfer.addr"))
            .ok()
            .and_then(|s| s.trim().parse().ok()),
        None => None,
    };
    let pod = ctxpod_pod::Pod::join(&cfg, addr, taddr, &engine).await?;
    pod.start_background(engine.clone(), &cfg, auth.enabled());
    let app = router(
        engine.clone(),
        auth.clone(),
        cfg.max_inflight_requests,
        budgets,
        &pod,
    );
    // The HTTP address is published last: once it is there, both listeners serve.
    std::fs::write(&tmp, format!("{addr}\n"))?;
    std::fs::rename(&tmp, &addr_file)?;
    let limits = crate::conn::Limits::from_config(&cfg);
    let gate = crate::conn::Gate::new("http", limits.clone(), engine.metrics().clone());
    let (conns, accepting) = crate::tls::accept_loop(listener, tls, gate, handshakes);
    crate::conn::serve_http(conns, app, limits.header_read, shutdown_signal()).await;
    accepting.abort();
    if let Some(t) = transfer {
        t.abort();
    }
    pod.leave().await;
    tracing::info!("shutting down: committing queued writes");
    engine.shutdown().await;
    let _ = std::fs::remove_file(&addr_file);
    Ok(())
}

/// Re-reads credentials (and TLS files) on SIGHUP; a bad reload keeps what was loaded.
async fn reload_on_sighup(auth: Arc<Authenticator>, tls: Option<Arc<crate::tls::Tls>>) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        return;
    };
    while hup.recv().await.is_some() {
        if let Some(t) = &tls {
            match t.reload() {
                Ok(()) => tracing::info!("SIGHUP: TLS certificate, key and client CA reloaded"),
                Err(e) => {
                    tracing::error!("SIGHUP: TLS files not reloaded, keeping the old ones: {e:#}")
                }
            }
        }
        match auth.reload() {
            Ok(n) => tracing::info!(tokens = n, "SIGHUP: credentials reloaded"),
            Err(e) => {
                tracing::error!("SIGHUP: credentials not reloaded, keeping the old ones: {e}")
            }
        }
    }
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pod's curve: each member at its share of the pod's capacity, weighted by its
    /// references; the pod's rate is the members' sum.
    #[test]
    fn pod_curves_merge_by_capacity_share_and_references() {
        let node = |cap: u64, refs: u64, knee: u64| MrcResponse {
            sample_rate: 0.01,
            tracked_keys: 10,
            references: refs,
            mean_block_bytes: 4096,
            capacity_blocks: cap,
            references_per_s: refs as f64 / 10.0,
            // Hit ratio 0 below `knee` blocks, 0.5 from it on.
            points: curve_points(cap, 4096, |c| if c >= knee as f64 { 0.5 } else { 0.0 }),
        };
        // Two equal members with the same curve: the pod at twice the capacity is the same
        // curve stretched by two.
        let m = merge_pod_curves(&[node(1000, 100, 500), node(1000, 100, 500)]);
        assert_eq!((m.capacity_blocks, m.references), (2000, 200));
        for p in &m.points {
            let want = if p.capacity_blocks >= 1100 {
                0.5
            } else if p.capacity_blocks < 900 {
                0.0
            } else {
                continue;
            };
            assert!((p.hit_ratio - want).abs() < 1e-9, "{p:?}");
        }
        // A member with three times the references weighs three times as much.
        let m = merge_pod_curves(&[node(1000, 300, 100), node(1000, 100, 100_000)]);
        let top = m.points.iter().find(|p| p.capacity_blocks >= 1000).unwrap();
        assert!((top.hit_ratio - 0.375).abs() < 1e-9, "{top:?}");
        assert!((m.references_per_s - 40.0).abs() < 1e-9);
    }

    /// The router's routes equal the OpenAPI document's operations.
    #[test]
    fn routes_equal_the_openapi_spec() {
        let spec: serde_json::Value =
            serde_json::from_str(ctxpod_wire::OPENAPI_JSON).expect("openapi.json parses");
        let mut from_spec: Vec<(String, String)> = Vec::new();
        for (path, item) in spec["paths"].as_object().expect("paths") {
            for m in ["get", "put", "post", "delete", "head", "patch", "options"] {
                if item.get(m).is_some() {
                    from_spec.push((m.to_uppercase(), path.clone()));
                }
            }
        }
        let mut from_router: Vec<(String, String)> = routes()
            .list
            .iter()
            .map(|(m, p)| (m.to_string(), p.to_string()))
            .collect();
        from_spec.sort();
        from_router.sort();
        assert_eq!(from_router, from_spec);
    }

    /// Every route says what access it needs; only the probes are public.
    #[test]
    fn every_route_has_an_access_rule() {
        for (m, p) in routes().list {
            let a = access_of(&m, p).unwrap_or_else(|| panic!("{m} {p} has no access rule"));
            assert_eq!(
                a == Access::Public,
                p == "/healthz" || p == "/readyz" || p.starts_with("/ui"),
                "{m} {p}"
            );
        }
    }
}
