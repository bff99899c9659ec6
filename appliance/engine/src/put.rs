//! The put path up to the writer (`put`, `put_staged`: the record sealed in place, handed
//! to the writer's queue) and deletes.

use super::*;

impl Engine {
    /// Stores a block (copied into a staging buffer). See [`Engine::put_staged`].
    pub async fn put(
        &self,
        ns: &str,
        key: &[u8],
        data: Bytes,
        client_crc: Option<u32>,
        durability: Durability,
    ) -> Result<PutStatus> {
        Self::check_key(key)?;
        let staged = StagedBlock::copy_of(&data)?;
        self.put_staged(ns, key, staged, client_crc, durability)
            .await
    }

    /// Stores a block. `client_crc`, when given, must match the body.
    pub async fn put_staged(
        &self,
        ns: &str,
        key: &[u8],
        staged: StagedBlock,
        client_crc: Option<u32>,
        durability: Durability,
    ) -> Result<PutStatus> {
        Self::check_key(key)?;
        self.check_writable(&staged)?;
        let len = staged.len();
        let ns = self.ns(ns)?;
        let bkey = block_key(ns.id, key);
        self.reference(&bkey, len);
        let existing = self.core.index.get_block(&bkey)?;
        // Counted from here until the writer answered, so the pod's ledger is asked for
        // every byte on its way.
        let _pending = (existing.is_none() && ns.quota_bytes().is_some())
            .then(|| Pending::new(ns.clone(), len as u64));
        if existing.is_none() {
            self.check_quota(&ns, len).await?;
        }
        let seq = if existing.is_none() {
            self.core.next_seqs(record::seqs_for(len))?
        } else {
            0
        };
        if existing.is_none() {
            self.rotate_if_worn(&ns, seq).await?;
        }
        let (key_id, dek) = ns
            .current_key()
            .ok_or_else(|| anyhow::anyhow!("namespace {} has no current data key", ns.name))?;
        // The body's CRC32C was computed inline with its landing copy; the AEAD engine seals
        // it: the request thread only hands the buffer over.
        let crc = staged.crc32c();
        if client_crc.is_some_and(|c| c != crc) {
            return Err(EngineError::Integrity(format!(
                "body CRC32C is {crc:08x}, not the {:08x} the client sent",
                client_crc.unwrap_or_default()
            )));
        }
        let prep = if existing.is_some() {
            PutPrep::Crc(crc)
        } else {
            let (ns_id, key2, salt) = (ns.id, key.to_vec(), self.core.nonce_salt);
            let record = if self.core.geometry.plaintext_at_rest {
                // Nothing to seal: the header is written here, with no trip to the AEAD
                // engine.
                staged.seal(ns_id, (key_id, None), &key2, (seq, salt), crc, None)
            } else {
                self.core
                    .offload
                    .aead(len, move || {
                        staged.seal(ns_id, (key_id, Some(&dek)), &key2, (seq, salt), crc, None)
                    })
                    .await?
            };
            PutPrep::Record(crc, record)
        };
        let (crc, record) = match prep {
            PutPrep::Crc(crc) => {
                let loc = existing.expect("Crc only when the block exists");
                return self.confirm_existing(&loc, crc, len, durability).await;
            }
            PutPrep::Record(crc, record) => (crc, record),
        };
        let (tx, rx) = oneshot::channel();
        let cmd = WriteCmd::Put(writer::PutReq {
            ns: ns.clone(),
            bkey: bkey.clone(),
            len: len as u32,
            crc,
            key_id,
            seq,
            record,
            durability,
            reply: tx,
        });
        self.send(cmd)?;
        let status = rx
            .await
            .map_err(|_| anyhow::anyhow!("writer stopped before answering"))??;
        if status == PutStatus::Created {
            self.count_stored(&bkey, len);
        }
        Ok(status)
    }

    /// Refuses a put once the node failed (it accepts no writes) or when the staged body is
    /// incomplete.
    fn check_writable(&self, staged: &StagedBlock) -> Result<()> {
        self.check_not_failed()?;
        if !staged.is_complete() {
            return Err(EngineError::Invalid(
                "the block's body is incomplete".into(),
            ));
        }
        Ok(())
    }

    /// Refuses a write once the node failed (it accepts no writes).
    pub(crate) fn check_not_failed(&self) -> Result<()> {
        if self.core.failed.load(Ordering::SeqCst) {
            return Err(EngineError::Internal(anyhow::anyhow!(
                "the node failed a device write or flush and accepts no writes"
            )));
        }
        Ok(())
    }

    /// A new block of `len` bytes within its namespace's quota, if it has one: refused at
    /// once past the quota, otherwise asked of the pod's ledger (when there is one).
    pub(crate) async fn check_quota(&self, ns: &Arc<Namespace>, len: usize) -> Result<()> {
        if let Some(q) = ns.quota_bytes() {
            if ns.used_bytes.load(Ordering::Relaxed) + len as u64 > q {
                return Err(EngineError::Quota(format!(
                    "namespace {} is at its quota",
                    ns.name
                )));
            }
            if let Some(pod) = self.core.pod_quota.get() {
                pod.reserve(ns, len as u64).await?;
            }
        }
        Ok(())
    }

    /// A put of a block that exists (`loc`): `Exists` if the body is the same (once durable,
    /// when `durability` asks for it), `Conflict` otherwise.
    pub(crate) async fn confirm_existing(
        &self,
        loc: &BlockLoc,
        crc: u32,
        len: usize,
        durability: Durability,
    ) -> Result<PutStatus> {
        if loc.crc32c != crc || loc.len as usize != len {
            return Err(EngineError::Conflict);
        }
        // The stored copy may come from a `fast` put not yet flushed: a durable
        // re-put waits for the writer's next flush and sync.
        if durability == Durability::Durable && self.core.unsynced.load(Ordering::SeqCst) {
            let (tx, rx) = oneshot::channel();
            self.send(WriteCmd::Barrier(tx))?;
            rx.await
                .map_err(|_| anyhow::anyhow!("writer stopped before answering"))??;
        }
        Ok(PutStatus::Exists)
    }

    /// A new block stored: announced, and its bytes counted as written by users.
    pub(crate) fn count_stored(&self, bkey: &[u8], len: usize) {
        self.core.events.block(bkey, events::KvEventKind::Stored);
        self.core
            .counters
            .user_written_bytes
            .fetch_add(len as u64, Ordering::Relaxed);
        self.core.metrics.user_written_bytes.inc_by(len as u64);
    }

    /// True if the block existed and is now deleted.
    pub async fn delete(&self, ns: &str, key: &[u8]) -> Result<bool> {
        Self::check_key(key)?;
        let ns = self.ns(ns)?;
        let bkey = block_key(ns.id, key);
        let (tx, rx) = oneshot::channel();
        self.send(WriteCmd::Delete {
            ns: ns.clone(),
            bkey: bkey.clone(),
            reply: tx,
        })?;
        // The writer dropped the DRAM copy once the delete was in the index.
        let existed = rx
            .await
            .map_err(|_| anyhow::anyhow!("writer stopped before answering"))??;
        if existed {
            self.core.events.block(&bkey, events::KvEventKind::Deleted);
            if let (Some(pod), Some(_)) = (self.core.pod_quota.get(), ns.quota_bytes()) {
                // The delete stands; a grant not given back now goes at the next one.
                if let Err(e) = pod.released(&ns).await {
                    tracing::debug!(namespace = %ns.name, "quota grant not given back: {e}");
                }
            }
        }
        Ok(existed)
    }
}

/// A new block's bytes counted in [`Namespace::pending_bytes`] while it is on its way.
pub(crate) struct Pending(Arc<Namespace>, u64);

impl Pending {
    pub(crate) fn new(ns: Arc<Namespace>, len: u64) -> Pending {
        ns.pending_bytes.fetch_add(len, Ordering::SeqCst);
        Pending(ns, len)
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.0.pending_bytes.fetch_sub(self.1, Ordering::SeqCst);
    }
}
