//! JSON bodies of HTTP API v1.

use serde::{Deserialize, Serialize};

/// Every error answer: `{"error": "<kind>", "message": "..."}`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ErrorBody {
    /// Stable machine-readable kind: `invalid`, `not_found` (no such block),
    /// `no_such_namespace`, `no_route`, `method_not_allowed`, `conflict`, `integrity`,
    /// `too_large`, `no_space`, `busy`, `internal`.
    pub error: String,
    pub message: String,
}

/// What a namespace holds, and so how a node keeps it: fixed when the namespace is created.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum NamespaceClass {
    /// KV-cache blocks (the default): evicted oldest first when the device needs room,
    /// unless leased or recently read.
    #[default]
    Kv,
    /// Model weights (MoE expert shards): written once by a loader, read by many engines,
    /// never evicted while the namespace exists (a device full of them refuses new writes,
    /// 507, rather than drop one).
    Weights,
}

impl NamespaceClass {
    pub fn as_str(self) -> &'static str {
        match self {
            NamespaceClass::Kv => "kv",
            NamespaceClass::Weights => "weights",
        }
    }

    pub fn is_kv(&self) -> bool {
        *self == NamespaceClass::Kv
    }

    /// The class namespace `name` has after a settings change that asks for `asked`: the
    /// one it was created with (`existing`), which `asked` may repeat but not change, or,
    /// for a new namespace, `asked` (default `kv`). The refusal names the namespace and
    /// both classes (HTTP 409 `conflict`).
    pub fn settle(name: &str, existing: Option<Self>, asked: Option<Self>) -> Result<Self, String> {
        match (existing, asked) {
            (Some(e), Some(a)) if e != a => Err(format!(
                "namespace {name:?} is of class {e}, fixed when it was created: it cannot \
                 become {a} (delete it and create it again)"
            )),
            (Some(e), _) => Ok(e),
            (None, a) => Ok(a.unwrap_or_default()),
        }
    }
}

impl std::fmt::Display for NamespaceClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for NamespaceClass {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "kv" => Ok(NamespaceClass::Kv),
            "weights" => Ok(NamespaceClass::Weights),
            other => Err(format!("unknown namespace class {other:?} (kv, weights)")),
        }
    }
}

/// How a namespace's blocks are compressed when they move to a node's dense tier
/// (`compression` of `PUT /v1/namespaces/{ns}`; absent: never).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// LZ4 (block format): fast to decompress, saves less.
    Lz4,
    /// Zstandard (level 1): saves more, costs more CPU.
    Zstd,
}

impl Compression {
    pub fn as_str(self) -> &'static str {
        match self {
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
        }
    }
}

impl std::fmt::Display for Compression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Compression {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "lz4" => Ok(Compression::Lz4),
            "zstd" => Ok(Compression::Zstd),
            other => Err(format!("unknown compression {other:?} (lz4, zstd)")),
        }
    }
}

/// `PUT /v1/namespaces/{ns}` body (optional).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CreateNamespace {
    /// Most bytes of blocks the namespace may hold; absent = bounded only by capacity.
    #[serde(default)]
    pub quota_bytes: Option<u64>,
    /// Copies of each block in a pod (1..=5); absent = the pod's `replication`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication: Option<u32>,
    /// The namespace's class when it is created (absent: `kv`). Fixed from then on: on an
    /// existing namespace, absent keeps its class and another class is refused (409).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<NamespaceClass>,
    /// Compress the namespace's blocks as they move to a node's dense tier (`lz4` or
    /// `zstd`) when that saves at least the node's `compression_min_saving`; absent: not.
    /// Changes only later moves: blocks stored compressed stay readable either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<Compression>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NamespaceInfo {
    pub name: String,
    pub quota_bytes: Option<u64>,
    /// Copies of each block in a pod, when the namespace sets its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication: Option<u32>,
    /// What the namespace holds (`kv` or `weights`).
    #[serde(default)]
    pub class: NamespaceClass,
    /// Bytes of live blocks (payload bytes, before encryption overhead).
    pub used_bytes: u64,
    pub block_count: u64,
    /// How blocks moving to the dense tier are compressed, if they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<Compression>,
    /// Of `used_bytes`, those held compressed (blocks demoted with `compression`).
    #[serde(default)]
    pub compressed_bytes: u64,
    /// Device bytes those compressed blocks' records take (`compressed_bytes` over this:
    /// the ratio achieved; their records uncompressed would take 4 KiB more each, rounded
    /// up to 4 KiB).
    #[serde(default)]
    pub compressed_stored_bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NamespaceList {
    pub namespaces: Vec<NamespaceInfo>,
}

/// `match`, `batch/get` and `unpin` body.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct KeysRequest {
    /// Lowercase hex keys.
    pub keys: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct MatchResponse {
    /// How many leading keys of the chain are present.
    pub matched: u64,
}

/// A page of a key listing (`GET /v1/namespaces/{ns}/blocks`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct KeyList {
    /// Lowercase hex keys, in byte order.
    pub keys: Vec<String>,
    /// With `meta=true`: what the index says of each key's block, in the order of `keys`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocks: Option<Vec<ListedBlock>>,
    /// When the page is full: the last key of the page, to pass as `after` for the next
    /// one (there may be none). Absent when the listing is complete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// One block of a key listing with `meta=true`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ListedBlock {
    /// Bytes of the block.
    pub len: u64,
    /// CRC32C of its bytes, 8 lowercase hex digits.
    pub crc32c: String,
    /// When it was stored, in ms since the Unix epoch.
    pub stored_ms: u64,
}

/// `present` answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PresentResponse {
    /// Whether each key of the request is held, in its order.
    pub present: Vec<bool>,
}

/// `pin` body.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PinRequest {
    pub keys: Vec<String>,
    /// Lease length; at most [`LEASE_MS_MAX`](crate::LEASE_MS_MAX).
    pub ttl_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PinResponse {
    /// Keys present and now pinned (absent keys are not pinned).
    pub pinned: u64,
    /// Per key of the request, whether it was pinned: given to a request routed by another
    /// member (`x-ctxpod-forwarded-by`), which combines the members' answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub each: Option<Vec<bool>>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct UnpinResponse {
    pub unpinned: u64,
    /// Per key of the request, whether a pin was ended (as for [`PinResponse::each`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub each: Option<Vec<bool>>,
}

/// `promote` answer: blocks moved to the node's fast tier (docs/OPERATIONS.md, "Tiers
/// inside a node").
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PromoteResponse {
    /// Keys moved to the fast tier by this request (in a pod, a key whose copies more
    /// than one member moved counts once).
    pub promoted: u64,
    /// Keys in the fast tier after this request (moved now, or there already; every
    /// present key on a node of one tier; in a pod, on at least one member).
    pub fast: u64,
    /// Per key of the request, whether it is in the fast tier now: given to a request
    /// routed by another member (`x-ctxpod-forwarded-by`), which combines the answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub each: Option<Vec<bool>>,
    /// Per key of the request, whether this request moved it: given with `each`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moved: Option<Vec<bool>>,
}

/// `GET /v1/cluster`: the pod as the answering node sees it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Cluster {
    /// The answering node's id.
    pub node_id: String,
    /// Where the membership comes from: `single`, `static` or `etcd`.
    pub source: String,
    /// Whether etcd answers (always true without etcd). While false the node serves with
    /// the last membership it knew.
    pub etcd_up: bool,
    /// Unix time of etcd's last answer (0: never, or no etcd).
    pub etcd_last_ok: i64,
    /// etcd's revision the member list reflects (0 without etcd).
    pub revision: i64,
    /// Copies of each block the pod keeps (R).
    pub replication: u32,
    /// Members, sorted by id.
    pub members: Vec<ClusterMember>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ClusterMember {
    pub id: String,
    /// Base URL of its HTTP API.
    pub http: String,
    /// Address of its CXP1 listener.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transfer: Option<String>,
    pub capacity_bytes: u64,
    /// Bytes used on its device, as its `/v1/stats` said within 1 s (absent when it did
    /// not answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<u64>,
    pub zone: String,
    /// `up`, or `draining`.
    pub state: String,
    /// `ok` when its `/healthz` answered within 1 s, else `unreachable` or `status N`.
    pub health: String,
}

/// `GET /v1/stats`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Stats {
    pub version: String,
    /// `io_uring` or `sync` (pread/pwrite fallback).
    pub io_engine: String,
    /// Whether the device file is opened with O_DIRECT.
    pub direct_io: bool,
    pub capacity_bytes: u64,
    /// Bytes of device occupied by regions in use (sealed regions + the open region's tail).
    pub used_bytes: u64,
    /// Bytes of live block payloads.
    pub live_bytes: u64,
    pub block_count: u64,
    pub region_bytes: u64,
    pub regions_total: u64,
    pub regions_free: u64,
    pub dram_capacity_bytes: u64,
    pub dram_used_bytes: u64,
    pub hits: u64,
    pub dram_hits: u64,
    pub misses: u64,
    pub integrity_errors: u64,
    /// Device reads that failed outside a client's request (a record to move at reclaim, a
    /// record of the tail scanned at start): each cost that one record, nothing more.
    #[serde(default)]
    pub media_errors: u64,
    pub evicted_blocks: u64,
    pub evicted_regions: u64,
    pub reinserted_blocks: u64,
    pub device_written_bytes: u64,
    pub user_written_bytes: u64,
    /// `device_written_bytes / user_written_bytes` (0 when nothing was written).
    pub write_amplification: f64,
    pub leases: u64,
    pub inflight_requests: u64,
    /// Records re-indexed at the last start from the open region's tail (puts since the
    /// last checkpoint before a crash).
    pub recovered_records: u64,
    /// Seconds since the node started.
    #[serde(default)]
    pub uptime_s: f64,
    /// Block payload bytes received (puts) and sent (gets) since the start.
    #[serde(default)]
    pub received_bytes: u64,
    #[serde(default)]
    pub sent_bytes: u64,
    /// Upper bounds (seconds) of the request-latency buckets of `latency`.
    #[serde(default)]
    pub latency_bounds_s: Vec<f64>,
    /// Requests per operation, counted by latency bucket since the start (cumulative, as in
    /// Prometheus): the difference of two readings gives the percentiles between them.
    #[serde(default)]
    pub latency: Vec<OpLatency>,
    /// The node's background passes: scrub and backfill (re-replication).
    #[serde(default)]
    pub background: BackgroundStats,
    /// Per tier of the node's flash (`fast`, `dense`; one `device` for a node of one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tiers: Vec<TierStats>,
}

/// One tier of a node's flash (`/v1/stats`, the dashboard): its use, the bytes read from
/// and written to it since the start, moves between tiers, and endurance.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct TierStats {
    /// `fast`, `dense`, or `device` for a node of one tier.
    pub name: String,
    pub capacity_bytes: u64,
    /// Bytes of regions in use (sealed, and the open region's tail).
    pub used_bytes: u64,
    pub regions_total: u64,
    pub regions_free: u64,
    /// Record bytes read from the tier (client reads, moves, scrub) since the start.
    pub read_bytes: u64,
    /// Record bytes written to the tier (puts, moves) since the start.
    pub written_bytes: u64,
    /// Bytes demoted to `dense` from `fast`, and promoted from `dense` to `fast`, since the
    /// start (counted on the tier moved out of).
    pub moved_out_bytes: u64,
    /// Client reads served from the tier's device since the start (DRAM hits are no
    /// tier's): over all tiers' hits, the share each tier serves.
    #[serde(default)]
    pub hits: u64,
    /// The tier's rated lifetime writes (its drive's DWPD × its bytes × 365 × warranty
    /// years), for a simulated drive; `None` when the node does not know the drive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rated_written_bytes: Option<f64>,
}

/// How far the node's background passes are (`/v1/stats`, `ctxpod stat`): scrub's running
/// pass, what scrub found since the start, and backfill (the copies that restore R).
/// Times are Unix seconds, 0 for never.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct BackgroundStats {
    /// Records the running scrub pass checked so far, of those on flash when it began.
    pub scrub_pass_records: u64,
    pub scrub_pass_total_records: u64,
    pub scrub_last_pass_unix: u64,
    /// Since the start: records scrub found bad, bad copies stored again from another
    /// member, and bad copies with no good copy anywhere (lost).
    pub scrub_bad_records: u64,
    pub scrub_repaired: u64,
    pub scrub_lost: u64,
    pub backfill_last_pass_unix: u64,
    /// Since the start: blocks backfill copied to members that should hold them, and
    /// copies it could not make.
    pub backfill_copied_blocks: u64,
    pub backfill_failed_copies: u64,
    /// Until when backfill waits for a member that left the view to come back before
    /// copying its blocks again (`pod.repair_grace_s`); 0 when it waits for none.
    pub repair_grace_until_unix: u64,
}

/// One operation's request-latency histogram.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct OpLatency {
    /// `get`, `put`, `match`, `batch_get`, `batch_put`, ...
    pub op: String,
    /// Requests that took at most each of `latency_bounds_s` (cumulative).
    pub buckets: Vec<u64>,
    /// Every request of the op (those beyond the last bound too).
    pub count: u64,
}

/// `/v1/admin/repair`: this node's backfill passes (those that copy each block it holds to
/// the members that should hold one and do not), as `ctxpod repair --wait` follows them.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RepairStatus {
    /// Passes ended since the node started (failed ones too).
    pub passes_done: u64,
    /// Whether a pass runs now.
    pub running: bool,
    /// On a `POST`: the pass that begins after it (done when `passes_done` reaches it); 0
    /// on a `GET`.
    pub wait_for_pass: u64,
    /// The last pass that ended: whether it ran to its end, the blocks it copied, the copies
    /// it could not make, and whether the view changed under it (it stopped early).
    pub last_ok: bool,
    pub last_copied_blocks: u64,
    pub last_failed: u64,
    pub last_restarted: bool,
    /// Why the backfill does not run on this node, when it does not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
}

/// `/v1/admin/drain`: how far this node's drain is.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct DrainStatus {
    /// `up` (not draining), `draining` (copying its blocks away), or `drained` (a whole
    /// pass found every block held by its first members: stopping the node loses nothing).
    pub state: String,
    /// Backfill passes finished since the drain began.
    pub passes: u64,
    /// The last pass: blocks looked at, copied, and copies that failed.
    pub last_scanned: u64,
    pub last_copied_blocks: u64,
    pub last_failed: u64,
    /// Why this node cannot drain (no etcd membership, or the backfill is off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
}

/// `GET /v1/overview`: the pod at a glance, as the dashboard shows it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Overview {
    /// The answering node's id.
    pub node_id: String,
    /// `single`, `static` or `etcd`.
    pub source: String,
    pub etcd_up: bool,
    /// Copies of each block the pod keeps by default (R).
    pub replication: u32,
    pub members: Vec<OverviewMember>,
    /// Every namespace of the pod, its usage summed over the members (all copies).
    pub namespaces: Vec<NamespaceInfo>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct OverviewMember {
    pub id: String,
    pub http: String,
    pub zone: String,
    /// `up` or `draining`.
    pub state: String,
    /// `ok`, or why its stats did not come (`unreachable`, `status N`).
    pub health: String,
    /// Its `/v1/stats` (absent when it did not answer within 2 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<Stats>,
}

/// `GET /v1/mrc`: the node's miss-ratio curve, from the block references it served (GET
/// hits) and stored (PUTs), sampled by key hash (SHARDS).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MrcResponse {
    /// Share of keys tracked now (lowered when the key budget is reached).
    pub sample_rate: f64,
    pub tracked_keys: u64,
    /// References counted (every one, sampled or not).
    pub references: u64,
    /// Mean size of a referenced block: turns blocks into bytes.
    pub mean_block_bytes: u64,
    /// This node's capacity in blocks of that size.
    pub capacity_blocks: u64,
    /// References per second over the time the curve covers (since the start): the rate
    /// the curve was measured at, which the planner scales to the rate it plans for.
    #[serde(default)]
    pub references_per_s: f64,
    /// The LRU hit ratio at capacities from 16 blocks to 4 times the node's.
    pub points: Vec<MrcPoint>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MrcPoint {
    pub capacity_blocks: u64,
    pub capacity_bytes: u64,
    pub hit_ratio: f64,
}

/// [`Stats::write_amplification`]: device bytes written per payload byte stored; 0 before
/// any payload byte is.
pub fn write_amplification(device_bytes: u64, user_bytes: u64) -> f64 {
    if user_bytes == 0 {
        0.0
    } else {
        device_bytes as f64 / user_bytes as f64
    }
}

/// An upload, as its start answers it and the namespace's list gives it.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct UploadEntry {
    /// The key, lowercase hex.
    pub key: String,
    /// 16 hex digits.
    pub upload_id: String,
    pub started_ms: u64,
}

/// A part written.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartEntry {
    pub part: u32,
    pub len: u64,
    /// 8 hex digits.
    #[serde(with = "crc_hex")]
    pub crc32c: u32,
}

mod crc_hex {
    pub fn serialize<S: serde::Serializer>(c: &u32, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&crate::crc32c_hex(*c))
    }
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
        let s = <String as serde::Deserialize>::deserialize(d)?;
        crate::parse_crc32c_hex(&s).ok_or_else(|| serde::de::Error::custom("8 hex digits"))
    }
}

/// The parts of an upload written so far (`GET …/uploads/{id}`).
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct PartList {
    pub parts: Vec<PartEntry>,
}

/// The uploads in progress in a namespace (`GET /v1/namespaces/{ns}/uploads`).
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct UploadList {
    pub uploads: Vec<UploadEntry>,
}
