//! Who is asking, and may they: bearer tokens and TLS client identities mapped to a tenant and
//! a role, the access each HTTP route and CXP1 op needs, and per-tenant limits (request rate,
//! bytes).
//!
//! Tokens are `<id>.<secret>`: the id (`[a-z0-9-]{1,32}`) names the entry, the secret is 32
//! random bytes in 64 hex digits. The node stores only `sha256:<salt>:<digest>` with
//! `digest = SHA-256(salt ‖ secret)` and compares digests in constant time. A plain salted
//! hash is enough because the secret has 256 bits of entropy (nothing to brute-force, unlike
//! a password); the salt keeps equal secrets from having equal hashes.
//!
//! Each tenant has its own space of namespace names ([`ctxpod_wire::namespace::scoped`]):
//! a tenant can only name its own namespaces, so it cannot reach, or learn of, another's.

use crate::metrics::NodeMetrics;
use aws_lc_rs::digest;
use ctxpod_format::config::{AuthConfig, ByteSize, Config, TenantConfig};
pub use ctxpod_wire::proto::Role;
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;
use zeroize::Zeroizing;

pub use ctxpod_format::token::{
    check_token_id, parse_token, parse_token_file, AuthError, TokenFile, TokenHash, SALT_BYTES,
    SECRET_BYTES,
};
/// Most token files read from a secret directory (and bytes per file).
const TOKEN_FILES_MAX: usize = 4096;
const TOKEN_FILE_BYTES_MAX: u64 = 4096;

/// What a request needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone (health and readiness probes).
    Public,
    /// Any authenticated role, the viewer included: what clients and the dashboard read of
    /// the pod (membership, the namespace list, the planner).
    Look,
    /// Any authenticated role but the viewer: reads of the caller's tenant.
    Read,
    /// `tenant-rw` or `admin`: writes of the caller's tenant.
    Write,
    /// `admin` or `viewer`: the operator's view across tenants (stats, metrics, curves).
    Monitor,
    /// `admin` only.
    Admin,
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The token id or certificate subject that authenticated it (for logs).
    pub id: Arc<str>,
    pub role: Role,
    /// The tenant whose namespaces it works in; `None`: the operator's own (unscoped)
    /// namespaces, which is also every caller's when authentication is off.
    pub tenant: Option<Arc<str>>,
    /// For a bearer token, a fingerprint of its stored hash (so that a token re-created
    /// under the same id is another credential); 0 otherwise. See
    /// [`Authenticator::still_valid`].
    pub credential: u64,
}

impl Principal {
    /// The caller when authentication is off: an admin of the unscoped namespaces.
    pub fn anonymous_admin() -> Principal {
        Principal {
            id: Arc::from("anonymous"),
            role: Role::Admin,
            tenant: None,
            credential: 0,
        }
    }

    pub fn may(&self, access: Access) -> bool {
        match access {
            Access::Public | Access::Look => true,
            Access::Read => self.role != Role::Viewer,
            Access::Write => matches!(self.role, Role::Admin | Role::TenantRw),
            Access::Monitor => matches!(self.role, Role::Admin | Role::Viewer),
            Access::Admin => self.role == Role::Admin,
        }
    }

    /// The node's name of the caller's namespace `ns`, after checking `ns` is a plain
    /// namespace name (no `/`, no dots first, ≤ 63 characters).
    pub fn scope(&self, ns: &str) -> Result<String, ctxpod_wire::namespace::NamespaceNameError> {
        ctxpod_wire::namespace::check_namespace_name(ns)?;
        Ok(ctxpod_wire::namespace::scoped(self.tenant.as_deref(), ns))
    }

    /// The caller's name for a node-side namespace name, or `None` if it is not the
    /// caller's. An admin or a viewer without a tenant sees every name as the node stores it.
    pub fn unscope<'a>(&self, stored: &'a str) -> Option<&'a str> {
        let (t, n) = ctxpod_wire::namespace::split_scoped(stored);
        match (&self.tenant, t) {
            (Some(mine), Some(t)) if **mine == *t => Some(n),
            (Some(_), _) => None,
            (None, _) if matches!(self.role, Role::Admin | Role::Viewer) => Some(stored),
            (None, None) => Some(n),
            (None, Some(_)) => None,
        }
    }
}

/// `SHA-256(salt ‖ secret)`.
fn hash_of(salt: [u8; SALT_BYTES], secret: &[u8]) -> TokenHash {
    let mut ctx = digest::Context::new(&digest::SHA256);
    ctx.update(&salt);
    ctx.update(secret);
    let mut d = [0u8; 32];
    d.copy_from_slice(ctx.finish().as_ref());
    TokenHash { salt, digest: d }
}

/// Whether `secret` hashes to `hash`, the digests compared in constant time.
pub fn verify(hash: &TokenHash, secret: &[u8]) -> bool {
    let other = hash_of(hash.salt, secret);
    aws_lc_rs::constant_time::verify_slices_are_equal(&hash.digest, &other.digest).is_ok()
}

/// A new token for `id`: the token to give the client, and the hash to configure.
pub fn new_token(id: &str) -> Result<(Zeroizing<String>, TokenHash), String> {
    use rand::RngCore;
    check_token_id(id)?;
    let mut secret = Zeroizing::new([0u8; SECRET_BYTES]);
    let mut salt = [0u8; SALT_BYTES];
    let mut rng = rand::rngs::OsRng;
    rng.fill_bytes(&mut secret[..]);
    rng.fill_bytes(&mut salt);
    let token = Zeroizing::new(format!("{id}.{}", hex::encode(&secret[..])));
    Ok((token, hash_of(salt, &secret[..])))
}

/// One configured credential: what it grants.
#[derive(Debug, Clone)]
struct Grant {
    role: Role,
    tenant: Option<Arc<str>>,
}

impl Grant {
    fn new(role: &str, tenant: Option<&str>, what: &str) -> Result<Grant, String> {
        let role = Role::parse(role).ok_or_else(|| {
            format!("{what}: role {role:?} is not admin, viewer, tenant-rw or tenant-ro")
        })?;
        match (role, tenant) {
            (Role::Admin, Some(_)) => {
                return Err(format!(
                    "{what}: an admin has no tenant (it acts in any with x-ctxpod-tenant)"
                ))
            }
            (Role::Viewer, Some(_)) => {
                return Err(format!(
                    "{what}: a viewer has no tenant (it sees every tenant's usage)"
                ))
            }
            (Role::TenantRw | Role::TenantRo, None) => {
                return Err(format!("{what}: a tenant role needs a tenant"))
            }
            (_, Some(t)) => {
                ctxpod_wire::namespace::check_tenant_name(t).map_err(|e| format!("{what}: {e}"))?
            }
            _ => {}
        }
        Ok(Grant {
            role,
            tenant: tenant.map(Arc::from),
        })
    }
}

#[derive(Debug)]
struct Tokens {
    by_id: HashMap<String, (TokenHash, Grant)>,
    /// The S3 secret access keys of the tokens that have one (`s3_secret`), by token id
    /// (the access key id).
    s3: HashMap<String, Zeroizing<String>>,
}

fn load_tokens(cfg: &AuthConfig) -> Result<Tokens, String> {
    let mut by_id = HashMap::new();
    let mut s3 = HashMap::new();
    for t in &cfg.tokens {
        check_token_id(&t.id)?;
        let what = format!("token {:?}", t.id);
        let grant = Grant::new(&t.role, t.tenant.as_deref(), &what)?;
        let hash = TokenHash::parse(&t.hash).map_err(|e| format!("{what}: {e}"))?;
        if by_id.insert(t.id.clone(), (hash, grant)).is_some() {
            return Err(format!("{what} is configured twice"));
        }
        if let Some(k) = &t.s3_secret {
            check_s3_secret(k).map_err(|e| format!("{what}: {e}"))?;
            s3.insert(t.id.clone(), Zeroizing::new(k.clone()));
        }
    }
    if let Some(dir) = &cfg.tokens_dir {
        for (id, f) in read_token_dir(dir)? {
            let what = format!("token file {}", dir.join(&id).display());
            let grant = Grant::new(&f.role, f.tenant.as_deref(), &what)?;
            let hash = TokenHash::parse(&f.hash).map_err(|e| format!("{what}: {e}"))?;
            if by_id.insert(id.clone(), (hash, grant)).is_some() {
                return Err(format!("token {id:?} is configured twice"));
            }
            if let Some(k) = &f.s3_secret {
                check_s3_secret(k).map_err(|e| format!("{what}: {e}"))?;
                s3.insert(id.clone(), Zeroizing::new(k.clone()));
            }
        }
    }
    Ok(Tokens { by_id, s3 })
}

/// An S3 secret access key as `ctxpod token create --s3` makes one: 40 characters of
/// `[A-Za-z0-9+/]` (AWS's own shape; 240 bits).
fn check_s3_secret(k: &str) -> Result<(), String> {
    let ok = k.len() == S3_SECRET_CHARS
        && k.bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'+' || c == b'/');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "s3_secret must be {S3_SECRET_CHARS} characters of [A-Za-z0-9+/]"
        ))
    }
}

/// Characters of an S3 secret access key.
pub const S3_SECRET_CHARS: usize = 40;

/// A new S3 secret access key (30 random bytes in base64: 40 characters).
pub fn new_s3_secret() -> Zeroizing<String> {
    use base64::Engine as _;
    let mut b = Zeroizing::new([0u8; 30]);
    aws_lc_rs::rand::fill(&mut b[..]).expect("the system's random source");
    Zeroizing::new(base64::engine::general_purpose::STANDARD.encode(&b[..]))
}

/// The token files of a directory the shape a Kubernetes Secret mounts: one file per token,
/// named by its id; names starting with `.` (the Secret's `..data` links) are skipped.
fn read_token_dir(dir: &Path) -> Result<Vec<(String, TokenFile)>, String> {
    let rd = std::fs::read_dir(dir).map_err(|e| format!("tokens_dir {}: {e}", dir.display()))?;
    let mut out = Vec::new();
    for e in rd {
        let e = e.map_err(|e| format!("tokens_dir {}: {e}", dir.display()))?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let path = e.path();
        if !path.is_file() {
            continue;
        }
        check_token_id(&name).map_err(|m| format!("{}: {m}", path.display()))?;
        if out.len() >= TOKEN_FILES_MAX {
            return Err(format!(
                "tokens_dir {}: more than {TOKEN_FILES_MAX} files",
                dir.display()
            ));
        }
        let len = e.metadata().map(|m| m.len()).unwrap_or(0);
        if len > TOKEN_FILE_BYTES_MAX {
            return Err(format!(
                "{}: over {TOKEN_FILE_BYTES_MAX} bytes",
                path.display()
            ));
        }
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let f = parse_token_file(&text).map_err(|m| format!("{}: {m}", path.display()))?;
        out.push((name, f));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// A token bucket: `rate` per second, up to `burst`.
#[derive(Debug)]
struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn new(rate: u32, burst: u32) -> Bucket {
        let burst = burst.max(1) as f64;
        Bucket {
            rate: rate as f64,
            burst,
            tokens: burst,
            at: Instant::now(),
        }
    }

    fn take(&mut self, now: Instant) -> bool {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = now;
        self.tokens = (self.tokens + dt * self.rate).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// A tenant's limits and their state.
#[derive(Debug)]
struct TenantLimits {
    quota_bytes: Option<u64>,
    namespaces_max: Option<u32>,
    rate: Option<Mutex<Bucket>>,
}

/// Why a tenant's request is refused before it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limited {
    /// The request rate is spent (429).
    Rate,
}

/// A token's stored hash as a non-zero number, to tell credentials apart.
fn fingerprint(h: &TokenHash) -> u64 {
    u64::from_le_bytes(h.digest[..8].try_into().expect("8 bytes")) | 1
}

/// How often live connections and streams check that their credential is still loaded.
pub const REVOCATION_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// The node's credentials and tenants. Reloadable (SIGHUP): the token list is swapped whole.
pub struct Authenticator {
    enabled: bool,
    cfg: AuthConfig,
    tokens: RwLock<Tokens>,
    identities: HashMap<String, Grant>,
    tenants: HashMap<String, TenantLimits>,
    /// Namespaces per tenant unless its entry says otherwise.
    namespaces_max_default: u32,
    metrics: Arc<NodeMetrics>,
}

impl Authenticator {
    pub fn new(cfg: &Config, metrics: Arc<NodeMetrics>) -> anyhow::Result<Authenticator> {
        let a = &cfg.auth;
        let tokens = load_tokens(a).map_err(anyhow::Error::msg)?;
        let mut identities = HashMap::new();
        for i in &a.identities {
            let what = format!("identity {:?}", i.subject);
            anyhow::ensure!(!i.subject.is_empty(), "an identity's subject is empty");
            let g = Grant::new(&i.role, i.tenant.as_deref(), &what).map_err(anyhow::Error::msg)?;
            anyhow::ensure!(
                identities.insert(i.subject.clone(), g).is_none(),
                "{what} is configured twice"
            );
        }
        let mut tenants = HashMap::new();
        for t in &cfg.tenants {
            ctxpod_wire::namespace::check_tenant_name(&t.name)
                .map_err(|e| anyhow::anyhow!("tenant {:?}: {e}", t.name))?;
            anyhow::ensure!(
                tenants.insert(t.name.clone(), limits_of(t)).is_none(),
                "tenant {:?} is configured twice",
                t.name
            );
        }
        let enabled = cfg.auth_configured();
        Ok(Authenticator {
            enabled,
            cfg: a.clone(),
            tokens: RwLock::new(tokens),
            identities,
            tenants,
            namespaces_max_default: cfg.tenant_namespaces_max,
            metrics,
        })
    }

    /// Whether callers must authenticate. Off, every caller is [`Principal::anonymous_admin`].
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Re-reads the configured tokens and the token directory; on error the old list stays.
    pub fn reload(&self) -> Result<usize, String> {
        let t = load_tokens(&self.cfg)?;
        let n = t.by_id.len();
        *self.tokens.write() = t;
        Ok(n)
    }

    fn refuse(&self, e: AuthError) -> AuthError {
        self.metrics
            .auth_failures
            .with_label_values(&[e.reason()])
            .inc();
        e
    }

    /// The caller a bearer token stands for.
    pub fn bearer(&self, token: &[u8]) -> Result<Principal, AuthError> {
        if !self.enabled {
            return Ok(Principal::anonymous_admin());
        }
        let (id, secret) = parse_token(token).map_err(|e| self.refuse(e))?;
        let tokens = self.tokens.read();
        match tokens.by_id.get(id) {
            Some((hash, grant)) if verify(hash, &secret[..]) => Ok(Principal {
                id: Arc::from(id),
                role: grant.role,
                tenant: grant.tenant.clone(),
                credential: fingerprint(hash),
            }),
            Some(_) => Err(self.refuse(AuthError::Wrong)),
            None => {
                // The same work as a known id, so timing does not tell which ids exist.
                let _ = hash_of([0; SALT_BYTES], &secret[..]);
                Err(self.refuse(AuthError::Wrong))
            }
        }
    }

    /// The S3 secret access key of access key id `id` (a token id), if that token has one.
    pub fn s3_secret(&self, id: &str) -> Option<Zeroizing<String>> {
        let t = self.tokens.read();
        let found = t.s3.get(id).cloned();
        if found.is_none() {
            drop(t);
            let _ = self.refuse(AuthError::Wrong);
        }
        found
    }

    /// The caller an S3 access key id stands for, once S3 verified its signature: the
    /// token's role and tenant.
    pub fn s3_principal(&self, id: &str) -> Option<Principal> {
        let t = self.tokens.read();
        t.s3.get(id)?;
        let (hash, grant) = t.by_id.get(id)?;
        Some(Principal {
            id: Arc::from(id),
            role: grant.role,
            tenant: grant.tenant.clone(),
            credential: fingerprint(hash),
        })
    }

    /// The caller a verified TLS client certificate's subject stands for.
    pub fn identity(&self, subject: &str) -> Result<Principal, AuthError> {
        match self.identities.get(subject) {
            Some(g) => Ok(Principal {
                id: Arc::from(subject),
                role: g.role,
                tenant: g.tenant.clone(),
                credential: 0,
            }),
            None => Err(self.refuse(AuthError::UnknownIdentity)),
        }
    }

    /// Whether `p`'s bearer token is still loaded, with the same hash, role and tenant: a
    /// live connection or stream of a token removed or changed at a reload ends. Callers
    /// that did not come by a token (no authentication, a client certificate) stay valid.
    pub fn still_valid(&self, p: &Principal) -> bool {
        if !self.enabled || p.credential == 0 {
            return true;
        }
        match self.tokens.read().by_id.get(&*p.id) {
            Some((hash, grant)) => {
                fingerprint(hash) == p.credential
                    && grant.role == p.role
                    && grant.tenant == p.tenant
            }
            None => false,
        }
    }

    /// How many namespaces `p`'s tenant may have; `None` for the operator's own space.
    pub fn namespaces_max(&self, p: &Principal) -> Option<usize> {
        let t = p.tenant.as_deref()?;
        let max = self
            .tenants
            .get(t)
            .and_then(|l| l.namespaces_max)
            .unwrap_or(self.namespaces_max_default);
        Some(max as usize)
    }

    /// Counts a tenant's request refused for its namespace count.
    pub fn count_namespace_limit(&self, p: &Principal) {
        if let Some(t) = p.tenant.as_deref() {
            self.metrics
                .quota_rejections
                .with_label_values(&[t, "namespaces"])
                .inc();
        }
    }

    /// Admits one request of `p` against its tenant's request rate.
    pub fn admit(&self, p: &Principal) -> Result<(), Limited> {
        let Some(t) = p.tenant.as_deref() else {
            return Ok(());
        };
        let Some(bucket) = self.tenants.get(t).and_then(|l| l.rate.as_ref()) else {
            return Ok(());
        };
        if bucket.lock().take(Instant::now()) {
            Ok(())
        } else {
            self.metrics
                .quota_rejections
                .with_label_values(&[t, "rate"])
                .inc();
            Err(Limited::Rate)
        }
    }

    /// Refuses a write of `bytes` that would take `p`'s tenant over its byte quota. Checked
    /// at admission: writes already in flight may overshoot it by their size.
    pub fn check_tenant_bytes(
        &self,
        engine: &ctxpod_engine::Engine,
        p: &Principal,
        bytes: u64,
    ) -> Result<(), String> {
        let Some(t) = p.tenant.as_deref() else {
            return Ok(());
        };
        let Some(q) = self.tenants.get(t).and_then(|l| l.quota_bytes) else {
            return Ok(());
        };
        if engine.used_bytes_under(&format!("{t}/")) + bytes > q {
            self.metrics
                .quota_rejections
                .with_label_values(&[t, "bytes"])
                .inc();
            return Err(format!("tenant {t} is at its quota of {q} bytes"));
        }
        Ok(())
    }
}

fn limits_of(t: &TenantConfig) -> TenantLimits {
    TenantLimits {
        quota_bytes: t.quota_bytes.map(|b: ByteSize| b.0),
        namespaces_max: t.namespaces_max,
        rate: t
            .requests_per_second
            .map(|r| Mutex::new(Bucket::new(r, t.burst.unwrap_or(r.max(1))))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_verify_only_their_secret() {
        let (tok, hash) = new_token("engine-a").expect("valid id");
        let (id, secret) = parse_token(tok.as_bytes()).expect("parses");
        assert_eq!(id, "engine-a");
        assert!(verify(&hash, &secret[..]));
        let again = TokenHash::parse(&hash.to_string()).expect("hash parses");
        assert_eq!(again, hash);
        let mut wrong = *secret;
        wrong[31] ^= 1;
        assert!(!verify(&hash, &wrong));
        // The same secret under another salt hashes differently.
        let (_, h2) = new_token("engine-a").expect("valid id");
        assert_ne!(h2.to_string(), hash.to_string());
    }

    #[test]
    fn principals_see_only_their_tenant() {
        let a = Principal {
            id: "a".into(),
            role: Role::TenantRo,
            tenant: Some("acme".into()),
            credential: 0,
        };
        assert_eq!(a.scope("default").as_deref(), Ok("acme/default"));
        assert!(a.scope("../x").is_err());
        assert!(a.scope("other/x").is_err());
        assert_eq!(a.unscope("acme/x"), Some("x"));
        assert_eq!(a.unscope("globex/x"), None);
        assert_eq!(a.unscope("x"), None);
        assert!(a.may(Access::Read) && !a.may(Access::Write) && !a.may(Access::Admin));
        let admin = Principal::anonymous_admin();
        assert_eq!(admin.unscope("acme/x"), Some("acme/x"));
        assert_eq!(admin.scope("x").as_deref(), Ok("x"));
        assert!(admin.may(Access::Admin));
    }

    #[test]
    fn buckets_refill_at_their_rate() {
        let t0 = Instant::now();
        let mut b = Bucket::new(10, 2);
        assert!(b.take(t0) && b.take(t0));
        assert!(!b.take(t0));
        assert!(b.take(t0 + std::time::Duration::from_millis(100)));
        assert!(!b.take(t0 + std::time::Duration::from_millis(100)));
    }
}
