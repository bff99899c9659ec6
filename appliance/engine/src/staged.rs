//! A block body (or a piece of a large value) staged as it arrives, straight into the
//! buffer its record will be written from, and sealed there.

use super::*;

/// A block body received straight into the buffer its record will be written from (at the
/// payload's offset), so that ingest costs no copy beyond the network's.
pub struct StagedBlock {
    buf: AlignedBuf,
    len: usize,
    /// Payload bytes received so far.
    filled: usize,
    /// CRC32C of the payload received so far, computed inline with the landing copy (as a
    /// DPU computes it inline with the DMA that lands the data), while the bytes are still
    /// in cache: the body is not read again to check it.
    pub(crate) crc: u32,
}

impl StagedBlock {
    /// Room for a body of `len` bytes; refuses empty and over-limit bodies.
    pub fn new(len: usize) -> Result<StagedBlock> {
        if len > ctxpod_wire::BLOCK_BYTES_MAX {
            return Err(EngineError::TooLarge(format!(
                "block of {len} bytes is over the limit of {}",
                ctxpod_wire::BLOCK_BYTES_MAX
            )));
        }
        if len == 0 {
            return Err(EngineError::Invalid("empty block".into()));
        }
        Ok(StagedBlock {
            buf: AlignedBuf::reused(record::record_bytes(len)),
            len,
            filled: 0,
            crc: 0,
        })
    }

    /// A copy of `data`, staged.
    pub fn copy_of(data: &[u8]) -> Result<StagedBlock> {
        let mut s = StagedBlock::new(data.len())?;
        s.append(data);
        Ok(s)
    }

    /// The part of the body not received yet, to receive into directly (then
    /// [`StagedBlock::advance`]).
    pub fn unfilled_mut(&mut self) -> &mut [u8] {
        &mut self.buf[HEADER_BYTES + self.filled..HEADER_BYTES + self.len]
    }

    /// Marks `n` more bytes of [`StagedBlock::unfilled_mut`] as received (and checksums
    /// them while they are in cache).
    pub fn advance(&mut self, n: usize) {
        let n = n.min(self.len - self.filled);
        let start = HEADER_BYTES + self.filled;
        self.crc = crc32c::crc32c_append(self.crc, &self.buf[start..start + n]);
        self.filled += n;
    }

    /// Appends the next piece of the body; false (and nothing appended) if it would run
    /// past the announced length.
    pub fn append(&mut self, piece: &[u8]) -> bool {
        let end = self.filled + piece.len();
        if end > self.len {
            return false;
        }
        let dst = &mut self.buf[HEADER_BYTES + self.filled..HEADER_BYTES + end];
        dst.copy_from_slice(piece);
        self.crc = crc32c::crc32c_append(self.crc, dst);
        self.filled = end;
        true
    }

    /// The body received so far.
    pub fn payload(&self) -> &[u8] {
        &self.buf[HEADER_BYTES..HEADER_BYTES + self.filled]
    }

    /// Whether the whole announced body has arrived.
    pub fn is_complete(&self) -> bool {
        self.filled == self.len
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Seals the payload in place and completes the record: header, tag, zero padding.
    /// Without a data key (a plaintext node) the body stays as received and the tag is zero.
    pub(crate) fn seal(
        mut self,
        ns_id: u32,
        (key_id, dek): (u32, Option<&AeadKey>),
        key: &[u8],
        (seq, salt): (u64, [u8; 4]),
        crc: u32,
        extent: Option<record::ExtentOf>,
    ) -> AlignedBuf {
        let len = self.len;
        let nonce = record::nonce_for(seq, salt);
        let tag = match dek {
            Some(dek) => crypto::seal(
                dek,
                nonce,
                &record_aad(ns_id, key_id, key, extent),
                &mut self.buf[HEADER_BYTES..HEADER_BYTES + len],
            ),
            None => [0; TAG_BYTES],
        };
        self.buf[HEADER_BYTES + len..HEADER_BYTES + len + TAG_BYTES].copy_from_slice(&tag);
        self.buf[HEADER_BYTES + len + TAG_BYTES..].fill(0);
        RecordHeader {
            ns_id,
            key_id,
            len: len as u32,
            crc32c: crc,
            seq,
            nonce,
            region_epoch: 0,
            key: key.to_vec(),
            plaintext: dek.is_none(),
            extent,
        }
        .encode(&mut self.buf[..HEADER_BYTES]);
        self.buf
    }
}

impl ctxpod_wire::proto::Landing for StagedBlock {
    fn unfilled_mut(&mut self) -> &mut [u8] {
        StagedBlock::unfilled_mut(self)
    }

    fn advance(&mut self, n: usize) {
        StagedBlock::advance(self, n)
    }
}
