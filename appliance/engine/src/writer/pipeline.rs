//! The commit pipeline behind the writer: the committer (waits for a batch's record writes,
//! flushes when a command or a checkpoint needs earlier `fast` records on stable media) and
//! the indexer (writes the batch's index changes, then answers its commands), batches in
//! order.

use super::*;

/// The commit pipeline, two stages in order: the flusher waits for each batch's record
/// writes and makes the device durable for the batch if it needs it, the indexer writes the
/// batch's RocksDB batch and answers. The writes of batch k+1 overlap those of batch k, its
/// flush the index sync of batch k-1: a batch's writes only have to precede its own flush
/// and index write, and batches are answered in order, so an acknowledged batch never
/// follows a hole.
pub(crate) async fn committer(
    core: Arc<Core>,
    overlay: Arc<Mutex<VecDeque<Pending>>>,
    mut rx: mpsc::Receiver<CommitMsg>,
) {
    let (tx, irx) = mpsc::channel(COMMIT_QUEUE_DEPTH);
    let indexer = tokio::spawn(indexer(core.clone(), overlay, irx));
    // Records written, not durable, since the last flush (`fast` batches).
    let mut dirty = false;
    let mut last_batch: Option<u64> = None;
    while let Some(mut msg) = rx.recv().await {
        if let CommitMsg::Job(job) = &mut msg {
            debug_assert!(
                last_batch.is_none_or(|l| job.batch == l + 1),
                "the committer takes batches in the order the writer made them"
            );
            last_batch = Some(job.batch);
            if let Some(io) = job.io.take() {
                let failed = match io.await {
                    Ok(results) => results
                        .into_iter()
                        .find_map(|(_, r)| r.err())
                        .map(anyhow::Error::from),
                    Err(e) => Some(anyhow::anyhow!("device write task: {e}")),
                };
                let full = |e: &anyhow::Error| {
                    e.downcast_ref::<std::io::Error>()
                        .and_then(|e| e.raw_os_error())
                        == Some(libc::ENOSPC)
                };
                match failed {
                    // The batch and every one behind it (written after a hole) are answered
                    // 507; the writer re-reads its state before the next batch.
                    Some(e) if full(&e) => {
                        let mut ns = core.no_space.lock();
                        if ns.is_none() {
                            tracing::warn!("the device is full: puts answer 507 until it has room");
                            *ns = Some(job.first.unwrap_or((u32::MAX, 0)));
                        }
                    }
                    // The indexer sees the node failed and answers the batch with errors.
                    Some(e) => core.fail("device write", &e),
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
                    // The indexer sees the node failed and answers the batch with errors.
                    Err(e) => core.fail("device flush", &e.into()),
                }
            }
        }
        if tx.send(msg).await.is_err() {
            break;
        }
    }
    drop(tx);
    let _ = indexer.await;
}

pub(crate) async fn indexer(
    core: Arc<Core>,
    overlay: Arc<Mutex<VecDeque<Pending>>>,
    mut rx: mpsc::Receiver<CommitMsg>,
) {
    let mut last_batch: Option<u64> = None;
    while let Some(msg) = rx.recv().await {
        match msg {
            CommitMsg::Drain(tx) => drop(tx.send(())),
            CommitMsg::Job(job) => {
                debug_assert!(
                    last_batch.is_none_or(|l| job.batch == l + 1),
                    "batches are indexed and answered in the order the writer made them"
                );
                last_batch = Some(job.batch);
                commit_index(&core, job).await;
                overlay.lock().pop_front();
            }
        }
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
