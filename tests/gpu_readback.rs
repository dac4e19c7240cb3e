//! GPU tests of readback and device time at the physical limit: small
//! outputs come back through the host-mapped result area the kernel writes itself,
//! large ones by DMA, and `kernel_stamps_ns` comes from the kernel's `%globaltimer` stamps.
//! Ignored by default; run on the GPU machine (`gpu_readback`). Every output is
//! checked against the reference interpreter.

mod support;

use support::{
    backend, bindings, buffer_copies, bytes, fixture_inputs, reference, run_buffers, run_host,
    words,
};
use vyre_cuda::backend::floor::{RawFloor, ReadbackSweep};
use vyre_cuda::backend::readback::{MAPPED_RANGE_MAX_BYTES, RESULT_RANGE_SLOTS};
use vyre_cuda::backend::{Binding, CudaBackend, DeviceBuffer, Dispatch, Timing};
use vyre_cuda::fixtures::{host_cost_fixture, host_cost_fixture_expected};
use vyre_cuda::ir::*;
use vyre_cuda::{ByteRange, DispatchConfig, ReadbackPolicy};

/// `small[i] = i * 3 + seed` (16 words) and `large[i] += i ^ seed` over a runtime
/// buffer: one output the mapped area carries and one it must leave to DMA (and
/// one whose result depends on what the previous dispatch left in it).
fn small_and_large() -> Program {
    Program::builder([256, 1, 1])
        .entry_op_id("readback_small_and_large")
        .buffer(
            "seed",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Static(1),
        )
        .buffer(
            "small",
            1,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Static(16),
        )
        .buffer(
            "large",
            2,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            let i = b.let_("i", Expr::global_id(Axis::X));
            let seed = b.let_("s", Expr::load("seed", 0u32));
            b.if_(i.clone().less_than(16u32), |b| {
                b.store("small", i.clone(), i.clone() * 3u32 + seed.clone());
            });
            b.if_(i.clone().less_than(Expr::length("large")), |b| {
                b.store(
                    "large",
                    i.clone(),
                    Expr::load("large", i.clone()) + (i.clone() ^ seed.clone()),
                );
            });
        })
        .build()
}

/// Upload each input again into its device buffer (programs that accumulate).
fn reupload(gpu: &CudaBackend, buffers: &[DeviceBuffer], inputs: &[Vec<u8>]) {
    for (buffer, bytes) in buffers.iter().zip(inputs) {
        gpu.upload(buffer, bytes).unwrap();
    }
}

fn small_and_large_inputs(seed: u32, large_words: usize) -> Vec<Vec<u8>> {
    vec![bytes(&[seed]), vec![0u8; 64], vec![0xEEu8; 4 * large_words]]
}

/// Locks out a mapped route that delivers wrong, stale or misplaced bytes on any
/// dispatch path: the 17-buffer fixture (16 outputs: every descriptor slot) and a
/// program with one small and one large output (mapped + DMA in one dispatch) give
/// the reference interpreter's bytes over host bindings, device buffers, a mix of
/// both, and into caller buffers, with fixpoint iterations, and with byte ranges at odd
/// offsets and lengths: inside one 16-byte block (windows, delivered from their
/// place in the block), across a block boundary at an odd offset (the kernel's
/// byte-copy loop) and at a word offset (its word loop); the stamps are present
/// (`kernel_stamps_ns > 0`) on every path.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_outputs_match_the_reference_on_every_path() {
    let gpu = backend();
    let program = host_cost_fixture(17, 64);
    let config = DispatchConfig::linear(1);
    for x in [1u32, 77, 0xFFFF_FFF0] {
        let inputs = fixture_inputs(&program, x);
        let expected = reference(&program, &inputs, &config);
        assert_eq!(expected.len(), 16);
        assert_eq!(words(&expected[0])[0], host_cost_fixture_expected(x, 64));
        let borrowed: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
        assert_eq!(
            run_host(&gpu, &program, &borrowed, &config).unwrap(),
            expected
        );
        let buffers = buffer_copies(&gpu, &inputs);
        let timed = run_buffers(&gpu, &program, &buffers, &config).unwrap();
        assert_eq!(timed.outputs, expected, "device buffers x={x}");
        assert!(timed.timings.kernel_stamps_ns > 0, "{timed:?}");
        let mixed: Vec<Binding> = buffers
            .iter()
            .zip(&inputs)
            .enumerate()
            .map(|(i, (buffer, v))| {
                if i % 2 == 0 {
                    Binding::from(buffer)
                } else {
                    Binding::Host(v)
                }
            })
            .collect();
        let mixed_out = gpu
            .run(Dispatch::program(&program, &mixed).config(&config))
            .unwrap();
        assert_eq!(mixed_out.outputs, expected, "mixed x={x}");
        let kernel = gpu.compile(&program, &config).unwrap();
        let mut storage = vec![[0u8; 16]; 16];
        let mut outs: Vec<&mut [u8]> = storage.iter_mut().map(|s| &mut s[..]).collect();
        let timing = gpu
            .run_into(Dispatch::new(&kernel, &mixed).config(&config), &mut outs)
            .unwrap();
        assert!(timing.kernel_stamps_ns > 0);
        let got: Vec<Vec<u8>> = storage.iter().map(|s| s.to_vec()).collect();
        assert_eq!(got, expected, "compiled kernel x={x}");
    }

    let program = small_and_large();
    let large_words = 4 * MAPPED_RANGE_MAX_BYTES as usize; // 4 × the limit in bytes
    for fixpoint in [1u32, 3] {
        let config = DispatchConfig::linear((large_words as u32).div_ceil(256))
            .with_fixpoint_iterations(fixpoint);
        let inputs = small_and_large_inputs(fixpoint * 11, large_words);
        let expected = reference(&program, &inputs, &config);
        let borrowed: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
        assert_eq!(
            run_host(&gpu, &program, &borrowed, &config).unwrap(),
            expected
        );
        let buffers = buffer_copies(&gpu, &inputs);
        assert_eq!(
            run_buffers(&gpu, &program, &buffers, &config)
                .unwrap()
                .outputs,
            expected
        );
        // `large` accumulates, so every dispatch over the buffers starts from the
        // inputs again.
        reupload(&gpu, &buffers, &inputs);
        // Byte ranges: odd offsets and lengths (byte copies), one range per output
        // and a long one that goes by DMA.
        let ranges = ReadbackPolicy::Ranges(smallvec::smallvec![
            ByteRange {
                binding: 1,
                offset: 3,
                len: 5
            },
            ByteRange {
                binding: 2,
                offset: 1,
                len: 7
            },
            ByteRange {
                binding: 2,
                offset: 0,
                len: 4 * large_words as u64
            },
            ByteRange {
                binding: 1,
                offset: 60,
                len: 4
            },
            ByteRange {
                binding: 1,
                offset: 13,
                len: 6
            },
            ByteRange {
                binding: 1,
                offset: 12,
                len: 8
            },
        ]);
        let ranged = run_buffers(
            &gpu,
            &program,
            &buffers,
            &config.clone().with_readback(ranges),
        )
        .unwrap()
        .outputs;
        let item = |i: usize| ranged.item(i).unwrap();
        assert_eq!(item(0), &expected[0][3..8]);
        assert_eq!(item(1), &expected[1][1..8]);
        assert_eq!(item(2), &expected[1][..]);
        assert_eq!(item(3), &expected[0][60..64]);
        assert_eq!(item(4), &expected[0][13..19]);
        assert_eq!(item(5), &expected[0][12..20]);
        assert_eq!(ranged.item_binding(1), Some(2));
    }
}

/// Locks out outputs that exist only in the mapped area: after a dispatch over
/// device buffers the buffers hold the same bytes (the next dispatch reads them),
/// and a second dispatch that consumes the first one's output sees it.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_buffer_outputs_stay_valid_in_device_memory() {
    let gpu = backend();
    let program = small_and_large();
    let config = DispatchConfig::linear(1);
    let inputs = small_and_large_inputs(5, 64);
    let buffers = buffer_copies(&gpu, &inputs);
    let outputs = run_buffers(&gpu, &program, &buffers, &config)
        .unwrap()
        .outputs;
    assert_eq!(
        gpu.read::<u8>(&buffers[1]).unwrap(),
        outputs.item(0).unwrap()
    );
    assert_eq!(
        gpu.read::<u8>(&buffers[2]).unwrap(),
        outputs.item(1).unwrap()
    );
    // `large` accumulates: the second dispatch must start from the first one's
    // device bytes, which is what two fixpoint iterations compute.
    let second = run_buffers(&gpu, &program, &buffers, &config)
        .unwrap()
        .outputs;
    let expected = reference(
        &program,
        &inputs,
        &config.clone().with_fixpoint_iterations(2),
    );
    assert_eq!(second, expected);
}

/// Locks out bytes of one dispatch reaching another caller through the reused
/// mapped area: after a dispatch that wrote non-zero bytes into every descriptor
/// slot's place, a dispatch whose write-only outputs the kernel never stores must
/// return zeros (WriteOnly starts zeroed), on the same lane (one thread, serial).
/// Negative control: the first dispatch really returned non-zero bytes.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_no_bytes_leak_between_dispatches_through_the_area() {
    let gpu = backend();
    let writer = host_cost_fixture(17, 64);
    let config = DispatchConfig::linear(1);
    let inputs = fixture_inputs(&writer, 0xABCD);
    let borrowed: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
    let first = run_host(&gpu, &writer, &borrowed, &config).unwrap();
    assert!(first.iter().any(|o| o.iter().any(|&b| b != 0)), "control");
    let mut silent = Program::builder([32, 1, 1]).entry_op_id("silent_outputs");
    for binding in 0..16 {
        silent = silent.buffer(
            format!("o{binding}"),
            binding,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Static(4),
        );
    }
    let silent = silent.body(|b| {
        b.let_("unused", Expr::global_id(Axis::X));
    });
    let silent = silent.build();
    let zeros = vec![vec![0u8; 16]; 16];
    let borrowed: Vec<&[u8]> = zeros.iter().map(|v| v.as_slice()).collect();
    let writer_inputs: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
    for _ in 0..3 {
        assert_eq!(run_host(&gpu, &silent, &borrowed, &config).unwrap(), zeros);
        assert_eq!(
            run_host(&gpu, &writer, &writer_inputs, &config).unwrap(),
            first
        );
    }
}

/// A kernel long enough to time: 32 threads each run `rounds` dependent
/// multiply-adds.
fn spinner() -> Program {
    Program::builder([32, 1, 1])
        .entry_op_id("readback_spinner")
        .buffer(
            "rounds",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Static(1),
        )
        .buffer(
            "out",
            1,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(32),
        )
        .body(|b| {
            let i = b.let_("i", Expr::global_id(Axis::X));
            b.let_mut("acc", i.clone());
            b.loop_("k", 0u32, Expr::load("rounds", 0u32), |b, k| {
                b.assign(
                    "acc",
                    (Expr::var("acc") * 1_664_525u32 + 1_013_904_223u32) ^ k,
                );
            });
            b.store("out", i.clone(), Expr::var("acc"));
        })
        .build()
}

/// Locks out a stamp-based `kernel_stamps_ns` that is not device time: on a kernel of
/// about a millisecond, the stamps (the kernel's own `%globaltimer`) agree with a
/// CUDA event pair around the same launch within 2 µs or 5 %, at two lengths, and
/// the long kernel's stamp time is about twice the short one's. Negative control:
/// the short kernel's stamps do not agree with the long kernel's events, so the
/// tolerance can tell different work apart. Skipped under compute-sanitizer
/// (`VYRE_UNDER_SANITIZER=1`): the instrumentation stretches the event window.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_stamp_kernel_time_matches_an_event_pair() {
    if support::skipped_under_sanitizer(
        "gpu_stamp_kernel_time_matches_an_event_pair",
        "the instrumented kernel's stamps and the event pair around it measure different spans",
    ) {
        return;
    }
    let gpu = backend();
    let program = spinner();
    let config = DispatchConfig::linear(1).with_readback(ReadbackPolicy::None);
    let kernel = gpu.compile(&program, &config).unwrap();
    let agree = |a: u64, b: u64| {
        let diff = a.abs_diff(b);
        diff <= 2_000 || (diff as f64) <= 0.05 * a.max(b) as f64
    };
    let mut measured = Vec::new();
    for rounds in [200_000u32, 400_000] {
        let inputs = vec![bytes(&[rounds]), vec![0u8; 128]];
        let buffers = buffer_copies(&gpu, &inputs);
        let bound = bindings(&buffers);
        let request = Dispatch::new(&kernel, &bound).config(&config);
        // Warm, then the median of 5 of each.
        let mut pairs = Vec::new();
        for _ in 0..6 {
            let t = gpu
                .run_into(request.timing(Timing::EventWindow), &mut [])
                .unwrap();
            pairs.push((t.kernel_stamps_ns, t.event_window_ns.unwrap()));
        }
        pairs.remove(0);
        pairs.sort();
        let (stamps, events) = pairs[pairs.len() / 2];
        eprintln!("rounds {rounds}: stamps {stamps} ns, events {events} ns");
        assert!(
            stamps > 100_000,
            "the kernel must run long enough to compare: {stamps} ns"
        );
        assert!(
            agree(stamps, events),
            "stamps {stamps} ns vs events {events} ns"
        );
        // The untimed call reports the same stamp time (no events needed).
        let untimed = gpu.run_into(request, &mut []).unwrap();
        assert!(
            agree(untimed.kernel_stamps_ns, stamps),
            "{untimed:?} vs {stamps}"
        );
        assert_eq!(untimed.event_window_ns, None);
        measured.push((stamps, events));
    }
    let ((short_stamps, _), (long_stamps, long_events)) = (measured[0], measured[1]);
    let ratio = long_stamps as f64 / short_stamps as f64;
    assert!(
        (1.7..2.3).contains(&ratio),
        "twice the rounds, {ratio:.2} × the time"
    );
    assert!(
        !agree(short_stamps, long_events),
        "negative control: {short_stamps} ns must not pass for {long_events} ns"
    );
}

/// Locks out bad readback input turning into a panic, silent truncation or lost
/// data: ranges out of bounds are a `Fix:` error; more ranges than descriptor slots
/// and outputs larger than the mapped area fall back to DMA and still return the
/// reference bytes; a program too wide to host the stamps is a `Fix:` error (and
/// the widest that fits runs: the control).
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_bad_readback_input_errs_or_falls_back() {
    let gpu = backend();
    let program = small_and_large();
    let large_words = 32 * 1024; // 128 KiB: larger than the whole mapped area
    let config = DispatchConfig::linear((large_words as u32).div_ceil(256));
    let inputs = small_and_large_inputs(9, large_words);
    let expected = reference(&program, &inputs, &config);
    let buffers = buffer_copies(&gpu, &inputs);
    let out_of_bounds = ReadbackPolicy::Ranges(smallvec::smallvec![ByteRange {
        binding: 1,
        offset: 60,
        len: 8
    }]);
    let message = run_buffers(
        &gpu,
        &program,
        &buffers,
        &config.clone().with_readback(out_of_bounds),
    )
    .unwrap_err()
    .to_string();
    assert!(
        message.starts_with("Fix:") && message.contains("past the buffer"),
        "{message}"
    );
    // RESULT_RANGE_SLOTS + 4 one-word ranges: 16 mapped, 4 by DMA.
    let many: smallvec::SmallVec<[ByteRange; 4]> = (0..RESULT_RANGE_SLOTS as u64 + 4)
        .map(|k| ByteRange {
            binding: 2,
            offset: 4 * k * 7,
            len: 4,
        })
        .collect();
    let got = run_buffers(
        &gpu,
        &program,
        &buffers,
        &config
            .clone()
            .with_readback(ReadbackPolicy::Ranges(many.clone())),
    )
    .unwrap()
    .outputs;
    for (range, bytes) in many.iter().zip(&got) {
        let start = range.offset as usize;
        assert_eq!(bytes[..], expected[1][start..start + 4], "{range:?}");
    }
    reupload(&gpu, &buffers, &inputs);
    assert_eq!(
        run_buffers(&gpu, &program, &buffers, &config)
            .unwrap()
            .outputs,
        expected
    );
    drop(buffers);
    // A program too wide to host the result area (its kernel parameters would pass
    // the driver's 4 KiB) is a Fix error before anything is launched; one buffer
    // fewer than the limit still runs.
    let wide = |buffers: u32| {
        let mut builder = Program::builder([1, 1, 1]).entry_op_id(format!("wide_{buffers}"));
        for binding in 0..buffers {
            builder = builder.buffer(
                format!("b{binding}"),
                binding,
                Access::ReadWrite,
                ElemType::U32,
                BufferCount::Static(1),
            );
        }
        builder
            .body(|b| {
                b.store("b0", 0u32, Expr::load("b0", 0u32) + 1u32);
            })
            .build()
    };
    let config = DispatchConfig::linear(1).with_readback(ReadbackPolicy::None);
    let message = gpu.compile(&wide(319), &config).unwrap_err().to_string();
    assert!(
        message.starts_with("Fix:") && message.contains("at most 318"),
        "{message}"
    );
    let fits = wide(318);
    let inputs = vec![vec![0u8; 4]; 318];
    let borrowed: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
    let outputs = run_host(&gpu, &fits, &borrowed, &DispatchConfig::linear(1)).unwrap();
    assert_eq!(outputs.get("b0").unwrap(), 1u32.to_le_bytes());
}

/// Locks out floors that measure less work than a dispatch does: the raw floor's
/// mapped and result-ABI mechanisms deliver the fixture's real output, and the size
/// sweep's three routes deliver identical bytes at every size it measures.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_floor_mechanisms_deliver_real_bytes() {
    let gpu = backend();
    let program = host_cost_fixture(9, 64);
    let mut floor = RawFloor::new(&gpu, &program, [1, 1, 1]).unwrap();
    floor.launch_async_reads_sync(8).unwrap();
    floor.launch_mapped_sync().unwrap();
    floor.launch_result_abi_sync(8).unwrap();
    assert!(floor.result_abi_kernel_ns() > 0);
    // The floor's buffers start uninitialised, so compare the routes with each
    // other: `out[0]` (buffer 1, = in[0] + the chain's sum) is the same word in the
    // per-copy floor's staging (copy 1), the mapped floor's memory and the result
    // area's first range.
    let staged = floor.staged_bytes(16, 4);
    assert_eq!(floor.mapped_output(1, 4), staged, "mapped floor");
    assert_eq!(floor.result_bytes(16, 4), staged, "result-ABI floor");
    drop(floor);

    let mut sweep = ReadbackSweep::new(&gpu, 1 << 20).unwrap();
    for size in [16usize, 4096, ReadbackSweep::AREA_CAPACITY / 4 * 4, 1 << 20] {
        sweep.copy_sweep(size).unwrap();
        let copied = sweep.copied_bytes(size);
        let expected: Vec<u8> = (0..size as u32 / 4).flat_map(|i| i.to_le_bytes()).collect();
        assert_eq!(copied, expected, "copy route, {size} bytes");
        sweep.mapped_write_sweep(size).unwrap();
        assert_eq!(
            sweep.mapped_bytes(size),
            expected,
            "mapped route, {size} bytes"
        );
        if size <= ReadbackSweep::AREA_CAPACITY {
            sweep.area_sweep(size).unwrap();
            assert_eq!(sweep.area_bytes(size), expected, "area route, {size} bytes");
        } else {
            assert!(sweep
                .area_sweep(size)
                .unwrap_err()
                .to_string()
                .starts_with("Fix:"));
        }
    }
}

/// Locks out a graph whose kernels lost their result-ABI parameters (they would read
/// garbage pointers): a recorded dispatch with read-backs replays with the
/// reference's bytes and stamps its kernel time.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_graph_replay_delivers_outputs_and_stamps() {
    let gpu: CudaBackend = backend();
    let program = host_cost_fixture(9, 64);
    let config = DispatchConfig::linear(1);
    let kernel = gpu.compile(&program, &config).unwrap();
    let inputs = fixture_inputs(&program, 31);
    let expected = reference(&program, &inputs, &config);
    let buffers = buffer_copies(&gpu, &inputs);
    let bound = bindings(&buffers);
    let mut slots = Vec::new();
    let mut graph = gpu
        .record(|rec| {
            rec.dispatch(Dispatch::new(&kernel, &bound).config(&config))?;
            for buffer in &buffers[1..] {
                slots.push(rec.read_back(buffer, 0, 16)?);
            }
            Ok(())
        })
        .unwrap();
    for _ in 0..3 {
        let timing = graph.replay().unwrap();
        assert!(timing.kernel_stamps_ns > 0, "{timing:?}");
        for (slot, want) in slots.iter().zip(&expected) {
            assert_eq!(graph.output(*slot).unwrap(), &want[..]);
        }
    }
    drop(graph);
}

/// Locks out a lane's first kernel running before the lane's result-area control
/// block is initialised. The initialisation is a blocking `cuMemcpyHtoD`, whose
/// DMA from pageable memory may still be on its way when the call returns, on the
/// legacy default stream that the lanes' non-blocking streams never wait for: a
/// kernel that ran first counted its finished threads from whatever the fresh
/// allocation held, never reached the grid's count and ended without its end stamp
/// (`completed without writing its end stamp`, seen once on the H200 from the
/// tokenizer's `gpu_batches_of_1_to_1000_documents_with_empty_ones`, the first
/// time its backend needed eight new lanes at once). Each round frees 16-byte
/// buffers full of ones (so the next control blocks likely start on such bytes),
/// takes a fresh backend (every lane and area new) and submits eight
/// multi-block dispatches at once while another backend keeps the copy engines
/// busy; every one must finish with its stamps and the reference
/// interpreter's bytes. The defect is a race: this test makes it likely, not
/// certain.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_the_first_dispatches_on_new_lanes_write_their_end_stamps() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let program = small_and_large();
    let large_words = 8192;
    let config = DispatchConfig::linear((large_words as u32).div_ceil(256));
    let inputs = small_and_large_inputs(29, large_words);
    let expected = reference(&program, &inputs, &config);
    let host: Vec<Binding> = inputs.iter().map(|bytes| Binding::Host(bytes)).collect();
    let busy = backend();
    let traffic = busy.buffer(64 << 20).unwrap();
    let payload = vec![0x5Au8; 64 << 20];
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                busy.upload(&traffic, &payload).unwrap();
            }
        });
        let rounds = std::panic::catch_unwind(|| {
            for round in 0..24 {
                let ones: Vec<DeviceBuffer> = (0..64)
                    .map(|_| busy.buffer_from(&[u32::MAX; 4]).unwrap())
                    .collect();
                drop(ones);
                let fresh = backend();
                let pending: Vec<_> = (0..8)
                    .map(|_| {
                        fresh
                            .submit(Dispatch::program(&program, &host).config(&config))
                            .unwrap()
                    })
                    .collect();
                for (index, submitted) in pending.into_iter().enumerate() {
                    let done = submitted.wait().unwrap_or_else(|error| {
                        panic!("round {round}, dispatch {index} on a new lane: {error}")
                    });
                    assert!(done.timings.kernel_stamps_ns > 0, "round {round}: {done:?}");
                    assert_eq!(done.outputs, expected, "round {round}, dispatch {index}");
                }
            }
        });
        stop.store(true, Ordering::Relaxed);
        if let Err(panic) = rounds {
            std::panic::resume_unwind(panic);
        }
    });
}

/// 256 threads per block (8 warps): each thread writes its workgroup slot and
/// passes a barrier, then leaves at one of four points a hash of its global id and
/// the seed picks (before any store, after its `out` store, after counting itself,
/// or at the end), so the warps of a block, and the lanes of a warp, reach the
/// epilogue at different times and in groups of every size.
fn early_exits() -> Program {
    Program::builder([256, 1, 1])
        .entry_op_id("readback_early_exits")
        .buffer(
            "seed",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Static(1),
        )
        .buffer(
            "out",
            1,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "count",
            2,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(4),
        )
        .buffer(
            "scratch",
            3,
            Access::Workgroup,
            ElemType::U32,
            BufferCount::Static(256),
        )
        .body(|b| {
            let i = b.let_("i", Expr::global_id(Axis::X));
            let local = b.let_("local", Expr::local_id(Axis::X));
            let seed = b.let_("s", Expr::load("seed", 0u32));
            b.store("scratch", local.clone(), i.clone() ^ seed.clone());
            b.barrier();
            let exit = b.let_(
                "exit",
                (i.clone() * 2_654_435_761u32 + seed.clone()) >> 30u32,
            );
            b.if_(i.clone().greater_equal(Expr::length("out")), |b| {
                b.return_();
            });
            b.if_(exit.clone().equals(0u32), |b| {
                b.return_();
            });
            let neighbour = Expr::load("scratch", (local.clone() + 1u32) & 255u32);
            b.store("out", i.clone(), neighbour + 1u32);
            b.if_(exit.clone().equals(1u32), |b| {
                b.return_();
            });
            b.atomic(AtomicOp::Add, "count", exit.clone(), 1u32);
            b.if_(exit.clone().equals(2u32), |b| {
                b.return_();
            });
            b.atomic(AtomicOp::Add, "count", 0u32, 1u32);
        })
        .build()
}

/// Locks out a per-block finish count that loses or double-counts a thread, or
/// lets the grid's last group copy before another block's stores are visible:
/// 300 blocks of 8 warps whose threads leave at random points (`early_exits`),
/// one and three launches per dispatch, five dispatches each over the same device
/// buffers (so a control block left unreset would show in the next one), give the
/// reference interpreter's bytes both through the mapped area (`count`, and byte
/// ranges of `out` that the last group's strided loop copies, at odd offsets) and
/// by DMA (`out`), with the kernel's own stamps written every time
/// (`kernel_stamps_ns > 0`; a grid count that never reached its total writes none).
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_blocks_whose_warps_leave_early_count_every_thread() {
    let gpu = backend();
    let program = early_exits();
    let blocks = 300u32;
    let out_words = (blocks * 256 - 37) as usize;
    for fixpoint in [1u32, 3] {
        let config = DispatchConfig::linear(blocks).with_fixpoint_iterations(fixpoint);
        for dispatch in 0..5u32 {
            let seed = 0x9E37_79B9u32.wrapping_mul(dispatch + 1) ^ fixpoint;
            let inputs = vec![bytes(&[seed]), vec![0u8; 4 * out_words], vec![0u8; 16]];
            let expected = reference(&program, &inputs, &config);
            let buffers = buffer_copies(&gpu, &inputs);
            let whole = run_buffers(&gpu, &program, &buffers, &config).unwrap();
            assert_eq!(
                whole.outputs, expected,
                "fixpoint {fixpoint}, dispatch {dispatch}"
            );
            assert!(whole.timings.kernel_stamps_ns > 0, "{:?}", whole.timings);
            reupload(&gpu, &buffers, &inputs);
            let ranges = ReadbackPolicy::Ranges(smallvec::smallvec![
                ByteRange {
                    binding: 2,
                    offset: 0,
                    len: 16
                },
                ByteRange {
                    binding: 1,
                    offset: 3,
                    len: 1001
                },
                ByteRange {
                    binding: 1,
                    offset: 4 * (out_words as u64 - 700),
                    len: 2800
                },
            ]);
            let ranged = run_buffers(
                &gpu,
                &program,
                &buffers,
                &config.clone().with_readback(ranges),
            )
            .unwrap();
            assert!(ranged.timings.kernel_stamps_ns > 0, "{:?}", ranged.timings);
            let item = |i: usize| ranged.outputs.item(i).unwrap();
            assert_eq!(item(0), &expected[1][..], "count");
            assert_eq!(item(1), &expected[0][3..1004], "out head");
            assert_eq!(item(2), &expected[0][4 * (out_words - 700)..], "out tail");
        }
    }
}
