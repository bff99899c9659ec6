//! What every routed request of a pod shares (`middleware::route_in_pod` and the value
//! writes of `pod_values`): asking a member over HTTP ([`OverHttp`], the node's
//! `ctxpod_pod::coordinator::Member`), forwarding with its outcome counted, and the answer
//! a routed write gives.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use ctxpod_pod::coordinator::{Member, Refusal, Said, Unreached};
use ctxpod_pod::membership::MemberInfo;
use ctxpod_wire::pod_plan::WriteOutcome;
use std::collections::BTreeMap;

use super::state::AppState;
use crate::auth::Principal;
use crate::errors::ApiError;
use crate::forward::Outgoing;

/// The answer to a routed write, from its outcome and the members' answers
/// ([`ctxpod_pod::coordinator::pick_answer`]); 503 when it has none to give.
pub(super) fn pick_answer(
    outcome: Option<WriteOutcome>,
    answers: BTreeMap<usize, Response>,
    is_delete: bool,
) -> Response {
    match ctxpod_pod::coordinator::pick_answer(outcome, answers, is_delete) {
        Ok(r) => r,
        Err(refusal) => refused(refusal),
    }
}

/// The answer to a routed write the pod did not acknowledge (503, Retry-After): what was
/// done and what was not.
pub(super) fn refused(refusal: Refusal) -> Response {
    match refusal {
        Refusal::Unavailable(message) => unavailable(message),
        Refusal::NotRecordable(e) => {
            tracing::warn!("block delete refused: {e}");
            // A 503 carries Retry-After (`ApiError::into_response`).
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                e.to_string(),
            )
            .into_response()
        }
        Refusal::NotRecorded { error, removed } => {
            // It says what was done: the copies it reached are gone, nothing recorded.
            let message = format!(
                "{error}; the copies on {removed:?} were deleted, the delete is not recorded: \
                 send it again"
            );
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message).into_response()
        }
        Refusal::Unsettled { applied, pending } => {
            let message = format!(
                "the delete is recorded (a tombstone) and settled on {applied:?} (applied, or \
                 nothing listens there), but {pending:?} may hold the block and have not \
                 applied it: they are still in the pod and could not be reached; it completes \
                 when they answer or their lease runs out (within pod.lease_ttl_s); send it \
                 again"
            );
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message).into_response()
        }
    }
}

/// A routed request as this node asks a member ([`ctxpod_pod::coordinator::Member`]): its
/// own stack (the rest of the middleware and the handler) for itself, a forward for the
/// others, with a write's held body.
pub(super) struct OverHttp<'a> {
    pub st: &'a AppState,
    pub parts: &'a axum::http::request::Parts,
    pub body: Option<&'a Bytes>,
    pub next: &'a Next,
    /// What a forward is counted as (`ctxpod_forwarded_total{outcome}`).
    pub outcome: &'static str,
}

#[async_trait::async_trait]
impl Member for OverHttp<'_> {
    type Answer = Response;

    async fn ask(&self, m: &MemberInfo, mine: bool) -> Result<Response, Unreached> {
        if mine {
            let body = self
                .body
                .map_or_else(Body::empty, |b| Body::from(b.clone()));
            let local = Request::from_parts(self.parts.clone(), body);
            return Ok(self.next.clone().run(local).await);
        }
        let body = self.body.map(|b| Outgoing::Whole(b.clone()));
        forward_unnoted(self.st, m, self.parts, body, self.outcome).await
    }

    async fn ask_recorded(&self, m: &MemberInfo, mine: bool) -> Result<Response, Unreached> {
        if mine {
            // This member recorded the delete: it knows the tombstone already.
            return self.ask(m, mine).await;
        }
        let mut parts = self.parts.clone();
        parts.headers.insert(
            ctxpod_wire::HEADER_DELETE_RECORDED,
            HeaderValue::from_static("1"),
        );
        let asked = OverHttp {
            parts: &parts,
            ..*self
        };
        asked.ask(m, mine).await
    }

    fn said(&self, a: &Response) -> Said {
        match a.status() {
            s if s.is_success() => Said::Done {
                created: s == StatusCode::CREATED,
            },
            StatusCode::NOT_FOUND => Said::NotFound,
            _ => Said::Other,
        }
    }
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
    let answer = forward_unnoted(st, m, parts, body, outcome).await;
    match &answer {
        Ok(_) => st.peers.missed.note(&m.id, true),
        Err(Unreached::TimedOut) => st.peers.missed.note(&m.id, false),
        Err(_) => {}
    }
    answer.ok()
}

/// A forward with its outcome counted, and why `m` could not be reached; whether `m` met
/// its deadline is left to the caller to note (the coordinator notes it).
async fn forward_unnoted(
    st: &AppState,
    m: &ctxpod_pod::membership::MemberInfo,
    parts: &axum::http::request::Parts,
    body: Option<crate::forward::Outgoing>,
    outcome: &str,
) -> Result<Response, Unreached> {
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
            Ok(r)
        }
        Err(e) => {
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
