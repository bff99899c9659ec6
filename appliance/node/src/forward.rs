//! A single-block request forwarded to the member that holds the block (the routing itself,
//! [`ctxpod_pod::route`], decides where): the member's answer streamed back as ours, a
//! block's bytes checked against their CRC32C first (a large value's as they stream
//! through: a mismatch cuts the body short, as a bad extent read locally does).
//!
//! A forward is bounded by progress, not by its whole length (a value of a GiB takes as long
//! as its client sends or reads it): the member must take the next piece of a streamed body,
//! answer, and give the next piece of its answer's body, each within [`FORWARD_STALL`] of
//! the last. A frozen member (it accepts connections and does nothing) is given up on after
//! that, well within a client's own deadline, so that the next member can still answer.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::Response;
use bytes::Bytes;
use ctxpod_pod::coordinator::Unreached;
use ctxpod_pod::membership::MemberInfo;
use ctxpod_pod::route::{member_block_intact, HEADER_FORWARDED};
use ctxpod_pod::Peers;
use futures::stream::BoxStream;
use futures::StreamExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The longest a member may go without taking a piece of a forwarded body, answering, or
/// giving the next piece of its answer ([`ctxpod_pod::route::PEER_DEADLINE`]).
pub const FORWARD_STALL: Duration = ctxpod_pod::route::PEER_DEADLINE;

/// A forwarded request's body.
pub enum Outgoing {
    /// Held whole (a block of at most one record).
    Whole(Bytes),
    /// Streamed piece by piece (a value, an upload's part): it keeps the length its client
    /// announced.
    Stream(BoxStream<'static, Result<Bytes, std::io::Error>>),
}

/// Whether a forward is waiting on its member, and since when: it is from the start, after
/// each piece of its body the member took, and after the body's end (for the answer); it
/// is not while the body has no piece ready (its own client is slow, or the other members
/// of a streamed value set the pace), which is no fault of this member's.
#[derive(Clone)]
struct Progress {
    start: Instant,
    /// Milliseconds from `start` to when the wait on the member began; [`Progress::ON_US`]
    /// while the body has no piece ready.
    waiting_since_ms: Arc<AtomicU64>,
}

impl Progress {
    const ON_US: u64 = u64::MAX;

    fn new() -> Progress {
        Progress {
            start: Instant::now(),
            waiting_since_ms: Arc::new(AtomicU64::new(0)),
        }
    }

    /// `s`, noting as it is polled whether the member waits on it (no piece ready) or it
    /// on the member (a piece was taken, or the body ended).
    fn counting(
        &self,
        mut s: BoxStream<'static, Result<Bytes, std::io::Error>>,
    ) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
        let p = self.clone();
        futures::stream::poll_fn(move |cx| {
            let r = s.poll_next_unpin(cx);
            let since = if r.is_pending() {
                Self::ON_US
            } else {
                p.start.elapsed().as_millis() as u64
            };
            p.waiting_since_ms.store(since, Ordering::Relaxed);
            r
        })
    }

    /// Ends once the member has been waited on for [`FORWARD_STALL`] without a break.
    async fn stalled(&self) {
        loop {
            let since = self.waiting_since_ms.load(Ordering::Relaxed);
            if since == Self::ON_US {
                tokio::time::sleep(FORWARD_STALL / 4).await;
                continue;
            }
            let waited = self
                .start
                .elapsed()
                .saturating_sub(Duration::from_millis(since));
            if waited >= FORWARD_STALL {
                return;
            }
            tokio::time::sleep(FORWARD_STALL - waited).await;
        }
    }
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
    body: Option<Outgoing>,
) -> Result<Response, Unreached> {
    let url = format!(
        "{}{}",
        m.http,
        uri.path_and_query().map(|p| p.as_str()).unwrap_or("/")
    );
    let mut req = peers.http.request(method.clone(), url);
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
        HeaderValue::from_str(me).map_err(|_| Unreached::Unreachable)?,
    );
    let progress = Progress::new();
    match body {
        Some(Outgoing::Whole(b)) => req = req.body(b),
        Some(Outgoing::Stream(s)) => {
            // A streamed body keeps the length its client announced: a member takes a
            // value over one record only with its length.
            if let Some(n) = headers.get(axum::http::header::CONTENT_LENGTH) {
                req = req.header(axum::http::header::CONTENT_LENGTH, n);
            }
            req = req.body(reqwest::Body::wrap_stream(progress.counting(s)));
        }
        None => {}
    }
    let resp = tokio::select! {
        r = req.send() => r.map_err(|e| if e.is_timeout() {
            Unreached::TimedOut
        } else if ctxpod_pod::connection_refused(&e) {
            Unreached::Refused
        } else {
            Unreached::Unreachable
        })?,
        _ = progress.stalled() => {
            tracing::warn!(
                member = %m.id,
                stall_s = FORWARD_STALL.as_secs(),
                "a member took no piece of a forwarded request and did not answer: given up on"
            );
            return Err(Unreached::TimedOut);
        }
    };
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
        let bytes = tokio::time::timeout(FORWARD_STALL, resp.bytes());
        let bytes = bytes
            .await
            .map_err(|_| Unreached::TimedOut)?
            .map_err(|_| Unreached::Unreachable)?;
        if bytes.len() > ctxpod_wire::BLOCK_BYTES_MAX || !member_block_intact(&bytes, crc.as_ref())
        {
            tracing::warn!(
                member = %m.id,
                "a member answered a block whose bytes do not match its CRC32C; trying the next"
            );
            return Err(Unreached::Unreachable);
        }
        Body::from(bytes)
    } else {
        Body::from_stream(piece_by_piece(resp))
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
    let want = crc
        .as_ref()
        .and_then(|v| v.to_str().ok())
        .and_then(ctxpod_wire::parse_crc32c_hex);
    let left = resp.content_length().unwrap_or(0);
    let state = (piece_by_piece(resp).boxed(), 0u32, left, want, member);
    Body::from_stream(futures::stream::unfold(Some(state), |st| async move {
        let (mut s, crc, left, want, member) = st?;
        match s.next().await {
            Some(Ok(b)) => {
                let crc = ctxpod_wire::crc32c_append(crc, &b);
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
            Some(Err(e)) => Some((Err(e), None)),
            None => None,
        }
    }))
}

/// An answer's body as it arrives, each piece within [`FORWARD_STALL`] of the last: a member
/// that stops sending ends the body with an error (the client sees it cut short).
fn piece_by_piece(
    resp: reqwest::Response,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    futures::stream::unfold(Some(resp.bytes_stream()), |s| async move {
        let mut s = s?;
        match tokio::time::timeout(FORWARD_STALL, s.next()).await {
            Ok(Some(Ok(b))) => Some((Ok(b), Some(s))),
            Ok(Some(Err(e))) => Some((Err(std::io::Error::other(e)), None)),
            Ok(None) => None,
            Err(_) => {
                let e =
                    std::io::Error::new(std::io::ErrorKind::TimedOut, "a member stopped sending");
                Some((Err(e), None))
            }
        }
    })
}
