//! The kernel-parameter limit in the validator, checked against NVIDIA's `ptxas`
//!: 363 global buffers passed validation and PTX emission, then
//! `ptxas -arch=sm_90` refused the kernel ("uses too much parameter space", limit
//! 0x1100 bytes), which on the GPU is a late, unexplained module-load error.
//!
//! ptxas is found through `VYRE_PTXAS`, `PTXAS` or `PATH`; without it the assembler
//! tests print "skipped: ptxas not found", unless `VYRE_REQUIRE_PTXAS=1` makes that a
//! failure (CI sets it where ptxas is installed).

#[path = "support/ptxas.rs"]
mod ptxas;

use vyre_cuda::codegen::program_to_ptx;
use vyre_cuda::ir::validate::{
    Rule, KERNEL_PARAMETER_BYTES_PER_GLOBAL_BUFFER, MAX_GLOBAL_BUFFERS, MAX_KERNEL_PARAMETER_BYTES,
};
use vyre_cuda::ir::*;
use vyre_cuda::CodegenOptions;

/// `buffers` runtime-sized `u32` read-write buffers; thread 0 adds one to element 0
/// of every buffer, so each is really a parameter the kernel uses.
fn program_with_buffers(buffers: u32) -> Program {
    let mut builder = Program::builder([32, 1, 1]);
    for index in 0..buffers {
        builder = builder.buffer(
            format!("b{index}"),
            index,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        );
    }
    builder
        .body(|b| {
            for index in 0..buffers {
                let name = format!("b{index}");
                b.store(
                    name.as_str(),
                    0u32,
                    Expr::load(name.as_str(), 0u32) + Expr::u32(1),
                );
            }
        })
        .build()
}

/// The limit is the one the ABI really meets: 12 bytes per global buffer, 362 fit.
#[test]
fn global_buffer_limit_follows_from_the_parameter_space() {
    assert_eq!(KERNEL_PARAMETER_BYTES_PER_GLOBAL_BUFFER, 12);
    assert_eq!(MAX_KERNEL_PARAMETER_BYTES, 4352);
    assert_eq!(MAX_GLOBAL_BUFFERS, 362);
    // The emitted kernel signature has exactly one u64 and one u32 per buffer.
    let ptx = program_to_ptx(&program_with_buffers(3), &CodegenOptions::default(), 90, 32)
        .expect("emits");
    let parameters: Vec<&str> = ptx
        .lines()
        .map(str::trim_start)
        .filter(|line| line.starts_with(".param "))
        .collect();
    assert_eq!(parameters.len(), 6, "{ptx}");
    let pointers = parameters
        .iter()
        .filter(|l| l.starts_with(".param .u64 "))
        .count();
    let counts = parameters
        .iter()
        .filter(|l| l.starts_with(".param .u32 "))
        .count();
    assert_eq!((pointers, counts), (3, 3), "{ptx}");
}

/// Locks out a validator that lets a kernel past the parameter space through: one
/// buffer over the limit is refused in advance with a `Fix:` naming the limit and the
/// count; workgroup buffers (not parameters) do not count.
#[test]
fn one_buffer_past_the_limit_is_refused_in_advance() {
    let error = validate(
        &program_with_buffers(MAX_GLOBAL_BUFFERS + 1),
        &Limits::default(),
    )
    .expect_err("363 global buffers");
    assert_eq!(error.rule(), Rule::TooManyBuffers, "{error}");
    let message = error.message();
    assert!(message.starts_with("Fix:"), "{message}");
    for figure in ["362", "363", "4352", "4356"] {
        assert!(
            message.contains(figure),
            "message lacks {figure}: {message}"
        );
    }
    // Negative control: at the limit the program validates.
    validate(
        &program_with_buffers(MAX_GLOBAL_BUFFERS),
        &Limits::default(),
    )
    .expect("362 global buffers fit");
    // Workgroup buffers are not kernel parameters.
    let mut builder = Program::builder([32, 1, 1]);
    for index in 0..MAX_GLOBAL_BUFFERS + 8 {
        let access = if index < MAX_GLOBAL_BUFFERS {
            Access::ReadWrite
        } else {
            Access::Workgroup
        };
        builder = builder.buffer(
            format!("b{index}"),
            index,
            access,
            ElemType::U32,
            BufferCount::Static(1),
        );
    }
    validate(&builder.build(), &Limits::default()).expect("362 global + 8 workgroup");
}

/// The at-limit program assembles with the real ptxas, and the program one past the
/// limit is refused by `program_to_ptx` (it validates first) and, emitted anyway (the
/// at-limit module with one more buffer's pointer and length parameters spliced in),
/// by ptxas for its parameter space: the validator's limit is exactly ptxas's.
#[test]
fn ptxas_accepts_the_limit_and_refuses_one_past_it() {
    let Some(ptxas) = ptxas::require("ptxas_accepts_the_limit_and_refuses_one_past_it") else {
        return;
    };
    let options = CodegenOptions::default();
    let at_limit = program_with_buffers(MAX_GLOBAL_BUFFERS);
    validate(&at_limit, &Limits::default()).expect("valid at the limit");
    let ptx = program_to_ptx(&at_limit, &options, 90, 32).expect("emits at the limit");
    ptxas::assemble(&ptxas, "limit", &ptx)
        .unwrap_or_else(|e| panic!("ptxas refused 362 buffers: {e}"));

    let past = program_with_buffers(MAX_GLOBAL_BUFFERS + 1);
    let refused = program_to_ptx(&past, &options, 90, 32).expect_err("emission validates first");
    assert!(refused.to_string().contains("at most 362"), "{refused}");
    let entry = ".visible .entry vyre_entry(";
    assert!(ptx.contains(entry), "{ptx}");
    let one_more = ptx.replacen(
        entry,
        &format!("{entry}\n\t.param .u64 vyre_ptr_extra,\n\t.param .u32 vyre_len_extra,"),
        1,
    );
    let refusal = ptxas::assemble(&ptxas, "past_limit", &one_more)
        .expect_err("ptxas must refuse 363 buffers");
    assert!(refusal.contains("parameter space"), "{refusal}");
}

/// `program_with_buffers(buffers)` that also declares `scalars` u32 scalars and adds
/// each into element 0 of the first buffer (so each is a parameter the kernel uses).
fn program_with_buffers_and_scalars(buffers: u32, scalars: u32) -> Program {
    let base = program_with_buffers(buffers);
    let mut builder = Program::builder([32, 1, 1]);
    for decl in base.buffers() {
        builder = builder.buffer_decl(decl.clone());
    }
    for index in 0..scalars {
        builder = builder.scalar(format!("s{index}"), ScalarType::U32);
    }
    builder
        .nodes(base.entry().iter().cloned())
        .body(|b| {
            for index in 0..scalars {
                let name = format!("s{index}");
                b.store(
                    "b0",
                    0u32,
                    Expr::load("b0", 0u32) + Expr::scalar(name.as_str()),
                );
            }
        })
        .build()
}

/// Locks out scalar parameters left out of the parameter-space limit (a kernel of
/// 362 buffers and a few scalars passing validation, then refused by ptxas): at 362
/// buffers two `u32` scalars fill the 4,352 bytes exactly and assemble, a third is
/// refused by the validator with a `Fix:` naming the scalars, and ptxas refuses the
/// at-limit module with one more `.u32` parameter spliced in. The byte count follows
/// the ABI (a `u64` scalar aligned to 8).
#[test]
fn scalars_share_the_parameter_space() {
    use vyre_cuda::ir::validate::kernel_parameter_bytes;
    let u64_scalar = [ScalarDecl::new("w", ScalarType::U64)];
    assert_eq!(kernel_parameter_bytes(1, &u64_scalar), 12 + 4 + 8);
    assert_eq!(kernel_parameter_bytes(2, &u64_scalar), 24 + 8);
    let at_limit = program_with_buffers_and_scalars(MAX_GLOBAL_BUFFERS, 2);
    validate(&at_limit, &Limits::default()).expect("362 buffers and 2 scalars fit");
    let past = program_with_buffers_and_scalars(MAX_GLOBAL_BUFFERS, 3);
    let error = validate(&past, &Limits::default()).expect_err("a third scalar");
    assert_eq!(error.rule(), Rule::TooManyBuffers, "{error}");
    for figure in ["Fix:", "362 global buffers", "3 scalars", "4356", "4352"] {
        assert!(error.message().contains(figure), "lacks {figure}: {error}");
    }
    validate(
        &program_with_buffers_and_scalars(MAX_GLOBAL_BUFFERS - 1, 3),
        &Limits::default(),
    )
    .expect("one buffer fewer makes room");
    let Some(ptxas) = ptxas::require("scalars_share_the_parameter_space") else {
        return;
    };
    let ptx = program_to_ptx(&at_limit, &CodegenOptions::default(), 90, 32).expect("emits");
    ptxas::assemble(&ptxas, "scalar_limit", &ptx)
        .unwrap_or_else(|e| panic!("ptxas refused 362 buffers and 2 scalars: {e}"));
    let entry = ".visible .entry vyre_entry(";
    let one_more = ptx.replacen(
        entry,
        &format!("{entry}\n\t.param .u32 vyre_scalar_extra,"),
        1,
    );
    let refusal = ptxas::assemble(&ptxas, "scalar_past_limit", &one_more)
        .expect_err("ptxas must refuse one more scalar");
    assert!(refusal.contains("parameter space"), "{refusal}");
}
