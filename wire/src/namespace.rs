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

/// Longest tenant name, in characters.
pub const TENANT_NAME_CHARS_MAX: usize = 32;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tenant name must match [a-z0-9][a-z0-9-]{{0,31}}")]
pub struct TenantNameError;

pub fn check_tenant_name(name: &str) -> Result<(), TenantNameError> {
    let b = name.as_bytes();
    let first_ok = matches!(b.first(), Some(b'a'..=b'z' | b'0'..=b'9'));
    let rest_ok = b
        .iter()
        .all(|c| matches!(c, b'a'..=b'z' | b'0'..=b'9' | b'-'));
    if first_ok && rest_ok && b.len() <= TENANT_NAME_CHARS_MAX {
        Ok(())
    } else {
        Err(TenantNameError)
    }
}

/// The node's own name for namespace `ns` of `tenant`: `tenant/ns`. Each tenant has its own
/// space of names, so two tenants' `default` are two namespaces and neither can name the
/// other's. Names without a tenant (`None`) are the operator's space (and the whole node's
/// when authentication is off).
pub fn scoped(tenant: Option<&str>, ns: &str) -> String {
    match tenant {
        Some(t) => format!("{t}/{ns}"),
        None => ns.to_string(),
    }
}

/// Splits a node-side name into its tenant (if any) and the tenant's name for it.
pub fn split_scoped(name: &str) -> (Option<&str>, &str) {
    match name.split_once('/') {
        Some((t, n)) => (Some(t), n),
        None => (None, name),
    }
}

/// Checks a node-side name: a namespace name, optionally behind `tenant/`.
pub fn check_scoped_name(name: &str) -> Result<(), NamespaceNameError> {
    let (tenant, ns) = split_scoped(name);
    if let Some(t) = tenant {
        check_tenant_name(t).map_err(|_| NamespaceNameError)?;
    }
    check_namespace_name(ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_names_and_scoping() {
        assert!(check_tenant_name("acme-1").is_ok());
        assert!(check_tenant_name("").is_err());
        assert!(check_tenant_name("a.b").is_err());
        assert!(check_tenant_name("a/b").is_err());
        assert!(check_tenant_name(&"t".repeat(33)).is_err());
        assert_eq!(scoped(Some("acme"), "default"), "acme/default");
        assert_eq!(scoped(None, "default"), "default");
        assert_eq!(split_scoped("acme/x"), (Some("acme"), "x"));
        assert_eq!(split_scoped("x"), (None, "x"));
        assert!(check_scoped_name("acme/x").is_ok());
        assert!(check_scoped_name("x").is_ok());
        assert!(check_scoped_name("acme/x/y").is_err());
        assert!(check_scoped_name("a.b/x").is_err());
        assert!(check_scoped_name("/x").is_err());
        assert!(check_scoped_name("acme/").is_err());
    }

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
