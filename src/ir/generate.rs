//! Seeded program generators for fuzzing and differential testing.
//!
//! Two generators, both deterministic functions of a seed (the PRNG is a SplitMix64
//! written here, so a seed printed by a failing test reproduces the program anywhere):
//!
//! - [`arbitrary_program`] builds mostly *invalid* programs that reach every rule of
//!   the validator (colliding names and bindings, wrong types, zero and huge counts,
//!   huge workgroups, subgroup expressions, barriers under divergent control flow,
//!   nesting past the depth limit, unknown, duplicate and too many scalars). It feeds the "validation never panics" fuzz test.
//! - [`valid_program`] builds *valid* programs whose results are deterministic on a
//!   GPU, with matching inputs and a dispatch config. It feeds differential tests
//!   (reference interpreter against the CUDA backend) and the PTX checks with `ptxas`.
//!
//! Determinism rules [`valid_program`] follows, so any thread order gives the same bytes:
//! every thread stores only element `gid` (its global linear id) of each output buffer
//! and reads outputs only at `gid`; atomics that return nothing use one commutative
//! operation per program on a buffer nobody loads; a workgroup buffer is written at
//! the thread's local linear id (and by atomics), then a barrier, then only read; a
//! grid-sync stage buffer is written at `gid` before the sync and only read after it.
//! Barriers, reductions, scans and grid syncs sit in workgroup- (grid-) uniform control
//! flow and before any `return`; the `while` around a barrier has a uniform condition
//! and a uniform `break`.
//!
//! The constructs [`GeneratorOptions::core_only`] turns off keep to these rules too:
//! - every `while` loop counts down a fuel variable (at most 4) that its body
//!   decrements first and never assigns otherwise, so it ends; `break` and `continue`
//!   sit anywhere in loop bodies without barriers;
//! - atomics that **return** a value do so only where no other thread interferes
//!   (`owned[gid]`, `workgroup_owned[lid]`: one element per thread, any operation and
//!   operands), or on a shared counter that every thread updates with the program's
//!   one operation and literal operands (the values an element takes are then the same
//!   sequence whatever the order, so the *multiset* of returned values is too), their
//!   values only summed (`atomic_add`) into one tally element through one function of
//!   the value and literals, both the same at every site of the program (per site,
//!   the order would decide which site's function got which value);
//! - local arrays are private to a thread: any index (past the end too), any order;
//! - 64-bit values follow the same total semantics as 32-bit ones ([`BinaryOp`]);
//! - scalar parameters are values like literals (one per dispatch, the same in every
//!   thread), read where a leaf value goes and in workgroup-uniform conditions
//!   (they are grid-uniform), never where a literal is required (a counter's
//!   operands, a loop's start, a fuel count); every value of the declared type is
//!   as good as the case's own ([`RandomCase::scalar_values`]);
//! - acquire loads read only elements nobody writes while the kernel runs (an input
//!   anywhere, a grid-sync stage after the sync) or the thread's own element of a
//!   read-write output, so each reads what a plain load would; like scalar
//!   parameters they draw from a stream of their own.
//!
//! Each later construct is drawn for about half of the programs
//! ([`differential_case`] is the differential's case, [`constructs_used`] says which
//! constructs a program has).

use std::convert::Infallible;

use super::program::*;
use super::structural::Rebuild;
use super::validate::{Limits, MAX_SCALARS};
use crate::config::DispatchConfig;

/// A small seeded pseudo-random generator (SplitMix64). Not cryptographic; its only
/// job is to make generated programs reproducible from a seed.
#[derive(Clone, Debug)]
pub struct SeededRng {
    state: u64,
}

impl SeededRng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        SeededRng {
            state: seed ^ 0x5eed_0f0f_7679_7265,
        }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// The next 32 random bits.
    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// A value in `0..bound` (0 when `bound` is 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        if bound == 0 {
            0
        } else {
            self.next_u64() % bound
        }
    }

    /// A value in `low..=high` (`low` when the range is empty).
    pub fn range(&mut self, low: u32, high: u32) -> u32 {
        if high <= low {
            low
        } else {
            low + self.below((high - low) as u64 + 1) as u32
        }
    }

    /// True with probability `1 / n`.
    pub fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }

    /// A random element of a slice (`None` only when it is empty).
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        items.get(self.below(items.len() as u64) as usize)
    }
}

/// What [`valid_program`] may generate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GeneratorOptions {
    /// Rough budget of statements in the free-form part of the body.
    pub max_nodes: u32,
    /// Generate `GridSync` in some programs (they need a cooperative launch; grids stay small).
    pub allow_grid_sync: bool,
    /// Generate atomics on a global counter buffer and on workgroup memory.
    pub allow_atomics: bool,
    /// Generate workgroup (shared) buffers and barriers.
    pub allow_barriers: bool,
    /// Generate `WorkgroupReduce` nodes.
    pub allow_workgroup_reduce: bool,
    /// Generate early returns (always after the last barrier, reduction and grid sync).
    pub allow_early_return: bool,
    /// Generate `while` loops (each with a fuel counter, so it ends) and `break` /
    /// `continue` in loops.
    pub allow_while_loops: bool,
    /// Generate `u64` and `i64` values, literals, casts and buffers.
    pub allow_64_bit: bool,
    /// Generate atomics that return the previous value (fetch-add and the other
    /// fetches, compare-exchange) in order-free forms: on an element only one thread
    /// touches, or on a shared counter that every thread updates with one operation
    /// and one operand, with the returned values only summed into a tally.
    pub allow_returning_atomics: bool,
    /// Generate per-thread local arrays ([`Access::Local`]), stored to and loaded
    /// from at any index (in range or not).
    pub allow_local_arrays: bool,
    /// Generate workgroup scans (in workgroup-uniform control flow, before any
    /// return, like the reductions).
    pub allow_workgroup_scans: bool,
    /// Declare scalar parameters ([`ScalarDecl`]) and read them in expressions and
    /// workgroup-uniform conditions; the case carries one value per scalar
    /// ([`RandomCase::scalars`], more with [`RandomCase::scalar_values`]). Drawn
    /// from a stream of their own, so a program without scalars is the one the
    /// seed gave before they existed.
    pub allow_scalars: bool,
    /// Generate acquire loads ([`Node::AcquireLoad`]) of global integer buffers
    /// nobody writes while they run (inputs at any index, the thread's own output
    /// element). Drawn from a stream of their own, like scalar parameters, so a
    /// program without acquire loads is the one the seed gave before they existed.
    pub allow_acquire_loads: bool,
    /// Most threads per workgroup.
    pub max_threads_per_workgroup: u32,
    /// Most workgroups in the grid.
    pub max_workgroups: u32,
    /// Most fixpoint iterations in the dispatch config (at least 1).
    pub max_fixpoint_iterations: u32,
    /// Device limits every program must satisfy.
    pub limits: Limits,
}

impl Default for GeneratorOptions {
    fn default() -> Self {
        GeneratorOptions {
            max_nodes: 48,
            allow_grid_sync: false,
            allow_atomics: true,
            allow_barriers: true,
            allow_workgroup_reduce: true,
            allow_early_return: true,
            allow_while_loops: true,
            allow_64_bit: true,
            allow_returning_atomics: true,
            allow_local_arrays: true,
            allow_workgroup_scans: true,
            allow_scalars: true,
            allow_acquire_loads: true,
            max_threads_per_workgroup: 256,
            max_workgroups: 8,
            max_fixpoint_iterations: 2,
            limits: Limits::default(),
        }
    }
}

impl GeneratorOptions {
    /// These options with every construct added after the first differential runs
    /// turned off (`while`, `break`, `continue`, 64-bit integers, returning atomics,
    /// local arrays, workgroup scans, scalar parameters, acquire loads). Those
    /// constructs draw from the seed only when they are on, so a seed printed by an
    /// earlier run still gives its program with these options.
    pub fn core_only(self) -> Self {
        GeneratorOptions {
            allow_while_loops: false,
            allow_64_bit: false,
            allow_returning_atomics: false,
            allow_local_arrays: false,
            allow_workgroup_scans: false,
            allow_scalars: false,
            allow_acquire_loads: false,
            ..self
        }
    }

    /// Whether any construct [`GeneratorOptions::core_only`] turns off is on (scalar
    /// parameters and acquire loads excepted: they draw from streams of their own).
    fn extended(&self) -> bool {
        self.allow_while_loops
            || self.allow_64_bit
            || self.allow_returning_atomics
            || self.allow_local_arrays
            || self.allow_workgroup_scans
    }
}

/// Which of the constructs [`GeneratorOptions::core_only`] turns off one program
/// uses: each allowed one is drawn for about half the programs, so the differential
/// sees them alone, together and not at all. Nothing is drawn for a construct that
/// is off, which keeps `core_only` programs as they were.
#[derive(Clone, Copy, Debug, Default)]
struct Drawn {
    while_loops: bool,
    wide: bool,
    atomics: bool,
    local_arrays: bool,
    scans: bool,
    /// Drawn from `ValidGenerator::scalar_rng`, not the main stream.
    scalars: bool,
    /// Drawn from `ValidGenerator::acquire_rng`, not the main stream.
    acquire_loads: bool,
}

impl Drawn {
    fn draw(rng: &mut SeededRng, options: &GeneratorOptions) -> Self {
        Drawn {
            while_loops: options.allow_while_loops && rng.one_in(2),
            wide: options.allow_64_bit && rng.one_in(2),
            atomics: options.allow_returning_atomics && options.allow_atomics && rng.one_in(2),
            local_arrays: options.allow_local_arrays && rng.one_in(2),
            scans: options.allow_workgroup_scans && rng.one_in(2),
            scalars: false,
            acquire_loads: false,
        }
    }

    /// Whether the program uses a construct that adds statements.
    fn any_statements(&self) -> bool {
        self.while_loops || self.atomics || self.local_arrays
    }

    /// Integer element types atomics draw from.
    fn atomic_elems(&self) -> &'static [ElemType] {
        self.by_width(&ATOMIC_ELEMS_WIDE, &ATOMIC_ELEMS_WIDE[..2])
    }

    /// `wide` in a program with 64-bit values, `narrow` otherwise.
    fn by_width<T>(&self, wide: &'static [T], narrow: &'static [T]) -> &'static [T] {
        if self.wide {
            wide
        } else {
            narrow
        }
    }

    /// Value types expressions draw from.
    fn types(&self) -> &'static [ScalarType] {
        self.by_width(&TYPES_WIDE, &TYPES)
    }

    /// Element types buffers draw from.
    fn elems(&self) -> &'static [ElemType] {
        self.by_width(&ELEMS_WIDE, &ELEMS)
    }

    /// Integer types (operands of `count_ones` and `leading_zeros`).
    fn integers(&self) -> &'static [ScalarType] {
        self.by_width(&INTEGERS_WIDE, &TYPES[..2])
    }

    /// Ordered types (operands of `<` and friends).
    fn ordered(&self) -> &'static [ScalarType] {
        self.by_width(&ORDERED_WIDE, &TYPES[..3])
    }
}

/// A valid program with inputs and a dispatch config whose outputs are deterministic.
#[derive(Clone, Debug)]
pub struct RandomCase {
    /// The seed it was generated from.
    pub seed: u64,
    /// The program; passes [`crate::ir::validate()`] with the options' limits.
    pub program: Program,
    /// One byte vector per global buffer, in binding order ([`Program::global_buffers`]);
    /// write-only buffers get zeros.
    pub inputs: Vec<Vec<u8>>,
    /// Grid size and fixpoint iterations.
    pub config: DispatchConfig,
    /// One value per scalar parameter of the program, in declaration order (empty
    /// for a program without scalars); any other values of the declared types are
    /// as good ([`RandomCase::scalar_values`]).
    pub scalars: Vec<Literal>,
}

impl RandomCase {
    /// The inputs as the slices a dispatch or the reference interpreter takes.
    pub fn input_slices(&self) -> Vec<&[u8]> {
        self.inputs.iter().map(Vec::as_slice).collect()
    }

    /// Another set of values for the program's scalars (the `draw`-th, a function of
    /// the seed): the outputs must follow the values, never need a new kernel.
    /// Draw 0 is [`RandomCase::scalars`].
    pub fn scalar_values(&self, draw: u64) -> Vec<Literal> {
        if draw == 0 {
            return self.scalars.clone();
        }
        let mut rng = SeededRng::new(self.seed ^ SCALAR_STREAM ^ draw.wrapping_mul(0x9e37_79b9));
        self.program
            .scalars()
            .iter()
            .map(|decl| interesting_literal(&mut rng, decl.ty))
            .collect()
    }
}

/// Mixed into the seed of the stream scalar declarations, uses and values are drawn
/// from (`ValidGenerator::scalar_rng`).
const SCALAR_STREAM: u64 = 0x5ca1_a25e_ed5e_ed00;

/// Mixed into the seed of the stream that decides where acquire loads go and what
/// they read (`ValidGenerator::acquire_rng`).
const ACQUIRE_STREAM: u64 = 0xacc0_1ade_ed5e_ed00;

const TYPES: [ScalarType; 4] = [
    ScalarType::U32,
    ScalarType::I32,
    ScalarType::F32,
    ScalarType::Bool,
];
const ELEMS: [ElemType; 4] = [ElemType::U8, ElemType::U32, ElemType::I32, ElemType::F32];
const TYPES_WIDE: [ScalarType; 6] = ScalarType::ALL;
const ELEMS_WIDE: [ElemType; 6] = ElemType::ALL;
const INTEGERS_WIDE: [ScalarType; 4] = [
    ScalarType::U32,
    ScalarType::I32,
    ScalarType::U64,
    ScalarType::I64,
];
const ORDERED_WIDE: [ScalarType; 5] = [
    ScalarType::U32,
    ScalarType::I32,
    ScalarType::F32,
    ScalarType::U64,
    ScalarType::I64,
];
const AXES: [Axis; 3] = [Axis::X, Axis::Y, Axis::Z];
const ATOMIC_OPS: [AtomicOp; 4] = [AtomicOp::Add, AtomicOp::Min, AtomicOp::Max, AtomicOp::Or];
/// The operations whose final value is order-free when one is used alone.
const COMMUTING_ATOMIC_OPS: [AtomicOp; 7] = [
    AtomicOp::Add,
    AtomicOp::Sub,
    AtomicOp::Min,
    AtomicOp::Max,
    AtomicOp::And,
    AtomicOp::Or,
    AtomicOp::Xor,
];
const ATOMIC_ELEMS_WIDE: [ElemType; 4] =
    [ElemType::U32, ElemType::I32, ElemType::U64, ElemType::I64];
const REDUCE_OPS: [ReduceOp; 3] = [ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max];
const SCAN_KINDS: [ScanKind; 2] = [ScanKind::Inclusive, ScanKind::Exclusive];
const ACCESSES: [Access; 5] = [
    Access::ReadOnly,
    Access::ReadWrite,
    Access::WriteOnly,
    Access::Workgroup,
    Access::Local,
];

fn interesting_literal(rng: &mut SeededRng, ty: ScalarType) -> Literal {
    match ty {
        ScalarType::U32 => {
            const U: [u32; 13] = [
                0,
                1,
                2,
                3,
                7,
                31,
                32,
                33,
                255,
                256,
                0x7fff_ffff,
                0x8000_0000,
                u32::MAX,
            ];
            if rng.one_in(4) {
                Literal::U32(rng.next_u32())
            } else {
                Literal::U32(*rng.pick(&U).unwrap_or(&0))
            }
        }
        ScalarType::I32 => {
            const I: [i32; 10] = [0, 1, -1, 2, -2, 7, 31, 32, i32::MIN, i32::MAX];
            if rng.one_in(4) {
                Literal::I32(rng.next_u32() as i32)
            } else {
                Literal::I32(*rng.pick(&I).unwrap_or(&0))
            }
        }
        ScalarType::F32 => Literal::F32(f32::from_bits(interesting_f32_bits(rng))),
        ScalarType::Bool => Literal::Bool(rng.one_in(2)),
        ScalarType::U64 => {
            const U: [u64; 10] = [
                0,
                1,
                2,
                63,
                64,
                0xffff_ffff,
                0x1_0000_0000,
                0x7fff_ffff_ffff_ffff,
                0x8000_0000_0000_0000,
                u64::MAX,
            ];
            if rng.one_in(4) {
                Literal::U64(rng.next_u64())
            } else {
                Literal::U64(*rng.pick(&U).unwrap_or(&0))
            }
        }
        ScalarType::I64 => {
            const I: [i64; 9] = [
                0,
                1,
                -1,
                63,
                -64,
                i32::MIN as i64,
                u32::MAX as i64,
                i64::MIN,
                i64::MAX,
            ];
            if rng.one_in(4) {
                Literal::I64(rng.next_u64() as i64)
            } else {
                Literal::I64(*rng.pick(&I).unwrap_or(&0))
            }
        }
    }
}

fn interesting_f32_bits(rng: &mut SeededRng) -> u32 {
    const F: [f32; 14] = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        3.0,
        1e-45,
        1.175_494_4e-38,
        f32::MAX,
        -f32::MAX,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        16_777_217.0,
    ];
    match rng.below(4) {
        0 => rng.next_u32(),
        1 => ((rng.next_u32() as i32 % 2001) as f32 / 8.0).to_bits(),
        _ => rng.pick(&F).map_or(0, |f| f.to_bits()),
    }
}

/// How a buffer may be read by the valid generator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReadAt {
    /// Any index (nobody writes it during this phase).
    Anywhere,
    /// Only the thread's own global linear id.
    OwnGlobalId,
    /// Only the thread's own local linear id (a workgroup buffer).
    OwnLocalId,
}

struct Variable {
    name: Name,
    ty: ScalarType,
    mutable: bool,
}

struct ValidGenerator {
    rng: SeededRng,
    options: GeneratorOptions,
    /// Buffers loads may read, with their element type and index rule.
    readable: Vec<(Name, ElemType, ReadAt)>,
    /// Every buffer (for `Length`).
    all_buffers: Vec<Name>,
    /// Output buffers written at the thread's own index.
    outputs: Vec<(Name, ElemType)>,
    atomic_buffer: Option<Name>,
    /// The one atomic operation of this program. Different operations on one element
    /// do not commute (`(x + a) | b` differs from `(x | b) + a`), so mixing them would
    /// make the final value depend on thread order: a GPU run caught exactly that.
    atomic_op: AtomicOp,
    variables: Vec<Variable>,
    next_variable: u32,
    budget: i64,
    /// Deepest expression tree a statement gets.
    expr_depth: u32,
    /// Loops around the block being generated (`break` and `continue` need one).
    loop_depth: u32,
    /// The later constructs this program uses.
    drawn: Drawn,
    /// An integer buffer of one element per thread (read back), which returning
    /// atomics update only at the thread's own element (`gid`): their results are
    /// deterministic.
    owned: Option<(Name, ElemType)>,
    /// The workgroup counterpart of `owned`, one element per local id (`lid`).
    workgroup_owned: Option<(Name, ElemType)>,
    /// Shared counters (a global and a workgroup one) that every thread updates with
    /// `counter_update` alone, and the `u32` tally their returned values are added to.
    counters: Vec<(Name, ElemType)>,
    counter_update: CounterUpdate,
    tally: Option<Name>,
    /// Local arrays (private to each thread: any index, any order) and their lengths.
    local_arrays: Vec<(Name, ElemType, u32)>,
    /// Every draw about scalar parameters comes from here, never from `rng`: a
    /// program that draws no scalar use takes exactly the main stream it took
    /// before scalars existed.
    scalar_rng: SeededRng,
    /// The declared scalar parameters.
    scalars: Vec<ScalarDecl>,
    /// Whether and where acquire loads go, and which buffer each reads, come from
    /// here, never from `rng`: a program without one takes exactly the main stream
    /// it took before they existed.
    acquire_rng: SeededRng,
    /// Global integer buffers the kernel reads and nobody writes under an acquire
    /// load (inputs anywhere, the thread's own element of a read-write output).
    acquirable: Vec<(Name, ElemType, ReadAt)>,
}

/// The one update of a program's shared counters: an operation (a compare-exchange
/// when `op` is `None`) and literal operands. Every thread applying the same
/// function makes the sequence of values an element takes, and so the multiset of
/// returned values, independent of thread order. What becomes of a returned value is
/// one per program too (`fold` into `tally[tally_slot]`): were it chosen per site,
/// the order would decide which site, and so which function or slot, got which value.
#[derive(Clone, Copy, Debug)]
struct CounterUpdate {
    op: Option<AtomicOp>,
    operand: u64,
    expected: u64,
    fold: CounterFold,
    /// The tally element every returned value is added to (past the end: none).
    tally_slot: u32,
}

/// The function of a returned counter value (and literals alone) that is added to
/// the tally.
#[derive(Clone, Copy, Debug)]
enum CounterFold {
    Value,
    Times(u64),
    Xor(u64),
    ShiftRight(u32),
    CountOnes,
}

const GID: &str = "gid";
const LID: &str = "lid";

impl ValidGenerator {
    fn fresh_name(&mut self) -> Name {
        self.next_variable += 1;
        format!("v{}", self.next_variable).into()
    }

    fn declare(&mut self, name: Name, ty: ScalarType, mutable: bool) {
        self.variables.push(Variable { name, ty, mutable });
    }

    fn variable_of(&mut self, ty: ScalarType, mutable_only: bool) -> Option<Name> {
        let count = self
            .variables
            .iter()
            .filter(|v| v.ty == ty && (v.mutable || !mutable_only))
            .count();
        if count == 0 {
            return None;
        }
        let chosen = self.rng.below(count as u64) as usize;
        self.variables
            .iter()
            .filter(|v| v.ty == ty && (v.mutable || !mutable_only))
            .nth(chosen)
            .map(|v| v.name.clone())
    }

    fn expr(&mut self, ty: ScalarType, depth: u32) -> Expr {
        if depth == 0 || self.rng.one_in(4) {
            return self.leaf(ty);
        }
        let next = depth - 1;
        match self.rng.below(7) {
            0..=2 => self.binary(ty, next),
            3 => self.unary(ty, next),
            4 => Expr::Select {
                condition: Box::new(self.expr(ScalarType::Bool, next)),
                if_true: Box::new(self.expr(ty, next)),
                if_false: Box::new(self.expr(ty, next)),
            },
            5 => {
                let from = *self
                    .rng
                    .pick(self.drawn.types())
                    .unwrap_or(&ScalarType::U32);
                Expr::Cast {
                    to: ty,
                    value: Box::new(self.expr(from, next)),
                }
            }
            _ => self.load(ty, next).unwrap_or_else(|| self.leaf(ty)),
        }
    }

    fn leaf(&mut self, ty: ScalarType) -> Expr {
        if self.drawn.scalars && self.scalar_rng.one_in(5) {
            if let Some(name) = self.scalar_of(ty) {
                return Expr::Scalar(name);
            }
        }
        match self.rng.below(5) {
            0 | 1 => match self.variable_of(ty, false) {
                Some(name) => Expr::Var(name),
                None => Expr::Literal(interesting_literal(&mut self.rng, ty)),
            },
            2 if ty == ScalarType::U32 => {
                if self.rng.one_in(3) {
                    let index = self.rng.below(self.all_buffers.len() as u64) as usize;
                    match self.all_buffers.get(index) {
                        Some(buffer) => Expr::Length {
                            buffer: buffer.clone(),
                        },
                        None => Expr::u32(0),
                    }
                } else {
                    let axis = *self.rng.pick(&AXES).unwrap_or(&Axis::X);
                    Expr::Builtin(match self.rng.below(4) {
                        0 => Builtin::GlobalId(axis),
                        1 => Builtin::LocalId(axis),
                        2 => Builtin::WorkgroupId(axis),
                        _ => Builtin::WorkgroupCount(axis),
                    })
                }
            }
            3 => self
                .load(ty, 0)
                .unwrap_or_else(|| Expr::Literal(interesting_literal(&mut self.rng, ty))),
            _ => Expr::Literal(interesting_literal(&mut self.rng, ty)),
        }
    }

    fn load(&mut self, ty: ScalarType, depth: u32) -> Option<Expr> {
        let count = self
            .readable
            .iter()
            .filter(|(_, elem, _)| elem.value_type() == ty)
            .count();
        if count == 0 {
            return None;
        }
        let chosen = self.rng.below(count as u64) as usize;
        let (buffer, _, read_at) = self
            .readable
            .iter()
            .filter(|(_, elem, _)| elem.value_type() == ty)
            .nth(chosen)?
            .clone();
        let index = self.read_index(read_at, depth);
        Some(Expr::load(buffer, index))
    }

    /// An index a buffer read under `read_at` may take.
    fn read_index(&mut self, read_at: ReadAt, depth: u32) -> Expr {
        match read_at {
            ReadAt::OwnGlobalId => Expr::var(GID),
            ReadAt::OwnLocalId => Expr::var(LID),
            ReadAt::Anywhere => match self.rng.below(3) {
                0 => Expr::var(GID),
                1 => Expr::var(GID) + self.expr(ScalarType::U32, depth),
                _ => self.expr(ScalarType::U32, depth),
            },
        }
    }

    /// `let v = acquire_load(&buffer[i]);` on a buffer of `acquirable` at an index
    /// its rule allows (nothing when there is none). Nobody writes the element
    /// while the kernel runs, or only this thread did, so it reads what a plain load
    /// would. The buffer comes from `acquire_rng`, the index from the main stream.
    fn acquire_load(&mut self) -> Vec<Node> {
        let count = self.acquirable.len() as u64;
        let chosen = self.acquire_rng.below(count) as usize;
        let Some((buffer, elem, read_at)) = self.acquirable.get(chosen).cloned() else {
            return Vec::new();
        };
        let index = self.read_index(read_at, 2);
        let name = self.fresh_name();
        self.declare(name.clone(), elem.value_type(), false);
        vec![Node::AcquireLoad {
            name,
            buffer,
            index,
        }]
    }

    fn binary(&mut self, ty: ScalarType, depth: u32) -> Expr {
        use BinaryOp::*;
        let op = match ty {
            // A u32 from a u64's bytes, where the program draws 64-bit values.
            ScalarType::U32 if self.drawn.wide && self.rng.one_in(13) => PermuteBytes,
            ScalarType::U32 | ScalarType::I32 | ScalarType::U64 | ScalarType::I64 => *self
                .rng
                .pick(&[
                    Add, Sub, Mul, Div, Rem, BitAnd, BitOr, BitXor, Shl, Shr, Min, Max,
                ])
                .unwrap_or(&Add),
            ScalarType::F32 => *self
                .rng
                .pick(&[Add, Sub, Mul, Div, Min, Max])
                .unwrap_or(&Add),
            ScalarType::Bool => *self
                .rng
                .pick(&[Eq, Ne, Lt, Le, Gt, Ge, LogicalAnd, LogicalOr])
                .unwrap_or(&Eq),
        };
        let (left_ty, right_ty) = match op {
            Shl | Shr => (ty, ScalarType::U32),
            PermuteBytes => (ScalarType::U64, ScalarType::U32),
            Eq | Ne => {
                let t = *self
                    .rng
                    .pick(self.drawn.types())
                    .unwrap_or(&ScalarType::U32);
                (t, t)
            }
            Lt | Le | Gt | Ge => {
                let t = *self
                    .rng
                    .pick(self.drawn.ordered())
                    .unwrap_or(&ScalarType::U32);
                (t, t)
            }
            _ => (ty, ty),
        };
        Expr::binary(op, self.expr(left_ty, depth), self.expr(right_ty, depth))
    }

    fn unary(&mut self, ty: ScalarType, depth: u32) -> Expr {
        use UnaryOp::*;
        let (op, operand_ty) = match ty {
            ScalarType::U32 => match self.rng.below(3) {
                0 => (BitNot, ScalarType::U32),
                1 => (
                    CountOnes,
                    *self
                        .rng
                        .pick(self.drawn.integers())
                        .unwrap_or(&ScalarType::U32),
                ),
                _ => (
                    LeadingZeros,
                    *self
                        .rng
                        .pick(self.drawn.integers())
                        .unwrap_or(&ScalarType::U32),
                ),
            },
            ScalarType::U64 => (BitNot, ty),
            ScalarType::I32 | ScalarType::I64 => {
                (*self.rng.pick(&[Neg, BitNot, Abs]).unwrap_or(&Neg), ty)
            }
            ScalarType::F32 => (*self.rng.pick(&[Neg, Abs]).unwrap_or(&Neg), ty),
            ScalarType::Bool => (LogicalNot, ty),
        };
        Expr::unary(op, self.expr(operand_ty, depth))
    }

    /// A declared scalar of type `ty`, drawn from the scalar stream.
    fn scalar_of(&mut self, ty: ScalarType) -> Option<Name> {
        let count = self.scalars.iter().filter(|s| s.ty == ty).count() as u64;
        if count == 0 {
            return None;
        }
        let chosen = self.scalar_rng.below(count) as usize;
        self.scalars
            .iter()
            .filter(|s| s.ty == ty)
            .nth(chosen)
            .map(|s| s.name.clone())
    }

    /// A condition on a scalar parameter (grid-uniform, so good wherever a
    /// workgroup-uniform one is): a `bool` scalar, or a scalar compared with a
    /// literal of its type.
    fn scalar_condition(&mut self) -> Option<Expr> {
        let chosen = self.scalar_rng.below(self.scalars.len() as u64) as usize;
        let decl = self.scalars.get(chosen)?.clone();
        let scalar = Expr::Scalar(decl.name);
        if decl.ty == ScalarType::Bool {
            return Some(if self.scalar_rng.one_in(2) {
                scalar
            } else {
                scalar.logical_not()
            });
        }
        let literal = Expr::Literal(interesting_literal(&mut self.scalar_rng, decl.ty));
        let op = *self
            .scalar_rng
            .pick(&[BinaryOp::Lt, BinaryOp::Ge, BinaryOp::Eq, BinaryOp::Ne])
            .unwrap_or(&BinaryOp::Lt);
        Some(Expr::binary(op, scalar, literal))
    }

    /// A condition every thread of a workgroup evaluates alike.
    fn workgroup_uniform_condition(&mut self) -> Expr {
        if self.drawn.scalars && self.scalar_rng.one_in(3) {
            if let Some(condition) = self.scalar_condition() {
                return condition;
            }
        }
        let axis = *self.rng.pick(&AXES).unwrap_or(&Axis::X);
        match self.rng.below(4) {
            0 => Expr::workgroup_id(axis).less_than(self.rng.range(0, 4)),
            1 => (Expr::workgroup_id(axis) % 2u32).equals(self.rng.range(0, 1)),
            2 => {
                let index = self.rng.below(self.all_buffers.len() as u64) as usize;
                let buffer = self
                    .all_buffers
                    .get(index)
                    .cloned()
                    .unwrap_or_else(|| "in0".into());
                Expr::length(buffer).greater_than(self.rng.range(0, 8))
            }
            _ => Expr::workgroup_count(axis)
                .greater_equal(self.rng.range(1, 3))
                .or(Expr::bool(self.rng.one_in(2))),
        }
    }

    fn statement_block(&mut self, depth: u32) -> Vec<Node> {
        let mark = self.variables.len();
        let mut nodes = Vec::new();
        // The top level runs until the budget is spent; nested blocks stay short.
        let statements = if depth == 0 {
            u32::MAX
        } else {
            self.rng.range(1, 5)
        };
        for _ in 0..statements {
            if self.budget <= 0 {
                break;
            }
            self.budget -= 1;
            // Its own stream decides, so a program without one keeps its statements.
            if self.drawn.acquire_loads && self.acquire_rng.one_in(8) {
                nodes.extend(self.acquire_load());
            }
            // Constructs added later draw only when on, so `core_only` keeps old seeds.
            if self.drawn.any_statements() && self.rng.one_in(5) {
                let (statements, ends_block) = self.extended_statement(depth);
                nodes.extend(statements);
                if ends_block {
                    break;
                }
                continue;
            }
            let choice = self.rng.below(12);
            match choice {
                0 | 1 => {
                    let ty = *self
                        .rng
                        .pick(self.drawn.types())
                        .unwrap_or(&ScalarType::U32);
                    let value = self.expr(ty, self.expr_depth);
                    let name = self.fresh_name();
                    let mutable = self.rng.one_in(2);
                    nodes.push(Node::Let {
                        name: name.clone(),
                        mutable,
                        value,
                    });
                    self.declare(name, ty, mutable);
                }
                2 | 3 => {
                    let ty = *self
                        .rng
                        .pick(self.drawn.types())
                        .unwrap_or(&ScalarType::U32);
                    if let Some(name) = self.variable_of(ty, true) {
                        let value = self.expr(ty, self.expr_depth);
                        nodes.push(Node::Assign { name, value });
                    }
                }
                4 | 5 => {
                    let index = self.rng.below(self.outputs.len() as u64) as usize;
                    if let Some((buffer, elem)) = self.outputs.get(index).cloned() {
                        let value = self.expr(elem.value_type(), self.expr_depth);
                        nodes.push(Node::Store {
                            buffer,
                            index: Expr::var(GID),
                            value,
                        });
                    }
                }
                6 => {
                    if let Some(buffer) = self.atomic_buffer.clone() {
                        let op = self.atomic_op;
                        let index = self.expr(ScalarType::U32, 2);
                        let value = self.expr(ScalarType::U32, 2);
                        nodes.push(Node::Atomic {
                            op,
                            buffer,
                            index,
                            value,
                        });
                    }
                }
                7 | 8 if depth < 4 => {
                    let condition = self.expr(ScalarType::Bool, self.expr_depth);
                    let then_body = self.statement_block(depth + 1).into();
                    let else_body = if self.rng.one_in(2) {
                        self.statement_block(depth + 1).into()
                    } else {
                        Vec::new().into()
                    };
                    nodes.push(Node::If {
                        condition,
                        then_body,
                        else_body,
                    });
                }
                9 if depth < 4 => {
                    let variable = self.fresh_name();
                    let start = self.rng.range(0, 3);
                    let limit = start + self.rng.range(0, 4);
                    let end = if self.rng.one_in(2) {
                        Expr::u32(limit)
                    } else {
                        Expr::binary(BinaryOp::Min, self.expr(ScalarType::U32, 2), limit)
                    };
                    let mark_loop = self.variables.len();
                    self.declare(variable.clone(), ScalarType::U32, false);
                    self.loop_depth += 1;
                    let body = self.statement_block(depth + 1).into();
                    self.loop_depth -= 1;
                    self.variables.truncate(mark_loop);
                    nodes.push(Node::Loop {
                        variable,
                        start: Expr::u32(start),
                        end,
                        body,
                    });
                }
                10 if self.options.allow_early_return => {
                    if depth > 0 && self.rng.one_in(3) {
                        nodes.push(Node::Return);
                        break;
                    }
                    let condition = self.expr(ScalarType::Bool, 2);
                    nodes.push(Node::If {
                        condition,
                        then_body: vec![Node::Return].into(),
                        else_body: Vec::new().into(),
                    });
                }
                _ => {
                    let ty = *self
                        .rng
                        .pick(self.drawn.types())
                        .unwrap_or(&ScalarType::U32);
                    let value = self.expr(ty, 2);
                    let name = self.fresh_name();
                    nodes.push(Node::Let {
                        name: name.clone(),
                        mutable: false,
                        value,
                    });
                    self.declare(name, ty, false);
                }
            }
        }
        self.variables.truncate(mark);
        nodes
    }

    /// One of the constructs [`GeneratorOptions::core_only`] turns off (or nothing,
    /// when the one drawn is off or does not fit here); also says whether it ends the
    /// block (a bare `break` or `continue`: later statements would never run).
    fn extended_statement(&mut self, depth: u32) -> (Vec<Node>, bool) {
        let choice = self.rng.below(8);
        match choice {
            0 | 1 if self.drawn.while_loops && depth < 4 => (self.while_loop(depth), false),
            4 | 5 if self.drawn.atomics => (self.owned_atomic(), false),
            6 | 7 if self.drawn.atomics => (self.counter_atomic(), false),
            4..=7 if self.drawn.local_arrays => (self.local_store(), false),
            2 | 3 if self.drawn.while_loops && self.loop_depth > 0 => {
                let node = if choice == 2 {
                    Node::Break
                } else {
                    Node::Continue
                };
                if self.rng.one_in(3) {
                    return (vec![node], true);
                }
                let condition = self.expr(ScalarType::Bool, 2);
                (
                    vec![Node::If {
                        condition,
                        then_body: vec![node].into(),
                        else_body: Vec::new().into(),
                    }],
                    false,
                )
            }
            _ => (Vec::new(), false),
        }
    }

    /// `out[gid] = name` (cast to the element) into an output drawn at random: each
    /// thread stores its own result of a collective.
    fn store_own_result(&mut self, name: &Name) -> Option<Node> {
        let output = self.rng.below(self.outputs.len() as u64) as usize;
        self.outputs.get(output).cloned().map(|(buffer, elem)| {
            let value = Expr::var(name.clone()).cast(elem.value_type());
            Node::Store {
                buffer,
                index: Expr::var(GID),
                value,
            }
        })
    }

    /// `local[i] = v` into one of the thread's local arrays: any index, sometimes
    /// past the end (the store then does nothing).
    fn local_store(&mut self) -> Vec<Node> {
        let count = self.local_arrays.len() as u64;
        let chosen = self.rng.below(count) as usize;
        let Some((buffer, elem, length)) = self.local_arrays.get(chosen).cloned() else {
            return Vec::new();
        };
        let index = if self.rng.one_in(3) {
            self.expr(ScalarType::U32, 2)
        } else {
            self.expr(ScalarType::U32, 2) % (length + 2)
        };
        let value = self.expr(elem.value_type(), self.expr_depth);
        vec![Node::Store {
            buffer,
            index,
            value,
        }]
    }

    /// An atomic or atomic load on the thread's own element of `owned` (at `gid`) or of
    /// `workgroup_owned` (at `lid`): any operation, any operands; a returned value is
    /// deterministic and becomes a variable like any other.
    fn owned_atomic(&mut self) -> Vec<Node> {
        let target = if self.rng.one_in(3) {
            self.workgroup_owned.clone().map(|owned| (owned, LID))
        } else {
            self.owned.clone().map(|owned| (owned, GID))
        };
        let Some(((buffer, elem), at)) = target else {
            return Vec::new();
        };
        let ty = elem.value_type();
        let op = *self.rng.pick(&AtomicOp::ALL).unwrap_or(&AtomicOp::Add);
        let index = Expr::var(at);
        let value = self.expr(ty, 2);
        let kind = self.rng.below(4);
        if kind == 0 {
            return vec![Node::Atomic {
                op,
                buffer,
                index,
                value,
            }];
        }
        // Drawn before the result is declared, so that it cannot read it.
        let expected = (kind == 2).then(|| {
            if self.rng.one_in(2) {
                // Often the element's own value, so the exchange happens.
                Expr::load(buffer.clone(), index.clone())
            } else {
                self.expr(ty, 1)
            }
        });
        let name = self.fresh_name();
        self.declare(name.clone(), ty, false);
        let node = match (kind, expected) {
            (_, Some(expected)) => Node::CompareExchange {
                name,
                buffer,
                index,
                expected,
                value,
            },
            (1, None) => Node::AtomicFetch {
                name,
                op,
                buffer,
                index,
                value,
            },
            _ => Node::AtomicLoad {
                name,
                buffer,
                index,
            },
        };
        vec![node]
    }

    /// `let r = <the counter update>(&counter[i], ...); atomic_add(&tally[k], f(r));`
    /// on a shared counter any thread may hit: `r` feeds only the tally (a sum, which
    /// does not depend on which thread got which value) through `f`, a function of
    /// `r` and literals alone, with `f` and `k` the same at every site of the program.
    fn counter_atomic(&mut self) -> Vec<Node> {
        let count = self.counters.len() as u64;
        let Some((buffer, elem)) = self.counters.get(self.rng.below(count) as usize).cloned()
        else {
            return Vec::new();
        };
        let Some(tally) = self.tally.clone() else {
            return Vec::new();
        };
        let ty = elem.value_type();
        let literal = |bits: u64| match ty {
            ScalarType::I32 => Expr::i32(bits as i32),
            ScalarType::U64 => Expr::u64(bits),
            ScalarType::I64 => Expr::i64(bits as i64),
            _ => Expr::u32(bits as u32),
        };
        let index = self.expr(ScalarType::U32, 2) % 4u32;
        let name = self.fresh_name();
        let update = self.counter_update;
        let fetch = match update.op {
            Some(op) => Node::AtomicFetch {
                name: name.clone(),
                op,
                buffer,
                index,
                value: literal(update.operand),
            },
            None => Node::CompareExchange {
                name: name.clone(),
                buffer,
                index,
                expected: literal(update.expected),
                value: literal(update.operand),
            },
        };
        let previous = Expr::Var(name);
        let folded = match update.fold {
            CounterFold::Value => previous,
            CounterFold::Times(c) => previous * literal(c),
            CounterFold::Xor(c) => previous ^ literal(c),
            CounterFold::ShiftRight(amount) => previous >> Expr::u32(amount),
            CounterFold::CountOnes => previous.count_ones().cast(ty),
        };
        vec![
            fetch,
            Node::Atomic {
                op: AtomicOp::Add,
                buffer: tally,
                index: Expr::u32(update.tally_slot),
                value: folded.cast(ScalarType::U32),
            },
        ]
    }

    /// `let mut fuel = f; while fuel != 0 [&& c] { fuel = fuel - 1; ... }`: the loop
    /// exits on data (`c`, a `break`, a `return`) and at the latest when its fuel
    /// (at most 4, or a value clamped to it) runs out. The decrement comes first, so
    /// a `continue` cannot skip it; the body never assigns `fuel` otherwise.
    fn while_loop(&mut self, depth: u32) -> Vec<Node> {
        let fuel = self.fresh_name();
        let initial = if self.rng.one_in(2) {
            Expr::u32(self.rng.range(0, 4))
        } else {
            Expr::binary(BinaryOp::Min, self.expr(ScalarType::U32, 2), 4u32)
        };
        let remaining = Expr::Var(fuel.clone()).not_equals(0u32);
        let condition = if self.rng.one_in(2) {
            remaining
        } else {
            remaining.and(self.expr(ScalarType::Bool, 2))
        };
        let mark = self.variables.len();
        // Readable in the body, never chosen as an assignment target.
        self.declare(fuel.clone(), ScalarType::U32, false);
        self.loop_depth += 1;
        let mut body = vec![Node::Assign {
            name: fuel.clone(),
            value: Expr::Var(fuel.clone()) - 1u32,
        }];
        body.extend(self.statement_block(depth + 1));
        self.loop_depth -= 1;
        self.variables.truncate(mark);
        vec![
            Node::Let {
                name: fuel,
                mutable: true,
                value: initial,
            },
            Node::While {
                condition,
                body: body.into(),
            },
        ]
    }
}

fn random_bytes(rng: &mut SeededRng, elem: ElemType, count: u32) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(count as usize * elem.size_bytes() as usize);
    for _ in 0..count {
        match elem {
            ElemType::U8 => bytes.push(rng.next_u32() as u8),
            ElemType::U32 | ElemType::I32 => {
                let value = if rng.one_in(2) {
                    rng.range(0, 40)
                } else {
                    rng.next_u32()
                };
                bytes.extend_from_slice(&value.to_le_bytes());
            }
            ElemType::F32 => bytes.extend_from_slice(&interesting_f32_bits(rng).to_le_bytes()),
            ElemType::U64 | ElemType::I64 => {
                let value = match rng.below(3) {
                    0 => rng.range(0, 40) as u64,
                    1 => rng.next_u32() as u64,
                    _ => rng.next_u64(),
                };
                bytes.extend_from_slice(&value.to_le_bytes());
            }
        }
    }
    bytes
}

fn workgroup_shape(rng: &mut SeededRng, options: &GeneratorOptions) -> [u32; 3] {
    const SHAPES: [[u32; 3]; 14] = [
        [1, 1, 1],
        [32, 1, 1],
        [64, 1, 1],
        [33, 1, 1],
        [7, 3, 1],
        [4, 4, 4],
        [16, 8, 1],
        [5, 3, 2],
        [100, 1, 1],
        [128, 1, 1],
        [256, 1, 1],
        [1, 1, 7],
        [48, 1, 1],
        [2, 17, 3],
    ];
    let limits = &options.limits;
    let max_threads = options
        .max_threads_per_workgroup
        .min(limits.max_threads_per_workgroup)
        .max(1);
    let mut shape = if rng.one_in(4) {
        [rng.range(1, 70), rng.range(1, 4), rng.range(1, 2)]
    } else {
        *rng.pick(&SHAPES).unwrap_or(&[1, 1, 1])
    };
    for (axis, size) in shape.iter_mut().enumerate() {
        let limit = limits
            .max_workgroup_size
            .get(axis)
            .copied()
            .unwrap_or(1)
            .max(1);
        *size = (*size).clamp(1, limit);
    }
    // Shrink the largest axis until the thread count fits.
    while shape.iter().map(|&s| s as u64).product::<u64>() > max_threads as u64 {
        if let Some(largest) = shape.iter_mut().max() {
            *largest = (*largest / 2).max(1);
        }
    }
    shape
}

/// The case the GPU differential test checks for `seed`: the default options, a grid
/// sync allowed in every tenth program. One definition for the differential and the
/// CPU tests that vet its programs.
pub fn differential_case(seed: u64) -> RandomCase {
    let options = GeneratorOptions {
        allow_grid_sync: seed % 10 == 9,
        ..GeneratorOptions::default()
    };
    valid_program(seed, &options)
}

/// A language construct whose share of generated programs the differential reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum Construct {
    ForLoop,
    While,
    Break,
    Continue,
    Return,
    WideIntegers,
    LocalArray,
    Atomic,
    AtomicFetch,
    CompareExchange,
    AtomicLoad,
    AcquireLoad,
    Barrier,
    WorkgroupReduce,
    WorkgroupScan,
    GridSync,
    Scalar,
}

impl Construct {
    /// Every construct, in report order.
    pub const ALL: [Construct; 17] = [
        Construct::ForLoop,
        Construct::While,
        Construct::Break,
        Construct::Continue,
        Construct::Return,
        Construct::WideIntegers,
        Construct::LocalArray,
        Construct::Atomic,
        Construct::AtomicFetch,
        Construct::CompareExchange,
        Construct::AtomicLoad,
        Construct::AcquireLoad,
        Construct::Barrier,
        Construct::WorkgroupReduce,
        Construct::WorkgroupScan,
        Construct::GridSync,
        Construct::Scalar,
    ];

    /// A short name for reports.
    pub const fn name(self) -> &'static str {
        match self {
            Construct::ForLoop => "for",
            Construct::While => "while",
            Construct::Break => "break",
            Construct::Continue => "continue",
            Construct::Return => "return",
            Construct::WideIntegers => "u64/i64",
            Construct::LocalArray => "local array",
            Construct::Atomic => "atomic",
            Construct::AtomicFetch => "atomic fetch",
            Construct::CompareExchange => "compare-exchange",
            Construct::AtomicLoad => "atomic load",
            Construct::AcquireLoad => "acquire load",
            Construct::Barrier => "barrier",
            Construct::WorkgroupReduce => "workgroup reduce",
            Construct::WorkgroupScan => "workgroup scan",
            Construct::GridSync => "grid sync",
            Construct::Scalar => "scalar parameter",
        }
    }
}

/// Which constructs `program` uses: a flag per entry of [`Construct::ALL`]. A
/// 64-bit buffer element, literal, variable or cast counts as `u64/i64`; a scalar
/// parameter counts where an expression reads one. Walks each shared block once,
/// iteratively.
pub fn constructs_used(program: &Program) -> [bool; Construct::ALL.len()] {
    let mut used = [false; Construct::ALL.len()];
    let mut mark = |construct: Construct| {
        if let Some(position) = Construct::ALL.iter().position(|&c| c == construct) {
            used[position] = true;
        }
    };
    for decl in program.buffers() {
        if decl.elem.value_type().is_wide() {
            mark(Construct::WideIntegers);
        }
        if decl.access == Access::Local {
            mark(Construct::LocalArray);
        }
    }
    let mut exprs: Vec<&Expr> = Vec::new();
    super::structural::any_node(program.entry(), |node| {
        let construct = match node {
            Node::Loop { .. } => Some(Construct::ForLoop),
            Node::While { .. } => Some(Construct::While),
            Node::Break => Some(Construct::Break),
            Node::Continue => Some(Construct::Continue),
            Node::Return => Some(Construct::Return),
            Node::Atomic { .. } => Some(Construct::Atomic),
            Node::AtomicFetch { .. } => Some(Construct::AtomicFetch),
            Node::CompareExchange { .. } => Some(Construct::CompareExchange),
            Node::AtomicLoad { .. } => Some(Construct::AtomicLoad),
            Node::AcquireLoad { .. } => Some(Construct::AcquireLoad),
            Node::Barrier => Some(Construct::Barrier),
            Node::WorkgroupReduce { .. } => Some(Construct::WorkgroupReduce),
            Node::WorkgroupScan { .. } => Some(Construct::WorkgroupScan),
            Node::GridSync => Some(Construct::GridSync),
            _ => None,
        };
        if let Some(construct) = construct {
            mark(construct);
        }
        exprs.extend(super::structural::node_exprs(node).into_iter().flatten());
        while let Some(expr) = exprs.pop() {
            let wide = match expr {
                Expr::Literal(literal) => literal.ty().is_wide(),
                Expr::Cast { to, .. } => to.is_wide(),
                _ => false,
            };
            if wide {
                mark(Construct::WideIntegers);
            }
            if matches!(expr, Expr::Scalar(_)) {
                mark(Construct::Scalar);
            }
            exprs.extend(super::structural::expr_children(expr).into_iter().flatten());
        }
        false
    });
    used
}

/// A valid program with deterministic results, its inputs and a dispatch config.
/// See the module docs for the rules that make the result independent of thread
/// order. The same seed and options always give the same case.
pub fn valid_program(seed: u64, options: &GeneratorOptions) -> RandomCase {
    generate_valid(seed, options, true)
}

/// [`valid_program`], optionally without drawing input bytes (the fuzzer needs only
/// the program, and inputs dominate the cost for large grids).
fn generate_valid(seed: u64, options: &GeneratorOptions, with_inputs: bool) -> RandomCase {
    let mut rng = SeededRng::new(seed);
    let grid_sync = options.allow_grid_sync && rng.one_in(3);
    let workgroup_size = workgroup_shape(&mut rng, options);
    let threads_per_workgroup = workgroup_size.iter().product::<u32>();
    let max_groups = if grid_sync {
        options.max_workgroups.clamp(1, 4)
    } else {
        options.max_workgroups.max(1)
    };
    let workgroups = match rng.below(4) {
        0 => [rng.range(1, max_groups), 1, 1],
        1 => {
            let x = rng.range(1, max_groups.clamp(1, 2));
            [x, rng.range(1, (max_groups / x).max(1)), 1]
        }
        2 if max_groups >= 4 => [rng.range(1, 2), 2, 1],
        2 => [1, 1, rng.range(1, max_groups)],
        _ => [1, 1, 1],
    };
    let workgroups = if max_groups >= 8 && rng.one_in(8) {
        [2, 2, 2]
    } else {
        workgroups
    };
    let total_threads = threads_per_workgroup * workgroups.iter().product::<u32>();

    let mut generator = ValidGenerator {
        rng,
        options: *options,
        readable: Vec::new(),
        all_buffers: Vec::new(),
        outputs: Vec::new(),
        atomic_buffer: None,
        atomic_op: AtomicOp::Add,
        variables: Vec::new(),
        next_variable: 0,
        budget: options.max_nodes as i64,
        expr_depth: if with_inputs { 3 } else { 2 },
        loop_depth: 0,
        drawn: Drawn::default(),
        owned: None,
        workgroup_owned: None,
        counters: Vec::new(),
        counter_update: CounterUpdate {
            op: None,
            operand: 0,
            expected: 0,
            fold: CounterFold::Value,
            tally_slot: 0,
        },
        tally: None,
        local_arrays: Vec::new(),
        scalar_rng: SeededRng::new(seed ^ SCALAR_STREAM),
        scalars: Vec::new(),
        acquire_rng: SeededRng::new(seed ^ ACQUIRE_STREAM),
        acquirable: Vec::new(),
    };
    if options.extended() {
        generator.drawn = Drawn::draw(&mut generator.rng, options);
    }
    if options.allow_scalars && generator.scalar_rng.one_in(2) {
        generator.drawn.scalars = true;
        let types = generator.drawn.types();
        for index in 0..generator.scalar_rng.range(1, 4) {
            let ty = *generator.scalar_rng.pick(types).unwrap_or(&ScalarType::U32);
            generator
                .scalars
                .push(ScalarDecl::new(format!("s{index}"), ty));
        }
    }
    generator.drawn.acquire_loads = options.allow_acquire_loads && generator.acquire_rng.one_in(2);
    let atomic_ops: &[AtomicOp] = if generator.drawn.atomics {
        &COMMUTING_ATOMIC_OPS
    } else {
        &ATOMIC_OPS
    };
    generator.atomic_op = *generator.rng.pick(atomic_ops).unwrap_or(&AtomicOp::Add);
    if generator.drawn.atomics {
        let rng = &mut generator.rng;
        let op = rng.pick(&AtomicOp::ALL).copied().filter(|_| !rng.one_in(4));
        let operand = if rng.one_in(2) {
            rng.range(0, 3) as u64
        } else {
            rng.next_u64()
        };
        let expected = match rng.below(3) {
            0 => 0,
            1 => operand,
            _ => rng.next_u64(),
        };
        let c = rng.next_u64() | 1;
        let fold = match rng.below(5) {
            0 => CounterFold::Value,
            1 => CounterFold::Times(c),
            2 => CounterFold::Xor(c),
            3 => CounterFold::ShiftRight(rng.range(0, 70)),
            _ => CounterFold::CountOnes,
        };
        generator.counter_update = CounterUpdate {
            op,
            operand,
            expected,
            fold,
            tally_slot: rng.range(0, 3),
        };
    }
    let elems = generator.drawn.elems();
    let rng = &mut generator.rng;

    // Buffer declarations: (decl, element count for inputs).
    let mut decls: Vec<(BufferDecl, u32)> = Vec::new();
    let input_count = rng.range(1, 3);
    for i in 0..input_count {
        let elem = *rng.pick(elems).unwrap_or(&ElemType::U32);
        let elements = rng.range(1, 2 * total_threads + 3);
        let count = if rng.one_in(2) {
            BufferCount::Static(elements)
        } else {
            BufferCount::Runtime
        };
        let name: Name = format!("in{i}").into();
        decls.push((
            BufferDecl::new(name, 0, Access::ReadOnly, elem, count),
            elements,
        ));
    }
    let output_count = rng.range(1, 3);
    for i in 0..output_count {
        let elem = *rng.pick(elems).unwrap_or(&ElemType::U32);
        let access = if rng.one_in(2) {
            Access::ReadWrite
        } else {
            Access::WriteOnly
        };
        let count = if rng.one_in(2) {
            BufferCount::Static(total_threads)
        } else {
            BufferCount::Runtime
        };
        let name: Name = format!("out{i}").into();
        decls.push((BufferDecl::new(name, 0, access, elem, count), total_threads));
    }
    let use_atomics = options.allow_atomics && rng.one_in(2);
    if use_atomics {
        let elements = rng.range(1, 8);
        let count = if rng.one_in(2) {
            BufferCount::Static(elements)
        } else {
            BufferCount::Runtime
        };
        decls.push((
            BufferDecl::new("atom", 0, Access::ReadWrite, ElemType::U32, count),
            elements,
        ));
    }
    if generator.drawn.local_arrays {
        for k in 0..rng.range(1, 2) {
            let elem = *rng.pick(elems).unwrap_or(&ElemType::U32);
            let length = rng.range(1, 12);
            decls.push((
                BufferDecl::new(
                    format!("local{k}"),
                    0,
                    Access::Local,
                    elem,
                    BufferCount::Static(length),
                ),
                length,
            ));
        }
    }
    if generator.drawn.atomics {
        let atomic_elems = generator.drawn.atomic_elems();
        let owned_elem = *rng.pick(atomic_elems).unwrap_or(&ElemType::U32);
        let count = if rng.one_in(2) {
            BufferCount::Static(total_threads)
        } else {
            BufferCount::Runtime
        };
        decls.push((
            BufferDecl::new("owned", 0, Access::ReadWrite, owned_elem, count),
            total_threads,
        ));
        let counter_elem = *rng.pick(atomic_elems).unwrap_or(&ElemType::U32);
        let counters = rng.range(1, 4);
        decls.push((
            BufferDecl::new(
                "counter",
                0,
                Access::ReadWrite,
                counter_elem,
                BufferCount::Static(counters),
            ),
            counters,
        ));
        let tallies = rng.range(1, 4);
        decls.push((
            BufferDecl::new(
                "tally",
                0,
                Access::ReadWrite,
                ElemType::U32,
                BufferCount::Static(tallies),
            ),
            tallies,
        ));
        let workgroup_elem = *rng.pick(atomic_elems).unwrap_or(&ElemType::U32);
        decls.push((
            BufferDecl::new(
                "workgroup_owned",
                0,
                Access::Workgroup,
                workgroup_elem,
                BufferCount::Static(threads_per_workgroup),
            ),
            0,
        ));
        let workgroup_counters = rng.range(1, 4);
        decls.push((
            BufferDecl::new(
                "workgroup_counter",
                0,
                Access::Workgroup,
                counter_elem,
                BufferCount::Static(workgroup_counters),
            ),
            0,
        ));
    }
    let use_shared = options.allow_barriers && rng.one_in(2);
    let shared_elem = *rng.pick(elems).unwrap_or(&ElemType::U32);
    let shared_atomics = use_shared && options.allow_atomics && rng.one_in(2);
    if use_shared {
        let count = threads_per_workgroup + rng.range(0, 3);
        let decl = BufferDecl::new(
            "shared",
            0,
            Access::Workgroup,
            shared_elem,
            BufferCount::Static(count),
        );
        if decl.static_size_bytes().unwrap_or(u64::MAX)
            <= options.limits.max_shared_memory_bytes as u64 / 2
        {
            decls.push((decl, count));
        }
    }
    let use_shared = decls.iter().any(|(d, _)| &*d.name == "shared");
    let shared_atomics = shared_atomics && use_shared;
    if shared_atomics {
        decls.push((
            BufferDecl::new(
                "shared_atom",
                0,
                Access::Workgroup,
                ElemType::U32,
                BufferCount::Static(rng.range(1, 4)),
            ),
            0,
        ));
    }
    let stage_elem = *rng.pick(elems).unwrap_or(&ElemType::U32);
    if grid_sync {
        decls.push((
            BufferDecl::new(
                "stage",
                0,
                Access::ReadWrite,
                stage_elem,
                BufferCount::Static(total_threads),
            ),
            total_threads,
        ));
    }
    // Distinct bindings with gaps, in an order unrelated to the declaration order.
    for i in (1..decls.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        decls.swap(i, j);
    }
    let mut binding = rng.range(0, 2);
    let mut slots: Vec<u32> = Vec::with_capacity(decls.len());
    for _ in 0..decls.len() {
        slots.push(binding);
        binding += rng.range(1, 3);
    }
    for i in (1..slots.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        slots.swap(i, j);
    }
    for ((decl, _), slot) in decls.iter_mut().zip(slots) {
        decl.binding = slot;
    }

    for (decl, _) in &decls {
        generator.all_buffers.push(decl.name.clone());
        match decl.access {
            Access::ReadOnly => {
                generator
                    .readable
                    .push((decl.name.clone(), decl.elem, ReadAt::Anywhere));
                if ATOMIC_ELEMS_WIDE.contains(&decl.elem) {
                    generator
                        .acquirable
                        .push((decl.name.clone(), decl.elem, ReadAt::Anywhere));
                }
            }
            Access::ReadWrite | Access::WriteOnly => {
                let name = &*decl.name;
                let own_element = name.starts_with("out") || name == "owned";
                if own_element
                    && decl.access == Access::ReadWrite
                    && ATOMIC_ELEMS_WIDE.contains(&decl.elem)
                {
                    generator
                        .acquirable
                        .push((decl.name.clone(), decl.elem, ReadAt::OwnGlobalId));
                }
                if name.starts_with("out") {
                    generator.outputs.push((decl.name.clone(), decl.elem));
                    generator
                        .readable
                        .push((decl.name.clone(), decl.elem, ReadAt::OwnGlobalId));
                } else if name == "atom" {
                    generator.atomic_buffer = Some(decl.name.clone());
                } else if name == "owned" {
                    generator.owned = Some((decl.name.clone(), decl.elem));
                    generator.outputs.push((decl.name.clone(), decl.elem));
                    generator
                        .readable
                        .push((decl.name.clone(), decl.elem, ReadAt::OwnGlobalId));
                } else if name == "counter" {
                    generator.counters.push((decl.name.clone(), decl.elem));
                } else if name == "tally" {
                    generator.tally = Some(decl.name.clone());
                }
            }
            Access::Local => {
                if let BufferCount::Static(length) = decl.count {
                    generator
                        .local_arrays
                        .push((decl.name.clone(), decl.elem, length));
                    generator
                        .readable
                        .push((decl.name.clone(), decl.elem, ReadAt::Anywhere));
                }
            }
            Access::Workgroup => {
                let name = &*decl.name;
                if name == "workgroup_owned" {
                    generator.workgroup_owned = Some((decl.name.clone(), decl.elem));
                    generator
                        .readable
                        .push((decl.name.clone(), decl.elem, ReadAt::OwnLocalId));
                } else if name == "workgroup_counter" {
                    generator.counters.push((decl.name.clone(), decl.elem));
                }
            }
        }
    }

    // Prelude: global and local linear ids.
    let [size_x, size_y, _] = workgroup_size;
    let row = Expr::workgroup_count(Axis::X) * size_x;
    let plane = row.clone() * (Expr::workgroup_count(Axis::Y) * size_y);
    let global_linear = Expr::global_id(Axis::X)
        + Expr::global_id(Axis::Y) * row
        + Expr::global_id(Axis::Z) * plane;
    let local_linear = Expr::local_id(Axis::X)
        + Expr::local_id(Axis::Y) * size_x
        + Expr::local_id(Axis::Z) * (size_x * size_y);
    let mut body: Vec<Node> = vec![
        Node::Let {
            name: GID.into(),
            mutable: false,
            value: global_linear,
        },
        Node::Let {
            name: LID.into(),
            mutable: false,
            value: local_linear,
        },
    ];
    generator.declare(GID.into(), ScalarType::U32, false);
    generator.declare(LID.into(), ScalarType::U32, false);

    // Shared phase: write own slot (and atomics), barrier; afterwards only reads.
    if use_shared {
        let mut phase = vec![Node::Store {
            buffer: "shared".into(),
            index: Expr::var(LID),
            value: generator.expr(shared_elem.value_type(), generator.expr_depth),
        }];
        if shared_atomics {
            for _ in 0..generator.rng.range(1, 3) {
                let op = generator.atomic_op;
                let index = generator.expr(ScalarType::U32, 2);
                let value = generator.expr(ScalarType::U32, 2);
                phase.push(Node::Atomic {
                    op,
                    buffer: "shared_atom".into(),
                    index,
                    value,
                });
            }
        }
        phase.push(Node::Barrier);
        match generator.rng.below(3) {
            0 => body.extend(phase),
            1 => {
                let condition = generator.workgroup_uniform_condition();
                body.push(Node::If {
                    condition,
                    then_body: phase.into(),
                    else_body: vec![Node::Barrier].into(),
                });
            }
            _ if generator.drawn.while_loops && generator.rng.one_in(2) => {
                // A workgroup-uniform `while` around the barrier, left by a uniform
                // `break` in some workgroups.
                let round = generator.fresh_name();
                let rounds = generator.rng.range(1, 2);
                let mut looped = vec![Node::Assign {
                    name: round.clone(),
                    value: Expr::Var(round.clone()) + 1u32,
                }];
                looped.extend(phase);
                looped.push(Node::If {
                    condition: generator.workgroup_uniform_condition(),
                    then_body: vec![Node::Break].into(),
                    else_body: Vec::new().into(),
                });
                body.push(Node::Let {
                    name: round.clone(),
                    mutable: true,
                    value: Expr::u32(0),
                });
                body.push(Node::While {
                    condition: Expr::Var(round).less_than(rounds),
                    body: looped.into(),
                });
            }
            _ => {
                let loop_variable = generator.fresh_name();
                body.push(Node::Loop {
                    variable: loop_variable,
                    start: Expr::u32(0),
                    end: Expr::u32(generator.rng.range(1, 2)),
                    body: phase.into(),
                });
            }
        }
        generator
            .readable
            .push(("shared".into(), shared_elem, ReadAt::Anywhere));
        if shared_atomics {
            generator
                .readable
                .push(("shared_atom".into(), ElemType::U32, ReadAt::Anywhere));
        }
    }

    // Reduction phase: in uniform control flow, before any return.
    if options.allow_workgroup_reduce && generator.rng.one_in(2) {
        let op = *generator.rng.pick(&REDUCE_OPS).unwrap_or(&ReduceOp::Sum);
        let value = generator.expr(ScalarType::U32, generator.expr_depth);
        let name = generator.fresh_name();
        let reduce = Node::WorkgroupReduce {
            name: name.clone(),
            op,
            value,
        };
        let use_result = generator.store_own_result(&name);
        if generator.rng.one_in(2) {
            body.push(reduce);
            generator.declare(name, ScalarType::U32, false);
            body.extend(use_result);
        } else {
            let condition = generator.workgroup_uniform_condition();
            let mut inner = vec![reduce];
            inner.extend(use_result);
            body.push(Node::If {
                condition,
                then_body: inner.into(),
                else_body: Vec::new().into(),
            });
        }
    }

    // Scan phase: like the reductions, in uniform control flow before any return;
    // each thread stores its own prefix (which does not depend on thread order).
    if generator.drawn.scans {
        for _ in 0..generator.rng.range(1, 2) {
            let op = *generator.rng.pick(&REDUCE_OPS).unwrap_or(&ReduceOp::Sum);
            let kind = *generator
                .rng
                .pick(&SCAN_KINDS)
                .unwrap_or(&ScanKind::Inclusive);
            let value = generator.expr(ScalarType::U32, generator.expr_depth);
            let name = generator.fresh_name();
            let scan = Node::WorkgroupScan {
                name: name.clone(),
                op,
                kind,
                value,
            };
            let use_result = generator.store_own_result(&name);
            match generator.rng.below(3) {
                0 => {
                    body.push(scan);
                    generator.declare(name, ScalarType::U32, false);
                    body.extend(use_result);
                }
                1 => {
                    let condition = generator.workgroup_uniform_condition();
                    let mut inner = vec![scan];
                    inner.extend(use_result);
                    body.push(Node::If {
                        condition,
                        then_body: inner.into(),
                        else_body: Vec::new().into(),
                    });
                }
                _ => {
                    let mut inner = vec![scan];
                    inner.extend(use_result);
                    body.push(Node::Loop {
                        variable: generator.fresh_name(),
                        start: Expr::u32(0),
                        end: Expr::u32(generator.rng.range(1, 2)),
                        body: inner.into(),
                    });
                }
            }
        }
    }

    // Grid-sync phase: stage[gid] written, sync, then stage read anywhere.
    if grid_sync {
        let value = generator.expr(stage_elem.value_type(), generator.expr_depth);
        body.push(Node::Store {
            buffer: "stage".into(),
            index: Expr::var(GID),
            value,
        });
        body.push(Node::GridSync);
        generator
            .readable
            .push(("stage".into(), stage_elem, ReadAt::Anywhere));
        if ATOMIC_ELEMS_WIDE.contains(&stage_elem) {
            generator
                .acquirable
                .push(("stage".into(), stage_elem, ReadAt::Anywhere));
        }
        let neighbour = (Expr::var(GID) + generator.rng.range(1, 5)) % Expr::length("stage");
        let name = generator.fresh_name();
        body.push(Node::Let {
            name: name.clone(),
            mutable: false,
            value: Expr::load("stage", neighbour),
        });
        generator.declare(name, stage_elem.value_type(), false);
    }

    // Free phase: anything deterministic, including early returns.
    let free = generator.statement_block(0);
    body.extend(free);
    for (buffer, elem) in generator.outputs.clone() {
        if generator.rng.one_in(5) {
            continue;
        }
        let value = generator.expr(elem.value_type(), generator.expr_depth);
        body.push(Node::Store {
            buffer,
            index: Expr::var(GID),
            value,
        });
    }

    let rng = &mut generator.rng;
    let program_buffers: Vec<BufferDecl> = decls.iter().map(|(d, _)| d.clone()).collect();
    let mut builder = Program::builder(workgroup_size).nodes(body);
    for decl in program_buffers {
        builder = builder.buffer_decl(decl);
    }
    for decl in &generator.scalars {
        builder = builder.scalar(decl.name.clone(), decl.ty);
    }
    if rng.one_in(4) {
        builder = builder.entry_op_id(format!("generated_{seed}"));
    }
    let program = builder.build();
    let scalars = generator
        .scalars
        .iter()
        .map(|decl| interesting_literal(&mut generator.scalar_rng, decl.ty))
        .collect();

    let mut globals: Vec<&(BufferDecl, u32)> =
        decls.iter().filter(|(d, _)| d.access.is_global()).collect();
    globals.sort_by_key(|(d, _)| d.binding);
    let inputs = globals
        .iter()
        .filter(|_| with_inputs)
        .map(|(decl, elements)| match decl.access {
            Access::WriteOnly => vec![0u8; *elements as usize * decl.elem.size_bytes() as usize],
            _ => random_bytes(rng, decl.elem, *elements),
        })
        .collect();
    let iterations = rng.range(1, options.max_fixpoint_iterations.max(1));
    RandomCase {
        seed,
        program,
        inputs,
        config: DispatchConfig::new(workgroups).with_fixpoint_iterations(iterations),
        scalars,
    }
}

// ---- arbitrary (mostly invalid) programs -----------------------------------------------

const NAME_POOL: [&str; 16] = [
    "gid", "lid", "v1", "v2", "v3", "v4", "x", "in0", "out0", "out1", "atom", "shared", "",
    "__vyre_t", "stage", "in1",
];

struct ArbitraryGenerator {
    rng: SeededRng,
    budget: i64,
}

impl ArbitraryGenerator {
    fn name(&mut self) -> Name {
        static POOL: std::sync::OnceLock<Vec<Name>> = std::sync::OnceLock::new();
        let pool = POOL.get_or_init(|| NAME_POOL.iter().map(|&n| Name::from(n)).collect());
        match self.rng.pick(pool) {
            Some(name) => name.clone(),
            None => "x".into(),
        }
    }

    fn ty(&mut self) -> ScalarType {
        *self.rng.pick(&TYPES_WIDE).unwrap_or(&ScalarType::U32)
    }

    fn expr(&mut self, depth: u32) -> Expr {
        self.budget -= 1;
        if depth == 0 || self.budget <= 0 || self.rng.one_in(3) {
            return match self.rng.below(5) {
                0 if self.rng.one_in(4) => Expr::Scalar(self.name()),
                0 => Expr::Var(self.name()),
                1 => Expr::Length {
                    buffer: self.name(),
                },
                2 => {
                    let axis = *self.rng.pick(&AXES).unwrap_or(&Axis::X);
                    Expr::Builtin(match self.rng.below(4) {
                        0 => Builtin::GlobalId(axis),
                        1 => Builtin::LocalId(axis),
                        2 => Builtin::WorkgroupId(axis),
                        _ => Builtin::WorkgroupCount(axis),
                    })
                }
                _ => {
                    let ty = self.ty();
                    Expr::Literal(interesting_literal(&mut self.rng, ty))
                }
            };
        }
        let next = depth - 1;
        match self.rng.below(8) {
            0 => Expr::Load {
                buffer: self.name(),
                index: Box::new(self.expr(next)),
            },
            1 | 2 => {
                let op = *self.rng.pick(&BinaryOp::ALL).unwrap_or(&BinaryOp::Add);
                Expr::Binary {
                    op,
                    lhs: Box::new(self.expr(next)),
                    rhs: Box::new(self.expr(next)),
                }
            }
            3 => {
                let op = *self.rng.pick(&UnaryOp::ALL).unwrap_or(&UnaryOp::Neg);
                Expr::Unary {
                    op,
                    operand: Box::new(self.expr(next)),
                }
            }
            4 => Expr::Select {
                condition: Box::new(self.expr(next)),
                if_true: Box::new(self.expr(next)),
                if_false: Box::new(self.expr(next)),
            },
            5 => Expr::Cast {
                to: self.ty(),
                value: Box::new(self.expr(next)),
            },
            6 => Expr::SubgroupShuffleXor {
                value: Box::new(self.expr(next)),
                lane_mask: if self.rng.one_in(2) {
                    self.rng.range(0, 40)
                } else {
                    self.rng.next_u32()
                },
            },
            _ if self.rng.one_in(2) => Expr::SubgroupScan {
                op: *self.rng.pick(&REDUCE_OPS).unwrap_or(&ReduceOp::Sum),
                kind: *self.rng.pick(&SCAN_KINDS).unwrap_or(&ScanKind::Inclusive),
                value: Box::new(self.expr(next)),
            },
            _ => Expr::SubgroupReduce {
                op: *self.rng.pick(&REDUCE_OPS).unwrap_or(&ReduceOp::Sum),
                value: Box::new(self.expr(next)),
            },
        }
    }

    fn node(&mut self, depth: u32) -> Node {
        self.budget -= 1;
        let choice = if depth == 0 || self.budget <= 0 {
            self.rng.below(7)
        } else {
            self.rng.below(11)
        };
        match choice {
            0 => Node::Let {
                name: self.name(),
                mutable: self.rng.one_in(2),
                value: self.expr(3),
            },
            1 => Node::Assign {
                name: self.name(),
                value: self.expr(3),
            },
            2 => Node::Store {
                buffer: self.name(),
                index: self.expr(2),
                value: self.expr(3),
            },
            3 => match self.rng.below(5) {
                0 => Node::Barrier,
                1 => Node::GridSync,
                2 => Node::Break,
                3 => Node::Continue,
                _ => Node::Return,
            },
            4 => {
                let op = *self.rng.pick(&AtomicOp::ALL).unwrap_or(&AtomicOp::Add);
                match self.rng.below(4) {
                    0 => Node::Atomic {
                        op,
                        buffer: self.name(),
                        index: self.expr(2),
                        value: self.expr(2),
                    },
                    3 if self.rng.one_in(2) => Node::AcquireLoad {
                        name: self.name(),
                        buffer: self.name(),
                        index: self.expr(2),
                    },
                    3 => Node::AtomicLoad {
                        name: self.name(),
                        buffer: self.name(),
                        index: self.expr(2),
                    },
                    1 => Node::AtomicFetch {
                        name: self.name(),
                        op,
                        buffer: self.name(),
                        index: self.expr(2),
                        value: self.expr(2),
                    },
                    _ => Node::CompareExchange {
                        name: self.name(),
                        buffer: self.name(),
                        index: self.expr(2),
                        expected: self.expr(1),
                        value: self.expr(2),
                    },
                }
            }
            5 if self.rng.one_in(2) => Node::WorkgroupScan {
                name: self.name(),
                op: *self.rng.pick(&REDUCE_OPS).unwrap_or(&ReduceOp::Sum),
                kind: *self.rng.pick(&SCAN_KINDS).unwrap_or(&ScanKind::Inclusive),
                value: self.expr(2),
            },
            5 => Node::WorkgroupReduce {
                name: self.name(),
                op: *self.rng.pick(&REDUCE_OPS).unwrap_or(&ReduceOp::Sum),
                value: self.expr(2),
            },
            6 => Node::Let {
                name: self.name(),
                mutable: true,
                value: Expr::Literal(interesting_literal(&mut self.rng, ScalarType::U32)),
            },
            7 | 8 => Node::If {
                condition: self.expr(2),
                then_body: self.block(depth - 1).into(),
                else_body: self.block(depth - 1).into(),
            },
            9 => Node::Loop {
                variable: self.name(),
                start: self.expr(1),
                end: self.expr(1),
                body: self.block(depth - 1).into(),
            },
            _ => Node::While {
                condition: self.expr(2),
                body: self.block(depth - 1).into(),
            },
        }
    }

    fn block(&mut self, depth: u32) -> Vec<Node> {
        let count = self.rng.range(0, 4);
        (0..count).map(|_| self.node(depth)).collect()
    }

    fn buffer(&mut self, position: u32) -> BufferDecl {
        let count = match self.rng.below(8) {
            0 => BufferCount::Static(0),
            1 => BufferCount::Static(u32::MAX),
            2 => BufferCount::Static(1 << 30),
            3 => BufferCount::Static(self.rng.next_u32()),
            4 | 5 => BufferCount::Runtime,
            _ => BufferCount::Static(self.rng.range(1, 64)),
        };
        let binding = if self.rng.one_in(3) {
            self.rng.range(0, 3)
        } else {
            position
        };
        BufferDecl::new(
            self.name(),
            binding,
            *self.rng.pick(&ACCESSES).unwrap_or(&Access::ReadOnly),
            *self.rng.pick(&ELEMS_WIDE).unwrap_or(&ElemType::U32),
            count,
        )
    }

    /// Scalar declarations from the name pool (so some collide, some are empty or
    /// reserved, some match the names expressions read), of any type; now and then
    /// more than the validator allows.
    fn scalars(&mut self) -> Vec<ScalarDecl> {
        let count = if self.rng.one_in(32) {
            MAX_SCALARS as u32 + 1
        } else {
            self.rng.range(0, 3)
        };
        (0..count)
            .map(|_| ScalarDecl::new(self.name(), self.ty()))
            .collect()
    }

    fn workgroup_axis(&mut self) -> u32 {
        match self.rng.below(8) {
            0 => 0,
            1 => u32::MAX,
            2 => 2048,
            3 => self.rng.next_u32(),
            4 => 65,
            _ => self.rng.range(1, 32),
        }
    }

    /// A chain of nested ifs or expressions around the depth limit.
    fn deep(&mut self) -> Vec<Node> {
        let depth = self.rng.range(200, 320);
        if self.rng.one_in(2) {
            let mut expr = Expr::u32(1);
            for _ in 0..depth {
                expr = Expr::unary(UnaryOp::BitNot, expr);
            }
            vec![Node::Let {
                name: "x".into(),
                mutable: false,
                value: expr,
            }]
        } else {
            let mut block: Vec<Node> = vec![Node::Barrier];
            for _ in 0..depth {
                block = vec![Node::If {
                    condition: Expr::bool(true),
                    then_body: block.into(),
                    else_body: Vec::new().into(),
                }];
            }
            block
        }
    }
}

/// Rebuilds a program with one random change at a random place (a node replaced,
/// inserted, deleted or wrapped; an expression replaced; a buffer field changed).
struct Mutator {
    junk: ArbitraryGenerator,
    target: u64,
    seen: u64,
}

impl Mutator {
    fn hit(&mut self) -> bool {
        self.seen += 1;
        self.seen == self.target
    }
}

/// The mutator's hooks: a node or an expression at the target place changes, every
/// other part is rebuilt as it was.
impl Rebuild for Mutator {
    type Error = Infallible;

    fn block(&mut self, block: &Block) -> Result<Block, Infallible> {
        let mut out = Vec::with_capacity(block.len() + 1);
        for node in block.iter() {
            if self.hit() {
                match self.junk.rng.below(6) {
                    0 => {}
                    1 => {
                        out.push(self.junk.node(2));
                        out.push(node.clone());
                    }
                    2 => out.push(self.junk.node(2)),
                    3 => out.push(Node::If {
                        condition: self.junk.expr(2),
                        then_body: vec![node.clone()].into(),
                        else_body: Vec::new().into(),
                    }),
                    4 => out.push(if self.junk.rng.one_in(2) {
                        Node::Loop {
                            variable: self.junk.name(),
                            start: Expr::u32(0),
                            end: self.junk.expr(1),
                            body: vec![node.clone()].into(),
                        }
                    } else {
                        Node::While {
                            condition: self.junk.expr(1),
                            body: vec![node.clone(), Node::Break].into(),
                        }
                    }),
                    _ => {
                        out.push(node.clone());
                        out.push(match self.junk.rng.below(6) {
                            0 => Node::Barrier,
                            1 => Node::GridSync,
                            2 => Node::Return,
                            3 => Node::Break,
                            4 => Node::Continue,
                            _ => Node::WorkgroupReduce {
                                name: self.junk.name(),
                                op: ReduceOp::Sum,
                                value: Expr::u32(1),
                            },
                        });
                    }
                }
                continue;
            }
            out.push(node.map_parts(self)?);
        }
        Ok(out.into())
    }

    fn expr(&mut self, expr: &Expr) -> Expr {
        if self.hit() {
            return match self.junk.rng.below(3) {
                0 => self.junk.expr(2),
                1 => Expr::Cast {
                    to: self.junk.ty(),
                    value: Box::new(expr.clone()),
                },
                _ => Expr::Unary {
                    op: *self.junk.rng.pick(&UnaryOp::ALL).unwrap_or(&UnaryOp::Neg),
                    operand: Box::new(expr.clone()),
                },
            };
        }
        expr.map_children(self)
    }
}

fn mutate(program: &Program, rng: SeededRng) -> Program {
    let mut junk = ArbitraryGenerator { rng, budget: 24 };
    let mut buffers: Vec<BufferDecl> = program.buffers().to_vec();
    let mut scalars: Vec<ScalarDecl> = program.scalars().to_vec();
    let mut workgroup_size = program.workgroup_size();
    match junk.rng.below(8) {
        // A scalar declaration dropped, retyped, renamed or repeated.
        2 if !scalars.is_empty() => {
            let position = junk.rng.below(scalars.len() as u64) as usize;
            match junk.rng.below(4) {
                0 => {
                    scalars.remove(position);
                }
                1 => scalars[position].ty = junk.ty(),
                2 => scalars[position].name = junk.name(),
                _ => {
                    let repeated = scalars[position].clone();
                    scalars.push(repeated);
                }
            }
        }
        0 => {
            let position = junk.rng.below(buffers.len() as u64 + 1) as usize;
            let decl = junk.buffer(position as u32);
            match buffers.get_mut(position) {
                Some(slot) => match junk.rng.below(5) {
                    0 => slot.name = decl.name,
                    1 => slot.binding = decl.binding,
                    2 => slot.access = decl.access,
                    3 => slot.elem = decl.elem,
                    _ => slot.count = decl.count,
                },
                None => buffers.push(decl),
            }
        }
        1 => {
            let axis = junk.rng.below(3) as usize;
            let value = junk.workgroup_axis();
            if let Some(slot) = workgroup_size.get_mut(axis) {
                *slot = value;
            }
        }
        _ => {
            let total = program.node_count().max(1);
            let target = junk.rng.below(total) + 1;
            let mut mutator = Mutator {
                junk,
                target,
                seen: 0,
            };
            let Ok(entry) = mutator.block(program.entry());
            return Program::from_parts(
                buffers.into(),
                scalars.into(),
                workgroup_size,
                entry,
                None,
                program.non_composable_with_self(),
            );
        }
    }
    Program::from_parts(
        buffers.into(),
        scalars.into(),
        workgroup_size,
        program.entry().clone(),
        None,
        false,
    )
}

/// An arbitrary program, usually invalid, for "the validator never panics" fuzzing.
/// About a third are valid programs with one to three random mutations (so deep rules
/// such as uniformity and scoping are reached); the rest are random buffers,
/// workgroup sizes and bodies drawn from a small name pool, sometimes nested around
/// the depth limit. Nesting stays below about 320 levels so recursive `Drop` and
/// `Display` of the result stay cheap.
pub fn arbitrary_program(seed: u64) -> Program {
    let mut rng = SeededRng::new(seed ^ 0xa4b1_7a4b);
    if rng.one_in(3) {
        let options = GeneratorOptions {
            max_nodes: 8,
            allow_grid_sync: rng.one_in(2),
            max_threads_per_workgroup: 64,
            max_workgroups: 2,
            ..GeneratorOptions::default()
        };
        let mut program = generate_valid(rng.next_u64(), &options, false).program;
        for _ in 0..rng.range(1, 3) {
            let mutation_rng = SeededRng::new(rng.next_u64());
            program = mutate(&program, mutation_rng);
        }
        return program;
    }
    let mut generator = ArbitraryGenerator { rng, budget: 24 };
    let buffer_count = generator.rng.range(0, 5);
    let buffers: Vec<BufferDecl> = (0..buffer_count).map(|i| generator.buffer(i)).collect();
    let workgroup_size = if generator.rng.one_in(2) {
        [generator.rng.range(1, 64), 1, 1]
    } else {
        [
            generator.workgroup_axis(),
            generator.workgroup_axis(),
            generator.workgroup_axis(),
        ]
    };
    let mut body = if generator.rng.one_in(64) {
        generator.deep()
    } else {
        Vec::new()
    };
    body.extend(generator.block(3));
    let mut builder = Program::builder(workgroup_size).nodes(body);
    for decl in buffers {
        builder = builder.buffer_decl(decl);
    }
    if generator.rng.one_in(4) {
        builder = builder.non_composable_with_self(true);
    }
    if generator.rng.one_in(3) {
        for decl in generator.scalars() {
            builder = builder.scalar(decl.name, decl.ty);
        }
    }
    builder.build()
}
