//! Key rotation: a namespace's data key (on request, or once worn), and the KEK (every
//! data key re-wrapped in one synced write).

use super::*;

impl Engine {
    /// Makes a new data key current for namespace `name`: new writes use it, records under
    /// older keys stay readable by their key id. Returns the new key id.
    pub async fn rotate_data_key(&self, name: &str) -> Result<u32> {
        let _g = self.ns_lock.lock().await;
        let ns = self.ns(name)?;
        let next = self.core.seq.next.load(Ordering::Relaxed);
        self.rotate_locked(&ns, next, "requested")
    }

    /// Rotates `ns`'s data key if `seq` (a write about to be sealed) is
    /// `dek_rotate_after_writes` or more past the sequence number at which the key became
    /// current.
    pub(crate) async fn rotate_if_worn(&self, ns: &Arc<Namespace>, seq: u64) -> Result<()> {
        let limit = self.core.cfg.dek_rotate_after_writes.max(1);
        let worn = || seq.saturating_sub(ns.keys.read().since_seq) >= limit;
        if !worn() {
            return Ok(());
        }
        let _g = self.ns_lock.lock().await;
        // Another write may have rotated it while this one waited.
        if worn() && !ns.deleted.load(Ordering::SeqCst) {
            // This write is the new key's first.
            self.rotate_locked(ns, seq, "worn")?;
        }
        Ok(())
    }

    /// Under `ns_lock`: a fresh DEK, wrapped by the KEK, and the namespace's metadata naming
    /// it current from sequence number `from_seq` on, in one synced index write; then the
    /// in-memory switch.
    pub(crate) fn rotate_locked(&self, ns: &Namespace, from_seq: u64, why: &str) -> Result<u32> {
        let c = &self.core;
        let mut meta = ns.meta();
        let key_id = meta
            .key_id
            .checked_add(1)
            .ok_or_else(|| anyhow::anyhow!("namespace {} ran out of key ids", ns.name))?;
        let dek = crypto::random_key();
        meta.key_id = key_id;
        meta.key_seq = from_seq;
        let mut wb = rocksdb::WriteBatch::default();
        wb.put_cf(
            c.index.cf(index::CF_KEYS),
            index::keys_key(ns.id, key_id),
            crypto::wrap_dek(&c.kek.read(), ns.id, key_id, &dek),
        );
        wb.put_cf(
            c.index.cf(index::CF_NAMESPACES),
            &ns.name,
            serde_json::to_vec(&meta).map_err(anyhow::Error::from)?,
        );
        c.index.write(wb, index::WriteMode::Wal { sync: true })?;
        {
            let mut k = ns.keys.write();
            k.deks.insert(key_id, Arc::new(AeadKey::new(&dek)));
            k.current = key_id;
            k.since_seq = meta.key_seq;
        }
        c.metrics.dek_rotations.inc();
        tracing::info!(namespace = %ns.name, key_id, reason = why, "data key rotated");
        Ok(key_id)
    }

    /// Re-reads the key-encryption key file; if it holds a new KEK, re-wraps every data key
    /// of every namespace under it in one synced index write, then uses it. Returns how many
    /// data keys were re-wrapped (0: the file is unchanged). Until the write lands the old
    /// KEK stays in use; a node stopped before it needs `kek_previous_file` to start.
    pub async fn rotate_kek(&self) -> Result<usize> {
        let _g = self.ns_lock.lock().await;
        let c = &self.core;
        let path = c.cfg.kek_path();
        let bytes = recovery::read_kek(&path).map_err(EngineError::Internal)?;
        let fp = crypto::fingerprint(&bytes);
        if *c.kek_fingerprint.lock() == fp {
            return Ok(0);
        }
        let new = Arc::new(AeadKey::new(&bytes));
        let old = c.kek.read().clone();
        let n = recovery::rewrap_deks(&c.index, &new, Some(&old))?;
        *c.kek.write() = new;
        *c.kek_fingerprint.lock() = fp;
        c.metrics.kek_rotations.inc();
        tracing::info!(rewrapped = n, path = %path.display(), "key-encryption key rotated");
        Ok(n)
    }
}
