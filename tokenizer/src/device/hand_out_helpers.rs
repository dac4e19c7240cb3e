//! Threads kept awake through one encode's device wait, to share the copy of
//! its ids into the caller's vectors once the device is done.
//!
//! # Why this module exists
//!
//! An eager encode of one mid-size document ends with a copy on the calling
//! thread: its ids out of host-mapped memory into the caller's vector, about
//! 232 KB for 256 KiB of prose and 825 KB for CJK. On an H100 host
//! (2026-12-06) that copy was 16–20 µs of prose's 120–124 µs eager encode (a
//! `BatchIds` that reads the ids in place took 98–102) and 33–40 µs of CJK's,
//! one core at 12–14 GB/s. Sharing it with the copy pool's workers woken at
//! that moment cost more than it saved: waking a parked worker in the GPU
//! machine's VM takes 10–25 µs ([`host_copy`](super::host_copy) gives the
//! measurement). The device wait before the copy is 60–90 µs in which the
//! calling thread does nothing, so the helpers here are woken at the start of
//! that wait, spin until the copy begins (or [`SPIN_LIMIT`]), and take their
//! pieces of it at once, awake.
//!
//! A vector with room for its ids (a caller's reused one) is cut in place
//! and the calling thread takes a piece too; one without is filled by the
//! helpers alone through its spare room (rayon's `collect_into_vec`), so that
//! no memset of its new room comes first and each helper first-touches its
//! own pages. The calling thread waits for the helpers' pieces by
//! spinning, not on a condition variable (whose wake-up would cost what the
//! helpers saved): it spins until each helper has counted its piece done, then
//! [`SETTLE`] longer, so that the pool's own count of the scope's jobs, which
//! a helper lowers just after its piece, reaches zero before the calling
//! thread looks at it (where it does not, the scope's end parks the calling
//! thread until it has).
//!
//! The encoder wakes none unless asked
//! (`DeviceEncoder::with_hand_out_helpers`): until the GPU machine's
//! `gpu_encode` bench, which compares 0, 1 and 3 helpers in alternating
//! rounds, shows them faster there, the calling thread copies alone.
//!
//! One encode at a time is helped (the first to wake the helpers, until its
//! hand-out ends): the helpers' pool is small and a second encode's spinning
//! jobs would queue the first's pieces behind them. An encode that finds the
//! helpers taken copies alone, as without them.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use rayon::prelude::*;

use super::host_copy::{self, HandOutPiece};
use crate::error::TokenizerError;

/// Most helper threads an encode wakes (besides the calling thread).
pub const MOST_HELPERS: usize = 3;

/// How long a helper spins for its piece before it gives up (a caller that
/// holds a pending encode longer copies alone).
pub const SPIN_LIMIT: Duration = Duration::from_millis(1);

/// How long the calling thread keeps spinning after the helpers have counted
/// their pieces done (see the module docs).
const SETTLE: Duration = Duration::from_micros(1);

/// Fewest ids' bytes a helper's piece holds: below it, fewer helpers take
/// part.
const PIECE_BYTES: usize = 32 << 10;

/// The helpers' pool: [`MOST_HELPERS`] threads, at most one fewer than the
/// host's cores; `None` on a host of one core or where they could not start.
fn pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    let threads = MOST_HELPERS.min(crate::workers::available().saturating_sub(1));
    if threads == 0 {
        return None;
    }
    crate::workers::persistent_pool(&POOL, threads, "hand-out-helper")
}

/// Set while one encode holds the helpers.
static TAKEN: AtomicBool = AtomicBool::new(false);

/// What the helpers of one encode and the encode share.
#[derive(Debug)]
struct Shared {
    /// Set when the hand-out begins (or the encode ends without one): every
    /// helper's spin ends.
    released: AtomicBool,
    /// Helpers spinning now.
    awake: AtomicUsize,
    /// Helpers that have begun to spin (and may have ended).
    began: AtomicUsize,
    /// How long each spins at most.
    limit: Duration,
}

/// Helper threads spinning for one encode's hand-out: the encode holds them
/// from its device wait to its hand-out; dropping them releases them.
#[derive(Debug)]
pub struct Helpers {
    shared: Arc<Shared>,
}

impl Helpers {
    /// Wakes up to `count` helpers (each spinning until the hand-out or
    /// [`SPIN_LIMIT`]); `None` when `count` is 0, there is no helper pool, or
    /// another encode holds the helpers.
    pub fn wake(count: usize) -> Option<Helpers> {
        Self::wake_for(count, SPIN_LIMIT)
    }

    /// [`Helpers::wake`], each spinning at most `limit`.
    fn wake_for(count: usize, limit: Duration) -> Option<Helpers> {
        // Checked first: an encoder that asks for none never starts the pool.
        if count == 0 {
            return None;
        }
        let pool = pool()?;
        let count = count.min(pool.current_num_threads());
        if TAKEN
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return None;
        }
        let shared = Arc::new(Shared {
            released: AtomicBool::new(false),
            awake: AtomicUsize::new(0),
            began: AtomicUsize::new(0),
            limit,
        });
        for _ in 0..count {
            let shared = Arc::clone(&shared);
            pool.spawn(move || spin(&shared));
        }
        Some(Helpers { shared })
    }

    /// Ends every helper's spin; how many were spinning.
    fn release(&self) -> usize {
        let awake = self.shared.awake.load(Ordering::Acquire);
        self.shared.released.store(true, Ordering::Release);
        awake
    }
}

impl Drop for Helpers {
    fn drop(&mut self) {
        self.shared.released.store(true, Ordering::Release);
        TAKEN.store(false, Ordering::Release);
    }
}

/// One helper: spins until released or its limit.
fn spin(shared: &Shared) {
    shared.awake.fetch_add(1, Ordering::AcqRel);
    shared.began.fetch_add(1, Ordering::AcqRel);
    let start = Instant::now();
    let mut polls: u32 = 0;
    while !shared.released.load(Ordering::Acquire) {
        std::hint::spin_loop();
        polls = polls.wrapping_add(1);
        if polls.is_multiple_of(1024) && start.elapsed() > shared.limit {
            break;
        }
    }
    shared.awake.fetch_sub(1, Ordering::AcqRel);
}

/// [`host_copy::hand_out`] shared with `helpers`, where the encode has them:
/// each document's ids out of `ids` by `starts` into `results` (each
/// replaced), the calling thread and each helper still spinning taking a
/// piece. Without helpers, below a piece's worth of ids for one helper, and
/// from [`host_copy::PARALLEL_COPY_BYTES`] (where the copy pool's workers are
/// worth waking), as [`host_copy::hand_out`]. The same `Err` as it, `results`
/// untouched.
pub fn hand_out(
    ids: &[u32],
    starts: &[u32],
    results: &mut [Vec<u32>],
    helpers: Option<Helpers>,
) -> Result<(), TokenizerError> {
    let Some(helpers) = helpers else {
        return host_copy::hand_out(ids, starts, results);
    };
    host_copy::check_starts(ids, starts, results.len())?;
    let awake = helpers.release();
    let total = (starts[results.len()] - starts[0]) as usize;
    let threads = (1 + awake).min(total * 4 / PIECE_BYTES);
    let Some(pool) = pool().filter(|_| threads > 1 && total * 4 < host_copy::PARALLEL_COPY_BYTES)
    else {
        return host_copy::hand_out(ids, starts, results);
    };
    let share = total.div_ceil(threads).max(1);
    let mut pieces = Vec::with_capacity(threads + 2);
    for piece in host_copy::plan(ids, starts, results, share) {
        match piece {
            // A reused vector with room: cut in place into pieces of `share`
            // ids (no memset), the calling thread's among them.
            HandOutPiece::Large { result, ids } if result.len() >= ids.len() => {
                result.truncate(ids.len());
                pieces.extend(
                    result
                        .chunks_mut(share)
                        .zip(ids.chunks(share))
                        .map(|(into, from)| Piece::Ids { into, from }),
                );
            }
            // One without: filled by the helpers through its spare room (no
            // memset, each writing and first touching its own pages).
            HandOutPiece::Large { result, ids } => {
                pieces.push(Piece::Collect { result, ids, share })
            }
            documents => pieces.push(Piece::Documents(documents)),
        }
    }
    // The calling thread's piece: any but a `Collect`, whose parallel
    // iterator must run on the helpers' pool (from the calling thread it
    // would block on another pool).
    let mine = pieces
        .iter()
        .rposition(|piece| !matches!(piece, Piece::Collect { .. }))
        .map(|index| pieces.swap_remove(index));
    let spawned = pieces.len();
    let done = AtomicUsize::new(0);
    let done = &done;
    pool.in_place_scope(|scope| {
        for piece in pieces {
            scope.spawn(move |_| {
                // Counted also if the copy unwinds, so the spin below ends.
                let _counted = Counted(done);
                piece.copy(ids, starts);
            });
        }
        if let Some(mine) = mine {
            mine.copy(ids, starts);
        }
        while done.load(Ordering::Acquire) < spawned {
            std::hint::spin_loop();
        }
        let settled = Instant::now();
        while settled.elapsed() < SETTLE {
            std::hint::spin_loop();
        }
    });
    drop(helpers);
    Ok(())
}

/// Counts one helper's piece done when dropped.
struct Counted<'a>(&'a AtomicUsize);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }
}

/// One thread's share of a helped hand-out.
enum Piece<'a> {
    /// Whole documents (as the copy pool's pieces).
    Documents(HandOutPiece<'a>),
    /// Part of one document's ids, into its room.
    Ids {
        into: &'a mut [u32],
        from: &'a [u32],
    },
    /// One document's ids into a vector without room for them, by the
    /// helpers' pool in pieces of `share` ids (only on a helper).
    Collect {
        result: &'a mut Vec<u32>,
        ids: &'a [u32],
        share: usize,
    },
}

impl Piece<'_> {
    fn copy(self, ids: &[u32], starts: &[u32]) {
        match self {
            Piece::Documents(documents) => documents.fill(ids, starts),
            Piece::Ids { into, from } => into.copy_from_slice(from),
            Piece::Collect { result, ids, share } => ids
                .par_iter()
                .with_min_len(share)
                .copied()
                .collect_into_vec(result),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Serializes the tests that take the helpers (one encode at a time holds
    /// them, process-wide).
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
        ONE_AT_A_TIME
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Long enough that a loaded test machine cannot outlast it.
    const TEST_LIMIT: Duration = Duration::from_secs(20);

    /// Whether `done` holds within a bounded while.
    fn within_seconds(done: impl Fn() -> bool) -> bool {
        let start = Instant::now();
        while !done() && start.elapsed() < Duration::from_secs(10) {
            std::thread::yield_now();
        }
        done()
    }

    /// Waits (a bounded while) until `count` helpers have begun to spin.
    fn until_awake(helpers: &Helpers, count: usize) {
        assert!(
            within_seconds(|| helpers.shared.began.load(Ordering::Acquire) >= count),
            "no helper began to spin"
        );
    }

    /// Document lengths and their ids: `lengths[i]` ids for document `i`.
    fn batch(lengths: &[usize]) -> (Vec<u32>, Vec<u32>) {
        let mut starts = vec![0u32];
        for length in lengths {
            starts.push(starts.last().unwrap() + *length as u32);
        }
        let ids = (0..*starts.last().unwrap())
            .map(|id| id.wrapping_mul(2_654_435_761))
            .collect();
        (ids, starts)
    }

    fn expected<'a>(ids: &'a [u32], starts: &[u32]) -> Vec<&'a [u32]> {
        starts
            .windows(2)
            .map(|pair| &ids[pair[0] as usize..pair[1] as usize])
            .collect()
    }

    /// Locks out a helped hand-out that misplaces or loses ids where it cuts
    /// one document between threads, or leaves a reused vector's old ids: one
    /// document of 58,000 ids (a 256 KiB text's) into a new vector, a reused
    /// one with more room and a reused one with a few old ids; several
    /// documents with one large among them; each exactly its ids.
    #[test]
    fn helped_hand_outs_give_every_document_exactly_its_ids() {
        let _only = one_at_a_time();
        for lengths in [vec![58_000], vec![3, 0, 40_000, 17, 0, 9_000, 1]] {
            let (ids, starts) = batch(&lengths);
            for old in [Vec::new(), vec![7; 100_000], vec![7; 3]] {
                let mut results = vec![old; lengths.len()];
                let helpers = Helpers::wake_for(MOST_HELPERS, TEST_LIMIT);
                if let Some(helpers) = &helpers {
                    until_awake(helpers, 1);
                }
                hand_out(&ids, &starts, &mut results, helpers).unwrap();
                assert_eq!(results, expected(&ids, &starts), "{lengths:?}");
            }
        }
    }

    /// Locks out helpers that outlive their encode (spinning cores after the
    /// copy) or that a second encode can take while the first holds them (its
    /// spinning jobs would queue the first's pieces): while one encode holds
    /// them a second wake gets none; after the first drops them its helpers
    /// stop spinning and the next wake gets them; (negative control) a wake
    /// of no helpers takes none.
    #[test]
    fn one_encode_holds_the_helpers_and_releases_them() {
        let _only = one_at_a_time();
        let Some(first) = Helpers::wake_for(MOST_HELPERS, TEST_LIMIT) else {
            // A host of one core has no helpers.
            assert_eq!(crate::workers::available(), 1);
            return;
        };
        until_awake(&first, 1);
        assert!(first.shared.awake.load(Ordering::Acquire) >= 1);
        assert!(
            Helpers::wake(1).is_none(),
            "a second encode took the helpers"
        );
        let shared = Arc::clone(&first.shared);
        drop(first);
        assert!(
            within_seconds(|| shared.awake.load(Ordering::Acquire) == 0),
            "helpers kept spinning"
        );
        assert!(Helpers::wake(0).is_none());
        let again = Helpers::wake(1).expect("the helpers are free again");
        drop(again);
    }

    /// Locks out a helper that spins forever when its encode never hands out
    /// (a caller holding a pending encode): it stops by itself after
    /// [`SPIN_LIMIT`] while its encode still holds it.
    #[test]
    fn a_helper_stops_spinning_by_itself() {
        let _only = one_at_a_time();
        let Some(helpers) = Helpers::wake(1) else {
            return;
        };
        until_awake(&helpers, 1);
        assert!(within_seconds(|| helpers
            .shared
            .awake
            .load(Ordering::Acquire)
            == 0));
        // Its hand-out then copies alone, and right.
        let (ids, starts) = batch(&[20_000]);
        let mut results = vec![Vec::new()];
        hand_out(&ids, &starts, &mut results, Some(helpers)).unwrap();
        assert_eq!(results, expected(&ids, &starts));
    }

    /// Locks out a helped hand-out that writes before it checks: starts that
    /// run backwards are a `Fix:` error, the results untouched, the helpers
    /// released.
    #[test]
    fn bad_starts_are_refused_before_any_copy() {
        let _only = one_at_a_time();
        let (ids, _) = batch(&[50_000]);
        let mut results = vec![vec![1, 2, 3], vec![4]];
        let helpers = Helpers::wake(MOST_HELPERS);
        let error = hand_out(&ids, &[0, 40_000, 30_000], &mut results, helpers).unwrap_err();
        assert!(error.message().starts_with("Fix:"), "{error}");
        assert_eq!(results, vec![vec![1, 2, 3], vec![4]]);
        assert!(!TAKEN.load(Ordering::Acquire), "the helpers stayed taken");
    }
}
