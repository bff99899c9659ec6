//! `[pod]`: membership (etcd or a static list), replication, and the pod's background work.

use super::*;

/// Pod membership. With neither `etcd_endpoints` nor `members` the node is a pod of one.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct PodConfig {
    /// The pod's name: its members' records live under `/ctxpod/<name>/members/` in etcd.
    pub name: String,
    /// etcd client URLs (`http://etcd-0.etcd:2379`, ...): the node registers itself under a
    /// lease and watches the other members.
    pub etcd_endpoints: Vec<String>,
    /// CA certificates that sign etcd's server certificate (`https://` endpoints need it).
    pub etcd_ca_file: Option<PathBuf>,
    /// The node's client certificate and key towards etcd (etcd's `--client-cert-auth`).
    /// With etcd auth on, etcd 3.4 refuses, through its gateway, a client certificate that
    /// has a common name: issue this one without.
    pub etcd_cert_file: Option<PathBuf>,
    pub etcd_key_file: Option<PathBuf>,
    /// etcd's auth: the user the node authenticates as (its role needs read and write on
    /// the prefix `/ctxpod/<name>/`), and a file holding its password.
    pub etcd_username: Option<String>,
    pub etcd_password_file: Option<PathBuf>,
    /// A static member list instead of etcd (small or test pods): every member, this node
    /// included (matched by `node_id`).
    pub members: Vec<StaticMember>,
    /// This node's id in the pod: letters, digits, `.`, `_`, `-`, at most 64. Default: the
    /// id kept in `<data_dir>/node.id`, made on first start.
    pub node_id: Option<String>,
    /// This node's zone, its failure domain (a rack, a room, a cloud zone: at most 64
    /// bytes). Placement puts a block's copies in distinct zones while zones remain, then
    /// on distinct hosts (the host part of `advertise_http`). Empty: unknown, one zone shared
    /// by every member that leaves it empty (a pod without zones spreads copies over hosts
    /// alone). Every member of a zone should set the same name, and zones hold about equal
    /// capacity (a smaller zone still gets a copy of every block).
    pub zone: String,
    /// Base URL of this node's HTTP API as other nodes and clients reach it. Default: the
    /// bound listen address with the node's scheme, unless it is a wildcard (then required
    /// with etcd).
    pub advertise_http: Option<String>,
    /// Address of this node's CXP1 listener as others reach it. Default: the bound
    /// transfer address, unless it is a wildcard.
    pub advertise_transfer: Option<String>,
    /// Seconds a node's membership lease lasts without renewal: how long a node that died
    /// without leaving stays listed. Renewed every third of it.
    pub lease_ttl_s: u64,
    /// Copies of each block (R): a put is acknowledged once stored on the R highest-ranked
    /// members that can be reached. 1 (the default): KV blocks can be recomputed; 2 or
    /// more for hot shared prefixes, so a node's loss loses none. Every node of a pod must
    /// have the same value. A namespace may set its own (`replication` when created).
    pub replication: usize,
    /// A file holding an admin token (`<id>.<secret>`) the nodes present to each other for
    /// their own work (backfill, namespace copies, `/v1/cluster` usage). Needed when
    /// authentication is on; every node's auth must accept it (the chart makes one).
    pub peer_token_file: Option<PathBuf>,
    /// CA certificates to trust when reaching `https://` members. Default: `tls.client_ca_file`
    /// (one pod CA signs every node's certificate). With TLS on, a node presents its own
    /// certificate (`tls.cert_file`) to the others.
    pub peer_ca_file: Option<PathBuf>,
    /// Seconds between background backfill passes (each node copies the blocks it holds to
    /// the members that should hold them and do not); also run when the membership changes.
    /// 0 turns the pass off (read repair still runs).
    pub backfill_interval_s: u64,
    /// Most bytes per second a backfill pass sends.
    pub backfill_bytes_per_s: ByteSize,
    /// Seconds a member gone from the view (its lease ran out: killed, partitioned,
    /// restarting) may stay away before the others copy its blocks to the members that now
    /// rank for them. A member back within it costs only what was written meanwhile; a rolling
    /// restart does not copy the pod over. Drained members and joins do not wait. 0: copy at
    /// once.
    pub repair_grace_s: u64,
    /// Seconds a block delete is remembered in etcd (a tombstone under
    /// `/ctxpod/<name>/tombstones/`), so that a member that was away when it was deleted
    /// deletes its copy on return and no backfill or read repair writes it back. A node that
    /// comes back after being away longer than this empties itself before it rejoins (it
    /// cannot know what was deleted meanwhile). Also how long a copy of a deleted block is
    /// refused. Needs etcd.
    pub tombstone_retention_s: u64,
    /// Most tombstones the pod keeps (each node holds their keys in memory, about 100 bytes
    /// each): at the limit, a block delete through the pod answers 503 until older ones
    /// expire.
    pub tombstones_max: usize,
}

/// One member of a static pod.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StaticMember {
    pub id: String,
    /// Base URL of its HTTP API.
    pub http: String,
    #[serde(default)]
    pub transfer: Option<String>,
    /// Its block capacity: its share of the placement.
    pub capacity: ByteSize,
    /// Its zone (as `pod.zone`).
    #[serde(default)]
    pub zone: String,
}

impl Default for PodConfig {
    fn default() -> Self {
        PodConfig {
            name: "default".into(),
            etcd_endpoints: Vec::new(),
            etcd_ca_file: None,
            etcd_cert_file: None,
            etcd_key_file: None,
            etcd_username: None,
            etcd_password_file: None,
            members: Vec::new(),
            node_id: None,
            zone: String::new(),
            advertise_http: None,
            advertise_transfer: None,
            lease_ttl_s: 10,
            replication: 1,
            peer_token_file: None,
            peer_ca_file: None,
            backfill_interval_s: 300,
            backfill_bytes_per_s: ByteSize(64 << 20),
            repair_grace_s: 60,
            tombstone_retention_s: 86_400,
            tombstones_max: 1_000_000,
        }
    }
}

/// Whether `id` is a valid node id (or pod name): 1 to 64 of letters, digits, `.`, `_`, `-`.
pub fn valid_node_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

impl PodConfig {
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            valid_node_id(&self.name),
            "pod.name must be 1 to 64 letters, digits, '.', '_' or '-'"
        );
        anyhow::ensure!(
            self.etcd_endpoints.is_empty() || self.members.is_empty(),
            "pod.etcd_endpoints and pod.members exclude each other: choose etcd or a static list"
        );
        anyhow::ensure!(
            (2..=3600).contains(&self.lease_ttl_s),
            "pod.lease_ttl_s must be within 2..=3600"
        );
        anyhow::ensure!(
            (1..=ctxpod_wire::REPLICATION_MAX as usize).contains(&self.replication),
            "pod.replication must be within 1..=5"
        );
        anyhow::ensure!(
            self.backfill_bytes_per_s.0 >= 1 << 20,
            "pod.backfill_bytes_per_s must be at least 1 MiB"
        );
        anyhow::ensure!(
            self.repair_grace_s <= 86_400,
            "pod.repair_grace_s must be within 0..=86400 (a day)"
        );
        anyhow::ensure!(
            (10..=30 * 86_400).contains(&self.tombstone_retention_s),
            "pod.tombstone_retention_s must be within 10..=2592000 (30 days)"
        );
        anyhow::ensure!(
            (1..=100_000_000).contains(&self.tombstones_max),
            "pod.tombstones_max must be within 1..=100000000"
        );
        for e in &self.etcd_endpoints {
            anyhow::ensure!(
                e.starts_with("http://") || e.starts_with("https://"),
                "pod.etcd_endpoints: {e:?} is not an http:// or https:// URL"
            );
            anyhow::ensure!(
                !e.starts_with("https://") || self.etcd_ca_file.is_some(),
                "pod.etcd_endpoints: {e:?} needs pod.etcd_ca_file (the CA of etcd's certificate)"
            );
        }
        anyhow::ensure!(
            self.etcd_cert_file.is_some() == self.etcd_key_file.is_some(),
            "pod.etcd_cert_file and pod.etcd_key_file go together"
        );
        anyhow::ensure!(
            self.etcd_username.is_some() == self.etcd_password_file.is_some(),
            "pod.etcd_username and pod.etcd_password_file go together"
        );
        if let Some(id) = &self.node_id {
            anyhow::ensure!(
                valid_node_id(id),
                "pod.node_id must be 1 to 64 letters, digits, '.', '_' or '-'"
            );
        }
        let mut ids = std::collections::HashSet::new();
        for m in &self.members {
            anyhow::ensure!(
                valid_node_id(&m.id),
                "pod.members: id {:?} must be 1 to 64 letters, digits, '.', '_' or '-'",
                m.id
            );
            anyhow::ensure!(ids.insert(&m.id), "pod.members: id {:?} twice", m.id);
            anyhow::ensure!(
                m.http.starts_with("http://") || m.http.starts_with("https://"),
                "pod.members: {:?} has no http:// or https:// URL",
                m.id
            );
        }
        if !self.members.is_empty() {
            anyhow::ensure!(
                self.node_id.as_ref().is_some_and(|id| ids.contains(id)),
                "pod.members needs pod.node_id set to one of the members' ids"
            );
        }
        Ok(())
    }
}
