//! Batches across the pod: `batch/get`, `batch/put`, `pin` and `unpin` sent to any node
//! are answered for the whole pod. The node splits the batch by member, asks the members
//! (itself included) all at once, and puts the answers back in the request's order.
//!
//! The rules are the pod planner's (`ctxpod_wire::pod_plan`); this module is the node's
//! I/O for them (the requests to members, their answers checked):
//! - `batch/get` ([`ReadPlan`](ctxpod_wire::pod_plan::ReadPlan)): each key goes to its
//!   first-ranked member; keys a member misses (or that cannot be reached) go to their next
//!   candidate in the following round, up to max(3, R + 1) members, as a single `GET` would.
//! - `batch/put` ([`WritePlan`](ctxpod_wire::pod_plan::WritePlan)): each block goes to its
//!   R first-ranked members; a member that cannot be reached is replaced by the next in
//!   rank order in the following round. A block is acknowledged (200/201) once R members
//!   stored it; a refusal is its answer; too few members reachable is 503.
//! - `pin` / `unpin` / `present` ([`fan_out`](ctxpod_wire::pod_plan::fan_out)): every
//!   candidate member of a key is asked (whichever holds a copy keeps it); a key counts
//!   once, if any member pinned (unpinned, holds) it.
//! - a key listing ([`fold_pages`](ctxpod_wire::pod_plan::fold_pages)): every member is
//!   asked for the same page; the pages are merged in key order, each key once.
//!
//! Sub-requests carry `x-ctxpod-forwarded-by` and the caller's credentials
//! ([`super::Peers::for_caller`]). The answering node holds the members' answers until it
//! answers: at most what each member asked may send (64 MiB a `batch/get`).

use super::membership::MemberInfo;
use super::Peers;
use bytes::Bytes;
use ctxpod_wire::frame;
use ctxpod_wire::types::{
    KeysRequest, PinRequest, PinResponse, PresentResponse, PromoteResponse, UnpinResponse,
};
use http::HeaderMap;
use std::time::Duration;

/// A sub-request's deadline: a member that has not answered it whole by then (a frozen
/// one) is asked no more, well within a client's own deadline (10 s by default), and is
/// counted down ([`super::route::Missed`]). A share of a batch is at most 64 MiB.
const TIMEOUT: Duration = super::route::PEER_DEADLINE;

/// One key's answer to a `batch/get`.
#[derive(Clone, Debug)]
pub struct Got {
    pub status: u16,
    pub crc32c: Option<u32>,
    pub len: u32,
    pub data: Option<Bytes>,
}

/// Why a member gave no usable answer to a sub-request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PeerError {
    /// It could not be reached, or its answer was cut short: the next candidate is asked.
    #[error("the member could not be reached")]
    Unreachable,
    /// It refused the whole request with this HTTP status.
    #[error("the member refused the request with HTTP {0}")]
    Refused(u16),
    /// Its answer broke the contract (over its share, undecodable, the wrong count).
    #[error("the member's answer was malformed")]
    Malformed,
}

impl PeerError {
    /// The status a request that got this answers with, when it is not asked again
    /// elsewhere (`None` for a member that could not be reached).
    pub fn status(self) -> Option<u16> {
        match self {
            PeerError::Unreachable => None,
            PeerError::Refused(s) => Some(s),
            PeerError::Malformed => Some(502),
        }
    }
}

/// Asks members for a caller: the namespace (as the caller names it), credentials.
pub struct Asker<'a> {
    pub peers: &'a Peers,
    pub me: &'a str,
    pub ns: &'a str,
    pub headers: &'a HeaderMap,
    pub caller_tenant: Option<&'a str>,
}

impl Asker<'_> {
    /// A `method` request of `what` (a path under the namespace, with its query) at member
    /// `m`, for the caller.
    fn request(&self, method: http::Method, m: &MemberInfo, what: &str) -> reqwest::RequestBuilder {
        let url = format!("{}/v1/namespaces/{}/{what}", m.http, self.ns);
        let req = self
            .peers
            .http
            .request(method, url)
            .timeout(TIMEOUT)
            .header(super::route::HEADER_FORWARDED, self.me);
        self.peers.for_caller(req, self.headers, self.caller_tenant)
    }

    fn post(&self, m: &MemberInfo, what: &str) -> reqwest::RequestBuilder {
        self.request(http::Method::POST, m, what)
    }

    fn get(&self, m: &MemberInfo, what: &str) -> reqwest::RequestBuilder {
        self.request(http::Method::GET, m, what)
    }

    /// Sends a request to `m`: its answer when successful, else why not. A member that
    /// misses the deadline is counted down (asked last for a while), one that answers up; a
    /// refused connection costs nothing and counts neither way.
    async fn send(
        &self,
        m: &MemberInfo,
        req: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, PeerError> {
        let resp = req.send().await;
        match &resp {
            Ok(_) => self.peers.missed.note(&m.id, true),
            Err(e) if e.is_timeout() => self.peers.missed.note(&m.id, false),
            Err(_) => {}
        }
        let resp = resp.map_err(|_| PeerError::Unreachable)?;
        if resp.status().is_success() {
            Ok(resp)
        } else {
            Err(PeerError::Refused(resp.status().as_u16()))
        }
    }

    fn keys_request(keys: &[&[u8]]) -> KeysRequest {
        KeysRequest {
            keys: keys.iter().map(hex::encode).collect(),
        }
    }

    /// `batch/get` of `keys` at member `m`, its answer carrying at most `bytes_max` bytes
    /// of blocks.
    pub async fn batch_get(
        &self,
        m: &MemberInfo,
        keys: &[&[u8]],
        bytes_max: usize,
    ) -> Result<Vec<Got>, PeerError> {
        let req = self
            .post(m, "batch/get")
            .header(ctxpod_wire::HEADER_ANSWER_BYTES_MAX, bytes_max)
            .json(&Self::keys_request(keys));
        let resp = self.send(m, req).await?;
        // Read no more than an honest answer may hold: the share's blocks, and each key's
        // entry header. A member that sends more costs a 502, never the memory.
        let limit = 8 + keys.len() * (12 + ctxpod_wire::KEY_BYTES_MAX) + bytes_max;
        if resp.content_length().is_some_and(|n| n as usize > limit) {
            tracing::warn!(member = %m.id, "a member's batch/get answer is over its share");
            return Err(PeerError::Malformed);
        }
        let mut body = bytes::BytesMut::new();
        let mut stream = resp.bytes_stream();
        while let Some(chunk) = futures::StreamExt::next(&mut stream).await {
            let chunk = chunk.map_err(|_| PeerError::Unreachable)?;
            if body.len() + chunk.len() > limit {
                tracing::warn!(member = %m.id, "a member's batch/get answer is over its share");
                return Err(PeerError::Malformed);
            }
            body.extend_from_slice(&chunk);
        }
        let body = body.freeze();
        let got = frame::decode(&body).map_err(|_| PeerError::Malformed)?;
        if got.len() != keys.len() {
            return Err(PeerError::Malformed);
        }
        // Bytes taken from a member are checked against their CRC32C before they are served
        // or stored: an entry that does not match is a miss here, as a corrupt record read
        // from flash is (the next candidate is asked).
        Ok(got
            .iter()
            .map(|e| match e.data {
                Some(d) if e.crc32c != Some(ctxpod_wire::crc32c(d)) => {
                    tracing::warn!(
                        member = %m.id,
                        "a member answered a block whose bytes do not match its CRC32C"
                    );
                    Got {
                        status: 404,
                        crc32c: None,
                        len: 0,
                        data: None,
                    }
                }
                _ => Got {
                    status: e.status,
                    crc32c: e.crc32c,
                    len: e.len,
                    data: e.data.map(|d| body.slice_ref(d)),
                },
            })
            .collect())
    }

    /// One page of member `m`'s own listing of the namespace, with each block's entry:
    /// keys starting with `prefix`, after `after`, at most `limit` (`GET
    /// /v1/namespaces/{ns}/blocks?meta=true`). Checked: a member that answers more than
    /// asked, out of order, or outside the prefix or the cursor broke the contract.
    #[allow(clippy::type_complexity)]
    pub async fn list(
        &self,
        m: &MemberInfo,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<(Vec<(Vec<u8>, ctxpod_wire::types::ListedBlock)>, bool), PeerError> {
        let query = ctxpod_client::client::list_query(prefix, after, limit);
        let resp = self
            .send(m, self.get(m, &format!("blocks?{query}&meta=true")))
            .await?;
        let page = resp
            .json::<ctxpod_wire::types::KeyList>()
            .await
            .ok()
            .and_then(|p| ctxpod_client::client::KeyPage::from_wire(p, limit).ok());
        let in_range = |p: &ctxpod_client::client::KeyPage| {
            p.keys
                .iter()
                .all(|k| k.starts_with(prefix) && after.is_none_or(|a| k.as_slice() > a))
        };
        match page {
            Some(p) if in_range(&p) && p.blocks.is_some() => {
                let more = p.next.is_some();
                let blocks = p.blocks.unwrap_or_default();
                Ok((p.keys.into_iter().zip(blocks).collect(), more))
            }
            _ => {
                tracing::warn!(member = %m.id, "a member's key listing broke the contract");
                Err(PeerError::Malformed)
            }
        }
    }

    /// The multipart uploads in progress on member `m` itself (each lives on its key's
    /// first member), of keys starting with `prefix`.
    pub async fn uploads(
        &self,
        m: &MemberInfo,
        prefix: &[u8],
    ) -> Result<ctxpod_wire::types::UploadList, PeerError> {
        let what = format!("uploads?prefix={}", hex::encode(prefix));
        let resp = self.send(m, self.get(m, &what)).await?;
        resp.json::<ctxpod_wire::types::UploadList>()
            .await
            .map_err(|_| PeerError::Malformed)
    }

    /// Which of `keys` member `m` holds itself.
    pub async fn present(&self, m: &MemberInfo, keys: &[&[u8]]) -> Result<Vec<bool>, PeerError> {
        let resp = self
            .send(m, self.post(m, "present").json(&Self::keys_request(keys)))
            .await?;
        match resp.json::<PresentResponse>().await {
            Ok(a) if a.present.len() == keys.len() => Ok(a.present),
            _ => Err(PeerError::Malformed),
        }
    }

    /// `batch/put` of `blocks` at `m`: per block, its status.
    pub async fn batch_put(
        &self,
        m: &MemberInfo,
        blocks: &[(&[u8], &Bytes)],
        durability: Option<&http::HeaderValue>,
    ) -> Result<Vec<u16>, PeerError> {
        let entries: Vec<frame::Entry> = blocks
            .iter()
            .map(|(k, d)| frame::Entry::put(k, d))
            .collect();
        let mut req = self
            .post(m, "batch/put")
            .header("content-type", "application/octet-stream")
            .body(frame::encode(&entries));
        if let Some(d) = durability {
            req = req.header(ctxpod_wire::HEADER_DURABILITY, d);
        }
        let body = self
            .send(m, req)
            .await?
            .bytes()
            .await
            .map_err(|_| PeerError::Unreachable)?;
        let got = frame::decode(&body).map_err(|_| PeerError::Malformed)?;
        if got.len() != blocks.len() {
            return Err(PeerError::Malformed);
        }
        Ok(got.iter().map(|e| e.status).collect())
    }

    /// `pin` (with `ttl_ms`) or `unpin` (without) of `keys` at `m`: per key, whether it
    /// was pinned (unpinned) there.
    pub async fn pin(
        &self,
        m: &MemberInfo,
        keys: &[&[u8]],
        ttl_ms: Option<u64>,
    ) -> Result<Vec<bool>, PeerError> {
        let hex_keys = keys.iter().map(hex::encode).collect();
        let req = match ttl_ms {
            Some(ttl_ms) => self.post(m, "pin").json(&PinRequest {
                keys: hex_keys,
                ttl_ms,
            }),
            None => self.post(m, "unpin").json(&KeysRequest { keys: hex_keys }),
        };
        let resp = self.send(m, req).await?;
        let each = match ttl_ms {
            Some(_) => {
                resp.json::<PinResponse>()
                    .await
                    .map_err(|_| PeerError::Unreachable)?
                    .each
            }
            None => {
                resp.json::<UnpinResponse>()
                    .await
                    .map_err(|_| PeerError::Unreachable)?
                    .each
            }
        };
        match each {
            Some(e) if e.len() == keys.len() => Ok(e),
            _ => Err(PeerError::Malformed),
        }
    }

    /// Promotes `keys` to member `m`'s fast tier: per key whether it moved it now (all
    /// false from a member too old to say), and whether it is in its fast tier now.
    pub async fn promote(
        &self,
        m: &MemberInfo,
        keys: &[&[u8]],
    ) -> Result<(Vec<bool>, Vec<bool>), PeerError> {
        let req = self.post(m, "promote").json(&Self::keys_request(keys));
        let r = self
            .send(m, req)
            .await?
            .json::<PromoteResponse>()
            .await
            .map_err(|_| PeerError::Unreachable)?;
        let moved = r.moved.unwrap_or_else(|| vec![false; keys.len()]);
        match r.each {
            Some(e) if e.len() == keys.len() && moved.len() == keys.len() => Ok((moved, e)),
            _ => Err(PeerError::Malformed),
        }
    }
}
