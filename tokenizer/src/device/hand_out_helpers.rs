//! A crew of threads kept awake around an encode the caller waits for, to
//! share its two host copies: the text into the staging before the device
//! starts, and the ids into the caller's vectors once it is done.
//!
//! # Why this module exists
//!
//! An eager encode of one mid-size document copies on the calling thread at
//! both ends: its text into pinned staging (9–12 µs for 256 KiB on an H100
//! host, 2026-12-06) and its ids out of host-mapped memory into the caller's
//! vector (about 232 KB for 256 KiB of prose, 825 KB for CJK: 16–20 µs of
//! prose's 120–124 µs eager encode, where a `BatchIds` that reads the ids in
//! place took 98–102, and 33–40 µs of CJK's), one core at 12–14 GB/s while
//! the host's other cores idle. Sharing them with the copy pool's workers
//! woken at that moment cost more than it saved: a parked worker in the GPU
//! machine's VM wakes in 10–25 µs ([`host_copy`] gives the
//! measurement). So the crew here is woken where waiting costs nothing, at the
//! start of the device wait (60–90 µs in which the calling thread does
//! nothing), spins until the ids are there (at most [`SPIN_LIMIT`]), takes its
//! pieces of the hand-out at once, awake, and then keeps spinning for
//! [`LINGER`], so that an encode that follows at once (a caller encoding
//! documents back to back) finds it awake for its staging too.
//!
//! A vector with room for its ids (a caller's reused one) is cut in place
//! and the calling thread takes a piece too; one without is filled by the
//! crew alone through its spare room (rayon's `collect_into_vec`), so that
//! no memset of its new room comes first and each helper first-touches its
//! own pages. The calling thread waits for the crew's pieces by spinning, not
//! on a condition variable (whose wake-up would cost what the crew saved): it
//! spins until each helper has counted its piece done, then [`SETTLE`]
//! longer, so that the pool's own count of the scope's jobs, which a helper
//! lowers just after its piece, reaches zero before the calling thread looks
//! at it (where it does not, the scope's end parks the calling thread until it
//! has).
//!
//! An encoder on CUDA wakes three helpers
//! ([`HAND_OUT_HELPERS`](super::pipeline::HAND_OUT_HELPERS), whose docs give
//! the GPU machine's figures: one 256 KiB document of prose 100.8–104.9 µs
//! eagerly against 112.9–113.5 alone, CJK 111.3–113.3 against 135.6–138.2, on
//! an H100 host, 2026-12-06); `DeviceEncoder::with_hand_out_helpers` sets
//! another count or none. On the 2-core build machine (2026-12-06, one
//! helper, the crew awake, warm caches, median of 300) 206,000 ids (a
//! 256 KiB CJK text's) were handed out in 14.3–15.2 µs against 41.8–47.4
//! alone, 256 KiB of text staged in 7.0–7.6 against 11.8–15.5.
//!
//! The spinning also serves the kernel itself. With the crew spinning through
//! the device wait, the resident kernel (which reads the text and writes the
//! ids across PCIe) ran shorter by its own clock: 256 KiB of prose 58.7–60.2
//! µs against 68.6–74.3 without helpers, on an H100 host (2026-12-06), most
//! likely because a host whose cores idle serves those reads and writes more
//! slowly. So encodes that hand nothing out (a `BatchIds` part,
//! `EncodeGraph::encode_in_place`) take the crew too, for their staging and
//! their wait.
//!
//! One encode at a time has the crew (from its staging to the end of its
//! hand-out): the crew's pool is small, and another encode's spinning jobs
//! would queue the first's pieces behind them. An encode that finds the crew
//! taken copies alone, as without it.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rayon::prelude::*;

use super::host_copy::{self, HandOutPiece};
use super::programs::TEXT_READY_PIECE_BYTES;
use super::text_ready::{write_publishing, PublishAllOnDrop, ReadyFlags};
use crate::error::TokenizerError;

/// Most helper threads an encode wakes (besides the calling thread).
pub const MOST_HELPERS: usize = 3;

/// How long the crew spins, once woken for a device wait or after a staging,
/// before it gives up (a caller that holds a pending encode longer copies its
/// ids alone).
pub const SPIN_LIMIT: Duration = Duration::from_millis(1);

/// How long the crew keeps spinning after a hand-out, for the staging of an
/// encode that follows at once: at most this much of its cores' time is spent
/// on nothing after an encode that no other follows.
pub const LINGER: Duration = Duration::from_micros(250);

/// How long the calling thread keeps spinning after the helpers have counted
/// their pieces done (see the module docs): several times a helper's path from
/// its count to the scope's (a return and one atomic). On the 2-core build
/// machine (2026-12-06, 58,000 ids and 256 KiB of text, cache-warm, one
/// helper) the shared hand-out took 5.8–5.9 µs with 250 ns here against
/// 6.4–6.6 with 1 µs (alone: 6.3–7.5), the shared staging 6.1–7.0 against
/// 7.2–7.7 (alone: 7.1–8.3).
const SETTLE: Duration = Duration::from_nanos(250);

/// Fewest bytes of one thread's piece of a shared copy: below it, fewer
/// helpers take part.
const PIECE_BYTES: usize = 32 << 10;

/// The crew's pool: [`MOST_HELPERS`] threads, at most one fewer than the
/// host's cores; `None` on a host of one core or where they could not start.
fn pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    let threads = MOST_HELPERS.min(crate::workers::available().saturating_sub(1));
    if threads == 0 {
        return None;
    }
    crate::workers::persistent_pool(&POOL, threads, "hand-out-helper")
}

/// Set while one encode holds the crew.
static TAKEN: AtomicBool = AtomicBool::new(false);

/// What the crew's spinning jobs and the encode that holds the crew share
/// (one crew per process, as its pool).
#[derive(Debug)]
struct Crew {
    /// The generation (above [`ARMED_BITS`]) and how many of its jobs are
    /// armed (spawned and not yet out of time: spinning, or queued to spin),
    /// in one word, so that a job that runs out of time and an encode that
    /// extends the time cannot both miss it (see `Crew::spin`). A release
    /// starts the next generation with none armed: every job of an earlier
    /// one ends, and the crew's threads take the copy's pieces.
    state: AtomicU64,
    /// Jobs spinning now.
    spinning: AtomicUsize,
    /// Jobs that have begun to spin, ever (read by tests alone).
    #[cfg(test)]
    began: AtomicUsize,
    /// Copies shared with the crew, ever (read by tests alone).
    #[cfg(test)]
    shared: AtomicUsize,
    /// When the spinning jobs stop, in ns from `epoch`.
    until_ns: AtomicU64,
    epoch: Instant,
}

fn crew() -> &'static Crew {
    static CREW: OnceLock<Crew> = OnceLock::new();
    CREW.get_or_init(|| Crew {
        state: AtomicU64::new(0),
        spinning: AtomicUsize::new(0),
        #[cfg(test)]
        began: AtomicUsize::new(0),
        #[cfg(test)]
        shared: AtomicUsize::new(0),
        until_ns: AtomicU64::new(0),
        epoch: Instant::now(),
    })
}

impl Crew {
    fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Keeps `count` jobs of the current generation spinning for `spin` from
    /// now (the last request sets the crew's time: one encode holds it):
    /// arms and spawns the ones missing (a syscall each only where a thread
    /// of the pool sleeps). The time is set before the armed jobs are
    /// counted, so a job counted here that is running out of time sees it
    /// (`Crew::spin`).
    fn keep_spinning(&self, pool: &rayon::ThreadPool, count: usize, spin: Duration) {
        let spin_ns = u64::try_from(spin.as_nanos()).unwrap_or(u64::MAX);
        #[cfg(test)]
        let spin_ns = spin_ns.max(test_support::SPIN_FLOOR_NS.load(Ordering::Acquire));
        self.until_ns
            .store(self.now_ns().saturating_add(spin_ns), Ordering::SeqCst);
        loop {
            let state = self.state.load(Ordering::SeqCst);
            if armed_of(state) >= count.min(ARMED_MASK as usize) {
                return;
            }
            if self
                .state
                .compare_exchange(state, state + 1, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                let generation = generation_of(state);
                pool.spawn(move || crew().spin(generation));
            }
        }
    }

    /// One spinning job: until its generation ends or the crew's time is up.
    /// A job out of time disarms itself, then looks at the time once more: an
    /// encode that extended it in between may have counted this job as armed
    /// (and spawned none in its place), so the job arms itself again and
    /// spins on. Either the encode counts it disarmed and spawns another, or
    /// the job sees the new time: the crew never ends up with fewer jobs than
    /// asked for (at worst one more, which runs out of time in turn).
    fn spin(&self, generation: u64) {
        self.spinning.fetch_add(1, Ordering::AcqRel);
        #[cfg(test)]
        self.began.fetch_add(1, Ordering::AcqRel);
        let of_this_generation = |state: u64| (generation_of(state) == generation).then_some(state);
        let mut polls: u32 = 0;
        while of_this_generation(self.state.load(Ordering::Acquire)).is_some() {
            std::hint::spin_loop();
            polls = polls.wrapping_add(1);
            if !polls.is_multiple_of(1024) || self.now_ns() <= self.until_ns.load(Ordering::SeqCst)
            {
                continue;
            }
            let disarmed = self
                .state
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |state| {
                    of_this_generation(state)
                        .filter(|&state| armed_of(state) > 0)
                        .map(|state| state - 1)
                });
            let time_extended = self.now_ns() <= self.until_ns.load(Ordering::SeqCst);
            if disarmed.is_err()
                || !time_extended
                || self
                    .state
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |state| {
                        of_this_generation(state).map(|state| state + 1)
                    })
                    .is_err()
            {
                break;
            }
        }
        self.spinning.fetch_sub(1, Ordering::AcqRel);
    }

    /// Ends every spinning job (a new generation, none armed), so that the
    /// crew's threads take pieces.
    fn release(&self) {
        let _ = self
            .state
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |state| {
                Some((generation_of(state) + 1) << ARMED_BITS)
            });
    }

    /// Whether no job is armed or spinning.
    #[cfg(test)]
    fn idle(&self) -> bool {
        armed_of(self.state.load(Ordering::Acquire)) == 0
            && self.spinning.load(Ordering::Acquire) == 0
    }
}

/// Bits of [`Crew`]'s state that count armed jobs (below the generation).
const ARMED_BITS: u32 = 16;
const ARMED_MASK: u64 = (1 << ARMED_BITS) - 1;

fn generation_of(state: u64) -> u64 {
    state >> ARMED_BITS
}

fn armed_of(state: u64) -> usize {
    (state & ARMED_MASK) as usize
}

/// The crew, held by one encode from its staging to the end of its hand-out;
/// dropping it lets another encode take the crew (whose jobs keep spinning
/// until their time is up).
#[derive(Debug)]
pub struct Helpers {
    pool: &'static rayon::ThreadPool,
    /// Threads besides the calling one that the encode asked for.
    count: usize,
}

impl Helpers {
    /// The crew for an encode that asks for `count` helpers (at most the
    /// pool's threads); `None` when `count` is 0, there is no pool, or another
    /// encode holds the crew. Wakes nothing: a crew still spinning after the
    /// encode before shares this one's staging.
    pub fn take(count: usize) -> Option<Helpers> {
        // Checked first: an encoder that asks for none never starts the pool.
        if count == 0 {
            return None;
        }
        let pool = pool()?;
        TAKEN
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .ok()?;
        Some(Helpers {
            pool,
            count: count.min(pool.current_num_threads()),
        })
    }

    /// Keeps the crew spinning through a device wait (at most
    /// [`SPIN_LIMIT`]), waking the threads that sleep.
    pub fn wake(&self) {
        crew().keep_spinning(self.pool, self.count, SPIN_LIMIT);
    }

    /// Keeps the crew spinning for [`LINGER`], for the staging of an encode
    /// that follows at once (after a hand-out with nothing to copy).
    pub fn linger(&self) {
        crew().keep_spinning(self.pool, self.count, LINGER);
    }

    /// How many threads share a copy of `bytes` bytes: the calling one and
    /// each helper spinning now, at least [`PIECE_BYTES`] each.
    fn threads_for(&self, bytes: usize) -> usize {
        let awake = crew().spinning.load(Ordering::Acquire).min(self.count);
        (1 + awake).min(bytes / PIECE_BYTES).max(1)
    }

    /// Runs `mine` on the calling thread and each of `others` on the crew
    /// (released from its spinning first), then keeps the crew spinning for
    /// `then` (the device wait after a staging, [`LINGER`] after a hand-out).
    fn share<P: Send>(
        &self,
        mine: Option<P>,
        others: Vec<P>,
        run: &(impl Fn(P) + Sync),
        then: Duration,
    ) {
        let crew = crew();
        crew.release();
        #[cfg(test)]
        crew.shared.fetch_add(1, Ordering::AcqRel);
        let spawned = others.len();
        let done = AtomicUsize::new(0);
        let done = &done;
        self.pool.in_place_scope(|scope| {
            for piece in others {
                scope.spawn(move |_| {
                    // Counted also if the copy unwinds, so the spin below ends.
                    let _counted = Counted(done);
                    run(piece);
                });
            }
            if let Some(mine) = mine {
                run(mine);
            }
            while done.load(Ordering::Acquire) < spawned {
                std::hint::spin_loop();
            }
            let settled = Instant::now();
            while settled.elapsed() < SETTLE {
                std::hint::spin_loop();
            }
        });
        crew.keep_spinning(self.pool, self.count, then);
    }
}

impl Drop for Helpers {
    fn drop(&mut self) {
        TAKEN.store(false, Ordering::Release);
    }
}

/// Counts one helper's piece done when dropped.
struct Counted<'a>(&'a AtomicUsize);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }
}

/// [`host_copy::gather`] shared with the crew, where the encode holds it and
/// the crew spins: the texts back to back into `out`, cut by bytes. Without
/// it, below a piece's worth of bytes for one helper, and from
/// [`host_copy::PARALLEL_COPY_BYTES`] (where the copy pool's workers are worth
/// waking), as [`host_copy::gather`], whose `Err` it gives. With `ready` (a
/// kernel already running reads the staging as its flags go up), each thread
/// writes its share piece by piece and publishes each piece's flag after it,
/// the shares cut at pieces' edges; every flag is set when this returns,
/// however it returns ([`PublishAllOnDrop`]).
pub fn gather(
    out: &mut [u8],
    texts: &[&[u8]],
    helpers: Option<&Helpers>,
    ready: Option<ReadyFlags<'_>>,
) -> Result<(), TokenizerError> {
    let _published = ready.map(PublishAllOnDrop);
    let ready = ready.as_ref();
    let total: usize = texts.iter().map(|text| text.len()).sum();
    let threads = helpers.map_or(1, |helpers| helpers.threads_for(total));
    let shared = threads > 1 && total == out.len() && total < host_copy::PARALLEL_COPY_BYTES;
    let starts = host_copy::text_starts(texts);
    let write = |piece: &mut [u8], at: usize| host_copy::gather_piece(piece, at, texts, &starts);
    let (Some(helpers), true) = (helpers, shared) else {
        if ready.is_none() || total != out.len() || total >= host_copy::PARALLEL_COPY_BYTES {
            return host_copy::gather(out, texts);
        }
        write_publishing(out, 0, ready, write);
        return Ok(());
    };
    // Whole pieces per thread where a kernel reads them as they are published.
    let piece_bytes = match ready {
        Some(_) => total
            .div_ceil(threads)
            .next_multiple_of(TEXT_READY_PIECE_BYTES as usize),
        None => total.div_ceil(threads),
    };
    let mut pieces: Vec<(usize, &mut [u8])> = out
        .chunks_mut(piece_bytes)
        .enumerate()
        .map(|(index, piece)| (index * piece_bytes, piece))
        .collect();
    let mine = pieces.pop();
    helpers.share(
        mine,
        pieces,
        &|(at, piece): (usize, &mut [u8])| write_publishing(piece, at, ready, write),
        SPIN_LIMIT,
    );
    Ok(())
}

/// [`host_copy::hand_out`] shared with the crew, where the encode holds it:
/// each document's ids out of `ids` by `starts` into `results` (each
/// replaced), the calling thread and each helper spinning taking a piece;
/// the crew then lingers ([`LINGER`]). Without it, below a piece's worth of
/// ids for one helper, and from [`host_copy::PARALLEL_COPY_BYTES`], as
/// [`host_copy::hand_out`]. The same `Err` as it, `results` untouched.
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
    let total = (starts[results.len()] - starts[0]) as usize;
    let threads = helpers.threads_for(total * 4);
    if threads <= 1 || total * 4 >= host_copy::PARALLEL_COPY_BYTES {
        return host_copy::hand_out(ids, starts, results);
    }
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
            // One without: filled by the crew through its spare room (no
            // memset, each helper writing and first touching its own pages).
            HandOutPiece::Large { result, ids } => {
                pieces.push(Piece::Collect { result, ids, share })
            }
            documents => pieces.push(Piece::Documents(documents)),
        }
    }
    // The calling thread's piece: any but a `Collect`, whose parallel
    // iterator must run on the crew's pool (from the calling thread it would
    // block on another pool).
    let mine = pieces
        .iter()
        .rposition(|piece| !matches!(piece, Piece::Collect { .. }))
        .map(|index| pieces.swap_remove(index));
    helpers.share(
        mine,
        pieces,
        &|piece: Piece<'_>| piece.copy(ids, starts),
        LINGER,
    );
    Ok(())
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
    /// crew's pool in pieces of `share` ids (only on a helper).
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

/// What the crate's unit tests need to drive the crew through a whole encode
/// on the reference backend, whose "device wait" outlasts any spin.
#[cfg(test)]
pub(crate) mod test_support {
    use super::*;

    /// The least time `Crew::keep_spinning` keeps the crew spinning (0: as
    /// built).
    pub(super) static SPIN_FLOOR_NS: AtomicU64 = AtomicU64::new(0);

    /// Serializes the tests that use the crew (one encode at a time holds
    /// it, process-wide).
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

    pub(crate) fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
        ONE_AT_A_TIME
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Keeps the crew spinning at least `floor` whenever it is asked to spin
    /// (`Duration::ZERO`: as built), and wakes `count` of it now.
    pub(crate) fn spin_at_least(floor: Duration, count: usize) {
        let floor_ns = u64::try_from(floor.as_nanos()).unwrap_or(u64::MAX);
        SPIN_FLOOR_NS.store(floor_ns, Ordering::Release);
        if let (Some(pool), true) = (pool(), count > 0) {
            crew().keep_spinning(pool, count, floor);
        }
    }

    /// Waits (at most 10 s) until a job of the crew spins.
    pub(crate) fn until_spinning() {
        let start = Instant::now();
        while crew().spinning.load(Ordering::Acquire) == 0
            && start.elapsed() < Duration::from_secs(10)
        {
            std::thread::yield_now();
        }
    }

    /// Copies shared with the crew so far.
    pub(crate) fn copies_shared() -> usize {
        crew().shared.load(Ordering::Acquire)
    }

    /// Ends every spinning job (the floor back at 0 first).
    pub(crate) fn quiet() {
        SPIN_FLOOR_NS.store(0, Ordering::Release);
        crew().release();
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::one_at_a_time;
    use super::*;
    use crate::device::text_ready::{flag_words, pieces};
    use std::sync::atomic::AtomicU32;

    /// Long enough that a loaded test machine cannot outlast it.
    const TEST_SPIN: Duration = Duration::from_secs(20);

    /// Whether `done` holds within a bounded while.
    fn within_seconds(done: impl Fn() -> bool) -> bool {
        let start = Instant::now();
        while !done() && start.elapsed() < Duration::from_secs(10) {
            std::thread::yield_now();
        }
        done()
    }

    /// The crew taken for `count` helpers, spinning for `spin`, with at least
    /// one job begun; `None` on a host without a crew.
    fn awake_crew(count: usize, spin: Duration) -> Option<Helpers> {
        let helpers = Helpers::take(count)?;
        let began = crew().began.load(Ordering::Acquire);
        crew().keep_spinning(helpers.pool, count, spin);
        assert!(
            within_seconds(|| crew().spinning.load(Ordering::Acquire) >= 1
                || crew().began.load(Ordering::Acquire) > began),
            "no helper began to spin"
        );
        Some(helpers)
    }

    /// Lets every spinning job end and waits for it.
    fn quiet_crew() {
        crew().release();
        assert!(within_seconds(|| crew().idle()));
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

    /// Locks out a shared hand-out that misplaces or loses ids where it cuts
    /// one document between threads, or leaves a reused vector's old ids: one
    /// document of 58,000 ids (a 256 KiB text's) into a new vector, a reused
    /// one with more room and a reused one with a few old ids; several
    /// documents with one large among them; each exactly its ids.
    #[test]
    fn shared_hand_outs_give_every_document_exactly_its_ids() {
        let _only = one_at_a_time();
        for lengths in [vec![58_000], vec![3, 0, 40_000, 17, 0, 9_000, 1]] {
            let (ids, starts) = batch(&lengths);
            for old in [Vec::new(), vec![7; 100_000], vec![7; 3]] {
                let mut results = vec![old; lengths.len()];
                let helpers = awake_crew(MOST_HELPERS, TEST_SPIN);
                hand_out(&ids, &starts, &mut results, helpers).unwrap();
                assert_eq!(results, expected(&ids, &starts), "{lengths:?}");
            }
        }
        // The last hand-out left the crew spinning for its linger, which ends.
        assert!(
            within_seconds(|| crew().idle()),
            "the crew kept spinning past its linger"
        );
    }

    /// Locks out a shared staging that misplaces bytes where its pieces cut
    /// documents: 200 texts of up to 2,000 bytes (every fifth empty) and one
    /// alone of 200 KB gather into exactly their concatenation with the crew
    /// awake, and so do they when fed to a running kernel piece by piece,
    /// each thread's share cut at pieces' edges, with every ready flag set at
    /// the end; (negative control) room of another length is a `Fix:` error.
    #[test]
    fn shared_stagings_keep_every_byte() {
        let _only = one_at_a_time();
        let owned: Vec<Vec<u8>> = (0..200)
            .map(|index| {
                let len = if index % 5 == 0 {
                    0
                } else {
                    (index * 7919) % 2000
                };
                (0..len).map(|at| (at * 31 + index) as u8).collect()
            })
            .chain([(0..200_000).map(|at| (at % 251) as u8).collect()])
            .collect();
        let refs: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
        for texts in [&refs[..200], &refs[200..], &refs[..]] {
            let total: usize = texts.iter().map(|text| text.len()).sum();
            let mut out = vec![0u8; total];
            let helpers = awake_crew(MOST_HELPERS, TEST_SPIN);
            gather(&mut out, texts, helpers.as_ref(), None).unwrap();
            assert_eq!(out, texts.concat());
            let mut short = vec![0u8; total - 1];
            let error = gather(&mut short, texts, helpers.as_ref(), None).unwrap_err();
            assert!(error.message().starts_with("Fix:"), "{error}");
            // Fed to a running kernel: the same bytes, every flag set.
            let words: Vec<AtomicU32> = (0..flag_words(total)).map(|_| AtomicU32::new(0)).collect();
            let mut fed = vec![0u8; total];
            let ready = ReadyFlags::new(&words, total).unwrap();
            gather(&mut fed, texts, helpers.as_ref(), Some(ready)).unwrap();
            assert_eq!(fed, texts.concat());
            assert_eq!(ready.flags().count(), pieces(total));
            assert!(ready.flags().all(|flag| flag.load(Ordering::Acquire) == 1));
        }
        quiet_crew();
    }

    /// Locks out a crew that a second encode can take while the first holds
    /// it (its spinning jobs would queue the first's pieces) or that never
    /// comes back: while one encode holds it a second take gets none; once
    /// the first drops it the next take gets it; (negative control) a take
    /// of no helpers gets none.
    #[test]
    fn one_encode_holds_the_crew_at_a_time() {
        let _only = one_at_a_time();
        let Some(first) = awake_crew(MOST_HELPERS, Duration::from_millis(50)) else {
            // A host of one core has no crew.
            assert_eq!(crate::workers::available(), 1);
            return;
        };
        assert!(Helpers::take(1).is_none(), "a second encode took the crew");
        drop(first);
        assert!(Helpers::take(0).is_none());
        let again = Helpers::take(1).expect("the crew is free again");
        drop(again);
        quiet_crew();
    }

    /// Locks out a crew that spins forever when no encode needs it (a caller
    /// holding a pending encode): its jobs stop by themselves once their time
    /// is up, and a hand-out after that copies alone, and right. (The linger
    /// after a shared hand-out ends too: the first test.)
    #[test]
    fn the_crew_stops_spinning_by_itself() {
        let _only = one_at_a_time();
        let Some(helpers) = awake_crew(1, Duration::from_millis(2)) else {
            return;
        };
        assert!(within_seconds(|| crew().idle()), "the crew kept spinning");
        let (ids, starts) = batch(&[20_000]);
        let mut results = vec![Vec::new()];
        hand_out(&ids, &starts, &mut results, Some(helpers)).unwrap();
        assert_eq!(results, expected(&ids, &starts));
    }

    /// Locks out a shared hand-out that writes before it checks: starts that
    /// run backwards are a `Fix:` error, the results untouched, the crew free
    /// again.
    #[test]
    fn bad_starts_are_refused_before_any_copy() {
        let _only = one_at_a_time();
        let (ids, _) = batch(&[50_000]);
        let mut results = vec![vec![1, 2, 3], vec![4]];
        let helpers = awake_crew(MOST_HELPERS, TEST_SPIN);
        let error = hand_out(&ids, &[0, 40_000, 30_000], &mut results, helpers).unwrap_err();
        assert!(error.message().starts_with("Fix:"), "{error}");
        assert_eq!(results, vec![vec![1, 2, 3], vec![4]]);
        assert!(!TAKEN.load(Ordering::Acquire), "the crew stayed taken");
        quiet_crew();
    }
}
