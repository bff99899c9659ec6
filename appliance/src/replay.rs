//! `ctxpod replay`: a request trace (Mooncake JSONL) replayed against a running node or pod,
//! the way an inference engine uses a context tier. For each request, in trace order:
//!
//! 1. MATCH the chain of its block keys (hash id → 8-byte big-endian key);
//! 2. GET the matched prefix (`batch/get`), each block checked against the bytes its hash
//!    id derives;
//! 3. PUT the rest (`batch/put`): blocks of `--block-bytes`, or of the model's KV size
//!    times the tokens per block, their bytes derived from the hash id.
//!
//! Reported: prefix hit ratio (blocks; the measure `ctxpod_plan::lru` simulates), prefill
//! tokens saved, bytes read and written, MATCH / GET / PUT latency percentiles, and from
//! the node's statistics the write amplification and the drive writes the replay cost.
//! Requests go one at a time by default (so the node sees the trace's order); `--speed`
//! keeps the trace's timing scaled, 0 replays as fast as possible.

use bytes::Bytes;
use ctxpod_api::client::Client;
use ctxpod_api::Durability;
use ctxpod_plan::trace::Request;
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
    pub block_bytes: Option<crate::config::ByteSize>,
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
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub match_p50_ms: f64,
    pub match_p99_ms: f64,
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

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// Replays `reqs` through `client` into namespace `ns`; `progress` is called after each
/// request with (done, report so far).
pub async fn replay(
    client: &Client,
    ns: &str,
    reqs: &[Request],
    args: &ReplayArgs,
    mut progress: impl FnMut(usize, &ReplayReport),
) -> anyhow::Result<ReplayReport> {
    let block = match args.block_bytes {
        Some(b) => b.0,
        None => ctxpod_plan::model::shape(&args.model)
            .map_err(|e| anyhow::anyhow!(e))?
            .block_bytes(args.tokens_per_block),
    };
    anyhow::ensure!(
        (1..=ctxpod_api::BLOCK_BYTES_MAX as u64).contains(&block),
        "blocks of {block} bytes: a block is 1 byte to {} (use --block-bytes for a model \
         whose blocks are larger)",
        ctxpod_api::BLOCK_BYTES_MAX
    );
    let block = block as usize;
    // Entries per batch: within the batch limits of count and bytes.
    let per_batch = (ctxpod_api::BATCH_BODY_BYTES_MAX / 2 / block.max(1))
        .clamp(1, ctxpod_api::BATCH_ENTRIES_MAX);
    let dur = if args.fast {
        Durability::Fast
    } else {
        Durability::Durable
    };
    let before = client.stats().await?;
    let mut r = ReplayReport {
        block_bytes: block as u64,
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
        let mut matched = 0usize;
        for chunk in keys.chunks(ctxpod_api::MATCH_KEYS_MAX) {
            let m = client.match_prefix(ns, chunk).await? as usize;
            matched += m;
            if m < chunk.len() {
                break;
            }
        }
        t_match.push(t.elapsed().as_secs_f64() * 1e3);
        // The matched prefix, fetched and checked; a block evicted since the MATCH ends
        // the prefix there.
        let mut hits = 0usize;
        if matched > 0 {
            let t = Instant::now();
            'get: for (c, chunk) in keys[..matched].chunks(per_batch).enumerate() {
                for (j, (_, data)) in client.batch_get(ns, chunk).await?.into_iter().enumerate() {
                    let id = req.hash_ids[c * per_batch + j];
                    match data {
                        Some(d) => {
                            anyhow::ensure!(
                                d == block_bytes_of(id, block),
                                "block {id} read back with other bytes than were stored"
                            );
                            r.bytes_read += d.len() as u64;
                            hits += 1;
                        }
                        None => break 'get,
                    }
                }
            }
            t_get.push(t.elapsed().as_secs_f64() * 1e3);
        }
        if hits < keys.len() {
            let t = Instant::now();
            for (c, chunk) in req.hash_ids[hits..].chunks(per_batch).enumerate() {
                let blocks: Vec<(Vec<u8>, Bytes)> = chunk
                    .iter()
                    .map(|&h| (key_of(h), block_bytes_of(h, block)))
                    .collect();
                let st = client.batch_put(ns, &blocks, dur).await?;
                for (j, s) in st.iter().enumerate() {
                    anyhow::ensure!(
                        *s == 200 || *s == 201,
                        "put of block {} answered {s}",
                        req.hash_ids[hits + c * per_batch + j]
                    );
                }
                r.bytes_written += (blocks.len() * block) as u64;
            }
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
    r.write_amplification = if user == 0 {
        0.0
    } else {
        dev as f64 / user as f64
    };
    r.drive_writes = dev as f64 / after.capacity_bytes.max(1) as f64;
    Ok(r)
}

/// `ctxpod replay`: reads the trace, replays it with a progress line on stderr, prints the
/// report.
pub async fn run(client: &Client, ns: &str, args: &ReplayArgs) -> anyhow::Result<ReplayReport> {
    let mut reqs = ctxpod_plan::trace::read_file(&args.trace)
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.trace.display()))?;
    if let Some(n) = args.limit {
        reqs.truncate(n);
    }
    let total = reqs.len();
    let mut last = Instant::now();
    let r = replay(client, ns, &reqs, args, |done, r| {
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
            "{} requests, {} block references of {} bytes\n\
             prefix hit ratio {:.4} (blocks), {:.4} (tokens): {} prefill tokens saved of {}\n\
             read {:.1} MB, written {:.1} MB in {:.1} s\n\
             MATCH p50 {:.2} ms p99 {:.2} ms; GET p50 {:.2} ms p99 {:.2} ms; PUT p50 {:.2} ms p99 {:.2} ms\n\
             write amplification {:.3}, {:.3} drive writes",
            r.requests,
            r.block_refs,
            r.block_bytes,
            r.hit_ratio,
            r.token_hit_ratio,
            r.tokens_saved,
            r.input_tokens,
            r.bytes_read as f64 / 1e6,
            r.bytes_written as f64 / 1e6,
            r.elapsed_s,
            r.match_p50_ms,
            r.match_p99_ms,
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
}
