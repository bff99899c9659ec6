//! Client memory regions: page-aligned host memory into which a node PUSHes prefetched
//! blocks (the shape of an RDMA-registered buffer; a CUDA build could pin it with
//! `cudaHostRegister` for the last copy to HBM).
//!
//! Soundness: the connection's reader writes into a region only inside ranges reserved by a
//! live prefetch ticket, and only into entries that have not landed yet; a landed entry's
//! bytes are never written again while its ticket lives, and a ticket's ranges stay reserved
//! until both the node has finished the ticket and the caller has dropped it. Two tickets
//! cannot reserve overlapping ranges. So the slices handed out for landed blocks are never
//! written while borrowed.

use std::alloc::Layout;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// Alignment of region memory (a page; also what O_DIRECT and DMA engines want).
pub const REGION_ALIGN: usize = 4096;

static NEXT_REGION_ID: AtomicU32 = AtomicU32::new(1);

/// Host memory a node may push blocks into. Cheap to clone (shared).
#[derive(Clone)]
pub struct Region {
    pub(crate) inner: Arc<RegionInner>,
}

pub(crate) struct RegionInner {
    ptr: *mut u8,
    len: usize,
    id: u32,
    /// Reserved ranges: start → end.
    reserved: parking_lot::Mutex<BTreeMap<u64, u64>>,
}

// SAFETY: the memory is owned by the region and only reached through raw pointers under
// the reservation discipline described in the module documentation.
unsafe impl Send for RegionInner {}
// SAFETY: as for `Send`: shared use reaches the memory only through disjoint reserved
// ranges (the reservation table is behind its mutex).
unsafe impl Sync for RegionInner {}

impl Drop for RegionInner {
    fn drop(&mut self) {
        // SAFETY: allocated in `Region::new` with this layout.
        unsafe {
            std::alloc::dealloc(
                self.ptr,
                Layout::from_size_align(self.len, REGION_ALIGN).expect("checked at allocation"),
            )
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RegionError {
    #[error("a region must be 1 byte .. 1 TiB, not {0}")]
    BadSize(usize),
    #[error("the allocation of {0} bytes failed")]
    NoMemory(usize),
    #[error("{len} bytes at offset {offset} do not fit the region of {region} bytes")]
    OutOfBounds { offset: u64, len: u64, region: u64 },
    #[error("{len} bytes at offset {offset} overlap a range a live prefetch has reserved")]
    Overlap { offset: u64, len: u64 },
}

impl Region {
    /// Allocates `bytes` of zeroed, page-aligned memory (untouched pages cost nothing until
    /// written).
    pub fn new(bytes: usize) -> Result<Region, RegionError> {
        if bytes == 0 || bytes > 1 << 40 {
            return Err(RegionError::BadSize(bytes));
        }
        let layout = Layout::from_size_align(bytes, REGION_ALIGN)
            .map_err(|_| RegionError::BadSize(bytes))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(RegionError::NoMemory(bytes));
        }
        Ok(Region {
            inner: Arc::new(RegionInner {
                ptr,
                len: bytes,
                id: NEXT_REGION_ID.fetch_add(1, Ordering::Relaxed),
                reserved: parking_lot::Mutex::new(BTreeMap::new()),
            }),
        })
    }

    pub fn id(&self) -> u32 {
        self.inner.id
    }

    pub fn len(&self) -> usize {
        self.inner.len
    }

    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// The region's first byte, for a DMA engine or `cudaMemcpyAsync`. Bytes of a block
    /// are valid to read once its ticket reports it landed.
    pub fn as_ptr(&self) -> *const u8 {
        self.inner.ptr
    }
}

impl RegionInner {
    /// Reserves every `(offset, len)` range, all or none.
    pub(crate) fn reserve(&self, ranges: &[(u64, u64)]) -> Result<(), RegionError> {
        let mut r = self.reserved.lock();
        let mut added: Vec<u64> = Vec::with_capacity(ranges.len());
        let undo = |r: &mut BTreeMap<u64, u64>, added: &[u64]| {
            for s in added {
                r.remove(s);
            }
        };
        for &(offset, len) in ranges {
            let end = offset.checked_add(len).filter(|&e| e <= self.len as u64);
            let Some(end) = end else {
                undo(&mut r, &added);
                return Err(RegionError::OutOfBounds {
                    offset,
                    len,
                    region: self.len as u64,
                });
            };
            if len == 0 {
                continue;
            }
            let before = r
                .range(..=offset)
                .next_back()
                .is_some_and(|(_, &e)| e > offset);
            let after = r.range(offset..end).next().is_some();
            if before || after {
                undo(&mut r, &added);
                return Err(RegionError::Overlap { offset, len });
            }
            r.insert(offset, end);
            added.push(offset);
        }
        Ok(())
    }

    pub(crate) fn unreserve(&self, ranges: &[(u64, u64)]) {
        let mut r = self.reserved.lock();
        for &(offset, len) in ranges {
            if len > 0 {
                r.remove(&offset);
            }
        }
    }

    /// The bytes of a reserved range.
    ///
    /// # Safety
    /// The range must be reserved by a live ticket and not borrowed elsewhere while the
    /// returned slice is used (the reader writes only entries that have not landed).
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice_mut(&self, offset: u64, len: usize) -> &mut [u8] {
        debug_assert!(offset as usize + len <= self.len);
        std::slice::from_raw_parts_mut(self.ptr.add(offset as usize), len)
    }

    /// # Safety
    /// The range must hold a landed block of a live ticket.
    pub(crate) unsafe fn slice(&self, offset: u64, len: usize) -> &[u8] {
        debug_assert!(offset as usize + len <= self.len);
        std::slice::from_raw_parts(self.ptr.add(offset as usize), len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_never_overlap_and_are_all_or_none() {
        let r = Region::new(1 << 20).expect("alloc");
        assert_eq!(r.as_ptr() as usize % REGION_ALIGN, 0);
        let i = &r.inner;
        i.reserve(&[(0, 100), (100, 100)]).expect("disjoint");
        assert_eq!(
            i.reserve(&[(300, 10), (150, 10)]),
            Err(RegionError::Overlap {
                offset: 150,
                len: 10
            })
        );
        i.reserve(&[(300, 10)])
            .expect("the failed call reserved nothing");
        assert!(i.reserve(&[(50, 10)]).is_err(), "inside a range");
        assert!(i.reserve(&[(199, 2)]).is_err(), "straddles an end");
        assert!(i.reserve(&[(305, 100)]).is_err(), "straddles a start");
        assert!(matches!(
            i.reserve(&[((1 << 20) - 1, 2)]),
            Err(RegionError::OutOfBounds { .. })
        ));
        assert!(matches!(
            i.reserve(&[(u64::MAX, 2)]),
            Err(RegionError::OutOfBounds { .. })
        ));
        i.unreserve(&[(0, 100), (100, 100)]);
        i.reserve(&[(50, 100)]).expect("free again");
        assert_eq!(Region::new(0).err(), Some(RegionError::BadSize(0)));
    }
}
