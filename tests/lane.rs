//! Lanes on the reference backend (`AnyBackend::lane` without a GPU): the same lane
//! rules and request checks as a CUDA lane, with the same `Fix:` messages, and the
//! same answers as a plain `run`. Runs in `cargo test`; `tests/gpu_lane.rs` holds the
//! CUDA lane to the reference on the GPU machine.

#[path = "support/lane.rs"]
mod lane_programs;

use std::collections::BTreeMap;
use std::time::Duration;

use vyre_cuda::backend::{AnyBackend, BackendError, Binding, Dispatch, LaneOptions, WaitMode};
use vyre_cuda::ir::generate::{valid_program, GeneratorOptions, RandomCase};
use vyre_cuda::{ByteRange, DispatchConfig, ReadbackPolicy};

fn message(result: Result<impl std::fmt::Debug, BackendError>) -> String {
    let error = result.expect_err("a refusal");
    let message = error.to_string();
    assert!(message.starts_with("Fix:"), "{message}");
    message
}

/// Locks out a reference lane that answers differently from a plain run (so code
/// written against `AnyLane` would see other bytes without a GPU): 80 generated
/// programs, one lane per workgroup shape, give `run`'s outputs through the lane's
/// `run`, `run_into` and `submit`; a program request finds its compiled kernel.
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
    let mut checked = 0;
    for group in by_shape.values() {
        let kernels: Vec<_> = group
            .iter()
            .map(|case| backend.compile(&case.program, &case.config).unwrap())
            .collect();
        let lane = backend
            .lane(&kernels.iter().collect::<Vec<_>>(), options)
            .unwrap();
        for (case, kernel) in group.iter().zip(&kernels) {
            let bindings: Vec<Binding> = case.inputs.iter().map(|v| Binding::Host(v)).collect();
            let request = Dispatch::new(kernel, &bindings).config(&case.config);
            let expected = backend.run(request).unwrap().outputs;
            assert_eq!(
                lane.run(request).unwrap().outputs,
                expected,
                "seed {}",
                case.seed
            );
            let mut buffers: Vec<Vec<u8>> = expected.into_vecs();
            let expected_vecs = buffers.clone();
            for buffer in &mut buffers {
                buffer.fill(0xEE);
            }
            let mut slices: Vec<&mut [u8]> = buffers.iter_mut().map(|b| b.as_mut_slice()).collect();
            lane.run_into(request, &mut slices).unwrap();
            assert_eq!(buffers, expected_vecs, "seed {}", case.seed);
            let pending = lane.submit(request).unwrap();
            assert_eq!(pending.wait().unwrap().outputs, expected_vecs);
            let by_program = Dispatch::program(&case.program, &bindings).config(&case.config);
            assert_eq!(lane.run(by_program).unwrap().outputs, expected_vecs);
            checked += 1;
        }
    }
    assert_eq!(checked, cases.len());
}

/// Locks out a lane that accepts what a CUDA lane refuses (the reference would then
/// answer a request the GPU errors on): no kernel, two shapes, a grid sync, bad
/// options, a kernel the lane was not built with, a grid it cannot number, more
/// readback than its area or more input than its staging, a kernel of another
/// backend. Each is a `Fix:` error naming what to change. Negative control: the same
/// lane runs a request inside every limit.
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
    // 256 bytes of y do not fit an area of 256 bytes with its 32-byte header.
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
