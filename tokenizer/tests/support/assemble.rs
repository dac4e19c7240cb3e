//! Programs through validation, lowering (both reduction strategies), PTX
//! generation and the real `ptxas -arch=sm_90`, so a program the GPU machine
//! would reject is caught on a machine without a GPU. Shared by
//! `pretokenize_ptx.rs` and `device_ptx.rs`; include it with
//! `#[path = "support/assemble.rs"] mod assemble;`. ptxas is found as the root
//! crate's `tests/support/ptxas.rs` says; without it the check prints that it
//! skipped, unless `VYRE_REQUIRE_PTXAS=1` makes that a failure.
#![allow(dead_code)]

#[path = "../../../tests/support/ptxas.rs"]
pub mod ptxas;

use vyre_cuda::codegen::program_to_ptx;
use vyre_cuda::ir::{validate, validate_lowered, Limits, Program};
use vyre_cuda::lower::{lower_workgroup_reductions, LoweringCaps};
use vyre_cuda::CodegenOptions;

/// Validates, lowers, generates and assembles each `(name, program)`; `test`
/// names the calling test in the skip message.
pub fn assemble_all<'p>(test: &str, programs: impl IntoIterator<Item = (String, &'p Program)>) {
    assemble_all_within(test, &Limits::default(), programs);
}

/// Workgroup memory an H200 gives one kernel that opts in (dynamic shared
/// memory past the static 48 KiB), as `cuDeviceGetAttribute` reports it.
pub const H200_SHARED_MEMORY_BYTES: u32 = 232_448;

/// [`assemble_all`] under `limits` (a device's: workgroup memory past the
/// default 48 KiB becomes one dynamic pool).
pub fn assemble_all_within<'p>(
    test: &str,
    limits: &Limits,
    programs: impl IntoIterator<Item = (String, &'p Program)>,
) {
    let ptxas = ptxas::require(test);
    let directory = tempfile::tempdir().expect("tempdir");
    for (name, program) in programs {
        validate(program, limits).unwrap_or_else(|error| panic!("{name}: {error}"));
        for subgroup_ops in [true, false] {
            let caps = LoweringCaps {
                subgroup_ops,
                subgroup_size: 32,
            };
            let lowered = lower_workgroup_reductions(program, &caps);
            validate_lowered(&lowered, limits)
                .unwrap_or_else(|error| panic!("{name} lowered: {error}"));
            let ptx = program_to_ptx(&lowered, &CodegenOptions::default(), 90, 32)
                .unwrap_or_else(|error| panic!("{name}: {error}"));
            let Some(ptxas) = &ptxas else { continue };
            let file = format!("{name}_{}", if subgroup_ops { "subgroup" } else { "tree" });
            ptxas::assemble_in(ptxas, directory.path(), &file, &ptx)
                .unwrap_or_else(|report| panic!("{report}"));
        }
    }
}
