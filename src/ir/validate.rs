//! The validator: owns every rule of the IR and every `Fix:` message.
//!
//! Lowering, code generation, the reference interpreter and the backend all take
//! the proof of validity, a [`ValidProgram`], which only [`validate`] and (after
//! lowering) [`validate_lowered`] hand out; none of them re-checks a rule. So this
//! module is the one place a malformed program is turned into an error, and it must
//! answer for *any* value a caller can build: it never panics, never recurses deeper
//! than [`MAX_NESTING_DEPTH`], refuses a tree of more than [`MAX_NODES`] nodes before
//! walking it (a program built from shared `Arc` blocks can describe 2⁶⁴ nodes in a
//! few kilobytes; the size comes from [`Program::node_count`], which walks each
//! shared block once), keeps its name tables keyed against crafted collisions, cuts
//! long names in messages, and uses checked arithmetic for every size. It also knows
//! the hardware limit the kernel ABI meets ([`MAX_GLOBAL_BUFFERS`]), so ptxas never
//! sees a kernel it would refuse.
//!
//! The verdict (either way) is memoised in the program value, one per
//! [`ProgramForm`], so the backend validates before any other walk on every dispatch
//! at the cost of one atomic load when warm.
//!
//! The walk is one pass over the tree, O(n): it resolves names, checks types and
//! records a small dependency graph for the uniformity rules (which variables and
//! control-flow contexts are the same for a whole workgroup or the whole grid). The
//! graph is solved afterwards by a monotone worklist (each node can only drop from
//! grid-uniform to workgroup-uniform to divergent, so it settles in O(n)), and the
//! barrier, reduction and grid-sync checks recorded during the walk are decided then.

use std::collections::HashMap;
use std::fmt::{self, Write as _};

use super::display::describe_node;
use super::program::*;

/// Deepest nesting of blocks and expressions a program may have (a node or an
/// expression nested inside 256 others is rejected). Keeps every recursive walk
/// downstream of validation (lowering, code generation, the reference interpreter)
/// far from the stack limit; the IR's own walks are iterative or bounded.
pub const MAX_NESTING_DEPTH: u32 = 256;

/// Most nodes plus expressions one program may have, counted as a tree (a block
/// shared by several parents counts once per parent).
pub const MAX_NODES: u64 = 1 << 24;

/// Bytes of kernel parameter space the PTX the crate emits may use: `ptxas` refuses a
/// kernel whose `.param` space exceeds 0x1100 bytes for PTX ISA versions before 8.1
/// ("uses too much parameter space"; hit at 363 buffers on `sm_90`), and
/// on the GPU the same kernel would fail to load with no explanation.
pub const MAX_KERNEL_PARAMETER_BYTES: u32 = 0x1100;

/// Kernel parameter bytes one global buffer takes under the kernel ABI of
/// `codegen::ptx`: a `.param .u64` device pointer and a `.param .u32` element count
/// (all pointers first, then all counts, so no padding between them).
pub const KERNEL_PARAMETER_BYTES_PER_GLOBAL_BUFFER: u32 = 8 + 4;

/// Most global (non-`Workgroup`) buffers one program may declare: 362 (fewer when it
/// also declares scalars, which share the parameter space: [`kernel_parameter_bytes`]).
pub const MAX_GLOBAL_BUFFERS: u32 =
    MAX_KERNEL_PARAMETER_BYTES / KERNEL_PARAMETER_BYTES_PER_GLOBAL_BUFFER;

/// Most scalar parameters ([`ScalarDecl`]) one program may declare. A dispatch
/// request carries its values inline (no allocation on the hot path), in a fixed
/// array of this many 8-byte words; more values than this belong in a buffer.
pub const MAX_SCALARS: usize = 16;

/// Bytes of kernel parameters the plain kernel ABI of `codegen::ptx` takes for
/// `global_buffers` buffers and `scalars` (in declaration order): a `.u64` pointer
/// and a `.u32` count per buffer, then each scalar as a `.u32`/`.f32` (4 bytes) or
/// `.u64` (8 bytes, 8-byte aligned) parameter. Saturates instead of overflowing.
pub fn kernel_parameter_bytes(global_buffers: usize, scalars: &[ScalarDecl]) -> u64 {
    let per_buffer = KERNEL_PARAMETER_BYTES_PER_GLOBAL_BUFFER as u64;
    let start = (global_buffers as u64).saturating_mul(per_buffer);
    scalars.iter().fold(start, |offset, scalar| {
        let size = u64::from(scalar.ty.bits() / 8);
        offset.next_multiple_of(size).saturating_add(size)
    })
}

/// Most bytes of [`Access::Local`] arrays one program may declare (per thread, all
/// of them together). The driver reserves a kernel's local memory for every thread
/// that can be resident at once: 16 KiB per thread is 4.4 GB on an H200 (2,048
/// threads on each of 132 SMs), and the reference interpreter holds a copy per thread
/// of the grid. CUDA itself allows 512 KiB; a table that large belongs in a global or
/// workgroup buffer.
pub const MAX_LOCAL_ARRAY_BYTES: u32 = 16 * 1024;

/// Prefix of names reserved for buffers and variables that lowering introduces.
pub const RESERVED_PREFIX: &str = "__vyre";

/// Device limits the validator checks a program against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Limits {
    /// Most threads one workgroup may have.
    pub max_threads_per_workgroup: u32,
    /// Largest workgroup size per axis.
    pub max_workgroup_size: [u32; 3],
    /// Most bytes of workgroup (shared) memory one workgroup may declare, each
    /// workgroup buffer counted in whole 4-byte words (as code generation lays them
    /// out). The CUDA backend sets it to the device's opt-in limit (227 KiB,
    /// 232,448 bytes, on an H200: past 48 KiB a kernel's workgroup buffers live in
    /// dynamic shared memory, `codegen::ptx::workgroup_memory`); the default is the
    /// 48 KiB every CUDA kernel may declare statically.
    pub max_shared_memory_bytes: u32,
    /// Lanes per subgroup (warp).
    pub subgroup_size: u32,
}

impl Default for Limits {
    /// CUDA's limits on every GPU since compute capability 2.0, with the static
    /// shared-memory limit of 48 KiB.
    fn default() -> Self {
        Limits {
            max_threads_per_workgroup: 1024,
            max_workgroup_size: [1024, 1024, 64],
            max_shared_memory_bytes: 48 * 1024,
            subgroup_size: 32,
        }
    }
}

impl Limits {
    /// An H200's kernel limits: the defaults with the 227 KiB (232,448 bytes) of
    /// workgroup memory one workgroup may opt in to
    /// (`DeviceCaps::max_shared_memory_per_block_optin`). The reference interpreter
    /// answers as this device by default.
    pub const fn h200() -> Limits {
        Limits {
            max_threads_per_workgroup: 1024,
            max_workgroup_size: [1024, 1024, 64],
            max_shared_memory_bytes: 232_448,
            subgroup_size: 32,
        }
    }
}

/// Which rule a program broke. One variant per rule; the error's message says
/// which item broke it and what to change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rule {
    /// A buffer or variable has an empty name.
    EmptyName,
    /// A user buffer or variable name starts with [`RESERVED_PREFIX`].
    ReservedName,
    /// Two buffers share a name.
    DuplicateBufferName,
    /// Two buffers share a binding slot.
    BindingCollision,
    /// A `Workgroup` buffer has a runtime count.
    WorkgroupBufferNeedsStaticCount,
    /// A buffer has a static count of zero.
    ZeroCount,
    /// A buffer's static size in bytes does not fit in a `u32`.
    CountOverflow,
    /// The `Workgroup` buffers together exceed the shared-memory limit.
    SharedMemoryOverLimit,
    /// A `Local` array has a runtime count.
    LocalArrayNeedsStaticCount,
    /// The `Local` arrays together exceed [`MAX_LOCAL_ARRAY_BYTES`] per thread.
    LocalMemoryOverLimit,
    /// A workgroup size axis is zero.
    WorkgroupSizeZero,
    /// A workgroup size axis exceeds the device's per-axis limit.
    WorkgroupSizeOverAxisLimit,
    /// The workgroup's thread count exceeds the device limit (or overflows).
    WorkgroupSizeOverThreadLimit,
    /// A variable is used or assigned but not declared in scope.
    UnknownVariable,
    /// A declaration reuses a name already in scope (no shadowing).
    DuplicateVariable,
    /// An assignment targets an immutable variable (a `let`, loop variable or
    /// reduction result).
    AssignToImmutable,
    /// A buffer is used but not declared.
    UnknownBuffer,
    /// A store targets a `ReadOnly` buffer.
    StoreToReadOnly,
    /// An atomic targets a buffer that is not an integer buffer (`u32`, `i32`, `u64`,
    /// `i64`) with `ReadWrite` or `Workgroup` access.
    AtomicBuffer,
    /// An acquire load targets a buffer that is not a global integer buffer (`u32`,
    /// `i32`, `u64`, `i64`) with `ReadOnly` or `ReadWrite` access.
    AcquireLoadBuffer,
    /// An operand, index, value or condition has the wrong type.
    TypeMismatch,
    /// A subgroup expression appears in a user program (only lowering produces them).
    SubgroupBeforeLowering,
    /// A subgroup shuffle's lane mask is not below the subgroup size.
    LaneMaskOutOfRange,
    /// A lowered program still contains a `WorkgroupReduce` node.
    WorkgroupReduceNotLowered,
    /// A lowered program still contains a `WorkgroupScan` node.
    WorkgroupScanNotLowered,
    /// A barrier is reachable under control flow that is not workgroup-uniform.
    DivergentBarrier,
    /// A workgroup reduction is reachable under control flow that is not workgroup-uniform.
    DivergentWorkgroupReduce,
    /// A workgroup scan is reachable under control flow that is not workgroup-uniform.
    DivergentWorkgroupScan,
    /// A subgroup expression is reachable under control flow that is not workgroup-uniform.
    DivergentSubgroupOp,
    /// A grid sync is reachable under control flow that is not grid-uniform.
    GridSyncNotGridUniform,
    /// A `break` or `continue` is not inside a loop.
    BreakOutsideLoop,
    /// Blocks and expressions nest deeper than [`MAX_NESTING_DEPTH`].
    NestingTooDeep,
    /// The program has more than [`MAX_NODES`] nodes and expressions.
    TooManyNodes,
    /// The global buffers' and scalars' kernel parameters exceed
    /// [`MAX_KERNEL_PARAMETER_BYTES`] (more than [`MAX_GLOBAL_BUFFERS`] global
    /// buffers, or fewer with scalars: [`kernel_parameter_bytes`]).
    TooManyBuffers,
    /// Two scalar parameters share a name.
    DuplicateScalarName,
    /// An [`Expr::Scalar`] names a scalar the program does not declare.
    UnknownScalar,
    /// More than [`MAX_SCALARS`] scalar parameters.
    TooManyScalars,
}

/// A rule a program broke. The message starts with `Fix:` and says what to change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidationError {
    rule: Rule,
    message: String,
}

impl ValidationError {
    fn new(rule: Rule, message: String) -> Self {
        ValidationError {
            rule,
            message: format!("Fix: {message}"),
        }
    }

    /// The message, starting with `Fix:`.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The rule that was broken.
    pub fn rule(&self) -> Rule {
        self.rule
    }
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ValidationError {}

type Checked<T> = Result<T, ValidationError>;

/// Longest name (in bytes) an error message quotes in full; longer ones are cut
/// with `…`, so a 1 MiB name cannot make a 1 MiB message.
pub const MESSAGE_NAME_MAX_BYTES: usize = 64;

/// A name as error messages quote it (cut at [`MESSAGE_NAME_MAX_BYTES`]); the
/// backend's request errors quote names the same way.
pub(crate) fn shown(name: &str) -> std::borrow::Cow<'_, str> {
    if name.len() <= MESSAGE_NAME_MAX_BYTES {
        return std::borrow::Cow::Borrowed(name);
    }
    let mut cut = MESSAGE_NAME_MAX_BYTES;
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    std::borrow::Cow::Owned(format!("{}… ({} bytes)", &name[..cut], name.len()))
}

/// The validator's tables of names and binding slots. The keys come from the program
/// being validated, so the hasher must resist crafted collisions: std's randomly
/// keyed SipHash. (80,000 names crafted to collide under the previous
/// unkeyed multiply-rotate hasher took 64 s to validate, quadratic.)
type FastMap<K, V> = HashMap<K, V>;

/// A program the validator accepted, and the rules it was checked against.
///
/// Obtainable only from [`validate`], [`validate_lowered`] or
/// [`validate_unmemoised`]: holding one is the proof that every rule of the IR holds, so
/// lowering, code generation and the reference interpreter can take it instead of
/// re-checking. Cloning copies one pointer (it wraps a [`Program`]); it dereferences
/// to the program.
#[derive(Clone)]
pub struct ValidProgram {
    program: Program,
    form: ProgramForm,
    limits: Limits,
}

impl ValidProgram {
    /// The program.
    pub fn program(&self) -> &Program {
        &self.program
    }

    /// The program, giving up the proof.
    pub fn into_program(self) -> Program {
        self.program
    }

    /// Which rule set it passed: [`ProgramForm::User`] from [`validate`],
    /// [`ProgramForm::Lowered`] from [`validate_lowered`].
    pub fn form(&self) -> ProgramForm {
        self.form
    }

    /// The device limits it was checked against.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }
}

impl std::ops::Deref for ValidProgram {
    type Target = Program;
    fn deref(&self) -> &Program {
        &self.program
    }
}

impl AsRef<Program> for ValidProgram {
    fn as_ref(&self) -> &Program {
        &self.program
    }
}

impl PartialEq for ValidProgram {
    /// Equal programs checked against the same rules and limits.
    fn eq(&self, other: &Self) -> bool {
        self.form == other.form && self.limits == other.limits && self.program == other.program
    }
}
impl Eq for ValidProgram {}

impl fmt::Debug for ValidProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ValidProgram({:?}) ", self.form)?;
        fmt::Debug::fmt(&self.program, f)
    }
}

impl fmt::Display for ValidProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.program, f)
    }
}

/// One memoised verdict: the limits it was reached under and the outcome.
pub(crate) struct ValidityMemo {
    limits: Limits,
    outcome: Result<(), ValidationError>,
}

thread_local! {
    static VALIDATOR_WALKS_ON_THREAD: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Number of whole-program validator walks on the calling thread. Tests use it to
/// prove that re-validating a program (or any clone of it) answers from the memo.
pub fn walks_on_current_thread() -> u64 {
    VALIDATOR_WALKS_ON_THREAD.with(|c| c.get())
}

fn checked(program: &Program, limits: &Limits, form: ProgramForm) -> Checked<ValidProgram> {
    let outcome = memoised_outcome(program, limits, form);
    outcome.map(|()| ValidProgram {
        program: program.clone(),
        form,
        limits: *limits,
    })
}

/// The memoised verdict for these limits, or a walk whose verdict is stored in the
/// first free slot (when every slot holds other limits, the walk is not stored).
fn memoised_outcome(program: &Program, limits: &Limits, form: ProgramForm) -> Checked<()> {
    let slots = program.inner.validity.get(form.slot()).map(|s| &s[..]);
    for slot in slots.unwrap_or(&[]) {
        match slot.get() {
            Some(memo) if memo.limits == *limits => return memo.outcome.clone(),
            Some(_) => continue,
            None => {
                let outcome = walk(program, limits, form);
                // A racing thread may have filled this slot first (with these or
                // other limits); the verdict is the same function of the same
                // immutable program either way, so it is returned regardless.
                let _ = slot.set(ValidityMemo {
                    limits: *limits,
                    outcome: outcome.clone(),
                });
                return outcome;
            }
        }
    }
    walk(program, limits, form)
}

fn walk(program: &Program, limits: &Limits, form: ProgramForm) -> Checked<()> {
    VALIDATOR_WALKS_ON_THREAD.with(|c| c.set(c.get().saturating_add(1)));
    Checker::run(program, limits, form == ProgramForm::Lowered)
}

/// Check a user program against every rule of the IR.
///
/// The verdict is memoised in the program (per [`ProgramForm`], for up to four sets
/// of limits), so validating it again, or any clone of it, is O(1).
pub fn validate(program: &Program, limits: &Limits) -> Result<ValidProgram, ValidationError> {
    checked(program, limits, ProgramForm::User)
}

/// Check a program produced by lowering: subgroup expressions are allowed (in
/// workgroup-uniform control flow, lane masks below the subgroup size), names with
/// the reserved prefix are allowed, and `WorkgroupReduce` nodes are rejected because
/// lowering must have rewritten them. Memoised like [`validate`].
pub fn validate_lowered(
    program: &Program,
    limits: &Limits,
) -> Result<ValidProgram, ValidationError> {
    checked(program, limits, ProgramForm::Lowered)
}

/// [`validate`] or [`validate_lowered`] without the memo: always walks the program
/// and records nothing. For measurements of the walk itself.
pub fn validate_unmemoised(
    program: &Program,
    limits: &Limits,
    form: ProgramForm,
) -> Result<ValidProgram, ValidationError> {
    walk(program, limits, form).map(|()| ValidProgram {
        program: program.clone(),
        form,
        limits: *limits,
    })
}

/// How far a value or a control-flow context is the same across threads. Ordered so
/// that `min` combines two facts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Level {
    /// May differ between threads of one workgroup.
    Divergent = 0,
    /// The same for every thread of a workgroup.
    Workgroup = 1,
    /// The same for every thread of the grid.
    Grid = 2,
}

/// What kind of declaration a variable came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum VarKind {
    Let { mutable: bool },
    LoopVariable,
    ReduceResult,
    ScanResult,
    AtomicResult,
}

struct VarInfo {
    ty: ScalarType,
    kind: VarKind,
    /// Node of the uniformity graph holding this variable's level.
    level_node: u32,
}

/// Which block a path segment indexes.
#[derive(Clone, Copy, Debug)]
enum Branch {
    Entry,
    Then,
    Else,
    Body,
}

impl Branch {
    fn name(self) -> &'static str {
        match self {
            Branch::Entry => "entry",
            Branch::Then => "then",
            Branch::Else => "else",
            Branch::Body => "body",
        }
    }
}

/// What a deferred uniformity check is about.
#[derive(Clone, Copy, Debug)]
enum CheckKind {
    Barrier,
    GridSync,
    WorkgroupReduce,
    WorkgroupScan,
    Subgroup,
}

/// A uniformity requirement recorded during the walk and decided after the graph is solved.
struct DeferredCheck {
    context: u32,
    ordinal: u64,
    kind: CheckKind,
}

/// How threads can leave a block other than by reaching its end: uniformity caps
/// (level nodes) bounding every context from which they leave.
#[derive(Clone, Copy, Debug, Default)]
struct Exits {
    /// A `return` inside the block: those threads are gone for the rest of the kernel.
    returns: Option<u32>,
    /// A `break` or `continue` of the innermost enclosing loop: those threads skip the
    /// rest of the loop body (a `continue` is treated like a `break`, conservatively:
    /// a loop with either under divergent control is a divergent loop).
    loop_exits: Option<u32>,
}

impl Exits {
    fn any(self) -> bool {
        self.returns.is_some() || self.loop_exits.is_some()
    }
}

const FLAG_WORKGROUP_CHECKED: u8 = 1;
const FLAG_GRID_CHECKED: u8 = 2;

struct Checker<'p> {
    limits: &'p Limits,
    lowered: bool,
    buffers: FastMap<&'p str, &'p BufferDecl>,
    scalars: FastMap<&'p str, ScalarType>,
    /// Subgroup reductions are workgroup-uniform when one subgroup is the whole workgroup.
    single_subgroup: bool,
    scope: FastMap<&'p str, u32>,
    scope_names: Vec<&'p str>,
    vars: Vec<VarInfo>,
    /// Uniformity graph: each node's level (starts at its constant part) and flags.
    levels: Vec<Level>,
    flags: Vec<u8>,
    /// Edges `from -> to`: `to`'s level is at most `from`'s.
    edges: Vec<(u32, u32)>,
    /// Variable nodes an expression being checked depends on.
    deps: Vec<u32>,
    checks: Vec<DeferredCheck>,
    path: Vec<(Branch, usize)>,
    visited: u64,
    ordinal: u64,
    /// The context of the node whose expressions are being checked.
    current_context: u32,
    /// Loops enclosing the node being checked (`break`/`continue` need one).
    loop_depth: u32,
}

impl<'p> Checker<'p> {
    fn run(program: &'p Program, limits: &'p Limits, lowered: bool) -> Checked<()> {
        let single_subgroup = program
            .threads_per_workgroup()
            .is_some_and(|t| t <= limits.subgroup_size);
        let mut checker = Checker {
            limits,
            lowered,
            buffers: FastMap::with_capacity(program.buffers().len()),
            scalars: FastMap::with_capacity(program.scalars().len().min(MAX_SCALARS)),
            single_subgroup,
            scope: FastMap::default(),
            scope_names: Vec::new(),
            vars: Vec::new(),
            levels: Vec::new(),
            flags: Vec::new(),
            edges: Vec::new(),
            deps: Vec::new(),
            checks: Vec::new(),
            path: Vec::new(),
            visited: 0,
            ordinal: 0,
            current_context: 0,
            loop_depth: 0,
        };
        checker.check_scalars(program.scalars())?;
        checker.check_buffers(program.buffers(), program.scalars())?;
        checker.check_workgroup_size(program.workgroup_size())?;
        // The tree's size first (iterative, each shared block counted once per
        // allocation, memoised in the program): a few kilobytes of shared blocks can
        // describe 2⁶⁴ nodes, which the walk below must never start on.
        let nodes = program.node_count();
        if nodes > MAX_NODES {
            return Err(ValidationError::new(
                Rule::TooManyNodes,
                format!(
                    "split the program: it has {} nodes and expressions (counting shared \
                     blocks once per use), over the limit of {MAX_NODES}",
                    if nodes == u64::MAX {
                        "more than 2^64".to_string()
                    } else {
                        nodes.to_string()
                    }
                ),
            ));
        }
        let root = checker.new_level_node(Level::Grid);
        checker.block(program.entry(), Branch::Entry, root, 0)?;
        checker.solve();
        checker.decide_checks(program)
    }

    fn check_name(&self, name: &str, what: &str, where_: &dyn Fn() -> String) -> Checked<()> {
        if name.is_empty() {
            return Err(ValidationError::new(
                Rule::EmptyName,
                format!("give the {what} {} a non-empty name", where_()),
            ));
        }
        if !self.lowered && name.starts_with(RESERVED_PREFIX) {
            return Err(ValidationError::new(Rule::ReservedName, {
                let name = shown(name);
                format!(
                    "rename the {what} `{name}` {}: names starting `{RESERVED_PREFIX}` are \
                     reserved for lowering",
                    where_()
                )
            }));
        }
        Ok(())
    }

    /// The scalar declarations: at most [`MAX_SCALARS`], each with a good name, no
    /// two with one name.
    fn check_scalars(&mut self, scalars: &'p [ScalarDecl]) -> Checked<()> {
        if scalars.len() > MAX_SCALARS {
            return Err(ValidationError::new(
                Rule::TooManyScalars,
                format!(
                    "declare at most {MAX_SCALARS} scalar parameters (it declares {}): a \
                     dispatch carries its scalar values inline; pass the rest in a read_only \
                     buffer",
                    scalars.len()
                ),
            ));
        }
        for (position, scalar) in scalars.iter().enumerate() {
            let name = &*scalar.name;
            self.check_name(name, "scalar", &|| {
                format!("declared at position {position}")
            })?;
            if self.scalars.insert(name, scalar.ty).is_some() {
                return Err(ValidationError::new(Rule::DuplicateScalarName, {
                    let name = shown(name);
                    format!(
                        "rename one of the two scalars named `{name}`: scalar names must be \
                         unique (a dispatch supplies values by name)"
                    )
                }));
            }
        }
        Ok(())
    }

    fn check_buffers(
        &mut self,
        buffers: &'p [BufferDecl],
        scalars: &'p [ScalarDecl],
    ) -> Checked<()> {
        let mut bindings: FastMap<u32, &str> = FastMap::with_capacity(buffers.len());
        let globals = buffers.iter().filter(|b| b.access.is_global()).count();
        let parameter_bytes = kernel_parameter_bytes(globals, scalars);
        if !scalars.is_empty() && parameter_bytes > u64::from(MAX_KERNEL_PARAMETER_BYTES) {
            return Err(ValidationError::new(
                Rule::TooManyBuffers,
                format!(
                    "declare fewer global buffers or scalars: the kernel parameters of its \
                     {globals} global buffers ({KERNEL_PARAMETER_BYTES_PER_GLOBAL_BUFFER} bytes \
                     each) and {} scalars take {parameter_bytes} bytes, over the \
                     {MAX_KERNEL_PARAMETER_BYTES} bytes of parameter space ptxas allows; pack \
                     several arrays into one buffer at offsets, or split the program",
                    scalars.len()
                ),
            ));
        }
        if globals > MAX_GLOBAL_BUFFERS as usize {
            return Err(ValidationError::new(
                Rule::TooManyBuffers,
                format!(
                    "declare at most {MAX_GLOBAL_BUFFERS} global buffers (it declares \
                     {globals}): each takes {KERNEL_PARAMETER_BYTES_PER_GLOBAL_BUFFER} bytes of \
                     kernel parameters and {} take {} bytes, over the {MAX_KERNEL_PARAMETER_BYTES} \
                     bytes of parameter space ptxas allows; pack several arrays into one buffer \
                     at offsets, or split the program",
                    globals,
                    (globals as u64) * KERNEL_PARAMETER_BYTES_PER_GLOBAL_BUFFER as u64
                ),
            ));
        }
        let mut shared_bytes: u64 = 0;
        let mut local_bytes: u64 = 0;
        for (position, decl) in buffers.iter().enumerate() {
            let name = &*decl.name;
            self.check_name(name, "buffer", &|| {
                format!("declared at position {position}")
            })?;
            if self.buffers.insert(name, decl).is_some() {
                return Err(ValidationError::new(Rule::DuplicateBufferName, {
                    let name = shown(name);
                    format!(
                        "rename one of the two buffers named `{name}`: buffer names must be unique"
                    )
                }));
            }
            if let Some(other) = bindings.insert(decl.binding, name) {
                return Err(ValidationError::new(Rule::BindingCollision, {
                    let name = shown(name);
                    let other = shown(other);
                    format!(
                        "give buffer `{name}` a binding slot other than {}: buffer `{other}` \
                         already uses it (binding collision)",
                        decl.binding
                    )
                }));
            }
            match decl.count {
                BufferCount::Runtime => {
                    if decl.access == Access::Workgroup {
                        return Err(ValidationError::new(
                            Rule::WorkgroupBufferNeedsStaticCount,
                            {
                                let name = shown(name);
                                format!(
                                    "give workgroup buffer `{name}` a static element count \
                                 (BufferCount::Static): shared memory is sized at compile time"
                                )
                            },
                        ));
                    }
                    if decl.access == Access::Local {
                        return Err(ValidationError::new(Rule::LocalArrayNeedsStaticCount, {
                            let name = shown(name);
                            format!(
                                "give local array `{name}` a static element count \
                                 (BufferCount::Static): per-thread arrays are sized at compile \
                                 time"
                            )
                        }));
                    }
                }
                BufferCount::Static(0) => {
                    return Err(ValidationError::new(Rule::ZeroCount, {
                        let name = shown(name);
                        format!(
                            "give buffer `{name}` a static count of at least 1 (zero count), \
                             or remove it"
                        )
                    }));
                }
                BufferCount::Static(count) => {
                    let bytes = (count as u64).checked_mul(decl.elem.size_bytes() as u64);
                    let bytes = match bytes {
                        Some(b) if b <= u32::MAX as u64 => b,
                        _ => {
                            return Err(ValidationError::new(Rule::CountOverflow, {
                                let name = shown(name);
                                format!(
                                    "shrink buffer `{name}`: {count} elements of {} do not fit in \
                                     {} bytes (overflowing count); use a smaller static count{}",
                                    decl.elem.name(),
                                    u32::MAX,
                                    if decl.access.is_global() {
                                        " or BufferCount::Runtime"
                                    } else {
                                        ""
                                    }
                                )
                            }))
                        }
                    };
                    if decl.access == Access::Workgroup {
                        // What the buffer takes in workgroup memory, as code
                        // generation lays it out (`bytes` is its checked size).
                        shared_bytes = shared_bytes.saturating_add(decl.padded_size_bytes());
                        if shared_bytes > self.limits.max_shared_memory_bytes as u64 {
                            return Err(ValidationError::new(Rule::SharedMemoryOverLimit, {
                                let name = shown(name);
                                format!(
                                    "shrink workgroup buffer `{name}` or the workgroup buffers \
                                     before it: together they need {shared_bytes} bytes of \
                                     shared memory, over the device limit of {} bytes",
                                    self.limits.max_shared_memory_bytes
                                )
                            }));
                        }
                    }
                    if decl.access == Access::Local {
                        local_bytes = local_bytes.saturating_add(bytes);
                        if local_bytes > MAX_LOCAL_ARRAY_BYTES as u64 {
                            return Err(ValidationError::new(Rule::LocalMemoryOverLimit, {
                                let name = shown(name);
                                format!(
                                    "shrink local array `{name}` or the local arrays before it: \
                                     together they need {local_bytes} bytes per thread, over \
                                     the limit of {MAX_LOCAL_ARRAY_BYTES}; keep large tables in \
                                     a global or workgroup buffer"
                                )
                            }));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn check_workgroup_size(&self, size: [u32; 3]) -> Checked<()> {
        let axes = [Axis::X, Axis::Y, Axis::Z];
        for (axis, (&value, &limit)) in axes
            .iter()
            .zip(size.iter().zip(self.limits.max_workgroup_size.iter()))
        {
            if value == 0 {
                return Err(ValidationError::new(
                    Rule::WorkgroupSizeZero,
                    format!(
                        "set workgroup size axis {} to at least 1 (it is zero in {size:?})",
                        axis.name()
                    ),
                ));
            }
            if value > limit {
                return Err(ValidationError::new(
                    Rule::WorkgroupSizeOverAxisLimit,
                    format!(
                        "reduce workgroup size axis {} from {value} to at most {limit} (the \
                         device limit for that axis) in {size:?}",
                        axis.name()
                    ),
                ));
            }
        }
        let threads = (size[0] as u64)
            .checked_mul(size[1] as u64)
            .and_then(|t| t.checked_mul(size[2] as u64));
        match threads {
            Some(t) if t <= self.limits.max_threads_per_workgroup as u64 => Ok(()),
            _ => Err(ValidationError::new(
                Rule::WorkgroupSizeOverThreadLimit,
                format!(
                    "shrink workgroup size {size:?}: its {} threads exceed the device limit of {} \
                     threads per workgroup",
                    threads.map_or_else(|| "overflowing".to_string(), |t| t.to_string()),
                    self.limits.max_threads_per_workgroup
                ),
            )),
        }
    }

    // ---- location and descriptions -------------------------------------------------

    fn location(&self) -> String {
        location_of(&self.path)
    }

    fn at(&self, node: &Node) -> String {
        format!("at {} (`{}`)", self.location(), describe_node(node))
    }

    // ---- uniformity graph ------------------------------------------------------------

    fn new_level_node(&mut self, level: Level) -> u32 {
        let id = self.levels.len() as u32;
        self.levels.push(level);
        self.flags.push(0);
        id
    }

    fn edge(&mut self, from: u32, to: u32) {
        if from != to {
            self.edges.push((from, to));
        }
    }

    /// A node whose level is at most `constant`, `context` and every dependency
    /// collected since `mark`; the dependency list is truncated back to `mark`.
    fn node_from_deps(&mut self, constant: Level, context: u32, mark: usize) -> u32 {
        let node = self.new_level_node(constant);
        self.edge(context, node);
        self.drain_deps_into(node, mark);
        node
    }

    fn drain_deps_into(&mut self, node: u32, mark: usize) {
        let start = mark.min(self.deps.len());
        for index in start..self.deps.len() {
            if let Some(&dep) = self.deps.get(index) {
                self.edge(dep, node);
            }
        }
        self.deps.truncate(start);
    }

    /// Adds `source` to the exit cap `cap` (creating it if needed).
    fn merge_cap(&mut self, cap: Option<u32>, source: u32) -> u32 {
        match cap {
            Some(existing) => {
                self.edge(source, existing);
                existing
            }
            None => {
                let node = self.new_level_node(Level::Grid);
                self.edge(source, node);
                node
            }
        }
    }

    fn defer(&mut self, context: u32, kind: CheckKind) {
        let flag = match kind {
            CheckKind::GridSync => FLAG_GRID_CHECKED,
            _ => FLAG_WORKGROUP_CHECKED,
        };
        // Only the first requirement of each strength per context can be the first to
        // fail, so later ones are not recorded: memory stays O(contexts).
        let Some(flags) = self.flags.get_mut(context as usize) else {
            return;
        };
        if *flags & flag != 0 {
            return;
        }
        *flags |= flag;
        self.checks.push(DeferredCheck {
            context,
            ordinal: self.ordinal,
            kind,
        });
    }

    /// Settles every level: each node ends at the minimum of its constant and all
    /// its predecessors. A node can drop at most twice, so this is O(nodes + edges).
    fn solve(&mut self) {
        let count = self.levels.len();
        let mut starts = vec![0u32; count + 1];
        for &(from, _) in &self.edges {
            if let Some(s) = starts.get_mut(from as usize + 1) {
                *s += 1;
            }
        }
        for i in 1..starts.len() {
            let previous = starts.get(i - 1).copied().unwrap_or(0);
            if let Some(s) = starts.get_mut(i) {
                *s += previous;
            }
        }
        let mut fill = starts.clone();
        let mut successors = vec![0u32; self.edges.len()];
        for &(from, to) in &self.edges {
            if let Some(slot) = fill.get_mut(from as usize) {
                if let Some(target) = successors.get_mut(*slot as usize) {
                    *target = to;
                }
                *slot += 1;
            }
        }
        let mut work: Vec<u32> = (0..count as u32).collect();
        while let Some(node) = work.pop() {
            let Some(&level) = self.levels.get(node as usize) else {
                continue;
            };
            let begin = starts.get(node as usize).copied().unwrap_or(0) as usize;
            let end = starts.get(node as usize + 1).copied().unwrap_or(0) as usize;
            for &next in successors.get(begin..end).unwrap_or(&[]) {
                if let Some(next_level) = self.levels.get_mut(next as usize) {
                    if *next_level > level {
                        *next_level = level;
                        work.push(next);
                    }
                }
            }
        }
    }

    fn decide_checks(&self, program: &Program) -> Checked<()> {
        for check in &self.checks {
            let level = self
                .levels
                .get(check.context as usize)
                .copied()
                .unwrap_or(Level::Divergent);
            let required = match check.kind {
                CheckKind::GridSync => Level::Grid,
                _ => Level::Workgroup,
            };
            if level >= required {
                continue;
            }
            let (path, description) = locate(program.entry(), check.ordinal);
            let at = format!("at {} (`{description}`)", location_of(&path));
            let uniform_inputs = "literals, scalar parameters, workgroup_id, workgroup_count, \
                                  buffer lengths, workgroup reduction results and variables \
                                  computed only from those";
            let divergent_loops = "a loop is divergent when its bounds or `while` condition \
                                   differ between threads or a `break`/`continue` runs under such \
                                   control";
            return Err(match check.kind {
                CheckKind::Barrier => ValidationError::new(
                    Rule::DivergentBarrier,
                    format!(
                        "move the barrier {at} out of the divergent if/loop (or after no \
                         divergent return), or make the condition workgroup-uniform: every \
                         thread of a workgroup must reach it ({divergent_loops}); uniform \
                         conditions use only {uniform_inputs}"
                    ),
                ),
                CheckKind::WorkgroupReduce => ValidationError::new(
                    Rule::DivergentWorkgroupReduce,
                    format!(
                        "move the workgroup reduction {at} out of the divergent if/loop (or \
                         before any divergent return), or make the condition workgroup-uniform: \
                         every thread of a workgroup must reach it ({divergent_loops}); uniform \
                         conditions use only {uniform_inputs}"
                    ),
                ),
                CheckKind::WorkgroupScan => ValidationError::new(
                    Rule::DivergentWorkgroupScan,
                    format!(
                        "move the workgroup scan {at} out of the divergent if/loop (or before \
                         any divergent return), or make the condition workgroup-uniform: every \
                         thread of a workgroup must reach it ({divergent_loops}); uniform \
                         conditions use only {uniform_inputs}"
                    ),
                ),
                CheckKind::Subgroup => ValidationError::new(
                    Rule::DivergentSubgroupOp,
                    format!(
                        "emit the subgroup operation {at} only in workgroup-uniform control \
                         flow: every lane of the subgroup must be active"
                    ),
                ),
                CheckKind::GridSync => ValidationError::new(
                    Rule::GridSyncNotGridUniform,
                    format!(
                        "move the grid sync {at} out of the if/loop (or before any return) whose \
                         condition differs between threads or workgroups, or make it \
                         grid-uniform: every thread of the grid must reach it; grid-uniform \
                         conditions use only literals, scalar parameters, workgroup_count, \
                         buffer lengths and variables computed only from those"
                    ),
                ),
            });
        }
        Ok(())
    }

    // ---- the walk ----------------------------------------------------------------------

    fn count_visit(&mut self) -> Checked<()> {
        self.visited = self.visited.saturating_add(1);
        if self.visited > MAX_NODES {
            return Err(ValidationError::new(
                Rule::TooManyNodes,
                format!(
                    "split the program: it has more than {MAX_NODES} nodes and expressions \
                     (counting shared blocks once per use); the walk stopped at {}",
                    self.location()
                ),
            ));
        }
        Ok(())
    }

    fn too_deep(&self) -> ValidationError {
        ValidationError::new(
            Rule::NestingTooDeep,
            format!(
                "flatten the program: blocks and expressions nest deeper than \
                 {MAX_NESTING_DEPTH} levels at {}; hoist inner expressions into `let` \
                 variables or split nested ifs/loops",
                self.location()
            ),
        )
    }

    fn declare(
        &mut self,
        name: &'p Name,
        ty: ScalarType,
        kind: VarKind,
        level_node: u32,
        node: &Node,
    ) -> Checked<()> {
        self.check_name(name, "variable", &|| self.at(node))?;
        if self.scope.contains_key(&**name) {
            return Err(ValidationError::new(Rule::DuplicateVariable, {
                let name = shown(name);
                format!(
                    "rename the variable `{name}` declared {}: a variable of that name is \
                     already in scope and names may not shadow",
                    self.at(node)
                )
            }));
        }
        let id = self.vars.len() as u32;
        self.vars.push(VarInfo {
            ty,
            kind,
            level_node,
        });
        self.scope.insert(name, id);
        self.scope_names.push(name);
        Ok(())
    }

    fn end_scope(&mut self, mark: usize) {
        while self.scope_names.len() > mark {
            if let Some(name) = self.scope_names.pop() {
                self.scope.remove(name);
            }
        }
    }

    fn buffer(&self, name: &str, node: &Node) -> Checked<&'p BufferDecl> {
        match self.buffers.get(name) {
            Some(decl) => Ok(decl),
            None => Err(ValidationError::new(Rule::UnknownBuffer, {
                let name = shown(name);
                format!(
                    "declare buffer `{name}` (used {}) or use one of the declared buffers",
                    self.at(node)
                )
            })),
        }
    }

    fn expect_type(
        &self,
        found: ScalarType,
        wanted: ScalarType,
        what: &str,
        node: &Node,
    ) -> Checked<()> {
        if found == wanted {
            Ok(())
        } else {
            Err(ValidationError::new(
                Rule::TypeMismatch,
                format!(
                    "make {what} {} a {} (it is a {}); add a cast if the conversion is intended",
                    self.at(node),
                    wanted.name(),
                    found.name()
                ),
            ))
        }
    }

    /// Merges two optional caps into one (creating a cap only when needed).
    fn merge_caps(&mut self, a: Option<u32>, b: Option<u32>) -> Option<u32> {
        match (a, b) {
            (Some(a), Some(b)) => Some(self.merge_cap(Some(a), b)),
            (a, b) => a.or(b),
        }
    }

    fn merge_exits(&mut self, a: Exits, b: Exits) -> Exits {
        Exits {
            returns: self.merge_caps(a.returns, b.returns),
            loop_exits: self.merge_caps(a.loop_exits, b.loop_exits),
        }
    }

    /// Walks one block; returns its exits: level nodes bounding every context from
    /// which a `return`, `break` or `continue` inside this block can leave.
    fn block(
        &mut self,
        block: &'p [Node],
        branch: Branch,
        context: u32,
        depth: u32,
    ) -> Checked<Exits> {
        if depth > MAX_NESTING_DEPTH {
            return Err(self.too_deep());
        }
        let scope_mark = self.scope_names.len();
        let mut context = context;
        let mut exits = Exits::default();
        for (index, node) in block.iter().enumerate() {
            self.path.push((branch, index));
            self.count_visit()?;
            self.ordinal = self.ordinal.saturating_add(1);
            self.current_context = context;
            let child = self.node(node, context, depth)?;
            if child.any() {
                // Threads that left inside `node` are gone for the rest of this block.
                exits = self.merge_exits(exits, child);
                let rest = self.new_level_node(Level::Grid);
                self.edge(context, rest);
                for cap in [child.returns, child.loop_exits].into_iter().flatten() {
                    self.edge(cap, rest);
                }
                context = rest;
            }
            self.path.pop();
        }
        self.end_scope(scope_mark);
        Ok(exits)
    }

    /// The exits of a loop whose body left through `body`: a divergent `return`,
    /// `break` or `continue` leaves later iterations divergent too; only returns leave
    /// the loop's own block.
    fn loop_exits(&mut self, body: Exits, body_context: u32) -> Exits {
        for cap in [body.returns, body.loop_exits].into_iter().flatten() {
            self.edge(cap, body_context);
        }
        Exits {
            returns: body.returns,
            loop_exits: None,
        }
    }

    /// One node. The recursive walk goes block → node → block per nesting level on
    /// the caller's stack (at most [`MAX_NESTING_DEPTH`] levels), so the frames on
    /// that path stay small: the nodes with blocks are checked in `control_node`, the
    /// rest (and every error message) in `simple_node`, which never recurses.
    fn node(&mut self, node: &'p Node, context: u32, depth: u32) -> Checked<Exits> {
        match node {
            Node::If { .. } | Node::Loop { .. } | Node::While { .. } => {
                self.control_node(node, context, depth)
            }
            _ => self.simple_node(node, context, depth),
        }
    }

    /// `If`, `Loop` and `While`: the nodes with nested blocks.
    fn control_node(&mut self, node: &'p Node, context: u32, depth: u32) -> Checked<Exits> {
        match node {
            Node::If {
                condition,
                then_body,
                else_body,
            } => {
                let mark = self.deps.len();
                let (ty, level) = self.expr(condition, node, depth + 1)?;
                self.expect_type(ty, ScalarType::Bool, "the if condition", node)?;
                let body_context = self.node_from_deps(level, context, mark);
                let then_exits = self.block(then_body, Branch::Then, body_context, depth + 1)?;
                let else_exits = self.block(else_body, Branch::Else, body_context, depth + 1)?;
                Ok(self.merge_exits(then_exits, else_exits))
            }
            Node::Loop {
                variable,
                start,
                end,
                body,
            } => {
                let mark = self.deps.len();
                let (start_ty, start_level) = self.expr(start, node, depth + 1)?;
                self.expect_type(start_ty, ScalarType::U32, "the loop start", node)?;
                let (end_ty, end_level) = self.expr(end, node, depth + 1)?;
                self.expect_type(end_ty, ScalarType::U32, "the loop end", node)?;
                // The loop variable is exactly as uniform as the body's context.
                let body_context = self.node_from_deps(start_level.min(end_level), context, mark);
                let scope_mark = self.scope_names.len();
                self.declare(
                    variable,
                    ScalarType::U32,
                    VarKind::LoopVariable,
                    body_context,
                    node,
                )?;
                self.loop_depth += 1;
                let body_exits = self.block(body, Branch::Body, body_context, depth + 1);
                self.loop_depth -= 1;
                let body_exits = body_exits?;
                self.end_scope(scope_mark);
                Ok(self.loop_exits(body_exits, body_context))
            }
            Node::While { condition, body } => {
                let mark = self.deps.len();
                let (ty, level) = self.expr(condition, node, depth + 1)?;
                self.expect_type(ty, ScalarType::Bool, "the while condition", node)?;
                // Every iteration runs where the condition held, so the body is as
                // uniform as the condition (which may read variables the body assigns:
                // the graph is solved over all assignments).
                let body_context = self.node_from_deps(level, context, mark);
                self.loop_depth += 1;
                let body_exits = self.block(body, Branch::Body, body_context, depth + 1);
                self.loop_depth -= 1;
                Ok(self.loop_exits(body_exits?, body_context))
            }
            _ => self.simple_node(node, context, depth),
        }
    }

    /// Every node without nested blocks.
    #[inline(never)]
    fn simple_node(&mut self, node: &'p Node, context: u32, depth: u32) -> Checked<Exits> {
        match node {
            Node::If { .. } | Node::Loop { .. } | Node::While { .. } => {
                self.control_node(node, context, depth)
            }
            Node::Let {
                name,
                mutable,
                value,
            } => {
                let mark = self.deps.len();
                let (ty, level) = self.expr(value, node, depth + 1)?;
                let level_node = self.node_from_deps(level, context, mark);
                let kind = VarKind::Let { mutable: *mutable };
                self.declare(name, ty, kind, level_node, node)?;
                Ok(Exits::default())
            }
            Node::Assign { name, value } => {
                let Some(&id) = self.scope.get(&**name) else {
                    return Err(ValidationError::new(Rule::UnknownVariable, {
                        let name = shown(name);
                        format!(
                            "declare `{name}` with `let mut {name} = ...` before the assignment \
                             {}, or fix the name: no variable `{name}` is in scope",
                            self.at(node)
                        )
                    }));
                };
                let Some(info) = self.vars.get(id as usize) else {
                    return Ok(Exits::default());
                };
                let (declared, kind, target) = (info.ty, info.kind, info.level_node);
                if kind != (VarKind::Let { mutable: true }) {
                    let what = match kind {
                        VarKind::LoopVariable => "a loop variable",
                        VarKind::ReduceResult => "a workgroup reduction result",
                        VarKind::ScanResult => "a workgroup scan result",
                        VarKind::AtomicResult => "the result of an atomic",
                        VarKind::Let { .. } => "declared without `mut`",
                    };
                    return Err(ValidationError::new(Rule::AssignToImmutable, {
                        let name = shown(name);
                        format!(
                            "assign to a mutable variable instead of `{name}` {}: `{name}` is \
                             {what}; declare a new `let mut` variable to hold changing values",
                            self.at(node)
                        )
                    }));
                }
                let mark = self.deps.len();
                let (ty, level) = self.expr(value, node, depth + 1)?;
                if ty != declared {
                    return Err(ValidationError::new(Rule::TypeMismatch, {
                        let name = shown(name);
                        format!(
                            "assign a {} value to `{name}` {} (the value is a {}); cast it or \
                             declare `{name}` with the other type",
                            declared.name(),
                            self.at(node),
                            ty.name()
                        )
                    }));
                }
                if let Some(slot) = self.levels.get_mut(target as usize) {
                    *slot = (*slot).min(level);
                }
                self.edge(context, target);
                self.drain_deps_into(target, mark);
                Ok(Exits::default())
            }
            Node::Store {
                buffer,
                index,
                value,
            } => {
                let decl = self.buffer(buffer, node)?;
                if decl.access == Access::ReadOnly {
                    return Err(ValidationError::new(Rule::StoreToReadOnly, {
                        let buffer = shown(buffer);
                        format!(
                            "declare buffer `{buffer}` read_write or write_only, or store into \
                             another buffer: the store {} writes a read_only buffer",
                            self.at(node)
                        )
                    }));
                }
                let mark = self.deps.len();
                let (index_ty, _) = self.expr(index, node, depth + 1)?;
                self.expect_type(index_ty, ScalarType::U32, "the index", node)?;
                let (value_ty, _) = self.expr(value, node, depth + 1)?;
                let wanted = decl.elem.value_type();
                if value_ty != wanted {
                    return Err(ValidationError::new(Rule::TypeMismatch, {
                        let buffer = shown(buffer);
                        format!(
                            "store a {} value into buffer `{buffer}` ({} elements) {} (the value \
                             is a {}); add a cast",
                            wanted.name(),
                            decl.elem.name(),
                            self.at(node),
                            value_ty.name()
                        )
                    }));
                }
                self.deps.truncate(mark);
                Ok(Exits::default())
            }
            Node::Break | Node::Continue => {
                if self.loop_depth == 0 {
                    let what = if matches!(node, Node::Break) {
                        "break"
                    } else {
                        "continue"
                    };
                    return Err(ValidationError::new(
                        Rule::BreakOutsideLoop,
                        format!(
                            "move the `{what}` {} into a loop (`for` or `while`), or remove it: \
                             it is not inside one",
                            self.at(node)
                        ),
                    ));
                }
                let cap = self.merge_cap(None, context);
                Ok(Exits {
                    returns: None,
                    loop_exits: Some(cap),
                })
            }
            Node::Barrier => {
                self.defer(context, CheckKind::Barrier);
                Ok(Exits::default())
            }
            Node::GridSync => {
                self.defer(context, CheckKind::GridSync);
                Ok(Exits::default())
            }
            // Waits for no other thread: valid anywhere.
            Node::Fence | Node::WorkgroupFence => Ok(Exits::default()),
            Node::Atomic {
                op: _,
                buffer,
                index,
                value,
            } => {
                self.atomic_operands(node, buffer, index, None, value, depth)?;
                Ok(Exits::default())
            }
            Node::AtomicFetch {
                name,
                op: _,
                buffer,
                index,
                value,
            } => {
                let ty = self.atomic_operands(node, buffer, index, None, value, depth)?;
                self.declare_atomic_result(name, ty, context, node)?;
                Ok(Exits::default())
            }
            Node::CompareExchange {
                name,
                buffer,
                index,
                expected,
                value,
            } => {
                let ty = self.atomic_operands(node, buffer, index, Some(expected), value, depth)?;
                self.declare_atomic_result(name, ty, context, node)?;
                Ok(Exits::default())
            }
            Node::AtomicLoad {
                name,
                buffer,
                index,
            } => {
                let mark = self.deps.len();
                let ty = self.integer_element(node, (buffer, index), depth, &ATOMIC_TARGET)?;
                self.deps.truncate(mark);
                self.declare_atomic_result(name, ty, context, node)?;
                Ok(Exits::default())
            }
            Node::AcquireLoad {
                name,
                buffer,
                index,
            } => {
                let mark = self.deps.len();
                let ty = self.integer_element(node, (buffer, index), depth, &ACQUIRE_TARGET)?;
                self.deps.truncate(mark);
                self.declare_atomic_result(name, ty, context, node)?;
                Ok(Exits::default())
            }
            Node::WorkgroupReduce { name, op: _, value } => {
                if self.lowered {
                    return Err(ValidationError::new(Rule::WorkgroupReduceNotLowered, {
                        let name = shown(name);
                        format!(
                            "lower the workgroup reduction `{name}` {} before validating as \
                             lowered (lower::lower_workgroup_reductions rewrites it)",
                            self.at(node)
                        )
                    }));
                }
                let mark = self.deps.len();
                let (ty, _) = self.expr(value, node, depth + 1)?;
                self.expect_type(ty, ScalarType::U32, "the reduced value", node)?;
                self.deps.truncate(mark);
                self.defer(context, CheckKind::WorkgroupReduce);
                let level_node = self.new_level_node(Level::Workgroup);
                self.edge(context, level_node);
                self.declare(
                    name,
                    ScalarType::U32,
                    VarKind::ReduceResult,
                    level_node,
                    node,
                )?;
                Ok(Exits::default())
            }
            Node::WorkgroupScan {
                name,
                op: _,
                kind: _,
                value,
            } => {
                if self.lowered {
                    return Err(ValidationError::new(Rule::WorkgroupScanNotLowered, {
                        let name = shown(name);
                        format!(
                            "lower the workgroup scan `{name}` {} before validating as \
                             lowered (lower::lower_workgroup_reductions rewrites it)",
                            self.at(node)
                        )
                    }));
                }
                let mark = self.deps.len();
                let (ty, _) = self.expr(value, node, depth + 1)?;
                self.expect_type(ty, ScalarType::U32, "the scanned value", node)?;
                self.deps.truncate(mark);
                self.defer(context, CheckKind::WorkgroupScan);
                // Each thread's prefix is its own: divergent.
                let level_node = self.new_level_node(Level::Divergent);
                self.edge(context, level_node);
                self.declare(name, ScalarType::U32, VarKind::ScanResult, level_node, node)?;
                Ok(Exits::default())
            }
            Node::Return => {
                let cap = self.merge_cap(None, context);
                Ok(Exits {
                    returns: Some(cap),
                    loop_exits: None,
                })
            }
        }
    }

    /// Checks an expression; returns its type and the constant part of its uniformity
    /// (variables it reads are pushed onto `self.deps`).
    fn expr(&mut self, expr: &'p Expr, node: &Node, depth: u32) -> Checked<(ScalarType, Level)> {
        if depth > MAX_NESTING_DEPTH {
            return Err(self.too_deep());
        }
        self.count_visit()?;
        let next = depth + 1;
        match expr {
            Expr::Literal(literal) => Ok((literal.ty(), Level::Grid)),
            Expr::Var(name) => {
                let info = self
                    .scope
                    .get(&**name)
                    .and_then(|&id| self.vars.get(id as usize));
                match info {
                    Some(info) => {
                        let (ty, level_node) = (info.ty, info.level_node);
                        self.deps.push(level_node);
                        Ok((ty, Level::Grid))
                    }
                    None => Err(ValidationError::new(Rule::UnknownVariable, {
                        let name = shown(name);
                        format!(
                            "declare `{name}` before its use {} (with `let`), or fix the name: \
                             no variable `{name}` is in scope there",
                            self.at(node)
                        )
                    })),
                }
            }
            Expr::Load { buffer, index } => {
                let decl = self.buffer(buffer, node)?;
                let (index_ty, index_level) = self.expr(index, node, next)?;
                self.expect_type(index_ty, ScalarType::U32, "the load index", node)?;
                // Lowering's own shared buffers are written, then a barrier, then read
                // at a uniform index: such a load is as uniform as its index.
                let level = if self.lowered
                    && decl.access == Access::Workgroup
                    && decl.name.starts_with(RESERVED_PREFIX)
                {
                    index_level.min(Level::Workgroup)
                } else {
                    Level::Divergent
                };
                Ok((decl.elem.value_type(), level))
            }
            Expr::Length { buffer } => {
                self.buffer(buffer, node)?;
                Ok((ScalarType::U32, Level::Grid))
            }
            // A dispatch passes one value to every thread of the grid.
            Expr::Scalar(name) => match self.scalars.get(&**name) {
                Some(&ty) => Ok((ty, Level::Grid)),
                None => Err(ValidationError::new(Rule::UnknownScalar, {
                    let name = shown(name);
                    format!(
                        "declare scalar `{name}` (read {}) with ProgramBuilder::scalar, or \
                         read one of the declared scalars",
                        self.at(node)
                    )
                })),
            },
            Expr::Binary { op, lhs, rhs } => {
                let (left, left_level) = self.expr(lhs, node, next)?;
                let (right, right_level) = self.expr(rhs, node, next)?;
                let ty = self.binary_type(*op, left, right, node)?;
                Ok((ty, left_level.min(right_level)))
            }
            Expr::Unary { op, operand } => {
                let (ty, level) = self.expr(operand, node, next)?;
                let result = match (op, ty) {
                    (
                        UnaryOp::Neg | UnaryOp::Abs,
                        ScalarType::I32 | ScalarType::I64 | ScalarType::F32,
                    ) => Some(ty),
                    (UnaryOp::BitNot, _) if ty.is_integer() => Some(ty),
                    (UnaryOp::LogicalNot, ScalarType::Bool) => Some(ty),
                    (UnaryOp::CountOnes | UnaryOp::LeadingZeros, _) if ty.is_integer() => {
                        Some(ScalarType::U32)
                    }
                    _ => None,
                };
                let wanted = match op {
                    UnaryOp::Neg | UnaryOp::Abs => "an i32, i64 or f32",
                    UnaryOp::BitNot | UnaryOp::CountOnes | UnaryOp::LeadingZeros => {
                        "an integer (u32, i32, u64 or i64)"
                    }
                    UnaryOp::LogicalNot => "a bool",
                };
                match result {
                    Some(result) => Ok((result, level)),
                    None => Err(ValidationError::new(
                        Rule::TypeMismatch,
                        format!(
                            "give `{}` {wanted} operand {} (it is a {}); add a cast",
                            op.symbol(),
                            self.at(node),
                            ty.name()
                        ),
                    )),
                }
            }
            Expr::Select {
                condition,
                if_true,
                if_false,
            } => {
                let (condition_ty, condition_level) = self.expr(condition, node, next)?;
                self.expect_type(condition_ty, ScalarType::Bool, "the select condition", node)?;
                let (true_ty, true_level) = self.expr(if_true, node, next)?;
                let (false_ty, false_level) = self.expr(if_false, node, next)?;
                if true_ty != false_ty {
                    return Err(ValidationError::new(
                        Rule::TypeMismatch,
                        format!(
                            "give both arms of the select {} the same type (they are {} and {}); \
                             add a cast",
                            self.at(node),
                            true_ty.name(),
                            false_ty.name()
                        ),
                    ));
                }
                Ok((true_ty, condition_level.min(true_level).min(false_level)))
            }
            Expr::Cast { to, value } => {
                let (_, level) = self.expr(value, node, next)?;
                Ok((*to, level))
            }
            Expr::Builtin(builtin) => {
                let level = match builtin {
                    Builtin::WorkgroupCount(_) => Level::Grid,
                    Builtin::WorkgroupId(_) => Level::Workgroup,
                    Builtin::GlobalId(_) | Builtin::LocalId(_) | Builtin::Clock => Level::Divergent,
                };
                Ok((builtin.ty(), level))
            }
            Expr::SubgroupShuffleXor { value, lane_mask } => {
                self.subgroup_allowed(expr, node)?;
                if *lane_mask >= self.limits.subgroup_size {
                    return Err(ValidationError::new(
                        Rule::LaneMaskOutOfRange,
                        format!(
                            "use a lane mask below the subgroup size {} in the shuffle {} (it is \
                             {lane_mask})",
                            self.limits.subgroup_size,
                            self.at(node)
                        ),
                    ));
                }
                let (ty, _) = self.expr(value, node, next)?;
                self.expect_type(ty, ScalarType::U32, "the shuffled value", node)?;
                self.defer(self.current_context, CheckKind::Subgroup);
                Ok((ScalarType::U32, Level::Divergent))
            }
            Expr::SubgroupReduce { op: _, value } => {
                self.subgroup_allowed(expr, node)?;
                // A reduction over the whole workgroup (one subgroup) does not depend on
                // the per-lane operand's divergence, so the operand's dependencies are
                // dropped: the result is the same in every lane.
                let mark = self.deps.len();
                let (ty, _) = self.expr(value, node, next)?;
                if self.single_subgroup {
                    self.deps.truncate(mark);
                }
                self.expect_type(ty, ScalarType::U32, "the subgroup-reduced value", node)?;
                self.defer(self.current_context, CheckKind::Subgroup);
                let level = if self.single_subgroup {
                    Level::Workgroup
                } else {
                    Level::Divergent
                };
                Ok((ScalarType::U32, level))
            }
            Expr::SubgroupScan { value, .. } => {
                self.subgroup_allowed(expr, node)?;
                let (ty, _) = self.expr(value, node, next)?;
                self.expect_type(ty, ScalarType::U32, "the subgroup-scanned value", node)?;
                self.defer(self.current_context, CheckKind::Subgroup);
                Ok((ScalarType::U32, Level::Divergent))
            }
        }
    }

    /// The rules every atomic shares: an integer `read_write` or `workgroup` buffer, a
    /// `u32` index, operands (`expected` too) of the element's value type, which it
    /// returns.
    fn atomic_operands(
        &mut self,
        node: &Node,
        buffer: &'p Name,
        index: &'p Expr,
        expected: Option<&'p Expr>,
        value: &'p Expr,
        depth: u32,
    ) -> Checked<ScalarType> {
        let mark = self.deps.len();
        let ty = self.integer_element(node, (buffer, index), depth, &ATOMIC_TARGET)?;
        if let Some(expected) = expected {
            let (expected_ty, _) = self.expr(expected, node, depth + 1)?;
            self.expect_type(expected_ty, ty, "the expected value", node)?;
        }
        let (value_ty, _) = self.expr(value, node, depth + 1)?;
        self.expect_type(value_ty, ty, "the atomic operand", node)?;
        self.deps.truncate(mark);
        Ok(ty)
    }

    /// The element `(buffer, index)` of an atomic or an acquire load, checked
    /// against `target`'s rule: an integer buffer (u32, i32, u64 or i64) of one of
    /// its accesses, and a `u32` index. Returns the element's value type.
    fn integer_element(
        &mut self,
        node: &Node,
        (buffer, index): (&'p Name, &'p Expr),
        depth: u32,
        target: &ElementTarget,
    ) -> Checked<ScalarType> {
        let decl = self.buffer(buffer, node)?;
        let access_ok = target.accesses.contains(&decl.access);
        let ty = decl.elem.value_type();
        if decl.elem == ElemType::U8 || !ty.is_integer() || !access_ok {
            return Err(ValidationError::new(target.rule, {
                let buffer = shown(buffer);
                format!(
                    "make buffer `{buffer}` an integer (u32, i32, u64 or i64) buffer with \
                     {} access, or use another buffer: the {} {} {} a {} {} buffer",
                    target.accesses_named,
                    target.what,
                    self.at(node),
                    target.verb,
                    decl.access.name(),
                    decl.elem.name()
                )
            }));
        }
        let (index_ty, _) = self.expr(index, node, depth + 1)?;
        self.expect_type(index_ty, ScalarType::U32, target.index_named, node)?;
        Ok(ty)
    }

    /// The variable an atomic returns into: immutable, and divergent (which value a
    /// thread gets depends on the others).
    fn declare_atomic_result(
        &mut self,
        name: &'p Name,
        ty: ScalarType,
        context: u32,
        node: &Node,
    ) -> Checked<()> {
        let level_node = self.new_level_node(Level::Divergent);
        self.edge(context, level_node);
        self.declare(name, ty, VarKind::AtomicResult, level_node, node)
    }

    fn subgroup_allowed(&self, expr: &Expr, node: &Node) -> Checked<()> {
        if self.lowered {
            return Ok(());
        }
        let what = match expr {
            Expr::SubgroupShuffleXor { .. } => "subgroup_shuffle_xor",
            Expr::SubgroupScan { .. } => "subgroup_scan",
            _ => "subgroup_reduce",
        };
        Err(ValidationError::new(
            Rule::SubgroupBeforeLowering,
            format!(
                "remove the `{what}` expression {}: subgroup expressions are produced only by \
                 lowering; use Node::WorkgroupReduce or Node::WorkgroupScan across the \
                 workgroup",
                self.at(node)
            ),
        ))
    }

    fn binary_type(
        &self,
        op: BinaryOp,
        left: ScalarType,
        right: ScalarType,
        node: &Node,
    ) -> Checked<ScalarType> {
        use ScalarType::*;
        let numeric = |t: ScalarType| t.is_integer() || t == F32;
        let integer = |t: ScalarType| t.is_integer();
        let (ok, result, wanted) = match op {
            BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div => (
                left == right && numeric(left),
                left,
                "two operands of one numeric type (u32, i32, u64, i64 or f32)",
            ),
            BinaryOp::Min | BinaryOp::Max => (
                left == right && numeric(left),
                left,
                "two operands of one numeric type (u32, i32, u64, i64 or f32)",
            ),
            BinaryOp::Rem | BinaryOp::BitAnd | BinaryOp::BitOr | BinaryOp::BitXor => (
                left == right && integer(left),
                left,
                "two operands of one integer type (u32, i32, u64 or i64)",
            ),
            BinaryOp::Shl | BinaryOp::Shr => (
                integer(left) && right == U32,
                left,
                "an integer left operand (u32, i32, u64 or i64) and a u32 shift amount",
            ),
            BinaryOp::Eq | BinaryOp::Ne => (left == right, Bool, "two operands of the same type"),
            BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge => (
                left == right && numeric(left),
                Bool,
                "two operands of one numeric type (u32, i32, u64, i64 or f32; bool has no \
                 order)",
            ),
            BinaryOp::LogicalAnd | BinaryOp::LogicalOr => {
                (left == Bool && right == Bool, Bool, "two bool operands")
            }
            BinaryOp::PermuteBytes => (
                left == U64 && right == U32,
                U32,
                "a u64 of eight source bytes and a u32 selector",
            ),
        };
        if ok {
            Ok(result)
        } else {
            Err(ValidationError::new(
                Rule::TypeMismatch,
                format!(
                    "give `{}` {wanted} {} (they are {} and {}); add a cast",
                    op.symbol(),
                    self.at(node),
                    left.name(),
                    right.name()
                ),
            ))
        }
    }
}

fn location_of(path: &[(Branch, usize)]) -> String {
    let mut out = String::new();
    for (i, (branch, index)) in path.iter().enumerate() {
        if i > 0 {
            out.push('.');
        }
        let _ = write!(out, "{}[{index}]", branch.name());
    }
    if out.is_empty() {
        out.push_str("the entry body");
    }
    out
}

/// Finds the node with the given walk ordinal (1-based, pre-order over nodes) and
/// returns its path and description. Only called on programs whose walk already
/// finished within the depth and size limits.
fn locate(entry: &[Node], ordinal: u64) -> (Vec<(Branch, usize)>, String) {
    fn walk(
        block: &[Node],
        branch: Branch,
        ordinal: u64,
        seen: &mut u64,
        path: &mut Vec<(Branch, usize)>,
    ) -> Option<String> {
        for (index, node) in block.iter().enumerate() {
            path.push((branch, index));
            *seen += 1;
            if *seen == ordinal {
                return Some(describe_node(node));
            }
            let found = match node {
                Node::If {
                    then_body,
                    else_body,
                    ..
                } => walk(then_body, Branch::Then, ordinal, seen, path)
                    .or_else(|| walk(else_body, Branch::Else, ordinal, seen, path)),
                Node::Loop { body, .. } | Node::While { body, .. } => {
                    walk(body, Branch::Body, ordinal, seen, path)
                }
                _ => None,
            };
            if found.is_some() {
                return found;
            }
            path.pop();
            if *seen > ordinal {
                return None;
            }
        }
        None
    }
    let mut path = Vec::new();
    let mut seen = 0;
    match walk(entry, Branch::Entry, ordinal, &mut seen, &mut path) {
        Some(description) => (path, description),
        None => (Vec::new(), "?".to_string()),
    }
}

/// What an atomic or an acquire load may address, the rule it breaks
/// otherwise, and how its `Fix:` message names it. An atomic: an integer
/// `ReadWrite` or `Workgroup` buffer. An acquire load reads memory another
/// agent (the host, another device) writes, so only global buffers the kernel
/// reads qualify, and only widths a single atomic read covers.
struct ElementTarget {
    accesses: &'static [Access],
    accesses_named: &'static str,
    rule: Rule,
    what: &'static str,
    verb: &'static str,
    index_named: &'static str,
}

const ATOMIC_TARGET: ElementTarget = ElementTarget {
    accesses: &[Access::ReadWrite, Access::Workgroup],
    accesses_named: "read_write or workgroup",
    rule: Rule::AtomicBuffer,
    what: "atomic",
    verb: "targets",
    index_named: "the atomic index",
};

const ACQUIRE_TARGET: ElementTarget = ElementTarget {
    accesses: &[Access::ReadOnly, Access::ReadWrite],
    accesses_named: "read_only or read_write",
    rule: Rule::AcquireLoadBuffer,
    what: "acquire load",
    verb: "reads",
    index_named: "the acquire load index",
};
