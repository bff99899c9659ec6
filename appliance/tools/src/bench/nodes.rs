//! The nodes a run starts: `ctxpod serve` processes on loopback (with TLS made for the run,
//! and `perf record` when asked), stopped when dropped.

use super::*;
use ctxpod_testkit::pki::{client_tls, Ca};
use ctxpod_testkit::process::{self, terminate, wait_for_addr};

pub(crate) struct Node {
    pub(crate) child: Child,
    pub(crate) client: Client,
    /// The CXP1 listener's address.
    pub(crate) transfer: Option<String>,
    /// How clients reach it (TLS with `--tls`).
    pub(crate) how: ctxpod_client::connect::Connect,
    /// Where `--perf` profiles of this node's phases go.
    pub(crate) perf: Option<PathBuf>,
}

/// A system-wide `perf record` around one timed phase (`--perf`); stopped with SIGINT, so
/// that perf writes its file, when the phase ends.
pub(crate) struct PerfRecord(Child);

impl PerfRecord {
    pub(crate) fn start(dir: &Path, what: &str, size: usize) -> anyhow::Result<PerfRecord> {
        std::fs::create_dir_all(dir)?;
        let name: String = format!("{what}-{}", ByteSize(size as u64))
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let file = dir.join(format!("{name}.data"));
        let child = Command::new("perf")
            .args(["record", "-a", "-F", "999", "-q", "-o"])
            .arg(&file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("--perf: start `perf record` (is perf installed?)")?;
        Ok(PerfRecord(child))
    }

    pub(crate) fn stop(mut self) -> anyhow::Result<()> {
        // SAFETY: sending SIGINT to our own child process.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGINT) };
        let st = self.0.wait()?;
        // perf writes its file on SIGINT, then ends by the same signal.
        use std::os::unix::process::ExitStatusExt;
        ensure!(
            st.success() || st.signal() == Some(libc::SIGINT),
            "perf record ended with {st}"
        );
        Ok(())
    }
}

/// A CA and a server certificate for 127.0.0.1, written under `dir`; the TOML that serves
/// them, and a client TLS configuration that trusts the CA.
pub(crate) fn bench_tls(
    dir: &Path,
) -> anyhow::Result<(String, std::sync::Arc<rustls::ClientConfig>)> {
    std::fs::create_dir_all(dir)?;
    let ca = Ca::new("ctxpod bench CA");
    let toml = ca.server(dir, "node").tls_lines();
    Ok((toml, client_tls(&ca, None)))
}

impl Node {
    pub(crate) async fn start(
        data_dir: &Path,
        capacity: u64,
        dram: u64,
        device: &str,
        a: &BenchArgs,
    ) -> anyhow::Result<Node> {
        let offload_inline = a.offload_inline;
        let exe = std::env::current_exe()?;
        let _ = std::fs::remove_file(data_dir.join(process::ADDR_FILE));
        let mut cmd = Command::new(exe);
        cmd.args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--transfer-listen",
            "127.0.0.1:0",
        ]);
        if device != "file" {
            cmd.args(["--device", device]);
        }
        if offload_inline {
            cmd.env("CTXPOD_OFFLOAD_INLINE", "true");
        }
        if a.no_encrypt_at_rest {
            cmd.env("CTXPOD_ENCRYPT_AT_REST", "false");
        }
        let mut how = ctxpod_client::connect::Connect::default();
        if a.tls {
            let (toml, client) = bench_tls(&data_dir.with_extension("pki"))?;
            let f = data_dir.with_extension("toml");
            std::fs::write(&f, toml)?;
            cmd.arg("--config").arg(f);
            how.tls = Some(client);
        }
        let mut child = spawn_serve(cmd, data_dir, capacity, dram)?;
        let addr = wait_for_addr(data_dir, &mut child, Duration::from_secs(60)).await?;
        let transfer = process::transfer_addr(data_dir).ok();
        let scheme = if a.tls { "https" } else { "http" };
        Ok(Node {
            child,
            client: Client::connect(format!("{scheme}://{addr}"), &how)?,
            transfer,
            how,
            perf: a.perf.clone(),
        })
    }

    pub(crate) fn stop(mut self) -> anyhow::Result<()> {
        terminate(&mut self.child)?;
        Ok(())
    }
}

impl Drop for Node {
    /// A bench that fails part-way must not leave its node running (holding its stdout and
    /// stderr, and its port). After `stop` the child has been reaped: `try_wait` says so and
    /// nothing is signalled.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Starts `ctxpod serve` (`cmd` holds the subcommand and its own flags) on `data_dir` with
/// this capacity and DRAM tier, logging only warnings.
pub(crate) fn spawn_serve(
    mut cmd: Command,
    data_dir: &Path,
    capacity: u64,
    dram: u64,
) -> anyhow::Result<Child> {
    cmd.arg("--data-dir")
        .arg(data_dir)
        .args([
            "--capacity",
            &capacity.to_string(),
            "--dram",
            &dram.to_string(),
        ])
        .env("CTXPOD_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .context("start ctxpod serve")
}

/// A node of the `--pod` benchmark: stopped with SIGTERM and its data removed when dropped.
pub(crate) struct PodNode {
    pub(crate) child: Child,
    pub(crate) dir: PathBuf,
}

impl PodNode {
    /// Starts a pod member on `dir` with the configuration written beside it
    /// (`<dir>.toml`), its HTTP API on 127.0.0.1:`http` and CXP1 on 127.0.0.1:`transfer`.
    pub(crate) fn spawn(
        dir: PathBuf,
        http: u16,
        transfer: u16,
        capacity: u64,
        dram: u64,
    ) -> anyhow::Result<PodNode> {
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.arg("serve")
            .arg("--config")
            .arg(dir.with_extension("toml"))
            .args(["--listen", &format!("127.0.0.1:{http}")])
            .args(["--transfer-listen", &format!("127.0.0.1:{transfer}")]);
        let child = spawn_serve(cmd, &dir, capacity, dram)?;
        Ok(PodNode { child, dir })
    }
}

impl Drop for PodNode {
    fn drop(&mut self) {
        let _ = terminate(&mut self.child);
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_file(self.dir.with_extension("toml"));
    }
}
