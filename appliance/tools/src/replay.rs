//! `ctxpod replay`: a request trace (Mooncake JSONL) replayed against a running node or pod,
//! the way an inference engine uses a context tier. For each request, in trace order:
//!
//! 1. MATCH the chain of its block keys (hash id → 8-byte big-endian key);
//! 2. GET the matched prefix (`batch/get`), each block checked against the bytes its hash
//!    id derives; or, with `--prefetch`, have the node push it into a memory region over
//!    CXP1 (`PREFETCH`, the way an engine stages KV into host memory), checked the same;
//! 3. PUT the rest (`batch/put`): blocks of `--block-bytes`, or of the model's KV size
//!    times the tokens per block, their bytes derived from the hash id.
//!
//! A block larger than a node's block (8 MiB: a Llama-3.1-70B block of 512 tokens is
//! 160 MiB) is stored as parts of at most `--part-bytes`, the way engines split a chunk by
//! layers: part 0 under the chain key (so MATCH walks the chain as before), part k under
//! the chain key followed by k (4 bytes, big-endian). A block is a hit only when every part
//! comes back; one missing part ends the prefix there, and the block is written again.
//!
//! Reported: prefix hit ratio (blocks; the measure `ctxpod_plan::lru` simulates), prefill
//! tokens saved, bytes read and written, MATCH / GET / PUT latency percentiles, and from
//! the node's statistics the write amplification and the drive writes the replay cost.
//! Requests go one at a time by default (so the node sees the trace's order); `--speed`
//! keeps the trace's timing scaled, 0 replays as fast as possible.

use bytes::Bytes;
use ctxpod_client::client::Client;
use ctxpod_client::region::Region;
use ctxpod_client::transfer_client::{BlockState, PrefetchOptions, TransferClient};
use ctxpod_plan::trace::Request;
use ctxpod_wire::proto::PrefetchEntry;
use ctxpod_wire::Durability;
use serde::Serialize;
use std::time::{Duration, Instant};

#[derive(clap::Args, Clone, Debug)]
pub struct ReplayArgs {
    /// Trace file (Mooncake JSONL: timestamp, input_length, output_length, hash_ids).
    #[arg(long)]
    pub trace: std::path::PathBuf,
    /// Model whose KV shape sizes the blocks: a preset (llama-3.1-70b, deepseek-v3, ...)
    /// or `layers=..,kv_heads=..,head_dim=..,dtype=..`.
    #[arg(long, default_value = "llama-3.1-8b")]
    pub model: String,
    /// Tokens per block (the trace's: 512 for Mooncake's).
    #[arg(long, default_value_t = ctxpod_plan::trace::MOONCAKE_BLOCK_TOKENS)]
    pub tokens_per_block: u64,
    /// Bytes per block, instead of the model's size (small blocks replay a big trace on a
    /// small machine: the hit ratio depends on blocks, not bytes).
    #[arg(long)]
    pub block_bytes: Option<ctxpod_format::config::ByteSize>,
    /// Most bytes a stored part of a block may have (default and at most the node's block
    /// limit, 8 MiB): larger blocks are stored as several parts.
    #[arg(long)]
    pub part_bytes: Option<ctxpod_format::config::ByteSize>,
    /// Time scale: 1 keeps the trace's timing, 10 runs it ten times faster, 0 as fast as
    /// possible.
    #[arg(long, default_value_t = 0.0)]
    pub speed: f64,
    /// Replay only the first N requests.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Acknowledge puts before the flush (`fast`).
    #[arg(long)]
    pub fast: bool,
    /// Fetch hits with PREFETCH over CXP1 into a registered memory region instead of
    /// `batch/get` (one node: the one at --addr, at the transfer address it advertises).
    #[arg(long)]
    pub prefetch: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// What a replay measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ReplayReport {
    pub requests: u64,
    pub block_refs: u64,
    pub prefix_hits: u64,
    /// Prefix hits over block references.
    pub hit_ratio: f64,
    pub input_tokens: u64,
    /// Prompt tokens whose KV came from the tier instead of prefill.
    pub tokens_saved: u64,
    pub token_hit_ratio: f64,
    pub block_bytes: u64,
    /// Stored parts per block (1 when a block fits in one).
    pub parts_per_block: u64,
    /// Parts put again because the node answered 503 (busy).
    pub busy_retries: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub match_p50_ms: f64,
    pub match_p99_ms: f64,
    /// Fetching a request's hits: `batch/get`, or PREFETCH until every block landed.
    pub get_p50_ms: f64,
    pub get_p99_ms: f64,
    pub put_p50_ms: f64,
    pub put_p99_ms: f64,
    pub elapsed_s: f64,
    /// Device bytes over block bytes written during the replay (node statistics).
    pub write_amplification: f64,
    pub device_written_bytes: u64,
    /// Device bytes written over the node's capacity: full drive writes the replay cost.
    pub drive_writes: f64,
}

/// Times a part answered 503 (busy) is put again before the replay gives up (about 10 s).
const PUT_ATTEMPTS: u32 = 16;

/// The largest block a replay sizes (a 512-token block of Llama-3.1-405B is 252 MiB).
pub const BLOCK_BYTES_REPLAY_MAX: u64 = 1 << 30;

/// A block's bytes, derived from its hash id (so reads are verified).
pub fn block_bytes_of(hash_id: u64, len: usize) -> Bytes {
    let mut out = Vec::with_capacity(len + 8);
    let mut x = hash_id ^ 0x9e37_79b9_7f4a_7c15;
    while out.len() < len {
        // splitmix64
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(len);
    Bytes::from(out)
}

pub fn key_of(hash_id: u64) -> Vec<u8> {
    hash_id.to_be_bytes().to_vec()
}

/// How a block is cut into stored parts: `parts` of `part` bytes, the last one shorter.
#[derive(Clone, Copy, Debug)]
pub struct Parts {
    pub block: usize,
    pub part: usize,
    pub parts: usize,
}

impl Parts {
    pub fn new(block: usize, part_max: usize) -> Parts {
        let part = part_max.min(block).max(1);
        Parts {
            block,
            part,
            parts: block.div_ceil(part),
        }
    }

    pub fn len(&self, k: usize) -> usize {
        if k + 1 < self.parts {
            self.part
        } else {
            self.block - self.part * (self.parts - 1)
        }
    }

    /// Part `k`'s key: the chain key, then `k` for every part but the first.
    pub fn key(&self, hash_id: u64, k: usize) -> Vec<u8> {
        let mut key = key_of(hash_id);
        if k > 0 {
            key.extend_from_slice(&(k as u32).to_be_bytes());
        }
        key
    }

    /// Part `k`'s bytes, a function of the hash id and `k` (part 0: [`block_bytes_of`]).
    pub fn bytes(&self, hash_id: u64, k: usize) -> Bytes {
        let seed = hash_id ^ (k as u64).wrapping_mul(0xd1b5_4a32_d192_ed03);
        block_bytes_of(seed, self.len(k))
    }
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// The bytes of the parts `keys` of a prefix, in order, up to the first one missing: by
/// PREFETCH into the region registered on the connection when `pf` is given, else by
/// `batch/get`.
async fn fetch(
    client: &Client,
    pf: Option<&(TransferClient, Region)>,
    ns: &str,
    keys: &[Vec<u8>],
    part: usize,
) -> anyhow::Result<Vec<Bytes>> {
    let Some((t, region)) = pf else {
        let mut out = Vec::with_capacity(keys.len());
        for (_, d) in client.batch_get(ns, keys).await? {
            match d {
                Some(d) => out.push(d),
                None => break,
            }
        }
        return Ok(out);
    };
    let entries = keys
        .iter()
        .enumerate()
        .map(|(i, k)| PrefetchEntry {
            key: Bytes::copy_from_slice(k),
            offset: (i * part) as u64,
            max_len: part as u32,
        })
        .collect();
    let ticket = t
        .prefetch(ns, region, entries, PrefetchOptions::default())
        .await?;
    let p = ticket.wait().await;
    let mut out = Vec::with_capacity(keys.len());
    for (i, b) in p.blocks.iter().enumerate() {
        match b {
            BlockState::Landed { .. } => out.push(Bytes::copy_from_slice(
                ticket.data(i).expect("a landed entry has its bytes"),
            )),
            BlockState::Missed { status: 404 } => break,
            other => anyhow::bail!("prefetch of part {i}: {other:?}"),
        }
    }
    Ok(out)
}

/// Replays `reqs` through `client` into namespace `ns` (hits fetched with PREFETCH over
/// `transfer` when given); `progress` is called after each request with (done, report so
/// far).
pub async fn replay(
    client: &Client,
    transfer: Option<TransferClient>,
    ns: &str,
    reqs: &[Request],
    args: &ReplayArgs,
    mut progress: impl FnMut(usize, &ReplayReport),
) -> anyhow::Result<ReplayReport> {
    let (block, parts) = block_parts(args)?;
    // Parts per batch: within the batch limits of count and bytes.
    let per_batch = (ctxpod_wire::BATCH_BODY_BYTES_MAX / 2 / parts.part)
        .clamp(1, ctxpod_wire::BATCH_ENTRIES_MAX);
    let dur = if args.fast {
        Durability::Fast
    } else {
        Durability::Durable
    };
    // One region of a batch of parts, registered once: each prefetch lands there.
    let pf = match transfer {
        Some(t) => {
            let region = Region::new(per_batch * parts.part)?;
            t.register_region(&region).await?;
            Some((t, region))
        }
        None => None,
    };
    let rp = Replayer {
        client,
        pf,
        ns,
        parts,
        per_batch,
        dur,
    };
    let before = client.stats().await?;
    let mut r = ReplayReport {
        block_bytes: block,
        parts_per_block: parts.parts as u64,
        ..ReplayReport::default()
    };
    let (mut t_match, mut t_get, mut t_put) = (Vec::new(), Vec::new(), Vec::new());
    let start = Instant::now();
    let t0 = reqs.first().map_or(0, |r| r.timestamp);
    for (i, req) in reqs.iter().enumerate() {
        if args.speed > 0.0 {
            let due = Duration::from_secs_f64((req.timestamp - t0) as f64 / 1000.0 / args.speed);
            if let Some(wait) = due.checked_sub(start.elapsed()) {
                tokio::time::sleep(wait).await;
            }
        }
        let keys: Vec<Vec<u8>> = req.hash_ids.iter().map(|&h| key_of(h)).collect();
        let t = Instant::now();
        let matched = rp.match_len(&keys).await?;
        t_match.push(t.elapsed().as_secs_f64() * 1e3);
        let mut hits = 0usize;
        if matched > 0 {
            let t = Instant::now();
            hits = rp.fetch_prefix(&req.hash_ids, matched, &mut r).await?;
            t_get.push(t.elapsed().as_secs_f64() * 1e3);
        }
        if hits < keys.len() {
            let t = Instant::now();
            rp.put_rest(&req.hash_ids[hits..], &mut r).await?;
            t_put.push(t.elapsed().as_secs_f64() * 1e3);
        }
        r.requests += 1;
        r.block_refs += keys.len() as u64;
        r.prefix_hits += hits as u64;
        r.input_tokens += req.input_length;
        r.tokens_saved += (hits as u64 * args.tokens_per_block).min(req.input_length);
        progress(i + 1, &r);
    }
    let after = client.stats().await?;
    r.elapsed_s = start.elapsed().as_secs_f64();
    r.hit_ratio = r.prefix_hits as f64 / r.block_refs.max(1) as f64;
    r.token_hit_ratio = r.tokens_saved as f64 / r.input_tokens.max(1) as f64;
    r.match_p50_ms = percentile(&mut t_match, 0.5);
    r.match_p99_ms = percentile(&mut t_match, 0.99);
    r.get_p50_ms = percentile(&mut t_get, 0.5);
    r.get_p99_ms = percentile(&mut t_get, 0.99);
    r.put_p50_ms = percentile(&mut t_put, 0.5);
    r.put_p99_ms = percentile(&mut t_put, 0.99);
    let dev = after.device_written_bytes - before.device_written_bytes;
    let user = after.user_written_bytes - before.user_written_bytes;
    r.device_written_bytes = dev;
    r.write_amplification = ctxpod_wire::types::write_amplification(dev, user);
    r.drive_writes = dev as f64 / after.capacity_bytes.max(1) as f64;
    Ok(r)
}

/// The size of a replayed block (`--block-bytes`, or the model's) and how it is cut into
/// parts of at most `--part-bytes`, both checked against their limits.
fn block_parts(args: &ReplayArgs) -> anyhow::Result<(u64, Parts)> {
    let block = match args.block_bytes {
        Some(b) => b.0,
        None => ctxpod_plan::model::shape(&args.model)
            .map_err(|e| anyhow::anyhow!(e))?
            .block_bytes(args.tokens_per_block),
    };
    anyhow::ensure!(
        (1..=BLOCK_BYTES_REPLAY_MAX).contains(&block),
        "blocks of {block} bytes: a replayed block is 1 byte to {BLOCK_BYTES_REPLAY_MAX}"
    );
    let part_max = args
        .part_bytes
        .map_or(ctxpod_wire::BLOCK_BYTES_MAX as u64, |b| b.0);
    anyhow::ensure!(
        (1..=ctxpod_wire::BLOCK_BYTES_MAX as u64).contains(&part_max),
        "--part-bytes {part_max}: a part is 1 byte to {}",
        ctxpod_wire::BLOCK_BYTES_MAX
    );
    Ok((block, Parts::new(block as usize, part_max as usize)))
}

/// What each request of a replay is sent with: the node, the prefetch region when
/// `--prefetch`, how blocks are cut into parts and parts into batches, the durability.
struct Replayer<'a> {
    client: &'a Client,
    pf: Option<(TransferClient, Region)>,
    ns: &'a str,
    parts: Parts,
    per_batch: usize,
    dur: Durability,
}

impl Replayer<'_> {
    /// MATCH of a request's chain, in chunks of at most `MATCH_KEYS_MAX` keys: how many
    /// leading keys the node holds.
    async fn match_len(&self, keys: &[Vec<u8>]) -> anyhow::Result<usize> {
        let mut matched = 0usize;
        for chunk in keys.chunks(ctxpod_wire::MATCH_KEYS_MAX) {
            let m = self.client.match_prefix(self.ns, chunk).await? as usize;
            matched += m;
            if m < chunk.len() {
                break;
            }
        }
        Ok(matched)
    }

    /// The matched prefix, every part of each block fetched and checked; a block with a
    /// part evicted since the MATCH ends the prefix there. The blocks that came back whole.
    async fn fetch_prefix(
        &self,
        hash_ids: &[u64],
        matched: usize,
        r: &mut ReplayReport,
    ) -> anyhow::Result<usize> {
        let parts = self.parts;
        let mut hits = 0usize;
        let wanted: Vec<(usize, usize)> = (0..matched)
            .flat_map(|b| (0..parts.parts).map(move |k| (b, k)))
            .collect();
        for chunk in wanted.chunks(self.per_batch) {
            let ks: Vec<Vec<u8>> = chunk
                .iter()
                .map(|&(b, k)| parts.key(hash_ids[b], k))
                .collect();
            let got = fetch(self.client, self.pf.as_ref(), self.ns, &ks, parts.part).await?;
            let complete = got.len() == chunk.len();
            for (&(b, k), d) in chunk.iter().zip(got) {
                let id = hash_ids[b];
                anyhow::ensure!(
                    d == parts.bytes(id, k),
                    "block {id} (part {k}) read back with other bytes than were stored"
                );
                r.bytes_read += d.len() as u64;
                if k + 1 == parts.parts {
                    hits = b + 1;
                }
            }
            if !complete {
                break;
            }
        }
        Ok(hits)
    }

    /// PUTs every part of the blocks `hash_ids` (the request's misses), a batch at a time.
    async fn put_rest(&self, hash_ids: &[u64], r: &mut ReplayReport) -> anyhow::Result<()> {
        let parts = self.parts;
        let missing: Vec<(u64, usize)> = hash_ids
            .iter()
            .flat_map(|&h| (0..parts.parts).map(move |k| (h, k)))
            .collect();
        for chunk in missing.chunks(self.per_batch) {
            self.put_batch(chunk.to_vec(), r).await?;
        }
        Ok(())
    }

    /// PUTs one batch of parts (block hash id, part): a busy node (503) is asked again
    /// after a pause, as an engine would, up to [`PUT_ATTEMPTS`] times.
    async fn put_batch(
        &self,
        mut todo: Vec<(u64, usize)>,
        r: &mut ReplayReport,
    ) -> anyhow::Result<()> {
        let parts = self.parts;
        for attempt in 0.. {
            let blocks: Vec<(Vec<u8>, Bytes)> = todo
                .iter()
                .map(|&(h, k)| (parts.key(h, k), parts.bytes(h, k)))
                .collect();
            let st = self.client.batch_put(self.ns, &blocks, self.dur).await?;
            let mut busy = Vec::new();
            for (&(h, k), (s, (_, d))) in todo.iter().zip(st.iter().zip(&blocks)) {
                match *s {
                    200 | 201 => r.bytes_written += d.len() as u64,
                    503 if attempt < PUT_ATTEMPTS => busy.push((h, k)),
                    s => anyhow::bail!("put of block {h} (part {k}) answered {s}"),
                }
            }
            if busy.is_empty() {
                break;
            }
            r.busy_retries += busy.len() as u64;
            tokio::time::sleep(Duration::from_millis(50 << attempt.min(4))).await;
            todo = busy;
        }
        Ok(())
    }
}

/// `ctxpod replay`: reads the trace, replays it with a progress line on stderr, prints the
/// report. `transfer`: how to connect over CXP1 (for `--prefetch`).
pub async fn run(
    client: &Client,
    transfer: Option<ctxpod_client::connect::Connect>,
    ns: &str,
    args: &ReplayArgs,
) -> anyhow::Result<ReplayReport> {
    let mut reqs = ctxpod_plan::trace::read_file(&args.trace)
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.trace.display()))?;
    if let Some(n) = args.limit {
        reqs.truncate(n);
    }
    let total = reqs.len();
    let transfer = match &transfer {
        Some(how) if args.prefetch => {
            let c = client.cluster().await?;
            anyhow::ensure!(
                c.members.len() == 1,
                "--prefetch replays against one node; this one is in a pod of {} (replay \
                 with batch GET, which any node answers for the pod)",
                c.members.len()
            );
            let addr = c.members[0]
                .transfer
                .clone()
                .ok_or_else(|| anyhow::anyhow!("the node advertises no CXP1 address"))?;
            Some(TransferClient::connect_with(&addr, how).await?)
        }
        _ => None,
    };
    let mut last = Instant::now();
    let r = replay(client, transfer, ns, &reqs, args, |done, r| {
        if last.elapsed() >= Duration::from_secs(1) || done == total {
            last = Instant::now();
            eprint!(
                "\rreplay: {done}/{total} requests, {} blocks, prefix hit ratio {:.4}   ",
                r.block_refs,
                r.prefix_hits as f64 / r.block_refs.max(1) as f64
            );
        }
    })
    .await?;
    eprintln!();
    if args.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "{} requests, {} block references of {} bytes ({} part{} each)\n\
             prefix hit ratio {:.4} (blocks), {:.4} (tokens): {} prefill tokens saved of {}\n\
             read {:.1} MB, written {:.1} MB in {:.1} s\n\
             MATCH p50 {:.2} ms p99 {:.2} ms; {} p50 {:.2} ms p99 {:.2} ms; PUT p50 {:.2} ms p99 {:.2} ms\n\
             write amplification {:.3}, {:.3} drive writes",
            r.requests,
            r.block_refs,
            r.block_bytes,
            r.parts_per_block,
            if r.parts_per_block == 1 { "" } else { "s" },
            r.hit_ratio,
            r.token_hit_ratio,
            r.tokens_saved,
            r.input_tokens,
            r.bytes_read as f64 / 1e6,
            r.bytes_written as f64 / 1e6,
            r.elapsed_s,
            r.match_p50_ms,
            r.match_p99_ms,
            if args.prefetch { "PREFETCH" } else { "GET" },
            r.get_p50_ms,
            r.get_p99_ms,
            r.put_p50_ms,
            r.put_p99_ms,
            r.write_amplification,
            r.drive_writes
        );
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_bytes_are_a_function_of_the_hash_id() {
        assert_eq!(block_bytes_of(7, 100), block_bytes_of(7, 100));
        assert_ne!(block_bytes_of(7, 100), block_bytes_of(8, 100));
        assert_eq!(block_bytes_of(7, 13).len(), 13);
        assert_eq!(&block_bytes_of(7, 100)[..13], &block_bytes_of(7, 13)[..]);
    }

    #[test]
    fn a_big_block_is_cut_into_parts_with_their_own_keys_and_bytes() {
        // Llama-3.1-70B, 512 tokens: 160 MiB in 20 parts of 8 MiB.
        let p = Parts::new(160 << 20, 8 << 20);
        assert_eq!((p.parts, p.len(0), p.len(19)), (20, 8 << 20, 8 << 20));
        let p = Parts::new(20_000, 8192);
        assert_eq!(
            (p.parts, p.len(0), p.len(1), p.len(2)),
            (3, 8192, 8192, 3616)
        );
        assert_eq!(p.key(5, 0), 5u64.to_be_bytes());
        assert_eq!(
            p.key(5, 2),
            [&5u64.to_be_bytes()[..], &[0, 0, 0, 2]].concat()
        );
        assert_eq!(p.bytes(5, 0), block_bytes_of(5, 8192));
        assert_ne!(p.bytes(5, 1), p.bytes(5, 0));
        assert_eq!(p.bytes(5, 2).len(), 3616);
        // A block that fits is one part under the chain key.
        let one = Parts::new(16_112, 8 << 20);
        assert_eq!((one.parts, one.len(0)), (1, 16_112));
    }
}
