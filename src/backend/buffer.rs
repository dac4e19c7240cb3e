//! Owned buffers: the one buffer model of every backend.
//!
//! # Why this module exists
//!
//! A tokenizer's hot loop wants buffers that free themselves. [`DeviceBuffer`] owns its
//! memory and frees it on `Drop`. The memory sits behind an `Arc` that every submitted
//! dispatch in flight and every [`DispatchGraph`] using it also holds, so dropping a
//! buffer while the device still reads it only drops one reference: the memory is freed
//! (`cuMemFree`, context bound) when the last user — the pending dispatch's `wait`, or
//! the graph's drop, both after their synchronize — lets go. (A blocking `run` or
//! `run_into` takes no reference: the request borrows the buffer until the
//! call returns, after its synchronize.) Use after free and double free cannot be written in safe code: a binding
//! borrows the buffer (`&DeviceBuffer`), and `Drop` runs once. (The
//! generation-checked `ResidentBuffer` handles that came before, whose misuse was an
//! `Err` at run time, are gone: no caller needed a `Copy` handle.)
//!
//! The same type serves the reference interpreter ([`AnyBackend`](super::AnyBackend)
//! without a GPU), whose buffers are host memory that keeps its bytes between
//! dispatches exactly as device memory does, so code written once binds the same
//! buffers on both.
//!
//! Host data is typed: uploads take `&[T]` and reads return `Vec<T>` for any
//! plain-old-data `T` (`bytemuck::Pod`: `u8`, `u32`, `f32`, arrays of them, …), little
//! endian as the device sees them, without `unsafe` in the caller.
//!
//! **Outputs that need no copy.** [`CudaBackend::host_mapped_buffer`] makes a
//! `DeviceBuffer` whose bytes live in page-locked host memory mapped into the
//! device's address space: a kernel bound to it stores straight into host memory, so
//! a variable-length output (a pre-tokenizer's piece starts) reaches the host with
//! the dispatch's one synchronize and no copy, sized by nothing the host must know
//! first. Measured on the H200 (2026-12-01): a kernel writing 256 KiB into mapped
//! memory takes 15 µs per dispatch with its launch and synchronize, 1 MiB 30 µs,
//! against 17 / 32 µs for one DMA copy of the same bytes after the kernel (which
//! also needs its size on the host before it is enqueued).
//! [`DeviceBuffer::mapped_bytes`] reads it in place once nothing in flight holds it.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use bytemuck::Pod;

use super::cuda::BackendInner;
use super::dispatch::Transfer;
use super::driver::{DeviceMemory, MappedMemory, PinnedMemory};
use super::graph::DispatchGraph;
use super::reference_backend::{HostMemory, ReferenceInner};
use super::{BackendError, Binding, CudaBackend};

/// Memory owned by the caller, freed on `Drop`: device memory of a
/// [`CudaBackend`], host-mapped memory ([`CudaBackend::host_mapped_buffer`]), or
/// the reference interpreter's host memory. Starts zeroed. Bind it with
/// [`Binding::Buffer`] (or `Binding::from(&buffer)`).
///
/// Stream-ordered and safe while in flight: the memory sits behind an `Arc` that
/// every submitted dispatch in flight and every graph using it also holds (a
/// blocking dispatch borrows the buffer until it returns), so dropping the buffer
/// while the device still reads it only drops one reference; the memory is freed
/// when the last holder lets go, after its synchronize. Use after free and
/// double free cannot be written in safe code (bindings borrow the buffer).
pub struct DeviceBuffer {
    pub(in crate::backend) storage: Storage,
    pub(in crate::backend) bytes: u64,
}

/// Where a buffer's bytes live.
pub(in crate::backend) enum Storage {
    /// CUDA memory (`Some` until drop) of the backend `backend`.
    Cuda {
        memory: Option<Arc<DeviceMemory>>,
        backend: Arc<BackendInner>,
    },
    /// The reference interpreter's host memory.
    Reference(Arc<HostMemory>),
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let backend = match &self.storage {
            Storage::Cuda { backend, .. } => format!("CUDA #{}", backend.id),
            Storage::Reference(memory) => format!("reference #{}", memory.owner.id),
        };
        f.debug_struct("DeviceBuffer")
            .field("bytes", &self.bytes)
            .field("backend", &backend)
            .finish()
    }
}

impl DeviceBuffer {
    /// Size in bytes.
    pub fn len(&self) -> u64 {
        self.bytes
    }

    /// True for a zero-byte buffer.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// The binding of this buffer (a cheap borrowed view).
    pub fn binding(&self) -> Binding<'_> {
        Binding::Buffer(self)
    }

    /// True when the bytes live in host-mapped memory
    /// ([`CudaBackend::host_mapped_buffer`]).
    pub fn is_host_mapped(&self) -> bool {
        self.host_mapped().is_some()
    }

    /// The host-mapped memory of a CUDA buffer (`None` in device or reference
    /// memory). Reading it is for those who know nothing can write it.
    fn host_mapped(&self) -> Option<&MappedMemory> {
        match &self.storage {
            Storage::Cuda {
                memory: Some(memory),
                ..
            } => memory.host_mapped(),
            _ => None,
        }
    }

    /// The bytes of a host-mapped buffer, read in place (no copy, no driver call).
    /// `&mut self`: no dispatch can bind the buffer while the view lives.
    ///
    /// An `Err` starting `Fix:` for a buffer in device (or reference) memory (read
    /// it with the backend's `read`), and while anything else holds the buffer's
    /// memory: a [`PendingDispatch`](super::PendingDispatch) not yet waited for (the
    /// device may still be writing, so the bytes could be torn) or a
    /// [`DispatchGraph`] that binds it (it holds the memory for its whole life; see
    /// [`DeviceBuffer::mapped_bytes_beside`]).
    pub fn mapped_bytes(&mut self) -> Result<&[u8], BackendError> {
        self.mapped_bytes_mut().map(|bytes| &*bytes)
    }

    /// [`DeviceBuffer::mapped_bytes`], writable (to set inputs a kernel reads in
    /// place, or clear an output). Refused the same way while a dispatch in flight
    /// or a graph holds the buffer.
    pub fn mapped_bytes_mut(&mut self) -> Result<&mut [u8], BackendError> {
        let len = self.bytes as usize;
        let memory = self.mapped_memory()?;
        match Arc::get_mut(memory).and_then(DeviceMemory::host_mapped_mut) {
            Some(mapped) => Ok(mapped.slice_mut(0, len)),
            None => Err(still_held("reading or writing it in place")),
        }
    }

    /// The bytes of a host-mapped buffer that `graph` binds, read in place: the
    /// graph holds the buffer's memory for its whole life, so
    /// [`DeviceBuffer::mapped_bytes`] refuses while it lives; this view is for the
    /// owner of both, between replays. While the view lives, `&mut self` keeps any
    /// dispatch from binding the buffer and `&graph` keeps the graph from replaying
    /// (a replay needs `&mut`, and a submitted replay borrows the graph until its
    /// wait), so nothing can write the bytes under the view.
    ///
    /// An `Err` starting `Fix:` for a buffer in device memory, and when anything
    /// besides this buffer and `graph` holds its memory (a pending dispatch not yet
    /// waited for, or another graph).
    pub fn mapped_bytes_beside<'a>(
        &'a mut self,
        graph: &'a DispatchGraph,
    ) -> Result<&'a [u8], BackendError> {
        let len = self.bytes as usize;
        let mapped = self.mapped_beside(graph, "reading it in place")?;
        Ok(mapped.slice(0, len))
    }

    /// [`DeviceBuffer::mapped_bytes_beside`], writable: the inputs a graph's
    /// kernels read in place (a short text, its length), set between replays.
    /// `&mut graph` proves no replay is running or submitted (a submitted replay
    /// borrows its graph until its wait), and `&mut self` keeps any dispatch from
    /// binding the buffer while the view lives; so the graph's hold on the memory
    /// is only a hold, and nothing reads or writes the bytes but the view.
    ///
    /// The same `Fix:` errors as [`DeviceBuffer::mapped_bytes_beside`].
    pub fn mapped_bytes_mut_beside<'a>(
        &'a mut self,
        graph: &'a mut DispatchGraph,
    ) -> Result<&'a mut [u8], BackendError> {
        graph.mapped_bytes_mut_of(self)
    }

    /// The mapped memory, checked to be held by nothing but this buffer and
    /// `graph` (the `Fix:` error says what else may hold it, for `to`).
    pub(in crate::backend) fn mapped_beside(
        &mut self,
        graph: &DispatchGraph,
        to: &str,
    ) -> Result<&MappedMemory, BackendError> {
        let memory = self.mapped_memory()?;
        if Arc::strong_count(memory) != 1 + graph.holdings_of(memory) {
            return Err(held_besides(to));
        }
        memory.host_mapped().ok_or_else(not_mapped)
    }

    /// The words of a host-mapped buffer as atomics that the host shares with
    /// running kernels: flags a kernel polls (`Node::AcquireLoad` in its program)
    /// while the host publishes them, with a release store, during a replay or a
    /// dispatch in flight; `len() / 4` words (a trailing partial word left out).
    /// `&self` is enough, even while a graph binds the buffer or a dispatch runs
    /// over it: every host access through the view is atomic, and the views that
    /// read or write the bytes plainly take `&mut self` or the buffer itself, so
    /// none can live beside this one. What a word reads while a kernel writes it
    /// plainly is some value the kernel stored there.
    ///
    /// An `Err` starting `Fix:` for a buffer in device (or reference) memory.
    pub fn host_words(&self) -> Result<&[AtomicU32], BackendError> {
        let mapped = self.host_mapped().ok_or_else(not_mapped)?;
        let words = (self.bytes as usize).min(mapped.len()) / 4;
        // SAFETY: `words` 4-byte words from the allocation's start lie inside it
        // (bounded by its length), aligned (host-mapped memory is page-aligned), and
        // valid for as long as `&self` (the memory is freed only after this buffer
        // and every holder let go of it). Every host access to them while the slice
        // lives is atomic: the plain views (`mapped_bytes*`, `into_mapped_view`,
        // `DispatchGraph::replay_feeding`) need `&mut self` or `self`, which this
        // borrow excludes, and no other `DeviceBuffer` owns the memory. The device's
        // accesses are outside the host's memory model, as the lane's mapped words
        // are (`backend::lane`); `AtomicU32` has `u32`'s size and bit validity.
        Ok(unsafe { std::slice::from_raw_parts(mapped.host_address() as *const AtomicU32, words) })
    }

    /// The buffer, taken out of every dispatch's reach, as a view of its bytes
    /// that reads in place through `&self` ([`MappedView`]): for a result that
    /// keeps a kernel's output where the kernel wrote it, and reads it from
    /// several threads, without a copy. [`MappedView::into_buffer`] gives the
    /// buffer back.
    ///
    /// `Err` with the buffer, unchanged, and a `Fix:` error for a buffer in device
    /// (or reference) memory, and while anything else holds its memory (a
    /// [`PendingDispatch`](super::PendingDispatch) not yet waited for, a
    /// [`DispatchGraph`] that binds it), as [`DeviceBuffer::mapped_bytes`].
    #[allow(clippy::result_large_err)] // the buffer comes back with the reason
    pub fn into_mapped_view(mut self) -> Result<MappedView, (DeviceBuffer, BackendError)> {
        let exclusive = match self.mapped_memory() {
            Ok(memory) => Arc::get_mut(memory).is_some(),
            Err(error) => return Err((self, error)),
        };
        if !exclusive {
            return Err((self, still_held("taking it into a MappedView")));
        }
        Ok(MappedView { buffer: self })
    }

    /// The host-mapped memory of this buffer, or the `Fix:` error saying it is not.
    fn mapped_memory(&mut self) -> Result<&mut Arc<DeviceMemory>, BackendError> {
        match &mut self.storage {
            Storage::Cuda {
                memory: Some(memory),
                ..
            } if memory.host_mapped().is_some() => Ok(memory),
            Storage::Cuda { memory: None, .. } => Err(gone()),
            _ => Err(not_mapped()),
        }
    }

    /// The CUDA memory, checked to belong to `inner`'s backend.
    #[inline]
    pub(in crate::backend) fn memory_for(
        &self,
        inner: &BackendInner,
        verb: &str,
    ) -> Result<&Arc<DeviceMemory>, BackendError> {
        match &self.storage {
            Storage::Cuda { memory, backend } if backend.id == inner.id => {
                memory.as_ref().ok_or_else(gone)
            }
            _ => Err(foreign_buffer(verb)),
        }
    }

    /// The reference memory, checked to belong to `owner`.
    pub(in crate::backend) fn host_for(
        &self,
        owner: &ReferenceInner,
        verb: &str,
    ) -> Result<&Arc<HostMemory>, BackendError> {
        match &self.storage {
            Storage::Reference(memory) if memory.owner.id == owner.id => Ok(memory),
            _ => Err(foreign_buffer(verb)),
        }
    }

    /// The ordinal of the CUDA device the memory lives on (`None` for reference
    /// memory).
    pub(in crate::backend) fn device_ordinal(&self) -> Option<usize> {
        match &self.storage {
            Storage::Cuda { backend, .. } => Some(backend.caps.ordinal),
            Storage::Reference(_) => None,
        }
    }
}

/// A host-mapped [`DeviceBuffer`] that no dispatch can bind, read in place through
/// `&self` ([`DeviceBuffer::into_mapped_view`]).
///
/// Why: [`DeviceBuffer::mapped_bytes`] takes `&mut self`, because a dispatch binds
/// a buffer through `&DeviceBuffer` and could write it under a shared view. A result
/// that keeps a kernel's output where the kernel wrote it (a tokenizer's ids, read
/// document by document, from any thread) needs `&self` access instead; holding the
/// buffer by value and never lending it out gives that: nothing can bind the memory
/// while the view lives, and nothing held it when the view was made.
pub struct MappedView {
    buffer: DeviceBuffer,
}

impl std::fmt::Debug for MappedView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedView")
            .field("bytes", &self.buffer.bytes)
            .finish()
    }
}

impl MappedView {
    /// The buffer's bytes, in place (no copy, no driver call).
    pub fn bytes(&self) -> &[u8] {
        // `into_mapped_view` takes host-mapped CUDA memory only.
        self.buffer.host_mapped().map_or(&[][..], |mapped| {
            mapped.slice(0, self.buffer.bytes as usize)
        })
    }

    /// Size in bytes.
    pub fn len(&self) -> u64 {
        self.buffer.bytes
    }

    /// True for a zero-byte view.
    pub fn is_empty(&self) -> bool {
        self.buffer.bytes == 0
    }

    /// The buffer again, for dispatches to bind (its bytes unchanged).
    pub fn into_buffer(self) -> DeviceBuffer {
        self.buffer
    }
}

/// The `Fix:` error for a buffer (or kernel, or pending dispatch) made by another
/// backend; the same text on every backend.
pub(in crate::backend) fn foreign_buffer(verb: &str) -> BackendError {
    BackendError::InvalidHandle {
        message: format!(
            "Fix: cannot {verb} a DeviceBuffer of another backend; use the backend that allocated it"
        ),
    }
}

/// The `Fix:` error for a host-mapped buffer that a dispatch in flight or a graph
/// still holds, refused before `to` (what the caller asked for).
/// The `Fix:` error for a buffer that something besides the given graph holds
/// (a dispatch in flight, another graph), for `to`.
pub(in crate::backend) fn held_besides(to: &str) -> BackendError {
    BackendError::bad_input(format!(
        "Fix: this host-mapped DeviceBuffer is held by a dispatch in flight or by another \
         DispatchGraph besides the one given; wait for the PendingDispatch (or drop the other \
         graph) before {to}"
    ))
}

fn still_held(to: &str) -> BackendError {
    BackendError::bad_input(format!(
        "Fix: this host-mapped DeviceBuffer is still held by a dispatch in flight or by a \
         DispatchGraph that binds it; wait for the PendingDispatch (or drop the graph) before {to}"
    ))
}

fn gone() -> BackendError {
    BackendError::internal("a DeviceBuffer's memory is gone before its drop")
}

fn not_mapped() -> BackendError {
    BackendError::bad_input(
        "Fix: this DeviceBuffer lives in device memory, which the host cannot read in place; \
         read it with CudaBackend::read, or allocate it with CudaBackend::host_mapped_buffer",
    )
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let host_mapped = self.is_host_mapped();
        let Storage::Cuda { memory, backend } = &mut self.storage else {
            // Reference memory accounts for itself when its last holder drops it.
            return;
        };
        if !host_mapped {
            backend.owned_bytes.fetch_sub(self.bytes, Ordering::Relaxed);
            backend.owned_buffers.fetch_sub(1, Ordering::Relaxed);
        }
        // The memory goes when the last holder (this buffer, a pending dispatch, a
        // graph) drops its `Arc`; each holder binds the context first. After a
        // sticky fault the context and its allocations are gone: forget instead.
        let memory = memory.take();
        if backend.check_alive().is_ok() && backend.bind().is_ok() {
            drop(memory);
        } else {
            std::mem::forget(memory);
        }
    }
}

/// Page-locked host memory owned by the caller, for host inputs of the eager path
/// without the copy into staging: fill it with [`PinnedBuffer::as_mut_slice`], bind
/// it with [`Binding::Pinned`], and the dispatch's upload is one DMA straight from
/// it. A dispatch in flight holds it; writing it meanwhile is refused with a `Fix:`
/// error (never a torn upload). Freed on drop (once nothing holds it). CUDA only.
pub struct PinnedBuffer {
    /// `Some` until drop.
    memory: Option<Arc<PinnedMemory>>,
    len: usize,
    backend: Arc<BackendInner>,
}

impl std::fmt::Debug for PinnedBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedBuffer")
            .field("len", &self.len)
            .finish()
    }
}

impl PinnedBuffer {
    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-byte buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes (always readable; a dispatch only reads them).
    pub fn as_slice(&self) -> &[u8] {
        self.memory
            .as_ref()
            .map_or(&[][..], |memory| memory.slice(0, self.len))
    }

    /// The bytes, writable: an `Err` starting `Fix:` while a pending dispatch (or
    /// one on another thread) still reads them.
    pub fn as_mut_slice(&mut self) -> Result<&mut [u8], BackendError> {
        let len = self.len;
        match self.memory.as_mut().and_then(Arc::get_mut) {
            Some(memory) => Ok(memory.slice_mut(0, len)),
            None => Err(BackendError::bad_input(
                "Fix: this PinnedBuffer is still being read by a dispatch in flight; wait for its \
                 PendingDispatch before writing the buffer again (or use a second buffer)",
            )),
        }
    }

    /// The binding of this buffer.
    pub fn binding(&self) -> Binding<'_> {
        Binding::Pinned(self)
    }

    /// The error for a pinned buffer of another backend than the one asked to
    /// `verb` it (every reference backend's, too: pinned buffers are CUDA's).
    pub(in crate::backend) fn foreign(verb: &str) -> BackendError {
        BackendError::InvalidHandle {
            message: format!(
                "Fix: cannot {verb} a PinnedBuffer of another backend; use the backend that \
                 allocated it"
            ),
        }
    }

    /// The memory, for a write by the device that nothing else may see until it
    /// is done: an `Err` starting `Fix:` while a dispatch in flight still holds it
    /// (its upload would read the bytes being replaced), or for another backend's
    /// buffer.
    pub(in crate::backend) fn exclusive_memory(
        &mut self,
        inner: &BackendInner,
        verb: &str,
    ) -> Result<&mut PinnedMemory, BackendError> {
        self.memory_for(inner, verb)?;
        self.memory.as_mut().and_then(Arc::get_mut).ok_or_else(|| {
            BackendError::bad_input(format!(
                "Fix: cannot {verb} this PinnedBuffer while a dispatch in flight still reads it; \
                 wait for its PendingDispatch first (or use a second buffer)"
            ))
        })
    }

    pub(in crate::backend) fn memory_for(
        &self,
        inner: &BackendInner,
        verb: &str,
    ) -> Result<&Arc<PinnedMemory>, BackendError> {
        if self.backend.id != inner.id {
            return Err(PinnedBuffer::foreign(verb));
        }
        self.memory.as_ref().ok_or_else(|| {
            BackendError::internal("a PinnedBuffer's memory is gone before its drop")
        })
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        let memory = self.memory.take();
        if self.backend.check_alive().is_ok() && self.backend.bind().is_ok() {
            drop(memory);
        } else {
            std::mem::forget(memory);
        }
    }
}

impl CudaBackend {
    /// A zeroed device buffer of `bytes` bytes, freed when dropped. Checked against
    /// the memory budget: more than it leaves is an `Err` starting `Fix:`
    /// ([`BackendError::OverBudget`]), never a driver failure.
    pub fn buffer(&self, bytes: u64) -> Result<DeviceBuffer, BackendError> {
        let memory = self.allocate_checked(bytes)?;
        let inner = &self.inner;
        inner.owned_bytes.fetch_add(bytes, Ordering::Relaxed);
        inner.owned_buffers.fetch_add(1, Ordering::Relaxed);
        let buffer = DeviceBuffer {
            storage: Storage::Cuda {
                memory: Some(Arc::new(memory)),
                backend: Arc::clone(inner),
            },
            bytes,
        };
        self.zero_buffer(&buffer)?;
        Ok(buffer)
    }

    /// A zeroed [`DeviceBuffer`] of `bytes` bytes in page-locked host memory mapped
    /// into the device's address space (`cuMemHostAlloc(DEVICEMAP)`): bind it like
    /// any `DeviceBuffer` (dispatches, submissions, graphs), and kernels store
    /// straight into host memory, so an output needs no copy and no size known in
    /// advance; read it in place with [`DeviceBuffer::mapped_bytes`] after the
    /// dispatch's synchronize. Kernel loads from it cross PCIe, so use it for
    /// outputs, not for data a kernel reads often. It takes host memory, not device
    /// memory, so the device memory budget does not count it. Freed on drop (once
    /// nothing holds it).
    pub fn host_mapped_buffer(&self, bytes: u64) -> Result<DeviceBuffer, BackendError> {
        let inner = &self.inner;
        inner.check_alive()?;
        inner.bind()?;
        let memory = DeviceMemory::allocate_host_mapped(bytes).map_err(|e| {
            BackendError::driver(format!("allocating {bytes} host-mapped pinned bytes"), e)
        })?;
        Ok(DeviceBuffer {
            storage: Storage::Cuda {
                memory: Some(Arc::new(memory)),
                backend: Arc::clone(inner),
            },
            bytes,
        })
    }

    /// A zeroed page-locked host buffer of `bytes` bytes for [`Binding::Pinned`].
    pub fn pinned_buffer(&self, bytes: usize) -> Result<PinnedBuffer, BackendError> {
        let inner = &self.inner;
        inner.check_alive()?;
        inner.bind()?;
        let mut memory = PinnedMemory::allocate(bytes).map_err(|e| {
            BackendError::driver(format!("allocating {bytes} pinned host bytes"), e)
        })?;
        let capacity = memory.len();
        memory.slice_mut(0, capacity).fill(0);
        Ok(PinnedBuffer {
            memory: Some(Arc::new(memory)),
            len: bytes,
            backend: Arc::clone(inner),
        })
    }

    /// A device buffer holding a copy of `values` (any plain-old-data type).
    pub fn buffer_from<T: Pod>(&self, values: &[T]) -> Result<DeviceBuffer, BackendError> {
        let bytes: &[u8] = bytemuck::cast_slice(values);
        let buffer = self.buffer(bytes.len() as u64)?;
        self.upload(&buffer, bytes)?;
        Ok(buffer)
    }

    /// Copy `values` into the start of `buffer` (they may be shorter). Blocks until
    /// the copy is done (one synchronize). Ordered like a dispatch: after every
    /// submission in flight that touches `buffer` (on the device) and every lane
    /// request that does (on the host).
    pub fn upload<T: Pod>(&self, buffer: &DeviceBuffer, values: &[T]) -> Result<(), BackendError> {
        let memory = Arc::clone(buffer.memory_for(&self.inner, "upload into")?);
        let bytes: &[u8] = bytemuck::cast_slice(values);
        self.transfer(memory, buffer.bytes, Transfer::Upload(bytes))
    }

    /// Read a whole buffer as values of `T` (an `Err` starting `Fix:` when its length
    /// is not a whole number of them).
    pub fn read<T: Pod>(&self, buffer: &DeviceBuffer) -> Result<Vec<T>, BackendError> {
        let mut values = vec![T::zeroed(); whole_values::<T>(buffer.bytes)?];
        self.read_into(buffer, &mut values)?;
        Ok(values)
    }

    /// Read the first `out.len()` values of `buffer` into `out` (no heap allocation
    /// once the lane's staging is large enough). Ordered like a dispatch: the words
    /// a submission in flight writes into `buffer` are there.
    pub fn read_into<T: Pod>(
        &self,
        buffer: &DeviceBuffer,
        out: &mut [T],
    ) -> Result<(), BackendError> {
        let memory = Arc::clone(buffer.memory_for(&self.inner, "read")?);
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(out);
        self.transfer(memory, buffer.bytes, Transfer::Read(bytes))
    }
}

/// The `Fix:` error for a copy of `bytes` bytes from `from_offset` of a buffer of
/// `from_len` bytes into `to_offset` of one of `to_len` bytes that does not fit in
/// either buffer or, within one buffer (`same`), overlaps itself. Both backends
/// check copies here, so they refuse the same ones with the same words.
pub(in crate::backend) fn check_copy(
    from_len: u64,
    from_offset: u64,
    to_len: u64,
    to_offset: u64,
    bytes: u64,
    same: bool,
) -> Result<(), BackendError> {
    let past = |offset: u64, len: u64| offset.checked_add(bytes).is_none_or(|end| end > len);
    for (side, offset, len) in [
        ("source", from_offset, from_len),
        ("destination", to_offset, to_len),
    ] {
        if past(offset, len) {
            return Err(BackendError::bad_input(format!(
                "Fix: cannot copy {bytes} bytes at offset {offset} of the {side} buffer, which \
                 holds {len} bytes; copy at most {} bytes at that offset, or start at offset {} \
                 or earlier",
                len.saturating_sub(offset),
                len.saturating_sub(bytes)
            )));
        }
    }
    if same && bytes > 0 && from_offset < to_offset + bytes && to_offset < from_offset + bytes {
        return Err(BackendError::bad_input(format!(
            "Fix: the copy of {bytes} bytes from offset {from_offset} to offset {to_offset} of one \
             buffer overlaps itself; copy through a second buffer, or between ranges that do not \
             overlap"
        )));
    }
    Ok(())
}

/// The checks of a download of `bytes` bytes of `from` at `from_offset` into
/// `to` at `to_offset`, the same on every backend: both ranges within their
/// buffers.
pub(in crate::backend) fn check_download(
    from: &DeviceBuffer,
    from_offset: u64,
    to: &PinnedBuffer,
    to_offset: u64,
    bytes: u64,
) -> Result<(), BackendError> {
    check_copy(
        from.len(),
        from_offset,
        to.len() as u64,
        to_offset,
        bytes,
        false,
    )
}

/// How many values of `T` a buffer of `bytes` bytes holds: the `Fix:` error when
/// not a whole number of them (or more than this host can address).
pub(in crate::backend) fn whole_values<T>(bytes: u64) -> Result<usize, BackendError> {
    let size = std::mem::size_of::<T>() as u64;
    if size == 0 || !bytes.is_multiple_of(size) {
        return Err(BackendError::bad_input(format!(
            "Fix: the buffer holds {bytes} bytes, not a whole number of {size}-byte values; read it \
             as a type whose size divides its length (bytes as u8)"
        )));
    }
    usize::try_from(bytes / size).map_err(|_| {
        BackendError::bad_input(format!(
            "Fix: a buffer of {bytes} bytes does not fit this host's address space; read it in parts"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Locks out a vague refusal of an in-place read of device memory: the error
    /// starts `Fix:` and names both ways out (copy it back, or allocate the buffer
    /// host-mapped).
    #[test]
    fn reading_device_memory_in_place_is_a_fix_error_naming_the_remedies() {
        let message = not_mapped().to_string();
        assert!(message.starts_with("Fix:"), "{message}");
        assert!(message.contains("CudaBackend::read"), "{message}");
        assert!(
            message.contains("CudaBackend::host_mapped_buffer"),
            "{message}"
        );
    }

    /// Locks out a typed read that truncates or overflows: a length that is not a
    /// whole number of values is a `Fix:` error, an exact one counts values.
    #[test]
    fn typed_reads_need_whole_values() {
        assert_eq!(whole_values::<u32>(16).unwrap(), 4);
        assert_eq!(whole_values::<u8>(3).unwrap(), 3);
        let message = whole_values::<u32>(6).unwrap_err().to_string();
        assert!(message.starts_with("Fix:"), "{message}");
    }
}
