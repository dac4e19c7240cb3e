//! GPU test of `CudaBackend::submit_kernel_after`: a dependent dispatch enqueued
//! at once behind another, waited for with one blocking synchronize. Ignored by
//! default; run on the GPU machine with `bash .gpu/run.sh gpu_`.

mod support;

use support::{triple_plus_one, triple_plus_one_program, words};
use vyre_cuda::backend::thread_driver_calls;
use vyre_cuda::{DispatchConfig, ReadbackPolicy};

const WORDS: u32 = 1 << 20;
const ROUNDS: u32 = 500;

/// Locks out a chained submission that is not ordered on the device, or that
/// still waits on the host: the second dispatch reads what the first wrote
/// (every word right), its device window starts after the first one's ends, and
/// submitting both costs no synchronize (the waits: one blocking, one idle).
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_submit_after_orders_a_dependent_dispatch_on_the_device() {
    let gpu = support::backend();
    let config = DispatchConfig::linear(WORDS / 256).with_readback(ReadbackPolicy::None);
    let slow = gpu
        .compile(&triple_plus_one_program(ROUNDS), &config)
        .unwrap();
    let fast = gpu.compile(&triple_plus_one_program(1), &config).unwrap();
    let input: Vec<u8> = (0..WORDS).flat_map(|i| i.to_le_bytes()).collect();
    let source = gpu.buffer_from(&input).unwrap();
    let middle = gpu.buffer(4 * WORDS as u64).unwrap();
    let mut last = gpu.host_mapped_buffer(4 * WORDS as u64).unwrap();
    let expected: Vec<u32> = (0..WORDS).map(|i| triple_plus_one(i, ROUNDS + 1)).collect();
    let clock = gpu.device_clock().unwrap();
    for round in 0..3 {
        let before = thread_driver_calls();
        let first = gpu
            .submit_kernel_timed(&slow, &[source.binding(), middle.binding()], &config)
            .unwrap();
        let second = gpu
            .submit_kernel_after_timed(&first, &fast, &[middle.binding(), last.binding()], &config)
            .unwrap();
        assert_eq!(
            thread_driver_calls().synchronizes - before.synchronizes,
            0,
            "submitting waits for nothing"
        );
        let (_, second_spans) = second.wait_spans(&clock).unwrap();
        let (_, first_spans) = first.wait_spans(&clock).unwrap();
        assert!(
            second_spans.window_start_ns >= first_spans.window_end_ns,
            "round {round}: the second dispatch started at {} ns, before the first ended at {} ns",
            second_spans.window_start_ns,
            first_spans.window_end_ns
        );
        assert!(
            words(last.mapped_bytes().unwrap()) == expected,
            "round {round}: the second dispatch read unfinished words"
        );
        last.mapped_bytes_mut().unwrap().fill(0);
    }
}
