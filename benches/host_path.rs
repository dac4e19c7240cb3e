//! The warm dispatch loop of the measurement fixture over device buffers at 2, 9 and
//! 17 buffers (every output read back), for counting the host's own work per
//! dispatch: `scripts/host-path` runs it against a stand-in driver whose calls return
//! at once (`scripts/host-path-stub.c`), on a machine without a GPU, and counts its
//! instructions with callgrind (repeatable where wall time is not). On a GPU machine
//! it times whole dispatches instead (the `dispatch` bench puts those against the
//! raw-driver floors).
//!
//! Paths: `program` (`run` of a program request), `kernel` (`run` of a kernel
//! request), `host` (`run` of a kernel request over host bytes: planned every time),
//! `into` (`run_into` of a kernel request, caller buffers).
//!
//! Run: `cargo bench --bench host_path` prints the per-dispatch time of each path and
//! shape (minimum of 9 rotated rounds) beside the floor measured in the same rounds,
//! one raw launch + sync of the same kernel (`RawFloor`): against the stand-in driver
//! a path's distance above the floor is the backend's own host work; on a GPU its
//! ratio to the floor is the `dispatch` bench's figure. `host_path count BUFFERS PATH
//! CALLS` makes CALLS dispatches of one path after one warm one (what callgrind counts).
//! After the table, the host's phases of lane requests at the same shapes (medians:
//! before the doorbell, the wait, after the last result word); against the stand-in a
//! host thread serves the lane. Lanes have no `count` path: the host spins on the
//! serving thread, which callgrind's one-thread-at-a-time scheduling makes a count of
//! its turns, not of the host's work.

use std::time::Instant;

use vyre_cuda::backend::floor::RawFloor;
use vyre_cuda::backend::{Binding, CudaBackend, DeviceBuffer, Dispatch, Kernel, LaneOptions};
use vyre_cuda::fixtures::{chain_for_nodes, host_cost_fixture};
use vyre_cuda::ir::Program;
use vyre_cuda::DispatchConfig;

const PATHS: [&str; 4] = ["program", "kernel", "host", "into"];

/// The floor's place in the rotation, after the four paths.
const FLOOR: usize = PATHS.len();

/// One shape of the fixture, compiled, with its device buffers and host inputs.
struct Shape {
    program: Program,
    kernel: Kernel,
    buffers: Vec<DeviceBuffer>,
    inputs: Vec<Vec<u8>>,
    config: DispatchConfig,
}

impl Shape {
    fn new(gpu: &CudaBackend, buffers: u32) -> Shape {
        let program = host_cost_fixture(buffers, chain_for_nodes(64));
        let config = DispatchConfig::linear(1);
        let kernel = gpu.compile(&program, &config).expect("compile");
        let inputs: Vec<Vec<u8>> = program
            .global_buffers()
            .iter()
            .map(|b| vec![1u8; b.static_size_bytes().unwrap_or(16) as usize])
            .collect();
        let buffers = inputs
            .iter()
            .map(|bytes| gpu.buffer_from(bytes).expect("buffer"))
            .collect();
        Shape {
            program,
            kernel,
            buffers,
            inputs,
            config,
        }
    }

    /// The bindings of its device buffers, and of its inputs as host bytes.
    fn bindings(&self) -> (Vec<Binding<'_>>, Vec<Binding<'_>>) {
        (
            self.buffers.iter().map(Binding::from).collect(),
            self.inputs.iter().map(|v| Binding::Host(v)).collect(),
        )
    }
}

/// One dispatch of `path` of `shape` over `bound` (its device buffers) or `host` (its
/// inputs as host bytes), `run_into` writing into `outs`; returns a byte of the
/// output, so nothing is elided.
fn dispatch(
    gpu: &CudaBackend,
    shape: &Shape,
    path: &str,
    (bound, host): (&[Binding<'_>], &[Binding<'_>]),
    outs: &mut [&mut [u8]],
) -> u64 {
    let first = |finished: vyre_cuda::backend::Finished| {
        finished.outputs.item(0).map_or(0, |item| item[0] as u64)
    };
    let kernel = Dispatch::new(&shape.kernel, bound).config(&shape.config);
    match path {
        "program" => first(
            gpu.run(Dispatch::program(&shape.program, bound).config(&shape.config))
                .expect("run"),
        ),
        "kernel" => first(gpu.run(kernel).expect("run")),
        "host" => first(
            gpu.run(Dispatch::new(&shape.kernel, host).config(&shape.config))
                .expect("run"),
        ),
        _ => {
            gpu.run_into(kernel, outs)
                .expect("run_into")
                .kernel_stamps_ns
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let gpu = CudaBackend::acquire().expect("a CUDA driver (or the stand-in of scripts/host-path)");
    if args.first().map(String::as_str) == Some("count") {
        let buffers: u32 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(17);
        let path = args.get(2).map_or("program", String::as_str);
        let calls: u32 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1000);
        let shape = Shape::new(&gpu, buffers);
        let (bound, host) = shape.bindings();
        let mut outs = vec![[0u8; 16]; buffers as usize - 1];
        let mut slices: Vec<&mut [u8]> = outs.iter_mut().map(|o| &mut o[..]).collect();
        let mut sink = dispatch(&gpu, &shape, path, (&bound, &host), &mut slices);
        for _ in 0..calls {
            sink ^= dispatch(&gpu, &shape, path, (&bound, &host), &mut slices);
        }
        std::hint::black_box(sink);
        return;
    }
    println!("per dispatch, µs, minimum of 9 rotated rounds × 2,000 calls:");
    println!(
        "{:>8} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "buffers", "floor", PATHS[0], PATHS[1], PATHS[2], PATHS[3]
    );
    for buffers in [2u32, 9, 17] {
        let shape = Shape::new(&gpu, buffers);
        let (bound, host) = shape.bindings();
        let mut outs = vec![[0u8; 16]; buffers as usize - 1];
        let mut slices: Vec<&mut [u8]> = outs.iter_mut().map(|o| &mut o[..]).collect();
        let mut floor = RawFloor::new(&gpu, &shape.program, [1, 1, 1]).expect("raw floor");
        let mut best = [f64::INFINITY; PATHS.len() + 1];
        let mut sink = 0u64;
        for round in 0..9 {
            for k in 0..best.len() {
                let index = (k + round) % best.len();
                let mut once = || match PATHS.get(index) {
                    Some(path) => dispatch(&gpu, &shape, path, (&bound, &host), &mut slices),
                    None => floor.launch_sync().expect("floor"),
                };
                sink ^= once();
                let start = Instant::now();
                for _ in 0..2000 {
                    sink ^= once();
                }
                let per_call = start.elapsed().as_secs_f64() * 1e6 / 2000.0;
                best[index] = best[index].min(per_call);
            }
        }
        std::hint::black_box(sink);
        println!(
            "{buffers:>8} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
            best[FLOOR], best[0], best[1], best[2], best[3]
        );
    }
    lane_phases(&gpu);
}

/// The host's phases of a lane request (`Lane::run` over the shape's device buffers,
/// every output read back), medians of 20,000: before the doorbell (enqueue), the
/// wait for every result word, and after the last word arrived (delivery). Against
/// the stand-in driver a host thread serves the lane (`scripts/host-path-stub.c`), so
/// the enqueue and the delivery are the host's own work per request, and they show
/// what each binding and each output adds; on a GPU they are the dispatch bench's
/// host phases.
fn lane_phases(gpu: &CudaBackend) {
    const CALLS: usize = 20_000;
    println!("lane requests (Lane::run), medians of {CALLS}, µs:");
    println!(
        "{:>8} {:>9} {:>9} {:>9} {:>9}",
        "buffers", "enqueue", "wait", "delivery", "whole"
    );
    for buffers in [2u32, 9, 17] {
        let shape = Shape::new(gpu, buffers);
        let (bound, _) = shape.bindings();
        let lane = gpu
            .lane(&[&shape.kernel], LaneOptions::new())
            .expect("build a lane");
        let request = Dispatch::new(&shape.kernel, &bound).config(&shape.config);
        let mut phases: [Vec<u64>; 4] = std::array::from_fn(|_| Vec::with_capacity(CALLS));
        for call in 0..CALLS + 100 {
            let timings = lane.run(request).expect("lane request").timings;
            if call < 100 {
                continue;
            }
            let delivery = timings
                .wall_ns
                .saturating_sub(timings.enqueue_ns + timings.wait_ns);
            for (samples, ns) in phases.iter_mut().zip([
                timings.enqueue_ns,
                timings.wait_ns,
                delivery,
                timings.wall_ns,
            ]) {
                samples.push(ns);
            }
        }
        let median = |samples: &mut Vec<u64>| {
            samples.sort_unstable();
            samples[samples.len() / 2] as f64 / 1e3
        };
        let [enqueue, wait, delivery, whole] = &mut phases;
        println!(
            "{buffers:>8} {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
            median(enqueue),
            median(wait),
            median(delivery),
            median(whole)
        );
    }
}
