//! Host memory that a core has read, handed from that core's caches back to
//! the CPU's shared last-level cache before the device writes it again.
//!
//! # Why this module exists
//!
//! A kernel that writes its results straight into host-mapped memory
//! ([`DeviceBuffer::is_host_mapped`](super::DeviceBuffer::is_host_mapped))
//! writes each cache line across PCIe; where a core has read that line since
//! the last write, the line sits in that core's caches and the write must
//! first take it away from the core. On an H100 host (Intel Xeon, 2 MiB of L2
//! per core and a shared L3, 2026-12-07; the tokenizer's `gpu_encode` bench,
//! one 256 KiB document encoded again and again by a graph whose kernel
//! writes its ids into host-mapped memory, two rounds each) an encode took,
//! with the previous ids read by the host / never read / read and then
//! demoted line by line ([`demote_from_core_caches`]) / read and then flushed
//! to memory (`clflush`): prose 86.1–87.2 / 73.8–73.9 / 73.8–76.1 /
//! 96.6–103.5 µs, CJK (806 KiB of ids) 100.7–105.1 / 80.1–80.2 / 81.5–82.8 /
//! 111.5–114.5, code 89.7–89.8 / 82.2–82.6 / 81.8–82.3 / 105.4–106.2; the
//! kernel alone (its own clock), CJK, 78.6–85.2 µs read and 66.8–70.3
//! demoted. So a read costs the next write 8–20 µs, a line demoted to the
//! shared cache nothing, and one flushed to memory more than the read.
//!
//! The demote is not free: about 6 ns a line on that host. Demoted by the
//! threads that copy ids out of host-mapped memory, right after their copy
//! (the same day, alternating builds), it cost the copy more than it saved
//! the next kernel (one 256 KiB document eagerly, prose 85.7–87.3 → 97.2–98.8
//! µs, CJK 96.1–97.0 → 119.0–123.5); done while the device computes, by the
//! thread that read the ids, it costs nothing as long as it ends before the
//! device writes (see the tokenizer's `EncodeGraph::encode_in_place`).
//!
//! x86-64's `cldemote` acts on the caches of the core that runs it, so a
//! range is demoted by the thread that read it. It is a hint: it neither
//! reads nor writes the bytes, and CPUs without it execute it as a no-op
//! (elsewhere than x86-64 the function does nothing).

/// Bytes of a CPU cache line.
const LINE_BYTES: usize = 64;

/// The address of the first byte of every cache line that the `len` bytes
/// from `address` touch, from the first byte's line on.
fn line_addresses(address: usize, len: usize) -> impl Iterator<Item = usize> {
    let first_line = address / LINE_BYTES * LINE_BYTES;
    let lines = match len {
        0 => 0,
        _ => (address + len - first_line).div_ceil(LINE_BYTES),
    };
    (0..lines).map(move |line| first_line + line * LINE_BYTES)
}

/// Demotes every cache line that `data` touches from the calling core's
/// caches to the CPU's shared last-level cache (x86-64's `cldemote`), so that
/// a device that writes it next does not wait for this core to give it up.
/// Neither reads nor writes `data` (another agent may be writing it: a slice
/// of atomics, such as [`DeviceBuffer::host_words`](super::DeviceBuffer::host_words),
/// says so).
pub fn demote_from_core_caches<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    for address in line_addresses(data.as_ptr() as usize, std::mem::size_of_val(data)) {
        // SAFETY: `0F 1C /0` with ModRM 0x00 is `cldemote byte ptr [rax]`, a
        // hint that neither reads nor writes memory and only moves a line's
        // copy between caches (CPUs without it execute that hint space as a
        // no-op); the address is the start of a line holding a byte of
        // `data`, which the borrow keeps mapped, so it cannot fault; the
        // instruction touches no stack, no flags and no register but `rax`,
        // which it only reads.
        unsafe {
            std::arch::asm!(
                ".byte 0x0f, 0x1c, 0x00",
                in("rax") address,
                options(nostack, preserves_flags, readonly)
            );
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Locks out a demote that misses a line: the lines of a range that
    /// starts inside one and ends inside another are every line it touches,
    /// once each, from the first byte's line on; an empty range has none.
    /// Negative control: counting `len / 64` lines (the bug this guards
    /// against) gives 1 for the 64 bytes from offset 60, which touch 2.
    #[test]
    fn every_line_a_range_touches_is_listed_once() {
        let lines = |address, len| line_addresses(address, len).collect::<Vec<usize>>();
        assert_eq!(lines(1024 + 60, 64), [1024, 1088]);
        assert_eq!(lines(1024, 64), [1024]);
        assert_eq!(lines(1024, 65), [1024, 1088]);
        assert_eq!(lines(1024 + 63, 1), [1024]);
        assert_eq!(lines(1024 + 5, 0), Vec::<usize>::new());
        assert_eq!(lines(0, 256), [0, 64, 128, 192]);
        assert_ne!(64 / LINE_BYTES, lines(1024 + 60, 64).len());
    }

    /// Locks out a demote that changes or faults on the bytes it is given
    /// (the instruction's encoding, or an address outside the range): a
    /// vector's words are the same after every range of them is demoted,
    /// including ranges that start and end inside lines.
    #[test]
    fn demoting_changes_no_byte() {
        let words: Vec<u32> = (0..10_000u32)
            .map(|word| word.wrapping_mul(2_654_435_761))
            .collect();
        let before = words.clone();
        for (start, end) in [
            (0, 10_000),
            (3, 17),
            (1, 2),
            (5_000, 5_000),
            (9_999, 10_000),
        ] {
            demote_from_core_caches(&words[start..end]);
        }
        assert_eq!(words, before);
    }
}
