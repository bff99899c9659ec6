//! Multipart uploads of one value (the S3 door's CreateMultipartUpload, UploadPart,
//! CompleteMultipartUpload, AbortMultipartUpload, ListParts and ListMultipartUploads go
//! through these): `POST …/blocks/{key}/uploads` starts one, `PUT …/uploads/{id}/parts/{n}`
//! streams a part into extents, `POST …/uploads/{id}` with `{"parts": [n, …]}` completes
//! it (no byte copied), `DELETE …/uploads/{id}` aborts it, `GET …/uploads/{id}` lists its
//! parts and `GET /v1/namespaces/{ns}/uploads` the namespace's uploads. An upload id is 16
//! hex digits. Uploads live in one node's memory: in a pod of several members every
//! request of a key's uploads is served by the key's first-ranked member (`route_in_pod`),
//! which, once an upload completes, copies the value to the key's other members
//! (`pod_values::replicate_upload`). Listing a namespace's uploads asks every member.

use axum::body::Body;
use axum::extract::Path;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ctxpod_engine::PutStatus;
use ctxpod_wire::types::{PartEntry, PartList, UploadEntry, UploadList};
use serde::Deserialize;

use super::input::{content_length, parse_key, scope, NsCall};
use super::state::AppState;
use crate::auth::Principal;
use crate::errors::{ApiError, ApiResult};

/// A completion: the parts that make the value, ascending.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Complete {
    parts: Vec<u32>,
}

/// The node's state, the caller's scoped namespace and the key of an upload request.
struct UploadCall {
    st: AppState,
    ns: String,
    key: Vec<u8>,
}

/// The call to an upload of `key` in `ns`, the namespace known to exist (so that a
/// `NotFound` of the engine after this is the upload's).
fn call(st: AppState, p: &Principal, ns: &str, key: &str) -> ApiResult<UploadCall> {
    let c = UploadCall {
        ns: scope(p, ns)?,
        key: parse_key(key)?,
        st,
    };
    c.st.engine.namespace(&c.ns)?;
    Ok(c)
}

/// An engine error of an upload: its `NotFound` is the upload's (404 `not_found`).
fn upload_error(e: ctxpod_engine::EngineError) -> ApiError {
    match e {
        ctxpod_engine::EngineError::NotFound(_) => no_such_upload(),
        e => e.into(),
    }
}

fn parse_part(s: &str) -> ApiResult<u32> {
    s.parse::<u32>()
        .ok()
        .filter(|n| (1..=ctxpod_engine::UPLOAD_PARTS_MAX).contains(n))
        .ok_or_else(|| ApiError::invalid("a part number is 1..=10000"))
}

fn parse_id(s: &str) -> ApiResult<u64> {
    (s.len() == 16)
        .then(|| u64::from_str_radix(s, 16).ok())
        .flatten()
        .ok_or_else(|| ApiError::invalid("an upload id is 16 hex digits"))
}

fn id_hex(id: u64) -> String {
    format!("{id:016x}")
}

/// `POST /v1/namespaces/{ns}/blocks/{key}/uploads`.
pub(crate) async fn create_upload(
    axum::extract::State(st): axum::extract::State<AppState>,
    axum::Extension(p): axum::Extension<Principal>,
    Path((ns, key)): Path<(String, String)>,
) -> ApiResult<Json<UploadEntry>> {
    let c = call(st, &p, &ns, &key)?;
    let id = c.st.engine.create_upload(&c.ns, &c.key).await?;
    Ok(Json(UploadEntry {
        key,
        upload_id: id_hex(id),
        started_ms: ctxpod_engine::now_ms(),
    }))
}

/// `PUT /v1/namespaces/{ns}/blocks/{key}/uploads/{upload}/parts/{part}`: the part's body
/// (its length announced) streamed into extents; `x-ctxpod-crc32c` checked when sent.
pub(crate) async fn upload_part(
    axum::extract::State(st): axum::extract::State<AppState>,
    axum::Extension(p): axum::Extension<Principal>,
    Path((ns, key, id, part)): Path<(String, String, String, String)>,
    h: HeaderMap,
    body: Body,
) -> ApiResult<Json<PartEntry>> {
    let c = call(st, &p, &ns, &key)?;
    let (id, part) = (parse_id(&id)?, parse_part(&part)?);
    let crc = super::input::client_crc(&h)?;
    let len = content_length(&h)
        .ok_or_else(|| ApiError::invalid("a part announces its length (Content-Length)"))?;
    c.st.check_tenant_bytes(&p, len)?;
    let _permit =
        c.st.admit_body(len.min(ctxpod_engine::VALUE_WRITE_BYTES_MAX))?;
    let mut w =
        c.st.engine
            .upload_part(&c.ns, &c.key, id, (part, len as u64))
            .await
            .map_err(upload_error)?;
    super::input::read_pieces_into(body, &mut w, &c.st.metrics.received_bytes).await?;
    let info = w.finish(crc).await?;
    Ok(Json(PartEntry {
        part: info.number,
        len: info.len,
        crc32c: info.crc32c,
    }))
}

/// `POST /v1/namespaces/{ns}/blocks/{key}/uploads/{upload}`: completes the upload; 201
/// (stored) or 200 (the same bytes were there), with the value's CRC32C.
pub(crate) async fn complete_upload(
    axum::extract::State(st): axum::extract::State<AppState>,
    axum::Extension(p): axum::Extension<Principal>,
    Path((ns, key, id)): Path<(String, String, String)>,
    h: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let c = call(st, &p, &ns, &key)?;
    let id = parse_id(&id)?;
    let req: Complete = super::input::read_json(&h, body).await?;
    let status =
        c.st.engine
            .complete_upload(&c.ns, &c.key, id, &req.parts)
            .await
            .map_err(|e| match e {
                ctxpod_engine::EngineError::Invalid(m) => {
                    ApiError::new(StatusCode::CONFLICT, "invalid_part", m)
                }
                e => upload_error(e),
            })?;
    let meta = c.st.engine.block_meta(&c.ns, &c.key).await?;
    let (crc, len) = meta.map_or((0, 0), |m| (m.crc32c, m.len as u64));
    // In a pod, the value's other copies, before the completion is answered.
    super::pod_values::replicate_upload(&c.st, (&h, &p), (&ns, &c.key), (&c.ns, len)).await?;
    let code = match status {
        PutStatus::Created => StatusCode::CREATED,
        PutStatus::Exists => StatusCode::OK,
    };
    Ok((
        code,
        [(
            header::HeaderName::from_static(ctxpod_wire::HEADER_CRC32C),
            ctxpod_wire::crc32c_hex(crc),
        )],
    )
        .into_response())
}

/// `DELETE /v1/namespaces/{ns}/blocks/{key}/uploads/{upload}`: 204, or 404 (no such upload).
pub(crate) async fn abort_upload(
    axum::extract::State(st): axum::extract::State<AppState>,
    axum::Extension(p): axum::Extension<Principal>,
    Path((ns, key, id)): Path<(String, String, String)>,
) -> ApiResult<StatusCode> {
    let c = call(st, &p, &ns, &key)?;
    let id = parse_id(&id)?;
    if c.st
        .engine
        .abort_upload(&c.ns, &c.key, id)
        .map_err(upload_error)?
    {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(no_such_upload())
    }
}

fn no_such_upload() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such upload")
}

/// `GET /v1/namespaces/{ns}/blocks/{key}/uploads/{upload}`: its parts so far.
pub(crate) async fn list_parts(
    axum::extract::State(st): axum::extract::State<AppState>,
    axum::Extension(p): axum::Extension<Principal>,
    Path((ns, key, id)): Path<(String, String, String)>,
) -> ApiResult<Json<PartList>> {
    let c = call(st, &p, &ns, &key)?;
    let id = parse_id(&id)?;
    let parts =
        c.st.engine
            .list_parts(&c.ns, &c.key, id)
            .map_err(upload_error)?;
    Ok(Json(PartList {
        parts: parts
            .into_iter()
            .map(|i| PartEntry {
                part: i.number,
                len: i.len,
                crc32c: i.crc32c,
            })
            .collect(),
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UploadsQuery {
    #[serde(default)]
    prefix: String,
}

/// `GET /v1/namespaces/{ns}/uploads?prefix=`: the uploads in progress, by key then id. In a
/// pod of several, every member's (each upload lives on its key's first member); a member
/// that cannot be asked makes it 503 rather than a listing that hides its uploads.
pub(crate) async fn list_uploads(
    NsCall { st, p, ns, scoped }: NsCall,
    h: HeaderMap,
    uri: axum::http::Uri,
) -> ApiResult<Json<UploadList>> {
    let q = axum::extract::Query::<UploadsQuery>::try_from_uri(&uri)
        .map_err(|e| ApiError::invalid(format!("bad query: {}", e.body_text())))?
        .0;
    let prefix = hex::decode(&q.prefix).map_err(|_| ApiError::invalid("prefix: not hex"))?;
    let mut uploads: Vec<UploadEntry> = st
        .engine
        .list_uploads(&scoped, &prefix)?
        .into_iter()
        .map(|u| UploadEntry {
            key: hex::encode(&u.key),
            upload_id: id_hex(u.id),
            started_ms: u.started_ms,
        })
        .collect();
    if st.answers_for_pod(&h) {
        let view = st.pod.view();
        let asker = st.asker(&ns, &h, &p);
        let others = view.members.iter().filter(|m| m.id != *st.node_id);
        let asked = futures::future::join_all(others.map(|m| asker.uploads(m, &prefix))).await;
        for got in asked {
            let list = got.map_err(|e| {
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    format!("a member's uploads could not be listed: {e}"),
                )
            })?;
            uploads.extend(list.uploads);
        }
        uploads.sort_by(|a, b| (&a.key, &a.upload_id).cmp(&(&b.key, &b.upload_id)));
    }
    Ok(Json(UploadList { uploads }))
}
