//! On-device record format (sans-IO). A record is
//!
//! ```text
//! [ header: 256 bytes | ciphertext: len bytes | GCM tag: 16 bytes | zero pad to 4 KiB ]
//! ```
//!
//! Header, little-endian:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `CXPR` |
//! | 4 | 2 | format version (1) |
//! | 6 | 1 | key length (1..=128) |
//! | 7 | 1 | flags: bit 0 = plaintext (a node formatted with `encrypt_at_rest = false`); bit 1 = extent of a large value |
//! | 8 | 4 | namespace id |
//! | 12 | 4 | data-key id (generation of the namespace's DEK) |
//! | 16 | 4 | plaintext length |
//! | 20 | 4 | plaintext CRC32C |
//! | 24 | 8 | write sequence number (unique per node, never reused) |
//! | 32 | 12 | AES-GCM nonce: sequence number (8) ‖ the writing incarnation's random salt (4) |
//! | 44 | 8 | region epoch: the `open_seq` of the region the record was written into |
//! | 52 | 8 | an extent's value sequence number (the value's generation), else zero |
//! | 60 | 4 | an extent's index within its value, else zero |
//! | 64 | 128 | key, zero padded |
//! | 192 | 60 | reserved, zero |
//! | 252 | 4 | CRC32C of bytes 0..252 |
//!
//! The header makes every record self-describing: the index is checked against it on every
//! read, and recovery re-indexes the open region's tail from it. The region epoch is stamped
//! by the writer when it places the record ([`stamp_region_epoch`]); it is not part of the
//! AEAD's associated data, so placing a record (or moving it at eviction) re-seals nothing.
//!
//! A plaintext record (flag bit 0) has the same layout: the body is stored as received and
//! the tag bytes are zero; its integrity rests on the header CRC and the body's CRC32C. A
//! node reads only records of the mode it was formatted with.
//!
//! A value larger than one record (`ctxpod_wire::BLOCK_BYTES_MAX`) is stored as a sequence of
//! **extent** records (flag bit 1), each with its own sequence number (so its own nonce), tag
//! and CRC32C, and all carrying the value's sequence number and their index in it, which the
//! AEAD binds too: an extent cannot be taken for another value's, another generation's, or
//! another place in the same value. An extent is never indexed on its own: the value becomes
//! visible when its manifest (the list of its extents) is written to the index.

use crate::IO_ALIGN_BYTES;

pub const RECORD_MAGIC: [u8; 4] = *b"CXPR";
pub const RECORD_VERSION: u16 = 1;
pub const HEADER_BYTES: usize = 256;
pub const TAG_BYTES: usize = 16;
pub const NONCE_BYTES: usize = 12;
/// Header flag: the body is not encrypted.
pub const FLAG_PLAINTEXT: u8 = 1;
/// Header flag: the record is one extent of a large value.
pub const FLAG_EXTENT: u8 = 2;

/// Which part of which value an extent record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtentOf {
    /// The value's sequence number: one per stored value (its generation).
    pub value_seq: u64,
    /// The extent's place in the value, from 0.
    pub index: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordHeader {
    pub ns_id: u32,
    pub key_id: u32,
    pub len: u32,
    pub crc32c: u32,
    pub seq: u64,
    pub nonce: [u8; NONCE_BYTES],
    /// `open_seq` of the region holding the record (0 until placed).
    pub region_epoch: u64,
    pub key: Vec<u8>,
    /// The body is stored unencrypted (flag bit 0).
    pub plaintext: bool,
    /// The record is an extent of a large value (flag bit 1).
    pub extent: Option<ExtentOf>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("no record magic")]
    BadMagic,
    #[error("unknown record version {0}")]
    BadVersion(u16),
    #[error("record header checksum mismatch")]
    BadHeaderCrc,
    #[error("record header fields out of range")]
    BadField,
}

/// Bytes a record of `len` plaintext bytes occupies on the device.
pub fn record_bytes(len: usize) -> usize {
    (HEADER_BYTES + len + TAG_BYTES).next_multiple_of(IO_ALIGN_BYTES)
}

/// The nonce of the record written with sequence number `seq` by a node incarnation whose
/// random salt is `salt`: the sequence number (bytes 0..8) is unique per node for its whole
/// life, and the salt (bytes 8..12), drawn afresh at every start, keeps two nodes started
/// from copies of one data directory (same keys, same sequence) from sealing under the same
/// (key, nonce) but with a chance of 2^-32 per pair of starts.
pub fn nonce_for(seq: u64, salt: [u8; 4]) -> [u8; NONCE_BYTES] {
    let mut n = [0u8; NONCE_BYTES];
    n[..8].copy_from_slice(&seq.to_le_bytes());
    n[8..].copy_from_slice(&salt);
    n
}

/// Whether `nonce` is one [`nonce_for`] gives for `seq` (with any salt). Records written
/// before the salt existed carry the constant `CXPN` there, which passes too.
pub fn nonce_matches(seq: u64, nonce: &[u8; NONCE_BYTES]) -> bool {
    nonce[..8] == seq.to_le_bytes()
}

/// Sets the region epoch of an encoded header in place (and its header CRC).
pub fn stamp_region_epoch(header: &mut [u8], epoch: u64) {
    header[44..52].copy_from_slice(&epoch.to_le_bytes());
    let crc = crc32c::crc32c(&header[..252]);
    header[252..256].copy_from_slice(&crc.to_le_bytes());
}

impl RecordHeader {
    pub fn encode(&self, out: &mut [u8]) {
        assert!(out.len() >= HEADER_BYTES && !self.key.is_empty() && self.key.len() <= 128);
        let h = &mut out[..HEADER_BYTES];
        h.fill(0);
        h[0..4].copy_from_slice(&RECORD_MAGIC);
        h[4..6].copy_from_slice(&RECORD_VERSION.to_le_bytes());
        h[6] = self.key.len() as u8;
        h[7] = if self.plaintext { FLAG_PLAINTEXT } else { 0 };
        if let Some(x) = self.extent {
            h[7] |= FLAG_EXTENT;
            h[52..60].copy_from_slice(&x.value_seq.to_le_bytes());
            h[60..64].copy_from_slice(&x.index.to_le_bytes());
        }
        h[8..12].copy_from_slice(&self.ns_id.to_le_bytes());
        h[12..16].copy_from_slice(&self.key_id.to_le_bytes());
        h[16..20].copy_from_slice(&self.len.to_le_bytes());
        h[20..24].copy_from_slice(&self.crc32c.to_le_bytes());
        h[24..32].copy_from_slice(&self.seq.to_le_bytes());
        h[32..44].copy_from_slice(&self.nonce);
        h[44..52].copy_from_slice(&self.region_epoch.to_le_bytes());
        h[64..64 + self.key.len()].copy_from_slice(&self.key);
        let crc = crc32c::crc32c(&h[..252]);
        h[252..256].copy_from_slice(&crc.to_le_bytes());
    }

    /// Decodes and checks a header; never panics on any input.
    pub fn decode(buf: &[u8]) -> Result<RecordHeader, RecordError> {
        let h = buf.get(..HEADER_BYTES).ok_or(RecordError::BadMagic)?;
        if h[0..4] != RECORD_MAGIC {
            return Err(RecordError::BadMagic);
        }
        let le32 = |o: usize| u32::from_le_bytes(h[o..o + 4].try_into().expect("4 bytes"));
        let stored = le32(252);
        if crc32c::crc32c(&h[..252]) != stored {
            return Err(RecordError::BadHeaderCrc);
        }
        let version = u16::from_le_bytes([h[4], h[5]]);
        if version != RECORD_VERSION {
            return Err(RecordError::BadVersion(version));
        }
        let key_len = h[6] as usize;
        let len = le32(16);
        if key_len == 0
            || key_len > 128
            || h[7] & !(FLAG_PLAINTEXT | FLAG_EXTENT) != 0
            || len as usize > ctxpod_wire::BLOCK_BYTES_MAX
        {
            return Err(RecordError::BadField);
        }
        Ok(RecordHeader {
            ns_id: le32(8),
            key_id: le32(12),
            len,
            crc32c: le32(20),
            seq: u64::from_le_bytes(h[24..32].try_into().expect("8 bytes")),
            nonce: h[32..44].try_into().expect("12 bytes"),
            region_epoch: u64::from_le_bytes(h[44..52].try_into().expect("8 bytes")),
            key: h[64..64 + key_len].to_vec(),
            plaintext: h[7] & FLAG_PLAINTEXT != 0,
            extent: (h[7] & FLAG_EXTENT != 0).then(|| ExtentOf {
                value_seq: u64::from_le_bytes(h[52..60].try_into().expect("8 bytes")),
                index: le32(60),
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> RecordHeader {
        RecordHeader {
            ns_id: 3,
            key_id: 1,
            len: 1000,
            crc32c: 0xdead_beef,
            seq: 77,
            nonce: nonce_for(77, *b"salt"),
            region_epoch: 0,
            key: vec![1, 2, 3],
            plaintext: false,
            extent: None,
        }
    }

    #[test]
    fn round_trip_and_any_flipped_bit_is_caught() {
        let mut buf = [0u8; HEADER_BYTES];
        sample().encode(&mut buf);
        assert_eq!(RecordHeader::decode(&buf), Ok(sample()));
        for byte in 0..HEADER_BYTES {
            for bit in 0..8 {
                let mut b = buf;
                b[byte] ^= 1 << bit;
                assert!(
                    RecordHeader::decode(&b).is_err(),
                    "flip {byte}.{bit} passed"
                );
            }
        }
    }

    #[test]
    fn an_extent_round_trips_and_its_place_is_covered_by_the_header_crc() {
        let mut buf = [0u8; HEADER_BYTES];
        let x = RecordHeader {
            extent: Some(ExtentOf {
                value_seq: 1 << 33,
                index: 7,
            }),
            ..sample()
        };
        x.encode(&mut buf);
        assert_eq!(buf[7], FLAG_EXTENT);
        assert_eq!(RecordHeader::decode(&buf), Ok(x.clone()));
        for byte in 52..64 {
            let mut b = buf;
            b[byte] ^= 1;
            assert_eq!(RecordHeader::decode(&b), Err(RecordError::BadHeaderCrc));
        }
        let plain = RecordHeader {
            plaintext: true,
            ..x
        };
        plain.encode(&mut buf);
        assert_eq!(buf[7], FLAG_EXTENT | FLAG_PLAINTEXT);
        assert_eq!(RecordHeader::decode(&buf), Ok(plain));
    }

    #[test]
    fn the_plaintext_flag_round_trips_and_other_flags_are_refused() {
        let mut buf = [0u8; HEADER_BYTES];
        let plain = RecordHeader {
            plaintext: true,
            ..sample()
        };
        plain.encode(&mut buf);
        assert_eq!(buf[7], FLAG_PLAINTEXT);
        assert_eq!(RecordHeader::decode(&buf), Ok(plain));
        for flags in 4..=255u8 {
            buf[7] = flags;
            let crc = crc32c::crc32c(&buf[..252]);
            buf[252..256].copy_from_slice(&crc.to_le_bytes());
            assert_eq!(
                RecordHeader::decode(&buf),
                Err(RecordError::BadField),
                "{flags}"
            );
        }
    }

    #[test]
    fn stamping_the_epoch_keeps_the_header_valid() {
        let mut buf = [0u8; HEADER_BYTES];
        sample().encode(&mut buf);
        stamp_region_epoch(&mut buf, 42);
        let h = RecordHeader::decode(&buf).expect("still valid");
        assert_eq!(h.region_epoch, 42);
        assert_eq!(
            RecordHeader {
                region_epoch: 0,
                ..h
            },
            sample()
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(record_bytes(1), 4096);
        assert_eq!(record_bytes(4096 - 272), 4096);
        assert_eq!(record_bytes(4096 - 271), 8192);
        assert_eq!(record_bytes(1 << 20), (1 << 20) + 4096);
        assert_ne!(nonce_for(1, [0; 4]), nonce_for(2, [0; 4]));
        assert_ne!(nonce_for(1, [0; 4]), nonce_for(1, [1, 0, 0, 0]));
        assert!(nonce_matches(9, &nonce_for(9, *b"abcd")));
        assert!(!nonce_matches(9, &nonce_for(10, *b"abcd")));
    }
}
