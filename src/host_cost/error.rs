//! The one error type of the harness.
//!
//! Every message starts with `Fix:` and says what to change, so an instrument that fails
//! on the GPU machine tells its reader what to do without opening the source.

use std::fmt;
use std::path::PathBuf;

/// What went wrong while measuring or reporting.
#[derive(Debug)]
pub enum HostCostError {
    /// A file was longer than the byte cap it is read with.
    FileTooLarge {
        /// The file.
        path: PathBuf,
        /// The cap in bytes (a file of exactly this size is accepted).
        cap: u64,
    },
    /// An I/O operation failed (other than a missing file where that is allowed).
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done ("read", "create directory", "write").
        operation: &'static str,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The timed closure ran faster than the optimised-away threshold per unit: the
    /// compiler deleted the work, or the closure ignores its `iterations` argument.
    OptimisedAway {
        /// Cell or arm name.
        name: String,
        /// Measured minimum nanoseconds per unit.
        ns_per_unit: f64,
        /// The threshold it fell under.
        threshold_ns: f64,
    },
    /// An options field holds a value the procedure cannot run with (out of its bound:
    /// a huge round or region count would exhaust memory, a huge repetition count would
    /// hang, a NaN limit would pass nothing).
    InvalidOptions {
        /// The field, e.g. `PairOptions::rounds`.
        field: &'static str,
        /// The value it held, as printed.
        value: String,
        /// The bound it must satisfy, e.g. `between 1 and 100000`.
        bound: String,
    },
    /// Injected samples cannot form the measurement (no whole round, zero iterations).
    InvalidSamples {
        /// What is wrong and what to give instead.
        message: String,
    },
    /// A path that must be a regular file is something else (a FIFO, a directory, a
    /// device): opening a FIFO blocks forever, so it is refused before opening.
    NotRegularFile {
        /// The path.
        path: PathBuf,
        /// What it is instead ("directory", "FIFO", "other").
        kind: &'static str,
    },
}

impl HostCostError {
    /// An [`HostCostError::InvalidOptions`] for `field` holding `value`, which must be
    /// `bound`.
    pub(crate) fn invalid_option(
        field: &'static str,
        value: impl std::fmt::Debug,
        bound: impl Into<String>,
    ) -> HostCostError {
        HostCostError::InvalidOptions {
            field,
            value: format!("{value:?}"),
            bound: bound.into(),
        }
    }
}

impl fmt::Display for HostCostError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostCostError::FileTooLarge { path, cap } => write!(
                formatter,
                "Fix: {} is larger than its {cap}-byte cap; point the harness at the real \
                 kernel file (a regular file this large is not a /proc or cpufreq node)",
                path.display()
            ),
            HostCostError::Io {
                path,
                operation,
                source,
            } => write!(
                formatter,
                "Fix: could not {operation} {}: {source}; check the path and its permissions \
                 (set VYRE_HOST_COST_REPORT_DIR to a writable directory for report files)",
                path.display()
            ),
            HostCostError::OptimisedAway {
                name,
                ns_per_unit,
                threshold_ns,
            } => write!(
                formatter,
                "Fix: cell `{name}` measured {ns_per_unit:.3} ns per unit, under the \
                 {threshold_ns} ns optimised-away threshold; make the closure do `iterations` \
                 units of work that feed the u64 digest it returns (route inputs through \
                 std::hint::black_box)"
            ),
            HostCostError::InvalidOptions {
                field,
                value,
                bound,
            } => write!(formatter, "Fix: {field} is {value}; set it {bound}"),
            HostCostError::InvalidSamples { message } => write!(formatter, "Fix: {message}"),
            HostCostError::NotRegularFile { path, kind } => write!(
                formatter,
                "Fix: {} is a {kind}, not a regular file; point the harness at the kernel's \
                 regular file (it is refused before opening: a FIFO would block forever)",
                path.display()
            ),
        }
    }
}

impl std::error::Error for HostCostError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            HostCostError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
