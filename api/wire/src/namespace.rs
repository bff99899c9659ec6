//! Namespace names: `[a-z0-9][a-z0-9._-]{0,62}`.

/// Longest namespace name, in characters.
pub const NAMESPACE_NAME_CHARS_MAX: usize = 63;

/// The namespace every node has from its first start.
pub const DEFAULT_NAMESPACE: &str = "default";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("namespace name must match [a-z0-9][a-z0-9._-]{{0,62}}")]
pub struct NamespaceNameError;

pub fn check_namespace_name(name: &str) -> Result<(), NamespaceNameError> {
    name_matches(name, b"._-", NAMESPACE_NAME_CHARS_MAX)
        .then_some(())
        .ok_or(NamespaceNameError)
}

/// Longest tenant name, in characters.
pub const TENANT_NAME_CHARS_MAX: usize = 32;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tenant name must match [a-z0-9][a-z0-9-]{{0,31}}")]
pub struct TenantNameError;

pub fn check_tenant_name(name: &str) -> Result<(), TenantNameError> {
    name_matches(name, b"-", TENANT_NAME_CHARS_MAX)
        .then_some(())
        .ok_or(TenantNameError)
}

/// Whether `name` is `[a-z0-9][a-z0-9<punct>]*`, at most `max` characters long.
fn name_matches(name: &str, punct: &[u8], max: usize) -> bool {
    let b = name.as_bytes();
    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    b.first().is_some_and(alnum)
        && b.iter().all(|c| alnum(c) || punct.contains(c))
        && b.len() <= max
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

    /// Each name with whether `check` takes it.
    fn table<E>(check: impl Fn(&str) -> Result<(), E>, cases: &[(&str, bool)]) {
        for (name, ok) in cases {
            assert_eq!(check(name).is_ok(), *ok, "{name:?}");
        }
    }

    #[test]
    fn tenant_names_and_scoping() {
        let long = "t".repeat(33);
        table(
            check_tenant_name,
            &[
                ("acme-1", true),
                ("", false),
                ("a.b", false),
                ("a/b", false),
                (&long, false),
            ],
        );
        assert_eq!(scoped(Some("acme"), "default"), "acme/default");
        assert_eq!(scoped(None, "default"), "default");
        assert_eq!(split_scoped("acme/x"), (Some("acme"), "x"));
        assert_eq!(split_scoped("x"), (None, "x"));
        table(
            check_scoped_name,
            &[
                ("acme/x", true),
                ("x", true),
                ("acme/x/y", false),
                ("a.b/x", false),
                ("/x", false),
                ("acme/", false),
            ],
        );
    }

    #[test]
    fn names() {
        let (longest, over) = ("a".repeat(63), "a".repeat(64));
        table(
            check_namespace_name,
            &[
                ("default", true),
                ("llama-70b.bf16_v2", true),
                ("", false),
                ("-x", false),
                ("Upper", false),
                ("a/b", false),
                (&longest, true),
                (&over, false),
            ],
        );
    }
}
