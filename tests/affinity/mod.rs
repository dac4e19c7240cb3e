//! Thread CPU affinity through the C library std already links (no new dependency),
//! shared by the host-cost self-tests and instruments that plant interference: they pin
//! the measuring thread and a competitor to one CPU. Linux only.
#![allow(dead_code)]

/// `cpu_set_t`: 1024 bits.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CpuSet([u64; 16]);

extern "C" {
    fn sched_getaffinity(pid: i32, size: usize, mask: *mut CpuSet) -> i32;
    fn sched_setaffinity(pid: i32, size: usize, mask: *const CpuSet) -> i32;
    fn sched_getcpu() -> i32;
}

/// The calling thread's affinity mask.
pub fn get() -> Option<CpuSet> {
    let mut set = CpuSet([0; 16]);
    // SAFETY: pid 0 is the calling thread; the kernel writes at most
    // `size_of::<CpuSet>()` bytes into `set`, a live, exclusively borrowed value.
    let status = unsafe { sched_getaffinity(0, std::mem::size_of::<CpuSet>(), &mut set) };
    (status == 0).then_some(set)
}

/// Restricts the calling thread to `set`.
pub fn set(set: &CpuSet) -> bool {
    // SAFETY: pid 0 is the calling thread; the kernel only reads
    // `size_of::<CpuSet>()` bytes from `set`, which is live for the call.
    unsafe { sched_setaffinity(0, std::mem::size_of::<CpuSet>(), set) == 0 }
}

/// Restricts the calling thread to CPU `cpu` (below 1024).
pub fn pin(cpu: usize) -> bool {
    if cpu >= 1024 {
        return false;
    }
    let mut one = CpuSet([0; 16]);
    one.0[cpu / 64] = 1 << (cpu % 64);
    set(&one)
}

/// The CPU the calling thread runs on now.
pub fn current_cpu() -> Option<usize> {
    // SAFETY: `sched_getcpu` takes no arguments and only returns a number.
    let cpu = unsafe { sched_getcpu() };
    usize::try_from(cpu).ok()
}

/// Pins the calling thread to the CPU it runs on; returns that CPU.
pub fn pin_here() -> Option<usize> {
    let cpu = current_cpu()?;
    pin(cpu).then_some(cpu)
}
