//! Host-cost attribution harness: the estimators behind every host-time figure this
//! crate publishes, reusable by downstream bench harnesses.
//!
//! # Why it exists
//! A resident dispatch costs about 10 µs of host time on the GPU machine (launch +
//! synchronize is 8.5–9.8 µs), and the differences worth chasing are a few percent of
//! that — well inside the noise of a naive loop-and-average benchmark. Reading such
//! figures honestly needs long calibrated regions, the right estimator for each question,
//! drift-cancelling pairing, a clock check that still works in a VM without cpufreq, and
//! a guard against probes the compiler deleted. This module is that machinery, with no
//! GPU dependency; the `host_cost_*` instruments build on it.
//!
//! # The two measurements
//! - [`Cell::measure`] — absolute cost per unit: warm, calibrate, time 5 regions of about
//!   0.5 s, quote the **minimum** ns per unit beside the relative standard deviation
//!   (verdict [`CellVerdict`]: ≤ 5 % ok, ≤ 20 % advisory, else void). Under 1 ns per unit
//!   it returns [`HostCostError::OptimisedAway`].
//! - [`Paired::compare`] — B against A: rounds of `A B B A` / `B A A B`
//!   ([`PairOrder::Abba`]), the **median** per-round ratio B/A and delta, the ratio spread
//!   (`(p90 − p10) / median` of the per-round ratios), publishability with reasons ([`NotPublishable`]) and a
//!   "difference detected" decision with its inputs ([`DifferenceDecision`]).
//!
//! Both record the clock at every region boundary ([`ClockMonitor`], source `cpufreq` or
//! `spin-reference`, with the measuring thread's run-queue delay and the machine's steal
//! folded into each region's figure). A comparison is publishable only when the
//! **between-arm clock gap** (mean figure of arm B's regions against arm A's, the seed's
//! rule) is at most 2 %; the within-run drift and the jitter are printed as advisories.
//! [`reference_noise_floor`] measures the reference's own between-arm noise.
//!
//! Every options struct has a `validate` that bounds every field
//! ([`HostCostError::InvalidOptions`] names the field and the bound), and the measurements
//! call it first: no option value can panic, exhaust memory or hang the harness. Both
//! measurements have a `from_samples` constructor ([`Cell::from_samples`],
//! [`Paired::from_samples`]; [`ClockDrift::from_regions`] for the clock), so every
//! rule can be exercised, or applied to samples timed elsewhere, with injected samples.
//! The estimators' arithmetic itself (pure functions over samples) and the clock's
//! capped `/proc` and cpufreq readers are internal; the crate's self-tests reach them
//! through the `testing` feature.
//!
//! ```no_run
//! use std::hint::black_box;
//! use vyre_cuda::host_cost::{Cell, CellOptions, PairOptions, Paired, Report};
//!
//! fn work(iterations: u64, cost: u64) -> u64 {
//!     let mut digest = black_box(1_u64);
//!     for _ in 0..iterations * cost {
//!         digest = digest.wrapping_mul(6364136223846793005).rotate_left(7);
//!     }
//!     digest
//! }
//!
//! let mut report = Report::new("example");
//! match Cell::measure("work x1", &CellOptions::default(), |n| work(n, 1)) {
//!     Ok(cell) => { report.add_cell(cell); }
//!     Err(error) => report.add_failure("work x1", &error),
//! }
//! let paired = Paired::compare("x1", |n| work(n, 1), "x2", |n| work(n, 2),
//!                              &PairOptions::default())?;
//! report.add_paired(paired);
//! let _ = report.finish(); // prints the table, writes report_dir()/example.*.json
//! # Ok::<(), vyre_cuda::host_cost::HostCostError>(())
//! ```
//!
//! # Output files
//! [`Report::finish`] prints [`Report::table`] and writes two files into
//! [`report_dir`]: `$VYRE_HOST_COST_REPORT_DIR`, else `$CARGO_TARGET_DIR/host-cost/`,
//! else `target/host-cost/` (relative paths from the current directory, which `cargo
//! test` and `cargo bench` set to the package's root), named after the report
//! (characters outside `[A-Za-z0-9._-]` replaced by `_`). Failure to write is printed and
//! returned, never a panic.
//!
//! ## `<report>.bencher.json`
//! Bencher Metric Format: `{"<cell>": {"latency": {"value": min, "lower_value": min,
//! "upper_value": max}}}` in ns per unit over the cell's regions; a comparison
//! `"<b> vs <a>"` has `"ratio"` (median, min, max of the per-round ratios B/A) and
//! `"latency_delta"` (median, min, max of the per-round deltas, ns per unit).
//!
//! ## `<report>.samples.json` (schema `vyre-cuda/host-cost-samples/v1`)
//! Raw times are in **seconds**; derived per-unit figures in nanoseconds. Non-finite
//! numbers are written as `null`.
//! ```text
//! {
//!   "schema": "vyre-cuda/host-cost-samples/v1",
//!   "report": string,
//!   "cells": [{
//!     "name": string,
//!     "iterations_per_region": integer,          // repetitions in each timed region
//!     "calibration": [{"iterations": integer, "seconds": number}],
//!     "region_seconds": [number],                // one per timed region, in order
//!     "minimum_ns_per_unit": number,             // the quoted estimate
//!     "median_ns_per_unit": number,
//!     "relative_std_dev": number | null,         // of the per-unit times
//!     "verdict": "ok" | "advisory" | "void",
//!     "clock": Clock
//!   }],
//!   "paired": [{
//!     "name": "<b> vs <a>", "arm_a": string, "arm_b": string,
//!     "order": "ABBA" | "ABAB",
//!     "iterations_per_region": integer,          // same for both arms
//!     "calibration_a": [Probe], "calibration_b": [Probe],
//!     "schedule": string,                        // e.g. "ABBABAAB...", one letter per region
//!     "region_seconds": [number],                // in schedule order
//!     "ratios": [number],                        // per round: (B1+B2)/(A1+A2)
//!     "deltas_ns_per_unit": [number],            // per round: ((B1+B2)-(A1+A2))/2 per unit
//!     "median_ratio": number, "median_delta_ns_per_unit": number,
//!     "ratio_spread": number | null,             // (p90 - p10) / median of the ratios
//!     "difference": {"detected": bool, "direction": "b-slower" | "b-faster" | null,
//!                    "rounds_above": integer, "rounds_below": integer,
//!                    "rounds_ignored": integer, "p_value": number,
//!                    "alpha": number, "minimum_effect": number},
//!     "publishable": bool, "reasons": [string],
//!     "clock": Clock
//!   }],
//!   "failures": [{"name": string, "error": string}]
//! }
//! Clock = {"source": "cpufreq" | "spin-reference" | "unavailable",
//!          "unit": "MHz" | "spin ops/us" | "none",
//!          "per_region": [number],               // one figure per timed region
//!          "arm_gap": {"mean_a": number, "mean_b": number, "gap": number} | null,
//!                                                // paired only: the verdict's input
//!          "drift": number | null,               // advisory: thirds' medians spread
//!          "jitter": number | null,              // advisory: (max - min) / median
//!          "run_queue_delay": number | null,     // mean share of a region, schedstat
//!          "steal": number | null,               // machine-wide steal share of the run
//!          "steal_gap": {"ticks_a": integer, "ticks_b": integer, "share_a": number,
//!                        "share_b": number, "standard_error": number,
//!                        "flagged": bool} | null,  // paired, where steal is reported
//!          "limit": number,
//!          "flagged": bool,                      // arm gap > limit, or steal_gap flagged
//!          "drift_advisory": bool,               // drift > limit (decides nothing)
//!          "notes": [string]}
//! ```

mod cell;
mod error;
mod paired;
mod report;

// The clock's file readers and parsers and the estimators' pure arithmetic: the crate's
// own machinery, public to its self-tests (which feed them injected samples and files)
// with the `testing` feature. Their result types are re-exported below.
#[cfg(feature = "testing")]
pub mod clock;
#[cfg(not(feature = "testing"))]
mod clock;
#[cfg(feature = "testing")]
pub mod estimate;
#[cfg(not(feature = "testing"))]
mod estimate;

#[cfg(feature = "testing")]
pub use clock::{read_capped, CPUFREQ_CAP, PROC_STAT_CAP, SCHEDSTAT_CAP};

pub use cell::{Cell, CellOptions, Probe, MAX_PROBE_GROWTH, MAX_REGION, MAX_WARMUP_CALLS};
pub use clock::{
    reference_noise_floor, ClockDrift, ClockMonitor, ClockOptions, ClockSource, ClockSourceChoice,
    Interference, NoiseFloor, SpinStatistic, StealGap, MAX_NOISE_TRIALS, MAX_SPIN_REPEATS,
    SPIN_TARGET_BOUNDS,
};
pub use error::HostCostError;
pub use estimate::{
    Arm, ArmGap, CellThresholds, CellVerdict, DifferenceDecision, DifferenceRule, Direction,
    NotPublishable, PairOrder, PairThresholds, RoundSummary, MAX_ROUNDS,
};
pub use paired::{PairOptions, Paired};
pub use report::{report_dir, Report, DEFAULT_REPORT_DIR, REPORT_DIR_ENV, SAMPLES_SCHEMA};
