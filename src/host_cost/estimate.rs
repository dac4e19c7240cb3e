//! Estimator arithmetic as pure functions over sample slices.
//!
//! Everything that turns timings into a quoted number or a verdict lives here, with no
//! clock read and no I/O, so that every rule of §6 can be tested on fixed samples:
//! minimum, median, quantiles, relative standard deviation, the cell verdict, the ABBA
//! schedule and its per-round ratios, the paired publishability rule with its reasons,
//! the "difference detected" decision and the clock-drift rule.
//!
//! Conventions: functions return `None` for an empty slice (or another input that has no
//! defined answer) instead of panicking; NaN samples are ordered with `f64::total_cmp`
//! (after every finite number), so they never cause a panic but do poison the estimate
//! they reach, which is the honest outcome for a broken sample.

use std::fmt;

/// Smallest sample, or `None` for an empty slice.
///
/// The minimum is the cell estimator of §6: interference on a host (preemption, cache
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

/// Thresholds of the cell verdict (§6). Both bounds are inclusive.
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

/// Limits of the paired publishability rule (§6).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PairThresholds {
    /// Fewest rounds a publishable comparison has. Default 8.
    pub minimum_rounds: usize,
    /// Largest publishable [`ratio_spread`]. Default 0.20.
    pub maximum_ratio_spread: f64,
    /// Largest publishable clock drift ([`relative_spread`] of the per-region clock).
    /// Default 0.02.
    pub maximum_clock_drift: f64,
}

impl Default for PairThresholds {
    fn default() -> Self {
        PairThresholds {
            minimum_rounds: 8,
            maximum_ratio_spread: 0.20,
            maximum_clock_drift: 0.02,
        }
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
    /// The clock drifted more than the limit during the comparison.
    ClockDriftTooLarge {
        /// Measured drift.
        drift: f64,
        /// Limit.
        limit: f64,
    },
    /// No drift figure exists (fewer than one region), so stability is unproven.
    ClockDriftUnknown,
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
            NotPublishable::ClockDriftTooLarge { drift, limit } => write!(
                formatter,
                "clock drift too large: {:.2}% > {:.2}%",
                drift * 100.0,
                limit * 100.0
            ),
            NotPublishable::ClockDriftUnknown => formatter.write_str("clock drift unknown"),
        }
    }
}

/// Every reason a comparison with `rounds` rounds, ratio spread `ratio_spread` and clock
/// drift `clock_drift` may not be published; empty means publishable. Limits are
/// inclusive (a spread of exactly 20 % passes).
pub fn publishability(
    rounds: usize,
    ratio_spread: Option<f64>,
    clock_drift: Option<f64>,
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
    match clock_drift {
        None => reasons.push(NotPublishable::ClockDriftUnknown),
        Some(drift) if !within_limit(drift, thresholds.maximum_clock_drift) => {
            reasons.push(NotPublishable::ClockDriftTooLarge {
                drift,
                limit: thresholds.maximum_clock_drift,
            })
        }
        Some(_) => {}
    }
    reasons
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

/// Exact two-sided sign-test p-value for `above` successes against `below` failures:
/// `min(1, 2 × P(X ≥ max(above, below)))` with `X ~ Binomial(above + below, ½)`.
pub fn sign_test_p_value(above: usize, below: usize) -> f64 {
    let trials = above + below;
    if trials == 0 {
        return 1.0;
    }
    let larger = above.max(below);
    // ln C(n, k) built incrementally so large round counts neither overflow nor underflow.
    let ln_half_power = trials as f64 * std::f64::consts::LN_2;
    let mut ln_choose = 0.0_f64; // ln C(n, 0)
    let mut tail = 0.0_f64;
    for successes in 0..=trials {
        if successes >= larger {
            tail += (ln_choose - ln_half_power).exp();
        }
        if successes < trials {
            ln_choose += ((trials - successes) as f64).ln() - ((successes + 1) as f64).ln();
        }
    }
    (2.0 * tail).min(1.0)
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

/// Clock drift of a run from its per-region clock figures (busy-weighted MHz or the spin
/// reference's rate), flagged when above `limit` (§6: 0.02).
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
