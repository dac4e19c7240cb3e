//! The pretokenize programs (GPT-2's single-document pipeline and the batch
//! split of every pattern) through validation, lowering, PTX generation and the
//! real `ptxas` (`support/assemble.rs`), so a program the GPU machine would
//! reject is caught on a machine without a GPU.

#[path = "support/assemble.rs"]
mod assemble;

use vyre_tokenizer::pretokenize::batch::SplitPrograms;
use vyre_tokenizer::pretokenize::pattern::Pattern;
use vyre_tokenizer::pretokenize::programs::{build, programs};
use vyre_tokenizer::pretokenize::Geometry;

/// Locks out programs the device would refuse: each step of the default and a
/// small geometry validates, lowers (both reduction strategies), generates PTX
/// and assembles with `ptxas -arch=sm_90`.
#[test]
fn pretokenize_programs_validate_lower_and_assemble() {
    let small = build(Geometry {
        workgroup_size: 48,
        bytes_per_thread: 3,
        compact_workgroups: 5,
    })
    .expect("geometry");
    let sets = [programs(), small];
    assemble::assemble_all(
        "pretokenize_programs_validate_lower_and_assemble",
        sets.iter().flat_map(|programs| {
            programs.steps().map(move |(step, program)| {
                (
                    format!("{}_{}", step.name, programs.geometry.workgroup_size),
                    program,
                )
            })
        }),
    );
}

/// Locks out batch programs the device would refuse: every step of every
/// pattern's batch split, with the default geometry and a small one (16
/// threads of 2 bytes) and a large one (512 threads of 4 bytes), validates,
/// lowers (both reduction and scan strategies), generates PTX and assembles
/// with `ptxas -arch=sm_90`.
#[test]
fn batch_split_programs_validate_lower_and_assemble() {
    let mut sets = Vec::new();
    for pattern in Pattern::ALL {
        for (workgroup_size, bytes_per_thread) in [(256, 4), (16, 2), (512, 4)] {
            let geometry = Geometry {
                workgroup_size,
                bytes_per_thread,
                compact_workgroups: 1,
            };
            sets.push(SplitPrograms::build(pattern, geometry).expect("geometry"));
        }
    }
    assemble::assemble_all(
        "batch_split_programs_validate_lower_and_assemble",
        sets.iter().flat_map(|programs| {
            programs.steps().iter().map(move |step| {
                (
                    format!(
                        "batch_{}_{}_{}",
                        programs.pattern().name(),
                        step.name,
                        programs.geometry().workgroup_size
                    ),
                    &step.program,
                )
            })
        }),
    );
}
