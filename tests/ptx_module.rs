//! PTX modules of several kernels ([`PtxModuleBuilder`]): what `compile_batch` loads
//! with one `cuModuleLoadData` (the driver JIT per module dominated the GPU
//! differential once constants were hidden from it: ~44 ms per one-program module on
//! the H200). The real `ptxas` assembles such modules for `sm_90`, each
//! kernel is exactly its single-program kernel but for its indexed names, and the
//! builder's refusals leave it unchanged.

#[path = "support/ptxas.rs"]
mod ptxas;

use std::sync::Arc;

use vyre_cuda::codegen::ptx::MAX_PTX_BYTES;
use vyre_cuda::codegen::{
    entry_symbol, module_entry_name, module_grid_barrier_symbol, program_to_ptx,
    program_to_ptx_with_results, CodegenError, PtxModuleBuilder, GRID_BARRIER_SYMBOL,
};
use vyre_cuda::ir::generate::{valid_program, GeneratorOptions};
use vyre_cuda::ir::*;
use vyre_cuda::lower::{lower_workgroup_reductions, LoweringCaps};
use vyre_cuda::CodegenOptions;

/// `count` generated programs, lowered (subgroup and shared-memory tree lowering
/// alternate), every third one allowed a grid sync, with their codegen options.
fn lowered_programs(count: u64) -> Vec<(Program, CodegenOptions)> {
    (0..count)
        .map(|seed| {
            let options = GeneratorOptions {
                allow_grid_sync: seed % 3 == 0,
                ..GeneratorOptions::default()
            };
            let case = valid_program(7_000 + seed, &options);
            let caps = LoweringCaps::new(seed % 2 == 0, 32).expect("caps");
            (
                lower_workgroup_reductions(&case.program, &caps),
                case.config.codegen,
            )
        })
        .collect()
}

/// The builder of the given ABI.
fn builder(results: bool, options: &CodegenOptions) -> PtxModuleBuilder {
    if results {
        PtxModuleBuilder::with_results(options, 90, 32)
    } else {
        PtxModuleBuilder::new(options, 90, 32)
    }
}

/// The single-program module of the given ABI.
fn single(results: bool, program: &Program, options: &CodegenOptions) -> String {
    let emit = if results {
        program_to_ptx_with_results
    } else {
        program_to_ptx
    };
    emit(program, options, 90, 32).expect("single-program PTX")
}

/// Locks out a multi-kernel module the driver would refuse (two kernels' entries or
/// module-scope symbols colliding, a second header or opaque-zero declaration, an
/// entry with a wrong name): 48 generated programs (grid syncs, workgroup memory and
/// both lowerings among them) in one module of each ABI assemble with ptxas for
/// sm_90, with one entry per program named by its index and a grid barrier exactly
/// for the programs that have one. Negative control: the same module with kernel 1's
/// entry renamed to kernel 0's is refused by ptxas.
#[test]
fn module_of_generated_programs_assembles_with_ptxas() {
    let Some(ptxas) = ptxas::require("module_of_generated_programs_assembles_with_ptxas") else {
        return;
    };
    let programs = lowered_programs(48);
    let options = CodegenOptions::default();
    let mut grid_syncs = 0;
    for results in [false, true] {
        let mut module = builder(results, &options);
        for (index, (program, _)) in programs.iter().enumerate() {
            let entry = module
                .push(program)
                .unwrap_or_else(|e| panic!("program {index}: {e}\n{program}"));
            assert_eq!(entry.index, index);
            assert_eq!(entry.entry, module_entry_name(index));
            let has_grid_sync = single(results, program, &options).contains(GRID_BARRIER_SYMBOL);
            assert_eq!(
                entry.grid_barrier,
                has_grid_sync.then(|| module_grid_barrier_symbol(index)),
                "program {index}"
            );
            grid_syncs += has_grid_sync as usize;
        }
        assert_eq!(module.len(), programs.len());
        let ptx = module.finish();
        assert_eq!(ptx.matches(".visible .entry ").count(), programs.len());
        assert_eq!(ptx.matches(".version ").count(), 1);
        assert_eq!(
            ptx.matches(".const .align 4 .u32 vyre_opaque_zero").count(),
            1
        );
        let name = if results {
            "module_results"
        } else {
            "module_plain"
        };
        ptxas::assemble(&ptxas, name, &ptx).unwrap_or_else(|e| panic!("{e}"));
        if results {
            let collided = ptx.replace(
                &format!(".entry {}(", module_entry_name(1)),
                &format!(".entry {}(", module_entry_name(0)),
            );
            assert!(
                ptxas::assemble(&ptxas, "collided", &collided).is_err(),
                "ptxas accepted two entries of one name: the assembler check is inert"
            );
        }
    }
    assert!(grid_syncs > 0, "no generated program had a grid sync");
}

/// The single-program module of `program` with its kernel's names given kernel
/// `index`'s, split into its header (comment, version, target, opaque zero) and
/// the kernel. The single-program entry is named after the program's entry op id
/// where it has one ([`entry_symbol`]).
fn renamed_single_kernel(program: &Program, ptx: &str, index: usize) -> String {
    let opaque = ".u32 vyre_opaque_zero = 0;\n\n";
    let comment_end = ptx.find(".version ").expect("header");
    let kernel_start = ptx.find(opaque).expect("opaque zero") + opaque.len();
    let kernel = format!("{}{}", &ptx[..comment_end], &ptx[kernel_start..]);
    kernel
        .replace(
            &format!(".entry {}(", entry_symbol(program)),
            &format!(".entry {}(", module_entry_name(index)),
        )
        .replace(GRID_BARRIER_SYMBOL, &module_grid_barrier_symbol(index))
        .replace("vyre_shared_", &format!("vyre_shared_{index}_"))
        .replace(
            "vyre_block_finished",
            &format!("vyre_block_finished_{index}"),
        )
}

/// Locks out a kernel in a shared module that computes anything else than the
/// program's own single-program kernel (the one every snapshot, ptxas and GPU test
/// checks): the module is, byte for byte, its header, then each program's
/// single-program kernel with only its entry, grid-barrier, workgroup-buffer and
/// block-counter names indexed, in order, for both ABIs. (The single-program output itself is locked by
/// the PTX snapshots in tests/snapshots/ptx, unchanged by the module writer.)
#[test]
fn module_kernels_are_their_single_program_kernels_but_for_their_names() {
    let programs = lowered_programs(24);
    let mut saw_shared = false;
    let mut saw_counter = false;
    for results in [false, true] {
        let options = CodegenOptions::default();
        let mut module = builder(results, &options);
        let mut expected_kernels = String::new();
        let mut header = String::new();
        for (index, (program, _)) in programs.iter().enumerate() {
            module.push(program).expect("push");
            let ptx = single(results, program, &options);
            saw_shared |= ptx.contains(".shared .align 4 .b8");
            saw_counter |= ptx.contains("vyre_block_finished");
            let opaque = ".u32 vyre_opaque_zero = 0;\n\n";
            let header_range = ptx.find(".version ").expect("version")
                ..ptx.find(opaque).expect("opaque") + opaque.len();
            header = ptx[header_range].to_owned();
            expected_kernels.push('\n');
            expected_kernels.push_str(&renamed_single_kernel(program, &ptx, index));
        }
        let expected = format!(
            "//\n// vyre-cuda module of {} kernels\n//\n{header}{expected_kernels}",
            programs.len()
        );
        assert_same_text(&module.finish(), &expected, results);
    }
    assert!(
        saw_shared,
        "no program had workgroup memory: the rename is untested"
    );
    assert!(
        saw_counter,
        "no kernel counted per block: the counter's rename is untested"
    );
}

/// Fails with the first differing line (the modules are too long to print whole).
fn assert_same_text(got: &str, expected: &str, results: bool) {
    let mismatch = got
        .lines()
        .zip(expected.lines())
        .enumerate()
        .find(|(_, (a, b))| a != b);
    if let Some((number, (a, b))) = mismatch {
        panic!(
            "results ABI {results}: line {}: got `{a}`, expected `{b}`",
            number + 1
        );
    }
    assert_eq!(
        got.len(),
        expected.len(),
        "results ABI {results}: lengths differ"
    );
}

/// A program whose workgroup reduction was not lowered (code generation cannot emit
/// it): each workgroup's sum of its local ids.
fn unlowered_reduction() -> Program {
    Program::builder([32, 1, 1])
        .buffer(
            "sums",
            0,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Static(1),
        )
        .body(|b| {
            let total = b.workgroup_reduce("total", ReduceOp::Sum, Expr::local_id(Axis::X));
            b.store("sums", 0u32, total);
        })
        .build()
}

/// Locks out a refusal that corrupts the module (a half-written kernel, a skipped
/// index) or a refusal without its cause: an unlowered reduction gets the
/// validator's `WorkgroupReduceNotLowered` error with its `Fix:` message, an old
/// target `UnsupportedTarget`, and after both the module is exactly what it was and
/// the next program gets the next index.
#[test]
fn a_refused_program_leaves_the_module_unchanged() {
    let programs = lowered_programs(2);
    let options = CodegenOptions::default();
    let mut module = PtxModuleBuilder::with_results(&options, 90, 32);
    module.push(&programs[0].0).expect("first program");
    let before = module.clone().finish();
    let error = module
        .push(&unlowered_reduction())
        .expect_err("unlowered reduction");
    assert!(
        matches!(&error, CodegenError::Invalid(e) if e.rule() == validate::Rule::WorkgroupReduceNotLowered),
        "{error:?}"
    );
    assert!(error.to_string().starts_with("Fix:"), "{error}");
    let mut old = PtxModuleBuilder::new(&options, 60, 32);
    assert_eq!(
        old.push(&programs[0].0),
        Err(CodegenError::UnsupportedTarget { sm: 60 })
    );
    assert!(old.is_empty());
    assert_eq!(module.len(), 1);
    assert_eq!(module.clone().finish(), before);
    assert_eq!(module.push(&programs[1].0).expect("second").index, 1);
}

/// A program of `2^levels` returns under shared `if` blocks: a few MiB of PTX.
fn large_program(levels: usize) -> Program {
    let mut block: Block = Arc::from(vec![Node::Return]);
    for _ in 0..levels {
        block = Arc::from(vec![Node::If {
            condition: Expr::bool(true),
            then_body: block.clone(),
            else_body: block,
        }]);
    }
    Program::new(Vec::new(), [1, 1, 1], block.to_vec())
}

/// Locks out a module past the 16 MiB limit (the backend would hand the driver a
/// module it refuses, or split nothing): pushing a ~3 MiB program repeatedly, the
/// push that would pass [`MAX_PTX_BYTES`] gets `ModuleFull` naming the kernels
/// already in the module, the module is unchanged and under the limit, and a new
/// module takes the refused program.
#[test]
fn a_full_module_refuses_the_next_program_and_stays_under_the_limit() {
    let program = large_program(14);
    let options = CodegenOptions::default();
    let size = program_to_ptx(&program, &options, 90, 32)
        .expect("ptx")
        .len();
    assert!(
        size > MAX_PTX_BYTES / 8 && size < MAX_PTX_BYTES / 2,
        "the fixture should be a few MiB, is {size} bytes"
    );
    let mut module = PtxModuleBuilder::new(&options, 90, 32);
    let refusal = loop {
        let before = module.clone().finish();
        match module.push(&program) {
            Ok(entry) => assert!(entry.index < 16, "a full module was never refused"),
            Err(error) => {
                assert_eq!(
                    module.clone().finish(),
                    before,
                    "a refusal changed the module"
                );
                break error;
            }
        }
    };
    assert_eq!(
        refusal,
        CodegenError::ModuleFull {
            kernels: module.len(),
            limit_bytes: MAX_PTX_BYTES
        }
    );
    assert!(refusal.to_string().starts_with("Fix:"), "{refusal}");
    assert!(module.len() >= 2, "only {} kernels fitted", module.len());
    assert!(module.finish().len() <= MAX_PTX_BYTES);
    let mut next = PtxModuleBuilder::new(&options, 90, 32);
    assert_eq!(next.push(&program).expect("a new module").index, 0);
}
