//! Estimator arithmetic as pure functions over sample slices.
//!
//! Everything that turns timings into a quoted number or a verdict lives here, with no
//! clock read and no I/O, so that every rule of the harness can be tested on fixed samples:
//! minimum, median, quantiles, relative standard deviation, the cell verdict, the ABBA
//! schedule and its per-round ratios, the paired publishability rule with its reasons,
//! the "difference detected" decision and the clock-drift rule.
//!
//! Conventions: functions return `None` for an empty slice (or another input that has no
//! defined answer) instead of panicking; NaN samples are ordered with `f64::total_cmp`
//! (after every finite number), so they never cause a panic but do poison the estimate
//! they reach, which is the honest outcome for a broken sample.

use std::fmt;

use super::error::HostCostError;

/// Smallest sample, or `None` for an empty slice.
///
/// The minimum is the cell estimator: interference on a host (preemption, cache
/// pollution, frequency dips) only ever adds time, so the fastest of several long
/// regions is the least-contaminated view of the true cost.
pub fn minimum(samples: &[f64]) -> Option<f64> {
    samples.iter().copied().min_by(f64::total_cmp)
}

/// Largest sample, or `None` for an empty slice.
pub fn maximum(samples: &[f64]) -> Option<f64> {
    samples.iter().copied().max_by(f64::total_cmp)
}

/// Arithmetic mean, or `None` for an empty slice.
pub fn mean(samples: &[f64]) -> Option<f64> {
    if samples.is_empty() {
        return None;
    }
    Some(samples.iter().sum::<f64>() / samples.len() as f64)
}

/// `value ≤ limit`, false for NaN: a figure that is not a number never passes a limit.
pub(crate) fn within_limit(value: f64, limit: f64) -> bool {
    value <= limit
}

/// `value ≥ threshold`, false for NaN: a time that is not a number is not a measurement.
pub(crate) fn reaches(value: f64, threshold: f64) -> bool {
    value >= threshold
}

fn sorted(samples: &[f64]) -> Vec<f64> {
    let mut copy = samples.to_vec();
    copy.sort_by(f64::total_cmp);
    copy
}

/// Median: the middle sample for an odd count, the mean of the two middle samples for
/// an even count; `None` for an empty slice.
pub fn median(samples: &[f64]) -> Option<f64> {
    if samples.is_empty() {
        return None;
    }
    let ordered = sorted(samples);
    let middle = ordered.len() / 2;
    if ordered.len() % 2 == 1 {
        Some(ordered[middle])
    } else {
        Some((ordered[middle - 1] + ordered[middle]) / 2.0)
    }
}

/// Quantile `fraction` (0 ≤ fraction ≤ 1) with linear interpolation between the order
/// statistics (the "type 7" definition used by R and NumPy): position
/// `fraction × (n − 1)` in the sorted samples. `quantile(s, 0.5)` equals [`median`].
/// `None` for an empty slice or a fraction outside `[0, 1]`.
pub fn quantile(samples: &[f64], fraction: f64) -> Option<f64> {
    if samples.is_empty() || !(0.0..=1.0).contains(&fraction) {
        return None;
    }
    let ordered = sorted(samples);
    let position = fraction * (ordered.len() - 1) as f64;
    let lower = position.floor() as usize;
    let upper = position.ceil() as usize;
    let weight = position - lower as f64;
    Some(ordered[lower] + (ordered[upper] - ordered[lower]) * weight)
}

/// Relative standard deviation: the sample standard deviation (divisor `n − 1`) divided
/// by the mean. `None` with fewer than two samples or a mean that is not positive.
pub fn relative_std_dev(samples: &[f64]) -> Option<f64> {
    if samples.len() < 2 {
        return None;
    }
    let average = mean(samples)?;
    if average.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
        return None;
    }
    let sum_of_squares: f64 = samples.iter().map(|s| (s - average) * (s - average)).sum();
    let variance = sum_of_squares / (samples.len() - 1) as f64;
    Some(variance.sqrt() / average)
}

/// Relative spread of a series: `(max − min) / median` (the clock's jitter, and the
/// drift of very short series). `None` for an empty slice or a median that is not
/// positive.
pub fn relative_spread(samples: &[f64]) -> Option<f64> {
    let middle = median(samples)?;
    if middle.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
        return None;
    }
    Some((maximum(samples)? - minimum(samples)?) / middle)
}

/// Ratio spread of paired rounds: `(p90 − p10) / median` of the per-round ratios, with
/// [`quantile`]'s interpolation.
///
/// Chosen over `(max − min) / median` because one preempted round should not void a
/// comparison whose other rounds agree; with 8 rounds p10 and p90 still sit within one
/// order statistic of the extremes, so a genuinely wide distribution is not hidden.
/// `None` for an empty slice or a median that is not positive.
pub fn ratio_spread(ratios: &[f64]) -> Option<f64> {
    let middle = median(ratios)?;
    if middle.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
        return None;
    }
    Some((quantile(ratios, 0.9)? - quantile(ratios, 0.1)?) / middle)
}

/// Thresholds of the cell verdict. Both bounds are inclusive.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CellThresholds {
    /// A relative standard deviation at or below this is [`CellVerdict::Ok`]. Default 0.05.
    pub ok_rsd: f64,
    /// At or below this (and above `ok_rsd`) is [`CellVerdict::Advisory`]. Default 0.20.
    pub advisory_rsd: f64,
    /// A minimum per-unit time below this many nanoseconds means the timed work was
    /// optimised away. Default 1.0.
    pub optimised_away_below_ns: f64,
}

impl Default for CellThresholds {
    fn default() -> Self {
        CellThresholds {
            ok_rsd: 0.05,
            advisory_rsd: 0.20,
            optimised_away_below_ns: 1.0,
        }
    }
}

impl CellThresholds {
    /// Checks the thresholds (finite, `0 ≤ ok_rsd ≤ advisory_rsd`).
    ///
    /// # Errors
    /// [`HostCostError::InvalidOptions`] naming the field and its bound.
    pub fn validate(&self) -> Result<(), HostCostError> {
        let finite = |field: &'static str, value: f64, lowest: f64| {
            if value >= lowest && value <= 1e12 {
                Ok(())
            } else {
                Err(HostCostError::invalid_option(
                    field,
                    value,
                    format!("to a finite number between {lowest} and 1e12"),
                ))
            }
        };
        finite("CellThresholds::ok_rsd", self.ok_rsd, 0.0)?;
        finite(
            "CellThresholds::advisory_rsd",
            self.advisory_rsd,
            self.ok_rsd,
        )?;
        finite(
            "CellThresholds::optimised_away_below_ns",
            self.optimised_away_below_ns,
            0.0,
        )
    }
}

/// What a cell's number may be used for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CellVerdict {
    /// Relative standard deviation within `ok_rsd`: quote it.
    Ok,
    /// Within `advisory_rsd`: quote it with a warning.
    Advisory,
    /// Noisier than `advisory_rsd` (or no spread could be computed): do not quote it.
    Void,
    /// Under `optimised_away_below_ns` per unit: the probe measured nothing. A cell never
    /// reports a number with this verdict; [`crate::host_cost::Cell::measure`] returns
    /// [`crate::host_cost::HostCostError::OptimisedAway`] instead.
    OptimisedAway,
}

impl CellVerdict {
    /// Lower-case label used in the table and the JSON files.
    pub fn label(self) -> &'static str {
        match self {
            CellVerdict::Ok => "ok",
            CellVerdict::Advisory => "advisory",
            CellVerdict::Void => "void",
            CellVerdict::OptimisedAway => "optimised-away",
        }
    }
}

impl fmt::Display for CellVerdict {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.label())
    }
}

/// The cell verdict from the minimum per-unit time (ns) and the relative standard
/// deviation of the per-unit times. The optimised-away check comes first; a missing or
/// NaN spread is [`CellVerdict::Void`].
pub fn cell_verdict(
    minimum_ns_per_unit: f64,
    relative_std_dev: Option<f64>,
    thresholds: &CellThresholds,
) -> CellVerdict {
    if !reaches(minimum_ns_per_unit, thresholds.optimised_away_below_ns) {
        return CellVerdict::OptimisedAway;
    }
    match relative_std_dev {
        Some(rsd) if rsd <= thresholds.ok_rsd => CellVerdict::Ok,
        Some(rsd) if rsd <= thresholds.advisory_rsd => CellVerdict::Advisory,
        _ => CellVerdict::Void,
    }
}

/// One of the two arms of a paired comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arm {
    /// The baseline (denominator of the ratio).
    A,
    /// The candidate (numerator of the ratio).
    B,
}

impl Arm {
    /// `"a"` or `"b"`.
    pub fn label(self) -> &'static str {
        match self {
            Arm::A => "a",
            Arm::B => "b",
        }
    }
}

/// Order of the four timed regions of one paired round.
///
/// Only [`PairOrder::Abba`] is fit for publication; [`PairOrder::Abab`] exists so the
/// bias it suffers under drift can be demonstrated (self-tests, GPU instruments).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PairOrder {
    /// Each round is a mirrored block, and the leading arm alternates between rounds:
    /// `A B B A`, then `B A A B`, then `A B B A`, ...
    ///
    /// Why it cancels linear drift: if a region at slot `t` (0..4 within the round) costs
    /// `c × (1 + s·(T + t))`, arm A occupies slots 0 and 3 and arm B slots 1 and 2; both
    /// slot sums are 3, so both arms absorb exactly the same drift and the round's ratio
    /// `(B₁ + B₂) / (A₁ + A₂)` equals the true cost ratio for any slope `s` — each round
    /// is unbiased on its own, so their median is too. Alternating the leading arm also
    /// spreads any "first region of a round" effect evenly over both arms.
    #[default]
    Abba,
    /// Each round is `A B A B`: B always runs one slot after A, so a linear drift of
    /// slope `s` per slot biases every round's ratio by about `+s` (slot sums 2 vs 4).
    Abab,
}

impl PairOrder {
    /// `"ABBA"` or `"ABAB"`.
    pub fn label(self) -> &'static str {
        match self {
            PairOrder::Abba => "ABBA",
            PairOrder::Abab => "ABAB",
        }
    }
}

/// The four arms of round `round` (0-based) under `order`.
pub fn round_order(order: PairOrder, round: usize) -> [Arm; 4] {
    match order {
        PairOrder::Abba if round.is_multiple_of(2) => [Arm::A, Arm::B, Arm::B, Arm::A],
        PairOrder::Abba => [Arm::B, Arm::A, Arm::A, Arm::B],
        PairOrder::Abab => [Arm::A, Arm::B, Arm::A, Arm::B],
    }
}

/// The whole schedule: `rounds × 4` arms in the order they are timed.
pub fn schedule(order: PairOrder, rounds: usize) -> Vec<Arm> {
    (0..rounds)
        .flat_map(|round| round_order(order, round))
        .collect()
}

/// One round's two numbers, from the region times of its four slots.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RoundSummary {
    /// Time of arm A's two regions added (seconds, or any unit shared with `b_total`).
    pub a_total: f64,
    /// Time of arm B's two regions added.
    pub b_total: f64,
    /// `b_total / a_total`: above 1 means B is slower.
    pub ratio: f64,
    /// `(b_total − a_total) / 2`: the per-region difference, same unit as the inputs.
    pub delta: f64,
}

/// Summarises each round of a `schedule(order, n)` whose region times, in schedule
/// order, are `region_times` (any unit). Trailing times that do not fill a round are
/// ignored. A round whose A total is not positive gets a NaN ratio.
pub fn summarise_rounds(order: PairOrder, region_times: &[f64]) -> Vec<RoundSummary> {
    region_times
        .chunks_exact(4)
        .enumerate()
        .map(|(round, times)| {
            let arms = round_order(order, round);
            let mut a_total = 0.0;
            let mut b_total = 0.0;
            for (arm, time) in arms.iter().zip(times) {
                match arm {
                    Arm::A => a_total += time,
                    Arm::B => b_total += time,
                }
            }
            let ratio = if a_total > 0.0 {
                b_total / a_total
            } else {
                f64::NAN
            };
            RoundSummary {
                a_total,
                b_total,
                ratio,
                delta: (b_total - a_total) / 2.0,
            }
        })
        .collect()
}

/// Limits of the paired publishability rule.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PairThresholds {
    /// Fewest rounds a publishable comparison has. Default 8.
    pub minimum_rounds: usize,
    /// Largest publishable ratio spread (`(p90 − p10) / median` of the per-round
    /// ratios, [`Paired::ratio_spread`](super::Paired::ratio_spread)). Default 0.20.
    pub maximum_ratio_spread: f64,
    /// Largest publishable between-arm clock gap ([`ArmGap::gap`]: the mean clock
    /// figure of arm B's regions against arm A's). Default 0.02 (the seed's rule).
    pub maximum_clock_gap: f64,
}

impl Default for PairThresholds {
    fn default() -> Self {
        PairThresholds {
            minimum_rounds: 8,
            maximum_ratio_spread: 0.20,
            maximum_clock_gap: 0.02,
        }
    }
}

impl PairThresholds {
    /// Checks the limits: `minimum_rounds ≤ MAX_ROUNDS`, a finite non-negative spread
    /// limit, a clock-gap limit in `[0, 1]`.
    ///
    /// # Errors
    /// [`HostCostError::InvalidOptions`] naming the field and its bound.
    pub fn validate(&self) -> Result<(), HostCostError> {
        if self.minimum_rounds > MAX_ROUNDS {
            return Err(HostCostError::invalid_option(
                "PairThresholds::minimum_rounds",
                self.minimum_rounds,
                format!("between 0 and {MAX_ROUNDS}"),
            ));
        }
        if !(self.maximum_ratio_spread >= 0.0 && self.maximum_ratio_spread <= 1e12) {
            return Err(HostCostError::invalid_option(
                "PairThresholds::maximum_ratio_spread",
                self.maximum_ratio_spread,
                "to a finite number between 0 and 1e12",
            ));
        }
        if !(self.maximum_clock_gap >= 0.0 && self.maximum_clock_gap <= 1.0) {
            return Err(HostCostError::invalid_option(
                "PairThresholds::maximum_clock_gap",
                self.maximum_clock_gap,
                "to a fraction between 0 and 1",
            ));
        }
        Ok(())
    }
}

/// Why a paired comparison may not be published.
#[derive(Clone, Debug, PartialEq)]
pub enum NotPublishable {
    /// Fewer rounds than `minimum_rounds`.
    TooFewRounds {
        /// Rounds measured.
        rounds: usize,
        /// Rounds required.
        required: usize,
    },
    /// The ratio spread is above the limit, or could not be computed (`spread` NaN).
    RatioSpreadTooLarge {
        /// Measured spread.
        spread: f64,
        /// Limit.
        limit: f64,
    },
    /// The clock ran at a different speed under arm B than under arm A: the difference
    /// may be the machine's, not the code's.
    ClockGapTooLarge {
        /// Measured gap `|mean B − mean A| / mean A`.
        gap: f64,
        /// Limit.
        limit: f64,
    },
    /// No between-arm clock figure exists (no region of one arm, or the reference could
    /// not calibrate), so equal conditions are unproven.
    ClockGapUnknown,
    /// The hypervisor stole a different share of the machine under arm B than under
    /// arm A, by more than the limit and by more than three standard errors of the
    /// 10 ms tick counting.
    StealGapTooLarge {
        /// Steal share during arm A's regions.
        share_a: f64,
        /// Steal share during arm B's regions.
        share_b: f64,
        /// Limit on their difference.
        limit: f64,
    },
}

impl fmt::Display for NotPublishable {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotPublishable::TooFewRounds { rounds, required } => {
                write!(formatter, "too few rounds: {rounds} < {required}")
            }
            NotPublishable::RatioSpreadTooLarge { spread, limit } => write!(
                formatter,
                "ratio spread too large: {:.1}% > {:.1}%",
                spread * 100.0,
                limit * 100.0
            ),
            NotPublishable::ClockGapTooLarge { gap, limit } => write!(
                formatter,
                "clock gap between arms too large: {:.2}% > {:.2}%",
                gap * 100.0,
                limit * 100.0
            ),
            NotPublishable::ClockGapUnknown => {
                formatter.write_str("clock gap between arms unknown")
            }
            NotPublishable::StealGapTooLarge {
                share_a,
                share_b,
                limit,
            } => write!(
                formatter,
                "steal differs between arms: A {:.2}%, B {:.2}% (limit {:.2}%)",
                share_a * 100.0,
                share_b * 100.0,
                limit * 100.0
            ),
        }
    }
}

/// Every reason a comparison with `rounds` rounds, ratio spread `ratio_spread` and
/// between-arm clock gap `clock_gap` may not be published; empty means publishable.
/// Limits are inclusive (a spread of exactly 20 % passes).
pub fn publishability(
    rounds: usize,
    ratio_spread: Option<f64>,
    clock_gap: Option<f64>,
    thresholds: &PairThresholds,
) -> Vec<NotPublishable> {
    let mut reasons = Vec::new();
    if rounds < thresholds.minimum_rounds {
        reasons.push(NotPublishable::TooFewRounds {
            rounds,
            required: thresholds.minimum_rounds,
        });
    }
    let spread = ratio_spread.unwrap_or(f64::NAN);
    if !within_limit(spread, thresholds.maximum_ratio_spread) {
        reasons.push(NotPublishable::RatioSpreadTooLarge {
            spread,
            limit: thresholds.maximum_ratio_spread,
        });
    }
    match clock_gap {
        None => reasons.push(NotPublishable::ClockGapUnknown),
        Some(gap) if !within_limit(gap, thresholds.maximum_clock_gap) => {
            reasons.push(NotPublishable::ClockGapTooLarge {
                gap,
                limit: thresholds.maximum_clock_gap,
            })
        }
        Some(_) => {}
    }
    reasons
}

/// The between-arm clock comparison of one paired run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ArmGap {
    /// Mean clock figure over arm A's regions.
    pub mean_a: f64,
    /// Mean clock figure over arm B's regions.
    pub mean_b: f64,
    /// `|mean_b − mean_a| / mean_a`.
    pub gap: f64,
}

/// The seed's clock rule: the mean clock figure of arm A's regions against arm B's.
///
/// A core that ramps, or a neighbour that steals cycles, while one arm runs survives any
/// median of the ratios and reads as a win or a loss; this gap sees it. A trend within
/// the run does not move it (ABBA gives both arms the same slot sums, see
/// [`PairOrder::Abba`]), and region-to-region jitter only moves it by jitter/√regions.
/// `per_region[i]` belongs to the arm `schedule[i]`; extra entries of either are ignored.
/// `None` when an arm has no region or a mean is not a positive finite number.
pub fn between_arm_gap(per_region: &[f64], schedule: &[Arm]) -> Option<ArmGap> {
    let mut sums = [0.0_f64; 2];
    let mut counts = [0_usize; 2];
    for (figure, arm) in per_region.iter().zip(schedule) {
        let slot = usize::from(*arm == Arm::B);
        sums[slot] += figure;
        counts[slot] += 1;
    }
    if counts[0] == 0 || counts[1] == 0 {
        return None;
    }
    let mean_a = sums[0] / counts[0] as f64;
    let mean_b = sums[1] / counts[1] as f64;
    if !(mean_a.is_finite() && mean_b.is_finite() && mean_a > 0.0) {
        return None;
    }
    Some(ArmGap {
        mean_a,
        mean_b,
        gap: (mean_b - mean_a).abs() / mean_a,
    })
}

/// Which arm is slower, when a difference is detected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// B takes longer than A (median ratio above 1).
    BSlower,
    /// B takes less time than A (median ratio below 1).
    BFaster,
}

/// Parameters of the "difference detected" decision.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DifferenceRule {
    /// Largest two-sided sign-test p-value that counts as a difference. Default 0.05:
    /// the false-positive rate of an A/A comparison is at most this (the exact binomial
    /// test never exceeds its level; with 10 rounds the real level is 0.021).
    pub alpha: f64,
    /// Smallest `|median ratio − 1|` that counts as a difference. Default 0.005 (0.5 %):
    /// a consistent but negligible offset (code alignment, a stray cache line) is not
    /// reported as a difference, while +1 % and +2 % effects remain detectable.
    pub minimum_effect: f64,
}

impl Default for DifferenceRule {
    fn default() -> Self {
        DifferenceRule {
            alpha: 0.05,
            minimum_effect: 0.005,
        }
    }
}

impl DifferenceRule {
    /// Checks `0 < alpha ≤ 1` and `0 ≤ minimum_effect < 1`.
    ///
    /// # Errors
    /// [`HostCostError::InvalidOptions`] naming the field and its bound.
    pub fn validate(&self) -> Result<(), HostCostError> {
        if !(self.alpha > 0.0 && self.alpha <= 1.0) {
            return Err(HostCostError::invalid_option(
                "DifferenceRule::alpha",
                self.alpha,
                "to a probability in (0, 1], e.g. 0.05",
            ));
        }
        if !(self.minimum_effect >= 0.0 && self.minimum_effect < 1.0) {
            return Err(HostCostError::invalid_option(
                "DifferenceRule::minimum_effect",
                self.minimum_effect,
                "to a fraction in [0, 1), e.g. 0.005",
            ));
        }
        Ok(())
    }
}

/// The "difference detected" decision and every input it used.
///
/// Rule: an exact two-sided **sign test** on the per-round ratios (rounds above 1 vs
/// below 1; rounds exactly at 1 are dropped) with p-value ≤ `alpha`, **and** a median
/// ratio at least `minimum_effect` away from 1. Under an A/A comparison with ABBA
/// rounds each round's ratio is as likely above 1 as below, so the false-positive rate
/// is at most `alpha` whatever the noise distribution; on a quiet machine a +2 % effect
/// puts every round on the same side, which 10 rounds turn into p = 0.002.
/// With `n` rounds the smallest attainable p-value is `2 / 2ⁿ`: 6 rounds or more are
/// needed for `alpha = 0.05`.
#[derive(Clone, Debug, PartialEq)]
pub struct DifferenceDecision {
    /// Rounds with ratio above 1.
    pub rounds_above: usize,
    /// Rounds with ratio below 1.
    pub rounds_below: usize,
    /// Rounds with ratio exactly 1 or NaN (ignored by the test).
    pub rounds_ignored: usize,
    /// Exact two-sided sign-test p-value (1 when no round is informative).
    pub p_value: f64,
    /// Median of the per-round ratios (NaN when there are none).
    pub median_ratio: f64,
    /// The rule applied.
    pub rule: DifferenceRule,
    /// Whether a difference was detected.
    pub detected: bool,
    /// Direction of the detected difference; `None` when not detected.
    pub direction: Option<Direction>,
}

/// Informative rounds up to which [`sign_test_p_value`] sums the binomial tail exactly
/// (2⁴⁰; no options allow more than [`MAX_ROUNDS`]). The sum then takes at most about
/// 5·10⁶ steps (the tail is summed from the observed count outwards until its terms fall
/// below 10⁻¹⁷ of the sum, which happens within 9 standard deviations).
pub const SIGN_TEST_EXACT_LIMIT: u64 = 1 << 40;

/// Largest number of rounds (paired) or regions (cells) any option may ask for: enough
/// for hours of measurement, small enough that the schedule and sample vectors stay
/// within a few megabytes.
pub const MAX_ROUNDS: usize = 100_000;

/// Exact two-sided sign-test p-value for `above` successes against `below` failures:
/// `min(1, 2 × P(X ≥ max(above, below)))` with `X ~ Binomial(above + below, ½)`.
///
/// Bounded in time for every input: the tail is summed term by term from the observed
/// count (the first term from Loader's saddle-point formula, accurate to a few ulps at
/// any size), stopping once the terms no longer change the sum. Beyond
/// [`SIGN_TEST_EXACT_LIMIT`] informative rounds the continuity-corrected normal
/// approximation is used instead (relative error below 10⁻⁶ at that size).
pub fn sign_test_p_value(above: usize, below: usize) -> f64 {
    let trials = above as u128 + below as u128;
    if trials == 0 {
        return 1.0;
    }
    let larger = above.max(below) as u128;
    // 2·P(X ≥ ⌈n/2⌉) ≥ 1: no evidence either way.
    if 2 * larger <= trials + 1 {
        return 1.0;
    }
    if trials > u128::from(SIGN_TEST_EXACT_LIMIT) {
        let n = trials as f64;
        let z = (larger as f64 - 0.5 - n / 2.0) / (n.sqrt() / 2.0);
        return erfc(z / std::f64::consts::SQRT_2).min(1.0);
    }
    let n = trials as u64;
    let k = larger as u64;
    let mut term = binomial_half_pmf(n, k);
    let mut tail = 0.0_f64;
    let mut successes = k;
    loop {
        tail += term;
        if successes == n || term == 0.0 || term < tail * 1e-17 {
            break;
        }
        term *= (n - successes) as f64 / (successes + 1) as f64;
        successes += 1;
    }
    (2.0 * tail).min(1.0)
}

/// `P(X = k)` for `X ~ Binomial(n, ½)`, by Loader's saddle-point expansion (the method
/// of R's `dbinom`): exact to a few ulps at any `n`, with no factorial that overflows.
fn binomial_half_pmf(n: u64, k: u64) -> f64 {
    if k > n {
        return 0.0;
    }
    if k == 0 || k == n {
        return (-(n as f64) * std::f64::consts::LN_2).exp();
    }
    let (nf, kf, rest) = (n as f64, k as f64, (n - k) as f64);
    let half = nf / 2.0;
    let log = stirling_error(n)
        - stirling_error(k)
        - stirling_error(n - k)
        - deviance(kf, half)
        - deviance(rest, half)
        + 0.5 * (nf / (2.0 * std::f64::consts::PI * kf * rest)).ln();
    log.exp()
}

/// `ln(m!) − ((m + ½)·ln m − m + ½·ln 2π)`: the error of Stirling's formula.
fn stirling_error(m: u64) -> f64 {
    const S0: f64 = 1.0 / 12.0;
    const S1: f64 = 1.0 / 360.0;
    const S2: f64 = 1.0 / 1260.0;
    const S3: f64 = 1.0 / 1680.0;
    const S4: f64 = 1.0 / 1188.0;
    let x = m as f64;
    if m <= 15 {
        let ln_factorial: f64 = (2..=m).map(|i| (i as f64).ln()).sum();
        let half_ln_two_pi = 0.5 * (2.0 * std::f64::consts::PI).ln();
        return ln_factorial - ((x + 0.5) * x.ln() - x + half_ln_two_pi);
    }
    let x2 = x * x;
    if m > 500 {
        (S0 - S1 / x2) / x
    } else if m > 80 {
        (S0 - (S1 - S2 / x2) / x2) / x
    } else if m > 35 {
        (S0 - (S1 - (S2 - S3 / x2) / x2) / x2) / x
    } else {
        (S0 - (S1 - (S2 - (S3 - S4 / x2) / x2) / x2) / x2) / x
    }
}

/// `x·ln(x / mean) + mean − x`, computed without cancellation when `x` is near `mean`.
fn deviance(x: f64, mean: f64) -> f64 {
    if (x - mean).abs() < 0.1 * (x + mean) {
        let v = (x - mean) / (x + mean);
        let mut sum = (x - mean) * v;
        let mut power = 2.0 * x * v;
        let v2 = v * v;
        // |v| < 0.1: each term shrinks by 100×, so this ends within 10 terms.
        for j in 1..64 {
            power *= v2;
            let next = sum + power / f64::from(2 * j + 1);
            if next == sum {
                return next;
            }
            sum = next;
        }
        sum
    } else {
        x * (x / mean).ln() + mean - x
    }
}

/// Complementary error function (Numerical Recipes' Chebyshev fit, relative error below
/// 1.2·10⁻⁷), used only by the sign test's normal approximation beyond
/// [`SIGN_TEST_EXACT_LIMIT`].
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let polynomial = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let value = t * polynomial.exp();
    if x >= 0.0 {
        value
    } else {
        2.0 - value
    }
}

/// Applies [`DifferenceDecision`]'s rule to per-round ratios (B/A).
pub fn decide_difference(ratios: &[f64], rule: &DifferenceRule) -> DifferenceDecision {
    let rounds_above = ratios.iter().filter(|&&r| r > 1.0).count();
    let rounds_below = ratios.iter().filter(|&&r| r < 1.0).count();
    let rounds_ignored = ratios.len() - rounds_above - rounds_below;
    let p_value = sign_test_p_value(rounds_above, rounds_below);
    let median_ratio = median(ratios).unwrap_or(f64::NAN);
    let detected = p_value <= rule.alpha && (median_ratio - 1.0).abs() >= rule.minimum_effect;
    let direction = if !detected {
        None
    } else if median_ratio > 1.0 {
        Some(Direction::BSlower)
    } else {
        Some(Direction::BFaster)
    };
    DifferenceDecision {
        rounds_above,
        rounds_below,
        rounds_ignored,
        p_value,
        median_ratio,
        rule: *rule,
        detected,
        direction,
    }
}

/// Within-run clock drift of a run from its per-region clock figures (busy-weighted MHz
/// or the spin reference's rate), flagged when above `limit`: an **advisory** since
/// the paired design (ABBA cancels a trend within a run; the verdict of a paired comparison is
/// the between-arm gap, [`between_arm_gap`]).
///
/// Drift is a change of the clock over the run, not its region-to-region jitter: the
/// figures are cut into three consecutive thirds, and drift is the spread of the
/// thirds' medians over the overall median. A step or a trend moves a third's median;
/// jitter does not. (The first version used `(max − min) / median` of all regions; on
/// the GPU machine's VM the spin reference jitters by 3–15 % from one region to the next
/// while cells timed across the same regions kept a spread under 1 %, so that rule
/// declared every comparison there unpublishable without detecting any drift. The
/// jitter is still reported beside it: [`clock_jitter`].) Series of one or two figures
/// fall back to their relative spread. `None` when no figure exists.
pub fn clock_drift(per_region: &[f64], limit: f64) -> Option<(f64, bool)> {
    let drift = if per_region.len() < 3 {
        relative_spread(per_region)?
    } else {
        let overall = median(per_region)?;
        if overall.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
            return None;
        }
        let n = per_region.len();
        let thirds = [
            &per_region[..n / 3],
            &per_region[n / 3..(2 * n) / 3],
            &per_region[(2 * n) / 3..],
        ];
        let medians: Vec<f64> = thirds.iter().filter_map(|t| median(t)).collect();
        (maximum(&medians)? - minimum(&medians)?) / overall
    };
    Some((drift, !within_limit(drift, limit)))
}

/// Region-to-region jitter of the clock figures: their [`relative_spread`]. Reported,
/// never a publication rule.
pub fn clock_jitter(per_region: &[f64]) -> Option<f64> {
    relative_spread(per_region)
}
