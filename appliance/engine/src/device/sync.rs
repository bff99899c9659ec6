//! Fallback engine: pread/pwrite/fdatasync on tokio's blocking pool, for hosts that refuse
//! io_uring (container seccomp profiles, old kernels).

use super::{check_aligned, AlignedBuf, Device, DeviceInfo, FlushFuture, IoFuture};
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

/// `pwritev2(RWF_DSYNC)` of all of `buf`: durable when it returns.
fn write_all_dsync(file: &File, buf: &AlignedBuf, offset: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut done = 0usize;
    while done < buf.len() {
        let iov = libc::iovec {
            // The cast is for the C signature: pwritev2 only reads through this pointer.
            iov_base: buf[done..].as_ptr() as *mut libc::c_void,
            iov_len: buf.len() - done,
        };
        // SAFETY: one valid iovec over a live buffer, on an open fd.
        let n = unsafe {
            libc::pwritev2(
                file.as_raw_fd(),
                &iov,
                1,
                (offset + done as u64) as libc::off_t,
                libc::RWF_DSYNC,
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
            write_all_dsync(f, b, o)
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
