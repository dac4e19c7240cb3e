//! Dispatch phase probe: where each dispatch's host time goes.
//!
//! # Why this module exists
//!
//! A resident dispatch on the H200 machine costs a few microseconds of driver
//! work (3.7 µs to issue a launch, 1.8 µs to synchronize an idle stream), while a
//! well-known backend spends 44–110 µs of host time per dispatch and nobody can say
//! where. This probe splits the host time of every dispatch into nine disjoint
//! phases that add up, so a regression shows up as a number in a named phase
//! instead of a vague "dispatch got slower".
//!
//! # Switching it on
//!
//! With the environment variable [`ENV_VAR`] (`VYRE_CUDA_DISPATCH_PHASE_PROBE`)
//! set to anything but `0`, `false`, `off`, `no` or the empty string (read once
//! per process, by the first dispatch; [`enabled`] says what it read), each
//! dispatch writes exactly one line **after** its timing has been captured, to
//! stderr or to the [`Sink`] chosen with [`set_sink`], in this key order
//! ([`LINE_KEYS`]):
//!
//! ```text
//! vyre-cuda-dispatch-phase seq= nodes= ptx_bytes= buffers= bindings= fixpoint=
//! grid_blocks= wall_ns= enqueue_ns= wait_ns= device_window_ns= kernel_ns=
//! prepare_ns= ptx_ns= modkey_ns= stage_ns= resolve_ns= lease_ns= launch_ns=
//! release_ns= readback_ns= sub_ptx_digest_ns= sub_ptx_vsa_ns= named_host_ns=
//! unattributed_ns= ptx_cache_hits= ptx_cache_misses= program=
//! ```
//!
//! (one line; space separated `key=value`, every value a decimal integer except
//! `program`, 16 lower-case hex digits). [`parse_line`] reads a line back into a
//! [`DispatchRecord`]; the [`report`] submodule (and the `vyre-cuda-phase-report`
//! binary built on it) turns a log of lines into per-phase tables.
//!
//! # What a line means
//!
//! * **Disjoint leaves.** The nine [`Phase`]s never nest inside each other;
//!   `named_host_ns` is their plain saturating sum and `unattributed_ns` is
//!   `wall_ns - named_host_ns`, saturating at 0 (never hidden: a dispatch whose
//!   phases do not cover its wall shows it here). Sub-phases ([`SubPhase`]) are
//!   measured inside `ptx` and never added to the sum.
//! * **Counts** ([`Count`]: IR nodes, PTX bytes, buffers, bindings, fixpoint
//!   iterations, grid blocks) are gathered only while the probe is on.
//! * **PTX cache counters** are per dispatch: the PTX source cache lookups that hit
//!   / missed inside this dispatch (usually `1 0` or `0 1`; `0 0` when the caller
//!   passed a precompiled kernel and no lookup happened).
//! * **Nesting and threads.** A dispatch nested inside another one (a graph
//!   record, a helper dispatch) gets its own line; the outer dispatch only sees the
//!   nested one's time inside whatever outer phase encloses it. Threads never
//!   share a dispatch's accounts.
//! * **`seq`** is a process-wide sequence number taken when the line is written,
//!   so lines of one thread appear in increasing `seq` order.
//! * **Wall.** `wall_ns` is the dispatch's own wall time ([`DispatchTiming`]); an
//!   untimed dispatch path reports the probe's begin-to-finish time instead.
//!
//! # Cost and safety
//!
//! Off, every probe point inside a dispatch costs one relaxed load of a cached
//! byte and reads no clock (`cargo bench --bench probe_overhead` measures it). On,
//! the probe can never turn a dispatch into an error or a panic: arithmetic
//! saturates, write errors are ignored, thread-local access during thread teardown
//! is skipped. **One write per line**: a line is formatted into a stack buffer and
//! written with a single `write_all` on locked stderr (or the sink), so lines from
//! different threads never interleave (and one line is far below `PIPE_BUF`).
//!
//! ```no_run
//! use std::sync::mpsc;
//! use vyre_cuda::probe::{self, Phase, Sink};
//!
//! // Run with VYRE_CUDA_DISPATCH_PHASE_PROBE=1; keep stderr for the program's users.
//! let (sender, lines) = mpsc::channel();
//! let sender = std::sync::Mutex::new(sender);
//! probe::set_sink(Sink::Callback(Box::new(move |record, _line| {
//!     let _ = sender.lock().map(|sender| sender.send(*record));
//! })));
//! // ... dispatches ...
//! for record in lines.try_iter() {
//!     println!("launch {} ns of {} ns", record.phase_ns(Phase::Launch), record.wall_ns);
//! }
//! ```
//!
//! The probe points the dispatch paths call are crate-private; the crate's own
//! tests and benches reach them, and force the switch, through the `testing`
//! feature.

mod point;
pub mod report;

use std::cell::Cell;
use std::fmt;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

// The probe points: crate-private, public to the crate's own tests and benches (which
// drive synthetic dispatches through them) with the `testing` feature.
#[cfg(feature = "testing")]
pub use point::*;
#[cfg(not(feature = "testing"))]
pub(crate) use point::*;

/// The environment variable that switches the probe on (read once per process).
pub const ENV_VAR: &str = "VYRE_CUDA_DISPATCH_PHASE_PROBE";

/// The first word of every probe line, followed by one space.
pub const LINE_PREFIX: &str = "vyre-cuda-dispatch-phase";

/// The keys of a probe line, in the exact order they are printed.
pub const LINE_KEYS: [&str; 28] = [
    "seq",
    "nodes",
    "ptx_bytes",
    "buffers",
    "bindings",
    "fixpoint",
    "grid_blocks",
    "wall_ns",
    "enqueue_ns",
    "wait_ns",
    "device_window_ns",
    "kernel_ns",
    "prepare_ns",
    "ptx_ns",
    "modkey_ns",
    "stage_ns",
    "resolve_ns",
    "lease_ns",
    "launch_ns",
    "release_ns",
    "readback_ns",
    "sub_ptx_digest_ns",
    "sub_ptx_vsa_ns",
    "named_host_ns",
    "unattributed_ns",
    "ptx_cache_hits",
    "ptx_cache_misses",
    "program",
];

/// Number of keys on a line.
const PRINTED_KEYS: usize = LINE_KEYS.len();

/// Keys of a line written before `program` was appended: such a line still
/// parses, with [`DispatchRecord::program`] 0 (not recorded).
const LEGACY_KEYS: usize = PRINTED_KEYS - 1;

/// Index of `program` in [`LINE_KEYS`]: the one field written as 16 lower-case hex
/// digits (an identity, not a quantity).
const PROGRAM_INDEX: usize = PRINTED_KEYS - 1;

/// Number of host phases ([`Phase::ALL`]).
pub const PHASE_COUNT: usize = 9;
/// Number of sub-phases ([`SubPhase::ALL`]).
const SUB_PHASE_COUNT: usize = 2;
/// Number of counts ([`Count::ALL`]).
const COUNT_COUNT: usize = 6;

/// The nine disjoint host phases of a dispatch. Their times add up to
/// `named_host_ns`; they must never be nested inside each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// Binding and launch plans, validation, cooperative-launch resolution.
    Prepare,
    /// Lowering, program key, PTX cache lookup or emission.
    Ptx,
    /// Module key derived from the PTX key.
    Modkey,
    /// Binding resolution, borrowed uploads, output clears.
    Stage,
    /// Module and function lookup, kernel argument array.
    Resolve,
    /// Grid-sync detection and barrier-counter acquisition.
    Lease,
    /// The launch loop, per-iteration barrier-counter reset included.
    Launch,
    /// Synchronize, barrier audit, release of leased resources.
    Release,
    /// Copying outputs back to the host.
    Readback,
}

impl Phase {
    /// Every phase, in line order; `Phase::ALL[p.index()] == p`.
    pub const ALL: [Phase; PHASE_COUNT] = [
        Phase::Prepare,
        Phase::Ptx,
        Phase::Modkey,
        Phase::Stage,
        Phase::Resolve,
        Phase::Lease,
        Phase::Launch,
        Phase::Release,
        Phase::Readback,
    ];

    /// Position of this phase in [`Phase::ALL`] and in [`DispatchRecord::phases`].
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Short name, e.g. `"prepare"`.
    pub const fn label(self) -> &'static str {
        match self {
            Phase::Prepare => "prepare",
            Phase::Ptx => "ptx",
            Phase::Modkey => "modkey",
            Phase::Stage => "stage",
            Phase::Resolve => "resolve",
            Phase::Lease => "lease",
            Phase::Launch => "launch",
            Phase::Release => "release",
            Phase::Readback => "readback",
        }
    }

    /// Key on the probe line, e.g. `"prepare_ns"`.
    pub const fn key(self) -> &'static str {
        match self {
            Phase::Prepare => "prepare_ns",
            Phase::Ptx => "ptx_ns",
            Phase::Modkey => "modkey_ns",
            Phase::Stage => "stage_ns",
            Phase::Resolve => "resolve_ns",
            Phase::Lease => "lease_ns",
            Phase::Launch => "launch_ns",
            Phase::Release => "release_ns",
            Phase::Readback => "readback_ns",
        }
    }
}

/// Whole-program walks timed inside [`Phase::Ptx`]; never added to the sum.
/// On a PTX cache hit both should read 0 (a cache hit walks no program).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SubPhase {
    /// The program digest walk.
    PtxDigest,
    /// Any second structural walk (validation, structural analysis).
    PtxVsa,
}

impl SubPhase {
    /// Every sub-phase, in line order.
    pub const ALL: [SubPhase; SUB_PHASE_COUNT] = [SubPhase::PtxDigest, SubPhase::PtxVsa];

    /// Position in [`SubPhase::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Short name, e.g. `"ptx_digest"`.
    pub const fn label(self) -> &'static str {
        match self {
            SubPhase::PtxDigest => "ptx_digest",
            SubPhase::PtxVsa => "ptx_vsa",
        }
    }

    /// Key on the probe line, e.g. `"sub_ptx_digest_ns"`.
    pub const fn key(self) -> &'static str {
        match self {
            SubPhase::PtxDigest => "sub_ptx_digest_ns",
            SubPhase::PtxVsa => "sub_ptx_vsa_ns",
        }
    }
}

/// Sizes of a dispatch, gathered only while the probe is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Count {
    /// IR nodes of the program.
    Nodes,
    /// Bytes of the PTX source.
    PtxBytes,
    /// Buffers declared by the program.
    Buffers,
    /// Bindings supplied by the caller.
    Bindings,
    /// Fixpoint iterations (kernel replays inside one dispatch).
    Fixpoint,
    /// Blocks in the launch grid.
    GridBlocks,
}

impl Count {
    /// Every count, in line order.
    pub const ALL: [Count; COUNT_COUNT] = [
        Count::Nodes,
        Count::PtxBytes,
        Count::Buffers,
        Count::Bindings,
        Count::Fixpoint,
        Count::GridBlocks,
    ];

    /// Position in [`Count::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Key on the probe line, e.g. `"ptx_bytes"`.
    pub const fn key(self) -> &'static str {
        match self {
            Count::Nodes => "nodes",
            Count::PtxBytes => "ptx_bytes",
            Count::Buffers => "buffers",
            Count::Bindings => "bindings",
            Count::Fixpoint => "fixpoint",
            Count::GridBlocks => "grid_blocks",
        }
    }
}

/// Timings the backend measured for one dispatch, the ones a probe line carries
/// beside its phases. `wall_ns == 0` means "not measured": the probe then uses its
/// own begin-to-finish time as the wall.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DispatchTiming {
    /// The whole dispatch call.
    pub wall_ns: u64,
    /// Host time until the last asynchronous operation was enqueued.
    pub enqueue_ns: u64,
    /// Time blocked in the synchronize.
    pub wait_ns: u64,
    /// Outer device event pair.
    pub device_window_ns: u64,
    /// Inner device event pair around the launch loop.
    pub kernel_ns: u64,
}

/// One probe line, as numbers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DispatchRecord {
    /// Process-wide sequence number.
    pub seq: u64,
    /// IR nodes of the program.
    pub nodes: u64,
    /// Bytes of the PTX source.
    pub ptx_bytes: u64,
    /// Buffers declared by the program.
    pub buffers: u64,
    /// Bindings supplied by the caller.
    pub bindings: u64,
    /// Fixpoint iterations.
    pub fixpoint: u64,
    /// Blocks in the launch grid.
    pub grid_blocks: u64,
    /// Whole dispatch call.
    pub wall_ns: u64,
    /// Host time until the last asynchronous operation was enqueued.
    pub enqueue_ns: u64,
    /// Time blocked in the synchronize.
    pub wait_ns: u64,
    /// Outer device event pair.
    pub device_window_ns: u64,
    /// Inner device event pair around the launch loop.
    pub kernel_ns: u64,
    /// Host phase times, indexed by [`Phase::index`].
    pub phases: [u64; PHASE_COUNT],
    /// Digest walk inside `ptx` (not part of the sum).
    pub sub_ptx_digest_ns: u64,
    /// Second structural walk inside `ptx` (not part of the sum).
    pub sub_ptx_vsa_ns: u64,
    /// PTX source cache hits inside this dispatch.
    pub ptx_cache_hits: u64,
    /// PTX source cache misses inside this dispatch.
    pub ptx_cache_misses: u64,
    /// Identity of the dispatched program: the low 64 bits of its module key (program
    /// digest, codegen policy and device caps), printed as 16 hex digits, so two
    /// kernels of the same shape are told apart. 0 when the dispatch path recorded none
    /// or the line predates the field.
    pub program: u64,
}

impl DispatchRecord {
    /// Plain saturating sum of the nine host phases.
    pub fn named_host_ns(&self) -> u64 {
        self.phases
            .iter()
            .fold(0u64, |sum, &ns| sum.saturating_add(ns))
    }

    /// `wall_ns - named_host_ns`, saturating at 0 (the phases over-covering the
    /// wall reads 0, and shows as `named_host_ns > wall_ns`).
    pub fn unattributed_ns(&self) -> u64 {
        self.wall_ns.saturating_sub(self.named_host_ns())
    }

    /// Time of one phase.
    pub fn phase_ns(&self, phase: Phase) -> u64 {
        self.phases[phase.index()]
    }

    /// Time of one sub-phase.
    pub fn sub_phase_ns(&self, sub_phase: SubPhase) -> u64 {
        match sub_phase {
            SubPhase::PtxDigest => self.sub_ptx_digest_ns,
            SubPhase::PtxVsa => self.sub_ptx_vsa_ns,
        }
    }

    /// Value of one count.
    pub fn count(&self, count: Count) -> u64 {
        match count {
            Count::Nodes => self.nodes,
            Count::PtxBytes => self.ptx_bytes,
            Count::Buffers => self.buffers,
            Count::Bindings => self.bindings,
            Count::Fixpoint => self.fixpoint,
            Count::GridBlocks => self.grid_blocks,
        }
    }

    /// The 28 printed values in [`LINE_KEYS`] order.
    fn values(&self) -> [u64; PRINTED_KEYS] {
        let p = &self.phases;
        [
            self.seq,
            self.nodes,
            self.ptx_bytes,
            self.buffers,
            self.bindings,
            self.fixpoint,
            self.grid_blocks,
            self.wall_ns,
            self.enqueue_ns,
            self.wait_ns,
            self.device_window_ns,
            self.kernel_ns,
            p[0],
            p[1],
            p[2],
            p[3],
            p[4],
            p[5],
            p[6],
            p[7],
            p[8],
            self.sub_ptx_digest_ns,
            self.sub_ptx_vsa_ns,
            self.named_host_ns(),
            self.unattributed_ns(),
            self.ptx_cache_hits,
            self.ptx_cache_misses,
            self.program,
        ]
    }

    fn from_values(v: &[u64; PRINTED_KEYS]) -> DispatchRecord {
        DispatchRecord {
            seq: v[0],
            nodes: v[1],
            ptx_bytes: v[2],
            buffers: v[3],
            bindings: v[4],
            fixpoint: v[5],
            grid_blocks: v[6],
            wall_ns: v[7],
            enqueue_ns: v[8],
            wait_ns: v[9],
            device_window_ns: v[10],
            kernel_ns: v[11],
            phases: [
                v[12], v[13], v[14], v[15], v[16], v[17], v[18], v[19], v[20],
            ],
            sub_ptx_digest_ns: v[21],
            sub_ptx_vsa_ns: v[22],
            ptx_cache_hits: v[25],
            ptx_cache_misses: v[26],
            program: v[PROGRAM_INDEX],
        }
    }
}

/// Writes `record` as a probe line (no trailing newline) into `out`.
fn write_record(record: &DispatchRecord, out: &mut impl fmt::Write) -> fmt::Result {
    let mut buffer = LineBuffer {
        bytes: [0; LINE_CAPACITY],
        len: 0,
    };
    encode_record(record, &mut buffer).ok_or(fmt::Error)?;
    // Only ASCII was written, so this conversion cannot fail.
    out.write_str(std::str::from_utf8(buffer.as_bytes()).map_err(|_| fmt::Error)?)
}

/// Encodes `record` as a probe line (no trailing newline) straight into bytes.
///
/// Hand-rolled rather than `write!`: through `core::fmt` a line cost about 770 ns
/// (27 integer fields), half of what the probe adds to a dispatch, and the target for
/// probe-on over probe-off is 1.05. `None` only if the line would not fit.
fn encode_record(record: &DispatchRecord, out: &mut LineBuffer) -> Option<()> {
    out.push(LINE_PREFIX.as_bytes())?;
    for (index, (key, value)) in LINE_KEYS.iter().zip(record.values()).enumerate() {
        out.push_byte(b' ')?;
        out.push(key.as_bytes())?;
        out.push_byte(b'=')?;
        if index == PROGRAM_INDEX {
            out.push_hex(value)?;
        } else {
            out.push_decimal(value)?;
        }
    }
    Some(())
}

/// Formats `record` as one probe line, without a trailing newline.
/// `named_host_ns` and `unattributed_ns` are computed from the record.
pub fn format_line(record: &DispatchRecord) -> String {
    let mut line = String::with_capacity(LINE_CAPACITY);
    // Writing into a String cannot fail.
    let _ = write_record(record, &mut line);
    line
}

/// Parses one probe line strictly: it must start with [`LINE_PREFIX`] and one
/// space, then hold exactly the [`LINE_KEYS`] in order, each once (separated by
/// ASCII whitespace; trailing whitespace such as `\r` is ignored), every value a
/// plain decimal `u64` (digits only, no sign, at most `u64::MAX`) except
/// `program` (exactly 16 lower-case hex digits), and `named_host_ns` /
/// `unattributed_ns` must equal the values recomputed from the phases and wall
/// (a line that does not add up is corrupt). A line that ends after
/// `ptx_cache_misses` (written before `program` was appended) is accepted with
/// `program` 0. Anything else is `None`; [`parse_line_checked`] says why.
pub fn parse_line(line: &str) -> Option<DispatchRecord> {
    parse_line_checked(line).ok()
}

/// Why a probe line was refused by [`parse_line_checked`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineError {
    /// The line does not start with [`LINE_PREFIX`] and a space.
    NoPrefix,
    /// The line ended before this key (a truncated line).
    MissingField {
        /// The key that was due.
        expected: &'static str,
    },
    /// A key that already appeared earlier in the line appeared again.
    DuplicateKey {
        /// The repeated key.
        key: &'static str,
    },
    /// Another key (or no `key=`) where this key was due: keys out of order or unknown.
    UnexpectedKey {
        /// The key that was due.
        expected: &'static str,
    },
    /// The value is empty or not plain digits (signs, dots, letters).
    BadValue {
        /// The key.
        key: &'static str,
    },
    /// The value is all digits but above `u64::MAX`.
    Overflow {
        /// The key.
        key: &'static str,
    },
    /// `named_host_ns` is not the sum of the nine phases, or `unattributed_ns` is not
    /// `wall_ns − named_host_ns`.
    TotalsDisagree {
        /// The total that disagrees.
        key: &'static str,
    },
    /// Something follows the last key.
    ExtraField,
    /// The line is longer than the reader's cap (counted by the report, never parsed).
    TooLong,
}

impl LineError {
    /// A short stable label, used to count refusals by kind.
    pub fn label(self) -> &'static str {
        match self {
            LineError::NoPrefix => "no prefix",
            LineError::MissingField { .. } => "truncated",
            LineError::DuplicateKey { .. } => "duplicate key",
            LineError::UnexpectedKey { .. } => "key out of order or unknown",
            LineError::BadValue { .. } => "not a decimal value",
            LineError::Overflow { .. } => "value overflows u64",
            LineError::TotalsDisagree { .. } => "totals do not add up",
            LineError::ExtraField => "extra field",
            LineError::TooLong => "line over the length cap",
        }
    }
}

impl fmt::Display for LineError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LineError::MissingField { expected } => {
                write!(formatter, "truncated before `{expected}=`")
            }
            LineError::DuplicateKey { key } => write!(formatter, "duplicate key `{key}`"),
            LineError::UnexpectedKey { expected } => {
                write!(formatter, "expected `{expected}=` here")
            }
            LineError::BadValue { key } => write!(formatter, "`{key}` is not a decimal integer"),
            LineError::Overflow { key } => write!(formatter, "`{key}` overflows u64"),
            LineError::TotalsDisagree { key } => write!(formatter, "`{key}` does not add up"),
            other => formatter.write_str(other.label()),
        }
    }
}

/// [`parse_line`] with the reason for a refusal.
///
/// # Errors
/// The first rule the line breaks, as a [`LineError`].
pub fn parse_line_checked(line: &str) -> Result<DispatchRecord, LineError> {
    let rest = line.strip_prefix(LINE_PREFIX).ok_or(LineError::NoPrefix)?;
    if !rest.starts_with(' ') {
        return Err(LineError::NoPrefix);
    }
    let mut values = [0u64; PRINTED_KEYS];
    let mut fields = rest.split_ascii_whitespace();
    for (index, (slot, key)) in values.iter_mut().zip(&LINE_KEYS).enumerate() {
        let Some(field) = fields.next() else {
            if index == LEGACY_KEYS {
                break; // a line from before `program` was appended
            }
            return Err(LineError::MissingField { expected: key });
        };
        let Some(value) = field.strip_prefix(key).and_then(|v| v.strip_prefix('=')) else {
            let found = field.split('=').next().unwrap_or("");
            if let Some(&earlier) = LINE_KEYS[..index].iter().find(|k| **k == found) {
                return Err(LineError::DuplicateKey { key: earlier });
            }
            return Err(LineError::UnexpectedKey { expected: key });
        };
        *slot = if index == PROGRAM_INDEX {
            parse_hex(value).ok_or(LineError::BadValue { key })?
        } else {
            parse_decimal(value).map_err(|overflow| {
                if overflow {
                    LineError::Overflow { key }
                } else {
                    LineError::BadValue { key }
                }
            })?
        };
    }
    if fields.next().is_some() {
        return Err(LineError::ExtraField);
    }
    let record = DispatchRecord::from_values(&values);
    let all = record.values();
    if all[23] != values[23] {
        return Err(LineError::TotalsDisagree { key: LINE_KEYS[23] });
    }
    if all[24] != values[24] {
        return Err(LineError::TotalsDisagree { key: LINE_KEYS[24] });
    }
    Ok(record)
}

/// Exactly 16 lower-case hex digits.
fn parse_hex(text: &str) -> Option<u64> {
    if text.len() != 16 || !text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    u64::from_str_radix(text, 16).ok()
}

/// Plain decimal digits; `Err(true)` when they overflow `u64`, `Err(false)` for
/// anything else.
fn parse_decimal(text: &str) -> Result<u64, bool> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(false);
    }
    text.parse().map_err(|_| true)
}

// ---------------------------------------------------------------------------
// The switch.

const STATE_UNREAD: u8 = 0;
const STATE_OFF: u8 = 1;
const STATE_ON: u8 = 2;

/// The cached switch: one relaxed load on every probe point.
static STATE: AtomicU8 = AtomicU8::new(STATE_UNREAD);
/// What the environment said, read once.
static ENV_SAYS_ON: OnceLock<bool> = OnceLock::new();

/// Whether the probe is on. After the first call this is one relaxed load of a
/// cached byte; the first call reads [`ENV_VAR`] once.
#[inline]
pub fn enabled() -> bool {
    match STATE.load(Ordering::Relaxed) {
        STATE_ON => true,
        STATE_OFF => false,
        _ => enabled_first_time(),
    }
}

#[cold]
#[inline(never)]
fn enabled_first_time() -> bool {
    let state = if env_says_on() { STATE_ON } else { STATE_OFF };
    // An override that raced ahead of us wins.
    let _ = STATE.compare_exchange(STATE_UNREAD, state, Ordering::Relaxed, Ordering::Relaxed);
    STATE.load(Ordering::Relaxed) == STATE_ON
}

fn env_says_on() -> bool {
    *ENV_SAYS_ON.get_or_init(|| match std::env::var_os(ENV_VAR) {
        None => false,
        Some(value) => {
            let value = value.to_string_lossy();
            let value = value.trim();
            !(value.is_empty()
                || value == "0"
                || value.eq_ignore_ascii_case("false")
                || value.eq_ignore_ascii_case("off")
                || value.eq_ignore_ascii_case("no"))
        }
    })
}

#[cfg(feature = "testing")]
pub use forced::{override_enabled, EnabledOverride};

/// Forcing the switch from inside a process: test support (the `testing` feature), for
/// the crate's tests and benches that exercise both sides of the switch in one process.
/// A program's switch is [`ENV_VAR`].
#[cfg(feature = "testing")]
mod forced {
    use std::cell::Cell;
    use std::marker::PhantomData;
    use std::sync::atomic::Ordering;
    use std::sync::{Mutex, MutexGuard};

    use super::{env_says_on, STATE, STATE_OFF, STATE_ON};

    /// Serializes overrides across threads (the switch is process-wide).
    static OVERRIDE_LOCK: Mutex<()> = Mutex::new(());

    thread_local! {
        /// How many [`EnabledOverride`]s this thread holds (nesting skips the lock).
        static OVERRIDE_DEPTH: Cell<u32> = const { Cell::new(0) };
    }

    /// Forces the process-wide switch while alive; see [`override_enabled`].
    #[must_use = "the override ends when this guard is dropped"]
    pub struct EnabledOverride {
        previous: u8,
        lock: Option<MutexGuard<'static, ()>>,
        _thread_bound: PhantomData<*const ()>,
    }

    /// Forces the probe on (`Some(true)`), off (`Some(false)`) or back to what
    /// [`ENV_VAR`](super::ENV_VAR) says (`None`) for the whole process until the returned guard is
    /// dropped, which restores the previous state. For tests and benches that must
    /// exercise both sides of the switch in one process.
    ///
    /// Overrides from different threads are serialized by a process-wide lock (a
    /// second thread waits until the first guard is dropped), so two tests never
    /// see each other's setting; nesting on one thread is allowed and does not wait.
    /// Threads that never take an override still see the forced state.
    pub fn override_enabled(on: Option<bool>) -> EnabledOverride {
        let depth = OVERRIDE_DEPTH.with(Cell::get);
        let lock = if depth == 0 {
            Some(
                OVERRIDE_LOCK
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()),
            )
        } else {
            None
        };
        OVERRIDE_DEPTH.with(|d| d.set(depth.saturating_add(1)));
        let on = on.unwrap_or_else(env_says_on);
        let previous = STATE.swap(if on { STATE_ON } else { STATE_OFF }, Ordering::Relaxed);
        EnabledOverride {
            previous,
            lock,
            _thread_bound: PhantomData,
        }
    }

    impl Drop for EnabledOverride {
        fn drop(&mut self) {
            STATE.store(self.previous, Ordering::Relaxed);
            let _ = OVERRIDE_DEPTH.try_with(|d| d.set(d.get().saturating_sub(1)));
            drop(self.lock.take());
        }
    }
}

/// Longest possible line: prefix + 28 × (space + key + '=' + 20 digits).
const LINE_CAPACITY: usize = 1024;

/// A stack buffer a line is formatted into before its single write.
struct LineBuffer {
    bytes: [u8; LINE_CAPACITY],
    len: usize,
}

impl LineBuffer {
    /// Appends a short byte string. A plain loop: the pieces are 1–20 bytes, where
    /// a `memcpy` call per piece cost more than the copy (measured: 578 ns a line).
    fn push(&mut self, bytes: &[u8]) -> Option<()> {
        let end = self.len.checked_add(bytes.len())?;
        let slot = self.bytes.get_mut(self.len..end)?;
        for (dst, src) in slot.iter_mut().zip(bytes) {
            *dst = *src;
        }
        self.len = end;
        Some(())
    }

    fn push_byte(&mut self, byte: u8) -> Option<()> {
        *self.bytes.get_mut(self.len)? = byte;
        self.len += 1;
        Some(())
    }

    /// Appends `value` in decimal, written in place from the last digit back.
    fn push_decimal(&mut self, value: u64) -> Option<()> {
        let mut digits = 1;
        let mut rest = value / 10;
        while rest > 0 {
            digits += 1;
            rest /= 10;
        }
        let end = self.len.checked_add(digits)?;
        let slot = self.bytes.get_mut(self.len..end)?;
        let mut rest = value;
        for dst in slot.iter_mut().rev() {
            *dst = b'0' + (rest % 10) as u8;
            rest /= 10;
        }
        self.len = end;
        Some(())
    }

    /// Appends `value` as exactly 16 lower-case hex digits.
    fn push_hex(&mut self, value: u64) -> Option<()> {
        let end = self.len.checked_add(16)?;
        let slot = self.bytes.get_mut(self.len..end)?;
        for (position, dst) in slot.iter_mut().enumerate() {
            let nibble = (value >> (60 - 4 * position)) & 0xF;
            *dst = b"0123456789abcdef"[nibble as usize];
        }
        self.len = end;
        Some(())
    }

    fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

// ---------------------------------------------------------------------------
// Where lines go.

/// Where probe lines go. Default [`Sink::Stderr`]; a program that keeps stderr for its users picks another
/// with [`set_sink`].
pub enum Sink {
    /// One `write_all` per line on locked stderr (the default).
    Stderr,
    /// One `write_all` per line (newline included) on this writer, e.g. an opened log
    /// file ([`Sink::file`]). Write errors are ignored, as on stderr.
    Writer(Box<dyn std::io::Write + Send>),
    /// Called with the record and its line (no newline) after the dispatch's timing
    /// is captured. A panic inside it is caught and the line goes to stderr instead:
    /// the probe never turns a dispatch into a panic.
    Callback(LineCallback),
    /// A `tracing` event at `INFO` on target `vyre_cuda::probe`, with the line as
    /// its message.
    Tracing,
}

impl Sink {
    /// A [`Sink::Writer`] appending to the file at `path` (created if absent).
    ///
    /// # Errors
    /// The operating system's error when the file cannot be opened for appending.
    pub fn file(path: &std::path::Path) -> std::io::Result<Sink> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(Sink::Writer(Box::new(file)))
    }
}

impl fmt::Debug for Sink {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(match self {
            Sink::Stderr => "Sink::Stderr",
            Sink::Writer(_) => "Sink::Writer",
            Sink::Callback(_) => "Sink::Callback",
            Sink::Tracing => "Sink::Tracing",
        })
    }
}

/// The chosen sink; `None` is stderr. Behind an `Arc` so a line is written after the
/// lock is released (a callback that dispatches cannot deadlock the probe).
static SINK: Mutex<Option<Arc<SinkTarget>>> = Mutex::new(None);
/// `true` while a non-stderr sink is set: the stderr path never takes the lock.
static SINK_CHOSEN: AtomicBool = AtomicBool::new(false);

/// A [`Sink::Callback`]: receives each record and its line (no newline).
pub type LineCallback = Box<dyn Fn(&DispatchRecord, &str) + Send + Sync>;

enum SinkTarget {
    Writer(Mutex<Box<dyn std::io::Write + Send>>),
    Callback(LineCallback),
    Tracing,
}

thread_local! {
    /// Set while this thread is inside a sink, so a line produced from within the
    /// sink (a callback that dispatches) goes to stderr instead of recursing.
    static IN_SINK: Cell<bool> = const { Cell::new(false) };
}

/// Chooses where probe lines go from now on, for every thread of the process.
/// Lines already being written finish on the old sink.
pub fn set_sink(sink: Sink) {
    let target = match sink {
        Sink::Stderr => None,
        Sink::Writer(writer) => Some(Arc::new(SinkTarget::Writer(Mutex::new(writer)))),
        Sink::Callback(callback) => Some(Arc::new(SinkTarget::Callback(callback))),
        Sink::Tracing => Some(Arc::new(SinkTarget::Tracing)),
    };
    let mut slot = SINK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    SINK_CHOSEN.store(target.is_some(), Ordering::Release);
    *slot = target;
}

fn write_to_sink(record: &DispatchRecord, line: &[u8]) {
    let target = if SINK_CHOSEN.load(Ordering::Acquire) {
        SINK.lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    } else {
        None
    };
    let reentrant = IN_SINK.try_with(Cell::get).unwrap_or(true);
    let delivered = match target {
        Some(target) if !reentrant => {
            let _ = IN_SINK.try_with(|flag| flag.set(true));
            let delivered = deliver(&target, record, line);
            let _ = IN_SINK.try_with(|flag| flag.set(false));
            delivered
        }
        _ => false,
    };
    if !delivered {
        let _ = std::io::stderr().lock().write_all(line);
    }
}

/// Writes one line to a chosen sink; `false` when it must fall back to stderr.
fn deliver(target: &SinkTarget, record: &DispatchRecord, line: &[u8]) -> bool {
    let text = std::str::from_utf8(&line[..line.len().saturating_sub(1)]).unwrap_or("");
    match target {
        SinkTarget::Writer(writer) => {
            let mut writer = writer
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let _ = writer.write_all(line);
            true
        }
        SinkTarget::Callback(callback) => {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| callback(record, text)))
                .is_ok()
        }
        SinkTarget::Tracing => {
            tracing::info!(target: "vyre_cuda::probe", "{text}");
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Locks out a line buffer too small for the longest line: every value at
    /// `u64::MAX` must still format into the stack buffer and round-trip.
    #[test]
    fn longest_line_fits_the_stack_buffer() {
        let record = DispatchRecord {
            seq: u64::MAX,
            nodes: u64::MAX,
            ptx_bytes: u64::MAX,
            buffers: u64::MAX,
            bindings: u64::MAX,
            fixpoint: u64::MAX,
            grid_blocks: u64::MAX,
            wall_ns: u64::MAX,
            enqueue_ns: u64::MAX,
            wait_ns: u64::MAX,
            device_window_ns: u64::MAX,
            kernel_ns: u64::MAX,
            phases: [u64::MAX; PHASE_COUNT],
            sub_ptx_digest_ns: u64::MAX,
            sub_ptx_vsa_ns: u64::MAX,
            ptx_cache_hits: u64::MAX,
            ptx_cache_misses: u64::MAX,
            program: u64::MAX,
        };
        let mut buffer = LineBuffer {
            bytes: [0; LINE_CAPACITY],
            len: 0,
        };
        encode_record(&record, &mut buffer).expect("longest line fits");
        assert_eq!(
            std::str::from_utf8(&buffer.bytes[..buffer.len]).unwrap(),
            format_line(&record)
        );
        assert_eq!(parse_line(&format_line(&record)), Some(record));
        // Negative control: a buffer one byte short must refuse, not panic.
        let mut short = LineBuffer {
            bytes: [0; LINE_CAPACITY],
            len: LINE_CAPACITY - buffer.len + 1,
        };
        assert!(encode_record(&record, &mut short).is_none());
    }

    /// Locks out a parser that accepts signs, empty values or overflow.
    #[test]
    fn decimal_parser_is_strict() {
        assert_eq!(parse_decimal("0"), Ok(0));
        assert_eq!(parse_decimal("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(parse_decimal("18446744073709551616"), Err(true));
        for bad in ["", "+1", "-1", "1.0", "1a", " 1"] {
            assert_eq!(parse_decimal(bad), Err(false), "{bad:?}");
        }
        assert_eq!(parse_hex("00000000000000ff"), Some(255));
        for bad in [
            "ff",
            "00000000000000FF",
            "+000000000000000",
            "00000000000000000",
        ] {
            assert_eq!(parse_hex(bad), None, "{bad:?}");
        }
    }

    /// Locks out key helpers drifting from the line order.
    #[test]
    fn enum_keys_match_line_keys() {
        for phase in Phase::ALL {
            assert_eq!(LINE_KEYS[12 + phase.index()], phase.key());
            assert_eq!(phase.key(), format!("{}_ns", phase.label()));
        }
        for sub in SubPhase::ALL {
            assert_eq!(LINE_KEYS[21 + sub.index()], sub.key());
            assert_eq!(sub.key(), format!("sub_{}_ns", sub.label()));
        }
        for count in Count::ALL {
            assert_eq!(LINE_KEYS[1 + count.index()], count.key());
        }
    }
}
