//! GetObject (whole, or a range the node reads and sends alone) and HeadObject.

use super::*;

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

impl Door {
    pub(super) async fn get(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let i = &req.input;
        // A range goes to the node, which reads only the segments that hold it.
        let mut h = HeaderMap::new();
        if let Some(r) = &i.range {
            let spec = match r {
                Range::Int { first, last } => {
                    format!(
                        "bytes={first}-{}",
                        last.map(|l| l.to_string()).unwrap_or_default()
                    )
                }
                Range::Suffix { length } => format!("bytes=-{length}"),
            };
            h.insert(
                http::header::RANGE,
                spec.parse().expect("a range of digits is a header value"),
            );
        }
        let path = block_path(&i.bucket, &i.key)?;
        let resp = self.send(&req, Method::GET, path, h, Body::empty()).await?;
        if resp.status() == StatusCode::RANGE_NOT_SATISFIABLE {
            return Err(s3_error!(InvalidRange));
        }
        if !resp.status().is_success() {
            return Err(refusal(resp, true).await);
        }
        // The answer's length: the range's when the node answered 206.
        let (n, crc): (u64, _) = length_and_crc(resp.headers())?;
        let content_range = header_str(resp.headers(), "content-range").map(str::to_string);
        let len = match &content_range {
            None => n,
            Some(cr) => cr
                .rsplit_once('/')
                .and_then(|(_, total)| total.parse().ok())
                .ok_or_else(|| s3_error!(InternalError, "no total length in {cr}"))?,
        };
        let whole = n == len;
        let body = Slice {
            inner: std::sync::Mutex::new(resp.into_body().into_data_stream()),
            skip: 0,
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

    pub(super) async fn head(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        let i = &req.input;
        let resp = self
            .send_block(&req, Method::HEAD, &i.bucket, &i.key)
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
        let (len, crc): (i64, _) = length_and_crc(h)?;
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

    /// Sends `method` for the block of object `key` in `bucket` as `req`'s caller.
    async fn send_block<T>(
        &self,
        req: &S3Request<T>,
        method: Method,
        bucket: &str,
        key: &str,
    ) -> S3Result<http::Response<Body>> {
        let path = block_path(bucket, key)?;
        self.send(req, method, path, HeaderMap::new(), Body::empty())
            .await
    }
}

/// A block's length and CRC32C (big-endian bytes; zeros when absent), from the node's
/// answer's headers.
fn length_and_crc<N: std::str::FromStr>(h: &HeaderMap) -> S3Result<(N, [u8; 4])> {
    let len: N = header_str(h, "content-length")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| s3_error!(InternalError, "no length"))?;
    let crc = header_str(h, ctxpod_wire::HEADER_CRC32C)
        .and_then(ctxpod_wire::parse_crc32c_hex)
        .unwrap_or_default()
        .to_be_bytes();
    Ok((len, crc))
}
