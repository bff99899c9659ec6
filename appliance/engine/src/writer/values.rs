//! Large values in the writer: each extent is placed and written like a put's record, but
//! indexed by nothing; the value becomes visible when its manifest is published, in a
//! checkpoint (synced, after a device flush), so that a crash at any point leaves either the
//! whole value or none of it. An extent written but never published is dead space: recovery
//! steps over it in the open region's tail, and reclaim frees it with its region.

use super::*;
use crate::index::{ExtentLoc, Manifest};

/// One extent of a large value to write.
pub(crate) struct ExtentReq {
    pub ns: Arc<Namespace>,
    pub record: AlignedBuf,
    pub reply: oneshot::Sender<Result<Placed>>,
}

/// Where an extent was written, and the epoch of its region then: a value is published only
/// if every region holding one of its extents still has that epoch (was not reclaimed since).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Placed {
    pub region: u32,
    pub offset: u32,
    pub open_seq: u64,
}

/// A large value whose extents are all written: its manifest, and the epochs of the
/// regions its extents went to (one per extent).
pub(crate) struct PublishReq {
    pub ns: Arc<Namespace>,
    pub bkey: Vec<u8>,
    pub manifest: Manifest,
    pub epochs: Vec<u64>,
    pub durability: Durability,
    pub reply: oneshot::Sender<Result<PutStatus>>,
}

impl Writer {
    /// An extent of the batch: placed in the open region, stamped with its epoch and queued
    /// for writing; answered with its place once written.
    pub(super) fn stage_extent(&mut self, b: &mut Staged, mut x: ExtentReq) {
        if x.ns.deleted.load(Ordering::SeqCst) {
            let _ = x.reply.send(Err(EngineError::NotFound(format!(
                "namespace {:?} was deleted",
                x.ns.name
            ))));
            return;
        }
        let (region, offset) = match self.alloc_extent(x.record.len()) {
            Ok(Some(place)) => place,
            Ok(None) => {
                let _ = x.reply.send(Err(EngineError::NoSpace(
                    "no free region: every region holds leased blocks".into(),
                )));
                return;
            }
            Err(e) => {
                let _ = x.reply.send(Err(e.into()));
                return;
            }
        };
        let m = self.regions[region as usize];
        record::stamp_region_epoch(&mut x.record[..record::HEADER_BYTES], m.tail_epoch);
        b.first_record.get_or_insert((region, offset));
        b.writes
            .push((x.record, self.core.dev_offset(region, offset)));
        b.replies.push(Reply::Extent(
            x.reply,
            Placed {
                region,
                offset,
                open_seq: m.open_seq,
            },
        ));
    }

    /// A publish of the batch: answered at once when the value cannot be stored (namespace
    /// deleted, lookup failed, quota, an extent's region reclaimed meanwhile) or is there
    /// already; otherwise its manifest and a by-region entry per extent go into the batch,
    /// which becomes a synced checkpoint (so every extent is flushed first, and the region
    /// table's write pointers cover every extent).
    pub(super) fn stage_publish(&mut self, b: &mut Staged, cfs: BatchCfs<'_>, p: PublishReq) {
        let head = p.manifest.head;
        let new = NewPut {
            ns: &p.ns,
            bkey: &p.bkey,
            len: head.len,
            crc: head.crc32c,
            durability: p.durability,
        };
        let Some(reply) = self.admit_new(b, new, p.reply) else {
            return;
        };
        if let Some(x) = self.reclaimed_extent(&p.manifest.extents, &p.epochs) {
            let _ = reply.send(Err(EngineError::NoSpace(format!(
                "an extent of the value (region {}) was reclaimed before the value was \
                 complete: the device turned over while it was written; store it again",
                x.region
            ))));
            return;
        }
        b.wb.put_cf(cfs.0, &p.bkey, p.manifest.encode());
        for x in &p.manifest.extents {
            b.wb.put_cf(cfs.1, by_region_key(x.region, x.offset), &p.bkey);
        }
        b.presence.push(presence::Change::Insert(p.bkey.clone()));
        b.pending.insert(p.bkey, Some(head));
        self.account(&p.ns, head.len, true);
        // Extents compressed as they were written (a compressing namespace, two tiers).
        for x in &p.manifest.extents {
            p.ns.count_compressed(&x.record_loc(&head), true);
        }
        b.needs_checkpoint = true;
        b.sync = true;
        b.puts += 1;
        b.replies.push(Reply::Put(reply, Ok(PutStatus::Created)));
    }

    /// The first extent whose region no longer has the epoch it was written under.
    fn reclaimed_extent<'a>(
        &self,
        extents: &'a [ExtentLoc],
        epochs: &[u64],
    ) -> Option<&'a ExtentLoc> {
        debug_assert_eq!(extents.len(), epochs.len(), "one epoch per extent");
        extents
            .iter()
            .zip(epochs)
            .find(|(x, &epoch)| match self.regions.get(x.region as usize) {
                None => true,
                Some(m) => m.state == RegionState::Free || m.open_seq != epoch,
            })
            .map(|(x, _)| x)
    }
}
