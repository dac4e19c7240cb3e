//! The device encoder's programs through validation, lowering, PTX generation
//! and the real `ptxas` (`support/assemble.rs`). The split's programs, which
//! the encoder runs between `stage` and the BPE steps, are assembled by
//! `pretokenize_ptx.rs`.

#[path = "support/assemble.rs"]
mod assemble;

use vyre_cuda::ir::{Expr, Node};
use vyre_tokenizer::device::programs::Programs;
use vyre_tokenizer::device::short::short_program;
use vyre_tokenizer::device::Geometry;
use vyre_tokenizer::pretokenize::pattern::Pattern;

/// Locks out programs the device would refuse: each stage and BPE step of the
/// default and a small geometry (with a loop cap) validates, lowers (both
/// reduction strategies), generates PTX and assembles with `ptxas
/// -arch=sm_90`.
#[test]
fn device_programs_validate_lower_and_assemble() {
    let small = Geometry {
        workgroup_size: 64,
        chunk_bytes: 8,
        repair_window_bytes: 24,
        repair_attempts: 2,
        compact_workgroups: 3,
        max_loop_iterations: Some(100),
        ..Geometry::default()
    };
    let sets: Vec<Programs> = [Geometry::default(), small]
        .into_iter()
        .map(|geometry| Programs::new(Pattern::Cl100k, geometry).expect("geometry"))
        .collect();
    assemble_all_sets(&sets);
}

fn assemble_all_sets(sets: &[Programs]) {
    assemble::assemble_all(
        "device_programs_validate_lower_and_assemble",
        sets.iter().flat_map(|programs| {
            programs
                .steps()
                .iter()
                .filter(|step| !step.split)
                .map(move |step| {
                    (
                        format!("bpe_{}_{}", step.name, programs.geometry.workgroup_size),
                        &step.program,
                    )
                })
        }),
    );
}

/// Locks out a short-text kernel the device would refuse (its steps' workgroup
/// memory together over the device's, a rewritten body the validator rejects,
/// PTX that `ptxas` does not take): the short-text program of each pattern at
/// the default geometry validates, lowers, generates PTX and assembles for
/// `sm_90`.
#[test]
fn short_text_programs_validate_lower_and_assemble() {
    let programs: Vec<(String, vyre_cuda::ir::Program)> =
        [Pattern::Gpt2, Pattern::Cl100k, Pattern::O200k]
            .into_iter()
            .map(|pattern| {
                let steps = Programs::new(pattern, Geometry::default()).expect("geometry");
                let short = short_program(&steps.steps()[1..], &Geometry::default())
                    .unwrap_or_else(|error| panic!("{pattern:?}: {error}"));
                (format!("short_{pattern:?}"), short.program)
            })
            .collect();
    assemble::assemble_all(
        "short_text_programs_validate_lower_and_assemble",
        programs
            .iter()
            .map(|(name, program)| (name.clone(), program)),
    );
}

/// Locks out a short-text rewrite that takes a step it cannot run inside one
/// workgroup's loop: a `return` (it would end the thread for every later group and
/// step) or a grid sync, even nested in an `if`, makes `short_program` fail naming
/// it. Control: the unaltered steps fuse.
#[test]
fn short_text_program_refuses_a_nested_return_or_grid_sync() {
    let programs = Programs::new(Pattern::Cl100k, Geometry::default()).expect("geometry");
    let steps = &programs.steps()[1..];
    assert!(short_program(steps, &Geometry::default()).is_ok());
    for (node, message) in [
        (Node::Return, "a step returns early"),
        (
            Node::GridSync,
            "a grid sync has no meaning in one workgroup",
        ),
    ] {
        let mut altered = steps.to_vec();
        let last = altered.last_mut().expect("steps");
        let mut entry = last.program.entry().to_vec();
        entry.push(Node::If {
            condition: Expr::bool(false),
            then_body: vec![node].into(),
            else_body: Vec::new().into(),
        });
        last.program = last
            .program
            .with_entry(last.program.buffers_shared().clone(), entry.into());
        let error = short_program(&altered, &Geometry::default())
            .expect_err("a step the short-text program cannot take");
        assert_eq!(error, message);
    }
}
