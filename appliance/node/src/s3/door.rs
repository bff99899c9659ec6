//! What each S3 operation does: the equivalent request of HTTP API v1, sent through the
//! node's router in process for the caller S3 authenticated (see the module above), and
//! its answer in S3's terms.
//!
//! | S3 | HTTP API v1 |
//! |---|---|
//! | PutObject | `PUT /v1/namespaces/{bucket}/blocks/{key}`; Content-MD5 and every `x-amz-checksum-*` (header or trailer) checked as the body streams in, before the block commits; a CRC32C header goes to the node as `x-ctxpod-crc32c` |
//! | GetObject (whole, `Range`) | `GET …/blocks/{key}` with the `Range` (the node reads only the 64 KiB segments that hold it) |
//! | HeadObject | `HEAD …/blocks/{key}` (length, CRC32C, time stored) |
//! | DeleteObject(s) | `DELETE …/blocks/{key}` (absent keys are deleted, as in S3) |
//! | ListObjectsV2 | `GET …/blocks?prefix&after&limit&meta=true`; `Delimiter` folds keys into common prefixes |
//! | CreateBucket, HeadBucket, DeleteBucket, ListBuckets | `PUT`, `GET`, `DELETE /v1/namespaces/{bucket}`, `GET /v1/namespaces` |
//! | CreateMultipartUpload, UploadPart, CompleteMultipartUpload, AbortMultipartUpload, ListParts | `POST …/blocks/{key}/uploads`, `PUT …/uploads/{id}/parts/{n}` (checked as PutObject's body), `POST`, `DELETE`, `GET …/uploads/{id}` |
//! | ListMultipartUploads | `GET /v1/namespaces/{bucket}/uploads?prefix` |
//!
//! An object's ETag is its CRC32C (8 hex digits; not an MD5, so clients do not compare it
//! with one); `x-amz-checksum-crc32c` is answered with every whole object.

use super::Vouched;
use crate::auth::{Authenticator, Principal};
use axum::body::Body;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use http::{HeaderMap, Method, StatusCode};
use s3s::dto::*;
use s3s::{s3_error, S3Error, S3ErrorCode, S3Request, S3Response, S3Result, S3};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::ServiceExt;

mod list;
mod multipart;
mod put;
mod read;

/// The S3 operations over the node's HTTP router.
#[derive(Clone)]
pub struct Door {
    api: axum::Router,
    auth: Arc<Authenticator>,
    metrics: Arc<crate::metrics::NodeMetrics>,
}

impl Door {
    pub fn new(
        api: axum::Router,
        auth: Arc<Authenticator>,
        metrics: Arc<crate::metrics::NodeMetrics>,
    ) -> Door {
        Door { api, auth, metrics }
    }

    /// The caller of an S3 request: the token its access key names (authentication on), or
    /// the admin (off).
    fn caller<T>(&self, req: &S3Request<T>) -> S3Result<Principal> {
        if !self.auth.enabled() {
            return Ok(Principal::anonymous_admin());
        }
        let ak = req
            .credentials
            .as_ref()
            .ok_or_else(|| s3_error!(AccessDenied, "a signature is required"))?;
        self.auth
            .s3_principal(&ak.access_key)
            .ok_or_else(|| s3_error!(InvalidAccessKeyId))
    }

    /// Sends `method path` with `headers` and `body` through the HTTP router as `req`'s
    /// caller, from `req`'s connection.
    pub(crate) async fn send<T>(
        &self,
        req: &S3Request<T>,
        method: Method,
        path: String,
        headers: HeaderMap,
        body: Body,
    ) -> S3Result<http::Response<Body>> {
        let caller = self.caller(req)?;
        let mut r = http::Request::builder()
            .method(method)
            .uri(path)
            .body(body)
            .map_err(|e| s3_error!(InvalidRequest, "{e}"))?;
        *r.headers_mut() = headers;
        r.extensions_mut().insert(Vouched(caller));
        if let Some(c) = req
            .extensions
            .get::<axum::extract::ConnectInfo<crate::conn::PeerInfo>>()
        {
            r.extensions_mut().insert(c.clone());
        }
        match self.api.clone().oneshot(r).await {
            Ok(resp) => Ok(resp),
            Err(never) => match never {},
        }
    }

    /// Runs an S3 operation and counts its outcome under `op` ([`Door::count`]).
    async fn counted<R>(
        &self,
        op: &'static str,
        run: impl std::future::Future<Output = S3Result<R>>,
    ) -> S3Result<R> {
        let r = run.await;
        self.count(op, &r);
        r
    }

    pub(crate) fn count(&self, op: &'static str, r: &S3Result<impl Sized>) {
        let code = match r {
            Ok(_) => "OK",
            Err(e) => code_name(e.code()),
        };
        self.metrics
            .s3_requests
            .with_label_values(&[op, code])
            .inc();
    }
}

/// A bounded name for an error code (the metric's label).
fn code_name(c: &S3ErrorCode) -> &'static str {
    use S3ErrorCode as C;
    match c {
        C::NoSuchKey => "NoSuchKey",
        C::NoSuchBucket => "NoSuchBucket",
        C::AccessDenied => "AccessDenied",
        C::InvalidAccessKeyId => "InvalidAccessKeyId",
        C::SignatureDoesNotMatch => "SignatureDoesNotMatch",
        C::BadDigest => "BadDigest",
        C::EntityTooLarge => "EntityTooLarge",
        C::IncompleteBody => "IncompleteBody",
        C::InvalidArgument => "InvalidArgument",
        C::InvalidRange => "InvalidRange",
        C::KeyTooLongError => "KeyTooLongError",
        C::SlowDown => "SlowDown",
        C::BucketNotEmpty => "BucketNotEmpty",
        C::InternalError => "InternalError",
        C::NoSuchUpload => "NoSuchUpload",
        C::InvalidPart => "InvalidPart",
        C::MalformedXML => "MalformedXML",
        C::NotImplemented => "NotImplemented",
        _ => "other",
    }
}

/// An S3 error as the listener answers it outside `s3s` (the body-size check).
pub(crate) fn error_response(e: S3Error) -> http::Response<Body> {
    match e.to_http_response() {
        Ok(r) => r.map(Body::new),
        Err(_) => http::Response::builder()
            .status(StatusCode::BAD_REQUEST)
            .body(Body::empty())
            .expect("a plain response"),
    }
}

/// A bucket's namespace name, checked as the HTTP API checks it.
pub(crate) fn namespace(bucket: &str) -> S3Result<&str> {
    ctxpod_wire::namespace::check_namespace_name(bucket)
        .map_err(|e| s3_error!(InvalidBucketName, "{e}"))?;
    Ok(bucket)
}

/// An object key's block key: its UTF-8 bytes, 1..=128 of them.
pub(crate) fn block_key(key: &str) -> S3Result<String> {
    match key.len() {
        0 => Err(s3_error!(InvalidArgument, "an empty key")),
        n if n > ctxpod_wire::KEY_BYTES_MAX => Err(s3_error!(
            KeyTooLongError,
            "a key is at most {} bytes here (a block key), not {n}",
            ctxpod_wire::KEY_BYTES_MAX
        )),
        _ => Ok(hex::encode(key.as_bytes())),
    }
}

fn block_path(bucket: &str, key: &str) -> S3Result<String> {
    Ok(format!(
        "/v1/namespaces/{}/blocks/{}",
        namespace(bucket)?,
        block_key(key)?
    ))
}

fn b64(b: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(b)
}

fn header_str<'h>(h: &'h HeaderMap, name: &str) -> Option<&'h str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// The message of a refusal of the HTTP API.
async fn refusal_message(resp: http::Response<Body>) -> String {
    let body = axum::body::to_bytes(resp.into_body(), 64 << 10)
        .await
        .unwrap_or_default();
    serde_json::from_slice::<ctxpod_wire::types::ErrorBody>(&body)
        .map(|e| e.message)
        .unwrap_or_default()
}

/// The S3 error for a refusal of the HTTP API: by its status and its error kind.
pub(crate) async fn refusal(resp: http::Response<Body>, on_key: bool) -> S3Error {
    let status = resp.status();
    let retry = resp.headers().get(http::header::RETRY_AFTER).cloned();
    let body = axum::body::to_bytes(resp.into_body(), 64 << 10)
        .await
        .unwrap_or_default();
    let e: Option<ctxpod_wire::types::ErrorBody> = serde_json::from_slice(&body).ok();
    let kind = e.as_ref().map_or("", |e| e.error.as_str());
    let msg = e.as_ref().map_or_else(String::new, |e| e.message.clone());
    let mut err = match (status.as_u16(), kind) {
        (404, "no_such_namespace") => s3_error!(NoSuchBucket, "{msg}"),
        (404, _) if on_key => s3_error!(NoSuchKey),
        (404, _) => s3_error!(NoSuchBucket, "{msg}"),
        (400, _) => s3_error!(InvalidArgument, "{msg}"),
        (401, _) | (403, _) => s3_error!(AccessDenied, "{msg}"),
        (409, _) => {
            let mut e = S3Error::with_message(
                S3ErrorCode::Custom("ObjectImmutable".into()),
                "the key holds other bytes: a block never changes under its key (delete it first)",
            );
            e.set_status_code(StatusCode::CONFLICT);
            e
        }
        (412, "namespace_exists") => s3_error!(BucketAlreadyOwnedByYou, "{msg}"),
        (413, _) => s3_error!(EntityTooLarge, "{msg}"),
        (422, _) => s3_error!(BadDigest, "{msg}"),
        (429, _) | (503, _) => s3_error!(SlowDown, "{msg}"),
        (507, _) => {
            let mut e =
                S3Error::with_message(S3ErrorCode::Custom("InsufficientStorage".into()), msg);
            e.set_status_code(StatusCode::INSUFFICIENT_STORAGE);
            e
        }
        _ => s3_error!(InternalError, "HTTP {status}: {msg}"),
    };
    if let Some(r) = retry {
        let mut h = HeaderMap::new();
        h.insert(http::header::RETRY_AFTER, r);
        err.set_headers(h);
    }
    err
}

#[async_trait::async_trait]
impl S3 for Door {
    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        self.counted("PutObject", self.put(req)).await
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        self.counted("CreateMultipartUpload", self.create_upload(req))
            .await
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        self.counted("UploadPart", Door::upload_part(self, req))
            .await
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        self.counted("CompleteMultipartUpload", self.complete_upload(req))
            .await
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        self.counted("AbortMultipartUpload", self.abort_upload(req))
            .await
    }

    async fn list_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        self.counted("ListParts", self.list_upload_parts(req)).await
    }

    async fn list_multipart_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        self.counted("ListMultipartUploads", self.list_uploads(req))
            .await
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        self.counted("GetObject", self.get(req)).await
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        self.counted("HeadObject", self.head(req)).await
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        let deleted = async {
            let path = block_path(&req.input.bucket, &req.input.key);
            match path {
                Ok(path) => self.delete_block(&req, path).await,
                Err(e) => Err(e),
            }
            .map(|()| S3Response::new(DeleteObjectOutput::default()))
        };
        self.counted("DeleteObject", deleted).await
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        self.counted("DeleteObjects", self.delete_many(req)).await
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        self.counted("ListObjectsV2", self.list(req)).await
    }

    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        let created = async {
            // An existing bucket keeps its settings (quota, replication, class): the node
            // creates only (`If-None-Match: *`), and S3 answers BucketAlreadyOwnedByYou.
            let path = format!("/v1/namespaces/{}", namespace(&req.input.bucket)?);
            // The namespace's class and compression, from `x-ctxpod-namespace-class` and
            // `x-ctxpod-compression` (S3 has no field for them).
            let setting = |name: &str| -> S3Result<Option<String>> {
                req.headers
                    .get(name)
                    .map(|v| {
                        v.to_str()
                            .map(str::to_string)
                            .map_err(|e| s3_error!(InvalidArgument, "{name}: {e}"))
                    })
                    .transpose()
            };
            let class = setting(ctxpod_wire::HEADER_NAMESPACE_CLASS)?
                .map(|v| v.parse::<ctxpod_wire::types::NamespaceClass>())
                .transpose()
                .map_err(|e| s3_error!(InvalidArgument, "{e}"))?;
            let compression = setting(ctxpod_wire::HEADER_NAMESPACE_COMPRESSION)?
                .map(|v| v.parse::<ctxpod_wire::types::Compression>())
                .transpose()
                .map_err(|e| s3_error!(InvalidArgument, "{e}"))?;
            let body = serde_json::to_string(&ctxpod_wire::types::CreateNamespace {
                class,
                compression,
                ..Default::default()
            })
            .map_err(|e| s3_error!(InternalError, "{e}"))?;
            let mut h = HeaderMap::new();
            h.insert(
                http::header::IF_NONE_MATCH,
                http::HeaderValue::from_static("*"),
            );
            h.insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            let resp = self
                .send(&req, Method::PUT, path, h, Body::from(body))
                .await?;
            if !resp.status().is_success() {
                return Err(refusal(resp, false).await);
            }
            Ok(S3Response::new(CreateBucketOutput {
                location: Some(format!("/{}", req.input.bucket)),
            }))
        };
        self.counted("CreateBucket", created).await
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        let info = async {
            self.namespace_info(&req, &req.input.bucket)
                .await
                .map(|_| S3Response::new(HeadBucketOutput::default()))
        };
        self.counted("HeadBucket", info).await
    }

    async fn delete_bucket(
        &self,
        req: S3Request<DeleteBucketInput>,
    ) -> S3Result<S3Response<DeleteBucketOutput>> {
        let deleted = async {
            // S3 deletes only an empty bucket; a namespace's delete takes its blocks too.
            // Empty means empty in the whole pod: the node asks every member (the key
            // listing), and refuses while one cannot answer.
            let path = format!(
                "/v1/namespaces/{}?if_empty=true",
                namespace(&req.input.bucket)?
            );
            let resp = self
                .send(&req, Method::DELETE, path, HeaderMap::new(), Body::empty())
                .await?;
            if resp.status() == StatusCode::CONFLICT {
                let e = refusal_message(resp).await;
                return Err(s3_error!(BucketNotEmpty, "{e}"));
            }
            if !resp.status().is_success() {
                return Err(refusal(resp, false).await);
            }
            Ok(S3Response::new(DeleteBucketOutput::default()))
        };
        self.counted("DeleteBucket", deleted).await
    }

    async fn list_buckets(
        &self,
        req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        let listed = async {
            let list: ctxpod_wire::types::NamespaceList = self
                .get_json(&req, "/v1/namespaces".into(), 16 << 20)
                .await?;
            let buckets = list
                .namespaces
                .into_iter()
                .map(|n| Bucket {
                    name: Some(n.name),
                    ..Default::default()
                })
                .collect();
            Ok(S3Response::new(ListBucketsOutput {
                buckets: Some(buckets),
                ..Default::default()
            }))
        };
        self.counted("ListBuckets", listed).await
    }
}

impl Door {
    /// Deletes a block; an absent one is deleted already (S3 answers 204 either way).
    async fn delete_block<T>(&self, req: &S3Request<T>, path: String) -> S3Result<()> {
        let resp = self
            .send(req, Method::DELETE, path, HeaderMap::new(), Body::empty())
            .await?;
        if resp.status().is_success() {
            return Ok(());
        }
        match refusal(resp, true).await {
            e if *e.code() == S3ErrorCode::NoSuchKey => Ok(()),
            e => Err(e),
        }
    }

    async fn delete_many(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        namespace(&req.input.bucket)?;
        let objects = &req.input.delete.objects;
        if objects.len() > 1000 {
            return Err(s3_error!(
                MalformedXML,
                "at most 1000 keys in one DeleteObjects"
            ));
        }
        let quiet = req.input.delete.quiet.unwrap_or(false);
        let (mut deleted, mut errors) = (Vec::new(), Vec::new());
        for o in objects {
            let r = match block_path(&req.input.bucket, &o.key) {
                Ok(path) => self.delete_block(&req, path).await,
                Err(e) => Err(e),
            };
            match r {
                Ok(()) if !quiet => deleted.push(DeletedObject {
                    key: Some(o.key.clone()),
                    ..Default::default()
                }),
                Ok(()) => {}
                // The bucket itself is the answer to the whole request.
                Err(e) if *e.code() == S3ErrorCode::NoSuchBucket => return Err(e),
                Err(e) => errors.push(Error {
                    code: Some(e.code().as_str().to_string()),
                    key: Some(o.key.clone()),
                    message: e.message().map(str::to_string),
                    ..Default::default()
                }),
            }
        }
        Ok(S3Response::new(DeleteObjectsOutput {
            deleted: Some(deleted),
            errors: (!errors.is_empty()).then_some(errors),
            ..Default::default()
        }))
    }

    async fn namespace_info<T>(
        &self,
        req: &S3Request<T>,
        bucket: &str,
    ) -> S3Result<ctxpod_wire::types::NamespaceInfo> {
        let path = format!("/v1/namespaces/{}", namespace(bucket)?);
        self.get_json(req, path, 64 << 10).await
    }

    /// GETs `path` as `req`'s caller and reads its JSON answer (at most `limit` bytes), or
    /// the S3 error for its refusal.
    async fn get_json<T, D: serde::de::DeserializeOwned>(
        &self,
        req: &S3Request<T>,
        path: String,
        limit: usize,
    ) -> S3Result<D> {
        let resp = self
            .send(req, Method::GET, path, HeaderMap::new(), Body::empty())
            .await?;
        if !resp.status().is_success() {
            return Err(refusal(resp, false).await);
        }
        let body = axum::body::to_bytes(resp.into_body(), limit)
            .await
            .map_err(|e| s3_error!(InternalError, "{e}"))?;
        serde_json::from_slice(&body).map_err(|e| s3_error!(InternalError, "{e}"))
    }
}
