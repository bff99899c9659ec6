//! Opening a node: format on first start, otherwise check and recover.
//!
//! Recovery after any crash:
//! 1. the device superblock must match the geometry in the index (a swapped or recreated
//!    device file is refused, not silently served);
//! 2. every index entry must point inside a region in use and below its write pointer;
//!    entries that do not are dropped (counted);
//! 3. records past the open region's checkpointed write pointer are re-indexed while they
//!    check out (put entries are written without the WAL: the device is their log); the
//!    first one that does not ends the region's contents, and the next writes overwrite
//!    what lies beyond;
//! 4. the nonce counter resumes above its last persisted reservation.

use super::dram::S3Fifo;
use super::index::{self, BlockLoc, Geometry, Index, NsMeta, RegionMeta, RegionState};
use super::leases::{Leases, ReadBits};
use super::{Core, Counters, Namespace, SeqAlloc, SEQ_CHUNK};
use crate::crypto::{self, AeadKey};
use crate::device::{self, AlignedBuf, Device, IO_ALIGN_BYTES};
use crate::metrics::Metrics;
use crate::offload::OffloadEngine;
use anyhow::{ensure, Context};
use ctxpod_format::config::Config;
use ctxpod_format::record::{self, RecordHeader};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

mod format;
mod kek;
mod tail;
use format::{check_superblock, geometry_for, write_superblock, zero_fill};
use kek::load_or_create_kek;
pub(super) use kek::{read_kek, rewrap_deks};
use tail::{recover_open_tail, TailScan};

/// 2: region metadata carries the tail epoch.
pub const FORMAT_VERSION: u32 = 2;
/// Bytes before region 0: the device superblock lives in the first 4 KiB.
pub const DATA_OFFSET_BYTES: u64 = 1 << 20;
/// Bits of the "recently read" table (512 KiB of memory).
const READ_BITS: usize = 1 << 22;

/// Opens the node on the configured device (or tiers), or on `devices` when given, one per
/// tier (simulated devices the caller keeps, in the reliability suites).
pub(super) async fn open(
    cfg: Config,
    metrics: Arc<Metrics>,
    devices: Option<Vec<Arc<dyn Device>>>,
) -> anyhow::Result<Core> {
    std::fs::create_dir_all(&cfg.data_dir)
        .with_context(|| format!("create data dir {}", cfg.data_dir.display()))?;
    let kek_bytes = load_or_create_kek(&cfg.kek_path())?;
    let kek = AeadKey::new(&kek_bytes);
    // A rotation of the KEK file that the node did not finish (the file was replaced while
    // the node was down, or it stopped mid-way): data keys still wrapped by the previous KEK
    // are unwrapped with `kek_previous_file` and re-wrapped under the current one.
    let previous = match &cfg.kek_previous_file {
        Some(p) => Some(AeadKey::new(&*read_kek(p)?)),
        None => None,
    };
    let index = Index::open(&cfg.index_path(), cfg.index_preallocate)?;
    let rewrapped = rewrap_deks(&index, &kek, previous.as_ref())?;
    if rewrapped > 0 {
        tracing::info!(
            rewrapped,
            "data keys re-wrapped under the current key-encryption key"
        );
    }
    let wanted = geometry_for(&cfg)?;
    let stored = stored_geometry(&index)?;
    if let Some(g) = &stored {
        check_unchanged(g, &wanted, devices.is_some(), &cfg)?;
    }
    let devices = devices_for(devices, &cfg, &wanted)?;
    let geometry = format_or_check(&devices, &cfg, &index, stored, wanted).await?;
    let device: Arc<dyn Device> = if geometry.tiers.is_empty() {
        devices.into_iter().next().context("one device")?
    } else {
        Arc::new(device::tiered::TieredDevice::new(devices, &geometry))
    };
    announce_device(&metrics, &*device, &geometry);

    let namespaces = load_namespaces(&index, &kek)?;
    let counters = Counters::default();
    // The node's sequence (nonces, region epochs) resumes above everything an earlier life
    // may have handed out; its first number goes to the open region's tail.
    let reserved = seq_reserved(&index)?;
    let next_reserved = reserved + SEQ_CHUNK;
    let mut regions = load_regions(&index, &geometry)?;
    let scan =
        recover_open_tail(&*device, &index, &geometry, &mut regions, &namespaces, None).await?;
    count_tail_scan(&counters, &metrics, &scan);
    // One synced batch: the new reservation, and a fresh tail epoch for every open region,
    // so that records an earlier life left past the tail are never scanned as this life's.
    let mut wb = rocksdb::WriteBatch::default();
    wb.put(index::META_SEQ_RESERVED, next_reserved.to_le_bytes());
    fresh_tail_epochs(&index, &mut regions, reserved, wb)?;
    reconcile_blocks(&index, &geometry, &regions, &namespaces, &counters)?;

    let by_name: HashMap<String, Arc<Namespace>> = namespaces
        .values()
        .map(|n| (n.name.clone(), n.clone()))
        .collect();
    let tier_io = tier_io_counters(&geometry, &metrics);
    let heat = heat_sketch(&geometry);
    Ok(Core {
        dram: Mutex::new(S3Fifo::new(cfg.dram.0 as usize)),
        dram_invalidations: AtomicU64::new(0),
        nonce_salt: rand::random(),
        leases: Leases::new(cfg.leases_max, cfg.leased_bytes_max()),
        // Bounded whatever the rate: past `mrc_keys_max` keys the rate is lowered.
        mrc: (cfg.mrc_sample_rate > 0.0).then(|| {
            Mutex::new(ctxpod_plan::mrc::Mrc::sampled(
                cfg.mrc_sample_rate,
                Some(cfg.mrc_keys_max),
            ))
        }),
        mrc_ref_bytes: AtomicU64::new(0),
        started: std::time::Instant::now(),
        events: super::events::Events::new(cfg.event_queues_max),
        presence: Default::default(),
        read_bits: ReadBits::new(READ_BITS),
        seq: SeqAlloc {
            next: AtomicU64::new(reserved + 1),
            reserved: Mutex::new(next_reserved),
            reserved_fast: AtomicU64::new(next_reserved),
        },
        offload: OffloadEngine::new(
            cfg.offload_threads,
            cfg.offload_queue_depth,
            if cfg.offload_inline {
                crate::offload::Inline::All
            } else {
                crate::offload::Inline::Below(cfg.offload_inline_max_bytes.0 as usize)
            },
        ),
        namespaces: RwLock::new(by_name),
        ns_by_id: RwLock::new(namespaces),
        geometry,
        device,
        index,
        kek: parking_lot::RwLock::new(Arc::new(kek)),
        kek_fingerprint: parking_lot::Mutex::new(crypto::fingerprint(&kek_bytes)),
        metrics,
        counters,
        failed: AtomicBool::new(false),
        pod_quota: std::sync::OnceLock::new(),
        serve_gate: std::sync::OnceLock::new(),
        no_space: Mutex::new(None),
        unsynced: AtomicBool::new(false),
        promote_hints: Mutex::new(std::collections::VecDeque::new()),
        promote_wake: tokio::sync::Notify::new(),
        heat,
        tier_io,
        cfg,
    })
}

/// The frequency sketch of a node of two tiers: a counter per 256 KiB of the node (a KV
/// block's order of size), 4K to 1M per row: 4 rows of 4 bits, 8 KiB to 2 MiB of memory.
fn heat_sketch(g: &Geometry) -> Option<Mutex<crate::heat::Sketch>> {
    (g.tier_count() > 1).then(|| {
        let width = (g.capacity_bytes >> 18).clamp(1 << 12, 1 << 20) as usize;
        Mutex::new(crate::heat::Sketch::new(width))
    })
}

/// Each tier's read and written byte counters and its hits, looked up once for the data
/// path.
fn tier_io_counters(g: &Geometry, metrics: &Metrics) -> Vec<[prometheus::IntCounter; 3]> {
    (0..g.tier_count())
        .map(|t| {
            let (name, m) = (g.tier_name(t), &metrics.tier);
            [
                m.read_bytes.with_label_values(&[name]),
                m.written_bytes.with_label_values(&[name]),
                m.hits.with_label_values(&[name]),
            ]
        })
        .collect()
}

/// The geometry the node was formatted with, as the index keeps it (`None` before the first
/// start).
fn stored_geometry(index: &Index) -> anyhow::Result<Option<Geometry>> {
    let stored: Option<Geometry> = index
        .get_meta(index::META_GEOMETRY)?
        .map(|v| serde_json::from_slice(&v))
        .transpose()
        .context("decode stored geometry")?;
    Ok(stored)
}

/// Refuses to start when the configuration no longer matches how the node was formatted
/// (`g`), or when the device of a formatted node is missing (`device_given`: the caller
/// brought one).
fn check_unchanged(
    g: &Geometry,
    wanted: &Geometry,
    device_given: bool,
    cfg: &Config,
) -> anyhow::Result<()> {
    ensure!(
        g.format_version == FORMAT_VERSION,
        "this node's data is in on-disk format {}, this ctxpod reads format {}: there is \
         no in-place upgrade, start it on a new data dir",
        g.format_version,
        FORMAT_VERSION
    );
    ensure!(
        g.capacity_bytes == wanted.capacity_bytes && g.region_bytes == wanted.region_bytes,
        "this node was formatted with capacity {} and regions of {} bytes; the \
             configuration now asks for {} and {}: resizing is not supported, use the \
             original settings or a new data dir",
        g.capacity_bytes,
        g.region_bytes,
        wanted.capacity_bytes,
        wanted.region_bytes
    );
    ensure!(
        g.plaintext_at_rest == wanted.plaintext_at_rest,
        "this node was formatted with encrypt_at_rest = {}, the configuration now says {}: \
         the mode is fixed at format time, use the original setting or a new data dir",
        !g.plaintext_at_rest,
        !wanted.plaintext_at_rest
    );
    ensure!(
        g.tiers == wanted.tiers,
        "this node was formatted with {}; the configuration now asks for {}: tiers are \
         fixed at format time, use the original settings or a new data dir",
        describe_tiers(g),
        describe_tiers(wanted)
    );
    for t in 0..g.tier_count() {
        let path = tier_path(cfg, t);
        ensure!(
            device_given || path.exists(),
            "device {} does not exist, but the index describes a formatted node: refusing \
             to start on an empty device (its superblock is missing); move the index away \
             to start afresh",
            path.display()
        );
    }
    Ok(())
}

/// "one device", or each tier's name and regions.
fn describe_tiers(g: &Geometry) -> String {
    if g.tiers.is_empty() {
        return "one device".into();
    }
    let tiers: Vec<String> = g
        .tiers
        .iter()
        .map(|t| format!("{} ({} regions)", t.name, t.regions))
        .collect();
    format!("tiers {}", tiers.join(" + "))
}

/// The device file (or simulated device's medium) of tier `t`.
fn tier_path(cfg: &Config, t: usize) -> std::path::PathBuf {
    match cfg.tiers.get(t) {
        Some(tc) => tc.device_path(&cfg.data_dir),
        None => cfg.device_path(),
    }
}

/// The devices, one per tier: `given` ones (each must hold its tier), else the configured
/// simulated device or the device file through the configured I/O engine.
fn devices_for(
    given: Option<Vec<Arc<dyn Device>>>,
    cfg: &Config,
    wanted: &Geometry,
) -> anyhow::Result<Vec<Arc<dyn Device>>> {
    let n = wanted.tier_count();
    if let Some(ds) = given {
        ensure!(
            ds.len() == n,
            "{} devices given for a node of {n} tiers",
            ds.len()
        );
        for (t, d) in ds.iter().enumerate() {
            let need = format::tier_bytes(wanted, t);
            ensure!(
                d.len() >= need,
                "device of {} bytes is smaller than the {need} bytes of {}",
                d.len(),
                wanted.tier_name(t)
            );
        }
        return Ok(ds);
    }
    (0..n)
        .map(|t| {
            let profile = match cfg.tiers.get(t) {
                Some(tc) => tc.sim_profile(),
                None => cfg.sim_profile(),
            };
            let (path, len) = (tier_path(cfg, t), format::tier_bytes(wanted, t));
            Ok::<Arc<dyn Device>, anyhow::Error>(match profile {
                Some(profile) => Arc::new(device::sim::SimBackend::open(
                    &profile,
                    &path,
                    len,
                    cfg.sim_faults.as_deref(),
                )?),
                None => device::open(&path, len, cfg.io_engine)?,
            })
        })
        .collect()
}

/// The node's geometry: the `stored` one once its superblock is checked on every tier's
/// device, or on first start `wanted`, written to the new devices (zero-filled first if
/// asked) and to the index.
async fn format_or_check(
    devices: &[Arc<dyn Device>],
    cfg: &Config,
    index: &Index,
    stored: Option<Geometry>,
    wanted: Geometry,
) -> anyhow::Result<Geometry> {
    Ok(match stored {
        Some(g) => {
            for (t, d) in devices.iter().enumerate() {
                check_superblock(&**d, &g, t).await?;
            }
            g
        }
        None => {
            for (t, d) in devices.iter().enumerate() {
                // A simulated device has no filesystem extents to convert.
                let is_file = d.sim().is_none()
                    && std::fs::metadata(tier_path(cfg, t)).is_ok_and(|m| m.is_file());
                if cfg.zero_fill && is_file {
                    zero_fill(&**d, &wanted, t).await?;
                }
                write_superblock(&**d, &wanted, t).await?;
            }
            let mut wb = rocksdb::WriteBatch::default();
            wb.put(index::META_GEOMETRY, serde_json::to_vec(&wanted)?);
            index.write(wb, index::WriteMode::Wal { sync: true })?;
            tracing::info!(
                capacity = wanted.capacity_bytes,
                region_bytes = wanted.region_bytes,
                regions = wanted.regions,
                tiers = %describe_tiers(&wanted),
                encrypt_at_rest = !wanted.plaintext_at_rest,
                "formatted a new node"
            );
            wanted
        }
    })
}

/// Logs how the device is driven (and a warning when records are stored in plaintext), and
/// sets `ctxpod_io_engine_info`.
fn announce_device(metrics: &Metrics, device: &dyn Device, g: &Geometry) {
    if g.plaintext_at_rest {
        tracing::warn!(
            "encryption at rest is OFF (formatted with encrypt_at_rest = false): block \
             records are stored as received, protected by CRC32C only"
        );
    }
    metrics
        .io_engine_info
        .with_label_values(&[
            device.info().engine,
            if device.info().direct {
                "true"
            } else {
                "false"
            },
        ])
        .set(1);
    tracing::info!(
        engine = device.info().engine,
        direct = device.info().direct,
        "device open"
    );
}

/// The sequence's last persisted reservation (0 on a new node).
fn seq_reserved(index: &Index) -> anyhow::Result<u64> {
    Ok(match index.get_meta(index::META_SEQ_RESERVED)? {
        Some(v) => u64::from_le_bytes(
            v.as_slice()
                .try_into()
                .map_err(|_| anyhow::anyhow!("bad nonce reservation in the index"))?,
        ),
        None => 0,
    })
}

/// Counts what the start-up scan of the open region's tail found.
fn count_tail_scan(counters: &Counters, metrics: &Metrics, scan: &TailScan) {
    let recovered = scan.records;
    counters
        .recovered_records
        .store(recovered, Ordering::Relaxed);
    counters
        .media_errors
        .store(scan.media_errors, Ordering::Relaxed);
    metrics
        .media_errors
        .with_label_values(&["tail_scan"])
        .inc_by(scan.media_errors);
    counters
        .integrity_errors
        .fetch_add(scan.bad_records, Ordering::Relaxed);
    metrics.integrity_errors.inc_by(scan.bad_records);
    if recovered > 0 {
        tracing::info!(
            records = recovered,
            "re-indexed records past the last checkpoint from the open region's tail"
        );
    }
    if scan.extents > 0 {
        tracing::info!(
            extents = scan.extents,
            "stepped over extents of large values never published in the open region's tail"
        );
    }
}

/// Gives every open region's tail `epoch` (a sequence number never handed out before), in
/// one synced write with `wb`.
fn fresh_tail_epochs(
    index: &Index,
    regions: &mut [RegionMeta],
    epoch: u64,
    mut wb: rocksdb::WriteBatch,
) -> anyhow::Result<()> {
    for (r, m) in regions.iter_mut().enumerate() {
        if m.state == index::RegionState::Open {
            m.tail_epoch = epoch;
            wb.put_cf(
                index.cf(index::CF_REGIONS),
                (r as u32).to_be_bytes(),
                m.encode(),
            );
        }
    }
    index
        .write(wb, index::WriteMode::Wal { sync: true })
        .context("persist tail epochs")
}

/// After the device refused writes for lack of space: what a restart's recovery does,
/// in place. Every batch handed to the committer is answered by now. The open region's
/// tail is re-indexed up to where the first failed batch began (records of failed batches
/// never become blocks), gets a fresh epoch, and the block counters are recounted from the
/// index; the writer then reloads its regions from the index.
pub(super) async fn reopen_after_no_space(
    core: &Core,
    stop_at: Option<(u32, u32)>,
) -> anyhow::Result<()> {
    let g = &core.geometry;
    let mut regions = load_regions(&core.index, g)?;
    let namespaces = core.ns_by_id.read().clone();
    let scan = recover_open_tail(
        &*core.device,
        &core.index,
        g,
        &mut regions,
        &namespaces,
        stop_at,
    )
    .await?;
    core.counters
        .media_errors
        .fetch_add(scan.media_errors, Ordering::Relaxed);
    core.metrics
        .media_errors
        .with_label_values(&["tail_scan"])
        .inc_by(scan.media_errors);
    let epoch = core.next_seq()?;
    fresh_tail_epochs(
        &core.index,
        &mut regions,
        epoch,
        rocksdb::WriteBatch::default(),
    )?;
    let c = &core.counters;
    c.blocks.store(0, Ordering::Relaxed);
    c.live_bytes.store(0, Ordering::Relaxed);
    for ns in namespaces.values() {
        ns.used_bytes.store(0, Ordering::Relaxed);
        ns.blocks.store(0, Ordering::Relaxed);
    }
    reconcile_blocks(&core.index, g, &regions, &namespaces, c)
}

fn load_namespaces(index: &Index, kek: &AeadKey) -> anyhow::Result<HashMap<u32, Arc<Namespace>>> {
    let mut out = HashMap::new();
    let cf_keys = index.cf(index::CF_KEYS);
    for item in index
        .db
        .iterator_cf(index.cf(index::CF_NAMESPACES), rocksdb::IteratorMode::Start)
    {
        let (k, v) = item?;
        let name = String::from_utf8(k.to_vec()).context("namespace name")?;
        let meta: NsMeta =
            serde_json::from_slice(&v).with_context(|| format!("namespace {name}"))?;
        let mut deks = HashMap::new();
        let lo = meta.id.to_be_bytes();
        for item in index.db.iterator_cf(
            cf_keys,
            rocksdb::IteratorMode::From(&lo, rocksdb::Direction::Forward),
        ) {
            let (kk, wrapped) = item?;
            if kk.len() != 8 || kk[..4] != lo {
                break;
            }
            let key_id = u32::from_be_bytes(kk[4..8].try_into()?);
            let dek = crypto::unwrap_dek(kek, meta.id, key_id, &wrapped).map_err(|_| {
                anyhow::anyhow!(
                    "cannot unwrap data key {key_id} of namespace {name}: the key-encryption \
                     key is not the one this node was formatted with"
                )
            })?;
            deks.insert(key_id, Arc::new(AeadKey::new(&dek)));
        }
        ensure!(
            deks.contains_key(&meta.key_id),
            "namespace {name} lacks its data key"
        );
        out.insert(meta.id, Arc::new(Namespace::new(&name, &meta, deks)));
    }
    Ok(out)
}

pub(super) fn load_regions(index: &Index, g: &Geometry) -> anyhow::Result<Vec<RegionMeta>> {
    let mut regions = vec![RegionMeta::FREE; g.regions as usize];
    for item in index
        .db
        .iterator_cf(index.cf(index::CF_REGIONS), rocksdb::IteratorMode::Start)
    {
        let (k, v) = item?;
        let r = u32::from_be_bytes(k.as_ref().try_into()?);
        ensure!(r < g.regions, "region {r} is beyond the device");
        regions[r as usize] = RegionMeta::decode(&v)?;
    }
    Ok(regions)
}

/// Counts live blocks per namespace and drops index entries that cannot be right.
fn reconcile_blocks(
    index: &Index,
    g: &Geometry,
    regions: &[RegionMeta],
    namespaces: &HashMap<u32, Arc<Namespace>>,
    counters: &Counters,
) -> anyhow::Result<()> {
    let cf = index.cf(index::CF_BLOCKS);
    let mut wb = rocksdb::WriteBatch::default();
    let mut dropped = 0u64;
    for item in index.db.iterator_cf(cf, rocksdb::IteratorMode::Start) {
        let (k, v) = item?;
        // A record is right if it lies within its region's committed bytes; a large value
        // if every one of its extents does.
        let committed = |region: u32, offset: u32, record_len: u32| {
            let Some(m) = regions.get(region as usize) else {
                return false;
            };
            let end = offset as u64 + record_len as u64;
            match m.state {
                RegionState::Free => false,
                RegionState::Open => end <= m.write_ptr as u64,
                RegionState::Sealed => end <= g.region_bytes,
            }
        };
        let ok = k.len() > 4
            && match index::Manifest::decode(&v) {
                Ok(None) => BlockLoc::decode(&v)
                    .is_ok_and(|loc| committed(loc.region, loc.offset, loc.record_len)),
                Ok(Some(m)) => m
                    .extents
                    .iter()
                    .all(|x| committed(x.region, x.offset, x.record_len)),
                Err(_) => false,
            };
        let ns = (k.len() > 4)
            .then(|| u32::from_be_bytes(k[..4].try_into().expect("4 bytes")))
            .and_then(|id| namespaces.get(&id));
        match (ok, ns) {
            (true, Some(ns)) => {
                let loc = BlockLoc::decode(&v)?;
                debug_assert!(
                    loc.extents > 0
                        || (loc.is_compressed()
                            && loc.record_len > 0
                            && (loc.record_len as usize)
                                .is_multiple_of(ctxpod_format::IO_ALIGN_BYTES))
                        || loc.record_len as usize == record::record_bytes(loc.len as usize)
                        || loc.record_len as usize
                            == record::unsegmented_record_bytes(loc.len as usize),
                    "an index entry's record length is that of its block's record"
                );
                ns.count_compressed(&loc, true);
                if let Ok(Some(m)) = index::Manifest::decode(&v) {
                    for x in &m.extents {
                        ns.count_compressed(&x.record_loc(&m.head), true);
                    }
                }
                ns.used_bytes.fetch_add(loc.len as u64, Ordering::Relaxed);
                ns.blocks.fetch_add(1, Ordering::Relaxed);
                counters
                    .live_bytes
                    .fetch_add(loc.len as u64, Ordering::Relaxed);
                counters.blocks.fetch_add(1, Ordering::Relaxed);
            }
            _ => {
                wb.delete_cf(cf, &k);
                dropped += 1;
            }
        }
    }
    if dropped > 0 {
        tracing::warn!(
            entries = dropped,
            "dropped index entries pointing outside committed regions"
        );
        index.write(wb, index::WriteMode::Wal { sync: true })?;
    }
    Ok(())
}
