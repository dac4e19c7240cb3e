//! The program value: buffer and scalar parameter declarations, workgroup shape and
//! an entry body.
//!
//! A tokenizer dispatches the same few programs thousands of times, so the
//! expensive facts about a program (its content digest, its node count) are
//! memoised inside the shared allocation: every clone of a `Program` is a
//! pointer copy and sees the memo. A measured backend whose per-dispatch
//! cost grew with program size because it re-walked the program on every
//! call; this layout is what lets ours not do that.

use std::fmt;
use std::sync::{Arc, OnceLock};

use super::digest::Digest;

/// A name of a buffer or a variable. Shared, so cloning a program never copies text.
pub type Name = Arc<str>;

/// A sequence of nodes executed in order. Shared, so rewrites can reuse untouched blocks.
pub type Block = Arc<[Node]>;

/// The element type of a buffer in memory.
///
/// `U8` exists because a tokenizer reads text: a load from a `U8` buffer yields a
/// `u32` value in `0..=255`, and a store of a `u32` value into a `U8` buffer keeps
/// its low 8 bits. Booleans are values only, never buffer elements. `U64` and `I64`
/// elements are 8 bytes, little-endian, like every other element in a dispatch's
/// byte slices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ElemType {
    /// One byte per element; loads zero-extend to `u32`, stores truncate.
    U8,
    /// Unsigned 32-bit integer.
    U32,
    /// Signed 32-bit integer (two's complement).
    I32,
    /// IEEE-754 binary32.
    F32,
    /// Unsigned 64-bit integer.
    U64,
    /// Signed 64-bit integer (two's complement).
    I64,
}

impl ElemType {
    /// Every element type, for generators and exhaustive tests.
    pub const ALL: [ElemType; 6] = [
        ElemType::U8,
        ElemType::U32,
        ElemType::I32,
        ElemType::F32,
        ElemType::U64,
        ElemType::I64,
    ];

    /// Bytes one element occupies in a buffer.
    pub const fn size_bytes(self) -> u32 {
        match self {
            ElemType::U8 => 1,
            ElemType::U64 | ElemType::I64 => 8,
            _ => 4,
        }
    }

    /// The type of the value a load of this element produces (and a store expects).
    pub const fn value_type(self) -> ScalarType {
        match self {
            ElemType::U8 | ElemType::U32 => ScalarType::U32,
            ElemType::I32 => ScalarType::I32,
            ElemType::F32 => ScalarType::F32,
            ElemType::U64 => ScalarType::U64,
            ElemType::I64 => ScalarType::I64,
        }
    }

    /// Lower-case name used in `Display` and error messages.
    pub const fn name(self) -> &'static str {
        match self {
            ElemType::U8 => "u8",
            ElemType::U32 => "u32",
            ElemType::I32 => "i32",
            ElemType::F32 => "f32",
            ElemType::U64 => "u64",
            ElemType::I64 => "i64",
        }
    }
}

/// The type of a value an expression produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScalarType {
    /// Unsigned 32-bit integer; arithmetic wraps.
    U32,
    /// Signed 32-bit integer; arithmetic wraps.
    I32,
    /// IEEE-754 binary32, round to nearest even, denormals preserved, no fused multiply-add.
    F32,
    /// A truth value.
    Bool,
    /// Unsigned 64-bit integer; arithmetic wraps.
    U64,
    /// Signed 64-bit integer; arithmetic wraps.
    I64,
}

impl ScalarType {
    /// Every value type, for generators and exhaustive tests.
    pub const ALL: [ScalarType; 6] = [
        ScalarType::U32,
        ScalarType::I32,
        ScalarType::F32,
        ScalarType::Bool,
        ScalarType::U64,
        ScalarType::I64,
    ];

    /// Lower-case name used in `Display` and error messages.
    pub const fn name(self) -> &'static str {
        match self {
            ScalarType::U32 => "u32",
            ScalarType::I32 => "i32",
            ScalarType::F32 => "f32",
            ScalarType::Bool => "bool",
            ScalarType::U64 => "u64",
            ScalarType::I64 => "i64",
        }
    }

    /// `u32`, `i32`, `u64` or `i64`.
    pub const fn is_integer(self) -> bool {
        matches!(
            self,
            ScalarType::U32 | ScalarType::I32 | ScalarType::U64 | ScalarType::I64
        )
    }

    /// `u64` or `i64`: values of 64 bits.
    pub const fn is_wide(self) -> bool {
        matches!(self, ScalarType::U64 | ScalarType::I64)
    }

    /// Bits of the type's values: 64 for `u64` and `i64`, 32 for the others (`bool`
    /// included: its pattern is 0 or 1).
    pub const fn bits(self) -> u32 {
        if self.is_wide() {
            64
        } else {
            32
        }
    }
}

/// How a kernel may touch a buffer, and where it lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// Global memory the kernel only reads. Never read back.
    ReadOnly,
    /// Global memory the kernel reads and writes. Read back after a dispatch.
    ReadWrite,
    /// Global memory the kernel only writes; its initial contents are zero. Read back.
    WriteOnly,
    /// Per-workgroup shared memory (`.shared` in PTX): one instance per workgroup,
    /// zero at kernel start, not a kernel parameter, never read back. Needs a static count.
    Workgroup,
    /// A per-thread array (`.local` in PTX): one instance per thread, zero at kernel
    /// start, not a kernel parameter, never read back, no atomics. Needs a static
    /// count; all of a program's local arrays together take at most
    /// [`MAX_LOCAL_ARRAY_BYTES`](super::validate::MAX_LOCAL_ARRAY_BYTES) per thread.
    /// Indexed at run time and bounds-checked like any buffer (an out-of-range load
    /// reads 0, a store does nothing). ptxas keeps it in registers when it can resolve
    /// every index, in the thread's local memory (its stack) otherwise.
    Local,
}

impl Access {
    /// Lower-case name used in `Display` and error messages.
    pub const fn name(self) -> &'static str {
        match self {
            Access::ReadOnly => "read_only",
            Access::ReadWrite => "read_write",
            Access::WriteOnly => "write_only",
            Access::Workgroup => "workgroup",
            Access::Local => "local",
        }
    }

    /// True for buffers a dispatch reads back (`ReadWrite`, `WriteOnly`).
    pub const fn is_output(self) -> bool {
        matches!(self, Access::ReadWrite | Access::WriteOnly)
    }

    /// True for buffers that are kernel parameters (everything but `Workgroup` and
    /// `Local`).
    pub const fn is_global(self) -> bool {
        !matches!(self, Access::Workgroup | Access::Local)
    }
}

/// How many elements a buffer holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BufferCount {
    /// Fixed at program construction; a dispatch's buffer must hold exactly this many.
    Static(u32),
    /// Decided by each dispatch; the kernel reads it from a length parameter.
    Runtime,
}

/// One buffer a program binds.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BufferDecl {
    /// Name used by loads, stores and error messages. Unique within a program.
    pub name: Name,
    /// Binding slot. Unique within a program; global buffers become kernel
    /// parameters in ascending binding order.
    pub binding: u32,
    /// Access mode and memory space.
    pub access: Access,
    /// Element type in memory.
    pub elem: ElemType,
    /// Element count.
    pub count: BufferCount,
}

impl BufferDecl {
    /// A buffer with the given fields.
    pub fn new(
        name: impl Into<Name>,
        binding: u32,
        access: Access,
        elem: ElemType,
        count: BufferCount,
    ) -> Self {
        BufferDecl {
            name: name.into(),
            binding,
            access,
            elem,
            count,
        }
    }

    /// Size in bytes of a static-count buffer, `None` for runtime-sized ones or on overflow.
    pub fn static_size_bytes(&self) -> Option<u64> {
        match self.count {
            BufferCount::Static(n) => (n as u64).checked_mul(self.elem.size_bytes() as u64),
            BufferCount::Runtime => None,
        }
    }

    /// Bytes a workgroup buffer takes in workgroup memory: its static size rounded up
    /// to a whole 4-byte word (at least one word). The validator sums these against
    /// [`Limits::max_shared_memory_bytes`](crate::ir::Limits), and code generation lays
    /// buffers out by them, so the two agree byte for byte.
    pub fn padded_size_bytes(&self) -> u64 {
        self.static_size_bytes().unwrap_or(0).div_ceil(4).max(1) * 4
    }
}

/// One scalar parameter a program declares: a named value of one type that every
/// dispatch supplies (`Dispatch::scalar("name", value)` on the backends,
/// [`reference::run_with_scalars`](crate::reference::run_with_scalars) on the
/// interpreter) and expressions read with [`Expr::Scalar`].
///
/// A scalar is the same for every thread of the grid (grid-uniform: it may decide a
/// loop around a barrier), and its value is never part of the program: a new value
/// needs no new PTX and no new JIT, and a recorded graph step takes new values
/// without re-capture. Scalars have their own namespace (`Expr::scalar("n")` and a
/// variable `n` are different things; `let n = scalar(n)` is fine). Declared in
/// order; the order is the kernel ABI's (after the buffers' parameters) and a
/// request's.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ScalarDecl {
    /// Name used by [`Expr::Scalar`], requests and error messages. Unique among the
    /// program's scalars.
    pub name: Name,
    /// The value's type (any [`ScalarType`], `bool` included).
    pub ty: ScalarType,
}

impl ScalarDecl {
    /// A scalar with the given name and type.
    pub fn new(name: impl Into<Name>, ty: ScalarType) -> Self {
        ScalarDecl {
            name: name.into(),
            ty,
        }
    }
}

/// One of the three grid axes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Axis {
    /// The fastest-varying axis.
    X,
    /// The middle axis.
    Y,
    /// The slowest-varying axis.
    Z,
}

impl Axis {
    /// 0, 1 or 2.
    pub const fn index(self) -> usize {
        match self {
            Axis::X => 0,
            Axis::Y => 1,
            Axis::Z => 2,
        }
    }

    /// `x`, `y` or `z`.
    pub const fn name(self) -> &'static str {
        match self {
            Axis::X => "x",
            Axis::Y => "y",
            Axis::Z => "z",
        }
    }
}

/// Invocation builtins; every one is a `u32` but [`Builtin::Clock`], a `u64`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Builtin {
    /// `workgroup_id * workgroup_size + local_id` on one axis.
    GlobalId(Axis),
    /// The thread's position inside its workgroup on one axis.
    LocalId(Axis),
    /// The workgroup's position in the grid on one axis.
    WorkgroupId(Axis),
    /// The number of workgroups in the grid on one axis.
    WorkgroupCount(Axis),
    /// The device's clock, a `u64` that never decreases within a thread: on CUDA
    /// `%globaltimer`, in nanoseconds (an H200 advances it in 32 ns ticks); on the
    /// reference interpreter the dispatch's units of work so far
    /// ([`ReferenceStats::work`](crate::reference::ReferenceStats::work)), its own
    /// measure of cost. For instruments inside a kernel (when each phase of a long
    /// kernel ended), never for results: no two runs read the same values. It
    /// differs between threads, so nothing workgroup-uniform may depend on it.
    Clock,
}

impl Builtin {
    /// The builtin's type: `u64` for [`Builtin::Clock`], `u32` for the others.
    pub const fn ty(self) -> ScalarType {
        match self {
            Builtin::Clock => ScalarType::U64,
            _ => ScalarType::U32,
        }
    }
}

/// A literal value.
#[derive(Clone, Copy, Debug)]
pub enum Literal {
    /// A `u32`.
    U32(u32),
    /// An `i32`.
    I32(i32),
    /// An `f32`; compared and hashed by its bit pattern.
    F32(f32),
    /// A `bool`.
    Bool(bool),
    /// A `u64`.
    U64(u64),
    /// An `i64`.
    I64(i64),
}

impl Literal {
    /// The literal's type.
    pub const fn ty(self) -> ScalarType {
        match self {
            Literal::U32(_) => ScalarType::U32,
            Literal::I32(_) => ScalarType::I32,
            Literal::F32(_) => ScalarType::F32,
            Literal::Bool(_) => ScalarType::Bool,
            Literal::U64(_) => ScalarType::U64,
            Literal::I64(_) => ScalarType::I64,
        }
    }

    /// The bit pattern of the literal, zero-extended to 64 bits (`bool` is 0 or 1; a
    /// 32-bit type's pattern is in the low 32 bits).
    pub const fn bits(self) -> u64 {
        match self {
            Literal::U32(v) => v as u64,
            Literal::I32(v) => v as u32 as u64,
            Literal::F32(v) => v.to_bits() as u64,
            Literal::Bool(v) => v as u64,
            Literal::U64(v) => v,
            Literal::I64(v) => v as u64,
        }
    }
}

impl Literal {
    /// The literal of type `ty` whose bit pattern is `bits` (the inverse of
    /// [`Literal::bits`]): a 32-bit type takes the low 32 bits, `bool` is `bits != 0`.
    pub const fn from_bits(ty: ScalarType, bits: u64) -> Literal {
        match ty {
            ScalarType::U32 => Literal::U32(bits as u32),
            ScalarType::I32 => Literal::I32(bits as u32 as i32),
            ScalarType::F32 => Literal::F32(f32::from_bits(bits as u32)),
            ScalarType::Bool => Literal::Bool(bits != 0),
            ScalarType::U64 => Literal::U64(bits),
            ScalarType::I64 => Literal::I64(bits as i64),
        }
    }
}

macro_rules! literal_from {
    ($($rust:ty => $variant:ident),* $(,)?) => {
        $(
            impl From<$rust> for Literal {
                fn from(value: $rust) -> Self {
                    Literal::$variant(value)
                }
            }
        )*
    };
}

literal_from! {
    u32 => U32, i32 => I32, f32 => F32, bool => Bool, u64 => U64, i64 => I64,
}

impl PartialEq for Literal {
    fn eq(&self, other: &Self) -> bool {
        self.ty() == other.ty() && self.bits() == other.bits()
    }
}
impl Eq for Literal {}
impl std::hash::Hash for Literal {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.ty().hash(state);
        self.bits().hash(state);
    }
}

/// Two-operand operators.
///
/// Semantics, identical on the GPU and the reference interpreter:
/// - Both operands have one type (the shift amount excepted), the result has it too
///   (comparisons give `bool`): a `u32` never meets a `u64` without a cast.
/// - `Add`, `Sub`, `Mul` wrap on integers (modulo 2^32 or 2^64); round to nearest on
///   `f32` (never fused).
/// - `Div`, `Rem` on integers: division by zero gives 0; `i32::MIN / -1` gives
///   `i32::MIN` and its remainder 0 (`i64::MIN / -1` likewise); signed division
///   truncates toward zero. `Div` on `f32` is IEEE division; `Rem` is integer-only.
/// - `Shl`, `Shr` use the right operand (a `u32`) modulo the left operand's width
///   (32 or 64); `Shr` is arithmetic on `i32` and `i64`.
/// - `Min`, `Max` on `f32` return the non-NaN operand when exactly one is NaN.
/// - Comparisons yield `bool`; `Eq`/`Ne` also compare `bool`s. `f32` compares are ordered
///   (any NaN compares false, except `Ne`, which is true).
/// - `LogicalAnd`, `LogicalOr` take and yield `bool`; both sides are evaluated.
/// - `PermuteBytes` takes a `u64` (eight source bytes, byte `i` its bits
///   `8i..8i + 8`) and a `u32` selector, and yields a `u32` whose byte `k` is the
///   source byte that the selector's nibble `k` (bits `4k..4k + 4`) names in its low
///   three bits, or, where the nibble's high bit is set, that byte's top bit copied
///   into all eight; the selector's bits 16..32 are ignored. It is PTX's `prmt.b32`
///   (default mode) on the `u64`'s two halves: one instruction where shifts and masks
///   take one per byte, which makes it the cheap way to apply a table of eight small
///   values to four indices at once (composing transition maps, say).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    BitAnd,
    BitOr,
    BitXor,
    Shl,
    Shr,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Min,
    Max,
    LogicalAnd,
    LogicalOr,
    PermuteBytes,
}

impl BinaryOp {
    /// Every operator, for generators and exhaustive tests.
    pub const ALL: [BinaryOp; 21] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Rem,
        BinaryOp::BitAnd,
        BinaryOp::BitOr,
        BinaryOp::BitXor,
        BinaryOp::Shl,
        BinaryOp::Shr,
        BinaryOp::Eq,
        BinaryOp::Ne,
        BinaryOp::Lt,
        BinaryOp::Le,
        BinaryOp::Gt,
        BinaryOp::Ge,
        BinaryOp::Min,
        BinaryOp::Max,
        BinaryOp::LogicalAnd,
        BinaryOp::LogicalOr,
        BinaryOp::PermuteBytes,
    ];

    /// The operator as written in `Display`.
    pub const fn symbol(self) -> &'static str {
        match self {
            BinaryOp::Add => "+",
            BinaryOp::Sub => "-",
            BinaryOp::Mul => "*",
            BinaryOp::Div => "/",
            BinaryOp::Rem => "%",
            BinaryOp::BitAnd => "&",
            BinaryOp::BitOr => "|",
            BinaryOp::BitXor => "^",
            BinaryOp::Shl => "<<",
            BinaryOp::Shr => ">>",
            BinaryOp::Eq => "==",
            BinaryOp::Ne => "!=",
            BinaryOp::Lt => "<",
            BinaryOp::Le => "<=",
            BinaryOp::Gt => ">",
            BinaryOp::Ge => ">=",
            BinaryOp::Min => "min",
            BinaryOp::Max => "max",
            BinaryOp::LogicalAnd => "&&",
            BinaryOp::LogicalOr => "||",
            BinaryOp::PermuteBytes => "permute_bytes",
        }
    }

    /// True for operators that yield `bool` from two same-typed operands.
    pub const fn is_comparison(self) -> bool {
        matches!(
            self,
            BinaryOp::Eq | BinaryOp::Ne | BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge
        )
    }
}

/// One-operand operators.
///
/// - `Neg`: `i32`, `i64` (wrapping) or `f32`.
/// - `BitNot`: any integer type. `LogicalNot`: `bool`.
/// - `Abs`: `i32`, `i64` (wrapping: `abs(i32::MIN) == i32::MIN`) or `f32` (clears the
///   sign bit).
/// - `CountOnes`, `LeadingZeros`: any integer type, yield `u32` (`leading_zeros` of 0
///   is the width, 32 or 64).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum UnaryOp {
    Neg,
    BitNot,
    LogicalNot,
    Abs,
    CountOnes,
    LeadingZeros,
}

impl UnaryOp {
    /// Every operator, for generators and exhaustive tests.
    pub const ALL: [UnaryOp; 6] = [
        UnaryOp::Neg,
        UnaryOp::BitNot,
        UnaryOp::LogicalNot,
        UnaryOp::Abs,
        UnaryOp::CountOnes,
        UnaryOp::LeadingZeros,
    ];

    /// The operator as written in `Display`.
    pub const fn symbol(self) -> &'static str {
        match self {
            UnaryOp::Neg => "-",
            UnaryOp::BitNot => "~",
            UnaryOp::LogicalNot => "!",
            UnaryOp::Abs => "abs",
            UnaryOp::CountOnes => "count_ones",
            UnaryOp::LeadingZeros => "leading_zeros",
        }
    }
}

/// Atomic read-modify-write operations on an integer buffer element (`u32`, `i32`,
/// `u64` or `i64`) with an operand `v` of the element's value type. Each replaces the
/// element `x` by: `Add` `x + v`, `Sub` `x - v` (both wrapping), `Min`/`Max` the
/// smaller/larger (signed for `i32`/`i64`), `And`/`Or`/`Xor` the bitwise operation,
/// `Exchange` `v`. [`Node::AtomicFetch`] also returns `x`; [`Node::Atomic`] does not.
///
/// # Which results depend on the order threads run in
///
/// Threads of a dispatch reach an atomic in no defined order on the GPU; the reference
/// interpreter applies one statement's atomics in ascending global thread id (lockstep
/// order). What a program can rely on:
/// - The final value of an element that several threads update with the **same**
///   commutative operation (`Add`, `Sub`, `Min`, `Max`, `And`, `Or`, `Xor`) between two
///   barriers does not depend on the order. Mixing two operations on one element
///   (`(x + a) | b` is not `(x | b) + a`), or `Exchange` / compare-exchange with
///   different operands, makes it order-dependent.
/// - A **returned** value depends on the order as soon as two threads touch the same
///   element: which thread sees which previous value is a race (a fetch-add that
///   claims output slots hands out the same slots, to other threads). When every
///   thread applies the same operation with the same operand, the *multiset* of
///   returned values does not depend on the order, so an order-free use of them (one
///   function of the value summed into one element, or a constant stored at each
///   claimed slot) gives the same bytes on the GPU and the reference; using them
///   differently at two sites is not order-free (the order decides which site got
///   which value). An element only one thread touches returns a deterministic value.
///
/// `ReferenceOptions::reverse_atomic_order` runs the reference with each statement's
/// atomics in descending order instead: outputs that change with it depend on the
/// order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum AtomicOp {
    Add,
    Min,
    Max,
    Or,
    Sub,
    And,
    Xor,
    Exchange,
}

impl AtomicOp {
    /// Every operation, for generators and exhaustive tests.
    pub const ALL: [AtomicOp; 8] = [
        AtomicOp::Add,
        AtomicOp::Sub,
        AtomicOp::Min,
        AtomicOp::Max,
        AtomicOp::And,
        AtomicOp::Or,
        AtomicOp::Xor,
        AtomicOp::Exchange,
    ];

    /// Lower-case name.
    pub const fn name(self) -> &'static str {
        match self {
            AtomicOp::Add => "add",
            AtomicOp::Min => "min",
            AtomicOp::Max => "max",
            AtomicOp::Or => "or",
            AtomicOp::Sub => "sub",
            AtomicOp::And => "and",
            AtomicOp::Xor => "xor",
            AtomicOp::Exchange => "exchange",
        }
    }

    /// Whether applying it twice with any operands gives the same element in either
    /// order (every operation but `Exchange`).
    pub const fn commutes(self) -> bool {
        !matches!(self, AtomicOp::Exchange)
    }
}

/// Reductions over `u32` values: `Sum` wraps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum ReduceOp {
    Sum,
    Min,
    Max,
}

impl ReduceOp {
    /// Lower-case name.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
        }
    }

    /// The value that leaves any operand unchanged.
    pub const fn identity(self) -> u32 {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Min => u32::MAX,
            ReduceOp::Max => 0,
        }
    }

    /// Combine two values.
    pub fn combine(self, a: u32, b: u32) -> u32 {
        match self {
            ReduceOp::Sum => a.wrapping_add(b),
            ReduceOp::Min => a.min(b),
            ReduceOp::Max => a.max(b),
        }
    }
}

/// Whether a scan's result includes the thread's own value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScanKind {
    /// Thread `i` gets `v_0 ⊕ v_1 ⊕ ... ⊕ v_i`.
    Inclusive,
    /// Thread `i` gets `v_0 ⊕ ... ⊕ v_(i-1)`; the first thread gets the operation's
    /// identity (0 for sum and max, `u32::MAX` for min).
    Exclusive,
}

impl ScanKind {
    /// Lower-case name.
    pub const fn name(self) -> &'static str {
        match self {
            ScanKind::Inclusive => "inclusive",
            ScanKind::Exclusive => "exclusive",
        }
    }
}

/// An expression: a pure computation of one scalar value per thread.
///
/// `Clone`, `Drop`, `==`, `Hash` and `Debug` never recurse (see `structural.rs`): an
/// expression nested a million deep is cloned, compared and dropped on a 2 MiB stack.
pub enum Expr {
    /// A constant.
    Literal(Literal),
    /// The current value of a variable declared earlier in an enclosing block.
    Var(Name),
    /// Element `index` (a `u32`) of a buffer. With bounds checks on (the default), an
    /// index at or past the buffer's length reads 0 of the element's value type.
    Load {
        /// Buffer name.
        buffer: Name,
        /// Element index, `u32`.
        index: Box<Expr>,
    },
    /// The buffer's element count as a `u32` (static, or the dispatch's runtime length).
    Length {
        /// Buffer name.
        buffer: Name,
    },
    /// The value the dispatch supplied for the program's scalar parameter of this
    /// name ([`ScalarDecl`]), of its declared type; the same in every thread.
    Scalar(Name),
    /// A two-operand operation; see [`BinaryOp`] for semantics.
    Binary {
        /// Operator.
        op: BinaryOp,
        /// Left operand.
        lhs: Box<Expr>,
        /// Right operand.
        rhs: Box<Expr>,
    },
    /// A one-operand operation; see [`UnaryOp`].
    Unary {
        /// Operator.
        op: UnaryOp,
        /// Operand.
        operand: Box<Expr>,
    },
    /// `if condition { if_true } else { if_false }` for values; both arms are evaluated.
    Select {
        /// A `bool`.
        condition: Box<Expr>,
        /// Value when true.
        if_true: Box<Expr>,
        /// Value when false; same type as `if_true`.
        if_false: Box<Expr>,
    },
    /// Convert to another scalar type, with Rust `as` semantics: `f32` → integer
    /// truncates toward zero and saturates, NaN gives 0; integer → `f32` rounds to
    /// nearest; `u32` ↔ `i32` and `u64` ↔ `i64` reinterpret the bits; a 64-bit integer
    /// → a 32-bit one keeps the low 32 bits; `u32` → 64 bits zero-extends and `i32` →
    /// 64 bits sign-extends; `bool` → number is 0 or 1; number → `bool` is `!= 0` (NaN
    /// is true).
    Cast {
        /// Target type.
        to: ScalarType,
        /// Value to convert.
        value: Box<Expr>,
    },
    /// An invocation builtin (`u32`).
    Builtin(Builtin),
    /// The `u32` value held by lane `lane ^ lane_mask` of this thread's subgroup (warp).
    /// Produced only by lowering; user programs are rejected if they contain it.
    /// Requires every lane of the subgroup to be active.
    SubgroupShuffleXor {
        /// A `u32` value.
        value: Box<Expr>,
        /// XOR mask, less than the subgroup size.
        lane_mask: u32,
    },
    /// The reduction of a `u32` value over all lanes of this thread's subgroup,
    /// visible to every lane. Produced only by lowering.
    SubgroupReduce {
        /// Reduction.
        op: ReduceOp,
        /// A `u32` value.
        value: Box<Expr>,
    },
    /// The prefix of a `u32` value over the lanes of this thread's subgroup, in lane
    /// order ([`ScanKind`]). Produced only by lowering; requires every lane of the
    /// subgroup to be active.
    SubgroupScan {
        /// Combining operation.
        op: ReduceOp,
        /// Inclusive or exclusive.
        kind: ScanKind,
        /// A `u32` value.
        value: Box<Expr>,
    },
}

/// A statement.
///
/// `Drop`, `==`, `Hash` and `Debug` never recurse (see `structural.rs`); `Clone`
/// copies the node's expressions and shares its blocks.
#[derive(Clone)]
pub enum Node {
    /// Declare a variable holding `value`; visible to the rest of the enclosing block
    /// and the blocks nested in it. Names may not shadow a variable already in scope.
    Let {
        /// Variable name.
        name: Name,
        /// Whether `Assign` may change it later.
        mutable: bool,
        /// Initial value; fixes the variable's type.
        value: Expr,
    },
    /// Give a mutable variable a new value of the same type.
    Assign {
        /// Variable name.
        name: Name,
        /// New value.
        value: Expr,
    },
    /// Write element `index` of a writable buffer. With bounds checks on, an
    /// out-of-range index writes nothing. A `U8` buffer keeps the value's low 8 bits.
    Store {
        /// Buffer name.
        buffer: Name,
        /// Element index, `u32`.
        index: Expr,
        /// Value of the buffer element's value type.
        value: Expr,
    },
    /// Run one of two blocks.
    If {
        /// A `bool`.
        condition: Expr,
        /// Runs when true.
        then_body: Block,
        /// Runs when false (may be empty).
        else_body: Block,
    },
    /// `for variable in start..end { body }` over `u32`; `start` and `end` are evaluated
    /// once, before the first iteration, so the loop is bounded. The loop variable is
    /// immutable inside the body. [`Node::Break`] leaves the loop, [`Node::Continue`]
    /// goes on with the next value.
    Loop {
        /// Loop variable (`u32`).
        variable: Name,
        /// First value, inclusive.
        start: Expr,
        /// Last value, exclusive.
        end: Expr,
        /// Body.
        body: Block,
    },
    /// `while condition { body }`: evaluate `condition` (a `bool`) and, while it is
    /// true, run `body` and evaluate it again. The loop exits on data, so it need not
    /// terminate: on the GPU a runaway loop runs until the launch is killed, unless
    /// [`CodegenOptions::max_loop_iterations`](crate::CodegenOptions::max_loop_iterations)
    /// caps it (the kernel then traps, a `KernelFault` naming the program); the
    /// reference interpreter stops it at its work cap (or at the same iteration cap)
    /// with an `Err`. Threads leave the loop independently: a thread whose condition
    /// is false (or that runs [`Node::Break`]) waits after the loop while the others
    /// go on, so a barrier, workgroup reduction or scan inside the body needs a
    /// workgroup-uniform condition and no `break`/`continue` under divergent control
    /// (the validator refuses the rest). Variables declared in the body are new in
    /// every iteration; assignments to outer variables persist.
    While {
        /// A `bool`, evaluated before every iteration.
        condition: Expr,
        /// Body.
        body: Block,
    },
    /// Leave the innermost enclosing loop ([`Node::Loop`] or [`Node::While`]) now:
    /// the thread continues after it. Only valid inside a loop.
    Break,
    /// End this iteration of the innermost enclosing loop: a [`Node::Loop`] goes on with
    /// its next value, a [`Node::While`] evaluates its condition again. Only valid
    /// inside a loop.
    Continue,
    /// Wait until every thread of the workgroup arrives; memory written to workgroup and
    /// global buffers before it is visible to the workgroup after it. Must be reached by
    /// every thread of the workgroup (workgroup-uniform control flow).
    Barrier,
    /// Wait until every thread of the whole grid arrives; global memory written before it
    /// is visible to the grid after it. Needs grid-uniform control flow and a grid that
    /// fits on the device at once (launched cooperatively).
    GridSync,
    /// A device-scope memory fence with acquire and release semantics: this thread's
    /// global-memory reads and writes before it (atomics included) are ordered before
    /// its reads and writes after it, as every thread of the device observes them.
    /// Atomics are relaxed: two atomics of one thread to different elements may take
    /// effect in either order, so a protocol in which one thread's atomic tells
    /// another workgroup that its earlier writes are done (a counter of finished
    /// workgroups, a flag beside data) needs a fence between them in the writer and
    /// one after the observing atomic in the reader. Valid anywhere a statement is
    /// (it waits for no other thread); the reference interpreter, which runs in
    /// lockstep, treats it as a no-op.
    Fence,
    /// [`Node::Fence`] for the threads of this thread's workgroup only: its global-
    /// and workgroup-memory reads and writes before it are ordered before those after
    /// it as the threads of its workgroup observe them (PTX `fence.acq_rel.cta`),
    /// with no wait for the rest of the device to see them. Enough wherever a
    /// protocol's reader is in the writer's workgroup, as in a kernel that runs one
    /// workgroup; a reader in another workgroup needs [`Node::Fence`]. Valid anywhere
    /// a statement is; a no-op on the reference interpreter.
    WorkgroupFence,
    /// Atomic read-modify-write of element `index` of an integer (`u32`, `i32`, `u64`
    /// or `i64`) `ReadWrite` or `Workgroup` buffer; see [`AtomicOp`] for the operations
    /// and what depends on thread order. Out-of-range indices do nothing (bounds
    /// checks on).
    Atomic {
        /// Operation.
        op: AtomicOp,
        /// Buffer name.
        buffer: Name,
        /// Element index, `u32`.
        index: Expr,
        /// Operand, of the element's value type.
        value: Expr,
    },
    /// `let name = atomic_fetch_<op>(&buffer[index], value);`: [`Node::Atomic`] that
    /// also declares an immutable variable holding the element's value from just
    /// before this thread's operation (an out-of-range index, with bounds checks on,
    /// changes nothing and gives 0). Which value a thread gets depends on the order
    /// of the threads that touch the element ([`AtomicOp`]).
    AtomicFetch {
        /// Variable holding the previous value (the element's value type).
        name: Name,
        /// Operation.
        op: AtomicOp,
        /// Buffer name.
        buffer: Name,
        /// Element index, `u32`.
        index: Expr,
        /// Operand, of the element's value type.
        value: Expr,
    },
    /// `let name = atomic_compare_exchange(&buffer[index], expected, value);`: one
    /// atomic step that replaces the element by `value` when it equals `expected`,
    /// and declares an immutable variable holding the element's previous value (so
    /// the exchange happened exactly when `name == expected`). Same buffers, bounds
    /// and order rules as [`Node::AtomicFetch`]: which of several threads racing on
    /// one element wins depends on thread order.
    CompareExchange {
        /// Variable holding the previous value (the element's value type).
        name: Name,
        /// Buffer name.
        buffer: Name,
        /// Element index, `u32`.
        index: Expr,
        /// The value the element must hold, of its value type.
        expected: Expr,
        /// The value it then gets, of its value type.
        value: Expr,
    },
    /// `let name = atomic_load(&buffer[index]);`: declares an immutable variable
    /// holding element `index` as one atomic read at device scope sees it, changing
    /// nothing. Same buffers and bounds as [`Node::AtomicFetch`] (an out-of-range
    /// index gives 0). It reads where atomics and other workgroups' writes meet
    /// (on CUDA a relaxed load at GPU scope, which never hits a stale line of the
    /// multiprocessor's own cache), so a thread that polls an element another
    /// workgroup publishes by an atomic sees the value arrive, as an
    /// `atomic_fetch_or` of 0 would, without that read-modify-write's cost in
    /// the memory system: a warp's loads of consecutive elements travel
    /// together. Relaxed like every atomic: what another element held when this
    /// one was written needs [`Node::Fence`]s. Which value a thread gets depends
    /// on the order of the threads that write the element.
    AtomicLoad {
        /// Variable holding the element's value (the element's value type).
        name: Name,
        /// Buffer name.
        buffer: Name,
        /// Element index, `u32`.
        index: Expr,
    },
    /// `let name = acquire_load(&buffer[index]);`: declares an immutable variable
    /// holding element `index` as one atomic read at system scope (the host and
    /// other devices included) sees it, with acquire ordering, changing nothing.
    /// Every load this thread issues after it sees what was written before the
    /// release store that put the value there, and a [`Node::Barrier`] after it
    /// carries that to the loads the workgroup's other threads issue after the
    /// barrier.
    /// It is how a kernel polls a flag the host sets in mapped (pinned) memory
    /// while the kernel runs and then reads the data the host wrote before the
    /// flag: a relaxed load at GPU scope ([`Node::AtomicLoad`]) promises nothing
    /// about the host's writes. Global buffers the kernel only reads or also
    /// writes, of `u32`, `i32`, `u64` or `i64`; an out-of-range index gives 0.
    /// Its result is divergent like every atomic's. On CUDA each one is a
    /// strong load and a system-scope fence (an L1 invalidation on sm_90 and a
    /// driver of CUDA 12.8 or later; elsewhere a memory barrier that waits for the
    /// thread's earlier accesses: [`crate::AcquireFence`]): poll a flag with it,
    /// read the data after it with plain loads. The reference interpreter reads the element as
    /// [`Node::AtomicLoad`] does: it runs the kernel after the host has written
    /// everything.
    AcquireLoad {
        /// Variable holding the element's value (the element's value type).
        name: Name,
        /// Buffer name.
        buffer: Name,
        /// Element index, `u32`.
        index: Expr,
    },
    /// Declare an immutable `u32` variable holding the reduction of `value` over every
    /// thread of the workgroup; all threads see the same result. Needs
    /// workgroup-uniform control flow. Lowering rewrites it before code generation.
    WorkgroupReduce {
        /// Variable name of the result.
        name: Name,
        /// Reduction.
        op: ReduceOp,
        /// Each thread's contribution, `u32`.
        value: Expr,
    },
    /// Declare an immutable `u32` variable holding this thread's prefix of `value`
    /// over the threads of its workgroup in local linear id order (`x + size_x * (y +
    /// size_y * z)`; see [`ScanKind`]): a prefix sum gives each thread its offset in a
    /// compaction. Each thread sees its own result; it does not depend on the order
    /// threads run in. Needs workgroup-uniform control flow (every thread of the
    /// workgroup takes part). `Sum` wraps. Lowering (`crate::lower`) rewrites it
    /// before code generation, like [`Node::WorkgroupReduce`].
    WorkgroupScan {
        /// Variable name of the result.
        name: Name,
        /// Combining operation.
        op: ReduceOp,
        /// Inclusive or exclusive.
        kind: ScanKind,
        /// Each thread's contribution, `u32`.
        value: Expr,
    },
    /// End this thread's execution. Threads that returned count as arrived at later
    /// barriers only if the return was in uniform control flow; the validator rejects
    /// barriers reachable after a divergent return.
    Return,
}

pub(crate) struct ProgramInner {
    pub(crate) buffers: Arc<[BufferDecl]>,
    pub(crate) scalars: Arc<[ScalarDecl]>,
    pub(crate) workgroup_size: [u32; 3],
    pub(crate) entry: Block,
    pub(crate) entry_op_id: Option<Name>,
    pub(crate) non_composable_with_self: bool,
    pub(crate) digest: OnceLock<Digest>,
    pub(crate) node_count: OnceLock<u64>,
    /// The validator's verdicts: per [`ProgramForm`] (index `ProgramForm::slot`),
    /// up to `VALIDITY_SLOTS` sets of [`Limits`](super::Limits), first come first
    /// served (the backend's device limits, lowering's and codegen's own).
    pub(crate) validity: [[OnceLock<super::validate::ValidityMemo>; VALIDITY_SLOTS]; 2],
    /// Storage for `lower::lower_workgroup_reductions`'s memo: `ir` owns the slot,
    /// `lower` decides what goes in it (so `ir` depends on nothing above it).
    pub(crate) lowered: OnceLock<LoweringMemo>,
}

/// Verdicts memoised per program and form, each for one set of limits.
pub(crate) const VALIDITY_SLOTS: usize = 4;

/// What a program's lowering memo slot remembers (filled only by `lower`).
///
/// An unchanged program is recorded as `needs_lowering: false` rather than as a
/// pointer to itself, which would be a reference cycle and leak the program.
#[derive(Debug)]
pub(crate) struct LoweringMemo {
    /// Whether the program contains a [`Node::WorkgroupReduce`] or [`Node::WorkgroupScan`]
    /// anywhere.
    pub(crate) needs_lowering: bool,
    /// The lowered program and the lowering-capabilities key it was made for (only
    /// set when `needs_lowering`). One key per program: a call with another key
    /// recomputes.
    pub(crate) result: OnceLock<(u64, Program)>,
}

impl LoweringMemo {
    /// The memo of a program lowering leaves as it is.
    pub(crate) fn unchanged() -> Self {
        LoweringMemo {
            needs_lowering: false,
            result: OnceLock::new(),
        }
    }
}

/// Which rule set a program was validated against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProgramForm {
    /// A user program: [`validate`](super::validate()) (workgroup reductions allowed,
    /// subgroup expressions and reserved names refused).
    User,
    /// A lowered program: [`validate_lowered`](super::validate_lowered())
    /// (subgroup expressions and reserved names allowed, workgroup reductions refused).
    Lowered,
}

impl ProgramForm {
    pub(crate) const fn slot(self) -> usize {
        match self {
            ProgramForm::User => 0,
            ProgramForm::Lowered => 1,
        }
    }
}

/// An immutable program. Cloning copies one pointer; the digest and node count
/// are computed at most once per value and shared by every clone.
#[derive(Clone)]
pub struct Program {
    pub(crate) inner: Arc<ProgramInner>,
}

impl Program {
    /// A program from its parts. Prefer [`Program::builder`] in user code.
    pub fn new(buffers: Vec<BufferDecl>, workgroup_size: [u32; 3], entry: Vec<Node>) -> Self {
        Self::from_parts(
            buffers.into(),
            Vec::new().into(),
            workgroup_size,
            entry.into(),
            None,
            false,
        )
    }

    pub(crate) fn from_parts(
        buffers: Arc<[BufferDecl]>,
        scalars: Arc<[ScalarDecl]>,
        workgroup_size: [u32; 3],
        entry: Block,
        entry_op_id: Option<Name>,
        non_composable_with_self: bool,
    ) -> Self {
        Program {
            inner: Arc::new(ProgramInner {
                buffers,
                scalars,
                workgroup_size,
                entry,
                entry_op_id,
                non_composable_with_self,
                digest: OnceLock::new(),
                node_count: OnceLock::new(),
                validity: Default::default(),
                lowered: OnceLock::new(),
            }),
        }
    }

    /// Start building a program with the given workgroup size.
    pub fn builder(workgroup_size: [u32; 3]) -> super::builder::ProgramBuilder {
        super::builder::ProgramBuilder::new(workgroup_size)
    }

    /// Buffer declarations, in declaration order.
    pub fn buffers(&self) -> &[BufferDecl] {
        &self.inner.buffers
    }

    /// Shared handle to the buffer declarations (for rewrites that keep them).
    pub fn buffers_shared(&self) -> &Arc<[BufferDecl]> {
        &self.inner.buffers
    }

    /// Scalar parameter declarations, in declaration order (the order of their
    /// kernel parameters and of a dispatch's values).
    pub fn scalars(&self) -> &[ScalarDecl] {
        &self.inner.scalars
    }

    /// Shared handle to the scalar declarations (for rewrites that keep them).
    pub fn scalars_shared(&self) -> &Arc<[ScalarDecl]> {
        &self.inner.scalars
    }

    /// The position (declaration order) and declaration of the scalar named `name`.
    pub fn scalar(&self, name: &str) -> Option<(usize, &ScalarDecl)> {
        self.inner
            .scalars
            .iter()
            .enumerate()
            .find(|(_, decl)| &*decl.name == name)
    }

    /// Threads per workgroup on each axis.
    pub fn workgroup_size(&self) -> [u32; 3] {
        self.inner.workgroup_size
    }

    /// Threads per workgroup, or `None` if the product overflows `u32`.
    pub fn threads_per_workgroup(&self) -> Option<u32> {
        let [x, y, z] = self.inner.workgroup_size;
        x.checked_mul(y)?.checked_mul(z)
    }

    /// The entry body.
    pub fn entry(&self) -> &Block {
        &self.inner.entry
    }

    /// The entry op id (a name used in diagnostics), if one was given.
    pub fn entry_op_id(&self) -> Option<&str> {
        self.inner.entry_op_id.as_deref()
    }

    /// Whether this program must not be fused with another copy of itself.
    pub fn non_composable_with_self(&self) -> bool {
        self.inner.non_composable_with_self
    }

    /// A new program equal to this one but with the given entry op id (fresh digest).
    pub fn with_entry_op_id(&self, id: impl Into<Name>) -> Program {
        Self::from_parts(
            self.inner.buffers.clone(),
            self.inner.scalars.clone(),
            self.inner.workgroup_size,
            self.inner.entry.clone(),
            Some(id.into()),
            self.inner.non_composable_with_self,
        )
    }

    /// A new program equal to this one but with the given flag (fresh digest).
    pub fn with_non_composable_with_self(&self, flag: bool) -> Program {
        Self::from_parts(
            self.inner.buffers.clone(),
            self.inner.scalars.clone(),
            self.inner.workgroup_size,
            self.inner.entry.clone(),
            self.inner.entry_op_id.clone(),
            flag,
        )
    }

    /// A new program with the same scalars and flags but other buffers and another
    /// entry body (fresh digest). Used by rewrites.
    pub fn with_entry(&self, buffers: Arc<[BufferDecl]>, entry: Block) -> Program {
        Self::from_parts(
            buffers,
            self.inner.scalars.clone(),
            self.inner.workgroup_size,
            entry,
            self.inner.entry_op_id.clone(),
            self.inner.non_composable_with_self,
        )
    }

    /// Finds a buffer declaration by name.
    pub fn buffer(&self, name: &str) -> Option<&BufferDecl> {
        self.inner.buffers.iter().find(|b| &*b.name == name)
    }

    /// Global (parameter) buffers in ascending binding order: the order of kernel
    /// parameters, of dispatch inputs and of the reference interpreter's inputs.
    pub fn global_buffers(&self) -> Vec<&BufferDecl> {
        let mut v: Vec<&BufferDecl> = self
            .inner
            .buffers
            .iter()
            .filter(|b| b.access.is_global())
            .collect();
        v.sort_by_key(|b| b.binding);
        v
    }

    /// The name used for this program in diagnostics: the entry op id, or
    /// `program <first 8 hex digits of the digest>`.
    pub fn display_name(&self) -> String {
        match self.entry_op_id() {
            Some(id) => format!("'{id}'"),
            None => format!("program {}", &self.digest().to_hex()[..16]),
        }
    }

    /// The content digest: computed on first use, then shared by every clone.
    pub fn digest(&self) -> Digest {
        *self
            .inner
            .digest
            .get_or_init(|| super::digest::compute_digest(self))
    }

    /// Whether the digest has been computed for this value already.
    pub fn digest_is_memoised(&self) -> bool {
        self.inner.digest.get().is_some()
    }

    /// Number of nodes and expressions in the entry body, counting a shared block once
    /// per use and saturating at `u64::MAX` (memoised like the digest). Iterative, and
    /// each shared block allocation is walked once.
    pub fn node_count(&self) -> u64 {
        *self
            .inner
            .node_count
            .get_or_init(|| super::structural::count_tree(&self.inner.entry))
    }

    /// True when both values share one allocation (a clone, or a no-op rewrite).
    pub fn ptr_eq(a: &Program, b: &Program) -> bool {
        Arc::ptr_eq(&a.inner, &b.inner)
    }
}

impl PartialEq for Program {
    /// Structural equality (pointer-equal values are equal without a walk).
    fn eq(&self, other: &Self) -> bool {
        Program::ptr_eq(self, other)
            || (self.inner.workgroup_size == other.inner.workgroup_size
                && self.inner.non_composable_with_self == other.inner.non_composable_with_self
                && self.inner.entry_op_id == other.inner.entry_op_id
                && self.inner.buffers == other.inner.buffers
                && self.inner.scalars == other.inner.scalars
                && super::structural::blocks_equal(&self.inner.entry, &other.inner.entry))
    }
}
impl Eq for Program {}

impl fmt::Debug for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The Display form is the legible one; Debug reuses it so test failures read well.
        write!(f, "{self}")
    }
}
