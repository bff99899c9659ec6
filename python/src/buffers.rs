//! Caller memory as CXP1 regions: a registered buffer is a [`Region`] over the Python
//! object's own bytes, kept alive (with its buffer export, so a `bytearray` cannot be
//! resized under it) until the region, every connection it is registered on and every
//! ticket into it are done with it. Pointers handed to the raw-pointer calls are checked
//! against the registered buffers, so a pointer into memory never registered, or
//! unregistered since, is refused before anything is read or written.

use ctxpod_client::region::Region;
use pyo3::buffer::PyUntypedBuffer;
use pyo3::prelude::*;
use std::sync::Mutex;

/// What keeps lent memory alive: the buffer export, a reference to the object (a torch
/// tensor, given as a pointer and size), or the registered region the bytes are in.
pub(crate) enum Keep {
    Export(#[allow(dead_code)] PyUntypedBuffer),
    Object(#[allow(dead_code)] Py<PyAny>),
    Region(#[allow(dead_code)] Region),
}

/// A registered buffer: its region (until unregistered: then the memory is let go once
/// the tickets into it are done) and where it is.
#[pyclass(frozen, module = "ctxpod._ctxpod")]
pub struct Buffer {
    pub(crate) region: Mutex<Option<Region>>,
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
pub(crate) fn region(ptr: usize, size: usize, keep: Keep) -> PyResult<Region> {
    // SAFETY: the memory is the Python object's, valid for `size` bytes while `keep` (its
    // buffer export or a reference to it) lives, which the region holds until its last
    // use. The SDK's rules (docs/PYTHON.md, "Buffers") ask the caller not to write to a
    // range while a prefetch into it is in flight, nor read it before its entry landed.
    unsafe { Region::from_raw(ptr as *mut u8, size, Box::new(keep)) }
        .map_err(|e| crate::invalid(e.to_string()))
}

/// A store's registered buffers (the mutex is held for lookups only).
#[derive(Default)]
pub(crate) struct Registry {
    /// (start, end, region), in no order.
    held: Mutex<Vec<(usize, usize, Region)>>,
}

impl Registry {
    /// Adds a buffer; refused if it overlaps one already registered (two regions over
    /// the same bytes would let two prefetches write them at once).
    pub(crate) fn add(&self, b: &Buffer, region: &Region) -> PyResult<()> {
        let mut held = self.held.lock().expect("registry");
        let (s, e) = (b.ptr, b.ptr + b.size);
        if let Some((hs, he, r)) = held.iter().find(|(hs, he, _)| s < *he && *hs < e) {
            return Err(crate::invalid(format!(
                "{} bytes at {s:#x} overlap buffer {} ({} bytes at {hs:#x}): unregister it first",
                b.size,
                r.id(),
                he - hs
            )));
        }
        held.push((s, e, region.clone()));
        Ok(())
    }

    /// Removes the buffer with this region id; false if it was not registered.
    pub(crate) fn remove(&self, id: u32) -> bool {
        let mut held = self.held.lock().expect("registry");
        let before = held.len();
        held.retain(|(_, _, r)| r.id() != id);
        held.len() != before
    }

    /// The registered buffer holding `[ptr, ptr + size)`: its region and the offset.
    pub(crate) fn find(&self, ptr: usize, size: usize) -> PyResult<(Region, u64)> {
        let held = self.held.lock().expect("registry");
        let end = ptr
            .checked_add(size)
            .ok_or_else(|| crate::invalid("pointer overflow"))?;
        held.iter()
            .find(|(s, e, _)| *s <= ptr && end <= *e)
            .map(|(s, _, r)| (r.clone(), (ptr - s) as u64))
            .ok_or_else(|| {
                crate::invalid(format!(
                    "{size} bytes at {ptr:#x} are not inside a registered buffer (register_buffer first; \
                     a buffer unregistered since is no longer usable)"
                ))
            })
    }

    pub(crate) fn all(&self) -> Vec<Region> {
        self.held
            .lock()
            .expect("registry")
            .iter()
            .map(|(_, _, r)| r.clone())
            .collect()
    }
}
