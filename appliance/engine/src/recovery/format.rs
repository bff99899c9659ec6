//! The device's format: the geometry a configuration gives, the superblock in the first
//! 4 KiB (checked at every start), and the zero-fill of a new file-backed device.

use super::tail::{read_retrying, TAIL_READ_TRIES};
use super::{DATA_OFFSET_BYTES, FORMAT_VERSION};
use crate::device::{AlignedBuf, Device, IO_ALIGN_BYTES};
use crate::index::{Geometry, TierGeometry};
use anyhow::{bail, ensure, Context};
use ctxpod_format::config::Config;

const SUPERBLOCK_MAGIC: &[u8; 8] = b"CTXPODDV";

pub(super) fn geometry_for(cfg: &Config) -> anyhow::Result<Geometry> {
    let region_bytes = cfg.region_bytes();
    let capacity = cfg.capacity.0;
    // Each tier's device holds its own first MiB (its superblock) and then its regions.
    let mut tiers = Vec::new();
    let mut regions = 0u64;
    for t in &cfg.tiers {
        let n = t.capacity.0.saturating_sub(DATA_OFFSET_BYTES) / region_bytes;
        ensure!(
            n >= 4,
            "tier {} capacity {} holds {n} regions of {region_bytes} bytes; at least 4 are \
             needed (raise its capacity or lower region_bytes)",
            t.name,
            t.capacity
        );
        tiers.push(TierGeometry {
            name: t.name.clone(),
            first_region: regions as u32,
            regions: n as u32,
        });
        regions += n;
    }
    if tiers.is_empty() {
        regions = capacity.saturating_sub(DATA_OFFSET_BYTES) / region_bytes;
    }
    ensure!(
        regions >= 4,
        "capacity {} holds {regions} regions of {region_bytes} bytes; at least 4 are needed \
         (raise --capacity or lower region_bytes)",
        cfg.capacity
    );
    ensure!(regions <= u32::MAX as u64, "too many regions");
    Ok(Geometry {
        format_version: FORMAT_VERSION,
        capacity_bytes: capacity,
        region_bytes,
        data_offset: DATA_OFFSET_BYTES,
        regions: regions as u32,
        plaintext_at_rest: !cfg.encrypt_at_rest,
        tiers,
    })
}

/// The bytes of tier `t`'s device the node uses (the whole device of a node of one).
pub(super) fn tier_bytes(g: &Geometry, t: usize) -> u64 {
    let r = g.tier_regions(t);
    g.data_offset + (r.end - r.start) as u64 * g.region_bytes
}

/// Writes zeros over the regions of a new file-backed device. A preallocated file's extents
/// are "unwritten" until first written, so every flush after a first write would also have
/// to commit filesystem metadata; written once, later flushes are the device's alone
/// (PostgreSQL zero-fills WAL segments for the same reason). Progress is logged.
pub(super) async fn zero_fill(dev: &dyn Device, g: &Geometry, t: usize) -> anyhow::Result<()> {
    use futures::StreamExt;
    const CHUNK_BYTES: u64 = 8 << 20;
    let end = tier_bytes(g, t);
    let chunks: Vec<u64> = (g.data_offset..end).step_by(CHUNK_BYTES as usize).collect();
    let total = chunks.len();
    tracing::info!(
        bytes = end - g.data_offset,
        "zero-filling the new device file"
    );
    let started = std::time::Instant::now();
    let mut writes = futures::stream::iter(chunks.into_iter().map(|off| {
        let n = CHUNK_BYTES.min(end - off) as usize;
        dev.write_at(AlignedBuf::zeroed(n), off)
    }))
    .buffer_unordered(8);
    let mut done = 0;
    while let Some((_, r)) = writes.next().await {
        r.context("zero-fill the device file")?;
        done += 1;
        if done * 10 / total != (done - 1) * 10 / total {
            tracing::info!(
                percent = done * 100 / total,
                "zero-filling the new device file"
            );
        }
    }
    drop(writes);
    dev.flush()
        .await
        .context("flush the zero-filled device file")?;
    tracing::info!(
        seconds = started.elapsed().as_secs_f64(),
        "device file zero-filled"
    );
    Ok(())
}

/// The superblock of tier `t`'s device: the node's geometry, and (with tiers) which tier
/// the device is, so that swapped tier devices are refused.
fn superblock_bytes(g: &Geometry, t: usize) -> anyhow::Result<AlignedBuf> {
    let mut buf = AlignedBuf::zeroed(IO_ALIGN_BYTES);
    let json = if g.tiers.is_empty() {
        serde_json::to_vec(g)?
    } else {
        let mut v = serde_json::to_value(g)?;
        v["tier"] = serde_json::Value::from(g.tier_name(t));
        serde_json::to_vec(&v)?
    };
    ensure!(json.len() + 16 <= IO_ALIGN_BYTES, "superblock too large");
    buf[..8].copy_from_slice(SUPERBLOCK_MAGIC);
    buf[8..12].copy_from_slice(&(json.len() as u32).to_le_bytes());
    buf[16..16 + json.len()].copy_from_slice(&json);
    let crc = crc32c::crc32c(&buf[..IO_ALIGN_BYTES - 4]);
    buf[IO_ALIGN_BYTES - 4..].copy_from_slice(&crc.to_le_bytes());
    Ok(buf)
}

pub(super) async fn write_superblock(
    dev: &dyn Device,
    g: &Geometry,
    t: usize,
) -> anyhow::Result<()> {
    let (_, r) = dev.write_at(superblock_bytes(g, t)?, 0).await;
    r.context("write device superblock")?;
    dev.flush().await.context("flush device superblock")?;
    Ok(())
}

pub(super) async fn check_superblock(
    dev: &dyn Device,
    g: &Geometry,
    t: usize,
) -> anyhow::Result<()> {
    let mut errors = 0;
    let Some(buf) = read_retrying(dev, IO_ALIGN_BYTES, 0, &mut errors).await else {
        bail!("the device superblock could not be read ({TAIL_READ_TRIES} tries)");
    };
    let want = superblock_bytes(g, t)?;
    if buf[..] != want[..] {
        if !g.tiers.is_empty() {
            bail!(
                "the device of tier {} does not carry this node's superblock for that tier: \
                 it is another tier's device (swapped), or was replaced, recreated or \
                 damaged; refusing to serve blocks from it",
                g.tier_name(t)
            );
        }
        bail!(
            "the device does not carry this node's superblock: it was replaced, recreated or \
             damaged; refusing to serve blocks from it (move the index away to start afresh)"
        );
    }
    Ok(())
}
