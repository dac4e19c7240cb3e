//! The device encoder's programs through validation, lowering, PTX generation
//! and the real `ptxas` (`support/assemble.rs`). The split's programs, which
//! the encoder runs between `stage` and the BPE steps, are assembled by
//! `pretokenize_ptx.rs`.

#[path = "support/assemble.rs"]
mod assemble;

use assemble::ptxas;
use vyre_cuda::codegen::{multiprocessor_limits, program_to_ptx_with_results};
use vyre_cuda::ir::{Expr, Node};
use vyre_cuda::lower::{lower_workgroup_reductions, LoweringCaps};
use vyre_tokenizer::device::fused::{resident_program, short_program, Spread};
use vyre_tokenizer::device::programs::Programs;
use vyre_tokenizer::device::{Geometry, ShortText};
use vyre_tokenizer::occupancy::Occupancy;
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
/// the default geometry and in the other workgroups the bench's short-text
/// sweep measures (512 and 1,024 threads) validates, lowers, generates PTX and
/// assembles for `sm_90` within an H200's workgroup memory.
#[test]
fn short_text_programs_validate_lower_and_assemble() {
    let shapes = [
        ShortText::default(),
        ShortText {
            workgroup_size: 512,
            bytes_per_thread: 2,
            ..ShortText::default()
        },
        ShortText {
            workgroup_size: 1024,
            bytes_per_thread: 1,
            ..ShortText::default()
        },
        ShortText {
            workgroup_size: 1024,
            bytes_per_thread: 4,
            ..ShortText::default()
        },
    ];
    let mut programs: Vec<(String, vyre_cuda::ir::Program)> = Vec::new();
    for pattern in [Pattern::Gpt2, Pattern::Cl100k, Pattern::O200k] {
        for short_text in shapes {
            let geometry = Geometry {
                short_text,
                ..Geometry::default()
            }
            .short();
            let steps = Programs::new(pattern, geometry).expect("geometry");
            let short = short_program(&steps.fused_steps(Spread::OneWorkgroup), &geometry)
                .unwrap_or_else(|error| panic!("{pattern:?}, {short_text:?}: {error}"));
            programs.push((
                format!(
                    "short_{pattern:?}_{}x{}",
                    short_text.workgroup_size, short_text.bytes_per_thread
                ),
                short.program,
            ));
        }
    }
    assemble_within_an_h200("short_text_programs_validate_lower_and_assemble", &programs);
}

/// `programs` validated, lowered, generated and assembled for `sm_90` within
/// an H200's workgroup memory: past 48 KiB the backend gives a kernel the
/// device's opt-in workgroup memory as one dynamic pool.
fn assemble_within_an_h200(test: &str, programs: &[(String, vyre_cuda::ir::Program)]) {
    let h200 = vyre_cuda::ir::Limits {
        max_shared_memory_bytes: assemble::H200_SHARED_MEMORY_BYTES,
        ..vyre_cuda::ir::Limits::default()
    };
    assemble::assemble_all_within(
        test,
        &h200,
        programs
            .iter()
            .map(|(name, program)| (name.clone(), program)),
    );
}

/// Locks out a resident-grid kernel the device would refuse (its `stage`
/// polls host-written flags with system-scope acquire loads, the rest as
/// every step, rewritten to deal its groups over a grid): for each pattern
/// the resident program at the default geometry validates, lowers (both
/// reduction strategies), generates PTX and assembles for `sm_90` within an
/// H200's workgroup memory.
#[test]
fn resident_programs_validate_lower_and_assemble() {
    let geometry = Geometry::default();
    let programs: Vec<(String, vyre_cuda::ir::Program)> =
        [Pattern::Gpt2, Pattern::Cl100k, Pattern::O200k]
            .into_iter()
            .map(|pattern| {
                let steps = Programs::new(pattern, geometry)
                    .expect("geometry")
                    .fused_steps(Spread::ResidentGrid);
                let resident = resident_program(&steps, &geometry)
                    .unwrap_or_else(|error| panic!("{pattern:?}: {error}"));
                (format!("resident_{pattern:?}"), resident.program)
            })
            .collect();
    assemble_within_an_h200("resident_programs_validate_lower_and_assemble", &programs);
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

/// Locks out a fused kernel that reads its text length from the staged
/// parameters before its first step (host-mapped memory on CUDA: a PCIe round
/// trip and a workgroup reduction before any step begins): for every pattern
/// the short-text and resident-grid programs declare the `u32` scalars
/// `TEXT_LEN_SCALAR` and `DOCUMENTS_SCALAR` and load no buffer before the
/// first step's loop, where their group counts already depend on the text
/// length.
#[test]
fn fused_programs_take_the_text_length_as_a_scalar() {
    for pattern in [Pattern::Gpt2, Pattern::Cl100k, Pattern::O200k] {
        let geometry = Geometry::default();
        let programs = Programs::new(pattern, geometry).expect("geometry");
        let short_steps = programs.fused_steps(Spread::OneWorkgroup);
        let resident_steps = programs.fused_steps(Spread::ResidentGrid);
        for program in [
            short_program(&short_steps, &geometry)
                .expect("short")
                .program,
            resident_program(&resident_steps, &geometry)
                .expect("resident")
                .program,
        ] {
            assert!(declares_the_fused_scalars(&program), "{pattern:?}");
            let before_steps: Vec<&Node> = program
                .entry()
                .iter()
                .take_while(|node| !matches!(node, Node::Loop { .. }))
                .collect();
            // Only `let`s (the clock, the text length, the first step's group
            // count), none of them loading a buffer.
            assert!(
                before_steps
                    .iter()
                    .all(|node| matches!(node, Node::Let { .. })
                        && !format!("{node:?}").contains("Load")),
                "{pattern:?}: {before_steps:?}"
            );
        }
    }
}

/// Locks out a fused kernel built like the standalone steps (byte-by-byte
/// lookups, merges in the slab with one pair lookup after the other: round
/// trips to L2 more in every lookup and every merge, where registers are no
/// limit), and standalone `pieces`, `merge` and `long` steps that take on the
/// fused build's registers at their requested occupancy: for every pattern the
/// fused steps' `pieces`, `merge` and `long` are the fused build and the
/// step-by-step ones the standalone build (negative control: the two builds
/// are different programs).
#[test]
fn fused_steps_take_the_fused_build() {
    use vyre_tokenizer::device::programs::{
        long, long_with, merge, merge_with, pieces, pieces_with, StepBuild,
    };
    for pattern in [Pattern::Gpt2, Pattern::Cl100k, Pattern::O200k] {
        let geometry = Geometry::default();
        let programs = Programs::new(pattern, geometry).expect("geometry");
        let fused = programs.fused_steps(Spread::ResidentGrid);
        for (name, together, apart) in [
            (
                "pieces",
                pieces_with(&geometry, StepBuild::Fused),
                pieces(&geometry),
            ),
            (
                "merge",
                merge_with(&geometry, StepBuild::Fused),
                merge(&geometry),
            ),
            (
                "long",
                long_with(&geometry, StepBuild::Fused),
                long(&geometry),
            ),
        ] {
            assert_ne!(together, apart, "{name}: the two builds are one program");
            let fused_step = fused.iter().find(|step| step.name == name).expect(name);
            assert_eq!(fused_step.program, together, "{pattern:?} fused {name}");
            let step = programs
                .steps()
                .iter()
                .find(|step| step.name == name)
                .expect(name);
            assert_eq!(step.program, apart, "{pattern:?} step {name}");
        }
    }
}

/// Locks out a `merge` build that reads the other build's knob: the fused
/// merge's registers following the standalone slab's length (as they did
/// until `Geometry::register_merge_bytes`: 12 bytes in registers where 16 were
/// measured faster for code), or the standalone step taking the register
/// width (its slab, and with it its workgroup memory and occupancy, would
/// change). The standalone `merge` is one program whatever
/// `register_merge_bytes` (0, 16, 31) and `fused_merge_slab_bytes` (31), the
/// fused one whatever `merge_slab_bytes` (0, 12, 24); the fused one declares
/// no workgroup buffer at any width without its own slab, and one of
/// `fused_merge_slab_bytes` words a thread with it (the default's and 31's);
/// the short-text kernel's fused one reads `ShortText::register_merge_bytes`,
/// whatever `register_merge_bytes` (0, 12, 31), the resident grid's; controls:
/// each build changes with its own knob.
#[test]
fn each_merge_build_reads_its_own_length() {
    use vyre_cuda::ir::Access;
    use vyre_tokenizer::device::programs::{
        merge, merge_with, StepBuild, MAX_REGISTER_MERGE_BYTES,
    };
    let default = Geometry::default();
    let with = |merge_slab_bytes, register_merge_bytes| Geometry {
        merge_slab_bytes,
        register_merge_bytes,
        ..default
    };
    // The static words of each workgroup buffer a program declares.
    let workgroup_words = |program: &vyre_cuda::ir::Program| -> Vec<u32> {
        program
            .buffers()
            .iter()
            .filter(|buffer| buffer.access == Access::Workgroup)
            .map(|buffer| match buffer.count {
                vyre_cuda::ir::BufferCount::Static(words) => words,
                _ => 0,
            })
            .collect()
    };
    let standalone = merge(&default);
    let fused = merge_with(&default, StepBuild::Fused);
    for register_bytes in [0, 16, 31] {
        assert_eq!(
            merge(&with(default.merge_slab_bytes, register_bytes)),
            standalone,
            "standalone merge at {register_bytes} register bytes"
        );
    }
    let threads = default.workgroup_size;
    assert_eq!(
        workgroup_words(&fused),
        [default.fused_merge_slab_bytes * threads],
        "fused merge at the default slab"
    );
    let fused_slab = Geometry {
        fused_merge_slab_bytes: MAX_REGISTER_MERGE_BYTES,
        ..default
    };
    assert_eq!(
        merge(&fused_slab),
        standalone,
        "standalone merge, fused slab"
    );
    assert_eq!(
        workgroup_words(&merge_with(&fused_slab, StepBuild::Fused)),
        [MAX_REGISTER_MERGE_BYTES * threads]
    );
    for slab_bytes in [0, 12, 24] {
        let program = merge_with(
            &with(slab_bytes, default.register_merge_bytes),
            StepBuild::Fused,
        );
        assert_eq!(program, fused, "fused merge at a {slab_bytes}-byte slab");
    }
    for register_bytes in [0, 12, 16, 31] {
        let without_slab = Geometry {
            fused_merge_slab_bytes: 0,
            ..with(default.merge_slab_bytes, register_bytes)
        };
        let program = merge_with(&without_slab, StepBuild::Fused);
        assert_eq!(
            workgroup_words(&program),
            [],
            "fused merge at {register_bytes} register bytes declares workgroup memory"
        );
    }
    assert_ne!(merge(&with(16, default.register_merge_bytes)), standalone);
    assert_ne!(
        merge_with(&with(default.merge_slab_bytes, 12), StepBuild::Fused),
        fused
    );
    // The short-text kernel's steps take its own register length.
    let short_fused = merge_with(&default.short(), StepBuild::Fused);
    for register_bytes in [0, 12, 31] {
        assert_eq!(
            merge_with(
                &with(default.merge_slab_bytes, register_bytes).short(),
                StepBuild::Fused
            ),
            short_fused,
            "short-text merge at {register_bytes} resident register bytes"
        );
    }
    let short_registers = |register_merge_bytes| Geometry {
        short_text: ShortText {
            register_merge_bytes,
            ..default.short_text
        },
        ..default
    };
    assert_ne!(
        merge_with(&short_registers(12).short(), StepBuild::Fused),
        short_fused
    );
    assert_ne!(
        default.short_text.register_merge_bytes, default.register_merge_bytes,
        "by default the short-text kernel keeps ranges in registers and the resident grid none"
    );
}

/// Locks out a fused kernel's `stage` that reads the text length or the
/// number of documents from the staged parameters (host-mapped memory on
/// CUDA: a round trip across PCIe before the text's loads can go out, and in
/// the resident grid every warp's own) where the fused kernel has them as its
/// scalars: the fused steps' `stage` declares the `u32` scalars
/// `TEXT_LEN_SCALAR` and `DOCUMENTS_SCALAR` and takes `text_len` and
/// `documents` from them, and the short-text program accepts those scalars;
/// the standalone `stage` (control) declares none and loads both.
#[test]
fn the_fused_stage_takes_the_text_length_from_the_scalar() {
    use vyre_tokenizer::device::fused::{DOCUMENTS_SCALAR, TEXT_LEN_SCALAR};
    let value_of = |program: &vyre_cuda::ir::Program, wanted: &str| -> Expr {
        program
            .entry()
            .iter()
            .find_map(|node| match node {
                Node::Let { name, value, .. } if &**name == wanted => Some(value.clone()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("a {wanted} let"))
    };
    let text_len = |program: &vyre_cuda::ir::Program| value_of(program, "text_len");
    let documents = |program: &vyre_cuda::ir::Program| value_of(program, "documents");
    let geometry = Geometry::default();
    let programs = Programs::new(Pattern::Cl100k, geometry).expect("geometry");
    for spread in [Spread::OneWorkgroup, Spread::ResidentGrid] {
        let fused = programs.fused_steps(spread);
        let stage = &fused[0].program;
        assert!(declares_the_fused_scalars(stage), "{spread:?}");
        assert_eq!(text_len(stage), Expr::scalar(TEXT_LEN_SCALAR));
        assert_eq!(documents(stage), Expr::scalar(DOCUMENTS_SCALAR));
    }
    assert!(short_program(&programs.fused_steps(Spread::OneWorkgroup), &geometry).is_ok());
    let standalone = &programs.steps()[0].program;
    assert!(standalone.scalars().is_empty());
    assert!(matches!(text_len(standalone), Expr::Load { .. }));
    assert!(matches!(documents(standalone), Expr::Load { .. }));
}

/// Locks out a fused kernel's `stage` that reads the staged parameters
/// (host-mapped memory on CUDA, a round trip across PCIe on the way to the
/// first barrier or grid sync) although they are its two scalars and zeros:
/// the fused steps' `stage` loads no word of `staged_params`, while the
/// standalone `stage` (control) does.
#[test]
fn the_fused_stage_writes_the_parameters_from_its_scalars() {
    let programs = Programs::new(Pattern::Cl100k, Geometry::default()).expect("geometry");
    let loads_staged_params =
        |program: &vyre_cuda::ir::Program| program.to_string().contains("staged_params[");
    for spread in [Spread::OneWorkgroup, Spread::ResidentGrid] {
        let fused_stage = &programs.fused_steps(spread)[0].program;
        assert!(!loads_staged_params(fused_stage));
        // The printed program is whole: its text's loads are there.
        assert!(fused_stage.to_string().contains("staged_text["));
    }
    assert!(loads_staged_params(&programs.steps()[0].program));
}

/// Locks out a resident kernel that reads the staged text before the host
/// has written it, now that the host gathers the text while the kernel runs
/// (`AnyGraph::replay_feeding`): the resident grid's `stage` polls
/// `text_ready` with an acquire load, then reaches a workgroup barrier, and
/// only then loads `staged_text`. Control: the short-text kernel's `stage`,
/// whose text is gathered before its launch, polls nothing.
#[test]
fn the_resident_stage_reads_each_piece_once_it_is_ready() {
    let programs = Programs::new(Pattern::Cl100k, Geometry::default()).expect("geometry");
    let printed = |spread| programs.fused_steps(spread)[0].program.to_string();
    let resident = printed(Spread::ResidentGrid);
    let poll = resident
        .find("acquire_load(&text_ready[")
        .unwrap_or_else(|| panic!("no poll of the flags: {resident}"));
    let barrier = resident[poll..]
        .find("workgroup_barrier()")
        .map(|at| poll + at)
        .unwrap_or_else(|| panic!("no barrier after the poll: {resident}"));
    let text_load = resident
        .find("staged_text[")
        .unwrap_or_else(|| panic!("no load of the text: {resident}"));
    assert!(barrier < text_load, "{resident}");
    assert!(!printed(Spread::OneWorkgroup).contains("text_ready"));
}

/// Locks out a short-text kernel that waits on device-scope fences, whose
/// readers are all in its one workgroup, and a resident grid that loses them,
/// whose readers are in other workgroups: for every pattern the short-text
/// program's fences are all workgroup-scope (`workgroup_fence()`), as many as
/// the steps' device-scope ones, and the resident-grid program keeps every
/// device-scope fence. Negative control: the steps do hold device-scope fences
/// (`compact`'s finished-workgroup protocol; the split's steps, built for a
/// fused kernel, leave theirs out), so neither check passes for want of any.
#[test]
fn one_workgroup_fences_stay_in_the_workgroup() {
    let count = |program: &vyre_cuda::ir::Program, statement: &str| {
        program.to_string().matches(statement).count()
    };
    for pattern in [Pattern::Gpt2, Pattern::Cl100k, Pattern::O200k] {
        let geometry = Geometry::default();
        let programs = Programs::new(pattern, geometry).expect("geometry");
        let steps = programs.fused_steps(Spread::OneWorkgroup);
        let in_steps: usize = steps
            .iter()
            .map(|step| count(&step.program, "device_fence()"))
            .sum();
        assert!(in_steps >= 2, "{pattern:?}: {in_steps} device fences");
        let short = short_program(&steps, &geometry).expect("short").program;
        assert_eq!(count(&short, "device_fence()"), 0, "{pattern:?}");
        assert_eq!(count(&short, "workgroup_fence()"), in_steps, "{pattern:?}");
        let resident_steps = programs.fused_steps(Spread::ResidentGrid);
        let resident = resident_program(&resident_steps, &geometry)
            .expect("resident")
            .program;
        assert_eq!(count(&resident, "device_fence()"), in_steps, "{pattern:?}");
        assert_eq!(count(&resident, "workgroup_fence()"), 0, "{pattern:?}");
    }
}

/// Locks out a fused kernel whose split steps still take a ticket or count
/// themselves done (a contended atomic, and two fences around another, on
/// every group's serial path, which the kernel's barriers and grid syncs make
/// needless), and one that leaves their status words for the next dispatch:
/// for every pattern the fused split steps fetch no counter while the
/// dispatched ones (control) take the ticket and count themselves done;
/// `phases` clears `classify`'s words and the fused `compact` clears the
/// second set of status words the split used, takes no ticket and still
/// counts itself done (it clears the first set and the counters last).
#[test]
fn fused_split_steps_leave_their_status_words_to_a_later_step() {
    let text = |program: &vyre_cuda::ir::Program| program.to_string();
    for pattern in [Pattern::Gpt2, Pattern::Cl100k, Pattern::O200k] {
        let programs = Programs::new(pattern, Geometry::default()).expect("geometry");
        let fused = programs.fused_steps(Spread::ResidentGrid);
        for (dispatched_step, fused_step) in programs.steps().iter().zip(&fused) {
            assert_eq!(dispatched_step.name, fused_step.name);
            let dispatched = text(&dispatched_step.program);
            let fused = text(&fused_step.program);
            let ticket = "atomic_fetch_add(&counters[0u], 1u)";
            let done = "atomic_fetch_add(&counters[1u], 1u)";
            match fused_step.name {
                "classify" | "phases" | "split" => {
                    assert!(dispatched.contains(ticket) && dispatched.contains(done));
                    assert!(!fused.contains("atomic_fetch_add(&counters"), "{pattern:?}");
                }
                "compact" => {
                    assert!(dispatched.contains(ticket) && dispatched.contains(done));
                    assert!(
                        !fused.contains(ticket) && fused.contains(done),
                        "{pattern:?}"
                    );
                    assert!(fused.contains("statuses[(second_set + second_set_at)] = 0u64"));
                    assert!(!dispatched.contains("second_set"));
                }
                _ => {}
            }
        }
        if pattern != Pattern::Gpt2 {
            let phases = fused
                .iter()
                .find(|step| step.name == "phases")
                .expect("phases");
            assert!(text(&phases.program).contains("statuses[ticket] = 0u64"));
        }
    }
}

/// Locks out tokenizer steps left at the registers the result ABI's epilogue pins
/// (80 per thread, 3 blocks of 256 threads per SM on an H200) and a body register
/// count that no longer fits its request: every cl100k step at the default
/// geometry, compiled as the backend compiles it (result ABI, subgroup
/// operations, `sm_90`) with its [`KernelStep::codegen`] options, uses at most
/// the registers its requested blocks per SM leave it (65536 / (blocks ×
/// threads)), and no fewer blocks than its body's registers allow. Negative
/// control: the same kernels without the request exceed that bound.
///
/// [`KernelStep::codegen`]: vyre_tokenizer::device::programs::KernelStep::codegen
#[test]
fn cl100k_steps_fit_their_requested_occupancy() {
    let Some(ptxas) = ptxas::require("cl100k_steps_fit_their_requested_occupancy") else {
        return;
    };
    let geometry = Geometry::default();
    assert_eq!(geometry.occupancy, Occupancy::BodyRegisters);
    let h200 = multiprocessor_limits(90);
    let programs = Programs::new(Pattern::Cl100k, geometry).expect("geometry");
    let caps = LoweringCaps::new(true, 32).expect("caps");
    let mut requested = Vec::new();
    for step in programs.steps() {
        let lowered = lower_workgroup_reductions(&step.program, &caps);
        let threads: u32 = step.program.workgroup_size().iter().product();
        let options = step.codegen(&geometry, Some(&h200));
        let blocks = options
            .min_blocks_per_multiprocessor
            .expect("every step asks for its occupancy");
        assert_eq!(
            blocks,
            h200.blocks_for_registers(step.body_registers, threads)
        );
        let bound = h200.registers / (blocks * threads);
        assert!(bound >= step.body_registers, "{}", step.name);
        let usage = |options| {
            let ptx = program_to_ptx_with_results(&lowered, &options, 90, 32).expect("ptx");
            ptxas::resources(&ptxas, step.name, &ptx).unwrap_or_else(|report| panic!("{report}"))
        };
        let capped = usage(options);
        assert!(
            capped.registers <= bound,
            "{}: {capped:?} over {bound}",
            step.name
        );
        let unrequested = usage(options.with_min_blocks_per_multiprocessor(None));
        assert!(
            unrequested.registers > bound,
            "{}: {unrequested:?} already within {bound}",
            step.name
        );
        requested.push((step.name, blocks));
    }
    assert_eq!(
        requested,
        [
            ("stage", 8),
            ("classify", 8),
            ("phases", 4),
            ("pieces", 8),
            ("merge", 6),
            ("long", 6),
            ("compact", 8),
        ]
    );
}

/// Whether `program` declares exactly the fused kernels' scalar parameters,
/// the text length and the number of documents (`u32` each), in that order.
fn declares_the_fused_scalars(program: &vyre_cuda::ir::Program) -> bool {
    use vyre_cuda::ir::ScalarType;
    use vyre_tokenizer::device::fused::{DOCUMENTS_SCALAR, TEXT_LEN_SCALAR};
    let scalars: Vec<(&str, ScalarType)> = program
        .scalars()
        .iter()
        .map(|decl| (&*decl.name, decl.ty))
        .collect();
    scalars
        == [
            (TEXT_LEN_SCALAR, ScalarType::U32),
            (DOCUMENTS_SCALAR, ScalarType::U32),
        ]
}
