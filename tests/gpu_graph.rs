//! GPU tests of dispatch graphs: a chain of dispatches captured once and
//! replayed. Ignored by default; run on the GPU machine. Every result is checked
//! against the reference interpreter and hand-computed values.

mod support;

use support::{backend, bytes, random_words, words};
use vyre_cuda::backend::{BackendError, Binding, CudaBackend, DeviceBuffer, Dispatch, Kernel};
use vyre_cuda::graph::{DispatchGraph, InputSlot, OutputSlot, StepId};
use vyre_cuda::ir::*;
use vyre_cuda::probe::{self, parse_line, Phase};
use vyre_cuda::{ByteRange, DispatchConfig, ReadbackPolicy};

/// Elements in the chain's buffers (not a multiple of the workgroup size, so the
/// length guards matter).
const N: usize = 1000;
const WORKGROUP: u32 = 64;

fn blocks_for(n: usize) -> u32 {
    (n as u32).div_ceil(WORKGROUP)
}

/// `dst[i] = f(src[i])` for `i < length(dst)` (see `support::elementwise`).
fn elementwise(name: &str, f: impl FnOnce(Expr) -> Expr) -> Program {
    support::elementwise(name, WORKGROUP, f)
}

fn times3() -> Program {
    elementwise("times3", |v| v * 3u32)
}

fn plus1() -> Program {
    elementwise("plus1", |v| v + 1u32)
}

fn pow5() -> Program {
    elementwise("pow5", |v| {
        v.clone() * v.clone() * v.clone() * v.clone() * v
    })
}

/// `acc[i] = acc[i] * 7 + 3` for `i < length(acc)` (read-write): a fixpoint step.
fn affine() -> Program {
    Program::builder([WORKGROUP, 1, 1])
        .entry_op_id("affine")
        .buffer(
            "acc",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            let i = b.let_("i", Expr::global_id(Axis::X));
            b.if_(i.clone().less_than(Expr::length("acc")), |b| {
                let v = b.let_("v", Expr::load("acc", i.clone()));
                b.store("acc", i.clone(), v * 7u32 + 3u32);
            });
        })
        .build()
}

/// `acc[i] = acc[i] + src[i]` (acc read-write): reads its output before writing it.
fn accumulate() -> Program {
    Program::builder([WORKGROUP, 1, 1])
        .entry_op_id("accumulate")
        .buffer(
            "src",
            0,
            Access::ReadOnly,
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
        .body(|b| {
            let i = b.let_("i", Expr::global_id(Axis::X));
            b.if_(i.clone().less_than(Expr::length("acc")), |b| {
                let v = b.let_("v", Expr::load("acc", i.clone()));
                b.store("acc", i.clone(), v + Expr::load("src", i.clone()));
            });
        })
        .build()
}

fn hand_chain(x: u32) -> u32 {
    let y = x.wrapping_mul(3).wrapping_add(1);
    y.wrapping_mul(y)
        .wrapping_mul(y)
        .wrapping_mul(y)
        .wrapping_mul(y)
}

fn hand_affine(mut x: u32, iterations: u32) -> u32 {
    for _ in 0..iterations {
        x = x.wrapping_mul(7).wrapping_add(3);
    }
    x
}

/// The three-program chain on the reference interpreter over the first `n` words.
fn reference_chain(input: &[u32]) -> Vec<u32> {
    let n = input.len();
    let config = DispatchConfig::linear(blocks_for(n));
    let mut current = bytes(input);
    for program in [times3(), plus1(), pow5()] {
        let zeros = vec![0u8; 4 * n];
        let mut outputs = vyre_cuda::reference::run(&program, &[&current, &zeros], &config)
            .unwrap_or_else(|e| panic!("reference failed: {e}\n{program}"));
        assert_eq!(outputs.len(), 1, "one output per elementwise program");
        current = outputs.remove(0);
    }
    words(&current)
}

/// Compiled kernels of the chain and its device buffers (`N` words each).
struct Chain {
    kernels: [Kernel; 3],
    input: DeviceBuffer,
    x: DeviceBuffer,
    y: DeviceBuffer,
    out: DeviceBuffer,
}

/// The bindings of `buffers`, in order.
fn on<'a>(buffers: &[&'a DeviceBuffer]) -> Vec<Binding<'a>> {
    buffers
        .iter()
        .map(|&buffer| Binding::from(buffer))
        .collect()
}

impl Chain {
    fn new(gpu: &CudaBackend) -> Chain {
        let config = DispatchConfig::linear(blocks_for(N));
        let compile = |p: Program| gpu.compile(&p, &config).unwrap();
        let buffer = || gpu.buffer(4 * N as u64).unwrap();
        Chain {
            kernels: [compile(times3()), compile(plus1()), compile(pow5())],
            input: buffer(),
            x: buffer(),
            y: buffer(),
            out: buffer(),
        }
    }

    /// upload(input) → times3 → plus1 → pow5 → read_back(out).
    fn record(&self, gpu: &CudaBackend) -> (DispatchGraph, InputSlot, [StepId; 3], OutputSlot) {
        let config = DispatchConfig::linear(blocks_for(N)).with_readback(ReadbackPolicy::None);
        let mut ids = None;
        let graph = gpu
            .record(|rec| {
                let input = rec.upload(&self.input, 4 * N as u64)?;
                let a = rec.dispatch(
                    Dispatch::new(&self.kernels[0], &on(&[&self.input, &self.x])).config(&config),
                )?;
                let b = rec.dispatch(
                    Dispatch::new(&self.kernels[1], &on(&[&self.x, &self.y])).config(&config),
                )?;
                let c = rec.dispatch(
                    Dispatch::new(&self.kernels[2], &on(&[&self.y, &self.out])).config(&config),
                )?;
                let output = rec.read_back(&self.out, 0, 4 * N as u64)?;
                ids = Some((input, [a, b, c], output));
                Ok(())
            })
            .unwrap();
        let (input, steps, output) = ids.unwrap();
        (graph, input, steps, output)
    }

    fn free(self, _gpu: &CudaBackend) {
        // The buffers free themselves; a graph that binds them keeps their memory.
    }
}

fn fix_message(error: BackendError) -> String {
    let message = error.to_string();
    assert!(message.starts_with("Fix:"), "not a Fix message: {message}");
    message
}

/// Locks out a graph that replays stale inputs, loses a step, or reads back before
/// the chain finished: 100 replays, each with fresh inputs written through
/// `input_mut`, must equal the reference interpreter's run of the same three
/// programs in sequence and the hand-computed `(3x + 1)^5`.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_graph_chain_replays_fresh_inputs_match_reference() {
    let gpu = backend();
    let chain = Chain::new(&gpu);
    let (mut graph, input, _, output) = chain.record(&gpu);
    assert_eq!(graph.step_count(), 3);
    assert_eq!(graph.launch_nodes(), 3);
    // upload + 3 × (write-only clear + launch) + read-back: at 4,000 bytes the
    // read-back is longer than `readback::mapped_range_limit` allows, so it stays a
    // copy node instead of riding in the last launch's epilogue.
    assert_eq!(graph.graph_nodes(), 8, "{graph:?}");
    for round in 0..100u64 {
        let values = random_words(round + 1, N);
        graph
            .input_mut(input)
            .unwrap()
            .copy_from_slice(&bytes(&values));
        let timing = if round % 2 == 0 {
            graph.replay().unwrap()
        } else {
            let timed = graph.replay_timed().unwrap();
            assert!(
                timed.event_window_ns.is_some_and(|ns| ns > 0),
                "round {round}: {timed:?}"
            );
            timed
        };
        assert!(
            timing.wait_ns <= timing.wall_ns && timing.enqueue_ns <= timing.wall_ns,
            "round {round}: {timing:?}"
        );
        assert!(
            timing.kernel_stamps_ns > 0,
            "the kernels' stamps span the replay: {timing:?}"
        );
        let got = words(graph.output(output).unwrap());
        let hand: Vec<u32> = values.iter().map(|&v| hand_chain(v)).collect();
        assert_eq!(got, hand, "round {round}: hand-computed");
        assert_eq!(got, reference_chain(&values), "round {round}: reference");
    }
    drop(graph);
    chain.free(&gpu);
}

/// Locks out element-count and grid updates that do not reach the executable graph
/// (or reach only some launch nodes): after `set_element_count` and
/// `set_workgroups` (exact and full grids alternating), each replay processes
/// exactly the new length —
/// the first `n` words match the reference over `n` words and the rest of the
/// write-only output stays zero. Bad updates are `Fix:` errors that change nothing.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_graph_set_element_count_changes_processed_length() {
    let gpu = backend();
    let chain = Chain::new(&gpu);
    let (mut graph, input, steps, output) = chain.record(&gpu);
    let values = random_words(77, N);
    graph
        .input_mut(input)
        .unwrap()
        .copy_from_slice(&bytes(&values));
    for (round, n) in [N, 1, 63, 64, 65, 500, 999, N, 7].into_iter().enumerate() {
        for &step in &steps {
            graph.set_element_count(step, 0, n as u32).unwrap();
            graph.set_element_count(step, 1, n as u32).unwrap();
            assert_eq!(graph.element_count(step, 1).unwrap(), n as u32);
            // Odd rounds: the exact grid; even rounds: back to the full grid (the
            // length guard idles the extra threads). Both go through set_workgroups.
            let blocks = if round % 2 == 1 {
                blocks_for(n)
            } else {
                blocks_for(N)
            };
            graph.set_workgroups(step, [blocks, 1, 1]).unwrap();
            assert_eq!(graph.workgroups(step).unwrap(), [blocks, 1, 1]);
        }
        graph.replay().unwrap();
        let got = words(graph.output(output).unwrap());
        let expected = reference_chain(&values[..n]);
        assert_eq!(&got[..n], &expected[..], "n = {n}: processed part");
        let hand: Vec<u32> = values[..n].iter().map(|&v| hand_chain(v)).collect();
        assert_eq!(&got[..n], &hand[..], "n = {n}: hand-computed");
        assert!(
            got[n..].iter().all(|&w| w == 0),
            "n = {n}: words past the element count must stay zero (write-only clear)"
        );
        // Negative control: a graph that ignored the update would have processed all
        // N words, which differs from the above past n.
        if n < N {
            let full = reference_chain(&values);
            assert!(
                full[n..].iter().any(|&w| w != 0),
                "n = {n}: control is inert"
            );
        }
    }

    // Bad updates: Fix errors, and the graph keeps its last good parameters (n = 7).
    let m = fix_message(
        graph
            .set_element_count(steps[0], 0, N as u32 + 1)
            .unwrap_err(),
    );
    assert!(m.contains("holds 1000 elements"), "{m}");
    let m = fix_message(graph.set_element_count(steps[0], 9, 5).unwrap_err());
    assert!(m.contains("binding 9"), "{m}");
    fix_message(graph.set_workgroups(steps[1], [0, 1, 1]).unwrap_err());
    assert_eq!(graph.element_count(steps[0], 0).unwrap(), 7);
    graph.replay().unwrap();
    let got = words(graph.output(output).unwrap());
    assert_eq!(&got[..7], &reference_chain(&values[..7])[..]);
    assert!(got[7..].iter().all(|&w| w == 0));
    drop(graph);
    chain.free(&gpu);
}

/// Locks out a graph that borrows its buffers instead of holding them: dropping
/// every buffer after recording (and allocating and filling new buffers, which may
/// reuse the freed addresses) must not change what replays compute; replays also
/// work from another thread (the graph is `Send` and binds the context itself).
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_graph_survives_dropping_its_buffers() {
    let gpu = backend();
    let chain = Chain::new(&gpu);
    let (mut graph, input, _, output) = chain.record(&gpu);
    let live = gpu.pool_stats().live_buffers;
    drop(chain);
    assert_eq!(
        gpu.pool_stats().live_buffers,
        live - 4,
        "the buffers are gone"
    );
    // New buffers, filled with a pattern a replay must never see.
    let decoys: Vec<DeviceBuffer> = (0..4)
        .map(|_| gpu.buffer_from(&vec![0xABu8; 4 * N]).unwrap())
        .collect();
    for round in 0..5u64 {
        let values = random_words(1000 + round, N);
        graph
            .input_mut(input)
            .unwrap()
            .copy_from_slice(&bytes(&values));
        graph.replay().unwrap();
        let got = words(graph.output(output).unwrap());
        assert_eq!(got, reference_chain(&values), "round {round}");
    }
    for decoy in &decoys {
        assert!(
            gpu.read::<u8>(decoy).unwrap().iter().all(|&b| b == 0xAB),
            "a replay wrote into a buffer it does not hold"
        );
    }
    let values = random_words(4242, N);
    let got = std::thread::spawn(move || {
        graph
            .input_mut(input)
            .unwrap()
            .copy_from_slice(&bytes(&values));
        graph.replay().unwrap();
        let got = words(graph.output(output).unwrap());
        drop(graph);
        (got, values)
    })
    .join()
    .unwrap();
    assert_eq!(got.0, reference_chain(&got.1), "replay on another thread");
    drop(decoys);
    assert!(gpu.is_usable());
}

/// Locks out any difference between a replay and the eager path: the chain plus a
/// three-iteration fixpoint step, as a graph (reading back every intermediate) and
/// as plain `run` requests over separate buffers, must agree byte for byte
/// on every buffer, and with the reference interpreter.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_graph_matches_plain_dispatch_chain_byte_for_byte() {
    let gpu = backend();
    let chain = Chain::new(&gpu);
    let fixpoint = DispatchConfig::linear(blocks_for(N))
        .with_fixpoint_iterations(3)
        .with_readback(ReadbackPolicy::None);
    let affine_kernel = gpu.compile(&affine(), &fixpoint).unwrap();
    // AllOutputs (the default) is accepted and means "no readback" inside a graph.
    let config = DispatchConfig::linear(blocks_for(N));
    let mut slots = None;
    let mut graph = gpu
        .record(|rec| {
            let input = rec.upload(&chain.input, 4 * N as u64)?;
            let pairs = [
                (&chain.kernels[0], [&chain.input, &chain.x]),
                (&chain.kernels[1], [&chain.x, &chain.y]),
                (&chain.kernels[2], [&chain.y, &chain.out]),
            ];
            for (kernel, buffers) in pairs {
                rec.dispatch(Dispatch::new(kernel, &on(&buffers)).config(&config))?;
            }
            rec.dispatch(Dispatch::new(&affine_kernel, &on(&[&chain.out])).config(&fixpoint))?;
            let x = rec.read_back(&chain.x, 0, 4 * N as u64)?;
            let y = rec.read_back(&chain.y, 0, 4 * N as u64)?;
            let out = rec.read_back(&chain.out, 0, 4 * N as u64)?;
            // A sub-range read-back: words 10..20 of out.
            let part = rec.read_back(&chain.out, 40, 40)?;
            slots = Some((input, [x, y, out, part]));
            Ok(())
        })
        .unwrap();
    let (input, outputs) = slots.unwrap();
    assert_eq!(
        graph.launch_nodes(),
        6,
        "1 + 1 + 1 + 3 fixpoint launch nodes"
    );

    let eager = [(); 4].map(|_| gpu.buffer(4 * N as u64).unwrap());
    let none = config.clone().with_readback(ReadbackPolicy::None);
    for round in 0..10u64 {
        let values = random_words(500 + round, N);
        graph
            .input_mut(input)
            .unwrap()
            .copy_from_slice(&bytes(&values));
        graph.replay().unwrap();

        gpu.upload(&eager[0], &values).unwrap();
        for (k, pair) in chain.kernels.iter().zip([[0, 1], [1, 2], [2, 3]]) {
            let bindings = on(&[&eager[pair[0]], &eager[pair[1]]]);
            gpu.run(Dispatch::new(k, &bindings).config(&none)).unwrap();
        }
        gpu.run(Dispatch::new(&affine_kernel, &on(&[&eager[3]])).config(&fixpoint))
            .unwrap();
        let eager_bytes: Vec<Vec<u8>> = eager[1..]
            .iter()
            .map(|buffer| gpu.read::<u8>(buffer).unwrap())
            .collect();
        for (i, slot) in outputs[..3].iter().enumerate() {
            assert_eq!(
                graph.output(*slot).unwrap(),
                &eager_bytes[i][..],
                "round {round}: buffer {i} differs from the eager chain"
            );
        }
        assert_eq!(
            graph.output(outputs[3]).unwrap(),
            &eager_bytes[2][40..80],
            "round {round}: sub-range read-back"
        );
        let chained = reference_chain(&values);
        let affine_reference = vyre_cuda::reference::run(
            &affine(),
            &[&bytes(&chained)],
            &fixpoint.clone().with_readback(ReadbackPolicy::AllOutputs),
        )
        .unwrap();
        assert_eq!(graph.output(outputs[2]).unwrap(), &affine_reference[0][..]);
        let hand: Vec<u32> = values
            .iter()
            .map(|&v| hand_affine(hand_chain(v), 3))
            .collect();
        assert_eq!(words(graph.output(outputs[2]).unwrap()), hand);
    }
    drop(graph);
    drop(eager);
    chain.free(&gpu);
}

/// Locks out allocation inside a capture that does not replay correctly: scratch
/// buffers (graph allocation nodes) carry the chain's intermediates, and a scratch
/// buffer that is read before it is written must start zeroed on every replay — a
/// graph that reused last replay's scratch contents would accumulate across replays.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_graph_scratch_buffers_replay_correctly() {
    let gpu = backend();
    let config = DispatchConfig::linear(blocks_for(N)).with_readback(ReadbackPolicy::None);
    let compile = |p: Program| gpu.compile(&p, &config).unwrap();
    let (k_times3, k_plus1, k_pow5, k_accumulate) = (
        compile(times3()),
        compile(plus1()),
        compile(pow5()),
        compile(accumulate()),
    );
    let input = gpu.buffer(4 * N as u64).unwrap();
    let out = gpu.buffer(4 * N as u64).unwrap();
    let summed = gpu.buffer(4 * N as u64).unwrap();
    let mut slots = None;
    let mut graph = gpu
        .record(|rec| {
            let x = rec.scratch(4 * N as u64)?;
            let y = rec.scratch(4 * N as u64)?;
            let acc = rec.scratch(4 * N as u64)?;
            let upload = rec.upload(&input, 4 * N as u64)?;
            let r = Binding::from;
            let s = Binding::Scratch;
            let steps = [
                (&k_times3, [r(&input), s(x)]),
                (&k_plus1, [s(x), s(y)]),
                (&k_pow5, [s(y), r(&out)]),
                // acc += input, then summed = acc + 1: equals input + 1 only if acc
                // started at zero in this replay.
                (&k_accumulate, [r(&input), s(acc)]),
                (&k_plus1, [s(acc), r(&summed)]),
            ];
            for (kernel, bindings) in &steps {
                rec.dispatch(Dispatch::new(kernel, bindings).config(&config))?;
            }
            let chained = rec.read_back(&out, 0, 4 * N as u64)?;
            let summed_slot = rec.read_back(&summed, 0, 4 * N as u64)?;
            slots = Some((upload, chained, summed_slot));
            Ok(())
        })
        .unwrap();
    let (upload, chained, summed_slot) = slots.unwrap();
    assert_eq!(graph.launch_nodes(), 5);
    for round in 0..20u64 {
        let values = random_words(9000 + round, N);
        graph
            .input_mut(upload)
            .unwrap()
            .copy_from_slice(&bytes(&values));
        graph.replay().unwrap();
        assert_eq!(
            words(graph.output(chained).unwrap()),
            reference_chain(&values),
            "round {round}: chain through scratch buffers"
        );
        let plus_one: Vec<u32> = values.iter().map(|v| v.wrapping_add(1)).collect();
        assert_eq!(
            words(graph.output(summed_slot).unwrap()),
            plus_one,
            "round {round}: scratch did not start zeroed"
        );
    }
    drop(graph);
}

/// Locks out recordings that accept bad input (and would fault or compute garbage at
/// replay): wrong binding counts, sizes, host bindings, a predecessor, ranges
/// past the end, zero fixpoint or workgroups, readback ranges,
/// foreign scratch buffers, foreign slots and static-count updates are all `Fix:`
/// errors at record time. Negative control: the same recording with correct input succeeds and
/// replays, and the backend stays usable (no stream left capturing).
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_graph_rejects_bad_recordings_with_fix_errors() {
    let gpu = backend();
    let chain = Chain::new(&gpu);
    let config = DispatchConfig::linear(blocks_for(N)).with_readback(ReadbackPolicy::None);
    let [k0, _, _] = &chain.kernels;
    let record_error =
        |build: &dyn Fn(&mut vyre_cuda::graph::GraphRecorder<'_>) -> Result<(), BackendError>| {
            fix_message(gpu.record(|rec| build(rec)).unwrap_err())
        };

    let one = on(&[&chain.input]);
    let two = on(&[&chain.input, &chain.x]);
    let m = record_error(&|rec| {
        rec.dispatch(Dispatch::new(k0, &one).config(&config))
            .map(drop)
    });
    assert!(m.contains("takes 2 buffers"), "{m}");
    let m = record_error(&|rec| rec.read_back(&chain.out, 4 * N as u64 - 4, 8).map(drop));
    assert!(m.contains("past"), "{m}");
    let m = record_error(&|rec| rec.upload(&chain.input, 4 * N as u64 + 1).map(drop));
    assert!(m.contains("holds"), "{m}");
    let m = record_error(&|rec| rec.upload(&chain.input, 0).map(drop));
    assert!(m.contains("0 bytes"), "{m}");
    let odd = gpu.buffer(6).unwrap();
    let odd_bindings = on(&[&odd, &chain.x]);
    let m = record_error(&|rec| {
        rec.dispatch(Dispatch::new(k0, &odd_bindings).config(&config))
            .map(drop)
    });
    assert!(m.contains("multiple of 4"), "{m}");
    let m = record_error(&|rec| {
        rec.dispatch(
            Dispatch::new(k0, &two)
                .config(&config)
                .fixpoint_iterations(0),
        )
        .map(drop)
    });
    assert!(m.contains("fixpoint_iterations"), "{m}");
    let m = record_error(&|rec| {
        rec.dispatch(Dispatch::new(k0, &two).workgroups([0, 1, 1]))
            .map(drop)
    });
    assert!(m.contains("workgroups"), "{m}");
    let host = [0u8; 4 * N];
    let hosted = [Binding::Host(&host), Binding::from(&chain.x)];
    let m = record_error(&|rec| {
        rec.dispatch(Dispatch::new(k0, &hosted).config(&config))
            .map(drop)
    });
    assert!(m.contains("replay outlives"), "{m}");
    let pending = gpu.submit(Dispatch::new(k0, &two).config(&config)).unwrap();
    let m = record_error(&|rec| {
        rec.dispatch(Dispatch::new(k0, &two).config(&config).after(&pending))
            .map(drop)
    });
    assert!(m.contains("predecessor"), "{m}");
    pending.wait().unwrap();
    let ranges = config.clone().with_readback(ReadbackPolicy::Ranges(
        [ByteRange {
            binding: 1,
            offset: 0,
            len: 4,
        }]
        .into_iter()
        .collect(),
    ));
    let m = record_error(&|rec| {
        rec.dispatch(Dispatch::new(k0, &two).config(&ranges))
            .map(drop)
    });
    assert!(m.contains("read_back"), "{m}");
    let m = record_error(&|_| Ok(()));
    assert!(m.contains("recorded nothing"), "{m}");

    // A buffer of another backend.
    let foreign = CudaBackend::acquire()
        .unwrap()
        .buffer(4 * N as u64)
        .unwrap();
    let m = record_error(&|rec| rec.upload(&foreign, 4).map(drop));
    assert!(m.contains("another backend"), "{m}");
    let foreign_bindings = on(&[&foreign, &chain.x]);
    let m = record_error(&|rec| {
        rec.dispatch(Dispatch::new(k0, &foreign_bindings).config(&config))
            .map(drop)
    });
    assert!(m.contains("another backend"), "{m}");

    // A scratch buffer of another recording.
    let mut leaked = None;
    let other = gpu
        .record(|rec| {
            leaked = Some(rec.scratch(4 * N as u64)?);
            rec.upload(&chain.input, 4).map(drop)
        })
        .unwrap();
    let leaked = leaked.unwrap();
    let leaking = [Binding::from(&chain.input), Binding::Scratch(leaked)];
    let m = record_error(&|rec| {
        rec.dispatch(Dispatch::new(k0, &leaking).config(&config))
            .map(drop)
    });
    assert!(m.contains("belongs to dispatch graph"), "{m}");
    let m = record_error(&|rec| rec.scratch(0).map(drop));
    assert!(m.contains("0 bytes"), "{m}");

    // An error from the closure itself comes back unchanged; nothing is captured.
    let own = gpu
        .record(|rec| {
            rec.upload(&chain.input, 4)?;
            Err(BackendError::BadInput {
                message: "Fix: caller's own error".into(),
            })
        })
        .unwrap_err();
    assert_eq!(own.to_string(), "Fix: caller's own error");

    // Negative control: the correct recording succeeds and replays.
    let (mut graph, input, steps, output) = chain.record(&gpu);
    let values = random_words(31337, N);
    graph
        .input_mut(input)
        .unwrap()
        .copy_from_slice(&bytes(&values));
    graph.replay().unwrap();
    assert_eq!(
        words(graph.output(output).unwrap()),
        reference_chain(&values)
    );

    // Slots and steps of one graph are refused by another.
    let mut other = other;
    let mut other_slots = None;
    let mut second = gpu
        .record(|rec| {
            other_slots = Some(rec.upload(&chain.input, 4)?);
            Ok(())
        })
        .unwrap();
    let m = fix_message(second.input_mut(input).unwrap_err());
    assert!(m.contains("was passed to dispatch graph"), "{m}");
    let m = fix_message(second.output(output).unwrap_err());
    assert!(m.contains("was passed to dispatch graph"), "{m}");
    let m = fix_message(second.set_element_count(steps[0], 0, 1).unwrap_err());
    assert!(m.contains("was passed to dispatch graph"), "{m}");
    second.replay().unwrap();
    other.replay().unwrap();

    // Element-count updates of a static-count binding are refused.
    let static_program = Program::builder([WORKGROUP, 1, 1])
        .entry_op_id("static_fill")
        .buffer(
            "out",
            0,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Static(WORKGROUP),
        )
        .body(|b| {
            b.store("out", Expr::local_id(Axis::X), 5u32);
        })
        .build();
    let k_static = gpu
        .compile(&static_program, &DispatchConfig::linear(1))
        .unwrap();
    let static_out = gpu.buffer(4 * WORKGROUP as u64).unwrap();
    let mut static_ids = None;
    let mut static_graph = gpu
        .record(|rec| {
            let step = rec.dispatch(Dispatch::new(&k_static, &on(&[&static_out])))?;
            let slot = rec.read_back(&static_out, 0, 4 * WORKGROUP as u64)?;
            static_ids = Some((step, slot));
            Ok(())
        })
        .unwrap();
    let (static_step, static_slot) = static_ids.unwrap();
    let m = fix_message(
        static_graph
            .set_element_count(static_step, 0, 1)
            .unwrap_err(),
    );
    assert!(m.contains("static count"), "{m}");
    static_graph.replay().unwrap();
    assert_eq!(
        words(static_graph.output(static_slot).unwrap()),
        vec![5u32; WORKGROUP as usize]
    );

    // The backend is still usable: no stream was left capturing.
    let direct = support::run_host(
        &gpu,
        &times3(),
        &[&bytes(&[1, 2, 3]), &[0u8; 12]],
        &DispatchConfig::linear(1),
    )
    .unwrap();
    assert_eq!(words(direct.item(0).unwrap()), vec![3, 6, 9]);
    drop((graph, second, other, static_graph));
    drop((odd, static_out));
    chain.free(&gpu);
}

/// Locks out replays the probe cannot see or attribute: with the probe on, every
/// replay prints one parseable line whose nine phases add up (`named_host_ns` is
/// their sum, `unattributed_ns` the rest of wall), whose counts are the sums over
/// the steps, and whose named phases cover most of the wall.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_graph_replay_probe_lines_add_up() {
    let gpu = backend();
    let chain = Chain::new(&gpu);
    let (mut graph, input, _, _) = chain.record(&gpu);
    graph
        .input_mut(input)
        .unwrap()
        .copy_from_slice(&bytes(&random_words(5, N)));
    graph.replay().unwrap(); // warm
    const REPLAYS: usize = 50;
    let (results, lines) = {
        let _on = probe::override_enabled(Some(true));
        probe::capture_lines(|| (0..REPLAYS).map(|_| graph.replay()).collect::<Vec<_>>())
    };
    for result in results {
        result.unwrap();
    }
    assert_eq!(lines.len(), REPLAYS, "one line per replay: {lines:#?}");
    let nodes: u64 = [times3(), plus1(), pow5()]
        .iter()
        .map(|p| p.node_count())
        .sum();
    let mut coverage = Vec::new();
    let mut last_seq = None;
    for line in &lines {
        let record = parse_line(line).unwrap_or_else(|| panic!("unparseable: {line}"));
        let sum = Phase::ALL
            .iter()
            .fold(0u64, |s, &p| s.saturating_add(record.phase_ns(p)));
        assert_eq!(record.named_host_ns(), sum, "{line}");
        assert!(record.named_host_ns() <= record.wall_ns, "{line}");
        assert_eq!(
            record.named_host_ns() + record.unattributed_ns(),
            record.wall_ns,
            "{line}"
        );
        assert!(record.phase_ns(Phase::Launch) > 0, "{line}");
        assert!(record.phase_ns(Phase::Release) > 0, "{line}");
        assert_eq!(record.nodes, nodes, "{line}");
        assert_eq!(record.bindings, 6, "{line}");
        assert_eq!(record.buffers, 6, "{line}");
        assert_eq!(record.fixpoint, 3, "{line}");
        assert_eq!(record.grid_blocks, 3 * blocks_for(N) as u64, "{line}");
        assert!(record.kernel_ns > 0, "stamps: {line}");
        assert!(record.device_window_ns > 0, "probe on → timed: {line}");
        assert_eq!(
            (record.ptx_cache_hits, record.ptx_cache_misses),
            (0, 0),
            "{line}"
        );
        if let Some(previous) = last_seq {
            assert!(record.seq > previous, "{line}");
        }
        last_seq = Some(record.seq);
        coverage.push(record.named_host_ns() as f64 / record.wall_ns.max(1) as f64);
    }
    coverage.sort_by(f64::total_cmp);
    let median = coverage[coverage.len() / 2];
    assert!(
        median >= 0.9,
        "named phases cover a median {median:.3} of wall: {lines:#?}"
    );
    // Probe off again: no lines.
    let (_, quiet) = {
        let _off = probe::override_enabled(Some(false));
        probe::capture_lines(|| graph.replay().unwrap())
    };
    assert!(quiet.is_empty(), "{quiet:?}");
    drop(graph);
    chain.free(&gpu);
}

/// Locks out a graph that does not hold owned buffers: recording over
/// `DeviceBuffer`s (upload, dispatch, read-back), then dropping every buffer,
/// must leave replays computing the right bytes (the graph holds the memory), and
/// nothing stays counted once the graph goes.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_graph_over_owned_buffers_survives_their_drop() {
    let gpu = backend();
    let program = times3();
    let config = DispatchConfig::linear(blocks_for(N));
    let kernel = gpu.compile(&program, &config).unwrap();
    let baseline = gpu.pool_stats().buffer_bytes;
    let x = gpu.buffer(4 * N as u64).unwrap();
    let y = gpu.buffer(4 * N as u64).unwrap();
    let mut slots = None;
    let mut graph = gpu
        .record(|rec| {
            let input = rec.upload(&x, 4 * N as u64)?;
            rec.dispatch(Dispatch::new(&kernel, &on(&[&x, &y])).config(&config))?;
            let output = rec.read_back(&y, 0, 4 * N as u64)?;
            slots = Some((input, output));
            Ok(())
        })
        .unwrap();
    let (input, output) = slots.unwrap();
    drop(x);
    drop(y);
    for round in 0..3u64 {
        let values = random_words(77 + round, N);
        graph
            .input_mut(input)
            .unwrap()
            .copy_from_slice(&bytes(&values));
        graph.replay().unwrap();
        let expected: Vec<u32> = values.iter().map(|v| v.wrapping_mul(3)).collect();
        assert_eq!(
            words(graph.output(output).unwrap()),
            expected,
            "round {round}"
        );
    }
    drop(graph);
    assert_eq!(gpu.pool_stats().buffer_bytes, baseline);
}

/// Locks out a non-blocking replay that returns before its work is ordered or
/// lets the host touch its slots early: two graphs submitted back to back (each on
/// its own stream) both compute the right bytes after `wait`, and a dropped
/// pending replay has finished (its output is complete) when the drop returns.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_graph_submissions_run_in_flight_and_wait() {
    let gpu = backend();
    let program = times3();
    let config = DispatchConfig::linear(blocks_for(N));
    let kernel = gpu.compile(&program, &config).unwrap();
    let record = |x: &vyre_cuda::backend::DeviceBuffer, y: &vyre_cuda::backend::DeviceBuffer| {
        let mut slots = None;
        let graph = gpu
            .record(|rec| {
                let input = rec.upload(x, 4 * N as u64)?;
                rec.dispatch(Dispatch::new(&kernel, &on(&[x, y])).config(&config))?;
                let output = rec.read_back(y, 0, 4 * N as u64)?;
                slots = Some((input, output));
                Ok(())
            })
            .unwrap();
        let (input, output) = slots.unwrap();
        (graph, input, output)
    };
    let buffers: Vec<_> = (0..4).map(|_| gpu.buffer(4 * N as u64).unwrap()).collect();
    let (mut a, a_in, a_out) = record(&buffers[0], &buffers[1]);
    let (mut b, b_in, b_out) = record(&buffers[2], &buffers[3]);
    for round in 0..3u64 {
        let va = random_words(500 + round, N);
        let vb = random_words(600 + round, N);
        a.input_mut(a_in).unwrap().copy_from_slice(&bytes(&va));
        b.input_mut(b_in).unwrap().copy_from_slice(&bytes(&vb));
        let pending_a = a.submit().unwrap();
        let pending_b = b.submit().unwrap();
        let timing_b = pending_b.wait().unwrap();
        if round % 2 == 0 {
            pending_a.wait().unwrap();
        } else {
            drop(pending_a); // waits
        }
        assert!(timing_b.wait_ns <= timing_b.wall_ns, "{timing_b:?}");
        let times3 = |v: &[u32]| v.iter().map(|x| x.wrapping_mul(3)).collect::<Vec<_>>();
        assert_eq!(
            words(a.output(a_out).unwrap()),
            times3(&va),
            "round {round}"
        );
        assert_eq!(
            words(b.output(b_out).unwrap()),
            times3(&vb),
            "round {round}"
        );
    }
}

/// Locks out scalar updates that do not reach every launch node of a step (the
/// second of two fixpoint launches keeping the old value), reach only the first
/// replay, or cost a re-capture or a new module: a graph of `support::add_k` (two
/// launches) and `support::every_scalar_type` gives the reference's bytes after
/// each `set_scalar` of every type, `scalar` reads back what was set, the graph's
/// node count and the module cache do not move, and a refused update (another
/// type) changes nothing. The negative control of the accumulation: had one launch
/// kept the old `k`, the sum would be `k_old + k_new`, not `2 k_new`.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_graph_set_scalar_reaches_every_later_replay() {
    let gpu = backend();
    let config = DispatchConfig::linear(1).with_readback(ReadbackPolicy::None);
    let accumulate = gpu.compile(&support::add_k(), &config).unwrap();
    let every = support::every_scalar_type();
    let typed = gpu.compile(&every, &config).unwrap();
    let acc = gpu.buffer(32).unwrap();
    let outputs: Vec<DeviceBuffer> = every
        .global_buffers()
        .iter()
        .map(|d| gpu.buffer(d.static_size_bytes().unwrap()).unwrap())
        .collect();
    let acc_binding = [Binding::from(&acc)];
    let typed_bindings = support::bindings(&outputs);
    let first = support::every_scalar_value((1, -1, 1.5, false, 1 << 33, -(1 << 33)));
    let mut slots = None;
    let mut graph = gpu
        .record(|rec| {
            let zero = rec.upload(&acc, 32)?;
            let step = Dispatch::new(&accumulate, &acc_binding)
                .config(&config)
                .fixpoint_iterations(2)
                .scalar("k", 3u32);
            let sum_step = rec.dispatch(step)?;
            let sum = rec.read_back(&acc, 0, 32)?;
            let request = Dispatch::new(&typed, &typed_bindings).config(&config);
            let typed_step = rec.dispatch(support::with_scalars(request, &every, &first))?;
            let reads = outputs
                .iter()
                .map(|buffer| rec.read_back(buffer, 0, buffer.len()))
                .collect::<Result<Vec<_>, _>>()?;
            slots = Some((zero, sum_step, sum, typed_step, reads));
            Ok(())
        })
        .unwrap();
    let (zero, sum_step, sum, typed_step, reads) = slots.expect("recorded");
    let nodes = graph.graph_nodes();
    let modules = gpu.cache_stats().module;
    let zeros = support::static_zeros(&every);
    let zero_inputs: Vec<&[u8]> = zeros.iter().map(Vec::as_slice).collect();
    let options = vyre_cuda::reference::ReferenceOptions::default();
    let check = |graph: &mut DispatchGraph, k: u32, values: &[Literal], round: &str| {
        graph.input_mut(zero).unwrap().fill(0);
        graph.replay().unwrap_or_else(|e| panic!("{round}: {e}"));
        assert_eq!(words(graph.output(sum).unwrap()), [2 * k; 8], "{round}: 2k");
        let want = vyre_cuda::reference::run_with_scalars(
            &every,
            &zero_inputs,
            values,
            &DispatchConfig::linear(1),
            &options,
        )
        .unwrap()
        .0;
        for (slot, want) in reads.iter().zip(&want) {
            assert_eq!(
                graph.output(*slot).unwrap(),
                &want[..],
                "{round}: {values:?}"
            );
        }
    };
    check(&mut graph, 3, &first, "recorded values");
    graph.set_scalar(sum_step, "k", 10u32).unwrap();
    let second = support::every_scalar_value((u32::MAX, i32::MIN, -0.0, true, u64::MAX, 7));
    for (decl, &value) in every.scalars().iter().zip(&second) {
        graph.set_scalar(typed_step, &decl.name, value).unwrap();
        assert_eq!(graph.scalar(typed_step, &decl.name).unwrap(), value);
    }
    check(&mut graph, 10, &second, "after set_scalar");
    check(&mut graph, 10, &second, "a second replay");
    let refused = graph.set_scalar(sum_step, "k", 4i32).unwrap_err();
    assert!(refused.to_string().starts_with("Fix:"), "{refused}");
    assert_eq!(graph.scalar(sum_step, "k").unwrap(), Literal::U32(10));
    check(&mut graph, 10, &second, "after a refused update");
    assert_eq!(graph.graph_nodes(), nodes, "no re-capture");
    assert_eq!(gpu.cache_stats().module, modules, "no new module");
}

/// Locks out a `set_launch` whose one write of the launch nodes loses a change
/// (a scalar or the grid that the device then does not see) or makes part of a
/// refused one: the shared assertion
/// (`support::assert_graph_set_launch_changes_all_or_nothing`) on CUDA.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_graph_set_launch_changes_all_or_nothing() {
    let gpu = backend();
    let any = vyre_cuda::backend::AnyBackend::Cuda(gpu.clone());
    support::assert_graph_set_launch_changes_all_or_nothing(&any, &|bytes| {
        gpu.buffer(bytes).unwrap()
    });
}

/// Locks out a kernel fed while it runs that reads the host's words before
/// they are there, or never sees them (`DispatchGraph::replay_feeding` with
/// `Node::AcquireLoad` on host-mapped flags): the shared assertion
/// (`support::assert_graph_feeds_a_running_replay`) over host-mapped data and
/// flags, `beside` waiting 500 µs before it writes, so the kernel polls
/// first; every round's output is computed from that round's words, and the
/// refusals launch nothing. Negative control by hand: leaving the flags set
/// from the round before (no clear) lets the kernel read the earlier round's
/// words, and round 2 fails.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_graph_feeds_a_running_replay() {
    let gpu = backend();
    let any = vyre_cuda::backend::AnyBackend::Cuda(gpu.clone());
    support::assert_graph_feeds_a_running_replay(
        &any,
        &|bytes| gpu.host_mapped_buffer(bytes).unwrap(),
        std::time::Duration::from_micros(500),
    );
}

/// Locks out a graph rebinding that the device ignores, or that keeps holding
/// the buffer it replaced (a caller could then never take that buffer's bytes
/// in place): the shared assertion (`support::assert_graph_rebinds_a_buffer`)
/// over host-mapped destinations on CUDA; then, while the graph binds the
/// first destination, taking it into a `MappedView` is refused; once the
/// graph is rebound to the second, it succeeds, the view holds the first's
/// earlier result, and the next replay writes the second.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_graph_rebinds_a_buffer_without_recapture() {
    let gpu = backend();
    let any = vyre_cuda::backend::AnyBackend::Cuda(gpu.clone());
    let (mut graph, step, [first, second, _third]) =
        support::assert_graph_rebinds_a_buffer(&any, &|bytes| {
            gpu.host_mapped_buffer(bytes).unwrap()
        });
    let (first, refused) = first
        .into_mapped_view()
        .map(|view| view.into_buffer())
        .expect_err("the graph holds the buffer it binds");
    assert!(refused.to_string().starts_with("Fix:"), "{refused}");
    graph.set_buffer(step, 1, &second).unwrap();
    let view = first
        .into_mapped_view()
        .expect("the graph let the replaced buffer go");
    let plus_one: Vec<u32> = (1..=256).collect();
    assert_eq!(words(view.bytes()), plus_one, "the first's earlier result");
    graph.replay().unwrap();
    assert_eq!(
        gpu.read::<u32>(&second).unwrap(),
        plus_one,
        "the second written"
    );
}
