//! What the device gives on its own, to set the node's figures beside: the engine's device
//! layer driven directly, and fio when installed.

use super::*;

/// Sequential O_DIRECT write (then flush) and read of the device file, 1 MiB I/Os, 8 in
/// flight, through the same device layer the node uses.
pub(crate) async fn device_baseline(
    dir: &Path,
    bytes: u64,
    spec: &str,
) -> anyhow::Result<(Row, Row)> {
    let path = dir.join("device-baseline.dat");
    let _ = std::fs::remove_file(&path);
    let dev: std::sync::Arc<dyn device::Device> = match spec.strip_prefix("sim:") {
        Some(profile) => {
            std::sync::Arc::new(device::sim::SimBackend::open(profile, &path, bytes, None)?)
        }
        None => device::open(&path, bytes, IoEngine::Auto)?,
    };
    let how = if spec == "file" { "O_DIRECT, " } else { "" };
    let chunk = 1u64 << 20;
    let n = bytes / chunk;
    let mut fill = AlignedBuf::zeroed(chunk as usize);
    for (i, b) in fill.iter_mut().enumerate() {
        *b = (i * 7 % 251) as u8;
    }
    let pattern = fill.to_vec();
    let mut lat = Vec::new();
    let t = Instant::now();
    let mut s = futures::stream::iter((0..n).map(|i| {
        let mut b = AlignedBuf::zeroed(chunk as usize);
        b.copy_from_slice(&pattern);
        let d = dev.clone();
        async move {
            let t = Instant::now();
            let (_, r) = d.write_at(b, i * chunk).await;
            r.map(|_| t.elapsed())
        }
    }))
    .buffer_unordered(8);
    while let Some(r) = s.next().await {
        lat.push(r?);
    }
    drop(s);
    dev.flush().await?;
    let w = row(
        &format!("device seq write ({how}1 MiB, QD8)"),
        chunk,
        n * chunk,
        t.elapsed(),
        lat,
    );
    let mut lat = Vec::new();
    let t = Instant::now();
    let mut s = futures::stream::iter((0..n).map(|i| {
        let d = dev.clone();
        async move {
            let t = Instant::now();
            let (_, r) = d
                .read_at(AlignedBuf::zeroed(chunk as usize), i * chunk)
                .await;
            r.map(|_| t.elapsed())
        }
    }))
    .buffer_unordered(8);
    while let Some(r) = s.next().await {
        lat.push(r?);
    }
    drop(s);
    let r = row(
        &format!("device seq read ({how}1 MiB, QD8)"),
        chunk,
        n * chunk,
        t.elapsed(),
        lat,
    );
    drop(dev);
    let _ = std::fs::remove_file(&path);
    Ok((w, r))
}

/// fio's sequential O_DIRECT bandwidth (1 MiB, QD8, io_uring), when fio is installed.
pub(crate) fn fio_baseline(dir: &Path, bytes: u64) -> Option<Vec<Row>> {
    let path = dir.join("fio-baseline.dat");
    // One fio job: `rw` in `bs` I/Os at `qd` in flight over `bytes` (random ones for at
    // most 5 s), its bandwidth in bytes/s and its IOPS.
    let run = |rw: &str, bs: &str, qd: u32, extra: &[&str]| -> Option<(f64, f64)> {
        let out = Command::new("fio")
            .args([
                "--name=ctxpod-baseline",
                "--ioengine=io_uring",
                "--direct=1",
                "--output-format=json",
                "--end_fsync=1",
            ])
            .arg(format!("--rw={rw}"))
            .arg(format!("--bs={bs}"))
            .arg(format!("--iodepth={qd}"))
            .args(extra)
            .arg(format!("--size={bytes}"))
            .arg(format!("--filename={}", path.display()))
            .output()
            .ok()?;
        if !out.status.success() {
            eprintln!("fio {rw} failed: {}", String::from_utf8_lossy(&out.stderr));
            return None;
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        let side = &v["jobs"][0][if rw.contains("write") {
            "write"
        } else {
            "read"
        }];
        Some((side["bw_bytes"].as_f64()?, side["iops"].as_f64()?))
    };
    let random = ["--runtime=5", "--randrepeat=0"];
    let w = run("write", "1M", 8, &[]);
    let r = run("read", "1M", 8, &[]);
    let rr64 = run("randread", "64k", 16, &random);
    let rr4 = run("randread", "4k", 32, &random);
    let rw64 = run("randwrite", "64k", 16, &random);
    // The ceiling of a durable write path on this device: the same writes with an fdatasync
    // every 4 MiB, 16 in flight (fio keeps writing while a sync is pending).
    let ws = run("write", "1M", 16, &["--fdatasync=4"]);
    let _ = std::fs::remove_file(&path);
    let mk = |what: &str, size: u64, (bw, iops): (f64, f64)| Row {
        ops: iops.round() as u64,
        gb_per_s: bw / 1e9,
        ..Row::of(what, size)
    };
    let mut rows = vec![
        mk("fio seq write (O_DIRECT, 1 MiB, QD8)", 1 << 20, w?),
        mk(
            "fio seq write + fdatasync every 4 MiB (O_DIRECT, 1 MiB, QD16)",
            1 << 20,
            ws?,
        ),
        mk("fio seq read (O_DIRECT, 1 MiB, QD8)", 1 << 20, r?),
    ];
    // Random I/O bounds small blocks.
    for (what, size, got) in [
        ("fio rand read (O_DIRECT, 64 KiB, QD16)", 64 << 10, rr64),
        ("fio rand read (O_DIRECT, 4 KiB, QD32)", 4 << 10, rr4),
        ("fio rand write (O_DIRECT, 64 KiB, QD16)", 64 << 10, rw64),
    ] {
        if let Some(got) = got {
            rows.push(mk(what, size, got));
        }
    }
    Some(rows)
}
