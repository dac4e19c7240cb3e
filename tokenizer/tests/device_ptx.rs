//! The device encoder's programs through validation, lowering, PTX generation
//! and the real `ptxas`, so a program the GPU machine would reject is caught on
//! a machine without a GPU. ptxas is found as `support/ptxas.rs` says; without
//! it the test prints that it skipped, unless `VYRE_REQUIRE_PTXAS=1` makes that
//! a failure.

#[path = "../../tests/support/ptxas.rs"]
mod ptxas;

use vyre_cuda::codegen::program_to_ptx;
use vyre_cuda::ir::{validate, validate_lowered, Limits};
use vyre_cuda::lower::{lower_workgroup_reductions, LoweringCaps};
use vyre_cuda::CodegenOptions;
use vyre_tokenizer::device::programs::Programs;
use vyre_tokenizer::device::Geometry;

/// Locks out programs the device would refuse: each step of the default and a
/// small geometry validates, lowers (both reduction strategies), generates PTX
/// and assembles with `ptxas -arch=sm_90`.
#[test]
fn device_programs_validate_lower_and_assemble() {
    let ptxas = ptxas::require("device_programs_validate_lower_and_assemble");
    let directory = tempfile::tempdir().expect("tempdir");
    let small = Geometry {
        workgroup_size: 64,
        chunk_bytes: 8,
        repair_window_bytes: 24,
        repair_attempts: 2,
        compact_workgroups: 3,
        max_loop_iterations: None,
    };
    for geometry in [Geometry::default(), small] {
        let programs = Programs::new(geometry).expect("geometry");
        for (step, program) in programs.steps() {
            validate(program, &Limits::default())
                .unwrap_or_else(|error| panic!("{}: {error}", step.name));
            for subgroup_ops in [true, false] {
                let caps = LoweringCaps {
                    subgroup_ops,
                    subgroup_size: 32,
                };
                let lowered = lower_workgroup_reductions(program, &caps);
                validate_lowered(&lowered, &Limits::default())
                    .unwrap_or_else(|error| panic!("{} lowered: {error}", step.name));
                let ptx = program_to_ptx(&lowered, &CodegenOptions::default(), 90, 32)
                    .unwrap_or_else(|error| panic!("{}: {error}", step.name));
                let Some(ptxas) = &ptxas else { continue };
                let name = format!(
                    "bpe_{}_{}_{}",
                    step.name,
                    geometry.workgroup_size,
                    if subgroup_ops { "subgroup" } else { "tree" }
                );
                ptxas::assemble_in(ptxas, directory.path(), &name, &ptx)
                    .unwrap_or_else(|report| panic!("{report}"));
            }
        }
    }
}
