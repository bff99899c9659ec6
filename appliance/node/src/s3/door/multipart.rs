//! Multipart uploads: CreateMultipartUpload, UploadPart (`put.rs`), CompleteMultipartUpload,
//! AbortMultipartUpload, ListParts and ListMultipartUploads, each the HTTP API's upload
//! request (`/v1/namespaces/{bucket}/blocks/{key}/uploads…`, `crate::http::uploads`). The
//! upload id is the node's (16 hex digits); a part's ETag is its CRC32C, and so is the
//! completed object's (of the whole value, as for any object).

use super::*;
use ctxpod_wire::types::{PartList, UploadEntry, UploadList};

/// The node's upload id in an S3 upload id (16 lowercase hex digits); `NoSuchUpload` for
/// any other, which no upload of this door has.
pub(super) fn upload_id(id: &str) -> S3Result<&str> {
    if id.len() == 16
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        Ok(id)
    } else {
        Err(s3_error!(NoSuchUpload))
    }
}

/// The S3 error for a refusal of an upload request: an unknown upload is `NoSuchUpload`, a
/// part list that does not fit the upload `InvalidPart`, a pod of several `NotImplemented`;
/// the rest as any refusal.
pub(super) async fn upload_refusal(resp: http::Response<Body>) -> S3Error {
    let status = resp.status().as_u16();
    let kind_of = |b: &[u8]| {
        serde_json::from_slice::<ctxpod_wire::types::ErrorBody>(b)
            .map(|e| (e.error, e.message))
            .unwrap_or_default()
    };
    if matches!(status, 404 | 409 | 501) {
        let body = axum::body::to_bytes(resp.into_body(), 64 << 10)
            .await
            .unwrap_or_default();
        let (kind, msg) = kind_of(&body);
        return match (status, kind.as_str()) {
            (404, "no_such_namespace") => s3_error!(NoSuchBucket, "{msg}"),
            (404, _) => s3_error!(NoSuchUpload, "{msg}"),
            (409, "invalid_part") => s3_error!(InvalidPart, "{msg}"),
            (501, _) => s3_error!(NotImplemented, "{msg}"),
            _ => {
                let mut e = S3Error::with_message(
                    S3ErrorCode::Custom("ObjectImmutable".into()),
                    "the key holds other bytes: a block never changes under its key (delete it first)",
                );
                e.set_status_code(StatusCode::CONFLICT);
                e
            }
        };
    }
    refusal(resp, true).await
}

impl Door {
    /// The answer to an upload request `method path` (`json`: its body), or its refusal.
    async fn upload_call<T>(
        &self,
        req: &S3Request<T>,
        method: Method,
        path: String,
        json: Option<Vec<u8>>,
    ) -> S3Result<http::Response<Body>> {
        let mut h = HeaderMap::new();
        let body = match json {
            Some(j) => {
                h.insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("application/json"),
                );
                Body::from(j)
            }
            None => Body::empty(),
        };
        let resp = self.send(req, method, path, h, body).await?;
        if !resp.status().is_success() {
            return Err(upload_refusal(resp).await);
        }
        Ok(resp)
    }

    pub(super) async fn create_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let i = &req.input;
        let path = format!("{}/uploads", block_path(&i.bucket, &i.key)?);
        let resp = self.upload_call(&req, Method::POST, path, None).await?;
        let e: UploadEntry = json_of(resp).await?;
        Ok(S3Response::new(CreateMultipartUploadOutput {
            bucket: Some(i.bucket.clone()),
            key: Some(i.key.clone()),
            upload_id: Some(e.upload_id),
            ..Default::default()
        }))
    }

    pub(super) async fn complete_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let i = &req.input;
        let path = format!(
            "{}/uploads/{}",
            block_path(&i.bucket, &i.key)?,
            upload_id(&i.upload_id)?
        );
        let listed = i
            .multipart_upload
            .as_ref()
            .and_then(|m| m.parts.as_ref())
            .filter(|p| !p.is_empty())
            .ok_or_else(|| s3_error!(MalformedXML, "no parts to complete the upload with"))?;
        let mut parts = Vec::with_capacity(listed.len());
        for p in listed {
            let n = p
                .part_number
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| s3_error!(InvalidPart, "a part without a number"))?;
            parts.push(n);
        }
        // Each part's ETag, when the client names it, must be the part's as written (S3's
        // rule: a part written again since has another).
        if listed.iter().any(|p| p.e_tag.is_some()) {
            let resp = self
                .upload_call(&req, Method::GET, path.clone(), None)
                .await?;
            let written: PartList = json_of(resp).await?;
            for p in listed {
                let (Some(n), Some(tag)) = (p.part_number, &p.e_tag) else {
                    continue;
                };
                let ours = written.parts.iter().find(|w| w.part as i32 == n);
                let same = ours.is_some_and(|w| tag.value() == ctxpod_wire::crc32c_hex(w.crc32c));
                if !same {
                    return Err(s3_error!(
                        InvalidPart,
                        "part {n}: not written, or its ETag is not the one given"
                    ));
                }
            }
        }
        let json = serde_json::to_vec(&serde_json::json!({ "parts": parts }))
            .map_err(|e| s3_error!(InternalError, "{e}"))?;
        let resp = self
            .upload_call(&req, Method::POST, path, Some(json))
            .await?;
        let crc = header_str(resp.headers(), ctxpod_wire::HEADER_CRC32C)
            .and_then(ctxpod_wire::parse_crc32c_hex)
            .unwrap_or_default()
            .to_be_bytes();
        Ok(S3Response::new(CompleteMultipartUploadOutput {
            bucket: Some(i.bucket.clone()),
            key: Some(i.key.clone()),
            e_tag: Some(ETag::Strong(hex::encode(crc))),
            checksum_crc32c: Some(b64(&crc)),
            ..Default::default()
        }))
    }

    pub(super) async fn abort_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let i = &req.input;
        let path = format!(
            "{}/uploads/{}",
            block_path(&i.bucket, &i.key)?,
            upload_id(&i.upload_id)?
        );
        self.upload_call(&req, Method::DELETE, path, None).await?;
        Ok(S3Response::new(AbortMultipartUploadOutput::default()))
    }

    pub(super) async fn list_upload_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        let i = &req.input;
        let path = format!(
            "{}/uploads/{}",
            block_path(&i.bucket, &i.key)?,
            upload_id(&i.upload_id)?
        );
        let resp = self.upload_call(&req, Method::GET, path, None).await?;
        let list: PartList = json_of(resp).await?;
        let after = i.part_number_marker.unwrap_or(0);
        let max = i.max_parts.unwrap_or(1000).clamp(1, 1000) as usize;
        let left: Vec<_> = list
            .parts
            .into_iter()
            .filter(|p| p.part as i64 > after as i64)
            .collect();
        let truncated = left.len() > max;
        let page: Vec<Part> = left
            .into_iter()
            .take(max)
            .map(|p| Part {
                part_number: Some(p.part as i32),
                size: Some(p.len as i64),
                e_tag: Some(ETag::Strong(ctxpod_wire::crc32c_hex(p.crc32c))),
                checksum_crc32c: Some(b64(&p.crc32c.to_be_bytes())),
                ..Default::default()
            })
            .collect();
        Ok(S3Response::new(ListPartsOutput {
            bucket: Some(i.bucket.clone()),
            key: Some(i.key.clone()),
            upload_id: Some(i.upload_id.clone()),
            is_truncated: Some(truncated),
            next_part_number_marker: page.last().and_then(|p| p.part_number),
            max_parts: Some(max as i32),
            parts: Some(page),
            ..Default::default()
        }))
    }

    pub(super) async fn list_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        let i = &req.input;
        let prefix = i.prefix.clone().unwrap_or_default();
        let path = format!(
            "/v1/namespaces/{}/uploads?prefix={}",
            namespace(&i.bucket)?,
            hex::encode(prefix.as_bytes())
        );
        let list: UploadList = self.get_json(&req, path, 4 << 20).await?;
        let uploads: Vec<MultipartUpload> = list
            .uploads
            .into_iter()
            .filter_map(|u| {
                let key = String::from_utf8(hex::decode(&u.key).ok()?).ok()?;
                Some(MultipartUpload {
                    key: Some(key),
                    upload_id: Some(u.upload_id),
                    initiated: Some(Timestamp::from(
                        std::time::UNIX_EPOCH + std::time::Duration::from_millis(u.started_ms),
                    )),
                    ..Default::default()
                })
            })
            .collect();
        Ok(S3Response::new(ListMultipartUploadsOutput {
            bucket: Some(i.bucket.clone()),
            prefix: i.prefix.clone(),
            is_truncated: Some(false),
            uploads: Some(uploads),
            ..Default::default()
        }))
    }
}

/// The JSON body of a successful answer.
async fn json_of<D: serde::de::DeserializeOwned>(resp: http::Response<Body>) -> S3Result<D> {
    let body = axum::body::to_bytes(resp.into_body(), 4 << 20)
        .await
        .map_err(|e| s3_error!(InternalError, "{e}"))?;
    serde_json::from_slice(&body).map_err(|e| s3_error!(InternalError, "{e}"))
}
