//! The host's worker threads: its core count, read once per process, and the
//! persistent pools that the crate's parallel host work runs on.
//!
//! # Why this module exists
//!
//! `std::thread::available_parallelism` reads the process's CPU affinity and
//! its cgroup's CPU quota (files under `/proc` and `/sys`) on every call: about
//! 10 µs per call on the 2-core build machine (2026-12-06). The copy pool's
//! lookup had asked for it on every call (four or five per copy of 1 MiB or
//! more, two copies per device encode) and the CPU batch path once per batch;
//! read once, a 1 MiB device encode took 591 µs instead of 725 on an H100 host
//! (prose; 497 instead of 756 for code; the README has the rows). The count
//! cannot change in a way those callers could use (a pool keeps the workers it
//! started with).
//!
//! Threads are started once and kept, never per call: spawning and joining a
//! thread costs tens of µs in the GPU machine's VM, which for a batch of a few
//! tens of KiB on 16 cores is more than each thread's share of the work (the
//! CPU encoder's `encode_batch` of 16 texts of 4 KiB took 307 µs on this pool
//! against 662 on threads spawned per call, on an H100 machine's 16 host
//! cores, 2026-12-06; 256 texts of 1 KiB 848 against 1,429). Each
//! kind of work has its own pool, so that one never queues behind another (a
//! hand-out queued behind the next chunk's gather had waited up to 4.8 ms: the
//! pipeline's `hand_out_pool` gives that measurement): the copy pool
//! (`device::host_copy`), the hand-out pool (`device::pipeline`) and the CPU
//! encoder's batch pool ([`cpu_batch_pool`]).

use std::sync::OnceLock;

/// The threads this process may run at once (1 where the host does not say).
pub(crate) fn available() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// The pool in `cell`, started on first use with `threads` threads named
/// `vyre-tokenizer-{role}-N`; `None` where they could not be started.
pub(crate) fn persistent_pool(
    cell: &'static OnceLock<Option<rayon::ThreadPool>>,
    threads: usize,
    role: &'static str,
) -> Option<&'static rayon::ThreadPool> {
    cell.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(move |index| format!("vyre-tokenizer-{role}-{index}"))
            .build()
            .ok()
    })
    .as_ref()
}

/// The CPU encoder's batch pool (`Tokenizer::encode_batch` on the CPU): one
/// worker per core, started on first use; `None` where its threads could not
/// be started.
pub(crate) fn cpu_batch_pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    persistent_pool(&POOL, available(), "batch")
}

#[cfg(test)]
mod tests {
    /// Locks out a count that differs from the standard library's (the cache
    /// must only remember it) or is 0 (the pools and the batch path divide
    /// work by it).
    #[test]
    fn the_count_is_the_standard_librarys_and_never_zero() {
        let expected = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(super::available(), expected);
        assert_eq!(
            super::available(),
            expected,
            "a second call reads the cache"
        );
        assert!(super::available() >= 1);
    }

    /// Locks out a pool started per call (the cost this module exists to
    /// avoid): two lookups give the same pool, with a worker per core.
    #[test]
    fn the_batch_pool_is_started_once_with_a_worker_per_core() {
        let first = super::cpu_batch_pool().expect("the batch pool starts");
        let second = super::cpu_batch_pool().expect("the batch pool starts");
        assert!(std::ptr::eq(first, second));
        assert_eq!(first.current_num_threads(), super::available());
    }
}
