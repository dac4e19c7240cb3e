//! A kernel fault inside a lane, in its own test binary: the trap of a `while` loop
//! past its iteration cap is a sticky fault that destroys the device's primary
//! context for the whole process, like the other fault binaries' faults.

mod support;

use support::watchdog;
use vyre_cuda::backend::{Binding, CudaBackend, Dispatch, LaneOptions};
use vyre_cuda::{CodegenOptions, DispatchConfig};

/// Locks out a fault inside a lane that is swallowed, unnamed, or leaves the lane
/// serving: a lane of a bounded loop (the negative control: the reference's bytes)
/// and a runaway loop capped at 1,000 iterations; the runaway request is a sticky
/// `KernelFault` naming its program, every later request of the lane a `Fix:` error,
/// the backend reports the lost context, and dropping the lane and acquiring the
/// device again neither hangs nor panics.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_lane_kernel_fault_names_the_program_and_ends_the_lane() {
    let _watchdog = watchdog(60, "a fault inside a lane");
    let capped = DispatchConfig::linear(1)
        .with_codegen(CodegenOptions::new().with_max_loop_iterations(Some(1000)));
    let gpu = support::backend();
    let bounded =
        support::counting_program("lane_bounded_while", 0, |gid, n| n.less_than(gid.rem(3u32)));
    let runaway = support::counting_program("lane_runaway_while", 1, |gid, n| {
        gid.equals(0u32).and(n.not_equals(0u32))
    });
    let bounded_kernel = gpu.compile(&bounded, &capped).unwrap();
    let runaway_kernel = gpu.compile(&runaway, &capped).unwrap();
    let lane = gpu
        .lane(&[&bounded_kernel, &runaway_kernel], LaneOptions::new())
        .unwrap();
    let out = [Binding::Zeroed(128)];
    let expected = vyre_cuda::reference::run(&bounded, &[&[0u8; 128]], &capped).unwrap();
    let got = lane.run(Dispatch::new(&bounded_kernel, &out)).unwrap();
    assert_eq!(got.outputs, expected);

    let error = lane.run(Dispatch::new(&runaway_kernel, &out)).unwrap_err();
    support::assert_sticky_fault(&error, "lane_runaway_while");
    assert!(!lane.is_serving());
    let later = lane
        .run(Dispatch::new(&bounded_kernel, &out))
        .unwrap_err()
        .to_string();
    assert!(later.starts_with("Fix:"), "{later}");
    support::assert_reports_context_lost(&gpu);
    drop(lane);
    drop(gpu);
    if let Err(error) = CudaBackend::acquire() {
        assert!(error.to_string().starts_with("Fix:"), "{error}");
    }
}
