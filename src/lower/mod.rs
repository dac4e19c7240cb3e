//! Lowering: rewrites every [`Node::WorkgroupReduce`] and [`Node::WorkgroupScan`]
//! into operations the PTX writer emits directly (subgroup reductions and scans,
//! workgroup-shared buffers, barriers).
//!
//! Why it exists as its own pass: code generation should only ever see operations a
//! GPU executes one-to-one, and the choice between a warp-shuffle reduction and a
//! shared-memory tree depends on the device ([`LoweringCaps`]), not on the program.
//!
//! Why it is memoised inside the program: the backend lowers a program on every
//! dispatch before it computes the PTX cache key. A measured backend whose
//! per-dispatch host cost grew with program size because such steps re-walked the
//! program every call. Here the first call walks the program once and stores the
//! outcome in the program's shared allocation, so every later call (on any clone) is
//! O(1); a program with nothing to rewrite is handed back as the very same value, so
//! its memoised digest (the root of every cache key) is reused, not recomputed.
//!
//! # What the rewrite produces
//!
//! Each reduction gets a counter `N` (0, 1, ... in program order) and, where it needs
//! one, its own workgroup buffer `__vyre_reduce{N}` (`u32`, [`Access::Workgroup`],
//! binding = the next binding slot not used by the program). Its helper variables are
//! named `__vyre_reduce{N}_local`, `__vyre_reduce{N}_partial`, `__vyre_reduce{N}_acc`
//! and `__vyre_reduce{N}_warp`; user names can never start with `__vyre`.
//! `local` is the thread's local linear id,
//! `local_id.x + size.x * (local_id.y + size.y * local_id.z)`, the order in which CUDA
//! packs a block's threads into warps.
//!
//! With `T` threads per workgroup and `S = caps.subgroup_size`:
//! - `T <= 1`: `let name = value;` (a reduction over one thread is its value).
//! - Subgroup path (`caps.subgroup_ops`, `S > 0`, `T % S == 0`), one warp (`T == S`):
//!   `let name = subgroup_reduce(op, value);` — no buffer, no barrier.
//! - Subgroup path, `W = T / S` warps: `partial = subgroup_reduce(op, value)`; lane 0
//!   of each warp stores it at `__vyre_reduce{N}[warp]` (`W` elements); **barrier**;
//!   every thread folds the `W` partials in a loop into `acc`; `let name = acc;`;
//!   **barrier**. Two barriers.
//! - Tree path (otherwise): every thread stores its value at
//!   `__vyre_reduce{N}[local]` (`T` elements); **barrier**; then `ceil(log2 T)` steps
//!   with strides `P/2, P/4, ..., 1` (`P` = `T` rounded up to a power of two), each
//!   `if local < count { buf[local] = buf[local] ⊕ buf[local + stride] }` followed by a
//!   **barrier**; `let name = buf[0];`; **barrier**. `ceil(log2 T) + 2` barriers.
//!
//! Each scan gets its own counter `N` too (numbered apart from the reductions), its
//! buffer `__vyre_scan{N}` and helper variables `__vyre_scan{N}_local`, `_value`,
//! `_prefix`, `_acc`, `_warp` and `_step{k}`:
//! - `T <= 1`: `let name = value;` (inclusive) or the identity (exclusive).
//! - Subgroup path, one warp: `let name = subgroup_scan(op, kind, value);`.
//! - Subgroup path, `W` warps: each warp scans (`prefix`, a `SubgroupScan` of the
//!   same kind); the warp's last lane stores the warp's total (`prefix`, or `prefix ⊕
//!   value` for an exclusive scan) at `__vyre_scan{N}[warp]`; **barrier**; every
//!   thread folds the totals of the warps before its own in a loop over all `W`
//!   (`acc = select(w < warp, acc ⊕ buf[w], acc)`: a uniform trip count); `let name =
//!   acc ⊕ prefix;`; **barrier**. Two barriers.
//! - Tree path: Hillis-Steele over `T` elements: every thread stores its value at
//!   `__vyre_scan{N}[local]`; **barrier**; for strides `s = 1, 2, 4, ... < T`: `let
//!   step = buf[local - s]` (the identity below `s`), **barrier**, `buf[local] =
//!   buf[local] ⊕ step`, **barrier**; `let name = buf[local]` (exclusive: `buf[local -
//!   1]`, the identity for thread 0); **barrier**. `2 ceil(log2 T) + 2` barriers.
//!
//! The trailing barrier of every shared-memory form is what makes a reduction inside
//! a loop safe: the next iteration's first write to the buffer cannot overtake a
//! slower thread's read of the previous iteration's result. It also makes it safe for
//! a block that appears in several places (one `Arc` shared by several parents) to
//! be rewritten **once**: its reductions keep one number and one buffer however often
//! the block occurs, so a program whose shared blocks describe 2^64 statements costs
//! one walk per distinct block, and its lowering shares the same blocks.
//!
//! # Hostile input
//!
//! The scan for reductions is iterative and visits each distinct block once. The
//! rewrite runs only on a program that passes [`ir::validate()`] against
//! [`lowering_limits`] (its nesting is at most [`ir::validate::MAX_NESTING_DEPTH`], so
//! the rewrite's recursion is bounded); [`lower`] returns that error, and
//! [`lower_workgroup_reductions`] (the backend's call, on programs it validated)
//! returns an invalid program unchanged, for code generation or the interpreter to
//! report.
//!
//! # The subgroup size travels with the result
//!
//! A program lowered with subgroup steps for `S` lanes is only correct on `S`-lane
//! subgroups (a workgroup sum of 64 lowered for 16 lanes reads 128 on 32). The result
//! records `S` in its first statement ([`SUBGROUP_SIZE_MARKER`],
//! [`lowered_subgroup_size`]); code generation and the reference interpreter refuse
//! it for any other size.

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, OnceLock};

use crate::ir::LoweringMemo;
use crate::ir::{
    self, Access, Axis, BinaryOp, Block, BufferCount, BufferDecl, ElemType, Expr, Limits, Literal,
    Name, Node, Program, ProgramForm, ReduceOp, ScanKind, ValidProgram, ValidationError,
};

/// What the device offers that lowering may use. Part of the backend's cache
/// identity through [`LoweringCaps::key`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LoweringCaps {
    /// The device executes subgroup (warp) shuffles and reductions.
    pub subgroup_ops: bool,
    /// Lanes per subgroup (32 on every NVIDIA GPU).
    pub subgroup_size: u32,
}

/// Tag in bits 40..64 of [`LoweringCaps::key`]: `"LW"` and a version byte to bump
/// when the rewrite's output changes, so a key can never name an older lowering.
const CAPS_KEY_TAG: u64 = 0x4c_57_01;

impl LoweringCaps {
    /// Capabilities checked for sense: with `subgroup_ops`, `subgroup_size` must be at
    /// least 1. (On a CUDA device use `DeviceCaps::lowering_caps`, which derives both
    /// from the device; code generation accepts only 32-lane subgroups.)
    pub fn new(subgroup_ops: bool, subgroup_size: u32) -> Result<Self, LoweringError> {
        let caps = LoweringCaps {
            subgroup_ops,
            subgroup_size,
        };
        caps.check()?;
        Ok(caps)
    }

    /// Whether these capabilities make sense (see [`LoweringCaps::new`]).
    pub fn check(&self) -> Result<(), LoweringError> {
        if self.subgroup_ops && self.subgroup_size == 0 {
            return Err(LoweringError::Caps { caps: *self });
        }
        Ok(())
    }

    /// A stable key identifying these capabilities (distinct capabilities give
    /// distinct keys). Used by the lowering memo and by the backend's cache keys.
    pub fn key(&self) -> u64 {
        // Bits 0..32: subgroup size; bit 32: the flag; bits 40..64: the tag.
        CAPS_KEY_TAG << 40 | (self.subgroup_ops as u64) << 32 | self.subgroup_size as u64
    }
}

/// Why [`lower`] refused. `Display` starts with `Fix:`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LoweringError {
    /// The program fails [`ir::validate()`] against [`lowering_limits`].
    Invalid(ValidationError),
    /// The capabilities make no sense (see [`LoweringCaps::new`]).
    Caps {
        /// The capabilities given.
        caps: LoweringCaps,
    },
}

impl fmt::Display for LoweringError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoweringError::Invalid(error) => f.write_str(error.message()),
            LoweringError::Caps { caps } => write!(
                f,
                "Fix: derive LoweringCaps from the device (DeviceCaps::lowering_caps): \
                 subgroup_ops is set with subgroup_size {}, and a subgroup has at least 1 lane",
                caps.subgroup_size
            ),
        }
    }
}

impl std::error::Error for LoweringError {}

/// The limits lowering validates against: none of the device's (the backend checks
/// those); only the structural rules (names, types, nesting, node count) matter to
/// the rewrite.
pub fn lowering_limits() -> Limits {
    // Written out in full on purpose; limits added to `Limits` later keep their defaults.
    #[allow(clippy::needless_update)]
    Limits {
        max_threads_per_workgroup: u32::MAX,
        max_workgroup_size: [u32::MAX; 3],
        max_shared_memory_bytes: u32::MAX,
        subgroup_size: 32,
        ..Limits::default()
    }
}

/// Name of the `let` a lowering that uses subgroup steps puts first in the entry:
/// its value is the subgroup size the steps were made for. It lives in the program
/// itself, so it survives every copy and rename and is part of the digest (lowerings
/// for two sizes never share a cache entry); it costs one `mov` that ptxas deletes.
pub const SUBGROUP_SIZE_MARKER: &str = "__vyre_lowered_for_subgroup_size";

/// The subgroup size `program` was lowered for, when lowering used subgroup steps
/// (read from its first statement, [`SUBGROUP_SIZE_MARKER`]; O(1)); `None` for any
/// other program. Code generation and the reference interpreter refuse such a
/// program for a different subgroup size.
pub fn lowered_subgroup_size(program: &Program) -> Option<u32> {
    match program.entry().first() {
        Some(Node::Let {
            name,
            value: Expr::Literal(Literal::U32(size)),
            ..
        }) if &**name == SUBGROUP_SIZE_MARKER => Some(*size),
        _ => None,
    }
}

thread_local! {
    static WALKS_ON_THREAD: Cell<u64> = const { Cell::new(0) };
}

/// Number of whole-program walks this module performed on the calling thread (a
/// `needs_lowering` scan or a rewrite). Tests use it to prove memo hits walk nothing.
pub fn walks_on_current_thread() -> u64 {
    WALKS_ON_THREAD.with(|c| c.get())
}

fn count_walk() {
    WALKS_ON_THREAD.with(|c| c.set(c.get().saturating_add(1)));
}

/// Whether `program` contains a [`Node::WorkgroupReduce`] or a
/// [`Node::WorkgroupScan`] at any depth.
///
/// Answered from the program's memo when lowering or this function ran on it (or
/// any clone) before; otherwise one walk, whose "nothing to rewrite" answer is
/// memoised.
pub fn needs_lowering(program: &Program) -> bool {
    if let Some(memo) = program.inner.lowered.get() {
        return memo.needs_lowering;
    }
    count_walk();
    let needs = contains_reduction(program.entry());
    if !needs {
        // "Unchanged" holds for every capability set, so it can be memoised here.
        let _ = program.inner.lowered.set(LoweringMemo::unchanged());
    }
    needs
}

/// Whether any block reachable from `entry` holds a reduction or a scan.
fn contains_reduction(entry: &Block) -> bool {
    ir::any_node(entry, |node| {
        matches!(
            node,
            Node::WorkgroupReduce { .. } | Node::WorkgroupScan { .. }
        )
    })
}

/// [`lower_workgroup_reductions`], checking first: the caps ([`LoweringCaps::check`])
/// and the program ([`ir::validate()`] against [`lowering_limits`]); returns the first
/// error instead of lowering.
pub fn lower(program: &Program, caps: &LoweringCaps) -> Result<Program, LoweringError> {
    caps.check()?;
    validate_structure(program).map_err(LoweringError::Invalid)?;
    Ok(lower_validated(program, caps))
}

/// Lower a program the validator accepted, and validate the result in the lowered
/// form against the same limits (so a lowering whose shared-memory buffers pass
/// the device's limit is refused here, naming the buffer): the checked program code
/// generation ([`crate::codegen::ptx::valid_program_to_ptx`]) and the interpreter
/// ([`crate::reference::run_valid`]) take. Nothing is validated twice: the input's
/// verdict is its type, and the result's verdict is memoised in the result.
pub fn lower_valid(
    program: &ValidProgram,
    caps: &LoweringCaps,
) -> Result<ValidProgram, LoweringError> {
    caps.check()?;
    if program.form() == ProgramForm::Lowered {
        return Ok(program.clone());
    }
    let lowered = lower_validated(program, caps);
    ir::validate_lowered(&lowered, program.limits()).map_err(LoweringError::Invalid)
}

/// Rewrite every [`Node::WorkgroupReduce`] and [`Node::WorkgroupScan`] of a validated
/// program for a device with `caps` (see the module docs for the exact output).
///
/// A program with nothing to rewrite is returned as the same value
/// ([`Program::ptr_eq`] holds, its digest memo intact). A rewritten program is a new
/// value with its own digest; unchanged blocks are shared with the input. The
/// outcome is memoised in the program, so a repeat call with the same caps key, on
/// any clone, returns the same value without walking. The result itself is marked
/// as needing no lowering, so lowering it again is also O(1).
///
/// Meant for programs that passed validation (the backend's path). A program with a
/// reduction that fails [`ir::validate()`] against [`lowering_limits`], or caps that
/// fail [`LoweringCaps::check`], is returned unchanged (code generation and the
/// interpreter then report it); [`lower`] returns the error instead.
pub fn lower_workgroup_reductions(program: &Program, caps: &LoweringCaps) -> Program {
    let key = caps.key();
    if let Some(memo) = program.inner.lowered.get() {
        if !memo.needs_lowering {
            return program.clone();
        }
        if let Some((memo_key, lowered)) = memo.result.get() {
            if *memo_key == key {
                return lowered.clone();
            }
        }
    }

    if !needs_lowering(program) {
        return program.clone();
    }
    // Bounded from here on: the rewrite recurses once per nesting level.
    if caps.check().is_err() || validate_structure(program).is_err() {
        return program.clone();
    }
    lower_validated(program, caps)
}

/// [`ir::validate()`] against [`lowering_limits`] **without** storing the verdict: the
/// program's one memo slot per form belongs to the limits its user (the backend, with
/// the device's limits) validates against; taking it with other limits would make
/// every later validation with the device's limits walk again.
fn validate_structure(program: &Program) -> Result<ValidProgram, ValidationError> {
    ir::validate_unmemoised(program, &lowering_limits(), ProgramForm::User)
}

/// The rewrite and its memo, for a program known to be valid and caps known to be
/// sensible (the callers check both).
fn lower_validated(program: &Program, caps: &LoweringCaps) -> Program {
    let key = caps.key();
    if let Some(memo) = program.inner.lowered.get() {
        if !memo.needs_lowering {
            return program.clone();
        }
        if let Some((memo_key, lowered)) = memo.result.get() {
            if *memo_key == key {
                return lowered.clone();
            }
        }
    }
    if !needs_lowering(program) {
        return program.clone();
    }
    count_walk();
    let Some(lowered) = rewrite(program, caps) else {
        let _ = program.inner.lowered.set(LoweringMemo::unchanged());
        return program.clone();
    };

    let memo = program.inner.lowered.get_or_init(|| LoweringMemo {
        needs_lowering: true,
        result: OnceLock::new(),
    });
    // If another thread got there first with the same key, hand out its value so
    // every caller sees one lowered program.
    match memo.result.get_or_init(|| (key, lowered.clone())) {
        (memo_key, winner) if *memo_key == key => winner.clone(),
        _ => lowered,
    }
}

/// The rewritten program, or `None` when it contains no reduction.
fn rewrite(program: &Program, caps: &LoweringCaps) -> Option<Program> {
    let mut rewriter = Rewriter::new(program, *caps);
    let mut entry = rewriter.block(program.entry())?;
    if rewriter.used_subgroups {
        let mut marked = Vec::with_capacity(entry.len() + 1);
        marked.push(let_(
            SUBGROUP_SIZE_MARKER.into(),
            Expr::u32(caps.subgroup_size),
        ));
        marked.extend(entry.iter().cloned());
        entry = marked.into();
    }
    let mut buffers: Vec<BufferDecl> = program.buffers().to_vec();
    buffers.append(&mut rewriter.new_buffers);
    let lowered = program.with_entry(buffers.into(), entry);
    // The output holds no reduction: lowering it again must be a no-op.
    let _ = lowered.inner.lowered.set(LoweringMemo::unchanged());
    Some(lowered)
}

struct Rewriter {
    workgroup_size: [u32; 3],
    /// Threads per workgroup; saturated for (invalid) sizes whose product overflows.
    threads: u32,
    caps: LoweringCaps,
    next_reduction: u32,
    next_scan: u32,
    used_bindings: HashSet<u32>,
    next_binding: u32,
    new_buffers: Vec<BufferDecl>,
    /// Whether a subgroup reduction was emitted (the result then depends on the size).
    used_subgroups: bool,
    /// Each distinct block already rewritten (by address): its replacement, or `None`
    /// when it is unchanged. A block shared by many parents is rewritten once.
    rewritten: HashMap<*const Node, Option<Block>>,
}

impl Rewriter {
    fn new(program: &Program, caps: LoweringCaps) -> Self {
        let used_bindings: HashSet<u32> = program.buffers().iter().map(|b| b.binding).collect();
        let next_binding = used_bindings
            .iter()
            .max()
            .map_or(0, |max| max.wrapping_add(1));
        Rewriter {
            workgroup_size: program.workgroup_size(),
            threads: program.threads_per_workgroup().unwrap_or(u32::MAX),
            caps,
            next_reduction: 0,
            next_scan: 0,
            used_bindings,
            next_binding,
            new_buffers: Vec::new(),
            used_subgroups: false,
            rewritten: HashMap::new(),
        }
    }

    /// The rewritten block, or `None` when nothing in it (at any depth) changed; each
    /// distinct allocation is rewritten once and its answer reused.
    fn block(&mut self, block: &Block) -> Option<Block> {
        if let Some(known) = self.rewritten.get(&block.as_ptr()) {
            return known.clone();
        }
        let answer = self.rewrite_block(block);
        self.rewritten.insert(block.as_ptr(), answer.clone());
        answer
    }

    fn rewrite_block(&mut self, block: &Block) -> Option<Block> {
        let mut rewritten: Option<Vec<Node>> = None;
        for (position, node) in block.iter().enumerate() {
            match self.node(node) {
                Some(replacement) => rewritten
                    .get_or_insert_with(|| block[..position].to_vec())
                    .extend(replacement),
                None => {
                    if let Some(nodes) = &mut rewritten {
                        nodes.push(node.clone());
                    }
                }
            }
        }
        rewritten.map(Block::from)
    }

    /// The nodes replacing `node`, or `None` when it stays as it is.
    fn node(&mut self, node: &Node) -> Option<Vec<Node>> {
        match node {
            Node::WorkgroupReduce { name, op, value } => Some(self.reduction(name, *op, value)),
            Node::WorkgroupScan {
                name,
                op,
                kind,
                value,
            } => Some(self.scan(name, *op, *kind, value)),
            Node::If {
                condition,
                then_body,
                else_body,
            } => {
                let new_then = self.block(then_body);
                let new_else = self.block(else_body);
                if new_then.is_none() && new_else.is_none() {
                    return None;
                }
                Some(vec![Node::If {
                    condition: condition.clone(),
                    then_body: new_then.unwrap_or_else(|| then_body.clone()),
                    else_body: new_else.unwrap_or_else(|| else_body.clone()),
                }])
            }
            Node::Loop {
                variable,
                start,
                end,
                body,
            } => {
                let new_body = self.block(body)?;
                Some(vec![Node::Loop {
                    variable: variable.clone(),
                    start: start.clone(),
                    end: end.clone(),
                    body: new_body,
                }])
            }
            Node::While { condition, body } => {
                let new_body = self.block(body)?;
                Some(vec![Node::While {
                    condition: condition.clone(),
                    body: new_body,
                }])
            }
            _ => None,
        }
    }

    fn reduction(&mut self, name: &Name, op: ReduceOp, value: &Expr) -> Vec<Node> {
        let index = self.next_reduction;
        self.next_reduction = self.next_reduction.wrapping_add(1);
        let threads = self.threads;
        let subgroup = self.caps.subgroup_size;

        if threads <= 1 {
            return vec![let_(name.clone(), value.clone())];
        }
        if self.caps.subgroup_ops && subgroup > 0 && threads.is_multiple_of(subgroup) {
            self.used_subgroups = true;
            let subgroup_sum = Expr::SubgroupReduce {
                op,
                value: Box::new(value.clone()),
            };
            if threads == subgroup {
                return vec![let_(name.clone(), subgroup_sum)];
            }
            return self.subgroup_reduction(index, name, op, subgroup_sum, threads / subgroup);
        }
        self.tree_reduction(index, name, op, value)
    }

    /// Warp reductions, one partial per warp in shared memory, then a fold of the
    /// partials by every thread.
    fn subgroup_reduction(
        &mut self,
        index: u32,
        name: &Name,
        op: ReduceOp,
        subgroup_reduce: Expr,
        warps: u32,
    ) -> Vec<Node> {
        let buffer = self.shared_buffer(index, warps);
        let local = fresh(index, "local");
        let partial = fresh(index, "partial");
        let acc = fresh(index, "acc");
        let warp = fresh(index, "warp");
        let (lane, warp_of_thread) = self.lane_and_warp(&local);

        vec![
            let_(local, self.local_linear_id()),
            let_(partial.clone(), subgroup_reduce),
            Node::If {
                condition: lane.equals(0u32),
                then_body: Arc::from(vec![Node::Store {
                    buffer: buffer.clone(),
                    index: warp_of_thread,
                    value: Expr::Var(partial),
                }]),
                else_body: Arc::from(Vec::new()),
            },
            Node::Barrier,
            Node::Let {
                name: acc.clone(),
                mutable: true,
                value: Expr::u32(op.identity()),
            },
            Node::Loop {
                variable: warp.clone(),
                start: Expr::u32(0),
                end: Expr::u32(warps),
                body: Arc::from(vec![Node::Assign {
                    name: acc.clone(),
                    value: combine(
                        op,
                        Expr::Var(acc.clone()),
                        Expr::load(buffer, Expr::Var(warp)),
                    ),
                }]),
            },
            let_(name.clone(), Expr::Var(acc)),
            Node::Barrier,
        ]
    }

    /// A shared-memory tree over all threads, a barrier after every step.
    fn tree_reduction(&mut self, index: u32, name: &Name, op: ReduceOp, value: &Expr) -> Vec<Node> {
        let threads = u64::from(self.threads);
        let buffer = self.shared_buffer(index, self.threads);
        let local = fresh(index, "local");
        let local_var = Expr::Var(local.clone());

        let mut nodes = vec![
            let_(local, self.local_linear_id()),
            Node::Store {
                buffer: buffer.clone(),
                index: local_var.clone(),
                value: value.clone(),
            },
            Node::Barrier,
        ];
        // Invariant after the step with stride s: element i < s holds the reduction of
        // every element j < T with j ≡ i (mod s). Step s only writes below s and only
        // reads its own slot and slots at or above s, so a step has no races.
        let mut stride = threads.next_power_of_two() / 2;
        while stride >= 1 {
            // Threads with a partner `local + stride < T`.
            let active = stride.min(threads - stride);
            // Both fit in u32: stride < T <= u32::MAX.
            let (stride32, active32) = (stride as u32, active as u32);
            nodes.push(Node::If {
                condition: local_var.clone().less_than(active32),
                then_body: Arc::from(vec![Node::Store {
                    buffer: buffer.clone(),
                    index: local_var.clone(),
                    value: combine(
                        op,
                        Expr::load(buffer.clone(), local_var.clone()),
                        Expr::load(buffer.clone(), local_var.clone() + stride32),
                    ),
                }]),
                else_body: Arc::from(Vec::new()),
            });
            nodes.push(Node::Barrier);
            stride /= 2;
        }
        nodes.push(let_(name.clone(), Expr::load(buffer, 0u32)));
        nodes.push(Node::Barrier);
        nodes
    }

    fn scan(&mut self, name: &Name, op: ReduceOp, kind: ScanKind, value: &Expr) -> Vec<Node> {
        let index = self.next_scan;
        self.next_scan = self.next_scan.wrapping_add(1);
        let threads = self.threads;
        let subgroup = self.caps.subgroup_size;
        if threads <= 1 {
            let only = match kind {
                ScanKind::Inclusive => value.clone(),
                ScanKind::Exclusive => Expr::u32(op.identity()),
            };
            return vec![let_(name.clone(), only)];
        }
        if self.caps.subgroup_ops && subgroup > 0 && threads.is_multiple_of(subgroup) {
            self.used_subgroups = true;
            if threads == subgroup {
                let scanned = Expr::SubgroupScan {
                    op,
                    kind,
                    value: Box::new(value.clone()),
                };
                return vec![let_(name.clone(), scanned)];
            }
            return self.subgroup_scan(index, name, op, kind, value, threads / subgroup);
        }
        self.tree_scan(index, name, op, kind, value)
    }

    /// Warp prefixes, each warp's total in shared memory (written by its last lane),
    /// then every thread adds the totals of the warps before its own.
    fn subgroup_scan(
        &mut self,
        index: u32,
        name: &Name,
        op: ReduceOp,
        kind: ScanKind,
        value: &Expr,
        warps: u32,
    ) -> Vec<Node> {
        let subgroup = self.caps.subgroup_size;
        let buffer = self.scan_buffer(index, warps);
        let local = scan_fresh(index, "local");
        let own = scan_fresh(index, "value");
        let prefix = scan_fresh(index, "prefix");
        let acc = scan_fresh(index, "acc");
        let warp = scan_fresh(index, "warp");
        let (lane, warp_of_thread) = self.lane_and_warp(&local);
        let scanned = Expr::SubgroupScan {
            op,
            kind,
            value: Box::new(Expr::Var(own.clone())),
        };
        // The warp's total: its last lane's inclusive prefix.
        let total = match kind {
            ScanKind::Inclusive => Expr::Var(prefix.clone()),
            ScanKind::Exclusive => combine(op, Expr::Var(prefix.clone()), Expr::Var(own.clone())),
        };
        let earlier = Expr::Var(warp.clone()).less_than(warp_of_thread.clone());
        vec![
            let_(local, self.local_linear_id()),
            let_(own, value.clone()),
            let_(prefix.clone(), scanned),
            Node::If {
                condition: lane.equals(subgroup - 1),
                then_body: Arc::from(vec![Node::Store {
                    buffer: buffer.clone(),
                    index: warp_of_thread,
                    value: total,
                }]),
                else_body: Arc::from(Vec::new()),
            },
            Node::Barrier,
            Node::Let {
                name: acc.clone(),
                mutable: true,
                value: Expr::u32(op.identity()),
            },
            Node::Loop {
                variable: warp.clone(),
                start: Expr::u32(0),
                end: Expr::u32(warps),
                body: Arc::from(vec![Node::Assign {
                    name: acc.clone(),
                    value: earlier.select(
                        combine(
                            op,
                            Expr::Var(acc.clone()),
                            Expr::load(buffer, Expr::Var(warp)),
                        ),
                        Expr::Var(acc.clone()),
                    ),
                }]),
            },
            let_(name.clone(), combine(op, Expr::Var(acc), Expr::Var(prefix))),
            Node::Barrier,
        ]
    }

    /// A shared-memory Hillis-Steele scan over all threads: each step reads the
    /// element `stride` below (barrier), then adds it to its own (barrier).
    fn tree_scan(
        &mut self,
        index: u32,
        name: &Name,
        op: ReduceOp,
        kind: ScanKind,
        value: &Expr,
    ) -> Vec<Node> {
        let threads = self.threads;
        let buffer = self.scan_buffer(index, threads);
        let local = scan_fresh(index, "local");
        let local_var = Expr::Var(local.clone());
        let identity = Expr::u32(op.identity());
        // `buf[local - distance]` for a thread with that many threads before it, the
        // identity otherwise (the index never leaves the buffer).
        let below = |distance: u32| {
            let has = local_var.clone().greater_equal(distance);
            let at = has
                .clone()
                .select(local_var.clone() - distance, local_var.clone());
            has.select(Expr::load(buffer.clone(), at), identity.clone())
        };
        let mut nodes = vec![
            let_(local, self.local_linear_id()),
            Node::Store {
                buffer: buffer.clone(),
                index: local_var.clone(),
                value: value.clone(),
            },
            Node::Barrier,
        ];
        // Invariant after the step with stride s: element i holds the combination of
        // elements max(0, i - 2s + 1)..=i of the input.
        let mut stride = 1u32;
        let mut step = 0u32;
        while stride < threads {
            let term = scan_fresh(index, &format!("step{step}"));
            nodes.push(let_(term.clone(), below(stride)));
            nodes.push(Node::Barrier);
            nodes.push(Node::Store {
                buffer: buffer.clone(),
                index: local_var.clone(),
                value: combine(
                    op,
                    Expr::load(buffer.clone(), local_var.clone()),
                    Expr::Var(term),
                ),
            });
            nodes.push(Node::Barrier);
            step += 1;
            stride = stride.saturating_mul(2);
        }
        let result = match kind {
            ScanKind::Inclusive => Expr::load(buffer, local_var),
            ScanKind::Exclusive => below(1),
        };
        nodes.push(let_(name.clone(), result));
        nodes.push(Node::Barrier);
        nodes
    }

    /// Declares `__vyre_scan{index}` with `count` `u32` elements and returns its name.
    fn scan_buffer(&mut self, index: u32, count: u32) -> Name {
        self.workgroup_buffer(format!("__vyre_scan{index}").into(), count)
    }

    /// Declares `__vyre_reduce{index}` with `count` `u32` elements and returns its name.
    fn shared_buffer(&mut self, index: u32, count: u32) -> Name {
        self.workgroup_buffer(format!("__vyre_reduce{index}").into(), count)
    }

    /// Declares a `u32` workgroup buffer `name` of `count` elements at a fresh binding.
    fn workgroup_buffer(&mut self, name: Name, count: u32) -> Name {
        let binding = self.fresh_binding();
        self.new_buffers.push(BufferDecl::new(
            name.clone(),
            binding,
            Access::Workgroup,
            ElemType::U32,
            BufferCount::Static(count),
        ));
        name
    }

    fn fresh_binding(&mut self) -> u32 {
        // Terminates: a program cannot use all 2^32 slots.
        while self.used_bindings.contains(&self.next_binding) {
            self.next_binding = self.next_binding.wrapping_add(1);
        }
        let binding = self.next_binding;
        self.used_bindings.insert(binding);
        self.next_binding = self.next_binding.wrapping_add(1);
        binding
    }

    /// A thread's lane in its subgroup and its subgroup's number, from the variable
    /// holding its local linear id (masks and shifts for a power-of-two size).
    fn lane_and_warp(&self, local: &Name) -> (Expr, Expr) {
        let subgroup = self.caps.subgroup_size;
        let local = Expr::Var(local.clone());
        if subgroup.is_power_of_two() {
            (
                local.clone() & (subgroup - 1),
                local >> subgroup.trailing_zeros(),
            )
        } else {
            (local.clone() % subgroup, local / subgroup)
        }
    }

    /// `local_id.x + size.x * (local_id.y + size.y * local_id.z)`, without the terms
    /// of axes whose size is 1.
    fn local_linear_id(&self) -> Expr {
        let [size_x, size_y, size_z] = self.workgroup_size;
        let mut linear = Expr::local_id(Axis::X);
        if size_y > 1 || size_z > 1 {
            let mut rest = Expr::local_id(Axis::Y);
            if size_z > 1 {
                rest = rest + Expr::u32(size_y) * Expr::local_id(Axis::Z);
            }
            linear = linear + Expr::u32(size_x) * rest;
        }
        linear
    }
}

fn fresh(index: u32, role: &str) -> Name {
    format!("__vyre_reduce{index}_{role}").into()
}

fn scan_fresh(index: u32, role: &str) -> Name {
    format!("__vyre_scan{index}_{role}").into()
}

fn let_(name: Name, value: Expr) -> Node {
    Node::Let {
        name,
        mutable: false,
        value,
    }
}

fn combine(op: ReduceOp, lhs: Expr, rhs: Expr) -> Expr {
    let binary = match op {
        ReduceOp::Sum => BinaryOp::Add,
        ReduceOp::Min => BinaryOp::Min,
        ReduceOp::Max => BinaryOp::Max,
    };
    Expr::binary(binary, lhs, rhs)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Defect locked out: the "unchanged" memo stores the program inside itself, an
    /// `Arc` cycle that leaks every no-op program.
    #[test]
    fn noop_memo_holds_no_reference_to_the_program() {
        let program = Program::new(Vec::new(), [1, 1, 1], vec![Node::Barrier]);
        let same = lower_workgroup_reductions(
            &program,
            &LoweringCaps {
                subgroup_ops: true,
                subgroup_size: 32,
            },
        );
        assert!(program.inner.lowered.get().is_some());
        drop(same);
        assert_eq!(Arc::strong_count(&program.inner), 1);
    }

    /// Defect locked out: the lowered program's memo points back at its input (a
    /// cycle), or the input's memo is not the only holder of the result.
    #[test]
    fn rewrite_memo_holds_only_the_result() {
        let program = Program::new(
            Vec::new(),
            [64, 1, 1],
            vec![Node::WorkgroupReduce {
                name: "r".into(),
                op: ReduceOp::Sum,
                value: Expr::u32(1),
            }],
        );
        let lowered = lower_workgroup_reductions(
            &program,
            &LoweringCaps {
                subgroup_ops: false,
                subgroup_size: 32,
            },
        );
        assert_eq!(Arc::strong_count(&program.inner), 1);
        // One handle here, one in the input's memo.
        assert_eq!(Arc::strong_count(&lowered.inner), 2);
        assert!(lowered
            .inner
            .lowered
            .get()
            .is_some_and(|m| m.result.get().is_none()));
    }
}
