//! The host-mapped memory a lane shares with its running kernel, behind a safe API:
//! the only `unsafe` of the lane.
//!
//! # Why it is its own file
//!
//! While a lane lives its kernel reads the doorbells, records and staging and writes
//! the completion word and the result areas, at any time, over PCIe. No Rust
//! reference may point into memory the device writes (a `&[u8]` promises the bytes
//! do not change), so this file keeps the raw host pointer and touches the memory
//! only through atomics (the doorbells, the completion word and the result areas'
//! flagged words, whose ordering is the protocol) and volatile copies (records and
//! staging: at worst a protocol bug writes stale bytes, never undefined behaviour). Every offset is
//! bounded by the layout, so no access leaves the allocation.
//!
//! # Layout (one allocation, zeroed)
//!
//! ```text
//! [0, 128)                       completion word (u64) at 0, the placement word
//!                                (u64, the first candidate's) at 64
//! 128 + 128 (c s + k)            copy k of slot s's doorbell (u64), c copies a slot
//! records  + 4096 s              slot s's request record
//! areas    + 2 area_bytes s      slot s's result area (flagged words: twice its bytes)
//! staging  + staging_bytes s     slot s's input staging
//! ```
//!
//! # Ordering
//!
//! The host writes a slot's record and staging (volatile), then [`LaneMemory::ring`]
//! stores its doorbell with `Release`: x86-64 keeps stores in order and the release
//! keeps the compiler from sinking the copies below it, so the kernel's
//! `ld.acquire.sys` that sees the doorbell orders its loads of the record and staging
//! after them. The result areas need no ordering: each 8-byte word carries its own
//! flag and is read with one atomic load ([`LaneMemory::area_word`]; `flagged` says
//! when a request's words arrived). [`LaneMemory::completed`] loads the completion
//! word (`codegen::ptx::lane` argues the device side).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::codegen::ptx::lane::{
    AREA_WORKGROUPS_BEGUN, AREA_WORKGROUPS_DONE, DOORBELL_STRIDE, FLAGGED_DATA_BYTES,
    FLAGGED_WORD_BYTES, HOST_PLACEMENT, RECORD_BYTES,
};

use super::super::driver::{DriverResult, MappedMemory};
use super::super::LaneStamps;
use super::flagged::HEADER_WORDS;

/// The completion word's line.
const COMPLETION_BYTES: usize = 128;

/// The device addresses the server kernel takes.
#[derive(Clone, Copy, Debug)]
pub(in crate::backend) struct LaneAddresses {
    pub(in crate::backend) completion: u64,
    pub(in crate::backend) doorbells: u64,
    pub(in crate::backend) records: u64,
    pub(in crate::backend) areas: u64,
    pub(in crate::backend) staging: u64,
}

/// A result area's header after completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::backend) struct AreaHeader {
    pub(in crate::backend) start: u64,
    pub(in crate::backend) end: u64,
    pub(in crate::backend) status: u32,
    pub(in crate::backend) ticket: u32,
    /// Nanoseconds from `start` to the first workgroup.
    pub(in crate::backend) workgroups_begun: u32,
    /// Nanoseconds from `start` to every workgroup done.
    pub(in crate::backend) workgroups_done: u32,
}

impl AreaHeader {
    /// The phases its stamps measure (a stamp taken out of order reads as 0).
    pub(in crate::backend) fn stamps(&self) -> LaneStamps {
        let begun = u64::from(self.workgroups_begun);
        let done = u64::from(self.workgroups_done).max(begun);
        LaneStamps {
            setup_ns: begun,
            workgroups_ns: done - begun,
            readback_ns: self.end.saturating_sub(self.start).saturating_sub(done),
        }
    }

    /// The header from its twelve words' data (logical word `i` of the area).
    pub(in crate::backend) fn from_words(words: &[u32; HEADER_WORDS]) -> AreaHeader {
        let word = |at: usize| words[at / FLAGGED_DATA_BYTES];
        let double = |at: usize| u64::from(word(at)) | u64::from(word(at + 4)) << 32;
        AreaHeader {
            start: double(0),
            end: double(8),
            status: word(16),
            ticket: word(20),
            workgroups_begun: word(AREA_WORKGROUPS_BEGUN),
            workgroups_done: word(AREA_WORKGROUPS_DONE),
        }
    }
}

/// The host-mapped memory of one lane.
pub(in crate::backend) struct LaneMemory {
    mapped: MappedMemory,
    slots: usize,
    /// Copies of each slot's doorbell (one per poller warp, at least one).
    copies: usize,
    area_bytes: usize,
    staging_bytes: usize,
}

impl LaneMemory {
    /// Allocate (zeroed) the memory of a lane of `slots` slots.
    pub(in crate::backend) fn allocate(
        slots: usize,
        copies: usize,
        area_bytes: usize,
        staging_bytes: usize,
    ) -> DriverResult<LaneMemory> {
        let copies = copies.max(1);
        let bytes = COMPLETION_BYTES
            + slots * (copies * DOORBELL_STRIDE + RECORD_BYTES + 2 * area_bytes + staging_bytes);
        Ok(LaneMemory {
            mapped: MappedMemory::allocate(bytes)?,
            slots,
            copies,
            area_bytes,
            staging_bytes,
        })
    }

    fn doorbell_at(&self, slot: usize, copy: usize) -> usize {
        COMPLETION_BYTES
            + DOORBELL_STRIDE * (self.copies * slot.min(self.slots - 1) + copy.min(self.copies - 1))
    }

    fn records_at(&self) -> usize {
        COMPLETION_BYTES + DOORBELL_STRIDE * self.copies * self.slots
    }

    fn areas_at(&self) -> usize {
        self.records_at() + RECORD_BYTES * self.slots
    }

    fn staging_at(&self) -> usize {
        self.areas_at() + self.area_stride() * self.slots
    }

    /// Bytes between two slots' areas: twice an area's logical bytes (flagged words).
    pub(in crate::backend) fn area_stride(&self) -> usize {
        2 * self.area_bytes
    }

    /// The device addresses of every part.
    pub(in crate::backend) fn addresses(&self) -> LaneAddresses {
        let at = |offset| self.mapped.device_address(offset);
        LaneAddresses {
            completion: at(0),
            doorbells: at(COMPLETION_BYTES),
            records: at(self.records_at()),
            areas: at(self.areas_at()),
            staging: at(self.staging_at()),
        }
    }

    /// The atomic word of the allocation at byte `offset` (8-byte aligned: every part
    /// starts on a 128-byte boundary of a page-aligned allocation, and an area's words
    /// are 8 bytes each).
    fn word(&self, offset: usize) -> &AtomicU64 {
        debug_assert!(offset.is_multiple_of(8) && offset + 8 <= self.mapped.len());
        // SAFETY: the pointer is inside the allocation (offsets come from the layout,
        // bounded by `slots`), 8-byte aligned (the allocation is page-aligned and every
        // word sits at a multiple of 8), valid for as long as `self` (the memory is
        // freed only by `self.mapped`'s drop), and every access to it on the host and
        // on the device is atomic (`st.relaxed.sys` of whole 8-byte words or elements,
        // `ld.acquire.sys` there; this type's loads and stores here), which is what
        // `AtomicU64::from_ptr` needs.
        unsafe { AtomicU64::from_ptr(self.mapped.host_address().add(offset) as *mut u64) }
    }

    /// The placement word (in the first candidate's completion line): `c + 1` once the
    /// server chose candidate `c`, 0 before.
    pub(in crate::backend) fn placement(&self) -> u64 {
        self.word(HOST_PLACEMENT).load(Ordering::Acquire)
    }

    /// The low 32 bits of the completion word: `n + 1` of the last request served.
    pub(in crate::backend) fn completed(&self) -> u32 {
        self.word(0).load(Ordering::Acquire) as u32
    }

    /// Store slot `slot`'s doorbell, every copy (after its record and staging were
    /// written).
    pub(in crate::backend) fn ring(&self, slot: usize, value: u64) {
        for copy in 0..self.copies {
            self.word(self.doorbell_at(slot, copy))
                .store(value, Ordering::Release);
        }
    }

    /// Copy `bytes` into slot `slot`'s record (at most a record's length).
    pub(in crate::backend) fn write_record(&self, slot: usize, bytes: &[u8]) {
        let at = self.records_at() + RECORD_BYTES * slot.min(self.slots - 1);
        self.write(at, &bytes[..bytes.len().min(RECORD_BYTES)], 0);
    }

    /// Copy `bytes` to `offset` of slot `slot`'s staging and zero `padding` bytes after
    /// them (both cut at the slot's end).
    pub(in crate::backend) fn write_staging(
        &self,
        slot: usize,
        offset: usize,
        bytes: &[u8],
        padding: usize,
    ) {
        let room = self.staging_bytes.saturating_sub(offset);
        let len = bytes.len().min(room);
        let padding = padding.min(room - len);
        let at = self.staging_at()
            + self.staging_bytes * slot.min(self.slots - 1)
            + offset.min(self.staging_bytes);
        self.write(at, &bytes[..len], padding);
    }

    /// Logical word `index` of slot `slot`'s result area (its data and flag; cut at
    /// the area's end).
    pub(in crate::backend) fn area_word(&self, slot: usize, index: usize) -> u64 {
        let words = self.area_bytes / FLAGGED_DATA_BYTES;
        let at = self.areas_at()
            + self.area_stride() * slot.min(self.slots - 1)
            + FLAGGED_WORD_BYTES * index.min(words - 1);
        // Relaxed: the word carries its own flag, and nothing else is read through it.
        self.word(at).load(Ordering::Relaxed)
    }

    /// Rewrite every word of slot `slot`'s area with no data and `flag` (while the
    /// device does not write the slot: before its request rings).
    pub(in crate::backend) fn scrub_area(&self, slot: usize, flag: u32) {
        let start = self.areas_at() + self.area_stride() * slot.min(self.slots - 1);
        let value = u64::from(flag) << 32;
        for at in (start..start + self.area_stride()).step_by(FLAGGED_WORD_BYTES) {
            self.word(at).store(value, Ordering::Relaxed);
        }
    }

    /// Volatile copy of `bytes` to byte `at` of the allocation, then `padding` zeros.
    /// The callers bounded `at + bytes.len() + padding` by the part they write.
    fn write(&self, at: usize, bytes: &[u8], padding: usize) {
        let end = (at + bytes.len() + padding).min(self.mapped.len());
        let base = self.mapped.host_address();
        let mut offset = at;
        let mut source = bytes.chunks(8).map(|chunk| {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            (word, chunk.len())
        });
        while offset < end {
            let (word, len) = source.next().unwrap_or(([0u8; 8], 8));
            let len = len.min(end - offset);
            if len == 8 {
                // SAFETY: `[offset, offset + 8)` is inside the allocation (`end` is cut
                // at its length; `[u8; 8]` has alignment 1); a volatile write the device
                // may race with is defined, and the protocol writes a slot only while
                // the device does not read it.
                unsafe { std::ptr::write_volatile(base.add(offset) as *mut [u8; 8], word) };
            } else {
                for (index, &byte) in word[..len].iter().enumerate() {
                    // SAFETY: as above, one byte inside the allocation.
                    unsafe { std::ptr::write_volatile(base.add(offset + index), byte) };
                }
            }
            offset += len;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Locks out phase figures that misread the server's stamps (the setup, workgroup
    /// and readback phases are consecutive pieces of `end - start`, the workgroup
    /// stamps being offsets from `start`): the phases add up to the kernel stamps and
    /// each is its own difference. Negative control: stamps out of order (a later
    /// phase stamped earlier) give 0 for the phase, never a wrapped huge figure.
    #[test]
    fn area_stamps_split_the_kernel_time_into_phases() {
        let header = AreaHeader {
            start: 1_000,
            end: 1_000 + 2_400,
            status: 0,
            ticket: 7,
            workgroups_begun: 160,
            workgroups_done: 1_120,
        };
        let stamps = header.stamps();
        assert_eq!(stamps.setup_ns, 160);
        assert_eq!(stamps.workgroups_ns, 960);
        assert_eq!(stamps.readback_ns, 1_280);
        assert_eq!(
            stamps.setup_ns + stamps.workgroups_ns + stamps.readback_ns,
            header.end - header.start
        );
        let disordered = AreaHeader {
            workgroups_begun: 500,
            workgroups_done: 400,
            end: 1_000 + 300,
            ..header
        };
        let stamps = disordered.stamps();
        assert_eq!(stamps.workgroups_ns, 0);
        assert_eq!(stamps.readback_ns, 0);
    }
}
