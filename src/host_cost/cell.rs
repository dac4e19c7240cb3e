//! Absolute cells: "how long does one unit of this take", as a minimum over long regions.
//!
//! A host-side cost of a few microseconds cannot be timed one call at a time (a clock
//! read costs tens of nanoseconds and a preemption costs milliseconds), so a cell times
//! *regions* of many repetitions, long enough (0.5 s by default) that timer resolution and
//! short interference vanish, and quotes the fastest region: interference only ever adds
//! time. The spread of the regions says whether the fastest one can be trusted.
//!
//! Procedure: warm with 3 calls; probe with 1, 4, 16, ... repetitions until a probe
//! lasts at least 0.05 s, repeat that probe once and keep the faster; scale the repetition count so one region lasts the target; time
//! 5 regions; quote the minimum per-unit time beside the relative standard deviation of
//! the per-unit times (≤ 5 % ok, ≤ 20 % advisory, above that void). A minimum under
//! 1 ns per unit is not a number but an error: the work was optimised away.

use std::hint::black_box;
use std::time::{Duration, Instant};

use super::clock::{ClockDrift, ClockMonitor, ClockOptions};
use super::error::HostCostError;
use super::estimate::{self, CellThresholds, CellVerdict};

/// Everything a cell measurement can be tuned with; every default is the harness's.
#[derive(Clone, Debug, PartialEq)]
pub struct CellOptions {
    /// Calls (of one repetition each) before calibration. Default 3.
    pub warmup_calls: usize,
    /// Duration one timed region should last. Default 0.5 s.
    pub target_region: Duration,
    /// A calibration probe stops growing once it lasts this long. Default 0.05 s.
    pub probe_minimum: Duration,
    /// Factor by which each probe's repetitions grow. Default 4.
    pub probe_growth: u64,
    /// Timed regions. Default 5.
    pub regions: usize,
    /// Upper bound on repetitions per region (and per probe), so a closure whose work
    /// was optimised away ends calibration instead of growing forever. Default 2³².
    pub max_iterations: u64,
    /// Verdict thresholds.
    pub thresholds: CellThresholds,
    /// Clock-drift monitor settings.
    pub clock: ClockOptions,
}

impl Default for CellOptions {
    fn default() -> Self {
        CellOptions {
            warmup_calls: 3,
            target_region: Duration::from_millis(500),
            probe_minimum: Duration::from_millis(50),
            probe_growth: 4,
            regions: 5,
            max_iterations: 1 << 32,
            thresholds: CellThresholds::default(),
            clock: ClockOptions::default(),
        }
    }
}

impl CellOptions {
    /// Options with the given region target and probe minimum and every other default:
    /// the knob self-tests and quick runs turn.
    pub fn with_targets(target_region: Duration, probe_minimum: Duration) -> CellOptions {
        CellOptions {
            target_region,
            probe_minimum,
            ..CellOptions::default()
        }
    }

    /// Checks every field against its bound (an unbounded region count
    /// exhausts memory, an unbounded growth never ends calibration, a NaN threshold
    /// passes nothing).
    ///
    /// # Errors
    /// [`HostCostError::InvalidOptions`] naming the first field out of bounds and the
    /// bound.
    pub fn validate(&self) -> Result<(), HostCostError> {
        check_count(
            "CellOptions::warmup_calls",
            self.warmup_calls,
            0,
            MAX_WARMUP_CALLS,
        )?;
        check_duration("CellOptions::target_region", self.target_region, false)?;
        check_duration("CellOptions::probe_minimum", self.probe_minimum, true)?;
        check_count(
            "CellOptions::probe_growth",
            self.probe_growth,
            2,
            MAX_PROBE_GROWTH,
        )?;
        check_count(
            "CellOptions::regions",
            self.regions,
            2,
            estimate::MAX_ROUNDS,
        )?;
        check_count(
            "CellOptions::max_iterations",
            self.max_iterations,
            1,
            u64::MAX,
        )?;
        self.thresholds.validate()?;
        self.clock.validate()
    }
}

/// Most warm-up calls any options may ask for.
pub const MAX_WARMUP_CALLS: usize = 1_000_000;
/// Largest calibration growth factor.
pub const MAX_PROBE_GROWTH: u64 = 1 << 20;
/// Longest region or probe any options may ask for.
pub const MAX_REGION: Duration = Duration::from_secs(3600);

/// `lowest ≤ value ≤ highest`, else [`HostCostError::InvalidOptions`] for `field`.
pub(super) fn check_count<T>(
    field: &'static str,
    value: T,
    lowest: T,
    highest: T,
) -> Result<(), HostCostError>
where
    T: PartialOrd + std::fmt::Debug + std::fmt::Display,
{
    if value < lowest || value > highest {
        return Err(HostCostError::invalid_option(
            field,
            value,
            format!("between {lowest} and {highest}"),
        ));
    }
    Ok(())
}

/// A duration of at most [`MAX_REGION`], positive unless `zero_allowed`.
pub(super) fn check_duration(
    field: &'static str,
    value: Duration,
    zero_allowed: bool,
) -> Result<(), HostCostError> {
    if (value.is_zero() && !zero_allowed) || value > MAX_REGION {
        return Err(HostCostError::invalid_option(
            field,
            value,
            format!(
                "{} and at most {MAX_REGION:?}",
                if zero_allowed {
                    "at least 0"
                } else {
                    "above 0"
                }
            ),
        ));
    }
    Ok(())
}

/// A finite number in `[lowest, highest]`.
pub(super) fn check_number(
    field: &'static str,
    value: f64,
    lowest: f64,
    highest: f64,
) -> Result<(), HostCostError> {
    if !(value >= lowest && value <= highest) {
        return Err(HostCostError::invalid_option(
            field,
            value,
            format!("to a finite number between {lowest} and {highest}"),
        ));
    }
    Ok(())
}

/// One calibration probe.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Probe {
    /// Repetitions run.
    pub iterations: u64,
    /// Wall time in seconds.
    pub seconds: f64,
}

/// Times one region of `iterations` repetitions, folding the digest into `black_box`.
pub(super) fn time_region<F: FnMut(u64) -> u64>(work: &mut F, iterations: u64) -> f64 {
    let started = Instant::now();
    let digest = work(black_box(iterations));
    let seconds = started.elapsed().as_secs_f64();
    black_box(digest);
    seconds
}

/// Probes with 1, `growth`, `growth²`, ... repetitions until one probe lasts at least
/// `probe_minimum` or reaches `max_iterations`, then repeats that last probe once;
/// returns every probe ([`calibration_probe`] picks the calibration).
///
/// The repeat exists because one interrupted probe used to decide the region length: a
/// competitor woken at the start of a 1-repetition probe held the CPU for a whole 6 ms
/// time slice, calibration stopped there, and the regions were sized to 1 repetition
/// (measured with the interference instrument on the 2-core build machine).
pub(super) fn calibrate<F: FnMut(u64) -> u64>(
    work: &mut F,
    probe_minimum: Duration,
    growth: u64,
    max_iterations: u64,
) -> Vec<Probe> {
    let mut probes = Vec::new();
    let mut iterations: u64 = 1;
    loop {
        let seconds = time_region(work, iterations);
        probes.push(Probe {
            iterations,
            seconds,
        });
        if seconds >= probe_minimum.as_secs_f64() || iterations >= max_iterations {
            let seconds = time_region(work, iterations);
            probes.push(Probe {
                iterations,
                seconds,
            });
            return probes;
        }
        iterations = iterations.saturating_mul(growth).min(max_iterations);
    }
}

/// The calibration of a probe series from [`calibrate`]: the faster of its last two
/// probes when they ran the same repetitions (interference only adds time), else the
/// last one. `None` for no probes.
pub(super) fn calibration_probe(probes: &[Probe]) -> Option<Probe> {
    match probes {
        [.., before, last] if before.iterations == last.iterations => {
            Some(if before.seconds <= last.seconds {
                *before
            } else {
                *last
            })
        }
        [.., last] => Some(*last),
        [] => None,
    }
}

/// Repetitions for a region of `target` given a probe, within `1..=max_iterations`.
pub(super) fn iterations_for(target: Duration, probe: &Probe, max_iterations: u64) -> u64 {
    let per_unit = probe.seconds / probe.iterations as f64;
    if per_unit.is_nan() || per_unit <= 0.0 {
        // Too fast to time at all: run the most repetitions allowed, so the regions
        // expose the optimised-away case instead of calibration looping.
        return max_iterations;
    }
    let wanted = (target.as_secs_f64() / per_unit).ceil();
    if wanted >= max_iterations as f64 {
        max_iterations
    } else {
        (wanted as u64).max(1)
    }
}

/// A measured cell: its samples, its estimate and its verdict.
#[derive(Clone, Debug, PartialEq)]
pub struct Cell {
    /// Name shown in the table and the JSON files.
    pub name: String,
    /// Calibration probes in the order they ran.
    pub calibration: Vec<Probe>,
    /// Repetitions in each timed region.
    pub iterations_per_region: u64,
    /// Wall time of each timed region in seconds (raw samples).
    pub region_seconds: Vec<f64>,
    /// Per-unit time of each region in nanoseconds.
    pub ns_per_unit: Vec<f64>,
    /// The quoted estimate: the minimum of `ns_per_unit`.
    pub minimum_ns_per_unit: f64,
    /// Median of `ns_per_unit` (for context, not the estimate).
    pub median_ns_per_unit: f64,
    /// Maximum of `ns_per_unit`.
    pub maximum_ns_per_unit: f64,
    /// Relative standard deviation of `ns_per_unit`.
    pub relative_std_dev: Option<f64>,
    /// Ok / advisory / void (never optimised-away: that is an error instead).
    pub verdict: CellVerdict,
    /// Clock record over the timed regions.
    pub clock: ClockDrift,
}

impl Cell {
    /// Measures `work` as a cell.
    ///
    /// `work(iterations)` must do `iterations` units of the work being costed and return
    /// a `u64` digest that depends on all of it (the digest is folded into
    /// [`std::hint::black_box`] so the compiler cannot delete the work). A GPU
    /// instrument's closure typically dispatches `iterations` times and returns a digest
    /// of the last readback.
    ///
    /// # Errors
    /// [`HostCostError::InvalidOptions`] for unusable options;
    /// [`HostCostError::OptimisedAway`] when the minimum is under
    /// `options.thresholds.optimised_away_below_ns` per unit.
    pub fn measure<F: FnMut(u64) -> u64>(
        name: &str,
        options: &CellOptions,
        mut work: F,
    ) -> Result<Cell, HostCostError> {
        options.validate()?;
        for _ in 0..options.warmup_calls {
            time_region(&mut work, 1);
        }
        let calibration = calibrate(
            &mut work,
            options.probe_minimum,
            options.probe_growth,
            options.max_iterations,
        );
        let last_probe = calibration_probe(&calibration).unwrap_or(Probe {
            iterations: 1,
            seconds: 0.0,
        });
        let iterations = iterations_for(options.target_region, &last_probe, options.max_iterations);

        let mut monitor = ClockMonitor::start(&options.clock)?;
        let mut region_seconds = Vec::with_capacity(options.regions);
        monitor.mark_boundary();
        for _ in 0..options.regions {
            region_seconds.push(time_region(&mut work, iterations));
            monitor.mark_boundary();
        }
        let clock = monitor.finish();
        Cell::from_samples(
            name,
            calibration,
            iterations,
            region_seconds,
            clock,
            &options.thresholds,
        )
    }

    /// Builds a cell from already-timed regions (the pure half of [`Cell::measure`]),
    /// applying the estimator and the verdict.
    ///
    /// # Errors
    /// [`HostCostError::InvalidOptions`] with no regions or zero iterations;
    /// [`HostCostError::OptimisedAway`] as for [`Cell::measure`].
    pub fn from_samples(
        name: &str,
        calibration: Vec<Probe>,
        iterations_per_region: u64,
        region_seconds: Vec<f64>,
        clock: ClockDrift,
        thresholds: &CellThresholds,
    ) -> Result<Cell, HostCostError> {
        thresholds.validate()?;
        if region_seconds.is_empty() || iterations_per_region == 0 {
            return Err(HostCostError::InvalidSamples {
                message: format!(
                    "cell `{name}` has {} regions of {iterations_per_region} iterations; \
                     give at least one region of at least one iteration",
                    region_seconds.len()
                ),
            });
        }
        let ns_per_unit: Vec<f64> = region_seconds
            .iter()
            .map(|seconds| seconds * 1e9 / iterations_per_region as f64)
            .collect();
        let minimum = estimate::minimum(&ns_per_unit).unwrap_or(f64::NAN);
        let relative_std_dev = estimate::relative_std_dev(&ns_per_unit);
        let verdict = estimate::cell_verdict(minimum, relative_std_dev, thresholds);
        if verdict == CellVerdict::OptimisedAway {
            return Err(HostCostError::OptimisedAway {
                name: name.to_string(),
                ns_per_unit: minimum,
                threshold_ns: thresholds.optimised_away_below_ns,
            });
        }
        Ok(Cell {
            name: name.to_string(),
            calibration,
            iterations_per_region,
            median_ns_per_unit: estimate::median(&ns_per_unit).unwrap_or(f64::NAN),
            maximum_ns_per_unit: estimate::maximum(&ns_per_unit).unwrap_or(f64::NAN),
            minimum_ns_per_unit: minimum,
            relative_std_dev,
            verdict,
            region_seconds,
            ns_per_unit,
            clock,
        })
    }
}
