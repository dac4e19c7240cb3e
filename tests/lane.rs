//! Lanes on the reference backend (`AnyBackend::lane` without a GPU): the same lane
//! rules and request checks as a CUDA lane, with the same `Fix:` messages, and the
//! same answers as a plain `run`. Runs in `cargo test`; `tests/gpu_lane.rs` holds the
//! CUDA lane to the reference on the GPU machine.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use support::lane as lane_programs;
use vyre_cuda::backend::{
    AnyBackend, AnyLane, BackendError, Binding, Dispatch, Kernel, LaneOptions, WaitMode,
    MAX_LANE_CANDIDATES,
};
use vyre_cuda::ir::generate::{valid_program, GeneratorOptions, RandomCase};
use vyre_cuda::ir::{Literal, Program};
use vyre_cuda::{ByteRange, DispatchConfig, ReadbackPolicy};

fn message(result: Result<impl std::fmt::Debug, BackendError>) -> String {
    let error = result.expect_err("a refusal");
    let message = error.to_string();
    assert!(message.starts_with("Fix:"), "{message}");
    message
}

/// Asserts that `lane` answers the request of `kernel` (compiled from `program`)
/// over `bindings` with the scalar values `values` exactly as `backend.run` does,
/// through its `run`, `run_into` and `submit`, and as a program request; returns
/// the outputs.
fn assert_lane_answers_as_run(
    (backend, lane): (&AnyBackend, &AnyLane),
    (kernel, program): (&Kernel, &Program),
    (bindings, config): (&[Binding<'_>], &DispatchConfig),
    values: &[Literal],
    label: &str,
) -> Vec<Vec<u8>> {
    let request =
        support::with_scalars(Dispatch::new(kernel, bindings), program, values).config(config);
    let expected = backend.run(request).unwrap().outputs;
    assert_eq!(lane.run(request).unwrap().outputs, expected, "{label}");
    let mut buffers: Vec<Vec<u8>> = expected.into_vecs();
    let expected_vecs = buffers.clone();
    for buffer in &mut buffers {
        buffer.fill(0xEE);
    }
    let mut slices: Vec<&mut [u8]> = buffers.iter_mut().map(|b| b.as_mut_slice()).collect();
    lane.run_into(request, &mut slices).unwrap();
    assert_eq!(buffers, expected_vecs, "{label}");
    let pending = lane.submit(request).unwrap();
    assert_eq!(pending.wait().unwrap().outputs, expected_vecs, "{label}");
    let by_program =
        support::with_scalars(Dispatch::program(program, bindings), program, values).config(config);
    assert_eq!(
        lane.run(by_program).unwrap().outputs,
        expected_vecs,
        "{label}"
    );
    expected_vecs
}

/// Locks out a reference lane that answers differently from a plain run (so code
/// written against `AnyLane` would see other bytes without a GPU): 80 generated
/// programs, one lane per workgroup shape, give `run`'s outputs through the lane's
/// `run`, `run_into` and `submit`; a program request finds its compiled kernel. A
/// program with scalar parameters runs with its own values and with a second draw
/// through the same lane, and such programs are among the 80.
#[test]
fn a_reference_lane_answers_as_run_does() {
    let backend = AnyBackend::reference();
    let cases: Vec<RandomCase> = (0..80u64)
        .map(|seed| valid_program(30_000 + seed, &GeneratorOptions::default()))
        .collect();
    let mut by_shape: BTreeMap<[u32; 3], Vec<&RandomCase>> = BTreeMap::new();
    for case in &cases {
        by_shape
            .entry(case.program.workgroup_size())
            .or_default()
            .push(case);
    }
    let options = LaneOptions::new()
        .result_bytes(1 << 20)
        .staging_bytes(1 << 20);
    let (mut checked, mut with_scalars) = (0, 0);
    for group in by_shape.values() {
        let kernels: Vec<_> = group
            .iter()
            .map(|case| backend.compile(&case.program, &case.config).unwrap())
            .collect();
        let lane = backend
            .lane(&kernels.iter().collect::<Vec<_>>(), options)
            .unwrap();
        for (case, kernel) in group.iter().zip(&kernels) {
            let bindings = support::host_bindings(&case.inputs);
            for values in support::value_draws(case) {
                assert_lane_answers_as_run(
                    (&backend, &lane),
                    (kernel, &case.program),
                    (&bindings, &case.config),
                    &values,
                    &format!("seed {} (scalars {values:?})", case.seed),
                );
            }
            with_scalars += usize::from(!case.program.scalars().is_empty());
            checked += 1;
        }
    }
    assert_eq!(checked, cases.len());
    assert!(with_scalars > 0, "no generated program has scalars");
}

/// A reference backend, its kernel of `program` (one workgroup) and a lane of that
/// kernel alone.
fn lane_of_one(program: &Program) -> (AnyBackend, Kernel, AnyLane) {
    let backend = AnyBackend::reference();
    let kernel = backend
        .compile(program, &DispatchConfig::linear(1))
        .unwrap();
    let lane = backend.lane(&[&kernel], LaneOptions::new()).unwrap();
    (backend, kernel, lane)
}

/// Locks out a grid-sync dispatch sized for the whole device beside a running
/// lane (on CUDA it would wait for the lane's multiprocessor forever), and a
/// reference backend that answers otherwise than CUDA there: see
/// `support::lane::assert_grid_sync_beside_a_lane_leaves_its_multiprocessors_out`
/// (its negative control: the whole device's grid runs once the lane is gone).
#[test]
fn a_grid_sync_dispatch_beside_a_reference_lane_leaves_its_multiprocessors_out() {
    let reference = vyre_cuda::backend::ReferenceBackend::new();
    let multiprocessors = reference.caps().sm_count;
    lane_programs::assert_grid_sync_beside_a_lane_leaves_its_multiprocessors_out(
        &AnyBackend::Reference(reference),
        multiprocessors,
    );
}

/// Locks out a dispatch graph that cannot hold a grid-sync step, replays it with
/// stale barrier state or an old scalar, or replays a grid that a lane started after
/// the recording leaves no room for (on CUDA that replay would wait forever), and a
/// reference graph that answers otherwise than CUDA there: see
/// `support::lane::assert_grid_sync_graphs_replay_and_leave_a_lanes_multiprocessors_out`
/// (its negative control: the whole device's grid replays once the lane is gone).
#[test]
fn reference_graphs_replay_grid_sync_steps_and_leave_a_lanes_multiprocessors_out() {
    let reference = vyre_cuda::backend::ReferenceBackend::new();
    let multiprocessors = reference.caps().sm_count;
    lane_programs::assert_grid_sync_graphs_replay_and_leave_a_lanes_multiprocessors_out(
        &AnyBackend::Reference(reference),
        multiprocessors,
    );
}

/// Locks out a lane that mishandles a scalar type (a `bool` not reduced to 0 or 1, a
/// 64-bit value cut to 32 bits, a signed value read unsigned, an `f32` read as an
/// integer): a program with one scalar of every type answers through a reference
/// lane as `run` does, for values at both ends of each type, and the first set gives
/// the hand-computed outputs (`u + i`, `s - i`, `f * i`, `b`, `w + i`, `x - i`).
#[test]
fn a_reference_lane_answers_as_run_does_for_every_scalar_type() {
    let program = support::every_scalar_type();
    let config = DispatchConfig::linear(1);
    let (backend, kernel, lane) = lane_of_one(&program);
    let zeros = support::static_zeros(&program);
    let bindings = support::host_bindings(&zeros);
    for (index, set) in lane_programs::EVERY_SCALAR_VALUE_SETS
        .into_iter()
        .enumerate()
    {
        let values = support::every_scalar_value(set);
        let outputs = assert_lane_answers_as_run(
            (&backend, &lane),
            (&kernel, &program),
            (&bindings, &config),
            &values,
            &format!("values {set:?}"),
        );
        if index == 0 {
            let column = |out: usize| &outputs[out][..];
            let thread = 3;
            assert_eq!(support::words(column(0))[thread], 7 + 3);
            assert_eq!(support::words(column(1))[thread] as i32, -3 - 3);
            assert_eq!(f32::from_bits(support::words(column(2))[thread]), 4.5);
            assert_eq!(support::words(column(3))[thread], 1);
            let long = |out: usize| u64::from_le_bytes(column(out)[24..32].try_into().unwrap());
            assert_eq!(long(4), (1 << 40) + 3);
            assert_eq!(long(5) as i64, -(1 << 40) - 3);
        }
    }
}

/// Locks out a lane that serves a request with an earlier request's scalar values
/// (on a CUDA lane: a record cache or "same record" shortcut that ignored the
/// values): one kernel run with `k` = 1, 2, 1, 2 in a row, and the same four
/// submitted back to back, gives `src[i] + k` of each request's own `k`.
#[test]
fn a_reference_lane_follows_scalar_values_request_by_request() {
    let (_, kernel, lane) = lane_of_one(&support::parity::plus_k());
    let source: Vec<u32> = (0..64).collect();
    let bindings = [Binding::host(&source), Binding::zeroed::<u32>(64)];
    lane_programs::assert_plus_k_follows_each_value(
        (&lane, &kernel),
        (&bindings, &source),
        &[1, 2, 1, 2],
        4,
        "reference lane",
    );
}

/// Locks out a check of alternating lane records whose expectations are wrong (so a
/// CUDA failure of `gpu_lane_alternating_records_change_places_exactly` would point
/// at the device while the test was at fault): the reference lane delivers each
/// request's own bytes through the same sequence.
#[test]
fn a_reference_lane_delivers_alternating_records_own_bytes() {
    lane_programs::assert_alternating_records_deliver_their_own_bytes(&AnyBackend::reference());
}

/// Locks out a check of a lane's chained requests in flight whose expectations are
/// wrong (so a CUDA failure of
/// `gpu_multi_block_lane_keeps_requests_apart_with_many_in_flight` would point at the
/// device while the test was at fault): the reference lane, asked for four blocks,
/// serves 48 chained requests of uneven work (4 LCG steps a unit here), eight in flight,
/// and every readback and both buffers at the end are the chain the host computes.
#[test]
fn a_reference_lane_keeps_the_chain_of_requests_in_flight() {
    lane_programs::assert_requests_in_flight_keep_their_chain(&AnyBackend::reference(), 4, 48, 4);
}

/// Locks out a check of a lane shared by more threads than it has slots whose
/// expectations are wrong (so a CUDA failure of
/// `gpu_lane_shared_by_more_threads_than_slots_gives_each_its_own_results` would point
/// at the device while the test was at fault): reference lanes of 1 and 4 slots, each
/// shared by twice as many threads running 30 requests apiece through `run`,
/// `run_into` with a host input and `submit`, give every thread its own words.
#[test]
fn a_reference_lane_shared_by_more_threads_than_slots_gives_each_its_own_results() {
    let backend = AnyBackend::reference();
    for slots in [1, 4] {
        lane_programs::assert_threads_beyond_the_slots_get_their_own_results(&backend, slots, 30);
    }
}

/// Locks out a lane that runs a request missing a scalar value (the body would read
/// whatever the record held) or refuses it in other words than `run`: a missing, a
/// mistyped and an undeclared value are refused by the lane's `run`, `run_into` and
/// `submit` with `run`'s `Fix:` text. Negative control: with both values the same
/// request runs.
#[test]
fn a_lane_refuses_bad_scalar_values_as_run_does() {
    let (backend, kernel, lane) = lane_of_one(&support::parity::plus_k());
    let source = vec![0u32; 64];
    let bindings = [Binding::host(&source), Binding::zeroed::<u32>(64)];
    let config = DispatchConfig::linear(1);
    let request = Dispatch::new(&kernel, &bindings).config(&config);
    let bad = [
        (request.scalar("k", 5u32), "scalar `on`"),
        (request.scalar("k", 5i32).scalar("on", true), "i32"),
        (
            request
                .scalar("k", 5u32)
                .scalar("on", true)
                .scalar("kk", 1u32),
            "kk",
        ),
    ];
    for (request, expected) in bad {
        let refusal = message(backend.run(request).map(drop));
        assert!(refusal.contains(expected), "{refusal}");
        assert_eq!(message(lane.run(request).map(drop)), refusal);
        let mut output = vec![0u8; 256];
        assert_eq!(message(lane.run_into(request, &mut [&mut output])), refusal);
        assert_eq!(message(lane.submit(request).map(drop)), refusal);
    }
    let fine = lane.run(request.scalar("k", 5u32).scalar("on", true));
    assert_eq!(fine.unwrap().outputs.read::<u32>("dst").unwrap()[0], 5);
}

/// Locks out a lane that accepts what a CUDA lane refuses (the reference would then
/// answer a request the GPU errors on): no kernel, two shapes, a grid sync, bad
/// options, a kernel the lane was not built with, a grid it cannot number, more
/// readback than its area or more input than its staging, a kernel of another
/// backend, no memory candidate or more than a lane chooses among. Each is a `Fix:`
/// error naming what to change. Negative control: the same lane runs a request inside
/// every limit, and a lane of every allowed number of memory candidates builds.
#[test]
fn lane_refusals_are_fix_errors() {
    let backend = AnyBackend::reference();
    let config = DispatchConfig::linear(1);
    let increment = backend
        .compile(&lane_programs::increment(), &config)
        .unwrap();
    let triple = backend.compile(&lane_programs::triple(), &config).unwrap();
    let other_shape = backend
        .compile(&lane_programs::store_one([32, 1, 1], false), &config)
        .unwrap();
    let synced = backend
        .compile(&lane_programs::store_one([64, 1, 1], true), &config)
        .unwrap();
    let options = LaneOptions::new();
    assert!(message(backend.lane(&[], options)).contains("at least one kernel"));
    assert!(message(backend.lane(&[&increment, &other_shape], options)).contains("[32, 1, 1]"));
    assert!(message(backend.lane(&[&synced], options)).contains("grid_sync"));
    assert!(
        message(backend.lane(&[&increment], options.timeout(Duration::ZERO))).contains("timeout")
    );
    assert!(message(backend.lane(&[&increment], options.blocks(0))).contains("blocks"));
    for candidates in [0, MAX_LANE_CANDIDATES + 1] {
        let refusal = message(backend.lane(&[&increment], options.memory_candidates(candidates)));
        assert!(
            refusal.starts_with("Fix: LaneOptions::memory_candidates"),
            "{refusal}"
        );
    }
    for candidates in 1..=MAX_LANE_CANDIDATES {
        let lane = backend.lane(&[&increment], options.memory_candidates(candidates));
        assert_eq!(
            lane.map(|lane| lane.options().memory_candidates).ok(),
            Some(candidates)
        );
    }
    assert!(
        message(backend.lane(&[&increment], options.wait(WaitMode::Sleep(Duration::ZERO))))
            .contains("Sleep")
    );
    // 1,024-thread blocks: two per SM of the reference's H200-like device.
    let wide = backend
        .compile(&lane_programs::store_one([1024, 1, 1], false), &config)
        .unwrap();
    assert!(message(backend.lane(&[&wide], options.blocks(1 << 10))).contains("at most 264"));
    assert!(backend.lane(&[&wide], options.blocks(264)).is_ok());
    let foreign = AnyBackend::reference()
        .compile(&lane_programs::increment(), &config)
        .unwrap();
    assert!(message(backend.lane(&[&foreign], options)).contains("another backend"));

    let lane = backend
        .lane(&[&increment], options.result_bytes(256).staging_bytes(256))
        .unwrap();
    let x = vec![7u32; 64];
    let bindings = [Binding::host(&x), Binding::zeroed::<u32>(64)];
    let fine = lane.run(Dispatch::new(&increment, &bindings).readback(&ReadbackPolicy::None));
    assert!(fine.is_ok(), "{fine:?}");
    assert!(
        message(lane.run(Dispatch::new(&triple, &bindings))).contains("is not one of this lane")
    );
    let huge = Dispatch::new(&increment, &bindings)
        .readback(&ReadbackPolicy::None)
        .workgroups([65_535, 65_535, 2]);
    assert!(message(lane.run(huge)).contains("32 bits"));
    // 256 bytes of y do not fit an area of 256 bytes after its header.
    assert!(message(lane.run(Dispatch::new(&increment, &bindings))).contains("result_bytes"));
    let long = vec![7u32; 65];
    let too_much = [Binding::host(&long), Binding::zeroed::<u32>(65)];
    let none = ReadbackPolicy::None;
    assert!(
        message(lane.run(Dispatch::new(&increment, &too_much).readback(&none)))
            .contains("staging_bytes")
    );
    let ranges: ReadbackPolicy = ReadbackPolicy::Ranges(
        (0..65)
            .map(|_| ByteRange {
                binding: 1,
                offset: 0,
                len: 0,
            })
            .collect(),
    );
    assert!(
        message(lane.run(Dispatch::new(&increment, &bindings).readback(&ranges)))
            .contains("at most 64")
    );
}
