//! GPU test of `CudaBackend::submit_kernel_after`: a dependent dispatch enqueued
//! at once behind another, waited for with one blocking synchronize. Ignored by
//! default; run on the GPU machine with `bash .gpu/run.sh gpu_`.

mod support;

use vyre_cuda::backend::thread_driver_calls;
use vyre_cuda::ir::{Access, Axis, BufferCount, ElemType, Expr, Program};
use vyre_cuda::{DispatchConfig, ReadbackPolicy};

const WORDS: u32 = 1 << 20;
const ROUNDS: u32 = 500;

/// `to[i] = from[i] * 3 + 1`, repeated `rounds` times in a loop (so the first
/// kernel runs long enough that an unordered second one would overlap it).
fn step(rounds: u32) -> Program {
    Program::builder([256, 1, 1])
        .buffer(
            "from",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "to",
            1,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            let i = b.let_("i", Expr::global_id(Axis::X));
            b.if_(i.clone().less_than(Expr::length("to")), |b| {
                let value = b.let_mut("value", Expr::load("from", i.clone()));
                b.loop_("round", 0u32, rounds, |b, _| {
                    b.assign("value", value.clone() * 3u32 + 1u32);
                });
                b.store("to", i.clone(), value);
            });
        })
        .build()
}

/// Locks out a chained submission that is not ordered on the device, or that
/// still waits on the host: the second dispatch reads what the first wrote
/// (every word right), its device window starts after the first one's ends, and
/// submitting both costs no synchronize (the waits: one blocking, one idle).
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_submit_after_orders_a_dependent_dispatch_on_the_device() {
    let gpu = support::backend();
    let config = DispatchConfig::linear(WORDS / 256).with_readback(ReadbackPolicy::None);
    let slow = gpu.compile(&step(ROUNDS), &config).unwrap();
    let fast = gpu.compile(&step(1), &config).unwrap();
    let input: Vec<u8> = (0..WORDS).flat_map(|i| i.to_le_bytes()).collect();
    let source = gpu.buffer_from(&input).unwrap();
    let middle = gpu.buffer(4 * WORDS as u64).unwrap();
    let mut last = gpu.host_mapped_buffer(4 * WORDS as u64).unwrap();
    let expected: Vec<u32> = (0..WORDS)
        .map(|i| {
            let mut value = i;
            for _ in 0..ROUNDS {
                value = value.wrapping_mul(3).wrapping_add(1);
            }
            value.wrapping_mul(3).wrapping_add(1)
        })
        .collect();
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
        let words: Vec<u32> = last
            .mapped_bytes()
            .unwrap()
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert!(
            words == expected,
            "round {round}: the second dispatch read unfinished words"
        );
        last.mapped_bytes_mut().unwrap().fill(0);
    }
}
