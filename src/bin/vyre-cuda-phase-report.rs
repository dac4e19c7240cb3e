//! `vyre-cuda-phase-report`: turns a log of dispatch phase probe lines into a
//! per-phase table.
//!
//! A probe line has 27 fields; people read tables. Run any dispatching binary
//! with `VYRE_CUDA_DISPATCH_PHASE_PROBE=1`, keep its stderr, and feed it here:
//!
//! ```text
//! VYRE_CUDA_DISPATCH_PHASE_PROBE=1 ./my-binary 2> probe.log
//! vyre-cuda-phase-report probe.log          # table
//! vyre-cuda-phase-report --json < probe.log # JSON
//! ```
//!
//! Unrelated lines are ignored, malformed probe lines are counted and skipped,
//! invalid UTF-8 is read lossily; the tool never panics on its input. The table
//! logic lives in `vyre_cuda::probe::report`.

use std::ffi::OsString;
use std::io::{BufReader, Write};
use std::process::ExitCode;

use vyre_cuda::probe::report::{render_json, render_table, summarize_reader, LogSummary};

const HELP: &str = "\
vyre-cuda-phase-report: per-phase table of vyre-cuda dispatch probe lines

USAGE:
    vyre-cuda-phase-report [--json] [FILE | -]

Reads FILE (or stdin when FILE is absent or `-`), keeps the lines that contain
`vyre-cuda-dispatch-phase `, groups them by program (identity and shape) and
prints, per group and per phase, the median, the p90 (nearest rank, in
microseconds) and the share of wall (row total / wall total of the group).
Lines without the marker are ignored; probe lines that do not parse
(truncated, garbage or overflowing values, duplicate or out-of-order keys,
totals that do not add up, lines over 64 KiB) are counted by reason and
skipped. The input is streamed: any input size costs bounded memory.

Produce a log with:
    VYRE_CUDA_DISPATCH_PHASE_PROBE=1 <any dispatching binary> 2> probe.log

OPTIONS:
    --json      print machine-readable JSON (nanoseconds, shares as fractions)
    -h, --help  print this help
";

/// What the command line asked for.
struct Options {
    json: bool,
    path: Option<OsString>,
}

fn parse_args(args: impl Iterator<Item = OsString>) -> Result<Option<Options>, String> {
    let mut options = Options {
        json: false,
        path: None,
    };
    let mut only_paths = false;
    for arg in args {
        let text = arg.to_string_lossy();
        if !only_paths && (text == "-h" || text == "--help") {
            return Ok(None);
        }
        if !only_paths && text == "--json" {
            options.json = true;
            continue;
        }
        if !only_paths && text == "--" {
            only_paths = true;
            continue;
        }
        if !only_paths && text.starts_with('-') && text != "-" {
            return Err(format!(
                "unknown option `{text}`. Fix: use --json, --help, a log file path, or - for stdin"
            ));
        }
        if options.path.is_some() {
            return Err(format!(
                "more than one input (`{text}`). Fix: pass one log file, or concatenate them: cat a.log b.log | vyre-cuda-phase-report"
            ));
        }
        options.path = Some(arg);
    }
    Ok(Some(options))
}

/// Streams the log from `path` (or stdin) through the report in bounded memory
/// (lines over the report's cap are counted as malformed, never stored whole).
fn summarize_input(path: Option<&OsString>) -> Result<LogSummary, String> {
    match path {
        Some(path) if path != "-" => {
            let file = std::fs::File::open(path).map_err(|error| {
                format!(
                    "cannot read `{}`: {error}. Fix: pass an existing, readable log file (or - for stdin)",
                    path.to_string_lossy()
                )
            })?;
            summarize_reader(BufReader::new(file)).map_err(|error| {
                format!(
                    "cannot read `{}`: {error}. Fix: pass a readable log file (or - for stdin)",
                    path.to_string_lossy()
                )
            })
        }
        _ => summarize_reader(std::io::stdin().lock()).map_err(|error| {
            format!("cannot read stdin: {error}. Fix: pass the log as a file argument")
        }),
    }
}

/// Writes to stdout, ignoring errors (a closed pipe such as `| head` must not panic).
fn print_stdout(text: &str) {
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

fn print_stderr(text: &str) {
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

fn main() -> ExitCode {
    let options = match parse_args(std::env::args_os().skip(1)) {
        Ok(Some(options)) => options,
        Ok(None) => {
            print_stdout(HELP);
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            print_stderr(&format!("vyre-cuda-phase-report: {message}\n"));
            return ExitCode::from(2);
        }
    };
    let summary = match summarize_input(options.path.as_ref()) {
        Ok(summary) => summary,
        Err(message) => {
            print_stderr(&format!("vyre-cuda-phase-report: {message}\n"));
            return ExitCode::from(1);
        }
    };
    if options.json {
        print_stdout(&render_json(&summary));
    } else {
        print_stdout(&render_table(&summary));
    }
    if summary.records == 0 {
        print_stderr(
            "vyre-cuda-phase-report: no probe lines found. Fix: run the dispatching binary with VYRE_CUDA_DISPATCH_PHASE_PROBE=1 and pass its stderr (2> probe.log)\n",
        );
    }
    ExitCode::SUCCESS
}
