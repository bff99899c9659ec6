//! What every routed request of a pod shares (`middleware::route_in_pod` and the value
//! writes of `pod_values`): forwarding to a member with its outcome counted, and the answer
//! a routed write gives from its plan's outcome.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use ctxpod_wire::pod_plan::WriteOutcome;
use std::collections::BTreeMap;

use super::state::AppState;
use crate::auth::Principal;
use crate::errors::ApiError;

/// The answer to a routed write, from its outcome and the members' answers.
pub(super) fn pick_answer(
    outcome: Option<WriteOutcome>,
    mut answers: BTreeMap<usize, Response>,
    is_delete: bool,
) -> Response {
    let answer_of = |m: usize, answers: &mut BTreeMap<usize, Response>| answers.remove(&m);
    let picked = match outcome {
        Some(WriteOutcome::Refused { member }) => answer_of(member, &mut answers),
        // A delete: the answer of a member that held it, else of the best ranked.
        Some(WriteOutcome::Applied { members } | WriteOutcome::TooFew { members }) if is_delete => {
            let held = members.iter().find(|m| m.1).or(members.first());
            held.and_then(|&(m, _)| answer_of(m, &mut answers))
        }
        // A put: its best-ranked copy's answer.
        Some(WriteOutcome::Applied { members }) => members
            .first()
            .and_then(|&(m, _)| answer_of(m, &mut answers)),
        Some(WriteOutcome::TooFew { .. }) => {
            return unavailable("fewer members than the pod's replication factor can be reached")
        }
        None => None,
    };
    picked.unwrap_or_else(|| unavailable("no member that may hold this block can be reached"))
}

/// Forwards a request to `m` and counts the outcome (`ctxpod_forwarded_total`); `None`
/// when `m` cannot be reached.
pub(crate) async fn forward_counted(
    st: &AppState,
    m: &ctxpod_pod::membership::MemberInfo,
    parts: &axum::http::request::Parts,
    body: Option<crate::forward::Outgoing>,
    outcome: &str,
) -> Option<Response> {
    forward_why(st, m, parts, body, outcome).await.ok()
}

/// [`forward_counted`], with why `m` could not be reached.
pub(crate) async fn forward_why(
    st: &AppState,
    m: &ctxpod_pod::membership::MemberInfo,
    parts: &axum::http::request::Parts,
    body: Option<crate::forward::Outgoing>,
    outcome: &str,
) -> Result<Response, crate::forward::ForwardError> {
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
            st.peers.missed.note(&m.id, true);
            count_forwarded(st, outcome);
            Ok(r)
        }
        Err(e) => {
            if matches!(e, crate::forward::ForwardError::TimedOut) {
                st.peers.missed.note(&m.id, false);
            }
            count_forwarded(st, "unreachable");
            Err(e)
        }
    }
}

/// `ctxpod_forwarded_total{outcome}`.
pub(crate) fn count_forwarded(st: &AppState, outcome: &str) {
    st.metrics.forwarded.with_label_values(&[outcome]).inc();
}

/// 503 with Retry-After: too few members could be reached.
pub(crate) fn unavailable(message: &'static str) -> Response {
    let mut r =
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message).into_response();
    // Busy-style: clients retry after a moment (membership catches up within a lease).
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}
