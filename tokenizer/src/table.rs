//! The byte string → rank lookup the BPE loop runs for every candidate pair.
//!
//! # Why a table of its own
//!
//! Encoding real text asks "is this byte string a token, and of which rank" a few
//! times per input byte: once per piece (most pieces are whole tokens) and once
//! per adjacent pair the merge loop considers. `HashMap<Vec<u8>, u32>` hashes
//! with SipHash and follows a pointer to every candidate key's heap bytes to
//! compare them. This table is open addressing with linear probing over 16-byte
//! slots that hold the key's first 8 bytes inline, its length and its rank: a
//! key of at most 8 bytes (most pairs, and 74–80 % of the tokens of every OpenAI
//! vocabulary: their median token is 6 bytes) is found or refused without
//! touching any other memory; a longer one compares its tail against the
//! vocabulary's byte arena once the inline part matched. Measured on the 2-core
//! build machine (2026-12-01, cl100k, every 2- to 8-byte window of README.md,
//! hits and misses, best of 15 passes): 17.4 ns per lookup here, 31.5 ns through
//! the standard `HashMap<Vec<u8>, u32>`.
//!
//! The hash is a multiplicative (Fibonacci) hash of the inline word and the
//! length, with the remaining 8-byte words folded in for longer keys; the slot
//! index is its top bits. Keys longer than the longest token are refused before
//! hashing, which keeps the merge loop over a long run of one letter linear.
//!
//! Most lookups of the merge loop are misses (adjacent parts that are no
//! token), and the slots (4 MiB for cl100k, 8 MiB for o200k) do not stay in a
//! core's cache, so a miss filter sits in front of them: one bit per position of
//! a 16-bits-per-key bit array (256 KiB for cl100k), set where some key's hash
//! lands; a key whose bit is clear is refused without touching the slots. On
//! generated CJK text (the merge loop's worst real shape: pieces of many
//! characters, each merged from its bytes) it took cl100k from about 25 to
//! 36–55 MB/s and o200k from about 15 to 18–35 MB/s on the loaded 2-core build
//! machine (2026-12-01, alternating runs of both builds).

/// Multiplier of the hash: 2^64 / φ, odd (Fibonacci hashing).
const MULTIPLIER: u64 = 0x9E37_79B9_7F4A_7C15;

/// One slot: the key's first 8 bytes (little-endian, zero-padded), its length
/// (0 = empty slot: tokens are never empty) and its rank.
#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    head: u64,
    len: u32,
    rank: u32,
}

/// An immutable map from token bytes to rank (see the module docs).
#[derive(Clone, Debug)]
pub(crate) struct TokenTable {
    slots: Vec<Slot>,
    /// `64 - log2(slots.len())`: the slot index is the hash's top bits.
    shift: u32,
    /// Longest key in the table; longer keys are refused without hashing.
    max_len: usize,
    /// One bit per filter position, set where some key's hash lands: a key
    /// whose bit is clear is no token, found without touching `slots`.
    filter: Vec<u64>,
    /// `64 - log2(filter bits)`.
    filter_shift: u32,
}

/// Second multiplier: the miss filter's position comes from other bits of the
/// hash than the slot index.
const FILTER_MULTIPLIER: u64 = 0xD6E8_FEB8_6659_FD93;

/// The first `min(8, key.len())` bytes of `key` as a little-endian word, zero-padded.
#[inline(always)]
fn head_of(key: &[u8]) -> u64 {
    let len = key.len();
    if len >= 8 {
        u64::from_le_bytes([
            key[0], key[1], key[2], key[3], key[4], key[5], key[6], key[7],
        ])
    } else if len >= 4 {
        // Two overlapping 4-byte reads; the overlap holds the same bytes in both.
        let low = u32::from_le_bytes([key[0], key[1], key[2], key[3]]) as u64;
        let high =
            u32::from_le_bytes([key[len - 4], key[len - 3], key[len - 2], key[len - 1]]) as u64;
        low | (high << ((len - 4) * 8))
    } else if len > 0 {
        // First, middle and last byte cover lengths 1 to 3 (they coincide below 3).
        key[0] as u64
            | (key[len / 2] as u64) << (8 * (len / 2))
            | (key[len - 1] as u64) << (8 * (len - 1))
    } else {
        0
    }
}

/// The 8-byte word of `key` at `offset`, or its last 8 bytes when fewer remain.
#[inline(always)]
fn word_at(key: &[u8], offset: usize) -> u64 {
    let at = offset.min(key.len() - 8);
    u64::from_le_bytes([
        key[at],
        key[at + 1],
        key[at + 2],
        key[at + 3],
        key[at + 4],
        key[at + 5],
        key[at + 6],
        key[at + 7],
    ])
}

#[inline(always)]
fn hash_of(head: u64, key: &[u8]) -> u64 {
    let len = key.len();
    let mut hash = (head ^ ((len as u64) << 58 | len as u64)).wrapping_mul(MULTIPLIER);
    let mut offset = 8;
    while offset < len {
        hash = (hash.rotate_left(26) ^ word_at(key, offset)).wrapping_mul(MULTIPLIER);
        offset += 8;
    }
    hash
}

impl TokenTable {
    /// A table of `entries` (bytes, rank), each key non-empty and distinct (the
    /// vocabulary parser has checked both). `arena` is not kept: long keys are
    /// compared through [`TokenTable::get`]'s `bytes_of`.
    pub(crate) fn new<'a>(entries: impl ExactSizeIterator<Item = (&'a [u8], u32)> + Clone) -> Self {
        // At most half full: short probe sequences for hits and misses alike.
        let slot_count = (entries.len().max(8) * 2).next_power_of_two();
        // 16 filter bits per key: about 1 in 16 misses gets past it.
        let filter_bits = (entries.len().max(64) * 16).next_power_of_two();
        let mut table = TokenTable {
            slots: vec![Slot::default(); slot_count],
            shift: 64 - slot_count.trailing_zeros(),
            max_len: 0,
            filter: vec![0; filter_bits / 64],
            filter_shift: 64 - filter_bits.trailing_zeros(),
        };
        let mask = slot_count - 1;
        for (key, rank) in entries {
            let head = head_of(key);
            let hash = hash_of(head, key);
            let bit = table.filter_bit(hash);
            table.filter[bit / 64] |= 1 << (bit % 64);
            let mut index = (hash >> table.shift) as usize;
            while table.slots[index].len != 0 {
                index = (index + 1) & mask;
            }
            table.slots[index] = Slot {
                head,
                len: key.len() as u32,
                rank,
            };
            table.max_len = table.max_len.max(key.len());
        }
        table
    }

    /// The rank of `key`, if it is a token. `bytes_of(rank)` gives a stored
    /// token's bytes (compared only for keys longer than 8 bytes).
    #[inline(always)]
    pub(crate) fn get<'v>(&self, key: &[u8], bytes_of: impl Fn(u32) -> &'v [u8]) -> Option<u32> {
        let len = key.len();
        if len == 0 || len > self.max_len {
            return None;
        }
        let head = head_of(key);
        let hash = hash_of(head, key);
        let bit = self.filter_bit(hash);
        if self.filter[bit / 64] & (1 << (bit % 64)) == 0 {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut index = (hash >> self.shift) as usize;
        loop {
            let slot = self.slots[index];
            if slot.len == 0 {
                return None;
            }
            if slot.head == head
                && slot.len as usize == len
                && (len <= 8 || bytes_of(slot.rank) == key)
            {
                return Some(slot.rank);
            }
            index = (index + 1) & mask;
        }
    }

    /// The miss filter's bit for `hash`.
    #[inline(always)]
    fn filter_bit(&self, hash: u64) -> usize {
        (hash.wrapping_mul(FILTER_MULTIPLIER) >> self.filter_shift) as usize
    }

    /// Longest key in the table.
    pub(crate) fn max_len(&self) -> usize {
        self.max_len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Locks out a head word that confuses keys: every length 1..=12 and keys that
    /// differ only in a trailing zero byte map to their own word, and a table of
    /// such near-identical keys finds each one and refuses its neighbours
    /// (negative control: a key one byte longer is absent).
    #[test]
    fn near_identical_keys_are_told_apart() {
        let keys: Vec<Vec<u8>> = (1..=12)
            .flat_map(|len| {
                [
                    vec![b'a'; len],
                    (1..=len as u8).collect::<Vec<u8>>(),
                    vec![0u8; len],
                ]
            })
            .collect();
        let table = TokenTable::new(
            keys.iter()
                .enumerate()
                .map(|(rank, key)| (key.as_slice(), rank as u32)),
        );
        let bytes_of = |rank: u32| keys[rank as usize].as_slice();
        for (rank, key) in keys.iter().enumerate() {
            assert_eq!(table.get(key, bytes_of), Some(rank as u32), "{key:?}");
        }
        assert_eq!(table.get(&[b'a'; 13], bytes_of), None);
        assert_eq!(table.get(b"ab", bytes_of), None);
        assert_eq!(
            table.get(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12], bytes_of),
            None
        );
        assert_eq!(table.get(&[], bytes_of), None);
        assert_eq!(head_of(&[1]), 1);
        assert_eq!(head_of(&[1, 0]), 1);
        assert_eq!(head_of(&[1, 2, 3]), 0x03_02_01);
        assert_eq!(head_of(&[1, 2, 3, 4, 5]), 0x05_04_03_02_01);
        assert_eq!(head_of(&[1, 2, 3, 4, 5, 6, 7]), 0x07_06_05_04_03_02_01);
    }
}
