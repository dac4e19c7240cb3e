//! Lanes at the edges of their lifetime, in their own test binary: compiling and
//! allocating while a lane runs, and a request that passes its timeout (whose lane is
//! then abandoned with its memory, for the rest of the process: the last test here).
//! Run them one at a time (`--test-threads=1`, in name order): under lazy module
//! loading the abandoned lane makes every later module load of the process a `Fix:`
//! error.

mod support;

use std::time::Duration;

use support::lane::elementwise;
use support::{backend, watchdog};
use vyre_cuda::backend::{Binding, Dispatch, LaneOptions};
use vyre_cuda::ir::*;
use vyre_cuda::DispatchConfig;

/// Locks out a lane that blocks the rest of the backend's life (the host hanging in a
/// driver call that waits for the lane's kernel): with a lane running, compiling a new
/// program either works (eager module loading: then dispatching it eagerly gives the
/// right bytes) or, under lazy module loading (the driver's default since CUDA 12.2,
/// whose kernel loads may wait for every running kernel), is a `Fix:` error naming
/// `CUDA_MODULE_LOADING=EAGER`, never a hang; a program compiled before the lane
/// still compiles (a cache hit) and dispatches eagerly; allocating and freeing
/// buffers and serving lane requests all finish, with the right bytes. Each step
/// prints a line and arms its own watchdog (well under a 60 s outer timeout), so a
/// hang names its step. Run it with and without `CUDA_MODULE_LOADING=EAGER`.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_lane_compiles_and_allocates_while_it_runs() {
    let step = |what: &'static str| {
        eprintln!("gpu_lane_compiles_and_allocates_while_it_runs: {what}");
        watchdog(20, what)
    };
    let guard = step("building the backend, compiling and building the lane");
    let gpu = backend();
    let lazy = gpu.lazy_module_loading();
    eprintln!("  module loading: {}", if lazy { "lazy" } else { "eager" });
    let config = DispatchConfig::linear(1);
    let plus_two = elementwise("compiled_before_the_lane", |x| x + 2u32);
    let kernel = gpu
        .compile(&elementwise("lane_running", |x| x + 1u32), &config)
        .unwrap();
    gpu.compile(&plus_two, &config).unwrap();
    let lane = gpu.lane(&[&kernel], LaneOptions::new()).unwrap();
    drop(guard);
    let guard = step("the lane's first request");
    let x = gpu.buffer_from(&[1u32; 64]).unwrap();
    let bound = [Binding::from(&x), Binding::Zeroed(256)];
    lane.run(Dispatch::new(&kernel, &bound)).unwrap();
    drop(guard);
    let guard = step("compiling a program already compiled (a cache hit) while the lane runs");
    let cached = gpu.compile(&plus_two, &config).unwrap();
    drop(guard);
    let guard = step("an eager dispatch of a kernel compiled before the lane");
    let got = gpu.run(Dispatch::new(&cached, &bound)).unwrap();
    assert_eq!(got.outputs.read::<u32>("y").unwrap(), [3u32; 64]);
    drop(guard);
    let guard = step("compiling a new program (a module load) while the lane runs");
    let fresh = gpu.compile(
        &elementwise("compiled_beside_a_lane", |x| x + 1u32),
        &config,
    );
    drop(guard);
    match fresh {
        Ok(fresh) => {
            assert!(
                !lazy,
                "a module load beside a lane under lazy loading must be refused"
            );
            let _guard = step("an eager dispatch of the program compiled beside the lane");
            let got = gpu.run(Dispatch::new(&fresh, &bound)).unwrap();
            assert_eq!(got.outputs.read::<u32>("y").unwrap(), [2u32; 64]);
        }
        Err(error) => {
            let message = error.to_string();
            assert!(lazy, "refused under eager loading: {message}");
            assert!(
                message.starts_with("Fix:") && message.contains("CUDA_MODULE_LOADING=EAGER"),
                "{message}"
            );
        }
    }
    let guard = step("allocating and freeing while the lane runs");
    for round in 0..20u32 {
        let buffer = gpu.buffer_from(&[round; 64]).unwrap();
        let y = gpu.buffer(256).unwrap();
        let bound = [Binding::from(&buffer), Binding::from(&y)];
        let got = lane.run(Dispatch::new(&kernel, &bound)).unwrap();
        assert_eq!(got.outputs.read::<u32>("y").unwrap(), [round + 1; 64]);
    }
    assert!(
        gpu.deferred_releases().unwrap() >= 40,
        "frees wait for the lane"
    );
    drop(guard);
    let guard = step("stopping the lane");
    lane.stop().unwrap();
    assert_eq!(gpu.deferred_releases().unwrap(), 0);
    drop(guard);
    let _guard = step("compiling a new program after the lane stopped");
    let after = gpu
        .compile(&elementwise("compiled_after_a_lane", |x| x + 1u32), &config)
        .unwrap();
    let got = gpu.run(Dispatch::new(&after, &bound)).unwrap();
    assert_eq!(got.outputs.read::<u32>("y").unwrap(), [2u32; 64]);
}

/// Locks out a host wait that never ends: a request that runs about two seconds on a
/// lane with a 50 ms timeout is an `Err` starting `Fix:` that names the timeout; the
/// lane then refuses every request with a `Fix:` error; stopping it within the
/// timeout fails with a `Fix:` error (its kernel still runs the request, so it is
/// abandoned with its memory) instead of hanging; eager dispatches on the same
/// backend still work.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_lane_times_out_without_hanging() {
    let _watchdog = watchdog(50, "a lane timeout");
    let gpu = backend();
    let slow = Program::builder([1, 1, 1])
        .entry_op_id("lane_two_seconds")
        .buffer(
            "steps",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Static(1),
        )
        .buffer(
            "x",
            1,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(1),
        )
        .body(|b| {
            let acc = b.let_mut("acc", Expr::load("x", 0u32));
            b.loop_("j", 0u32, Expr::load("steps", 0u32), |b, _| {
                b.assign("acc", acc.clone() * 1_664_525u32 + 1_013_904_223u32);
            });
            b.store("x", 0u32, acc.clone());
        })
        .build();
    let config = DispatchConfig::linear(1);
    let kernel = gpu.compile(&slow, &config).unwrap();
    let lane = gpu
        .lane(
            &[&kernel],
            LaneOptions::new().timeout(Duration::from_millis(50)),
        )
        .unwrap();
    let quick = [1u32];
    let x = gpu.buffer_from(&[0u32]).unwrap();
    let bound = [Binding::host(&quick), Binding::from(&x)];
    lane.run(Dispatch::new(&kernel, &bound)).unwrap();
    let long = [800_000_000u32];
    let bound = [Binding::host(&long), Binding::from(&x)];
    let error = lane.run(Dispatch::new(&kernel, &bound)).unwrap_err();
    let message = error.to_string();
    assert!(
        message.starts_with("Fix:") && message.contains("LaneOptions::timeout"),
        "{message}"
    );
    assert!(!lane.is_serving());
    let again = lane
        .run(Dispatch::new(
            &kernel,
            &[Binding::host(&quick), Binding::from(&x)],
        ))
        .unwrap_err()
        .to_string();
    assert!(
        again.starts_with("Fix:") && again.contains("no longer serves"),
        "{again}"
    );
    let stopped = lane.stop().unwrap_err().to_string();
    assert!(
        stopped.starts_with("Fix:") && stopped.contains("did not stop"),
        "{stopped}"
    );
    let y = gpu.buffer_from(&[5u32]).unwrap();
    let eager = gpu
        .run(Dispatch::new(
            &kernel,
            &[Binding::host(&quick), Binding::from(&y)],
        ))
        .unwrap();
    assert_eq!(
        eager.outputs.read::<u32>("x").unwrap(),
        [5u32.wrapping_mul(1_664_525).wrapping_add(1_013_904_223)]
    );
}
