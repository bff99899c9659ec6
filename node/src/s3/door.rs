//! What each S3 operation does: the equivalent request of HTTP API v1, sent through the
//! node's router in process for the caller S3 authenticated (see the module above), and
//! its answer in S3's terms.
//!
//! | S3 | HTTP API v1 |
//! |---|---|
//! | PutObject | `PUT /v1/namespaces/{bucket}/blocks/{key}`; Content-MD5 and every `x-amz-checksum-*` (header or trailer) checked as the body streams in, before the block commits; a CRC32C header goes to the node as `x-ctxpod-crc32c` |
//! | GetObject (whole, `Range`) | `GET …/blocks/{key}`, the range cut from the block's stream |
//! | HeadObject | `HEAD …/blocks/{key}` (length, CRC32C, time stored) |
//! | DeleteObject(s) | `DELETE …/blocks/{key}` (absent keys are deleted, as in S3) |
//! | ListObjectsV2 | `GET …/blocks?prefix&after&limit&meta=true`; `Delimiter` folds keys into common prefixes |
//! | CreateBucket, HeadBucket, DeleteBucket, ListBuckets | `PUT`, `GET`, `DELETE /v1/namespaces/{bucket}`, `GET /v1/namespaces` |
//!
//! An object's ETag is its CRC32C (8 hex digits; not an MD5, so clients do not compare it
//! with one); `x-amz-checksum-crc32c` is answered with every whole object.

use super::Vouched;
use crate::auth::{Authenticator, Principal};
use axum::body::Body;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use http::{HeaderMap, Method, StatusCode};
use s3s::crypto::Checksum as _;
use s3s::dto::*;
use s3s::{s3_error, S3Error, S3ErrorCode, S3Request, S3Response, S3Result, S3};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::ServiceExt;

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

/// The checksums a PUT's body must match, computed as it streams through to the node;
/// the trailer's are read when the body ends. A mismatch (or a body of the wrong length)
/// ends the stream with an error, so the node stores nothing, and leaves the S3 error for
/// the door to answer.
struct Checked {
    inner: Option<StreamingBlob>,
    /// Where the body goes if it is dropped before its end (the node refused it early), to
    /// be drained.
    unread: Option<tokio::sync::oneshot::Sender<StreamingBlob>>,
    len: u64,
    seen: u64,
    md5: Option<(s3s::crypto::Md5, String)>,
    crc32: Option<(s3s::crypto::Crc32, Option<String>)>,
    crc32c: s3s::crypto::Crc32c,
    want_crc32c: Option<String>,
    trailers: Option<s3s::TrailingHeaders>,
    verdict: Arc<parking_lot::Mutex<Verdict>>,
    ended: bool,
}

#[derive(Default)]
struct Verdict {
    error: Option<S3Error>,
    crc32c: Option<[u8; 4]>,
}

impl Checked {
    fn fail(&mut self, e: S3Error) -> Poll<Option<Result<Bytes, std::io::Error>>> {
        let msg = e.message().unwrap_or_default().to_string();
        self.verdict.lock().error = Some(e);
        self.ended = true;
        Poll::Ready(Some(Err(std::io::Error::other(msg))))
    }

    /// At the end of the body: the trailer's checksums join the header's, and all are
    /// compared.
    fn finish(&mut self) -> Option<S3Error> {
        if self.seen != self.len {
            return Some(s3_error!(
                IncompleteBody,
                "{} bytes of a body announced as {}",
                self.seen,
                self.len
            ));
        }
        let trailer = self.trailers.as_ref().and_then(|t| t.take());
        let from_trailer = |name: &str| {
            trailer
                .as_ref()
                .and_then(|t| header_str(t, name))
                .map(str::to_string)
        };
        if let Some(v) = from_trailer("x-amz-checksum-crc32c") {
            self.want_crc32c = Some(v);
        }
        let crc32c = std::mem::take(&mut self.crc32c).finalize();
        self.verdict.lock().crc32c = Some(crc32c);
        if self
            .want_crc32c
            .as_ref()
            .is_some_and(|w| *w != b64(&crc32c))
        {
            return Some(s3_error!(
                BadDigest,
                "x-amz-checksum-crc32c does not match the body"
            ));
        }
        if let Some((h, want)) = self.crc32.take() {
            let want = from_trailer("x-amz-checksum-crc32").or(want);
            if want.is_some_and(|w| w != b64(&h.finalize())) {
                return Some(s3_error!(
                    BadDigest,
                    "x-amz-checksum-crc32 does not match the body"
                ));
            }
        }
        if let Some((h, want)) = self.md5.take() {
            if want != b64(&h.finalize()) {
                return Some(s3_error!(BadDigest, "Content-MD5 does not match the body"));
            }
        }
        None
    }
}

impl Drop for Checked {
    fn drop(&mut self) {
        if let (false, Some(inner), Some(tx)) = (self.ended, self.inner.take(), self.unread.take())
        {
            let _ = tx.send(inner);
        }
    }
}

impl Stream for Checked {
    type Item = Result<Bytes, std::io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.ended {
            return Poll::Ready(None);
        }
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(None);
        };
        match inner.poll_next_unpin(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Ok(b))) => {
                self.seen += b.len() as u64;
                if self.seen > self.len {
                    let e = s3_error!(IncompleteBody, "a body longer than announced");
                    return self.fail(e);
                }
                self.crc32c.update(&b);
                if let Some((h, _)) = &mut self.md5 {
                    h.update(&b);
                }
                if let Some((h, _)) = &mut self.crc32 {
                    h.update(&b);
                }
                Poll::Ready(Some(Ok(b)))
            }
            Poll::Ready(Some(Err(e))) => {
                let e = s3_error!(IncompleteBody, "reading the body: {e}");
                self.fail(e)
            }
            Poll::Ready(None) => match self.finish() {
                Some(e) => self.fail(e),
                None => {
                    self.ended = true;
                    Poll::Ready(None)
                }
            },
        }
    }
}

/// A response body as `s3s` takes one (`Sync`), from `start` for `len` bytes.
struct Slice {
    inner: std::sync::Mutex<axum::body::BodyDataStream>,
    skip: u64,
    left: u64,
}

impl Stream for Slice {
    type Item = Result<Bytes, axum::Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let inner = this.inner.get_mut().unwrap_or_else(|p| p.into_inner());
        loop {
            if this.left == 0 {
                return Poll::Ready(None);
            }
            match inner.poll_next_unpin(cx) {
                Poll::Ready(Some(Ok(mut b))) => {
                    if this.skip >= b.len() as u64 {
                        this.skip -= b.len() as u64;
                        continue;
                    }
                    let b2 = b.split_off(this.skip as usize);
                    this.skip = 0;
                    let take = (b2.len() as u64).min(this.left) as usize;
                    this.left -= take as u64;
                    return Poll::Ready(Some(Ok(b2.slice(..take))));
                }
                other => return other,
            }
        }
    }
}

#[async_trait::async_trait]
impl S3 for Door {
    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let r = self.put(req).await;
        self.count("PutObject", &r);
        r
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let r = self.get(req).await;
        self.count("GetObject", &r);
        r
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        let r = self.head(req).await;
        self.count("HeadObject", &r);
        r
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        let path = block_path(&req.input.bucket, &req.input.key);
        let r = match path {
            Ok(path) => self.delete_block(&req, path).await,
            Err(e) => Err(e),
        }
        .map(|()| S3Response::new(DeleteObjectOutput::default()));
        self.count("DeleteObject", &r);
        r
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let r = self.delete_many(req).await;
        self.count("DeleteObjects", &r);
        r
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        let r = self.list(req).await;
        self.count("ListObjectsV2", &r);
        r
    }

    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        let r = async {
            let path = format!("/v1/namespaces/{}", namespace(&req.input.bucket)?);
            let mut h = HeaderMap::new();
            h.insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            let resp = self
                .send(&req, Method::PUT, path, h, Body::from("{}"))
                .await?;
            if !resp.status().is_success() {
                return Err(refusal(resp, false).await);
            }
            Ok(S3Response::new(CreateBucketOutput {
                location: Some(format!("/{}", req.input.bucket)),
            }))
        }
        .await;
        self.count("CreateBucket", &r);
        r
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        let r = self
            .namespace_info(&req, &req.input.bucket)
            .await
            .map(|_| S3Response::new(HeadBucketOutput::default()));
        self.count("HeadBucket", &r);
        r
    }

    async fn delete_bucket(
        &self,
        req: S3Request<DeleteBucketInput>,
    ) -> S3Result<S3Response<DeleteBucketOutput>> {
        let r = async {
            // S3 deletes only an empty bucket; a namespace's delete takes its blocks too.
            let info = self.namespace_info(&req, &req.input.bucket).await?;
            if info.block_count > 0 {
                return Err(s3_error!(
                    BucketNotEmpty,
                    "{} objects in the bucket",
                    info.block_count
                ));
            }
            let path = format!("/v1/namespaces/{}", namespace(&req.input.bucket)?);
            let resp = self
                .send(&req, Method::DELETE, path, HeaderMap::new(), Body::empty())
                .await?;
            if !resp.status().is_success() {
                return Err(refusal(resp, false).await);
            }
            Ok(S3Response::new(DeleteBucketOutput::default()))
        }
        .await;
        self.count("DeleteBucket", &r);
        r
    }

    async fn list_buckets(
        &self,
        req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        let r = async {
            let resp = self
                .send(
                    &req,
                    Method::GET,
                    "/v1/namespaces".into(),
                    HeaderMap::new(),
                    Body::empty(),
                )
                .await?;
            if !resp.status().is_success() {
                return Err(refusal(resp, false).await);
            }
            let body = axum::body::to_bytes(resp.into_body(), 16 << 20)
                .await
                .map_err(|e| s3_error!(InternalError, "{e}"))?;
            let list: ctxpod_wire::types::NamespaceList =
                serde_json::from_slice(&body).map_err(|e| s3_error!(InternalError, "{e}"))?;
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
        }
        .await;
        self.count("ListBuckets", &r);
        r
    }
}

impl Door {
    async fn put(
        &self,
        mut req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let inner = req.input.body.take().unwrap_or_else(|| {
            StreamingBlob::wrap(futures::stream::empty::<Result<Bytes, std::io::Error>>())
        });
        let (path, len, h, md5) = match plan_put(&req) {
            Ok(p) => p,
            Err(e) => {
                // Read what the client sends before answering, so that it reads the answer
                // instead of a reset connection (bounded by the listener's body cap).
                drain(inner).await;
                return Err(e);
            }
        };
        let i = &req.input;
        let wants_crc32 = i.checksum_crc32.is_some()
            || matches!(&i.checksum_algorithm, Some(a) if a.as_str() == ChecksumAlgorithm::CRC32);
        let verdict = Arc::new(parking_lot::Mutex::new(Verdict::default()));
        let (unread_tx, mut unread) = tokio::sync::oneshot::channel();
        let body = Checked {
            inner: Some(inner),
            unread: Some(unread_tx),
            len,
            seen: 0,
            md5,
            crc32: wants_crc32.then(|| (s3s::crypto::Crc32::new(), i.checksum_crc32.clone())),
            crc32c: s3s::crypto::Crc32c::new(),
            want_crc32c: i.checksum_crc32c.clone(),
            trailers: req.trailing_headers.clone(),
            verdict: verdict.clone(),
            ended: false,
        };
        let resp = self
            .send(&req, Method::PUT, path, h, Body::from_stream(body))
            .await;
        // A body the node refused before reading it all comes back here to be drained.
        if let Ok(rest) = unread.try_recv() {
            drain(rest).await;
        }
        let resp = resp?;
        let v = std::mem::take(&mut *verdict.lock());
        if let Some(e) = v.error {
            return Err(e);
        }
        if !resp.status().is_success() {
            return Err(refusal(resp, true).await);
        }
        let crc = v.crc32c.unwrap_or_default();
        Ok(S3Response::new(PutObjectOutput {
            e_tag: Some(ETag::Strong(hex::encode(crc))),
            checksum_crc32c: Some(b64(&crc)),
            ..Default::default()
        }))
    }

    async fn get(&self, req: S3Request<GetObjectInput>) -> S3Result<S3Response<GetObjectOutput>> {
        let path = block_path(&req.input.bucket, &req.input.key)?;
        let resp = self
            .send(&req, Method::GET, path, HeaderMap::new(), Body::empty())
            .await?;
        if !resp.status().is_success() {
            return Err(refusal(resp, true).await);
        }
        let len: u64 = header_str(resp.headers(), "content-length")
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| s3_error!(InternalError, "no length"))?;
        let crc = header_str(resp.headers(), ctxpod_wire::HEADER_CRC32C)
            .and_then(ctxpod_wire::parse_crc32c_hex)
            .unwrap_or_default()
            .to_be_bytes();
        let (range, content_range) = match &req.input.range {
            None => (0..len, None),
            Some(r) => {
                let rr = r.check(len)?;
                let cr = format!("bytes {}-{}/{len}", rr.start, rr.end - 1);
                (rr, Some(cr))
            }
        };
        let n = range.end - range.start;
        let whole = n == len;
        let body = Slice {
            inner: std::sync::Mutex::new(resp.into_body().into_data_stream()),
            skip: range.start,
            left: n,
        };
        Ok(S3Response::new(GetObjectOutput {
            body: Some(StreamingBlob::wrap(body)),
            content_length: Some(n as i64),
            content_range,
            accept_ranges: Some("bytes".into()),
            e_tag: Some(ETag::Strong(hex::encode(crc))),
            checksum_crc32c: whole.then(|| b64(&crc)),
            content_type: Some("application/octet-stream".into()),
            ..Default::default()
        }))
    }

    async fn head(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        let path = block_path(&req.input.bucket, &req.input.key)?;
        let resp = self
            .send(&req, Method::HEAD, path, HeaderMap::new(), Body::empty())
            .await?;
        if resp.status() == StatusCode::NOT_FOUND {
            // A HEAD has no body to tell a missing bucket from a missing key: ask.
            self.namespace_info(&req, &req.input.bucket).await?;
            return Err(s3_error!(NoSuchKey));
        }
        if !resp.status().is_success() {
            return Err(refusal(resp, true).await);
        }
        let h = resp.headers();
        let len: i64 = header_str(h, "content-length")
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| s3_error!(InternalError, "no length"))?;
        let crc = header_str(h, ctxpod_wire::HEADER_CRC32C)
            .and_then(ctxpod_wire::parse_crc32c_hex)
            .unwrap_or_default()
            .to_be_bytes();
        let stored = header_str(h, ctxpod_wire::HEADER_STORED_MS)
            .and_then(|v| v.parse::<u64>().ok())
            .map(|ms| {
                Timestamp::from(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
            });
        Ok(S3Response::new(HeadObjectOutput {
            content_length: Some(len),
            e_tag: Some(ETag::Strong(hex::encode(crc))),
            checksum_crc32c: Some(b64(&crc)),
            last_modified: stored,
            accept_ranges: Some("bytes".into()),
            content_type: Some("application/octet-stream".into()),
            ..Default::default()
        }))
    }

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
        let resp = self
            .send(req, Method::GET, path, HeaderMap::new(), Body::empty())
            .await?;
        if !resp.status().is_success() {
            return Err(refusal(resp, false).await);
        }
        let body = axum::body::to_bytes(resp.into_body(), 64 << 10)
            .await
            .map_err(|e| s3_error!(InternalError, "{e}"))?;
        serde_json::from_slice(&body).map_err(|e| s3_error!(InternalError, "{e}"))
    }

    async fn list(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        let i = &req.input;
        let ns = namespace(&i.bucket)?;
        let max_keys = i.max_keys.unwrap_or(1000).clamp(0, 1000) as usize;
        let prefix = i.prefix.clone().unwrap_or_default();
        if prefix.len() > ctxpod_wire::KEY_BYTES_MAX {
            return Err(s3_error!(InvalidArgument, "a prefix longer than any key"));
        }
        let delimiter = i.delimiter.clone().filter(|d| !d.is_empty());
        // The cursor: the continuation token (hex of the last key or common prefix
        // answered), else StartAfter.
        let mut after: Option<Vec<u8>> = match (&i.continuation_token, &i.start_after) {
            (Some(t), _) => Some(
                hex::decode(t)
                    .map_err(|_| s3_error!(InvalidArgument, "a malformed continuation token"))?,
            ),
            (None, Some(s)) if !s.is_empty() => Some(s.as_bytes().to_vec()),
            _ => None,
        };
        let mut contents = Vec::new();
        let mut prefixes: Vec<String> = Vec::new();
        let mut last: Option<Vec<u8>> = None;
        // Whether the listing ran out of keys (else it stopped at max_keys).
        let mut done = false;
        'pages: while contents.len() + prefixes.len() < max_keys {
            if after
                .as_ref()
                .is_some_and(|a| a.len() > ctxpod_wire::KEY_BYTES_MAX)
            {
                // Past every key a cursor this long could precede.
                done = true;
                break;
            }
            let want = max_keys - contents.len() - prefixes.len();
            let page = self
                .list_page(&req, ns, prefix.as_bytes(), after.as_deref(), want)
                .await?;
            for (k, b) in page.keys.iter().zip(page.blocks.unwrap_or_default()) {
                last = Some(k.clone());
                // Keys that are not UTF-8 (stored through the other APIs) have no S3 name.
                let Ok(name) = std::str::from_utf8(k) else {
                    continue;
                };
                if let Some(d) = &delimiter {
                    if let Some(at) = name[prefix.len()..].find(d.as_str()) {
                        let cp = &name[..prefix.len() + at + d.len()];
                        prefixes.push(cp.to_string());
                        // Skip the rest of the common prefix: every key under it sorts
                        // before the prefix followed by 0xff bytes up to the longest key.
                        let mut skip = cp.as_bytes().to_vec();
                        skip.resize(ctxpod_wire::KEY_BYTES_MAX.max(skip.len()), 0xff);
                        last = Some(skip);
                        after = last.clone();
                        continue 'pages;
                    }
                }
                let crc = ctxpod_wire::parse_crc32c_hex(&b.crc32c).unwrap_or_default();
                contents.push(Object {
                    key: Some(name.to_string()),
                    size: Some(b.len as i64),
                    e_tag: Some(ETag::Strong(hex::encode(crc.to_be_bytes()))),
                    last_modified: Some(Timestamp::from(
                        std::time::UNIX_EPOCH + std::time::Duration::from_millis(b.stored_ms),
                    )),
                    ..Default::default()
                });
            }
            if page.next.is_none() {
                done = true;
                break;
            }
            after = last.clone();
        }
        let truncated = !done
            && max_keys > 0
            && match last.as_deref() {
                Some(l) if l.len() > ctxpod_wire::KEY_BYTES_MAX => false,
                l => !self
                    .list_page(&req, ns, prefix.as_bytes(), l, 1)
                    .await?
                    .keys
                    .is_empty(),
            };
        let next = if truncated {
            last.as_ref().map(hex::encode)
        } else {
            None
        };
        Ok(S3Response::new(ListObjectsV2Output {
            name: Some(i.bucket.clone()),
            prefix: i.prefix.clone(),
            delimiter: i.delimiter.clone(),
            max_keys: Some(max_keys as i32),
            key_count: Some((contents.len() + prefixes.len()) as i32),
            is_truncated: Some(truncated),
            continuation_token: i.continuation_token.clone(),
            next_continuation_token: next,
            start_after: i.start_after.clone(),
            contents: Some(contents),
            common_prefixes: (!prefixes.is_empty()).then(|| {
                prefixes
                    .into_iter()
                    .map(|p| CommonPrefix { prefix: Some(p) })
                    .collect()
            }),
            ..Default::default()
        }))
    }

    /// One page of the bucket's keys with their blocks' entries (the HTTP listing).
    async fn list_page<T>(
        &self,
        req: &S3Request<T>,
        ns: &str,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> S3Result<ctxpod_client::client::KeyPage> {
        let path = format!(
            "/v1/namespaces/{ns}/blocks?{}&meta=true",
            ctxpod_client::client::list_query(prefix, after, limit)
        );
        let resp = self
            .send(req, Method::GET, path, HeaderMap::new(), Body::empty())
            .await?;
        if !resp.status().is_success() {
            return Err(refusal(resp, false).await);
        }
        let body = axum::body::to_bytes(resp.into_body(), 4 << 20)
            .await
            .map_err(|e| s3_error!(InternalError, "{e}"))?;
        let page: ctxpod_wire::types::KeyList =
            serde_json::from_slice(&body).map_err(|e| s3_error!(InternalError, "{e}"))?;
        ctxpod_client::client::KeyPage::from_wire(page, limit)
            .map_err(|e| s3_error!(InternalError, "{e}"))
    }
}

/// What a PutObject sends to the node, once its input is checked: the block's path, its
/// length, the request's headers and the Content-MD5 to check.
#[allow(clippy::type_complexity)]
fn plan_put(
    req: &S3Request<PutObjectInput>,
) -> S3Result<(String, u64, HeaderMap, Option<(s3s::crypto::Md5, String)>)> {
    let i = &req.input;
    let path = block_path(&i.bucket, &i.key)?;
    // An aws-chunked body sent with HTTP chunking (boto3 over https) has no Content-Length
    // for s3s to rewrite: its decoded length is in its own header.
    let decoded = header_str(&req.headers, "x-amz-decoded-content-length")
        .and_then(|v| v.parse::<i64>().ok());
    let len = i
        .content_length
        .or(decoded)
        .ok_or_else(|| s3_error!(MissingContentLength))?;
    let len = u64::try_from(len).map_err(|_| s3_error!(InvalidArgument, "a negative length"))?;
    if len > ctxpod_wire::BLOCK_BYTES_MAX as u64 {
        return Err(s3_error!(
            EntityTooLarge,
            "an object is a block of at most {} bytes, not {len}",
            ctxpod_wire::BLOCK_BYTES_MAX
        ));
    }
    let mut h = HeaderMap::new();
    h.insert(http::header::CONTENT_LENGTH, len.into());
    // A CRC32C announced up front is checked by the node itself, end to end.
    if let Some(c) = &i.checksum_crc32c {
        let crc = base64_u32(c).ok_or_else(|| s3_error!(InvalidDigest, "x-amz-checksum-crc32c"))?;
        h.insert(
            ctxpod_wire::HEADER_CRC32C,
            ctxpod_wire::crc32c_hex(crc)
                .parse()
                .expect("hex is a header value"),
        );
    }
    // KV extra: `x-ctxpod-durability: fast` acknowledges before the flush.
    if let Some(d) = req.headers.get(ctxpod_wire::HEADER_DURABILITY) {
        h.insert(ctxpod_wire::HEADER_DURABILITY, d.clone());
    }
    let md5 = match &i.content_md5 {
        Some(m) if base64_decode(m).is_none_or(|b| b.len() != 16) => {
            return Err(s3_error!(
                InvalidDigest,
                "Content-MD5 is not 16 bytes in base64"
            ))
        }
        Some(m) => Some((s3s::crypto::Md5::new(), m.clone())),
        None => None,
    };
    Ok((path, len, h, md5))
}

/// Reads and drops the rest of a request body (the listener caps it at
/// [`super::S3_BODY_BYTES_MAX`]).
async fn drain(mut body: StreamingBlob) {
    while let Some(Ok(_)) = body.next().await {}
}

fn base64_decode(s: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(s).ok()
}

/// A big-endian u32 in base64 (how S3 spells a CRC32C).
fn base64_u32(s: &str) -> Option<u32> {
    let b = base64_decode(s)?;
    Some(u32::from_be_bytes(b.try_into().ok()?))
}
