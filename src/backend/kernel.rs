//! From a program to a launchable kernel: validation, lowering, the PTX key, the
//! PTX and module caches, and the binding plan.
//!
//! [`Kernel`] is the handle a caller keeps: dispatching through it skips every
//! lookup below (its module, function, binding plan and launch plans are inside).
//! Dispatching a [`Program`] runs `resolve_kernel`, whose warm path is a few
//! memo reads and two hash lookups, charged to the probe's `prepare`, `ptx`,
//! `modkey` and `resolve` phases.
//!
//! [`CudaBackend::compile_batch`] compiles many programs with one driver JIT call
//! (`cuModuleLoadData`) per PTX module ([`PtxModuleBuilder`]). On the H200 the JIT of
//! a one-program module cost about 44 ms once the writer hid constants from it, and
//! loads from several threads did not overlap (measured: 2,500 differential programs
//! did not finish in 110 s). A batch pays the per-call part once per module (and
//! holds one module instead of one per kernel); the compile work itself is per
//! kernel (ptxas on the build machine: 64 generated kernels took 9.1 s as one module,
//! 10.6 s as 64 modules).
//! Each batch kernel is entered into the module cache under its own key (what
//! [`CudaBackend::compile`] of the same program would use), so a later `compile` or
//! program-path dispatch of it finds the loaded kernel; the PTX cache is not filled
//! (its values are one-program modules), so that first lookup emits the program's
//! PTX text once (a CPU walk, no JIT) before it finds the kernel.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use smallvec::SmallVec;

use crate::codegen::{self, CodegenError, PtxModuleBuilder, GRID_BARRIER_SYMBOL};
use crate::config::{AcquireFence, CodegenOptions, DispatchConfig};
use crate::ir::{self, Node, Program, ScalarDecl};
use crate::lower;
use crate::probe::{self, Phase, SubPhase};

use super::caps::{LaunchPlan, PipelineFeatures};
use super::driver::LoadedModule;
use super::plan::{binding_slots, ParamSlot};
use super::{BackendError, BackendInner, CudaBackend, ModuleKey, PtxKey};

/// A compiled program, ready to dispatch: on CUDA a loaded module with its binding
/// plan and launch plans (dispatching through it skips every cache lookup), on the
/// reference interpreter the validated program. Cheap to clone; valid only with the
/// backend that compiled it (using it with another one is an `Err`).
#[derive(Clone)]
pub struct Kernel {
    pub(in crate::backend) kind: KernelKind,
}

/// Which backend compiled a [`Kernel`].
#[derive(Clone)]
pub(in crate::backend) enum KernelKind {
    Cuda(Arc<KernelInner>),
    Reference(Arc<super::reference_backend::ReferenceKernel>),
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            KernelKind::Cuda(inner) => f
                .debug_struct("Kernel")
                .field("program", &inner.name)
                .field("module_key", &inner.module_key)
                .field("ptx_bytes", &inner.ptx.len())
                .finish(),
            KernelKind::Reference(inner) => f
                .debug_struct("Kernel")
                .field("program", &inner.name)
                .field("backend", &"reference")
                .finish(),
        }
    }
}

pub(in crate::backend) struct KernelInner {
    pub(in crate::backend) backend_id: u64,
    pub(in crate::backend) name: String,
    pub(in crate::backend) program: Program,
    /// The code generation options it was compiled with (a lane emits its body again
    /// with them).
    pub(in crate::backend) codegen: CodegenOptions,
    pub(in crate::backend) ptx: Arc<str>,
    pub(in crate::backend) module_key: ModuleKey,
    pub(in crate::backend) module: LoadedModule,
    pub(in crate::backend) slots: SmallVec<[ParamSlot; 16]>,
    /// Indices into `slots` of the output (ReadWrite/WriteOnly) buffers.
    pub(in crate::backend) outputs: SmallVec<[u16; 16]>,
    pub(in crate::backend) workgroup_size: [u32; 3],
    /// Grid sync: the barrier counter's address and the co-residency limit.
    pub(in crate::backend) grid_barrier: Option<u64>,
    pub(in crate::backend) max_coresident_blocks: u64,
    /// Held from launch to synchronize by a grid-sync dispatch: the barrier counter
    /// is module-global, so two such dispatches of one module must not overlap.
    pub(in crate::backend) barrier_lease: Mutex<()>,
    /// Whether the last audit of the barrier word passed and nothing launched
    /// since (the word's arrival bits are then 0, so the next launch needs no
    /// reset); read and written only by the holder of `barrier_lease`. `false`
    /// before the first audit, after a failed one and while a launch is in
    /// flight.
    pub(in crate::backend) barrier_settled: AtomicBool,
    /// The plan cache for this kernel: launch plans by grid shape.
    pub(in crate::backend) launch_plans: Mutex<SmallVec<[LaunchPlan; 4]>>,
}

impl Kernel {
    pub(in crate::backend) fn cuda(inner: Arc<KernelInner>) -> Kernel {
        Kernel {
            kind: KernelKind::Cuda(inner),
        }
    }

    /// The program this kernel was compiled from.
    pub fn program(&self) -> &Program {
        match &self.kind {
            KernelKind::Cuda(inner) => &inner.program,
            KernelKind::Reference(inner) => inner.program.program(),
        }
    }

    /// The program's scalar parameters in declaration order: the kernel's scalar
    /// ABI (parameter `i` of this list is the kernel parameter after the buffers'
    /// and the result ABI's, documented in `codegen::ptx`) and the positions of a
    /// request's [`ScalarValues`](super::ScalarValues).
    pub fn scalars(&self) -> &[ScalarDecl] {
        self.program().scalars()
    }

    /// The program's diagnostic name (what errors and probe lines call it).
    pub fn name(&self) -> &str {
        match &self.kind {
            KernelKind::Cuda(inner) => &inner.name,
            KernelKind::Reference(inner) => &inner.name,
        }
    }

    /// The PTX source that was loaded (for a kernel of
    /// [`CudaBackend::compile_batch`], the whole module it shares with others);
    /// `None` on the reference interpreter, which runs the program itself.
    pub fn ptx(&self) -> Option<&str> {
        match &self.kind {
            KernelKind::Cuda(inner) => Some(&inner.ptx),
            KernelKind::Reference(_) => None,
        }
    }

    /// Whether `self` and `other` are entries of one loaded module (kernels of one
    /// [`CudaBackend::compile_batch`] call share one; each keeps it loaded).
    pub fn shares_module_with(&self, other: &Kernel) -> bool {
        match (&self.kind, &other.kind) {
            (KernelKind::Cuda(a), KernelKind::Cuda(b)) => a.module.shares_module_with(&b.module),
            _ => false,
        }
    }

    /// The module-cache key (`None` on the reference interpreter).
    pub fn module_key(&self) -> Option<ModuleKey> {
        match &self.kind {
            KernelKind::Cuda(inner) => Some(inner.module_key),
            KernelKind::Reference(_) => None,
        }
    }

    /// Most workgroups a dispatch of this grid-sync kernel may have: what the
    /// device holds at once, as the driver's occupancy answer for its threads
    /// and workgroup memory times the multiprocessors (a larger grid is
    /// [`GridTooLargeForGridSync`](crate::backend::BackendError::GridTooLargeForGridSync));
    /// `None` for a kernel without
    /// grid sync.
    pub fn max_coresident_workgroups(&self) -> Option<u64> {
        if !self.uses_grid_sync() {
            return None;
        }
        Some(match &self.kind {
            KernelKind::Cuda(inner) => inner.max_coresident_blocks,
            KernelKind::Reference(inner) => inner.max_coresident_blocks,
        })
    }

    /// Whether the program uses grid sync (CUDA launches it cooperatively).
    pub fn uses_grid_sync(&self) -> bool {
        match &self.kind {
            KernelKind::Cuda(inner) => inner.grid_barrier.is_some(),
            KernelKind::Reference(inner) => inner.grid_sync,
        }
    }

    /// The kernel's global buffers in binding order.
    pub(in crate::backend) fn slots(&self) -> &[ParamSlot] {
        match &self.kind {
            KernelKind::Cuda(inner) => &inner.slots,
            KernelKind::Reference(inner) => &inner.slots,
        }
    }

    /// The binding slot of the global buffer named `name`.
    pub(in crate::backend) fn binding_named(&self, name: &str) -> Option<u32> {
        self.slots()
            .iter()
            .find(|slot| slot.name.as_ref() == name)
            .map(|slot| slot.binding)
    }
}

/// Whether `block` reaches a grid sync anywhere. Iterative and visiting each shared
/// block once (`ir::any_node`), so no program depth or sharing can overflow the
/// caller's stack or blow up.
pub(in crate::backend) fn contains_grid_sync(block: &[Node]) -> bool {
    crate::ir::any_node(block, |node| matches!(node, Node::GridSync))
}

/// Mixed into the PTX key's policy digest: the backend's PTX is the result-ABI
/// variant ([`codegen::program_to_ptx_with_results`]), never the plain one.
const RESULT_ABI_POLICY_BIT: u64 = 1 << 40;

/// Most programs one [`CudaBackend::compile_batch`] call takes. Each module it loads
/// is also bounded, by [`codegen::ptx::MAX_PTX_BYTES`] of PTX (a batch past that is
/// split into several modules).
pub const MAX_BATCH_PROGRAMS: usize = 1024;

impl CudaBackend {
    /// Most workgroups a dispatch of the grid-sync `kernel` may have now: its
    /// [`Kernel::max_coresident_workgroups`] less one multiprocessor's worth for
    /// each block of this context's running lanes (a lane's block may hold its
    /// multiprocessor whole, and a cooperative grid waits until every workgroup is
    /// resident); a larger grid is
    /// [`GridTooLargeForGridSync`](crate::backend::BackendError::GridTooLargeForGridSync)
    /// while they run. `None` for a kernel without grid sync or of another backend.
    pub fn coresident_workgroups(&self, kernel: &Kernel) -> Option<u64> {
        let inner = self.inner.cuda_kernel(kernel).ok()?;
        inner.grid_barrier?;
        Some(self.inner.coresident_now(inner.max_coresident_blocks))
    }

    /// Validate, lower, emit and load `program` (each step cached) and return a
    /// handle whose dispatches skip all lookups. Only `config.codegen` matters here.
    pub fn compile(
        &self,
        program: &Program,
        config: &DispatchConfig,
    ) -> Result<Kernel, BackendError> {
        self.inner.check_alive()?;
        let mark = probe::mark();
        let (kernel, _) = self.inner.resolve_kernel(program, &config.codegen, mark)?;
        Ok(Kernel::cuda(kernel))
    }
}

impl CudaBackend {
    /// [`CudaBackend::compile`] for many programs at once, with one driver JIT
    /// (`cuModuleLoadData`) per PTX module instead of one per program: the
    /// programs not compiled before become the kernels of one module (several, if
    /// their PTX passes [`codegen::ptx::MAX_PTX_BYTES`]). Returns one kernel per
    /// program, in order; a program given twice, or compiled before, gets the same
    /// kernel [`CudaBackend::compile`] would return. Each kernel is entered into the
    /// module cache under its own key (module docs) and keeps its module loaded.
    /// Only `config.codegen` matters here.
    ///
    /// Errors: more than [`MAX_BATCH_PROGRAMS`] programs, or any program that
    /// `compile` would refuse, with the error naming that program's index in
    /// `programs`. Every program is validated before anything is loaded, so an
    /// invalid one loads nothing; a code generation or driver error can come after
    /// earlier modules of a split batch were loaded (their kernels stay cached).
    pub fn compile_batch<P: Borrow<Program>>(
        &self,
        programs: &[P],
        config: &DispatchConfig,
    ) -> Result<Vec<Kernel>, BackendError> {
        check_batch_size(programs.len())?;
        self.inner.check_alive()?;
        let kernels = self.inner.compile_batch(programs, &config.codegen)?;
        Ok(kernels.into_iter().map(Kernel::cuda).collect())
    }
}

/// The `Fix:` error for a batch of more than [`MAX_BATCH_PROGRAMS`] programs.
fn check_batch_size(programs: usize) -> Result<(), BackendError> {
    if programs > MAX_BATCH_PROGRAMS {
        return Err(BackendError::bad_input(format!(
            "Fix: pass at most {MAX_BATCH_PROGRAMS} programs to compile_batch (got {programs}); \
             split them over several calls"
        )));
    }
    Ok(())
}

/// `error` of the program at `index` of a batch, saying which one it is.
fn in_batch(index: usize, error: BackendError) -> BackendError {
    let name = |program: String| format!("program {index} of the batch, {program}");
    let note = |message: String| format!("{message} (program {index} of the batch)");
    match error {
        BackendError::InvalidProgram { program, error } => BackendError::InvalidProgram {
            program: name(program),
            error,
        },
        BackendError::Codegen { program, error } => BackendError::Codegen {
            program: name(program),
            error,
        },
        BackendError::ModuleLoad { program, sm, error } => BackendError::ModuleLoad {
            program: name(program),
            sm,
            error,
        },
        BackendError::BadInput { message } => BackendError::BadInput {
            message: note(message),
        },
        BackendError::Launch { message } => BackendError::Launch {
            message: note(message),
        },
        other => other,
    }
}

/// A batch program that is not in the module cache yet.
struct BatchItem {
    /// Its index in the caller's batch.
    index: usize,
    program: Program,
    lowered: Program,
    module_key: ModuleKey,
}

impl BackendInner {
    fn compile_batch<P: Borrow<Program>>(
        &self,
        programs: &[P],
        options: &CodegenOptions,
    ) -> Result<Vec<Arc<KernelInner>>, BackendError> {
        let options = &self.device_options(options);
        // Validate, lower and key every program first: an invalid one refuses the
        // batch before anything is loaded.
        let mut kernels: Vec<Option<Arc<KernelInner>>> = vec![None; programs.len()];
        let mut to_load: Vec<BatchItem> = Vec::new();
        let mut first_of_key: HashMap<ModuleKey, usize> = HashMap::new();
        let mut repeats: Vec<(usize, usize)> = Vec::new();
        for (index, program) in programs.iter().enumerate() {
            let valid = self
                .validate_counted(program.borrow())
                .map_err(|e| in_batch(index, e))?;
            let program = valid.program();
            let lowered = lower::lower_workgroup_reductions(program, &self.lowering);
            let module_key = self.ptx_key(lowered.digest(), options).module_key();
            if let Some(kernel) = self.kernels.get(&module_key) {
                kernels[index] = Some(kernel);
            } else if let Some(&first) = first_of_key.get(&module_key) {
                repeats.push((index, first));
            } else {
                check_lowered(program, &lowered, &self.limits).map_err(|e| in_batch(index, e))?;
                super::readback::check_result_abi_fits(&program.display_name(), &lowered)
                    .map_err(|message| in_batch(index, BackendError::bad_input(message)))?;
                first_of_key.insert(module_key, index);
                to_load.push(BatchItem {
                    index,
                    program: program.clone(),
                    lowered,
                    module_key,
                });
            }
        }

        // Emit into as few modules as the PTX size limit allows, loading each when
        // it is full.
        let (sm, subgroup_size) = (self.caps.ptx_target_sm(), self.caps.warp_size);
        let empty = || PtxModuleBuilder::with_results(options, sm, subgroup_size);
        let mut module = empty();
        let mut entries = Vec::new();
        for item in &to_load {
            let pushed = match module.push(&item.lowered) {
                Err(CodegenError::ModuleFull { .. }) if !module.is_empty() => {
                    let full = std::mem::replace(&mut module, empty());
                    self.load_batch_module(
                        full,
                        std::mem::take(&mut entries),
                        options,
                        &mut kernels,
                    )?;
                    module.push(&item.lowered)
                }
                pushed => pushed,
            };
            let entry = pushed.map_err(|error| {
                let program = item.program.display_name();
                in_batch(item.index, BackendError::Codegen { program, error })
            })?;
            entries.push((item, entry));
        }
        if !module.is_empty() {
            self.load_batch_module(module, entries, options, &mut kernels)?;
        }
        for (index, first) in repeats {
            kernels[index] = kernels[first].clone();
        }
        kernels
            .into_iter()
            .map(|kernel| {
                kernel.ok_or_else(|| BackendError::Internal {
                    message: "compile_batch left a program without a kernel".into(),
                })
            })
            .collect()
    }

    /// Load one batch module (one driver JIT) and enter each of its kernels into the
    /// module cache (the first insert of a key wins, as in `resolve_kernel`).
    fn load_batch_module(
        &self,
        module: PtxModuleBuilder,
        entries: Vec<(&BatchItem, codegen::ModuleEntry)>,
        options: &CodegenOptions,
        kernels: &mut [Option<Arc<KernelInner>>],
    ) -> Result<(), BackendError> {
        let ptx: Arc<str> = Arc::from(module.finish());
        let names: Vec<(&str, Option<&str>)> = entries
            .iter()
            .map(|(_, entry)| (entry.entry.as_str(), entry.grid_barrier.as_deref()))
            .collect();
        self.bind()?;
        let loaded = LoadedModule::load_entries(&ptx, &names).map_err(|error| {
            let (first, last) = match (entries.first(), entries.last()) {
                (Some((first, _)), Some((last, _))) => (first.index, last.index),
                _ => (0, 0),
            };
            let program = if error.is_module_load_refused_beside_a_lane() {
                format!("the batch of programs {first} to {last}")
            } else {
                format!(
                    "the module of batch programs {first} to {last} ({} kernels; the driver does \
                     not say which one it refused: compile them one by one to find it)",
                    entries.len()
                )
            };
            BackendError::module_load(program, self.caps.ptx_target_sm(), error)
        })?;
        for ((item, _), module) in entries.iter().zip(loaded) {
            let built = self
                .kernel_from_module(
                    &item.program,
                    &item.lowered,
                    options,
                    Arc::clone(&ptx),
                    item.module_key,
                    module,
                )
                .map_err(|e| in_batch(item.index, e))?;
            kernels[item.index] = Some(self.kernels.insert(item.module_key, Arc::new(built)));
        }
        Ok(())
    }
}

impl BackendInner {
    /// The program path: validation (prepare) → lowering, key and PTX (ptx) →
    /// module key (modkey) → module lookup or load (resolve). Returns the probe mark
    /// at its end so the dispatch's next phase starts there (one clock read per
    /// phase boundary).
    pub(in crate::backend) fn resolve_kernel(
        &self,
        program: &Program,
        options: &CodegenOptions,
        mark: Option<std::time::Instant>,
    ) -> Result<(Arc<KernelInner>, Option<std::time::Instant>), BackendError> {
        let options = &self.device_options(options);
        // prepare: validation, before any other walk of the program.
        let valid = self.validate_counted(program)?;
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
        let key = self.ptx_key(lowered_digest, options);
        let ptx = match self.ptx.get(&key) {
            Some(ptx) => {
                probe::note_ptx_cache(true);
                ptx
            }
            None => {
                probe::note_ptx_cache(false);
                check_lowered(program, &lowered, &self.limits)?;
                super::readback::check_result_abi_fits(&program.display_name(), &lowered)
                    .map_err(BackendError::bad_input)?;
                let text = codegen::program_to_ptx_with_results(
                    &lowered,
                    options,
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
                let built = self.build_kernel(program, &lowered, options, ptx, module_key)?;
                self.kernels.insert(module_key, Arc::new(built))
            }
        };
        let mark = probe::charge_and_mark(Phase::Resolve, mark);
        Ok((kernel, mark))
    }

    /// Validation against the device's limits, before any other walk (the digest
    /// included), so a program too deep or too large for any walk gets its `Fix:`
    /// error instead of reaching one. The verdict is memoised in the program, so this
    /// is O(1) for a program (or any clone) seen before; the validation counter
    /// records whether a walk happened.
    fn validate_counted(&self, program: &Program) -> Result<ir::ValidProgram, BackendError> {
        let walks_before = ir::validate::walks_on_current_thread();
        let validated = ir::validate(program, &self.limits);
        if ir::validate::walks_on_current_thread() == walks_before {
            self.validation.counter.hit();
        } else {
            self.validation.counter.miss();
        }
        validated.map_err(|e| invalid(program, &e))
    }

    /// `options` as this device compiles them: the acquire-only fence after an
    /// acquire load where the device and driver take it
    /// ([`PipelineFeatures::ACQUIRE_ONLY_FENCE`]), the acquire-release fence
    /// elsewhere, whichever the request named.
    fn device_options(&self, options: &CodegenOptions) -> CodegenOptions {
        options.with_acquire_fence(if self.features.has(PipelineFeatures::ACQUIRE_ONLY_FENCE) {
            AcquireFence::AcquireOnly
        } else {
            AcquireFence::AcquireRelease
        })
    }

    /// The PTX key of a lowered program (by its digest) under `config`'s codegen
    /// options, on this device.
    fn ptx_key(&self, lowered_digest: ir::Digest, options: &CodegenOptions) -> PtxKey {
        PtxKey {
            program: lowered_digest,
            // Every backend kernel carries the result ABI (readback module docs).
            policy: options.policy_digest() ^ RESULT_ABI_POLICY_BIT,
            sm: self.caps.ptx_target_sm(),
            subgroup_size: self.caps.warp_size,
            features: self.features,
        }
    }

    /// `kernel` again in a module of its own, with a grid-barrier word of its
    /// own: what a dispatch graph records a grid-sync step over. The shared
    /// kernel's barrier word is module-global and leased by each eager
    /// dispatch for its whole run, which a replay cannot do; the private
    /// instance's word belongs to one graph, whose replays the driver runs one
    /// after another, each leaving it as it found it but for the phase bit
    /// (see `graph`'s module docs). Loading
    /// the PTX again reuses the driver's JIT cache (0.04 ms on the H200 against
    /// 117 ms for a first load).
    pub(in crate::backend) fn private_instance(
        &self,
        kernel: &KernelInner,
    ) -> Result<KernelInner, BackendError> {
        let lowered = lower::lower_workgroup_reductions(&kernel.program, &self.lowering);
        self.bind()?;
        self.build_kernel(
            &kernel.program,
            &lowered,
            &kernel.codegen,
            Arc::clone(&kernel.ptx),
            kernel.module_key,
        )
    }

    fn build_kernel(
        &self,
        program: &Program,
        lowered: &Program,
        options: &CodegenOptions,
        ptx: Arc<str>,
        module_key: ModuleKey,
    ) -> Result<KernelInner, BackendError> {
        let grid_sync = contains_grid_sync(lowered.entry());
        let entry = codegen::entry_symbol(lowered);
        let module = LoadedModule::load(&ptx, &entry, grid_sync.then_some(GRID_BARRIER_SYMBOL))
            .map_err(|error| {
                BackendError::module_load(program.display_name(), self.caps.ptx_target_sm(), error)
            })?;
        self.kernel_from_module(program, lowered, options, ptx, module_key, module)
    }

    /// The kernel of `program` (lowered to `lowered`) whose entry `module` is: its
    /// binding plan, its dynamic shared memory (the one place it is computed, from
    /// the lowered program the PTX was written from: the function is opted in here
    /// and every launch passes it), and for a grid-sync program the barrier word
    /// and the co-residency limit.
    fn kernel_from_module(
        &self,
        program: &Program,
        lowered: &Program,
        options: &CodegenOptions,
        ptx: Arc<str>,
        module_key: ModuleKey,
        mut module: LoadedModule,
    ) -> Result<KernelInner, BackendError> {
        let dynamic_shared = codegen::ptx::dynamic_shared_bytes(lowered);
        module.use_dynamic_shared(dynamic_shared).map_err(|error| {
            BackendError::module_load(program.display_name(), self.caps.ptx_target_sm(), error)
        })?;
        let grid_sync = contains_grid_sync(lowered.entry());
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
                let per_sm = module
                    .max_active_blocks_per_sm(threads, dynamic_shared as usize)
                    .map_err(|e| {
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
            codegen: *options,
            ptx,
            module_key,
            module,
            slots,
            outputs,
            workgroup_size,
            grid_barrier,
            max_coresident_blocks,
            barrier_lease: Mutex::new(()),
            barrier_settled: AtomicBool::new(false),
            launch_plans: Mutex::new(SmallVec::new()),
        })
    }

    /// Of `max_coresident` workgroups of a grid-sync kernel, those the device holds at
    /// once now, beside the blocks of this context's running lanes
    /// (`dispatch::coresident_beside_lanes`).
    pub(in crate::backend) fn coresident_now(&self, max_coresident: u64) -> u64 {
        super::dispatch::coresident_beside_lanes(
            max_coresident,
            self.caps.sm_count,
            super::driver::resident_blocks(&self.context),
        )
    }

    /// The launch plan of `kernel` for `workgroups`, from the kernel's plan cache.
    pub(in crate::backend) fn launch_plan(
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

/// The validator's verdict on `lowered`, the lowering of the validated `program`,
/// against `limits`: lowering adds workgroup buffers (a reduction's scratch) that the
/// program's own check did not count, and a program just under the workgroup-memory
/// limit can pass it with them (the driver would refuse the kernel, the reference run
/// it). Both backends refuse it at `compile` with this error. Nothing to check when
/// lowering changed nothing.
pub(in crate::backend) fn check_lowered(
    program: &Program,
    lowered: &Program,
    limits: &ir::Limits,
) -> Result<(), BackendError> {
    if Program::ptr_eq(program, lowered) {
        return Ok(());
    }
    ir::validate_lowered(lowered, limits)
        .map(|_| ())
        .map_err(|e| invalid(program, &e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Access, BufferCount, ElemType, Expr, Limits};

    /// Locks out an unbounded batch (one call building a module of any size and
    /// holding every program's PTX at once): [`MAX_BATCH_PROGRAMS`] passes the check,
    /// one more is a `Fix:` error naming the bound.
    #[test]
    fn batch_size_is_bounded() {
        assert!(check_batch_size(MAX_BATCH_PROGRAMS).is_ok());
        let error = check_batch_size(MAX_BATCH_PROGRAMS + 1).expect_err("one past the bound");
        let message = error.to_string();
        assert!(message.starts_with("Fix:"), "{message}");
        assert!(
            message.contains(&MAX_BATCH_PROGRAMS.to_string()),
            "{message}"
        );
    }

    /// Locks out a batch error that hides which program failed, or that loses the
    /// validator's typed error and its `Fix:` message: the error of program 3 names
    /// "program 3 of the batch" and keeps both. Negative control: the same error
    /// outside a batch does not name an index.
    #[test]
    fn batch_errors_name_the_program_index_and_keep_the_fix() {
        let program = Program::builder([1, 1, 1])
            .buffer(
                "in",
                0,
                Access::ReadOnly,
                ElemType::U32,
                BufferCount::Static(1),
            )
            .body(|b| {
                b.store("in", Expr::u32(0), Expr::u32(1));
            })
            .build();
        let validation =
            ir::validate(&program, &Limits::default()).expect_err("store to read-only");
        let plain = invalid(&program, &validation);
        assert!(!plain.to_string().contains("of the batch"), "{plain}");
        let batched = in_batch(3, plain);
        let message = batched.to_string();
        assert!(message.starts_with("Fix:"), "{message}");
        assert!(message.contains("program 3 of the batch"), "{message}");
        match batched {
            BackendError::InvalidProgram { error, .. } => assert_eq!(error, validation),
            other => panic!("lost the validation error: {other:?}"),
        }
        let bad_input = in_batch(7, BackendError::bad_input("Fix: bind fewer buffers"));
        assert_eq!(
            bad_input.to_string(),
            "Fix: bind fewer buffers (program 7 of the batch)"
        );
    }
}
