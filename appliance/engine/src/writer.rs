//! The writer: the one task that appends records, mutates the block index and the region
//! table, and reclaims regions. Group commit: it takes every command queued (up to a bound)
//! and writes their records concurrently — durable writes (`RWF_DSYNC`) if any put of the
//! batch asked for `durable` — then hands the batch to the committer, which waits for the
//! writes, flushes the device where earlier `fast` records are not yet on stable media and
//! a command needs them to be, writes the batch's index changes, and only then answers
//! anything. While batch k is made
//! durable, the writer already writes batch k+1. Batches commit strictly in order; until its
//! batch commits, the writer sees a block in its `overlay` of uncommitted batches.
//!
//! **Durability comes from the data flush.** A put's index entry is written to RocksDB
//! without the WAL: after a crash it may be gone, and recovery re-indexes it from the open
//! region's tail, where every record is self-describing and stamped with its region's epoch
//! (`engine::recovery`). What the tail cannot tell — deletes, quarantines, namespace drops,
//! region transitions (open, seal, reclaim) — goes through a **checkpoint**: the index
//! entries of every put since the last checkpoint, then the batch's own changes and the
//! region table, written with the WAL and synced. A checkpoint also happens every
//! [`CHECKPOINT_ENTRIES_MAX`] puts and at a clean shutdown, which bounds recovery's scan.
//!
//! Order, always: records on stable media (durable writes, or writes then a flush) → index
//! written (checkpoints synced) → acknowledgement. A failed write, flush or index write is never retried-and-acknowledged:
//! the node stops taking writes.

use super::events::KvEventKind;
use super::index::{self, by_region_key, BlockLoc, RegionMeta, RegionState};
use super::presence;
use super::{Core, EngineError, Namespace, PutStatus, Result};
use crate::device::{AlignedBuf, VECTORED_BUFS_MAX};
use ctxpod_format::record::{self, RecordHeader};
use ctxpod_wire::Durability;
use parking_lot::Mutex;
use rocksdb::WriteBatch;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{mpsc, oneshot};

mod compress;
use compress::Demoted;
mod eviction;
mod extent_moves;
mod pipeline;
mod promote;
mod removals;
mod tiers;
mod values;
pub(crate) use compress::compress_extent;
use pipeline::{committer, reply_failed};
pub use promote::Fate;
use tiers::TierRegions;
pub(crate) use values::{ExtentReq, Placed, PublishReq};

pub(crate) struct PutReq {
    pub ns: Arc<Namespace>,
    pub bkey: Vec<u8>,
    pub len: u32,
    pub crc: u32,
    pub key_id: u32,
    pub seq: u64,
    pub record: AlignedBuf,
    pub durability: Durability,
    pub reply: oneshot::Sender<Result<PutStatus>>,
}

pub(crate) enum WriteCmd {
    Put(PutReq),
    /// Write one extent of a large value (no index entry: see [`WriteCmd::Publish`]).
    Extent(ExtentReq),
    /// Make a large value whose extents are written visible: its manifest into the index.
    Publish(PublishReq),
    Delete {
        ns: Arc<Namespace>,
        bkey: Vec<u8>,
        reply: oneshot::Sender<Result<bool>>,
    },
    /// Drop the index entry of a record that failed its checks, if the index still points at it.
    Quarantine {
        bkey: Vec<u8>,
        loc: BlockLoc,
    },
    DropNamespace {
        ns: Arc<Namespace>,
        reply: oneshot::Sender<Result<()>>,
    },
    /// Answer once everything acknowledged so far is flushed and synced.
    Barrier(oneshot::Sender<Result<()>>),
    /// Move these blocks (index keys) into the fast tier now, as the move budget allows.
    Promote {
        bkeys: Vec<Vec<u8>>,
        reply: oneshot::Sender<Result<Vec<Fate>>>,
    },
    Stop(oneshot::Sender<()>),
}

enum Reply {
    Put(oneshot::Sender<Result<PutStatus>>, Result<PutStatus>),
    Extent(oneshot::Sender<Result<Placed>>, Placed),
    Delete(oneshot::Sender<Result<bool>>, bool),
    Done(oneshot::Sender<Result<()>>),
}

impl Reply {
    fn send_ok(self) {
        match self {
            Reply::Put(tx, r) => drop(tx.send(r)),
            Reply::Extent(tx, p) => drop(tx.send(Ok(p))),
            Reply::Delete(tx, r) => drop(tx.send(Ok(r))),
            Reply::Done(tx) => drop(tx.send(Ok(()))),
        }
    }

    fn send_err(self, why: &str) {
        self.send_error(|| EngineError::Internal(anyhow::anyhow!("{why}")));
    }

    fn send_error(self, e: impl Fn() -> EngineError) {
        match self {
            Reply::Put(tx, _) => drop(tx.send(Err(e()))),
            Reply::Extent(tx, _) => drop(tx.send(Err(e()))),
            Reply::Delete(tx, _) => drop(tx.send(Err(e()))),
            Reply::Done(tx) => drop(tx.send(Err(e()))),
        }
    }
}

pub(crate) struct Writer {
    core: Arc<Core>,
    regions: Vec<RegionMeta>,
    /// Each tier's free, sealed and open regions (one tier for a node of one device;
    /// `fast` then `dense` for a node of two).
    tiers: Vec<TierRegions>,
    /// Bytes per second that may move between tiers (promotions).
    budget: promote::MoveBudget,
    /// Regions whose metadata changed since the last checkpoint.
    touched: BTreeSet<u32>,
    /// A region was opened, sealed or freed since the last checkpoint.
    transition: bool,
    /// Index entries (`blocks`, `by_region`) of puts since the last checkpoint.
    uncheckpointed: Vec<(Vec<u8>, BlockLoc)>,
    /// Index changes of batches written but not yet committed, oldest first.
    overlay: Arc<Mutex<VecDeque<Pending>>>,
    /// To the committer task, which ends when the writer drops this.
    commit_tx: mpsc::Sender<CommitMsg>,
    /// Batches handed to the committer so far: each job carries its number, and the
    /// committer checks that it sees them in that order.
    batches: u64,
    /// The committer task: awaited at a stop, so
    /// that nothing of the engine outlives `Engine::shutdown`.
    committer: Option<tokio::task::JoinHandle<()>>,
}

type Pending = HashMap<Vec<u8>, Option<BlockLoc>>;

/// The record writes of one batch, submitted to the device when the batch was made (the
/// future only collects them): each buffer comes back with its result.
type BatchWrites = std::pin::Pin<
    Box<dyn std::future::Future<Output = Vec<(Vec<AlignedBuf>, std::io::Result<()>)>> + Send>,
>;

/// A batch whose records are being written, for the committer to make durable and answer.
struct CommitJob {
    /// The batch's number, in the order the writer made them (from 1).
    batch: u64,
    /// The batch's record writes, submitted: they must all succeed before anything else of
    /// the batch happens.
    io: Option<BatchWrites>,
    /// For a checkpoint: the entries of earlier puts, written (with the WAL) before `wb`.
    checkpoint: Option<WriteBatch>,
    /// The batch's own changes: with the WAL and synced for a checkpoint, without otherwise.
    wb: WriteBatch,
    replies: Vec<Reply>,
    /// Blocks (deleted, quarantined) and namespaces (dropped) whose DRAM copies go once `wb`
    /// is written, before any reply.
    forget: Vec<Vec<u8>>,
    forget_ns: Vec<u32>,
    /// Applied right after `wb` is written, before any reply.
    presence: Vec<presence::Change>,
    /// Some command needs everything acknowledged so far on stable media.
    sync: bool,
    /// The batch's records were written durable (they need no flush themselves).
    durable_writes: bool,
    /// Where the batch's first record begins (region, offset).
    first: Option<(u32, u32)>,
    /// Set by the committer: the device was full for this batch or one before it.
    no_space: bool,
    written: u64,
    puts: u64,
    started: Instant,
}

enum CommitMsg {
    Job(CommitJob),
    /// Answered once every job sent before it is committed.
    Drain(oneshot::Sender<()>),
}

/// What the commands of one batch add up to, gathered in command order by the writer's
/// `stage_*` steps before the batch becomes a [`CommitJob`].
#[derive(Default)]
struct Staged {
    /// The batch's own index changes.
    wb: WriteBatch,
    /// The batch's changes as the writer's lookups see them.
    pending: Pending,
    /// Records to write, at their device offsets.
    writes: Vec<(AlignedBuf, u64)>,
    replies: Vec<Reply>,
    /// Some command needs everything acknowledged so far on stable media.
    sync: bool,
    puts: u64,
    /// Index entries of the batch's new blocks (for the next checkpoint).
    new_entries: Vec<(Vec<u8>, BlockLoc)>,
    /// Some change cannot be recovered from the tail: the batch is a checkpoint.
    needs_checkpoint: bool,
    /// Where the batch's first record begins (region, offset).
    first_record: Option<(u32, u32)>,
    forget: Vec<Vec<u8>>,
    forget_ns: Vec<u32>,
    /// The batch's presence changes, applied in order once its index write is done.
    presence: Vec<presence::Change>,
}

/// A new block or value as [`Writer::admit_new`] checks it.
struct NewPut<'a> {
    ns: &'a Namespace,
    bkey: &'a [u8],
    len: u32,
    crc: u32,
    durability: Durability,
}

/// The column families a batch writes: blocks, by-region, quarantine.
type BatchCfs<'a> = (
    &'a rocksdb::ColumnFamily,
    &'a rocksdb::ColumnFamily,
    &'a rocksdb::ColumnFamily,
);

/// Most sealed regions one commit's reclaim looks at.
const RECLAIM_TRIES_MAX: usize = 16;

fn count_written(core: &Core, bytes: u64) {
    core.counters
        .device_written_bytes
        .fetch_add(bytes, Ordering::Relaxed);
    core.metrics.device_written_bytes.inc_by(bytes);
}

/// Puts between two checkpoints at most.
pub const CHECKPOINT_ENTRIES_MAX: usize = 4096;

/// Batches queued before the committer: the writer runs at most this far ahead of it, so
/// up to this many batches' record writes are in flight at once. A flash device answers
/// more writes at once at little more latency each (`RWF_DSYNC` 64 KiB writes here: 140 µs
/// one at a time, 230 µs four at a time, 560 µs sixteen at a time; 7, 17 and 29 thousand
/// a second); at 2 the writer waited ~110 µs a batch for room and small durable puts
/// queued behind it. Memory stays bounded by the node's ingest budget.
const COMMIT_QUEUE_DEPTH: usize = 8;

impl Writer {
    pub fn new(core: Arc<Core>) -> anyhow::Result<Writer> {
        let regions = super::recovery::load_regions(&core.index, &core.geometry)?;
        let tiers = tiers::load(&core, &regions);
        let core_move_budget = core.cfg.tier_move_bytes_per_s.0;
        let overlay = Arc::new(Mutex::new(VecDeque::new()));
        let (commit_tx, commit_rx) = mpsc::channel(COMMIT_QUEUE_DEPTH);
        let committer = tokio::spawn(committer(core.clone(), overlay.clone(), commit_rx));
        let w = Writer {
            overlay,
            commit_tx,
            core,
            regions,
            tiers,
            budget: promote::MoveBudget::new(core_move_budget),
            touched: BTreeSet::new(),
            transition: false,
            uncheckpointed: Vec::new(),
            batches: 0,
            committer: Some(committer),
        };
        w.publish();
        Ok(w)
    }

    pub async fn run(mut self, mut rx: mpsc::Receiver<WriteCmd>) {
        let max_blocks = self.core.cfg.group_commit_max_blocks;
        let max_bytes = self.core.cfg.group_commit_max_bytes.0 as usize;
        while let Some(first) = self.next_cmd(&mut rx).await {
            let mut stop = None;
            let mut cmds = Vec::new();
            let mut bytes = 0;
            let mut next = Some(first);
            while let Some(cmd) = next.take() {
                match cmd {
                    WriteCmd::Stop(tx) => {
                        stop = Some(tx);
                        break;
                    }
                    WriteCmd::Put(ref p) => bytes += p.record.len(),
                    WriteCmd::Extent(ref x) => bytes += x.record.len(),
                    _ => {}
                }
                cmds.push(cmd);
                if cmds.len() >= max_blocks || bytes >= max_bytes {
                    break;
                }
                next = rx.try_recv().ok();
            }
            if !cmds.is_empty() {
                self.commit(cmds).await;
            }
            if let Some(tx) = stop {
                self.shutdown_checkpoint().await;
                self.end_committer().await;
                let _ = tx.send(());
                return;
            }
        }
        self.shutdown_checkpoint().await;
        self.end_committer().await;
    }

    /// Ends the commit pipeline (its tasks hold the engine's core, and with it the index
    /// open): the committer's queue closed, then the committer awaited.
    async fn end_committer(self) {
        let Writer {
            commit_tx,
            committer,
            ..
        } = self;
        drop(commit_tx);
        if let Some(c) = committer {
            let _ = c.await;
        }
    }

    /// At a clean stop: everything committed, then one synced checkpoint, so that the next
    /// start has no tail to scan.
    async fn shutdown_checkpoint(&mut self) {
        self.drain_committer().await;
        if self.core.failed.load(Ordering::SeqCst) {
            return;
        }
        // The checkpoint makes every entry durable: `fast` records must be durable first.
        if let Err(e) = self.core.device.flush().await {
            self.core.fail("device flush at shutdown", &e.into());
            return;
        }
        let mut wb = WriteBatch::default();
        self.put_touched(&mut wb);
        let earlier = self.take_checkpoint();
        let r = earlier
            .map_or(Ok(()), |e| {
                self.core
                    .index
                    .write(e, index::WriteMode::Wal { sync: false })
            })
            .and_then(|()| {
                self.core
                    .index
                    .write(wb, index::WriteMode::Wal { sync: true })
            });
        if let Err(e) = r {
            self.core.fail("checkpoint at shutdown", &e);
        }
    }

    /// The entries of every put since the last checkpoint, as one batch (None if none), and
    /// the start of a new checkpoint interval.
    fn take_checkpoint(&mut self) -> Option<WriteBatch> {
        self.transition = false;
        if self.uncheckpointed.is_empty() {
            return None;
        }
        let cf_blocks = self.core.index.cf(index::CF_BLOCKS);
        let cf_br = self.core.index.cf(index::CF_BY_REGION);
        let mut wb = WriteBatch::default();
        for (bkey, loc) in self.uncheckpointed.drain(..) {
            wb.put_cf(cf_blocks, &bkey, loc.encode());
            wb.put_cf(cf_br, by_region_key(loc.region, loc.offset), &bkey);
        }
        Some(wb)
    }

    /// After the device refused a write for lack of space: once every batch is answered,
    /// re-reads the open region's tail and the region table as a restart would, and starts
    /// over from them (with a new committer). Records of failed batches stay garbage past
    /// the tail, under an old epoch.
    async fn reopen(&mut self) -> anyhow::Result<()> {
        self.drain_committer().await;
        let stop_at = *self.core.no_space.lock();
        // Entries of puts since the last checkpoint are in the index (without the WAL);
        // the tail scan finds their records again.
        super::recovery::reopen_after_no_space(&self.core, stop_at).await?;
        // The index as re-read is the truth (failed batches changed neither it nor the
        // presence set; the tail scan may have re-indexed records).
        self.core.presence.rebuild(&self.core.index)?;
        *self = Writer::new(self.core.clone())?;
        self.publish();
        *self.core.no_space.lock() = None;
        tracing::info!("writes resume after the device was full");
        Ok(())
    }

    /// Waits until every batch handed to the committer is committed.
    async fn drain_committer(&mut self) {
        let (tx, rx) = oneshot::channel();
        if self.commit_tx.send(CommitMsg::Drain(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }

    /// Lookup through the batch's own pending changes, the uncommitted batches, the index.
    fn lookup(
        &self,
        pending: &HashMap<Vec<u8>, Option<BlockLoc>>,
        bkey: &[u8],
    ) -> anyhow::Result<Option<BlockLoc>> {
        if let Some(p) = pending.get(bkey) {
            return Ok(*p);
        }
        if let Some(p) = self.overlay.lock().iter().rev().find_map(|b| b.get(bkey)) {
            return Ok(*p);
        }
        self.core.index.get_block(bkey)
    }

    fn put_touched(&mut self, wb: &mut WriteBatch) {
        let cf = self.core.index.cf(index::CF_REGIONS);
        for r in std::mem::take(&mut self.touched) {
            wb.put_cf(cf, r.to_be_bytes(), self.regions[r as usize].encode());
        }
    }

    fn account(&self, ns: &Namespace, len: u32, add: bool) {
        let c = &self.core.counters;
        if add {
            ns.used_bytes.fetch_add(len as u64, Ordering::Relaxed);
            ns.blocks.fetch_add(1, Ordering::Relaxed);
            c.live_bytes.fetch_add(len as u64, Ordering::Relaxed);
            c.blocks.fetch_add(1, Ordering::Relaxed);
        } else {
            ns.used_bytes.fetch_sub(len as u64, Ordering::Relaxed);
            ns.blocks.fetch_sub(1, Ordering::Relaxed);
            c.live_bytes.fetch_sub(len as u64, Ordering::Relaxed);
            c.blocks.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// A block leaves the index at reclaim (into `wb`): counted, announced, out of the
    /// presence set. Its DRAM copy goes once `wb` is written.
    fn evict_entry(&self, wb: &mut WriteBatch, bkey: &[u8], loc: &BlockLoc) {
        let core = &self.core;
        wb.delete_cf(core.index.cf(index::CF_BLOCKS), bkey);
        self.account_bkey(bkey, loc);
        core.counters.evicted_blocks.fetch_add(1, Ordering::Relaxed);
        core.metrics.evicted_blocks.inc();
        core.events.block(bkey, KvEventKind::Evicted);
        core.presence.remove(bkey);
    }

    /// The block `bkey` (entry `loc`), leaving the index, taken off its namespace's
    /// compression counts: its record, or a large value's compressed extents (its manifest,
    /// still in the index, read for them).
    fn uncount_compressed(&self, ns: &Namespace, bkey: &[u8], loc: &BlockLoc) {
        if loc.extents == 0 {
            return ns.count_compressed(loc, false);
        }
        if let Ok(Some(m)) = self.core.index.get_manifest(bkey) {
            if m.head.seq == loc.seq {
                for x in &m.extents {
                    ns.count_compressed(&x.record_loc(&m.head), false);
                }
            }
        }
    }

    /// A block (entry `loc`) leaves the index: taken off its namespace's counts and the node's.
    fn account_bkey(&self, bkey: &[u8], loc: &BlockLoc) {
        let len = loc.len;
        let id = u32::from_be_bytes(
            bkey[..4]
                .try_into()
                .expect("block keys start with a namespace id"),
        );
        if let Some(ns) = self.core.ns_by_id(id) {
            self.account(&ns, len, false);
            self.uncount_compressed(&ns, bkey, loc);
        } else {
            let c = &self.core.counters;
            c.live_bytes.fetch_sub(len as u64, Ordering::Relaxed);
            c.blocks.fetch_sub(1, Ordering::Relaxed);
        }
    }

    async fn commit(&mut self, cmds: Vec<WriteCmd>) {
        let started = Instant::now();
        if !self.ready_for_batch().await {
            for cmd in cmds {
                reply_failed(cmd);
            }
            return;
        }
        // Promotions first, over committed state; the batch's other commands after them.
        let (promotes, cmds): (Vec<WriteCmd>, Vec<WriteCmd>) = cmds
            .into_iter()
            .partition(|c| matches!(c, WriteCmd::Promote { .. }));
        for cmd in promotes {
            let WriteCmd::Promote { bkeys, reply } = cmd else {
                continue;
            };
            match self.promote_now(&bkeys, promote::Room::Make).await {
                Ok(fates) => drop(reply.send(Ok(fates))),
                Err(e) => {
                    self.core.fail("promotion", &e);
                    let _ = reply.send(Err(EngineError::Internal(e)));
                }
            }
        }
        if cmds.is_empty() {
            return;
        }
        let core = self.core.clone();
        let cfs = (
            core.index.cf(index::CF_BLOCKS),
            core.index.cf(index::CF_BY_REGION),
            core.index.cf(index::CF_QUARANTINE),
        );
        let mut b = Staged::default();
        for cmd in cmds {
            match cmd {
                WriteCmd::Put(p) => self.stage_put(&mut b, cfs, p),
                WriteCmd::Extent(x) => self.stage_extent(&mut b, x),
                WriteCmd::Publish(p) => self.stage_publish(&mut b, cfs, p),
                WriteCmd::Delete { ns, bkey, reply } => {
                    self.stage_delete(&mut b, cfs, ns, bkey, reply);
                }
                WriteCmd::Quarantine { bkey, loc } => self.stage_quarantine(&mut b, cfs, bkey, loc),
                WriteCmd::DropNamespace { ns, reply } => {
                    self.stage_drop_namespace(&mut b, cfs, ns, reply);
                }
                WriteCmd::Barrier(reply) => {
                    b.sync = true;
                    b.replies.push(Reply::Done(reply));
                }
                WriteCmd::Stop(_) => unreachable!("run() handles Stop"),
                WriteCmd::Promote { .. } => unreachable!("handled before the batch"),
            }
        }
        let written: u64 = b.writes.iter().map(|(buf, _)| buf.len() as u64).sum();
        let first = b.first_record;
        // A batch with a durable put writes its records durable (RWF_DSYNC): each is on
        // stable media when its write completes, and the batch needs no flush of its own.
        // The writes run on while the writer takes the next batch: the committer awaits them,
        // in batch order, before anything of this batch is flushed, indexed or answered.
        let io = self.submit_writes(b.writes, b.sync);
        let checkpoint = b.needs_checkpoint
            || self.transition
            || self.uncheckpointed.len() + b.new_entries.len() >= CHECKPOINT_ENTRIES_MAX;
        let earlier = if checkpoint {
            self.put_touched(&mut b.wb);
            self.take_checkpoint()
        } else {
            self.uncheckpointed.extend(b.new_entries);
            None
        };
        self.publish();
        self.overlay.lock().push_back(b.pending);
        self.batches += 1;
        let job = CommitJob {
            batch: self.batches,
            io,
            first,
            no_space: false,
            checkpoint: checkpoint.then(|| earlier.unwrap_or_default()),
            wb: b.wb,
            replies: b.replies,
            forget: b.forget,
            forget_ns: b.forget_ns,
            presence: b.presence,
            sync: b.sync,
            durable_writes: b.sync,
            written,
            puts: b.puts,
            started,
        };
        self.hand_to_committer(job).await;
    }

    /// Whether the writer takes a batch at all: not once the node failed, nor when no
    /// region could be reclaimed (the node then fails). After the device was full, it first
    /// re-reads its state.
    async fn ready_for_batch(&mut self) -> bool {
        if self.core.failed.load(Ordering::SeqCst) {
            return false;
        }
        if self.core.no_space.lock().is_some() {
            if let Err(e) = self.reopen().await {
                self.core
                    .fail("re-reading state after the device was full", &e);
            }
        }
        if let Err(e) = self.ensure_free().await {
            self.core.fail("region reclaim", &e);
            return false;
        }
        true
    }

    /// A put of the batch: answered at once when it cannot be stored (namespace deleted,
    /// lookup failed, quota, no free region) or is there already; otherwise placed in the
    /// open region, indexed into the batch and queued for writing.
    fn stage_put(&mut self, b: &mut Staged, cfs: BatchCfs<'_>, mut p: PutReq) {
        let new = NewPut {
            ns: &p.ns,
            bkey: &p.bkey,
            len: p.len,
            crc: p.crc,
            durability: p.durability,
        };
        let Some(reply) = self.admit_new(b, new, p.reply) else {
            return;
        };
        p.reply = reply;
        let (region, offset) = match self.alloc_put(p.record.len()) {
            Ok(Some(place)) => place,
            Ok(None) => {
                let _ = p.reply.send(Err(EngineError::NoSpace(
                    "no free region: every region holds leased blocks".into(),
                )));
                return;
            }
            Err(e) => {
                let _ = p.reply.send(Err(e.into()));
                return;
            }
        };
        let loc = self.stamp_record(&mut p, region, offset);
        b.wb.put_cf(cfs.0, &p.bkey, loc.encode());
        b.wb.put_cf(cfs.1, by_region_key(region, offset), &p.bkey);
        b.presence.push(presence::Change::Insert(p.bkey.clone()));
        b.new_entries.push((p.bkey.clone(), loc));
        b.pending.insert(p.bkey, Some(loc));
        self.account(&p.ns, p.len, true);
        b.sync |= p.durability == Durability::Durable;
        b.puts += 1;
        b.first_record.get_or_insert((region, offset));
        b.writes
            .push((p.record, self.core.dev_offset(region, offset)));
        b.replies.push(Reply::Put(p.reply, Ok(PutStatus::Created)));
    }

    /// What every new block or value passes in the writer: its namespace not deleted, its
    /// key not held (else `Exists` or `Conflict` answered), its namespace's quota. The
    /// reply back when the put may go on; `None` when it was answered.
    fn admit_new(
        &self,
        b: &mut Staged,
        p: NewPut<'_>,
        reply: oneshot::Sender<Result<PutStatus>>,
    ) -> Option<oneshot::Sender<Result<PutStatus>>> {
        if p.ns.deleted.load(Ordering::SeqCst) {
            let _ = reply.send(Err(EngineError::NotFound(format!(
                "namespace {:?} was deleted",
                p.ns.name
            ))));
            return None;
        }
        let existing = match self.lookup(&b.pending, p.bkey) {
            Ok(e) => e,
            Err(e) => {
                let _ = reply.send(Err(e.into()));
                return None;
            }
        };
        if let Some(loc) = existing {
            b.sync |= p.durability == Durability::Durable;
            let r = if loc.crc32c == p.crc && loc.len == p.len {
                Ok(PutStatus::Exists)
            } else {
                Err(EngineError::Conflict)
            };
            b.replies.push(Reply::Put(reply, r));
            return None;
        }
        if let Some(q) = p.ns.limit() {
            if p.ns.used_bytes.load(Ordering::Relaxed) + p.len as u64 > q {
                let _ = reply.send(Err(EngineError::Quota(format!(
                    "namespace {} is at its quota",
                    p.ns.name
                ))));
                return None;
            }
        }
        Some(reply)
    }

    /// The index entry of a put placed at (`region`, `offset`); its record's header gets
    /// that region's tail epoch.
    fn stamp_record(&self, p: &mut PutReq, region: u32, offset: u32) -> BlockLoc {
        let loc = BlockLoc {
            region,
            offset,
            record_len: p.record.len() as u32,
            len: p.len,
            crc32c: p.crc,
            key_id: p.key_id,
            seq: p.seq,
            stored_ms: super::now_ms(),
            extents: 0,
        };
        record::stamp_region_epoch(
            &mut p.record[..record::HEADER_BYTES],
            self.regions[region as usize].tail_epoch,
        );
        debug_assert!(
            RecordHeader::decode(&p.record[..record::HEADER_BYTES]).is_ok_and(|h| {
                h.seq == loc.seq
                    && h.len == loc.len
                    && h.crc32c == loc.crc32c
                    && h.key_id == loc.key_id
                    && h.region_epoch == self.regions[region as usize].tail_epoch
            }),
            "a record's header, as written, decodes to what the index says of it"
        );
        loc
    }
}
