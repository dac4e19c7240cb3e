//! Device capabilities: what the device can do, the flags derived from it,
//! and the launch-geometry checks every dispatch goes through.
//!
//! Caps are read once at `acquire` (≈40 attribute queries) and never again: the
//! hot path only reads plain fields. Pipeline feature flags change generated code,
//! so they are part of the PTX cache key: two devices that differ in them can
//! never share a cached module.

use crate::ir::Limits;
use crate::lower::LoweringCaps;

use super::driver::{self, Attribute, Device, DriverResult};
use super::error::BackendError;

/// Every device attribute [`DeviceCaps`] holds, read once at acquire.
pub(in crate::backend) fn read_caps(ordinal: usize, device: Device) -> DriverResult<DeviceCaps> {
    let attribute = |a| device.attribute(a).map(|v| v.max(0) as u32);
    Ok(DeviceCaps {
        ordinal,
        name: device.name()?,
        compute_capability: (
            attribute(Attribute::ComputeCapabilityMajor)?,
            attribute(Attribute::ComputeCapabilityMinor)?,
        ),
        sm_count: attribute(Attribute::MultiprocessorCount)?,
        total_memory: device.total_memory()?,
        max_threads_per_block: attribute(Attribute::MaxThreadsPerBlock)?,
        max_threads_per_sm: attribute(Attribute::MaxThreadsPerMultiprocessor)?,
        max_block_dims: [
            attribute(Attribute::MaxBlockDim(0))?,
            attribute(Attribute::MaxBlockDim(1))?,
            attribute(Attribute::MaxBlockDim(2))?,
        ],
        max_grid_dims: [
            attribute(Attribute::MaxGridDim(0))?,
            attribute(Attribute::MaxGridDim(1))?,
            attribute(Attribute::MaxGridDim(2))?,
        ],
        max_shared_memory_per_block: attribute(Attribute::MaxSharedMemoryPerBlock)?,
        max_shared_memory_per_block_optin: attribute(Attribute::MaxSharedMemoryPerBlockOptin)?,
        warp_size: attribute(Attribute::WarpSize)?,
        cooperative_launch: attribute(Attribute::CooperativeLaunch)? != 0,
        concurrent_kernels: attribute(Attribute::ConcurrentKernels)? != 0,
        async_engine_count: attribute(Attribute::AsyncEngineCount)?,
        driver_version: driver::driver_version()?,
    })
}

/// What a CUDA device offers, read once when the backend is acquired.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceCaps {
    /// Device ordinal.
    pub ordinal: usize,
    /// Marketing name, e.g. "NVIDIA H200".
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// Number of streaming multiprocessors.
    pub sm_count: u32,
    /// Device memory in bytes.
    pub total_memory: u64,
    /// Most threads in one block (workgroup).
    pub max_threads_per_block: u32,
    /// Most resident threads per SM.
    pub max_threads_per_sm: u32,
    /// Largest block size per axis.
    pub max_block_dims: [u32; 3],
    /// Largest grid size per axis.
    pub max_grid_dims: [u32; 3],
    /// Static shared memory one block may use, bytes (a lane's limit).
    pub max_shared_memory_per_block: u32,
    /// Shared memory one block may opt in to, bytes (a kernel's limit: its
    /// workgroup buffers past 48 KiB are dynamic shared memory).
    pub max_shared_memory_per_block_optin: u32,
    /// Threads per warp.
    pub warp_size: u32,
    /// Whether cooperative launches (grid sync) are supported.
    pub cooperative_launch: bool,
    /// Whether kernels from different streams may run concurrently.
    pub concurrent_kernels: bool,
    /// Number of asynchronous copy engines.
    pub async_engine_count: u32,
    /// CUDA version the driver implements, e.g. 13000.
    pub driver_version: i32,
}

/// Code-generation-relevant features, a bit set. Part of the PTX cache identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PipelineFeatures(pub u32);

/// The first driver version (`cuDriverGetVersion`: CUDA 12.8) that loads PTX ISA 8.6,
/// which `fence.acquire.sys` needs.
pub const MIN_ACQUIRE_ONLY_DRIVER: i32 = 12_080;

impl PipelineFeatures {
    /// Warp shuffles (`shfl.sync`): reductions lower to subgroup steps.
    pub const SUBGROUP_OPS: u32 = 1 << 0;
    /// Warp reductions in one instruction (`redux.sync`, sm_80+).
    pub const WARP_REDUX: u32 = 1 << 1;
    /// Cooperative launch: grid sync is available.
    pub const GRID_SYNC: u32 = 1 << 2;
    /// `fence.acquire.sys` after an acquire load (sm_90 and newer, a driver of
    /// CUDA 12.8 or later, which loads PTX ISA 8.6): see
    /// [`AcquireFence`](crate::AcquireFence).
    pub const ACQUIRE_ONLY_FENCE: u32 = 1 << 3;

    /// Whether a flag is set.
    pub fn has(self, flag: u32) -> bool {
        self.0 & flag == flag
    }
}

impl DeviceCaps {
    /// Caps of an H200 (sm_90) as measured on the project's GPU machine, for tests
    /// and tools that need caps without a device. Never used to launch.
    pub fn synthetic_h200() -> DeviceCaps {
        DeviceCaps {
            ordinal: 0,
            name: "NVIDIA H200 (synthetic caps)".into(),
            compute_capability: (9, 0),
            sm_count: 132,
            total_memory: 150_110_011_392,
            max_threads_per_block: 1024,
            max_threads_per_sm: 2048,
            max_block_dims: [1024, 1024, 64],
            max_grid_dims: [2_147_483_647, 65_535, 65_535],
            max_shared_memory_per_block: 49_152,
            max_shared_memory_per_block_optin: 232_448,
            warp_size: 32,
            cooperative_launch: true,
            concurrent_kernels: true,
            async_engine_count: 3,
            driver_version: 13_000,
        }
    }

    /// `sm_XY` number used as the PTX `.target`.
    pub fn ptx_target_sm(&self) -> u32 {
        self.compute_capability.0 * 10 + self.compute_capability.1
    }

    /// What one multiprocessor holds at once: the target's table
    /// ([`multiprocessor_limits`](crate::codegen::multiprocessor_limits)) with this
    /// device's own resident-thread count, the bounds of
    /// [`CodegenOptions::min_blocks_per_multiprocessor`](crate::CodegenOptions::min_blocks_per_multiprocessor).
    pub fn multiprocessor_limits(&self) -> crate::codegen::MultiprocessorLimits {
        let table = crate::codegen::multiprocessor_limits(self.ptx_target_sm());
        crate::codegen::MultiprocessorLimits {
            threads: table.threads.min(self.max_threads_per_sm.max(1)),
            ..table
        }
    }

    /// Warp shuffles with explicit member masks (sm_70+, 32-lane warps).
    pub fn supports_subgroup_ops(&self) -> bool {
        self.compute_capability.0 >= 7 && self.warp_size == 32
    }

    /// Grid-wide synchronisation via cooperative launch.
    pub fn supports_grid_sync(&self) -> bool {
        self.cooperative_launch
    }

    /// Half-precision arithmetic (sm_53+).
    pub fn supports_f16(&self) -> bool {
        self.compute_capability >= (5, 3)
    }

    /// bfloat16 arithmetic (sm_80+).
    pub fn supports_bf16(&self) -> bool {
        self.compute_capability.0 >= 8
    }

    /// Tensor cores (sm_70+).
    pub fn supports_tensor_cores(&self) -> bool {
        self.compute_capability.0 >= 7
    }

    /// Copies overlapping kernels (async engines plus concurrent kernels).
    pub fn supports_async_compute(&self) -> bool {
        self.async_engine_count > 0 && self.concurrent_kernels
    }

    /// The flags that change generated code.
    pub fn pipeline_features(&self) -> PipelineFeatures {
        let mut bits = 0;
        if self.supports_subgroup_ops() {
            bits |= PipelineFeatures::SUBGROUP_OPS;
        }
        if self.compute_capability.0 >= 8 {
            bits |= PipelineFeatures::WARP_REDUX;
        }
        if self.supports_grid_sync() {
            bits |= PipelineFeatures::GRID_SYNC;
        }
        if self.compute_capability.0 >= 9 && self.driver_version >= MIN_ACQUIRE_ONLY_DRIVER {
            bits |= PipelineFeatures::ACQUIRE_ONLY_FENCE;
        }
        PipelineFeatures(bits)
    }

    /// Limits the validator checks programs against. Their workgroup memory is
    /// the opt-in limit ([`DeviceCaps::kernel_shared_memory_bytes`]): a kernel's
    /// workgroup buffers past 48 KiB live in dynamic shared memory. A lane's
    /// programs keep the static limit ([`DeviceCaps::max_shared_memory_per_block`]),
    /// which the lane checks itself.
    pub fn limits(&self) -> Limits {
        Limits {
            max_threads_per_workgroup: self.max_threads_per_block,
            max_workgroup_size: self.max_block_dims,
            max_shared_memory_bytes: self.kernel_shared_memory_bytes(),
            subgroup_size: self.warp_size,
        }
    }

    /// Most workgroup memory one kernel's workgroup may have: the opt-in limit
    /// (dynamic shared memory, 232,448 bytes on an H200), never less than the
    /// static one.
    pub fn kernel_shared_memory_bytes(&self) -> u32 {
        self.max_shared_memory_per_block_optin
            .max(self.max_shared_memory_per_block)
    }

    /// What lowering may use on this device.
    pub fn lowering_caps(&self) -> LoweringCaps {
        LoweringCaps {
            subgroup_ops: self.supports_subgroup_ops(),
            subgroup_size: self.warp_size,
        }
    }
}

/// A checked launch geometry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LaunchPlan {
    /// Blocks per axis.
    pub grid: [u32; 3],
    /// Threads per block per axis.
    pub block: [u32; 3],
    /// Total blocks.
    pub grid_blocks: u64,
    /// Total threads.
    pub total_threads: u64,
}

impl LaunchPlan {
    /// Check a grid of `workgroups` blocks of `workgroup_size` threads against the
    /// device. Every product is checked; overflow is an error, never a wrap.
    pub fn new(
        workgroups: [u32; 3],
        workgroup_size: [u32; 3],
        caps: &DeviceCaps,
    ) -> Result<LaunchPlan, BackendError> {
        let launch_error = |message: String| BackendError::Launch { message };
        for axis in 0..3 {
            let name = ["x", "y", "z"][axis];
            if workgroups[axis] == 0 {
                return Err(launch_error(format!(
                    "Fix: workgroups.{name} is 0; every axis of DispatchConfig::workgroups must be at least 1"
                )));
            }
            if workgroups[axis] > caps.max_grid_dims[axis] {
                return Err(launch_error(format!(
                    "Fix: workgroups.{name} = {} exceeds the device limit {}; split the dispatch or move work to another axis",
                    workgroups[axis], caps.max_grid_dims[axis]
                )));
            }
            if workgroup_size[axis] == 0 || workgroup_size[axis] > caps.max_block_dims[axis] {
                return Err(launch_error(format!(
                    "Fix: workgroup_size.{name} = {} must be between 1 and {} on this device",
                    workgroup_size[axis], caps.max_block_dims[axis]
                )));
            }
        }
        let block_threads = (workgroup_size[0] as u64)
            .checked_mul(workgroup_size[1] as u64)
            .and_then(|v| v.checked_mul(workgroup_size[2] as u64))
            .ok_or_else(|| launch_error("Fix: workgroup size product overflows".into()))?;
        if block_threads > caps.max_threads_per_block as u64 {
            return Err(launch_error(format!(
                "Fix: a workgroup of {:?} has {block_threads} threads, over the device limit {}; shrink the workgroup",
                workgroup_size, caps.max_threads_per_block
            )));
        }
        let grid_blocks = (workgroups[0] as u64)
            .checked_mul(workgroups[1] as u64)
            .and_then(|v| v.checked_mul(workgroups[2] as u64))
            .ok_or_else(|| {
                launch_error(format!(
                    "Fix: the grid {workgroups:?} has more blocks than fit in 64 bits; use fewer workgroups"
                ))
            })?;
        let total_threads = grid_blocks.checked_mul(block_threads).ok_or_else(|| {
            launch_error(format!(
                "Fix: the grid {workgroups:?} × workgroup {workgroup_size:?} has more threads than fit in 64 bits; use fewer workgroups"
            ))
        })?;
        Ok(LaunchPlan {
            grid: workgroups,
            block: workgroup_size,
            grid_blocks,
            total_threads,
        })
    }

    /// A one-line human description (the launch diagnostic).
    pub fn describe(&self) -> String {
        format!(
            "grid {:?} × block {:?} = {} blocks, {} threads",
            self.grid, self.block, self.grid_blocks, self.total_threads
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Locks out the acquire-only fence on a device or driver that cannot take it
    /// (a module of PTX ISA 8.6 fails to load on a driver before CUDA 12.8;
    /// `fence.acquire` needs sm_90) and its absence where both can: the feature
    /// is set for compute capability 9.0 with driver 12080 and later, and for
    /// neither 9.0 with 12070 nor 8.0 with 13000.
    #[test]
    fn the_acquire_only_fence_needs_sm_90_and_cuda_12_8() {
        let with = |compute_capability, driver_version| {
            DeviceCaps {
                compute_capability,
                driver_version,
                ..DeviceCaps::synthetic_h200()
            }
            .pipeline_features()
            .has(PipelineFeatures::ACQUIRE_ONLY_FENCE)
        };
        assert!(with((9, 0), 12_080));
        assert!(with((9, 0), 13_000));
        assert!(with((10, 0), 12_080));
        assert!(!with((9, 0), 12_070));
        assert!(!with((8, 0), 13_000));
    }

    /// Locks out wrapping launch arithmetic: products that exceed u32 (or the
    /// device) are errors with a Fix message, never wrapped small grids.
    #[test]
    fn launch_plan_checks_every_product() {
        let caps = DeviceCaps::synthetic_h200();
        let plan = LaunchPlan::new([4, 2, 1], [64, 2, 1], &caps).unwrap();
        assert_eq!(plan.grid_blocks, 8);
        assert_eq!(plan.total_threads, 8 * 128);
        assert!(plan.describe().contains("8 blocks"));

        // 2^31-1 × 65535 × 65535 blocks × 1024 threads overflows u64: must be an error.
        let huge = LaunchPlan::new([2_147_483_647, 65_535, 65_535], [1024, 1, 1], &caps);
        let message = huge.unwrap_err().to_string();
        assert!(message.starts_with("Fix:"), "{message}");
        assert!(message.contains("64 bits"), "{message}");

        for (workgroups, size, needle) in [
            ([0, 1, 1], [1, 1, 1], "workgroups.x is 0"),
            ([1, 70_000, 1], [1, 1, 1], "workgroups.y"),
            ([1, 1, 1], [2048, 1, 1], "workgroup_size.x"),
            ([1, 1, 1], [1024, 2, 1], "over the device limit"),
            ([1, 1, 1], [1, 1, 65], "workgroup_size.z"),
        ] {
            let message = LaunchPlan::new(workgroups, size, &caps)
                .unwrap_err()
                .to_string();
            assert!(message.starts_with("Fix:"), "{message}");
            assert!(message.contains(needle), "{message} lacks {needle}");
        }
    }

    /// Locks out kernels held to the static 48 KiB of workgroup memory (or a
    /// limit below it): an H200's validation limit is its opt-in 232,448 bytes
    /// (the reference's `Limits::h200`), its static 49,152 bytes stays in the caps
    /// for lanes, and a device whose opt-in attribute reads lower than its static
    /// limit keeps the static one.
    #[test]
    fn kernels_get_the_opt_in_workgroup_memory() {
        let h200 = DeviceCaps::synthetic_h200();
        assert_eq!(h200.limits().max_shared_memory_bytes, 232_448);
        assert_eq!(h200.limits(), Limits::h200());
        assert_eq!(h200.max_shared_memory_per_block, 49_152);
        let no_opt_in = DeviceCaps {
            max_shared_memory_per_block_optin: 0,
            ..h200
        };
        assert_eq!(no_opt_in.limits().max_shared_memory_bytes, 49_152);
    }

    /// Locks out feature flags that do not follow the device: a change in compute
    /// capability must change the flags that take part in cache identity.
    #[test]
    fn pipeline_features_follow_compute_capability() {
        let h200 = DeviceCaps::synthetic_h200();
        let f = h200.pipeline_features();
        assert!(f.has(PipelineFeatures::SUBGROUP_OPS));
        assert!(f.has(PipelineFeatures::WARP_REDUX));
        assert!(f.has(PipelineFeatures::GRID_SYNC));
        let volta = DeviceCaps {
            compute_capability: (7, 0),
            cooperative_launch: false,
            ..h200.clone()
        };
        assert_ne!(volta.pipeline_features(), f);
        assert!(!volta.pipeline_features().has(PipelineFeatures::WARP_REDUX));
        assert_eq!(h200.ptx_target_sm(), 90);
        assert!(h200.supports_bf16() && h200.supports_f16() && h200.supports_tensor_cores());
        assert_eq!(h200.limits().max_threads_per_workgroup, 1024);
    }
}
