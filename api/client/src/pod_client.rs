//! A client of a whole pod that routes every request itself, with no proxy hop: it learns
//! the members from any node's `GET /v1/cluster`, computes each block's placement with
//! [`ctxpod_wire::placement`] (the same function the nodes use), and sends each request straight
//! to the member that holds the block.
//!
//! The pod's rules are [`ctxpod_wire::pod_plan`]'s, which the nodes' own paths follow too;
//! this client drives its plans over HTTP:
//! - `put` goes to the block's R highest-ranked members at once (R: the namespace's own
//!   `replication`, else the pod's from `/v1/cluster`; learnt once per namespace); a member
//!   that cannot be reached is replaced by the next in rank order and the view refreshed.
//!   It is acknowledged once R members stored the block.
//! - `get` asks the block's read candidates one after the other and returns the first good
//!   copy; a block none of them holds is a miss. After a join, a block not yet moved is
//!   found on its previous first member this way. A copy missing (or corrupt) on one of the
//!   R members is written back (read repair).
//! - `list_keys` merges every member's page ([`ctxpod_wire::pod_plan::fold_pages`]).
//! - Requests carry [`ctxpod_wire::HEADER_ROUTED`], so a node serves them itself.
//! - The view is refreshed by [`PodClient::refresh`] (call it periodically, or after a
//!   failure; the client does so itself when a member cannot be reached). A refresh asks
//!   every member known and every seed at once, and the first pod view wins.
//! - Every call has its deadlines ([`Deadlines`](crate::connect::Deadlines)). A member that
//!   misses one (or refuses connections) is *down* for `down_for`: calls ask it last rather
//!   than first, so a frozen member costs one deadline, not one per call. Any answer from
//!   it makes it up again.
//! - Calls any member may answer (namespaces, the operator's) go through
//!   [`PodClient::on_any_member`]: the members in order, down ones last, the next after a
//!   member that cannot be reached.

use crate::client::{Client, ClientError, PutOutcome};
use crate::connect::Connect;
use bytes::Bytes;
use ctxpod_wire::placement::{url_host, Member, Placement};
use ctxpod_wire::pod_plan::{
    fold_pages, ListFailure, PageAnswer, Plan, ReadAnswer, ReadOutcome, ReadPlan, WriteAnswer,
    WriteOutcome, WritePlan,
};
use ctxpod_wire::types::ClusterMember;
use ctxpod_wire::Durability;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Instant;

pub(crate) struct View {
    pub(crate) members: Vec<ClusterMember>,
    pub(crate) placement: Placement,
    /// Copies of each block (R), as the pod says.
    replication: usize,
}

pub struct PodClient {
    how: Connect,
    seeds: Vec<String>,
    view: RwLock<Arc<View>>,
    clients: RwLock<HashMap<String, Client>>,
    /// Namespaces' own replication (`None`: the pod's), as learnt; cleared by `refresh`.
    ns_replication: RwLock<HashMap<String, Option<usize>>>,
    repairs: std::sync::atomic::AtomicU64,
    /// Members that missed a deadline or could not be reached, by id: until when they are
    /// asked last.
    down: RwLock<HashMap<String, Instant>>,
    /// Clients for calls a member answers for the pod (not marked as routed), by base URL.
    pod_clients: RwLock<HashMap<String, Client>>,
}

fn placement_of(members: &[ClusterMember]) -> Placement {
    Placement::new(members.iter().map(|m| {
        Member::new(m.id.clone(), m.capacity_bytes, m.state == "draining")
            .in_domain(m.zone.clone(), url_host(&m.http))
    }))
}

/// A URL's answer to `GET /v1/cluster` that no ctxpod node gives: a refusal (4xx) without
/// ctxpod's JSON error body, or a success whose body is not a pod view. Another HTTP
/// service answers there (a wrong port, the S3 door, a web server), and the error says so,
/// naming the URL, instead of a bare `HTTP 404: None`. 5xx answers (a proxy in front of a
/// node that is down) and the rest are left as they are.
fn not_a_node(url: &str, e: ClientError) -> ClientError {
    let what = match &e {
        ClientError::Status { status, body: None } if (400..500).contains(status) => {
            format!("HTTP {status} without a ctxpod error body")
        }
        ClientError::Transport(t) if t.is_decode() => "a body that is not a pod view".to_string(),
        _ => return e,
    };
    ClientError::Malformed(format!(
        "{url} is not a ctxpod node: GET /v1/cluster answered {what} (expected a ctxpod \
         node's HTTP API URL, e.g. http://host:7400)"
    ))
}

impl PodClient {
    /// Connects to a pod through any of `seeds` (node base URLs): the first that answers
    /// `/v1/cluster` gives the members.
    pub async fn connect(seeds: &[String], how: &Connect) -> Result<PodClient, ClientError> {
        let c = PodClient {
            how: how.clone(),
            seeds: seeds.to_vec(),
            view: RwLock::new(Arc::new(View {
                members: Vec::new(),
                placement: Placement::default(),
                replication: 1,
            })),
            clients: RwLock::new(HashMap::new()),
            ns_replication: RwLock::new(HashMap::new()),
            repairs: Default::default(),
            down: RwLock::new(HashMap::new()),
            pod_clients: RwLock::new(HashMap::new()),
        };
        c.refresh().await?;
        Ok(c)
    }

    /// Asks the members known and the seeds, all at once, for the pod's members, and takes
    /// the first pod view that comes back: a seed that is frozen or gone costs nothing while
    /// another answers (each is bounded by the request deadline).
    pub async fn refresh(&self) -> Result<(), ClientError> {
        use futures::StreamExt;
        let mut urls: Vec<String> = self.view().members.iter().map(|m| m.http.clone()).collect();
        for s in &self.seeds {
            if !urls.contains(s) {
                urls.push(s.clone());
            }
        }
        let mut asked: futures::stream::FuturesUnordered<_> = urls
            .into_iter()
            .map(|u| async move {
                let got = match self.client(&u) {
                    Ok(c) => c.cluster().await,
                    Err(e) => Err(e),
                };
                (u, got)
            })
            .collect();
        let mut last = None;
        while let Some((u, got)) = asked.next().await {
            match got {
                Ok(c) if !c.members.is_empty() => {
                    // A member whose URL has another scheme than the node that named it is
                    // left out: a client of a TLS pod never sends its token over plain
                    // HTTP.
                    let scheme = u.split_once("://").map_or("", |(s, _)| s);
                    let mut members: Vec<ClusterMember> = c
                        .members
                        .into_iter()
                        .filter(|m| m.http.split_once("://").map(|(s, _)| s) == Some(scheme))
                        .collect();
                    members.sort_by(|a, b| a.id.cmp(&b.id));
                    let placement = placement_of(&members);
                    *self.view.write().expect("view") = Arc::new(View {
                        members,
                        placement,
                        replication: (c.replication as usize).max(1),
                    });
                    self.ns_replication.write().expect("ns_replication").clear();
                    return Ok(());
                }
                Ok(_) => last = Some(ClientError::Malformed("a pod with no members".into())),
                // A seed that is not a node is worth naming over one that did not answer.
                Err(e) => {
                    let e = not_a_node(&u, e);
                    if last.is_none() || matches!(e, ClientError::Malformed(_)) {
                        last = Some(e);
                    }
                }
            }
        }
        Err(last.unwrap_or_else(|| ClientError::Invalid("no seed nodes".into())))
    }

    /// Counts `m` down for the deadlines' `down_for`: asked last until then.
    pub fn mark_down(&self, id: &str) {
        let until = Instant::now() + self.how.deadlines.down_for;
        self.down
            .write()
            .expect("down")
            .insert(id.to_string(), until);
    }

    /// `m` answered: up again.
    fn mark_up(&self, id: &str) {
        if self.down.read().expect("down").contains_key(id) {
            self.down.write().expect("down").remove(id);
        }
    }

    /// The members counted down now (ids, sorted).
    pub fn down_members(&self) -> Vec<String> {
        let now = Instant::now();
        let mut ids: Vec<String> = self
            .down
            .read()
            .expect("down")
            .iter()
            .filter(|(_, until)| **until > now)
            .map(|(id, _)| id.clone())
            .collect();
        ids.sort();
        ids
    }

    /// `members` in the order to ask them: those up first, then those down, each in the
    /// order given; with each one's place in `members`.
    pub fn ask_order(&self, members: Vec<ClusterMember>) -> Vec<(usize, ClusterMember)> {
        let down = self.down_members();
        let (mut up, later): (Vec<_>, Vec<_>) = members
            .into_iter()
            .enumerate()
            .partition(|(_, m)| !down.contains(&m.id));
        up.extend(later);
        up
    }

    /// Notes how a call to member `id` ended: down when it could not be reached, up when it
    /// answered (a refusal is an answer).
    fn note<T>(&self, id: &str, r: &Result<T, ClientError>) {
        match r {
            Err(e) if unreachable(e) => self.mark_down(id),
            _ => self.mark_up(id),
        }
    }

    /// A client of member `base` for a call it answers for the whole pod (not marked as
    /// routed: a namespace change is sent on to the pod).
    fn pod_client(&self, base: &str) -> Result<Client, ClientError> {
        if let Some(c) = self.pod_clients.read().expect("clients").get(base) {
            return Ok(c.clone());
        }
        let c = Client::connect(base, &self.how)?;
        self.pod_clients
            .write()
            .expect("clients")
            .insert(base.to_string(), c.clone());
        Ok(c)
    }

    /// Runs `call` on a member that answers for the pod (namespaces, the operator's calls):
    /// the members in order, those down last; a member that cannot be reached (or misses a
    /// deadline) is counted down and the next is asked. When none can be reached the view
    /// is read again (best effort) and the last failure returned.
    pub async fn on_any_member<T, F, Fut>(&self, call: F) -> Result<T, ClientError>
    where
        F: Fn(Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        let mut last = None;
        for (_, m) in self.ask_order(self.members()) {
            let r = call(self.pod_client(&m.http)?).await;
            self.note(&m.id, &r);
            match r {
                Err(e) if unreachable(&e) => last = Some(e),
                r => return r,
            }
        }
        let _ = self.refresh().await;
        Err(last.unwrap_or_else(|| ClientError::Invalid("the pod has no members".into())))
    }

    pub(crate) fn view(&self) -> Arc<View> {
        self.view.read().expect("view").clone()
    }

    /// The pod's members as last seen, sorted by id.
    pub fn members(&self) -> Vec<ClusterMember> {
        self.view().members.clone()
    }

    /// The members a block lives on, best first (ids).
    pub fn ranked(&self, ns: &str, key: &[u8]) -> Vec<String> {
        self.ranked_members(ns, key)
            .into_iter()
            .map(|m| m.id)
            .collect()
    }

    /// The client for one member (made once, then kept).
    fn client(&self, base: &str) -> Result<Client, ClientError> {
        if let Some(c) = self.clients.read().expect("clients").get(base) {
            return Ok(c.clone());
        }
        let mut h = reqwest::header::HeaderMap::new();
        h.insert(
            ctxpod_wire::HEADER_ROUTED,
            reqwest::header::HeaderValue::from_static("pod-client"),
        );
        let c = Client::connect_with_headers(base, &self.how, h)?;
        self.clients
            .write()
            .expect("clients")
            .insert(base.to_string(), c.clone());
        Ok(c)
    }

    pub(crate) fn ranked_members(&self, ns: &str, key: &[u8]) -> Vec<ClusterMember> {
        let v = self.view();
        v.placement
            .rank(ns, key)
            .into_iter()
            .map(|i| v.members[i].clone())
            .collect()
    }

    /// Copies of each block the pod keeps (R), for namespaces that set none.
    pub fn replication(&self) -> usize {
        self.view().replication
    }

    /// Copies of each block of namespace `ns`: its own `replication`, else the pod's. Asked
    /// of a member once, then kept until the next [`refresh`](Self::refresh); a namespace
    /// that cannot be asked about takes the pod's.
    pub async fn replication_of(&self, ns: &str) -> usize {
        let known = self
            .ns_replication
            .read()
            .expect("ns_replication")
            .get(ns)
            .copied();
        let own = match known {
            Some(r) => r,
            None => {
                let asked = self
                    .on_any_member(|c| async move { c.namespace(ns).await })
                    .await
                    .ok();
                let r = asked
                    .as_ref()
                    .and_then(|i| i.replication)
                    .map(|r| r as usize);
                if asked.is_some() {
                    self.ns_replication
                        .write()
                        .expect("ns_replication")
                        .insert(ns.to_string(), r);
                }
                r
            }
        };
        own.unwrap_or_else(|| self.replication()).max(1)
    }

    /// Which members of view `v` are counted down now, by index.
    fn down_flags(&self, v: &View) -> Vec<bool> {
        let down = self.down_members();
        v.members.iter().map(|m| down.contains(&m.id)).collect()
    }

    /// The view a plan is made over ([`ctxpod_wire::pod_plan`]: members by index, sorted
    /// by id) and which of its members are counted down.
    pub(crate) fn plan_view(&self) -> (Arc<View>, Vec<bool>) {
        let v = self.view();
        let down = self.down_flags(&v);
        (v, down)
    }

    /// Stores a block on its R highest-ranked members that can be reached, all at once
    /// ([`WritePlan::put`]); acknowledged once all R stored it. A member that cannot be
    /// reached is replaced by the next (and the view is refreshed); a refusal is returned.
    pub async fn put(
        &self,
        ns: &str,
        key: &[u8],
        data: Bytes,
        durability: Durability,
    ) -> Result<PutOutcome, ClientError> {
        let crc = ctxpod_wire::crc32c(&data);
        let copies = self.replication_of(ns).await;
        let v = self.view();
        let mut plan = WritePlan::put(&v.placement, &self.down_flags(&v), ns, [key], copies);
        let mut refusal = None;
        let mut last = None;
        while let Some(round) = plan.next_round() {
            let sent = futures::future::join_all(round.into_keys().map(|m| {
                let member = &v.members[m];
                let data = data.clone();
                async move {
                    let r = match self.client(&member.http) {
                        Ok(c) => c.put_with_crc(ns, key, data, crc, durability).await,
                        Err(e) => Err(e),
                    };
                    (m, r)
                }
            }))
            .await;
            for (m, r) in sent {
                self.note(&v.members[m].id, &r);
                let a = match r {
                    Ok(o) => WriteAnswer::Applied {
                        changed: o == PutOutcome::Created,
                    },
                    Err(e) if unreachable(&e) => {
                        last = Some(e);
                        WriteAnswer::Unreachable
                    }
                    Err(e) => {
                        refusal.get_or_insert(e);
                        WriteAnswer::Refused
                    }
                };
                plan.answer(m, 0, a);
            }
        }
        if plan.unreachable().next().is_some() {
            let _ = self.refresh().await;
        }
        match plan.finish().pop() {
            Some(o @ WriteOutcome::Applied { .. }) => Ok(if o.put_status() == Some(201) {
                PutOutcome::Created
            } else {
                PutOutcome::Exists
            }),
            Some(WriteOutcome::Refused { .. }) => {
                Err(refusal.expect("a refusal kept for its outcome"))
            }
            Some(WriteOutcome::TooFew { members }) => Err(last.unwrap_or_else(|| {
                ClientError::Invalid(format!(
                    "only {} of {copies} copies stored: too few members reachable",
                    members.len()
                ))
            })),
            None => Err(ClientError::Invalid("no block to put".into())),
        }
    }

    /// A block's bytes from the first of its read candidates that holds a good copy
    /// ([`ReadPlan`]: the R copies, then further down, at least
    /// [`READ_FALLBACK`](ctxpod_wire::placement::READ_FALLBACK) members; those counted down
    /// last), or `None`. A copy missing (or corrupt) on one of its first R members is
    /// written back there (read repair).
    pub async fn get(&self, ns: &str, key: &[u8]) -> Result<Option<Bytes>, ClientError> {
        let copies = self.replication_of(ns).await;
        let v = self.view();
        let mut plan = ReadPlan::new(&v.placement, &self.down_flags(&v), ns, [key], copies);
        let (mut found, mut refusal) = (None, None);
        while let Some(round) = plan.next_round() {
            for m in round.into_keys() {
                let member = &v.members[m];
                let r = self.client(&member.http)?.get(ns, key).await;
                self.note(&member.id, &r);
                let a = match r {
                    Ok(Some(b)) => {
                        found = Some(b);
                        ReadAnswer::Hit
                    }
                    Ok(None) => ReadAnswer::Miss,
                    Err(ClientError::Integrity { .. }) => ReadAnswer::Corrupt,
                    Err(e) if unreachable(&e) => ReadAnswer::Unreachable,
                    Err(e) => {
                        refusal = Some(e);
                        ReadAnswer::Final
                    }
                };
                plan.answer(m, 0, a);
            }
        }
        if plan.unreachable().next().is_some() {
            let _ = self.refresh().await;
        }
        match plan.finish().pop() {
            Some(ReadOutcome::Hit { repair, .. }) => {
                let b = found.expect("the bytes of a hit");
                for m in repair {
                    let _ = self.repair(&v.members[m], ns, key, &b).await;
                }
                Ok(Some(b))
            }
            Some(ReadOutcome::Final { .. }) => Err(refusal.expect("the answer of a final")),
            _ => Ok(None),
        }
    }

    /// Deletes a block from the pod: sent, not marked as routed, to the first of its ranked
    /// members that answers, which records the delete (a tombstone, with etcd) and sends it
    /// to every member a read would try. True if a member held it.
    pub async fn delete(&self, ns: &str, key: &[u8]) -> Result<bool, ClientError> {
        let mut last = None;
        for (_, m) in self.ask_order(self.ranked_members(ns, key)) {
            let r = self.pod_client(&m.http)?.delete(ns, key).await;
            self.note(&m.id, &r);
            match r {
                Err(e) if unreachable(&e) => {
                    last = Some(e);
                    let _ = self.refresh().await;
                }
                r => return r,
            }
        }
        Err(last.unwrap_or_else(|| ClientError::Invalid("the pod has no members".into())))
    }

    /// One page of namespace `ns`'s keys across the pod (see [`Client::list_keys`]): each
    /// member is asked for its own page, and the pages are merged
    /// ([`ctxpod_wire::key::merge_pages`]). A member that cannot be reached fails the
    /// listing (after a refresh of the view), since a page without its keys would look
    /// complete.
    pub async fn list_keys(
        &self,
        ns: &str,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<crate::client::KeyPage, ClientError> {
        let members = self.members();
        let asked = futures::future::join_all(members.iter().map(|m| async move {
            self.client(&m.http)?
                .list_keys(ns, prefix, after, limit)
                .await
        }))
        .await;
        let mut errors = HashMap::new();
        let answers: Vec<(usize, PageAnswer<()>)> = asked
            .into_iter()
            .enumerate()
            .map(|(i, got)| {
                let a = match got {
                    Ok(p) => PageAnswer::Page(
                        p.keys.into_iter().map(|k| (k, ())).collect(),
                        p.next.is_some(),
                    ),
                    // A member that does not know the namespace yet holds none of its keys.
                    Err(e) if e.status() == Some(404) => {
                        errors.insert(i, e);
                        PageAnswer::UnknownNamespace
                    }
                    Err(e) => {
                        errors.insert(i, e);
                        PageAnswer::Unreachable
                    }
                };
                (i, a)
            })
            .collect();
        let (entries, more) = match fold_pages(answers, limit) {
            Ok(merged) => merged,
            Err(ListFailure::Unreachable(m)) => {
                let e = errors.remove(&m).expect("the failure of a member");
                if unreachable(&e) {
                    let _ = self.refresh().await;
                }
                return Err(e);
            }
            Err(ListFailure::UnknownNamespace) => {
                return Err(errors.into_values().next().expect("a member's 404"))
            }
        };
        let keys: Vec<Vec<u8>> = entries.into_iter().map(|(k, ())| k).collect();
        let next = if more { keys.last().cloned() } else { None };
        Ok(crate::client::KeyPage {
            keys,
            next,
            blocks: None,
        })
    }

    /// Writes a copy back to a member that should hold one. `fast`: a lost repair is
    /// repaired again by a later read.
    pub(crate) async fn repair(
        &self,
        m: &ClusterMember,
        ns: &str,
        key: &[u8],
        data: &Bytes,
    ) -> Result<(), ClientError> {
        // Marked as a copy: a member that holds a tombstone for the block (it was deleted
        // while the member we read it from was away) refuses it.
        self.client(&m.http)?
            .put_copy(ns, key, data.clone())
            .await?;
        self.repairs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Copies written back by read repair so far.
    pub fn repairs(&self) -> u64 {
        self.repairs.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// A member that failed at the transport (connect refused, timed out, the connection cut
/// mid-request as when a node dies): another member may serve. Reads and puts are both
/// safe to send again (a put of the same bytes answers 200).
fn unreachable(e: &ClientError) -> bool {
    matches!(e, ClientError::Transport(_))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// An HTTP service that is not a ctxpod node: every request answers `status` with an
    /// HTML page.
    async fn other_service(status: &'static str) -> String {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let body = "<html><body>not here</body></html>";
                let head = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: text/html\r\nContent-Length: {}\r\n\
                     Connection: close\r\n\r\n",
                    body.len()
                );
                let _ = s.write_all(head.as_bytes()).await;
                let _ = s.write_all(body.as_bytes()).await;
            }
        });
        url
    }

    #[tokio::test]
    async fn a_seed_that_is_not_a_ctxpod_node_is_named() {
        for status in ["404 Not Found", "200 OK"] {
            let url = other_service(status).await;
            let e = match PodClient::connect(std::slice::from_ref(&url), &Connect::default()).await
            {
                Ok(_) => panic!("{status}: connected to a service that is not a ctxpod node"),
                Err(e) => e,
            };
            let msg = e.to_string();
            assert!(matches!(e, ClientError::Malformed(_)), "{status}: {msg}");
            assert!(
                msg.contains(&url) && msg.contains("not a ctxpod node"),
                "{status}: {msg}"
            );
        }
    }
}
