//! From a program to a launchable kernel: validation, lowering, the PTX key, the
//! PTX and module caches, and the binding plan (§4.2).
//!
//! [`Kernel`] is the handle a caller keeps: dispatching through it skips every
//! lookup below (its module, function, binding plan and launch plans are inside).
//! Dispatching a [`Program`] runs `resolve_kernel`, whose warm path is a few
//! memo reads and two hash lookups, charged to the probe's `prepare`, `ptx`,
//! `modkey` and `resolve` phases.

use std::sync::{Arc, Mutex};

use smallvec::SmallVec;

use crate::codegen::{self, ENTRY_NAME, GRID_BARRIER_SYMBOL};
use crate::config::DispatchConfig;
use crate::ir::{self, Node, Program};
use crate::lower;
use crate::probe::{self, Phase, SubPhase};

use super::caps::LaunchPlan;
use super::driver::LoadedModule;
use super::plan::{binding_slots, ParamSlot};
use super::{BackendError, BackendInner, CudaBackend, ModuleKey, PtxKey};

/// A compiled, loaded program. Cheap to clone; valid only with the backend that
/// compiled it (using it with another one is an `Err`).
#[derive(Clone)]
pub struct Kernel {
    pub(crate) inner: Arc<KernelInner>,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel")
            .field("program", &self.inner.name)
            .field("module_key", &self.inner.module_key)
            .field("ptx_bytes", &self.inner.ptx.len())
            .finish()
    }
}

pub(crate) struct KernelInner {
    pub(crate) backend_id: u64,
    pub(crate) name: String,
    pub(crate) program: Program,
    pub(crate) ptx: Arc<str>,
    pub(crate) module_key: ModuleKey,
    pub(crate) module: LoadedModule,
    pub(crate) slots: SmallVec<[ParamSlot; 16]>,
    /// Indices into `slots` of the output (ReadWrite/WriteOnly) buffers.
    pub(crate) outputs: SmallVec<[u16; 16]>,
    pub(crate) workgroup_size: [u32; 3],
    /// Grid sync: the barrier counter's address and the co-residency limit.
    pub(crate) grid_barrier: Option<u64>,
    pub(crate) max_coresident_blocks: u64,
    /// Held from launch to synchronize by a grid-sync dispatch: the barrier counter
    /// is module-global, so two such dispatches of one module must not overlap.
    pub(crate) barrier_lease: Mutex<()>,
    /// The plan cache for this kernel: launch plans by grid shape.
    pub(crate) launch_plans: Mutex<SmallVec<[LaunchPlan; 4]>>,
}

impl Kernel {
    /// The program this kernel was compiled from.
    pub fn program(&self) -> &Program {
        &self.inner.program
    }

    /// The PTX source that was loaded.
    pub fn ptx(&self) -> &str {
        &self.inner.ptx
    }

    /// The module-cache key.
    pub fn module_key(&self) -> ModuleKey {
        self.inner.module_key
    }

    /// Whether dispatches launch cooperatively (the program uses grid sync).
    pub fn uses_grid_sync(&self) -> bool {
        self.inner.grid_barrier.is_some()
    }
}

fn contains_grid_sync(block: &[Node]) -> bool {
    block.iter().any(|n| match n {
        Node::GridSync => true,
        Node::If {
            then_body,
            else_body,
            ..
        } => contains_grid_sync(then_body) || contains_grid_sync(else_body),
        Node::Loop { body, .. } => contains_grid_sync(body),
        _ => false,
    })
}

/// Mixed into the PTX key's policy digest: the backend's PTX is the result-ABI
/// variant ([`codegen::program_to_ptx_with_results`]), never the plain one.
const RESULT_ABI_POLICY_BIT: u64 = 1 << 40;

impl CudaBackend {
    /// Validate, lower, emit and load `program` (each step cached) and return a
    /// handle whose dispatches skip all lookups. Only `config.codegen` matters here.
    pub fn compile(
        &self,
        program: &Program,
        config: &DispatchConfig,
    ) -> Result<Kernel, BackendError> {
        self.inner.check_alive()?;
        let mark = probe::mark();
        let (kernel, _) = self.inner.resolve_kernel(program, config, mark)?;
        Ok(Kernel { inner: kernel })
    }
}

impl BackendInner {
    /// The program path: validation (prepare) → lowering, key and PTX (ptx) →
    /// module key (modkey) → module lookup or load (resolve). Returns the probe mark
    /// at its end so the dispatch's next phase starts there (one clock read per
    /// phase boundary).
    pub(crate) fn resolve_kernel(
        &self,
        program: &Program,
        config: &DispatchConfig,
        mark: Option<std::time::Instant>,
    ) -> Result<(Arc<KernelInner>, Option<std::time::Instant>), BackendError> {
        // prepare: validation, before any other walk of the program (the digest
        // included), so a program too deep or too large for any walk gets its `Fix:`
        // error instead of reaching one. The verdict is memoised in the program, so
        // this is O(1) for a program (or any clone) seen before; the validation
        // counter records whether a walk happened.
        let walks_before = ir::validate::walks_on_current_thread();
        let validated = ir::validate(program, &self.limits);
        if ir::validate::walks_on_current_thread() == walks_before {
            self.validation.counter.hit();
        } else {
            self.validation.counter.miss();
        }
        let valid = validated.map_err(|e| invalid(program, &e))?;
        let program = valid.program();
        let mark = probe::charge_and_mark(Phase::Prepare, mark);

        // ptx: lowering (memoised in the program), the PTX key, the PTX cache.
        // Sub-phases are charged only when a whole-program walk really happened
        // (the per-thread walk counters say so), so a cache hit reads 0. They start
        // at the `ptx` phase's own mark and read the clock only after a walk, so the
        // warm path pays no extra clock read for them.
        let walks_before = mark.map(|_| lower::walks_on_current_thread());
        let lowered = lower::lower_workgroup_reductions(program, &self.lowering);
        let mut digest_mark = mark;
        if walks_before.is_some_and(|before| lower::walks_on_current_thread() != before) {
            let now = std::time::Instant::now();
            if let Some(start) = mark {
                probe::add_sub_phase_ns(SubPhase::PtxVsa, nanos_between(start, now));
            }
            digest_mark = Some(now);
        }
        let digests_before = mark.map(|_| ir::computations_on_current_thread());
        let lowered_digest = lowered.digest();
        if digests_before.is_some_and(|before| ir::computations_on_current_thread() != before) {
            probe::charge_sub(SubPhase::PtxDigest, digest_mark);
        }
        let key = PtxKey {
            program: lowered_digest,
            // Every backend kernel carries the result ABI (readback module docs).
            policy: config.codegen.policy_digest() ^ RESULT_ABI_POLICY_BIT,
            sm: self.caps.ptx_target_sm(),
            subgroup_size: self.caps.warp_size,
            features: self.features,
        };
        let ptx = match self.ptx.get(&key) {
            Some(ptx) => {
                probe::note_ptx_cache(true);
                ptx
            }
            None => {
                probe::note_ptx_cache(false);
                super::readback::check_result_abi_fits(
                    &program.display_name(),
                    lowered.global_buffers().len(),
                )
                .map_err(BackendError::bad_input)?;
                let text = codegen::program_to_ptx_with_results(
                    &lowered,
                    &config.codegen,
                    key.sm,
                    key.subgroup_size,
                )
                .map_err(|error| BackendError::Codegen {
                    program: program.display_name(),
                    error,
                })?;
                self.ptx.insert(key, Arc::from(text))
            }
        };
        let mark = probe::charge_and_mark(Phase::Ptx, mark);

        // modkey
        let module_key = key.module_key();
        let mark = probe::charge_and_mark(Phase::Modkey, mark);

        // resolve: module cache (one entry per PTX key), loading on a miss.
        let kernel = match self.kernels.get(&module_key) {
            Some(kernel) => kernel,
            None => {
                self.bind()?;
                let built = self.build_kernel(program, &lowered, ptx, module_key)?;
                self.kernels.insert(module_key, Arc::new(built))
            }
        };
        let mark = probe::charge_and_mark(Phase::Resolve, mark);
        Ok((kernel, mark))
    }

    fn build_kernel(
        &self,
        program: &Program,
        lowered: &Program,
        ptx: Arc<str>,
        module_key: ModuleKey,
    ) -> Result<KernelInner, BackendError> {
        let grid_sync = contains_grid_sync(lowered.entry());
        let module = LoadedModule::load(&ptx, ENTRY_NAME, grid_sync.then_some(GRID_BARRIER_SYMBOL))
            .map_err(|error| BackendError::ModuleLoad {
                program: program.display_name(),
                sm: self.caps.ptx_target_sm(),
                error,
            })?;
        let (slots, outputs) = binding_slots(lowered);
        let workgroup_size = lowered.workgroup_size();
        let mut max_coresident_blocks = u64::MAX;
        let grid_barrier = match (grid_sync, module.global) {
            (false, _) => None,
            (true, Some((address, _))) => {
                if !self.caps.supports_grid_sync() {
                    return Err(BackendError::Launch {
                        message: format!(
                            "Fix: {} uses grid_sync but this device has no cooperative launch; remove grid_sync \
                             and split the work into separate dispatches",
                            program.display_name()
                        ),
                    });
                }
                let threads = workgroup_size.iter().map(|&v| v as u64).product::<u64>() as u32;
                let per_sm = module.max_active_blocks_per_sm(threads, 0).map_err(|e| {
                    BackendError::driver("querying occupancy for a grid-sync kernel", e)
                })?;
                max_coresident_blocks = per_sm as u64 * self.caps.sm_count as u64;
                Some(address)
            }
            (true, None) => {
                return Err(BackendError::ModuleLoad {
                    program: program.display_name(),
                    sm: self.caps.ptx_target_sm(),
                    error: super::driver::DriverError::not_found(
                        "cuModuleGetGlobal_v2 (grid barrier symbol)",
                    ),
                })
            }
        };
        tracing::debug!(program = %program.display_name(), ptx_bytes = ptx.len(), "loaded module");
        Ok(KernelInner {
            backend_id: self.id,
            name: program.display_name(),
            program: program.clone(),
            ptx,
            module_key,
            module,
            slots,
            outputs,
            workgroup_size,
            grid_barrier,
            max_coresident_blocks,
            barrier_lease: Mutex::new(()),
            launch_plans: Mutex::new(SmallVec::new()),
        })
    }

    /// The launch plan of `kernel` for `workgroups`, from the kernel's plan cache.
    pub(crate) fn launch_plan(
        &self,
        kernel: &KernelInner,
        workgroups: [u32; 3],
    ) -> Result<LaunchPlan, BackendError> {
        {
            let plans = kernel
                .launch_plans
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if let Some(plan) = plans.iter().find(|p| p.grid == workgroups) {
                self.plan_counter.hit();
                return Ok(*plan);
            }
        }
        self.plan_counter.miss();
        let plan = LaunchPlan::new(workgroups, kernel.workgroup_size, &self.caps)?;
        let mut plans = kernel
            .launch_plans
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if plans.len() >= 8 {
            plans.remove(0);
        }
        plans.push(plan);
        Ok(plan)
    }
}

fn nanos_between(start: std::time::Instant, end: std::time::Instant) -> u64 {
    u64::try_from(end.saturating_duration_since(start).as_nanos()).unwrap_or(u64::MAX)
}

fn invalid(program: &Program, e: &ir::ValidationError) -> BackendError {
    BackendError::InvalidProgram {
        program: program.display_name(),
        error: e.clone(),
    }
}
