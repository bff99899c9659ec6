//! Cold compression (sans-IO): a block of a namespace with `compression` is compressed as
//! it moves to the dense tier, when that saves at least the node's `compression_min_saving`
//! of its record's device bytes, and decompressed on every read of that record.
//!
//! The compressed record ([`ctxpod_format::record`], flag bit 3) keeps the block's length,
//! CRC32C and sequence number (the index's entry changes only in place and record length)
//! and checks its data twice on a read: the stored bytes against their own CRC32C and the
//! AEAD tag before they are decompressed (a decompressor never sees bytes the node did not
//! write), the block's bytes against its CRC32C after. It is sealed anew, under the
//! namespace's current data key and a nonce of a sequence number taken for it.

use crate::crypto::{self, AeadKey};
use crate::device::AlignedBuf;
use ctxpod_format::record::{self, Codec, Compressed, RecordHeader, HEADER_BYTES, TAG_BYTES};
use ctxpod_wire::types::Compression;

/// Zstandard's level: the fastest of its standard levels. A move runs on the offload
/// engine's threads while the node serves; higher levels cost several times the CPU for a
/// few per cent on KV caches and weights (docs/PERFORMANCE.md, "Cold compression").
pub const ZSTD_LEVEL: i32 = 1;

/// The namespace setting as stored in an atomic: 0 off, else the codec's header byte.
pub fn setting_code(c: Option<Compression>) -> u8 {
    c.map_or(0, |c| codec_of(c) as u8)
}

/// [`setting_code`] back.
pub fn setting_of(code: u8) -> Option<Compression> {
    Codec::from_byte(code).map(|c| match c {
        Codec::Lz4 => Compression::Lz4,
        Codec::Zstd => Compression::Zstd,
    })
}

pub fn codec_of(c: Compression) -> Codec {
    match c {
        Compression::Lz4 => Codec::Lz4,
        Compression::Zstd => Codec::Zstd,
    }
}

/// `data` compressed with `codec`.
pub fn compress(codec: Codec, data: &[u8]) -> Vec<u8> {
    match codec {
        Codec::Lz4 => lz4_flex::block::compress(data),
        Codec::Zstd => zstd::bulk::compress(data, ZSTD_LEVEL)
            .expect("compressing a bounded buffer in memory does not fail"),
    }
}

/// `data`, compressed with `codec`, decompressed: exactly `len` bytes, or why not. Never
/// allocates more than `len` bytes whatever `data` holds.
pub fn decompress(codec: Codec, data: &[u8], len: usize) -> Result<Vec<u8>, String> {
    let out = match codec {
        Codec::Lz4 => lz4_flex::block::decompress(data, len).map_err(|e| e.to_string())?,
        Codec::Zstd => zstd::bulk::decompress(data, len).map_err(|e| e.to_string())?,
    };
    if out.len() != len {
        return Err(format!(
            "decompressed to {} bytes, the record says {len}",
            out.len()
        ));
    }
    Ok(out)
}

/// Whether a record of `stored` device bytes is worth writing instead of one of `record_len`:
/// smaller by at least `min_saving` of it, and by at least one 4 KiB page.
pub fn worth_it(record_len: usize, stored: usize, min_saving: f64) -> bool {
    stored < record_len && (record_len - stored) as f64 >= min_saving * record_len as f64
}

/// Bytes of a block a sample takes, in [`SAMPLE_SLICES`] slices spread over it.
pub const SAMPLE_BYTES: usize = 64 * 1024;
const SAMPLE_SLICES: usize = 4;

/// Whether a block of more than four samples' bytes is worth compressing whole: a sample
/// of it (four slices of 16 KiB at its quarters, so that a block whose second half is
/// zeros, a partly filled chunk, is seen as one) saves at least half `min_saving`. Random
/// bytes (or anything else that does not compress) cost one sample's compression, not the
/// whole block's.
pub fn sample_promises(codec: Codec, plain: &[u8], min_saving: f64) -> bool {
    if plain.len() <= SAMPLE_SLICES * SAMPLE_BYTES {
        return true;
    }
    let slice = SAMPLE_BYTES / SAMPLE_SLICES;
    let mut sample = Vec::with_capacity(SAMPLE_BYTES);
    for i in 0..SAMPLE_SLICES {
        let at = plain.len() / SAMPLE_SLICES * i;
        sample.extend_from_slice(&plain[at..at + slice]);
    }
    let out = compress(codec, &sample).len().min(SAMPLE_BYTES);
    (SAMPLE_BYTES - out) as f64 >= min_saving / 2.0 * SAMPLE_BYTES as f64
}

/// What to seal a compressed record with: its namespace, key, the data key generation and
/// key (`None` on a plaintext node), and the nonce's sequence number and salt.
pub struct SealWith<'a> {
    pub ns_id: u32,
    pub key: &'a [u8],
    pub key_id: u32,
    pub dek: Option<&'a AeadKey>,
    pub cseq: u64,
    pub salt: [u8; 4],
}

/// The compressed record of a block (or of an extent of a large value: `h` says) whose
/// plaintext `plain` (checked against `h`, the record it was read from) is `codec`-compressed, if that is [`worth_it`] against
/// `record_len` (the device bytes of the record it replaces): header, stored body sealed
/// under the compressed associated data, tag, zero padding. `None`: stored as it is.
pub fn compressed_record(
    h: &RecordHeader,
    plain: &[u8],
    codec: Codec,
    (record_len, min_saving): (usize, f64),
    s: &SealWith<'_>,
) -> Option<AlignedBuf> {
    debug_assert_eq!(plain.len(), h.len as usize);
    if !sample_promises(codec, plain, min_saving) {
        return None;
    }
    let stored = compress(codec, plain);
    let bytes = record::unsegmented_record_bytes(stored.len());
    // Shorter than any uncompressed record of the block's length, so that the index entry
    // alone tells a compressed record ([`crate::index::BlockLoc::is_compressed`]).
    if stored.len() >= plain.len()
        || bytes >= record::unsegmented_record_bytes(plain.len())
        || !worth_it(record_len, bytes, min_saving)
    {
        return None;
    }
    let n = stored.len();
    let mut buf = AlignedBuf::zeroed(bytes);
    buf[HEADER_BYTES..HEADER_BYTES + n].copy_from_slice(&stored);
    let stored_crc = crc32c::crc32c(&stored);
    let compressed = Compressed {
        codec,
        stored_len: n as u32,
        stored_crc,
    };
    let nonce = record::nonce_for(s.cseq, s.salt);
    let tag = match s.dek {
        Some(dek) => {
            let at = (s.ns_id, s.key_id, s.key);
            let aad = crypto::compressed_aad(at, codec, h.seq, (h.len, h.crc32c), h.extent);
            crypto::seal(dek, nonce, &aad, &mut buf[HEADER_BYTES..HEADER_BYTES + n])
        }
        None => [0; TAG_BYTES],
    };
    buf[HEADER_BYTES + n..HEADER_BYTES + n + TAG_BYTES].copy_from_slice(&tag);
    RecordHeader {
        ns_id: s.ns_id,
        key_id: s.key_id,
        len: h.len,
        crc32c: h.crc32c,
        seq: h.seq,
        nonce,
        region_epoch: 0,
        key: s.key.to_vec(),
        plaintext: s.dek.is_none(),
        extent: h.extent,
        segmented: None,
        compressed: Some(compressed),
    }
    .encode(&mut buf[..HEADER_BYTES]);
    Some(buf)
}

/// The stored body of compressed record `h` (`body`: opened, `stored_len` bytes) checked
/// against its CRC32C and decompressed: the block's plaintext (still to be checked
/// against the block's CRC32C), or why not.
pub fn open_stored(h: &RecordHeader, c: Compressed, body: &[u8]) -> Result<Vec<u8>, String> {
    if crc32c::crc32c(body) != c.stored_crc {
        return Err("compressed body CRC32C mismatch".into());
    }
    decompress(c.codec, body, h.len as usize)
        .map_err(|e| format!("{} decompression failed: {e}", c.codec.name()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compress_tests::bf16_normal;

    #[test]
    fn both_codecs_round_trip_and_refuse_what_they_did_not_write() {
        let data = bf16_normal(128 << 10, 7);
        for codec in [Codec::Lz4, Codec::Zstd] {
            let c = compress(codec, &data);
            assert_eq!(decompress(codec, &c, data.len()).as_deref(), Ok(&data[..]));
            // A length other than the one written, or damaged bytes, never pass as the
            // block.
            assert!(decompress(codec, &c, data.len() - 1).is_err(), "{codec:?}");
            assert!(decompress(codec, &c, data.len() + 1).is_err(), "{codec:?}");
            let mut bad = c.clone();
            bad.truncate(c.len() / 2);
            assert!(decompress(codec, &bad, data.len()).is_err(), "{codec:?}");
        }
        // Each codec's bytes are not the other's.
        let z = compress(Codec::Zstd, &data);
        assert!(decompress(Codec::Lz4, &z, data.len()).is_err());
    }

    #[test]
    fn a_sample_tells_random_bytes_from_a_kv_block_and_a_partly_filled_chunk() {
        let kv = bf16_normal(512 << 10, 3);
        let mut partial = bf16_normal(512 << 10, 4);
        partial[(1 << 20) * 2 / 5..].fill(0);
        let mut random = vec![0u8; 1 << 20];
        let mut rng = ctxpod_firmware_sim::rng::Rng::new(5);
        for b in &mut random {
            *b = rng.next_u64() as u8;
        }
        assert!(sample_promises(Codec::Zstd, &kv, 0.125));
        assert!(
            !sample_promises(Codec::Lz4, &kv, 0.125),
            "LZ4 finds nothing in bf16"
        );
        assert!(sample_promises(Codec::Lz4, &partial, 0.125));
        for codec in [Codec::Lz4, Codec::Zstd] {
            assert!(!sample_promises(codec, &random, 0.125), "{codec:?}");
            assert!(sample_promises(codec, &random, 0.0), "no saving asked");
            assert!(
                sample_promises(codec, &random[..SAMPLE_BYTES], 0.125),
                "small: whole"
            );
        }
    }

    #[test]
    fn worth_it_asks_for_the_fraction_and_a_page() {
        let mib = 1 << 20;
        assert!(worth_it(mib + 4096, mib / 2, 0.125));
        assert!(!worth_it(mib + 4096, mib, 0.125));
        assert!(worth_it(mib + 4096, mib, 0.0));
        assert!(!worth_it(4096, 4096, 0.0));
    }

    #[test]
    fn settings_round_trip() {
        for c in [None, Some(Compression::Lz4), Some(Compression::Zstd)] {
            assert_eq!(setting_of(setting_code(c)), c);
        }
    }
}
