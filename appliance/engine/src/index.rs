//! RocksDB metadata index. Column families:
//!
//! | CF | key | value |
//! |---|---|---|
//! | `blocks` | ns_id (u32 BE) ‖ key | [`BlockLoc`] (40 bytes), or a large value's manifest (its [`BlockLoc`] head, then its [`ExtentLoc`]s) |
//! | `by_region` | region (u32 BE) ‖ offset (u32 BE) | ns_id ‖ key (the `blocks` key), one per record or extent |
//! | `regions` | region (u32 BE) | [`RegionMeta`] (16 bytes) |
//! | `namespaces` | name | [`NsMeta`] (JSON) |
//! | `keys` | ns_id (u32 BE) ‖ key_id (u32 BE) | wrapped DEK |
//! | `quarantine` | ns_id ‖ key | [`BlockLoc`] of the record that failed its checks |
//! | `default` | `geometry`, `next_ns_id`, `seq_reserved` | node metadata |
//!
//! Architecture invariant: only the writer task mutates `blocks`, `by_region` and `regions`.
//! Put entries may be written without the WAL (recovery rebuilds them from the open region's
//! tail); everything else — deletes, region transitions — is written in a synced checkpoint.

use anyhow::Context;
use ctxpod_wire::types::{Compression, NamespaceClass};
use rocksdb::{ColumnFamilyDescriptor, Options, WriteBatch, WriteOptions, DB};
use serde::{Deserialize, Serialize};
use std::path::Path;

pub const CF_BLOCKS: &str = "blocks";
pub const CF_BY_REGION: &str = "by_region";
pub const CF_REGIONS: &str = "regions";
pub const CF_NAMESPACES: &str = "namespaces";
pub const CF_KEYS: &str = "keys";
pub const CF_QUARANTINE: &str = "quarantine";
const CFS: [&str; 6] = [
    CF_BLOCKS,
    CF_BY_REGION,
    CF_REGIONS,
    CF_NAMESPACES,
    CF_KEYS,
    CF_QUARANTINE,
];

/// Memtable size of each column family.
const INDEX_MEMTABLE_BYTES: usize = 8 << 20;
/// Memtables of all column families together.
const INDEX_MEMTABLES_BYTES_MAX: usize = 32 << 20;
/// Block cache of the index (data, index and filter blocks of every column family).
const INDEX_BLOCK_CACHE_BYTES: usize = 64 << 20;

pub const META_GEOMETRY: &[u8] = b"geometry";
pub const META_NEXT_NS_ID: &[u8] = b"next_ns_id";
pub const META_SEQ_RESERVED: &[u8] = b"seq_reserved";

/// Where a block's record lives, and what it must contain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockLoc {
    pub region: u32,
    /// Byte offset of the record within its region.
    pub offset: u32,
    /// Bytes the record occupies on the device (a multiple of 4 KiB).
    pub record_len: u32,
    /// Plaintext length.
    pub len: u32,
    pub crc32c: u32,
    pub key_id: u32,
    pub seq: u64,
    /// When the block was stored (ms since the Unix epoch).
    pub stored_ms: u64,
    /// 0 for a block held in one record; for a large value, the number of its extents
    /// ([`Manifest`]). The head of a manifest says of the value as a whole: `len` and
    /// `crc32c` are the whole value's, `seq` the value's sequence number, `record_len` the
    /// device bytes of all its extents, `region`/`offset` its first extent's.
    pub extents: u32,
}

impl BlockLoc {
    /// Whether the block's record is stored compressed: a block (not a large value) whose
    /// record is shorter than any uncompressed record of its length (compression writes
    /// one only then).
    pub fn is_compressed(&self) -> bool {
        self.extents == 0
            && (self.record_len as usize)
                < ctxpod_format::record::unsegmented_record_bytes(self.len as usize)
    }
}

/// One extent of a large value: where its record lives and what it must contain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExtentLoc {
    pub region: u32,
    pub offset: u32,
    pub record_len: u32,
    pub len: u32,
    pub crc32c: u32,
    /// The extent record's own sequence number (its nonce).
    pub seq: u64,
    /// The index its record was sealed under (`record::ExtentOf::index`): its place in the
    /// value, or for a value assembled from a multipart upload's parts, part number << 16
    /// | its place in the part.
    pub index: u32,
}

impl ExtentLoc {
    pub const BYTES: usize = 32;

    /// The extent's record described as a block's entry would be (with the data key and
    /// store time of its value's `head`): what the read path checks a record against.
    pub fn record_loc(&self, head: &BlockLoc) -> BlockLoc {
        BlockLoc {
            region: self.region,
            offset: self.offset,
            record_len: self.record_len,
            len: self.len,
            crc32c: self.crc32c,
            key_id: head.key_id,
            seq: self.seq,
            stored_ms: head.stored_ms,
            extents: 0,
        }
    }
}

/// A large value in the index: its head and its extents, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    pub head: BlockLoc,
    pub extents: Vec<ExtentLoc>,
}

impl Manifest {
    /// Bytes of the count that follows the head.
    const COUNT_BYTES: usize = 4;

    pub fn encode(&self) -> Vec<u8> {
        debug_assert_eq!(self.head.extents as usize, self.extents.len());
        let mut b = Vec::with_capacity(
            BlockLoc::BYTES + Self::COUNT_BYTES + self.extents.len() * ExtentLoc::BYTES,
        );
        b.extend_from_slice(&self.head.encode());
        b.extend_from_slice(&(self.extents.len() as u32).to_le_bytes());
        for x in &self.extents {
            b.extend_from_slice(&x.region.to_le_bytes());
            b.extend_from_slice(&x.offset.to_le_bytes());
            b.extend_from_slice(&x.record_len.to_le_bytes());
            b.extend_from_slice(&x.len.to_le_bytes());
            b.extend_from_slice(&x.crc32c.to_le_bytes());
            b.extend_from_slice(&x.seq.to_le_bytes());
            b.extend_from_slice(&x.index.to_le_bytes());
        }
        b
    }

    /// A `blocks` value as a manifest (`None`: a block of one record).
    pub fn decode(b: &[u8]) -> anyhow::Result<Option<Manifest>> {
        let head = BlockLoc::decode(b)?;
        if head.extents == 0 {
            return Ok(None);
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let mut extents = Vec::with_capacity(head.extents as usize);
        let mut o = BlockLoc::BYTES + Self::COUNT_BYTES;
        for _ in 0..head.extents {
            extents.push(ExtentLoc {
                region: u32_at(o),
                offset: u32_at(o + 4),
                record_len: u32_at(o + 8),
                len: u32_at(o + 12),
                crc32c: u32_at(o + 16),
                seq: u64::from_le_bytes(b[o + 20..o + 28].try_into().expect("8 bytes")),
                index: u32_at(o + 28),
            });
            o += ExtentLoc::BYTES;
        }
        Ok(Some(Manifest { head, extents }))
    }
}

impl BlockLoc {
    pub const BYTES: usize = 40;

    pub fn encode(&self) -> [u8; Self::BYTES] {
        let mut b = [0u8; Self::BYTES];
        b[0..4].copy_from_slice(&self.region.to_le_bytes());
        b[4..8].copy_from_slice(&self.offset.to_le_bytes());
        b[8..12].copy_from_slice(&self.record_len.to_le_bytes());
        b[12..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..20].copy_from_slice(&self.crc32c.to_le_bytes());
        b[20..24].copy_from_slice(&self.key_id.to_le_bytes());
        b[24..32].copy_from_slice(&self.seq.to_le_bytes());
        b[32..40].copy_from_slice(&self.stored_ms.to_le_bytes());
        b
    }

    /// The 40-byte head of an entry (a block's whole entry, a manifest's head). The head
    /// of a manifest encodes as a block's would: [`Manifest::encode`] writes the rest.
    pub fn decode(b: &[u8]) -> anyhow::Result<BlockLoc> {
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let extents = if b.len() == Self::BYTES {
            0
        } else {
            anyhow::ensure!(
                b.len() > Self::BYTES + Manifest::COUNT_BYTES
                    && (b.len() - Self::BYTES - Manifest::COUNT_BYTES)
                        .is_multiple_of(ExtentLoc::BYTES),
                "block location of {} bytes",
                b.len()
            );
            let n = u32_at(Self::BYTES);
            anyhow::ensure!(
                n as usize * ExtentLoc::BYTES == b.len() - Self::BYTES - Manifest::COUNT_BYTES
                    && n > 0,
                "a manifest of {n} extents in {} bytes",
                b.len()
            );
            n
        };
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        Ok(BlockLoc {
            region: u32_at(0),
            offset: u32_at(4),
            record_len: u32_at(8),
            len: u32_at(12),
            crc32c: u32_at(16),
            key_id: u32_at(20),
            seq: u64_at(24),
            stored_ms: u64_at(32),
            extents,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegionState {
    Free = 0,
    Open = 1,
    Sealed = 2,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionMeta {
    pub state: RegionState,
    /// Bytes of the region written and committed (records beyond are discarded at recovery).
    pub write_ptr: u32,
    /// Order in which regions were opened: eviction takes the lowest first.
    pub open_seq: u64,
    /// Epoch stamped into the records written from the committed `write_ptr` on: `open_seq`
    /// when the region opens, a fresh sequence number at every start that finds the region
    /// open. Recovery's tail scan accepts only records of this epoch, so records left past a
    /// hole by an earlier crash (written, never acknowledged) can never be taken for new ones.
    pub tail_epoch: u64,
}

impl RegionMeta {
    pub const FREE: RegionMeta = RegionMeta {
        state: RegionState::Free,
        write_ptr: 0,
        open_seq: 0,
        tail_epoch: 0,
    };

    /// A region opened now, under `epoch`.
    pub fn opened(epoch: u64) -> RegionMeta {
        RegionMeta {
            state: RegionState::Open,
            write_ptr: 0,
            open_seq: epoch,
            tail_epoch: epoch,
        }
    }

    pub fn encode(&self) -> [u8; 24] {
        let mut b = [0u8; 24];
        b[0] = self.state as u8;
        b[4..8].copy_from_slice(&self.write_ptr.to_le_bytes());
        b[8..16].copy_from_slice(&self.open_seq.to_le_bytes());
        b[16..24].copy_from_slice(&self.tail_epoch.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> anyhow::Result<RegionMeta> {
        anyhow::ensure!(b.len() == 24, "region metadata of {} bytes", b.len());
        let state = match b[0] {
            0 => RegionState::Free,
            1 => RegionState::Open,
            2 => RegionState::Sealed,
            s => anyhow::bail!("unknown region state {s}"),
        };
        Ok(RegionMeta {
            state,
            write_ptr: u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")),
            open_seq: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
            tail_epoch: u64::from_le_bytes(b[16..24].try_into().expect("8 bytes")),
        })
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct NsMeta {
    pub id: u32,
    pub quota_bytes: Option<u64>,
    /// Generation of the namespace's current data key.
    pub key_id: u32,
    pub created_ms: u64,
    /// The node's write sequence number when `key_id` became current: every write under a
    /// key takes a fresh sequence number, so `next seq - key_seq` bounds the writes under it.
    #[serde(default)]
    pub key_seq: u64,
    /// Copies of each block in the pod (`None`: the pod's `replication`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication: Option<u32>,
    /// Which creation of the namespace in the pod this is (`pod::namespaces`); `None` for a
    /// namespace the pod never spoke of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incarnation: Option<u64>,
    /// What the namespace holds; fixed at creation (absent in indexes made before classes:
    /// `kv`).
    #[serde(default, skip_serializing_if = "NamespaceClass::is_kv")]
    pub class: NamespaceClass,
    /// How blocks are compressed as they move to the dense tier (absent: not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<Compression>,
}

/// Device layout, fixed when the node is first formatted.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Geometry {
    pub format_version: u32,
    pub capacity_bytes: u64,
    pub region_bytes: u64,
    /// Device offset of region 0 (the first bytes hold the device superblock).
    pub data_offset: u64,
    pub regions: u32,
    /// Records are stored unencrypted (`encrypt_at_rest = false` at format time). Absent
    /// from the superblocks of encrypted nodes, so theirs are unchanged.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub plaintext_at_rest: bool,
    /// The node's tiers (`fast` then `dense`), each a range of regions on its own device;
    /// empty for a node of one device (whose superblock is then unchanged).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tiers: Vec<TierGeometry>,
}

/// One tier of a node: regions `first_region..first_region + regions`, on its own device
/// (whose byte `data_offset` is the first region's first byte).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct TierGeometry {
    pub name: String,
    pub first_region: u32,
    pub regions: u32,
}

impl Geometry {
    /// How many tiers the node has (1 without `tiers`).
    pub fn tier_count(&self) -> usize {
        self.tiers.len().max(1)
    }

    /// The regions of tier `t` (all of them for a node of one device).
    pub fn tier_regions(&self, t: usize) -> std::ops::Range<u32> {
        match self.tiers.get(t) {
            Some(tg) => tg.first_region..tg.first_region + tg.regions,
            None => 0..self.regions,
        }
    }

    /// The tier that holds region `r`.
    pub fn tier_of(&self, r: u32) -> usize {
        self.tiers
            .iter()
            .rposition(|tg| tg.first_region <= r)
            .unwrap_or(0)
    }

    /// The name of tier `t` (`device` for a node of one device).
    pub fn tier_name(&self, t: usize) -> &str {
        self.tiers.get(t).map_or("device", |tg| tg.name.as_str())
    }
}

pub fn block_key(ns_id: u32, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(4 + key.len());
    k.extend_from_slice(&ns_id.to_be_bytes());
    k.extend_from_slice(key);
    k
}

pub fn by_region_key(region: u32, offset: u32) -> [u8; 8] {
    let mut k = [0u8; 8];
    k[..4].copy_from_slice(&region.to_be_bytes());
    k[4..].copy_from_slice(&offset.to_be_bytes());
    k
}

pub fn keys_key(ns_id: u32, key_id: u32) -> [u8; 8] {
    by_region_key(ns_id, key_id)
}

pub struct Index {
    pub db: DB,
}

/// How a batch reaches RocksDB.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteMode {
    /// Memtable only: lost on a crash unless flushed since. For put entries, which recovery
    /// rebuilds from the device.
    NoWal,
    /// Through the WAL, synced when `sync`.
    Wal { sync: bool },
}

impl Index {
    /// Opens (or creates) the index at `path`; `preallocate`: RocksDB preallocates its WAL
    /// and manifest files (`index_preallocate`).
    pub fn open(path: &Path, preallocate: bool) -> anyhow::Result<Index> {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        opts.set_max_background_jobs(2);
        opts.set_keep_log_file_num(4);
        opts.set_max_total_wal_size(64 << 20);
        // The index is small (about 100 bytes per block): modest memtables keep its memory
        // and its preallocated WAL (memtable size × 1.1) small next to the device.
        opts.set_db_write_buffer_size(INDEX_MEMTABLES_BYTES_MAX);
        // Closing the index must not persist what a crash would lose (put entries written
        // without the WAL): a clean stop writes a synced checkpoint first anyway, and the
        // power-loss suites drop the node in-process where a real power cut kills it.
        let mut set = "avoid_flush_during_shutdown=true".to_string();
        if !preallocate {
            set.push_str(";allow_fallocate=false");
        }
        let opts = opts
            .get_options_from_string(&set)
            .with_context(|| format!("set {set}"))?;
        // Point lookups dominate (every GET, PUT and MATCH miss asks `blocks`): a bloom
        // filter per table file spares reads of files that do not hold the key, and one block
        // cache shared by every column family bounds the data blocks kept in memory. Index and
        // filter blocks stay with the table readers: in the LRU as well, concurrent lookups
        // contended for it (docs/PERFORMANCE.md, "Scale").
        let cache = rocksdb::Cache::new_lru_cache(INDEX_BLOCK_CACHE_BYTES);
        let cfs = CFS.iter().map(|n| {
            let mut o = Options::default();
            o.set_write_buffer_size(INDEX_MEMTABLE_BYTES);
            let mut t = rocksdb::BlockBasedOptions::default();
            t.set_block_cache(&cache);
            t.set_bloom_filter(10.0, false);
            o.set_block_based_table_factory(&t);
            ColumnFamilyDescriptor::new(*n, o)
        });
        let db = DB::open_cf_descriptors(&opts, path, cfs)
            .with_context(|| format!("open RocksDB index at {}", path.display()))?;
        Ok(Index { db })
    }

    /// Removes every trace of namespace `ns_id`'s wrapped data keys from the index's files,
    /// after their deletion was written: memtables are flushed (so no WAL still holds the
    /// keys' puts and the WAL files become obsolete) and the keys' range is compacted down
    /// to the bottom level, where the tombstones drop the old values. Crypto-shred.
    pub fn purge_keys(&self, ns_id: u32) -> anyhow::Result<()> {
        let cfs: Vec<&rocksdb::ColumnFamily> = CFS.iter().map(|n| self.cf(n)).collect();
        let mut fo = rocksdb::FlushOptions::default();
        fo.set_wait(true);
        self.db
            .flush_cfs_opt(&cfs, &fo)
            .context("flush the index before purging data keys")?;
        self.db.flush_wal(true).context("flush the index WAL")?;
        let mut co = rocksdb::CompactOptions::default();
        co.set_bottommost_level_compaction(rocksdb::BottommostLevelCompaction::Force);
        let (lo, hi) = (ns_id.to_be_bytes(), (ns_id + 1).to_be_bytes());
        self.db
            .compact_range_cf_opt(self.cf(CF_KEYS), Some(&lo[..]), Some(&hi[..]), &co);
        Ok(())
    }

    pub fn cf(&self, name: &str) -> &rocksdb::ColumnFamily {
        self.db
            .cf_handle(name)
            .expect("every column family is created at open")
    }

    pub fn get_block(&self, bkey: &[u8]) -> anyhow::Result<Option<BlockLoc>> {
        match self
            .db
            .get_pinned_cf(self.cf(CF_BLOCKS), bkey)
            .context("read block index")?
        {
            Some(v) => Ok(Some(BlockLoc::decode(&v)?)),
            None => Ok(None),
        }
    }

    /// A large value's manifest (`None`: absent, or a block of one record).
    pub fn get_manifest(&self, bkey: &[u8]) -> anyhow::Result<Option<Manifest>> {
        match self
            .db
            .get_pinned_cf(self.cf(CF_BLOCKS), bkey)
            .context("read block index")?
        {
            Some(v) => Manifest::decode(&v),
            None => Ok(None),
        }
    }

    /// Looks up many block keys in one call.
    pub fn multi_get_blocks(&self, bkeys: &[Vec<u8>]) -> anyhow::Result<Vec<Option<BlockLoc>>> {
        let cf = self.cf(CF_BLOCKS);
        self.db
            .batched_multi_get_cf(cf, bkeys.iter(), false)
            .into_iter()
            .map(|r| match r.context("read block index")? {
                Some(v) => Ok(Some(BlockLoc::decode(&v)?)),
                None => Ok(None),
            })
            .collect()
    }

    pub fn get_meta(&self, key: &[u8]) -> anyhow::Result<Option<Vec<u8>>> {
        self.db.get(key).context("read index metadata")
    }

    pub fn write(&self, batch: WriteBatch, mode: WriteMode) -> anyhow::Result<()> {
        let mut wo = WriteOptions::default();
        match mode {
            WriteMode::NoWal => wo.disable_wal(true),
            WriteMode::Wal { sync } => wo.set_sync(sync),
        }
        self.db.write_opt(batch, &wo).context("write index batch")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codecs_round_trip() {
        let l = BlockLoc {
            region: 3,
            offset: 4096,
            record_len: 8192,
            len: 5000,
            crc32c: 9,
            key_id: 1,
            seq: 1 << 40,
            stored_ms: 17,
            extents: 0,
        };
        assert_eq!(BlockLoc::decode(&l.encode()).expect("decodes"), l);
        let x = |i: u32| ExtentLoc {
            region: i,
            offset: 4096 * i,
            record_len: 8192,
            len: 5000 + i,
            crc32c: i,
            seq: (1 << 40) + i as u64,
            index: i << 16 | 1,
        };
        let m = Manifest {
            head: BlockLoc { extents: 3, ..l },
            extents: vec![x(0), x(1), x(2)],
        };
        let enc = m.encode();
        assert_eq!(BlockLoc::decode(&enc).expect("head"), m.head);
        assert_eq!(Manifest::decode(&enc).expect("decodes"), Some(m));
        assert_eq!(Manifest::decode(&l.encode()).expect("a block"), None);
        assert!(BlockLoc::decode(&enc[..enc.len() - 1]).is_err());
        assert!(BlockLoc::decode(&enc[..BlockLoc::BYTES + 4]).is_err());
        let r = RegionMeta {
            state: RegionState::Sealed,
            write_ptr: 77 * 4096,
            open_seq: 5,
            tail_epoch: 9,
        };
        assert_eq!(RegionMeta::decode(&r.encode()).expect("decodes"), r);
        assert!(RegionMeta::decode(&[9; 24]).is_err());
        assert!(RegionMeta::decode(&[0; 16]).is_err());
        assert!(BlockLoc::decode(&[0; 3]).is_err());
    }
}
