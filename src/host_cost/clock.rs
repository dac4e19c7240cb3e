//! Clock-drift monitor: is the CPU running at the same speed in every timed region?
//!
//! A ratio between two arms is only meaningful if the clock did not move under them; a
//! turbo step or a thermal dip of a few percent is as large as the effects the harness is
//! meant to resolve. §6 therefore records, at every region boundary, one of two clock
//! figures:
//!
//! - **`cpufreq`**: the busy-weighted mean MHz, from per-CPU busy jiffies in `/proc/stat`
//!   and each CPU's `cpufreq/scaling_cur_freq`. CPUs that did the work weigh the most.
//! - **`spin-reference`**: where no cpufreq node exists — the GPU machine is a
//!   Firecracker VM with none (§0), so a cpufreq-only check would be silently inert
//!   there — a calibrated chain of dependent integer operations is timed at each
//!   boundary (minimum of a few short repetitions), and its rate in operations per
//!   microsecond stands in for the clock. It also moves when a hyper-thread sibling or
//!   the hypervisor steals cycles, which is interference the drift check should see.
//!
//! The drift of a run is the [`relative_spread`](super::estimate::relative_spread)
//! `(max − min) / median` of the per-region figures; above 2 % it is flagged. The
//! arithmetic ([`parse_proc_stat`], [`busy_weighted_mhz`],
//! [`clock_drift`](super::estimate::clock_drift)) is pure, and the file locations are
//! options, so both paths are testable without the real kernel files.
//!
//! Kernel files are read with hard byte caps ([`PROC_STAT_CAP`], [`CPUFREQ_CAP`]): a
//! harness that slurps whatever a path holds can be made to allocate without bound.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::error::HostCostError;
use super::estimate;

/// Byte cap for `/proc/stat` (1 MiB).
pub const PROC_STAT_CAP: u64 = 1 << 20;
/// Byte cap for one `scaling_cur_freq` file (64 B).
pub const CPUFREQ_CAP: u64 = 64;

/// Reads `path` whole if it holds at most `cap` bytes.
///
/// Reads at most `cap + 1` bytes, so a file of any size costs at most that much memory.
/// `Ok(None)` when the file does not exist; `Ok(Some(bytes))` when it holds `cap` bytes
/// or fewer; [`HostCostError::FileTooLarge`] when it holds more; [`HostCostError::Io`]
/// for any other failure.
pub fn read_capped(path: &Path, cap: u64) -> Result<Option<Vec<u8>>, HostCostError> {
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(HostCostError::Io {
                path: path.to_path_buf(),
                operation: "open",
                source,
            })
        }
    };
    let mut bytes = Vec::new();
    file.take(cap.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|source| HostCostError::Io {
            path: path.to_path_buf(),
            operation: "read",
            source,
        })?;
    if bytes.len() as u64 > cap {
        return Err(HostCostError::FileTooLarge {
            path: path.to_path_buf(),
            cap,
        });
    }
    Ok(Some(bytes))
}

/// Busy jiffies of one CPU, from one `cpuN` line of `/proc/stat`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuBusy {
    /// The `N` of `cpuN`.
    pub cpu: usize,
    /// `user + nice + system + irq + softirq + steal` (idle and iowait excluded; guest
    /// time is already inside user and nice).
    pub busy_jiffies: u64,
}

/// Parses the per-CPU lines of `/proc/stat` (the aggregate `cpu` line and every other
/// line are skipped; malformed lines are skipped too).
pub fn parse_proc_stat(text: &str) -> Vec<CpuBusy> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_ascii_whitespace();
            let label = fields.next()?;
            let cpu: usize = label.strip_prefix("cpu")?.parse().ok()?;
            let numbers: Vec<u64> = fields.map_while(|f| f.parse().ok()).collect();
            // user nice system idle iowait irq softirq [steal ...]
            if numbers.len() < 7 {
                return None;
            }
            let steal = numbers.get(7).copied().unwrap_or(0);
            let busy = numbers[0]
                .saturating_add(numbers[1])
                .saturating_add(numbers[2])
                .saturating_add(numbers[5])
                .saturating_add(numbers[6])
                .saturating_add(steal);
            Some(CpuBusy {
                cpu,
                busy_jiffies: busy,
            })
        })
        .collect()
}

/// Busy-weighted mean MHz of one region from `(busy jiffies during the region, MHz)` per
/// CPU: `Σ busyᵢ·MHzᵢ / Σ busyᵢ`. When no CPU was busy (region shorter than a jiffy) it
/// falls back to the plain mean. `None` for no CPUs.
pub fn busy_weighted_mhz(cpus: &[(u64, f64)]) -> Option<f64> {
    if cpus.is_empty() {
        return None;
    }
    let total_busy: u64 = cpus.iter().map(|(busy, _)| busy).sum();
    if total_busy == 0 {
        let frequencies: Vec<f64> = cpus.iter().map(|(_, mhz)| *mhz).collect();
        return estimate::mean(&frequencies);
    }
    let weighted: f64 = cpus.iter().map(|(busy, mhz)| *busy as f64 * mhz).sum();
    Some(weighted / total_busy as f64)
}

/// Which clock figure a run recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClockSource {
    /// Busy-weighted mean MHz from `/proc/stat` and cpufreq.
    Cpufreq,
    /// Rate of the calibrated spin-loop reference (operations per µs).
    SpinReference,
}

impl ClockSource {
    /// `"cpufreq"` or `"spin-reference"`: the name printed and written to JSON.
    pub fn label(self) -> &'static str {
        match self {
            ClockSource::Cpufreq => "cpufreq",
            ClockSource::SpinReference => "spin-reference",
        }
    }

    /// Unit of the per-region figures.
    pub fn unit(self) -> &'static str {
        match self {
            ClockSource::Cpufreq => "MHz",
            ClockSource::SpinReference => "spin ops/us",
        }
    }
}

/// Which clock source to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ClockSourceChoice {
    /// cpufreq when `/proc/stat` and at least one `scaling_cur_freq` are readable,
    /// otherwise the spin reference.
    #[default]
    Auto,
    /// Always the spin reference (for comparing the two sources on one machine).
    SpinReference,
}

/// Where the clock monitor looks and how it measures.
#[derive(Clone, Debug, PartialEq)]
pub struct ClockOptions {
    /// Default `/proc/stat`.
    pub proc_stat_path: PathBuf,
    /// Directory holding `cpuN/cpufreq/scaling_cur_freq`; default
    /// `/sys/devices/system/cpu`.
    pub cpu_sysfs_dir: PathBuf,
    /// Default [`ClockSourceChoice::Auto`].
    pub source: ClockSourceChoice,
    /// Calibration target of one spin-reference measurement. Default 20 µs: far below a
    /// scheduler time slice, so the minimum of a few is rarely preempted.
    pub spin_target: Duration,
    /// Spin-reference measurements per boundary (the fastest is kept). Default 5.
    pub spin_repeats: usize,
    /// Drift above this is flagged. Default 0.02 (§6).
    pub drift_limit: f64,
}

impl Default for ClockOptions {
    fn default() -> Self {
        ClockOptions {
            proc_stat_path: PathBuf::from("/proc/stat"),
            cpu_sysfs_dir: PathBuf::from("/sys/devices/system/cpu"),
            source: ClockSourceChoice::Auto,
            spin_target: Duration::from_micros(200),
            spin_repeats: 5,
            drift_limit: 0.02,
        }
    }
}

/// The clock record of one run: which source, the per-region figures and the verdict.
#[derive(Clone, Debug, PartialEq)]
pub struct ClockDrift {
    /// Source used.
    pub source: ClockSource,
    /// One figure per timed region ([`ClockSource::unit`]): the busy-weighted MHz over
    /// the region, or the mean of the spin-reference rate at its two boundaries.
    pub per_region: Vec<f64>,
    /// Spread of the medians of the three consecutive thirds of `per_region` over its
    /// median (see [`estimate::clock_drift`]); `None` without regions.
    pub drift: Option<f64>,
    /// `(max − min) / median` of `per_region`: region-to-region jitter, reported only.
    pub jitter: Option<f64>,
    /// The limit applied.
    pub limit: f64,
    /// `drift > limit`.
    pub flagged: bool,
    /// Why the source was chosen and any reads that failed along the way.
    pub notes: Vec<String>,
}

impl ClockDrift {
    /// Builds the record from injected per-region figures: the pure core of the monitor.
    pub fn from_regions(
        source: ClockSource,
        per_region: Vec<f64>,
        limit: f64,
        notes: Vec<String>,
    ) -> ClockDrift {
        let (drift, flagged) = match estimate::clock_drift(&per_region, limit) {
            Some((drift, flagged)) => (Some(drift), flagged),
            None => (None, false),
        };
        ClockDrift {
            source,
            jitter: estimate::clock_jitter(&per_region),
            per_region,
            drift,
            limit,
            flagged,
            notes,
        }
    }
}

/// One CPU's readings at one boundary.
#[derive(Clone, Copy, Debug)]
struct CpuReading {
    busy_jiffies: Option<u64>,
    khz: Option<u64>,
}

#[derive(Clone, Debug)]
enum Snapshot {
    Cpufreq(Vec<CpuReading>),
    Spin { ops_per_microsecond: f64 },
}

/// Records a clock figure at each region boundary of a run.
///
/// Call [`ClockMonitor::mark_boundary`] before the first timed region, between regions
/// and after the last one (never inside a timed region), then [`ClockMonitor::finish`].
#[derive(Debug)]
pub struct ClockMonitor {
    options: ClockOptions,
    source: ClockSource,
    cpus: Vec<usize>,
    spin_ops: u64,
    snapshots: Vec<Snapshot>,
    notes: Vec<String>,
}

/// A chain of dependent integer operations (multiply, rotate, xor): each step needs the
/// previous result, so its speed tracks the core clock and cannot be vectorised.
fn spin(ops: u64) -> u64 {
    let mut state = std::hint::black_box(0x2545_F491_4F6C_DD1D_u64);
    for _ in 0..std::hint::black_box(ops) {
        state = state.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(23) ^ 0x5851_F42D;
    }
    std::hint::black_box(state)
}

impl ClockMonitor {
    /// Chooses the source (see [`ClockSourceChoice`]) and, for the spin reference,
    /// calibrates the operation count once so later boundaries time a fixed amount of work.
    pub fn start(options: &ClockOptions) -> ClockMonitor {
        let mut monitor = ClockMonitor {
            options: options.clone(),
            source: ClockSource::SpinReference,
            cpus: Vec::new(),
            spin_ops: 0,
            snapshots: Vec::new(),
            notes: Vec::new(),
        };
        if options.source == ClockSourceChoice::Auto {
            monitor.try_cpufreq();
        } else {
            monitor
                .notes
                .push("spin reference requested by the options".to_string());
        }
        if monitor.source == ClockSource::SpinReference {
            monitor.calibrate_spin();
        }
        monitor
    }

    fn try_cpufreq(&mut self) {
        let stat = match read_capped(&self.options.proc_stat_path, PROC_STAT_CAP) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => {
                self.notes.push(format!(
                    "{} is absent: spin reference used",
                    self.options.proc_stat_path.display()
                ));
                return;
            }
            Err(error) => {
                self.notes
                    .push(format!("{error}; spin reference used instead"));
                return;
            }
        };
        let cpus: Vec<usize> = parse_proc_stat(&String::from_utf8_lossy(&stat))
            .iter()
            .map(|cpu| cpu.cpu)
            .filter(|&cpu| matches!(self.read_khz(cpu), Ok(Some(_))))
            .collect();
        if cpus.is_empty() {
            self.notes.push(format!(
                "no readable {}/cpuN/cpufreq/scaling_cur_freq: spin reference used",
                self.options.cpu_sysfs_dir.display()
            ));
            return;
        }
        self.source = ClockSource::Cpufreq;
        self.cpus = cpus;
    }

    fn read_khz(&self, cpu: usize) -> Result<Option<u64>, HostCostError> {
        let path = self
            .options
            .cpu_sysfs_dir
            .join(format!("cpu{cpu}"))
            .join("cpufreq")
            .join("scaling_cur_freq");
        Ok(read_capped(&path, CPUFREQ_CAP)?
            .and_then(|bytes| String::from_utf8_lossy(&bytes).trim().parse().ok()))
    }

    fn calibrate_spin(&mut self) {
        let mut ops: u64 = 1024;
        loop {
            let started = Instant::now();
            spin(ops);
            if started.elapsed() >= self.options.spin_target || ops >= 1 << 34 {
                break;
            }
            ops = ops.saturating_mul(4);
        }
        self.spin_ops = ops;
    }

    /// The source this monitor records.
    pub fn source(&self) -> ClockSource {
        self.source
    }

    /// Records the clock figure at a region boundary.
    pub fn mark_boundary(&mut self) {
        let snapshot = match self.source {
            ClockSource::SpinReference => {
                let fastest = (0..self.options.spin_repeats.max(1))
                    .map(|_| {
                        let started = Instant::now();
                        spin(self.spin_ops);
                        started.elapsed().as_secs_f64()
                    })
                    .fold(f64::INFINITY, f64::min);
                Snapshot::Spin {
                    ops_per_microsecond: self.spin_ops as f64 / (fastest * 1e6),
                }
            }
            ClockSource::Cpufreq => {
                let busy = match read_capped(&self.options.proc_stat_path, PROC_STAT_CAP) {
                    Ok(Some(bytes)) => parse_proc_stat(&String::from_utf8_lossy(&bytes)),
                    Ok(None) => Vec::new(),
                    Err(error) => {
                        self.notes.push(error.to_string());
                        Vec::new()
                    }
                };
                let mut readings = Vec::with_capacity(self.cpus.len());
                for &cpu in &self.cpus {
                    let khz = match self.read_khz(cpu) {
                        Ok(khz) => khz,
                        Err(error) => {
                            self.notes.push(error.to_string());
                            None
                        }
                    };
                    let busy_jiffies = busy
                        .iter()
                        .find(|entry| entry.cpu == cpu)
                        .map(|entry| entry.busy_jiffies);
                    readings.push(CpuReading { busy_jiffies, khz });
                }
                Snapshot::Cpufreq(readings)
            }
        };
        self.snapshots.push(snapshot);
    }

    /// Turns the boundaries into per-region figures and the drift verdict.
    pub fn finish(self) -> ClockDrift {
        let per_region: Vec<f64> = self
            .snapshots
            .windows(2)
            .filter_map(|pair| match (&pair[0], &pair[1]) {
                (
                    Snapshot::Spin {
                        ops_per_microsecond: before,
                    },
                    Snapshot::Spin {
                        ops_per_microsecond: after,
                    },
                ) => Some((before + after) / 2.0),
                (Snapshot::Cpufreq(before), Snapshot::Cpufreq(after)) => {
                    let cpus: Vec<(u64, f64)> = before
                        .iter()
                        .zip(after)
                        .filter_map(|(start, end)| {
                            let khz = match (start.khz, end.khz) {
                                (Some(a), Some(b)) => (a + b) as f64 / 2.0,
                                (Some(a), None) | (None, Some(a)) => a as f64,
                                (None, None) => return None,
                            };
                            let busy = match (start.busy_jiffies, end.busy_jiffies) {
                                (Some(a), Some(b)) => b.saturating_sub(a),
                                _ => 0,
                            };
                            Some((busy, khz / 1000.0))
                        })
                        .collect();
                    busy_weighted_mhz(&cpus)
                }
                _ => None,
            })
            .collect();
        ClockDrift::from_regions(
            self.source,
            per_region,
            self.options.drift_limit,
            self.notes,
        )
    }
}
