//! Credentials as clients and operators send them: bearer tokens, stored token hashes and
//! token files never panic, and what parses prints back the same.
#![no_main]

use ctxpod_format::token::{parse_token, parse_token_file, TokenHash};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((id, secret)) = parse_token(data) {
        let again = format!("{id}.{}", hex_lower(&secret[..]));
        assert_eq!(again.as_bytes(), data);
    }
    if let Ok(s) = std::str::from_utf8(data) {
        if let Ok(h) = TokenHash::parse(s) {
            assert_eq!(TokenHash::parse(&h.to_string()), Ok(h));
        }
        let _ = parse_token_file(s);
    }
});

fn hex_lower(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
