//! Programs and checks the lane tests share, CPU and GPU binaries alike (through
//! `support::lane`).
#![allow(dead_code)]

use std::collections::VecDeque;

use vyre_cuda::backend::{
    AnyBackend, AnyLane, Binding, Dispatch, Kernel, LaneOptions, PendingDispatch,
};
use vyre_cuda::ir::{Access, Axis, BufferCount, ElemType, Expr, Program, ScalarType};
use vyre_cuda::{ByteRange, DispatchConfig, ReadbackPolicy};

use super::U32Buffer;

/// Values of [`super::every_scalar_type`]'s scalars (for [`super::every_scalar_value`])
/// at both ends of each type: a value cut to 32 bits, read unsigned or as another
/// type shows in one of them.
pub const EVERY_SCALAR_VALUE_SETS: [(u32, i32, f32, bool, u64, i64); 3] = [
    (7, -3, 1.5, true, 1 << 40, -(1 << 40)),
    (0, i32::MIN, -0.0, false, u64::MAX, i64::MIN),
    (u32::MAX, i32::MAX, f32::MAX, true, 0, i64::MAX),
];

/// Asserts that `lane`, holding `kernel` of [`super::parity::plus_k`], follows the
/// scalar `k` request by request over `bindings` (`src` holding `source`, then
/// `dst`): each `k` of `ks` run in turn, then the first `in_flight` of them submitted
/// back to back, give `src[i] + k` of their own `k`.
pub fn assert_plus_k_follows_each_value(
    (lane, kernel): (&AnyLane, &Kernel),
    (bindings, source): (&[Binding<'_>], &[u32]),
    ks: &[u32],
    in_flight: usize,
    label: &str,
) {
    let config = DispatchConfig::linear(1);
    let request = |k: u32| {
        Dispatch::new(kernel, bindings)
            .config(&config)
            .scalar("k", k)
            .scalar("on", true)
    };
    let expected = |k: u32| source.iter().map(|v| v + k).collect::<Vec<u32>>();
    let dst = |finished: vyre_cuda::backend::Finished| finished.outputs.read::<u32>("dst");
    for (round, &k) in ks.iter().enumerate() {
        let got = lane.run(request(k)).and_then(dst);
        assert_eq!(got.unwrap(), expected(k), "{label}: round {round}, k {k}");
    }
    let pending: Vec<_> = ks
        .iter()
        .take(in_flight)
        .map(|&k| (k, lane.submit(request(k)).unwrap()))
        .collect();
    for (k, pending) in pending {
        let got = pending.wait().and_then(dst);
        assert_eq!(got.unwrap(), expected(k), "{label}: submitted k {k}");
    }
}

/// Asserts that lanes of 1, 2 and 4 slots on `backend`, holding [`super::parity::plus_k`],
/// deliver each request's own bytes while two requests whose records differ in the
/// value of `k` and in length (one reads `dst` whole, the other two ranges of it: one
/// readback entry more) alternate, with a repeat and a third record between them: on
/// a CUDA lane alternation takes the blocks' earlier record copy (an exchange of as
/// many chunks as the longer record has), the repeat the held copy, the third record a
/// reload or its slot's copy. Every delivery is `src[i] + k` of its own `k` over its
/// own ranges.
pub fn assert_alternating_records_deliver_their_own_bytes(backend: &AnyBackend) {
    let config = DispatchConfig::linear(1);
    let plus_k = backend.compile(&super::parity::plus_k(), &config).unwrap();
    let source: Vec<u32> = (0..64).map(|i| i * 1000 + 7).collect();
    let src = backend.buffer_from(&source).unwrap();
    let dst = backend.buffer(4 * 64).unwrap();
    let bound = [Binding::from(&src), Binding::from(&dst)];
    let spans = [(8usize, 20usize), (100, 64)];
    let ranges = ReadbackPolicy::Ranges(
        spans
            .iter()
            .map(|&(offset, len)| ByteRange {
                binding: 1,
                offset: offset as u64,
                len: len as u64,
            })
            .collect(),
    );
    // (k, whether it reads the two ranges instead of `dst` whole)
    let sequence = [
        (1, false),
        (2, true),
        (1, false),
        (2, true),
        (2, true),
        (1, false),
        (3, false),
        (1, false),
        (3, false),
        (1, false),
        (2, true),
    ];
    for slots in [1, 2, 4] {
        let lane = backend
            .lane(&[&plus_k], LaneOptions::new().slots(slots))
            .unwrap();
        for (round, &(k, ranged)) in sequence.iter().enumerate() {
            let request = Dispatch::new(&plus_k, &bound)
                .config(&config)
                .scalar("k", k)
                .scalar("on", true);
            let request = if ranged {
                request.readback(&ranges)
            } else {
                request
            };
            let bytes: Vec<u8> = source.iter().flat_map(|v| (v + k).to_le_bytes()).collect();
            let expected: Vec<Vec<u8>> = if ranged {
                spans
                    .iter()
                    .map(|&(offset, len)| bytes[offset..offset + len].to_vec())
                    .collect()
            } else {
                vec![bytes]
            };
            let got = lane.run(request).unwrap().outputs.into_vecs();
            assert_eq!(got, expected, "{slots} slots, round {round}, k {k}");
        }
    }
}

/// Threads of one workgroup of [`uneven_step`].
const STEP_THREADS: u32 = 64;
/// Workgroups of one request of [`uneven_step`]: two on each block of a lane of four.
const STEP_GROUPS: u32 = 8;

/// `dst[i] = lcg(src[n - 1 - i], workgroup_id.x · work) + request · 0x9E3779B9` over
/// 64-thread workgroups: workgroup `w` loops `w · work` times, so on a lane of four
/// blocks block 0 (workgroups 0 and 4) finishes long before block 3 (3 and 7), and each
/// workgroup reads what the mirrored workgroup (on another block) wrote in `src`.
pub fn uneven_step() -> Program {
    Program::builder([STEP_THREADS, 1, 1])
        .entry_op_id("lane_uneven_step")
        .u32_buffer("src", 0, Access::ReadOnly, BufferCount::Runtime)
        .u32_buffer("dst", 1, Access::ReadWrite, BufferCount::Runtime)
        .scalar("request", ScalarType::U32)
        .scalar("work", ScalarType::U32)
        .body(|b| {
            let i = b.let_("i", Expr::global_id(Axis::X));
            b.if_(i.clone().less_than(Expr::length("dst")), |b| {
                let mirrored = Expr::length("src") - 1u32 - i.clone();
                let acc = b.let_mut("acc", Expr::load("src", mirrored));
                let steps = Expr::workgroup_id(Axis::X) * Expr::scalar("work");
                b.loop_("k", 0u32, steps, |b, _| {
                    b.assign("acc", acc.clone() * 1_664_525u32 + 1_013_904_223u32);
                });
                let salt = Expr::scalar("request") * 0x9E37_79B9u32;
                b.store("dst", i.clone(), acc.clone() + salt);
            });
        })
        .build()
}

/// `(a, c)` with `steps` LCG steps of [`uneven_step`] equal to `x -> a · x + c`
/// (wrapping), so the host's expected values cost one multiply-add a word.
fn lcg_map(steps: u32) -> (u32, u32) {
    (0..steps).fold((1u32, 0u32), |(a, c), _| {
        (
            a.wrapping_mul(1_664_525),
            c.wrapping_mul(1_664_525).wrapping_add(1_013_904_223),
        )
    })
}

/// What [`uneven_step`] request `request` writes into `dst` from `src`, with the
/// [`lcg_map`] of each workgroup in `maps`.
fn uneven_step_expected(src: &[u32], request: u32, maps: &[(u32, u32)]) -> Vec<u32> {
    let n = src.len();
    (0..n)
        .map(|i| {
            let (a, c) = maps[i / STEP_THREADS as usize];
            a.wrapping_mul(src[n - 1 - i])
                .wrapping_add(c)
                .wrapping_add(request.wrapping_mul(0x9E37_79B9))
        })
        .collect()
}

/// Asserts that a lane of `blocks` blocks and eight slots on `backend` keeps `requests`
/// requests of [`uneven_step`] (`work` LCG steps a unit) apart while eight are in
/// flight at all times (each submitted before the oldest is waited for, so the server
/// finds the next doorbell rung as soon as it is done). Request `r` reads the buffer
/// request `r - 1` wrote (mirrored: each workgroup reads another block's words) and
/// writes the buffer request `r - 1` read, with a salt of its own; every third runs two
/// fixpoint iterations (a lane-wide barrier inside the request). The host orders none of
/// them (a lane's own requests skip each other in the order book), so only the server's
/// order keeps the chain: every request's readback and both buffers at the end must be
/// the chain the host computes from the first buffer alone. The salt and the mirrored
/// reads make each request's words differ from the request before's and from the same
/// request's over stale input, so a request that ran early or late shows.
pub fn assert_requests_in_flight_keep_their_chain(
    backend: &AnyBackend,
    blocks: u32,
    requests: u32,
    work: u32,
) {
    const IN_FLIGHT: usize = 8;
    let config = DispatchConfig::new([STEP_GROUPS, 1, 1]);
    let kernel = backend.compile(&uneven_step(), &config).unwrap();
    let words = (STEP_GROUPS * STEP_THREADS) as usize;
    let first: Vec<u32> = (0..words as u32)
        .map(|i| i.wrapping_mul(2_654_435_761) ^ 0x5555_5555)
        .collect();
    let buffers = [
        backend.buffer_from(&first).unwrap(),
        backend.buffer_from(&vec![0u32; words]).unwrap(),
    ];
    let mut expected = [first, vec![0u32; words]];
    let maps: Vec<(u32, u32)> = (0..STEP_GROUPS).map(|w| lcg_map(w * work)).collect();
    let twice = config.clone().with_fixpoint_iterations(2);
    let lane = backend
        .lane(
            &[&kernel],
            LaneOptions::new().blocks(blocks).slots(IN_FLIGHT as u32),
        )
        .unwrap_or_else(|e| panic!("build a lane of {blocks} blocks: {e}"));
    let check = |(request, pending, want): (u32, PendingDispatch, Vec<u32>)| {
        let finished = pending
            .wait()
            .unwrap_or_else(|e| panic!("request {request}: {e}"));
        let got = finished.outputs.read::<u32>("dst").unwrap();
        assert_eq!(got.len(), want.len(), "request {request}");
        if let Some(at) = got.iter().zip(&want).position(|(got, want)| got != want) {
            panic!(
                "request {request}: word {at} (workgroup {}) is {:#x} where the chain gives {:#x}",
                at / STEP_THREADS as usize,
                got[at],
                want[at]
            );
        }
    };
    let mut pending = VecDeque::with_capacity(IN_FLIGHT);
    for request in 0..requests {
        if pending.len() == IN_FLIGHT {
            check(pending.pop_front().expect("a request in flight"));
        }
        let (src, dst) = ((request % 2) as usize, ((request + 1) % 2) as usize);
        let bound = [Binding::from(&buffers[src]), Binding::from(&buffers[dst])];
        let request_config = if request % 3 == 0 { &twice } else { &config };
        let submitted = lane
            .submit(
                Dispatch::new(&kernel, &bound)
                    .config(request_config)
                    .scalar("request", request)
                    .scalar("work", work),
            )
            .unwrap_or_else(|e| panic!("submitting request {request}: {e}"));
        let want = uneven_step_expected(&expected[src], request, &maps);
        expected[dst].clone_from(&want);
        pending.push_back((request, submitted, want));
    }
    pending.into_iter().for_each(check);
    for (index, (buffer, want)) in buffers.iter().zip(&expected).enumerate() {
        assert_eq!(
            &backend.read::<u32>(buffer).unwrap(),
            want,
            "buffer {index}"
        );
    }
    drop(lane);
}

/// `result`'s value, or a panic naming `what`.
fn ok<T, E: std::fmt::Display>(result: Result<T, E>, what: &str) -> T {
    result.unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// Asserts that a lane of `slots` slots on `backend`, holding [`super::parity::plus_k`]
/// and shared by twice as many threads, gives every thread its own results: each
/// thread runs `requests` requests with a `k` of its own per request (so every record
/// differs from the one before), over its own device buffers through `run`, over a host
/// input of its own (staged in the slot) and a zeroed output through `run_into`, and
/// over its own buffers through `submit` and `wait`, in turn, and checks every word
/// (`src[i] + k`). More threads than slots find their slot busy (on a CUDA lane they
/// wait for its delivery); a slot handed on before delivery overwrites the doorbell or
/// staging of a request the server has not read (a hang: the watchdog, or the lane's
/// timeout; or another request's inputs: a wrong word here), and a refusal of a busy
/// slot fails the request.
pub fn assert_threads_beyond_the_slots_get_their_own_results(
    backend: &AnyBackend,
    slots: u32,
    requests: u32,
) {
    const WORDS: u32 = 64;
    let config = DispatchConfig::linear(1);
    let kernel = backend.compile(&super::parity::plus_k(), &config).unwrap();
    let threads = 2 * slots;
    let sources: Vec<Vec<u32>> = (0..threads)
        .map(|thread| (0..WORDS).map(|i| (thread << 24) | (i * 7919)).collect())
        .collect();
    // Every buffer before the lane: beside it only the pool's transients are made.
    let buffers: Vec<_> = sources
        .iter()
        .map(|source| {
            let src = backend.buffer_from(source).unwrap();
            (src, backend.buffer(4 * u64::from(WORDS)).unwrap())
        })
        .collect();
    let lane = backend
        .lane(&[&kernel], LaneOptions::new().slots(slots))
        .unwrap_or_else(|e| panic!("build a lane of {slots} slots: {e}"));
    let check = |got: &[u32], input: &[u32], k: u32, what: &str| {
        assert_eq!(got.len(), input.len(), "{what}");
        if let Some(at) = (0..got.len()).find(|&i| got[i] != input[i].wrapping_add(k)) {
            panic!(
                "{what}: word {at} is {:#x} where its own request gives {:#x}",
                got[at],
                input[at].wrapping_add(k)
            );
        }
    };
    std::thread::scope(|scope| {
        for (thread, (source, (src, dst))) in (0u32..).zip(sources.iter().zip(&buffers)) {
            let (lane, kernel, config, check) = (&lane, &kernel, &config, &check);
            scope.spawn(move || {
                let owned = [Binding::from(src), Binding::from(dst)];
                let mut host = vec![0u32; WORDS as usize];
                let mut out = vec![0u8; 4 * WORDS as usize];
                for round in 0..requests {
                    let k = (thread << 20) | round;
                    let what = format!("{slots} slots, thread {thread}, round {round}");
                    let request = |bindings| {
                        Dispatch::new(kernel, bindings)
                            .config(config)
                            .scalar("k", k)
                            .scalar("on", true)
                    };
                    match round % 3 {
                        0 => {
                            let finished = ok(lane.run(request(&owned)), &what);
                            check(
                                &finished.outputs.read::<u32>("dst").unwrap(),
                                source,
                                k,
                                &what,
                            );
                        }
                        1 => {
                            for (word, &value) in host.iter_mut().zip(source) {
                                *word = value ^ round.wrapping_mul(0x9E37_79B9);
                            }
                            let staged =
                                [Binding::host(&host), Binding::zeroed::<u32>(WORDS.into())];
                            ok(lane.run_into(request(&staged), &mut [&mut out]), &what);
                            let got: Vec<u32> = out
                                .chunks_exact(4)
                                .map(|word| u32::from_le_bytes(word.try_into().unwrap()))
                                .collect();
                            check(&got, &host, k, &what);
                        }
                        _ => {
                            let pending = ok(lane.submit(request(&owned)), &what);
                            let finished = ok(pending.wait(), &what);
                            check(
                                &finished.outputs.read::<u32>("dst").unwrap(),
                                source,
                                k,
                                &what,
                            );
                        }
                    }
                }
            });
        }
    });
    drop(lane);
}

/// `y[i] = f(x[i])` over 64-thread workgroups (`x` read-only, `y` write-only), named
/// `name`.
pub fn elementwise(name: &str, f: fn(Expr) -> Expr) -> Program {
    Program::builder([64, 1, 1])
        .entry_op_id(name)
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
            b.if_(i.clone().less_than(Expr::length("x")), |b| {
                b.store("y", i.clone(), f(Expr::load("x", i.clone())));
            });
        })
        .build()
}

/// `y[i] = x[i] + 1`.
pub fn increment() -> Program {
    elementwise("lane_increment", |x| x + 1u32)
}

/// `y[i] = x[i] * 3`.
pub fn triple() -> Program {
    elementwise("lane_triple", |x| x * 3u32)
}

/// `x[local_id.x] = 1` in workgroups of `shape`, after a grid sync when asked: a
/// kernel a lane of another shape, or any lane, refuses.
pub fn store_one(shape: [u32; 3], grid_sync: bool) -> Program {
    Program::builder(shape)
        .buffer(
            "x",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            if grid_sync {
                b.grid_sync();
            }
            b.store("x", Expr::local_id(Axis::X), 1u32);
        })
        .build()
}

/// Asserts that `error` is `GridTooLargeForGridSync` with a `Fix:` message.
fn assert_grid_too_large(error: vyre_cuda::backend::BackendError) {
    assert!(
        matches!(
            error,
            vyre_cuda::backend::BackendError::GridTooLargeForGridSync { .. }
        ) && error.to_string().starts_with("Fix:"),
        "{error}"
    );
}

/// A grid-sync exchange over `32 · workgroups` threads: each writes `data[g] = 3g + k`,
/// the grid syncs, and each stores into `out[g]` the word another workgroup wrote,
/// `data[(g + 32) mod n]`; without a working grid sync `out` reads stale words.
pub fn grid_exchange() -> Program {
    Program::builder([32, 1, 1])
        .buffer(
            "data",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "out",
            1,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .scalar("k", ScalarType::U32)
        .body(|b| {
            let g = b.let_("g", Expr::global_id(Axis::X));
            let n = b.let_("n", Expr::workgroup_count(Axis::X) * 32u32);
            b.store("data", g.clone(), g.clone() * 3u32 + Expr::scalar("k"));
            b.grid_sync();
            b.store("out", g.clone(), Expr::load("data", (g + 32u32) % n));
        })
        .build()
}

/// What [`grid_exchange`] leaves in `out` over `workgroups` workgroups with `k`.
fn exchanged(workgroups: u32, k: u32) -> Vec<u32> {
    let n = 32 * workgroups;
    (0..n).map(|g| (g + 32) % n * 3 + k).collect()
}

/// Asserts that a dispatch graph replays a grid-sync step as an eager dispatch runs
/// it, and that every replay checks its grid against the device as it is then: a
/// recorded [`grid_exchange`] over the whole device (the kernel's
/// `max_coresident_workgroups`) gives the exchanged words, again after its scalar
/// changes (so each replay starts from the barrier word the one before left, and the
/// update reaches the cooperative node), and over fewer workgroups after
/// `set_workgroups`; beside a one-block lane, started after the recording, a replay
/// of the whole device's grid is `GridTooLargeForGridSync` (a `Fix:` error where the
/// cooperative launch would have waited for the lane forever) and so is growing a
/// step's grid past what the lane leaves, while a grid within it replays; once the
/// lane is dropped, the whole device's grid replays again.
pub fn assert_grid_sync_graphs_replay_and_leave_a_lanes_multiprocessors_out(
    backend: &AnyBackend,
    multiprocessors: u32,
) {
    let config = DispatchConfig::linear(1);
    let exchange = backend.compile(&grid_exchange(), &config).unwrap();
    let plain = backend.compile(&increment(), &config).unwrap();
    let most = backend.coresident_workgroups(&exchange).unwrap();
    let most_u32 = u32::try_from(most).unwrap();
    let words = 32 * most;
    let data = backend.buffer(4 * words).unwrap();
    let out = backend.buffer(4 * words).unwrap();
    let bindings = [Binding::Buffer(&data), Binding::Buffer(&out)];
    let out_words = |workgroups: u32| -> Vec<u32> {
        backend.read::<u32>(&out).unwrap()[..32 * workgroups as usize].to_vec()
    };
    backend
        .run(
            Dispatch::new(&exchange, &bindings)
                .workgroups([most_u32, 1, 1])
                .scalar("k", 5u32)
                .readback(&ReadbackPolicy::None),
        )
        .unwrap();
    assert_eq!(out_words(most_u32), exchanged(most_u32, 5), "eager");
    let mut step = None;
    let mut graph = backend
        .record(|recorder| {
            step = Some(
                recorder.dispatch(
                    Dispatch::new(&exchange, &bindings)
                        .workgroups([most_u32, 1, 1])
                        .scalar("k", 7u32),
                )?,
            );
            Ok(())
        })
        .unwrap();
    let step = step.unwrap();
    graph.replay().unwrap();
    assert_eq!(out_words(most_u32), exchanged(most_u32, 7), "first replay");
    graph.set_scalar(step, "k", 9u32).unwrap();
    graph.replay().unwrap();
    assert_eq!(
        out_words(most_u32),
        exchanged(most_u32, 9),
        "after set_scalar"
    );
    let fewer = most_u32.div_ceil(2);
    graph.set_workgroups(step, [fewer, 1, 1]).unwrap();
    graph.replay().unwrap();
    assert_eq!(
        out_words(fewer),
        exchanged(fewer, 9),
        "after set_workgroups"
    );
    graph.set_workgroups(step, [most_u32, 1, 1]).unwrap();

    let lane = backend.lane(&[&plain], LaneOptions::new()).unwrap();
    let beside = backend.coresident_workgroups(&exchange).unwrap();
    assert_eq!(beside, most - most.div_ceil(u64::from(multiprocessors)));
    assert_grid_too_large(graph.replay().unwrap_err());
    let within = u32::try_from(beside).unwrap();
    graph.set_workgroups(step, [within, 1, 1]).unwrap();
    graph.set_scalar(step, "k", 11u32).unwrap();
    graph.replay().unwrap();
    assert_eq!(out_words(within), exchanged(within, 11), "beside the lane");
    assert_grid_too_large(graph.set_workgroups(step, [most_u32, 1, 1]).unwrap_err());
    drop(lane);
    graph.set_workgroups(step, [most_u32, 1, 1]).unwrap();
    graph.replay().unwrap();
    assert_eq!(
        out_words(most_u32),
        exchanged(most_u32, 11),
        "after the lane"
    );
}

/// Asserts that a grid-sync dispatch beside a running lane of `backend` (a device of
/// `multiprocessors` multiprocessors) leaves the lane's multiprocessors out, as a
/// cooperative grid must (every workgroup resident at once, and a lane's block may
/// hold its multiprocessor for as long as the lane runs): alone the most workgroups
/// are the kernel's `max_coresident_workgroups`; beside a one-block lane they are one
/// multiprocessor's worth (rounded up) fewer, a grid of the whole device is
/// `GridTooLargeForGridSync` (a `Fix:` error, where a launch would have waited for
/// the lane forever) and one within the rest runs; once the lane is dropped, the
/// whole device's grid runs again. A kernel without grid sync has no such bound.
pub fn assert_grid_sync_beside_a_lane_leaves_its_multiprocessors_out(
    backend: &AnyBackend,
    multiprocessors: u32,
) {
    let config = DispatchConfig::linear(1);
    let grid_sync = backend
        .compile(&store_one([32, 1, 1], true), &config)
        .unwrap();
    let most = grid_sync.max_coresident_workgroups().unwrap();
    assert_eq!(backend.coresident_workgroups(&grid_sync), Some(most));
    let plain = backend.compile(&increment(), &config).unwrap();
    assert_eq!(backend.coresident_workgroups(&plain), None);
    let out = backend.buffer(4 * 32).unwrap();
    let run = |workgroups: u64| {
        backend
            .run(
                Dispatch::new(&grid_sync, &[Binding::Buffer(&out)])
                    .workgroups([workgroups as u32, 1, 1])
                    .readback(&ReadbackPolicy::None),
            )
            .map(|_| ())
    };
    let lane = backend.lane(&[&plain], LaneOptions::new()).unwrap();
    let beside = backend.coresident_workgroups(&grid_sync).unwrap();
    assert_eq!(beside, most - most.div_ceil(u64::from(multiprocessors)));
    assert_grid_too_large(run(most).unwrap_err());
    run(beside).unwrap();
    drop(lane);
    assert_eq!(backend.coresident_workgroups(&grid_sync), Some(most));
    run(most).unwrap();
}
