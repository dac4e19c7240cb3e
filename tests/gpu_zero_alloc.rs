//! The warm dispatch path makes no heap allocation, proven with a counting global
//! allocator (in its own test binary so no other test's allocations interfere).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use vyre_cuda::backend::{Binding, CudaBackend, Dispatch};
use vyre_cuda::fixtures::{host_cost_fixture, host_cost_fixture_expected};
use vyre_cuda::DispatchConfig;

struct Counting;
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Locks out heap allocation on the hot path: 1,000 warm `run_into` requests of a
/// compiled kernel over device buffers into caller buffers allocate nothing (the
/// request itself included), and 1,000 more of a kernel with four scalar parameters,
/// each request with new values (the values live inline in the request and the
/// launch parameters); a negative control (`run`, which returns owned outputs) shows
/// the counter does see allocations. Then a lane's warm requests at 9 and 17 buffers:
/// `run_into` allocates nothing, `run` once per request (its outputs' bytes). (One
/// test: the counter is the process's.)
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_warm_kernel_dispatch_into_makes_no_heap_allocation() {
    let gpu = CudaBackend::acquire().expect("needs a CUDA device");
    let program = host_cost_fixture(9, 64);
    let config = DispatchConfig::linear(1);
    let kernel = gpu.compile(&program, &config).unwrap();
    let mut buffers = Vec::new();
    for (i, b) in program.global_buffers().iter().enumerate() {
        let buffer = gpu.buffer(b.static_size_bytes().unwrap()).unwrap();
        let mut init = [0u32; 4];
        if i == 0 {
            init[0] = 9;
        }
        gpu.upload(&buffer, &init).unwrap();
        buffers.push(buffer);
    }
    let bindings: Vec<Binding> = buffers.iter().map(Binding::from).collect();
    let mut storage = [[0u8; 16]; 8];
    for _ in 0..5 {
        let mut outs: Vec<&mut [u8]> = storage.iter_mut().map(|s| &mut s[..]).collect();
        gpu.run_into(Dispatch::new(&kernel, &bindings).config(&config), &mut outs)
            .unwrap();
    }
    let [s0, s1, s2, s3, s4, s5, s6, s7] = &mut storage;
    let mut outs: [&mut [u8]; 8] = [s0, s1, s2, s3, s4, s5, s6, s7];
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for _ in 0..1000 {
        gpu.run_into(Dispatch::new(&kernel, &bindings).config(&config), &mut outs)
            .unwrap();
    }
    let during = ALLOCATIONS.load(Ordering::Relaxed) - before;
    assert_eq!(
        during, 0,
        "the warm path allocated {during} times in 1,000 dispatches"
    );
    assert_eq!(
        u32::from_le_bytes(outs[0][..4].try_into().unwrap()),
        host_cost_fixture_expected(9, 64)
    );
    // The same with scalar values: `out[0] = in[0] + a + u32(b) + u32(c) + u32(d)`
    // over the two-buffer fixture's `in` and `out`.
    use vyre_cuda::ir::*;
    let mut with_scalars = Program::builder([1, 1, 1]);
    for decl in host_cost_fixture(2, 0).buffers() {
        with_scalars = with_scalars.buffer_decl(decl.clone());
    }
    let with_scalars = with_scalars
        .scalar("a", ScalarType::U32)
        .scalar("b", ScalarType::I32)
        .scalar("c", ScalarType::F32)
        .scalar("d", ScalarType::U64)
        .body(|b| {
            let sum = Expr::load("in", 0u32)
                + Expr::scalar("a")
                + Expr::scalar("b").cast(ScalarType::U32)
                + Expr::scalar("c").cast(ScalarType::U32)
                + Expr::scalar("d").cast(ScalarType::U32);
            b.store("out", 0u32, sum);
        })
        .build();
    let scalar_kernel = gpu.compile(&with_scalars, &config).unwrap();
    let scalar_buffers = [
        gpu.buffer_from(&[5u32, 0, 0, 0]).unwrap(),
        gpu.buffer(16).unwrap(),
    ];
    let scalar_bindings = [
        Binding::from(&scalar_buffers[0]),
        Binding::from(&scalar_buffers[1]),
    ];
    let request = |round: u32| {
        Dispatch::new(&scalar_kernel, &scalar_bindings)
            .config(&config)
            .scalar("a", round)
            .scalar("b", 2i32)
            .scalar("c", 3.0f32)
            .scalar("d", 4u64)
    };
    let mut out = [0u8; 16];
    for round in 0..5 {
        gpu.run_into(request(round), &mut [&mut out]).unwrap();
    }
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let mut last = 0;
    for round in 0..1000 {
        gpu.run_into(request(round), &mut [&mut out]).unwrap();
        last = u32::from_le_bytes(out[..4].try_into().unwrap());
        assert_eq!(last, 5 + round + 2 + 3 + 4);
    }
    let during = ALLOCATIONS.load(Ordering::Relaxed) - before;
    assert_eq!(
        during, 0,
        "the warm path with scalar values allocated {during} times in 1,000 dispatches"
    );
    assert_eq!(last, 5 + 999 + 9);
    // Negative control: the Vec-returning API allocates, and the counter sees it.
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    gpu.run(Dispatch::new(&kernel, &bindings).config(&config))
        .unwrap();
    assert!(
        ALLOCATIONS.load(Ordering::Relaxed) > before,
        "counter must see allocations"
    );
    for buffers in [9, 17] {
        lane_requests_allocate_only_their_outputs(&gpu, buffers);
    }
}

/// A lane's warm requests of the dispatch bench's `(buffers, 62 nodes)` fixture over
/// device buffers: 1,000 `run_into` into caller buffers allocate nothing, 1,000 `run`
/// allocate once each (the returned outputs' bytes), every answer checked.
fn lane_requests_allocate_only_their_outputs(gpu: &CudaBackend, buffers: u32) {
    use vyre_cuda::backend::LaneOptions;
    use vyre_cuda::fixtures::chain_for_nodes;
    let chain = chain_for_nodes(62);
    let program = host_cost_fixture(buffers, chain);
    let config = DispatchConfig::linear(1);
    // Compiled, and its buffers made, before the lane: a module load beside a running
    // lane may be refused.
    let kernel = gpu.compile(&program, &config).unwrap();
    let handles: Vec<_> = program
        .global_buffers()
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let buffer = gpu.buffer(b.static_size_bytes().unwrap()).unwrap();
            gpu.upload(&buffer, &[if i == 0 { 9u32 } else { 0 }, 0, 0, 0])
                .unwrap();
            buffer
        })
        .collect();
    let bindings: Vec<Binding> = handles.iter().map(Binding::from).collect();
    let lane = gpu.lane(&[&kernel], LaneOptions::new()).unwrap();
    let request = Dispatch::new(&kernel, &bindings).config(&config);
    let expected = host_cost_fixture_expected(9, chain);
    let reads = buffers as usize - 1;
    let mut storage = vec![[0u8; 16]; reads];
    for _ in 0..5 {
        lane.run(request).unwrap();
    }
    let mut outs: Vec<&mut [u8]> = storage.iter_mut().map(|s| &mut s[..]).collect();
    lane.run_into(request, &mut outs).unwrap();
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for _ in 0..1000 {
        lane.run_into(request, &mut outs).unwrap();
    }
    let during = ALLOCATIONS.load(Ordering::Relaxed) - before;
    assert_eq!(
        during, 0,
        "a lane's run_into at {buffers} buffers allocated {during} times in 1,000 requests"
    );
    assert_eq!(
        u32::from_le_bytes(outs[0][..4].try_into().unwrap()),
        expected
    );
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let mut first = 0;
    for _ in 0..1000 {
        let finished = lane.run(request).unwrap();
        first = u32::from_le_bytes(finished.outputs.item(0).unwrap()[..4].try_into().unwrap());
    }
    let during = ALLOCATIONS.load(Ordering::Relaxed) - before;
    assert_eq!(
        during, 1000,
        "a lane's run at {buffers} buffers allocated {during} times in 1,000 requests (one each \
         is the outputs' bytes)"
    );
    assert_eq!(first, expected);
    lane.stop().unwrap();
}
