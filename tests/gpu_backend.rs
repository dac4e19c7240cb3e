//! GPU tests of the CUDA backend. Ignored by default; run on the GPU machine
//! with `bash .gpu/run.sh gpu_`. Every result is checked against the reference
//! interpreter or a hand-computed value.

mod support;

use std::sync::Arc;

use support::{
    backend, bindings, buffer_copies, bytes, fixture_inputs, reference, run_host, words,
};
use vyre_cuda::backend::{BackendError, Binding, CudaBackend, Dispatch, Timing};
use vyre_cuda::fixtures::{host_cost_fixture, host_cost_fixture_expected};
use vyre_cuda::ir::generate::{valid_program, GeneratorOptions};
use vyre_cuda::ir::*;
use vyre_cuda::{ByteRange, DispatchConfig, ReadbackPolicy};

/// Locks out a broken thin slice (IR → PTX → driver → readback): the measurement
/// fixture must give the hand-computed sum through host bindings and through device
/// buffers, and its outputs are found by buffer name and by binding.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_fixture_matches_hand_computed_and_reference() {
    let gpu = backend();
    let program = host_cost_fixture(9, 64);
    let inputs = fixture_inputs(&program, 5);
    let config = DispatchConfig::linear(1);
    let borrowed: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
    let outputs = run_host(&gpu, &program, &borrowed, &config).unwrap();
    assert_eq!(outputs.len(), 8, "out + 7 scratch buffers come back");
    assert_eq!(
        outputs.read::<u32>("out").unwrap()[0],
        host_cost_fixture_expected(5, 64)
    );
    assert_eq!(outputs.get("out").unwrap(), outputs.binding(1).unwrap());
    assert_eq!(outputs, reference(&program, &inputs, &config));

    let buffers = buffer_copies(&gpu, &inputs);
    let bound = bindings(&buffers);
    let timed = gpu
        .run(Dispatch::program(&program, &bound).config(&config))
        .unwrap();
    assert_eq!(timed.outputs, outputs);
    // kernel_stamps_ns comes from the kernel's own stamps; no events → no window.
    let timings = timed.timings;
    assert!(timings.kernel_stamps_ns > 0, "{timings:?}");
    assert_eq!(timings.event_window_ns, None, "{timings:?}");
    assert!(
        timings.enqueue_ns <= timings.wall_ns && timings.wait_ns <= timings.wall_ns,
        "{timings:?}"
    );
}

/// Locks out any semantic drift between PTX and the reference interpreter: random
/// valid programs (every construct, every type) must give byte-identical outputs.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_random_programs_match_reference_byte_for_byte() {
    let gpu = backend();
    let options = GeneratorOptions::default();
    let mut checked = 0;
    for seed in 0..400u64 {
        let case = valid_program(seed, &options);
        let expected = support::case_reference(&case, &case.scalars);
        let got = support::run_case_host(&gpu, &case, &case.scalars)
            .unwrap_or_else(|e| panic!("seed {seed}: {e}\n{}", case.program));
        assert_eq!(
            got, expected,
            "seed {seed}: GPU and reference differ\n{}",
            case.program
        );
        checked += 1;
    }
    assert_eq!(checked, 400);
}

/// Locks out wrong reductions on the device: lowered workgroup reductions (warp
/// path and tree path shapes) must match the reference for sum, min and max.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_workgroup_reductions_match_reference() {
    let gpu = backend();
    for size in [32u32, 64, 256, 48, 1, 1024] {
        for op in [ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max] {
            let program = Program::builder([size, 1, 1])
                .buffer(
                    "values",
                    0,
                    Access::ReadOnly,
                    ElemType::U32,
                    BufferCount::Runtime,
                )
                .buffer(
                    "result",
                    1,
                    Access::WriteOnly,
                    ElemType::U32,
                    BufferCount::Runtime,
                )
                .body(|b| {
                    let g = b.let_("g", Expr::global_id(Axis::X));
                    let r = b.workgroup_reduce("r", op, Expr::load("values", g.clone()));
                    b.if_(Expr::local_id(Axis::X).equals(0u32), |b| {
                        b.store("result", Expr::workgroup_id(Axis::X), r);
                    });
                })
                .build();
            let groups = 3u32;
            let n = size * groups;
            let values: Vec<u32> = (0..n).map(|i| i.wrapping_mul(2_654_435_761) >> 7).collect();
            let inputs = vec![bytes(&values), vec![0u8; 4 * groups as usize]];
            let config = DispatchConfig::linear(groups);
            let expected = reference(&program, &inputs, &config);
            let borrowed: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
            let got = run_host(&gpu, &program, &borrowed, &config).unwrap();
            assert_eq!(got, expected, "size {size} op {op:?}");
        }
    }
}

/// Locks out wrong scans on the device: lowered workgroup scans (one warp, warps
/// with a shared-memory total per warp, the tree for 48 threads, one thread, 1,024
/// threads) give every thread the reference's prefix, for sum, min and max,
/// inclusive and exclusive.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_workgroup_scans_match_reference() {
    let gpu = backend();
    for size in [32u32, 64, 256, 48, 1, 1024] {
        for op in [ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max] {
            for kind in [ScanKind::Inclusive, ScanKind::Exclusive] {
                let program = Program::builder([size, 1, 1])
                    .buffer(
                        "values",
                        0,
                        Access::ReadOnly,
                        ElemType::U32,
                        BufferCount::Runtime,
                    )
                    .buffer(
                        "prefix",
                        1,
                        Access::WriteOnly,
                        ElemType::U32,
                        BufferCount::Runtime,
                    )
                    .body(|b| {
                        let g = b.let_("g", Expr::global_id(Axis::X));
                        let value = Expr::load("values", g.clone());
                        let s = b.workgroup_scan("s", op, kind, value);
                        b.store("prefix", g, s);
                    })
                    .build();
                let groups = 3u32;
                let n = size * groups;
                let values: Vec<u32> = (0..n).map(|i| i.wrapping_mul(2_654_435_761) >> 7).collect();
                let inputs = vec![bytes(&values), vec![0u8; 4 * n as usize]];
                let config = DispatchConfig::linear(groups);
                let expected = reference(&program, &inputs, &config);
                let borrowed: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
                let got = run_host(&gpu, &program, &borrowed, &config).unwrap();
                assert_eq!(got, expected, "size {size} op {op:?} {kind:?}");
            }
        }
    }
}

/// Locks out a contended fetch-add that hands one slot to two threads or skips one
/// (a lost update, a wrong returned value, a 64-bit counter that wraps at 32 bits):
/// 8 workgroups of 256 threads each claim `slot = fetch_add(&next, 1)` and mark
/// `claimed[slot]`, and add `2^32` to a `u64` total; every slot is claimed exactly
/// once and the counters end at 2,048 and 2,048 * 2^32, as on the reference.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_contended_fetch_add_hands_out_each_slot_once() {
    let gpu = backend();
    let threads = 256 * 8u32;
    let program = Program::builder([256, 1, 1])
        .buffer(
            "next",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(1),
        )
        .buffer(
            "total",
            1,
            Access::ReadWrite,
            ElemType::U64,
            BufferCount::Static(1),
        )
        .buffer(
            "claimed",
            2,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(threads),
        )
        .body(|b| {
            let slot = b.atomic_fetch("slot", AtomicOp::Add, "next", 0u32, 1u32);
            b.atomic(AtomicOp::Add, "claimed", slot, 1u32);
            b.atomic_fetch("before", AtomicOp::Add, "total", 0u32, Expr::u64(1 << 32));
        })
        .build();
    let inputs = vec![vec![0u8; 4], vec![0u8; 8], vec![0u8; 4 * threads as usize]];
    let config = DispatchConfig::linear(8);
    let expected = reference(&program, &inputs, &config);
    assert_eq!(words(&expected[2]), vec![1; threads as usize]);
    let borrowed: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
    let got = run_host(&gpu, &program, &borrowed, &config)
        .unwrap()
        .into_vecs();
    assert_eq!(words(&got[0]), [threads]);
    assert_eq!(got[1], (u64::from(threads) << 32).to_le_bytes());
    assert_eq!(got, expected);
}

/// Locks out leaks and lost data in device buffers: allocate, upload, dispatch,
/// read, drop, with byte accounting at every step.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_buffer_lifecycle_and_accounting() {
    let gpu = backend();
    let before = gpu.buffer_bytes();
    let program = Program::builder([64, 1, 1])
        .buffer(
            "data",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            let i = b.let_("i", Expr::global_id(Axis::X));
            b.store(
                "data",
                i.clone(),
                Expr::load("data", i.clone()) * 3u32 + 1u32,
            );
        })
        .build();
    let values: Vec<u32> = (0..256).collect();
    let buffer = gpu.buffer(1024).unwrap();
    assert_eq!(gpu.buffer_bytes(), before + 1024);
    gpu.upload(&buffer, &values).unwrap();
    assert_eq!(gpu.read::<u32>(&buffer).unwrap(), values);
    let none = ReadbackPolicy::None;
    let out = gpu
        .run(
            Dispatch::program(&program, &[Binding::from(&buffer)])
                .workgroups([4, 1, 1])
                .readback(&none),
        )
        .unwrap();
    assert!(out.outputs.is_empty(), "readback None returns nothing");
    let expected: Vec<u32> = values.iter().map(|v| v * 3 + 1).collect();
    assert_eq!(
        gpu.read::<u32>(&buffer).unwrap(),
        expected,
        "outputs stay in the buffer"
    );
    drop(buffer);
    assert_eq!(gpu.buffer_bytes(), before);
}

/// Locks out a backend that uses another backend's memory or module: a buffer of
/// another `CudaBackend` is refused for reads and bindings, and a kernel compiled by
/// another backend is refused, each an `InvalidHandle` error with a `Fix:` message.
/// (Double frees and stale handles cannot be written: buffers free themselves on
/// drop and bindings borrow them.) Negative control: the same request over the
/// backend's own buffers and kernel runs.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_foreign_buffers_and_kernels_are_refused() {
    let gpu = backend();
    let other = CudaBackend::acquire().unwrap();
    let program = host_cost_fixture(2, 1);
    let config = DispatchConfig::linear(1);
    let foreign = other.buffer(16).unwrap();
    let message = gpu.read::<u8>(&foreign).unwrap_err().to_string();
    assert!(
        message.starts_with("Fix:") && message.contains("another backend"),
        "{message}"
    );
    let own = gpu.buffer(16).unwrap();
    let kernel = gpu.compile(&program, &config).unwrap();
    let mixed = [Binding::from(&foreign), Binding::from(&own)];
    let err = gpu.run(Dispatch::new(&kernel, &mixed));
    assert!(
        matches!(err, Err(BackendError::InvalidHandle { .. })),
        "{err:?}"
    );
    let other_kernel = other.compile(&program, &config).unwrap();
    let own_other = gpu.buffer(16).unwrap();
    let own_bindings = [Binding::from(&own), Binding::from(&own_other)];
    let err = gpu.run(Dispatch::new(&other_kernel, &own_bindings));
    assert!(
        matches!(err, Err(BackendError::InvalidHandle { .. })),
        "{err:?}"
    );
    gpu.run(Dispatch::new(&kernel, &own_bindings)).unwrap();
}

/// Locks out a preflight that lets an over-budget dispatch allocate: with the
/// budget nearly used up by device buffers, a dispatch of host bytes must fail
/// before any transient allocation, naming bytes required and available.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_over_budget_dispatch_fails_before_allocating() {
    let gpu = backend();
    let total = gpu.caps().total_memory;
    // Fill the budget with device buffers until under 32 MiB are left. The live-free
    // cap (90 % of free memory) shrinks with each allocation, so this converges in a
    // few steps.
    let mut held = Vec::new();
    for _ in 0..40 {
        let available = gpu.memory_budget().unwrap().available;
        assert!(available < total);
        if available < (32 << 20) {
            break;
        }
        held.push(gpu.buffer(available - (16 << 20)).unwrap());
    }
    assert!(
        gpu.memory_budget().unwrap().available < (32 << 20),
        "could not fill the budget"
    );
    gpu.trim_pools();
    let before = gpu.pool_stats();
    let program = Program::builder([64, 1, 1])
        .buffer(
            "big",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "out",
            1,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Static(1),
        )
        .body(|b| {
            b.store("out", 0u32, Expr::load("big", 0u32));
        })
        .build();
    let big = vec![0u8; 64 << 20];
    let out = vec![0u8; 4];
    let err = run_host(&gpu, &program, &[&big, &out], &DispatchConfig::linear(1)).unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, BackendError::OverBudget { .. }), "{message}");
    assert!(
        message.starts_with("Fix:") && message.contains("bytes"),
        "{message}"
    );
    assert_eq!(
        gpu.pool_stats().transient_allocations,
        before.transient_allocations,
        "nothing allocated"
    );
    drop(held);
    // With memory back, the same dispatch runs.
    assert!(run_host(&gpu, &program, &[&big, &out], &DispatchConfig::linear(1)).is_ok());
}

/// A grid-sync program: every thread writes its id, the grid syncs, then every
/// thread reads its right neighbour's value (across workgroups).
fn grid_sync_program() -> Program {
    Program::builder([128, 1, 1])
        .entry_op_id("grid_neighbour")
        .buffer(
            "first",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "second",
            1,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            let g = b.let_("g", Expr::global_id(Axis::X));
            let n = b.let_("n", Expr::length("first"));
            b.store("first", g.clone(), g.clone() * 7u32 + 1u32);
            b.grid_sync();
            let next = b.let_("next", (g.clone() + 1u32) % n);
            b.store("second", g.clone(), Expr::load("first", next));
        })
        .build()
}

/// Locks out a grid sync that does not synchronise (or a barrier counter left
/// unbalanced): neighbours across workgroups must see phase-one values, and a grid
/// too large to be co-resident is a clear error. Also an audit that fails once
/// a launch skips the barrier's reset (the word an audit passed is left as it
/// is, its phase bit included): the same kernel runs five times on every SM,
/// then on half of them, one, and every SM again, each run's audit passing
/// from the word the run before left, and a reset made again although the
/// last audit passed:
/// the first run (no audit yet) makes one fill more than every later one, on
/// every grid (the reset; negative control: resetting before every launch makes
/// them all equal).
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_grid_sync_is_cooperative_and_checks_residency() {
    let gpu = backend();
    let program = grid_sync_program();
    let blocks = gpu.caps().sm_count;
    let mut fills = Vec::new();
    for (grid, runs) in [(blocks, 5), ((blocks / 2).max(1), 2), (1, 2), (blocks, 2)] {
        let n = (128 * grid) as usize;
        let inputs = vec![vec![0u8; 4 * n], vec![0u8; 4 * n]];
        let config = DispatchConfig::linear(grid);
        let expected = reference(&program, &inputs, &config);
        let borrowed: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
        for _ in 0..runs {
            let before = vyre_cuda::backend::thread_driver_calls();
            assert_eq!(
                run_host(&gpu, &program, &borrowed, &config).unwrap(),
                expected,
                "grid {grid}"
            );
            fills.push(
                vyre_cuda::backend::thread_driver_calls()
                    .since(&before)
                    .fills,
            );
        }
    }
    assert!(
        fills[1..].iter().all(|&f| f + 1 == fills[0]),
        "fills per run: {fills:?}"
    );
    let kernel = gpu
        .compile(&program, &DispatchConfig::linear(blocks))
        .unwrap();
    assert!(kernel.uses_grid_sync());

    let huge = DispatchConfig::linear(1_000_000);
    let big = [
        vec![0u8; 4 * 128 * 1_000_000],
        vec![0u8; 4 * 128 * 1_000_000],
    ];
    let big_refs: Vec<&[u8]> = big.iter().map(|v| v.as_slice()).collect();
    let err = run_host(&gpu, &program, &big_refs, &huge).unwrap_err();
    let message = err.to_string();
    assert!(
        matches!(err, BackendError::GridTooLargeForGridSync { .. }),
        "{message}"
    );
    assert!(
        message.starts_with("Fix:") && message.contains("grid_neighbour"),
        "{message}"
    );
    assert!(gpu.is_usable());
}

/// A program of `syncs` grid syncs on a grid of any shape: each workgroup's first
/// thread, in every round, writes a value for the round into its slot, the grid
/// syncs, it adds another workgroup's slot (one further along each round, so
/// every neighbour's write of that round must be visible), and the grid syncs
/// again before the next round's writes; one last sync makes the count odd.
fn grid_rounds_program(rounds: u32) -> Program {
    Program::builder([32, 1, 1])
        .entry_op_id("grid_rounds")
        .buffer(
            "slots",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "sums",
            1,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            let plane = b.let_(
                "plane",
                Expr::workgroup_count(Axis::X) * Expr::workgroup_count(Axis::Y),
            );
            let total = b.let_("total", plane.clone() * Expr::workgroup_count(Axis::Z));
            let group = b.let_(
                "group",
                Expr::workgroup_id(Axis::X)
                    + Expr::workgroup_count(Axis::X) * Expr::workgroup_id(Axis::Y)
                    + plane * Expr::workgroup_id(Axis::Z),
            );
            let first = b.let_(
                "first",
                Expr::binary(BinaryOp::Eq, Expr::local_id(Axis::X), 0u32),
            );
            let sum = b.let_mut("sum", 0u32);
            for round in 0..rounds {
                b.if_(first.clone(), |b| {
                    b.store(
                        "slots",
                        group.clone(),
                        group.clone() * 31u32 + (round * 1000 + 1),
                    );
                });
                b.grid_sync();
                b.if_(first.clone(), |b| {
                    let other = (group.clone() + (round + 1)) % total.clone();
                    b.assign("sum", sum.clone() + Expr::load("slots", other));
                });
                b.grid_sync();
            }
            b.grid_sync();
            b.if_(first.clone(), |b| {
                b.store("sums", group.clone(), sum.clone());
            });
        })
        .build()
}

/// Locks out a grid barrier that releases a phase early or late on a grid of
/// more than one dimension, or after an odd number of syncs: the first
/// workgroup (the one that adds the phase bit's share) is the one at 0 on every
/// axis, the count of workgroups is the product of the three axes, and each
/// launch's syncs start from the phase bit the launch before left (the backend
/// skips the reset after an audit passed, so with 9 syncs a launch every other
/// launch starts with the bit set). Every workgroup's sums over 4 rounds equal
/// the reference interpreter's on grids of 1, 2 × 3 × 2 and every SM's worth
/// in three dimensions, three launches each; a barrier that let a workgroup
/// past before a neighbour's write of the round would read the round before's
/// value, and one whose phase never completed would leave the audit unbalanced
/// or hang past the test's limit.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_grid_syncs_on_three_dimensional_grids_see_every_round() {
    let gpu = backend();
    let program = grid_rounds_program(4);
    let most = gpu.caps().sm_count.max(1);
    let side = ((most as f64).cbrt() as u32).max(1);
    for workgroups in [[1, 1, 1], [2, 3, 2], [side, side, most / (side * side)]] {
        let total = workgroups.iter().product::<u32>() as usize;
        let inputs = vec![vec![0u8; 4 * total], vec![0u8; 4 * total]];
        let config = DispatchConfig::new(workgroups);
        let expected = reference(&program, &inputs, &config);
        let borrowed: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
        for launch in 0..3 {
            assert_eq!(
                run_host(&gpu, &program, &borrowed, &config).unwrap(),
                expected,
                "grid {workgroups:?}, launch {launch}"
            );
        }
    }
    assert!(gpu.is_usable());
}

/// Locks out a clock that is not `%globaltimer`'s nanoseconds or that runs
/// backwards: 64 threads read it, run 20,000 dependent steps, and read it again;
/// every first reading is a real time (past 0), every later one is past its
/// first, and no thread's interval is longer than the kernel's own stamps
/// (earliest block start to latest block end, on the same clock) plus one
/// 32 ns tick at each end. The loop's result is stored, so the work stays.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_the_clock_reads_nanoseconds_inside_the_kernel() {
    let gpu = backend();
    let program = Program::builder([32, 1, 1])
        .buffer(
            "stamps",
            0,
            Access::ReadWrite,
            ElemType::U64,
            BufferCount::Runtime,
        )
        .body(|b| {
            let thread = b.let_("thread", Expr::global_id(Axis::X));
            let start = b.let_("start", Expr::clock());
            let value = b.let_mut("value", thread.clone());
            b.loop_("step", 0u32, 20_000u32, |b, step| {
                b.assign("value", value.clone() * 1_664_525u32 + step);
            });
            let end = b.let_("end", Expr::clock());
            b.store("stamps", thread.clone() * 3u32, start.clone());
            b.store("stamps", thread.clone() * 3u32 + 1u32, end - start);
            b.store("stamps", thread * 3u32 + 2u32, value.cast(ScalarType::U64));
        })
        .build();
    let input = vec![0u8; 64 * 3 * 8];
    let config = DispatchConfig::linear(2);
    let buffers = buffer_copies(&gpu, &[input]);
    let bound = bindings(&buffers);
    let timed = gpu
        .run(Dispatch::program(&program, &bound).config(&config))
        .unwrap();
    let stamps = timed.outputs.read::<u64>("stamps").unwrap();
    let window = timed.timings.kernel_stamps_ns;
    assert!(window > 0, "{:?}", timed.timings);
    for (thread, words) in stamps.chunks_exact(3).enumerate() {
        let (start, elapsed) = (words[0], words[1]);
        assert!(start > 0, "thread {thread}: {words:?}");
        assert!(
            elapsed > 0 && elapsed <= window + 64,
            "thread {thread}: {elapsed} ns of {window}"
        );
    }
}

/// Locks out fixpoint iterations that run once (or restage between runs): five
/// replays of `x += 1` over one buffer give 5.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_fixpoint_iterations_replay_in_one_dispatch() {
    let gpu = backend();
    let program = Program::builder([32, 1, 1])
        .buffer(
            "x",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            let i = b.let_("i", Expr::global_id(Axis::X));
            b.store("x", i.clone(), Expr::load("x", i.clone()) + 1u32);
        })
        .build();
    let input = bytes(&[10u32; 64]);
    let config = DispatchConfig::linear(2).with_fixpoint_iterations(5);
    let out = run_host(&gpu, &program, &[&input], &config).unwrap();
    assert_eq!(out.read::<u32>("x").unwrap(), vec![15u32; 64]);
    assert_eq!(
        out,
        reference(&program, std::slice::from_ref(&input), &config)
    );
}

/// Locks out readback policies that read the wrong bytes: byte ranges come back
/// in the order asked (over a mix of a device buffer, host bytes and an output
/// stated by its length), and bad ranges are Fix errors.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_readback_ranges_and_mixed_bindings() {
    let gpu = backend();
    let program = Program::builder([16, 1, 1])
        .buffer(
            "a",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "b",
            1,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "c",
            2,
            Access::WriteOnly,
            ElemType::U8,
            BufferCount::Runtime,
        )
        .body(|b| {
            let i = b.let_("i", Expr::global_id(Axis::X));
            let v = b.let_("v", Expr::load("a", i.clone()));
            b.store("b", i.clone(), v.clone() + Expr::load("b", i.clone()));
            b.store("c", i.clone(), v + 200u32);
        })
        .build();
    let a: Vec<u32> = (0..16).collect();
    let device_a = gpu.buffer_from(&a).unwrap();
    let b_in = [100u32; 16];
    let ranges = ReadbackPolicy::Ranges(smallvec::smallvec![
        ByteRange {
            binding: 2,
            offset: 4,
            len: 4
        },
        ByteRange {
            binding: 1,
            offset: 8,
            len: 8
        },
    ]);
    let config = DispatchConfig::linear(1).with_readback(ranges);
    let bindings = [
        Binding::from(&device_a),
        Binding::host(&b_in),
        Binding::Zeroed(16),
    ];
    let out = gpu
        .run(Dispatch::program(&program, &bindings).config(&config))
        .unwrap()
        .outputs;
    assert_eq!(out, vec![vec![204, 205, 206, 207], bytes(&[102, 103])]);
    assert_eq!(out.item_binding(0), Some(2));
    assert_eq!(out.get("b").unwrap(), bytes(&[102, 103]));

    let bad = DispatchConfig::linear(1).with_readback(ReadbackPolicy::Ranges(smallvec::smallvec![
        ByteRange {
            binding: 0,
            offset: 0,
            len: 4
        }
    ]));
    let message = gpu
        .run(Dispatch::program(&program, &bindings).config(&bad))
        .unwrap_err()
        .to_string();
    assert!(
        message.starts_with("Fix:") && message.contains("not an output"),
        "{message}"
    );
    let past =
        DispatchConfig::linear(1).with_readback(ReadbackPolicy::Ranges(smallvec::smallvec![
            ByteRange {
                binding: 1,
                offset: 60,
                len: 8
            }
        ]));
    let message = gpu
        .run(Dispatch::program(&program, &bindings).config(&past))
        .unwrap_err()
        .to_string();
    assert!(message.contains("past the buffer"), "{message}");
}

/// Locks out one caller's bytes reaching another: a write-only transient output
/// starts zeroed even when its pooled buffer last held a secret.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_transient_outputs_never_leak_between_dispatches() {
    let gpu = backend();
    let writer = Program::builder([64, 1, 1])
        .buffer(
            "o",
            0,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            b.store("o", Expr::global_id(Axis::X), 0xDEAD_BEEFu32);
        })
        .build();
    let silent = Program::builder([64, 1, 1])
        .buffer(
            "o",
            0,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            b.if_(Expr::global_id(Axis::X).equals(1_000_000u32), |b| {
                b.store("o", 0u32, 1u32);
            });
        })
        .build();
    let size = [Binding::Zeroed(4096)];
    let secret = gpu
        .run(Dispatch::program(&writer, &size).workgroups([16, 1, 1]))
        .unwrap()
        .outputs;
    assert!(secret
        .read::<u32>("o")
        .unwrap()
        .iter()
        .all(|&w| w == 0xDEAD_BEEF));
    let after = gpu
        .run(Dispatch::program(&silent, &size).workgroups([16, 1, 1]))
        .unwrap()
        .outputs;
    assert!(
        after.get("o").unwrap().iter().all(|&b| b == 0),
        "a previous dispatch's bytes leaked"
    );
}

/// Locks out data races in the shared caches and pools: 8 threads × 1,000
/// dispatches over 4 programs, every result checked, counters consistent.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_eight_threads_thousand_dispatches_each() {
    let gpu = backend();
    let programs: Arc<Vec<Program>> = Arc::new(
        (1..=4u32)
            .map(|k| host_cost_fixture(2 + k, 8 * k))
            .collect(),
    );
    let before = gpu.cache_stats();
    let threads: Vec<_> = (0..8u32)
        .map(|t| {
            let gpu = gpu.clone();
            let programs = Arc::clone(&programs);
            std::thread::spawn(move || {
                for i in 0..1000u32 {
                    let k = ((t + i) % 4) as usize;
                    let program = &programs[k];
                    let x = t * 100_000 + i;
                    let inputs = fixture_inputs(program, x);
                    let borrowed: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
                    let out =
                        run_host(&gpu, program, &borrowed, &DispatchConfig::linear(1)).unwrap();
                    let chain = 8 * (k as u32 + 1);
                    assert_eq!(
                        out.read::<u32>("out").unwrap()[0],
                        host_cost_fixture_expected(x, chain),
                        "thread {t} call {i}"
                    );
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let stats = gpu.cache_stats();
    let ptx_lookups = (stats.ptx.hits + stats.ptx.misses) - (before.ptx.hits + before.ptx.misses);
    assert_eq!(ptx_lookups, 8000, "one PTX lookup per dispatch");
    assert!(stats.ptx_entries >= 4 && stats.module_entries >= 4);
    assert!(
        stats.ptx.misses - before.ptx.misses <= 4 * 8,
        "at most one racing miss per thread and program"
    );
    assert!(
        gpu.pool_stats().lanes_created <= 8 + 1,
        "{:?}",
        gpu.pool_stats()
    );
}

/// Locks out a cache hit that walks the program: 10,000 warm dispatches of one
/// program (1,000 under compute-sanitizer) compute its digest once and lower it once.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_warm_dispatches_never_walk_the_program() {
    let gpu = backend();
    let program = host_cost_fixture(9, 1024);
    let inputs = fixture_inputs(&program, 1);
    let buffers = buffer_copies(&gpu, &inputs);
    let bound = bindings(&buffers);
    let digests = computations_on_current_thread();
    let walks = vyre_cuda::lower::walks_on_current_thread();
    let config = DispatchConfig::linear(1);
    for _ in 0..support::sanitizer::sized_for_tools("warm dispatches", 10_000, 1_000) {
        gpu.run(Dispatch::program(&program, &bound).config(&config))
            .unwrap();
    }
    assert!(
        computations_on_current_thread() - digests <= 1,
        "digest recomputed on warm dispatches"
    );
    assert!(
        vyre_cuda::lower::walks_on_current_thread() - walks <= 1,
        "lowering re-walked the program"
    );
}

/// Locks out driver allocations on the warm path: after warm-up, 1,000 dispatches
/// of host bindings create no lane, staging or transient buffer.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_warm_path_makes_no_driver_allocation() {
    let gpu = backend();
    let program = host_cost_fixture(5, 16);
    let inputs = fixture_inputs(&program, 3);
    let borrowed: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
    let config = DispatchConfig::linear(1);
    for _ in 0..3 {
        run_host(&gpu, &program, &borrowed, &config).unwrap();
    }
    let warm = gpu.pool_stats();
    for _ in 0..1000 {
        run_host(&gpu, &program, &borrowed, &config).unwrap();
    }
    let after = gpu.pool_stats();
    assert_eq!(after.lanes_created, warm.lanes_created);
    assert_eq!(after.staging_allocations, warm.staging_allocations);
    assert_eq!(after.transient_allocations, warm.transient_allocations);
}

/// Locks out silent bad input on the device path: wrong counts and sizes are Fix
/// errors naming the buffer, before anything is enqueued.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_bad_inputs_are_fix_errors() {
    let gpu = backend();
    let program = host_cost_fixture(3, 2);
    let four = vec![0u8; 16];
    let m = run_host(&gpu, &program, &[&four], &DispatchConfig::linear(1))
        .unwrap_err()
        .to_string();
    assert!(
        m.starts_with("Fix:") && m.contains("takes 3 buffers"),
        "{m}"
    );
    let short = vec![0u8; 12];
    let m = run_host(
        &gpu,
        &program,
        &[&four, &short, &four],
        &DispatchConfig::linear(1),
    )
    .unwrap_err()
    .to_string();
    assert!(m.starts_with("Fix:") && m.contains("'out'"), "{m}");
    let m = run_host(
        &gpu,
        &program,
        &[&four, &four, &four],
        &DispatchConfig::linear(0),
    )
    .unwrap_err()
    .to_string();
    assert!(
        m.starts_with("Fix:") && m.contains("workgroups.x is 0"),
        "{m}"
    );
    let m = run_host(
        &gpu,
        &program,
        &[&four, &four, &four],
        &DispatchConfig::linear(1).with_fixpoint_iterations(0),
    )
    .unwrap_err()
    .to_string();
    assert!(m.starts_with("Fix:") && m.contains("fixpoint"), "{m}");
    let invalid = support::parity::store_to_read_only();
    let m = run_host(&gpu, &invalid, &[&four[..4]], &DispatchConfig::linear(1))
        .unwrap_err()
        .to_string();
    assert!(m.starts_with("Fix:"), "{m}");
    assert!(gpu.is_usable());
}

/// Locks out a kernel handle that skips checks: a compiled kernel dispatches
/// through caller buffers and rejects mis-sized output slices.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_compiled_kernel_dispatches_into_caller_buffers() {
    let gpu = backend();
    let program = host_cost_fixture(3, 10);
    let config = DispatchConfig::linear(1);
    let kernel = gpu.compile(&program, &config).unwrap();
    let inputs = fixture_inputs(&program, 7);
    let bound = support::host_bindings(&inputs);
    let request = Dispatch::new(&kernel, &bound).config(&config);
    let (mut out0, mut out1) = ([0u8; 16], [0u8; 16]);
    let timing = gpu.run_into(request, &mut [&mut out0, &mut out1]).unwrap();
    assert_eq!(words(&out0)[0], host_cost_fixture_expected(7, 10));
    assert_eq!(
        timing.event_window_ns, None,
        "the hot path records no events"
    );
    assert!(
        timing.kernel_stamps_ns > 0,
        "the kernel stamps itself: {timing:?}"
    );
    assert!(timing.wall_ns > 0 && timing.wait_ns <= timing.wall_ns);
    let timed = gpu
        .run_into(
            request.timing(Timing::EventWindow),
            &mut [&mut out0, &mut out1],
        )
        .unwrap();
    assert!(
        timed.kernel_stamps_ns > 0 && Some(timed.kernel_stamps_ns) <= timed.event_window_ns,
        "{timed:?}"
    );
    let mut small = [0u8; 8];
    let m = gpu
        .run_into(request, &mut [&mut out0, &mut small])
        .unwrap_err()
        .to_string();
    assert!(m.starts_with("Fix:") && m.contains("output slices"), "{m}");
}

/// Locks out a blocking dispatch that reuses the previous one's plan, addresses or
/// readback routes when what it binds or asks for changed (the reuse of a repeated
/// request, `dispatch/reuse.rs`): every dispatch of one kernel, repeated, then with
/// another buffer set, a buffer replaced in the same slot of the same `Vec` (the
/// same `DeviceBuffer` address, possibly the freed memory reused), host bytes,
/// readback of nothing and of byte ranges, another grid and fixpoint count, mis-sized
/// and right caller slices, and a submission in between, reads exactly what its own
/// bindings hold. Control: the same request twice gives the same answer.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_a_repeated_request_follows_what_it_binds() {
    let gpu = backend();
    let chain = 12;
    let program = host_cost_fixture(4, chain);
    let config = DispatchConfig::linear(1);
    let kernel = gpu.compile(&program, &config).unwrap();
    let expected = |x| host_cost_fixture_expected(x, chain);
    let out_of =
        |finished: vyre_cuda::backend::Finished| finished.outputs.read::<u32>("out").unwrap()[0];
    let mut first = buffer_copies(&gpu, &fixture_inputs(&program, 10));
    let second = buffer_copies(&gpu, &fixture_inputs(&program, 20));
    for (round, x) in [10, 10, 20, 20, 10].into_iter().enumerate() {
        let set = if x == 10 { &first } else { &second };
        let bound = bindings(set);
        let finished = gpu
            .run(Dispatch::new(&kernel, &bound).config(&config))
            .unwrap();
        assert_eq!(out_of(finished), expected(x), "round {round}");
    }
    // A new buffer in the same slot: same `DeviceBuffer` address, new memory and input.
    for x in [30, 40] {
        first[0] = gpu.buffer_from(&[x, 0, 0, 0]).unwrap();
        let bound = bindings(&first);
        let finished = gpu
            .run(Dispatch::new(&kernel, &bound).config(&config))
            .unwrap();
        assert_eq!(out_of(finished), expected(x));
    }
    let bound = bindings(&first);
    let request = Dispatch::new(&kernel, &bound).config(&config);
    gpu.upload(&first[1], &[0u32; 4]).unwrap();
    let nothing = ReadbackPolicy::None;
    let finished = gpu.run(request.readback(&nothing)).unwrap();
    assert!(finished.outputs.is_empty());
    assert_eq!(gpu.read::<u32>(&first[1]).unwrap()[0], expected(40));
    let word = ReadbackPolicy::Ranges(
        vec![ByteRange {
            binding: 1,
            offset: 0,
            len: 4,
        }]
        .into_iter()
        .collect(),
    );
    let finished = gpu.run(request.readback(&word)).unwrap();
    assert_eq!(words(finished.outputs.item(0).unwrap()), [expected(40)]);
    for request in [
        request.workgroups([3, 1, 1]),
        request.fixpoint_iterations(2),
        request,
    ] {
        assert_eq!(out_of(gpu.run(request).unwrap()), expected(40));
    }
    let host = fixture_inputs(&program, 50);
    let host_bound = support::host_bindings(&host);
    let finished = gpu
        .run(Dispatch::new(&kernel, &host_bound).config(&config))
        .unwrap();
    assert_eq!(out_of(finished), expected(50));
    let mut outs = [[0u8; 16]; 3];
    let mut short = [0u8; 8];
    let (a, b) = outs.split_at_mut(1);
    let m = gpu
        .run_into(request, &mut [&mut a[0], &mut b[0], &mut short])
        .unwrap_err()
        .to_string();
    assert!(m.starts_with("Fix:") && m.contains("output slices"), "{m}");
    let mut slices: Vec<&mut [u8]> = outs.iter_mut().map(|o| &mut o[..]).collect();
    gpu.run_into(request, &mut slices).unwrap();
    assert_eq!(words(&outs[0])[0], expected(40));
    let pending = gpu.submit(request).unwrap();
    assert_eq!(out_of(pending.wait().unwrap()), expected(40));
    assert_eq!(out_of(gpu.run(request).unwrap()), expected(40));
}

/// Locks out a reused readback route that points into another lane's result area:
/// threads that each repeat one request over their own buffers (so the lanes pass
/// between threads, and a thread's routes are made for a lane it no longer holds)
/// each read back exactly their own result, through `run` and `run_into`.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_threads_repeating_requests_read_only_their_own_results() {
    let gpu = backend();
    let chain = 8;
    let program = Arc::new(host_cost_fixture(9, chain));
    let config = DispatchConfig::linear(1);
    let kernel = Arc::new(gpu.compile(&program, &config).unwrap());
    let threads: Vec<_> = (0..4u32)
        .map(|t| {
            let (gpu, program, kernel) = (gpu.clone(), Arc::clone(&program), Arc::clone(&kernel));
            let config = config.clone();
            std::thread::spawn(move || {
                let x = 1000 * (t + 1);
                let buffers = buffer_copies(&gpu, &fixture_inputs(&program, x));
                let bound = bindings(&buffers);
                let request = Dispatch::new(&kernel, &bound).config(&config);
                let mut outs = [[0u8; 16]; 8];
                for i in 0..500 {
                    let out = if i % 2 == 0 {
                        gpu.run(request)
                            .unwrap()
                            .outputs
                            .read::<u32>("out")
                            .unwrap()[0]
                    } else {
                        let mut slices: Vec<&mut [u8]> =
                            outs.iter_mut().map(|o| &mut o[..]).collect();
                        gpu.run_into(request, &mut slices).unwrap();
                        words(&outs[0])[0]
                    };
                    assert_eq!(
                        out,
                        host_cost_fixture_expected(x, chain),
                        "thread {t} call {i}"
                    );
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

// ---------------------------------------------------------------------------
// Owned buffers, non-blocking submission, driver-call counts (issues 10.3, 11).

/// `x[i] = lcg^iterations(x[i])` over a runtime-sized `u32` buffer: long enough
/// (with a large `iterations`) to overlap a transfer on another lane.
fn lcg_program(iterations: u32) -> Program {
    Program::builder([256, 1, 1])
        .buffer(
            "x",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            let i = b.let_("i", Expr::global_id(Axis::X));
            b.if_(i.clone().less_than(Expr::length("x")), |b| {
                let acc = b.let_mut("acc", Expr::load("x", i.clone()));
                b.loop_("j", 0u32, iterations, |b, _| {
                    b.assign("acc", acc.clone() * 1_664_525u32 + 1_013_904_223u32);
                });
                b.store("x", i.clone(), acc.clone());
            });
        })
        .build()
}

/// The LCG applied `iterations` times, as one affine map `x → a·x + c` (mod 2³²)
/// composed on the host once, so checking a million outputs stays cheap.
fn lcg_map(iterations: u32) -> impl Fn(u32) -> u32 {
    let (a, c) = (0..iterations).fold((1u32, 0u32), |(a, c), _| {
        (
            a.wrapping_mul(1_664_525),
            c.wrapping_mul(1_664_525).wrapping_add(1_013_904_223),
        )
    });
    move |x| a.wrapping_mul(x).wrapping_add(c)
}

fn lcg_expected(x: u32, iterations: u32) -> u32 {
    lcg_map(iterations)(x)
}

/// Locks out extra synchronizes (invariant 4) on every way to finish a request:
/// counting the real driver's `cuStreamSynchronize` calls on this thread, each —
/// a program over host bytes, a program over device buffers, the same with the
/// event window, a kernel into caller buffers, submitted and waited, submitted
/// after a pending one (the chain waits once per dispatch), graph replay — makes
/// exactly one per dispatch, and each launches its fixpoint iterations. Negative
/// control: an upload followed by a dispatch counts two.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_every_dispatch_path_makes_exactly_one_synchronize() {
    use vyre_cuda::backend::thread_driver_calls;
    let gpu = backend();
    let program = lcg_program(3);
    let config = DispatchConfig::linear(1).with_fixpoint_iterations(2);
    let input = bytes(&(0..256u32).collect::<Vec<_>>());
    let kernel = gpu.compile(&program, &config).unwrap();
    let buffer = gpu.buffer_from(&input).unwrap();
    let other = gpu.buffer_from(&input).unwrap();
    let on_buffer = [Binding::from(&buffer)];
    let on_other = [Binding::from(&other)];
    let mut graph = gpu
        .record(|rec| {
            rec.dispatch(Dispatch::new(&kernel, &on_buffer).config(&config))?;
            rec.read_back(&buffer, 0, 16)?;
            Ok(())
        })
        .unwrap();
    // Warm every path once (lanes and staging are created on first use).
    run_host(&gpu, &program, &[&input], &config).unwrap();
    let mut out = vec![0u8; input.len()];
    let check = |name: &str, launches: u64, graph_launches: u64, run: &mut dyn FnMut()| {
        let before = thread_driver_calls();
        run();
        let after = thread_driver_calls();
        assert_eq!(
            after.synchronizes - before.synchronizes,
            1,
            "{name}: synchronizes"
        );
        assert_eq!(
            after.launches - before.launches,
            launches,
            "{name}: launches"
        );
        assert_eq!(
            after.graph_launches - before.graph_launches,
            graph_launches,
            "{name}: graph launches"
        );
    };
    check("program over host bytes", 2, 0, &mut || {
        run_host(&gpu, &program, &[&input], &config).unwrap();
    });
    check("program over a device buffer", 2, 0, &mut || {
        gpu.run(Dispatch::program(&program, &on_other).config(&config))
            .unwrap();
    });
    check("with the event window", 2, 0, &mut || {
        gpu.run(
            Dispatch::program(&program, &on_other)
                .config(&config)
                .timing(Timing::EventWindow),
        )
        .unwrap();
    });
    check("kernel into caller buffers", 2, 0, &mut || {
        gpu.run_into(
            Dispatch::new(&kernel, &on_buffer).config(&config),
            &mut [&mut out],
        )
        .unwrap();
    });
    check("submit + wait", 2, 0, &mut || {
        gpu.submit(Dispatch::new(&kernel, &on_buffer).config(&config))
            .unwrap()
            .wait()
            .unwrap();
    });
    check("graph replay", 0, 1, &mut || {
        graph.replay().unwrap();
    });
    // A chain of two, the second after the first on the device: two dispatches,
    // two synchronizes (the earlier one then finds its stream idle), one device wait.
    let before = thread_driver_calls();
    let request = Dispatch::new(&kernel, &on_buffer).config(&config);
    let first = gpu.submit(request).unwrap();
    let second = gpu.submit(request.after(&first)).unwrap();
    second.wait().unwrap();
    first.wait().unwrap();
    let chained = thread_driver_calls().since(&before);
    assert_eq!(
        (chained.synchronizes, chained.launches, chained.stream_waits),
        (2, 4, 1),
        "{chained:?}"
    );
    // Negative control: the counter does see a second synchronize.
    let before = thread_driver_calls();
    gpu.upload(&other, &input).unwrap();
    gpu.run(Dispatch::program(&program, &on_other).config(&config))
        .unwrap();
    assert_eq!(thread_driver_calls().synchronizes - before.synchronizes, 2);
}

/// Locks out leaks and use-after-free of owned buffers: a buffer starts zeroed,
/// its bytes are counted while it lives and released on drop; dropping it while a
/// submitted dispatch still uses it is safe (the dispatch holds its memory) and
/// the dispatch's outputs are right; a buffer of another backend is a `Fix:` error.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_owned_buffers_free_on_drop_and_outlive_nothing_in_flight() {
    let gpu = backend();
    let baseline = gpu.pool_stats();
    let zeroed = gpu.buffer(4096).unwrap();
    assert_eq!(
        gpu.read::<u8>(&zeroed).unwrap(),
        vec![0u8; 4096],
        "starts zeroed"
    );
    assert_eq!(gpu.pool_stats().buffer_bytes, baseline.buffer_bytes + 4096);
    assert_eq!(gpu.pool_stats().live_buffers, baseline.live_buffers + 1);
    drop(zeroed);
    assert_eq!(
        gpu.pool_stats().buffer_bytes,
        baseline.buffer_bytes,
        "freed on drop"
    );
    assert_eq!(gpu.pool_stats().live_buffers, baseline.live_buffers);

    let iterations = 64;
    let program = lcg_program(iterations);
    let config = DispatchConfig::linear(16);
    let kernel = gpu.compile(&program, &config).unwrap();
    let words_in: Vec<u32> = (0..4096u32).collect();
    let buffer = gpu.buffer_from(&words_in).unwrap();
    let pending = gpu
        .submit(Dispatch::new(&kernel, &[buffer.binding()]).config(&config))
        .unwrap();
    drop(buffer); // the dispatch in flight still holds the memory
    let outputs = pending.wait().unwrap().outputs;
    let expected: Vec<u32> = words_in
        .iter()
        .map(|&x| lcg_expected(x, iterations))
        .collect();
    assert_eq!(outputs.read::<u32>("x").unwrap(), expected);
    assert_eq!(gpu.pool_stats().buffer_bytes, baseline.buffer_bytes);

    let other = CudaBackend::acquire().unwrap();
    let foreign = other.buffer(16).unwrap();
    let message = gpu.read::<u8>(&foreign).unwrap_err().to_string();
    assert!(
        message.starts_with("Fix:") && message.contains("another backend"),
        "{message}"
    );
}

/// Locks out a pipeline that serialises: batch N+1's upload (a host binding on
/// its own lane) must run while batch N's kernel computes, seen on the device
/// clock (events, not wall time), and both outputs must be right. Negative
/// control: the same two batches with a wait in between do not overlap.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_pipelined_submissions_overlap_upload_with_compute() {
    let gpu = backend();
    let iterations = 1 << 17;
    let program = lcg_program(iterations);
    let elements = 1usize << 20;
    let config = DispatchConfig::linear((elements / 256) as u32);
    let kernel = gpu.compile(&program, &config).unwrap();
    let batch = |seed: u32| -> Vec<u32> {
        (0..elements as u32)
            .map(|i| i.wrapping_mul(2_654_435_761).wrapping_add(seed))
            .collect()
    };
    let (first, second) = (batch(1), batch(2));
    let device_first = gpu.buffer_from(&first).unwrap();
    let on_device = [device_first.binding()];
    let on_host = [Binding::host(&second)];
    let timed = |bindings| {
        Dispatch::new(&kernel, bindings)
            .config(&config)
            .timing(Timing::EventWindow)
    };
    let map = lcg_map(iterations);
    let expect = |input: &[u32]| -> Vec<u32> { input.iter().map(|&x| map(x)).collect() };
    // Warm both lanes and their staging.
    for _ in 0..2 {
        let a = gpu.submit(timed(&on_host)).unwrap();
        let b = gpu.submit(timed(&on_host)).unwrap();
        a.wait().unwrap();
        b.wait().unwrap();
    }
    let overlaps = |a: &vyre_cuda::backend::DeviceSpans, b: &vyre_cuda::backend::DeviceSpans| {
        // b's upload runs in [window_start, kernel_start); a's kernel in
        // [kernel_start, kernel_end).
        b.window_start_ns < a.kernel_end_ns && b.kernel_start_ns > a.kernel_start_ns
    };

    let clock = gpu.device_clock().unwrap();
    let n = gpu.submit(timed(&on_device)).unwrap();
    let n_plus_1 = gpu.submit(timed(&on_host)).unwrap();
    let (out_n, spans_n) = n.wait_spans(&clock).unwrap();
    let (out_n1, spans_n1) = n_plus_1.wait_spans(&clock).unwrap();
    assert_eq!(out_n.outputs.read::<u32>("x").unwrap(), expect(&first));
    assert_eq!(out_n1.outputs.read::<u32>("x").unwrap(), expect(&second));
    assert!(
        spans_n.kernel_end_ns > spans_n.kernel_start_ns
            && spans_n1.kernel_start_ns > spans_n1.window_start_ns,
        "spans measured: {spans_n:?} {spans_n1:?}"
    );
    assert!(
        overlaps(&spans_n, &spans_n1),
        "batch N+1's upload did not overlap batch N's kernel: {spans_n:?} {spans_n1:?}"
    );

    // Negative control: waiting in between serialises them.
    let clock = gpu.device_clock().unwrap();
    let (_, spans_a) = gpu
        .submit(timed(&on_device))
        .unwrap()
        .wait_spans(&clock)
        .unwrap();
    let (_, spans_b) = gpu
        .submit(timed(&on_host))
        .unwrap()
        .wait_spans(&clock)
        .unwrap();
    assert!(!overlaps(&spans_a, &spans_b), "{spans_a:?} {spans_b:?}");
}

/// Locks out unbounded or unsafe pending work: more than `MAX_PENDING` submissions
/// is a `Fix:` error (not a new stream), dropping pending results waits for them
/// (their outputs are never read, their lanes come back), and submission works
/// again afterwards; an untimed submission refuses `wait_spans` with a `Fix:`.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_pending_limit_drop_and_misuse() {
    use vyre_cuda::backend::MAX_PENDING;
    let gpu = backend();
    let program = lcg_program(16);
    let config = DispatchConfig::linear(1);
    let kernel = gpu.compile(&program, &config).unwrap();
    let input: Vec<u32> = (0..256u32).collect();
    let bound = [Binding::host(&input)];
    let request = Dispatch::new(&kernel, &bound).config(&config);
    let mut pending = Vec::new();
    for _ in 0..MAX_PENDING {
        pending.push(gpu.submit(request).unwrap());
    }
    let message = gpu.submit(request).unwrap_err().to_string();
    assert!(
        message.starts_with("Fix:") && message.contains("pending"),
        "{message}"
    );
    let lanes = gpu.pool_stats().lanes_created;
    drop(pending); // each drop waits for its dispatch
    let again = gpu.submit(request).unwrap();
    let clock = gpu.device_clock().unwrap();
    let message = again.wait_spans(&clock).unwrap_err().to_string();
    assert!(message.starts_with("Fix:"), "{message}");
    let expected: Vec<u32> = (0..256u32).map(|x| lcg_expected(x, 16)).collect();
    let out = gpu.submit(request).unwrap().wait().unwrap();
    assert_eq!(out.outputs.read::<u32>("x").unwrap(), expected);
    assert_eq!(
        gpu.pool_stats().lanes_created,
        lanes,
        "dropped lanes were reused"
    );
}

/// Locks out any difference between the CUDA backend and the reference fallback
/// behind the portable interface: the same session (buffers, every readback
/// policy, submissions, a graph, caller errors) gives byte-identical observations
/// in the same shapes on both.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_portable_session_is_identical_on_cuda_and_reference() {
    use vyre_cuda::backend::AnyBackend;
    let cuda = AnyBackend::Cuda(backend());
    let reference = AnyBackend::reference();
    let on_gpu = support::portable_session(&cuda);
    let on_cpu = support::portable_session(&reference);
    assert_eq!(on_gpu.len(), on_cpu.len());
    for (i, (g, c)) in on_gpu.iter().zip(&on_cpu).enumerate() {
        assert_eq!(g, c, "observation {i} differs");
    }
}

/// Locks out torn or stale uploads from caller pinned memory: a dispatch bound to a
/// `PinnedBuffer` computes on its bytes, the buffer cannot be rewritten while the
/// dispatch is in flight (a `Fix:` error, not a race), and can be right after.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_pinned_buffers_upload_directly_and_refuse_writes_in_flight() {
    let gpu = backend();
    let iterations = 32;
    let program = lcg_program(iterations);
    let config = DispatchConfig::linear(4);
    let kernel = gpu.compile(&program, &config).unwrap();
    let mut pinned = gpu.pinned_buffer(4 * 1024).unwrap();
    assert!(pinned.as_slice().iter().all(|&b| b == 0), "starts zeroed");
    for round in 0..3u32 {
        let values: Vec<u32> = (0..1024u32).map(|i| i * 7 + round).collect();
        pinned
            .as_mut_slice()
            .unwrap()
            .copy_from_slice(&bytes(&values));
        let pending = gpu
            .submit(Dispatch::new(&kernel, &[pinned.binding()]).config(&config))
            .unwrap();
        let message = pinned.as_mut_slice().unwrap_err().to_string();
        assert!(
            message.starts_with("Fix:") && message.contains("in flight"),
            "{message}"
        );
        let outputs = pending.wait().unwrap().outputs;
        let expected: Vec<u32> = values
            .iter()
            .map(|&x| lcg_expected(x, iterations))
            .collect();
        assert_eq!(outputs.read::<u32>("x").unwrap(), expected, "round {round}");
        assert_eq!(
            words(pinned.as_slice()),
            values,
            "the pinned input is not written"
        );
    }
    assert!(pinned.as_mut_slice().is_ok());
}

/// The worked example of the ir docs (`examples/hash_table.rs`), compiled here.
#[allow(dead_code)]
mod hash_table {
    include!("../examples/hash_table.rs");
}

/// Locks out a `while` loop, `break` or compare-exchange that misbehaves on the GPU
/// in the ir docs' hash table (slots claimed by racing threads in any order): every
/// one of 210 queries finds its host-computed count of 1,000 keys, as on the
/// reference (tests/portable.rs). Negative control: the same comparison catches a
/// table counted from other keys.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_hash_table_example_counts_every_key() {
    let gpu = vyre_cuda::backend::AnyBackend::Cuda(backend());
    assert_eq!(hash_table::check(&gpu).unwrap(), Vec::<u32>::new());
    let (keys, queries) = hash_table::sample();
    let other = hash_table::count_and_look_up(&gpu, &[1, 2, 2], &queries).unwrap();
    assert_eq!(&other[..3], [1, 2, 0]);
    assert_eq!(hash_table::miscounted(&keys, &queries, &other).len(), 200);
}

/// Locks out a CPU fallback that answers differently from CUDA through `AnyBackend`
/// (the GPU half of `reference_answers_every_parity_case_as_cuda_does`): every
/// parity case — validation at `compile`, malformed requests, a buffer bound as input
/// and write-only output, grids of 70,000 on y and of 0, 20 pending submissions,
/// `buffer(u64::MAX)` and `buffer(1 << 40)`, a foreign buffer, and the good requests'
/// bytes — gives the same outcome on both: the same outputs, or the same error kind
/// and message (budget messages with their machine-specific byte counts masked).
/// Negative control: a case list with one outcome changed is told apart.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_fallback_answers_exactly_as_cuda() {
    use support::parity::{cases, Outcome};
    use vyre_cuda::backend::AnyBackend;
    let on_gpu = cases(&AnyBackend::Cuda(backend()));
    let on_cpu = cases(&AnyBackend::reference());
    assert_eq!(on_gpu.len(), on_cpu.len());
    for ((name, gpu), (cpu_name, cpu)) in on_gpu.iter().zip(&on_cpu) {
        assert_eq!(name, cpu_name);
        assert_eq!(gpu, cpu, "case {name}: CUDA and the reference differ");
    }
    let mut changed = on_cpu.clone();
    changed[0].1 = Outcome::Ran(vec![]);
    assert_ne!(on_gpu, changed, "negative control");
}

/// Locks out scalar values that miss the kernel (truncated to 32 bits, converted
/// instead of passed bit for bit, stale from an earlier dispatch) and values that
/// reach a cache key (a new value emitting new PTX or loading a new module: a driver
/// JIT per value): `support::every_scalar_type` dispatched as a program with three
/// sets of values and as a compiled kernel with two more (through `run`, `submit`
/// and `run_into`) gives the reference interpreter's bytes every time; the first
/// program dispatch is the only PTX and module miss, the later ones PTX hits of the
/// same module, and the kernel dispatches look nothing up. Negative control: another
/// program is a miss the counters see.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_scalar_values_reach_the_kernel_through_one_module() {
    let gpu = backend();
    let program = support::every_scalar_type();
    let config = DispatchConfig::linear(1);
    let sets: Vec<[Literal; 6]> = [
        (7u32, -3i32, 0.5f32, true, 1u64 << 40, i64::MIN),
        (u32::MAX, i32::MIN, -2.25, false, u64::MAX, 5),
        (
            0,
            0,
            f32::from_bits(0x7fc0_1234),
            true,
            0x8000_0000_0000_0001,
            -1,
        ),
        (1, 1, f32::from_bits(1), false, 1, 1),
        (0x8000_0000, i32::MAX, -0.0, true, 0xffff_ffff, i64::MAX),
    ]
    .into_iter()
    .map(support::every_scalar_value)
    .collect();
    let zeros = support::static_zeros(&program);
    let inputs: Vec<&[u8]> = zeros.iter().map(Vec::as_slice).collect();
    let options = vyre_cuda::reference::ReferenceOptions::default();
    let expected = |values: &[Literal]| {
        vyre_cuda::reference::run_with_scalars(&program, &inputs, values, &config, &options)
            .expect("reference")
            .0
    };
    let bindings = support::host_bindings(&zeros);
    let before = gpu.cache_stats();
    for (round, values) in sets[..3].iter().enumerate() {
        let request = Dispatch::program(&program, &bindings).config(&config);
        let got = gpu
            .run(support::with_scalars(request, &program, values))
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(got.outputs, expected(values), "round {round}: {values:?}");
    }
    let after = gpu.cache_stats();
    assert_eq!(after.ptx.misses - before.ptx.misses, 1, "{after:?}");
    assert_eq!(after.ptx.hits - before.ptx.hits, 2, "{after:?}");
    assert_eq!(after.module.misses - before.module.misses, 1, "{after:?}");
    assert_eq!(after.module_entries - before.module_entries, 1);
    let kernel = gpu.compile(&program, &config).unwrap();
    assert_eq!(kernel.scalars(), program.scalars());
    let warm = gpu.cache_stats();
    for values in &sets[3..] {
        let request = support::with_scalars(Dispatch::new(&kernel, &bindings), &program, values);
        let want = expected(values);
        assert_eq!(gpu.run(request).unwrap().outputs, want, "run {values:?}");
        let pending = gpu.submit(request).unwrap();
        assert_eq!(pending.wait().unwrap().outputs, want, "submit {values:?}");
        let mut storage: Vec<Vec<u8>> = want.iter().map(|item| vec![0; item.len()]).collect();
        let mut outs: Vec<&mut [u8]> = storage.iter_mut().map(Vec::as_mut_slice).collect();
        gpu.run_into(request, &mut outs).unwrap();
        assert_eq!(storage, want, "run_into {values:?}");
    }
    let kernels_only = gpu.cache_stats();
    assert_eq!(
        kernels_only.ptx, warm.ptx,
        "kernel requests look nothing up"
    );
    assert_eq!(kernels_only.module, warm.module);
    assert_eq!(kernels_only.module_entries, after.module_entries);
    // Negative control: a new program is a miss the counters see.
    let other = program.with_entry_op_id("every_scalar_type_again");
    let request = Dispatch::program(&other, &bindings).config(&config);
    gpu.run(support::with_scalars(request, &other, &sets[0]))
        .unwrap();
    assert_eq!(
        gpu.cache_stats().module.misses,
        kernels_only.module.misses + 1
    );
}

/// Locks out a repeated blocking request that reuses its previous dispatch's scalar
/// values along with its plan, addresses and readback routes, or skips the check of
/// its values: one kernel request over the same owned buffers, repeated with new
/// values through `run` and `run_into` (`support::repeated_scalar_requests`: after
/// the first round each one is the request the reuse serves), reads back the
/// reference interpreter's answer for its own values every round, and the request
/// without its last value gets the reference backend's `Fix:` error. Negative
/// control: every round's expected answer differs from the round before, so a stale
/// value would fail.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_a_repeated_request_passes_its_own_scalar_values() {
    use vyre_cuda::backend::AnyBackend;
    let values = support::repeated_scalar_values();
    let (rounds, error) = support::repeated_scalar_requests(&AnyBackend::Cuda(backend()), &values);
    let expected = support::expected_scalar_rounds(&values);
    assert_eq!(rounds, expected);
    for pair in expected.windows(2) {
        assert_ne!(pair[0], pair[1], "negative control: the rounds differ");
    }
    let (_, on_the_reference) =
        support::repeated_scalar_requests(&AnyBackend::reference(), &values);
    assert_eq!(error, on_the_reference);
}

/// Locks out workgroup memory past 48 KiB that the device never gets: a launch
/// that passes no dynamic bytes (the kernel faults, or reads and writes past a
/// zero-byte pool), a function never opted in past 48 KiB (the launch fails), a
/// graph kernel node captured or updated with `sharedMemBytes: 0`, and a kernel of
/// a batch module whose pool symbol or size is another kernel's.
/// `support::wide_shared::program` (100 KiB of `u32`s and 512 bytes of `u64`s in
/// one workgroup, every word read by another thread than the one that wrote it,
/// plus a lowered workgroup reduction) over 3 workgroups matches the host's answer
/// and the reference interpreter byte for byte: as a program dispatch, a compiled
/// kernel submitted and waited for, a `compile_batch` kernel beside a static one,
/// and a graph replayed, then replayed again after `set_workgroups` moved its
/// launch node to 2 workgroups (a node update through
/// `cuGraphExecKernelNodeSetParams`). Negative control: the host's answer for other
/// input differs.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_workgroup_memory_of_100_kib_matches_the_reference_eagerly_submitted_and_replayed() {
    use support::wide_shared;
    let gpu = backend();
    let groups = 3u32;
    let config = DispatchConfig::linear(groups);
    let source = wide_shared::source(groups);
    let (dst, totals) = wide_shared::expected(&source);
    let expected = vec![bytes(&dst), bytes(&totals)];
    let inputs = vec![
        bytes(&source),
        vec![0; 4 * source.len()],
        vec![0; 4 * groups as usize],
    ];
    let program = wide_shared::program();
    assert_eq!(
        support::reference(&program, &inputs, &config),
        expected,
        "the reference"
    );
    let host: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
    let eager = support::run_host(&gpu, &program, &host, &config).expect("eager");
    assert_eq!(eager.into_vecs(), expected, "a program dispatch");

    let kernel = gpu.compile(&program, &config).expect("compile");
    let bindings = support::host_bindings(&inputs);
    let submitted = gpu
        .submit(Dispatch::new(&kernel, &bindings).config(&config))
        .expect("submit")
        .wait()
        .expect("wait");
    assert_eq!(submitted.outputs.into_vecs(), expected, "submitted");

    let small = support::elementwise("small", 64, |v| v + 1u32);
    let batch = gpu
        .compile_batch(&[program.clone(), small], &config)
        .expect("batch");
    let batched = gpu
        .run(Dispatch::new(&batch[0], &bindings).config(&config))
        .expect("batch kernel");
    assert_eq!(batched.outputs.into_vecs(), expected, "a batch kernel");

    let buffers = support::buffer_copies(&gpu, &inputs);
    let none = config.with_readback(ReadbackPolicy::None);
    let mut slots = None;
    let mut graph = gpu
        .record(|rec| {
            let step =
                rec.dispatch(Dispatch::new(&kernel, &support::bindings(&buffers)).config(&none))?;
            let dst = rec.read_back(&buffers[1], 0, 4 * source.len() as u64)?;
            let totals = rec.read_back(&buffers[2], 0, 4 * u64::from(groups))?;
            slots = Some((step, dst, totals));
            Ok(())
        })
        .expect("record");
    let (step, dst_slot, totals_slot) = slots.expect("recorded");
    for replay in 0..2 {
        graph.replay().expect("replay");
        let got = vec![
            graph.output(dst_slot).expect("dst").to_vec(),
            graph.output(totals_slot).expect("totals").to_vec(),
        ];
        assert_eq!(got, expected, "graph replay {replay}");
    }
    graph
        .set_workgroups(step, [2, 1, 1])
        .expect("set_workgroups");
    graph.replay().expect("replay at 2 workgroups");
    let two = 2 * wide_shared::TABLE_WORDS as usize;
    let (dst_two, totals_two) = wide_shared::expected(&source[..two]);
    let got = words(graph.output(dst_slot).expect("dst"));
    assert_eq!(got[..two], dst_two[..], "graph replay at 2 workgroups");
    assert_eq!(
        words(graph.output(totals_slot).expect("totals"))[..2],
        totals_two[..]
    );

    let mut changed = source.clone();
    changed[0] ^= 1;
    assert_ne!(
        bytes(&wide_shared::expected(&changed).0),
        expected[0],
        "negative control"
    );
}
