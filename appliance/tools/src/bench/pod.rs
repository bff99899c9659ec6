//! `--pod`: a pod of nodes with etcd, measured through the pod client.

use super::nodes::PodNode;
use super::*;
use ctxpod_testkit::{free_port, poll_until};

/// One row of the `--pod` benchmark.
#[derive(serde::Serialize)]
pub(crate) struct PodRow {
    pub(crate) nodes: usize,
    pub(crate) replication: usize,
    pub(crate) what: String,
    pub(crate) block: u64,
    pub(crate) blocks: u64,
    pub(crate) gb_per_s: f64,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    /// CPU seconds all nodes together spent per GiB moved (copies included).
    pub(crate) nodes_cpu_s_per_gib: f64,
    /// Blocks each node holds after the puts, and the largest over the mean.
    pub(crate) blocks_per_node: Vec<u64>,
    pub(crate) skew: f64,
}

/// `--pod`: aggregate throughput of pods of 1, 2, 3… nodes on this machine through the pod
/// client, and how evenly placement spreads the blocks.
pub(crate) async fn pod_bench(a: &BenchArgs) -> anyhow::Result<()> {
    use ctxpod_client::pod_client::PodClient;
    let size = a.sizes.first().context("--sizes")?.0 as usize;
    let n = (a.bytes.0 / size as u64).max(1);
    let total = n * size as u64;
    let mut rows = Vec::new();
    for &count in &a.pod {
        ensure!(count >= 1, "--pod counts start at 1");
        ensure!(
            a.pod_replication <= count,
            "--pod-replication {} exceeds a pod of {count}",
            a.pod_replication
        );
        let (nodes, urls) = start_pod(a, count, total).await?;
        let pc = std::sync::Arc::new(PodClient::connect(&urls, &Default::default()).await?);
        let cpu = |nodes: &[PodNode]| -> f64 {
            nodes.iter().filter_map(|n| cpu_seconds(n.child.id())).sum()
        };
        let pool: Vec<Bytes> = (0..POOL).map(|i| block(i, size)).collect();
        let mut counts = Vec::new();
        // The first read of each block comes from flash (puts do not fill the DRAM tier);
        // the second from DRAM.
        for what in [
            "PUT durable",
            "GET cold (first read)",
            "GET hot (second read)",
        ] {
            let cpu0 = cpu(&nodes);
            let t = Instant::now();
            let mut progress = Progress::new(&format!("pod of {count}: {what}"), n);
            let mut lat = Vec::with_capacity(n as usize);
            let mut s = futures::stream::iter((0..n).map(|i| {
                let (pc, data) = (pc.clone(), pool[(i % POOL) as usize].clone());
                pod_request(pc, what, size, i, data)
            }))
            .buffer_unordered(a.concurrency);
            while let Some(r) = s.next().await {
                lat.push(r?);
                progress.step(lat.len() as u64);
            }
            progress.done();
            let elapsed = t.elapsed();
            let used = cpu(&nodes) - cpu0;
            if counts.is_empty() {
                for url in &urls {
                    counts.push(Client::new(url.clone()).stats().await?.block_count);
                }
            }
            let mean = counts.iter().sum::<u64>() as f64 / counts.len() as f64;
            let r = row(what, size as u64, total, elapsed, lat);
            rows.push(PodRow {
                nodes: count,
                replication: a.pod_replication,
                what: what.into(),
                block: size as u64,
                blocks: n,
                gb_per_s: r.gb_per_s,
                p50_ms: r.p50_ms,
                p99_ms: r.p99_ms,
                nodes_cpu_s_per_gib: used / (total as f64 / (1u64 << 30) as f64),
                blocks_per_node: counts.clone(),
                skew: counts.iter().copied().max().unwrap_or(0) as f64 / mean.max(1.0),
            });
        }
        drop(nodes);
    }
    print_pod_rows(&rows);
    if let Some(p) = &a.json {
        write_json_lines(p, &rows)?;
    }
    Ok(())
}

/// One request of a pod phase: GET block `i` of `size` bytes and check it is `data`, or PUT
/// it durably; its latency.
async fn pod_request(
    pc: std::sync::Arc<ctxpod_client::pod_client::PodClient>,
    what: &str,
    size: usize,
    i: u64,
    data: Bytes,
) -> anyhow::Result<Duration> {
    let t = Instant::now();
    let k = key(size, i);
    if what.starts_with("GET") {
        let got = pc.get("default", &k).await?;
        ensure!(
            got.as_deref() == Some(&data[..]),
            "block {i} came back wrong"
        );
    } else {
        pc.put("default", &k, data, Durability::Durable).await?;
    }
    anyhow::Ok(t.elapsed())
}

/// Tries at starting a pod: ports picked free may be taken by another process's connection
/// before a node binds them (the node then exits), so the pod starts again on other ports.
const POD_START_TRIES: usize = 5;

/// Starts a pod of `count` nodes on loopback (static membership) sized for `total` bytes of
/// blocks, and waits until every node is ready: the nodes and their HTTP URLs.
async fn start_pod(
    a: &BenchArgs,
    count: usize,
    total: u64,
) -> anyhow::Result<(Vec<PodNode>, Vec<String>)> {
    let mut last = None;
    for _ in 0..POD_START_TRIES {
        match try_start_pod(a, count, total).await {
            Ok(pod) => return Ok(pod),
            Err(e) => {
                eprintln!("the pod did not start ({e:#}); starting it again on other ports");
                last = Some(e);
            }
        }
    }
    Err(last.expect("at least one try"))
}

/// One try of [`start_pod`]: fails as soon as a node exits (its nodes are stopped).
async fn try_start_pod(
    a: &BenchArgs,
    count: usize,
    total: u64,
) -> anyhow::Result<(Vec<PodNode>, Vec<String>)> {
    // Each node holds its share of the copies, with room to spare; DRAM for all of it
    // (the GET phase reads from the DRAM tier: what the pod serves, not the disk).
    let per_node = total * a.pod_replication as u64 / count as u64;
    let capacity = (per_node * 2 + (1 << 30)).next_multiple_of(1 << 20);
    let dram = per_node + per_node / 4 + (64 << 20);
    let ports: Vec<(u16, u16)> = (0..count)
        .map(|_| Ok((free_port()?, free_port()?)))
        .collect::<anyhow::Result<_>>()?;
    let members: String = ports
        .iter()
        .enumerate()
        .map(|(i, (h, t))| {
            format!(
                "  {{ id = \"n{i}\", http = \"http://127.0.0.1:{h}\", transfer = \"127.0.0.1:{t}\", capacity = {capacity} }},\n"
            )
        })
        .collect();
    let mut nodes = Vec::new();
    for (i, (h, t)) in ports.iter().enumerate() {
        let dir = a.dir.join(format!("pod{count}-n{i}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let cfg = dir.with_extension("toml");
        std::fs::write(
            &cfg,
            format!(
                "[pod]\nnode_id = \"n{i}\"\nreplication = {}\nmembers = [\n{members}]\n",
                a.pod_replication
            ),
        )?;
        nodes.push(PodNode::spawn(dir, *h, *t, capacity, dram)?);
    }
    let urls: Vec<String> = ports
        .iter()
        .map(|(h, _)| format!("http://127.0.0.1:{h}"))
        .collect();
    for (node, url) in nodes.iter_mut().zip(&urls) {
        let c = Client::new(url.clone());
        let every = Duration::from_millis(20);
        let mut exited = None;
        let ready = poll_until(Duration::from_secs(60), every, async || {
            if let Ok(Some(status)) = node.child.try_wait() {
                exited = Some(status);
                return true;
            }
            c.ready().await
        })
        .await;
        if let Some(status) = exited {
            anyhow::bail!(
                "node {} exited at start ({status}; a port taken?)",
                node.dir.display()
            );
        }
        ensure!(ready, "node {} not ready within 60 s", node.dir.display());
    }
    Ok((nodes, urls))
}

/// Prints the `--pod` rows as a Markdown table on stdout.
fn print_pod_rows(rows: &[PodRow]) {
    println!("| nodes | R | phase | block | GB/s (aggregate) | p50 ms | p99 ms | nodes' CPU s/GiB | blocks per node | max / mean |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {} | {} | {} | {:.3} | {:.2} | {:.2} | {:.2} | {:?} | {:.3} |",
            r.nodes,
            r.replication,
            r.what,
            ByteSize(r.block),
            r.gb_per_s,
            r.p50_ms,
            r.p99_ms,
            r.nodes_cpu_s_per_gib,
            r.blocks_per_node,
            r.skew
        );
    }
}
