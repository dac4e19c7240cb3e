//! The host's reading of a result area of flagged words: which words a request waits
//! for, whether they arrived, their data bytes, and when a slot's area is scrubbed so
//! that no stale word can pass for a new one.
//!
//! # Why
//!
//! The server used to copy a request's readback bytes into the slot's area with weak
//! stores and then store the completion word with `st.release.sys`; that release waited
//! for the area's writes to reach host memory before the word even left (0.61 µs of a
//! 4.22 µs request on the H200, 2026-12-01). Now every 8-byte word of the area carries 4
//! data bytes and the request's flag (`codegen::ptx::lane::FLAGGED_WORD_BYTES`), so a
//! word has arrived when its flag is the request's, whatever order the words travel in,
//! and nothing on the device waits for them. Pure: words are read through a closure, so
//! every rule here is tested on the CPU.
//!
//! # Stale words and wraparound
//!
//! A slot's area is reused by tickets `n + slots`, `n + 2 slots`, ...; flags are
//! `ticket + 1` (low 32 bits), so a word left by an earlier request of the slot has
//! another flag as long as the two tickets are less than 2^32 apart. Words an earlier
//! request wrote but later (smaller) requests did not may stay for any number of
//! requests, so the host scrubs: the first request of a slot in each window of 2^31
//! tickets (`ticket >> 31`) finds the slot's whole area rewritten with the flag of the
//! ticket before it ([`scrub_flag`]; the allocation's zeros serve window 0, whose flags
//! are 1 to 2^31). Within a window every request `n` of the slot follows the scrub's
//! ticket `n0` by less than 2^31: a scrubbed word's flag `f(n0 - 1)` equals `f(n)` only
//! if `n - n0 + 1` is a multiple of 2^32, and a word of request `m` (`n0 ≤ m < n`) only
//! if `n - m` is; neither can be. The scrub writes `area bytes` of host memory once per
//! slot per 2^31 requests.

use std::ops::Range;

use smallvec::SmallVec;

use crate::backend::INLINE_ITEMS;
use crate::codegen::ptx::lane::{
    area_flag, AREA_HEADER_BYTES, FLAGGED_DATA_BYTES, FLAGGED_WORD_BYTES,
};

/// Words of the area's header.
pub(in crate::backend) const HEADER_WORDS: usize = AREA_HEADER_BYTES / FLAGGED_DATA_BYTES;

/// The flag of a flagged word.
pub(in crate::backend) fn flag_of_word(word: u64) -> u32 {
    (word >> 32) as u32
}

/// The logical words holding area bytes `[offset, offset + len)` (none when empty).
pub(in crate::backend) fn words_of(offset: usize, len: usize) -> Range<usize> {
    if len == 0 {
        return 0..0;
    }
    offset / FLAGGED_DATA_BYTES..(offset + len).div_ceil(FLAGGED_DATA_BYTES)
}

/// Whether a slot whose area was last scrubbed for window `scrubbed` must be scrubbed
/// before request `ticket` (see the module docs); the new window when so.
pub(in crate::backend) fn scrub_window(scrubbed: u64, ticket: u64) -> Option<u64> {
    let window = ticket >> 31;
    (window != scrubbed).then_some(window)
}

/// The flag a scrub before request `ticket` writes: the previous ticket's, which no
/// request of the window can carry.
pub(in crate::backend) fn scrub_flag(ticket: u64) -> u32 {
    area_flag(ticket.wrapping_sub(1))
}

/// How far the arrival check of one request got: every word of `ranges[..range]` and
/// the words of `ranges[range]` below `word` carried the flag. Resumable: a wait polls
/// [`Arrival::advance`] until it returns `true`, and no word is looked at twice once it
/// arrived (a word, once written for a request, stays until the slot's next request).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(in crate::backend) struct Arrival {
    range: usize,
    word: usize,
}

impl Arrival {
    /// Look at the words not yet seen, in order, up to the first whose flag is not
    /// `flag`; `true` once every word of every range carried it. `read(i)` reads
    /// logical word `i` of the slot's area; the words that carry the flag are handed
    /// to `land(range index, first word index, data)` once, in runs of consecutive
    /// words of one range (at most [`RUN_WORDS`]), as they are seen (so the host reads
    /// every word of host memory once: see [`Landing`]).
    pub(in crate::backend) fn advance(
        &mut self,
        ranges: impl IntoIterator<Item = Range<usize>> + Clone,
        read: impl Fn(usize) -> u64,
        flag: u32,
        mut land: impl FnMut(usize, usize, &[u32]),
    ) -> bool {
        let mut run = [0u32; RUN_WORDS];
        for (index, words) in ranges.clone().into_iter().enumerate().skip(self.range) {
            if index > self.range {
                if self.range == 0 {
                    touch_lines(ranges.clone(), &read);
                }
                self.range = index;
                self.word = words.start;
            }
            let mut word = self.word.max(words.start);
            while word < words.end {
                let first = word;
                let mut arrived = 0;
                while word < words.end && arrived < RUN_WORDS {
                    let value = read(word);
                    if flag_of_word(value) != flag {
                        break;
                    }
                    run[arrived] = value as u32;
                    arrived += 1;
                    word += 1;
                }
                if arrived > 0 {
                    land(index, first, &run[..arrived]);
                }
                if word < words.end && arrived < RUN_WORDS {
                    self.word = word;
                    return false;
                }
            }
            self.word = words.end;
        }
        self.range = usize::MAX;
        true
    }
}

/// Most words [`Arrival::advance`] hands to its `land` at once: a 64-byte item.
pub(in crate::backend) const RUN_WORDS: usize = 16;

/// Words of a 64-byte cache line (8-byte flagged words).
const LINE_WORDS: usize = 64 / FLAGGED_WORD_BYTES;

/// One load of each cache line of the items' words (every range after the header's),
/// all independent, once the header has arrived: the server writes the header after
/// the outputs, so their lines are most likely in host memory by then, and the loads'
/// misses overlap instead of coming one line after another as the landing reaches
/// each line (it spends a few nanoseconds on each word, so a line's miss would start
/// only when the line before it is done). The values are not used: a word counts only
/// when [`Arrival::advance`] reads it with its flag.
fn touch_lines(ranges: impl IntoIterator<Item = Range<usize>>, read: &impl Fn(usize) -> u64) {
    for words in ranges.into_iter().skip(1) {
        let first_line = words.start / LINE_WORDS;
        let last_line = words.end.div_ceil(LINE_WORDS);
        for line in first_line..last_line {
            std::hint::black_box(read((line * LINE_WORDS).max(words.start)));
        }
    }
}

/// Where a request's words land as they arrive: the header's data words, and each
/// readback item's bytes in its destination (the caller's slice, or its place in the
/// packed outputs).
///
/// # Why
///
/// The host used to check every word's flag while it waited and then read the words
/// again to copy the data out. The second pass read lines the device had written
/// over PCIe, and on the H200 (2026-12-02) the delivery after the last word arrived
/// took 1.07–1.11 µs for a request reading back 16 items of 16 bytes, against
/// 0.32–0.40 µs for 8. The likely cause: a line the host read while the device was
/// still writing it was written again, so the second pass missed the cache on lines
/// the first had already read. Copying each word as its flag is seen reads every word
/// once, and the copies happen while the later words are still on their way.
pub(in crate::backend) struct Landing<'a> {
    /// The header's data words (range 0 of [`request_words`]).
    pub(in crate::backend) header: [u32; HEADER_WORDS],
    /// Per readback item (range `i + 1`): its area offset and its destination.
    items: SmallVec<[(usize, &'a mut [u8]); INLINE_ITEMS]>,
}

impl<'a> Landing<'a> {
    /// Items delivered from area `(offset, length)` each into `destinations`, in order
    /// (each exactly its item's length: the plan checked the caller's slices).
    pub(in crate::backend) fn new(
        deliveries: &[(usize, usize)],
        destinations: impl IntoIterator<Item = &'a mut [u8]>,
    ) -> Landing<'a> {
        Landing {
            header: [0; HEADER_WORDS],
            items: deliveries
                .iter()
                .map(|&(offset, _)| offset)
                .zip(destinations)
                .collect(),
        }
    }

    /// Land consecutive words of range `range` of [`request_words`] from word `first`
    /// (their data bytes `data`, a word each).
    pub(in crate::backend) fn words(&mut self, range: usize, first: usize, data: &[u32]) {
        match range.checked_sub(1) {
            None => {
                let header = self.header.iter_mut().skip(first);
                for (slot, &word) in header.zip(data) {
                    *slot = word;
                }
            }
            Some(item) => {
                if let Some((offset, out)) = self.items.get_mut(item) {
                    land(first, data, *offset, out);
                }
            }
        }
    }
}

/// `bytes` cut into consecutive pieces of `lengths` (the packed outputs' items).
pub(in crate::backend) fn split_into_items(
    mut bytes: &mut [u8],
    lengths: impl IntoIterator<Item = usize>,
) -> SmallVec<[&mut [u8]; INLINE_ITEMS]> {
    let mut items = SmallVec::new();
    for length in lengths {
        let length = length.min(bytes.len());
        let (item, rest) = std::mem::take(&mut bytes).split_at_mut(length);
        items.push(item);
        bytes = rest;
    }
    items
}

/// Copy the data bytes of consecutive area words from `first` (`data`, a word each:
/// word `w` holds area bytes `[4 w, 4 w + 4)`) that lie in area bytes `[offset,
/// offset + out.len())` to their place in `out`.
///
/// Items start 4-byte aligned in the area (the plan puts each on 16 bytes), so every
/// word but an item's last partial one lands whole: a store of a known length each,
/// where copying a word's bytes by a computed range called `memcpy` for four bytes
/// (about 440 against 270 ns a request of 8 items of 16 bytes on the 2-core build
/// machine, 2026-12-03, landing alone).
fn land(first: usize, data: &[u32], offset: usize, out: &mut [u8]) {
    let start = first * FLAGGED_DATA_BYTES;
    if offset.is_multiple_of(FLAGGED_DATA_BYTES) && start >= offset {
        let Some(destination) = out.get_mut(start - offset..) else {
            return;
        };
        let mut whole = destination.chunks_exact_mut(FLAGGED_DATA_BYTES);
        let mut words = data.iter();
        for (bytes, word) in (&mut whole).zip(&mut words) {
            bytes.copy_from_slice(&word.to_le_bytes());
        }
        let rest = whole.into_remainder();
        if let Some(word) = words.next() {
            let len = rest.len();
            rest.copy_from_slice(&word.to_le_bytes()[..len]);
        }
        return;
    }
    for (k, &word) in data.iter().enumerate() {
        land_word(first + k, word, offset, out);
    }
}

/// [`land`] for one word, at any offset.
fn land_word(word: usize, data: u32, offset: usize, out: &mut [u8]) {
    let word_start = word * FLAGGED_DATA_BYTES;
    let from = offset.max(word_start);
    let to = (offset + out.len()).min(word_start + FLAGGED_DATA_BYTES);
    if from < to {
        out[from - offset..to - offset]
            .copy_from_slice(&data.to_le_bytes()[from - word_start..to - word_start]);
    }
}

/// The words a request waits for: the header's, then those of every delivery
/// (`(area offset, length)` per item).
pub(in crate::backend) fn request_words(
    deliveries: &[(usize, usize)],
) -> impl Iterator<Item = Range<usize>> + Clone + '_ {
    std::iter::once(0..HEADER_WORDS).chain(
        deliveries
            .iter()
            .map(|&(offset, len)| words_of(offset, len)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// An area of `words` words as the device leaves it: `bytes` written for `ticket`
    /// at logical `offset` (whole words, as the server writes them), the rest `stale`.
    fn area(words: usize, stale: u64) -> RefCell<Vec<u64>> {
        RefCell::new(vec![stale; words])
    }

    fn write(area: &RefCell<Vec<u64>>, offset: usize, bytes: &[u8], ticket: u64) {
        let flag = u64::from(area_flag(ticket)) << 32;
        let mut padded = vec![0u8; offset % 4];
        padded.extend_from_slice(bytes);
        padded.resize(padded.len().div_ceil(4) * 4, 0);
        for (index, chunk) in padded.chunks(4).enumerate() {
            let mut data = [0u8; 4];
            data.copy_from_slice(chunk);
            let word = offset / 4 + index;
            let old = area.borrow()[word];
            // Bytes of the word outside the item keep their place (a window writes its
            // whole block; the host reads only the item's bytes).
            let mut merged = (old as u32).to_le_bytes();
            for (k, byte) in data.iter().enumerate() {
                let logical = word * 4 + k;
                if logical >= offset && logical < offset + bytes.len() {
                    merged[k] = *byte;
                }
            }
            area.borrow_mut()[word] = flag | u64::from(u32::from_le_bytes(merged));
        }
    }

    fn header(area: &RefCell<Vec<u64>>, ticket: u64) {
        write(area, 0, &[7u8; AREA_HEADER_BYTES], ticket);
    }

    /// Locks out a delivery before every word arrived, one that waits forever for
    /// words that did, and one that lands a word's bytes in the wrong place or from a
    /// word that had not arrived: with the header and two items written (one at an
    /// unaligned offset, as a window's item inside its block), the check completes and
    /// the bytes land exactly, the header's words too. Negative controls: with one word
    /// of the second item missing (its flag still an earlier request's) the check stops
    /// at that word and lands nothing of it, and it completes once the word arrives,
    /// without looking at (or landing) earlier words again.
    #[test]
    fn a_request_is_delivered_once_every_word_carries_its_flag() {
        let ticket = 41;
        let flag = area_flag(ticket);
        let memory = area(64, u64::from(area_flag(ticket - 4)) << 32);
        let deliveries = [(48, 16), (64 + 5, 7)];
        header(&memory, ticket);
        write(
            &memory,
            48,
            &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16],
            ticket,
        );
        // The second item's first word only: its last word is missing.
        write(&memory, 64 + 5, &[21, 22, 23], ticket);
        let reads = RefCell::new(Vec::new());
        let read = |word: usize| {
            reads.borrow_mut().push(word);
            memory.borrow()[word]
        };
        let mut first = [0u8; 16];
        let mut second = [0xEEu8; 7];
        let mut landing = Landing::new(&deliveries, [&mut first[..], &mut second[..]]);
        let mut landed = 0;
        let mut arrival = Arrival::default();
        let mut land = |range: usize, word: usize, data: &[u32]| {
            landed += data.len();
            landing.words(range, word, data);
        };
        assert!(!arrival.advance(request_words(&deliveries), read, flag, &mut land));
        assert_eq!(reads.borrow().last(), Some(&((64 + 8) / 4)));
        write(&memory, 64 + 5, &[21, 22, 23, 24, 25, 26, 27], ticket);
        reads.borrow_mut().clear();
        assert!(arrival.advance(request_words(&deliveries), read, flag, &mut land));
        assert_eq!(*reads.borrow(), vec![(64 + 8) / 4]);
        // Every word of the three ranges once: the header's, 4 and 2 of the items.
        assert_eq!(landed, HEADER_WORDS + 4 + 2);
        let header = landing.header;
        drop(landing);
        assert!(header
            .iter()
            .all(|&word| word == u32::from_le_bytes([7; 4])));
        assert_eq!(
            first,
            [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
        );
        assert_eq!(second, [21, 22, 23, 24, 25, 26, 27]);
    }

    /// Locks out a touch of the items' lines that misses a line (its miss would come
    /// back one line after another during the landing) or reads outside the items:
    /// once the header has arrived, one word of every 64-byte line of each item's
    /// words is read, the first of the item's on its first line, and no word of the
    /// header or past an item. Negative control: while the header has not arrived,
    /// nothing past it is read.
    #[test]
    fn the_items_lines_are_touched_once_the_header_arrived() {
        let ticket = 9;
        let flag = area_flag(ticket);
        // Item words 12..16 (one line, from its fifth word) and 20..37 (three lines).
        let deliveries = [(48, 16), (80, 68)];
        let memory = area(64, 0);
        let reads = RefCell::new(Vec::new());
        let read = |word: usize| {
            reads.borrow_mut().push(word);
            memory.borrow()[word]
        };
        let mut arrival = Arrival::default();
        assert!(!arrival.advance(request_words(&deliveries), read, flag, |_, _, _| {}));
        assert_eq!(*reads.borrow(), vec![0]);
        header(&memory, ticket);
        reads.borrow_mut().clear();
        assert!(!arrival.advance(request_words(&deliveries), read, flag, |_, _, _| {}));
        let touched: Vec<usize> = reads.borrow()[HEADER_WORDS..HEADER_WORDS + 4].to_vec();
        assert_eq!(touched, vec![12, 20, 24, 32]);
        assert_eq!(reads.borrow()[HEADER_WORDS + 4..], [12]);
    }

    /// Locks out bytes landed at the wrong place or lost where a run of words is cut:
    /// an aligned item longer than a run (25 words, its last partial) and an
    /// unaligned one (offset 2 past a word) land byte for byte, runs of at most
    /// `RUN_WORDS` words each, every word once. Negative control: with the aligned
    /// item's 20th word missing, its first 19 words land and nothing after them.
    #[test]
    fn runs_land_long_partial_and_unaligned_items_exactly() {
        let ticket = 77;
        let flag = area_flag(ticket);
        let deliveries = [(48, 99), (150, 70)];
        let aligned: Vec<u8> = (0..99).map(|k| k as u8 ^ 0x5A).collect();
        let unaligned: Vec<u8> = (0..70).map(|k| 200u8.wrapping_sub(k as u8)).collect();
        let memory = area(64, 0);
        header(&memory, ticket);
        write(&memory, 48, &aligned, ticket);
        write(&memory, 150, &unaligned, ticket);
        let missing = 48 / 4 + 19;
        let kept = memory.borrow()[missing];
        memory.borrow_mut()[missing] = 0;
        let read = |word: usize| memory.borrow()[word];
        let mut first = vec![0u8; 99];
        let mut second = vec![0u8; 70];
        let mut runs = Vec::new();
        {
            let mut landing = Landing::new(&deliveries, [&mut first[..], &mut second[..]]);
            let mut arrival = Arrival::default();
            let mut land = |range: usize, word: usize, data: &[u32]| {
                runs.push((range, word, data.len()));
                landing.words(range, word, data);
            };
            assert!(!arrival.advance(request_words(&deliveries), read, flag, &mut land));
            memory.borrow_mut()[missing] = kept;
            assert!(arrival.advance(request_words(&deliveries), read, flag, &mut land));
        }
        assert_eq!(first, aligned);
        assert_eq!(second, unaligned);
        assert!(runs
            .iter()
            .all(|&(_, _, len)| (1..=RUN_WORDS).contains(&len)));
        let item_words: usize = runs.iter().filter(|r| r.0 > 0).map(|r| r.2).sum();
        assert_eq!(item_words, 25 + words_of(150, 70).len());
        // Before the missing word came: the aligned item's first 19 words, in runs of
        // 16 and 3, and nothing of the unaligned item.
        assert_eq!(runs[1..3], [(1, 12, 16), (1, 28, 3)]);
    }

    /// Locks out packed outputs cut at the wrong places: the items' lengths cut one
    /// buffer into consecutive pieces, an empty item is an empty piece, and lengths
    /// past the buffer's end give short pieces, never a panic.
    #[test]
    fn packed_outputs_split_into_their_items() {
        let mut bytes: Vec<u8> = (0..10).collect();
        let items = split_into_items(&mut bytes, [3, 0, 7]);
        let lengths: Vec<usize> = items.iter().map(|item| item.len()).collect();
        assert_eq!(lengths, [3, 0, 7]);
        assert_eq!(&*items[2], &[3, 4, 5, 6, 7, 8, 9]);
        let mut short = [0u8; 4];
        let lengths: Vec<usize> = split_into_items(&mut short, [3, 3])
            .iter()
            .map(|item| item.len())
            .collect();
        assert_eq!(lengths, [3, 1]);
    }

    /// Locks out a header or item taken from an earlier request of the slot: words
    /// carrying the flag of the slot's previous request (`n - slots`), or of any other
    /// ticket, never count as arrived. Negative control: the same words with the
    /// request's own flag complete the check.
    #[test]
    fn stale_words_of_earlier_requests_never_count() {
        let slots = 4;
        let ticket = 1_000;
        let memory = area(32, 0);
        for stale in [ticket - slots, ticket - 1, ticket + 1, ticket - 2 * slots] {
            header(&memory, stale);
            write(&memory, 48, &[9; 16], stale);
            let read = |word: usize| memory.borrow()[word];
            let mut arrival = Arrival::default();
            assert!(!arrival.advance(
                request_words(&[(48, 16)]),
                read,
                area_flag(ticket),
                |_, _, _| {}
            ));
        }
        header(&memory, ticket);
        write(&memory, 48, &[9; 16], ticket);
        let read = |word: usize| memory.borrow()[word];
        let mut arrival = Arrival::default();
        assert!(arrival.advance(
            request_words(&[(48, 16)]),
            read,
            area_flag(ticket),
            |_, _, _| {}
        ));
    }

    /// Locks out the wraparound of 32-bit flags: the ticket whose flag is 0
    /// (2^32 - 1) and the first of the next window are scrubbed before, so the words
    /// a large request left 2^32 tickets earlier (the same flag) and the allocation's
    /// zeros cannot pass for them; within a window no scrub is due. Negative control:
    /// without the scrub, the word left 2^32 tickets earlier matches.
    #[test]
    fn flags_stay_distinct_across_the_wraparound() {
        assert_eq!(area_flag(u32::MAX as u64), 0);
        assert_eq!(scrub_window(0, 5), None);
        assert_eq!(scrub_window(0, (1 << 31) - 1), None);
        assert_eq!(scrub_window(0, 1 << 31), Some(1));
        assert_eq!(scrub_window(1, u32::MAX as u64), None);
        assert_eq!(scrub_window(1, 1 << 32), Some(2));
        // A request at ticket 3 left a word; 2^32 tickets later the same slot (slot of
        // the low 32 bits) serves a request with the same flag.
        let early = 3u64;
        let late = early + (1 << 32);
        assert_eq!(area_flag(early), area_flag(late));
        let memory = area(HEADER_WORDS + 4, 0);
        write(&memory, 48, &[5; 16], early);
        header(&memory, late);
        let read = |word: usize| memory.borrow()[word];
        let words = || request_words(&[(48, 16)]);
        assert!(Arrival::default().advance(words(), read, area_flag(late), |_, _, _| {}));
        // The scrub for the late request's window (due: its window differs from the
        // slot's last) rewrites every word with the previous ticket's flag.
        let window = scrub_window(0, late);
        assert!(window.is_some());
        let scrub = u64::from(scrub_flag(late)) << 32;
        memory
            .borrow_mut()
            .iter_mut()
            .for_each(|word| *word = scrub);
        header(&memory, late);
        let read = |word: usize| memory.borrow()[word];
        assert!(!Arrival::default().advance(words(), read, area_flag(late), |_, _, _| {}));
        // Every ticket of a window differs from its scrub's flag and its own earlier ones.
        for first in [1u64 << 31, (1 << 32) - 3, 5 << 31] {
            let scrubbed = scrub_flag(first);
            for later in [first, first + 1, first + (1 << 31) - 1 - first % (1 << 31)] {
                assert_ne!(area_flag(later), scrubbed, "{first} {later}");
            }
        }
        // Window 0's zeros: no ticket of window 0 has flag 0.
        assert_ne!(area_flag(0), 0);
        assert_ne!(area_flag((1 << 31) - 1), 0);
    }

    /// Locks out an empty request (nothing read back) that never completes or one
    /// that completes on the header alone while an item is missing: only the header
    /// words are waited for when there are no items, and an empty item adds none.
    #[test]
    fn the_header_alone_completes_a_request_with_nothing_read_back() {
        let ticket = 8;
        let memory = area(HEADER_WORDS + 8, 0);
        header(&memory, ticket);
        let read = |word: usize| memory.borrow()[word];
        assert!(Arrival::default().advance(
            request_words(&[]),
            read,
            area_flag(ticket),
            |_, _, _| {}
        ));
        assert!(Arrival::default().advance(
            request_words(&[(48, 0)]),
            read,
            area_flag(ticket),
            |_, _, _| {}
        ));
        assert!(!Arrival::default().advance(
            request_words(&[(48, 4)]),
            read,
            area_flag(ticket),
            |_, _, _| {}
        ));
        assert_eq!(words_of(48, 0), 0..0);
        assert_eq!(words_of(49, 3), 12..13);
        assert_eq!(words_of(49, 4), 12..14);
    }
}
