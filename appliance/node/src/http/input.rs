//! Input as handlers take it: keys, namespaces scoped to the caller's tenant, durability,
//! bodies read under their limits, JSON bodies that must be objects, and a path extractor
//! that answers JSON errors.

use crate::auth::Principal;
use axum::body::Body;
use axum::http::{header, HeaderMap};
use bytes::Bytes;
use ctxpod_engine::StagedBlock;
use ctxpod_wire::types::*;
use ctxpod_wire::Durability;

use super::state::{AppState, JSON_BODY_BYTES_MAX};
use crate::errors::{ApiError, ApiResult};

pub(crate) fn parse_key(s: &str) -> ApiResult<Vec<u8>> {
    ctxpod_wire::key::parse_key_hex(s).map_err(|e| ApiError::invalid(e.to_string()))
}

/// A key list of at most `max` keys (the spec's `maxItems`: more is a malformed request, 400;
/// 413 is for bodies over their byte limit).
pub(crate) fn parse_keys(keys: &[String], max: usize) -> ApiResult<Vec<Vec<u8>>> {
    if keys.len() > max {
        return Err(ApiError::invalid(format!(
            "{} keys in one request; the limit is {max}",
            keys.len()
        )));
    }
    keys.iter().map(|k| parse_key(k)).collect()
}

/// The node's name of the caller's namespace `ns` (its tenant's, see [`Principal::scope`]).
pub(crate) fn scope(p: &Principal, ns: &str) -> ApiResult<String> {
    p.scope(ns).map_err(|e| ApiError::invalid(e.to_string()))
}

/// A namespace's info under the caller's name for it.
pub(crate) fn present(p: &Principal, mut info: NamespaceInfo) -> NamespaceInfo {
    if let Some(n) = p.unscope(&info.name) {
        info.name = n.to_string();
    }
    info
}

pub(crate) fn durability(h: &HeaderMap) -> ApiResult<Durability> {
    match h.get(ctxpod_wire::HEADER_DURABILITY) {
        None => Ok(Durability::Durable),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(Durability::parse)
            .ok_or_else(|| ApiError::invalid("x-ctxpod-durability must be durable or fast")),
    }
}

/// The request's Content-Length, if it has a valid one.
pub(crate) fn content_length(h: &HeaderMap) -> Option<usize> {
    h.get(header::CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}

/// The byte range a GET asks for (`Range: bytes=a-b`, `bytes=a-` or `bytes=-n`) of a value of
/// `len` bytes, as a half-open range clamped to the value; `None` without a `Range` header,
/// and (as RFC 9110 lets a server do) for one it does not take: another unit, several
/// ranges, a malformed one; the whole value is then answered. A range that starts past the
/// end (or a suffix of 0 bytes) answers 416.
pub(crate) fn byte_range(h: &HeaderMap, len: u64) -> ApiResult<Option<(u64, u64)>> {
    let Some(spec) = h
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.trim().strip_prefix("bytes="))
    else {
        return Ok(None);
    };
    let Some((a, b)) = spec.split_once('-') else {
        return Ok(None);
    };
    let num = |s: &str| s.trim().parse::<u64>().ok();
    let (lo, hi) = match (a.trim().is_empty(), b.trim().is_empty()) {
        (true, false) => match num(b) {
            Some(n) => (len.saturating_sub(n), len),
            None => return Ok(None),
        },
        (false, true) => match num(a) {
            Some(lo) => (lo, len),
            None => return Ok(None),
        },
        (false, false) => match (num(a), num(b)) {
            (Some(lo), Some(last)) if last >= lo => (lo, last.saturating_add(1).min(len)),
            _ => return Ok(None),
        },
        (true, true) => return Ok(None),
    };
    if lo >= len || hi <= lo {
        return Err(ApiError::new(
            axum::http::StatusCode::RANGE_NOT_SATISFIABLE,
            "range_not_satisfiable",
            format!("the range starts past the value's {len} bytes"),
        ));
    }
    Ok(Some((lo, hi)))
}

/// Bytes of an over-limit body read and discarded before answering 413, so that the client
/// reads the answer instead of a reset connection; bodies declared larger are cut off at once.
pub const DRAIN_BYTES_MAX: u64 = 64 << 20;

/// Reads a body of at most `max` bytes. A longer body is never buffered: it is drained (up
/// to [`DRAIN_BYTES_MAX`]) and refused with 413.
pub(crate) async fn read_body(h: &HeaderMap, mut body: Body, max: usize) -> ApiResult<Bytes> {
    use http_body_util::BodyExt;
    let too_large = || ApiError::too_large(format!("body over the limit of {max} bytes"));
    let declared = content_length(h).map(|l| l as u64);
    if declared.is_some_and(|l| l > DRAIN_BYTES_MAX) {
        return Err(too_large());
    }
    let mut over = declared.is_some_and(|l| l > max as u64);
    let mut buf = bytes::BytesMut::with_capacity(if over {
        0
    } else {
        declared.unwrap_or(0) as usize
    });
    let mut seen = 0u64;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ApiError::invalid(format!("reading the body: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        seen += data.len() as u64;
        if !over && seen > max as u64 {
            over = true;
            buf = bytes::BytesMut::new();
        }
        if over {
            if seen > DRAIN_BYTES_MAX {
                break;
            }
        } else {
            buf.extend_from_slice(&data);
        }
    }
    if over {
        return Err(too_large());
    }
    Ok(buf.freeze())
}

/// Receives a body of exactly the announced length into `staged`.
pub(crate) async fn read_into(mut body: Body, staged: &mut StagedBlock) -> ApiResult<()> {
    use http_body_util::BodyExt;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ApiError::invalid(format!("reading the body: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if !staged.append(&data) {
            return Err(ApiError::invalid("body longer than its Content-Length"));
        }
    }
    if !staged.is_complete() {
        return Err(ApiError::invalid("body shorter than its Content-Length"));
    }
    Ok(())
}

/// The client's CRC32C of the body (`x-ctxpod-crc32c`), if it sent one.
pub(crate) fn client_crc(h: &HeaderMap) -> ApiResult<Option<u32>> {
    match h.get(ctxpod_wire::HEADER_CRC32C) {
        None => Ok(None),
        Some(v) => Ok(Some(
            v.to_str()
                .ok()
                .and_then(ctxpod_wire::parse_crc32c_hex)
                .ok_or_else(|| ApiError::invalid("x-ctxpod-crc32c must be 8 hex digits"))?,
        )),
    }
}

/// Receives a value's (or a part's) body of exactly its announced length into `w`, piece by piece: each
/// piece is staged as it arrives and handed to the engine whole, so at most one piece (and
/// the engine's extents in flight) is held.
pub(crate) async fn read_pieces_into(
    mut body: Body,
    w: &mut impl ctxpod_engine::Pieces,
    received: &prometheus::IntCounter,
) -> ApiResult<()> {
    use http_body_util::BodyExt;
    let mut staged: Option<StagedBlock> = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ApiError::invalid(format!("reading the body: {e}")))?;
        let Ok(mut data) = frame.into_data() else {
            continue;
        };
        received.inc_by(data.len() as u64);
        while !data.is_empty() {
            let want = w.next_piece_len();
            if want == 0 {
                return Err(ApiError::invalid("body longer than its Content-Length"));
            }
            let s = match &mut staged {
                Some(s) => s,
                None => staged.insert(StagedBlock::new(want)?),
            };
            let room = s.len() - s.payload().len();
            s.append(&data.split_to(room.min(data.len())));
            if s.is_complete() {
                let full = staged.take().expect("a piece is being staged");
                w.write_piece(full).await?;
            }
        }
    }
    if w.next_piece_len() > 0 {
        return Err(ApiError::invalid("body shorter than its Content-Length"));
    }
    Ok(())
}

pub(crate) async fn read_json<T: serde::de::DeserializeOwned>(
    h: &HeaderMap,
    body: Body,
) -> ApiResult<T> {
    let b = read_body(h, body, JSON_BODY_BYTES_MAX).await?;
    json_object(&b)
}

/// A JSON request body, which must be an object: serde's derived `Deserialize` takes an
/// array for a struct (its fields in order), which no client means (found by the contract
/// fuzzer: `[null, null]` created a namespace).
pub(crate) fn json_object<T: serde::de::DeserializeOwned>(b: &[u8]) -> ApiResult<T> {
    let v: serde_json::Value =
        serde_json::from_slice(b).map_err(|e| ApiError::invalid(format!("bad JSON body: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::invalid(
            "bad JSON body: a JSON object is expected",
        ));
    }
    serde_json::from_value(v).map_err(|e| ApiError::invalid(format!("bad JSON body: {e}")))
}

/// `axum::extract::Path` whose refusal (a segment that is not UTF-8, or not of its type)
/// is the JSON 400 every other bad input gets, not axum's plain text.
pub struct Path<T>(pub T);

impl<T, S> axum::extract::FromRequestParts<S> for Path<T>
where
    T: serde::de::DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(v)) => Ok(Path(v)),
            Err(e) => Err(ApiError::invalid(format!("bad path: {}", e.body_text()))),
        }
    }
}

/// The caller, set by the authentication middleware.
fn principal(parts: &axum::http::request::Parts) -> ApiResult<Principal> {
    parts.extensions.get::<Principal>().cloned().ok_or_else(|| {
        ApiError::new(
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "no caller: the authentication layer did not run",
        )
    })
}

/// A request to one namespace (`/v1/namespaces/{ns}/…`): the node's state, the caller, and
/// the namespace under the caller's name (`ns`) and the node's (`scoped`, see [`scope`]).
pub(crate) struct NsCall {
    pub st: AppState,
    pub p: Principal,
    pub ns: String,
    pub scoped: String,
}

impl NsCall {
    /// The call of the caller in `parts` to its namespace `ns`.
    pub(crate) fn of(
        parts: &axum::http::request::Parts,
        st: &AppState,
        ns: String,
    ) -> ApiResult<NsCall> {
        let p = principal(parts)?;
        let scoped = scope(&p, &ns)?;
        Ok(NsCall {
            st: st.clone(),
            p,
            ns,
            scoped,
        })
    }
}

impl axum::extract::FromRequestParts<AppState> for NsCall {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        st: &AppState,
    ) -> Result<Self, ApiError> {
        let Path(ns) = Path::<String>::from_request_parts(parts, st).await?;
        NsCall::of(parts, st, ns)
    }
}

/// A request to one block (`/v1/namespaces/{ns}/blocks/{key}`): the node's state, the
/// caller, the node's name of the namespace (`ns`, scoped) and the key, parsed.
pub(crate) struct BlockCall {
    pub st: AppState,
    pub p: Principal,
    pub ns: String,
    pub key: Vec<u8>,
}

impl axum::extract::FromRequestParts<AppState> for BlockCall {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        st: &AppState,
    ) -> Result<Self, ApiError> {
        let Path((ns, key)) = Path::<(String, String)>::from_request_parts(parts, st).await?;
        let NsCall { st, p, scoped, .. } = NsCall::of(parts, st, ns)?;
        let key = parse_key(&key)?;
        Ok(BlockCall {
            st,
            p,
            ns: scoped,
            key,
        })
    }
}

/// A JSON body `{"keys": [hex, …]}` ([`KeysRequest`]) of at most `MAX` keys, parsed.
pub(crate) struct Keys<const MAX: usize>(pub Vec<Vec<u8>>);

impl<const MAX: usize, S: Send + Sync> axum::extract::FromRequest<S> for Keys<MAX> {
    type Rejection = ApiError;

    async fn from_request(req: axum::extract::Request, _: &S) -> Result<Self, ApiError> {
        let (parts, body) = req.into_parts();
        let req: KeysRequest = read_json(&parts.headers, body).await?;
        Ok(Keys(parse_keys(&req.keys, MAX)?))
    }
}
