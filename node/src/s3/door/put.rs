//! PutObject: its input checked, its body streamed to the node through `Checked`, which
//! checks every checksum the client announced (headers or trailers) before the block commits.

use super::*;

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

impl Door {
    pub(super) async fn put(
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
