//! Blocking copies into and out of owned buffers, their zero fill, and copies
//! between two owned buffers: one lane, one description of the stream operations,
//! one synchronize each, like a dispatch.
//!
//! Each takes its place in the order book like a dispatch
//! (`CudaBackend::run_blocking`): on the device after every dispatch in flight
//! that writes what it reads or touches what it writes, on the host after every lane
//! request that does, and before anything submitted while it runs that conflicts
//! with it. Without that, an `upload` into a buffer that a submission still pending
//! reads would run on another stream, unordered against it, and a `read` right after
//! a submission that writes the buffer could see the bytes from before it (the
//! reference backend, which runs a submission at once, never can). A persistent
//! lane's request is waited for on the host: its server runs beside the copy,
//! unordered on the device, and a delivered request's outputs in device memory are
//! visible to the copy engine only once its completion word is (the server's publish
//! fence follows the result words the delivery read; `codegen::ptx::lane`). With
//! nothing in flight that costs one load of the book's length, one entry and one
//! removal.

use std::sync::Arc;

use super::super::budget::{self, BudgetInputs};
use super::super::buffer::{check_copy, check_download};
use super::super::driver::{self, DeviceMemory};
use super::super::ordering::Accesses;
use super::super::pool::Lane;
use super::super::stream_ops::{
    enqueue, BufferCopy, Clear, LaneTarget, Readback, StagedCopy, StreamOps,
};
use super::super::{BackendError, CudaBackend, DeviceBuffer, PinnedBuffer};
use super::Held;

/// One buffer transfer: bytes going up, or a host slice to fill.
pub(in crate::backend) enum Transfer<'d, 'o> {
    Upload(&'d [u8]),
    Read(&'o mut [u8]),
}

impl CudaBackend {
    /// Wait on the host for every lane request, delivered or not, until it retired,
    /// that writes one of the owned buffers at device addresses `buffers`, and when
    /// `writing` also every one that reads one: their completion words, after which
    /// their accesses of the buffers are visible at GPU scope. For work outside the
    /// order book (a graph replay, which takes every buffer it holds as written);
    /// `what` names what waits, for messages.
    pub(in crate::backend) fn wait_for_lane_requests(
        &self,
        buffers: impl Iterator<Item = u64> + Clone,
        writing: bool,
        what: &str,
    ) -> Result<(), BackendError> {
        let book = &self.inner.in_flight;
        let lanes = book.lanes_touching(buffers, writing);
        if lanes.is_empty() {
            return Ok(());
        }
        book.wait_for_lanes(lanes, what)
    }

    /// Blocking work `ops` over `accesses` on `lane` (freshly leased, nothing
    /// enqueued on it yet), ordered as a dispatch is: its stream waits on the device
    /// for every conflicting dispatch in flight and the host waits here for every
    /// conflicting lane request; then it is enqueued, entered in the book (after its
    /// enqueue, as a dispatch is: a conflicting dispatch submitted from then on
    /// records the lane's order event after the work) and synchronised. It stays in
    /// the book until the caller releases the lane (as not idle on an `Err`). `what`
    /// names the work, for messages.
    ///
    /// # Safety
    ///
    /// Every device and host range of `ops` must lie in memory that stays alive
    /// until the lane is released.
    unsafe fn run_blocking(
        &self,
        lane: &Lane,
        accesses: Accesses,
        ops: &mut StreamOps<'_, driver::LoadedModule>,
        what: &str,
    ) -> Result<(), BackendError> {
        let inner = &self.inner;
        let (ordered, lanes) = inner
            .in_flight
            .order_after(&accesses, &lane.stream, None)
            .map_err(|error| inner.stream_failed(what, "ordering it after a dispatch", error))?;
        inner.in_flight.wait_for_lanes(lanes, what)?;
        let mut target = LaneTarget::of(lane);
        // SAFETY: the caller keeps every range of `ops` alive until the lane's
        // release, which comes after the synchronize below (or leaks the memory with
        // the lane when the stream cannot be synchronised).
        unsafe { enqueue(ops, &mut target) }
            .map_err(|f| inner.stream_failed(what, f.what, f.error))?;
        inner
            .in_flight
            .enter(&lane.stream, &lane.order, accesses, ordered);
        inner.synchronize(&mut target, what).map(|_| ())
    }

    /// Device memory of `bytes` bytes, checked against the budget first: over it is
    /// [`BackendError::OverBudget`], never a driver failure (or an abort).
    pub(in crate::backend) fn allocate_checked(
        &self,
        bytes: u64,
    ) -> Result<DeviceMemory, BackendError> {
        let inner = &self.inner;
        inner.check_alive()?;
        inner.bind()?;
        let (live_free, _) =
            driver::memory_info().map_err(|e| BackendError::driver("querying free memory", e))?;
        let budget = BudgetInputs {
            total: inner.caps.total_memory,
            resident: inner.held_bytes(),
            pooled: inner.transients.pooled_bytes(),
            live_free,
        };
        budget::check(bytes, &budget).map_err(|available| BackendError::OverBudget {
            required: bytes,
            available,
        })?;
        DeviceMemory::allocate(bytes)
            .map_err(|e| BackendError::driver(format!("allocating {bytes} device bytes"), e))
    }

    /// Zero a whole owned buffer (one fill and one synchronize).
    pub(in crate::backend) fn zero_buffer(
        &self,
        buffer: &DeviceBuffer,
    ) -> Result<(), BackendError> {
        let inner = &self.inner;
        let name = "a buffer clear";
        let memory = buffer.memory_for(inner, "clear")?;
        let lane = inner
            .lanes
            .lease()
            .map_err(|e| BackendError::driver("creating a stream", e))?;
        let mut ops: StreamOps<'_, driver::LoadedModule> = StreamOps::empty();
        if !buffer.is_empty() {
            ops.clears.push(Clear {
                device: memory.address(),
                bytes: buffer.len() as usize,
            });
        }
        let accesses = Accesses::writing(memory.address());
        // SAFETY: the clear covers exactly the buffer's allocation, which the
        // caller's borrow keeps alive past the release below.
        let result = unsafe { self.run_blocking(&lane, accesses, &mut ops, name) };
        inner.release(lane, &mut Held::default(), result.is_ok(), &[]);
        result
    }

    /// One blocking copy between host bytes and the start of `memory` (which holds
    /// `capacity` bytes): lease a lane, stage, enqueue, synchronize, copy out. Once
    /// the lane's staging is large enough it allocates nothing.
    pub(in crate::backend) fn transfer(
        &self,
        memory: Arc<DeviceMemory>,
        capacity: u64,
        transfer: Transfer<'_, '_>,
    ) -> Result<(), BackendError> {
        let inner = &self.inner;
        // Static names: a warm transfer allocates nothing on the heap.
        let (verb, name, len) = match &transfer {
            Transfer::Upload(data) => ("upload", "a buffer upload", data.len()),
            Transfer::Read(out) => ("read", "a buffer read", out.len()),
        };
        inner.check_alive()?;
        if len as u64 > capacity {
            return Err(BackendError::bad_input(format!(
                "Fix: cannot {verb} {len} bytes: the buffer holds {capacity} bytes; allocate a larger one \
                 or {verb} fewer bytes"
            )));
        }
        inner.bind()?;
        let accesses = match &transfer {
            Transfer::Upload(_) => Accesses::writing(memory.address()),
            Transfer::Read(_) => Accesses::reading(memory.address()),
        };
        let mut lane = inner
            .lanes
            .lease()
            .map_err(|e| BackendError::driver("creating a stream", e))?;
        match lane.ensure_staging(len) {
            Ok(true) => {
                inner
                    .staging_allocations
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Ok(false) => {}
            Err(e) => {
                inner.lanes.give_back(lane);
                return Err(BackendError::driver("allocating pinned staging", e));
            }
        }
        let copy = StagedCopy {
            device: memory.address(),
            staging_offset: 0,
            len,
        };
        let copies = [copy];
        let mut ops: StreamOps<'_, driver::LoadedModule> = StreamOps::empty();
        let out = match transfer {
            Transfer::Upload(data) => {
                lane.staging.write(0, data);
                ops.uploads.push(copy);
                None
            }
            Transfer::Read(out) => {
                ops.readback = Readback::StagedCopies(&copies);
                Some(out)
            }
        };
        let mut held = Held::default();
        held.buffers.push(memory);
        // SAFETY: staging holds len bytes and is not touched until the synchronize;
        // [address, address+len) is inside the live allocation (len checked against
        // its capacity above), which `held` keeps alive past the release below.
        let result = unsafe { self.run_blocking(&lane, accesses, &mut ops, name) };
        if let (Ok(()), Some(out)) = (&result, out) {
            ops.readback
                .deliver(&lane.staging, None, |_, bytes| out.copy_from_slice(bytes));
        }
        inner.release(lane, &mut held, result.is_ok(), &[]);
        result
    }

    /// Copy `bytes` bytes of `from`, starting at byte `from_offset`, into `to` at
    /// byte `to_offset`, by the device's copy engine: no kernel runs, so the
    /// multiprocessors stay free for other work meanwhile. Either buffer may be
    /// [host-mapped](CudaBackend::host_mapped_buffer): a pipeline that computes
    /// into device memory brings exactly the bytes it produced into host memory
    /// this way, once it has learned how many there are (the `vyre-tokenizer`
    /// encoder's ids, by DMA at the PCIe copy bound, instead of a kernel storing
    /// each word across PCIe while it holds multiprocessors).
    ///
    /// Blocks until the bytes have arrived (one synchronize). Ordered on the device
    /// after every dispatch in flight that writes `from` or touches `to`, and on the
    /// host after every lane request that does; a dispatch submitted meanwhile that
    /// conflicts with the copy runs after it. A range past either buffer's end, or
    /// two overlapping ranges of one buffer, is an `Err` starting `Fix:`; copying 0
    /// bytes does nothing.
    ///
    /// One copy on a leased lane, in the order book from its ordering to its
    /// synchronize.
    pub fn copy(
        &self,
        from: &DeviceBuffer,
        from_offset: u64,
        to: &DeviceBuffer,
        to_offset: u64,
        bytes: u64,
    ) -> Result<(), BackendError> {
        let inner = &self.inner;
        let name = "a buffer copy";
        inner.check_alive()?;
        let source = Arc::clone(from.memory_for(inner, "copy from")?);
        let destination = Arc::clone(to.memory_for(inner, "copy into")?);
        let same = Arc::ptr_eq(&source, &destination);
        check_copy(from.len(), from_offset, to.len(), to_offset, bytes, same)?;
        if bytes == 0 {
            return Ok(());
        }
        let len = usize::try_from(bytes).map_err(|_| {
            BackendError::bad_input(format!(
                "Fix: cannot copy {bytes} bytes on this host (more than it can address); copy \
                 fewer bytes at a time"
            ))
        })?;
        inner.bind()?;
        let mut accesses = Accesses::reading(source.address());
        accesses.writes.push(destination.address());
        let copy = BufferCopy {
            from: source.address() + from_offset,
            to: destination.address() + to_offset,
            len,
        };
        let mut held = Held::default();
        held.buffers.push(source);
        held.buffers.push(destination);
        // SAFETY: both ranges were checked against their buffers' lengths (and
        // against each other within one buffer) by `check_copy`; `held` keeps both
        // allocations alive until the copy has synchronised.
        unsafe { self.copy_blocking(accesses, held, copy, name) }
    }

    /// One copy by the copy engine on a leased lane, in the order book from its
    /// ordering to its synchronize; `held` released after it.
    ///
    /// # Safety
    /// `copy`'s source and destination ranges lie inside live allocations that
    /// stay alive until this returns (`held` keeps owned buffers alive; a
    /// caller's pinned memory is borrowed across the call) and do not overlap.
    unsafe fn copy_blocking(
        &self,
        accesses: Accesses,
        mut held: Held,
        copy: BufferCopy,
        name: &str,
    ) -> Result<(), BackendError> {
        let inner = &self.inner;
        let lane = inner
            .lanes
            .lease()
            .map_err(|e| BackendError::driver("creating a stream", e))?;
        let mut ops: StreamOps<'_, driver::LoadedModule> = StreamOps::empty();
        ops.buffer_copies.push(copy);
        // SAFETY: the caller's obligation covers the one copy of `ops`.
        let result = unsafe { self.run_blocking(&lane, accesses, &mut ops, name) };
        inner.release(lane, &mut held, result.is_ok(), &[]);
        result
    }

    /// Copy `bytes` bytes of `from`, starting at byte `from_offset`, into the
    /// caller's page-locked `to` at byte `to_offset`, by the copy engine: the
    /// bytes land where the caller reads them, with no staging buffer and no
    /// second copy on the host. A pipeline that hands its results to the caller
    /// in pinned memory (the `vyre-tokenizer` encoder's flat batch ids) saves the
    /// host's copy out of staging: on the H200 host (2026-12-04) that copy of a
    /// 64 MiB batch's 136 MB of ids took 2.6 ms of all 16 cores.
    ///
    /// Blocks until the bytes have arrived (one synchronize), ordered like
    /// [`CudaBackend::copy`] after every dispatch in flight that writes `from`.
    /// A range past either buffer's end is an `Err` starting `Fix:`, and so is a
    /// `to` that a dispatch in flight still reads (bound with
    /// [`Binding::Pinned`](super::super::Binding::Pinned)): the copy would change
    /// the bytes under its upload. Copying 0 bytes does nothing.
    pub fn download(
        &self,
        from: &DeviceBuffer,
        from_offset: u64,
        to: &mut PinnedBuffer,
        to_offset: u64,
        bytes: u64,
    ) -> Result<(), BackendError> {
        let inner = &self.inner;
        let name = "a download into pinned memory";
        inner.check_alive()?;
        let source = Arc::clone(from.memory_for(inner, "download from")?);
        check_download(from, from_offset, to, to_offset, bytes)?;
        let destination = to.exclusive_memory(inner, "download into")?;
        if bytes == 0 {
            return Ok(());
        }
        // Within `to` (checked), so both fit a usize.
        let (len, to_offset) = (bytes as usize, to_offset as usize);
        inner.bind()?;
        let accesses = Accesses::reading(source.address());
        let copy = BufferCopy {
            from: source.address() + from_offset,
            to: destination.address(to_offset) as u64,
            len,
        };
        let mut held = Held::default();
        held.buffers.push(source);
        // SAFETY: both ranges were checked against their buffers' lengths by
        // `check_download`; `held` keeps the source alive, and `&mut to`
        // (exclusive: no dispatch holds its memory) keeps the destination alive
        // and unread by anyone else until the blocking copy has synchronised.
        unsafe { self.copy_blocking(accesses, held, copy, name) }
    }
}
