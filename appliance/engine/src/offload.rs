//! The offload engine: the DPU's CRC32C and AES-GCM engines as two asynchronous stages, each
//! with its own bounded submission queue and worker threads. A request thread submits a job
//! and awaits its completion; it never does the work itself. A full queue is an explicit
//! `Busy`, never an unbounded backlog. Faults are injected per operation from a seeded plan
//! (the engine reports an error for that operation and does not run it).
//!
//! `inline` runs every job on the submitting thread instead: the "no DPU" baseline the
//! offload is measured against (docs/PERFORMANCE.md). Small jobs (`inline_max_bytes`) run
//! there too: handing a job to an engine thread and waking the caller with its result
//! costs about 17 µs of CPU on this hardware (measured: docs/PERFORMANCE.md), more than
//! sealing or checking 64 KiB, and each hand-off waits for a thread to be scheduled.

use ctxpod_firmware_sim::rng::Rng;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::oneshot;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OffloadError {
    #[error("the {0} engine's queue is full")]
    Busy(&'static str),
    #[error("the {0} engine stopped")]
    Stopped(&'static str),
    #[error("the {0} engine reported an error for this operation")]
    Fault(&'static str),
}

/// Per-operation error chances, drawn in submission order from `seed`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OffloadFaults {
    pub seed: u64,
    pub crc_error: f64,
    pub aead_error: f64,
}

#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub struct StageStats {
    pub ops: u64,
    /// Of `ops`, those run on the submitting thread (small jobs, or an inline engine).
    pub inline_ops: u64,
    /// Time workers spent running jobs (CPU-bound work: about their CPU time).
    pub busy_seconds: f64,
    pub rejected_busy: u64,
    pub faults: u64,
}

#[derive(Default)]
struct Counters {
    ops: AtomicU64,
    inline_ops: AtomicU64,
    busy_ns: AtomicU64,
    rejected: AtomicU64,
    faults: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> StageStats {
        StageStats {
            ops: self.ops.load(Ordering::Relaxed),
            inline_ops: self.inline_ops.load(Ordering::Relaxed),
            busy_seconds: self.busy_ns.load(Ordering::Relaxed) as f64 / 1e9,
            rejected_busy: self.rejected.load(Ordering::Relaxed),
            faults: self.faults.load(Ordering::Relaxed),
        }
    }
}

type Job = Box<dyn FnOnce() + Send>;

struct Stage {
    name: &'static str,
    /// None when jobs run inline.
    tx: Option<SyncSender<Job>>,
    /// Jobs over at most this many bytes run inline even with engine threads.
    inline_max_bytes: usize,
    counters: Arc<Counters>,
}

impl Stage {
    fn new(name: &'static str, threads: usize, queue_depth: usize, inline: Inline) -> Stage {
        let counters = Arc::new(Counters::default());
        let Inline::Below(inline_max_bytes) = inline else {
            return Stage {
                name,
                tx: None,
                inline_max_bytes: usize::MAX,
                counters,
            };
        };
        let (tx, rx) = mpsc::sync_channel::<Job>(queue_depth.max(1));
        let rx: Arc<Mutex<Receiver<Job>>> = Arc::new(Mutex::new(rx));
        for i in 0..threads {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("dpu-{name}-{i}"))
                .spawn(move || loop {
                    let job = rx.lock().recv();
                    match job {
                        // A panicking job drops its reply sender (its caller sees Stopped);
                        // the worker lives on.
                        Ok(job) => {
                            drop(std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)))
                        }
                        Err(_) => return,
                    }
                })
                .expect("spawning an offload thread");
        }
        Stage {
            name,
            tx: Some(tx),
            inline_max_bytes,
            counters,
        }
    }

    /// Runs `f`, a job over `bytes` bytes: on an engine thread, or on this one when the
    /// stage is inline or the job small.
    async fn run<T, F>(&self, fault: bool, bytes: usize, f: F) -> Result<T, OffloadError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let c = &self.counters;
        if fault {
            c.faults.fetch_add(1, Ordering::Relaxed);
            return Err(OffloadError::Fault(self.name));
        }
        let tx = match &self.tx {
            Some(tx) if bytes > self.inline_max_bytes => tx,
            _ => {
                let t = Instant::now();
                let out = f();
                c.busy_ns
                    .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
                c.ops.fetch_add(1, Ordering::Relaxed);
                c.inline_ops.fetch_add(1, Ordering::Relaxed);
                return Ok(out);
            }
        };
        let (done_tx, done_rx) = oneshot::channel();
        let counters = c.clone();
        tx.try_send(Box::new(move || {
            let t = Instant::now();
            let out = f();
            counters
                .busy_ns
                .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
            counters.ops.fetch_add(1, Ordering::Relaxed);
            let _ = done_tx.send(out);
        }))
        .map_err(|e| match e {
            TrySendError::Full(_) => {
                c.rejected.fetch_add(1, Ordering::Relaxed);
                OffloadError::Busy(self.name)
            }
            TrySendError::Disconnected(_) => OffloadError::Stopped(self.name),
        })?;
        done_rx.await.map_err(|_| OffloadError::Stopped(self.name))
    }
}

/// Where an [`OffloadEngine`]'s jobs run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Inline {
    /// Every job on the submitting thread: the no-DPU baseline.
    All,
    /// Jobs of at most this many bytes on the submitting thread, larger ones on the
    /// engines' threads (`Below(0)`: every job on an engine thread).
    Below(usize),
}

pub struct OffloadEngine {
    crc: Stage,
    aead: Stage,
    faults: Mutex<(OffloadFaults, Rng)>,
}

impl OffloadEngine {
    /// `threads` workers per stage (0 = one per CPU), `queue_depth` jobs queued per stage;
    /// `inline`: which jobs run where they are submitted.
    pub fn new(threads: usize, queue_depth: usize, inline: Inline) -> OffloadEngine {
        let threads = if threads == 0 {
            std::thread::available_parallelism().map_or(2, |n| n.get())
        } else {
            threads
        };
        OffloadEngine {
            crc: Stage::new("crc32c", threads, queue_depth, inline),
            aead: Stage::new("aes-gcm", threads, queue_depth, inline),
            faults: Mutex::new((OffloadFaults::default(), Rng::new(0))),
        }
    }

    pub fn set_faults(&self, f: OffloadFaults) {
        *self.faults.lock() = (f.clone(), Rng::new(f.seed));
    }

    fn draw(&self, crc: bool) -> bool {
        let mut g = self.faults.lock();
        let p = if crc { g.0.crc_error } else { g.0.aead_error };
        g.1.chance(p)
    }

    /// Runs `f` (CRC32C work over `bytes` bytes) on the CRC engine.
    pub async fn crc<T, F>(&self, bytes: usize, f: F) -> Result<T, OffloadError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        self.crc.run(self.draw(true), bytes, f).await
    }

    /// Runs `f` (AES-GCM work over `bytes` bytes) on the AEAD engine.
    pub async fn aead<T, F>(&self, bytes: usize, f: F) -> Result<T, OffloadError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        self.aead.run(self.draw(false), bytes, f).await
    }

    pub fn inline(&self) -> bool {
        self.crc.tx.is_none()
    }

    /// (CRC engine, AEAD engine).
    pub fn stats(&self) -> (StageStats, StageStats) {
        (self.crc.counters.snapshot(), self.aead.counters.snapshot())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn runs_jobs_reports_full_queues_and_injects_faults() {
        let o = OffloadEngine::new(2, 4, Inline::Below(0));
        assert_eq!(o.crc(1 << 20, || 2 + 2).await, Ok(4));
        assert_eq!(o.aead(1 << 20, || 3).await, Ok(3));
        assert_eq!(
            o.aead(1 << 20, || -> u8 { panic!("job panics") }).await,
            Err(OffloadError::Stopped("aes-gcm"))
        );
        assert_eq!(
            o.aead(1 << 20, || 5).await,
            Ok(5),
            "workers survive a panicking job"
        );
        // Block both workers and fill the queue: the next submit is refused.
        let (gate_tx, gate_rx) = std::sync::mpsc::channel::<()>();
        let gate = Arc::new(Mutex::new(gate_rx));
        let mut pending = Vec::new();
        let mut refused = false;
        for _ in 0..16 {
            let g = gate.clone();
            let mut fut = Box::pin(o.crc(1 << 20, move || {
                let _ = g.lock().recv();
            }));
            match futures_poll(&mut fut) {
                Some(Err(OffloadError::Busy(_))) => {
                    refused = true;
                    break;
                }
                _ => pending.push(fut),
            }
        }
        assert!(refused, "a bounded queue must refuse at some point");
        drop(gate_tx);
        for f in pending {
            let _ = f.await;
        }
        assert_eq!(
            o.aead(1 << 20, || 1).await,
            Ok(1),
            "the other engine was never blocked"
        );
        o.set_faults(OffloadFaults {
            seed: 3,
            crc_error: 1.0,
            aead_error: 0.0,
        });
        assert_eq!(
            o.crc(1 << 20, || 1).await,
            Err(OffloadError::Fault("crc32c"))
        );
        assert_eq!(o.aead(1 << 20, || 1).await, Ok(1));
        let (c, a) = o.stats();
        assert_eq!((c.faults, a.faults), (1, 0));
        assert!(c.rejected_busy >= 1 && a.ops >= 3);
    }

    #[tokio::test]
    async fn inline_runs_on_the_caller() {
        let o = OffloadEngine::new(0, 1, Inline::All);
        let me = std::thread::current().id();
        assert_eq!(
            o.aead(1 << 20, move || std::thread::current().id() == me)
                .await,
            Ok(true)
        );
        assert!(o.inline());
    }

    #[tokio::test]
    async fn small_jobs_run_on_the_caller_larger_ones_on_an_engine() {
        let o = OffloadEngine::new(2, 4, Inline::Below(128 << 10));
        let me = std::thread::current().id();
        let here = move || std::thread::current().id() == me;
        assert_eq!(o.aead(64 << 10, here).await, Ok(true));
        assert_eq!(o.crc(128 << 10, here).await, Ok(true));
        assert_eq!(o.aead((128 << 10) + 1, here).await, Ok(false));
        assert_eq!(o.crc(4 << 20, here).await, Ok(false));
        let (c, a) = o.stats();
        assert_eq!((c.ops, c.inline_ops, a.ops, a.inline_ops), (2, 1, 2, 1));
        // A small job still draws its fault: the plan covers every operation.
        o.set_faults(OffloadFaults {
            seed: 1,
            crc_error: 1.0,
            aead_error: 0.0,
        });
        assert_eq!(o.crc(4096, || 1).await, Err(OffloadError::Fault("crc32c")));
        assert!(!o.inline());
    }

    /// One poll of a future, without a runtime's help.
    fn futures_poll<F: std::future::Future + Unpin>(f: &mut F) -> Option<F::Output> {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        match std::pin::Pin::new(f).poll(&mut cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        }
    }
}
