//! Per-phase tables from a log of probe lines.
//!
//! # Why this module exists
//!
//! A probe line has 27 fields and a run prints thousands of them; people read
//! tables, not 30 fields. This module turns a log (any text: probe lines mixed
//! with other output) into one table per program shape, with the median, the
//! 90th percentile and the share of wall time of every phase. It is shared by
//! the `vyre-cuda-phase-report` binary, the tests and anything else that wants
//! the numbers in-process.
//!
//! # Definitions
//!
//! * **Probe line**: a line containing `vyre-cuda-dispatch-phase ` (normally at
//!   its start; a line where another program's output ran in front of it, such
//!   as `test foo ... vyre-cuda-dispatch-phase seq=...`, is read from the marker
//!   on). It must then parse with [`parse_line`](super::parse_line) (strict: all
//!   keys in order, integer values, totals consistent); otherwise it is counted
//!   as **malformed** and skipped. Lines without the marker are **unrelated**
//!   and only counted. Invalid UTF-8 is read lossily by the binary.
//! * **Group**: records of the same program: the same `program` identity (the
//!   low 64 bits of the module key) and shape `(nodes, buffers)`, sorted
//!   ascending by `(nodes, buffers, program)`. Two kernels of the same shape are
//!   two groups; lines from before `program` existed (identity 0) group by shape.
//! * **Bounded memory**: [`summarize_reader`] streams its input; a line longer
//!   than [`MAX_LINE_BYTES`] is counted as malformed (`line over the length cap`)
//!   without being stored, and records beyond [`MAX_RECORDS`] are counted
//!   (`over_record_cap`) and skipped, so any input costs at most a few tens of
//!   megabytes. Malformed lines are counted by reason ([`LineError::label`]),
//!   with the first few line numbers kept as examples.
//! * **Median and p90**: nearest-rank percentiles of the sorted values
//!   (`sorted[ceil(p/100 · n) − 1]`), so every figure is a value that was
//!   actually measured; the median of an even count is the lower middle value.
//! * **Share of wall**: the sum of the row over all records of the group
//!   divided by the sum of `wall_ns` over the same records (a ratio of totals,
//!   not of medians), so the nine phase shares plus the unattributed share add
//!   up to 100 % whenever no record's phases exceed its wall. A group whose
//!   total wall is 0 shows shares of 0.

use super::{parse_line_checked, DispatchRecord, LineError, Phase, SubPhase, LINE_PREFIX};
use std::fmt::Write as _;
use std::io::BufRead;

/// What one log line is.
#[derive(Debug, Clone, PartialEq, Eq)]
// A classification is consumed at once; boxing the record would cost an allocation per
// line for nothing.
#[allow(clippy::large_enum_variant)]
pub enum LineKind {
    /// A probe line that parsed.
    Record(DispatchRecord),
    /// A line with the probe marker that does not parse (truncated, garbage), and why.
    Malformed(LineError),
    /// Any other line.
    Unrelated,
}

/// Classifies one log line (see the module docs for the rules).
pub fn classify_line(line: &str) -> LineKind {
    let Some(start) = find_marker(line) else {
        return LineKind::Unrelated;
    };
    match parse_line_checked(&line[start..]) {
        Ok(record) => LineKind::Record(record),
        Err(error) => LineKind::Malformed(error),
    }
}

/// Byte offset of the first `vyre-cuda-dispatch-phase ` in `line`.
fn find_marker(line: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(offset) = line.get(from..)?.find(LINE_PREFIX) {
        let start = from + offset;
        let after = start + LINE_PREFIX.len();
        if line.as_bytes().get(after) == Some(&b' ') {
            return Some(start);
        }
        from = after;
    }
    None
}

/// Which part of a dispatch a table row measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowKind {
    /// The whole dispatch call.
    Wall,
    /// One of the nine disjoint host phases.
    Phase(Phase),
    /// The plain sum of the nine phases.
    NamedHost,
    /// Wall minus the named phases.
    Unattributed,
    /// A walk timed inside `ptx` (not part of the sum).
    SubPhase(SubPhase),
    /// Host time until the last asynchronous operation was enqueued.
    Enqueue,
    /// Time blocked in the synchronize.
    Wait,
    /// Outer device event pair.
    DeviceWindow,
    /// Inner device event pair around the launch loop.
    Kernel,
}

impl RowKind {
    /// Every row, in table order.
    pub fn all() -> Vec<RowKind> {
        let mut rows = vec![RowKind::Wall];
        rows.extend(Phase::ALL.into_iter().map(RowKind::Phase));
        rows.push(RowKind::NamedHost);
        rows.push(RowKind::Unattributed);
        rows.extend(SubPhase::ALL.into_iter().map(RowKind::SubPhase));
        rows.extend([
            RowKind::Enqueue,
            RowKind::Wait,
            RowKind::DeviceWindow,
            RowKind::Kernel,
        ]);
        rows
    }

    /// Row name in the table and in JSON, e.g. `"stage"`, `"sub_ptx_digest"`.
    pub fn name(self) -> &'static str {
        match self {
            RowKind::Wall => "wall",
            RowKind::Phase(phase) => phase.label(),
            RowKind::NamedHost => "named_host",
            RowKind::Unattributed => "unattributed",
            RowKind::SubPhase(SubPhase::PtxDigest) => "sub_ptx_digest",
            RowKind::SubPhase(SubPhase::PtxVsa) => "sub_ptx_vsa",
            RowKind::Enqueue => "enqueue",
            RowKind::Wait => "wait",
            RowKind::DeviceWindow => "device_window",
            RowKind::Kernel => "kernel",
        }
    }

    /// Section of the table the row belongs to (also the JSON `"kind"`).
    pub fn section(self) -> &'static str {
        match self {
            RowKind::Wall => "wall",
            RowKind::Phase(_) => "phase",
            RowKind::NamedHost | RowKind::Unattributed => "total",
            RowKind::SubPhase(_) => "sub_phase",
            RowKind::Enqueue | RowKind::Wait | RowKind::DeviceWindow | RowKind::Kernel => "timing",
        }
    }

    /// The value of this row in one record, in nanoseconds.
    pub fn value(self, record: &DispatchRecord) -> u64 {
        match self {
            RowKind::Wall => record.wall_ns,
            RowKind::Phase(phase) => record.phase_ns(phase),
            RowKind::NamedHost => record.named_host_ns(),
            RowKind::Unattributed => record.unattributed_ns(),
            RowKind::SubPhase(sub_phase) => record.sub_phase_ns(sub_phase),
            RowKind::Enqueue => record.enqueue_ns,
            RowKind::Wait => record.wait_ns,
            RowKind::DeviceWindow => record.device_window_ns,
            RowKind::Kernel => record.kernel_ns,
        }
    }
}

/// Statistics of one row in one group.
#[derive(Debug, Clone, PartialEq)]
pub struct RowStats {
    /// Which row.
    pub kind: RowKind,
    /// Nearest-rank median, nanoseconds.
    pub median_ns: u64,
    /// Nearest-rank 90th percentile, nanoseconds.
    pub p90_ns: u64,
    /// Sum over the group's records, nanoseconds.
    pub total_ns: u128,
    /// `total_ns` / total wall of the group (0 when the wall total is 0).
    pub share_of_wall: f64,
}

/// One program shape's table.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupSummary {
    /// Program identity of this group (`program=`; 0 when the lines carry none).
    pub program: u64,
    /// IR nodes of the programs in this group.
    pub nodes: u64,
    /// Buffers of the programs in this group.
    pub buffers: u64,
    /// Records in this group.
    pub dispatches: usize,
    /// Median PTX bytes.
    pub median_ptx_bytes: u64,
    /// Median bindings.
    pub median_bindings: u64,
    /// Median fixpoint iterations.
    pub median_fixpoint: u64,
    /// Median grid blocks.
    pub median_grid_blocks: u64,
    /// PTX cache hits summed over the group.
    pub ptx_cache_hits: u64,
    /// PTX cache misses summed over the group.
    pub ptx_cache_misses: u64,
    /// Rows in [`RowKind::all`] order.
    pub rows: Vec<RowStats>,
}

impl GroupSummary {
    /// The statistics of one row.
    pub fn row(&self, kind: RowKind) -> Option<&RowStats> {
        self.rows.iter().find(|row| row.kind == kind)
    }
}

/// A whole log's summary.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LogSummary {
    /// Lines read.
    pub lines: usize,
    /// Probe lines that parsed.
    pub records: usize,
    /// Probe lines that did not parse (skipped).
    pub malformed: usize,
    /// Lines without the probe marker.
    pub unrelated: usize,
    /// Malformed lines by reason ([`LineError::label`]), in first-seen order.
    pub malformed_reasons: Vec<(&'static str, usize)>,
    /// The first [`MALFORMED_EXAMPLES`] malformed lines: 1-based line number and why.
    pub malformed_examples: Vec<(usize, LineError)>,
    /// Valid records beyond [`MAX_RECORDS`], counted and skipped.
    pub over_record_cap: usize,
    /// One table per program.
    pub groups: Vec<GroupSummary>,
}

/// Longest line the report reads (64 KiB; a probe line is under 1 KiB even with
/// another program's output in front of it). Longer lines are malformed.
pub const MAX_LINE_BYTES: usize = 64 * 1024;
/// Most records the report keeps (2¹⁸, about 60 MB); later ones are counted only.
pub const MAX_RECORDS: usize = 1 << 18;
/// Malformed lines quoted by number in a summary.
pub const MALFORMED_EXAMPLES: usize = 8;

/// Builds a [`LogSummary`] one line at a time (what [`summarize_reader`] and
/// [`summarize_log`] share).
#[derive(Debug, Default)]
pub struct LogAccumulator {
    summary: LogSummary,
    records: Vec<DispatchRecord>,
}

impl LogAccumulator {
    /// An empty accumulator.
    pub fn new() -> LogAccumulator {
        LogAccumulator::default()
    }

    /// Classifies and counts one line (without its newline).
    pub fn push_line(&mut self, line: &str) {
        if line.len() > MAX_LINE_BYTES {
            self.push_malformed(LineError::TooLong);
            return;
        }
        match classify_line(line) {
            LineKind::Record(record) => {
                self.summary.lines += 1;
                if self.records.len() < MAX_RECORDS {
                    self.records.push(record);
                } else {
                    self.summary.over_record_cap += 1;
                }
            }
            LineKind::Malformed(error) => self.push_malformed(error),
            LineKind::Unrelated => {
                self.summary.lines += 1;
                self.summary.unrelated += 1;
            }
        }
    }

    /// Counts one malformed line (for a line the caller refused to store, use
    /// [`LineError::TooLong`]).
    fn push_malformed(&mut self, error: LineError) {
        let summary = &mut self.summary;
        summary.lines += 1;
        summary.malformed += 1;
        let label = error.label();
        match summary
            .malformed_reasons
            .iter_mut()
            .find(|(known, _)| *known == label)
        {
            Some((_, count)) => *count += 1,
            None => summary.malformed_reasons.push((label, 1)),
        }
        if summary.malformed_examples.len() < MALFORMED_EXAMPLES {
            summary.malformed_examples.push((summary.lines, error));
        }
    }

    /// The summary of every line pushed.
    pub fn finish(self) -> LogSummary {
        let mut summary = self.summary;
        summary.records = self.records.len();
        summary.groups = summarize(&self.records);
        summary
    }
}

/// Reads a log from `reader` line by line in bounded memory (see the module docs)
/// and summarizes it. Invalid UTF-8 is read lossily.
///
/// # Errors
/// The reader's I/O error (other than `Interrupted`, which is retried).
pub fn summarize_reader<R: BufRead>(mut reader: R) -> std::io::Result<LogSummary> {
    let mut accumulator = LogAccumulator::new();
    let mut line: Vec<u8> = Vec::new();
    let mut too_long = false;
    let mut pending = false;
    loop {
        let chunk = match reader.fill_buf() {
            Ok(chunk) => chunk,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        };
        if chunk.is_empty() {
            break;
        }
        let (piece, ends_line) = match chunk.iter().position(|&byte| byte == b'\n') {
            Some(end) => (&chunk[..end], true),
            None => (chunk, false),
        };
        pending = true;
        if !too_long {
            if line.len() + piece.len() > MAX_LINE_BYTES {
                too_long = true;
                line = Vec::new();
            } else {
                line.extend_from_slice(piece);
            }
        }
        let used = piece.len() + usize::from(ends_line);
        reader.consume(used);
        if ends_line {
            finish_line(&mut accumulator, &mut line, &mut too_long);
            pending = false;
        }
    }
    if pending {
        finish_line(&mut accumulator, &mut line, &mut too_long);
    }
    Ok(accumulator.finish())
}

fn finish_line(accumulator: &mut LogAccumulator, line: &mut Vec<u8>, too_long: &mut bool) {
    if *too_long {
        accumulator.push_malformed(LineError::TooLong);
    } else {
        let text = String::from_utf8_lossy(line);
        accumulator.push_line(text.strip_suffix('\r').unwrap_or(&text));
    }
    line.clear();
    *too_long = false;
}

/// Nearest-rank percentile of an ascending slice (0 when empty):
/// `sorted[ceil(percent/100 · n) − 1]`, clamped to the slice.
pub fn nearest_rank(sorted: &[u64], percent: u32) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let n = sorted.len() as u128;
    let rank = (u128::from(percent.min(100)) * n).div_ceil(100).max(1);
    let index = usize::try_from(rank - 1).unwrap_or(usize::MAX);
    sorted[index.min(sorted.len() - 1)]
}

/// Classifies every line of `text` and summarizes the records.
pub fn summarize_log(text: &str) -> LogSummary {
    let mut accumulator = LogAccumulator::new();
    for line in text.lines() {
        accumulator.push_line(line);
    }
    accumulator.finish()
}

/// Groups records by program (identity and shape) and summarizes each group.
pub fn summarize(records: &[DispatchRecord]) -> Vec<GroupSummary> {
    let mut sorted: Vec<&DispatchRecord> = records.iter().collect();
    sorted.sort_by_key(|record| (record.nodes, record.buffers, record.program));
    sorted
        .chunk_by(|a, b| (a.nodes, a.buffers, a.program) == (b.nodes, b.buffers, b.program))
        .map(summarize_group)
        .collect()
}

fn median_of(group: &[&DispatchRecord], value: impl Fn(&DispatchRecord) -> u64) -> u64 {
    let mut values: Vec<u64> = group.iter().map(|record| value(record)).collect();
    values.sort_unstable();
    nearest_rank(&values, 50)
}

fn summarize_group(group: &[&DispatchRecord]) -> GroupSummary {
    let total_wall: u128 = group.iter().map(|r| u128::from(r.wall_ns)).sum();
    let rows = RowKind::all()
        .into_iter()
        .map(|kind| {
            let mut values: Vec<u64> = group.iter().map(|record| kind.value(record)).collect();
            values.sort_unstable();
            let total_ns: u128 = values.iter().map(|&v| u128::from(v)).sum();
            let share_of_wall = if total_wall == 0 {
                0.0
            } else {
                total_ns as f64 / total_wall as f64
            };
            RowStats {
                kind,
                median_ns: nearest_rank(&values, 50),
                p90_ns: nearest_rank(&values, 90),
                total_ns,
                share_of_wall,
            }
        })
        .collect();
    let first = group[0];
    GroupSummary {
        program: first.program,
        nodes: first.nodes,
        buffers: first.buffers,
        dispatches: group.len(),
        median_ptx_bytes: median_of(group, |r| r.ptx_bytes),
        median_bindings: median_of(group, |r| r.bindings),
        median_fixpoint: median_of(group, |r| r.fixpoint),
        median_grid_blocks: median_of(group, |r| r.grid_blocks),
        ptx_cache_hits: group
            .iter()
            .fold(0u64, |sum, r| sum.saturating_add(r.ptx_cache_hits)),
        ptx_cache_misses: group
            .iter()
            .fold(0u64, |sum, r| sum.saturating_add(r.ptx_cache_misses)),
        rows,
    }
}

/// Nanoseconds as microseconds with three decimals, exactly (no float).
fn format_us(ns: u64) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

/// The human-readable report: a header with line counts, then one table per
/// group (rows: wall, the nine phases, named_host, unattributed, the ptx
/// sub-phases, then the backend's timings, which overlap the phases).
pub fn render_table(summary: &LogSummary) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "vyre-cuda dispatch phase report: {} lines, {} probe records, {} malformed (skipped), {} unrelated",
        summary.lines, summary.records, summary.malformed, summary.unrelated
    );
    let _ = writeln!(
        out,
        "median and p90: nearest rank, microseconds; share: row total / wall total of the group"
    );
    if !summary.malformed_reasons.is_empty() {
        let reasons: Vec<String> = summary
            .malformed_reasons
            .iter()
            .map(|(label, count)| format!("{count} {label}"))
            .collect();
        let examples: Vec<String> = summary
            .malformed_examples
            .iter()
            .map(|(line, error)| format!("line {line}: {error}"))
            .collect();
        let _ = writeln!(
            out,
            "malformed: {} (first: {})",
            reasons.join(", "),
            examples.join("; ")
        );
    }
    if summary.over_record_cap > 0 {
        let _ = writeln!(
            out,
            "{} records beyond the {MAX_RECORDS}-record cap were counted and skipped",
            summary.over_record_cap
        );
    }
    if summary.groups.is_empty() {
        let _ = writeln!(out, "\nno probe records");
    }
    for group in &summary.groups {
        let _ = writeln!(
            out,
            "\nnodes={} buffers={} program={:016x}: {} dispatches; median ptx_bytes={} bindings={} fixpoint={} grid_blocks={}; ptx cache {} hits, {} misses",
            group.nodes,
            group.buffers,
            group.program,
            group.dispatches,
            group.median_ptx_bytes,
            group.median_bindings,
            group.median_fixpoint,
            group.median_grid_blocks,
            group.ptx_cache_hits,
            group.ptx_cache_misses
        );
        let _ = writeln!(
            out,
            "  {:<16} {:>12} {:>12} {:>8}",
            "row", "median_us", "p90_us", "share"
        );
        let mut section = "";
        for row in &group.rows {
            let row_section = row.kind.section();
            if row_section != section {
                section = row_section;
                let heading = match section {
                    "phase" => Some("host phases (disjoint, add up to named_host)"),
                    "total" => Some("totals"),
                    "sub_phase" => Some("walks inside ptx (not added to named_host)"),
                    "timing" => Some("backend timings (overlap the host phases)"),
                    _ => None,
                };
                if let Some(heading) = heading {
                    let _ = writeln!(out, "  -- {heading}");
                }
            }
            let _ = writeln!(
                out,
                "  {:<16} {:>12} {:>12} {:>7.1}%",
                row.kind.name(),
                format_us(row.median_ns),
                format_us(row.p90_ns),
                row.share_of_wall * 100.0
            );
        }
    }
    out
}

/// The same summary as JSON (one object; integers in nanoseconds, shares as
/// fractions of 1 with six decimals).
pub fn render_json(summary: &LogSummary) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "{{\"lines\":{},\"records\":{},\"malformed\":{},\"unrelated\":{},\"over_record_cap\":{},\"malformed_reasons\":{{",
        summary.lines,
        summary.records,
        summary.malformed,
        summary.unrelated,
        summary.over_record_cap
    );
    for (index, (label, count)) in summary.malformed_reasons.iter().enumerate() {
        let _ = write!(
            out,
            "{}\"{label}\":{count}",
            if index > 0 { "," } else { "" }
        );
    }
    out.push_str("},\"groups\":[");
    for (group_index, group) in summary.groups.iter().enumerate() {
        if group_index > 0 {
            out.push(',');
        }
        let _ = write!(
            out,
            "{{\"program\":\"{:016x}\",\"nodes\":{},\"buffers\":{},\"dispatches\":{},\"median_ptx_bytes\":{},\"median_bindings\":{},\"median_fixpoint\":{},\"median_grid_blocks\":{},\"ptx_cache_hits\":{},\"ptx_cache_misses\":{},\"rows\":[",
            group.program,
            group.nodes,
            group.buffers,
            group.dispatches,
            group.median_ptx_bytes,
            group.median_bindings,
            group.median_fixpoint,
            group.median_grid_blocks,
            group.ptx_cache_hits,
            group.ptx_cache_misses
        );
        for (row_index, row) in group.rows.iter().enumerate() {
            if row_index > 0 {
                out.push(',');
            }
            let share = if row.share_of_wall.is_finite() {
                row.share_of_wall
            } else {
                0.0
            };
            let _ = write!(
                out,
                "{{\"name\":\"{}\",\"kind\":\"{}\",\"median_ns\":{},\"p90_ns\":{},\"total_ns\":{},\"share_of_wall\":{:.6}}}",
                row.kind.name(),
                row.kind.section(),
                row.median_ns,
                row.p90_ns,
                row.total_ns,
                share
            );
        }
        out.push_str("]}");
    }
    out.push_str("]}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Locks out off-by-one percentiles (e.g. p90 of 10 values reading the
    /// maximum, or the median of an even count reading the upper value).
    #[test]
    fn nearest_rank_matches_the_definition() {
        let ten: Vec<u64> = (1..=10).collect();
        assert_eq!(nearest_rank(&ten, 50), 5);
        assert_eq!(nearest_rank(&ten, 90), 9);
        assert_eq!(nearest_rank(&ten, 100), 10);
        assert_eq!(nearest_rank(&ten, 0), 1);
        assert_eq!(nearest_rank(&[7], 90), 7);
        assert_eq!(nearest_rank(&[], 50), 0);
        let three = [1, 2, 3];
        assert_eq!(nearest_rank(&three, 50), 2);
        assert_eq!(nearest_rank(&three, 90), 3);
    }

    /// Locks out a marker search that panics on multi-byte text or accepts the
    /// marker without its trailing space.
    #[test]
    fn marker_search_is_boundary_safe() {
        assert_eq!(find_marker("é vyre-cuda-dispatch-phase x"), Some(3));
        assert_eq!(find_marker("vyre-cuda-dispatch-phase"), None);
        assert_eq!(
            find_marker("vyre-cuda-dispatch-phasevyre-cuda-dispatch-phase "),
            Some(24)
        );
        assert_eq!(classify_line("ordinary log line"), LineKind::Unrelated);
        assert_eq!(
            classify_line("vyre-cuda-dispatch-phase seq=1"),
            LineKind::Malformed(LineError::MissingField { expected: "nodes" })
        );
    }

    /// Locks out µs formatting that rounds through floats.
    #[test]
    fn microseconds_format_exactly() {
        assert_eq!(format_us(0), "0.000");
        assert_eq!(format_us(1_234), "1.234");
        assert_eq!(format_us(u64::MAX), "18446744073709551.615");
    }
}
