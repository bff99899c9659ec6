//! `[auth]` (tokens, identities, tenants) and `[tls]`.

use super::*;

/// Credentials: bearer tokens (from this file or a directory of token files) and TLS client
/// identities, each granting a role in a tenant.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// On when any token, token directory or identity is configured; `false` turns it off
    /// (every caller is an admin), which the node allows only on loopback listeners unless
    /// `allow_unauthenticated` is set.
    pub enabled: Option<bool>,
    /// Serve without authentication on non-loopback listeners anyway.
    pub allow_unauthenticated: bool,
    pub tokens: Vec<TokenConfig>,
    /// A directory with one file per token (the file name is the token id; TOML with `role`,
    /// `tenant`, `hash`): the shape a Kubernetes Secret mounts. Re-read on SIGHUP.
    pub tokens_dir: Option<PathBuf>,
    /// TLS client certificate subjects (common name) and what they grant.
    pub identities: Vec<IdentityConfig>,
}

/// A bearer token: only its salted hash is configured (`ctxpod token create` makes both).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    pub id: String,
    /// `admin`, `tenant-rw` or `tenant-ro`.
    pub role: String,
    /// The tenant of a tenant role (an admin has none).
    #[serde(default)]
    pub tenant: Option<String>,
    /// `sha256:<salt hex>:<digest hex>`.
    pub hash: String,
    /// The token's S3 secret access key, when it may use the S3 door (`s3_listen`); its
    /// access key id is `id`.
    #[serde(default)]
    pub s3_secret: Option<String>,
}

/// A TLS client identity: the common name of a certificate the client CA signed.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct IdentityConfig {
    pub subject: String,
    pub role: String,
    #[serde(default)]
    pub tenant: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    pub name: String,
    /// Bytes the tenant's namespaces may hold together; writes beyond answer 403 `quota`.
    #[serde(default)]
    pub quota_bytes: Option<ByteSize>,
    /// Bytes of the tenant's blocks pinned or held by prefetch leases at once (default:
    /// `tenant_leased_bytes_max`); a pin beyond answers 403 `quota`, a prefetch beyond
    /// misses.
    #[serde(default)]
    pub leased_bytes_max: Option<ByteSize>,
    /// Requests per second (HTTP requests and CXP1 frames); beyond answer 429.
    #[serde(default)]
    pub requests_per_second: Option<u32>,
    /// Requests allowed at once above the rate (default: one second's worth).
    #[serde(default)]
    pub burst: Option<u32>,
    /// Namespaces the tenant may have (default: `tenant_namespaces_max`); creating one
    /// more answers 403 `namespace_limit`.
    #[serde(default)]
    pub namespaces_max: Option<u32>,
}

/// TLS for the HTTP and CXP1 listeners. Certificate, key and client CA are PEM files,
/// re-read on SIGHUP and when they change; live connections keep their session.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// CA of client certificates (mTLS). With it, clients must present a certificate it
    /// signed, unless `client_auth = "optional"`.
    pub client_ca_file: Option<PathBuf>,
    /// `required` (default with a client CA) or `optional` (a certificate is verified when
    /// presented; clients without one use bearer tokens).
    pub client_auth: Option<String>,
    /// Serve plain TCP on non-loopback addresses (by default only loopback may be plain).
    pub allow_plaintext: bool,
}

impl TlsConfig {
    pub fn enabled(&self) -> bool {
        self.cert_file.is_some() || self.key_file.is_some()
    }
}
