//! Collects cells and comparisons, prints the human table and writes the JSON files.
//!
//! A measurement that only exists in a terminal scroll-back cannot be re-analysed or
//! tracked over time, so every run also leaves its raw samples (seconds, see the schema
//! in the [module docs](super)) and a Bencher-style summary on disk. Writing is best
//! effort: a read-only file system must not turn a finished measurement into a panic,
//! so write failures are returned and printed, never fatal.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::cell::{Cell, Probe};
use super::clock::ClockDrift;
use super::error::HostCostError;
use super::estimate::{self, Direction};
use super::paired::Paired;

/// Environment variable naming the report directory.
pub const REPORT_DIR_ENV: &str = "VYRE_HOST_COST_REPORT_DIR";
/// Cargo's variable for its build directory: without [`REPORT_DIR_ENV`], reports go to
/// its `host-cost` subdirectory.
const TARGET_DIR_ENV: &str = "CARGO_TARGET_DIR";
/// Report directory when neither [`REPORT_DIR_ENV`] nor `CARGO_TARGET_DIR` is set (or
/// both are empty): relative to the current directory, which `cargo test` and `cargo
/// bench` set to the root of the package whose test or bench runs.
pub const DEFAULT_REPORT_DIR: &str = "target/host-cost";
/// Value of the `"schema"` field of the raw-samples file.
pub const SAMPLES_SCHEMA: &str = "vyre-cuda/host-cost-samples/v1";

/// A named collection of results, printed and written together.
#[derive(Clone, Debug, Default)]
pub struct Report {
    name: String,
    cells: Vec<Cell>,
    paired: Vec<Paired>,
    failures: Vec<(String, String)>,
}

/// The directory reports go to: `$VYRE_HOST_COST_REPORT_DIR`, else
/// `$CARGO_TARGET_DIR/host-cost`, else [`DEFAULT_REPORT_DIR`] (`target/host-cost`). An
/// empty variable counts as unset; a relative path is taken from the current
/// directory.
pub fn report_dir() -> PathBuf {
    report_dir_from(
        std::env::var_os(REPORT_DIR_ENV),
        std::env::var_os(TARGET_DIR_ENV),
    )
}

/// [`report_dir`]'s rule, given the two variables' values.
fn report_dir_from(report_dir: Option<OsString>, target_dir: Option<OsString>) -> PathBuf {
    let set = |value: Option<OsString>| value.filter(|value| !value.is_empty());
    if let Some(dir) = set(report_dir) {
        return PathBuf::from(dir);
    }
    match set(target_dir) {
        Some(target) => PathBuf::from(target).join("host-cost"),
        None => PathBuf::from(DEFAULT_REPORT_DIR),
    }
}

impl Report {
    /// An empty report; `name` also names its files (characters outside
    /// `[A-Za-z0-9._-]` become `_`).
    pub fn new(name: &str) -> Report {
        Report {
            name: name.to_string(),
            ..Report::default()
        }
    }

    /// The report's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Adds a cell and hands it back for assertions.
    pub fn add_cell(&mut self, cell: Cell) -> &Cell {
        self.cells.push(cell);
        self.cells.last().expect("a cell was just pushed")
    }

    /// Adds a comparison and hands it back for assertions.
    pub fn add_paired(&mut self, paired: Paired) -> &Paired {
        self.paired.push(paired);
        self.paired.last().expect("a comparison was just pushed")
    }

    /// Records a measurement that failed (for example an optimised-away probe), so the
    /// table and the files show it instead of silently omitting it.
    pub fn add_failure(&mut self, name: &str, error: &HostCostError) {
        self.failures.push((name.to_string(), error.to_string()));
    }

    /// Cells added so far.
    pub fn cells(&self) -> &[Cell] {
        &self.cells
    }

    /// Comparisons added so far.
    pub fn paired(&self) -> &[Paired] {
        &self.paired
    }

    /// Failures added so far: `(name, message)`.
    pub fn failures(&self) -> &[(String, String)] {
        &self.failures
    }

    /// The human-readable table.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "host-cost report: {}", self.name);
        if !self.cells.is_empty() {
            let _ = writeln!(
                out,
                "{:<40} {:>14} {:>14} {:>7} {:<9} clock",
                "cell", "min ns/unit", "median ns/unit", "rsd", "verdict"
            );
            for cell in &self.cells {
                let _ = writeln!(
                    out,
                    "{:<40} {:>14.1} {:>14.1} {:>7} {:<9} {}",
                    cell.name,
                    cell.minimum_ns_per_unit,
                    cell.median_ns_per_unit,
                    percent(cell.relative_std_dev),
                    cell.verdict.label(),
                    clock_summary(&cell.clock)
                );
            }
        }
        if !self.paired.is_empty() {
            let _ = writeln!(
                out,
                "{:<40} {:>9} {:>14} {:>7} {:>6} {:<26} {:<13} clock / reasons",
                "paired (B vs A)",
                "ratio B/A",
                "delta ns/unit",
                "spread",
                "rounds",
                "difference",
                "verdict"
            );
            for paired in &self.paired {
                let difference = match paired.difference.direction {
                    Some(Direction::BSlower) => "B slower",
                    Some(Direction::BFaster) => "B faster",
                    None => "none detected",
                };
                let reasons: Vec<String> = paired
                    .not_publishable
                    .iter()
                    .map(|r| r.to_string())
                    .collect();
                let _ = writeln!(
                    out,
                    "{:<40} {:>9.4} {:>+14.1} {:>7} {:>6} {:<26} {:<13} {}{}",
                    paired.name,
                    paired.median_ratio,
                    paired.median_delta_ns_per_unit,
                    percent(paired.ratio_spread),
                    paired.rounds.len(),
                    format!(
                        "{difference} (p={:.3}, {}/{})",
                        paired.difference.p_value,
                        paired.difference.rounds_above,
                        paired.difference.rounds_below
                    ),
                    if paired.publishable() {
                        "publishable"
                    } else {
                        "unpublishable"
                    },
                    clock_summary(&paired.clock),
                    if reasons.is_empty() {
                        String::new()
                    } else {
                        format!("; {}", reasons.join("; "))
                    }
                );
            }
        }
        for (name, message) in &self.failures {
            let _ = writeln!(out, "FAILED {name}: {message}");
        }
        out
    }

    /// The raw-samples JSON document (schema in the [module docs](super)).
    pub fn samples_json(&self) -> String {
        let mut out = String::new();
        out.push_str("{\n  \"schema\": ");
        json_string(&mut out, SAMPLES_SCHEMA);
        out.push_str(",\n  \"report\": ");
        json_string(&mut out, &self.name);
        out.push_str(",\n  \"cells\": [");
        for (index, cell) in self.cells.iter().enumerate() {
            out.push_str(if index == 0 { "\n    " } else { ",\n    " });
            cell_json(&mut out, cell);
        }
        out.push_str("\n  ],\n  \"paired\": [");
        for (index, paired) in self.paired.iter().enumerate() {
            out.push_str(if index == 0 { "\n    " } else { ",\n    " });
            paired_json(&mut out, paired);
        }
        out.push_str("\n  ],\n  \"failures\": [");
        for (index, (name, message)) in self.failures.iter().enumerate() {
            out.push_str(if index == 0 { "\n    " } else { ",\n    " });
            out.push_str("{\"name\": ");
            json_string(&mut out, name);
            out.push_str(", \"error\": ");
            json_string(&mut out, message);
            out.push('}');
        }
        out.push_str("\n  ]\n}\n");
        out
    }

    /// The Bencher-style JSON document: one entry per cell
    /// (`{"latency": {value: min, lower_value: min, upper_value: max}}` in ns per unit)
    /// and per comparison (`"ratio"` = median / min / max of the per-round ratios and
    /// `"latency_delta"` = median / min / max of the per-round deltas in ns per unit).
    pub fn bencher_json(&self) -> String {
        let mut out = String::from("{");
        let mut first = true;
        let mut entry = |out: &mut String, name: &str, measures: &[(&str, &[f64], f64)]| {
            out.push_str(if first { "\n  " } else { ",\n  " });
            first = false;
            json_string(out, name);
            out.push_str(": {");
            for (index, (measure, samples, value)) in measures.iter().enumerate() {
                if index > 0 {
                    out.push_str(", ");
                }
                json_string(out, measure);
                out.push_str(": {\"value\": ");
                json_number(out, *value);
                out.push_str(", \"lower_value\": ");
                json_number(out, estimate::minimum(samples).unwrap_or(f64::NAN));
                out.push_str(", \"upper_value\": ");
                json_number(out, estimate::maximum(samples).unwrap_or(f64::NAN));
                out.push('}');
            }
            out.push('}');
        };
        for cell in &self.cells {
            entry(
                &mut out,
                &cell.name,
                &[("latency", &cell.ns_per_unit, cell.minimum_ns_per_unit)],
            );
        }
        for paired in &self.paired {
            entry(
                &mut out,
                &paired.name,
                &[
                    ("ratio", &paired.ratios, paired.median_ratio),
                    (
                        "latency_delta",
                        &paired.deltas_ns_per_unit,
                        paired.median_delta_ns_per_unit,
                    ),
                ],
            );
        }
        out.push_str("\n}\n");
        out
    }

    /// Writes `<name>.samples.json` and `<name>.bencher.json` into `dir` (created if
    /// missing) and returns their paths.
    ///
    /// # Errors
    /// [`HostCostError::Io`] naming the directory or file that could not be written.
    pub fn write_files(&self, dir: &Path) -> Result<Vec<PathBuf>, HostCostError> {
        std::fs::create_dir_all(dir).map_err(|source| HostCostError::Io {
            path: dir.to_path_buf(),
            operation: "create directory",
            source,
        })?;
        let stem = file_stem(&self.name);
        let mut written = Vec::new();
        for (suffix, contents) in [
            ("samples.json", self.samples_json()),
            ("bencher.json", self.bencher_json()),
        ] {
            let path = dir.join(format!("{stem}.{suffix}"));
            std::fs::write(&path, contents).map_err(|source| HostCostError::Io {
                path: path.clone(),
                operation: "write",
                source,
            })?;
            written.push(path);
        }
        Ok(written)
    }

    /// Prints the table to stdout and writes the files to [`report_dir`]; a write failure
    /// is printed to stderr and returned, never a panic.
    pub fn finish(&self) -> Result<Vec<PathBuf>, HostCostError> {
        print!("{}", self.table());
        let result = self.write_files(&report_dir());
        match &result {
            Ok(paths) => {
                for path in paths {
                    println!("host-cost report written: {}", path.display());
                }
            }
            Err(error) => eprintln!("host-cost report not written: {error}"),
        }
        result
    }
}

fn percent(value: Option<f64>) -> String {
    match value {
        Some(value) if value.is_finite() => format!("{:.1}%", value * 100.0),
        _ => "n/a".to_string(),
    }
}

fn clock_summary(clock: &ClockDrift) -> String {
    let percent = |value: Option<f64>| match value {
        Some(v) => format!("{:.2}%", v * 100.0),
        None => "n/a".to_string(),
    };
    // The verdict first (between-arm gap; cells have none), then the advisories.
    let gap = match clock.arm_gap {
        Some(gap) => format!(
            "gap {}{}; ",
            percent(Some(gap.gap)),
            if clock.flagged { " FLAGGED" } else { "" }
        ),
        None => String::new(),
    };
    let mut interference = String::new();
    if let Some(delay) = clock.interference.run_queue_delay {
        interference.push_str(&format!(", rq delay {}", percent(Some(delay))));
    }
    match (clock.steal_gap, clock.interference.steal) {
        (Some(steal), _) => interference.push_str(&format!(
            ", steal A {} B {}{}",
            percent(Some(steal.share_a)),
            percent(Some(steal.share_b)),
            if steal.flagged { " FLAGGED" } else { "" }
        )),
        (None, Some(steal)) => interference.push_str(&format!(", steal {}", percent(Some(steal)))),
        (None, None) => {}
    }
    format!(
        "{} {gap}advisory: drift {}{}, jitter {}{interference}",
        clock.source.label(),
        percent(clock.drift),
        if clock.drift_advisory { " (high)" } else { "" },
        percent(clock.jitter)
    )
}

fn file_stem(name: &str) -> String {
    let stem: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if stem.is_empty() || stem.chars().all(|c| c == '.') {
        "report".to_string()
    } else {
        stem
    }
}

/// Appends `text` as a JSON string literal.
fn json_string(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Appends a number; NaN and infinities (not JSON) become `null`.
fn json_number(out: &mut String, value: f64) {
    if value.is_finite() {
        // Rust's `Display` for f64 is the shortest round-trip decimal, never exponent
        // notation: always valid JSON.
        let _ = write!(out, "{value}");
    } else {
        out.push_str("null");
    }
}

fn json_optional(out: &mut String, value: Option<f64>) {
    json_number(out, value.unwrap_or(f64::NAN));
}

fn json_numbers(out: &mut String, values: &[f64]) {
    out.push('[');
    for (index, value) in values.iter().enumerate() {
        if index > 0 {
            out.push_str(", ");
        }
        json_number(out, *value);
    }
    out.push(']');
}

fn json_probes(out: &mut String, probes: &[Probe]) {
    out.push('[');
    for (index, probe) in probes.iter().enumerate() {
        if index > 0 {
            out.push_str(", ");
        }
        let _ = write!(out, "{{\"iterations\": {}, \"seconds\": ", probe.iterations);
        json_number(out, probe.seconds);
        out.push('}');
    }
    out.push(']');
}

fn clock_json(out: &mut String, clock: &ClockDrift) {
    out.push_str("{\"source\": ");
    json_string(out, clock.source.label());
    out.push_str(", \"unit\": ");
    json_string(out, clock.source.unit());
    out.push_str(", \"per_region\": ");
    json_numbers(out, &clock.per_region);
    out.push_str(", \"arm_gap\": ");
    match clock.arm_gap {
        Some(gap) => {
            out.push_str("{\"mean_a\": ");
            json_number(out, gap.mean_a);
            out.push_str(", \"mean_b\": ");
            json_number(out, gap.mean_b);
            out.push_str(", \"gap\": ");
            json_number(out, gap.gap);
            out.push('}');
        }
        None => out.push_str("null"),
    }
    out.push_str(", \"drift\": ");
    json_optional(out, clock.drift);
    out.push_str(", \"jitter\": ");
    json_optional(out, clock.jitter);
    out.push_str(", \"run_queue_delay\": ");
    json_optional(out, clock.interference.run_queue_delay);
    out.push_str(", \"steal\": ");
    json_optional(out, clock.interference.steal);
    out.push_str(", \"steal_gap\": ");
    match clock.steal_gap {
        Some(steal) => {
            let _ = write!(
                out,
                "{{\"ticks_a\": {}, \"ticks_b\": {}, \"share_a\": ",
                steal.ticks_a, steal.ticks_b
            );
            json_number(out, steal.share_a);
            out.push_str(", \"share_b\": ");
            json_number(out, steal.share_b);
            out.push_str(", \"standard_error\": ");
            json_number(out, steal.standard_error);
            let _ = write!(out, ", \"flagged\": {}}}", steal.flagged);
        }
        None => out.push_str("null"),
    }
    out.push_str(", \"limit\": ");
    json_number(out, clock.limit);
    let _ = write!(
        out,
        ", \"flagged\": {}, \"drift_advisory\": {}, \"notes\": [",
        clock.flagged, clock.drift_advisory
    );
    for (index, note) in clock.notes.iter().enumerate() {
        if index > 0 {
            out.push_str(", ");
        }
        json_string(out, note);
    }
    out.push_str("]}");
}

fn cell_json(out: &mut String, cell: &Cell) {
    out.push_str("{\"name\": ");
    json_string(out, &cell.name);
    let _ = write!(
        out,
        ", \"iterations_per_region\": {}, \"calibration\": ",
        cell.iterations_per_region
    );
    json_probes(out, &cell.calibration);
    out.push_str(", \"region_seconds\": ");
    json_numbers(out, &cell.region_seconds);
    out.push_str(", \"minimum_ns_per_unit\": ");
    json_number(out, cell.minimum_ns_per_unit);
    out.push_str(", \"median_ns_per_unit\": ");
    json_number(out, cell.median_ns_per_unit);
    out.push_str(", \"relative_std_dev\": ");
    json_optional(out, cell.relative_std_dev);
    out.push_str(", \"verdict\": ");
    json_string(out, cell.verdict.label());
    out.push_str(", \"clock\": ");
    clock_json(out, &cell.clock);
    out.push('}');
}

fn paired_json(out: &mut String, paired: &Paired) {
    out.push_str("{\"name\": ");
    json_string(out, &paired.name);
    out.push_str(", \"arm_a\": ");
    json_string(out, &paired.name_a);
    out.push_str(", \"arm_b\": ");
    json_string(out, &paired.name_b);
    out.push_str(", \"order\": ");
    json_string(out, paired.order.label());
    let _ = write!(
        out,
        ", \"iterations_per_region\": {}, \"calibration_a\": ",
        paired.iterations_per_region
    );
    json_probes(out, &paired.calibration[0]);
    out.push_str(", \"calibration_b\": ");
    json_probes(out, &paired.calibration[1]);
    out.push_str(", \"schedule\": \"");
    for arm in &paired.schedule {
        out.push_str(if *arm == estimate::Arm::A { "A" } else { "B" });
    }
    out.push_str("\", \"region_seconds\": ");
    json_numbers(out, &paired.region_seconds);
    out.push_str(", \"ratios\": ");
    json_numbers(out, &paired.ratios);
    out.push_str(", \"deltas_ns_per_unit\": ");
    json_numbers(out, &paired.deltas_ns_per_unit);
    out.push_str(", \"median_ratio\": ");
    json_number(out, paired.median_ratio);
    out.push_str(", \"median_delta_ns_per_unit\": ");
    json_number(out, paired.median_delta_ns_per_unit);
    out.push_str(", \"ratio_spread\": ");
    json_optional(out, paired.ratio_spread);
    let difference = &paired.difference;
    let _ = write!(
        out,
        ", \"difference\": {{\"detected\": {}, \"direction\": ",
        difference.detected
    );
    match difference.direction {
        Some(Direction::BSlower) => json_string(out, "b-slower"),
        Some(Direction::BFaster) => json_string(out, "b-faster"),
        None => out.push_str("null"),
    }
    let _ = write!(
        out,
        ", \"rounds_above\": {}, \"rounds_below\": {}, \"rounds_ignored\": {}, \"p_value\": ",
        difference.rounds_above, difference.rounds_below, difference.rounds_ignored
    );
    json_number(out, difference.p_value);
    out.push_str(", \"alpha\": ");
    json_number(out, difference.rule.alpha);
    out.push_str(", \"minimum_effect\": ");
    json_number(out, difference.rule.minimum_effect);
    let _ = write!(
        out,
        "}}, \"publishable\": {}, \"reasons\": [",
        paired.publishable()
    );
    for (index, reason) in paired.not_publishable.iter().enumerate() {
        if index > 0 {
            out.push_str(", ");
        }
        json_string(out, &reason.to_string());
    }
    out.push_str("], \"clock\": ");
    clock_json(out, &paired.clock);
    out.push('}');
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Locks out JSON that breaks on names with quotes, backslashes or control
    /// characters, and on NaN (which is not JSON).
    #[test]
    fn json_escapes_strings_and_maps_non_finite_to_null() {
        let mut out = String::new();
        json_string(&mut out, "a\"b\\c\nd\u{1}");
        assert_eq!(out, "\"a\\\"b\\\\c\\nd\\u0001\"");
        let mut out = String::new();
        json_numbers(&mut out, &[1.5, f64::NAN, f64::INFINITY, 1e-7]);
        assert_eq!(out, "[1.5, null, null, 0.0000001]");
    }

    /// Locks out report names escaping the report directory (`../x`) or producing an
    /// empty file name.
    #[test]
    fn file_stem_keeps_names_inside_the_directory() {
        assert_eq!(file_stem("../etc/passwd"), ".._etc_passwd");
        assert_eq!(file_stem(""), "report");
        assert_eq!(file_stem(".."), "report");
        assert_eq!(file_stem("dispatch sweep"), "dispatch_sweep");
    }

    /// Locks out a report directory that ignores `CARGO_TARGET_DIR` (reports landed in
    /// `target/` beside a build that lives elsewhere) or lets it override the explicit
    /// variable. Negative control: each rule's variable, set empty, falls through to the
    /// next rule, so the precedence is what decides.
    #[test]
    fn report_dir_prefers_its_variable_then_the_target_dir_then_target() {
        let some = |text: &str| Some(OsString::from(text));
        assert_eq!(
            report_dir_from(some("/reports"), some("/build")),
            PathBuf::from("/reports")
        );
        assert_eq!(
            report_dir_from(None, some("/build")),
            PathBuf::from("/build/host-cost")
        );
        assert_eq!(
            report_dir_from(some(""), some("relative/build")),
            PathBuf::from("relative/build/host-cost")
        );
        assert_eq!(
            report_dir_from(None, None),
            PathBuf::from(DEFAULT_REPORT_DIR)
        );
        assert_eq!(
            report_dir_from(some(""), some("")),
            PathBuf::from("target/host-cost")
        );
    }
}
