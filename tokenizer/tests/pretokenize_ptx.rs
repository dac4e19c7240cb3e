//! The pretokenize programs (GPT-2's single-document pipeline and the batch
//! split of every pattern) through validation, lowering, PTX generation and the
//! real `ptxas`, so a program the GPU machine would reject is caught on a
//! machine without a GPU. ptxas is found as `support/ptxas.rs` says; without it the
//! test prints that it skipped, unless `VYRE_REQUIRE_PTXAS=1` makes that a failure.

#[path = "../../tests/support/ptxas.rs"]
mod ptxas;

use vyre_cuda::codegen::program_to_ptx;
use vyre_cuda::ir::{validate, validate_lowered, Limits};
use vyre_cuda::lower::{lower_workgroup_reductions, LoweringCaps};
use vyre_cuda::CodegenOptions;
use vyre_tokenizer::pretokenize::batch::SplitPrograms;
use vyre_tokenizer::pretokenize::pattern::Pattern;
use vyre_tokenizer::pretokenize::programs::{build, programs};
use vyre_tokenizer::pretokenize::Geometry;

/// Validates `program`, lowers it both ways (subgroup steps and shared-memory
/// trees), generates PTX and, with ptxas found, assembles it as `name_<way>`.
fn check_program(
    ptxas: Option<&std::path::Path>,
    directory: &std::path::Path,
    name: &str,
    program: &vyre_cuda::ir::Program,
) {
    validate(program, &Limits::default()).unwrap_or_else(|error| panic!("{name}: {error}"));
    for subgroup_ops in [true, false] {
        let caps = LoweringCaps {
            subgroup_ops,
            subgroup_size: 32,
        };
        let lowered = lower_workgroup_reductions(program, &caps);
        validate_lowered(&lowered, &Limits::default())
            .unwrap_or_else(|error| panic!("{name} lowered: {error}"));
        let ptx = program_to_ptx(&lowered, &CodegenOptions::default(), 90, 32)
            .unwrap_or_else(|error| panic!("{name}: {error}"));
        let Some(ptxas) = ptxas else { continue };
        let way = if subgroup_ops { "subgroup" } else { "tree" };
        ptxas::assemble_in(ptxas, directory, &format!("{name}_{way}"), &ptx)
            .unwrap_or_else(|report| panic!("{report}"));
    }
}

/// Locks out programs the device would refuse: each step of the default and a
/// small geometry validates, lowers (both reduction strategies), generates PTX
/// and assembles with `ptxas -arch=sm_90`.
#[test]
fn pretokenize_programs_validate_lower_and_assemble() {
    let ptxas = ptxas::require("pretokenize_programs_validate_lower_and_assemble");
    let directory = tempfile::tempdir().expect("tempdir");
    let small = build(Geometry {
        workgroup_size: 48,
        bytes_per_thread: 3,
        compact_workgroups: 5,
    })
    .expect("geometry");
    for programs in [programs(), small] {
        for (step, program) in programs.steps() {
            let name = format!("{}_{}", step.name, programs.geometry.workgroup_size);
            check_program(ptxas.as_deref(), directory.path(), &name, program);
        }
    }
}

/// Locks out batch programs the device would refuse: every step of every
/// pattern's batch split, with the default geometry and a small one (16
/// threads of 2 bytes) and a large one (512 threads of 4 bytes), validates,
/// lowers (both reduction and scan strategies), generates PTX and assembles
/// with `ptxas -arch=sm_90`.
#[test]
fn batch_split_programs_validate_lower_and_assemble() {
    let ptxas = ptxas::require("batch_split_programs_validate_lower_and_assemble");
    let directory = tempfile::tempdir().expect("tempdir");
    for pattern in Pattern::ALL {
        for (workgroup_size, bytes_per_thread) in [(256, 4), (16, 2), (512, 4)] {
            let geometry = Geometry {
                workgroup_size,
                bytes_per_thread,
                compact_workgroups: 1,
            };
            let programs = SplitPrograms::build(pattern, geometry).expect("geometry");
            for step in programs.steps() {
                let name = format!("batch_{}_{}_{workgroup_size}", pattern.name(), step.name);
                check_program(ptxas.as_deref(), directory.path(), &name, &step.program);
            }
        }
    }
}
