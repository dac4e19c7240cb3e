//! The PTX back end: one [`Program`] in, one PTX module with one kernel out.
//!
//! Why it exists: the CUDA driver JIT-compiles PTX for whatever GPU it finds, so plain
//! PTX text is the one artefact that runs on every device we target, and writing it
//! ourselves keeps a cache miss cheap (a single O(n) walk writing into one `String`,
//! no compiler library). The output is meant to be read: every IR statement appears
//! as a `//` comment (its `Display` form, one line) above the instructions it became,
//! and registers are named by type (`%r` 32-bit integers, `%f` `f32`, `%p`
//! predicates, `%rd` 64-bit addresses and integers).
//!
//! Shape, in the style of naga's back ends: a `writer` struct owns the output
//! buffer, the register counters, the label counter and the variable scopes; this
//! module holds the entry point, the error type and the constants the backend needs.
//!
//! # Module layout (what the backend relies on)
//!
//! - `.version 7.8` (8.6/8.7/8.8 for targets newer than `sm_90` that need it),
//!   `.target sm_{sm}`, `.address_size 64`.
//! - Exactly one kernel, `.visible .entry` [`entry_symbol`]`(program)`:
//!   `vyre_entry` ([`ENTRY_NAME`]) for a program without an entry op id,
//!   `vyre_entry__` and the op id otherwise, so that profilers (Nsight Compute)
//!   and compute-sanitizer name each kernel after its program. Declared with
//!   `.reqntid x, y, z` from the program's workgroup size: it must be launched with
//!   exactly that block shape. With
//!   [`CodegenOptions::min_blocks_per_multiprocessor`] set, `.minnctapersm n`
//!   follows on the next line (see "Occupancy requests" below); never otherwise.
//! - Kernel parameters: for each global buffer of [`Program::global_buffers`]
//!   (ascending binding) a `.param .u64` device pointer, then, in the same order, one
//!   `.param .u32` element count per global buffer. Every global buffer has its count
//!   parameter even when its count is static (the kernel then uses the constant), so
//!   the backend can always pass the same layout.
//! - Then (after the result ABI's five, below, when the kernel has them) one
//!   parameter per scalar parameter of [`Program::scalars`], in declaration order:
//!   `vyre_scalar_<i>`, a `.param .u32` for `u32`, `i32` and `bool` (0 or 1), `.f32`
//!   for `f32`, `.u64` for `u64` and `i64`, each loaded into a register once in the
//!   prologue (a `bool` compared with 0). Last, so the buffers' and the result ABI's
//!   parameters keep their places whatever a program declares; the host passes each
//!   value as its bit pattern in a 64-bit word, of which a 32-bit parameter reads the
//!   first 4 bytes (the low half on the little-endian hosts CUDA runs on). The values
//!   are launch parameters, never text: no value reaches the PTX, so a new value needs
//!   no new module.
//! - Workgroup buffers are module-scope `.shared .align 4 .b8` arrays (`.align 8` for
//!   64-bit elements; size rounded up to a multiple of 4) that every thread helps
//!   zero at kernel entry, followed by `bar.sync 0`, so a read before any write
//!   yields 0 exactly as in the reference interpreter. When together they take more
//!   than [`MAX_STATIC_SHARED_BYTES`] (48 KiB, the most static shared memory a CUDA
//!   kernel may declare), they live instead in one
//!   `.extern .shared .align 16 .b8 vyre_dynamic_shared[]` ([`DYNAMIC_SHARED_SYMBOL`])
//!   at the offsets of [`workgroup_memory::layout`], and **the backend must launch
//!   the kernel with [`dynamic_shared_bytes`] of dynamic shared memory** (after
//!   opting its function in to that much): see [`workgroup_memory`].
//!
//! # Grid-wide barrier protocol
//!
//! Emitted only when the program contains [`Node::GridSync`](crate::ir::Node::GridSync):
//! a module-scope `.global .align 4 .u32 vyre_grid_barrier[1]` ([`GRID_BARRIER_SYMBOL`],
//! [`GRID_BARRIER_WORDS`] word). **Its bits below the phase bit must be 0 at every
//! launch**: the backend zeroes the word before a launch (look the symbol up with
//! `cuModuleGetGlobal`) unless the audit of the launch before found it so and nothing
//! launched since, and must launch cooperatively (every block resident at once). Bit 31
//! ([`GRID_BARRIER_PHASE_BIT`]) flips once per completed phase; the bits below it count
//! the phase's arrivals, and are 0 again when it completes.
//!
//! At each grid sync every thread executes `bar.sync 0`; then the thread with local
//! linear id 0 adds its block's share to the word with one `atom.acq_rel.gpu` (its
//! release covers the block's stores, which the barrier ordered before it) and gets
//! the old value: the first block (`ctaid` all 0) adds `2^31 - (blocks - 1)`, every
//! other block 1, so the phase bit flips with the last arrival, whichever block it
//! is, and the bits below it are back to 0 (a grid of fewer than 2^31 blocks). A block
//! whose own addition flipped the bit goes on: its atomic read the value every other
//! arrival of the phase left, so its acquire synchronises with all of their releases.
//! Every other one spins on `ld.relaxed.gpu` until the phase bit differs from the one
//! its atomic returned, then loads the word once more with `ld.acquire.gpu`: that load
//! reads a value no older than the flip, written by the phase's last arrival or a later
//! one, all read-modify-writes of the word, so it synchronises with every release of
//! the phase (`ptxas` keeps no load for it, only the L1 invalidation an acquire needs:
//! `CCTL.IVALL` in the `sm_90` SASS, where `fence.acq_rel.gpu` was a `MEMBAR.ALL.GPU`).
//! A block of the next phase cannot flip the bit back before every block of
//! this one arrived there too, so no spinning block misses the flip. Then every thread
//! executes `bar.sync 0` again. After a launch that completed, the bits below the phase
//! bit are 0; the backend audits that (the word comes back with the result ABI's
//! copies, as a range of its own): a workgroup that skipped a sync leaves them
//! otherwise, if the launch completes at all.
//!
//! Why one word: the first protocol kept the arrivals and a generation in two words
//! (the last arrival reset the arrivals and then released the generation, which the
//! others polled) and read the generation before arriving, so the last block's way
//! out of a phase held three dependent round trips to L2 and three fences, and each
//! grid sync cost 2.2 µs on an H200 (2026-12-05: a cooperative launch of 256
//! workgroups doing eight syncs 33.3–33.8 µs against one 17.5–17.8). One word cut
//! the last arrival's way out to one atomic: the tokenizer's resident kernel, six syncs
//! per 256 KiB text, ran 6–11 µs faster on the H200 (2026-12-06, cl100k, the three
//! text shapes), 1.1–1.8 µs less per sync. That protocol still left every block with
//! `fence.acq_rel.gpu` after the flip (an acquire made of a relaxed load and a fence)
//! and counted every arrival in a second word for the audit (`red.relaxed.gpu` after
//! the arrival): on an H100 (2026-12-06, a cooperative launch doing 1 against 33
//! syncs, median of 400, two runs) each sync cost 1.34–1.35 µs at 132 workgroups,
//! 1.77–1.78 at 256 and 2.34 at 396; without the count 1.23 / 1.49–1.50 / 1.72–1.73,
//! with the acquiring load instead of the fence 1.02–1.03 / 1.46–1.47 / 2.14–2.17, and
//! with both, as now, 0.88–0.90 / 1.10 / 1.28–1.35 (a back-off of `nanosleep.u32 32`
//! in the spin changed nothing). The count told the audit nothing the phase word does
//! not: a grid whose arrivals leave the phase word's bits at 0 arrived a multiple of
//! the grid's blocks. The tokenizer's resident kernel, seven syncs per 256 KiB text,
//! took 55.7 against 60.4 µs for prose, 62.8 against 67.6 for CJK and 85.7 against
//! 87.7 for code by its own clock (the encode example, same call).
//!
//! # Result ABI (the backend's kernels)
//!
//! [`program_to_ptx_with_results`] emits the same kernel with five more parameters
//! after the element counts (before any scalar parameters), so the kernel itself delivers its device time and its
//! small outputs (measured on the H200: a kernel writing host-mapped memory
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
//!   dispatch), bit 1 the end stamp (the last launch); bits 8–15 say how many of the
//!   leading descriptors are *windows*: a range inside one aligned 16-byte block of
//!   its buffer, which the host checked and places first. The leader copies each
//!   window's block with one vector load and one vector store; the group's strided
//!   loop copies every later descriptor. A dispatch of small outputs runs no loop
//!   iteration and no per-range arithmetic (the general per-range copy cost about
//!   0.13 µs in a one-thread kernel on the H200: one warp's dependent instructions).
//! - `.u32 vyre_range_count`: how many of the descriptors are valid (at most
//!   [`RESULT_RANGE_SLOTS`]).
//! - `.align 8 .b8 vyre_ranges[256]`: [`RESULT_RANGE_SLOTS`] descriptors of 16 bytes:
//!   a window is a u64 source block address and a u64 destination address (both
//!   16-byte aligned); any other range a u64 source device address, u32 byte length
//!   and u32 destination offset in the area.
//!
//! Fast case: a program of at most 32 threads per workgroup whose body has no
//! barrier, grid sync or subgroup operation, launched as one block, skips the
//! counting below: every lane reaches the epilogue, one `bar.warp.sync` over the whole
//! warp finds the end, and lane 0 uses its own entry time as the start stamp (no
//! control-block round trip). The run-time check is `nctaid == (1, 1, 1)`. The
//! leader reads window slot k only when k is below the window count (it branches
//! out of the unrolled slots at the first one past it): evaluating all 16 slots
//! predicated off cost 1.5 µs per dispatch on the H200 with no range described.
//!
//! Protocol: at entry the thread with local linear id 0 of each block does
//! `red.min.u64` of `%globaltimer` into control `[8]`. Every `return` branches to the
//! epilogue instead of exiting. There every thread fences (`fence.acq_rel.gpu`); the
//! lanes that arrive together (`activemask`) elect their lowest lane, which adds the
//! group's size to control `[0]` (`atom.acq_rel.gpu`). Blocks of more than one warp
//! count per block first (below), so that only the group that completes its block
//! fences at device scope and adds the block's `ntid` threads. The group whose
//! addition completes `nctaid × ntid` threads is the last (the leader broadcasts the old count
//! with `shfl.sync`, then the group passes `bar.warp.sync`, which orders every lane's
//! later loads after the leader's acquire): its leader reads `%globaltimer` (the
//! end stamp), writes the stamps the flags ask for, and resets the control block to
//! `(0, u64::MAX)` and copies the windows; then the group's lanes copy every other
//! range (32-bit words when source, length and destination are 4-byte aligned,
//! bytes otherwise). No system-scope
//! fence is needed: the host reads the area only after synchronising the stream, and
//! a completed kernel's stores to mapped memory are visible to the host. The stamps therefore span from the earliest block
//! start to the moment the last thread of the grid finished, and the copies read
//! every thread's final stores.
//!
//! Per-block count: one same-address atomic per warp serialises at one L2 slice,
//! and a 16 MiB tokenizer chunk ran about 1.02 M of them (`pieces` 524 K warps,
//! `classify`, `phases` and `count` 131 K each), an estimated 0.5–1 ms of its ~5 ms
//! of kernels. So a kernel whose blocks have more than one warp declares
//! `.shared .align 4 .u32 vyre_block_finished` (`vyre_block_finished_<i>` for kernel
//! `i` of a module of several), which local thread 0 zeroes at entry before
//! `bar.sync 0` (the same barrier that ends the zeroing of workgroup memory, when
//! there is any). Each group fences at block scope (`fence.acq_rel.cta`), its leader
//! adds the group's size to the counter (`atom.acq_rel.cta.shared`), and every group
//! but the one that brings the counter to `ntid` returns; that one runs the
//! device-scope fence and atomic above with `ntid` instead of its own size. Block-
//! scope releases into the block's last group, then its device-scope release, carry
//! every thread's stores to the grid's last group (release and acquire are
//! cumulative in the PTX memory model). The counter takes 4 bytes of static shared
//! memory, so a kernel whose workgroup buffers leave less than that below
//! [`MAX_STATIC_SHARED_BYTES`], or that uses the dynamic pool (sized up to the
//! device's opt-in limit), keeps one atomic per group, as does a block of one warp.
//!
//! # Occupancy requests
//!
//! The result ABI's epilogue copies up to 16 windows with 16 unrolled vector loads
//! in flight (0.4 µs against 1.06 µs serially for 16 windows, H200), which keeps 64
//! registers live: ptxas 12.9 gives most result-ABI kernels 80 registers per thread
//! whatever their bodies need, so at 256 threads an SM holds 3 blocks. The
//! tokenizer's steps need 23–64 (their plain-ABI kernels), and on the H200 its split
//! steps ran ~41 waves of ~22 µs per 16 MiB. A caller that knows its kernel's need
//! states the occupancy with [`CodegenOptions::min_blocks_per_multiprocessor`]: the
//! entry declares `.minnctapersm n` after `.reqntid` (the PTX ISA's place for
//! performance-tuning directives, which needs `.reqntid` or `.maxntid` beside it),
//! and ptxas keeps each thread within `65536 / (n × threads)` registers, spilling the
//! rest. Measured with `ptxas -v` and `nvdisasm` (`sm_90`, the tokenizer's 256-thread
//! steps): at 8 blocks (32 registers) `count` spills 468 bytes stored / 644 loaded,
//! every spill instruction after the finishing atomic, so only the grid's last warp
//! executes them; at 4 blocks (64 registers) 100 / 132. The cost elsewhere is the
//! local frame (up to 296 bytes per thread) the driver reserves for every resident
//! thread.
//!
//! Why `.minnctapersm` and not `.maxnreg`: `.maxnreg 32`, `40` and `64` gave exactly
//! the registers and spill bytes of 8, 6 and 4 blocks of 256 threads on every
//! tokenizer step, so a register cap adds no reach; the block count says what the
//! caller wants (occupancy), can be checked against the target's resident blocks and
//! threads ([`multiprocessor_limits`]; ptxas drops an unsatisfiable request with a
//! warning only, so code generation refuses it with
//! [`CodegenError::UnsatisfiableOccupancy`]), and needs no knowledge of the register
//! file or its allocation unit. A lane module ignores the option: its bodies are
//! device functions of one resident server whose block count the lane fixes.
//!
//! # Loops, atomics, local arrays
//!
//! - Both loops are rotated: one `bra` into the test, then each iteration is the
//!   body, the test and one conditional branch back (`$L_loop`/`$L_while` ...
//!   `$L_loop_test`/`$L_while_test`), so an iteration costs one compare and one branch
//!   (the `while_scan` snapshot). `continue` branches to the increment (`for`) or the
//!   test (`while`), `break` past the loop. With
//!   [`CodegenOptions::max_loop_iterations`](crate::CodegenOptions) set, each `while`
//!   iteration first counts itself and executes `trap` past the cap.
//! - Atomics that return nothing are `red` (a `sub` is an `add` of the negated
//!   operand, `exchange` an `atom.exch` whose result is dropped); fetches and
//!   compare-exchange are `atom`, their result register preset to 0 under a bounds
//!   guard.
//! - Local arrays are `.local` arrays declared in the kernel and zeroed by each
//!   thread at entry (unrolled stores up to 64 bytes, a loop beyond); ptxas keeps
//!   them in registers when it can resolve every index.
//! - Subgroup scans are five `shfl.sync.up` steps with the shuffle's in-range
//!   predicate selecting whether to combine (plus one more step for an exclusive
//!   scan).
//!
//! # Validation first, bounded output
//!
//! [`program_to_ptx`] runs [`crate::ir::validate_lowered`] (against
//! [`codegen_limits`]) before it looks at anything else, and returns the validator's
//! error ([`CodegenError::Invalid`]) for a program that fails it: a program nested
//! 10^6 deep gets `NestingTooDeep` instead of overflowing the stack, and a program
//! whose shared `Arc` blocks describe 2^64 nodes gets `TooManyNodes`. The writer then
//! relies on what the validator established (types, names, a static count for every
//! workgroup buffer, no [`Node::WorkgroupReduce`](crate::ir::Node::WorkgroupReduce):
//! run [`crate::lower::lower_workgroup_reductions`] first) instead of checking it
//! again. Its output is linear in the program's size: a comment holds at most
//! [`COMMENT_BYTES`] of its statement, and the module stops at [`MAX_PTX_BYTES`]
//! ([`CodegenError::TooLarge`]).
//!
//! Subgroup expressions are emitted with a full lane mask (`0xffffffff`), which is
//! correct because lowering only produces them when the workgroup's thread count is a
//! multiple of 32 and in uniform control flow, so every lane of every warp is active.
//! A program lowered for another subgroup size is refused
//! ([`CodegenError::LoweredForOtherSubgroupSize`]).
//!
//! [`Program`]: crate::ir::Program
//! [`Program::global_buffers`]: crate::ir::Program::global_buffers
//! [`Program::scalars`]: crate::ir::Program::scalars

use std::fmt;

use crate::config::CodegenOptions;
use crate::ir::{self, Limits, Program, ProgramForm, ValidProgram, ValidationError};

mod batch;
// The request record's layout is a contract between the backend's lane and the
// bodies this module writes, not part of the product: public only for the crate's
// own tests (the `testing` feature).
#[cfg(feature = "testing")]
pub mod lane;
#[cfg(not(feature = "testing"))]
pub(crate) mod lane;
pub mod workgroup_memory;
mod writer;

pub use batch::{module_entry_name, module_grid_barrier_symbol, ModuleEntry, PtxModuleBuilder};
pub use lane::{lane_body_name, LaneModuleBuilder, LANE_ENTRY_NAME};
pub use workgroup_memory::{dynamic_shared_bytes, DYNAMIC_SHARED_SYMBOL, MAX_STATIC_SHARED_BYTES};

/// Name of the single kernel of a module emitted from a program without an entry
/// op id ([`entry_symbol`]).
pub const ENTRY_NAME: &str = "vyre_entry";

/// Most bytes of an entry op id that [`entry_symbol`] keeps.
pub const ENTRY_SYMBOL_ID_BYTES: usize = 200;

/// The entry symbol of the one kernel of a module emitted from `program`:
/// [`ENTRY_NAME`] without an entry op id; with one, `vyre_entry__` followed by
/// its first [`ENTRY_SYMBOL_ID_BYTES`] bytes with every character but ASCII
/// letters, digits and `_` written as `_` (what a PTX identifier may hold). The
/// double underscore keeps it apart from every other symbol a module declares
/// (the batch modules' `vyre_entry_0`, `vyre_entry_1`, ... among them). The
/// backend loads the kernel by this name, so the two cannot disagree.
///
/// Why: every kernel was `vyre_entry`, so Nsight Compute, Nsight Systems and
/// compute-sanitizer listed a tokenizer encode's eight kernels under one name,
/// told apart only by launch order and grid size.
///
/// ```
/// # use vyre_cuda::ir::Program;
/// # use vyre_cuda::codegen::entry_symbol;
/// let program = Program::builder([32, 1, 1]).entry_op_id("bpe.merge").body(|_| {}).build();
/// assert_eq!(entry_symbol(&program), "vyre_entry__bpe_merge");
/// assert_eq!(entry_symbol(&program.with_entry_op_id("")), "vyre_entry");
/// ```
pub fn entry_symbol(program: &Program) -> std::borrow::Cow<'static, str> {
    match program.entry_op_id().filter(|id| !id.is_empty()) {
        None => ENTRY_NAME.into(),
        Some(id) => {
            let mut symbol = String::with_capacity(ENTRY_NAME.len() + 2 + id.len());
            symbol.push_str(ENTRY_NAME);
            symbol.push_str("__");
            symbol.extend(id.bytes().take(ENTRY_SYMBOL_ID_BYTES).map(|byte| {
                if byte.is_ascii_alphanumeric() || byte == b'_' {
                    byte as char
                } else {
                    '_'
                }
            }));
            symbol.into()
        }
    }
}

/// Module-scope `.global` symbol of the grid-barrier word (present only when the
/// program contains a grid sync). See the module docs for the protocol.
pub const GRID_BARRIER_SYMBOL: &str = "vyre_grid_barrier";

/// Number of `u32` words at [`GRID_BARRIER_SYMBOL`]; the backend zeroes them
/// before a launch unless the audit of the launch before left them settled.
pub const GRID_BARRIER_WORDS: usize = 1;

/// The bit of the grid-barrier word that flips once per completed phase; the bits
/// below it count the phase's arrivals and are 0 between phases.
pub const GRID_BARRIER_PHASE_BIT: u32 = 1 << 31;

/// Readback range descriptors a result-ABI kernel takes (`vyre_ranges`).
pub const RESULT_RANGE_SLOTS: usize = 16;

/// Oldest compute capability (as `major * 10 + minor`) the emitted PTX supports:
/// `shfl.sync`, `fence.acq_rel.gpu` and `ld.acquire` need Volta.
pub const MIN_SM: u32 = 70;

/// Oldest compute capability with `redux.sync`; older targets get a shuffle ladder.
pub const REDUX_MIN_SM: u32 = 80;

/// Most bytes of a statement copied into its `//` comment (the rest becomes `...`).
pub const COMMENT_BYTES: usize = 256;

/// Most bytes of kernel body one module may have. Every statement and expression
/// adds a bounded number of bytes, so this only stops programs whose shared blocks
/// expand to about 100,000 statements or more; a 4,096-node program (the largest
/// the seed comparison uses) emits less than a twentieth of it (a test checks).
pub const MAX_PTX_BYTES: usize = 16 << 20;

/// The limits [`program_to_ptx`] validates against: what every CUDA device has
/// (1024 threads per block, block axes up to 1024 × 1024 × 64, 32-lane warps). The
/// shared-memory bound only keeps sizes representable; the device's own, smaller
/// limits are the backend's to check.
pub fn codegen_limits() -> Limits {
    // Written out in full on purpose; limits added to `Limits` later keep their defaults.
    #[allow(clippy::needless_update)]
    Limits {
        max_threads_per_workgroup: 1024,
        max_workgroup_size: [1024, 1024, 64],
        // The largest multiple of 4: padded workgroup buffers still fit in a u32.
        max_shared_memory_bytes: !3,
        subgroup_size: 32,
        ..Limits::default()
    }
}

/// Why a program could not be turned into PTX. `Display` starts with `Fix:`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CodegenError {
    /// The program fails [`ir::validate_lowered`]; holds the validator's error (a
    /// workgroup reduction that was not lowered is `WorkgroupReduceNotLowered`).
    Invalid(ValidationError),
    /// The program was lowered for subgroups of another size.
    LoweredForOtherSubgroupSize {
        /// The subgroup size the program was lowered for.
        lowered_for: u32,
        /// The subgroup size code generation was asked for.
        subgroup_size: u32,
    },
    /// The module would be larger than [`MAX_PTX_BYTES`].
    TooLarge {
        /// The program's display name (capped).
        program: String,
        /// [`MAX_PTX_BYTES`].
        limit_bytes: usize,
    },
    /// [`PtxModuleBuilder::push`]: the program would take the module past
    /// [`MAX_PTX_BYTES`] (the module is unchanged; start another for it).
    ModuleFull {
        /// Kernels the module already holds.
        kernels: usize,
        /// [`MAX_PTX_BYTES`].
        limit_bytes: usize,
    },
    /// [`LaneModuleBuilder::push`]: the program cannot be a body of this lane (another
    /// workgroup shape, or a grid sync); the builder is unchanged.
    LaneBody {
        /// The program's display name (capped).
        program: String,
        /// What to change, after `Fix: `.
        reason: String,
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
    /// [`CodegenOptions::min_blocks_per_multiprocessor`] asks for an occupancy the
    /// target cannot give: 0 blocks, more blocks than a multiprocessor holds, or
    /// more threads ([`multiprocessor_limits`]). ptxas would drop such a request
    /// with a warning only, so code generation refuses it.
    UnsatisfiableOccupancy {
        /// The program's display name (capped).
        program: String,
        /// The blocks asked for.
        blocks: u32,
        /// Threads per workgroup of the program.
        threads_per_block: u32,
        /// The compute capability generated for.
        sm: u32,
    },
    /// The writer met something the validator should have refused: a bug in
    /// vyre-cuda, never a property of the input.
    Internal {
        /// What is inconsistent.
        detail: String,
    },
}

impl fmt::Display for CodegenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CodegenError::Invalid(error) => f.write_str(error.message()),
            CodegenError::LoweredForOtherSubgroupSize {
                lowered_for,
                subgroup_size,
            } => write!(
                f,
                "Fix: lower the program with LoweringCaps {{ subgroup_size: {subgroup_size}, .. }} \
                 (the target's warp size, e.g. DeviceCaps::lowering_caps); it was lowered for \
                 {lowered_for}-lane subgroups and would compute wrong reductions on {subgroup_size}"
            ),
            CodegenError::TooLarge {
                program,
                limit_bytes,
            } => write!(
                f,
                "Fix: split {program} into smaller kernels (or stop sharing one block in many \
                 places): its PTX passes {limit_bytes} bytes"
            ),
            CodegenError::ModuleFull {
                kernels,
                limit_bytes,
            } => write!(
                f,
                "Fix: finish this PTX module (it holds {kernels} kernels) and push the program into \
                 a new one: together they would pass {limit_bytes} bytes"
            ),
            CodegenError::LaneBody { program, reason } => {
                write!(f, "Fix: {reason} ({program})")
            }
            CodegenError::UnsupportedTarget { sm } => write!(
                f,
                "Fix: use a GPU of compute capability 7.0 (sm_{MIN_SM}) or newer; PTX \
                 generation was asked for sm_{sm}, which lacks shfl.sync and scoped fences"
            ),
            CodegenError::UnsupportedSubgroupSize { subgroup_size } => write!(
                f,
                "Fix: pass subgroup_size 32 (the CUDA warp size); {subgroup_size} is not supported"
            ),
            CodegenError::UnsatisfiableOccupancy {
                program,
                blocks,
                threads_per_block,
                sm,
            } => {
                let limits = multiprocessor_limits(*sm);
                let most = limits.most_blocks(*threads_per_block);
                if *blocks == 0 {
                    write!(
                        f,
                        "Fix: set CodegenOptions::min_blocks_per_multiprocessor to None or to 1..={most} \
                         for {program}; 0 blocks per multiprocessor asks for nothing"
                    )
                } else {
                    write!(
                        f,
                        "Fix: set CodegenOptions::min_blocks_per_multiprocessor to at most {most} for \
                         {program}: an sm_{sm} multiprocessor holds {} blocks and {} threads, and \
                         {blocks} blocks of {threads_per_block} threads do not fit (ptxas would \
                         ignore the request)",
                        limits.blocks, limits.threads
                    )
                }
            }
            CodegenError::Internal { detail } => write!(
                f,
                "Fix: report this program to vyre-cuda as a bug (the validator accepted it \
                 but the PTX writer cannot emit it): {detail}"
            ),
        }
    }
}

impl std::error::Error for CodegenError {}

/// Translate a lowered, validated program into a PTX module with one kernel
/// ([`ENTRY_NAME`]) for compute capability `sm` (`major * 10 + minor`).
///
/// Deterministic: the same program, options and target give the same bytes.
/// Errors for `sm < 70`, for `subgroup_size != 32`, for a program lowered for another
/// subgroup size, for a program that fails [`ir::validate_lowered`] against
/// [`codegen_limits`] (the validator's error, checked before any other walk: a
/// workgroup reduction that was not lowered is one), and for a module over
/// [`MAX_PTX_BYTES`].
pub fn program_to_ptx(
    program: &Program,
    options: &CodegenOptions,
    sm: u32,
    subgroup_size: u32,
) -> Result<String, CodegenError> {
    validate_and_emit(program, options, sm, subgroup_size, false)
}

/// The target checks, then validation in the lowered form against
/// [`codegen_limits`], then the writer (`results`: with the result ABI).
fn validate_and_emit(
    program: &Program,
    options: &CodegenOptions,
    sm: u32,
    subgroup_size: u32,
    results: bool,
) -> Result<String, CodegenError> {
    check_target(program, sm, subgroup_size)?;
    // Not memoised: the program's memo slot belongs to the limits its user validates
    // against (see `lower::lower_valid`); this runs on a PTX cache miss only.
    let valid = ir::validate_unmemoised(program, &codegen_limits(), ProgramForm::Lowered)
        .map_err(CodegenError::Invalid)?;
    writer::Writer::new(&valid, *options, sm, results).finish()
}

/// [`program_to_ptx`] for a program the validator already accepted in the lowered
/// form (for example from [`crate::lower::lower_valid`]): nothing is validated again.
/// A program checked in the user form is validated in the lowered form (against its
/// own limits) first, since code generation cannot emit a workgroup reduction.
pub fn valid_program_to_ptx(
    program: &ValidProgram,
    options: &CodegenOptions,
    sm: u32,
    subgroup_size: u32,
) -> Result<String, CodegenError> {
    check_target(program, sm, subgroup_size)?;
    if program.form() == ProgramForm::Lowered {
        return writer::Writer::new(program, *options, sm, false).finish();
    }
    let valid = ir::validate_lowered(program, program.limits()).map_err(CodegenError::Invalid)?;
    writer::Writer::new(&valid, *options, sm, false).finish()
}

/// The target checks: sm, subgroup size, and the size the program was lowered for.
fn check_target(program: &Program, sm: u32, subgroup_size: u32) -> Result<(), CodegenError> {
    if sm < MIN_SM {
        return Err(CodegenError::UnsupportedTarget { sm });
    }
    if subgroup_size != 32 {
        return Err(CodegenError::UnsupportedSubgroupSize { subgroup_size });
    }
    if let Some(lowered_for) = crate::lower::lowered_subgroup_size(program) {
        if lowered_for != subgroup_size {
            return Err(CodegenError::LoweredForOtherSubgroupSize {
                lowered_for,
                subgroup_size,
            });
        }
    }
    Ok(())
}

/// [`program_to_ptx`] with the result ABI (see the module docs): the kernel stamps
/// its own device time and its last thread copies up to [`RESULT_RANGE_SLOTS`]
/// readback ranges into host-mapped memory. The CUDA backend compiles every program
/// this way; [`program_to_ptx`] stays the plain ABI (the PTX snapshots, the raw floor).
/// It validates first, exactly as [`program_to_ptx`] does.
pub fn program_to_ptx_with_results(
    program: &Program,
    options: &CodegenOptions,
    sm: u32,
    subgroup_size: u32,
) -> Result<String, CodegenError> {
    validate_and_emit(program, options, sm, subgroup_size, true)
}

/// What one multiprocessor of a target holds at once, the bounds of
/// [`CodegenOptions::min_blocks_per_multiprocessor`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MultiprocessorLimits {
    /// Resident blocks (workgroups).
    pub blocks: u32,
    /// Resident threads.
    pub threads: u32,
    /// 32-bit registers, shared by the resident threads.
    pub registers: u32,
}

impl MultiprocessorLimits {
    /// The most blocks of `threads_per_block` threads that fit at once (at least 1
    /// for any block a target launches).
    pub fn most_blocks(&self, threads_per_block: u32) -> u32 {
        self.blocks
            .min(self.threads / threads_per_block.max(1))
            .max(1)
    }

    /// The most blocks of `threads_per_block` threads that fit at once when each
    /// thread keeps `registers_per_thread` registers: what to ask
    /// [`CodegenOptions::min_blocks_per_multiprocessor`] for so that ptxas leaves a
    /// body needing that many registers alone (at least 1).
    pub fn blocks_for_registers(&self, registers_per_thread: u32, threads_per_block: u32) -> u32 {
        let per_block =
            u64::from(registers_per_thread.max(1)) * u64::from(threads_per_block.max(1));
        let fit = u64::from(self.registers) / per_block;
        (fit.min(u64::from(self.most_blocks(threads_per_block))) as u32).max(1)
    }

    /// Whether `blocks` blocks of `threads_per_block` threads fit at once.
    pub fn holds(&self, blocks: u32, threads_per_block: u32) -> bool {
        (1..=self.blocks).contains(&blocks)
            && u64::from(blocks) * u64::from(threads_per_block) <= u64::from(self.threads)
    }
}

/// What one multiprocessor of compute capability `sm` holds (the CUDA
/// programming guide's table of technical specifications): 32 blocks and 2048
/// threads on 7.0, 8.0, 9.0 and 10.x; 16 and 1024 on 7.5; 16 and 1536 on 8.6 and
/// 8.7; 24 and 1536 on 8.9; 32 and 1536 on 12.x; 65,536 registers on all. A
/// target the table does not know gets 32 and 2048, the most any has: a request
/// past its real limits then reaches ptxas, which drops it with a warning rather
/// than fail.
pub fn multiprocessor_limits(sm: u32) -> MultiprocessorLimits {
    let (blocks, threads) = match sm {
        75 => (16, 1024),
        86 | 87 => (16, 1536),
        89 => (24, 1536),
        120..=129 => (32, 1536),
        _ => (32, 2048),
    };
    MultiprocessorLimits {
        blocks,
        threads,
        registers: 65_536,
    }
}

/// The PTX ISA version the module declares for a target: 7.8 covers everything up to
/// `sm_90`, but for a module with an acquire-only fence (`fence.acquire.sys`,
/// [`acquire_only`]), which needs 8.6; newer targets need the first version that
/// knows them.
pub(crate) fn ptx_version(sm: u32, acquire_only_fences: bool) -> &'static str {
    match sm {
        90 if acquire_only_fences => "8.6",
        0..=90 => "7.8",
        91..=101 => "8.6",
        102..=120 => "8.7",
        _ => "8.8",
    }
}

/// Whether an acquire load on `sm` under `options` ends with `fence.acquire.sys`
/// (PTX ISA 8.6, `sm_90` and newer) instead of `fence.acq_rel.sys`.
pub(crate) fn acquire_only(sm: u32, options: &CodegenOptions) -> bool {
    options.acquire_fence == crate::config::AcquireFence::AcquireOnly && sm >= 90
}
