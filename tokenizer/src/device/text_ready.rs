//! The host's half of a text fed to a kernel that is already running: one
//! ready flag per piece of the staged text, set once the piece is written.
//!
//! # Why this module exists
//!
//! One 256 KiB document's encode on an H100 host (2026-12-06) spent, one
//! after another, about 10 µs gathering the text into the host-mapped
//! staging, a few µs launching the resident kernel, and 7.7 µs in that
//! kernel's `stage` reading the text across PCIe, before any step could
//! start. The resident kernel's `stage` ([`ready_stage`](super::programs::ready_stage))
//! now reads each piece of [`TEXT_READY_PIECE_BYTES`] as soon as its flag is
//! set, so an encoder that feeds its text (`DeviceEncoder::with_text_fed`)
//! launches first and gathers while the kernel waits
//! (`AnyGraph::replay_feeding`): the three overlap. One that gathers before
//! the launch sets every flag first.
//!
//! Each flag is the first word of a 128-byte line of its own
//! ([`TEXT_READY_FLAG_WORDS`] words apart): the kernel's polls are
//! system-scope loads across PCIe, and those of one line wait for each
//! other (see there for the figures).
//!
//! The protocol: before the launch every flag of the chunk is cleared (no
//! kernel of the slot runs then); a gathering thread writes a piece, then
//! stores its flag with release ordering, so a kernel that sees the flag
//! with its acquire load sees the piece. Every flag must be set on every
//! path, or the kernel polls forever and so does the synchronize after it:
//! [`PublishAllOnDrop`] sets them all when the gather ends, returns early or
//! unwinds.

use std::sync::atomic::{AtomicU32, Ordering};

use super::programs::{TEXT_READY_FLAG_WORDS, TEXT_READY_PIECE_BYTES};
use crate::error::TokenizerError;

/// The ready flags of one chunk's text: one flag per piece of
/// [`TEXT_READY_PIECE_BYTES`], the first word of each run of
/// [`TEXT_READY_FLAG_WORDS`] (the rest unused).
#[derive(Clone, Copy, Debug)]
pub struct ReadyFlags<'a> {
    words: &'a [AtomicU32],
}

impl<'a> ReadyFlags<'a> {
    /// The flags of a text of `text_len` bytes among `words` (the slot's,
    /// which may hold more); an internal `Err` where they are too few.
    pub fn new(words: &'a [AtomicU32], text_len: usize) -> Result<Self, TokenizerError> {
        let needed = flag_words(text_len);
        let words = words.get(..needed).ok_or_else(|| {
            super::pipeline::internal(format!(
                "{} words of ready flags for a text of {} pieces ({needed} words)",
                words.len(),
                pieces(text_len)
            ))
        })?;
        Ok(ReadyFlags { words })
    }

    /// Each piece's flag, in order (the words between them are not flags).
    pub fn flags(&self) -> impl Iterator<Item = &AtomicU32> {
        self.words.iter().step_by(TEXT_READY_FLAG_WORDS as usize)
    }

    /// Clears every flag: before the launch, while no kernel reads them.
    pub fn clear(&self) {
        for flag in self.flags() {
            flag.store(0, Ordering::Relaxed);
        }
    }

    /// Sets the flag of the piece that starts at byte `at` (a multiple of
    /// [`TEXT_READY_PIECE_BYTES`]), once the piece is written: the release
    /// store orders the piece's bytes before it.
    pub fn publish(&self, at: usize) {
        let piece = at / TEXT_READY_PIECE_BYTES as usize;
        if let Some(flag) = self.words.get(piece * TEXT_READY_FLAG_WORDS as usize) {
            flag.store(1, Ordering::Release);
        }
    }

    /// Sets every flag.
    pub fn publish_all(&self) {
        for flag in self.flags() {
            flag.store(1, Ordering::Release);
        }
    }
}

/// Sets every flag of a chunk when dropped: after the gather, on its `Err`
/// and when it unwinds, so that the kernel never polls a flag nobody sets
/// (the ids of a chunk whose gather failed are never read).
#[derive(Debug)]
pub struct PublishAllOnDrop<'a>(pub ReadyFlags<'a>);

impl Drop for PublishAllOnDrop<'_> {
    fn drop(&mut self) {
        self.0.publish_all();
    }
}

/// Pieces of a text of `text_len` bytes.
pub fn pieces(text_len: usize) -> usize {
    text_len.div_ceil(TEXT_READY_PIECE_BYTES as usize)
}

/// Words of ready flags for a text of `text_len` bytes: [`TEXT_READY_FLAG_WORDS`]
/// per piece.
pub fn flag_words(text_len: usize) -> usize {
    pieces(text_len) * TEXT_READY_FLAG_WORDS as usize
}

/// Bytes of ready flags a slot of `text` bytes of capacity holds.
pub fn flag_bytes(text: u64) -> u64 {
    4 * u64::from(TEXT_READY_FLAG_WORDS) * text.div_ceil(u64::from(TEXT_READY_PIECE_BYTES))
}

/// Writes the flags of a text of `text_len` bytes at the start of `out` (the
/// buffer's bytes, where it is not mapped as words: [`ReadyFlags`]'s layout,
/// each flag a little-endian 1 and every word between 0); an internal `Err`
/// where `out` is too short.
pub fn write_all_set(out: &mut [u8], text_len: usize) -> Result<(), TokenizerError> {
    let bytes = 4 * flag_words(text_len);
    let out = out
        .get_mut(..bytes)
        .ok_or_else(|| super::pipeline::internal(format!("{bytes} bytes of ready flags")))?;
    out.fill(0);
    for flag in out.chunks_exact_mut(4 * TEXT_READY_FLAG_WORDS as usize) {
        flag[..4].copy_from_slice(&1u32.to_le_bytes());
    }
    Ok(())
}

/// Writes `out`, the part of the staging from byte `at` on, by `write`
/// (given a part and its offset), piece by piece where `ready` is given,
/// publishing each piece's flag after it; in one call otherwise. `at` is a
/// multiple of [`TEXT_READY_PIECE_BYTES`] where `ready` is given.
pub fn write_publishing(
    out: &mut [u8],
    at: usize,
    ready: Option<&ReadyFlags<'_>>,
    write: impl Fn(&mut [u8], usize),
) {
    let Some(ready) = ready else {
        write(out, at);
        return;
    };
    let piece_bytes = TEXT_READY_PIECE_BYTES as usize;
    for (index, piece) in out.chunks_mut(piece_bytes).enumerate() {
        let piece_at = at + index * piece_bytes;
        write(piece, piece_at);
        ready.publish(piece_at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each piece's flag, in order, among the first `pieces` pieces' words.
    fn loaded(words: &[AtomicU32], pieces: usize) -> Vec<u32> {
        (0..pieces)
            .map(|piece| words[piece * TEXT_READY_FLAG_WORDS as usize].load(Ordering::Acquire))
            .collect()
    }

    /// `pieces` pieces' words of flags, every word `value`.
    fn flag_words_of(pieces: usize, value: u32) -> Vec<AtomicU32> {
        (0..pieces * TEXT_READY_FLAG_WORDS as usize)
            .map(|_| AtomicU32::new(value))
            .collect()
    }

    /// Locks out a flag set before its piece is written, or a piece whose
    /// flag is never set: each piece's flag goes up right after that piece
    /// and no other, in order, the last (partial) piece's too. Negative
    /// control: publishing before `write` makes the recorded flags at each
    /// write include the current piece, and the test fails.
    #[test]
    fn each_piece_is_published_after_it_is_written() {
        let piece = TEXT_READY_PIECE_BYTES as usize;
        let words = flag_words_of(4, 7);
        let flags = ReadyFlags::new(&words, 2 * piece + 5).unwrap();
        flags.clear();
        assert_eq!(
            loaded(&words, 4),
            [0, 0, 0, 7],
            "only the text's pieces are cleared"
        );
        let mut out = vec![0u8; 2 * piece + 5];
        let seen = std::sync::Mutex::new(Vec::new());
        write_publishing(&mut out, 0, Some(&flags), |part, at| {
            seen.lock()
                .unwrap()
                .push((at, part.len(), loaded(&words, 4)));
            part.fill(1);
        });
        assert_eq!(
            seen.into_inner().unwrap(),
            [
                (0, piece, vec![0, 0, 0, 7]),
                (piece, piece, vec![1, 0, 0, 7]),
                (2 * piece, 5, vec![1, 1, 0, 7]),
            ]
        );
        assert_eq!(loaded(&words, 4), [1, 1, 1, 7]);
        assert!(out.iter().all(|&byte| byte == 1));
    }

    /// Locks out flags packed into shared 128-byte lines (the kernel's polls
    /// of one line, system-scope loads across PCIe, wait for each other: on
    /// an H100, 2026-12-07, `stage` of a fed 256 KiB document took 22–28 µs
    /// with the 64 flags in two lines and 12–17 with one line each): a
    /// piece's flag is the first word of its own run of
    /// [`TEXT_READY_FLAG_WORDS`], 128 bytes from the next, and the words
    /// between are never written. Negative control: with
    /// `TEXT_READY_FLAG_WORDS` 1 the flags share a line and the last
    /// assertion fails.
    #[test]
    fn each_flag_has_a_line_of_its_own() {
        let words = flag_words_of(3, 0);
        let flags = ReadyFlags::new(&words, 3 * TEXT_READY_PIECE_BYTES as usize).unwrap();
        flags.publish(TEXT_READY_PIECE_BYTES as usize);
        let set: Vec<usize> = (0..words.len())
            .filter(|&index| words[index].load(Ordering::Acquire) != 0)
            .collect();
        assert_eq!(set, [TEXT_READY_FLAG_WORDS as usize]);
        flags.publish_all();
        let set: Vec<usize> = (0..words.len())
            .filter(|&index| words[index].load(Ordering::Acquire) != 0)
            .collect();
        let stride = TEXT_READY_FLAG_WORDS as usize;
        assert_eq!(set, [0, stride, 2 * stride]);
        assert!(
            set.windows(2).all(|pair| 4 * (pair[1] - pair[0]) >= 128),
            "flags {set:?} share a 128-byte line"
        );
    }

    /// Locks out a kernel left polling when the gather stops early: the guard
    /// sets every flag when dropped, also while unwinding. Negative control:
    /// without the guard's `Drop`, the flags stay 0 and the test fails.
    #[test]
    fn every_flag_is_set_when_the_gather_unwinds() {
        let words = flag_words_of(3, 0);
        let flags = ReadyFlags::new(&words, 3 * TEXT_READY_PIECE_BYTES as usize).unwrap();
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _guard = PublishAllOnDrop(flags);
            panic!("a gather that fails half-way");
        }));
        assert!(unwound.is_err());
        assert_eq!(loaded(&words, 3), [1, 1, 1]);
    }

    /// Locks out the two ways of setting every flag (the mapped words, the
    /// buffer's bytes) drifting apart: the bytes `write_all_set` writes are
    /// the words `publish_all` sets, each as the kernel reads it, and a slot's
    /// `flag_bytes` holds them. Negative control: setting the flags' last byte
    /// instead of the first makes the words 1 << 24 and the test fails.
    #[test]
    fn the_bytes_and_the_words_agree() {
        let text_len = 2 * TEXT_READY_PIECE_BYTES as usize + 5;
        let words = flag_words_of(3, 0);
        ReadyFlags::new(&words, text_len).unwrap().publish_all();
        let published: Vec<u32> = words
            .iter()
            .map(|word| word.load(Ordering::Acquire))
            .collect();
        let flags = published.len() * 4;
        let mut bytes = vec![7u8; flags + 3];
        write_all_set(&mut bytes, text_len).unwrap();
        let written: Vec<u32> = bytes[..flags]
            .chunks_exact(4)
            .map(|word| u32::from_le_bytes([word[0], word[1], word[2], word[3]]))
            .collect();
        assert_eq!(written, published);
        assert_eq!(loaded(&words, 3), [1, 1, 1]);
        assert_eq!(&bytes[flags..], [7, 7, 7], "past the flags untouched");
        assert_eq!(flag_bytes(text_len as u64), flags as u64);
        assert!(write_all_set(&mut bytes[..flags - 1], text_len).is_err());
    }

    /// Locks out a slot whose flags are too few for its text passing
    /// silently (the kernel would poll a word past them).
    #[test]
    fn too_few_flags_are_an_error() {
        let words = flag_words_of(1, 0);
        assert!(ReadyFlags::new(&words, TEXT_READY_PIECE_BYTES as usize + 1).is_err());
        assert!(ReadyFlags::new(&words[1..], TEXT_READY_PIECE_BYTES as usize).is_err());
        assert!(ReadyFlags::new(&words, TEXT_READY_PIECE_BYTES as usize).is_ok());
    }
}
