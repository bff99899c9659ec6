//! Errors as the node answers them: the one map from an engine error to a status and a
//! stable kind (`status_of`, used by both listeners: HTTP answers the status and kind, CXP1
//! the status's number), and `ApiError`, the HTTP error answer (`api/openapi.json`'s
//! `Error`: `{"error": kind, "message"}`, with `Retry-After` on 503).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ctxpod_engine::EngineError;
use ctxpod_wire::types::ErrorBody;

/// An error answer: status, stable kind, message.
pub struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) kind: &'static str,
    pub(crate) message: String,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            kind,
            message: message.into(),
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid", message)
    }

    pub(crate) fn too_large(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", message)
    }

    pub(crate) fn busy(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "busy", message)
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        let (status, kind) = status_of(&e);
        if status == StatusCode::INTERNAL_SERVER_ERROR {
            tracing::error!(error = %e, "internal error");
        }
        ApiError::new(status, kind, e.to_string())
    }
}

/// The one map from an engine error to its status and stable kind: HTTP answers it, and
/// CXP1 answers its number.
pub(crate) fn status_of(e: &EngineError) -> (StatusCode, &'static str) {
    match e {
        EngineError::Invalid(_) => (StatusCode::BAD_REQUEST, "invalid"),
        EngineError::NotFound(_) => (StatusCode::NOT_FOUND, "no_such_namespace"),
        EngineError::Conflict | EngineError::Fixed(_) => (StatusCode::CONFLICT, "conflict"),
        EngineError::Integrity(_) => (StatusCode::UNPROCESSABLE_ENTITY, "integrity"),
        EngineError::TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "too_large"),
        EngineError::NoSpace(_) => (StatusCode::INSUFFICIENT_STORAGE, "no_space"),
        // A quota is a policy on the caller: retrying does not help, deleting does.
        EngineError::Quota(_) => (StatusCode::FORBIDDEN, "quota"),
        EngineError::Busy(_) => (StatusCode::SERVICE_UNAVAILABLE, "busy"),
        EngineError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (
            self.status,
            Json(ErrorBody {
                error: self.kind.to_string(),
                message: self.message,
            }),
        )
            .into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        r
    }
}

pub(crate) type ApiResult<T> = Result<T, ApiError>;
