//! A kernel fault in a non-blocking submission, in its own test binary (a sticky
//! fault destroys the device's primary context for the whole process).

mod support;

use vyre_cuda::backend::{Binding, Dispatch};

/// Locks out a fault in a pipelined submission that is lost between `submit` and
/// `wait`, blamed on the wrong dispatch, or hidden from the device's other backends
///: with a well-behaved submission in flight first, the faulting
/// one's `wait` returns a sticky `KernelFault` naming its program, and both the
/// submitting backend and a bystander backend of the same device then report the
/// loss. Negative control: the well-behaved submission submitted before the fault
/// waits cleanly with its own output.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_kernel_fault_during_pipelined_submission_is_reported_to_every_backend() {
    let gpu = support::backend();
    let bystander = support::backend();
    let config = support::unchecked_config();

    let fine = support::in_bounds_store_program();
    let fine_kernel = gpu
        .compile(&fine, &vyre_cuda::DispatchConfig::linear(1))
        .unwrap();
    let wild_kernel = gpu
        .compile(&support::wild_store_program(), &config)
        .unwrap();
    let out = [Binding::Zeroed(16)];
    let fine_request = Dispatch::new(&fine_kernel, &out);

    let first = gpu.submit(fine_request).unwrap();
    let done = first.wait().unwrap();
    assert_eq!(
        done.outputs.get("out").unwrap()[..4],
        7u32.to_le_bytes(),
        "negative control"
    );
    assert!(gpu.is_usable() && bystander.is_usable());

    let fine_again = gpu.submit(fine_request).unwrap();
    let faulting = gpu
        .submit(Dispatch::new(&wild_kernel, &out).config(&config))
        .unwrap();
    // The earlier submission may complete or see the fault (the context dies for
    // every stream); it must never panic or report success with wrong bytes.
    match fine_again.wait() {
        Ok(result) => assert_eq!(result.outputs.get("out").unwrap()[..4], 7u32.to_le_bytes()),
        Err(error) => assert!(error.to_string().starts_with("Fix:"), "{error}"),
    }
    let err = faulting.wait().unwrap_err();
    support::assert_sticky_fault(&err, "wild_store");
    support::assert_reports_context_lost(&gpu);
    support::assert_reports_context_lost(&bystander);
}
