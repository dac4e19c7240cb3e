//! The host's side of a device encode: gathering a chunk's documents into the
//! (pinned) staging buffer, and handing each document its ids out of the
//! chunk's id buffer, on a persistent pool of worker threads.
//!
//! # Why this module exists
//!
//! A device encode of a batch moves its text once into pinned memory (the
//! caller's `&str`s are ordinary pageable memory, which the device reads at
//! only 7–12 GB/s by DMA on the H200 host) and its ids once out of it (about
//! 4 bytes of ids per 2 bytes of text for cl100k: 128 MiB of ids for a 64 MiB
//! batch). On the H200 (2026-12-02, a 64 MiB cl100k batch of 7,689 documents in
//! four 16 MiB chunks) these two copies took 1.1–4.0 ms (the gather) and
//! 0.9–3.8 ms (the hand-out) per chunk, only 4–13 GB/s on 16 threads, while the
//! kernels took about 5 ms per chunk. Each copy then spawned fresh OS threads
//! (`std::thread::scope`, 16 spawns and joins per copy, each tens of µs in the
//! host's VM) and split the hand-out by documents, so a thread that drew the
//! long documents finished last. Here:
//!
//! - one pool of persistent workers (rayon's work-stealing pool, one worker per
//!   core, started once per process) runs every copy: no spawn per copy, and a
//!   worker slowed by page faults or by the device's own traffic to host memory
//!   leaves its queued pieces to idle ones;
//! - both copies are cut by bytes, not by documents: about four pieces per
//!   worker of at least 256 KiB; the gather cuts inside documents, the hand-out
//!   gives a document larger than a piece to several workers, each writing its
//!   part of the document's vector;
//! - each document's vector is allocated (with exactly its length, when it
//!   lacks room) by the worker that fills it, so the first touch of 128 MiB of
//!   new vectors, a page fault per 4 KiB, is spread over every worker instead
//!   of one thread.
//!
//! [`DeviceEncoder::encode_batch_into`](super::DeviceEncoder::encode_batch_into)
//! also runs each chunk's hand-out asynchronously, while the calling thread
//! stages the next chunk and the device computes, for a batch of several
//! chunks: on a small pool of its own, whose threads then copy on this pool
//! (queued behind the next chunk's gather on this pool, a hand-out had waited
//! up to 4.8 ms to start: the pipeline's `hand_out_pool` gives the
//! measurement); a batch of one chunk hands out on the calling thread,
//! since it has nothing to overlap and the hand-off to a worker cost more
//! than the encode of a short text (8.0–17.5 µs against 3.4 µs of host time
//! per 1 KiB encode, the [pipeline's docs](super::pipeline) give the
//! measurement). Below 1 MiB ([`PARALLEL_COPY_BYTES`]) a copy runs on the
//! calling thread: the pool's hand-off costs more than it saves. On an H100
//! host (2026-12-06, the encode example, one document eagerly, cl100k, two
//! rounds) both copies on the pool from 128 KiB in pieces of 32 KiB took
//! 256 KiB of prose from 147.8 / 136.7 µs to 220.9 / 202.9, 128 KiB from
//! 87.8 / 91.7 to 169.5 / 170.1, CJK and code alike. A pool of four workers
//! of its own for copies of 128 KiB to 1 MiB, four pieces each and no other
//! worker woken, cost less but still cost (an H100 host, the same day, two
//! rounds, eager against the calling thread): 180,000 bytes of prose 155.7 /
//! 159.7 µs against 113.3 / 107.3, CJK 162.7 / 161.9 against 128.4 / 125.6,
//! 256 KiB of prose 158.6 / 160.1 against 162.0 / 126.2, code 173.2 / 180.5
//! against 152.1 / 142.0: waking a parked worker on that host takes longer
//! than the copy it would share (a 256 KiB gather 10–25 µs). Where the
//! pool's threads cannot be started, every copy runs on the calling thread.
//!
//! The `gpu_encode` bench measures both copies at the batch's sizes, on the
//! pool and on threads spawned per copy, beside the pipeline.

use std::sync::OnceLock;

use rayon::prelude::*;

use crate::error::{ErrorKind, TokenizerError};

/// Below this many bytes a copy runs on the calling thread.
pub const PARALLEL_COPY_BYTES: usize = 1 << 20;

/// Fewest bytes of one piece of a parallel copy.
const PIECE_BYTES: usize = 256 << 10;

/// Pieces per worker of a parallel copy: more than one, so that idle workers
/// take over the queued pieces of a slow one.
const PIECES_PER_WORKER: usize = 4;

/// The copy pool: one worker per core, started on first use; `None` where its
/// threads could not be started.
pub(crate) fn pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    crate::workers::persistent_pool(&POOL, crate::workers::available(), "copy")
}

/// The threads a copy of many bytes runs on: the pool's workers (1 without a
/// pool).
pub fn copy_threads() -> usize {
    pool().map_or(1, rayon::ThreadPool::current_num_threads)
}

/// Pieces a copy of `bytes` bytes is cut into (1: on the calling thread).
fn pieces(bytes: usize) -> usize {
    if bytes < PARALLEL_COPY_BYTES || pool().is_none() {
        return 1;
    }
    (bytes / PIECE_BYTES).clamp(1, copy_threads() * PIECES_PER_WORKER)
}

/// Wakes every worker of the pool at once, before a parallel copy: the copy's
/// own jobs wake sleeping workers one by one as they split (rayon wakes one
/// sleeper per job pushed), so after an idle stretch the last worker starts
/// several wake-ups' latencies after the first. On the H200 host (2026-12-04)
/// the 64 MiB batch's first 8 MiB gather took 0.44 ms (19 GB/s), where the
/// bench's gathers of the whole batch back to back ran at 68 GB/s, and an
/// earlier session found the first gather as slow at 4 MiB as at 8 (0.20 and
/// 0.21 ms): a fixed cost, as a chain of wake-ups would be. A broadcast of no
/// work wakes each sleeping worker from this thread directly, all at once; a
/// worker that is awake costs nothing. (On the 2-core build machine, whose
/// pool has two workers, waking them first changed little: 724 against
/// 746 µs for 9.6 MB after an idle stretch.)
fn wake_every_worker() {
    if let Some(pool) = pool() {
        pool.spawn_broadcast(|_| {});
    }
}

/// Runs `work` on the pool (on the calling thread without one).
fn on_pool<R: Send>(work: impl FnOnce() -> R + Send) -> R {
    match pool() {
        Some(pool) => pool.install(work),
        None => work(),
    }
}

/// The texts back to back into `out`, which must be exactly their total
/// length (an `Err` otherwise, `out` untouched): on the pool's workers from
/// [`PARALLEL_COPY_BYTES`] up, each taking a run of bytes cut without regard
/// to where documents end.
pub fn gather(out: &mut [u8], texts: &[&[u8]]) -> Result<(), TokenizerError> {
    let total: usize = texts.iter().map(|text| text.len()).sum();
    if total != out.len() {
        return Err(TokenizerError::new(
            ErrorKind::Backend,
            format!(
                "Fix: gather got {} bytes of room for texts of {total} bytes; pass room of exactly their total length",
                out.len()
            ),
        ));
    }
    let pieces = pieces(total);
    if pieces <= 1 {
        let mut at = 0;
        for text in texts {
            out[at..at + text.len()].copy_from_slice(text);
            at += text.len();
        }
        return Ok(());
    }
    let starts = text_starts(texts);
    let piece_bytes = total.div_ceil(pieces);
    wake_every_worker();
    on_pool(|| {
        out.par_chunks_mut(piece_bytes)
            .enumerate()
            .for_each(|(index, piece)| gather_piece(piece, index * piece_bytes, texts, &starts));
    });
    Ok(())
}

/// Where each text starts in the texts back to back.
pub(super) fn text_starts(texts: &[&[u8]]) -> Vec<usize> {
    let mut starts = Vec::with_capacity(texts.len());
    let mut at = 0;
    for text in texts {
        starts.push(at);
        at += text.len();
    }
    starts
}

/// The bytes of `texts` back to back (each starting at its entry of
/// `starts`) from offset `at` on, into `piece`, which they must fill.
pub(super) fn gather_piece(piece: &mut [u8], mut at: usize, texts: &[&[u8]], starts: &[usize]) {
    // The last text starting at or before `at` holds it (an empty text
    // starting there gives nothing and is passed).
    let mut text = starts.partition_point(|&start| start <= at) - 1;
    let mut done = 0;
    while done < piece.len() {
        let from = at - starts[text];
        let take = (texts[text].len() - from).min(piece.len() - done);
        piece[done..done + take].copy_from_slice(&texts[text][from..from + take]);
        done += take;
        at += take;
        text += 1;
    }
}

/// One piece of a parallel hand-out.
pub(super) enum HandOutPiece<'a> {
    /// Whole documents: each result replaced by its ids.
    Documents {
        results: &'a mut [Vec<u32>],
        /// The first document's index.
        first: usize,
    },
    /// One document larger than a piece: written by several workers straight
    /// into its vector's room.
    Large {
        result: &'a mut Vec<u32>,
        ids: &'a [u32],
    },
}

impl HandOutPiece<'_> {
    /// Gives the piece's documents their ids out of the chunk's `ids` by
    /// `starts`, on the calling thread.
    pub(super) fn fill(self, ids: &[u32], starts: &[u32]) {
        match self {
            HandOutPiece::Documents { results, first } => {
                for (offset, result) in results.iter_mut().enumerate() {
                    let document = first + offset;
                    result.clear();
                    result.extend_from_slice(
                        &ids[starts[document] as usize..starts[document + 1] as usize],
                    );
                }
            }
            HandOutPiece::Large { result, ids } => {
                result.clear();
                result.extend_from_slice(ids);
            }
        }
    }
}

/// An `Err` unless `starts` has one entry more than `documents` and its
/// offsets never decrease nor run past `ids`.
pub(super) fn check_starts(
    ids: &[u32],
    starts: &[u32],
    documents: usize,
) -> Result<(), TokenizerError> {
    if starts.len() != documents + 1 {
        return Err(internal(format!(
            "{} document starts for {documents} documents",
            starts.len(),
        )));
    }
    for (index, pair) in starts.windows(2).enumerate() {
        if pair[0] > pair[1] || pair[1] as usize > ids.len() {
            return Err(internal(format!(
                "the device gave document {index} ids {}..{} of {}",
                pair[0],
                pair[1],
                ids.len()
            )));
        }
    }
    Ok(())
}

/// `results` cut into pieces of about `share` ids (checked `starts`): runs
/// of whole documents, and each document of more than `share` ids alone.
pub(super) fn plan<'a>(
    ids: &'a [u32],
    starts: &[u32],
    results: &'a mut [Vec<u32>],
    share: usize,
) -> Vec<HandOutPiece<'a>> {
    let ids_of = |document: usize| &ids[starts[document] as usize..starts[document + 1] as usize];
    let count = results.len();
    let mut work: Vec<HandOutPiece<'a>> = Vec::new();
    let mut rest = results;
    let mut first = 0;
    while first < count {
        if ids_of(first).len() > share {
            let (document, after) = std::mem::take(&mut rest).split_at_mut(1);
            rest = after;
            work.push(HandOutPiece::Large {
                result: &mut document[0],
                ids: ids_of(first),
            });
            first += 1;
            continue;
        }
        // A run of whole documents of about `share` ids, up to the next large one.
        let mut end = first;
        let mut weight = 0;
        while end < count && weight < share && (end == first || ids_of(end).len() <= share) {
            weight += ids_of(end).len();
            end += 1;
        }
        let (run, after) = std::mem::take(&mut rest).split_at_mut(end - first);
        rest = after;
        work.push(HandOutPiece::Documents {
            results: run,
            first,
        });
        first = end;
    }
    work
}

/// Each document's ids out of a chunk's `ids` by `starts` (document `i` gets
/// `ids[starts[i]..starts[i + 1]]`; `results` has one vector per document,
/// each replaced, its memory reused where it has room): on the pool's workers
/// from [`PARALLEL_COPY_BYTES`] of ids up, cut by ids, not by documents. An
/// `Err` (and `results` untouched) when `starts` does not have one entry more
/// than `results`, or its offsets decrease or run past `ids`.
pub fn hand_out(
    ids: &[u32],
    starts: &[u32],
    results: &mut [Vec<u32>],
) -> Result<(), TokenizerError> {
    check_starts(ids, starts, results.len())?;
    let total = (starts[results.len()] - starts[0]) as usize;
    let pieces = pieces(total * 4);
    if pieces <= 1 {
        HandOutPiece::Documents { results, first: 0 }.fill(ids, starts);
        return Ok(());
    }
    let share = total.div_ceil(pieces).max(1);
    let work = plan(ids, starts, results, share);
    on_pool(|| {
        work.into_par_iter().for_each(|piece| match piece {
            // Its pieces of about `share` ids each, on any worker, written
            // in place (the vector's memory reused where it has room).
            HandOutPiece::Large { result, ids } => ids
                .par_iter()
                .with_min_len(share)
                .copied()
                .collect_into_vec(result),
            documents => documents.fill(ids, starts),
        });
    });
    Ok(())
}

fn internal(what: String) -> TokenizerError {
    TokenizerError::new(
        ErrorKind::Backend,
        format!("Fix: internal: {what}; report this as a bug"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Texts of many sizes: empty ones, short ones, and `long` ones of more
    /// than a piece, `bytes` in all (about).
    fn texts(count: usize, long: &[usize]) -> Vec<Vec<u8>> {
        (0..count)
            .map(|index| {
                let len = long
                    .iter()
                    .position(|&at| at == index)
                    .map_or((index * 7919) % 2000, |_| 3 << 20);
                (0..len).map(|at| (at * 31 + index) as u8).collect()
            })
            .collect()
    }

    /// Locks out a parallel gather that misplaces bytes where its pieces cut
    /// documents: 3,000 documents of up to 2,000 bytes (every sixth empty) with
    /// two of 3 MiB among them, and one document alone, gather into exactly
    /// their concatenation on the pool; (negative control) room of another
    /// length is a `Fix:` error and leaves it untouched.
    #[test]
    fn gather_cuts_by_bytes_and_keeps_every_byte() {
        let mut owned = texts(3000, &[10, 2999]);
        for text in owned.iter_mut().step_by(6) {
            text.clear();
        }
        let refs: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
        let total: usize = refs.iter().map(|text| text.len()).sum();
        assert!(pieces(total) > 1 || copy_threads() == 1);
        let mut out = vec![0u8; total];
        gather(&mut out, &refs).unwrap();
        assert_eq!(out, owned.concat());
        let alone = &owned[10];
        let mut out = vec![0u8; alone.len()];
        gather(&mut out, &[alone]).unwrap();
        assert_eq!(&out, alone);
        let mut short = vec![7u8; total - 1];
        let error = gather(&mut short, &refs).unwrap_err();
        assert!(error.message().starts_with("Fix:"), "{error}");
        assert!(short.iter().all(|&byte| byte == 7));
    }

    /// Locks out a parallel hand-out that misplaces ids or loses a document's
    /// length: 3,000 documents (every fifth empty, two of 3 M ids, split over
    /// several workers) get exactly their ids, into new vectors, into reused
    /// ones with room and into reused ones without (each exactly its ids, none
    /// keeping old ones); (negative controls) offsets that run backwards or
    /// past the ids, or a count of starts that does not match, are refused and
    /// leave the results untouched.
    #[test]
    fn hand_out_cuts_by_ids_into_new_and_reused_vectors() {
        let lengths: Vec<usize> = (0..3000)
            .map(|index| match index {
                _ if index % 5 == 0 => 0,
                7 | 2998 => 3 << 20,
                _ => (index * 7919) % 2000,
            })
            .collect();
        let mut starts = vec![0u32];
        for length in &lengths {
            starts.push(starts.last().unwrap() + *length as u32);
        }
        let ids: Vec<u32> = (0..*starts.last().unwrap()).map(|id| id ^ 0x5555).collect();
        let expected: Vec<&[u32]> = starts
            .windows(2)
            .map(|pair| &ids[pair[0] as usize..pair[1] as usize])
            .collect();
        let mut results = vec![Vec::new(); lengths.len()];
        hand_out(&ids, &starts, &mut results).unwrap();
        assert_eq!(results, expected);
        // Reused: as they are (room for each), then shrunk to a few old ids each.
        hand_out(&ids, &starts, &mut results).unwrap();
        assert_eq!(results, expected);
        for result in &mut results {
            *result = vec![u32::MAX; 3];
        }
        hand_out(&ids, &starts, &mut results).unwrap();
        assert_eq!(results, expected);
        let before = results.clone();
        for (bad_ids, bad_starts, documents) in [
            (&ids[..], &[0u32, 5, 3][..], 2),
            (&ids[..2], &[0, 5][..], 1),
            (&ids[..], &[0, 1][..], 2),
        ] {
            let error = hand_out(bad_ids, bad_starts, &mut results[..documents]).unwrap_err();
            assert!(error.message().starts_with("Fix:"), "{error}");
        }
        assert_eq!(results, before);
    }
}
