//! A single-block request forwarded to the member that holds the block (the routing itself,
//! [`ctxpod_pod::route`], decides where): the member's answer streamed back as ours, a
//! block's bytes checked against their CRC32C first (a large value's as they stream
//! through: a mismatch cuts the body short, as a bad extent read locally does).

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::Response;
use ctxpod_pod::membership::MemberInfo;
use ctxpod_pod::route::{member_block_intact, HEADER_FORWARDED};
use ctxpod_pod::Peers;
use std::time::Duration;

/// How long a forwarded request may take.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a forward did not give an answer to pass on.
pub enum ForwardError {
    /// The member could not be reached (connect, timeout), or answered a block whose bytes
    /// do not match its CRC32C: try the next one.
    Unreachable,
}

/// Sends the request to `m` and turns its answer into ours (status, headers, body streamed).
/// Credentials go as [`Peers::for_caller`] says.
#[allow(clippy::too_many_arguments)]
pub async fn forward(
    peers: &Peers,
    m: &MemberInfo,
    me: &str,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    caller_tenant: Option<&str>,
    body: Option<reqwest::Body>,
) -> Result<Response, ForwardError> {
    let url = format!(
        "{}{}",
        m.http,
        uri.path_and_query().map(|p| p.as_str()).unwrap_or("/")
    );
    let mut req = peers
        .http
        .request(method.clone(), url)
        .timeout(FORWARD_TIMEOUT);
    for (name, value) in headers {
        // Hop-by-hop and framing headers are the HTTP client's own business; credentials
        // go as `for_caller` says.
        if matches!(
            name.as_str(),
            "host"
                | "connection"
                | "content-length"
                | "transfer-encoding"
                | "keep-alive"
                | "authorization"
                | ctxpod_wire::HEADER_TENANT
        ) {
            continue;
        }
        req = req.header(name, value);
    }
    req = peers.for_caller(req, headers, caller_tenant);
    req = req.header(
        HEADER_FORWARDED,
        HeaderValue::from_str(me).map_err(|_| ForwardError::Unreachable)?,
    );
    if let Some(b) = body {
        // A streamed body keeps the length its client announced: a member takes a value
        // over one record only with its length.
        if b.as_bytes().is_none() {
            if let Some(n) = headers.get(axum::http::header::CONTENT_LENGTH) {
                req = req.header(axum::http::header::CONTENT_LENGTH, n);
            }
        }
        req = req.body(b);
    }
    let resp = req.send().await.map_err(|_| ForwardError::Unreachable)?;
    let mut out = Response::builder().status(resp.status());
    // A block's bytes are checked before they are passed on (≤ 8 MiB: buffered).
    let block_get = *method == Method::GET
        && resp.status() == StatusCode::OK
        && ctxpod_pod::route::block_of(uri.path()).is_some();
    let crc = resp.headers().get(ctxpod_wire::HEADER_CRC32C).cloned();
    for (name, value) in resp.headers() {
        if matches!(
            name.as_str(),
            "connection" | "transfer-encoding" | "keep-alive"
        ) {
            continue;
        }
        out = out.header(name, value);
    }
    let large = resp
        .content_length()
        .is_some_and(|n| n > ctxpod_wire::BLOCK_BYTES_MAX as u64);
    let body = if block_get && large {
        checked_stream(resp, crc, m.id.clone())
    } else if block_get {
        let bytes = resp.bytes().await.map_err(|_| ForwardError::Unreachable)?;
        if bytes.len() > ctxpod_wire::BLOCK_BYTES_MAX || !member_block_intact(&bytes, crc.as_ref())
        {
            tracing::warn!(
                member = %m.id,
                "a member answered a block whose bytes do not match its CRC32C; trying the next"
            );
            return Err(ForwardError::Unreachable);
        }
        Body::from(bytes)
    } else {
        Body::from_stream(resp.bytes_stream())
    };
    Ok(out.body(body).unwrap_or_else(|_| {
        let mut r = Response::new(Body::empty());
        *r.status_mut() = StatusCode::BAD_GATEWAY;
        r
    }))
}

/// A large value's body passed on as it arrives, its CRC32C computed on the way: bytes that
/// do not match the member's announced CRC32C (or none announced) end the body with an
/// error before its last piece, so the client sees a body shorter than its length, never a
/// complete wrong one.
fn checked_stream(resp: reqwest::Response, crc: Option<HeaderValue>, member: String) -> Body {
    use futures::StreamExt;
    let want = crc
        .as_ref()
        .and_then(|v| v.to_str().ok())
        .and_then(ctxpod_wire::parse_crc32c_hex);
    let left = resp.content_length().unwrap_or(0);
    let state = (resp.bytes_stream(), 0u32, left, want, member);
    Body::from_stream(futures::stream::unfold(Some(state), |st| async move {
        let (mut s, crc, left, want, member) = st?;
        match s.next().await {
            Some(Ok(b)) => {
                let crc = ctxpod_wire::crc32c_combine(crc, ctxpod_wire::crc32c(&b), b.len());
                let left = left.saturating_sub(b.len() as u64);
                if left == 0 && want != Some(crc) {
                    tracing::warn!(
                        %member,
                        "a member streamed a value whose bytes do not match its CRC32C: cut short"
                    );
                    let e = std::io::Error::other("value bytes do not match their CRC32C");
                    return Some((Err(e), None));
                }
                Some((Ok(b), Some((s, crc, left, want, member))))
            }
            Some(Err(e)) => Some((Err(std::io::Error::other(e)), None)),
            None => None,
        }
    }))
}
