//! How members reach each other over the simulated network: a routed block request asked
//! of a member ([`SimMember`], the pod's `coordinator::Member`) and the backfill's copies
//! ([`SimCopies`], the pod's `backfill::CopyTo`) and a listing's pages ([`SimPages`], the
//! pod's `listing::Pages`). A member cut from the asker either way is
//! a black hole (no answer within the caller's deadline), one that is down refuses the
//! connection at once, one that is reached serves the request from its engine, as its
//! node's handler would.

use crate::net::Net;
use crate::NS;
use bytes::Bytes;
use ctxpod_pod::coordinator::{self, Said, Unreached};
use ctxpod_pod::listing::PageError;
use ctxpod_pod::membership::MemberInfo;
use ctxpod_pod::tombstones::Tombstones;
use parking_lot::Mutex;
use std::sync::Arc;

/// A member that runs, as the others reach it.
#[derive(Clone)]
pub(crate) struct Reached {
    pub engine: Arc<ctxpod_engine::Engine>,
    /// Its pod's block deletes (a copy of a deleted block is refused).
    pub tombstones: Option<Arc<Tombstones>>,
}

/// The members that run now, by index (shared with the members' background work).
pub(crate) struct Running(Mutex<Vec<Option<Reached>>>);

impl Running {
    pub fn new(members: usize) -> Running {
        Running(Mutex::new(vec![None; members]))
    }

    pub fn set(&self, m: usize, up: Option<Reached>) {
        self.0.lock()[m] = up;
    }

    pub fn get(&self, m: usize) -> Option<Reached> {
        self.0.lock().get(m).cloned().flatten()
    }

    pub fn len(&self) -> usize {
        self.0.lock().len()
    }
}

/// One block request, as member `from` asks any member (the pod's
/// [`coordinator::Member`]); a reached member serves it from its engine (its fence
/// applies).
pub(crate) struct SimMember<'a> {
    pub running: &'a Running,
    pub net: &'a Net,
    pub from: usize,
    pub key: &'a [u8],
    pub op: Op,
    /// The members that stored a put.
    pub took: std::sync::Mutex<Vec<usize>>,
}

#[derive(Debug, Clone)]
pub(crate) enum Op {
    Get,
    Put(Bytes),
    Delete,
}

/// A member's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SimAnswer {
    Block(Bytes),
    Missing,
    Stored,
    Deleted { held: bool },
    Failed,
}

#[async_trait::async_trait]
impl coordinator::Member for SimMember<'_> {
    type Answer = SimAnswer;

    async fn ask(&self, t: &MemberInfo, mine: bool) -> Result<SimAnswer, Unreached> {
        self.ask_as(t, mine, false).await
    }

    async fn ask_recorded(&self, t: &MemberInfo, mine: bool) -> Result<SimAnswer, Unreached> {
        self.ask_as(t, mine, true).await
    }

    fn said(&self, a: &SimAnswer) -> Said {
        match a {
            SimAnswer::Block(_) => Said::Done { created: false },
            SimAnswer::Stored => Said::Done { created: true },
            SimAnswer::Deleted { held: true } => Said::Done { created: false },
            SimAnswer::Deleted { held: false } | SimAnswer::Missing => Said::NotFound,
            SimAnswer::Failed => Said::Other,
        }
    }
}

impl SimMember<'_> {
    /// Asks member `t` (`recorded`: a delete the pod recorded, whose tombstone `t` takes
    /// before it deletes its copy, as its node does).
    async fn ask_as(
        &self,
        t: &MemberInfo,
        mine: bool,
        recorded: bool,
    ) -> Result<SimAnswer, Unreached> {
        let Some(m) = index_of(t, self.running.len()) else {
            return Err(Unreached::Unreachable);
        };
        let reached =
            mine || (self.net.cross(self.from, Some(m)).await && self.net.both_ways(self.from, m));
        if !reached {
            tokio::time::sleep(ctxpod_pod::route::PEER_DEADLINE).await;
            return Err(Unreached::TimedOut);
        }
        let Some(Reached { engine, tombstones }) = self.running.get(m) else {
            return Err(Unreached::Refused);
        };
        Ok(match &self.op {
            Op::Get => match engine.get(NS, self.key).await {
                Ok(Some((b, _))) => SimAnswer::Block(b),
                Ok(None) => SimAnswer::Missing,
                Err(_) => SimAnswer::Failed,
            },
            Op::Put(b) => {
                // As the node's default: acknowledged once flushed, so a power cut keeps it.
                let put = engine.put(
                    NS,
                    self.key,
                    b.clone(),
                    None,
                    ctxpod_wire::Durability::Durable,
                );
                match put.await {
                    Ok(_) => {
                        self.took.lock().expect("one thread").push(m);
                        SimAnswer::Stored
                    }
                    Err(_) => SimAnswer::Failed,
                }
            }
            Op::Delete => {
                if let Some(t) = tombstones.filter(|_| recorded) {
                    t.learn_recorded(NS, self.key);
                }
                match engine.delete(NS, self.key).await {
                    Ok(held) => SimAnswer::Deleted { held },
                    Err(_) => SimAnswer::Failed,
                }
            }
        })
    }
}

/// Member `from`'s backfill asking the members it copies to (the pod's
/// `backfill::CopyTo`), each request within `backfill::REQUEST_TIMEOUT`.
pub(crate) struct SimCopies {
    pub running: Arc<Running>,
    pub net: Arc<Net>,
    pub from: usize,
}

impl SimCopies {
    /// Member `t` as `from` reaches it: a black hole waits out the request's timeout.
    async fn reach(&self, t: &MemberInfo) -> anyhow::Result<(usize, Reached)> {
        let m = index_of(t, self.running.len())
            .ok_or_else(|| anyhow::anyhow!("{} is no member", t.id))?;
        if !(self.net.cross(self.from, Some(m)).await && self.net.both_ways(self.from, m)) {
            tokio::time::sleep(ctxpod_pod::backfill::REQUEST_TIMEOUT).await;
            anyhow::bail!("m{m:02}: timed out");
        }
        let up = self
            .running
            .get(m)
            .ok_or_else(|| anyhow::anyhow!("m{m:02}: connection refused"))?;
        Ok((m, up))
    }

    /// Whether the answer of `to` reaches `from` (a cut made while the request was in
    /// flight loses it, after it took effect).
    fn answered(&self, to: usize) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.net.both_ways(self.from, to),
            "m{to:02}: the answer was lost"
        );
        Ok(())
    }
}

#[async_trait::async_trait]
impl ctxpod_pod::backfill::CopyTo for SimCopies {
    async fn present(
        &self,
        t: &MemberInfo,
        _tenant: Option<&str>,
        ns: &str,
        keys: &[&[u8]],
    ) -> anyhow::Result<Vec<bool>> {
        let (m, up) = self.reach(t).await?;
        let mut held = Vec::with_capacity(keys.len());
        for k in keys {
            held.push(up.engine.contains(ns, k).await?);
        }
        self.answered(m)?;
        Ok(held)
    }

    async fn put_copies(
        &self,
        t: &MemberInfo,
        _tenant: Option<&str>,
        ns: &str,
        blocks: &[(&[u8], Bytes)],
    ) -> anyhow::Result<Vec<u16>> {
        let (m, up) = self.reach(t).await?;
        let mut statuses = Vec::with_capacity(blocks.len());
        for (k, d) in blocks {
            // As the node's `batch/put` takes a copy (`x-ctxpod-copy`): refused when the
            // pod deleted the block.
            if up.tombstones.as_ref().is_some_and(|ts| ts.holds(ns, k)) {
                statuses.push(410);
                continue;
            }
            let put = up
                .engine
                .put(ns, k, d.clone(), None, ctxpod_wire::Durability::Fast);
            let status = match put.await {
                Ok(ctxpod_engine::PutStatus::Created) => 201,
                Ok(ctxpod_engine::PutStatus::Exists) => 200,
                Err(_) => 500,
            };
            // Its tombstone may have arrived while it was stored: deleted again.
            let undone = match (&up.tombstones, status) {
                (Some(ts), 200 | 201) => ts.undo_copy_of_deleted(&up.engine, ns, k).await,
                _ => false,
            };
            statuses.push(if undone { 410 } else { status });
        }
        self.answered(m)?;
        Ok(statuses)
    }
}

/// The index of member `t` (ids are `m00`, `m01`, …) in a pod of `n`.
pub(crate) fn index_of(t: &MemberInfo, n: usize) -> Option<usize> {
    let m: usize = t.id.strip_prefix('m')?.parse().ok()?;
    (m < n).then_some(m)
}

/// Member `from` listing a namespace's keys for the pod (the pod's `listing::Pages`): its
/// own page from its engine, the others' over the network (within the peers' deadline),
/// each member's page as its node gives it (`listing::own_page`: none while fenced).
pub(crate) struct SimPages<'a> {
    pub running: &'a Running,
    pub net: &'a Net,
    pub from: usize,
}

#[async_trait::async_trait]
impl ctxpod_pod::listing::Pages for SimPages<'_> {
    type Entry = ctxpod_wire::types::ListedBlock;
    /// Why the listing failed, for the trace.
    type Error = String;

    async fn page(
        &self,
        t: Option<&MemberInfo>,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<ctxpod_pod::listing::Page<Self::Entry>, PageError<String>> {
        let m = match t {
            None => self.from,
            Some(t) => {
                let m = index_of(t, self.running.len())
                    .ok_or_else(|| PageError::Failed(format!("{} is no member", t.id)))?;
                if !(self.net.cross(self.from, Some(m)).await && self.net.both_ways(self.from, m)) {
                    tokio::time::sleep(ctxpod_pod::route::PEER_DEADLINE).await;
                    return Err(PageError::Failed(format!("m{m:02} timed out")));
                }
                m
            }
        };
        let up = self
            .running
            .get(m)
            .ok_or_else(|| PageError::Failed(format!("m{m:02} refused the connection")))?;
        ctxpod_pod::listing::own_page(&up.engine, NS, prefix, after, limit)
            .await
            .map_err(|e| PageError::Failed(format!("m{m:02}: {e}")))
    }
}
