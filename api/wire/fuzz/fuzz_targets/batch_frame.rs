//! Fuzz target: the CXB1 batch frame decoder (`batch/get` and `batch/put` bodies of the
//! HTTP API), fed arbitrary bytes. Properties: no panic; every frame that decodes
//! re-encodes to a frame of the same length that decodes to the same entries (a CRC field
//! without its flag is ignored, so bytes may differ there).

#![no_main]

use ctxpod_wire::frame::{self, Entry};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(entries) = frame::decode(data) else {
        return;
    };
    let again: Vec<Entry<'_>> = entries
        .iter()
        .map(|e| Entry {
            key: e.key,
            status: e.status,
            crc32c: e.crc32c,
            len: e.len,
            data: e.data,
        })
        .collect();
    assert_eq!(frame::encoded_len(&again), data.len());
    let wire = frame::encode(&again);
    assert_eq!(wire.len(), data.len());
    assert_eq!(frame::decode(&wire).expect("re-encoded frame decodes"), entries);
});
