//! The device encoder's programs through validation, lowering, PTX generation
//! and the real `ptxas` (`support/assemble.rs`).

#[path = "support/assemble.rs"]
mod assemble;

use vyre_tokenizer::device::programs::Programs;
use vyre_tokenizer::device::Geometry;

/// Locks out programs the device would refuse: each step of the default and a
/// small geometry (with a loop cap) validates, lowers (both reduction
/// strategies), generates PTX and assembles with `ptxas -arch=sm_90`.
#[test]
fn device_programs_validate_lower_and_assemble() {
    let small = Geometry {
        workgroup_size: 64,
        chunk_bytes: 8,
        repair_window_bytes: 24,
        repair_attempts: 2,
        compact_workgroups: 3,
        max_loop_iterations: Some(100),
    };
    let sets: Vec<Programs> = [Geometry::default(), small]
        .into_iter()
        .map(|geometry| Programs::new(geometry).expect("geometry"))
        .collect();
    assemble_all_sets(&sets);
}

fn assemble_all_sets(sets: &[Programs]) {
    assemble::assemble_all(
        "device_programs_validate_lower_and_assemble",
        sets.iter().flat_map(|programs| {
            programs.steps().map(move |(step, program)| {
                (
                    format!("bpe_{}_{}", step.name, programs.geometry.workgroup_size),
                    program,
                )
            })
        }),
    );
}
