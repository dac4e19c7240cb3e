//! The host's core count, read once per process.
//!
//! # Why this module exists
//!
//! `std::thread::available_parallelism` reads the process's CPU affinity and
//! its cgroup's CPU quota (files under `/proc` and `/sys`) on every call: about
//! 10 µs per call on the 2-core build machine (2026-12-06). The copy pool's
//! lookup asked for it on every call (four or five per copy of 1 MiB or more,
//! two copies per encode), and the CPU batch path once per batch, however
//! small. The count cannot change in a way those callers could use (the copy
//! pool keeps the workers it started with), so it is read once.

use std::sync::OnceLock;

/// The threads this process may run at once (1 where the host does not say).
pub(crate) fn available() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

#[cfg(test)]
mod tests {
    /// Locks out a count that differs from the standard library's (the cache
    /// must only remember it) or is 0 (the pool and the batch path divide work
    /// by it).
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
}
