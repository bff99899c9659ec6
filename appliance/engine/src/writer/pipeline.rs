//! The commit stage behind the writer: the committer waits for a batch's record writes,
//! flushes when a command or a checkpoint needs earlier `fast` records on stable media,
//! writes the batch's index changes, then answers its commands; batches in order.

use super::*;

/// The committer: for each batch in order, its record writes awaited, the device made
/// durable for it if it needs that, its RocksDB batch written, its commands answered. The
/// writes of batch k+1 are in flight while batch k commits: a batch's writes only have to
/// precede its own flush and index write, and batches are answered in order, so an
/// acknowledged batch never follows a hole.
///
/// One task does all of it: an index write without the WAL is a memtable insert
/// (microseconds), so a second stage for it cost a hand-off per batch and bought nothing
/// but overlap with checkpoints (at most one per [`CHECKPOINT_ENTRIES_MAX`] puts).
pub(crate) async fn committer(
    core: Arc<Core>,
    overlay: Arc<Mutex<VecDeque<Pending>>>,
    mut rx: mpsc::Receiver<CommitMsg>,
) {
    // Records written, not durable, since the last flush (`fast` batches).
    let mut dirty = false;
    let mut last_batch: Option<u64> = None;
    while let Some(msg) = rx.recv().await {
        let mut job = match msg {
            CommitMsg::Drain(tx) => {
                let _ = tx.send(());
                continue;
            }
            CommitMsg::Job(job) => job,
        };
        debug_assert!(
            last_batch.is_none_or(|l| job.batch == l + 1),
            "the committer takes batches in the order the writer made them"
        );
        last_batch = Some(job.batch);
        if let Some(io) = job.io.take() {
            let failed = io.await.into_iter().find_map(|(_, r)| r.err());
            match failed {
                // The batch and every one behind it (written after a hole) are answered
                // 507; the writer re-reads its state before the next batch.
                Some(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                    let mut ns = core.no_space.lock();
                    if ns.is_none() {
                        tracing::warn!("the device is full: puts answer 507 until it has room");
                        *ns = Some(job.first.unwrap_or((u32::MAX, 0)));
                    }
                }
                // `commit_index` sees the node failed and answers the batch with errors.
                Some(e) => core.fail("device write", &e.into()),
                None => count_written(&core, job.written),
            }
        }
        if core.no_space.lock().is_some() {
            job.no_space = true;
        }
        dirty |= job.written > 0 && !job.durable_writes;
        // A durable batch is on stable media already, but `fast` records written before
        // it may not be: flush them, or a power loss could leave a hole in front of an
        // acknowledged record, where recovery's tail scan would stop. A checkpoint
        // makes index entries and write pointers durable: the records they point at
        // must be durable first.
        let needs_flush = (job.sync || job.checkpoint.is_some()) && !job.no_space;
        if needs_flush && dirty && !core.failed.load(Ordering::SeqCst) {
            let t = Instant::now();
            match core.device.flush().await {
                Ok(()) => {
                    dirty = false;
                    core.metrics.device_flushes.inc();
                    core.metrics
                        .flush_seconds
                        .observe(t.elapsed().as_secs_f64());
                }
                // `commit_index` sees the node failed and answers the batch with errors.
                Err(e) => core.fail("device flush", &e.into()),
            }
        }
        commit_index(&core, job).await;
        overlay.lock().pop_front();
    }
}

/// Index changes (a synced checkpoint, or entries without the WAL) → answers. Any failure,
/// or a failed flush before it, answers every command of the batch with an error; the node
/// is read-only.
pub(crate) async fn commit_index(core: &Arc<Core>, job: CommitJob) {
    if job.no_space && !core.failed.load(Ordering::SeqCst) {
        job.replies
            .into_iter()
            .for_each(|r| r.send_error(|| EngineError::NoSpace("the device is full".into())));
        return;
    }
    if core.failed.load(Ordering::SeqCst) {
        job.replies
            .into_iter()
            .for_each(|r| r.send_err("the node failed a device write or flush"));
        return;
    }
    if !job.sync && job.written > 0 {
        // Before the index makes these blocks visible: a durable re-put that finds one
        // must know to wait for a flush.
        core.unsynced.store(true, Ordering::SeqCst);
    }
    let t = Instant::now();
    let written = match job.checkpoint {
        // A synced RocksDB write blocks on fsync: off the async workers.
        Some(earlier) => {
            let (c2, wb) = (core.clone(), job.wb);
            tokio::task::spawn_blocking(move || {
                c2.index
                    .write(earlier, index::WriteMode::Wal { sync: false })?;
                c2.index.write(wb, index::WriteMode::Wal { sync: true })
            })
            .await
            .unwrap_or_else(|e| Err(anyhow::anyhow!("index write task: {e}")))
        }
        // Without the WAL a write is a memtable insert (microseconds): done here, where a
        // hand-off to a blocking thread and back would cost more than the write.
        None => core.index.write(job.wb, index::WriteMode::NoWal),
    };
    if let Err(e) = written {
        core.fail("index write", &e);
        job.replies
            .into_iter()
            .for_each(|r| r.send_err("index write failed"));
        return;
    }
    core.metrics
        .index_commit_seconds
        .observe(t.elapsed().as_secs_f64());
    core.presence.apply(&job.presence);
    if !job.forget.is_empty() || !job.forget_ns.is_empty() {
        core.dram_forget(job.forget.iter().map(Vec::as_slice), &job.forget_ns);
    }
    if job.sync {
        core.unsynced.store(false, Ordering::SeqCst);
    }
    job.replies.into_iter().for_each(Reply::send_ok);
    core.metrics.group_commit_blocks.observe(job.puts as f64);
    core.metrics
        .group_commit_seconds
        .observe(job.started.elapsed().as_secs_f64());
}

/// The writer's side of the pipeline: submitting a batch's record writes and handing the
/// batch to the committer.
impl Writer {
    /// Submits the batch's record writes, durable ones (`RWF_DSYNC`) when `durable`;
    /// `None` for a batch without records. Records that lie back to back on the device (a
    /// batch's do, up to the end of a region) go as one vectored write: one I/O and one
    /// durability point for a group commit instead of one per record.
    pub(super) fn submit_writes(
        &self,
        writes: Vec<(AlignedBuf, u64)>,
        durable: bool,
    ) -> Option<BatchWrites> {
        let dev = &self.core.device;
        // Counted per tier once per batch (a batch writes one or two tiers).
        let g = &self.core.geometry;
        let mut per_tier = [(0u32, 0u64); 2];
        for (buf, off) in &writes {
            let region = ((off - g.data_offset) / g.region_bytes) as u32;
            let slot = &mut per_tier[g.tier_of(region).min(1)];
            *slot = (region, slot.1 + buf.len() as u64);
        }
        for (region, bytes) in per_tier.into_iter().filter(|p| p.1 > 0) {
            self.core.count_tier_io(region, bytes, true);
        }
        let ios: Vec<_> = contiguous_runs(writes, VECTORED_BUFS_MAX)
            .into_iter()
            .map(|(off, bufs)| dev.write_vectored_at(bufs, off, durable))
            .collect();
        self.core.metrics.device_writes.inc_by(ios.len() as u64);
        (!ios.is_empty()).then(|| Box::pin(futures::future::join_all(ios)) as BatchWrites)
    }

    /// Hands a batch to the committer. Should the committer be gone, the batch leaves the
    /// overlay, the node fails and the batch's commands are answered with errors.
    pub(super) async fn hand_to_committer(&self, job: CommitJob) {
        if let Err(mpsc::error::SendError(CommitMsg::Job(job))) =
            self.commit_tx.send(CommitMsg::Job(job)).await
        {
            self.overlay.lock().pop_back();
            self.core
                .fail("commit", &anyhow::anyhow!("the committer task stopped"));
            job.replies
                .into_iter()
                .for_each(|r| r.send_err("the committer task stopped"));
        }
    }
}

pub(super) fn reply_failed(cmd: WriteCmd) {
    let e = || {
        EngineError::Internal(anyhow::anyhow!(
            "the node failed a device write or flush and accepts no writes"
        ))
    };
    match cmd {
        WriteCmd::Put(p) => drop(p.reply.send(Err(e()))),
        WriteCmd::Extent(x) => drop(x.reply.send(Err(e()))),
        WriteCmd::Publish(p) => drop(p.reply.send(Err(e()))),
        WriteCmd::Delete { reply, .. } => drop(reply.send(Err(e()))),
        WriteCmd::DropNamespace { reply, .. } => drop(reply.send(Err(e()))),
        WriteCmd::Barrier(reply) => drop(reply.send(Err(e()))),
        WriteCmd::Promote { reply, .. } => drop(reply.send(Err(e()))),
        WriteCmd::Quarantine { .. } => {}
        WriteCmd::Stop(tx) => drop(tx.send(())),
    }
}

/// `writes` (buffer, device offset) in runs of at most `max_bufs` buffers that lie back to
/// back: each run's offset and buffers, in the order given.
fn contiguous_runs(writes: Vec<(AlignedBuf, u64)>, max_bufs: usize) -> Vec<(u64, Vec<AlignedBuf>)> {
    let mut runs: Vec<(u64, u64, Vec<AlignedBuf>)> = Vec::new();
    for (buf, off) in writes {
        match runs.last_mut() {
            Some((_, end, bufs)) if *end == off && bufs.len() < max_bufs => {
                *end += buf.len() as u64;
                bufs.push(buf);
            }
            _ => runs.push((off, off + buf.len() as u64, vec![buf])),
        }
    }
    runs.into_iter().map(|(off, _, bufs)| (off, bufs)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(n: usize) -> AlignedBuf {
        AlignedBuf::zeroed(n * 4096)
    }

    #[test]
    fn back_to_back_writes_go_as_runs() {
        let shape = |runs: Vec<(u64, Vec<AlignedBuf>)>| -> Vec<(u64, Vec<usize>)> {
            runs.into_iter()
                .map(|(off, bufs)| (off, bufs.iter().map(|b| b.len() / 4096).collect()))
                .collect()
        };
        // Two back to back, a gap, then two more back to back; then one at a lower offset.
        let writes = vec![
            (page(1), 0),
            (page(2), 4096),
            (page(1), 5 * 4096),
            (page(3), 6 * 4096),
            (page(1), 4096),
        ];
        assert_eq!(
            shape(contiguous_runs(writes, 8)),
            vec![(0, vec![1, 2]), (5 * 4096, vec![1, 3]), (4096, vec![1])]
        );
        // A run is cut at `max_bufs`.
        let writes = (0..5).map(|i| (page(1), i * 4096)).collect();
        assert_eq!(
            shape(contiguous_runs(writes, 2)),
            vec![(0, vec![1, 1]), (2 * 4096, vec![1, 1]), (4 * 4096, vec![1])]
        );
        assert!(contiguous_runs(Vec::new(), 2).is_empty());
    }
}
