//! Tests of the CPU reference interpreter.
//!
//! Every expected value below is written out by hand from the IR's documented
//! semantics, never computed by the interpreter itself: the interpreter is the
//! oracle for the GPU, so its own oracle has to be arithmetic a reader can check.

mod support;

use vyre_cuda::ir::*;
use vyre_cuda::reference::{self, ReferenceOptions, WorkgroupOrder};
use vyre_cuda::{CodegenOptions, DispatchConfig};

fn bytes_of(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn words_of(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn i32_bits(values: &[i32]) -> Vec<u32> {
    values.iter().map(|&v| v as u32).collect()
}

fn f32_bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

/// Run and return every output as `u32` words.
fn run_words(program: &Program, inputs: &[&[u8]], config: &DispatchConfig) -> Vec<Vec<u32>> {
    reference::run(program, inputs, config)
        .unwrap_or_else(|e| panic!("{e}\n{program}"))
        .iter()
        .map(|b| words_of(b))
        .collect()
}

fn elem_for(ty: ScalarType) -> ElemType {
    match ty {
        ScalarType::U32 | ScalarType::Bool => ElemType::U32,
        ScalarType::I32 => ElemType::I32,
        ScalarType::F32 => ElemType::F32,
        ScalarType::U64 => ElemType::U64,
        ScalarType::I64 => ElemType::I64,
    }
}

/// One thread per element: `out[i] = a[i] op b[i]` (a `bool` result is stored as
/// 0/1). Also runs each lane again with `b[i]` as a literal, so the interpreter's
/// per-lane and uniform-operand paths are both held to the same expectation.
fn binary_case(op: BinaryOp, ty: ScalarType, rhs_ty: ScalarType, a: &[u32], b: &[u32]) -> Vec<u32> {
    assert_eq!(a.len(), b.len());
    let n = a.len() as u32;
    let result_is_bool =
        op.is_comparison() || matches!(op, BinaryOp::LogicalAnd | BinaryOp::LogicalOr);
    let out_elem = if result_is_bool {
        ElemType::U32
    } else {
        elem_for(ty)
    };
    let build = |rhs: Expr, n: u32| {
        Program::builder([n, 1, 1])
            .buffer(
                "a",
                0,
                Access::ReadOnly,
                elem_for(ty),
                BufferCount::Static(n),
            )
            .buffer(
                "b",
                1,
                Access::ReadOnly,
                elem_for(rhs_ty),
                BufferCount::Static(n),
            )
            .buffer(
                "out",
                2,
                Access::WriteOnly,
                out_elem,
                BufferCount::Static(n),
            )
            .body(move |blk| {
                let i = blk.let_("i", Expr::global_id(Axis::X));
                let mut lhs = Expr::load("a", i.clone());
                if ty == ScalarType::Bool {
                    lhs = lhs.cast(ScalarType::Bool);
                }
                let mut value = Expr::binary(op, lhs, rhs);
                if result_is_bool {
                    value = value.cast(ScalarType::U32);
                }
                blk.store("out", i, value);
            })
            .build()
    };
    let mut rhs = Expr::load("b", Expr::global_id(Axis::X));
    if rhs_ty == ScalarType::Bool {
        rhs = rhs.cast(ScalarType::Bool);
    }
    let per_lane = run_words(
        &build(rhs, n),
        &[&bytes_of(a), &bytes_of(b), &vec![0; 4 * n as usize]],
        &DispatchConfig::linear(1),
    )
    .remove(0);
    for (lane, &b_bits) in b.iter().enumerate() {
        let literal = match rhs_ty {
            ScalarType::U32 => Literal::U32(b_bits),
            ScalarType::I32 => Literal::I32(b_bits as i32),
            ScalarType::F32 => Literal::F32(f32::from_bits(b_bits)),
            ScalarType::Bool => Literal::Bool(b_bits != 0),
            ScalarType::U64 | ScalarType::I64 => panic!("32-bit operands only; see wide_case"),
        };
        let uniform = run_words(
            &build(Expr::Literal(literal), n),
            &[&bytes_of(a), &bytes_of(b), &vec![0; 4 * n as usize]],
            &DispatchConfig::linear(1),
        )
        .remove(0);
        assert_eq!(
            uniform[lane], per_lane[lane],
            "{op:?} lane {lane}: literal operand and per-lane operand disagree"
        );
    }
    per_lane
}

fn unary_case(op: UnaryOp, ty: ScalarType, a: &[u32]) -> Vec<u32> {
    let n = a.len() as u32;
    let out_elem = match op {
        UnaryOp::CountOnes | UnaryOp::LeadingZeros | UnaryOp::LogicalNot => ElemType::U32,
        _ => elem_for(ty),
    };
    let program = Program::builder([n, 1, 1])
        .buffer(
            "a",
            0,
            Access::ReadOnly,
            elem_for(ty),
            BufferCount::Static(n),
        )
        .buffer(
            "out",
            1,
            Access::WriteOnly,
            out_elem,
            BufferCount::Static(n),
        )
        .body(|blk| {
            let i = blk.let_("i", Expr::global_id(Axis::X));
            let mut operand = Expr::load("a", i.clone());
            if ty == ScalarType::Bool {
                operand = operand.cast(ScalarType::Bool);
            }
            let mut value = Expr::unary(op, operand);
            if op == UnaryOp::LogicalNot {
                value = value.cast(ScalarType::U32);
            }
            blk.store("out", i, value);
        })
        .build();
    run_words(
        &program,
        &[&bytes_of(a), &vec![0; 4 * n as usize]],
        &DispatchConfig::linear(1),
    )
    .remove(0)
}

fn cast_case(from: ScalarType, to: ScalarType, a: &[u32]) -> Vec<u32> {
    let n = a.len() as u32;
    let program = Program::builder([n, 1, 1])
        .buffer(
            "a",
            0,
            Access::ReadOnly,
            elem_for(from),
            BufferCount::Static(n),
        )
        .buffer(
            "out",
            1,
            Access::WriteOnly,
            elem_for(to),
            BufferCount::Static(n),
        )
        .body(|blk| {
            let i = blk.let_("i", Expr::global_id(Axis::X));
            let mut value = Expr::load("a", i.clone());
            if from == ScalarType::Bool {
                value = value.cast(ScalarType::Bool);
            }
            value = value.cast(to);
            if to == ScalarType::Bool {
                value = value.cast(ScalarType::U32);
            }
            blk.store("out", i, value);
        })
        .build();
    run_words(
        &program,
        &[&bytes_of(a), &vec![0; 4 * n as usize]],
        &DispatchConfig::linear(1),
    )
    .remove(0)
}

use ScalarType::{Bool, F32, I32, U32};

/// Locks out non-wrapping (panicking or saturating) u32 arithmetic and a division by
/// zero that traps or returns anything but 0.
#[test]
fn u32_arithmetic_wraps_and_divides_by_zero_to_zero() {
    let a = [0xFFFF_FFFF, 3, 0, 0x1_0000];
    let b = [2, 4, 1, 0x1_0000];
    assert_eq!(
        binary_case(BinaryOp::Add, U32, U32, &a, &b),
        [1, 7, 1, 0x2_0000]
    );
    assert_eq!(
        binary_case(BinaryOp::Sub, U32, U32, &a, &b),
        [0xFFFF_FFFD, 0xFFFF_FFFF, 0xFFFF_FFFF, 0]
    );
    assert_eq!(
        binary_case(BinaryOp::Mul, U32, U32, &a, &b),
        [0xFFFF_FFFE, 12, 0, 0]
    );
    let a = [7, 7, 0xFFFF_FFFF, 0];
    let b = [2, 0, 0x10, 0];
    assert_eq!(
        binary_case(BinaryOp::Div, U32, U32, &a, &b),
        [3, 0, 0x0FFF_FFFF, 0]
    );
    assert_eq!(binary_case(BinaryOp::Rem, U32, U32, &a, &b), [1, 0, 0xF, 0]);
    assert_eq!(
        binary_case(
            BinaryOp::Min,
            U32,
            U32,
            &[1, 0xFFFF_FFFF],
            &[0xFFFF_FFFF, 2]
        ),
        [1, 2]
    );
    assert_eq!(
        binary_case(
            BinaryOp::Max,
            U32,
            U32,
            &[1, 0xFFFF_FFFF],
            &[0xFFFF_FFFF, 2]
        ),
        [0xFFFF_FFFF, 0xFFFF_FFFF]
    );
    assert_eq!(
        binary_case(BinaryOp::BitAnd, U32, U32, &[0xF0F0], &[0xFF00]),
        [0xF000]
    );
    assert_eq!(
        binary_case(BinaryOp::BitOr, U32, U32, &[0xF0F0], &[0xFF00]),
        [0xFFF0]
    );
    assert_eq!(
        binary_case(BinaryOp::BitXor, U32, U32, &[0xF0F0], &[0xFF00]),
        [0x0FF0]
    );
}

/// Locks out shifts that trap or saturate at 32 (PTX `shl` clamps; the IR says mod 32).
#[test]
fn shifts_take_the_amount_modulo_32() {
    let a = [1, 1, 1, 0x8000_0000, 0x8000_0000, 0xF0];
    let b = [31, 32, 33, 35, 32, 4];
    assert_eq!(
        binary_case(BinaryOp::Shl, U32, U32, &a, &b),
        [0x8000_0000, 1, 2, 0, 0x8000_0000, 0xF00]
    );
    assert_eq!(
        binary_case(BinaryOp::Shr, U32, U32, &a, &b),
        [0, 1, 0, 0x1000_0000, 0x8000_0000, 0xF]
    );
    // Arithmetic shift on i32 keeps the sign, also past 32.
    let a = i32_bits(&[-8, -1, -16, 16, i32::MIN]);
    let b = [1, 40, 34, 33, 31];
    assert_eq!(
        binary_case(BinaryOp::Shr, I32, U32, &a, &b),
        i32_bits(&[-4, -1, -4, 8, -1])
    );
    assert_eq!(
        binary_case(BinaryOp::Shl, I32, U32, &i32_bits(&[-1, 3]), &[31, 33]),
        i32_bits(&[i32::MIN, 6])
    );
}

/// Locks out the i32 edge cases the GPU defines and Rust panics on: overflow,
/// division by zero, `i32::MIN / -1`.
#[test]
fn i32_arithmetic_wraps_truncates_and_handles_min_over_minus_one() {
    let a = i32_bits(&[i32::MAX, i32::MIN, 0x4000_0000, -3]);
    let b = i32_bits(&[1, 1, 4, 5]);
    assert_eq!(
        binary_case(BinaryOp::Add, I32, I32, &a, &b),
        i32_bits(&[i32::MIN, i32::MIN + 1, 0x4000_0004, 2])
    );
    assert_eq!(
        binary_case(BinaryOp::Sub, I32, I32, &a, &b),
        i32_bits(&[i32::MAX - 1, i32::MAX, 0x3FFF_FFFC, -8])
    );
    assert_eq!(
        binary_case(BinaryOp::Mul, I32, I32, &a, &b),
        i32_bits(&[i32::MAX, i32::MIN, 0, -15])
    );
    let a = i32_bits(&[-7, 7, i32::MIN, 5, -7, 0]);
    let b = i32_bits(&[2, -2, -1, 0, -7, -3]);
    assert_eq!(
        binary_case(BinaryOp::Div, I32, I32, &a, &b),
        i32_bits(&[-3, -3, i32::MIN, 0, 1, 0])
    );
    assert_eq!(
        binary_case(BinaryOp::Rem, I32, I32, &a, &b),
        i32_bits(&[-1, 1, 0, 0, 0, 0])
    );
    let a = i32_bits(&[-1, 5, i32::MIN]);
    let b = i32_bits(&[1, -5, i32::MAX]);
    assert_eq!(
        binary_case(BinaryOp::Min, I32, I32, &a, &b),
        i32_bits(&[-1, -5, i32::MIN])
    );
    assert_eq!(
        binary_case(BinaryOp::Max, I32, I32, &a, &b),
        i32_bits(&[1, 5, i32::MAX])
    );
    assert_eq!(binary_case(BinaryOp::Lt, I32, I32, &a, &b), [1, 0, 1]);
    assert_eq!(binary_case(BinaryOp::Lt, U32, U32, &a, &b), [0, 1, 0]);
    assert_eq!(binary_case(BinaryOp::Ge, I32, I32, &a, &b), [0, 1, 0]);
}

/// Locks out fused multiply-add, round-to-nearest mistakes and x86's default NaN
/// `0xffc00000` (the GPU returns the canonical NaN `0x7fffffff`).
#[test]
fn f32_arithmetic_rounds_to_nearest_even_and_never_fuses() {
    // 1 + 2^-24 is half an ulp above 1: ties to even gives 1. 1 + 3*2^-24 gives 1 + 2 ulp.
    let a = f32_bits(&[1.0, 1.0, 1.5, -1.0]);
    let b = f32_bits(&[
        f32::from_bits(0x3380_0000),
        f32::from_bits(0x3440_0000),
        2.25,
        0.0,
    ]);
    assert_eq!(
        binary_case(BinaryOp::Add, F32, F32, &a, &b),
        [0x3F80_0000, 0x3F80_0002, 0x4070_0000, 0xBF80_0000]
    );
    // 1/0 = inf, -1/0 = -inf, 0/0 = canonical NaN, 3/2 = 1.5.
    let a = f32_bits(&[1.0, -1.0, 0.0, 3.0]);
    let b = f32_bits(&[0.0, 0.0, 0.0, 2.0]);
    assert_eq!(
        binary_case(BinaryOp::Div, F32, F32, &a, &b),
        [0x7F80_0000, 0xFF80_0000, 0x7FFF_FFFF, 0x3FC0_0000]
    );
    // inf - inf and inf * 0 are NaN: canonical.
    let inf = f32::INFINITY;
    assert_eq!(
        binary_case(
            BinaryOp::Sub,
            F32,
            F32,
            &f32_bits(&[inf]),
            &f32_bits(&[inf])
        ),
        [0x7FFF_FFFF]
    );
    assert_eq!(
        binary_case(
            BinaryOp::Mul,
            F32,
            F32,
            &f32_bits(&[inf]),
            &f32_bits(&[0.0])
        ),
        [0x7FFF_FFFF]
    );

    // (1 + 2^-12)^2 = 1 + 2^-11 + 2^-24 rounds (tie, even) to 1 + 2^-11 = 0x3F801000;
    // minus (1 + 2^-11) is then exactly 0. A fused multiply-add would give 2^-24.
    let x = f32::from_bits(0x3F80_0800); // 1 + 2^-12
    let program = Program::builder([1, 1, 1])
        .buffer(
            "x",
            0,
            Access::ReadOnly,
            ElemType::F32,
            BufferCount::Static(2),
        )
        .buffer(
            "out",
            1,
            Access::WriteOnly,
            ElemType::F32,
            BufferCount::Static(2),
        )
        .body(|blk| {
            let a = Expr::load("x", 0u32);
            let c = Expr::load("x", 1u32);
            blk.store("out", 0u32, a.clone() * a.clone());
            blk.store("out", 1u32, a.clone() * a - c);
        })
        .build();
    let out = run_words(
        &program,
        &[
            &bytes_of(&f32_bits(&[x, f32::from_bits(0x3F80_1000)])),
            &[0; 8],
        ],
        &DispatchConfig::linear(1),
    );
    assert_eq!(out[0], [0x3F80_1000, 0]);
}

/// Locks out NaN-propagating min/max (PTX `min.f32` returns the non-NaN operand),
/// a non-canonical NaN for two NaNs, and an unspecified order of signed zeros.
#[test]
fn f32_min_max_ignore_one_nan() {
    let nan = f32::from_bits(0x7FC0_0001);
    let a = f32_bits(&[nan, 1.0, nan, -0.0, 0.0, -2.0]);
    let b = f32_bits(&[1.0, nan, f32::from_bits(0xFFC0_0000), 0.0, -0.0, 3.0]);
    assert_eq!(
        binary_case(BinaryOp::Min, F32, F32, &a, &b),
        [
            0x3F80_0000,
            0x3F80_0000,
            0x7FFF_FFFF,
            0x8000_0000,
            0x8000_0000,
            0xC000_0000
        ]
    );
    assert_eq!(
        binary_case(BinaryOp::Max, F32, F32, &a, &b),
        [0x3F80_0000, 0x3F80_0000, 0x7FFF_FFFF, 0, 0, 0x4040_0000]
    );
}

/// Locks out unordered f32 comparisons: NaN compares false except for `!=`.
#[test]
fn f32_comparisons_are_ordered() {
    let nan = f32::NAN;
    let a = f32_bits(&[nan, 1.0, nan, -0.0, 1.0]);
    let b = f32_bits(&[1.0, nan, nan, 0.0, 2.0]);
    assert_eq!(binary_case(BinaryOp::Lt, F32, F32, &a, &b), [0, 0, 0, 0, 1]);
    assert_eq!(binary_case(BinaryOp::Le, F32, F32, &a, &b), [0, 0, 0, 1, 1]);
    assert_eq!(binary_case(BinaryOp::Gt, F32, F32, &a, &b), [0, 0, 0, 0, 0]);
    assert_eq!(binary_case(BinaryOp::Ge, F32, F32, &a, &b), [0, 0, 0, 1, 0]);
    assert_eq!(binary_case(BinaryOp::Eq, F32, F32, &a, &b), [0, 0, 0, 1, 0]);
    assert_eq!(binary_case(BinaryOp::Ne, F32, F32, &a, &b), [1, 1, 1, 0, 1]);
}

/// Locks out bools stored as anything but 0/1 and logical ops that short-circuit
/// into wrong values.
#[test]
fn bool_operators_yield_zero_or_one() {
    let a = [0, 0, 1, 1];
    let b = [0, 1, 0, 1];
    assert_eq!(
        binary_case(BinaryOp::LogicalAnd, Bool, Bool, &a, &b),
        [0, 0, 0, 1]
    );
    assert_eq!(
        binary_case(BinaryOp::LogicalOr, Bool, Bool, &a, &b),
        [0, 1, 1, 1]
    );
    assert_eq!(binary_case(BinaryOp::Eq, Bool, Bool, &a, &b), [1, 0, 0, 1]);
    assert_eq!(binary_case(BinaryOp::Ne, Bool, Bool, &a, &b), [0, 1, 1, 0]);
    // A u32 of 5 cast to bool is true: stored as 1, not 5.
    assert_eq!(unary_case(UnaryOp::LogicalNot, Bool, &[0, 5]), [1, 0]);
}

/// Locks out a panicking `abs(i32::MIN)`/`-i32::MIN`, and an f32 abs/neg that
/// disturbs NaN payloads.
#[test]
fn unary_operators() {
    assert_eq!(
        unary_case(UnaryOp::Neg, I32, &i32_bits(&[i32::MIN, 5, -5])),
        i32_bits(&[i32::MIN, -5, 5])
    );
    assert_eq!(
        unary_case(UnaryOp::Abs, I32, &i32_bits(&[i32::MIN, -5, 5])),
        i32_bits(&[i32::MIN, 5, 5])
    );
    assert_eq!(
        unary_case(UnaryOp::Abs, F32, &[0xFFC0_0000, 0x8000_0000, 0xBF80_0000]),
        [0x7FC0_0000, 0, 0x3F80_0000]
    );
    assert_eq!(
        unary_case(UnaryOp::Neg, F32, &[0x3F80_0000, 0]),
        [0xBF80_0000, 0x8000_0000]
    );
    assert_eq!(
        unary_case(UnaryOp::BitNot, U32, &[0, 0xF0F0_F0F0]),
        [0xFFFF_FFFF, 0x0F0F_0F0F]
    );
    assert_eq!(
        unary_case(UnaryOp::CountOnes, U32, &[0, 0xF0F0, 0xFFFF_FFFF]),
        [0, 8, 32]
    );
    assert_eq!(
        unary_case(
            UnaryOp::LeadingZeros,
            U32,
            &[0, 1, 0x8000_0000, 0x0001_0000]
        ),
        [32, 31, 0, 15]
    );
    assert_eq!(unary_case(UnaryOp::CountOnes, I32, &i32_bits(&[-1])), [32]);
}

/// Locks out casts that wrap instead of saturating, keep garbage for NaN, round
/// instead of truncating, or treat `-0.0` as true.
#[test]
fn casts_follow_rust_as_semantics() {
    let f = f32_bits(&[f32::NAN, 3e9, -3e9, -1.5, 1.9, -0.0]);
    assert_eq!(
        cast_case(F32, I32, &f),
        i32_bits(&[0, i32::MAX, i32::MIN, -1, 1, 0])
    );
    assert_eq!(cast_case(F32, U32, &f), [0, 3_000_000_000, 0, 0, 1, 0]);
    assert_eq!(
        cast_case(F32, U32, &f32_bits(&[5e9, f32::INFINITY])),
        [u32::MAX, u32::MAX]
    );
    assert_eq!(cast_case(F32, Bool, &f), [1, 1, 1, 1, 1, 0]);
    // 16777217 is not representable: rounds to even 16777216 (0x4B800000).
    assert_eq!(
        cast_case(U32, F32, &[16_777_217, 0xFFFF_FFFF, 1]),
        [0x4B80_0000, 0x4F80_0000, 0x3F80_0000]
    );
    assert_eq!(
        cast_case(I32, F32, &i32_bits(&[-1, i32::MIN])),
        [0xBF80_0000, 0xCF00_0000]
    );
    assert_eq!(cast_case(U32, I32, &[0xFFFF_FFFF]), [0xFFFF_FFFF]);
    assert_eq!(cast_case(I32, U32, &i32_bits(&[-2])), [0xFFFF_FFFE]);
    assert_eq!(cast_case(U32, Bool, &[0, 5, 0x8000_0000]), [0, 1, 1]);
    assert_eq!(cast_case(I32, Bool, &i32_bits(&[0, -1])), [0, 1]);
    assert_eq!(cast_case(Bool, F32, &[0, 1]), [0, 0x3F80_0000]);
    assert_eq!(cast_case(Bool, I32, &[0, 7]), [0, 1]);
}

/// Locks out sign-extended u8 loads and u8 stores that write more than one byte.
#[test]
fn u8_buffers_zero_extend_on_load_and_keep_the_low_byte_on_store() {
    let program = Program::builder([4, 1, 1])
        .buffer(
            "text",
            0,
            Access::ReadOnly,
            ElemType::U8,
            BufferCount::Static(4),
        )
        .buffer(
            "bytes",
            1,
            Access::WriteOnly,
            ElemType::U8,
            BufferCount::Static(4),
        )
        .buffer(
            "wide",
            2,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Static(4),
        )
        .body(|blk| {
            let i = blk.let_("i", Expr::global_id(Axis::X));
            let c = blk.let_("c", Expr::load("text", i.clone()));
            blk.store("bytes", i.clone(), c.clone() + 0x101u32);
            blk.store("wide", i, c);
        })
        .build();
    let out = reference::run(
        &program,
        &[&[0x41, 0xFF, 0x00, 0x07], &[9; 4], &[0; 16]],
        &DispatchConfig::linear(1),
    )
    .unwrap();
    assert_eq!(out[0], [0x42, 0x00, 0x01, 0x08]);
    assert_eq!(words_of(&out[1]), [0x41, 0xFF, 0, 7]);
}

fn shifted_copy_program() -> Program {
    Program::builder([4, 1, 1])
        .entry_op_id("shifted_copy")
        .buffer(
            "src",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Static(4),
        )
        .buffer(
            "dst",
            1,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(4),
        )
        .body(|blk| {
            let i = blk.let_("i", Expr::global_id(Axis::X));
            // Reads src[i + 2] and writes dst[i + 2]: lanes 2 and 3 go out of range.
            blk.store(
                "dst",
                i.clone() + 2u32,
                Expr::load("src", i + 2u32) + 100u32,
            );
        })
        .build()
}

/// Locks out out-of-range loads that read neighbouring memory and stores that
/// land anywhere (bounds checks on: read 0, write nothing).
#[test]
fn out_of_range_loads_read_zero_and_stores_are_dropped() {
    let out = run_words(
        &shifted_copy_program(),
        &[&bytes_of(&[10, 20, 30, 40]), &bytes_of(&[1, 2, 3, 4])],
        &DispatchConfig::linear(1),
    );
    // Lane 0: dst[2] = src[2] + 100; lane 1: dst[3] = src[3] + 100; lanes 2, 3 dropped.
    assert_eq!(out[0], [1, 2, 130, 140]);
}

/// Locks out the interpreter silently clamping accesses the GPU would fault on when
/// bounds checks are off. Negative control: the same program and inputs with bounds
/// checks on succeed, so the error comes from the out-of-range access alone.
#[test]
fn bounds_checks_off_makes_an_out_of_range_access_an_error() {
    let config =
        DispatchConfig::linear(1).with_codegen(CodegenOptions::new().with_bounds_checks(false));
    let inputs: [&[u8]; 2] = [&bytes_of(&[10, 20, 30, 40]), &bytes_of(&[1, 2, 3, 4])];
    let error = reference::run(&shifted_copy_program(), &inputs, &config).unwrap_err();
    let message = error.to_string();
    assert!(message.starts_with("Fix:"), "{message}");
    assert!(message.contains("shifted_copy"), "{message}");
    assert!(message.contains("'src'"), "{message}");
    assert!(message.contains("index 4"), "{message}");
    assert!(message.contains("fault"), "{message}");
    // Negative control.
    assert!(reference::run(&shifted_copy_program(), &inputs, &DispatchConfig::linear(1)).is_ok());

    // A store out of range with bounds checks off is an error too (in-range load).
    let program = Program::builder([1, 1, 1])
        .buffer(
            "dst",
            0,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Static(2),
        )
        .body(|blk| {
            blk.store("dst", 2u32, 1u32);
        })
        .build();
    let message = reference::run(&program, &[&[0; 8]], &config)
        .unwrap_err()
        .to_string();
    assert!(
        message.starts_with("Fix:") && message.contains("'dst'") && message.contains("index 2"),
        "{message}"
    );
}

/// Locks out if/else running both arms for a lane, or an else arm for lanes that
/// took the then arm (masks must split the lanes exactly).
#[test]
fn if_else_splits_the_active_lanes() {
    let program = Program::builder([8, 1, 1])
        .buffer(
            "out",
            0,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Static(8),
        )
        .body(|blk| {
            let i = blk.let_("i", Expr::global_id(Axis::X));
            let x = blk.let_mut("x", 0u32);
            blk.if_else(
                (i.clone() % 2u32).equals(0u32),
                |blk| {
                    blk.assign("x", x.clone() + 1u32);
                    blk.if_(i.clone().less_than(4u32), |blk| {
                        blk.assign("x", x.clone() + 10u32);
                    });
                },
                |blk| {
                    blk.assign("x", x.clone() + 2u32);
                },
            );
            blk.store("out", i, x);
        })
        .build();
    let out = run_words(&program, &[&[0; 32]], &DispatchConfig::linear(1));
    assert_eq!(out[0], [11, 2, 11, 2, 1, 2, 1, 2]);
}

/// Locks out loops that run every lane the same number of times (uniform trip
/// count) or re-evaluate their bounds each iteration.
#[test]
fn loops_have_per_thread_trip_counts() {
    let program = Program::builder([8, 1, 1])
        .buffer(
            "sum",
            0,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Static(8),
        )
        .buffer(
            "count",
            1,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Static(8),
        )
        .body(|blk| {
            let i = blk.let_("i", Expr::global_id(Axis::X));
            let sum = blk.let_mut("s", 0u32);
            let n = blk.let_mut("n", i.clone());
            blk.loop_("j", 0u32, n.clone(), |blk, j| {
                blk.assign("s", sum.clone() + j);
                // Changing n inside the body must not change the trip count.
                blk.assign("n", n.clone() + 1u32);
            });
            blk.store("sum", i.clone(), sum);
            // start > end: no iterations.
            let c = blk.let_mut("c", 0u32);
            blk.loop_("k", 5u32, i.clone(), |blk, _| {
                blk.assign("c", c.clone() + 1u32);
            });
            blk.store("count", i, c);
        })
        .build();
    let out = run_words(&program, &[&[0; 32], &[0; 32]], &DispatchConfig::linear(1));
    assert_eq!(out[0], [0, 0, 1, 3, 6, 10, 15, 21]);
    assert_eq!(out[1], [0, 0, 0, 0, 0, 0, 1, 2]);
}

/// Runs one thread that stores each expression (cast to `u64`) into its own element
/// of a `u64` output and returns the elements. `x` is a `u64` input holding
/// `[u64::MAX, 5, 1 << 40]` and `y` an `i64` input holding `[i64::MIN, -1, -7]`.
fn wide_results(results: Vec<Expr>) -> Vec<u64> {
    let count = results.len() as u32;
    let program = Program::builder([1, 1, 1])
        .buffer(
            "x",
            0,
            Access::ReadOnly,
            ElemType::U64,
            BufferCount::Static(3),
        )
        .buffer(
            "y",
            1,
            Access::ReadOnly,
            ElemType::I64,
            BufferCount::Static(3),
        )
        .buffer(
            "out",
            2,
            Access::WriteOnly,
            ElemType::U64,
            BufferCount::Static(count),
        )
        .body(|blk| {
            for (slot, value) in results.into_iter().enumerate() {
                blk.store("out", slot as u32, value.cast(ScalarType::U64));
            }
        })
        .build();
    let x: Vec<u8> = [u64::MAX, 5, 1 << 40]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let y: Vec<u8> = [i64::MIN, -1, -7]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let out = reference::run(
        &program,
        &[&x, &y, &vec![0; 8 * count as usize]],
        &DispatchConfig::linear(1),
    )
    .unwrap_or_else(|e| panic!("{e}\n{program}"));
    out[0]
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect()
}

/// Locks out 64-bit arithmetic that wraps at 32 bits, divides like the hardware
/// (a fault or garbage for a zero divisor, a trap for `i64::MIN / -1`), shifts by
/// the amount modulo 32 (or unmasked), or compares signed values as unsigned.
#[test]
fn u64_and_i64_arithmetic_wraps_divides_totally_and_shifts_modulo_64() {
    let x = |k: u32| Expr::load("x", k);
    let y = |k: u32| Expr::load("y", k);
    let bool_bits = |e: Expr| e.cast(ScalarType::U32);
    let got = wide_results(vec![
        x(0) + Expr::u64(2),
        x(1) * x(2),
        x(1) - Expr::u64(6),
        x(0) / Expr::u64(0),
        x(0) % Expr::u64(0),
        x(0) / x(1),
        y(0) / y(1),
        y(0) % y(1),
        y(2) / Expr::i64(2),
        y(2) % Expr::i64(2),
        x(1) << Expr::u32(65),
        y(2) >> Expr::u32(65),
        x(0) >> Expr::u32(60),
        bool_bits(y(1).less_than(Expr::i64(0))),
        bool_bits(x(0).greater_than(x(1))),
        y(0).min(y(2)),
        x(0).min(x(2)).cast(ScalarType::I64),
        -y(0),
        y(2).abs(),
        !x(1),
        x(0).count_ones(),
        Expr::u64(0).leading_zeros(),
        x(2).leading_zeros(),
    ]);
    assert_eq!(
        got,
        [
            1,
            5 << 40,
            u64::MAX,
            0,
            0,
            u64::MAX / 5,
            i64::MIN as u64,
            0,
            -3i64 as u64,
            -1i64 as u64,
            10,
            -4i64 as u64,
            15,
            1,
            1,
            i64::MIN as u64,
            1 << 40,
            i64::MIN as u64,
            7,
            !5u64,
            64,
            64,
            23,
        ]
    );
}

/// Locks out a `permute_bytes` that differs from PTX `prmt.b32` (default mode): a
/// nibble's byte index taken from more than its low three bits, the sign mode
/// (nibble bit 3) ignored or copying the wrong bit, the selector's upper half read,
/// or the halves of the source swapped. The expected words are worked out by hand
/// from the source bytes 0x11, 0x92, 0x33, 0xB4, 0x55, 0xF6, 0x77, 0x08 (bytes 0..8).
#[test]
fn permute_bytes_picks_bytes_by_nibble_and_copies_the_sign_as_prmt_does() {
    let source = Expr::u64(0x0877_F655_B433_9211);
    let permute = |selector: u32| source.clone().permute_bytes(selector);
    let got = wide_results(vec![
        permute(0x3210),
        permute(0x7654),
        permute(0x0123),
        permute(0x4444),
        // Nibbles with bit 3 set: bytes 1 (0x92) and 5 (0xF6) have their top bit
        // set, bytes 0 (0x11) and 7 (0x08) do not.
        permute(0x8F9D),
        // Bits 16..32 of the selector are ignored.
        permute(0xFFFF_3210),
    ]);
    assert_eq!(
        got,
        [
            0xB433_9211,
            0x0877_F655,
            0x1192_33B4,
            0x5555_5555,
            0x0000_FFFF,
            0xB433_9211,
        ]
    );
}

/// Locks out 64-bit conversions that differ from Rust `as`: `u32` zero-extends,
/// `i32` sign-extends (to `u64` too), 64 → 32 bits truncates, `f32` → 64-bit
/// truncates and saturates with NaN at 0, 64-bit → `f32` rounds to nearest even.
#[test]
fn wide_casts_follow_rust_as_semantics() {
    let x = |k: u32| Expr::load("x", k);
    let y = |k: u32| Expr::load("y", k);
    let got = wide_results(vec![
        Expr::u32(u32::MAX).cast(ScalarType::U64),
        Expr::i32(-1).cast(ScalarType::U64),
        Expr::i32(-1).cast(ScalarType::I64),
        x(0).cast(ScalarType::U32).cast(ScalarType::U64),
        y(0).cast(ScalarType::I32).cast(ScalarType::I64),
        Expr::f32(-1.5).cast(ScalarType::U64),
        Expr::f32(1e20).cast(ScalarType::U64),
        Expr::f32(-1e20).cast(ScalarType::I64),
        Expr::f32(f32::NAN).cast(ScalarType::I64),
        Expr::f32(1234.75).cast(ScalarType::I64),
        x(0).cast(ScalarType::F32).cast(ScalarType::U32),
        y(0).cast(ScalarType::F32).cast(ScalarType::U32),
        Expr::u64(16_777_217)
            .cast(ScalarType::F32)
            .cast(ScalarType::U64),
        x(0).cast(ScalarType::Bool).cast(ScalarType::U64),
        Expr::bool(true).cast(ScalarType::I64),
    ]);
    assert_eq!(
        got,
        [
            0xffff_ffff,
            u64::MAX,
            u64::MAX,
            0xffff_ffff,
            0,
            0,
            u64::MAX,
            i64::MIN as u64,
            0,
            1234,
            // 2^64 as f32, then saturated into a u32.
            u32::MAX as u64,
            // -2^63 as f32, negative: 0 as a u32.
            0,
            // 2^24 + 1 rounds to the even 2^24.
            16_777_216,
            1,
            1,
        ]
    );
}

/// Locks out 64-bit elements stored as 4 bytes (or with the wrong byte order), and
/// 64-bit values that lose their high half in variables, selects or workgroup
/// memory: a `u64` buffer round-trips through each; an index past the end reads 0.
#[test]
fn u64_buffers_hold_eight_little_endian_bytes() {
    let program = Program::builder([2, 1, 1])
        .buffer(
            "data",
            0,
            Access::ReadWrite,
            ElemType::U64,
            BufferCount::Static(2),
        )
        .buffer(
            "shared",
            1,
            Access::Workgroup,
            ElemType::I64,
            BufferCount::Static(2),
        )
        .body(|blk| {
            let i = blk.let_("i", Expr::local_id(Axis::X));
            let v = blk.let_mut("v", Expr::load("data", i.clone()));
            blk.assign("v", v.clone() + Expr::u64(1 << 32));
            blk.store("shared", i.clone(), v.clone().cast(ScalarType::I64));
            blk.barrier();
            let other = Expr::load("shared", Expr::u32(1) - i.clone()).cast(ScalarType::U64);
            let past = Expr::load("data", 2u32);
            // Each lane stores the other lane's value (through a select whose other
            // arm is its own).
            blk.store("data", i.clone(), i.equals(5u32).select(v, other) + past);
        })
        .build();
    let data: Vec<u8> = [0x0102_0304_0506_0708u64, 9]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let out = reference::run(&program, &[&data], &DispatchConfig::linear(1)).unwrap();
    assert_eq!(
        out[0],
        [
            9, 0, 0, 0, 1, 0, 0, 0, // lane 0: lane 1's 9 + 2^32
            8, 7, 6, 5, 5, 3, 2, 1, // lane 1: lane 0's value + 2^32
        ]
    );
}

/// Locks out 32-bit semantics that change when a program also has a 64-bit value
/// (its lanes are then kept in 64 bits: a 32-bit result whose high half is not
/// zero, an `i32` compared through its 64-bit pattern, a `u8` store that keeps more
/// than a byte): 300 generated 32-bit programs give the same bytes with an unused
/// `u64` variable in front. Negative control: the variable does switch the lane width
/// (the memory estimate per thread grows).
#[test]
fn thirty_two_bit_programs_give_the_same_bytes_on_64_bit_lanes() {
    use vyre_cuda::ir::generate::{valid_program, GeneratorOptions};
    let options = GeneratorOptions::default().core_only();
    for seed in 0..300 {
        let case = valid_program(seed, &options);
        let widened = case.program.with_entry(
            case.program.buffers_shared().clone(),
            std::iter::once(Node::Let {
                name: "widened".into(),
                mutable: false,
                value: Expr::u64(1 << 40),
            })
            .chain(case.program.entry().iter().cloned())
            .collect(),
        );
        let inputs: Vec<&[u8]> = case.inputs.iter().map(|v| v.as_slice()).collect();
        let narrow = reference::run(&case.program, &inputs, &case.config)
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        let wide = reference::run(&widened, &inputs, &case.config)
            .unwrap_or_else(|e| panic!("seed {seed} widened: {e}"));
        assert_eq!(narrow, wide, "seed {seed}\n{}", case.program);
    }
    let per_thread = |program: &Program| {
        let tight = ReferenceOptions {
            max_memory_bytes: 1 << 20,
            ..ReferenceOptions::default()
        };
        let error = reference::run_with_options(
            program,
            &[&[0; 8], &[0; 4]],
            &DispatchConfig::linear(1 << 20),
            &tight,
        )
        .unwrap_err()
        .to_string();
        error
            .split(" bytes per thread")
            .next()
            .and_then(|head| head.rsplit(' ').next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no per-thread figure in {error}"))
    };
    let narrow = one_buffer_program();
    let widened = narrow.with_entry(
        narrow.buffers_shared().clone(),
        std::iter::once(Node::Let {
            name: "widened".into(),
            mutable: false,
            value: Expr::u64(1),
        })
        .chain(narrow.entry().iter().cloned())
        .collect(),
    );
    assert!(per_thread(&widened) > per_thread(&narrow));
}

/// Locks out fetching atomics that return anything but the element's value just
/// before the lane's own operation, in the order the reference defines (ascending
/// lane within a statement), for every operation: four lanes apply
/// `cells[k] op= operands[4k + lane]` and store what they got.
#[test]
fn fetch_atomics_return_the_previous_value_in_lane_order() {
    let ops = AtomicOp::ALL;
    let program = Program::builder([4, 1, 1])
        .buffer(
            "cells",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(8),
        )
        .buffer(
            "operands",
            1,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Static(32),
        )
        .buffer(
            "got",
            2,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Static(32),
        )
        .body(|blk| {
            let lane = blk.let_("lane", Expr::global_id(Axis::X));
            for (k, op) in ops.into_iter().enumerate() {
                let slot = lane.clone() + 4 * k as u32;
                let old = blk.atomic_fetch(
                    format!("old{k}"),
                    op,
                    "cells",
                    k as u32,
                    Expr::load("operands", slot.clone()),
                );
                blk.store("got", slot, old);
            }
        })
        .build();
    // Add, Sub, Min, Max, And, Or, Xor, Exchange.
    let cells = [10, 100, 7, 7, 0xff, 1, 0, 5];
    let operands = [
        1, 2, 3, 4, 0, 1, 2, 3, 9, 5, 6, 2, 3, 8, 8, 10, 0xf0, 0x3c, 0xff, 0x0f, 2, 4, 8, 16, 1, 3,
        1, 3, 6, 7, 8, 9,
    ];
    let out = run_words(
        &program,
        &[&bytes_of(&cells), &bytes_of(&operands), &[0; 128]],
        &DispatchConfig::linear(1),
    );
    assert_eq!(out[0], [20, 94, 2, 10, 0x00, 31, 0, 9]);
    assert_eq!(
        out[1],
        [
            10, 11, 13, 16, 100, 100, 99, 97, 7, 7, 5, 5, 7, 7, 8, 8, 0xff, 0xf0, 0x30, 0x30, 1, 3,
            7, 15, 0, 1, 2, 3, 5, 6, 7, 8,
        ]
    );
}

/// Locks out compare-exchange that swaps on a mismatch, returns the new value, or
/// reads another lane's stale copy: lane `i` swaps `i` for `i + 10`, so only lane 1
/// (which sees the initial 1) succeeds and lanes 2 and 3 see its 11. Out-of-range
/// atomics change nothing and return 0; signed and 64-bit elements use their own
/// order and width; workgroup elements count per workgroup.
#[test]
fn compare_exchange_signed_wide_and_workgroup_atomics() {
    let program = Program::builder([2, 1, 1])
        .buffer(
            "slot",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(1),
        )
        .buffer(
            "signed",
            1,
            Access::ReadWrite,
            ElemType::I32,
            BufferCount::Static(1),
        )
        .buffer(
            "wide",
            2,
            Access::ReadWrite,
            ElemType::U64,
            BufferCount::Static(1),
        )
        .buffer(
            "got",
            3,
            Access::WriteOnly,
            ElemType::U64,
            BufferCount::Static(24),
        )
        .buffer(
            "tile",
            4,
            Access::Workgroup,
            ElemType::I64,
            BufferCount::Static(1),
        )
        .body(|blk| {
            let lane = blk.let_("lane", Expr::global_id(Axis::X));
            let row = |k: u32| lane.clone() + 4 * k;
            let swapped =
                blk.compare_exchange("swapped", "slot", 0u32, lane.clone(), lane.clone() + 10u32);
            blk.store("got", row(0), swapped.cast(ScalarType::U64));
            let operand = Expr::i32(-5) * (lane.clone().rem(2u32).cast(ScalarType::I32)) + 3i32;
            let low = blk.atomic_fetch("low", AtomicOp::Min, "signed", 0u32, operand);
            blk.store("got", row(1), low.cast(ScalarType::U64));
            let carried = blk.atomic_fetch(
                "carried",
                AtomicOp::Add,
                "wide",
                0u32,
                Expr::u64(0xffff_ffff),
            );
            blk.store("got", row(2), carried);
            let outside =
                blk.atomic_fetch("outside", AtomicOp::Exchange, "slot", 5u32, lane.clone());
            blk.store("got", row(3), outside.cast(ScalarType::U64));
            let counted = blk.atomic_fetch("counted", AtomicOp::Sub, "tile", 0u32, Expr::i64(1));
            blk.store("got", row(4), counted.cast(ScalarType::U64));
        })
        .build();
    let out = reference::run(
        &program,
        &[
            &bytes_of(&[1]),
            &i32_bits(&[-1])
                .iter()
                .flat_map(|w| w.to_le_bytes())
                .collect::<Vec<u8>>(),
            &1u64.to_le_bytes(),
            &[0; 192],
        ],
        &DispatchConfig::linear(2),
    )
    .unwrap();
    let got: Vec<u64> = out[3]
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(words_of(&out[0]), [11]);
    assert_eq!(i32_bits(&[-2]), words_of(&out[1]));
    assert_eq!(
        out[2],
        (1u64 + 4 * 0xffff_ffff).to_le_bytes(),
        "the carry reaches the high word"
    );
    let rows: Vec<&[u64]> = got.chunks(4).collect();
    assert_eq!(rows[0], [1, 1, 11, 11]);
    // Operands 3, -2, 3, -2 against -1, signed: -1, -1, -2, -2 (sign-extended to u64).
    let (minus_one, minus_two) = (-1i64 as u64, -2i64 as u64);
    assert_eq!(rows[1], [minus_one, minus_one, minus_two, minus_two]);
    assert_eq!(
        rows[2],
        [1, 1 + 0xffff_ffff, 1 + 2 * 0xffff_ffff, 1 + 3 * 0xffff_ffff]
    );
    assert_eq!(rows[3], [0, 0, 0, 0]);
    // Each workgroup's tile starts at 0: its two lanes see 0 and -1.
    assert_eq!(rows[4], [0, u64::MAX, 0, u64::MAX]);
}

/// Locks out an atomic load that reads a stale or another element, changes the
/// element, or faults out of range: in each of two workgroups of 4 threads every
/// thread adds 1 to its workgroup's `u32` counter and subtracts 1 from an `i32`
/// workgroup element, then after a barrier loads both (initial + 4 and -4 in
/// every thread, whatever the order the atomics ran in), a `u64` element above 32
/// bits (unchanged) and one past the end (0); the buffers hold what the atomics
/// left, nothing more.
#[test]
fn atomic_loads_read_what_the_atomics_left() {
    let program = Program::builder([4, 1, 1])
        .buffer(
            "counters",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(2),
        )
        .buffer(
            "wide",
            1,
            Access::ReadWrite,
            ElemType::U64,
            BufferCount::Static(1),
        )
        .buffer(
            "got",
            2,
            Access::WriteOnly,
            ElemType::U64,
            BufferCount::Static(32),
        )
        .buffer(
            "tile",
            3,
            Access::Workgroup,
            ElemType::I32,
            BufferCount::Static(1),
        )
        .body(|blk| {
            let lane = blk.let_("lane", Expr::global_id(Axis::X));
            let group = blk.let_("group", Expr::workgroup_id(Axis::X));
            blk.atomic(AtomicOp::Add, "counters", group.clone(), 1u32);
            blk.atomic(AtomicOp::Sub, "tile", 0u32, 1i32);
            blk.barrier();
            let row = |k: u32| lane.clone() * 4u32 + k;
            let counted = blk.atomic_load("counted", "counters", group);
            blk.store("got", row(0), counted.cast(ScalarType::U64));
            let tiled = blk.atomic_load("tiled", "tile", 0u32);
            blk.store(
                "got",
                row(1),
                tiled.cast(ScalarType::I64).cast(ScalarType::U64),
            );
            let wide = blk.atomic_load("seen_wide", "wide", 0u32);
            blk.store("got", row(2), wide);
            let outside = blk.atomic_load("outside", "wide", 9u32);
            blk.store("got", row(3), outside);
        })
        .build();
    let out = reference::run(
        &program,
        &[
            &bytes_of(&[10, 20]),
            &(1u64 << 40 | 3).to_le_bytes(),
            &[0; 256],
        ],
        &DispatchConfig::linear(8),
    )
    .unwrap();
    assert_eq!(words_of(&out[0]), [14, 24]);
    assert_eq!(out[1], (1u64 << 40 | 3).to_le_bytes());
    let got: Vec<u64> = out[2]
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    for (lane, row) in got.chunks(4).enumerate() {
        let counted = if lane < 4 { 14 } else { 24 };
        assert_eq!(row, [counted, -4i64 as u64, 1 << 40 | 3, 0], "lane {lane}");
    }
}

/// Locks out an acquire load that reads another element, changes the element, or
/// faults out of range: 8 threads each load element `lane` of a read-only `u32`
/// buffer of 6 (the element, 0 for the last two lanes, past its end) and element
/// 0 of a read-write `i64` buffer holding a negative value above 32 bits (the
/// value, sign and all); the read-write buffer comes back unchanged.
#[test]
fn acquire_loads_read_the_element_and_zero_past_the_end() {
    let program = Program::builder([4, 1, 1])
        .buffer(
            "flags",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Static(6),
        )
        .buffer(
            "wide",
            1,
            Access::ReadWrite,
            ElemType::I64,
            BufferCount::Static(1),
        )
        .buffer(
            "got",
            2,
            Access::WriteOnly,
            ElemType::U64,
            BufferCount::Static(16),
        )
        .body(|blk| {
            let lane = blk.let_("lane", Expr::global_id(Axis::X));
            let flag = blk.acquire_load("flag", "flags", lane.clone());
            blk.store("got", lane.clone() * 2u32, flag.cast(ScalarType::U64));
            let wide = blk.acquire_load("seen_wide", "wide", 0u32);
            blk.store("got", lane * 2u32 + 1u32, wide.cast(ScalarType::U64));
        })
        .build();
    let wide = -(1i64 << 40 | 5);
    let out = reference::run(
        &program,
        &[
            &bytes_of(&[3, 1, 4, 1, 5, 9]),
            &wide.to_le_bytes(),
            &[0; 128],
        ],
        &DispatchConfig::linear(2),
    )
    .unwrap();
    assert_eq!(out[0], wide.to_le_bytes());
    let got: Vec<u64> = out[1]
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let flags = [3, 1, 4, 1, 5, 9, 0, 0];
    for (lane, row) in got.chunks(2).enumerate() {
        assert_eq!(row, [flags[lane], wide as u64], "lane {lane}");
    }
}

/// Locks out local arrays shared between threads, kept across kernel runs, indexed
/// at compile time only, or unchecked: each of 4 threads fills its own array with
/// `10 * thread + j`, reads it back rotated by a run-time index, reads past its end
/// (0) and stores past its end (nothing); a second kernel run starts from zeros.
#[test]
fn local_arrays_are_per_thread_zeroed_and_bounds_checked() {
    let program = Program::builder([4, 1, 1])
        .buffer(
            "out",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(16),
        )
        .local_array("scratch", 1, ElemType::U32, 3)
        .local_array("bytes", 2, ElemType::U8, 2)
        .body(|blk| {
            let lane = blk.let_("lane", Expr::global_id(Axis::X));
            // Zero at the start of every kernel run, whatever the last run left.
            blk.store(
                "out",
                lane.clone() * 4u32 + 3u32,
                Expr::load("scratch", 2u32) + Expr::load("out", lane.clone() * 4u32 + 3u32),
            );
            blk.loop_("j", 0u32, 3u32, |blk, j| {
                blk.store("scratch", j.clone(), lane.clone() * 10u32 + j);
            });
            blk.store("scratch", 3u32, 99u32);
            blk.store("bytes", lane.clone(), 0x1ffu32);
            let rotated = (lane.clone() + 1u32) % 3u32;
            blk.store("out", lane.clone() * 4u32, Expr::load("scratch", rotated));
            blk.store(
                "out",
                lane.clone() * 4u32 + 1u32,
                Expr::load("scratch", 3u32) + Expr::load("scratch", lane.clone() + 100u32),
            );
            blk.store(
                "out",
                lane.clone() * 4u32 + 2u32,
                Expr::load("bytes", lane.clone()) + Expr::load("bytes", 1u32),
            );
        })
        .build();
    let out = run_words(
        &program,
        &[&[0; 64]],
        &DispatchConfig::linear(1).with_fixpoint_iterations(2),
    );
    assert_eq!(
        out[0],
        [
            // Lane 0 reads its element 1; nothing past the end; byte 0 holds 0xff and
            // byte 1 is lane 0's own, never written.
            1,
            0,
            0xff,
            0, //
            12,
            0,
            0xff + 0xff,
            0, // lane 1 wrote byte 1 itself
            20,
            0,
            0,
            0, // lanes 2 and 3 store past the byte array's end
            31,
            0,
            0,
            0,
        ]
    );
}

/// Locks out workgroup scans in another order than the local linear id (`x + sx *
/// y`), across workgroups, or off by one between inclusive and exclusive: a 2 x 2
/// workgroup, two of them, every operation and kind, against prefixes written out
/// by hand.
#[test]
fn workgroup_scans_follow_local_linear_order_within_each_workgroup() {
    let ops = [ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max];
    let kinds = [ScanKind::Inclusive, ScanKind::Exclusive];
    let program = Program::builder([2, 2, 1])
        .buffer(
            "values",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Static(8),
        )
        .buffer(
            "out",
            1,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Static(48),
        )
        .body(|blk| {
            let local = Expr::local_id(Axis::X) + Expr::local_id(Axis::Y) * 2u32;
            let thread = blk.let_("thread", Expr::workgroup_id(Axis::X) * 4u32 + local);
            let value = blk.let_("value", Expr::load("values", thread.clone()));
            for (k, (op, kind)) in ops
                .iter()
                .flat_map(|&op| kinds.iter().map(move |&kind| (op, kind)))
                .enumerate()
            {
                let scanned = blk.workgroup_scan(format!("s{k}"), op, kind, value.clone());
                blk.store("out", thread.clone() + 8 * k as u32, scanned);
            }
        })
        .build();
    let values = [3, 1, 4, 1, 5, 9, 2, 6];
    let out = run_words(
        &program,
        &[&bytes_of(&values), &[0; 192]],
        &DispatchConfig::linear(2),
    );
    let max = u32::MAX;
    assert_eq!(
        out[0],
        [
            3, 4, 8, 9, 5, 14, 16, 22, // inclusive sum
            0, 3, 4, 8, 0, 5, 14, 16, // exclusive sum
            3, 1, 1, 1, 5, 5, 2, 2, // inclusive min
            max, 3, 1, 1, max, 5, 5, 2, // exclusive min
            3, 3, 4, 4, 5, 9, 9, 9, // inclusive max
            0, 3, 3, 4, 0, 5, 9, 9, // exclusive max
        ]
    );
}

/// Locks out a subgroup scan that crosses subgroups or ignores its kind: 8 lanes in
/// subgroups of 4 (`ReferenceOptions::subgroup_size`), lane `i` holding `i + 1`.
#[test]
fn subgroup_scans_stay_within_their_subgroup() {
    let program = Program::builder([8, 1, 1])
        .buffer(
            "out",
            0,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Static(16),
        )
        .body(|blk| {
            let lane = blk.let_("lane", Expr::local_id(Axis::X));
            for (k, kind) in [ScanKind::Inclusive, ScanKind::Exclusive]
                .into_iter()
                .enumerate()
            {
                let scanned = Expr::SubgroupScan {
                    op: ReduceOp::Sum,
                    kind,
                    value: Box::new(lane.clone() + 1u32),
                };
                blk.store("out", lane.clone() + 8 * k as u32, scanned);
            }
        })
        .build();
    let options = ReferenceOptions {
        subgroup_size: 4,
        ..ReferenceOptions::default()
    };
    let out =
        reference::run_with_options(&program, &[&[0; 64]], &DispatchConfig::linear(1), &options)
            .unwrap();
    assert_eq!(
        words_of(&out[0]),
        [1, 3, 6, 10, 5, 11, 18, 26, 0, 1, 3, 6, 0, 5, 11, 18]
    );
}

/// Locks out a workgroup order option that is ignored or that drops lanes: each
/// of four workgroups of two threads sets its flag (thread 0, then a fence, a
/// no-op here) and every thread counts the flags it sees. In lockstep all four
/// are set before anyone counts; run in turn the workgroup `g` sees `g + 1`
/// (ascending) or `4 - g` (descending).
#[test]
fn workgroups_run_in_lockstep_or_in_turn() {
    let program = Program::builder([2, 1, 1])
        .buffer(
            "flags",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(4),
        )
        .buffer(
            "seen",
            1,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(8),
        )
        .body(|blk| {
            let group = blk.let_("group", Expr::workgroup_id(Axis::X));
            blk.if_(Expr::local_id(Axis::X).equals(0u32), |blk| {
                blk.atomic(AtomicOp::Or, "flags", group.clone(), 1u32);
                blk.fence();
            });
            let seen = (0..4u32)
                .map(|flag| Expr::load("flags", flag))
                .reduce(|a, b| a + b)
                .expect("four flags");
            blk.store("seen", Expr::global_id(Axis::X), seen);
        })
        .build();
    for (order, expected) in [
        (WorkgroupOrder::Lockstep, [4, 4, 4, 4, 4, 4, 4, 4]),
        (WorkgroupOrder::InTurn, [1, 1, 2, 2, 3, 3, 4, 4]),
        (WorkgroupOrder::InTurnReversed, [4, 4, 3, 3, 2, 2, 1, 1]),
    ] {
        let options = ReferenceOptions {
            workgroup_order: order,
            ..ReferenceOptions::default()
        };
        let out = reference::run_with_options(
            &program,
            &[&[0; 16], &[0; 32]],
            &DispatchConfig::linear(4),
            &options,
        )
        .unwrap();
        assert_eq!(words_of(&out[1]), expected, "{order:?}");
    }
}

/// Locks out a `while` loop with one trip count for every lane (or one that
/// re-enters finished lanes): each lane counts its own Collatz steps, 0 to 16 of
/// them, and a lane whose condition fails first waits for the others.
#[test]
fn while_loops_run_each_lane_until_its_condition_fails() {
    let program = Program::builder([8, 1, 1])
        .buffer(
            "steps",
            0,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Static(8),
        )
        .body(|blk| {
            let i = blk.let_("i", Expr::global_id(Axis::X));
            let n = blk.let_mut("n", i.clone());
            let steps = blk.let_mut("count", 0u32);
            blk.while_(n.clone().greater_than(1u32), |blk| {
                blk.if_else(
                    n.clone().rem(2u32).equals(0u32),
                    |blk| {
                        blk.assign("n", n.clone() / 2u32);
                    },
                    |blk| {
                        blk.assign("n", n.clone() * 3u32 + 1u32);
                    },
                );
                blk.assign("count", steps.clone() + 1u32);
            });
            blk.store("steps", i, steps);
        })
        .build();
    let out = run_words(&program, &[&[0; 32]], &DispatchConfig::linear(1));
    // 3: 10 5 16 8 4 2 1; 6: 3 then 3's 7; 7: 22 11 34 17 52 26 13 40 20 10 5 16 8 4 2 1.
    assert_eq!(out[0], [0, 0, 1, 7, 2, 5, 8, 16]);
}

/// Locks out a `break` or `continue` that leaves more than its innermost loop, that
/// skips too little or too much, or whose lanes are lost to the loops around: lane
/// `i` skips `k == i` (`continue`), stops the outer loop at `k == 3` (`break`, tested
/// after the `continue`, so lane 3 goes on to `k == 4`), and the inner `while true`
/// skips `j == 1` and ends at `j > k`.
#[test]
fn break_and_continue_leave_only_their_innermost_loop() {
    let program = Program::builder([5, 1, 1])
        .buffer(
            "out",
            0,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Static(5),
        )
        .body(|blk| {
            let i = blk.let_("i", Expr::global_id(Axis::X));
            let total = blk.let_mut("total", 0u32);
            blk.loop_("k", 0u32, 5u32, |blk, k| {
                blk.if_(k.clone().equals(i.clone()), |blk| {
                    blk.continue_();
                });
                blk.if_(k.clone().equals(3u32), |blk| {
                    blk.break_();
                });
                let j = blk.let_mut("j", 0u32);
                blk.while_(true, |blk| {
                    blk.assign("j", j.clone() + 1u32);
                    blk.if_(j.clone().greater_than(k.clone()), |blk| {
                        blk.break_();
                    });
                    blk.if_(j.clone().equals(1u32), |blk| {
                        blk.continue_();
                    });
                    blk.assign("total", total.clone() + j.clone());
                });
                blk.assign("total", total.clone() + (k + 1u32) * 100u32);
            });
            blk.store("out", i, total);
        })
        .build();
    let out = run_words(&program, &[&[0; 20]], &DispatchConfig::linear(1));
    // k = 0, 1, 2 add 100, 200 and 2 + 300; k = 4 adds 2 + 3 + 4 + 500.
    assert_eq!(out[0], [200 + 302, 100 + 302, 100 + 200, 602 + 509, 602]);
}

/// Locks out a `return` inside a `while` loop that only leaves the loop, and a loop
/// that keeps running lanes that returned: lane `i` returns in iteration `i`.
#[test]
fn return_inside_a_while_loop_ends_the_thread() {
    let program = Program::builder([4, 1, 1])
        .buffer(
            "iterations",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(4),
        )
        .buffer(
            "after",
            1,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Static(4),
        )
        .body(|blk| {
            let i = blk.let_("i", Expr::global_id(Axis::X));
            let j = blk.let_mut("j", 0u32);
            blk.while_(j.clone().less_than(3u32), |blk| {
                blk.if_(j.clone().equals(i.clone()), |blk| {
                    blk.return_();
                });
                blk.atomic(AtomicOp::Add, "iterations", i.clone(), 1u32);
                blk.assign("j", j.clone() + 1u32);
            });
            blk.store("after", i, 7u32);
        })
        .build();
    let out = run_words(&program, &[&[0; 16], &[0; 16]], &DispatchConfig::linear(1));
    assert_eq!(out[0], [0, 1, 2, 3]);
    assert_eq!(out[1], [0, 0, 0, 7]);
}

/// A one-thread (or one runaway lane among 64) `while true` loop.
fn runaway_while(threads: u32) -> Program {
    Program::builder([threads, 1, 1])
        .buffer(
            "out",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(1),
        )
        .body(|blk| {
            let n = blk.let_mut("n", 0u32);
            blk.while_(Expr::global_id(Axis::X).equals(0u32), |blk| {
                blk.assign("n", n.clone() + 1u32);
            });
            blk.store("out", 0u32, n);
        })
        .build()
}

/// Locks out a runaway `while` loop hanging the interpreter: one runaway lane (alone
/// or among 64) stops at the work cap with a `Fix:` error, however few lanes it
/// runs on (each iteration is charged as 32 lanes at least, so the default cap stops
/// a one-thread loop in about a second of a release build; here a smaller cap keeps
/// the debug test fast). Negative control: the cap's arithmetic lets a loop that
/// ends finish.
#[test]
fn runaway_while_loops_stop_at_the_work_cap() {
    let options = ReferenceOptions {
        max_work: 1 << 22,
        ..ReferenceOptions::default()
    };
    let config = DispatchConfig::linear(1);
    for threads in [1, 64] {
        assert_fix(
            reference::run_with_options(&runaway_while(threads), &[&[0; 4]], &config, &options),
            &["max_work"],
        );
    }
    // Lane 0 runs away; lanes 1..64 do not enter the loop. The cost of an iteration
    // is counted (1 iteration + 1 condition of 3 nodes + 1 assignment of 3 nodes,
    // each at least 32), so 1,000 iterations of the same shape fit a cap of 2^22.
    let ends = Program::builder([1, 1, 1])
        .buffer(
            "out",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(1),
        )
        .body(|blk| {
            let n = blk.let_mut("n", 0u32);
            blk.while_(n.clone().less_than(1000u32), |blk| {
                blk.assign("n", n.clone() + 1u32);
            });
            blk.store("out", 0u32, n);
        })
        .build();
    let (out, stats) = reference::run_with_stats(&ends, &[&[0; 4]], &config, &options).unwrap();
    assert_eq!(words_of(&out[0]), [1000]);
    // Per iteration: the iteration, 3 condition nodes, the assignment and its 3
    // nodes (8); then the failed test (4), the kernel run (1), `let n` and its
    // literal (2), the `while` node (1) and the store with its 2 nodes (3).
    assert_eq!(stats.work(), 32 * (1000 * 8 + 4 + 1 + 2 + 1 + 3));
}

/// Locks out an iteration cap the interpreter ignores while the GPU traps (or the
/// other way round): with `CodegenOptions::max_loop_iterations = Some(10)`, a loop of
/// 10 iterations finishes and one of 11 is a `Fix:` error naming the cap; bounded
/// `for` loops are not capped.
#[test]
fn while_loops_stop_at_the_codegen_iteration_cap() {
    let program = |iterations: u32| {
        Program::builder([4, 1, 1])
            .buffer(
                "out",
                0,
                Access::WriteOnly,
                ElemType::U32,
                BufferCount::Static(4),
            )
            .body(|blk| {
                let i = blk.let_("i", Expr::global_id(Axis::X));
                let n = blk.let_mut("n", 0u32);
                // Lane 3 runs `iterations` iterations, the others fewer.
                blk.while_(n.clone().less_than(i.clone() + (iterations - 3)), |blk| {
                    blk.assign("n", n.clone() + 1u32);
                });
                blk.loop_("k", 0u32, 100u32, |blk, _| {
                    blk.assign("n", n.clone() + 1u32);
                });
                blk.store("out", i, n);
            })
            .build()
    };
    let config = DispatchConfig::linear(1)
        .with_codegen(CodegenOptions::new().with_max_loop_iterations(Some(10)));
    let out = run_words(&program(10), &[&[0; 16]], &config);
    assert_eq!(out[0], [107, 108, 109, 110]);
    assert_fix(
        reference::run(&program(11), &[&[0; 16]], &config),
        &["max_loop_iterations", "10 iterations", "trap"],
    );
    // Negative control: without the cap the longer loop runs.
    let out = run_words(&program(11), &[&[0; 16]], &DispatchConfig::linear(1));
    assert_eq!(out[0], [108, 109, 110, 111]);
}

/// Locks out `Return` that only leaves the current block (a returned lane must
/// execute nothing more in the kernel, also from inside a loop).
#[test]
fn early_return_ends_the_thread() {
    let program = Program::builder([6, 1, 1])
        .buffer(
            "iterations",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(6),
        )
        .buffer(
            "after",
            1,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Static(6),
        )
        .buffer(
            "touched",
            2,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(6),
        )
        .body(|blk| {
            let i = blk.let_("i", Expr::global_id(Axis::X));
            blk.if_(i.clone().equals(5u32), |blk| {
                blk.return_();
            });
            blk.loop_("j", 0u32, 4u32, |blk, j| {
                // First statement of the body: a returned lane must not reach it again.
                blk.atomic(AtomicOp::Add, "touched", i.clone(), 1u32);
                blk.if_(j.equals(i.clone()), |blk| {
                    blk.return_();
                });
                blk.atomic(AtomicOp::Add, "iterations", i.clone(), 1u32);
            });
            blk.store("after", i, 7u32);
        })
        .build();
    let out = run_words(
        &program,
        &[&[0; 24], &[0; 24], &[0; 24]],
        &DispatchConfig::linear(1),
    );
    // Lane i returns at iteration i (i < 4) after i iterations; lane 4 finishes all 4;
    // lane 5 returned before the loop.
    assert_eq!(out[0], [0, 1, 2, 3, 4, 0]);
    assert_eq!(out[1], [0, 0, 0, 0, 7, 0]);
    // Lane i (i < 4) touches iterations 0..=i, then returns.
    assert_eq!(out[2], [1, 2, 3, 4, 4, 0]);
}

/// Locks out shared memory that is not per workgroup, not zeroed, or read before
/// every thread of the workgroup wrote it (thread i reads what thread n-1-i wrote).
#[test]
fn barrier_and_workgroup_memory_exchange_values() {
    let program = Program::builder([8, 1, 1])
        .buffer(
            "out",
            0,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Static(16),
        )
        .buffer(
            "shared",
            1,
            Access::Workgroup,
            ElemType::U32,
            BufferCount::Static(9),
        )
        .body(|blk| {
            let local = blk.let_("l", Expr::local_id(Axis::X));
            let group = blk.let_("w", Expr::workgroup_id(Axis::X));
            blk.store("shared", local.clone(), local.clone() * 10u32 + group);
            blk.barrier();
            let mirrored = Expr::load("shared", Expr::u32(7) - local.clone());
            // shared[8] is never written: still zero.
            blk.store(
                "out",
                Expr::global_id(Axis::X),
                mirrored + Expr::load("shared", 8u32),
            );
        })
        .build();
    let out = run_words(&program, &[&[0; 64]], &DispatchConfig::linear(2));
    assert_eq!(
        out[0],
        [70, 60, 50, 40, 30, 20, 10, 0, 71, 61, 51, 41, 31, 21, 11, 1]
    );
}

fn reduce_program(workgroup: u32, count: u32) -> Program {
    Program::builder([workgroup, 1, 1])
        .buffer(
            "per_group",
            0,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Static(6),
        )
        .buffer(
            "seen",
            1,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Static(count),
        )
        .body(|blk| {
            let value = blk.let_("v", Expr::global_id(Axis::X) + 1u32);
            let sum = blk.workgroup_reduce("sum", ReduceOp::Sum, value.clone());
            let min = blk.workgroup_reduce("min", ReduceOp::Min, value.clone());
            let max = blk.workgroup_reduce("max", ReduceOp::Max, value);
            let group = blk.let_("w", Expr::workgroup_id(Axis::X));
            blk.if_(Expr::local_id(Axis::X).equals(0u32), |blk| {
                blk.store("per_group", group.clone() * 3u32, sum.clone());
                blk.store("per_group", group.clone() * 3u32 + 1u32, min);
                blk.store("per_group", group * 3u32 + 2u32, max);
            });
            // Every thread sees its workgroup's sum.
            blk.store("seen", Expr::global_id(Axis::X), sum);
        })
        .build()
}

/// Locks out reductions over the wrong set of threads (one workgroup's threads
/// leaking into another's, or only a subgroup's) and results visible to one thread only.
#[test]
fn workgroup_reduce_sum_min_max() {
    // Two workgroups of 64; values 1..=64 and 65..=128.
    let out = run_words(
        &reduce_program(64, 128),
        &[&[0; 24], &[0; 512]],
        &DispatchConfig::linear(2),
    );
    assert_eq!(out[0], [2080, 1, 64, 6176, 65, 128]);
    assert!(out[1][..64].iter().all(|&s| s == 2080));
    assert!(out[1][64..].iter().all(|&s| s == 6176));
    // Two workgroups of 48 (not a multiple of the warp size): 1..=48 and 49..=96.
    let out = run_words(
        &reduce_program(48, 96),
        &[&[0; 24], &[0; 384]],
        &DispatchConfig::linear(2),
    );
    assert_eq!(out[0], [1176, 1, 48, 3480, 49, 96]);
    assert!(out[1][..48].iter().all(|&s| s == 1176));
    assert!(out[1][48..].iter().all(|&s| s == 3480));
}

/// Locks out atomics that lose updates when many lanes hit one element in one
/// statement, and min/max/or applied as something else.
#[test]
fn atomics_build_a_histogram() {
    let program = Program::builder([16, 1, 1])
        .buffer(
            "hist",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(4),
        )
        .buffer(
            "stats",
            1,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(3),
        )
        .body(|blk| {
            let i = blk.let_("i", Expr::global_id(Axis::X));
            blk.atomic(AtomicOp::Add, "hist", i.clone() % 4u32, 1u32);
            blk.atomic(AtomicOp::Min, "stats", 0u32, i.clone() + 3u32);
            blk.atomic(AtomicOp::Max, "stats", 1u32, i.clone() * 2u32);
            blk.atomic(AtomicOp::Or, "stats", 2u32, Expr::u32(1) << i);
            // Out of range (bounds checks on): nothing happens.
            blk.atomic(AtomicOp::Add, "hist", 4u32, 1u32);
        })
        .build();
    let out = run_words(
        &program,
        &[&bytes_of(&[100, 0, 0, 0]), &bytes_of(&[50, 7, 0x1_0000])],
        &DispatchConfig::linear(1),
    );
    assert_eq!(out[0], [104, 4, 4, 4]);
    assert_eq!(out[1], [3, 30, 0x1_FFFF]);
}

/// Locks out grid sync that only synchronises a workgroup: phase 2 reads an
/// element another workgroup wrote in phase 1.
#[test]
fn grid_sync_makes_other_workgroups_writes_visible() {
    let program = Program::builder([4, 1, 1])
        .buffer(
            "data",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(16),
        )
        .buffer(
            "out",
            1,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Static(16),
        )
        .body(|blk| {
            let g = blk.let_("g", Expr::global_id(Axis::X));
            blk.store("data", g.clone(), g.clone() * g.clone());
            blk.grid_sync();
            blk.store("out", g.clone(), Expr::load("data", (g + 4u32) % 16u32));
        })
        .build();
    let out = run_words(&program, &[&[0; 64], &[0; 64]], &DispatchConfig::linear(4));
    assert_eq!(
        out[1],
        [16, 25, 36, 49, 64, 81, 100, 121, 144, 169, 196, 225, 0, 1, 4, 9]
    );
}

/// Locks out fixpoint iterations that restart from the inputs instead of the
/// previous run's buffers, or that keep workgroup memory between runs.
#[test]
fn fixpoint_iterations_rerun_over_the_same_buffers() {
    let program = Program::builder([4, 1, 1])
        .buffer(
            "x",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(4),
        )
        .buffer(
            "runs",
            1,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(1),
        )
        .body(|blk| {
            let i = blk.let_("i", Expr::global_id(Axis::X));
            blk.store("x", i.clone(), Expr::load("x", i.clone()) * 2u32 + 1u32);
            blk.atomic(AtomicOp::Add, "runs", 0u32, 1u32);
        })
        .build();
    let config = DispatchConfig::linear(1).with_fixpoint_iterations(3);
    let out = run_words(
        &program,
        &[&bytes_of(&[0, 1, 2, 3]), &bytes_of(&[10])],
        &config,
    );
    // x -> 2x + 1 three times: 8x + 7.
    assert_eq!(out[0], [7, 15, 23, 31]);
    // 4 threads add 1 per run, starting from the input 10.
    assert_eq!(out[1], [22]);
}

/// Locks out workgroup memory carried from one fixpoint run to the next.
#[test]
fn workgroup_memory_is_zeroed_for_every_fixpoint_run() {
    let program = Program::builder([2, 1, 1])
        .buffer(
            "seen",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(3),
        )
        .buffer(
            "run",
            1,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(1),
        )
        .buffer(
            "shared",
            2,
            Access::Workgroup,
            ElemType::U32,
            BufferCount::Static(1),
        )
        .body(|blk| {
            blk.atomic(AtomicOp::Add, "shared", 0u32, 1u32);
            blk.barrier();
            blk.if_(Expr::local_id(Axis::X).equals(0u32), |blk| {
                let r = blk.let_("r", Expr::load("run", 0u32));
                blk.store("seen", r.clone(), Expr::load("shared", 0u32));
                blk.store("run", 0u32, r + 1u32);
            });
        })
        .build();
    let config = DispatchConfig::linear(1).with_fixpoint_iterations(3);
    let out = run_words(&program, &[&[0; 12], &[0; 4]], &config);
    assert_eq!(out[0], [2, 2, 2]);
    assert_eq!(out[1], [3]);
}

/// Locks out builtins computed with the wrong axis order or a wrong linearisation.
#[test]
fn builtins_in_three_dimensions() {
    let program = Program::builder([2, 2, 1])
        .buffer(
            "out",
            0,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Static(16),
        )
        .buffer(
            "count",
            1,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Static(3),
        )
        .body(|blk| {
            let index = Expr::global_id(Axis::X)
                + Expr::u32(4)
                    * (Expr::global_id(Axis::Y) + Expr::u32(2) * Expr::global_id(Axis::Z));
            let value = Expr::workgroup_id(Axis::X) * 1000u32
                + Expr::workgroup_id(Axis::Y) * 10000u32
                + Expr::workgroup_id(Axis::Z) * 100u32
                + Expr::local_id(Axis::X) * 10u32
                + Expr::local_id(Axis::Y)
                + Expr::local_id(Axis::Z) * 100000u32;
            blk.store("out", index, value);
            blk.store("count", 0u32, Expr::workgroup_count(Axis::X));
            blk.store("count", 1u32, Expr::workgroup_count(Axis::Y));
            blk.store("count", 2u32, Expr::workgroup_count(Axis::Z));
        })
        .build();
    let out = run_words(
        &program,
        &[&[0; 64], &[0; 12]],
        &DispatchConfig::new([2, 1, 2]),
    );
    assert_eq!(
        out[0],
        [
            0, 10, 1000, 1010, 1, 11, 1001, 1011, //
            100, 110, 1100, 1110, 101, 111, 1101, 1111
        ]
    );
    assert_eq!(out[1], [2, 1, 2]);
}

/// Locks out lockstep execution that is not statement by statement: a value
/// stored by every lane in one statement is visible to all lanes in the next.
#[test]
fn a_store_is_visible_to_later_statements() {
    let program = Program::builder([4, 1, 1])
        .buffer(
            "data",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(4),
        )
        .buffer(
            "out",
            1,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Static(4),
        )
        .body(|blk| {
            let i = blk.let_("i", Expr::global_id(Axis::X));
            blk.store("data", i.clone(), i.clone() + 10u32);
            blk.barrier();
            blk.store("out", i.clone(), Expr::load("data", (i + 1u32) % 4u32));
        })
        .build();
    let out = run_words(&program, &[&[0; 16], &[0; 16]], &DispatchConfig::linear(1));
    assert_eq!(out[1], [11, 12, 13, 10]);
}

fn subgroup_program(workgroup: u32, lanes: u32) -> Program {
    Program::builder([workgroup, 1, 1])
        .buffer(
            "shuffled",
            0,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Static(lanes),
        )
        .buffer(
            "reduced",
            1,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Static(lanes),
        )
        .buffer(
            "far",
            2,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Static(lanes),
        )
        .body(|blk| {
            let g = blk.let_("g", Expr::global_id(Axis::X));
            let shuffle = |mask| Expr::SubgroupShuffleXor {
                value: Box::new(g.clone() * 10u32),
                lane_mask: mask,
            };
            blk.store("shuffled", g.clone(), shuffle(1));
            blk.store("far", g.clone(), shuffle(2));
            blk.store(
                "reduced",
                g.clone(),
                Expr::SubgroupReduce {
                    op: ReduceOp::Sum,
                    value: Box::new(g.clone()),
                },
            );
        })
        .build()
}

fn run_subgroups(program: &Program, lanes: usize, workgroups: u32) -> Vec<Vec<u32>> {
    let options = ReferenceOptions {
        subgroup_size: 4,
        limits: Limits {
            subgroup_size: 4,
            ..Limits::default()
        },
        ..ReferenceOptions::default()
    };
    let zeros = vec![0u8; 4 * lanes];
    reference::run_with_options(
        program,
        &[&zeros, &zeros, &zeros],
        &DispatchConfig::linear(workgroups),
        &options,
    )
    .unwrap_or_else(|e| panic!("{e}"))
    .iter()
    .map(|b| words_of(b))
    .collect()
}

/// Locks out subgroups formed across workgroups or with the wrong lane numbering
/// in lowered programs (shuffle-xor partners, per-subgroup reduction).
#[test]
fn subgroup_shuffle_xor_and_reduce() {
    // Two workgroups of 8 with subgroups of 4: lanes {0..4}, {4..8}, {8..12}, {12..16}.
    let out = run_subgroups(&subgroup_program(8, 16), 16, 2);
    assert_eq!(
        out[0],
        [10, 0, 30, 20, 50, 40, 70, 60, 90, 80, 110, 100, 130, 120, 150, 140]
    );
    assert_eq!(
        out[1],
        [6, 6, 6, 6, 22, 22, 22, 22, 38, 38, 38, 38, 54, 54, 54, 54]
    );
    assert_eq!(
        out[2],
        [20, 30, 0, 10, 60, 70, 40, 50, 100, 110, 80, 90, 140, 150, 120, 130]
    );
}

/// Locks out garbage (or a panic) when a shuffle partner does not exist: with
/// workgroups of 6 and subgroups of 4, the second subgroup has only lanes 0 and 1,
/// so a shuffle by 2 returns each lane's own value (the documented fallback).
#[test]
fn subgroup_shuffle_without_a_partner_returns_the_own_value() {
    let out = run_subgroups(&subgroup_program(6, 12), 12, 2);
    assert_eq!(out[0], [10, 0, 30, 20, 50, 40, 70, 60, 90, 80, 110, 100]);
    assert_eq!(out[1], [6, 6, 6, 6, 9, 9, 30, 30, 30, 30, 21, 21]);
    assert_eq!(out[2], [20, 30, 0, 10, 40, 50, 80, 90, 60, 70, 100, 110]);
}

/// The host-cost fixture with K = 8: `acc0 = in[0]; accK = acc(K-1) + K`.
/// Locks out variable slots being reused while still live (16k-node fixtures put
/// every acc in one scope).
#[test]
fn host_cost_fixture_program_gives_in_plus_36() {
    let k = 8;
    // The shared fixture (src/fixtures.rs) with K scratch buffers and a K-link chain.
    let program = vyre_cuda::fixtures::host_cost_fixture(k + 2, k);
    let mut inputs: Vec<Vec<u8>> = vec![bytes_of(&[5, 0, 0, 0]), vec![0; 16]];
    inputs.extend((0..k).map(|_| vec![0u8; 16]));
    let inputs: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
    let out = run_words(&program, &inputs, &DispatchConfig::linear(1));
    assert_eq!(out.len(), 1 + k as usize);
    assert_eq!(out[0], [41, 0, 0, 0]);
}

/// Outputs are the read-write and write-only buffers in ascending binding order,
/// whatever the declaration order; read-only buffers are not returned.
#[test]
fn outputs_come_back_in_binding_order() {
    let program = Program::builder([1, 1, 1])
        .buffer(
            "late",
            5,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Static(1),
        )
        .buffer(
            "input",
            1,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Static(1),
        )
        .buffer(
            "early",
            2,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|blk| {
            blk.store("late", 0u32, Expr::load("input", 0u32) + 1u32);
            blk.store("early", 0u32, Expr::length("early"));
        })
        .build();
    // Inputs in binding order: input (1), early (2), late (5).
    let out = run_words(
        &program,
        &[&bytes_of(&[41]), &bytes_of(&[9, 9, 9]), &bytes_of(&[77])],
        &DispatchConfig::linear(1),
    );
    assert_eq!(out, [vec![3, 9, 9], vec![42]]);
}

fn one_buffer_program() -> Program {
    Program::builder([1, 1, 1])
        .entry_op_id("one_buffer")
        .buffer(
            "fixed",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(2),
        )
        .buffer(
            "bytes",
            1,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|blk| {
            blk.store("fixed", 0u32, Expr::length("bytes"));
        })
        .build()
}

fn assert_fix(result: Result<Vec<Vec<u8>>, reference::ReferenceError>, needles: &[&str]) {
    let message = result.expect_err("must be rejected").to_string();
    assert!(message.starts_with("Fix:"), "{message}");
    for needle in needles {
        assert!(message.contains(needle), "{message} lacks {needle}");
    }
}

/// Locks out panics and silent acceptance on malformed requests. Negative control:
/// the well-formed request succeeds, so each error comes from the one thing changed.
#[test]
fn bad_requests_are_errors_that_say_how_to_fix_them() {
    let program = one_buffer_program();
    let good_fixed = [0u8; 8];
    let good_runtime = [0u8; 12];
    let config = DispatchConfig::linear(1);
    let out = reference::run(&program, &[&good_fixed, &good_runtime], &config).unwrap();
    assert_eq!(words_of(&out[0]), [3, 0]);

    assert_fix(
        reference::run(&program, &[&good_fixed], &config),
        &["'bytes'", "2 input"],
    );
    assert_fix(
        reference::run(&program, &[&[0u8; 12], &good_runtime], &config),
        &["'fixed'", "8 bytes"],
    );
    assert_fix(
        reference::run(&program, &[&good_fixed, &[0u8; 10]], &config),
        &["'bytes'", "multiple of 4"],
    );
    assert_fix(
        reference::run(
            &program,
            &[&good_fixed, &good_runtime],
            &DispatchConfig::new([1, 0, 1]),
        ),
        &["workgroups"],
    );
    assert_fix(
        reference::run(
            &program,
            &[&good_fixed, &good_runtime],
            &config.clone().with_fixpoint_iterations(0),
        ),
        &["fixpoint"],
    );
    assert_fix(
        reference::run(
            &program,
            &[&good_fixed, &good_runtime],
            &DispatchConfig::new([65536, 65536, 2]),
        ),
        &["threads"],
    );
    let options = ReferenceOptions {
        subgroup_size: 0,
        ..ReferenceOptions::default()
    };
    assert_fix(
        reference::run_with_options(&program, &[&good_fixed, &good_runtime], &config, &options),
        &["subgroup_size"],
    );
}

/// Locks out panics on programs the validator should have rejected (the
/// interpreter re-checks what it relies on): unknown names, type mismatches,
/// stores to read-only buffers. The exact wording belongs to whichever layer
/// rejects first, so only the `Fix:` prefix and the offending name are checked.
#[test]
fn invalid_programs_are_errors_not_panics() {
    let base = || {
        Program::builder([1, 1, 1])
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
    };
    let inputs: [&[u8]; 2] = [&[0; 4], &[0; 4]];
    let config = DispatchConfig::linear(1);
    let cases: Vec<(Program, &str)> = vec![
        (
            base()
                .body(|b| {
                    b.store("rw", 0u32, Expr::var("ghost"));
                })
                .build(),
            "ghost",
        ),
        (
            base()
                .body(|b| {
                    b.store("nowhere", 0u32, 1.0f32);
                })
                .build(),
            "nowhere",
        ),
        (
            base()
                .body(|b| {
                    b.store("rw", 0u32, 1u32);
                })
                .build(),
            "rw",
        ),
        (
            base()
                .body(|b| {
                    b.store("ro", 0u32, 1u32);
                })
                .build(),
            "ro",
        ),
        (
            base()
                .body(|b| {
                    b.assign("x", 1u32);
                })
                .build(),
            "x",
        ),
        (
            base()
                .body(|b| {
                    b.let_("x", 1u32);
                    b.assign("x", 2u32);
                })
                .build(),
            "x",
        ),
        (
            base()
                .body(|b| {
                    b.let_("x", Expr::u32(1) + Expr::i32(1));
                })
                .build(),
            "Fix:",
        ),
        (
            base()
                .body(|b| {
                    b.if_(1u32, |_| {});
                })
                .build(),
            "Fix:",
        ),
        (
            base()
                .body(|b| {
                    b.atomic(AtomicOp::Add, "rw", 0u32, 1u32);
                })
                .build(),
            "rw",
        ),
        (
            base()
                .body(|b| {
                    b.if_(true, |b| {
                        b.let_("inner", 1u32);
                    });
                    b.store("rw", 0u32, Expr::var("inner").cast(ScalarType::F32));
                })
                .build(),
            "inner",
        ),
        (
            base()
                .body(|b| {
                    b.let_("twice", 1u32);
                    b.if_(true, |b| {
                        b.let_("twice", 2u32);
                    });
                })
                .build(),
            "twice",
        ),
    ];
    for (program, needle) in cases {
        assert_fix(reference::run(&program, &inputs, &config), &[needle]);
    }
}

/// Locks out a loop of ~4 billion iterations hanging the test suite: the lane-step
/// cap stops it with an error. Negative control: a higher cap lets a short loop finish.
#[test]
fn runaway_loops_hit_the_lane_step_cap() {
    let program = Program::builder([2, 1, 1])
        .buffer(
            "out",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(1),
        )
        .body(|blk| {
            let n = Expr::load("out", 0u32);
            blk.loop_("j", 0u32, n, |blk, _| {
                blk.atomic(AtomicOp::Add, "out", 0u32, 0u32);
            });
        })
        .build();
    let options = ReferenceOptions {
        max_work: 20_000,
        ..ReferenceOptions::default()
    };
    let config = DispatchConfig::linear(1);
    assert_fix(
        reference::run_with_options(&program, &[&bytes_of(&[u32::MAX])], &config, &options),
        &["max_work"],
    );
    // (1 kernel run + 1 loop node + 3 bound expressions + 100 iterations * (1
    // iteration + 1 atomic + 2 operands)) * 32 (2 lanes are charged as 32) = 12,960
    // units of work: under the cap.
    let out =
        reference::run_with_options(&program, &[&bytes_of(&[100])], &config, &options).unwrap();
    assert_eq!(words_of(&out[0]), [100]);
}

/// Throughput on a tokenizer-sized grid (262,144 threads). Prints lane-ops per
/// second; asserts only the result. Run with
/// `cargo test --release --test reference -- --ignored --nocapture throughput`.
#[test]
#[ignore = "measurement: run in release with --nocapture"]
fn reference_throughput_262144_threads() {
    let threads: u32 = 262_144;
    let program = Program::builder([256, 1, 1])
        .buffer(
            "text",
            0,
            Access::ReadOnly,
            ElemType::U8,
            BufferCount::Runtime,
        )
        .buffer(
            "classes",
            1,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "counts",
            2,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|blk| {
            let i = blk.let_("i", Expr::global_id(Axis::X));
            let c = blk.let_("c", Expr::load("text", i.clone()));
            let class = blk.let_mut("class", 0u32);
            blk.if_else(
                c.clone()
                    .greater_equal(0x61u32)
                    .and(c.clone().less_equal(0x7Au32)),
                |blk| {
                    blk.assign("class", 1u32);
                },
                |blk| {
                    blk.if_(c.clone().equals(0x20u32), |blk| {
                        blk.assign("class", 2u32);
                    });
                },
            );
            let h = blk.let_mut("h", c.clone());
            blk.loop_("k", 0u32, 4u32, |blk, k| {
                blk.assign("h", (h.clone() * 31u32 + k) ^ (h.clone() >> 3u32));
            });
            blk.store(
                "classes",
                i.clone(),
                class.clone() + (h.clone() & 0xFF00u32),
            );
            let boundary = blk.let_("b", class.equals(2u32).cast(ScalarType::U32));
            let total = blk.workgroup_reduce("total", ReduceOp::Sum, boundary);
            blk.if_(Expr::local_id(Axis::X).equals(0u32), |blk| {
                blk.store("counts", Expr::workgroup_id(Axis::X), total);
            });
        })
        .build();
    let text: Vec<u8> = (0..threads)
        .map(|i| b"the quick brown fox "[(i % 20) as usize])
        .collect();
    let classes = vec![0u8; 4 * threads as usize];
    let counts = vec![0u8; 4 * (threads / 256) as usize];
    let config = DispatchConfig::linear(threads / 256);
    let options = ReferenceOptions::default();
    let mut best = f64::INFINITY;
    let mut stats = Default::default();
    let mut outputs = Vec::new();
    for _ in 0..5 {
        let start = std::time::Instant::now();
        let (out, s) =
            reference::run_with_stats(&program, &[&text, &classes, &counts], &config, &options)
                .unwrap();
        best = best.min(start.elapsed().as_secs_f64());
        stats = s;
        outputs = out;
    }
    let counts = words_of(&outputs[1]);
    // "the quick brown fox " has 4 spaces; 262,144 = 13,107 * 20 + 4 and "the " has 1.
    assert_eq!(counts.iter().sum::<u32>(), threads / 20 * 4 + 1);
    println!(
        "reference interpreter: {} threads, {} lane-ops + {} lane-steps in {:.1} ms (best of 5): {:.1} M lane-ops/s, {:.1} M lane-steps/s",
        threads,
        stats.lane_ops,
        stats.lane_steps,
        best * 1e3,
        stats.lane_ops as f64 / best / 1e6,
        stats.lane_steps as f64 / best / 1e6
    );
}

fn nested_sum_program(depth: u32) -> Program {
    // global_id + 0 + 1 + ... + (depth - 1), as one left-deep expression.
    let mut sum = Expr::global_id(Axis::X);
    for k in 0..depth {
        sum = sum + k;
    }
    Program::builder([1, 1, 1])
        .buffer(
            "out",
            0,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Static(1),
        )
        .body(|blk| {
            blk.store("out", 0u32, sum);
        })
        .build()
}

/// Locks out a stack overflow (an abort, not even a panic) on deeply nested
/// expressions: programs near the validator's 256-level limit must run (the
/// interpreter gives them their own deep stack, since debug builds spend ~5 KiB per
/// level and test threads have 2 MiB), and deeper ones must be refused with an error.
#[test]
fn deep_expressions_run_or_are_refused_without_overflowing() {
    let out = run_words(
        &nested_sum_program(240),
        &[&[0; 4]],
        &DispatchConfig::linear(1),
    );
    // 0 + 1 + ... + 239 = 239 * 240 / 2.
    assert_eq!(out[0], [28_680]);
    assert_fix(
        reference::run(
            &nested_sum_program(600),
            &[&[0; 4]],
            &DispatchConfig::linear(1),
        ),
        &["levels"],
    );
}

// ---- scalar parameters -------------------------------------------------------------

/// Locks out scalar values that do not reach every thread, arrive truncated or
/// reinterpreted (a 64-bit value cut to 32 bits, an `f32` converted, a `bool` other
/// than 0 or 1), or stick from an earlier run: two sets of values over the same
/// program give exactly the host's results for each.
#[test]
fn scalar_values_reach_every_thread() {
    let program = support::every_scalar_type();
    let options = ReferenceOptions::default();
    let config = DispatchConfig::linear(1);
    let zeros = support::static_zeros(&program);
    let inputs: Vec<&[u8]> = zeros.iter().map(Vec::as_slice).collect();
    for (u, s, f, flag, w, x) in [
        (7u32, -3i32, 0.5f32, true, 1u64 << 40, i64::MIN),
        (u32::MAX, i32::MIN, -2.25, false, u64::MAX, 5),
    ] {
        let values = support::every_scalar_value((u, s, f, flag, w, x));
        let (outputs, _) =
            reference::run_with_scalars(&program, &inputs, &values, &config, &options).unwrap();
        let per_thread = |f: &dyn Fn(u32) -> Vec<u8>| (0..8u32).flat_map(f).collect::<Vec<u8>>();
        assert_eq!(
            outputs[0],
            per_thread(&|i| u.wrapping_add(i).to_le_bytes().to_vec())
        );
        assert_eq!(
            outputs[1],
            per_thread(&|i| s.wrapping_sub(i as i32).to_le_bytes().to_vec())
        );
        assert_eq!(
            outputs[2],
            per_thread(&|i| (f * i as f32).to_le_bytes().to_vec())
        );
        assert_eq!(
            outputs[3],
            per_thread(&|_| (flag as u32).to_le_bytes().to_vec())
        );
        assert_eq!(
            outputs[4],
            per_thread(&|i| w.wrapping_add(i as u64).to_le_bytes().to_vec())
        );
        assert_eq!(
            outputs[5],
            per_thread(&|i| x.wrapping_sub(i as i64).to_le_bytes().to_vec())
        );
    }
}

/// Locks out a run that guesses missing scalar values (zeros) or takes a value of
/// another type: no values (through `run`), one too few and a mistyped one are each
/// a `Fix:` error naming what to pass, before any work. Negative control: the right
/// values run.
#[test]
fn scalar_values_are_checked_before_a_run() {
    let program = support::every_scalar_type();
    let options = ReferenceOptions::default();
    let config = DispatchConfig::linear(1);
    let zeros = [0u8; 64];
    let inputs: Vec<&[u8]> = program
        .global_buffers()
        .iter()
        .map(|d| &zeros[..d.static_size_bytes().unwrap() as usize])
        .collect();
    let good = support::every_scalar_value((1, 1, 1.0, true, 1, 1));
    let message = reference::run(&program, &inputs, &config)
        .unwrap_err()
        .to_string();
    assert!(message.starts_with("Fix:"), "{message}");
    for needle in [
        "6 scalar parameters",
        "s_f32: f32",
        "0 values",
        "run_with_scalars",
    ] {
        assert!(message.contains(needle), "{needle}: {message}");
    }
    let short = reference::run_with_scalars(&program, &inputs, &good[..5], &config, &options);
    assert!(short.unwrap_err().message().contains("5 values"));
    let mut mistyped = good;
    mistyped[2] = Literal::U32(1);
    let message = reference::run_with_scalars(&program, &inputs, &mistyped, &config, &options)
        .unwrap_err()
        .to_string();
    assert!(message.starts_with("Fix:"), "{message}");
    for needle in ["'s_f32'", "declared f32", "u32", "pass a f32 value"] {
        assert!(message.contains(needle), "{needle}: {message}");
    }
    assert!(reference::run_with_scalars(&program, &inputs, &good, &config, &options).is_ok());
}

/// Locks out a reference clock that stands still or runs backwards: two threads
/// read it before and after a loop of 100 iterations, and each later reading is
/// past its earlier one by at least the loop's work (100 iterations on 32
/// lanes charged), while both threads' earlier readings are equal (they ran
/// the same statement together). Negative control: readings with no work
/// between them differ by less than the loop's work.
#[test]
fn the_reference_clock_counts_the_work_done() {
    let program = Program::builder([2, 1, 1])
        .buffer(
            "out",
            0,
            Access::ReadWrite,
            ElemType::U64,
            BufferCount::Static(6),
        )
        .body(|b| {
            let thread = Expr::local_id(Axis::X);
            b.store("out", thread.clone(), Expr::clock());
            b.store("out", thread.clone() + 2u32, Expr::clock());
            let sum = b.let_mut("sum", 0u32);
            b.loop_("i", 0u32, 100u32, |b, i| {
                b.assign("sum", sum.clone() + i);
            });
            b.store("out", thread + 4u32, Expr::clock());
        })
        .build();
    let out = reference::run(&program, &[&[0u8; 48]], &DispatchConfig::linear(1))
        .unwrap_or_else(|e| panic!("{e}\n{program}"));
    let words: Vec<u64> = out[0]
        .chunks_exact(8)
        .map(|word| u64::from_le_bytes(word.try_into().unwrap()))
        .collect();
    assert_eq!(words[0], words[1], "{words:?}");
    let looped = 100 * 32;
    for thread in 0..2 {
        let (first, second, third) = (words[thread], words[thread + 2], words[thread + 4]);
        assert!(first < second && second - first < looped, "{words:?}");
        assert!(third - second >= looped, "{words:?}");
    }
}
