//! Device layer: 4 KiB-aligned asynchronous reads, writes and flushes of one flash device.
//!
//! Architecture invariant: no other module touches the device file. The engine sees only the
//! [`Device`] trait; which backend runs ([`uring`] or the [`sync`] fallback) is chosen once at
//! open time and reported by [`Device::engine`].

mod aligned;
pub mod sim;
pub mod sync;
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
}
