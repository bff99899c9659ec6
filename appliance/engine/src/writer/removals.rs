//! What leaves the index in a batch: deletes, quarantines, namespace drops. Each is a
//! checkpoint (the tail cannot tell of it).

use super::*;

impl Writer {
    /// A delete of the batch: the block leaves the index (a checkpoint), answered whether
    /// it was there.
    pub(super) fn stage_delete(
        &self,
        b: &mut Staged,
        cfs: BatchCfs<'_>,
        ns: Arc<Namespace>,
        bkey: Vec<u8>,
        reply: oneshot::Sender<Result<bool>>,
    ) {
        // After a drop of its namespace (earlier in this batch or one not yet written):
        // the block goes with the namespace, and was taken off the counts with it.
        if ns.deleted.load(Ordering::SeqCst) {
            let gone = EngineError::NotFound(format!("namespace {:?} was deleted", ns.name));
            return drop(reply.send(Err(gone)));
        }
        match self.lookup(&b.pending, &bkey) {
            Ok(Some(loc)) => {
                b.wb.delete_cf(cfs.0, &bkey);
                b.presence.push(presence::Change::Remove(bkey.clone()));
                b.needs_checkpoint = true;
                self.account(&ns, loc.len, false);
                self.uncount_compressed(&ns, &bkey, &loc);
                b.forget.push(bkey.clone());
                b.pending.insert(bkey, None);
                b.replies.push(Reply::Delete(reply, true));
            }
            Ok(None) => b.replies.push(Reply::Delete(reply, false)),
            Err(e) => drop(reply.send(Err(e.into()))),
        }
    }

    /// A quarantine of the batch: the block moves to the quarantine (a checkpoint) if the
    /// index still points at the record that failed its checks.
    pub(super) fn stage_quarantine(
        &self,
        b: &mut Staged,
        cfs: BatchCfs<'_>,
        bkey: Vec<u8>,
        loc: BlockLoc,
    ) {
        let id = u32::from_be_bytes(bkey[..4].try_into().expect("a namespace id"));
        if self
            .core
            .ns_by_id(id)
            .is_none_or(|ns| ns.deleted.load(Ordering::SeqCst))
        {
            // Its namespace is being dropped (or was): nothing left to quarantine.
            return;
        }
        if let Ok(Some(cur)) = self.lookup(&b.pending, &bkey) {
            if cur == loc {
                b.wb.delete_cf(cfs.0, &bkey);
                b.presence.push(presence::Change::Remove(bkey.clone()));
                b.wb.put_cf(cfs.2, &bkey, loc.encode());
                b.needs_checkpoint = true;
                self.account_bkey(&bkey, &loc);
                // Gone from this node as surely as an evicted block: KV
                // block managers drop it from their view.
                self.core.events.block(&bkey, KvEventKind::Evicted);
                b.forget.push(bkey.clone());
                b.pending.insert(bkey, None);
            }
        }
    }

    /// A namespace drop of the batch: its blocks, keys and name leave the index (a
    /// checkpoint, synced), its counts are taken off the node's.
    pub(super) fn stage_drop_namespace(
        &self,
        b: &mut Staged,
        cfs: BatchCfs<'_>,
        ns: Arc<Namespace>,
        reply: oneshot::Sender<Result<()>>,
    ) {
        ns.deleted.store(true, Ordering::SeqCst);
        let lo = ns.id.to_be_bytes();
        let hi = (ns.id + 1).to_be_bytes();
        b.wb.delete_range_cf(cfs.0, lo, hi);
        b.presence.push(presence::Change::DropNamespace(ns.id));
        b.forget_ns.push(ns.id);
        b.needs_checkpoint = true;
        b.wb.delete_range_cf(self.core.index.cf(index::CF_KEYS), lo, hi);
        b.wb.delete_cf(self.core.index.cf(index::CF_NAMESPACES), &ns.name);
        b.pending.retain(|k, _| k[..4] != lo);
        let c = &self.core.counters;
        c.live_bytes
            .fetch_sub(ns.used_bytes.swap(0, Ordering::Relaxed), Ordering::Relaxed);
        c.blocks
            .fetch_sub(ns.blocks.swap(0, Ordering::Relaxed), Ordering::Relaxed);
        ns.compressed_bytes.store(0, Ordering::Relaxed);
        ns.compressed_stored.store(0, Ordering::Relaxed);
        b.sync = true;
        b.replies.push(Reply::Done(reply));
    }
}
