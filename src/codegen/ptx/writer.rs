//! The PTX writer: the one struct that owns the text being written, the register and
//! label counters and the variable scopes while a program is walked once, front to back.
//!
//! Instruction selection is deliberately literal: every expression gets fresh virtual
//! registers and `ptxas` does the register allocation and clean-up. What this file
//! must get exactly right is semantics, so every operator whose PTX instruction differs
//! from the IR's definition (integer division, shifts, `f32` negation and absolute
//! value, float-to-integer casts, `bool` selects) is spelled out with the guard that
//! makes it agree bit for bit with the reference interpreter. And because the
//! driver's JIT optimises the PTX again, constants are hidden from it (`opaque_zero`):
//! its constant folder rounds some `f32` ties wrongly and its three-input min/max
//! fusion drops a negation (measured on the H200, differential seeds 1008915 and
//! 1007798; tests/jit_folding.rs).

use std::collections::HashMap;
use std::fmt::{self, Display, Write};

use crate::config::CodegenOptions;
use crate::ir::{
    Access, AtomicOp, BinaryOp, Block, BufferCount, BufferDecl, Builtin, Expr, Literal, Node,
    Program, ReduceOp, ScalarType, ScanKind, UnaryOp, ValidProgram,
};

use super::workgroup_memory::{self, DYNAMIC_SHARED_SYMBOL};
use super::{
    acquire_only, ptx_version, CodegenError, COMMENT_BYTES, GRID_BARRIER_PHASE_BIT,
    GRID_BARRIER_SYMBOL, GRID_BARRIER_WORDS, MAX_PTX_BYTES, REDUX_MIN_SM, RESULT_RANGE_SLOTS,
};

type Result<T> = std::result::Result<T, CodegenError>;

/// Append one indented instruction line to the body. Writing into a `String` cannot fail.
macro_rules! emit {
    ($writer:expr, $($arg:tt)*) => {{
        $writer.body.push('\t');
        let _ = writeln!($writer.body, $($arg)*);
    }};
}

mod results;

use results::{RESULTS_LABEL, RESULT_PARAMETERS};

use super::lane::{
    lane_body_name, pool_place, record_scalar_at, LANE_GROUP_PARAMETERS, LANE_RECORD_PARAMETER,
    LANE_WORKGROUP_SYMBOL, RECORD_BINDINGS_AT, RECORD_BINDING_BYTES, RECORD_GRID,
};

/// Full-warp member mask for `.sync` warp instructions (see the module docs of `ptx`
/// for why every lane is active wherever lowering emits them).
const FULL_WARP: &str = "0xffffffff";

/// Most strides of a workgroup buffer that the kernel's prologue clears with
/// straight-line stores (a thread's share of a larger buffer is cleared by a loop):
/// 32 stores a thread at most, 128 bytes.
const MAX_UNROLLED_ZERO_ROUNDS: u32 = 32;

/// PTX register classes; the prefix tells a reader the type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RegClass {
    Pred,
    B32,
    F32,
    B64,
}

impl RegClass {
    const ALL: [RegClass; 4] = [RegClass::Pred, RegClass::B32, RegClass::F32, RegClass::B64];

    const fn slot(self) -> usize {
        match self {
            RegClass::Pred => 0,
            RegClass::B32 => 1,
            RegClass::F32 => 2,
            RegClass::B64 => 3,
        }
    }

    const fn prefix(self) -> &'static str {
        match self {
            RegClass::Pred => "%p",
            RegClass::B32 => "%r",
            RegClass::F32 => "%f",
            RegClass::B64 => "%rd",
        }
    }

    /// The `.reg` declaration type, also the `mov` suffix.
    const fn ptx_type(self) -> &'static str {
        match self {
            RegClass::Pred => "pred",
            RegClass::B32 => "b32",
            RegClass::F32 => "f32",
            RegClass::B64 => "b64",
        }
    }

    const fn of(ty: ScalarType) -> RegClass {
        match ty {
            ScalarType::U32 | ScalarType::I32 => RegClass::B32,
            ScalarType::F32 => RegClass::F32,
            ScalarType::Bool => RegClass::Pred,
            ScalarType::U64 | ScalarType::I64 => RegClass::B64,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Reg {
    class: RegClass,
    index: u32,
}

impl Display for Reg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.class.prefix(), self.index)
    }
}

/// A computed expression: the register holding it and its IR type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Value {
    reg: Reg,
    ty: ScalarType,
}

impl Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.reg.fmt(f)
    }
}

/// An optional `@%pN ` instruction guard (bounds checks).
struct Guard(Option<Reg>);

impl Display for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(p) => write!(f, "@{p} "),
            None => Ok(()),
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Label {
    kind: &'static str,
    number: u32,
}

impl Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "$L_{}_{}", self.kind, self.number)
    }
}

/// The parts of an atomic node the writer emits (`op` is `None` for a
/// compare-exchange, which has `expected`).
struct AtomicNode<'p> {
    op: Option<AtomicOp>,
    buffer: &'p str,
    index: &'p Expr,
    expected: Option<&'p Expr>,
    value: &'p Expr,
}

/// Where `break` and `continue` of one loop branch to.
#[derive(Clone, Copy, Debug)]
struct LoopTargets {
    exit: Label,
    next: Label,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Space {
    Global,
    Shared,
    Local,
}

impl Space {
    const fn name(self) -> &'static str {
        match self {
            Space::Global => "global",
            Space::Shared => "shared",
            Space::Local => "local",
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Length {
    Constant(u32),
    Register(Reg),
}

impl Display for Length {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Length::Constant(n) => write!(f, "{n}"),
            Length::Register(r) => r.fmt(f),
        }
    }
}

/// What the kernel knows about one buffer once the prologue ran.
struct BufferSlot<'p> {
    decl: &'p BufferDecl,
    space: Space,
    /// 64-bit base address (global, or in the shared window).
    base: Reg,
    length: Length,
    /// For workgroup buffers and local arrays: the `.shared` or `.local` symbol and
    /// its padded size in bytes.
    symbol: Option<(String, u32)>,
}

/// Walks one program once and produces its PTX module.
pub(super) struct Writer<'p> {
    program: &'p Program,
    options: CodegenOptions,
    sm: u32,
    /// Kernel body instructions (the header and declarations are added by `finish`).
    body: String,
    reg_counts: [u32; 4],
    labels: u32,
    buffers: Vec<BufferSlot<'p>>,
    buffer_lookup: HashMap<&'p str, usize>,
    /// Each scalar parameter's register, loaded once in the prologue.
    scalars: HashMap<&'p str, Value>,
    variables: HashMap<&'p str, Value>,
    /// Declarations in order, with the binding each one hid, so leaving a block
    /// restores exactly the outer scope.
    scope_log: Vec<(&'p str, Option<Value>)>,
    uses_grid_sync: bool,
    /// An acquire load ended with `fence.acquire.sys`, which the module's PTX
    /// version must admit ([`ptx_version`]).
    acquire_only_fences: bool,
    /// A `b32` register holding 0 loaded from [`OPAQUE_ZERO_SYMBOL`]: the driver's JIT
    /// cannot know its value, so it cannot constant-fold through it (see
    /// [`Writer::opaque_bits`], [`Writer::opaque_copy`] and [`Writer::negate`]).
    opaque_zero: Reg,
    /// Emit the result ABI (`super::results`): start stamps, the finish count and the
    /// last thread's stamps and readback copies into host-mapped memory.
    results: bool,
    /// The body synchronises lanes or threads (barriers, subgroup operations), so the
    /// result epilogue must not hold early-returned lanes back (see `results`).
    synchronises: bool,
    /// The result prologue's start time register (written by local thread 0).
    result_start: Option<Reg>,
    /// The result epilogue counts finished threads per block first, in a shared
    /// word the prologue zeroes (`results`).
    block_counter: bool,
    /// The loops around the statement being written, innermost last: where a `break`
    /// and a `continue` of each one branch to.
    loops: Vec<LoopTargets>,
    /// `Some(index)`: this is kernel `index` of a module of several kernels
    /// (`super::batch`): its entry and module-scope symbols carry the index and the
    /// module header is written once by the module, not here.
    module_kernel: Option<usize>,
    /// Lane mode (`super::lane`) when `Some`: the program is written as the device
    /// function of body `module_kernel` of a lane's server kernel. Its buffer
    /// addresses, lengths, scalar values and workgroup count come from the request
    /// record in shared memory, whose address this register holds (the server passes
    /// it: its two record copies change roles by address), its workgroup id from the
    /// function's parameters, and its workgroup buffers live in the lane's one shared
    /// pool (`lane_workgroup_bytes` is where they end).
    lane_record: Option<Reg>,
    lane_workgroup_bytes: u32,
    /// A lane body's barrier count: `Some(n)` when the lane's blocks hold threads
    /// beyond the workgroup's (its doorbell pollers), so a barrier names the `n`
    /// threads of the workgroup's warps; `None` when the block is the workgroup.
    lane_barrier_threads: Option<u32>,
    /// Bytes of the kernel's dynamic shared-memory pool, 0 when its workgroup
    /// buffers are static arrays (`super::workgroup_memory`; never in lane mode).
    dynamic_shared_bytes: u32,
}

/// A `.const` word that is always 0. The host could rewrite a `.const` variable
/// (cuModuleGetGlobal), so the JIT must load it: values mixed with it stay run-time
/// values. Measured need (H200 driver and ptxas 12.9, `gpu_differential` seeds
/// 1007798 and 1008915): the JIT's constant folder rounds an `f32` add/sub whose exact
/// result is a tie the wrong way (`-26627844.0 - -1.0` folds to `-26627842.0`, the
/// hardware gives `-26627844.0`), and its three-input min/max fusion drops a
/// negation (`max(a, max(x, -x))` became `max(a, x, x)`).
pub(crate) const OPAQUE_ZERO_SYMBOL: &str = "vyre_opaque_zero";

impl<'p> Writer<'p> {
    /// A writer for a program checked in the lowered form (the caller guarantees the
    /// form: `ValidProgram` carries the verdict, this module checks which one).
    /// `results` emits the result ABI (`super::results`).
    pub(super) fn new(
        program: &'p ValidProgram,
        options: CodegenOptions,
        sm: u32,
        results: bool,
    ) -> Self {
        let program: &'p Program = program;
        Writer {
            program,
            options,
            sm,
            body: String::with_capacity(4096),
            reg_counts: [0; 4],
            labels: 0,
            buffers: Vec::with_capacity(program.buffers().len()),
            buffer_lookup: HashMap::with_capacity(program.buffers().len()),
            scalars: HashMap::with_capacity(program.scalars().len()),
            variables: HashMap::new(),
            scope_log: Vec::new(),
            uses_grid_sync: false,
            acquire_only_fences: false,
            opaque_zero: Reg {
                class: RegClass::B32,
                index: 0,
            },
            results,
            synchronises: false,
            result_start: None,
            block_counter: false,
            loops: Vec::new(),
            module_kernel: None,
            lane_record: None,
            lane_workgroup_bytes: 0,
            lane_barrier_threads: None,
            dynamic_shared_bytes: 0,
        }
    }

    /// The same writer, writing kernel `index` of a module of several kernels.
    pub(super) fn for_module_kernel(mut self, index: usize) -> Self {
        self.module_kernel = Some(index);
        self
    }

    /// The same writer, writing the program as body `index` of a lane (see the
    /// `lane` field) whose barriers count `barrier_threads` threads (see the
    /// `lane_barrier_threads` field); no result ABI.
    pub(super) fn for_lane_body(mut self, index: usize, barrier_threads: Option<u32>) -> Self {
        self.module_kernel = Some(index);
        self.lane_record = Some(self.reg(RegClass::B64));
        self.lane_barrier_threads = barrier_threads;
        self.results = false;
        self
    }

    /// Whether the program is written as a lane body (see the `lane_record` field).
    fn is_lane(&self) -> bool {
        self.lane_record.is_some()
    }

    /// Write a lane body: its `.func` text and the bytes of the lane's workgroup
    /// pool it uses (its workgroup buffers, laid out from the pool's start).
    pub(super) fn finish_lane_body(mut self) -> Result<(String, u32, KernelFacts)> {
        let program: &'p Program = self.program;
        self.prologue();
        self.block(program.entry())?;
        emit!(self, "ret;");
        let bytes = self.lane_workgroup_bytes;
        let facts = self.facts();
        Ok((self.assemble(), bytes, facts))
    }

    /// What the module around this kernel must know of it.
    fn facts(&self) -> KernelFacts {
        KernelFacts {
            uses_grid_sync: self.uses_grid_sync,
            acquire_only_fences: self.acquire_only_fences,
        }
    }

    /// Write the whole module.
    pub(super) fn finish(self) -> Result<String> {
        self.finish_kernel().map(|(text, _)| text)
    }

    /// Write the kernel (for a standalone kernel, the whole module); also says
    /// what the module around it must know of it ([`KernelFacts`]).
    pub(super) fn finish_kernel(mut self) -> Result<(String, KernelFacts)> {
        let program: &'p Program = self.program;
        self.check_occupancy()?;
        self.prologue();
        if self.results {
            self.result_prologue();
        }
        self.block(program.entry())?;
        if self.results {
            self.result_epilogue();
        } else {
            emit!(self, "ret;");
        }
        let facts = self.facts();
        Ok((self.assemble(), facts))
    }

    /// Refuses an occupancy request the target cannot hold
    /// ([`CodegenError::UnsatisfiableOccupancy`]): ptxas would only warn and drop it.
    fn check_occupancy(&self) -> Result<()> {
        let Some(blocks) = self.options.min_blocks_per_multiprocessor else {
            return Ok(());
        };
        let threads_per_block = self.program.workgroup_size().iter().product::<u32>();
        if super::multiprocessor_limits(self.sm).holds(blocks, threads_per_block) {
            return Ok(());
        }
        Err(CodegenError::UnsatisfiableOccupancy {
            program: self.program.display_name(),
            blocks,
            threads_per_block,
            sm: self.sm,
        })
    }

    // ----- registers, labels, scopes -------------------------------------------------

    fn reg(&mut self, class: RegClass) -> Reg {
        let counter = &mut self.reg_counts[class.slot()];
        let index = *counter;
        *counter += 1;
        Reg { class, index }
    }

    fn value(&mut self, ty: ScalarType) -> Value {
        Value {
            reg: self.reg(RegClass::of(ty)),
            ty,
        }
    }

    fn label(&mut self, kind: &'static str) -> Label {
        self.labels += 1;
        Label {
            kind,
            number: self.labels,
        }
    }

    fn place(&mut self, label: Label) {
        let _ = writeln!(self.body, "{label}:");
    }

    fn bind(&mut self, name: &'p str, value: Value) {
        let hidden = self.variables.insert(name, value);
        self.scope_log.push((name, hidden));
    }

    fn variable(&self, name: &str) -> Result<Value> {
        self.variables
            .get(name)
            .copied()
            .ok_or_else(|| internal(format_args!("variable `{}` has no register", capped(name))))
    }

    fn buffer(&self, name: &str) -> Result<usize> {
        self.buffer_lookup
            .get(name)
            .copied()
            .ok_or_else(|| internal(format_args!("buffer `{}` has no slot", capped(name))))
    }

    // ----- prologue and module text ----------------------------------------------------

    /// Load parameters, take shared-memory addresses and zero workgroup memory.
    fn prologue(&mut self) {
        let program: &'p Program = self.program;
        self.opaque_zero = self.reg(RegClass::B32);
        emit!(
            self,
            "ld.const.u32 {}, [{OPAQUE_ZERO_SYMBOL}]; // 0, unknown to the JIT",
            self.opaque_zero
        );
        if let Some(record) = self.lane_record {
            let (parameter, _) = LANE_RECORD_PARAMETER;
            emit!(self, "ld.param.u64 {record}, [{parameter}];");
        }
        let globals = program.global_buffers();
        if !globals.is_empty() {
            emit!(self, "// buffer addresses and lengths");
        }
        for (position, decl) in globals.into_iter().enumerate() {
            let base = self.reg(RegClass::B64);
            // A lane body reads its binding from the request record (in shared
            // memory): the address, then the element count 8 bytes on.
            let entry = RECORD_BINDINGS_AT + RECORD_BINDING_BYTES * position;
            if let Some(record) = self.lane_record {
                emit!(self, "ld.shared.u64 {base}, [{record}+{entry}];");
            } else {
                emit!(self, "ld.param.u64 {base}, [vyre_ptr_{position}];");
            }
            emit!(self, "cvta.to.global.u64 {base}, {base};");
            let length = match decl.count {
                BufferCount::Static(count) => Length::Constant(count),
                BufferCount::Runtime => {
                    let r = self.reg(RegClass::B32);
                    if let Some(record) = self.lane_record {
                        emit!(self, "ld.shared.u32 {r}, [{record}+{}];", entry + 8);
                    } else {
                        emit!(self, "ld.param.u32 {r}, [vyre_len_{position}];");
                    }
                    Length::Register(r)
                }
            };
            self.add_buffer(BufferSlot {
                decl,
                space: Space::Global,
                base,
                length,
                symbol: None,
            });
        }

        self.load_scalars();
        let workgroup_buffers = self.declare_arrays(Space::Shared);
        // The block counter's zero is stored before the entry barrier, which
        // workgroup memory's zeroing ends with (or which the counter brings).
        let block_counter = self.results && self.zero_block_counter();
        if workgroup_buffers {
            self.zero_workgroup_memory();
        } else if block_counter {
            self.workgroup_barrier();
        }
        if self.declare_arrays(Space::Local) {
            self.zero_local_arrays();
        }
    }

    /// Each scalar parameter into a register of its type, once (a `bool` arrives as
    /// a `.u32` 0 or 1). Parameters the body never reads cost nothing: ptxas drops
    /// the load. A lane body reads the same word from the request record (the host
    /// writes it where [`record_scalar_at`] says) instead of a kernel parameter.
    fn load_scalars(&mut self) {
        let program: &'p Program = self.program;
        if !program.scalars().is_empty() {
            emit!(self, "// scalar parameters");
        }
        let bindings = program.global_buffers().len();
        for (position, decl) in program.scalars().iter().enumerate() {
            let value = self.value(decl.ty);
            let (space, source) = if let Some(record) = self.lane_record {
                let at = record_scalar_at(bindings, position);
                ("shared", format!("{record}+{at}"))
            } else {
                ("param", format!("vyre_scalar_{position}"))
            };
            match decl.ty {
                ScalarType::Bool => {
                    let word = self.reg(RegClass::B32);
                    emit!(self, "ld.{space}.u32 {word}, [{source}];");
                    emit!(self, "setp.ne.u32 {value}, {word}, 0;");
                }
                ty => emit!(
                    self,
                    "ld.{space}.{} {value}, [{source}];",
                    scalar_parameter_type(ty)
                ),
            }
            self.scalars.insert(&decl.name, value);
        }
    }

    /// The workgroup buffers (`Space::Shared`) or local arrays (`Space::Local`), in
    /// binding order: a symbol each and its address in a register. Says whether
    /// there were any.
    fn declare_arrays(&mut self, space: Space) -> bool {
        let access = match space {
            Space::Shared => Access::Workgroup,
            Space::Local => Access::Local,
            Space::Global => return false,
        };
        // Workgroup buffers carry their offset in the kernel's dynamic pool, used
        // only when the pool is (`super::workgroup_memory`).
        let program: &'p Program = self.program;
        let arrays: Vec<(&'p BufferDecl, u32)> = if space == Space::Shared {
            let (placed, bytes) = workgroup_memory::layout(program);
            if !self.is_lane() {
                self.dynamic_shared_bytes = workgroup_memory::pool_at_launch(bytes);
            }
            placed
        } else {
            let mut arrays: Vec<(&'p BufferDecl, u32)> = program
                .buffers()
                .iter()
                .filter(|b| b.access == access)
                .map(|decl| (decl, 0))
                .collect();
            arrays.sort_by_key(|(b, _)| b.binding);
            arrays
        };
        let any = !arrays.is_empty();
        for (position, (decl, pool_offset)) in arrays.into_iter().enumerate() {
            // Validated: workgroup buffers and local arrays have a static count, and
            // their sizes fit in `codegen_limits().max_shared_memory_bytes` (a multiple
            // of 4 below u32::MAX) and `MAX_LOCAL_ARRAY_BYTES`.
            let count = match decl.count {
                BufferCount::Static(count) => count,
                BufferCount::Runtime => 0,
            };
            let padded = u32::try_from(decl.padded_size_bytes()).unwrap_or(!3);
            let kind = space.name();
            // A `.local` symbol is the kernel's own; `.shared` ones are module-scope,
            // so a kernel of a module of several gets its own names.
            let module_kernel = self.module_kernel.filter(|_| space == Space::Shared);
            let symbol = match module_kernel {
                None => format!("vyre_{kind}_{position}_{}", identifier_part(&decl.name)),
                Some(kernel) => {
                    format!(
                        "vyre_{kind}_{kernel}_{position}_{}",
                        identifier_part(&decl.name)
                    )
                }
            };
            let base = self.reg(RegClass::B64);
            if self.is_lane() && space == Space::Shared {
                // The lane's one pool: this body's buffers from its start, each
                // aligned for its elements.
                let (offset, end) = pool_place(self.lane_workgroup_bytes, decl);
                self.lane_workgroup_bytes = end;
                emit!(self, "mov.u64 {base}, {LANE_WORKGROUP_SYMBOL};");
                if offset > 0 {
                    emit!(self, "add.s64 {base}, {base}, {offset};");
                }
            } else if space == Space::Shared && self.dynamic_shared_bytes > 0 {
                emit!(self, "mov.u64 {base}, {};", self.dynamic_shared_symbol());
                if pool_offset > 0 {
                    emit!(self, "add.s64 {base}, {base}, {pool_offset};");
                }
            } else {
                emit!(self, "mov.u64 {base}, {symbol};");
            }
            self.add_buffer(BufferSlot {
                decl,
                space,
                base,
                length: Length::Constant(count),
                symbol: Some((symbol, padded)),
            });
        }
        any
    }

    /// Each thread clears its own local arrays, so a read before any write sees 0
    /// as in the reference interpreter: unrolled stores for arrays of up to 64
    /// bytes, a loop for larger ones.
    fn zero_local_arrays(&mut self) {
        emit!(self, "// zero this thread's local arrays");
        for position in 0..self.buffers.len() {
            let slot = &self.buffers[position];
            let (base, bytes) = match (&slot.symbol, slot.space) {
                (Some((_, bytes)), Space::Local) => (slot.base, *bytes),
                _ => continue,
            };
            if bytes <= 64 {
                for offset in (0..bytes).step_by(4) {
                    emit!(self, "st.local.u32 [{base}+{offset}], 0;");
                }
                continue;
            }
            let offset = self.reg(RegClass::B32);
            emit!(self, "mov.u32 {offset}, 0;");
            let top = self.label("zero_local");
            self.place(top);
            let wide = self.reg(RegClass::B64);
            let address = self.reg(RegClass::B64);
            emit!(self, "cvt.u64.u32 {wide}, {offset};");
            emit!(self, "add.s64 {address}, {base}, {wide};");
            emit!(self, "st.local.u32 [{address}], 0;");
            emit!(self, "add.u32 {offset}, {offset}, 4;");
            let more = self.reg(RegClass::Pred);
            emit!(self, "setp.lt.u32 {more}, {offset}, {bytes};");
            emit!(self, "@{more} bra {top};");
        }
    }

    /// Validated: buffer names are unique.
    fn add_buffer(&mut self, slot: BufferSlot<'p>) {
        self.buffer_lookup
            .insert(&slot.decl.name, self.buffers.len());
        self.buffers.push(slot);
    }

    /// Every thread clears a strided share of each workgroup buffer, then the workgroup
    /// waits, so reads before writes see 0 as in the reference interpreter.
    ///
    /// A buffer of at most [`MAX_UNROLLED_ZERO_ROUNDS`] strides is cleared by
    /// straight-line stores (the last stride's predicated on the thread's offset),
    /// a larger one by a loop. A fused kernel declares tens of buffers, most of a few
    /// words (the workgroup reductions' trees): with a loop each, the 1 KiB
    /// short-text kernel of the tokenizer spent about 6 % of its warp samples before
    /// its first step (Nsight Compute on an H100, 2026-12-05: 2,598 of its 48,039
    /// warp instructions, its first warp alone running every small buffer's loop
    /// while the other seven waited at the barrier).
    fn zero_workgroup_memory(&mut self) {
        // Validated: at most `codegen_limits().max_threads_per_workgroup` (1024) threads.
        let threads = self.program.threads_per_workgroup().unwrap_or(1).max(1);
        let stride = threads.saturating_mul(4);
        emit!(
            self,
            "// zero workgroup memory, then wait for the whole workgroup"
        );
        let linear = self.local_linear_id();
        let offset = self.reg(RegClass::B32);
        emit!(self, "shl.b32 {offset}, {linear}, 2;");
        let wide = self.reg(RegClass::B64);
        emit!(self, "cvt.u64.u32 {wide}, {offset};");
        for position in 0..self.buffers.len() {
            let slot = &self.buffers[position];
            let (base, bytes) = match (&slot.symbol, slot.space) {
                (Some((_, bytes)), Space::Shared) => (slot.base, *bytes),
                _ => continue,
            };
            if bytes == 0 {
                continue;
            }
            let address = self.reg(RegClass::B64);
            emit!(self, "add.s64 {address}, {base}, {wide};");
            if bytes.div_ceil(stride) <= MAX_UNROLLED_ZERO_ROUNDS {
                for from in (0..bytes).step_by(stride as usize) {
                    let target = match from {
                        0 => format!("[{address}]"),
                        _ => format!("[{address}+{from}]"),
                    };
                    let left = bytes - from;
                    if left >= stride {
                        emit!(self, "st.shared.u32 {target}, 0;");
                    } else {
                        let inside = self.reg(RegClass::Pred);
                        emit!(self, "setp.lt.u32 {inside}, {offset}, {left};");
                        emit!(self, "@{inside} st.shared.u32 {target}, 0;");
                    }
                }
                continue;
            }
            let at = self.reg(RegClass::B32);
            emit!(self, "mov.u32 {at}, {offset};");
            let top = self.label("zero");
            let done = self.label("zero_done");
            self.place(top);
            let past = self.reg(RegClass::Pred);
            emit!(self, "setp.ge.u32 {past}, {at}, {bytes};");
            emit!(self, "@{past} bra {done};");
            emit!(self, "st.shared.u32 [{address}], 0;");
            emit!(self, "add.s64 {address}, {address}, {stride};");
            emit!(self, "add.u32 {at}, {at}, {stride};");
            emit!(self, "bra {top};");
            self.place(done);
        }
        self.workgroup_barrier();
    }

    /// Barrier 0 over the workgroup. A kernel's workgroup enters converged and the
    /// validator keeps barriers out of divergent code, so a launch uses the aligned
    /// `bar.sync`. A lane body is called once per workgroup from the server's loop,
    /// and threads that returned early from the previous workgroup's body need not
    /// have reconverged with the rest of their warp by the next call (the H200 hung on
    /// the aligned form there); the non-aligned `barrier.sync` lets each thread of a
    /// diverged warp arrive on its own. In a lane whose blocks also hold doorbell
    /// pollers, the barrier counts the workgroup's warps only (the pollers never
    /// arrive).
    fn workgroup_barrier(&mut self) {
        if let Some(threads) = self.lane_barrier_threads {
            emit!(self, "barrier.sync 0, {threads};");
        } else if self.is_lane() {
            emit!(self, "barrier.sync 0;");
        } else {
            emit!(self, "bar.sync 0;");
        }
    }

    /// `tid.x + ntid.x * (tid.y + ntid.y * tid.z)` with the (required) block shape.
    fn local_linear_id(&mut self) -> Reg {
        let [x, y, z] = self.program.workgroup_size();
        let tid_x = self.special("tid", "x");
        if y == 1 && z == 1 {
            return tid_x;
        }
        let tid_y = self.special("tid", "y");
        let tid_z = self.special("tid", "z");
        let plane = self.reg(RegClass::B32);
        let linear = self.reg(RegClass::B32);
        emit!(self, "mad.lo.u32 {plane}, {tid_z}, {y}, {tid_y};");
        emit!(self, "mad.lo.u32 {linear}, {plane}, {x}, {tid_x};");
        linear
    }

    /// [`super::entry_symbol`] of the program, or kernel `index`'s own in a module of
    /// several kernels.
    fn entry_name(&self) -> std::borrow::Cow<'static, str> {
        match self.module_kernel {
            None => super::entry_symbol(self.program),
            Some(kernel) if self.is_lane() => lane_body_name(kernel).into(),
            Some(kernel) => super::module_entry_name(kernel).into(),
        }
    }

    /// [`GRID_BARRIER_SYMBOL`], or kernel `index`'s own in a module of several kernels.
    fn grid_barrier_symbol(&self) -> std::borrow::Cow<'static, str> {
        match self.module_kernel {
            None => GRID_BARRIER_SYMBOL.into(),
            Some(kernel) => super::module_grid_barrier_symbol(kernel).into(),
        }
    }

    /// [`DYNAMIC_SHARED_SYMBOL`], or kernel `index`'s own in a module of several
    /// kernels (one `.extern` name per kernel: each is declared once in a module).
    fn dynamic_shared_symbol(&self) -> std::borrow::Cow<'static, str> {
        match self.module_kernel {
            None => DYNAMIC_SHARED_SYMBOL.into(),
            Some(kernel) => format!("{DYNAMIC_SHARED_SYMBOL}_{kernel}").into(),
        }
    }

    fn special(&mut self, register: &str, axis: &str) -> Reg {
        let r = self.reg(RegClass::B32);
        emit!(self, "mov.u32 {r}, %{register}.{axis};");
        r
    }

    /// Header, declarations and body, in one allocation.
    fn assemble(self) -> String {
        let program = self.program;
        let globals = program.global_buffers();
        let mut out = String::with_capacity(self.body.len() + 1024 + 128 * self.buffers.len());
        out.push_str("//\n");
        match program.entry_op_id() {
            Some(id) => push_comment(&mut out, "", format_args!("vyre-cuda kernel for '{id}'")),
            None => out.push_str("// vyre-cuda kernel\n"),
        }
        let [x, y, z] = program.workgroup_size();
        let _ = writeln!(
            out,
            "// workgroup size [{x}, {y}, {z}], bounds checks {}\n//",
            if self.options.bounds_checks {
                "on"
            } else {
                "off"
            }
        );
        if self.module_kernel.is_none() {
            module_header(&mut out, self.sm, self.acquire_only_fences);
        }

        if self.uses_grid_sync {
            out.push_str("// grid barrier: phase bit and arrivals this phase\n");
            let _ = writeln!(
                out,
                ".global .align 4 .u32 {}[{GRID_BARRIER_WORDS}];\n",
                self.grid_barrier_symbol()
            );
        }
        let mut any_shared = false;
        let pool = self.dynamic_shared_bytes;
        for slot in self
            .buffers
            .iter()
            .filter(|slot| slot.space == Space::Shared && !self.is_lane())
        {
            if let Some((symbol, bytes)) = &slot.symbol {
                push_comment(&mut out, "", slot.decl);
                any_shared = true;
                if pool > 0 {
                    continue;
                }
                // 64-bit elements need 8-byte alignment; everything else 4.
                let align = slot.decl.elem.size_bytes().max(4);
                let _ = writeln!(out, ".shared .align {align} .b8 {symbol}[{bytes}];");
            }
        }
        if pool > 0 {
            // The buffers above, at their offsets: sized at launch (`pool` bytes).
            let _ = writeln!(
                out,
                "// dynamic workgroup memory: {pool} bytes at launch\n\
                 .extern .shared .align 16 .b8 {}[];",
                self.dynamic_shared_symbol()
            );
        }
        if self.block_counter {
            any_shared = true;
            self.declare_block_counter(&mut out);
        }
        if any_shared {
            out.push('\n');
        }

        if self.is_lane() {
            // A device function of the lane's server: the workgroup id comes in as
            // parameters, everything else from the request record.
            let _ = write!(out, ".func {}(", self.entry_name());
            for (name, role) in LANE_GROUP_PARAMETERS {
                let _ = write!(out, "\n\t.param .b32 {name}, // {role}");
            }
            let (record, role) = LANE_RECORD_PARAMETER;
            let _ = write!(out, "\n\t.param .b64 {record} // {role}");
            out.push_str("\n)\n{\n");
            self.declarations(&mut out);
            out.push_str(&self.body);
            out.push_str("}\n");
            return out;
        }
        let _ = write!(out, ".visible .entry {}(", self.entry_name());
        let result_parameters = if self.results {
            RESULT_PARAMETERS.len()
        } else {
            0
        };
        let parameters = globals.len() * 2 + result_parameters + program.scalars().len();
        let mut written = 0;
        for (kind, width, role) in [("ptr", "u64", "address"), ("len", "u32", "element count")] {
            for (position, decl) in globals.iter().enumerate() {
                written += 1;
                let comma = if written < parameters { "," } else { "" };
                let _ = write!(out, "\n\t.param .{width} vyre_{kind}_{position}{comma}");
                push_comment(&mut out, " ", format_args!("{decl} {role}"));
                out.pop(); // push_comment ends the line; the loop starts the next one.
            }
        }
        for (declaration, role) in RESULT_PARAMETERS.iter().take(result_parameters) {
            written += 1;
            let comma = if written < parameters { "," } else { "" };
            let _ = write!(out, "\n\t.param {declaration}{comma} // {role}");
        }
        for (position, decl) in program.scalars().iter().enumerate() {
            written += 1;
            let comma = if written < parameters { "," } else { "" };
            let width = scalar_parameter_type(decl.ty);
            let _ = write!(out, "\n\t.param .{width} vyre_scalar_{position}{comma}");
            push_comment(&mut out, " ", decl);
            out.pop(); // push_comment ends the line; the loop starts the next one.
        }
        if parameters > 0 {
            out.push('\n');
        }
        let _ = writeln!(out, ")\n.reqntid {x}, {y}, {z}");
        if let Some(blocks) = self.options.min_blocks_per_multiprocessor {
            // CodegenOptions::min_blocks_per_multiprocessor: ptxas caps registers so
            // that many blocks of `.reqntid` threads fit (checked by `check_occupancy`).
            let _ = writeln!(out, ".minnctapersm {blocks}");
        }
        out.push_str("{\n");
        self.declarations(&mut out);
        out.push_str(&self.body);
        out.push_str("}\n");
        out
    }

    /// The function's register and local-array declarations, then a blank line.
    fn declarations(&self, out: &mut String) {
        for class in RegClass::ALL {
            let count = self.reg_counts[class.slot()];
            if count > 0 {
                let _ = writeln!(
                    out,
                    "\t.reg .{} {}<{count}>;",
                    class.ptx_type(),
                    class.prefix()
                );
            }
        }
        for slot in self
            .buffers
            .iter()
            .filter(|slot| slot.space == Space::Local)
        {
            if let Some((symbol, bytes)) = &slot.symbol {
                let align = slot.decl.elem.size_bytes().max(4);
                out.push('\t');
                push_comment(out, "", slot.decl);
                let _ = writeln!(out, "\t.local .align {align} .b8 {symbol}[{bytes}];");
            }
        }
        out.push('\n');
    }

    // ----- statements ------------------------------------------------------------------

    fn block(&mut self, block: &'p Block) -> Result<()> {
        let mark = self.scope_log.len();
        for node in block.iter() {
            self.node(node)?;
        }
        self.leave_scope(mark);
        Ok(())
    }

    /// Forget every declaration made since the scope log had `mark` entries.
    fn leave_scope(&mut self, mark: usize) {
        while self.scope_log.len() > mark {
            if let Some((name, hidden)) = self.scope_log.pop() {
                match hidden {
                    Some(value) => self.variables.insert(name, value),
                    None => self.variables.remove(name),
                };
            }
        }
    }

    fn comment(&mut self, node: &Node) {
        match node {
            Node::If { condition, .. } => {
                push_comment(&mut self.body, "\t", format_args!("if {condition}"))
            }
            Node::Loop {
                variable,
                start,
                end,
                ..
            } => push_comment(
                &mut self.body,
                "\t",
                format_args!("for {variable} in {start}..{end}"),
            ),
            Node::While { condition, .. } => {
                push_comment(&mut self.body, "\t", format_args!("while {condition}"))
            }
            other => push_comment(&mut self.body, "\t", other),
        }
    }

    /// A loop body, with `break` and `continue` branching to `targets`.
    fn loop_body(&mut self, body: &'p Block, targets: LoopTargets) -> Result<()> {
        self.loops.push(targets);
        let result = self.block(body);
        self.loops.pop();
        result
    }

    /// Stop with [`CodegenError::TooLarge`] once the body passes [`MAX_PTX_BYTES`].
    /// Checked before every statement and expression, each of which adds a bounded
    /// number of bytes, so no program (shared blocks included) makes more than that.
    fn check_size(&self) -> Result<()> {
        if self.body.len() > MAX_PTX_BYTES {
            return Err(CodegenError::TooLarge {
                program: capped(&self.program.display_name()).to_owned(),
                limit_bytes: MAX_PTX_BYTES,
            });
        }
        Ok(())
    }

    fn node(&mut self, node: &'p Node) -> Result<()> {
        self.check_size()?;
        self.comment(node);
        match node {
            Node::Let { name, value, .. } => {
                let value = self.expr(value)?;
                let variable = self.value(value.ty);
                self.mov(variable, value);
                self.bind(name, variable);
            }
            Node::Assign { name, value } => {
                let value = self.expr(value)?;
                let variable = self.variable(name)?;
                self.mov(variable, value);
            }
            Node::Store {
                buffer,
                index,
                value,
            } => {
                let slot = self.buffer(buffer)?;
                let index = self.index(index)?;
                let value = self.expr(value)?;
                let elem = self.buffers[slot].decl.elem;
                let guard = self.bounds_guard(slot, index);
                let address = self.element_address(slot, index);
                let space = self.buffers[slot].space.name();
                emit!(
                    self,
                    "{}st.{space}.{} [{address}], {value};",
                    Guard(guard),
                    memory_type(elem)
                );
            }
            Node::If {
                condition,
                then_body,
                else_body,
            } => {
                let condition = self.expr(condition)?;
                let end = self.label("end_if");
                if else_body.is_empty() {
                    emit!(self, "@!{condition} bra {end};");
                    self.block(then_body)?;
                } else {
                    let otherwise = self.label("else");
                    emit!(self, "@!{condition} bra {otherwise};");
                    self.block(then_body)?;
                    emit!(self, "bra {end};");
                    self.place(otherwise);
                    self.block(else_body)?;
                }
                self.place(end);
            }
            Node::Loop {
                variable,
                start,
                end,
                body,
            } => {
                let start = self.index(start)?;
                let end = self.index(end)?;
                // Both bounds are copied: the body may assign the variables they read.
                let counter = self.value(ScalarType::U32);
                let limit = self.value(ScalarType::U32);
                self.mov(counter, start);
                self.mov(limit, end);
                // Rotated: the test sits below the body, so an iteration costs one
                // compare and one branch.
                let top = self.label("loop");
                let next = self.label("loop_next");
                let test = self.label("loop_test");
                let exit = self.label("loop_end");
                emit!(self, "bra {test};");
                self.place(top);
                let mark = self.scope_log.len();
                self.bind(variable, counter);
                self.loop_body(body, LoopTargets { exit, next })?;
                self.leave_scope(mark);
                self.place(next);
                emit!(self, "add.u32 {counter}, {counter}, 1;");
                self.place(test);
                let more = self.reg(RegClass::Pred);
                emit!(self, "setp.lt.u32 {more}, {counter}, {limit};");
                emit!(self, "@{more} bra {top};");
                self.place(exit);
            }
            Node::While { condition, body } => {
                // Rotated like `for`: one branch into the test, then each iteration is
                // the body, the condition and one conditional branch back.
                let top = self.label("while");
                let test = self.label("while_test");
                let exit = self.label("while_end");
                let iterations = self.options.max_loop_iterations.map(|cap| {
                    let count = self.reg(RegClass::B32);
                    emit!(self, "mov.u32 {count}, 0;");
                    (count, cap)
                });
                emit!(self, "bra {test};");
                self.place(top);
                if let Some((count, cap)) = iterations {
                    let over = self.reg(RegClass::Pred);
                    emit!(self, "add.u32 {count}, {count}, 1;");
                    emit!(self, "setp.gt.u32 {over}, {count}, {cap};");
                    emit!(self, "@{over} trap; // CodegenOptions::max_loop_iterations");
                }
                self.loop_body(body, LoopTargets { exit, next: test })?;
                self.place(test);
                if matches!(condition, Expr::Literal(Literal::Bool(true))) {
                    // `while true`: the loop ends only by `break` or `return`.
                    emit!(self, "bra {top};");
                } else {
                    let holds = self.expr(condition)?;
                    emit!(self, "@{holds} bra {top};");
                }
                self.place(exit);
            }
            Node::Break | Node::Continue => {
                // Validated: inside a loop.
                let targets = self.loops.last().copied().ok_or_else(|| {
                    internal(format_args!("a `break` or `continue` outside a loop"))
                })?;
                let target = if matches!(node, Node::Break) {
                    targets.exit
                } else {
                    targets.next
                };
                emit!(self, "bra {target};");
            }
            Node::Barrier => {
                self.synchronises = true;
                self.workgroup_barrier();
            }
            Node::GridSync if self.is_lane() => {
                return Err(internal(format_args!(
                    "a lane body cannot hold a grid sync (the lane refuses the kernel first)"
                )))
            }
            Node::GridSync => self.grid_sync(),
            Node::Fence => emit!(self, "fence.acq_rel.gpu;"),
            Node::WorkgroupFence => emit!(self, "fence.acq_rel.cta;"),
            Node::Atomic {
                op,
                buffer,
                index,
                value,
            } => {
                let operands = AtomicNode {
                    op: Some(*op),
                    buffer,
                    index,
                    expected: None,
                    value,
                };
                self.atomic(operands, None)?;
            }
            Node::AtomicFetch {
                name,
                op,
                buffer,
                index,
                value,
            } => {
                let operands = AtomicNode {
                    op: Some(*op),
                    buffer,
                    index,
                    expected: None,
                    value,
                };
                self.atomic(operands, Some(name))?;
            }
            Node::CompareExchange {
                name,
                buffer,
                index,
                expected,
                value,
            } => {
                let operands = AtomicNode {
                    op: None,
                    buffer,
                    index,
                    expected: Some(expected),
                    value,
                };
                self.atomic(operands, Some(name))?;
            }
            // A relaxed load at GPU scope: coherent where the atomics are (L2 for
            // global memory), never a stale line of this multiprocessor's L1.
            Node::AtomicLoad {
                name,
                buffer,
                index,
            } => {
                let value = self.load(buffer, index, "relaxed.gpu.")?;
                self.bind(name, value);
            }
            // An acquire at system scope: the host's writes before its release of
            // the value read are visible to this thread's later loads. Emitted as
            // the memory model's acquire pattern, a strong load followed by a
            // fence of the same scope (`fence.acquire.sys` where the options and
            // target allow it: an L1 invalidation, where `fence.acq_rel.sys` is a
            // full system barrier; see `AcquireFence`), never as `ld.acquire`:
            // ptxas 12.9 and 13.0 (sm_90) replace an `ld.acquire` whose value
            // goes unused by an L1 invalidate under the load's bounds-check
            // predicate but drop the comparison that computed it, so a later
            // store guarded by the same comparison runs under whatever the
            // predicate register held (on an H200, 2026-12-06, a generated
            // program's stores to the element it had acquire-loaded never
            // arrived). The fence is a system-wide memory barrier per load: a
            // program polls with it, it does not stream through it.
            Node::AcquireLoad {
                name,
                buffer,
                index,
            } => {
                let value = self.load(buffer, index, "relaxed.sys.")?;
                if acquire_only(self.sm, &self.options) {
                    self.acquire_only_fences = true;
                    emit!(self, "fence.acquire.sys;");
                } else {
                    emit!(self, "fence.acq_rel.sys;");
                }
                self.bind(name, value);
            }
            Node::WorkgroupReduce { .. } | Node::WorkgroupScan { .. } => {
                return Err(internal(format_args!(
                    "a workgroup reduction or scan is not lowered"
                )))
            }
            // Under the result ABI every thread must count itself finished.
            Node::Return if self.results => emit!(self, "bra {RESULTS_LABEL};"),
            Node::Return => emit!(self, "ret;"),
        }
        Ok(())
    }

    /// An atomic: `red` when nothing is returned and the operation has a reduction
    /// form, `atom` (whose previous value lands in a register bound to `result`)
    /// otherwise. Subtraction adds the negated operand (PTX has no atomic `sub`). With
    /// bounds checks on, an out-of-range index skips the instruction and the result
    /// is the 0 written before it.
    fn atomic(&mut self, atomic: AtomicNode<'p>, result: Option<&'p str>) -> Result<()> {
        let slot = self.buffer(atomic.buffer)?;
        let index = self.index(atomic.index)?;
        let expected = match atomic.expected {
            Some(expected) => Some(self.expr(expected)?),
            None => None,
        };
        let mut value = self.expr(atomic.value)?;
        let elem = self.buffers[slot].decl.elem;
        let ty = elem.value_type();
        let bits = RegClass::of(ty).ptx_type();
        let width = if ty.is_wide() { "64" } else { "32" };
        let (operation, suffix) = match atomic.op {
            Some(AtomicOp::Add) => ("add", if ty.is_wide() { "u64" } else { "u32" }),
            Some(AtomicOp::Sub) => {
                value = self.negate(value);
                ("add", if ty.is_wide() { "u64" } else { "u32" })
            }
            Some(AtomicOp::Min) => ("min", arithmetic_type(ty)),
            Some(AtomicOp::Max) => ("max", arithmetic_type(ty)),
            Some(AtomicOp::And) => ("and", bits),
            Some(AtomicOp::Or) => ("or", bits),
            Some(AtomicOp::Xor) => ("xor", bits),
            Some(AtomicOp::Exchange) => ("exch", bits),
            None => ("cas", bits),
        };
        let guard = self.bounds_guard(slot, index);
        let address = self.element_address(slot, index);
        let space = self.buffers[slot].space.name();
        if result.is_none() && atomic.op.is_some_and(AtomicOp::commutes) {
            emit!(
                self,
                "{}red.{space}.{operation}.{suffix} [{address}], {value};",
                Guard(guard)
            );
            return Ok(());
        }
        let previous = self.value(ty);
        if guard.is_some() {
            emit!(self, "mov.b{width} {previous}, 0;");
        }
        match expected {
            Some(expected) => emit!(
                self,
                "{}atom.{space}.{operation}.{suffix} {previous}, [{address}], {expected}, {value};",
                Guard(guard)
            ),
            None => emit!(
                self,
                "{}atom.{space}.{operation}.{suffix} {previous}, [{address}], {value};",
                Guard(guard)
            ),
        }
        if let Some(name) = result {
            self.bind(name, previous);
        }
        Ok(())
    }

    /// The grid-barrier protocol documented in the `ptx` module docs.
    fn grid_sync(&mut self) {
        self.uses_grid_sync = true;
        self.synchronises = true;
        emit!(self, "bar.sync 0;");
        let linear = self.local_linear_id();
        let not_leader = self.reg(RegClass::Pred);
        let done = self.label("grid_sync_done");
        let wait = self.label("grid_sync_wait");
        emit!(self, "setp.ne.u32 {not_leader}, {linear}, 0;");
        emit!(self, "@{not_leader} bra {done};");
        let words = self.reg(RegClass::B64);
        let symbol = self.grid_barrier_symbol();
        emit!(self, "mov.u64 {words}, {symbol};");
        let count_x = self.special("nctaid", "x");
        let count_y = self.special("nctaid", "y");
        let count_z = self.special("nctaid", "z");
        let plane = self.reg(RegClass::B32);
        let blocks = self.reg(RegClass::B32);
        emit!(self, "mul.lo.u32 {plane}, {count_x}, {count_y};");
        emit!(self, "mul.lo.u32 {blocks}, {plane}, {count_z};");
        let group_x = self.special("ctaid", "x");
        let group_y = self.special("ctaid", "y");
        let group_z = self.special("ctaid", "z");
        let any_axis = self.reg(RegClass::B32);
        let first = self.reg(RegClass::Pred);
        emit!(self, "or.b32 {any_axis}, {group_x}, {group_y};");
        emit!(self, "or.b32 {any_axis}, {any_axis}, {group_z};");
        emit!(self, "setp.eq.u32 {first}, {any_axis}, 0;");
        // The first workgroup adds 2^31 - (blocks - 1), every other one 1: the
        // phase bit flips with the last arrival, whichever it is.
        let first_share = self.reg(RegClass::B32);
        let share = self.reg(RegClass::B32);
        emit!(
            self,
            "sub.u32 {first_share}, {:#x}, {blocks};",
            GRID_BARRIER_PHASE_BIT + 1
        );
        emit!(self, "selp.u32 {share}, {first_share}, 1, {first};");
        // The arrival releases the workgroup's writes and, for the last one,
        // acquires everyone's (it reads the value every earlier arrival left).
        let before = self.reg(RegClass::B32);
        emit!(
            self,
            "atom.acq_rel.gpu.global.add.u32 {before}, [{words}], {share};"
        );
        let after = self.reg(RegClass::B32);
        emit!(self, "add.u32 {after}, {before}, {share};");
        let flipped = self.phase_flipped(before, after);
        emit!(self, "@{flipped} bra {done};");
        self.place(wait);
        let now = self.reg(RegClass::B32);
        emit!(self, "ld.relaxed.gpu.global.u32 {now}, [{words}];");
        let flipped = self.phase_flipped(before, now);
        emit!(self, "@!{flipped} bra {wait};");
        // One acquiring load once the flip is seen: it reads a value no older
        // than the flip, so it synchronises with every arrival of the phase.
        let seen = self.reg(RegClass::B32);
        emit!(self, "ld.acquire.gpu.global.u32 {seen}, [{words}];");
        self.place(done);
        emit!(self, "bar.sync 0;");
    }

    /// Whether grid-barrier word 0's phase bit differs between `before` and `now`.
    fn phase_flipped(&mut self, before: Reg, now: Reg) -> Reg {
        let changed = self.reg(RegClass::B32);
        let flipped = self.reg(RegClass::Pred);
        emit!(self, "xor.b32 {changed}, {before}, {now};");
        emit!(
            self,
            "and.b32 {changed}, {changed}, {GRID_BARRIER_PHASE_BIT:#x};"
        );
        emit!(self, "setp.ne.u32 {flipped}, {changed}, 0;");
        flipped
    }

    fn mov(&mut self, destination: Value, source: Value) {
        emit!(
            self,
            "mov.{} {destination}, {source};",
            destination.reg.class.ptx_type()
        );
    }

    // ----- memory ------------------------------------------------------------------------

    fn index(&mut self, index: &'p Expr) -> Result<Value> {
        self.expr(index)
    }

    /// `index < length` as a predicate, or `None` when bounds checks are off.
    fn bounds_guard(&mut self, slot: usize, index: Value) -> Option<Reg> {
        if !self.options.bounds_checks {
            return None;
        }
        let length = self.buffers[slot].length;
        let inside = self.reg(RegClass::Pred);
        emit!(self, "setp.lt.u32 {inside}, {index}, {length};");
        Some(inside)
    }

    /// Element `index` of `buffer`, loaded with `ordering` (empty for a plain load,
    /// `relaxed.gpu.` for an atomic one). With bounds checks on, an out-of-range
    /// index skips the load and gives the 0 written before it.
    fn load(&mut self, buffer: &'p str, index: &'p Expr, ordering: &str) -> Result<Value> {
        let slot = self.buffer(buffer)?;
        let index = self.index(index)?;
        let elem = self.buffers[slot].decl.elem;
        let result = self.value(elem.value_type());
        let guard = self.bounds_guard(slot, index);
        if guard.is_some() {
            if result.ty == ScalarType::F32 {
                // +0.0 the JIT cannot know: an index it proves out of range
                // must not hand it a constant to fold (see `opaque_bits`).
                emit!(self, "mov.b32 {result}, {};", self.opaque_zero);
            } else {
                emit!(self, "mov.{} {result}, 0;", result.reg.class.ptx_type());
            }
        }
        let address = self.element_address(slot, index);
        let space = self.buffers[slot].space.name();
        emit!(
            self,
            "{}ld.{ordering}{space}.{} {result}, [{address}];",
            Guard(guard),
            memory_type(elem)
        );
        Ok(result)
    }

    /// `base + index * element_size`, computed in 64 bits so no index can wrap.
    fn element_address(&mut self, slot: usize, index: Value) -> Reg {
        let (base, size) = {
            let slot = &self.buffers[slot];
            (slot.base, slot.decl.elem.size_bytes())
        };
        let offset = self.reg(RegClass::B64);
        if size == 1 {
            emit!(self, "cvt.u64.u32 {offset}, {index};");
        } else {
            emit!(self, "mul.wide.u32 {offset}, {index}, {size};");
        }
        let address = self.reg(RegClass::B64);
        emit!(self, "add.s64 {address}, {base}, {offset};");
        address
    }

    // ----- expressions -------------------------------------------------------------------

    fn expr(&mut self, expr: &'p Expr) -> Result<Value> {
        self.check_size()?;
        match expr {
            Expr::Literal(literal) => Ok(self.literal(*literal)),
            Expr::Var(name) => self.variable(name),
            Expr::Load { buffer, index } => self.load(buffer, index, ""),
            Expr::Length { buffer } => {
                let slot = self.buffer(buffer)?;
                let length = self.buffers[slot].length;
                let result = self.value(ScalarType::U32);
                emit!(self, "mov.u32 {result}, {length};");
                Ok(result)
            }
            Expr::Scalar(name) => {
                self.scalars.get(&**name).copied().ok_or_else(|| {
                    internal(format_args!("scalar `{}` has no register", capped(name)))
                })
            }
            Expr::Binary { op, lhs, rhs } => {
                let lhs = self.expr(lhs)?;
                if let (BinaryOp::Div | BinaryOp::Rem, Expr::Literal(divisor)) = (op, &**rhs) {
                    if let Some(divisor) = safe_divisor(*divisor) {
                        return Ok(self.division_by_constant(*op == BinaryOp::Div, lhs, divisor));
                    }
                }
                let rhs = self.expr(rhs)?;
                self.binary(*op, lhs, rhs)
            }
            Expr::Unary { op, operand } => {
                let operand = self.expr(operand)?;
                self.unary(*op, operand)
            }
            Expr::Select {
                condition,
                if_true,
                if_false,
            } => {
                let condition = self.expr(condition)?;
                let if_true = self.expr(if_true)?;
                let if_false = self.expr(if_false)?;
                Ok(self.select(condition, if_true, if_false))
            }
            Expr::Cast { to, value } => {
                let value = self.expr(value)?;
                Ok(self.cast(*to, value))
            }
            Expr::Builtin(builtin) => Ok(self.builtin(*builtin)),
            Expr::SubgroupShuffleXor { value, lane_mask } => {
                // Validated: the lane mask is below the subgroup size, 32.
                let value = self.expr(value)?;
                let result = self.value(ScalarType::U32);
                emit!(
                    self,
                    "shfl.sync.bfly.b32 {result}, {value}, {lane_mask}, 0x1f, {FULL_WARP};"
                );
                Ok(result)
            }
            Expr::SubgroupReduce { op, value } => {
                let value = self.expr(value)?;
                Ok(self.subgroup_reduce(*op, value))
            }
            Expr::SubgroupScan { op, kind, value } => {
                let value = self.expr(value)?;
                Ok(self.subgroup_scan(*op, *kind, value))
            }
        }
    }

    fn literal(&mut self, literal: Literal) -> Value {
        let result = self.value(literal.ty());
        match literal {
            Literal::U32(v) => emit!(self, "mov.u32 {result}, {v};"),
            Literal::I32(v) => emit!(self, "mov.s32 {result}, {v};"),
            Literal::F32(v) => {
                let bits = self.opaque_bits(v.to_bits());
                emit!(self, "mov.b32 {result}, {bits};");
            }
            Literal::Bool(v) => emit!(self, "mov.pred {result}, {};", v as u32),
            Literal::U64(v) => emit!(self, "mov.u64 {result}, {v};"),
            Literal::I64(v) => emit!(self, "mov.s64 {result}, {v};"),
        }
        result
    }

    fn builtin(&mut self, builtin: Builtin) -> Value {
        if self.is_lane() {
            if let Some(reg) = self.lane_builtin(builtin) {
                return Value {
                    reg,
                    ty: ScalarType::U32,
                };
            }
        }
        let reg = match builtin {
            Builtin::LocalId(axis) => self.special("tid", axis.name()),
            Builtin::WorkgroupId(axis) => self.special("ctaid", axis.name()),
            Builtin::WorkgroupCount(axis) => self.special("nctaid", axis.name()),
            Builtin::GlobalId(axis) => {
                let group = self.special("ctaid", axis.name());
                let size = self.special("ntid", axis.name());
                let local = self.special("tid", axis.name());
                let global = self.reg(RegClass::B32);
                emit!(self, "mad.lo.u32 {global}, {group}, {size}, {local};");
                global
            }
            Builtin::Clock => {
                let clock = self.reg(RegClass::B64);
                emit!(self, "mov.u64 {clock}, %globaltimer;");
                clock
            }
        };
        Value {
            reg,
            ty: builtin.ty(),
        }
    }

    /// A lane body's workgroup id (its parameters: the server runs the grid's
    /// workgroups in turn) and workgroup count (the request record); `None` for the
    /// builtins a lane body reads as a kernel does (the block shape is the kernel's).
    fn lane_builtin(&mut self, builtin: Builtin) -> Option<Reg> {
        let group = |writer: &mut Self, axis: crate::ir::Axis| {
            let r = writer.reg(RegClass::B32);
            let (name, _) = LANE_GROUP_PARAMETERS[axis.index()];
            emit!(writer, "ld.param.u32 {r}, [{name}];");
            r
        };
        match builtin {
            Builtin::WorkgroupId(axis) => Some(group(self, axis)),
            Builtin::WorkgroupCount(axis) => {
                let record = self.lane_record?;
                let r = self.reg(RegClass::B32);
                emit!(
                    self,
                    "ld.shared.u32 {r}, [{record}+{}];",
                    RECORD_GRID + 4 * axis.index()
                );
                Some(r)
            }
            Builtin::GlobalId(axis) => {
                // The workgroup's size, not `%ntid`: a lane's block may hold doorbell
                // pollers beyond the workgroup.
                let size = self.program.workgroup_size()[axis.index()];
                let workgroup = group(self, axis);
                let local = self.special("tid", axis.name());
                let global = self.reg(RegClass::B32);
                emit!(self, "mad.lo.u32 {global}, {workgroup}, {size}, {local};");
                Some(global)
            }
            Builtin::LocalId(_) | Builtin::Clock => None,
        }
    }

    fn instruction(&mut self, mnemonic: &str, ty: ScalarType, a: Value, b: Value) -> Value {
        let result = self.value(ty);
        emit!(self, "{mnemonic} {result}, {a}, {b};");
        result
    }

    fn binary(&mut self, op: BinaryOp, lhs: Value, rhs: Value) -> Result<Value> {
        use BinaryOp as B;
        use ScalarType as T;
        if op == B::PermuteBytes {
            // Validated: a u64 source and a u32 selector.
            let (low, high) = (self.reg(RegClass::B32), self.reg(RegClass::B32));
            emit!(self, "mov.b64 {{{low}, {high}}}, {lhs};");
            let result = self.value(T::U32);
            emit!(self, "prmt.b32 {result}, {low}, {high}, {rhs};");
            return Ok(result);
        }
        // Validated: both operands have one type (a shift amount is u32).
        let ty = lhs.ty;
        let mnemonic = match (op, ty) {
            (B::Add, T::U32) => "add.u32",
            (B::Add, T::I32) => "add.s32",
            (B::Add, T::U64) => "add.u64",
            (B::Add, T::I64) => "add.s64",
            (B::Add, T::F32) => "add.rn.f32",
            (B::Sub, T::U32) => "sub.u32",
            (B::Sub, T::I32) => "sub.s32",
            (B::Sub, T::U64) => "sub.u64",
            (B::Sub, T::I64) => "sub.s64",
            (B::Sub, T::F32) => "sub.rn.f32",
            (B::Mul, T::U32) => "mul.lo.u32",
            (B::Mul, T::I32) => "mul.lo.s32",
            (B::Mul, T::U64) => "mul.lo.u64",
            (B::Mul, T::I64) => "mul.lo.s64",
            (B::Mul, T::F32) => "mul.rn.f32",
            (B::Div, T::F32) => "div.rn.f32",
            (B::Div | B::Rem, _) if ty.is_integer() => {
                return Ok(self.integer_division(op == B::Div, lhs, rhs))
            }
            (B::BitAnd, T::U32 | T::I32) => "and.b32",
            (B::BitOr, T::U32 | T::I32) => "or.b32",
            (B::BitXor, T::U32 | T::I32) => "xor.b32",
            (B::BitAnd, T::U64 | T::I64) => "and.b64",
            (B::BitOr, T::U64 | T::I64) => "or.b64",
            (B::BitXor, T::U64 | T::I64) => "xor.b64",
            (B::BitAnd | B::LogicalAnd, T::Bool) => "and.pred",
            (B::BitOr | B::LogicalOr, T::Bool) => "or.pred",
            (B::BitXor, T::Bool) => "xor.pred",
            (B::Shl | B::Shr, _) if ty.is_integer() => {
                // PTX clamps shift amounts past the width; the IR takes them modulo it.
                let amount = self.reg(RegClass::B32);
                emit!(self, "and.b32 {amount}, {rhs}, {};", ty.bits() - 1);
                let mnemonic = match (op, ty) {
                    (B::Shl, T::U64 | T::I64) => "shl.b64",
                    (B::Shl, _) => "shl.b32",
                    (_, T::I32) => "shr.s32",
                    (_, T::U64) => "shr.u64",
                    (_, T::I64) => "shr.s64",
                    _ => "shr.u32",
                };
                let result = self.value(ty);
                emit!(self, "{mnemonic} {result}, {lhs}, {amount};");
                return Ok(result);
            }
            (B::Eq | B::Ne | B::Lt | B::Le | B::Gt | B::Ge, _) if ty != T::Bool => {
                let condition = match op {
                    B::Eq => "eq",
                    // Unordered not-equal: NaN != x is true, as in the IR.
                    B::Ne if ty == T::F32 => "neu",
                    B::Ne => "ne",
                    B::Lt => "lt",
                    B::Le => "le",
                    B::Gt => "gt",
                    _ => "ge",
                };
                let result = self.value(T::Bool);
                emit!(
                    self,
                    "setp.{condition}.{} {result}, {lhs}, {rhs};",
                    arithmetic_type(ty)
                );
                return Ok(result);
            }
            (B::Eq | B::Ne, T::Bool) => {
                let differ = self.instruction("xor.pred", T::Bool, lhs, rhs);
                if op == B::Ne {
                    return Ok(differ);
                }
                let result = self.value(T::Bool);
                emit!(self, "not.pred {result}, {differ};");
                return Ok(result);
            }
            // min.f32/max.f32 return the non-NaN operand when exactly one is NaN.
            (B::Min, T::U32) => "min.u32",
            (B::Min, T::I32) => "min.s32",
            (B::Min, T::U64) => "min.u64",
            (B::Min, T::I64) => "min.s64",
            (B::Min, T::F32) => "min.f32",
            (B::Max, T::U32) => "max.u32",
            (B::Max, T::I32) => "max.s32",
            (B::Max, T::U64) => "max.u64",
            (B::Max, T::I64) => "max.s64",
            (B::Max, T::F32) => "max.f32",
            _ => {
                return Err(internal(format_args!(
                    "`{}` on {} has no instruction",
                    op.symbol(),
                    ty.name()
                )))
            }
        };
        let result_type = if op.is_comparison() { T::Bool } else { ty };
        Ok(self.instruction(mnemonic, result_type, lhs, rhs))
    }

    /// Integer `/` or `%` by a constant no input makes unsafe ([`SafeDivisor`]): one
    /// instruction with the constant as its operand, so ptxas strength-reduces a
    /// 32-bit one; an unsigned power of two is a shift or a mask here, since ptxas
    /// (12.9, `sm_90`) still calls its 64-bit division subroutine for `div.u64` by
    /// 1024. The guarded form below hid every constant behind its `selp`: on the
    /// H200 (2026-12-03, Nsight Compute) the split's `classify`, whose document
    /// search divides `u64`s by the workgroup size, spent about 15 % of its warp
    /// samples in that subroutine.
    fn division_by_constant(&mut self, quotient: bool, lhs: Value, divisor: SafeDivisor) -> Value {
        let ty = lhs.ty;
        let result = self.value(ty);
        match divisor {
            SafeDivisor::UnsignedPowerOfTwo(value) if quotient => {
                let shift = value.trailing_zeros();
                emit!(
                    self,
                    "shr.{} {result}, {lhs}, {shift};",
                    arithmetic_type(ty)
                );
            }
            SafeDivisor::UnsignedPowerOfTwo(value) => {
                let mask = value - 1;
                emit!(
                    self,
                    "and.{} {result}, {lhs}, {mask};",
                    RegClass::of(ty).ptx_type()
                );
            }
            SafeDivisor::Immediate(value) => {
                let operation = if quotient { "div" } else { "rem" };
                emit!(
                    self,
                    "{operation}.{} {result}, {lhs}, {value};",
                    arithmetic_type(ty)
                );
            }
        }
        result
    }

    /// Integer `/` or `%` with the IR's total semantics: a zero divisor gives 0, and
    /// `i32::MIN / -1` gives `i32::MIN` (remainder 0; `i64` likewise). The hardware
    /// divides by a safe divisor (1) in those cases and the result is then selected.
    fn integer_division(&mut self, quotient: bool, lhs: Value, rhs: Value) -> Value {
        let ty = lhs.ty;
        let suffix = arithmetic_type(ty);
        let bits = RegClass::of(ty).ptx_type();
        let by_zero = self.reg(RegClass::Pred);
        emit!(self, "setp.eq.{suffix} {by_zero}, {rhs}, 0;");
        let minimum = match ty {
            ScalarType::I32 => Some(i32::MIN as i64),
            ScalarType::I64 => Some(i64::MIN),
            _ => None,
        };
        let unsafe_divisor = match minimum {
            Some(minimum) => {
                let minus_one = self.reg(RegClass::Pred);
                let is_minimum = self.reg(RegClass::Pred);
                let overflow = self.reg(RegClass::Pred);
                let either = self.reg(RegClass::Pred);
                emit!(self, "setp.eq.{suffix} {minus_one}, {rhs}, -1;");
                emit!(self, "setp.eq.{suffix} {is_minimum}, {lhs}, {minimum};");
                emit!(self, "and.pred {overflow}, {minus_one}, {is_minimum};");
                emit!(self, "or.pred {either}, {by_zero}, {overflow};");
                either
            }
            None => by_zero,
        };
        let divisor = self.reg(RegClass::of(ty));
        emit!(self, "selp.{bits} {divisor}, 1, {rhs}, {unsafe_divisor};");
        let operation = if quotient { "div" } else { "rem" };
        let raw = self.value(ty);
        emit!(self, "{operation}.{suffix} {raw}, {lhs}, {divisor};");
        let result = self.value(ty);
        emit!(self, "selp.{bits} {result}, 0, {raw}, {by_zero};");
        result
    }

    fn unary(&mut self, op: UnaryOp, operand: Value) -> Result<Value> {
        use ScalarType as T;
        use UnaryOp as U;
        let ty = operand.ty;
        let result = match (op, ty) {
            (U::Neg, T::I32 | T::I64) => self.negate(operand),
            // Sign-bit flips on the bit pattern, so NaN payloads pass through unchanged
            // (neg.f32/abs.f32 may canonicalise NaN).
            (U::Neg, T::F32) => self.float_sign_bits(operand, "xor.b32", "0x80000000"),
            (U::Abs, T::F32) => self.float_sign_bits(operand, "and.b32", "0x7FFFFFFF"),
            (U::Abs, T::I32 | T::I64) => {
                // max(x, -x) wraps like Rust: abs(i32::MIN) == i32::MIN.
                let negated = self.negate(operand);
                let result = self.value(ty);
                emit!(
                    self,
                    "max.{} {result}, {operand}, {negated};",
                    arithmetic_type(ty)
                );
                result
            }
            (U::BitNot, _) if ty.is_integer() => {
                let result = self.value(ty);
                emit!(
                    self,
                    "not.{} {result}, {operand};",
                    RegClass::of(ty).ptx_type()
                );
                result
            }
            (U::BitNot | U::LogicalNot, T::Bool) => {
                let result = self.value(ty);
                emit!(self, "not.pred {result}, {operand};");
                result
            }
            (U::CountOnes | U::LeadingZeros, _) if ty.is_integer() => {
                let mnemonic = if op == U::CountOnes { "popc" } else { "clz" };
                let result = self.value(T::U32);
                emit!(
                    self,
                    "{mnemonic}.{} {result}, {operand};",
                    RegClass::of(ty).ptx_type()
                );
                result
            }
            _ => {
                return Err(internal(format_args!(
                    "`{}` on {} has no instruction",
                    op.symbol(),
                    ty.name()
                )))
            }
        };
        Ok(result)
    }

    /// Two's-complement negation as `opaque_zero - x`. A plain `neg.s32` (or
    /// `sub.s32 0, x`) feeding a nested `max.s32`/`min.s32` is fused by the JIT into a
    /// three-input min/max that loses the negation (H200, ptxas 12.9: `VIMNMX3 R, x, x,
    /// a` for `max(a, max(x, -x))`); an unknown minuend keeps a real subtraction. An
    /// `i64` is negated the same way, from the opaque zero widened.
    fn negate(&mut self, operand: Value) -> Value {
        let result = self.value(operand.ty);
        if operand.ty.is_wide() {
            let zero = self.opaque_zero_wide();
            emit!(self, "sub.s64 {result}, {zero}, {operand};");
        } else {
            emit!(self, "sub.s32 {result}, {}, {operand};", self.opaque_zero);
        }
        result
    }

    /// A `b64` register holding 0 the JIT cannot know (the opaque zero, widened).
    fn opaque_zero_wide(&mut self) -> Reg {
        let zero = self.reg(RegClass::B64);
        emit!(self, "cvt.u64.u32 {zero}, {};", self.opaque_zero);
        zero
    }

    /// A `b32` register holding `bits`, computed as `opaque_zero ^ bits` so the JIT
    /// does not know the value: every `f32` operation on it runs on the hardware
    /// (correctly rounded) instead of in the JIT's constant folder, which rounds some
    /// ties wrongly. (`f32` values enter a kernel only as literals, casts and loads;
    /// literals and casts go through here, loads are run-time values already.)
    fn opaque_bits(&mut self, bits: u32) -> Reg {
        let result = self.reg(RegClass::B32);
        emit!(
            self,
            "xor.b32 {result}, {}, 0x{bits:08X};",
            self.opaque_zero
        );
        result
    }

    /// `value` (a `b32` or `b64` integer) mixed with `opaque_zero`: same bits,
    /// unknown to the JIT.
    fn opaque_copy(&mut self, value: Value) -> Reg {
        if value.ty.is_wide() {
            let zero = self.opaque_zero_wide();
            let result = self.reg(RegClass::B64);
            emit!(self, "xor.b64 {result}, {value}, {zero};");
            return result;
        }
        let result = self.reg(RegClass::B32);
        emit!(self, "xor.b32 {result}, {value}, {};", self.opaque_zero);
        result
    }

    fn float_sign_bits(&mut self, operand: Value, mnemonic: &str, mask: &str) -> Value {
        let bits = self.reg(RegClass::B32);
        emit!(self, "mov.b32 {bits}, {operand};");
        emit!(self, "{mnemonic} {bits}, {bits}, {mask};");
        let result = self.value(ScalarType::F32);
        emit!(self, "mov.b32 {result}, {bits};");
        result
    }

    /// Validated: the condition is bool and both arms have one type.
    fn select(&mut self, condition: Value, if_true: Value, if_false: Value) -> Value {
        let result = self.value(if_true.ty);
        match if_true.reg.class {
            RegClass::Pred => {
                // selp has no predicate form: (c & t) | (!c & f).
                let taken = self.reg(RegClass::Pred);
                let inverse = self.reg(RegClass::Pred);
                let other = self.reg(RegClass::Pred);
                emit!(self, "and.pred {taken}, {condition}, {if_true};");
                emit!(self, "not.pred {inverse}, {condition};");
                emit!(self, "and.pred {other}, {inverse}, {if_false};");
                emit!(self, "or.pred {result}, {taken}, {other};");
            }
            class => emit!(
                self,
                "selp.{} {result}, {if_true}, {if_false}, {condition};",
                class.ptx_type()
            ),
        }
        result
    }

    /// Rust `as` semantics (see `Expr::Cast`).
    fn cast(&mut self, to: ScalarType, value: Value) -> Value {
        use ScalarType as T;
        match (value.ty, to) {
            (from, to) if from == to => value,
            // Reinterpretation: same register, new type (consumers copy before mutating).
            (T::U32, T::I32) | (T::I32, T::U32) | (T::U64, T::I64) | (T::I64, T::U64) => Value {
                reg: value.reg,
                ty: to,
            },
            (T::U32 | T::I32, T::U64 | T::I64) => {
                // Zero-extends a u32, sign-extends an i32.
                let result = self.value(to);
                let from = if value.ty == T::I32 { "s32" } else { "u32" };
                let wide = if value.ty == T::I32 { "s64" } else { "u64" };
                emit!(self, "cvt.{wide}.{from} {result}, {value};");
                result
            }
            (T::U64 | T::I64, T::U32 | T::I32) => {
                let result = self.value(to);
                emit!(self, "cvt.u32.u64 {result}, {value};");
                result
            }
            (T::U32 | T::I32 | T::U64 | T::I64, T::F32) => {
                // The integer is hidden from the JIT first: a constant it knows would
                // give a constant f32 it folds further (see `opaque_bits`).
                let hidden = self.opaque_copy(value);
                let result = self.value(T::F32);
                emit!(
                    self,
                    "cvt.rn.f32.{} {result}, {hidden};",
                    arithmetic_type(value.ty)
                );
                result
            }
            (T::F32, T::U32 | T::I32 | T::U64 | T::I64) => {
                // cvt.rzi truncates and saturates; NaN is forced to 0 explicitly.
                let class = RegClass::of(to);
                let raw = self.reg(class);
                emit!(self, "cvt.rzi.{}.f32 {raw}, {value};", arithmetic_type(to));
                let nan = self.reg(RegClass::Pred);
                emit!(self, "setp.nan.f32 {nan}, {value}, {value};");
                let result = self.value(to);
                emit!(self, "selp.{} {result}, 0, {raw}, {nan};", class.ptx_type());
                result
            }
            (T::Bool, T::U32 | T::I32 | T::U64 | T::I64) => {
                let result = self.value(to);
                emit!(
                    self,
                    "selp.{} {result}, 1, 0, {value};",
                    RegClass::of(to).ptx_type()
                );
                result
            }
            (T::Bool, _) => {
                // 1.0 or 0.0, hidden from the JIT's folding like a literal.
                let chosen = self.reg(RegClass::B32);
                emit!(self, "selp.b32 {chosen}, 0x3F800000, 0, {value};");
                let hidden = self.reg(RegClass::B32);
                emit!(self, "xor.b32 {hidden}, {chosen}, {};", self.opaque_zero);
                let result = self.value(T::F32);
                emit!(self, "mov.b32 {result}, {hidden};");
                result
            }
            (T::U32 | T::I32 | T::U64 | T::I64, _) => {
                let result = self.value(T::Bool);
                let width = if value.ty.is_wide() { "u64" } else { "u32" };
                emit!(self, "setp.ne.{width} {result}, {value}, 0;");
                result
            }
            (T::F32, _) => {
                // Unordered: NaN converts to true.
                let result = self.value(T::Bool);
                emit!(self, "setp.neu.f32 {result}, {value}, 0f00000000;");
                result
            }
        }
    }

    fn subgroup_reduce(&mut self, op: ReduceOp, value: Value) -> Value {
        self.synchronises = true;
        let operation = reduce_instruction(op);
        if self.sm >= REDUX_MIN_SM {
            let result = self.value(ScalarType::U32);
            emit!(
                self,
                "redux.sync.{operation}.u32 {result}, {value}, {FULL_WARP};"
            );
            return result;
        }
        // Butterfly ladder: after the five steps every lane holds the full reduction.
        let mut accumulated = value;
        for lane_mask in [16, 8, 4, 2, 1] {
            let partner = self.reg(RegClass::B32);
            emit!(
                self,
                "shfl.sync.bfly.b32 {partner}, {accumulated}, {lane_mask}, 0x1f, {FULL_WARP};"
            );
            let next = self.value(ScalarType::U32);
            emit!(self, "{operation}.u32 {next}, {accumulated}, {partner};");
            accumulated = next;
        }
        accumulated
    }

    /// A prefix over the warp in lane order: five `shfl.sync.up` steps, each lane
    /// combining the value `d` lanes below it when that lane exists (the shuffle's
    /// predicate), so lane `i` ends with the combination of lanes `0..=i`; the
    /// exclusive prefix is the inclusive one shifted up one lane, the identity in
    /// lane 0.
    fn subgroup_scan(&mut self, op: ReduceOp, kind: ScanKind, value: Value) -> Value {
        self.synchronises = true;
        let operation = reduce_instruction(op);
        let mut accumulated = value;
        for distance in [1, 2, 4, 8, 16] {
            let partner = self.reg(RegClass::B32);
            let exists = self.reg(RegClass::Pred);
            emit!(
                self,
                "shfl.sync.up.b32 {partner}|{exists}, {accumulated}, {distance}, 0, {FULL_WARP};"
            );
            let combined = self.reg(RegClass::B32);
            emit!(
                self,
                "{operation}.u32 {combined}, {accumulated}, {partner};"
            );
            let next = self.value(ScalarType::U32);
            emit!(
                self,
                "selp.b32 {next}, {combined}, {accumulated}, {exists};"
            );
            accumulated = next;
        }
        if kind == ScanKind::Inclusive {
            return accumulated;
        }
        let below = self.reg(RegClass::B32);
        let exists = self.reg(RegClass::Pred);
        emit!(
            self,
            "shfl.sync.up.b32 {below}|{exists}, {accumulated}, 1, 0, {FULL_WARP};"
        );
        let result = self.value(ScalarType::U32);
        emit!(
            self,
            "selp.b32 {result}, {below}, {}, {exists};",
            op.identity()
        );
        result
    }
}

/// What a module needs to know of a kernel written into it.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct KernelFacts {
    /// It has a grid sync (and so a grid-barrier word).
    pub uses_grid_sync: bool,
    /// An acquire load of it ends with `fence.acquire.sys`.
    pub acquire_only_fences: bool,
}

/// `.version`, `.target`, `.address_size` and the opaque zero word: written once per
/// module (a module of several kernels shares them).
pub(super) fn module_header(out: &mut String, sm: u32, acquire_only_fences: bool) {
    let _ = writeln!(out, ".version {}", ptx_version(sm, acquire_only_fences));
    let _ = writeln!(out, ".target sm_{sm}");
    out.push_str(".address_size 64\n\n");
    let _ = writeln!(
        out,
        "// always 0; hides constants from the JIT's folding (f32 ties, min/max fusion)\n\
         .const .align 4 .u32 {OPAQUE_ZERO_SYMBOL} = 0;\n"
    );
}

/// The `u32` instruction (and `redux.sync` operation) of a reduction.
const fn reduce_instruction(op: ReduceOp) -> &'static str {
    match op {
        ReduceOp::Sum => "add",
        ReduceOp::Min => "min",
        ReduceOp::Max => "max",
    }
}

/// An inconsistency between the validator and this writer: a bug, never bad input.
fn internal(detail: fmt::Arguments<'_>) -> CodegenError {
    CodegenError::Internal {
        detail: detail.to_string(),
    }
}

/// At most [`COMMENT_BYTES`] of `name` (on a character boundary), for messages.
fn capped(name: &str) -> &str {
    let mut end = name.len().min(COMMENT_BYTES);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

/// An integer divisor literal that no dividend makes unsafe: not zero (the IR's
/// `x / 0` is 0) and, for a signed type, not -1 (`MIN / -1` wraps to `MIN`).
enum SafeDivisor {
    /// An unsigned power of two: a shift or a mask.
    UnsignedPowerOfTwo(u64),
    /// Any other: the immediate operand of one `div` or `rem`.
    Immediate(i128),
}

/// The [`SafeDivisor`] of `divisor`; `None` for an unsafe one and for a non-integer
/// literal.
fn safe_divisor(divisor: Literal) -> Option<SafeDivisor> {
    let unsigned = |value: u64| {
        if value.is_power_of_two() {
            SafeDivisor::UnsignedPowerOfTwo(value)
        } else {
            SafeDivisor::Immediate(i128::from(value))
        }
    };
    match divisor {
        Literal::U32(v) if v != 0 => Some(unsigned(u64::from(v))),
        Literal::U64(v) if v != 0 => Some(unsigned(v)),
        Literal::I32(v) if v != 0 && v != -1 => Some(SafeDivisor::Immediate(i128::from(v))),
        Literal::I64(v) if v != 0 && v != -1 => Some(SafeDivisor::Immediate(i128::from(v))),
        _ => None,
    }
}

/// Instruction type suffix for integer and float arithmetic and comparisons.
const fn arithmetic_type(ty: ScalarType) -> &'static str {
    match ty {
        ScalarType::I32 => "s32",
        ScalarType::F32 => "f32",
        ScalarType::U64 => "u64",
        ScalarType::I64 => "s64",
        ScalarType::U32 | ScalarType::Bool => "u32",
    }
}

/// `ld`/`st` type for a buffer element (u8 zero-extends on load, truncates on store).
const fn memory_type(elem: crate::ir::ElemType) -> &'static str {
    match elem {
        crate::ir::ElemType::U8 => "u8",
        crate::ir::ElemType::U32 => "u32",
        crate::ir::ElemType::I32 => "s32",
        crate::ir::ElemType::F32 => "f32",
        crate::ir::ElemType::U64 => "u64",
        crate::ir::ElemType::I64 => "s64",
    }
}

/// A fragment of a PTX identifier made from an IR name: ASCII letters, digits and `_`,
/// at most 32 characters (uniqueness comes from the numeric prefix it is joined to).
fn identifier_part(name: &str) -> String {
    name.chars()
        .take(32)
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// The `.param` type of a scalar parameter (also its `ld.param` type, and a lane
/// body's `ld.shared` type): `bool` travels as a `.u32` 0 or 1.
fn scalar_parameter_type(ty: ScalarType) -> &'static str {
    match ty {
        ScalarType::U32 | ScalarType::I32 | ScalarType::Bool => "u32",
        ScalarType::F32 => "f32",
        ScalarType::U64 | ScalarType::I64 => "u64",
    }
}

/// Append `indent// text\n`, with `text` on one printable-ASCII line whatever names
/// it contains (ptxas rejects any non-ASCII byte, even in comments): line breaks
/// become spaces, other characters outside printable ASCII become `\u{..}` escapes.
///
/// At most [`COMMENT_BYTES`] of `text` are formatted (then `...`): a comment repeats
/// names and expressions, and uncapped, a 1 MiB buffer name used 500 times made 1 GB
/// of PTX. Formatting stops at the cap, so a huge expression costs no more than a
/// short one.
fn push_comment(out: &mut String, indent: &str, text: impl Display) {
    out.push_str(indent);
    out.push_str("// ");
    let start = out.len();
    let mut capped = CappedWriter {
        out,
        room: COMMENT_BYTES,
        truncated: false,
    };
    let _ = write!(capped, "{text}");
    if capped.truncated {
        out.push_str("...");
    }
    while out.ends_with('\n') {
        out.pop();
    }
    let plain = |c: char| c == ' ' || c.is_ascii_graphic();
    if !out[start..].chars().all(plain) {
        let written = out.split_off(start);
        for c in written.chars() {
            match c {
                '\n' | '\r' => out.push(' '),
                c if plain(c) => out.push(c),
                c => {
                    let _ = write!(out, "\\u{{{:x}}}", c as u32);
                }
            }
        }
    }
    out.push('\n');
}

/// A `fmt::Write` that keeps the first `room` bytes and then fails, which makes the
/// formatting machinery stop walking whatever it was printing.
struct CappedWriter<'a> {
    out: &'a mut String,
    room: usize,
    truncated: bool,
}

impl fmt::Write for CappedWriter<'_> {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        if text.len() <= self.room {
            self.out.push_str(text);
            self.room -= text.len();
            return Ok(());
        }
        let mut end = self.room;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        self.out.push_str(&text[..end]);
        self.room = 0;
        self.truncated = true;
        Err(fmt::Error)
    }
}
