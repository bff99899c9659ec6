//! The route table: [`routes`] lists every operation of `api/openapi.json` with its
//! handler (a test compares the two), and [`router`] builds the axum router from it with
//! the middleware in order.

use crate::auth::Authenticator;
use axum::handler::Handler;
use axum::http::{Method, StatusCode};
use axum::middleware::{self};
use axum::routing::{MethodFilter, MethodRouter};
use axum::Router;
use ctxpod_engine::Engine;
use std::sync::Arc;
use tokio::sync::Semaphore;

use super::admin::{rotate_kek, rotate_key};
use super::batch::{batch_get, batch_put, pin, promote, unpin};
use super::blocks::{
    delete_block, get_block, head_block, list_blocks, match_prefix, present_keys, put_block,
};
use super::middleware::{admit_and_measure, authenticate, route_in_pod};
use super::namespaces::{delete_namespace, get_namespace, list_namespaces, put_namespace};
use super::observe::{
    cluster, drain_cancel, drain_start, drain_status, events, healthz, metrics, mrc, readyz,
    repair_start, repair_status, stats,
};
use super::state::AppState;
use crate::errors::ApiError;

/// The route table: every (method, path) the node answers, and the router built from it.
pub struct Routes<S> {
    pub list: Vec<(Method, &'static str)>,
    routers: Vec<(&'static str, MethodRouter<S>)>,
}

impl<S: Clone + Send + Sync + 'static> Routes<S> {
    pub(crate) fn new() -> Self {
        Routes {
            list: Vec::new(),
            routers: Vec::new(),
        }
    }

    pub(crate) fn add<H, T>(mut self, method: Method, path: &'static str, handler: H) -> Self
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

    pub(crate) fn into_router(self) -> Router<S> {
        self.routers
            .into_iter()
            .fold(Router::new(), |r, (path, mr)| r.route(path, mr))
    }
}

/// HTTP API v1.
pub fn routes() -> Routes<AppState> {
    use Method as M;
    const BLOCK: &str = "/v1/namespaces/{ns}/blocks/{key}";
    const UPLOADS: &str = "/v1/namespaces/{ns}/blocks/{key}/uploads";
    const UPLOAD: &str = "/v1/namespaces/{ns}/blocks/{key}/uploads/{upload}";
    const PART: &str = "/v1/namespaces/{ns}/blocks/{key}/uploads/{upload}/parts/{part}";
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
        .add(M::GET, "/v1/namespaces/{ns}/blocks", list_blocks)
        .add(M::PUT, BLOCK, put_block)
        .add(M::GET, BLOCK, get_block)
        .add(M::HEAD, BLOCK, head_block)
        .add(M::DELETE, BLOCK, delete_block)
        .add(M::POST, UPLOADS, super::uploads::create_upload)
        .add(M::POST, UPLOAD, super::uploads::complete_upload)
        .add(M::GET, UPLOAD, super::uploads::list_parts)
        .add(M::DELETE, UPLOAD, super::uploads::abort_upload)
        .add(M::PUT, PART, super::uploads::upload_part)
        .add(
            M::GET,
            "/v1/namespaces/{ns}/uploads",
            super::uploads::list_uploads,
        )
        .add(M::POST, "/v1/namespaces/{ns}/match", match_prefix)
        .add(M::POST, "/v1/namespaces/{ns}/present", present_keys)
        .add(M::POST, "/v1/namespaces/{ns}/batch/get", batch_get)
        .add(M::POST, "/v1/namespaces/{ns}/batch/put", batch_put)
        .add(M::POST, "/v1/namespaces/{ns}/pin", pin)
        .add(M::POST, "/v1/namespaces/{ns}/unpin", unpin)
        .add(M::POST, "/v1/namespaces/{ns}/promote", promote)
        .add(M::GET, "/v1/namespaces/{ns}/events", events)
        .add(M::POST, "/v1/namespaces/{ns}/rotate-key", rotate_key)
        .add(M::POST, "/v1/admin/rotate-kek", rotate_kek)
        .add(M::POST, "/v1/admin/drain", drain_start)
        .add(M::GET, "/v1/admin/drain", drain_status)
        .add(M::DELETE, "/v1/admin/drain", drain_cancel)
        .add(M::POST, "/v1/admin/repair", repair_start)
        .add(M::GET, "/v1/admin/repair", repair_status)
        .add(M::GET, "/v1/cluster", cluster)
        .add(M::GET, "/v1/overview", super::dashboard::overview)
        .add(M::POST, "/v1/plan", super::dashboard::plan)
        .add(M::GET, "/ui", super::dashboard::ui_index)
        .add(M::GET, "/ui/{file}", super::dashboard::ui_file)
}

pub fn router(
    engine: Arc<Engine>,
    metrics: Arc<crate::metrics::NodeMetrics>,
    auth: Arc<Authenticator>,
    max_inflight: usize,
    budgets: crate::budget::Budgets,
    pod: &ctxpod_pod::Pod,
) -> Router {
    let state = AppState {
        engine,
        metrics,
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
        pod_metrics: pod.metrics.clone(),
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

pub(crate) async fn no_route() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "no_route", "no such route")
}

pub(crate) async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "method not allowed on this route",
    )
}
