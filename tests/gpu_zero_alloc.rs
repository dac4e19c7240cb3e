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
/// request itself included); a negative control (`run`, which returns owned
/// outputs) shows the counter does see allocations.
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
    // Negative control: the Vec-returning API allocates, and the counter sees it.
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    gpu.run(Dispatch::new(&kernel, &bindings).config(&config))
        .unwrap();
    assert!(
        ALLOCATIONS.load(Ordering::Relaxed) > before,
        "counter must see allocations"
    );
}
