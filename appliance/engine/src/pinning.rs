//! Leases as the engine's callers take them: pins until a time, holds for live prefetch
//! tickets, each charged to the node's and the tenant's leased bytes.

use super::*;

/// Keys a hold looks up on the calling task; more go to a blocking thread.
const HOLD_INLINE_KEYS: usize = 64;
impl Engine {
    /// Pins the present keys among `keys` for `ttl`; returns how many were pinned.
    pub async fn pin(&self, ns: &str, keys: Vec<Vec<u8>>, ttl: Duration) -> Result<u64> {
        let each = self.pin_each(ns, keys, ttl).await?;
        Ok(each.iter().filter(|p| **p).count() as u64)
    }

    /// Pins the present keys among `keys` for `ttl`; per key, whether it was present (and
    /// is now pinned).
    pub async fn pin_each(&self, ns: &str, keys: Vec<Vec<u8>>, ttl: Duration) -> Result<Vec<bool>> {
        let ns = self.ns(ns)?;
        let until = Instant::now() + ttl;
        for k in &keys {
            Self::check_key(k)?;
        }
        let mut each = Vec::with_capacity(keys.len());
        let owner = self.lease_owner(&ns.name);
        for k in keys {
            let bkey = block_key(ns.id, &k);
            let loc = self.core.index.get_block(&bkey)?;
            if let Some(loc) = &loc {
                let taken = self.core.leases.pin(
                    &bkey,
                    until,
                    loc.record_len as u64,
                    owner.as_ref().map(|(name, max)| leases::Owner {
                        name,
                        bytes_max: *max,
                    }),
                );
                if let Err(e) = taken {
                    self.lease_gauges();
                    return Err(self.lease_refused(e));
                }
                // A pinned prefix is about to be read: a hint to promote it.
                if self.core.in_dense(&bkey, loc)? {
                    self.core.hint_promote(&bkey, true);
                }
            }
            each.push(loc.is_some());
        }
        self.lease_gauges();
        Ok(each)
    }

    /// Holds the present keys among `keys` against eviction until the returned guard is
    /// dropped (a prefetch ticket's lease); per key, whether it is present and held. A key
    /// the lease table has no room for is reported absent.
    pub async fn hold(&self, ns: &str, keys: Vec<Bytes>) -> Result<(Held, Vec<bool>)> {
        for k in &keys {
            Self::check_key(k)?;
        }
        let ns = self.ns(ns)?;
        let core = self.core.clone();
        let owner = self.lease_owner(&ns.name);
        let n = keys.len();
        let look = move || -> Result<_> {
            let bkeys: Vec<Vec<u8>> = keys.iter().map(|k| block_key(ns.id, k)).collect();
            let mut held = Held {
                core: core.clone(),
                bkeys: Vec::new(),
            };
            let mut present = Vec::with_capacity(bkeys.len());
            for chunk in bkeys.chunks(256) {
                let locs = core.index.multi_get_blocks(chunk)?;
                for (bkey, loc) in chunk.iter().zip(locs) {
                    // A key the lease limits have no room for is a miss for the prefetch.
                    let ok = loc.is_some_and(|loc| {
                        core.leases
                            .hold(
                                bkey,
                                loc.record_len as u64,
                                owner.as_ref().map(|(name, max)| leases::Owner {
                                    name,
                                    bytes_max: *max,
                                }),
                            )
                            .map_err(|e| {
                                core.metrics
                                    .lease_refusals
                                    .with_label_values(&[e.reason()])
                                    .inc();
                            })
                            .is_ok()
                    });
                    if ok {
                        held.bkeys.push(bkey.clone());
                        // A prefetched block is about to be read: a hint to promote it.
                        if let Some(l) = loc {
                            if core.in_dense(bkey, &l)? {
                                core.hint_promote(bkey, true);
                            }
                        }
                    }
                    present.push(ok);
                }
            }
            Ok((held, present))
        };
        // A few keys are looked up here, as a read looks up its one (the index's blocks
        // are cached); the hand-off to a blocking thread cost more than the lookups (a
        // one-block prefetch took 4× a MATCH on 2 cores). Long lists go to one.
        let (held, present) = if n <= HOLD_INLINE_KEYS {
            look()?
        } else {
            tokio::task::spawn_blocking(look)
                .await
                .map_err(|e| anyhow::anyhow!("hold task: {e}"))??
        };
        self.lease_gauges();
        Ok((held, present))
    }

    /// Who the leases of namespace `name` are charged to (its tenant, for a tenant's
    /// `tenant/ns`), and how many bytes that tenant may lease.
    pub(crate) fn lease_owner(&self, name: &str) -> Option<(Arc<str>, u64)> {
        let (tenant, _) = name.split_once('/')?;
        Some((
            Arc::from(tenant),
            self.core.cfg.tenant_leased_bytes_max(tenant),
        ))
    }

    /// A refused pin: the lease table full is BUSY (503); the node's leased bytes at their
    /// limit is 507 `no_space` (leases hold the device); a tenant's, 403 `quota`.
    pub(crate) fn lease_refused(&self, e: leases::LeaseRefused) -> EngineError {
        self.core
            .metrics
            .lease_refusals
            .with_label_values(&[e.reason()])
            .inc();
        match e {
            leases::LeaseRefused::Table => EngineError::Busy("lease table"),
            leases::LeaseRefused::NodeBytes => EngineError::NoSpace(format!(
                "pinned and held blocks take leased_bytes_max ({} bytes)",
                self.core.cfg.leased_bytes_max()
            )),
            leases::LeaseRefused::OwnerBytes(t) => EngineError::Quota(format!(
                "tenant {t}'s pinned and held blocks take its leased_bytes_max ({} bytes)",
                self.core.cfg.tenant_leased_bytes_max(&t)
            )),
        }
    }

    pub(crate) fn lease_gauges(&self) {
        let m = &self.core.metrics;
        m.leases.set(self.core.leases.len() as i64);
        m.leased_bytes.set(self.core.leases.bytes() as i64);
    }

    /// Moves the present keys among `keys` into the fast tier now, as the move budget and
    /// the fast tier's room allow (its oldest regions are demoted to make room); each key's
    /// outcome. On a node of one tier every present key is [`Promotion::Fast`].
    pub async fn promote(&self, ns: &str, keys: Vec<Vec<u8>>) -> Result<Vec<Promotion>> {
        for k in &keys {
            Self::check_key(k)?;
        }
        let ns = self.ns(ns)?;
        let bkeys = keys.iter().map(|k| block_key(ns.id, k)).collect();
        let (tx, rx) = oneshot::channel();
        self.writer_tx
            .send(WriteCmd::Promote { bkeys, reply: tx })
            .await
            .map_err(|_| anyhow::anyhow!("the writer stopped"))?;
        rx.await
            .map_err(|_| anyhow::anyhow!("the writer dropped a promotion"))?
    }

    pub async fn unpin(&self, ns: &str, keys: Vec<Vec<u8>>) -> Result<u64> {
        let each = self.unpin_each(ns, keys).await?;
        Ok(each.iter().filter(|p| **p).count() as u64)
    }

    /// Ends the pins of `keys`; per key, whether it was pinned.
    pub async fn unpin_each(&self, ns: &str, keys: Vec<Vec<u8>>) -> Result<Vec<bool>> {
        let ns = self.ns(ns)?;
        for k in &keys {
            Self::check_key(k)?;
        }
        let each = keys
            .iter()
            .map(|k| self.core.leases.unpin(&block_key(ns.id, k)))
            .collect();
        self.core.metrics.leases.set(self.core.leases.len() as i64);
        Ok(each)
    }
}
