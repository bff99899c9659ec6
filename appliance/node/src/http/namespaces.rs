//! Namespaces: list, create or change, read, delete; in a pod, the change fanned out to
//! every member and recorded in etcd for those that were away.

use crate::auth::Principal;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use bytes::Bytes;
use ctxpod_engine::{EngineError, NsSettings};
use ctxpod_wire::types::*;
use std::time::Duration;

use super::input::NsCall;
use super::input::{json_object, present, read_body};
use super::routed::count_forwarded;
use super::state::{AppState, JSON_BODY_BYTES_MAX};
use crate::errors::{ApiError, ApiResult};

pub(crate) async fn list_namespaces(
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

/// A tenant's namespaces are bounded in number (a new one, asked by a client: a change
/// sent on by another member was bounded there): refuses namespace `ns` (scoped) past
/// `p`'s tenant's limit (403).
fn check_namespace_limit(st: &AppState, p: &Principal, h: &HeaderMap, ns: &str) -> ApiResult<()> {
    if let Some(max) = st.auth.namespaces_max(p) {
        let new = st.engine.namespace(ns).is_err() && routed_incarnation(h)?.is_none();
        if new {
            let prefix = ns.split_once('/').map_or("", |(t, _)| t);
            let have = st
                .engine
                .namespaces()
                .iter()
                .filter(|n| n.name.split_once('/').is_some_and(|(t, _)| t == prefix))
                .count();
            if have >= max {
                st.auth.count_namespace_limit(p);
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "namespace_limit",
                    format!("the tenant has {have} namespaces, its limit"),
                ));
            }
        }
    }
    Ok(())
}

pub(crate) async fn put_namespace(
    NsCall {
        st, p, scoped: ns, ..
    }: NsCall,
    uri: axum::http::Uri,
    h: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    use ctxpod_pod::namespaces::{self as pns, NsRecord};
    let b = read_body(&h, body, JSON_BODY_BYTES_MAX).await?;
    // `If-None-Match: *`: create only; an existing namespace keeps its settings (412).
    let create_only = match h.get(axum::http::header::IF_NONE_MATCH) {
        None => false,
        Some(v) if v.as_bytes() == b"*" => true,
        Some(_) => {
            return Err(ApiError::invalid(
                "If-None-Match takes only * (create the namespace only if it does not exist)",
            ))
        }
    };
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
    // The precondition is evaluated after the request's own checks (RFC 9110 13.2.1): a
    // malformed body is 400 whether or not the namespace exists.
    if create_only && routed_incarnation(&h)?.is_none() {
        let exists = st.engine.namespace(&ns).is_ok() || st.live_record(&ns).await?.is_some();
        if exists {
            return Err(ApiError::new(
                StatusCode::PRECONDITION_FAILED,
                "namespace_exists",
                format!(
                    "namespace {:?} exists; its settings are unchanged",
                    p.unscope(&ns).unwrap_or(&ns)
                ),
            ));
        }
    }
    check_namespace_limit(&st, &p, &h, &ns)?;
    let mut settings = NsSettings {
        quota_bytes: req.quota_bytes,
        replication: req.replication,
        incarnation: None,
        class: req.class,
        compression: req.compression,
    };
    let (created, info) = if let Some(inc) = routed_incarnation(&h)? {
        // A change another member made, sent on to this one.
        settings.incarnation = Some(inc);
        pns::apply(&st.engine, &ns, settings).await?
    } else if st.pod_wide() {
        // Made here for the whole pod: recorded in etcd, applied, sent to every member.
        let live = st.live_record(&ns).await?;
        let held = st.engine.namespace(&ns).ok().map(|i| i.class);
        // Checked before it is recorded: the pod's record never names another class than
        // the one the namespace was created with.
        let class = NamespaceClass::settle(&ns, live.as_ref().map(|r| r.class).or(held), req.class)
            .map_err(EngineError::Fixed)?;
        let inc = match live {
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
                class,
                compression: req.compression,
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

pub(crate) async fn get_namespace(
    NsCall { st, p, scoped, .. }: NsCall,
) -> ApiResult<Json<NamespaceInfo>> {
    Ok(Json(present(&p, st.engine.namespace(&scoped)?)))
}

/// The query of a namespace's DELETE.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct DeleteQuery {
    /// Delete only a namespace that holds no block anywhere in the pod (409 otherwise).
    #[serde(default)]
    if_empty: bool,
}

pub(crate) async fn delete_namespace(
    NsCall {
        st,
        p,
        ns: asked,
        scoped: ns,
    }: NsCall,
    uri: axum::http::Uri,
    h: HeaderMap,
) -> ApiResult<StatusCode> {
    use ctxpod_pod::namespaces::{self as pns, NsRecord};
    let q = axum::extract::Query::<DeleteQuery>::try_from_uri(&uri)
        .map_err(|e| ApiError::invalid(format!("bad query: {}", e.body_text())))?
        .0;
    if q.if_empty && routed_incarnation(&h)?.is_none() {
        // Empty in the whole pod: every member asked for one key (a member that cannot
        // answer refuses the delete, rather than let it take blocks nobody counted).
        st.engine.namespace(&ns)?;
        let (keys, _) = super::blocks::pod_page(&st, &p, &asked, &ns, &h, &[], None, 1).await?;
        if !keys.is_empty() {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "namespace_not_empty",
                format!("namespace {asked:?} holds blocks in the pod; delete them first"),
            ));
        }
    }
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
            class: NamespaceClass::Kv,
            compression: None,
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
            class: NamespaceClass::Kv,
            compression: None,
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
pub(crate) fn routed_incarnation(h: &HeaderMap) -> ApiResult<Option<u64>> {
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
    /// The pod's live record of namespace `ns` (none without etcd, or once deleted).
    pub(crate) async fn live_record(
        &self,
        ns: &str,
    ) -> ApiResult<Option<ctxpod_pod::namespaces::NsRecord>> {
        let Some(r) = &self.ns_records else {
            return Ok(None);
        };
        let rec = ctxpod_pod::namespaces::record(r.1.as_ref(), &r.0, ns)
            .await
            .map_err(|e| etcd_unavailable(&e))?;
        Ok(rec.filter(|r| !r.deleted))
    }

    /// Records a namespace change in etcd (with etcd); refused (503) while etcd is away.
    pub(crate) async fn record_namespace(
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
        ctxpod_pod::namespaces::publish(r.1.as_ref(), &r.0, ns, rec, lease)
            .await
            .map_err(|e| etcd_unavailable(&e))
    }

    /// Sends a namespace change made here to every other member, at once (10 s at most
    /// each), with the caller's credentials; a member that misses it catches up from etcd.
    pub(crate) async fn namespace_to_members(
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

pub(crate) fn etcd_unavailable(e: &anyhow::Error) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        format!("etcd cannot record the namespace change now: {e:#}"),
    )
}
