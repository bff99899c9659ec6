//! A small etcd v3 client over etcd's JSON gateway: the `/v3/...` routes every etcd server
//! (3.4 and later) serves on its client URL, the gRPC API mapped to HTTP/JSON. Pod membership
//! needs only leases, puts, prefix ranges, deletes, watches and a compare-and-swap
//! transaction ([`Etcd::cas_put`], the quota ledger's), so this avoids a gRPC stack.
//!
//! Keys and values travel base64-encoded; 64-bit integers travel as JSON strings (the
//! gateway's proto3 JSON mapping); both forms are accepted when reading. Each call tries the
//! endpoints in turn and fails only when none answers.
//!
//! Security ([`Etcd::from_config`]): `https://` endpoints are verified against
//! `pod.etcd_ca_file`, the node presents `pod.etcd_cert_file` / `etcd_key_file` (etcd's
//! `--client-cert-auth`), and with `pod.etcd_username` it authenticates (etcd's auth:
//! `/v3/auth/authenticate`, the token sent in `Authorization` on every call and watch,
//! taken again when etcd says it is no longer valid). etcd 3.4's gateway refuses a client
//! certificate that carries a common name while auth is on: give the nodes' etcd client
//! certificate none.

use anyhow::{bail, Context};
use base64::Engine as _;
use futures::StreamExt;
use serde_json::{json, Value};
use std::time::Duration;

use crate::connection_refused;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// How long one call to etcd may take before the next endpoint is tried.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Clone)]
pub struct Etcd {
    http: reqwest::Client,
    endpoints: Vec<String>,
    /// etcd's auth: the user, its password, and the token last given.
    auth: Option<std::sync::Arc<Auth>>,
}

struct Auth {
    user: String,
    password: String,
    token: tokio::sync::Mutex<Option<String>>,
}

/// One key and its value, from a range or a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kv {
    pub key: String,
    pub value: Vec<u8>,
    pub mod_revision: i64,
}

/// A change seen by a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    Put(Kv),
    Delete { key: String, mod_revision: i64 },
}

/// Every endpoint refused the connection: etcd is not running where it is configured (as
/// opposed to a silence: a cut link, or packets dropped). `crate::fence` counts this as
/// "etcd down for everyone".
#[derive(Debug, thiserror::Error)]
#[error("every etcd endpoint refused the connection")]
pub struct Refused;

/// Whether a failed call to etcd was refused by every endpoint ([`Refused`]).
pub fn refused(e: &anyhow::Error) -> bool {
    e.downcast_ref::<Refused>().is_some()
}

fn b64(s: &[u8]) -> String {
    B64.encode(s)
}

/// A proto3-JSON int64: a string, or a number.
fn int(v: &Value) -> Option<i64> {
    match v {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.as_i64(),
        _ => None,
    }
}

/// The end of the range holding every key that starts with `prefix` (etcd's convention:
/// the prefix with its last byte incremented).
pub fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0] // every key
}

fn kv_of(v: &Value) -> anyhow::Result<Kv> {
    let key = B64
        .decode(v["key"].as_str().context("kv without a key")?)
        .context("kv key is not base64")?;
    let value = match v["value"].as_str() {
        Some(s) => B64.decode(s).context("kv value is not base64")?,
        None => Vec::new(),
    };
    Ok(Kv {
        key: String::from_utf8(key).context("kv key is not UTF-8")?,
        value,
        mod_revision: int(&v["mod_revision"]).unwrap_or(0),
    })
}

impl Etcd {
    /// A client for these endpoints (`http://host:2379`, ...).
    pub fn new(endpoints: Vec<String>) -> anyhow::Result<Etcd> {
        // Plain `http://` endpoints; the TLS configuration is ctxpod's own (aws-lc-rs), as
        // reqwest needs one, and trusts nothing.
        Self::with(
            endpoints,
            ctxpod_client::connect::untrusting_tls_config(),
            None,
        )
    }

    /// A client as the pod configuration says: TLS trusting `etcd_ca_file`, the client
    /// certificate, etcd auth.
    pub fn from_config(p: &ctxpod_format::config::PodConfig) -> anyhow::Result<Etcd> {
        let read =
            |f: &std::path::Path| std::fs::read(f).with_context(|| format!("read {}", f.display()));
        let tls = super::client_tls(
            p.etcd_ca_file.as_deref(),
            p.etcd_cert_file.as_deref().zip(p.etcd_key_file.as_deref()),
            "etcd",
        )?;
        let auth = match (&p.etcd_username, &p.etcd_password_file) {
            (Some(user), Some(f)) => {
                let password = String::from_utf8(read(f)?)
                    .with_context(|| format!("{} is not UTF-8", f.display()))?
                    .trim_end_matches(['\r', '\n'])
                    .to_string();
                Some((user.clone(), password))
            }
            _ => None,
        };
        Self::with(p.etcd_endpoints.clone(), tls, auth)
    }

    fn with(
        endpoints: Vec<String>,
        tls: rustls::ClientConfig,
        auth: Option<(String, String)>,
    ) -> anyhow::Result<Etcd> {
        if endpoints.is_empty() {
            bail!("no etcd endpoints");
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .use_preconfigured_tls(tls)
            .build()
            .context("etcd HTTP client")?;
        Ok(Etcd {
            http,
            endpoints: endpoints
                .into_iter()
                .map(|e| e.trim_end_matches('/').to_string())
                .collect(),
            auth: auth.map(|(user, password)| {
                std::sync::Arc::new(Auth {
                    user,
                    password,
                    token: tokio::sync::Mutex::new(None),
                })
            }),
        })
    }

    /// The auth token to send (`None` without auth): the one held, or a new one when there
    /// is none or `renew` (etcd refused the one held).
    async fn token(&self, renew: bool) -> anyhow::Result<Option<String>> {
        let Some(a) = &self.auth else {
            return Ok(None);
        };
        let mut t = a.token.lock().await;
        if renew || t.is_none() {
            let v = self
                .post_json(
                    "/v3/auth/authenticate",
                    &json!({ "name": a.user, "password": a.password }),
                    None,
                )
                .await
                .context("etcd authenticate")?;
            *t = Some(
                v["token"]
                    .as_str()
                    .context("etcd authenticate answered no token")?
                    .to_string(),
            );
        }
        Ok(t.clone())
    }

    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// One unary call, with the auth token when etcd auth is on (taken again once if etcd
    /// says it is not valid: expired, or etcd restarted).
    async fn call(&self, path: &str, body: Value) -> anyhow::Result<Value> {
        let token = self.token(false).await?;
        match self.post_json(path, &body, token.as_deref()).await {
            Err(e) if self.auth.is_some() && e.downcast_ref::<Unauthenticated>().is_some() => {
                let token = self.token(true).await?;
                self.post_json(path, &body, token.as_deref()).await
            }
            r => r,
        }
    }

    /// POSTs `body` to `path`: the first endpoint that answers 200 gives the answer.
    async fn post_json(
        &self,
        path: &str,
        body: &Value,
        token: Option<&str>,
    ) -> anyhow::Result<Value> {
        let mut last = None;
        let mut all_refused = true;
        for e in &self.endpoints {
            let mut req = self
                .http
                .post(format!("{e}{path}"))
                .timeout(CALL_TIMEOUT)
                .json(body);
            if let Some(t) = token {
                req = req.header(reqwest::header::AUTHORIZATION, t);
            }
            match req.send().await {
                Ok(resp) if resp.status().is_success() => {
                    return resp.json().await.with_context(|| format!("etcd {path}"));
                }
                Ok(resp) if resp.status() == reqwest::StatusCode::UNAUTHORIZED => {
                    return Err(Unauthenticated.into());
                }
                Ok(resp) => {
                    all_refused = false;
                    let st = resp.status();
                    let text = resp.text().await.unwrap_or_default();
                    last = Some(anyhow::anyhow!("etcd {e}{path}: {st}: {text}"));
                }
                Err(err) => {
                    all_refused &= connection_refused(&err);
                    last = Some(anyhow::anyhow!("etcd {e}{path}: {err}"));
                }
            }
        }
        let last = last.unwrap_or_else(|| anyhow::anyhow!("no etcd endpoints"));
        if all_refused && !self.endpoints.is_empty() {
            return Err(last.context(Refused));
        }
        Err(last)
    }

    /// A new lease of `ttl_s` seconds; its id.
    pub async fn grant(&self, ttl_s: i64) -> anyhow::Result<i64> {
        let v = self
            .call("/v3/lease/grant", json!({ "TTL": ttl_s }))
            .await?;
        int(&v["ID"]).context("lease grant answered no ID")
    }

    /// Renews a lease; its remaining TTL in seconds, or `None` when the lease is gone
    /// (expired or revoked: etcd answers TTL 0 or none).
    pub async fn keepalive(&self, lease: i64) -> anyhow::Result<Option<i64>> {
        // The gateway maps the keep-alive stream: one request in, one result out.
        let v = self
            .call("/v3/lease/keepalive", json!({ "ID": lease.to_string() }))
            .await?;
        let ttl = int(&v["result"]["TTL"]).unwrap_or(0);
        Ok((ttl > 0).then_some(ttl))
    }

    pub async fn revoke(&self, lease: i64) -> anyhow::Result<()> {
        self.call("/v3/lease/revoke", json!({ "ID": lease.to_string() }))
            .await?;
        Ok(())
    }

    /// Puts `key = value`, attached to `lease` when given (the key goes when the lease does).
    pub async fn put(&self, key: &str, value: &[u8], lease: Option<i64>) -> anyhow::Result<()> {
        let mut body = json!({ "key": b64(key.as_bytes()), "value": b64(value) });
        if let Some(l) = lease {
            body["lease"] = json!(l.to_string());
        }
        self.call("/v3/kv/put", body).await?;
        Ok(())
    }

    pub async fn delete(&self, key: &str) -> anyhow::Result<()> {
        self.call("/v3/kv/deleterange", json!({ "key": b64(key.as_bytes()) }))
            .await?;
        Ok(())
    }

    /// One key's value, if it exists.
    pub async fn get(&self, key: &str) -> anyhow::Result<Option<Kv>> {
        let v = self
            .call("/v3/kv/range", json!({ "key": b64(key.as_bytes()) }))
            .await?;
        match v["kvs"].as_array().and_then(|a| a.first()) {
            Some(kv) => Ok(Some(kv_of(kv)?)),
            None => Ok(None),
        }
    }

    /// Puts `key = value` only if the key is unchanged since it was read: its
    /// `mod_revision` is still `expected` (0: the key must not exist). One etcd v3
    /// transaction; false when another writer came first (read again and retry).
    pub async fn cas_put(&self, key: &str, value: &[u8], expected: i64) -> anyhow::Result<bool> {
        let k = b64(key.as_bytes());
        let compare = if expected == 0 {
            json!({ "key": k, "target": "CREATE", "result": "EQUAL", "create_revision": "0" })
        } else {
            json!({ "key": k, "target": "MOD", "result": "EQUAL",
                    "mod_revision": expected.to_string() })
        };
        let v = self
            .call(
                "/v3/kv/txn",
                json!({
                    "compare": [compare],
                    "success": [{ "request_put": { "key": k, "value": b64(value) } }],
                }),
            )
            .await?;
        // proto3 JSON leaves out a false `succeeded`.
        Ok(v["succeeded"].as_bool() == Some(true))
    }

    /// Every lease etcd holds.
    pub async fn leases(&self) -> anyhow::Result<Vec<i64>> {
        let v = self.call("/v3/lease/leases", json!({})).await?;
        Ok(v["leases"]
            .as_array()
            .map(|a| a.iter().filter_map(|l| int(&l["ID"])).collect())
            .unwrap_or_default())
    }

    /// Every key under `prefix`, and the store's revision at that moment (a watch from the
    /// next revision misses nothing).
    pub async fn range_prefix(&self, prefix: &str) -> anyhow::Result<(i64, Vec<Kv>)> {
        let v = self
            .call(
                "/v3/kv/range",
                json!({ "key": b64(prefix.as_bytes()), "range_end": b64(&prefix_end(prefix)) }),
            )
            .await?;
        let rev = int(&v["header"]["revision"]).context("range answered no revision")?;
        let kvs = match v["kvs"].as_array() {
            Some(a) => a.iter().map(kv_of).collect::<anyhow::Result<Vec<_>>>()?,
            None => Vec::new(),
        };
        Ok((rev, kvs))
    }

    /// Watches every key under `prefix` from `start_revision`. The stream yields batches of
    /// events in revision order and ends (with an error, or `None`) when the watch breaks:
    /// the caller lists again and watches from there.
    pub async fn watch_prefix(
        &self,
        prefix: &str,
        start_revision: i64,
    ) -> anyhow::Result<impl futures::Stream<Item = anyhow::Result<Vec<WatchEvent>>>> {
        let body = json!({ "create_request": {
            "key": b64(prefix.as_bytes()),
            "range_end": b64(&prefix_end(prefix)),
            "start_revision": start_revision.to_string(),
        }});
        let mut last = None;
        // A watch started with an expired token breaks at once; the caller lists again
        // (which takes a new token) and watches from there.
        let token = self.token(false).await?;
        for e in &self.endpoints {
            // No overall timeout: the answer is a stream that lasts as long as the watch.
            let mut req = self.http.post(format!("{e}/v3/watch")).json(&body);
            if let Some(t) = &token {
                req = req.header(reqwest::header::AUTHORIZATION, t);
            }
            match req.send().await {
                Ok(resp) if resp.status().is_success() => {
                    return Ok(watch_stream(resp.bytes_stream()));
                }
                Ok(resp) => last = Some(anyhow::anyhow!("etcd {e}/v3/watch: {}", resp.status())),
                Err(err) => last = Some(anyhow::anyhow!("etcd {e}/v3/watch: {err}")),
            }
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("no etcd endpoints")))
    }
}

/// etcd refused the auth token (401): take a new one.
#[derive(Debug, thiserror::Error)]
#[error("etcd: the auth token is not valid")]
struct Unauthenticated;

/// The gateway streams one JSON object per watch response, back to back (newline-separated).
/// This splits them, whatever the chunking, and turns each into its events.
fn watch_stream(
    body: impl futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin,
) -> impl futures::Stream<Item = anyhow::Result<Vec<WatchEvent>>> {
    futures::stream::unfold(
        (body, Vec::<u8>::new(), false),
        |(mut body, mut buf, done)| async move {
            if done {
                return None;
            }
            loop {
                if let Some((obj, rest)) = next_json_object(&buf) {
                    let parsed = serde_json::from_slice::<Value>(obj)
                        .context("etcd watch: bad JSON")
                        .and_then(|v| events_of(&v));
                    buf = rest.to_vec();
                    return match parsed {
                        Ok(Some(events)) => Some((Ok(events), (body, buf, false))),
                        Ok(None) => continue, // the "created" answer, or progress
                        Err(e) => Some((Err(e), (body, buf, true))),
                    };
                }
                match body.next().await {
                    Some(Ok(chunk)) => buf.extend_from_slice(&chunk),
                    Some(Err(e)) => {
                        return Some((Err(anyhow::anyhow!("etcd watch: {e}")), (body, buf, true)))
                    }
                    None => return None,
                }
            }
        },
    )
}

/// The first complete top-level JSON object in `buf` and what follows it; `None` when no
/// object is complete yet. Strings are skipped properly (braces inside them do not count).
fn next_json_object(buf: &[u8]) -> Option<(&[u8], &[u8])> {
    let start = buf.iter().position(|&b| b == b'{')?;
    let (mut depth, mut in_str, mut esc) = (0usize, false, false);
    for (i, &b) in buf.iter().enumerate().skip(start) {
        if in_str {
            match (esc, b) {
                (true, _) => esc = false,
                (false, b'\\') => esc = true,
                (false, b'"') => in_str = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_str = true,
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return Some((&buf[start..=i], &buf[i + 1..]));
                }
            }
            _ => {}
        }
    }
    None
}

/// The events of one watch response; `None` for one that carries none (created, progress).
/// A cancelled or compacted watch is an error: the caller lists again.
fn events_of(v: &Value) -> anyhow::Result<Option<Vec<WatchEvent>>> {
    if let Some(e) = v.get("error") {
        bail!("etcd watch: {e}");
    }
    let r = &v["result"];
    if r["canceled"].as_bool() == Some(true) {
        bail!(
            "etcd watch cancelled (compacted to {}): {}",
            int(&r["compact_revision"]).unwrap_or(0),
            r["cancel_reason"].as_str().unwrap_or("")
        );
    }
    let Some(events) = r["events"].as_array() else {
        return Ok(None);
    };
    let mut out = Vec::with_capacity(events.len());
    for e in events {
        let kv = kv_of(&e["kv"])?;
        // proto3 JSON leaves out the default enum value: no "type" is PUT.
        out.push(match e["type"].as_str() {
            Some("DELETE") => WatchEvent::Delete {
                key: kv.key,
                mod_revision: kv.mod_revision,
            },
            _ => WatchEvent::Put(kv),
        });
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends_increment_the_last_byte() {
        assert_eq!(prefix_end("/a/"), b"/a0".to_vec());
        assert_eq!(prefix_end("ab"), b"ac".to_vec());
    }

    #[test]
    fn json_objects_are_split_whatever_the_chunking() {
        let two = br#"{"result":{"a":"}{"}} {"result":{"events":[]}}"#;
        let (first, rest) = next_json_object(two).unwrap();
        assert_eq!(first, br#"{"result":{"a":"}{"}}"#);
        let (second, rest) = next_json_object(rest).unwrap();
        assert_eq!(second, br#"{"result":{"events":[]}}"#);
        assert!(next_json_object(rest).is_none());
        assert!(next_json_object(br#"{"result":{"a":"x\"}"#).is_none());
    }

    #[test]
    fn watch_responses_become_events() {
        let k = B64.encode("/p/n1");
        let v = B64.encode("{}");
        let put: Value = serde_json::from_str(&format!(
            r#"{{"result":{{"events":[{{"kv":{{"key":"{k}","value":"{v}","mod_revision":"7"}}}},
               {{"type":"DELETE","kv":{{"key":"{k}","mod_revision":"8"}}}}]}}}}"#
        ))
        .unwrap();
        let got = events_of(&put).unwrap().unwrap();
        assert_eq!(
            got,
            vec![
                WatchEvent::Put(Kv {
                    key: "/p/n1".into(),
                    value: b"{}".to_vec(),
                    mod_revision: 7
                }),
                WatchEvent::Delete {
                    key: "/p/n1".into(),
                    mod_revision: 8
                }
            ]
        );
        let created: Value = serde_json::from_str(r#"{"result":{"created":true}}"#).unwrap();
        assert_eq!(events_of(&created).unwrap(), None);
        let cancelled: Value = serde_json::from_str(
            r#"{"result":{"canceled":true,"compact_revision":"5","cancel_reason":"x"}}"#,
        )
        .unwrap();
        assert!(events_of(&cancelled).is_err());
    }
}
