//! A real etcd server for the pod tests: Debian's `etcd` (package `etcd-server`, installed by
//! scripts/setup-deps.sh) on free loopback ports, with its data in a temp dir. Stopped when
//! dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct EtcdServer {
    child: Option<Child>,
    dir: PathBuf,
    client_port: u16,
    peer_port: u16,
    pub url: String,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

impl EtcdServer {
    /// Starts etcd with its data under `dir` and waits until it answers.
    pub fn start(dir: &Path) -> EtcdServer {
        let mut e = EtcdServer {
            child: None,
            dir: dir.join("etcd"),
            client_port: free_port(),
            peer_port: free_port(),
            url: String::new(),
        };
        e.url = format!("http://127.0.0.1:{}", e.client_port);
        e.restart();
        e
    }

    /// Starts it again (after [`Self::kill`]) on the same ports and data.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "etcd is already running");
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::File::create(self.dir.with_extension("log")).expect("etcd log");
        let child = Command::new("etcd")
            .args(["--name", "test"])
            .arg("--data-dir")
            .arg(&self.dir)
            .args(["--listen-client-urls", &self.url])
            .args(["--advertise-client-urls", &self.url])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("test={peer}")])
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
        use std::io::{Read, Write};
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.client_port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        if s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .is_err()
        {
            return false;
        }
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        answer.contains("\"health\":\"true\"")
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
