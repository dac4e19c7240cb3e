//! The lockstep executor: runs a compiled program for every thread of the grid at
//! once, statement by statement.
//!
//! Each statement executes for the whole list of active lanes (ascending global
//! linear lane id, see [`super`]) before the next one starts, so a barrier or a
//! grid sync is satisfied by construction and a workgroup reduction sees every lane
//! of its workgroup that reached it. Expressions are evaluated *vectorised*: one
//! vector of bit patterns per expression node, one element per active lane, so
//! the per-node interpretive overhead is paid once per statement instead of once per
//! lane (the tokenizer example pushes 262,144 lanes through every statement).
//! Temporary vectors come from a pool, because fresh allocations of this size are
//! `mmap`s that fault in every page.
//!
//! A lane's value is a [`Word`]: a `u32` for programs without 64-bit values (every
//! 32-bit type's pattern), a `u64` for programs with them (32-bit patterns
//! zero-extended). The machine is generic over it, so 32-bit programs keep their
//! 4-byte lanes and vector loops.

use super::compile::{CompiledExpr, CompiledNode, CompiledProgram, Leaves};
use super::ops::{self, BinaryKind, CastKind, UnaryKind};
use super::{ReferenceError, ReferenceStats, WorkgroupOrder};
use crate::ir::{ElemType, Program, ReduceOp, ScanKind};

/// The contents of one buffer (all workgroup instances for a workgroup buffer).
pub(crate) enum Storage {
    /// `u8` elements.
    Bytes(Vec<u8>),
    /// 32-bit elements (`u32`, `i32`, `f32` bits).
    Words(Vec<u32>),
    /// 64-bit elements (`u64`, `i64`).
    DoubleWords(Vec<u64>),
}

impl Storage {
    /// Element `address` as a zero-extended bit pattern (a byte as a `u32` value).
    #[inline]
    pub(crate) fn read(&self, address: usize) -> u64 {
        match self {
            Storage::Bytes(bytes) => bytes[address] as u64,
            Storage::Words(words) => words[address] as u64,
            Storage::DoubleWords(words) => words[address],
        }
    }

    /// Store a bit pattern at `address`, keeping the low bits the element holds.
    #[inline]
    pub(crate) fn write(&mut self, address: usize, value: u64) {
        match self {
            Storage::Bytes(bytes) => bytes[address] = value as u8,
            Storage::Words(words) => words[address] = value as u32,
            Storage::DoubleWords(words) => words[address] = value,
        }
    }
}

/// A lane's value: every scalar type's bit pattern (see the module docs).
pub(crate) trait Word: Copy + Default + PartialEq + std::fmt::Debug + 'static {
    /// The value of a pattern (a `u32` lane keeps its low 32 bits).
    fn from_bits(bits: u64) -> Self;
    /// The pattern, zero-extended.
    fn bits(self) -> u64;
}

impl Word for u32 {
    #[inline(always)]
    fn from_bits(bits: u64) -> Self {
        bits as u32
    }
    #[inline(always)]
    fn bits(self) -> u64 {
        self as u64
    }
}

impl Word for u64 {
    #[inline(always)]
    fn from_bits(bits: u64) -> Self {
        bits
    }
    #[inline(always)]
    fn bits(self) -> u64 {
        self
    }
}

/// A lane's value as an element index, a `u32`.
#[inline(always)]
fn index_of<W: Word>(value: W) -> u32 {
    value.bits() as u32
}

/// Whose a buffer instance is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Instances {
    /// One for the grid: a global buffer.
    Grid,
    /// One per workgroup: a workgroup buffer.
    Workgroup,
    /// One per thread: a local array.
    Thread,
}

/// One buffer as the executor sees it.
pub(crate) struct BufferStore {
    /// Name, for error messages.
    pub(crate) name: String,
    /// Elements in one instance (what `Length` reads and bounds checks compare to).
    pub(crate) length: u32,
    /// How many instances of `length` elements it has.
    pub(crate) instances: Instances,
    /// The elements.
    pub(crate) storage: Storage,
}

impl BufferStore {
    /// A zeroed buffer of `instances * length` elements, or an error if the host
    /// cannot hold it.
    pub(crate) fn zeroed(
        name: &str,
        elem: ElemType,
        length: u32,
        instances: u64,
        per: Instances,
    ) -> Result<Self, ReferenceError> {
        let elements = length as u64 * instances;
        let storage = match elem {
            ElemType::U8 => Storage::Bytes(zeroed_vec(elements, name)?),
            ElemType::U64 | ElemType::I64 => Storage::DoubleWords(zeroed_vec(elements, name)?),
            ElemType::U32 | ElemType::I32 | ElemType::F32 => {
                Storage::Words(zeroed_vec(elements, name)?)
            }
        };
        Ok(BufferStore {
            name: name.to_owned(),
            length,
            instances: per,
            storage,
        })
    }

    /// Overwrite with zeros (a workgroup buffer at the start of each kernel run).
    pub(crate) fn clear(&mut self) {
        match &mut self.storage {
            Storage::Bytes(bytes) => bytes.fill(0),
            Storage::Words(words) => words.fill(0),
            Storage::DoubleWords(words) => words.fill(0),
        }
    }

    /// The 4-byte words [`BufferStore::clear`] writes: what a clear costs the work cap.
    pub(crate) fn clear_words(&self) -> usize {
        match &self.storage {
            Storage::Bytes(bytes) => bytes.len().div_ceil(4),
            Storage::Words(words) => words.len(),
            Storage::DoubleWords(words) => words.len().saturating_mul(2),
        }
    }

    /// The contents as little-endian bytes.
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        match &self.storage {
            Storage::Bytes(bytes) => bytes.clone(),
            Storage::Words(words) => words.iter().flat_map(|w| w.to_le_bytes()).collect(),
            Storage::DoubleWords(words) => words.iter().flat_map(|w| w.to_le_bytes()).collect(),
        }
    }
}

/// A zero-filled vector, or an error naming `what` when the allocation fails.
pub(crate) fn zeroed_vec<T: Clone + Default>(
    elements: u64,
    what: &str,
) -> Result<Vec<T>, ReferenceError> {
    let too_big = || {
        ReferenceError::new(format!(
            "Fix: the reference interpreter cannot allocate {elements} elements for {what} on this host; dispatch a smaller grid or smaller buffers."
        ))
    };
    let elements = usize::try_from(elements).map_err(|_| too_big())?;
    let mut vector = Vec::new();
    vector.try_reserve_exact(elements).map_err(|_| too_big())?;
    vector.resize(elements, T::default());
    Ok(vector)
}

/// The right operand of a vectorised binary operation.
#[derive(Clone, Copy)]
enum Operand<'a, W> {
    /// One value per lane.
    PerLane(&'a [W]),
    /// The same value for every lane (a literal).
    Uniform(W),
}

#[inline(always)]
fn zip_apply<W: Word>(values: &mut [W], rhs: Operand<'_, W>, operation: impl Fn(W, W) -> W) {
    match rhs {
        Operand::PerLane(rhs) => {
            for (value, &right) in values.iter_mut().zip(rhs) {
                *value = operation(*value, right);
            }
        }
        Operand::Uniform(right) => {
            for value in values.iter_mut() {
                *value = operation(*value, right);
            }
        }
    }
}

/// `values[i] = values[i] <kind> rhs[i]`, with the operator chosen outside the loop
/// so each arm is a tight loop the compiler can vectorise.
fn apply_binary<W: Word>(kind: BinaryKind, values: &mut [W], rhs: Operand<'_, W>) {
    macro_rules! arms {
        ($($kind:ident),* $(,)?) => {
            match kind {
                $(BinaryKind::$kind => zip_apply(values, rhs, |a, b| {
                    W::from_bits(ops::binary(BinaryKind::$kind, a.bits(), b.bits()))
                }),)*
            }
        };
    }
    arms!(
        IntAdd,
        IntSub,
        IntMul,
        U32Div,
        I32Div,
        U32Rem,
        I32Rem,
        Int64Add,
        Int64Sub,
        Int64Mul,
        U64Div,
        I64Div,
        U64Rem,
        I64Rem,
        F32Add,
        F32Sub,
        F32Mul,
        F32Div,
        BitAnd,
        BitOr,
        BitXor,
        Shl,
        U32Shr,
        I32Shr,
        Shl64,
        U64Shr,
        I64Shr,
        BitsEq,
        BitsNe,
        F32Eq,
        F32Ne,
        UnsignedLt,
        UnsignedLe,
        UnsignedGt,
        UnsignedGe,
        I32Lt,
        I32Le,
        I32Gt,
        I32Ge,
        I64Lt,
        I64Le,
        I64Gt,
        I64Ge,
        F32Lt,
        F32Le,
        F32Gt,
        F32Ge,
        UnsignedMin,
        UnsignedMax,
        I32Min,
        I32Max,
        I64Min,
        I64Max,
        F32Min,
        F32Max,
        LogicalAnd,
        LogicalOr,
        PermuteBytes,
    );
}

fn apply_unary<W: Word>(kind: UnaryKind, values: &mut [W]) {
    macro_rules! arms {
        ($($kind:ident),* $(,)?) => {
            match kind {
                $(UnaryKind::$kind => {
                    for value in values.iter_mut() {
                        *value = W::from_bits(ops::unary(UnaryKind::$kind, value.bits()));
                    }
                })*
            }
        };
    }
    arms!(
        IntNeg,
        Int64Neg,
        F32Neg,
        BitNot,
        BitNot64,
        LogicalNot,
        I32Abs,
        I64Abs,
        F32Abs,
        CountOnes,
        LeadingZeros,
        LeadingZeros64
    );
}

fn apply_cast<W: Word>(kind: CastKind, values: &mut [W]) {
    macro_rules! arms {
        ($($kind:ident),* $(,)?) => {
            match kind {
                CastKind::Bits => {}
                $(CastKind::$kind => {
                    for value in values.iter_mut() {
                        *value = W::from_bits(ops::cast(CastKind::$kind, value.bits()));
                    }
                })*
            }
        };
    }
    arms!(
        IntToBool, F32ToBool, BoolToF32, U32ToF32, I32ToF32, F32ToU32, F32ToI32, Truncate,
        SignExtend, U64ToF32, I64ToF32, F32ToU64, F32ToI64
    );
}

/// Work units a statement, loop iteration or expression node on fewer lanes is
/// charged as if it ran on this many: running one costs the interpreter a fixed
/// ~30 ns however few lanes it covers (release build, development machine: a
/// one-thread `while true {}` did 2^24 units in 248 ms, a 64-thread one in 11.3 ms,
/// 0.7 ns per lane-unit). Charged by lane count alone, a one-thread runaway loop ran
/// 32 s (150 s in a debug build) before the default work cap stopped it; charged at
/// least 32, it stops in about a second.
pub(crate) const MIN_LANES_CHARGED: u64 = 32;

/// The work units of one statement, iteration or expression node on `lanes` lanes.
#[inline]
fn charged(lanes: usize) -> u64 {
    (lanes as u64).max(MIN_LANES_CHARGED)
}

/// When `lanes` is a run of consecutive ids, its first id (gathers become copies).
#[inline]
fn contiguous_start(lanes: &[u32]) -> Option<usize> {
    let (&first, &last) = (lanes.first()?, lanes.last()?);
    ((last - first) as usize + 1 == lanes.len()).then_some(first as usize)
}

/// How a run was set up: everything fixed for the whole dispatch.
pub(crate) struct Grid {
    /// Threads per workgroup on each axis.
    pub(crate) workgroup_size: [u32; 3],
    /// Workgroups on each axis.
    pub(crate) workgroup_count: [u32; 3],
    /// Threads per workgroup.
    pub(crate) threads_per_workgroup: u32,
    /// Threads in the grid (fits `u32`).
    pub(crate) total_lanes: u32,
    /// Lanes per subgroup.
    pub(crate) subgroup_size: u32,
    /// Whether out-of-range accesses are defined (read 0, write nothing).
    pub(crate) bounds_checks: bool,
    /// The work cap ([`ReferenceStats::work`]).
    pub(crate) max_work: u64,
    /// `CodegenOptions::max_loop_iterations`: most iterations of one `while` run.
    pub(crate) max_loop_iterations: Option<u32>,
    /// `ReferenceOptions::reverse_atomic_order`: atomics apply in descending lane order.
    pub(crate) reverse_atomic_order: bool,
    /// `ReferenceOptions::workgroup_order`: lockstep, or one workgroup at a time.
    pub(crate) workgroup_order: WorkgroupOrder,
}

/// What a lane that is alive but not in a block's lane list is doing: it ran a
/// `Break` or `Continue` and waits for the innermost loop to take it back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
enum LoopExit {
    /// Still in the loop body (or in no loop).
    #[default]
    Running,
    /// Ran `Break`: leaves the loop after this iteration.
    Broke,
    /// Ran `Continue`: rejoins for the next iteration.
    Continued,
}

/// The machine state of one dispatch.
pub(crate) struct Machine<'a, W: Word> {
    program: &'a Program,
    compiled: &'a CompiledProgram,
    grid: Grid,
    /// Every buffer the program declares, by declaration position.
    pub(crate) buffers: Vec<BufferStore>,
    /// Per-lane storage of each variable slot.
    slots: Vec<Vec<W>>,
    /// False once a lane has executed `Return` in the current kernel run.
    alive: Vec<bool>,
    /// Each lane's `Break`/`Continue` state, reset by the loop that consumes it.
    loop_exit: Vec<LoopExit>,
    /// The linear workgroup id of each lane.
    workgroup_of_lane: Vec<u32>,
    /// Per-lane builtin values (global, local, workgroup id × 3 axes); empty if unused.
    builtin_tables: [Vec<W>; 9],
    /// Spare vectors for temporary values.
    pool: Vec<Vec<W>>,
    /// Spare vectors for lane lists.
    lane_pool: Vec<Vec<u32>>,
    stats: ReferenceStats,
}

impl<'a, W: Word> Machine<'a, W> {
    /// A machine with zeroed variables and the given buffers.
    pub(crate) fn new(
        program: &'a Program,
        compiled: &'a CompiledProgram,
        grid: Grid,
        buffers: Vec<BufferStore>,
    ) -> Result<Self, ReferenceError> {
        let lanes = grid.total_lanes as u64;
        let mut slots = Vec::with_capacity(compiled.slot_count);
        for _ in 0..compiled.slot_count {
            slots.push(zeroed_vec(lanes, "variable storage")?);
        }
        let mut workgroup_of_lane: Vec<u32> = zeroed_vec(lanes, "lane bookkeeping")?;
        let per_group = grid.threads_per_workgroup;
        for (lane, workgroup) in workgroup_of_lane.iter_mut().enumerate() {
            *workgroup = lane as u32 / per_group;
        }
        let mut builtin_tables: [Vec<W>; 9] = Default::default();
        for (table_index, table) in builtin_tables.iter_mut().enumerate() {
            if !compiled.builtins_used[table_index] {
                continue;
            }
            *table = zeroed_vec(lanes, "builtin values")?;
            let axis = table_index % 3;
            let [sx, sy, _] = grid.workgroup_size;
            let [gx, gy, _] = grid.workgroup_count;
            let local = |linear: u32| [linear % sx, (linear / sx) % sy, linear / (sx * sy)][axis];
            let group = |linear: u32| [linear % gx, (linear / gx) % gy, linear / (gx * gy)][axis];
            for (lane, value) in table.iter_mut().enumerate() {
                let lane = lane as u32;
                let workgroup = lane / per_group;
                let local_linear = lane - workgroup * per_group;
                *value = W::from_bits(u64::from(match table_index / 3 {
                    0 => group(workgroup)
                        .wrapping_mul(grid.workgroup_size[axis])
                        .wrapping_add(local(local_linear)),
                    1 => local(local_linear),
                    _ => group(workgroup),
                }));
            }
        }
        Ok(Machine {
            program,
            compiled,
            alive: zeroed_vec(lanes, "lane bookkeeping")?,
            loop_exit: zeroed_vec(lanes, "lane bookkeeping")?,
            grid,
            buffers,
            slots,
            workgroup_of_lane,
            builtin_tables,
            pool: Vec::new(),
            lane_pool: Vec::new(),
            stats: ReferenceStats::default(),
        })
    }

    /// Run the kernel once over the whole grid (workgroup buffers start zeroed).
    pub(crate) fn run_kernel(&mut self) -> Result<(), ReferenceError> {
        // Resetting every lane and zeroing every workgroup buffer and local array is work
        // too: an empty body run u32::MAX times must stop, however large that memory.
        let cleared: usize = self
            .buffers
            .iter()
            .filter(|b| b.instances != Instances::Grid)
            .map(BufferStore::clear_words)
            .sum();
        self.count_steps((self.grid.total_lanes as usize).saturating_add(cleared))?;
        for buffer in self.buffers.iter_mut() {
            if buffer.instances == Instances::Grid {
                continue;
            }
            buffer.clear();
        }
        self.alive.fill(true);
        self.loop_exit.fill(LoopExit::Running);
        let compiled = self.compiled;
        let per_group = self.grid.threads_per_workgroup;
        let workgroups = self.grid.total_lanes / per_group.max(1);
        let groups: Box<dyn Iterator<Item = u32>> = match self.grid.workgroup_order {
            WorkgroupOrder::Lockstep => {
                let mut lanes = self.take_lanes();
                lanes.extend(0..self.grid.total_lanes);
                let result = self.block(&compiled.body, &mut lanes);
                self.give_lanes(lanes);
                return result;
            }
            WorkgroupOrder::InTurn => Box::new(0..workgroups),
            WorkgroupOrder::InTurnReversed => Box::new((0..workgroups).rev()),
        };
        for group in groups {
            let mut lanes = self.take_lanes();
            lanes.extend(group * per_group..(group + 1) * per_group);
            let result = self.block(&compiled.body, &mut lanes);
            self.give_lanes(lanes);
            result?;
        }
        Ok(())
    }

    /// What the run cost so far.
    pub(crate) fn stats(&self) -> ReferenceStats {
        self.stats
    }

    fn take(&mut self) -> Vec<W> {
        let mut vector = self.pool.pop().unwrap_or_default();
        vector.clear();
        vector
    }

    fn give(&mut self, vector: Vec<W>) {
        self.pool.push(vector);
    }

    fn take_lanes(&mut self) -> Vec<u32> {
        let mut vector = self.lane_pool.pop().unwrap_or_default();
        vector.clear();
        vector
    }

    fn give_lanes(&mut self, vector: Vec<u32>) {
        self.lane_pool.push(vector);
    }

    /// `count` copies of a bit pattern.
    fn filled(&mut self, bits: u64, count: usize) -> Vec<W> {
        let mut vector = self.take();
        vector.resize(count, W::from_bits(bits));
        vector
    }

    fn gather(&mut self, table: Table, lanes: &[u32]) -> Vec<W> {
        let mut out = self.take();
        let source = match table {
            Table::Slot(slot) => &self.slots[slot],
            Table::Builtin(index) => &self.builtin_tables[index],
        };
        match contiguous_start(lanes) {
            Some(first) => out.extend_from_slice(&source[first..first + lanes.len()]),
            None => out.extend(lanes.iter().map(|&lane| source[lane as usize])),
        }
        out
    }

    fn scatter(&mut self, slot: usize, lanes: &[u32], values: &[W]) {
        let target = &mut self.slots[slot];
        match contiguous_start(lanes) {
            Some(first) => target[first..first + lanes.len()].copy_from_slice(values),
            None => {
                for (&lane, &value) in lanes.iter().zip(values) {
                    target[lane as usize] = value;
                }
            }
        }
    }

    fn count_steps(&mut self, lanes: usize) -> Result<(), ReferenceError> {
        self.stats.lane_steps = self.stats.lane_steps.saturating_add(charged(lanes));
        self.check_work()
    }

    /// One loop iteration over `lanes` lanes.
    fn count_iteration(&mut self, lanes: usize) -> Result<(), ReferenceError> {
        self.count_steps(lanes)
    }

    fn count_ops(&mut self, lanes: usize) -> Result<(), ReferenceError> {
        self.stats.lane_ops = self.stats.lane_ops.saturating_add(charged(lanes));
        self.check_work()
    }

    #[inline]
    fn check_work(&self) -> Result<(), ReferenceError> {
        if self.stats.work() > self.grid.max_work {
            return Err(ReferenceError::new(format!(
                "Fix: {} ran past {} units of work (statements, expression nodes and loop iterations, each times its active threads, and each kernel run's reset of its threads and workgroup memory) on the reference interpreter; shorten its loops, or dispatch fewer threads or fixpoint iterations, or raise ReferenceOptions::max_work if the work is intended.",
                self.program.display_name(),
                self.grid.max_work
            )));
        }
        Ok(())
    }

    fn out_of_range(&self, verb: &str, buffer: usize, index: u32, lane: u32) -> ReferenceError {
        let store = &self.buffers[buffer];
        ReferenceError::new(format!(
            "Fix: {} {} buffer '{}' at index {} (global thread {}), but it holds {} elements; with bounds checks off the GPU would fault here. Keep the index below the buffer's length, or dispatch with bounds checks on.",
            self.program.display_name(),
            verb,
            store.name,
            index,
            lane,
            store.length
        ))
    }

    /// The element offset of `index` in `buffer` for `lane`, `None` when out of range
    /// and bounds checks are on.
    #[inline]
    fn address(
        &self,
        verb: &str,
        buffer: usize,
        lane: u32,
        index: u32,
    ) -> Result<Option<usize>, ReferenceError> {
        let store = &self.buffers[buffer];
        if index >= store.length {
            return if self.grid.bounds_checks {
                Ok(None)
            } else {
                Err(self.out_of_range(verb, buffer, index, lane))
            };
        }
        let base = match store.instances {
            Instances::Grid => 0,
            Instances::Workgroup => {
                self.workgroup_of_lane[lane as usize] as usize * store.length as usize
            }
            Instances::Thread => lane as usize * store.length as usize,
        };
        Ok(Some(base + index as usize))
    }

    fn block(
        &mut self,
        block: &[CompiledNode],
        lanes: &mut Vec<u32>,
    ) -> Result<(), ReferenceError> {
        for node in block {
            if lanes.is_empty() {
                break;
            }
            self.count_steps(lanes.len())?;
            self.node(node, lanes)?;
        }
        Ok(())
    }

    fn node(&mut self, node: &CompiledNode, lanes: &mut Vec<u32>) -> Result<(), ReferenceError> {
        match node {
            CompiledNode::SetVariable { slot, value } => {
                let values = self.eval(value, lanes)?;
                self.scatter(*slot, lanes, &values);
                self.give(values);
            }
            CompiledNode::Store {
                buffer,
                index,
                value,
            } => {
                let indices = self.eval(index, lanes)?;
                let values = self.eval(value, lanes)?;
                let result = self.store(*buffer, lanes, &indices, &values);
                self.give(indices);
                self.give(values);
                result?;
            }
            CompiledNode::If {
                condition,
                then_body,
                else_body,
                leaves,
            } => {
                let condition = self.eval(condition, lanes)?;
                let mut then_lanes = self.take_lanes();
                let mut else_lanes = self.take_lanes();
                for (&lane, &taken) in lanes.iter().zip(&condition) {
                    if taken != W::default() {
                        then_lanes.push(lane);
                    } else {
                        else_lanes.push(lane);
                    }
                }
                self.give(condition);
                let mut result = self.block(then_body, &mut then_lanes);
                if result.is_ok() {
                    result = self.block(else_body, &mut else_lanes);
                }
                self.give_lanes(then_lanes);
                self.give_lanes(else_lanes);
                result?;
                if leaves.any() {
                    self.keep_running(lanes);
                }
            }
            CompiledNode::Loop {
                slot,
                start,
                end,
                body,
                body_leaves,
            } => {
                let starts = self.eval(start, lanes)?;
                let ends = self.eval(end, lanes)?;
                let result = self.run_loop(*slot, body, *body_leaves, lanes, &starts, &ends);
                self.give(starts);
                self.give(ends);
                result?;
                if body_leaves.returns {
                    self.keep_running(lanes);
                }
            }
            CompiledNode::While {
                condition,
                body,
                body_leaves,
            } => {
                self.run_while(condition, body, *body_leaves, lanes)?;
                if body_leaves.returns {
                    self.keep_running(lanes);
                }
            }
            CompiledNode::Break | CompiledNode::Continue => {
                let exit = if matches!(node, CompiledNode::Break) {
                    LoopExit::Broke
                } else {
                    LoopExit::Continued
                };
                for &lane in lanes.iter() {
                    self.loop_exit[lane as usize] = exit;
                }
                lanes.clear();
            }
            CompiledNode::Barrier | CompiledNode::GridSync => {
                // Lockstep execution: every lane that will reach this point already has.
            }
            CompiledNode::Atomic {
                kind,
                buffer,
                index,
                value,
                expected,
                slot,
            } => {
                let indices = self.eval(index, lanes)?;
                let expected = match expected {
                    Some(expected) => Some(self.eval(expected, lanes)?),
                    None => None,
                };
                let mut values = self.eval(value, lanes)?;
                let operands = AtomicOperands {
                    kind: *kind,
                    buffer: *buffer,
                    indices: &indices,
                    expected: expected.as_deref(),
                };
                let result = self.atomic(operands, lanes, &mut values);
                if result.is_ok() {
                    if let Some(slot) = slot {
                        self.scatter(*slot, lanes, &values);
                    }
                }
                self.give(indices);
                self.give(values);
                if let Some(expected) = expected {
                    self.give(expected);
                }
                result?;
            }
            CompiledNode::WorkgroupReduce { slot, op, value } => {
                let mut values = self.eval(value, lanes)?;
                let workgroup_of_lane = &self.workgroup_of_lane;
                reduce_runs(*op, lanes, &mut values, |lane| {
                    workgroup_of_lane[lane as usize]
                });
                self.scatter(*slot, lanes, &values);
                self.give(values);
            }
            CompiledNode::WorkgroupScan {
                slot,
                op,
                kind,
                value,
            } => {
                let mut values = self.eval(value, lanes)?;
                let workgroup_of_lane = &self.workgroup_of_lane;
                scan_runs(*op, *kind, lanes, &mut values, |lane| {
                    workgroup_of_lane[lane as usize]
                });
                self.scatter(*slot, lanes, &values);
                self.give(values);
            }
            CompiledNode::Return => {
                for &lane in lanes.iter() {
                    self.alive[lane as usize] = false;
                }
                lanes.clear();
            }
        }
        Ok(())
    }

    /// Drops the lanes that returned, broke or continued from a block's lane list.
    fn keep_running(&self, lanes: &mut Vec<u32>) {
        let (alive, loop_exit) = (&self.alive, &self.loop_exit);
        lanes.retain(|&lane| alive[lane as usize] && loop_exit[lane as usize] == LoopExit::Running);
    }

    /// After an iteration of a loop body that lanes may leave: whether `lane` goes on
    /// with the next iteration (it neither returned nor broke); its `Break` or
    /// `Continue` is consumed either way.
    fn stays_in_loop(&mut self, lane: u32) -> bool {
        let exit = std::mem::take(&mut self.loop_exit[lane as usize]);
        self.alive[lane as usize] && exit != LoopExit::Broke
    }

    /// `while condition { body }` for `lanes`: each iteration evaluates the condition
    /// for the lanes still looping and runs the body for those where it holds. Every
    /// lane entered together, so one count of iterations is every lane's.
    fn run_while(
        &mut self,
        condition: &CompiledExpr,
        body: &[CompiledNode],
        body_leaves: Leaves,
        lanes: &[u32],
    ) -> Result<(), ReferenceError> {
        let mut loop_lanes = self.take_lanes();
        loop_lanes.extend_from_slice(lanes);
        let mut body_lanes = self.take_lanes();
        let mut iterations: u64 = 0;
        let mut result = Ok(());
        while !loop_lanes.is_empty() {
            result = self.count_iteration(loop_lanes.len());
            if result.is_err() {
                break;
            }
            let holds = match self.eval(condition, &loop_lanes) {
                Ok(holds) => holds,
                Err(error) => {
                    result = Err(error);
                    break;
                }
            };
            let mut kept = 0;
            for position in 0..loop_lanes.len() {
                if holds[position] != W::default() {
                    loop_lanes[kept] = loop_lanes[position];
                    kept += 1;
                }
            }
            loop_lanes.truncate(kept);
            self.give(holds);
            if loop_lanes.is_empty() {
                break;
            }
            iterations += 1;
            if let Some(cap) = self.grid.max_loop_iterations {
                if iterations > u64::from(cap) {
                    result = Err(self.loop_cap_error(cap));
                    break;
                }
            }
            result = self.iteration(body, body_leaves, &mut loop_lanes, &mut body_lanes);
            if result.is_err() {
                break;
            }
            if body_leaves.any() {
                let mut kept = 0;
                for position in 0..loop_lanes.len() {
                    let lane = loop_lanes[position];
                    if self.stays_in_loop(lane) {
                        loop_lanes[kept] = lane;
                        kept += 1;
                    }
                }
                loop_lanes.truncate(kept);
            }
        }
        self.give_lanes(body_lanes);
        self.give_lanes(loop_lanes);
        result
    }

    /// One iteration of a loop body for `loop_lanes`: on a copy of them (in
    /// `body_lanes`) when lanes may leave it, so the caller's list (and what is kept
    /// parallel to it) stays whole.
    fn iteration(
        &mut self,
        body: &[CompiledNode],
        body_leaves: Leaves,
        loop_lanes: &mut Vec<u32>,
        body_lanes: &mut Vec<u32>,
    ) -> Result<(), ReferenceError> {
        if !body_leaves.any() {
            return self.block(body, loop_lanes);
        }
        body_lanes.clear();
        body_lanes.extend_from_slice(loop_lanes);
        self.block(body, body_lanes)
    }

    fn loop_cap_error(&self, cap: u32) -> ReferenceError {
        ReferenceError::new(format!(
            "Fix: {} ran a `while` loop past {cap} iterations, the cap CodegenOptions::max_loop_iterations sets (on the GPU the kernel traps there); make the loop's condition become false, add a `break`, or raise or remove the cap.",
            self.program.display_name()
        ))
    }

    fn run_loop(
        &mut self,
        slot: usize,
        body: &[CompiledNode],
        body_leaves: Leaves,
        lanes: &[u32],
        starts: &[W],
        ends: &[W],
    ) -> Result<(), ReferenceError> {
        let mut loop_lanes = self.take_lanes();
        let mut counters = self.take_lanes();
        let mut limits = self.take_lanes();
        for ((&lane, &start), &end) in lanes.iter().zip(starts).zip(ends) {
            let (start, end) = (index_of(start), index_of(end));
            if start < end {
                loop_lanes.push(lane);
                counters.push(start);
                limits.push(end);
            }
        }
        let mut body_lanes = self.take_lanes();
        let mut counter_values = self.take();
        let mut result = Ok(());
        while !loop_lanes.is_empty() {
            result = self.count_iteration(loop_lanes.len());
            if result.is_err() {
                break;
            }
            counter_values.clear();
            counter_values.extend(counters.iter().map(|&c| W::from_bits(u64::from(c))));
            self.scatter(slot, &loop_lanes, &counter_values);
            // The body may drop lanes that return, break or continue; it gets its own
            // copy so the counters stay parallel to `loop_lanes`.
            result = self.iteration(body, body_leaves, &mut loop_lanes, &mut body_lanes);
            if result.is_err() {
                break;
            }
            let mut kept = 0;
            for position in 0..loop_lanes.len() {
                let lane = loop_lanes[position];
                let next = counters[position].wrapping_add(1);
                let stays = !body_leaves.any() || self.stays_in_loop(lane);
                if next < limits[position] && stays {
                    loop_lanes[kept] = lane;
                    counters[kept] = next;
                    limits[kept] = limits[position];
                    kept += 1;
                }
            }
            loop_lanes.truncate(kept);
            counters.truncate(kept);
            limits.truncate(kept);
        }
        self.give(counter_values);
        self.give_lanes(body_lanes);
        self.give_lanes(loop_lanes);
        self.give_lanes(counters);
        self.give_lanes(limits);
        result
    }

    fn store(
        &mut self,
        buffer: usize,
        lanes: &[u32],
        indices: &[W],
        values: &[W],
    ) -> Result<(), ReferenceError> {
        for ((&lane, &index), &value) in lanes.iter().zip(indices).zip(values) {
            let Some(address) = self.address("writes", buffer, lane, index_of(index))? else {
                continue;
            };
            self.buffers[buffer].storage.write(address, value.bits());
        }
        Ok(())
    }

    /// One atomic statement for `lanes`, in ascending lane order (the order the
    /// reference defines; see `AtomicOp`), descending with
    /// `ReferenceOptions::reverse_atomic_order`: each lane's operand in `values` is
    /// replaced by the element's value before its own operation (0 for an index out
    /// of range, which changes nothing).
    fn atomic(
        &mut self,
        operands: AtomicOperands<'_, W>,
        lanes: &[u32],
        values: &mut [W],
    ) -> Result<(), ReferenceError> {
        let AtomicOperands {
            kind,
            buffer,
            indices,
            expected,
        } = operands;
        let count = lanes.len().min(indices.len());
        for step in 0..count {
            let position = if self.grid.reverse_atomic_order {
                count - 1 - step
            } else {
                step
            };
            let (lane, index) = (lanes[position], indices[position]);
            let Some(address) =
                self.address("applies an atomic to", buffer, lane, index_of(index))?
            else {
                values[position] = W::default();
                continue;
            };
            let storage = &mut self.buffers[buffer].storage;
            let old = storage.read(address);
            let compare = expected.map_or(0, |expected| expected[position].bits());
            let new = ops::atomic(kind, old, values[position].bits(), compare);
            storage.write(address, new);
            values[position] = W::from_bits(old);
        }
        Ok(())
    }

    fn eval(&mut self, expr: &CompiledExpr, lanes: &[u32]) -> Result<Vec<W>, ReferenceError> {
        self.count_ops(lanes.len())?;
        Ok(match expr {
            CompiledExpr::Constant(bits) => self.filled(*bits, lanes.len()),
            CompiledExpr::Variable(slot) => self.gather(Table::Slot(*slot), lanes),
            CompiledExpr::Builtin(table) => self.gather(Table::Builtin(table.table_index()), lanes),
            CompiledExpr::WorkgroupCount(axis) => {
                self.filled(u64::from(self.grid.workgroup_count[*axis]), lanes.len())
            }
            CompiledExpr::Clock => self.filled(self.stats.work(), lanes.len()),
            CompiledExpr::Length(buffer) => {
                self.filled(u64::from(self.buffers[*buffer].length), lanes.len())
            }
            CompiledExpr::Load { buffer, index } => {
                let mut values = self.eval(index, lanes)?;
                if let Err(error) = self.load(*buffer, lanes, &mut values) {
                    self.give(values);
                    return Err(error);
                }
                values
            }
            CompiledExpr::Binary { kind, lhs, rhs } => {
                let mut values = self.eval(lhs, lanes)?;
                if let CompiledExpr::Constant(bits) = **rhs {
                    if let Err(error) = self.count_ops(lanes.len()) {
                        self.give(values);
                        return Err(error);
                    }
                    apply_binary(*kind, &mut values, Operand::Uniform(W::from_bits(bits)));
                } else {
                    let right = self.eval(rhs, lanes)?;
                    apply_binary(*kind, &mut values, Operand::PerLane(&right));
                    self.give(right);
                }
                values
            }
            CompiledExpr::Unary { kind, operand } => {
                let mut values = self.eval(operand, lanes)?;
                apply_unary(*kind, &mut values);
                values
            }
            CompiledExpr::Cast { kind, value } => {
                let mut values = self.eval(value, lanes)?;
                apply_cast(*kind, &mut values);
                values
            }
            CompiledExpr::Select {
                condition,
                if_true,
                if_false,
            } => {
                let conditions = self.eval(condition, lanes)?;
                let mut values = self.eval(if_true, lanes)?;
                let otherwise = self.eval(if_false, lanes)?;
                for ((value, &condition), &other) in
                    values.iter_mut().zip(&conditions).zip(&otherwise)
                {
                    if condition == W::default() {
                        *value = other;
                    }
                }
                self.give(conditions);
                self.give(otherwise);
                values
            }
            CompiledExpr::ShuffleXor { value, lane_mask } => {
                let values = self.eval(value, lanes)?;
                let mut shuffled = self.take();
                shuffled.extend_from_slice(&values);
                self.shuffle_xor(*lane_mask, lanes, &values, &mut shuffled);
                self.give(values);
                shuffled
            }
            CompiledExpr::SubgroupReduce { op, value } => {
                let mut values = self.eval(value, lanes)?;
                let per_group = self.grid.threads_per_workgroup;
                let subgroup_size = self.grid.subgroup_size;
                reduce_runs(*op, lanes, &mut values, |lane| {
                    subgroup_key(lane, per_group, subgroup_size)
                });
                values
            }
            CompiledExpr::SubgroupScan { op, kind, value } => {
                let mut values = self.eval(value, lanes)?;
                let per_group = self.grid.threads_per_workgroup;
                let subgroup_size = self.grid.subgroup_size;
                scan_runs(*op, *kind, lanes, &mut values, |lane| {
                    subgroup_key(lane, per_group, subgroup_size)
                });
                values
            }
        })
    }

    fn load(&self, buffer: usize, lanes: &[u32], indices: &mut [W]) -> Result<(), ReferenceError> {
        let store = &self.buffers[buffer];
        let length = store.length;
        let grid_wide = store.instances == Instances::Grid;
        if grid_wide && indices.iter().all(|&index| index_of(index) < length) {
            // The common case: a global buffer read in range by every lane.
            let read = |index: &mut W| -> usize { index_of(*index) as usize };
            match &store.storage {
                Storage::Bytes(bytes) => {
                    for index in indices.iter_mut() {
                        *index = W::from_bits(u64::from(bytes[read(index)]));
                    }
                }
                Storage::Words(words) => {
                    for index in indices.iter_mut() {
                        *index = W::from_bits(u64::from(words[read(index)]));
                    }
                }
                Storage::DoubleWords(words) => {
                    for index in indices.iter_mut() {
                        *index = W::from_bits(words[read(index)]);
                    }
                }
            }
            return Ok(());
        }
        for (&lane, index) in lanes.iter().zip(indices.iter_mut()) {
            *index = match self.address("reads", buffer, lane, index_of(*index))? {
                None => W::default(),
                Some(address) => W::from_bits(store.storage.read(address)),
            };
        }
        Ok(())
    }

    /// `out[i]` = the value of the lane whose subgroup lane is `own ^ lane_mask` in
    /// the same subgroup, if that lane exists and is active; else the lane's own value
    /// (already in `out`).
    fn shuffle_xor(&self, lane_mask: u32, lanes: &[u32], values: &[W], out: &mut [W]) {
        let per_group = self.grid.threads_per_workgroup;
        let subgroup_size = self.grid.subgroup_size;
        let key = |lane| subgroup_key(lane, per_group, subgroup_size);
        for_each_run(lanes, key, |positions| {
            let run_start = positions.start;
            let run = &lanes[positions];
            for (offset, &lane) in run.iter().enumerate() {
                let local = lane % per_group;
                let in_subgroup = local % subgroup_size;
                let partner_in_subgroup = in_subgroup ^ lane_mask;
                if partner_in_subgroup >= subgroup_size {
                    continue;
                }
                let Some(partner) = (lane - in_subgroup).checked_add(partner_in_subgroup) else {
                    continue;
                };
                // A partner past the workgroup's end has another key, so it is not in `run`.
                if let Ok(found) = run.binary_search(&partner) {
                    out[run_start + offset] = values[run_start + found];
                }
            }
        });
    }
}

/// What an atomic statement applies, besides each lane's operand.
struct AtomicOperands<'v, W> {
    kind: ops::AtomicKind,
    buffer: usize,
    indices: &'v [W],
    /// A compare-exchange's expected values.
    expected: Option<&'v [W]>,
}

/// Which per-lane table a gather reads.
#[derive(Clone, Copy)]
enum Table {
    Slot(usize),
    Builtin(usize),
}

/// A key equal for two lanes exactly when they share a subgroup.
#[inline]
fn subgroup_key(lane: u32, per_group: u32, subgroup_size: u32) -> (u32, u32) {
    let workgroup = lane / per_group;
    let local = lane - workgroup * per_group;
    (workgroup, local / subgroup_size)
}

/// Replace each value (a `u32`) by the reduction over its run of lanes with equal
/// `key` (lanes are sorted, so each group is one contiguous run).
fn reduce_runs<W: Word, K: PartialEq>(
    op: ReduceOp,
    lanes: &[u32],
    values: &mut [W],
    key: impl Fn(u32) -> K,
) {
    for_each_run(lanes, key, |run| {
        let run = &mut values[run];
        let total = run.iter().fold(op.identity(), |total, &value| {
            op.combine(total, index_of(value))
        });
        run.fill(W::from_bits(u64::from(total)));
    });
}

/// Calls `each` with the position range of every run of consecutive lanes with
/// equal `key` (lanes are sorted, so each workgroup or subgroup is one run).
fn for_each_run<K: PartialEq>(
    lanes: &[u32],
    key: impl Fn(u32) -> K,
    mut each: impl FnMut(std::ops::Range<usize>),
) {
    let mut run_start = 0;
    while run_start < lanes.len() {
        let run_key = key(lanes[run_start]);
        let mut run_end = run_start + 1;
        while run_end < lanes.len() && key(lanes[run_end]) == run_key {
            run_end += 1;
        }
        each(run_start..run_end);
        run_start = run_end;
    }
}

/// Replace each value (a `u32`) by its prefix over its run of lanes with equal
/// `key`, in lane order: the combination of the values before it, and with its own
/// for an inclusive scan.
fn scan_runs<W: Word, K: PartialEq>(
    op: ReduceOp,
    kind: ScanKind,
    lanes: &[u32],
    values: &mut [W],
    key: impl Fn(u32) -> K,
) {
    for_each_run(lanes, key, |run| {
        let mut before = op.identity();
        for value in &mut values[run] {
            let through = op.combine(before, index_of(*value));
            let prefix = match kind {
                ScanKind::Inclusive => through,
                ScanKind::Exclusive => before,
            };
            *value = W::from_bits(u64::from(prefix));
            before = through;
        }
    });
}
