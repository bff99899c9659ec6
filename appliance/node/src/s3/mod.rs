//! The S3 door (issue #22): an S3-compatible listener on its own port, off by default
//! (`s3_listen`). Buckets are the caller's namespaces, objects are blocks (an object key's
//! UTF-8 bytes are the block's key).
//!
//! The S3 protocol (routing, XML, SigV4 in headers and presigned URLs, `aws-chunked`
//! bodies) is the `s3s` crate's; what each operation does is [`door::Door`]'s, and it does it
//! by sending the equivalent request of HTTP API v1 through the node's own router, in
//! process, on behalf of the caller S3 authenticated ([`Vouched`]). So an S3 request gets
//! everything an HTTP one gets — the tenant's scoping, roles, rates and quotas, the byte
//! budgets, the pod's routing (any node answers for the pod), the metrics — with no second
//! implementation of any of it.
//!
//! KV extras ([`extras`]): MATCH and PIN as signed S3 requests with a query parameter of
//! ctxpod's own, which S3 tools never send.
//!
//! Credentials: with authentication on, an access key id is a token id and its secret
//! access key is the token's `s3_secret` (`ctxpod token create --s3`); SigV4 only (SigV2 is
//! refused), presigned URLs for at most 7 days, 15 minutes of clock skew. With
//! authentication off (the embedded loopback default) any credentials act as the admin, as
//! on the other listeners: the signature is dropped unchecked (a SigV4 signature cannot be
//! checked without the secret it was made with). A body in signed `aws-chunked` framing
//! needs its signatures checked to be read, so without authentication it is refused
//! (`NotImplemented`, saying so); single-payload and unsigned bodies are taken.

mod checksum;
pub mod door;
pub mod extras;

use crate::auth::{Authenticator, Principal};
use s3s::{s3_error, S3Result};
use std::sync::Arc;

/// A caller the S3 door authenticated, set on the requests it sends through the HTTP
/// router: the authentication middleware takes it as the caller (only code in this crate
/// can make one; a client cannot send an extension).
#[derive(Clone)]
pub(crate) struct Vouched(pub Principal);

/// Largest request body the S3 listener reads, for a node whose `value_bytes_max` is
/// `value_max`: a value, and room for `aws-chunked` framing (a chunk header and signature of
/// under 100 bytes per chunk of at least 8 KiB, and trailers), or an XML body.
pub fn body_bytes_max(value_max: u64) -> usize {
    (value_max + value_max / 64 + (1 << 20)) as usize
}
/// Largest XML request body (DeleteObjects of 1000 keys of 128 bytes fits many times).
pub const S3_XML_BYTES_MAX: usize = 1 << 20;
/// Longest validity of a presigned URL (S3's own limit: 7 days).
pub const PRESIGNED_EXPIRES_S_MAX: u64 = 7 * 24 * 3600;

/// The secret access keys of the node's tokens (those with an `s3_secret`).
struct Keys(Arc<Authenticator>);

#[async_trait::async_trait]
impl s3s::auth::S3Auth for Keys {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<s3s::auth::SecretKey> {
        match self.0.s3_secret(access_key) {
            Some(secret) => Ok(s3s::auth::SecretKey::from(secret.as_str())),
            None => Err(s3_error!(InvalidAccessKeyId)),
        }
    }
}

/// What the S3 door accepts of a signed request: SigV4 only, and presigned URLs of at most
/// [`PRESIGNED_EXPIRES_S_MAX`].
struct SigV4Only;

#[async_trait::async_trait]
impl s3s::access::S3Access for SigV4Only {
    async fn check(&self, cx: &mut s3s::access::S3AccessContext<'_>) -> S3Result<()> {
        sigv4_only(cx.headers(), cx.uri(), cx.credentials().is_some())
    }
}

/// The door's rule for a signed request, for S3's operations and ctxpod's own routes
/// alike: a signature there is, SigV4 (in the header, or a presigned URL of at most
/// [`PRESIGNED_EXPIRES_S_MAX`]); SigV2 in either place is refused.
pub(crate) fn sigv4_only(headers: &http::HeaderMap, uri: &http::Uri, signed: bool) -> S3Result<()> {
    if !signed {
        return Err(s3_error!(AccessDenied, "a signature is required"));
    }
    if let Some(a) = headers.get(http::header::AUTHORIZATION) {
        if !a.as_bytes().starts_with(b"AWS4-HMAC-SHA256 ") {
            return Err(s3_error!(AccessDenied, "only AWS4-HMAC-SHA256 is accepted"));
        }
    }
    if let Some(q) = uri.query() {
        for (k, v) in url::form_urlencoded::parse(q.as_bytes()) {
            match &*k {
                "Signature" | "AWSAccessKeyId" => {
                    return Err(s3_error!(AccessDenied, "SigV2 presigned URLs are refused"))
                }
                "X-Amz-Expires" => {
                    let secs: u64 = v
                        .parse()
                        .map_err(|_| s3_error!(AuthorizationQueryParametersError))?;
                    if secs > PRESIGNED_EXPIRES_S_MAX {
                        return Err(s3_error!(
                            AuthorizationQueryParametersError,
                            "X-Amz-Expires must be at most {PRESIGNED_EXPIRES_S_MAX}"
                        ));
                    }
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// The S3 door's router: the `s3s` service over [`door::Door`], behind a check of the
/// request's announced length and a cap on what it may read.
pub fn router(
    api: axum::Router,
    auth: Arc<Authenticator>,
    metrics: Arc<crate::metrics::NodeMetrics>,
    body_max: usize,
) -> axum::Router {
    let enabled = auth.enabled();
    let door = door::Door::new(api, auth.clone(), metrics);
    let mut b = s3s::service::S3ServiceBuilder::new(door.clone());
    b.set_route(extras::Extras {
        door,
        auth_enabled: enabled,
    });
    if enabled {
        b.set_auth(Keys(auth));
        b.set_access(SigV4Only);
    }
    let mut cfg = s3s::config::S3Config::default();
    cfg.xml_max_body_size = S3_XML_BYTES_MAX;
    // No browser form uploads: s3s would read one into memory before any access check.
    cfg.post_object_max_file_size = 0;
    b.set_config(Arc::new(s3s::config::StaticConfigProvider::new(Arc::new(
        cfg,
    ))));
    let svc = b.build();
    let svc = axum::error_handling::HandleError::new(svc, |e: s3s::HttpError| async move {
        tracing::debug!("S3 request failed: {e:?}");
        http::StatusCode::BAD_REQUEST
    });
    let r = axum::Router::new().fallback_service(svc);
    let r = if enabled {
        r
    } else {
        r.layer(axum::middleware::from_fn(drop_signature))
    };
    r.layer(axum::middleware::from_fn(move |req, next| {
        delete_checksum(req, next, !enabled)
    }))
    .layer(axum::middleware::from_fn(screen))
    .layer(axum::middleware::from_fn(move |req, next| {
        limit_body(req, next, body_max)
    }))
}

/// Refused at the headers, before any body is read or any signature checked:
/// - a browser form upload (`POST` of `multipart/form-data`): the door does not take form
///   uploads (their policy would be checked only after the form is parsed);
/// - a request that changes state from a web page (an `Origin` or `Sec-Fetch-*` header on
///   anything but GET and HEAD): no browser is a client of the door, and without
///   authentication a cross-site form could otherwise delete objects.
async fn screen(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let h = req.headers();
    let reads = matches!(*req.method(), http::Method::GET | http::Method::HEAD);
    let from_a_page = h.contains_key(http::header::ORIGIN)
        || h.contains_key("sec-fetch-site")
        || h.contains_key("sec-fetch-mode");
    if !reads && from_a_page {
        return door::error_response(s3_error!(
            AccessDenied,
            "a request from a web page (Origin or Sec-Fetch-* header) cannot change state \
             through the S3 door"
        ))
        .into_response();
    }
    let form = h
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .to_ascii_lowercase()
                .starts_with("multipart/form-data")
        });
    if *req.method() == http::Method::POST && form {
        return door::error_response(s3_error!(
            NotImplemented,
            "browser form uploads (POST Object) are not taken: use PutObject"
        ))
        .into_response();
    }
    next.run(req).await
}

/// DeleteObjects must carry `Content-MD5` or an `x-amz-checksum-*` header of its body, as
/// S3 requires (so a request a web page could forge, which cannot compute one, is
/// refused); the body is checked against it as `s3s` reads it, after the signature, and a
/// mismatch is answered BadDigest with nothing deleted.
async fn delete_checksum(
    req: axum::extract::Request,
    next: axum::middleware::Next,
    content_sha256: bool,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let deletes = *req.method() == http::Method::POST
        && req
            .uri()
            .query()
            .is_some_and(|q| url::form_urlencoded::parse(q.as_bytes()).any(|(k, _)| k == "delete"));
    if !deletes {
        return next.run(req).await;
    }
    let digests = match checksum::Digests::from_headers(req.headers(), content_sha256) {
        Ok(d) if d.any() => d,
        Ok(_) => {
            return door::error_response(s3_error!(
                InvalidRequest,
                "Missing required header for this request: Content-MD5 (or an \
                 x-amz-checksum-* header of the body)"
            ))
            .into_response()
        }
        Err(e) => return door::error_response(e).into_response(),
    };
    let verdict = Arc::new(parking_lot::Mutex::new(None));
    let (parts, body) = req.into_parts();
    let checked = checksum::CheckedBody::new(body.into_data_stream(), digests, verdict.clone());
    let resp = next
        .run(axum::extract::Request::from_parts(
            parts,
            axum::body::Body::from_stream(checked),
        ))
        .await;
    let failed = verdict.lock().take();
    match failed {
        Some(e) => door::error_response(e).into_response(),
        None => resp,
    }
}

/// Without authentication: the request's signature is dropped unchecked, so that any
/// credentials act as the admin (see the module's documentation).
async fn drop_signature(
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let streaming = req
        .headers()
        .get("x-amz-content-sha256")
        .is_some_and(|v| v.as_bytes().starts_with(b"STREAMING-"));
    if streaming {
        return door::error_response(s3_error!(
            NotImplemented,
            "this node runs without authentication, and a body in aws-chunked framing can \
             only be read by checking its signatures: send it as one payload (the AWS SDKs: \
             request_checksum_calculation = when_required) or turn authentication on"
        ))
        .into_response();
    }
    req.headers_mut().remove(http::header::AUTHORIZATION);
    if let Some(q) = req.uri().query() {
        // A presigned URL's signing parameters (X-Amz-*) go; the rest of the query stays.
        let kept: Vec<(String, String)> = url::form_urlencoded::parse(q.as_bytes())
            .filter(|(k, _)| !k.starts_with("X-Amz-"))
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        let query = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(kept)
            .finish();
        let pq = if query.is_empty() {
            req.uri().path().to_string()
        } else {
            format!("{}?{query}", req.uri().path())
        };
        let mut parts = req.uri().clone().into_parts();
        if let Ok(pq) = pq.parse() {
            parts.path_and_query = Some(pq);
            if let Ok(u) = http::Uri::from_parts(parts) {
                *req.uri_mut() = u;
            }
        }
    }
    next.run(req).await
}

/// Refuses a body announced over `max` ([`body_bytes_max`]) at once, and cuts any body
/// off there (a chunked one announces nothing): no request holds more than that, and a PUT
/// streams through to the node a few extents at a time.
async fn limit_body(
    req: axum::extract::Request,
    next: axum::middleware::Next,
    max: usize,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let announced = req
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|n| n > max as u64) {
        return door::error_response(s3_error!(
            EntityTooLarge,
            "a body of at most {max} bytes (an object is a value of at most the node's \
             value_bytes_max)"
        ))
        .into_response();
    }
    let (parts, body) = req.into_parts();
    let body = axum::body::Body::new(http_body_util::Limited::new(body, max));
    next.run(axum::extract::Request::from_parts(parts, body))
        .await
}
