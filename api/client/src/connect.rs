//! How the clients reach a node: a bearer token and TLS (rustls with aws-lc-rs), shared by
//! the HTTP [`Client`](crate::client::Client) and the CXP1
//! [`TransferClient`](crate::transfer_client::TransferClient).

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::sync::Arc;

/// Credentials, transport security and deadlines of a connection. `Default`: plain TCP, no
/// token, [`Deadlines::default`].
#[derive(Clone)]
pub struct Connect {
    /// Bearer token (`<id>.<secret>`), sent as `Authorization: Bearer` over HTTP and in an
    /// `Auth` request over CXP1.
    pub token: Option<String>,
    /// TLS client configuration (trusted roots, and a client certificate for mTLS); `None`
    /// for plain TCP.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    pub deadlines: Deadlines,
    /// Connections per node for calls answered on the calling thread (the CXP1 client's
    /// direct calls); 0: every call takes the shared connection. Plain TCP only.
    pub direct_connections: usize,
}

impl Default for Connect {
    fn default() -> Self {
        Connect {
            token: None,
            tls: None,
            deadlines: Deadlines::default(),
            direct_connections: DIRECT_CONNECTIONS,
        }
    }
}

/// The default [`Connect::direct_connections`]: calls from this many threads at once are
/// answered on their own threads, more take the shared connection.
pub const DIRECT_CONNECTIONS: usize = 8;

/// How long a client waits on a node before it counts as unreachable for that call: a
/// node that accepts connections and never answers (frozen, overloaded, a black-holed
/// route) costs a caller one deadline, never a hang. A pod client then skips the member for
/// `down_for` (it is asked last, not first) and asks it again afterwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadlines {
    /// Opening a connection: TCP, TLS and, on CXP1, the hello and `Auth`.
    pub connect: std::time::Duration,
    /// One request's whole answer (over HTTP its body included; over CXP1 one frame).
    pub request: std::time::Duration,
    /// How long a member that missed a deadline (or refused a connection) is asked last.
    pub down_for: std::time::Duration,
}

/// The default connect deadline: a node on the pod network answers a TCP and TLS handshake
/// in milliseconds.
pub const CONNECT_DEADLINE: std::time::Duration = std::time::Duration::from_secs(2);
/// The default request deadline: a largest answer (a 64 MiB frame) takes well under a
/// second at the network speeds a pod runs on.
pub const REQUEST_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);
/// The default time a member that missed a deadline is asked last.
pub const DOWN_FOR: std::time::Duration = std::time::Duration::from_secs(10);

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines {
            connect: CONNECT_DEADLINE,
            request: REQUEST_DEADLINE,
            down_for: DOWN_FOR,
        }
    }
}

impl Deadlines {
    /// Refuses a zero deadline (it would fail every call) and one over an hour.
    pub fn check(&self) -> Result<(), String> {
        let hour = std::time::Duration::from_secs(3600);
        for (name, d) in [
            ("connect", self.connect),
            ("request", self.request),
            ("down_for", self.down_for),
        ] {
            if d.is_zero() || d > hour {
                return Err(format!(
                    "the {name} deadline must be above 0 and at most an hour; got {d:?}"
                ));
            }
        }
        Ok(())
    }
}

impl std::fmt::Debug for Connect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connect")
            .field("token", &self.token.as_ref().map(|_| "…"))
            .field("tls", &self.tls.is_some())
            .field("deadlines", &self.deadlines)
            .field("direct_connections", &self.direct_connections)
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("{0}: {1}")]
    Pem(String, String),
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
}

fn pem_certs(pem: &[u8], what: &str) -> Result<Vec<CertificateDer<'static>>, TlsSetupError> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsSetupError::Pem(what.into(), e.to_string()))?;
    if certs.is_empty() {
        return Err(TlsSetupError::Pem(what.into(), "no certificate".into()));
    }
    Ok(certs)
}

/// A TLS client configuration trusting the CA certificates in `ca_pem`, presenting the
/// certificate chain and key in `identity` (PEM) when given (mTLS).
pub fn tls_client_config(
    ca_pem: &[u8],
    identity: Option<(&[u8], &[u8])>,
) -> Result<rustls::ClientConfig, TlsSetupError> {
    let mut roots = rustls::RootCertStore::empty();
    for c in pem_certs(ca_pem, "CA certificates")? {
        roots.add(c)?;
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    Ok(match identity {
        Some((chain, key)) => {
            let chain = pem_certs(chain, "client certificate")?;
            let key = PrivateKeyDer::from_pem_slice(key)
                .map_err(|e| TlsSetupError::Pem("client key".into(), e.to_string()))?;
            builder.with_client_auth_cert(chain, key)?
        }
        None => builder.with_no_client_auth(),
    })
}

/// A TLS client configuration that trusts no server (for clients given no CA).
pub fn untrusting_tls_config() -> rustls::ClientConfig {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("aws-lc-rs supports the default protocol versions")
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth()
}

impl Connect {
    /// From files: a CA bundle (TLS), a client certificate and key (mTLS), a token.
    pub fn from_files(
        token: Option<String>,
        ca_file: Option<&std::path::Path>,
        client_cert_and_key: Option<(&std::path::Path, &std::path::Path)>,
    ) -> Result<Connect, TlsSetupError> {
        let read = |p: &std::path::Path| {
            std::fs::read(p).map_err(|e| TlsSetupError::Pem(p.display().to_string(), e.to_string()))
        };
        let tls = match ca_file {
            Some(ca) => {
                let ca = read(ca)?;
                let id = match client_cert_and_key {
                    Some((c, k)) => Some((read(c)?, read(k)?)),
                    None => None,
                };
                let id_ref = id.as_ref().map(|(c, k)| (&c[..], &k[..]));
                Some(Arc::new(tls_client_config(&ca, id_ref)?))
            }
            None => None,
        };
        Ok(Connect {
            token,
            tls,
            ..Connect::default()
        })
    }
}
