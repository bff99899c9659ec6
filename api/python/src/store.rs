//! `_Store`: one pod (or node) connection set. Arguments arrive normalised by the Python
//! layer (`ctxpod/_store.py`): keys as `bytes`, namespaces as `str`, values as
//! buffer-protocol objects, pointers as `int`s. Per-entry outcomes come back as HTTP-like
//! statuses; whole-call failures as `ctxpod.errors` exceptions.

use crate::buffers::{self, Buffer, Held as Registered, Keep, Registry};
use crate::ticket::{Events, Held, Landing, Landings, Ticket};
use crate::{block, error, invalid};
use bytes::Bytes;
use ctxpod_client::connect::Connect;
use ctxpod_client::transfer_client::{PrefetchOptions, TransferError};
use ctxpod_client::transfer_pod::TransferPod;
use ctxpod_wire::proto::{Durability, Policy, PrefetchEntry};
use pyo3::buffer::PyUntypedBuffer;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::sync::Arc;
use std::time::Duration;

#[pyclass(frozen, name = "_Store", module = "ctxpod._ctxpod")]
pub struct Store {
    pod: Arc<TransferPod>,
    buffers: Registry,
}

/// A block's bytes borrowed in place (no copy) from a Python buffer export or a registered
/// region, let go when the last `Bytes` referring to it goes.
struct Lent {
    ptr: usize,
    len: usize,
    _keep: Keep,
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `_keep` holds the export or the registered buffer (a range checked by
        // `Registry::find`, and for a guarded buffer by its check, in this call) that keeps
        // these bytes valid; the caller does not write them during the call
        // (docs/PYTHON.md, "Buffer lifetime rules").
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }
}

/// A read into registered memory whose rooms add up to at most this many bytes takes the
/// GET path ([`Store::get_into_registered`]); larger ones are prefetches. Measured with
/// `bench/sdk_bench.py` at 64 KiB (docs/PERFORMANCE.md, issue #35's third session): GET
/// and copy ahead at batch 1 (+26 %) and 16 (+7 %), behind at 32 (2 MiB: −17 %), where
/// the prefetch's landing in place without a copy pays for its extra frames.
pub(crate) const GET_PATH_BYTES_MAX: usize = 1 << 20;

type NsInfo = (
    String,
    Option<u64>,
    Option<u32>,
    u64,
    u64,
    &'static str,
    Option<&'static str>,
    u64,
    u64,
);

fn ns_info(i: ctxpod_wire::types::NamespaceInfo) -> NsInfo {
    (
        i.name,
        i.quota_bytes,
        i.replication,
        i.used_bytes,
        i.block_count,
        i.class.as_str(),
        i.compression.map(|c| c.as_str()),
        i.compressed_bytes,
        i.compressed_stored_bytes,
    )
}

/// `len` bytes at `ptr`, kept valid by `keep`, as `Bytes` (no copy).
pub(crate) fn lent(ptr: usize, len: usize, keep: Keep) -> Bytes {
    Bytes::from_owner(Lent {
        ptr,
        len,
        _keep: keep,
    })
}

pub(crate) fn durability(durable: bool) -> Durability {
    if durable {
        Durability::Durable
    } else {
        Durability::Fast
    }
}

fn keys_of(keys: Vec<Vec<u8>>) -> Vec<Bytes> {
    keys.into_iter().map(Bytes::from).collect()
}

/// A per-entry outcome as an int: bytes (≥ 0) or a negative status.
fn neg(status: u16) -> i64 {
    -(status as i64)
}

fn status_of(e: &TransferError) -> u16 {
    match e {
        TransferError::Refused { status, .. } => *status,
        TransferError::Corrupt(_) => 422,
        TransferError::TooLarge { .. } => 413,
        _ => 503,
    }
}

/// The most direct connections a store opens per member (`Store.connect`).
pub(crate) const DIRECT_CONNECTIONS_MAX: usize = 64;

#[pymethods]
impl Store {
    /// Connects through any of `seeds` (node URLs); TLS when a CA file is given. Deadlines
    /// in seconds (`None`: the client's defaults, `ctxpod_client::connect::Deadlines`).
    #[staticmethod]
    #[pyo3(signature = (seeds, token=None, ca_file=None, cert_file=None, key_file=None,
        connect_timeout=None, request_timeout=None, down_for=None, direct_connections=None))]
    #[allow(clippy::too_many_arguments)]
    fn connect(
        py: Python<'_>,
        seeds: Vec<String>,
        token: Option<String>,
        ca_file: Option<std::path::PathBuf>,
        cert_file: Option<std::path::PathBuf>,
        key_file: Option<std::path::PathBuf>,
        connect_timeout: Option<f64>,
        request_timeout: Option<f64>,
        down_for: Option<f64>,
        direct_connections: Option<usize>,
    ) -> PyResult<Store> {
        let identity = match (&cert_file, &key_file) {
            (Some(c), Some(k)) => Some((c.as_path(), k.as_path())),
            (None, None) => None,
            _ => return Err(invalid("cert_file and key_file go together (mTLS)")),
        };
        if identity.is_some() && ca_file.is_none() {
            return Err(invalid("a client certificate needs ca_file (TLS) too"));
        }
        let mut how = Connect::from_files(token, ca_file.as_deref(), identity)
            .map_err(|e| invalid(e.to_string()))?;
        let d = &mut how.deadlines;
        for (name, given, slot) in [
            ("connect_timeout", connect_timeout, &mut d.connect),
            ("request_timeout", request_timeout, &mut d.request),
            ("down_for", down_for, &mut d.down_for),
        ] {
            if let Some(secs) = given {
                *slot = std::time::Duration::try_from_secs_f64(secs)
                    .ok()
                    .filter(|t| !t.is_zero() && t.as_secs() <= 3600)
                    .ok_or_else(|| {
                        invalid(format!(
                            "{name} must be a number of seconds above 0 and at most 3600; got {secs}"
                        ))
                    })?;
            }
        }
        if let Some(n) = direct_connections {
            if n > DIRECT_CONNECTIONS_MAX {
                return Err(invalid(format!(
                    "direct_connections must be at most {DIRECT_CONNECTIONS_MAX}; got {n}"
                )));
            }
            how.direct_connections = n;
        }
        let pod = block(py, TransferPod::connect(&seeds, &how)).map_err(error)?;
        Ok(Store {
            pod: Arc::new(pod),
            buffers: Registry::default(),
        })
    }

    /// The pod's members: (id, http, transfer, state).
    fn members(&self) -> Vec<(String, String, Option<String>, String)> {
        self.pod
            .http()
            .members()
            .into_iter()
            .map(|m| (m.id, m.http, m.transfer, m.state))
            .collect()
    }

    /// The largest value every reachable member stores (bytes; the least of their
    /// `value_bytes_max`).
    fn value_bytes_max(&self, py: Python<'_>) -> PyResult<u64> {
        let pod = self.pod.clone();
        block(py, async move { pod.value_bytes_max().await }).map_err(error)
    }

    /// Copies of each block of `ns` (R).
    fn replication(&self, py: Python<'_>, ns: String) -> usize {
        let pod = self.pod.clone();
        block(py, async move { pod.http().replication_of(&ns).await })
    }

    /// Creates namespace `ns` (or sets these settings on it): (name, quota_bytes,
    /// replication, used_bytes, block_count, class, compression, compressed_bytes,
    /// compressed_stored_bytes). `namespace_class` (`kv`, `weights`) is the class of a
    /// namespace this creates; an existing one keeps its own. `compression` (`lz4`, `zstd`)
    /// compresses blocks as they move to a node's dense tier.
    #[pyo3(signature = (ns, quota_bytes=None, replication=None, namespace_class=None, compression=None))]
    fn create_namespace(
        &self,
        py: Python<'_>,
        ns: String,
        quota_bytes: Option<u64>,
        replication: Option<u32>,
        namespace_class: Option<String>,
        compression: Option<String>,
    ) -> PyResult<NsInfo> {
        let pod = self.pod.clone();
        let class = namespace_class
            .map(|c| c.parse::<ctxpod_wire::types::NamespaceClass>())
            .transpose()
            .map_err(pyo3::exceptions::PyValueError::new_err)?;
        let compression = compression
            .map(|c| c.parse::<ctxpod_wire::types::Compression>())
            .transpose()
            .map_err(pyo3::exceptions::PyValueError::new_err)?;
        let settings = ctxpod_wire::types::CreateNamespace {
            quota_bytes,
            replication,
            class,
            compression,
        };
        let i = block(py, async move {
            pod.on_any_member(|c| {
                let (ns, settings) = (ns.clone(), settings.clone());
                async move { c.create_namespace_with(&ns, &settings).await }
            })
            .await
        })
        .map_err(error)?;
        Ok(ns_info(i))
    }

    /// The namespace's settings and usage.
    fn namespace_info(&self, py: Python<'_>, ns: String) -> PyResult<NsInfo> {
        let pod = self.pod.clone();
        let i = block(py, async move {
            pod.on_any_member(|c| {
                let ns = ns.clone();
                async move { c.namespace(&ns).await }
            })
            .await
        })
        .map_err(error)?;
        Ok(ns_info(i))
    }

    /// The caller's namespaces (its tenant's), with their settings and usage.
    fn namespaces(&self, py: Python<'_>) -> PyResult<Vec<NsInfo>> {
        let pod = self.pod.clone();
        let l = block(py, async move {
            pod.on_any_member(|c| async move { c.namespaces().await })
                .await
        })
        .map_err(error)?;
        Ok(l.namespaces.into_iter().map(ns_info).collect())
    }

    /// Deletes the namespace and every block in it.
    fn delete_namespace(&self, py: Python<'_>, ns: String) -> PyResult<()> {
        let pod = self.pod.clone();
        block(py, async move {
            pod.on_any_member(|c| {
                let ns = ns.clone();
                async move { c.delete_namespace(&ns).await }
            })
            .await
        })
        .map_err(error)
    }

    /// Reads the membership again.
    fn refresh(&self, py: Python<'_>) -> PyResult<()> {
        let pod = self.pod.clone();
        block(py, async move { pod.refresh().await }).map_err(error)
    }

    /// The CXP1 addresses of the members `key` lives on, best first.
    fn ranked(&self, ns: &str, key: Vec<u8>) -> Vec<String> {
        self.pod.ranked(ns, &key)
    }

    /// Stores `values[i]` under `keys[i]` (buffers are read in place); per entry, its status.
    fn put(
        &self,
        py: Python<'_>,
        ns: String,
        keys: Vec<Vec<u8>>,
        values: Vec<Bound<'_, PyAny>>,
        durable: bool,
    ) -> PyResult<Vec<u16>> {
        if keys.len() != values.len() {
            return Err(invalid(format!(
                "{} keys but {} values",
                keys.len(),
                values.len()
            )));
        }
        let mut blocks = Vec::with_capacity(keys.len());
        for (k, v) in keys.into_iter().zip(&values) {
            let (ptr, len, export) = buffers::readable(v)?;
            blocks.push((Bytes::from(k), lent(ptr, len, Keep::Export(export))));
        }
        self.store(py, ns, blocks, durable)
    }

    /// Stores `sizes[i]` bytes at `ptrs[i]` (inside registered buffers) under `keys[i]`.
    fn put_from(
        &self,
        py: Python<'_>,
        ns: String,
        keys: Vec<Vec<u8>>,
        ptrs: Vec<usize>,
        sizes: Vec<usize>,
        durable: bool,
    ) -> PyResult<Vec<u16>> {
        same_lengths(&keys, &ptrs, &sizes)?;
        let mut blocks = Vec::with_capacity(keys.len());
        let mut checked: Vec<u32> = Vec::new();
        for ((k, ptr), len) in keys.into_iter().zip(ptrs).zip(sizes) {
            let (held, _) = self.buffers.find_checked(py, ptr, len, &mut checked)?;
            blocks.push((Bytes::from(k), lent(ptr, len, Keep::Held(held))));
        }
        self.store(py, ns, blocks, durable)
    }

    /// Per key: (200, bytes), (404, None), or (status, None) for a refused entry.
    fn get<'py>(
        &self,
        py: Python<'py>,
        ns: String,
        keys: Vec<Vec<u8>>,
    ) -> PyResult<Vec<(u16, Option<Bound<'py, PyBytes>>)>> {
        let pod = self.pod.clone();
        let keys = keys_of(keys);
        let got = block(py, async move { pod.get(&ns, &keys).await }).map_err(error)?;
        Ok(got
            .into_iter()
            .map(|e| match e {
                Ok(Some(b)) => (200, Some(PyBytes::new(py, &b))),
                Ok(None) => (404, None),
                Err(e) => (status_of(&e), None),
            })
            .collect())
    }

    /// Reads each block into a writable buffer: per entry, the bytes written, or a negative
    /// status (-404 a miss, -413 the buffer is too small: nothing written).
    fn get_into(
        &self,
        py: Python<'_>,
        ns: String,
        keys: Vec<Vec<u8>>,
        targets: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<Vec<i64>> {
        if keys.len() != targets.len() {
            return Err(invalid(format!(
                "{} keys but {} buffers",
                keys.len(),
                targets.len()
            )));
        }
        let mut spans: Vec<(usize, usize)> = Vec::with_capacity(targets.len());
        let mut exports: Vec<PyUntypedBuffer> = Vec::with_capacity(targets.len());
        for t in &targets {
            let (ptr, len, export) = buffers::writable(t)?;
            spans.push((ptr, len));
            exports.push(export);
        }
        let out = self.read_into(py, ns, keys, spans);
        drop(exports);
        out
    }

    /// [`Store::get_into`] into registered memory, with (pointer, size) pairs: a prefetch
    /// with no lease, each block pushed from the socket straight into its place (no copy);
    /// a call whose rooms add up to at most [`GET_PATH_BYTES_MAX`] is a GET and a copy
    /// instead ([`Store::get_into_registered`]). Per entry: the bytes landed, or a negative
    /// status.
    fn get_into_ptrs(
        &self,
        py: Python<'_>,
        ns: String,
        keys: Vec<Vec<u8>>,
        ptrs: Vec<usize>,
        sizes: Vec<usize>,
    ) -> PyResult<Vec<i64>> {
        same_lengths(&keys, &ptrs, &sizes)?;
        let room = sizes.iter().fold(0usize, |a, &s| a.saturating_add(s));
        if room <= GET_PATH_BYTES_MAX {
            return self.get_into_registered(py, ns, keys, ptrs, sizes);
        }
        let (entries, landings) = self.entries(py, keys, ptrs, sizes)?;
        let opts = PrefetchOptions {
            policy: Policy::WaitComplete,
            deadline: None,
            lease: Duration::ZERO,
        };
        let pod = self.pod.clone();
        let t = block(py, async move {
            let t = pod.prefetch(&ns, entries, opts).await?;
            t.wait().await;
            Ok::<_, TransferError>(t)
        })
        .map_err(error)?;
        let t = Held::new(t);
        // Blocks for a guarded buffer (a torch tensor) are copied in here, after its check.
        landings.land(py, t.get())?;
        let codes = crate::ticket::codes(&t.get().poll());
        Ok(codes.into_iter().map(|c| c.unwrap_or(-1)).collect())
    }

    /// Whether each key is held.
    fn exists(&self, py: Python<'_>, ns: String, keys: Vec<Vec<u8>>) -> PyResult<Vec<bool>> {
        let pod = self.pod.clone();
        let keys = keys_of(keys);
        block(py, async move { pod.exists(&ns, &keys).await }).map_err(error)
    }

    /// Leading keys of the chain held.
    fn match_prefix(&self, py: Python<'_>, ns: String, keys: Vec<Vec<u8>>) -> PyResult<u32> {
        let pod = self.pod.clone();
        let keys = keys_of(keys);
        block(py, async move { pod.match_prefix(&ns, &keys).await }).map_err(error)
    }

    fn pin(&self, py: Python<'_>, ns: String, keys: Vec<Vec<u8>>, ttl_ms: u64) -> PyResult<u32> {
        let pod = self.pod.clone();
        let keys = keys_of(keys);
        let ttl = Duration::from_millis(ttl_ms);
        block(py, async move { pod.pin(&ns, &keys, ttl).await }).map_err(error)
    }

    fn unpin(&self, py: Python<'_>, ns: String, keys: Vec<Vec<u8>>) -> PyResult<u32> {
        let pod = self.pod.clone();
        let keys = keys_of(keys);
        block(py, async move { pod.unpin(&ns, &keys).await }).map_err(error)
    }

    /// Moves the keys to the fast tier of every member holding them (the HTTP door, which
    /// answers for the pod), at most a batch of keys per request: (moved now, in the fast
    /// tier now).
    fn promote(&self, py: Python<'_>, ns: String, keys: Vec<Vec<u8>>) -> PyResult<(u64, u64)> {
        let pod = self.pod.clone();
        block(py, async move {
            let (mut promoted, mut fast) = (0, 0);
            for chunk in keys.chunks(ctxpod_wire::BATCH_ENTRIES_MAX) {
                let r = pod
                    .on_any_member(|c| {
                        let (ns, chunk) = (ns.clone(), chunk.to_vec());
                        async move { c.promote(&ns, &chunk).await }
                    })
                    .await?;
                promoted += r.promoted;
                fast += r.fast;
            }
            Ok((promoted, fast))
        })
        .map_err(error)
    }

    /// Deletes each key from the pod; per key, whether a member held it.
    fn remove(&self, py: Python<'_>, ns: String, keys: Vec<Vec<u8>>) -> PyResult<Vec<bool>> {
        let pod = self.pod.clone();
        block(py, async move {
            let mut out = Vec::with_capacity(keys.len());
            for k in &keys {
                out.push(pod.delete(&ns, k).await?);
            }
            Ok(out)
        })
        .map_err(error)
    }

    /// One page of the namespace's keys across the pod: keys starting with `prefix`, after
    /// `after`, at most `limit`; and the `after` of the next page, if there may be one.
    #[allow(clippy::type_complexity)]
    fn list_keys<'py>(
        &self,
        py: Python<'py>,
        ns: String,
        prefix: Vec<u8>,
        after: Option<Vec<u8>>,
        limit: usize,
    ) -> PyResult<(Vec<Bound<'py, PyBytes>>, Option<Bound<'py, PyBytes>>)> {
        let pod = self.pod.clone();
        let page = block(py, async move {
            pod.list_keys(&ns, &prefix, after.as_deref(), limit).await
        })
        .map_err(error)?;
        Ok((
            page.keys.iter().map(|k| PyBytes::new(py, k)).collect(),
            page.next.map(|n| PyBytes::new(py, &n)),
        ))
    }

    /// Registers memory: a writable buffer-protocol object (`obj`, with `ptr` None: its
    /// buffer export is held, so it cannot be resized while registered), or `size` bytes at
    /// `ptr` kept alive by a reference to `obj` (a torch tensor and its storage; for a bare
    /// pointer `obj` is None and the caller keeps the memory valid until it is unregistered
    /// and every ticket into it is done). `guard` is `(kind, check)` for memory its owner
    /// can move anyway (a torch tensor): `check()` answers None while the memory is where
    /// it was registered, else what changed; the pod then pushes into the SDK's memory and
    /// the calls that report entries landed copy them in, after the check.
    #[pyo3(signature = (obj, ptr=None, size=None, guard=None))]
    fn register(
        &self,
        obj: &Bound<'_, PyAny>,
        ptr: Option<usize>,
        size: Option<usize>,
        guard: Option<(String, Py<PyAny>)>,
    ) -> PyResult<Buffer> {
        let (ptr, size, keep) = match (ptr, size) {
            (None, None) => {
                let (p, s, export) = buffers::writable(obj)?;
                (p, s, Keep::Export(export))
            }
            (Some(p), Some(s)) => (p, s, Keep::Object(obj.clone().unbind())),
            _ => return Err(invalid("give both ptr and size, or neither")),
        };
        let held = Arc::new(Registered::new(ptr, size, keep, guard)?);
        self.buffers.add(&held)?;
        Ok(Buffer {
            id: held.id,
            ptr,
            size,
            held: std::sync::Mutex::new(Some(held)),
        })
    }

    /// Stops using a buffer: no new call may name it; prefetches in flight still land.
    fn unregister(&self, py: Python<'_>, buffer: &Buffer) -> PyResult<bool> {
        let was = self.buffers.remove(buffer.id);
        let Some(held) = buffer.held.lock().expect("buffer").take() else {
            return Ok(was);
        };
        let pod = self.pod.clone();
        // The buffer is dropped on the runtime: the last reference may be this one, and
        // its keep-alive (the buffer export) is released there with the GIL taken.
        block(py, async move {
            let mut r = Ok(false);
            for region in held.regions() {
                r = r.and(pod.unregister_region(&region).await);
            }
            drop(held);
            r
        })
        .map_err(error)?;
        Ok(was)
    }

    /// Registered buffers now.
    fn buffers(&self) -> usize {
        self.buffers.len()
    }

    /// Pushes each (key, ptr, size) entry into registered memory; a ticket at once.
    #[pyo3(signature = (ns, keys, ptrs, sizes, policy, deadline_ms, lease_ms))]
    #[allow(clippy::too_many_arguments)]
    fn prefetch(
        &self,
        py: Python<'_>,
        ns: String,
        keys: Vec<Vec<u8>>,
        ptrs: Vec<usize>,
        sizes: Vec<usize>,
        policy: &str,
        deadline_ms: Option<u64>,
        lease_ms: u64,
    ) -> PyResult<Ticket> {
        same_lengths(&keys, &ptrs, &sizes)?;
        let policy = Policy::parse(policy).ok_or_else(|| {
            invalid(format!(
                "policy {policy:?}: one of best_effort, wait_complete, timeout"
            ))
        })?;
        if policy == Policy::Timeout && deadline_ms.is_none() {
            return Err(invalid("the timeout policy needs deadline_ms"));
        }
        if lease_ms > ctxpod_wire::PREFETCH_LEASE_MS_MAX {
            return Err(invalid(format!(
                "lease_ms is at most {}",
                ctxpod_wire::PREFETCH_LEASE_MS_MAX
            )));
        }
        let (entries, landings) = self.entries(py, keys, ptrs, sizes)?;
        let opts = PrefetchOptions {
            policy,
            deadline: deadline_ms.map(Duration::from_millis),
            lease: Duration::from_millis(lease_ms),
        };
        let pod = self.pod.clone();
        let t = block(py, async move { pod.prefetch(&ns, entries, opts).await }).map_err(error)?;
        Ok(Ticket {
            inner: Held::new(t),
            landings,
        })
    }

    /// KV events of `ns`, from every member.
    fn subscribe(&self, py: Python<'_>, ns: String) -> PyResult<Events> {
        let pod = self.pod.clone();
        let s = block(py, async move { pod.subscribe(&ns).await }).map_err(error)?;
        Ok(Events::new(s))
    }

    /// Requests sent again because a node answered BUSY.
    fn busy_retries(&self, py: Python<'_>) -> u64 {
        let pod = self.pod.clone();
        block(py, async move { pod.busy_retries().await })
    }

    /// Calls answered on the calling thread (over a direct connection).
    fn direct_calls(&self) -> u64 {
        self.pod.direct_calls()
    }
}

impl Store {
    /// The pod client (shared with the L2 adapter's client).
    pub(crate) fn pod(&self) -> Arc<TransferPod> {
        self.pod.clone()
    }

    /// Puts blocks whose bytes are lent in place, with the GIL released.
    fn store(
        &self,
        py: Python<'_>,
        ns: String,
        blocks: Vec<(Bytes, Bytes)>,
        durable: bool,
    ) -> PyResult<Vec<u16>> {
        let pod = self.pod.clone();
        block(py, async move {
            pod.put(&ns, &blocks, durability(durable)).await
        })
        .map_err(error)
    }

    /// Prefetch entries for (key, pointer, size) triples, each inside a registered buffer,
    /// and the entries into guarded buffers (each checked once here: a moved one is refused
    /// with nothing sent), which land in the buffer's shadow and are copied in later.
    #[allow(clippy::type_complexity)]
    fn entries(
        &self,
        py: Python<'_>,
        keys: Vec<Vec<u8>>,
        ptrs: Vec<usize>,
        sizes: Vec<usize>,
    ) -> PyResult<(
        Vec<(ctxpod_client::region::Region, PrefetchEntry)>,
        Landings,
    )> {
        let mut entries = Vec::with_capacity(keys.len());
        let mut landings = Vec::new();
        let mut checked: Vec<u32> = Vec::new();
        for (i, ((k, p), s)) in keys.into_iter().zip(ptrs).zip(sizes).enumerate() {
            let max_len = u32::try_from(s)
                .map_err(|_| invalid(format!("an entry of {s} bytes is over 4 GiB")))?;
            let (held, offset) = self.buffers.find_checked(py, p, s, &mut checked)?;
            entries.push((
                held.target().clone(),
                PrefetchEntry {
                    key: Bytes::from(k),
                    offset: offset as u64,
                    max_len,
                },
            ));
            if held.guarded() {
                landings.push(Landing {
                    entry: i,
                    offset,
                    held,
                });
            }
        }
        Ok((entries, Landings::new(landings)))
    }

    /// The GET path of [`Store::get_into_ptrs`]: each span checked against the registered
    /// buffers (and a guarded buffer's memory) as a prefetch's is, one batch GET, then,
    /// with the GIL back, every guarded buffer checked again (a moved one refused with
    /// nothing written into any buffer) and each block copied into its place. For small
    /// reads this is one frame each way and one wake-up of this thread, where a prefetch
    /// is three frames from the node and two wake-ups (docs/PERFORMANCE.md, "The Python
    /// SDK"); the copy costs little at these sizes.
    fn get_into_registered(
        &self,
        py: Python<'_>,
        ns: String,
        keys: Vec<Vec<u8>>,
        ptrs: Vec<usize>,
        sizes: Vec<usize>,
    ) -> PyResult<Vec<i64>> {
        let mut checked: Vec<u32> = Vec::new();
        let places = ptrs
            .iter()
            .zip(&sizes)
            .map(|(&p, &s)| self.buffers.find_checked(py, p, s, &mut checked))
            .collect::<PyResult<Vec<_>>>()?;
        let pod = self.pod.clone();
        let keys = keys_of(keys);
        let got = block(py, async move { pod.get(&ns, &keys).await }).map_err(error)?;
        let mut rechecked: Vec<u32> = Vec::new();
        for (held, _) in places.iter().filter(|(h, _)| h.guarded()) {
            if !rechecked.contains(&held.id) {
                held.check(py)?;
                rechecked.push(held.id);
            }
        }
        Ok(got
            .into_iter()
            .zip(places)
            .zip(sizes)
            .map(|((e, (held, offset)), room)| {
                // SAFETY: `[offset, offset + room)` is inside the registered buffer
                // (`find_checked`), which `held` keeps registered; a guarded one was
                // checked just now with the GIL held.
                placed(e, room, |b| unsafe { held.place(offset, b) })
            })
            .collect())
    }

    /// GETs `keys` and copies each block into its (address, length) span.
    fn read_into(
        &self,
        py: Python<'_>,
        ns: String,
        keys: Vec<Vec<u8>>,
        spans: Vec<(usize, usize)>,
    ) -> PyResult<Vec<i64>> {
        let pod = self.pod.clone();
        let keys = keys_of(keys);
        block(py, async move {
            let got = pod.get(&ns, &keys).await?;
            Ok(got
                .into_iter()
                .zip(spans)
                .map(|(e, (ptr, len))| {
                    // SAFETY: `ptr` is `len` writable bytes of a buffer export (or a
                    // registered region) the caller holds for the call.
                    placed(e, len, |b| unsafe {
                        std::ptr::copy_nonoverlapping(b.as_ptr(), ptr as *mut u8, b.len())
                    })
                })
                .collect())
        })
        .map_err(error)
    }
}

/// One GET's entry placed into a room of `room` bytes by `place` (given the block's bytes
/// only when they fit): the bytes written, or a negative status (nothing written).
fn placed(e: Result<Option<Bytes>, TransferError>, room: usize, place: impl FnOnce(&[u8])) -> i64 {
    match e {
        Ok(Some(b)) if b.len() <= room => {
            place(&b);
            b.len() as i64
        }
        Ok(Some(_)) => neg(413),
        Ok(None) => neg(404),
        Err(e) => neg(status_of(&e)),
    }
}

/// Fails unless keys, pointers and sizes pair up one to one.
fn same_lengths(keys: &[Vec<u8>], ptrs: &[usize], sizes: &[usize]) -> PyResult<()> {
    if keys.len() != ptrs.len() || keys.len() != sizes.len() {
        return Err(invalid("keys, ptrs and sizes must have the same length"));
    }
    Ok(())
}
