//! Namespaces: created, changed, listed, deleted (crypto-shredded); their KV events.

use super::*;

impl Engine {
    /// KV events of namespace `ns` (see [`events`]): its id, to filter the node-wide stream
    /// by, and a receiver.
    pub fn subscribe(
        &self,
        ns: &str,
    ) -> Result<(u32, tokio::sync::broadcast::Receiver<events::KvEvent>)> {
        let ns = self.ns(ns)?;
        let rx = self.core.events.subscribe(ns.id).map_err(|_| {
            self.core
                .metrics
                .busy_rejections
                .with_label_values(&["events"])
                .inc();
            EngineError::Busy("event queues (event_queues_max)")
        })?;
        Ok((ns.id, rx))
    }

    /// Creates a namespace, or updates its quota if it exists. True when created.
    pub async fn create_namespace(
        &self,
        name: &str,
        quota_bytes: Option<u64>,
    ) -> Result<(bool, NamespaceInfo)> {
        self.create_namespace_with(
            name,
            NsSettings {
                quota_bytes,
                ..NsSettings::default()
            },
        )
        .await
    }

    /// Creates a namespace with these settings, or sets them if it exists. True when created.
    pub async fn create_namespace_with(
        &self,
        name: &str,
        settings: NsSettings,
    ) -> Result<(bool, NamespaceInfo)> {
        let NsSettings {
            quota_bytes,
            replication,
            incarnation,
            class,
            compression,
        } = settings;
        ctxpod_wire::namespace::check_scoped_name(name)
            .map_err(|e| EngineError::Invalid(e.to_string()))?;
        if let Some(r) = replication {
            if !(1..=ctxpod_wire::REPLICATION_MAX).contains(&r) {
                return Err(EngineError::Invalid(format!(
                    "replication must be within 1..={}",
                    ctxpod_wire::REPLICATION_MAX
                )));
            }
        }
        let _g = self.ns_lock.lock().await;
        let c = &self.core;
        let cf_ns = c.index.cf(index::CF_NAMESPACES);
        let existing = c.namespaces.read().get(name).cloned();
        if let Some(ns) = existing {
            NamespaceClass::settle(name, Some(ns.class), class).map_err(EngineError::Fixed)?;
            let incarnation = incarnation.or(ns.incarnation());
            if ns.quota_bytes() != quota_bytes
                || ns.replication() != replication
                || ns.incarnation() != incarnation
                || ns.compression() != compression
            {
                let meta = NsMeta {
                    quota_bytes,
                    replication,
                    incarnation,
                    compression,
                    ..ns.meta()
                };
                let mut wb = rocksdb::WriteBatch::default();
                wb.put_cf(
                    cf_ns,
                    name,
                    serde_json::to_vec(&meta).map_err(anyhow::Error::from)?,
                );
                c.index.write(wb, index::WriteMode::Wal { sync: true })?;
                ns.quota
                    .store(quota_bytes.unwrap_or(NO_QUOTA), Ordering::Relaxed);
                ns.replication
                    .store(replication.unwrap_or(0), Ordering::Relaxed);
                ns.incarnation
                    .store(incarnation.unwrap_or(0), Ordering::Relaxed);
                ns.compression
                    .store(compress::setting_code(compression), Ordering::Relaxed);
            }
            return Ok((false, ns.info()));
        }
        let id = match c.index.get_meta(index::META_NEXT_NS_ID)? {
            Some(v) => u32::from_le_bytes(
                v.as_slice()
                    .try_into()
                    .map_err(|_| anyhow::anyhow!("bad next_ns_id in the index"))?,
            ),
            None => 1,
        };
        let key_id = 1;
        let dek = crypto::random_key();
        let meta = NsMeta {
            id,
            quota_bytes,
            key_id,
            created_ms: now_ms(),
            key_seq: c.seq.next.load(Ordering::Relaxed),
            replication,
            incarnation,
            class: NamespaceClass::settle(name, None, class).map_err(EngineError::Fixed)?,
            compression,
        };
        let mut wb = rocksdb::WriteBatch::default();
        wb.put_cf(
            cf_ns,
            name,
            serde_json::to_vec(&meta).map_err(anyhow::Error::from)?,
        );
        wb.put_cf(
            c.index.cf(index::CF_KEYS),
            index::keys_key(id, key_id),
            crypto::wrap_dek(&c.kek.read(), id, key_id, &dek),
        );
        wb.put(index::META_NEXT_NS_ID, (id + 1).to_le_bytes());
        c.index.write(wb, index::WriteMode::Wal { sync: true })?;
        let ns = Arc::new(Namespace::new(
            name,
            &meta,
            HashMap::from([(key_id, Arc::new(AeadKey::new(&dek)))]),
        ));
        c.namespaces.write().insert(name.to_string(), ns.clone());
        c.ns_by_id.write().insert(ns.id, ns.clone());
        Ok((true, ns.info()))
    }

    /// Whether namespace `name` exists (`None`: no), and its incarnation in the pod.
    pub fn namespace_incarnation(&self, name: &str) -> Option<Option<u64>> {
        Some(self.core.namespaces.read().get(name)?.incarnation())
    }

    /// The copies namespace `name` asks for in the pod, if it exists and sets its own.
    pub fn namespace_replication(&self, name: &str) -> Option<u32> {
        self.core.namespaces.read().get(name)?.replication()
    }

    /// Hands the namespaces' quotas to the pod's ledger (once; later calls are ignored).
    pub fn set_pod_quota(&self, q: Arc<dyn PodQuota>) {
        let _ = self.core.pod_quota.set(q);
    }

    /// Hands the node's reads to the pod's fence (once; later calls are ignored).
    pub fn set_serve_gate(&self, g: Arc<dyn crate::ServeGate>) {
        let _ = self.core.serve_gate.set(g);
    }

    /// Whether reads of blocks are served now ([`crate::ServeGate`]; always without one).
    pub fn may_serve(&self) -> bool {
        self.core.serve_gate.get().is_none_or(|g| g.may_serve())
    }

    /// A namespace, for the pod's quota ledger.
    pub fn namespace_handle(&self, name: &str) -> Result<Arc<Namespace>> {
        self.ns(name)
    }

    pub fn namespace(&self, name: &str) -> Result<NamespaceInfo> {
        Ok(self.ns(name)?.info())
    }

    /// Bytes of live blocks in every namespace whose node-side name starts with `prefix`
    /// (`tenant/`: a tenant's usage, for its quota).
    pub fn used_bytes_under(&self, prefix: &str) -> u64 {
        self.core
            .namespaces
            .read()
            .iter()
            .filter(|(name, _)| name.starts_with(prefix))
            .map(|(_, n)| n.used_bytes.load(Ordering::Relaxed))
            .sum()
    }

    pub fn namespaces(&self) -> Vec<NamespaceInfo> {
        let mut v: Vec<_> = self
            .core
            .namespaces
            .read()
            .values()
            .map(|n| n.info())
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// Deletes a namespace: its data key is destroyed (crypto-shred) and its blocks freed.
    /// `default` is recreated at once, empty, with a new key.
    pub async fn delete_namespace(&self, name: &str) -> Result<()> {
        let _g = self.ns_lock.lock().await;
        let ns = self.ns(name)?;
        let (tx, rx) = oneshot::channel();
        self.send(WriteCmd::DropNamespace {
            ns: ns.clone(),
            reply: tx,
        })?;
        rx.await
            .map_err(|_| anyhow::anyhow!("writer stopped before answering"))??;
        self.core.namespaces.write().remove(name);
        self.core.ns_by_id.write().remove(&ns.id);
        self.core.events.namespace_deleted(ns.id);
        // The wrapped DEKs were deleted in the index; now out of its files too.
        let (core, id) = (self.core.clone(), ns.id);
        tokio::task::spawn_blocking(move || core.index.purge_keys(id))
            .await
            .map_err(|e| anyhow::anyhow!("purge task: {e}"))??;
        drop(_g);
        if name == ctxpod_wire::namespace::DEFAULT_NAMESPACE {
            self.create_namespace(name, None).await?;
        }
        Ok(())
    }
}
