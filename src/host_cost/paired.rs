//! Paired comparisons: "is B slower than A, and by how much", robust to drift.
//!
//! Two absolute cells measured minutes apart compare the machine's state as much as the
//! code. A paired comparison interleaves the arms region by region, so both see the same
//! machine, and cancels linear drift by mirroring the order inside each round (ABBA, see
//! [`PairOrder::Abba`]). It quotes the **median** per-round ratio B/A and the median
//! per-round delta per unit, the ratio spread, a publishability verdict (≥ 8 rounds,
//! ratio spread ≤ 20 %, between-arm clock gap ≤ 2 %, with the reasons when not) and a separate
//! "difference detected" decision ([`DifferenceDecision`]: sign test plus a minimum
//! effect) whose inputs are all exposed so its power can be measured.
//!
//! Procedure: warm both arms (3 calls each); calibrate both and size the regions on the
//! slower arm so both arms run the same repetitions for about the target; run the
//! rounds; record the clock at every region boundary.

use std::time::Duration;

use super::cell::{
    calibrate, calibration_probe, check_count, check_duration, check_number, iterations_for,
    time_region, Probe, MAX_PROBE_GROWTH, MAX_WARMUP_CALLS,
};
use super::clock::{ClockDrift, ClockMonitor, ClockOptions};
use super::error::HostCostError;
use super::estimate::{
    self, Arm, DifferenceDecision, DifferenceRule, NotPublishable, PairOrder, PairThresholds,
    RoundSummary,
};

/// Everything a paired comparison can be tuned with.
#[derive(Clone, Debug, PartialEq)]
pub struct PairOptions {
    /// Calls (one repetition each) per arm before calibration. Default 3.
    pub warmup_calls: usize,
    /// Duration one region of the slower arm should last. Default 0.1 s: a round is four
    /// regions, so the default 10 rounds take about 4 s.
    pub target_region: Duration,
    /// A calibration probe stops growing once it lasts this long. Default 0.05 s.
    pub probe_minimum: Duration,
    /// Factor by which each probe's repetitions grow. Default 4.
    pub probe_growth: u64,
    /// Rounds of four regions. Default 10 (≥ 8 for publication; 10 lets the sign test
    /// reach p = 0.002 when every round agrees). On a loaded machine prefer many short
    /// rounds (e.g. 60 × 0.5 ms): a multi-millisecond preemption spoils the round it
    /// lands in, and the sign test counts rounds, so fewer spoiled rounds matter more
    /// than longer regions.
    pub rounds: usize,
    /// Region order. Default [`PairOrder::Abba`]; `Abab` only to demonstrate its bias.
    pub order: PairOrder,
    /// Upper bound on repetitions per region. Default 2³².
    pub max_iterations: u64,
    /// An arm under this many ns per unit was optimised away. Default 1.0.
    pub optimised_away_below_ns: f64,
    /// Publishability limits.
    pub thresholds: PairThresholds,
    /// "Difference detected" rule.
    pub difference: DifferenceRule,
    /// Clock-drift monitor settings.
    pub clock: ClockOptions,
}

impl Default for PairOptions {
    fn default() -> Self {
        PairOptions {
            warmup_calls: 3,
            target_region: Duration::from_millis(100),
            probe_minimum: Duration::from_millis(50),
            probe_growth: 4,
            rounds: 10,
            order: PairOrder::Abba,
            max_iterations: 1 << 32,
            optimised_away_below_ns: 1.0,
            thresholds: PairThresholds::default(),
            difference: DifferenceRule::default(),
            clock: ClockOptions::default(),
        }
    }
}

impl PairOptions {
    /// Options with the given region target, probe minimum and rounds, every other
    /// field default.
    pub fn with_targets(
        target_region: Duration,
        probe_minimum: Duration,
        rounds: usize,
    ) -> PairOptions {
        PairOptions {
            target_region,
            probe_minimum,
            rounds,
            ..PairOptions::default()
        }
    }

    /// Checks every field against its bound (`rounds = 2⁶²` used to panic
    /// allocating the schedule).
    ///
    /// # Errors
    /// [`HostCostError::InvalidOptions`] naming the first field out of bounds and the
    /// bound.
    pub fn validate(&self) -> Result<(), HostCostError> {
        check_count(
            "PairOptions::warmup_calls",
            self.warmup_calls,
            0,
            MAX_WARMUP_CALLS,
        )?;
        check_duration("PairOptions::target_region", self.target_region, false)?;
        check_duration("PairOptions::probe_minimum", self.probe_minimum, true)?;
        check_count(
            "PairOptions::probe_growth",
            self.probe_growth,
            2,
            MAX_PROBE_GROWTH,
        )?;
        check_count("PairOptions::rounds", self.rounds, 1, estimate::MAX_ROUNDS)?;
        check_count(
            "PairOptions::max_iterations",
            self.max_iterations,
            1,
            u64::MAX,
        )?;
        check_number(
            "PairOptions::optimised_away_below_ns",
            self.optimised_away_below_ns,
            0.0,
            1e12,
        )?;
        self.thresholds.validate()?;
        self.difference.validate()?;
        self.clock.validate()
    }
}

/// A finished paired comparison.
#[derive(Clone, Debug, PartialEq)]
pub struct Paired {
    /// `"<name_b> vs <name_a>"`.
    pub name: String,
    /// Baseline arm's name.
    pub name_a: String,
    /// Candidate arm's name.
    pub name_b: String,
    /// Region order used.
    pub order: PairOrder,
    /// Calibration probes of arm A, then of arm B.
    pub calibration: [Vec<Probe>; 2],
    /// Repetitions in every region of both arms.
    pub iterations_per_region: u64,
    /// Which arm each region timed, in order: rounds of [`PairOrder`]'s four slots.
    pub schedule: Vec<Arm>,
    /// Wall time of each region in seconds, in schedule order (raw samples).
    pub region_seconds: Vec<f64>,
    /// Per-round totals (seconds), ratio and delta (seconds per region).
    pub rounds: Vec<RoundSummary>,
    /// Per-round ratios B/A.
    pub ratios: Vec<f64>,
    /// Per-round deltas B − A in ns per unit.
    pub deltas_ns_per_unit: Vec<f64>,
    /// Median of `ratios`: the quoted ratio.
    pub median_ratio: f64,
    /// Median of `deltas_ns_per_unit`: the quoted delta.
    pub median_delta_ns_per_unit: f64,
    /// Spread of `ratios`: `(p90 − p10) / median` (linear-interpolated quantiles);
    /// `None` without rounds or with a median that is not positive.
    pub ratio_spread: Option<f64>,
    /// Fastest region of arm A in ns per unit.
    pub minimum_ns_per_unit_a: f64,
    /// Fastest region of arm B in ns per unit.
    pub minimum_ns_per_unit_b: f64,
    /// The "difference detected" decision and its inputs.
    pub difference: DifferenceDecision,
    /// Reasons the comparison may not be published; empty when publishable.
    pub not_publishable: Vec<NotPublishable>,
    /// Clock record over all regions.
    pub clock: ClockDrift,
}

impl Paired {
    /// Compares arm B against arm A.
    ///
    /// Each closure has the contract of [`super::Cell::measure`]: do `iterations` units,
    /// return a digest of them. The ratio is B/A, so a ratio above 1 means B is slower.
    ///
    /// # Errors
    /// [`HostCostError::InvalidOptions`] for unusable options;
    /// [`HostCostError::OptimisedAway`] when either arm's fastest region is under
    /// `options.optimised_away_below_ns` per unit.
    pub fn compare<FA, FB>(
        name_a: &str,
        mut arm_a: FA,
        name_b: &str,
        mut arm_b: FB,
        options: &PairOptions,
    ) -> Result<Paired, HostCostError>
    where
        FA: FnMut(u64) -> u64,
        FB: FnMut(u64) -> u64,
    {
        options.validate()?;
        for _ in 0..options.warmup_calls {
            time_region(&mut arm_a, 1);
            time_region(&mut arm_b, 1);
        }
        let probes_a = calibrate(
            &mut arm_a,
            options.probe_minimum,
            options.probe_growth,
            options.max_iterations,
        );
        let probes_b = calibrate(
            &mut arm_b,
            options.probe_minimum,
            options.probe_growth,
            options.max_iterations,
        );
        let final_a = calibration_probe(&probes_a);
        let final_b = calibration_probe(&probes_b);
        let per_unit = |probe: Option<Probe>| {
            probe
                .map(|probe| probe.seconds / probe.iterations as f64)
                .unwrap_or(0.0)
        };
        let slower = if per_unit(final_b) > per_unit(final_a) {
            final_b
        } else {
            final_a
        };
        let iterations = slower
            .map(|probe| iterations_for(options.target_region, &probe, options.max_iterations))
            .unwrap_or(1);

        let schedule = estimate::schedule(options.order, options.rounds);
        let mut monitor = ClockMonitor::start(&options.clock)?;
        let mut region_seconds = Vec::with_capacity(schedule.len());
        monitor.mark_boundary();
        for arm in &schedule {
            let seconds = match arm {
                Arm::A => time_region(&mut arm_a, iterations),
                Arm::B => time_region(&mut arm_b, iterations),
            };
            region_seconds.push(seconds);
            monitor.mark_boundary();
        }
        let clock = monitor.finish();
        Paired::from_samples(
            name_a,
            name_b,
            [probes_a, probes_b],
            iterations,
            region_seconds,
            clock,
            options,
        )
    }

    /// Builds the comparison from already-timed regions in `options.order` (the pure half
    /// of [`Paired::compare`]); `region_seconds` must hold whole rounds.
    ///
    /// # Errors
    /// [`HostCostError::InvalidOptions`] when there is no whole round or zero iterations;
    /// [`HostCostError::OptimisedAway`] as for [`Paired::compare`].
    pub fn from_samples(
        name_a: &str,
        name_b: &str,
        calibration: [Vec<Probe>; 2],
        iterations_per_region: u64,
        region_seconds: Vec<f64>,
        clock: ClockDrift,
        options: &PairOptions,
    ) -> Result<Paired, HostCostError> {
        let whole_rounds = region_seconds.len() / 4;
        if whole_rounds == 0 || iterations_per_region == 0 {
            return Err(HostCostError::InvalidSamples {
                message: format!(
                    "comparison `{name_b} vs {name_a}` has {} regions of \
                     {iterations_per_region} iterations; give at least one whole round \
                     (4 regions) of at least one iteration",
                    region_seconds.len()
                ),
            });
        }
        options.validate()?;
        let schedule = estimate::schedule(options.order, whole_rounds);
        let region_seconds = region_seconds[..whole_rounds * 4].to_vec();
        let clock = clock.with_arms(&schedule);
        let units = iterations_per_region as f64;
        let arm_minimum = |wanted: Arm| {
            let per_unit: Vec<f64> = schedule
                .iter()
                .zip(&region_seconds)
                .filter(|(arm, _)| **arm == wanted)
                .map(|(_, seconds)| seconds * 1e9 / units)
                .collect();
            estimate::minimum(&per_unit).unwrap_or(f64::NAN)
        };
        let minimum_ns_per_unit_a = arm_minimum(Arm::A);
        let minimum_ns_per_unit_b = arm_minimum(Arm::B);
        for (name, minimum) in [
            (name_a, minimum_ns_per_unit_a),
            (name_b, minimum_ns_per_unit_b),
        ] {
            if !estimate::reaches(minimum, options.optimised_away_below_ns) {
                return Err(HostCostError::OptimisedAway {
                    name: name.to_string(),
                    ns_per_unit: minimum,
                    threshold_ns: options.optimised_away_below_ns,
                });
            }
        }
        let rounds = estimate::summarise_rounds(options.order, &region_seconds);
        let ratios: Vec<f64> = rounds.iter().map(|round| round.ratio).collect();
        let deltas_ns_per_unit: Vec<f64> = rounds
            .iter()
            .map(|round| round.delta * 1e9 / units)
            .collect();
        let ratio_spread = estimate::ratio_spread(&ratios);
        let difference = estimate::decide_difference(&ratios, &options.difference);
        let mut not_publishable = estimate::publishability(
            rounds.len(),
            ratio_spread,
            clock.arm_gap.map(|gap| gap.gap),
            &options.thresholds,
        );
        if let Some(steal) = clock.steal_gap.filter(|steal| steal.flagged) {
            not_publishable.push(NotPublishable::StealGapTooLarge {
                share_a: steal.share_a,
                share_b: steal.share_b,
                limit: clock.limit,
            });
        }
        Ok(Paired {
            name: format!("{name_b} vs {name_a}"),
            name_a: name_a.to_string(),
            name_b: name_b.to_string(),
            order: options.order,
            calibration,
            iterations_per_region,
            schedule,
            region_seconds,
            median_ratio: estimate::median(&ratios).unwrap_or(f64::NAN),
            median_delta_ns_per_unit: estimate::median(&deltas_ns_per_unit).unwrap_or(f64::NAN),
            rounds,
            ratios,
            deltas_ns_per_unit,
            ratio_spread,
            minimum_ns_per_unit_a,
            minimum_ns_per_unit_b,
            difference,
            not_publishable,
            clock,
        })
    }

    /// True when no [`NotPublishable`] reason applies.
    pub fn publishable(&self) -> bool {
        self.not_publishable.is_empty()
    }
}
