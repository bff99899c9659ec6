//! `batch/get`, `batch/put`, `pin` and `unpin`: here, or for the whole pod (the members'
//! shares asked at once, answers admitted before they are fetched).

use crate::auth::Principal;
use axum::body::Body;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use ctxpod_engine::{Found, PutStatus};
use ctxpod_pod::batch as pod_batch;
use ctxpod_wire::pod_plan::{
    Plan, ReadAnswer, ReadPlan, Round, WriteAnswer, WriteOutcome, WritePlan,
};
use ctxpod_wire::types::*;
use ctxpod_wire::{frame, Durability};
use futures::StreamExt;
use std::time::Duration;

use super::blocks::{body_holding, Peer};
use super::input::{content_length, durability, parse_keys, read_body, read_json};
use super::input::{Keys, NsCall};
use super::state::{AppState, BATCH_CONCURRENCY, BATCH_GET_BYTES_MAX};
use crate::errors::{status_of, ApiError, ApiResult};

pub(crate) async fn batch_get(
    NsCall { st, p, ns, scoped }: NsCall,
    Peer(peer): Peer,
    h: HeaderMap,
    Keys(keys): Keys<{ ctxpod_wire::BATCH_ENTRIES_MAX }>,
) -> ApiResult<Response> {
    st.engine.namespace(&scoped)?;
    let room = match h.get(ctxpod_wire::HEADER_ANSWER_BYTES_MAX) {
        None => BATCH_GET_BYTES_MAX,
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| ApiError::invalid("x-ctxpod-answer-bytes-max must be a number"))?
            .min(BATCH_GET_BYTES_MAX as u64) as usize,
    };
    let client = crate::budget::Client::at(peer, &p);
    let (results, permits) = if st.answers_for_pod(&h) {
        pod_batch_get(&st, client, &p, &ns, &scoped, &h, &keys, room).await
    } else {
        admitted_batch_get(&st, Some(client), &scoped, &keys, room).await
    };
    let mut budget = BATCH_GET_BYTES_MAX;
    let mut out = Vec::new();
    frame::encode_header(results.len() as u32, &mut out);
    let mut sent = 0u64;
    for (k, g) in keys.iter().zip(&results) {
        let fits = g.data.as_ref().filter(|d| d.len() <= budget);
        if let Some(d) = fits {
            budget -= d.len();
            sent += d.len() as u64;
        }
        let over = g.status == 200 && fits.is_none();
        frame::encode_entry(
            &frame::Entry {
                key: k,
                status: if over { 413 } else { g.status },
                crc32c: g.crc32c,
                len: g.len,
                data: fits.map(|d| &d[..]),
            },
            &mut out,
        );
    }
    drop(results);
    st.metrics.sent_bytes.inc_by(sent);
    // The frame holds the answer's egress share until it is written out.
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (header::CONTENT_LENGTH, out.len().to_string()),
        ],
        body_holding(vec![Bytes::from(out)], permits),
    )
        .into_response())
}

/// A `batch/get` served here: blocks admitted in order while they fit the answer
/// ([`BATCH_GET_BYTES_MAX`]) and the node's egress budget, each taken before the read; only
/// admitted blocks are read, the others answer 413 (the answer is full: ask again for
/// them) or 503 (busy) without costing anything.
///
/// `charge`: `Some(client)` takes each block from the egress budget (the client's share,
/// waiting for it before the first block if need be, and the node's); `None` when the
/// caller reserved the room already (a pod batch's own part).
pub(crate) async fn admitted_batch_get(
    st: &AppState,
    charge: Option<Option<crate::budget::Client>>,
    scoped: &str,
    keys: &[Vec<u8>],
    mut room: usize,
) -> (Vec<pod_batch::Got>, Vec<crate::budget::Permit>) {
    let mut permits = Vec::new();
    let mut busy = 0u64;
    let mut egress = charge.map(|client| st.budgets.egress_for(client));
    // Per key: the block found (one index read), admitted, or the status it answers.
    let mut plan: Vec<Result<Found, u16>> = Vec::with_capacity(keys.len());
    for k in keys {
        plan.push(match st.engine.find(scoped, k) {
            Err(e) => Err(status_of(&e).0.as_u16()),
            Ok(None) => Err(404),
            Ok(Some(f)) if f.len() > room => Err(413),
            Ok(Some(f)) => match &mut egress {
                None => {
                    room -= f.len();
                    Ok(f)
                }
                Some(e) => match e.take(f.len()).await {
                    Some(p) => {
                        room -= f.len();
                        permits.extend(p);
                        Ok(f)
                    }
                    None => {
                        busy += 1;
                        Err(503)
                    }
                },
            },
        });
    }
    if busy > 0 {
        st.engine
            .metrics()
            .busy_rejections
            .with_label_values(&["egress"])
            .inc_by(busy);
    }
    // Owned keys: the stream's futures may not borrow from the closure's argument.
    let got = futures::stream::iter(plan.into_iter().zip(keys.to_vec()).map(|(p, k)| {
        let engine = st.engine.clone();
        async move {
            let f = match p {
                Ok(f) => f,
                Err(st) => return refused(st),
            };
            let len = f.len();
            match engine.read_found(&k, f).await {
                // Stored again, larger, since it was admitted: ask again.
                Ok(Some((d, _))) if d.len() > len => refused(503),
                Ok(got) => answer(got),
                Err(e) => refused(status_of(&e).0.as_u16()),
            }
        }
    }))
    .buffered(BATCH_CONCURRENCY)
    .collect()
    .await;
    (got, permits)
}

/// The answer for one key of a batch: its block, or 404.
fn answer(got: Option<(Bytes, u32)>) -> pod_batch::Got {
    match got {
        Some((d, crc)) => pod_batch::Got {
            status: 200,
            crc32c: Some(crc),
            len: d.len() as u32,
            data: Some(d),
        },
        None => refused(404),
    }
}

/// A `batch/get` for the whole pod (`pod::batch`): each key at its candidates in rank
/// order, one round per rank, each round's members asked at once.
///
/// Admitted before it is fetched: each round splits the answer's room left (at most
/// `room`, 64 MiB) among the members it asks (a block's worth each at least; members
/// beyond that are not asked and their keys answer 413), takes each share from the egress budget
/// before asking (a share it cannot have answers 503), tells each member its share
/// (`x-ctxpod-answer-bytes-max`; blocks beyond answer 413, as do blocks a member sends
/// beyond it), and gives back what the answers did not use. This node's own part is
/// admitted block by block within its share. So a pod batch holds at most `room` bytes of
/// blocks, whatever the members hold.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn pod_batch_get(
    st: &AppState,
    client: Option<crate::budget::Client>,
    p: &Principal,
    ns: &str,
    scoped: &str,
    h: &HeaderMap,
    keys: &[Vec<u8>],
    mut room: usize,
) -> (Vec<pod_batch::Got>, Vec<crate::budget::Permit>) {
    let mut held: Vec<crate::budget::Permit> = Vec::new();
    let mut egress = st.budgets.egress_for(client);
    let view = st.pod.view();
    let mut b = PodBatch {
        plan: ReadPlan::new(
            &view.placement,
            &st.peers.missed.flags(&view),
            ns,
            keys,
            st.replication_of(scoped),
        ),
        out: vec![None; keys.len()],
    };
    let asker = st.asker(ns, h, p);
    while let Some(groups) = b.plan.next_round() {
        // Every share holds a whole block at least, so a batch always makes progress: the
        // members that do not fit this answer's room are not asked (their keys answer 413:
        // ask again).
        let share = (room / groups.len()).max(ctxpod_wire::BLOCK_BYTES_MAX.min(room));
        let fit = room.checked_div(share).unwrap_or(0);
        let asks = b.admit_round(st, &mut egress, groups, share, fit).await;
        let answers = ask_round(st, &asker, &view, scoped, keys, share, asks).await;
        for (m, idx, r, mut permits) in answers {
            let used = b.take(m, idx, r, share);
            // What the answer did not use goes back to the budget.
            for permit in &mut permits {
                drop(permit.split(share.max(1) - used.min(share.max(1))));
            }
            if used > 0 {
                held.extend(permits);
            }
            room -= used;
        }
    }
    let got = b
        .out
        .into_iter()
        .map(|g| g.unwrap_or_else(|| refused(404)))
        .collect();
    (got, held)
}

/// The answer of a key refused with `status` (nothing fetched).
fn refused(status: u16) -> pod_batch::Got {
    pod_batch::Got {
        status,
        crc32c: None,
        len: 0,
        data: None,
    }
}

/// A member asked in a round of a pod batch: its index in the view, the entries asked of
/// it, and its share of the egress budget.
type Ask = (usize, Vec<usize>, Vec<crate::budget::Permit>);

/// A member's answer to its ask in a round (its blocks, or why none), with the ask.
type Asked = (
    usize,
    Vec<usize>,
    Result<Vec<pod_batch::Got>, pod_batch::PeerError>,
    Vec<crate::budget::Permit>,
);

/// A pod batch's reads: the plan of whom to ask for each key, and each key's answer once
/// it has its final one.
struct PodBatch {
    plan: ReadPlan,
    out: Vec<Option<pod_batch::Got>>,
}

impl PodBatch {
    /// Answers entries `idx` (asked of member `m`) with `status`, final.
    fn refuse_all(&mut self, m: usize, idx: Vec<usize>, status: u16) {
        for i in idx {
            self.out[i] = Some(refused(status));
            self.plan.answer(m, i, ReadAnswer::Final);
        }
    }

    /// Admits a round: each member's `share` of the room taken from the egress budget
    /// before it is asked. The members beyond the first `fit` are not asked (413), nor are
    /// those whose share the budget cannot give (503).
    async fn admit_round(
        &mut self,
        st: &AppState,
        egress: &mut crate::budget::EgressTaker<'_>,
        groups: Round,
        share: usize,
        fit: usize,
    ) -> Vec<Ask> {
        let mut asks = Vec::new();
        for (g, (m, idx)) in groups.into_iter().enumerate() {
            if g >= fit {
                self.refuse_all(m, idx, 413);
                continue;
            }
            match egress.take(share.max(1)).await {
                Some(permits) => asks.push((m, idx, permits)),
                None => {
                    st.engine
                        .metrics()
                        .busy_rejections
                        .with_label_values(&["egress"])
                        .inc_by(idx.len() as u64);
                    self.refuse_all(m, idx, 503);
                }
            }
        }
        asks
    }

    /// Takes member `m`'s answer `r` about entries `idx` into the plan, keeping at most
    /// `share` bytes of its blocks (those beyond answer 413). The bytes it kept.
    fn take(
        &mut self,
        m: usize,
        idx: Vec<usize>,
        r: Result<Vec<pod_batch::Got>, pod_batch::PeerError>,
        share: usize,
    ) -> usize {
        let mut used = 0usize;
        match r {
            Ok(got) => {
                for (i, mut g) in idx.into_iter().zip(got) {
                    let len = g.data.as_ref().map_or(0, |d| d.len());
                    if used + len > share {
                        // Over the share the member was given: not kept.
                        g = refused(413);
                    } else {
                        used += len;
                    }
                    // A miss here may be a hit at the next candidate.
                    let a = match g.status {
                        404 => ReadAnswer::Miss,
                        200 => ReadAnswer::Hit,
                        _ => ReadAnswer::Final,
                    };
                    if a != ReadAnswer::Miss {
                        self.out[i] = Some(g);
                    }
                    self.plan.answer(m, i, a);
                }
            }
            Err(e) => match e.status() {
                // Unreachable, or without the namespace: the next candidate is asked.
                None => self.plan.answer_all(m, &idx, ReadAnswer::Unreachable),
                Some(404) => self.plan.answer_all(m, &idx, ReadAnswer::Miss),
                Some(status) => self.refuse_all(m, idx, status),
            },
        }
        used
    }
}

/// Asks a round's members at once, each for its entries within its `share` (this node's
/// own part read here, admitted block by block); each answer with its ask.
async fn ask_round(
    st: &AppState,
    asker: &pod_batch::Asker<'_>,
    view: &ctxpod_pod::membership::PodView,
    scoped: &str,
    keys: &[Vec<u8>],
    share: usize,
    asks: Vec<Ask>,
) -> Vec<Asked> {
    futures::future::join_all(asks.into_iter().map(|(m, idx, permits)| {
        let member = &view.members[m];
        async move {
            let r = if member.id == *st.node_id {
                let ks: Vec<Vec<u8>> = idx.iter().map(|&i| keys[i].clone()).collect();
                Ok(admitted_batch_get(st, None, scoped, &ks, share).await.0)
            } else {
                let ks: Vec<&[u8]> = idx.iter().map(|&i| &keys[i][..]).collect();
                asker.batch_get(member, &ks, share).await
            };
            (m, idx, r, permits)
        }
    }))
    .await
}

pub(crate) async fn batch_put(
    NsCall { st, p, ns, scoped }: NsCall,
    sock: super::blocks::ClientSocket,
    h: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let dur = durability(&h)?;
    st.engine.namespace(&scoped)?;
    let declared = content_length(&h);
    st.check_tenant_bytes(&p, declared.unwrap_or(0))?;
    // Room for the frame and for each block's staged copy.
    let budget = 2 * declared
        .unwrap_or(ctxpod_wire::BATCH_BODY_BYTES_MAX)
        .min(ctxpod_wire::BATCH_BODY_BYTES_MAX);
    let _permit = st.admit_body(budget)?;
    let body = read_body(&h, body, ctxpod_wire::BATCH_BODY_BYTES_MAX).await?;
    let entries = frame::decode(&body).map_err(|e| match e {
        // A value over one record is a PUT of its own (streamed as extents).
        frame::FrameError::TooLarge(..) => ApiError::too_large(format!(
            "{e}: a batch carries blocks of up to {} bytes; PUT a larger value on its own \
             (/v1/namespaces/{{ns}}/blocks/{{key}})",
            ctxpod_wire::BLOCK_BYTES_MAX
        )),
        e => ApiError::invalid(format!("bad batch frame: {e}")),
    })?;
    let mut jobs = Vec::with_capacity(entries.len());
    for (i, e) in entries.iter().enumerate() {
        let Some(d) = e.data else {
            return Err(ApiError::invalid(format!(
                "batch entry {i} carries no data"
            )));
        };
        if d.len() != e.len as usize {
            return Err(ApiError::invalid(format!(
                "batch entry {i}: length mismatch"
            )));
        }
        jobs.push((e.key.to_vec(), body.slice_ref(d), e.crc32c));
    }
    st.metrics.received_bytes.inc_by(body.len() as u64);
    sock.still_there(&st)?;
    let statuses = if st.answers_for_pod(&h) {
        pod_batch_put(&st, &p, &ns, &scoped, &h, &jobs, dur).await
    } else {
        // Copies of blocks the pod deleted are refused one by one (410); the rest stored.
        let mut statuses = vec![0u16; jobs.len()];
        let mut store = Vec::with_capacity(jobs.len());
        for (i, (k, _, _)) in jobs.iter().enumerate() {
            match st.refuse_deleted_copy(&h, &scoped, k) {
                Ok(()) => store.push(i),
                Err(e) => statuses[i] = e.status.as_u16(),
            }
        }
        for (i, s) in store
            .iter()
            .zip(local_batch_put(&st, &scoped, &jobs, &store, dur).await)
        {
            statuses[*i] = s;
        }
        // A copy whose tombstone arrived while it was stored is deleted again (410).
        for i in store {
            if matches!(statuses[i], 200 | 201) {
                if let Err(e) = st.undo_deleted_copy(&h, &scoped, &jobs[i].0).await {
                    statuses[i] = e.status.as_u16();
                }
            }
        }
        statuses
    };
    let mut out = Vec::new();
    frame::encode_header(jobs.len() as u32, &mut out);
    for ((k, d, _), status) in jobs.iter().zip(statuses) {
        frame::encode_entry(
            &frame::Entry {
                key: k,
                status,
                crc32c: Some(ctxpod_wire::crc32c(d)),
                len: d.len() as u32,
                data: None,
            },
            &mut out,
        );
    }
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], out).into_response())
}

/// A block of a `batch/put`: key, bytes, the CRC32C the client gave.
pub(crate) type PutJob = (Vec<u8>, Bytes, Option<u32>);

/// This node stores `jobs[idx]`: per block, its status.
pub(crate) async fn local_batch_put(
    st: &AppState,
    scoped: &str,
    jobs: &[PutJob],
    idx: &[usize],
    dur: Durability,
) -> Vec<u16> {
    futures::future::join_all(idx.iter().map(|&i| {
        let (k, d, crc) = &jobs[i];
        let engine = st.engine.clone();
        async move {
            match engine.put(scoped, k, d.clone(), *crc, dur).await {
                Ok(PutStatus::Created) => 201,
                Ok(PutStatus::Exists) => 200,
                Err(e) => status_of(&e).0.as_u16(),
            }
        }
    }))
    .await
}

/// A `batch/put` for the whole pod (`pod::batch`): each block to its R first-ranked
/// members that can be reached, the members of a round asked at once.
pub(crate) async fn pod_batch_put(
    st: &AppState,
    p: &Principal,
    ns: &str,
    scoped: &str,
    h: &HeaderMap,
    jobs: &[PutJob],
    dur: Durability,
) -> Vec<u16> {
    let view = st.pod.view();
    let keys = jobs.iter().map(|(k, _, _)| k);
    let down = st.peers.missed.flags(&view);
    let mut plan = WritePlan::put(&view.placement, &down, ns, keys, st.replication_of(scoped));
    let asker = st.asker(ns, h, p);
    let mut refused: Vec<Option<u16>> = vec![None; jobs.len()];
    while let Some(round) = plan.next_round() {
        let answers = futures::future::join_all(round.into_iter().map(|(m, idx)| {
            let (asker, member) = (&asker, &view.members[m]);
            async move {
                let r = if member.id == *st.node_id {
                    Ok(local_batch_put(st, scoped, jobs, &idx, dur).await)
                } else {
                    let blocks: Vec<(&[u8], &Bytes)> =
                        idx.iter().map(|&i| (&jobs[i].0[..], &jobs[i].1)).collect();
                    asker
                        .batch_put(member, &blocks, h.get(ctxpod_wire::HEADER_DURABILITY))
                        .await
                };
                (m, idx, r)
            }
        }))
        .await;
        for (m, idx, r) in answers {
            // Unreachable (no status): the next round asks the next member in rank order.
            let statuses = match r {
                Ok(statuses) => statuses.into_iter().map(Some).collect(),
                Err(e) => vec![e.status(); idx.len()],
            };
            for (i, s) in idx.into_iter().zip(statuses) {
                let a = match s {
                    None => WriteAnswer::Unreachable,
                    Some(s @ (200 | 201)) => WriteAnswer::Applied { changed: s == 201 },
                    Some(s) => {
                        refused[i].get_or_insert(s);
                        WriteAnswer::Refused
                    }
                };
                plan.answer(m, i, a);
            }
        }
    }
    plan.finish()
        .into_iter()
        .zip(refused)
        .map(|(o, refused)| match o {
            WriteOutcome::Refused { .. } => refused.unwrap_or(503),
            o => o.put_status().unwrap_or(503),
        })
        .collect()
}

pub(crate) async fn pin(
    NsCall { st, p, ns, scoped }: NsCall,
    h: HeaderMap,
    body: Body,
) -> ApiResult<Json<PinResponse>> {
    let req: PinRequest = read_json(&h, body).await?;
    if req.ttl_ms == 0 || req.ttl_ms > ctxpod_wire::LEASE_MS_MAX {
        return Err(ApiError::invalid(format!(
            "ttl_ms must be within 1..={}",
            ctxpod_wire::LEASE_MS_MAX
        )));
    }
    let keys = parse_keys(&req.keys, ctxpod_wire::BATCH_ENTRIES_MAX)?;
    let (pinned, each) = pin_or_unpin(&st, &p, &ns, &scoped, &h, keys, Some(req.ttl_ms)).await?;
    Ok(Json(PinResponse { pinned, each }))
}

pub(crate) async fn unpin(
    NsCall { st, p, ns, scoped }: NsCall,
    h: HeaderMap,
    Keys(keys): Keys<{ ctxpod_wire::BATCH_ENTRIES_MAX }>,
) -> ApiResult<Json<UnpinResponse>> {
    let (unpinned, each) = pin_or_unpin(&st, &p, &ns, &scoped, &h, keys, None).await?;
    Ok(Json(UnpinResponse { unpinned, each }))
}

/// Moves `keys` to the fast tier: here, or at every candidate member of each key in a pod
/// (each member holding a copy moves its own).
pub(crate) async fn promote(
    NsCall { st, p, ns, scoped }: NsCall,
    h: HeaderMap,
    Keys(keys): Keys<{ ctxpod_wire::BATCH_ENTRIES_MAX }>,
) -> ApiResult<Json<PromoteResponse>> {
    Ok(Json(promote_keys(&st, &p, &ns, &scoped, &h, keys).await?))
}

async fn promote_keys(
    st: &AppState,
    p: &Principal,
    ns: &str,
    scoped: &str,
    h: &HeaderMap,
    keys: Vec<Vec<u8>>,
) -> ApiResult<PromoteResponse> {
    // Per key: whether this member moved it now, and whether it is in its fast tier.
    let local = |ks: Vec<Vec<u8>>| async move {
        use ctxpod_engine::Promotion::{Fast, Promoted};
        let fates = st.engine.promote(scoped, ks).await?;
        let moved = fates.iter().map(|f| *f == Promoted).collect();
        let each = fates.iter().map(|f| matches!(f, Promoted | Fast)).collect();
        Ok::<_, ctxpod_engine::EngineError>((moved, each))
    };
    let count = |each: &[bool]| each.iter().filter(|b| **b).count() as u64;
    if !st.answers_for_pod(h) {
        let (moved, each): (Vec<bool>, Vec<bool>) = local(keys).await?;
        let routed = h.contains_key(ctxpod_pod::route::HEADER_FORWARDED);
        return Ok(PromoteResponse {
            promoted: count(&moved),
            fast: count(&each),
            each: routed.then_some(each),
            moved: routed.then_some(moved),
        });
    }
    st.engine.namespace(scoped)?;
    let view = st.pod.view();
    let asker = st.asker(ns, h, p);
    // A key counts once however many of its holders moved it.
    let moved_any = parking_lot::Mutex::new(vec![false; keys.len()]);
    let each = st
        .any_candidate(&view, ns, scoped, &keys, |m, idx| {
            let (asker, keys, local, moved_any) = (&asker, &keys, &local, &moved_any);
            async move {
                let (moved, each) = if m.id == *st.node_id {
                    local(idx.iter().map(|&i| keys[i].clone()).collect())
                        .await
                        .ok()?
                } else {
                    let ks: Vec<&[u8]> = idx.iter().map(|&i| &keys[i][..]).collect();
                    asker.promote(m, &ks).await.ok()?
                };
                let mut any = moved_any.lock();
                for (&i, moved) in idx.iter().zip(moved) {
                    any[i] |= moved;
                }
                Some(each)
            }
        })
        .await;
    Ok(PromoteResponse {
        promoted: count(&moved_any.into_inner()),
        fast: count(&each),
        each: None,
        moved: None,
    })
}

/// Pins (`ttl_ms` given) or unpins `keys`: here, or at every candidate member of each key
/// in a pod (`pod::batch`). How many keys were, and per key whether it was when the
/// request was routed here by another member.
pub(crate) async fn pin_or_unpin(
    st: &AppState,
    p: &Principal,
    ns: &str,
    scoped: &str,
    h: &HeaderMap,
    keys: Vec<Vec<u8>>,
    ttl_ms: Option<u64>,
) -> ApiResult<(u64, Option<Vec<bool>>)> {
    let local = |ks: Vec<Vec<u8>>| async move {
        match ttl_ms {
            Some(t) => {
                st.engine
                    .pin_each(scoped, ks, Duration::from_millis(t))
                    .await
            }
            None => st.engine.unpin_each(scoped, ks).await,
        }
    };
    let count = |each: &[bool]| each.iter().filter(|b| **b).count() as u64;
    if !st.answers_for_pod(h) {
        let each = local(keys).await?;
        let routed = h.contains_key(ctxpod_pod::route::HEADER_FORWARDED);
        return Ok((count(&each), routed.then_some(each)));
    }
    st.engine.namespace(scoped)?;
    let view = st.pod.view();
    let asker = st.asker(ns, h, p);
    // A member that cannot answer holds no copy that this changes.
    let each = st
        .any_candidate(&view, ns, scoped, &keys, |m, idx| {
            let (asker, keys, local) = (&asker, &keys, &local);
            async move {
                if m.id == *st.node_id {
                    return local(idx.iter().map(|&i| keys[i].clone()).collect())
                        .await
                        .ok();
                }
                let ks: Vec<&[u8]> = idx.iter().map(|&i| &keys[i][..]).collect();
                asker.pin(m, &ks, ttl_ms).await.ok()
            }
        })
        .await;
    Ok((count(&each), None))
}
