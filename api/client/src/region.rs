//! Client memory regions: host memory into which a node PUSHes prefetched blocks (the shape
//! of an RDMA-registered buffer; a CUDA build could pin it with `cudaHostRegister` for the last
//! copy to HBM). A region is memory the client allocates ([`Region::new`], page-aligned and
//! zeroed), or the caller's own: a buffer it hands over ([`Region::from_vec`]), or memory it
//! keeps owning and lends for as long as the region lives ([`Region::from_raw`]: an engine's
//! pinned KV pages, a numpy array, a torch tensor), so that pushed blocks land where the
//! engine reads them, with no copy.
//!
//! Lifetime of caller memory: the region (every clone of it), each connection it is
//! registered on (until `TransferClient::unregister_region` or the connection's end) and
//! every prefetch ticket into it keep it in use; it is released, and the keep-alive given
//! with it dropped, when the last of them goes. A ticket holds the region until the node has
//! finished it and the caller has dropped it, so dropping the `Region` early never leaves the
//! reader writing into memory the caller got back.
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
    /// Who owns the memory.
    owner: Owner,
}

/// Whose memory a region is.
enum Owner {
    /// Allocated by [`Region::new`] with this layout; freed with the region.
    Allocated(Layout),
    /// The caller's: what keeps it alive, dropped with the region (after the last use).
    Caller { _keep: Box<dyn Send + Sync> },
}

// SAFETY: the memory is the region's (or lent to it for its whole life) and only reached
// through raw pointers under the reservation discipline described in the module
// documentation; the keep-alive is `Send`.
unsafe impl Send for RegionInner {}
// SAFETY: as for `Send`: shared use reaches the memory only through disjoint reserved
// ranges (the reservation table is behind its mutex); the keep-alive is `Sync`.
unsafe impl Sync for RegionInner {}

impl Drop for RegionInner {
    fn drop(&mut self) {
        if let Owner::Allocated(layout) = self.owner {
            // SAFETY: allocated in `Region::new` with this layout.
            unsafe { std::alloc::dealloc(self.ptr, layout) }
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RegionError {
    #[error("a region must be 1 byte .. 1 TiB, not {0}")]
    BadSize(usize),
    #[error("the allocation of {0} bytes failed")]
    NoMemory(usize),
    #[error("a region's memory cannot be a null pointer")]
    Null,
    #[error("{len} bytes at offset {offset} do not fit the region of {region} bytes")]
    OutOfBounds { offset: u64, len: u64, region: u64 },
    #[error("{len} bytes at offset {offset} overlap a range a live prefetch has reserved")]
    Overlap { offset: u64, len: u64 },
}

impl Region {
    /// Allocates `bytes` of zeroed, page-aligned memory (untouched pages cost nothing until
    /// written).
    pub fn new(bytes: usize) -> Result<Region, RegionError> {
        check_size(bytes)?;
        let layout = Layout::from_size_align(bytes, REGION_ALIGN)
            .map_err(|_| RegionError::BadSize(bytes))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(RegionError::NoMemory(bytes));
        }
        Ok(Region::with_owner(ptr, bytes, Owner::Allocated(layout)))
    }

    /// The caller's buffer becomes a region (any alignment); it is freed with the region.
    pub fn from_vec(mut buf: Vec<u8>) -> Result<Region, RegionError> {
        check_size(buf.len())?;
        // Moving the Vec into the keep-alive moves its header, not its heap buffer.
        let (ptr, len) = (buf.as_mut_ptr(), buf.len());
        Ok(Region::with_owner(
            ptr,
            len,
            Owner::Caller {
                _keep: Box::new(buf),
            },
        ))
    }

    /// Memory the caller owns becomes a region: pushed blocks land in it directly. `keep`
    /// is held until the region and every ticket into it are gone (a handle that keeps the
    /// memory alive: a reference to the Python object, an `Arc` of a pinned allocation; or
    /// `()`), then dropped.
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes until `keep` is dropped, and
    /// nothing else may write to it meanwhile, nor read a range a live prefetch reserved
    /// before the ticket reports its entry landed (the reader writes there from another
    /// thread).
    pub unsafe fn from_raw(
        ptr: *mut u8,
        len: usize,
        keep: Box<dyn Send + Sync>,
    ) -> Result<Region, RegionError> {
        check_size(len)?;
        if ptr.is_null() {
            return Err(RegionError::Null);
        }
        Ok(Region::with_owner(ptr, len, Owner::Caller { _keep: keep }))
    }

    fn with_owner(ptr: *mut u8, len: usize, owner: Owner) -> Region {
        Region {
            inner: Arc::new(RegionInner {
                ptr,
                len,
                id: NEXT_REGION_ID.fetch_add(1, Ordering::Relaxed),
                reserved: parking_lot::Mutex::new(BTreeMap::new()),
                owner,
            }),
        }
    }

    /// Whether the memory is the caller's ([`Region::from_vec`], [`Region::from_raw`]).
    pub fn is_callers(&self) -> bool {
        matches!(self.inner.owner, Owner::Caller { .. })
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

/// 1 byte .. 1 TiB.
fn check_size(bytes: usize) -> Result<(), RegionError> {
    if bytes == 0 || bytes > 1 << 40 {
        return Err(RegionError::BadSize(bytes));
    }
    Ok(())
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

    /// Caller memory stays the caller's: nothing is zeroed or copied, and what keeps it alive
    /// goes only with the last clone of the region.
    #[test]
    fn caller_memory_is_used_in_place_and_released_with_the_last_clone() {
        let v = vec![0xAAu8; 10_000];
        let at = v.as_ptr();
        let r = Region::from_vec(v).expect("region");
        assert!(r.is_callers() && !Region::new(1).expect("alloc").is_callers());
        assert_eq!((r.as_ptr(), r.len()), (at, 10_000));
        // SAFETY: nothing else reaches the region's memory here.
        assert!(unsafe { r.inner.slice(0, 10_000) }
            .iter()
            .all(|&b| b == 0xAA));

        let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        struct Flag(Arc<std::sync::atomic::AtomicBool>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let mut mem = vec![7u8; 4096];
        // SAFETY: `mem` outlives the region and is not touched while the region lives.
        let r = unsafe {
            Region::from_raw(mem.as_mut_ptr(), mem.len(), Box::new(Flag(dropped.clone())))
        }
        .expect("region");
        let r2 = r.clone();
        drop(r);
        assert!(!dropped.load(Ordering::SeqCst), "a clone still uses it");
        drop(r2);
        assert!(
            dropped.load(Ordering::SeqCst),
            "released with the last clone"
        );
        assert_eq!(mem, vec![7u8; 4096]);
        // SAFETY: a null pointer is refused before it is used.
        let null = unsafe { Region::from_raw(std::ptr::null_mut(), 1, Box::new(())) };
        assert_eq!(null.err(), Some(RegionError::Null));
        assert_eq!(
            Region::from_vec(Vec::new()).err(),
            Some(RegionError::BadSize(0))
        );
    }
}
