//! Device layer: 4 KiB-aligned asynchronous reads, writes and flushes of one flash device.
//!
//! Architecture invariant: no other module touches the device file. The engine sees only the
//! [`Device`] trait; which backend runs ([`uring`] or the [`sync`] fallback) is chosen once at
//! open time and reported by [`Device::engine`].

mod aligned;
pub mod sim;
pub mod sync;
pub mod tiered;
pub mod uring;

pub use aligned::AlignedBuf;

use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

/// Every device I/O is a multiple of this, at an offset that is a multiple of this.
pub const IO_ALIGN_BYTES: usize = ctxpod_format::IO_ALIGN_BYTES;

/// Result of a read or write: the buffer comes back whatever happened.
pub type IoFuture = Pin<Box<dyn Future<Output = (AlignedBuf, io::Result<()>)> + Send>>;
pub type FlushFuture = Pin<Box<dyn Future<Output = io::Result<()>> + Send>>;
/// Result of a vectored write: the buffers come back whatever happened.
pub type VecIoFuture = Pin<Box<dyn Future<Output = (Vec<AlignedBuf>, io::Result<()>)> + Send>>;

/// The most buffers one [`Device::write_vectored_at`] takes (Linux's `UIO_MAXIOV`).
pub const VECTORED_BUFS_MAX: usize = 1024;

/// A flash device (file, raw block device, or a simulated one).
///
/// Every I/O is issued when its method is called (in the order of the calls); the future it
/// returns only collects the result. The writer relies on it: a batch's writes run while
/// the committer is still busy with earlier batches. Call from within a tokio runtime.
pub trait Device: Send + Sync + 'static {
    /// Fills all of `buf` from `offset`. Both must be [`IO_ALIGN_BYTES`]-aligned.
    fn read_at(&self, buf: AlignedBuf, offset: u64) -> IoFuture;
    /// Writes all of `buf` at `offset`. Both must be [`IO_ALIGN_BYTES`]-aligned.
    fn write_at(&self, buf: AlignedBuf, offset: u64) -> IoFuture;
    /// Like [`Device::write_at`], but durable when it completes (`RWF_DSYNC`: a FUA write,
    /// or the write and a flush) — without flushing anything else.
    fn write_durable_at(&self, buf: AlignedBuf, offset: u64) -> IoFuture;
    /// Writes `bufs` back to back from `offset`, durable on completion when `durable`, as one
    /// I/O (`pwritev2`, io_uring `WRITEV`, one command of the simulated device, which a power
    /// cut may tear anywhere). A group commit's records lie
    /// back to back in the log, so they go to the device as one write, and one `RWF_DSYNC`,
    /// instead of one of each per record. Every buffer and `offset` must be
    /// [`IO_ALIGN_BYTES`]-aligned; at most [`VECTORED_BUFS_MAX`] buffers; else nothing is
    /// written and the answer is `InvalidInput`.
    fn write_vectored_at(&self, bufs: Vec<AlignedBuf>, offset: u64, durable: bool) -> VecIoFuture;
    /// Makes every completed write durable (fdatasync / NVMe flush).
    fn flush(&self) -> FlushFuture;
    /// What the device is: its size, I/O engine, and whether it bypasses the page cache.
    fn info(&self) -> DeviceInfo;
    /// Size in bytes.
    fn len(&self) -> u64 {
        self.info().len
    }
    /// True for a zero-sized device (never the case for an opened one).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The simulated device behind this one, if it is simulated (firmware-sim).
    fn sim(&self) -> Option<&Arc<ctxpod_firmware_sim::SimDevice>> {
        None
    }
    /// The devices of a node's tiers, in order, when this is a [`tiered::TieredDevice`]
    /// (empty otherwise).
    fn tier_devices(&self) -> &[Arc<dyn Device>] {
        &[]
    }
}

/// What a [`Device`] is, fixed when it is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Size in bytes.
    pub len: u64,
    /// `io_uring`, `sync` or `firmware-sim`.
    pub engine: &'static str,
    /// Whether I/O bypasses the page cache (O_DIRECT).
    pub direct: bool,
}

pub use ctxpod_format::config::IoEngine;

/// Opens (creating and preallocating if needed) the device at `path` of `len` bytes.
///
/// A regular file is created with `len` bytes allocated up front (so a full disk is found at
/// start, not on a write); an existing block device is used as it is, and must hold `len`.
pub fn open(path: &Path, len: u64, engine: IoEngine) -> anyhow::Result<Arc<dyn Device>> {
    use anyhow::Context;
    let (file, direct) =
        open_file(path).with_context(|| format!("open device {}", path.display()))?;
    let file = Arc::new(file);
    let meta = file.metadata()?;
    let actual = if meta.file_type().is_block_device() {
        (&*file).seek(SeekFrom::End(0))?
    } else {
        if meta.len() < len {
            allocate(&file, len).with_context(|| {
                format!("allocate {len} bytes for device file {}", path.display())
            })?;
        }
        len
    };
    anyhow::ensure!(
        actual >= len,
        "device {} holds {actual} bytes, less than the configured capacity {len}",
        path.display()
    );
    if !direct {
        tracing::warn!(
            path = %path.display(),
            "O_DIRECT is not supported by this filesystem; device I/O goes through the page cache"
        );
    }
    match engine {
        IoEngine::Sync => Ok(Arc::new(sync::SyncDevice::new(file, len, direct))),
        IoEngine::IoUring => Ok(Arc::new(
            uring::UringDevice::new(file, len, direct).context("start io_uring")?,
        )),
        IoEngine::Auto => match uring::UringDevice::new(file.clone(), len, direct) {
            Ok(d) => Ok(Arc::new(d)),
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "io_uring is refused here (seccomp or an old kernel); falling back to pread/pwrite"
                );
                Ok(Arc::new(sync::SyncDevice::new(file, len, direct)))
            }
        },
    }
}

fn open_file(path: &Path) -> io::Result<(File, bool)> {
    let mut opts = OpenOptions::new();
    opts.read(true).write(true).create(true);
    let mut direct = opts.clone();
    direct.custom_flags(libc::O_DIRECT);
    match direct.open(path) {
        Ok(f) => Ok((f, true)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok((opts.open(path)?, false)),
        Err(e) => Err(e),
    }
}

fn allocate(file: &File, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: fallocate on an open fd we own; mode 0 allocates and extends the file size.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len as libc::off_t) };
    if rc == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EOPNOTSUPP) {
        // Filesystems without fallocate (tmpfs on old kernels): a sparse file of the right size.
        return file.set_len(len);
    }
    Err(err)
}

pub(crate) fn check_aligned(buf: &AlignedBuf, offset: u64) -> io::Result<()> {
    if !offset.is_multiple_of(IO_ALIGN_BYTES as u64) || !buf.len().is_multiple_of(IO_ALIGN_BYTES) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("unaligned I/O: offset {offset}, length {}", buf.len()),
        ));
    }
    Ok(())
}

/// The checks of a vectored write: at most [`VECTORED_BUFS_MAX`] buffers, each aligned at its
/// place from an aligned `offset`. Returns the bytes it writes.
pub(crate) fn check_vectored(bufs: &[AlignedBuf], offset: u64) -> io::Result<usize> {
    if bufs.len() > VECTORED_BUFS_MAX {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "a vectored write of {} buffers (at most {VECTORED_BUFS_MAX})",
                bufs.len()
            ),
        ));
    }
    let mut at = offset;
    for b in bufs {
        check_aligned(b, at)?;
        at += b.len() as u64;
    }
    Ok((at - offset) as usize)
}

/// The iovecs of `bufs` from byte `done` of the whole on (what a short write left), into
/// `iov` (cleared first). The pointers are valid while `bufs` lives, unmoved.
pub(crate) fn iovecs_from(bufs: &[AlignedBuf], done: usize, iov: &mut Vec<libc::iovec>) {
    iov.clear();
    let mut skip = done;
    for b in bufs {
        if skip >= b.len() {
            skip -= b.len();
            continue;
        }
        iov.push(libc::iovec {
            // The cast is for the C signature: a write only reads through this pointer.
            iov_base: b[skip..].as_ptr() as *mut libc::c_void,
            iov_len: b.len() - skip,
        });
        skip = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn exercise(dev: Arc<dyn Device>) {
        let mut w = AlignedBuf::zeroed(3 * IO_ALIGN_BYTES);
        for (i, b) in w.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        let expect = w.to_vec();
        let (_, r) = dev.write_at(w, 8192).await;
        r.expect("write");
        dev.flush().await.expect("flush");
        let mut d = AlignedBuf::zeroed(IO_ALIGN_BYTES);
        d.fill(0xd5);
        let (_, r) = dev.write_durable_at(d, 12 * 4096).await;
        r.expect("durable write");
        let (b, r) = dev
            .read_at(AlignedBuf::zeroed(IO_ALIGN_BYTES), 12 * 4096)
            .await;
        r.expect("read durable write");
        assert!(b.iter().all(|&x| x == 0xd5));
        let (buf, r) = dev
            .read_at(AlignedBuf::zeroed(3 * IO_ALIGN_BYTES), 8192)
            .await;
        r.expect("read");
        assert_eq!(&buf[..], &expect[..]);
        let (_, r) = dev.read_at(AlignedBuf::zeroed(IO_ALIGN_BYTES), 100).await;
        assert!(r.is_err(), "unaligned offset refused");
        // Many concurrent I/Os, more than one ring's worth.
        let mut futs = Vec::new();
        for i in 0..600u64 {
            let mut b = AlignedBuf::zeroed(IO_ALIGN_BYTES);
            b[0] = i as u8;
            futs.push(dev.write_at(b, (16 + i) * IO_ALIGN_BYTES as u64));
        }
        for (_, r) in futures::future::join_all(futs).await {
            r.expect("concurrent write");
        }
        for i in [0u64, 299, 599] {
            let (b, r) = dev
                .read_at(AlignedBuf::zeroed(IO_ALIGN_BYTES), (16 + i) * 4096)
                .await;
            r.expect("read back");
            assert_eq!(b[0], i as u8);
        }
        // Vectored writes, durable and not: buffers of different sizes land back to back.
        let at = 700 * IO_ALIGN_BYTES as u64;
        for (durable, seed) in [(false, 3u8), (true, 7u8)] {
            let bufs: Vec<AlignedBuf> = [1usize, 3, 2, 16]
                .iter()
                .enumerate()
                .map(|(i, &pages)| {
                    let mut b = AlignedBuf::zeroed(pages * IO_ALIGN_BYTES);
                    b.fill(seed.wrapping_add(i as u8));
                    b
                })
                .collect();
            let expect: Vec<u8> = bufs.iter().flat_map(|b| b.to_vec()).collect();
            let (back, r) = dev.write_vectored_at(bufs, at, durable).await;
            r.expect("vectored write");
            assert_eq!(back.len(), 4, "every buffer comes back");
            let (b, r) = dev.read_at(AlignedBuf::zeroed(expect.len()), at).await;
            r.expect("read vectored write back");
            assert!(
                b[..] == expect[..],
                "vectored write (durable {durable}) reads back"
            );
        }
        let (back, r) = dev.write_vectored_at(Vec::new(), at, true).await;
        assert!(
            back.is_empty() && r.is_ok(),
            "an empty vectored write is a no-op"
        );
        let odd = vec![AlignedBuf::zeroed(IO_ALIGN_BYTES), AlignedBuf::zeroed(100)];
        let (back, r) = dev.write_vectored_at(odd, at, false).await;
        assert_eq!(back.len(), 2, "refused buffers come back");
        assert_eq!(
            r.expect_err("unaligned").kind(),
            io::ErrorKind::InvalidInput
        );
        let many = (0..=VECTORED_BUFS_MAX)
            .map(|_| AlignedBuf::zeroed(IO_ALIGN_BYTES))
            .collect();
        let (_, r) = dev.write_vectored_at(many, 0, false).await;
        assert_eq!(r.expect_err("too many").kind(), io::ErrorKind::InvalidInput);
        let (b, r) = dev.read_at(AlignedBuf::zeroed(IO_ALIGN_BYTES), at).await;
        r.expect("read after refused writes");
        assert!(
            b.iter().all(|&x| x == 7),
            "a refused vectored write writes nothing"
        );
    }

    #[tokio::test]
    async fn both_engines_read_what_they_wrote() {
        let dir = tempfile::tempdir().expect("tempdir");
        for engine in [IoEngine::Sync, IoEngine::Auto] {
            let path = dir.path().join(format!("{engine:?}.dev"));
            let dev = open(&path, 8 << 20, engine).expect("open device");
            exercise(dev).await;
        }
    }

    #[tokio::test]
    async fn the_simulated_device_reads_what_it_wrote() {
        // Its vectored write is one modelled command, as the kernel's is one I/O.
        let dir = tempfile::tempdir().expect("tempdir");
        let dev = sim::SimBackend::open("tlc", &dir.path().join("sim.dev"), 8 << 20, None)
            .expect("open simulated device");
        exercise(Arc::new(dev)).await;
    }
}
