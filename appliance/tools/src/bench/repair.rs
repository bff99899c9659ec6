//! `--repair`: how fast a pod restores R copies after a member is lost for good.
//!
//! A pod of three nodes over a real etcd (started for the run on loopback, TLS and auth on,
//! as the pod tests start it), R = 2. `--bytes` of blocks of the first `--sizes` are put
//! durably through the pod client; then member c is killed with SIGKILL and never comes
//! back. Its lease runs out (`pod.lease_ttl_s`, 3 s here), the view changes, a and b wait out
//! `--repair-grace` and copy every block c held to the member that now ranks for it, at most
//! `--repair-rate` per node (`pod.backfill_bytes_per_s`). With two members left each must
//! hold every block; the run ends when both `block_count`s say so.
//!
//! Meanwhile a reader reads random blocks through the pod client and checks every byte: a
//! miss or a wrong byte fails the run. Printed: when c left the view, when the copies began,
//! when every block had two copies again, the bytes copied and the copy rate (copied bytes
//! over the time from the first copied byte to the last block, both nodes together).

use super::nodes::PodNode;
use super::*;
use ctxpod_client::pod_client::PodClient;
use ctxpod_testkit::etcd::EtcdServer;
use ctxpod_testkit::{free_port, metric_of, poll_until};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// The result of one `--repair` run.
#[derive(serde::Serialize)]
pub(crate) struct RepairRow {
    block: u64,
    blocks: u64,
    rate_cap_bytes_per_s: u64,
    grace_s: u64,
    /// Seconds from the kill until c was gone from a's view.
    left_view_s: f64,
    /// Seconds from the kill until the first block was copied.
    copies_began_s: f64,
    /// Seconds from the kill until a and b held every block.
    r_copies_s: f64,
    copied_bytes: u64,
    copy_gb_per_s: f64,
    /// Reads through the pod client during the repair (all byte-exact, none missed).
    reads: u64,
}

/// The pod's node configuration for member `id`.
fn repair_config(etcd: &EtcdServer, id: &str, grace_s: u64, rate: u64) -> String {
    format!(
        "[pod]\nname = \"repair-bench\"\nnode_id = \"{id}\"\n{}lease_ttl_s = 3\nreplication = 2\n\
         backfill_interval_s = 3600\nrepair_grace_s = {grace_s}\nbackfill_bytes_per_s = {rate}\n",
        etcd.pod_lines()
    )
}

/// Starts members a, b and c under `dir`, each with `capacity` bytes of flash: the nodes,
/// a client of each, and their URLs.
async fn start_members(
    dir: &Path,
    etcd: &EtcdServer,
    a: &BenchArgs,
    capacity: u64,
) -> anyhow::Result<(Vec<PodNode>, Vec<Client>, Vec<String>)> {
    let mut nodes = Vec::new();
    let mut clients = Vec::new();
    let mut urls = Vec::new();
    for id in ["a", "b", "c"] {
        let (h, t) = (free_port()?, free_port()?);
        let data = dir.join(id);
        std::fs::create_dir_all(&data)?;
        let cfg = repair_config(etcd, id, a.repair_grace, a.repair_rate.0);
        std::fs::write(data.with_extension("toml"), cfg)?;
        nodes.push(PodNode::spawn(data, h, t, capacity, 64 << 20)?);
        urls.push(format!("http://127.0.0.1:{h}"));
        let c = Client::new(format!("http://127.0.0.1:{h}"));
        let every = Duration::from_millis(50);
        ensure!(
            poll_until(Duration::from_secs(60), every, async || c.ready().await).await,
            "member {id} not ready within 60 s"
        );
        clients.push(c);
    }
    for c in &clients {
        let every = Duration::from_millis(100);
        let three = async || c.cluster().await.is_ok_and(|v| v.members.len() == 3);
        ensure!(
            poll_until(Duration::from_secs(30), every, three).await,
            "a member does not see all three within 30 s"
        );
    }
    Ok((nodes, clients, urls))
}

/// Bytes a and b have copied by backfill so far.
async fn copied(clients: &[Client]) -> anyhow::Result<f64> {
    let mut sum = 0.0;
    for c in clients {
        sum += metric_of(&c.metrics().await?, "ctxpod_backfill_copied_bytes_total");
    }
    Ok(sum)
}

/// Reads random blocks `0..n` through the pod client until `stop`, checking every byte;
/// the reads made, or the first miss or wrong block.
fn spawn_reader(
    pc: Arc<PodClient>,
    pool: Arc<Vec<Bytes>>,
    size: usize,
    n: u64,
    stop: Arc<AtomicBool>,
    reads: Arc<AtomicU64>,
) -> tokio::task::JoinHandle<anyhow::Result<()>> {
    tokio::spawn(async move {
        let mut i = 0x9e37_79b9_7f4a_7c15u64;
        while !stop.load(Ordering::Relaxed) {
            i = i.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let b = (i >> 33) % n;
            let got = pc.get("default", &key(size, b)).await?;
            ensure!(got.is_some(), "block {b} missed during the repair");
            ensure!(
                got.as_deref() == Some(&pool[(b % POOL) as usize][..]),
                "block {b} read back wrong during the repair"
            );
            reads.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    })
}

/// Kills c and follows the repair until a and b hold all `n` blocks (10 minutes at most):
/// (left the view, copies began, R copies) in seconds after the kill, and the bytes copied.
async fn follow_repair(
    c: &mut PodNode,
    clients: &[Client],
    n: u64,
) -> anyhow::Result<(f64, f64, f64, f64)> {
    let before = copied(clients).await?;
    let t0 = Instant::now();
    c.child.kill()?;
    c.child.wait()?;
    let (mut left, mut began) = (None, None);
    let deadline = t0 + Duration::from_secs(600);
    loop {
        let now = t0.elapsed().as_secs_f64();
        if left.is_none() && clients[0].cluster().await?.members.len() == 2 {
            left = Some(now);
        }
        let moved = copied(clients).await? - before;
        if began.is_none() && moved > 0.0 {
            began = Some(now);
        }
        let mut held = Vec::new();
        for c in clients {
            held.push(c.stats().await?.block_count);
        }
        if held.iter().all(|&h| h >= n) {
            let left = left.context("c never left the view")?;
            return Ok((left, began.unwrap_or(now), now, moved));
        }
        ensure!(
            Instant::now() < deadline,
            "a and b hold {held:?} of {n} blocks 10 minutes after the kill"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `--repair`: see the module's documentation.
pub(crate) async fn repair_bench(a: &BenchArgs) -> anyhow::Result<()> {
    let size = a.sizes.first().context("--sizes")?.0 as usize;
    let n = (a.bytes.0 / size as u64).max(POOL);
    let total = n * size as u64;
    let dir = a.dir.join("repair-bench");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let etcd = EtcdServer::start(&dir);
    // Two copies over three members, then every block on each of the two left.
    let capacity = (total * 2 + (1 << 30)).next_multiple_of(1 << 20);
    let (mut nodes, clients, urls) = start_members(&dir, &etcd, a, capacity).await?;
    let pc = Arc::new(PodClient::connect(&urls, &Default::default()).await?);
    let pool: Arc<Vec<Bytes>> = Arc::new((0..POOL).map(|i| block(i, size)).collect());
    let mut progress = Progress::new("repair bench: PUT durable", n);
    let mut s = futures::stream::iter((0..n).map(|i| {
        let (pc, data) = (pc.clone(), pool[(i % POOL) as usize].clone());
        async move {
            pc.put("default", &key(size, i), data, Durability::Durable)
                .await
        }
    }))
    .buffer_unordered(a.concurrency);
    let mut done = 0;
    while let Some(r) = s.next().await {
        r?;
        done += 1;
        progress.step(done);
    }
    progress.done();
    drop(s);
    let (stop, reads) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let reader = spawn_reader(pc.clone(), pool, size, n, stop.clone(), reads.clone());
    let followed = follow_repair(&mut nodes[2], &clients[..2], n).await;
    stop.store(true, Ordering::Relaxed);
    reader.await??;
    let (left, began, whole, moved) = followed?;
    let row = RepairRow {
        block: size as u64,
        blocks: n,
        rate_cap_bytes_per_s: a.repair_rate.0,
        grace_s: a.repair_grace,
        left_view_s: left,
        copies_began_s: began,
        r_copies_s: whole,
        copied_bytes: moved as u64,
        copy_gb_per_s: moved / (whole - began).max(1e-3) / 1e9,
        reads: reads.load(Ordering::Relaxed),
    };
    println!("| block | blocks | rate cap per node | grace s | left view s | copies began s | 2 copies s | copied | copy GB/s | reads meanwhile (0 missed) |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    println!(
        "| {} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {} | {:.3} | {} |",
        ByteSize(row.block),
        row.blocks,
        ByteSize(row.rate_cap_bytes_per_s),
        row.grace_s,
        row.left_view_s,
        row.copies_began_s,
        row.r_copies_s,
        ByteSize(row.copied_bytes),
        row.copy_gb_per_s,
        row.reads
    );
    if let Some(p) = &a.json {
        write_json_lines(p, std::slice::from_ref(&row))?;
    }
    drop(nodes);
    drop(etcd);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
