//! Cold compression at demotion: a block of a namespace with `compression`, moving from
//! `fast` to `dense`, is checked whole (tag and CRC32C: a damaged block is never sealed
//! anew), compressed and sealed as a compressed record ([`crate::compress`]) on the offload
//! engine's AEAD threads, when that saves at least `compression_min_saving`. Otherwise, or
//! should the engine refuse the job, it moves byte for byte as any other.

use super::*;
use crate::compress::{self, SealWith};
use crate::{verify_record_of, Verified};

/// What a demotion writes for one record.
pub(super) enum Demoted {
    /// The record as it was read.
    Same(AlignedBuf),
    /// Its compressed record, and the index entry that describes it.
    Compressed(AlignedBuf, BlockLoc),
    /// The record (given back) failed its checks: to quarantine, not to move.
    Corrupt(AlignedBuf),
}

impl Writer {
    /// What to write in `dense` for the record `buf` of `bkey` (index entry `loc`, its
    /// header already checked against it), or of its extent `extent` (`loc` then describes
    /// the extent's record, with the value's data key).
    pub(super) async fn compress_for_dense(
        &self,
        core: &Core,
        bkey: &[u8],
        loc: BlockLoc,
        buf: AlignedBuf,
        extent: Option<record::ExtentOf>,
    ) -> anyhow::Result<Demoted> {
        let id = u32::from_be_bytes(bkey[..4].try_into().expect("a namespace id"));
        let Some(ns) = core.ns_by_id(id) else {
            return Ok(Demoted::Same(buf));
        };
        let Some(setting) = ns.compression() else {
            return Ok(Demoted::Same(buf));
        };
        let plaintext = core.geometry.plaintext_at_rest;
        // Stored compressed already (promoted, then demoted again): moved as it is.
        let opening = ns.opening_key(loc.key_id, plaintext);
        // An extent stays under its value's key (the manifest has one for all of them).
        let sealing = if extent.is_some() {
            opening.clone().map(|k| (loc.key_id, k))
        } else if plaintext {
            Some((ns.key_id(), None))
        } else {
            ns.current_key().map(|(id, k)| (id, Some(k)))
        };
        let (Some(opening), Some((key_id, sealing)), false) =
            (opening, sealing, loc.is_compressed())
        else {
            return Ok(Demoted::Same(buf));
        };
        let codec = compress::codec_of(setting);
        let (cseq, salt) = (core.next_seq()?, core.nonce_salt);
        let min_saving = core.cfg.compression_min_saving;
        let record_len = loc.record_len as usize;
        let (ns_id, key) = (ns.id, bkey[4..].to_vec());
        let shared = Arc::new(buf);
        let read = shared.clone();
        let job = move || {
            let mut copy = AlignedBuf::reused(read.len());
            copy.copy_from_slice(&read);
            let plain =
                match verify_record_of(copy, opening.as_deref(), (ns_id, &key), &loc, extent) {
                    Verified::Ok(p) => p,
                    Verified::Bad(why) => return Err(why),
                };
            let h = RecordHeader::decode(&read).map_err(|e| e.to_string())?;
            let seal = SealWith {
                ns_id,
                key: &key,
                key_id,
                dek: sealing.as_deref(),
                cseq,
                salt,
            };
            Ok(compress::compressed_record(
                &h,
                &plain,
                codec,
                (record_len, min_saving),
                &seal,
            ))
        };
        let done = core.offload.aead(record_len, job).await;
        let buf = Arc::try_unwrap(shared)
            .map_err(|_| anyhow::anyhow!("a compression job kept its record"))?;
        let m = &core.metrics.compression;
        let label = [codec.name()];
        Ok(match done {
            Ok(Ok(Some(c))) => {
                count_compressed(core, codec, record_len, c.len());
                let nloc = BlockLoc {
                    record_len: c.len() as u32,
                    key_id,
                    ..loc
                };
                Demoted::Compressed(c, nloc)
            }
            Ok(Ok(None)) => {
                m.skipped.with_label_values(&label).inc();
                Demoted::Same(buf)
            }
            Ok(Err(why)) => {
                tracing::warn!(
                    region = loc.region,
                    offset = loc.offset,
                    "a record to demote fails its checks ({why}); it is quarantined"
                );
                Demoted::Corrupt(buf)
            }
            // The engine's queue is full, or it failed this job: moved as it is.
            Err(e) => {
                tracing::debug!(error = %e, "compression at demotion not run");
                Demoted::Same(buf)
            }
        })
    }
}

/// Extent `record` of a large value (just sealed, its plaintext `plain`) of a namespace
/// compressing with `setting`, as it is written to `dense`: its compressed record if that
/// saves `compression_min_saving`, sealed under the same data key (`at`: namespace id,
/// key, data key) with a nonce of a sequence number taken for it; else, or should the
/// offload engine refuse the job, `record` as it is (compression is never a reason to fail
/// a write).
pub(crate) async fn compress_extent(
    core: &Core,
    (ns_id, key, dek): (u32, &[u8], Option<Arc<crate::crypto::AeadKey>>),
    setting: ctxpod_wire::types::Compression,
    record: AlignedBuf,
    plain: Arc<Vec<u8>>,
) -> anyhow::Result<AlignedBuf> {
    let h = RecordHeader::decode(&record).map_err(|e| anyhow::anyhow!("{e}"))?;
    let (codec, min_saving) = (compress::codec_of(setting), core.cfg.compression_min_saving);
    let (cseq, salt, key) = (core.next_seq()?, core.nonce_salt, key.to_vec());
    let record_len = record.len();
    let job = move || {
        let seal = SealWith {
            ns_id,
            key: &key,
            key_id: h.key_id,
            dek: dek.as_deref(),
            cseq,
            salt,
        };
        compress::compressed_record(&h, &plain, codec, (record_len, min_saving), &seal)
    };
    match core.offload.aead(record_len, job).await {
        Ok(Some(c)) => {
            count_compressed(core, codec, record_len, c.len());
            return Ok(c);
        }
        Ok(None) => {}
        Err(e) => tracing::debug!(error = %e, "compression of an extent at write not run"),
    }
    let skipped = &core.metrics.compression.skipped;
    skipped.with_label_values(&[codec.name()]).inc();
    Ok(record)
}

/// A record of `from` device bytes written compressed in `to`, in the codec's series.
fn count_compressed(core: &Core, codec: record::Codec, from: usize, to: usize) {
    let (m, label) = (&core.metrics.compression, [codec.name()]);
    m.records.with_label_values(&label).inc();
    m.input_bytes.with_label_values(&label).inc_by(from as u64);
    m.output_bytes.with_label_values(&label).inc_by(to as u64);
}
