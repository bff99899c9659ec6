//! The offload stage: CRC32C and AES-GCM work runs here, on its own threads behind a bounded
//! queue, the way a DPU takes it off the host's request path. A full queue is an explicit
//! "busy", never an unbounded backlog.

use parking_lot::Mutex;
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use tokio::sync::oneshot;

type Job = Box<dyn FnOnce() + Send>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OffloadError {
    #[error("offload queue is full")]
    Busy,
    #[error("offload stage stopped")]
    Stopped,
}

pub struct Offload {
    tx: SyncSender<Job>,
    threads: usize,
}

impl Offload {
    /// `threads` workers (0 = one per CPU) sharing a queue of `queue_depth` jobs.
    pub fn new(threads: usize, queue_depth: usize) -> Offload {
        let threads = if threads == 0 {
            std::thread::available_parallelism().map_or(2, |n| n.get())
        } else {
            threads
        };
        let (tx, rx) = mpsc::sync_channel::<Job>(queue_depth);
        let rx: Arc<Mutex<Receiver<Job>>> = Arc::new(Mutex::new(rx));
        for i in 0..threads {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("ctxpod-offload-{i}"))
                .spawn(move || loop {
                    let job = rx.lock().recv();
                    match job {
                        Ok(job) => {
                            // A panicking job drops its reply sender (its caller sees Stopped);
                            // the worker lives on.
                            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                        }
                        Err(_) => return,
                    }
                })
                .expect("spawning an offload thread");
        }
        Offload { tx, threads }
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f` on the offload stage and waits for its result.
    pub async fn run<T, F>(&self, f: F) -> Result<T, OffloadError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        self.tx
            .try_send(Box::new(move || {
                let _ = tx.send(f());
            }))
            .map_err(|e| match e {
                TrySendError::Full(_) => OffloadError::Busy,
                TrySendError::Disconnected(_) => OffloadError::Stopped,
            })?;
        rx.await.map_err(|_| OffloadError::Stopped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn runs_jobs_and_reports_full_queue() {
        let o = Offload::new(2, 4);
        assert_eq!(o.run(|| 2 + 2).await, Ok(4));
        assert_eq!(
            o.run(|| -> u8 { panic!("job panics") }).await,
            Err(OffloadError::Stopped)
        );
        assert_eq!(o.run(|| 5).await, Ok(5), "workers survive a panicking job");
        // Fill both workers and the queue with blocked jobs: the next submit is refused.
        let (gate_tx, gate_rx) = std::sync::mpsc::channel::<()>();
        let gate = Arc::new(Mutex::new(gate_rx));
        let mut pending = Vec::new();
        let mut refused = false;
        for _ in 0..16 {
            let g = gate.clone();
            let fut = o.run(move || {
                let _ = g.lock().recv();
            });
            let mut fut = Box::pin(fut);
            match futures::poll!(&mut fut) {
                std::task::Poll::Ready(Err(OffloadError::Busy)) => {
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
    }
}
