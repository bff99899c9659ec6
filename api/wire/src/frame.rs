//! Binary framing of many blocks in one body (`batch/put` requests, `batch/put` and `batch/get`
//! responses). Sans-IO: pure functions over bytes.
//!
//! ```text
//! frame := magic "CXB1" | count: u32 LE | entry * count
//! entry := key_len: u8 | flags: u8 | status: u16 LE | crc32c: u32 LE | len: u32 LE
//!          | key: [u8; key_len] | data: [u8; len]   (data only when flags & HAS_DATA)
//! ```
//! - `flags`: [`HAS_CRC`] (the `crc32c` field is meaningful), [`HAS_DATA`] (`len` bytes follow).
//! - `status`: 0 in requests; in responses the per-block HTTP-style status
//!   (200, 201, 404, 409, 422, 507, …).
//! - `len`: the block's length. In a `batch/put` response it is the stored length and no data
//!   follows; in a `batch/get` response the block's bytes follow when the status is 200.
//!
//! Limits: at most [`BATCH_ENTRIES_MAX`](crate::BATCH_ENTRIES_MAX) entries, keys of
//! 1..=[`KEY_BYTES_MAX`](crate::KEY_BYTES_MAX) bytes, data of at most
//! [`BLOCK_BYTES_MAX`](crate::BLOCK_BYTES_MAX) bytes. No trailing bytes.

pub const MAGIC: &[u8; 4] = b"CXB1";
pub const HAS_CRC: u8 = 0x01;
pub const HAS_DATA: u8 = 0x02;
const FRAME_HEADER_BYTES: usize = 8;
const ENTRY_HEADER_BYTES: usize = 12;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame does not start with magic CXB1")]
    BadMagic,
    #[error("frame is truncated at byte {0}")]
    Truncated(usize),
    #[error("frame has {0} entries, more than the limit")]
    TooManyEntries(u32),
    #[error("entry {0}: key length must be 1..=128")]
    BadKeyLength(usize),
    #[error("entry {0}: data length {1} is over the block limit")]
    TooLarge(usize, u32),
    #[error("entry {0}: unknown flags {1:#x}")]
    BadFlags(usize, u8),
    #[error("frame has {0} trailing bytes")]
    Trailing(usize),
}

/// One entry: one to encode, or one decoded (borrowing from the frame).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry<'a> {
    pub key: &'a [u8],
    pub status: u16,
    pub crc32c: Option<u32>,
    /// The block's length; when `data` is given it must equal `data.len()`.
    pub len: u32,
    pub data: Option<&'a [u8]>,
}

/// A decoded entry: the same shape as one to encode.
pub type EntryRef<'a> = Entry<'a>;

impl<'a> Entry<'a> {
    /// A `batch/put` request entry: key, data, and the data's CRC32C.
    pub fn put(key: &'a [u8], data: &'a [u8]) -> Self {
        Entry {
            key,
            status: 0,
            crc32c: Some(crate::crc32c(data)),
            len: data.len() as u32,
            data: Some(data),
        }
    }
}

/// Exact encoded size of `entries`, to allocate once.
pub fn encoded_len(entries: &[Entry<'_>]) -> usize {
    FRAME_HEADER_BYTES
        + entries
            .iter()
            .map(|e| ENTRY_HEADER_BYTES + e.key.len() + e.data.map_or(0, <[u8]>::len))
            .sum::<usize>()
}

/// Encodes a frame header for `count` entries into `out`.
pub fn encode_header(count: u32, out: &mut Vec<u8>) {
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&count.to_le_bytes());
}

/// Appends one entry to `out` (after [`encode_header`]).
pub fn encode_entry(e: &Entry<'_>, out: &mut Vec<u8>) {
    debug_assert!(e.data.is_none_or(|d| d.len() == e.len as usize));
    let mut flags = 0;
    if e.crc32c.is_some() {
        flags |= HAS_CRC;
    }
    if e.data.is_some() {
        flags |= HAS_DATA;
    }
    out.push(e.key.len() as u8);
    out.push(flags);
    out.extend_from_slice(&e.status.to_le_bytes());
    out.extend_from_slice(&e.crc32c.unwrap_or(0).to_le_bytes());
    out.extend_from_slice(&e.len.to_le_bytes());
    out.extend_from_slice(e.key);
    if let Some(d) = e.data {
        out.extend_from_slice(d);
    }
}

/// Encodes a whole frame.
pub fn encode(entries: &[Entry<'_>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(encoded_len(entries));
    encode_header(entries.len() as u32, &mut out);
    for e in entries {
        encode_entry(e, &mut out);
    }
    out
}

/// Decodes a whole frame, checking every limit; never panics on any input.
pub fn decode(buf: &[u8]) -> Result<Vec<EntryRef<'_>>, FrameError> {
    if buf.len() < FRAME_HEADER_BYTES {
        return Err(if buf.len() >= 4 && &buf[..4] != MAGIC {
            FrameError::BadMagic
        } else {
            FrameError::Truncated(buf.len())
        });
    }
    if &buf[..4] != MAGIC {
        return Err(FrameError::BadMagic);
    }
    let count = u32::from_le_bytes(buf[4..8].try_into().expect("4 bytes"));
    if count as usize > crate::BATCH_ENTRIES_MAX {
        return Err(FrameError::TooManyEntries(count));
    }
    let mut entries = Vec::with_capacity(count as usize);
    let mut pos = FRAME_HEADER_BYTES;
    for i in 0..count as usize {
        let h = buf
            .get(pos..pos + ENTRY_HEADER_BYTES)
            .ok_or(FrameError::Truncated(buf.len()))?;
        let key_len = h[0] as usize;
        let flags = h[1];
        let status = u16::from_le_bytes([h[2], h[3]]);
        let crc = u32::from_le_bytes(h[4..8].try_into().expect("4 bytes"));
        let len = u32::from_le_bytes(h[8..12].try_into().expect("4 bytes"));
        if key_len == 0 || key_len > crate::KEY_BYTES_MAX {
            return Err(FrameError::BadKeyLength(i));
        }
        if flags & !(HAS_CRC | HAS_DATA) != 0 {
            return Err(FrameError::BadFlags(i, flags));
        }
        if len as usize > crate::BLOCK_BYTES_MAX {
            return Err(FrameError::TooLarge(i, len));
        }
        pos += ENTRY_HEADER_BYTES;
        let key = buf
            .get(pos..pos + key_len)
            .ok_or(FrameError::Truncated(buf.len()))?;
        pos += key_len;
        let data = if flags & HAS_DATA != 0 {
            let d = buf
                .get(pos..pos + len as usize)
                .ok_or(FrameError::Truncated(buf.len()))?;
            pos += len as usize;
            Some(d)
        } else {
            None
        };
        entries.push(EntryRef {
            key,
            status,
            crc32c: (flags & HAS_CRC != 0).then_some(crc),
            len,
            data,
        });
    }
    if pos != buf.len() {
        return Err(FrameError::Trailing(buf.len() - pos));
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn round_trip_and_every_truncation_fails_cleanly() {
        let a = vec![7u8; 1000];
        let entries = vec![
            Entry::put(b"k1", &a),
            Entry {
                key: b"k2",
                status: 404,
                crc32c: None,
                len: 0,
                data: None,
            },
            Entry {
                key: &[9; 128],
                status: 201,
                crc32c: Some(5),
                len: 77,
                data: None,
            },
        ];
        let buf = encode(&entries);
        assert_eq!(buf.len(), encoded_len(&entries));
        let got = decode(&buf).expect("decodes");
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].data, Some(&a[..]));
        assert_eq!(got[0].crc32c, Some(crate::crc32c(&a)));
        assert_eq!(got[1].status, 404);
        assert_eq!(got[2].len, 77);
        assert_eq!(got[2].key.len(), 128);
        for cut in 0..buf.len() {
            assert!(decode(&buf[..cut]).is_err(), "truncation at {cut} decoded");
        }
        let mut long = buf.clone();
        long.push(0);
        assert_eq!(decode(&long), Err(FrameError::Trailing(1)));
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(42);
        for _ in 0..20_000 {
            let n = rng.gen_range(0..64);
            let mut b: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
            if rng.gen_bool(0.5) && b.len() >= 4 {
                b[..4].copy_from_slice(MAGIC);
            }
            let _ = decode(&b);
        }
    }

    #[test]
    fn limits() {
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&(crate::BATCH_ENTRIES_MAX as u32 + 1).to_le_bytes());
        assert!(matches!(decode(&b), Err(FrameError::TooManyEntries(_))));
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&[1, HAS_DATA, 0, 0, 0, 0, 0, 0]);
        b.extend_from_slice(&(crate::BLOCK_BYTES_MAX as u32 + 1).to_le_bytes());
        b.push(1);
        assert!(matches!(decode(&b), Err(FrameError::TooLarge(0, _))));
    }
}
