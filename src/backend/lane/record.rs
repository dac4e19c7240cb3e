//! The host half of the lane's request record (its layout is the ABI documented in
//! `codegen::ptx::lane`) and the lane rules every backend checks the same way.
//!
//! Pure: a planned request (bound addresses and sizes, readback items, host input
//! placement) becomes the record's bytes, the prologue's zero fills and input copies,
//! and the readback descriptors with where each item lands in the slot's result
//! area. No driver, so every rule and byte is tested on the CPU; the reference
//! backend's lane checks requests with the same functions and messages.

use std::ops::Range;

use smallvec::SmallVec;

use crate::codegen::ptx::lane::{
    record_scalar_at, AREA_HEADER_BYTES, MAX_LANE_BINDINGS, MAX_LANE_PROLOGUE, MAX_LANE_READBACKS,
    RECORD_BINDINGS_AT, RECORD_BINDING_BYTES, RECORD_BINDING_COUNT, RECORD_BYTES,
    RECORD_ENTRY_BYTES, RECORD_GRID, RECORD_ITERATIONS, RECORD_KERNEL, RECORD_PROLOGUE_AT,
    RECORD_PROLOGUE_COUNT, RECORD_READBACK_AT, RECORD_READBACK_COUNT, RECORD_SCALARS_AT,
    RECORD_SCALAR_COUNT, RECORD_WINDOW_COUNT, RECORD_WORKGROUPS,
};

use super::super::plan::ReadItem;
use super::super::readback::window_block;
use super::super::{BackendError, PerBinding};

/// One prologue entry: a zero fill or a copy of host input bytes from the slot's
/// staging into a transient device buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::backend) struct PrologueOp {
    pub(in crate::backend) destination: u64,
    pub(in crate::backend) bytes: u32,
    /// Offset in the slot's staging, or
    /// [`PROLOGUE_ZERO`](crate::codegen::ptx::lane::PROLOGUE_ZERO).
    pub(in crate::backend) source: u32,
}

/// One readback descriptor: `bytes` from `source` (a window: its 16-byte block) to
/// `offset` in the slot's result area.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::backend) struct ReadbackCopy {
    pub(in crate::backend) source: u64,
    pub(in crate::backend) bytes: u32,
    pub(in crate::backend) offset: u32,
}

/// Where the readback items go: the descriptors (windows first) and, per item in
/// item order, where its bytes are in the area after completion.
#[derive(Default)]
pub(in crate::backend) struct Placed {
    pub(in crate::backend) copies: PerBinding<ReadbackCopy>,
    pub(in crate::backend) windows: u32,
    /// `(area offset, length)` of each item.
    pub(in crate::backend) deliveries: PerBinding<(usize, usize)>,
}

/// What one record says.
pub(in crate::backend) struct RecordParts<'a> {
    pub(in crate::backend) kernel: u32,
    pub(in crate::backend) iterations: u32,
    pub(in crate::backend) grid: [u32; 3],
    /// `(device address, element count)` per binding, in binding order.
    pub(in crate::backend) bindings: &'a [(u64, u32)],
    /// The scalar values' bit patterns, zero-extended, in declaration order (one per
    /// scalar the kernel declares: the plan checked every one was given), as a
    /// launch passes them.
    pub(in crate::backend) scalars: &'a [u64],
    pub(in crate::backend) prologue: &'a [PrologueOp],
    pub(in crate::backend) placed: &'a Placed,
}

/// Write `parts` into `out` (the rest of `out` is left as it was); returns the
/// record's length in bytes, a multiple of 16. The counts were checked against the
/// `MAX_LANE_*` limits ([`check_lane_request`], [`check_lane_kernels`]; a valid
/// program's scalars are fewer than `MAX_LANE_SCALARS`), so the record fits. The
/// scalar words are part of the record's bytes, so two requests that differ only in
/// their values have different records ([`record_route`] never takes one for the
/// other).
pub(in crate::backend) fn write_record(
    parts: &RecordParts<'_>,
    out: &mut [u8; RECORD_BYTES],
) -> usize {
    let put32 = |out: &mut [u8; RECORD_BYTES], at: usize, value: u32| {
        out[at..at + 4].copy_from_slice(&value.to_le_bytes())
    };
    let put64 = |out: &mut [u8; RECORD_BYTES], at: usize, value: u64| {
        out[at..at + 8].copy_from_slice(&value.to_le_bytes())
    };
    let [x, y, z] = parts.grid;
    let workgroups = x.saturating_mul(y).saturating_mul(z);
    let scalars_at = record_scalar_at(parts.bindings.len(), 0);
    let scalars_end = record_scalar_at(parts.bindings.len(), parts.scalars.len());
    let prologue_at = scalars_end.div_ceil(16) * 16;
    let readback_at = prologue_at + RECORD_ENTRY_BYTES * parts.prologue.len();
    let end = readback_at + RECORD_ENTRY_BYTES * parts.placed.copies.len();
    out[..RECORD_BINDINGS_AT].fill(0);
    put32(out, RECORD_KERNEL, parts.kernel);
    put32(out, RECORD_ITERATIONS, parts.iterations);
    for (axis, value) in [x, y, z].into_iter().enumerate() {
        put32(out, RECORD_GRID + 4 * axis, value);
    }
    put32(out, RECORD_WORKGROUPS, workgroups);
    put32(out, RECORD_BINDING_COUNT, parts.bindings.len() as u32);
    put32(out, RECORD_SCALAR_COUNT, parts.scalars.len() as u32);
    put32(out, RECORD_PROLOGUE_COUNT, parts.prologue.len() as u32);
    put32(out, RECORD_WINDOW_COUNT, parts.placed.windows);
    put32(out, RECORD_READBACK_COUNT, parts.placed.copies.len() as u32);
    put32(out, RECORD_PROLOGUE_AT, prologue_at as u32);
    put32(out, RECORD_READBACK_AT, readback_at as u32);
    put32(out, RECORD_SCALARS_AT, scalars_at as u32);
    for (index, &(address, count)) in parts.bindings.iter().enumerate() {
        let at = RECORD_BINDINGS_AT + RECORD_BINDING_BYTES * index;
        put64(out, at, address);
        put32(out, at + 8, count);
        put32(out, at + 12, 0);
    }
    for (position, &word) in parts.scalars.iter().enumerate() {
        put64(out, record_scalar_at(parts.bindings.len(), position), word);
    }
    out[scalars_end..prologue_at].fill(0);
    for (index, op) in parts.prologue.iter().enumerate() {
        let at = prologue_at + RECORD_ENTRY_BYTES * index;
        put64(out, at, op.destination);
        put32(out, at + 8, op.bytes);
        put32(out, at + 12, op.source);
    }
    for (index, copy) in parts.placed.copies.iter().enumerate() {
        let at = readback_at + RECORD_ENTRY_BYTES * index;
        put64(out, at, copy.source);
        put32(out, at + 8, copy.bytes);
        put32(out, at + 12, copy.offset);
    }
    end
}

/// Where the server takes a request's record from (the doorbell's flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::backend) enum RecordRoute {
    /// The record equals the previous request's: the blocks' shared copies are
    /// current, no record byte moves.
    Same,
    /// The record equals the one before the previous distinct record: the blocks'
    /// two shared copies change roles, no record byte is read or copied.
    Earlier,
    /// The record equals the slot's copy in device memory: the blocks read it from
    /// there, no record byte crosses the bus.
    Cached,
    /// The record is new to the slot: the host writes it, the device reads it from
    /// host memory and keeps it as the slot's copy.
    Reload,
}

/// The route of `record` after the previous request's record `previous` and the
/// distinct record before it `earlier` (empty before there was one), with `slot_copy`
/// the record the slot's device copy holds (`None` before its first). Byte for byte: a
/// record differing in any word (a scalar value included) is another record.
pub(in crate::backend) fn record_route(
    record: &[u8],
    previous: &[u8],
    earlier: &[u8],
    slot_copy: Option<&[u8]>,
) -> RecordRoute {
    if record == previous {
        RecordRoute::Same
    } else if record == earlier {
        RecordRoute::Earlier
    } else if slot_copy == Some(record) {
        RecordRoute::Cached
    } else {
        RecordRoute::Reload
    }
}

/// Place every readback item in a result area of `area_bytes`: after the area's
/// header, each at a 16-byte aligned offset reserving whole 16-byte blocks (a window's
/// vector store writes its whole block). An item inside one aligned 16-byte block of
/// its buffer is a window (one vector load and store on the device), delivered at its
/// position in the block. `memory(slot)` is the device range bound to a slot. An
/// `Err` starting `Fix:` when the items do not fit the area.
pub(in crate::backend) fn place_readbacks(
    kernel_name: &str,
    reads: &[ReadItem],
    memory: impl Fn(u16) -> Range<u64>,
    area_bytes: usize,
    placed: &mut Placed,
) -> Result<(), BackendError> {
    let mut windows: SmallVec<[ReadbackCopy; 16]> = SmallVec::new();
    let mut ranges: SmallVec<[ReadbackCopy; 16]> = SmallVec::new();
    let mut next = AREA_HEADER_BYTES;
    for read in reads {
        let len = read.len as usize;
        let footprint = len.div_ceil(16) * 16;
        let end = next.checked_add(footprint).filter(|&end| end <= area_bytes);
        let Some(end) = end else {
            return Err(area_too_small(kernel_name, reads, area_bytes));
        };
        let memory = memory(read.slot);
        let source = memory.start + read.offset;
        // len ≤ area_bytes ≤ u32::MAX (LaneOptions bounds it), so it fits the entry.
        let bytes = len as u32;
        let offset = next as u32;
        if len == 0 {
            placed.deliveries.push((next, 0));
        } else if let Some(block) = window_block(source, bytes, &memory) {
            windows.push(ReadbackCopy {
                source: block,
                bytes: 16,
                offset,
            });
            placed
                .deliveries
                .push((next + (source - block) as usize, len));
        } else {
            ranges.push(ReadbackCopy {
                source,
                bytes,
                offset,
            });
            placed.deliveries.push((next, len));
        }
        next = end;
    }
    placed.windows = windows.len() as u32;
    placed.copies.extend(windows);
    placed.copies.extend(ranges);
    Ok(())
}

/// Bytes of a result area the readback items take: the header, then each item
/// rounded up to 16 bytes.
fn area_needed(reads: &[ReadItem]) -> u64 {
    reads
        .iter()
        .map(|read| read.len.div_ceil(16).saturating_mul(16))
        .fold(AREA_HEADER_BYTES as u64, u64::saturating_add)
}

/// The `Fix:` error for readback items that do not fit a slot's result area.
fn area_too_small(kernel_name: &str, reads: &[ReadItem], area_bytes: usize) -> BackendError {
    let needed = area_needed(reads);
    BackendError::bad_input(format!(
        "Fix: the readback of {kernel_name} needs {needed} bytes of the lane's result area (16-byte \
         aligned items after a {AREA_HEADER_BYTES}-byte header) but a slot has {area_bytes}; build \
         the lane with LaneOptions::result_bytes of at least {}, or read less back \
         (ReadbackPolicy::Ranges, or ReadbackPolicy::None and read the buffer)",
        needed.div_ceil(128).saturating_mul(128)
    ))
}

/// What the lane rules look at in one kernel.
pub(in crate::backend) struct LaneKernelShape<'a> {
    pub(in crate::backend) name: &'a str,
    pub(in crate::backend) workgroup_size: [u32; 3],
    pub(in crate::backend) grid_sync: bool,
    pub(in crate::backend) global_buffers: usize,
}

/// Most kernels one lane is built from.
pub const MAX_LANE_KERNELS: usize = 1024;

/// The rules of a lane's kernels, checked when a lane is built on any backend: at
/// least one and at most [`MAX_LANE_KERNELS`], one workgroup shape (the lane's
/// blocks have it), no grid sync (a lane runs a grid's workgroups in turn), at most
/// [`MAX_LANE_BINDINGS`] global buffers each. Returns the shape.
pub(in crate::backend) fn check_lane_kernels(
    kernels: &[LaneKernelShape<'_>],
) -> Result<[u32; 3], BackendError> {
    let Some(first) = kernels.first() else {
        return Err(BackendError::bad_input(
            "Fix: a lane needs at least one kernel; pass the compiled kernels it will serve",
        ));
    };
    if kernels.len() > MAX_LANE_KERNELS {
        return Err(BackendError::bad_input(format!(
            "Fix: a lane serves at most {MAX_LANE_KERNELS} kernels (got {}); build several lanes",
            kernels.len()
        )));
    }
    for kernel in kernels {
        if kernel.workgroup_size != first.workgroup_size {
            return Err(BackendError::bad_input(format!(
                "Fix: every kernel of a lane has one workgroup size (the lane's blocks have it): {} has \
                 {:?} but {} has {:?}; build one lane per workgroup size",
                first.name, first.workgroup_size, kernel.name, kernel.workgroup_size
            )));
        }
        if kernel.grid_sync {
            return Err(BackendError::bad_input(format!(
                "Fix: {} uses grid_sync, which a lane cannot run (it runs a grid's workgroups in turn on \
                 its resident blocks, so a grid sync would wait for workgroups that have not started); \
                 dispatch it with run or submit",
                kernel.name
            )));
        }
        if kernel.global_buffers > MAX_LANE_BINDINGS {
            return Err(BackendError::bad_input(format!(
                "Fix: {} binds {} global buffers and a lane's request record carries at most \
                 {MAX_LANE_BINDINGS}; pack buffers together or dispatch it with run",
                kernel.name, kernel.global_buffers
            )));
        }
    }
    Ok(first.workgroup_size)
}

/// A lane's name in messages: its first kernel and how many more.
pub(in crate::backend) fn lane_name(first: &str, kernels: usize) -> String {
    match kernels {
        0 | 1 => format!("the lane of {first}"),
        more => format!("the lane of {first} and {} more", more - 1),
    }
}

/// A lane block's static shared memory against the device's per-block limit.
pub(in crate::backend) fn check_lane_shared(
    shared_bytes: u32,
    limit: u32,
) -> Result<(), BackendError> {
    if shared_bytes <= limit {
        return Ok(());
    }
    Err(BackendError::bad_input(format!(
        "Fix: a lane block needs {shared_bytes} bytes of shared memory (the 4 KiB request record \
         plus the largest kernel's workgroup buffers) and this device gives a block {limit}; use \
         smaller workgroup buffers or dispatch that kernel with run"
    )))
}

/// A lane's blocks against the most the device holds at once (they must all be
/// resident: each polls for work the others may be waiting on).
pub(in crate::backend) fn check_lane_blocks(
    name: &str,
    blocks: u32,
    most: u64,
) -> Result<(), BackendError> {
    if u64::from(blocks) <= most {
        return Ok(());
    }
    Err(BackendError::bad_input(format!(
        "Fix: LaneOptions::blocks is {blocks} but this device holds at most {most} blocks of {name} \
         at once (a lane's blocks must all be resident); use at most {most}"
    )))
}

/// The rules of one lane request, on every backend: a grid whose workgroups a lane can
/// number (at most `u32::MAX` in all), at most [`MAX_LANE_READBACKS`] readback items
/// that fit a slot's result area of `area_bytes`, host input bytes that fit a slot's
/// staging, at most [`MAX_LANE_PROLOGUE`] zero fills and copies, each under 4 GiB.
pub(in crate::backend) fn check_lane_request(
    kernel_name: &str,
    workgroups: [u32; 3],
    (reads, area_bytes): (&[ReadItem], usize),
    staging: (u64, usize),
    prologue: (usize, u64),
) -> Result<(), BackendError> {
    let total = workgroups.iter().map(|&g| u64::from(g)).product::<u64>();
    if total > u64::from(u32::MAX) {
        return Err(BackendError::Launch {
            message: format!(
                "Fix: a lane numbers a request's workgroups with 32 bits, and {workgroups:?} is {total} \
                 workgroups of {kernel_name}; dispatch at most {} (or use run)",
                u32::MAX
            ),
        });
    }
    if reads.len() > MAX_LANE_READBACKS {
        return Err(BackendError::bad_input(format!(
            "Fix: a lane request reads back at most {MAX_LANE_READBACKS} items and this one of \
             {kernel_name} reads {}; merge ranges or read buffers afterwards",
            reads.len()
        )));
    }
    if area_needed(reads) > area_bytes as u64 {
        return Err(area_too_small(kernel_name, reads, area_bytes));
    }
    let (input_bytes, staging_bytes) = staging;
    if input_bytes > staging_bytes as u64 {
        return Err(BackendError::bad_input(format!(
            "Fix: the host inputs of this request of {kernel_name} take {input_bytes} bytes of the \
             lane's input staging (16-byte aligned) but a slot has {staging_bytes}; build the lane \
             with LaneOptions::staging_bytes of at least {}, or bind DeviceBuffers",
            input_bytes.div_ceil(128) * 128
        )));
    }
    let (operations, largest) = prologue;
    if operations > MAX_LANE_PROLOGUE || largest > u64::from(u32::MAX) {
        return Err(BackendError::bad_input(format!(
            "Fix: a lane request zeroes or copies at most {MAX_LANE_PROLOGUE} bindings of under 4 GiB \
             each before it runs, and this one of {kernel_name} has {operations} (the largest {largest} \
             bytes); dispatch it with run"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codegen::ptx::lane::PROLOGUE_ZERO;

    /// The area header's bytes (readback items follow it).
    const H: usize = AREA_HEADER_BYTES;

    /// Locks out a `Fix:` message broken over source lines without a `\`, which
    /// put the next line's indentation inside the message (both lane limits read
    /// "request record          plus"): the two messages are single-spaced, name
    /// their numbers, and pass at the limit. Negative control: the old text's run of
    /// spaces is caught by the same check.
    #[test]
    fn lane_limit_messages_are_single_spaced() {
        let spaced = |message: &str| message.contains("  ");
        let shared = check_lane_shared(50_000, 49_152).unwrap_err().to_string();
        let blocks = check_lane_blocks("inc", 9, 8).unwrap_err().to_string();
        for message in [&shared, &blocks] {
            assert!(message.contains("Fix: "), "{message}");
            assert!(!spaced(message), "{message}");
        }
        assert!(
            shared.contains("50000") && shared.contains("49152"),
            "{shared}"
        );
        assert!(
            blocks.contains("is 9") && blocks.contains("at most 8"),
            "{blocks}"
        );
        assert!(
            check_lane_shared(49_152, 49_152).is_ok() && check_lane_blocks("inc", 8, 8).is_ok()
        );
        assert!(spaced("the 4 KiB request record          plus the largest"));
    }

    fn item(slot: u16, offset: u64, len: u64) -> ReadItem {
        ReadItem {
            slot,
            offset,
            len,
            staging_offset: 0,
        }
    }

    fn word(record: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(record[at..at + 4].try_into().unwrap())
    }

    fn double(record: &[u8], at: usize) -> u64 {
        u64::from_le_bytes(record[at..at + 8].try_into().unwrap())
    }

    /// Locks out a record the server would misread: every header field at its ABI
    /// offset, bindings at 64 + 16 i, the scalar words after them (where
    /// `record_scalar_at` says, zero padding to 16 bytes after an odd count), the
    /// prologue table 16-byte aligned after them, the readback table after it, the
    /// length a multiple of 16 covering the last entry.
    #[test]
    fn the_record_follows_the_abi() {
        let mut placed = Placed::default();
        placed.copies.push(ReadbackCopy {
            source: 0x1000,
            bytes: 16,
            offset: 32,
        });
        placed.windows = 1;
        let bindings = [(0xA000u64, 4u32), (0xB000, 7), (0xC000, 9)];
        let prologue = [PrologueOp {
            destination: 0xB000,
            bytes: 28,
            source: PROLOGUE_ZERO,
        }];
        let parts = RecordParts {
            kernel: 5,
            iterations: 2,
            grid: [3, 2, 4],
            bindings: &bindings,
            scalars: &[0x1_0000_0002, 7, u64::MAX],
            prologue: &prologue,
            placed: &placed,
        };
        let mut record = [0xEEu8; RECORD_BYTES];
        let len = write_record(&parts, &mut record);
        assert_eq!(word(&record, RECORD_KERNEL), 5);
        assert_eq!(word(&record, RECORD_ITERATIONS), 2);
        assert_eq!(
            [0, 1, 2].map(|axis| word(&record, RECORD_GRID + 4 * axis)),
            [3, 2, 4]
        );
        assert_eq!(word(&record, RECORD_WORKGROUPS), 24);
        assert_eq!(word(&record, RECORD_BINDING_COUNT), 3);
        assert_eq!(word(&record, RECORD_PROLOGUE_COUNT), 1);
        assert_eq!(word(&record, RECORD_WINDOW_COUNT), 1);
        assert_eq!(word(&record, RECORD_READBACK_COUNT), 1);
        assert_eq!(double(&record, 64 + 16), 0xB000);
        assert_eq!(word(&record, 64 + 16 + 8), 7);
        assert_eq!(word(&record, RECORD_SCALAR_COUNT), 3);
        let scalars_at = word(&record, RECORD_SCALARS_AT) as usize;
        assert_eq!(scalars_at, 64 + 3 * 16);
        assert_eq!(
            [0, 1, 2].map(|position| record_scalar_at(3, position)),
            [scalars_at, scalars_at + 8, scalars_at + 16]
        );
        assert_eq!(
            [0, 1, 2].map(|position| double(&record, scalars_at + 8 * position)),
            [0x1_0000_0002, 7, u64::MAX]
        );
        let prologue_at = word(&record, RECORD_PROLOGUE_AT) as usize;
        assert_eq!(prologue_at, scalars_at + 32);
        assert_eq!(double(&record, scalars_at + 24), 0, "the padding is zeroed");
        assert_eq!(double(&record, prologue_at), 0xB000);
        assert_eq!(word(&record, prologue_at + 8), 28);
        assert_eq!(word(&record, prologue_at + 12), PROLOGUE_ZERO);
        let readback_at = word(&record, RECORD_READBACK_AT) as usize;
        assert_eq!(readback_at, prologue_at + 16);
        assert_eq!(double(&record, readback_at), 0x1000);
        assert_eq!(word(&record, readback_at + 12), 32);
        assert_eq!(len, readback_at + 16);
        assert!(len.is_multiple_of(16));
        // Nothing past the record was touched.
        assert!(record[len..].iter().all(|&b| b == 0xEE));
    }

    /// Locks out a lane that serves a request with an earlier request's scalar values
    /// (a record without them, or a route that compared less than the whole record,
    /// would call the request "same" or "cached" and the body would read the stale
    /// word): two requests alike but for one scalar value have records differing in
    /// exactly that word; the values 1, 2, 1, 2 reload twice, then find the earlier
    /// copy holding their own value (one slot or two), a repeat in between is "same"
    /// and leaves the earlier copy as it was, and with a third value between them each
    /// finds its slot's copy, not the earlier one. Negative controls: the records agree
    /// outside the scalar word (a comparison skipping it would take one for the other),
    /// and a repeated request is "same".
    #[test]
    fn a_record_differing_only_in_a_scalar_value_is_never_served_stale() {
        let placed = Placed::default();
        let bindings = [(0xA000u64, 64u32), (0xB000, 64)];
        let record_of = |value: u64| {
            let parts = RecordParts {
                kernel: 0,
                iterations: 1,
                grid: [1, 1, 1],
                bindings: &bindings,
                scalars: &[5, value],
                prologue: &[],
                placed: &placed,
            };
            let mut record = [0u8; RECORD_BYTES];
            let len = write_record(&parts, &mut record);
            record[..len].to_vec()
        };
        let (one, two) = (record_of(1), record_of(2));
        let word_at = record_scalar_at(bindings.len(), 1);
        let differing: Vec<usize> = (0..one.len()).filter(|&i| one[i] != two[i]).collect();
        assert_eq!(differing, [word_at]);
        let without_word = |record: &[u8]| {
            let mut record = record.to_vec();
            record[word_at..word_at + 8].fill(0);
            record
        };
        assert_eq!(without_word(&one), without_word(&two));
        assert_eq!(record_route(&one, &one, &[], Some(&two)), RecordRoute::Same);

        // The lane's bookkeeping: the previous record, the distinct one before it, and
        // each slot's copy. Alternating records take the earlier copy once both were
        // seen, whatever the slots; a third record reloads (or takes its slot's copy).
        let three = record_of(3);
        let routes = |slots: usize, records: &[&Vec<u8>]| {
            let mut previous: Vec<u8> = Vec::new();
            let mut earlier: Vec<u8> = Vec::new();
            let mut copies: Vec<Option<Vec<u8>>> = vec![None; slots];
            let mut routes = Vec::new();
            for (ticket, &record) in records.iter().enumerate() {
                let copy = &mut copies[ticket % slots];
                let route = record_route(record, &previous, &earlier, copy.as_deref());
                if route == RecordRoute::Reload {
                    *copy = Some(record.clone());
                }
                if route != RecordRoute::Same {
                    earlier = std::mem::replace(&mut previous, record.clone());
                }
                routes.push(route);
            }
            routes
        };
        use RecordRoute::{Cached, Earlier, Reload, Same};
        assert_eq!(
            routes(1, &[&one, &two, &one, &two]),
            [Reload, Reload, Earlier, Earlier]
        );
        assert_eq!(
            routes(2, &[&one, &two, &one, &one, &two]),
            [Reload, Reload, Earlier, Same, Earlier]
        );
        assert_eq!(
            routes(3, &[&one, &two, &three, &one, &two]),
            [Reload, Reload, Reload, Cached, Cached]
        );
    }

    /// Locks out a readback placement that overlaps items, reads outside a buffer as a
    /// window, puts a window behind a range (the server takes windows from the front)
    /// or loses an item's position: windows first in the table, deliveries in item
    /// order at their bytes' position, every placement 16-byte aligned after the
    /// header. Negative controls: a range crossing a 16-byte block and a block
    /// reaching past its buffer are ranges, not windows.
    #[test]
    fn readbacks_are_placed_windows_first() {
        let memory = |slot: u16| match slot {
            0 => 0x1000..0x1040,
            1 => 0x2000..0x2006,
            _ => 0x3000..0x3100,
        };
        let reads = [
            item(2, 0, 64),  // a range
            item(0, 4, 8),   // a window at byte 4 of block 0x1000
            item(0, 12, 8),  // crosses a block boundary: a range
            item(1, 0, 6),   // its block would pass the buffer's end: a range
            item(2, 16, 16), // a window
        ];
        let mut placed = Placed::default();
        place_readbacks("k", &reads, memory, 4096, &mut placed).unwrap();
        assert_eq!(placed.windows, 2);
        assert_eq!(
            placed.copies[..2],
            [
                ReadbackCopy {
                    source: 0x1000,
                    bytes: 16,
                    offset: (H + 64) as u32
                },
                ReadbackCopy {
                    source: 0x3010,
                    bytes: 16,
                    offset: (H + 64 + 16 + 16 + 16) as u32
                },
            ]
        );
        assert_eq!(placed.copies.len(), 5);
        assert_eq!(
            placed.deliveries.as_slice(),
            &[
                (H, 64),
                (H + 64 + 4, 8),
                (H + 64 + 16, 8),
                (H + 64 + 32, 6),
                (H + 64 + 48, 16)
            ]
        );
        // Too little room: a Fix error naming the bytes needed.
        let mut small = Placed::default();
        let error = place_readbacks("k", &reads, memory, 128, &mut small).unwrap_err();
        let message = error.to_string();
        assert!(
            message.starts_with("Fix:") && message.contains("result_bytes"),
            "{message}"
        );
    }

    /// Locks out a lane built from kernels it cannot serve: none, two workgroup shapes,
    /// a grid sync, too many buffers; each a `Fix:` error naming the kernel. Negative
    /// control: two kernels of one shape pass and give the shape.
    #[test]
    fn lane_kernels_share_one_shape_and_no_grid_sync() {
        let shape = |name, workgroup_size, grid_sync, global_buffers| LaneKernelShape {
            name,
            workgroup_size,
            grid_sync,
            global_buffers,
        };
        let good = [
            shape("a", [32, 1, 1], false, 3),
            shape("b", [32, 1, 1], false, 9),
        ];
        assert_eq!(check_lane_kernels(&good).unwrap(), [32, 1, 1]);
        let cases = [
            (vec![], "at least one"),
            (
                vec![
                    shape("a", [32, 1, 1], false, 1),
                    shape("b", [64, 1, 1], false, 1),
                ],
                "b has [64, 1, 1]",
            ),
            (vec![shape("g", [32, 1, 1], true, 1)], "g uses grid_sync"),
            (
                vec![shape("w", [32, 1, 1], false, MAX_LANE_BINDINGS + 1)],
                "w binds 65",
            ),
        ];
        for (kernels, expected) in cases {
            let message = check_lane_kernels(&kernels).unwrap_err().to_string();
            assert!(
                message.starts_with("Fix:") && message.contains(expected),
                "{message}"
            );
        }
    }

    /// Locks out a lane request that would wrap the workgroup numbering, overflow the
    /// readback table, the staging or the prologue: each a `Fix:` error; the largest
    /// allowed values pass.
    #[test]
    fn lane_requests_stay_inside_the_record() {
        let reads: Vec<ReadItem> = (0..64).map(|_| item(0, 0, 16)).collect();
        let fits = (reads.as_slice(), H + 64 * 16);
        let largest = check_lane_request("k", [u32::MAX, 1, 1], fits, (4096, 4096), (64, 1 << 31));
        assert!(largest.is_ok());
        let none = (&reads[..0], 256);
        let more: Vec<ReadItem> = (0..65).map(|_| item(0, 0, 0)).collect();
        let small_area = (reads.as_slice(), H + 64 * 16 - 16);
        let refusals = [
            check_lane_request("k", [65536, 65536, 1], none, (0, 0), (0, 0)),
            check_lane_request("k", [1, 1, 1], (&more, 1 << 20), (0, 0), (0, 0)),
            check_lane_request("k", [1, 1, 1], small_area, (0, 0), (0, 0)),
            check_lane_request("k", [1, 1, 1], none, (4112, 4096), (0, 0)),
            check_lane_request("k", [1, 1, 1], none, (0, 0), (1, 1 << 32)),
        ];
        for result in refusals {
            let message = result.unwrap_err().to_string();
            assert!(message.starts_with("Fix:"), "{message}");
        }
    }
}
