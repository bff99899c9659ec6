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
