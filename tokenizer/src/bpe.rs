//! Byte-pair merging of one piece, exactly by tiktoken's rule, in time that no
//! input can make quadratic.
//!
//! # The rule
//!
//! A piece starts as its bytes, one part each. While some adjacent pair of parts
//! concatenates to a token, merge the pair whose concatenation has the lowest
//! rank, the leftmost such pair when several have that rank. The ids are the
//! ranks of the final parts, left to right.
//!
//! # Why three paths
//!
//! Measured on this crate's bench (real prose and code): most pieces are whole
//! tokens (` the`, ` function`), so a piece is first looked up as a whole, one
//! table lookup. The rest are short; for them a scan over at most
//! [`SHORT_PIECE_BYTES`] parts kept in fixed arrays on the stack (find the
//! minimum pair rank, merge, re-rank the two pairs the merge touched) is fastest:
//! no allocation, everything in a few cache lines, and `O(n²)` with a small `n`.
//! A longer piece (a run of one letter, a long number in GPT-2's pattern, a
//! base64 blob) would make that scan quadratic in what a user controls, so it
//! goes to [`merge_long`]: parts in arrays indexed by their first byte (a linked
//! list), and every candidate pair in a bucket of its rank. Buckets are taken
//! lowest rank first (a small heap of the ranks that have a bucket), each in
//! increasing start order, so pairs come out by (rank, start): exactly tiktoken's
//! order. An entry is current while the pair at its start still has the rank it
//! was filed under (equal rank means equal bytes, so the same merge); stale ones
//! are skipped. A merge of rank `r` files at most two pairs, each strictly longer
//! than the token `r`, so never into the bucket being drained; it can file into a
//! lower rank, which the rank heap then serves first. Every merge is a few array
//! accesses, two table lookups and two appends: linear in practice for any
//! piece (an earlier binary heap of `(rank, start)` keys took 175–286 ms for
//! 1 MiB of one letter on the 2-core build machine, about 7–10 × real text, its
//! pops missing the cache; the buckets are appended and read in order).
//!
//! # Segments
//!
//! A piece that is no token is merged as its *segments*: the runs of bytes
//! between two adjacent bytes that no token holds side by side
//! ([`Vocabulary::joins`]). No merge joins such bytes (a merged part is a
//! token), so no pair of parts across the cut is ever a token and each side
//! merges exactly as it would alone: the segments' ids, in order, are the
//! piece's. Most byte pairs are joined by no token (cl100k: 58,925 of 65,536),
//! and text whose characters are not tokens themselves is full of them: on
//! the bench's CJK shape (random ideographs, most of them two or three byte
//! tokens in cl100k) a cl100k piece that is no token has 23 bytes and 13.4
//! segments on average, three in four of them one token, the longest 3.8
//! bytes; prose and code pieces hardly split (1.03–1.04 segments a piece).
//! The scan is one bit per byte pair, from an 8 KiB table. On the 2-core
//! build machine (2026-12-04, 4 MiB of each shape, best of three runs
//! alternating with the encoder before segments) CJK took 65.6 against 75.1 ms
//! (cl100k), 98.6 against 113.8 (o200k) and 35.6 against 48.4 (r50k); prose
//! and code stayed within the runs' spread.

use std::cmp::Reverse;
use std::collections::hash_map::Entry;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use crate::vocab::Vocabulary;

/// Pieces up to this many bytes merge by the stack scan; longer ones by rank buckets.
pub const SHORT_PIECE_BYTES: usize = 128;

/// No pair (or a merged-away part) in the rank arrays.
const NONE: u32 = u32::MAX;

/// Hashes a rank (a `u32` key) by one multiplication: the bucket map's keys are
/// ranks, not attacker-chosen strings, and SipHash would cost more than the
/// merge it serves.
#[derive(Default)]
struct RankHasher(u64);

impl Hasher for RankHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0.rotate_left(8) ^ byte as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u32(&mut self, value: u32) {
        self.0 = (value as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// The starts of the pairs filed under one rank.
#[derive(Default)]
struct Bucket {
    starts: Vec<u32>,
    /// Entries before this one are taken.
    taken: usize,
    /// `starts[taken..]` is in increasing order.
    sorted: bool,
}

/// Reusable buffers of the long path: one set per encode call, so long pieces
/// cost their allocations once, and none are kept after the call.
#[derive(Default)]
pub(crate) struct Scratch {
    /// For a part starting at byte `i`: the byte where it ends.
    end: Vec<u32>,
    /// For a part starting at byte `i`: where the part before it starts.
    previous: Vec<u32>,
    /// For a part starting at byte `i`: its rank.
    part_rank: Vec<u32>,
    /// For a part starting at byte `i`: the rank of it joined with the next part
    /// (`NONE` if that is no token, if it is the last part, or if `i` no longer
    /// starts a part).
    pair_rank: Vec<u32>,
    buckets: Vec<Bucket>,
    /// Rank → index into `buckets`, for the ranks with pairs filed.
    bucket_of_rank: HashMap<u32, usize, BuildHasherDefault<RankHasher>>,
    /// Indexes of `buckets` free for reuse.
    free_buckets: Vec<usize>,
    /// The ranks in `bucket_of_rank`, lowest on top.
    ranks: BinaryHeap<Reverse<u32>>,
    /// The two ranks filed last and their buckets (a run of one letter files
    /// long stretches under two ranks, alternating): `NONE` when unset.
    recent: [(u32, usize); 2],
    /// The rank being taken from and its bucket: `NONE` when unset.
    current: (u32, usize),
}

impl Scratch {
    /// Files the pair starting at byte `start` under `rank`.
    fn file(&mut self, rank: u32, start: usize) {
        let index = if self.recent[0].0 == rank {
            self.recent[0].1
        } else if self.recent[1].0 == rank {
            self.recent.swap(0, 1);
            self.recent[0].1
        } else {
            let index = self.bucket_index(rank);
            self.recent = [(rank, index), self.recent[0]];
            index
        };
        let bucket = &mut self.buckets[index];
        let start = start as u32;
        if bucket.starts.last().is_some_and(|&last| last > start) {
            bucket.sorted = false;
        }
        bucket.starts.push(start);
    }

    /// The bucket of `rank`, made (and its rank put on the heap) if there is none.
    fn bucket_index(&mut self, rank: u32) -> usize {
        match self.bucket_of_rank.entry(rank) {
            Entry::Occupied(entry) => *entry.get(),
            Entry::Vacant(entry) => {
                let index = self.free_buckets.pop().unwrap_or_else(|| {
                    self.buckets.push(Bucket::default());
                    self.buckets.len() - 1
                });
                let bucket = &mut self.buckets[index];
                bucket.starts.clear();
                bucket.taken = 0;
                bucket.sorted = true;
                self.ranks.push(Reverse(rank));
                *entry.insert(index)
            }
        }
    }

    /// Clears the caches of bucket indexes.
    fn forget_buckets(&mut self) {
        self.recent = [(NONE, 0); 2];
        self.current = (NONE, 0);
    }

    /// The lowest-ranked filed pair, lowest start first: (rank, start).
    fn take(&mut self) -> Option<(u32, usize)> {
        loop {
            let &Reverse(rank) = self.ranks.peek()?;
            let index = if self.current.0 == rank {
                self.current.1
            } else {
                let index = self.bucket_of_rank.get(&rank).copied()?;
                self.current = (rank, index);
                index
            };
            let bucket = &mut self.buckets[index];
            if !bucket.sorted {
                bucket.starts[bucket.taken..].sort_unstable();
                bucket.sorted = true;
            }
            if let Some(&start) = bucket.starts.get(bucket.taken) {
                bucket.taken += 1;
                return Some((rank, start as usize));
            }
            self.ranks.pop();
            self.bucket_of_rank.remove(&rank);
            self.free_buckets.push(index);
            self.forget_buckets();
        }
    }
}

/// Appends the ids of `piece` to `out`.
#[inline]
pub(crate) fn encode_piece(
    vocabulary: &Vocabulary,
    piece: &[u8],
    out: &mut Vec<u32>,
    scratch: &mut Scratch,
) {
    match piece.len() {
        0 => {}
        1 => out.push(vocabulary.byte_rank(piece[0])),
        _ => {
            if let Some(rank) = vocabulary.rank(piece) {
                out.push(rank);
            } else {
                let mut from = 0;
                for at in 1..piece.len() {
                    if !vocabulary.joins(piece[at - 1], piece[at]) {
                        merge_segment(vocabulary, &piece[from..at], from == 0, out, scratch);
                        from = at;
                    }
                }
                merge_segment(vocabulary, &piece[from..], from == 0, out, scratch);
            }
        }
    }
}

/// Appends the ids of `segment`, a part of a piece between two bytes that no
/// token joins (see [`Vocabulary::joins`]); `whole` says it is the whole piece,
/// which is then known to be no token.
#[inline]
fn merge_segment(
    vocabulary: &Vocabulary,
    segment: &[u8],
    whole: bool,
    out: &mut Vec<u32>,
    scratch: &mut Scratch,
) {
    if segment.len() == 1 {
        out.push(vocabulary.byte_rank(segment[0]));
    } else if let Some(rank) = (!whole).then(|| vocabulary.rank(segment)).flatten() {
        out.push(rank);
    } else if segment.len() <= SHORT_PIECE_BYTES {
        merge_short(vocabulary, segment, out);
    } else {
        merge_long(vocabulary, segment, out, scratch);
    }
}

/// The stack scan for a piece of 2 to [`SHORT_PIECE_BYTES`] bytes.
pub(crate) fn merge_short(vocabulary: &Vocabulary, piece: &[u8], out: &mut Vec<u32>) {
    let len = piece.len();
    debug_assert!((2..=SHORT_PIECE_BYTES).contains(&len));
    // Part i spans piece[start[i]..start[i + 1]]; pair i is parts i and i + 1.
    let mut start = [0u8; SHORT_PIECE_BYTES + 1];
    let mut part_rank = [0u32; SHORT_PIECE_BYTES];
    let mut pair_rank = [NONE; SHORT_PIECE_BYTES];
    for index in 0..len {
        start[index] = index as u8;
        part_rank[index] = vocabulary.byte_rank(piece[index]);
    }
    start[len] = len as u8;
    for index in 0..len - 1 {
        pair_rank[index] = vocabulary
            .pair_rank(piece[index], piece[index + 1])
            .unwrap_or(NONE);
    }
    let mut parts = len;
    loop {
        // Leftmost minimum: strict `<` keeps the first of equal ranks.
        let mut best = NONE;
        let mut at = 0;
        for (index, &rank) in pair_rank[..parts - 1].iter().enumerate() {
            if rank < best {
                best = rank;
                at = index;
            }
        }
        if best == NONE {
            break;
        }
        // Merge parts `at` and `at + 1` into a part of rank `best`.
        part_rank[at] = best;
        start.copy_within(at + 2..=parts, at + 1);
        part_rank.copy_within(at + 2..parts, at + 1);
        if at + 2 < parts - 1 {
            pair_rank.copy_within(at + 2..parts - 1, at + 1);
        }
        parts -= 1;
        let pair = |index: usize| {
            if index + 1 < parts {
                let bytes = &piece[start[index] as usize..start[index + 2] as usize];
                vocabulary.rank(bytes).unwrap_or(NONE)
            } else {
                NONE
            }
        };
        pair_rank[at] = pair(at);
        if at > 0 {
            pair_rank[at - 1] = pair(at - 1);
        }
    }
    out.extend_from_slice(&part_rank[..parts]);
}

/// The bucket path, for a piece of any length up to `u32::MAX` bytes.
pub(crate) fn merge_long(
    vocabulary: &Vocabulary,
    piece: &[u8],
    out: &mut Vec<u32>,
    scratch: &mut Scratch,
) {
    let len = piece.len();
    scratch.end.clear();
    scratch.end.extend(1..=len as u32);
    scratch.previous.clear();
    scratch
        .previous
        .extend((0..len as u32).map(|index| index.wrapping_sub(1)));
    scratch.part_rank.clear();
    scratch
        .part_rank
        .extend(piece.iter().map(|&byte| vocabulary.byte_rank(byte)));
    scratch.pair_rank.clear();
    scratch.pair_rank.extend(
        piece
            .windows(2)
            .map(|pair| vocabulary.rank(pair).unwrap_or(NONE)),
    );
    scratch.pair_rank.push(NONE);
    scratch.forget_buckets();
    for start in 0..len - 1 {
        let rank = scratch.pair_rank[start];
        if rank != NONE {
            scratch.file(rank, start);
        }
    }
    // The rank of the part starting at `first` joined with the one after it.
    let pair_at = |end: &[u32], first: usize| -> u32 {
        let middle = end[first] as usize;
        if middle >= len {
            return NONE;
        }
        let last = end[middle] as usize;
        vocabulary.rank(&piece[first..last]).unwrap_or(NONE)
    };
    while let Some((rank, first)) = scratch.take() {
        if scratch.pair_rank[first] != rank {
            continue; // stale: that pair changed since it was filed
        }
        // Merge the part at `first` with the next one.
        let middle = scratch.end[first] as usize;
        let last = scratch.end[middle] as usize;
        scratch.end[first] = last as u32;
        scratch.part_rank[first] = rank;
        scratch.pair_rank[middle] = NONE;
        if last < len {
            scratch.previous[last] = first as u32;
        }
        let next_pair = pair_at(&scratch.end, first);
        scratch.pair_rank[first] = next_pair;
        if next_pair != NONE {
            scratch.file(next_pair, first);
        }
        if first > 0 {
            let before = scratch.previous[first] as usize;
            let before_pair = pair_at(&scratch.end, before);
            scratch.pair_rank[before] = before_pair;
            if before_pair != NONE {
                scratch.file(before_pair, before);
            }
        }
    }
    let mut at = 0;
    while at < len {
        out.push(scratch.part_rank[at]);
        at = scratch.end[at] as usize;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Encoding;

    /// A seeded generator of numbers below a bound (a linear congruential
    /// step, its high bits): the same pieces on every run.
    fn random_below(seed: u64) -> impl FnMut(u64) -> u64 {
        let mut state = seed;
        move |bound: u64| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) % bound
        }
    }

    /// Locks out the two merge paths drifting apart: the rank buckets give the
    /// stack scan's ids on 5,000 random pieces of 2 to 128 bytes over a small
    /// alphabet (many ties and long merge chains), and the parts join back into
    /// the piece.
    #[test]
    fn buckets_equal_the_scan_on_short_pieces() {
        let vocabulary =
            Vocabulary::from_tiktoken_bytes(Encoding::P50kBase.tiktoken_bytes()).unwrap();
        let mut next = random_below(0x5EED);
        let mut scratch = Scratch::default();
        for case in 0..5_000 {
            let len = 2 + next(SHORT_PIECE_BYTES as u64 - 1) as usize;
            let piece: Vec<u8> = (0..len).map(|_| b" aeinst\n"[next(8) as usize]).collect();
            let (mut scan, mut buckets) = (Vec::new(), Vec::new());
            merge_short(&vocabulary, &piece, &mut scan);
            merge_long(&vocabulary, &piece, &mut buckets, &mut scratch);
            assert_eq!(
                scan,
                buckets,
                "case {case}: {:?}",
                String::from_utf8_lossy(&piece)
            );
            let joined: Vec<u8> = scan
                .iter()
                .flat_map(|&rank| vocabulary.token(rank).unwrap().to_vec())
                .collect();
            assert_eq!(joined, piece);
        }
    }

    /// Random pieces whose bytes are drawn from ASCII letters, spaces and the
    /// bytes of 3-byte characters (CJK ideographs and their fragments): many
    /// adjacent pairs that no token joins.
    fn mixed_pieces(count: usize) -> Vec<Vec<u8>> {
        let mut next = random_below(0x5E6_0E17);
        let alphabet: Vec<u8> = b" aeknst"
            .iter()
            .copied()
            .chain([0xE4, 0xE5, 0xE6, 0xE9, 0x80, 0x8C, 0x9A, 0xAD, 0xB8, 0xBF])
            .collect();
        (0..count)
            .map(|_| {
                let len = 2 + next(200) as usize;
                (0..len)
                    .map(|_| alphabet[next(alphabet.len() as u64) as usize])
                    .collect()
            })
            .collect()
    }

    /// Locks out a cut that changes ids: a piece encoded as its segments
    /// between bytes no token joins ([`encode_piece`]) gets the ids of the
    /// whole piece merged at once (the stack scan or the buckets), for every
    /// encoding on 3,000 random pieces of 2 to 201 bytes mixing letters and
    /// the bytes of CJK characters, and the pieces do split (more than two
    /// segments a piece on average). Negative control: cutting also between
    /// bytes that a token joins (between every two bytes) changes some
    /// piece's ids.
    #[test]
    fn segments_between_unjoined_bytes_encode_as_the_whole_piece() {
        let pieces = mixed_pieces(3_000);
        let mut scratch = Scratch::default();
        for encoding in Encoding::ALL {
            let vocabulary = Vocabulary::from_tiktoken_bytes(encoding.tiktoken_bytes()).unwrap();
            let whole = |piece: &[u8], scratch: &mut Scratch| {
                let mut ids = Vec::new();
                match vocabulary.rank(piece) {
                    Some(rank) => ids.push(rank),
                    None if piece.len() <= SHORT_PIECE_BYTES => {
                        merge_short(&vocabulary, piece, &mut ids)
                    }
                    None => merge_long(&vocabulary, piece, &mut ids, scratch),
                }
                ids
            };
            let (mut segments, mut differs_if_cut_anywhere) = (0, 0);
            for piece in &pieces {
                let mut ids = Vec::new();
                encode_piece(&vocabulary, piece, &mut ids, &mut scratch);
                assert_eq!(
                    ids,
                    whole(piece, &mut scratch),
                    "{} {piece:02X?}",
                    encoding.name()
                );
                segments += 1 + piece
                    .windows(2)
                    .filter(|pair| !vocabulary.joins(pair[0], pair[1]))
                    .count();
                // The control: a cut between every two bytes leaves only
                // single bytes.
                let single: Vec<u32> = piece
                    .iter()
                    .map(|&byte| vocabulary.byte_rank(byte))
                    .collect();
                differs_if_cut_anywhere += usize::from(single != ids);
            }
            assert!(
                segments > 2 * pieces.len(),
                "{}: {segments} segments",
                encoding.name()
            );
            assert!(differs_if_cut_anywhere > 0, "{}", encoding.name());
        }
    }
}
