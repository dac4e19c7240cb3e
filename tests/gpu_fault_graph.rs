//! A kernel fault during a graph replay, in its own test binary (a sticky fault
//! destroys the device's primary context for the whole process).

mod support;

use vyre_cuda::backend::{Binding, Dispatch};
use vyre_cuda::DispatchConfig;

/// Locks out a fault inside a replayed graph that is swallowed, reported as a
/// driver error without the program's name, or left unnoticed by the device's other
/// backends: the replay returns a sticky `KernelFault` naming the
/// recorded program, the recording backend refuses further work, and a second
/// backend of the same device, which never ran the graph, reports the loss too.
/// Negative control: before the fault, the same graph shape over a well-behaved
/// program replays cleanly and both backends are usable.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_kernel_fault_during_graph_replay_is_reported_to_every_backend() {
    let gpu = support::backend();
    let bystander = support::backend();
    let config = support::unchecked_config();

    // Negative control: the same graph over an in-bounds program replays.
    let fine = support::in_bounds_store_program();
    let out = gpu.buffer(16).unwrap();
    let fine_kernel = gpu.compile(&fine, &DispatchConfig::linear(1)).unwrap();
    let mut fine_graph = gpu
        .record(|rec| {
            rec.dispatch(Dispatch::new(&fine_kernel, &[Binding::from(&out)]))?;
            Ok(())
        })
        .unwrap();
    fine_graph.replay().unwrap();
    assert!(gpu.is_usable() && bystander.is_usable());

    let kernel = gpu
        .compile(&support::wild_store_program(), &config)
        .unwrap();
    let mut graph = gpu
        .record(|rec| {
            rec.dispatch(Dispatch::new(&kernel, &[Binding::from(&out)]).config(&config))?;
            Ok(())
        })
        .unwrap();
    let err = graph.replay().unwrap_err();
    support::assert_sticky_fault(&err, "wild_store");
    support::assert_reports_context_lost(&gpu);
    support::assert_reports_context_lost(&bystander);
    assert!(
        graph.replay().is_err(),
        "a graph of a lost context replayed"
    );
}
