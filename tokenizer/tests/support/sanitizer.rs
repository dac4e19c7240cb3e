//! Test sizes for runs under compute-sanitizer: `scripts/gpu-sanitize`
//! exports `VYRE_UNDER_SANITIZER=1`, and its tools slow the encoder's kernels
//! by one to three orders of magnitude (the merge kernel of a 256 KiB text
//! took 120 ms under memcheck on the H200 instead of 0.1 ms), so a test that
//! encodes or splits thousands of texts would outlast the run's budget. The tools look
//! for memory and synchronisation hazards, which a smaller draw of the same
//! inputs reaches as well; the normal run keeps the full sizes.

/// `normal`, or `sanitized` when this process runs under compute-sanitizer;
/// says which size it chose once per call under the tools.
pub fn sized_for_tools(what: &str, normal: usize, sanitized: usize) -> usize {
    if std::env::var_os("VYRE_UNDER_SANITIZER").is_some_and(|value| value == "1") {
        eprintln!("{what}: {sanitized} instead of {normal} under compute-sanitizer");
        sanitized
    } else {
        normal
    }
}
