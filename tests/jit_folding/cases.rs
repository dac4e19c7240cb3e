//! The two minimised programs of the JIT-folding regressions (seeds 1008915 and
//! 1007798), shared by tests/jit_folding.rs (reference and PTX) and
//! tests/gpu_differential.rs (the GPU). See tests/jit_folding.rs for the root causes.
#![allow(dead_code)]

use vyre_cuda::ir::*;

/// Seed 1008915 minimised: `out[0] = i32((-26627702.0f + -141.75f) - -1.0f)` and the
/// single-operation tie `out[1] = i32(-26627844.0f - -1.0f)`, plus the same tie
/// through a cast of an integer literal (`f32(-26627844i) - f32(true)`).
pub fn tie_program() -> Program {
    Program::builder([1, 1, 1])
        .buffer(
            "out",
            0,
            Access::WriteOnly,
            ElemType::I32,
            BufferCount::Static(3),
        )
        .body(|b| {
            let sum = Expr::f32(-26627702.0) + Expr::f32(-141.75);
            b.store("out", 0u32, (sum - Expr::f32(-1.0)).cast(ScalarType::I32));
            let tie = Expr::f32(-26627844.0) - Expr::f32(-1.0);
            b.store("out", 1u32, tie.cast(ScalarType::I32));
            let through_casts = Expr::i32(-26627844).cast(ScalarType::F32)
                - -Expr::bool(true).cast(ScalarType::F32);
            b.store("out", 2u32, through_casts.cast(ScalarType::I32));
        })
        .build()
}

/// What every output of [`tie_program`] must hold: `-26627844` (IEEE round to nearest
/// even at each step), little-endian.
pub fn tie_expected() -> Vec<u8> {
    [-26627844i32; 3]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect()
}

/// Seed 1007798 minimised: with `x = in[0]` (run time) and `a = in[1]`,
/// `out[0] = max(a, abs(x))`, `out[1] = max(a, max(x, -x))`,
/// `out[2] = min(a, min(x, -x))`.
pub fn negation_program() -> Program {
    Program::builder([1, 1, 1])
        .buffer(
            "in",
            0,
            Access::ReadOnly,
            ElemType::I32,
            BufferCount::Static(2),
        )
        .buffer(
            "out",
            1,
            Access::WriteOnly,
            ElemType::I32,
            BufferCount::Static(3),
        )
        .body(|b| {
            let x = b.let_("x", Expr::load("in", 0u32));
            let a = b.let_("a", Expr::load("in", 1u32));
            b.store("out", 0u32, a.clone().max(x.clone().abs()));
            b.store("out", 1u32, a.clone().max(x.clone().max(-x.clone())));
            b.store("out", 2u32, a.min(x.clone().min(-x)));
        })
        .build()
}

/// The seed's values: `x = a = 0xb1652400` (`330062153 << 10`, negative).
pub fn negation_inputs() -> Vec<u8> {
    [0xb165_2400u32, 0xb165_2400]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect()
}

/// Hand-computed: `abs(0xb1652400) = 0x4e9adc00`; max gives it, min gives `x`.
pub fn negation_expected() -> Vec<u8> {
    [0x4e9a_dc00u32, 0x4e9a_dc00, 0xb165_2400]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect()
}
