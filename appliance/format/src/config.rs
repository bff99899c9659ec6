//! The one configuration of a node: defaults → TOML file (`--config`) → `CTXPOD_*` environment
//! → command-line flags, later layers winning.

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

mod auth;
mod pod;
mod scrub;
mod tiers;
pub use auth::{AuthConfig, IdentityConfig, TenantConfig, TlsConfig, TokenConfig};
pub use pod::{valid_node_id, PodConfig, StaticMember};
pub use scrub::{ScrubConfig, SCRUB_BYTES_PER_S_MAX};
pub use tiers::{TierConfig, TIER_NAMES};

/// A size in bytes, written as an integer or with a binary or decimal unit: `512MiB`, `4GiB`,
/// `1g`, `65536`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub fn parse(s: &str) -> Result<ByteSize, String> {
        let s = s.trim();
        let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (num, unit) = s.split_at(split);
        let n: u64 = num
            .parse()
            .map_err(|_| format!("size {s:?} must start with a whole number"))?;
        let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kib" => 1 << 10,
            "m" | "mib" => 1 << 20,
            "g" | "gib" => 1 << 30,
            "t" | "tib" => 1 << 40,
            "kb" => 1_000,
            "mb" => 1_000_000,
            "gb" => 1_000_000_000,
            "tb" => 1_000_000_000_000,
            u => {
                return Err(format!(
                    "unknown size unit {u:?} in {s:?} (use KiB, MiB, GiB, TiB)"
                ))
            }
        };
        n.checked_mul(mult)
            .map(ByteSize)
            .ok_or_else(|| format!("size {s:?} is too large"))
    }
}

impl std::str::FromStr for ByteSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        ByteSize::parse(s)
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        for (unit, shift) in [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)] {
            if b >= 1 << shift && b.is_multiple_of(1 << shift) {
                return write!(f, "{}{unit}", b >> shift);
            }
        }
        write!(f, "{b}")
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(ByteSize(n)),
            Raw::S(s) => ByteSize::parse(&s).map_err(serde::de::Error::custom),
        }
    }
}

/// Which I/O engine to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum IoEngine {
    /// io_uring, falling back to pread/pwrite (with a warning) where io_uring is refused.
    #[default]
    Auto,
    /// io_uring or fail.
    IoUring,
    /// pread/pwrite on a blocking thread pool.
    Sync,
}

impl std::str::FromStr for IoEngine {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(IoEngine::Auto),
            "io_uring" | "io-uring" | "uring" => Ok(IoEngine::IoUring),
            "sync" => Ok(IoEngine::Sync),
            _ => Err(format!("unknown I/O engine {s:?} (auto, io_uring, sync)")),
        }
    }
}

/// Writes under one data key after which the node rotates it on its own: well before 2^32
/// (the bound NIST SP 800-38D sets for random 96-bit nonces; ctxpod's nonces are counters,
/// unique per node, so this is margin, not necessity).
pub const DEK_ROTATE_AFTER_WRITES: u64 = 1 << 31;

/// The longest `egress_wait_ms`: a request waits a minute at most for its client's share.
pub const EGRESS_WAIT_MS_MAX: u64 = 60_000;

/// Default of `offload_inline_max_bytes`: a 64 KiB block's jobs (and a 128 KiB one's) run
/// on the request thread; at 10 GB/s an AES-GCM seal of 128 KiB is ~13 µs, below the ~17 µs
/// of CPU a hand-off to an engine thread and back was measured to cost.
pub const OFFLOAD_INLINE_MAX_BYTES_DEFAULT: u64 = 128 << 10;

/// Node configuration. Every field can be set in the TOML file, as `CTXPOD_<FIELD>` in the
/// environment (e.g. `CTXPOD_CAPACITY=4GiB`), and the main ones as `ctxpod serve` flags.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Config {
    /// Folder of the node's state: the device file (unless `device` is set), the RocksDB index
    /// (`index/`) and, in embedded mode, the key-encryption key (`kek`).
    pub data_dir: PathBuf,
    /// Address of the HTTP listener. Port 0 picks a free port; the bound address is written
    /// to `<data_dir>/ctxpod.addr` once the node serves.
    pub listen: SocketAddr,
    /// Address of the CXP1 transfer protocol listener (`api/PROTOCOL.md`); none to run
    /// without it. Port 0 picks a free port, written to `<data_dir>/ctxpod.transfer.addr`.
    pub transfer_listen: Option<SocketAddr>,
    /// Address of the S3 listener (the S3 door, `docs/INTEGRATIONS.md`); none (the default)
    /// to run without it. Port 0 picks a free port, written to `<data_dir>/ctxpod.s3.addr`.
    pub s3_listen: Option<SocketAddr>,
    /// Bytes of flash the node may use: the size of the device file (or the part of the raw
    /// block device) that holds block records. With `tiers`, the sum of theirs (set when
    /// the configuration is loaded).
    pub capacity: ByteSize,
    /// Bytes of decrypted blocks the DRAM tier may hold.
    pub dram: ByteSize,
    /// Device path: a file (created and preallocated) or a raw block device; or
    /// `sim:<profile>` for a simulated flash device (firmware-sim: `tlc`, `qlc`, their
    /// `-noplp` variants, or a profile TOML file) whose medium is `<data_dir>/blocks.sim`.
    /// Default `<data_dir>/blocks.dev`.
    pub device: Option<PathBuf>,
    /// Fault plan (TOML, see docs/FIRMWARE-SIM.md) for a simulated device.
    pub sim_faults: Option<PathBuf>,
    /// Two flash tiers instead of one device (`[[tiers]]`, `fast` then `dense`; see
    /// docs/OPERATIONS.md, "Tiers"): blocks are written to `fast` and demoted to `dense`
    /// as `fast` fills. Fixed when the node is formatted.
    pub tiers: Vec<TierConfig>,
    /// Bytes per second that promotion may move from `dense` to `fast` (a second's worth
    /// at once): the move budget of a node of two tiers.
    pub tier_move_bytes_per_s: ByteSize,
    /// Promote blocks on hints (a pin, a prefetch hold, a second read from `dense`) when
    /// the writer is idle; `false` leaves promotion to explicit `promote` calls (the
    /// benchmark's "promotion off").
    pub tier_promote_hints: bool,
    /// The least fraction of a record's device bytes that compressing it must save for a
    /// block of a namespace with `compression` to be stored compressed when it moves to the
    /// dense tier (otherwise it moves as it is), within 0..1.
    pub compression_min_saving: f64,
    /// Size of one region (the unit of eviction), a multiple of 4 KiB. Default: capacity / 32
    /// clamped to 16..=64 MiB.
    pub region_bytes: Option<ByteSize>,
    /// `auto` (io_uring, else pread/pwrite with a warning), `io_uring` or `sync`.
    pub io_engine: IoEngine,
    /// Write zeros over a new file-backed device when the node is formatted (progress is
    /// logged; about 1 s per 1.5 GB here), so that later flushes need no filesystem
    /// metadata updates: durable puts were about 25 % faster in `ctxpod bench`. Ignored for
    /// block devices.
    pub zero_fill: bool,
    /// File holding the 32-byte key-encryption key. Default `<data_dir>/kek`, created with
    /// mode 0600 on first start when absent.
    pub kek_file: Option<PathBuf>,
    /// Encrypt block records on the device (AES-256-GCM under per-namespace data keys).
    /// Fixed when the node is formatted (recorded in its superblock): a node formatted one
    /// way refuses to start configured the other way. `false` stores bodies as received,
    /// protected by CRC32C only, for pods whose drives are otherwise protected (self-
    /// encrypting drives, a trusted site): no crypto-shred, and someone with the drive
    /// reads every block (docs/SECURITY.md).
    pub encrypt_at_rest: bool,
    /// The previous key-encryption key, during a KEK rotation: data keys that the KEK does
    /// not unwrap but this one does are re-wrapped under the KEK at start. Needed only if
    /// the KEK file was replaced while the node was down (an online rotation,
    /// `POST /v1/admin/rotate-kek`, needs nothing else).
    pub kek_previous_file: Option<PathBuf>,
    /// Requests served at once on the data routes; more answer 503 with `Retry-After`.
    pub max_inflight_requests: usize,
    /// Bytes of PUT and batch/put bodies received and being stored at once; beyond it
    /// requests answer 503 with `Retry-After`. Bounds ingest memory.
    pub ingest_bytes_max: ByteSize,
    /// Bytes of blocks admitted to answers (GET, batch/get, CXP1 Get) and not yet handed to
    /// the socket, node-wide: taken before a block is read, given back once its bytes are
    /// written out. A block that finds it spent answers 503 (CXP1: `BUSY` for that entry).
    /// Bounds the memory clients that ask and never read can make the node hold.
    pub egress_bytes_max: ByteSize,
    /// The share of `egress_bytes_max` one client may hold: a client is one credential (a
    /// token or a certificate) on one address, and with authentication off every caller of
    /// an address is one client. A client that stalls leaves the rest to everyone else.
    pub egress_bytes_per_peer_max: ByteSize,
    /// Milliseconds a request over its client's egress share may wait for the share to
    /// come back (its client's earlier answers being read) before it is answered busy;
    /// 0: answered busy at once. Only a request that holds none of the share waits.
    pub egress_wait_ms: u64,
    /// Connections each listener (HTTP, CXP1) holds at once; more are closed at once and
    /// counted (`ctxpod_connections_refused_total{why="listener"}`).
    pub connections_max: usize,
    /// Connections one peer address holds on one listener at once; more are closed at once
    /// (`why="peer"`).
    pub connections_per_peer_max: usize,
    /// Seconds a connection may move no byte either way (HTTP: between or inside requests;
    /// CXP1: with no request running and no live ticket or subscription) before it is
    /// closed (`why="idle"`).
    pub idle_timeout_s: u64,
    /// Seconds an HTTP request's head (request line and headers) may take to arrive.
    pub header_read_timeout_s: u64,
    /// TLS handshakes running at once, both listeners together; more are refused.
    pub tls_handshakes_max: usize,
    /// Namespaces a tenant may have unless its `[[tenants]]` entry says otherwise; creating
    /// one more answers 403 `namespace_limit`.
    pub tenant_namespaces_max: u32,
    /// Puts and deletes queued for the writer; more answer 503 with `Retry-After`.
    pub write_queue_depth: usize,
    /// Most puts in one group commit.
    pub group_commit_max_blocks: usize,
    /// Most payload bytes in one group commit.
    pub group_commit_max_bytes: ByteSize,
    /// Largest value the node stores (8 MiB..=1 GiB): values over 8 MiB are stored as
    /// sequences of 4 MiB extents, streamed through every door.
    pub value_bytes_max: ByteSize,
    /// Worker threads of each offload engine (CRC32C, AES-GCM); 0 = one per CPU.
    pub offload_threads: usize,
    /// Jobs queued for each offload engine; more answer 503.
    pub offload_queue_depth: usize,
    /// Run CRC32C and AES-GCM on the request threads instead of the offload engines: the
    /// no-DPU baseline the offload is measured against.
    pub offload_inline: bool,
    /// Offload jobs over at most this many bytes (a 64 KiB block's seal, open or checksum)
    /// run on the request thread even with `offload_inline = false`: the hand-off to an
    /// engine thread and back costs more CPU than the work (at most 1 MiB; 0 = none).
    pub offload_inline_max_bytes: ByteSize,
    /// Whether the index (RocksDB) preallocates its write-ahead log and manifest files with
    /// `fallocate`: on a disk's filesystem that spares metadata updates at each sync; on
    /// tmpfs it allocates and zeroes memory at every open and frees it at every close (the
    /// pod's simulation, which opens an index per member and restart, turns it off).
    pub index_preallocate: bool,
    /// Most keys pinned at once.
    pub leases_max: usize,
    /// Most namespaces with KV-event subscribers at once (their subscribers share one queue
    /// of 4096 events, at most ~0.8 MiB); a subscription to one more answers 503.
    pub event_queues_max: usize,
    /// Bytes of blocks pinned or held by prefetch leases at once, node-wide (device bytes
    /// of their records). Default: half the capacity, so that unleased blocks can always
    /// be evicted to make room. A pin beyond answers 507 `no_space`; a prefetch beyond
    /// misses. Eviction keeps a region that is mostly leased where it is instead of
    /// rewriting it, so a device full of leases answers puts 507 at once.
    pub leased_bytes_max: Option<ByteSize>,
    /// Default per tenant of `[[tenants]] leased_bytes_max`. Default: a quarter of the
    /// capacity.
    pub tenant_leased_bytes_max: Option<ByteSize>,
    /// Share of block keys whose accesses feed the node's miss-ratio curve (`GET /v1/mrc`,
    /// SHARDS spatial sampling; 1 = every key, 0 = off).
    pub mrc_sample_rate: f64,
    /// Most keys the curve tracks (about 150 bytes each); beyond, the rate is lowered.
    pub mrc_keys_max: usize,
    /// Bytes of blocks staged in node memory for prefetch pushes at once (node-wide);
    /// wait-complete and timeout prefetches wait for room, best-effort ones miss (BUSY).
    pub prefetch_staging_bytes: ByteSize,
    /// Writes under one namespace data key after which the node rotates it (default
    /// 2^31, well before the 2^32 that AES-GCM guidance allows per key).
    pub dek_rotate_after_writes: u64,
    /// `tracing` filter, e.g. `info` or `ctxpod=debug`.
    pub log: String,
    /// Who may call the node (docs/SECURITY.md, "Tenants and roles").
    pub auth: AuthConfig,
    /// Tenants' limits: bytes stored across their namespaces, request rate.
    pub tenants: Vec<TenantConfig>,
    /// TLS on both listeners (docs/SECURITY.md, "TLS").
    pub tls: TlsConfig,
    /// The pod this node belongs to (docs/OPERATIONS.md): alone (the default), a static
    /// member list, or etcd membership.
    pub pod: PodConfig,
    /// The background re-read of every record (docs/RELIABILITY.md, "Scrub").
    pub scrub: ScrubConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            data_dir: PathBuf::from("./ctxpod-data"),
            listen: "127.0.0.1:7400".parse().expect("a valid literal address"),
            transfer_listen: Some("127.0.0.1:7401".parse().expect("a valid literal address")),
            s3_listen: None,
            capacity: ByteSize(2 << 30),
            dram: ByteSize(256 << 20),
            device: None,
            sim_faults: None,
            tiers: Vec::new(),
            tier_move_bytes_per_s: ByteSize(64 << 20),
            tier_promote_hints: true,
            compression_min_saving: 0.125,
            region_bytes: None,
            io_engine: IoEngine::Auto,
            zero_fill: true,
            kek_file: None,
            kek_previous_file: None,
            encrypt_at_rest: true,
            max_inflight_requests: 1024,
            ingest_bytes_max: ByteSize(1 << 30),
            egress_bytes_max: ByteSize(1 << 30),
            egress_bytes_per_peer_max: ByteSize(256 << 20),
            egress_wait_ms: 5_000,
            connections_max: 8192,
            connections_per_peer_max: 1024,
            idle_timeout_s: 300,
            header_read_timeout_s: 10,
            tls_handshakes_max: 256,
            tenant_namespaces_max: 256,
            write_queue_depth: 512,
            group_commit_max_blocks: 256,
            group_commit_max_bytes: ByteSize(32 << 20),
            value_bytes_max: ByteSize(ctxpod_wire::VALUE_BYTES_MAX_DEFAULT),
            offload_threads: 0,
            offload_queue_depth: 4096,
            offload_inline: false,
            offload_inline_max_bytes: ByteSize(OFFLOAD_INLINE_MAX_BYTES_DEFAULT),
            index_preallocate: true,
            leases_max: 1 << 20,
            event_queues_max: 256,
            leased_bytes_max: None,
            tenant_leased_bytes_max: None,
            mrc_sample_rate: 0.01,
            mrc_keys_max: 1 << 16,
            prefetch_staging_bytes: ByteSize(256 << 20),
            dek_rotate_after_writes: DEK_ROTATE_AFTER_WRITES,
            log: "info".into(),
            auth: AuthConfig::default(),
            tenants: Vec::new(),
            tls: TlsConfig::default(),
            pod: PodConfig::default(),
            scrub: ScrubConfig::default(),
        }
    }
}

/// Smallest region: two of the largest records must fit.
pub const REGION_BYTES_MIN: u64 = 16 << 20;
pub const REGION_BYTES_MAX: u64 = 1 << 30;

impl Config {
    /// Layers defaults, the optional TOML file, the environment and `overrides` (flags).
    pub fn load(file: Option<&Path>, overrides: Figment) -> anyhow::Result<Config> {
        let mut fig = Figment::from(Serialized::defaults(Config::default()));
        if let Some(f) = file {
            anyhow::ensure!(f.exists(), "config file {} does not exist", f.display());
            fig = fig.merge(Toml::file(f));
        }
        fig = fig.merge(Env::prefixed("CTXPOD_")).merge(overrides);
        let mut cfg: Config = fig.extract()?;
        cfg.settle_tiers();
        cfg.validate()?;
        Ok(cfg)
    }

    /// With tiers, the node's capacity is the sum of theirs.
    pub fn settle_tiers(&mut self) {
        if !self.tiers.is_empty() {
            self.capacity = ByteSize(self.tiers.iter().map(|t| t.capacity.0).sum());
        }
    }

    /// A configuration from TOML text over the defaults (no environment, no flags), checked.
    pub fn from_toml(text: &str) -> anyhow::Result<Config> {
        let mut cfg: Config = Figment::from(Serialized::defaults(Config::default()))
            .merge(Toml::string(text))
            .extract()?;
        cfg.settle_tiers();
        cfg.validate()?;
        Ok(cfg)
    }

    /// Bytes of leased (pinned or held) blocks the node allows at once.
    pub fn leased_bytes_max(&self) -> u64 {
        self.leased_bytes_max.map_or(self.capacity.0 / 2, |b| b.0)
    }

    /// Bytes of leased blocks tenant `tenant` may have at once.
    pub fn tenant_leased_bytes_max(&self, tenant: &str) -> u64 {
        self.tenants
            .iter()
            .find(|t| t.name == tenant)
            .and_then(|t| t.leased_bytes_max)
            .or(self.tenant_leased_bytes_max)
            .map_or(self.capacity.0 / 4, |b| b.0)
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.leased_bytes_max() <= self.capacity.0,
            "leased_bytes_max must be at most the capacity"
        );
        anyhow::ensure!(
            (0.0..=1.0).contains(&self.mrc_sample_rate),
            "mrc_sample_rate must be within 0..=1"
        );
        anyhow::ensure!(
            (1024..=1 << 24).contains(&self.mrc_keys_max),
            "mrc_keys_max must be within 1024..=16777216"
        );
        anyhow::ensure!(
            self.group_commit_max_blocks > 0 && self.write_queue_depth > 0,
            "group_commit_max_blocks and write_queue_depth must be positive"
        );
        anyhow::ensure!(
            self.max_inflight_requests > 0,
            "max_inflight_requests must be positive"
        );
        anyhow::ensure!(
            self.connections_max > 0
                && self.connections_per_peer_max > 0
                && self.tls_handshakes_max > 0
                && self.idle_timeout_s > 0
                && self.header_read_timeout_s > 0,
            "connections_max, connections_per_peer_max, tls_handshakes_max, idle_timeout_s \
             and header_read_timeout_s must be positive"
        );
        anyhow::ensure!(
            (0.0..1.0).contains(&self.compression_min_saving),
            "compression_min_saving must be within 0..1 (a fraction of a record's bytes)"
        );
        anyhow::ensure!(
            self.egress_wait_ms <= EGRESS_WAIT_MS_MAX,
            "egress_wait_ms must be at most {EGRESS_WAIT_MS_MAX} (a minute)"
        );
        for (name, b) in [
            ("ingest_bytes_max", self.ingest_bytes_max),
            ("egress_bytes_max", self.egress_bytes_max),
            ("egress_bytes_per_peer_max", self.egress_bytes_per_peer_max),
            ("prefetch_staging_bytes", self.prefetch_staging_bytes),
            ("tier_move_bytes_per_s", self.tier_move_bytes_per_s),
        ] {
            anyhow::ensure!(
                b.0 >= ctxpod_wire::BLOCK_BYTES_MAX as u64,
                "{name} must hold at least one largest block (8 MiB)"
            );
        }
        if let Some(r) = self.region_bytes {
            anyhow::ensure!(
                r.0.is_multiple_of(4096) && (REGION_BYTES_MIN..=REGION_BYTES_MAX).contains(&r.0),
                "region_bytes must be a multiple of 4 KiB within 16 MiB..=1 GiB"
            );
        }
        anyhow::ensure!(
            self.offload_inline_max_bytes.0 <= 1 << 20,
            "offload_inline_max_bytes must be at most 1MiB (a larger job holds a request thread)"
        );
        anyhow::ensure!(
            self.group_commit_max_bytes.0 >= ctxpod_wire::BLOCK_BYTES_MAX as u64,
            "group_commit_max_bytes must hold at least one largest block (8 MiB)"
        );
        anyhow::ensure!(
            (ctxpod_wire::BLOCK_BYTES_MAX as u64..=ctxpod_wire::VALUE_BYTES_MAX)
                .contains(&self.value_bytes_max.0),
            "value_bytes_max must be within 8MiB..=1GiB"
        );
        tiers::validate(&self.tiers, self.device.as_deref())?;
        if !self.tiers.is_empty() {
            anyhow::ensure!(
                self.capacity.0 == self.tiers.iter().map(|t| t.capacity.0).sum::<u64>(),
                "with tiers, capacity is the sum of the tiers' capacities"
            );
        }
        self.validate_tls()?;
        self.pod.validate()?;
        self.scrub.validate()?;
        let t = &self.tls;
        let mut addrs = vec![self.listen];
        addrs.extend(self.transfer_listen);
        addrs.extend(self.s3_listen);
        for a in addrs {
            if a.ip().is_loopback() {
                continue;
            }
            anyhow::ensure!(
                t.enabled() || t.allow_plaintext,
                "refusing to serve plain TCP on {a}: configure tls.cert_file and \
                 tls.key_file, or set tls.allow_plaintext = true"
            );
            anyhow::ensure!(
                self.auth_configured() || self.auth.allow_unauthenticated,
                "refusing to serve without authentication on {a}: configure auth tokens \
                 or identities, or set auth.allow_unauthenticated = true"
            );
        }
        Ok(())
    }

    /// The `[tls]` keys agree with each other.
    fn validate_tls(&self) -> anyhow::Result<()> {
        let t = &self.tls;
        anyhow::ensure!(
            t.cert_file.is_some() == t.key_file.is_some(),
            "tls.cert_file and tls.key_file go together"
        );
        anyhow::ensure!(
            t.client_ca_file.is_none() || t.enabled(),
            "tls.client_ca_file needs tls.cert_file and tls.key_file"
        );
        if let Some(m) = &t.client_auth {
            anyhow::ensure!(
                m == "required" || m == "optional",
                "tls.client_auth must be required or optional"
            );
            anyhow::ensure!(
                t.client_ca_file.is_some(),
                "tls.client_auth needs tls.client_ca_file"
            );
        }
        Ok(())
    }

    /// Whether callers must authenticate (see [`AuthConfig::enabled`]).
    pub fn auth_configured(&self) -> bool {
        let a = &self.auth;
        a.enabled
            .unwrap_or(!a.tokens.is_empty() || a.tokens_dir.is_some() || !a.identities.is_empty())
    }

    pub fn device_path(&self) -> PathBuf {
        if self.sim_profile().is_some() {
            return self.data_dir.join("blocks.sim");
        }
        self.device
            .clone()
            .unwrap_or_else(|| self.data_dir.join("blocks.dev"))
    }

    /// The firmware-sim profile when the device is `sim:<profile>`.
    pub fn sim_profile(&self) -> Option<String> {
        let d = self.device.as_ref()?.to_str()?;
        d.strip_prefix("sim:").map(str::to_string)
    }

    pub fn kek_path(&self) -> PathBuf {
        self.kek_file
            .clone()
            .unwrap_or_else(|| self.data_dir.join("kek"))
    }

    pub fn index_path(&self) -> PathBuf {
        self.data_dir.join("index")
    }

    pub fn region_bytes(&self) -> u64 {
        self.region_bytes.map(|r| r.0).unwrap_or_else(|| {
            let r = (self.capacity.0 / 32).clamp(REGION_BYTES_MIN, 64 << 20);
            r / (1 << 20) * (1 << 20)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(ByteSize::parse("512MiB"), Ok(ByteSize(512 << 20)));
        assert_eq!(ByteSize::parse("4GiB"), Ok(ByteSize(4 << 30)));
        assert_eq!(ByteSize::parse("1g"), Ok(ByteSize(1 << 30)));
        assert_eq!(ByteSize::parse("100"), Ok(ByteSize(100)));
        assert_eq!(ByteSize::parse("2 GB"), Ok(ByteSize(2_000_000_000)));
        assert!(ByteSize::parse("GiB").is_err());
        assert!(ByteSize::parse("4XB").is_err());
        assert!(ByteSize::parse("99999999999TiB").is_err());
        assert_eq!(ByteSize(4 << 30).to_string(), "4GiB");
    }

    /// The example in docs/ parses and states the defaults.
    #[test]
    fn example_config_is_true() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("example.toml");
        std::fs::write(&f, include_str!("../../../docs/ctxpod.example.toml")).expect("write");
        let c: Config = Figment::from(Toml::file(&f))
            .extract()
            .expect("example parses");
        assert_eq!(c, Config::default());
    }

    /// A wait for an egress share is bounded (a minute); zero turns waits off.
    #[test]
    fn egress_waits_are_bounded() {
        let with = |ms| Config {
            egress_wait_ms: ms,
            ..Config::default()
        };
        assert!(with(0).validate().is_ok());
        assert!(with(EGRESS_WAIT_MS_MAX).validate().is_ok());
        let e = with(EGRESS_WAIT_MS_MAX + 1)
            .validate()
            .expect_err("over a minute");
        assert!(e.to_string().contains("egress_wait_ms"), "{e}");
    }

    /// Inline offload jobs are bounded: a larger one would hold a request thread.
    #[test]
    fn inline_offload_jobs_are_bounded() {
        let with = |b| Config {
            offload_inline_max_bytes: ByteSize(b),
            ..Config::default()
        };
        assert!(with(0).validate().is_ok());
        assert!(with(1 << 20).validate().is_ok());
        let e = with((1 << 20) + 1).validate().expect_err("over 1 MiB");
        assert!(e.to_string().contains("offload_inline_max_bytes"), "{e}");
    }

    #[test]
    fn layering() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("c.toml");
        std::fs::write(&f, "capacity = \"1GiB\"\ndram = \"64MiB\"\n").expect("write");
        let over = Figment::from(Serialized::defaults(serde_json::json!({"dram": "32MiB"})));
        let c = Config::load(Some(&f), over).expect("loads");
        assert_eq!(c.capacity, ByteSize(1 << 30));
        assert_eq!(c.dram, ByteSize(32 << 20));
        assert_eq!(c.region_bytes(), 32 << 20);
        assert!(Config::load(Some(&dir.path().join("missing.toml")), Figment::new()).is_err());
    }

    /// Two tiers, fast then dense: the capacity is theirs; anything else is refused.
    #[test]
    fn tiers_are_fast_then_dense() {
        let two = "[[tiers]]\nname = \"fast\"\ndevice = \"sim:slc\"\ncapacity = \"256MiB\"\n\
                   [[tiers]]\nname = \"dense\"\ndevice = \"sim:qlc\"\ncapacity = \"1GiB\"\n";
        let c = Config::from_toml(two).expect("two tiers");
        assert_eq!(c.capacity, ByteSize((256 << 20) + (1 << 30)));
        assert_eq!(c.tiers[0].sim_profile().as_deref(), Some("slc"));
        assert_eq!(
            c.tiers[1].device_path(Path::new("/d")),
            Path::new("/d/blocks.dense.sim")
        );
        let swapped = two
            .replace("\"fast\"", "\"x\"")
            .replace("\"dense\"", "\"fast\"");
        let e = Config::from_toml(&swapped).expect_err("names");
        assert!(e.to_string().contains("fast then dense"), "{e}");
        let e = Config::from_toml(&format!("device = \"/dev/x\"\n{two}")).expect_err("both");
        assert!(e.to_string().contains("exclude"), "{e}");
        let e = Config::from_toml(&two.replace("256MiB", "1MiB")).expect_err("tiny");
        assert!(e.to_string().contains("below 64MiB"), "{e}");
    }
}
