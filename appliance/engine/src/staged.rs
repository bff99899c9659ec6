//! A block body (or a piece of a large value) staged as it arrives, straight into the
//! buffer its record will be written from, and sealed there.

use super::*;

/// A block body received straight into the buffer its record will be written from (at the
/// payload's offset), so that ingest costs no copy beyond the network's.
pub struct StagedBlock {
    buf: AlignedBuf,
    len: usize,
    /// Where the payload begins in `buf` ([`record::body_offset`]).
    at: usize,
    /// Payload bytes received so far.
    filled: usize,
    /// CRC32C of the current segment's bytes received so far (of the whole payload, for an
    /// unsegmented record), computed inline with the landing copy (as a DPU computes it
    /// inline with the DMA that lands the data), while the bytes are still in cache: the
    /// body is not read again to check it.
    crc: u32,
    /// CRC32C of each segment received whole, in order (a segmented record's only).
    segment_crcs: Vec<u32>,
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
            at: record::body_offset(len),
            filled: 0,
            crc: 0,
            segment_crcs: Vec::with_capacity(record::segments_for(len).saturating_sub(1)),
        })
    }

    /// CRC32C of the payload received so far (of the whole body, once complete).
    pub fn crc32c(&self) -> u32 {
        let mut whole = 0;
        for (i, &c) in self.segment_crcs.iter().enumerate() {
            let r = record::SEGMENT_BYTES * i..(record::SEGMENT_BYTES * (i + 1)).min(self.len);
            whole = ctxpod_wire::crc32c_combine(whole, c, r.len());
        }
        let done = (record::SEGMENT_BYTES * self.segment_crcs.len()).min(self.filled);
        ctxpod_wire::crc32c_combine(whole, self.crc, self.filled - done)
    }

    /// Checksums payload bytes `from..to`, just received, segment by segment.
    fn checksum(&mut self, from: usize, to: usize) {
        let mut at = from;
        while at < to {
            let seg_end = if record::is_segmented(self.len) {
                ((at / record::SEGMENT_BYTES + 1) * record::SEGMENT_BYTES).min(self.len)
            } else {
                self.len
            };
            let end = to.min(seg_end);
            let b = &self.buf[self.at + at..self.at + end];
            self.crc = crc32c::crc32c_append(self.crc, b);
            at = end;
            if end == seg_end && record::is_segmented(self.len) {
                self.segment_crcs.push(std::mem::take(&mut self.crc));
            }
        }
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
        &mut self.buf[self.at + self.filled..self.at + self.len]
    }

    /// Marks `n` more bytes of [`StagedBlock::unfilled_mut`] as received (and checksums
    /// them while they are in cache).
    pub fn advance(&mut self, n: usize) {
        let n = n.min(self.len - self.filled);
        self.checksum(self.filled, self.filled + n);
        self.filled += n;
    }

    /// Appends the next piece of the body; false (and nothing appended) if it would run
    /// past the announced length.
    pub fn append(&mut self, piece: &[u8]) -> bool {
        let end = self.filled + piece.len();
        if end > self.len {
            return false;
        }
        self.buf[self.at + self.filled..self.at + end].copy_from_slice(piece);
        self.checksum(self.filled, end);
        self.filled = end;
        true
    }

    /// The body received so far.
    pub fn payload(&self) -> &[u8] {
        &self.buf[self.at..self.at + self.filled]
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

    /// Seals the payload in place and completes the record: header, tag (a segmented
    /// record: segment table), zero padding. Without a data key (a plaintext node) the body
    /// stays as received and the tags are zero. `seq` is the first of the
    /// [`record::seqs_for`] sequence numbers taken for the record.
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
        let aad = record_aad(ns_id, key_id, key, extent);
        let segmented = if record::is_segmented(len) {
            Some(self.seal_segments(dek, &aad, (seq, salt)))
        } else {
            let tag = match dek {
                Some(dek) => crypto::seal(
                    dek,
                    nonce,
                    &aad,
                    &mut self.buf[HEADER_BYTES..HEADER_BYTES + len],
                ),
                None => [0; TAG_BYTES],
            };
            self.buf[HEADER_BYTES + len..HEADER_BYTES + len + TAG_BYTES].copy_from_slice(&tag);
            self.buf[HEADER_BYTES + len + TAG_BYTES..].fill(0);
            None
        };
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
            segmented,
            compressed: None,
        }
        .encode(&mut self.buf[..HEADER_BYTES]);
        self.buf
    }

    /// The body of a segmented record sealed: each segment under its own nonce and
    /// associated data (`aad`: the record's), its tag and CRC32C in the table, the padding
    /// zeroed. How it is cut, for its header.
    fn seal_segments(
        &mut self,
        dek: Option<&AeadKey>,
        aad: &[u8],
        (seq, salt): (u64, [u8; 4]),
    ) -> record::Segmented {
        let (len, at) = (self.len, self.at);
        let n = self.segment_crcs.len();
        debug_assert_eq!(
            n,
            record::segments_for(len),
            "every segment was checksummed"
        );
        let (head, body) = self.buf.split_at_mut(at);
        let table_end = HEADER_BYTES + n * record::SEGMENT_ENTRY_BYTES;
        let mut seg_aad = crypto::segment_aad(aad, len as u32, 0);
        for (i, &seg_crc) in self.segment_crcs.iter().enumerate() {
            let r = record::SEGMENT_BYTES * i..(record::SEGMENT_BYTES * (i + 1)).min(len);
            crypto::set_segment_index(&mut seg_aad, i as u32);
            let tag = match dek {
                Some(dek) => crypto::seal(
                    dek,
                    record::nonce_for(seq + i as u64, salt),
                    &seg_aad,
                    &mut body[r],
                ),
                None => [0; TAG_BYTES],
            };
            record::set_table_entry(&mut head[HEADER_BYTES..table_end], i, &tag, seg_crc);
        }
        let table_crc = crc32c::crc32c(&head[HEADER_BYTES..table_end]);
        head[table_end..].fill(0);
        body[len..].fill(0);
        record::Segmented {
            segment_bytes: record::SEGMENT_BYTES as u32,
            table_crc,
        }
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
