//! Fallback engine: pread/pwrite/fdatasync on tokio's blocking pool, for hosts that refuse
//! io_uring (container seccomp profiles, old kernels).

use super::{
    check_aligned, check_vectored, iovecs_from, AlignedBuf, Device, DeviceInfo, FlushFuture,
    IoFuture, VecIoFuture,
};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

pub struct SyncDevice {
    file: Arc<File>,
    info: DeviceInfo,
}

impl SyncDevice {
    pub fn new(file: Arc<File>, len: u64, direct: bool) -> Self {
        let info = DeviceInfo {
            len,
            engine: "sync",
            direct,
        };
        SyncDevice { file, info }
    }
}

/// Runs one positioned I/O on the blocking pool, after the alignment check; the buffer
/// comes back whatever happens. Issued at the call, as every [`Device`] I/O is: the future
/// only collects the result.
fn blocking_io<F>(file: Arc<File>, mut buf: AlignedBuf, offset: u64, io: F) -> IoFuture
where
    F: FnOnce(&File, &mut AlignedBuf, u64) -> io::Result<()> + Send + 'static,
{
    if let Err(e) = check_aligned(&buf, offset) {
        return Box::pin(async move { (buf, Err(e)) });
    }
    let running = tokio::task::spawn_blocking(move || {
        let r = io(&file, &mut buf, offset);
        (buf, r)
    });
    Box::pin(async move {
        running
            .await
            .unwrap_or_else(|e| (AlignedBuf::zeroed(0), Err(io::Error::other(e))))
    })
}

/// `pwritev2` of all of `bufs`, back to back from `offset`, with `flags` (`RWF_DSYNC`:
/// durable when it returns); a short write goes on with the rest.
fn pwritev_all(
    file: &File,
    bufs: &[AlignedBuf],
    offset: u64,
    flags: libc::c_int,
) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let total: usize = bufs.iter().map(|b| b.len()).sum();
    let mut iov = Vec::with_capacity(bufs.len());
    let mut done = 0usize;
    while done < total {
        iovecs_from(bufs, done, &mut iov);
        // SAFETY: valid iovecs over live buffers (at most VECTORED_BUFS_MAX, checked by the
        // callers), on an open fd.
        let n = unsafe {
            libc::pwritev2(
                file.as_raw_fd(),
                iov.as_ptr(),
                iov.len() as libc::c_int,
                (offset + done as u64) as libc::off_t,
                flags,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        done += n as usize;
    }
    Ok(())
}

impl Device for SyncDevice {
    fn read_at(&self, buf: AlignedBuf, offset: u64) -> IoFuture {
        blocking_io(self.file.clone(), buf, offset, |f, b, o| {
            f.read_exact_at(b, o)
        })
    }

    fn write_at(&self, buf: AlignedBuf, offset: u64) -> IoFuture {
        blocking_io(self.file.clone(), buf, offset, |f, b, o| {
            f.write_all_at(b, o)
        })
    }

    fn write_durable_at(&self, buf: AlignedBuf, offset: u64) -> IoFuture {
        blocking_io(self.file.clone(), buf, offset, |f, b, o| {
            pwritev_all(f, std::slice::from_ref(b), o, libc::RWF_DSYNC)
        })
    }

    fn write_vectored_at(&self, bufs: Vec<AlignedBuf>, offset: u64, durable: bool) -> VecIoFuture {
        if let Err(e) = check_vectored(&bufs, offset) {
            return Box::pin(async move { (bufs, Err(e)) });
        }
        let file = self.file.clone();
        let flags = if durable { libc::RWF_DSYNC } else { 0 };
        let running = tokio::task::spawn_blocking(move || {
            let r = pwritev_all(&file, &bufs, offset, flags);
            (bufs, r)
        });
        Box::pin(async move {
            running
                .await
                .unwrap_or_else(|e| (Vec::new(), Err(io::Error::other(e))))
        })
    }

    fn flush(&self) -> FlushFuture {
        let file = self.file.clone();
        let running = tokio::task::spawn_blocking(move || file.sync_data());
        Box::pin(async move { running.await.map_err(io::Error::other)? })
    }

    fn info(&self) -> DeviceInfo {
        self.info
    }
}
