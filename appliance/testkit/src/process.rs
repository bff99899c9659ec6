//! A node as a process: the files it publishes its addresses in, waiting for them (and for
//! any condition), free loopback ports, a clean stop, what a folder takes on disk and a
//! process in memory, and a seccomp filter that refuses io_uring the way a container's
//! default profile does.

use std::path::Path;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

/// The file in a node's data dir that holds its HTTP address (`host:port` and a newline)
/// once it serves.
pub const ADDR_FILE: &str = "ctxpod.addr";

/// The file in a node's data dir that holds its CXP1 listener's address once it serves.
pub const TRANSFER_ADDR_FILE: &str = "ctxpod.transfer.addr";

/// A free loopback port (bound, then released for a server to take).
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Waits until the node `child`, started on `data_dir`, has published its HTTP address
/// ([`ADDR_FILE`], written whole: it ends with a newline) and returns it; an error if the
/// process exits first or `within` passes. Remove the file before starting the node.
pub async fn wait_for_addr(
    data_dir: &Path,
    child: &mut Child,
    within: Duration,
) -> anyhow::Result<String> {
    let file = data_dir.join(ADDR_FILE);
    let deadline = Instant::now() + within;
    loop {
        if let Ok(a) = std::fs::read_to_string(&file) {
            if a.ends_with('\n') {
                return Ok(a.trim().to_string());
            }
        }
        if let Some(st) = child.try_wait()? {
            anyhow::bail!("ctxpod exited with {st} before serving");
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "ctxpod did not start within {} s",
            within.as_secs()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The address a serving node on `data_dir` publishes for its CXP1 listener
/// ([`TRANSFER_ADDR_FILE`]).
pub fn transfer_addr(data_dir: &Path) -> std::io::Result<String> {
    Ok(std::fs::read_to_string(data_dir.join(TRANSFER_ADDR_FILE))?
        .trim()
        .to_string())
}

/// Calls `done` every `every` until it answers true (then true) or `within` has passed
/// (then false).
pub async fn poll_until(
    within: Duration,
    every: Duration,
    mut done: impl AsyncFnMut() -> bool,
) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if done().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(every).await;
    }
}

/// Sends SIGTERM to `child` (a node: it shuts down cleanly) and waits for it to exit.
pub fn terminate(child: &mut Child) -> std::io::Result<ExitStatus> {
    // SAFETY: kill(2) with a signal number, on a child of this process not yet reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    child.wait()
}

/// Bytes the files under `dir` take on disk (allocated blocks, as `du` counts them).
pub fn du(dir: &Path) -> std::io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            let m = e.metadata()?;
            if m.is_dir() {
                stack.push(e.path());
            } else {
                total += m.blocks() * 512;
            }
        }
    }
    Ok(total)
}

/// Resident memory of process `pid` (VmRSS of `/proc/<pid>/status`), if it runs.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// Installs a seccomp filter that answers EPERM to `io_uring_setup` (x86_64) and allows
/// everything else: for `pre_exec`, between fork and exec (only prctl calls are made).
pub fn deny_io_uring_setup() -> std::io::Result<()> {
    const SYS_IO_URING_SETUP: u32 = 425;
    const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
    const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
    const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
    let stmt = |code: u16, k: u32| libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    };
    let jump = |k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: 0x05 | 0x10,
        jt,
        jf,
        k,
    };
    let filter = [
        stmt(0x20, 4),                 // load arch
        jump(AUDIT_ARCH_X86_64, 1, 0), // x86_64: go on; else allow
        stmt(0x06, SECCOMP_RET_ALLOW),
        stmt(0x20, 0), // load syscall number
        jump(SYS_IO_URING_SETUP, 0, 1),
        stmt(0x06, SECCOMP_RET_ERRNO | libc::EPERM as u32),
        stmt(0x06, SECCOMP_RET_ALLOW),
    ];
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: prctl with valid arguments; `prog` outlives the call.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
            || libc::prctl(libc::PR_SET_SECCOMP, 2, &prog as *const libc::sock_fprog) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
