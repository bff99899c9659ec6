//! `_L2`: the I/O of LMCache's `native_plugin` L2 adapter, in Rust. Each `submit_*` checks
//! its arguments, takes the caller's buffers (their exports kept until the work is done)
//! and returns a future id at once; the work runs on the SDK's runtime, and its completion
//! is queued and signalled on a socket the adapter polls (`event_fd`), so no Python thread
//! waits on the network. `drain` takes the completions and clears the signal.
//!
//! Completions are LMCache's: `(future id, ok, error, per-key results or None)`.

use crate::buffers::{self, Keep};
use crate::store::{durability, lent, Store};
use crate::{invalid, rt};
use bytes::Bytes;
use ctxpod_client::transfer_client::TransferError;
use ctxpod_client::transfer_pod::TransferPod;
use pyo3::prelude::*;
use std::collections::HashSet;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Submissions in flight at once; more are refused (LMCache's adapter retries later).
const IN_FLIGHT_MAX: u64 = 1024;

type Completion = (u64, bool, String, Option<Vec<bool>>);

struct Shared {
    pod: Arc<TransferPod>,
    done: Mutex<Vec<Completion>>,
    /// Written one byte per completion; the adapter polls the other end.
    signal: Mutex<UnixStream>,
    /// Namespaces known to exist (made on first use).
    ready: Mutex<HashSet<String>>,
    in_flight: AtomicU64,
    replication: Option<u32>,
}

impl Shared {
    fn finish(&self, c: Completion) {
        self.done.lock().expect("completions").push(c);
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        // A full socket buffer already holds a signal: nothing is lost by dropping this one.
        let _ = self.signal.lock().expect("signal").write(&[1]);
    }

    /// Makes `ns` if the pod does not have it (once per namespace and client).
    async fn ensure(&self, ns: &str) -> Result<(), TransferError> {
        if self.ready.lock().expect("namespaces").contains(ns) {
            return Ok(());
        }
        let settings = ctxpod_wire::types::CreateNamespace {
            replication: self.replication,
            ..Default::default()
        };
        let known = self
            .pod
            .on_any_member(|c| async move { c.namespace(ns).await })
            .await;
        match known {
            Ok(_) => {}
            Err(TransferError::Http(e)) if e.status() == Some(404) => {
                let settings = &settings;
                self.pod
                    .on_any_member(|c| async move { c.create_namespace_with(ns, settings).await })
                    .await?;
            }
            Err(e) => return Err(e),
        }
        self.ready
            .lock()
            .expect("namespaces")
            .insert(ns.to_string());
        Ok(())
    }

    /// The namespaces of a batch, each made if missing: why not, or "" when they are.
    async fn ensure_all(&self, spaces: &[String]) -> String {
        let mut seen = HashSet::new();
        for ns in spaces {
            if seen.insert(ns) {
                if let Err(e) = self.ensure(ns).await {
                    return e.to_string();
                }
            }
        }
        String::new()
    }
}

/// Entry indices grouped by namespace, in first-seen order.
fn by_namespace(spaces: &[String]) -> Vec<(String, Vec<usize>)> {
    let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
    for (i, ns) in spaces.iter().enumerate() {
        match groups.iter_mut().find(|(n, _)| n == ns) {
            Some((_, idx)) => idx.push(i),
            None => groups.push((ns.clone(), vec![i])),
        }
    }
    groups
}

#[pyclass(frozen, name = "_L2", module = "ctxpod._ctxpod")]
pub struct L2 {
    shared: Arc<Shared>,
    /// The end the adapter polls.
    wake: UnixStream,
    next: AtomicU64,
}

impl L2 {
    /// Runs `work` on the SDK's runtime under a new future id, its outcome queued and
    /// signalled as that id's completion; the id, at once.
    fn run<F, Fut>(&self, n: usize, what: &str, work: F) -> PyResult<u64>
    where
        F: FnOnce(Arc<Shared>) -> Fut,
        Fut: std::future::Future<Output = (String, Option<Vec<bool>>)> + Send + 'static,
    {
        let id = self.start(n, what)?;
        let sh = self.shared.clone();
        let fut = work(sh.clone());
        rt().spawn(async move {
            let (error, per_key) = fut.await;
            sh.finish((id, error.is_empty(), error, per_key));
        });
        Ok(id)
    }

    fn start(&self, n: usize, what: &str) -> PyResult<u64> {
        if self.shared.in_flight.fetch_add(1, Ordering::Relaxed) >= IN_FLIGHT_MAX {
            self.shared.in_flight.fetch_sub(1, Ordering::Relaxed);
            return Err(crate::error(TransferError::Refused {
                status: 503,
                message: format!(
                    "busy: {IN_FLIGHT_MAX} L2 submissions in flight ({what} of {n} keys refused)"
                ),
            }));
        }
        Ok(self.next.fetch_add(1, Ordering::Relaxed))
    }
}

fn check_lengths(spaces: &[String], keys: &[Vec<u8>], bufs: usize) -> PyResult<()> {
    if spaces.len() != keys.len() || keys.len() != bufs {
        return Err(invalid(format!(
            "{} namespaces, {} keys and {bufs} buffers: one of each per entry",
            spaces.len(),
            keys.len()
        )));
    }
    Ok(())
}

#[pymethods]
impl L2 {
    /// An L2 client over `store`'s connections; namespaces it makes get `replication`.
    #[new]
    #[pyo3(signature = (store, replication=None))]
    fn new(store: &Store, replication: Option<u32>) -> PyResult<L2> {
        let (wake, signal) =
            UnixStream::pair().map_err(|e| invalid(format!("the completion socket: {e}")))?;
        for s in [&wake, &signal] {
            s.set_nonblocking(true)
                .map_err(|e| invalid(format!("the completion socket: {e}")))?;
        }
        Ok(L2 {
            shared: Arc::new(Shared {
                pod: store.pod(),
                done: Mutex::new(Vec::new()),
                signal: Mutex::new(signal),
                ready: Mutex::new(HashSet::new()),
                in_flight: AtomicU64::new(0),
                replication,
            }),
            wake,
            next: AtomicU64::new(1),
        })
    }

    /// The file descriptor that becomes readable when completions are queued.
    fn event_fd(&self) -> i32 {
        self.wake.as_raw_fd()
    }

    /// Reads each entry's block into its writable buffer; per key, whether it landed whole
    /// (a miss, a block of another size, a refusal: false).
    fn submit_get(
        &self,
        spaces: Vec<String>,
        keys: Vec<Vec<u8>>,
        bufs: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<u64> {
        check_lengths(&spaces, &keys, bufs.len())?;
        let mut spans = Vec::with_capacity(bufs.len());
        for b in &bufs {
            let (ptr, len, export) = buffers::writable(b)?;
            spans.push((ptr, len, Keep::Export(export)));
        }
        self.run(keys.len(), "get", move |sh| async move {
            let mut found = vec![false; keys.len()];
            let mut error = sh.ensure_all(&spaces).await;
            for (ns, idx) in by_namespace(&spaces) {
                if !error.is_empty() {
                    break;
                }
                let ks: Vec<Bytes> = idx.iter().map(|&i| Bytes::from(keys[i].clone())).collect();
                match sh.pod.get(&ns, &ks).await {
                    Ok(got) => {
                        for (&i, g) in idx.iter().zip(got) {
                            let (ptr, len, _) = &spans[i];
                            if let Ok(Some(b)) = g {
                                if b.len() == *len {
                                    // SAFETY: `ptr` is `len` writable bytes of the buffer
                                    // export held in `spans` until this task ends; LMCache
                                    // does not touch the buffer until the completion.
                                    unsafe {
                                        std::ptr::copy_nonoverlapping(
                                            b.as_ptr(),
                                            *ptr as *mut u8,
                                            *len,
                                        )
                                    };
                                    found[i] = true;
                                }
                            }
                        }
                    }
                    Err(e) => error = e.to_string(),
                }
            }
            drop(spans);
            (error, Some(found))
        })
    }

    /// Stores each buffer's bytes under its key; ok when every one is held.
    #[pyo3(signature = (spaces, keys, bufs, durable=false))]
    fn submit_set(
        &self,
        spaces: Vec<String>,
        keys: Vec<Vec<u8>>,
        bufs: Vec<Bound<'_, PyAny>>,
        durable: bool,
    ) -> PyResult<u64> {
        check_lengths(&spaces, &keys, bufs.len())?;
        let mut values = Vec::with_capacity(bufs.len());
        for b in &bufs {
            let (ptr, len, export) = buffers::readable(b)?;
            values.push(lent(ptr, len, Keep::Export(export)));
        }
        let how = durability(durable);
        self.run(keys.len(), "set", move |sh| async move {
            let mut error = sh.ensure_all(&spaces).await;
            for (ns, idx) in by_namespace(&spaces) {
                if !error.is_empty() {
                    break;
                }
                let blocks: Vec<(Bytes, Bytes)> = idx
                    .iter()
                    .map(|&i| (Bytes::from(keys[i].clone()), values[i].clone()))
                    .collect();
                match sh.pod.put(&ns, &blocks, how).await {
                    // 409: the key holds other bytes of the same chunk, computed earlier.
                    Ok(sts) => {
                        if let Some(st) = sts.iter().find(|&&s| !matches!(s, 200 | 201 | 409)) {
                            error = format!("ctxpod refused a chunk with {st}");
                        }
                    }
                    Err(e) => error = e.to_string(),
                }
            }
            drop(values);
            (error, None)
        })
    }

    /// Whether each key is held.
    fn submit_exists(&self, spaces: Vec<String>, keys: Vec<Vec<u8>>) -> PyResult<u64> {
        check_lengths(&spaces, &keys, keys.len())?;
        self.run(keys.len(), "exists", move |sh| async move {
            let mut held = vec![false; keys.len()];
            let mut error = String::new();
            for (ns, idx) in by_namespace(&spaces) {
                let ks: Vec<Bytes> = idx.iter().map(|&i| Bytes::from(keys[i].clone())).collect();
                match sh.pod.exists(&ns, &ks).await {
                    Ok(h) => idx.iter().zip(h).for_each(|(&i, h)| held[i] = h),
                    // A namespace nobody made yet holds nothing.
                    Err(TransferError::Refused { status: 404, .. }) => {}
                    Err(e) => error = e.to_string(),
                }
            }
            (error, Some(held))
        })
    }

    /// Deletes each key from the pod; per key, whether a member held it.
    fn submit_delete(&self, spaces: Vec<String>, keys: Vec<Vec<u8>>) -> PyResult<u64> {
        check_lengths(&spaces, &keys, keys.len())?;
        self.run(keys.len(), "delete", move |sh| async move {
            let mut gone = vec![false; keys.len()];
            let mut error = String::new();
            for (i, (ns, k)) in spaces.iter().zip(&keys).enumerate() {
                match sh.pod.delete(ns, k).await {
                    Ok(g) => gone[i] = g,
                    Err(e) => error = e.to_string(),
                }
            }
            (error, Some(gone))
        })
    }

    /// The completions queued since the last call; clears the signal first, so one that
    /// lands meanwhile signals again.
    fn drain(&self) -> Vec<Completion> {
        let mut sink = [0u8; 256];
        while matches!((&self.wake).read(&mut sink), Ok(n) if n > 0) {}
        std::mem::take(&mut *self.shared.done.lock().expect("completions"))
    }

    /// Submissions not yet completed.
    fn in_flight(&self) -> u64 {
        self.shared.in_flight.load(Ordering::Relaxed)
    }
}
