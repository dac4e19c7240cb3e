//! The builder: how user code writes programs.
//!
//! Expressions compose with methods and operators (`a + b`, `a.less_than(b)`,
//! `cond.select(x, y)`); statements are pushed onto a [`BlockBuilder`] inside
//! closures, so nesting in Rust mirrors nesting in the program:
//!
//! ```
//! use vyre_cuda::ir::*;
//! let program = Program::builder([64, 1, 1])
//!     .buffer("input", 0, Access::ReadOnly, ElemType::U32, BufferCount::Runtime)
//!     .buffer("output", 1, Access::WriteOnly, ElemType::U32, BufferCount::Runtime)
//!     .body(|b| {
//!         let i = b.let_("i", Expr::global_id(Axis::X));
//!         b.if_(i.clone().less_than(Expr::length("output")), |b| {
//!             b.store("output", i.clone(), Expr::load("input", i.clone()) * 2u32);
//!         });
//!     })
//!     .build();
//! assert_eq!(program.buffers().len(), 2);
//! ```
//!
//! The builder never validates: [`mod@crate::ir::validate`] owns every rule.

use super::program::*;

/// Builds a [`Program`]; see the module docs.
#[derive(Clone, Debug)]
pub struct ProgramBuilder {
    buffers: Vec<BufferDecl>,
    scalars: Vec<ScalarDecl>,
    workgroup_size: [u32; 3],
    entry_op_id: Option<Name>,
    non_composable_with_self: bool,
    body: Vec<Node>,
}

impl ProgramBuilder {
    /// A builder for a program with this workgroup size.
    pub fn new(workgroup_size: [u32; 3]) -> Self {
        ProgramBuilder {
            buffers: Vec::new(),
            scalars: Vec::new(),
            workgroup_size,
            entry_op_id: None,
            non_composable_with_self: false,
            body: Vec::new(),
        }
    }

    /// Declare a buffer.
    pub fn buffer(
        mut self,
        name: impl Into<Name>,
        binding: u32,
        access: Access,
        elem: ElemType,
        count: BufferCount,
    ) -> Self {
        self.buffers
            .push(BufferDecl::new(name, binding, access, elem, count));
        self
    }

    /// Declare a per-thread array of `length` elements ([`Access::Local`]).
    pub fn local_array(
        self,
        name: impl Into<Name>,
        binding: u32,
        elem: ElemType,
        length: u32,
    ) -> Self {
        self.buffer(
            name,
            binding,
            Access::Local,
            elem,
            BufferCount::Static(length),
        )
    }

    /// Declare a buffer from a ready declaration.
    pub fn buffer_decl(mut self, decl: BufferDecl) -> Self {
        self.buffers.push(decl);
        self
    }

    /// Declare a scalar parameter: a value of type `ty` each dispatch supplies by
    /// `name`, read with [`Expr::scalar`] (see [`ScalarDecl`]). Declaration order is
    /// the kernel's parameter order.
    pub fn scalar(mut self, name: impl Into<Name>, ty: ScalarType) -> Self {
        self.scalars.push(ScalarDecl::new(name, ty));
        self
    }

    /// Name the program (used in diagnostics and error messages).
    pub fn entry_op_id(mut self, id: impl Into<Name>) -> Self {
        self.entry_op_id = Some(id.into());
        self
    }

    /// Mark the program as not fusable with another copy of itself.
    pub fn non_composable_with_self(mut self, flag: bool) -> Self {
        self.non_composable_with_self = flag;
        self
    }

    /// Append statements to the entry body.
    pub fn body(mut self, build: impl FnOnce(&mut BlockBuilder)) -> Self {
        let mut block = BlockBuilder {
            nodes: std::mem::take(&mut self.body),
        };
        build(&mut block);
        self.body = block.nodes;
        self
    }

    /// Append ready-made nodes to the entry body.
    pub fn nodes(mut self, nodes: impl IntoIterator<Item = Node>) -> Self {
        self.body.extend(nodes);
        self
    }

    /// The finished program (not yet validated).
    pub fn build(self) -> Program {
        Program::from_parts(
            self.buffers.into(),
            self.scalars.into(),
            self.workgroup_size,
            self.body.into(),
            self.entry_op_id,
            self.non_composable_with_self,
        )
    }
}

/// Collects the statements of one block.
#[derive(Clone, Debug, Default)]
pub struct BlockBuilder {
    nodes: Vec<Node>,
}

impl BlockBuilder {
    /// An empty block.
    pub fn new() -> Self {
        Self::default()
    }

    /// The statements collected so far.
    pub fn into_block(self) -> Block {
        self.nodes.into()
    }

    fn nested(build: impl FnOnce(&mut BlockBuilder)) -> Block {
        let mut b = BlockBuilder::new();
        build(&mut b);
        b.into_block()
    }

    /// Push any node.
    pub fn push(&mut self, node: Node) -> &mut Self {
        self.nodes.push(node);
        self
    }

    /// `let name = value;` Returns `Expr::Var(name)` for use in later expressions.
    pub fn let_(&mut self, name: impl Into<Name>, value: impl Into<Expr>) -> Expr {
        let name = name.into();
        self.nodes.push(Node::Let {
            name: name.clone(),
            mutable: false,
            value: value.into(),
        });
        Expr::Var(name)
    }

    /// `let mut name = value;` Returns `Expr::Var(name)`.
    pub fn let_mut(&mut self, name: impl Into<Name>, value: impl Into<Expr>) -> Expr {
        let name = name.into();
        self.nodes.push(Node::Let {
            name: name.clone(),
            mutable: true,
            value: value.into(),
        });
        Expr::Var(name)
    }

    /// `name = value;`
    pub fn assign(&mut self, name: impl Into<Name>, value: impl Into<Expr>) -> &mut Self {
        self.push(Node::Assign {
            name: name.into(),
            value: value.into(),
        })
    }

    /// `buffer[index] = value;`
    pub fn store(
        &mut self,
        buffer: impl Into<Name>,
        index: impl Into<Expr>,
        value: impl Into<Expr>,
    ) -> &mut Self {
        self.push(Node::Store {
            buffer: buffer.into(),
            index: index.into(),
            value: value.into(),
        })
    }

    /// `if condition { then }`
    pub fn if_(
        &mut self,
        condition: impl Into<Expr>,
        then: impl FnOnce(&mut BlockBuilder),
    ) -> &mut Self {
        self.push(Node::If {
            condition: condition.into(),
            then_body: Self::nested(then),
            else_body: Vec::new().into(),
        })
    }

    /// `if condition { then } else { otherwise }`
    pub fn if_else(
        &mut self,
        condition: impl Into<Expr>,
        then: impl FnOnce(&mut BlockBuilder),
        otherwise: impl FnOnce(&mut BlockBuilder),
    ) -> &mut Self {
        self.push(Node::If {
            condition: condition.into(),
            then_body: Self::nested(then),
            else_body: Self::nested(otherwise),
        })
    }

    /// `for variable in start..end { body }`; the closure receives the loop variable.
    pub fn loop_(
        &mut self,
        variable: impl Into<Name>,
        start: impl Into<Expr>,
        end: impl Into<Expr>,
        body: impl FnOnce(&mut BlockBuilder, Expr),
    ) -> &mut Self {
        let variable = variable.into();
        let var = Expr::Var(variable.clone());
        let body = Self::nested(|b| body(b, var));
        self.push(Node::Loop {
            variable,
            start: start.into(),
            end: end.into(),
            body,
        })
    }

    /// `while condition { body }`.
    pub fn while_(
        &mut self,
        condition: impl Into<Expr>,
        body: impl FnOnce(&mut BlockBuilder),
    ) -> &mut Self {
        self.push(Node::While {
            condition: condition.into(),
            body: Self::nested(body),
        })
    }

    /// Leave the innermost loop.
    pub fn break_(&mut self) -> &mut Self {
        self.push(Node::Break)
    }

    /// Go on with the innermost loop's next iteration.
    pub fn continue_(&mut self) -> &mut Self {
        self.push(Node::Continue)
    }

    /// Workgroup barrier.
    pub fn barrier(&mut self) -> &mut Self {
        self.push(Node::Barrier)
    }

    /// Grid-wide synchronisation.
    pub fn grid_sync(&mut self) -> &mut Self {
        self.push(Node::GridSync)
    }

    /// Device-scope acquire-release memory fence ([`Node::Fence`]).
    pub fn fence(&mut self) -> &mut Self {
        self.push(Node::Fence)
    }

    /// Workgroup-scope acquire-release memory fence ([`Node::WorkgroupFence`]).
    pub fn workgroup_fence(&mut self) -> &mut Self {
        self.push(Node::WorkgroupFence)
    }

    /// `let name = atomic_fetch_<op>(&buffer[index], value);` Returns `Expr::Var(name)`:
    /// the element's value before this thread's operation.
    pub fn atomic_fetch(
        &mut self,
        name: impl Into<Name>,
        op: AtomicOp,
        buffer: impl Into<Name>,
        index: impl Into<Expr>,
        value: impl Into<Expr>,
    ) -> Expr {
        let name = name.into();
        self.nodes.push(Node::AtomicFetch {
            name: name.clone(),
            op,
            buffer: buffer.into(),
            index: index.into(),
            value: value.into(),
        });
        Expr::Var(name)
    }

    /// `let name = atomic_compare_exchange(&buffer[index], expected, value);` Returns
    /// `Expr::Var(name)`: the element's previous value (equal to `expected` exactly
    /// when the exchange happened).
    pub fn compare_exchange(
        &mut self,
        name: impl Into<Name>,
        buffer: impl Into<Name>,
        index: impl Into<Expr>,
        expected: impl Into<Expr>,
        value: impl Into<Expr>,
    ) -> Expr {
        let name = name.into();
        self.nodes.push(Node::CompareExchange {
            name: name.clone(),
            buffer: buffer.into(),
            index: index.into(),
            expected: expected.into(),
            value: value.into(),
        });
        Expr::Var(name)
    }

    /// `let name = atomic_load(&buffer[index]);` ([`Node::AtomicLoad`]). Returns
    /// `Expr::Var(name)`: the element's value as one atomic read sees it.
    pub fn atomic_load(
        &mut self,
        name: impl Into<Name>,
        buffer: impl Into<Name>,
        index: impl Into<Expr>,
    ) -> Expr {
        let name = name.into();
        self.nodes.push(Node::AtomicLoad {
            name: name.clone(),
            buffer: buffer.into(),
            index: index.into(),
        });
        Expr::Var(name)
    }

    /// `let name = acquire_load(&buffer[index]);` ([`Node::AcquireLoad`]). Returns
    /// `Expr::Var(name)`: the element's value as one acquiring read at system
    /// scope sees it.
    pub fn acquire_load(
        &mut self,
        name: impl Into<Name>,
        buffer: impl Into<Name>,
        index: impl Into<Expr>,
    ) -> Expr {
        let name = name.into();
        self.nodes.push(Node::AcquireLoad {
            name: name.clone(),
            buffer: buffer.into(),
            index: index.into(),
        });
        Expr::Var(name)
    }

    /// Atomic read-modify-write on an integer buffer element (no value returned).
    pub fn atomic(
        &mut self,
        op: AtomicOp,
        buffer: impl Into<Name>,
        index: impl Into<Expr>,
        value: impl Into<Expr>,
    ) -> &mut Self {
        self.push(Node::Atomic {
            op,
            buffer: buffer.into(),
            index: index.into(),
            value: value.into(),
        })
    }

    /// `let name = workgroup_reduce(op, value);` Returns `Expr::Var(name)`.
    pub fn workgroup_reduce(
        &mut self,
        name: impl Into<Name>,
        op: ReduceOp,
        value: impl Into<Expr>,
    ) -> Expr {
        let name = name.into();
        self.nodes.push(Node::WorkgroupReduce {
            name: name.clone(),
            op,
            value: value.into(),
        });
        Expr::Var(name)
    }

    /// `let name = workgroup_scan_<kind>_<op>(value);` Returns `Expr::Var(name)`.
    pub fn workgroup_scan(
        &mut self,
        name: impl Into<Name>,
        op: ReduceOp,
        kind: ScanKind,
        value: impl Into<Expr>,
    ) -> Expr {
        let name = name.into();
        self.nodes.push(Node::WorkgroupScan {
            name: name.clone(),
            op,
            kind,
            value: value.into(),
        });
        Expr::Var(name)
    }

    /// End this thread.
    pub fn return_(&mut self) -> &mut Self {
        self.push(Node::Return)
    }
}

impl From<u32> for Expr {
    fn from(v: u32) -> Self {
        Expr::Literal(Literal::U32(v))
    }
}
impl From<i32> for Expr {
    fn from(v: i32) -> Self {
        Expr::Literal(Literal::I32(v))
    }
}
impl From<u64> for Expr {
    fn from(v: u64) -> Self {
        Expr::Literal(Literal::U64(v))
    }
}
impl From<i64> for Expr {
    fn from(v: i64) -> Self {
        Expr::Literal(Literal::I64(v))
    }
}
impl From<f32> for Expr {
    fn from(v: f32) -> Self {
        Expr::Literal(Literal::F32(v))
    }
}
impl From<bool> for Expr {
    fn from(v: bool) -> Self {
        Expr::Literal(Literal::Bool(v))
    }
}
impl From<Literal> for Expr {
    fn from(v: Literal) -> Self {
        Expr::Literal(v)
    }
}
impl From<Builtin> for Expr {
    fn from(v: Builtin) -> Self {
        Expr::Builtin(v)
    }
}

macro_rules! binary_methods {
    ($($method:ident => $op:ident),* $(,)?) => {
        impl Expr {
            $(
                #[doc = concat!("`self ", stringify!($op), " rhs`; see [`BinaryOp::", stringify!($op), "`].")]
                // The operator traits are implemented too; these inherent forms let
                // user code chain (`x.rem(10u32)`) without importing std::ops traits.
                #[allow(clippy::should_implement_trait)]
                pub fn $method(self, rhs: impl Into<Expr>) -> Expr {
                    Expr::binary(BinaryOp::$op, self, rhs)
                }
            )*
        }
    };
}

binary_methods! {
    add => Add, sub => Sub, mul => Mul, div => Div, rem => Rem,
    bit_and => BitAnd, bit_or => BitOr, bit_xor => BitXor, shl => Shl, shr => Shr,
    equals => Eq, not_equals => Ne, less_than => Lt, less_equal => Le,
    greater_than => Gt, greater_equal => Ge, min => Min, max => Max,
    and => LogicalAnd, or => LogicalOr, permute_bytes => PermuteBytes,
}

macro_rules! operator_impls {
    ($($trait:ident :: $method:ident => $op:ident),* $(,)?) => {
        $(
            impl<R: Into<Expr>> std::ops::$trait<R> for Expr {
                type Output = Expr;
                fn $method(self, rhs: R) -> Expr {
                    Expr::binary(BinaryOp::$op, self, rhs)
                }
            }
        )*
    };
}

operator_impls! {
    Add::add => Add, Sub::sub => Sub, Mul::mul => Mul, Div::div => Div, Rem::rem => Rem,
    BitAnd::bitand => BitAnd, BitOr::bitor => BitOr, BitXor::bitxor => BitXor,
    Shl::shl => Shl, Shr::shr => Shr,
}

impl std::ops::Neg for Expr {
    type Output = Expr;
    fn neg(self) -> Expr {
        Expr::unary(UnaryOp::Neg, self)
    }
}

impl std::ops::Not for Expr {
    type Output = Expr;
    /// Bitwise not; use [`Expr::logical_not`] for `bool`.
    fn not(self) -> Expr {
        Expr::unary(UnaryOp::BitNot, self)
    }
}

impl Expr {
    /// A `u32` literal.
    pub fn u32(v: u32) -> Expr {
        v.into()
    }
    /// An `i32` literal.
    pub fn i32(v: i32) -> Expr {
        v.into()
    }
    /// A `u64` literal.
    pub fn u64(v: u64) -> Expr {
        v.into()
    }
    /// An `i64` literal.
    pub fn i64(v: i64) -> Expr {
        v.into()
    }
    /// An `f32` literal.
    pub fn f32(v: f32) -> Expr {
        v.into()
    }
    /// A `bool` literal.
    pub fn bool(v: bool) -> Expr {
        v.into()
    }
    /// A variable reference.
    pub fn var(name: impl Into<Name>) -> Expr {
        Expr::Var(name.into())
    }
    /// `buffer[index]`.
    pub fn load(buffer: impl Into<Name>, index: impl Into<Expr>) -> Expr {
        Expr::Load {
            buffer: buffer.into(),
            index: Box::new(index.into()),
        }
    }
    /// The element count of a buffer.
    pub fn length(buffer: impl Into<Name>) -> Expr {
        Expr::Length {
            buffer: buffer.into(),
        }
    }
    /// The dispatch's value of the scalar parameter `name` (typed by its
    /// declaration, [`ProgramBuilder::scalar`]).
    pub fn scalar(name: impl Into<Name>) -> Expr {
        Expr::Scalar(name.into())
    }
    /// `global_id.axis`.
    pub fn global_id(axis: Axis) -> Expr {
        Expr::Builtin(Builtin::GlobalId(axis))
    }
    /// `local_id.axis`.
    pub fn local_id(axis: Axis) -> Expr {
        Expr::Builtin(Builtin::LocalId(axis))
    }
    /// `workgroup_id.axis`.
    pub fn workgroup_id(axis: Axis) -> Expr {
        Expr::Builtin(Builtin::WorkgroupId(axis))
    }
    /// `workgroup_count.axis`.
    pub fn workgroup_count(axis: Axis) -> Expr {
        Expr::Builtin(Builtin::WorkgroupCount(axis))
    }
    /// The device's clock ([`Builtin::Clock`], a `u64`).
    pub fn clock() -> Expr {
        Expr::Builtin(Builtin::Clock)
    }
    /// Any binary operation.
    pub fn binary(op: BinaryOp, lhs: impl Into<Expr>, rhs: impl Into<Expr>) -> Expr {
        Expr::Binary {
            op,
            lhs: Box::new(lhs.into()),
            rhs: Box::new(rhs.into()),
        }
    }
    /// Any unary operation.
    pub fn unary(op: UnaryOp, operand: impl Into<Expr>) -> Expr {
        Expr::Unary {
            op,
            operand: Box::new(operand.into()),
        }
    }
    /// Logical not of a `bool`.
    pub fn logical_not(self) -> Expr {
        Expr::unary(UnaryOp::LogicalNot, self)
    }
    /// Absolute value.
    pub fn abs(self) -> Expr {
        Expr::unary(UnaryOp::Abs, self)
    }
    /// Population count.
    pub fn count_ones(self) -> Expr {
        Expr::unary(UnaryOp::CountOnes, self)
    }
    /// Leading zero count.
    pub fn leading_zeros(self) -> Expr {
        Expr::unary(UnaryOp::LeadingZeros, self)
    }
    /// `if self { if_true } else { if_false }` (self is a `bool`).
    pub fn select(self, if_true: impl Into<Expr>, if_false: impl Into<Expr>) -> Expr {
        Expr::Select {
            condition: Box::new(self),
            if_true: Box::new(if_true.into()),
            if_false: Box::new(if_false.into()),
        }
    }
    /// `self as to`.
    pub fn cast(self, to: ScalarType) -> Expr {
        Expr::Cast {
            to,
            value: Box::new(self),
        }
    }
}
