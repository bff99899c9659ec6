//! The node's configuration file: any text parses into a checked configuration or an
//! error, never a panic.
#![no_main]

use ctxpod_format::config::Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = Config::from_toml(s);
    }
});
