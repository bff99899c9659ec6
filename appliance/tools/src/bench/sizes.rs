//! One block size measured against the machine's limits, and HTTP beside CXP1.

use super::baseline::device_baseline;
use super::nodes::Node;
use super::*;

/// The machine's limits measured at the start of the run (rows of run 0).
pub(crate) struct Limits {
    pub(crate) loopback: Option<f64>,
    /// fio's sequential write with an fdatasync every 4 MiB: the device's flushed write.
    pub(crate) flushed_write: Option<f64>,
    /// fio's sequential write, flushed only at the end.
    pub(crate) write: Option<f64>,
    /// One core's CRC32C, AES-256-GCM seal and open (with its copy), and memcpy, GB/s.
    pub(crate) crc32c: Option<f64>,
    pub(crate) seal: Option<f64>,
    pub(crate) open: Option<f64>,
    pub(crate) memcpy: Option<f64>,
}

impl Limits {
    pub(crate) fn of(rows: &[Row]) -> Limits {
        let find = |what: &str| {
            rows.iter()
                .find(|r| r.run == 0 && r.what.starts_with(what))
                .map(|r| r.gb_per_s)
        };
        Limits {
            // iperf3's one stream where it ran, else ctxpod's own loopback stream.
            loopback: find("iperf3 loopback TCP, one stream").or(find("loopback TCP")),
            flushed_write: find("fio seq write + fdatasync"),
            write: find("fio seq write (O_DIRECT"),
            crc32c: find("CRC32C, one core"),
            seal: find("AES-256-GCM seal"),
            open: find("AES-256-GCM open"),
            memcpy: find("memcpy of 1 MiB blocks"),
        }
    }

    /// The data-work floor of a phase, in CPU seconds per GiB: what its bytes cost the node
    /// at the one-core speeds measured in this run, and nothing else. A PUT copies each
    /// byte in from its socket, checks its CRC32C and seals it (AES-256-GCM, when the node
    /// encrypts at rest); a cold GET opens it (its copy included), checks its CRC32C and
    /// copies it out to the socket; a hot GET only copies it out. The device's own transfer
    /// is DMA: no CPU per byte. `None` without the limits (`--limits-bytes 0`).
    pub(crate) fn floor_of(&self, what: &str, encrypted: bool) -> Option<f64> {
        let per_gib = |gb: Option<f64>| gb.map(|g| (1u64 << 30) as f64 / (g * 1e9));
        let crypto = |g: Option<f64>| if encrypted { per_gib(g) } else { Some(0.0) };
        let sum = |parts: &[Option<f64>]| parts.iter().copied().sum::<Option<f64>>();
        if what.starts_with("PUT") {
            sum(&[
                per_gib(self.memcpy),
                per_gib(self.crc32c),
                crypto(self.seal),
            ])
        } else if what.contains("cold") {
            sum(&[
                crypto(self.open),
                per_gib(self.crc32c),
                per_gib(self.memcpy),
            ])
        } else if what.contains("hot") {
            per_gib(self.memcpy)
        } else {
            None
        }
    }

    /// The limit that bounds a phase, as the targets name them: a durable PUT by the
    /// device's flushed sequential write, a fast one by its plain sequential write; a cold read by the lesser of the device's read
    /// (measured just before that phase) and one loopback stream; a hot read by the loopback
    /// stream. (CRC32C and AES-GCM run on the offload engine's threads at 5-20 GB/s per core,
    /// never the lesser here; they are printed as limits all the same.)
    pub(crate) fn bound_of(&self, r: &Row) -> Option<(String, f64)> {
        let device_read = r.of_device.map(|f| r.gb_per_s / f);
        let lesser = |a: Option<(&'static str, f64)>, b: Option<(&'static str, f64)>| match (a, b) {
            (Some(a), Some(b)) => Some(if a.1 <= b.1 { a } else { b }),
            (a, b) => a.or(b),
        };
        let w = &r.what;
        let got = if w.starts_with("PUT durable") {
            self.flushed_write.map(|g| ("flushed device write", g))
        } else if w.starts_with("PUT fast") {
            self.write.map(|g| ("device write", g))
        } else if w.contains("cold") {
            lesser(
                device_read.map(|g| ("device read", g)),
                self.loopback.map(|g| ("loopback", g)),
            )
        } else if w.contains("hot") {
            self.loopback.map(|g| ("loopback", g))
        } else {
            None
        };
        got.map(|(n, g)| (n.to_string(), g))
    }
}

pub(crate) fn median(it: impl Iterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = it.collect();
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| v[v.len() / 2])
}

/// `--batch` for blocks of `size`: fewer blocks where that many would not fit one 64 MiB
/// frame with its keys and headers (16 blocks of 4 MiB are 64 MiB of data alone).
fn batch_within_a_frame(batch: usize, size: usize) -> usize {
    const ROOM: usize = ctxpod_wire::BATCH_BODY_BYTES_MAX - (64 << 10);
    if batch <= 1 {
        return batch;
    }
    batch.min(ROOM / size.max(1)).max(1)
}

/// The device baseline, then PUT, cold GET and hot GET of one block size.
pub(crate) async fn measure_size(
    a: &BenchArgs,
    size: usize,
    device: &str,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    let n = (a.bytes.0 / size as u64).max(1);
    let total = n * size as u64;
    let batch = batch_within_a_frame(a.batch, size);
    let cxp1 = match a.protocol.as_str() {
        "http" => false,
        "cxp1" => true,
        p => anyhow::bail!("unknown protocol {p:?} (http, cxp1)"),
    };
    eprintln!(
        "{device}, {size} B blocks: device baseline ({} on {})",
        a.device_bytes,
        a.dir.display()
    );
    let (dev_w, dev_r) = device_baseline(&a.dir, a.device_bytes.0, device).await?;
    let data_dir = a.dir.join(format!("node-{size}"));
    let _ = std::fs::remove_dir_all(&data_dir);
    // Room for both sets of blocks (durable and fast) and the writer's reserve of free
    // regions, which grows with the device (at `--bytes 8GiB`, 2 × bytes + 1 GiB evicted
    // the first blocks). Cold reads run with a 16 MiB DRAM tier (every read from flash, the
    // tier churning as in steady state); hot reads with a DRAM tier that holds the whole
    // set, after an untimed pass that fills it.
    let capacity = (total * 2 + total / 2 + (1 << 30)).next_multiple_of(1 << 20);
    let dram_small = 16 << 20;
    let dram_big = total + total / 4 + (64 << 20);
    eprintln!("{size} B blocks: {n} blocks, {} per phase", ByteSize(total));
    let node = Node::start(&data_dir, capacity, dram_small, device, a).await?;
    let mut put = phase(&node, size, n, a.concurrency, "PUT durable", cxp1, batch).await?;
    put.of_device = Some(put.gb_per_s / dev_w.gb_per_s);
    let mut put_fast = phase(&node, size, n, a.concurrency, "PUT fast", cxp1, batch).await?;
    put_fast.of_device = Some(put_fast.gb_per_s / dev_w.gb_per_s);
    print_write_path_stats(&node).await?;
    print_peak_rss(&node, "PUT");
    node.stop()?;
    let node = Node::start(&data_dir, capacity, dram_small, device, a).await?;
    let mut cold = phase(
        &node,
        size,
        n,
        a.concurrency,
        "GET cold (flash)",
        cxp1,
        batch,
    )
    .await?;
    cold.of_device = Some(cold.gb_per_s / dev_r.gb_per_s);
    let s = node.client.stats().await?;
    eprintln!(
        "  cold: {} of {} reads from flash",
        s.hits - s.dram_hits,
        s.hits
    );
    print_peak_rss(&node, "GET cold");
    node.stop()?;
    let node = Node::start(&data_dir, capacity, dram_big, device, a).await?;
    phase(&node, size, n, a.concurrency, "warm-up", cxp1, batch).await?;
    let hot = phase(&node, size, n, a.concurrency, "GET hot (DRAM)", cxp1, batch).await?;
    let s = node.client.stats().await?;
    eprintln!("  hot: {} of {} reads from DRAM", s.dram_hits, s.hits);
    node.stop()?;
    let _ = std::fs::remove_dir_all(&data_dir);
    eprintln!(
        "  PUT {:.3} GB/s = {:.0} % of the device's write, cold GET {:.3} GB/s = {:.0} % of its read",
        put.gb_per_s,
        put.of_device.unwrap_or(0.0) * 100.0,
        cold.gb_per_s,
        cold.of_device.unwrap_or(0.0) * 100.0
    );
    rows.extend([dev_w, dev_r, put, put_fast, cold, hot]);
    Ok(())
}

/// The node process's peak resident memory (`VmHWM`) over its life so far, on stderr: what
/// a phase's transfers held beside the index and the DRAM tier.
fn print_peak_rss(node: &Node, phases: &str) {
    let status = std::fs::read_to_string(format!("/proc/{}/status", node.child.id()));
    let peak = status.ok().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    });
    if let Some(kib) = peak {
        eprintln!(
            "  node peak RSS through the {phases} phases: {} MiB",
            kib / 1024
        );
    }
}

/// After the PUT phases: the node's I/O engine, write amplification and its group commit,
/// device flush and index commit averages, on stderr.
async fn print_write_path_stats(node: &Node) -> anyhow::Result<()> {
    let s = node.client.stats().await?;
    let m = node.client.metrics().await?;
    let metric = |name: &str| {
        m.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let commits = metric("ctxpod_group_commit_blocks_count").max(1.0);
    eprintln!(
        "  engine {} direct={} device write amplification {:.4}; {} group commits, {:.1} \
         blocks and {:.2} ms each on average",
        s.io_engine,
        s.direct_io,
        s.write_amplification,
        commits,
        metric("ctxpod_group_commit_blocks_sum") / commits,
        metric("ctxpod_group_commit_duration_seconds_sum") / commits * 1e3
    );
    eprintln!(
        "  device flush {:.2} ms, index commit {:.2} ms on average",
        metric("ctxpod_device_flush_duration_seconds_sum")
            / metric("ctxpod_device_flush_duration_seconds_count").max(1.0)
            * 1e3,
        metric("ctxpod_index_commit_duration_seconds_sum")
            / metric("ctxpod_index_commit_duration_seconds_count").max(1.0)
            * 1e3
    );
    Ok(())
}

/// Blocks per batch request and per prefetch ticket: 16, fewer for blocks so large that 16
/// would not fit one 64 MiB frame.
pub(crate) fn batch_of(size: usize) -> usize {
    (32usize << 20).div_ceil(size).clamp(1, 16)
}

/// `--protocol compare`: per size, the device baseline and one PUT (CXP1), then three cold
/// reads of the same blocks, each on a freshly started node (16 MiB DRAM tier): batch GET
/// over HTTP, batch GET over CXP1, PREFETCH over CXP1 into registered regions (every block
/// checked byte for byte in the region); then MATCH of a 1,000-key chain over both.
pub(crate) async fn compare_transfer(
    a: &BenchArgs,
    device: &str,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    for size in &a.sizes {
        let size = size.0 as usize;
        let n = (a.bytes.0 / size as u64).max(1);
        let total = n * size as u64;
        eprintln!("{device}, {size} B blocks: device baseline");
        let (_, dev_r) = device_baseline(&a.dir, a.device_bytes.0, device).await?;
        let data_dir = a.dir.join(format!("node-{size}"));
        let _ = std::fs::remove_dir_all(&data_dir);
        let capacity = (total * 2 + (1 << 30)).next_multiple_of(1 << 20);
        let dram = 16 << 20;
        let node = Node::start(&data_dir, capacity, dram, device, a).await?;
        phase(&node, size, n, a.concurrency, "PUT durable", true, 1).await?;
        node.stop()?;
        let mut got = Vec::new();
        for what in [
            "batch GET cold, HTTP",
            "batch GET cold, CXP1",
            "PREFETCH cold, CXP1",
        ] {
            let node = Node::start(&data_dir, capacity, dram, device, a).await?;
            let mut r = batch_phase(&node, size, n, what).await?;
            r.of_device = Some(r.gb_per_s / dev_r.gb_per_s);
            eprintln!(
                "  {what}: {:.3} GB/s ({:.0} % of the device's read)",
                r.gb_per_s,
                r.of_device.unwrap_or(0.0) * 100.0
            );
            got.push(r);
            node.stop()?;
        }
        eprintln!(
            "  PREFETCH = {:.0} % of cold batch GET over CXP1, {:.0} % of cold batch GET over HTTP",
            got[2].gb_per_s / got[1].gb_per_s * 100.0,
            got[2].gb_per_s / got[0].gb_per_s * 100.0
        );
        let _ = std::fs::remove_dir_all(&data_dir);
        rows.push(dev_r);
        rows.extend(got);
    }
    // MATCH: a chain of 1,000 small blocks, asked 2,000 times, one request at a time.
    let data_dir = a.dir.join("node-match");
    let _ = std::fs::remove_dir_all(&data_dir);
    let node = Node::start(&data_dir, 1 << 30, 16 << 20, device, a).await?;
    let addr = node.transfer.clone().context("no transfer listener")?;
    let tc = TransferClient::connect_with(&addr, &node.how).await?;
    let chain: Vec<Bytes> = (0..1000u64)
        .map(|i| Bytes::from(format!("chain-{i:04}").into_bytes()))
        .collect();
    for part in chain.chunks(100) {
        let blocks: Vec<(Bytes, Bytes)> =
            part.iter().map(|k| (k.clone(), block(1, 4096))).collect();
        tc.put("default", &blocks, ctxpod_wire::proto::Durability::Durable)
            .await?;
    }
    let raw: Vec<Vec<u8>> = chain.iter().map(|k| k.to_vec()).collect();
    for over in ["CXP1", "HTTP"] {
        let mut lat = Vec::with_capacity(2000);
        let t = Instant::now();
        for _ in 0..2000 {
            let t = Instant::now();
            let m = if over == "CXP1" {
                tc.match_prefix("default", &chain).await? as u64
            } else {
                node.client.match_prefix("default", &raw).await?
            };
            ensure!(m == 1000, "MATCH found {m} of 1000");
            lat.push(t.elapsed());
        }
        let r = row(
            &format!("MATCH 1000-key chain, {over}"),
            0,
            0,
            t.elapsed(),
            lat,
        );
        eprintln!(
            "  MATCH over {over}: p50 {:.3} ms, p99 {:.3} ms",
            r.p50_ms, r.p99_ms
        );
        rows.push(r);
    }
    node.stop()?;
    let _ = std::fs::remove_dir_all(&data_dir);
    Ok(())
}

/// Reads blocks `0..n` of `size` back in batches (HTTP batch GET, CXP1 GET, or CXP1
/// PREFETCH into regions), 4 connections with 2 batches in flight on each, every block
/// checked.
pub(crate) async fn batch_phase(
    node: &Node,
    size: usize,
    n: u64,
    what: &str,
) -> anyhow::Result<Row> {
    use ctxpod_client::region::Region;
    use ctxpod_client::transfer_client::{BlockState, PrefetchOptions};
    use ctxpod_wire::proto::PrefetchEntry;
    const CONNS: u64 = 4;
    const DEPTH: usize = 2;
    let batch = batch_of(size) as u64;
    let addr = node.transfer.clone().context("no transfer listener")?;
    let pool: Vec<Bytes> = (0..POOL).map(|i| block(i, size)).collect();
    let cpu0 = CpuMark::now(node);
    let batches = n.div_ceil(batch);
    let t = Instant::now();
    let lanes = (0..CONNS).map(|lane| {
        let (pool, addr, http) = (&pool, addr.clone(), node.client.clone());
        let how = node.how.clone();
        async move {
            let tc = TransferClient::connect_with(&addr, &how).await?;
            let region = Region::new(DEPTH * batch as usize * size)?;
            tc.register_region(&region).await?;
            let (tc, region, http) = (&tc, &region, &http);
            let jobs = (lane..batches).step_by(CONNS as usize).enumerate();
            let mut s = futures::stream::iter(jobs.map(|(j, b)| async move {
                let ids: Vec<u64> = (b * batch..((b + 1) * batch).min(n)).collect();
                let keys: Vec<Bytes> = ids.iter().map(|&i| Bytes::from(key(size, i))).collect();
                let want = |i: u64| &pool[(i % POOL) as usize][..];
                let t = Instant::now();
                if what.ends_with("HTTP") {
                    let raw: Vec<Vec<u8>> = keys.iter().map(|k| k.to_vec()).collect();
                    for ((_, got), &i) in http.batch_get("default", &raw).await?.iter().zip(&ids) {
                        ensure!(got.as_deref() == Some(want(i)), "block {i} came back wrong");
                    }
                } else if what.starts_with("batch") {
                    for (got, &i) in tc.get("default", &keys).await?.iter().zip(&ids) {
                        ensure!(got.as_deref() == Some(want(i)), "block {i} came back wrong");
                    }
                } else {
                    // Slot j % DEPTH of the region: the ordered stream below starts batch
                    // j + DEPTH only after batch j has been yielded (its ticket dropped).
                    let base = ((j % DEPTH) * batch as usize * size) as u64;
                    let entries = keys
                        .iter()
                        .enumerate()
                        .map(|(e, k)| PrefetchEntry {
                            key: k.clone(),
                            offset: base + (e * size) as u64,
                            max_len: size as u32,
                        })
                        .collect();
                    let ticket = tc
                        .prefetch("default", region, entries, PrefetchOptions::default())
                        .await?;
                    let p = ticket.wait().await;
                    for (e, &i) in ids.iter().enumerate() {
                        ensure!(
                            p.blocks[e] == BlockState::Landed { len: size as u32 }
                                && ticket.data(e) == Some(want(i)),
                            "block {i}: {:?}",
                            p.blocks[e]
                        );
                    }
                }
                anyhow::Ok(t.elapsed())
            }))
            .buffered(DEPTH);
            let mut lat = Vec::new();
            while let Some(r) = s.next().await {
                lat.push(r?);
            }
            anyhow::Ok(lat)
        }
    });
    let mut lat = Vec::new();
    for l in futures::future::join_all(lanes).await {
        lat.extend(l?);
    }
    let mut r = row(what, size as u64, n * size as u64, t.elapsed(), lat);
    cpu0.per_gib(node, n * size as u64, &mut r);
    Ok(r)
}

/// Buffers that GETs of large values land in: one per request in flight, each read into
/// over and over (an engine's pool of KV memory, allocated before it serves); a fresh
/// buffer for every value would cost the client a zeroed page every 4 KiB.
#[derive(Default)]
pub(crate) struct Buffers(std::sync::Mutex<Vec<Vec<u8>>>);

impl Buffers {
    /// `n` buffers of `size` bytes, each page touched (made before a phase is timed, as an
    /// engine allocates its pool before it serves).
    pub(crate) fn of(n: usize, size: usize) -> Buffers {
        Buffers(std::sync::Mutex::new(vec![vec![1u8; size]; n]))
    }

    /// Reads `key` into a buffer of the pool (over CXP1 when `tc` is given, else HTTP):
    /// whether it came back as `want` (`None`: it did not come back at all).
    pub(crate) async fn get_into(
        &self,
        http: &Client,
        tc: Option<&TransferClient>,
        key: &[u8],
        want: &[u8],
    ) -> anyhow::Result<Option<bool>> {
        let buf = self.0.lock().expect("buffers").pop().unwrap_or_default();
        let (buf, len) = match tc {
            Some(tc) => {
                let key = Bytes::copy_from_slice(key);
                tc.get_value_into("default", &key, None, buf).await?
            }
            None => http.get_into("default", key, buf).await?,
        };
        let same = len.map(|n| &buf[..n] == want);
        self.0.lock().expect("buffers").push(buf);
        Ok(same)
    }
}
