//! `Clone`, `Drop`, `PartialEq`, `Hash` and `Debug` for [`Expr`] and [`Node`], and the
//! node count: every walk here is iterative (an explicit stack on the heap) or
//! bounded, so no value a caller can build crashes the process.
//!
//! Why it exists: the derived implementations recurse once per nesting level, and
//! a hostile test measured them overflowing a 2 MiB worker-thread stack at 18.7k (`==`,
//! `Clone`), 32k (`Hash`), 44k (`node_count`) and even 21.6k levels (`Drop`: merely
//! letting a deep program go out of scope aborted the process). A program whose
//! blocks share `Arc`s (`b = [If { then: b, else: b }]` 64 times) describes a tree of
//! 2⁶⁴ nodes in a few kilobytes; the derived walks never finished on it. Here:
//! - `Drop` detaches children into a work list, so dropping never recurses deeper
//!   than one level, whatever the shape.
//! - `Clone` of an expression builds the copy top-down from a work list (a `Node`'s
//!   blocks are shared `Arc`s, so cloning a node copies only its expressions).
//! - `==` walks pairs from a work list; two blocks that are one allocation are equal
//!   without a walk, and a pair of shared blocks is compared at most once.
//! - `Hash` hashes a bounded pre-order prefix ([`HASH_ITEM_BUDGET`] items): equal
//!   values walk identical prefixes, so it agrees with `==`, and costs O(1).
//! - `Debug` is the bounded `Display` form (one printer, `display.rs`).
//! - The node count walks each shared block once (a memo by allocation) and
//!   saturates instead of overflowing.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use smallvec::SmallVec;

use super::program::*;

/// A leaf that stands in for a child moved out during `Drop` and `Clone`.
const PLACEHOLDER: Expr = Expr::Literal(Literal::Bool(false));

/// Most expressions plus nodes one `Hash` call feeds to the hasher.
pub const HASH_ITEM_BUDGET: usize = 64;

/// The direct subexpressions of an expression, left to right.
pub(crate) fn expr_children(expr: &Expr) -> [Option<&Expr>; 3] {
    match expr {
        Expr::Literal(_)
        | Expr::Var(_)
        | Expr::Length { .. }
        | Expr::Scalar(_)
        | Expr::Builtin(_) => [None, None, None],
        Expr::Load { index, .. } => [Some(index), None, None],
        Expr::Binary { lhs, rhs, .. } => [Some(lhs), Some(rhs), None],
        Expr::Unary { operand, .. } => [Some(operand), None, None],
        Expr::Select {
            condition,
            if_true,
            if_false,
        } => [Some(condition), Some(if_true), Some(if_false)],
        Expr::Cast { value, .. }
        | Expr::SubgroupShuffleXor { value, .. }
        | Expr::SubgroupReduce { value, .. }
        | Expr::SubgroupScan { value, .. } => [Some(value), None, None],
    }
}

fn expr_children_mut(expr: &mut Expr) -> [Option<&mut Box<Expr>>; 3] {
    match expr {
        Expr::Literal(_)
        | Expr::Var(_)
        | Expr::Length { .. }
        | Expr::Scalar(_)
        | Expr::Builtin(_) => [None, None, None],
        Expr::Load { index, .. } => [Some(index), None, None],
        Expr::Binary { lhs, rhs, .. } => [Some(lhs), Some(rhs), None],
        Expr::Unary { operand, .. } => [Some(operand), None, None],
        Expr::Select {
            condition,
            if_true,
            if_false,
        } => [Some(condition), Some(if_true), Some(if_false)],
        Expr::Cast { value, .. }
        | Expr::SubgroupShuffleXor { value, .. }
        | Expr::SubgroupReduce { value, .. }
        | Expr::SubgroupScan { value, .. } => [Some(value), None, None],
    }
}

/// The expressions of a node, in evaluation order.
pub(crate) fn node_exprs(node: &Node) -> [Option<&Expr>; 3] {
    match node {
        Node::Let { value, .. } | Node::Assign { value, .. } => [Some(value), None, None],
        Node::Store { index, value, .. }
        | Node::Atomic { index, value, .. }
        | Node::AtomicFetch { index, value, .. } => [Some(index), Some(value), None],
        Node::CompareExchange {
            index,
            expected,
            value,
            ..
        } => [Some(index), Some(expected), Some(value)],
        Node::AtomicLoad { index, .. } | Node::AcquireLoad { index, .. } => {
            [Some(index), None, None]
        }
        Node::If { condition, .. } | Node::While { condition, .. } => [Some(condition), None, None],
        Node::Loop { start, end, .. } => [Some(start), Some(end), None],
        Node::WorkgroupReduce { value, .. } | Node::WorkgroupScan { value, .. } => {
            [Some(value), None, None]
        }
        Node::Barrier
        | Node::GridSync
        | Node::Fence
        | Node::WorkgroupFence
        | Node::Return
        | Node::Break
        | Node::Continue => [None, None, None],
    }
}

/// The blocks nested directly in a node, in program order.
pub(crate) fn node_blocks(node: &Node) -> [Option<&Block>; 2] {
    match node {
        Node::If {
            then_body,
            else_body,
            ..
        } => [Some(then_body), Some(else_body)],
        Node::Loop { body, .. } | Node::While { body, .. } => [Some(body), None],
        _ => [None, None],
    }
}

fn node_blocks_mut(node: &mut Node) -> [Option<&mut Block>; 2] {
    match node {
        Node::If {
            then_body,
            else_body,
            ..
        } => [Some(then_body), Some(else_body)],
        Node::Loop { body, .. } | Node::While { body, .. } => [Some(body), None],
        _ => [None, None],
    }
}

// ---- rebuild from mapped parts -------------------------------------------------------

/// A rebuild of nodes and expressions from mapped parts: the hooks that
/// [`Node::map_parts`] and [`Expr::map_children`] call for each part, so a rewrite
/// (renaming buffers, replacing builtins, mutating a program) states only what it
/// changes, and a new variant is added to the IR's one rebuild rather than to every
/// rewrite.
///
/// Every hook has a default, and the defaults rebuild all the way down: a rebuild that
/// overrides only [`buffer`](Rebuild::buffer) renames the buffer of every store,
/// atomic, load and length at any depth. A hook that overrides
/// [`expr`](Rebuild::expr), [`node`](Rebuild::node) or [`block`](Rebuild::block)
/// continues the walk itself, usually by calling [`Expr::map_children`] or
/// [`Node::map_parts`] on the part it keeps.
///
/// The walk recurses through the hooks, one native stack frame or more per level of
/// nesting, unlike the IR's own walks (equality, `Clone`, `Drop`, the digest, the node
/// count), which are iterative because a hostile program nests 20k levels and more: rebuild only programs built in-process or already validated (nested at most
/// [`MAX_NESTING_DEPTH`](crate::ir::validate::MAX_NESTING_DEPTH) levels), never an
/// untrusted program before validation. A block shared between several places (one
/// `Arc`) is rebuilt once per place.
///
/// ```
/// use std::convert::Infallible;
/// use vyre_cuda::ir::{Expr, Name, Node, Rebuild};
///
/// /// Every buffer `a` becomes `b`.
/// struct Rename;
/// impl Rebuild for Rename {
///     type Error = Infallible;
///     fn buffer(&mut self, buffer: &Name) -> Name {
///         if &**buffer == "a" {
///             "b".into()
///         } else {
///             buffer.clone()
///         }
///     }
/// }
///
/// let store = Node::Store {
///     buffer: "a".into(),
///     index: Expr::u32(0),
///     value: Expr::load("a", Expr::u32(1)),
/// };
/// let Ok(renamed) = Rename.node(&store);
/// assert_eq!(
///     renamed,
///     Node::Store {
///         buffer: "b".into(),
///         index: Expr::u32(0),
///         value: Expr::load("b", Expr::u32(1)),
///     }
/// );
/// ```
pub trait Rebuild {
    /// What a hook may fail with ([`std::convert::Infallible`] where none can); the
    /// first error ends the rebuild.
    type Error;

    /// The expression that takes `expr`'s place. By default `expr` with its
    /// children and buffer mapped by this rebuild ([`Expr::map_children`]).
    fn expr(&mut self, expr: &Expr) -> Expr {
        expr.map_children(self)
    }

    /// The buffer a node or expression addresses in place of `buffer`. By default
    /// `buffer` itself.
    fn buffer(&mut self, buffer: &Name) -> Name {
        buffer.clone()
    }

    /// The node that takes `node`'s place. By default `node` with its parts mapped
    /// by this rebuild ([`Node::map_parts`]).
    fn node(&mut self, node: &Node) -> Result<Node, Self::Error> {
        node.map_parts(self)
    }

    /// The block that takes `block`'s place. By default each of its nodes mapped by
    /// [`node`](Rebuild::node), in order.
    fn block(&mut self, block: &Block) -> Result<Block, Self::Error> {
        block.iter().map(|node| self.node(node)).collect()
    }
}

impl Node {
    /// This node rebuilt from its parts as `rebuild` maps them: its expressions
    /// through [`Rebuild::expr`] in evaluation order (the order
    /// [`Node`]'s variants list them), then the buffer it addresses through
    /// [`Rebuild::buffer`], then its blocks through [`Rebuild::block`] in program
    /// order (`then_body` before `else_body`). Variable names, operators and flags
    /// are kept. A node without parts (a barrier, `break`) comes back as it is.
    /// Recursive through the hooks: see [`Rebuild`] for the programs it suits.
    pub fn map_parts<R: Rebuild + ?Sized>(&self, rebuild: &mut R) -> Result<Node, R::Error> {
        Ok(match self {
            Node::Let {
                name,
                mutable,
                value,
            } => Node::Let {
                name: name.clone(),
                mutable: *mutable,
                value: rebuild.expr(value),
            },
            Node::Assign { name, value } => Node::Assign {
                name: name.clone(),
                value: rebuild.expr(value),
            },
            Node::Store {
                buffer,
                index,
                value,
            } => Node::Store {
                index: rebuild.expr(index),
                value: rebuild.expr(value),
                buffer: rebuild.buffer(buffer),
            },
            Node::If {
                condition,
                then_body,
                else_body,
            } => Node::If {
                condition: rebuild.expr(condition),
                then_body: rebuild.block(then_body)?,
                else_body: rebuild.block(else_body)?,
            },
            Node::Loop {
                variable,
                start,
                end,
                body,
            } => Node::Loop {
                variable: variable.clone(),
                start: rebuild.expr(start),
                end: rebuild.expr(end),
                body: rebuild.block(body)?,
            },
            Node::While { condition, body } => Node::While {
                condition: rebuild.expr(condition),
                body: rebuild.block(body)?,
            },
            Node::Atomic {
                op,
                buffer,
                index,
                value,
            } => Node::Atomic {
                op: *op,
                index: rebuild.expr(index),
                value: rebuild.expr(value),
                buffer: rebuild.buffer(buffer),
            },
            Node::AtomicFetch {
                name,
                op,
                buffer,
                index,
                value,
            } => Node::AtomicFetch {
                name: name.clone(),
                op: *op,
                index: rebuild.expr(index),
                value: rebuild.expr(value),
                buffer: rebuild.buffer(buffer),
            },
            Node::CompareExchange {
                name,
                buffer,
                index,
                expected,
                value,
            } => Node::CompareExchange {
                name: name.clone(),
                index: rebuild.expr(index),
                expected: rebuild.expr(expected),
                value: rebuild.expr(value),
                buffer: rebuild.buffer(buffer),
            },
            Node::AtomicLoad {
                name,
                buffer,
                index,
            } => Node::AtomicLoad {
                name: name.clone(),
                index: rebuild.expr(index),
                buffer: rebuild.buffer(buffer),
            },
            Node::AcquireLoad {
                name,
                buffer,
                index,
            } => Node::AcquireLoad {
                name: name.clone(),
                index: rebuild.expr(index),
                buffer: rebuild.buffer(buffer),
            },
            Node::WorkgroupReduce { name, op, value } => Node::WorkgroupReduce {
                name: name.clone(),
                op: *op,
                value: rebuild.expr(value),
            },
            Node::WorkgroupScan {
                name,
                op,
                kind,
                value,
            } => Node::WorkgroupScan {
                name: name.clone(),
                op: *op,
                kind: *kind,
                value: rebuild.expr(value),
            },
            Node::Barrier
            | Node::GridSync
            | Node::Fence
            | Node::WorkgroupFence
            | Node::Return
            | Node::Break
            | Node::Continue => self.clone(),
        })
    }
}

impl Expr {
    /// This expression rebuilt from its parts as `rebuild` maps them: its direct
    /// subexpressions through [`Rebuild::expr`], left to right, then the buffer a
    /// load or a length reads through [`Rebuild::buffer`]. Operators, types and
    /// leaves (literals, variables, scalar parameters, builtins) are kept; the
    /// children's own children are `rebuild.expr`'s to map. Recursive through the
    /// hooks: see [`Rebuild`] for the programs it suits.
    pub fn map_children<R: Rebuild + ?Sized>(&self, rebuild: &mut R) -> Expr {
        let child = |rebuild: &mut R, expr: &Expr| Box::new(rebuild.expr(expr));
        match self {
            Expr::Literal(_) | Expr::Var(_) | Expr::Scalar(_) | Expr::Builtin(_) => self.clone(),
            Expr::Length { buffer } => Expr::Length {
                buffer: rebuild.buffer(buffer),
            },
            Expr::Load { buffer, index } => Expr::Load {
                index: child(rebuild, index),
                buffer: rebuild.buffer(buffer),
            },
            Expr::Binary { op, lhs, rhs } => Expr::Binary {
                op: *op,
                lhs: child(rebuild, lhs),
                rhs: child(rebuild, rhs),
            },
            Expr::Unary { op, operand } => Expr::Unary {
                op: *op,
                operand: child(rebuild, operand),
            },
            Expr::Select {
                condition,
                if_true,
                if_false,
            } => Expr::Select {
                condition: child(rebuild, condition),
                if_true: child(rebuild, if_true),
                if_false: child(rebuild, if_false),
            },
            Expr::Cast { to, value } => Expr::Cast {
                to: *to,
                value: child(rebuild, value),
            },
            Expr::SubgroupShuffleXor { value, lane_mask } => Expr::SubgroupShuffleXor {
                value: child(rebuild, value),
                lane_mask: *lane_mask,
            },
            Expr::SubgroupReduce { op, value } => Expr::SubgroupReduce {
                op: *op,
                value: child(rebuild, value),
            },
            Expr::SubgroupScan { op, kind, value } => Expr::SubgroupScan {
                op: *op,
                kind: *kind,
                value: child(rebuild, value),
            },
        }
    }
}

fn is_leaf(expr: &Expr) -> bool {
    matches!(
        expr,
        Expr::Literal(_) | Expr::Var(_) | Expr::Length { .. } | Expr::Scalar(_) | Expr::Builtin(_)
    )
}

/// Identity of a block allocation while it is alive (address and length).
pub(crate) fn block_key(block: &Block) -> (usize, usize) {
    (block.as_ptr() as usize, block.len())
}

/// Whether any node of the tree under `entry` satisfies `matches`. Iterative (no
/// depth limit, so it serves programs not yet validated) and visiting each distinct
/// block allocation once (no blow-up on shared blocks).
pub(crate) fn any_node<'a>(entry: &'a [Node], mut matches: impl FnMut(&'a Node) -> bool) -> bool {
    let mut seen: HashSet<(usize, usize)> = HashSet::new();
    let mut pending: Vec<&'a [Node]> = vec![entry];
    while let Some(block) = pending.pop() {
        if !seen.insert((block.as_ptr() as usize, block.len())) {
            continue;
        }
        for node in block {
            if matches(node) {
                return true;
            }
            pending.extend(node_blocks(node).into_iter().flatten().map(|b| &b[..]));
        }
    }
    false
}

// ---- Drop ----------------------------------------------------------------------------

impl Drop for Expr {
    fn drop(&mut self) {
        // Children that have children of their own move to a work list and are
        // dropped from there, each after its own children were moved out: at most
        // one level of recursion, whatever the depth. (Written as plain matches: this
        // runs for every expression ever freed, debug builds included.)
        let mut pending: Vec<Expr> = Vec::new();
        detach_subexpressions(self, &mut pending);
        while let Some(mut expr) = pending.pop() {
            detach_subexpressions(&mut expr, &mut pending);
        }
    }
}

fn detach(child: &mut Expr, pending: &mut Vec<Expr>) {
    if !is_leaf(child) {
        pending.push(std::mem::replace(child, PLACEHOLDER));
    }
}

fn detach_subexpressions(expr: &mut Expr, pending: &mut Vec<Expr>) {
    match expr {
        Expr::Literal(_)
        | Expr::Var(_)
        | Expr::Length { .. }
        | Expr::Scalar(_)
        | Expr::Builtin(_) => {}
        Expr::Load { index: child, .. }
        | Expr::Unary { operand: child, .. }
        | Expr::Cast { value: child, .. }
        | Expr::SubgroupShuffleXor { value: child, .. }
        | Expr::SubgroupReduce { value: child, .. }
        | Expr::SubgroupScan { value: child, .. } => detach(child, pending),
        Expr::Binary { lhs, rhs, .. } => {
            detach(lhs, pending);
            detach(rhs, pending);
        }
        Expr::Select {
            condition,
            if_true,
            if_false,
        } => {
            detach(condition, pending);
            detach(if_true, pending);
            detach(if_false, pending);
        }
    }
}

thread_local! {
    static EMPTY_BLOCK: Block = Arc::from(Vec::new());
}

fn empty_block() -> Block {
    EMPTY_BLOCK
        .try_with(Arc::clone)
        .unwrap_or_else(|_| Arc::from(Vec::new()))
}

impl Drop for Node {
    fn drop(&mut self) {
        // Nested blocks move to a work list; a block that this drop holds the last
        // reference to has its nodes' blocks moved out before it is freed, so
        // freeing it frees no further block.
        let has_blocks = match self {
            Node::If {
                then_body,
                else_body,
                ..
            } => !then_body.is_empty() || !else_body.is_empty(),
            Node::Loop { body, .. } | Node::While { body, .. } => !body.is_empty(),
            _ => false,
        };
        if !has_blocks {
            return;
        }
        let mut pending: Vec<Block> = Vec::new();
        detach_blocks(self, &mut pending);
        while let Some(mut block) = pending.pop() {
            if let Some(nodes) = Arc::get_mut(&mut block) {
                for node in nodes.iter_mut() {
                    detach_blocks(node, &mut pending);
                }
            }
        }
    }
}

fn detach_blocks(node: &mut Node, pending: &mut Vec<Block>) {
    for block in node_blocks_mut(node).into_iter().flatten() {
        if !block.is_empty() {
            pending.push(std::mem::replace(block, empty_block()));
        }
    }
}

// ---- Clone ---------------------------------------------------------------------------

/// The expression with every child replaced by a placeholder leaf.
fn shallow_clone(expr: &Expr) -> Expr {
    let hole = || Box::new(PLACEHOLDER);
    match expr {
        Expr::Literal(literal) => Expr::Literal(*literal),
        Expr::Var(name) => Expr::Var(name.clone()),
        Expr::Scalar(name) => Expr::Scalar(name.clone()),
        Expr::Load { buffer, .. } => Expr::Load {
            buffer: buffer.clone(),
            index: hole(),
        },
        Expr::Length { buffer } => Expr::Length {
            buffer: buffer.clone(),
        },
        Expr::Binary { op, .. } => Expr::Binary {
            op: *op,
            lhs: hole(),
            rhs: hole(),
        },
        Expr::Unary { op, .. } => Expr::Unary {
            op: *op,
            operand: hole(),
        },
        Expr::Select { .. } => Expr::Select {
            condition: hole(),
            if_true: hole(),
            if_false: hole(),
        },
        Expr::Cast { to, .. } => Expr::Cast {
            to: *to,
            value: hole(),
        },
        Expr::Builtin(builtin) => Expr::Builtin(*builtin),
        Expr::SubgroupShuffleXor { lane_mask, .. } => Expr::SubgroupShuffleXor {
            value: hole(),
            lane_mask: *lane_mask,
        },
        Expr::SubgroupReduce { op, .. } => Expr::SubgroupReduce {
            op: *op,
            value: hole(),
        },
        Expr::SubgroupScan { op, kind, .. } => Expr::SubgroupScan {
            op: *op,
            kind: *kind,
            value: hole(),
        },
    }
}

impl Clone for Expr {
    fn clone(&self) -> Expr {
        let mut root = shallow_clone(self);
        let mut work: Vec<(&Expr, &mut Expr)> = Vec::new();
        for (source, target) in expr_children(self)
            .into_iter()
            .zip(expr_children_mut(&mut root))
        {
            if let (Some(source), Some(target)) = (source, target) {
                work.push((source, target));
            }
        }
        while let Some((source, target)) = work.pop() {
            *target = shallow_clone(source);
            for (source, target) in expr_children(source)
                .into_iter()
                .zip(expr_children_mut(target))
            {
                if let (Some(source), Some(target)) = (source, target) {
                    work.push((source, target));
                }
            }
        }
        root
    }
}

// ---- PartialEq -----------------------------------------------------------------------

/// Equal variant and equal non-child fields.
fn shallow_expr_eq(a: &Expr, b: &Expr) -> bool {
    match (a, b) {
        (Expr::Literal(x), Expr::Literal(y)) => x == y,
        (Expr::Var(x), Expr::Var(y)) | (Expr::Scalar(x), Expr::Scalar(y)) => x == y,
        (Expr::Load { buffer: x, .. }, Expr::Load { buffer: y, .. }) => x == y,
        (Expr::Length { buffer: x }, Expr::Length { buffer: y }) => x == y,
        (Expr::Binary { op: x, .. }, Expr::Binary { op: y, .. }) => x == y,
        (Expr::Unary { op: x, .. }, Expr::Unary { op: y, .. }) => x == y,
        (Expr::Select { .. }, Expr::Select { .. }) => true,
        (Expr::Cast { to: x, .. }, Expr::Cast { to: y, .. }) => x == y,
        (Expr::Builtin(x), Expr::Builtin(y)) => x == y,
        (
            Expr::SubgroupShuffleXor { lane_mask: x, .. },
            Expr::SubgroupShuffleXor { lane_mask: y, .. },
        ) => x == y,
        (Expr::SubgroupReduce { op: x, .. }, Expr::SubgroupReduce { op: y, .. }) => x == y,
        (
            Expr::SubgroupScan {
                op: x, kind: kx, ..
            },
            Expr::SubgroupScan {
                op: y, kind: ky, ..
            },
        ) => x == y && kx == ky,
        _ => false,
    }
}

fn shallow_node_eq(a: &Node, b: &Node) -> bool {
    match (a, b) {
        (
            Node::Let {
                name: x,
                mutable: mx,
                ..
            },
            Node::Let {
                name: y,
                mutable: my,
                ..
            },
        ) => x == y && mx == my,
        (Node::Assign { name: x, .. }, Node::Assign { name: y, .. }) => x == y,
        (Node::Store { buffer: x, .. }, Node::Store { buffer: y, .. }) => x == y,
        (Node::If { .. }, Node::If { .. }) | (Node::While { .. }, Node::While { .. }) => true,
        (Node::Loop { variable: x, .. }, Node::Loop { variable: y, .. }) => x == y,
        (Node::Barrier, Node::Barrier)
        | (Node::GridSync, Node::GridSync)
        | (Node::Fence, Node::Fence)
        | (Node::WorkgroupFence, Node::WorkgroupFence)
        | (Node::Return, Node::Return)
        | (Node::Break, Node::Break)
        | (Node::Continue, Node::Continue) => true,
        (
            Node::Atomic {
                op: ox, buffer: x, ..
            },
            Node::Atomic {
                op: oy, buffer: y, ..
            },
        ) => ox == oy && x == y,
        (
            Node::AtomicFetch {
                name: nx,
                op: ox,
                buffer: x,
                ..
            },
            Node::AtomicFetch {
                name: ny,
                op: oy,
                buffer: y,
                ..
            },
        ) => nx == ny && ox == oy && x == y,
        (
            Node::CompareExchange {
                name: nx,
                buffer: x,
                ..
            },
            Node::CompareExchange {
                name: ny,
                buffer: y,
                ..
            },
        ) => nx == ny && x == y,
        (
            Node::AtomicLoad {
                name: nx,
                buffer: x,
                ..
            },
            Node::AtomicLoad {
                name: ny,
                buffer: y,
                ..
            },
        ) => nx == ny && x == y,
        (
            Node::AcquireLoad {
                name: nx,
                buffer: x,
                ..
            },
            Node::AcquireLoad {
                name: ny,
                buffer: y,
                ..
            },
        ) => nx == ny && x == y,
        (
            Node::WorkgroupReduce {
                name: x, op: ox, ..
            },
            Node::WorkgroupReduce {
                name: y, op: oy, ..
            },
        ) => x == y && ox == oy,
        (
            Node::WorkgroupScan {
                name: x,
                op: ox,
                kind: kx,
                ..
            },
            Node::WorkgroupScan {
                name: y,
                op: oy,
                kind: ky,
                ..
            },
        ) => x == y && ox == oy && kx == ky,
        _ => false,
    }
}

/// One pending comparison.
enum Pair<'a> {
    Expr(&'a Expr, &'a Expr),
    Node(&'a Node, &'a Node),
    Block(&'a Block, &'a Block),
}

/// Structural equality by an explicit work list. A pair of blocks that are one
/// allocation is equal without a walk; a pair of shared blocks already compared (or
/// being compared: any difference found anywhere ends the whole comparison) is not
/// compared again, so shared structure costs once per distinct pair.
fn structurally_equal(start: Pair<'_>) -> bool {
    let mut work: SmallVec<[Pair<'_>; 16]> = SmallVec::new();
    work.push(start);
    let mut seen_shared: HashSet<((usize, usize), (usize, usize))> = HashSet::new();
    while let Some(pair) = work.pop() {
        match pair {
            Pair::Expr(a, b) => {
                if !shallow_expr_eq(a, b) {
                    return false;
                }
                for (x, y) in expr_children(a).into_iter().zip(expr_children(b)) {
                    match (x, y) {
                        (Some(x), Some(y)) => work.push(Pair::Expr(x, y)),
                        (None, None) => {}
                        _ => return false,
                    }
                }
            }
            Pair::Node(a, b) => {
                if !shallow_node_eq(a, b) {
                    return false;
                }
                for (x, y) in node_exprs(a).into_iter().zip(node_exprs(b)) {
                    match (x, y) {
                        (Some(x), Some(y)) => work.push(Pair::Expr(x, y)),
                        (None, None) => {}
                        _ => return false,
                    }
                }
                for (x, y) in node_blocks(a).into_iter().zip(node_blocks(b)) {
                    match (x, y) {
                        (Some(x), Some(y)) => work.push(Pair::Block(x, y)),
                        (None, None) => {}
                        _ => return false,
                    }
                }
            }
            Pair::Block(a, b) => {
                if Arc::ptr_eq(a, b) {
                    continue;
                }
                if a.len() != b.len() {
                    return false;
                }
                let shared = Arc::strong_count(a) > 1 || Arc::strong_count(b) > 1;
                if shared && !seen_shared.insert((block_key(a), block_key(b))) {
                    continue;
                }
                for (x, y) in a.iter().zip(b.iter()).rev() {
                    work.push(Pair::Node(x, y));
                }
            }
        }
    }
    true
}

/// Whether two blocks are structurally equal (iterative; see [`structurally_equal`]).
pub(crate) fn blocks_equal(a: &Block, b: &Block) -> bool {
    structurally_equal(Pair::Block(a, b))
}

impl PartialEq for Expr {
    fn eq(&self, other: &Self) -> bool {
        structurally_equal(Pair::Expr(self, other))
    }
}
impl Eq for Expr {}

impl PartialEq for Node {
    fn eq(&self, other: &Self) -> bool {
        structurally_equal(Pair::Node(self, other))
    }
}
impl Eq for Node {}

// ---- Hash ----------------------------------------------------------------------------

enum Item<'a> {
    Expr(&'a Expr),
    Node(&'a Node),
}

fn hash_expr_fields<H: Hasher>(expr: &Expr, state: &mut H) {
    std::mem::discriminant(expr).hash(state);
    match expr {
        Expr::Literal(literal) => literal.hash(state),
        Expr::Var(name)
        | Expr::Scalar(name)
        | Expr::Load { buffer: name, .. }
        | Expr::Length { buffer: name } => name.hash(state),
        Expr::Binary { op, .. } => op.hash(state),
        Expr::Unary { op, .. } => op.hash(state),
        Expr::Select { .. } => {}
        Expr::Cast { to, .. } => to.hash(state),
        Expr::Builtin(builtin) => builtin.hash(state),
        Expr::SubgroupShuffleXor { lane_mask, .. } => lane_mask.hash(state),
        Expr::SubgroupReduce { op, .. } => op.hash(state),
        Expr::SubgroupScan { op, kind, .. } => {
            op.hash(state);
            kind.hash(state);
        }
    }
}

fn hash_node_fields<H: Hasher>(node: &Node, state: &mut H) {
    std::mem::discriminant(node).hash(state);
    match node {
        Node::Let { name, mutable, .. } => {
            name.hash(state);
            mutable.hash(state);
        }
        Node::Assign { name, .. }
        | Node::Store { buffer: name, .. }
        | Node::Loop { variable: name, .. } => name.hash(state),
        Node::Atomic { op, buffer, .. } => {
            op.hash(state);
            buffer.hash(state);
        }
        Node::AtomicFetch {
            name, op, buffer, ..
        } => {
            name.hash(state);
            op.hash(state);
            buffer.hash(state);
        }
        Node::CompareExchange { name, buffer, .. }
        | Node::AtomicLoad { name, buffer, .. }
        | Node::AcquireLoad { name, buffer, .. } => {
            name.hash(state);
            buffer.hash(state);
        }
        Node::WorkgroupReduce { name, op, .. } => {
            name.hash(state);
            op.hash(state);
        }
        Node::WorkgroupScan { name, op, kind, .. } => {
            name.hash(state);
            op.hash(state);
            kind.hash(state);
        }
        Node::If { .. }
        | Node::While { .. }
        | Node::Barrier
        | Node::GridSync
        | Node::Fence
        | Node::WorkgroupFence
        | Node::Return
        | Node::Break
        | Node::Continue => {}
    }
    for block in node_blocks(node).into_iter().flatten() {
        block.len().hash(state);
    }
}

/// Hashes the first [`HASH_ITEM_BUDGET`] items of a pre-order walk.
fn hash_prefix<H: Hasher>(start: Item<'_>, state: &mut H) {
    let mut work: SmallVec<[Item<'_>; 16]> = SmallVec::new();
    work.push(start);
    let mut budget = HASH_ITEM_BUDGET;
    while let Some(item) = work.pop() {
        if budget == 0 {
            break;
        }
        budget -= 1;
        match item {
            Item::Expr(expr) => {
                hash_expr_fields(expr, state);
                for child in expr_children(expr).into_iter().flatten().rev() {
                    work.push(Item::Expr(child));
                }
            }
            Item::Node(node) => {
                hash_node_fields(node, state);
                // Only a block's first HASH_ITEM_BUDGET nodes can be in the prefix.
                for block in node_blocks(node).into_iter().flatten().rev() {
                    let first = &block[..block.len().min(HASH_ITEM_BUDGET)];
                    for child in first.iter().rev() {
                        work.push(Item::Node(child));
                    }
                }
                for expr in node_exprs(node).into_iter().flatten().rev() {
                    work.push(Item::Expr(expr));
                }
            }
        }
        // A block of a million nodes must not be pushed whole for a 64-item prefix.
        if work.len() > HASH_ITEM_BUDGET {
            let excess = work.len() - HASH_ITEM_BUDGET;
            work.drain(..excess);
        }
    }
}

impl Hash for Expr {
    /// Hashes a bounded prefix of the tree (equal expressions hash equally).
    fn hash<H: Hasher>(&self, state: &mut H) {
        hash_prefix(Item::Expr(self), state);
    }
}

impl Hash for Node {
    /// Hashes a bounded prefix of the tree (equal nodes hash equally).
    fn hash<H: Hasher>(&self, state: &mut H) {
        hash_prefix(Item::Node(self), state);
    }
}

// ---- Debug ---------------------------------------------------------------------------

impl fmt::Debug for Expr {
    /// The bounded `Display` form.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Debug for Node {
    /// The bounded `Display` form.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

// ---- node count ----------------------------------------------------------------------

/// Expressions in the tree rooted at `expr` (iterative).
pub(crate) fn count_expr(expr: &Expr) -> u64 {
    let mut stack: SmallVec<[&Expr; 16]> = SmallVec::new();
    stack.push(expr);
    let mut count = 0u64;
    while let Some(e) = stack.pop() {
        count += 1;
        match e {
            Expr::Literal(_)
            | Expr::Var(_)
            | Expr::Length { .. }
            | Expr::Scalar(_)
            | Expr::Builtin(_) => {}
            Expr::Load { index: child, .. }
            | Expr::Unary { operand: child, .. }
            | Expr::Cast { value: child, .. }
            | Expr::SubgroupShuffleXor { value: child, .. }
            | Expr::SubgroupReduce { value: child, .. }
            | Expr::SubgroupScan { value: child, .. } => stack.push(child),
            Expr::Binary { lhs, rhs, .. } => {
                stack.push(lhs);
                stack.push(rhs);
            }
            Expr::Select {
                condition,
                if_true,
                if_false,
            } => {
                stack.push(condition);
                stack.push(if_true);
                stack.push(if_false);
            }
        }
    }
    count
}

/// Nodes plus expressions of the tree `entry` describes, counting a shared block once
/// per use (the tree's size), saturating at `u64::MAX`. Walks each shared block
/// allocation once, so `b = [If { then: b, else: b }]` nested 64 times costs 64 steps.
pub(crate) fn count_tree(entry: &Block) -> u64 {
    enum Frame<'a> {
        Enter(&'a Block),
        Exit(&'a Block, u64, usize),
    }
    let mut memo: HashMap<(usize, usize), u64> = HashMap::new();
    let mut frames: Vec<Frame<'_>> = vec![Frame::Enter(entry)];
    let mut done: Vec<u64> = Vec::new();
    while let Some(frame) = frames.pop() {
        match frame {
            Frame::Enter(block) => {
                let shared = Arc::strong_count(block) > 1;
                if shared {
                    if let Some(&count) = memo.get(&block_key(block)) {
                        done.push(count);
                        continue;
                    }
                }
                let mut own = 0u64;
                let mut children = 0usize;
                for node in block.iter() {
                    own = own.saturating_add(1);
                    for expr in node_exprs(node).into_iter().flatten() {
                        own = own.saturating_add(count_expr(expr));
                    }
                    children += node_blocks(node).into_iter().flatten().count();
                }
                frames.push(Frame::Exit(block, own, children));
                for node in block.iter() {
                    for child in node_blocks(node).into_iter().flatten() {
                        if child.is_empty() {
                            // Counts nothing: no frame, no memo lookup.
                            done.push(0);
                        } else {
                            frames.push(Frame::Enter(child));
                        }
                    }
                }
            }
            Frame::Exit(block, own, children) => {
                let start = done.len().saturating_sub(children);
                let total = done
                    .drain(start..)
                    .fold(own, |sum, count| sum.saturating_add(count));
                if Arc::strong_count(block) > 1 {
                    memo.insert(block_key(block), total);
                }
                done.push(total);
            }
        }
    }
    done.pop().unwrap_or(0)
}
