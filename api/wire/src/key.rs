//! Block keys: opaque bytes, 1..=[`KEY_BYTES_MAX`](crate::KEY_BYTES_MAX), written as lowercase hex;
//! and how pages of a key listing from several members merge into one.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("key is empty")]
    Empty,
    #[error("key is {0} bytes, more than the limit of {max}", max = crate::KEY_BYTES_MAX)]
    TooLong(usize),
    #[error("key is not lowercase hex of whole bytes")]
    NotHex,
}

/// Parses a key from lowercase hex (uppercase is refused, so one key has one spelling).
pub fn parse_key_hex(s: &str) -> Result<Vec<u8>, KeyError> {
    if s.is_empty() {
        return Err(KeyError::Empty);
    }
    if !s.len().is_multiple_of(2) || !s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Err(KeyError::NotHex);
    }
    if s.len() / 2 > crate::KEY_BYTES_MAX {
        return Err(KeyError::TooLong(s.len() / 2));
    }
    hex::decode(s).map_err(|_| KeyError::NotHex)
}

/// Checks raw key bytes against the key limits.
pub fn check_key(key: &[u8]) -> Result<(), KeyError> {
    match key.len() {
        0 => Err(KeyError::Empty),
        n if n > crate::KEY_BYTES_MAX => Err(KeyError::TooLong(n)),
        _ => Ok(()),
    }
}

/// Lowercase hex of a key, as URLs and JSON carry it.
pub fn key_hex(key: &[u8]) -> String {
    hex::encode(key)
}

/// Displays a key as hex in logs without allocating at the call site.
pub struct KeyDisplay<'a>(pub &'a [u8]);

impl fmt::Display for KeyDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// Merges members' pages of one key listing (each sorted by key, each at most `limit`
/// entries, `true` when that member has more; an entry is a key and what goes with it)
/// into the pod's page: the first `limit` distinct keys in byte order (a key's first entry
/// kept), and whether the listing goes on after them. Any key among the pod's first `limit`
/// is among the first `limit` of every member that holds it, so the merge is exact.
#[allow(clippy::type_complexity)]
pub fn merge_pages<T>(
    pages: Vec<(Vec<(Vec<u8>, T)>, bool)>,
    limit: usize,
) -> (Vec<(Vec<u8>, T)>, bool) {
    let more = pages.iter().any(|(_, more)| *more);
    let mut all: Vec<(Vec<u8>, T)> = pages.into_iter().flat_map(|(e, _)| e).collect();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    all.dedup_by(|a, b| a.0 == b.0);
    let truncated = all.len() > limit;
    all.truncate(limit);
    (all, truncated || more)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_merge_in_order_each_key_once() {
        let k = |s: &str| (s.as_bytes().to_vec(), ());
        let a = (vec![k("a"), k("c"), k("e")], true);
        let b = (vec![k("b"), k("c"), k("d")], false);
        assert_eq!(
            merge_pages(vec![a.clone(), b.clone()], 3),
            (vec![k("a"), k("b"), k("c")], true)
        );
        // Everything fits, but one member has more: the listing goes on.
        assert_eq!(
            merge_pages(vec![a, b.clone()], 10),
            (vec![k("a"), k("b"), k("c"), k("d"), k("e")], true)
        );
        assert!(!merge_pages(vec![b.clone(), b], 3).1);
        assert_eq!(merge_pages::<()>(Vec::new(), 3), (Vec::new(), false));
    }

    #[test]
    fn parses_and_refuses() {
        assert_eq!(parse_key_hex("00ff"), Ok(vec![0, 255]));
        assert_eq!(parse_key_hex(""), Err(KeyError::Empty));
        assert_eq!(parse_key_hex("0"), Err(KeyError::NotHex));
        assert_eq!(parse_key_hex("00FF"), Err(KeyError::NotHex));
        assert_eq!(parse_key_hex("zz"), Err(KeyError::NotHex));
        assert_eq!(parse_key_hex(&"ab".repeat(128)).map(|k| k.len()), Ok(128));
        assert_eq!(
            parse_key_hex(&"ab".repeat(129)),
            Err(KeyError::TooLong(129))
        );
        assert_eq!(key_hex(&[1, 2, 0xab]), "0102ab");
        assert_eq!(KeyDisplay(&[0xde, 0xad]).to_string(), "dead");
    }
}
