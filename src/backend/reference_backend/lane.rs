//! The reference backend's lane: the same lane rules and request checks as a CUDA
//! lane (`backend::lane`), with the same `Fix:` messages, then the request runs on the
//! interpreter exactly as [`ReferenceBackend::run`] runs it. There is no resident
//! kernel to keep: the point is that code written against
//! [`AnyLane`](super::super::AnyLane) gets the same answers, errors included, with or
//! without a GPU.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::codegen::ptx::lane::{lane_pool_bytes, lane_shared_bytes};
use crate::lower;

use super::super::dispatch::Sink;
use super::super::lane::{
    check_lane_blocks, check_lane_kernels, check_lane_plan, check_lane_shared, lane_name,
    not_in_lane, LaneKernelShape,
};
use super::super::request::Target;
use super::super::{
    BackendError, Dispatch, Finished, Kernel, LaneOptions, Outputs, PendingDispatch, Timings,
};
use super::{ReferenceBackend, ReferenceKernel};

/// A lane on the reference interpreter (see the module docs).
#[derive(Clone)]
pub(in crate::backend) struct ReferenceLane {
    backend: ReferenceBackend,
    kernels: Vec<Kernel>,
    options: LaneOptions,
    workgroup_size: [u32; 3],
    /// Its blocks, counted in the backend's `lane_blocks` until the last clone goes.
    _blocks: Arc<LaneBlocks>,
}

/// A live lane's blocks in its backend's count (a CUDA lane's stay resident).
struct LaneBlocks {
    backend: ReferenceBackend,
    blocks: u64,
}

impl LaneBlocks {
    fn hold(backend: &ReferenceBackend, blocks: u32) -> Arc<Self> {
        let blocks = u64::from(blocks);
        backend
            .inner
            .lane_blocks
            .fetch_add(blocks, Ordering::AcqRel);
        Arc::new(LaneBlocks {
            backend: backend.clone(),
            blocks,
        })
    }
}

impl Drop for LaneBlocks {
    fn drop(&mut self) {
        self.backend
            .inner
            .lane_blocks
            .fetch_sub(self.blocks, Ordering::AcqRel);
    }
}

impl ReferenceBackend {
    /// Check `kernels` and `options` as [`CudaBackend::lane`](super::super::CudaBackend::lane)
    /// does and make a lane of them.
    pub(in crate::backend) fn lane(
        &self,
        kernels: &[&Kernel],
        options: LaneOptions,
    ) -> Result<ReferenceLane, BackendError> {
        options.validate()?;
        let reference: Vec<&ReferenceKernel> = kernels
            .iter()
            .map(|kernel| self.reference_kernel(kernel))
            .collect::<Result<_, _>>()?;
        let shapes: Vec<LaneKernelShape<'_>> = reference
            .iter()
            .map(|kernel| LaneKernelShape {
                name: &kernel.name,
                workgroup_size: kernel.workgroup_size,
                grid_sync: kernel.grid_sync,
                global_buffers: kernel.slots.len(),
            })
            .collect();
        let workgroup_size = check_lane_kernels(&shapes)?;
        let caps = &self.inner.caps;
        let lowering = caps.lowering_caps();
        let pool = reference
            .iter()
            .map(|kernel| {
                let lowered =
                    lower::lower_workgroup_reductions(kernel.program.program(), &lowering);
                lane_pool_bytes(&lowered)
            })
            .max()
            .unwrap_or(0);
        check_lane_shared(lane_shared_bytes(pool), caps.max_shared_memory_per_block)?;
        let name = lane_name(&reference[0].name, reference.len());
        let most = reference[0].max_coresident_blocks;
        check_lane_blocks(&name, options.blocks, most)?;
        Ok(ReferenceLane {
            backend: self.clone(),
            kernels: kernels.iter().map(|&kernel| kernel.clone()).collect(),
            _blocks: LaneBlocks::hold(self, options.blocks),
            options,
            workgroup_size,
        })
    }
}

impl ReferenceLane {
    /// Every check a CUDA lane makes of `request` before it rings, in its order.
    fn check(&self, request: &Dispatch<'_>, sink: &Sink<'_, '_>) -> Result<(), BackendError> {
        let backend = &self.backend;
        let kernel = match request.target {
            Target::Kernel(kernel) => kernel.clone(),
            Target::Program(program) => backend.compile(program, &request.codegen)?,
        };
        let reference = backend.reference_kernel(&kernel)?;
        let member = self.kernels.iter().any(|candidate| {
            backend.reference_kernel(candidate).is_ok_and(|candidate| {
                candidate.program.program().digest() == reference.program.program().digest()
                    && candidate.codegen == reference.codegen
            })
        });
        if !member {
            return Err(not_in_lane(&reference.name, &self.kernels));
        }
        let (plan, _) = backend.plan(reference, request, sink)?;
        check_lane_plan(
            (&reference.name, &reference.slots),
            request,
            &plan,
            &self.options,
        )
    }

    /// [`ReferenceBackend::run`] after the lane's checks.
    pub(in crate::backend) fn run(&self, request: Dispatch<'_>) -> Result<Finished, BackendError> {
        let mut unused = Outputs::default();
        self.check(&request, &Sink::Packed(&mut unused))?;
        self.backend.run(request)
    }

    /// [`ReferenceBackend::run_into`] after the lane's checks.
    pub(in crate::backend) fn run_into(
        &self,
        request: Dispatch<'_>,
        outputs: &mut [&mut [u8]],
    ) -> Result<Timings, BackendError> {
        self.check(&request, &Sink::Slices(outputs))?;
        self.backend.run_into(request, outputs)
    }

    /// [`ReferenceBackend::submit`] after the lane's checks.
    pub(in crate::backend) fn submit(
        &self,
        request: Dispatch<'_>,
    ) -> Result<PendingDispatch, BackendError> {
        let mut unused = Outputs::default();
        self.check(&request, &Sink::Packed(&mut unused))?;
        self.backend.submit(request)
    }

    /// Its kernels, in body order.
    pub(in crate::backend) fn kernels(&self) -> &[Kernel] {
        &self.kernels
    }

    /// Its workgroup shape.
    pub(in crate::backend) fn workgroup_size(&self) -> [u32; 3] {
        self.workgroup_size
    }

    /// Its options.
    pub(in crate::backend) fn options(&self) -> &LaneOptions {
        &self.options
    }
}
