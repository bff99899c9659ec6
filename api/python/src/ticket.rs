//! Prefetch tickets and KV event streams as Python objects. Waiting releases the GIL; a
//! done callback (for asyncio) is called from the SDK's I/O thread with the GIL taken.
//! Entries into a guarded buffer (a torch tensor, see `buffers`) land in the buffer's
//! shadow and are copied into the buffer by the call that reports them landed.

use crate::buffers::Held as Registered;
use crate::{block, error, rt};
use ctxpod_client::transfer_client::{BlockState, Progress};
use ctxpod_client::transfer_pod::{PodSubscription, PodTicket};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// An entry's state as an int: bytes landed (≥ 0), a negative status for a miss (-404 not
/// found, -503 busy, -504 past the deadline, -499 cancelled, -413 larger than its room,
/// -422 corrupt), -1 lost (the connection closed), or `None` still pending.
fn code(s: BlockState) -> Option<i64> {
    match s {
        BlockState::Pending => None,
        BlockState::Landed { len } => Some(len as i64),
        BlockState::Missed { status } => Some(-(status as i64)),
        BlockState::Corrupt => Some(-422),
        BlockState::Lost => Some(-1),
    }
}

pub(crate) fn codes(p: &Progress) -> Vec<Option<i64>> {
    p.blocks.iter().copied().map(code).collect()
}

fn timeout(seconds: Option<f64>) -> PyResult<Option<Duration>> {
    match seconds {
        None => Ok(None),
        Some(s) if s.is_finite() && s >= 0.0 => Ok(Some(Duration::from_secs_f64(s))),
        Some(s) => Err(crate::invalid(format!(
            "timeout {s}: a number of seconds, ≥ 0"
        ))),
    }
}

/// An entry of a ticket into a guarded buffer: it lands in the buffer's shadow at
/// `offset` and is copied to the same offset of the buffer.
pub(crate) struct Landing {
    pub(crate) entry: usize,
    pub(crate) offset: usize,
    pub(crate) held: Arc<Registered>,
}

/// A ticket's entries into guarded buffers not copied into them yet.
#[derive(Default)]
pub(crate) struct Landings {
    pending: Mutex<Pending>,
}

#[derive(Default)]
struct Pending {
    left: Vec<Landing>,
    /// Why the copy was refused (a buffer moved): every later call raises it again.
    refused: Option<String>,
}

impl Landings {
    pub(crate) fn new(left: Vec<Landing>) -> Landings {
        Landings {
            pending: Mutex::new(Pending {
                left,
                refused: None,
            }),
        }
    }

    /// The lock, taken without holding the GIL while waiting for it (a holder may run the
    /// guard's Python check, which lets other threads take the GIL).
    fn lock(&self, py: Python<'_>) -> MutexGuard<'_, Pending> {
        loop {
            if let Ok(g) = self.pending.try_lock() {
                return g;
            }
            py.detach(std::thread::yield_now);
        }
    }

    /// Copies every landed entry not copied yet from its shadow into its buffer, each
    /// buffer checked first (once per call): `InvalidRequest` if one moved, with nothing
    /// written into it. Called before the ticket's ranges are given back.
    pub(crate) fn land(&self, py: Python<'_>, t: &PodTicket) -> PyResult<()> {
        let mut p = self.lock(py);
        if let Some(why) = &p.refused {
            return Err(crate::invalid(why));
        }
        if p.left.is_empty() {
            return Ok(());
        }
        let now = t.poll();
        let mut checked: Vec<u32> = Vec::new();
        let mut i = 0;
        while i < p.left.len() {
            let l = &p.left[i];
            match now.blocks.get(l.entry) {
                Some(BlockState::Landed { .. }) => {}
                Some(BlockState::Pending) => {
                    i += 1;
                    continue;
                }
                // Missed, lost or corrupt: nothing to copy, ever.
                _ => {
                    p.left.swap_remove(i);
                    continue;
                }
            }
            let Some(bytes) = t.data(l.entry) else {
                i += 1;
                continue;
            };
            if !checked.contains(&l.held.id) {
                if let Err(e) = l.held.check(py) {
                    p.refused = Some(e.value(py).str()?.to_string());
                    return Err(e);
                }
                checked.push(l.held.id);
            }
            // SAFETY: checked above in this call, with the GIL held; the block fits its
            // entry (the node refuses one larger than its room).
            unsafe { l.held.place(l.offset, bytes) };
            p.left.swap_remove(i);
        }
        Ok(())
    }

    /// Whether every entry into a guarded buffer was copied.
    fn done(&self, py: Python<'_>) -> bool {
        self.lock(py).left.is_empty()
    }
}

/// Once a ticket is done its ranges are given back ([`PodTicket::release`]): in Python a
/// landing buffer is reused by the next prefetch while the finished ticket object may
/// still be alive (`t = store.prefetch(...)` in a loop). Entries into guarded buffers are
/// copied first (the shadow's bytes are the ticket's until then).
fn settled(py: Python<'_>, t: &PodTicket, l: &Landings, p: Progress) -> PyResult<Progress> {
    l.land(py, t)?;
    if p.done && l.done(py) {
        t.release();
    }
    Ok(p)
}

/// A ticket that is dropped inside the runtime, so that its cancel reaches the nodes.
pub(crate) struct Held(Option<Arc<PodTicket>>);

impl Held {
    pub(crate) fn new(t: PodTicket) -> Held {
        Held(Some(Arc::new(t)))
    }

    pub(crate) fn get(&self) -> &Arc<PodTicket> {
        self.0.as_ref().expect("a live ticket")
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let _in_runtime = rt().enter();
        self.0.take();
    }
}

#[pyclass(frozen, name = "_Ticket", module = "ctxpod._ctxpod")]
pub struct Ticket {
    pub(crate) inner: Held,
    pub(crate) landings: Landings,
}

#[pymethods]
impl Ticket {
    fn __len__(&self) -> usize {
        self.inner.get().len()
    }

    /// Waits until every entry landed or missed (or `timeout` seconds); per entry, its code.
    #[pyo3(signature = (timeout_s=None))]
    fn wait(&self, py: Python<'_>, timeout_s: Option<f64>) -> PyResult<Vec<Option<i64>>> {
        let t = self.inner.get().clone();
        let limit = timeout(timeout_s)?;
        let t2 = t.clone();
        let p = block(py, async move {
            match limit {
                Some(d) => t2.wait_for(d).await,
                None => t2.wait().await,
            }
        });
        Ok(codes(&settled(py, &t, &self.landings, p)?))
    }

    /// Waits for entry `i` (or `timeout` seconds); its code.
    #[pyo3(signature = (i, timeout_s=None))]
    fn wait_for(&self, py: Python<'_>, i: usize, timeout_s: Option<f64>) -> PyResult<Option<i64>> {
        let t = self.inner.get().clone();
        if i >= t.len() {
            return Err(crate::invalid(format!(
                "entry {i} of a ticket of {}",
                t.len()
            )));
        }
        let limit = timeout(timeout_s)?;
        let t2 = t.clone();
        let s = block(py, async move {
            match limit {
                Some(d) => tokio::time::timeout(d, t2.block(i))
                    .await
                    .unwrap_or(BlockState::Pending),
                None => t2.block(i).await,
            }
        });
        self.landings.land(py, &t)?;
        Ok(code(s))
    }

    /// The codes now, without waiting.
    fn poll(&self, py: Python<'_>) -> PyResult<Vec<Option<i64>>> {
        let t = self.inner.get();
        Ok(codes(&settled(py, t, &self.landings, t.poll())?))
    }

    /// Whether every member has finished (no more pushes).
    fn ready(&self, py: Python<'_>) -> PyResult<bool> {
        let t = self.inner.get();
        Ok(settled(py, t, &self.landings, t.poll())?.done)
    }

    /// (landed, missed, done).
    fn progress(&self, py: Python<'_>) -> PyResult<(u32, u32, bool)> {
        let t = self.inner.get();
        let p = settled(py, t, &self.landings, t.poll())?;
        Ok((p.landed, p.missed, p.done))
    }

    /// Asks the nodes to stop: entries not pushed yet miss (-499).
    fn cancel(&self, py: Python<'_>) -> PyResult<()> {
        let t = self.inner.get().clone();
        block(py, async move { t.cancel().await }).map_err(error)
    }

    /// Calls `callback()` (from the SDK's I/O thread) once the ticket is done.
    fn on_done(&self, callback: Py<PyAny>) {
        let t = self.inner.get().clone();
        rt().spawn(async move {
            t.wait().await;
            drop(t);
            Python::attach(|py| {
                if let Err(e) = callback.call0(py) {
                    e.write_unraisable(py, None);
                }
            });
        });
    }
}

/// The KV events of a namespace, from every member.
#[pyclass(frozen, name = "_Events", module = "ctxpod._ctxpod")]
pub struct Events {
    sub: Arc<tokio::sync::Mutex<Option<PodSubscription>>>,
}

impl Events {
    pub(crate) fn new(s: PodSubscription) -> Events {
        Events {
            sub: Arc::new(tokio::sync::Mutex::new(Some(s))),
        }
    }
}

type Batch<'py> = (u64, Vec<(&'static str, Bound<'py, PyBytes>)>);

#[pymethods]
impl Events {
    /// The next batch: (events lost before it, [(kind, key)]); `None` at `timeout`
    /// seconds; raises `ctxpod.errors.Ended` once the stream ended.
    #[pyo3(signature = (timeout_s=None))]
    fn next<'py>(&self, py: Python<'py>, timeout_s: Option<f64>) -> PyResult<Option<Batch<'py>>> {
        let sub = self.sub.clone();
        let limit = timeout(timeout_s)?;
        let got = block(py, async move {
            let mut g = sub.lock().await;
            let Some(s) = g.as_mut() else {
                return Err(());
            };
            let next = match limit {
                Some(d) => match tokio::time::timeout(d, s.next()).await {
                    Ok(n) => n,
                    Err(_) => return Ok(None),
                },
                None => s.next().await,
            };
            match next {
                Some(b) => Ok(Some(b)),
                None => {
                    g.take();
                    Err(())
                }
            }
        });
        match got {
            Ok(None) => Ok(None),
            Ok(Some(b)) => Ok(Some((
                b.lost,
                b.events
                    .iter()
                    .map(|(k, key)| (k.name(), PyBytes::new(py, key)))
                    .collect(),
            ))),
            Err(()) => Err(crate::raise("Ended", "the event stream ended", None)),
        }
    }

    /// Ends the subscription on every member.
    fn close(&self, py: Python<'_>) {
        let sub = self.sub.clone();
        block(py, async move {
            sub.lock().await.take();
        });
    }
}
