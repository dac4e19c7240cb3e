//! The vocabulary as the device reads it: one array of `u32` words (a header,
//! the rank of every single byte, the rank of every 2-byte token, each rank's
//! bytes and length, an open-addressing table of the longer tokens keyed by
//! their bytes, and the pair table keyed by two ranks) and the tokens' bytes
//! back to back. Built once per tokenizer on the host and uploaded once;
//! resident for as long as the encoder lives.
//!
//! # Why this layout
//!
//! The device asks two questions. `pieces` asks "is this piece of the text a
//! token, and of which rank" once per piece (most pieces are whole tokens):
//! the candidate is a substring of the text the device already holds, so that
//! table is keyed by bytes. Single bytes and byte pairs (also the merge loop's
//! first round of pair ranks for every piece) are dense arrays: one load, no
//! hashing, 257 KiB that stay in the device's L2 cache. Longer keys hash their
//! bytes and probe linearly; a slot holds the key's full 32-bit hash and its
//! length beside the rank, so a probe that meets another key rejects it
//! without touching the token's bytes, and only a probe that matches both
//! compares the bytes.
//!
//! The merge loop asks "what is the rank of these two adjacent parts merged".
//! In tiktoken's loop every part of a piece is a token (every single byte is
//! one in all four encodings, and a merge only ever makes a token), so the
//! answer depends only on the two parts' ranks: the **pair table** maps
//! `(rank A, rank B)` to the rank of `bytes(A)‖bytes(B)`, with one entry for
//! every token `T` and every cut of its bytes into two tokens (a pair has at
//! most one: its bytes are fixed). A lookup hashes the two ranks ([`pair_hash`])
//! and reads the bucket the hash names: [`PAIR_BUCKET_SLOTS`] slots of two
//! adjacent words ([`pair_slot`]: both ranks and the merged one in 54 bits, an
//! empty slot all ones in the high word), 32 bytes, one sector of L2, all
//! loaded at once; only a full bucket that does not hold the pair sends the
//! lookup on to the next bucket: no text read, no hash loop over bytes, no
//! compare loop. Why: keyed by
//! bytes, each of the two lookups of a merge hashed the merged bytes and
//! compared them with the token's, and `merge` was the largest step on the
//! H200 (2026-12-01, cl100k): 0.95–2.2 ms per 16 MiB chunk for its 4.24 M
//! merges, 58.7 of the 141 µs of kernels of 256 KiB of prose, 143–161 µs for
//! code and CJK. Why buckets: the pair table probed slot by slot (linear
//! probing, 1.4 slots on a hit and 2.0–2.1 on a miss on average, at most
//! 19–30) and a warp's lookup lasted as long as its lanes' longest probe:
//! on the H200 (2026-12-03, Nsight Compute's stall samples of `merge` on
//! 8 MiB of prose, cl100k) the probe loop ran about five rounds of dependent
//! loads per lookup and took 28 % of the step's samples.
//!
//! Lookups: one per piece that is a token; otherwise `len − 1` dense pair
//! loads, then two pair-table lookups per merge. Measured on the host over
//! the built tables (`pair_table_answers_every_cut_of_every_token`):
//!
//! | encoding | pairs | pair table | longest lookup, buckets | mean buckets, hit / random miss | whole vocabulary |
//! |---|---|---|---|---|---|
//! | r50k | 108,299 | 4 MiB | 2 | 1.00 / 1.01 | 6.75 MiB |
//! | p50k | 108,599 | 4 MiB | 2 | 1.00 / 1.01 | 6.75 MiB |
//! | cl100k | 233,378 | 8 MiB | 3 | 1.00 / 1.01 | 13.25 MiB |
//! | o200k | 446,189 | 16 MiB | 3 | 1.00 / 1.01 | 26.35 MiB |
//!
//! Both tables are a power of two of slots at most a quarter full
//! ([`SLOTS_PER_KEY`] says why; [`DeviceVocabulary::device_bytes`] gives the
//! exact whole); everything fits the H200's 50 MB L2 cache. The longest probe
//! of a stored key in the table keyed by bytes is 8 slots for r50k, p50k and
//! o200k, 7 for cl100k (15 and 18 half full). Ranks must be below `2^18`
//! ([`PAIR_RANK_BITS`]; o200k's largest is 200,018): [`DeviceVocabulary::new`] refuses any other vocabulary with a
//! `Fix:` error.
//!
//! The host builds the pair table with the rest, once per encoder, by looking
//! up both halves of every cut of every token: [`DeviceVocabulary::new`] took
//! 10.3 / 19.6 / 55.8 ms for r50k / cl100k / o200k against 2.2 / 4.8 / 9.0 ms
//! without the table (release build, best of 5, on the 2-core development
//! machine, 2026-12-02), beside the device context's 371 ms and the first
//! module load's 117 ms on the H200.

use crate::error::{ErrorKind, TokenizerError};
use crate::vocab::Vocabulary;

/// The rank every table holds where there is no token (and the device's
/// "no token starts here").
pub const NO_TOKEN: u32 = u32::MAX;

/// Word offsets of the header fields.
pub mod header {
    /// log2 of the number of slots of the hashed table.
    pub const SLOT_BITS: u32 = 0;
    /// Word offset of the hashed table (two words per slot).
    pub const SLOTS_AT: u32 = 1;
    /// One more than the largest rank.
    pub const RANK_BOUND: u32 = 2;
    /// Length in bytes of the longest token.
    pub const MAX_TOKEN_LEN: u32 = 3;
    /// log2 of the number of buckets of the pair table.
    pub const PAIR_BUCKET_BITS: u32 = 4;
    /// Word offset of the pair table (two words per slot,
    /// [`PAIR_BUCKET_SLOTS`](super::PAIR_BUCKET_SLOTS) slots per bucket), a
    /// multiple of a bucket's words.
    pub const PAIR_SLOTS_AT: u32 = 5;
    /// Words the header takes.
    pub const WORDS: u32 = 16;
}

/// Word offset of the 256 single-byte ranks.
pub const BYTE_RANKS_AT: u32 = header::WORDS;

/// Word offset of the 65,536 ranks of 2-byte tokens, indexed `first << 8 | second`.
pub const PAIR_RANKS_AT: u32 = BYTE_RANKS_AT + 256;

/// Word offset of each rank's token: `offset << 8 | length` (`offset` into the
/// token bytes), [`NO_TOKEN`] for a rank without a token.
pub const TOKENS_AT: u32 = PAIR_RANKS_AT + (1 << 16);

/// A token's rank and its offset into the token bytes each fit 24 bits.
pub const MAX_RANK: u32 = (1 << 24) - 1;

/// Bits of a rank in the pair table's slots: the device encoder takes
/// vocabularies whose ranks are below `2^18` (o200k's largest is 200,018).
pub const PAIR_RANK_BITS: u32 = 18;

/// The device's hash of a pair of ranks (each below `2^18`): the first
/// multiplied by an odd constant (a bijection of `u32`) plus the second, then
/// [`finish`] (written the same way in the device program).
pub const fn pair_hash(first: u32, second: u32) -> u32 {
    finish(first.wrapping_mul(0x9E37_79B1).wrapping_add(second))
}

/// Slots per bucket of the pair table: 4 slots of two words, 32 bytes, one
/// sector of the device's L2 cache, so a lookup loads a whole bucket in one
/// round trip (see the module docs for why).
pub const PAIR_BUCKET_SLOTS: u32 = 4;

/// The bits of a pair table slot's high word that hold the second rank's top
/// bits (the merged rank is above them).
pub const PAIR_HIGH_KEY: u32 = (1 << (2 * PAIR_RANK_BITS - 32)) - 1;

/// The bits of a pair table slot's high word that a lookup compares with its
/// key's: [`PAIR_HIGH_KEY`] and the top bit, which only an empty slot (all
/// ones) has set, so no key matches an empty slot whatever its other bits.
pub const PAIR_HOLDS_MASK: u32 = PAIR_HIGH_KEY | 1 << 31;

/// The two words of a pair table slot holding `(first, second) → merged`
/// (each rank below `2^18`): the 54-bit value `first | second << 18 | merged
/// << 36`, low word first. The high word of a filled slot is below `2^22`, so
/// [`NO_TOKEN`] there marks an empty slot.
pub const fn pair_slot(first: u32, second: u32, merged: u32) -> [u32; 2] {
    [
        first | second << PAIR_RANK_BITS,
        second >> (32 - PAIR_RANK_BITS) | merged << (2 * PAIR_RANK_BITS - 32),
    ]
}

/// The device's hash of a key: a multiply-xor over its bytes seeded by its
/// length, then a final mix (written the same way in the device program).
pub fn hash(key: &[u8]) -> u32 {
    let mut hash = (key.len() as u32).wrapping_mul(0x9E37_79B1);
    for &byte in key {
        hash = (hash ^ byte as u32).wrapping_mul(0x0100_0193);
    }
    finish(hash)
}

/// The final mix of [`hash`] (murmur3's 32-bit finaliser).
pub const fn finish(mut hash: u32) -> u32 {
    hash ^= hash >> 16;
    hash = hash.wrapping_mul(0x85EB_CA6B);
    hash ^= hash >> 13;
    hash = hash.wrapping_mul(0xC2B2_AE35);
    hash ^ (hash >> 16)
}

/// The host image of a vocabulary on the device (see the module docs).
#[derive(Clone)]
pub struct DeviceVocabulary {
    words: Vec<u32>,
    token_bytes: Vec<u8>,
    slot_bits: u32,
    longest_probe: u32,
    pairs: usize,
    pair_bucket_bits: u32,
    pair_longest_probe: u32,
}

impl std::fmt::Debug for DeviceVocabulary {
    /// A summary: the tables are megabytes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceVocabulary")
            .field("device_bytes", &self.device_bytes())
            .field("slots", &(1u64 << self.slot_bits))
            .field("longest_probe", &self.longest_probe)
            .field("pairs", &self.pairs)
            .field("pair_buckets", &(1u64 << self.pair_bucket_bits))
            .field("pair_longest_probe", &self.pair_longest_probe)
            .finish()
    }
}

fn too_large(what: String) -> TokenizerError {
    TokenizerError::new(
        ErrorKind::Backend,
        format!("Fix: {what}; the GPU encoder takes vocabularies of ranks below 2^18 and of token bytes below 2^24, so use Backend::Cpu for this one"),
    )
}

/// Every pair of tokens whose bytes, back to back, are a token:
/// `[first, second, merged]` for every token `merged` and every cut of its
/// bytes into two tokens, in the order of `merged`'s rank. A pair has at most
/// one entry (its bytes are fixed, and no two ranks share bytes).
fn token_pairs(vocabulary: &Vocabulary) -> Vec<[u32; 3]> {
    let mut pairs = Vec::new();
    for merged in 0..vocabulary.rank_bound() {
        let Some(bytes) = vocabulary.token(merged) else {
            continue;
        };
        for cut in 1..bytes.len() {
            // The second half only where the first is a token: half the
            // lookups of building the table.
            let Some(first) = vocabulary.rank(&bytes[..cut]) else {
                continue;
            };
            if let Some(second) = vocabulary.rank(&bytes[cut..]) {
                pairs.push([first, second, merged]);
            }
        }
    }
    pairs
}

/// Slots of both hashed tables (the longer tokens keyed by their bytes, the
/// pair table keyed by two ranks) per key they hold, at least: each a power
/// of two of slots at most a quarter full.
///
/// Why a quarter and not half: a lookup that misses goes on, slot after slot
/// in the table keyed by bytes and bucket after bucket in the pair table, as
/// long as it meets full ones, each one more round trip to L2, and a warp goes
/// on while any of its lanes does. Misses are common in both: a piece that is
/// no token (about half the pieces of prose) misses in `pieces`, and most of a
/// merge's pair lookups miss (the pairs its parts are left with), in the chain
/// of merges that a short text waits on. The pair table half full took
/// 1.11–1.15 buckets per random miss on average and at most 5–8 for a stored
/// pair; a quarter full 1.01 and at most 2–3
/// (`pair_table_answers_every_cut_of_every_token`). On an H100 (2026-12-05,
/// the encode example, cl100k, three rounds alternating in one call, the
/// kernels' own step clocks), the pair table a quarter full took the
/// short-text kernel's `merge` to 6.6–6.8 µs from 9.2 for 1 KiB of prose and
/// to 22.3 from 25.6 for 1 KiB of code, the resident grid's to 17.2–17.6 from
/// 20.9–22.8 for 256 KiB of prose and to 46.7–48.2 from 56.0–57.5 for 256 KiB
/// of code; then the table keyed by bytes a quarter full took `pieces` to
/// 3.0–3.1 µs from 3.5–3.6 for 1 KiB of prose, 6.9 from 7.2 for CJK and 5.0
/// from 5.2–5.3 for code, and of 256 KiB to 7.6 from 8.8–9.2 (prose), 12.8–13.2
/// from 15.2–15.3 (CJK) and 10.8–11.3 from 11.7–12.3 µs (code). The 1 KiB
/// prose kernel went from 27.4–27.6 to 24.2–24.4 µs. It costs 6 MiB of the
/// device's memory for cl100k and 12 MiB for o200k, once per encoder.
pub const SLOTS_PER_KEY: usize = 4;

/// Slot bits of an open-addressing table of `keys` keys and `slots_per_key`
/// slots per key ([`SLOTS_PER_KEY`]), rounded up to a power of two (at
/// least 16 slots).
fn slot_bits_for(keys: usize, slots_per_key: usize) -> u32 {
    (keys.max(4) * slots_per_key)
        .max(16)
        .next_power_of_two()
        .trailing_zeros()
}

/// Linear probing as the device does it in both tables: from the top
/// `slot_bits` bits of `hash`, slot after slot (wrapping), to the first slot
/// for which `stop` holds; that slot and the slots visited (at least 1). An
/// insert stops at an empty slot, a lookup at its key or an empty slot; a table
/// at most half full always has one. The pair table's "slots" here are its
/// buckets (`slot_bits` its bucket bits).
fn probe(hash: u32, slot_bits: u32, mut stop: impl FnMut(usize) -> bool) -> (usize, u32) {
    let mask = (1usize << slot_bits) - 1;
    let mut slot = (hash >> (32 - slot_bits)) as usize;
    let mut visited = 1;
    while !stop(slot) {
        slot = (slot + 1) & mask;
        visited += 1;
    }
    (slot, visited)
}

/// Whether the slot of `words` at `slot` (two words) holds the pair whose
/// [`pair_slot`] words are `[low, high]` (any merged rank): the key bits of
/// both words, and the high word's top bit clear (an empty slot is all ones,
/// whatever key its bits look like).
fn pair_slot_holds(words: &[u32], slot: usize, [low, high]: [u32; 2]) -> bool {
    words[2 * slot] == low && words[2 * slot + 1] & PAIR_HOLDS_MASK == high
}

/// The slots of the pair table's bucket `bucket`.
fn bucket_slots(bucket: usize) -> std::ops::Range<usize> {
    let slots = PAIR_BUCKET_SLOTS as usize;
    bucket * slots..(bucket + 1) * slots
}

/// The pair table of `pairs` (ranks below `2^18`): [`SLOTS_PER_KEY`] slots
/// per pair, in buckets of [`PAIR_BUCKET_SLOTS`] slots of two words
/// ([`pair_slot`]), each pair in the first slot left empty in the bucket of
/// the top bits of its [`pair_hash`] or, if that bucket is full, the next
/// bucket with one (wrapping), empty slots all ones. Returns the bucket bits, the words and
/// the most buckets a stored pair's lookup visits.
fn pair_table(pairs: &[[u32; 3]]) -> (u32, Vec<u32>, u32) {
    pair_table_sized(pairs, SLOTS_PER_KEY)
}

/// [`pair_table`] with `slots_per_pair` slots per pair (at least 2: a table
/// at most half full).
fn pair_table_sized(pairs: &[[u32; 3]], slots_per_pair: usize) -> (u32, Vec<u32>, u32) {
    debug_assert!(slots_per_pair >= 2);
    let bucket_bits =
        slot_bits_for(pairs.len(), slots_per_pair) - PAIR_BUCKET_SLOTS.trailing_zeros();
    let mut words = vec![NO_TOKEN; (2 * PAIR_BUCKET_SLOTS as usize) << bucket_bits];
    let mut longest_probe = 0;
    for &[first, second, merged] in pairs {
        // The first empty slot of the bucket the probe stops at: a table at
        // most half full always has one.
        let mut room = 0;
        let (_, visited) = probe(pair_hash(first, second), bucket_bits, |bucket| {
            let empty = bucket_slots(bucket).find(|&slot| words[2 * slot + 1] == NO_TOKEN);
            room = empty.unwrap_or(room);
            empty.is_some()
        });
        longest_probe = longest_probe.max(visited);
        words[2 * room..2 * room + 2].copy_from_slice(&pair_slot(first, second, merged));
    }
    (bucket_bits, words, longest_probe)
}

/// The merged rank of `(first, second)` in the pair table `slots` of
/// `2^bucket_bits` buckets, by the device's steps ([`probe`] over buckets until
/// one holds the pair or an empty slot), and the buckets the probe visited.
fn pair_lookup(slots: &[u32], bucket_bits: u32, first: u32, second: u32) -> (Option<u32>, u32) {
    let key = pair_slot(first, second, 0);
    let (bucket, visited) = probe(pair_hash(first, second), bucket_bits, |bucket| {
        bucket_slots(bucket)
            .any(|slot| slots[2 * slot + 1] == NO_TOKEN || pair_slot_holds(slots, slot, key))
    });
    let merged = bucket_slots(bucket)
        .find(|&slot| pair_slot_holds(slots, slot, key))
        .map(|slot| slots[2 * slot + 1] >> PAIR_HIGH_KEY.count_ones());
    (merged, visited)
}

impl DeviceVocabulary {
    /// The device tables of `vocabulary`, the pair table among them (every
    /// cut of every token looked up on the host). An `Err` for a vocabulary with a rank of
    /// `2^18` or more (the pair table's fields) or more than `2^24` bytes of
    /// tokens (none of the built-in ones).
    pub fn new(vocabulary: &Vocabulary) -> Result<Self, TokenizerError> {
        let rank_bound = vocabulary.rank_bound();
        if rank_bound > 1 << PAIR_RANK_BITS {
            return Err(too_large(format!(
                "the vocabulary has ranks up to {}",
                rank_bound - 1
            )));
        }
        let hashed: Vec<(u32, &[u8])> = (0..rank_bound)
            .filter_map(|rank| Some((rank, vocabulary.token(rank)?)))
            .filter(|(_, bytes)| bytes.len() >= 3)
            .collect();
        let slot_bits = slot_bits_for(hashed.len(), SLOTS_PER_KEY);
        let slots_at = TOKENS_AT + rank_bound;
        let mut words = vec![0u32; slots_at as usize + (2usize << slot_bits)];
        words[header::SLOT_BITS as usize] = slot_bits;
        words[header::SLOTS_AT as usize] = slots_at;
        words[header::RANK_BOUND as usize] = rank_bound;
        words[header::MAX_TOKEN_LEN as usize] = vocabulary.max_token_len() as u32;
        for byte in 0..=255u8 {
            words[(BYTE_RANKS_AT + byte as u32) as usize] = vocabulary.byte_rank(byte);
        }
        for pair in 0..1u32 << 16 {
            words[(PAIR_RANKS_AT + pair) as usize] = vocabulary
                .pair_rank((pair >> 8) as u8, pair as u8)
                .unwrap_or(NO_TOKEN);
        }
        let mut token_bytes = Vec::new();
        for rank in 0..rank_bound {
            let at = (TOKENS_AT + rank) as usize;
            words[at] = match vocabulary.token(rank) {
                Some(bytes) => {
                    let offset = token_bytes.len() as u32;
                    if offset > MAX_RANK || bytes.len() > 255 {
                        return Err(too_large(format!(
                            "the vocabulary holds {} bytes of tokens (token {rank} is {} bytes)",
                            token_bytes.len() + bytes.len(),
                            bytes.len()
                        )));
                    }
                    token_bytes.extend_from_slice(bytes);
                    offset << 8 | bytes.len() as u32
                }
                None => NO_TOKEN,
            };
        }
        let pairs = token_pairs(vocabulary);
        let (pair_bucket_bits, pair_words, pair_longest_probe) = pair_table(&pairs);
        // A bucket in one sector: the table starts at a multiple of a
        // bucket's bytes (the buffer itself starts at least that aligned).
        words.resize(
            words.len().next_multiple_of(2 * PAIR_BUCKET_SLOTS as usize),
            0,
        );
        words[header::PAIR_BUCKET_BITS as usize] = pair_bucket_bits;
        words[header::PAIR_SLOTS_AT as usize] = words.len() as u32;
        words.extend_from_slice(&pair_words);
        let mut longest_probe = 0;
        for (rank, bytes) in hashed {
            let hash = hash(bytes);
            let at = |slot: usize| slots_at as usize + 2 * slot;
            let (slot, visited) = probe(hash, slot_bits, |slot| words[at(slot) + 1] == 0);
            longest_probe = longest_probe.max(visited);
            words[at(slot)] = hash;
            words[at(slot) + 1] = (bytes.len() as u32) << 24 | rank;
        }
        Ok(DeviceVocabulary {
            words,
            token_bytes,
            slot_bits,
            longest_probe,
            pairs: pairs.len(),
            pair_bucket_bits,
            pair_longest_probe,
        })
    }

    /// The `u32` words: header, byte ranks, 2-byte ranks, tokens, slots of
    /// the longer tokens, slots of the pair table.
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// Every token's bytes, back to back in rank order.
    pub fn token_bytes(&self) -> &[u8] {
        &self.token_bytes
    }

    /// Bytes the vocabulary takes on the device.
    pub fn device_bytes(&self) -> usize {
        self.words.len() * 4 + self.token_bytes.len()
    }

    /// Slots the longest probe sequence of a stored key visits (a miss may visit
    /// more: it ends at the first empty slot).
    pub fn longest_probe(&self) -> u32 {
        self.longest_probe
    }

    /// Pairs of tokens the pair table holds (one per cut of a token's bytes
    /// into two tokens).
    pub fn pairs(&self) -> usize {
        self.pairs
    }

    /// Bytes the pair table takes on the device (8 per slot).
    pub fn pair_table_bytes(&self) -> usize {
        (8 * PAIR_BUCKET_SLOTS as usize) << self.pair_bucket_bits
    }

    /// Buckets the longest lookup of a stored pair visits (a miss may visit
    /// more: it ends at the first bucket with an empty slot).
    pub fn pair_longest_probe(&self) -> u32 {
        self.pair_longest_probe
    }

    /// The rank of the token whose bytes are those of `first` then those of
    /// `second` (both ranks), by exactly the device's steps in the pair table;
    /// `None` when they are no token.
    pub fn pair(&self, first: u32, second: u32) -> Option<u32> {
        self.pair_probe(first, second).0
    }

    /// [`pair`](Self::pair) and the buckets its probe visits.
    fn pair_probe(&self, first: u32, second: u32) -> (Option<u32>, u32) {
        let slots_at = self.words[header::PAIR_SLOTS_AT as usize] as usize;
        let bucket_bits = self.words[header::PAIR_BUCKET_BITS as usize];
        pair_lookup(&self.words[slots_at..], bucket_bits, first, second)
    }

    /// The rank of `key` by exactly the device's steps (dense tables for one and
    /// two bytes, the hashed table beyond), for tests that hold the device
    /// tables to [`Vocabulary::rank`].
    pub fn lookup(&self, key: &[u8]) -> Option<u32> {
        let word = |at: u32| self.words[at as usize];
        let rank = match *key {
            [] => NO_TOKEN,
            [byte] => word(BYTE_RANKS_AT + byte as u32),
            [first, second] => word(PAIR_RANKS_AT + ((first as u32) << 8 | second as u32)),
            _ if key.len() > word(header::MAX_TOKEN_LEN) as usize => NO_TOKEN,
            _ => {
                let hash = hash(key);
                let slots_at = word(header::SLOTS_AT);
                let stored = |slot: usize| word(slots_at + 2 * slot as u32 + 1);
                let (slot, _) = probe(hash, self.slot_bits, |slot| {
                    let stored = stored(slot);
                    stored == 0
                        || (word(slots_at + 2 * slot as u32) == hash
                            && (stored >> 24) as usize == key.len()
                            && self.token(stored & MAX_RANK) == Some(key))
                });
                match stored(slot) {
                    0 => NO_TOKEN,
                    found => found & MAX_RANK,
                }
            }
        };
        (rank != NO_TOKEN).then_some(rank)
    }

    /// The bytes of the token of `rank`, from the device tables.
    pub fn token(&self, rank: u32) -> Option<&[u8]> {
        let info = *self.words.get((TOKENS_AT + rank) as usize)?;
        if info == NO_TOKEN || rank >= self.words[header::RANK_BOUND as usize] {
            return None;
        }
        let offset = (info >> 8) as usize;
        self.token_bytes
            .get(offset..offset + (info & 0xFF) as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Encoding;

    /// Locks out device tables that disagree with the vocabulary: for every
    /// built-in encoding, every token's bytes look up to its rank through the
    /// device's steps, the device's token bytes are the vocabulary's, and
    /// (negative control) keys that are no token (a token with a byte appended,
    /// every 3-byte window of some text that the vocabulary refuses) are misses.
    /// Also locks out the table keyed by bytes filled past a quarter (see
    /// [`SLOTS_PER_KEY`]): no stored key's probe is longer than 10 slots,
    /// where half full the longest were 15 (r50k, p50k) and 18 (cl100k, o200k).
    #[test]
    fn device_lookup_equals_the_vocabulary() {
        for encoding in Encoding::ALL {
            let vocabulary = Vocabulary::from_tiktoken_bytes(encoding.tiktoken_bytes()).unwrap();
            let device = DeviceVocabulary::new(&vocabulary).unwrap();
            let mut misses = 0;
            for rank in 0..vocabulary.rank_bound() {
                let Some(token) = vocabulary.token(rank) else {
                    assert_eq!(device.token(rank), None);
                    continue;
                };
                assert_eq!(device.lookup(token), Some(rank), "{token:?}");
                assert_eq!(device.token(rank), Some(token));
                let longer = [token, b"\xFF"].concat();
                assert_eq!(device.lookup(&longer), vocabulary.rank(&longer));
                misses += usize::from(vocabulary.rank(&longer).is_none());
            }
            assert!(misses > 1000, "{}: only {misses} misses", encoding.name());
            let text = "The quick brown fox 日本語 \u{301}!! 12345".as_bytes();
            for len in 1..=6 {
                for window in text.windows(len) {
                    assert_eq!(device.lookup(window), vocabulary.rank(window), "{window:?}");
                }
            }
            assert_eq!(device.lookup(&[]), None);
            assert_eq!(device.lookup(&[b'a'; 200]), None);
            assert!(device.longest_probe() <= 10, "{device:?}");
        }
    }

    /// Ranks of `vocabulary`'s tokens from the crate's seeded generator (a rank
    /// below the bound that no token has is drawn again): the same sequence on
    /// every run.
    fn random_ranks(vocabulary: &Vocabulary, seed: u64) -> impl FnMut() -> u32 + '_ {
        let bound = vocabulary.rank_bound();
        let mut random = crate::pretokenize::text::SplitMix64::new(seed);
        move || loop {
            let rank = random.below(bound);
            if vocabulary.token(rank).is_some() {
                return rank;
            }
        }
    }

    /// Every cut of a token's bytes into two tokens, `[first, second, merged]`,
    /// that `pair` does not answer with the token's rank: the merge loop
    /// would stop short of a merge tiktoken makes.
    fn unanswered_cuts(
        vocabulary: &Vocabulary,
        pair: impl Fn(u32, u32) -> Option<u32>,
    ) -> Vec<[u32; 3]> {
        let mut unanswered = Vec::new();
        for merged in 0..vocabulary.rank_bound() {
            let Some(bytes) = vocabulary.token(merged) else {
                continue;
            };
            for cut in 1..bytes.len() {
                let halves = (
                    vocabulary.rank(&bytes[..cut]),
                    vocabulary.rank(&bytes[cut..]),
                );
                if let (Some(first), Some(second)) = halves {
                    if pair(first, second) != Some(merged) {
                        unanswered.push([first, second, merged]);
                    }
                }
            }
        }
        unanswered
    }

    /// Locks out a pair table that loses or invents a merge (a slot packing
    /// that cuts a rank's bits, a probe that stops early, a hash the host and
    /// the device disagree on): for every built-in encoding, every cut of
    /// every token's bytes into two tokens finds that token's rank, and
    /// 100,000 random pairs of ranks find exactly the rank of their bytes back
    /// to back (almost all none). Negative control: a table built without one
    /// pair leaves exactly that cut unanswered. Prints each table's pairs,
    /// bytes, longest lookup and mean buckets visited by a hit and by a random
    /// pair's miss, and the whole vocabulary's bytes (the module docs quote
    /// them).
    #[test]
    fn pair_table_answers_every_cut_of_every_token() {
        for encoding in Encoding::ALL {
            let vocabulary = Vocabulary::from_tiktoken_bytes(encoding.tiktoken_bytes()).unwrap();
            let device = DeviceVocabulary::new(&vocabulary).unwrap();
            assert_eq!(
                unanswered_cuts(&vocabulary, |first, second| device.pair(first, second)),
                Vec::<[u32; 3]>::new(),
                "{}",
                encoding.name()
            );
            let pairs = token_pairs(&vocabulary);
            assert_eq!(device.pairs(), pairs.len());
            assert!(device.pair_table_bytes() >= 8 * SLOTS_PER_KEY * device.pairs());
            let hit_slots: u32 = pairs
                .iter()
                .map(|&[first, second, _]| device.pair_probe(first, second).1)
                .sum();
            let mut random_rank = random_ranks(&vocabulary, 0x9E37_79B9_7F4A_7C15);
            let (mut found, mut miss_slots) = (0, 0);
            for _ in 0..100_000 {
                let (first, second) = (random_rank(), random_rank());
                let bytes = [
                    vocabulary.token(first).unwrap(),
                    vocabulary.token(second).unwrap(),
                ]
                .concat();
                let expected = vocabulary.rank(&bytes);
                let (rank, visited) = device.pair_probe(first, second);
                assert_eq!(rank, expected, "{first} {second}");
                found += usize::from(expected.is_some());
                miss_slots += visited * u32::from(expected.is_none());
            }
            assert!(
                found < 1000,
                "{}: {found} random pairs are tokens",
                encoding.name()
            );
            eprintln!(
                "{}: {} pairs, {} bytes, longest lookup {} buckets, mean buckets per hit {:.2}, per miss {:.2}; longest probe by bytes {} slots; vocabulary {} bytes",
                encoding.name(),
                device.pairs(),
                device.pair_table_bytes(),
                device.pair_longest_probe(),
                f64::from(hit_slots) / pairs.len() as f64,
                f64::from(miss_slots) / (100_000 - found) as f64,
                device.longest_probe(),
                device.device_bytes()
            );
            // Negative control: one pair left out is one cut unanswered.
            let mut pairs = pairs;
            let dropped = pairs.remove(pairs.len() / 2);
            let (bucket_bits, slots, _) = pair_table(&pairs);
            assert_eq!(
                unanswered_cuts(&vocabulary, |first, second| pair_lookup(
                    &slots,
                    bucket_bits,
                    first,
                    second
                )
                .0),
                vec![dropped],
                "{}: control",
                encoding.name()
            );
        }
    }

    /// Locks out a pair table filled so full that a merge's lookups that miss
    /// (most of them) go on past their first bucket: one more round trip to
    /// L2 in the chain of merges a short text waits on, for the whole warp
    /// when any lane takes it (see [`SLOTS_PER_KEY`]). For every
    /// built-in encoding, at most 3 % of 100,000 random pairs that are no
    /// token visit a second bucket, and no stored pair's lookup visits more
    /// than 4. Negative control: the same pairs in a table half full (two
    /// slots per pair, this table's size before) send more than 6 % on.
    #[test]
    fn pair_table_misses_end_in_their_first_bucket() {
        for encoding in Encoding::ALL {
            let vocabulary = Vocabulary::from_tiktoken_bytes(encoding.tiktoken_bytes()).unwrap();
            let pairs = token_pairs(&vocabulary);
            let mut random_rank = random_ranks(&vocabulary, 0x2545_F491_4F6C_DD1D);
            let misses: Vec<[u32; 2]> = (0..100_000)
                .map(|_| [random_rank(), random_rank()])
                .filter(|&[first, second]| {
                    // Ranks without a token (gaps) are never a part's.
                    let (Some(first), Some(second)) =
                        (vocabulary.token(first), vocabulary.token(second))
                    else {
                        return false;
                    };
                    vocabulary.rank(&[first, second].concat()).is_none()
                })
                .collect();
            let past_first_bucket = |slots_per_pair: usize| {
                let (bucket_bits, slots, longest) = pair_table_sized(&pairs, slots_per_pair);
                let past = misses
                    .iter()
                    .filter(|&&[first, second]| {
                        let (rank, visited) = pair_lookup(&slots, bucket_bits, first, second);
                        assert_eq!(rank, None);
                        visited > 1
                    })
                    .count();
                (past as f64 / misses.len() as f64, longest)
            };
            let (share, longest) = past_first_bucket(SLOTS_PER_KEY);
            assert!(
                share <= 0.03,
                "{}: {share:.4} of misses go on",
                encoding.name()
            );
            assert!(
                longest <= 4,
                "{}: a lookup visits {longest}",
                encoding.name()
            );
            let (control, _) = past_first_bucket(2);
            assert!(control > 0.06, "{}: control {control:.4}", encoding.name());
        }
    }

    /// Locks out a vocabulary whose ranks do not fit the pair table's 18-bit
    /// fields reaching the device (where a rank would alias another): a rank
    /// of `2^18` is a `Fix:` error, and (control) one of `2^18 − 1` is taken.
    #[test]
    fn ranks_past_the_pair_table_fields_are_fix_errors() {
        let with_rank = |rank: u32| {
            let mut bytes = Encoding::R50kBase.tiktoken_bytes().to_vec();
            bytes.extend_from_slice(format!("//// {rank}\n").as_bytes());
            Vocabulary::from_tiktoken_bytes(&bytes).unwrap()
        };
        let error = DeviceVocabulary::new(&with_rank(1 << PAIR_RANK_BITS)).unwrap_err();
        assert!(error.message().starts_with("Fix: "), "{error}");
        assert!(error.message().contains("2^18"), "{error}");
        let taken = DeviceVocabulary::new(&with_rank((1 << PAIR_RANK_BITS) - 1)).unwrap();
        assert_eq!(
            taken.lookup(b"\xFF\xFF\xFF"),
            Some((1 << PAIR_RANK_BITS) - 1)
        );
    }
}
