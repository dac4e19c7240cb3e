//! The PTX back end: one [`Program`] in, one PTX module with one kernel out.
//!
//! Why it exists: the CUDA driver JIT-compiles PTX for whatever GPU it finds, so plain
//! PTX text is the one artefact that runs on every device we target, and writing it
//! ourselves keeps a cache miss cheap (a single O(n) walk writing into one `String`,
//! no compiler library). The output is meant to be read: every IR statement appears
//! as a `//` comment (its `Display` form, one line) above the instructions it became,
//! and registers are named by type (`%r` 32-bit integers, `%f` `f32`, `%p`
//! predicates, `%rd` 64-bit addresses).
//!
//! Shape, in the style of naga's back ends: a `writer` struct owns the output
//! buffer, the register counters, the label counter and the variable scopes; this
//! module holds the entry point, the error type and the constants the backend needs.
//!
//! # Module layout (what the backend relies on)
//!
//! - `.version 7.8` (8.6/8.7/8.8 for targets newer than `sm_90` that need it),
//!   `.target sm_{sm}`, `.address_size 64`.
//! - Exactly one kernel, `.visible .entry vyre_entry` ([`ENTRY_NAME`]), declared with
//!   `.reqntid x, y, z` from the program's workgroup size: it must be launched with
//!   exactly that block shape.
//! - Kernel parameters: for each global buffer of [`Program::global_buffers`]
//!   (ascending binding) a `.param .u64` device pointer, then, in the same order, one
//!   `.param .u32` element count per global buffer. Every global buffer has its count
//!   parameter even when its count is static (the kernel then uses the constant), so
//!   the backend can always pass the same layout.
//! - Workgroup buffers are module-scope `.shared .align 4 .b8` arrays (size rounded up
//!   to a multiple of 4) that every thread helps zero at kernel entry, followed by
//!   `bar.sync 0`, so a read before any write yields 0 exactly as in the reference
//!   interpreter.
//!
//! # Grid-wide barrier protocol
//!
//! Emitted only when the program contains [`Node::GridSync`](crate::ir::Node::GridSync):
//! a module-scope `.global .align 4 .u32 vyre_grid_barrier[3]` ([`GRID_BARRIER_SYMBOL`],
//! [`GRID_BARRIER_WORDS`] words). **The backend zeroes all three words before every
//! launch** (look the symbol up with `cuModuleGetGlobal`) and must launch
//! cooperatively (every block resident at once). Words:
//!
//! - word 0: arrivals in the current phase (back to 0 when a phase completes);
//! - word 1: generation, incremented once per completed phase;
//! - word 2: total arrivals over the whole launch (audit only).
//!
//! At each grid sync every thread executes `bar.sync 0`; then the thread with local
//! linear id 0 does `fence.acq_rel.gpu`, reads the generation (`ld.acquire.gpu`),
//! adds 1 to word 2, and adds 1 to word 0 (`atom.acq_rel.gpu`), getting the old value.
//! If the old value is `nctaid.x * nctaid.y * nctaid.z - 1` it is the last arrival: it
//! stores 0 to word 0 and then increments word 1 with release semantics. Otherwise it
//! spins while `ld.acquire.gpu` of word 1 still equals the generation it read. It
//! then executes `fence.acq_rel.gpu`, and every thread executes `bar.sync 0` again.
//! After a launch that completed, word 0 is 0 and word 2 is a multiple of the number
//! of blocks (blocks × grid syncs executed); the backend audits both.
//!
//! # Result ABI (the backend's kernels)
//!
//! [`program_to_ptx_with_results`] emits the same kernel with five more parameters
//! after the element counts, so the kernel itself delivers its device time and its
//! small outputs (§11; measured on the H200, §0: a kernel writing host-mapped memory
//! costs 9.7–9.9 µs per dispatch for 1–16 outputs where one async copy per output
//! costs 11.6–35.0 µs, and event timing about 10 µs more):
//!
//! - `.u64 vyre_control`: a 16-byte device control block, `[0]` u64 finished-thread
//!   count, `[8]` u64 earliest block start. **The backend initialises it once to
//!   `(0, u64::MAX)`; every launch that completes leaves it that way again.**
//! - `.u64 vyre_results`: the device address of a host-mapped result area:
//!   `[0]` u64 start stamp, `[8]` u64 end stamp (both `%globaltimer` nanoseconds),
//!   then readback bytes at the offsets the descriptors name.
//! - `.u32 vyre_launch_flags`: bit 0 writes the start stamp (the first launch of a
//!   dispatch), bit 1 the end stamp (the last launch).
//! - `.u32 vyre_range_count`: how many of the descriptors are valid (at most
//!   [`RESULT_RANGE_SLOTS`]).
//! - `.align 8 .b8 vyre_ranges[256]`: [`RESULT_RANGE_SLOTS`] descriptors of 16 bytes,
//!   u64 source device address, u32 byte length, u32 destination offset in the area.
//!
//! Fast case: a program of at most 32 threads per workgroup whose body has no
//! barrier, grid sync or subgroup operation, launched as one block, skips the
//! counting below: every lane reaches the epilogue, one `bar.warp.sync` over the whole
//! warp finds the end, and lane 0 uses its own entry time as the start stamp (no
//! control-block round trip). The run-time check is `nctaid == (1, 1, 1)`.
//!
//! Protocol: at entry the thread with local linear id 0 of each block does
//! `red.min.u64` of `%globaltimer` into control `[8]`. Every `return` branches to the
//! epilogue instead of exiting. There every thread fences (`fence.acq_rel.gpu`); the
//! lanes that arrive together (`activemask`) elect their lowest lane, which adds the
//! group's size to control `[0]` (`atom.acq_rel.gpu`). The group whose addition
//! completes `nctaid × ntid` threads is the last (the leader broadcasts the old count
//! with `shfl.sync`, then the group passes `bar.warp.sync`, which orders every lane's
//! later loads after the leader's acquire): its leader reads `%globaltimer` (the
//! end stamp), writes the stamps the flags ask for, and resets the control block to
//! `(0, u64::MAX)`; then the group's lanes copy every range (32-bit words when
//! source, length and destination are 4-byte aligned, bytes otherwise). No system-scope
//! fence is needed: the host reads the area only after synchronising the stream, and
//! a completed kernel's stores to mapped memory are visible to the host. The stamps therefore span from the earliest block
//! start to the moment the last thread of the grid finished, and the copies read
//! every thread's final stores.
//!
//! # Preconditions
//!
//! The program must have passed [`crate::ir::validate_lowered`] (subgroup expressions
//! allowed) and must not contain [`Node::WorkgroupReduce`](crate::ir::Node::WorkgroupReduce)
//! (run [`crate::lower::lower_workgroup_reductions`] first). Code generation never
//! panics on other input: structural mistakes it notices come back as
//! [`CodegenError::InvalidProgram`]. Subgroup expressions are emitted with a full
//! lane mask (`0xffffffff`), which is correct because lowering only produces them
//! when the workgroup's thread count is a multiple of 32 and in uniform control flow,
//! so every lane of every warp is active.
//!
//! [`Program`]: crate::ir::Program
//! [`Program::global_buffers`]: crate::ir::Program::global_buffers

use std::fmt;

use crate::config::CodegenOptions;
use crate::ir::Program;

mod writer;

/// Name of the single kernel in every emitted module.
pub const ENTRY_NAME: &str = "vyre_entry";

/// Module-scope `.global` symbol of the grid-barrier words (present only when the
/// program contains a grid sync). See the module docs for the protocol.
pub const GRID_BARRIER_SYMBOL: &str = "vyre_grid_barrier";

/// Number of `u32` words at [`GRID_BARRIER_SYMBOL`]; the backend zeroes all of them
/// before every launch.
pub const GRID_BARRIER_WORDS: usize = 3;

/// Readback range descriptors a result-ABI kernel takes (`vyre_ranges`).
pub const RESULT_RANGE_SLOTS: usize = 16;

/// Oldest compute capability (as `major * 10 + minor`) the emitted PTX supports:
/// `shfl.sync`, `fence.acq_rel.gpu` and `ld.acquire` need Volta.
pub const MIN_SM: u32 = 70;

/// Oldest compute capability with `redux.sync`; older targets get a shuffle ladder.
pub const REDUX_MIN_SM: u32 = 80;

/// Why a program could not be turned into PTX. `Display` starts with `Fix:`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CodegenError {
    /// The program still contains a workgroup reduction.
    UnloweredWorkgroupReduce {
        /// Name of the reduction's result variable.
        name: String,
    },
    /// The device is older than [`MIN_SM`].
    UnsupportedTarget {
        /// The compute capability asked for.
        sm: u32,
    },
    /// The subgroup (warp) size is not 32.
    UnsupportedSubgroupSize {
        /// The subgroup size asked for.
        subgroup_size: u32,
    },
    /// The program breaks an IR rule the validator should have caught.
    InvalidProgram {
        /// What is wrong.
        detail: String,
    },
}

impl fmt::Display for CodegenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CodegenError::UnloweredWorkgroupReduce { name } => write!(
                f,
                "Fix: call lower::lower_workgroup_reductions before code generation; the \
                 program still contains the workgroup reduction `{name}`, which has no PTX form"
            ),
            CodegenError::UnsupportedTarget { sm } => write!(
                f,
                "Fix: use a GPU of compute capability 7.0 (sm_{MIN_SM}) or newer; PTX \
                 generation was asked for sm_{sm}, which lacks shfl.sync and scoped fences"
            ),
            CodegenError::UnsupportedSubgroupSize { subgroup_size } => write!(
                f,
                "Fix: pass subgroup_size 32 (the CUDA warp size); {subgroup_size} is not supported"
            ),
            CodegenError::InvalidProgram { detail } => write!(
                f,
                "Fix: run ir::validate_lowered on the program before code generation and \
                 correct what it reports; code generation found: {detail}"
            ),
        }
    }
}

impl std::error::Error for CodegenError {}

/// Translate a lowered, validated program into a PTX module with one kernel
/// ([`ENTRY_NAME`]) for compute capability `sm` (`major * 10 + minor`).
///
/// Deterministic: the same program, options and target give the same bytes.
/// Errors only for a program that still contains a workgroup reduction, for
/// `sm < 70`, for `subgroup_size != 32`, or for a program that breaks an IR rule.
pub fn program_to_ptx(
    program: &Program,
    options: &CodegenOptions,
    sm: u32,
    subgroup_size: u32,
) -> Result<String, CodegenError> {
    if sm < MIN_SM {
        return Err(CodegenError::UnsupportedTarget { sm });
    }
    if subgroup_size != 32 {
        return Err(CodegenError::UnsupportedSubgroupSize { subgroup_size });
    }
    writer::Writer::new(program, *options, sm, false).finish()
}

/// [`program_to_ptx`] with the result ABI (see the module docs): the kernel stamps
/// its own device time and its last thread copies up to [`RESULT_RANGE_SLOTS`]
/// readback ranges into host-mapped memory. The CUDA backend compiles every program
/// this way; [`program_to_ptx`] stays the plain ABI (the PTX snapshots, the raw floor).
pub fn program_to_ptx_with_results(
    program: &Program,
    options: &CodegenOptions,
    sm: u32,
    subgroup_size: u32,
) -> Result<String, CodegenError> {
    if sm < MIN_SM {
        return Err(CodegenError::UnsupportedTarget { sm });
    }
    if subgroup_size != 32 {
        return Err(CodegenError::UnsupportedSubgroupSize { subgroup_size });
    }
    writer::Writer::new(program, *options, sm, true).finish()
}

/// The PTX ISA version the module declares for a target: 7.8 covers everything up to
/// `sm_90`; newer targets need the first version that knows them.
pub(crate) fn ptx_version(sm: u32) -> &'static str {
    match sm {
        0..=90 => "7.8",
        91..=101 => "8.6",
        102..=120 => "8.7",
        _ => "8.8",
    }
}
