//! Clock-drift monitor: is the CPU running at the same speed in every timed region?
//!
//! A ratio between two arms is only meaningful if the clock did not move under them; a
//! turbo step or a thermal dip of a few percent is as large as the effects the harness is
//! meant to resolve. The harness therefore records, at every region boundary, one of two clock
//! figures:
//!
//! - **`cpufreq`**: the busy-weighted mean MHz, from per-CPU busy jiffies in `/proc/stat`
//!   and each CPU's `cpufreq/scaling_cur_freq`. CPUs that did the work weigh the most.
//! - **`spin-reference`**: where no cpufreq node exists — the GPU machine is a
//!   Firecracker VM with none, so a cpufreq-only check would be silently inert
//!   there — a calibrated chain of dependent integer operations is timed at each
//!   boundary (minimum of a few short repetitions), and its rate in operations per
//!   microsecond stands in for the clock. It also moves when a hyper-thread sibling or
//!   the hypervisor steals cycles, which is interference the drift check should see.
//!
//! Two further readings enter the figure of every region, whichever source is used,
//! because they are interference the clock rate alone cannot see:
//!
//! - **run-queue delay** of the measuring thread (`/proc/thread-self/schedstat`, second
//!   field, nanoseconds): time the thread was runnable but another thread held its CPU.
//!   A competitor that runs only during arm B's regions never touches the boundaries,
//!   so only an in-region reading can see it. Where the kernel has no schedstat
//!   (`CONFIG_SCHED_INFO` off), the thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`)
//!   stands in: the share of the region the thread was *not* on a CPU. That fallback
//!   assumes the timed work does not sleep (a dispatch spin-waits in synchronize under
//!   the primary context's default flags on a machine with more cores than contexts);
//!   the notes say which one was used.
//!
//! A region's figure is `rate × (1 − delay share)`: the speed the measuring thread
//! actually got. **Steal** (`/proc/stat`, the aggregate `cpu` line's eighth field, where
//! the kernel reports it: time the hypervisor ran someone else on a virtual CPU) is
//! counted in 10 ms ticks per CPU, far coarser than a 5 ms region: folded into each
//! region it added a between-arm noise of several percent on a 2-CPU VM with 1–5 %
//! steal. It is therefore summed per arm ([`StealGap`]) and disqualifies a comparison
//! only when the arms' steal shares differ by more than the limit **and** by more than
//! three times the tick quantisation's standard error.
//!
//! # The verdict
//! A paired comparison is published only if the **between-arm gap** — the mean figure of
//! arm B's regions against arm A's ([`between_arm_gap`](super::estimate::between_arm_gap))
//! — is at most 2 %: the seed's rule. The spread of the thirds' medians (a trend within
//! the run, which ABBA already cancels) and the region-to-region jitter are printed as
//! **advisories** and decide nothing. On the GPU machine the spin reference jittered by
//! 3–15 % from one boundary to the next (min of 5 × 200 µs), while the effects the
//! harness resolves are 1–5 %; the reference is therefore the **median** of several
//! short spins per boundary (default 9 × 40 µs: a preempted spin moves a median by one
//! rank, not by its delay), and its own between-arm noise is measured, not assumed:
//! [`reference_noise_floor`] runs the reference in an A/A schedule against itself and
//! reports the gaps it would have produced (the instruments print it; the target is
//! ≤ 0.5 %, a quarter of the limit).
//!
//! The arithmetic ([`parse_proc_stat`], [`busy_weighted_mhz`],
//! [`between_arm_gap`](super::estimate::between_arm_gap)) is pure, and the file
//! locations are options, so every path is testable without the real kernel files.
//!
//! Kernel files are read with hard byte caps ([`PROC_STAT_CAP`], [`CPUFREQ_CAP`]): a
//! harness that slurps whatever a path holds can be made to allocate without bound.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::error::HostCostError;
use super::estimate::{self, Arm};

/// Byte cap for `/proc/stat` (1 MiB).
pub const PROC_STAT_CAP: u64 = 1 << 20;
/// Byte cap for one `scaling_cur_freq` file (64 B).
pub const CPUFREQ_CAP: u64 = 64;

/// Byte cap for `/proc/thread-self/schedstat` (three integers: 64 B).
pub const SCHEDSTAT_CAP: u64 = 64;

/// What a path is when it is not a regular file (for the error message).
fn file_kind(file_type: std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if file_type.is_fifo() {
            return "FIFO";
        }
        if file_type.is_socket() {
            return "socket";
        }
        if file_type.is_char_device() || file_type.is_block_device() {
            return "device";
        }
    }
    if file_type.is_dir() {
        "directory"
    } else {
        "non-regular file"
    }
}

/// Opens `path` for reading without ever blocking in `open` (`O_NONBLOCK` on Linux: if
/// the path was swapped for a FIFO after the check, `open` returns at once).
fn open_nonblocking(path: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // O_NONBLOCK on every Linux architecture Rust supports except alpha/parisc/sparc
        // (where this crate's CUDA driver does not exist).
        const O_NONBLOCK: i32 = 0o4000;
        options.custom_flags(O_NONBLOCK);
    }
    options.open(path)
}

/// Reads `path` whole if it is a regular file holding at most `cap` bytes.
///
/// The path is checked with `stat` **before** it is opened: anything but a regular file
/// (a FIFO would block `open` forever, a character device could stream without end) is
/// [`HostCostError::NotRegularFile`]. The open itself is non-blocking and the opened
/// handle is checked again, so a path swapped in between is refused too. Reads at most
/// `cap + 1` bytes, so a file of any size costs at most that much memory.
/// `Ok(None)` when the file does not exist; `Ok(Some(bytes))` when it holds `cap` bytes
/// or fewer; [`HostCostError::FileTooLarge`] when it holds more; [`HostCostError::Io`]
/// for any other failure.
pub fn read_capped(path: &Path, cap: u64) -> Result<Option<Vec<u8>>, HostCostError> {
    let refuse = |file_type: std::fs::FileType| HostCostError::NotRegularFile {
        path: path.to_path_buf(),
        kind: file_kind(file_type),
    };
    match std::fs::metadata(path) {
        Ok(metadata) if !metadata.is_file() => return Err(refuse(metadata.file_type())),
        Ok(_) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(HostCostError::Io {
                path: path.to_path_buf(),
                operation: "stat",
                source,
            })
        }
    }
    let file = match open_nonblocking(path) {
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
    match file.metadata() {
        Ok(metadata) if !metadata.is_file() => return Err(refuse(metadata.file_type())),
        Ok(_) => {}
        Err(source) => {
            return Err(HostCostError::Io {
                path: path.to_path_buf(),
                operation: "stat",
                source,
            })
        }
    }
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
/// line are skipped; malformed lines are skipped too). At most [`MAX_CPUS`] lines are
/// kept.
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
        .take(MAX_CPUS)
        .collect()
}

/// Most CPUs the clock monitor tracks (Linux's own default maximum is 8192).
pub const MAX_CPUS: usize = 8192;

/// Steal of the whole machine from the aggregate `cpu` line of `/proc/stat`: the eighth
/// number, in clock ticks; `None` where the kernel does not report it (fewer fields) or
/// the line is garbage.
pub fn parse_proc_stat_steal(text: &str) -> Option<u64> {
    let line = text
        .lines()
        .find(|line| line.split_ascii_whitespace().next() == Some("cpu"))?;
    let numbers: Vec<u64> = line
        .split_ascii_whitespace()
        .skip(1)
        .take(10)
        .map_while(|field| field.parse().ok())
        .collect();
    numbers.get(7).copied()
}

/// Run-queue delay in nanoseconds from a `schedstat` file (`exec_ns delay_ns slices`):
/// the second number; `None` for anything else.
pub fn parse_schedstat_delay(text: &str) -> Option<u64> {
    let mut fields = text.split_ascii_whitespace();
    let _exec: u64 = fields.next()?.parse().ok()?;
    fields.next()?.parse().ok()
}

/// Busy-weighted mean MHz of one region from `(busy jiffies during the region, MHz)` per
/// CPU: `Σ busyᵢ·MHzᵢ / Σ busyᵢ`. When no CPU was busy (region shorter than a jiffy) it
/// falls back to the plain mean. `None` for no CPUs.
///
/// The busy total is summed in `u128`, so no count of CPUs or jiffies overflows it.
pub fn busy_weighted_mhz(cpus: &[(u64, f64)]) -> Option<f64> {
    if cpus.is_empty() {
        return None;
    }
    let total_busy: u128 = cpus.iter().map(|(busy, _)| u128::from(*busy)).sum();
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
    /// No figure: cpufreq is absent and the spin reference could not calibrate (a clock
    /// that does not advance, or work that never reaches the target). Reported in the
    /// notes; a comparison with this source is never publishable (gap unknown).
    Unavailable,
}

impl ClockSource {
    /// `"cpufreq"`, `"spin-reference"` or `"unavailable"`: the name printed and written
    /// to JSON.
    pub fn label(self) -> &'static str {
        match self {
            ClockSource::Cpufreq => "cpufreq",
            ClockSource::SpinReference => "spin-reference",
            ClockSource::Unavailable => "unavailable",
        }
    }

    /// Unit of the per-region figures.
    pub fn unit(self) -> &'static str {
        match self {
            ClockSource::Cpufreq => "MHz",
            ClockSource::SpinReference => "spin ops/us",
            ClockSource::Unavailable => "none",
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

/// How the spin reference condenses its repetitions at one boundary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SpinStatistic {
    /// The median repetition (default): one preempted or interrupted spin moves it by
    /// one rank, and it follows a sustained slowdown (a busy hyper-thread sibling) that
    /// the workload also suffers.
    #[default]
    Median,
    /// The fastest repetition (the first design): least sensitive to interrupts, blind
    /// to a slowdown that leaves one quiet spin.
    Minimum,
}

/// Bounds of [`ClockOptions::spin_target`].
pub const SPIN_TARGET_BOUNDS: (Duration, Duration) =
    (Duration::from_micros(1), Duration::from_millis(10));
/// Largest [`ClockOptions::spin_repeats`].
pub const MAX_SPIN_REPEATS: usize = 101;

/// Where the clock monitor looks and how it measures.
#[derive(Clone, Debug, PartialEq)]
pub struct ClockOptions {
    /// Default `/proc/stat` (per-CPU busy jiffies, and machine-wide steal).
    pub proc_stat_path: PathBuf,
    /// Directory holding `cpuN/cpufreq/scaling_cur_freq`; default
    /// `/sys/devices/system/cpu`.
    pub cpu_sysfs_dir: PathBuf,
    /// The measuring thread's scheduler statistics; default
    /// `/proc/thread-self/schedstat`. Absent (kernels without `CONFIG_SCHED_INFO`): no
    /// in-region delay is measured, and the notes say so.
    pub schedstat_path: PathBuf,
    /// Where schedstat is unreadable, read in-region interference from the thread's CPU
    /// time instead (see the module docs). Default true.
    pub thread_cpu_fallback: bool,
    /// Default [`ClockSourceChoice::Auto`].
    pub source: ClockSourceChoice,
    /// Calibration target of one spin-reference repetition, within
    /// [`SPIN_TARGET_BOUNDS`]. Default 40 µs: far below a scheduler slice, long against
    /// the timer's resolution.
    pub spin_target: Duration,
    /// Spin repetitions per boundary, 1 to [`MAX_SPIN_REPEATS`]. Default 9.
    pub spin_repeats: usize,
    /// How the repetitions are condensed. Default [`SpinStatistic::Median`].
    pub spin_statistic: SpinStatistic,
    /// A between-arm gap above this disqualifies a comparison; a within-run drift above
    /// it is an advisory. Default 0.02. Finite, in (0, 1].
    pub limit: f64,
}

impl Default for ClockOptions {
    fn default() -> Self {
        ClockOptions {
            proc_stat_path: PathBuf::from("/proc/stat"),
            cpu_sysfs_dir: PathBuf::from("/sys/devices/system/cpu"),
            schedstat_path: PathBuf::from("/proc/thread-self/schedstat"),
            thread_cpu_fallback: true,
            source: ClockSourceChoice::Auto,
            spin_target: Duration::from_micros(40),
            spin_repeats: 9,
            spin_statistic: SpinStatistic::Median,
            limit: 0.02,
        }
    }
}

impl ClockOptions {
    /// Checks every bounded field.
    ///
    /// # Errors
    /// [`HostCostError::InvalidOptions`] naming the field and its bound.
    pub fn validate(&self) -> Result<(), HostCostError> {
        let (shortest, longest) = SPIN_TARGET_BOUNDS;
        if self.spin_target < shortest || self.spin_target > longest {
            return Err(HostCostError::invalid_option(
                "ClockOptions::spin_target",
                self.spin_target,
                format!("between {shortest:?} and {longest:?}"),
            ));
        }
        if self.spin_repeats == 0 || self.spin_repeats > MAX_SPIN_REPEATS {
            return Err(HostCostError::invalid_option(
                "ClockOptions::spin_repeats",
                self.spin_repeats,
                format!("between 1 and {MAX_SPIN_REPEATS}"),
            ));
        }
        if !(self.limit > 0.0 && self.limit <= 1.0) {
            return Err(HostCostError::invalid_option(
                "ClockOptions::limit",
                self.limit,
                "to a finite fraction in (0, 1], e.g. 0.02",
            ));
        }
        Ok(())
    }
}

/// Interference readings averaged over a run's regions (shares of wall time).
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct Interference {
    /// Mean share of each region the measuring thread waited on a run queue; `None`
    /// without schedstat.
    pub run_queue_delay: Option<f64>,
    /// Machine-wide steal share over the whole run (steal ticks over CPU ticks); `None`
    /// where the kernel reports no steal.
    pub steal: Option<f64>,
}

/// Steal per arm of a paired run, from 10 ms ticks summed over each arm's regions.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StealGap {
    /// Steal ticks during arm A's regions (all CPUs).
    pub ticks_a: u64,
    /// Steal ticks during arm B's regions.
    pub ticks_b: u64,
    /// `ticks_a` over the CPU ticks of arm A's regions (wall × CPUs).
    pub share_a: f64,
    /// Same for B.
    pub share_b: f64,
    /// Standard error of `share_b − share_a` from tick quantisation alone: each region's
    /// tick count is off by at most one per CPU (uniform), so
    /// `√(regions × CPUs / 6) / CPU ticks of one arm`.
    pub standard_error: f64,
    /// `|share_b − share_a| > limit` and `> 3 × standard_error`.
    pub flagged: bool,
}

/// The clock record of one run: which source, the per-region figures and the verdict.
#[derive(Clone, Debug, PartialEq)]
pub struct ClockDrift {
    /// Source used.
    pub source: ClockSource,
    /// One figure per timed region ([`ClockSource::unit`]): the busy-weighted MHz over
    /// the region, or the mean of the spin-reference rate at its two boundaries, times
    /// `1 − run-queue delay share − steal share` of the region.
    pub per_region: Vec<f64>,
    /// The verdict's input for a paired run (the mean figure of arm B's regions against
    /// arm A's, [`ArmGap`](estimate::ArmGap)); `None` for a cell (no arms) or when no
    /// figure exists.
    pub arm_gap: Option<estimate::ArmGap>,
    /// Advisory: spread of the medians of the three consecutive thirds of `per_region`
    /// over its median (a step or a trend moves a third's median, region-to-region
    /// jitter does not; one or two regions fall back to `(max − min) / median`); `None`
    /// without regions.
    pub drift: Option<f64>,
    /// Advisory: `(max − min) / median` of `per_region`, region-to-region jitter.
    pub jitter: Option<f64>,
    /// The limit applied.
    pub limit: f64,
    /// The verdict: `arm_gap > limit` (a paired run only; a cell has no arms).
    pub flagged: bool,
    /// Advisory: `drift > limit`. Decides nothing.
    pub drift_advisory: bool,
    /// Run-queue delay and steal over the run.
    pub interference: Interference,
    /// Steal per arm (a paired run where the kernel reports steal); see [`StealGap`].
    pub steal_gap: Option<StealGap>,
    /// The bare clock figure of each region, before the run-queue delay is applied
    /// (what the reference alone measured); empty for injected records.
    pub rate_per_region: Vec<f64>,
    /// Wall time of each region as the monitor saw it (boundary to boundary), seconds;
    /// empty for injected records.
    pub region_wall_seconds: Vec<f64>,
    /// Machine-wide steal ticks during each region; empty where steal is not reported.
    pub steal_ticks_per_region: Vec<u64>,
    /// CPUs in `/proc/stat` (the steal denominators); 0 when unknown.
    pub machine_cpus: usize,
    /// Why the source was chosen and any reads that failed along the way.
    pub notes: Vec<String>,
}

impl ClockDrift {
    /// Builds the record from injected per-region figures: the pure core of the monitor.
    /// No arms are known yet (`arm_gap` is `None`, `flagged` false); a paired run adds
    /// them with [`ClockDrift::with_arms`].
    pub fn from_regions(
        source: ClockSource,
        per_region: Vec<f64>,
        limit: f64,
        notes: Vec<String>,
    ) -> ClockDrift {
        let (drift, drift_advisory) = match estimate::clock_drift(&per_region, limit) {
            Some((drift, flagged)) => (Some(drift), flagged),
            None => (None, false),
        };
        ClockDrift {
            source,
            jitter: estimate::clock_jitter(&per_region),
            per_region,
            arm_gap: None,
            drift,
            limit,
            flagged: false,
            drift_advisory,
            interference: Interference::default(),
            steal_gap: None,
            rate_per_region: Vec::new(),
            region_wall_seconds: Vec::new(),
            steal_ticks_per_region: Vec::new(),
            machine_cpus: 0,
            notes,
        }
    }

    /// Applies the between-arm rules: `schedule[i]` is the arm of `per_region[i]`.
    /// `flagged` is set by the clock gap or by a significant steal gap.
    pub fn with_arms(mut self, schedule: &[Arm]) -> ClockDrift {
        self.arm_gap = estimate::between_arm_gap(&self.per_region, schedule);
        self.steal_gap = self.steal_between_arms(schedule);
        self.flagged = self
            .arm_gap
            .is_some_and(|gap| !estimate::within_limit(gap.gap, self.limit))
            || self.steal_gap.is_some_and(|steal| steal.flagged);
        self
    }

    fn steal_between_arms(&self, schedule: &[Arm]) -> Option<StealGap> {
        let regions = self.steal_ticks_per_region.len();
        if regions == 0 || self.machine_cpus == 0 || self.region_wall_seconds.len() != regions {
            return None;
        }
        let cpus = self.machine_cpus as f64;
        let mut ticks = [0_u64; 2];
        let mut cpu_ticks = [0.0_f64; 2];
        let mut counts = [0_usize; 2];
        for ((steal, wall), arm) in self
            .steal_ticks_per_region
            .iter()
            .zip(&self.region_wall_seconds)
            .zip(schedule)
        {
            let slot = usize::from(*arm == Arm::B);
            ticks[slot] = ticks[slot].saturating_add(*steal);
            cpu_ticks[slot] += wall * TICKS_PER_SECOND * cpus;
            counts[slot] += 1;
        }
        if cpu_ticks[0] <= 0.0 || cpu_ticks[1] <= 0.0 {
            return None;
        }
        let share_a = ticks[0] as f64 / cpu_ticks[0];
        let share_b = ticks[1] as f64 / cpu_ticks[1];
        let standard_error = ((counts[0] as f64 * cpus / 6.0).sqrt() / cpu_ticks[0])
            .hypot((counts[1] as f64 * cpus / 6.0).sqrt() / cpu_ticks[1]);
        let difference = (share_b - share_a).abs();
        Some(StealGap {
            ticks_a: ticks[0],
            ticks_b: ticks[1],
            share_a,
            share_b,
            standard_error,
            flagged: difference > self.limit && difference > 3.0 * standard_error,
        })
    }
}

/// One CPU's readings at one boundary.
#[derive(Clone, Copy, Debug)]
struct CpuReading {
    busy_jiffies: Option<u64>,
    khz: Option<u64>,
}

/// Everything read at one boundary.
#[derive(Clone, Debug)]
struct Boundary {
    at: Instant,
    spin_ops_per_microsecond: Option<f64>,
    cpufreq: Vec<CpuReading>,
    run_queue_delay_ns: Option<u64>,
    thread_cpu_ns: Option<u64>,
    steal_ticks: Option<u64>,
}

/// CPU time of the calling thread in nanoseconds (`CLOCK_THREAD_CPUTIME_ID`).
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
fn thread_cpu_ns() -> Option<u64> {
    #[repr(C)]
    struct Timespec {
        seconds: i64,
        nanoseconds: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, time: *mut Timespec) -> i32;
    }
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut time = Timespec {
        seconds: 0,
        nanoseconds: 0,
    };
    // SAFETY: `clock_gettime` (libc, linked by std on Linux) writes one `timespec`
    // through the pointer, which points at a live, exclusively borrowed value whose
    // layout is the C struct's on 64-bit Linux (two 64-bit fields).
    let status = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut time) };
    if status != 0 || time.seconds < 0 || time.nanoseconds < 0 {
        return None;
    }
    (time.seconds as u64)
        .checked_mul(1_000_000_000)?
        .checked_add(time.nanoseconds as u64)
}

/// No thread CPU clock off 64-bit Linux.
#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
fn thread_cpu_ns() -> Option<u64> {
    None
}

/// Clock ticks per second of `/proc/stat` (`USER_HZ`, 100 on every Linux ABI).
const TICKS_PER_SECOND: f64 = 100.0;

/// Records a clock figure at each region boundary of a run.
///
/// Call [`ClockMonitor::mark_boundary`] before the first timed region, between regions
/// and after the last one (never inside a timed region), **from the thread that runs the
/// regions** (the run-queue delay is that thread's), then [`ClockMonitor::finish`].
#[derive(Debug)]
pub struct ClockMonitor {
    options: ClockOptions,
    source: ClockSource,
    cpus: Vec<usize>,
    machine_cpus: usize,
    spin_ops: u64,
    boundaries: Vec<Boundary>,
    schedstat_readable: bool,
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

/// Most spin operations calibration will try (about 10 s of work on any CPU).
const MAX_SPIN_OPS: u64 = 1 << 34;

impl ClockMonitor {
    /// Chooses the source (see [`ClockSourceChoice`]) and, for the spin reference,
    /// calibrates the operation count once so later boundaries time a fixed amount of work.
    ///
    /// Never fails: unreadable, oversized or garbage kernel files and a reference that
    /// cannot calibrate are written to the notes and the run continues with what is
    /// left (at worst [`ClockSource::Unavailable`]).
    ///
    /// # Errors
    /// [`HostCostError::InvalidOptions`] when `options` fail [`ClockOptions::validate`].
    pub fn start(options: &ClockOptions) -> Result<ClockMonitor, HostCostError> {
        options.validate()?;
        let mut monitor = ClockMonitor {
            options: options.clone(),
            source: ClockSource::SpinReference,
            cpus: Vec::new(),
            machine_cpus: 0,
            spin_ops: 0,
            boundaries: Vec::new(),
            schedstat_readable: false,
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
        monitor.schedstat_readable = match monitor.read_run_queue_delay() {
            Some(_) => true,
            None => {
                monitor.notes.push(format!(
                    "{} unreadable: {}",
                    monitor.options.schedstat_path.display(),
                    if monitor.options.thread_cpu_fallback && thread_cpu_ns().is_some() {
                        "in-region interference read from the thread's CPU time (assumes \
                         the timed work does not sleep)"
                    } else {
                        "in-region interference not measured"
                    }
                ));
                false
            }
        };
        Ok(monitor)
    }

    fn read_proc_stat(&mut self) -> Option<String> {
        match read_capped(&self.options.proc_stat_path, PROC_STAT_CAP) {
            Ok(Some(bytes)) => Some(String::from_utf8_lossy(&bytes).into_owned()),
            Ok(None) => None,
            Err(error) => {
                self.note_once(error.to_string());
                None
            }
        }
    }

    /// Notes are capped (one per distinct message, at most 16) so a file that fails at
    /// every boundary cannot grow them without bound.
    fn note_once(&mut self, note: String) {
        if self.notes.len() < 16 && !self.notes.contains(&note) {
            self.notes.push(note);
        }
    }

    fn try_cpufreq(&mut self) {
        let Some(stat) = self.read_proc_stat() else {
            self.notes.push(format!(
                "{} unreadable: spin reference used",
                self.options.proc_stat_path.display()
            ));
            return;
        };
        let per_cpu = parse_proc_stat(&stat);
        self.machine_cpus = per_cpu.len();
        let cpus: Vec<usize> = per_cpu
            .iter()
            .map(|cpu| cpu.cpu)
            .filter(|&cpu| matches!(self.read_khz(cpu), Ok(Some(_))))
            .collect();
        if parse_proc_stat_steal(&stat).is_none() {
            self.notes
                .push("the kernel reports no steal time in /proc/stat".to_string());
        }
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

    fn read_run_queue_delay(&self) -> Option<u64> {
        let bytes = read_capped(&self.options.schedstat_path, SCHEDSTAT_CAP).ok()??;
        parse_schedstat_delay(&String::from_utf8_lossy(&bytes))
    }

    fn calibrate_spin(&mut self) {
        let target = self.options.spin_target;
        let mut ops: u64 = 256;
        loop {
            let started = Instant::now();
            spin(ops);
            if started.elapsed() >= target {
                self.spin_ops = ops;
                return;
            }
            if ops >= MAX_SPIN_OPS {
                self.source = ClockSource::Unavailable;
                self.notes.push(format!(
                    "the spin reference could not calibrate: {MAX_SPIN_OPS} operations took \
                     less than {target:?} (a clock that does not advance?); no clock figure"
                ));
                return;
            }
            ops = ops.saturating_mul(2);
        }
    }

    /// The source this monitor records.
    pub fn source(&self) -> ClockSource {
        self.source
    }

    fn spin_rate(&self) -> Option<f64> {
        let mut seconds: Vec<f64> = (0..self.options.spin_repeats)
            .map(|_| {
                let started = Instant::now();
                spin(self.spin_ops);
                started.elapsed().as_secs_f64()
            })
            .collect();
        seconds.sort_by(f64::total_cmp);
        let chosen = match self.options.spin_statistic {
            SpinStatistic::Minimum => seconds.first().copied(),
            // Lower middle for an even count: a figure that was measured.
            SpinStatistic::Median => seconds.get((seconds.len() - 1) / 2).copied(),
        }?;
        let rate = self.spin_ops as f64 / (chosen * 1e6);
        (rate.is_finite() && rate > 0.0).then_some(rate)
    }

    /// Records the clock figure at a region boundary.
    pub fn mark_boundary(&mut self) {
        if self.boundaries.len() > 4 * estimate::MAX_ROUNDS {
            self.note_once("more boundaries than any schedule has: ignored".to_string());
            return;
        }
        let at = Instant::now();
        let (run_queue_delay_ns, thread_cpu_ns) = if self.schedstat_readable {
            (self.read_run_queue_delay(), None)
        } else if self.options.thread_cpu_fallback {
            (None, thread_cpu_ns())
        } else {
            (None, None)
        };
        let stat = self.read_proc_stat();
        let steal_ticks = stat.as_deref().and_then(parse_proc_stat_steal);
        if self.machine_cpus == 0 {
            self.machine_cpus = stat
                .as_deref()
                .map_or(0, |text| parse_proc_stat(text).len());
        }
        let mut cpufreq = Vec::new();
        let mut spin_ops_per_microsecond = None;
        match self.source {
            ClockSource::SpinReference => spin_ops_per_microsecond = self.spin_rate(),
            ClockSource::Cpufreq => {
                let busy = stat.as_deref().map(parse_proc_stat).unwrap_or_default();
                let cpus = self.cpus.clone();
                for cpu in cpus {
                    let khz = match self.read_khz(cpu) {
                        Ok(khz) => khz,
                        Err(error) => {
                            self.note_once(error.to_string());
                            None
                        }
                    };
                    let busy_jiffies = busy
                        .iter()
                        .find(|entry| entry.cpu == cpu)
                        .map(|entry| entry.busy_jiffies);
                    cpufreq.push(CpuReading { busy_jiffies, khz });
                }
            }
            ClockSource::Unavailable => {}
        }
        self.boundaries.push(Boundary {
            at,
            spin_ops_per_microsecond,
            cpufreq,
            run_queue_delay_ns,
            thread_cpu_ns,
            steal_ticks,
        });
    }

    /// The base clock figure of the region between two boundaries.
    fn base_figure(&self, before: &Boundary, after: &Boundary) -> Option<f64> {
        match self.source {
            ClockSource::SpinReference => {
                Some((before.spin_ops_per_microsecond? + after.spin_ops_per_microsecond?) / 2.0)
            }
            ClockSource::Cpufreq => {
                let cpus: Vec<(u64, f64)> = before
                    .cpufreq
                    .iter()
                    .zip(&after.cpufreq)
                    .filter_map(|(start, end)| {
                        let khz = match (start.khz, end.khz) {
                            (Some(a), Some(b)) => (a as f64 + b as f64) / 2.0,
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
            ClockSource::Unavailable => None,
        }
    }

    /// Turns the boundaries into per-region figures and the advisories (a paired run
    /// then applies [`ClockDrift::with_arms`]).
    pub fn finish(self) -> ClockDrift {
        let regions = self.boundaries.len().saturating_sub(1);
        let mut per_region = Vec::with_capacity(regions);
        let mut rates = Vec::with_capacity(regions);
        let mut walls = Vec::with_capacity(regions);
        let mut steal_ticks = Vec::with_capacity(regions);
        let mut delays = Vec::new();
        for pair in self.boundaries.windows(2) {
            let (before, after) = (&pair[0], &pair[1]);
            let wall = after.at.saturating_duration_since(before.at).as_secs_f64();
            walls.push(wall);
            let delay = match (
                before.run_queue_delay_ns.zip(after.run_queue_delay_ns),
                before.thread_cpu_ns.zip(after.thread_cpu_ns),
            ) {
                _ if wall <= 0.0 => None,
                (Some((a, b)), _) => {
                    Some((b.saturating_sub(a) as f64 / (wall * 1e9)).clamp(0.0, 1.0))
                }
                (None, Some((a, b))) => {
                    Some((1.0 - b.saturating_sub(a) as f64 / (wall * 1e9)).clamp(0.0, 1.0))
                }
                (None, None) => None,
            };
            delays.extend(delay);
            if let (Some(a), Some(b)) = (before.steal_ticks, after.steal_ticks) {
                steal_ticks.push(b.saturating_sub(a));
            }
            if let Some(base) = self.base_figure(before, after) {
                rates.push(base);
                per_region.push(base * (1.0 - delay.unwrap_or(0.0)));
            }
        }
        let mut notes = self.notes;
        if per_region.len() != regions {
            notes.push(format!(
                "{} of {regions} regions have no clock figure",
                regions - per_region.len()
            ));
            // A partial series would pair figures with the wrong arms: drop it.
            per_region.clear();
            rates.clear();
        }
        if steal_ticks.len() != regions {
            steal_ticks.clear();
        }
        let total_wall: f64 = walls.iter().sum();
        let steal =
            (!steal_ticks.is_empty() && self.machine_cpus > 0 && total_wall > 0.0).then(|| {
                let ticks: u64 = steal_ticks.iter().fold(0, |sum, t| sum.saturating_add(*t));
                ticks as f64 / (total_wall * TICKS_PER_SECOND * self.machine_cpus as f64)
            });
        let mut record =
            ClockDrift::from_regions(self.source, per_region, self.options.limit, notes);
        record.interference = Interference {
            run_queue_delay: estimate::mean(&delays),
            steal,
        };
        record.rate_per_region = rates;
        record.region_wall_seconds = walls;
        record.steal_ticks_per_region = steal_ticks;
        record.machine_cpus = self.machine_cpus;
        record
    }
}

/// The reference's own between-arm noise, from [`reference_noise_floor`].
#[derive(Clone, Debug, PartialEq)]
pub struct NoiseFloor {
    /// Source the trials used.
    pub source: ClockSource,
    /// The between-arm gap of the bare reference in each A/A trial (both "arms" are the
    /// same busy wait): the reference's own noise, which must stay ≤ 0.5 %.
    pub reference_gaps: Vec<f64>,
    /// Median of `reference_gaps`.
    pub median_reference_gap: Option<f64>,
    /// Largest of `reference_gaps`.
    pub maximum_reference_gap: Option<f64>,
    /// The between-arm gap of the full figure (reference × (1 − run-queue delay)) in
    /// each trial: what a comparison's verdict would have seen, machine interference
    /// included.
    pub gaps: Vec<f64>,
    /// Median of `gaps`.
    pub median_gap: Option<f64>,
    /// Largest of `gaps`.
    pub maximum_gap: Option<f64>,
    /// Median over trials of the region-to-region jitter (advisory).
    pub median_jitter: Option<f64>,
    /// Mean run-queue delay and steal shares over all trials.
    pub interference: Interference,
    /// Notes of the first trial (source choice, unreadable files).
    pub notes: Vec<String>,
}

impl NoiseFloor {
    /// One line: `reference noise floor (A/A of the reference against itself, N trials
    /// of R ABBA rounds of M ms): median gap x %, max y %, ...`.
    pub fn summary(&self, rounds: usize, region: Duration) -> String {
        let percent = |value: Option<f64>| {
            value.map_or_else(|| "n/a".to_string(), |v| format!("{:.3}%", v * 100.0))
        };
        format!(
            "reference noise floor ({} source, A/A of the reference against itself, {} \
             trials of {rounds} ABBA rounds of {:.1} ms): reference alone median gap {}, \
             max {} (target <= 0.5%); with run-queue delay median gap {}, max gap {} \
             (limit 2%); jitter {} (advisory); run-queue delay {}, steal {}",
            self.source.label(),
            self.gaps.len(),
            region.as_secs_f64() * 1e3,
            percent(self.median_reference_gap),
            percent(self.maximum_reference_gap),
            percent(self.median_gap),
            percent(self.maximum_gap),
            percent(self.median_jitter),
            percent(self.interference.run_queue_delay),
            percent(self.interference.steal),
        )
    }
}

/// Most trials [`reference_noise_floor`] runs.
pub const MAX_NOISE_TRIALS: usize = 1000;

/// Measures the clock reference's own between-arm noise: `trials` A/A runs of `rounds`
/// ABBA rounds, each region a busy wait of `region` (the same for both "arms"), with the
/// clock recorded at every boundary exactly as a paired comparison records it. The gaps
/// it reports are the gaps a comparison would see with no difference between the arms;
/// they must sit well below the 2 % limit for the verdict to mean something.
///
/// # Errors
/// [`HostCostError::InvalidOptions`] for unusable `options`, `trials` outside
/// 1..=[`MAX_NOISE_TRIALS`], `rounds` outside 1..=[`estimate::MAX_ROUNDS`], `region`
/// longer than 1 s, or a total run longer than 10 minutes.
pub fn reference_noise_floor(
    options: &ClockOptions,
    trials: usize,
    rounds: usize,
    region: Duration,
) -> Result<NoiseFloor, HostCostError> {
    options.validate()?;
    if trials == 0 || trials > MAX_NOISE_TRIALS {
        return Err(HostCostError::invalid_option(
            "reference_noise_floor trials",
            trials,
            format!("between 1 and {MAX_NOISE_TRIALS}"),
        ));
    }
    if rounds == 0 || rounds > estimate::MAX_ROUNDS {
        return Err(HostCostError::invalid_option(
            "reference_noise_floor rounds",
            rounds,
            format!("between 1 and {}", estimate::MAX_ROUNDS),
        ));
    }
    if region > Duration::from_secs(1) {
        return Err(HostCostError::invalid_option(
            "reference_noise_floor region",
            region,
            "to at most 1 s",
        ));
    }
    let total = region.as_secs_f64() * (trials * rounds * 4) as f64;
    if total > 600.0 {
        return Err(HostCostError::invalid_option(
            "reference_noise_floor trials × rounds × 4 × region",
            Duration::from_secs_f64(total),
            "to at most 10 minutes in all",
        ));
    }
    let schedule = estimate::schedule(estimate::PairOrder::Abba, rounds);
    let mut gaps = Vec::with_capacity(trials);
    let mut reference_gaps = Vec::with_capacity(trials);
    let mut jitters = Vec::with_capacity(trials);
    let mut delays = Vec::new();
    let mut steals = Vec::new();
    let mut notes = Vec::new();
    let mut source = ClockSource::Unavailable;
    for trial in 0..trials {
        let mut monitor = ClockMonitor::start(options)?;
        monitor.mark_boundary();
        for _ in &schedule {
            let started = Instant::now();
            let mut digest = 0_u64;
            while started.elapsed() < region {
                digest = digest.wrapping_add(spin(64));
            }
            std::hint::black_box(digest);
            monitor.mark_boundary();
        }
        let record = monitor.finish().with_arms(&schedule);
        source = record.source;
        if trial == 0 {
            notes = record.notes.clone();
        }
        gaps.extend(record.arm_gap.map(|gap| gap.gap));
        reference_gaps
            .extend(estimate::between_arm_gap(&record.rate_per_region, &schedule).map(|g| g.gap));
        jitters.extend(record.jitter);
        delays.extend(record.interference.run_queue_delay);
        steals.extend(record.interference.steal);
    }
    Ok(NoiseFloor {
        source,
        median_reference_gap: estimate::median(&reference_gaps),
        maximum_reference_gap: estimate::maximum(&reference_gaps),
        reference_gaps,
        median_gap: estimate::median(&gaps),
        maximum_gap: estimate::maximum(&gaps),
        median_jitter: estimate::median(&jitters),
        interference: Interference {
            run_queue_delay: estimate::mean(&delays),
            steal: estimate::mean(&steals),
        },
        gaps,
        notes,
    })
}
