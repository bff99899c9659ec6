//! TLS (rustls, aws-lc-rs) for both listeners: certificate, key and optional client CA from
//! PEM files, reloaded on SIGHUP and when a file changes. A reload swaps the configuration
//! new handshakes use; live connections keep their session.
//!
//! With a client CA, client certificates are verified (chain to the CA, validity period)
//! during the handshake; a connection whose certificate is refused never reaches the API.
//! The verified certificate's subject common name is the client's identity (mapped to a
//! tenant and role by `auth.identities`).

use crate::conn::{BoxIo, PeerInfo};
use crate::metrics::NodeMetrics;
use anyhow::Context;
use ctxpod_format::config::TlsConfig;
use parking_lot::{Mutex, RwLock};
use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// Longest a TLS handshake may take before the connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the certificate files are checked for changes.
const WATCH_INTERVAL: Duration = Duration::from_secs(2);
/// Handshakes completed and waiting for the HTTP server to take them.
const ACCEPTED_QUEUE: usize = 256;

/// The provider every TLS configuration of the node uses.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// The node's TLS state: the current server configuration and where it came from.
pub struct Tls {
    cfg: TlsConfig,
    current: RwLock<Arc<ServerConfig>>,
    stamps: Mutex<Vec<Option<SystemTime>>>,
    metrics: Arc<NodeMetrics>,
}

fn read_file(path: &Path, what: &str) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("tls.{what} {}", path.display()))
}

fn certs(pem: &[u8], path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .with_context(|| format!("certificates in {}", path.display()))?;
    anyhow::ensure!(!certs.is_empty(), "no certificate in {}", path.display());
    Ok(certs)
}

fn build(cfg: &TlsConfig) -> anyhow::Result<ServerConfig> {
    let (Some(cert_path), Some(key_path)) = (&cfg.cert_file, &cfg.key_file) else {
        anyhow::bail!("tls.cert_file and tls.key_file are needed");
    };
    let chain = certs(&read_file(cert_path, "cert_file")?, cert_path)?;
    let key = PrivateKeyDer::from_pem_slice(&read_file(key_path, "key_file")?)
        .with_context(|| format!("private key in {}", key_path.display()))?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let builder = match &cfg.client_ca_file {
        Some(ca_path) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in certs(&read_file(ca_path, "client_ca_file")?, ca_path)? {
                roots
                    .add(c)
                    .with_context(|| format!("client CA in {}", ca_path.display()))?;
            }
            let v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider());
            let v = if cfg.client_auth.as_deref() == Some("optional") {
                v.allow_unauthenticated()
            } else {
                v
            };
            builder.with_client_cert_verifier(v.build().context("client certificate verifier")?)
        }
        None => builder.with_no_client_auth(),
    };
    let mut sc = builder
        .with_single_cert(chain, key)
        .context("the certificate and key do not go together")?;
    sc.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(sc)
}

fn files(cfg: &TlsConfig) -> Vec<PathBuf> {
    [&cfg.cert_file, &cfg.key_file, &cfg.client_ca_file]
        .into_iter()
        .flatten()
        .cloned()
        .collect()
}

fn stamps(cfg: &TlsConfig) -> Vec<Option<SystemTime>> {
    files(cfg)
        .iter()
        .map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .collect()
}

/// The common name of a DER certificate's subject.
pub fn subject_cn(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_string)
}

impl Tls {
    /// The node's TLS state, or `None` when TLS is not configured.
    pub fn load(cfg: &TlsConfig, metrics: Arc<NodeMetrics>) -> anyhow::Result<Option<Arc<Tls>>> {
        if !cfg.enabled() {
            return Ok(None);
        }
        let sc = build(cfg)?;
        Ok(Some(Arc::new(Tls {
            cfg: cfg.clone(),
            current: RwLock::new(Arc::new(sc)),
            stamps: Mutex::new(stamps(cfg)),
            metrics,
        })))
    }

    /// Re-reads the files; on error the current configuration stays.
    pub fn reload(&self) -> anyhow::Result<()> {
        let st = stamps(&self.cfg);
        let sc = build(&self.cfg)?;
        *self.current.write() = Arc::new(sc);
        *self.stamps.lock() = st;
        self.metrics.tls_reloads.inc();
        Ok(())
    }

    /// Reloads whenever a file's modification time changes (checked every 2 s).
    pub async fn watch(self: Arc<Self>) {
        loop {
            tokio::time::sleep(WATCH_INTERVAL).await;
            if stamps(&self.cfg) == *self.stamps.lock() {
                continue;
            }
            match self.reload() {
                Ok(()) => tracing::info!("TLS certificate files changed: reloaded"),
                Err(e) => {
                    // Keep serving with the old files; try again once they change again.
                    *self.stamps.lock() = stamps(&self.cfg);
                    tracing::error!(
                        "TLS files changed but do not load, keeping the old ones: {e:#}"
                    );
                }
            }
        }
    }

    /// Runs the handshake on an accepted connection (bounded by [`HANDSHAKE_TIMEOUT`]).
    pub async fn accept(
        &self,
        sock: TcpStream,
    ) -> std::io::Result<(TlsStream<TcpStream>, PeerInfo)> {
        let addr = sock.peer_addr()?;
        let acceptor = TlsAcceptor::from(self.current.read().clone());
        let r = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(sock)).await;
        let stream = match r {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                self.metrics.tls_handshake_failures.inc();
                return Err(e);
            }
            Err(_) => {
                self.metrics.tls_handshake_failures.inc();
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "TLS handshake timed out",
                ));
            }
        };
        let subject = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .and_then(|c| subject_cn(c.as_ref()))
            .map(Arc::from);
        let fd = std::os::fd::AsRawFd::as_raw_fd(stream.get_ref().0);
        Ok((stream, PeerInfo { addr, subject, fd }))
    }
}

/// Accepts HTTP connections on `listener` until the returned task is aborted: each is
/// admitted by `gate` (else closed at once), its TLS handshake, if any, runs concurrently
/// (a slow client never delays others) within `handshakes`, and finished ones are handed to
/// the server on the channel.
pub fn accept_loop(
    listener: TcpListener,
    tls: Option<Arc<Tls>>,
    gate: Arc<crate::conn::Gate>,
    handshakes: Arc<crate::conn::Handshakes>,
) -> (
    tokio::sync::mpsc::Receiver<(BoxIo, PeerInfo, crate::conn::Admitted)>,
    tokio::task::JoinHandle<()>,
) {
    let (tx, rx) =
        tokio::sync::mpsc::channel::<(BoxIo, PeerInfo, crate::conn::Admitted)>(ACCEPTED_QUEUE);
    let task = tokio::spawn(async move {
        loop {
            let (sock, addr, place) = gate.accept(&listener).await;
            let Some(tls) = &tls else {
                let peer = PeerInfo {
                    addr,
                    subject: None,
                    fd: std::os::fd::AsRawFd::as_raw_fd(&sock),
                };
                if tx.send((Box::new(sock), peer, place)).await.is_err() {
                    return;
                }
                continue;
            };
            let Some(permit) = handshakes.try_start() else {
                gate.count("handshakes");
                continue;
            };
            let (tls, tx) = (tls.clone(), tx.clone());
            tokio::spawn(async move {
                let r = tls.accept(sock).await;
                drop(permit);
                match r {
                    Ok((s, peer)) => {
                        let _ = tx.send((Box::new(s), peer, place)).await;
                    }
                    Err(e) => tracing::debug!("TLS handshake failed: {e}"),
                }
            });
        }
    });
    (rx, task)
}
