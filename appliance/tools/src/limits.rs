//! The machine's own limits, measured in the same run as the node (`ctxpod bench`): what one
//! core does with the data path's kernels (CRC32C, AES-256-GCM both ways, memcpy) and what
//! one loopback TCP stream carries. Every ctxpod figure is then printed also as a fraction of
//! the limit that bounds it.
//!
//! Each kernel runs over 1 MiB blocks (the data path's unit) drawn in turn from a pool larger
//! than the last-level cache, so that the figure includes the memory traffic a real block
//! costs, and for a fixed number of bytes (no timing loop that adapts to the machine).

use ctxpod_engine::crypto::{self, AeadKey};
use std::io::{Read, Write};
use std::time::Instant;

/// Bytes of the pool the kernels walk through: larger than any last-level cache here.
const POOL_BYTES: usize = 256 << 20;
const BLOCK_BYTES: usize = 1 << 20;

/// One measured limit.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Limit {
    pub what: &'static str,
    pub gb_per_s: f64,
}

/// The blocks a kernel walks through: [`POOL_BYTES`], or less when fewer bytes are measured.
fn pool(bytes: u64) -> Vec<u8> {
    let len = (bytes as usize).clamp(BLOCK_BYTES, POOL_BYTES) / BLOCK_BYTES * BLOCK_BYTES;
    // Not zero pages: the kernels must touch real memory.
    (0..len).map(|i| (i as u8).wrapping_mul(31)).collect()
}

/// Runs `f` over `bytes` bytes, one 1 MiB block of `buf` at a time; returns GB/s.
fn over_blocks(buf: &mut [u8], bytes: u64, mut f: impl FnMut(&mut [u8])) -> f64 {
    let blocks = buf.len() / BLOCK_BYTES;
    let n = (bytes as usize / BLOCK_BYTES).max(1);
    let t = Instant::now();
    for i in 0..n {
        let at = (i % blocks) * BLOCK_BYTES;
        f(&mut buf[at..at + BLOCK_BYTES]);
    }
    (n * BLOCK_BYTES) as f64 / t.elapsed().as_secs_f64() / 1e9
}

/// CRC32C on one core (hardware instructions where the CPU has them, as the node uses).
pub fn crc32c(bytes: u64) -> Limit {
    let mut buf = pool(bytes);
    let mut acc = 0u32;
    let gb_per_s = over_blocks(&mut buf, bytes, |b| acc ^= crc32c::crc32c(b));
    std::hint::black_box(acc);
    Limit {
        what: "CRC32C, one core",
        gb_per_s,
    }
}

/// AES-256-GCM sealing and opening on one core, with the node's own calls (aws-lc-rs).
pub fn aes_gcm(bytes: u64) -> [Limit; 2] {
    let key = AeadKey::new(&crypto::random_key());
    let mut buf = pool(bytes);
    let blocks = buf.len() / BLOCK_BYTES;
    // Each block sealed in place, its tag kept, so that opening checks real ciphertext.
    let plain = BLOCK_BYTES - 16;
    let mut seq = 0u64;
    let seal = over_blocks(&mut buf, bytes, |b| {
        seq += 1;
        let tag = crypto::seal(&key, nonce(seq), b"limits", &mut b[..plain]);
        b[plain..].copy_from_slice(&tag);
    });
    // Reseal the whole pool once with nonces by position, then open it over and over: an
    // open that fails would be a bug in the measurement, and is reported as one.
    for (i, b) in buf.chunks_mut(BLOCK_BYTES).enumerate() {
        let tag = crypto::seal(&key, nonce(i as u64), b"limits", &mut b[..plain]);
        b[plain..].copy_from_slice(&tag);
    }
    let mut scratch = vec![0u8; BLOCK_BYTES];
    let mut failures = 0u64;
    let mut i = 0usize;
    let open = over_blocks(&mut buf, bytes, |b| {
        // Open a copy: opening in place would leave plaintext behind for the next round.
        scratch.copy_from_slice(b);
        if crypto::open(&key, nonce((i % blocks) as u64), b"limits", &mut scratch).is_err() {
            failures += 1;
        }
        i += 1;
    });
    assert_eq!(failures, 0, "AES-GCM open failed on its own ciphertext");
    [
        Limit {
            what: "AES-256-GCM seal, one core",
            gb_per_s: seal,
        },
        Limit {
            what: "AES-256-GCM open (with a 1 MiB copy), one core",
            gb_per_s: open,
        },
    ]
}

fn nonce(i: u64) -> [u8; 12] {
    let mut n = [0u8; 12];
    n[..8].copy_from_slice(&i.to_le_bytes());
    n
}

/// memcpy of 1 MiB blocks from the pool into one destination block, one core.
pub fn memcpy(bytes: u64) -> Limit {
    let mut buf = pool(bytes);
    let mut dst = vec![0u8; BLOCK_BYTES];
    let gb_per_s = over_blocks(&mut buf, bytes, |b| {
        dst.copy_from_slice(b);
        std::hint::black_box(&mut dst);
    });
    Limit {
        what: "memcpy of 1 MiB blocks, one core",
        gb_per_s,
    }
}

/// One TCP stream over loopback: a thread writes `bytes` in 1 MiB writes, this one reads
/// them (what iperf3 measures with one stream, without needing it installed).
pub fn loopback_tcp(bytes: u64) -> std::io::Result<Limit> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let writer = std::thread::spawn(move || -> std::io::Result<()> {
        let mut s = std::net::TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        let block = vec![0x5au8; BLOCK_BYTES];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(BLOCK_BYTES as u64) as usize;
            s.write_all(&block[..n])?;
            left -= n as u64;
        }
        Ok(())
    });
    let (mut s, _) = listener.accept()?;
    let mut buf = vec![0u8; BLOCK_BYTES];
    let mut got = 0u64;
    let t = Instant::now();
    while got < bytes {
        match s.read(&mut buf)? {
            0 => break,
            n => got += n as u64,
        }
    }
    let secs = t.elapsed().as_secs_f64();
    writer
        .join()
        .map_err(|_| std::io::Error::other("the loopback writer panicked"))??;
    if got != bytes {
        return Err(std::io::Error::other(format!(
            "loopback stream carried {got} of {bytes} bytes"
        )));
    }
    Ok(Limit {
        what: "loopback TCP, one stream",
        gb_per_s: got as f64 / secs / 1e9,
    })
}

/// What iperf3 measures over loopback in `secs` seconds with `streams` parallel streams;
/// `Ok(None)` when iperf3 is not installed (`scripts/setup-deps.sh` installs it).
pub fn iperf3_loopback(secs: u32, streams: u32) -> anyhow::Result<Option<Limit>> {
    use anyhow::Context;
    use std::process::{Command, Stdio};
    if Command::new("iperf3")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_err()
    {
        return Ok(None);
    }
    // A free port: bound here, released, then taken by the iperf3 server.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port()
        .to_string();
    let mut server = Command::new("iperf3")
        .args(["-s", "-1", "-B", "127.0.0.1", "-p", &port])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("start the iperf3 server")?;
    // The server listens within milliseconds; the client retries its connect briefly.
    let mut out = None;
    for _ in 0..20 {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let o = Command::new("iperf3")
            .args([
                "-c",
                "127.0.0.1",
                "-p",
                &port,
                "-J",
                "-t",
                &secs.to_string(),
            ])
            .args(["-P", &streams.to_string()])
            .stderr(Stdio::null())
            .output()
            .context("run the iperf3 client")?;
        if o.status.success() {
            out = Some(o.stdout);
            break;
        }
    }
    let _ = server.kill();
    let _ = server.wait();
    let out = out.context("the iperf3 client did not connect to its server")?;
    let v: serde_json::Value = serde_json::from_slice(&out).context("iperf3's JSON")?;
    let bits = v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .context("iperf3's JSON has no end.sum_received.bits_per_second")?;
    Ok(Some(Limit {
        what: if streams == 1 {
            "iperf3 loopback TCP, one stream"
        } else {
            "iperf3 loopback TCP, 4 streams"
        },
        gb_per_s: bits / 8e9,
    }))
}

/// Every limit above, `bytes` each, and iperf3 for 3 s with one stream and with four when it
/// is installed (a loopback failure is reported, not fatal).
pub fn measure(bytes: u64) -> Vec<Limit> {
    let mut out = vec![crc32c(bytes)];
    out.extend(aes_gcm(bytes));
    out.push(memcpy(bytes));
    match loopback_tcp(bytes) {
        Ok(l) => out.push(l),
        Err(e) => eprintln!("loopback TCP limit not measured: {e}"),
    }
    for streams in [1, 4] {
        match iperf3_loopback(3, streams) {
            Ok(Some(l)) => out.push(l),
            Ok(None) => {
                eprintln!("iperf3 is not installed: loopback measured by ctxpod's own stream only");
                break;
            }
            Err(e) => eprintln!("iperf3 loopback not measured: {e:#}"),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each kernel runs over real data and answers a finite, positive rate; the loopback
    /// stream carries exactly what was written. (Speed itself is the bench's business.)
    #[test]
    fn every_limit_measures_something() {
        let all = measure(8 << 20);
        // iperf3's two rows when it is installed (scripts/setup-deps.sh installs it).
        let iperf3 = std::process::Command::new("iperf3")
            .arg("--version")
            .output()
            .is_ok();
        assert_eq!(all.len(), if iperf3 { 7 } else { 5 }, "{all:?}");
        for l in &all {
            assert!(l.gb_per_s.is_finite() && l.gb_per_s > 0.0, "{l:?}");
        }
    }
}
