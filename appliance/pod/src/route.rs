//! Any node answers: a single-block request (`GET`, `HEAD`, `PUT`, `DELETE` of
//! `/v1/namespaces/{ns}/blocks/{key}`) sent to a node that does not hold the block is
//! forwarded to the member that does, so plain HTTP clients need not know the placement.
//! (The Rust client routes directly and never pays this hop.)
//!
//! The rules, with R copies per block (`pod.replication`, 1 by default):
//! - `PUT` goes to the block's R highest-ranked members that can be reached (a member that
//!   cannot is skipped for the next in rank order: a block written there is found by reads
//!   falling back along the ranking) and is acknowledged once all R stored it. `DELETE`
//!   goes to every member a read would look at.
//! - `GET` and `HEAD` try the first max(3, R + 1) ranked members in order (this node first
//!   when it is one of them: no hop) and answer with the first hit; a block held by none of
//!   them, or on members that cannot be reached, is a miss (404), never an error that stalls
//!   the engine.
//! - A forwarded request carries [`HEADER_FORWARDED`]; a node serves such a request itself,
//!   so a request crosses at most one hop and never loops.
//! - The caller's `Authorization` header travels with it: every node of a pod shares its
//!   tokens (the Helm chart mounts one Secret). Client certificates do not travel: members
//!   reached over `https://` are trusted through `pod.peer_ca_file` (or the node's client
//!   CA) and see the forwarding node's own certificate ([`super::Peers`]).

use super::membership::{MemberInfo, PodView};
use http::{HeaderValue, Method};

/// Set on a forwarded request, to the forwarding node's id (a pod-aware client sets it too:
/// its requests are already routed).
pub const HEADER_FORWARDED: &str = ctxpod_wire::HEADER_ROUTED;
pub use ctxpod_wire::placement::{read_candidates, READ_FALLBACK};

/// The namespace and key of a single-block route, from the request path.
pub fn block_of(path: &str) -> Option<(&str, Vec<u8>)> {
    let rest = path.strip_prefix("/v1/namespaces/")?;
    let (ns, rest) = rest.split_once('/')?;
    let key = rest.strip_prefix("blocks/")?;
    if ns.is_empty() || key.contains('/') {
        return None;
    }
    Some((ns, hex::decode(key).ok()?))
}

/// Where a request for a block should be served: here, or these members in order.
pub enum Route {
    Local,
    /// For reads: try these in order (this node, when listed, is served locally first).
    Read(Vec<MemberInfo>),
    /// For writes: the first `copies` of these that can be reached each take it (this node
    /// among them, at its place in the ranking); acknowledged when all of them stored it.
    Write {
        members: Vec<MemberInfo>,
        copies: usize,
    },
}

/// Decides where a block request goes, from the pod view and the replication factor.
pub fn route(
    view: &PodView,
    me: &str,
    method: &Method,
    ns: &str,
    key: &[u8],
    replication: usize,
) -> Route {
    if view.members.len() < 2 {
        return Route::Local;
    }
    let ranked: Vec<MemberInfo> = view.ranked(ns, key).into_iter().cloned().collect();
    match *method {
        Method::GET | Method::HEAD => {
            let candidates: Vec<MemberInfo> = ranked
                .into_iter()
                .take(read_candidates(replication))
                .collect();
            if candidates.len() == 1 && candidates[0].id == me {
                Route::Local
            } else {
                Route::Read(candidates)
            }
        }
        Method::PUT if replication == 1 && ranked.first().is_some_and(|m| m.id == me) => {
            Route::Local
        }
        Method::PUT => Route::Write {
            members: ranked,
            copies: replication,
        },
        // A delete reaches every member a read would look at, so no copy is left behind.
        Method::DELETE => Route::Write {
            copies: read_candidates(replication).min(ranked.len()),
            members: ranked,
        },
        _ => Route::Local,
    }
}

/// Whether a member's answer to a block GET may be passed on: its body matches the CRC32C
/// it announced (`x-ctxpod-crc32c`). Bytes taken from a member are checked like bytes read
/// from flash: a member that lies, or a path that damaged them, costs a fall-back, never a
/// wrong byte served.
pub fn member_block_intact(body: &[u8], crc_header: Option<&HeaderValue>) -> bool {
    let Some(want) = crc_header
        .and_then(|v| v.to_str().ok())
        .and_then(|v| u32::from_str_radix(v, 16).ok())
    else {
        return false;
    };
    ctxpod_wire::crc32c(body) == want
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::membership::MemberState;

    fn view(ids: &[&str]) -> PodView {
        PodView::new(
            ids.iter().map(|id| MemberInfo {
                id: id.to_string(),
                http: format!("http://{id}"),
                transfer: None,
                capacity: 1 << 30,
                zone: String::new(),
                state: MemberState::Up,
            }),
            1,
        )
    }

    #[test]
    fn a_member_block_passes_only_with_its_crc() {
        let body = b"some block bytes";
        let good = HeaderValue::from_str(&ctxpod_wire::crc32c_hex(ctxpod_wire::crc32c(body)))
            .expect("header");
        assert!(member_block_intact(body, Some(&good)));
        assert!(!member_block_intact(b"other bytes", Some(&good)));
        assert!(!member_block_intact(body, None));
        assert!(!member_block_intact(
            body,
            Some(&HeaderValue::from_static("zz"))
        ));
    }

    #[test]
    fn block_routes_are_recognised() {
        assert_eq!(
            block_of("/v1/namespaces/default/blocks/0a1b"),
            Some(("default", vec![0x0a, 0x1b]))
        );
        assert_eq!(block_of("/v1/namespaces/default/blocks/zz"), None);
        assert_eq!(block_of("/v1/namespaces/default/match"), None);
        assert_eq!(block_of("/v1/namespaces//blocks/00"), None);
        assert_eq!(block_of("/v1/stats"), None);
    }

    #[test]
    fn a_pod_of_one_serves_everything_locally() {
        let v = view(&["a"]);
        for m in [Method::GET, Method::PUT, Method::DELETE, Method::HEAD] {
            assert!(matches!(route(&v, "a", &m, "ns", b"k", 2), Route::Local));
        }
    }

    #[test]
    fn writes_go_to_the_first_ranked_and_reads_try_the_first_three() {
        let v = view(&["a", "b", "c", "d"]);
        let mut local_writes = 0;
        for i in 0..200u32 {
            let key = i.to_be_bytes();
            let first = v.ranked("ns", &key)[0].id.clone();
            match route(&v, "a", &Method::PUT, "ns", &key, 1) {
                Route::Local => {
                    assert_eq!(first, "a");
                    local_writes += 1;
                }
                Route::Write { members, copies } => {
                    assert_eq!(members[0].id, first);
                    assert_eq!((members.len(), copies), (4, 1));
                }
                Route::Read(_) => panic!("a write routed as a read"),
            }
            // With two copies every put is spread, even from its first member.
            assert!(matches!(
                route(&v, "a", &Method::PUT, "ns", &key, 2),
                Route::Write { copies: 2, .. }
            ));
            match route(&v, "a", &Method::GET, "ns", &key, 1) {
                Route::Read(ms) => {
                    assert_eq!(ms.len(), READ_FALLBACK);
                    assert_eq!(ms[0].id, first);
                }
                _ => panic!("a read of a 4-node pod is tried on three members"),
            }
        }
        // About a quarter of the blocks are "a"'s own.
        assert!((30..=70).contains(&local_writes), "{local_writes}");
    }
}

/// MATCH over a pod: how many leading keys of `chain` some member holds, asking each member
/// only about its own keys, all members at once, round after round.
///
/// `candidates(i)` are the members that may hold key `i`, best first (its ranking's read
/// candidates); `ask(member, keys)` is that member's own MATCH: how many leading keys of
/// `keys` it holds. Each round asks every member about its keys (those it ranks first for,
/// in chain order) from where it stopped. The first key whose first member lacks it is then
/// asked of its other candidates. If none holds it, that is the answer: the first miss
/// stops the match. If one does, the rounds go on past it.
pub async fn match_in_pod<F, Fut>(
    chain_len: usize,
    candidates: impl Fn(usize) -> Vec<String>,
    ask: F,
) -> anyhow::Result<u64>
where
    F: Fn(String, Vec<usize>) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<u64>>,
{
    use std::collections::BTreeMap;
    let cands: Vec<Vec<String>> = (0..chain_len).map(&candidates).collect();
    // Keys by first-ranked member, in chain order.
    let mut groups: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, c) in cands.iter().enumerate() {
        if let Some(first) = c.first() {
            groups.entry(first.clone()).or_default().push(i);
        }
    }
    // Per member: how far into its keys it has confirmed.
    let mut cursor: BTreeMap<String, usize> = groups.keys().map(|m| (m.clone(), 0)).collect();
    // Keys found on another candidate than their first.
    let mut found_elsewhere = std::collections::HashSet::new();
    loop {
        // Ask every member with keys left about them, at once.
        let asks = groups.iter().filter_map(|(m, keys)| {
            let from = cursor[m];
            (from < keys.len()).then(|| {
                let rest: Vec<usize> = keys[from..].to_vec();
                let fut = ask(m.clone(), rest);
                async move { (m.clone(), fut.await) }
            })
        });
        for (m, got) in futures::future::join_all(asks).await {
            *cursor.get_mut(&m).expect("a member with keys") += got? as usize;
        }
        // The lowest key some first member lacks.
        let first_gap = groups
            .iter()
            .filter_map(|(m, keys)| keys.get(cursor[m]).copied())
            .min();
        let Some(gap) = first_gap else {
            return Ok(chain_len as u64);
        };
        // Does another candidate hold it?
        let others = cands[gap].iter().skip(1).cloned();
        let answers = futures::future::join_all(others.map(|m| ask(m, vec![gap]))).await;
        let mut held = false;
        for a in answers {
            held |= a? == 1;
        }
        if !held || !found_elsewhere.insert(gap) {
            return Ok(gap as u64);
        }
        // Go on past it: its first member moves on from it.
        let first = &cands[gap][0];
        *cursor.get_mut(first).expect("its first member") += 1;
    }
}

#[cfg(test)]
mod match_tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use std::collections::{HashMap, HashSet};

    /// Against the obvious answer, over random pods: chains whose keys live on their first
    /// member, or (after a join, or a write while it was away) on a later candidate, with
    /// random gaps.
    #[test]
    fn pod_match_equals_the_leading_run_of_held_keys() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        for case in 0..500 {
            let members: Vec<String> = (0..rng.gen_range(1..6)).map(|m| format!("m{m}")).collect();
            let len = rng.gen_range(0..60);
            let cands: Vec<Vec<String>> = (0..len)
                .map(|_| {
                    let mut c = members.clone();
                    let r = rng.gen_range(0..c.len());
                    c.rotate_left(r);
                    c.truncate(3);
                    c
                })
                .collect();
            let mut held: HashMap<String, HashSet<usize>> = HashMap::new();
            let cut = rng.gen_range(0..=len);
            for (i, c) in cands.iter().enumerate() {
                // Keys before the cut are held somewhere (mostly on their first member);
                // after it, some are and some are not.
                if i < cut || rng.gen_bool(0.5) {
                    let at = if rng.gen_bool(0.8) {
                        0
                    } else {
                        rng.gen_range(0..c.len())
                    };
                    held.entry(c[at].clone()).or_default().insert(i);
                }
            }
            let want = (0..len)
                .take_while(|i| held.values().any(|s| s.contains(i)))
                .count() as u64;
            let asked = std::cell::Cell::new(0);
            let got = rt
                .block_on(match_in_pod(
                    len,
                    |i| cands[i].clone(),
                    |m, keys| {
                        asked.set(asked.get() + 1);
                        let h = held.get(&m).cloned().unwrap_or_default();
                        async move { Ok(keys.iter().take_while(|k| h.contains(k)).count() as u64) }
                    },
                ))
                .unwrap();
            assert_eq!(got, want, "case {case}: {cands:?} held {held:?}");
        }
    }
}
