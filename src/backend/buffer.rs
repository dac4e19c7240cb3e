//! Owned device buffers and non-blocking submission (issue 11, SPEC §12).
//!
//! # Why this module exists
//!
//! A tokenizer's hot loop wants two things the handle API did not give it:
//! - **Buffers that free themselves.** [`DeviceBuffer`] owns its device memory and
//!   frees it on `Drop`. The memory sits behind an `Arc` that every dispatch in
//!   flight and every [`DispatchGraph`](crate::graph::DispatchGraph) using it also
//!   holds, so dropping a buffer while the device still reads it only drops one
//!   reference: the memory is freed (`cuMemFree`, context bound) when the last user
//!   — the pending dispatch's `wait`, or the graph's drop, both after their
//!   synchronize — lets go. Use after free and double free cannot be written in
//!   safe code: a binding borrows the buffer (`&DeviceBuffer`), and `Drop` runs once.
//!   The generation-checked [`ResidentBuffer`](super::ResidentBuffer) handle stays
//!   for FFI-like callers that need a `Copy` value.
//! - **Outputs that need no copy.** [`CudaBackend::host_mapped_buffer`] makes a
//!   `DeviceBuffer` whose bytes live in page-locked host memory mapped into the
//!   device's address space: a kernel bound to it stores straight into host memory,
//!   so a variable-length output (a pre-tokenizer's piece starts) reaches the host
//!   with the dispatch's one synchronize and no copy, sized by nothing the host must
//!   know first. Measured on the H200 (2026-12-01): a kernel writing 256 KiB into
//!   mapped memory takes 15 µs per dispatch with its launch and synchronize, 1 MiB
//!   30 µs, against 17 / 32 µs for one DMA copy of the same bytes after the kernel
//!   (which also needs its size on the host before it is enqueued).
//!   [`DeviceBuffer::mapped_bytes`] reads it in place once nothing in flight holds
//!   it; every binding works as for device memory (dispatches, submissions,
//!   graphs).
//! - **Submission that does not block.** [`CudaBackend::submit_kernel`] enqueues a
//!   dispatch on its own lane (stream + events + pinned staging) and returns a
//!   [`PendingDispatch`] at once; [`PendingDispatch::wait`] does the one
//!   synchronize and yields outputs and timings. While batch N computes, the host
//!   stages and enqueues batch N+1 on another lane: its upload runs on the copy
//!   engine beside N's kernel. `wait` consumes the pending result, so waiting
//!   twice does not compile; dropping one without waiting synchronises its lane
//!   first (a documented blocking wait) and only then reuses its staging.
//!
//! At most [`MAX_PENDING`] submissions may be pending per backend; one more is an
//! `Err` starting `Fix:` (wait for an earlier one first), never an unbounded pile of
//! streams. Grid-sync kernels complete inside `submit_kernel` (their barrier counter
//! is module-global and leased until the synchronize), so their pending result is
//! already done.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crate::config::DispatchConfig;
use crate::ir::Program;

use super::dispatch::{with_outputs, InFlight, Request, Sink, Submitted};
use super::driver::{DeviceMemory, Event, PinnedMemory, Stream};
use super::outputs::Outputs;
use super::{BackendError, BackendInner, Binding, CudaBackend, Kernel, TimedDispatch};

/// Most submissions pending at once on one backend (each holds a lane).
pub const MAX_PENDING: usize = 16;

/// Device memory owned by the caller, freed on `Drop`. Starts zeroed. Bind it with
/// [`Binding::Buffer`] (or `(&buffer).into()`).
///
/// Made by [`CudaBackend::host_mapped_buffer`], its bytes are host-mapped pinned
/// memory instead: bound the same way, kernels write the host's memory directly, and
/// [`DeviceBuffer::mapped_bytes`] reads it in place after the synchronize.
///
/// Stream-ordered and safe while in flight: the memory sits behind an `Arc` that
/// every dispatch in flight and every graph using it also holds, so dropping the
/// buffer while the device still reads it only drops one reference; the memory is
/// freed when the last holder lets go, after its synchronize. Use after free and
/// double free cannot be written in safe code (bindings borrow the buffer).
pub struct DeviceBuffer {
    /// `Some` until drop.
    memory: Option<Arc<DeviceMemory>>,
    pub(crate) bytes: u64,
    pub(crate) backend: Arc<BackendInner>,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("bytes", &self.bytes)
            .field("backend", &self.backend.id)
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
        self.memory
            .as_ref()
            .is_some_and(|memory| memory.host_mapped().is_some())
    }

    /// The bytes of a host-mapped buffer, read in place (no copy, no driver call).
    /// `&mut self`: no dispatch can bind the buffer while the view lives.
    ///
    /// An `Err` starting `Fix:` for a buffer in device memory (read it with
    /// [`CudaBackend::read`]), and while anything else holds the buffer's memory: a
    /// [`PendingDispatch`] not yet waited for (the device may still be writing, so
    /// the bytes could be torn) or a [`DispatchGraph`](crate::graph::DispatchGraph)
    /// that binds it (it holds the memory for its whole life).
    pub fn mapped_bytes(&mut self) -> Result<&[u8], BackendError> {
        self.mapped_bytes_mut().map(|bytes| &*bytes)
    }

    /// [`DeviceBuffer::mapped_bytes`], writable (to set inputs a kernel reads in
    /// place, or clear an output). Refused the same way while a dispatch in flight
    /// or a graph holds the buffer.
    pub fn mapped_bytes_mut(&mut self) -> Result<&mut [u8], BackendError> {
        let len = self.bytes as usize;
        let Some(memory) = self.memory.as_mut() else {
            return Err(BackendError::internal(
                "a DeviceBuffer's memory is gone before its drop",
            ));
        };
        if memory.host_mapped().is_none() {
            return Err(device_memory_is_not_mapped());
        }
        match Arc::get_mut(memory).and_then(DeviceMemory::host_mapped_mut) {
            Some(mapped) => Ok(mapped.slice_mut(0, len)),
            None => Err(BackendError::bad_input(
                "Fix: this host-mapped DeviceBuffer is still held by a dispatch in flight or by a \
                 DispatchGraph that binds it; wait for the PendingDispatch (or drop the graph) before \
                 reading or writing it in place",
            )),
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
    /// besides this buffer and `graph` holds its memory (a [`PendingDispatch`] not
    /// yet waited for, or another graph).
    pub fn mapped_bytes_beside<'a>(
        &'a mut self,
        graph: &'a crate::graph::DispatchGraph,
    ) -> Result<&'a [u8], BackendError> {
        let len = self.bytes as usize;
        let memory = self.memory.as_ref().ok_or_else(|| {
            BackendError::internal("a DeviceBuffer's memory is gone before its drop")
        })?;
        let mapped = memory
            .host_mapped()
            .ok_or_else(device_memory_is_not_mapped)?;
        if Arc::strong_count(memory) != 1 + graph.holdings_of(memory) {
            return Err(BackendError::bad_input(
                "Fix: this host-mapped DeviceBuffer is held by a dispatch in flight or by another \
                 DispatchGraph besides the one given; wait for the PendingDispatch (or drop the other \
                 graph) before reading it in place",
            ));
        }
        Ok(mapped.slice(0, len))
    }

    /// The memory, checked to belong to `inner`'s backend.
    pub(crate) fn memory_for(
        &self,
        inner: &BackendInner,
        verb: &str,
    ) -> Result<&Arc<DeviceMemory>, BackendError> {
        if self.backend.id != inner.id {
            return Err(BackendError::InvalidHandle {
                message: format!(
                    "Fix: cannot {verb} a DeviceBuffer of another CudaBackend (backend {} vs this one, {}); \
                     use the backend that allocated it",
                    self.backend.id, inner.id
                ),
            });
        }
        self.memory.as_ref().ok_or_else(|| {
            BackendError::internal("a DeviceBuffer's memory is gone before its drop")
        })
    }
}

fn device_memory_is_not_mapped() -> BackendError {
    BackendError::bad_input(
        "Fix: this DeviceBuffer lives in device memory, which the host cannot read in place; \
         read it with CudaBackend::read, or allocate it with CudaBackend::host_mapped_buffer",
    )
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if !self.is_host_mapped() {
            self.backend
                .owned_bytes
                .fetch_sub(self.bytes, Ordering::Relaxed);
        }
        // The memory goes when the last holder (this buffer, a pending dispatch, a
        // graph) drops its `Arc`; each holder binds the context first. After a
        // sticky fault the context and its allocations are gone: forget instead.
        let memory = self.memory.take();
        if self.backend.check_alive().is_ok() && self.backend.bind().is_ok() {
            drop(memory);
        } else {
            std::mem::forget(memory);
        }
    }
}

/// Page-locked host memory owned by the caller, for borrowed inputs of the eager
/// path without the copy into staging: fill it with [`PinnedBuffer::as_mut_slice`],
/// bind it with [`Binding::Pinned`], and the dispatch's upload is one DMA straight
/// from it. A dispatch in flight holds it; writing it meanwhile is refused with a
/// `Fix:` error (never a torn upload). Freed on drop (once nothing holds it).
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

    pub(crate) fn memory_for(
        &self,
        inner: &BackendInner,
        verb: &str,
    ) -> Result<&Arc<PinnedMemory>, BackendError> {
        if self.backend.id != inner.id {
            return Err(BackendError::InvalidHandle {
                message: format!(
                    "Fix: cannot {verb} a PinnedBuffer of another CudaBackend; use the backend that \
                     allocated it"
                ),
            });
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

impl<'a> From<&'a PinnedBuffer> for Binding<'a> {
    fn from(buffer: &'a PinnedBuffer) -> Self {
        Binding::Pinned(buffer)
    }
}

impl<'a> From<&'a DeviceBuffer> for Binding<'a> {
    fn from(buffer: &'a DeviceBuffer) -> Self {
        Binding::Buffer(buffer)
    }
}

/// A dispatch enqueued by [`CudaBackend::submit_kernel`] and not yet waited for.
/// `Send`: it may be waited for on another thread.
///
/// Each pending dispatch holds its own lane (stream, events, pinned staging), so
/// while batch N computes the host can stage and enqueue batch N+1, whose upload
/// runs on the copy engine beside N's kernel. [`PendingDispatch::wait`] consumes
/// the value: waiting twice does not compile. Dropping it without waiting blocks
/// until the dispatch is done, and only then are its staging and buffers reused.
/// At most [`MAX_PENDING`] may be pending per backend; one more is an `Err`
/// starting `Fix:`. Grid-sync kernels complete inside the submit call (their
/// barrier counter is module-global and leased until the synchronize). A pending
/// dispatch holds its backend (and every buffer it binds) alive, so dropping the
/// backend or a buffer meanwhile is safe. Submissions print no probe line.
#[must_use = "a pending dispatch does nothing visible until `wait`; dropping it blocks until it finishes"]
pub struct PendingDispatch {
    kernel: Kernel,
    state: PendingState,
    backend: CudaBackend,
}

enum PendingState {
    InFlight(Box<InFlight>),
    /// Completed at submission (grid-sync kernels).
    Done(Result<TimedDispatch, BackendError>),
    /// Waited for or dropped.
    Finished,
}

impl std::fmt::Debug for PendingDispatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingDispatch")
            .field("program", &self.kernel.inner.name)
            .finish()
    }
}

/// Device instants of one timed dispatch, in nanoseconds after a [`DeviceClock`]
/// origin: comparable across dispatches on different lanes (the overlap of an
/// upload with another dispatch's kernel is visible here).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceSpans {
    /// The dispatch's first stream operation (its uploads and clears start here).
    pub window_start_ns: u64,
    /// Its launch loop starts (uploads are done).
    pub kernel_start_ns: u64,
    /// Its launch loop ends.
    pub kernel_end_ns: u64,
    /// Its last stream operation ends.
    pub window_end_ns: u64,
}

/// An origin on the device's clock: one event recorded and completed, against
/// which [`PendingDispatch::wait_spans`] measures a dispatch's instants.
pub struct DeviceClock {
    event: Event,
    // Last: the context outlives the event.
    backend: CudaBackend,
}

impl Drop for DeviceClock {
    fn drop(&mut self) {
        // The event is destroyed right after this, in the backend's context.
        let _ = self.backend.inner.bind();
    }
}

impl std::fmt::Debug for DeviceClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceClock").finish()
    }
}

impl CudaBackend {
    /// Allocate a zeroed device buffer of `bytes` bytes, freed when dropped.
    /// Checked against the memory budget (§4.6).
    pub fn buffer(&self, bytes: u64) -> Result<DeviceBuffer, BackendError> {
        let memory = self.allocate_checked(bytes)?;
        let inner = &self.inner;
        inner.owned_bytes.fetch_add(bytes, Ordering::Relaxed);
        let buffer = DeviceBuffer {
            memory: Some(Arc::new(memory)),
            bytes,
            backend: Arc::clone(inner),
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
            memory: Some(Arc::new(memory)),
            bytes,
            backend: Arc::clone(inner),
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

    /// A device buffer holding a copy of `data`.
    pub fn buffer_from(&self, data: &[u8]) -> Result<DeviceBuffer, BackendError> {
        let buffer = self.buffer(data.len() as u64)?;
        self.upload(&buffer, data)?;
        Ok(buffer)
    }

    /// Copy `data` into the start of `buffer` (`data` may be shorter). Blocks until
    /// the copy is done (one synchronize).
    pub fn upload(&self, buffer: &DeviceBuffer, data: &[u8]) -> Result<(), BackendError> {
        let memory = Arc::clone(buffer.memory_for(&self.inner, "upload into")?);
        self.transfer(
            memory,
            buffer.bytes,
            super::dispatch::Transfer::Upload(data),
        )
    }

    /// Read a whole buffer.
    pub fn read(&self, buffer: &DeviceBuffer) -> Result<Vec<u8>, BackendError> {
        let mut out = vec![0u8; buffer.bytes as usize];
        self.read_into(buffer, &mut out)?;
        Ok(out)
    }

    /// Read the first `out.len()` bytes of `buffer` into `out`.
    pub fn read_into(&self, buffer: &DeviceBuffer, out: &mut [u8]) -> Result<(), BackendError> {
        let memory = Arc::clone(buffer.memory_for(&self.inner, "read")?);
        self.transfer(memory, buffer.bytes, super::dispatch::Transfer::Read(out))
    }

    /// Enqueue a dispatch of a compiled kernel and return at once (see
    /// [`PendingDispatch`]): borrowed inputs are copied into the lane's pinned
    /// staging before this returns, so the slices may be reused immediately.
    /// Records no timing events (device times 0 unless the probe is on); see
    /// [`CudaBackend::submit_kernel_timed`].
    pub fn submit_kernel(
        &self,
        kernel: &Kernel,
        bindings: &[Binding<'_>],
        config: &DispatchConfig,
    ) -> Result<PendingDispatch, BackendError> {
        self.submit_with(kernel, bindings, config, false, None)
    }

    /// [`CudaBackend::submit_kernel`] with device times (and [`DeviceSpans`]).
    pub fn submit_kernel_timed(
        &self,
        kernel: &Kernel,
        bindings: &[Binding<'_>],
        config: &DispatchConfig,
    ) -> Result<PendingDispatch, BackendError> {
        self.submit_with(kernel, bindings, config, true, None)
    }

    /// [`CudaBackend::submit_kernel`] ordered after `previous` on the device: the
    /// new dispatch's operations (uploads included) start only once everything
    /// `previous` enqueued has finished, and nothing waits on the host (one event
    /// recorded on `previous`'s stream and waited on by the new one). So a chain of
    /// dependent dispatches is enqueued back to back and waited for once: wait for
    /// the last one first; waiting for the earlier ones then finds their streams
    /// idle. This is how a multi-step pipeline (the pre-tokenizer's split and
    /// compaction) pays one synchronize per run instead of one per step (§0:
    /// 8.5–9.8 µs each). `previous` must come from this backend.
    pub fn submit_kernel_after(
        &self,
        previous: &PendingDispatch,
        kernel: &Kernel,
        bindings: &[Binding<'_>],
        config: &DispatchConfig,
    ) -> Result<PendingDispatch, BackendError> {
        self.submit_with(kernel, bindings, config, false, Some(previous))
    }

    /// [`CudaBackend::submit_kernel_after`] with device times (and [`DeviceSpans`]).
    pub fn submit_kernel_after_timed(
        &self,
        previous: &PendingDispatch,
        kernel: &Kernel,
        bindings: &[Binding<'_>],
        config: &DispatchConfig,
    ) -> Result<PendingDispatch, BackendError> {
        self.submit_with(kernel, bindings, config, true, Some(previous))
    }

    /// Compile (cached) and submit `program`: [`CudaBackend::submit_kernel_timed`].
    pub fn submit(
        &self,
        program: &Program,
        bindings: &[Binding<'_>],
        config: &DispatchConfig,
    ) -> Result<PendingDispatch, BackendError> {
        let kernel = self.compile(program, config)?;
        self.submit_with(&kernel, bindings, config, true, None)
    }

    /// Record an origin event on the device's clock and wait for it.
    pub fn device_clock(&self) -> Result<DeviceClock, BackendError> {
        let inner = &self.inner;
        inner.check_alive()?;
        inner.bind()?;
        let event = Event::new().map_err(|e| BackendError::driver("creating a clock event", e))?;
        let stream =
            Stream::new().map_err(|e| BackendError::driver("creating a clock stream", e))?;
        event
            .record(&stream)
            .map_err(|e| BackendError::driver("recording a clock event", e))?;
        inner.synchronize_with("the device clock origin", || stream.synchronize())?;
        Ok(DeviceClock {
            event,
            backend: self.clone(),
        })
    }

    fn submit_with(
        &self,
        kernel: &Kernel,
        bindings: &[Binding<'_>],
        config: &DispatchConfig,
        timed: bool,
        previous: Option<&PendingDispatch>,
    ) -> Result<PendingDispatch, BackendError> {
        let inner = &self.inner;
        let after = match previous {
            None => None,
            Some(previous) if previous.backend.inner.id != inner.id => {
                return Err(BackendError::bad_input(format!(
                    "Fix: the PendingDispatch to order {} after belongs to another CudaBackend; submit \
                     both on the same backend",
                    kernel.inner.name
                )));
            }
            Some(previous) => match &previous.state {
                PendingState::InFlight(in_flight) => Some(&**in_flight),
                // Completed at its submission: nothing to wait for.
                PendingState::Done(_) => None,
                PendingState::Finished => {
                    return Err(BackendError::internal(
                        "ordering after a pending dispatch that was already finished",
                    ))
                }
            },
        };
        let pending = inner.pending.fetch_add(1, Ordering::AcqRel);
        if pending >= MAX_PENDING {
            inner.pending.fetch_sub(1, Ordering::AcqRel);
            return Err(BackendError::bad_input(format!(
                "Fix: {MAX_PENDING} dispatches are already pending on this backend (each holds a lane); \
                 wait for an earlier PendingDispatch before submitting {}",
                kernel.inner.name
            )));
        }
        let start = Instant::now();
        let request = Request {
            kernel: &kernel.inner,
            bindings,
            config,
            want_timing: timed,
            start,
            mark: None,
            after,
        };
        let mut outputs = Outputs::default();
        let state = match inner.submit(request, &Sink::Packed(&mut outputs), false) {
            Err(e) => {
                inner.pending.fetch_sub(1, Ordering::AcqRel);
                return Err(e);
            }
            Ok(Submitted {
                in_flight,
                lease: Some(lease),
                mark,
            }) => {
                // Grid sync: the barrier lease cannot outlive this call, so wait now.
                let done = inner
                    .complete(&kernel.inner, in_flight, Sink::Packed(&mut outputs), mark)
                    .map(|timing| with_outputs(timing, outputs));
                drop(lease);
                PendingState::Done(done)
            }
            Ok(Submitted { in_flight, .. }) => PendingState::InFlight(Box::new(in_flight)),
        };
        Ok(PendingDispatch {
            kernel: kernel.clone(),
            state,
            backend: self.clone(),
        })
    }
}

impl PendingDispatch {
    /// Wait for the dispatch: the one synchronize, then its outputs (per its
    /// readback policy) and timings.
    pub fn wait(mut self) -> Result<TimedDispatch, BackendError> {
        self.finish(None).map(|(timed, _)| timed)
    }

    /// [`PendingDispatch::wait`], also returning the dispatch's device instants
    /// after `clock`. Needs a timed submission ([`CudaBackend::submit_kernel_timed`]).
    pub fn wait_spans(
        mut self,
        clock: &DeviceClock,
    ) -> Result<(TimedDispatch, DeviceSpans), BackendError> {
        if clock.backend.inner.id != self.backend.inner.id {
            return Err(BackendError::bad_input(
                "Fix: the DeviceClock belongs to another CudaBackend; take one from this backend",
            ));
        }
        match &self.state {
            PendingState::InFlight(in_flight) if in_flight.timed() => {}
            _ => {
                return Err(BackendError::bad_input(format!(
                    "Fix: {} was submitted without timing events (or completed at submission); submit it \
                     with CudaBackend::submit_kernel_timed to read its device spans",
                    self.kernel.inner.name
                )))
            }
        }
        let (timed, spans) = self.finish(Some(&clock.event))?;
        Ok((timed, spans.unwrap_or_default()))
    }

    fn finish(
        &mut self,
        clock: Option<&Event>,
    ) -> Result<(TimedDispatch, Option<DeviceSpans>), BackendError> {
        let inner = Arc::clone(&self.backend.inner);
        let state = std::mem::replace(&mut self.state, PendingState::Finished);
        match state {
            PendingState::Finished => Err(BackendError::internal(
                "a pending dispatch was finished twice",
            )),
            PendingState::Done(result) => {
                inner.pending.fetch_sub(1, Ordering::AcqRel);
                result.map(|timed| (timed, None))
            }
            PendingState::InFlight(in_flight) => {
                // `wait` may run on another thread than `submit`.
                let bound = inner.bind();
                let mut outputs = Outputs::default();
                let mut spans = None;
                let result = match bound {
                    Ok(()) => inner
                        .complete_with_spans(
                            &self.kernel.inner,
                            *in_flight,
                            Sink::Packed(&mut outputs),
                            // Submissions are not charged to the probe: no phase
                            // may land in another dispatch's record.
                            None,
                            clock.map(|origin| (origin, &mut spans)),
                        )
                        .map(|timing| with_outputs(timing, outputs)),
                    Err(e) => {
                        // Without the context nothing can be synchronised or freed.
                        std::mem::forget(in_flight);
                        Err(e)
                    }
                };
                inner.pending.fetch_sub(1, Ordering::AcqRel);
                Ok((result?, spans))
            }
        }
    }
}

impl Drop for PendingDispatch {
    /// Dropping without `wait` blocks until the dispatch is done (its staging and
    /// buffers are released only then); errors are discarded.
    fn drop(&mut self) {
        if matches!(self.state, PendingState::Finished) {
            return;
        }
        let _ = self.finish(None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Locks out owned buffers and pending results that cannot cross threads: a
    /// pipelined encoder submits on one thread and waits on another, and shares
    /// buffers between threads.
    #[test]
    fn buffers_and_pending_results_cross_threads() {
        fn assert_send<T: Send>() {}
        fn assert_sync<T: Sync>() {}
        assert_send::<DeviceBuffer>();
        assert_sync::<DeviceBuffer>();
        assert_send::<PinnedBuffer>();
        assert_sync::<PinnedBuffer>();
        assert_send::<PendingDispatch>();
        assert_send::<DeviceClock>();
    }

    /// Locks out a vague refusal of an in-place read of device memory: the error
    /// starts `Fix:` and names both ways out (copy it back, or allocate the buffer
    /// host-mapped).
    #[test]
    fn reading_device_memory_in_place_is_a_fix_error_naming_the_remedies() {
        let message = device_memory_is_not_mapped().to_string();
        assert!(message.starts_with("Fix:"), "{message}");
        assert!(message.contains("CudaBackend::read"), "{message}");
        assert!(
            message.contains("CudaBackend::host_mapped_buffer"),
            "{message}"
        );
    }
}
