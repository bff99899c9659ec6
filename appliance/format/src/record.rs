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
//! | 7 | 1 | flags: bit 0 = plaintext (a node formatted with `encrypt_at_rest = false`); bit 1 = extent of a large value; bit 2 = segmented; bit 3 = compressed |
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
//! | 192 | 4 | a segmented record's segment size (flag bit 2), else zero |
//! | 196 | 4 | a segmented record's CRC32C of its segment table, else zero |
//! | 200 | 1 | a compressed record's codec (1 = lz4, 2 = zstd; flag bit 3), else zero |
//! | 201 | 3 | reserved, zero |
//! | 204 | 4 | a compressed record's stored body length (the compressed bytes), else zero |
//! | 208 | 4 | a compressed record's CRC32C of its stored (compressed) body, else zero |
//! | 212 | 40 | reserved, zero |
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
//!
//! A record of more than [`SEGMENT_BYTES`] is **segmented** (flag bit 2), so that a read of
//! part of it reads and checks only the segments that hold that part:
//!
//! ```text
//! [ header: 256 bytes | segment table: n × 20 bytes | zero pad to 4 KiB | ciphertext: len bytes | zero pad to 4 KiB ]
//! ```
//!
//! Segment `i` is bytes `i × S .. min((i + 1) × S, len)` of the body (`S` the header's
//! segment size, [`SEGMENT_BYTES`], so every segment starts 4 KiB-aligned on the device),
//! sealed on its own under nonce [`nonce_for`]`(seq + i, salt)` (a segmented record takes
//! `n` consecutive sequence numbers: [`seqs_for`]) with associated data that binds the
//! record's length and the segment's index. Its table entry is its GCM tag (16 bytes) and
//! its plaintext's CRC32C (4); the header holds the CRC32C of the whole table and, as for
//! any record, the whole body's CRC32C. A record of at most one segment keeps the layout
//! above, byte for byte, and records written before segments existed (unsegmented at any
//! length) read as they always did.
//!
//! A **compressed** record (flag bit 3; written when a block of a namespace with
//! `compression` is demoted to the dense tier) keeps the unsegmented layout around its
//! stored body: `[ header | stored body: stored_len bytes | GCM tag | zero pad to 4 KiB ]`.
//! Its header's length and CRC32C stay the block's own (the plaintext a read gives back, as
//! the index holds them); bytes 200..212 say how the body is stored: the codec, the
//! compressed length (less than the block's) and the compressed bytes' CRC32C. So a read
//! checks the data twice: the compressed bytes against their CRC32C (and the AEAD tag)
//! before they are decompressed, the block's bytes against theirs after. A compressed
//! record is sealed when it is compressed, under a nonce of its own: `nonce_for(cseq,
//! salt)`, `cseq` a sequence number taken then (so greater than the record's `seq`, which it
//! keeps: the block's identity in the index), with associated data that binds the codec and
//! the block's length and CRC32C (the engine's `crypto::compressed_aad`), and for an extent
//! of a large value (flag bit 1 too) the value's generation and the extent's index. It is
//! never segmented.

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
/// Header flag: the body is sealed and checksummed in segments ([`SEGMENT_BYTES`] each).
pub const FLAG_SEGMENTED: u8 = 4;
/// Header flag: the body is stored compressed (bytes 200..212 say how).
pub const FLAG_COMPRESSED: u8 = 8;
/// The integrity unit of a new record's body: records longer than this are segmented.
pub const SEGMENT_BYTES: usize = 64 * 1024;
/// A segment's entry in its record's table: GCM tag (16) ‖ plaintext CRC32C (4).
pub const SEGMENT_ENTRY_BYTES: usize = TAG_BYTES + 4;
/// Where a segmented record's body begins: its header and segment table, padded.
pub const SEGMENTED_HEAD_BYTES: usize = IO_ALIGN_BYTES;
/// Most segments a record's table holds.
pub const SEGMENTS_MAX: usize = (SEGMENTED_HEAD_BYTES - HEADER_BYTES) / SEGMENT_ENTRY_BYTES;

/// How a segmented record is cut (flag bit 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segmented {
    /// Bytes per segment (the last may be shorter): [`SEGMENT_BYTES`], the only size this
    /// version writes or reads.
    pub segment_bytes: u32,
    /// CRC32C of the segment table (`n` entries of [`SEGMENT_ENTRY_BYTES`] at offset 256).
    pub table_crc: u32,
}

/// How a compressed record's body is stored (flag bit 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compressed {
    pub codec: Codec,
    /// Bytes of the stored (compressed) body: less than the record's `len`.
    pub stored_len: u32,
    /// CRC32C of the stored body (after compression, before sealing).
    pub stored_crc: u32,
}

/// A compressed record's codec (header byte 200).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Codec {
    /// LZ4 block format (no frame), the decompressed length known from the header.
    Lz4 = 1,
    /// A Zstandard frame.
    Zstd = 2,
}

impl Codec {
    pub fn from_byte(b: u8) -> Option<Codec> {
        match b {
            1 => Some(Codec::Lz4),
            2 => Some(Codec::Zstd),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Codec::Lz4 => "lz4",
            Codec::Zstd => "zstd",
        }
    }
}

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
    /// The body is sealed in segments (flag bit 2).
    pub segmented: Option<Segmented>,
    /// The body is stored compressed (flag bit 3).
    pub compressed: Option<Compressed>,
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

/// Whether a new record of `len` plaintext bytes is segmented.
pub fn is_segmented(len: usize) -> bool {
    len > SEGMENT_BYTES
}

/// Bytes a new record of `len` plaintext bytes occupies on the device.
pub fn record_bytes(len: usize) -> usize {
    if is_segmented(len) {
        (SEGMENTED_HEAD_BYTES + len).next_multiple_of(IO_ALIGN_BYTES)
    } else {
        unsegmented_record_bytes(len)
    }
}

/// Bytes an unsegmented record of `len` plaintext bytes occupies (every record written
/// before segments existed is one).
pub fn unsegmented_record_bytes(len: usize) -> usize {
    (HEADER_BYTES + len + TAG_BYTES).next_multiple_of(IO_ALIGN_BYTES)
}

/// Where the body of a new record of `len` plaintext bytes begins in it.
pub fn body_offset(len: usize) -> usize {
    if is_segmented(len) {
        SEGMENTED_HEAD_BYTES
    } else {
        HEADER_BYTES
    }
}

/// Segments of a new record of `len` plaintext bytes (1: unsegmented).
pub fn segments_for(len: usize) -> usize {
    if is_segmented(len) {
        len.div_ceil(SEGMENT_BYTES)
    } else {
        1
    }
}

/// Sequence numbers a new record of `len` plaintext bytes takes: one nonce per segment.
pub fn seqs_for(len: usize) -> u64 {
    segments_for(len) as u64
}

/// A segment table's entry `i`: its GCM tag and its plaintext's CRC32C.
pub fn table_entry(table: &[u8], i: usize) -> ([u8; TAG_BYTES], u32) {
    let e = &table[i * SEGMENT_ENTRY_BYTES..(i + 1) * SEGMENT_ENTRY_BYTES];
    let tag = e[..TAG_BYTES].try_into().expect("16 bytes");
    let crc = u32::from_le_bytes(e[TAG_BYTES..].try_into().expect("4 bytes"));
    (tag, crc)
}

/// Writes a segment table's entry `i`.
pub fn set_table_entry(table: &mut [u8], i: usize, tag: &[u8; TAG_BYTES], crc: u32) {
    let e = &mut table[i * SEGMENT_ENTRY_BYTES..(i + 1) * SEGMENT_ENTRY_BYTES];
    e[..TAG_BYTES].copy_from_slice(tag);
    e[TAG_BYTES..].copy_from_slice(&crc.to_le_bytes());
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

/// The nonce of segment `i` of a segmented record sealed under `nonce` (its first): the
/// record's sequence number plus `i`, under the same salt.
pub fn segment_nonce(nonce: &[u8; NONCE_BYTES], i: usize) -> [u8; NONCE_BYTES] {
    let seq = u64::from_le_bytes(nonce[..8].try_into().expect("8 bytes"));
    let mut n = *nonce;
    n[..8].copy_from_slice(&seq.wrapping_add(i as u64).to_le_bytes());
    n
}

/// The sequence number a nonce was made from ([`nonce_for`]).
pub fn nonce_seq(nonce: &[u8; NONCE_BYTES]) -> u64 {
    u64::from_le_bytes(nonce[..8].try_into().expect("8 bytes"))
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
        if let Some(s) = self.segmented {
            h[7] |= FLAG_SEGMENTED;
            h[192..196].copy_from_slice(&s.segment_bytes.to_le_bytes());
            h[196..200].copy_from_slice(&s.table_crc.to_le_bytes());
        }
        if let Some(c) = self.compressed {
            h[7] |= FLAG_COMPRESSED;
            h[200] = c.codec as u8;
            h[204..208].copy_from_slice(&c.stored_len.to_le_bytes());
            h[208..212].copy_from_slice(&c.stored_crc.to_le_bytes());
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
            || h[7] & !(FLAG_PLAINTEXT | FLAG_EXTENT | FLAG_SEGMENTED | FLAG_COMPRESSED) != 0
            || len as usize > ctxpod_wire::BLOCK_BYTES_MAX
        {
            return Err(RecordError::BadField);
        }
        let segmented = if h[7] & FLAG_SEGMENTED != 0 {
            // The segment size is in the header so that a record describes itself; the read
            // path plans and checks segments of [`SEGMENT_BYTES`], the only size written, so
            // any other is refused here (a header rewritten with another, its CRC recomputed,
            // must fail its checks, not steer a read past its buffer).
            let s = le32(192);
            let n = (len as usize).div_ceil(s.max(1) as usize);
            if s as usize != SEGMENT_BYTES || !(2..=SEGMENTS_MAX).contains(&n) {
                return Err(RecordError::BadField);
            }
            Some(Segmented {
                segment_bytes: s,
                table_crc: le32(196),
            })
        } else {
            if le32(192) != 0 || le32(196) != 0 {
                return Err(RecordError::BadField);
            }
            None
        };
        let compressed = if h[7] & FLAG_COMPRESSED != 0 {
            // Compressed: a block or an extent (never segmented) whose record is shorter
            // than any uncompressed record of its length (so the index's record length
            // alone says it is compressed), under a nonce taken after its own sequence
            // number.
            let stored_len = le32(204);
            let nonce: [u8; NONCE_BYTES] = h[32..44].try_into().expect("12 bytes");
            let seq = u64::from_le_bytes(h[24..32].try_into().expect("8 bytes"));
            match Codec::from_byte(h[200]) {
                Some(codec)
                    if segmented.is_none()
                        && h[201..204] == [0; 3]
                        && stored_len > 0
                        && unsegmented_record_bytes(stored_len as usize)
                            < unsegmented_record_bytes(len as usize)
                        && nonce_seq(&nonce) > seq =>
                {
                    Some(Compressed {
                        codec,
                        stored_len,
                        stored_crc: le32(208),
                    })
                }
                _ => return Err(RecordError::BadField),
            }
        } else {
            if h[200..212] != [0; 12] {
                return Err(RecordError::BadField);
            }
            None
        };
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
            segmented,
            compressed,
        })
    }

    /// Whether the nonce is the one this record must be sealed under: [`nonce_for`] its
    /// sequence number, or for a compressed record one taken after it (checked when
    /// decoded).
    pub fn nonce_ok(&self) -> bool {
        self.compressed.is_some() || nonce_matches(self.seq, &self.nonce)
    }

    /// Bytes of the body as stored: the compressed length, or the plaintext's.
    pub fn stored_len(&self) -> usize {
        match self.compressed {
            Some(c) => c.stored_len as usize,
            None => self.len as usize,
        }
    }

    /// Segments of the body (1: unsegmented).
    pub fn segments(&self) -> usize {
        match self.segmented {
            Some(s) => (self.len as usize).div_ceil(s.segment_bytes as usize),
            None => 1,
        }
    }

    /// The plaintext bytes segment `i` covers.
    pub fn segment_range(&self, i: usize) -> std::ops::Range<usize> {
        let len = self.len as usize;
        match self.segmented {
            Some(s) => {
                let s = s.segment_bytes as usize;
                (i * s).min(len)..((i + 1) * s).min(len)
            }
            None => 0..len,
        }
    }

    /// Where the body begins in the record.
    pub fn body_offset(&self) -> usize {
        if self.segmented.is_some() {
            SEGMENTED_HEAD_BYTES
        } else {
            HEADER_BYTES
        }
    }

    /// Bytes the record occupies on the device.
    pub fn record_bytes(&self) -> usize {
        if let Some(c) = self.compressed {
            return unsegmented_record_bytes(c.stored_len as usize);
        }
        if self.segmented.is_some() {
            (SEGMENTED_HEAD_BYTES + self.len as usize).next_multiple_of(IO_ALIGN_BYTES)
        } else {
            unsegmented_record_bytes(self.len as usize)
        }
    }

    /// The segment table, out of the record's first [`SEGMENTED_HEAD_BYTES`] (`head`), if
    /// its CRC32C is the header's; empty for an unsegmented record.
    pub fn segment_table<'a>(&self, head: &'a [u8]) -> Option<&'a [u8]> {
        let Some(s) = self.segmented else {
            return Some(&[]);
        };
        let t = head.get(HEADER_BYTES..HEADER_BYTES + self.segments() * SEGMENT_ENTRY_BYTES)?;
        (crc32c::crc32c(t) == s.table_crc).then_some(t)
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
            segmented: None,
            compressed: None,
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
        for flags in 16..=255u8 {
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
    fn a_segmented_header_round_trips_and_its_fields_are_checked() {
        let len = 1_000_000u32;
        let seg = RecordHeader {
            len,
            segmented: Some(Segmented {
                segment_bytes: SEGMENT_BYTES as u32,
                table_crc: 0x1234_5678,
            }),
            ..sample()
        };
        let mut buf = [0u8; HEADER_BYTES];
        seg.encode(&mut buf);
        assert_eq!(buf[7], FLAG_SEGMENTED);
        assert_eq!(RecordHeader::decode(&buf), Ok(seg.clone()));
        assert_eq!(seg.segments(), 16);
        assert_eq!(seg.segment_range(15), 15 * SEGMENT_BYTES..len as usize);
        assert_eq!(seg.body_offset(), 4096);
        assert_eq!(seg.record_bytes(), record_bytes(len as usize));
        // Segment sizes other than the one the read path plans with (64 KiB), or one that
        // leaves the body in one piece, are refused; so are segment fields on an
        // unsegmented record.
        let with = |flags: u8, s: u32, len: u32| {
            let mut b = buf;
            b[7] = flags;
            b[16..20].copy_from_slice(&len.to_le_bytes());
            b[192..196].copy_from_slice(&s.to_le_bytes());
            let crc = crc32c::crc32c(&b[..252]);
            b[252..256].copy_from_slice(&crc.to_le_bytes());
            RecordHeader::decode(&b)
        };
        for (s, l) in [
            (0, len),
            (2048, len),
            (4096, len),
            (65_000, len),
            (1 << 17, len),
            (1 << 16, 1 << 16),
        ] {
            assert_eq!(
                with(FLAG_SEGMENTED, s, l),
                Err(RecordError::BadField),
                "{s} {l}"
            );
        }
        assert!(with(FLAG_SEGMENTED, 1 << 16, (1 << 16) + 1).is_ok());
        assert_eq!(with(0, 1 << 16, len), Err(RecordError::BadField));
        // The table's CRC32C is checked against the table.
        let mut head = vec![0u8; SEGMENTED_HEAD_BYTES];
        let t = RecordHeader {
            segmented: Some(Segmented {
                segment_bytes: SEGMENT_BYTES as u32,
                table_crc: crc32c::crc32c(&[7u8; 16 * SEGMENT_ENTRY_BYTES]),
            }),
            ..seg
        };
        head[HEADER_BYTES..HEADER_BYTES + 16 * SEGMENT_ENTRY_BYTES].fill(7);
        assert!(t.segment_table(&head).is_some());
        head[HEADER_BYTES + 5] ^= 1;
        assert!(t.segment_table(&head).is_none());
    }

    #[test]
    fn a_compressed_header_round_trips_and_its_fields_are_checked() {
        let len = 1 << 20;
        let c = RecordHeader {
            len,
            nonce: nonce_for(900, *b"salt"),
            compressed: Some(Compressed {
                codec: Codec::Zstd,
                stored_len: 300_000,
                stored_crc: 0x0bad_cafe,
            }),
            ..sample()
        };
        let mut buf = [0u8; HEADER_BYTES];
        c.encode(&mut buf);
        assert_eq!(buf[7], FLAG_COMPRESSED);
        assert_eq!(RecordHeader::decode(&buf), Ok(c.clone()));
        assert!(c.nonce_ok());
        assert_eq!(c.stored_len(), 300_000);
        assert_eq!(c.record_bytes(), unsegmented_record_bytes(300_000));
        assert_eq!(c.body_offset(), HEADER_BYTES);
        // Every field is under the header CRC.
        for byte in 200..212 {
            let mut b = buf;
            b[byte] ^= 1;
            assert_eq!(RecordHeader::decode(&b), Err(RecordError::BadHeaderCrc));
        }
        let with = |f: &dyn Fn(&mut [u8; HEADER_BYTES])| {
            let mut b = buf;
            f(&mut b);
            let crc = crc32c::crc32c(&b[..252]);
            b[252..256].copy_from_slice(&crc.to_le_bytes());
            RecordHeader::decode(&b)
        };
        let set32 = |b: &mut [u8; HEADER_BYTES], at: usize, v: u32| {
            b[at..at + 4].copy_from_slice(&v.to_le_bytes())
        };
        // Unknown codecs, a stored record no shorter than the block's, an empty one, a nonce
        // not taken after the record's sequence number, segments, stray bytes, and
        // compression fields on a record without the flag: all refused.
        type Edit<'a> = &'a dyn Fn(&mut [u8; HEADER_BYTES]);
        let bad: [Edit<'_>; 9] = [
            &|b| b[200] = 0,
            &|b| b[200] = 3,
            &|b| set32(b, 204, len),
            // Shorter, but not by a page: the index could not tell it is compressed.
            &|b| set32(b, 204, len - 100),
            &|b| set32(b, 204, 0),
            &|b| b[32..40].copy_from_slice(&77u64.to_le_bytes()),
            &|b| b[202] = 1,
            &|b| b[7] = 0,
            &|b| {
                b[7] |= FLAG_SEGMENTED;
                set32(b, 192, SEGMENT_BYTES as u32);
            },
        ];
        for (i, f) in bad.iter().enumerate() {
            assert_eq!(with(f), Err(RecordError::BadField), "case {i}");
        }
        assert_eq!(
            with(&|b| b[200] = 1).map(|h| h.compressed.map(|c| c.codec)),
            Ok(Some(Codec::Lz4))
        );
        // An extent of a large value may be compressed.
        let x = RecordHeader {
            extent: Some(ExtentOf {
                value_seq: 5,
                index: 2,
            }),
            ..c.clone()
        };
        x.encode(&mut buf);
        assert_eq!(buf[7], FLAG_COMPRESSED | FLAG_EXTENT);
        assert_eq!(RecordHeader::decode(&buf), Ok(x));
        // Uncompressed records still need the nonce of their own sequence number.
        assert!(sample().nonce_ok());
        let off = RecordHeader {
            nonce: nonce_for(78, *b"salt"),
            ..sample()
        };
        assert!(!off.nonce_ok());
    }

    #[test]
    fn sizes() {
        assert_eq!(record_bytes(1), 4096);
        assert_eq!(record_bytes(4096 - 272), 4096);
        assert_eq!(record_bytes(4096 - 271), 8192);
        assert_eq!(record_bytes(SEGMENT_BYTES), SEGMENT_BYTES + 4096);
        assert_eq!(record_bytes(SEGMENT_BYTES + 1), SEGMENT_BYTES + 8192);
        assert_eq!(record_bytes(1 << 20), (1 << 20) + 4096);
        assert_eq!(unsegmented_record_bytes(1 << 20), (1 << 20) + 4096);
        assert_eq!(record_bytes((1 << 20) + 100), (1 << 20) + 8192);
        assert_eq!(unsegmented_record_bytes((1 << 20) + 100), (1 << 20) + 4096);
        assert_eq!(
            (seqs_for(SEGMENT_BYTES), seqs_for(SEGMENT_BYTES + 1)),
            (1, 2)
        );
        assert_eq!(seqs_for(ctxpod_wire::BLOCK_BYTES_MAX), 128);
        assert!(segments_for(ctxpod_wire::BLOCK_BYTES_MAX) <= SEGMENTS_MAX);
        assert_ne!(nonce_for(1, [0; 4]), nonce_for(2, [0; 4]));
        assert_ne!(nonce_for(1, [0; 4]), nonce_for(1, [1, 0, 0, 0]));
        assert!(nonce_matches(9, &nonce_for(9, *b"abcd")));
        assert_eq!(
            segment_nonce(&nonce_for(9, *b"abcd"), 3),
            nonce_for(12, *b"abcd")
        );
        assert!(!nonce_matches(9, &nonce_for(10, *b"abcd")));
    }
}
