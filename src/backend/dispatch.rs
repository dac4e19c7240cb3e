//! Dispatch (§4.5): bindings → staged buffers → one description of the stream
//! operations → one synchronize, charged phase by phase to the probe.
//!
//! A dispatch is split in two: [`BackendInner::submit`] prepares (binding and
//! readback plans), stages (lane lease, transient buffers, borrowed bytes into
//! pinned staging), describes the stream operations once as a
//! [`StreamOps`](super::stream_ops::StreamOps) and enqueues them;
//! [`BackendInner::complete`] does the one `cuStreamSynchronize`, the fault
//! handling, the grid-barrier audit, the device times and the host side of the
//! readback. The blocking entry points call both; the order of work on the stream
//! is documented (and CPU-tested) in `stream_ops`. §0 measured why readback is
//! async copies plus one synchronize: 16 blocking 16-byte copies cost 107.5 µs
//! where 16 async copies and one synchronize cost 36.8 µs.
//!
//! Probe phases: `stage` is binding resolution and staging writes, `resolve`
//! building the description (clears, parameter array, readback copies), `lease` the
//! grid-barrier lease, `launch` enqueueing every stream operation, `release` the
//! synchronize and audit, `readback` the copy out of staging.
//!
//! Readback (§11, `readback` module): items of at most
//! `readback::MAPPED_RANGE_MAX_BYTES` (up to 16) are not copied at all: the kernel's
//! last thread writes them into the lane's host-mapped result area (§0: 9.7–9.9 µs
//! per dispatch for 1–16 outputs against 11.6–35.0 µs with one async copy each);
//! longer ones go by one async copy each into staging.
//!
//! Device time: `kernel_ns` always comes from the `%globaltimer` stamps the kernel
//! writes itself (earliest block start of the first launch to the end of the last
//! thread of the last launch), so timing costs nothing. CUDA events are recorded
//! only when asked for explicitly ([`CudaBackend::dispatch_kernel_into_timed`],
//! `submit_kernel_timed`) or with the probe on: they give `device_window_ns` (the
//! whole stream window: uploads, clears, launches, copies) and the pipelining spans.
//! On driver 580 their records and elapsed-time queries cost about 10 µs.

use std::sync::{Arc, MutexGuard};
use std::time::Instant;

use smallvec::SmallVec;

use crate::config::DispatchConfig;
use crate::ir::{Access, Program};
use crate::probe::{self, Count, DispatchProbe, DispatchTiming, Phase};

use super::budget::{self, BudgetInputs};
use super::buffer::{DeviceBuffer, DeviceSpans, PinnedBuffer};
use super::driver::{self, DeviceMemory, DriverError, Event, PinnedMemory};
use super::kernel::KernelInner;
use super::ordering::Accesses;
use super::outputs::Outputs;
use super::plan::{align_up, check_binding_sizes, plan_readback, ReadItem};
use super::pool::Lane;
use super::readback::{
    mapped_range_limit, route_reads, stamp_kernel_ns, Delivery, ResultArea, Route,
    RESULT_AREA_BYTES, STAMP_BYTES,
};
use super::stream_ops::{
    enqueue, Clear, DeviceMark, EnqueueFailure, KernelLaunch, LaneTarget, PinnedCopy, Readback,
    StagedCopy, StreamOps, StreamTarget,
};
use super::PerBinding;
use super::{BackendError, BackendInner, CudaBackend, Kernel, LaunchPlan, ResidentBuffer};

/// One buffer binding of a dispatch, in the program's binding order. Non-exhaustive:
/// later versions may add binding kinds.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum Binding<'a> {
    /// A resident buffer: used in place; outputs stay in it (and are also read back
    /// per the readback policy).
    Resident(ResidentBuffer),
    /// Host bytes staged into a pooled transient buffer for this dispatch only.
    /// `WriteOnly` outputs are zeroed on the device (the slice gives only the size).
    Borrowed(&'a [u8]),
    /// An owned device buffer, used in place like a resident one; a dispatch in
    /// flight keeps its memory alive even if the buffer is dropped meanwhile.
    Buffer(&'a DeviceBuffer),
    /// Host bytes in caller-owned pinned memory, copied by DMA straight from it into
    /// a pooled transient buffer (no copy into staging). The dispatch holds the
    /// pinned memory until it is done, so it cannot be rewritten meanwhile
    /// ([`PinnedBuffer::as_mut_slice`] says `Fix:` while it is in flight).
    Pinned(&'a PinnedBuffer),
}

impl Binding<'_> {
    /// Bytes bound.
    pub fn len(&self) -> u64 {
        match self {
            Binding::Resident(handle) => handle.len(),
            Binding::Borrowed(bytes) => bytes.len() as u64,
            Binding::Buffer(buffer) => buffer.len(),
            Binding::Pinned(pinned) => pinned.len() as u64,
        }
    }

    /// True when no byte is bound.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Outputs and timings of one dispatch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TimedDispatch {
    /// Bytes read back, one item per readback item (see [`ReadbackPolicy`](crate::ReadbackPolicy)),
    /// in one allocation.
    pub outputs: Outputs,
    /// The whole call, host clock.
    pub wall_ns: u64,
    /// Host time until the last asynchronous operation was enqueued.
    pub enqueue_ns: u64,
    /// Host time blocked in the one synchronize.
    pub wait_ns: u64,
    /// Device time between the outer event pair (uploads to the last DMA copy), or 0
    /// when no events were recorded (only [`CudaBackend::dispatch_kernel_into_timed`],
    /// `submit_kernel_timed` and the probe record them).
    pub device_window_ns: u64,
    /// Device time of the launch loop from the kernel's own `%globaltimer` stamps:
    /// earliest block start of the first launch to the moment the last thread of the
    /// last launch finished (32 ns ticks on the H200). Always measured, at no cost.
    pub kernel_ns: u64,
}

/// Where read-back bytes go.
pub(crate) enum Sink<'s, 'o> {
    /// Every item in one allocation.
    Packed(&'s mut Outputs),
    /// The caller's slices, one per item (allocates nothing).
    Slices(&'s mut [&'o mut [u8]]),
}

fn elapsed_ns(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// One dispatch as the public entry points received it.
#[derive(Clone, Copy)]
pub(crate) struct Request<'r, 'b> {
    pub(crate) kernel: &'r KernelInner,
    pub(crate) bindings: &'r [Binding<'b>],
    pub(crate) config: &'r DispatchConfig,
    /// Record the CUDA event pairs (`device_window_ns`, device spans): an explicit
    /// option; the probe being on forces it. `kernel_ns` needs no events.
    pub(crate) want_timing: bool,
    /// The call's first instant (the wall clock starts here).
    pub(crate) start: Instant,
    /// Where the next probe phase starts (`None` while the probe is off).
    pub(crate) mark: Option<Instant>,
    /// A dispatch in flight this one must run after on the device (its lane's
    /// `order` event is recorded and waited on; nothing waits on the host).
    pub(crate) after: Option<&'r InFlight>,
}

/// Resources a dispatch holds from staging until its lane is released.
pub(crate) struct Held {
    pub(crate) resident: PerBinding<Arc<DeviceMemory>>,
    pub(crate) transients: SmallVec<[DeviceMemory; 16]>,
    /// Caller pinned buffers the uploads read from.
    pub(crate) pinned: SmallVec<[Arc<PinnedMemory>; 4]>,
}

/// What [`BackendInner::submit`] returns: the dispatch in flight, the grid-barrier
/// lease (grid-sync kernels; held until the dispatch completes) and the probe mark.
pub(crate) struct Submitted<'k> {
    pub(crate) in_flight: InFlight,
    pub(crate) lease: Option<MutexGuard<'k, ()>>,
    pub(crate) mark: Option<Instant>,
}

/// Bindings resolved to device addresses, and the uploads their borrowed bytes need.
struct StagedBindings {
    addresses: PerBinding<u64>,
    uploads: SmallVec<[StagedCopy; 16]>,
    pinned_uploads: SmallVec<[PinnedCopy; 4]>,
}

/// A dispatch enqueued on its lane and not yet synchronised: what
/// [`BackendInner::complete`] needs to finish it.
pub(crate) struct InFlight {
    lane: Lane,
    held: Held,
    /// The DMA-routed readback copies.
    reads: PerBinding<StagedCopy>,
    /// Where each readback item's bytes are after the synchronize, in item order.
    deliveries: PerBinding<Delivery>,
    /// Grid sync: staging offset of the barrier words and the grid's block count.
    barrier: Option<(usize, u64)>,
    timed: bool,
    window: (DeviceMark, DeviceMark),
    start: Instant,
    enqueue_ns: u64,
}

impl InFlight {
    /// Whether the dispatch records its device events.
    pub(crate) fn timed(&self) -> bool {
        self.timed
    }
}

impl CudaBackend {
    /// Dispatch `program` over borrowed host inputs, one per global buffer in binding
    /// order (see [`Program::global_buffers`]); returns the read-back outputs, every
    /// item in one allocation ([`Outputs`]; `outputs[i]` is item `i`).
    pub fn dispatch(
        &self,
        program: &Program,
        inputs: &[&[u8]],
        config: &DispatchConfig,
    ) -> Result<Outputs, BackendError> {
        let bindings: PerBinding<Binding> = inputs.iter().map(|b| Binding::Borrowed(b)).collect();
        Ok(self.run_program(program, &bindings, config, false)?.outputs)
    }

    /// Dispatch `program` over resident buffers, one per global buffer in binding order;
    /// returns the read-back outputs in one allocation ([`Outputs`]).
    pub fn dispatch_resident(
        &self,
        program: &Program,
        handles: &[ResidentBuffer],
        config: &DispatchConfig,
    ) -> Result<Outputs, BackendError> {
        let bindings: PerBinding<Binding> = handles.iter().map(|h| Binding::Resident(*h)).collect();
        Ok(self.run_program(program, &bindings, config, false)?.outputs)
    }

    /// [`CudaBackend::dispatch_resident`] with host timings and `kernel_ns` (from
    /// the kernel's own stamps: as cheap as the untimed call; `device_window_ns` is
    /// 0 unless the probe is on).
    pub fn dispatch_resident_timed(
        &self,
        program: &Program,
        handles: &[ResidentBuffer],
        config: &DispatchConfig,
    ) -> Result<TimedDispatch, BackendError> {
        let bindings: PerBinding<Binding> = handles.iter().map(|h| Binding::Resident(*h)).collect();
        self.run_program(program, &bindings, config, false)
    }

    /// Dispatch with any mix of resident and borrowed bindings, with host timings
    /// and `kernel_ns` (stamps).
    pub fn dispatch_bindings(
        &self,
        program: &Program,
        bindings: &[Binding<'_>],
        config: &DispatchConfig,
    ) -> Result<TimedDispatch, BackendError> {
        self.run_program(program, bindings, config, false)
    }

    /// Dispatch a compiled kernel (no lookups at all), with host timings and
    /// `kernel_ns` (stamps).
    pub fn dispatch_kernel(
        &self,
        kernel: &Kernel,
        bindings: &[Binding<'_>],
        config: &DispatchConfig,
    ) -> Result<TimedDispatch, BackendError> {
        let mut outputs = Outputs::default();
        let timing =
            self.run_kernel(kernel, bindings, config, Sink::Packed(&mut outputs), false)?;
        Ok(with_outputs(timing, outputs))
    }

    /// Dispatch a compiled kernel and read outputs into caller buffers, one per
    /// readback item, each exactly the item's length: the hot path. Once warm it makes
    /// no driver allocation and no heap allocation, and it records no timing events
    /// (on driver 580 the event records and elapsed-time queries of a timed dispatch
    /// cost about 10 µs, more than the launch itself): `kernel_ns` comes from the
    /// kernel's own stamps and `device_window_ns` is 0 unless the probe is on. Use
    /// [`CudaBackend::dispatch_kernel_into_timed`] for the event window too.
    pub fn dispatch_kernel_into(
        &self,
        kernel: &Kernel,
        bindings: &[Binding<'_>],
        config: &DispatchConfig,
        outputs: &mut [&mut [u8]],
    ) -> Result<DispatchTiming, BackendError> {
        self.run_kernel(kernel, bindings, config, Sink::Slices(outputs), false)
    }

    /// [`CudaBackend::dispatch_kernel_into`] plus CUDA events around everything the
    /// dispatch enqueues, for `device_window_ns` (uploads, clears, launches and DMA
    /// copies): the explicit option, about 10 µs dearer on driver 580.
    pub fn dispatch_kernel_into_timed(
        &self,
        kernel: &Kernel,
        bindings: &[Binding<'_>],
        config: &DispatchConfig,
        outputs: &mut [&mut [u8]],
    ) -> Result<DispatchTiming, BackendError> {
        self.run_kernel(kernel, bindings, config, Sink::Slices(outputs), true)
    }

    /// The kernel path: open the probe dispatch first, then execute.
    fn run_kernel(
        &self,
        kernel: &Kernel,
        bindings: &[Binding<'_>],
        config: &DispatchConfig,
        sink: Sink<'_, '_>,
        want_timing: bool,
    ) -> Result<DispatchTiming, BackendError> {
        let probe = probe::begin_dispatch();
        let start = Instant::now();
        let request = Request {
            kernel: &kernel.inner,
            bindings,
            config,
            want_timing,
            start,
            mark: probe.as_ref().map(|_| start),
            after: None,
        };
        self.inner.execute(request, sink, probe)
    }

    /// The program path: open the probe dispatch, resolve the kernel, execute; every
    /// output in one allocation.
    fn run_program(
        &self,
        program: &Program,
        bindings: &[Binding<'_>],
        config: &DispatchConfig,
        want_timing: bool,
    ) -> Result<TimedDispatch, BackendError> {
        let probe = probe::begin_dispatch();
        let start = Instant::now();
        self.inner.check_alive()?;
        // The wall clock's first instant doubles as the first phase mark.
        let (kernel, mark) =
            self.inner
                .resolve_kernel(program, config, probe.as_ref().map(|_| start))?;
        let request = Request {
            kernel: &kernel,
            bindings,
            config,
            want_timing,
            start,
            mark,
            after: None,
        };
        let mut outputs = Outputs::default();
        let timing = self
            .inner
            .execute(request, Sink::Packed(&mut outputs), probe)?;
        Ok(with_outputs(timing, outputs))
    }

    /// Allocate a resident buffer of `bytes` bytes (contents undefined until uploaded).
    pub fn allocate_resident(&self, bytes: u64) -> Result<ResidentBuffer, BackendError> {
        let inner = &self.inner;
        let memory = self.allocate_checked(bytes)?;
        Ok(inner
            .resident
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(memory, bytes))
    }

    /// Device memory of `bytes` bytes, checked against the budget (§4.6).
    pub(crate) fn allocate_checked(&self, bytes: u64) -> Result<DeviceMemory, BackendError> {
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
    pub(crate) fn zero_buffer(&self, buffer: &DeviceBuffer) -> Result<(), BackendError> {
        let inner = &self.inner;
        let memory = buffer.memory_for(inner, "clear")?;
        let lane = inner
            .lanes
            .lease()
            .map_err(|e| BackendError::driver("creating a stream", e))?;
        let mut ops: StreamOps<'_, driver::LoadedModule> = StreamOps::empty();
        if !buffer.is_empty() {
            ops.clears.push(super::stream_ops::Clear {
                device: memory.address(),
                bytes: buffer.len() as usize,
            });
        }
        let mut target = LaneTarget::of(&lane);
        // SAFETY: the clear covers exactly the buffer's allocation, which the
        // caller's borrow keeps alive past the synchronize below.
        let result = unsafe { enqueue(&mut ops, &mut target) }
            .map_err(|f| inner.stream_failed("a buffer clear", f.what, f.error))
            .and_then(|()| inner.synchronize(&mut target, "a buffer clear").map(|_| ()));
        let idle = result.is_ok();
        inner.release(
            lane,
            Held {
                resident: SmallVec::new(),
                transients: SmallVec::new(),
                pinned: SmallVec::new(),
            },
            idle,
        );
        result
    }

    /// Copy `data` into the start of a resident buffer (`data` may be shorter).
    /// Blocks until the copy is done (one synchronize).
    pub fn upload_resident(
        &self,
        handle: &ResidentBuffer,
        data: &[u8],
    ) -> Result<(), BackendError> {
        self.resident_transfer(handle, Transfer::Upload(data))
    }

    /// Read a whole resident buffer.
    pub fn read_resident(&self, handle: &ResidentBuffer) -> Result<Vec<u8>, BackendError> {
        let mut out = vec![0u8; handle.len() as usize];
        self.read_resident_into(handle, &mut out)?;
        Ok(out)
    }

    /// Read the first `out.len()` bytes of a resident buffer into `out` (no heap
    /// allocation once the lane's staging is large enough).
    pub fn read_resident_into(
        &self,
        handle: &ResidentBuffer,
        out: &mut [u8],
    ) -> Result<(), BackendError> {
        self.resident_transfer(handle, Transfer::Read(out))
    }

    /// Free a resident buffer. The handle (and every copy of it) becomes invalid;
    /// a dispatch still running keeps the memory alive until it finishes.
    pub fn free_resident(&self, handle: ResidentBuffer) -> Result<(), BackendError> {
        let inner = &self.inner;
        let memory = inner
            .resident
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&handle)?;
        if inner.check_alive().is_ok() && inner.bind().is_ok() {
            drop(memory);
        } else {
            std::mem::forget(memory);
        }
        Ok(())
    }

    /// Shared body of resident uploads and reads: lease a lane, stage, enqueue one
    /// copy, synchronize, and (for reads) copy the staged bytes out.
    fn resident_transfer(
        &self,
        handle: &ResidentBuffer,
        transfer: Transfer<'_, '_>,
    ) -> Result<(), BackendError> {
        let inner = &self.inner;
        let verb = match &transfer {
            Transfer::Upload(_) => "upload",
            Transfer::Read(_) => "read",
        };
        inner.check_alive()?;
        let memory = Arc::clone(
            inner
                .resident
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(handle, verb)?,
        );
        self.transfer(memory, handle.len(), transfer)
    }

    /// One blocking copy between host bytes and the start of `memory` (which holds
    /// `capacity` bytes): lease a lane, stage, enqueue, synchronize, copy out.
    pub(crate) fn transfer(
        &self,
        memory: Arc<DeviceMemory>,
        capacity: u64,
        transfer: Transfer<'_, '_>,
    ) -> Result<(), BackendError> {
        let inner = &self.inner;
        let (verb, len) = match &transfer {
            Transfer::Upload(data) => ("upload", data.len()),
            Transfer::Read(out) => ("read", out.len()),
        };
        inner.check_alive()?;
        if len as u64 > capacity {
            return Err(BackendError::bad_input(format!(
                "Fix: cannot {verb} {len} bytes: the buffer holds {capacity} bytes; allocate a larger one \
                 or {verb} fewer bytes"
            )));
        }
        inner.bind()?;
        let mut lane = inner
            .lanes
            .lease()
            .map_err(|e| BackendError::driver("creating a stream", e))?;
        // Static names: a warm transfer allocates nothing on the heap.
        let name = match transfer {
            Transfer::Upload(_) => "a buffer upload",
            Transfer::Read(_) => "a buffer read",
        };
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
        let mut target = LaneTarget::of(&lane);
        // SAFETY: staging holds len bytes and is not touched until the synchronize
        // below; [address, address+len) is inside the live allocation (len checked
        // against the handle above), which `memory` keeps alive past it.
        let result = unsafe { enqueue(&mut ops, &mut target) }
            .map_err(|f| inner.stream_failed(name, f.what, f.error))
            .and_then(|()| inner.synchronize(&mut target, name).map(|_| ()));
        if let (Ok(()), Some(out)) = (&result, out) {
            readback_deliver(&ops.readback, &lane.staging, out);
        }
        let held = Held {
            resident: smallvec::smallvec![memory],
            transients: SmallVec::new(),
            pinned: SmallVec::new(),
        };
        inner.release(lane, held, result.is_ok());
        result
    }
}

fn readback_deliver(readback: &Readback<'_>, staging: &driver::PinnedMemory, out: &mut [u8]) {
    readback.deliver(staging, None, |_, bytes| out.copy_from_slice(bytes));
}

/// One resident transfer: bytes going up, or a buffer to fill.
pub(crate) enum Transfer<'d, 'o> {
    Upload(&'d [u8]),
    Read(&'o mut [u8]),
}

pub(crate) fn with_outputs(timing: DispatchTiming, outputs: Outputs) -> TimedDispatch {
    TimedDispatch {
        outputs,
        wall_ns: timing.wall_ns,
        enqueue_ns: timing.enqueue_ns,
        wait_ns: timing.wait_ns,
        device_window_ns: timing.device_window_ns,
        kernel_ns: timing.kernel_ns,
    }
}

impl BackendInner {
    /// Check bound byte sizes (one per binding, in binding order) against `kernel`:
    /// the kernel belongs to this backend, the binding count matches, static buffers
    /// get exactly their size and runtime buffers a whole number of elements that
    /// fits a `u32` count, and `fixpoint_iterations` is at least 1. Pure; shared by
    /// dispatches and graph recording (`crate::graph`).
    pub(crate) fn check_bindings(
        &self,
        kernel: &KernelInner,
        sizes: &[u64],
        config: &DispatchConfig,
    ) -> Result<(), BackendError> {
        if kernel.backend_id != self.id {
            return Err(BackendError::InvalidHandle {
                message: format!(
                    "Fix: the kernel for {} was compiled by another CudaBackend; compile it with this one",
                    kernel.name
                ),
            });
        }
        check_binding_sizes(
            &kernel.name,
            &kernel.slots,
            sizes,
            config.fixpoint_iterations,
        )
    }

    /// Prepare: check bindings against the kernel and plan the readback. Pure.
    fn plan_bindings(
        &self,
        kernel: &KernelInner,
        bindings: &[Binding<'_>],
        config: &DispatchConfig,
        sizes: &mut PerBinding<u64>,
        reads: &mut PerBinding<ReadItem>,
    ) -> Result<(usize, usize), BackendError> {
        sizes.extend(bindings.iter().map(Binding::len));
        self.check_bindings(kernel, sizes, config)?;
        let mut upload_bytes = 0usize;
        for (slot, binding) in kernel.slots.iter().zip(bindings) {
            if let Binding::Borrowed(b) = binding {
                if slot.access != Access::WriteOnly {
                    upload_bytes = upload_bytes.saturating_add(align_up(b.len()));
                }
            }
        }
        let staging = plan_readback(
            &kernel.name,
            &kernel.slots,
            &kernel.outputs,
            sizes,
            &config.readback,
            upload_bytes,
            reads,
        )?;
        Ok((upload_bytes, staging))
    }

    /// Run one dispatch of a resolved kernel: submit, then complete.
    fn execute(
        &self,
        request: Request<'_, '_>,
        sink: Sink<'_, '_>,
        probe: Option<DispatchProbe>,
    ) -> Result<DispatchTiming, BackendError> {
        let kernel = request.kernel;
        let Submitted {
            in_flight,
            lease,
            mark,
        } = self.submit(request, &sink, probe.is_some())?;
        let result = self.complete(kernel, in_flight, sink, mark);
        drop(lease);
        let timing = result?;
        if let Some(probe) = probe {
            probe.finish(timing);
        }
        Ok(timing)
    }

    /// Prepare, stage and enqueue one dispatch on a leased lane; nothing waits. The
    /// returned lease (grid-sync kernels only) must be held until [`Self::complete`].
    pub(crate) fn submit<'k>(
        &self,
        request: Request<'k, '_>,
        sink: &Sink<'_, '_>,
        probe_on: bool,
    ) -> Result<Submitted<'k>, BackendError> {
        let Request {
            kernel,
            bindings,
            config,
            start,
            mark,
            after,
            ..
        } = request;
        let timed = request.want_timing || probe_on;
        self.check_alive()?;

        // prepare: binding plan checks, readback plan, launch plan, cooperative residency.
        let mut sizes: PerBinding<u64> = SmallVec::new();
        let mut reads: PerBinding<ReadItem> = SmallVec::new();
        let (upload_bytes, staging_bytes) =
            self.plan_bindings(kernel, bindings, config, &mut sizes, &mut reads)?;
        if let Sink::Slices(outputs) = sink {
            if outputs.len() != reads.len()
                || outputs
                    .iter()
                    .zip(&reads)
                    .any(|(o, r)| o.len() as u64 != r.len)
            {
                let wanted: Vec<u64> = reads.iter().map(|r| r.len).collect();
                return Err(BackendError::bad_input(format!(
                    "Fix: dispatch_kernel_into needs {} output slices of lengths {:?} (one per readback item) \
                     but got lengths {:?}",
                    reads.len(),
                    wanted,
                    outputs.iter().map(|o| o.len()).collect::<Vec<_>>()
                )));
            }
        }
        let plan = self.launch_plan(kernel, config.workgroups)?;
        if kernel.grid_barrier.is_some() && plan.grid_blocks > kernel.max_coresident_blocks {
            return Err(BackendError::GridTooLargeForGridSync {
                program: kernel.name.clone(),
                grid_blocks: plan.grid_blocks,
                max_coresident: kernel.max_coresident_blocks,
            });
        }
        if probe_on {
            probe::count_with(Count::Nodes, || kernel.program.node_count());
            probe::count_with(Count::PtxBytes, || kernel.ptx.len() as u64);
            probe::count_with(Count::Buffers, || kernel.program.buffers().len() as u64);
            probe::count_with(Count::Bindings, || bindings.len() as u64);
            probe::count_with(Count::Fixpoint, || config.fixpoint_iterations as u64);
            probe::count_with(Count::GridBlocks, || plan.grid_blocks);
            probe::note_program(|| kernel.module_key.0 as u64);
        }
        let mark = probe::charge_and_mark(Phase::Prepare, mark);

        // stage: lease a lane, resolve bindings, write borrowed inputs into staging.
        self.bind()?;
        let mut lane = self
            .lanes
            .lease()
            .map_err(|e| BackendError::driver("creating a stream and its events", e))?;
        let barrier_staging = align_up(staging_bytes);
        let mut held = Held {
            resident: SmallVec::new(),
            transients: SmallVec::new(),
            pinned: SmallVec::new(),
        };
        let staged = self.stage(
            kernel,
            bindings,
            &sizes,
            &mut lane,
            &mut held,
            barrier_staging + if kernel.grid_barrier.is_some() { 16 } else { 0 },
        );
        let StagedBindings {
            addresses,
            uploads,
            pinned_uploads,
        } = match staged {
            Ok(v) => v,
            Err(e) => {
                self.release(lane, held, false);
                return Err(e);
            }
        };
        debug_assert!(uploads.iter().map(|u| align_up(u.len)).sum::<usize>() <= upload_bytes);
        let mark = probe::charge_and_mark(Phase::Stage, mark);

        // resolve: the one description of the dispatch's stream operations. Small
        // readback items become result-ABI descriptors (the kernel's last thread
        // copies them into the lane's mapped area); the rest stay DMA copies.
        if lane.results.is_none() {
            match ResultArea::new() {
                Ok(area) => {
                    lane.results = Some(area);
                    self.staging_allocations
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                Err(e) => {
                    self.release(lane, held, false);
                    return Err(BackendError::driver("allocating the result area", e));
                }
            }
        }
        let mut routes: PerBinding<Route> = SmallVec::new();
        let threads = kernel.workgroup_size.iter().product::<u32>();
        route_reads(
            &reads,
            RESULT_AREA_BYTES,
            mapped_range_limit(threads),
            &mut routes,
        );
        let area = lane
            .results
            .as_mut()
            .ok_or_else(|| BackendError::internal("no result area"))?;
        let arm_clear = area.arm_host();
        let mut results = area.params();
        let mut copies: PerBinding<StagedCopy> = SmallVec::new();
        let mut deliveries: PerBinding<Delivery> = SmallVec::new();
        let mut area_end = STAMP_BYTES;
        for (r, route) in reads.iter().zip(&routes) {
            let base = addresses[r.slot as usize];
            let source = base + r.offset;
            match *route {
                Route::Mapped { offset } => {
                    // route_reads bounded len by MAPPED_RANGE_MAX_BYTES (< u32::MAX)
                    // and took at most RESULT_RANGE_SLOTS items, so a slot is free.
                    let memory = base..base + sizes[r.slot as usize];
                    let Some(delivered) = results.describe(source, r.len as u32, offset, memory)
                    else {
                        self.release(lane, held, false);
                        return Err(BackendError::internal(
                            "a mapped readback found no free result descriptor",
                        ));
                    };
                    let delivered = delivered as usize;
                    area_end = area_end.max(delivered + r.len as usize);
                    deliveries.push(Delivery::Area {
                        offset: delivered,
                        len: r.len as usize,
                    });
                }
                Route::Copy => {
                    copies.push(StagedCopy {
                        device: source,
                        staging_offset: r.staging_offset,
                        len: r.len as usize,
                    });
                    deliveries.push(Delivery::Staging {
                        offset: r.staging_offset,
                        len: r.len as usize,
                    });
                }
            }
        }
        let area_copy = area.copy_back(area_end);
        let mut ops = StreamOps::dispatch(
            &kernel.slots,
            &addresses,
            &sizes,
            KernelLaunch {
                module: &kernel.module,
                grid: plan.grid,
                block: plan.block,
                iterations: config.fixpoint_iterations,
                grid_barrier: kernel.grid_barrier,
            },
        );
        ops.uploads = uploads;
        ops.pinned_uploads = pinned_uploads;
        if let Some((device, bytes)) = arm_clear {
            ops.clears.push(Clear { device, bytes });
        }
        ops.parameters.results = Some(results);
        ops.readback = Readback::Routed {
            copies: &copies,
            deliveries: &deliveries,
            area_copy,
        };
        ops.barrier_readback = kernel.grid_barrier.map(|counter| StagedCopy {
            device: counter,
            staging_offset: barrier_staging,
            len: 4 * crate::codegen::GRID_BARRIER_WORDS,
        });
        ops.timed = timed;
        let window = ops.window_marks();
        let mark = probe::charge_and_mark(Phase::Resolve, mark);

        // lease: the grid barrier counter is module-global.
        let lease = kernel.grid_barrier.map(|_| {
            kernel
                .barrier_lease
                .lock()
                .unwrap_or_else(|p| p.into_inner())
        });
        let mark = probe::charge_and_mark(Phase::Lease, mark);

        // order: after every dispatch in flight that shares written memory with this
        // one (`ordering`), and after an explicitly named one; on the device only.
        let mut accesses = Accesses::default();
        for ((slot, binding), &address) in kernel.slots.iter().zip(bindings).zip(&addresses) {
            if matches!(binding, Binding::Resident(_) | Binding::Buffer(_)) {
                if slot.access == Access::ReadOnly {
                    accesses.reads.push(address);
                } else {
                    accesses.writes.push(address);
                }
            }
        }
        let explicit = after.map(|previous| (&*previous.lane.stream, &*previous.lane.order));
        if let Err(error) = self
            .in_flight
            .order_after(&accesses, &lane.stream, explicit)
        {
            let error = self.stream_failed(&kernel.name, "ordering it after a dispatch", error);
            drop(lease);
            self.release(lane, held, false);
            return Err(error);
        }

        // launch: every stream operation (uploads, clears, launches, readback copies).
        let mut target = LaneTarget::of(&lane);
        // SAFETY: every address in `ops` is a resolved binding whose memory `held`
        // keeps alive (resident Arcs, transient buffers), the kernel's barrier symbol
        // (alive with the kernel) or the lane's result area (alive with the lane);
        // staging was sized by `stage` for the uploads, the readback plan and the
        // barrier words, and nothing on the host touches it (or the area) until
        // `complete` has synchronised the stream. Every result descriptor names a
        // range plan_readback bounds-checked against its binding and a destination
        // route_reads placed inside the area.
        let enqueued = unsafe { enqueue(&mut ops, &mut target) };
        if let Err(failure) = enqueued {
            let error = self.enqueue_failed(kernel, failure, &plan);
            drop(lease);
            self.release(lane, held, false);
            return Err(error);
        }
        self.in_flight.enter(&lane.stream, &lane.order, accesses);
        let enqueued = Instant::now();
        let mark = probe::charge_and_mark(Phase::Launch, mark);
        drop(ops);
        Ok(Submitted {
            in_flight: InFlight {
                lane,
                held,
                reads: copies,
                deliveries,
                barrier: kernel
                    .grid_barrier
                    .map(|_| (barrier_staging, plan.grid_blocks)),
                timed,
                window,
                start,
                enqueue_ns: u64::try_from(enqueued.duration_since(start).as_nanos())
                    .unwrap_or(u64::MAX),
            },
            lease,
            mark,
        })
    }

    /// Resolve every binding to a device address, take transient buffers for
    /// borrowed ones and write their bytes into staging. Returns the addresses and
    /// the upload copies.
    fn stage(
        &self,
        kernel: &KernelInner,
        bindings: &[Binding<'_>],
        sizes: &[u64],
        lane: &mut Lane,
        held: &mut Held,
        staging_needed: usize,
    ) -> Result<StagedBindings, BackendError> {
        if lane
            .ensure_staging(staging_needed)
            .map_err(|e| BackendError::driver("allocating pinned staging", e))?
        {
            self.staging_allocations
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let any_resident = bindings.iter().any(|b| matches!(b, Binding::Resident(_)));
        let any_borrowed = bindings
            .iter()
            .any(|b| matches!(b, Binding::Borrowed(_) | Binding::Pinned(_)));
        if any_borrowed {
            self.preflight(kernel, bindings, sizes)?;
        }
        let table = if any_resident {
            Some(self.resident.lock().unwrap_or_else(|p| p.into_inner()))
        } else {
            None
        };
        let mut addresses: PerBinding<u64> = SmallVec::new();
        let mut uploads: SmallVec<[StagedCopy; 16]> = SmallVec::new();
        let mut pinned_uploads: SmallVec<[PinnedCopy; 4]> = SmallVec::new();
        let mut upload_offset = 0usize;
        for ((slot, binding), &bytes) in kernel.slots.iter().zip(bindings).zip(sizes) {
            match binding {
                Binding::Resident(handle) => {
                    let memory = table
                        .as_ref()
                        .map(|t| t.get(handle, "dispatch with"))
                        .unwrap_or_else(|| {
                            Err(BackendError::internal("the resident table was not locked"))
                        })?;
                    addresses.push(memory.address());
                    held.resident.push(Arc::clone(memory));
                }
                Binding::Buffer(buffer) => {
                    let memory = buffer.memory_for(self, "dispatch with")?;
                    addresses.push(memory.address());
                    held.resident.push(Arc::clone(memory));
                }
                Binding::Pinned(pinned) => {
                    let host = pinned.memory_for(self, "dispatch with")?;
                    let memory = self.transients.take(bytes).map_err(|e| {
                        BackendError::driver(format!("allocating {bytes} transient bytes"), e)
                    })?;
                    let address = memory.address();
                    held.transients.push(memory);
                    addresses.push(address);
                    if slot.access != Access::WriteOnly && bytes > 0 {
                        pinned_uploads.push(PinnedCopy {
                            device: address,
                            host: host.address(0),
                            len: bytes as usize,
                        });
                    }
                    held.pinned.push(Arc::clone(host));
                }
                Binding::Borrowed(data) => {
                    let memory = self.transients.take(bytes).map_err(|e| {
                        BackendError::driver(format!("allocating {bytes} transient bytes"), e)
                    })?;
                    let address = memory.address();
                    held.transients.push(memory);
                    addresses.push(address);
                    if slot.access != Access::WriteOnly && !data.is_empty() {
                        lane.staging.write(upload_offset, data);
                        uploads.push(StagedCopy {
                            device: address,
                            staging_offset: upload_offset,
                            len: data.len(),
                        });
                        upload_offset += align_up(data.len());
                    }
                }
            }
        }
        Ok(StagedBindings {
            addresses,
            uploads,
            pinned_uploads,
        })
    }

    /// The error for a refused stream operation: a cooperative launch too large is
    /// its own error; a sticky status marks the context lost.
    fn enqueue_failed(
        &self,
        kernel: &KernelInner,
        failure: EnqueueFailure,
        plan: &LaunchPlan,
    ) -> BackendError {
        if failure.error.is_cooperative_launch_too_large() {
            return BackendError::GridTooLargeForGridSync {
                program: kernel.name.clone(),
                grid_blocks: plan.grid_blocks,
                max_coresident: kernel.max_coresident_blocks,
            };
        }
        self.stream_failed(&kernel.name, failure.what, failure.error)
    }

    /// A driver call on a stream failed: a sticky status poisons the device
    /// (invariant 9). Shared by dispatches, graphs and resident transfers.
    pub(crate) fn stream_failed(&self, name: &str, what: &str, error: DriverError) -> BackendError {
        if error.is_sticky() {
            self.mark_context_lost(format!("{name} failed while {what}: {error}"));
        }
        BackendError::driver(format!("{what} for {name}"), error)
    }

    /// The one synchronize of a dispatch (or replay, or transfer) and its fault
    /// handling: a failure is a `KernelFault` naming `name`, and a sticky one
    /// marks the context lost. Returns the host time blocked.
    pub(crate) fn synchronize<T: StreamTarget>(
        &self,
        target: &mut T,
        name: &str,
    ) -> Result<u64, BackendError> {
        self.synchronize_with(name, || target.synchronize())
    }

    /// [`BackendInner::synchronize`] around any synchronizing call (a graph
    /// replay's stream).
    pub(crate) fn synchronize_with(
        &self,
        name: &str,
        synchronize: impl FnOnce() -> driver::DriverResult<()>,
    ) -> Result<u64, BackendError> {
        let wait_start = Instant::now();
        let synced = synchronize();
        let wait_ns = elapsed_ns(wait_start);
        match synced {
            Ok(()) => Ok(wait_ns),
            Err(error) => {
                let context_usable = !error.is_sticky();
                if !context_usable {
                    self.mark_context_lost(format!("{name} faulted: {error}"));
                }
                Err(BackendError::KernelFault {
                    program: name.to_string(),
                    error,
                    context_usable,
                })
            }
        }
    }

    /// Wait for a submitted dispatch: the one synchronize, the barrier audit, the
    /// device times, the host side of the readback, and the lane's return.
    pub(crate) fn complete(
        &self,
        kernel: &KernelInner,
        in_flight: InFlight,
        sink: Sink<'_, '_>,
        mark: Option<Instant>,
    ) -> Result<DispatchTiming, BackendError> {
        self.complete_with_spans(kernel, in_flight, sink, mark, None)
    }

    /// [`BackendInner::complete`], also measuring the dispatch's device instants
    /// after an origin event (a timed dispatch only) before its lane is reused.
    pub(crate) fn complete_with_spans(
        &self,
        kernel: &KernelInner,
        in_flight: InFlight,
        sink: Sink<'_, '_>,
        mark: Option<Instant>,
        spans: Option<(&Event, &mut Option<DeviceSpans>)>,
    ) -> Result<DispatchTiming, BackendError> {
        let InFlight {
            lane,
            held,
            reads,
            deliveries,
            barrier,
            timed,
            window,
            start,
            enqueue_ns,
        } = in_flight;
        let mut target = LaneTarget::of(&lane);
        let waited = self.synchronize(&mut target, &kernel.name);
        let wait_ns = match waited {
            Ok(ns) => ns,
            Err(e) => {
                self.release(lane, held, false);
                return Err(e);
            }
        };
        if let Some((offset, grid_blocks)) = barrier {
            let raw = lane.staging.slice(offset, 12);
            let word = |i: usize| {
                u32::from_le_bytes([raw[4 * i], raw[4 * i + 1], raw[4 * i + 2], raw[4 * i + 3]])
            };
            let words = [word(0), word(1), word(2)];
            if words[0] != 0 || grid_blocks == 0 || !(words[2] as u64).is_multiple_of(grid_blocks) {
                self.release(lane, held, true);
                return Err(BackendError::GridBarrierAudit {
                    program: kernel.name.clone(),
                    words,
                    grid_blocks,
                });
            }
        }
        let mut timing = DispatchTiming {
            wall_ns: 0,
            enqueue_ns,
            wait_ns,
            device_window_ns: 0,
            kernel_ns: 0,
        };
        let stamps = lane.results.as_ref().and_then(|area| area.stamps());
        if stamps.is_none() {
            // The kernel did not finish its epilogue: the area may hold an earlier
            // dispatch's bytes, which must never be returned as this one's.
            self.release(lane, held, true);
            return Err(BackendError::internal(format!(
                "{} completed without writing its end stamp, so its mapped results cannot be trusted",
                kernel.name
            )));
        }
        timing.kernel_ns = stamp_kernel_ns(stamps);
        if timed {
            timing.device_window_ns =
                Event::elapsed_ns(target.event(window.0), target.event(window.1)).unwrap_or(0);
            if let Some((origin, out)) = spans {
                let after = |mark| Event::elapsed_ns(origin, target.event(mark)).unwrap_or(0);
                *out = Some(DeviceSpans {
                    window_start_ns: after(window.0),
                    kernel_start_ns: after(DeviceMark::KernelStart),
                    kernel_end_ns: after(DeviceMark::KernelEnd),
                    window_end_ns: after(window.1),
                });
            }
        }
        let mark = probe::charge_and_mark(Phase::Release, mark);

        // readback (host side): copy mapped and staged bytes out.
        let readback = Readback::Routed {
            copies: &reads,
            deliveries: &deliveries,
            area_copy: None,
        };
        let area = lane.results.as_ref();
        match sink {
            Sink::Packed(out) => {
                let total = deliveries.iter().map(Delivery::len).sum();
                *out = Outputs::with_capacity(total);
                readback.deliver(&lane.staging, area, |_, bytes| out.push(bytes));
            }
            Sink::Slices(out) => {
                readback.deliver(&lane.staging, area, |i, bytes| {
                    out[i].copy_from_slice(bytes)
                });
            }
        }
        self.release(lane, held, true);
        probe::charge(Phase::Readback, mark);
        timing.wall_ns = elapsed_ns(start);
        Ok(timing)
    }

    /// Return a dispatch's lane and transient buffers. After a failure the stream
    /// may still hold work, so it is synchronised first; when that fails or the
    /// context is gone, everything is forgotten instead (its handles died with the
    /// context, or the device may still use the memory).
    pub(crate) fn release(&self, lane: Lane, mut held: Held, stream_idle: bool) {
        self.in_flight.leave(&lane.stream);
        let alive = self.check_alive().is_ok();
        let idle = alive && (stream_idle || lane.stream.synchronize().is_ok());
        if idle {
            for memory in held.transients.drain(..) {
                self.transients.put(memory);
            }
            self.lanes.give_back(lane);
        } else {
            for memory in held.transients.drain(..) {
                std::mem::forget(memory);
            }
            std::mem::forget(lane);
        }
        if !idle {
            // Dead context: the handles died with it. Busy stream: the device may
            // still use the memory, so leaking it is the only safe choice.
            for memory in held.resident.drain(..) {
                std::mem::forget(memory);
            }
            for memory in held.pinned.drain(..) {
                std::mem::forget(memory);
            }
        }
    }

    /// Memory preflight for borrowed bindings (§4.6).
    fn preflight(
        &self,
        kernel: &KernelInner,
        bindings: &[Binding<'_>],
        sizes: &[u64],
    ) -> Result<(), BackendError> {
        let requests: SmallVec<[u64; 16]> = bindings
            .iter()
            .zip(sizes)
            .filter(|(b, _)| matches!(b, Binding::Borrowed(_) | Binding::Pinned(_)))
            .map(|(_, &s)| s)
            .collect();
        let overflow = || BackendError::OverBudget {
            required: u64::MAX,
            available: 0,
        };
        let required = budget::required_bytes(requests.iter().copied()).ok_or_else(overflow)?;
        let missing = self
            .transients
            .missing_bytes(&requests)
            .ok_or_else(overflow)?;
        if missing == 0 {
            return Ok(()); // every bucket is served from the idle pool: nothing new.
        }
        let inputs = || -> Result<BudgetInputs, BackendError> {
            let (live_free, _) = driver::memory_info()
                .map_err(|e| BackendError::driver("querying free memory", e))?;
            Ok(BudgetInputs {
                total: self.caps.total_memory,
                resident: self.held_bytes(),
                pooled: self.transients.pooled_bytes(),
                live_free,
            })
        };
        if budget::check(required, &inputs()?).is_ok() {
            return Ok(());
        }
        tracing::info!(program = %kernel.name, required, "over budget: dropping the transient pool and re-checking");
        self.transients.drain(false);
        budget::check(required, &inputs()?).map_err(|available| BackendError::OverBudget {
            required,
            available,
        })
    }
}
