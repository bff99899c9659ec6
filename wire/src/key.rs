//! Block keys: opaque bytes, 1..=[`KEY_BYTES_MAX`](crate::KEY_BYTES_MAX), written as lowercase hex.

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

#[cfg(test)]
mod tests {
    use super::*;

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
