//! Caller memory as CXP1 regions. A registered buffer is a [`Region`] over the Python
//! object's own bytes, kept alive (with its buffer export, so a `bytearray` or a numpy
//! array cannot be resized under it) until the region, every connection it is registered
//! on and every ticket into it are done with it. Pointers handed to the raw-pointer calls
//! are checked against the registered buffers, so a pointer into memory never registered,
//! or unregistered since, is refused before anything is read or written.
//!
//! Memory whose owner can move or free it under any reference the SDK could hold (a torch
//! tensor: `resize_` reallocates its storage in place and frees the old bytes, `set_`
//! swaps the storage, `share_memory_` moves it) is *guarded*: the pod pushes its blocks
//! into the SDK's own memory (the buffer's shadow, a region of the same size), and the
//! caller's calls that report an entry landed copy it into the buffer, with the GIL held,
//! right after checking that the memory is still where it was registered. So the SDK's
//! I/O threads never write such memory, and a moved buffer is refused (`InvalidRequest`,
//! naming the buffer and what changed) with nothing written.

use ctxpod_client::region::Region;
use pyo3::buffer::PyUntypedBuffer;
use pyo3::prelude::*;
use std::sync::{Arc, Mutex};

/// What keeps lent memory alive: the buffer export, a reference to the object (a torch
/// tensor and its storage, given as a pointer and size), or the registered buffer the
/// bytes are in.
pub(crate) enum Keep {
    Export(#[allow(dead_code)] PyUntypedBuffer),
    Object(#[allow(dead_code)] Py<PyAny>),
    Held(#[allow(dead_code)] Arc<Held>),
}

/// How a guarded buffer is checked, and where its blocks land first.
pub(crate) struct Guard {
    /// What the memory is ("a torch tensor"), for messages.
    kind: String,
    /// `check()`: `None` while the memory is where it was registered, else a `str` saying
    /// what changed. It holds the memory's owner (the tensor's storage) alive.
    check: Py<PyAny>,
    /// The SDK's memory the pod pushes this buffer's blocks into, at the same offsets.
    shadow: Region,
}

/// One registered buffer: where it is, its region, and its guard (if its owner can move
/// it).
pub(crate) struct Held {
    pub(crate) id: u32,
    pub(crate) ptr: usize,
    pub(crate) size: usize,
    pub(crate) region: Region,
    guard: Option<Guard>,
}

impl Held {
    pub(crate) fn new(
        ptr: usize,
        size: usize,
        keep: Keep,
        guard: Option<(String, Py<PyAny>)>,
    ) -> PyResult<Held> {
        let region = region(ptr, size, keep)?;
        let guard = match guard {
            None => None,
            Some((kind, check)) => Some(Guard {
                kind,
                check,
                // Zeroed with calloc: pages cost nothing until a block lands in them.
                shadow: Region::from_vec(vec![0u8; size])
                    .map_err(|e| crate::invalid(e.to_string()))?,
            }),
        };
        Ok(Held {
            id: region.id(),
            ptr,
            size,
            region,
            guard,
        })
    }

    /// The region the pod pushes this buffer's blocks into: its shadow when guarded.
    pub(crate) fn target(&self) -> &Region {
        match &self.guard {
            Some(g) => &g.shadow,
            None => &self.region,
        }
    }

    pub(crate) fn guarded(&self) -> bool {
        self.guard.is_some()
    }

    /// The regions to unregister from the connections.
    pub(crate) fn regions(&self) -> Vec<Region> {
        let mut r = vec![self.region.clone()];
        if let Some(g) = &self.guard {
            r.push(g.shadow.clone());
        }
        r
    }

    /// Refused (`InvalidRequest`) if a guarded buffer's memory is no longer where it was
    /// registered.
    pub(crate) fn check(&self, py: Python<'_>) -> PyResult<()> {
        let Some(g) = &self.guard else {
            return Ok(());
        };
        let said = g.check.bind(py).call0()?;
        if said.is_none() {
            return Ok(());
        }
        Err(crate::invalid(format!(
            "buffer {} ({} of {} bytes at {:#x}): {}; nothing was written into it \
             (unregister it, and register the memory where it is now)",
            self.id,
            g.kind,
            self.size,
            self.ptr,
            said.str()?
        )))
    }

    /// Copies a block into the buffer at `offset`: one landed in the shadow, or one read
    /// by a GET.
    ///
    /// # Safety
    /// For a guarded buffer, [`Held::check`] passed in this call with the GIL held, so the
    /// memory is where it was registered (its owner, held by the guard, keeps it
    /// allocated); `bytes` is at most the room of the entry at `offset`.
    pub(crate) unsafe fn place(&self, offset: usize, bytes: &[u8]) {
        debug_assert!(offset + bytes.len() <= self.size);
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), (self.ptr + offset) as *mut u8, bytes.len());
    }
}

/// A registered buffer: its memory (until unregistered: then it is let go once the
/// tickets into it are done) and where it is.
#[pyclass(frozen, module = "ctxpod._ctxpod")]
pub struct Buffer {
    pub(crate) held: Mutex<Option<Arc<Held>>>,
    #[pyo3(get)]
    pub(crate) id: u32,
    #[pyo3(get)]
    pub(crate) ptr: usize,
    #[pyo3(get)]
    pub(crate) size: usize,
}

#[pymethods]
impl Buffer {
    fn __repr__(&self) -> String {
        format!(
            "<ctxpod Buffer {} of {} bytes at {:#x}>",
            self.id, self.size, self.ptr
        )
    }

    /// Whether the pod pushes into the SDK's memory first (a torch tensor: its blocks are
    /// copied in by the calls that report them landed).
    #[getter]
    fn guarded(&self) -> bool {
        self.held
            .lock()
            .expect("buffer")
            .as_ref()
            .is_some_and(|h| h.guarded())
    }
}

/// Writable, C-contiguous memory of a buffer-protocol object: (address, length, export).
pub(crate) fn writable(obj: &Bound<'_, PyAny>) -> PyResult<(usize, usize, PyUntypedBuffer)> {
    let b = PyUntypedBuffer::get(obj)?;
    if b.readonly() {
        return Err(crate::invalid(
            "the buffer is read-only: give a writable one (bytearray, numpy array, …)",
        ));
    }
    if !b.is_c_contiguous() {
        return Err(crate::invalid("the buffer is not C-contiguous"));
    }
    Ok((b.buf_ptr() as usize, b.len_bytes(), b))
}

/// Readable, C-contiguous memory of a buffer-protocol object.
pub(crate) fn readable(obj: &Bound<'_, PyAny>) -> PyResult<(usize, usize, PyUntypedBuffer)> {
    let b = PyUntypedBuffer::get(obj)?;
    if !b.is_c_contiguous() {
        return Err(crate::invalid("the buffer is not C-contiguous"));
    }
    Ok((b.buf_ptr() as usize, b.len_bytes(), b))
}

/// Makes a region over lent memory.
fn region(ptr: usize, size: usize, keep: Keep) -> PyResult<Region> {
    // SAFETY: the memory is the Python object's, valid for `size` bytes while `keep` (its
    // buffer export, or a reference to it and its storage) lives, which the region holds
    // until its last use; memory its owner can move anyway (a torch tensor) is guarded,
    // and only ever written after a check, in the caller's own call (module docs). A raw
    // `(ptr, size)` is valid for as long as the caller keeps it (docs/PYTHON.md,
    // "Buffer lifetime rules"). The SDK's rules ask the caller not to write a range while
    // a prefetch into it is in flight, nor read it before its entry landed.
    unsafe { Region::from_raw(ptr as *mut u8, size, Box::new(keep)) }
        .map_err(|e| crate::invalid(e.to_string()))
}

/// A store's registered buffers (the mutex is held for lookups only).
#[derive(Default)]
pub(crate) struct Registry {
    /// In no order.
    held: Mutex<Vec<Arc<Held>>>,
}

impl Registry {
    /// Adds a buffer; refused if it overlaps one already registered (two regions over
    /// the same bytes would let two prefetches write them at once).
    pub(crate) fn add(&self, h: &Arc<Held>) -> PyResult<()> {
        let mut held = self.held.lock().expect("registry");
        let (s, e) = (h.ptr, h.ptr + h.size);
        if let Some(o) = held.iter().find(|o| s < o.ptr + o.size && o.ptr < e) {
            return Err(crate::invalid(format!(
                "{} bytes at {s:#x} overlap buffer {} ({} bytes at {:#x}): unregister it first",
                h.size, o.id, o.size, o.ptr
            )));
        }
        held.push(h.clone());
        Ok(())
    }

    /// Removes the buffer with this id; false if it was not registered.
    pub(crate) fn remove(&self, id: u32) -> bool {
        let mut held = self.held.lock().expect("registry");
        let before = held.len();
        held.retain(|h| h.id != id);
        held.len() != before
    }

    /// The registered buffer holding `[ptr, ptr + size)`, and the offset in it.
    /// [`Registry::find`], and the buffer's guard checked once per call (`checked` holds
    /// the ids already checked): a moved tensor is refused before anything is sent.
    pub(crate) fn find_checked(
        &self,
        py: Python<'_>,
        ptr: usize,
        size: usize,
        checked: &mut Vec<u32>,
    ) -> PyResult<(Arc<Held>, usize)> {
        let (held, offset) = self.find(ptr, size)?;
        if !checked.contains(&held.id) {
            held.check(py)?;
            checked.push(held.id);
        }
        Ok((held, offset))
    }

    pub(crate) fn find(&self, ptr: usize, size: usize) -> PyResult<(Arc<Held>, usize)> {
        let held = self.held.lock().expect("registry");
        let end = ptr
            .checked_add(size)
            .ok_or_else(|| crate::invalid("pointer overflow"))?;
        held.iter()
            .find(|h| h.ptr <= ptr && end <= h.ptr + h.size)
            .map(|h| (h.clone(), ptr - h.ptr))
            .ok_or_else(|| {
                crate::invalid(format!(
                    "{size} bytes at {ptr:#x} are not inside a registered buffer (register_buffer first; \
                     a buffer unregistered since is no longer usable)"
                ))
            })
    }

    pub(crate) fn len(&self) -> usize {
        self.held.lock().expect("registry").len()
    }
}
