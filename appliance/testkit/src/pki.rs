//! Certificates made on the spot (rcgen): a CA, a server certificate for 127.0.0.1 and
//! localhost, pod node certificates, client certificates (good, expired, signed by another
//! CA, without a common name), and a client TLS configuration that trusts a CA.

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use std::path::{Path, PathBuf};

/// A certificate authority made for one run: its certificate and key, in memory.
pub struct Ca {
    cert: Certificate,
    key: KeyPair,
    /// File name prefix of what it issues (from its name).
    tag: String,
}

/// A certificate and its key, as PEM files.
#[derive(Clone, Debug)]
pub struct Files {
    /// The certificate, PEM.
    pub cert: PathBuf,
    /// Its private key, PEM.
    pub key: PathBuf,
}

impl Files {
    /// The `[tls]` section of a node's configuration that serves this certificate.
    pub fn tls_lines(&self) -> String {
        format!(
            "[tls]\ncert_file = {:?}\nkey_file = {:?}\n",
            self.cert, self.key
        )
    }
}

impl Ca {
    /// A new self-signed CA whose common name is `name`.
    pub fn new(name: &str) -> Ca {
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("CA key");
        let cert = p.self_signed(&key).expect("CA certificate");
        let tag = name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        Ca { cert, key, tag }
    }

    /// The CA's certificate, PEM.
    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    /// Writes the CA's certificate to `path`; returns the path.
    pub fn write(&self, path: &Path) -> PathBuf {
        std::fs::write(path, self.pem()).expect("write CA");
        path.to_path_buf()
    }

    fn issue(&self, p: CertificateParams, dir: &Path, name: &str) -> Files {
        let key = KeyPair::generate().expect("key");
        let cert = p.signed_by(&key, &self.cert, &self.key).expect("sign");
        let f = Files {
            cert: dir.join(format!("{}.{name}.crt", self.tag)),
            key: dir.join(format!("{}.{name}.key", self.tag)),
        };
        std::fs::write(&f.cert, cert.pem()).expect("write cert");
        std::fs::write(&f.key, key.serialize_pem()).expect("write key");
        f
    }

    /// A server certificate for 127.0.0.1 and localhost, written under `dir`.
    pub fn server(&self, dir: &Path, name: &str) -> Files {
        let mut p = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
            .expect("params");
        p.distinguished_name.push(DnType::CommonName, name);
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(p, dir, name)
    }

    /// A pod node's certificate: a server certificate for 127.0.0.1 that also serves as
    /// the node's client certificate towards the other members (both key usages).
    pub fn node(&self, dir: &Path, name: &str) -> Files {
        self.node_at(dir, name, &[])
    }

    /// [`Ca::node`], valid for the addresses `more` too (a host of a test network).
    pub fn node_at(&self, dir: &Path, name: &str, more: &[&str]) -> Files {
        let mut names = vec!["127.0.0.1".to_string(), "localhost".to_string()];
        names.extend(more.iter().map(|m| m.to_string()));
        let mut p = CertificateParams::new(names).expect("params");
        p.distinguished_name.push(DnType::CommonName, name);
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        self.issue(p, dir, &format!("node-{name}"))
    }

    /// A client certificate whose subject common name is `cn`; `expired`: valid only in
    /// 2020.
    pub fn client(&self, dir: &Path, cn: &str, expired: bool) -> Files {
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
        p.distinguished_name.push(DnType::CommonName, cn);
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        if expired {
            p.not_before = rcgen::date_time_ymd(2020, 1, 1);
            p.not_after = rcgen::date_time_ymd(2020, 12, 31);
        }
        self.issue(
            p,
            dir,
            &format!("client-{cn}{}", if expired { "-expired" } else { "" }),
        )
    }

    /// A client certificate with no common name (subject `O=<org>` only): what etcd 3.4's
    /// gateway needs from a client while etcd auth is on.
    pub fn client_without_cn(&self, dir: &Path, org: &str) -> Files {
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(DnType::OrganizationName, org);
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(p, dir, &format!("client-o-{org}"))
    }
}

/// A client TLS configuration trusting `ca`, presenting `identity` if given.
pub fn client_tls(ca: &Ca, identity: Option<&Files>) -> std::sync::Arc<rustls::ClientConfig> {
    let id = identity.map(|f| {
        (
            std::fs::read(&f.cert).expect("read cert"),
            std::fs::read(&f.key).expect("read key"),
        )
    });
    let cfg = ctxpod_client::connect::tls_client_config(
        ca.pem().as_bytes(),
        id.as_ref().map(|(c, k)| (&c[..], &k[..])),
    )
    .expect("client TLS config");
    std::sync::Arc::new(cfg)
}
