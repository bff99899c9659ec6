//! Record headers as read back from the device: any bytes decode or fail cleanly, and what
//! decodes re-encodes to the same header. Each input is tried twice: as it is (almost always
//! stopped by the header CRC) and with a valid CRC written over bytes 252..256, so that the
//! field checks behind the CRC see arbitrary values too.
#![no_main]

use ctxpod_format::record::{RecordHeader, HEADER_BYTES};
use libfuzzer_sys::fuzz_target;

fn check(buf: &[u8]) {
    if let Ok(h) = RecordHeader::decode(buf) {
        let mut again = [0u8; HEADER_BYTES];
        h.encode(&mut again);
        assert_eq!(RecordHeader::decode(&again), Ok(h));
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    if data.len() >= HEADER_BYTES {
        let mut b = data[..HEADER_BYTES].to_vec();
        let crc = crc32c::crc32c(&b[..252]);
        b[252..256].copy_from_slice(&crc.to_le_bytes());
        check(&b);
    }
});
