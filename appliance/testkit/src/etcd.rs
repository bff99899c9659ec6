//! A real etcd server for pod runs (the pod tests): Debian's `etcd` (package `etcd-server`, installed by
//! scripts/setup-deps.sh) on free loopback ports, with its data in a temp dir, secured as a
//! production pod's should be (issue #18, point 6): TLS with client certificates
//! (`--client-cert-auth`, a CA made here) and etcd auth on, the nodes authenticating as
//! user `ctxpod`, whose role may read and write `/ctxpod/` only. Stopped when dropped.

use crate::pki::{Ca, Files};
use crate::process::free_port;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running etcd (see the module's doc), stopped when dropped.
pub struct EtcdServer {
    child: Option<Child>,
    /// The network namespace it runs in (`None`: the machine's own, on loopback).
    netns: Option<String>,
    dir: PathBuf,
    peer_port: u16,
    /// The client URL (`https://127.0.0.1:<port>`).
    pub url: String,
    /// etcd's CA, and its server certificate.
    pub ca_file: PathBuf,
    server: Files,
    /// The nodes' client certificate (no common name: see `ctxpod_pod::meta::etcd`).
    pub client_cert: Files,
    /// User `ctxpod`'s password, in a file.
    pub password_file: PathBuf,
    root_password: String,
}

impl EtcdServer {
    /// Starts etcd with its data under `dir`, waits until it answers, and turns auth on.
    pub fn start(dir: &Path) -> EtcdServer {
        Self::start_on(dir, None)
    }

    /// [`EtcdServer::start`] on host `at` of a test network (listening on its address),
    /// or on loopback.
    pub fn start_on(dir: &Path, at: Option<&crate::netns::Host>) -> EtcdServer {
        let pki = dir.join("etcd-pki");
        std::fs::create_dir_all(&pki).expect("etcd pki dir");
        let ca = Ca::new("etcd CA");
        let password_file = pki.join("ctxpod.password");
        std::fs::write(&password_file, format!("{:032x}\n", rand::random::<u128>()))
            .expect("password");
        let client_port = free_port().expect("a free port");
        let ip = at.map_or("127.0.0.1", |h| h.ip.as_str());
        let mut e = EtcdServer {
            child: None,
            netns: at.map(|h| h.netns.clone()),
            dir: dir.join("etcd"),
            peer_port: free_port().expect("a free port"),
            url: format!("https://{ip}:{client_port}"),
            ca_file: ca.write(&pki.join("ca.crt")),
            // Both usages: etcd's gateway dials its own gRPC server with it.
            server: ca.node_at(&pki, "etcd", &[ip]),
            client_cert: ca.client_without_cn(&pki, "ctxpod"),
            password_file,
            root_password: format!("{:032x}", rand::random::<u128>()),
        };
        e.restart();
        e.enable_auth();
        e
    }

    /// The `[pod]` lines of a node's configuration that reach this etcd: endpoint, TLS, client certificate, auth.
    pub fn pod_lines(&self) -> String {
        format!(
            "etcd_endpoints = [\"{}\"]\netcd_ca_file = {:?}\netcd_cert_file = {:?}\n\
             etcd_key_file = {:?}\netcd_username = \"ctxpod\"\netcd_password_file = {:?}\n",
            self.url, self.ca_file, self.client_cert.cert, self.client_cert.key, self.password_file
        )
    }

    /// One JSON gateway call with curl, as `auth` (a token) or none: the answer's body.
    fn curl(&self, path: &str, body: &str, auth: Option<&str>) -> String {
        let mut c = Command::new("curl");
        c.args(["-s", "--max-time", "5", "--cacert"])
            .arg(&self.ca_file)
            .arg("--cert")
            .arg(&self.client_cert.cert)
            .arg("--key")
            .arg(&self.client_cert.key)
            .args(["-d", body]);
        if let Some(t) = auth {
            c.args(["-H", &format!("Authorization: {t}")]);
        }
        let out = c
            .arg(format!("{}{path}", self.url))
            .output()
            .expect("curl (scripts/setup-deps.sh installs it)");
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    /// Users `root` and `ctxpod` (role `ctxpod`: read and write under `/ctxpod/`), then
    /// auth on.
    fn enable_auth(&self) {
        use base64::Engine as _;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let pw = std::fs::read_to_string(&self.password_file).expect("password");
        let steps = [
            (
                "/v3/auth/user/add",
                format!(r#"{{"name":"root","password":"{}"}}"#, self.root_password),
            ),
            (
                "/v3/auth/user/grant",
                r#"{"user":"root","role":"root"}"#.to_string(),
            ),
            ("/v3/auth/role/add", r#"{"name":"ctxpod"}"#.to_string()),
            (
                "/v3/auth/role/grant",
                format!(
                    r#"{{"name":"ctxpod","perm":{{"permType":"READWRITE","key":"{}","range_end":"{}"}}}}"#,
                    b64("/ctxpod/"),
                    b64("/ctxpod0")
                ),
            ),
            (
                "/v3/auth/user/add",
                format!(r#"{{"name":"ctxpod","password":"{}"}}"#, pw.trim()),
            ),
            (
                "/v3/auth/user/grant",
                r#"{"user":"ctxpod","role":"ctxpod"}"#.to_string(),
            ),
            ("/v3/auth/enable", "{}".to_string()),
        ];
        for (path, body) in steps {
            let answer = self.curl(path, &body, None);
            assert!(answer.contains("\"header\""), "etcd {path}: {answer}");
        }
        // Auth is on: no token, no answer.
        let put = format!(
            r#"{{"key":"{}","value":"{}"}}"#,
            b64("/ctxpod/probe"),
            b64("x")
        );
        let refused = self.curl("/v3/kv/put", &put, None);
        assert!(
            refused.contains("user name is empty"),
            "auth is not on: {refused}"
        );
    }

    /// Starts it again (after [`Self::kill`]) on the same ports and data.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "etcd is already running");
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::File::create(self.dir.with_extension("log")).expect("etcd log");
        let mut cmd = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, "etcd"]);
                c
            }
            None => Command::new("etcd"),
        };
        let child = cmd
            .args(["--name", "test"])
            .arg("--data-dir")
            .arg(&self.dir)
            .args(["--listen-client-urls", &self.url])
            .args(["--advertise-client-urls", &self.url])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("test={peer}")])
            .arg("--cert-file")
            .arg(&self.server.cert)
            .arg("--key-file")
            .arg(&self.server.key)
            .arg("--client-cert-auth")
            .arg("--trusted-ca-file")
            .arg(&self.ca_file)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start etcd (is etcd-server installed? scripts/setup-deps.sh installs it)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.healthy() {
                return;
            }
            assert!(Instant::now() < deadline, "etcd did not start within 30 s");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `GET /health` answers `"health":"true"`.
    fn healthy(&self) -> bool {
        let out = Command::new("curl")
            .args(["-s", "--max-time", "1", "--cacert"])
            .arg(&self.ca_file)
            .arg("--cert")
            .arg(&self.client_cert.cert)
            .arg("--key")
            .arg(&self.client_cert.key)
            .arg(format!("{}/health", self.url))
            .output();
        out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("\"health\":\"true\""))
    }

    /// kill -9: etcd stops answering at once.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.kill();
    }
}
