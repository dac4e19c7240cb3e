//! The portable interface (`AnyBackend`) on the reference
//! implementation: one program through buffers, dispatches under every readback
//! policy, submissions and a graph, checked against hand-computed values. The GPU
//! test `gpu_portable_session_is_identical_on_cuda_and_reference` runs the same
//! session on both.

mod support;

use support::{bytes, portable_session, words};
use vyre_cuda::backend::{AnyBackend, BackendKind, Binding, Dispatch};
use vyre_cuda::DispatchConfig;

/// Locks out a reference fallback that ignores the readback policy, loses outputs
/// between dispatches (buffers must behave like device memory), lets a write-only
/// binding's garbage through, or replays a graph differently from eager dispatches.
#[test]
fn reference_interface_honours_policies_buffers_and_graphs() {
    let backend = AnyBackend::reference();
    assert_eq!(backend.kind(), BackendKind::Reference);
    let seen = portable_session(&backend);
    let n = 100u32;
    let iota: Vec<u32> = (0..n).collect();
    let mut k = 0;
    let mut next = || {
        k += 1;
        seen[k - 1].clone()
    };
    assert_eq!(next(), vec![0u8; 400], "a new buffer starts zeroed");
    // AllOutputs: x, y, z whole, in binding order.
    assert_eq!(next(), vec![3]);
    assert_eq!([next(), next(), next()], [[0], [1], [2]], "item bindings");
    assert_eq!(words(&next()), (1..=n).collect::<Vec<_>>());
    assert_eq!(
        words(&next()),
        iota.iter().map(|v| 3 * v + 1).collect::<Vec<_>>()
    );
    assert_eq!(
        words(&next()),
        iota,
        "write-only z starts zeroed, then z[i] = i"
    );
    // None: nothing comes back.
    assert_eq!(next(), vec![0]);
    // Ranges: z[2..5], then x[0] (after three dispatches: 3).
    assert_eq!(next(), vec![2]);
    assert_eq!([next(), next()], [[2], [0]], "item bindings");
    assert_eq!(words(&next()), vec![2, 3, 4]);
    assert_eq!(words(&next()), vec![3]);
    assert_eq!(
        words(&next()),
        (3..n + 3).collect::<Vec<_>>(),
        "outputs stay in x"
    );
    // Two submissions, the second ordered after the first: x + 4, then x + 5.
    assert_eq!(words(&next()), (4..n + 4).collect::<Vec<_>>());
    let _y = next();
    let _z = next();
    assert_eq!(words(&next()), (5..n + 5).collect::<Vec<_>>());
    let _y = next();
    let _z = next();
    // One more run, y read by name as typed words: 3·(i + 5) + 1.
    assert_eq!(
        words(&next()),
        (0..n).map(|i| 3 * (i + 5) + 1).collect::<Vec<_>>()
    );
    let error = String::from_utf8(next()).unwrap();
    assert!(
        error.starts_with("Fix: readback range 398..+4 of binding 1 is past"),
        "{error}"
    );
    // Graph: upload x = 10i + r, two dispatches, read y[1..3] = 3·(x + 1) + 1.
    for round in 0..3u32 {
        let expected: Vec<u32> = (1..3).map(|i| 3 * (10 * i + round + 1) + 1).collect();
        assert_eq!(words(&next()), expected, "replay {round}");
    }
    assert_eq!(
        words(&next()),
        (0..n).map(|i| 10 * i + 2 + 2).collect::<Vec<_>>()
    );
    assert_eq!(words(&next()), iota);
    // Element count 10 on the first step: it updates x[0..10] and y[0..10], clears z
    // whole and writes z[0..10]; the second step runs over all 100.
    let x_after_first = |i: u32| if i < 10 { 1000 + i + 1 } else { 1000 + i };
    assert_eq!(
        words(&next()),
        (1..3).map(|i| 3 * x_after_first(i) + 1).collect::<Vec<_>>(),
        "read-back after the count update"
    );
    assert_eq!(
        words(&next()),
        (0..n).map(|i| x_after_first(i) + 1).collect::<Vec<_>>()
    );
    assert_eq!(words(&next()), iota, "second step rewrites z over all 100");
    assert_eq!(k, seen.len(), "every observation checked");
}

/// Locks out objects of one backend silently working on another: a buffer of one
/// reference backend bound on another is a `Fix:` error.
#[test]
fn reference_interface_refuses_foreign_objects() {
    let a = AnyBackend::reference();
    let b = AnyBackend::reference();
    let program = support::portable_program();
    let config = DispatchConfig::linear(1);
    let buffer = a.buffer_from(&[1u32, 2, 3, 4]).unwrap();
    let message = b.read::<u8>(&buffer).unwrap_err().to_string();
    assert!(message.starts_with("Fix:"), "{message}");
    let kernel = a.compile(&program, &config).unwrap();
    let z = [0u8; 16];
    let bindings = [Binding::from(&buffer), Binding::Host(&z), Binding::Host(&z)];
    let message = b
        .run(Dispatch::new(&kernel, &bindings).config(&config))
        .unwrap_err()
        .to_string();
    assert!(message.starts_with("Fix:"), "{message}");
    // Control: its own backend runs the same request.
    assert!(a
        .run(Dispatch::new(&kernel, &bindings).config(&config))
        .is_ok());
}

/// Locks out a reference buffer that pretends to be host-mapped memory: taking it
/// into a `MappedView` is a `Fix:` error that gives the buffer back with its bytes
/// (what it answers on CUDA for device memory), so code that keeps a view where
/// the device allows one falls back to reading the buffer.
#[test]
fn reference_buffers_make_no_mapped_view() {
    let backend = AnyBackend::reference();
    let buffer = backend.buffer_from(&[7u32, 8, 9]).unwrap();
    let (buffer, error) = buffer.into_mapped_view().unwrap_err();
    assert!(error.to_string().starts_with("Fix:"), "{error}");
    assert_eq!(backend.read::<u32>(&buffer).unwrap(), [7, 8, 9]);
}

/// Locks out a reference graph that accepts what the CUDA recorder refuses (so code
/// tested without a GPU would fail on one): readback ranges inside a graph are a
/// `Fix:` error, and an empty recording is refused. (Grid-sync steps are recorded
/// on both: `lane.rs`' reference graph test.)
#[test]
fn reference_recorder_refuses_what_cuda_graphs_refuse() {
    use vyre_cuda::{ByteRange, ReadbackPolicy};
    let backend = AnyBackend::reference();
    let program = support::portable_program();
    let config = DispatchConfig::linear(1);
    let kernel = backend.compile(&program, &config).unwrap();
    let buffers: Vec<_> = (0..3).map(|_| backend.buffer(256).unwrap()).collect();
    let refs: Vec<Binding> = buffers.iter().map(Binding::from).collect();
    let ranges = config
        .clone()
        .with_readback(ReadbackPolicy::Ranges(smallvec::smallvec![ByteRange {
            binding: 1,
            offset: 0,
            len: 4
        }]));
    let message = backend
        .record(|rec| {
            rec.dispatch(Dispatch::new(&kernel, &refs).config(&ranges))
                .map(drop)
        })
        .unwrap_err()
        .to_string();
    assert!(
        message.starts_with("Fix:") && message.contains("ranges"),
        "{message}"
    );
    let message = backend.record(|_| Ok(())).unwrap_err().to_string();
    assert!(
        message.starts_with("Fix:") && message.contains("recorded nothing"),
        "{message}"
    );
    // Control: the same dispatch without ranges records and replays.
    let mut graph = backend
        .record(|rec| {
            rec.dispatch(Dispatch::new(&kernel, &refs).config(&config))
                .map(drop)
        })
        .unwrap();
    graph.replay().unwrap();
    assert_eq!(backend.read::<u32>(&buffers[0]).unwrap()[..2], [1, 1]);
}

/// Locks out a portable graph that cannot change its grid, or whose reference side
/// ignores the change (code tested without a GPU would then disagree with CUDA,
/// where `DispatchGraph::set_workgroups` exists): `dst = src + 1` over 256 words with
/// 64-thread workgroups writes 64 words from one workgroup and all 256 after
/// `set_workgroups([4, 1, 1])`; an axis of 0 is a `Fix:` error that changes
/// nothing; `replay_timed` replays too, with no device window on the reference.
#[test]
fn reference_graph_changes_its_grid_without_recapture() {
    use vyre_cuda::ir::Expr;
    let backend = AnyBackend::reference();
    let program = support::elementwise("plus_one", 64, |v| v + Expr::u32(1));
    let config = DispatchConfig::linear(1).with_readback(vyre_cuda::ReadbackPolicy::None);
    let kernel = backend.compile(&program, &config).unwrap();
    let source = backend
        .buffer_from(&(0..256u32).collect::<Vec<_>>())
        .unwrap();
    let destination = backend.buffer(4 * 256).unwrap();
    let bindings = [Binding::from(&source), Binding::from(&destination)];
    let mut slots = None;
    let mut graph = backend
        .record(|rec| {
            let step = rec.dispatch(Dispatch::new(&kernel, &bindings).config(&config))?;
            slots = Some((step, rec.read_back(&destination, 0, 4 * 256)?));
            Ok(())
        })
        .unwrap();
    let (step, output) = slots.unwrap();
    let written = |graph: &vyre_cuda::backend::AnyGraph| {
        words(graph.output(output).unwrap())
            .iter()
            .enumerate()
            .filter(|&(i, &w)| w == i as u32 + 1)
            .count()
    };
    graph.replay().unwrap();
    assert_eq!(written(&graph), 64, "one workgroup of 64 threads");
    let message = graph
        .set_workgroups(step, [0, 1, 1])
        .unwrap_err()
        .to_string();
    assert!(
        message.starts_with("Fix:") && message.contains("workgroups.x is 0"),
        "the CUDA launch plan's message: {message}"
    );
    graph.set_workgroups(step, [4, 1, 1]).unwrap();
    let timing = graph.replay_timed().unwrap();
    assert_eq!(written(&graph), 256, "four workgroups cover every word");
    assert_eq!(
        timing.event_window_ns, None,
        "the reference has no device window"
    );
}

/// The worked example of the ir docs (`examples/hash_table.rs`), compiled here.
#[allow(dead_code)]
mod hash_table {
    include!("../examples/hash_table.rs");
}

/// Locks out a `while` loop, `break` or compare-exchange that the hash-table example
/// exposes on the reference backend (a probe that stops early or never, a claim that
/// swaps a taken slot, a key counted in two slots): every one of 210 queries finds
/// its host-computed count of 1,000 keys. Negative control: a table counted from
/// other keys is caught by the same comparison.
#[test]
fn hash_table_example_counts_every_key_on_the_reference() {
    let backend = AnyBackend::reference();
    assert_eq!(hash_table::check(&backend).unwrap(), Vec::<u32>::new());
    let (keys, queries) = hash_table::sample();
    let other = hash_table::count_and_look_up(&backend, &[1, 2, 2], &queries).unwrap();
    assert_eq!(&other[..3], [1, 2, 0]);
    assert_eq!(hash_table::miscounted(&keys, &queries, &other).len(), 200);
}

/// Locks out a fallback that answers differently from CUDA (the reference half of
/// `gpu_fallback_answers_exactly_as_cuda`): every parity case gets the answer CUDA
/// gives — invalid programs refused at `compile`, a grid of 70,000 on y and an axis
/// of 0 refused by the launch plan, the 17th of 20 pending submissions refused,
/// `buffer(u64::MAX)` and `buffer(1 << 40)` over the budget (no panic, no abort), a
/// buffer bound as input and write-only output refused, a program that passes the
/// workgroup-memory limit only with its lowering's scratch refused at `compile` (the
/// reference ran it while the driver would refuse the kernel), every malformed
/// request refused with a `Fix:` message, a buffer copy past either end, with an
/// overflowing offset or overlapping itself refused with the same one — and the good
/// requests and copies run with the right bytes.
#[test]
fn reference_answers_every_parity_case_as_cuda_does() {
    use support::parity::{cases, Outcome};
    let seen = cases(&AnyBackend::reference());
    let expected_refusals = [
        ("compile: a store into a read-only buffer", "InvalidProgram"),
        ("compile: 2048 threads per workgroup", "InvalidProgram"),
        ("run: one buffer as input and write-only output", "BadInput"),
        ("run: too few bindings", "BadInput"),
        (
            "run: a size that is not a whole number of elements",
            "BadInput",
        ),
        ("run: zero fixpoint iterations", "BadInput"),
        ("run: a readback range past the buffer", "BadInput"),
        ("run_into: an output slice of the wrong length", "BadInput"),
        ("run: a buffer of another backend", "InvalidHandle"),
        ("read: a buffer of another backend", "InvalidHandle"),
        ("grid: y = 70,000 workgroups", "Launch"),
        ("grid: an axis of 0 workgroups", "Launch"),
        ("submit: the one past MAX_PENDING", "BadInput"),
        ("buffer: u64::MAX bytes", "OverBudget"),
        ("buffer: 1 << 40 bytes", "OverBudget"),
        ("run: a zeroed binding of 1 << 40 bytes", "BadInput"),
        ("scalar: no value for one", "BadInput"),
        ("scalar: a value of another type", "BadInput"),
        ("scalar: an undeclared name", "BadInput"),
        ("scalar: submit without a value", "BadInput"),
        ("scalar: record without a value", "BadInput"),
        ("graph: set_scalar of another type", "BadInput"),
        ("graph: set_scalar of an undeclared name", "BadInput"),
        (
            "compile: workgroup memory 16 bytes past the opt-in limit",
            "InvalidProgram",
        ),
        (
            "compile: a reduction whose lowering passes the opt-in limit",
            "InvalidProgram",
        ),
        ("copy: past the source's end", "BadInput"),
        ("copy: past the destination's end", "BadInput"),
        ("copy: an offset that overflows", "BadInput"),
        ("copy: overlapping ranges of one buffer", "BadInput"),
        ("copy: into a buffer of another backend", "InvalidHandle"),
    ];
    for (name, kind) in expected_refusals {
        let outcome = &seen.iter().find(|(case, _)| *case == name).expect(name).1;
        let (got, message) = outcome.refused().unwrap_or_else(|| panic!("{name}: ran"));
        assert_eq!(got, kind, "{name}: {message}");
        assert!(message.starts_with("Fix:"), "{name}: {message}");
    }
    let ran = |name: &str| match &seen.iter().find(|(case, _)| *case == name).expect(name).1 {
        Outcome::Ran(items) => items.clone(),
        other => panic!("{name}: {other:?}"),
    };
    let (dst, totals) = support::wide_shared::expected(&support::wide_shared::source(2));
    assert_eq!(
        ran("run: 100 KiB of workgroup memory"),
        vec![bytes(&dst), bytes(&totals)]
    );
    // The workgroup-memory refusals name the bytes the buffers need, before and after
    // lowering.
    for (name, needed) in [
        (
            "compile: workgroup memory 16 bytes past the opt-in limit",
            232_464,
        ),
        (
            "compile: a reduction whose lowering passes the opt-in limit",
            232_476,
        ),
    ] {
        let message = seen
            .iter()
            .find(|(case, _)| *case == name)
            .and_then(|(_, outcome)| outcome.refused())
            .expect(name)
            .1;
        assert!(
            message.contains(&format!(
                "{needed} bytes of shared memory, over the device limit of 232448 bytes"
            )),
            "{name}: {message}"
        );
    }
    let plus_one: Vec<u32> = (1..=64).collect();
    assert_eq!(ran("run: buffers"), vec![bytes(&plus_one)]);
    assert_eq!(
        ran("run: host values, an output stated by its length"),
        vec![bytes(&plus_one)]
    );
    assert_eq!(ran("run: output by name, typed"), vec![bytes(&plus_one)]);
    assert_eq!(
        ran("submit: pending submissions accepted of MAX_PENDING + 4"),
        vec![vec![vyre_cuda::backend::MAX_PENDING as u8]]
    );
    assert_eq!(ran("compile: a valid program"), Vec::<Vec<u8>>::new());
    // The copies: words 2..12 of the source at byte 100 of a zeroed buffer; the
    // source's first 16 words again at its words 32..48; nothing for zero bytes.
    let source: Vec<u32> = (0..64u32).map(|i| i * 3 + 1).collect();
    let mut copied = vec![0u8; 256];
    copied[100..140].copy_from_slice(&bytes(&source)[8..48]);
    assert_eq!(
        ran("copy: 40 bytes between two buffers"),
        vec![copied.clone()]
    );
    assert_eq!(ran("copy: zero bytes at the end"), vec![copied]);
    let mut within = source.clone();
    within.copy_within(0..16, 32);
    assert_eq!(
        ran("copy: within one buffer, ranges apart"),
        vec![bytes(&within)]
    );
    let plus = |k: u32| bytes(&(0..64).map(|v| v + k).collect::<Vec<u32>>());
    assert_eq!(ran("scalar: values reach the kernel"), vec![plus(5)]);
    assert_eq!(ran("scalar: new values, the same kernel"), vec![plus(1000)]);
    assert_eq!(ran("scalar: the last of two values"), vec![plus(1)]);
    assert_eq!(ran("scalar: a program request"), vec![plus(7)]);
    assert_eq!(ran("scalar: run_into with values"), vec![plus(2)]);
    let first = |k: u32| plus(k)[..16].to_vec();
    assert_eq!(
        ran("graph: a step's scalars set between replays"),
        vec![first(3), first(40), first(0), 40u64.to_le_bytes().to_vec()]
    );
    assert_eq!(
        ran("graph: the value a refused update left"),
        vec![40u64.to_le_bytes().to_vec()]
    );
    for (case, names) in [
        ("scalar: no value for one", ["`on`", ".scalar(\"on\""]),
        ("scalar: a value of another type", ["`k`", "i32"]),
        ("scalar: an undeclared name", ["`kk`", "k: u32, on: bool"]),
        ("graph: set_scalar of another type", ["`k`", "f32"]),
    ] {
        let (_, message) = seen
            .iter()
            .find(|(name, _)| *name == case)
            .and_then(|(_, outcome)| outcome.refused())
            .unwrap();
        for name in names {
            assert!(message.contains(name), "{case}: {message}");
        }
    }
    let message = seen
        .iter()
        .find(|(case, _)| *case == "grid: y = 70,000 workgroups")
        .and_then(|(_, outcome)| outcome.refused())
        .map(|(_, message)| message.to_string())
        .unwrap();
    assert!(message.contains("workgroups.y"), "{message}");
}

/// Locks out `ReferenceOptions` that `AnyBackend` cannot reach: a reference backend
/// made with a work cap of 1,000 stops a dispatch that the default options run,
/// with the interpreter's `Fix:` error; its limits refuse at `compile` what the
/// defaults accept. Negative control: the default reference runs both.
#[test]
fn reference_options_are_reachable_through_any_backend() {
    use vyre_cuda::reference::ReferenceOptions;
    let program = support::elementwise("plus_one", 64, |v| v + vyre_cuda::ir::Expr::u32(1));
    let config = DispatchConfig::linear(4);
    let capped = AnyBackend::reference_with(ReferenceOptions {
        max_work: 1_000,
        ..ReferenceOptions::default()
    });
    let values = [0u32; 256];
    let bindings = [Binding::host(&values), Binding::zeroed::<u32>(256)];
    let kernel = capped.compile(&program, &config).unwrap();
    let error = capped
        .run(Dispatch::new(&kernel, &bindings).config(&config))
        .unwrap_err();
    assert!(
        matches!(error, vyre_cuda::backend::BackendError::Reference { .. }),
        "{error:?}"
    );
    assert!(error.to_string().starts_with("Fix:"), "{error}");
    let narrow = AnyBackend::reference_with(ReferenceOptions {
        limits: vyre_cuda::ir::Limits {
            max_threads_per_workgroup: 32,
            ..vyre_cuda::ir::Limits::default()
        },
        ..ReferenceOptions::default()
    });
    assert!(narrow.compile(&program, &config).is_err());
    let default = AnyBackend::reference();
    let kernel = default.compile(&program, &config).unwrap();
    assert!(default
        .run(Dispatch::new(&kernel, &bindings).config(&config))
        .is_ok());
}

/// Locks out a scalar value that becomes part of the program, and so of its digest,
/// its PTX and every cache key built on them (a new value would then mean new PTX
/// and a driver JIT per value): `plus_k` dispatched through the reference backend
/// with three values gives three answers, while its digest and its PTX (plain and
/// with the result ABI) stay what they were before the first dispatch and no
/// dispatch computes a digest. The GPU half, `gpu_scalar_values_reach_the_kernel_
/// through_one_module`, counts the PTX and module caches. Negative control: the
/// same program with a literal in place of the scalar has another digest and PTX.
#[test]
fn scalar_values_never_reach_the_program_or_its_ptx() {
    use vyre_cuda::codegen::{program_to_ptx, program_to_ptx_with_results};
    use vyre_cuda::ir::computations_on_current_thread;
    let program = support::parity::plus_k();
    let codegen = vyre_cuda::CodegenOptions::default();
    let digest = program.digest();
    let plain = program_to_ptx(&program, &codegen, 90, 32).unwrap();
    let with_results = program_to_ptx_with_results(&program, &codegen, 90, 32).unwrap();
    let backend = AnyBackend::reference();
    let values: Vec<u32> = (0..64).collect();
    let bindings = [Binding::host(&values), Binding::zeroed::<u32>(64)];
    let digests = computations_on_current_thread();
    for k in [1u32, 2, 0xdead_beef] {
        let request = Dispatch::program(&program, &bindings)
            .scalar("k", k)
            .scalar("on", true);
        let finished = backend.run(request).unwrap();
        let got = finished.outputs.read::<u32>("dst").unwrap();
        assert_eq!(got[3], 3u32.wrapping_add(k));
    }
    assert_eq!(
        computations_on_current_thread(),
        digests,
        "no dispatch digests"
    );
    assert_eq!(program.digest(), digest);
    assert_eq!(program_to_ptx(&program, &codegen, 90, 32).unwrap(), plain);
    assert_eq!(
        program_to_ptx_with_results(&program, &codegen, 90, 32).unwrap(),
        with_results
    );
    let literal = support::elementwise("plus_k", 64, |v| v + vyre_cuda::ir::Expr::u32(2));
    assert_ne!(literal.digest(), digest);
    assert_ne!(program_to_ptx(&literal, &codegen, 90, 32).unwrap(), plain);
}

/// Locks out a repeated request that runs with stale scalar values, or with a value
/// it no longer gives: one kernel request over the same owned buffers, repeated with
/// new values through `run` and `run_into` (`support::repeated_scalar_requests`, the
/// request whose plan, addresses and routes a blocking CUDA dispatch reuses), reads
/// back the reference interpreter's answer for its own values every round, and the
/// request without its last value is refused with a `Fix:` error naming it. The
/// CUDA half is `gpu_a_repeated_request_passes_its_own_scalar_values`. Negative
/// control: every round's expected answer differs from the round before, so a stale
/// value would fail.
#[test]
fn a_repeated_request_passes_its_own_scalar_values() {
    let values = support::repeated_scalar_values();
    let (rounds, error) = support::repeated_scalar_requests(&AnyBackend::reference(), &values);
    let expected = support::expected_scalar_rounds(&values);
    assert_eq!(rounds, expected);
    for pair in expected.windows(2) {
        assert_ne!(pair[0], pair[1], "negative control: the rounds differ");
    }
    assert!(
        error.starts_with("Fix:") && error.contains("s_i64"),
        "{error}"
    );
}

/// Locks out a reference interpreter that answers a program past 48 KiB of
/// workgroup memory differently from the device: with its default limits (an
/// H200's kernels, `Limits::h200`) it runs `support::wide_shared::program` (100 KiB
/// and 512 bytes of workgroup buffers, 2 workgroups) to the host's answer, and
/// refuses a program 16 bytes past the opt-in limit with the validator's `Fix:`
/// naming 232,448 bytes. Negative control: under the static limit
/// (`Limits::default`, 48 KiB, a lane's) the 100 KiB program is refused.
#[test]
fn the_reference_runs_100_kib_of_workgroup_memory() {
    use vyre_cuda::reference::{run_with_options as run_with, ReferenceOptions};
    let source = support::wide_shared::source(2);
    let (dst, totals) = support::wide_shared::expected(&source);
    let inputs = vec![bytes(&source), vec![0; 4 * source.len()], vec![0; 8]];
    let program = support::wide_shared::program();
    let config = vyre_cuda::DispatchConfig::linear(2);
    assert_eq!(
        support::reference(&program, &inputs, &config),
        vec![bytes(&dst), bytes(&totals)]
    );
    let borrowed: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
    let past = support::parity::past_the_opt_in_limit();
    let error = run_with(&past, &[], &config, &ReferenceOptions::default())
        .expect_err("past the opt-in limit")
        .to_string();
    assert!(error.starts_with("Fix:"), "{error}");
    assert!(
        error.contains("over the device limit of 232448 bytes"),
        "{error}"
    );
    let static_limit = ReferenceOptions {
        limits: vyre_cuda::ir::Limits::default(),
        ..ReferenceOptions::default()
    };
    let error = run_with(&program, &borrowed, &config, &static_limit)
        .expect_err("past 48 KiB")
        .to_string();
    assert!(
        error.contains("over the device limit of 49152 bytes"),
        "{error}"
    );
}

/// Locks out a graph rebinding that the reference side ignores or checks
/// otherwise than CUDA (`DispatchGraph::set_buffer`): the shared assertion
/// (`support::assert_graph_rebinds_a_buffer`: the rebound buffer written, the
/// recorded one not, every refusal a `Fix:` that changes nothing). Negative
/// control by hand: a reference `set_buffer` that only checks, binding
/// nothing, fails at "the rebound buffer is written".
#[test]
fn reference_graph_rebinds_a_buffer_without_recapture() {
    let backend = AnyBackend::reference();
    support::assert_graph_rebinds_a_buffer(&backend, &|bytes| backend.buffer(bytes).unwrap());
}

/// Locks out a `set_launch` that makes part of a change it refuses, or that the
/// reference side applies otherwise than CUDA: the shared assertion
/// (`support::assert_graph_set_launch_changes_all_or_nothing`: two scalars and
/// the grid in one call, three refusals each beside a good change that must not
/// be made). Negative control by hand: a reference `set_launch` that sets each
/// scalar as it checks it fails at "a refused change left the scalar beside it
/// alone".
#[test]
fn reference_graph_set_launch_changes_all_or_nothing() {
    let backend = AnyBackend::reference();
    support::assert_graph_set_launch_changes_all_or_nothing(&backend, &|bytes| {
        backend.buffer(bytes).unwrap()
    });
}

/// Locks out a fed replay that the reference side runs otherwise than CUDA
/// (`AnyGraph::replay_feeding`): the shared assertion
/// (`support::assert_graph_feeds_a_running_replay`: three rounds whose output
/// is computed from the words written in `beside`, and the three `Fix:`
/// refusals). Negative control by hand: a reference `replay_feeding` that
/// replays before it runs `beside` fails at round 1 (the kernel read the
/// words before they were written).
#[test]
fn reference_graph_feeds_a_running_replay() {
    let backend = AnyBackend::reference();
    support::assert_graph_feeds_a_running_replay(
        &backend,
        &|bytes| backend.buffer(bytes).unwrap(),
        std::time::Duration::ZERO,
    );
}
