//! The middleware every request passes, in order (`routes::router` layers them): admission
//! and measurement ([`admit_and_measure`]), authentication ([`authenticate`]) with
//! authorisation by route ([`access_of`]) and the tenant's rate, then pod routing
//! ([`route_in_pod`]: a block this node does not hold is forwarded).

use crate::auth::{Access, AuthError, Limited, Principal};
use crate::metrics::NodeMetrics;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use ctxpod_wire::pod_plan::WritePlan;
use std::sync::Arc;
use std::time::Instant;

use super::routed::{count_forwarded, refused, OverHttp};
use super::state::AppState;
use crate::errors::ApiError;
use ctxpod_pod::coordinator::Placed;

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
    let coordinator = st.coordinator();
    // A pod of one (the default) pays one look at the view, nothing more.
    let view = st.pod.view();
    if !coordinator.may_route(&view, req.method())
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
    let Some((ns, key)) = forward::block_of(req.uri().path()) else {
        return next.run(req).await;
    };
    let scoped = req
        .extensions()
        .get::<Principal>()
        .and_then(|p| p.scope(ns).ok());
    // The namespace's own replication, if it sets one.
    let r = scoped
        .as_ref()
        .map_or(st.replication, |scoped| st.replication_of(scoped));
    let route = coordinator.route(&view, req.method(), ns, &key, r);
    let ns = ns.to_string();
    match route {
        Route::Local => next.run(req).await,
        Route::Read { copies } => {
            let (parts, _) = req.into_parts();
            let member = OverHttp {
                st: &st,
                parts: &parts,
                body: None,
                next: &next,
                outcome: "read",
            };
            let answer = coordinator.read(&view, &ns, &key, copies, &member).await;
            answer.unwrap_or_else(|| {
                count_forwarded(&st, "read_miss");
                ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such block").into_response()
            })
        }
        Route::Write { .. } | Route::Delete { .. } => {
            let plan = coordinator.write_plan(&view, route, &ns, &key);
            let plan = plan.expect("a write route");
            let copies = match route {
                Route::Delete { copies } => copies,
                _ => 0,
            };
            let placed = Placed {
                ns: &ns,
                key: &key,
                copies,
                stored_ns: scoped.as_deref(),
            };
            write_in_pod(&st, &view, req, next, plan, placed).await
        }
    }
}

/// A routed put or delete: the body held (within the ingest budget) so that it can go to
/// several members at once, or to the next one if a member cannot be reached; the pod's
/// rules (the plan, a delete's tombstone and settling) are the coordinator's
/// ([`ctxpod_pod::coordinator::Coordinator::write`]). A value over one record is streamed
/// instead ([`super::pod_values`]).
async fn write_in_pod(
    st: &AppState,
    view: &ctxpod_pod::membership::PodView,
    req: Request,
    next: Next,
    plan: WritePlan,
    placed: Placed<'_>,
) -> Response {
    if let Some(len) = large_put(&req) {
        let block = placed.stored_ns.map(|ns| (ns, placed.key));
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
    let member = OverHttp {
        st,
        parts: &parts,
        body: Some(&body),
        next: &next,
        outcome: "write",
    };
    match st.coordinator().write(view, plan, placed, &member).await {
        Ok(answer) => answer,
        Err(refusal) => refused(refusal),
    }
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
