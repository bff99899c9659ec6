//! The dashboard: the page at `/ui` (HTML, CSS and JavaScript compiled into the binary, no
//! external service, no CDN) and the two routes only it needs, `GET /v1/overview` (the pod
//! at a glance: each member's stats and every namespace's usage) and `POST /v1/plan` (the
//! planner of `ctxpod plan`, same arguments, same answer).
//!
//! The page's files are public (they hold no data); everything they show comes from the API
//! with the token the user gives the page, so the page sees what that token may see: an
//! `admin` or a `viewer` sees the pod.

use super::input::read_body;
use super::input::Path;
use super::observe::{node_stats, pod_mrc};
use super::state::AppState;
use crate::auth::Principal;
use crate::errors::{ApiError, ApiResult};
use crate::plan_args::{self, PlanArgs};
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use ctxpod_wire::types::{NamespaceInfo, NamespaceList, Overview, OverviewMember, Stats};
use std::collections::BTreeMap;
use std::time::Duration;

/// The page's files: name, content type, bytes.
const ASSETS: [(&str, &str, &str); 3] = [
    (
        "index.html",
        "text/html; charset=utf-8",
        include_str!("../../ui/index.html"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("../../ui/app.js"),
    ),
    (
        "app.css",
        "text/css; charset=utf-8",
        include_str!("../../ui/app.css"),
    ),
];

/// Only the page's own files and API; no inline script, no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// One of the page's files with its headers; `edit` may change its text.
fn asset(name: &str, edit: impl FnOnce(&'static str) -> String) -> Response {
    let Some((_, ctype, body)) = ASSETS.iter().find(|(n, _, _)| *n == name) else {
        return ApiError::new(StatusCode::NOT_FOUND, "no_such_file", "no such file")
            .into_response();
    };
    let mut r = edit(body).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(ctype));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    r
}

/// `GET /ui`: the page.
pub async fn ui_index(State(st): State<AppState>) -> Response {
    // The page asks for a token first only when the node wants one.
    let auth = if st.auth.enabled() { "on" } else { "off" };
    asset("index.html", |page| page.replace("{{AUTH}}", auth))
}

/// `GET /ui/{file}`: its script and style sheet.
pub async fn ui_file(Path(file): Path<String>) -> Response {
    asset(&file, str::to_string)
}

/// `GET /v1/overview`: every member with its stats (asked at once, 2 s each; a member that
/// does not answer is listed with why) and every namespace, its usage summed over the
/// members that answered.
pub async fn overview(
    State(st): State<AppState>,
    Extension(p): Extension<Principal>,
    h: HeaderMap,
) -> Json<Overview> {
    let view = st.pod.view();
    let asks = view.members.iter().map(|m| {
        let (st, p, h) = (st.clone(), p.clone(), h.clone());
        async move {
            if m.id == *st.node_id {
                let ns = st
                    .engine
                    .namespaces()
                    .into_iter()
                    .filter(|n| p.unscope(&n.name).is_some())
                    .collect::<Vec<_>>();
                return ("ok".to_string(), Some(node_stats(&st)), ns);
            }
            let get = |path| {
                st.member_get(&m.http, path, Duration::from_secs(2), &h, &p)
                    .send()
            };
            let (stats, ns) = futures::future::join(get("/v1/stats"), get("/v1/namespaces")).await;
            let (health, stats) = match stats {
                Ok(r) if r.status().is_success() => match r.json::<Stats>().await {
                    Ok(s) => ("ok".to_string(), Some(s)),
                    Err(_) => ("bad answer".to_string(), None),
                },
                Ok(r) => (format!("status {}", r.status().as_u16()), None),
                Err(_) => ("unreachable".to_string(), None),
            };
            let ns = match ns {
                Ok(r) if r.status().is_success() => r
                    .json::<NamespaceList>()
                    .await
                    .map(|l| l.namespaces)
                    .unwrap_or_default(),
                _ => Vec::new(),
            };
            (health, stats, ns)
        }
    });
    let answers = futures::future::join_all(asks).await;
    let mut namespaces: BTreeMap<String, NamespaceInfo> = BTreeMap::new();
    let members = view
        .members
        .iter()
        .zip(answers)
        .map(|(m, (health, stats, ns))| {
            for n in ns {
                let e = namespaces
                    .entry(n.name.clone())
                    .or_insert_with(|| NamespaceInfo {
                        used_bytes: 0,
                        block_count: 0,
                        ..n.clone()
                    });
                e.used_bytes += n.used_bytes;
                e.block_count += n.block_count;
            }
            OverviewMember {
                id: m.id.clone(),
                http: m.http.clone(),
                zone: m.zone.clone(),
                state: m.state.as_str().into(),
                health,
                stats,
            }
        })
        .collect();
    Json(Overview {
        node_id: st.node_id.to_string(),
        source: st.pod.source().as_str().into(),
        etcd_up: st.pod.etcd_up(),
        replication: st.replication as u32,
        members,
        namespaces: namespaces.into_values().collect(),
    })
}

/// `POST /v1/plan`: `ctxpod plan --json` for the body's arguments (the CLI's names, in
/// snake case, and its defaults); `"live": true` plans from the pod's miss-ratio curve.
pub async fn plan(
    State(st): State<AppState>,
    Extension(p): Extension<Principal>,
    h: HeaderMap,
    body: Body,
) -> ApiResult<Json<serde_json::Value>> {
    let b = read_body(&h, body, 64 << 10).await?;
    let args: PlanArgs = if b.iter().all(u8::is_ascii_whitespace) {
        PlanArgs::default()
    } else {
        super::input::json_object(&b)?
    };
    // Every number within the range api/openapi.json states (`plan_args::BOUNDS`), named.
    plan_args::check_ranges(&args).map_err(|e| ApiError::invalid(e.to_string()))?;
    for drive in std::iter::once(&args.drive).chain(args.fast_drive.as_ref()) {
        if !plan_args::API_DRIVES.contains(&drive.as_str()) {
            return Err(ApiError::invalid(format!(
                "drive {drive:?}: one of {}",
                plan_args::API_DRIVES.join(", ")
            )));
        }
    }
    let live = if args.live {
        // The live curve is the node's access pattern: the role `/v1/mrc` needs.
        if !p.may(crate::auth::Access::Monitor) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                "planning from the live curve needs the role /v1/mrc needs (admin or viewer)",
            ));
        }
        Some(pod_mrc(&st, &p, &h).await?)
    } else {
        None
    };
    plan_args::plan_json(&args, live.as_ref())
        .map(Json)
        .map_err(|e| ApiError::invalid(e.to_string()))
}
