//! `CodegenOptions::min_blocks_per_multiprocessor`: the `.minnctapersm` request that
//! lets ptxas cap a result-ABI kernel's registers (its unrolled readback epilogue
//! otherwise pins most kernels at 80 per thread). Checked as text (where the
//! directive goes, exactly when it is asked for), as policy (unsatisfiable requests
//! refused, cache keys apart) and with the real `ptxas -v` (the cap holds).
//! ptxas is found as `support/ptxas.rs` says.

#[path = "support/ptxas.rs"]
mod ptxas;

use std::collections::HashMap;

use vyre_cuda::codegen::{
    multiprocessor_limits, program_to_ptx, program_to_ptx_with_results, CodegenError,
    LaneModuleBuilder, PtxModuleBuilder,
};
use vyre_cuda::ir::{Access, Axis, BufferCount, ElemType, Expr, Program};
use vyre_cuda::{AcquireFence, CodegenOptions};

const DIRECTIVE: &str = ".minnctapersm";

/// A kernel of `threads` threads with a barrier (so it takes the result ABI's
/// counting path, not the one-warp fast path) that doubles `data`.
fn doubling(threads: u32) -> Program {
    Program::builder([threads, 1, 1])
        .buffer(
            "data",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(4096),
        )
        .body(|b| {
            let i = b.let_("i", Expr::global_id(Axis::X));
            b.barrier();
            b.store("data", i.clone(), Expr::load("data", i).mul(2u32));
        })
        .build()
}

fn asking(blocks: Option<u32>) -> CodegenOptions {
    CodegenOptions::new().with_min_blocks_per_multiprocessor(blocks)
}

/// The lines of `ptx` that follow a `.reqntid` line, in order.
fn after_reqntid(ptx: &str) -> Vec<&str> {
    let lines: Vec<&str> = ptx.lines().collect();
    lines
        .windows(2)
        .filter(|pair| pair[0].starts_with(".reqntid "))
        .map(|pair| pair[1])
        .collect()
}

/// Locks out a request that is lost or misplaced (ptxas reads `.minnctapersm` only
/// among the entry's performance directives, between the parameter list and the
/// body) and one that leaks into kernels that did not ask: with `Some(4)` both ABIs
/// carry exactly one `.minnctapersm 4`, on the line after `.reqntid`, and are
/// otherwise the text without it; with `None` (the default) no directive appears.
#[test]
fn the_directive_follows_reqntid_exactly_when_asked() {
    let program = doubling(256);
    for emit in [program_to_ptx, program_to_ptx_with_results] {
        let plain = emit(&program, &CodegenOptions::default(), 90, 32).expect("ptx");
        assert!(!plain.contains(DIRECTIVE), "{plain}");
        let asked = emit(&program, &asking(Some(4)), 90, 32).expect("ptx");
        assert_eq!(asked.matches(DIRECTIVE).count(), 1, "{asked}");
        assert_eq!(after_reqntid(&asked), [".minnctapersm 4"]);
        assert_eq!(asked.replacen(".minnctapersm 4\n", "", 1), plain);
    }
}

/// Locks out a multi-kernel module whose later kernels lose the request, and a lane
/// (whose bodies are device functions of one resident server) that takes it: every
/// entry of a batch module carries it after its `.reqntid`; a lane module's text is
/// the same with or without it.
#[test]
fn batch_entries_carry_the_request_and_a_lane_ignores_it() {
    let mut module = PtxModuleBuilder::with_results(&asking(Some(2)), 90, 32);
    for threads in [256, 512, 1024] {
        module.push(&doubling(threads)).expect("push");
    }
    let text = module.finish();
    assert_eq!(after_reqntid(&text), [".minnctapersm 2"; 3], "{text}");

    let lane = |options: &CodegenOptions| {
        let mut lane = LaneModuleBuilder::new(90, 32, [256, 1, 1]);
        lane.push(&doubling(256), options).expect("lane body");
        lane.finish()
    };
    let with = lane(&asking(Some(4)));
    assert!(!with.contains(DIRECTIVE));
    assert_eq!(with, lane(&CodegenOptions::default()));
}

/// Locks out a request ptxas would silently drop (it only warns when the blocks'
/// threads pass what a multiprocessor holds) and a count of 0: each is refused
/// with a `Fix:` error naming the option, by the single-kernel path and by a
/// module builder (which stays unchanged). Control: the largest counts each target
/// holds are accepted.
#[test]
fn unsatisfiable_requests_are_refused() {
    let refused: [(u32, u32, u32); 6] = [
        // (sm, blocks, threads per block)
        (90, 0, 256),
        (90, 33, 32),
        (90, 9, 256),
        (90, 3, 1024),
        (75, 5, 256),
        (86, 17, 32),
    ];
    for (sm, blocks, threads) in refused {
        let program = doubling(threads);
        let error = program_to_ptx_with_results(&program, &asking(Some(blocks)), sm, 32)
            .expect_err("an unsatisfiable request");
        assert!(
            matches!(error, CodegenError::UnsatisfiableOccupancy { blocks: b, .. } if b == blocks),
            "{error:?}"
        );
        let message = error.to_string();
        assert!(message.starts_with("Fix: "), "{message}");
        assert!(
            message.contains("min_blocks_per_multiprocessor"),
            "{message}"
        );
        let mut module = PtxModuleBuilder::with_results(&asking(Some(blocks)), sm, 32);
        assert!(module.push(&program).is_err());
        assert!(module.is_empty());
    }
    let accepted: [(u32, u32, u32); 6] = [
        (90, 32, 64),
        (90, 8, 256),
        (90, 2, 1024),
        (75, 4, 256),
        (86, 16, 96),
        (89, 24, 64),
    ];
    for (sm, blocks, threads) in accepted {
        assert!(multiprocessor_limits(sm).holds(blocks, threads));
        program_to_ptx_with_results(&doubling(threads), &asking(Some(blocks)), sm, 32)
            .unwrap_or_else(|error| panic!("sm_{sm} {blocks} × {threads}: {error}"));
    }
}

/// Locks out two kernels that differ only in their occupancy request sharing PTX
/// (the backend's PTX and module caches key on `policy_digest`, so do its batch
/// modules): every combination of bounds checks, loop cap, request and acquire
/// fence has its own digest, an unsatisfiable count never shares a valid one's, and options without a
/// request keep the digests they had before the option existed.
#[test]
fn every_request_has_its_own_policy_digest() {
    let mut seen: HashMap<u64, CodegenOptions> = HashMap::new();
    let fences = [AcquireFence::AcquireRelease, AcquireFence::AcquireOnly];
    for (fence, checks) in fences.into_iter().flat_map(|f| [(f, true), (f, false)]) {
        for cap in [None, Some(0), Some(7), Some(u32::MAX)] {
            for blocks in std::iter::once(None).chain((1..=32).map(Some)) {
                let options = CodegenOptions::new()
                    .with_bounds_checks(checks)
                    .with_max_loop_iterations(cap)
                    .with_min_blocks_per_multiprocessor(blocks)
                    .with_acquire_fence(fence);
                if let Some(other) = seen.insert(options.policy_digest(), options) {
                    panic!("{options:?} and {other:?} share a digest");
                }
            }
            for invalid in [0, 33, 63, 64, u32::MAX] {
                let options = CodegenOptions::new()
                    .with_bounds_checks(checks)
                    .with_max_loop_iterations(cap)
                    .with_min_blocks_per_multiprocessor(Some(invalid))
                    .with_acquire_fence(fence);
                assert!(!seen.contains_key(&options.policy_digest()), "{options:?}");
            }
        }
    }
    assert_eq!(CodegenOptions::new().policy_digest(), 0x7679_7265_0001_0001);
    assert_eq!(
        CodegenOptions::new()
            .with_max_loop_iterations(Some(5))
            .policy_digest(),
        0x7679_0102_0000_0005
    );
}

/// Locks out a request ptxas ignores (a misplaced or malformed directive assembles
/// but caps nothing): a 256-thread result-ABI kernel asking for 8 blocks per SM uses
/// at most 32 registers (65536 / (8 × 256)), 4 blocks at most 64. Negative control:
/// the same kernel without the request uses more than 32 (the epilogue's unrolled
/// copies: 80 with ptxas 12.9).
#[test]
fn ptxas_caps_registers_at_the_requested_occupancy() {
    let Some(ptxas) = ptxas::require("ptxas_caps_registers_at_the_requested_occupancy") else {
        return;
    };
    let program = doubling(256);
    let usage = |blocks: Option<u32>| {
        let ptx = program_to_ptx_with_results(&program, &asking(blocks), 90, 32).expect("ptx");
        ptxas::resources(&ptxas, "doubling", &ptx).unwrap_or_else(|report| panic!("{report}"))
    };
    let unrequested = usage(None);
    assert!(unrequested.registers > 32, "{unrequested:?}");
    for blocks in [8, 4] {
        let capped = usage(Some(blocks));
        assert!(
            capped.registers <= 65_536 / (blocks * 256),
            "{blocks}: {capped:?}"
        );
    }
}
