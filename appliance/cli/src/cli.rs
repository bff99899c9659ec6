//! The `ctxpod` command line: `serve`, client subcommands over HTTP (`put`, `get`, `stat`,
//! `ns`) and over CXP1 (`match`, `prefetch`, `events`), `hash` (chained block hashes) and
//! `bench`.

use anyhow::Context;
use clap::{Parser, Subcommand};
use ctxpod_client::client::Client;
use ctxpod_client::transfer_client::TransferClient;
use ctxpod_engine::device::IoEngine;
use ctxpod_format::config::{ByteSize, Config};
use figment::providers::Serialized;
use figment::Figment;
use std::path::PathBuf;
use std::process::ExitCode;

mod commands;
use commands::{
    drain, events, get, hash, match_chain, ns, plan, prefetch, put, repair, stat, token_create,
};

#[derive(Parser)]
#[command(
    name = "ctxpod",
    version,
    about = "ctxpod: a flash node of a pod-level context-memory tier for LLM KV caches"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Args, Clone)]
struct Target {
    /// Node URL (`https://…` when the node serves TLS).
    #[arg(long, env = "CTXPOD_ADDR", default_value = "http://127.0.0.1:7400")]
    addr: String,
    /// Namespace.
    #[arg(long, short = 'n', default_value = "default")]
    ns: String,
    #[command(flatten)]
    creds: Creds,
}

/// How to authenticate and secure the connection.
#[derive(clap::Args, Clone, Default)]
struct Creds {
    /// Bearer token (`<id>.<secret>`); prefer the environment variable to the flag.
    #[arg(long, env = "CTXPOD_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// CA certificates (PEM) to trust: connect with TLS.
    #[arg(long, env = "CTXPOD_CA_FILE")]
    ca_file: Option<PathBuf>,
    /// Client certificate (PEM) for mTLS, with --key-file.
    #[arg(long, env = "CTXPOD_CERT_FILE", requires = "key_file")]
    cert_file: Option<PathBuf>,
    /// Client private key (PEM) for mTLS.
    #[arg(long, env = "CTXPOD_KEY_FILE", requires = "cert_file")]
    key_file: Option<PathBuf>,
}

impl Creds {
    fn connect(&self) -> anyhow::Result<ctxpod_client::connect::Connect> {
        anyhow::ensure!(
            self.ca_file.is_some() || self.cert_file.is_none(),
            "--cert-file needs --ca-file (mTLS is TLS)"
        );
        let id = self.cert_file.as_deref().zip(self.key_file.as_deref());
        Ok(ctxpod_client::connect::Connect::from_files(
            self.token.clone(),
            self.ca_file.as_deref(),
            id,
        )?)
    }

    fn http(&self, addr: &str) -> anyhow::Result<Client> {
        Ok(Client::connect(addr, &self.connect()?)?)
    }

    async fn wire(&self, addr: &str) -> anyhow::Result<TransferClient> {
        Ok(TransferClient::connect_with(addr, &self.connect()?).await?)
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a node (embedded single-node default: data in ./ctxpod-data, loopback, no TLS).
    Serve(ServeArgs),
    /// Check a node's configuration (defaults, the file, CTXPOD_* and these flags, as
    /// `serve` takes them) and print the result as TOML; exits non-zero if it is refused.
    Config(ServeArgs),
    /// Store a block from a file (or `-` for stdin).
    Put {
        #[command(flatten)]
        t: Target,
        /// Key, lowercase hex.
        key: String,
        /// File with the block's bytes; `-` reads stdin.
        file: PathBuf,
        /// Acknowledge before the flush (may vanish on a crash, never corrupt).
        #[arg(long)]
        fast: bool,
    },
    /// Fetch a block to a file (or stdout).
    Get {
        #[command(flatten)]
        t: Target,
        /// Key, lowercase hex.
        key: String,
        /// Output file; stdout when absent.
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// Drain the node before it leaves the pod: it ranks last for every block and copies
    /// what it holds to the blocks' first members; `--wait` shows progress until drained
    /// (then stopping it loses nothing); `--cancel` makes it `up` again.
    Drain {
        /// The node to drain.
        #[arg(long, env = "CTXPOD_ADDR", default_value = "http://127.0.0.1:7400")]
        addr: String,
        #[command(flatten)]
        creds: Creds,
        /// Show progress until it is drained.
        #[arg(long, conflicts_with = "cancel")]
        wait: bool,
        /// Take the drain back: the node is up again.
        #[arg(long)]
        cancel: bool,
    },
    /// Restore R copies of every block now: every member of the pod runs a backfill pass
    /// (each copies the blocks it holds to the members that should hold one and do not);
    /// `--wait` shows progress until a pass on every member, begun after the ask, found
    /// nothing left to copy (exits 1 if that takes longer than `--timeout`).
    Repair {
        /// Any node of the pod.
        #[arg(long, env = "CTXPOD_ADDR", default_value = "http://127.0.0.1:7400")]
        addr: String,
        #[command(flatten)]
        creds: Creds,
        /// Show progress until every member's pass found nothing to copy.
        #[arg(long)]
        wait: bool,
        /// Longest wait, in seconds.
        #[arg(long, default_value_t = 3600)]
        timeout: u64,
    },
    /// Print the node's statistics as JSON.
    Stat {
        #[command(flatten)]
        t: Target,
    },
    /// List namespaces, or create one with `--create [--quota SIZE]`, or delete one.
    Ns {
        #[command(flatten)]
        t: Target,
        /// Create (or update the quota of) the namespace given by --ns.
        #[arg(long)]
        create: bool,
        /// Delete the namespace given by --ns (its data key is destroyed).
        #[arg(long, conflicts_with = "create")]
        delete: bool,
        #[arg(long, requires = "create")]
        quota: Option<ByteSize>,
    },
    /// Measure PUT/GET throughput and latency against the device's own bandwidth.
    Bench(ctxpod_tools::bench::BenchArgs),
    /// Size a pod: capacity, bandwidth, nodes, drive wear and prefill GPU time saved, from a
    /// model, traffic, reuse (a trace or a sharing ratio) and the node's hardware.
    Plan {
        #[command(flatten)]
        args: ctxpod_node::plan_args::PlanArgs,
        /// Node URL for --live.
        #[arg(long, env = "CTXPOD_ADDR", default_value = "http://127.0.0.1:7400")]
        addr: String,
        #[command(flatten)]
        creds: Creds,
    },
    /// Replay a request trace (Mooncake JSONL) against a node or pod: MATCH each chain, GET
    /// the hits, PUT the misses; report hit ratio, prefill tokens saved, latency, writes.
    Replay {
        #[command(flatten)]
        t: Target,
        #[command(flatten)]
        args: ctxpod_tools::replay::ReplayArgs,
    },
    /// How many leading keys of a chain the node holds (over CXP1).
    Match {
        #[command(flatten)]
        t: Wire,
        /// Keys of the chain, lowercase hex, in order.
        #[arg(required = true)]
        keys: Vec<String>,
    },
    /// Prefetch a chain into host memory over CXP1 (a region of `keys × --max-len` bytes),
    /// showing blocks as they land; `-o DIR` writes each landed block to DIR/<key>.
    Prefetch {
        #[command(flatten)]
        t: Wire,
        #[arg(required = true)]
        keys: Vec<String>,
        /// best-effort, wait-complete or timeout.
        #[arg(long, default_value = "wait-complete")]
        policy: String,
        /// Deadline in milliseconds (required by the timeout policy).
        #[arg(long)]
        deadline_ms: Option<u64>,
        /// Bytes reserved per block in the region.
        #[arg(long, default_value = "8MiB")]
        max_len: ByteSize,
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// Print a namespace's KV events (stored / evicted / deleted keys) as they happen
    /// (over CXP1), until interrupted or `--count` events.
    Events {
        #[command(flatten)]
        t: Wire,
        #[arg(long)]
        count: Option<u64>,
    },
    /// Credentials: `token create` makes a bearer token and the salted hash the node keeps.
    Token {
        #[command(subcommand)]
        cmd: TokenCmd,
    },
    /// Chained block hashes (Dynamo's XXH3-64 sequence hashes) of token ids, as keys.
    Hash {
        /// Tokens per block.
        #[arg(long, default_value_t = 16)]
        block_size: usize,
        /// Salt (model, tenant or cache namespace).
        #[arg(long)]
        salt: Option<String>,
        /// LoRA adapter name.
        #[arg(long)]
        lora: Option<String>,
        /// Token ids.
        #[arg(required = true)]
        tokens: Vec<u32>,
    },
}

#[derive(Subcommand)]
enum TokenCmd {
    /// Make a token: prints the token (give it to the client) on stdout and the entry for
    /// the node's configuration on stderr, or writes the entry to `--dir/<id>` (a token
    /// directory, the shape a Kubernetes Secret mounts).
    Create {
        /// Token id, `[a-z0-9-]{1,32}` (not secret: it names the token in logs).
        #[arg(long)]
        id: String,
        /// admin, tenant-rw or tenant-ro.
        #[arg(long)]
        role: String,
        /// The tenant of a tenant role.
        #[arg(long)]
        tenant: Option<String>,
        /// Also make an S3 secret access key (the access key id is the token id): the S3
        /// door's credentials, printed after the token as `aws_access_key_id = …` and
        /// `aws_secret_access_key = …` (an AWS credentials file's lines).
        #[arg(long)]
        s3: bool,
        /// Write the entry as `<dir>/<id>` (mode 0600) instead of printing it.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

#[derive(clap::Args, Clone)]
struct Wire {
    /// Node's CXP1 transfer address.
    #[arg(long, env = "CTXPOD_TRANSFER_ADDR", default_value = "127.0.0.1:7401")]
    transfer: String,
    /// Namespace.
    #[arg(long, short = 'n', default_value = "default")]
    ns: String,
    #[command(flatten)]
    creds: Creds,
}

#[derive(clap::Args, Default)]
pub struct ServeArgs {
    /// TOML configuration file (layered under CTXPOD_* env and these flags).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Folder of the node's state [default: ./ctxpod-data].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Listen address [default: 127.0.0.1:7400].
    #[arg(long)]
    pub listen: Option<String>,
    /// CXP1 transfer protocol listener address [default: 127.0.0.1:7401].
    #[arg(long)]
    pub transfer_listen: Option<String>,
    /// S3 listener address (the S3 door) [default: none, off].
    #[arg(long)]
    pub s3_listen: Option<String>,
    /// Flash capacity, e.g. 512MiB, 4GiB [default: 2GiB].
    #[arg(long)]
    pub capacity: Option<ByteSize>,
    /// DRAM tier size [default: 256MiB].
    #[arg(long)]
    pub dram: Option<ByteSize>,
    /// Device path (file or raw block device), or `sim:<profile>` for a simulated flash
    /// device (tlc, qlc, tlc-noplp, qlc-noplp, or a profile TOML file)
    /// [default: <data-dir>/blocks.dev].
    #[arg(long)]
    pub device: Option<PathBuf>,
    /// Fault plan (TOML) for a simulated device.
    #[arg(long)]
    pub sim_faults: Option<PathBuf>,
    /// I/O engine: auto, io_uring, sync [default: auto].
    #[arg(long)]
    pub io_engine: Option<IoEngine>,
    /// This node's id in its pod (`pod.node_id`) [default: kept in <data-dir>/node.id].
    #[arg(long)]
    pub node_id: Option<String>,
    /// Base URL of this node's HTTP API as the pod reaches it (`pod.advertise_http`), e.g.
    /// `http://ctxpod-0.ctxpod-peers.ns.svc:7400`.
    #[arg(long)]
    pub advertise_http: Option<String>,
    /// Address of this node's CXP1 listener as the pod reaches it (`pod.advertise_transfer`).
    #[arg(long)]
    pub advertise_transfer: Option<String>,
}

impl ServeArgs {
    pub fn to_config(&self) -> anyhow::Result<Config> {
        let mut o = serde_json::Map::new();
        if let Some(d) = &self.data_dir {
            o.insert("data_dir".into(), serde_json::json!(d));
        }
        if let Some(l) = &self.listen {
            o.insert("listen".into(), serde_json::json!(l));
        }
        if let Some(l) = &self.transfer_listen {
            o.insert("transfer_listen".into(), serde_json::json!(l));
        }
        if let Some(l) = &self.s3_listen {
            o.insert("s3_listen".into(), serde_json::json!(l));
        }
        if let Some(c) = self.capacity {
            o.insert("capacity".into(), serde_json::json!(c.0));
        }
        if let Some(d) = self.dram {
            o.insert("dram".into(), serde_json::json!(d.0));
        }
        if let Some(d) = &self.device {
            o.insert("device".into(), serde_json::json!(d));
        }
        if let Some(f) = &self.sim_faults {
            o.insert("sim_faults".into(), serde_json::json!(f));
        }
        if let Some(e) = self.io_engine {
            o.insert("io_engine".into(), serde_json::to_value(e)?);
        }
        let mut pod = serde_json::Map::new();
        for (name, v) in [
            ("node_id", &self.node_id),
            ("advertise_http", &self.advertise_http),
            ("advertise_transfer", &self.advertise_transfer),
        ] {
            if let Some(v) = v {
                pod.insert(name.into(), serde_json::json!(v));
            }
        }
        if !pod.is_empty() {
            o.insert("pod".into(), serde_json::Value::Object(pod));
        }
        Config::load(
            self.config.as_deref(),
            Figment::from(Serialized::defaults(serde_json::Value::Object(o))),
        )
    }
}

fn init_logging(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("CTXPOD_LOG_FILTER")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn parse_key(k: &str) -> anyhow::Result<Vec<u8>> {
    ctxpod_wire::key::parse_key_hex(k).with_context(|| format!("key {k:?}"))
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.cmd {
        Cmd::Config(args) => {
            let cfg = args.to_config()?;
            print!("{}", toml::to_string(&cfg)?);
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Serve(args) => {
            let cfg = args.to_config()?;
            init_logging(&cfg.log);
            ctxpod_node::serve::serve(cfg).await?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Put { t, key, file, fast } => put(&t, &key, &file, fast).await,
        Cmd::Get { t, key, output } => get(&t, &key, output).await,
        Cmd::Drain {
            addr,
            creds,
            wait,
            cancel,
        } => drain(&addr, &creds, wait, cancel).await,
        Cmd::Repair {
            addr,
            creds,
            wait,
            timeout,
        } => repair(&addr, &creds, wait, std::time::Duration::from_secs(timeout)).await,
        Cmd::Stat { t } => stat(&t).await,
        Cmd::Ns {
            t,
            create,
            delete,
            quota,
        } => ns(&t, create, delete, quota).await,
        Cmd::Bench(args) => {
            init_logging("warn");
            ctxpod_tools::bench::run(args).await?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Plan { args, addr, creds } => plan(&args, &addr, &creds).await,
        Cmd::Replay { t, args } => {
            let c = t.creds.http(&t.addr)?;
            ctxpod_tools::replay::run(&c, Some(t.creds.connect()?), &t.ns, &args).await?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Match { t, keys } => match_chain(&t, &keys).await,
        Cmd::Prefetch {
            t,
            keys,
            policy,
            deadline_ms,
            max_len,
            output,
        } => prefetch(t, keys, &policy, deadline_ms, max_len, output).await,
        Cmd::Events { t, count } => events(&t, count).await,
        Cmd::Token {
            cmd:
                TokenCmd::Create {
                    id,
                    role,
                    tenant,
                    s3,
                    dir,
                },
        } => token_create(&id, &role, tenant.as_deref(), s3, dir.as_deref()),
        Cmd::Hash {
            block_size,
            salt,
            lora,
            tokens,
        } => hash(block_size, salt.as_deref(), lora.as_deref(), &tokens),
    }
}
