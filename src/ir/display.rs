//! `Display` for programs: a legible, stable, indented listing that reads like the
//! kernel it describes, so test failures and logs show programs, not trees.

use std::fmt::{self, Display, Formatter};

use super::program::*;

impl Display for Program {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let [x, y, z] = self.workgroup_size();
        write!(f, "program")?;
        if let Some(id) = self.entry_op_id() {
            write!(f, " '{id}'")?;
        }
        write!(f, " workgroup_size [{x}, {y}, {z}]")?;
        if self.non_composable_with_self() {
            write!(f, " non_composable_with_self")?;
        }
        writeln!(f)?;
        for b in self.buffers() {
            writeln!(f, "  {b}")?;
        }
        writeln!(f, "{{")?;
        write_block(f, self.entry(), 1)?;
        writeln!(f, "}}")
    }
}

impl Display for BufferDecl {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "@binding({}) {} {}: {}",
            self.binding,
            self.access.name(),
            self.name,
            self.elem.name()
        )?;
        match self.count {
            BufferCount::Static(n) => write!(f, "[{n}]"),
            BufferCount::Runtime => write!(f, "[]"),
        }
    }
}

fn indent(f: &mut Formatter<'_>, depth: usize) -> fmt::Result {
    for _ in 0..depth {
        f.write_str("    ")?;
    }
    Ok(())
}

fn write_block(f: &mut Formatter<'_>, block: &[Node], depth: usize) -> fmt::Result {
    for node in block {
        write_node(f, node, depth)?;
    }
    Ok(())
}

fn write_node(f: &mut Formatter<'_>, node: &Node, depth: usize) -> fmt::Result {
    indent(f, depth)?;
    match node {
        Node::Let {
            name,
            mutable,
            value,
        } => {
            let m = if *mutable { "mut " } else { "" };
            writeln!(f, "let {m}{name} = {value};")
        }
        Node::Assign { name, value } => writeln!(f, "{name} = {value};"),
        Node::Store {
            buffer,
            index,
            value,
        } => writeln!(f, "{buffer}[{index}] = {value};"),
        Node::If {
            condition,
            then_body,
            else_body,
        } => {
            writeln!(f, "if {condition} {{")?;
            write_block(f, then_body, depth + 1)?;
            if !else_body.is_empty() {
                indent(f, depth)?;
                writeln!(f, "}} else {{")?;
                write_block(f, else_body, depth + 1)?;
            }
            indent(f, depth)?;
            writeln!(f, "}}")
        }
        Node::Loop {
            variable,
            start,
            end,
            body,
        } => {
            writeln!(f, "for {variable} in {start}..{end} {{")?;
            write_block(f, body, depth + 1)?;
            indent(f, depth)?;
            writeln!(f, "}}")
        }
        Node::Barrier => writeln!(f, "workgroup_barrier();"),
        Node::GridSync => writeln!(f, "grid_sync();"),
        Node::Atomic {
            op,
            buffer,
            index,
            value,
        } => writeln!(f, "atomic_{}(&{buffer}[{index}], {value});", op.name()),
        Node::WorkgroupReduce { name, op, value } => {
            writeln!(f, "let {name} = workgroup_reduce_{}({value});", op.name())
        }
        Node::Return => writeln!(f, "return;"),
    }
}

impl Display for Literal {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match self {
            Literal::U32(v) => write!(f, "{v}u"),
            Literal::I32(v) => write!(f, "{v}i"),
            Literal::F32(v) => write!(f, "{v:?}f"),
            Literal::Bool(v) => write!(f, "{v}"),
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
        };
        write!(f, "{name}.{}", axis.name())
    }
}

impl Display for Expr {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match self {
            Expr::Literal(l) => write!(f, "{l}"),
            Expr::Var(n) => f.write_str(n),
            Expr::Load { buffer, index } => write!(f, "{buffer}[{index}]"),
            Expr::Length { buffer } => write!(f, "length({buffer})"),
            Expr::Binary { op, lhs, rhs } => match op {
                BinaryOp::Min | BinaryOp::Max => write!(f, "{}({lhs}, {rhs})", op.symbol()),
                _ => write!(f, "({lhs} {} {rhs})", op.symbol()),
            },
            Expr::Unary { op, operand } => match op {
                UnaryOp::Neg | UnaryOp::BitNot | UnaryOp::LogicalNot => {
                    write!(f, "{}{operand}", op.symbol())
                }
                _ => write!(f, "{}({operand})", op.symbol()),
            },
            Expr::Select {
                condition,
                if_true,
                if_false,
            } => write!(f, "select({condition}, {if_true}, {if_false})"),
            Expr::Cast { to, value } => write!(f, "{}({value})", to.name()),
            Expr::Builtin(b) => write!(f, "{b}"),
            Expr::SubgroupShuffleXor { value, lane_mask } => {
                write!(f, "subgroup_shuffle_xor({value}, {lane_mask})")
            }
            Expr::SubgroupReduce { op, value } => {
                write!(f, "subgroup_reduce_{}({value})", op.name())
            }
        }
    }
}

impl Display for Node {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        write_node(f, self, 0)
    }
}
