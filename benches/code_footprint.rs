//! What a one-workgroup kernel pays for the distinct code it runs, apart from the
//! instructions themselves: each row runs the same number of dependent arithmetic
//! steps per thread twice, once as straight-line code (every instruction fetched
//! once per launch, run once per warp) and once as a loop over an eighth of that code
//! (an eighth of the distinct instructions, each run eight times), and prints both
//! kernels' own time (`%globaltimer` stamps, median of the rounds) and their
//! difference.
//!
//! Why: the tokenizer's 1 KiB short-text kernel runs about 90 KiB of distinct SASS,
//! each instruction about once per warp (Nsight Compute on an H100, 2026-12-05), and
//! 22.5 % of its warp samples waited for an instruction; whether instruction fetch
//! costs a short kernel microseconds decides whether its steps should be loops
//! rather than code unrolled over a thread's bytes. A row's straight-line kernel has
//! about `steps × 3` SASS instructions (a shift, an XOR and a multiply-add per step:
//! 48 bytes), so 2,048 steps are about 96 KiB.
//!
//! Measured on an H100 (2026-12-05, median of 200): straight-line against looped,
//! 128 steps 2.14 / 2.24 µs, 512 steps 3.74 / 4.13, 1,024 steps 5.92 / 6.56, 2,048
//! steps (about 96 KiB) 10.21 / 11.49, 4,096 steps (192 KiB) 31.52 / 21.54, 8,192
//! steps (384 KiB) 67.39 / 41.18. Up to about 96 KiB of code run once per launch
//! costs nothing (the straight line is even a little faster: no loop counter); past
//! the instruction cache, between 96 and 192 KiB, every warp fetches again. So the
//! short-text kernel's steps stay unrolled.
//!
//! Run: `cargo bench --bench code_footprint` (on the GPU machine:
//! `.gpu/bin/bench-code_footprint`). Without a CUDA device it says so and measures
//! nothing. `VYRE_BENCH_QUICK=1` takes 50 rounds instead of 200.

use vyre_cuda::backend::{Binding, CudaBackend, Dispatch};
use vyre_cuda::ir::{Access, BufferCount, ElemType, Expr, Program};
use vyre_cuda::{DispatchConfig, ReadbackPolicy};

/// Threads of the one workgroup: the short-text kernel's.
const THREADS: u32 = 256;

/// Accumulators each thread keeps, so that steps on different ones issue without
/// waiting for each other.
const ACCUMULATORS: usize = 4;

/// How many times the looped kernel runs its eighth of the steps.
const LOOP_ROUNDS: u32 = 8;

/// The step counts measured.
const STEPS: [u32; 6] = [128, 512, 1024, 2048, 4096, 8192];

/// One step on accumulator `index`: `a = (a ^ (a >> 7)) * K + salt`, which no
/// compiler folds across steps.
fn step(b: &mut vyre_cuda::ir::BlockBuilder, index: usize, salt: Expr) {
    let name = format!("a{index}");
    let value = Expr::var(name.as_str());
    b.assign(
        name.as_str(),
        ((value.clone() ^ (value >> 7u32)) * 0x9E37_79B1u32) + salt,
    );
}

/// A kernel of one workgroup whose threads run `steps` steps: straight-line, or
/// (`looped`) `steps / LOOP_ROUNDS` of them in a loop of `input[0]` rounds (the host
/// writes [`LOOP_ROUNDS`] there, so the loop's count is no constant to unroll).
fn program(steps: u32, looped: bool) -> Program {
    Program::builder([THREADS, 1, 1])
        .buffer(
            "input",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "out",
            1,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            let lid = b.let_("lid", Expr::local_id(vyre_cuda::ir::Axis::X));
            for index in 0..ACCUMULATORS {
                b.let_mut(
                    format!("a{index}"),
                    Expr::load("input", lid.clone() + index as u32),
                );
            }
            if looped {
                let rounds = b.let_("rounds", Expr::load("input", 0u32));
                b.loop_("round", 0u32, rounds, |b, round| {
                    for k in 0..steps / LOOP_ROUNDS {
                        step(b, k as usize % ACCUMULATORS, round.clone() + k);
                    }
                });
            } else {
                for k in 0..steps {
                    step(b, k as usize % ACCUMULATORS, Expr::u32(k));
                }
            }
            let folded = (1..ACCUMULATORS).fold(Expr::var("a0"), |all, index| {
                all ^ Expr::var(format!("a{index}").as_str())
            });
            b.store("out", lid, folded);
        })
        .build()
}

/// The median of the kernel's own time over `rounds` dispatches of `program`, in µs.
fn kernel_microseconds(gpu: &CudaBackend, program: &Program, rounds: usize) -> f64 {
    let config = DispatchConfig::linear(1).with_readback(ReadbackPolicy::None);
    let kernel = gpu.compile(program, &config).expect("compile");
    let input: Vec<u32> = (0..THREADS + ACCUMULATORS as u32)
        .map(|index| if index == 0 { LOOP_ROUNDS } else { index })
        .collect();
    let input_buffer = gpu.buffer_from(&input).expect("input buffer");
    let out = gpu.buffer(u64::from(THREADS) * 4).expect("output buffer");
    let bindings = [Binding::Buffer(&input_buffer), Binding::Buffer(&out)];
    let mut times: Vec<u64> = (0..rounds)
        .map(|_| {
            gpu.run(Dispatch::new(&kernel, &bindings).config(&config))
                .expect("dispatch")
                .timings
                .kernel_stamps_ns
        })
        .collect();
    times.sort_unstable();
    times[times.len() / 2] as f64 / 1e3
}

fn main() {
    let gpu = match CudaBackend::acquire() {
        Ok(gpu) => gpu,
        Err(error) => {
            println!("code_footprint: no CUDA device ({error}); nothing to measure");
            return;
        }
    };
    let rounds = if std::env::var_os("VYRE_BENCH_QUICK").is_some() {
        50
    } else {
        200
    };
    println!(
        "code_footprint: {}, one workgroup of {THREADS} threads, {ACCUMULATORS} accumulators, kernels' own time (median of {rounds})",
        gpu.caps().name
    );
    for steps in STEPS {
        let straight = kernel_microseconds(&gpu, &program(steps, false), rounds);
        let looped = kernel_microseconds(&gpu, &program(steps, true), rounds);
        println!(
            "  {steps:>5} steps (about {:>3} KiB straight): straight-line {straight:>7.2} µs, a loop of {LOOP_ROUNDS} over an eighth {looped:>7.2} µs, straight − looped {:>6.2} µs",
            steps * 48 / 1024,
            straight - looped
        );
    }
}
