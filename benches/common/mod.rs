//! What the `harness = false` benches share: their ABBA options and the one-line row
//! they print per paired comparison.

use std::time::Duration;

use vyre_cuda::host_cost::{PairOptions, Paired};

/// Paired options of every bench: 60 ms regions (15 ms probes), 12 ABBA rounds;
/// `VYRE_BENCH_QUICK` shortens them to 20 ms (5 ms), 10 rounds.
pub fn options() -> PairOptions {
    if std::env::var_os("VYRE_BENCH_QUICK").is_some() {
        PairOptions::with_targets(Duration::from_millis(20), Duration::from_millis(5), 10)
    } else {
        PairOptions::with_targets(Duration::from_millis(60), Duration::from_millis(15), 12)
    }
}

/// One comparison as a line: arm A is the floor, arm B is named `b_label`; the name
/// padded to `name_width`, the median ratio with `ratio_digits` decimals, then the
/// verdict (with its reasons when not publishable).
pub fn row(p: &Paired, b_label: &str, name_width: usize, ratio_digits: usize) -> String {
    let verdict = if p.publishable() {
        "publishable".to_string()
    } else {
        format!("not publishable: {:?}", p.not_publishable)
    };
    format!(
        "{:<name_width$} floor {:>7.2} µs  {b_label} {:>7.2} µs  ratio {:.ratio_digits$} (spread {:.1} %)  {}",
        p.name,
        p.minimum_ns_per_unit_a / 1e3,
        p.minimum_ns_per_unit_b / 1e3,
        p.median_ratio,
        p.ratio_spread.unwrap_or(f64::NAN) * 100.0,
        verdict
    )
}
