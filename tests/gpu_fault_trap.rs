//! A `while` loop stopped by its iteration cap, in its own test binary: the cap's
//! `trap` is a sticky fault that destroys the device's primary context for the whole
//! process, like the other fault binaries' illegal addresses.

mod support;

use vyre_cuda::backend::CudaBackend;
use vyre_cuda::ir::Program;
use vyre_cuda::{CodegenOptions, DispatchConfig};

/// Thread 0 loops until its counter wraps (2^32 iterations, about a second of GPU
/// time), the others leave at once.
fn runaway_program() -> Program {
    support::counting_program("runaway_while", 1, |gid, n| {
        gid.equals(0u32).and(n.not_equals(0u32))
    })
}

/// Locks out an iteration cap that does not stop a runaway loop on the GPU, or whose
/// trap is swallowed or unnamed: with `max_loop_iterations = Some(1000)` the dispatch
/// fails with a sticky `KernelFault` naming the program, the reference interpreter
/// refuses the same dispatch with the cap's `Fix:` error, and the backend reports
/// the lost context. Negative control: the same loop capped at 3 iterations of a
/// program that needs 2 runs to the reference's bytes, on a fresh backend.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_runaway_while_loop_traps_at_the_iteration_cap() {
    let capped = DispatchConfig::linear(1)
        .with_codegen(CodegenOptions::new().with_max_loop_iterations(Some(1000)));
    let program = runaway_program();
    let out = vec![0u8; 128];
    let reference = vyre_cuda::reference::run(&program, &[&out], &capped).unwrap_err();
    assert!(
        reference.message().contains("max_loop_iterations"),
        "{reference}"
    );

    // Negative control first, while the context is healthy: a loop that ends under
    // the cap runs to the reference's bytes.
    let gpu = support::backend();
    let ends = support::counting_program("bounded_while", 0, |gid, n| n.less_than(gid.rem(3u32)));
    let three = DispatchConfig::linear(1)
        .with_codegen(CodegenOptions::new().with_max_loop_iterations(Some(3)));
    let expected = vyre_cuda::reference::run(&ends, &[&out], &three).unwrap();
    assert_eq!(
        support::run_host(&gpu, &ends, &[&out], &three).unwrap(),
        expected
    );

    let error = support::run_host(&gpu, &program, &[&out], &capped).unwrap_err();
    support::assert_sticky_fault(&error, "runaway_while");
    assert!(error.to_string().contains("max_loop_iterations"), "{error}");
    support::assert_reports_context_lost(&gpu);
    drop(gpu);
    // Whatever the driver allows next, acquiring again must not panic.
    if let Err(error) = CudaBackend::acquire() {
        assert!(error.to_string().starts_with("Fix:"), "{error}");
    }
}
