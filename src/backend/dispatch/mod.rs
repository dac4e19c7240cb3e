//! Dispatch on CUDA: a [`Dispatch`] request → staged buffers → one description of
//! the stream operations → one synchronize, charged phase by phase to the probe.
//!
//! # The path
//!
//! [`BackendInner::submit_request`] takes a request from its plan to the device, one
//! function per step, each in this order:
//!
//! 1. **plan** (`stage::plan`, pure): binding count, sizes, buffers bound twice and
//!    the readback policy (`plan::plan_request`, shared with the reference
//!    backend, so both refuse a bad request with the same error), the launch plan
//!    and, for grid sync, co-residency;
//! 2. **stage** (`stage::stage`): a lane is leased into a
//!    [`LaneGuard`](stage::LaneGuard) — which releases it on every exit that does not
//!    hand it to an [`InFlight`] — then bindings become device addresses: owned buffers
//!    in place, host bytes into pinned staging and a pooled transient buffer, zeroed
//!    and pinned bindings into transients;
//! 3. **route readbacks** (`stage::route`): small items become result-ABI
//!    descriptors (the kernel's last thread copies them into the lane's host-mapped
//!    area), the rest DMA copies into staging;
//! 4. **describe** the stream operations with [`StreamOps::dispatch`], the one
//!    constructor graph recording also uses, plus this dispatch's uploads, readback
//!    and events;
//! 5. **order** (`stage::order`): after every dispatch in flight that shares
//!    written memory (the order book) and after an explicit predecessor, on the
//!    device only;
//! 6. **enqueue** (`stage::enqueue`): every operation, through the lane's
//!    [`StreamTarget`](super::stream_ops::StreamTarget).
//!
//! [`BackendInner::complete`] (`complete.rs`) then does the one
//! `cuStreamSynchronize`, the fault handling, the grid-barrier audit, the device
//! times and the host side of the readback, and returns the lane. A blocking
//! [`CudaBackend::run`] or [`CudaBackend::run_into`] calls both; [`CudaBackend::submit`]
//! (`pending.rs`) returns between them. Blocking copies into and out of owned
//! buffers are in `transfer.rs`. Measured on the H200: 16 blocking 16-byte copies
//! cost 107.5 µs where 16 async copies and one synchronize cost 36.8 µs, which is
//! why every readback is async copies (or no copy at all) and one synchronize.
//!
//! Probe phases: `prepare` the plan, `stage` binding resolution and staging writes,
//! `resolve` the readback routes and the description, `lease` the grid-barrier
//! lease, `launch` ordering and enqueueing, `release` the synchronize and audit,
//! `readback` the copy out.
//!
//! Readback (`readback` module): items of at most
//! `readback::MAPPED_RANGE_MAX_BYTES` (up to 16) are not copied at all: the kernel's
//! last thread writes them into the lane's host-mapped result area (measured on the
//! H200: 9.7–9.9 µs per dispatch for 1–16 outputs against 11.6–35.0 µs with one
//! async copy each); longer ones go by one async copy each into staging.
//!
//! Device time: [`Timings::kernel_stamps_ns`](super::Timings) always comes from the
//! `%globaltimer` stamps the kernel writes itself (earliest block start of the first
//! launch to the end of the last thread of the last launch), so timing costs
//! nothing. CUDA events are recorded only with
//! [`Timing::EventWindow`](super::Timing) or with the probe on: they give
//! `event_window_ns` (the whole stream window: uploads, clears, launches, copies)
//! and the pipelining spans. On driver 580 their records and elapsed-time queries
//! cost about 10 µs.

mod complete;
mod pending;
mod reuse;
mod stage;
mod transfer;

use std::sync::MutexGuard;
use std::time::Instant;

use crate::config::CodegenOptions;
use crate::probe::{self, DispatchProbe};

use super::driver;
use super::kernel::{KernelInner, KernelKind};
use super::request::Target;
use super::stream_ops::StreamOps;
use super::{
    BackendError, BackendInner, Binding, CudaBackend, Dispatch, Finished, Kernel, Outputs, Timings,
};

pub(in crate::backend) use complete::{BarrierCheck, InFlight};
pub(in crate::backend) use pending::{
    count_pending, foreign_predecessor, PendingOrigin, PendingState,
};
pub use pending::{DeviceClock, DeviceSpans, PendingDispatch, MAX_PENDING};
pub(in crate::backend) use reuse::{address_on, kernel_identity, Memo};
pub(in crate::backend) use stage::{
    check_coresident, coresident_beside_lanes, count_for_probe, scratch_outside_a_graph,
    Bookkeeping, Held,
};
pub(in crate::backend) use transfer::Transfer;

/// Where read-back bytes go.
pub(in crate::backend) enum Sink<'s, 'o> {
    /// Every item in one allocation.
    Packed(&'s mut Outputs),
    /// The caller's slices, one per item (allocates nothing).
    Slices(&'s mut [&'o mut [u8]]),
}

/// What [`BackendInner::submit_request`] returns: the dispatch in flight, the
/// grid-barrier lease (grid-sync kernels; held until the dispatch completes) and the
/// probe mark.
pub(in crate::backend) struct Submitted<'k, 'r> {
    pub(in crate::backend) in_flight: InFlight<'r>,
    pub(in crate::backend) lease: Option<MutexGuard<'k, ()>>,
    pub(in crate::backend) mark: Option<Instant>,
}

/// The kernel a request names: borrowed from the request, or compiled (found in the
/// caches) for a program request.
pub(in crate::backend) enum Resolved<'k> {
    Borrowed(&'k Kernel),
    Owned(Kernel),
}

impl std::ops::Deref for Resolved<'_> {
    type Target = Kernel;

    fn deref(&self) -> &Kernel {
        match self {
            Resolved::Borrowed(kernel) => kernel,
            Resolved::Owned(kernel) => kernel,
        }
    }
}

impl Resolved<'_> {
    /// An owned handle (a clone of a borrowed one: one reference count).
    fn into_owned(self) -> Kernel {
        match self {
            Resolved::Borrowed(kernel) => kernel.clone(),
            Resolved::Owned(kernel) => kernel,
        }
    }
}

pub(in crate::backend) fn elapsed_ns(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

impl CudaBackend {
    /// Run `request` and wait: the one synchronize, then the outputs (per its
    /// readback policy, addressable by buffer name) and [`Timings`]. With the phase
    /// probe on, prints one probe line.
    pub fn run(&self, request: Dispatch<'_>) -> Result<Finished, BackendError> {
        let mut outputs = Outputs::default();
        let (kernel, timings) = self.finish(&request, Sink::Packed(&mut outputs))?;
        outputs.name_by(kernel.into_owned());
        Ok(Finished { outputs, timings })
    }

    /// Run `request` and read its outputs into caller buffers, one per readback
    /// item, each exactly the item's length: the hot path. Once warm it makes no
    /// driver allocation and no heap allocation. Returns the [`Timings`].
    pub fn run_into(
        &self,
        request: Dispatch<'_>,
        outputs: &mut [&mut [u8]],
    ) -> Result<Timings, BackendError> {
        self.finish(&request, Sink::Slices(outputs))
            .map(|(_, timings)| timings)
    }

    /// The blocking finish of both: open the probe dispatch, resolve the kernel
    /// (charged from the call's first instant), run, and hand the kernel back.
    fn finish<'k>(
        &self,
        request: &Dispatch<'k>,
        sink: Sink<'_, '_>,
    ) -> Result<(Resolved<'k>, Timings), BackendError> {
        let probe = probe::begin_dispatch();
        let start = Instant::now();
        let mark = probe.as_ref().map(|_| start);
        let (kernel, mark) = self.inner.resolve(request.target, &request.codegen, mark)?;
        let inner = self.inner.cuda_kernel(&kernel)?;
        let timings = self
            .inner
            .execute(inner, request, sink, probe, (start, mark))?;
        Ok((kernel, timings))
    }
}

impl BackendInner {
    /// The kernel of `target`: the request's own, or a program's from the caches
    /// (validation, lowering, PTX and module lookups, charged to the probe's
    /// `prepare`, `ptx`, `modkey` and `resolve` phases from `mark` on).
    pub(in crate::backend) fn resolve<'k>(
        &self,
        target: Target<'k>,
        codegen: &CodegenOptions,
        mark: Option<Instant>,
    ) -> Result<(Resolved<'k>, Option<Instant>), BackendError> {
        self.check_alive()?;
        match target {
            Target::Kernel(kernel) => Ok((Resolved::Borrowed(kernel), mark)),
            Target::Program(program) => {
                let (inner, mark) = self.resolve_kernel(program, codegen, mark)?;
                Ok((Resolved::Owned(Kernel::cuda(inner)), mark))
            }
        }
    }

    /// The CUDA kernel inside `kernel`, checked to belong to this backend.
    pub(in crate::backend) fn cuda_kernel<'k>(
        &self,
        kernel: &'k Kernel,
    ) -> Result<&'k KernelInner, BackendError> {
        match &kernel.kind {
            KernelKind::Cuda(inner) if inner.backend_id == self.id => Ok(inner),
            _ => Err(foreign_kernel(kernel.name())),
        }
    }

    /// Run one request of a resolved kernel: submit, then complete. `clock` is the
    /// call's first instant and the probe's current phase mark.
    fn execute(
        &self,
        kernel: &KernelInner,
        request: &Dispatch<'_>,
        sink: Sink<'_, '_>,
        probe: Option<DispatchProbe>,
        (start, mark): (Instant, Option<Instant>),
    ) -> Result<Timings, BackendError> {
        let after = pending::predecessor(self, request, kernel)?;
        let mut books = reuse::take_thread_books();
        let submitted = self.submit_request(
            kernel,
            request,
            (&sink, &mut books, request.bindings),
            (start, mark),
            probe.is_some(),
            after,
        );
        let result = submitted.and_then(
            |Submitted {
                 in_flight,
                 lease,
                 mark,
             }| {
                let result = self.complete(kernel, in_flight, &mut books, sink, mark, None);
                drop(lease);
                result
            },
        );
        reuse::keep_thread_books(books);
        let timings = result?;
        if let Some(probe) = probe {
            probe.finish(timings.probe());
        }
        Ok(timings)
    }

    /// Plan, stage, route, describe, order and enqueue one request on a leased lane,
    /// writing down what it did in `books` (which the dispatch's completion reads);
    /// nothing waits. `borrowed` is the request's bindings when the caller's borrow
    /// outlives the dispatch (a blocking one: no reference count per buffer), empty
    /// for a submission (which holds every bound buffer). The returned lease
    /// (grid-sync kernels only) must be held until [`BackendInner::complete`]. Every
    /// exit before the hand-over releases the lane (its
    /// [`LaneGuard`](stage::LaneGuard)).
    pub(in crate::backend) fn submit_request<'k, 'r>(
        &self,
        kernel: &'k KernelInner,
        request: &Dispatch<'_>,
        (sink, books, borrowed): (&Sink<'_, '_>, &mut Bookkeeping, &'r [Binding<'r>]),
        (start, mark): (Instant, Option<Instant>),
        probe_on: bool,
        after: Option<&InFlight<'_>>,
    ) -> Result<Submitted<'k, 'r>, BackendError> {
        self.check_alive()?;
        let timed = request.timing == super::Timing::EventWindow || probe_on;
        // A blocking dispatch may reuse the previous one's plan (`reuse` module).
        let reused = !borrowed.is_empty()
            && books
                .memo
                .describes(reuse::kernel_identity(kernel), request, |buffer| {
                    reuse::address_on(self, buffer)
                });
        books.begin(reused);
        let Bookkeeping {
            plan,
            staged,
            transfers,
            routed,
            held,
            memo,
        } = books;

        // prepare: binding and readback plans, launch plan, cooperative residency.
        if reused {
            self.replan(kernel, request, (sink, plan))?;
        } else {
            self.plan(kernel, request, sink, plan)?;
        }
        if kernel.grid_barrier.is_some() {
            // The one residency check, for a new plan and a reused one alike:
            // against what the device holds now, beside the blocks of running
            // lanes (which may have started since the plan was made).
            check_coresident(
                &kernel.name,
                true,
                &plan.launch,
                self.coresident_now(kernel.max_coresident_blocks),
            )?;
        }
        if probe_on {
            stage::count_for_probe(kernel, request, plan.launch.grid_blocks);
        }
        let mark = probe::charge_and_mark(probe::Phase::Prepare, mark);

        // stage: lease a lane, resolve bindings, write host inputs into staging.
        self.bind()?;
        let mut guard = stage::LaneGuard::lease(self, held, borrowed)?;
        if reused {
            self.grow_staging(kernel, plan, &mut guard)?;
        } else {
            self.stage(
                kernel,
                request,
                plan,
                &mut guard,
                (&mut *staged, &mut *transfers),
            )?;
        }
        let mark = probe::charge_and_mark(probe::Phase::Stage, mark);

        // resolve: readback routes, then the one description of the stream operations.
        self.route(kernel, (plan, staged, reused), &mut guard, routed)?;
        if !borrowed.is_empty() {
            memo.record(
                reuse::kernel_identity(kernel),
                request,
                (&staged.addresses, reused),
            );
        }
        let mut ops = StreamOps::empty();
        stage::operations(
            &mut ops,
            kernel,
            (request, plan, staged),
            transfers,
            routed,
            timed,
        );
        let window = ops.window_marks();
        let mark = probe::charge_and_mark(probe::Phase::Resolve, mark);

        // lease: the grid barrier counter is module-global.
        let lease = kernel.grid_barrier.map(|_| {
            kernel
                .barrier_lease
                .lock()
                .unwrap_or_else(|p| p.into_inner())
        });
        let barrier = match (lease.is_some(), routed.barrier) {
            (true, Some(at)) => Some(settle_barrier(kernel, &mut ops, at, plan)),
            (true, None) => {
                return Err(BackendError::internal(
                    "a grid-sync dispatch was routed without its barrier word",
                ))
            }
            (false, _) => None,
        };
        let mark = probe::charge_and_mark(probe::Phase::Lease, mark);

        // order, then launch: every stream operation, on the device after what it must follow.
        let ordered = self.order(kernel, staged, &guard, after)?;
        self.enqueue(kernel, &mut ops, &guard, plan)?;
        let lane = guard.hand_over();
        self.in_flight
            .enter(&lane.stream, &lane.order, staged.accesses.clone(), ordered);
        let enqueue_ns = elapsed_ns(start);
        let mark = probe::charge_and_mark(probe::Phase::Launch, mark);
        Ok(Submitted {
            in_flight: InFlight {
                lane,
                borrowed,
                barrier,
                timed,
                window,
                start,
                enqueue_ns,
            },
            lease,
            mark,
        })
    }
}

/// A grid-sync launch's barrier, taken by the holder of the kernel's barrier
/// lease: a launch loop of one launch skips the reset when the last audit left
/// the word settled (`KernelInner::barrier_settled`); the word is unknown until
/// this launch's audit passes. Returns what the audit checks.
fn settle_barrier(
    kernel: &KernelInner,
    ops: &mut StreamOps<'_, driver::LoadedModule>,
    at: stage::BarrierWordAt,
    plan: &stage::Plan,
) -> BarrierCheck {
    let settled = kernel
        .barrier_settled
        .swap(false, std::sync::atomic::Ordering::Relaxed);
    if let Some(launch) = ops.launch.as_mut() {
        if settled && launch.iterations == 1 {
            launch.barrier_settled = true;
        }
    }
    BarrierCheck {
        at,
        grid_blocks: plan.launch.grid_blocks,
    }
}

/// The `Fix:` error for a kernel another backend compiled; the same text on every
/// backend.
pub(in crate::backend) fn foreign_kernel(name: &str) -> BackendError {
    BackendError::InvalidHandle {
        message: format!(
            "Fix: the kernel for {name} was compiled by another backend; compile it with the backend \
             that dispatches it"
        ),
    }
}
