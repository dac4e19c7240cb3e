//! Lanes at the edges of their lifetime, in their own test binary: compiling and
//! allocating while a lane runs, and a request that passes its timeout (whose lane is
//! then abandoned with its memory, for the rest of the process: the last test here).

mod support;

use std::time::Duration;

use support::lane::elementwise;
use support::{backend, watchdog};
use vyre_cuda::backend::{Binding, Dispatch, LaneOptions};
use vyre_cuda::ir::*;
use vyre_cuda::DispatchConfig;

/// Locks out a lane that blocks the rest of the backend's life (the host hanging in a
/// driver call that waits for the lane's kernel): with a lane running, compiling a new
/// program (a module load), dispatching it eagerly, allocating and freeing buffers
/// and serving lane requests all finish, with the right bytes. The watchdog ends the
/// process with the phase that hung if one does.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_lane_compiles_and_allocates_while_it_runs() {
    let gpu = backend();
    let config = DispatchConfig::linear(1);
    let kernel = gpu
        .compile(&elementwise("lane_running", |x| x + 1u32), &config)
        .unwrap();
    let lane = gpu.lane(&[&kernel], LaneOptions::new()).unwrap();
    let x = gpu.buffer_from(&[1u32; 64]).unwrap();
    let bound = [Binding::from(&x), Binding::Zeroed(256)];
    lane.run(Dispatch::new(&kernel, &bound)).unwrap();
    {
        let _watchdog = watchdog(60, "a module load while a lane runs");
        let fresh = gpu
            .compile(
                &elementwise("compiled_beside_a_lane", |x| x + 1u32),
                &config,
            )
            .unwrap();
        let got = gpu.run(Dispatch::new(&fresh, &bound)).unwrap();
        assert_eq!(got.outputs.read::<u32>("y").unwrap(), [2u32; 64]);
    }
    {
        let _watchdog = watchdog(60, "allocating and freeing while a lane runs");
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
    }
    let _watchdog = watchdog(60, "stopping a lane");
    lane.stop().unwrap();
    assert_eq!(gpu.deferred_releases().unwrap(), 0);
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
    let _watchdog = watchdog(60, "a lane timeout");
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
