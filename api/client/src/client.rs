//! Rust client of HTTP API v1. Every GET is checked end to end against the node's CRC32C.

use bytes::Bytes;
use ctxpod_wire::frame;
use ctxpod_wire::key::key_hex;
use ctxpod_wire::types::*;
use ctxpod_wire::Durability;
use reqwest::{Method, StatusCode};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("HTTP {status}: {body:?}")]
    Status {
        status: u16,
        body: Option<ErrorBody>,
    },
    #[error("transport: {0}")]
    Transport(#[from] reqwest::Error),
    #[error("block {key} failed its CRC32C check on receipt")]
    Integrity { key: String },
    #[error("malformed response: {0}")]
    Malformed(String),
    #[error("invalid client setting: {0}")]
    Invalid(String),
}

impl ClientError {
    /// The HTTP status of a refused request, if that is what this is.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// Outcome of a successful put.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    /// 201: stored now.
    Created,
    /// 200: already stored with the same content.
    Exists,
}

/// One page of a key listing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyPage {
    /// The keys, in byte order.
    pub keys: Vec<Vec<u8>>,
    /// Set when the listing may go on: the `after` of the next page (the page's last key).
    pub next: Option<Vec<u8>>,
    /// Asked with `meta`: what the index says of each key's block, in the order of `keys`.
    pub blocks: Option<Vec<ListedBlock>>,
}

impl KeyPage {
    /// A page from its JSON answer, checked: hex keys, in order, at most `limit`.
    pub fn from_wire(page: KeyList, limit: usize) -> Result<KeyPage, ClientError> {
        let bad = |why: &str| ClientError::Malformed(format!("key listing: {why}"));
        let keys = page
            .keys
            .iter()
            .map(|k| ctxpod_wire::key::parse_key_hex(k))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| bad("a key that is not hex"))?;
        let next = page
            .next
            .as_deref()
            .map(ctxpod_wire::key::parse_key_hex)
            .transpose()
            .map_err(|_| bad("a cursor that is not hex"))?;
        if keys.len() > limit || !keys.windows(2).all(|w| w[0] < w[1]) {
            return Err(bad("more keys than asked, or out of order"));
        }
        if page.blocks.as_ref().is_some_and(|b| b.len() != keys.len()) {
            return Err(bad("not one block entry per key"));
        }
        Ok(KeyPage {
            keys,
            next,
            blocks: page.blocks,
        })
    }
}

/// The query of one page of a key listing.
pub fn list_query(prefix: &[u8], after: Option<&[u8]>, limit: usize) -> String {
    let mut q = format!("prefix={}&limit={limit}", key_hex(prefix));
    if let Some(a) = after {
        q.push_str("&after=");
        q.push_str(&key_hex(a));
    }
    q
}

/// One result of a batch get: the key and its bytes, or `None` for a miss.
pub type BatchGetResult = (Vec<u8>, Option<Bytes>);

/// Whether `e` is a connection the node closed (or reset) after accepting it and before
/// answering: a node at its connection cap closes new connections so, unread. Not a
/// connection refused (nobody listens: failing fast lets the pod client go to another
/// member), nor a timeout.
fn closed_unanswered(e: &reqwest::Error) -> bool {
    if e.is_connect() || e.is_timeout() {
        return false;
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        // Closed before the answer began, or before the request was even sent (canceled).
        if s.downcast_ref::<hyper::Error>()
            .is_some_and(|h| h.is_incomplete_message() || h.is_canceled())
        {
            return true;
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            let closed = [
                ConnectionReset,
                ConnectionAborted,
                BrokenPipe,
                UnexpectedEof,
            ];
            return closed.contains(&io.kind());
        }
        source = s.source();
    }
    false
}

#[derive(Clone)]
pub struct Client {
    base: String,
    http: reqwest::Client,
    busy_retries: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Client {
    /// `base` is the node's URL, e.g. `http://127.0.0.1:7400`: plain HTTP, no token.
    pub fn new(base: impl Into<String>) -> Self {
        Self::connect(base, &crate::connect::Connect::default())
            .expect("a plain HTTP client always builds")
    }

    /// A client with a bearer token and/or TLS (`https://` URLs).
    pub fn connect(
        base: impl Into<String>,
        how: &crate::connect::Connect,
    ) -> Result<Self, ClientError> {
        Self::connect_with_headers(base, how, reqwest::header::HeaderMap::new())
    }

    /// [`Client::connect`] with headers sent on every request.
    pub(crate) fn connect_with_headers(
        base: impl Into<String>,
        how: &crate::connect::Connect,
        mut h: reqwest::header::HeaderMap,
    ) -> Result<Self, ClientError> {
        how.deadlines.check().map_err(ClientError::Invalid)?;
        let mut b = reqwest::Client::builder()
            .pool_max_idle_per_host(256)
            .connect_timeout(how.deadlines.connect)
            .timeout(how.deadlines.request);
        if let Some(t) = &how.token {
            let mut v =
                reqwest::header::HeaderValue::from_str(&format!("Bearer {t}")).map_err(|_| {
                    ClientError::Invalid("the token is not a valid header value".into())
                })?;
            v.set_sensitive(true);
            h.insert(reqwest::header::AUTHORIZATION, v);
        }
        if !h.is_empty() {
            b = b.default_headers(h);
        }
        // Always a configuration of ours (aws-lc-rs, and no trusted roots unless given): plain
        // `http://` never uses it, and `https://` without a CA fails to verify, as it should.
        let tls = match &how.tls {
            Some(tls) => (**tls).clone(),
            None => crate::connect::untrusting_tls_config(),
        };
        b = b.use_preconfigured_tls(tls);
        Ok(Client {
            base: base.into().trim_end_matches('/').to_string(),
            http: b.build()?,
            busy_retries: Default::default(),
        })
    }

    /// The underlying HTTP client (it carries the token and TLS settings).
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    fn block_path(ns: &str, key: &[u8]) -> String {
        format!("/v1/namespaces/{ns}/blocks/{}", key_hex(key))
    }

    async fn fail(resp: reqwest::Response) -> ClientError {
        let status = resp.status().as_u16();
        let body = resp.json::<ErrorBody>().await.ok();
        ClientError::Status { status, body }
    }

    /// A 404 about the block itself (not about its namespace or the route).
    fn is_block_miss(e: &ClientError) -> bool {
        matches!(e, ClientError::Status { status: 404, body: Some(b) } if b.error == "not_found")
    }

    /// `method` on one block, with no body; the answer as it is (refusals included).
    async fn block_request(
        &self,
        method: Method,
        ns: &str,
        key: &[u8],
    ) -> Result<reqwest::Response, ClientError> {
        let url = self.url(&Self::block_path(ns, key));
        Ok(self.http.request(method, url).send().await?)
    }

    /// `method path` with no body; the answer's JSON.
    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
    ) -> Result<T, ClientError> {
        let resp = self.send(self.http.request(method, self.url(path))).await?;
        Ok(resp.json().await?)
    }

    /// `POST /v1/namespaces/{ns}/{op}` with a JSON body.
    async fn post_ns(
        &self,
        ns: &str,
        op: &str,
        body: &impl serde::Serialize,
    ) -> Result<reqwest::Response, ClientError> {
        let url = self.url(&format!("/v1/namespaces/{ns}/{op}"));
        self.send(self.http.post(url).json(body)).await
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Result<reqwest::Response, ClientError> {
        let resp = self.send_retrying(req).await?;
        if resp.status().is_success() {
            Ok(resp)
        } else {
            Err(Self::fail(resp).await)
        }
    }

    /// Sends `req`; while the node answers 503 with `Retry-After` (busy: too many requests
    /// or bodies in flight, a full write queue) it is sent again after a backoff of 1, 2,
    /// 4, … 256 ms, [`crate::BUSY_ATTEMPTS`] attempts in all (about 4 s),
    /// as the CXP1 client does. A GET or HEAD whose connection the node closed before
    /// answering (what a node at its connection cap does: it closes a new connection at
    /// once, unread) is busy too. Any other answer or error is returned as it is.
    async fn send_retrying(
        &self,
        req: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, ClientError> {
        let (http, req) = req.build_split();
        let mut req = req?;
        let safe = matches!(*req.method(), Method::GET | Method::HEAD);
        let mut backoff = std::time::Duration::from_millis(1);
        let mut attempt = 1;
        loop {
            let again = req.try_clone();
            let answer = http.execute(req).await;
            let busy = match &answer {
                Ok(resp) => {
                    resp.status() == StatusCode::SERVICE_UNAVAILABLE
                        && resp.headers().contains_key(reqwest::header::RETRY_AFTER)
                }
                Err(e) => safe && closed_unanswered(e),
            };
            match again {
                Some(next) if busy && attempt < crate::BUSY_ATTEMPTS => {
                    drop(answer);
                    self.busy_retries
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(std::time::Duration::from_millis(256));
                    attempt += 1;
                    req = next;
                }
                _ => return Ok(answer?),
            }
        }
    }

    /// Requests sent again because the node answered busy.
    pub fn busy_retries(&self) -> u64 {
        self.busy_retries.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Stores a block, sending its CRC32C so that the node checks the bytes it received.
    pub async fn put(
        &self,
        ns: &str,
        key: &[u8],
        data: Bytes,
        durability: Durability,
    ) -> Result<PutOutcome, ClientError> {
        let crc = ctxpod_wire::crc32c(&data);
        self.put_with_crc(ns, key, data, crc, durability).await
    }

    /// [`Client::put`] with a CRC32C the caller already has (engines often checksum their
    /// KV blocks anyway); a wrong one is refused with 422 and nothing is stored.
    pub async fn put_with_crc(
        &self,
        ns: &str,
        key: &[u8],
        data: Bytes,
        crc: u32,
        durability: Durability,
    ) -> Result<PutOutcome, ClientError> {
        let resp = self
            .send(
                self.http
                    .put(self.url(&Self::block_path(ns, key)))
                    .header(ctxpod_wire::HEADER_CRC32C, ctxpod_wire::crc32c_hex(crc))
                    .header(ctxpod_wire::HEADER_DURABILITY, durability.name())
                    .body(data),
            )
            .await?;
        Ok(if resp.status() == StatusCode::CREATED {
            PutOutcome::Created
        } else {
            PutOutcome::Exists
        })
    }

    /// Stores a copy of a block another member holds ([`ctxpod_wire::HEADER_COPY`], fast
    /// durability): read repair's put. A block the pod deleted is refused (410).
    pub async fn put_copy(&self, ns: &str, key: &[u8], data: Bytes) -> Result<(), ClientError> {
        let crc = ctxpod_wire::crc32c(&data);
        self.send(
            self.http
                .put(self.url(&Self::block_path(ns, key)))
                .header(ctxpod_wire::HEADER_CRC32C, ctxpod_wire::crc32c_hex(crc))
                .header(ctxpod_wire::HEADER_DURABILITY, Durability::Fast.name())
                .header(ctxpod_wire::HEADER_COPY, "1")
                .body(data),
        )
        .await?;
        Ok(())
    }

    /// The block's bytes, or `None` on 404. Checked against `x-ctxpod-crc32c`.
    pub async fn get(&self, ns: &str, key: &[u8]) -> Result<Option<Bytes>, ClientError> {
        let Some((resp, crc)) = self.get_response(ns, key).await? else {
            return Ok(None);
        };
        let large = resp
            .content_length()
            .filter(|&n| n > ctxpod_wire::BLOCK_BYTES_MAX as u64);
        let body = match large {
            Some(n) => {
                let buf = crate::proto_io::recycled_buf(n as usize);
                Self::body_into(resp, buf, crc)
                    .await?
                    .map(|(buf, len)| crate::proto_io::Recycled::bytes(buf, len))
            }
            None => Some(resp.bytes().await?).filter(|b| ctxpod_wire::crc32c(b) == crc),
        };
        body.map(Some)
            .ok_or_else(|| ClientError::Integrity { key: key_hex(key) })
    }

    /// [`Client::get`] into the caller's buffer, as an engine reads into its own pool: the
    /// block or value lands in `buf`'s first bytes (`buf` grown, never shrunk, when it is
    /// shorter), received piece by piece and checksummed as each piece arrives. Gives `buf`
    /// back with how many bytes of it are the value (`None`: not there); a buffer read into
    /// over and over costs no page faults. On an error the buffer is dropped.
    pub async fn get_into(
        &self,
        ns: &str,
        key: &[u8],
        buf: Vec<u8>,
    ) -> Result<(Vec<u8>, Option<usize>), ClientError> {
        let Some((resp, crc)) = self.get_response(ns, key).await? else {
            return Ok((buf, None));
        };
        match Self::body_into(resp, buf, crc).await? {
            Some((buf, len)) => Ok((buf, Some(len))),
            None => Err(ClientError::Integrity { key: key_hex(key) }),
        }
    }

    /// A GET's answer and its `x-ctxpod-crc32c`, or `None` on a miss.
    async fn get_response(
        &self,
        ns: &str,
        key: &[u8],
    ) -> Result<Option<(reqwest::Response, u32)>, ClientError> {
        let resp = self
            .send_retrying(self.http.get(self.url(&Self::block_path(ns, key))))
            .await?;
        if !resp.status().is_success() {
            return match Self::fail(resp).await {
                e if Self::is_block_miss(&e) => Ok(None),
                e => Err(e),
            };
        }
        let crc = resp
            .headers()
            .get(ctxpod_wire::HEADER_CRC32C)
            .and_then(|v| v.to_str().ok())
            .and_then(ctxpod_wire::parse_crc32c_hex)
            .ok_or_else(|| ClientError::Malformed("missing x-ctxpod-crc32c".into()))?;
        Ok(Some((resp, crc)))
    }

    /// A body of its Content-Length received piece by piece into `buf` (grown when it is
    /// shorter; its stale bytes overwritten) and checksummed as each piece arrives, while
    /// it is in cache; `None` when it is not its length or not of CRC32C `crc`.
    async fn body_into(
        mut resp: reqwest::Response,
        mut buf: Vec<u8>,
        crc: u32,
    ) -> Result<Option<(Vec<u8>, usize)>, ClientError> {
        let len = resp
            .content_length()
            .ok_or_else(|| ClientError::Malformed("a GET answer without a length".into()))?
            as usize;
        if buf.len() < len {
            buf.resize(len, 0);
        }
        let (mut at, mut got) = (0usize, 0u32);
        while let Some(piece) = resp.chunk().await? {
            let Some(dst) = buf
                .get_mut(at..at + piece.len())
                .filter(|_| at + piece.len() <= len)
            else {
                return Ok(None);
            };
            dst.copy_from_slice(&piece);
            got = ctxpod_wire::crc32c_append(got, &piece);
            at += piece.len();
        }
        Ok((at == len && got == crc).then_some((buf, len)))
    }

    pub async fn head(&self, ns: &str, key: &[u8]) -> Result<bool, ClientError> {
        let resp = self.block_request(Method::HEAD, ns, key).await?;
        match resp.status() {
            StatusCode::OK => Ok(true),
            StatusCode::NOT_FOUND => Ok(false),
            s => Err(ClientError::Status {
                status: s.as_u16(),
                body: None,
            }),
        }
    }

    /// True if the block existed and is now deleted.
    pub async fn delete(&self, ns: &str, key: &[u8]) -> Result<bool, ClientError> {
        let resp = self.block_request(Method::DELETE, ns, key).await?;
        if resp.status() == StatusCode::NO_CONTENT {
            return Ok(true);
        }
        match Self::fail(resp).await {
            e if Self::is_block_miss(&e) => Ok(false),
            e => Err(e),
        }
    }

    /// Number of leading keys of `chain` present on the node.
    pub async fn match_prefix(&self, ns: &str, chain: &[Vec<u8>]) -> Result<u64, ClientError> {
        let resp = self.post_ns(ns, "match", &keys_request(chain)).await?;
        Ok(resp.json::<MatchResponse>().await?.matched)
    }

    /// One page of namespace `ns`'s keys that start with `prefix`, after `after`, at most
    /// `limit` (1..=[`ctxpod_wire::LIST_KEYS_MAX`]): the whole pod's when the node is in
    /// one.
    pub async fn list_keys(
        &self,
        ns: &str,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<KeyPage, ClientError> {
        let path = format!(
            "/v1/namespaces/{ns}/blocks?{}",
            list_query(prefix, after, limit)
        );
        KeyPage::from_wire(self.call(Method::GET, &path).await?, limit)
    }

    /// The node's miss-ratio curve (admin).
    pub async fn mrc(&self) -> Result<MrcResponse, ClientError> {
        self.call(Method::GET, "/v1/mrc").await
    }

    /// The pod's miss-ratio curve, merged from every member's by the node asked (admin).
    pub async fn pod_mrc(&self) -> Result<MrcResponse, ClientError> {
        self.call(Method::GET, "/v1/mrc?scope=pod").await
    }

    /// Whether each of `keys` is held (by the pod, when the node is in one), in order.
    pub async fn present(&self, ns: &str, keys: &[Vec<u8>]) -> Result<Vec<bool>, ClientError> {
        let resp = self.post_ns(ns, "present", &keys_request(keys)).await?;
        Ok(resp.json::<PresentResponse>().await?.present)
    }

    /// Puts many blocks in one request; returns the per-block HTTP-style status.
    pub async fn batch_put(
        &self,
        ns: &str,
        blocks: &[(Vec<u8>, Bytes)],
        durability: Durability,
    ) -> Result<Vec<u16>, ClientError> {
        let entries: Vec<_> = blocks
            .iter()
            .map(|(k, d)| frame::Entry::put(k, d))
            .collect();
        let resp = self
            .send(
                self.http
                    .post(self.url(&format!("/v1/namespaces/{ns}/batch/put")))
                    .header(ctxpod_wire::HEADER_DURABILITY, durability.name())
                    .header("content-type", "application/octet-stream")
                    .body(frame::encode(&entries)),
            )
            .await?;
        let body = resp.bytes().await?;
        let got = frame::decode(&body).map_err(|e| ClientError::Malformed(e.to_string()))?;
        if got.len() != blocks.len() {
            return Err(ClientError::Malformed("batch/put answer count".into()));
        }
        Ok(got.iter().map(|e| e.status).collect())
    }

    /// Every block of `keys`, in order (`None`: a miss), each checked against its CRC32C.
    /// The node answers the entries it
    /// cannot admit now 503 (the caller's egress share is spent) or 413 (past the answer's
    /// limit); those are asked for again, at once while the last answer brought something,
    /// else after a backoff of 1, 2, 4, … 256 ms, [`crate::BUSY_ATTEMPTS`] times.
    pub async fn batch_get(
        &self,
        ns: &str,
        keys: &[Vec<u8>],
    ) -> Result<Vec<BatchGetResult>, ClientError> {
        let mut got: Vec<Option<Option<Bytes>>> = vec![None; keys.len()];
        let mut todo: Vec<usize> = (0..keys.len()).collect();
        let mut backoff = std::time::Duration::from_millis(1);
        let mut waits = 0;
        while !todo.is_empty() {
            let asked: Vec<Vec<u8>> = todo.iter().map(|&i| keys[i].clone()).collect();
            let answers = self.batch_get_once(ns, &asked).await?;
            let (mut again, mut busy) = (Vec::new(), false);
            for (&i, (status, data)) in todo.iter().zip(answers) {
                match status {
                    200 | 404 => got[i] = Some(data),
                    503 => {
                        busy = true;
                        again.push(i);
                    }
                    413 => again.push(i),
                    s => {
                        return Err(ClientError::Status {
                            status: s,
                            body: None,
                        })
                    }
                }
            }
            if again.len() == todo.len() {
                // Nothing came back: a block alone over the limit, or the share still spent.
                if !busy || waits + 1 >= crate::BUSY_ATTEMPTS {
                    return Err(ClientError::Status {
                        status: if busy { 503 } else { 413 },
                        body: None,
                    });
                }
                waits += 1;
                self.busy_retries
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(std::time::Duration::from_millis(256));
            } else if !again.is_empty() {
                self.busy_retries
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            todo = again;
        }
        Ok(keys
            .iter()
            .cloned()
            .zip(got.into_iter().map(|g| g.expect("every entry answered")))
            .collect())
    }

    /// One `batch/get`: each entry's status and, for a 200, its bytes (checked).
    async fn batch_get_once(
        &self,
        ns: &str,
        keys: &[Vec<u8>],
    ) -> Result<Vec<(u16, Option<Bytes>)>, ClientError> {
        let resp = self.post_ns(ns, "batch/get", &keys_request(keys)).await?;
        let buf = resp.bytes().await?;
        let got = frame::decode(&buf).map_err(|e| ClientError::Malformed(e.to_string()))?;
        if got.len() != keys.len() {
            return Err(ClientError::Malformed(format!(
                "{} entries answered for {} keys",
                got.len(),
                keys.len()
            )));
        }
        let mut out = Vec::with_capacity(got.len());
        for (e, k) in got.into_iter().zip(keys) {
            if e.key != &k[..] {
                return Err(ClientError::Malformed(format!(
                    "answer for key {} where {} was asked",
                    key_hex(e.key),
                    key_hex(k)
                )));
            }
            let data = match (e.status, e.data) {
                (200, Some(d)) => {
                    if Some(ctxpod_wire::crc32c(d)) != e.crc32c {
                        return Err(ClientError::Integrity {
                            key: key_hex(e.key),
                        });
                    }
                    Some(buf.slice_ref(d))
                }
                (200, None) => {
                    return Err(ClientError::Malformed(format!(
                        "entry {} answered 200 with no data",
                        key_hex(e.key)
                    )))
                }
                _ => None,
            };
            out.push((e.status, data));
        }
        Ok(out)
    }

    pub async fn pin(&self, ns: &str, keys: &[Vec<u8>], ttl_ms: u64) -> Result<u64, ClientError> {
        let body = PinRequest {
            keys: keys_request(keys).keys,
            ttl_ms,
        };
        let resp = self.post_ns(ns, "pin", &body).await?;
        Ok(resp.json::<PinResponse>().await?.pinned)
    }

    pub async fn unpin(&self, ns: &str, keys: &[Vec<u8>]) -> Result<u64, ClientError> {
        let resp = self.post_ns(ns, "unpin", &keys_request(keys)).await?;
        Ok(resp.json::<UnpinResponse>().await?.unpinned)
    }

    /// Moves `keys` to the fast tier of the node (in a pod, of every member holding them):
    /// how many were moved, and how many are in the fast tier now.
    pub async fn promote(
        &self,
        ns: &str,
        keys: &[Vec<u8>],
    ) -> Result<PromoteResponse, ClientError> {
        let resp = self.post_ns(ns, "promote", &keys_request(keys)).await?;
        Ok(resp.json::<PromoteResponse>().await?)
    }

    /// Creates a namespace (201) or confirms it exists (200).
    pub async fn create_namespace(
        &self,
        ns: &str,
        quota_bytes: Option<u64>,
    ) -> Result<NamespaceInfo, ClientError> {
        self.create_namespace_with(
            ns,
            &CreateNamespace {
                quota_bytes,
                ..CreateNamespace::default()
            },
        )
        .await
    }

    /// Creates a namespace with these settings, or sets them on the existing one.
    pub async fn create_namespace_with(
        &self,
        ns: &str,
        settings: &CreateNamespace,
    ) -> Result<NamespaceInfo, ClientError> {
        let resp = self
            .send(
                self.http
                    .request(Method::PUT, self.url(&format!("/v1/namespaces/{ns}")))
                    .json(settings),
            )
            .await?;
        Ok(resp.json().await?)
    }

    pub async fn namespace(&self, ns: &str) -> Result<NamespaceInfo, ClientError> {
        self.call(Method::GET, &format!("/v1/namespaces/{ns}"))
            .await
    }

    pub async fn delete_namespace(&self, ns: &str) -> Result<(), ClientError> {
        self.send(self.http.delete(self.url(&format!("/v1/namespaces/{ns}"))))
            .await?;
        Ok(())
    }

    pub async fn namespaces(&self) -> Result<NamespaceList, ClientError> {
        self.call(Method::GET, "/v1/namespaces").await
    }

    pub async fn stats(&self) -> Result<Stats, ClientError> {
        self.call(Method::GET, "/v1/stats").await
    }

    /// `GET /v1/cluster`: the pod as this node sees it.
    pub async fn cluster(&self) -> Result<ctxpod_wire::types::Cluster, ClientError> {
        self.call(Method::GET, "/v1/cluster").await
    }

    /// `GET /v1/overview`: every member with its stats, every namespace with its usage
    /// (admin or viewer; the dashboard's view).
    pub async fn overview(&self) -> Result<ctxpod_wire::types::Overview, ClientError> {
        self.call(Method::GET, "/v1/overview").await
    }

    /// `POST /v1/plan`: the planner for `args` (`ctxpod plan`'s options in snake case):
    /// `{"input": ..., "plan": ...}`.
    pub async fn plan(&self, args: &serde_json::Value) -> Result<serde_json::Value, ClientError> {
        let resp = self
            .send(self.http.post(self.url("/v1/plan")).json(args))
            .await?;
        Ok(resp.json().await?)
    }

    /// `POST /v1/admin/drain` (admin): the node starts draining (see `DrainStatus`).
    pub async fn drain(&self) -> Result<ctxpod_wire::types::DrainStatus, ClientError> {
        self.call(Method::POST, "/v1/admin/drain").await
    }

    /// `GET /v1/admin/drain` (admin): how far the node's drain is.
    pub async fn drain_status(&self) -> Result<ctxpod_wire::types::DrainStatus, ClientError> {
        self.call(Method::GET, "/v1/admin/drain").await
    }

    /// `POST /v1/admin/repair` (admin): the node's backfill runs a pass now; the status
    /// names the pass to wait for.
    pub async fn repair(&self) -> Result<ctxpod_wire::types::RepairStatus, ClientError> {
        self.call(Method::POST, "/v1/admin/repair").await
    }

    /// `GET /v1/admin/repair` (admin): where the node's backfill passes stand.
    pub async fn repair_status(&self) -> Result<ctxpod_wire::types::RepairStatus, ClientError> {
        self.call(Method::GET, "/v1/admin/repair").await
    }

    /// `DELETE /v1/admin/drain` (admin): the node is up again.
    pub async fn undrain(&self) -> Result<ctxpod_wire::types::DrainStatus, ClientError> {
        self.call(Method::DELETE, "/v1/admin/drain").await
    }

    /// The Prometheus text of `/metrics`.
    pub async fn metrics(&self) -> Result<String, ClientError> {
        let resp = self.send(self.http.get(self.url("/metrics"))).await?;
        Ok(resp.text().await?)
    }

    /// True when `/readyz` answers 200.
    pub async fn ready(&self) -> bool {
        matches!(self.http.get(self.url("/readyz")).send().await, Ok(r) if r.status().is_success())
    }
}

/// The JSON body naming `keys`, in hex.
fn keys_request(keys: &[Vec<u8>]) -> KeysRequest {
    KeysRequest {
        keys: keys.iter().map(|k| key_hex(k)).collect(),
    }
}
