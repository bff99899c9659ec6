//! Fuzz target: the CXP1 frame decoder and the request and response body decoders, fed
//! arbitrary bytes in arbitrary pieces. Properties: no panic; buffering never exceeds one
//! frame over the limit; every frame that decodes re-encodes to the same bytes.

#![no_main]

use bytes::Bytes;
use ctxpod_wire::proto::{FrameDecoder, Request, Response};
use libfuzzer_sys::fuzz_target;

/// Small limit so that over-limit frames are reached often.
const MAX_FRAME: u32 = 1 << 16;

fuzz_target!(|data: &[u8]| {
    let Some((&split, wire)) = data.split_first() else {
        return;
    };
    let mut d = FrameDecoder::new(MAX_FRAME);
    // Two pieces, cut where the first byte says.
    let cut = (split as usize).min(wire.len());
    for piece in [&wire[..cut], &wire[cut..]] {
        d.push(piece);
        loop {
            match d.next_frame() {
                Ok(Some(f)) => {
                    assert!(f.body.len() + 12 <= MAX_FRAME as usize);
                    if let Ok(r) = Request::decode(&f) {
                        let again = r.encode(f.header.request_id);
                        let parts: Vec<u8> = r
                            .encode_parts(f.header.request_id)
                            .iter()
                            .flat_map(|p| p.to_vec())
                            .collect();
                        assert_eq!(again.to_vec(), parts);
                        assert_eq!(again.len(), 4 + 12 + f.body.len());
                        assert_eq!(Bytes::copy_from_slice(&again[16..]), f.body);
                    }
                    // Error messages are re-encoded lossily (UTF-8, 1 KiB cap): not compared.
                    if let Some(r) = Response::decode(&f).ok().filter(|r| !matches!(r, Response::Error(_))) {
                        let again = r.encode(f.header.op, f.header.status, f.header.request_id);
                        assert_eq!(again.len(), 4 + 12 + f.body.len());
                    }
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
        assert!(d.buffered() <= MAX_FRAME as usize + piece.len());
    }
});
