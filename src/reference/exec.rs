//! The lockstep executor: runs a compiled program for every thread of the grid at
//! once, statement by statement.
//!
//! Each statement executes for the whole list of active lanes (ascending global
//! linear lane id, see [`super`]) before the next one starts, so a barrier or a
//! grid sync is satisfied by construction and a workgroup reduction sees every lane
//! of its workgroup that reached it. Expressions are evaluated *vectorised*: one
//! `Vec<u32>` of bit patterns per expression node, one element per active lane, so
//! the per-node interpretive overhead is paid once per statement instead of once per
//! lane (the tokenizer example pushes 262,144 lanes through every statement).
//! Temporary vectors come from a pool, because fresh allocations of this size are
//! `mmap`s that fault in every page.

use super::compile::{CompiledExpr, CompiledNode, CompiledProgram};
use super::ops::{self, BinaryKind, CastKind, UnaryKind};
use super::{ReferenceError, ReferenceStats};
use crate::ir::{AtomicOp, ElemType, Program, ReduceOp};

/// The contents of one buffer (all workgroup instances for a workgroup buffer).
pub(crate) enum Storage {
    /// `u8` elements.
    Bytes(Vec<u8>),
    /// 32-bit elements (`u32`, `i32`, `f32` bits).
    Words(Vec<u32>),
}

/// One buffer as the executor sees it.
pub(crate) struct BufferStore {
    /// Name, for error messages.
    pub(crate) name: String,
    /// Elements in one instance (what `Length` reads and bounds checks compare to).
    pub(crate) length: u32,
    /// True for workgroup buffers: one instance of `length` elements per workgroup.
    pub(crate) per_workgroup: bool,
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
        per_workgroup: bool,
    ) -> Result<Self, ReferenceError> {
        let elements = length as u64 * instances;
        let storage = match elem {
            ElemType::U8 => Storage::Bytes(zeroed_vec(elements, name)?),
            _ => Storage::Words(zeroed_vec(elements, name)?),
        };
        Ok(BufferStore {
            name: name.to_owned(),
            length,
            per_workgroup,
            storage,
        })
    }

    /// Overwrite with zeros (a workgroup buffer at the start of each kernel run).
    pub(crate) fn clear(&mut self) {
        match &mut self.storage {
            Storage::Bytes(bytes) => bytes.fill(0),
            Storage::Words(words) => words.fill(0),
        }
    }

    /// The 4-byte words [`BufferStore::clear`] writes: what a clear costs the work cap.
    pub(crate) fn clear_words(&self) -> usize {
        match &self.storage {
            Storage::Bytes(bytes) => bytes.len().div_ceil(4),
            Storage::Words(words) => words.len(),
        }
    }

    /// The contents as little-endian bytes.
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        match &self.storage {
            Storage::Bytes(bytes) => bytes.clone(),
            Storage::Words(words) => words.iter().flat_map(|w| w.to_le_bytes()).collect(),
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
enum Operand<'a> {
    /// One value per lane.
    PerLane(&'a [u32]),
    /// The same value for every lane (a literal).
    Uniform(u32),
}

#[inline(always)]
fn zip_apply(values: &mut [u32], rhs: Operand<'_>, operation: impl Fn(u32, u32) -> u32) {
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
fn apply_binary(kind: BinaryKind, values: &mut [u32], rhs: Operand<'_>) {
    macro_rules! arms {
        ($($kind:ident),* $(,)?) => {
            match kind {
                $(BinaryKind::$kind => {
                    zip_apply(values, rhs, |a, b| ops::binary(BinaryKind::$kind, a, b))
                })*
            }
        };
    }
    arms!(
        IntAdd, IntSub, IntMul, U32Div, I32Div, U32Rem, I32Rem, F32Add, F32Sub, F32Mul, F32Div,
        BitAnd, BitOr, BitXor, Shl, U32Shr, I32Shr, BitsEq, BitsNe, F32Eq, F32Ne, U32Lt, U32Le,
        U32Gt, U32Ge, I32Lt, I32Le, I32Gt, I32Ge, F32Lt, F32Le, F32Gt, F32Ge, U32Min, U32Max,
        I32Min, I32Max, F32Min, F32Max, LogicalAnd, LogicalOr,
    );
}

fn apply_unary(kind: UnaryKind, values: &mut [u32]) {
    macro_rules! arms {
        ($($kind:ident),* $(,)?) => {
            match kind {
                $(UnaryKind::$kind => {
                    for value in values.iter_mut() {
                        *value = ops::unary(UnaryKind::$kind, *value);
                    }
                })*
            }
        };
    }
    arms!(
        IntNeg,
        F32Neg,
        BitNot,
        LogicalNot,
        I32Abs,
        F32Abs,
        CountOnes,
        LeadingZeros
    );
}

fn apply_cast(kind: CastKind, values: &mut [u32]) {
    macro_rules! arms {
        ($($kind:ident),* $(,)?) => {
            match kind {
                CastKind::Bits => {}
                $(CastKind::$kind => {
                    for value in values.iter_mut() {
                        *value = ops::cast(CastKind::$kind, *value);
                    }
                })*
            }
        };
    }
    arms!(IntToBool, F32ToBool, BoolToF32, U32ToF32, I32ToF32, F32ToU32, F32ToI32);
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
}

/// The machine state of one dispatch.
pub(crate) struct Machine<'a> {
    program: &'a Program,
    compiled: &'a CompiledProgram,
    grid: Grid,
    /// Every buffer the program declares, by declaration position.
    pub(crate) buffers: Vec<BufferStore>,
    /// Per-lane storage of each variable slot.
    slots: Vec<Vec<u32>>,
    /// False once a lane has executed `Return` in the current kernel run.
    alive: Vec<bool>,
    /// The linear workgroup id of each lane.
    workgroup_of_lane: Vec<u32>,
    /// Per-lane builtin values (global, local, workgroup id × 3 axes); empty if unused.
    builtin_tables: [Vec<u32>; 9],
    /// Spare vectors for temporaries.
    pool: Vec<Vec<u32>>,
    stats: ReferenceStats,
}

impl<'a> Machine<'a> {
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
        let mut builtin_tables: [Vec<u32>; 9] = Default::default();
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
                *value = match table_index / 3 {
                    0 => group(workgroup)
                        .wrapping_mul(grid.workgroup_size[axis])
                        .wrapping_add(local(local_linear)),
                    1 => local(local_linear),
                    _ => group(workgroup),
                };
            }
        }
        Ok(Machine {
            program,
            compiled,
            alive: zeroed_vec(lanes, "lane bookkeeping")?,
            grid,
            buffers,
            slots,
            workgroup_of_lane,
            builtin_tables,
            pool: Vec::new(),
            stats: ReferenceStats::default(),
        })
    }

    /// Run the kernel once over the whole grid (workgroup buffers start zeroed).
    pub(crate) fn run_kernel(&mut self) -> Result<(), ReferenceError> {
        // Resetting every lane and zeroing every workgroup buffer is work too: an empty
        // body run u32::MAX times must stop, however large its workgroup memory.
        let cleared: usize = self
            .buffers
            .iter()
            .filter(|b| b.per_workgroup)
            .map(BufferStore::clear_words)
            .sum();
        self.count_steps((self.grid.total_lanes as usize).saturating_add(cleared))?;
        for buffer in self.buffers.iter_mut().filter(|b| b.per_workgroup) {
            buffer.clear();
        }
        self.alive.fill(true);
        let mut lanes = self.take();
        lanes.extend(0..self.grid.total_lanes);
        let compiled = self.compiled;
        let result = self.block(&compiled.body, &mut lanes);
        self.give(lanes);
        result
    }

    /// What the run cost so far.
    pub(crate) fn stats(&self) -> ReferenceStats {
        self.stats
    }

    fn take(&mut self) -> Vec<u32> {
        let mut vector = self.pool.pop().unwrap_or_default();
        vector.clear();
        vector
    }

    fn give(&mut self, vector: Vec<u32>) {
        self.pool.push(vector);
    }

    fn filled(&mut self, value: u32, count: usize) -> Vec<u32> {
        let mut vector = self.take();
        vector.resize(count, value);
        vector
    }

    fn gather(&mut self, table: Table, lanes: &[u32]) -> Vec<u32> {
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

    fn scatter(&mut self, slot: usize, lanes: &[u32], values: &[u32]) {
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
        self.stats.lane_steps = self.stats.lane_steps.saturating_add(lanes as u64);
        self.check_work()
    }

    fn count_ops(&mut self, lanes: usize) -> Result<(), ReferenceError> {
        self.stats.lane_ops = self.stats.lane_ops.saturating_add(lanes as u64);
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
        let base = if store.per_workgroup {
            self.workgroup_of_lane[lane as usize] as usize * store.length as usize
        } else {
            0
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
                may_return,
            } => {
                let condition = self.eval(condition, lanes)?;
                let mut then_lanes = self.take();
                let mut else_lanes = self.take();
                for (&lane, &taken) in lanes.iter().zip(&condition) {
                    if taken != 0 {
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
                self.give(then_lanes);
                self.give(else_lanes);
                result?;
                if *may_return {
                    let alive = &self.alive;
                    lanes.retain(|&lane| alive[lane as usize]);
                }
            }
            CompiledNode::Loop {
                slot,
                start,
                end,
                body,
                may_return,
            } => {
                let starts = self.eval(start, lanes)?;
                let ends = self.eval(end, lanes)?;
                let result = self.run_loop(*slot, body, *may_return, lanes, &starts, &ends);
                self.give(starts);
                self.give(ends);
                result?;
                if *may_return {
                    let alive = &self.alive;
                    lanes.retain(|&lane| alive[lane as usize]);
                }
            }
            CompiledNode::Barrier | CompiledNode::GridSync => {
                // Lockstep execution: every lane that will reach this point already has.
            }
            CompiledNode::Atomic {
                op,
                buffer,
                index,
                value,
            } => {
                let indices = self.eval(index, lanes)?;
                let values = self.eval(value, lanes)?;
                let result = self.atomic(*op, *buffer, lanes, &indices, &values);
                self.give(indices);
                self.give(values);
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
            CompiledNode::Return => {
                for &lane in lanes.iter() {
                    self.alive[lane as usize] = false;
                }
                lanes.clear();
            }
        }
        Ok(())
    }

    fn run_loop(
        &mut self,
        slot: usize,
        body: &[CompiledNode],
        may_return: bool,
        lanes: &[u32],
        starts: &[u32],
        ends: &[u32],
    ) -> Result<(), ReferenceError> {
        let mut loop_lanes = self.take();
        let mut counters = self.take();
        let mut limits = self.take();
        for ((&lane, &start), &end) in lanes.iter().zip(starts).zip(ends) {
            if start < end {
                loop_lanes.push(lane);
                counters.push(start);
                limits.push(end);
            }
        }
        let mut body_lanes = self.take();
        let mut result = Ok(());
        while !loop_lanes.is_empty() {
            result = self.count_steps(loop_lanes.len());
            if result.is_err() {
                break;
            }
            self.scatter(slot, &loop_lanes, &counters);
            // The body may drop lanes that return; it gets its own copy so the
            // counters stay parallel to `loop_lanes`.
            let lanes_for_body = if may_return {
                body_lanes.clear();
                body_lanes.extend_from_slice(&loop_lanes);
                &mut body_lanes
            } else {
                &mut loop_lanes
            };
            result = self.block(body, lanes_for_body);
            if result.is_err() {
                break;
            }
            let mut kept = 0;
            for position in 0..loop_lanes.len() {
                let lane = loop_lanes[position];
                let next = counters[position].wrapping_add(1);
                if next < limits[position] && self.alive[lane as usize] {
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
        self.give(body_lanes);
        self.give(loop_lanes);
        self.give(counters);
        self.give(limits);
        result
    }

    fn store(
        &mut self,
        buffer: usize,
        lanes: &[u32],
        indices: &[u32],
        values: &[u32],
    ) -> Result<(), ReferenceError> {
        for ((&lane, &index), &value) in lanes.iter().zip(indices).zip(values) {
            let Some(address) = self.address("writes", buffer, lane, index)? else {
                continue;
            };
            match &mut self.buffers[buffer].storage {
                Storage::Bytes(bytes) => bytes[address] = value as u8,
                Storage::Words(words) => words[address] = value,
            }
        }
        Ok(())
    }

    fn atomic(
        &mut self,
        op: AtomicOp,
        buffer: usize,
        lanes: &[u32],
        indices: &[u32],
        values: &[u32],
    ) -> Result<(), ReferenceError> {
        for ((&lane, &index), &value) in lanes.iter().zip(indices).zip(values) {
            let Some(address) = self.address("applies an atomic to", buffer, lane, index)? else {
                continue;
            };
            let Storage::Words(words) = &mut self.buffers[buffer].storage else {
                return Err(ReferenceError::new(format!(
                    "Fix: {} applies an atomic to byte buffer '{}'; atomics need a u32 buffer.",
                    self.program.display_name(),
                    self.buffers[buffer].name
                )));
            };
            let old = words[address];
            words[address] = match op {
                AtomicOp::Add => old.wrapping_add(value),
                AtomicOp::Min => old.min(value),
                AtomicOp::Max => old.max(value),
                AtomicOp::Or => old | value,
            };
        }
        Ok(())
    }

    fn eval(&mut self, expr: &CompiledExpr, lanes: &[u32]) -> Result<Vec<u32>, ReferenceError> {
        self.count_ops(lanes.len())?;
        Ok(match expr {
            CompiledExpr::Constant(bits) => self.filled(*bits, lanes.len()),
            CompiledExpr::Variable(slot) => self.gather(Table::Slot(*slot), lanes),
            CompiledExpr::Builtin(table) => self.gather(Table::Builtin(table.table_index()), lanes),
            CompiledExpr::WorkgroupCount(axis) => {
                self.filled(self.grid.workgroup_count[*axis], lanes.len())
            }
            CompiledExpr::Length(buffer) => self.filled(self.buffers[*buffer].length, lanes.len()),
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
                    apply_binary(*kind, &mut values, Operand::Uniform(bits));
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
                    if condition == 0 {
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
        })
    }

    fn load(
        &self,
        buffer: usize,
        lanes: &[u32],
        indices: &mut [u32],
    ) -> Result<(), ReferenceError> {
        let store = &self.buffers[buffer];
        let length = store.length;
        if !store.per_workgroup && indices.iter().all(|&index| index < length) {
            // The common case: a global buffer read in range by every lane.
            match &store.storage {
                Storage::Bytes(bytes) => {
                    for index in indices.iter_mut() {
                        *index = bytes[*index as usize] as u32;
                    }
                }
                Storage::Words(words) => {
                    for index in indices.iter_mut() {
                        *index = words[*index as usize];
                    }
                }
            }
            return Ok(());
        }
        for (&lane, index) in lanes.iter().zip(indices.iter_mut()) {
            *index = match self.address("reads", buffer, lane, *index)? {
                None => 0,
                Some(address) => match &store.storage {
                    Storage::Bytes(bytes) => bytes[address] as u32,
                    Storage::Words(words) => words[address],
                },
            };
        }
        Ok(())
    }

    /// `out[i]` = the value of the lane whose subgroup lane is `own ^ lane_mask` in
    /// the same subgroup, if that lane exists and is active; else the lane's own value
    /// (already in `out`).
    fn shuffle_xor(&self, lane_mask: u32, lanes: &[u32], values: &[u32], out: &mut [u32]) {
        let per_group = self.grid.threads_per_workgroup;
        let subgroup_size = self.grid.subgroup_size;
        let mut run_start = 0;
        while run_start < lanes.len() {
            let key = subgroup_key(lanes[run_start], per_group, subgroup_size);
            let mut run_end = run_start + 1;
            while run_end < lanes.len()
                && subgroup_key(lanes[run_end], per_group, subgroup_size) == key
            {
                run_end += 1;
            }
            let run = &lanes[run_start..run_end];
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
            run_start = run_end;
        }
    }
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

/// Replace each value by the reduction over its run of lanes with equal `key`
/// (lanes are sorted, so each group is one contiguous run).
fn reduce_runs<K: PartialEq>(
    op: ReduceOp,
    lanes: &[u32],
    values: &mut [u32],
    key: impl Fn(u32) -> K,
) {
    let mut run_start = 0;
    while run_start < lanes.len() {
        let run_key = key(lanes[run_start]);
        let mut run_end = run_start + 1;
        while run_end < lanes.len() && key(lanes[run_end]) == run_key {
            run_end += 1;
        }
        let total = values[run_start..run_end]
            .iter()
            .fold(op.identity(), |total, &value| op.combine(total, value));
        values[run_start..run_end].fill(total);
        run_start = run_end;
    }
}
