//! The CPU reference interpreter: runs a [`Program`] on the host with exactly
//! the GPU's semantics.
//!
//! It exists for three users: it is the **oracle** every GPU test compares against,
//! the **fallback** a host without CUDA runs on (the examples included), and the
//! engine of **differential testing**, where random valid programs must give
//! byte-identical outputs here and on the GPU. So every operator follows the IR's
//! documented semantics bit for bit (see `ops.rs` for the few places where that is
//! not plain Rust arithmetic: canonical NaN `0x7fffffff` for NaN arithmetic results,
//! `-0.0 < +0.0` in `f32` min/max), and no input, however malformed, panics.
//!
//! # Execution model
//!
//! The whole grid runs in **lockstep**: each statement executes for every active
//! thread before the next statement starts. Threads are *lanes* numbered by global
//! linear id `workgroup_linear * threads_per_workgroup + local_linear`, where
//! `local_linear = x + sx * (y + sy * z)` and `workgroup_linear` is the same formula
//! over the grid. Within one statement, every expression is evaluated for all lanes
//! first, then stores and atomics apply in ascending lane order, and their effects
//! are visible to every later statement. Consequences:
//!
//! - `Barrier` and `GridSync` are satisfied by construction (no-ops here).
//! - [`ReferenceOptions::workgroup_order`] can instead run one workgroup at a time
//!   (ascending or descending), each to its end, for programs whose workgroups
//!   communicate through global memory; within a workgroup it is lockstep as
//!   above (a `GridSync` then does not synchronise the grid).
//! - `WorkgroupReduce` reduces over the lanes of each workgroup that reach it;
//!   `WorkgroupScan` gives each of them its prefix in lane order (which is local
//!   linear order within a workgroup).
//! - Atomics apply one lane at a time in ascending lane order, and a fetch or a
//!   compare-exchange returns the element as that lane's own operation found it: the
//!   one order the reference defines for what the GPU runs in any order
//!   (`ir::AtomicOp` says which results depend on it).
//! - `If` splits the active lanes; the `then` arm runs to completion before the
//!   `else` arm. `Loop` evaluates each lane's bounds once and iterates while any lane
//!   has iterations left. `While` evaluates its condition for the lanes still in the
//!   loop before every iteration and runs the body for those where it holds, until
//!   none is left. `Break` takes a lane out of its innermost loop and `Continue` out
//!   of the rest of the current iteration (it rejoins for the next one). `Return`
//!   ends a lane for the rest of the kernel run.
//! - `SubgroupShuffleXor`: a lane's subgroup is `local_linear / subgroup_size` within
//!   its workgroup and its subgroup lane is `local_linear % subgroup_size`. The result
//!   is the value of subgroup lane `own ^ lane_mask`; **if that lane does not exist**
//!   (past the subgroup size or the workgroup's end) **or is not active, the lane gets
//!   its own value**. (The IR requires full subgroups, so valid lowered programs never
//!   see this case.) `SubgroupReduce` reduces over the active lanes of the subgroup,
//!   `SubgroupScan` scans them in lane order.
//! - Workgroup buffers: one zeroed instance per workgroup per kernel run; local arrays
//!   one zeroed instance per thread per kernel run.
//! - `fixpoint_iterations` runs the whole grid that many times over the same buffers.
//! - A scalar parameter ([`run_with_scalars`]) is one value for the whole run: it is
//!   compiled into a constant of its declared type, so it behaves exactly as a literal
//!   of the same bits would.
//! - With `bounds_checks` off, an out-of-range access is an error naming the program,
//!   the buffer and the index (the GPU would fault) instead of undefined behaviour.
//! - A program that [`lower::lower_workgroup_reductions`] made with subgroup steps
//!   for `S`-lane subgroups runs only with `ReferenceOptions::subgroup_size == S`.
//!
//! # Bounded on any input
//!
//! A run validates first (a program nested 10^6 deep gets `NestingTooDeep`, one whose
//! shared blocks describe 2^64 nodes gets `TooManyNodes`), then checks the memory it
//! will need against [`ReferenceOptions::max_memory_bytes`] **before allocating**
//! (per-lane variable slots, temporaries and bookkeeping times the lanes, plus every
//! buffer and the compiled program), and counts its work against
//! [`ReferenceOptions::max_work`]: every statement, every expression node and every
//! loop iteration, times the lanes it runs on (at least 32: running one costs a fixed
//! amount however few lanes it covers), and at the start of every kernel run the reset
//! of every lane and every 4-byte word of workgroup memory and per-thread local arrays
//! zeroed (so `fixpoint_iterations = u32::MAX` over an empty body stops too, whatever
//! its workgroup buffers: with one 48 KiB buffer a run costs 12,289 units). Costs paid
//! once per call (loading inputs, zeroing outputs, the lane tables) are bounded by
//! the memory check instead. The default cap, 2^31, stopped a runaway 1,024-thread
//! loop after 1.9 s on one core of the development machine (release build,
//! `reference_work_cap_figures`) and a one-thread `while true {}` after about a
//! second; the old cap (2^34 statements, expressions not counted) let a valid
//! 83-node program run 48 s. With `CodegenOptions::max_loop_iterations` set, a
//! `while` loop that passes the cap stops the run with an error there too, as the
//! GPU traps.
//!
//! Programs with racing writes (two lanes storing different values to one element
//! without a barrier between) have no defined result on the GPU; here the highest
//! lane wins. Differential tests must not generate them.
//!
//! # Speed
//!
//! Names are resolved and operators typed once per run (`compile.rs`); expressions
//! are then evaluated vectorised, one vector of bit patterns per expression node for
//! all active lanes (`exec.rs`), so interpretive overhead is paid per statement, not
//! per lane. Lanes hold `u32`s, or `u64`s in a program with 64-bit values only (the
//! executor is generic over the width), so 32-bit programs kept their speed:
//! `reference_throughput_262144_threads` took 15.6 and 16.5 ms (two runs) against
//! 16.1 ms before 64-bit values existed (release, development machine).

mod compile;
mod exec;
mod ops;

use std::fmt;

use crate::config::DispatchConfig;
use crate::ir::{self, Access, BufferCount, Literal, Program, ProgramForm, ValidProgram};
use crate::lower;

use exec::{BufferStore, Grid, Instances, Machine, Storage};

/// Knobs of the reference interpreter that a dispatch config does not carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReferenceOptions {
    /// Lanes per subgroup for `SubgroupShuffleXor`/`SubgroupReduce` (default 32, a
    /// CUDA warp). Must be at least 1.
    pub subgroup_size: u32,
    /// Device limits the program is validated against (default
    /// [`ir::Limits::h200`]: an H200's kernels, 227 KiB of workgroup memory).
    pub limits: ir::Limits,
    /// Most work one call may do before it stops with a `Fix:` error instead of
    /// appearing to hang: statements, expression nodes and loop iterations, each
    /// times the lanes it runs on (at least 32), plus every lane and every 4-byte word
    /// of workgroup memory and local arrays reset once per kernel run
    /// ([`ReferenceStats::work`]). Default 2^31, about 2 s of interpretation.
    pub max_work: u64,
    /// Most bytes of host memory one call may allocate (checked before allocating;
    /// the error names the bytes). Default 2 GiB.
    pub max_memory_bytes: u64,
    /// Apply the lanes of each atomic statement in descending instead of ascending
    /// global invocation order (default `false`). The GPU promises neither order, so
    /// a program whose outputs change with this flag depends on the order threads
    /// run in (see `ir::AtomicOp`); the differential tests check their generated
    /// programs both ways.
    pub reverse_atomic_order: bool,
    /// How workgroups share the run (default [`WorkgroupOrder::Lockstep`]). The GPU
    /// promises no order between workgroups, so a program that passes in lockstep
    /// but fails with its workgroups run one after another depends on an order
    /// the device may not give it.
    pub workgroup_order: WorkgroupOrder,
}

/// How the reference runs the workgroups of a grid
/// ([`ReferenceOptions::workgroup_order`]).
///
/// Lockstep runs every statement for every workgroup before the next statement,
/// so workgroups that publish values for each other (a decoupled look-back) all
/// publish at the same statement and never see another's finished result. Run in
/// turn, each workgroup runs to its end before the next starts, so every later
/// workgroup finds every earlier one finished: the paths the device takes when a
/// workgroup starts after others have finished. A workgroup that waits for a later
/// one never ends in turn (the run stops at [`ReferenceOptions::max_work`]), as it
/// may not on the device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WorkgroupOrder {
    /// All workgroups statement by statement (the default).
    #[default]
    Lockstep,
    /// One workgroup at a time, in ascending linear workgroup id.
    InTurn,
    /// One workgroup at a time, in descending linear workgroup id.
    InTurnReversed,
}

impl Default for ReferenceOptions {
    fn default() -> Self {
        ReferenceOptions {
            subgroup_size: 32,
            limits: ir::Limits::h200(),
            max_work: 1 << 31,
            max_memory_bytes: 2 << 30,
            reverse_atomic_order: false,
            workgroup_order: WorkgroupOrder::Lockstep,
        }
    }
}

/// What a run of the interpreter cost: useful for throughput figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReferenceStats {
    /// Statements (and loop iterations) executed, each counted for its active lanes
    /// but at least 32, plus every lane and every 4-byte word of workgroup memory and
    /// local arrays reset once per kernel run (at least 32).
    pub lane_steps: u64,
    /// Expression nodes evaluated, each counted for its active lanes but at least 32.
    pub lane_ops: u64,
}

impl ReferenceStats {
    /// The work [`ReferenceOptions::max_work`] caps: `lane_steps + lane_ops`.
    pub fn work(&self) -> u64 {
        self.lane_steps.saturating_add(self.lane_ops)
    }
}

/// Why the interpreter refused or stopped. The message starts with `Fix:` and says
/// what to change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReferenceError {
    message: String,
}

impl ReferenceError {
    fn new(message: String) -> Self {
        debug_assert!(message.starts_with("Fix:"), "{message}");
        ReferenceError { message }
    }

    /// The message, starting with `Fix:`.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ReferenceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ReferenceError {}

/// Run `program` over the grid in `config` with default [`ReferenceOptions`].
///
/// `inputs` holds one byte slice per global buffer ([`Program::global_buffers`]:
/// every non-workgroup buffer, ascending binding). A static-count buffer's slice
/// must be exactly `count * element size` bytes; a runtime-sized buffer's slice
/// gives its length (a multiple of the element size). Write-only buffers start
/// zeroed whatever their slice holds. Returns the final bytes of every output buffer
/// (read-write and write-only), ascending binding; `config.readback` is ignored.
///
/// ```
/// use vyre_cuda::ir::*;
/// use vyre_cuda::{reference, DispatchConfig};
/// let program = Program::builder([4, 1, 1])
///     .buffer("out", 0, Access::WriteOnly, ElemType::U32, BufferCount::Static(4))
///     .body(|b| {
///         let i = b.let_("i", Expr::global_id(Axis::X));
///         b.store("out", i.clone(), i * 10u32);
///     })
///     .build();
/// let outputs = reference::run(&program, &[&[0; 16]], &DispatchConfig::linear(1)).unwrap();
/// assert_eq!(outputs[0], [0, 0, 0, 0, 10, 0, 0, 0, 20, 0, 0, 0, 30, 0, 0, 0]);
/// ```
///
/// A program that declares scalar parameters takes their values through
/// [`run_with_scalars`]; here it is an error.
pub fn run(
    program: &Program,
    inputs: &[&[u8]],
    config: &DispatchConfig,
) -> Result<Vec<Vec<u8>>, ReferenceError> {
    run_with_options(program, inputs, config, &ReferenceOptions::default())
}

/// [`run_with_stats`] of a program with scalar parameters: `scalars` holds one value
/// per [`ScalarDecl`](crate::ir::ScalarDecl) of the program, in declaration order,
/// each of the declared type (a missing, extra or mistyped value is an error that
/// says which). An [`Expr::Scalar`](crate::ir::Expr::Scalar) reads its value in
/// every thread.
///
/// ```
/// use vyre_cuda::ir::*;
/// use vyre_cuda::{reference, DispatchConfig};
/// use vyre_cuda::reference::ReferenceOptions;
/// let program = Program::builder([4, 1, 1])
///     .buffer("out", 0, Access::WriteOnly, ElemType::U32, BufferCount::Static(4))
///     .scalar("step", ScalarType::U32)
///     .body(|b| {
///         let i = b.let_("i", Expr::global_id(Axis::X));
///         b.store("out", i.clone(), i * Expr::scalar("step"));
///     })
///     .build();
/// let options = ReferenceOptions::default();
/// let config = DispatchConfig::linear(1);
/// let (outputs, _) =
///     reference::run_with_scalars(&program, &[&[0; 16]], &[Literal::U32(3)], &config, &options)
///         .unwrap();
/// assert_eq!(outputs[0][4..8], 3u32.to_le_bytes());
/// let wrong = reference::run_with_scalars(&program, &[&[0; 16]], &[Literal::I32(3)], &config, &options);
/// assert!(wrong.unwrap_err().message().starts_with("Fix:"));
/// ```
pub fn run_with_scalars(
    program: &Program,
    inputs: &[&[u8]],
    scalars: &[Literal],
    config: &DispatchConfig,
    options: &ReferenceOptions,
) -> Result<(Vec<Vec<u8>>, ReferenceStats), ReferenceError> {
    let valid = validate_for_run(program, options)?;
    run_valid_with_scalars(&valid, inputs, scalars, config, options)
}

/// [`run`] for a program that already passed the validator: nothing is validated
/// again (see [`run_valid_with_stats`]).
pub fn run_valid(
    program: &ValidProgram,
    inputs: &[&[u8]],
    config: &DispatchConfig,
) -> Result<Vec<Vec<u8>>, ReferenceError> {
    run_valid_with_stats(program, inputs, config, &ReferenceOptions::default())
        .map(|(outputs, _)| outputs)
}

/// [`run`] with explicit options.
pub fn run_with_options(
    program: &Program,
    inputs: &[&[u8]],
    config: &DispatchConfig,
    options: &ReferenceOptions,
) -> Result<Vec<Vec<u8>>, ReferenceError> {
    run_with_stats(program, inputs, config, options).map(|(outputs, _)| outputs)
}

/// [`run_with_options`], also returning what the run cost.
pub fn run_with_stats(
    program: &Program,
    inputs: &[&[u8]],
    config: &DispatchConfig,
    options: &ReferenceOptions,
) -> Result<(Vec<Vec<u8>>, ReferenceStats), ReferenceError> {
    let valid = validate_for_run(program, options)?;
    run_valid_with_stats(&valid, inputs, config, options)
}

/// [`run_with_stats`] for a program that already passed the validator (user or
/// lowered form, against the caller's limits): nothing is validated again.
/// `options.limits` is not used.
pub fn run_valid_with_stats(
    program: &ValidProgram,
    inputs: &[&[u8]],
    config: &DispatchConfig,
    options: &ReferenceOptions,
) -> Result<(Vec<Vec<u8>>, ReferenceStats), ReferenceError> {
    run_valid_with_scalars(program, inputs, &[], config, options)
}

/// [`run_with_scalars`] for a program that already passed the validator: nothing is
/// validated again. `options.limits` is not used.
pub fn run_valid_with_scalars(
    program: &ValidProgram,
    inputs: &[&[u8]],
    scalars: &[Literal],
    config: &DispatchConfig,
    options: &ReferenceOptions,
) -> Result<(Vec<Vec<u8>>, ReferenceStats), ReferenceError> {
    let program: &Program = program;
    let grid = check_request(program, config, options)?;
    check_scalars(program, scalars)?;
    // Validated: at most `ir::validate::MAX_NESTING_DEPTH` levels, so this is bounded.
    let depth = compile::nesting_depth(program);
    if depth <= compile::INLINE_NESTING {
        return execute(program, inputs, scalars, config, grid, options);
    }
    // Compilation and evaluation recurse once per level: give deep programs a stack
    // that fits them instead of overflowing the caller's.
    std::thread::scope(|scope| {
        let worker = std::thread::Builder::new()
            .name("vyre-reference-deep".to_owned())
            .stack_size(compile::DEEP_STACK_BYTES)
            .spawn_scoped(scope, || {
                execute(program, inputs, scalars, config, grid, options)
            })
            .map_err(|error| {
                ReferenceError::new(format!(
                    "Fix: the reference interpreter could not start a thread for deeply nested {} ({error}); flatten the program with let bindings.",
                    program.display_name()
                ))
            })?;
        worker.join().unwrap_or_else(|_| {
            Err(ReferenceError::new(format!(
                "Fix: the reference interpreter failed on {}; report this program as a bug.",
                program.display_name()
            )))
        })
    })
}

/// Compile and run `program` on the current thread.
fn execute(
    program: &Program,
    inputs: &[&[u8]],
    scalars: &[Literal],
    config: &DispatchConfig,
    grid: Grid,
    options: &ReferenceOptions,
) -> Result<(Vec<Vec<u8>>, ReferenceStats), ReferenceError> {
    let compiled = compile::compile(program, scalars, options.max_memory_bytes)
        .map_err(ReferenceError::new)?;
    check_memory(program, inputs, &grid, &compiled, options)?;
    let buffers = load_inputs(program, inputs, &grid)?;
    if compiled.wide {
        run_machine::<u64>(program, &compiled, config, grid, buffers)
    } else {
        run_machine::<u32>(program, &compiled, config, grid, buffers)
    }
}

/// Run the kernel `config.fixpoint_iterations` times on a machine whose lanes hold
/// `W` values, and read the outputs back.
fn run_machine<W: exec::Word>(
    program: &Program,
    compiled: &compile::CompiledProgram,
    config: &DispatchConfig,
    grid: Grid,
    buffers: Vec<BufferStore>,
) -> Result<(Vec<Vec<u8>>, ReferenceStats), ReferenceError> {
    let mut machine = Machine::<W>::new(program, compiled, grid, buffers)?;
    for _ in 0..config.fixpoint_iterations {
        machine.run_kernel()?;
    }
    let stats = machine.stats();
    let outputs = output_positions(program)
        .into_iter()
        .map(|position| machine.buffers[position].to_bytes())
        .collect();
    Ok((outputs, stats))
}

/// The validator's verdict, first of all: user programs (WorkgroupReduce) and
/// lowered programs (subgroup expressions) both run here, so either form is accepted;
/// the error reported is the user form's.
fn validate_for_run(
    program: &Program,
    options: &ReferenceOptions,
) -> Result<ValidProgram, ReferenceError> {
    use ir::validate::Rule;
    // Not memoised: the program's memo slot belongs to the limits its user (the
    // backend, with the device's) validates against, and a walk costs far less than
    // interpreting the program.
    match ir::validate_unmemoised(program, &options.limits, ProgramForm::User) {
        Ok(valid) => Ok(valid),
        // Only these differ between the forms; any other rule (nesting, node count,
        // types) fails the lowered form too, so it is not walked again.
        Err(user_error)
            if matches!(
                user_error.rule(),
                Rule::SubgroupBeforeLowering | Rule::ReservedName
            ) =>
        {
            ir::validate_unmemoised(program, &options.limits, ProgramForm::Lowered)
                .map_err(|_| ReferenceError::new(user_error.message().to_owned()))
        }
        Err(user_error) => Err(ReferenceError::new(user_error.message().to_owned())),
    }
}

/// The grid rules of a dispatch of `program` over `workgroups`, shared by every
/// path that takes a grid (a run, a graph step's new grid): no axis of 0, a
/// workgroup size whose thread count fits a `u32`, at most 2^32 - 1 threads in all.
/// Returns the workgroup size, its thread count and the total thread count.
pub(crate) fn check_grid(
    program: &Program,
    workgroups: [u32; 3],
) -> Result<([u32; 3], u32, u64), ReferenceError> {
    let name = program.display_name();
    if workgroups.contains(&0) {
        return Err(ReferenceError::new(format!(
            "Fix: the dispatch of {name} has workgroups {workgroups:?}, with an axis of 0; give every axis at least 1 workgroup."
        )));
    }
    let size = program.workgroup_size();
    if size.contains(&0) {
        return Err(ReferenceError::new(format!(
            "Fix: {name} has workgroup size {size:?}, with an axis of 0; give every axis at least 1 thread."
        )));
    }
    let threads_per_workgroup = program.threads_per_workgroup().ok_or_else(|| {
        ReferenceError::new(format!(
            "Fix: {name} has workgroup size {size:?}, whose thread count overflows u32; use a workgroup of at most 1024 threads."
        ))
    })?;
    let workgroup_total = workgroups
        .iter()
        .try_fold(1u64, |total, &axis| total.checked_mul(axis as u64));
    let total_lanes = workgroup_total
        .and_then(|total| total.checked_mul(threads_per_workgroup as u64))
        .filter(|&lanes| lanes <= u32::MAX as u64)
        .ok_or_else(|| {
            ReferenceError::new(format!(
                "Fix: the dispatch of {name} asks for workgroups {workgroups:?} of {threads_per_workgroup} threads, more than 2^32 - 1 threads in all; dispatch fewer workgroups."
            ))
        })?;
    Ok((size, threads_per_workgroup, total_lanes))
}

/// Grid shape and options: everything checked before any allocation.
fn check_request(
    program: &Program,
    config: &DispatchConfig,
    options: &ReferenceOptions,
) -> Result<Grid, ReferenceError> {
    let name = program.display_name();
    if options.subgroup_size == 0 {
        return Err(ReferenceError::new(
            "Fix: ReferenceOptions::subgroup_size is 0; use the device's warp size (32)."
                .to_owned(),
        ));
    }
    if let Some(lowered_for) = lower::lowered_subgroup_size(program) {
        if lowered_for != options.subgroup_size {
            return Err(ReferenceError::new(format!(
                "Fix: run {name} with ReferenceOptions::subgroup_size = {lowered_for}, or lower it again for {}-lane subgroups: it was lowered for {lowered_for}-lane subgroups and its reductions would be wrong on {}.",
                options.subgroup_size, options.subgroup_size
            )));
        }
    }
    if config.fixpoint_iterations == 0 {
        return Err(ReferenceError::new(format!(
            "Fix: the dispatch of {name} asks for 0 fixpoint iterations; run at least 1."
        )));
    }
    let workgroups = config.workgroups;
    let (size, threads_per_workgroup, total_lanes) = check_grid(program, workgroups)?;
    Ok(Grid {
        workgroup_size: size,
        workgroup_count: workgroups,
        threads_per_workgroup,
        total_lanes: total_lanes as u32,
        subgroup_size: options.subgroup_size,
        bounds_checks: config.codegen.bounds_checks,
        max_work: options.max_work,
        max_loop_iterations: config.codegen.max_loop_iterations,
        reverse_atomic_order: options.reverse_atomic_order,
        workgroup_order: options.workgroup_order,
    })
}

/// One value per declared scalar, in declaration order, each of the declared type.
fn check_scalars(program: &Program, scalars: &[Literal]) -> Result<(), ReferenceError> {
    let declared = program.scalars();
    let name = program.display_name();
    if scalars.len() != declared.len() {
        let list: Vec<String> = declared.iter().map(ToString::to_string).collect();
        return Err(ReferenceError::new(format!(
            "Fix: {name} declares {} scalar parameters [{}] but {} values were given; pass one value per scalar, in declaration order (reference::run_with_scalars).",
            declared.len(),
            list.join(", "),
            scalars.len()
        )));
    }
    for (decl, value) in declared.iter().zip(scalars) {
        if value.ty() != decl.ty {
            return Err(ReferenceError::new(format!(
                "Fix: scalar '{}' of {name} is declared {} but its value {value} is a {}; pass a {} value.",
                decl.name,
                decl.ty.name(),
                value.ty().name(),
                decl.ty.name()
            )));
        }
    }
    Ok(())
}

/// Refuse a run whose memory would pass [`ReferenceOptions::max_memory_bytes`], before
/// anything per-lane or per-buffer is allocated. Counts, per lane: a lane value (4
/// bytes, 8 in programs with 64-bit values) per variable slot and per builtin table
/// used, 4 for the lane's workgroup, 1 each for its alive flag and its loop state,
/// and two lane values per temporary vector (doubled for `Vec` growth); then every buffer (global buffers at their input's size, workgroup
/// buffers once per workgroup), the output copies, and the compiled program.
fn check_memory(
    program: &Program,
    inputs: &[&[u8]],
    grid: &Grid,
    compiled: &compile::CompiledProgram,
    options: &ReferenceOptions,
) -> Result<(), ReferenceError> {
    let lanes = u64::from(grid.total_lanes);
    let builtins = compiled.builtins_used.iter().filter(|&&used| used).count() as u64;
    // Lane values are 8 bytes in programs with 64-bit values (`exec::Word`).
    let word = if compiled.wide { 8 } else { 4 };
    let per_lane = word * (compiled.slot_count as u64 + builtins)
        + 4
        + 2
        + 2 * word * compiled.temporaries as u64;
    let workgroups = lanes / u64::from(grid.threads_per_workgroup.max(1));
    // Global buffers take their input's bytes (outputs twice: the buffer and the
    // copy handed back); inputs come in binding order.
    let mut buffer_bytes: u64 = 0;
    for (&position, input) in global_positions(program).iter().zip(inputs) {
        let copies = if program.buffers()[position].access.is_output() {
            2
        } else {
            1
        };
        buffer_bytes = buffer_bytes.saturating_add((input.len() as u64).saturating_mul(copies));
    }
    for decl in program.buffers() {
        let instances = match decl.access {
            Access::Workgroup => workgroups,
            Access::Local => lanes,
            _ => continue,
        };
        let instance = decl.static_size_bytes().unwrap_or(0);
        buffer_bytes = buffer_bytes.saturating_add(instance.saturating_mul(instances));
    }
    // The compiled program was charged while it was built (`compile::compile`).
    let needed = lanes.saturating_mul(per_lane).saturating_add(buffer_bytes);
    if needed > options.max_memory_bytes {
        return Err(ReferenceError::new(format!(
            "Fix: the reference run of {} needs about {needed} bytes ({lanes} threads × {per_lane} bytes per thread, plus {buffer_bytes} bytes of buffers), over ReferenceOptions::max_memory_bytes = {}; dispatch fewer workgroups or smaller buffers, or raise the budget.",
            program.display_name(),
            options.max_memory_bytes
        )));
    }
    Ok(())
}

/// Positions (in declaration order) of the global buffers, ascending binding.
fn global_positions(program: &Program) -> Vec<usize> {
    let mut positions: Vec<usize> = (0..program.buffers().len())
        .filter(|&position| program.buffers()[position].access.is_global())
        .collect();
    positions.sort_by_key(|&position| program.buffers()[position].binding);
    positions
}

/// Positions of the output buffers, ascending binding.
fn output_positions(program: &Program) -> Vec<usize> {
    global_positions(program)
        .into_iter()
        .filter(|&position| program.buffers()[position].access.is_output())
        .collect()
}

/// Check each input against its declaration and build every buffer's storage.
fn load_inputs(
    program: &Program,
    inputs: &[&[u8]],
    grid: &Grid,
) -> Result<Vec<BufferStore>, ReferenceError> {
    let name = program.display_name();
    let globals = global_positions(program);
    if inputs.len() != globals.len() {
        let expected: Vec<String> = globals
            .iter()
            .map(|&position| {
                let decl = &program.buffers()[position];
                format!("'{}' (binding {})", decl.name, decl.binding)
            })
            .collect();
        return Err(ReferenceError::new(format!(
            "Fix: {name} takes {} input slices, one per global buffer in binding order: [{}]; {} were given.",
            globals.len(),
            expected.join(", "),
            inputs.len()
        )));
    }
    let mut input_of: Vec<Option<&[u8]>> = vec![None; program.buffers().len()];
    for (&position, &input) in globals.iter().zip(inputs) {
        input_of[position] = Some(input);
    }
    let workgroup_count = grid.total_lanes as u64 / grid.threads_per_workgroup as u64;
    let mut buffers = Vec::with_capacity(program.buffers().len());
    for (decl, input) in program.buffers().iter().zip(input_of) {
        let elem_size = decl.elem.size_bytes() as usize;
        let Some(input) = input else {
            // A workgroup buffer (one zeroed instance per workgroup) or a local array
            // (one per thread).
            let BufferCount::Static(count) = decl.count else {
                return Err(ReferenceError::new(format!(
                    "Fix: {} buffer '{}' of {name} is runtime-sized; give it a static count.",
                    decl.access.name(),
                    decl.name
                )));
            };
            let (instances, per) = if decl.access == Access::Local {
                (u64::from(grid.total_lanes), Instances::Thread)
            } else {
                (workgroup_count, Instances::Workgroup)
            };
            buffers.push(BufferStore::zeroed(
                &decl.name, decl.elem, count, instances, per,
            )?);
            continue;
        };
        let length = match decl.count {
            BufferCount::Static(count) => {
                let expected = count as u64 * elem_size as u64;
                if input.len() as u64 != expected {
                    return Err(ReferenceError::new(format!(
                        "Fix: buffer '{}' of {name} holds {count} {} elements ({expected} bytes) but its input slice has {} bytes; pass exactly {expected} bytes.",
                        decl.name,
                        decl.elem.name(),
                        input.len()
                    )));
                }
                count
            }
            BufferCount::Runtime => {
                if input.len() % elem_size != 0 {
                    return Err(ReferenceError::new(format!(
                        "Fix: runtime-sized buffer '{}' of {name} has {} elements of {elem_size} bytes, but its input slice has {} bytes, not a multiple of {elem_size}; pass whole elements.",
                        decl.name,
                        decl.elem.name(),
                        input.len()
                    )));
                }
                u32::try_from(input.len() / elem_size).map_err(|_| {
                    ReferenceError::new(format!(
                        "Fix: runtime-sized buffer '{}' of {name} would hold {} elements, more than u32::MAX; split the input.",
                        decl.name,
                        input.len() / elem_size
                    ))
                })?
            }
        };
        let mut store = BufferStore::zeroed(&decl.name, decl.elem, length, 1, Instances::Grid)?;
        if decl.access != Access::WriteOnly {
            match &mut store.storage {
                Storage::Bytes(bytes) => bytes.copy_from_slice(input),
                Storage::Words(words) => {
                    for (word, chunk) in words.iter_mut().zip(input.chunks_exact(4)) {
                        *word = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
                    }
                }
                Storage::DoubleWords(words) => {
                    for (word, chunk) in words.iter_mut().zip(input.chunks_exact(8)) {
                        let mut bytes = [0u8; 8];
                        bytes.copy_from_slice(chunk);
                        *word = u64::from_le_bytes(bytes);
                    }
                }
            }
        }
        buffers.push(store);
    }
    Ok(buffers)
}
