//! Single blocks: PUT, GET, HEAD, DELETE, the key-list reads MATCH and `present`, and the
//! key listing.

use axum::body::Body;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use ctxpod_engine::{EngineError, PutStatus, StagedBlock};
use ctxpod_pod::listing::PageError;
use ctxpod_wire::types::*;
use std::time::Duration;

use super::input::{content_length, durability, read_body, read_into};
use super::input::{BlockCall, Keys, NsCall};
use super::state::AppState;
use crate::auth::Principal;
use crate::errors::{ApiError, ApiResult};

pub(crate) async fn put_block(
    BlockCall { st, p, ns, key }: BlockCall,
    sock: ClientSocket,
    h: HeaderMap,
    body: Body,
) -> ApiResult<StatusCode> {
    let dur = durability(&h)?;
    let crc = super::input::client_crc(&h)?;
    st.refuse_deleted_copy(&h, &ns, &key)?;
    let declared = content_length(&h);
    st.check_tenant_bytes(&p, declared.unwrap_or(0))?;
    if let Some(len) = declared.filter(|&l| l > ctxpod_wire::BLOCK_BYTES_MAX) {
        return put_value(&st, (&ns, &key), len as u64, body, (crc, dur), sock).await;
    }
    let _permit = st.admit_body(
        declared
            .unwrap_or(ctxpod_wire::BLOCK_BYTES_MAX)
            .min(ctxpod_wire::BLOCK_BYTES_MAX),
    )?;
    let staged = match declared {
        // The common case: the body goes straight into the buffer its record is written from.
        Some(len) if len <= ctxpod_wire::BLOCK_BYTES_MAX => {
            let mut staged = StagedBlock::new(len)?;
            read_into(body, &mut staged).await?;
            staged
        }
        _ => StagedBlock::copy_of(&read_body(&h, body, ctxpod_wire::BLOCK_BYTES_MAX).await?)?,
    };
    st.metrics.received_bytes.inc_by(staged.len() as u64);
    sock.still_there(&st)?;
    let status = st.engine.put_staged(&ns, &key, staged, crc, dur).await?;
    st.undo_deleted_copy(&h, &ns, &key).await?;
    match status {
        PutStatus::Created => Ok(StatusCode::CREATED),
        PutStatus::Exists => Ok(StatusCode::OK),
    }
}

/// A PUT of a value over one record (`len` bytes, announced): streamed into the engine
/// extent by extent ([`ctxpod_engine::ValueWriter`]), holding at most
/// [`ctxpod_engine::VALUE_WRITE_BYTES_MAX`] of the ingest budget, never the whole value.
async fn put_value(
    st: &AppState,
    (ns, key): (&str, &[u8]),
    len: u64,
    body: Body,
    (crc, dur): (Option<u32>, ctxpod_wire::Durability),
    sock: ClientSocket,
) -> ApiResult<StatusCode> {
    let _permit = st.admit_body((len as usize).min(ctxpod_engine::VALUE_WRITE_BYTES_MAX))?;
    let mut w = st.engine.begin_value(ns, key, len, dur).await?;
    super::input::read_pieces_into(body, &mut w, &st.metrics.received_bytes).await?;
    sock.still_there(st)?;
    match w.finish(crc).await? {
        PutStatus::Created => Ok(StatusCode::CREATED),
        PutStatus::Exists => Ok(StatusCode::OK),
    }
}

pub(crate) async fn get_block(
    BlockCall { st, p, ns, key }: BlockCall,
    Peer(peer): Peer,
    h: HeaderMap,
) -> ApiResult<Response> {
    let not_found = || ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such block");
    // The block's bytes are taken from the egress budget before it is read, and given back
    // once the body is written out.
    let Some(found) = st.engine.find(&ns, &key)? else {
        return Err(not_found());
    };
    let len = found.len();
    let range = super::input::byte_range(&h, len as u64)?;
    if len > ctxpod_wire::BLOCK_BYTES_MAX {
        let client = crate::budget::Client::at(peer, &p);
        return get_value(&st, client, (&ns, &key), range).await;
    }
    // Only the range's bytes are read (a segmented record: the segments that hold them)
    // and held in the egress budget.
    let want = range.map_or(len, |(lo, hi)| (hi.min(len as u64) - lo) as usize);
    let permits = st
        .admit_egress(crate::budget::Client::at(peer, &p), want)
        .await?;
    match st.engine.read_found_range(&key, found, range).await? {
        // The range was taken against the length found; another length is another block.
        Some(part) if part.len != len as u64 => Err(ApiError::busy(
            "the block was replaced while it was read; retry",
        )),
        Some(part) => {
            let (total, crc, data) = (part.len, part.crc32c, part.bytes);
            let (lo, hi) = range.map_or((0, total), |(lo, hi)| (lo, hi.min(total)));
            st.metrics.sent_bytes.inc_by(data.len() as u64);
            let body = body_holding(vec![data], permits);
            Ok(value_answer(crc, total, range.map(|_| (lo, hi)), body))
        }
        None => Err(not_found()),
    }
}

/// A GET's answer: 200 with the whole value's length, or 206 with the range's and its
/// `Content-Range`; the CRC32C is always the whole value's.
fn value_answer(crc: u32, total: u64, range: Option<(u64, u64)>, body: Body) -> Response {
    let mut r = Response::new(body);
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/octet-stream"),
    );
    let hv = |s: String| header::HeaderValue::from_str(&s).expect("ASCII digits");
    h.insert(
        header::HeaderName::from_static(ctxpod_wire::HEADER_CRC32C),
        hv(ctxpod_wire::crc32c_hex(crc)),
    );
    h.insert(
        header::ACCEPT_RANGES,
        header::HeaderValue::from_static("bytes"),
    );
    match range {
        None => {
            h.insert(header::CONTENT_LENGTH, hv(total.to_string()));
        }
        Some((lo, hi)) => {
            h.insert(header::CONTENT_LENGTH, hv((hi - lo).to_string()));
            h.insert(
                header::CONTENT_RANGE,
                hv(format!("bytes {lo}-{}/{total}", hi.saturating_sub(1))),
            );
            *r.status_mut() = StatusCode::PARTIAL_CONTENT;
        }
    }
    r
}

/// A GET of a value over one record: streamed out extent by extent as the client takes
/// it, holding at most [`ctxpod_engine::VALUE_READ_BYTES_MAX`] of the egress budget (the
/// client's share, so a slow reader holds its own share only).
async fn get_value(
    st: &AppState,
    client: Option<crate::budget::Client>,
    (ns, key): (&str, &[u8]),
    range: Option<(u64, u64)>,
) -> ApiResult<Response> {
    let Some(reader) = st.engine.open_value(ns, key, range).await? else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "no such block",
        ));
    };
    let total = reader.len();
    let range = range.map(|(lo, hi)| (lo, hi.min(total)));
    let n = range.map_or(total, |(lo, hi)| hi - lo) as usize;
    let permits = st
        .admit_egress(client, n.min(ctxpod_engine::VALUE_READ_BYTES_MAX))
        .await?;
    let crc = reader.crc32c();
    let body = body_streaming(reader, permits, st.metrics.sent_bytes.clone());
    Ok(value_answer(crc, total, range, body))
}

/// A response body that reads `reader` piece by piece as the connection takes it (each
/// piece cut into [`BODY_PIECE_BYTES`] slices), holding `permits` until its end. A piece
/// that fails its checks ends the body early: the client sees a body shorter than its
/// Content-Length (and a CRC32C that does not match), never wrong bytes.
pub(crate) fn body_streaming(
    reader: ctxpod_engine::ValueReader,
    permits: Vec<crate::budget::Permit>,
    sent: prometheus::IntCounter,
) -> Body {
    struct St {
        reader: ctxpod_engine::ValueReader,
        piece: Bytes,
        _permits: Vec<crate::budget::Permit>,
        sent: prometheus::IntCounter,
    }
    let state = St {
        reader,
        piece: Bytes::new(),
        _permits: permits,
        sent,
    };
    Body::from_stream(futures::stream::unfold(state, |mut s| async move {
        if s.piece.is_empty() {
            match s.reader.next_piece().await {
                Ok(Some(p)) => s.piece = p,
                Ok(None) => return None,
                Err(e) => {
                    tracing::warn!("a streamed value ends early: {e}");
                    return Some((Err(std::io::Error::other(e.to_string())), s));
                }
            }
        }
        let n = s.piece.len().min(BODY_PIECE_BYTES);
        let out = s.piece.split_to(n);
        s.sent.inc_by(n as u64);
        Some((Ok::<_, std::io::Error>(out), s))
    }))
}

/// The caller's address, when the listener gave it.
pub(crate) struct Peer(pub Option<std::net::IpAddr>);

/// The connection's [`crate::conn::PeerInfo`], as the HTTP server put it on each request.
fn peer_info(parts: &axum::http::request::Parts) -> Option<&crate::conn::PeerInfo> {
    parts
        .extensions
        .get::<axum::extract::ConnectInfo<crate::conn::PeerInfo>>()
        .map(|c| &c.0)
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Peer {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(Peer(peer_info(parts).map(|p| p.addr.ip())))
    }
}

/// The socket of the request's connection ([`crate::conn::PeerInfo::fd`]).
pub(crate) struct ClientSocket(Option<std::os::fd::RawFd>);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for ClientSocket {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(ClientSocket(peer_info(parts).map(|p| p.fd)))
    }
}

impl ClientSocket {
    /// Refuses a write whose client closed or reset the connection while it waited to be
    /// applied ([`crate::conn::client_gone`]): the client gave up on it (a forwarding node
    /// past its stall bound, a frozen member thawed), so applying it now could undo a delete
    /// made since. Not applied, counted in `ctxpod_abandoned_writes_total`.
    pub(crate) fn still_there(&self, st: &AppState) -> ApiResult<()> {
        if self.0.is_some_and(crate::conn::client_gone) {
            st.metrics.abandoned_writes.inc();
            return Err(ApiError::new(
                StatusCode::from_u16(499).expect("a valid status"),
                "client_gone",
                "the client closed the connection before the write was applied: not applied",
            ));
        }
        Ok(())
    }
}

/// Bytes of a body handed to hyper at a time: it asks for the next piece only once it has
/// room for it, so what a body holds is given back as its bytes leave.
pub(crate) const BODY_PIECE_BYTES: usize = 64 << 10;

/// A response body of `pieces` (cut into [`BODY_PIECE_BYTES`] slices, no copy) that holds
/// `permits` until its last piece is handed to the connection: a client that never reads
/// keeps its answer's share of the budgets, not more.
pub(crate) fn body_holding(pieces: Vec<Bytes>, permits: Vec<crate::budget::Permit>) -> Body {
    let mut slices = Vec::new();
    for p in pieces {
        let mut at = 0;
        while at < p.len() {
            let end = (at + BODY_PIECE_BYTES).min(p.len());
            slices.push(p.slice(at..end));
            at = end;
        }
    }
    let state = (slices.into_iter(), permits);
    Body::from_stream(futures::stream::unfold(
        state,
        |(mut it, permits)| async move {
            it.next()
                .map(|piece| (Ok::<_, std::convert::Infallible>(piece), (it, permits)))
        },
    ))
}

/// Whether the block is held, and if so its length (`Content-Length`, the length a GET
/// would send), CRC32C and when it was stored (`x-ctxpod-stored-ms`); no body.
pub(crate) async fn head_block(BlockCall { st, ns, key, .. }: BlockCall) -> ApiResult<Response> {
    // A member fenced out of the pod serves no block: HEAD answers as GET does.
    let meta = match st.engine.may_serve() {
        true => st.engine.block_meta(&ns, &key).await?,
        false => None,
    };
    Ok(match meta {
        Some(m) => (
            [
                (header::CONTENT_TYPE, "application/octet-stream".to_string()),
                (
                    header::HeaderName::from_static(ctxpod_wire::HEADER_CRC32C),
                    ctxpod_wire::crc32c_hex(m.crc32c),
                ),
                (
                    header::HeaderName::from_static(ctxpod_wire::HEADER_STORED_MS),
                    m.stored_ms.to_string(),
                ),
                (header::CONTENT_LENGTH, m.len.to_string()),
            ],
            Body::empty(),
        )
            .into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    })
}

pub(crate) async fn delete_block(
    BlockCall { st, ns, key, .. }: BlockCall,
    sock: ClientSocket,
    h: HeaderMap,
) -> ApiResult<StatusCode> {
    sock.still_there(&st)?;
    // Settling a delete the pod recorded: the tombstone taken before the copy is deleted,
    // so that no copy of the block is taken here from now on.
    if let Some(t) = st.tombstones.as_ref().filter(|_| {
        h.contains_key(ctxpod_wire::HEADER_DELETE_RECORDED)
            && h.contains_key(ctxpod_pod::route::HEADER_FORWARDED)
    }) {
        t.learn_recorded(&ns, &key);
    }
    if st.engine.delete(&ns, &key).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "no such block",
        ))
    }
}

pub(crate) async fn match_prefix(
    NsCall { st, p, ns, scoped }: NsCall,
    h: HeaderMap,
    Keys(keys): Keys<{ ctxpod_wire::MATCH_KEYS_MAX }>,
) -> ApiResult<Json<MatchResponse>> {
    let view = st.pod.view();
    if view.members.len() < 2 || h.contains_key(ctxpod_pod::route::HEADER_FORWARDED) {
        return Ok(Json(MatchResponse {
            matched: st.engine.match_prefix(&scoped, keys).await?,
        }));
    }
    // A chain whose blocks live on several members: each member is asked about its own
    // keys, all at once (the pod's `Coordinator::match_chain`).
    let ask = |member: &ctxpod_pod::membership::MemberInfo, pos: Vec<usize>| {
        let sub: Vec<Vec<u8>> = pos.iter().map(|&i| keys[i].clone()).collect();
        let (st, scoped, ns, h, p) = (&st, &scoped, &ns, &h, &p);
        let member = member.clone();
        async move {
            if member.id == *st.node_id {
                let held = st.engine.match_prefix(scoped, sub).await?;
                return Ok::<usize, ApiError>(held as usize);
            }
            let req = st
                .peers
                .http
                .post(format!("{}/v1/namespaces/{ns}/match", member.http))
                .timeout(Duration::from_secs(10))
                .header(ctxpod_pod::route::HEADER_FORWARDED, st.node_id.as_ref())
                .json(&KeysRequest {
                    keys: sub.iter().map(hex::encode).collect(),
                });
            let sent = st
                .peers
                .for_caller(req, h, p.tenant.as_deref())
                .send()
                .await;
            match sent {
                Ok(r) if r.status().is_success() => match r.json::<MatchResponse>().await {
                    Ok(a) => Ok(a.matched as usize),
                    Err(e) => Err(ApiError::new(
                        StatusCode::BAD_GATEWAY,
                        "pod_match",
                        format!("MATCH across the pod failed: {e}"),
                    )),
                },
                // A member that cannot answer holds nothing as far as this match goes.
                _ => Ok(0),
            }
        }
    };
    let copies = st.replication_of(&scoped);
    let matched = st
        .coordinator()
        .match_chain(&view, &ns, &keys, copies, ask)
        .await?;
    Ok(Json(MatchResponse {
        matched: matched as _,
    }))
}

/// Whether each key is held: here, or in a pod by any member a read would try (each
/// member is asked about the keys it may hold, all at once; one that cannot answer holds
/// none of them).
pub(crate) async fn present_keys(
    NsCall { st, p, ns, scoped }: NsCall,
    h: HeaderMap,
    Keys(keys): Keys<{ ctxpod_wire::MATCH_KEYS_MAX }>,
) -> ApiResult<Json<PresentResponse>> {
    st.engine.namespace(&scoped)?;
    let local = |idx: Vec<usize>| {
        let (st, scoped, keys) = (&st, &scoped, &keys);
        async move {
            let mut out = Vec::with_capacity(idx.len());
            for i in idx {
                out.push(st.engine.contains(scoped, &keys[i]).await?);
            }
            Ok::<_, EngineError>(out)
        }
    };
    if !st.answers_for_pod(&h) {
        let present = local((0..keys.len()).collect()).await?;
        return Ok(Json(PresentResponse { present }));
    }
    let view = st.pod.view();
    let asker = st.asker(&ns, &h, &p);
    let present = st
        .any_candidate(&view, &ns, &scoped, &keys, |m, idx| {
            let (asker, keys, local, st) = (&asker, &keys, &local, &st);
            async move {
                if m.id == *st.node_id {
                    return local(idx).await.ok();
                }
                let ks: Vec<&[u8]> = idx.iter().map(|&i| &keys[i][..]).collect();
                asker.present(m, &ks).await.ok()
            }
        })
        .await;
    Ok(Json(PresentResponse { present }))
}

/// The query of a key listing: `prefix` and `after` as lowercase hex, `limit` keys a page.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    #[serde(default)]
    prefix: String,
    after: Option<String>,
    limit: Option<usize>,
    /// Whether the answer carries each block's length, CRC32C and time stored.
    #[serde(default)]
    meta: bool,
}

/// `GET /v1/namespaces/{ns}/blocks?prefix=&after=&limit=`: one page of the namespace's
/// keys in byte order, `next` set when there may be more. In a pod, every member is asked
/// for the same page and the pages are merged (`ctxpod_wire::pod_plan::fold_pages`); a member
/// that cannot answer fails the listing (503, or the status it refused with), since a page
/// without its keys would look complete; one that does not know the namespace yet holds
/// none of its keys.
pub(crate) async fn list_blocks(
    NsCall { st, p, ns, scoped }: NsCall,
    h: HeaderMap,
    uri: axum::http::Uri,
) -> ApiResult<Json<KeyList>> {
    let q = axum::extract::Query::<ListQuery>::try_from_uri(&uri)
        .map_err(|e| ApiError::invalid(format!("bad query: {}", e.body_text())))?
        .0;
    let prefix = if q.prefix.is_empty() {
        Vec::new()
    } else {
        ctxpod_wire::key::parse_key_hex(&q.prefix)
            .map_err(|e| ApiError::invalid(format!("prefix: {e}")))?
    };
    let after = match &q.after {
        Some(a) => Some(
            ctxpod_wire::key::parse_key_hex(a)
                .map_err(|e| ApiError::invalid(format!("after: {e}")))?,
        ),
        None => None,
    };
    let limit = q.limit.unwrap_or(ctxpod_wire::LIST_KEYS_MAX);
    if !(1..=ctxpod_wire::LIST_KEYS_MAX).contains(&limit) {
        return Err(ApiError::invalid(format!(
            "limit is 1..={} keys a page",
            ctxpod_wire::LIST_KEYS_MAX
        )));
    }
    let (entries, more) = pod_page(&st, &p, &ns, &scoped, &h, &prefix, after, limit).await?;
    let next = if more {
        entries.last().map(|(k, _)| hex::encode(k))
    } else {
        None
    };
    let keys = entries.iter().map(|(k, _)| hex::encode(k)).collect();
    let blocks = q
        .meta
        .then(|| entries.into_iter().map(|(_, b)| b).collect());
    Ok(Json(KeyList { keys, blocks, next }))
}

/// A page of a namespace's keys as this node asks a member for it
/// ([`ctxpod_pod::listing::Pages`]): its own engine for itself, HTTP for the others (on
/// behalf of the caller).
struct PagesOverHttp<'a> {
    st: &'a AppState,
    asker: ctxpod_pod::batch::Asker<'a>,
    scoped: &'a str,
}

#[async_trait::async_trait]
impl ctxpod_pod::listing::Pages for PagesOverHttp<'_> {
    type Entry = ListedBlock;
    type Error = ApiError;

    async fn page(
        &self,
        m: Option<&ctxpod_pod::membership::MemberInfo>,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<ctxpod_pod::listing::Page<ListedBlock>, PageError<ApiError>> {
        use ctxpod_pod::listing::OwnPageError;
        let Some(m) = m else {
            let own =
                ctxpod_pod::listing::own_page(&self.st.engine, self.scoped, prefix, after, limit);
            return own.await.map_err(|e| {
                PageError::Failed(match e {
                    OwnPageError::Fenced => {
                        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "fenced", e.to_string())
                    }
                    OwnPageError::Engine(e) => e.into(),
                    OwnPageError::Join(_) => {
                        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
                    }
                })
            });
        };
        match self.asker.list(m, prefix, after, limit).await {
            Ok(page) => Ok(page),
            Err(ctxpod_pod::batch::PeerError::Refused(404)) => Err(PageError::UnknownNamespace),
            Err(e) => {
                let status = e
                    .status()
                    .and_then(|s| StatusCode::from_u16(s).ok())
                    .unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
                Err(PageError::Failed(ApiError::new(
                    status,
                    "pod_list",
                    format!("member {} could not list its keys: {e}", m.id),
                )))
            }
        }
    }
}

/// One page of a namespace's keys (from `after`, under `prefix`, at most `limit`) and
/// whether there may be more: this node's, merged with every other member's when it
/// answers for the pod (the pod's listing, [`ctxpod_pod::listing`]). A fenced member lists
/// nothing (503 `fenced`); a member that cannot answer fails the page (503, or the status
/// it refused with).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn pod_page(
    st: &AppState,
    p: &Principal,
    ns: &str,
    scoped: &str,
    h: &HeaderMap,
    prefix: &[u8],
    after: Option<Vec<u8>>,
    limit: usize,
) -> ApiResult<(Vec<(Vec<u8>, ListedBlock)>, bool)> {
    let pages = PagesOverHttp {
        st,
        asker: st.asker(ns, h, p),
        scoped,
    };
    let view = st.pod.view();
    let whole_pod = st.answers_for_pod(h);
    st.coordinator()
        .list(&view, whole_pod, &pages, prefix, after.as_deref(), limit)
        .await
}
