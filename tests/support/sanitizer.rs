//! Test sizes for runs under compute-sanitizer, shared by the root crate's GPU
//! tests and the tokenizer's (which include this file by path):
//! `scripts/gpu-sanitize` exports `VYRE_UNDER_SANITIZER=1`, and its tools slow
//! kernels by one to three orders of magnitude and every launch by tens of
//! milliseconds (the tokenizer's merge kernel of a 256 KiB text took 120 ms under
//! memcheck on the H200 instead of 0.1 ms; cl100k's 100 KiB runs spent 237 s in
//! kernels), so a test that encodes thousands of texts or makes ten thousand
//! dispatches would outlast the run's budget. The tools look for memory and
//! synchronisation hazards, which a smaller draw of the same inputs reaches as
//! well; the normal run keeps the full sizes.
#![allow(dead_code)]

/// Whether this process runs under compute-sanitizer (`VYRE_UNDER_SANITIZER=1`).
pub fn under_sanitizer() -> bool {
    std::env::var_os("VYRE_UNDER_SANITIZER").is_some_and(|value| value == "1")
}

/// `normal`, or `sanitized` when this process runs under compute-sanitizer;
/// says which size it chose once per call under the tools.
pub fn sized_for_tools(what: &str, normal: usize, sanitized: usize) -> usize {
    if under_sanitizer() {
        eprintln!("{what}: {sanitized} instead of {normal} under compute-sanitizer");
        sanitized
    } else {
        normal
    }
}
