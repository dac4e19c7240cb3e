//! Self-tests of the host-cost harness on the CPU: no GPU, not ignored.
//!
//! Two kinds of test live here. Estimator tests feed fixed or synthetic samples to the
//! pure functions and assert exact arithmetic. Timing tests run real closures with small
//! calibration targets; they assert only outcomes that hold with a wide margin on a
//! loaded 2-core machine (never a wall-clock bound), so they are not flaky: they hold a
//! shared lock so they never time each other's load, and where a loaded machine can hide
//! a real effect for a while (a detection, a ratio) they allow a few attempts, while a
//! defect fails every attempt.

use std::hint::black_box;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use vyre_cuda::host_cost::estimate::{
    self, cell_verdict, decide_difference, publishability, schedule, sign_test_p_value,
    summarise_rounds,
};
use vyre_cuda::host_cost::{
    read_capped, Arm, Cell, CellOptions, CellThresholds, CellVerdict, ClockDrift, ClockMonitor,
    ClockOptions, ClockSource, ClockSourceChoice, DifferenceRule, Direction, HostCostError,
    NotPublishable, PairOptions, PairOrder, PairThresholds, Paired, Probe, Report,
};

// ---------------------------------------------------------------------------------------
// Work for the timing tests.
// ---------------------------------------------------------------------------------------

/// `iterations × cost × 64` steps of a dependent multiply-rotate chain: cannot be
/// vectorised, hoisted or computed in closed form, and its digest depends on every step.
fn chain_work(iterations: u64, cost: u64) -> u64 {
    let mut state = black_box(0x243F_6A88_85A3_08D3_u64);
    for _ in 0..iterations * cost * 64 {
        state = state.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29) ^ 0x1357;
    }
    state
}

/// Serialises the timing tests: run in parallel on two cores they would contend with
/// each other, which is self-inflicted noise, not the machine's.
fn timing_lock() -> MutexGuard<'static, ()> {
    static TIMING: Mutex<()> = Mutex::new(());
    TIMING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Attempts a loaded machine gets before a detection or ratio test fails.
const ATTEMPTS: usize = 3;

fn quick_cell_options() -> CellOptions {
    CellOptions::with_targets(Duration::from_millis(20), Duration::from_millis(5))
}

/// Many short rounds: on a loaded machine a preemption lasts several milliseconds and
/// spoils whichever round it lands in, so half-millisecond regions keep most rounds
/// clean and the sign test counts rounds, not milliseconds. (Long regions, tried first,
/// let load average 6 spoil nearly every round: ratios from 0.2 to 9.)
fn quick_pair_options(rounds: usize) -> PairOptions {
    PairOptions::with_targets(
        Duration::from_micros(500),
        Duration::from_micros(200),
        rounds,
    )
}

fn steady_clock() -> ClockDrift {
    ClockDrift::from_regions(
        ClockSource::SpinReference,
        vec![1000.0; 8],
        0.02,
        Vec::new(),
    )
}

// ---------------------------------------------------------------------------------------
// Bounded reads.
// ---------------------------------------------------------------------------------------

/// Locks out an off-by-one in the byte cap (a file exactly at the cap rejected, or one
/// byte over accepted) and a missing file being treated as an error: the harness's rule is that a file at
/// the cap is accepted, over it rejected, missing → none.
#[test]
fn read_capped_accepts_at_cap_rejects_one_over_and_maps_missing_to_none() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cap = 64_u64;
    let at_cap = dir.path().join("at_cap");
    std::fs::write(&at_cap, vec![b'7'; cap as usize]).expect("write");
    let over_cap = dir.path().join("over_cap");
    std::fs::write(&over_cap, vec![b'7'; cap as usize + 1]).expect("write");

    let read = read_capped(&at_cap, cap).expect("at cap is accepted");
    assert_eq!(read.map(|bytes| bytes.len()), Some(cap as usize));

    match read_capped(&over_cap, cap) {
        Err(HostCostError::FileTooLarge { cap: reported, .. }) => assert_eq!(reported, cap),
        other => panic!("one byte over the cap must be rejected, got {other:?}"),
    }
    let message = read_capped(&over_cap, cap).unwrap_err().to_string();
    assert!(message.starts_with("Fix:"), "{message}");

    let missing = dir.path().join("missing");
    assert!(read_capped(&missing, cap)
        .expect("missing is not an error")
        .is_none());
}

/// Locks out a reader that allocates whatever a path holds: a large file under a small
/// cap is rejected (and, by construction, at most cap + 1 bytes were read).
#[test]
fn read_capped_rejects_a_large_file_under_a_small_cap() {
    let dir = tempfile::tempdir().expect("temp dir");
    let big = dir.path().join("big");
    std::fs::write(&big, vec![0_u8; 1 << 20]).expect("write");
    assert!(matches!(
        read_capped(&big, 64),
        Err(HostCostError::FileTooLarge { .. })
    ));
    assert!(read_capped(&big, 1 << 20).expect("exactly 1 MiB").is_some());
}

// ---------------------------------------------------------------------------------------
// Estimator arithmetic on fixed samples.
// ---------------------------------------------------------------------------------------

/// Locks out a wrong estimator: minimum not the smallest, median of an even count not
/// the mean of the middle two, NaN-unsafe sorting, or a population (n) divisor in the
/// relative standard deviation where the sample (n − 1) divisor is documented.
#[test]
fn estimators_on_fixed_samples() {
    assert_eq!(estimate::minimum(&[3.0, 1.5, 2.0]), Some(1.5));
    assert_eq!(estimate::minimum(&[]), None);
    assert_eq!(estimate::maximum(&[3.0, 1.5, 2.0]), Some(3.0));
    assert_eq!(estimate::median(&[5.0, 1.0, 3.0]), Some(3.0));
    assert_eq!(estimate::median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
    assert_eq!(estimate::median(&[7.0]), Some(7.0));
    assert_eq!(estimate::median(&[]), None);
    assert_eq!(
        estimate::quantile(&[1.0, 2.0, 3.0, 4.0, 5.0], 0.1),
        Some(1.4)
    );
    assert_eq!(
        estimate::quantile(&[1.0, 2.0, 3.0, 4.0, 5.0], 0.5),
        Some(3.0)
    );
    assert_eq!(estimate::quantile(&[1.0, 2.0], 1.5), None);

    // mean 3, sample variance 10 / 4 = 2.5
    let rsd = estimate::relative_std_dev(&[1.0, 2.0, 3.0, 4.0, 5.0]).expect("rsd");
    assert!((rsd - 2.5_f64.sqrt() / 3.0).abs() < 1e-12, "{rsd}");
    assert_eq!(estimate::relative_std_dev(&[2.0, 2.0, 2.0]), Some(0.0));
    assert_eq!(estimate::relative_std_dev(&[2.0]), None);

    assert_eq!(estimate::relative_spread(&[100.0, 98.0, 102.0]), Some(0.04));
    // ratios 0.9 .. 1.3: p10 = 0.94, p90 = 1.26, median 1.1
    let spread = estimate::ratio_spread(&[0.9, 1.0, 1.1, 1.2, 1.3]).expect("spread");
    assert!((spread - 0.32 / 1.1).abs() < 1e-12, "{spread}");
}

/// Locks out off-by-one verdict thresholds: exactly 5 % is ok and exactly 20 % is
/// advisory (both bounds inclusive), a hair above each moves down one class, and a
/// missing or NaN spread is void, never ok.
#[test]
fn cell_verdict_thresholds_at_the_boundaries() {
    let thresholds = CellThresholds::default();
    let verdict = |rsd| cell_verdict(100.0, rsd, &thresholds);
    assert_eq!(verdict(Some(0.0)), CellVerdict::Ok);
    assert_eq!(verdict(Some(0.05)), CellVerdict::Ok);
    assert_eq!(verdict(Some(0.050_001)), CellVerdict::Advisory);
    assert_eq!(verdict(Some(0.20)), CellVerdict::Advisory);
    assert_eq!(verdict(Some(0.200_001)), CellVerdict::Void);
    assert_eq!(verdict(None), CellVerdict::Void);
    assert_eq!(verdict(Some(f64::NAN)), CellVerdict::Void);
    assert_eq!(
        cell_verdict(0.99, Some(0.0), &thresholds),
        CellVerdict::OptimisedAway
    );
    assert_eq!(cell_verdict(1.0, Some(0.0), &thresholds), CellVerdict::Ok);
    assert_eq!(
        cell_verdict(f64::NAN, Some(0.0), &thresholds),
        CellVerdict::OptimisedAway
    );
}

/// Locks out a publishability verdict that hides a failing condition: each of too few
/// rounds, spread too large and clock gap too large is reported on its own and together,
/// the limits are inclusive, and an unknown gap is a reason, not a pass.
#[test]
fn publishability_lists_every_reason() {
    let limits = PairThresholds::default();
    assert!(publishability(8, Some(0.20), Some(0.02), &limits).is_empty());
    assert_eq!(
        publishability(7, Some(0.1), Some(0.01), &limits),
        vec![NotPublishable::TooFewRounds {
            rounds: 7,
            required: 8
        }]
    );
    assert_eq!(
        publishability(8, Some(0.21), Some(0.01), &limits),
        vec![NotPublishable::RatioSpreadTooLarge {
            spread: 0.21,
            limit: 0.20
        }]
    );
    assert_eq!(
        publishability(8, Some(0.1), Some(0.03), &limits),
        vec![NotPublishable::ClockGapTooLarge {
            gap: 0.03,
            limit: 0.02
        }]
    );
    assert_eq!(
        publishability(8, Some(0.1), None, &limits),
        vec![NotPublishable::ClockGapUnknown]
    );
    assert_eq!(publishability(3, None, Some(0.5), &limits).len(), 3);
}

/// Locks out a wrong sign-test tail (one-sided, or off by one in the tail) that would
/// make the A/A false-positive rate differ from the documented level.
#[test]
fn sign_test_p_values_are_exact() {
    assert!((sign_test_p_value(10, 0) - 2.0 / 1024.0).abs() < 1e-15);
    assert!((sign_test_p_value(0, 10) - 2.0 / 1024.0).abs() < 1e-15);
    // 9 of 10: 2 × (10 + 1) / 1024
    assert!((sign_test_p_value(9, 1) - 22.0 / 1024.0).abs() < 1e-15);
    assert_eq!(sign_test_p_value(5, 5), 1.0);
    assert_eq!(sign_test_p_value(0, 0), 1.0);
    // large counts neither overflow nor underflow to garbage
    let p = sign_test_p_value(600, 400);
    assert!(p > 0.0 && p < 1e-9, "{p}");
}

/// Locks out a difference decision that fires on a consistent-but-negligible offset,
/// ignores the direction, or fires without a significant sign test.
#[test]
fn difference_decision_on_fixed_ratios() {
    let rule = DifferenceRule::default();
    let slower = decide_difference(&[1.03; 10], &rule);
    assert!(slower.detected);
    assert_eq!(slower.direction, Some(Direction::BSlower));
    assert_eq!((slower.rounds_above, slower.rounds_below), (10, 0));

    let faster = decide_difference(&[0.97; 10], &rule);
    assert_eq!(faster.direction, Some(Direction::BFaster));

    let negligible = decide_difference(&[1.001; 10], &rule);
    assert!(!negligible.detected, "below the minimum effect");

    let mixed = decide_difference(&[1.05, 0.95, 1.04, 0.96, 1.05, 0.97, 1.02, 0.99], &rule);
    assert!(!mixed.detected, "sign test not significant");
    assert_eq!(decide_difference(&[1.0; 8], &rule).rounds_ignored, 8);
}

// ---------------------------------------------------------------------------------------
// Drift and ABBA on injected sample streams.
// ---------------------------------------------------------------------------------------

/// Locks out an inert drift advisory: a planted 3 % clock step between regions raises
/// it, a steady clock with 0.5 % jitter does not (negative control). Without arms (a
/// cell) nothing is flagged: the verdict is the between-arm gap.
#[test]
fn drift_advisory_fires_on_a_planted_clock_step() {
    let step = vec![3000.0, 3001.0, 2999.0, 2910.0, 2911.0, 2909.0];
    let stepped = ClockDrift::from_regions(ClockSource::Cpufreq, step, 0.02, Vec::new());
    assert!(stepped.drift_advisory, "{stepped:?}");
    assert!(!stepped.flagged, "no arms, no verdict: {stepped:?}");
    assert!(stepped.drift.expect("drift") > 0.02);

    let steady = vec![3000.0, 3010.0, 2995.0, 3005.0, 2998.0, 3002.0];
    let calm = ClockDrift::from_regions(ClockSource::Cpufreq, steady, 0.02, Vec::new());
    assert!(!calm.drift_advisory, "{calm:?}");
    assert_eq!(
        ClockDrift::from_regions(ClockSource::Cpufreq, Vec::new(), 0.02, Vec::new()).drift,
        None
    );
}

/// Locks out a drift advisory that mistakes jitter for drift: a clock that jitters by
/// ±5 % around a steady centre does not raise it, though its jitter is reported, while
/// the same jitter riding on a 4 % trend does (negative control).
#[test]
fn drift_advisory_ignores_jitter_but_not_a_trend() {
    let jitter = [1.0, 0.95, 1.05, 0.97, 1.03, 1.0];
    let steady: Vec<f64> = (0..48).map(|i| 3000.0 * jitter[i % 6]).collect();
    let calm =
        ClockDrift::from_regions(ClockSource::SpinReference, steady.clone(), 0.02, Vec::new());
    assert!(!calm.drift_advisory, "{calm:?}");
    assert!(calm.jitter.expect("jitter") > 0.09, "{calm:?}");
    let trending: Vec<f64> = steady
        .iter()
        .enumerate()
        .map(|(i, v)| v * (1.0 - 0.04 * i as f64 / 47.0))
        .collect();
    let drifting = ClockDrift::from_regions(ClockSource::SpinReference, trending, 0.02, Vec::new());
    assert!(drifting.drift_advisory, "{drifting:?}");
}

/// Region times of `schedule(order, rounds)` under a linear drift: a region at global
/// slot `t` of arm `X` costs `cost_X × (1 + slope × t)`.
fn drifting_stream(order: PairOrder, rounds: usize, cost_b: f64, slope: f64) -> Vec<f64> {
    schedule(order, rounds)
        .iter()
        .enumerate()
        .map(|(slot, arm)| {
            let cost = if *arm == Arm::A { 1.0 } else { cost_b };
            cost * (1.0 + slope * slot as f64)
        })
        .collect()
}

/// Locks out a pairing order that lets drift masquerade as a difference: under a planted
/// linear drift ABBA's median ratio is the true ratio (1 for A/A, 1.1 for a 10 %
/// slowdown) and no A/A difference is detected, while ABAB — the negative control — is
/// biased upward and falsely detects one.
#[test]
fn abba_cancels_linear_drift_that_abab_does_not() {
    let rule = DifferenceRule::default();
    for cost_b in [1.0, 1.1] {
        let abba = summarise_rounds(
            PairOrder::Abba,
            &drifting_stream(PairOrder::Abba, 12, cost_b, 0.02),
        );
        let ratios: Vec<f64> = abba.iter().map(|round| round.ratio).collect();
        for ratio in &ratios {
            assert!((ratio - cost_b).abs() < 1e-9, "ABBA round ratio {ratio}");
        }
        let abab = summarise_rounds(
            PairOrder::Abab,
            &drifting_stream(PairOrder::Abab, 12, cost_b, 0.02),
        );
        let abab_ratios: Vec<f64> = abab.iter().map(|round| round.ratio).collect();
        let abab_median = estimate::median(&abab_ratios).expect("median");
        assert!(
            abab_median > cost_b * 1.01,
            "ABAB should be biased upward, got {abab_median} for true {cost_b}"
        );
        if cost_b == 1.0 {
            assert!(!decide_difference(&ratios, &rule).detected);
            assert!(decide_difference(&abab_ratios, &rule).detected);
        }
    }
    assert_eq!(
        schedule(PairOrder::Abba, 2),
        vec![
            Arm::A,
            Arm::B,
            Arm::B,
            Arm::A,
            Arm::B,
            Arm::A,
            Arm::A,
            Arm::B
        ]
    );
}

/// Locks out `Paired::from_samples` computing the ratio upside down, mixing up which
/// region belongs to which arm, or deltas in the wrong unit: a stream where B costs 1.5×
/// (3 µs vs 2 µs per unit, 1000 units per region) gives ratio 1.5, delta +1000 ns.
#[test]
fn paired_from_samples_on_an_injected_stream() {
    let options = PairOptions::default();
    let per_region_a = 2e-3;
    let stream: Vec<f64> = schedule(PairOrder::Abba, 8)
        .iter()
        .map(|arm| {
            if *arm == Arm::A {
                per_region_a
            } else {
                per_region_a * 1.5
            }
        })
        .collect();
    let calibration = [Vec::<Probe>::new(), Vec::new()];
    let paired = Paired::from_samples(
        "a",
        "b",
        calibration,
        1000,
        stream,
        steady_clock(),
        &options,
    )
    .expect("valid samples");
    assert!((paired.median_ratio - 1.5).abs() < 1e-12);
    assert!((paired.median_delta_ns_per_unit - 1000.0).abs() < 1e-6);
    assert!((paired.minimum_ns_per_unit_a - 2000.0).abs() < 1e-6);
    assert!(paired.publishable(), "{:?}", paired.not_publishable);
    assert_eq!(paired.difference.direction, Some(Direction::BSlower));
    assert_eq!(paired.name, "b vs a");
}

// ---------------------------------------------------------------------------------------
// Real timing, robust by construction.
// ---------------------------------------------------------------------------------------

/// Locks out a harness that calls an A/A comparison a difference (a position bias the
/// ABBA order fails to cancel, or arms timed unequally). Uses α = 0.001 with 60 rounds
/// (44 of 60 on one side needed) so the test's own false-positive rate is at most 1 in
/// 1,000 runs; the default α = 0.05 rate is measured on the GPU machine instead.
#[test]
fn a_a_comparison_is_not_a_difference() {
    let _serial = timing_lock();
    let mut options = quick_pair_options(60);
    options.difference.alpha = 0.001;
    let work = |iterations| chain_work(iterations, 2);
    let paired = Paired::compare("same", work, "same again", work, &options).expect("measured");
    assert!(
        !paired.difference.detected,
        "A/A called a difference: {:?} ratios {:?}",
        paired.difference, paired.ratios
    );
    assert_eq!(paired.rounds.len(), 60);
}

/// Locks out a comparison that misses a large slowdown or reports it in the wrong
/// direction: B does 1.5× A's work, so B is slower; swapping the arms (negative control
/// of the direction) reports B faster. A loaded machine can hide the effect from one
/// attempt (noise only ever removes significance), so up to three attempts may run; a
/// detection in the wrong direction fails at once.
#[test]
fn planted_slowdown_is_detected_in_the_right_direction() {
    let _serial = timing_lock();
    let options = quick_pair_options(60);
    let light: fn(u64) -> u64 = |iterations| chain_work(iterations, 2);
    let heavy: fn(u64) -> u64 = |iterations| chain_work(iterations, 3);
    for (name_a, arm_a, name_b, arm_b, expected) in [
        ("light", light, "heavy", heavy, Direction::BSlower),
        ("heavy", heavy, "light", light, Direction::BFaster),
    ] {
        let mut attempts = Vec::new();
        for _ in 0..ATTEMPTS {
            let paired = Paired::compare(name_a, arm_a, name_b, arm_b, &options).expect("measured");
            if let Some(direction) = paired.difference.direction {
                assert_eq!(
                    direction, expected,
                    "{:?} {:?}",
                    paired.difference, paired.ratios
                );
                match expected {
                    Direction::BSlower => assert!(paired.median_ratio > 1.15, "{paired:?}"),
                    Direction::BFaster => assert!(paired.median_ratio < 0.87, "{paired:?}"),
                }
                break;
            }
            attempts.push((paired.difference, paired.ratios));
        }
        assert!(
            attempts.len() < ATTEMPTS,
            "{name_b} vs {name_a} never detected: {attempts:?}"
        );
    }
}

/// Locks out a harness that measures something other than the closure's work (work
/// deleted, iterations ignored, per-unit division wrong): twice the work per unit
/// measures 1.5–2.6× the time.
///
/// Measured as a paired comparison, not as two cells one after the other: on a loaded
/// 2-core machine a busy hyper-thread sibling can halve one cell's speed for its whole
/// duration (seen: ratios 1.07 and 3.7 from back-to-back cells), which is exactly the
/// drift interleaving cancels. A loaded machine may still spoil one attempt; up to three
/// run, while a defect fails them all.
#[test]
fn doubling_the_work_doubles_the_measured_time() {
    let _serial = timing_lock();
    let options = quick_pair_options(40);
    let mut ratios = Vec::new();
    for _ in 0..ATTEMPTS {
        let paired = Paired::compare(
            "x1",
            |n| chain_work(n, 1),
            "x2",
            |n| chain_work(n, 2),
            &options,
        )
        .expect("measured");
        ratios.push(paired.median_ratio);
        if (1.5..2.6).contains(&paired.median_ratio) {
            return;
        }
    }
    panic!("doubled work never measured 1.5-2.6x: median ratios {ratios:?}");
}

/// Locks out a cell that loses its regions or its estimate: a real cell has five
/// regions, a positive iteration count, a minimum no larger than its median, and a
/// verdict that is never optimised-away.
#[test]
fn cell_records_its_regions_and_quotes_the_minimum() {
    let _serial = timing_lock();
    let cell = Cell::measure("x1", &quick_cell_options(), |n| chain_work(n, 1)).expect("x1");
    assert_eq!(cell.region_seconds.len(), 5);
    assert_eq!(cell.ns_per_unit.len(), 5);
    assert!(cell.iterations_per_region >= 1);
    assert!(cell.minimum_ns_per_unit >= 1.0);
    assert!(cell.minimum_ns_per_unit <= cell.median_ns_per_unit);
    assert!(cell.calibration.last().expect("probes").iterations >= 1);
    assert_ne!(cell.verdict, CellVerdict::OptimisedAway);
}

/// Locks out a silent number from a probe whose work was optimised away: an empty
/// closure and one that ignores its work both fail with `OptimisedAway`, while real work
/// (negative control) measures fine.
#[test]
fn optimised_away_guard_fires_on_empty_work_only() {
    let _serial = timing_lock();
    let options = quick_cell_options();
    for (name, result) in [
        ("empty", Cell::measure("empty", &options, |_| 0)),
        ("echo", Cell::measure("echo", &options, |n| n)),
    ] {
        match result {
            Err(HostCostError::OptimisedAway { ns_per_unit, .. }) => {
                assert!(ns_per_unit < 1.0, "{name}: {ns_per_unit}")
            }
            other => panic!("{name}: expected OptimisedAway, got {other:?}"),
        }
    }
    let real = Cell::measure("real", &options, |n| chain_work(n, 1));
    assert!(real.is_ok(), "{real:?}");

    // A preemption during an early calibration probe of the empty arm can stop its
    // calibration at a handful of repetitions (so it looks slow and sizes the regions
    // to 2 repetitions, which the region overhead lifts above 1 ns): retry, as a defect
    // fails every attempt.
    let options = quick_pair_options(2);
    let mut last = None;
    for _ in 0..ATTEMPTS {
        let paired = Paired::compare("real", |n| chain_work(n, 1), "empty", |_| 0, &options);
        if matches!(paired, Err(HostCostError::OptimisedAway { .. })) {
            return;
        }
        last = Some(paired);
    }
    panic!("empty arm not refused in {ATTEMPTS} attempts: {last:?}");
}

/// Locks out an injected-sample cell that quotes anything but the minimum, or quotes a
/// sub-nanosecond figure.
#[test]
fn cell_from_samples_quotes_the_minimum_and_refuses_sub_nanosecond() {
    let thresholds = CellThresholds::default();
    let regions = vec![0.0105, 0.0100, 0.0102, 0.0101, 0.0104];
    let cell = Cell::from_samples(
        "fixed",
        Vec::new(),
        10_000,
        regions,
        steady_clock(),
        &thresholds,
    )
    .expect("cell");
    assert!((cell.minimum_ns_per_unit - 1000.0).abs() < 1e-9);
    assert_eq!(cell.verdict, CellVerdict::Ok);
    let tiny = Cell::from_samples(
        "tiny",
        Vec::new(),
        1 << 30,
        vec![0.1; 5],
        steady_clock(),
        &thresholds,
    );
    assert!(matches!(tiny, Err(HostCostError::OptimisedAway { .. })));
}

/// Locks out bad options reaching the timing loop (a zero growth factor would never end
/// calibration): they are rejected with a `Fix:` message.
#[test]
fn invalid_options_are_rejected_with_a_fix() {
    let mut options = quick_cell_options();
    options.probe_growth = 1;
    let error = Cell::measure("x", &options, |n| chain_work(n, 1)).unwrap_err();
    assert!(error.to_string().starts_with("Fix:"), "{error}");
    let mut options = quick_pair_options(0);
    options.rounds = 0;
    let error = Paired::compare("a", |n| n, "b", |n| n, &options).unwrap_err();
    assert!(error.to_string().starts_with("Fix:"), "{error}");
}

// ---------------------------------------------------------------------------------------
// Clock sources.
// ---------------------------------------------------------------------------------------

fn fake_sysfs(root: &Path, khz: &[Option<&str>]) -> ClockOptions {
    let mut stat = String::from("cpu  10 0 10 100 0 0 0 0 0 0\n");
    for cpu in 0..khz.len() {
        stat.push_str(&format!("cpu{cpu} 5 0 5 50 0 0 0 0 0 0\n"));
    }
    stat.push_str("intr 1 2 3\n");
    std::fs::write(root.join("stat"), stat).expect("stat");
    for (cpu, value) in khz.iter().enumerate() {
        if let Some(value) = value {
            let dir = root.join("cpu").join(format!("cpu{cpu}")).join("cpufreq");
            std::fs::create_dir_all(&dir).expect("dir");
            std::fs::write(dir.join("scaling_cur_freq"), value).expect("freq");
        }
    }
    ClockOptions {
        proc_stat_path: root.join("stat"),
        cpu_sysfs_dir: root.join("cpu"),
        // Absent, and no CPU-time fallback: the figures are the bare clock, so they can
        // be asserted exactly.
        schedstat_path: root.join("no-schedstat"),
        thread_cpu_fallback: false,
        ..ClockOptions::default()
    }
}

/// Locks out a silently inert drift check (the GPU VM has no cpufreq): without
/// cpufreq nodes the monitor falls back to the spin reference and still produces a drift
/// figure and names its source; with nodes present (negative control) it uses cpufreq.
#[test]
fn clock_source_falls_back_to_the_spin_reference_without_cpufreq() {
    let dir = tempfile::tempdir().expect("temp dir");
    let options = fake_sysfs(dir.path(), &[None, None]);
    let mut monitor = ClockMonitor::start(&options).expect("valid options");
    assert_eq!(monitor.source(), ClockSource::SpinReference);
    for _ in 0..4 {
        monitor.mark_boundary();
    }
    let drift = monitor.finish();
    assert_eq!(drift.source.label(), "spin-reference");
    assert_eq!(drift.per_region.len(), 3);
    assert!(drift.drift.is_some());
    assert!(drift.per_region.iter().all(|rate| *rate > 0.0));

    let dir = tempfile::tempdir().expect("temp dir");
    let options = fake_sysfs(dir.path(), &[Some("2400000\n"), None, Some("3000000\n")]);
    let mut monitor = ClockMonitor::start(&options).expect("valid options");
    assert_eq!(monitor.source(), ClockSource::Cpufreq);
    monitor.mark_boundary();
    monitor.mark_boundary();
    let drift = monitor.finish();
    assert_eq!(drift.source.label(), "cpufreq");
    // no busy jiffies elapsed between the two reads of the fixed file: plain mean.
    assert_eq!(drift.per_region, vec![2700.0]);

    let forced = ClockOptions {
        source: ClockSourceChoice::SpinReference,
        ..options
    };
    assert_eq!(
        ClockMonitor::start(&forced)
            .expect("valid options")
            .source(),
        ClockSource::SpinReference
    );
}

/// Locks out a cpufreq file over its 64-byte cap being trusted: such a CPU is not used
/// as a cpufreq source.
#[test]
fn oversized_cpufreq_file_is_not_trusted() {
    let dir = tempfile::tempdir().expect("temp dir");
    let huge = "1".repeat(65);
    let options = fake_sysfs(dir.path(), &[Some(&huge)]);
    assert_eq!(
        ClockMonitor::start(&options)
            .expect("valid options")
            .source(),
        ClockSource::SpinReference
    );
}

// ---------------------------------------------------------------------------------------
// Report.
// ---------------------------------------------------------------------------------------

/// Locks out a report that loses results or panics on an unwritable directory: both files
/// are written with the cell, comparison and failure in them, the table names each, and
/// writing under a regular file returns an error instead of panicking.
#[test]
fn report_writes_both_files_and_survives_an_unwritable_directory() {
    let thresholds = CellThresholds::default();
    let cell = Cell::from_samples(
        "dispatch \"resident\"",
        vec![Probe {
            iterations: 1,
            seconds: 1e-5,
        }],
        1000,
        vec![0.0101, 0.0100, 0.0102],
        steady_clock(),
        &thresholds,
    )
    .expect("cell");
    let stream: Vec<f64> = schedule(PairOrder::Abba, 8)
        .iter()
        .map(|arm| if *arm == Arm::A { 1e-3 } else { 1.1e-3 })
        .collect();
    let paired = Paired::from_samples(
        "eager",
        "graph",
        [Vec::new(), Vec::new()],
        100,
        stream,
        steady_clock(),
        &PairOptions::default(),
    )
    .expect("paired");
    let mut report = Report::new("self test/report");
    report.add_cell(cell);
    report.add_paired(paired);
    report.add_failure(
        "empty",
        &HostCostError::OptimisedAway {
            name: "empty".into(),
            ns_per_unit: 0.0,
            threshold_ns: 1.0,
        },
    );

    let table = report.table();
    for needle in [
        "dispatch \"resident\"",
        "graph vs eager",
        "FAILED empty",
        "spin-reference",
    ] {
        assert!(table.contains(needle), "{needle} missing from\n{table}");
    }

    let dir = tempfile::tempdir().expect("temp dir");
    let written = report.write_files(dir.path()).expect("written");
    assert_eq!(written.len(), 2);
    let samples = std::fs::read_to_string(dir.path().join("self_test_report.samples.json"))
        .expect("samples file");
    assert!(samples.contains("\"schema\": \"vyre-cuda/host-cost-samples/v1\""));
    assert!(samples.contains("\"region_seconds\": [0.0101, 0.01, 0.0102]"));
    assert!(samples.contains("dispatch \\\"resident\\\""));
    assert!(samples.contains("\"schedule\": \"ABBABAAB"));
    let bencher = std::fs::read_to_string(dir.path().join("self_test_report.bencher.json"))
        .expect("bencher file");
    assert!(bencher.contains(
        "\"latency\": {\"value\": 10000, \"lower_value\": 10000, \"upper_value\": 10200}"
    ));
    assert!(bencher.contains("\"graph vs eager\": {\"ratio\""));

    let blocker = dir.path().join("a_file");
    std::fs::write(&blocker, b"x").expect("write");
    let error = report.write_files(&blocker.join("sub")).unwrap_err();
    assert!(error.to_string().starts_with("Fix:"), "{error}");
}

/// Set in a re-run of this test binary: the child side of
/// `report_finish_writes_where_the_environment_says`.
const REPORT_CHILD_MARKER: &str = "VYRE_HOST_COST_REPORT_TEST_CHILD";

/// The child side: does nothing in a normal run; re-run with [`REPORT_CHILD_MARKER`]
/// set, it finishes a report named `child_report` wherever `report_dir()` says.
#[test]
fn report_child_finishes_a_report() {
    if std::env::var_os(REPORT_CHILD_MARKER).is_none() {
        return;
    }
    let mut report = Report::new("child_report");
    report.add_failure(
        "none",
        &HostCostError::OptimisedAway {
            name: "none".into(),
            ns_per_unit: 0.0,
            threshold_ns: 1.0,
        },
    );
    report.finish().expect("report written");
}

/// Locks out `Report::finish` writing under `target/` when the build lives in
/// `$CARGO_TARGET_DIR`, or anywhere but `$VYRE_HOST_COST_REPORT_DIR` when
/// that is set: this binary runs its child test with the variables set as a user would
/// and looks for the files. Negative control: with neither variable the files land in
/// `target/host-cost` under the child's working directory, and nowhere else.
#[test]
fn report_finish_writes_where_the_environment_says() {
    let run_child = |working_dir: &Path, report_dir: Option<&Path>, target_dir: Option<&Path>| {
        let mut child =
            std::process::Command::new(std::env::current_exe().expect("test binary path"));
        child
            .args([
                "--exact",
                "report_child_finishes_a_report",
                "--test-threads=1",
            ])
            .current_dir(working_dir)
            .env(REPORT_CHILD_MARKER, "1")
            .env_remove(vyre_cuda::host_cost::REPORT_DIR_ENV)
            .env_remove("CARGO_TARGET_DIR");
        if let Some(dir) = report_dir {
            child.env(vyre_cuda::host_cost::REPORT_DIR_ENV, dir);
        }
        if let Some(dir) = target_dir {
            child.env("CARGO_TARGET_DIR", dir);
        }
        let output = child.output().expect("child runs");
        assert!(
            output.status.success(),
            "child failed: {}",
            String::from_utf8_lossy(&output.stdout)
        );
    };
    let written = |dir: &Path| dir.join("child_report.samples.json").is_file();
    let root = tempfile::tempdir().expect("temp dir");
    let (work, reports, build) = (
        root.path().join("work"),
        root.path().join("reports"),
        root.path().join("build"),
    );
    std::fs::create_dir_all(&work).expect("working directory");

    run_child(&work, None, Some(&build));
    assert!(
        written(&build.join("host-cost")),
        "not under CARGO_TARGET_DIR"
    );
    assert!(!written(&work.join("target/host-cost")));
    std::fs::remove_dir_all(build.join("host-cost")).expect("cleared");

    run_child(&work, Some(&reports), Some(&build));
    assert!(written(&reports), "not in VYRE_HOST_COST_REPORT_DIR");
    assert!(!written(&build.join("host-cost")));
    assert!(!written(&work.join("target/host-cost")));

    run_child(&work, None, None);
    assert!(written(&work.join("target/host-cost")), "not under target/");
}

// ---------------------------------------------------------------------------------------
// The between-arm clock gap is the verdict; inputs are bounded.
// ---------------------------------------------------------------------------------------

/// An A/A region stream (every region 2 ms, 1000 units) of `rounds` ABBA rounds.
fn flat_stream(rounds: usize) -> Vec<f64> {
    vec![2e-3; rounds * 4]
}

/// Per-region clock figures of an ABBA schedule: `figure(slot, arm)`.
fn clock_for(rounds: usize, figure: impl Fn(usize, Arm) -> f64) -> ClockDrift {
    let per_region = schedule(PairOrder::Abba, rounds)
        .iter()
        .enumerate()
        .map(|(slot, arm)| figure(slot, *arm))
        .collect();
    ClockDrift::from_regions(ClockSource::SpinReference, per_region, 0.02, Vec::new())
}

fn compare_with_clock(rounds: usize, clock: ClockDrift) -> Paired {
    Paired::from_samples(
        "a",
        "b",
        [Vec::new(), Vec::new()],
        1000,
        flat_stream(rounds),
        clock,
        &PairOptions::default(),
    )
    .expect("valid samples")
}

/// Locks out the seed's rule going missing: a clock 3 % slower under
/// every region of arm B than under arm A's is flagged and makes the comparison
/// unpublishable (`ClockGapTooLarge`, gap 3 %), though the clock is perfectly steady
/// within each arm. Negative control: the same clock with no gap is publishable.
#[test]
fn a_three_percent_between_arm_gap_is_flagged() {
    let gapped = compare_with_clock(
        40,
        clock_for(40, |_, arm| match arm {
            Arm::A => 1000.0,
            Arm::B => 970.0,
        }),
    );
    let gap = gapped.clock.arm_gap.expect("gap computed");
    assert!((gap.gap - 0.03).abs() < 1e-12, "{gap:?}");
    assert!(gapped.clock.flagged);
    assert!(
        gapped
            .not_publishable
            .iter()
            .any(|reason| matches!(reason, NotPublishable::ClockGapTooLarge { .. })),
        "{:?}",
        gapped.not_publishable
    );
    let even = compare_with_clock(40, clock_for(40, |_, _| 1000.0));
    assert!(even.publishable(), "{:?}", even.not_publishable);
    assert!(!even.clock.flagged);
}

/// Locks out the rule that made the GPU machine's comparisons unpublishable:
/// a reference that jitters by ±15 % from region to region, identically for both arms,
/// is not flagged and the comparison stays publishable, while its jitter is still
/// reported (≥ 15 %, as an advisory). Negative control: the same jitter plus a 3 %
/// slowdown under arm B only is flagged.
#[test]
fn fifteen_percent_jitter_without_a_between_arm_gap_is_not_flagged() {
    // Two ABBA rounds (A B B A B A A B) repeated; each arm sees the same four levels
    // (±15 %, ±5 %), in a different order.
    let levels = [1.15, 0.85, 1.15, 0.85, 0.95, 1.05, 0.95, 1.05];
    let jittery = |slot: usize, _arm: Arm| 1000.0 * levels[slot % 8];
    let calm = compare_with_clock(40, clock_for(40, jittery));
    let gap = calm.clock.arm_gap.expect("gap");
    assert!(gap.gap < 0.02, "{gap:?}");
    assert!(!calm.clock.flagged, "{:?}", calm.clock);
    assert!(calm.publishable(), "{:?}", calm.not_publishable);
    assert!(calm.clock.jitter.expect("jitter") >= 0.15);

    let slowed_b = compare_with_clock(
        40,
        clock_for(40, |slot, arm| {
            jittery(slot, arm) * if arm == Arm::B { 0.97 } else { 1.0 }
        }),
    );
    assert!(slowed_b.clock.flagged, "{:?}", slowed_b.clock.arm_gap);
    assert!(!slowed_b.publishable());
}

/// Locks out the within-run trend deciding the verdict again: a 4 % linear trend over
/// the run (which ABBA cancels) raises the drift advisory but leaves the between-arm gap
/// near 0 and the comparison publishable. Negative control: a trend shows in the drift.
#[test]
fn a_trend_within_the_run_is_only_an_advisory() {
    let regions = 40 * 4;
    let trend = compare_with_clock(
        40,
        clock_for(40, |slot, _| {
            1000.0 * (1.0 - 0.04 * slot as f64 / regions as f64)
        }),
    );
    assert!(trend.clock.drift_advisory, "{:?}", trend.clock.drift);
    assert!(trend.clock.arm_gap.expect("gap").gap < 0.005);
    assert!(trend.publishable(), "{:?}", trend.not_publishable);
}

/// Locks out a comparison being published with no clock evidence (a reference that
/// could not calibrate yields no figure): the gap is unknown and is a reason.
#[test]
fn no_clock_figure_is_never_publishable() {
    let clock = ClockDrift::from_regions(ClockSource::Unavailable, Vec::new(), 0.02, Vec::new());
    let paired = compare_with_clock(10, clock);
    assert_eq!(paired.clock.arm_gap, None);
    assert!(paired
        .not_publishable
        .contains(&NotPublishable::ClockGapUnknown));
}

/// Locks out the gap arithmetic pairing figures with the wrong arm.
#[test]
fn between_arm_gap_on_fixed_figures() {
    let arms = [Arm::A, Arm::B, Arm::B, Arm::A];
    let gap = estimate::between_arm_gap(&[100.0, 90.0, 110.0, 102.0], &arms).expect("gap");
    assert_eq!((gap.mean_a, gap.mean_b), (101.0, 100.0));
    assert!((gap.gap - 1.0 / 101.0).abs() < 1e-15);
    assert_eq!(
        estimate::between_arm_gap(&[1.0, 1.0], &[Arm::A, Arm::A]),
        None
    );
    assert_eq!(
        estimate::between_arm_gap(&[f64::NAN, 1.0], &[Arm::A, Arm::B]),
        None
    );
}

/// Locks out an inexact or unbounded sign test (`sign_test_p_value(10¹¹, 0)`
/// looped 10¹¹ times): values match exact rational arithmetic (computed with Python's
/// `fractions`), and huge counts return at once (0 for a lopsided split, 1 for an even
/// one, a correct tail just past the centre).
#[test]
fn sign_test_is_exact_and_bounded() {
    for (above, below, exact) in [
        (600, 400, 2.728_464_156_066_018_4e-10),
        (510, 490, 0.547_972_745_923_477),
        (30, 10, 0.002_221_433_773_229_364_3),
        (13, 7, 0.263_175_964_355_468_75),
        (5001, 4999, 0.992_021_353_860_617_8),
        (5100, 4900, 0.046_585_527_704_947_39),
    ] {
        let p = sign_test_p_value(above, below);
        assert!(
            ((p - exact) / exact).abs() < 1e-9,
            "({above}, {below}): {p} vs {exact}"
        );
    }
    assert_eq!(sign_test_p_value(100_000_000_000, 0), 0.0);
    assert_eq!(sign_test_p_value(usize::MAX, usize::MAX), 1.0);
    assert_eq!(sign_test_p_value(usize::MAX, 0), 0.0);
    // 10¹¹ trials, 1 SD above the centre: two-sided p ≈ 0.3173 (normal limit).
    let n: usize = 100_000_000_000;
    let sd = 158_114; // sqrt(n) / 2
    let p = sign_test_p_value(n / 2 + sd, n / 2 - sd);
    assert!((p - 0.3173).abs() < 1e-3, "{p}");
}

/// Locks out an overflowing busy sum (a debug panic, a wrong figure in
/// release): two CPUs at `u64::MAX` busy jiffies weigh equally.
#[test]
fn busy_weighted_mhz_cannot_overflow() {
    let mhz =
        vyre_cuda::host_cost::clock::busy_weighted_mhz(&[(u64::MAX, 1000.0), (u64::MAX, 3000.0)])
            .expect("figure");
    assert!((mhz - 2000.0).abs() < 1e-9, "{mhz}");
}

/// Locks out `read_capped` opening a FIFO (`open` blocked forever) or
/// streaming a device: a FIFO, a directory and `/dev/zero` are refused as
/// `NotRegularFile` before any open. The read runs on a helper thread so a regression
/// fails the test instead of hanging it (a liveness guard, not a time bound).
/// Negative control: a regular file at the same place reads.
#[test]
fn read_capped_refuses_anything_but_a_regular_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let fifo = dir.path().join("fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .map(|status| status.success())
        .unwrap_or(false);
    let mut refused = vec![dir.path().to_path_buf()];
    if Path::new("/dev/zero").exists() {
        refused.push("/dev/zero".into());
    }
    if made {
        refused.push(fifo.clone());
    } else {
        eprintln!("mkfifo unavailable: the FIFO case is not exercised");
    }
    for path in refused {
        let (sender, receiver) = std::sync::mpsc::channel();
        let probe_path = path.clone();
        std::thread::spawn(move || {
            let _ = sender.send(read_capped(&probe_path, 64).map(|bytes| bytes.is_some()));
        });
        let result = receiver
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("read_capped blocked on {}", path.display()));
        match result {
            Err(error @ HostCostError::NotRegularFile { .. }) => {
                assert!(error.to_string().starts_with("Fix:"), "{error}");
            }
            other => panic!("{}: expected NotRegularFile, got {other:?}", path.display()),
        }
    }
    let regular = dir.path().join("regular");
    std::fs::write(&regular, b"42\n").expect("write");
    assert_eq!(
        read_capped(&regular, 64).expect("reads"),
        Some(b"42\n".to_vec())
    );
}

/// Locks out options that panic, exhaust memory or hang (`CellOptions.regions
/// = usize::MAX` panicked, `PairOptions.rounds = 2⁶²` panicked, `ClockOptions
/// .spin_repeats = usize::MAX` hung): every bounded field out of bounds is refused by
/// `validate` and by the measurement itself, with an `InvalidOptions` naming the field
/// and a `Fix:` message giving the bound. Negative control: the defaults pass.
#[test]
fn every_option_out_of_bounds_is_refused_with_its_field() {
    fn expect_field(result: Result<(), HostCostError>, field: &str) {
        match result {
            Err(error @ HostCostError::InvalidOptions { .. }) => {
                let message = error.to_string();
                assert!(message.starts_with("Fix: "), "{message}");
                assert!(message.contains(field), "{message} should name {field}");
                assert!(
                    message.contains("set it"),
                    "{message} should give the bound"
                );
            }
            other => panic!("{field}: expected InvalidOptions, got {other:?}"),
        }
    }
    assert!(CellOptions::default().validate().is_ok());
    assert!(PairOptions::default().validate().is_ok());
    assert!(ClockOptions::default().validate().is_ok());

    type CellEdit = fn(&mut CellOptions);
    let cell_cases: [(&str, CellEdit); 10] = [
        ("CellOptions::regions", |o| o.regions = usize::MAX),
        ("CellOptions::regions", |o| o.regions = 1),
        ("CellOptions::warmup_calls", |o| o.warmup_calls = usize::MAX),
        ("CellOptions::probe_growth", |o| o.probe_growth = 1),
        ("CellOptions::probe_growth", |o| o.probe_growth = u64::MAX),
        ("CellOptions::target_region", |o| {
            o.target_region = Duration::ZERO
        }),
        ("CellOptions::target_region", |o| {
            o.target_region = Duration::MAX
        }),
        ("CellOptions::max_iterations", |o| o.max_iterations = 0),
        ("CellThresholds::ok_rsd", |o| o.thresholds.ok_rsd = f64::NAN),
        ("ClockOptions::spin_repeats", |o| {
            o.clock.spin_repeats = usize::MAX
        }),
    ];
    for (field, edit) in cell_cases {
        let mut options = CellOptions::default();
        edit(&mut options);
        expect_field(options.validate(), field);
        let measured = Cell::measure("never runs", &options, |n| n).map(|_| ());
        expect_field(measured, field);
    }

    type PairEdit = fn(&mut PairOptions);
    let pair_cases: [(&str, PairEdit); 11] = [
        ("PairOptions::rounds", |o| o.rounds = 1 << 62),
        ("PairOptions::rounds", |o| o.rounds = 0),
        ("PairOptions::probe_minimum", |o| {
            o.probe_minimum = Duration::MAX
        }),
        ("PairOptions::optimised_away_below_ns", |o| {
            o.optimised_away_below_ns = f64::INFINITY
        }),
        ("PairThresholds::maximum_clock_gap", |o| {
            o.thresholds.maximum_clock_gap = f64::NAN
        }),
        ("PairThresholds::minimum_rounds", |o| {
            o.thresholds.minimum_rounds = usize::MAX
        }),
        ("DifferenceRule::alpha", |o| o.difference.alpha = 0.0),
        ("DifferenceRule::minimum_effect", |o| {
            o.difference.minimum_effect = -1.0
        }),
        ("ClockOptions::spin_repeats", |o| {
            o.clock.spin_repeats = usize::MAX
        }),
        ("ClockOptions::spin_target", |o| {
            o.clock.spin_target = Duration::MAX
        }),
        ("ClockOptions::limit", |o| o.clock.limit = f64::NAN),
    ];
    for (field, edit) in pair_cases {
        let mut options = PairOptions::default();
        edit(&mut options);
        expect_field(options.validate(), field);
        let compared = Paired::compare("a", |n| n, "b", |n| n, &options).map(|_| ());
        expect_field(compared, field);
    }
    let clock = ClockOptions {
        spin_repeats: usize::MAX,
        ..ClockOptions::default()
    };
    expect_field(
        ClockMonitor::start(&clock).map(|_| ()),
        "ClockOptions::spin_repeats",
    );
    expect_field(
        vyre_cuda::host_cost::reference_noise_floor(
            &ClockOptions::default(),
            usize::MAX,
            8,
            Duration::from_millis(1),
        )
        .map(|_| ()),
        "reference_noise_floor trials",
    );
}

/// Locks out bad clock files being fatal or trusted: garbage
/// `/proc/stat`, a garbage cpufreq value, and a missing or garbage schedstat each leave
/// a working monitor on the spin reference with a note, and the run still yields one
/// figure per region. Negative control: a schedstat file that reports a run-queue delay
/// longer than the region drives that region's figure to 0 (the delay is applied).
#[test]
fn bad_clock_files_are_reported_and_skipped() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut options = fake_sysfs(dir.path(), &[Some("not a number\n")]);
    std::fs::write(&options.proc_stat_path, b"\xff\xfe garbage\ncpu0 x y\n").expect("stat");
    let garbage_schedstat = dir.path().join("schedstat");
    std::fs::write(&garbage_schedstat, "lots of nothing").expect("schedstat");
    options.schedstat_path = garbage_schedstat.clone();
    let mut monitor = ClockMonitor::start(&options).expect("valid options");
    assert_eq!(monitor.source(), ClockSource::SpinReference);
    for _ in 0..3 {
        monitor.mark_boundary();
    }
    let record = monitor.finish();
    assert_eq!(record.per_region.len(), 2, "{record:?}");
    assert!(
        record.notes.iter().any(|note| note.contains("schedstat")),
        "{:?}",
        record.notes
    );
    assert_eq!(record.interference.run_queue_delay, None);
    // With the fallback on, the thread's CPU time stands in, and the notes say so.
    let fallback = ClockOptions {
        thread_cpu_fallback: true,
        ..options.clone()
    };
    let mut monitor = ClockMonitor::start(&fallback).expect("valid options");
    monitor.mark_boundary();
    monitor.mark_boundary();
    let record = monitor.finish();
    assert!(
        record.notes.iter().any(|note| note.contains("CPU time")),
        "{:?}",
        record.notes
    );
    assert!(record.interference.run_queue_delay.is_some());

    // A readable schedstat whose delay jumps by 1000 s between two boundaries.
    std::fs::write(&garbage_schedstat, "5 0 1\n").expect("schedstat");
    let mut monitor = ClockMonitor::start(&options).expect("valid options");
    monitor.mark_boundary();
    std::fs::write(&garbage_schedstat, "5 1000000000000 2\n").expect("schedstat");
    monitor.mark_boundary();
    monitor.mark_boundary();
    let record = monitor.finish();
    assert_eq!(record.per_region.len(), 2);
    assert_eq!(record.per_region[0], 0.0, "{record:?}");
    assert!(record.per_region[1] > 0.0, "{record:?}");
}

/// Locks out the noise-floor measurement being inert: it runs the requested A/A trials,
/// yields one finite gap per trial (the reference calibrates on any machine) and a
/// summary line that names the source and the target.
#[test]
fn reference_noise_floor_reports_one_gap_per_trial() {
    let _serial = timing_lock();
    let floor = vyre_cuda::host_cost::reference_noise_floor(
        &ClockOptions {
            source: ClockSourceChoice::SpinReference,
            ..ClockOptions::default()
        },
        3,
        4,
        Duration::from_micros(500),
    )
    .expect("valid arguments");
    assert_eq!(floor.gaps.len(), 3, "{floor:?}");
    assert!(floor.gaps.iter().all(|gap| gap.is_finite() && *gap >= 0.0));
    let line = floor.summary(4, Duration::from_micros(500));
    assert!(
        line.contains("spin-reference") && line.contains("target <= 0.5%"),
        "{line}"
    );
}

#[cfg(target_os = "linux")]
#[path = "affinity/mod.rs"]
mod affinity;

/// Locks out a clock check that is blind to interference confined to one arm (
/// item 3, on the CPU): with the measuring thread and a busy competitor pinned to one
/// CPU, and the competitor running only inside arm B's regions, the real
/// `Paired::compare` flags the clock (between-arm gap above 2 %) — the spin reference
/// at the boundaries never sees the competitor, only the in-region reading does. The
/// planted interference halves B's share of the CPU (a gap near 50 %), far beyond this
/// machine's own noise, and a loaded machine gets a few attempts; a blind check fails
/// every one.
#[cfg(target_os = "linux")]
#[test]
fn interference_in_one_arm_only_is_flagged() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let _serial = timing_lock();
    // Runs on its own thread so pinning never leaks into other tests.
    let outcome = std::thread::spawn(|| {
        let saved = affinity::get();
        let Some(cpu) = affinity::pin_here() else {
            return Err("affinity unavailable".to_string());
        };
        let active = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (thread_active, thread_stop) = (Arc::clone(&active), Arc::clone(&stop));
        let competitor = std::thread::spawn(move || {
            let _ = affinity::pin(cpu);
            let mut digest = 0_u64;
            while !thread_stop.load(Ordering::Acquire) {
                if thread_active.load(Ordering::Acquire) {
                    digest ^= chain_work(64, 1);
                } else {
                    std::thread::park();
                }
            }
            digest
        });
        let options =
            PairOptions::with_targets(Duration::from_millis(4), Duration::from_millis(2), 12);
        let mut last = String::new();
        let mut flagged = false;
        for _ in 0..ATTEMPTS {
            let paired = Paired::compare(
                "alone",
                |n| chain_work(n, 1),
                "with a competitor",
                |n| {
                    active.store(true, Ordering::Release);
                    competitor.thread().unpark();
                    let digest = chain_work(n, 1);
                    active.store(false, Ordering::Release);
                    digest
                },
                &options,
            )
            .map_err(|error| error.to_string())?;
            last = format!("{:?} {:?}", paired.clock.arm_gap, paired.clock.notes);
            if paired.clock.flagged && !paired.publishable() {
                flagged = true;
                break;
            }
        }
        stop.store(true, Ordering::Release);
        competitor.thread().unpark();
        let _ = competitor.join();
        if let Some(saved) = saved {
            let _ = affinity::set(&saved);
        }
        if flagged {
            Ok(())
        } else {
            Err(format!(
                "interference in B not flagged in {ATTEMPTS} attempts: {last}"
            ))
        }
    })
    .join()
    .expect("measuring thread");
    if let Err(message) = outcome {
        panic!("{message}");
    }
}
