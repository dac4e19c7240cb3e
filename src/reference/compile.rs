//! The pre-pass: resolves every name to a buffer index or a variable slot and every
//! operator to a typed operator, once per run, so the lockstep executor never hashes
//! a name or looks at a type while lanes are waiting.
//!
//! It runs only on a program the validator accepted ([`crate::ir::ValidProgram`]) and
//! relies on what that established (known names, matching types, writable buffers,
//! mutable assignment targets, no shadowing, unique buffer names) instead of checking
//! it again. A lookup that cannot fail on a valid program still answers with an
//! error rather than a panic ([`internal`]): a validator bug must not crash a caller.
//!
//! Variable slots follow scopes: a variable's slot is its depth in the scope stack,
//! so sibling blocks reuse slots and per-lane storage is bounded by the deepest
//! nesting of live variables, not by the number of `let`s in the program.

use std::collections::HashMap;

use super::ops::{AtomicKind, BinaryKind, CastKind, UnaryKind};
use crate::ir::{
    AtomicOp, BinaryOp, BufferDecl, Builtin, ElemType, Expr, Literal, Name, Node, Program,
    ReduceOp, ScalarType, ScanKind, UnaryOp,
};

/// An invocation builtin as a per-lane table index (see [`BuiltinTable`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BuiltinTable {
    /// `global_id` on axis 0..3.
    Global(usize),
    /// `local_id` on axis 0..3.
    Local(usize),
    /// `workgroup_id` on axis 0..3.
    Workgroup(usize),
}

impl BuiltinTable {
    /// Position in the executor's table of per-lane builtin vectors (0..9).
    pub(crate) fn table_index(self) -> usize {
        match self {
            BuiltinTable::Global(axis) => axis,
            BuiltinTable::Local(axis) => 3 + axis,
            BuiltinTable::Workgroup(axis) => 6 + axis,
        }
    }
}

/// A typed expression.
#[derive(Clone, Debug)]
pub(crate) enum CompiledExpr {
    /// A literal's bits (zero-extended).
    Constant(u64),
    /// A variable slot.
    Variable(usize),
    /// A load from a buffer (index into the program's declarations).
    Load {
        buffer: usize,
        index: Box<CompiledExpr>,
    },
    /// A buffer's element count.
    Length(usize),
    /// A typed binary operation.
    Binary {
        kind: BinaryKind,
        lhs: Box<CompiledExpr>,
        rhs: Box<CompiledExpr>,
    },
    /// A typed unary operation.
    Unary {
        kind: UnaryKind,
        operand: Box<CompiledExpr>,
    },
    /// Per-lane choice; all three are evaluated.
    Select {
        condition: Box<CompiledExpr>,
        if_true: Box<CompiledExpr>,
        if_false: Box<CompiledExpr>,
    },
    /// A typed conversion.
    Cast {
        kind: CastKind,
        value: Box<CompiledExpr>,
    },
    /// A per-lane builtin.
    Builtin(BuiltinTable),
    /// `workgroup_count` on axis 0..3 (the same for every lane).
    WorkgroupCount(usize),
    /// The dispatch's work so far (the same for every lane of one evaluation).
    Clock,
    /// A subgroup shuffle-xor.
    ShuffleXor {
        value: Box<CompiledExpr>,
        lane_mask: u32,
    },
    /// A subgroup reduction.
    SubgroupReduce {
        op: ReduceOp,
        value: Box<CompiledExpr>,
    },
    /// A subgroup prefix.
    SubgroupScan {
        op: ReduceOp,
        kind: ScanKind,
        value: Box<CompiledExpr>,
    },
}

/// A typed statement.
#[derive(Clone, Debug)]
pub(crate) enum CompiledNode {
    /// `let` or assignment: write the value into a slot.
    SetVariable { slot: usize, value: CompiledExpr },
    /// A store to a buffer.
    Store {
        buffer: usize,
        index: CompiledExpr,
        value: CompiledExpr,
    },
    /// Two-way branch; `leaves` says how lanes can leave either arm early.
    If {
        condition: CompiledExpr,
        then_body: Vec<CompiledNode>,
        else_body: Vec<CompiledNode>,
        leaves: Leaves,
    },
    /// Bounded loop over `start..end` with the counter in `slot`.
    Loop {
        slot: usize,
        start: CompiledExpr,
        end: CompiledExpr,
        body: Vec<CompiledNode>,
        body_leaves: Leaves,
    },
    /// Loop while `condition` holds.
    While {
        condition: CompiledExpr,
        body: Vec<CompiledNode>,
        body_leaves: Leaves,
    },
    /// Leave the innermost loop.
    Break,
    /// Go on with the innermost loop's next iteration.
    Continue,
    /// Workgroup barrier (a no-op in lockstep execution).
    Barrier,
    /// Grid sync (a no-op in lockstep execution).
    GridSync,
    /// Atomic read-modify-write; `slot` receives the previous value (a fetch or a
    /// compare-exchange), `expected` is a compare-exchange's.
    Atomic {
        kind: AtomicKind,
        buffer: usize,
        index: CompiledExpr,
        value: CompiledExpr,
        expected: Option<Box<CompiledExpr>>,
        slot: Option<usize>,
    },
    /// Workgroup reduction into a slot.
    WorkgroupReduce {
        slot: usize,
        op: ReduceOp,
        value: CompiledExpr,
    },
    /// Workgroup prefix into a slot.
    WorkgroupScan {
        slot: usize,
        op: ReduceOp,
        kind: ScanKind,
        value: CompiledExpr,
    },
    /// End the active lanes.
    Return,
}

/// How lanes can leave a block before its end; the executor drops such lanes from
/// the lists of the blocks around only when something inside can do it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Leaves {
    /// A lane can execute `Return` inside.
    pub(crate) returns: bool,
    /// A lane can execute `Break` or `Continue` of a loop around the block.
    pub(crate) loop_exits: bool,
}

impl Leaves {
    /// Either way.
    pub(crate) fn any(self) -> bool {
        self.returns || self.loop_exits
    }
}

/// A program ready for the executor.
#[derive(Debug)]
pub(crate) struct CompiledProgram {
    /// The entry body.
    pub(crate) body: Vec<CompiledNode>,
    /// How many variable slots are live at once, at most.
    pub(crate) slot_count: usize,
    /// Which of the nine per-lane builtin tables the body reads.
    pub(crate) builtins_used: [bool; 9],
    /// Most per-lane temporary vectors the executor holds at once on this body
    /// (see [`temporaries_of_block`]); with the slot count, what a run's memory
    /// check multiplies by the number of lanes.
    pub(crate) temporaries: usize,
    /// The program has 64-bit values (a `u64`/`i64` expression, variable or buffer
    /// element): the executor then keeps every lane value in a `u64`.
    pub(crate) wide: bool,
}

/// Bytes one compiled node or expression takes, at most (an upper bound used to
/// charge compilation against the memory budget).
pub(crate) const COMPILED_NODE_BYTES: u64 = 128;

// Compiled nodes sit inline in vectors and expressions in boxes: their own sizes are
// what the bound must cover.
const _: () = assert!(std::mem::size_of::<CompiledNode>() as u64 <= COMPILED_NODE_BYTES);
const _: () = assert!(std::mem::size_of::<CompiledExpr>() as u64 <= COMPILED_NODE_BYTES);

/// Most temporary vectors alive at once while evaluating `expr` (the executor's
/// `eval`: each node returns one vector; an operand evaluated while an earlier one is
/// held adds one).
fn temporaries_of_expr(expr: &CompiledExpr) -> usize {
    match expr {
        CompiledExpr::Constant(_)
        | CompiledExpr::Variable(_)
        | CompiledExpr::Length(_)
        | CompiledExpr::Builtin(_)
        | CompiledExpr::WorkgroupCount(_)
        | CompiledExpr::Clock => 1,
        CompiledExpr::Load { index: inner, .. }
        | CompiledExpr::Unary { operand: inner, .. }
        | CompiledExpr::Cast { value: inner, .. }
        | CompiledExpr::SubgroupReduce { value: inner, .. }
        | CompiledExpr::SubgroupScan { value: inner, .. } => temporaries_of_expr(inner),
        CompiledExpr::ShuffleXor { value, .. } => temporaries_of_expr(value).max(2),
        CompiledExpr::Binary { lhs, rhs, .. } => {
            temporaries_of_expr(lhs).max(1 + temporaries_of_expr(rhs))
        }
        CompiledExpr::Select {
            condition,
            if_true,
            if_false,
        } => temporaries_of_expr(condition)
            .max(1 + temporaries_of_expr(if_true))
            .max(2 + temporaries_of_expr(if_false)),
    }
}

/// Most temporary vectors alive at once while a block runs, not counting the lane
/// list the block was given (the executor's `node`, `run_loop`).
pub(crate) fn temporaries_of_block(block: &[CompiledNode]) -> usize {
    block
        .iter()
        .map(|node| match node {
            CompiledNode::SetVariable { value, .. }
            | CompiledNode::WorkgroupReduce { value, .. }
            | CompiledNode::WorkgroupScan { value, .. } => temporaries_of_expr(value),
            CompiledNode::Store { index, value, .. } => {
                temporaries_of_expr(index).max(1 + temporaries_of_expr(value))
            }
            // Indices, operands, expected values, then the previous values.
            CompiledNode::Atomic {
                index,
                value,
                expected,
                ..
            } => temporaries_of_expr(index)
                .max(1 + temporaries_of_expr(value))
                .max(2 + expected.as_deref().map_or(0, temporaries_of_expr))
                .max(4),
            // Condition, then the two lane lists; each arm runs with both lists held.
            CompiledNode::If {
                condition,
                then_body,
                else_body,
                ..
            } => temporaries_of_expr(condition)
                .max(3)
                .max(2 + temporaries_of_block(then_body))
                .max(2 + temporaries_of_block(else_body)),
            // Starts and ends, then loop lanes, counters, limits and the body's lanes.
            CompiledNode::Loop {
                start, end, body, ..
            } => temporaries_of_expr(start)
                .max(1 + temporaries_of_expr(end))
                .max(6 + temporaries_of_block(body)),
            // Loop lanes, then the condition; loop lanes and the body's lanes.
            CompiledNode::While {
                condition, body, ..
            } => (1 + temporaries_of_expr(condition))
                .max(3)
                .max(2 + temporaries_of_block(body)),
            CompiledNode::Barrier
            | CompiledNode::GridSync
            | CompiledNode::Return
            | CompiledNode::Break
            | CompiledNode::Continue => 0,
        })
        .max()
        .unwrap_or(0)
}

/// One variable in scope.
#[derive(Clone, Copy)]
struct VariableInfo {
    slot: usize,
    ty: ScalarType,
}

struct Compiler<'p> {
    program: &'p Program,
    /// The dispatch's value of each scalar, in declaration order (checked against
    /// the declarations by the caller).
    scalars: &'p [Literal],
    /// Nodes and expressions compiled so far, and the most allowed (from the memory
    /// budget): a program built from shared blocks can describe millions of nodes.
    compiled_nodes: u64,
    max_compiled_nodes: u64,
    buffer_index: HashMap<&'p str, usize>,
    variables: HashMap<Name, VariableInfo>,
    /// Names in scope, innermost last; a variable's slot is its position here.
    scope: Vec<Name>,
    slot_count: usize,
    builtins_used: [bool; 9],
    /// A 64-bit value was compiled.
    wide: bool,
}

/// Where [`nesting_depth`] stops counting (the validator refuses more than 256
/// levels, so a valid program never reaches it). Compilation and evaluation recurse
/// once per level, at up to ~5 KiB of stack per level in debug builds (measured:
/// 300 levels fit a 2 MiB thread inline, 400 do not).
pub(crate) const MAX_NESTING: usize = 512;

/// Programs nested at most this deep run on the caller's thread; deeper ones get a
/// thread with [`DEEP_STACK_BYTES`] of stack.
pub(crate) const INLINE_NESTING: usize = 64;

/// Stack of the thread that runs deeply nested programs (reserved, not touched).
pub(crate) const DEEP_STACK_BYTES: usize = 64 << 20;

/// The nesting depth of `program`'s body (statements and expressions), counted up to
/// `MAX_NESTING + 1` and no further, with a small stack frame per level so that
/// measuring cannot itself overflow.
pub(crate) fn nesting_depth(program: &Program) -> usize {
    fn block_depth(block: &[Node], depth: usize) -> usize {
        block
            .iter()
            .map(|node| node_depth(node, depth + 1))
            .max()
            .unwrap_or(depth)
    }
    fn node_depth(node: &Node, depth: usize) -> usize {
        if depth > MAX_NESTING {
            return depth;
        }
        match node {
            Node::AtomicLoad { index, .. } | Node::AcquireLoad { index, .. } => {
                expr_depth(index, depth + 1)
            }
            Node::Let { value, .. }
            | Node::Assign { value, .. }
            | Node::WorkgroupReduce { value, .. }
            | Node::WorkgroupScan { value, .. } => expr_depth(value, depth + 1),
            Node::Store { index, value, .. }
            | Node::Atomic { index, value, .. }
            | Node::AtomicFetch { index, value, .. } => {
                expr_depth(index, depth + 1).max(expr_depth(value, depth + 1))
            }
            Node::CompareExchange {
                index,
                expected,
                value,
                ..
            } => expr_depth(index, depth + 1)
                .max(expr_depth(expected, depth + 1))
                .max(expr_depth(value, depth + 1)),
            Node::If {
                condition,
                then_body,
                else_body,
            } => expr_depth(condition, depth + 1)
                .max(block_depth(then_body, depth))
                .max(block_depth(else_body, depth)),
            Node::Loop {
                start, end, body, ..
            } => expr_depth(start, depth + 1)
                .max(expr_depth(end, depth + 1))
                .max(block_depth(body, depth)),
            Node::While { condition, body } => {
                expr_depth(condition, depth + 1).max(block_depth(body, depth))
            }
            Node::Barrier
            | Node::GridSync
            | Node::Fence
            | Node::WorkgroupFence
            | Node::Return
            | Node::Break
            | Node::Continue => depth,
        }
    }
    fn expr_depth(expr: &Expr, depth: usize) -> usize {
        if depth > MAX_NESTING {
            return depth;
        }
        match expr {
            Expr::Literal(_)
            | Expr::Var(_)
            | Expr::Length { .. }
            | Expr::Scalar(_)
            | Expr::Builtin(_) => depth,
            Expr::Load { index: inner, .. }
            | Expr::Unary { operand: inner, .. }
            | Expr::Cast { value: inner, .. }
            | Expr::SubgroupShuffleXor { value: inner, .. }
            | Expr::SubgroupReduce { value: inner, .. }
            | Expr::SubgroupScan { value: inner, .. } => expr_depth(inner, depth + 1),
            Expr::Binary { lhs, rhs, .. } => {
                expr_depth(lhs, depth + 1).max(expr_depth(rhs, depth + 1))
            }
            Expr::Select {
                condition,
                if_true,
                if_false,
            } => expr_depth(condition, depth + 1)
                .max(expr_depth(if_true, depth + 1))
                .max(expr_depth(if_false, depth + 1)),
        }
    }
    block_depth(program.entry(), 0)
}

/// Compile `program` into at most `max_memory_bytes` of compiled nodes; every failure
/// is a message starting `Fix:`.
pub(crate) fn compile(
    program: &Program,
    scalars: &[Literal],
    max_memory_bytes: u64,
) -> Result<CompiledProgram, String> {
    // Validated: buffer names are unique.
    let buffer_index = program
        .buffers()
        .iter()
        .enumerate()
        .map(|(position, decl)| (&*decl.name, position))
        .collect();
    let mut compiler = Compiler {
        program,
        scalars,
        compiled_nodes: 0,
        max_compiled_nodes: max_memory_bytes / COMPILED_NODE_BYTES,
        buffer_index,
        variables: HashMap::new(),
        scope: Vec::new(),
        slot_count: 0,
        builtins_used: [false; 9],
        wide: program
            .buffers()
            .iter()
            .any(|decl| decl.elem.value_type().is_wide()),
    };
    let body = compiler.block(program.entry())?;
    let temporaries = 1 + temporaries_of_block(&body);
    Ok(CompiledProgram {
        body,
        slot_count: compiler.slot_count,
        builtins_used: compiler.builtins_used,
        temporaries,
        wide: compiler.wide,
    })
}

/// How lanes can leave this block early: a `Return` anywhere inside, a `Break` or
/// `Continue` not inside a loop of its own.
fn block_leaves(block: &[CompiledNode]) -> Leaves {
    block.iter().fold(Leaves::default(), |leaves, node| {
        let node_leaves = match node {
            CompiledNode::Return => Leaves {
                returns: true,
                loop_exits: false,
            },
            CompiledNode::Break | CompiledNode::Continue => Leaves {
                returns: false,
                loop_exits: true,
            },
            CompiledNode::If { leaves, .. } => *leaves,
            CompiledNode::Loop { body_leaves, .. } | CompiledNode::While { body_leaves, .. } => {
                Leaves {
                    returns: body_leaves.returns,
                    loop_exits: false,
                }
            }
            _ => Leaves::default(),
        };
        Leaves {
            returns: leaves.returns || node_leaves.returns,
            loop_exits: leaves.loop_exits || node_leaves.loop_exits,
        }
    })
}

impl<'p> Compiler<'p> {
    fn name(&self) -> String {
        self.program.display_name()
    }

    fn block(&mut self, nodes: &[Node]) -> Result<Vec<CompiledNode>, String> {
        let scope_depth = self.scope.len();
        let result = nodes.iter().map(|node| self.node(node)).collect();
        for name in self.scope.drain(scope_depth..) {
            self.variables.remove(&name);
        }
        result
    }

    /// Validated: no name shadows another in scope, so a slot is the scope depth.
    fn declare(&mut self, name: &Name, ty: ScalarType) -> usize {
        let slot = self.scope.len();
        self.scope.push(name.clone());
        self.slot_count = self.slot_count.max(self.scope.len());
        self.variables
            .insert(name.clone(), VariableInfo { slot, ty });
        slot
    }

    fn buffer(&self, name: &str) -> Result<(usize, &'p BufferDecl), String> {
        match self.buffer_index.get(name) {
            Some(&index) => Ok((index, &self.program.buffers()[index])),
            None => Err(internal(
                &self.name(),
                format_args!("buffer '{name}' has no slot"),
            )),
        }
    }

    fn enter(&mut self) -> Result<(), String> {
        self.compiled_nodes += 1;
        if self.compiled_nodes > self.max_compiled_nodes {
            return Err(format!(
                "Fix: {} compiles to more than {} nodes ({} bytes each), over ReferenceOptions::max_memory_bytes; split the program, stop sharing one block in many places, or raise the budget.",
                self.name(),
                self.max_compiled_nodes,
                COMPILED_NODE_BYTES
            ));
        }
        Ok(())
    }

    fn node(&mut self, node: &Node) -> Result<CompiledNode, String> {
        self.enter()?;
        self.node_inner(node)
    }

    fn expr(&mut self, expr: &Expr) -> Result<(CompiledExpr, ScalarType), String> {
        self.enter()?;
        let (compiled, ty) = self.expr_inner(expr)?;
        self.wide |= ty.is_wide();
        Ok((compiled, ty))
    }

    fn variable(&self, name: &Name) -> Result<VariableInfo, String> {
        self.variables
            .get(name)
            .copied()
            .ok_or_else(|| internal(&self.name(), format_args!("variable '{name}' has no slot")))
    }

    fn node_inner(&mut self, node: &Node) -> Result<CompiledNode, String> {
        // Validated: every type below matches, every assignment target is mutable and
        // every store targets a writable buffer.
        Ok(match node {
            Node::Let { name, value, .. } => {
                let (value, ty) = self.expr(value)?;
                let slot = self.declare(name, ty);
                CompiledNode::SetVariable { slot, value }
            }
            Node::Assign { name, value } => {
                let info = self.variable(name)?;
                let (value, _) = self.expr(value)?;
                CompiledNode::SetVariable {
                    slot: info.slot,
                    value,
                }
            }
            Node::Store {
                buffer,
                index,
                value,
            } => {
                let (buffer, _) = self.buffer(buffer)?;
                let (index, _) = self.expr(index)?;
                let (value, _) = self.expr(value)?;
                CompiledNode::Store {
                    buffer,
                    index,
                    value,
                }
            }
            Node::If {
                condition,
                then_body,
                else_body,
            } => {
                let (condition, _) = self.expr(condition)?;
                let then_body = self.block(then_body)?;
                let else_body = self.block(else_body)?;
                let (then_leaves, else_leaves) =
                    (block_leaves(&then_body), block_leaves(&else_body));
                let leaves = Leaves {
                    returns: then_leaves.returns || else_leaves.returns,
                    loop_exits: then_leaves.loop_exits || else_leaves.loop_exits,
                };
                CompiledNode::If {
                    condition,
                    then_body,
                    else_body,
                    leaves,
                }
            }
            Node::Loop {
                variable,
                start,
                end,
                body,
            } => {
                let (start, _) = self.expr(start)?;
                let (end, _) = self.expr(end)?;
                // The loop variable lives in its own scope around the body.
                let scope_depth = self.scope.len();
                let slot = self.declare(variable, ScalarType::U32);
                let body = self.block(body);
                for name in self.scope.drain(scope_depth..) {
                    self.variables.remove(&name);
                }
                let body = body?;
                let body_leaves = block_leaves(&body);
                CompiledNode::Loop {
                    slot,
                    start,
                    end,
                    body,
                    body_leaves,
                }
            }
            Node::While { condition, body } => {
                let (condition, _) = self.expr(condition)?;
                let body = self.block(body)?;
                let body_leaves = block_leaves(&body);
                CompiledNode::While {
                    condition,
                    body,
                    body_leaves,
                }
            }
            Node::Break => CompiledNode::Break,
            Node::Continue => CompiledNode::Continue,
            Node::Barrier => CompiledNode::Barrier,
            Node::GridSync => CompiledNode::GridSync,
            // Lockstep: every earlier effect is already visible to every later
            // statement, so a fence has nothing to order (a no-op, as a barrier is).
            Node::Fence | Node::WorkgroupFence => CompiledNode::Barrier,
            Node::Atomic {
                op,
                buffer,
                index,
                value,
            } => self.atomic(Some(*op), buffer, index, None, value, None)?,
            Node::AtomicFetch {
                name,
                op,
                buffer,
                index,
                value,
            } => self.atomic(Some(*op), buffer, index, None, value, Some(name))?,
            Node::CompareExchange {
                name,
                buffer,
                index,
                expected,
                value,
            } => self.atomic(None, buffer, index, Some(expected), value, Some(name))?,
            // An atomic or of 0: the element's value, nothing changed. An acquire
            // load reads the same: the run starts after the host wrote everything.
            Node::AtomicLoad {
                name,
                buffer,
                index,
            }
            | Node::AcquireLoad {
                name,
                buffer,
                index,
            } => {
                let zero = match self.buffer(buffer)?.1.elem.value_type() {
                    ScalarType::I32 => Expr::Literal(Literal::I32(0)),
                    ScalarType::U64 => Expr::Literal(Literal::U64(0)),
                    ScalarType::I64 => Expr::Literal(Literal::I64(0)),
                    _ => Expr::Literal(Literal::U32(0)),
                };
                self.atomic(Some(AtomicOp::Or), buffer, index, None, &zero, Some(name))?
            }
            Node::WorkgroupReduce { name, op, value } => {
                let (value, _) = self.expr(value)?;
                let slot = self.declare(name, ScalarType::U32);
                CompiledNode::WorkgroupReduce {
                    slot,
                    op: *op,
                    value,
                }
            }
            Node::WorkgroupScan {
                name,
                op,
                kind,
                value,
            } => {
                let (value, _) = self.expr(value)?;
                let slot = self.declare(name, ScalarType::U32);
                CompiledNode::WorkgroupScan {
                    slot,
                    op: *op,
                    kind: *kind,
                    value,
                }
            }
            Node::Return => CompiledNode::Return,
        })
    }

    fn expr_inner(&mut self, expr: &Expr) -> Result<(CompiledExpr, ScalarType), String> {
        Ok(match expr {
            Expr::Literal(literal) => (CompiledExpr::Constant(literal.bits()), literal.ty()),
            Expr::Var(name) => {
                let info = self.variable(name)?;
                (CompiledExpr::Variable(info.slot), info.ty)
            }
            Expr::Load { buffer, index } => {
                let (buffer_index, decl) = self.buffer(buffer)?;
                let (index, _) = self.expr(index)?;
                (
                    CompiledExpr::Load {
                        buffer: buffer_index,
                        index: Box::new(index),
                    },
                    decl.elem.value_type(),
                )
            }
            Expr::Length { buffer } => {
                let (buffer_index, _) = self.buffer(buffer)?;
                (CompiledExpr::Length(buffer_index), ScalarType::U32)
            }
            // A scalar is one value for the whole run: its bits become a constant, so
            // the executor treats it exactly as a literal of its type.
            Expr::Scalar(name) => {
                let value = self
                    .program
                    .scalar(name)
                    .and_then(|(position, _)| self.scalars.get(position))
                    .ok_or_else(|| {
                        internal(&self.name(), format_args!("scalar '{name}' has no value"))
                    })?;
                (CompiledExpr::Constant(value.bits()), value.ty())
            }
            Expr::Binary { op, lhs, rhs } => {
                let (lhs, lhs_ty) = self.expr(lhs)?;
                let (rhs, rhs_ty) = self.expr(rhs)?;
                let (kind, ty) = self.binary_kind(*op, lhs_ty, rhs_ty)?;
                (
                    CompiledExpr::Binary {
                        kind,
                        lhs: Box::new(lhs),
                        rhs: Box::new(rhs),
                    },
                    ty,
                )
            }
            Expr::Unary { op, operand } => {
                let (operand, ty) = self.expr(operand)?;
                let (kind, result) = self.unary_kind(*op, ty)?;
                (
                    CompiledExpr::Unary {
                        kind,
                        operand: Box::new(operand),
                    },
                    result,
                )
            }
            Expr::Select {
                condition,
                if_true,
                if_false,
            } => {
                let (condition, _) = self.expr(condition)?;
                let (if_true, ty) = self.expr(if_true)?;
                let (if_false, _) = self.expr(if_false)?;
                (
                    CompiledExpr::Select {
                        condition: Box::new(condition),
                        if_true: Box::new(if_true),
                        if_false: Box::new(if_false),
                    },
                    ty,
                )
            }
            Expr::Cast { to, value } => {
                let (value, from) = self.expr(value)?;
                let kind = cast_kind(from, *to);
                (
                    CompiledExpr::Cast {
                        kind,
                        value: Box::new(value),
                    },
                    *to,
                )
            }
            Expr::Builtin(builtin) => {
                let compiled = match *builtin {
                    Builtin::GlobalId(axis) => {
                        CompiledExpr::Builtin(BuiltinTable::Global(axis.index()))
                    }
                    Builtin::LocalId(axis) => {
                        CompiledExpr::Builtin(BuiltinTable::Local(axis.index()))
                    }
                    Builtin::WorkgroupId(axis) => {
                        CompiledExpr::Builtin(BuiltinTable::Workgroup(axis.index()))
                    }
                    Builtin::WorkgroupCount(axis) => CompiledExpr::WorkgroupCount(axis.index()),
                    Builtin::Clock => CompiledExpr::Clock,
                };
                if let CompiledExpr::Builtin(table) = compiled {
                    self.builtins_used[table.table_index()] = true;
                }
                (compiled, builtin.ty())
            }
            Expr::SubgroupShuffleXor { value, lane_mask } => {
                let (value, _) = self.expr(value)?;
                (
                    CompiledExpr::ShuffleXor {
                        value: Box::new(value),
                        lane_mask: *lane_mask,
                    },
                    ScalarType::U32,
                )
            }
            Expr::SubgroupReduce { op, value } => {
                let (value, _) = self.expr(value)?;
                (
                    CompiledExpr::SubgroupReduce {
                        op: *op,
                        value: Box::new(value),
                    },
                    ScalarType::U32,
                )
            }
            Expr::SubgroupScan { op, kind, value } => {
                let (value, _) = self.expr(value)?;
                (
                    CompiledExpr::SubgroupScan {
                        op: *op,
                        kind: *kind,
                        value: Box::new(value),
                    },
                    ScalarType::U32,
                )
            }
        })
    }

    /// Any atomic: `op`, or a compare-exchange when `None`. Validated: an integer
    /// read-write or workgroup buffer and operands of its value type.
    fn atomic(
        &mut self,
        op: Option<AtomicOp>,
        buffer: &Name,
        index: &Expr,
        expected: Option<&Expr>,
        value: &Expr,
        result: Option<&Name>,
    ) -> Result<CompiledNode, String> {
        let (buffer, decl) = self.buffer(buffer)?;
        let kind = match op {
            Some(op) => atomic_kind(op, decl.elem),
            None => AtomicKind::CompareExchange,
        };
        let (index, _) = self.expr(index)?;
        let expected = match expected {
            Some(expected) => Some(Box::new(self.expr(expected)?.0)),
            None => None,
        };
        let (value, ty) = self.expr(value)?;
        let slot = result.map(|name| self.declare(name, ty));
        Ok(CompiledNode::Atomic {
            kind,
            buffer,
            index,
            value,
            expected,
            slot,
        })
    }

    fn binary_kind(
        &self,
        op: BinaryOp,
        lhs: ScalarType,
        rhs: ScalarType,
    ) -> Result<(BinaryKind, ScalarType), String> {
        use BinaryKind as K;
        use ScalarType::{Bool, F32, I32, I64, U32, U64};
        // Validated: the operand types fit the operator; what does not is a bug.
        let mismatch = || {
            Err(internal(
                &self.name(),
                format_args!(
                    "operator '{}' on {} and {} has no kind",
                    op.symbol(),
                    lhs.name(),
                    rhs.name()
                ),
            ))
        };
        if matches!(op, BinaryOp::Shl | BinaryOp::Shr) {
            return match (op, lhs, rhs) {
                (BinaryOp::Shl, U32 | I32, U32) => Ok((K::Shl, lhs)),
                (BinaryOp::Shr, U32, U32) => Ok((K::U32Shr, U32)),
                (BinaryOp::Shr, I32, U32) => Ok((K::I32Shr, I32)),
                (BinaryOp::Shl, U64 | I64, U32) => Ok((K::Shl64, lhs)),
                (BinaryOp::Shr, U64, U32) => Ok((K::U64Shr, U64)),
                (BinaryOp::Shr, I64, U32) => Ok((K::I64Shr, I64)),
                _ => mismatch(),
            };
        }
        if op == BinaryOp::PermuteBytes {
            return match (lhs, rhs) {
                (U64, U32) => Ok((K::PermuteBytes, U32)),
                _ => mismatch(),
            };
        }
        if lhs != rhs {
            return mismatch();
        }
        let ty = lhs;
        let kind = match (op, ty) {
            (BinaryOp::Add, U32 | I32) => K::IntAdd,
            (BinaryOp::Sub, U32 | I32) => K::IntSub,
            (BinaryOp::Mul, U32 | I32) => K::IntMul,
            (BinaryOp::Div, U32) => K::U32Div,
            (BinaryOp::Div, I32) => K::I32Div,
            (BinaryOp::Rem, U32) => K::U32Rem,
            (BinaryOp::Rem, I32) => K::I32Rem,
            (BinaryOp::Add, U64 | I64) => K::Int64Add,
            (BinaryOp::Sub, U64 | I64) => K::Int64Sub,
            (BinaryOp::Mul, U64 | I64) => K::Int64Mul,
            (BinaryOp::Div, U64) => K::U64Div,
            (BinaryOp::Div, I64) => K::I64Div,
            (BinaryOp::Rem, U64) => K::U64Rem,
            (BinaryOp::Rem, I64) => K::I64Rem,
            (BinaryOp::Add, F32) => K::F32Add,
            (BinaryOp::Sub, F32) => K::F32Sub,
            (BinaryOp::Mul, F32) => K::F32Mul,
            (BinaryOp::Div, F32) => K::F32Div,
            (BinaryOp::BitAnd, U32 | I32 | U64 | I64 | Bool) => K::BitAnd,
            (BinaryOp::BitOr, U32 | I32 | U64 | I64 | Bool) => K::BitOr,
            (BinaryOp::BitXor, U32 | I32 | U64 | I64 | Bool) => K::BitXor,
            (BinaryOp::Eq, U32 | I32 | U64 | I64 | Bool) => K::BitsEq,
            (BinaryOp::Ne, U32 | I32 | U64 | I64 | Bool) => K::BitsNe,
            (BinaryOp::Eq, F32) => K::F32Eq,
            (BinaryOp::Ne, F32) => K::F32Ne,
            (BinaryOp::Lt, U32 | U64) => K::UnsignedLt,
            (BinaryOp::Le, U32 | U64) => K::UnsignedLe,
            (BinaryOp::Gt, U32 | U64) => K::UnsignedGt,
            (BinaryOp::Ge, U32 | U64) => K::UnsignedGe,
            (BinaryOp::Lt, I32) => K::I32Lt,
            (BinaryOp::Le, I32) => K::I32Le,
            (BinaryOp::Gt, I32) => K::I32Gt,
            (BinaryOp::Ge, I32) => K::I32Ge,
            (BinaryOp::Lt, I64) => K::I64Lt,
            (BinaryOp::Le, I64) => K::I64Le,
            (BinaryOp::Gt, I64) => K::I64Gt,
            (BinaryOp::Ge, I64) => K::I64Ge,
            (BinaryOp::Lt, F32) => K::F32Lt,
            (BinaryOp::Le, F32) => K::F32Le,
            (BinaryOp::Gt, F32) => K::F32Gt,
            (BinaryOp::Ge, F32) => K::F32Ge,
            (BinaryOp::Min, U32 | U64) => K::UnsignedMin,
            (BinaryOp::Max, U32 | U64) => K::UnsignedMax,
            (BinaryOp::Min, I32) => K::I32Min,
            (BinaryOp::Max, I32) => K::I32Max,
            (BinaryOp::Min, I64) => K::I64Min,
            (BinaryOp::Max, I64) => K::I64Max,
            (BinaryOp::Min, F32) => K::F32Min,
            (BinaryOp::Max, F32) => K::F32Max,
            (BinaryOp::LogicalAnd, Bool) => K::LogicalAnd,
            (BinaryOp::LogicalOr, Bool) => K::LogicalOr,
            _ => return mismatch(),
        };
        let result = if op.is_comparison() { Bool } else { ty };
        Ok((kind, result))
    }

    fn unary_kind(&self, op: UnaryOp, ty: ScalarType) -> Result<(UnaryKind, ScalarType), String> {
        use ScalarType::{Bool, F32, I32, I64, U32, U64};
        use UnaryKind as K;
        let (kind, result) = match (op, ty) {
            (UnaryOp::Neg, I32) => (K::IntNeg, I32),
            (UnaryOp::Neg, I64) => (K::Int64Neg, I64),
            (UnaryOp::Neg, F32) => (K::F32Neg, F32),
            (UnaryOp::BitNot, U32 | I32) => (K::BitNot, ty),
            (UnaryOp::BitNot, U64 | I64) => (K::BitNot64, ty),
            (UnaryOp::LogicalNot, Bool) => (K::LogicalNot, Bool),
            (UnaryOp::Abs, I32) => (K::I32Abs, I32),
            (UnaryOp::Abs, I64) => (K::I64Abs, I64),
            (UnaryOp::Abs, F32) => (K::F32Abs, F32),
            (UnaryOp::CountOnes, U32 | I32 | U64 | I64) => (K::CountOnes, U32),
            (UnaryOp::LeadingZeros, U32 | I32) => (K::LeadingZeros, U32),
            (UnaryOp::LeadingZeros, U64 | I64) => (K::LeadingZeros64, U32),
            _ => {
                return Err(internal(
                    &self.name(),
                    format_args!("operator '{}' on {} has no kind", op.symbol(), ty.name()),
                ))
            }
        };
        Ok((kind, result))
    }
}

/// The atomic operation `op` on an element of type `elem` (min and max are signed
/// for `i32` and `i64`).
fn atomic_kind(op: AtomicOp, elem: ElemType) -> AtomicKind {
    let signed = matches!(elem, ElemType::I32 | ElemType::I64);
    let wide = matches!(elem, ElemType::U64 | ElemType::I64);
    match op {
        AtomicOp::Add => AtomicKind::Add,
        AtomicOp::Sub => AtomicKind::Sub,
        AtomicOp::Min if !signed => AtomicKind::UnsignedMin,
        AtomicOp::Max if !signed => AtomicKind::UnsignedMax,
        AtomicOp::Min if wide => AtomicKind::I64Min,
        AtomicOp::Max if wide => AtomicKind::I64Max,
        AtomicOp::Min => AtomicKind::I32Min,
        AtomicOp::Max => AtomicKind::I32Max,
        AtomicOp::And => AtomicKind::And,
        AtomicOp::Or => AtomicKind::Or,
        AtomicOp::Xor => AtomicKind::Xor,
        AtomicOp::Exchange => AtomicKind::Exchange,
    }
}

/// An inconsistency between the validator and this pass: a bug, never bad input.
fn internal(program: &str, detail: std::fmt::Arguments<'_>) -> String {
    format!(
        "Fix: report {program} to vyre-cuda as a bug: the validator accepted it but the reference interpreter cannot run it ({detail})."
    )
}

/// The conversion from `from` to `to` (every pair is defined).
fn cast_kind(from: ScalarType, to: ScalarType) -> CastKind {
    use ScalarType::{Bool, F32, I32, I64, U32, U64};
    match (from, to) {
        (F32, F32) => CastKind::Bits,
        // Zero-extended patterns: u32/bool to any integer, and within one width.
        (U32 | I32 | Bool, U32 | I32) | (Bool, Bool) => CastKind::Bits,
        (U32 | Bool | U64 | I64, U64 | I64) => CastKind::Bits,
        (I32, U64 | I64) => CastKind::SignExtend,
        (U64 | I64, U32 | I32) => CastKind::Truncate,
        (U32 | I32 | U64 | I64, Bool) => CastKind::IntToBool,
        (F32, Bool) => CastKind::F32ToBool,
        (Bool, F32) => CastKind::BoolToF32,
        (U32, F32) => CastKind::U32ToF32,
        (I32, F32) => CastKind::I32ToF32,
        (U64, F32) => CastKind::U64ToF32,
        (I64, F32) => CastKind::I64ToF32,
        (F32, U32) => CastKind::F32ToU32,
        (F32, I32) => CastKind::F32ToI32,
        (F32, U64) => CastKind::F32ToU64,
        (F32, I64) => CastKind::F32ToI64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DispatchConfig;
    use crate::ir::validate::Rule;
    use crate::ir::{Access, Axis, BufferCount, ElemType};

    fn base() -> crate::ir::ProgramBuilder {
        Program::builder([1, 1, 1])
            .entry_op_id("probe")
            .buffer(
                "ro",
                0,
                Access::ReadOnly,
                ElemType::U32,
                BufferCount::Static(1),
            )
            .buffer(
                "rw",
                1,
                Access::ReadWrite,
                ElemType::F32,
                BufferCount::Static(1),
            )
    }

    /// The rule a run of `program` reports, its message checked to be the validator's.
    fn message(program: Program) -> Rule {
        let error =
            crate::reference::run(&program, &[&[0; 4], &[0; 4]], &DispatchConfig::linear(1))
                .expect_err("must be rejected")
                .to_string();
        let validator = crate::ir::validate(&program, &crate::ir::Limits::default())
            .expect_err("the validator rejects it");
        assert_eq!(error, validator.message());
        validator.rule()
    }

    /// Locks out the interpreter running (and the compile pass then misreading)
    /// programs the validator rejects: the compile pass no longer re-checks, so a run
    /// must answer every such program with the validator's error before compiling.
    #[test]
    fn runs_refuse_what_the_validator_refuses_with_its_message() {
        let m = message(
            base()
                .body(|b| {
                    b.store("rw", 0u32, Expr::var("ghost"));
                })
                .build(),
        );
        assert_eq!(m, Rule::UnknownVariable);
        let m = message(
            base()
                .body(|b| {
                    b.store("nowhere", 0u32, 1.0f32);
                })
                .build(),
        );
        assert_eq!(m, Rule::UnknownBuffer);
        let m = message(
            base()
                .body(|b| {
                    b.store("rw", 0u32, 1u32);
                })
                .build(),
        );
        assert_eq!(m, Rule::TypeMismatch);
        let m = message(
            base()
                .body(|b| {
                    b.store("ro", 0u32, 1u32);
                })
                .build(),
        );
        assert_eq!(m, Rule::StoreToReadOnly);
        let m = message(
            base()
                .body(|b| {
                    b.let_("x", 1u32);
                    b.assign("x", 2u32);
                })
                .build(),
        );
        assert_eq!(m, Rule::AssignToImmutable);
        let m = message(
            base()
                .body(|b| {
                    b.let_("x", Expr::u32(1) + Expr::i32(1));
                })
                .build(),
        );
        assert_eq!(m, Rule::TypeMismatch);
        let m = message(
            base()
                .body(|b| {
                    b.let_("x", Expr::bool(true).abs());
                })
                .build(),
        );
        assert_eq!(m, Rule::TypeMismatch);
        let m = message(
            base()
                .body(|b| {
                    b.if_(1u32, |_| {});
                })
                .build(),
        );
        assert_eq!(m, Rule::TypeMismatch);
        let m = message(
            base()
                .body(|b| {
                    b.atomic(AtomicOp::Add, "rw", 0u32, 1u32);
                })
                .build(),
        );
        assert_eq!(m, Rule::AtomicBuffer);
        let m = message(
            base()
                .body(|b| {
                    b.let_("x", 1u32);
                    b.if_(true, |b| {
                        b.let_("x", 2u32);
                    });
                })
                .build(),
        );
        assert_eq!(m, Rule::DuplicateVariable);
        let m = message(
            base()
                .buffer(
                    "ro",
                    7,
                    Access::ReadOnly,
                    ElemType::U32,
                    BufferCount::Static(1),
                )
                .build(),
        );
        assert_eq!(m, Rule::DuplicateBufferName);
        let m = message(
            base()
                .buffer(
                    "other",
                    1,
                    Access::ReadOnly,
                    ElemType::U32,
                    BufferCount::Static(1),
                )
                .build(),
        );
        assert_eq!(m, Rule::BindingCollision);
        // Negative control: a well-typed program compiles.
        let program = base()
            .body(|b| {
                let x = b.let_("x", Expr::load("ro", 0u32).cast(ScalarType::F32));
                b.store("rw", Expr::global_id(Axis::X), x);
            })
            .build();
        assert!(
            crate::reference::run(&program, &[&[0; 4], &[0; 4]], &DispatchConfig::linear(1))
                .is_ok()
        );
    }

    /// Locks out slots shared between variables that are live at the same time,
    /// while proving siblings reuse slots (storage grows with nesting, not lets).
    #[test]
    fn sibling_scopes_reuse_slots_and_nested_ones_do_not() {
        let program = base()
            .body(|b| {
                b.let_("a", 1u32);
                b.if_(true, |b| {
                    b.let_("b", 2u32);
                    b.let_("c", 3u32);
                });
                b.if_(true, |b| {
                    b.let_("d", 4u32);
                });
                b.let_("e", 5u32);
            })
            .build();
        let compiled = compile(&program, &[], u64::MAX).unwrap();
        assert_eq!(compiled.slot_count, 3);
        let slots: Vec<usize> = compiled
            .body
            .iter()
            .filter_map(|node| match node {
                CompiledNode::SetVariable { slot, .. } => Some(*slot),
                _ => None,
            })
            .collect();
        assert_eq!(slots, [0, 1]);
    }
}
