//! Scalar semantics of every operator, on bit patterns.
//!
//! Every value the interpreter holds is a bit pattern in a `u64` here (`bool` is 0
//! or 1, `i32` its two's complement and `f32` its IEEE bits in the low 32 bits with
//! the high 32 bits zero; `u64`/`i64` all 64 bits), so one vector type carries every
//! scalar type (the executor stores `u32` lanes for programs without 64-bit values,
//! see `exec::Word`). Every 32-bit operator keeps the high bits zero, which is why
//! several kinds (`BitAnd`, `BitsEq`, `UnsignedLt`, `UnsignedMin`, `CountOnes`) serve
//! both widths. The type checker in `compile` picks a *typed* operator
//! ([`BinaryKind`], [`UnaryKind`], [`CastKind`]) once per expression, so the hot
//! loops in `exec` never look at types. This file is where "the GPU and the CPU
//! give byte-identical results" is decided, one operator at a time; each choice
//! that is not plain Rust arithmetic says which PTX instruction it matches.
//!
//! Checked on an H200 (sm_90) against hand-written PTX: `add/sub/mul/div.rn.f32`
//! return `0x7fffffff` for every NaN result; `min.f32`/`max.f32` return the other
//! operand for one NaN, `0x7fffffff` for two, and order `-0.0 < +0.0`; denormals
//! pass through `add.rn.f32` unflushed; `cvt.rzi` saturates. `neg.f32`/`abs.f32`
//! would also canonicalise a NaN, so `Neg`/`Abs` on `f32` are sign-bit operations
//! (`xor.b32`/`and.b32`), as the code generator emits them.

/// The bit pattern the GPU produces for every arithmetic NaN result, and for
/// `min`/`max` of two NaNs: NVIDIA's canonical NaN.
pub(crate) const CANONICAL_NAN: u32 = 0x7fff_ffff;

/// The sign bit of an `f32`.
const F32_SIGN: u32 = 0x8000_0000;

/// A binary operator with its operand type resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BinaryKind {
    /// Wrapping add on `u32` or `i32` (the same bits either way).
    IntAdd,
    /// Wrapping subtract on `u32` or `i32`.
    IntSub,
    /// Wrapping multiply on `u32` or `i32` (low 32 bits are sign-independent).
    IntMul,
    /// Wrapping add on `u64` or `i64`.
    Int64Add,
    /// Wrapping subtract on `u64` or `i64`.
    Int64Sub,
    /// Wrapping multiply on `u64` or `i64`.
    Int64Mul,
    /// `u64` division; divisor 0 gives 0.
    U64Div,
    /// `i64` division truncating toward zero; divisor 0 gives 0; `MIN / -1` gives `MIN`.
    I64Div,
    /// `u64` remainder; divisor 0 gives 0.
    U64Rem,
    /// `i64` remainder; divisor 0 gives 0; `MIN % -1` gives 0.
    I64Rem,
    /// Shift left by the right operand modulo 64.
    Shl64,
    /// Logical shift right (`u64`) by the right operand modulo 64.
    U64Shr,
    /// Arithmetic shift right (`i64`) by the right operand modulo 64.
    I64Shr,
    /// PTX `prmt.b32` (default mode): bytes of a `u64` picked by the nibbles of a
    /// `u32` selector.
    PermuteBytes,
    /// Signed 64-bit less-than.
    I64Lt,
    /// Signed 64-bit less-or-equal.
    I64Le,
    /// Signed 64-bit greater-than.
    I64Gt,
    /// Signed 64-bit greater-or-equal.
    I64Ge,
    /// Signed 64-bit minimum.
    I64Min,
    /// Signed 64-bit maximum.
    I64Max,
    /// `u32` division; divisor 0 gives 0.
    U32Div,
    /// `i32` division truncating toward zero; divisor 0 gives 0; `MIN / -1` gives `MIN`.
    I32Div,
    /// `u32` remainder; divisor 0 gives 0.
    U32Rem,
    /// `i32` remainder (sign of the dividend); divisor 0 gives 0; `MIN % -1` gives 0.
    I32Rem,
    /// IEEE add, round to nearest even, canonical NaN.
    F32Add,
    /// IEEE subtract.
    F32Sub,
    /// IEEE multiply (never fused with a later add).
    F32Mul,
    /// IEEE division (`div.rn.f32`).
    F32Div,
    /// Bitwise and (any integer width, also `bool`).
    BitAnd,
    /// Bitwise or (any integer width, also `bool`).
    BitOr,
    /// Bitwise xor (any integer width, also `bool`).
    BitXor,
    /// Shift left by the right operand modulo 32.
    Shl,
    /// Logical shift right (`u32`) by the right operand modulo 32.
    U32Shr,
    /// Arithmetic shift right (`i32`) by the right operand modulo 32.
    I32Shr,
    /// Bit-pattern equality (integers of either width, `bool`).
    BitsEq,
    /// Bit-pattern inequality.
    BitsNe,
    /// Ordered `f32` equality (`-0.0 == 0.0`, NaN is false).
    F32Eq,
    /// `f32` inequality: true when either operand is NaN.
    F32Ne,
    /// Unsigned less-than (`u32` or `u64`: zero-extended patterns compare alike).
    UnsignedLt,
    /// Unsigned less-or-equal.
    UnsignedLe,
    /// Unsigned greater-than.
    UnsignedGt,
    /// Unsigned greater-or-equal.
    UnsignedGe,
    /// Signed less-than.
    I32Lt,
    /// Signed less-or-equal.
    I32Le,
    /// Signed greater-than.
    I32Gt,
    /// Signed greater-or-equal.
    I32Ge,
    /// Ordered `f32` less-than.
    F32Lt,
    /// Ordered `f32` less-or-equal.
    F32Le,
    /// Ordered `f32` greater-than.
    F32Gt,
    /// Ordered `f32` greater-or-equal.
    F32Ge,
    /// Unsigned minimum (`u32` or `u64`).
    UnsignedMin,
    /// Unsigned maximum (`u32` or `u64`).
    UnsignedMax,
    /// Signed minimum.
    I32Min,
    /// Signed maximum.
    I32Max,
    /// `min.f32`: see [`f32_min`].
    F32Min,
    /// `max.f32`: see [`f32_max`].
    F32Max,
    /// `bool` and (both sides already evaluated).
    LogicalAnd,
    /// `bool` or (both sides already evaluated).
    LogicalOr,
}

/// A unary operator with its operand type resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum UnaryKind {
    /// Wrapping negation of an `i32`.
    IntNeg,
    /// Wrapping negation of an `i64`.
    Int64Neg,
    /// `f32` negation: flips the sign bit (NaN payloads kept, as `neg.f32` on bits).
    F32Neg,
    /// Bitwise not of a 32-bit integer.
    BitNot,
    /// Bitwise not of a 64-bit integer.
    BitNot64,
    /// `bool` not.
    LogicalNot,
    /// Wrapping `i32` absolute value (`abs(MIN) == MIN`).
    I32Abs,
    /// Wrapping `i64` absolute value.
    I64Abs,
    /// `f32` absolute value: clears the sign bit.
    F32Abs,
    /// Population count (either width: a 32-bit pattern's high bits are zero).
    CountOnes,
    /// Leading zero count of a 32-bit integer (32 for 0).
    LeadingZeros,
    /// Leading zero count of a 64-bit integer (64 for 0).
    LeadingZeros64,
}

/// A conversion with both types resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CastKind {
    /// The bits stay: same type, `u32` ↔ `i32`, or `bool` → integer (0/1 already).
    Bits,
    /// Integer → `bool`: `!= 0`.
    IntToBool,
    /// `f32` → `bool`: `!= 0.0` (NaN true, `-0.0` false).
    F32ToBool,
    /// `bool` → `f32`: 0.0 or 1.0.
    BoolToF32,
    /// `u32` → `f32`, round to nearest even (`cvt.rn.f32.u32`).
    U32ToF32,
    /// `i32` → `f32`, round to nearest even (`cvt.rn.f32.s32`).
    I32ToF32,
    /// `f32` → `u32`, truncating, saturating, NaN → 0 (`cvt.rzi.sat.u32.f32`).
    F32ToU32,
    /// `f32` → `i32`, truncating, saturating, NaN → 0 (`cvt.rzi.sat.s32.f32`).
    F32ToI32,
    /// A 64-bit integer → a 32-bit one: the low 32 bits (`cvt.u32.u64`).
    Truncate,
    /// `i32` → a 64-bit integer, sign-extending (`cvt.s64.s32`). (`u32` and `bool`
    /// → 64 bits keep their zero-extended pattern: `Bits`.)
    SignExtend,
    /// `u64` → `f32`, round to nearest even (`cvt.rn.f32.u64`).
    U64ToF32,
    /// `i64` → `f32`, round to nearest even (`cvt.rn.f32.s64`).
    I64ToF32,
    /// `f32` → `u64`, truncating, saturating, NaN → 0 (`cvt.rzi.u64.f32`).
    F32ToU64,
    /// `f32` → `i64`, truncating, saturating, NaN → 0 (`cvt.rzi.s64.f32`).
    F32ToI64,
}

/// An atomic operation with the element's signedness resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AtomicKind {
    /// Wrapping add (either width: the store keeps the element's bits).
    Add,
    /// Wrapping subtract.
    Sub,
    /// Unsigned minimum (`u32` or `u64`).
    UnsignedMin,
    /// Unsigned maximum.
    UnsignedMax,
    /// Signed 32-bit minimum.
    I32Min,
    /// Signed 32-bit maximum.
    I32Max,
    /// Signed 64-bit minimum.
    I64Min,
    /// Signed 64-bit maximum.
    I64Max,
    /// Bitwise and.
    And,
    /// Bitwise or.
    Or,
    /// Bitwise xor.
    Xor,
    /// The operand replaces the element.
    Exchange,
    /// The operand replaces the element if it equals the expected value.
    CompareExchange,
}

/// The element's new value (before the store keeps its bits) for an atomic of `kind`
/// on the element `old` with `operand` (and `expected`, for a compare-exchange); all
/// zero-extended patterns.
#[inline]
pub(crate) fn atomic(kind: AtomicKind, old: u64, operand: u64, expected: u64) -> u64 {
    let (old32, operand32) = (old as u32 as i32, operand as u32 as i32);
    match kind {
        AtomicKind::Add => old.wrapping_add(operand),
        AtomicKind::Sub => old.wrapping_sub(operand),
        AtomicKind::UnsignedMin => old.min(operand),
        AtomicKind::UnsignedMax => old.max(operand),
        AtomicKind::I32Min => old32.min(operand32) as u32 as u64,
        AtomicKind::I32Max => old32.max(operand32) as u32 as u64,
        AtomicKind::I64Min => (old as i64).min(operand as i64) as u64,
        AtomicKind::I64Max => (old as i64).max(operand as i64) as u64,
        AtomicKind::And => old & operand,
        AtomicKind::Or => old | operand,
        AtomicKind::Xor => old ^ operand,
        AtomicKind::Exchange => operand,
        AtomicKind::CompareExchange => {
            if old == expected {
                operand
            } else {
                old
            }
        }
    }
}

/// The bits of an `f32` result, with every NaN replaced by the canonical NaN the
/// GPU produces (x86 would give `0xffc00000` for `0.0 / 0.0`).
#[inline(always)]
pub(crate) fn f32_result(value: f32) -> u32 {
    if value.is_nan() {
        CANONICAL_NAN
    } else {
        value.to_bits()
    }
}

/// `min.f32`: when exactly one operand is NaN the other is returned; two NaNs give
/// the canonical NaN; `-0.0` counts as smaller than `+0.0`.
#[inline(always)]
pub(crate) fn f32_min(a: u32, b: u32) -> u32 {
    let (x, y) = (f32::from_bits(a), f32::from_bits(b));
    match (x.is_nan(), y.is_nan()) {
        (true, true) => CANONICAL_NAN,
        (true, false) => b,
        (false, true) => a,
        (false, false) => {
            if x < y || (x == y && a & F32_SIGN != 0) {
                a
            } else {
                b
            }
        }
    }
}

/// `max.f32`: when exactly one operand is NaN the other is returned; two NaNs give
/// the canonical NaN; `+0.0` counts as larger than `-0.0`.
#[inline(always)]
pub(crate) fn f32_max(a: u32, b: u32) -> u32 {
    let (x, y) = (f32::from_bits(a), f32::from_bits(b));
    match (x.is_nan(), y.is_nan()) {
        (true, true) => CANONICAL_NAN,
        (true, false) => b,
        (false, true) => a,
        (false, false) => {
            if x > y || (x == y && a & F32_SIGN == 0) {
                a
            } else {
                b
            }
        }
    }
}

/// Byte `k` of the result is the byte of `source` that nibble `k` of `selector`
/// names in its low three bits, or that byte's top bit copied into all eight where
/// the nibble's high bit is set (PTX `prmt.b32`, default mode).
fn permute_bytes(source: u64, selector: u32) -> u32 {
    (0..4).fold(0, |result, k| {
        let nibble = (selector >> (4 * k)) & 0xF;
        let byte = (source >> (8 * (nibble & 7))) as u8;
        let byte = if nibble & 8 == 0 {
            byte
        } else {
            ((byte as i8) >> 7) as u8
        };
        result | u32::from(byte) << (8 * k)
    })
}

/// One binary operation on bit patterns (32-bit values in the low half, the high
/// half zero, and so are 32-bit results).
#[inline(always)]
pub(crate) fn binary(kind: BinaryKind, a: u64, b: u64) -> u64 {
    let (a32, b32) = (a as u32, b as u32);
    let (sa, sb) = (a32 as i32, b32 as i32);
    let (wa, wb) = (a as i64, b as i64);
    let f = f32::from_bits;
    let word = |v: u32| v as u64;
    let truth = |v: bool| v as u64;
    match kind {
        BinaryKind::IntAdd => word(a32.wrapping_add(b32)),
        BinaryKind::IntSub => word(a32.wrapping_sub(b32)),
        BinaryKind::IntMul => word(a32.wrapping_mul(b32)),
        BinaryKind::U32Div => word(a32.checked_div(b32).unwrap_or(0)),
        BinaryKind::I32Div => word(if sb == 0 {
            0
        } else {
            sa.wrapping_div(sb) as u32
        }),
        BinaryKind::U32Rem => word(a32.checked_rem(b32).unwrap_or(0)),
        BinaryKind::I32Rem => word(if sb == 0 {
            0
        } else {
            sa.wrapping_rem(sb) as u32
        }),
        BinaryKind::Int64Add => a.wrapping_add(b),
        BinaryKind::Int64Sub => a.wrapping_sub(b),
        BinaryKind::Int64Mul => a.wrapping_mul(b),
        BinaryKind::U64Div => a.checked_div(b).unwrap_or(0),
        BinaryKind::I64Div => {
            if wb == 0 {
                0
            } else {
                wa.wrapping_div(wb) as u64
            }
        }
        BinaryKind::U64Rem => a.checked_rem(b).unwrap_or(0),
        BinaryKind::I64Rem => {
            if wb == 0 {
                0
            } else {
                wa.wrapping_rem(wb) as u64
            }
        }
        BinaryKind::F32Add => word(f32_result(f(a32) + f(b32))),
        BinaryKind::F32Sub => word(f32_result(f(a32) - f(b32))),
        BinaryKind::F32Mul => word(f32_result(f(a32) * f(b32))),
        BinaryKind::F32Div => word(f32_result(f(a32) / f(b32))),
        BinaryKind::BitAnd | BinaryKind::LogicalAnd => a & b,
        BinaryKind::BitOr | BinaryKind::LogicalOr => a | b,
        BinaryKind::BitXor => a ^ b,
        BinaryKind::Shl => word(a32 << (b32 & 31)),
        BinaryKind::U32Shr => word(a32 >> (b32 & 31)),
        BinaryKind::I32Shr => word((sa >> (b32 & 31)) as u32),
        BinaryKind::Shl64 => a << (b32 & 63),
        BinaryKind::U64Shr => a >> (b32 & 63),
        BinaryKind::I64Shr => (wa >> (b32 & 63)) as u64,
        BinaryKind::PermuteBytes => word(permute_bytes(a, b32)),
        BinaryKind::BitsEq => truth(a == b),
        BinaryKind::BitsNe => truth(a != b),
        BinaryKind::F32Eq => truth(f(a32) == f(b32)),
        BinaryKind::F32Ne => truth(f(a32) != f(b32)),
        BinaryKind::UnsignedLt => truth(a < b),
        BinaryKind::UnsignedLe => truth(a <= b),
        BinaryKind::UnsignedGt => truth(a > b),
        BinaryKind::UnsignedGe => truth(a >= b),
        BinaryKind::I32Lt => truth(sa < sb),
        BinaryKind::I32Le => truth(sa <= sb),
        BinaryKind::I32Gt => truth(sa > sb),
        BinaryKind::I32Ge => truth(sa >= sb),
        BinaryKind::I64Lt => truth(wa < wb),
        BinaryKind::I64Le => truth(wa <= wb),
        BinaryKind::I64Gt => truth(wa > wb),
        BinaryKind::I64Ge => truth(wa >= wb),
        BinaryKind::F32Lt => truth(f(a32) < f(b32)),
        BinaryKind::F32Le => truth(f(a32) <= f(b32)),
        BinaryKind::F32Gt => truth(f(a32) > f(b32)),
        BinaryKind::F32Ge => truth(f(a32) >= f(b32)),
        BinaryKind::UnsignedMin => a.min(b),
        BinaryKind::UnsignedMax => a.max(b),
        BinaryKind::I32Min => word(sa.min(sb) as u32),
        BinaryKind::I32Max => word(sa.max(sb) as u32),
        BinaryKind::I64Min => wa.min(wb) as u64,
        BinaryKind::I64Max => wa.max(wb) as u64,
        BinaryKind::F32Min => word(f32_min(a32, b32)),
        BinaryKind::F32Max => word(f32_max(a32, b32)),
    }
}

/// One unary operation on a bit pattern.
#[inline(always)]
pub(crate) fn unary(kind: UnaryKind, a: u64) -> u64 {
    let a32 = a as u32;
    match kind {
        UnaryKind::IntNeg => a32.wrapping_neg() as u64,
        UnaryKind::Int64Neg => a.wrapping_neg(),
        UnaryKind::F32Neg => (a32 ^ F32_SIGN) as u64,
        UnaryKind::BitNot => (!a32) as u64,
        UnaryKind::BitNot64 => !a,
        UnaryKind::LogicalNot => a ^ 1,
        UnaryKind::I32Abs => (a32 as i32).wrapping_abs() as u32 as u64,
        UnaryKind::I64Abs => (a as i64).wrapping_abs() as u64,
        UnaryKind::F32Abs => (a32 & !F32_SIGN) as u64,
        UnaryKind::CountOnes => a.count_ones() as u64,
        UnaryKind::LeadingZeros => a32.leading_zeros() as u64,
        UnaryKind::LeadingZeros64 => a.leading_zeros() as u64,
    }
}

/// One conversion of a bit pattern.
#[inline(always)]
pub(crate) fn cast(kind: CastKind, a: u64) -> u64 {
    let a32 = a as u32;
    let f = f32::from_bits(a32);
    let word = |v: u32| v as u64;
    match kind {
        CastKind::Bits => a,
        CastKind::IntToBool => (a != 0) as u64,
        CastKind::F32ToBool => (f != 0.0) as u64,
        CastKind::BoolToF32 => word((a32 as f32).to_bits()),
        CastKind::U32ToF32 => word((a32 as f32).to_bits()),
        CastKind::I32ToF32 => word(((a32 as i32) as f32).to_bits()),
        CastKind::F32ToU32 => word(f as u32),
        CastKind::F32ToI32 => word((f as i32) as u32),
        CastKind::Truncate => word(a32),
        CastKind::SignExtend => a32 as i32 as i64 as u64,
        CastKind::U64ToF32 => word((a as f32).to_bits()),
        CastKind::I64ToF32 => word(((a as i64) as f32).to_bits()),
        CastKind::F32ToU64 => f as u64,
        CastKind::F32ToI64 => (f as i64) as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Locks out x86's default NaN (`0xffc00000`) leaking into results: the GPU
    /// returns the canonical NaN for `0/0`, and a raw Rust division would not.
    #[test]
    fn invalid_f32_operations_give_the_canonical_nan() {
        let zero = 0.0f32.to_bits() as u64;
        assert_eq!(binary(BinaryKind::F32Div, zero, zero), CANONICAL_NAN as u64);
        // Negative control: the unfiltered Rust result differs from the GPU's bits.
        let host_zero = std::hint::black_box(0.0f32);
        assert_ne!((host_zero / host_zero).to_bits(), CANONICAL_NAN);
    }

    /// Locks out `f32::min`'s unspecified choice between `-0.0` and `+0.0`.
    #[test]
    fn f32_min_max_order_signed_zeros() {
        let (neg, pos) = ((-0.0f32).to_bits(), 0.0f32.to_bits());
        assert_eq!(f32_min(pos, neg), neg);
        assert_eq!(f32_min(neg, pos), neg);
        assert_eq!(f32_max(pos, neg), pos);
        assert_eq!(f32_max(neg, pos), pos);
    }
}
