//! Any node answers: a single-block request (`GET`, `HEAD`, `PUT`, `DELETE` of
//! `/v1/namespaces/{ns}/blocks/{key}`) sent to a node that does not hold the block is
//! forwarded to the member that does, so plain HTTP clients need not know the placement.
//! (The Rust client routes directly and never pays this hop.)
//!
//! The rules are the pod planner's ([`ctxpod_wire::pod_plan`]), with R copies per block
//! (the namespace's `replication`, else `pod.replication`, 1 by default):
//! - `PUT` goes to the block's R highest-ranked members that can be reached, all at once (a
//!   member that cannot is replaced by the next in rank order: a block written there is
//!   found by reads falling back along the ranking) and is acknowledged once all R stored
//!   it. `DELETE` goes to every member a read would look at.
//! - `GET` and `HEAD` try the first max(3, R + 1) ranked members in order and answer with
//!   the first that is not a miss; a block held by none of them, or on members that cannot
//!   be reached, is a miss (404), never an error that stalls the engine.
//! - A forwarded request carries [`HEADER_FORWARDED`]; a node serves such a request itself,
//!   so a request crosses at most one hop and never loops.
//! - The caller's `Authorization` header travels with it: every node of a pod shares its
//!   tokens (the Helm chart mounts one Secret). Client certificates do not travel: members
//!   reached over `https://` are trusted through `pod.peer_ca_file` (or the node's client
//!   CA) and see the forwarding node's own certificate ([`super::Peers`]).
//! - A member that missed a forward's deadline is asked last for [`DOWN_FOR`] ([`Missed`]),
//!   as the clients count members down: a frozen member costs one deadline, not one per
//!   request.

use super::membership::PodView;
use ctxpod_wire::pod_plan::{ReadPlan, WritePlan};
use http::{HeaderValue, Method};
use std::collections::HashMap;
use std::sync::RwLock;
use std::time::Duration;
use tokio::time::Instant;

/// The longest a node waits on a member for a request it makes for a caller (a forward
/// without progress, a share of a batch): half a client's default request deadline
/// (`ctxpod_client::connect::REQUEST_DEADLINE`), so that when one member froze the next
/// can still answer in time.
pub const PEER_DEADLINE: Duration = Duration::from_secs(5);

/// How long a member that missed a deadline is asked last (the clients' default,
/// `ctxpod_client::connect::DOWN_FOR`).
pub const DOWN_FOR: Duration = Duration::from_secs(10);

/// Members that missed a deadline lately (frozen, overloaded, black-holed: each ask costs
/// a deadline): until when each is asked last (or, by a fan-out, not at all). A refused
/// connection (a dead member) costs nothing and is not counted; an answer of any kind
/// counts a member up again. Each miss is counted in `ctxpod_pod_peer_deadlines_missed_total`
/// (registered with the pod's series).
pub struct Missed {
    down: RwLock<HashMap<String, Instant>>,
    pub deadlines_missed: prometheus::IntCounter,
}

impl Default for Missed {
    fn default() -> Missed {
        Missed {
            down: RwLock::default(),
            deadlines_missed: prometheus::IntCounter::new(
                "ctxpod_pod_peer_deadlines_missed_total",
                "Asks of another member that missed their deadline (the member is then \
                 counted down for a while)",
            )
            .expect("a valid metric"),
        }
    }
}

impl Missed {
    /// Counts member `id` down for [`DOWN_FOR`] (`reached: false`) or up.
    pub fn note(&self, id: &str, reached: bool) {
        let mut down = self.down.write().expect("missed members");
        if reached {
            down.remove(id);
        } else {
            self.deadlines_missed.inc();
            down.insert(id.to_string(), Instant::now() + DOWN_FOR);
        }
    }

    /// Per member of `view`, whether it is counted down now (the plans ask those last).
    pub fn flags(&self, view: &PodView) -> Vec<bool> {
        let down = self.down.read().expect("missed members");
        if down.is_empty() {
            return vec![false; view.members.len()];
        }
        let now = Instant::now();
        view.members
            .iter()
            .map(|m| down.get(&m.id).is_some_and(|&until| until > now))
            .collect()
    }
}

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

/// Where a request for a block should be served: here, or across the pod by one of
/// [`ctxpod_wire::pod_plan`]'s plans over the view's members.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Local,
    /// A read ([`ReadPlan`]): the block's read candidates in order, the first answer that
    /// is not a miss wins.
    Read {
        copies: usize,
    },
    /// A put ([`WritePlan::put`]): the first `copies` members that can be reached each
    /// take it (this node among them, at its place in the ranking), all at once;
    /// acknowledged when all of them stored it.
    Write {
        copies: usize,
    },
    /// A delete ([`WritePlan::delete`]): every member a read would look at.
    Delete {
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
    let copies = replication.max(1);
    match *method {
        Method::GET | Method::HEAD => Route::Read { copies },
        Method::PUT if copies == 1 && view.ranked(ns, key).first().is_some_and(|m| m.id == me) => {
            Route::Local
        }
        Method::PUT => Route::Write { copies },
        Method::DELETE => Route::Delete { copies },
        _ => Route::Local,
    }
}

impl Route {
    /// The plan of a routed read, over `view` (no member is counted down: the view holds
    /// only the members alive in it).
    pub fn read_plan(
        view: &PodView,
        down: &[bool],
        ns: &str,
        key: &[u8],
        copies: usize,
    ) -> ReadPlan {
        ReadPlan::new(&view.placement, down, ns, [key], copies)
    }

    /// The plan of a routed put or delete, over `view`.
    pub fn write_plan(
        self,
        view: &PodView,
        down: &[bool],
        ns: &str,
        key: &[u8],
    ) -> Option<WritePlan> {
        match self {
            Route::Write { copies } => {
                Some(WritePlan::put(&view.placement, down, ns, [key], copies))
            }
            Route::Delete { copies } => {
                Some(WritePlan::delete(&view.placement, down, ns, [key], copies))
            }
            _ => None,
        }
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
    use crate::membership::MemberInfo;

    fn view(ids: &[&str]) -> PodView {
        PodView::new(ids.iter().map(|id| MemberInfo::for_test(id)), 1)
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
            assert_eq!(route(&v, "a", &m, "ns", b"k", 2), Route::Local);
        }
    }

    #[test]
    fn a_put_of_one_copy_is_local_on_its_first_member_only() {
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
                r => assert_eq!(r, Route::Write { copies: 1 }),
            }
            // With two copies every put is spread, even from its first member.
            assert_eq!(
                route(&v, "a", &Method::PUT, "ns", &key, 2),
                Route::Write { copies: 2 }
            );
            assert_eq!(
                route(&v, "a", &Method::GET, "ns", &key, 1),
                Route::Read { copies: 1 }
            );
            assert_eq!(
                route(&v, "a", &Method::DELETE, "ns", &key, 1),
                Route::Delete { copies: 1 }
            );
        }
        // About a quarter of the blocks are "a"'s own.
        assert!((30..=70).contains(&local_writes), "{local_writes}");
    }
}
