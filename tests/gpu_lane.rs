//! GPU tests of persistent lanes (`vyre_cuda::backend::Lane`). Ignored by default; run
//! on the GPU machine with `bash .gpu/run.sh gpu_lane`. Every result is checked
//! against the reference interpreter, an eager dispatch of the same request or a
//! hand-computed value. Each test arms a watchdog: a lane that hangs ends the process
//! with a line saying what hung. Run them one at a time (`--test-threads=1`): under
//! lazy module loading a lane of one test makes the module loads of another running
//! beside it `Fix:` errors (a load beside a lane may wait for it forever).

mod support;

use std::time::Duration;

use support::lane::{increment, store_one, triple};
use support::{
    backend, bindings, buffer_copies, fixture_inputs, reference, watchdog, words, U32Buffer,
};
use vyre_cuda::backend::{
    AnyBackend, BackendError, Binding, CudaBackend, DeviceBuffer, Dispatch, Kernel, Lane,
    LaneOptions, Timing, WaitMode,
};
use vyre_cuda::fixtures::{host_cost_fixture, host_cost_fixture_expected};
use vyre_cuda::ir::*;
use vyre_cuda::{ByteRange, DispatchConfig, ReadbackPolicy};

/// Workgroups of [16, 2, 1] exchanging values through workgroup memory around a
/// barrier, numbering themselves with workgroup ids and counts on every axis, and
/// counting their runs in `acc` (so fixpoint iterations show).
fn grid_program() -> Program {
    Program::builder([16, 2, 1])
        .entry_op_id("lane_grid")
        .buffer(
            "out",
            0,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "acc",
            1,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "w",
            2,
            Access::Workgroup,
            ElemType::U32,
            BufferCount::Static(32),
        )
        .body(|b| {
            let local = b.let_(
                "local",
                Expr::local_id(Axis::Y) * 16u32 + Expr::local_id(Axis::X),
            );
            let group = b.let_(
                "group",
                (Expr::workgroup_id(Axis::Z) * Expr::workgroup_count(Axis::Y)
                    + Expr::workgroup_id(Axis::Y))
                    * Expr::workgroup_count(Axis::X)
                    + Expr::workgroup_id(Axis::X),
            );
            b.store("w", local.clone(), group.clone() * 100u32 + local.clone());
            b.barrier();
            let neighbour = b.let_("neighbour", Expr::load("w", (local.clone() + 1u32) % 32u32));
            let index = b.let_("index", group * 32u32 + local);
            b.if_(index.clone().less_than(Expr::length("out")), |b| {
                let extra =
                    Expr::workgroup_count(Axis::Z) * 7u32 + Expr::workgroup_count(Axis::Y) * 3u32;
                b.store("out", index.clone(), neighbour.clone() + extra);
                b.store(
                    "acc",
                    index.clone(),
                    Expr::load("acc", index.clone()) + 1u32,
                );
            });
        })
        .build()
}

/// One thread: `x[0]` through `iterations` steps of an LCG (slow on purpose: its
/// dispatch is still running when the next request is submitted).
fn slow_writer(iterations: u32) -> Program {
    Program::builder([1, 1, 1])
        .entry_op_id("lane_slow_writer")
        .buffer(
            "x",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(1),
        )
        .body(|b| {
            let acc = b.let_mut("acc", Expr::load("x", 0u32));
            b.loop_("j", 0u32, iterations, |b, _| {
                b.assign("acc", acc.clone() * 1_664_525u32 + 1_013_904_223u32);
            });
            b.store("x", 0u32, acc.clone());
        })
        .build()
}

/// One thread: `y[0] = x[0]`.
fn copy_word() -> Program {
    Program::builder([1, 1, 1])
        .entry_op_id("lane_copy_word")
        .buffer(
            "x",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Static(1),
        )
        .buffer(
            "y",
            1,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Static(1),
        )
        .body(|b| {
            b.store("y", 0u32, Expr::load("x", 0u32));
        })
        .build()
}

fn lcg(x: u32, iterations: u32) -> u32 {
    (0..iterations).fold(x, |acc, _| {
        acc.wrapping_mul(1_664_525).wrapping_add(1_013_904_223)
    })
}

fn compile_all(gpu: &CudaBackend, programs: &[Program]) -> Vec<Kernel> {
    programs
        .iter()
        .map(|program| gpu.compile(program, &DispatchConfig::linear(1)).unwrap())
        .collect()
}

fn lane_of(gpu: &CudaBackend, kernels: &[Kernel], options: LaneOptions) -> Lane {
    let refs: Vec<&Kernel> = kernels.iter().collect();
    gpu.lane(&refs, options)
        .unwrap_or_else(|e| panic!("build a lane: {e}"))
}

/// Locks out a broken thin slice (record → doorbell → body → readback → completion):
/// the measurement fixture (one thread, nine buffers, eight outputs) through a lane of
/// one kernel and one block gives the hand-computed sum and the reference's bytes,
/// over device buffers and over host bindings, 200 times in a row (the record cache
/// and the "same record" path included), with the kernel's stamps split into phases
/// that add up to them, and no event window.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_lane_thin_slice_matches_reference() {
    let _watchdog = watchdog(120, "the lane thin slice");
    let gpu = backend();
    let program = host_cost_fixture(9, 64);
    let config = DispatchConfig::linear(1);
    let kernel = gpu.compile(&program, &config).unwrap();
    let lane = lane_of(&gpu, std::slice::from_ref(&kernel), LaneOptions::new());
    for x in [5u32, 6, 7] {
        let inputs = fixture_inputs(&program, x);
        let expected = reference(&program, &inputs, &config);
        let buffers = buffer_copies(&gpu, &inputs);
        let bound = bindings(&buffers);
        for round in 0..200 {
            let finished = lane
                .run(Dispatch::new(&kernel, &bound).config(&config))
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
            assert_eq!(finished.outputs, expected, "x {x}, round {round}");
            assert_eq!(
                finished.outputs.read::<u32>("out").unwrap()[0],
                host_cost_fixture_expected(x, 64)
            );
            let timings = finished.timings;
            assert!(timings.kernel_stamps_ns > 0, "{timings:?}");
            assert_eq!(timings.event_window_ns, None);
            assert!(timings.enqueue_ns <= timings.wall_ns && timings.wait_ns <= timings.wall_ns);
            let stamps = timings
                .lane_stamps
                .expect("a lane request has phase stamps");
            assert_eq!(
                stamps.setup_ns + stamps.workgroups_ns + stamps.readback_ns,
                timings.kernel_stamps_ns,
                "{stamps:?}"
            );
        }
        let host: Vec<Binding> = inputs.iter().map(|v| Binding::Host(v)).collect();
        let finished = lane
            .run(Dispatch::new(&kernel, &host).config(&config))
            .unwrap();
        assert_eq!(finished.outputs, expected, "host bindings, x {x}");
    }
}

/// Locks out a lane that runs the wrong body, or reorders requests of one lane: two
/// kernels of one lane, alternated, each give their own result; a chain submitted
/// back to back without `after` (the second reads what the first writes) gives the
/// composed result because a lane serves its requests in order; a program request
/// finds its kernel in the lane; a kernel the lane was not built with (compiled
/// before the lane: a module load beside a running lane may wait for it) is a `Fix:`
/// error. Each step prints a line and the watchdog (well under a 60 s outer timeout)
/// names the step that hung.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_lane_serves_several_kernels_in_order() {
    let step = |what: &'static str| {
        eprintln!("gpu_lane_serves_several_kernels_in_order: {what}");
        watchdog(20, what)
    };
    let guard = step("compiling three kernels and building a lane of two");
    let gpu = backend();
    let kernels = compile_all(&gpu, &[increment(), triple()]);
    let other = gpu
        .compile(&copy_word(), &DispatchConfig::linear(1))
        .unwrap();
    let lane = lane_of(&gpu, &kernels, LaneOptions::new());
    drop(guard);
    let guard = step("50 alternating requests");
    let n = 1000u32;
    let x = gpu.buffer_from(&(0..n).collect::<Vec<u32>>()).unwrap();
    let y = gpu.buffer(4 * n as u64).unwrap();
    let z = gpu.buffer(4 * n as u64).unwrap();
    let groups = [n.div_ceil(64), 1, 1];
    for round in 0..50u32 {
        let which = (round % 2) as usize;
        let bound = [Binding::from(&x), Binding::from(&y)];
        let finished = lane
            .run(Dispatch::new(&kernels[which], &bound).workgroups(groups))
            .unwrap();
        let got = finished.outputs.read::<u32>("y").unwrap();
        let expected: Vec<u32> = (0..n)
            .map(|i| if which == 0 { i + 1 } else { i * 3 })
            .collect();
        assert_eq!(got, expected, "round {round}");
    }
    drop(guard);
    let guard = step("a chain of two submitted requests");
    let first = [Binding::from(&x), Binding::from(&y)];
    let second = [Binding::from(&y), Binding::from(&z)];
    let a = lane
        .submit(Dispatch::new(&kernels[0], &first).workgroups(groups))
        .unwrap();
    let b = lane
        .submit(Dispatch::new(&kernels[1], &second).workgroups(groups))
        .unwrap();
    let chained = b.wait().unwrap().outputs.read::<u32>("y").unwrap();
    a.wait().unwrap();
    assert_eq!(chained, (0..n).map(|i| (i + 1) * 3).collect::<Vec<u32>>());
    drop(guard);
    let guard = step("a program request (a cache hit)");
    let program = increment();
    let by_program = lane
        .run(Dispatch::program(&program, &first).workgroups(groups))
        .unwrap();
    assert_eq!(by_program.outputs.read::<u32>("y").unwrap()[7], 8);
    drop(guard);
    let guard = step("a kernel the lane was not built with");
    let words = [Binding::from(&x), Binding::Zeroed(4)];
    let error = lane.run(Dispatch::new(&other, &words)).unwrap_err();
    assert!(
        error.to_string().starts_with("Fix:")
            && error.to_string().contains("is not one of this lane")
    );
    drop(guard);
    let _guard = step("stopping the lane");
    lane.stop().unwrap();
}

/// Locks out grid semantics that differ from a launch: 12 workgroups of [16, 2, 1]
/// on a 3-D grid (and 7 on a grid along x alone, whose ids the server takes without
/// a division), exchanging values through workgroup memory around a barrier,
/// through lanes of 1 and 4 blocks (each block runs several workgroups in turn, its
/// workgroup memory zeroed for each), with 1 and 3 fixpoint iterations (a lane-wide
/// barrier between them), give the reference interpreter's bytes.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_lane_grids_larger_than_the_lane_match_reference() {
    let _watchdog = watchdog(120, "lane grids");
    let gpu = backend();
    let program = grid_program();
    let kernel = gpu.compile(&program, &DispatchConfig::linear(1)).unwrap();
    for blocks in [1u32, 4] {
        let lane = lane_of(
            &gpu,
            std::slice::from_ref(&kernel),
            LaneOptions::new().blocks(blocks),
        );
        for (grid, iterations) in [
            ([3u32, 2, 2], 1u32),
            ([5, 1, 3], 3),
            ([1, 1, 1], 2),
            ([7, 1, 1], 1),
        ] {
            let groups = grid.iter().product::<u32>();
            let elements = 32 * groups as usize;
            let acc: Vec<u32> = (0..elements as u32).map(|i| i * 7).collect();
            let inputs = vec![vec![0u8; 4 * elements], support::bytes(&acc)];
            let config = DispatchConfig::new(grid).with_fixpoint_iterations(iterations);
            let expected = reference(&program, &inputs, &config);
            let buffers = buffer_copies(&gpu, &inputs);
            let bound = bindings(&buffers);
            let got = lane
                .run(Dispatch::new(&kernel, &bound).config(&config))
                .unwrap_or_else(|e| panic!("blocks {blocks}, grid {grid:?}: {e}"));
            assert_eq!(
                got.outputs, expected,
                "blocks {blocks}, grid {grid:?}, {iterations} iterations"
            );
            assert_eq!(gpu.read::<u32>(&buffers[1]).unwrap(), words(&expected[1]));
        }
    }
}

/// Locks out a lane request whose write-only outputs keep an earlier request's bytes,
/// or whose readback returns another request's bytes: a write-only device buffer
/// filled with 0xEE comes back zeroed where the kernel did not write; two kernels
/// with outputs of different lengths, alternated, each get exactly their own bytes
/// (the area's ticket check and per-slot areas); unaligned readback ranges and
/// `run_into` slices prefilled with junk get the eager dispatch's bytes.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_lane_outputs_start_zeroed_and_never_cross_requests() {
    let _watchdog = watchdog(120, "lane isolation");
    let gpu = backend();
    let evens = Program::builder([64, 1, 1])
        .entry_op_id("lane_evens")
        .buffer(
            "x",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "y",
            1,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            let i = b.let_("i", Expr::global_id(Axis::X));
            b.if_(
                i.clone()
                    .less_than(Expr::length("y"))
                    .and((i.clone() % 2u32).equals(0u32)),
                |b| {
                    b.store("y", i.clone(), Expr::load("x", i.clone()) + 1u32);
                },
            );
        })
        .build();
    let kernels = compile_all(&gpu, &[evens, triple()]);
    let lane = lane_of(&gpu, &kernels, LaneOptions::new().slots(2));
    let x = gpu.buffer_from(&(0..256u32).collect::<Vec<_>>()).unwrap();
    let y = gpu.buffer_from(&[0xEEEE_EEEEu32; 256]).unwrap();
    let short_y = gpu.buffer(16).unwrap();
    for round in 0..40 {
        let bound = [Binding::from(&x), Binding::from(&y)];
        let got = lane
            .run(Dispatch::new(&kernels[0], &bound).workgroups([4, 1, 1]))
            .unwrap()
            .outputs
            .read::<u32>("y")
            .unwrap();
        let expected: Vec<u32> = (0..256)
            .map(|i| if i % 2 == 0 { i + 1 } else { 0 })
            .collect();
        assert_eq!(got, expected, "round {round}");
        gpu.upload(&y, &[0xEEEE_EEEEu32; 256]).unwrap();
        let short = [Binding::from(&x), Binding::from(&short_y)];
        let outputs = lane
            .run(Dispatch::new(&kernels[1], &short).workgroups([1, 1, 1]))
            .unwrap()
            .outputs;
        assert_eq!(outputs.len(), 1);
        assert_eq!(
            outputs.read::<u32>("y").unwrap(),
            [0, 3, 6, 9],
            "round {round}"
        );
    }
    let ranges = ReadbackPolicy::Ranges(smallvec::smallvec![
        ByteRange {
            binding: 1,
            offset: 5,
            len: 11
        },
        ByteRange {
            binding: 1,
            offset: 12,
            len: 4
        },
        ByteRange {
            binding: 1,
            offset: 0,
            len: 1024
        },
    ]);
    let bound = [Binding::from(&x), Binding::from(&y)];
    let request = Dispatch::new(&kernels[0], &bound)
        .workgroups([4, 1, 1])
        .readback(&ranges);
    let eager = gpu.run(request).unwrap().outputs.into_vecs();
    let mut junk: Vec<Vec<u8>> = eager.iter().map(|v| vec![0xAB; v.len()]).collect();
    let mut slices: Vec<&mut [u8]> = junk.iter_mut().map(|v| v.as_mut_slice()).collect();
    lane.run_into(request, &mut slices).unwrap();
    assert_eq!(junk, eager);
}

/// Locks out host, zeroed and pinned bindings that a lane stages differently from a
/// launch (a host input not copied, a transient not zeroed, a pinned buffer read
/// stale): the same request with each kind of binding gives the eager dispatch's
/// bytes, for inputs of lengths that are not multiples of 16.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_lane_host_zeroed_and_pinned_bindings_match_a_launch() {
    let _watchdog = watchdog(120, "lane bindings");
    let gpu = backend();
    let program = Program::builder([32, 1, 1])
        .entry_op_id("lane_bytes")
        .buffer(
            "text",
            0,
            Access::ReadOnly,
            ElemType::U8,
            BufferCount::Runtime,
        )
        .buffer(
            "scratch",
            1,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "sums",
            2,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            let i = b.let_("i", Expr::global_id(Axis::X));
            b.if_(i.clone().less_than(Expr::length("sums")), |b| {
                let byte = Expr::load("text", i.clone()).cast(ScalarType::U32);
                let old = Expr::load("scratch", i.clone());
                b.store("scratch", i.clone(), old.clone() + byte.clone());
                b.store("sums", i.clone(), old * 1000u32 + byte);
            });
        })
        .build();
    let kernel = gpu.compile(&program, &DispatchConfig::linear(2)).unwrap();
    let lane = lane_of(&gpu, std::slice::from_ref(&kernel), LaneOptions::new());
    for len in [1usize, 13, 17, 40, 63] {
        let text: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
        let scratch: Vec<u32> = (0..len as u32).map(|i| i * 5).collect();
        let mut pinned = gpu.pinned_buffer(len).unwrap();
        pinned.as_mut_slice().unwrap().copy_from_slice(&text);
        let cases: [[Binding; 3]; 3] = [
            [
                Binding::Host(&text),
                Binding::host(&scratch),
                Binding::zeroed::<u32>(len as u64),
            ],
            [
                Binding::from(&pinned),
                Binding::host(&scratch),
                Binding::Zeroed(4 * len as u64),
            ],
            [
                Binding::Host(&text),
                Binding::zeroed::<u32>(len as u64),
                Binding::host(&scratch),
            ],
        ];
        for (index, bound) in cases.iter().enumerate() {
            let request = Dispatch::new(&kernel, bound).workgroups([2, 1, 1]);
            let eager = gpu.run(request).unwrap().outputs;
            let got = lane.run(request).unwrap().outputs;
            assert_eq!(got, eager, "length {len}, case {index}");
        }
    }
}

/// Locks out a lane request and an eager dispatch racing on shared memory (the
/// lane's kernel never ends, so the order must be kept on the host): a lane request
/// reading what a pending eager dispatch writes sees its result; an eager dispatch
/// reading what a pending lane request writes sees its result; `after` in both
/// directions waits. The writer runs long enough (two million LCG steps) that an
/// unordered reader would see the old value.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_lane_orders_against_eager_dispatches() {
    let _watchdog = watchdog(180, "lane ordering");
    let gpu = backend();
    const STEPS: u32 = 2_000_000;
    let kernels = compile_all(&gpu, &[slow_writer(STEPS), copy_word()]);
    let lane = lane_of(&gpu, &kernels, LaneOptions::new());
    for round in 0..3u32 {
        // Eager writer pending, lane reader.
        let x = gpu.buffer_from(&[round]).unwrap();
        let write = [Binding::from(&x)];
        let pending = gpu.submit(Dispatch::new(&kernels[0], &write)).unwrap();
        let bound = [Binding::from(&x), Binding::Zeroed(4)];
        let seen = lane.run(Dispatch::new(&kernels[1], &bound)).unwrap();
        assert_eq!(seen.outputs.read::<u32>("y").unwrap(), [lcg(round, STEPS)]);
        pending.wait().unwrap();

        // Lane writer pending, eager reader.
        let x = gpu.buffer_from(&[round + 10]).unwrap();
        let write = [Binding::from(&x)];
        let pending = lane.submit(Dispatch::new(&kernels[0], &write)).unwrap();
        let bound = [Binding::from(&x), Binding::Zeroed(4)];
        let seen = gpu.run(Dispatch::new(&kernels[1], &bound)).unwrap();
        assert_eq!(
            seen.outputs.read::<u32>("y").unwrap(),
            [lcg(round + 10, STEPS)]
        );
        pending.wait().unwrap();

        // `after` both ways, over the same memory (the book and the predecessor agree).
        let x = gpu.buffer_from(&[round + 20]).unwrap();
        let write = [Binding::from(&x)];
        let eager = gpu.submit(Dispatch::new(&kernels[0], &write)).unwrap();
        let bound = [Binding::from(&x), Binding::Zeroed(4)];
        let seen = lane
            .run(Dispatch::new(&kernels[1], &bound).after(&eager))
            .unwrap();
        assert_eq!(
            seen.outputs.read::<u32>("y").unwrap(),
            [lcg(round + 20, STEPS)]
        );
        eager.wait().unwrap();
        let on_lane = lane.submit(Dispatch::new(&kernels[0], &write)).unwrap();
        let seen = gpu
            .run(Dispatch::new(&kernels[1], &bound).after(&on_lane))
            .unwrap();
        assert_eq!(
            seen.outputs.read::<u32>("y").unwrap(),
            [lcg(lcg(round + 20, STEPS), STEPS)]
        );
        on_lane.wait().unwrap();
    }
}

/// Locks out a cooperative dispatch that hangs beside a running lane: a grid sized
/// for the whole device would wait for the lane's multiprocessor forever (the lane's
/// block may hold it whole), so beside a lane such a grid is `GridTooLargeForGridSync`
/// and one without the lane's multiprocessor runs, exactly as on the reference
/// (`support::lane::assert_grid_sync_beside_a_lane_leaves_its_multiprocessors_out`;
/// its negative control: the whole device's grid runs once the lane is dropped).
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_grid_sync_beside_a_lane_leaves_its_multiprocessors_out() {
    let _watchdog = watchdog(120, "grid sync beside a lane");
    let gpu = backend();
    let multiprocessors = gpu.caps().sm_count;
    support::lane::assert_grid_sync_beside_a_lane_leaves_its_multiprocessors_out(
        &AnyBackend::Cuda(gpu),
        multiprocessors,
    );
}

/// Locks out a dispatch graph that refuses a grid-sync step, replays it over
/// another replay's barrier word or an old scalar, or replays a grid that a lane
/// started after the recording leaves no room for (the cooperative launch would
/// wait for the lane forever), exactly as on the reference
/// (`support::lane::assert_grid_sync_graphs_replay_and_leave_a_lanes_multiprocessors_out`;
/// its negative control: the whole device's grid replays once the lane is dropped).
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_graphs_replay_grid_sync_steps_and_leave_a_lanes_multiprocessors_out() {
    let _watchdog = watchdog(120, "grid-sync graph beside a lane");
    let gpu = backend();
    let multiprocessors = gpu.caps().sm_count;
    support::lane::assert_grid_sync_graphs_replay_and_leave_a_lanes_multiprocessors_out(
        &AnyBackend::Cuda(gpu),
        multiprocessors,
    );
}

/// Locks out a lane that blocks or corrupts the rest of the device: while a lane runs,
/// eager dispatches (blocking and submitted) and graph replays on other streams keep
/// giving their results, interleaved with lane requests, 300 rounds; a buffer dropped
/// while the lane runs is released only once the lane stopped (freeing waits for an
/// idle device), and then it is.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_lane_coexists_with_eager_dispatches_and_graph_replays() {
    let _watchdog = watchdog(240, "lane coexistence");
    let gpu = backend();
    let kernels = compile_all(&gpu, &[increment(), triple()]);
    let n = 256u32;
    let x = gpu.buffer_from(&vec![0u32; n as usize]).unwrap();
    let graph_out = gpu.buffer(4 * n as u64).unwrap();
    let eager_out = gpu.buffer(4 * n as u64).unwrap();
    let lane_out = gpu.buffer(4 * n as u64).unwrap();
    let groups = [n / 64, 1, 1];
    let graph_bindings = [Binding::from(&x), Binding::from(&graph_out)];
    let mut graph = gpu
        .record(|rec| {
            rec.dispatch(Dispatch::new(&kernels[1], &graph_bindings).workgroups(groups))?;
            Ok(())
        })
        .unwrap();
    // Warm every path before the lane (allocations and module loads may wait for an
    // idle device; see the lane docs).
    graph.replay().unwrap();
    let eager_bindings = [Binding::from(&x), Binding::from(&eager_out)];
    gpu.run(Dispatch::new(&kernels[0], &eager_bindings).workgroups(groups))
        .unwrap();
    let lane = lane_of(&gpu, &kernels, LaneOptions::new());
    let lane_bindings = [Binding::from(&x), Binding::from(&lane_out)];
    for round in 0..300u32 {
        let values: Vec<u32> = (0..n).map(|i| i * 3 + round).collect();
        gpu.upload(&x, &values).unwrap();
        let lane_got = lane
            .run(Dispatch::new(&kernels[1], &lane_bindings).workgroups(groups))
            .unwrap();
        let eager_got = gpu
            .run(Dispatch::new(&kernels[0], &eager_bindings).workgroups(groups))
            .unwrap();
        let pending = gpu
            .submit(Dispatch::new(&kernels[0], &eager_bindings).workgroups(groups))
            .unwrap();
        graph.replay().unwrap();
        let tripled: Vec<u32> = values.iter().map(|v| v * 3).collect();
        let incremented: Vec<u32> = values.iter().map(|v| v + 1).collect();
        assert_eq!(
            lane_got.outputs.read::<u32>("y").unwrap(),
            tripled,
            "round {round}"
        );
        assert_eq!(eager_got.outputs.read::<u32>("y").unwrap(), incremented);
        assert_eq!(
            pending.wait().unwrap().outputs.read::<u32>("y").unwrap(),
            incremented
        );
        assert_eq!(
            gpu.read::<u32>(&graph_out).unwrap(),
            tripled,
            "round {round}"
        );
    }
    let before = gpu.deferred_releases().unwrap();
    drop(gpu.buffer(1 << 20).unwrap());
    assert_eq!(
        gpu.deferred_releases().unwrap(),
        before + 1,
        "the free waits for the lane"
    );
    lane.stop().unwrap();
    assert_eq!(
        gpu.deferred_releases().unwrap(),
        0,
        "made once the lane stopped"
    );
    // The device is idle again: a fresh lane serves at once.
    let lane = lane_of(&gpu, &kernels, LaneOptions::new());
    let got = lane
        .run(Dispatch::new(&kernels[0], &lane_bindings).workgroups(groups))
        .unwrap();
    assert_eq!(got.outputs.read::<u32>("y").unwrap()[0], 299 + 1);
}

/// Locks out a lane that cannot be stopped, or stops with work lost: dropping a lane
/// stops its kernel (a new lane of the same kernels serves at once), `stop` reports
/// `Ok`, and `stop` with a request still pending is a `Fix:` error after which the
/// pending request still completes (it holds the lane) and the lane stops with it.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_lane_stops_on_drop() {
    let _watchdog = watchdog(120, "lane stop");
    let gpu = backend();
    let kernels = compile_all(&gpu, &[increment()]);
    let x = gpu.buffer_from(&[41u32; 64]).unwrap();
    let bound = [Binding::from(&x), Binding::Zeroed(256)];
    let request = Dispatch::new(&kernels[0], &bound);
    for _ in 0..5 {
        let lane = lane_of(&gpu, &kernels, LaneOptions::new());
        assert_eq!(
            lane.run(request).unwrap().outputs.read::<u32>("y").unwrap()[0],
            42
        );
        drop(lane);
    }
    let lane = lane_of(&gpu, &kernels, LaneOptions::new());
    lane.run(request).unwrap();
    lane.stop().unwrap();
    let lane = lane_of(&gpu, &kernels, LaneOptions::new());
    let pending = lane.submit(request).unwrap();
    let error = lane.stop().unwrap_err();
    assert!(error.to_string().starts_with("Fix:") && error.to_string().contains("pending"));
    assert_eq!(
        pending.wait().unwrap().outputs.read::<u32>("y").unwrap()[0],
        42
    );
    assert_eq!(gpu.deferred_releases().unwrap(), 0);
}

/// Locks out bad input that a lane accepts, panics on or hangs on: a kernel of another
/// backend, a buffer of another backend, a grid the lane cannot number, a timeout of
/// zero, more blocks than the device holds, more requests pending than slots (the
/// submission waits the lane's timeout for a slot, then refuses), more readback than
/// the area, a kernel the lane was not built with, a host-mapped buffer (the lane does
/// not order its stores into host memory with the delivery, and `mapped_bytes` could
/// read it while a request writes). Each is an `Err` starting `Fix:`; the lane still
/// serves afterwards.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_lane_bad_inputs_are_fix_errors() {
    let _watchdog = watchdog(120, "lane bad inputs");
    let gpu = backend();
    let other = backend();
    let kernels = compile_all(&gpu, &[increment()]);
    let foreign_kernel = other
        .compile(&increment(), &DispatchConfig::linear(1))
        .unwrap();
    let fix = |result: Result<(), BackendError>, expected: &str| {
        let message = result.expect_err("a refusal").to_string();
        assert!(
            message.starts_with("Fix:") && message.contains(expected),
            "{message}"
        );
    };
    fix(
        gpu.lane(&[&foreign_kernel], LaneOptions::new()).map(drop),
        "another backend",
    );
    fix(
        gpu.lane(&[&kernels[0]], LaneOptions::new().timeout(Duration::ZERO))
            .map(drop),
        "timeout",
    );
    let wide = gpu
        .compile(&store_one([1024, 1, 1], false), &DispatchConfig::linear(1))
        .unwrap();
    fix(
        gpu.lane(&[&wide], LaneOptions::new().blocks(1024))
            .map(drop),
        "at most",
    );
    // A short timeout: the third submission below waits that long for a slot.
    let lane = lane_of(
        &gpu,
        &kernels,
        LaneOptions::new()
            .slots(2)
            .result_bytes(256)
            .timeout(Duration::from_millis(300)),
    );
    let x = gpu.buffer_from(&[1u32; 64]).unwrap();
    let foreign_buffer = other.buffer(256).unwrap();
    let none = ReadbackPolicy::None;
    let foreign = [Binding::from(&x), Binding::from(&foreign_buffer)];
    fix(
        lane.run(Dispatch::new(&kernels[0], &foreign).readback(&none))
            .map(drop),
        "another backend",
    );
    let bound = [Binding::from(&x), Binding::Zeroed(256)];
    fix(
        lane.run(
            Dispatch::new(&kernels[0], &bound)
                .workgroups([65_535, 65_535, 2])
                .readback(&none),
        )
        .map(drop),
        "32 bits",
    );
    fix(
        lane.run(Dispatch::new(&kernels[0], &bound)).map(drop),
        "result_bytes",
    );
    fix(
        lane.run(Dispatch::new(&foreign_kernel, &bound).readback(&none))
            .map(drop),
        "another backend",
    );
    let mapped = gpu.host_mapped_buffer(256).unwrap();
    let onto_mapped = [Binding::from(&x), Binding::from(&mapped)];
    fix(
        lane.run(Dispatch::new(&kernels[0], &onto_mapped).readback(&none))
            .map(drop),
        "host-mapped",
    );
    let first = lane
        .submit(Dispatch::new(&kernels[0], &bound).readback(&none))
        .unwrap();
    let second = lane
        .submit(Dispatch::new(&kernels[0], &bound).readback(&none))
        .unwrap();
    fix(
        lane.submit(Dispatch::new(&kernels[0], &bound).readback(&none))
            .map(drop),
        "whose request was not delivered",
    );
    first.wait().unwrap();
    second.wait().unwrap();
    let y = gpu.buffer(256).unwrap();
    let fine = [Binding::from(&x), Binding::from(&y)];
    lane.run(Dispatch::new(&kernels[0], &fine).readback(&none))
        .unwrap();
    assert_eq!(gpu.read::<u32>(&y).unwrap()[63], 2);
}

/// Locks out a CUDA lane that answers differently from the reference lane (code
/// written against `AnyLane` would see other bytes or other errors without a GPU):
/// the same requests give the same outputs, and the same refusals the same text.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_lane_answers_exactly_as_the_reference_lane() {
    let _watchdog = watchdog(120, "lane parity");
    let backends = [AnyBackend::Cuda(backend()), AnyBackend::reference()];
    let answers: Vec<Vec<String>> = backends
        .iter()
        .map(|any| {
            let config = DispatchConfig::linear(2);
            let increment = any.compile(&increment(), &config).unwrap();
            let triple = any.compile(&triple(), &config).unwrap();
            let lane = any
                .lane(
                    &[&increment],
                    LaneOptions::new().result_bytes(512).staging_bytes(512),
                )
                .unwrap();
            let x: Vec<u32> = (0..100).collect();
            let mut seen = Vec::new();
            let mut record = |result: Result<Vec<Vec<u8>>, BackendError>| {
                seen.push(match result {
                    Ok(outputs) => format!("{outputs:?}"),
                    Err(error) => error.to_string(),
                })
            };
            let host = [Binding::host(&x), Binding::zeroed::<u32>(100)];
            record(
                lane.run(Dispatch::new(&increment, &host).config(&config))
                    .map(|f| f.outputs.into_vecs()),
            );
            record(
                lane.run(Dispatch::new(&triple, &host).config(&config))
                    .map(|f| f.outputs.into_vecs()),
            );
            let long: Vec<u32> = (0..200).collect();
            let too_long = [Binding::host(&long), Binding::zeroed::<u32>(200)];
            let none = ReadbackPolicy::None;
            record(
                lane.run(
                    Dispatch::new(&increment, &too_long)
                        .config(&config)
                        .readback(&none),
                )
                .map(|f| f.outputs.into_vecs()),
            );
            record(
                lane.run(Dispatch::new(&increment, &host).workgroups([65_535, 65_535, 2]))
                    .map(|f| f.outputs.into_vecs()),
            );
            record(
                lane.submit(Dispatch::new(&increment, &host).config(&config))
                    .and_then(|p| p.wait())
                    .map(|f| f.outputs.into_vecs()),
            );
            record(
                any.lane(&[&increment, &triple], LaneOptions::new().slots(0))
                    .map(|_| Vec::new()),
            );
            seen
        })
        .collect();
    assert_eq!(answers[0], answers[1]);
}

/// Locks out a lane request that the probe does not see or charges wrongly: with the
/// probe on, each `run` prints one line whose phases add up to its named total, whose
/// wall covers them, and which counts the request's bindings and workgroups; a
/// submission prints none (as for eager submissions).
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_lane_requests_print_probe_lines_that_add_up() {
    let _watchdog = watchdog(120, "lane probe");
    let gpu = backend();
    let program = host_cost_fixture(9, 64);
    let config = DispatchConfig::linear(1);
    let kernel = gpu.compile(&program, &config).unwrap();
    let lane = lane_of(&gpu, std::slice::from_ref(&kernel), LaneOptions::new());
    let buffers = buffer_copies(&gpu, &fixture_inputs(&program, 3));
    let bound = bindings(&buffers);
    let (_, lines) = {
        let _on = vyre_cuda::probe::override_enabled(Some(true));
        vyre_cuda::probe::capture_lines(|| {
            for _ in 0..20 {
                lane.run(Dispatch::new(&kernel, &bound).config(&config))
                    .unwrap();
            }
            lane.submit(Dispatch::new(&kernel, &bound).config(&config))
                .unwrap()
                .wait()
                .unwrap();
        })
    };
    assert_eq!(lines.len(), 20, "one line per run, none for the submission");
    for line in &lines {
        let record =
            vyre_cuda::probe::parse_line_checked(line).unwrap_or_else(|e| panic!("{e:?}: {line}"));
        assert_eq!(record.bindings, 9, "{line}");
        assert_eq!(record.grid_blocks, 1, "{line}");
        assert!(record.kernel_ns > 0, "{line}");
        assert!(record.named_host_ns() <= record.wall_ns, "{line}");
    }
}

/// Locks out a waiting mode that loses or misreads results, and a lane that cannot
/// be shared by threads: lanes waiting by spinning, spinning then yielding and
/// sleeping give the same outputs; four threads sharing one lane run 250 requests
/// each over their own buffers, every result checked.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_lane_wait_modes_and_threads_agree() {
    let _watchdog = watchdog(240, "lane wait modes and threads");
    let gpu = backend();
    let kernels = compile_all(&gpu, &[increment()]);
    for wait in [
        WaitMode::Spin,
        WaitMode::SpinThenYield(Duration::from_micros(20)),
        WaitMode::Sleep(Duration::from_micros(50)),
    ] {
        let lane = lane_of(&gpu, &kernels, LaneOptions::new().wait(wait));
        let x = gpu.buffer_from(&[9u32; 64]).unwrap();
        let bound = [Binding::from(&x), Binding::Zeroed(256)];
        for _ in 0..50 {
            let got = lane.run(Dispatch::new(&kernels[0], &bound)).unwrap();
            assert_eq!(
                got.outputs.read::<u32>("y").unwrap(),
                [10u32; 64],
                "{wait:?}"
            );
        }
    }
    let lane = lane_of(&gpu, &kernels, LaneOptions::new().slots(8));
    std::thread::scope(|scope| {
        for thread in 0..4u32 {
            let (gpu, lane, kernel) = (&gpu, &lane, &kernels[0]);
            scope.spawn(move || {
                let x = gpu.buffer(256).unwrap();
                let y = gpu.buffer(256).unwrap();
                for round in 0..250u32 {
                    let value = thread * 10_000 + round;
                    gpu.upload(&x, &[value; 64]).unwrap();
                    let bound = [Binding::from(&x), Binding::from(&y)];
                    let got = lane
                        .run(Dispatch::new(kernel, &bound).timing(Timing::KernelStamps))
                        .unwrap();
                    assert_eq!(got.outputs.read::<u32>("y").unwrap(), [value + 1; 64]);
                }
            });
        }
    });
}

/// Locks out a lane that hands a slot to a new request before its request was
/// delivered, or refuses a request because its slot is busy: lanes of 1 and 4 slots
/// (one at a time), each shared by twice as many threads, each thread running 500
/// requests with its own `k` (every record differs from the one before) over its own
/// buffers through `run`, a host input of its own through `run_into` and its own
/// buffers through `submit` and `wait`, every word checked. Before a slot waited for
/// its request's delivery, a waiter took the request out of its slot before waiting
/// and the slot counted free: with more threads than slots, ticket `n + slots` could
/// overwrite the doorbell of request `n` before the server read it (the server waits
/// for `n`'s forever: the lane's 10 s timeout), or its staging (`n` runs on another
/// thread's input: a wrong word), and a submitter that found the slot's request not yet
/// taken out got a `Fix: ... requests are pending` refusal (a panic here). The
/// expectations are held to the reference lane in `cargo test`
/// (`a_reference_lane_shared_by_more_threads_than_slots_gives_each_its_own_results`).
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_lane_shared_by_more_threads_than_slots_gives_each_its_own_results() {
    let _watchdog = watchdog(240, "a lane shared by more threads than slots");
    let gpu = AnyBackend::Cuda(backend());
    for slots in [1, 4] {
        support::lane::assert_threads_beyond_the_slots_get_their_own_results(&gpu, slots, 500);
    }
}

/// Locks out a lane that serves a request with an earlier request's scalar values (a
/// record without them, a "same record" or slot-cache shortcut that ignored them, a
/// body reading the wrong word of the record) or reads a scalar type wrongly: over
/// device buffers (so two requests' records differ in the value alone), `k` = 1, 2,
/// 1, 2, 1, 2, 1, 2, 2, 2, 1 through lanes of 1, 2 and 4 slots (two records new to their
/// slots, then alternation through the blocks' earlier copy, then the same record twice)
/// and four submitted back to back each give `src[i] + k` of their own `k`; a program with a
/// scalar of every type gives the reference interpreter's bytes for values at both
/// ends of each type; a request missing a value is refused with `run`'s `Fix:` text.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_lane_scalar_values_follow_each_request() {
    let _watchdog = watchdog(120, "lane scalar values");
    let gpu = backend();
    let any = AnyBackend::Cuda(gpu.clone());
    let config = DispatchConfig::linear(1);
    let plus_k = gpu.compile(&support::parity::plus_k(), &config).unwrap();
    let source: Vec<u32> = (0..64).map(|i| i * 1000).collect();
    let src = gpu.buffer_from(&source).unwrap();
    let dst = gpu.buffer(4 * 64).unwrap();
    let bound = [Binding::from(&src), Binding::from(&dst)];
    for slots in [1, 2, 4] {
        let lane = any
            .lane(&[&plus_k], LaneOptions::new().slots(slots))
            .unwrap();
        support::lane::assert_plus_k_follows_each_value(
            (&lane, &plus_k),
            (&bound, &source),
            &[1, 2, 1, 2, 1, 2, 1, 2, 2, 2, 1],
            slots as usize,
            &format!("{slots} slots"),
        );
        let missing = Dispatch::new(&plus_k, &bound)
            .config(&config)
            .scalar("k", 1u32);
        let refusal = gpu.run(missing).unwrap_err().to_string();
        assert!(refusal.starts_with("Fix:"), "{refusal}");
        assert_eq!(lane.run(missing).unwrap_err().to_string(), refusal);
    }

    let program = support::every_scalar_type();
    let typed = gpu.compile(&program, &config).unwrap();
    let lane = lane_of(&gpu, std::slice::from_ref(&typed), LaneOptions::new());
    let zeros = support::static_zeros(&program);
    let buffers = buffer_copies(&gpu, &zeros);
    let typed_bound = bindings(&buffers);
    let inputs: Vec<&[u8]> = zeros.iter().map(Vec::as_slice).collect();
    let options = vyre_cuda::reference::ReferenceOptions::default();
    let sets = support::lane::EVERY_SCALAR_VALUE_SETS;
    // The first set again after the others: back to a value the lane served before.
    for set in sets.into_iter().chain([sets[0]]) {
        let values = support::every_scalar_value(set);
        let (expected, _) =
            vyre_cuda::reference::run_with_scalars(&program, &inputs, &values, &config, &options)
                .unwrap();
        let request = Dispatch::new(&typed, &typed_bound).config(&config);
        let got = lane
            .run(support::with_scalars(request, &program, &values))
            .unwrap_or_else(|e| panic!("values {set:?}: {e}"));
        assert_eq!(got.outputs, expected, "values {set:?}");
    }
}

/// Workgroups of 30 threads (one partial warp) that meet at barriers (a workgroup
/// buffer zeroed at entry, a store and a reduction), then return early at different
/// iterations of a loop: thread `l` returns at iteration 1 when `l % 3 == 0` and at
/// iteration 2 when `l % 5 == 1`; the others store `neighbour + total`.
fn diverging_returns_program() -> Program {
    Program::builder([30, 1, 1])
        .entry_op_id("lane_diverging_returns")
        .buffer(
            "out",
            0,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "w",
            1,
            Access::Workgroup,
            ElemType::U32,
            BufferCount::Static(30),
        )
        .body(|b| {
            let local = b.let_("local", Expr::local_id(Axis::X));
            let group = b.let_("group", Expr::workgroup_id(Axis::X));
            b.store("w", local.clone(), group.clone() * 100u32 + local.clone());
            b.barrier();
            let neighbour = b.let_("neighbour", Expr::load("w", (local.clone() + 1u32) % 30u32));
            let total = b.workgroup_reduce("total", ReduceOp::Sum, local.clone() + group.clone());
            b.loop_("j", 0u32, 3u32, |b, j| {
                let first = (local.clone() % 3u32)
                    .equals(0u32)
                    .and(j.clone().equals(1u32));
                b.if_(first, |b| {
                    b.return_();
                });
                let second = (local.clone() % 5u32).equals(1u32).and(j.equals(2u32));
                b.if_(second, |b| {
                    b.return_();
                });
            });
            b.store("out", group * 30u32 + local, neighbour + total);
        })
        .build()
}

/// What [`diverging_returns_program`] writes over `groups` workgroups.
fn diverging_returns_expected(groups: u32) -> Vec<u32> {
    (0..groups)
        .flat_map(|group| {
            (0..30u32).map(move |local| {
                if local % 3 == 0 || local % 5 == 1 {
                    0
                } else {
                    group * 100 + (local + 1) % 30 + 435 + 30 * group
                }
            })
        })
        .collect()
}

/// Locks out lane bodies that lose threads at their barriers after early returns: a
/// body whose threads return at different points (here inside a loop) can leave the
/// warp diverged when the server calls the next workgroup's body, whose entry barrier
/// must still gather every thread. Twelve workgroups of [`diverging_returns_program`]
/// through lanes of 1 and 2 blocks (each block runs several in turn), over 20 requests
/// each, give the hand-computed words, the reference's bytes and a launch's bytes.
/// This shape alone did not hang the aligned barrier on the H200 (ptxas reconverged
/// the warp); the differential's regression seeds hold the case that did.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_lane_bodies_meet_at_barriers_after_diverging_returns() {
    let _watchdog = watchdog(60, "lane bodies after diverging returns");
    let gpu = backend();
    let program = diverging_returns_program();
    let kernel = gpu.compile(&program, &DispatchConfig::linear(1)).unwrap();
    let groups = 12u32;
    let config = DispatchConfig::new([groups, 1, 1]);
    let inputs = vec![vec![0u8; 4 * 30 * groups as usize]];
    let expected = reference(&program, &inputs, &config);
    assert_eq!(words(&expected[0]), diverging_returns_expected(groups));
    let buffers = buffer_copies(&gpu, &inputs);
    let bound = bindings(&buffers);
    let launched = gpu
        .run(Dispatch::new(&kernel, &bound).config(&config))
        .unwrap();
    assert_eq!(launched.outputs, expected, "a launch");
    for blocks in [1u32, 2] {
        let lane = lane_of(
            &gpu,
            std::slice::from_ref(&kernel),
            LaneOptions::new()
                .blocks(blocks)
                .timeout(Duration::from_secs(5)),
        );
        for round in 0..20 {
            let got = lane
                .run(Dispatch::new(&kernel, &bound).config(&config))
                .unwrap_or_else(|e| panic!("blocks {blocks}, round {round}: {e}"));
            assert_eq!(got.outputs, expected, "blocks {blocks}, round {round}");
        }
    }
}

/// Locks out a lane that serves a request with a remembered request's plan, staging,
/// readback placement or record when the two differ (a repeat of one of the last
/// requests reuses them): a sequence of requests of one kernel, each repeating the
/// one before, or differing from it in one thing the plan depends on (an input
/// buffer, the output buffer, the buffers' lengths, the grid, the readback policy, a
/// host binding), more than the lane remembers, then two in turn, gives the eager
/// dispatch's outputs at every step, writes the output buffer it names and no other
/// (the others keep their junk), and a repeat still checks the caller's slices.
/// Negative control: every changed step's outputs or output buffer differ from the
/// step before's, so serving it with the previous plan would fail a comparison.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_lane_repeats_reuse_only_what_the_request_fixes() {
    let _watchdog = watchdog(120, "lane repeats");
    let gpu = backend();
    let kernels = compile_all(&gpu, &[triple()]);
    let kernel = &kernels[0];
    let x = gpu.buffer_from(&(0..256u32).collect::<Vec<_>>()).unwrap();
    let other_x = gpu
        .buffer_from(&(1000..1256u32).collect::<Vec<_>>())
        .unwrap();
    let short_x = gpu.buffer_from(&(7..135u32).collect::<Vec<_>>()).unwrap();
    // The output buffers, each step's named by its index here.
    let outs = [
        gpu.buffer(1024).unwrap(),
        gpu.buffer(1024).unwrap(),
        gpu.buffer(512).unwrap(),
    ];
    let host: Vec<u8> = (0..256u32).flat_map(|v| (v * 5).to_le_bytes()).collect();
    let base = [Binding::from(&x), Binding::from(&outs[0])];
    let new_input = [Binding::from(&other_x), Binding::from(&outs[0])];
    let new_output = [Binding::from(&x), Binding::from(&outs[1])];
    let shorter = [Binding::from(&short_x), Binding::from(&outs[2])];
    let hosted = [Binding::Host(&host), Binding::from(&outs[0])];
    let none = ReadbackPolicy::None;
    let ranges = ReadbackPolicy::Ranges(smallvec::smallvec![ByteRange {
        binding: 1,
        offset: 8,
        len: 24
    }]);
    let request = |bound| Dispatch::new(kernel, bound).workgroups([4, 1, 1]);
    // (step, request, its output buffer, whether it repeats the step before)
    let steps: Vec<(&str, Dispatch<'_>, usize, bool)> = vec![
        ("first", request(&base), 0, false),
        ("repeat", request(&base), 0, true),
        ("repeat again", request(&base), 0, true),
        ("another input buffer", request(&new_input), 0, false),
        ("back", request(&base), 0, false),
        ("another output buffer", request(&new_output), 1, false),
        (
            "shorter buffers",
            request(&shorter).workgroups([2, 1, 1]),
            2,
            false,
        ),
        (
            "fewer workgroups",
            request(&base).workgroups([1, 1, 1]),
            0,
            false,
        ),
        (
            "nothing read back",
            request(&base).readback(&none),
            0,
            false,
        ),
        ("byte ranges", request(&base).readback(&ranges), 0, false),
        (
            "byte ranges again",
            request(&base).readback(&ranges),
            0,
            true,
        ),
        ("a host input", request(&hosted), 0, false),
        ("a host input again", request(&hosted), 0, true),
        ("back again", request(&base), 0, false),
        ("repeat", request(&base), 0, true),
        // Two remembered requests in turn (a chain's shape): each repeats the one
        // before the one before, never the one before.
        (
            "another input buffer, in turn",
            request(&new_input),
            0,
            false,
        ),
        ("back, in turn", request(&base), 0, false),
        (
            "another input buffer, in turn again",
            request(&new_input),
            0,
            false,
        ),
        ("back, in turn again", request(&base), 0, false),
        ("repeat at last", request(&base), 0, true),
    ];
    let junk = |buffer: &vyre_cuda::backend::DeviceBuffer| {
        let words = (buffer.len() / 4) as usize;
        gpu.upload(buffer, &vec![0xEEEE_EEEEu32; words]).unwrap();
    };
    // Every eager answer first, with no lane running: an eager launch beside a lane's
    // server does not finish under compute-sanitizer, and this test stays under it.
    let mut previous: Option<(Vec<Vec<u8>>, usize)> = None;
    let mut expected = Vec::with_capacity(steps.len());
    for (step, request, written, repeats) in &steps {
        outs.iter().for_each(junk);
        let eager = gpu.run(*request).unwrap().outputs.into_vecs();
        let eager_buffer = gpu.read::<u32>(&outs[*written]).unwrap();
        let key = (eager.clone(), *written);
        if let Some(previous) = &previous {
            assert_eq!(
                *repeats,
                *previous == key,
                "{step}: the control, a changed step differs from the one before"
            );
        }
        previous = Some(key);
        expected.push((eager, eager_buffer));
    }
    let lane = lane_of(&gpu, &kernels, LaneOptions::new());
    for ((step, request, written, _), (eager, eager_buffer)) in steps.iter().zip(&expected) {
        outs.iter().for_each(junk);
        let got = lane.run(*request).unwrap_or_else(|e| panic!("{step}: {e}"));
        assert_eq!(&got.outputs, eager, "{step}");
        for (index, buffer) in outs.iter().enumerate() {
            let words = gpu.read::<u32>(buffer).unwrap();
            if index == *written {
                assert_eq!(&words, eager_buffer, "{step}: the buffer it names");
            } else {
                assert!(
                    words.iter().all(|&w| w == 0xEEEE_EEEE),
                    "{step}: buffer {index} was written"
                );
            }
        }
    }
    // A repeat checks the caller's slices: one too short is a Fix error.
    let mut short = [0u8; 1020];
    let message = lane
        .run_into(request(&base), &mut [&mut short])
        .unwrap_err()
        .to_string();
    assert!(message.starts_with("Fix:"), "{message}");
    let mut whole = [0u8; 1024];
    lane.run_into(request(&base), &mut [&mut whole]).unwrap();
    assert_eq!(
        whole
            .chunks(4)
            .map(|w| u32::from_le_bytes(w.try_into().unwrap()))
            .collect::<Vec<_>>(),
        (0..256u32).map(|v| v * 3).collect::<Vec<_>>()
    );
}

/// Locks out stale or torn result words of the flagged protocol: a lane of two slots
/// serves 300 requests whose byte ranges change size and alignment every request (so a
/// slot's area holds words of earlier, longer requests where a later one reads), over
/// inputs that change every request, and every delivery equals the bytes the kernel
/// writes (`y = 3x + 1`, computed on the host). A stale word taken for a new one (a
/// flag check that passes on an earlier request's flag) or a word read before its data
/// arrived shows as a wrong byte.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_lane_flagged_words_of_changing_sizes_never_go_stale() {
    let gpu = backend();
    let program = Program::builder([64, 1, 1])
        .entry_op_id("lane_flagged_sizes")
        .buffer(
            "x",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Static(256),
        )
        .buffer(
            "y",
            1,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(256),
        )
        .body(|b| {
            let i = b.let_("i", Expr::global_id(vyre_cuda::ir::Axis::X));
            b.if_(i.clone().less_than(Expr::length("y")), |b| {
                b.store("y", i.clone(), Expr::load("x", i.clone()) * 3u32 + 1u32);
            });
        })
        .build();
    let kernels = compile_all(&gpu, &[program]);
    let lane = lane_of(&gpu, &kernels, LaneOptions::new().slots(2));
    let x = gpu.buffer_from(&[0u32; 256]).unwrap();
    let y = gpu.buffer_from(&[0u32; 256]).unwrap();
    let bound = [Binding::from(&x), Binding::from(&y)];
    for round in 0..300u32 {
        let data: Vec<u32> = (0..256).map(|i| lcg(i ^ round, 3)).collect();
        gpu.upload(&x, &data).unwrap();
        // Long and short in turn, at offsets of every alignment.
        let len = if round % 2 == 0 {
            1024 - round % 16
        } else {
            1 + round % 23
        };
        let offset = round % 7;
        let wanted = [(offset, len.min(1024 - offset)), (16 * (round % 8), 16)];
        let ranges = ReadbackPolicy::Ranges(
            wanted
                .iter()
                .map(|&(offset, len)| ByteRange {
                    binding: 1,
                    offset: u64::from(offset),
                    len: u64::from(len),
                })
                .collect(),
        );
        let request = Dispatch::new(&kernels[0], &bound)
            .workgroups([4, 1, 1])
            .readback(&ranges);
        // What the kernel writes, computed here: an eager launch beside the lane's
        // server would not finish under compute-sanitizer, and this test stays under it.
        let y_bytes: Vec<u8> = data
            .iter()
            .flat_map(|v| v.wrapping_mul(3).wrapping_add(1).to_le_bytes())
            .collect();
        let expected: Vec<Vec<u8>> = wanted
            .iter()
            .map(|&(offset, len)| y_bytes[offset as usize..(offset + len) as usize].to_vec())
            .collect();
        let on_lane = lane.run(request).unwrap().outputs.into_vecs();
        assert_eq!(on_lane, expected, "round {round}");
    }
}

/// Locks out an exchange of a lane's two shared record copies that serves a stale,
/// torn or short record: two requests of one kernel whose records differ in a scalar
/// value and in length alternate, with a repeat and a third record between them,
/// through lanes of 1, 2 and 4 slots, and every delivery is its own request's bytes
/// (`support::lane::assert_alternating_records_deliver_their_own_bytes`; the routes
/// themselves are the record module's unit tests, and `tests/lane.rs` holds the
/// reference lane to the same check).
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_lane_alternating_records_change_places_exactly() {
    let _watchdog = watchdog(120, "lane alternating records");
    support::lane::assert_alternating_records_deliver_their_own_bytes(&AnyBackend::Cuda(backend()));
}

/// `x[i] = x[i] + 1` over 64-thread workgroups, in place.
fn bump() -> Program {
    Program::builder([64, 1, 1])
        .entry_op_id("lane_bump")
        .u32_buffer("x", 0, Access::ReadWrite, BufferCount::Runtime)
        .body(|b| {
            let i = b.let_("i", Expr::global_id(Axis::X));
            b.if_(i.clone().less_than(Expr::length("x")), |b| {
                b.store("x", i.clone(), Expr::load("x", i.clone()) + 1u32);
            });
        })
        .build()
}

/// One thread: `y[0] = x[length(x) - 1]`, the word a lane request stores last.
fn last_word() -> Program {
    Program::builder([1, 1, 1])
        .entry_op_id("lane_last_word")
        .u32_buffer("x", 0, Access::ReadOnly, BufferCount::Runtime)
        .u32_buffer("y", 1, Access::WriteOnly, BufferCount::Static(1))
        .body(|b| {
            b.store("y", 0u32, Expr::load("x", Expr::length("x") - 1u32));
        })
        .build()
}

/// Locks out a device reader that misses a lane request's outputs right after its
/// delivery. The server publishes the result words before its publish fence, so a
/// delivered request's outputs in device memory are visible at GPU scope only once its
/// completion word is; a blocking read or an eager dispatch that the host did not order
/// after that word (the request left the order book at delivery, as it used to) could
/// read the word before the request's store. For 2,000 rounds, through a lane of one
/// block and then one of four (one lane at a time: building a lane beside a running
/// one is refused under lazy module loading), a lane request that reads nothing back
/// (delivered on its header's words alone, the earliest) adds one to each of 16 Ki
/// words of an owned buffer, its 256 workgroups in turn on the lane's blocks, the last
/// of them stored just before the publish; at once after the delivery, even rounds read
/// the whole buffer with a blocking read, odd rounds copy its last word with an eager
/// dispatch, and both see the round's count in every word. Each lane is then dropped
/// right after a delivered request (not yet retired when its completion word lags)
/// and stops within the watchdog, leaving no release deferred. Negative control: each
/// round's count differs from the round before's, so a read that precedes the
/// request's stores fails the comparison.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_lane_outputs_reach_device_readers_right_after_delivery() {
    let _watchdog = watchdog(300, "lane outputs after delivery");
    let gpu = backend();
    // Compiled before any lane: a module load beside a running lane may be refused.
    let kernels = compile_all(&gpu, &[bump(), last_word()]);
    let (bump, last) = (&kernels[0], &kernels[1]);
    let words = 16 * 1024u32;
    let x = gpu.buffer_from(&vec![0u32; words as usize]).unwrap();
    let none = ReadbackPolicy::None;
    let on_lane = [Binding::from(&x)];
    let request = Dispatch::new(bump, &on_lane)
        .workgroups([words / 64, 1, 1])
        .readback(&none);
    let reading = [Binding::from(&x), Binding::Zeroed(4)];
    // Warm the eager path before the lane (its first dispatch may load or allocate).
    assert_eq!(
        gpu.run(Dispatch::new(last, &reading))
            .unwrap()
            .outputs
            .read::<u32>("y")
            .unwrap(),
        [0]
    );
    let mut count = 0u32;
    for blocks in [1u32, 4] {
        let lane = lane_of(
            &gpu,
            std::slice::from_ref(bump),
            LaneOptions::new().blocks(blocks),
        );
        for round in 0..1_000u32 {
            lane.run(request)
                .unwrap_or_else(|e| panic!("{blocks} blocks, round {round}: {e}"));
            count += 1;
            if round % 2 == 0 {
                let seen = gpu.read::<u32>(&x).unwrap();
                let stale = seen.iter().position(|&word| word != count);
                assert_eq!(
                    stale,
                    None,
                    "{blocks} blocks, round {round}: a blocking read right after the delivery saw \
                     {:?} where every word is {count}",
                    stale.map(|at| (at, seen[at]))
                );
            } else {
                let seen = gpu.run(Dispatch::new(last, &reading)).unwrap();
                assert_eq!(
                    seen.outputs.read::<u32>("y").unwrap(),
                    [count],
                    "{blocks} blocks, round {round}: an eager dispatch right after the delivery"
                );
            }
        }
        // Dropped right after a delivery: the request may still wait for its completion
        // word, and the stop waits for it instead of hanging or leaving it in the book.
        lane.run(request).unwrap();
        count += 1;
        drop(lane);
        assert_eq!(gpu.deferred_releases().unwrap(), 0, "{blocks} blocks");
        assert!(gpu
            .read::<u32>(&x)
            .unwrap()
            .iter()
            .all(|&word| word == count));
    }
}

/// Locks out a lane of several blocks that lets a block start request `n + 1` while
/// another still serves request `n`. Before block 0 waited for each request's
/// publication, a block that was not the last to arrive went straight on to the next
/// request: block 0, done early, started `n + 1` (reading what a slower block had not
/// written yet for `n`, or writing what it still read), arrived for `n + 1` before a
/// slower block arrived for `n` (the arrival counter cannot tell the two apart: `n + 1`
/// published with work undone, `n` never), and overwrote the go word before a slower
/// block had read it (that block then waited forever: a lane timeout). A lane of four
/// blocks and eight slots serves 1,000 requests with eight in flight at all times, each
/// request's workgroups doing uneven work (block 0's two workgroups 4 units, block 3's
/// 10, 256 LCG steps a unit) and reading, mirrored, what the request before wrote (block
/// 0's first workgroup reads block 3's last; every third with two fixpoint iterations,
/// a lane-wide barrier inside the request), with no host-side order between them
/// (`support::lane::assert_requests_in_flight_keep_their_chain`, whose CPU run on the
/// reference lane in `tests/lane.rs` checks the chain's expected values); every readback
/// and both buffers at the end are the chain's. The lane then stops leaving no release
/// deferred.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_multi_block_lane_keeps_requests_apart_with_many_in_flight() {
    let _watchdog = watchdog(240, "a lane of four blocks with eight requests in flight");
    let gpu = backend();
    support::lane::assert_requests_in_flight_keep_their_chain(
        &AnyBackend::Cuda(gpu.clone()),
        4,
        1_000,
        256,
    );
    assert_eq!(gpu.deferred_releases().unwrap(), 0);
}

/// Locks out an idle lane that keeps what its delivered requests hold. The server's
/// completion word follows the result words by its publish fence, so at delivery it
/// often does not cover the request yet, and the lane used to look again only at its
/// next delivery, submission or stop: a lane used and then left idle kept a request's
/// transient buffers out of the pool (counted against the memory budget) and its
/// order-book entry in the way of every later dispatch over its buffers. For 200
/// rounds, right after its delivery, a request with a host input and a zeroed output
/// (two transients) has left the pool's bytes as they were before it; and a request
/// over an owned buffer, met by an eager dispatch reading that buffer, has left the
/// book once the eager dispatch is done. Negative control: before the fix the book
/// kept the lane's entry after the eager dispatch (requests over owned buffers retired
/// a batch of 8 at a time), and the pool was short of the transients' buckets in every
/// round whose completion word had not arrived at the delivery's one look.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_idle_lane_gives_back_what_its_delivered_requests_held() {
    let _watchdog = watchdog(120, "idle lane retirement");
    let gpu = backend();
    let kernels = compile_all(&gpu, &[increment(), bump(), last_word()]);
    let (increment, bump, last) = (&kernels[0], &kernels[1], &kernels[2]);
    let x = gpu.buffer_from(&vec![0u32; 1024]).unwrap();
    let reading = [Binding::from(&x), Binding::Zeroed(4)];
    // Warm the eager path before the lane (its first dispatch may load or allocate).
    gpu.run(Dispatch::new(last, &reading)).unwrap();
    let lane = lane_of(&gpu, &[increment.clone(), bump.clone()], LaneOptions::new());
    let input: Vec<u8> = [7u32; 256]
        .iter()
        .flat_map(|word| word.to_le_bytes())
        .collect();
    let with_transients = [Binding::Host(&input), Binding::Zeroed(1024)];
    let request = Dispatch::new(increment, &with_transients).workgroups([4, 1, 1]);
    // Two warm rounds: the first allocates the transients, the second takes them from
    // the pool.
    for _ in 0..2 {
        lane.run(request).unwrap();
    }
    let pooled = gpu.pool_stats().pooled_bytes;
    for round in 0..200 {
        let got = lane.run(request).unwrap();
        assert_eq!(got.outputs.read::<u32>("y").unwrap(), vec![8u32; 256]);
        assert_eq!(
            gpu.pool_stats().pooled_bytes,
            pooled,
            "round {round}: the request's transients are not back in the pool after its delivery"
        );
    }
    let none = ReadbackPolicy::None;
    let on_lane = [Binding::from(&x)];
    lane.run(
        Dispatch::new(bump, &on_lane)
            .workgroups([16, 1, 1])
            .readback(&none),
    )
    .unwrap();
    let seen = gpu.run(Dispatch::new(last, &reading)).unwrap();
    assert_eq!(seen.outputs.read::<u32>("y").unwrap(), [1]);
    assert_eq!(
        gpu.order_book_entries(),
        0,
        "the lane request the eager dispatch waited for is still in the order book"
    );
}

/// Locks out a lane whose stop fails, or moves to another thread, because a dispatch
/// over its buffers held it for a moment. The order book lends a lane to a dispatch
/// that meets one of its requests, for the length of that dispatch's wait for the
/// request; `Lane::stop` used to refuse (a `Fix:` error saying requests were pending)
/// while one did, and a dropped lane could be stopped on that dispatch's thread. For
/// 100 lanes in turn, each serving 20 requests that add one to an owned buffer while
/// another thread runs eager dispatches reading it without pause, `stop` (even lanes)
/// or a drop (odd lanes) right after the last delivery ends the lane: `stop` is `Ok`
/// every time, the buffer holds every request's count, and no release is left
/// deferred. (A race, not a certainty: the old rule failed only in the rounds where
/// the other thread held the lane at the stop.)
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_lane_stop_is_not_refused_while_a_dispatch_waits_for_its_request() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let _watchdog = watchdog(300, "lane stop beside waiting dispatches");
    let gpu = backend();
    let kernels = compile_all(&gpu, &[bump(), last_word()]);
    let (bump, last) = (kernels[0].clone(), kernels[1].clone());
    let x = gpu.buffer_from(&vec![0u32; 1024]).unwrap();
    let reading = [Binding::from(&x), Binding::Zeroed(4)];
    gpu.run(Dispatch::new(&last, &reading)).unwrap();
    let done = AtomicBool::new(false);
    let mut count = 0u32;
    std::thread::scope(|scope| {
        let reader = scope.spawn(|| {
            let reading = [Binding::from(&x), Binding::Zeroed(4)];
            let mut dispatches = 0u64;
            while !done.load(Ordering::Acquire) {
                gpu.run(Dispatch::new(&last, &reading)).unwrap();
                dispatches += 1;
            }
            dispatches
        });
        let none = ReadbackPolicy::None;
        let on_lane = [Binding::from(&x)];
        let request = Dispatch::new(&bump, &on_lane)
            .workgroups([16, 1, 1])
            .readback(&none);
        for round in 0..100 {
            let lane = lane_of(&gpu, std::slice::from_ref(&bump), LaneOptions::new());
            for _ in 0..20 {
                lane.run(request).unwrap();
                count += 1;
            }
            if round % 2 == 0 {
                lane.stop()
                    .unwrap_or_else(|e| panic!("round {round}: the stop was refused: {e}"));
            } else {
                drop(lane);
            }
        }
        done.store(true, Ordering::Release);
        let dispatches = reader.join().unwrap();
        assert!(dispatches > 0);
    });
    assert!(gpu
        .read::<u32>(&x)
        .unwrap()
        .iter()
        .all(|&word| word == count));
    assert_eq!(gpu.deferred_releases().unwrap(), 0);
    assert_eq!(gpu.order_book_entries(), 0);
}

/// Locks out doorbell-polling warps that change what a lane serves or hang it: lanes
/// of 0, 1, 3 and 8 poller warps (block 0's own thread polls at 0), over a one-thread
/// workgroup (the pollers then follow a workgroup warp of one thread) and a 64-thread
/// one, each serve 120 single requests with a new input each, then bursts of four
/// requests queued in four slots (the pollers look for a ticket the host rang before
/// the previous one was served; a ticket's two answer words alternate), then the same
/// with a device poll sleep, every output checked against its input; each lane holds
/// the poller warps it was asked for and stops cleanly. A lane whose pollers answered
/// a stale ticket would deliver another request's words or time out (the watchdog).
/// (120 requests and 50 bursts a lane, every slot and both answer words turning over
/// dozens of times: with 300 and 100 the test took 322 s under racecheck on the H200,
/// 2026-12-02, while racecheck reported the pollers' plain shared-memory words.)
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_lane_poller_warps_serve_every_request_exactly() {
    let _watchdog = watchdog(300, "lanes with doorbell-polling warps");
    let gpu = backend();
    let one_thread = compile_all(&gpu, &[copy_word()]);
    let wide = compile_all(&gpu, &[increment()]);
    for warps in [0u32, 1, 3, 8] {
        for sleep in [Duration::ZERO, Duration::from_micros(2)] {
            let options = LaneOptions::new()
                .poller_warps(warps)
                .slots(4)
                .poll_sleep(sleep);
            let lane = lane_of(&gpu, &one_thread, options);
            assert_eq!(lane.poller_warps(), warps);
            let x = gpu.buffer(4).unwrap();
            for round in 0..120u32 {
                let value = warps << 24 | round;
                gpu.upload(&x, &[value]).unwrap();
                let bound = [Binding::from(&x), Binding::Zeroed(4)];
                let got = lane
                    .run(Dispatch::new(&one_thread[0], &bound))
                    .unwrap_or_else(|e| panic!("{warps} pollers, round {round}: {e}"));
                assert_eq!(
                    got.outputs.read::<u32>("y").unwrap(),
                    [value],
                    "{warps} pollers"
                );
            }
            lane.stop()
                .unwrap_or_else(|e| panic!("stopping a lane of {warps} pollers: {e}"));

            let lane = lane_of(&gpu, &wide, options);
            assert_eq!(lane.poller_warps(), warps);
            let inputs = burst_inputs(&gpu, warps);
            serve_bursts(
                &lane,
                &wide[0],
                (&inputs, warps),
                50,
                &format!("{warps} pollers"),
            );
            lane.stop()
                .unwrap_or_else(|e| panic!("stopping a lane of {warps} pollers: {e}"));
        }
    }
}

/// The inputs of [`serve_bursts`]: four buffers of 64 words, buffer `s` all
/// `1000 s + base`.
fn burst_inputs(gpu: &CudaBackend, base: u32) -> Vec<DeviceBuffer> {
    (0..4u32)
        .map(|slot| gpu.buffer_from(&[slot * 1000 + base; 64]).unwrap())
        .collect()
}

/// `bursts` bursts of one `increment` request per input of [`burst_inputs`]`(base)`
/// queued on `lane` at once, then waited for in order; every output must be its input
/// plus one (`label` names the lane in a failure).
fn serve_bursts(
    lane: &Lane,
    increment: &Kernel,
    (inputs, base): (&[DeviceBuffer], u32),
    bursts: u32,
    label: &str,
) {
    for burst in 0..bursts {
        let pending: Vec<_> = inputs
            .iter()
            .map(|x| {
                let bound = [Binding::from(x), Binding::Zeroed(256)];
                lane.submit(Dispatch::new(increment, &bound)).unwrap()
            })
            .collect();
        for (slot, pending) in pending.into_iter().enumerate() {
            let got = pending
                .wait()
                .unwrap_or_else(|e| panic!("{label}, burst {burst}: {e}"));
            assert_eq!(
                got.outputs.read::<u32>("y").unwrap(),
                [slot as u32 * 1000 + base + 1; 64],
                "{label}, burst {burst}, slot {slot}"
            );
        }
    }
}

/// Locks out a lane whose server and host disagree on the host-mapped memory they
/// share. The server chooses one of its `memory_candidates` allocations when it starts
/// (the one its SM reaches soonest), and the host rings that one's doorbells and reads
/// that one's result areas from then on; a host still on the first candidate would
/// wait for words that never come (the watchdog), and a block of a multi-block lane
/// still on the first would serve no request with the others. Lanes of 1, 2 and 4
/// candidates, of one block with poller warps and of three blocks without, each serve
/// 100 single requests and 25 bursts of four, every output checked against its
/// input; each says which candidate it chose (0 with one), and the twelve lanes'
/// choices are printed.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_lane_serves_through_the_memory_candidate_it_chose() {
    let _watchdog = watchdog(300, "lanes choosing their host-mapped memory");
    let gpu = backend();
    let wide = compile_all(&gpu, &[increment()]);
    let mut chosen = Vec::new();
    for candidates in [1u32, 2, 4] {
        for (blocks, pollers) in [(1u32, 4u32), (3, 0)] {
            for _ in 0..2 {
                let options = LaneOptions::new()
                    .memory_candidates(candidates)
                    .blocks(blocks)
                    .poller_warps(pollers);
                let lane = lane_of(&gpu, &wide, options);
                let placement = lane.memory_placement();
                assert!(
                    placement < candidates as usize,
                    "candidate {placement} of {candidates}"
                );
                chosen.push(placement);
                let label = format!("{candidates} candidates, {blocks} blocks, chose {placement}");
                let inputs = burst_inputs(&gpu, candidates);
                for round in 0..100u32 {
                    let value = candidates << 24 | round;
                    gpu.upload(&inputs[0], &[value; 64]).unwrap();
                    let bound = [Binding::from(&inputs[0]), Binding::Zeroed(256)];
                    let got = lane
                        .run(Dispatch::new(&wide[0], &bound))
                        .unwrap_or_else(|e| panic!("{label}, round {round}: {e}"));
                    assert_eq!(
                        got.outputs.read::<u32>("y").unwrap(),
                        [value + 1; 64],
                        "{label}"
                    );
                }
                gpu.upload(&inputs[0], &[candidates; 64]).unwrap();
                serve_bursts(&lane, &wide[0], (&inputs, candidates), 25, &label);
                lane.stop()
                    .unwrap_or_else(|e| panic!("stopping, {label}: {e}"));
            }
        }
    }
    println!("memory candidates chosen (1, 1, 1, 1, 2 × 4, 4 × 4): {chosen:?}");
}
