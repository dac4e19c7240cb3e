//! `Display` for programs: a legible, stable, indented listing that reads like the
//! kernel it describes, so test failures and logs show programs, not trees.
//!
//! One bounded printer ([`Printer`]) serves `Display`, `Debug` and the validator's
//! one-line node descriptions in error messages, so they always agree. It is bounded
//! three ways, because a hostile test measured the unbounded printer overflowing a 2 MiB
//! stack at expression depth 10k, producing 400 MB of indentation at block depth
//! 10⁴ (quadratic) and over 3 GB for 64 levels of shared blocks:
//! - blocks nested deeper than [`DISPLAY_MAX_DEPTH`] and expressions nested deeper
//!   than the printer's expression depth are elided with a visible `…` marker (so
//!   its recursion depth is bounded);
//! - indentation stops growing at [`DISPLAY_MAX_INDENT_LEVELS`] levels (each line
//!   costs O(1) bytes beyond its content: output linear in program size);
//! - output stops at a byte budget ([`DISPLAY_MAX_BYTES`] for `Display`) with a marker
//!   saying so, and the walk stops with it.

use std::fmt::{self, Display, Formatter, Write};

use super::program::*;

/// Deepest block nesting `Display` prints; deeper blocks print as one `…` line.
pub const DISPLAY_MAX_DEPTH: usize = 64;

/// Deepest expression nesting `Display` prints; deeper subexpressions print as `…`.
pub const DISPLAY_MAX_EXPR_DEPTH: usize = 64;

/// Indentation levels after which lines stop moving right.
pub const DISPLAY_MAX_INDENT_LEVELS: usize = 16;

/// Most bytes one `Display` (or `Debug`) of a program, node or expression writes
/// before it stops with a marker.
pub const DISPLAY_MAX_BYTES: usize = 1 << 20;

/// The bounded printer.
pub(crate) struct Printer<'w> {
    out: &'w mut dyn Write,
    remaining: usize,
    exhausted: bool,
    max_expr_depth: usize,
    /// Written once when the byte budget runs out.
    budget_marker: &'static str,
}

impl<'w> Printer<'w> {
    pub(crate) fn new(
        out: &'w mut dyn Write,
        max_bytes: usize,
        max_expr_depth: usize,
        budget_marker: &'static str,
    ) -> Self {
        Printer {
            out,
            remaining: max_bytes,
            exhausted: false,
            max_expr_depth,
            budget_marker,
        }
    }

    fn put(&mut self, text: &str) -> fmt::Result {
        if self.exhausted {
            return Ok(());
        }
        if text.len() <= self.remaining {
            self.remaining -= text.len();
            return self.out.write_str(text);
        }
        let mut cut = self.remaining;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        self.out.write_str(&text[..cut])?;
        self.out.write_str(self.budget_marker)?;
        self.exhausted = true;
        self.remaining = 0;
        Ok(())
    }

    fn put_fmt(&mut self, args: fmt::Arguments<'_>) -> fmt::Result {
        match args.as_str() {
            Some(text) => self.put(text),
            None => {
                let text = args.to_string();
                self.put(&text)
            }
        }
    }

    fn indent(&mut self, depth: usize) -> fmt::Result {
        for _ in 0..depth.min(DISPLAY_MAX_INDENT_LEVELS) {
            self.put("    ")?;
        }
        Ok(())
    }

    /// A whole program listing.
    pub(crate) fn program(&mut self, program: &Program) -> fmt::Result {
        let [x, y, z] = program.workgroup_size();
        self.put("program")?;
        if let Some(id) = program.entry_op_id() {
            self.put(" '")?;
            self.put(id)?;
            self.put("'")?;
        }
        self.put_fmt(format_args!(" workgroup_size [{x}, {y}, {z}]"))?;
        if program.non_composable_with_self() {
            self.put(" non_composable_with_self")?;
        }
        self.put("\n")?;
        for buffer in program.buffers() {
            if self.exhausted {
                return Ok(());
            }
            self.put("  ")?;
            self.buffer(buffer)?;
            self.put("\n")?;
        }
        for scalar in program.scalars() {
            if self.exhausted {
                return Ok(());
            }
            self.put("  ")?;
            self.scalar(scalar)?;
            self.put("\n")?;
        }
        self.put("{\n")?;
        self.block(program.entry(), 1)?;
        self.put("}\n")
    }

    pub(crate) fn buffer(&mut self, b: &BufferDecl) -> fmt::Result {
        self.put_fmt(format_args!("@binding({}) {} ", b.binding, b.access.name()))?;
        self.put(&b.name)?;
        self.put(": ")?;
        self.put(b.elem.name())?;
        match b.count {
            BufferCount::Static(n) => self.put_fmt(format_args!("[{n}]")),
            BufferCount::Runtime => self.put("[]"),
        }
    }

    /// `scalar name: type`.
    pub(crate) fn scalar(&mut self, scalar: &ScalarDecl) -> fmt::Result {
        self.put("scalar ")?;
        self.put(&scalar.name)?;
        self.put(": ")?;
        self.put(scalar.ty.name())
    }

    fn block(&mut self, block: &[Node], depth: usize) -> fmt::Result {
        if depth > DISPLAY_MAX_DEPTH {
            if !block.is_empty() {
                self.indent(depth)?;
                self.put_fmt(format_args!(
                    "… (nested deeper than {DISPLAY_MAX_DEPTH} levels: elided)\n"
                ))?;
            }
            return Ok(());
        }
        for node in block {
            if self.exhausted {
                break;
            }
            self.node_lines(node, depth)?;
        }
        Ok(())
    }

    /// A node as listing lines (with its nested blocks), each ending in a newline.
    pub(crate) fn node_lines(&mut self, node: &Node, depth: usize) -> fmt::Result {
        self.indent(depth)?;
        self.node_head(node)?;
        match node {
            Node::If {
                then_body,
                else_body,
                ..
            } => {
                self.put(" {\n")?;
                self.block(then_body, depth + 1)?;
                if !else_body.is_empty() {
                    self.indent(depth)?;
                    self.put("} else {\n")?;
                    self.block(else_body, depth + 1)?;
                }
                self.indent(depth)?;
                self.put("}\n")
            }
            Node::Loop { body, .. } | Node::While { body, .. } => {
                self.put(" {\n")?;
                self.block(body, depth + 1)?;
                self.indent(depth)?;
                self.put("}\n")
            }
            _ => self.put(";\n"),
        }
    }

    /// A node on one line without its nested blocks or a terminator: `if c`,
    /// `for i in a..b`, `while c`, `let x = e`, `out[i] = v`.
    pub(crate) fn node_head(&mut self, node: &Node) -> fmt::Result {
        match node {
            Node::Let {
                name,
                mutable,
                value,
            } => {
                self.put(if *mutable { "let mut " } else { "let " })?;
                self.put(name)?;
                self.put(" = ")?;
                self.expr(value, 0)
            }
            Node::Assign { name, value } => {
                self.put(name)?;
                self.put(" = ")?;
                self.expr(value, 0)
            }
            Node::Store {
                buffer,
                index,
                value,
            } => {
                self.put(buffer)?;
                self.put("[")?;
                self.expr(index, 0)?;
                self.put("] = ")?;
                self.expr(value, 0)
            }
            Node::If { condition, .. } => {
                self.put("if ")?;
                self.expr(condition, 0)
            }
            Node::Loop {
                variable,
                start,
                end,
                ..
            } => {
                self.put("for ")?;
                self.put(variable)?;
                self.put(" in ")?;
                self.expr(start, 0)?;
                self.put("..")?;
                self.expr(end, 0)
            }
            Node::While { condition, .. } => {
                self.put("while ")?;
                self.expr(condition, 0)
            }
            Node::Break => self.put("break"),
            Node::Continue => self.put("continue"),
            Node::Barrier => self.put("workgroup_barrier()"),
            Node::GridSync => self.put("grid_sync()"),
            Node::Fence => self.put("device_fence()"),
            Node::WorkgroupFence => self.put("workgroup_fence()"),
            Node::Atomic {
                op,
                buffer,
                index,
                value,
            } => {
                self.put_fmt(format_args!("atomic_{}", op.name()))?;
                self.atomic_operands(buffer, index, &[value])
            }
            Node::AtomicFetch {
                name,
                op,
                buffer,
                index,
                value,
            } => {
                self.put("let ")?;
                self.put(name)?;
                self.put_fmt(format_args!(" = atomic_fetch_{}", op.name()))?;
                self.atomic_operands(buffer, index, &[value])
            }
            Node::CompareExchange {
                name,
                buffer,
                index,
                expected,
                value,
            } => {
                self.put("let ")?;
                self.put(name)?;
                self.put(" = atomic_compare_exchange")?;
                self.atomic_operands(buffer, index, &[expected, value])
            }
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
                self.put("let ")?;
                self.put(name)?;
                self.put(match node {
                    Node::AtomicLoad { .. } => " = atomic_load",
                    _ => " = acquire_load",
                })?;
                self.atomic_operands(buffer, index, &[])
            }
            Node::WorkgroupScan {
                name,
                op,
                kind,
                value,
            } => {
                self.put("let ")?;
                self.put(name)?;
                self.put_fmt(format_args!(
                    " = workgroup_scan_{}_{}(",
                    kind.name(),
                    op.name()
                ))?;
                self.expr(value, 0)?;
                self.put(")")
            }
            Node::WorkgroupReduce { name, op, value } => {
                self.put("let ")?;
                self.put(name)?;
                self.put_fmt(format_args!(" = workgroup_reduce_{}(", op.name()))?;
                self.expr(value, 0)?;
                self.put(")")
            }
            Node::Return => self.put("return"),
        }
    }

    /// `(&buffer[index])`, or with `operands` after it: `(&buffer[index], a, b)`.
    fn atomic_operands(&mut self, buffer: &str, index: &Expr, operands: &[&Expr]) -> fmt::Result {
        self.put("(&")?;
        self.put(buffer)?;
        self.put("[")?;
        self.expr(index, 0)?;
        self.put("]")?;
        for operand in operands {
            self.put(", ")?;
            self.expr(operand, 0)?;
        }
        self.put(")")
    }

    /// An expression; subexpressions deeper than the printer's limit print as `…`.
    pub(crate) fn expr(&mut self, expr: &Expr, depth: usize) -> fmt::Result {
        if self.exhausted {
            return Ok(());
        }
        if depth >= self.max_expr_depth {
            return self.put("…");
        }
        let next = depth + 1;
        match expr {
            Expr::Literal(literal) => self.put_fmt(format_args!("{literal}")),
            Expr::Var(name) => self.put(name),
            Expr::Load { buffer, index } => {
                self.put(buffer)?;
                self.put("[")?;
                self.expr(index, next)?;
                self.put("]")
            }
            Expr::Length { buffer } => {
                self.put("length(")?;
                self.put(buffer)?;
                self.put(")")
            }
            Expr::Scalar(name) => {
                self.put("scalar(")?;
                self.put(name)?;
                self.put(")")
            }
            Expr::Binary { op, lhs, rhs } => match op {
                BinaryOp::Min | BinaryOp::Max | BinaryOp::PermuteBytes => {
                    self.put(op.symbol())?;
                    self.put("(")?;
                    self.expr(lhs, next)?;
                    self.put(", ")?;
                    self.expr(rhs, next)?;
                    self.put(")")
                }
                _ => {
                    self.put("(")?;
                    self.expr(lhs, next)?;
                    self.put(" ")?;
                    self.put(op.symbol())?;
                    self.put(" ")?;
                    self.expr(rhs, next)?;
                    self.put(")")
                }
            },
            Expr::Unary { op, operand } => match op {
                UnaryOp::Neg | UnaryOp::BitNot | UnaryOp::LogicalNot => {
                    self.put(op.symbol())?;
                    self.expr(operand, next)
                }
                _ => {
                    self.put(op.symbol())?;
                    self.put("(")?;
                    self.expr(operand, next)?;
                    self.put(")")
                }
            },
            Expr::Select {
                condition,
                if_true,
                if_false,
            } => {
                self.put("select(")?;
                self.expr(condition, next)?;
                self.put(", ")?;
                self.expr(if_true, next)?;
                self.put(", ")?;
                self.expr(if_false, next)?;
                self.put(")")
            }
            Expr::Cast { to, value } => {
                self.put(to.name())?;
                self.put("(")?;
                self.expr(value, next)?;
                self.put(")")
            }
            Expr::Builtin(builtin) => self.put_fmt(format_args!("{builtin}")),
            Expr::SubgroupShuffleXor { value, lane_mask } => {
                self.put("subgroup_shuffle_xor(")?;
                self.expr(value, next)?;
                self.put_fmt(format_args!(", {lane_mask})"))
            }
            Expr::SubgroupReduce { op, value } => {
                self.put_fmt(format_args!("subgroup_reduce_{}(", op.name()))?;
                self.expr(value, next)?;
                self.put(")")
            }
            Expr::SubgroupScan { op, kind, value } => {
                self.put_fmt(format_args!("subgroup_scan_{}_{}(", kind.name(), op.name()))?;
                self.expr(value, next)?;
                self.put(")")
            }
        }
    }
}

/// Marker `Display` writes when it stops at [`DISPLAY_MAX_BYTES`].
const DISPLAY_BUDGET_MARKER: &str = "\n… (output elided: over 1 MiB)\n";

fn display_printer<'w>(out: &'w mut dyn Write) -> Printer<'w> {
    Printer::new(
        out,
        DISPLAY_MAX_BYTES,
        DISPLAY_MAX_EXPR_DEPTH,
        DISPLAY_BUDGET_MARKER,
    )
}

/// Most bytes of a node description in an error message.
const DESCRIPTION_MAX_BYTES: usize = 160;

/// Deepest expression nesting a node description shows.
const DESCRIPTION_MAX_EXPR_DEPTH: usize = 4;

/// A short, bounded, one-line description of a node for error messages (the same
/// printer as `Display`, with a small budget): a huge or deep node never makes a
/// huge message.
pub(crate) fn describe_node(node: &Node) -> String {
    let mut out = String::new();
    let mut printer = Printer::new(
        &mut out,
        DESCRIPTION_MAX_BYTES,
        DESCRIPTION_MAX_EXPR_DEPTH,
        "…",
    );
    let _ = printer.node_head(node);
    out
}

impl Display for Program {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        display_printer(f).program(self)
    }
}

impl Display for BufferDecl {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        display_printer(f).buffer(self)
    }
}

impl Display for ScalarDecl {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        display_printer(f).scalar(self)
    }
}

impl Display for Literal {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match self {
            Literal::U32(v) => write!(f, "{v}u"),
            Literal::I32(v) => write!(f, "{v}i"),
            Literal::F32(v) => write!(f, "{v:?}f"),
            Literal::Bool(v) => write!(f, "{v}"),
            Literal::U64(v) => write!(f, "{v}u64"),
            Literal::I64(v) => write!(f, "{v}i64"),
        }
    }
}

impl Display for Builtin {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let (name, axis) = match self {
            Builtin::GlobalId(a) => ("global_id", a),
            Builtin::LocalId(a) => ("local_id", a),
            Builtin::WorkgroupId(a) => ("workgroup_id", a),
            Builtin::WorkgroupCount(a) => ("workgroup_count", a),
            Builtin::Clock => return f.write_str("clock()"),
        };
        write!(f, "{name}.{}", axis.name())
    }
}

impl Display for Expr {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        display_printer(f).expr(self, 0)
    }
}

impl Display for Node {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        display_printer(f).node_lines(self, 0)
    }
}
