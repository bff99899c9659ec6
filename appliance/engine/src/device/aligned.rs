use parking_lot::Mutex;
use std::alloc::{self, Layout};
use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use super::IO_ALIGN_BYTES;

/// Idle buffers kept for reuse, in bytes, all sizes together.
pub const POOL_IDLE_BYTES_MAX: usize = 256 << 20;
/// Buffers larger than this are not pooled.
pub const POOL_BUF_BYTES_MAX: usize = 16 << 20;

/// Idle buffers by capacity. Reusing them spares every request a fresh allocation, its page
/// faults and its zeroing: the data path's buffers are large (up to 8 MiB) and short-lived.
struct Pool {
    idle: HashMap<usize, Vec<SendPtr>>,
    idle_bytes: usize,
}

struct SendPtr(NonNull<u8>);
// SAFETY: an idle pooled allocation is owned by the pool alone.
unsafe impl Send for SendPtr {}

static POOL: Mutex<Option<Pool>> = Mutex::new(None);

/// Capacity class of a buffer of `len` bytes: 4 KiB steps up to 1 MiB, 64 KiB steps above
/// (at most 6 % over the length). A block read from flash keeps its whole record buffer
/// alive in the DRAM tier, which charges it [`AlignedBuf::capacity_for`]: with 64 KiB steps
/// below 1 MiB, the record of a 64 KiB block took 128 KiB.
fn class(len: usize) -> usize {
    if len <= 1 << 20 {
        len.next_multiple_of(IO_ALIGN_BYTES)
    } else {
        len.next_multiple_of(64 << 10)
    }
}

/// A heap buffer aligned to [`IO_ALIGN_BYTES`], as O_DIRECT requires. Its memory is always
/// initialised (zeroed when first allocated).
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    cap: usize,
}

// SAFETY: AlignedBuf uniquely owns its allocation, like Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out &[u8].
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zero-filled buffer of `len` bytes (`len` may be 0).
    pub fn zeroed(len: usize) -> Self {
        let mut b = Self::reused(len);
        b.fill(0);
        b
    }

    /// A buffer of `len` bytes whose contents are left over from an earlier use (or zero):
    /// for buffers that are about to be overwritten whole, by a device read or by a record
    /// being built.
    pub fn reused(len: usize) -> Self {
        if len == 0 {
            return AlignedBuf {
                ptr: NonNull::<u8>::dangling(),
                len: 0,
                cap: 0,
            };
        }
        let cap = class(len);
        if cap <= POOL_BUF_BYTES_MAX {
            let mut pool = POOL.lock();
            if let Some(p) = pool.as_mut() {
                if let Some(ptr) = p.idle.get_mut(&cap).and_then(Vec::pop) {
                    p.idle_bytes -= cap;
                    return AlignedBuf {
                        ptr: ptr.0,
                        len,
                        cap,
                    };
                }
            }
        }
        let layout = Self::layout(cap);
        // SAFETY: layout has a non-zero size.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len, cap }
    }

    /// Bytes of memory a buffer of `len` bytes occupies (its capacity class).
    pub fn capacity_for(len: usize) -> usize {
        if len == 0 {
            0
        } else {
            class(len)
        }
    }

    /// Bytes of memory this buffer occupies.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    fn layout(cap: usize) -> Layout {
        Layout::from_size_align(cap, IO_ALIGN_BYTES).expect("buffer sizes are far below isize::MAX")
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.cap == 0 {
            return;
        }
        if self.cap <= POOL_BUF_BYTES_MAX {
            let mut pool = POOL.lock();
            let p = pool.get_or_insert_with(|| Pool {
                idle: HashMap::new(),
                idle_bytes: 0,
            });
            if p.idle_bytes + self.cap <= POOL_IDLE_BYTES_MAX {
                p.idle_bytes += self.cap;
                p.idle.entry(self.cap).or_default().push(SendPtr(self.ptr));
                return;
            }
        }
        // SAFETY: allocated in `reused` with this same layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.cap)) }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for cap >= len bytes, all initialised (zeroed at allocation).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and we hold &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A buffer occupies what `capacity_for` says (the DRAM tier charges that), and little
    /// more than asked: at most a page below 1 MiB, at most 1/16 above.
    #[test]
    fn capacity_is_what_is_charged_and_close_to_the_length() {
        for len in [
            1,
            4096,
            4097,
            65_536 + 4096,
            73_728,
            500_000,
            1 << 20,
            (1 << 20) + 4096,
            8 << 20,
        ] {
            let b = AlignedBuf::reused(len);
            assert_eq!(b.capacity(), AlignedBuf::capacity_for(len), "{len}");
            let waste = b.capacity() - len;
            assert!(
                waste < IO_ALIGN_BYTES.max(len / 16),
                "a buffer of {len} bytes occupies {}",
                b.capacity()
            );
        }
    }

    #[test]
    fn aligned_zeroed_and_reused() {
        for len in [0, 1, 4096, 3 * 4096 + 5, (1 << 20) + 4096] {
            let b = AlignedBuf::zeroed(len);
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&x| x == 0));
            if len > 0 {
                assert_eq!(b.as_ptr() as usize % IO_ALIGN_BYTES, 0);
            }
        }
        let mut a = AlignedBuf::reused(100_000);
        a.fill(7);
        drop(a);
        let b = AlignedBuf::reused(100_000);
        assert_eq!(b.len(), 100_000);
        assert_eq!(b.as_ptr() as usize % IO_ALIGN_BYTES, 0);
        assert!(
            AlignedBuf::zeroed(100_000).iter().all(|&x| x == 0),
            "zeroed clears reused memory"
        );
    }
}
