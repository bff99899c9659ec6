//! Fallback engine: pread/pwrite/fdatasync on tokio's blocking pool, for hosts that refuse
//! io_uring (container seccomp profiles, old kernels).

use super::{check_aligned, AlignedBuf, Device, FlushFuture, IoFuture};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

pub struct SyncDevice {
    file: Arc<File>,
    len: u64,
    direct: bool,
}

impl SyncDevice {
    pub fn new(file: Arc<File>, len: u64, direct: bool) -> Self {
        SyncDevice { file, len, direct }
    }
}

fn joined(
    r: Result<(AlignedBuf, io::Result<()>), tokio::task::JoinError>,
) -> (AlignedBuf, io::Result<()>) {
    r.unwrap_or_else(|e| (AlignedBuf::zeroed(0), Err(io::Error::other(e))))
}

impl Device for SyncDevice {
    fn read_at(&self, mut buf: AlignedBuf, offset: u64) -> IoFuture {
        let file = self.file.clone();
        Box::pin(async move {
            if let Err(e) = check_aligned(&buf, offset) {
                return (buf, Err(e));
            }
            joined(
                tokio::task::spawn_blocking(move || {
                    let r = file.read_exact_at(&mut buf, offset);
                    (buf, r)
                })
                .await,
            )
        })
    }

    fn write_at(&self, buf: AlignedBuf, offset: u64) -> IoFuture {
        let file = self.file.clone();
        Box::pin(async move {
            if let Err(e) = check_aligned(&buf, offset) {
                return (buf, Err(e));
            }
            joined(
                tokio::task::spawn_blocking(move || {
                    let r = file.write_all_at(&buf, offset);
                    (buf, r)
                })
                .await,
            )
        })
    }

    fn write_durable_at(&self, buf: AlignedBuf, offset: u64) -> IoFuture {
        use std::os::fd::AsRawFd;
        let file = self.file.clone();
        Box::pin(async move {
            if let Err(e) = check_aligned(&buf, offset) {
                return (buf, Err(e));
            }
            joined(
                tokio::task::spawn_blocking(move || {
                    let mut done = 0usize;
                    while done < buf.len() {
                        let iov = libc::iovec {
                            // SAFETY (for the cast): pwritev2 only reads through this pointer.
                            iov_base: buf[done..].as_ptr() as *mut libc::c_void,
                            iov_len: buf.len() - done,
                        };
                        // SAFETY: one valid iovec over our live buffer, on an fd we own.
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
                            return (buf, Err(e));
                        }
                        if n == 0 {
                            return (buf, Err(io::ErrorKind::WriteZero.into()));
                        }
                        done += n as usize;
                    }
                    (buf, Ok(()))
                })
                .await,
            )
        })
    }

    fn flush(&self) -> FlushFuture {
        let file = self.file.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || file.sync_data())
                .await
                .map_err(io::Error::other)?
        })
    }

    fn len(&self) -> u64 {
        self.len
    }

    fn engine(&self) -> &'static str {
        "sync"
    }

    fn direct(&self) -> bool {
        self.direct
    }
}
