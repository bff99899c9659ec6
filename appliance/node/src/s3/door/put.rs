//! PutObject: its input checked, its body streamed to the node through `Checked`, which
//! checks every checksum the client announced (headers or trailers) before the block commits.

use super::*;
use crate::s3::checksum::Digests;

/// The checksums a PUT's body must match ([`Digests`]), computed as it streams through to
/// the node; the trailer's are read when the body ends. A mismatch (or a body of the wrong
/// length) ends the stream with an error, so the node stores nothing, and leaves the S3
/// error for the door to answer.
struct Checked {
    inner: Option<StreamingBlob>,
    /// Where the body goes if it is dropped before its end (the node refused it early), to
    /// be drained.
    unread: Option<tokio::sync::oneshot::Sender<StreamingBlob>>,
    len: u64,
    seen: u64,
    digests: Option<Digests>,
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

    /// At the end of the body: its length, then every declared checksum (the trailer's
    /// among them) compared.
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
        let digests = self.digests.take()?;
        match digests.finish(trailer.as_ref()) {
            Ok(v) => {
                self.verdict.lock().crc32c = Some(v.crc32c);
                None
            }
            Err(e) => Some(e),
        }
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
                if let Some(d) = &mut self.digests {
                    d.update(&b);
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

impl Door {
    pub(super) async fn put(
        &self,
        mut req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let inner = req.input.body.take().unwrap_or_else(|| {
            StreamingBlob::wrap(futures::stream::empty::<Result<Bytes, std::io::Error>>())
        });
        let (path, len, h, digests) = match plan_put(&req, !self.auth.enabled()) {
            Ok(p) => p,
            Err(e) => {
                // Read what the client sends before answering, so that it reads the answer
                // instead of a reset connection (bounded by the listener's body cap).
                drain(inner).await;
                return Err(e);
            }
        };
        let (resp, v) = self
            .stream_to(
                &req,
                inner,
                (path, len, h, digests),
                req.trailing_headers.clone(),
            )
            .await?;
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
}

impl Door {
    /// Sends a body (`inner`, `len` bytes announced) to the node's `path` with headers `h`,
    /// through [`Checked`], which checks `digests` (and the trailer's) as it streams; the
    /// node's answer and the verdict on the body. An error when the body failed its checks.
    async fn stream_to<T>(
        &self,
        req: &S3Request<T>,
        inner: StreamingBlob,
        (path, len, h, digests): (String, u64, HeaderMap, Digests),
        trailers: Option<s3s::TrailingHeaders>,
    ) -> S3Result<(http::Response<Body>, Verdict)> {
        let verdict = Arc::new(parking_lot::Mutex::new(Verdict::default()));
        let (unread_tx, mut unread) = tokio::sync::oneshot::channel();
        let body = Checked {
            inner: Some(inner),
            unread: Some(unread_tx),
            len,
            seen: 0,
            digests: Some(digests),
            trailers,
            verdict: verdict.clone(),
            ended: false,
        };
        let resp = self
            .send(req, Method::PUT, path, h, Body::from_stream(body))
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
        Ok((resp, Verdict { error: None, ..v }))
    }

    /// UploadPart: the part's body streamed to the node's upload, its checksums checked as
    /// for PutObject; its ETag is its CRC32C.
    pub(super) async fn upload_part(
        &self,
        mut req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        let inner = req.input.body.take().unwrap_or_else(|| {
            StreamingBlob::wrap(futures::stream::empty::<Result<Bytes, std::io::Error>>())
        });
        let plan = match plan_part(&req, !self.auth.enabled()) {
            Ok(p) => p,
            Err(e) => {
                drain(inner).await;
                return Err(e);
            }
        };
        let (resp, v) = self
            .stream_to(&req, inner, plan, req.trailing_headers.clone())
            .await?;
        if !resp.status().is_success() {
            return Err(super::multipart::upload_refusal(resp).await);
        }
        let crc = v.crc32c.unwrap_or_default();
        Ok(S3Response::new(UploadPartOutput {
            e_tag: Some(ETag::Strong(hex::encode(crc))),
            checksum_crc32c: Some(b64(&crc)),
            ..Default::default()
        }))
    }
}

/// What an UploadPart sends to the node: as [`plan_put`], to the part's path.
fn plan_part(
    req: &S3Request<UploadPartInput>,
    content_sha256: bool,
) -> S3Result<(String, u64, HeaderMap, Digests)> {
    let i = &req.input;
    let digests = Digests::from_headers(&req.headers, content_sha256)?;
    let path = format!(
        "{}/uploads/{}/parts/{}",
        block_path(&i.bucket, &i.key)?,
        super::multipart::upload_id(&i.upload_id)?,
        i.part_number
    );
    let (len, h) = node_headers(&req.headers, i.content_length, i.checksum_crc32c.as_deref())?;
    Ok((path, len, h, digests))
}

/// The body's length and the headers a body goes to the node with: its length, and a
/// CRC32C announced up front (checked by the node itself, end to end).
fn node_headers(
    headers: &HeaderMap,
    content_length: Option<i64>,
    crc32c: Option<&str>,
) -> S3Result<(u64, HeaderMap)> {
    let len = body_length(headers, content_length)?;
    let mut h = HeaderMap::new();
    h.insert(http::header::CONTENT_LENGTH, len.into());
    if let Some(c) = crc32c {
        let crc = base64_u32(c).ok_or_else(|| s3_error!(InvalidDigest, "x-amz-checksum-crc32c"))?;
        h.insert(
            ctxpod_wire::HEADER_CRC32C,
            ctxpod_wire::crc32c_hex(crc)
                .parse()
                .expect("hex is a header value"),
        );
    }
    Ok((len, h))
}

/// A body's length: its Content-Length, or for an aws-chunked body sent with HTTP chunking
/// (boto3 over https; no Content-Length for s3s to rewrite) its decoded length header.
fn body_length(h: &HeaderMap, content_length: Option<i64>) -> S3Result<u64> {
    let decoded = header_str(h, "x-amz-decoded-content-length").and_then(|v| v.parse::<i64>().ok());
    let len = content_length
        .or(decoded)
        .ok_or_else(|| s3_error!(MissingContentLength))?;
    u64::try_from(len).map_err(|_| s3_error!(InvalidArgument, "a negative length"))
}

/// What a PutObject sends to the node, once its input is checked: the block's path, its
/// length, the request's headers and the checksums to check (a hex `x-amz-content-sha256`
/// too, with `content_sha256`: no signature check does it).
fn plan_put(
    req: &S3Request<PutObjectInput>,
    content_sha256: bool,
) -> S3Result<(String, u64, HeaderMap, Digests)> {
    let i = &req.input;
    let digests = Digests::from_headers(&req.headers, content_sha256)?;
    let path = block_path(&i.bucket, &i.key)?;
    // Over the node's value_bytes_max the node answers 413 (EntityTooLarge) from the head.
    let (len, mut h) = node_headers(&req.headers, i.content_length, i.checksum_crc32c.as_deref())?;
    // KV extra: `x-ctxpod-durability: fast` acknowledges before the flush.
    if let Some(d) = req.headers.get(ctxpod_wire::HEADER_DURABILITY) {
        h.insert(ctxpod_wire::HEADER_DURABILITY, d.clone());
    }
    Ok((path, len, h, digests))
}

/// Reads and drops the rest of a request body (the listener caps it at
/// [`crate::s3::body_bytes_max`]).
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
