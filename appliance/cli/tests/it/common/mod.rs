//! Test harness: starts the real `ctxpod` binary on a temp dir and a free loopback port.
//! The pieces a node process is made of (waiting for its address, PKI, etcd, block
//! contents) are ctxpod-testkit's, shared with the benchmark; [`Node`] stays here because
//! it is the tests' own: it panics rather than returning errors, runs the binary this test
//! crate is built with (`CARGO_BIN_EXE_ctxpod`), follows `CTXPOD_TEST_TRANSPORT`, and its
//! twenty-odd call sites start it in half a dozen ways the bench never needs.

pub mod etcd;

pub use ctxpod_testkit::pki;
pub use ctxpod_testkit::process::deny_io_uring_setup;
pub use ctxpod_testkit::{answered_busy, block, content, env_or, kv_content, seed_from_env};

use ctxpod_client::client::{Client, ClientError};
use ctxpod_client::connect::Connect;
use ctxpod_client::transfer_client::TransferClient;
use ctxpod_format::record::{RecordHeader, HEADER_BYTES};
use ctxpod_testkit::process;
use ctxpod_wire::Durability;
use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct Node {
    child: Option<Child>,
    pub dir: PathBuf,
    pub url: String,
    pub client: Client,
    args: Vec<String>,
    envs: Vec<(String, String)>,
    deny_io_uring: bool,
    /// How clients reach it: token and TLS.
    pub how: Connect,
    https: bool,
    /// Configuration file contents, if any (written beside the data dir).
    config: Option<String>,
    /// The temp dir of a node made by [`Node::fresh`]: removed after the node is killed
    /// (fields drop after [`Drop::drop`] ran).
    tmp: Option<tempfile::TempDir>,
    /// The host of a test network it runs on ([`Node::start_on`]); `None`: loopback.
    host: Option<ctxpod_testkit::netns::Host>,
}

/// A connection's byte stream, plain or TLS.
pub trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

/// The transport the suites run over: `CTXPOD_TEST_TRANSPORT` = `plain` (default), `tls`
/// or `mtls` (the harness then makes a CA, the node's certificate and, for mTLS, an admin
/// client certificate, and every client of the harness uses them).
pub fn transport() -> String {
    std::env::var("CTXPOD_TEST_TRANSPORT").unwrap_or_else(|_| "plain".into())
}

impl Node {
    fn unstarted(dir: &Path, args: &[&str], envs: &[(&str, &str)], deny_io_uring: bool) -> Node {
        let mut n = Node {
            child: None,
            dir: dir.to_path_buf(),
            url: String::new(),
            client: Client::new("http://127.0.0.1:1"),
            args: args.iter().map(|s| s.to_string()).collect(),
            envs: envs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            deny_io_uring,
            how: Connect::default(),
            https: false,
            config: None,
            tmp: None,
            host: None,
        };
        match transport().as_str() {
            "plain" => {}
            "tls" => n.secure(false),
            "mtls" => n.secure(true),
            t => panic!("CTXPOD_TEST_TRANSPORT={t}: not plain, tls or mtls"),
        }
        n
    }

    /// TLS with certificates made here; `mutual`: the node also requires a client
    /// certificate, which maps to an admin.
    fn secure(&mut self, mutual: bool) {
        let pki_dir = self.dir.with_extension("pki");
        std::fs::create_dir_all(&pki_dir).expect("pki dir");
        let ca = pki::Ca::new("ctxpod suite CA");
        let ca_file = ca.write(&pki_dir.join("ca.crt"));
        let server = ca.server(&pki_dir, "node");
        let mut toml = server.tls_lines();
        let identity = mutual.then(|| {
            toml += &format!("client_ca_file = {ca_file:?}\n");
            toml += "[[auth.identities]]\nsubject = \"suite-admin\"\nrole = \"admin\"\n";
            ca.client(&pki_dir, "suite-admin", false)
        });
        self.config = Some(toml);
        self.how = Connect {
            token: None,
            tls: Some(pki::client_tls(&ca, identity.as_ref())),
            ..Default::default()
        };
        self.https = true;
    }

    /// Starts a node with a configuration file, reached the way `how` says.
    pub async fn start_configured(
        dir: &Path,
        args: &[&str],
        config: &str,
        how: Connect,
        https: bool,
    ) -> Node {
        Self::start_configured_with(dir, args, config, &[], how, https).await
    }

    /// A node (256 MiB) whose scrub passes start every second, reading at most
    /// `bytes_per_s` (e.g. `"64MiB"`).
    pub async fn scrubbing(dir: &Path, bytes_per_s: &str) -> Node {
        let config = format!("[scrub]\ninterval_s = 1\nbytes_per_s = \"{bytes_per_s}\"\n");
        let args = ["--capacity", "256MiB"];
        Self::start_configured(dir, &args, &config, Connect::default(), false).await
    }

    /// [`Node::start_configured`] on host `host` of a test network: the node runs in the
    /// host's namespace and listens on its address; plain HTTP whatever the suite's
    /// transport.
    pub async fn start_on(
        host: &ctxpod_testkit::netns::Host,
        dir: &Path,
        args: &[&str],
        config: &str,
    ) -> Node {
        let mut n = Self::unstarted(dir, args, &[], false);
        n.host = Some(host.clone());
        n.config = Some(config.to_string());
        n.how = Connect::default();
        n.https = false;
        n.spawn().await;
        n
    }

    /// [`Node::start_configured`] with extra environment.
    pub async fn start_configured_with(
        dir: &Path,
        args: &[&str],
        config: &str,
        envs: &[(&str, &str)],
        how: Connect,
        https: bool,
    ) -> Node {
        let mut n = Self::unstarted(dir, args, envs, false);
        n.config = Some(config.to_string());
        n.how = how;
        n.https = https;
        n.spawn().await;
        n
    }

    /// A CXP1 client, connected the way the harness's clients are.
    pub async fn wire(&self) -> TransferClient {
        TransferClient::connect_with(&self.transfer_addr(), &self.how)
            .await
            .expect("connect over CXP1")
    }

    /// A raw connection to the HTTP listener (TLS when the node serves it).
    pub async fn raw_http(&self) -> Box<dyn Io> {
        let addr = self.url.split_once("://").expect("url").1.to_string();
        self.raw(&addr).await
    }

    /// A raw connection to the CXP1 listener (TLS when the node serves it).
    pub async fn raw_wire(&self) -> Box<dyn Io> {
        self.raw(&self.transfer_addr()).await
    }

    async fn raw(&self, addr: &str) -> Box<dyn Io> {
        let s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        match &self.how.tls {
            None => Box::new(s),
            Some(cfg) => {
                let name = rustls_pki_types::ServerName::try_from("127.0.0.1").expect("name");
                let t = tokio_rustls::TlsConnector::from(cfg.clone())
                    .connect(name, s)
                    .await
                    .expect("TLS handshake");
                Box::new(t)
            }
        }
    }

    /// Starts a node on `dir` with extra `serve` flags and environment.
    pub async fn start_with(dir: &Path, args: &[&str], envs: &[(&str, &str)]) -> Node {
        let mut n = Self::unstarted(dir, args, envs, false);
        n.spawn().await;
        n
    }

    /// The node's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the node runs").id()
    }

    /// The address the node's CXP1 listener publishes.
    pub fn transfer_addr(&self) -> String {
        process::transfer_addr(&self.dir).expect("the node publishes its transfer address")
    }

    pub async fn start(dir: &Path, args: &[&str]) -> Node {
        Self::start_with(dir, args, &[]).await
    }

    /// Starts a node in a temp dir of its own (its data dir is `n` in it), which goes when
    /// the node is dropped.
    pub async fn fresh(args: &[&str]) -> Node {
        Self::fresh_with(args, &[]).await
    }

    /// [`Node::fresh`] with extra environment.
    pub async fn fresh_with(args: &[&str], envs: &[(&str, &str)]) -> Node {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut n = Self::unstarted(&tmp.path().join("n"), args, envs, false);
        n.tmp = Some(tmp);
        n.spawn().await;
        n
    }

    /// [`Node::fresh`], and a CXP1 client of it.
    pub async fn fresh_with_wire(args: &[&str]) -> (Node, TransferClient) {
        let n = Self::fresh(args).await;
        let c = n.wire().await;
        (n, c)
    }

    /// The temp dir a [`Node::fresh`] node lives in, for files beside its data dir.
    pub fn scratch(&self) -> &Path {
        self.tmp
            .as_ref()
            .expect("a node made by Node::fresh")
            .path()
    }

    /// A request to `path` (from `/v1/...`) of the node's HTTP API, by the harness's
    /// client (with its token and TLS).
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.client
            .http()
            .request(method, format!("{}{path}", self.url))
    }

    /// Starts a node whose process is refused `io_uring_setup` by a seccomp filter, the way
    /// a container's default profile refuses it.
    pub async fn start_without_io_uring(dir: &Path, args: &[&str]) -> Node {
        let mut n = Self::unstarted(dir, args, &[], true);
        n.spawn().await;
        n
    }

    async fn spawn(&mut self) {
        let _ = std::fs::remove_file(self.dir.join(process::ADDR_FILE));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.with_extension("log"))
            .expect("open node log");
        let bin = env!("CARGO_BIN_EXE_ctxpod");
        let (mut cmd, ip) = match &self.host {
            Some(h) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", &h.netns, bin]);
                (c, h.ip.as_str())
            }
            None => (Command::new(bin), "127.0.0.1"),
        };
        let (listen, transfer) = (format!("{ip}:0"), format!("{ip}:0"));
        cmd.arg("serve")
            .arg("--data-dir")
            .arg(&self.dir)
            .args(["--listen", &listen, "--transfer-listen", &transfer])
            .args(&self.args)
            .args(
                self.config
                    .as_ref()
                    .map(|c| {
                        let f = self.dir.with_extension("toml");
                        std::fs::write(&f, c).expect("write config");
                        vec!["--config".into(), f.into_os_string()]
                    })
                    .unwrap_or_default(),
            )
            .stdout(Stdio::null())
            .stderr(log);
        for (k, v) in &self.envs {
            cmd.env(k, v);
        }
        if self.deny_io_uring {
            use std::os::unix::process::CommandExt;
            // SAFETY: between fork and exec only async-signal-safe calls (prctl) are made.
            unsafe {
                cmd.pre_exec(deny_io_uring_setup);
            }
        }
        let mut child = cmd.spawn().expect("spawn ctxpod");
        let addr = process::wait_for_addr(&self.dir, &mut child, Duration::from_secs(60))
            .await
            .unwrap_or_else(|e| panic!("{e}; log:\n{}", self.log()));
        let scheme = if self.https { "https" } else { "http" };
        self.url = format!("{scheme}://{addr}");
        self.client = Client::connect(self.url.clone(), &self.how).expect("client");
        self.child = Some(child);
        let client = self.client.clone();
        let ready = ctxpod_testkit::poll_until(
            Duration::from_secs(30),
            Duration::from_millis(10),
            async || client.ready().await,
        );
        assert!(ready.await, "ctxpod not ready within 30 s");
    }

    /// SIGSTOP: the node's sockets still accept connections (the kernel's backlog), and
    /// nothing answers: a frozen, overloaded or black-holed node as a client sees it.
    pub fn freeze(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// SIGCONT: a frozen node runs again.
    pub fn thaw(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, sig: libc::c_int) {
        let pid = self.pid() as libc::pid_t;
        // SAFETY: kill(2) with the pid of a child this Node still owns (not yet waited).
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "signal {sig} to {pid}");
    }

    /// `kill -9`, no warning.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait for a clean exit.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let st = process::terminate(&mut c).expect("wait for ctxpod");
            assert!(st.success(), "ctxpod exited with {st} on SIGTERM");
        }
    }

    pub async fn restart(&mut self) {
        self.kill9();
        self.spawn().await;
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.with_extension("log")).unwrap_or_default()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill9();
    }
}

pub use ctxpod_testkit::metric_of;

/// Bytes used by the files under `dir` (allocated blocks, like `du`).
pub fn du(dir: &Path) -> u64 {
    ctxpod_testkit::du(dir).expect("read the dir")
}

/// Resident memory of a running process, from `/proc/<pid>/status` (VmRSS).
pub fn rss_bytes(pid: u32) -> u64 {
    ctxpod_testkit::rss_bytes(pid).expect("VmRSS in kB")
}

/// Waits (polling every 10 ms) until `done` answers true; after `within`, fails with `what`.
pub async fn eventually(within: Duration, what: &str, done: impl AsyncFnMut() -> bool) {
    let every = Duration::from_millis(10);
    assert!(
        ctxpod_testkit::poll_until(within, every, done).await,
        "{what}"
    );
}

/// Calls `op` again (every 10 ms) while it is answered 503 (busy), for `within` at most; its
/// last answer.
pub async fn past_busy<T>(
    within: Duration,
    mut op: impl AsyncFnMut() -> Result<T, ClientError>,
) -> Result<T, ClientError> {
    let deadline = std::time::Instant::now() + within;
    loop {
        match op().await {
            Err(e) if e.status() == Some(503) && std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            answer => return answer,
        }
    }
}

/// Sends `req` and checks that it is answered `status`; the response, for its headers and
/// body.
pub async fn answered(req: reqwest::RequestBuilder, status: u16) -> reqwest::Response {
    let r = req.send().await.expect("send");
    assert_eq!(r.status(), status);
    r
}

/// The value of the series `name_and_labels` (its name, its labels if any, and a space) in
/// the Prometheus text `m`; 0 when it is not there.
pub fn counter(m: &str, name_and_labels: &str) -> u64 {
    m.lines()
        .find_map(|l| l.strip_prefix(name_and_labels))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(0.0) as u64
}

/// Checks that `node`'s metrics (the Prometheus text) contain `text`.
pub async fn metrics_contain(node: &Node, text: &str) {
    let m = node.client.metrics().await.expect("metrics");
    assert!(m.contains(text), "{m}");
}

/// Puts `blocks` into `ns` through `c`, one request each, with `durability`; each must be
/// stored.
pub async fn put_all(
    c: &Client,
    ns: &str,
    blocks: impl IntoIterator<Item = (Vec<u8>, bytes::Bytes)>,
    durability: Durability,
) {
    for (k, d) in blocks {
        c.put(ns, &k, d, durability).await.expect("put");
    }
}

/// One durable put through `c`, which must be stored.
pub async fn put_durable(c: &Client, ns: &str, key: &[u8], data: bytes::Bytes) {
    c.put(ns, key, data, Durability::Durable)
        .await
        .expect("put");
}

/// One block put durably into `ns` over CXP1; the request must be answered (the block's own
/// status, returned, is the caller's to check).
pub async fn put_over_wire(c: &TransferClient, ns: &str, key: &[u8], data: bytes::Bytes) -> u16 {
    let entry = [(bytes::Bytes::copy_from_slice(key), data)];
    let durable = ctxpod_wire::proto::Durability::Durable;
    c.put(ns, &entry, durable).await.expect("put")[0]
}

/// The names of the namespaces `c` sees, in the order listed.
pub async fn namespace_names(c: &Client) -> Vec<String> {
    let list = c.namespaces().await.expect("list");
    list.namespaces.into_iter().map(|n| n.name).collect()
}

/// Device file of a node's data dir; records start here.
pub const DATA_OFFSET: u64 = 1 << 20;

/// The device file of a node's data dir, for reading and writing while the node is down.
pub fn open_device(data_dir: &Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(data_dir.join("blocks.dev"))
        .expect("open device file")
}

/// Every record on the device: key → (file offset, header).
pub fn records(dev: &std::fs::File) -> HashMap<Vec<u8>, (u64, RecordHeader)> {
    let len = dev.metadata().expect("metadata").len();
    let mut out = HashMap::new();
    let mut buf = vec![0u8; HEADER_BYTES];
    let mut pos = DATA_OFFSET;
    while pos + HEADER_BYTES as u64 <= len {
        dev.read_exact_at(&mut buf, pos).expect("read");
        if let Ok(h) = RecordHeader::decode(&buf) {
            out.insert(h.key.clone(), (pos, h));
        }
        pos += 4096;
    }
    out
}

pub fn flip(dev: &std::fs::File, at: u64) {
    let mut b = [0u8; 1];
    dev.read_exact_at(&mut b, at).expect("read");
    b[0] ^= 0x5a;
    dev.write_all_at(&b, at).expect("write");
}

/// A node's configuration for the in-process suites on a simulated device: 16 MiB regions,
/// one offload thread per engine.
pub fn sim_config(dir: &Path, capacity: u64, dram: u64) -> ctxpod_format::config::Config {
    use ctxpod_format::config::{ByteSize, Config};
    Config {
        data_dir: dir.to_path_buf(),
        capacity: ByteSize(capacity),
        region_bytes: Some(ByteSize(16 << 20)),
        dram: ByteSize(dram),
        offload_threads: 1,
        ..Config::default()
    }
}

/// Runs `f` on a runtime of its own, then tears the runtime down: whatever the node was
/// doing is dropped, as a power cut would leave it. A node `f` returns is dropped only
/// after that, so that nothing of it runs after the cut (not even its shutdown path).
pub fn life<T>(f: impl std::future::Future<Output = T>) -> T {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let out = rt.block_on(f);
    rt.shutdown_timeout(Duration::from_secs(30));
    out
}

pub async fn open_on_sim(
    cfg: &ctxpod_format::config::Config,
    dev: &std::sync::Arc<ctxpod_firmware_sim::SimDevice>,
) -> ctxpod_engine::Engine {
    try_open_on_sim(cfg, dev)
        .await
        .expect("open the node on the simulated device")
}

/// The node on a simulated device, or why it could not start (e.g. power cut while it
/// formatted the device).
pub async fn try_open_on_sim(
    cfg: &ctxpod_format::config::Config,
    dev: &std::sync::Arc<ctxpod_firmware_sim::SimDevice>,
) -> anyhow::Result<ctxpod_engine::Engine> {
    ctxpod_engine::Engine::open_on(
        cfg.clone(),
        std::sync::Arc::new(ctxpod_engine::metrics::Metrics::new()),
        Some(std::sync::Arc::new(
            ctxpod_engine::device::sim::SimBackend::new(dev.clone()),
        )),
    )
    .await
}

/// Sends a CXP1 hello on a raw connection and checks the node's; returns the node's.
pub async fn cxp1_hello<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    s: &mut S,
) -> ctxpod_wire::proto::Hello {
    use ctxpod_wire::proto::{self, Hello};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let h = Hello {
        version: proto::VERSION,
        flags: 0,
        max_frame_bytes: proto::FRAME_BYTES_MAX,
        value_bytes_max: 0,
    };
    s.write_all(&h.encode()).await.expect("hello");
    let mut back = [0u8; proto::HELLO_BYTES];
    s.read_exact(&mut back).await.expect("server hello");
    Hello::decode(&back).expect("a CXP1 server")
}

/// A node whose clients authenticate: one token per `(id, role, tenant)`, tenants declared
/// (with `tenants_toml` appended to the configuration). The harness's own client uses the
/// first token. Returns the node and each id's token.
pub async fn node_with_tokens(
    dir: &Path,
    args: &[&str],
    creds: &[(&str, &str, Option<&str>)],
    tenants_toml: &str,
) -> (Node, HashMap<String, String>) {
    node_with_tokens_env(dir, args, &[], creds, tenants_toml).await
}

/// [`node_with_tokens`] with extra environment (`CTXPOD_*` settings).
pub async fn node_with_tokens_env(
    dir: &Path,
    args: &[&str],
    envs: &[(&str, &str)],
    creds: &[(&str, &str, Option<&str>)],
    tenants_toml: &str,
) -> (Node, HashMap<String, String>) {
    let mut toml = String::new();
    let mut tokens = HashMap::new();
    for (id, role, tenant) in creds {
        let (tok, hash) = ctxpod_node::auth::new_token(id).expect("token");
        toml += &format!("[[auth.tokens]]\nid = \"{id}\"\nrole = \"{role}\"\nhash = \"{hash}\"\n");
        if let Some(t) = tenant {
            toml += &format!("tenant = \"{t}\"\n");
        }
        tokens.insert(id.to_string(), tok.to_string());
    }
    toml += tenants_toml;
    let how = Connect {
        token: Some(tokens[creds[0].0].clone()),
        tls: None,
        ..Default::default()
    };
    let n = Node::start_configured_with(dir, args, &toml, envs, how, false).await;
    (n, tokens)
}

/// An HTTP client of `node` with `token`.
pub fn client_with(node: &Node, token: &str) -> Client {
    Client::connect(
        node.url.clone(),
        &Connect {
            token: Some(token.to_string()),
            tls: node.how.tls.clone(),
            ..Default::default()
        },
    )
    .expect("client")
}
