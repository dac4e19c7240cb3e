//! One description of the stream operations of a dispatch.
//!
//! # Why this module exists
//!
//! An eager dispatch, a graph capture, a buffer transfer and the raw floor all put
//! the same few operations on a stream: host → device copies from pinned staging,
//! the zero fill that makes `WriteOnly` mean "starts zeroed", the parameter array
//! (buffer addresses, then `u32` element counts), `fixpoint_iterations` launches
//! (with the grid barrier reset before each one but a settled first:
//! [`KernelLaunch::barrier_settled`]), device → host readback copies,
//! and the timing events around them. They used to be written out separately in
//! `dispatch.rs` (a 294-line function), `graph/` and `floor.rs`, so "a graph captures
//! exactly what a dispatch enqueues" held only as long as four copies agreed.
//!
//! Here a dispatch is *described* once as a [`StreamOps`] value, built by
//! [`StreamOps::dispatch`] from the kernel's slots, the bound addresses and sizes —
//! the same call for the eager path and for a graph step — and [`enqueue`] is the
//! only function that turns a description into driver calls, in one fixed order:
//!
//! ```text
//! [window start] uploads  pinned uploads  clears  [kernel start]  (barrier reset, launch) × N
//! [kernel end]  readback  barrier readback (when the result area had no room)  [window end]
//! ```
//!
//! The driver calls go through a [`StreamTarget`]: [`LaneTarget`] (a dispatch lane's
//! stream, events and staging) for eager work, the graph's capture target for
//! recording, and a recording target in this module's tests, which checks the
//! order, the parameter array and that an eager dispatch and a graph step of the
//! same request enqueue the same operations — without a GPU. The target also owns
//! the one `synchronize` ([`StreamTarget::synchronize`]), so a counting target proves
//! invariant 4 ("one synchronize per dispatch").
//!
//! # How a readback mechanism plugs in
//!
//! [`Readback`] says how outputs reach the host: nothing, one async copy per item
//! into staging ([`Readback::StagedCopies`]), or routed by size
//! ([`Readback::Routed`], `readback` module): small items are copied by the kernel's
//! own last thread into the host-mapped result area (no stream operation at all;
//! their descriptors travel in [`LaunchParameters::results`]), the rest by DMA as
//! before, plus one copy of the area when it had to live in device memory. The host
//! side is [`Readback::deliver`], which hands each item's bytes to the caller's sink
//! after the synchronize.

use std::ffi::c_void;

use smallvec::SmallVec;

use crate::ir::Access;

use super::driver::{self, DriverError, DriverResult, Event, LoadedModule, PinnedMemory, Stream};
use super::plan::ParamSlot;
use super::plan::ScalarWords;
use super::readback::{AreaCopy, Delivery, ResultArea, ResultParams};
use super::{ParameterArray, PerBinding};

/// The kernel parameter values of one launch: every buffer address, then every
/// `u32` element count, then the result ABI's five values (the kernel ABI documented
/// in `codegen::ptx`; every backend kernel has them, the raw floor's plain kernels
/// do not), then one word per scalar parameter.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(in crate::backend) struct LaunchParameters {
    pub(in crate::backend) addresses: PerBinding<u64>,
    pub(in crate::backend) counts: PerBinding<u32>,
    pub(in crate::backend) results: Option<ResultParams>,
    /// The scalar values' bit patterns, zero-extended, in declaration order: the
    /// driver reads a 32-bit parameter's 4 bytes from the start of its word (the
    /// low half on a little-endian host).
    pub(in crate::backend) scalars: ScalarWords,
}

impl LaunchParameters {
    /// Append the parameters for `slots` bound to `addresses` holding `sizes` bytes
    /// each, in place (the value is large: building it apart and moving it in cost a
    /// copy per dispatch). The sizes were checked to be whole numbers of elements
    /// whose count fits a `u32` (`plan::check_binding_sizes`).
    #[inline(always)]
    pub(in crate::backend) fn push_bindings(
        &mut self,
        slots: &[ParamSlot],
        addresses: &[u64],
        sizes: &[u64],
    ) {
        for ((slot, &address), &bytes) in slots.iter().zip(addresses).zip(sizes) {
            self.addresses.push(address);
            // Element sizes are powers of two: a shift, not a 64-bit division per
            // binding on every dispatch.
            let size = slot.elem.size_bytes();
            debug_assert!(size.is_power_of_two());
            self.counts.push((bytes >> size.trailing_zeros()) as u32);
        }
    }

    /// The driver's `void**` array: pointers to each address, then to each count,
    /// then to the result ABI's values. The pointers are valid while `self` is
    /// neither moved nor dropped.
    #[inline(always)]
    pub(in crate::backend) fn pointer_array(&mut self) -> ParameterArray {
        let mut params: ParameterArray = SmallVec::with_capacity(
            self.addresses.len() + self.counts.len() + 5 + self.scalars.len(),
        );
        for address in self.addresses.iter_mut() {
            params.push(address as *mut u64 as *mut c_void);
        }
        for count in self.counts.iter_mut() {
            params.push(count as *mut u32 as *mut c_void);
        }
        if let Some(results) = &self.results {
            results.push_pointers(&mut params);
        }
        for word in self.scalars.iter_mut() {
            params.push(word as *mut u64 as *mut c_void);
        }
        params
    }

    /// Set the result ABI's per-launch values for launch `iteration` of
    /// `iterations` (no-op without them). The pointer array stays valid.
    pub(in crate::backend) fn set_launch(&self, iteration: u32, iterations: u32) {
        if let Some(results) = &self.results {
            results.set_launch(iteration, iterations);
        }
    }
}

/// A copy between pinned host staging and device memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::backend) struct StagedCopy {
    /// Device address of the first byte.
    pub(in crate::backend) device: u64,
    /// Offset of the first byte in the target's staging.
    pub(in crate::backend) staging_offset: usize,
    /// Bytes copied.
    pub(in crate::backend) len: usize,
}

/// A copy from caller-owned pinned host memory to the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::backend) struct PinnedCopy {
    pub(in crate::backend) device: u64,
    /// Host address of the first byte (inside a pinned allocation the dispatch holds).
    pub(in crate::backend) host: *const u8,
    pub(in crate::backend) len: usize,
}

/// A copy between two allocations the backend owns (device memory or host-mapped
/// pinned memory), by the copy engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::backend) struct BufferCopy {
    pub(in crate::backend) from: u64,
    pub(in crate::backend) to: u64,
    pub(in crate::backend) len: usize,
}

/// A zero fill of device memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::backend) struct Clear {
    pub(in crate::backend) device: u64,
    pub(in crate::backend) bytes: usize,
}

/// The timing events a description may record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::backend) enum DeviceMark {
    /// Before the first operation of the dispatch.
    WindowStart,
    /// Before the launch loop.
    KernelStart,
    /// After the launch loop.
    KernelEnd,
    /// After the last operation of the dispatch.
    WindowEnd,
}

/// The launch loop of a dispatch.
pub(in crate::backend) struct KernelLaunch<'a, M> {
    pub(in crate::backend) module: &'a M,
    pub(in crate::backend) grid: [u32; 3],
    pub(in crate::backend) block: [u32; 3],
    pub(in crate::backend) iterations: u32,
    /// A grid-sync kernel's module-global barrier counter: reset before each launch,
    /// launched cooperatively.
    pub(in crate::backend) grid_barrier: Option<u64>,
    /// The barrier's arrivals word is known to be 0 (the last launch's audit
    /// passed and nothing launched since), so the first launch needs no reset;
    /// every later launch of the loop is still reset.
    pub(in crate::backend) barrier_settled: bool,
}

/// How a dispatch's outputs reach the host (see the module docs for adding one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::backend) enum Readback<'a> {
    /// Nothing comes back through the stream.
    Nothing,
    /// One async device → host copy per item into the target's staging.
    StagedCopies(&'a [StagedCopy]),
    /// Routed by size (`readback::route_reads`): `copies` are the DMA-routed items'
    /// copies; `deliveries` say, per item in order, where its bytes are; `area_copy`
    /// brings a device-memory result area back (none when it is host-mapped).
    Routed {
        copies: &'a [StagedCopy],
        deliveries: &'a [Delivery],
        area_copy: Option<AreaCopy>,
    },
}

impl Readback<'_> {
    fn enqueues(&self) -> bool {
        match self {
            Readback::Nothing => false,
            Readback::StagedCopies(copies) => !copies.is_empty(),
            Readback::Routed {
                copies, area_copy, ..
            } => !copies.is_empty() || area_copy.is_some(),
        }
    }

    /// After the synchronize: hand item `i`'s bytes (in the staging `staging`, or in
    /// the result area `area`) to `sink`, in item order.
    #[inline]
    pub(in crate::backend) fn deliver(
        &self,
        staging: &PinnedMemory,
        area: Option<&ResultArea>,
        mut sink: impl FnMut(usize, &[u8]),
    ) {
        match self {
            Readback::Nothing => {}
            Readback::StagedCopies(copies) => {
                for (i, copy) in copies.iter().enumerate() {
                    sink(i, staging.slice(copy.staging_offset, copy.len));
                }
            }
            Readback::Routed { deliveries, .. } => {
                for (i, delivery) in deliveries.iter().enumerate() {
                    match (*delivery, area) {
                        (Delivery::Staging { offset, len }, _) => {
                            sink(i, staging.slice(offset, len))
                        }
                        (Delivery::Area { offset, len }, Some(area)) => {
                            sink(i, area.bytes(offset, len))
                        }
                        (Delivery::Area { .. }, None) => sink(i, &[]),
                    }
                }
            }
        }
    }
}

/// Every stream operation of one dispatch (or of one graph operation), in the
/// order [`enqueue`] issues them.
pub(in crate::backend) struct StreamOps<'a, M> {
    pub(in crate::backend) uploads: SmallVec<[StagedCopy; 16]>,
    /// Uploads straight from caller pinned buffers (after the staged ones).
    pub(in crate::backend) pinned_uploads: SmallVec<[PinnedCopy; 4]>,
    pub(in crate::backend) clears: SmallVec<[Clear; 16]>,
    /// Copies between owned allocations (after the clears).
    pub(in crate::backend) buffer_copies: SmallVec<[BufferCopy; 1]>,
    pub(in crate::backend) launch: Option<KernelLaunch<'a, M>>,
    pub(in crate::backend) parameters: LaunchParameters,
    pub(in crate::backend) readback: Readback<'a>,
    /// The grid barrier's word, copied back for the arrival audit.
    pub(in crate::backend) barrier_readback: Option<StagedCopy>,
    /// Record the [`DeviceMark`] events.
    pub(in crate::backend) timed: bool,
}

impl<'a, M> StreamOps<'a, M> {
    /// No operations at all.
    #[inline(always)]
    pub(in crate::backend) fn empty() -> Self {
        StreamOps {
            uploads: SmallVec::new(),
            pinned_uploads: SmallVec::new(),
            clears: SmallVec::new(),
            buffer_copies: SmallVec::new(),
            launch: None,
            parameters: LaunchParameters::default(),
            readback: Readback::Nothing,
            barrier_readback: None,
            timed: false,
        }
    }

    /// The operations of one dispatch of a kernel with `slots` bound to `addresses`
    /// holding `sizes` bytes and scalar parameters `scalars`: the zero fill of every
    /// `WriteOnly` binding (the IR's rule: `WriteOnly` starts zeroed on every path,
    /// owned buffer or transient), then the launch loop with the parameter array. The
    /// eager path and graph recording both build their dispatch through this one
    /// function (the eager path in place, with [`StreamOps::describe_dispatch`]).
    #[inline(always)]
    pub(in crate::backend) fn dispatch(
        slots: &[ParamSlot],
        addresses: &[u64],
        sizes: &[u64],
        scalars: &[u64],
        launch: KernelLaunch<'a, M>,
    ) -> Self {
        let mut ops = StreamOps::empty();
        ops.describe_dispatch(slots, addresses, sizes, scalars, launch);
        ops
    }

    /// [`StreamOps::dispatch`] written into `self`, which is [`StreamOps::empty`]:
    /// the description is large (its lists are inline arrays), and returning it cost
    /// two copies of it per eager dispatch.
    #[inline(always)]
    pub(in crate::backend) fn describe_dispatch(
        &mut self,
        slots: &[ParamSlot],
        addresses: &[u64],
        sizes: &[u64],
        scalars: &[u64],
        launch: KernelLaunch<'a, M>,
    ) {
        for ((slot, &device), &bytes) in slots.iter().zip(addresses).zip(sizes) {
            if slot.access == Access::WriteOnly && bytes > 0 {
                self.clears.push(Clear {
                    device,
                    bytes: bytes as usize,
                });
            }
        }
        self.parameters.push_bindings(slots, addresses, sizes);
        self.parameters.scalars.extend_from_slice(scalars);
        self.launch = Some(launch);
    }

    /// Whether anything is enqueued before the launch loop. When nothing is, the
    /// kernel start event also opens the window (one event record saved).
    pub(in crate::backend) fn enqueues_before_launch(&self) -> bool {
        !self.uploads.is_empty()
            || !self.pinned_uploads.is_empty()
            || !self.clears.is_empty()
            || !self.buffer_copies.is_empty()
            || self
                .launch
                .as_ref()
                .is_some_and(|l| l.grid_barrier.is_some())
    }

    /// Whether anything is enqueued after the launch loop (else the kernel end
    /// event also closes the window).
    pub(in crate::backend) fn enqueues_after_launch(&self) -> bool {
        self.readback.enqueues() || self.barrier_readback.is_some()
    }

    /// The events that open and close the device window of a timed description.
    pub(in crate::backend) fn window_marks(&self) -> (DeviceMark, DeviceMark) {
        let start = if self.enqueues_before_launch() {
            DeviceMark::WindowStart
        } else {
            DeviceMark::KernelStart
        };
        let end = if self.enqueues_after_launch() {
            DeviceMark::WindowEnd
        } else {
            DeviceMark::KernelEnd
        };
        (start, end)
    }
}

/// A stream operation that the driver refused, and what was being done.
#[derive(Clone, Copy, Debug)]
pub(in crate::backend) struct EnqueueFailure {
    pub(in crate::backend) what: &'static str,
    pub(in crate::backend) error: DriverError,
}

/// Where the operations of a description go: one method per kind of stream
/// operation, plus the one synchronize.
pub(in crate::backend) trait StreamTarget {
    /// The loaded module type launches name.
    type Module;

    /// Record `mark`'s event.
    fn record(&mut self, mark: DeviceMark) -> DriverResult<()>;

    /// Copy `copy.len` bytes from upload staging to the device.
    ///
    /// # Safety
    /// The device range lies inside an allocation that stays alive, and the
    /// staging range inside the target's staging, untouched by the host, until the
    /// stream passes the copy.
    unsafe fn upload(&mut self, copy: StagedCopy) -> DriverResult<()>;

    /// Copy `copy.len` bytes from caller pinned memory to the device.
    ///
    /// # Safety
    /// The host range lies inside a pinned allocation, and the device range inside
    /// a device allocation, both alive (and the host bytes unwritten) until the
    /// stream passes the copy.
    unsafe fn upload_pinned(&mut self, copy: PinnedCopy) -> DriverResult<()>;

    /// Zero `clear.bytes` bytes of device memory.
    ///
    /// # Safety
    /// The range lies inside a device allocation alive until the stream passes it.
    unsafe fn clear(&mut self, clear: Clear) -> DriverResult<()>;

    /// Copy `copy.len` bytes between two owned allocations.
    ///
    /// # Safety
    /// Both ranges lie inside allocations alive until the stream passes the copy,
    /// and they do not overlap.
    unsafe fn copy_between(&mut self, copy: BufferCopy) -> DriverResult<()>;

    /// Zero the grid barrier's word.
    ///
    /// # Safety
    /// `counter` is a module's barrier symbol of `GRID_BARRIER_WORDS` words.
    unsafe fn reset_grid_barrier(&mut self, counter: u64) -> DriverResult<()>;

    /// One launch.
    ///
    /// # Safety
    /// `params` holds one pointer per kernel parameter in the kernel's order, each
    /// valid for this call; every device address they name stays alive until the
    /// stream passes the launch.
    unsafe fn launch(
        &mut self,
        launch: &KernelLaunch<'_, Self::Module>,
        params: &mut [*mut c_void],
    ) -> DriverResult<()>;

    /// Copy `copy.len` bytes from the device into readback staging.
    ///
    /// # Safety
    /// As for [`StreamTarget::upload`]; the host reads the staging only after the
    /// synchronize.
    unsafe fn read_back(&mut self, copy: StagedCopy) -> DriverResult<()>;

    /// Copy a device-memory result area back into its pinned mirror.
    ///
    /// # Safety
    /// Both ranges lie inside live allocations (the area's device memory and
    /// mirror) until the stream passes the copy; the host reads the mirror only
    /// after the synchronize.
    unsafe fn copy_area_back(&mut self, copy: AreaCopy) -> DriverResult<()>;

    /// Block until everything enqueued is done: the one synchronize of a dispatch.
    fn synchronize(&mut self) -> DriverResult<()>;
}

/// Enqueue every operation of `ops` on `target`, in the documented order.
///
/// # Safety
/// Every device address in `ops` lies inside an allocation that stays alive, and
/// every staging range inside the target's staging (which the host leaves alone),
/// until the target's stream is synchronised (or, for a capture, for as long as the
/// graph can run).
pub(in crate::backend) unsafe fn enqueue<T: StreamTarget>(
    ops: &mut StreamOps<'_, T::Module>,
    target: &mut T,
) -> Result<(), EnqueueFailure> {
    let fail = |what: &'static str| move |error| EnqueueFailure { what, error };
    let before = ops.enqueues_before_launch();
    let after = ops.enqueues_after_launch();
    if ops.timed && before {
        target
            .record(DeviceMark::WindowStart)
            .map_err(fail("recording the window start event"))?;
    }
    for &copy in &ops.uploads {
        // SAFETY: the caller's obligation covers every upload of `ops`.
        unsafe { target.upload(copy) }.map_err(fail("uploading an input"))?;
    }
    for &copy in &ops.pinned_uploads {
        // SAFETY: the caller's obligation covers every pinned upload of `ops`.
        unsafe { target.upload_pinned(copy) }.map_err(fail("uploading a pinned input"))?;
    }
    for &clear in &ops.clears {
        // SAFETY: the caller's obligation covers every clear of `ops`.
        unsafe { target.clear(clear) }.map_err(fail("clearing a write-only output"))?;
    }
    for &copy in &ops.buffer_copies {
        // SAFETY: the caller's obligation covers every buffer copy of `ops`.
        unsafe { target.copy_between(copy) }.map_err(fail("copying between buffers"))?;
    }
    if let Some(launch) = &ops.launch {
        if ops.timed {
            target
                .record(DeviceMark::KernelStart)
                .map_err(fail("recording the kernel start event"))?;
        }
        let mut params = ops.parameters.pointer_array();
        for iteration in 0..launch.iterations {
            // The result ABI's flags: the first launch stamps the start, the last one
            // the end and copies the mapped readback ranges.
            ops.parameters.set_launch(iteration, launch.iterations);
            if let Some(counter) = launch.grid_barrier {
                if iteration > 0 || !launch.barrier_settled {
                    // SAFETY: the description's barrier address is the kernel's symbol.
                    unsafe { target.reset_grid_barrier(counter) }
                        .map_err(fail("resetting the grid barrier"))?;
                }
            }
            // SAFETY: `params` points into `ops.parameters`, alive and unmoved for the
            // whole loop, one pointer per parameter in the ABI's order; the addresses
            // are covered by the caller's obligation.
            unsafe { target.launch(launch, &mut params) }.map_err(fail("launching"))?;
        }
        if ops.timed {
            target
                .record(DeviceMark::KernelEnd)
                .map_err(fail("recording the kernel end event"))?;
        }
    }
    match ops.readback {
        Readback::Nothing => {}
        Readback::StagedCopies(copies)
        | Readback::Routed {
            copies,
            area_copy: None,
            ..
        } => {
            for &copy in copies {
                // SAFETY: the caller's obligation covers every readback of `ops`.
                unsafe { target.read_back(copy) }.map_err(fail("enqueueing a readback copy"))?;
            }
        }
        Readback::Routed {
            copies,
            area_copy: Some(area_copy),
            ..
        } => {
            for &copy in copies {
                // SAFETY: the caller's obligation covers every readback of `ops`.
                unsafe { target.read_back(copy) }.map_err(fail("enqueueing a readback copy"))?;
            }
            // SAFETY: the caller's obligation covers the area and its mirror.
            unsafe { target.copy_area_back(area_copy) }
                .map_err(fail("copying the result area back"))?;
        }
    }
    if let Some(copy) = ops.barrier_readback {
        // SAFETY: as above; the barrier symbol holds the copied words.
        unsafe { target.read_back(copy) }.map_err(fail("reading the grid barrier back"))?;
    }
    if ops.timed && after {
        target
            .record(DeviceMark::WindowEnd)
            .map_err(fail("recording the window end event"))?;
    }
    Ok(())
}

/// A dispatch lane's stream, its four events and its staging (uploads and readback
/// share it), for eager work.
pub(in crate::backend) struct LaneTarget<'l> {
    pub(in crate::backend) stream: &'l Stream,
    pub(in crate::backend) staging: &'l PinnedMemory,
    /// Window start, kernel start, kernel end, window end.
    pub(in crate::backend) events: [&'l Event; 4],
}

impl<'l> LaneTarget<'l> {
    /// The target of a leased lane: its stream, staging and four events.
    pub(in crate::backend) fn of(lane: &'l super::pool::Lane) -> Self {
        LaneTarget {
            stream: &lane.stream,
            staging: &lane.staging,
            events: [
                &lane.outer_start,
                &lane.inner_start,
                &lane.inner_end,
                &lane.outer_end,
            ],
        }
    }

    pub(in crate::backend) fn event(&self, mark: DeviceMark) -> &Event {
        self.events[mark as usize]
    }
}

impl StreamTarget for LaneTarget<'_> {
    type Module = LoadedModule;

    fn record(&mut self, mark: DeviceMark) -> DriverResult<()> {
        self.events[mark as usize].record(self.stream)
    }

    unsafe fn upload(&mut self, copy: StagedCopy) -> DriverResult<()> {
        // SAFETY: forwarded obligation (see the trait).
        unsafe {
            driver::copy_to_device_async(
                copy.device,
                self.staging.address(copy.staging_offset),
                copy.len,
                self.stream,
            )
        }
    }

    unsafe fn upload_pinned(&mut self, copy: PinnedCopy) -> DriverResult<()> {
        // SAFETY: forwarded obligation (see the trait).
        unsafe { driver::copy_to_device_async(copy.device, copy.host, copy.len, self.stream) }
    }

    unsafe fn clear(&mut self, clear: Clear) -> DriverResult<()> {
        // SAFETY: forwarded obligation (see the trait).
        unsafe { driver::fill_bytes_async(clear.device, 0, clear.bytes, self.stream) }
    }

    unsafe fn copy_between(&mut self, copy: BufferCopy) -> DriverResult<()> {
        // SAFETY: forwarded obligation (see the trait).
        unsafe { driver::copy_between_async(copy.to, copy.from, copy.len, self.stream) }
    }

    unsafe fn reset_grid_barrier(&mut self, counter: u64) -> DriverResult<()> {
        // SAFETY: forwarded obligation: the symbol holds GRID_BARRIER_WORDS words.
        unsafe {
            driver::fill_words_async(counter, 0, crate::codegen::GRID_BARRIER_WORDS, self.stream)
        }
    }

    unsafe fn launch(
        &mut self,
        launch: &KernelLaunch<'_, LoadedModule>,
        params: &mut [*mut c_void],
    ) -> DriverResult<()> {
        // SAFETY: forwarded obligation (see the trait).
        unsafe {
            driver::launch(
                launch.module,
                launch.grid,
                launch.block,
                self.stream,
                params,
                launch.grid_barrier.is_some(),
            )
        }
    }

    unsafe fn read_back(&mut self, copy: StagedCopy) -> DriverResult<()> {
        // SAFETY: forwarded obligation (see the trait).
        unsafe {
            driver::copy_to_host_async(
                self.staging.address(copy.staging_offset),
                copy.device,
                copy.len,
                self.stream,
            )
        }
    }

    unsafe fn copy_area_back(&mut self, copy: AreaCopy) -> DriverResult<()> {
        // SAFETY: forwarded obligation (see the trait).
        unsafe { driver::copy_to_host_async(copy.host, copy.device, copy.len, self.stream) }
    }

    fn synchronize(&mut self) -> DriverResult<()> {
        self.stream.synchronize()
    }
}

#[cfg(test)]
pub(in crate::backend) mod tests {
    use super::*;
    use crate::ir::{BufferCount, ElemType, Name};

    /// One operation as a recording target saw it.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub(in crate::backend) enum Seen {
        Record(DeviceMark),
        Upload(StagedCopy),
        UploadPinned(PinnedCopy),
        Clear(Clear),
        Copy(BufferCopy),
        ResetBarrier(u64),
        Launch {
            grid: [u32; 3],
            addresses: Vec<u64>,
            counts: Vec<u32>,
            scalars: Vec<u64>,
            cooperative: bool,
        },
        ReadBack(StagedCopy),
        AreaCopy(usize),
        /// The result ABI's `(flags, range count)` of the launch that follows.
        ResultFlags(u32, u32),
        Synchronize,
    }

    /// A target that records every call instead of making it.
    #[derive(Default)]
    pub(in crate::backend) struct Recording {
        pub(in crate::backend) seen: Vec<Seen>,
        /// Parameter count of the modules launched (the "module" is its count).
        _unused: (),
    }

    /// A fake module: how many buffers and scalar parameters its kernel takes.
    pub(in crate::backend) struct FakeKernel {
        pub(in crate::backend) buffers: usize,
        pub(in crate::backend) scalars: usize,
    }

    impl StreamTarget for Recording {
        type Module = FakeKernel;

        fn record(&mut self, mark: DeviceMark) -> DriverResult<()> {
            self.seen.push(Seen::Record(mark));
            Ok(())
        }
        unsafe fn upload(&mut self, copy: StagedCopy) -> DriverResult<()> {
            self.seen.push(Seen::Upload(copy));
            Ok(())
        }
        unsafe fn upload_pinned(&mut self, copy: PinnedCopy) -> DriverResult<()> {
            self.seen.push(Seen::UploadPinned(copy));
            Ok(())
        }
        unsafe fn clear(&mut self, clear: Clear) -> DriverResult<()> {
            self.seen.push(Seen::Clear(clear));
            Ok(())
        }
        unsafe fn copy_between(&mut self, copy: BufferCopy) -> DriverResult<()> {
            self.seen.push(Seen::Copy(copy));
            Ok(())
        }
        unsafe fn reset_grid_barrier(&mut self, counter: u64) -> DriverResult<()> {
            self.seen.push(Seen::ResetBarrier(counter));
            Ok(())
        }
        unsafe fn launch(
            &mut self,
            launch: &KernelLaunch<'_, FakeKernel>,
            params: &mut [*mut c_void],
        ) -> DriverResult<()> {
            let (n, scalars) = (launch.module.buffers, launch.module.scalars);
            let results = params.len() == 2 * n + 5 + scalars;
            assert!(
                params.len() == 2 * n + scalars || results,
                "one pointer per parameter (plus the result ABI's five)"
            );
            if results {
                // SAFETY (test): the pointers come from LaunchParameters::pointer_array,
                // whose result pointers 2 and 3 are the u32 flags and range count.
                let (flags, count) = unsafe {
                    (
                        *(params[2 * n + 2] as *const u32),
                        *(params[2 * n + 3] as *const u32),
                    )
                };
                self.seen.push(Seen::ResultFlags(flags, count));
            }
            // SAFETY (test): the pointers come from LaunchParameters::pointer_array.
            let addresses = params[..n]
                .iter()
                .map(|p| unsafe { *(*p as *const u64) })
                .collect();
            // SAFETY (test): as above.
            let counts = params[n..2 * n]
                .iter()
                .map(|p| unsafe { *(*p as *const u32) })
                .collect();
            // SAFETY (test): as above; the scalar words are the last pointers.
            let scalars = params[params.len() - scalars..]
                .iter()
                .map(|p| unsafe { *(*p as *const u64) })
                .collect();
            self.seen.push(Seen::Launch {
                grid: launch.grid,
                addresses,
                counts,
                scalars,
                cooperative: launch.grid_barrier.is_some(),
            });
            Ok(())
        }
        unsafe fn read_back(&mut self, copy: StagedCopy) -> DriverResult<()> {
            self.seen.push(Seen::ReadBack(copy));
            Ok(())
        }
        unsafe fn copy_area_back(&mut self, copy: AreaCopy) -> DriverResult<()> {
            self.seen.push(Seen::AreaCopy(copy.len));
            Ok(())
        }
        fn synchronize(&mut self) -> DriverResult<()> {
            self.seen.push(Seen::Synchronize);
            Ok(())
        }
    }

    fn slot(binding: u32, elem: ElemType, access: Access) -> ParamSlot {
        ParamSlot {
            binding,
            name: Name::from(format!("b{binding}").as_str()),
            elem,
            count: BufferCount::Runtime,
            access,
        }
    }

    fn slots() -> Vec<ParamSlot> {
        vec![
            slot(0, ElemType::U32, Access::ReadOnly),
            slot(1, ElemType::U32, Access::WriteOnly),
            slot(2, ElemType::U32, Access::ReadWrite),
        ]
    }

    const MODULE: FakeKernel = FakeKernel {
        buffers: 3,
        scalars: 0,
    };

    fn launch(iterations: u32, grid_barrier: Option<u64>) -> KernelLaunch<'static, FakeKernel> {
        KernelLaunch {
            module: &MODULE,
            grid: [4, 1, 1],
            block: [64, 1, 1],
            iterations,
            grid_barrier,
            barrier_settled: false,
        }
    }

    fn run(mut ops: StreamOps<'_, FakeKernel>) -> Vec<Seen> {
        let mut target = Recording::default();
        // SAFETY (test): the recording target makes no driver call.
        unsafe { enqueue(&mut ops, &mut target) }.unwrap();
        target.seen
    }

    /// Locks out a parameter array in the wrong order or with dangling pointers: the
    /// kernel ABI is every buffer address, then every element count, each pointer
    /// reading back the value it stands for.
    #[test]
    fn parameter_array_is_addresses_then_counts() {
        let mut parameters = LaunchParameters {
            addresses: [0x1000u64, 0x2000, 0x3000].into_iter().collect(),
            counts: [7u32, 8, 9].into_iter().collect(),
            results: None,
            scalars: Default::default(),
        };
        let params = parameters.pointer_array();
        assert_eq!(params.len(), 6);
        for (i, param) in params.iter().take(3).enumerate() {
            let expected = std::ptr::addr_of_mut!(parameters.addresses[i]) as *mut c_void;
            assert_eq!(*param, expected, "parameter {i} points at address {i}");
        }
        for (i, param) in params.iter().skip(3).enumerate() {
            let expected = std::ptr::addr_of_mut!(parameters.counts[i]) as *mut c_void;
            assert_eq!(*param, expected, "parameter {} points at count {i}", 3 + i);
        }
    }

    /// Locks out scalar parameters anywhere but last, or pointing at the wrong word:
    /// the kernel ABI is addresses, counts, the result ABI's five, then one pointer
    /// per scalar word in declaration order. Negative control: without the result
    /// ABI the scalars follow the counts directly.
    #[test]
    fn scalar_parameters_come_last_one_word_each() {
        let mut parameters = LaunchParameters {
            addresses: [0x1000u64, 0x2000].into_iter().collect(),
            counts: [7u32, 8].into_iter().collect(),
            results: Some(ResultParams::new(0xC000, 0xD000)),
            scalars: [0xAAu64, u64::MAX, 3].into_iter().collect(),
        };
        let params = parameters.pointer_array();
        assert_eq!(params.len(), 2 + 2 + 5 + 3);
        for (i, param) in params[9..].iter().enumerate() {
            let expected = std::ptr::addr_of_mut!(parameters.scalars[i]) as *mut c_void;
            assert_eq!(*param, expected, "parameter {} points at scalar {i}", 9 + i);
        }
        parameters.results = None;
        let params = parameters.pointer_array();
        assert_eq!(params.len(), 2 + 2 + 3);
        let first_scalar = std::ptr::addr_of_mut!(parameters.scalars[0]) as *mut c_void;
        assert_eq!(params[4], first_scalar);
    }

    /// Locks out a reordered or incomplete eager dispatch: events bracket exactly
    /// what they claim, staged and pinned uploads and clears precede the launch loop, every iteration
    /// passes the same parameters (addresses, then counts = bytes / element size),
    /// readbacks follow the loop.
    #[test]
    fn eager_dispatch_enqueues_in_the_documented_order() {
        let addresses = [0x100, 0x200, 0x300];
        let sizes = [16, 32, 64];
        let mut ops = StreamOps::dispatch(&slots(), &addresses, &sizes, &[], launch(2, None));
        let upload = StagedCopy {
            device: 0x100,
            staging_offset: 0,
            len: 16,
        };
        ops.uploads.push(upload);
        let pinned = PinnedCopy {
            device: 0x100,
            host: std::ptr::null(),
            len: 16,
        };
        ops.pinned_uploads.push(pinned);
        let reads = [
            StagedCopy {
                device: 0x200,
                staging_offset: 256,
                len: 32,
            },
            StagedCopy {
                device: 0x300,
                staging_offset: 512,
                len: 64,
            },
        ];
        ops.readback = Readback::StagedCopies(&reads);
        ops.timed = true;
        assert_eq!(
            ops.window_marks(),
            (DeviceMark::WindowStart, DeviceMark::WindowEnd)
        );
        let launched = Seen::Launch {
            grid: [4, 1, 1],
            addresses: addresses.to_vec(),
            counts: vec![4, 8, 16],
            scalars: Vec::new(),
            cooperative: false,
        };
        assert_eq!(
            run(ops),
            vec![
                Seen::Record(DeviceMark::WindowStart),
                Seen::Upload(upload),
                Seen::UploadPinned(pinned),
                Seen::Clear(Clear {
                    device: 0x200,
                    bytes: 32
                }),
                Seen::Record(DeviceMark::KernelStart),
                launched.clone(),
                launched,
                Seen::Record(DeviceMark::KernelEnd),
                Seen::ReadBack(reads[0]),
                Seen::ReadBack(reads[1]),
                Seen::Record(DeviceMark::WindowEnd),
            ]
        );
    }

    /// Locks out a graph step that captures something other than what an eager
    /// dispatch enqueues: the same request described for a graph (no events, no
    /// readback) produces exactly the eager operations minus those.
    #[test]
    fn a_graph_step_enqueues_exactly_the_eager_dispatch_operations() {
        let addresses = [0x100, 0x200, 0x300];
        let sizes = [16, 32, 64];
        let scalars = [5u64, 0xffff_ffff_ffff];
        let kernel = FakeKernel {
            buffers: 3,
            scalars: 2,
        };
        let launch = |iterations| KernelLaunch {
            module: &kernel,
            ..launch(iterations, None)
        };
        let mut eager = StreamOps::dispatch(&slots(), &addresses, &sizes, &scalars, launch(3));
        eager.timed = true;
        let reads = [StagedCopy {
            device: 0x300,
            staging_offset: 0,
            len: 64,
        }];
        eager.readback = Readback::StagedCopies(&reads);
        let graph_step = StreamOps::dispatch(&slots(), &addresses, &sizes, &scalars, launch(3));
        let eager_seen: Vec<Seen> = run(eager)
            .into_iter()
            .filter(|s| !matches!(s, Seen::Record(_) | Seen::ReadBack(_)))
            .collect();
        let graph_seen = run(graph_step);
        assert_eq!(eager_seen, graph_seen);
        assert!(graph_seen.iter().any(|seen| matches!(
            seen,
            Seen::Launch { scalars: passed, .. } if passed[..] == scalars[..]
        )));
        // Negative controls: the comparison does see a missing clear, and other
        // scalar values.
        let mut without_clear =
            StreamOps::dispatch(&slots(), &addresses, &sizes, &scalars, launch(3));
        without_clear.clears.clear();
        assert_ne!(run(without_clear), graph_seen);
        let other_values = StreamOps::dispatch(&slots(), &addresses, &sizes, &[5, 6], launch(3));
        assert_ne!(run(other_values), graph_seen);
    }

    /// Locks out result-ABI launches that stamp or copy on the wrong iteration, and
    /// a routed readback that copies mapped items or forgets the DMA ones: over three
    /// fixpoint launches the first writes the start stamp, the last the end stamp and
    /// the descriptors' copies, the middle one neither; only the DMA-routed copy and
    /// the area copy-back are enqueued, after the loop (the host side, delivery from
    /// the area or staging, needs a driver: `gpu_readback` covers it).
    #[test]
    fn result_abi_launches_and_routed_readback() {
        use crate::backend::readback::{FLAG_END_STAMP, FLAG_START_STAMP};
        let addresses = [0x100, 0x200, 0x300];
        let sizes = [16, 32, 64];
        let mut ops = StreamOps::dispatch(&slots(), &addresses, &sizes, &[], launch(3, None));
        let mut results = ResultParams::new(0xC000, 0xD000);
        assert_eq!(results.describe(0x200, 32, 16, 0x200..0x220), Some(16));
        ops.parameters.results = Some(results);
        let copies = [StagedCopy {
            device: 0x300,
            staging_offset: 512,
            len: 64,
        }];
        let deliveries = [
            Delivery::Area {
                offset: 16,
                len: 32,
            },
            Delivery::Staging {
                offset: 512,
                len: 64,
            },
        ];
        let area_copy = AreaCopy {
            device: 0xE000,
            host: std::ptr::null_mut(),
            len: 48,
        };
        ops.readback = Readback::Routed {
            copies: &copies,
            deliveries: &deliveries,
            area_copy: Some(area_copy),
        };
        let seen = run(ops);
        let flags: Vec<(u32, u32)> = seen
            .iter()
            .filter_map(|s| match s {
                Seen::ResultFlags(f, c) => Some((*f, *c)),
                _ => None,
            })
            .collect();
        // The 32-byte range is longer than a window: no window bits (8-15), the
        // strided loop copies it on the last launch.
        assert_eq!(flags, [(FLAG_START_STAMP, 0), (0, 0), (FLAG_END_STAMP, 1)]);
        let tail: Vec<&Seen> = seen
            .iter()
            .skip_while(|s| !matches!(s, Seen::ReadBack(_)))
            .collect();
        assert_eq!(tail, [&Seen::ReadBack(copies[0]), &Seen::AreaCopy(48)]);
    }

    /// Locks out a grid-sync dispatch whose barrier is not reset before every
    /// launch, or whose launches are not cooperative, or whose barrier word is not
    /// read back last.
    #[test]
    fn grid_sync_resets_the_barrier_before_each_launch() {
        let addresses = [0x100, 0x200, 0x300];
        let sizes = [16, 32, 64];
        let mut ops =
            StreamOps::dispatch(&slots(), &addresses, &sizes, &[], launch(2, Some(0xB000)));
        let barrier = StagedCopy {
            device: 0xB000,
            staging_offset: 1024,
            len: 12,
        };
        ops.barrier_readback = Some(barrier);
        let seen = run(ops);
        let kinds: Vec<&str> = seen
            .iter()
            .map(|s| match s {
                Seen::Clear(_) => "clear",
                Seen::ResetBarrier(_) => "reset",
                Seen::Launch { cooperative, .. } => {
                    assert!(cooperative);
                    "launch"
                }
                Seen::ReadBack(_) => "read",
                _ => "other",
            })
            .collect();
        assert_eq!(
            kinds,
            ["clear", "reset", "launch", "reset", "launch", "read"]
        );
    }

    /// Locks out a settled barrier reset again, or a loop that trusts it past its
    /// first launch: with the words settled (the last audit passed) a one-launch
    /// dispatch enqueues no reset, and a loop of three resets before its second and
    /// third launches only; unsettled, every launch is reset (the control).
    #[test]
    fn a_settled_barrier_skips_only_the_first_reset() {
        let addresses = [0x100, 0x200, 0x300];
        let sizes = [16, 32, 64];
        let kinds = |iterations, barrier_settled| -> Vec<&'static str> {
            let ops = StreamOps::dispatch(
                &slots(),
                &addresses,
                &sizes,
                &[],
                KernelLaunch {
                    barrier_settled,
                    ..launch(iterations, Some(0xB000))
                },
            );
            run(ops)
                .iter()
                .filter_map(|s| match s {
                    Seen::ResetBarrier(_) => Some("reset"),
                    Seen::Launch { .. } => Some("launch"),
                    _ => None,
                })
                .collect()
        };
        assert_eq!(kinds(1, true), ["launch"]);
        assert_eq!(
            kinds(3, true),
            ["launch", "reset", "launch", "reset", "launch"]
        );
        assert_eq!(kinds(1, false), ["reset", "launch"]);
        assert_eq!(
            kinds(3, false),
            ["reset", "launch", "reset", "launch", "reset", "launch"]
        );
    }

    /// Locks out wasted or missing events: with nothing before or after the loop
    /// (all device buffers, no clears, no readback), the kernel events also delimit the
    /// window and no window event is recorded.
    #[test]
    fn a_bare_launch_shares_its_kernel_events_with_the_window() {
        let read_only = [slot(0, ElemType::U32, Access::ReadOnly)];
        let mut ops = StreamOps::dispatch(&read_only, &[0x100], &[16], &[], {
            let mut l = launch(1, None);
            l.module = &FakeKernel {
                buffers: 1,
                scalars: 0,
            };
            l
        });
        ops.timed = true;
        assert_eq!(
            ops.window_marks(),
            (DeviceMark::KernelStart, DeviceMark::KernelEnd)
        );
        let seen = run(ops);
        assert_eq!(seen.len(), 3, "{seen:?}");
        assert_eq!(seen[0], Seen::Record(DeviceMark::KernelStart));
        assert_eq!(seen[2], Seen::Record(DeviceMark::KernelEnd));
    }
}
