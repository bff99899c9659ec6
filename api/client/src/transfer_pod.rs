//! CXP1 to a whole pod, routed by the client: [`TransferPod`] learns the members from any
//! node's `GET /v1/cluster` (through a [`PodClient`]), keeps one CXP1 connection per member
//! (to the member's own `transfer` address, never a load balancer) and splits every batch
//! by member with [`ctxpod_wire::placement`], the function the nodes use. A single node is
//! a pod of one, so the same calls serve both.
//!
//! - `put`: each block to its R highest-ranked members (R: the namespace's `replication`,
//!   else the pod's), the blocks of one member in one request (split to fit its frame); a
//!   member that cannot be reached is skipped for the next in rank order. A block is
//!   stored once R members stored it.
//! - `get`, `exists`: each key asked of its first member, then of the next (up to
//!   max([`READ_FALLBACK`](ctxpod_wire::placement::READ_FALLBACK), R + 1) members) while it
//!   is missing or its member cannot be reached; a copy missing from one of the first R
//!   members is written back over HTTP (read repair, as [`PodClient::get`] does). Entries
//!   a node answers 413 (over the frame) or BUSY are asked again, bounded.
//! - `match_prefix`: each member is asked (MATCH) about its own keys of the chain, all at
//!   once; the chain holds up to the first key any member lacks. A key its first member
//!   lacks is then looked for further down its ranking before the chain is cut there.
//! - `pin` / `unpin`: on each of a key's R members; the count is the first members'.
//! - `prefetch`: one ticket, filled from every member at once: each member pushes its own
//!   blocks into the same region(s), registered on each connection as needed.
//! - `subscribe`: the KV events of every member, merged.
//! - `delete`: over HTTP, through the pod ([`PodClient::delete`]): the member that takes it
//!   records a tombstone, so no copy comes back.

use crate::client::ClientError;
use crate::connect::Connect;
use crate::pod_client::PodClient;
use crate::region::Region;
use crate::transfer_client::{
    PrefetchOptions, Ticket, TransferClient, TransferError, BUSY_ATTEMPTS, EVENTS_BUFFER,
};
use bytes::Bytes;
use ctxpod_wire::proto::{status, Durability, PrefetchEntry};
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
        let c = Arc::new(TransferClient::connect_with(addr, &self.how).await?);
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

    /// Stores blocks; per block, the status: 201 stored (200: already there) on all R
    /// members, or the first refusal (409, 413, 422, 507, …; 503 when fewer than R members
    /// could be reached).
    pub async fn put(
        &self,
        ns: &str,
        blocks: &[(Bytes, Bytes)],
        durability: Durability,
    ) -> Result<Vec<u16>, TransferError> {
        let copies = self.pod.replication_of(ns).await;
        let ranks: Vec<Vec<String>> = blocks.iter().map(|(k, _)| self.ranked(ns, k)).collect();
        let n = blocks.len();
        let (mut next, mut stored) = (vec![0usize; n], vec![0usize; n]);
        let mut answer: Vec<Option<u16>> = vec![None; n];
        loop {
            let mut groups: HashMap<String, Vec<usize>> = HashMap::new();
            for i in 0..n {
                if answer[i].is_some_and(|s| !ok(s)) || stored[i] == copies {
                    continue;
                }
                let want = copies - stored[i];
                let tried = next[i];
                for a in ranks[i].iter().skip(tried).take(want) {
                    groups.entry(a.clone()).or_default().push(i);
                }
                next[i] = (tried + want).min(ranks[i].len());
                if tried == next[i] {
                    // Every member was tried: too few could be reached.
                    answer[i] = Some(status::BUSY);
                }
            }
            if groups.is_empty() {
                break;
            }
            let sent = futures::future::join_all(groups.into_iter().map(|(addr, idx)| async {
                let r = self.put_on(&addr, ns, blocks, &idx, durability).await;
                (addr, idx, r)
            }))
            .await;
            for (addr, idx, r) in sent {
                match r {
                    Ok(sts) => {
                        for (i, s) in idx.into_iter().zip(sts) {
                            if ok(s) {
                                stored[i] += 1;
                                // The first member's answer says whether it was new.
                                answer[i].get_or_insert(s);
                            } else {
                                answer[i] = Some(s);
                            }
                        }
                    }
                    Err(e) if unreachable(&e) => self.lost(&addr).await,
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(answer
            .into_iter()
            .map(|s| s.unwrap_or(status::BUSY))
            .collect())
    }

    /// The blocks `idx` of `blocks` to one member, in as many requests as its frame and
    /// the protocol's entry limit need; entries the node answers BUSY (its staging or
    /// write budget is spent) are sent again after a backoff, [`BUSY_ATTEMPTS`] rounds at
    /// most.
    async fn put_on(
        &self,
        addr: &str,
        ns: &str,
        blocks: &[(Bytes, Bytes)],
        idx: &[usize],
        durability: Durability,
    ) -> Result<Vec<u16>, TransferError> {
        let c = self.conn(addr).await?;
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

    /// Blocks by key, each from the first of its members that holds it: `Ok(Some)`,
    /// `Ok(None)` for a miss (no member a read tries holds it), or why that entry failed
    /// (a refusal, a corrupt copy on every member that had one).
    pub async fn get(
        &self,
        ns: &str,
        keys: &[Bytes],
    ) -> Result<Vec<Result<Option<Bytes>, TransferError>>, TransferError> {
        let copies = self.pod.replication_of(ns).await;
        let (found, lacking) = self
            .down_the_ranks(ns, keys, |addr, ks| async move {
                let es = self.get_on(&addr, ns, &ks).await?;
                Ok(es
                    .into_iter()
                    .map(|e| match e {
                        Ok(None) | Err(TransferError::Corrupt(_)) => None,
                        e => Some(e),
                    })
                    .collect())
            })
            .await?;
        let mut out = Vec::with_capacity(keys.len());
        for ((f, lacked), k) in found.into_iter().zip(lacking).zip(keys) {
            if let Some(Ok(Some(b))) = &f {
                // Read repair: a copy missing from one of the first R members.
                for (_, m) in lacked.iter().filter(|(r, _)| *r < copies) {
                    let _ = self.repair(m, ns, k, b).await;
                }
            }
            out.push(f.unwrap_or(Ok(None)));
        }
        Ok(out)
    }

    /// Asks about each key its members in rank order, up to the members a read tries,
    /// each member about all its keys of a round at once: `ask(member, keys)` gives per
    /// key an outcome, or `None` to go on to the next member. A member that cannot be
    /// reached is passed over (and the membership read again). Per key: the outcome (or
    /// `None`: no member had one), and the (rank, member) that answered `None`.
    async fn down_the_ranks<T, F, Fut>(
        &self,
        ns: &str,
        keys: &[Bytes],
        ask: F,
    ) -> Result<(Vec<Option<T>>, Vec<Vec<(usize, String)>>), TransferError>
    where
        F: Fn(String, Vec<Bytes>) -> Fut,
        Fut: std::future::Future<Output = Result<Vec<Option<T>>, TransferError>>,
    {
        let tries = ctxpod_wire::placement::read_candidates(self.pod.replication_of(ns).await);
        let ranks: Vec<Vec<String>> = keys.iter().map(|k| self.ranked(ns, k)).collect();
        let mut out: Vec<Option<T>> = (0..keys.len()).map(|_| None).collect();
        let mut lacking: Vec<Vec<(usize, String)>> = vec![Vec::new(); keys.len()];
        let mut rank = vec![0usize; keys.len()];
        let mut open: Vec<usize> = (0..keys.len()).collect();
        while !open.is_empty() {
            let mut groups: HashMap<String, Vec<usize>> = HashMap::new();
            open.retain(
                |&i| match ranks[i].get(rank[i]).filter(|_| rank[i] < tries) {
                    Some(a) => {
                        groups.entry(a.clone()).or_default().push(i);
                        true
                    }
                    None => false,
                },
            );
            let asked = futures::future::join_all(groups.into_iter().map(|(addr, idx)| {
                let ks: Vec<Bytes> = idx.iter().map(|&i| keys[i].clone()).collect();
                let r = ask(addr.clone(), ks);
                async move { (addr, idx, r.await) }
            }))
            .await;
            for (addr, idx, r) in asked {
                match r {
                    Ok(answers) => {
                        for (i, a) in idx.into_iter().zip(answers) {
                            match a {
                                Some(a) => out[i] = Some(a),
                                None => lacking[i].push((rank[i], addr.clone())),
                            }
                        }
                    }
                    Err(e) if unreachable(&e) => self.lost(&addr).await,
                    Err(e) => return Err(e),
                }
            }
            open.retain(|&i| out[i].is_none());
            for &i in &open {
                rank[i] += 1;
            }
        }
        Ok((out, lacking))
    }

    /// A GET of `keys` on one member ([`TransferClient::get_all`]).
    async fn get_on(
        &self,
        addr: &str,
        ns: &str,
        keys: &[Bytes],
    ) -> Result<Vec<Result<Option<Bytes>, TransferError>>, TransferError> {
        self.conn(addr).await?.get_all(ns, keys).await
    }

    /// Writes a copy back to a member (by CXP1 address) that should hold one, over HTTP.
    async fn repair(
        &self,
        addr: &str,
        ns: &str,
        key: &[u8],
        data: &Bytes,
    ) -> Result<(), ClientError> {
        let Some(m) = self
            .pod
            .members()
            .into_iter()
            .find(|m| m.transfer.as_deref() == Some(addr))
        else {
            return Ok(());
        };
        self.pod.repair(&m, ns, key, data).await
    }

    /// Whether each key is held by one of the members a read would try.
    pub async fn exists(&self, ns: &str, keys: &[Bytes]) -> Result<Vec<bool>, TransferError> {
        let (held, _) = self
            .down_the_ranks(ns, keys, |addr, ks| async move {
                let c = self.conn(&addr).await?;
                let held = held_each(c, ns, ks).await?;
                Ok(held.into_iter().map(|h| h.then_some(true)).collect())
            })
            .await?;
        Ok(held.into_iter().map(|h| h.is_some()).collect())
    }

    /// How many leading keys of the chain the pod holds.
    pub async fn match_prefix(&self, ns: &str, chain: &[Bytes]) -> Result<u32, TransferError> {
        let mut start = 0usize;
        while start < chain.len() {
            let rest = &chain[start..];
            let mut groups: HashMap<String, Vec<usize>> = HashMap::new();
            // A key no member serving CXP1 could hold ends the chain there.
            let mut stop = rest.len();
            // Whom this pass asks about each key.
            let mut asked_by = Vec::with_capacity(rest.len());
            for (i, k) in rest.iter().enumerate() {
                match self.ranked(ns, k).into_iter().next() {
                    Some(a) => {
                        asked_by.push(a.clone());
                        groups.entry(a).or_default().push(i)
                    }
                    None => {
                        stop = i;
                        break;
                    }
                }
            }
            let asked = futures::future::join_all(groups.into_iter().map(|(addr, pos)| async {
                let ks: Vec<Bytes> = pos.iter().map(|&i| rest[i].clone()).collect();
                let r = match self.conn(&addr).await {
                    Ok(c) => c.match_prefix(ns, &ks).await,
                    Err(e) => Err(e),
                };
                (addr, pos, r)
            }))
            .await;
            // The chain stops at the first key its member lacks (or cannot be asked about).
            for (addr, pos, r) in asked {
                let n = match r {
                    Ok(n) => n as usize,
                    Err(e) if unreachable(&e) => {
                        self.lost(&addr).await;
                        0
                    }
                    Err(e) => return Err(e),
                };
                if let Some(&p) = pos.get(n) {
                    stop = stop.min(p);
                }
            }
            start += stop;
            if start == chain.len() {
                break;
            }
            // Before cutting the chain at a key its member lacks (or that could not be
            // asked), look further down its ranking (a block not moved yet after a join, a
            // member that was away, one that missed its deadline just now). The member
            // asked about it is passed over by address: a member lost in this pass moved
            // to the end of the ranking, so the one first now was not asked yet.
            let k = &chain[start];
            let mut found = false;
            let tries = ctxpod_wire::placement::read_candidates(self.pod.replication_of(ns).await);
            let others: Vec<String> = match asked_by.get(stop) {
                Some(a) => self.ranked(ns, k).into_iter().filter(|x| x != a).collect(),
                None => self.ranked(ns, k).into_iter().skip(1).collect(),
            };
            for addr in others.into_iter().take(tries - 1) {
                let asked = match self.conn(&addr).await {
                    Ok(c) => c.match_prefix(ns, std::slice::from_ref(k)).await,
                    Err(e) => Err(e),
                };
                match asked {
                    Ok(1) => {
                        found = true;
                        break;
                    }
                    Err(e) if unreachable(&e) => self.lost(&addr).await,
                    _ => {}
                }
            }
            if !found {
                break;
            }
            start += 1;
        }
        Ok(start as u32)
    }

    /// Pins the present keys for `ttl` on each of their R members; how many of them their
    /// first member pinned.
    pub async fn pin(&self, ns: &str, keys: &[Bytes], ttl: Duration) -> Result<u32, TransferError> {
        self.on_copies(ns, keys, |c, ks| async move { c.pin(ns, &ks, ttl).await })
            .await
    }

    /// Ends pins (and prefetch leases) of the keys on each of their R members.
    pub async fn unpin(&self, ns: &str, keys: &[Bytes]) -> Result<u32, TransferError> {
        self.on_copies(ns, keys, |c, ks| async move { c.unpin(ns, &ks).await })
            .await
    }

    /// `op` on each member, for its keys among the R copies of each; the sum of what the
    /// keys' first members answered.
    async fn on_copies<F, Fut>(&self, ns: &str, keys: &[Bytes], op: F) -> Result<u32, TransferError>
    where
        F: Fn(Arc<TransferClient>, Vec<Bytes>) -> Fut,
        Fut: std::future::Future<Output = Result<u32, TransferError>>,
    {
        let copies = self.pod.replication_of(ns).await;
        // (member, first copy?) → keys
        let mut groups: HashMap<(String, bool), Vec<Bytes>> = HashMap::new();
        for k in keys {
            for (r, a) in self.ranked(ns, k).into_iter().take(copies).enumerate() {
                groups.entry((a, r == 0)).or_default().push(k.clone());
            }
        }
        let done = futures::future::join_all(groups.into_iter().map(|((addr, first), ks)| {
            let op = &op;
            async move {
                let r = async {
                    let c = self.conn(&addr).await?;
                    let mut n = 0;
                    for chunk in ks.chunks(LIST_MAX) {
                        n += op(c.clone(), chunk.to_vec()).await?;
                    }
                    Ok(n)
                }
                .await;
                (addr, first, r)
            }
        }))
        .await;
        let mut n = 0;
        for (addr, first, r) in done {
            match r {
                Ok(c) if first => n += c,
                Ok(_) => {}
                Err(e) if unreachable(&e) => self.lost(&addr).await,
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
        let ranks: Vec<Vec<String>> = entries
            .iter()
            .map(|(_, e)| self.ranked(ns, &e.key))
            .collect();
        let mut rank = vec![0usize; n];
        let mut parts: Vec<(Ticket, Vec<usize>)> = Vec::new();
        let mut todo: Vec<usize> = (0..n).collect();
        while !todo.is_empty() {
            // (member, region) → entry indices
            let mut groups: HashMap<(String, u32), Vec<usize>> = HashMap::new();
            let mut unplaced = Vec::new();
            for &i in &todo {
                match ranks[i].get(rank[i]) {
                    Some(a) => groups
                        .entry((a.clone(), entries[i].0.id()))
                        .or_default()
                        .push(i),
                    None => unplaced.push(i),
                }
            }
            if !unplaced.is_empty() {
                return Err(TransferError::Http(ClientError::Invalid(format!(
                    "no member of the pod can be reached for {} of the entries",
                    unplaced.len()
                ))));
            }
            todo.clear();
            for ((addr, _), idx) in groups {
                let region = entries[idx[0]].0.clone();
                for chunk in idx.chunks(LIST_MAX) {
                    let sub: Vec<PrefetchEntry> =
                        chunk.iter().map(|&i| entries[i].1.clone()).collect();
                    match self.prefetch_on(&addr, ns, &region, sub, opts).await {
                        Ok(t) => parts.push((t, chunk.to_vec())),
                        Err(e) if unreachable(&e) => {
                            self.lost(&addr).await;
                            for &i in chunk {
                                rank[i] += 1;
                                todo.push(i);
                            }
                        }
                        // The tickets opened so far are cancelled as `parts` drops.
                        Err(e) => return Err(e),
                    }
                }
            }
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
