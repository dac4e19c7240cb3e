//! The steps of [`BackendInner::submit_request`](super::BackendInner::submit_request)
//! between the request and the device: plan, stage, route readbacks, describe,
//! order, enqueue. Each step fills its part of the dispatch's [`Bookkeeping`] in
//! place: the per-binding lists are large inline arrays, and a list moved (returned,
//! passed by value, put into another value) is copied whole, whatever its length.
//! Measured on the build machine (callgrind over the warm path with a stand-in
//! driver): when the steps returned their lists and the dispatch in flight carried
//! them, about 16 KB moved per dispatch, 46 % of a 2-buffer dispatch's host
//! instructions and 26 % of a 17-buffer one's.

use std::sync::Arc;

use smallvec::SmallVec;

use crate::ir::Access;
use crate::probe::{self, Count};

use super::super::budget::{self, BudgetInputs};
use super::super::driver::{self, DeviceMemory, PinnedMemory};
use super::super::kernel::KernelInner;
use super::super::ordering::{Accesses, Ordered};
use super::super::plan::{
    align_up, check_output_slices, check_request_scalars, plan_request, ParamSlot, ReadItem,
    RequestPlan,
};
use super::super::pool::Lane;
use super::super::readback::{
    mapped_range_limit, route_reads, AreaCopy, Delivery, ResultArea, ResultParams, Route,
    RESULT_AREA_BYTES, STAMP_BYTES,
};
use super::super::stream_ops::{
    enqueue, Clear, KernelLaunch, LaneTarget, PinnedCopy, Readback, StagedCopy, StreamOps,
};
use super::super::{BackendError, BackendInner, Binding, Dispatch, LaunchPlan, PerBinding};
use super::reuse::Memo;
use super::{InFlight, Sink};

/// What the plan step found (pure; nothing touched yet).
#[derive(Default)]
pub(in crate::backend) struct Plan {
    pub(in crate::backend) request: RequestPlan,
    pub(in crate::backend) launch: LaunchPlan,
    /// Staging offset of a grid-sync kernel's barrier word (after the readbacks).
    pub(in crate::backend) barrier_staging: usize,
}

/// Everything one dispatch writes down between its request and its completion,
/// filled in place by each step and read after the synchronize. It stays where the
/// dispatch began: on the caller's stack for a blocking `run` or `run_into`, in the
/// one allocation a [`PendingDispatch`](super::PendingDispatch) owns for `submit`.
#[derive(Default)]
pub(in crate::backend) struct Bookkeeping {
    pub(in crate::backend) plan: Plan,
    pub(in crate::backend) staged: Staged,
    pub(in crate::backend) transfers: Transfers,
    pub(in crate::backend) routed: Routed,
    pub(in crate::backend) held: Held,
    /// The request `plan` and `staged` were made for (a blocking dispatch reuses
    /// them, and `routed`, for the same request: `reuse` module).
    pub(in crate::backend) memo: Memo,
}

// SAFETY: the fields that are not `Send` by themselves are host addresses of
// page-locked memory: a pinned upload's source (`Transfers::pinned_uploads`, inside a
// `PinnedMemory` that `Held::pinned` holds) and a device-memory result area's mirror
// (`Routed::area_copy`, owned by the dispatch's lane). They are handed to the driver
// as copy addresses and never dereferenced through this value, so moving the
// bookkeeping to another thread (a pending dispatch waited for there) shares nothing
// the lane and the holdings, both `Send`, do not already carry.
unsafe impl Send for Bookkeeping {}

/// Resources a dispatch holds from staging until its lane is released.
#[derive(Default)]
pub(in crate::backend) struct Held {
    /// Owned buffers bound by a submission (their memory stays alive while the
    /// device may use it, even when the caller drops the buffer meanwhile). A
    /// blocking dispatch takes none: the caller's borrow of the request keeps its
    /// buffers alive until the call returns, after the synchronize (measured on the
    /// build machine: an `Arc` clone and drop for each of 17 buffers cost 0.29 µs
    /// per dispatch).
    pub(in crate::backend) buffers: PerBinding<Arc<DeviceMemory>>,
    /// Transient buffers of host, zeroed and pinned bindings (back to the pool).
    pub(in crate::backend) transients: SmallVec<[DeviceMemory; 16]>,
    /// Caller pinned buffers the uploads read from.
    pub(in crate::backend) pinned: SmallVec<[Arc<PinnedMemory>; 4]>,
}

impl Held {
    /// Whether it holds nothing (the usual lane request, over owned buffers): its
    /// release makes no driver call, and a delivered lane request that holds nothing
    /// and has no order-book entry needs no retirement.
    pub(in crate::backend) fn is_empty(&self) -> bool {
        self.buffers.is_empty() && self.transients.is_empty() && self.pinned.is_empty()
    }
}

/// Bindings resolved to device addresses, and the memory the dispatch reads and
/// writes through owned buffers (what the order book needs).
#[derive(Default)]
pub(in crate::backend) struct Staged {
    pub(in crate::backend) addresses: PerBinding<u64>,
    pub(in crate::backend) accesses: Accesses,
}

/// The stream operations host, zeroed and pinned bindings need before the launch.
#[derive(Default)]
pub(in crate::backend) struct Transfers {
    pub(in crate::backend) uploads: SmallVec<[StagedCopy; 16]>,
    pub(in crate::backend) pinned_uploads: SmallVec<[PinnedCopy; 4]>,
    /// Zero fills of zeroed transients bound to slots the kernel reads (a
    /// `WriteOnly` slot is cleared by every dispatch's description anyway).
    pub(in crate::backend) clears: SmallVec<[Clear; 16]>,
}

/// The readback routes: DMA copies into staging, and where every item's bytes are
/// after the synchronize.
#[derive(Default)]
pub(in crate::backend) struct Routed {
    pub(in crate::backend) copies: PerBinding<StagedCopy>,
    pub(in crate::backend) deliveries: PerBinding<Delivery>,
    /// The binding slot each item came from (what `Outputs` records).
    pub(in crate::backend) item_bindings: PerBinding<u32>,
    /// The device fill that clears a device-memory area's stamps before the launch.
    pub(in crate::backend) arm_clear: Option<(u64, usize)>,
    /// The copy that brings a device-memory area back after the launch.
    pub(in crate::backend) area_copy: Option<AreaCopy>,
    /// The result ABI's parameter values: the area's addresses and one descriptor
    /// per mapped item.
    pub(in crate::backend) results: ResultParams,
    /// The result area the items are placed in (its device address), once routed.
    pub(in crate::backend) area: Option<u64>,
    /// Where a grid-sync kernel's barrier word comes back for the audit (`None`
    /// for any other kernel).
    pub(in crate::backend) barrier: Option<BarrierWordAt>,
}

/// Where a grid-sync dispatch's barrier word comes back for the audit.
///
/// Why the result area first: copied by the stream, the word was one more
/// device → host copy after every cooperative launch (its own driver call and
/// its own turn on the copy engine, which the dispatch's synchronize waits for);
/// the kernel's last thread copies it with the mapped readback instead, after
/// every workgroup has passed its last grid sync, so it is the word the launch
/// left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::backend) enum BarrierWordAt {
    /// In the result area at this offset (the kernel's last thread copies it).
    Area(usize),
    /// In the lane's staging at this offset (a stream copy brings it: the area
    /// had no room or no free descriptor left).
    Staging(usize),
}

/// A leased lane and what the dispatch holds, released on every exit that does not
/// hand the lane to an [`InFlight`]: the stream may hold work when a step fails, so
/// the release synchronises it first (`BackendInner::release`).
pub(in crate::backend) struct LaneGuard<'b, 'r> {
    inner: &'b BackendInner,
    lane: Option<Lane>,
    pub(in crate::backend) held: &'b mut Held,
    /// The bindings whose buffers the caller's borrow keeps alive (a blocking
    /// dispatch's; empty for a submission, which holds its buffers in `held`).
    pub(in crate::backend) borrowed: &'r [Binding<'r>],
}

impl<'b, 'r> LaneGuard<'b, 'r> {
    /// Lease a lane (stream, events, staging) for one dispatch holding into `held`
    /// and borrowing the buffers of `borrowed`.
    pub(in crate::backend) fn lease(
        inner: &'b BackendInner,
        held: &'b mut Held,
        borrowed: &'r [Binding<'r>],
    ) -> Result<Self, BackendError> {
        let lane = inner
            .lanes
            .lease()
            .map_err(|e| BackendError::driver("creating a stream and its events", e))?;
        Ok(LaneGuard {
            inner,
            lane: Some(lane),
            held,
            borrowed,
        })
    }

    pub(in crate::backend) fn lane(&self) -> Result<&Lane, BackendError> {
        self.lane.as_ref().ok_or_else(handed_over)
    }

    fn lane_mut(&mut self) -> Result<&mut Lane, BackendError> {
        self.lane.as_mut().ok_or_else(handed_over)
    }

    /// The lane, for the dispatch in flight (the guard lets go; the holdings stay
    /// in the dispatch's bookkeeping until its release).
    pub(in crate::backend) fn hand_over(mut self) -> Lane {
        match self.lane.take() {
            Some(lane) => lane,
            // `lease` always sets the lane and only this consumes it.
            None => unreachable!("a lane guard hands its lane over once"),
        }
    }
}

impl Drop for LaneGuard<'_, '_> {
    fn drop(&mut self) {
        if let Some(lane) = self.lane.take() {
            self.inner.release(lane, self.held, false, self.borrowed);
        }
    }
}

fn handed_over() -> BackendError {
    BackendError::internal("a lane guard was used after handing its lane over")
}

/// The probe's counts of one dispatch (only while the probe is on).
pub(in crate::backend) fn count_for_probe(
    kernel: &KernelInner,
    request: &Dispatch<'_>,
    grid_blocks: u64,
) {
    probe::count_with(Count::Nodes, || kernel.program.node_count());
    probe::count_with(Count::PtxBytes, || kernel.ptx.len() as u64);
    probe::count_with(Count::Buffers, || kernel.program.buffers().len() as u64);
    probe::count_with(Count::Bindings, || request.bindings.len() as u64);
    probe::count_with(Count::Fixpoint, || request.fixpoint_iterations as u64);
    probe::count_with(Count::GridBlocks, || grid_blocks);
    probe::note_program(|| kernel.module_key.0 as u64);
}

/// The one description of a dispatch's stream operations, written into `ops`
/// ([`StreamOps::empty`]) in place: [`StreamOps::dispatch`]'s (shared with graph
/// recording: the `WriteOnly` clears, the parameter array, the launch loop) plus
/// what only an eager dispatch has: uploads, zero fills of transients, the result
/// area's values, the routed readback and the events.
#[inline(always)]
pub(in crate::backend) fn operations<'a>(
    ops: &mut StreamOps<'a, driver::LoadedModule>,
    kernel: &'a KernelInner,
    (request, plan, staged): (&Dispatch<'_>, &'a Plan, &'a Staged),
    transfers: &Transfers,
    routed: &'a Routed,
    timed: bool,
) {
    let scalars = &request.scalars.words()[..kernel.program.scalars().len()];
    ops.describe_dispatch(
        &kernel.slots,
        &staged.addresses,
        &plan.request.sizes,
        scalars,
        KernelLaunch {
            module: &kernel.module,
            grid: plan.launch.grid,
            block: plan.launch.block,
            iterations: request.fixpoint_iterations,
            grid_barrier: kernel.grid_barrier,
            // Settled by the barrier's lease holder, once it holds the lease.
            barrier_settled: false,
        },
    );
    ops.uploads.extend_from_slice(&transfers.uploads);
    ops.pinned_uploads
        .extend_from_slice(&transfers.pinned_uploads);
    ops.clears.extend_from_slice(&transfers.clears);
    if let Some((device, bytes)) = routed.arm_clear {
        ops.clears.push(Clear { device, bytes });
    }
    ops.parameters.results = Some(routed.results.clone());
    ops.readback = Readback::Routed {
        copies: &routed.copies,
        deliveries: &routed.deliveries,
        area_copy: routed.area_copy,
    };
    ops.barrier_readback = match (kernel.grid_barrier, routed.barrier) {
        (Some(counter), Some(BarrierWordAt::Staging(staging_offset))) => Some(StagedCopy {
            device: counter,
            staging_offset,
            len: BARRIER_BYTES,
        }),
        _ => None,
    };
    ops.timed = timed;
}

/// The pure half of routing a readback: place every item of `plan` (mapped into the
/// result area while it is small and there is room, `route_reads`), describe the
/// mapped ones into `routed.results` (which holds the area's addresses and no
/// descriptor yet), and record the DMA copies, every item's delivery and its
/// binding, for a kernel of `slots` with `threads` per workgroup bound to
/// `addresses`; then a grid-sync kernel's barrier word at `grid_barrier` (in the
/// area behind the items when there is room and a descriptor, else in staging:
/// [`BarrierWordAt`]). Returns the end of the area's used bytes.
pub(in crate::backend) fn route_items(
    (slots, threads): (&[ParamSlot], u32),
    plan: &Plan,
    (addresses, grid_barrier): (&[u64], Option<u64>),
    routed: &mut Routed,
) -> Result<usize, BackendError> {
    routed.copies.clear();
    routed.deliveries.clear();
    routed.item_bindings.clear();
    let reads: &[ReadItem] = &plan.request.reads;
    let mut routes: PerBinding<Route> = SmallVec::new();
    route_reads(
        reads,
        RESULT_AREA_BYTES,
        mapped_range_limit(threads),
        &mut routes,
    );
    let results = &mut routed.results;
    let mut area_end = STAMP_BYTES;
    for (read, route) in reads.iter().zip(&routes) {
        let base = addresses[read.slot as usize];
        let source = base + read.offset;
        let len = read.len as usize;
        routed.item_bindings.push(slots[read.slot as usize].binding);
        match *route {
            Route::Mapped { offset } => {
                // route_reads bounded len by MAPPED_RANGE_MAX_BYTES (< u32::MAX)
                // and took at most RESULT_RANGE_SLOTS items, so a slot is free.
                let memory = base..base + plan.request.sizes[read.slot as usize];
                let delivered = results
                    .describe(source, read.len as u32, offset, memory)
                    .ok_or_else(|| {
                        BackendError::internal("a mapped readback found no free result descriptor")
                    })? as usize;
                area_end = area_end.max(delivered + len);
                routed.deliveries.push(Delivery::Area {
                    offset: delivered,
                    len,
                });
            }
            Route::Copy => {
                routed.copies.push(StagedCopy {
                    device: source,
                    staging_offset: read.staging_offset,
                    len,
                });
                routed.deliveries.push(Delivery::Staging {
                    offset: read.staging_offset,
                    len,
                });
            }
        }
    }
    routed.barrier = grid_barrier.map(|counter| {
        let offset = area_end.next_multiple_of(16);
        let delivered = (offset + BARRIER_BYTES <= RESULT_AREA_BYTES)
            .then(|| {
                let memory = counter..counter + BARRIER_BYTES as u64;
                results.describe(counter, BARRIER_BYTES as u32, offset as u32, memory)
            })
            .flatten();
        match delivered {
            Some(at) => {
                area_end = area_end.max(at as usize + BARRIER_BYTES);
                BarrierWordAt::Area(at as usize)
            }
            None => BarrierWordAt::Staging(plan.barrier_staging),
        }
    });
    Ok(area_end)
}

/// Bytes of a grid-sync kernel's barrier word.
pub(in crate::backend) const BARRIER_BYTES: usize = 4 * crate::codegen::GRID_BARRIER_WORDS;

impl BackendInner {
    /// Plan: the request checks every backend makes (`plan::plan_request`), the
    /// caller's output slices and the launch plan (from the kernel's plan cache). A
    /// grid-sync kernel's co-residency is checked after it, once for a new plan and a
    /// reused one alike, against the device as it is at the dispatch.
    pub(in crate::backend) fn plan(
        &self,
        kernel: &KernelInner,
        request: &Dispatch<'_>,
        sink: &Sink<'_, '_>,
        plan: &mut Plan,
    ) -> Result<(), BackendError> {
        plan_request(
            &kernel.name,
            (&kernel.slots, kernel.program.scalars()),
            &kernel.outputs,
            request,
            &mut plan.request,
        )?;
        if let Sink::Slices(outputs) = sink {
            check_output_slices(&plan.request.reads, outputs)?;
        }
        plan.launch = self.launch_plan(kernel, request.workgroups)?;
        plan.barrier_staging = align_up(plan.request.staging_bytes);
        Ok(())
    }

    /// The plan step of a request whose plan the bookkeeping already holds (`reuse`
    /// module): only what the plan does not cover, the request's scalar values (the
    /// memo leaves them out) and the caller's output slices (and the plan cache's
    /// count of a plan found).
    pub(in crate::backend) fn replan(
        &self,
        kernel: &KernelInner,
        request: &Dispatch<'_>,
        (sink, plan): (&Sink<'_, '_>, &Plan),
    ) -> Result<(), BackendError> {
        check_request_scalars(&kernel.name, kernel.program.scalars(), request)?;
        if let Sink::Slices(outputs) = sink {
            check_output_slices(&plan.request.reads, outputs)?;
        }
        self.plan_counter.hit();
        Ok(())
    }

    /// Grow the lane's staging to what `plan` needs.
    pub(in crate::backend) fn grow_staging(
        &self,
        kernel: &KernelInner,
        plan: &Plan,
        guard: &mut LaneGuard<'_, '_>,
    ) -> Result<(), BackendError> {
        let needed = plan.barrier_staging + if kernel.grid_barrier.is_some() { 16 } else { 0 };
        if guard
            .lane_mut()?
            .ensure_staging(needed)
            .map_err(|e| BackendError::driver("allocating pinned staging", e))?
        {
            self.staging_allocations
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    }

    /// Stage: grow the lane's staging, check the memory budget for transient
    /// bindings, and resolve every binding to a device address (taking transient
    /// buffers and writing host bytes into staging).
    pub(in crate::backend) fn stage(
        &self,
        kernel: &KernelInner,
        request: &Dispatch<'_>,
        plan: &Plan,
        guard: &mut LaneGuard<'_, '_>,
        (staged, transfers): (&mut Staged, &mut Transfers),
    ) -> Result<(), BackendError> {
        self.grow_staging(kernel, plan, guard)?;
        if request.bindings.iter().any(Binding::is_transient) {
            self.preflight(kernel, request.bindings, &plan.request.sizes)?;
        }
        let mut upload_offset = 0usize;
        for ((slot, binding), &bytes) in kernel
            .slots
            .iter()
            .zip(request.bindings)
            .zip(&plan.request.sizes)
        {
            let reads_it = slot.access != Access::WriteOnly;
            let address = match binding {
                Binding::Buffer(buffer) => {
                    let memory = buffer.memory_for(self, "dispatch with")?;
                    if guard.borrowed.is_empty() {
                        guard.held.buffers.push(Arc::clone(memory));
                    }
                    // What the order book compares: host, zeroed and pinned bindings
                    // get a fresh transient per dispatch and never conflict.
                    let address = memory.address();
                    if slot.access == Access::ReadOnly {
                        staged.accesses.reads.push(address);
                    } else {
                        staged.accesses.writes.push(address);
                    }
                    address
                }
                Binding::Host(data) => {
                    let address = self.take_transient(bytes, guard.held)?;
                    if reads_it && !data.is_empty() {
                        guard.lane_mut()?.staging.write(upload_offset, data);
                        transfers.uploads.push(StagedCopy {
                            device: address,
                            staging_offset: upload_offset,
                            len: data.len(),
                        });
                        upload_offset += align_up(data.len());
                    }
                    address
                }
                Binding::Zeroed(_) => {
                    let address = self.take_transient(bytes, guard.held)?;
                    if reads_it && bytes > 0 {
                        transfers.clears.push(Clear {
                            device: address,
                            bytes: bytes as usize,
                        });
                    }
                    address
                }
                Binding::Pinned(pinned) => {
                    let host = Arc::clone(pinned.memory_for(self, "dispatch with")?);
                    let address = self.take_transient(bytes, guard.held)?;
                    if reads_it && bytes > 0 {
                        transfers.pinned_uploads.push(PinnedCopy {
                            device: address,
                            host: host.address(0),
                            len: bytes as usize,
                        });
                    }
                    guard.held.pinned.push(host);
                    address
                }
                Binding::Scratch(_) => return Err(scratch_outside_a_graph(&kernel.name)),
            };
            staged.addresses.push(address);
        }
        debug_assert!(upload_offset <= plan.request.upload_bytes);
        Ok(())
    }

    /// A pooled transient buffer of `bytes` bytes, held until the lane's release;
    /// returns its device address.
    pub(in crate::backend) fn take_transient(
        &self,
        bytes: u64,
        held: &mut Held,
    ) -> Result<u64, BackendError> {
        let memory = self
            .transients
            .take(bytes)
            .map_err(|e| BackendError::driver(format!("allocating {bytes} transient bytes"), e))?;
        let address = memory.address();
        held.transients.push(memory);
        Ok(address)
    }

    /// Route readbacks: small items become result-ABI descriptors (the kernel's last
    /// thread copies them into the lane's mapped area), the rest DMA copies into
    /// staging; with the result ABI's parameter values, into `routed`. Arms the area
    /// (clears its stamps) for every dispatch; keeps the routes `routed` holds when
    /// the plan and addresses are `reused` and the routes were made for this lane's
    /// area (`reuse` module).
    pub(in crate::backend) fn route(
        &self,
        kernel: &KernelInner,
        (plan, staged, reused): (&Plan, &Staged, bool),
        guard: &mut LaneGuard<'_, '_>,
        routed: &mut Routed,
    ) -> Result<(), BackendError> {
        let lane = guard.lane_mut()?;
        if lane.results.is_none() {
            let area = ResultArea::new()
                .map_err(|e| BackendError::driver("allocating the result area", e))?;
            lane.results = Some(area);
            self.staging_allocations
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let area = lane
            .results
            .as_mut()
            .ok_or_else(|| BackendError::internal("no result area"))?;
        routed.arm_clear = area.arm_host();
        let area_address = area.results_address();
        if reused && routed.area == Some(area_address) {
            return Ok(());
        }
        routed.results = area.params();
        let threads = kernel.workgroup_size.iter().product::<u32>();
        let area_end = route_items(
            (&kernel.slots, threads),
            plan,
            (&staged.addresses, kernel.grid_barrier),
            routed,
        )?;
        routed.area_copy = area.copy_back(area_end);
        routed.area = Some(area_address);
        Ok(())
    }

    /// Order: after every dispatch in flight that shares memory this one writes (or
    /// writes memory this one touches: `staged.accesses`), and after an explicitly
    /// named predecessor; on the device only. Returns the book entries it is ordered
    /// after, for its own entry.
    pub(in crate::backend) fn order(
        &self,
        kernel: &KernelInner,
        staged: &Staged,
        guard: &LaneGuard<'_, '_>,
        after: Option<&InFlight<'_>>,
    ) -> Result<Ordered, BackendError> {
        let lane = guard.lane()?;
        let explicit = after.map(InFlight::order_handles);
        let (ordered, lanes) = self
            .in_flight
            .order_after(&staged.accesses, &lane.stream, explicit)
            .map_err(|error| {
                self.stream_failed(&kernel.name, "ordering it after a dispatch", error)
            })?;
        // A lane's kernel never ends: its requests are waited for here, on the host
        // (their completion words, delivered requests too until they retired).
        self.in_flight.wait_for_lanes(lanes, &kernel.name)?;
        Ok(ordered)
    }

    /// Enqueue every stream operation of `ops` on the guarded lane.
    pub(in crate::backend) fn enqueue(
        &self,
        kernel: &KernelInner,
        ops: &mut StreamOps<'_, driver::LoadedModule>,
        guard: &LaneGuard<'_, '_>,
        plan: &Plan,
    ) -> Result<(), BackendError> {
        let mut target = LaneTarget::of(guard.lane()?);
        // SAFETY: every address in `ops` is a resolved binding whose memory the guard
        // holds (owned buffers' Arcs, transient buffers), the kernel's barrier symbol
        // (alive with the kernel) or the lane's result area (alive with the lane);
        // staging was sized by `stage` for the uploads, the readback plan and the
        // barrier word, and nothing on the host touches it (or the area) until
        // `complete` has synchronised the stream (or the guard's release has). Every
        // result descriptor names a range plan_readback bounds-checked against its
        // binding and a destination route_reads placed inside the area.
        unsafe { enqueue(ops, &mut target) }.map_err(|failure| {
            if failure.error.is_cooperative_launch_too_large() {
                return BackendError::GridTooLargeForGridSync {
                    program: kernel.name.clone(),
                    grid_blocks: plan.launch.grid_blocks,
                    max_coresident: kernel.max_coresident_blocks,
                };
            }
            self.stream_failed(&kernel.name, failure.what, failure.error)
        })
    }

    /// Memory preflight for transient bindings: the bytes they need (bucketed) are
    /// checked against min(90% of total − held − pooled, 90% of live free memory);
    /// over budget → drop the transient pool and re-check → still over: an `Err`
    /// naming the bytes. Skipped entirely when the idle pool serves every bucket.
    pub(in crate::backend) fn preflight(
        &self,
        kernel: &KernelInner,
        bindings: &[Binding<'_>],
        sizes: &[u64],
    ) -> Result<(), BackendError> {
        let requests: SmallVec<[u64; 16]> = bindings
            .iter()
            .zip(sizes)
            .filter(|(binding, _)| binding.is_transient())
            .map(|(_, &bytes)| bytes)
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

/// A grid-sync kernel's grid must be co-resident: the `Fix:` error when it cannot be
/// (shared with the reference backend's estimate of the same limit).
pub(in crate::backend) fn check_coresident(
    name: &str,
    grid_sync: bool,
    launch: &LaunchPlan,
    max_coresident: u64,
) -> Result<(), BackendError> {
    if grid_sync && launch.grid_blocks > max_coresident {
        return Err(BackendError::GridTooLargeForGridSync {
            program: name.to_string(),
            grid_blocks: launch.grid_blocks,
            max_coresident,
        });
    }
    Ok(())
}

/// Workgroups of a kernel that a device of `multiprocessors` multiprocessors holds
/// `max_coresident` of at once, beside `lane_blocks` blocks of running lanes: a lane's
/// block may hold its multiprocessor whole (its server may take a block's share of the
/// register file, `codegen::ptx::lane::lane_registers`), and a cooperative grid waits
/// until every workgroup is resident, so a grid that counted on a lane's
/// multiprocessor would wait for the lane to stop, which it never does on its own.
/// Each lane block takes one multiprocessor's worth, rounded up. Shared with the
/// reference backend.
pub(in crate::backend) fn coresident_beside_lanes(
    max_coresident: u64,
    multiprocessors: u32,
    lane_blocks: u64,
) -> u64 {
    if lane_blocks == 0 || max_coresident == u64::MAX {
        return max_coresident;
    }
    let per_multiprocessor = max_coresident.div_ceil(u64::from(multiprocessors.max(1)));
    max_coresident.saturating_sub(per_multiprocessor.saturating_mul(lane_blocks))
}

/// The `Fix:` error for a graph scratch buffer bound outside a recording.
pub(in crate::backend) fn scratch_outside_a_graph(name: &str) -> BackendError {
    BackendError::bad_input(format!(
        "Fix: a graph scratch buffer is bound to a dispatch of {name} outside its recording; scratch \
         buffers exist only while their graph replays: bind a DeviceBuffer (or Binding::Zeroed) instead"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{BufferCount, ElemType, Name};

    /// Locks out a cooperative grid that counts on a running lane's multiprocessor
    /// (it would wait for the lane forever): each lane block takes one
    /// multiprocessor's worth of workgroups out, rounded up; lanes on every
    /// multiprocessor leave none; no lane, or a kernel without the bound, changes
    /// nothing. The unchanged capacity beside a lane is the negative control.
    #[test]
    fn coresident_workgroups_beside_lanes_leave_their_multiprocessors_out() {
        assert_eq!(coresident_beside_lanes(264, 132, 1), 262);
        assert_eq!(coresident_beside_lanes(132, 132, 1), 131);
        assert_ne!(coresident_beside_lanes(132, 132, 1), 132);
        assert_eq!(coresident_beside_lanes(200, 132, 1), 198);
        assert_eq!(coresident_beside_lanes(132, 132, 132), 0);
        assert_eq!(coresident_beside_lanes(132, 132, 500), 0);
        assert_eq!(coresident_beside_lanes(264, 132, 0), 264);
        assert_eq!(coresident_beside_lanes(u64::MAX, 132, 3), u64::MAX);
    }

    fn slot(binding: u32, access: Access) -> ParamSlot {
        ParamSlot {
            binding,
            name: Name::from(format!("b{binding}").as_str()),
            elem: ElemType::U32,
            count: BufferCount::Runtime,
            access,
        }
    }

    fn read(slot: u16, offset: u64, len: u64, staging_offset: usize) -> ReadItem {
        ReadItem {
            slot,
            offset,
            len,
            staging_offset,
        }
    }

    /// Locks out a routed readback that mixes its items up or keeps an earlier
    /// dispatch's routes: every item gets its own delivery in item order, with the
    /// binding of its own buffer; a small one goes to the result area with a
    /// descriptor reading its own buffer (a window of its block), a large one is a
    /// DMA copy from its own range into its staging place; routing again replaces
    /// everything (the control: the same lists, not twice as many).
    #[test]
    fn items_are_routed_in_order_to_the_area_or_staging() {
        let slots = [
            slot(0, Access::ReadOnly),
            slot(3, Access::ReadWrite),
            slot(5, Access::WriteOnly),
        ];
        let addresses = [0x1000, 0x2000, 0x8000];
        let mut plan = Plan::default();
        plan.request.sizes.extend([16, 64, 8192]);
        plan.request.reads.extend([
            read(1, 16, 16, 0),
            read(2, 0, 8192, 256),
            read(1, 0, 4, 8448),
        ]);
        let mut routed = Routed {
            results: ResultParams::new(0x10, 0x20),
            ..Routed::default()
        };
        let area_end = route_items((&slots, 1), &plan, (&addresses, None), &mut routed).unwrap();
        assert_eq!(routed.item_bindings.as_slice(), &[3, 5, 3]);
        assert_eq!(
            routed.deliveries.as_slice(),
            &[
                Delivery::Area {
                    offset: STAMP_BYTES,
                    len: 16
                },
                Delivery::Staging {
                    offset: 256,
                    len: 8192
                },
                Delivery::Area {
                    offset: STAMP_BYTES + 16,
                    len: 4
                },
            ]
        );
        assert_eq!(
            routed.copies.as_slice(),
            &[StagedCopy {
                device: 0x8000,
                staging_offset: 256,
                len: 8192
            }]
        );
        assert_eq!(area_end, STAMP_BYTES + 16 + 4);
        let mut expected = ResultParams::new(0x10, 0x20);
        expected.describe(0x2010, 16, STAMP_BYTES as u32, 0x2000..0x2040);
        expected.describe(0x2000, 4, STAMP_BYTES as u32 + 16, 0x2000..0x2040);
        assert_eq!(routed.results, expected);

        routed.results = ResultParams::new(0x10, 0x20);
        route_items((&slots, 1), &plan, (&addresses, None), &mut routed).unwrap();
        assert_eq!(routed.deliveries.len(), 3);
        assert_eq!(routed.copies.len(), 1);
        assert_eq!(routed.results, expected);
    }

    /// Locks out a grid-sync kernel's barrier word left to a stream copy when the
    /// result area can take it, or placed over an item: it goes behind the
    /// items, 16-byte aligned, with a descriptor of its own (which the kernel's
    /// last thread copies); with every descriptor taken it comes back by a copy
    /// into its staging place (the control); a kernel without a grid barrier
    /// routes none.
    #[test]
    fn the_barrier_word_rides_in_the_result_area_when_it_has_room() {
        let slots = [slot(0, Access::ReadWrite)];
        let addresses = [0x1000];
        let mut plan = Plan::default();
        plan.request.sizes.extend([4096]);
        plan.request.reads.extend([read(0, 0, 20, 0)]);
        plan.barrier_staging = 256;
        let route = |plan: &Plan, barrier| {
            let mut routed = Routed {
                results: ResultParams::new(0x10, 0x20),
                ..Routed::default()
            };
            let end = route_items((&slots, 1), plan, (&addresses, barrier), &mut routed).unwrap();
            (routed, end)
        };
        let (routed, end) = route(&plan, Some(0xB000));
        let at = STAMP_BYTES + 32;
        assert_eq!(routed.barrier, Some(BarrierWordAt::Area(at)));
        assert_eq!(end, at + BARRIER_BYTES);
        let mut expected = ResultParams::new(0x10, 0x20);
        expected.describe(0x1000, 20, STAMP_BYTES as u32, 0x1000..0x2000);
        let barrier_bytes = BARRIER_BYTES as u64;
        expected.describe(
            0xB000,
            barrier_bytes as u32,
            at as u32,
            0xB000..0xB000 + barrier_bytes,
        );
        assert_eq!(routed.results, expected);

        let (routed, end) = route(&plan, None);
        assert_eq!(routed.barrier, None);
        assert_eq!(end, STAMP_BYTES + 20);

        plan.request.reads.clear();
        for k in 0..crate::codegen::RESULT_RANGE_SLOTS as u64 {
            plan.request.reads.push(read(0, 64 * k, 20, 0));
        }
        let (routed, _) = route(&plan, Some(0xB000));
        assert_eq!(routed.barrier, Some(BarrierWordAt::Staging(256)));
    }

    /// Measures the host steps of a warm dispatch over device buffers that need no
    /// device, at 2, 9 and 17 bindings (the measurement fixture; every output read
    /// back, 16 bytes each): what a blocking dispatch no longer does (an `Arc` clone
    /// and drop per owned buffer; planning the request, `plan_request`, which the
    /// reuse of a repeated request skips), the check that reuses a plan
    /// (`Memo::describes`, with the scalar check `replan` makes), routing the readback (`route_items`), describing the
    /// stream operations (`StreamOps::describe_dispatch` with the launch parameters
    /// and their pointer array), the order book's view of the bindings
    /// (`Accesses::conflicts_with` against an earlier dispatch over other buffers),
    /// and copying the read-back items into `Outputs` and naming them. Run:
    /// `cargo test --release --lib host_cost_dispatch_host_steps -- --ignored
    /// --nocapture`.
    #[test]
    #[cfg(feature = "testing")]
    #[ignore = "host-cost instrument: run with --ignored --nocapture host_cost"]
    fn host_cost_dispatch_host_steps() {
        use std::hint::black_box;
        use std::time::Duration;

        use crate::backend::dispatch::reuse::Memo;
        use crate::backend::{DeviceBuffer, ModuleKey, Outputs, ReferenceBackend};
        use crate::config::CodegenOptions;
        use crate::host_cost::{Cell, CellOptions};

        let options =
            CellOptions::with_targets(Duration::from_millis(200), Duration::from_millis(20));
        let backend = ReferenceBackend::new();
        for buffers in [2u32, 9, 17] {
            let program = crate::fixtures::host_cost_fixture(buffers, 16);
            let kernel = backend
                .compile(&program, &CodegenOptions::new())
                .expect("compile");
            let reference = backend.reference_kernel(&kernel).expect("reference kernel");
            let device: Vec<DeviceBuffer> = (0..buffers)
                .map(|_| backend.buffer(16).expect("buffer"))
                .collect();
            let bindings: Vec<Binding> = device.iter().map(Binding::from).collect();
            let request = Dispatch::new(&kernel, &bindings);
            let slots = &reference.slots;
            // Stand-ins for the device addresses of the buffers' memory, found in O(1)
            // as `DeviceBuffer::memory_for` finds them.
            let address_of =
                |buffer: &DeviceBuffer| Some(buffer as *const DeviceBuffer as u64 | 1 << 48);
            let addresses: Vec<u64> = device.iter().filter_map(address_of).collect();
            let mut plan = Plan::default();
            plan_request(
                &reference.name,
                (slots, reference.program.scalars()),
                &reference.outputs,
                &request,
                &mut plan.request,
            )
            .expect("plan");
            let identity = (1, ModuleKey(1));
            let mut memo = Memo::default();
            memo.record(identity, &request, (&addresses, false));
            let mut accesses = Accesses::default();
            for (slot, &address) in slots.iter().zip(&addresses) {
                if slot.access == Access::ReadOnly {
                    accesses.reads.push(address);
                } else {
                    accesses.writes.push(address);
                }
            }
            let other = Accesses {
                reads: accesses.reads.iter().map(|a| a + 1).collect(),
                writes: accesses.writes.iter().map(|a| a + 1).collect(),
            };
            let mut routed = Routed::default();
            let holds: Vec<Arc<[u8; 48]>> = (0..buffers).map(|_| Arc::new([0; 48])).collect();
            let area = vec![7u8; RESULT_AREA_BYTES];
            let cells = [
                Cell::measure(
                    &format!("hold buffers: Arc clone + drop each ({buffers}), removed"),
                    &options,
                    |n| {
                        (0..n).fold(0u64, |acc, _| {
                            let held: PerBinding<Arc<[u8; 48]>> =
                                black_box(&holds).iter().map(Arc::clone).collect();
                            acc ^ black_box(&held).len() as u64
                        })
                    },
                ),
                Cell::measure(
                    &format!("plan_request ({buffers}), skipped when reused"),
                    &options,
                    |n| {
                        (0..n).fold(0u64, |acc, _| {
                            let mut fresh = RequestPlan::default();
                            plan_request(
                                &reference.name,
                                (slots, reference.program.scalars()),
                                &reference.outputs,
                                black_box(&request),
                                &mut fresh,
                            )
                            .expect("plan");
                            acc ^ black_box(&fresh).staging_bytes as u64
                        })
                    },
                ),
                Cell::measure(
                    &format!("reuse check + scalar check ({buffers})"),
                    &options,
                    |n| {
                        (0..n).fold(0u64, |acc, _| {
                            let request = black_box(&request);
                            let scalars = reference.program.scalars();
                            check_request_scalars(&reference.name, scalars, request)
                                .expect("scalars");
                            acc ^ memo.describes(identity, request, address_of) as u64
                        })
                    },
                ),
                Cell::measure(&format!("route_items ({buffers})"), &options, |n| {
                    (0..n).fold(0u64, |acc, _| {
                        routed.results = ResultParams::new(0x10, 0x20);
                        let end = route_items(
                            (slots, 1),
                            black_box(&plan),
                            (&addresses, None),
                            &mut routed,
                        )
                        .expect("route");
                        acc ^ end as u64
                    })
                }),
                Cell::measure(
                    &format!("describe + parameter array ({buffers})"),
                    &options,
                    |n| {
                        (0..n).fold(0u64, |acc, _| {
                            let mut ops: StreamOps<'_, ()> = StreamOps::empty();
                            ops.describe_dispatch(
                                slots,
                                black_box(&addresses),
                                &plan.request.sizes,
                                &[],
                                KernelLaunch {
                                    module: &(),
                                    grid: [1, 1, 1],
                                    block: [1, 1, 1],
                                    iterations: 1,
                                    grid_barrier: None,
                                    barrier_settled: false,
                                },
                            );
                            ops.parameters.results = Some(ResultParams::new(0x10, 0x20));
                            let pointers = ops.parameters.pointer_array();
                            acc ^ black_box(&pointers).len() as u64 ^ ops.window_marks().0 as u64
                        })
                    },
                ),
                Cell::measure(
                    &format!("order book: conflict test, one in flight ({buffers})"),
                    &options,
                    |n| {
                        (0..n).fold(0u64, |acc, _| {
                            acc ^ black_box(&other).conflicts_with(black_box(&accesses)) as u64
                        })
                    },
                ),
                Cell::measure(
                    &format!("copy out into Outputs ({buffers})"),
                    &options,
                    |n| {
                        (0..n).fold(0u64, |acc, _| {
                            let total = routed.deliveries.iter().map(Delivery::len).sum();
                            let mut out = Outputs::for_items(total, &routed.item_bindings);
                            for delivery in &routed.deliveries {
                                if let Delivery::Area { offset, len } = *delivery {
                                    out.push_item(&black_box(&area)[offset..offset + len]);
                                }
                            }
                            out.name_by(kernel.clone());
                            acc ^ black_box(&out).as_bytes().len() as u64
                        })
                    },
                ),
            ];
            for cell in cells {
                let cell = cell.expect("measured");
                println!(
                    "{:<56} {:>8.1} ns (rsd {:.1} %)",
                    cell.name,
                    cell.minimum_ns_per_unit,
                    100.0 * cell.relative_std_dev.unwrap_or(0.0)
                );
            }
        }
    }
}
