//! CXP1 to a whole pod, routed by the client: [`TransferPod`] learns the members from any
//! node's `GET /v1/cluster` (through a [`PodClient`]), keeps one CXP1 connection per member
//! (to the member's own `transfer` address, never a load balancer) and splits every batch
//! by member with [`ctxpod_wire::placement`], the function the nodes use. A single node is
//! a pod of one, so the same calls serve both.
//!
//! The pod's rules are [`ctxpod_wire::pod_plan`]'s (the nodes follow the same); this client
//! drives its plans over CXP1, every member of a round asked at once:
//! - `put`: each block to its R highest-ranked members ([`WritePlan::put`]), the blocks of
//!   one member in one request (split to fit its frame); a member that cannot be reached
//!   is replaced by the next in rank order. A block is stored once R members stored it.
//! - `get`, `exists`: each key asked of its read candidates in order ([`ReadPlan`]) while
//!   it is missing or its member cannot be reached; a copy missing (or corrupt) on one of
//!   the first R members is written back over HTTP (read repair, as [`PodClient::get`]
//!   does). Entries a node answers 413 (over the frame) or BUSY are asked again, bounded.
//! - `match_prefix` ([`MatchPlan`]): each member is asked (MATCH) about its own keys of the
//!   chain, all at once; a key its first member lacks is then looked for further down its
//!   ranking before the chain is cut there.
//! - `pin` / `unpin` ([`fan_out`]): at each key's read candidates that are up; the count is
//!   the first candidates'.
//! - `prefetch`: one ticket, filled from every member at once: each member pushes its own
//!   blocks into the same region(s), registered on each connection as needed.
//! - `subscribe`: the KV events of every member, merged.
//! - `delete`: over HTTP, through the pod ([`PodClient::delete`]): the member that takes it
//!   records a tombstone, so no copy comes back.

use crate::client::ClientError;
use crate::connect::Connect;
use crate::pod_client::{PodClient, View};
use crate::region::Region;
use crate::transfer_client::{
    PrefetchOptions, Ticket, TransferClient, TransferError, BUSY_ATTEMPTS, EVENTS_BUFFER,
};
use bytes::Bytes;
use ctxpod_wire::pod_plan::{
    fan_out, MatchPlan, Plan, ReadAnswer, ReadOutcome, ReadPlan, Round, WriteAnswer, WriteOutcome,
    WritePlan,
};
use ctxpod_wire::proto::{status, Durability, PrefetchEntry};
use ctxpod_wire::types::ClusterMember;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

mod tickets;
use tickets::forward;
pub use tickets::{PodSubscription, PodTicket};

/// Keys in one request's list (GET, MATCH, PIN, PREFETCH): the protocol's limit.
const LIST_MAX: usize = ctxpod_wire::MATCH_KEYS_MAX;

/// One-key MATCHes in flight per member for `exists` (the node runs 32 requests at once
/// per connection and answers more BUSY).
const EXISTS_IN_FLIGHT: usize = 16;

/// A CXP1 client of a pod (or of one node).
pub struct TransferPod {
    pod: PodClient,
    how: Connect,
    /// One connection per member, by its CXP1 address.
    conns: tokio::sync::Mutex<HashMap<String, Arc<TransferClient>>>,
    /// Calls answered on the calling thread, over every connection this client opened.
    direct_calls: Arc<std::sync::atomic::AtomicU64>,
}

/// A failure of a whole request to a member: the member cannot be reached (try the next),
/// or something else (give up).
fn unreachable(e: &TransferError) -> bool {
    matches!(
        e,
        TransferError::Io(_) | TransferError::Closed | TransferError::TimedOut { .. }
    )
}

impl TransferPod {
    /// Connects through any of `seeds` (node base URLs, `http://` or `https://`): the first
    /// that answers `/v1/cluster` gives the members. Their CXP1 connections open on first
    /// use.
    pub async fn connect(seeds: &[String], how: &Connect) -> Result<TransferPod, TransferError> {
        let pod = PodClient::connect(seeds, how).await?;
        if pod.members().iter().all(|m| m.transfer.is_none()) {
            return Err(TransferError::Http(ClientError::Invalid(
                "no member of the pod serves CXP1 (transfer_listen is off)".into(),
            )));
        }
        Ok(TransferPod {
            pod,
            how: how.clone(),
            conns: tokio::sync::Mutex::new(HashMap::new()),
            direct_calls: Arc::default(),
        })
    }

    /// The HTTP client of the pod (membership, namespaces, deletes).
    pub fn http(&self) -> &PodClient {
        &self.pod
    }

    /// Runs `call` on a member that answers for the pod (namespaces, the operator's calls),
    /// failing over to the next member ([`PodClient::on_any_member`]).
    pub async fn on_any_member<T, F, Fut>(&self, call: F) -> Result<T, TransferError>
    where
        F: Fn(crate::client::Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        Ok(self.pod.on_any_member(call).await?)
    }

    /// Reads the pod's membership again.
    pub async fn refresh(&self) -> Result<(), TransferError> {
        Ok(self.pod.refresh().await?)
    }

    /// The largest value every reachable member stores (the least of their
    /// `value_bytes_max`, from their hellos; each member's connection is opened if it was
    /// not): what a connector checks an engine's chunk size against when it is built.
    /// Fails when no member can be reached.
    pub async fn value_bytes_max(&self) -> Result<u64, TransferError> {
        let addrs: Vec<String> = self
            .pod
            .members()
            .into_iter()
            .filter_map(|m| m.transfer)
            .collect();
        let mut least: Option<u64> = None;
        let mut last = None;
        for a in addrs {
            match self.conn(&a).await {
                Ok(c) => {
                    let n = match c.value_bytes_max() {
                        0 => ctxpod_wire::BLOCK_BYTES_MAX as u64,
                        n => n,
                    };
                    least = Some(least.map_or(n, |l| l.min(n)));
                }
                Err(e) => last = Some(e),
            }
        }
        least.ok_or_else(|| last.unwrap_or(TransferError::Closed))
    }

    /// The CXP1 addresses of the members a block lives on, best first, those counted down
    /// (a missed deadline, a refused connection) last.
    pub fn ranked(&self, ns: &str, key: &[u8]) -> Vec<String> {
        self.pod
            .ask_order(self.pod.ranked_members(ns, key))
            .into_iter()
            .filter_map(|(_, m)| m.transfer)
            .collect()
    }

    /// The connection to the member at `addr` (opened once, again after it closed), within
    /// the connect deadline. Opened without holding the others: a member that does not
    /// answer delays only the calls to it.
    pub async fn conn(&self, addr: &str) -> Result<Arc<TransferClient>, TransferError> {
        if let Some(c) = self.conns.lock().await.get(addr).filter(|c| !c.is_closed()) {
            return Ok(c.clone());
        }
        let c = TransferClient::connect_counting(addr, &self.how, self.direct_calls.clone());
        let c = Arc::new(c.await?);
        let mut conns = self.conns.lock().await;
        // Another call may have opened one meanwhile: one connection per member.
        match conns.get(addr).filter(|c| !c.is_closed()) {
            Some(theirs) => Ok(theirs.clone()),
            None => {
                conns.insert(addr.to_string(), c.clone());
                Ok(c)
            }
        }
    }

    /// [`Self::lost`] for a member of the view (one that serves no CXP1 has no connection
    /// to forget, and is not counted down: it answers HTTP).
    async fn lost_member(&self, m: &ClusterMember) {
        if let Some(addr) = &m.transfer {
            self.lost(addr).await;
        }
    }

    /// Asks every member of a plan's `round` at once over CXP1: `ask(connection, entries)`;
    /// per member, its entries and the answer (a member that serves no CXP1 answers
    /// [`TransferError::Closed`]). A member that cannot be reached is counted lost.
    async fn ask_round<T, F, Fut>(
        &self,
        v: &View,
        round: Round,
        ask: F,
    ) -> Vec<(usize, Vec<usize>, Result<T, TransferError>)>
    where
        F: Fn(Arc<TransferClient>, Vec<usize>) -> Fut,
        Fut: std::future::Future<Output = Result<T, TransferError>>,
    {
        // Members asked at once: no call among them may block the thread
        // ([`direct`](crate::transfer_client::direct)); one member alone may.
        let alone = round.len() == 1;
        let all = futures::future::join_all(round.into_iter().map(|(m, idx)| {
            let (addr, ask) = (v.members[m].transfer.clone(), &ask);
            async move {
                let r = match addr {
                    Some(a) => match self.conn(&a).await {
                        Ok(c) => ask(c, idx.clone()).await,
                        Err(e) => Err(e),
                    },
                    None => Err(TransferError::Closed),
                };
                (m, idx, r)
            }
        }));
        let asked = match alone {
            true => all.await,
            false => crate::transfer_client::direct::side_by_side(all).await,
        };
        for (m, _, r) in &asked {
            if r.as_ref().is_err_and(unreachable) {
                self.lost_member(&v.members[*m]).await;
            }
        }
        asked
    }

    /// After a transport failure or a missed deadline: forgets the member's connection,
    /// counts it down (asked last for a while), and reads the membership again (best
    /// effort).
    async fn lost(&self, addr: &str) {
        self.conns.lock().await.remove(addr);
        if let Some(m) = self
            .pod
            .members()
            .into_iter()
            .find(|m| m.transfer.as_deref() == Some(addr))
        {
            self.pod.mark_down(&m.id);
        }
        let _ = self.pod.refresh().await;
    }

    /// Requests sent again because a node answered BUSY, over every open connection.
    pub async fn busy_retries(&self) -> u64 {
        self.conns
            .lock()
            .await
            .values()
            .map(|c| c.busy_retries())
            .sum()
    }

    /// Calls answered on the calling thread, over every connection this client opened
    /// ([`direct`](crate::transfer_client::direct)).
    pub fn direct_calls(&self) -> u64 {
        self.direct_calls.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Stores blocks; per block, the status: 201 stored (200: already there) on all R
    /// members, or the first refusal (409, 413, 422, 507, …; 503 when fewer than R members
    /// could be reached). Each round of the plan ([`WritePlan::put`]) sends every member
    /// its blocks at once.
    pub async fn put(
        &self,
        ns: &str,
        blocks: &[(Bytes, Bytes)],
        durability: Durability,
    ) -> Result<Vec<u16>, TransferError> {
        let copies = self.pod.replication_of(ns).await;
        let (v, down) = self.pod.plan_view();
        let keys = blocks.iter().map(|(k, _)| k);
        let mut plan = WritePlan::put(&v.placement, &down, ns, keys, copies);
        let mut refused: Vec<Option<u16>> = vec![None; blocks.len()];
        while let Some(round) = plan.next_round() {
            let sent = self
                .ask_round(&v, round, |c, idx| async move {
                    self.put_on(c, ns, blocks, &idx, durability).await
                })
                .await;
            for (m, idx, r) in sent {
                match r {
                    Ok(sts) => {
                        for (i, s) in idx.into_iter().zip(sts) {
                            let a = if ok(s) {
                                WriteAnswer::Applied {
                                    changed: s == status::CREATED,
                                }
                            } else {
                                refused[i].get_or_insert(s);
                                WriteAnswer::Refused
                            };
                            plan.answer(m, i, a);
                        }
                    }
                    Err(e) if unreachable(&e) => plan.answer_all(m, &idx, WriteAnswer::Unreachable),
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(plan
            .finish()
            .into_iter()
            .zip(refused)
            .map(|(o, refused)| match o {
                WriteOutcome::Refused { .. } => refused.unwrap_or(status::BUSY),
                o => o.put_status().unwrap_or(status::BUSY),
            })
            .collect())
    }

    /// The blocks `idx` of `blocks` to one member, in as many requests as its frame and
    /// the protocol's entry limit need; entries the node answers BUSY (its staging or
    /// write budget is spent) are sent again after a backoff, [`BUSY_ATTEMPTS`] rounds at
    /// most.
    async fn put_on(
        &self,
        c: Arc<TransferClient>,
        ns: &str,
        blocks: &[(Bytes, Bytes)],
        idx: &[usize],
        durability: Durability,
    ) -> Result<Vec<u16>, TransferError> {
        // Room for the frame's header and each entry's key, CRC and length.
        let room = c.max_frame_bytes().saturating_sub(1024);
        let mut out = vec![status::BUSY; idx.len()];
        let mut todo: Vec<usize> = (0..idx.len()).collect();
        let mut backoff = Duration::from_millis(1);
        for round in 1..=BUSY_ATTEMPTS {
            let mut again = Vec::new();
            let mut start = 0;
            while start < todo.len() {
                let (mut end, mut bytes) = (start, 0);
                while end < todo.len() && end - start < ctxpod_wire::BATCH_ENTRIES_MAX {
                    let (k, d) = &blocks[idx[todo[end]]];
                    let cost = d.len() + k.len() + 16;
                    if end > start && bytes + cost > room {
                        break;
                    }
                    bytes += cost;
                    end += 1;
                }
                let batch: Vec<(Bytes, Bytes)> = todo[start..end]
                    .iter()
                    .map(|&j| blocks[idx[j]].clone())
                    .collect();
                for (&j, st) in todo[start..end]
                    .iter()
                    .zip(c.put(ns, &batch, durability).await?)
                {
                    out[j] = st;
                    if st == status::BUSY && round < BUSY_ATTEMPTS {
                        again.push(j);
                    }
                }
                start = end;
            }
            if again.is_empty() {
                break;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_millis(256));
            todo = again;
        }
        Ok(out)
    }

    /// Blocks by key, each from the first of its read candidates that holds a good copy
    /// ([`ReadPlan`]): `Ok(Some)`, `Ok(None)` for a miss (no member a read tries holds
    /// it), or why that entry failed (a refusal). A copy missing or corrupt on one of a
    /// key's first R members is written back over HTTP (read repair).
    pub async fn get(
        &self,
        ns: &str,
        keys: &[Bytes],
    ) -> Result<Vec<Result<Option<Bytes>, TransferError>>, TransferError> {
        let copies = self.pod.replication_of(ns).await;
        let (v, down) = self.pod.plan_view();
        let mut plan = ReadPlan::new(&v.placement, &down, ns, keys, copies);
        let mut got: Vec<Option<Result<Option<Bytes>, TransferError>>> =
            (0..keys.len()).map(|_| None).collect();
        while let Some(round) = plan.next_round() {
            let asked = self
                .ask_round(&v, round, |c, idx| async move {
                    let ks: Vec<Bytes> = idx.iter().map(|&i| keys[i].clone()).collect();
                    c.get_all(ns, &ks).await
                })
                .await;
            for (m, idx, r) in asked {
                match r {
                    Ok(es) => {
                        for (i, e) in idx.into_iter().zip(es) {
                            let a = match e {
                                Ok(Some(b)) => {
                                    got[i] = Some(Ok(Some(b)));
                                    ReadAnswer::Hit
                                }
                                Ok(None) => ReadAnswer::Miss,
                                Err(TransferError::Corrupt(_)) => ReadAnswer::Corrupt,
                                Err(e) => {
                                    got[i] = Some(Err(e));
                                    ReadAnswer::Final
                                }
                            };
                            plan.answer(m, i, a);
                        }
                    }
                    Err(e) if unreachable(&e) => plan.answer_all(m, &idx, ReadAnswer::Unreachable),
                    Err(e) => return Err(e),
                }
            }
        }
        let mut out = Vec::with_capacity(keys.len());
        for ((o, g), k) in plan.finish().into_iter().zip(got).zip(keys) {
            match (o, g) {
                (ReadOutcome::Hit { repair, .. }, Some(Ok(Some(b)))) => {
                    for m in repair {
                        let _ = self.pod.repair(&v.members[m], ns, k, &b).await;
                    }
                    out.push(Ok(Some(b)));
                }
                (ReadOutcome::Final { .. }, Some(e)) => out.push(e),
                _ => out.push(Ok(None)),
            }
        }
        Ok(out)
    }

    /// Whether each key is held by one of the members a read would try ([`ReadPlan`]).
    pub async fn exists(&self, ns: &str, keys: &[Bytes]) -> Result<Vec<bool>, TransferError> {
        let copies = self.pod.replication_of(ns).await;
        let (v, down) = self.pod.plan_view();
        let mut plan = ReadPlan::new(&v.placement, &down, ns, keys, copies);
        while let Some(round) = plan.next_round() {
            let asked = self
                .ask_round(&v, round, |c, idx| async move {
                    let ks: Vec<Bytes> = idx.iter().map(|&i| keys[i].clone()).collect();
                    held_each(c, ns, ks).await
                })
                .await;
            for (m, idx, r) in asked {
                match r {
                    Ok(held) => {
                        for (i, h) in idx.into_iter().zip(held) {
                            let a = if h { ReadAnswer::Hit } else { ReadAnswer::Miss };
                            plan.answer(m, i, a);
                        }
                    }
                    Err(e) if unreachable(&e) => plan.answer_all(m, &idx, ReadAnswer::Unreachable),
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(plan
            .finish()
            .into_iter()
            .map(|o| matches!(o, ReadOutcome::Hit { .. }))
            .collect())
    }

    /// How many leading keys of the chain the pod holds ([`MatchPlan`]: each member asked
    /// about its own keys, all at once; a key its first member lacks looked for further
    /// down its ranking before the chain is cut there).
    pub async fn match_prefix(&self, ns: &str, chain: &[Bytes]) -> Result<u32, TransferError> {
        let copies = self.pod.replication_of(ns).await;
        let (v, down) = self.pod.plan_view();
        let mut plan = MatchPlan::new(&v.placement, &down, ns, chain, copies);
        while let Some(round) = plan.next_round() {
            let asked = self
                .ask_round(&v, round, |c, pos| async move {
                    let ks: Vec<Bytes> = pos.iter().map(|&i| chain[i].clone()).collect();
                    c.match_prefix(ns, &ks).await
                })
                .await;
            for (m, _, r) in asked {
                // A member that cannot be asked holds nothing as far as this match goes.
                let held = match r {
                    Ok(n) => n as usize,
                    Err(e) if unreachable(&e) => 0,
                    Err(e) => return Err(e),
                };
                plan.answer(m, held);
            }
        }
        Ok(plan.matched().unwrap_or(0) as u32)
    }

    /// Pins the present keys for `ttl` at each of their read candidates that is up
    /// ([`fan_out`]: whichever holds a copy keeps it); how many of them their first
    /// candidate pinned.
    pub async fn pin(&self, ns: &str, keys: &[Bytes], ttl: Duration) -> Result<u32, TransferError> {
        self.on_candidates(ns, keys, |c, ks| async move { c.pin(ns, &ks, ttl).await })
            .await
    }

    /// Ends pins (and prefetch leases) of the keys at each of their read candidates.
    pub async fn unpin(&self, ns: &str, keys: &[Bytes]) -> Result<u32, TransferError> {
        self.on_candidates(ns, keys, |c, ks| async move { c.unpin(ns, &ks).await })
            .await
    }

    /// `op` on each member for its keys of a [`fan_out`]; the sum of what the keys' first
    /// candidates answered (a member's keys go in two requests: those it is first for,
    /// counted, and the others).
    async fn on_candidates<F, Fut>(
        &self,
        ns: &str,
        keys: &[Bytes],
        op: F,
    ) -> Result<u32, TransferError>
    where
        F: Fn(Arc<TransferClient>, Vec<Bytes>) -> Fut,
        Fut: std::future::Future<Output = Result<u32, TransferError>>,
    {
        let copies = self.pod.replication_of(ns).await;
        let (v, down) = self.pod.plan_view();
        // Each key's first candidate: the first a read would ask.
        let first: std::collections::HashSet<(usize, usize)> =
            ReadPlan::new(&v.placement, &down, ns, keys, copies)
                .round()
                .into_iter()
                .flat_map(|(m, idx)| idx.into_iter().map(move |i| (m, i)))
                .collect();
        let mut groups: Vec<(usize, bool, Vec<Bytes>)> = Vec::new();
        for (m, idx) in fan_out(&v.placement, &down, ns, keys, copies) {
            let (firsts, others): (Vec<usize>, Vec<usize>) =
                idx.into_iter().partition(|&i| first.contains(&(m, i)));
            for (is_first, part) in [(true, firsts), (false, others)] {
                if !part.is_empty() {
                    groups.push((m, is_first, part.iter().map(|&i| keys[i].clone()).collect()));
                }
            }
        }
        let done = futures::future::join_all(groups.into_iter().map(|(m, is_first, ks)| {
            let (op, addr) = (&op, v.members[m].transfer.clone());
            async move {
                let r = async {
                    let c = self
                        .conn(addr.as_deref().ok_or(TransferError::Closed)?)
                        .await?;
                    let mut n = 0;
                    for chunk in ks.chunks(LIST_MAX) {
                        n += op(c.clone(), chunk.to_vec()).await?;
                    }
                    Ok(n)
                }
                .await;
                (m, is_first, r)
            }
        }))
        .await;
        let mut n = 0;
        for (m, is_first, r) in done {
            match r {
                Ok(c) if is_first => n += c,
                Ok(_) => {}
                Err(e) if unreachable(&e) => self.lost_member(&v.members[m]).await,
                Err(e) => return Err(e),
            }
        }
        Ok(n)
    }

    /// Deletes a block from the pod (over HTTP: the pod records a tombstone). True if a
    /// member held it.
    pub async fn delete(&self, ns: &str, key: &[u8]) -> Result<bool, TransferError> {
        Ok(self.pod.delete(ns, key).await?)
    }

    /// One page of namespace `ns`'s keys across the pod, in byte order (over HTTP, see
    /// [`PodClient::list_keys`]).
    pub async fn list_keys(
        &self,
        ns: &str,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<crate::client::KeyPage, TransferError> {
        Ok(self.pod.list_keys(ns, prefix, after, limit).await?)
    }

    /// Asks every member holding some of `entries` to push its blocks into the entries'
    /// regions (each entry: the region, and where in it): one ticket over all of them.
    /// A region is registered on each member's connection the first time it is used there.
    /// A member that cannot be reached is passed over for the next in the key's ranking.
    pub async fn prefetch(
        &self,
        ns: &str,
        entries: Vec<(Region, PrefetchEntry)>,
        opts: PrefetchOptions,
    ) -> Result<PodTicket, TransferError> {
        let n = entries.len();
        let copies = self.pod.replication_of(ns).await;
        let (v, down) = self.pod.plan_view();
        // A member that takes an entry answers for it (its ticket reports a miss): the plan
        // goes on past a member only when it cannot be reached.
        let mut plan = ReadPlan::new(
            &v.placement,
            &down,
            ns,
            entries.iter().map(|(_, e)| &e.key),
            copies,
        );
        let mut parts: Vec<(Ticket, Vec<usize>)> = Vec::new();
        while let Some(round) = plan.next_round() {
            for (m, idx) in round {
                // By region: each request fills one region.
                let mut by_region: HashMap<u32, Vec<usize>> = HashMap::new();
                for i in idx {
                    by_region.entry(entries[i].0.id()).or_default().push(i);
                }
                for idx in by_region.into_values() {
                    let region = entries[idx[0]].0.clone();
                    for chunk in idx.chunks(LIST_MAX) {
                        let sub: Vec<PrefetchEntry> =
                            chunk.iter().map(|&i| entries[i].1.clone()).collect();
                        let r = match &v.members[m].transfer {
                            Some(addr) => self.prefetch_on(addr, ns, &region, sub, opts).await,
                            None => Err(TransferError::Closed),
                        };
                        match r {
                            Ok(t) => {
                                plan.answer_all(m, chunk, ReadAnswer::Final);
                                parts.push((t, chunk.to_vec()));
                            }
                            Err(e) if unreachable(&e) => {
                                self.lost_member(&v.members[m]).await;
                                plan.answer_all(m, chunk, ReadAnswer::Unreachable);
                            }
                            // The tickets opened so far are cancelled as `parts` drops.
                            Err(e) => return Err(e),
                        }
                    }
                }
            }
        }
        let unplaced = plan
            .finish()
            .iter()
            .filter(|o| matches!(o, ReadOutcome::Miss))
            .count();
        if unplaced > 0 {
            return Err(TransferError::Http(ClientError::Invalid(format!(
                "no member of the pod can be reached for {unplaced} of the entries"
            ))));
        }
        let mut index = vec![(0usize, 0usize); n];
        for (p, (_, idx)) in parts.iter().enumerate() {
            for (local, &i) in idx.iter().enumerate() {
                index[i] = (p, local);
            }
        }
        Ok(PodTicket { parts, index })
    }

    async fn prefetch_on(
        &self,
        addr: &str,
        ns: &str,
        region: &Region,
        entries: Vec<PrefetchEntry>,
        opts: PrefetchOptions,
    ) -> Result<Ticket, TransferError> {
        let c = self.conn(addr).await?;
        if !c.has_region(region) {
            c.register_region(region).await?;
        }
        c.prefetch(ns, region, entries, opts).await
    }

    /// Stops using `region` on every connection it was registered on (see
    /// [`TransferClient::unregister_region`]); true if it was registered on one.
    pub async fn unregister_region(&self, region: &Region) -> Result<bool, TransferError> {
        let conns: Vec<Arc<TransferClient>> = self.conns.lock().await.values().cloned().collect();
        let mut any = false;
        for c in conns {
            if c.has_region(region) {
                any |= c.unregister_region(region).await?;
            }
        }
        Ok(any)
    }

    /// KV events of namespace `ns` from every member (that serves CXP1 now), merged as they
    /// come. Members that join later are not included: subscribe again after a change of
    /// membership.
    pub async fn subscribe(&self, ns: &str) -> Result<PodSubscription, TransferError> {
        let (tx, rx) = mpsc::channel(EVENTS_BUFFER);
        let mut addrs: Vec<String> = self
            .pod
            .members()
            .into_iter()
            .filter_map(|m| m.transfer)
            .collect();
        addrs.dedup();
        for addr in addrs {
            let sub = self.conn(&addr).await?.subscribe(ns).await?;
            tokio::spawn(forward(sub, tx.clone()));
        }
        Ok(PodSubscription { rx })
    }
}

/// Whether each key is held by the member behind `c` (a one-key MATCH each, pipelined,
/// [`EXISTS_IN_FLIGHT`] at a time).
async fn held_each(
    c: Arc<TransferClient>,
    ns: &str,
    keys: Vec<Bytes>,
) -> Result<Vec<bool>, TransferError> {
    use futures::StreamExt;
    let ns: Arc<str> = Arc::from(ns);
    let asked: Vec<_> = futures::stream::iter(keys)
        .map(move |k| {
            let (c, ns) = (c.clone(), ns.clone());
            async move { c.match_prefix(&ns, std::slice::from_ref(&k)).await }
        })
        .buffered(EXISTS_IN_FLIGHT)
        .collect()
        .await;
    asked.into_iter().map(|r| r.map(|n| n == 1)).collect()
}

fn ok(s: u16) -> bool {
    s == status::OK || s == status::CREATED
}
