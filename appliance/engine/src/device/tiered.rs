//! A node's tiers as one [`Device`]: each tier is its own device, holding a range of the
//! node's regions (docs/design/0003). The engine addresses records by region as ever
//! (`Core::dev_offset`); this routes each linear offset to the tier whose regions hold it.
//! Byte `data_offset` of each tier's device is that tier's first region; the bytes before
//! it hold the tier's own superblock copy (written and checked per tier at start, never
//! through this device: the linear bytes below `data_offset` are tier 0's).
//!
//! An I/O never spans two tiers (a record never spans two regions); one that would is
//! refused (`InvalidInput`) and nothing is written.

use super::{AlignedBuf, Device, DeviceInfo, FlushFuture, IoFuture, VecIoFuture};
use crate::index::Geometry;
use std::io;
use std::sync::Arc;

pub struct TieredDevice {
    tiers: Vec<Arc<dyn Device>>,
    /// First region of each tier.
    firsts: Vec<u32>,
    /// Region count of each tier.
    counts: Vec<u32>,
    data_offset: u64,
    region_bytes: u64,
    info: DeviceInfo,
}

impl TieredDevice {
    /// The tiers of `g`, on `devices` (one per tier, in `g.tiers`' order).
    pub fn new(devices: Vec<Arc<dyn Device>>, g: &Geometry) -> TieredDevice {
        assert_eq!(devices.len(), g.tiers.len(), "one device per tier");
        let first = devices[0].info();
        let info = DeviceInfo {
            len: g.data_offset + g.regions as u64 * g.region_bytes,
            engine: first.engine,
            direct: devices.iter().all(|d| d.info().direct),
        };
        TieredDevice {
            firsts: g.tiers.iter().map(|t| t.first_region).collect(),
            counts: g.tiers.iter().map(|t| t.regions).collect(),
            tiers: devices,
            data_offset: g.data_offset,
            region_bytes: g.region_bytes,
            info,
        }
    }

    /// The tier and its device's offset for `len` bytes at linear `offset`.
    fn route(&self, offset: u64, len: u64) -> io::Result<(usize, u64)> {
        let crosses = || {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("an I/O of {len} bytes at {offset} crosses a tier boundary"),
            )
        };
        if offset < self.data_offset {
            return if offset + len <= self.data_offset {
                Ok((0, offset))
            } else {
                Err(crosses())
            };
        }
        let region = (offset - self.data_offset) / self.region_bytes;
        let t = self
            .firsts
            .iter()
            .rposition(|&f| f as u64 <= region)
            .unwrap_or(0);
        let first = self.firsts[t] as u64;
        let end_region = first + self.counts[t] as u64;
        let last = (offset + len.max(1) - 1 - self.data_offset) / self.region_bytes;
        if last >= end_region {
            return Err(crosses());
        }
        Ok((t, offset - first * self.region_bytes))
    }
}

impl TieredDevice {
    /// Where `bufs`, written from `offset`, pass from one tier into the next: the index of
    /// the first buffer of the next tier, when a buffer begins exactly there.
    fn split_at_tier(&self, bufs: &[AlignedBuf], offset: u64) -> Option<usize> {
        let mut at = offset;
        for (i, b) in bufs.iter().enumerate() {
            let boundary = self
                .firsts
                .iter()
                .any(|&f| f > 0 && at == self.data_offset + f as u64 * self.region_bytes);
            if i > 0 && boundary {
                return Some(i);
            }
            at += b.len() as u64;
        }
        None
    }
}

impl Device for TieredDevice {
    fn read_at(&self, buf: AlignedBuf, offset: u64) -> IoFuture {
        match self.route(offset, buf.len() as u64) {
            Ok((t, at)) => self.tiers[t].read_at(buf, at),
            Err(e) => Box::pin(async move { (buf, Err(e)) }),
        }
    }

    fn write_at(&self, buf: AlignedBuf, offset: u64) -> IoFuture {
        match self.route(offset, buf.len() as u64) {
            Ok((t, at)) => self.tiers[t].write_at(buf, at),
            Err(e) => Box::pin(async move { (buf, Err(e)) }),
        }
    }

    fn write_durable_at(&self, buf: AlignedBuf, offset: u64) -> IoFuture {
        match self.route(offset, buf.len() as u64) {
            Ok((t, at)) => self.tiers[t].write_durable_at(buf, at),
            Err(e) => Box::pin(async move { (buf, Err(e)) }),
        }
    }

    /// A run of records that ends one tier's last region and begins the next tier's first
    /// (the writer's runs are of back-to-back records) goes as one write to each tier.
    fn write_vectored_at(
        &self,
        mut bufs: Vec<AlignedBuf>,
        offset: u64,
        durable: bool,
    ) -> VecIoFuture {
        let len: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        if let Ok((t, at)) = self.route(offset, len) {
            return self.tiers[t].write_vectored_at(bufs, at, durable);
        }
        let Some(split) = self.split_at_tier(&bufs, offset) else {
            let e = self.route(offset, len).expect_err("refused above");
            return Box::pin(async move { (bufs, Err(e)) });
        };
        let tail = bufs.split_off(split);
        let head_len: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        let first = self.write_vectored_at(bufs, offset, durable);
        let second = self.write_vectored_at(tail, offset + head_len, durable);
        Box::pin(async move {
            let ((mut a, ra), (b, rb)) = futures::future::join(first, second).await;
            a.extend(b);
            (a, ra.and(rb))
        })
    }

    /// Every tier's device flushed (at once).
    fn flush(&self) -> FlushFuture {
        let flushes: Vec<FlushFuture> = self.tiers.iter().map(|d| d.flush()).collect();
        Box::pin(async move {
            for r in futures::future::join_all(flushes).await {
                r?;
            }
            Ok(())
        })
    }

    fn info(&self) -> DeviceInfo {
        self.info
    }

    fn tier_devices(&self) -> &[Arc<dyn Device>] {
        &self.tiers
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::TierGeometry;

    /// Each tier's regions land on its own device, at its own offsets; an I/O across the
    /// boundary is refused and writes nothing.
    #[tokio::test]
    async fn offsets_route_to_their_tier() {
        let dir = tempfile::tempdir().expect("tempdir");
        let rb = 1u64 << 20;
        let g = Geometry {
            format_version: 2,
            capacity_bytes: 8 << 20,
            region_bytes: rb,
            data_offset: 1 << 20,
            regions: 6,
            plaintext_at_rest: false,
            tiers: vec![
                TierGeometry {
                    name: "fast".into(),
                    first_region: 0,
                    regions: 2,
                },
                TierGeometry {
                    name: "dense".into(),
                    first_region: 2,
                    regions: 4,
                },
            ],
        };
        let fast = super::super::open(&dir.path().join("f"), 3 << 20, super::super::IoEngine::Sync)
            .expect("fast");
        let dense =
            super::super::open(&dir.path().join("d"), 5 << 20, super::super::IoEngine::Sync)
                .expect("dense");
        let t = TieredDevice::new(vec![fast.clone(), dense.clone()], &g);
        assert_eq!(t.len(), (1 << 20) + 6 * rb);
        let page = |v: u8| {
            let mut b = AlignedBuf::zeroed(4096);
            b.fill(v);
            b
        };
        // Region 1 (fast's second), region 2 (dense's first), region 5 (dense's last).
        for (region, v) in [(1u64, 1u8), (2, 2), (5, 5)] {
            let (_, r) = t.write_at(page(v), (1 << 20) + region * rb).await;
            r.expect("write");
        }
        t.flush().await.expect("flush");
        for (dev, at, v) in [
            (&fast, 2u64 << 20, 1u8),
            (&dense, 1 << 20, 2),
            (&dense, 4 << 20, 5),
        ] {
            let (b, r) = dev.read_at(AlignedBuf::zeroed(4096), at).await;
            r.expect("read the tier's own device");
            assert!(
                b.iter().all(|&x| x == v),
                "region's page at its tier's offset"
            );
        }
        let (_, r) = t
            .write_at(AlignedBuf::zeroed(8192), (1 << 20) + 2 * rb - 4096)
            .await;
        assert_eq!(r.expect_err("crosses").kind(), io::ErrorKind::InvalidInput);
        let (b, _) = fast.read_at(AlignedBuf::zeroed(4096), 3 * rb - 4096).await;
        assert!(b.iter().all(|&x| x == 0), "the refused write wrote nothing");
        // A run of two records, the last of fast and the first of dense, goes to both.
        let (back, r) = t
            .write_vectored_at(vec![page(7), page(8)], (1 << 20) + 2 * rb - 4096, false)
            .await;
        r.expect("a run across the tier boundary is split");
        assert_eq!(back.len(), 2, "both buffers come back");
        let (b, _) = fast.read_at(AlignedBuf::zeroed(4096), 3 * rb - 4096).await;
        assert!(b.iter().all(|&x| x == 7), "the run's head on fast");
        let (b, _) = dense.read_at(AlignedBuf::zeroed(4096), 1 << 20).await;
        assert!(b.iter().all(|&x| x == 8), "the run's tail on dense");
        let (_, r) = t
            .read_at(AlignedBuf::zeroed(4096), (1 << 20) + 6 * rb)
            .await;
        assert!(r.is_err(), "beyond the last tier");
    }
}
