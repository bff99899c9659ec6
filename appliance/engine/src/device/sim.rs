//! The firmware-sim backend: the node on a simulated flash device
//! (`--device sim:<profile>`), and the device the reliability suites cut power on.
//!
//! Commands are submitted to the [`SimDevice`] when the I/O is issued (so that the device
//! sees them in the order the engine issues them), and completed when their future runs: at
//! once in instant mode, after sleeping until the modelled completion time in real-time mode.

use super::{check_vectored, AlignedBuf, Device, DeviceInfo, FlushFuture, IoFuture, VecIoFuture};
use ctxpod_firmware_sim::{FaultPlan, Media, Profile, SimDevice, SimError, Ticket};
use std::io;
use std::path::Path;
use std::sync::Arc;

pub struct SimBackend {
    dev: Arc<SimDevice>,
}

impl SimBackend {
    pub fn new(dev: Arc<SimDevice>) -> SimBackend {
        SimBackend { dev }
    }

    /// A real-time device of `profile` (`tlc`, `qlc`, `…-noplp`, or a TOML file) whose
    /// durable medium is the sparse file `path`, with faults from `plan` if given.
    pub fn open(
        profile: &str,
        path: &Path,
        len: u64,
        plan: Option<&Path>,
    ) -> anyhow::Result<SimBackend> {
        let profile = Profile::load(profile).map_err(anyhow::Error::msg)?;
        let plan = match plan {
            Some(p) => FaultPlan::load(&p.to_string_lossy()).map_err(anyhow::Error::msg)?,
            None => FaultPlan::none(),
        };
        let media = Media::file(path, len)
            .map_err(|e| anyhow::anyhow!("simulated device medium {}: {e}", path.display()))?;
        tracing::info!(
            profile = %profile.name,
            medium = %path.display(),
            "device is simulated (firmware-sim)"
        );
        Ok(SimBackend::new(Arc::new(SimDevice::new(
            profile, media, plan, true,
        ))))
    }
}

fn to_io(e: SimError) -> io::Error {
    match e {
        SimError::NoSpace => io::Error::from_raw_os_error(libc::ENOSPC),
        SimError::Invalid { .. } => io::Error::new(io::ErrorKind::InvalidInput, e.to_string()),
        e => io::Error::other(e.to_string()),
    }
}

/// Waits for the command's completion time (real-time mode), then completes it.
async fn finish(dev: Arc<SimDevice>, t: Ticket) -> io::Result<()> {
    if let Some(at) = dev.instant_of(t.done_ns) {
        tokio::time::sleep_until(at.into()).await;
    }
    dev.complete(t).map_err(to_io)
}

/// The future of a submitted command: `bufs` back with its completion (or the refusal).
fn completed<B: Send + 'static>(
    dev: &Arc<SimDevice>,
    submitted: Result<Ticket, SimError>,
    bufs: B,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = (B, io::Result<()>)> + Send>> {
    let dev = dev.clone();
    Box::pin(async move {
        match submitted {
            Ok(t) => (bufs, finish(dev, t).await),
            Err(e) => (bufs, Err(to_io(e))),
        }
    })
}

impl SimBackend {
    fn write(&self, buf: AlignedBuf, offset: u64, fua: bool) -> IoFuture {
        let submitted = self.dev.submit_write(offset, &buf, fua);
        completed(&self.dev, submitted, buf)
    }
}

impl Device for SimBackend {
    fn read_at(&self, mut buf: AlignedBuf, offset: u64) -> IoFuture {
        let submitted = self.dev.submit_read(offset, &mut buf);
        completed(&self.dev, submitted, buf)
    }

    fn write_at(&self, buf: AlignedBuf, offset: u64) -> IoFuture {
        self.write(buf, offset, false)
    }

    fn write_durable_at(&self, buf: AlignedBuf, offset: u64) -> IoFuture {
        self.write(buf, offset, true)
    }

    /// One command for the whole run, as the kernel makes of a vectored write: a power cut
    /// may tear it anywhere, across records (the buffers are copied into one, for the model).
    fn write_vectored_at(&self, bufs: Vec<AlignedBuf>, offset: u64, durable: bool) -> VecIoFuture {
        let total = match check_vectored(&bufs, offset) {
            Ok(n) => n,
            Err(e) => return Box::pin(async move { (bufs, Err(e)) }),
        };
        let mut whole = Vec::with_capacity(total);
        bufs.iter().for_each(|b| whole.extend_from_slice(b));
        let submitted = self.dev.submit_write(offset, &whole, durable);
        completed(&self.dev, submitted, bufs)
    }

    fn flush(&self) -> FlushFuture {
        let submitted = self.dev.submit_flush();
        let dev = self.dev.clone();
        Box::pin(async move { finish(dev, submitted.map_err(to_io)?).await })
    }

    fn info(&self) -> DeviceInfo {
        DeviceInfo {
            len: self.dev.len(),
            engine: "firmware-sim",
            direct: true,
        }
    }

    fn sim(&self) -> Option<&Arc<SimDevice>> {
        Some(&self.dev)
    }
}
