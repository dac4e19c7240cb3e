//! Readback and device time at the physical limit: small outputs reach the
//! host through host-mapped pinned memory written by the dispatch's own kernel, large
//! ones by DMA, and the kernel stamps its own device time.
//!
//! # Why
//!
//! The physical floor of a dispatch is one launch and one synchronize. Measured on
//! the H200 (2026-12-01, per dispatch, a kernel writing N 16-byte outputs): launch +
//! sync 8.5–8.8 µs; one async copy per output 11.6 µs (N = 1) to 35.0 µs (N = 16);
//! `cuMemcpyBatchAsync` 11.0–15.8; one copy from a contiguous arena 11.4–17.3; a
//! kernel writing host-mapped memory directly 9.7–9.9 µs; a second (gather) launch into
//! mapped memory 12.3–12.6 µs. A timed dispatch spent about 10 µs more on CUDA event
//! records and elapsed-time queries, while `%globaltimer` ticks every 32 ns there.
//!
//! So the backend's kernels carry the *result ABI* ([`crate::codegen::ptx`] module
//! docs): the first thread of each block folds `%globaltimer` into a device control
//! block, and the last thread of the grid to finish writes the start and end stamps
//! and copies up to [`RESULT_RANGE_SLOTS`] readback ranges into this module's
//! `ResultArea`, host-mapped memory, before the kernel ends. One launch, one
//! synchronize, no copy and no event: the extra work is one atomic per converged
//! group of threads and a few hundred bytes of posted PCIe writes. Outputs stay in
//! their device buffers too, so outputs in owned buffers are valid for the next dispatch.
//!
//! # Size policy
//!
//! `route_reads` sends a readback item through the mapped area when it is at most
//! [`mapped_range_limit`] of the kernel's workgroup size long (never more than
//! [`MAPPED_RANGE_MAX_BYTES`]), a descriptor slot is free and the area has room
//! ([`RESULT_AREA_BYTES`] per lane, 16-byte aligned placement); everything else goes
//! by DMA into pinned staging. The limit models the copy: the last finishing group
//! (at most min(threads, 32) lanes) moves every range that lies inside one aligned
//! 16-byte block of its buffer (a *window*, [`WINDOW_BYTES`]) in one L2 round trip,
//! with one vector load and store each, and any other range at 4 words per lane per
//! round trip; about 4 extra round trips cost what one more async copy does. Measured on the H200 (2026-12-01, first
//! sweep, with a one-word-per-round-trip loop and 32 lanes): one DMA copy of 16 B to
//! 16 KiB costs 11.9–12.4 µs per dispatch, the area 11.4 µs at 16 B, 12.7 at 1 KiB,
//! 16.5 at 4 KiB; the kernel writing mapped memory itself 10.0–10.3 µs up to 16 KiB.
//! The dispatch bench's `readback_sweep` re-measures it every run.
//!
//! # Semantics kept
//!
//! - Exactly one synchronize: the mapped bytes are read only after it.
//! - No byte of one dispatch reaches another caller: each lane (one dispatch at a
//!   time) owns its area; the host zeroes the end stamp before the launch and refuses
//!   to read the area when the kernel did not write it back (`ResultArea::stamps`).
//! - A lane's first kernel finds its control block idle: the area's one-time
//!   initialisation has landed on the device before `ResultArea::new` returns
//!   (`driver::copy_to_device_blocking` waits for its DMA, which the lanes'
//!   non-blocking streams would not).
//! - Nothing allocates once warm: a lane allocates its area once.
//! - Without host-mapped memory (a driver or device that cannot map), the area lives
//!   in device memory and one DMA copy brings its used prefix back (the "one copy from
//!   a contiguous arena" mechanism), said once in the log.

use std::cell::Cell;
use std::ffi::c_void;

use smallvec::SmallVec;

pub use crate::codegen::RESULT_RANGE_SLOTS;

use super::driver::{self, DeviceMemory, DriverResult, MappedMemory, Stream};
use super::plan::ReadItem;
use crate::ir::{Program, ScalarDecl};

/// Longest readback item ever sent through the mapped area; longer ones go by DMA.
/// The limit for one kernel is [`mapped_range_limit`] of its workgroup size, at most
/// this. Measured crossover on the H200: see the module docs and README.
pub const MAPPED_RANGE_MAX_BYTES: u64 = 4096;

/// L2 round trips beyond the first that a mapped range may cost before one DMA copy
/// is cheaper (the raw measurements and the sweep: one extra async copy costs about 2 µs, one round
/// trip of the last group's loads about 0.3 µs).
const MAPPED_EXTRA_ROUND_TRIPS: u64 = 4;

/// Longest readback item worth sending through the mapped area for a kernel with
/// `threads_per_workgroup` threads: the last finishing group has at most
/// min(threads, 32) lanes; its leader copies every window in the first round trip,
/// and each further round trip moves 4 words per lane of the other ranges. A one-thread
/// kernel gets 80 bytes, a full warp 2,064, never more than
/// [`MAPPED_RANGE_MAX_BYTES`].
pub fn mapped_range_limit(threads_per_workgroup: u32) -> u64 {
    let lanes = u64::from(threads_per_workgroup.clamp(1, 32));
    (16 + MAPPED_EXTRA_ROUND_TRIPS * lanes * 16).min(MAPPED_RANGE_MAX_BYTES)
}

/// Bytes of one lane's result area: 16 bytes of stamps, then readback bytes.
pub const RESULT_AREA_BYTES: usize = 64 * 1024;

/// The start and end stamps at the head of the area.
pub(in crate::backend) const STAMP_BYTES: usize = 16;

/// Bytes of the device control block (u64 finished threads, u64 earliest start).
const CONTROL_BYTES: usize = 16;

/// Placement alignment of mapped ranges (keeps word copies possible).
const MAPPED_ALIGN: usize = 16;

/// Most bytes of kernel parameters the driver accepts (CUDA's 4 KiB limit).
pub const KERNEL_PARAMETER_LIMIT_BYTES: usize = 4096;

/// Bytes of kernel parameters a result-ABI kernel over `global_buffers` buffers
/// and `scalars` takes: a u64 address and a u32 count each, then the five result
/// parameters (u64, u64, u32, u32, 256 descriptor bytes, 8-byte aligned), then each
/// scalar (4 bytes, or 8 aligned to 8 for `u64` and `i64`).
pub fn result_abi_parameter_bytes(global_buffers: usize, scalars: &[ScalarDecl]) -> usize {
    let counts = (4 * global_buffers).div_ceil(8) * 8;
    let results = 8 * global_buffers + counts + 8 + 8 + 4 + 4 + 16 * RESULT_RANGE_SLOTS;
    scalars.iter().fold(results, |offset, scalar| {
        let size = scalar.ty.bits() as usize / 8;
        offset.next_multiple_of(size) + size
    })
}

/// Whether `program` (called `name` in messages) can host the result ABI (its
/// stamps and mapped readback); an `Err` starting `Fix:` when its parameters would
/// pass the driver's limit.
pub(in crate::backend) fn check_result_abi_fits(
    name: &str,
    program: &Program,
) -> Result<(), String> {
    let global_buffers = program.global_buffers().len();
    let scalars = program.scalars();
    let bytes = result_abi_parameter_bytes(global_buffers, scalars);
    if bytes <= KERNEL_PARAMETER_LIMIT_BYTES {
        return Ok(());
    }
    let most = (0..global_buffers)
        .rev()
        .find(|&n| result_abi_parameter_bytes(n, scalars) <= KERNEL_PARAMETER_LIMIT_BYTES)
        .unwrap_or(0);
    let with_scalars = if scalars.is_empty() {
        String::new()
    } else {
        format!(" and its {} scalars", scalars.len())
    };
    Err(format!(
        "Fix: {name} binds {global_buffers} global buffers, so its kernel parameters (an address and a \
         count per buffer, plus the result area that carries its timing stamps and small outputs{with_scalars}) \
         take {bytes} bytes, more than the driver's {KERNEL_PARAMETER_LIMIT_BYTES}; bind at most {most} \
         global buffers (pack several into one, or split the program)"
    ))
}

/// How one readback item travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::backend) enum Route {
    /// Copied by the kernel's last thread to this offset of the result area.
    Mapped { offset: u32 },
    /// One async DMA copy into pinned staging (the item's `staging_offset`).
    Copy,
}

/// Chooses a route per item (pure): mapped while the item is at most `max_range`
/// bytes, a descriptor slot is free and the area of `area_bytes` has room; copy
/// otherwise. Returns the number of mapped items.
pub(in crate::backend) fn route_reads(
    reads: &[ReadItem],
    area_bytes: usize,
    max_range: u64,
    routes: &mut super::PerBinding<Route>,
) -> usize {
    let mut next = STAMP_BYTES;
    let mut mapped = 0usize;
    for read in reads {
        // Each placement reserves whole 16-byte blocks: a window's vector store
        // writes all 16 bytes of its block.
        let footprint = (read.len as usize).div_ceil(MAPPED_ALIGN) * MAPPED_ALIGN;
        let fits = read.len <= max_range
            && mapped < RESULT_RANGE_SLOTS
            && next
                .checked_add(footprint)
                .is_some_and(|end| end <= area_bytes)
            && u32::try_from(next).is_ok();
        if fits {
            routes.push(Route::Mapped {
                offset: next as u32,
            });
            mapped += 1;
            next += footprint;
        } else {
            routes.push(Route::Copy);
        }
    }
    mapped
}

/// The result-ABI parameter values of one dispatch's launches. The parameter array
/// points into it, so it must not move between [`ResultParams::push_pointers`] and
/// the last launch; the per-launch values live in `Cell`s so they can change between
/// launches while those pointers exist.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(in crate::backend) struct ResultParams {
    /// Whether this description's first launch writes the start stamp and its last
    /// launch the end stamp (an eager dispatch: both; a graph step: only the graph's
    /// first and last step).
    pub(in crate::backend) stamps_start: bool,
    pub(in crate::backend) stamps_end: bool,
    control: u64,
    results: u64,
    flags: Cell<u32>,
    count: Cell<u32>,
    /// Descriptors as the kernel reads them, 8-byte aligned, two words each:
    /// `[0, windows)` are 16-byte windows (u64 source address, 16-byte aligned; u64
    /// destination address in the area, 16-byte aligned), the rest go through the
    /// strided loop (u64 source; u32 length | u32 area offset << 32).
    ranges: [u64; 2 * RESULT_RANGE_SLOTS],
    described: u32,
    windows: u32,
}

/// `vyre_launch_flags` bit: this launch writes the start stamp.
pub const FLAG_START_STAMP: u32 = 1;
/// `vyre_launch_flags` bit: this launch writes the end stamp.
pub const FLAG_END_STAMP: u32 = 2;
/// `vyre_launch_flags` bits 8-15: how many leading descriptors are 16-byte windows
/// (the leader copies each with one vector load and one vector store).
const FLAG_WINDOWS_SHIFT: u32 = 8;

/// Bytes of one window: a range inside one aligned 16-byte block of its buffer is
/// copied whole, block and all.
pub const WINDOW_BYTES: u64 = 16;

/// The aligned 16-byte block holding `len` bytes from `source`, when it lies inside
/// the buffer occupying `memory` (so copying it whole reads no byte outside a bound
/// buffer): the one window rule of the result ABI and of lanes.
pub(in crate::backend) fn window_block(
    source: u64,
    len: u32,
    memory: &std::ops::Range<u64>,
) -> Option<u64> {
    let block = source & !(WINDOW_BYTES - 1);
    let inside = block >= memory.start
        && block
            .checked_add(WINDOW_BYTES)
            .is_some_and(|end| end <= memory.end && source + u64::from(len) <= end);
    inside.then_some(block)
}

impl ResultParams {
    /// Parameters for an area whose control block and mapped bytes are at these
    /// device addresses; no descriptors yet.
    pub(in crate::backend) fn new(control: u64, results: u64) -> Self {
        ResultParams {
            stamps_start: true,
            stamps_end: true,
            control,
            results,
            flags: Cell::new(0),
            count: Cell::new(0),
            ranges: [0; 2 * RESULT_RANGE_SLOTS],
            described: 0,
            windows: 0,
        }
    }

    /// Add one range: `len` bytes from device address `source`, inside the buffer
    /// occupying device addresses `memory`, placed at the 16-byte aligned `offset` of
    /// the area, which reserves at least 16 bytes there (`route_reads`). Returns the
    /// area offset where the range's bytes will be, or `None` (adding nothing) when
    /// every slot is taken.
    ///
    /// A range that lies inside one aligned 16-byte block of its buffer becomes a
    /// window: the kernel copies the block (one vector load, one vector store, no
    /// length or alignment arithmetic on the device) and the bytes sit at `offset`
    /// plus the range's position in the block. On the H200 (2026-12-01) each copy of
    /// the general path cost about 0.13 µs in a one-thread kernel: some 50 dependent
    /// instructions of one warp. Every other range goes through the strided loop.
    pub(in crate::backend) fn describe(
        &mut self,
        source: u64,
        len: u32,
        offset: u32,
        memory: std::ops::Range<u64>,
    ) -> Option<u32> {
        if len == 0 {
            // Nothing to copy: the delivery reads zero bytes.
            return Some(offset);
        }
        let index = self.described as usize;
        if index >= RESULT_RANGE_SLOTS {
            return None;
        }
        let window = window_block(source, len, &memory)
            .filter(|_| offset.is_multiple_of(WINDOW_BYTES as u32));
        let delivered = if let Some(block) = window {
            // Keep the windows in front: the first looped descriptor (if any) moves
            // to the end. The order of descriptors is free (each names its own
            // destination).
            let front = self.windows as usize;
            self.ranges.copy_within(2 * front..2 * front + 2, 2 * index);
            self.ranges[2 * front] = block;
            self.ranges[2 * front + 1] = self.results + u64::from(offset);
            self.windows += 1;
            offset + (source - block) as u32
        } else {
            self.ranges[2 * index] = source;
            self.ranges[2 * index + 1] = u64::from(len) | (u64::from(offset) << 32);
            offset
        };
        self.described += 1;
        Some(delivered)
    }

    /// The window count bits of `vyre_launch_flags` for a launch copying `count`
    /// descriptors.
    fn window_bits(&self, count: u32) -> u32 {
        self.windows.min(count) << FLAG_WINDOWS_SHIFT
    }

    /// Set the values for launch `iteration` of `iterations`: the first writes the
    /// start stamp, the last the end stamp and the copies.
    pub(in crate::backend) fn set_launch(&self, iteration: u32, iterations: u32) {
        let last = iteration + 1 >= iterations;
        let mut flags = 0;
        if iteration == 0 && self.stamps_start {
            flags |= FLAG_START_STAMP;
        }
        if last && self.stamps_end {
            flags |= FLAG_END_STAMP;
        }
        let count = if last { self.described } else { 0 };
        self.flags.set(flags | self.window_bits(count));
        self.count.set(count);
    }

    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    /// Set the per-launch values directly (graph captures and node updates, which
    /// choose flags per launch node and pass no descriptors).
    pub(in crate::backend) fn set_raw(&self, flags: u32, count: u32) {
        let count = count.min(self.described);
        self.flags.set(flags | self.window_bits(count));
        self.count.set(count);
    }

    /// Append the five parameter pointers (after the buffer addresses and counts).
    pub(in crate::backend) fn push_pointers<const N: usize>(
        &self,
        params: &mut SmallVec<[*mut c_void; N]>,
    ) {
        params.push(&self.control as *const u64 as *mut c_void);
        params.push(&self.results as *const u64 as *mut c_void);
        params.push(self.flags.as_ptr() as *mut c_void);
        params.push(self.count.as_ptr() as *mut c_void);
        params.push(self.ranges.as_ptr() as *mut c_void);
    }

    /// Descriptors added so far.
    #[cfg(test)]
    pub(in crate::backend) fn described(&self) -> u32 {
        self.described
    }
}

/// Where one readback item's bytes are after the synchronize.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::backend) enum Delivery {
    /// In the lane's pinned staging (a DMA copy).
    Staging { offset: usize, len: usize },
    /// In the result area (the kernel's last thread copied them).
    Area { offset: usize, len: usize },
}

impl Delivery {
    /// The item's length in bytes.
    pub(in crate::backend) fn len(&self) -> usize {
        match *self {
            Delivery::Staging { len, .. } | Delivery::Area { len, .. } => len,
        }
    }
}

/// The one copy that brings a device-memory result area back (no mapping available).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::backend) struct AreaCopy {
    pub(in crate::backend) device: u64,
    pub(in crate::backend) host: *mut u8,
    pub(in crate::backend) len: usize,
}

/// Where an area's bytes live.
enum Storage {
    /// Host-mapped: the kernel's stores reach the host directly.
    Mapped(MappedMemory),
    /// Device memory (no mapping available) with a pinned mirror filled by one copy.
    Device {
        device: DeviceMemory,
        mirror: driver::PinnedMemory,
    },
}

/// One lane's result area and control block.
pub(in crate::backend) struct ResultArea {
    storage: Storage,
    control: DeviceMemory,
}

impl ResultArea {
    /// Allocate an area (mapped when the driver allows, device memory otherwise) and
    /// initialise its control block to `(0, u64::MAX)`. Blocking; done once per lane.
    pub(in crate::backend) fn new() -> DriverResult<ResultArea> {
        let control = DeviceMemory::allocate(CONTROL_BYTES as u64)?;
        let mut idle = [0u8; CONTROL_BYTES];
        idle[8..].copy_from_slice(&u64::MAX.to_le_bytes());
        driver::copy_to_device_blocking(&control, &idle)?;
        let storage = match MappedMemory::allocate(RESULT_AREA_BYTES) {
            Ok(mapped) => Storage::Mapped(mapped),
            Err(e) => {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    tracing::warn!(
                        error = %e,
                        "host-mapped memory is unavailable: results come back with one copy from device memory"
                    )
                });
                Storage::Device {
                    device: DeviceMemory::allocate(RESULT_AREA_BYTES as u64)?,
                    mirror: driver::PinnedMemory::allocate(RESULT_AREA_BYTES)?,
                }
            }
        };
        Ok(ResultArea { storage, control })
    }

    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    /// Whether the kernel writes the host's bytes directly (no copy needed).
    pub(in crate::backend) fn is_mapped(&self) -> bool {
        matches!(self.storage, Storage::Mapped(_))
    }

    /// The parameter values pointing at this area.
    pub(in crate::backend) fn params(&self) -> ResultParams {
        ResultParams::new(self.control.address(), self.results_address())
    }

    /// The device address the kernel writes the results to. It names the area (and
    /// so its lane) for as long as the area lives.
    pub(in crate::backend) fn results_address(&self) -> u64 {
        match &self.storage {
            Storage::Mapped(m) => m.device_address(0),
            Storage::Device { device, .. } => device.address(),
        }
    }

    /// Before a launch, host side: clear the stamps of a mapped area (returns `None`),
    /// or return the 16-byte device fill that clears a device-memory area's stamps
    /// (as `(device address, bytes)`, to be enqueued before the launches).
    pub(in crate::backend) fn arm_host(&mut self) -> Option<(u64, usize)> {
        match &mut self.storage {
            Storage::Mapped(m) => {
                m.write(0, &[0u8; STAMP_BYTES]);
                None
            }
            Storage::Device { device, .. } => Some((device.address(), STAMP_BYTES)),
        }
    }

    /// For a device-memory area: the copy of its first `used` bytes into the pinned
    /// mirror, to be enqueued after the launches. `None` for a mapped area.
    pub(in crate::backend) fn copy_back(&mut self, used: usize) -> Option<AreaCopy> {
        match &mut self.storage {
            Storage::Mapped(_) => None,
            Storage::Device { device, mirror } => Some(AreaCopy {
                device: device.address(),
                host: mirror.address(0),
                len: used.clamp(STAMP_BYTES, RESULT_AREA_BYTES),
            }),
        }
    }

    /// Before a launch: clear the stamps, so a kernel that did not finish its
    /// epilogue can never pass off an earlier dispatch's bytes as its own.
    pub(in crate::backend) fn arm(&mut self, stream: &Stream) -> DriverResult<()> {
        match &mut self.storage {
            Storage::Mapped(m) => {
                m.write(0, &[0u8; STAMP_BYTES]);
                Ok(())
            }
            Storage::Device { device, .. } => {
                // SAFETY: the first STAMP_BYTES of the area are inside the allocation.
                unsafe { driver::fill_bytes_async(device.address(), 0, STAMP_BYTES, stream) }
            }
        }
    }

    /// After the launches, device storage only: one copy of the used prefix
    /// (`used` bytes) into the pinned mirror.
    ///
    /// # Safety
    /// The mirror is read only after the stream is synchronised, and the area stays
    /// alive until then (the lane owns it).
    pub(in crate::backend) unsafe fn enqueue_copy_back(
        &mut self,
        used: usize,
        stream: &Stream,
    ) -> DriverResult<()> {
        match &mut self.storage {
            Storage::Mapped(_) => Ok(()),
            Storage::Device { device, mirror } => driver::copy_to_host_async(
                mirror.address(0),
                device.address(),
                used.min(RESULT_AREA_BYTES),
                stream,
            ),
        }
    }

    /// After the synchronize: `(start, end)` `%globaltimer` stamps, or `None` when the
    /// kernel did not write its end stamp (its bytes must not be used).
    pub(in crate::backend) fn stamps(&self) -> Option<(u64, u64)> {
        let head = self.bytes(0, STAMP_BYTES);
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&head[8 * i..8 * i + 8]);
            u64::from_le_bytes(w)
        };
        let (start, end) = (word(0), word(1));
        (end != 0).then_some((start, end))
    }

    /// After the synchronize: `len` bytes at `offset`.
    #[inline]
    pub(in crate::backend) fn bytes(&self, offset: usize, len: usize) -> &[u8] {
        match &self.storage {
            Storage::Mapped(m) => m.slice(offset, len),
            Storage::Device { mirror, .. } => mirror.slice(offset, len),
        }
    }
}

/// Kernel time from the stamps: end − start, 0 when they are missing or reversed.
pub(in crate::backend) fn stamp_kernel_ns(stamps: Option<(u64, u64)>) -> u64 {
    stamps.map_or(0, |(start, end)| end.saturating_sub(start))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::ScalarType;

    fn item(len: u64) -> ReadItem {
        ReadItem {
            slot: 0,
            offset: 0,
            len,
            staging_offset: 0,
        }
    }

    /// Locks out a size policy that sends large items through the mapped area, lets
    /// two mapped items overlap, overruns the area or hands out more descriptors than
    /// the kernel has: items at most the limit are mapped at 16-byte aligned offsets
    /// after the stamps, the rest are copied.
    #[test]
    fn routes_follow_size_slots_and_room() {
        let reads = [item(16), item(5000), item(3), item(4096), item(0)];
        let mut routes = SmallVec::new();
        let mapped = route_reads(&reads, RESULT_AREA_BYTES, 4096, &mut routes);
        assert_eq!(mapped, 4);
        assert_eq!(
            routes.as_slice(),
            &[
                Route::Mapped { offset: 16 },
                Route::Copy,
                Route::Mapped { offset: 32 },
                Route::Mapped { offset: 48 },
                Route::Mapped { offset: 48 + 4096 },
            ]
        );

        // Slots run out after RESULT_RANGE_SLOTS items.
        let many = vec![item(16); RESULT_RANGE_SLOTS + 3];
        let mut routes = SmallVec::new();
        assert_eq!(
            route_reads(&many, RESULT_AREA_BYTES, 4096, &mut routes),
            RESULT_RANGE_SLOTS
        );
        assert!(routes[RESULT_RANGE_SLOTS..]
            .iter()
            .all(|r| *r == Route::Copy));

        // Room runs out: a 100-byte area holds the stamps and 84 bytes.
        let mut routes = SmallVec::new();
        assert_eq!(route_reads(&[item(80), item(8)], 100, 4096, &mut routes), 1);
        assert_eq!(
            routes.as_slice(),
            &[Route::Mapped { offset: 16 }, Route::Copy]
        );
    }

    /// Locks out a range the kernel would copy only partly or from outside its
    /// buffer, and small outputs that still take the general per-range copy: a
    /// range inside one aligned 16-byte block of its buffer becomes a window (block
    /// address, absolute destination; in front, counted in flags bits 8-15, its bytes
    /// delivered at their position in the block), every other range stays a
    /// (source, length | offset << 32) descriptor for the strided loop; every range
    /// is present exactly once. Negative controls: a block that would cross the
    /// buffer's end or start, a range crossing a block boundary and an unaligned
    /// destination are not windows.
    #[test]
    fn ranges_inside_one_block_of_their_buffer_become_leading_windows() {
        const AREA: u64 = 0x2000;
        let decode = |p: &ResultParams| -> Vec<(u64, u64)> {
            (0..p.described as usize)
                .map(|i| (p.ranges[2 * i], p.ranges[2 * i + 1]))
                .collect()
        };
        let mut params = ResultParams::new(0x1000, AREA);
        // A whole 16-byte buffer: a window.
        assert_eq!(params.describe(0x100, 16, 16, 0x100..0x110), Some(16));
        // 64 bytes: longer than a block, the loop.
        assert_eq!(params.describe(0x200, 64, 32, 0x200..0x300), Some(32));
        // 4 bytes at byte 8 of a 32-byte buffer: a window, delivered 8 bytes in.
        assert_eq!(params.describe(0x308, 4, 96, 0x300..0x320), Some(104));
        // 4 bytes in a 4-byte buffer: its block would read past the buffer.
        assert_eq!(params.describe(0x400, 4, 112, 0x400..0x404), Some(112));
        // 8 bytes at byte 12: crosses into the next block.
        assert_eq!(params.describe(0x50c, 8, 128, 0x500..0x520), Some(128));
        // Byte 4 of a buffer starting at 0x604: its block starts before the buffer.
        assert_eq!(params.describe(0x608, 4, 144, 0x604..0x620), Some(144));
        // An empty range adds no descriptor.
        assert_eq!(params.describe(0x700, 0, 160, 0x700..0x710), Some(160));
        let ranges = decode(&params);
        assert_eq!(ranges.len(), 6, "{ranges:x?}");
        let mut windows = ranges[..2].to_vec();
        windows.sort_unstable();
        assert_eq!(windows, [(0x100, AREA + 16), (0x300, AREA + 96)]);
        let mut looped = ranges[2..].to_vec();
        looped.sort_unstable();
        assert_eq!(
            looped,
            [
                (0x200, 64 | (32 << 32)),
                (0x400, 4 | (112 << 32)),
                (0x50c, 8 | (128 << 32)),
                (0x608, 4 | (144 << 32)),
            ]
        );
        params.set_launch(0, 1);
        assert_eq!(params.flags.get() >> FLAG_WINDOWS_SHIFT, 2);
        params.set_raw(FLAG_END_STAMP, 1);
        assert_eq!(
            params.flags.get(),
            FLAG_END_STAMP | (1 << FLAG_WINDOWS_SHIFT)
        );

        // A destination off the 16-byte grid cannot take a block store.
        let mut odd = ResultParams::new(0x1000, AREA);
        assert_eq!(odd.describe(0x100, 16, 24, 0x100..0x110), Some(24));
        assert_eq!(odd.windows, 0);
        assert_eq!(decode(&odd), [(0x100, 16 | (24 << 32))]);
    }

    /// Locks out descriptors the kernel would misread and launch flags that stamp or
    /// copy on the wrong launch: a looped range is encoded (u64 source, u32 length |
    /// u32 offset << 32), copies happen only on the last launch, the start stamp only
    /// on the first, and a 17th descriptor is refused.
    #[test]
    fn parameters_encode_descriptors_and_per_launch_flags() {
        let mut params = ResultParams::new(0x1000, 0x2000);
        assert_eq!(
            params.describe(0xdead_0004, 16, 32, 0xdead_0000..0xdead_1000),
            Some(32)
        );
        assert_eq!(params.ranges[0], 0xdead_0004);
        assert_eq!(params.ranges[1], 16 | (32 << 32));
        for _ in 1..RESULT_RANGE_SLOTS {
            assert_eq!(params.describe(1, 1, 1, 0..2), Some(1));
        }
        assert_eq!(params.describe(1, 1, 1, 0..2), None);
        assert_eq!(params.described(), RESULT_RANGE_SLOTS as u32);

        params.set_launch(0, 3);
        assert_eq!(
            (params.flags.get(), params.count.get()),
            (FLAG_START_STAMP, 0)
        );
        params.set_launch(1, 3);
        assert_eq!((params.flags.get(), params.count.get()), (0, 0));
        params.set_launch(2, 3);
        // No window (every block would cross its buffer): no window bits.
        assert_eq!(
            (params.flags.get(), params.count.get()),
            (FLAG_END_STAMP, RESULT_RANGE_SLOTS as u32)
        );
        params.set_launch(0, 1);
        assert_eq!(params.flags.get(), FLAG_START_STAMP | FLAG_END_STAMP);

        let mut pointers: SmallVec<[*mut c_void; 8]> = SmallVec::new();
        params.push_pointers(&mut pointers);
        assert_eq!(pointers.len(), 5);
        assert_eq!(
            pointers[4] as usize % 8,
            0,
            "descriptors must be 8-byte aligned"
        );
    }

    /// `buffers` runtime-sized u32 buffers and the given scalars.
    fn program_with(buffers: u32, scalars: &[ScalarType]) -> Program {
        let mut builder = Program::builder([1, 1, 1]);
        for index in 0..buffers {
            builder = builder.buffer(
                format!("b{index}"),
                index,
                crate::ir::Access::ReadWrite,
                crate::ir::ElemType::U32,
                crate::ir::BufferCount::Runtime,
            );
        }
        for (index, &ty) in scalars.iter().enumerate() {
            builder = builder.scalar(format!("s{index}"), ty);
        }
        builder.build()
    }

    /// Locks out a kernel whose parameters the driver would refuse at launch: the
    /// byte count follows the ABI's layout (counts padded to 8 before the result
    /// parameters, scalars after them, a 64-bit one aligned to 8), 318 buffers fit
    /// exactly in 4 KiB, 319 get a Fix error naming the limit and the largest count
    /// that fits; a scalar takes its bytes from the same space (318 buffers and one
    /// scalar are refused, 317 fit).
    #[test]
    fn result_abi_parameters_fit_the_driver_limit() {
        assert_eq!(result_abi_parameter_bytes(0, &[]), 280);
        assert_eq!(result_abi_parameter_bytes(1, &[]), 8 + 8 + 280);
        assert_eq!(result_abi_parameter_bytes(2, &[]), 16 + 8 + 280);
        let scalars = [
            ScalarDecl::new("a", ScalarType::U32),
            ScalarDecl::new("b", ScalarType::U64),
            ScalarDecl::new("c", ScalarType::F32),
        ];
        // 280, then 4 bytes, 4 of padding and 8, then 4.
        assert_eq!(result_abi_parameter_bytes(0, &scalars), 280 + 4 + 4 + 8 + 4);
        assert_eq!(
            result_abi_parameter_bytes(318, &[]),
            KERNEL_PARAMETER_LIMIT_BYTES
        );
        assert!(check_result_abi_fits("p", &program_with(318, &[])).is_ok());
        let message = check_result_abi_fits("p", &program_with(319, &[])).unwrap_err();
        assert!(
            message.starts_with("Fix:") && message.contains("at most 318"),
            "{message}"
        );
        let message =
            check_result_abi_fits("p", &program_with(318, &[ScalarType::U32])).unwrap_err();
        assert!(
            message.starts_with("Fix:") && message.contains("at most 317"),
            "{message}"
        );
        assert!(message.contains("its 1 scalars"), "{message}");
        assert!(check_result_abi_fits("p", &program_with(317, &[ScalarType::U64])).is_ok());
    }

    /// Locks out a size policy that sends long ranges through a one-lane copy: the
    /// limit grows with the lanes a workgroup can offer and stops at the cap.
    #[test]
    fn mapped_limit_follows_the_lanes_of_the_last_group() {
        assert_eq!(mapped_range_limit(0), 80);
        assert_eq!(mapped_range_limit(1), 80);
        assert_eq!(mapped_range_limit(8), 16 + 4 * 8 * 16);
        assert_eq!(mapped_range_limit(32), 2064);
        assert_eq!(mapped_range_limit(1024), 2064);
        assert!(mapped_range_limit(u32::MAX) <= MAPPED_RANGE_MAX_BYTES);
    }

    /// Locks out reporting garbage as kernel time: missing stamps give 0, reversed
    /// ones saturate to 0, and a real pair gives end − start.
    #[test]
    fn kernel_time_comes_from_the_stamps() {
        assert_eq!(stamp_kernel_ns(None), 0);
        assert_eq!(stamp_kernel_ns(Some((10, 5))), 0);
        assert_eq!(stamp_kernel_ns(Some((1_000, 4_200))), 3_200);
    }
}
