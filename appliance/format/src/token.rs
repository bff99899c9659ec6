//! Bearer tokens as the node parses them: `<id>.<secret>`, where the id (`[a-z0-9-]{1,32}`)
//! names the token and the secret is 32 random bytes in 64 hex digits; the stored hash
//! `sha256:<32 hex salt>:<64 hex digest>`; and token files (TOML with `role`, `tenant`,
//! `hash`). Hashing and comparing live with the node (`ctxpod_node::auth`).

use serde::Deserialize;
use zeroize::Zeroizing;

/// Bytes of a token's secret.
pub const SECRET_BYTES: usize = 32;
pub const SALT_BYTES: usize = 16;
/// Longest token id.
pub const TOKEN_ID_CHARS_MAX: usize = 32;

/// Why a credential was refused (the caller hears only "unauthorized").
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("no credentials")]
    Missing,
    #[error("malformed token")]
    Malformed,
    #[error("unknown or wrong token")]
    Wrong,
    #[error("unknown client certificate subject")]
    UnknownIdentity,
}

impl AuthError {
    pub fn reason(self) -> &'static str {
        match self {
            AuthError::Missing => "missing",
            AuthError::Malformed => "malformed",
            AuthError::Wrong => "wrong",
            AuthError::UnknownIdentity => "unknown_identity",
        }
    }
}

/// Splits a token into its id and secret.
pub fn parse_token(token: &[u8]) -> Result<(&str, Zeroizing<[u8; SECRET_BYTES]>), AuthError> {
    let s = std::str::from_utf8(token).map_err(|_| AuthError::Malformed)?;
    let (id, secret) = s.rsplit_once('.').ok_or(AuthError::Malformed)?;
    check_token_id(id).map_err(|_| AuthError::Malformed)?;
    // Exactly one spelling per token: lowercase hex (found by the `token` fuzz target,
    // which checks that a parsed token prints back to its input).
    if secret.len() != 2 * SECRET_BYTES
        || !secret
            .bytes()
            .all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
    {
        return Err(AuthError::Malformed);
    }
    let mut out = Zeroizing::new([0u8; SECRET_BYTES]);
    hex::decode_to_slice(secret, &mut out[..]).map_err(|_| AuthError::Malformed)?;
    Ok((id, out))
}

pub fn check_token_id(id: &str) -> Result<(), String> {
    let ok = !id.is_empty()
        && id.len() <= TOKEN_ID_CHARS_MAX
        && id
            .bytes()
            .all(|c| matches!(c, b'a'..=b'z' | b'0'..=b'9' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(format!("token id {id:?} must match [a-z0-9-]{{1,32}}"))
    }
}

/// A stored token hash: `digest = SHA-256(salt ‖ secret)`.
#[derive(Clone, PartialEq, Eq)]
pub struct TokenHash {
    pub salt: [u8; SALT_BYTES],
    pub digest: [u8; 32],
}

impl std::fmt::Debug for TokenHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenHash(..)")
    }
}

impl TokenHash {
    /// Parses `sha256:<32 hex salt>:<64 hex digest>`.
    pub fn parse(s: &str) -> Result<TokenHash, String> {
        let bad = || "token hash must be sha256:<32 hex digits>:<64 hex digits>".to_string();
        let mut it = s.trim().split(':');
        let (Some("sha256"), Some(salt), Some(dig), None) =
            (it.next(), it.next(), it.next(), it.next())
        else {
            return Err(bad());
        };
        let mut h = TokenHash {
            salt: [0; SALT_BYTES],
            digest: [0; 32],
        };
        hex::decode_to_slice(salt, &mut h.salt).map_err(|_| bad())?;
        hex::decode_to_slice(dig, &mut h.digest).map_err(|_| bad())?;
        Ok(h)
    }
}

impl std::fmt::Display for TokenHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sha256:{}:{}",
            hex::encode(self.salt),
            hex::encode(self.digest)
        )
    }
}

/// A token file in a token directory: the file's name is the token id.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenFile {
    pub role: String,
    #[serde(default)]
    pub tenant: Option<String>,
    pub hash: String,
    /// The token's S3 secret access key (its access key id is the token id), when it may
    /// use the S3 door. SigV4 needs the secret itself, so the file holds it (mode 0600).
    #[serde(default)]
    pub s3_secret: Option<String>,
}

/// Parses one token file.
pub fn parse_token_file(text: &str) -> Result<TokenFile, String> {
    toml::from_str(text).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_tokens_are_refused() {
        let good = format!("a.{}", "00".repeat(32));
        assert!(parse_token(good.as_bytes()).is_ok());
        for bad in [
            String::new(),
            "a".into(),
            format!("a.{}", "00".repeat(31)),
            format!("a.{}", "0g".repeat(32)),
            format!("A.{}", "00".repeat(32)),
            format!(".{}", "00".repeat(32)),
            format!("{}.{}", "a".repeat(33), "00".repeat(32)),
            format!("a b.{}", "00".repeat(32)),
            format!("a.{}0", "00".repeat(32)),
            format!("a.{}AB", "00".repeat(31)),
        ] {
            assert_eq!(
                parse_token(bad.as_bytes()).map(|_| ()),
                Err(AuthError::Malformed),
                "{bad:?}"
            );
        }
        assert!(parse_token(&[0xff, b'.', b'0']).is_err());
        for bad in ["", "sha256:00:00", "md5:{}:{}", "sha256:zz:zz:zz"] {
            assert!(TokenHash::parse(bad).is_err(), "{bad:?}");
        }
        let h = TokenHash {
            salt: [7; SALT_BYTES],
            digest: [9; 32],
        };
        assert_eq!(TokenHash::parse(&h.to_string()), Ok(h));
        assert!(parse_token_file("role = \"admin\"\nhash = \"x\"\n").is_ok());
        assert!(parse_token_file("role = \"admin\"\nhash = \"x\"\nextra = 1\n").is_err());
    }
}
