//! Releases that wait for an idle device, deferred while a resident kernel runs.
//!
//! # Why
//!
//! A lane (`backend::lane`) keeps one kernel running for as long as it lives. Some
//! driver calls wait for every kernel of their context to finish before they return:
//! `cuMemFree` of device memory is the documented case (a free between two kernels of
//! different streams serialises them; the CUDA programming guide's "implicit
//! synchronization"), and freeing pinned host memory and unloading a module behave the
//! same way on the drivers we know. Against a kernel that only ends when the host asks
//! it to, such a call never returns: the host hangs. So while any lane of a context
//! runs, the releases this layer makes in that context (device memory, pinned and
//! host-mapped memory, modules) are queued instead, and made when the context's last
//! lane has stopped and its stream was synchronised.
//!
//! Off the lane path this costs one relaxed load of a process-wide count per release.
//! Allocations cannot be deferred, and need not be: allocating device, pinned and
//! host-mapped memory beside a running lane finished on the H200 (driver 580). Module
//! loads cannot be deferred either, and under lazy module loading they wait for the
//! lane: `module` refuses them while [`running_in_current_context`] holds.
//!
//! Not queued, because the driver documents them as returning at once while the
//! device still works: `cuStreamDestroy` ("the function will return immediately and
//! the resources associated with hStream will be released automatically once the
//! device has completed all work"), `cuEventDestroy` (likewise, for an event not yet
//! complete) and `cuGraphExecDestroy` / `cuGraphDestroy` (an executable graph in
//! flight is freed on completion).

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use cudarc::driver::sys;

use super::context::PrimaryContext;

/// Something whose release waits for an idle device.
pub(super) enum Release {
    /// `cuMemFree` of device memory.
    Device(sys::CUdeviceptr),
    /// `cuMemFreeHost` of pinned or host-mapped memory.
    Host(*mut c_void),
    /// `cuModuleUnload`.
    Module(sys::CUmodule),
}

// SAFETY: the handles are plain values owned by the queue until it releases them, in
// the context they belong to, from whichever thread stops the context's last lane.
unsafe impl Send for Release {}

impl Release {
    /// Make the driver call (the handle's context is current).
    fn now(self) {
        // SAFETY: the handle is owned by this value (its owner's drop handed it over)
        // and its context is current; errors are ignored, as on every drop.
        unsafe {
            match self {
                Release::Device(pointer) => {
                    sys::cuMemFree_v2(pointer);
                }
                Release::Host(pointer) => {
                    sys::cuMemFreeHost(pointer);
                }
                Release::Module(module) => {
                    sys::cuModuleUnload(module);
                }
            }
        }
    }
}

/// One context with resident kernels.
struct Resident {
    /// The context handle, as an address.
    context: usize,
    /// Lanes running in it.
    running: usize,
    /// Their blocks, all resident for as long as they run.
    blocks: u64,
    /// Releases queued while they run.
    deferred: Vec<Release>,
}

/// Lanes running in the whole process (the fast path's one load).
static RUNNING: AtomicUsize = AtomicUsize::new(0);
static CONTEXTS: Mutex<Vec<Resident>> = Mutex::new(Vec::new());

fn current_context() -> Option<usize> {
    let mut current = std::ptr::null_mut();
    // SAFETY: writes one handle.
    let status = unsafe { sys::cuCtxGetCurrent(&mut current) };
    (status == sys::CUresult::CUDA_SUCCESS && !current.is_null()).then_some(current as usize)
}

/// Release `release` now, or queue it when a resident kernel runs in the current
/// context. Called from the drops of the handle types.
pub(super) fn release(release: Release) {
    if RUNNING.load(Ordering::Acquire) == 0 {
        release.now();
        return;
    }
    let Some(context) = current_context() else {
        release.now();
        return;
    };
    let mut contexts = CONTEXTS.lock().unwrap_or_else(|p| p.into_inner());
    match contexts
        .iter_mut()
        .find(|resident| resident.context == context && resident.running > 0)
    {
        Some(resident) => resident.deferred.push(release),
        None => {
            drop(contexts);
            release.now();
        }
    }
}

/// Whether a resident kernel runs in the current context (what a module load asks
/// before it is made; one relaxed load when no lane runs anywhere).
pub(super) fn running_in_current_context() -> bool {
    if RUNNING.load(Ordering::Acquire) == 0 {
        return false;
    }
    let Some(context) = current_context() else {
        return false;
    };
    CONTEXTS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .any(|resident| resident.context == context && resident.running > 0)
}

/// A resident kernel of `blocks` blocks is about to start in `context`: from now on
/// releases in it are queued, and its blocks count in [`resident_blocks`].
pub fn resident_started(context: &PrimaryContext, blocks: u32) {
    let context = context.raw as usize;
    let mut contexts = CONTEXTS.lock().unwrap_or_else(|p| p.into_inner());
    match contexts.iter_mut().find(|r| r.context == context) {
        Some(resident) => {
            resident.running += 1;
            resident.blocks += u64::from(blocks);
        }
        None => contexts.push(Resident {
            context,
            running: 1,
            blocks: u64::from(blocks),
            deferred: Vec::new(),
        }),
    }
    RUNNING.fetch_add(1, Ordering::AcqRel);
}

/// Blocks of the resident kernels running in `context` (one atomic load, no lock, when
/// no lane runs anywhere): what a cooperative launch there cannot count on.
pub fn resident_blocks(context: &PrimaryContext) -> u64 {
    if RUNNING.load(Ordering::Acquire) == 0 {
        return 0;
    }
    let context = context.raw as usize;
    CONTEXTS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .find(|resident| resident.context == context)
        .map_or(0, |resident| resident.blocks)
}

/// A resident kernel of `context` of `blocks` blocks has ended (or died with the
/// context). When it was
/// the context's last, the queued releases are made now (the context is bound by the
/// caller), or forgotten when `context_alive` is false (a sticky fault destroyed the
/// context and everything in it).
pub fn resident_stopped(context: &PrimaryContext, blocks: u32, context_alive: bool) {
    let context = context.raw as usize;
    let mut contexts = CONTEXTS.lock().unwrap_or_else(|p| p.into_inner());
    let Some(index) = contexts.iter().position(|r| r.context == context) else {
        return;
    };
    let resident = &mut contexts[index];
    resident.running = resident.running.saturating_sub(1);
    resident.blocks = resident.blocks.saturating_sub(u64::from(blocks));
    RUNNING.fetch_sub(1, Ordering::AcqRel);
    if resident.running > 0 {
        return;
    }
    let deferred = std::mem::take(&mut resident.deferred);
    contexts.swap_remove(index);
    drop(contexts);
    if context_alive {
        for release in deferred {
            release.now();
        }
    }
    // Otherwise the handles died with the context: dropping a `Release` frees nothing.
}

/// Releases queued in the current context (test support).
#[cfg(feature = "testing")]
pub fn deferred_releases() -> usize {
    let Some(context) = current_context() else {
        return 0;
    };
    CONTEXTS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .find(|r| r.context == context)
        .map_or(0, |r| r.deferred.len())
}
