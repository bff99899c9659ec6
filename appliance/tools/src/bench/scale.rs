//! `--scale`: many small blocks, the index's and the process's footprint measured as they
//! grow.

use super::nodes::Node;
use super::*;
use ctxpod_testkit::{answered_busy, du, rss_bytes};

pub(crate) fn mib(bytes: f64) -> String {
    format!("{:.1} MiB", bytes / (1u64 << 20) as f64)
}

/// Bytes free on the filesystem holding `dir`.
pub(crate) fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: `statvfs` is a plain C struct of integers, for which all zeroes is valid.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and a statvfs struct to fill.
    (unsafe { libc::statvfs(c.as_ptr(), &mut st) } == 0)
        .then(|| st.f_bavail as u64 * st.f_frsize as u64)
}

/// Key `i` of a scale check: 16 bytes, spread like the hashes engines use.
pub(crate) fn scale_key(i: u64) -> Bytes {
    let mut k = Vec::with_capacity(16);
    k.extend_from_slice(&i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes());
    k.extend_from_slice(&i.to_be_bytes());
    Bytes::from(k)
}

#[derive(serde::Serialize)]
pub(crate) struct ScaleRow {
    pub(crate) blocks: u64,
    pub(crate) block_bytes: u64,
    pub(crate) load_s: f64,
    pub(crate) load_blocks_per_s: f64,
    pub(crate) get_p50_us: f64,
    pub(crate) get_p99_us: f64,
    pub(crate) get_ops_per_s: f64,
    pub(crate) rss_bytes: u64,
    /// RSS growth per million blocks from the smallest count of the run (none for it).
    pub(crate) rss_per_million_blocks: Option<f64>,
    pub(crate) index_bytes: u64,
}

/// `--scale`: op latency and throughput against the number of blocks indexed.
pub(crate) async fn scale_check(a: &BenchArgs) -> anyhow::Result<()> {
    let size = a.scale_block.0 as usize;
    ensure!(
        size > 0 && size <= ctxpod_wire::BLOCK_BYTES_MAX,
        "--scale-block must be 1 byte to 8 MiB"
    );
    let record = ctxpod_format::record::record_bytes(size) as u64;
    let mut out = Vec::new();
    for &n in &a.scale {
        // Room for every record, regions to spare, and the superblock.
        let capacity = ((n * record) / 10 * 11 + (512 << 20)).next_multiple_of(1 << 20);
        if let Some(free) = free_bytes(&a.dir) {
            ensure!(
                capacity + (2 << 30) < free,
                "{n} blocks need a {} device and {} are free under {}",
                ByteSize(capacity),
                ByteSize(free),
                a.dir.display()
            );
        }
        let data_dir = a.dir.join(format!("scale-{n}"));
        let _ = std::fs::remove_dir_all(&data_dir);
        eprintln!("scale {n}: formatting a {} node", ByteSize(capacity));
        let node = Node::start(&data_dir, capacity, 16 << 20, "file", a).await?;
        let addr = node.transfer.clone().context("no transfer listener")?;
        let mut tcs = Vec::new();
        for _ in 0..4 {
            tcs.push(std::sync::Arc::new(
                TransferClient::connect_with(&addr, &node.how).await?,
            ));
        }
        let data = block(7, size);
        let load_s = scale_load(&tcs, n, &data).await?;
        // Latency: one GET at a time of uniformly random stored keys (the DRAM tier holds
        // 16 MiB, so nearly every one is an index lookup and a device read).
        let mut pick = Pick(0x2545_F491_4F6C_DD1Du64);
        let mut lat = Vec::with_capacity(5000);
        for _ in 0..5000 {
            let i = pick.next(n);
            let t = Instant::now();
            let got = tcs[0].get("default", &[scale_key(i)]).await?;
            lat.push(t.elapsed());
            ensure!(
                got[0] == Some(data.clone()),
                "scale: block {i} came back wrong"
            );
        }
        lat.sort();
        // Throughput: `--concurrency` GETs at once.
        let gets = 20_000u64;
        let keys: Vec<u64> = (0..gets).map(|_| pick.next(n)).collect();
        let get_ops_per_s = scale_get_throughput(&tcs, keys, &data, a.concurrency).await?;
        let rss = rss_bytes(node.child.id()).unwrap_or(0);
        let row = ScaleRow {
            blocks: n,
            block_bytes: size as u64,
            load_s,
            load_blocks_per_s: n as f64 / load_s,
            get_p50_us: pct(&lat, 0.5) * 1e3,
            get_p99_us: pct(&lat, 0.99) * 1e3,
            get_ops_per_s,
            rss_bytes: rss,
            rss_per_million_blocks: out.first().filter(|f: &&ScaleRow| f.blocks < n).map(
                |f: &ScaleRow| (rss as f64 - f.rss_bytes as f64) / ((n - f.blocks) as f64 / 1e6),
            ),
            index_bytes: du(&data_dir.join("index")).unwrap_or(0),
        };
        eprintln!(
            "scale {n}: GET p50 {:.0} µs, p99 {:.0} µs, {:.0} GET/s; RSS {}",
            row.get_p50_us,
            row.get_p99_us,
            row.get_ops_per_s,
            mib(rss as f64)
        );
        out.push(row);
        drop(tcs);
        node.stop()?;
        let _ = std::fs::remove_dir_all(&data_dir);
    }
    print_scale_rows(&out, a.concurrency);
    if let Some(p) = &a.json {
        write_json_lines(p, &out)?;
    }
    Ok(())
}

/// The uniformly random block numbers a scale check reads (xorshift64, fixed seed).
struct Pick(u64);

impl Pick {
    /// The next block number below `n`.
    fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Loads blocks 0..n (each `data`) in fast batches over `tcs`, then one durable put: the
/// seconds it took.
async fn scale_load(
    tcs: &[std::sync::Arc<TransferClient>],
    n: u64,
    data: &Bytes,
) -> anyhow::Result<f64> {
    const BATCH: u64 = 256;
    let t = Instant::now();
    let mut loaded = 0u64;
    let mut next_report = n / 20;
    let mut s = futures::stream::iter((0..n.div_ceil(BATCH)).map(|b| {
        let tc = tcs[b as usize % tcs.len()].clone();
        let left: Vec<(Bytes, Bytes)> = (b * BATCH..((b + 1) * BATCH).min(n))
            .map(|i| (scale_key(i), data.clone()))
            .collect();
        put_until_taken(tc, left)
    }))
    .buffer_unordered(4);
    while let Some(r) = s.next().await {
        loaded += r?;
        if loaded >= next_report {
            eprintln!(
                "scale {n}: {loaded} blocks stored ({:.0} %, {:.0} blocks/s)",
                loaded as f64 * 100.0 / n as f64,
                loaded as f64 / t.elapsed().as_secs_f64()
            );
            next_report += n / 20;
        }
    }
    drop(s);
    // One durable put: every fast one before it is then on the device too.
    tcs[0]
        .put(
            "default",
            &[(scale_key(n), data.clone())],
            ctxpod_wire::proto::Durability::Durable,
        )
        .await?;
    Ok(t.elapsed().as_secs_f64())
}

/// Puts a batch fast, sending again the entries answered 503 (the node's write queue was
/// full) for up to 60 s: how many entries the batch had.
async fn put_until_taken(
    tc: std::sync::Arc<TransferClient>,
    mut left: Vec<(Bytes, Bytes)>,
) -> anyhow::Result<u64> {
    let count = left.len() as u64;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !left.is_empty() {
        let st = tc
            .put("default", &left, ctxpod_wire::proto::Durability::Fast)
            .await?;
        ensure!(
            st.iter().all(|&s| s == 201 || s == 200 || s == 503),
            "scale load: statuses {st:?}"
        );
        left = answered_busy(left, st);
        if !left.is_empty() {
            ensure!(
                Instant::now() < deadline,
                "scale load: the node stayed busy"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    anyhow::Ok(count)
}

/// GETs `keys` over `tcs`, `concurrency` at once, every one checked against `data`: GETs
/// per second.
async fn scale_get_throughput(
    tcs: &[std::sync::Arc<TransferClient>],
    keys: Vec<u64>,
    data: &Bytes,
    concurrency: usize,
) -> anyhow::Result<f64> {
    let gets = keys.len() as u64;
    let t = Instant::now();
    let mut s = futures::stream::iter(keys.into_iter().enumerate().map(|(j, i)| {
        let tc = tcs[j % tcs.len()].clone();
        let data = data.clone();
        async move {
            let got = tc.get("default", &[scale_key(i)]).await?;
            ensure!(got[0] == Some(data), "scale: block {i} came back wrong");
            anyhow::Ok(())
        }
    }))
    .buffer_unordered(concurrency);
    while let Some(r) = s.next().await {
        r?;
    }
    drop(s);
    Ok(gets as f64 / t.elapsed().as_secs_f64())
}

/// Prints the scale rows as a Markdown table on stdout, and the p50 growth over the run.
fn print_scale_rows(out: &[ScaleRow], concurrency: usize) {
    println!("| blocks indexed | block | load blocks/s | GET p50 µs (1 at a time) | GET p99 µs | GET/s (concurrency {}) | node RSS | RSS growth per 1M blocks | index on disk |", concurrency);
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in out {
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {} | {} | {} |",
            r.blocks,
            ByteSize(r.block_bytes),
            r.load_blocks_per_s,
            r.get_p50_us,
            r.get_p99_us,
            r.get_ops_per_s,
            mib(r.rss_bytes as f64),
            r.rss_per_million_blocks.map_or(String::new(), mib),
            mib(r.index_bytes as f64)
        );
    }
    if let (Some(first), Some(last)) = (out.first(), out.last()) {
        if out.len() > 1 {
            println!(
                "\nGET p50 at {} blocks = {:.2}× the figure at {} blocks",
                last.blocks,
                last.get_p50_us / first.get_p50_us,
                first.blocks
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_sizes_parse_with_units_or_the_model_preset() {
        assert_eq!(parse_block_size("llama3-8b").unwrap().0, 2 << 20);
        assert_eq!(parse_block_size("64KiB").unwrap().0, 64 << 10);
        assert!(parse_block_size("llama3").is_err());
    }

    #[test]
    fn counts_parse_with_suffixes_and_refuse_the_rest() {
        assert_eq!(parse_count("10K"), Ok(10_000));
        assert_eq!(parse_count("1m"), Ok(1_000_000));
        assert_eq!(parse_count("2500"), Ok(2500));
        for bad in ["", "K", "0", "-1", "1G", "1.5M", "99999999999999999999M"] {
            assert!(parse_count(bad).is_err(), "{bad:?}");
        }
    }
}
