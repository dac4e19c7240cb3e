//! Dispatch (§4.5): bindings → staged buffers → one launch loop → async readback →
//! one synchronize, charged phase by phase to the probe.
//!
//! The order of work on a dispatch's stream is fixed: [outer start event], uploads
//! and output clears, `fixpoint_iterations` launches (with the grid barrier reset
//! before each one for grid-sync programs), one async device→host copy per readback
//! item routed to DMA, [outer end event], then exactly one `cuStreamSynchronize`.
//! Readback items of at most `readback::MAPPED_RANGE_MAX_BYTES` (up to 16 of them)
//! are not copied at all: the kernel's last thread writes them into the lane's
//! host-mapped result area (`readback` module docs; §0: 9.7–9.9 µs per dispatch for
//! 1–16 outputs against 11.6–35.0 µs with one async copy each).
//!
//! Device time: `kernel_ns` comes from the `%globaltimer` stamps the kernel writes
//! itself (earliest block start of the first launch to the end of the last thread of
//! the last launch), so timing costs nothing. The outer event pair
//! (`device_window_ns`, the whole stream window: uploads, clears, launches, copies)
//! is recorded only when asked for explicitly
//! ([`CudaBackend::dispatch_kernel_into_timed`]) or with the probe on: on driver 580
//! the records and elapsed-time queries cost about 10 µs per dispatch.

use std::sync::Arc;
use std::time::Instant;

use smallvec::SmallVec;

use crate::config::DispatchConfig;
use crate::ir::{Access, Program};
use crate::probe::{self, Count, DispatchProbe, DispatchTiming, Phase};

use super::budget::{self, BudgetInputs};
use super::driver::{self, DeviceMemory, Event};
use super::kernel::KernelInner;
use super::plan::{align_up, check_binding_sizes, plan_readback, ReadItem};
use super::pool::Lane;
use super::readback::{
    route_reads, stamp_kernel_ns, ResultArea, Route, MAPPED_RANGE_MAX_BYTES, RESULT_AREA_BYTES,
    STAMP_BYTES,
};
use super::{BackendError, BackendInner, CudaBackend, Kernel, LaunchPlan, ResidentBuffer};

/// One buffer binding of a dispatch, in the program's binding order.
#[derive(Clone, Copy, Debug)]
pub enum Binding<'a> {
    /// A resident buffer: used in place; outputs stay in it (and are also read back
    /// per the readback policy).
    Resident(ResidentBuffer),
    /// Host bytes staged into a pooled transient buffer for this dispatch only.
    /// `WriteOnly` outputs are zeroed on the device (the slice gives only the size).
    Borrowed(&'a [u8]),
}

/// Outputs and timings of one dispatch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TimedDispatch {
    /// Bytes read back, one entry per readback item (see [`ReadbackPolicy`](crate::ReadbackPolicy)).
    pub outputs: Vec<Vec<u8>>,
    /// The whole call, host clock.
    pub wall_ns: u64,
    /// Host time until the last asynchronous operation was enqueued.
    pub enqueue_ns: u64,
    /// Host time blocked in the one synchronize.
    pub wait_ns: u64,
    /// Device time between the outer event pair (uploads to the last DMA copy), or 0
    /// when no events were recorded (they are recorded only by
    /// [`CudaBackend::dispatch_kernel_into_timed`] and with the probe on).
    pub device_window_ns: u64,
    /// Device time of the launch loop from the kernel's own `%globaltimer` stamps:
    /// earliest block start of the first launch to the moment the last thread of the
    /// last launch finished (32 ns ticks on the H200). Always measured, at no cost.
    pub kernel_ns: u64,
}

/// Where read-back bytes go.
enum Sink<'s, 'o> {
    Vecs(&'s mut Vec<Vec<u8>>),
    Slices(&'s mut [&'o mut [u8]]),
}

/// A binding resolved to a device address.
#[derive(Clone, Copy)]
struct Resolved {
    address: u64,
    bytes: u64,
}

fn elapsed_ns(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// One dispatch as the public entry points received it.
#[derive(Clone, Copy)]
struct Request<'r, 'b> {
    kernel: &'r KernelInner,
    bindings: &'r [Binding<'b>],
    config: &'r DispatchConfig,
    /// Record the outer event pair for `device_window_ns` (an explicit option; the
    /// probe being on forces it). `kernel_ns` always comes from the kernel's stamps.
    want_events: bool,
    /// The call's first instant (the wall clock starts here).
    start: Instant,
    /// Where the next probe phase starts (`None` while the probe is off).
    mark: Option<Instant>,
}

/// What the prepare phase worked out for the rest of the dispatch.
struct Prepared {
    sizes: SmallVec<[u64; 16]>,
    reads: SmallVec<[ReadItem; 16]>,
    /// One route per read (mapped result area or DMA copy).
    routes: SmallVec<[Route; 16]>,
    upload_bytes: usize,
    /// Staging offset of the grid-barrier words (after uploads and readbacks).
    barrier_staging: usize,
    launch: LaunchPlan,
}

/// Resources a dispatch holds between lease and release.
struct Held {
    resident: SmallVec<[Arc<DeviceMemory>; 16]>,
    transients: SmallVec<[DeviceMemory; 16]>,
}

impl CudaBackend {
    /// Dispatch `program` over borrowed host inputs, one per global buffer in binding
    /// order (see [`Program::global_buffers`]); returns the read-back outputs.
    pub fn dispatch(
        &self,
        program: &Program,
        inputs: &[&[u8]],
        config: &DispatchConfig,
    ) -> Result<Vec<Vec<u8>>, BackendError> {
        let bindings: SmallVec<[Binding; 16]> =
            inputs.iter().map(|b| Binding::Borrowed(b)).collect();
        Ok(self.run_program(program, &bindings, config, false)?.outputs)
    }

    /// Dispatch `program` over resident buffers, one per global buffer in binding order.
    pub fn dispatch_resident(
        &self,
        program: &Program,
        handles: &[ResidentBuffer],
        config: &DispatchConfig,
    ) -> Result<Vec<Vec<u8>>, BackendError> {
        let bindings: SmallVec<[Binding; 16]> =
            handles.iter().map(|h| Binding::Resident(*h)).collect();
        Ok(self.run_program(program, &bindings, config, false)?.outputs)
    }

    /// [`CudaBackend::dispatch_resident`] with host timings and `kernel_ns` (from the
    /// kernel's stamps: as cheap as the untimed call).
    pub fn dispatch_resident_timed(
        &self,
        program: &Program,
        handles: &[ResidentBuffer],
        config: &DispatchConfig,
    ) -> Result<TimedDispatch, BackendError> {
        let bindings: SmallVec<[Binding; 16]> =
            handles.iter().map(|h| Binding::Resident(*h)).collect();
        self.run_program(program, &bindings, config, false)
    }

    /// Dispatch with any mix of resident and borrowed bindings, with timings.
    pub fn dispatch_bindings(
        &self,
        program: &Program,
        bindings: &[Binding<'_>],
        config: &DispatchConfig,
    ) -> Result<TimedDispatch, BackendError> {
        self.run_program(program, bindings, config, false)
    }

    /// Dispatch a compiled kernel (no lookups at all), with timings.
    pub fn dispatch_kernel(
        &self,
        kernel: &Kernel,
        bindings: &[Binding<'_>],
        config: &DispatchConfig,
    ) -> Result<TimedDispatch, BackendError> {
        let mut outputs = Vec::new();
        let timing = self.run_kernel(kernel, bindings, config, Sink::Vecs(&mut outputs), false)?;
        Ok(with_outputs(timing, outputs))
    }

    /// Dispatch a compiled kernel and read outputs into caller buffers, one per
    /// readback item, each exactly the item's length: the hot path. Once warm it makes
    /// no driver allocation and no heap allocation, and it records no timing events
    /// (on driver 580 the event records and elapsed-time queries of a timed dispatch
    /// cost about 10 µs, more than the launch itself): `kernel_ns` comes from the
    /// kernel's own `%globaltimer` stamps (see [`TimedDispatch::kernel_ns`]) and
    /// `device_window_ns` is 0 unless the probe is on. Use
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
    /// copies). An explicit option: the events cost about 10 µs per dispatch on
    /// driver 580, while `kernel_ns` needs none.
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
        want_events: bool,
    ) -> Result<DispatchTiming, BackendError> {
        let probe = probe::begin_dispatch();
        let start = Instant::now();
        let request = Request {
            kernel: &kernel.inner,
            bindings,
            config,
            want_events,
            start,
            mark: probe.as_ref().map(|_| start),
        };
        self.inner.execute(request, sink, probe)
    }

    fn run_program(
        &self,
        program: &Program,
        bindings: &[Binding<'_>],
        config: &DispatchConfig,
        want_events: bool,
    ) -> Result<TimedDispatch, BackendError> {
        let probe = probe::begin_dispatch();
        let start = Instant::now();
        self.inner.check_alive()?;
        // The wall clock's first instant doubles as the first phase mark.
        let (kernel, mark) =
            self.inner
                .resolve_kernel(program, config, probe.as_ref().map(|_| start))?;
        let mut outputs = Vec::new();
        let request = Request {
            kernel: &kernel,
            bindings,
            config,
            want_events,
            start,
            mark,
        };
        let timing = self
            .inner
            .execute(request, Sink::Vecs(&mut outputs), probe)?;
        Ok(with_outputs(timing, outputs))
    }

    /// Allocate a resident buffer of `bytes` bytes (contents undefined until uploaded).
    pub fn allocate_resident(&self, bytes: u64) -> Result<ResidentBuffer, BackendError> {
        let inner = &self.inner;
        inner.check_alive()?;
        inner.bind()?;
        let (live_free, _) =
            driver::memory_info().map_err(|e| BackendError::driver("querying free memory", e))?;
        let resident = inner
            .resident
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .live_bytes();
        let budget = BudgetInputs {
            total: inner.caps.total_memory,
            resident,
            pooled: inner.transients.pooled_bytes(),
            live_free,
        };
        budget::check(bytes, &budget).map_err(|available| BackendError::OverBudget {
            required: bytes,
            available,
        })?;
        let memory = DeviceMemory::allocate(bytes)
            .map_err(|e| BackendError::driver(format!("allocating {bytes} resident bytes"), e))?;
        Ok(inner
            .resident
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(memory, bytes))
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
        let (verb, len) = match &transfer {
            Transfer::Upload(data) => ("upload", data.len()),
            Transfer::Read(out) => ("read", out.len()),
        };
        inner.check_alive()?;
        let memory = Arc::clone(
            inner
                .resident
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(handle, verb)?,
        );
        if len as u64 > handle.len() {
            return Err(BackendError::bad_input(format!(
                "Fix: cannot {verb} {len} bytes: the resident buffer holds {} bytes; allocate a larger one \
                 or {verb} fewer bytes",
                handle.len()
            )));
        }
        inner.bind()?;
        let mut lane = inner
            .lanes
            .lease()
            .map_err(|e| BackendError::driver("creating a stream", e))?;
        let failed = |what: &str, e: driver::DriverError| {
            if e.is_sticky() {
                inner.mark_context_lost(format!("a resident {verb} failed: {e}"));
            }
            BackendError::driver(format!("{what} a resident {verb}"), e)
        };
        let result = (|| {
            if lane
                .ensure_staging(len)
                .map_err(|e| BackendError::driver("allocating pinned staging", e))?
            {
                inner
                    .staging_allocations
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            match transfer {
                Transfer::Upload(data) => {
                    lane.staging.write(0, data);
                    // SAFETY: staging holds len bytes and is not touched until the
                    // synchronize below; [address, address+len) is inside the live
                    // allocation (len checked against the handle above), which `memory`
                    // keeps alive.
                    unsafe {
                        driver::copy_to_device_async(
                            memory.address(),
                            lane.staging.address(0),
                            len,
                            &lane.stream,
                        )
                    }
                    .map_err(|e| failed("enqueueing", e))?;
                    lane.stream
                        .synchronize()
                        .map_err(|e| failed("waiting for", e))?;
                }
                Transfer::Read(out) => {
                    // SAFETY: as above, and staging is read only after the synchronize.
                    unsafe {
                        driver::copy_to_host_async(
                            lane.staging.address(0),
                            memory.address(),
                            len,
                            &lane.stream,
                        )
                    }
                    .map_err(|e| failed("enqueueing", e))?;
                    lane.stream
                        .synchronize()
                        .map_err(|e| failed("waiting for", e))?;
                    out.copy_from_slice(lane.staging.slice(0, len));
                }
            }
            Ok(())
        })();
        inner.finish_lane(lane, result.is_ok());
        result
    }
}

/// One resident transfer: bytes going up, or a buffer to fill.
enum Transfer<'d, 'o> {
    Upload(&'d [u8]),
    Read(&'o mut [u8]),
}

fn with_outputs(timing: DispatchTiming, outputs: Vec<Vec<u8>>) -> TimedDispatch {
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
    /// Return a lane to the pool. After a failure its stream may still hold work,
    /// so it is synchronised first; after a context loss it is forgotten.
    fn finish_lane(&self, lane: Lane, clean: bool) {
        if self.check_alive().is_err() {
            std::mem::forget(lane);
            return;
        }
        if !clean && lane.stream.synchronize().is_err() {
            std::mem::forget(lane);
            return;
        }
        self.lanes.give_back(lane);
    }

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
        sizes: &mut SmallVec<[u64; 16]>,
        reads: &mut SmallVec<[ReadItem; 16]>,
    ) -> Result<(usize, usize), BackendError> {
        sizes.extend(bindings.iter().map(|binding| match binding {
            Binding::Resident(h) => h.len(),
            Binding::Borrowed(b) => b.len() as u64,
        }));
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

    /// Run one dispatch of a resolved kernel.
    fn execute(
        &self,
        request: Request<'_, '_>,
        sink: Sink<'_, '_>,
        probe: Option<DispatchProbe>,
    ) -> Result<DispatchTiming, BackendError> {
        let Request {
            kernel,
            bindings,
            config,
            start,
            mark,
            ..
        } = request;
        let want_events = request.want_events || probe.is_some();
        self.check_alive()?;

        // prepare: binding plan checks, readback plan, launch plan, cooperative residency.
        let mut sizes: SmallVec<[u64; 16]> = SmallVec::new();
        let mut reads: SmallVec<[ReadItem; 16]> = SmallVec::new();
        let (upload_bytes, staging_bytes) =
            self.plan_bindings(kernel, bindings, config, &mut sizes, &mut reads)?;
        if let Sink::Slices(outputs) = &sink {
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
        if probe.is_some() {
            probe::count_with(Count::Nodes, || kernel.program.node_count());
            probe::count_with(Count::PtxBytes, || kernel.ptx.len() as u64);
            probe::count_with(Count::Buffers, || kernel.program.buffers().len() as u64);
            probe::count_with(Count::Bindings, || bindings.len() as u64);
            probe::count_with(Count::Fixpoint, || config.fixpoint_iterations as u64);
            probe::count_with(Count::GridBlocks, || plan.grid_blocks);
        }
        let mark = probe::charge_and_mark(Phase::Prepare, mark);

        // stage: lease a lane, resolve bindings, upload borrowed inputs, clear outputs.
        self.bind()?;
        let mut lane = self
            .lanes
            .lease()
            .map_err(|e| BackendError::driver("creating a stream and its events", e))?;
        let mut held = Held {
            resident: SmallVec::new(),
            transients: SmallVec::new(),
        };
        let mut routes: SmallVec<[Route; 16]> = SmallVec::new();
        route_reads(
            &reads,
            RESULT_AREA_BYTES,
            MAPPED_RANGE_MAX_BYTES,
            &mut routes,
        );
        let prepared = Prepared {
            sizes,
            reads,
            routes,
            upload_bytes,
            barrier_staging: align_up(staging_bytes),
            launch: plan,
        };
        let request = Request {
            want_events,
            ..request
        };
        let result = self.enqueue_and_wait(&request, &prepared, &mut lane, &mut held, mark);
        let Prepared { reads, routes, .. } = prepared;
        // Return transients to the pool only when the stream is known idle.
        let alive = self.check_alive().is_ok();
        let stream_idle = result.is_ok() || (alive && lane.stream.synchronize().is_ok());
        if stream_idle && alive {
            for memory in held.transients.drain(..) {
                self.transients.put(memory);
            }
        } else {
            for memory in held.transients.drain(..) {
                std::mem::forget(memory);
            }
        }
        if !alive {
            for memory in held.resident.drain(..) {
                std::mem::forget(memory);
            }
        }
        drop(held);
        let (mut timing, mark) = match result {
            Ok(v) => v,
            Err(e) => {
                if stream_idle && alive {
                    self.lanes.give_back(lane);
                } else {
                    std::mem::forget(lane);
                }
                return Err(e);
            }
        };

        // readback (host side): copy mapped and staged bytes out.
        let lane_ref = &lane;
        let source = |r: &ReadItem, route: &Route| -> &[u8] {
            match (route, lane_ref.results.as_ref()) {
                (Route::Mapped { offset }, Some(area)) => {
                    area.bytes(*offset as usize, r.len as usize)
                }
                _ => lane_ref.staging.slice(r.staging_offset, r.len as usize),
            }
        };
        match sink {
            Sink::Vecs(out) => {
                out.reserve(reads.len());
                for (r, route) in reads.iter().zip(&routes) {
                    out.push(source(r, route).to_vec());
                }
            }
            Sink::Slices(out) => {
                for ((dst, r), route) in out.iter_mut().zip(&reads).zip(&routes) {
                    dst.copy_from_slice(source(r, route));
                }
            }
        }
        self.lanes.give_back(lane);
        probe::charge(Phase::Readback, mark);
        timing.wall_ns = elapsed_ns(start);
        if let Some(probe) = probe {
            probe.finish(timing);
        }
        Ok(timing)
    }

    /// Everything between lease and the end of the synchronize. Returns the timings
    /// so far and the probe mark for the host-side readback.
    fn enqueue_and_wait(
        &self,
        request: &Request<'_, '_>,
        prepared: &Prepared,
        lane: &mut Lane,
        held: &mut Held,
        mark: Option<Instant>,
    ) -> Result<(DispatchTiming, Option<Instant>), BackendError> {
        let Request {
            kernel,
            bindings,
            config,
            want_events,
            start,
            ..
        } = *request;
        let Prepared {
            ref sizes,
            ref reads,
            ref routes,
            upload_bytes,
            barrier_staging,
            launch: plan,
        } = *prepared;
        let enqueue_error = |what: &str, e: driver::DriverError| {
            if e.is_sticky() {
                self.mark_context_lost(format!("{} failed while {what}: {e}", kernel.name));
            }
            BackendError::driver(format!("{what} for {}", kernel.name), e)
        };
        let grid_sync = kernel.grid_barrier;
        let staging_needed = barrier_staging + if grid_sync.is_some() { 16 } else { 0 };
        if lane
            .ensure_staging(staging_needed)
            .map_err(|e| BackendError::driver("allocating pinned staging", e))?
        {
            self.staging_allocations
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        // The result area (readback::ResultArea): allocated once per lane, armed
        // (stamps cleared) before every launch.
        if lane.results.is_none() {
            lane.results = Some(
                ResultArea::new()
                    .map_err(|e| BackendError::driver("allocating the result area", e))?,
            );
            self.staging_allocations
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        // Events only as an explicit option (or under the probe): the outer window
        // opens before the first enqueued operation and closes after the last one.
        if want_events {
            lane.outer_start
                .record(&lane.stream)
                .map_err(|e| enqueue_error("recording the outer start event", e))?;
        }
        let mut resolved: SmallVec<[Resolved; 16]> = SmallVec::new();
        let any_resident = bindings.iter().any(|b| matches!(b, Binding::Resident(_)));
        let any_borrowed = bindings.iter().any(|b| matches!(b, Binding::Borrowed(_)));
        if any_borrowed {
            self.preflight(kernel, bindings, sizes)?;
        }
        let table = if any_resident {
            Some(self.resident.lock().unwrap_or_else(|p| p.into_inner()))
        } else {
            None
        };
        let mut upload_offset = 0usize;
        for ((slot, binding), &bytes) in kernel.slots.iter().zip(bindings).zip(sizes) {
            match binding {
                Binding::Resident(handle) => {
                    let memory = table
                        .as_ref()
                        .map(|t| t.get(handle, "dispatch with"))
                        .unwrap_or_else(|| {
                            Err(BackendError::bad_input(
                                "Fix: internal: resident table not locked",
                            ))
                        })?;
                    resolved.push(Resolved {
                        address: memory.address(),
                        bytes,
                    });
                    held.resident.push(Arc::clone(memory));
                }
                Binding::Borrowed(data) => {
                    let memory = self.transients.take(bytes).map_err(|e| {
                        BackendError::driver(format!("allocating {bytes} transient bytes"), e)
                    })?;
                    let address = memory.address();
                    held.transients.push(memory);
                    resolved.push(Resolved { address, bytes });
                    if slot.access != Access::WriteOnly && !data.is_empty() {
                        lane.staging.write(upload_offset, data);
                        // SAFETY: staging[upload_offset..+len] was sized by plan_bindings and
                        // is not rewritten before the synchronize; the transient buffer
                        // holds at least `bytes` (its bucket).
                        unsafe {
                            driver::copy_to_device_async(
                                address,
                                lane.staging.address(upload_offset),
                                data.len(),
                                &lane.stream,
                            )
                        }
                        .map_err(|e| enqueue_error("uploading a borrowed input", e))?;
                        upload_offset += align_up(data.len());
                    }
                }
            }
            // WriteOnly means "starts zeroed" on every path (§1), resident or not; a
            // transient buffer may also hold a previous caller's bytes, which must never
            // be visible here.
            if slot.access == Access::WriteOnly && bytes > 0 {
                let address = resolved.last().map_or(0, |r| r.address);
                // SAFETY: [address, address+bytes) is inside the resolved allocation.
                unsafe { driver::fill_bytes_async(address, 0, bytes as usize, &lane.stream) }
                    .map_err(|e| enqueue_error("clearing a write-only output", e))?;
            }
        }
        drop(table);
        debug_assert!(upload_offset <= upload_bytes);
        let mark = probe::charge_and_mark(Phase::Stage, mark);

        // resolve: the parameter array (pointers, then element counts).
        let n = resolved.len();
        let mut addresses: SmallVec<[u64; 16]> = SmallVec::with_capacity(n);
        let mut lengths: SmallVec<[u32; 16]> = SmallVec::with_capacity(n);
        for (slot, r) in kernel.slots.iter().zip(&resolved) {
            addresses.push(r.address);
            lengths.push((r.bytes / slot.elem.size_bytes() as u64) as u32);
        }
        let mut params: SmallVec<[*mut std::ffi::c_void; 32]> = SmallVec::with_capacity(2 * n);
        for a in addresses.iter_mut() {
            params.push(a as *mut u64 as *mut std::ffi::c_void);
        }
        for l in lengths.iter_mut() {
            params.push(l as *mut u32 as *mut std::ffi::c_void);
        }
        // The result ABI's parameters: small readback items become descriptors the
        // kernel's last thread copies into the mapped area.
        let area = lane
            .results
            .as_mut()
            .ok_or_else(|| BackendError::bad_input("Fix: internal: the lane has no result area"))?;
        area.arm(&lane.stream)
            .map_err(|e| enqueue_error("clearing the result stamps", e))?;
        let mut result_params = area.params();
        let mut mapped_end = STAMP_BYTES;
        for (r, route) in reads.iter().zip(routes) {
            if let Route::Mapped { offset } = *route {
                let source = resolved[r.slot as usize].address + r.offset;
                // route_reads bounded len by MAPPED_RANGE_MAX_BYTES (< u32::MAX).
                result_params.describe(source, r.len as u32, offset);
                mapped_end = mapped_end.max(offset as usize + r.len as usize);
            }
        }
        result_params.push_pointers(&mut params);
        let mark = probe::charge_and_mark(Phase::Resolve, mark);

        // lease: the grid barrier counter is module-global.
        let lease = grid_sync.map(|_| {
            kernel
                .barrier_lease
                .lock()
                .unwrap_or_else(|p| p.into_inner())
        });
        let mark = probe::charge_and_mark(Phase::Lease, mark);

        // launch: the loop; the kernel stamps its own start and end.
        let iterations = config.fixpoint_iterations;
        for iteration in 0..iterations {
            result_params.set_launch(iteration, iterations);
            if let Some(counter) = grid_sync {
                // SAFETY: the barrier symbol holds GRID_BARRIER_WORDS u32 words.
                unsafe {
                    driver::fill_words_async(
                        counter,
                        0,
                        crate::codegen::GRID_BARRIER_WORDS,
                        &lane.stream,
                    )
                }
                .map_err(|e| enqueue_error("resetting the grid barrier", e))?;
            }
            // SAFETY: params holds one pointer per kernel parameter in the documented
            // order (buffer addresses, u32 element counts, then the result ABI's five),
            // pointing at locals that outlive this call (`result_params` is not moved
            // after push_pointers); every address is held alive (held.*, the lane's
            // result area) until after the synchronize; every descriptor's range was
            // bounds-checked against its binding by plan_readback and its destination
            // placed inside the area by route_reads.
            unsafe {
                driver::launch(
                    &kernel.module,
                    plan.grid,
                    plan.block,
                    &lane.stream,
                    &mut params,
                    grid_sync.is_some(),
                )
            }
            .map_err(|e| {
                if e.code == cudarc::driver::sys::CUresult::CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE
                {
                    BackendError::GridTooLargeForGridSync {
                        program: kernel.name.clone(),
                        grid_blocks: plan.grid_blocks,
                        max_coresident: kernel.max_coresident_blocks,
                    }
                } else {
                    enqueue_error("launching", e)
                }
            })?;
        }
        let mark = probe::charge_and_mark(Phase::Launch, mark);

        // readback (enqueue): one async copy per item routed to DMA, the result area's
        // used prefix when it lives in device memory, then the barrier words.
        if let Some(area) = lane.results.as_mut() {
            if !area.is_mapped() {
                // SAFETY: the lane owns the area until after the synchronize, and its
                // mirror is read only after it.
                unsafe { area.enqueue_copy_back(mapped_end, &lane.stream) }
                    .map_err(|e| enqueue_error("copying the result area back", e))?;
            }
        }
        for (r, route) in reads.iter().zip(routes) {
            if *route != Route::Copy {
                continue;
            }
            let address = resolved[r.slot as usize].address + r.offset;
            // SAFETY: staging[staging_offset..+len] was sized by plan_bindings; the
            // device range was bounds-checked against the binding's size.
            unsafe {
                driver::copy_to_host_async(
                    lane.staging.address(r.staging_offset),
                    address,
                    r.len as usize,
                    &lane.stream,
                )
            }
            .map_err(|e| enqueue_error("enqueueing a readback copy", e))?;
        }
        if let Some(counter) = grid_sync {
            // SAFETY: 12 bytes of staging after barrier_staging were reserved; the
            // symbol holds 3 words.
            unsafe {
                driver::copy_to_host_async(
                    lane.staging.address(barrier_staging),
                    counter,
                    4 * crate::codegen::GRID_BARRIER_WORDS,
                    &lane.stream,
                )
            }
            .map_err(|e| enqueue_error("reading the grid barrier back", e))?;
        }
        if want_events {
            lane.outer_end
                .record(&lane.stream)
                .map_err(|e| enqueue_error("recording the outer end event", e))?;
        }
        let enqueued = Instant::now();
        let mark = probe::charge_and_mark(Phase::Readback, mark);

        // release: the one synchronize, fault handling, barrier audit.
        let wait_start = Instant::now();
        let synced = lane.stream.synchronize();
        let wait_ns = elapsed_ns(wait_start);
        if let Err(error) = synced {
            let context_usable = !error.is_sticky();
            if !context_usable {
                self.mark_context_lost(format!("{} faulted: {error}", kernel.name));
            }
            return Err(BackendError::KernelFault {
                program: kernel.name.clone(),
                error,
                context_usable,
            });
        }
        if grid_sync.is_some() {
            let raw = lane.staging.slice(barrier_staging, 12);
            let word = |i: usize| {
                u32::from_le_bytes([raw[4 * i], raw[4 * i + 1], raw[4 * i + 2], raw[4 * i + 3]])
            };
            let words = [word(0), word(1), word(2)];
            if words[0] != 0
                || plan.grid_blocks == 0
                || !(words[2] as u64).is_multiple_of(plan.grid_blocks)
            {
                return Err(BackendError::GridBarrierAudit {
                    program: kernel.name.clone(),
                    words,
                    grid_blocks: plan.grid_blocks,
                });
            }
        }
        drop(lease);
        let mut timing = DispatchTiming {
            wall_ns: 0,
            enqueue_ns: u64::try_from(enqueued.duration_since(start).as_nanos())
                .unwrap_or(u64::MAX),
            wait_ns,
            device_window_ns: 0,
            kernel_ns: 0,
        };
        let stamps = lane.results.as_ref().and_then(|area| area.stamps());
        if stamps.is_none() {
            // The kernel did not finish its epilogue: the area may hold an earlier
            // dispatch's bytes, which must never be returned as this one's.
            return Err(BackendError::Launch {
                message: format!(
                    "Fix: internal: {} completed without writing its end stamp, so its mapped results \
                     cannot be trusted; report this with the program",
                    kernel.name
                ),
            });
        }
        timing.kernel_ns = stamp_kernel_ns(stamps);
        if want_events {
            timing.device_window_ns =
                Event::elapsed_ns(&lane.outer_start, &lane.outer_end).unwrap_or(0);
        }
        let mark = probe::charge_and_mark(Phase::Release, mark);
        Ok((timing, mark))
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
            .filter(|(b, _)| matches!(b, Binding::Borrowed(_)))
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
                resident: self
                    .resident
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .live_bytes(),
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
