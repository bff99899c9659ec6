//! Large values between tiers: their extents moved one by one, at `fast`'s reclaim (into
//! `dense`) and by promotion (into `fast`), as a block's record is moved: read, checked
//! against the manifest, copied byte for byte (same sequence number, nonce and ciphertext)
//! under the epoch of the region it now lives in, then the manifest rewritten with the new
//! places in the same synced checkpoint that makes the copies count. A reader holding the
//! manifest of before reads the old places until they fail their checks, then reads the
//! manifest again (same generation) and the new places (`value::ExtentReads`); the old
//! copies stay readable until their region is reclaimed, which is after the checkpoint. A
//! demotion compresses an extent of a namespace with `compression` on its way, as it does a
//! block (checked whole first; sealed under the value's data key, with associated data that
//! binds the value's generation and the extent's index); the manifest then holds the
//! compressed record's length.

use super::*;
use crate::index::{ExtentLoc, Manifest};

/// Where a move of extents goes and how much it may write.
#[derive(Clone, Copy, Debug)]
pub(super) struct ExtentMove {
    /// The tier to move into.
    pub to: usize,
    /// The tier to move into when `to` has no room (a kept value's extents stay in their
    /// own tier rather than being dropped).
    pub fallback: Option<usize>,
    /// Device bytes the move may write.
    pub room: u64,
    /// Whether each extent is taken from the move budget.
    pub budgeted: bool,
    /// Whether an extent of a namespace with `compression` is compressed on its way (a
    /// demotion's), as a block is (`writer::compress`).
    pub compress: bool,
}

/// What a move of a value's extents did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct ExtentsMoved {
    /// Extents copied, and their device bytes.
    pub moved: u64,
    pub written: u64,
    /// Of those, copied into the fallback tier.
    pub fell_back: u64,
    pub fell_back_bytes: u64,
    /// Extents picked but not moved: no room, or over the budget.
    pub left: usize,
    /// An extent did not read back as the manifest says (unreadable or damaged): nothing
    /// more was moved.
    pub damaged: bool,
}

impl Writer {
    /// Copies the extents of the large value `bkey` (manifest `m`) that `pick` selects into
    /// the tier `how` names, as its room and budget allow, putting their new places into
    /// `m` (its head's place too, when the first extent moves) and their by-region entries
    /// into `wb`. The caller writes `m` into `wb` when anything moved.
    pub(super) async fn move_extents(
        &mut self,
        core: &Core,
        bkey: &[u8],
        m: &mut Manifest,
        pick: impl Fn(&ExtentLoc) -> bool,
        how: ExtentMove,
        wb: &mut WriteBatch,
    ) -> anyhow::Result<ExtentsMoved> {
        let mut done = ExtentsMoved::default();
        let value_seq = m.head.seq;
        for j in 0..m.extents.len() {
            let x = m.extents[j];
            if !pick(&x) {
                continue;
            }
            let len = x.record_len as u64;
            if done.written + len > how.room || (how.budgeted && !self.budget.take(len)) {
                done.left += 1;
                continue;
            }
            let (buf, res) = read_place(core, (x.region, x.offset), x.record_len).await;
            if res.is_err() || !still_the_extent(&buf, &x, value_seq, bkey) {
                done.damaged = true;
                break;
            }
            let of = record::ExtentOf {
                value_seq,
                index: x.index,
            };
            let buf = match how.compress {
                false => buf,
                true => match self
                    .compress_for_dense(core, bkey, x.record_loc(&m.head), buf, Some(of))
                    .await?
                {
                    Demoted::Same(b) | Demoted::Compressed(b, _) => b,
                    Demoted::Corrupt(_) => {
                        done.damaged = true;
                        break;
                    }
                },
            };
            let (place, fell_back) = match self.alloc(how.to, buf.len())? {
                Some(p) => (Some(p), false),
                None => match how.fallback {
                    Some(t) => (self.alloc(t, buf.len())?, true),
                    None => (None, false),
                },
            };
            let Some((nr, noff)) = place else {
                done.left += 1;
                continue;
            };
            let written = self.write_record(core, buf, (nr, noff)).await?;
            done.written += written;
            if fell_back {
                done.fell_back += 1;
                done.fell_back_bytes += written;
            }
            core.count_tier_io(x.region, len, false);
            wb.put_cf(
                core.index.cf(index::CF_BY_REGION),
                by_region_key(nr, noff),
                bkey,
            );
            m.extents[j].region = nr;
            m.extents[j].offset = noff;
            m.extents[j].record_len = written as u32;
            done.moved += 1;
        }
        m.head.region = m.extents[0].region;
        m.head.offset = m.extents[0].offset;
        m.head.record_len = m.extents.iter().map(|x| x.record_len).sum();
        Ok(done)
    }

    /// Writes `buf`, a record read from elsewhere, at (`nr`, `noff`) byte for byte but for
    /// the epoch of the region it now lives in; the bytes written.
    pub(super) async fn write_record(
        &self,
        core: &Core,
        mut buf: AlignedBuf,
        (nr, noff): (u32, u32),
    ) -> anyhow::Result<u64> {
        record::stamp_region_epoch(
            &mut buf[..record::HEADER_BYTES],
            self.regions[nr as usize].tail_epoch,
        );
        let written = buf.len() as u64;
        let (_, res) = core.device.write_at(buf, core.dev_offset(nr, noff)).await;
        res?;
        core.count_tier_io(nr, written, true);
        Ok(written)
    }
}

/// The `record_len` bytes of the record at (`region`, `offset`), read for a move.
pub(super) async fn read_place(
    core: &Core,
    (region, offset): (u32, u32),
    record_len: u32,
) -> (AlignedBuf, std::io::Result<()>) {
    let buf = AlignedBuf::reused(record_len as usize);
    core.device
        .read_at(buf, core.dev_offset(region, offset))
        .await
}

/// Whether `buf`, read from extent `x`'s place, is still that extent of the value of
/// generation `value_seq` under `bkey` (a move copies only such a record).
fn still_the_extent(buf: &[u8], x: &ExtentLoc, value_seq: u64, bkey: &[u8]) -> bool {
    RecordHeader::decode(buf).is_ok_and(|h| {
        h.seq == x.seq
            && h.len == x.len
            && h.crc32c == x.crc32c
            && h.key == bkey[4..]
            && h.extent
                == Some(record::ExtentOf {
                    value_seq,
                    index: x.index,
                })
    })
}
