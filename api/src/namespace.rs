//! Namespace names: `[a-z0-9][a-z0-9._-]{0,62}`.

/// Longest namespace name, in characters.
pub const NAMESPACE_NAME_CHARS_MAX: usize = 63;

/// The namespace every node has from its first start.
pub const DEFAULT_NAMESPACE: &str = "default";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("namespace name must match [a-z0-9][a-z0-9._-]{{0,62}}")]
pub struct NamespaceNameError;

pub fn check_namespace_name(name: &str) -> Result<(), NamespaceNameError> {
    let b = name.as_bytes();
    let first_ok = matches!(b.first(), Some(b'a'..=b'z' | b'0'..=b'9'));
    let rest_ok = b
        .iter()
        .all(|c| matches!(c, b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-'));
    if first_ok && rest_ok && b.len() <= NAMESPACE_NAME_CHARS_MAX {
        Ok(())
    } else {
        Err(NamespaceNameError)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(check_namespace_name("default").is_ok());
        assert!(check_namespace_name("llama-70b.bf16_v2").is_ok());
        assert!(check_namespace_name("").is_err());
        assert!(check_namespace_name("-x").is_err());
        assert!(check_namespace_name("Upper").is_err());
        assert!(check_namespace_name("a/b").is_err());
        assert!(check_namespace_name(&"a".repeat(63)).is_ok());
        assert!(check_namespace_name(&"a".repeat(64)).is_err());
    }
}
