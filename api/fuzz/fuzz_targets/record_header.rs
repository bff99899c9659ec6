//! Record headers as read back from the device: any 256 bytes decode or fail cleanly, and
//! what decodes re-encodes to the same bytes' meaning.
#![no_main]

use ctxpod_sansio::record::{RecordHeader, HEADER_BYTES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = RecordHeader::decode(data) {
        let mut buf = [0u8; HEADER_BYTES];
        h.encode(&mut buf);
        assert_eq!(RecordHeader::decode(&buf), Ok(h));
    }
});
