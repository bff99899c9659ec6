//! [`EtcdMeta`]: the pod's coordination store on a real etcd (v3 API over gRPC, through the
//! `etcd-client` crate).
//!
//! Security ([`EtcdMeta::from_config`]): `https://` endpoints are verified against
//! `pod.etcd_ca_file` (without one, no server is trusted), the node presents
//! `pod.etcd_cert_file` / `etcd_key_file` (etcd's `--client-cert-auth`), and with
//! `pod.etcd_username` it authenticates with etcd's auth: the password (from
//! `etcd_password_file`) is exchanged for a token, sent with every call and watch. etcd
//! forgets its tokens when it restarts (and expires them): a call it answers "invalid auth
//! token" authenticates again and is sent once more (`etcd-client`'s token refresh), and a
//! watch etcd refuses when it is created does the same. TLS is rustls with the aws-lc-rs
//! provider, as everywhere in ctxpod (tonic takes the process's default provider when one is
//! installed, aws-lc-rs otherwise). Give the nodes' client certificate no common name: etcd
//! takes a certificate's common name as the user when no token comes with a request.
//!
//! Connections: constructing an [`EtcdMeta`] connects nowhere, so a node starts while etcd
//! is down. Each endpoint's connection (and auth token) is made by the first call that needs
//! it and kept; one that did not answer in time is dropped and made again. Each call tries
//! the endpoints in turn (the one that answered last first) and gives each
//! [`CALL_TIMEOUT`]: a cut link fails a call within that, never hangs it. An answer etcd
//! gave (a refusal, a failed compare) is final; only failing to reach an endpoint moves on
//! to the next. A request that failed on a connection kept from earlier calls (etcd
//! restarted since) goes once more on a new one. When every endpoint refused the TCP
//! connection, the error carries [`Refused`]: etcd is not running (not a silence).
//!
//! A watch lives on one endpoint's connection; HTTP/2 pings while it is open end it (with an
//! error) when that connection goes silent.

use super::{prefix_end, Compacted, Kv, Meta, Refused, Watch, WatchEvent};
use anyhow::Context;
use etcd_client::{Client, ConnectOptions, Error as EtcdError};
use futures::StreamExt;
use std::future::Future;
use std::time::Duration;

/// How long one call may take on one endpoint (connecting and authenticating included)
/// before the next endpoint is tried.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// How long a TCP connection to an endpoint may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// HTTP/2 pings while a stream (a watch) is open: every `PING_INTERVAL`, the connection
/// given up when one is not answered within `PING_TIMEOUT`. etcd refuses pings more often
/// than every 5 s (`--grpc-keepalive-min-time`), and any ping without an open stream.
const PING_INTERVAL: Duration = Duration::from_secs(10);
const PING_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest answer taken (a range over many keys); gRPC's default is 4 MiB.
const MAX_ANSWER: usize = 256 << 20;

/// The pod's coordination store on etcd (see the module's doc).
pub struct EtcdMeta {
    endpoints: Vec<Endpoint>,
    /// The endpoint that answered last: calls try it first.
    last_good: std::sync::atomic::AtomicUsize,
    /// Whether etcd's auth is on (a watch etcd refuses is retried with a new token).
    auth: bool,
}

/// One etcd endpoint and the client connected to it, once a call made it.
struct Endpoint {
    url: String,
    options: ConnectOptions,
    /// The client, kept between calls (it reconnects by itself after a closed connection).
    client: parking_lot::Mutex<Option<Client>>,
    /// Held while connecting, so concurrent calls connect once.
    connecting: tokio::sync::Mutex<()>,
}

impl Endpoint {
    /// The client, connected (and authenticated) first when there is none; whether it was
    /// kept from an earlier call (its connection may have closed since).
    async fn client(&self) -> Result<(Client, bool), EtcdError> {
        if let Some(c) = self.client.lock().clone() {
            return Ok((c, true));
        }
        let _one = self.connecting.lock().await;
        if let Some(c) = self.client.lock().clone() {
            return Ok((c, true));
        }
        // No network yet without auth (the channel connects at the first call); with
        // auth, this authenticates.
        let c = Client::connect([self.url.as_str()], Some(self.options.clone())).await?;
        *self.client.lock() = Some(c.clone());
        Ok((c, false))
    }

    /// Drops the client: the next call connects afresh (after one that did not answer in
    /// time, whose connection may be dead, or clogged by a connect that hangs).
    fn reset(&self) {
        *self.client.lock() = None;
    }
}

/// What opening a watch gave: its stream, or etcd's refusal of it.
enum Opened {
    Watching(Box<etcd_client::WatchStream>),
    Cancelled { compacted_to: i64, reason: String },
}

impl EtcdMeta {
    /// A store on these plain `http://` endpoints (`http://host:2379`, ...), without auth.
    /// Connects nowhere yet.
    pub fn new(endpoints: Vec<String>) -> anyhow::Result<EtcdMeta> {
        Self::with(endpoints, None, None)
    }

    /// The store as the pod configuration says (see the module's doc): TLS trusting
    /// `etcd_ca_file`, the client certificate, etcd auth. Reads the files now; connects
    /// nowhere yet (the first call does).
    pub fn from_config(p: &ctxpod_format::config::PodConfig) -> anyhow::Result<EtcdMeta> {
        let read =
            |f: &std::path::Path| std::fs::read(f).with_context(|| format!("read {}", f.display()));
        let identity = p.etcd_cert_file.as_deref().zip(p.etcd_key_file.as_deref());
        // The files parse as rustls takes them (the error names the file), before tonic
        // meets them at the first call.
        crate::client_tls(p.etcd_ca_file.as_deref(), identity, "etcd")?;
        let mut tls = etcd_client::TlsOptions::new();
        if let Some(ca) = &p.etcd_ca_file {
            tls = tls.ca_certificate(etcd_client::Certificate::from_pem(read(ca)?));
        }
        if let Some((cert, key)) = identity {
            tls = tls.identity(etcd_client::Identity::from_pem(read(cert)?, read(key)?));
        }
        let auth = match (&p.etcd_username, &p.etcd_password_file) {
            (Some(user), Some(f)) => {
                let password = String::from_utf8(read(f)?)
                    .with_context(|| format!("{} is not UTF-8", f.display()))?
                    .trim_end_matches(['\r', '\n'])
                    .to_string();
                Some((user.clone(), password))
            }
            (None, None) => None,
            _ => anyhow::bail!("pod.etcd_username and pod.etcd_password_file go together"),
        };
        Self::with(p.etcd_endpoints.clone(), Some(tls), auth)
    }

    fn with(
        endpoints: Vec<String>,
        tls: Option<etcd_client::TlsOptions>,
        auth: Option<(String, String)>,
    ) -> anyhow::Result<EtcdMeta> {
        if endpoints.is_empty() {
            anyhow::bail!("no etcd endpoints");
        }
        let mut options = ConnectOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_keep_alive(PING_INTERVAL, PING_TIMEOUT)
            .with_keep_alive_while_idle(false)
            .with_auto_token_refresh(true);
        if let Some((user, password)) = &auth {
            options = options.with_user(user, password);
        }
        let endpoints = endpoints
            .into_iter()
            .map(|e| {
                let url = e.trim_end_matches('/').to_string();
                let options = match (&tls, url.starts_with("https://")) {
                    (Some(tls), true) => options.clone().with_tls(tls.clone()),
                    (None, true) => options.clone().with_tls(etcd_client::TlsOptions::new()),
                    (_, false) if url.starts_with("http://") => options.clone(),
                    _ => anyhow::bail!("etcd endpoint {url:?}: not an http:// or https:// URL"),
                };
                Ok(Endpoint {
                    url,
                    options,
                    client: parking_lot::Mutex::new(None),
                    connecting: tokio::sync::Mutex::new(()),
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(EtcdMeta {
            endpoints,
            last_good: std::sync::atomic::AtomicUsize::new(0),
            auth: auth.is_some(),
        })
    }

    /// The endpoints, as configured.
    pub fn endpoints(&self) -> impl Iterator<Item = &str> {
        self.endpoints.iter().map(|e| e.url.as_str())
    }

    /// Runs `f` on the endpoints in turn (each for at most [`CALL_TIMEOUT`]), the one that
    /// answered last first, until one answers; the answer and the endpoint that gave it. An
    /// answer etcd gave (an error status such as a refused permission) is final. When a
    /// connection kept from earlier calls fails under `f`, `f` runs once more on a new one,
    /// as `resend` allows. The error names the endpoints, and carries [`Refused`] when every
    /// one refused the connection.
    async fn attempt<T, F, Fut>(
        &self,
        what: &str,
        resend: Resend,
        f: F,
    ) -> anyhow::Result<(T, &str)>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, EtcdError>>,
    {
        use std::sync::atomic::Ordering::Relaxed;
        let mut failures = Vec::new();
        let mut all_refused = true;
        let first = self.last_good.load(Relaxed);
        for i in 0..self.endpoints.len() {
            let at = (first + i) % self.endpoints.len();
            let ep = &self.endpoints[at];
            let mut kept = false;
            let answer = tokio::time::timeout(CALL_TIMEOUT, async {
                let client;
                (client, kept) = ep.client().await?;
                match f(client.clone()).await {
                    // The kept connection may have closed under this call (etcd stopped or
                    // restarted since the last one).
                    Err(e) if kept && resend.allows(&e) => {
                        tracing::debug!(endpoint = %ep.url, "etcd {what}: {}: once more", explain(&e));
                        f(client).await
                    }
                    r => r,
                }
            })
            .await;
            match answer {
                Ok(Ok(v)) => {
                    self.last_good.store(at, Relaxed);
                    return Ok((v, &ep.url));
                }
                Ok(Err(e)) => {
                    let mut msg = format!("etcd {}: {what}: {}", ep.url, explain(&e));
                    if answered(&e) {
                        return Err(anyhow::anyhow!(msg));
                    }
                    if !kept && ep.url.starts_with("https://") && closed_early(&e) {
                        msg.push_str(
                            " (etcd closed a new connection before answering: with \
                             --client-cert-auth it does so when no client certificate it \
                             trusts is presented: pod.etcd_cert_file, etcd_key_file)",
                        );
                    }
                    all_refused &= refused(&e);
                    failures.push(msg);
                }
                Err(_) => {
                    all_refused = false;
                    ep.reset();
                    failures.push(format!(
                        "etcd {}: {what}: no answer within {CALL_TIMEOUT:?}",
                        ep.url
                    ));
                }
            }
        }
        let err = anyhow::anyhow!(failures.join("; "));
        Err(if all_refused {
            err.context(Refused)
        } else {
            err
        })
    }

    /// [`Self::attempt`] of a call that may be sent twice, the answer only.
    async fn call<T, F, Fut>(&self, what: &str, f: F) -> anyhow::Result<T>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, EtcdError>>,
    {
        Ok(self.attempt(what, Resend::Failed, f).await?.0)
    }
}

/// Which failed calls go once more on a new connection, when the one they went on was kept
/// from earlier calls.
#[derive(Clone, Copy)]
enum Resend {
    /// Any that did not reach etcd, or may not have (its connection broke while it was
    /// out): a call etcd may get twice (a second put of the same value, a second lease
    /// granted that expires unused).
    Failed,
    /// Only those that surely did not reach etcd: a compare-and-swap, whose second try
    /// would meet its own first write and answer that another writer came first.
    Unsent,
}

impl Resend {
    fn allows(self, e: &EtcdError) -> bool {
        match self {
            Resend::Failed => !answered(e),
            Resend::Unsent => unsent(e),
        }
    }
}

/// Opens a watch on `client` and reads etcd's first answer (the watch created, or refused).
async fn open_watch(
    client: &Client,
    prefix: &str,
    options: etcd_client::WatchOptions,
) -> Result<Opened, EtcdError> {
    let mut stream = client
        .watch_client()
        .max_decoding_message_size(MAX_ANSWER)
        .watch(prefix, Some(options))
        .await?;
    match stream.message().await? {
        Some(r) if r.canceled() => Ok(Opened::Cancelled {
            compacted_to: r.compact_revision(),
            reason: r.cancel_reason().to_string(),
        }),
        Some(_) => Ok(Opened::Watching(Box::new(stream))),
        None => Err(EtcdError::WatchError(
            "the watch stream ended before etcd answered".into(),
        )),
    }
}

/// The events of one watch answer (`Ok(None)`: none, a progress note), or why the watch
/// ended: cancelled by etcd, [`Compacted`] among them.
fn events_of(r: &etcd_client::WatchResponse) -> anyhow::Result<Option<Vec<WatchEvent>>> {
    if r.canceled() {
        return Err(cancelled(r.compact_revision(), r.cancel_reason()));
    }
    if r.events().is_empty() {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(r.events().len());
    for e in r.events() {
        let kv = e.kv().context("a watch event without its key")?;
        let kv = kv_of(kv)?;
        out.push(match e.event_type() {
            etcd_client::EventType::Put => WatchEvent::Put(kv),
            etcd_client::EventType::Delete => WatchEvent::Delete {
                key: kv.key,
                mod_revision: kv.mod_revision,
            },
        });
    }
    Ok(Some(out))
}

/// A watch etcd cancelled: [`Compacted`] when it says how far history was compacted.
fn cancelled(compacted_to: i64, reason: &str) -> anyhow::Error {
    if compacted_to > 0 {
        anyhow::Error::new(Compacted { compacted_to })
    } else {
        anyhow::anyhow!("etcd cancelled the watch: {reason}")
    }
}

fn kv_of(kv: &etcd_client::KeyValue) -> anyhow::Result<Kv> {
    Ok(Kv {
        key: String::from_utf8(kv.key().to_vec()).context("an etcd key that is not UTF-8")?,
        value: kv.value().to_vec(),
        mod_revision: kv.mod_revision(),
    })
}

/// Whether the error is an answer etcd gave (trying another endpoint would get the same), as
/// opposed to not reaching it. Unavailable (no leader, or no connection) and the like are
/// not.
fn answered(e: &EtcdError) -> bool {
    use tonic::Code;
    match e {
        EtcdError::GRpcStatus(s) => matches!(
            s.code(),
            Code::InvalidArgument
                | Code::NotFound
                | Code::AlreadyExists
                | Code::PermissionDenied
                | Code::FailedPrecondition
                | Code::OutOfRange
                | Code::Unauthenticated
                | Code::ResourceExhausted
                | Code::Unimplemented
        ),
        EtcdError::InvalidArgs(_) | EtcdError::InvalidUri(_) | EtcdError::Utf8Error(_) => true,
        _ => false,
    }
}

/// Whether the request surely did not reach etcd: the connection failed (or closed) before
/// it was sent. A status etcd itself sent carries no source; tonic's own, for a transport
/// failure, do.
fn unsent(e: &EtcdError) -> bool {
    use tonic::Code;
    match e {
        EtcdError::GRpcStatus(s) => {
            matches!(s.code(), Code::Cancelled | Code::Unavailable)
                && std::error::Error::source(s).is_some()
        }
        EtcdError::TransportError(_) => true,
        _ => false,
    }
}

/// The error as a source: `etcd_client::Error` names none of its own.
fn source_of(e: &EtcdError) -> Option<&(dyn std::error::Error + 'static)> {
    match e {
        EtcdError::GRpcStatus(s) => Some(s),
        EtcdError::TransportError(t) => Some(t),
        EtcdError::IoError(io) => Some(io),
        _ => None,
    }
}

/// Whether the TCP connection was refused (ECONNREFUSED, somewhere in the chain).
fn refused(e: &EtcdError) -> bool {
    source_of(e).is_some_and(|s| crate::io_error_in_chain(s, std::io::ErrorKind::ConnectionRefused))
}

/// Whether the connection closed under the request, before any answer (the request cancelled
/// as the connection went, or the TLS stream cut short, or reset).
fn closed_early(e: &EtcdError) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionReset, UnexpectedEof};
    let cancelled = matches!(e, EtcdError::GRpcStatus(s) if s.code() == tonic::Code::Cancelled);
    cancelled
        || source_of(e).is_some_and(|s| {
            [UnexpectedEof, ConnectionReset, BrokenPipe]
                .into_iter()
                .any(|kind| crate::io_error_in_chain(s, kind))
        })
}

/// The error, with what it wraps (a gRPC status' own message says little: "transport
/// error"; the reason is in its sources).
fn explain(e: &EtcdError) -> String {
    let (mut out, mut next) = match e {
        EtcdError::GRpcStatus(s) => (
            format!("{:?}: {}", s.code(), s.message()),
            std::error::Error::source(s),
        ),
        EtcdError::TransportError(t) => (t.to_string(), std::error::Error::source(t)),
        e => (e.to_string(), None),
    };
    while let Some(s) = next {
        let m = s.to_string();
        if !out.contains(&m) {
            out.push_str(": ");
            out.push_str(&m);
        }
        next = s.source();
    }
    out
}

#[async_trait::async_trait]
impl Meta for EtcdMeta {
    fn describe(&self) -> String {
        self.endpoints().collect::<Vec<_>>().join(",")
    }

    async fn grant(&self, ttl_s: i64) -> anyhow::Result<i64> {
        self.call("lease grant", |c| async move {
            Ok(c.lease_client().grant(ttl_s, None).await?.id())
        })
        .await
    }

    async fn keepalive(&self, lease: i64) -> anyhow::Result<Option<i64>> {
        self.call("lease keep-alive", |c| async move {
            // Opening the stream renews once and reads the answer, but keeps its TTL to
            // itself (an error when the lease is gone): renew once more for it.
            let (mut keeper, mut answers) = match c.lease_client().keep_alive(lease).await {
                Err(EtcdError::LeaseKeepAliveError(m)) if m == "lease not found" => {
                    return Ok(None)
                }
                r => r?,
            };
            keeper.keep_alive().await?;
            match answers.message().await? {
                Some(a) => Ok((a.ttl() > 0).then_some(a.ttl())),
                None => Err(EtcdError::LeaseKeepAliveError(
                    "the keep-alive stream ended".into(),
                )),
            }
        })
        .await
    }

    async fn revoke(&self, lease: i64) -> anyhow::Result<()> {
        self.call("lease revoke", |c| async move {
            c.lease_client().revoke(lease).await.map(drop)
        })
        .await
    }

    async fn put(&self, key: &str, value: &[u8], lease: Option<i64>) -> anyhow::Result<()> {
        let options = lease.map(|l| etcd_client::PutOptions::new().with_lease(l));
        self.call(&format!("put {key}"), |c| {
            let options = options.clone();
            async move { c.kv_client().put(key, value, options).await.map(drop) }
        })
        .await
    }

    async fn delete(&self, key: &str) -> anyhow::Result<()> {
        self.call(&format!("delete {key}"), |c| async move {
            c.kv_client().delete(key, None).await.map(drop)
        })
        .await
    }

    async fn get(&self, key: &str) -> anyhow::Result<Option<Kv>> {
        let mut r = self
            .call(&format!("get {key}"), |c| async move {
                c.kv_client()
                    .max_decoding_message_size(MAX_ANSWER)
                    .get(key, None)
                    .await
            })
            .await?;
        r.take_kvs().first().map(kv_of).transpose()
    }

    async fn cas_put(&self, key: &str, value: &[u8], expected: i64) -> anyhow::Result<bool> {
        use etcd_client::{Compare, CompareOp, Txn, TxnOp};
        let compare = if expected == 0 {
            Compare::create_revision(key, CompareOp::Equal, 0)
        } else {
            Compare::mod_revision(key, CompareOp::Equal, expected)
        };
        let txn = Txn::new()
            .when([compare])
            .and_then([TxnOp::put(key, value, None)]);
        let what = format!("compare-and-swap {key}");
        let (swapped, _) = self
            .attempt(&what, Resend::Unsent, |c| {
                let txn = txn.clone();
                async move { Ok(c.kv_client().txn(txn).await?.succeeded()) }
            })
            .await?;
        Ok(swapped)
    }

    async fn leases(&self) -> anyhow::Result<Vec<i64>> {
        let r = self
            .call(
                "list leases",
                |c| async move { c.lease_client().leases().await },
            )
            .await?;
        Ok(r.leases().iter().map(|l| l.id()).collect())
    }

    async fn range_prefix(&self, prefix: &str) -> anyhow::Result<(i64, Vec<Kv>)> {
        let end = prefix_end(prefix);
        let mut r = self
            .call(&format!("range {prefix}"), |c| {
                let options = etcd_client::GetOptions::new().with_range(end.clone());
                async move {
                    c.kv_client()
                        .max_decoding_message_size(MAX_ANSWER)
                        .get(prefix, Some(options))
                        .await
                }
            })
            .await?;
        let rev = r
            .header()
            .map(|h| h.revision())
            .with_context(|| format!("etcd range {prefix}: an answer without its revision"))?;
        let kvs = r
            .take_kvs()
            .iter()
            .map(kv_of)
            .collect::<anyhow::Result<_>>()?;
        Ok((rev, kvs))
    }

    async fn watch_prefix(&self, prefix: &str, start_revision: i64) -> anyhow::Result<Watch> {
        let options = etcd_client::WatchOptions::new()
            .with_range(prefix_end(prefix))
            .with_start_revision(start_revision);
        let what = format!("watch {prefix} from revision {start_revision}");
        let auth = self.auth;
        let (opened, url) = self
            .attempt(&what, Resend::Failed, |c| {
                let options = options.clone();
                async move {
                    match open_watch(&c, prefix, options.clone()).await? {
                        // etcd refuses a watch whose token it no longer knows (restarted,
                        // or expired) as it refuses a forbidden one: authenticate again
                        // and retry once.
                        Opened::Cancelled {
                            compacted_to: 0,
                            reason,
                        } if auth => {
                            tracing::debug!(
                                "etcd refused a watch ({reason}): authenticating again"
                            );
                            c.refresh_token().await?;
                            open_watch(&c, prefix, options).await
                        }
                        o => Ok(o),
                    }
                }
            })
            .await?;
        let context = format!("etcd {url}: {what}");
        let stream = match opened {
            Opened::Watching(s) => s,
            Opened::Cancelled {
                compacted_to,
                reason,
            } => return Err(cancelled(compacted_to, &reason).context(context)),
        };
        // The stream ends after its first error.
        let watch = futures::stream::unfold(Some(stream), move |state| {
            let context = context.clone();
            async move {
                let mut stream = state?;
                loop {
                    let failed = match stream.message().await {
                        Ok(Some(r)) => match events_of(&r) {
                            Ok(Some(events)) => return Some((Ok(events), Some(stream))),
                            Ok(None) => continue,
                            Err(e) => e,
                        },
                        Ok(None) => anyhow::anyhow!("the watch stream ended"),
                        Err(e) => anyhow::anyhow!(explain(&e)),
                    };
                    return Some((Err(failed.context(context)), None));
                }
            }
        });
        Ok(watch.boxed())
    }

    async fn compact(&self, revision: i64) -> anyhow::Result<()> {
        self.call(&format!("compact to revision {revision}"), |c| async move {
            c.kv_client().compact(revision, None).await.map(drop)
        })
        .await
    }
}
