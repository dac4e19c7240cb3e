//! Scalar semantics of every operator, on 32-bit patterns.
//!
//! Every value the interpreter holds is a `u32` bit pattern (`bool` is 0 or 1,
//! `i32` its two's complement, `f32` its IEEE bits), so one vector type carries
//! every scalar type. The type checker in `compile` picks a *typed* operator
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
    /// Bitwise and (also `bool`).
    BitAnd,
    /// Bitwise or (also `bool`).
    BitOr,
    /// Bitwise xor (also `bool`).
    BitXor,
    /// Shift left by the right operand modulo 32.
    Shl,
    /// Logical shift right (`u32`) by the right operand modulo 32.
    U32Shr,
    /// Arithmetic shift right (`i32`) by the right operand modulo 32.
    I32Shr,
    /// Bit-pattern equality (`u32`, `i32`, `bool`).
    BitsEq,
    /// Bit-pattern inequality.
    BitsNe,
    /// Ordered `f32` equality (`-0.0 == 0.0`, NaN is false).
    F32Eq,
    /// `f32` inequality: true when either operand is NaN.
    F32Ne,
    /// Unsigned less-than.
    U32Lt,
    /// Unsigned less-or-equal.
    U32Le,
    /// Unsigned greater-than.
    U32Gt,
    /// Unsigned greater-or-equal.
    U32Ge,
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
    /// Unsigned minimum.
    U32Min,
    /// Unsigned maximum.
    U32Max,
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
    /// Wrapping negation of an integer.
    IntNeg,
    /// `f32` negation: flips the sign bit (NaN payloads kept, as `neg.f32` on bits).
    F32Neg,
    /// Bitwise not of an integer.
    BitNot,
    /// `bool` not.
    LogicalNot,
    /// Wrapping `i32` absolute value (`abs(MIN) == MIN`).
    I32Abs,
    /// `f32` absolute value: clears the sign bit.
    F32Abs,
    /// Population count.
    CountOnes,
    /// Leading zero count (32 for 0).
    LeadingZeros,
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

/// One binary operation on bit patterns.
#[inline(always)]
pub(crate) fn binary(kind: BinaryKind, a: u32, b: u32) -> u32 {
    let f = f32::from_bits;
    let (sa, sb) = (a as i32, b as i32);
    match kind {
        BinaryKind::IntAdd => a.wrapping_add(b),
        BinaryKind::IntSub => a.wrapping_sub(b),
        BinaryKind::IntMul => a.wrapping_mul(b),
        BinaryKind::U32Div => a.checked_div(b).unwrap_or(0),
        BinaryKind::I32Div => {
            if sb == 0 {
                0
            } else {
                sa.wrapping_div(sb) as u32
            }
        }
        BinaryKind::U32Rem => a.checked_rem(b).unwrap_or(0),
        BinaryKind::I32Rem => {
            if sb == 0 {
                0
            } else {
                sa.wrapping_rem(sb) as u32
            }
        }
        BinaryKind::F32Add => f32_result(f(a) + f(b)),
        BinaryKind::F32Sub => f32_result(f(a) - f(b)),
        BinaryKind::F32Mul => f32_result(f(a) * f(b)),
        BinaryKind::F32Div => f32_result(f(a) / f(b)),
        BinaryKind::BitAnd | BinaryKind::LogicalAnd => a & b,
        BinaryKind::BitOr | BinaryKind::LogicalOr => a | b,
        BinaryKind::BitXor => a ^ b,
        BinaryKind::Shl => a << (b & 31),
        BinaryKind::U32Shr => a >> (b & 31),
        BinaryKind::I32Shr => (sa >> (b & 31)) as u32,
        BinaryKind::BitsEq => (a == b) as u32,
        BinaryKind::BitsNe => (a != b) as u32,
        BinaryKind::F32Eq => (f(a) == f(b)) as u32,
        BinaryKind::F32Ne => (f(a) != f(b)) as u32,
        BinaryKind::U32Lt => (a < b) as u32,
        BinaryKind::U32Le => (a <= b) as u32,
        BinaryKind::U32Gt => (a > b) as u32,
        BinaryKind::U32Ge => (a >= b) as u32,
        BinaryKind::I32Lt => (sa < sb) as u32,
        BinaryKind::I32Le => (sa <= sb) as u32,
        BinaryKind::I32Gt => (sa > sb) as u32,
        BinaryKind::I32Ge => (sa >= sb) as u32,
        BinaryKind::F32Lt => (f(a) < f(b)) as u32,
        BinaryKind::F32Le => (f(a) <= f(b)) as u32,
        BinaryKind::F32Gt => (f(a) > f(b)) as u32,
        BinaryKind::F32Ge => (f(a) >= f(b)) as u32,
        BinaryKind::U32Min => a.min(b),
        BinaryKind::U32Max => a.max(b),
        BinaryKind::I32Min => sa.min(sb) as u32,
        BinaryKind::I32Max => sa.max(sb) as u32,
        BinaryKind::F32Min => f32_min(a, b),
        BinaryKind::F32Max => f32_max(a, b),
    }
}

/// One unary operation on a bit pattern.
#[inline(always)]
pub(crate) fn unary(kind: UnaryKind, a: u32) -> u32 {
    match kind {
        UnaryKind::IntNeg => a.wrapping_neg(),
        UnaryKind::F32Neg => a ^ F32_SIGN,
        UnaryKind::BitNot => !a,
        UnaryKind::LogicalNot => a ^ 1,
        UnaryKind::I32Abs => (a as i32).wrapping_abs() as u32,
        UnaryKind::F32Abs => a & !F32_SIGN,
        UnaryKind::CountOnes => a.count_ones(),
        UnaryKind::LeadingZeros => a.leading_zeros(),
    }
}

/// One conversion of a bit pattern.
#[inline(always)]
pub(crate) fn cast(kind: CastKind, a: u32) -> u32 {
    let f = f32::from_bits(a);
    match kind {
        CastKind::Bits => a,
        CastKind::IntToBool => (a != 0) as u32,
        CastKind::F32ToBool => (f != 0.0) as u32,
        CastKind::BoolToF32 => (a as f32).to_bits(),
        CastKind::U32ToF32 => (a as f32).to_bits(),
        CastKind::I32ToF32 => ((a as i32) as f32).to_bits(),
        CastKind::F32ToU32 => f as u32,
        CastKind::F32ToI32 => (f as i32) as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Locks out x86's default NaN (`0xffc00000`) leaking into results: the GPU
    /// returns the canonical NaN for `0/0`, and a raw Rust division would not.
    #[test]
    fn invalid_f32_operations_give_the_canonical_nan() {
        let zero = 0.0f32.to_bits();
        assert_eq!(binary(BinaryKind::F32Div, zero, zero), CANONICAL_NAN);
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
