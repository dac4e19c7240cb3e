//! The device pipeline as vyre-cuda programs: `stage`, the encoding's split
//! (the [batch split](crate::pretokenize::batch), composed here), the BPE
//! steps, and the one description of them ([`Programs`], over [`STEPS`]) that
//! every run follows.
//!
//! # The steps
//!
//! | step | program | grid | what it does |
//! |---|---|---|---|
//! | `stage` | [`stage`] | the text's 16-byte groups (or its documents, if more), at most [`Geometry::stage_workgroups`] (text read from host-mapped memory) or [`DEVICE_STAGE_WORKGROUPS`] (text brought into device memory by the copy engine), striding over both | copies the staged text, document ends (padded with the text length to the buffer's end: empty documents) and parameters into device buffers (eager runs only; a graph uploads them) |
//! | `split` (r50k, p50k) | GPT-2's batch split | one workgroup per block of [`Geometry::split`] | the piece starts of every document, as if alone, and their count |
//! | `classify`, `phases` (cl100k, o200k) | the pattern's batch split | the same | the same in two dispatches (the look-ahead facts as one code per byte, then the state machine) |
//! | `pieces` | [`pieces`] | at most [`Geometry::pieces_workgroups`], striding over tiles of `W` pieces | a piece that is one token (most are) writes its rank; a piece of up to [`Geometry::chunk_bytes`] that is not goes on the merge list; a longer piece goes on the long list and its chunks on the chunk list |
//! | `merge` | [`merge`] | a thread per 8 bytes, striding over both lists (in a fused kernel dealt out a warp's worth per workgroup) | tiktoken's merge loop, one thread per listed piece or chunk |
//! | `long` | [`long`] | striding over the long list | checks every chunk boundary of a long piece, repairs the ones that fail, and encodes the piece serially when a repair cannot be proved |
//! | `compact` | [`compact`] | at most [`Geometry::compact_workgroups`] (host-mapped ids) or [`DEVICE_COMPACT_WORKGROUPS`] (ids in device memory), each owning whole blocks of `4 · W` bytes | counts its blocks' tokens, takes the tokens before them from the workgroups before it (a look-back over the split's status words), then the ids in text order into `ids` (each warp a whole 128-byte line at a time), each document's first id index into `document_token_starts`, the total after them |
//!
//! An eager chunk is six dispatches for r50k and p50k and seven for cl100k
//! and o200k; a graph replays all but `stage`. The split's steps bind the
//! encoder's own buffers by role ([`Role::of_split`]): the text and document
//! ends `stage` wrote, the resident kind table, their scratch (codes, status
//! words and counters, per slot, so chunks in flight never share them) and
//! the piece starts and count that `pieces` reads. `compact` binds the
//! split's status words and counters too, for its own look-back: the split
//! leaves them zero, and so does `compact`.
//!
//! Every step but the split's reads its sizes from the `params` words
//! ([`param`](mod@param)) instead of buffer lengths (the split reads the
//! text's length from the last, padded, document end), so one set of buffers
//! (grown by powers of two) serves every text length, and the lists are filled
//! through counters in the same words (which every encode uploads as zero).
//!
//! # `pieces` on a fixed grid
//!
//! The host launches `pieces` before it knows how many pieces the split found,
//! and a text of `n` bytes has at most `n`. So it ran one thread per byte: on
//! the H200 (2026-12-01) a 16 MiB cl100k chunk (16,776,069 bytes, 3,047,888
//! pieces) ran 65,532 workgroups of 256 threads; 82 % of the threads had no
//! piece yet took the merge list's workgroup scan and reduction, and each of
//! the 524,256 warps ended in the result ABI's fence and atomic on one control
//! word; `pieces` took 0.61–0.88 ms per chunk. Now at most
//! [`Geometry::pieces_workgroups`] workgroups (1,024 by default, about what the
//! H200 holds at once) stride over the device's own piece count in tiles of
//! `W` pieces: workgroup `g` takes tiles `g, g + G, ...`, so every barrier of a
//! tile is reached by the whole workgroup. For that chunk that is 1,024
//! workgroups, 8,192 warps, 11 or 12 of the 11,906 tiles each (not yet
//! measured on the device). A tile claims its merge-list entries with one
//! inclusive scan (the last thread's value is the tile's total) instead of a
//! scan and a reduction. The short-text program runs `pieces` as one group
//! that takes every tile.
//!
//! Since the encoder's split cuts between bytes no token joins, a CJK text
//! has about 0.58 pieces per byte (8 MiB of generated CJK: 4.87 M pieces,
//! most of them one to three bytes) and `pieces` takes 108–111 µs for it
//! where it took 27–28 (prose 62–64, code 82–84). Tried on the H200
//! (2026-12-04, the encode example, 8 MiB of each shape, eager, alternating
//! with the tree before in one call) and not kept:
//! - a dense table of the tokens that are one 3-byte character (256 KiB of
//!   the vocabulary, one load instead of the hashed table's probe and
//!   compare): CJK 112.7 and 113.6 against 109.6 and 110.3 µs. The lookups
//!   are not what a CJK piece costs;
//! - four pieces a thread per tile (`tile · 4W + k · W + t`: one scan, claim
//!   and barrier a tile for four pieces): CJK 96 against 109 µs, but the merge
//!   list then interleaved four regions of the text and `merge` lost what
//!   `pieces` gained (CJK 108–112 against 102–105, prose 199 against
//!   190–193); eight a thread at 40 registers: every shape slower (CJK
//!   137–143); four consecutive pieces a thread (`tile · 4W + 4t + k`, the
//!   merge list in text order): CJK 98 against 110, but prose 77 against 62
//!   and code 137–140 against 83–84 (a warp's lookups then read the text at
//!   32 places four pieces apart).
//!
//! # `stage` and `compact` wait on PCIe
//!
//! On CUDA `stage` reads the staged text from host-mapped memory and `compact`
//! writes the ids into it (in chunks below
//! [`COPY_ENGINE_FROM`](super::pipeline::COPY_ENGINE_FROM); larger
//! ones keep their ids in device memory for the copy engine, and their
//! `compact` takes up to [`DEVICE_COMPACT_WORKGROUPS`]; the text of chunks from
//! [`TEXT_COPY_ENGINE_FROM`](super::pipeline::TEXT_COPY_ENGINE_FROM) comes up
//! by the copy engine, and their `stage` takes up to
//! [`DEVICE_STAGE_WORKGROUPS`]), so both are bound by
//! PCIe, not by the SMs: on the
//! H200 (2026-12-02, a 64 MiB cl100k batch in four 16 MiB chunks) `stage` took
//! 0.39–0.76 ms per chunk against ≥ 0.31 ms for 16 MiB at the ~54 GB/s pinned
//! copy bound, and `compact` 0.87–1.21 ms for about 34 MB of ids against
//! ≥ 0.65 ms at ~52 GB/s. Their grids ([`Geometry::stage_workgroups`],
//! [`Geometry::compact_workgroups`]) can be capped, so that fewer workgroups
//! keep PCIe busy while the other chunks' steps take the SMs: capped at their
//! defaults ([`STAGE_WORKGROUPS`], [`COMPACT_WORKGROUPS`]) the batch took
//! 0.88 × its time with both uncapped (11.57 against 13.09 ms). `compact`
//! stores its ids as whole 128-byte lines, each warp's 32 words aligned
//! ([`compact`]).
//!
//! # Where a token is written
//!
//! `token_at[i]` holds the rank of the token that starts at byte `i` and
//! [`NO_TOKEN`] at every other byte of the text. A piece or chunk is encoded by
//! one thread that owns its bytes, so no two threads write one element; the
//! compaction then reads the tokens in text order. While a range merges,
//! `token_at` holds the same for its parts (every part is a token): the rank of
//! each part at its first byte, so the merge loop looks every pair up by the
//! two ranks in the vocabulary's pair table (below).
//!
//! # The merge loop
//!
//! One thread merges a range of `L` bytes (a piece, a chunk, a repair window
//! or the two tokens of a compatibility check) by tiktoken's rule: while some
//! adjacent pair of parts is a token, merge the pair of lowest rank, the
//! leftmost of those. Its state lives in two scratch arrays indexed by text
//! position, so a thread needs no local array (which every thread of a kernel
//! would zero at entry) and a range of any length fits:
//!
//! - `merge_parts[i]`: at a part's first byte, the part's length (bits
//!   24..32; a part is a token, at most 255 bytes) and the rank of its pair
//!   with the next part (bits 0..20, all ones for none: ranks are below
//!   2^18); length 0 at every other byte, and at the last byte of a part of
//!   two or more bytes a *back word*: pair bits that are no rank, whose low
//!   byte is the part's length.
//! - `merge_minima[start + k]`: the leftmost pair of lowest rank of the
//!   range's 16-byte block `k` (positions `16k..16k + 16`): its rank above
//!   bit 12, its part's offset in the block in bits 8..12, that part's
//!   length in the low 8 bits.
//! - `token_at[i]`: at a part's first byte, the part's rank; [`NO_TOKEN`] at
//!   every other byte.
//!
//! Both arrays hold exactly that after every merge (the merge rewrites every
//! word whose part or pair changed and brings every block holding one up to
//! date), so a merge takes the leftmost block of lowest rank and the part its
//! minimum names: exactly the leftmost pair of lowest rank, whose rank is the
//! merged token's, and the first part's length with it. The second part's
//! word (its length) and the word just before the first part (the part
//! before's start, or its last byte's back word: that part's length) are
//! loaded together; then the ranks of the part after and of the part before
//! in `token_at`, together; then the two pair lookups. The merge makes the
//! second part's word "no part" (and its `token_at` "no token"), writes the
//! merged part's rank into `token_at`, its length and new pair's rank into
//! its word and its length into a back word at its last byte, re-ranks the
//! part before's pair, and recomputes the first part's block; the part
//! before's and the second part's blocks, where they are others, only if
//! their minimum named the word that changed (otherwise the part before's
//! new pair is one candidate more, and a word that lost its pair leaves the
//! minimum as it was). A range's first minima come from the ranks its first
//! pass holds in registers. Per merge that is `⌈L/16⌉` minima, 16 words to
//! refresh a block (rarely 48), two pair lookups and a handful of stores:
//! about 45 loads besides the lookups for `L` = 384, nothing moved.
//!
//! Why the merge is laid out so: a thread's merges are a chain of dependent
//! loads, and the chain is what `merge` waits on. On the H200 (2026-12-04,
//! Nsight Compute's stall samples of `merge` on 8 MiB of CJK, cl100k: 354,000
//! pieces of 4–34 ideographs on the merge list, 7.3 of 32 threads of a warp
//! active) each link took about 3 % of the samples: the block minima, the
//! first part's word, the second's, the rank after, its bucket, the walk back
//! to the part before (one load per byte of that part), the rank before, its
//! bucket; the range's first pass 28 % and the recomputed blocks 15 %. The
//! chain is now four links shorter. In the same runs (this layout against the
//! one before it, alternating, single-shape 8 MiB texts, `merge` alone)
//! CJK went from 640–662 to 617–633 µs and prose from 198–202 to 193–198 µs;
//! code, 146–156 µs before, 152 µs in the one run of the final build (the
//! builds before it loaded every word of a recomputed block twice, see
//! `minimum_candidate`, and took 164–172 µs). (The minima held ranks alone
//! until 2026-12-03, and a merge then read the block's words one at a time,
//! up to 16 dependent loads, to find the part: 13 % of `merge`'s stall
//! samples on 8 MiB of CJK on the H200.) Tried on 2026-12-04 and not kept:
//! eight bytes per round of the first pass instead of four (CJK 617–622 µs,
//! the batch no faster, more spilled bytes).
//!
//! A pair lookup is by ranks: the merged part with the part after it is
//! `(merged, token_at[after])`, the part before with the merged part
//! `(token_at[before], merged)`, each one load of `token_at` and a probe of the
//! vocabulary's [pair table](super::vocabulary) (buckets of four 8-byte slots,
//! each bucket's eight words loaded together, at most a quarter full; 1.00
//! buckets on a hit and 1.01 on a miss on average, at most 2–3; 4, 8 and
//! 16 MiB for r50k/p50k, cl100k and o200k, in L2): two rounds of loads a
//! lookup most of the time (the rank in `token_at`, then the bucket), none of
//! the text. Keyed by bytes instead, a lookup hashed the merged bytes (one text load each), probed (two words a
//! slot) and compared the bytes with the token's: about `3m + 4` loads on a
//! hit and `m + 4` on a miss for `m` merged bytes, so about 20–45 per merge
//! for the 4–8-byte pairs of prose and CJK, in dependent chains.
//! Why: `merge` was the largest step on the H200 (2026-12-01, cl100k):
//! 0.95–2.2 ms per 16 MiB chunk for 4.24 M merges, 58.7 of the 141 µs of
//! kernels of 256 KiB of prose, 143–161 µs for code and CJK. The reference
//! interpreter charges a statement alike whatever memory it touches, so it
//! shows only the shorter code: the `merge` program's work for a 384-byte run
//! fell from 10.9 M to 9.0 M (r50k, one letter), from 13.3 M to 10.5 M
//! (cl100k, one letter) and from 17.8 M to 12.2 M (cl100k, spaces).
//! The first pair ranks of a range (all its parts single bytes) still come from
//! the dense 2-byte table, one load each: keyed by the two bytes, which is
//! keyed by their two ranks.
//!
//! Why the loop has this shape: the loop this
//! replaced rescanned every pair and shifted the part and pair arrays down
//! one place per merge in global memory, `O(L²)` dependent memory operations
//! per piece, and its `merge` step took 1.8–2.1 ms on an H200 for a
//! 1,698-byte batch whose longest pieces were ~200-byte runs of one
//! character. On the reference interpreter the `merge` program's work for a
//! 384-byte run of one letter fell from 59.8 M to 11.1 M, and from 12.6 to
//! 4.7 times its work for a 96-byte run (r50k).
//!
//! # Short ranges in a slab of workgroup memory
//!
//! A range of at most [`Geometry::merge_slab_bytes`] (`S`, 12) bytes keeps its
//! `merge_parts` words in the thread's slab of the `merge` step's workgroup
//! buffer (word `k` of thread `t` at `k · W + t`, so a warp's threads at the
//! same word touch 32 banks) instead of the global arrays, and keeps no block
//! minima: each merge walks the parts from the first by their lengths (at most
//! `S` words), which gives the leftmost pair of lowest rank and the part before
//! it at once, so there is no walk back either; then two pair lookups (the
//! ranks in `token_at`, as above) and three slab words. Why: at small sizes
//! `merge` waits on the longest piece's chain of dependent merges, each a
//! series of dependent global loads and stores; on the H200 (2026-12-01,
//! cl100k) `merge` took 38.8 µs of a 1,024-byte prose text's kernels, every
//! other step 1.5–7.6 µs, and 77.7 / 113.7 / 154.0 µs for 256 KiB of prose /
//! code / CJK but only about 1.05 ms for 16 MiB. Why 12:
//! the slabs take `4 · S · W` bytes (12 KiB at 256 threads), and the
//! short-text kernel holds them beside every other step's workgroup buffers;
//! with the workgroup reductions lowered without subgroup operations (about
//! 30 KiB of their own for o200k) 16 would have passed the 48 KiB a kernel
//! then had (an H200 now gives one 227 KiB of dynamic shared memory; the
//! device validates the slabs when it compiles the programs). The
//! reference interpreter's work is no proxy for this change (it charges a
//! statement alike whatever memory it touches): for 12-byte ranges it ran
//! from 6 % below to 17 % above the global path's, plus the slab's clearing.
//! Measured after it on the H200 (same day, one run): `merge` of the 1 KiB
//! text 26.2 µs, of 256 KiB of prose 59.1 µs, of a 16 MiB chunk 0.90–0.98 ms;
//! code 140.4 and CJK 160.5 µs (longer pieces, on the global path) did not
//! improve, which one run does not tell from noise.
//! Tried and not kept: the parts' ranks in a second slab beside their words,
//! so that the slab loop loads no `token_at` (a dependent global load before
//! each pair lookup) and writes the ranks once after it. On the H200
//! (2026-12-02, the same run, this code against that one) `merge` of the 1 KiB
//! text took 19.7 µs in both, the short-text kernel 58.1 against 59.2 µs, and
//! 256 KiB of code and CJK 1–5 % longer (the second slab's clearing, most likely): the
//! `token_at` loads were not what the chain waits on. Tried again on
//! 2026-12-03, once the pair table's buckets had made a lookup one round of
//! loads (ranks in the slab's second half, copied to `token_at` after the
//! loop): `merge` of 256 KiB of prose 26 against 28–30 µs, but CJK 103–106
//! against 93–97 (twice the shared memory per workgroup leaves the global
//! path's loads less L1), the batch no faster, and the short-text kernel for
//! o200k at 1,024 threads no longer fit its workgroup memory: not kept.
//! The slab's length, swept on the H200 (2026-12-02, one run of the
//! `gpu_encode` bench's slab section, eager, kernels' own time, µs) at 12
//! (the default) / none / 16 / 24 / 32 bytes: 1 KiB of prose 44.4 / 51.4 /
//! 44.9 / 44.9 / 44.3; 256 KiB of prose 117.2 / 129.5 / 121.6 / 112.7 /
//! 122.8; of code 171.6 / 170.9 / 162.0 / **118.3** / 129.1 (identifiers and
//! runs of spaces of 13 to 24 bytes leave the global path); of CJK 238.0 /
//! **221.6** / 236.3 / 255.6 / 310.8. So a CJK piece merges faster in global
//! scratch than in a slab, and the longer the slab the worse. The walk over
//! the parts by their lengths (a chain of dependent shared loads) is not the
//! reason: a build that found the pair by a flat scan of every position,
//! eight independent loads at a time (tried 2026-12-02, not kept), swept on an
//! H100 the same way, kept the pattern: 44.0 / 50.9 / 44.4 / 44.3 / 44.2 µs at
//! 1 KiB; prose 129.3 / 138.7 / 126.5 / 128.6 / 130.2; code 175.9 / 170.3 /
//! 164.3 / **126.4** / 136.4; CJK 243.2 / **227.9** / 242.3 / 261.8 / 300.9.
//! What a long CJK piece pays in a slab is most likely its serial merge by
//! one thread (every merge a pass over the piece), where the global path
//! spreads the minimum over blocks. The default stays 12: 24 takes code about
//! 30 % and CJK 7 % the other way, and its 1,024-thread short-text kernel for
//! o200k, lowered without subgroup operations, would need more workgroup
//! memory than the H200's 232,448 bytes. On 8 MiB texts (2026-12-04, the
//! encode example, `merge` alone, eager) no slab took CJK 606 against 603 µs,
//! code 228 against 160 and prose 363 against 194, and the 64 MiB batch 8.28
//! against 7.68 ms. In the same call, asking the driver for less workgroup
//! memory and more L1 cache per SM for every kernel
//! (`CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT`, at 44 and 70 % of
//! the most) left `merge` where it was (CJK 601 and 621, prose 194 and 194,
//! code 154 and 159 µs) and `classify` up to 21 % slower; at 0 % every step
//! with workgroup memory ran slower (`merge` of prose 518 µs, the batch
//! 12.63 ms).
//! The fused kernels build `merge` and `long` otherwise ([`StepBuild`]): there a
//! range of at most [`ShortText::register_merge_bytes`] bytes in the
//! short-text kernel (16 by default; the slab's `S` until 2026-12-05) and
//! [`Geometry::register_merge_bytes`] in the resident grid (none by default
//! since 2026-12-07: [`REGISTER_MERGE_BYTES`] says why) merges in registers
//! (`emit_register_merge`: the parts' starts as bits, their ranks and pair keys
//! a register per offset, the minimum found by a tree over the registers, both
//! new pairs looked up together), since the result ABI pins those kernels at 80
//! registers whatever their steps need, and the slabs' workgroup memory goes
//! (`ptxas -v`, `sm_90`: the short-text and resident-grid kernels stay at 80
//! registers with no spill, their workgroup memory from 19,352 to 11,248
//! bytes). On an H100 (2026-12-05, the encode example, three rounds alternating
//! with the build before, the fused kernels' step clocks) the short-text
//! kernel's `merge` of 1 KiB took 8.3–8.4 against 11.5 µs for prose, 4.4–4.5
//! against 6.0–6.1 for CJK and 27.0–27.1 against 29.5–29.6 for code, the whole
//! kernel 29.2–29.8 against 32.3–32.8 µs (prose); the resident grid's `merge`
//! of 256 KiB of prose 19.8–20.5 against 23.8–25.2 µs. A range past the
//! registers, up to [`Geometry::fused_merge_slab_bytes`], keeps the same keys
//! in a slab of workgroup memory, the start bits in a register
//! (`emit_keyed_slab_merge`): in the resident grid, every range up to it.
//! Looking a merge's two pairs up
//! together, measured alone in the slab (the build before), left the 1 KiB
//! kernel's `merge` where it was (11.5 against 11.6 µs).
//! The chain also loses its first link: a piece from the merge list skips
//! the lookup of the whole range (`pieces` found it is no token; a chunk
//! still looks itself up); and the vocabulary's header words each lookup
//! reads (longest token, slot bits, table offset) are loaded once per range,
//! not inside every lookup of its merges (the pair table's, once per thread).
//! Together these took the `merge` program's reference work for a 384-byte
//! run of one letter (r50k) from 11.1 M to 10.9 M.
//!
//! # Which thread takes which entry
//!
//! Thread `i` of the grid takes entries `i`, `i + T`, ... (`T` threads) of the
//! merge list in the order `pieces` claimed them, tile by tile (about text
//! order), then of the chunk list. So the entries fill whole workgroups from
//! the first, and each workgroup carries a like mix of short and long pieces.
//! Both orders tried against it lost on the H200 (2026-12-03, the `gpu_encode`
//! bench, old and new builds alternating in one call; neither kept):
//! - the merge list sorted into six length classes (a region and a counter
//!   each, claimed by one scan of bit fields per tile) and handed out longest
//!   first, so that a warp's pieces were of one length: `merge` of an 8 MiB
//!   chunk of the batch from 0.39–0.51 to 0.65–1.14 ms, of 256 KiB of CJK from
//!   140 to 288 µs. The longest pieces all went to the first workgroups, on the
//!   same SMs, and the step lasted as long as those SMs' work;
//! - runs of 32 entries dealt out to up to 1,024 workgroups in turn, so that a
//!   small text's entries (about 7,000 for 256 KiB, 28 workgroups) reach every
//!   SM: 256 KiB of CJK from 138 to 125 µs, but an 8 MiB chunk from 0.39–0.51
//!   to 0.53–0.73 ms, its entries in 1,024 workgroups of about six busy warps
//!   instead of about 780 full ones: each thread's merges are a chain of
//!   dependent loads, and an SM hides them only with every warp it can hold;
//! - (2026-12-04, same method) the pieces that merge in a slab claimed from
//!   the list's front and the longer ones from its back (a packed 16-bit scan
//!   per tile), taken in alternating runs of 32 entries so that a warp's
//!   ranges are alike: `merge` of 8 MiB of CJK about 700 against 645 µs, of
//!   code 170–175 against 150–153, the batch 7.98 and 8.11 against 7.58 and
//!   7.66 ms;
//! - (2026-12-04, after the split's cuts, the encode example, 8 MiB of each
//!   shape) a tile's entries in order of three length classes (up to half
//!   the slab, up to the slab, longer; one scan of packed 11-bit counts),
//!   so that a warp's pieces are of like lengths but every workgroup keeps
//!   its mix: prose 224.5 and 225.2 against 192.1 and 192.4 µs, CJK 107
//!   against 101–103, the batch 7.37 and 7.38 against 6.90 and 7.07 ms;
//! - (2026-12-04, the encode example, `merge` alone on single-shape 8 MiB
//!   texts, eager, medians) a grid of what the H200 holds at once whose
//!   threads, after their first entry, claim the next with an atomic add on
//!   a `params` counter, one merge or one round of a range's first state per
//!   iteration of one loop, so that a thread whose range is done starts
//!   another while its warp's other threads go on (Nsight Compute counted
//!   7.8 of 32 threads of a warp active in `merge` on CJK, each warp held
//!   until its longest range ends). CJK 928–935 against 600–616 µs: a warp
//!   whose threads are at different phases runs one phase's round trips after
//!   the other's, every iteration. With the first state written at the claim
//!   and only the merges one per iteration: CJK 744 µs at 792 workgroups, 655
//!   at 396, 695 at 528 with 64 registers, 712 at 660 with 48 (prose 182–215
//!   against 193, code 128–157 against 152); striding over the entries
//!   instead of claiming them, the same within 3 %, so neither the atomics
//!   nor the order was the cost. The batch with the first build: 8.50–8.63
//!   against 7.36–7.38 ms (and one slow run of 10.69).
//!
//! # Long pieces
//!
//! A piece longer than [`Geometry::chunk_bytes`] (`C`, 384: a multiple of the
//! 128-byte longest token, of the 6-byte period of a run of one ideograph and
//! of every power of two up to 128) is cut at `C`-byte offsets from its start
//! and the chunks are merged in parallel. Their concatenation is the piece's
//! encoding iff every adjacent pair of tokens is *compatible* (the merge of the
//! two tokens' bytes is exactly those two tokens): a property of tiktoken's
//! rule, checked on all four vocabularies with the CPU encoder (every token
//! merges to itself; on 100 KiB runs, generated text and 3,000 random long
//! pieces per encoding, no true encoding had an incompatible pair and no
//! stitched sequence of compatible pairs differed from the true encoding).
//! Pairs inside a chunk are compatible (a chunk's tokens are its true
//! encoding), so only the pairs at chunk boundaries need checking. A failing
//! boundary is repaired by re-encoding a window of tokens around it, grown one
//! token at a time up to [`Geometry::repair_window_bytes`], until the pairs at
//! both window edges are compatible; boundaries are taken left to right, so a
//! window sees every repair before it. In the same measurements a window of at
//! most 147 bytes always sufficed at `C` = 384. A piece with a boundary no
//! window repairs is merged again from its bytes by one thread in tiktoken's
//! exact order: pairs in a binary heap keyed by (rank, start) stored in the
//! piece's own scratch range (at most one entry per byte, compacted when
//! full), `O(L log L)` for `L` bytes. Nothing is quadratic in a piece's length:
//! a chunk merge or a repair is at most `C` merges of `O(C/16)` each, the
//! serial path `O(L log L)`.
//!
//! Why not shorter chunks, whose merges are quadratic in a shorter length: the
//! `gpu_encode` bench's chunk section (H200, 2026-12-03, eager, median of 200,
//! kernels' own time at `C` = 384 / 48 / 96 / 192 / 768 bytes) gave 256 KiB of
//! CJK (runs of ideographs: long pieces) 235 / 251 / 258 / 229 / 231 µs, prose
//! 122 / 122 / 118 / 116 / 122 and code 171 / 175 / 166 / 160 / 167: shorter
//! chunks leave more boundaries for `long` to check and repair, and a CJK chunk's
//! merge does not wait on its length alone. 192 was 3–6 % faster than 384 at each
//! shape in that one run, which one run does not tell from noise; 384 stays.
//!
//! Every part here is a token too, so `long` asks the pair table by ranks as
//! well: a compatibility check merges the two tokens' bytes in place in
//! `token_at` like any range (whether the two are one token is one probe of
//! their ranks; an incompatible pair's two ranks are written back after it),
//! and the serial path checks a popped pair and pushes new ones by the two
//! parts' ranks in `token_at`. Only a repair window and a chunk look their
//! whole range up by its bytes, as `pieces` does a piece.

use vyre_cuda::codegen::MultiprocessorLimits;
use vyre_cuda::ir::{
    Access, AtomicOp, Axis, BlockBuilder, BufferCount, ElemType, Expr, Program, ProgramBuilder,
    ReduceOp, ScalarType, ScanKind,
};
use vyre_cuda::CodegenOptions;

use super::fused::Spread;
use super::vocabulary::{
    header, BYTE_RANKS_AT, MAX_RANK, NO_TOKEN, PAIR_BUCKET_SLOTS, PAIR_HIGH_KEY, PAIR_HOLDS_MASK,
    PAIR_RANKS_AT, PAIR_RANK_BITS, TOKENS_AT,
};
use crate::occupancy::Occupancy;
use crate::pretokenize::batch::lookback::{self, Combine, Direction, LookBack};
use crate::pretokenize::batch::{SplitBuffer, SplitBuild, SplitPrograms, STATUS_WORDS_PER_BLOCK};
use crate::pretokenize::pattern::Pattern;
use crate::pretokenize::Geometry as SplitGeometry;

/// Word offsets into `params`, the per-encode parameters and counters.
pub mod param {
    /// The text's length in bytes (all documents).
    pub const TEXT_LEN: u32 = 0;
    /// The number of documents.
    pub const DOCUMENTS: u32 = 1;
    /// Entries on the merge list (pieces that need the merge loop).
    pub const MERGE_COUNT: u32 = 2;
    /// Entries on the chunk list (chunks of long pieces).
    pub const CHUNK_COUNT: u32 = 3;
    /// Entries on the long list (pieces longer than a chunk).
    pub const LONG_COUNT: u32 = 4;
    /// Chunk boundaries whose pair of tokens was not compatible.
    pub const FAILED_BOUNDARIES: u32 = 5;
    /// Long pieces encoded by the serial path.
    pub const SERIAL_PIECES: u32 = 6;
    /// The first of [`STEP_CLOCKS`] words in which a fused kernel (the
    /// short-text or the resident-grid program) keeps, per step, the device's
    /// clock at the step's end since the kernel began: nanoseconds on CUDA,
    /// the reference interpreter's units of work there (`Builtin::Clock`).
    /// Zero where a chunk ran a dispatch per step.
    pub const STEP_CLOCK: u32 = 7;
    /// Words for step clocks: room for every encoding's steps (seven at most,
    /// `stage` included, for cl100k and o200k).
    pub const STEP_CLOCKS: u32 = 8;
    /// Words of `params`.
    pub const WORDS: u32 = STEP_CLOCK + STEP_CLOCKS;
}

/// Default threads per workgroup of every step.
pub const WORKGROUP_SIZE: u32 = 256;

/// Default [`Geometry::chunk_bytes`]: see the module docs for why 384.
pub const CHUNK_BYTES: u32 = 384;

/// Bytes each thread of `compact` takes in a block.
pub const BYTES_PER_THREAD: u32 = 4;

/// Blocks whose tokens `compact`'s counting pass loads at once.
const COUNTED_TOGETHER: u32 = 4;

/// `u32` ids per 128-byte line: what one warp's store of consecutive words
/// covers, and the alignment `compact` stores its ids at.
pub const IDS_PER_LINE: u32 = 32;

/// Bytes per thread of the `merge` grid (it strides over its lists).
pub const MERGE_BYTES_PER_THREAD: u32 = 8;

/// Default [`Geometry::register_merge_bytes`], the resident grid's.
///
/// Why 16 until 2026-12-07, for both fused kernels: every offset costs every
/// merge of every range its share of the merge's instructions (its key in the
/// tree of minima, its rank in the two trees that pick the neighbours' ranks,
/// its registers' updates), whatever the range's length, while a range longer
/// than the registers takes the scratch arrays, a few dependent round trips to
/// L2 per merge. On an H100 (2026-12-05, the `gpu_encode` bench's sweep,
/// kernels' own time, eager, median of 200) 12 / 16 / 24 / 31 offsets took 1
/// KiB of prose 28.2 / 29.1 / 31.1 / 32.1 µs, of CJK 31.1 / 31.9 / 33.3 / 33.9
/// and of code 46.3 / 32.5 / 34.3 / 35.6 (its 14- and 17-byte identifiers; the
/// scratch arrays for every range: 38.4); 256 KiB of prose 77.7 / 82.3 / 84.7 /
/// 93.7, of CJK 93.8 / 86.8 / 89.8 / 97.2 and of code 133.5 / 121.4 / 102.5 /
/// 109.4 (pieces of up to 19 bytes). Past 16 offsets `ptxas` spills (24: 144
/// bytes at the fused kernels' 80 registers) or takes 120 registers (31), which
/// leaves the resident grid two workgroups per SM instead of three. A second,
/// wider set of registers for the ranges past the first (16, then 31) made the
/// kernels no faster for code and slower at 256 KiB (128.5 µs), presumably
/// because a warp whose ranges fall in both sets runs both loops one after the
/// other.
///
/// Swept again on two H100 hosts (2026-12-06, the same bench section, one
/// run each, beside the 20-byte slab that came since): 20 registers and no
/// slab took 256 KiB of code 73.3 and 75.6 µs against 86.9 and 88.8 at the
/// defaults, but prose 62.2 and 63.3 against 58.8 and 60.1, CJK 67.7 and
/// 69.7 against 64.7 (the defaults) and 66.8 (16 registers and no slab; the
/// defaults' row read 78.8 in that run), 1 KiB within half a µs. 256 KiB of
/// the bench's code has no piece past 20 bytes that is not one token: its
/// longest chains are 16 merges, in identifiers of 17–19 bytes (the slab's),
/// where prose's are 8, in pieces of at most 12 bytes. A second set of 20
/// registers after the first 16, instead of the slab (tried the same day,
/// not kept), took code 91.2 against 86.9, prose 59.6 against 58.8, CJK 66.0
/// against 64.7: again both loops. 16 stays: 20 would trade 3 µs of the
/// prose and CJK kernels for 13 of code's, and moves no shape across its
/// target.
///
/// Once the slab was keyed (`emit_keyed_slab_merge`), four runs of the sweep
/// on one H100 host (2026-12-07, kernels' own time, 256 KiB of prose / CJK /
/// code) gave the default (16, then the 20-byte slab) 58.0–63.0 / 64.6–67.5 /
/// 63.1–66.0 µs, no registers and the slab for every range 60.8–64.3 /
/// 63.6–67.9 / 54.8–57.6, 20 registers and no slab 60.8–63.2 / 65.3–68.5 /
/// 57.3–59.0, 16 and no slab code 71.2–72.3; 1 KiB of prose 21.4–21.6 at the
/// default, 21.7–21.9 with the slab alone. A warp whose ranges fall on both
/// sides of the registers' length runs both loops, and one loop for every
/// range takes code 8 µs.
///
/// Why 0 for the resident grid, and 16 for the short-text kernel
/// ([`SHORT_TEXT_REGISTER_MERGE_BYTES`]): on another H100 host (2026-12-07,
/// late; the `gpu_encode` bench, two runs alternating with the build before
/// the keyed slab, 16 registers and then the walking slab; launch +
/// synchronize 9.0–11.4 µs) the keyed slab for every range took the resident
/// kernel of 256 KiB of code to 59.4–60.6 µs against 72.0–72.1 (its `merge`
/// 14.1–14.2 against 25.8–25.9; the keyed slab after 16 registers took it to
/// 64.5–66.4 against 69.8–71.6 the night before) and its graph with the ids
/// read in place to 68.6–71.5 against 82.6–82.7; prose's kernel 63.9–65.0
/// against 63.3–66.0 (its `merge` 18.0–18.5 against 14.9–15.6), CJK's
/// 68.4–70.0 against 68.7–71.4. Most likely the resident grid, a throughput
/// kernel, gains more from warps that run one loop instead of two than a
/// short range's merges in registers save it, while the short-text kernel
/// waits on its longest chain alone, where every merge's loads of workgroup
/// memory add to it: 1 KiB took 0.3–0.8 µs longer with the slab for every
/// range in the sweep.
pub const REGISTER_MERGE_BYTES: u32 = 0;

/// Default [`ShortText::register_merge_bytes`]: see [`REGISTER_MERGE_BYTES`]
/// for why the short-text kernel keeps its ranges of up to 16 bytes in
/// registers where the resident grid keeps none.
pub const SHORT_TEXT_REGISTER_MERGE_BYTES: u32 = 16;

/// Most [`Geometry::register_merge_bytes`] (and
/// [`ShortText::register_merge_bytes`]): a key holds its offset in 5 bits
/// and a range's start bits and its end one word.
pub const MAX_REGISTER_MERGE_BYTES: u32 = 31;

/// Default [`Geometry::fused_merge_slab_bytes`]: the ranges of up to 20 bytes
/// past the registers (17 to 20 in the short-text kernel, every range in the
/// resident grid) merge in a slab of workgroup memory.
///
/// Why a slab: a range past the registers otherwise merges in the global
/// scratch arrays, several dependent round trips to L2 per merge (on an H100,
/// 2026-12-05, the encode example's 1 KiB of code, whose 17-byte identifier
/// takes 14 merges there, spent 28.6 of its kernel's 49.8 µs in `merge`:
/// about 1.9 µs a merge), and 256 KiB of code has 277 pieces of 17–19 bytes; a
/// slab holds the register merge's keys, one word a byte, and a merge loads
/// them all at once (`emit_keyed_slab_merge`). Wider registers for them cost
/// every other range (the sweep at [`REGISTER_MERGE_BYTES`]); a slab costs only workgroup memory, `4 · 20`
/// bytes a thread: 20 KiB of a fused kernel's workgroup at 256 threads (the
/// resident grid keeps its three workgroups per SM, and `ptxas` its 80
/// registers and no spill).
///
/// What the slab's length does, from the `gpu_encode` bench's sweep
/// (2026-12-05, kernels' own time, eager, median of 200; 1 KiB then 256 KiB
/// of prose, CJK and code), on the H200: none 28.8 / 31.6 / 32.2 / 76.5 / 84.0
/// / 123.0 µs, a 24-byte slab 28.7 / 31.4 / 31.9 / 76.9 / 85.9 / 116.6, a
/// 32-byte one 28.7 / 31.4 / 31.8 / 74.6 / 81.5 / 114.3; on an H100 none 28.9
/// / 31.6 / 32.2 / 83.7 / 99.3 / 122.3, 24 bytes 28.8 / 31.6 / 32.0 / 77.5 /
/// 85.1 / 115.9, 32 bytes 29.0 / 31.6 / 32.0 / 81.3 / 90.4 / 118.2. A short
/// text's kernel hardly changes (few of its ranges pass 16 bytes); 256 KiB of
/// code gains 5–7 %, from its ranges of 17–19 bytes. Why no longer: the slab
/// grows with the workgroup, and the short-text kernel of 1,024 threads × 4
/// bytes (the fastest shape for 4 KiB) then needs, for o200k with the tree
/// lowering of its reductions, 225,364 bytes of workgroup memory at 20 bytes,
/// 241,748 at 24 and 274,516 at 32, where an H100 or H200 gives a kernel
/// 232,448.
pub const FUSED_MERGE_SLAB_BYTES: u32 = 20;

/// Default [`Geometry::merge_slab_bytes`]: see the module docs for why 12.
pub const MERGE_SLAB_BYTES: u32 = 12;

/// Default [`Geometry::pieces_workgroups`]: an H200's 132 SMs hold 1,056
/// workgroups of 256 threads at 32 registers each (8 per SM), so 1,024 of them
/// run as one wave (at the 80 registers the result ABI's window copies took
/// on 2026-12-01, 3 per SM: 2.6 waves).
pub const PIECES_WORKGROUPS: u32 = 1024;

/// Default [`Geometry::stage_workgroups`]: 128 workgroups of the default 256
/// threads, 256 KiB of 8-byte loads in flight, where about 75 KB (~50 GB/s ×
/// ~1.5 µs) keep PCIe busy. `stage` reads the host-mapped text, so it waits on
/// PCIe; uncapped, a 16 MiB chunk's 4,096 workgroups held the SMs that the
/// other chunks' `classify`, `phases` and `merge` need. On the H200
/// (2026-12-02, the `gpu_encode` bench's caps rows: a 64 MiB cl100k batch in
/// four 16 MiB chunks, median round) the batch took 13.09 ms uncapped with
/// `compact` at 1,024 workgroups and 11.57 ms at 128 and 64 (0.88 ×); every
/// row capping `stage` at 64–256 workgroups and `compact` at 64 took
/// 11.57–11.96 ms, every uncapped row 12.34–13.09 ms.
pub const STAGE_WORKGROUPS: u32 = 128;

/// Default [`Geometry::compact_workgroups`]: 64. `compact` writes its ids into
/// host-mapped memory, so it waits on PCIe writes (about 34 MB of ids per
/// 16 MiB chunk, ≥ 0.65 ms at ~52 GB/s); in the same bench rows as
/// [`STAGE_WORKGROUPS`] a cap of 64 was the fastest at every `stage` cap, and
/// chunk 0's `compact` took 0.67–0.70 ms at caps of 64–1,024 beside a capped
/// `stage` against 1.07–1.39 ms beside an uncapped one.
pub const COMPACT_WORKGROUPS: u32 = 64;

/// Most workgroups of `compact` when it stores the ids into device memory (CUDA
/// slots from [`COPY_ENGINE_FROM`](super::pipeline::COPY_ENGINE_FROM),
/// whose ids the copy engine then brings to the host): 1,024, one wave of
/// 256-thread workgroups on an H200 like [`PIECES_WORKGROUPS`]. The cap of
/// [`Geometry::compact_workgroups`] keeps a `compact` that waits on PCIe from
/// holding the SMs; one that stores into device memory waits on nothing, and
/// at 64 workgroups each would walk 256 of a 16 MiB chunk's blocks one after
/// another.
pub const DEVICE_COMPACT_WORKGROUPS: u32 = 1024;

/// Most workgroups of `stage` when the copy engine has already brought the
/// text into device memory (CUDA slots from
/// [`TEXT_COPY_ENGINE_FROM`](super::pipeline::TEXT_COPY_ENGINE_FROM)): 1,024, as
/// [`DEVICE_COMPACT_WORKGROUPS`]. [`Geometry::stage_workgroups`] caps a
/// `stage` that reads host-mapped memory across PCIe; one that copies device
/// memory into device memory waits on nothing, and at that cap's 128 workgroups
/// each thread copied 32 of an 8 MiB chunk's words one after another. On the
/// H200 (2026-12-04, the `gpu_encode` bench's 64 MiB cl100k batch, the first
/// 8 MiB chunk's `stage`, which runs alone on the device) it took 8.9 and 9.3
/// µs at 1,024 workgroups against 24.3, 31.7 and 34.9 µs at 128 (one run at
/// 1,024 read 26.3).
pub const DEVICE_STAGE_WORKGROUPS: u32 = 1024;

/// The shapes the programs are built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Geometry {
    /// Threads per workgroup, 32..=1024, a multiple of 32.
    pub workgroup_size: u32,
    /// Pieces longer than this are cut into chunks of this many bytes (at least
    /// 2): the longest range one thread merges with the merge loop, whose
    /// merges each scan the range's 16-byte blocks.
    pub chunk_bytes: u32,
    /// The longest range the `merge` step merges in its thread's slab of
    /// workgroup memory instead of the global scratch arrays (0: none; see the
    /// module docs). Its slabs take `4 · merge_slab_bytes · workgroup_size` bytes of workgroup
    /// memory, which the device checks when it compiles the programs (an H200
    /// gives a kernel 227 KiB: 512 threads hold 12-byte slabs, 24 KiB). The
    /// steps on their own only: a fused kernel's `merge` keeps short ranges in
    /// registers ([`Geometry::register_merge_bytes`],
    /// [`ShortText::register_merge_bytes`]) and a keyed slab
    /// ([`Geometry::fused_merge_slab_bytes`]).
    pub merge_slab_bytes: u32,
    /// The longest range the resident grid's `merge` ([`StepBuild::Fused`])
    /// keeps in registers instead of its slab or the global scratch arrays, 2
    /// to [`MAX_REGISTER_MERGE_BYTES`] (0, the default: none; see
    /// [`REGISTER_MERGE_BYTES`]). The short-text kernel takes
    /// [`ShortText::register_merge_bytes`] instead ([`Geometry::short`]).
    pub register_merge_bytes: u32,
    /// The longest range a fused kernel's `merge` keeps in a slab of workgroup
    /// memory when it is too long for the registers, at most
    /// [`MAX_REGISTER_MERGE_BYTES`] (0, or at most `register_merge_bytes`:
    /// none, every such range in the global scratch arrays). Its slabs take
    /// `4 · fused_merge_slab_bytes · threads` bytes of the fused kernel's
    /// workgroup memory, which the device checks when it
    /// compiles the kernel (20 bytes by default: [`FUSED_MERGE_SLAB_BYTES`]
    /// says why, and what a workgroup of 1,024 threads leaves for it).
    pub fused_merge_slab_bytes: u32,
    /// The longest window a boundary repair re-encodes.
    pub repair_window_bytes: u32,
    /// Windows tried per failing boundary before the piece goes to the serial
    /// path (0: every failing boundary sends its piece there).
    pub repair_attempts: u32,
    /// Most workgroups of `compact`, each owning whole blocks of
    /// [`Geometry::block_bytes`] (fewer for a text of fewer blocks). Its ids go
    /// to host-mapped memory on CUDA, so it waits on PCIe writes, not on the
    /// SMs; the default is [`COMPACT_WORKGROUPS`] (see there for the figures).
    pub compact_workgroups: u32,
    /// Most workgroups of `stage`, whose threads stride over the text's 8-byte
    /// words and the document ends (fewer for a text of fewer 16-byte groups
    /// and documents than they hold). It reads host-mapped memory on CUDA, so
    /// it waits on PCIe, not on the SMs; the default is [`STAGE_WORKGROUPS`]
    /// (see there for the figures).
    pub stage_workgroups: u32,
    /// Most workgroups of `pieces`, which stride over tiles of
    /// `workgroup_size` pieces (fewer for a text of fewer bytes than they hold;
    /// see the module docs for why). The default, [`PIECES_WORKGROUPS`], is
    /// about what an H200 holds at once.
    pub pieces_workgroups: u32,
    /// A cap on every `while` loop's iterations per thread of the stage and
    /// BPE steps (`None`, the default: no cap). Past it a kernel traps (CUDA: a
    /// `KernelFault` naming the program; the reference: an `Err`); tests use a
    /// small cap to see a device fault surface. The split's steps never take
    /// it: their loops are bounded by the geometry, and a look-back waits for
    /// other workgroups.
    pub max_loop_iterations: Option<u32>,
    /// Which kernels guard each load, store and atomic with a bounds check
    /// ([`CodegenOptions::bounds_checks`]; the default,
    /// [`BoundsChecks::StepKernels`], leaves them out of the two fused
    /// kernels only). See [`BoundsChecks`] for what they cost and what stands
    /// in for them.
    pub bounds_checks: BoundsChecks,
    /// How many workgroups of each step an SM must hold at once, as registers
    /// go ([`Occupancy::BodyRegisters`], the default: as many as each step's
    /// body registers allow; see [`crate::occupancy`] for why and the figures).
    pub occupancy: Occupancy,
    /// The split's workgroups ([`batch`](crate::pretokenize::batch): threads
    /// and bytes per thread; its `compact_workgroups` is not used).
    pub split: SplitGeometry,
    /// The split's workgroups for large chunks, which take them instead of
    /// [`Geometry::split`] (`None`: every chunk takes `split`). The default is
    /// [`BulkSplit::default`]; see there for why.
    pub bulk_split: Option<BulkSplit>,
    /// The workgroup of the short-text kernel ([`super::fused`]), whose steps
    /// all run in it (see [`ShortText`]).
    pub short_text: ShortText,
    /// Most workgroups of the resident-grid kernel ([`super::fused`]; `None`,
    /// the default: as many as the device holds at once, and no more than one
    /// per block of the split). Fewer leave SMs to other work and give each
    /// workgroup more rounds of every step.
    pub resident_workgroups: Option<u32>,
}

/// The one workgroup the short-text kernel runs in: every step of it takes
/// `workgroup_size` threads, the split's `bytes_per_thread` bytes each (so a
/// text of up to `workgroup_size · bytes_per_thread` bytes is one split block).
///
/// # Why its own shape
///
/// The kernel is one workgroup on one SM, so its time is the steps' serial
/// depth: how many instructions each warp issues one after another, with only
/// its own workgroup's warps to hide their latency. On the H200 (2026-12-02,
/// Nsight Compute, 1 KiB of prose with the steps' shape of 256 threads × 4
/// bytes) it issued 55,530 warp instructions at 0.41 per cycle, 97 % of cycles
/// with no warp eligible: 8 warps are too few. The default is the fastest row
/// of the `gpu_encode` bench's short-text sweep (see [`SHORT_TEXT_WORKGROUP`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ShortText {
    /// Threads of the workgroup, a multiple of 32 from 32 to 1024.
    pub workgroup_size: u32,
    /// Bytes each thread of the split takes, 1 to 8.
    pub bytes_per_thread: u32,
    /// The longest range its `merge` keeps in registers, before its slab
    /// ([`Geometry::fused_merge_slab_bytes`]): 2 to
    /// [`MAX_REGISTER_MERGE_BYTES`], or 0 for none (the default,
    /// [`SHORT_TEXT_REGISTER_MERGE_BYTES`], is 16).
    pub register_merge_bytes: u32,
}

/// Default [`ShortText::workgroup_size`].
pub const SHORT_TEXT_WORKGROUP: u32 = 256;

/// Default [`ShortText::bytes_per_thread`].
pub const SHORT_TEXT_BYTES_PER_THREAD: u32 = 4;

impl Default for ShortText {
    fn default() -> Self {
        ShortText {
            workgroup_size: SHORT_TEXT_WORKGROUP,
            bytes_per_thread: SHORT_TEXT_BYTES_PER_THREAD,
            register_merge_bytes: SHORT_TEXT_REGISTER_MERGE_BYTES,
        }
    }
}

/// Which kernels guard each load, store and atomic with a bounds check
/// ([`Geometry::bounds_checks`]).
///
/// # Why the fused kernels go without
///
/// The checks are an eighth of the fused kernels' code and sit on every
/// step's dependent chains: cl100k's short-text kernel assembles to 16,574
/// SASS instructions with them and 14,578 without, its resident-grid kernel
/// to 17,038 and 15,027 (ptxas 12.9, sm_90, 80 registers either way,
/// 2026-12-07; o200k's alike). On an H100 (2026-12-07, the `gpu_encode`
/// bench, three alternating rounds in one run) one 1 KiB document in a batch
/// of one took 31.5–31.6 µs without them against 34.3–34.4 µs with them (the
/// short-text kernel 21.8 against 24.7 µs by its own clock), and one 256 KiB
/// document, the text fed, eagerly: prose 102.9–106.0 against 108.6–115.7 µs,
/// CJK 118.7–120.1 against 121.7–123.6, code 127.3–128.7 against
/// 137.9–139.0; into a reused `BatchIds`: prose 93.3–95.2 against 96.9–97.8,
/// CJK 99.0–99.8 against 103.2–105.6, code 120.0–121.2 against 130.7–131.5.
///
/// # What stands in for them
///
/// Without them an access past a buffer's end reads or writes whatever is
/// there (a fault only past the allocation), so every kernel must stay inside
/// its buffers by construction: an index that may run past a list's end
/// (an operand of a select, which is evaluated whichever side is taken, or a
/// thread past the end of its work) loads element 0 or its own element
/// instead. The CPU tests run every step and both fused kernels on the
/// reference interpreter without checks, where any access out of range is an
/// `Err` naming the program, on the corpus, the shapes and random strings of
/// every encoding (that test found eleven loads that had relied on an
/// out-of-range read giving 0); the GPU tests run both fused kernels without
/// them on 2,000 random strings per encoding, long pieces, empty documents
/// and the shapes up to 1 MiB.
///
/// # Why the step kernels keep them
///
/// The step kernels take chunks past the resident grid's sizes, whose time
/// is the memory's, not the serial depth's, and whose wall time is the
/// host's as much as the device's. Measured on an H100 (2026-12-07, the
/// `gpu_encode` bench, one chunk through the step kernels, median round,
/// without checks against with them): their kernels but `stage` (which
/// waits on PCIe) took 4–9 % less (1 MiB 123.6 against 128.4 µs, 4 MiB
/// 309.9 against 330.6, 8 MiB 556.8 against 589.8, 16 MiB 838.5 against
/// 926.4), but the chunk's wall moved both ways (1 MiB 0.632 against
/// 0.850 ms, 2 MiB 1.120 against 1.104, 8 MiB 2.223 against 2.095, 16 MiB
/// 3.404 against 3.648): the batch waits on the host's staging and hand-out,
/// not on these kernels. So they keep the checks; without them they have not
/// run on a GPU, and the reference test covers their default split, not
/// [`BulkSplit`]'s.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum BoundsChecks {
    /// Every kernel checks every access.
    Everywhere,
    /// The step kernels check every access; the short-text and resident-grid
    /// kernels check none.
    #[default]
    StepKernels,
    /// No kernel checks any access.
    Nowhere,
}

impl BoundsChecks {
    /// Whether the step kernels check their accesses.
    pub fn in_step_kernels(self) -> bool {
        self != BoundsChecks::Nowhere
    }

    /// Whether the two fused kernels check their accesses.
    pub fn in_fused_kernels(self) -> bool {
        self == BoundsChecks::Everywhere
    }
}

/// Default [`BulkSplit::from_bytes`]: 1 MiB, the smallest chunk measured, where
/// the bulk blocks already took 0.98 × the default blocks' time (see
/// [`BulkSplit`]).
pub const BULK_SPLIT_FROM_BYTES: u64 = 1 << 20;

/// The split's shape for chunks of at least [`BulkSplit::from_bytes`] bytes.
///
/// # Why
///
/// Every block of the split pays a ticket, a look-back across the blocks before
/// it and about eighteen workgroup barriers, whatever its size. In each of
/// three runs of the `gpu_encode` bench's shape sweep on the H200 (2026-12-01
/// and 2026-12-02: a 64 MiB cl100k batch in 16 MiB chunks) the split's blocks
/// of 1,024 threads × 8 bytes (8 KiB; 2,048 blocks per chunk) took the batch
/// to 22.9, 20.2 and 15.75 ms where the default 256 threads × 4 bytes (1 KiB;
/// 16,384 blocks) took 35.1, 26.2 and 19.73 ms. A text of a few hundred KiB,
/// however, is too few such blocks to fill the device (256 KiB: 32 blocks for
/// an H200's 132 SMs), and the short-text program runs the split and the BPE
/// steps in one workgroup of one size. So large chunks take this shape and
/// every other chunk [`Geometry::split`]. The bench's rows of one chunk with
/// and without it (H200, 2026-12-02, median round) place the threshold,
/// [`BULK_SPLIT_FROM_BYTES`]: the bulk blocks took 0.694 against 0.707 ms at
/// 1 MiB, 0.883 / 0.913 at 2 MiB, 1.304 / 1.397 at 4 MiB, 2.221 / 2.480 at
/// 8 MiB and 4.291 / 4.892 at 16 MiB; below 1 MiB (128 blocks, about one per
/// SM) nothing is measured.
///
/// Blocks of 8 KiB take two words and a byte of workgroup memory per byte
/// (72 KiB) and one word per thread for each lowered workgroup reduction, past
/// the static 48 KiB (blocks of 4 KiB already take more): kernels then get the device's
/// opt-in limit as dynamic shared memory (227 KiB on an H200). A device that
/// cannot hold them runs every chunk with [`Geometry::split`]. Such kernels
/// end in the result ABI's per-warp epilogue (one gpu-scope atomic per warp on
/// the control word: 65,536 per 16 MiB chunk, where the default split's blocks
/// make 16,384, one per block), which the bench's rows include.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BulkSplit {
    /// Chunks of at least this many text bytes take [`BulkSplit::split`].
    pub from_bytes: u64,
    /// The split's workgroups for them.
    pub split: SplitGeometry,
}

impl Default for BulkSplit {
    /// Blocks of 1,024 threads × 8 bytes from [`BULK_SPLIT_FROM_BYTES`].
    fn default() -> Self {
        BulkSplit {
            from_bytes: BULK_SPLIT_FROM_BYTES,
            split: SplitGeometry {
                workgroup_size: 1024,
                bytes_per_thread: 8,
                ..SplitGeometry::default()
            },
        }
    }
}

impl Default for Geometry {
    fn default() -> Self {
        Geometry {
            workgroup_size: WORKGROUP_SIZE,
            chunk_bytes: CHUNK_BYTES,
            merge_slab_bytes: MERGE_SLAB_BYTES,
            register_merge_bytes: REGISTER_MERGE_BYTES,
            fused_merge_slab_bytes: FUSED_MERGE_SLAB_BYTES,
            repair_window_bytes: CHUNK_BYTES,
            repair_attempts: 16,
            compact_workgroups: COMPACT_WORKGROUPS,
            stage_workgroups: STAGE_WORKGROUPS,
            pieces_workgroups: PIECES_WORKGROUPS,
            max_loop_iterations: None,
            bounds_checks: BoundsChecks::StepKernels,
            occupancy: Occupancy::BodyRegisters,
            split: SplitGeometry::default(),
            bulk_split: Some(BulkSplit::default()),
            short_text: ShortText::default(),
            resident_workgroups: None,
        }
    }
}

impl Geometry {
    /// The code-generation options every step kernel of this geometry starts
    /// from (bounds checks as its [`Geometry::bounds_checks`] says).
    pub fn step_codegen(&self) -> CodegenOptions {
        CodegenOptions::new().with_bounds_checks(self.bounds_checks.in_step_kernels())
    }

    /// The code-generation options of this geometry's two fused kernels
    /// (bounds checks as its [`Geometry::bounds_checks`] says).
    pub fn fused_codegen(&self) -> CodegenOptions {
        CodegenOptions::new().with_bounds_checks(self.bounds_checks.in_fused_kernels())
    }

    /// This geometry with the split's workgroups of `workgroup_size` threads, each
    /// taking `bytes_per_thread` bytes of text (the rest of the split's shape kept).
    pub fn with_split_workgroups(self, workgroup_size: u32, bytes_per_thread: u32) -> Self {
        Geometry {
            split: SplitGeometry {
                workgroup_size,
                bytes_per_thread,
                ..self.split
            },
            ..self
        }
    }

    /// This geometry with the split of [`Geometry::bulk_split`] (itself without
    /// one).
    pub fn bulk(&self) -> Geometry {
        match self.bulk_split {
            Some(bulk) => Geometry {
                split: bulk.split,
                bulk_split: None,
                ..*self
            },
            None => *self,
        }
    }

    /// This geometry with every step in [`Geometry::short_text`]'s workgroup
    /// and its `merge` registers (and no bulk split): the shape the short-text
    /// kernel's steps are built for.
    pub fn short(&self) -> Geometry {
        let ShortText {
            workgroup_size,
            bytes_per_thread,
            register_merge_bytes,
        } = self.short_text;
        Geometry {
            workgroup_size,
            register_merge_bytes,
            split: SplitGeometry {
                workgroup_size,
                bytes_per_thread,
                ..self.split
            },
            bulk_split: None,
            ..*self
        }
    }

    /// Bytes of one block of `compact`.
    pub fn block_bytes(&self) -> u32 {
        self.workgroup_size * BYTES_PER_THREAD
    }

    /// `Err` with a `Fix:` message for a shape the programs cannot run with.
    pub fn check(&self) -> Result<(), String> {
        check_workgroup_size(self.workgroup_size, "workgroup_size")?;
        if !(2..=1 << 20).contains(&self.chunk_bytes) {
            return Err(format!(
                "Fix: Geometry::chunk_bytes is {}; use 2 to 1048576",
                self.chunk_bytes
            ));
        }
        // Only representability here: the device checks the slabs against its own
        // workgroup memory when it compiles the programs.
        let slab_bytes = 4 * u64::from(self.merge_slab_bytes) * u64::from(self.workgroup_size);
        if slab_bytes > u64::from(u32::MAX) {
            return Err(format!(
                "Fix: Geometry::merge_slab_bytes is {} at {} threads per workgroup, {slab_bytes} bytes of slabs, more than a workgroup buffer can hold; use at most {} (0 for none)",
                self.merge_slab_bytes,
                self.workgroup_size,
                u32::MAX / 4 / self.workgroup_size
            ));
        }
        if self.fused_merge_slab_bytes > MAX_REGISTER_MERGE_BYTES {
            return Err(format!(
                "Fix: Geometry::fused_merge_slab_bytes is {}; use at most {MAX_REGISTER_MERGE_BYTES} (0 for none): a slab's merge keeps its range's part starts as the bits of one word",
                self.fused_merge_slab_bytes
            ));
        }
        for (field, bytes) in [
            ("register_merge_bytes", self.register_merge_bytes),
            (
                "short_text.register_merge_bytes",
                self.short_text.register_merge_bytes,
            ),
        ] {
            if bytes == 1 || bytes > MAX_REGISTER_MERGE_BYTES {
                return Err(format!(
                    "Fix: Geometry::{field} is {bytes}; use 2 to {MAX_REGISTER_MERGE_BYTES} (0 for none)"
                ));
            }
        }
        for (name, workgroups) in [
            ("compact_workgroups", self.compact_workgroups),
            ("stage_workgroups", self.stage_workgroups),
            ("pieces_workgroups", self.pieces_workgroups),
        ] {
            if !(1..=65_536).contains(&workgroups) {
                return Err(format!(
                    "Fix: Geometry::{name} is {workgroups}; use 1 to 65536"
                ));
            }
        }
        // The split's own messages name its fields; say where they sit here.
        let check_split = |split: &SplitGeometry, field: &str| {
            split.check().map_err(|error| {
                error
                    .message()
                    .replacen("Geometry::", &format!("Geometry::{field}."), 1)
            })
        };
        check_split(&self.split, "split")?;
        if let Some(bulk) = &self.bulk_split {
            check_split(&bulk.split, "bulk_split.split")?;
        }
        if self.resident_workgroups == Some(0) {
            return Err(
                "Fix: Geometry::resident_workgroups is Some(0); use at least 1, or None for as many as the device holds"
                    .to_owned(),
            );
        }
        check_workgroup_size(self.short_text.workgroup_size, "short_text.workgroup_size")?;
        check_split(&self.short().split, "short_text")
    }
}

/// `Err` with a `Fix:` message naming `Geometry::{field}` unless `threads` is a
/// multiple of 32 from 32 to 1024.
fn check_workgroup_size(threads: u32, field: &str) -> Result<(), String> {
    if (32..=1024).contains(&threads) && threads.is_multiple_of(32) {
        return Ok(());
    }
    Err(format!(
        "Fix: Geometry::{field} is {threads}; use a multiple of 32 from 32 to 1024"
    ))
}

/// A device buffer of the BPE steps, by what it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// [`param`](mod@param) words: sizes in, counters.
    Params,
    /// The text, documents back to back (`u8`; `u64` words in `stage`).
    Text,
    /// Each document's end offset, increasing.
    DocumentEnds,
    /// The vocabulary's words ([`super::vocabulary`]).
    Vocabulary,
    /// The vocabulary's token bytes.
    TokenBytes,
    /// The split's piece starts, increasing.
    PieceStarts,
    /// The split's piece count (one word).
    PieceCount,
    /// Per byte: the rank of the token starting there, or [`NO_TOKEN`].
    TokenAt,
    /// Merge scratch per byte: from a merged range's first byte, the lowest
    /// pair rank of each of its 16-byte blocks (the serial path's heap
    /// positions).
    MergeMinima,
    /// Merge scratch per byte: at each part's first byte its length and the
    /// rank of its pair with the next part (the serial path's heap ranks).
    MergeParts,
    /// Indexes of pieces to merge.
    MergeList,
    /// `(start, end)` of chunks to merge.
    ChunkList,
    /// Indexes of pieces longer than a chunk.
    LongList,
    /// The ids, in text order.
    Ids,
    /// Per document, the index of its first id; then the total.
    DocumentTokenStarts,
    /// The text as the host staged it (`u64` words).
    StagedText,
    /// The document ends as the host staged them.
    StagedDocuments,
    /// The parameters as the host staged them.
    StagedParams,
    /// The split's resident tables ([`SplitBuffer::KindTable`]: the Unicode
    /// kind table, then cl100k's or o200k's word table).
    KindTable,
    /// The split's code per text byte ([`SplitBuffer::Codes`]; cl100k and
    /// o200k).
    SplitCodes,
    /// The split's look-back status words ([`SplitBuffer::Statuses`]).
    SplitStatuses,
    /// The split's counters ([`SplitBuffer::Counters`]).
    SplitCounters,
    /// Per piece of [`TEXT_READY_PIECE_BYTES`] of the staged text, the word
    /// the host sets nonzero once the piece is written ([`ready_stage`]):
    /// the first of each run of [`TEXT_READY_FLAG_WORDS`].
    TextReady,
}

impl Role {
    /// Every role; `role as usize` indexes it.
    pub const ALL: [Role; 23] = [
        Role::Params,
        Role::Text,
        Role::DocumentEnds,
        Role::Vocabulary,
        Role::TokenBytes,
        Role::PieceStarts,
        Role::PieceCount,
        Role::TokenAt,
        Role::MergeMinima,
        Role::MergeParts,
        Role::MergeList,
        Role::ChunkList,
        Role::LongList,
        Role::Ids,
        Role::DocumentTokenStarts,
        Role::StagedText,
        Role::StagedDocuments,
        Role::StagedParams,
        Role::KindTable,
        Role::SplitCodes,
        Role::SplitStatuses,
        Role::SplitCounters,
        Role::TextReady,
    ];

    /// The buffer's name in the programs that bind it.
    pub const fn name(self) -> &'static str {
        match self {
            Role::Params => "params",
            Role::Text => "text",
            Role::DocumentEnds => "document_ends",
            Role::Vocabulary => "vocabulary",
            Role::TokenBytes => "token_bytes",
            Role::PieceStarts => "piece_starts",
            Role::PieceCount => "piece_count",
            Role::TokenAt => "token_at",
            Role::MergeMinima => "merge_minima",
            Role::MergeParts => "merge_parts",
            Role::MergeList => "merge_list",
            Role::ChunkList => "chunk_list",
            Role::LongList => "long_list",
            Role::Ids => "ids",
            Role::DocumentTokenStarts => "document_token_starts",
            Role::StagedText => "staged_text",
            Role::StagedDocuments => "staged_documents",
            Role::StagedParams => "staged_params",
            Role::KindTable => SplitBuffer::KindTable.name(),
            Role::SplitCodes => SplitBuffer::Codes.name(),
            Role::SplitStatuses => SplitBuffer::Statuses.name(),
            Role::SplitCounters => SplitBuffer::Counters.name(),
            Role::TextReady => "text_ready",
        }
    }

    /// The role that holds a buffer of the split: the split and the BPE steps
    /// share the text, the document ends and the piece starts and count.
    pub const fn of_split(buffer: SplitBuffer) -> Role {
        match buffer {
            SplitBuffer::Text => Role::Text,
            SplitBuffer::DocumentEnds => Role::DocumentEnds,
            SplitBuffer::KindTable => Role::KindTable,
            SplitBuffer::Codes => Role::SplitCodes,
            SplitBuffer::Statuses => Role::SplitStatuses,
            SplitBuffer::Counters => Role::SplitCounters,
            SplitBuffer::PieceStarts => Role::PieceStarts,
            SplitBuffer::PieceCount => Role::PieceCount,
        }
    }

    /// The split's buffer this role holds, if any.
    pub fn split_buffer(self) -> Option<SplitBuffer> {
        SplitBuffer::ALL
            .into_iter()
            .find(|&buffer| Role::of_split(buffer) == self)
    }
}

/// One step: its name (the program's entry op id is `bpe.<name>`), the buffers
/// it binds in binding order, and its grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    /// The step's name.
    pub name: &'static str,
    /// The buffers bound, one per global buffer of the program, in binding order.
    pub bindings: &'static [Role],
    /// How many workgroups it runs.
    pub grid: Grid,
    /// Registers per thread its body keeps without spilling inside a loop
    /// (`ptxas -v` and `nvdisasm`, `sm_90`; see [`crate::occupancy`]).
    pub body_registers: u32,
}

/// How many workgroups a step runs, for a text of `n` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grid {
    /// One thread per 16 bytes or per document, whichever is more, and at most
    /// [`Geometry::stage_workgroups`]: the threads stride over both.
    Stage,
    /// At most [`Geometry::pieces_workgroups`], and no more than one thread
    /// per byte (a text of `n` bytes has at most `n` pieces): the workgroups
    /// stride over tiles of `W` pieces.
    PieceTiles,
    /// One thread per [`MERGE_BYTES_PER_THREAD`] bytes.
    Merge,
    /// One thread per chunk's worth of bytes.
    PerChunk,
    /// At most [`Geometry::compact_workgroups`], each owning whole blocks.
    Compaction,
    /// One workgroup per block of the split ([`Geometry::split`]), at least one
    /// ([`SplitPrograms::workgroups`]).
    Split,
}

impl Grid {
    /// Workgroups for a text of `text_len` bytes (at least 1) and `documents`
    /// documents.
    pub fn workgroups(self, geometry: &Geometry, text_len: u64, documents: u64) -> u32 {
        let threads = |count: u64| {
            u32::try_from(count.div_ceil(geometry.workgroup_size as u64).max(1)).unwrap_or(u32::MAX)
        };
        match self {
            Grid::Stage => {
                threads(text_len.div_ceil(16).max(documents)).min(geometry.stage_workgroups)
            }
            Grid::PieceTiles => threads(text_len).min(geometry.pieces_workgroups),
            Grid::Merge => threads(text_len.div_ceil(MERGE_BYTES_PER_THREAD as u64)),
            Grid::PerChunk => threads(text_len.div_ceil(geometry.chunk_bytes as u64)),
            Grid::Compaction => {
                let blocks = blocks(geometry, text_len);
                let per = blocks.div_ceil(geometry.compact_workgroups).max(1);
                blocks.div_ceil(per)
            }
            Grid::Split => geometry
                .split
                .blocks_for(usize::try_from(text_len).unwrap_or(usize::MAX))
                .max(1),
        }
    }
}

/// Blocks of `compact` for `text_len` bytes (at least 1).
pub fn blocks(geometry: &Geometry, text_len: u64) -> u32 {
    u32::try_from(text_len.div_ceil(geometry.block_bytes() as u64).max(1)).unwrap_or(u32::MAX)
}

/// The buffers of `pieces`, `merge` and `long`, in binding order: one list, so
/// the three bind alike (each writes only its own outputs: [`written_roles`]).
const BPE_BINDINGS: [Role; 12] = [
    Role::TokenAt,
    Role::MergeMinima,
    Role::MergeParts,
    Role::MergeList,
    Role::ChunkList,
    Role::LongList,
    Role::Params,
    Role::PieceStarts,
    Role::PieceCount,
    Role::Text,
    Role::Vocabulary,
    Role::TokenBytes,
];

/// The stage and BPE steps, in dispatch order; the split's run between `stage`
/// and `pieces` ([`Programs`]). `stage` runs only in eager runs (a graph
/// uploads the same buffers instead).
pub const STEPS: [Step; 5] = [
    Step {
        name: "stage",
        // All of the resident grid's `stage`'s but the last, the ready flags.
        bindings: READY_STAGE
            .bindings
            .split_last()
            .expect("the ready flags")
            .1,
        grid: Grid::Stage,
        body_registers: 32,
    },
    Step {
        name: "pieces",
        bindings: &BPE_BINDINGS,
        grid: Grid::PieceTiles,
        body_registers: 32,
    },
    Step {
        name: "merge",
        bindings: &BPE_BINDINGS,
        grid: Grid::Merge,
        body_registers: 40,
    },
    Step {
        name: "long",
        bindings: &BPE_BINDINGS,
        grid: Grid::PerChunk,
        body_registers: 40,
    },
    Step {
        name: "compact",
        bindings: &[
            Role::Params,
            Role::DocumentEnds,
            Role::TokenAt,
            Role::Ids,
            Role::DocumentTokenStarts,
            Role::SplitStatuses,
            Role::SplitCounters,
        ],
        grid: Grid::Compaction,
        body_registers: 32,
    },
];

/// The most steps a split has ([`SplitPrograms::steps`]: cl100k's and o200k's
/// `classify` and `phases`; GPT-2's is one).
pub const MAX_SPLIT_STEPS: usize = 2;

/// `stage` of the resident-grid kernel ([`ready_stage`]): the eager
/// `stage`'s buffers and the ready flags it polls.
pub const READY_STAGE: Step = Step {
    name: "stage",
    bindings: &[
        Role::StagedParams,
        Role::StagedText,
        Role::StagedDocuments,
        Role::Params,
        Role::Text,
        Role::DocumentEnds,
        Role::TextReady,
    ],
    grid: Grid::Stage,
    body_registers: 32,
};

/// The most kernel steps of one encode: `stage`, the split's and the BPE steps.
pub const MAX_KERNEL_STEPS: usize = STEPS.len() + MAX_SPLIT_STEPS;

/// One kernel of an encoding's device pipeline, as a run dispatches it.
#[derive(Clone, Debug)]
pub struct KernelStep {
    /// The step's name: `stage`; the split's (`split` for GPT-2's pattern,
    /// `classify` and `phases` for cl100k's and o200k's); `pieces`, `merge`,
    /// `long`, `compact`.
    pub name: &'static str,
    /// The program.
    pub program: Program,
    /// One role per global buffer of the program, in binding order.
    pub bindings: Vec<Role>,
    /// How many workgroups it runs.
    pub grid: Grid,
    /// Whether it is one of the split's steps (which never take
    /// [`Geometry::max_loop_iterations`]).
    pub split: bool,
    /// Registers per thread its body keeps without spilling inside a loop
    /// ([`crate::occupancy`]).
    pub body_registers: u32,
}

impl KernelStep {
    /// The code-generation options `step` is compiled with under `geometry` on
    /// a device whose SMs hold `limits` (`None`: the reference interpreter):
    /// [`Geometry::max_loop_iterations`] for the stage and BPE steps (the
    /// split's loops are bounded by the geometry, and a look-back waits for other
    /// workgroups), [`Geometry::bounds_checks`], and [`Geometry::occupancy`]'s
    /// request for its body's registers.
    pub fn codegen(
        &self,
        geometry: &Geometry,
        limits: Option<&MultiprocessorLimits>,
    ) -> CodegenOptions {
        let cap = if self.split {
            None
        } else {
            geometry.max_loop_iterations
        };
        let threads = self.program.workgroup_size().iter().product();
        geometry.occupancy.codegen(
            geometry.step_codegen().with_max_loop_iterations(cap),
            self.body_registers,
            threads,
            limits,
        )
    }

    /// The program's name (its entry op id: `bpe.<step>` or
    /// `pretokenize.batch.<pattern>...`), as errors and fault reports give it.
    pub fn program_name(&self) -> &str {
        self.program.entry_op_id().unwrap_or(self.name)
    }
}

/// Every kernel of one encoding's encode on a device, in dispatch order:
/// `stage` (eager runs only: a graph uploads what it writes), the split of the
/// encoding's pattern ([`SplitPrograms`], its steps composed over the
/// encoder's buffers: it reads the text and the document ends `stage` wrote
/// and writes the piece starts and count), then `pieces`, `merge`, `long`
/// and `compact` ([`STEPS`]).
#[derive(Clone, Debug)]
pub struct Programs {
    /// The shapes they were built for.
    pub geometry: Geometry,
    split: SplitPrograms,
    steps: Vec<KernelStep>,
}

impl Programs {
    /// The programs of `pattern`'s encodings for `geometry` (`Err` with a
    /// `Fix:` message for a shape they cannot run with).
    pub fn new(pattern: Pattern, geometry: Geometry) -> Result<Programs, String> {
        geometry.check()?;
        let split = SplitPrograms::build_cutting_unjoined(pattern, geometry.split)
            .map_err(|error| error.message().to_owned())?;
        if split.steps().len() > MAX_SPLIT_STEPS {
            return Err(format!(
                "Fix: internal: the split has {} steps, more than {MAX_SPLIT_STEPS}; report this as a bug",
                split.steps().len()
            ));
        }
        let bpe = |step: &Step, program: Program| KernelStep {
            name: step.name,
            program,
            bindings: step.bindings.to_vec(),
            grid: step.grid,
            split: false,
            body_registers: step.body_registers,
        };
        let mut steps = vec![bpe(&STEPS[0], stage(&geometry))];
        steps.extend(split.steps().iter().map(|step| {
            KernelStep {
                name: step.name,
                program: step.program.clone(),
                bindings: step
                    .bindings
                    .iter()
                    .map(|&buffer| Role::of_split(buffer))
                    .collect(),
                grid: Grid::Split,
                split: true,
                body_registers: step.body_registers,
            }
        }));
        let bpe_programs = [
            pieces(&geometry),
            merge(&geometry),
            long(&geometry),
            compact(&geometry),
        ];
        steps.extend(
            STEPS[1..]
                .iter()
                .zip(bpe_programs)
                .map(|(step, program)| bpe(step, program)),
        );
        Ok(Programs {
            geometry,
            split,
            steps,
        })
    }

    /// The steps of a kernel that runs them all ([`super::fused`]) as
    /// `spread`, in order: `stage` storing the text as bytes ([`short_stage`]
    /// in one workgroup, [`ready_stage`] in the resident grid, whose text the
    /// host may gather while the kernel runs; a short text's gather takes under
    /// a microsecond, less than a poll across PCIe would add), then every step
    /// after `stage`: the split's as [`SplitBuild::Fused`], `pieces`, `merge`,
    /// `long` and `compact` as [`StepBuild::Fused`].
    pub fn fused_steps(&self, spread: Spread) -> Vec<KernelStep> {
        let stage = &self.steps[0];
        let (program, bindings) = match spread {
            Spread::OneWorkgroup => (short_stage(&self.geometry), stage.bindings.clone()),
            Spread::ResidentGrid => (ready_stage(&self.geometry), READY_STAGE.bindings.to_vec()),
        };
        std::iter::once(KernelStep {
            program,
            bindings,
            ..*stage
        })
        .chain(self.steps[1..].iter().map(|step| {
            // Registers are no limit in a fused kernel ([`StepBuild`]).
            let program = match step.name {
                "pieces" => pieces_with(&self.geometry, StepBuild::Fused),
                "merge" => merge_with(&self.geometry, StepBuild::Fused),
                "long" => long_with(&self.geometry, StepBuild::Fused),
                "compact" => compact_with(&self.geometry, StepBuild::Fused),
                // Built beside the dispatched ones, under the same names.
                _ if step.split => match self
                    .split
                    .fused_steps()
                    .iter()
                    .find(|fused| fused.name == step.name)
                {
                    Some(fused) => fused.program.clone(),
                    None => return step.clone(),
                },
                _ => return step.clone(),
            };
            KernelStep {
                program,
                bindings: step.bindings.clone(),
                ..*step
            }
        }))
        .collect()
    }

    /// The pattern whose split runs first.
    pub fn pattern(&self) -> Pattern {
        self.split.pattern()
    }

    /// The split's programs.
    pub fn split(&self) -> &SplitPrograms {
        &self.split
    }

    /// Every kernel step, in dispatch order.
    pub fn steps(&self) -> &[KernelStep] {
        &self.steps
    }

    /// Whether some step binds `role`.
    pub fn binds(&self, role: Role) -> bool {
        self.steps.iter().any(|step| step.bindings.contains(&role))
    }
}

fn u(value: u32) -> Expr {
    Expr::u32(value)
}

fn load(buffer: Role, index: impl Into<Expr>) -> Expr {
    Expr::load(buffer.name(), index)
}

/// `index` when it is below `len`, else 0: the element a thread loads where
/// the value it gets is not used (an operand of a select or a logical operator
/// is evaluated whatever the other gives, and without bounds checks,
/// [`BoundsChecks`], a load past the buffer would read whatever is
/// there).
fn index_inside(index: Expr, len: &Expr) -> Expr {
    index.clone().less_than(len.clone()).select(index, 0u32)
}

/// Element [`index_inside`] `len` of `buffer`.
fn load_inside(buffer: Role, index: Expr, len: &Expr) -> Expr {
    load(buffer, index_inside(index, len))
}

fn param(index: u32) -> Expr {
    load(Role::Params, index)
}

fn vocab(index: impl Into<Expr>) -> Expr {
    load(Role::Vocabulary, index)
}

/// A program builder with `step`'s global buffers declared in binding order.
fn builder(
    geometry: &Geometry,
    step: &Step,
    element_type: impl Fn(Role) -> ElemType,
) -> ProgramBuilder {
    let mut builder =
        Program::builder([geometry.workgroup_size, 1, 1]).entry_op_id(format!("bpe.{}", step.name));
    let written = written_roles(step.name);
    for (binding, &role) in step.bindings.iter().enumerate() {
        let access = if written.contains(&role) {
            Access::ReadWrite
        } else {
            Access::ReadOnly
        };
        builder = builder.buffer(
            role.name(),
            binding as u32,
            access,
            element_type(role),
            BufferCount::Runtime,
        );
    }
    builder
}

/// The roles each step writes (every other binding is read-only).
pub fn written_roles(step: &str) -> &'static [Role] {
    match step {
        "stage" => &[Role::Params, Role::Text, Role::DocumentEnds],
        "pieces" => &[
            Role::Params,
            Role::TokenAt,
            Role::MergeList,
            Role::ChunkList,
            Role::LongList,
        ],
        "merge" => &[Role::TokenAt, Role::MergeMinima, Role::MergeParts],
        "long" => &[
            Role::Params,
            Role::TokenAt,
            Role::MergeMinima,
            Role::MergeParts,
        ],
        "compact" => &[
            Role::Ids,
            Role::DocumentTokenStarts,
            Role::SplitStatuses,
            Role::SplitCounters,
        ],
        _ => &[],
    }
}

/// The element type every step but `stage` gives a role.
fn element_type(role: Role) -> ElemType {
    match role {
        Role::Text | Role::TokenBytes => ElemType::U8,
        Role::StagedText | Role::SplitStatuses => ElemType::U64,
        _ => ElemType::U32,
    }
}

fn step(name: &str) -> &'static Step {
    STEPS
        .iter()
        .find(|step| step.name == name)
        .unwrap_or(&STEPS[0])
}

/// Names of one emitted routine: every variable it declares starts with its
/// prefix, so two copies in one program never clash.
#[derive(Clone)]
struct Names(String);

impl Names {
    fn new(prefix: &str) -> Names {
        Names(prefix.to_owned())
    }

    fn of(&self, what: &str) -> String {
        format!("{}_{what}", self.0)
    }

    fn nested(&self, what: &str) -> Names {
        Names(self.of(what))
    }
}

/// One of the vocabulary's hashed tables (the longer tokens keyed by bytes,
/// in slots; the pair table keyed by two ranks, in buckets of slots), its
/// header words as variables: loaded once per range or thread, not inside
/// every lookup, where they were links of the merge chain's dependent loads.
/// `slot_bits` and `slot_mask` count buckets in the pair table.
struct SlotTable {
    slot_bits: Expr,
    slots_at: Expr,
    slot_mask: Expr,
    /// How the merge using this table is built (the pair table's only).
    build: StepBuild,
}

/// How the `pieces`, `merge` and `long` steps are built: on their own, or for
/// a fused kernel.
///
/// Why two builds: the fused kernels run every step at the registers the
/// result ABI's epilogue pins (80; the short-text kernel is one workgroup, the
/// resident grid as many workgroups as those registers allow), so registers
/// cost them nothing, and there a lookup by bytes reads its bytes in rounds of
/// loads that go out together, a merge keeps a short range's state in
/// registers and looks its two new pairs up together (below). The steps run on
/// their own at the registers their requested occupancy leaves them (32 for
/// `pieces`, 40 for `merge` and `long`: `crate::occupancy`), where each
/// thread's chain is one of many an SM hides behind its other warps: there a
/// merge's two lookups together took `ptxas -v` (`sm_90`) from 48 to 64
/// registers unrequested for `long` and 16 to 116 more spilled bytes at the
/// cap, so they keep the slab, byte-by-byte lookups and one pair lookup after
/// the other until the H200 shows which is faster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepBuild {
    /// A lookup by bytes hashes and compares them one byte an iteration; a
    /// range of at most [`Geometry::merge_slab_bytes`] merges in the thread's
    /// slab of workgroup memory; a merge looks up the pair with the part
    /// after, then the pair with the part before.
    Standalone,
    /// A lookup by bytes loads them [`LOOKUP_BYTES_PER_ROUND`] at a time
    /// (`emit_lookup`); a range of at most the kernel's register length
    /// ([`Geometry::register_merge_bytes`], [`ShortText::register_merge_bytes`])
    /// merges in registers (`emit_register_merge`: no workgroup memory, no walk
    /// over the parts, no load of a part's rank), a longer one of at most
    /// [`Geometry::fused_merge_slab_bytes`] in a keyed slab
    /// (`emit_keyed_slab_merge`), and a merge loads both pairs' first buckets
    /// in one round (`emit_pair_ranks_together`).
    Fused,
}

impl SlotTable {
    /// The header words of the table keyed by bytes.
    const BY_BYTES: [u32; 2] = [header::SLOT_BITS, header::SLOTS_AT];
    /// The header words of the pair table.
    const PAIRS: [u32; 2] = [header::PAIR_BUCKET_BITS, header::PAIR_SLOTS_AT];

    /// The table whose slot bits and word offset are the header words
    /// `bits_word` and `at_word`.
    fn emit(b: &mut BlockBuilder, names: &Names, [bits_word, at_word]: [u32; 2]) -> SlotTable {
        let slot_bits = b.let_(names.of("slot_bits"), vocab(bits_word));
        SlotTable {
            slots_at: b.let_(names.of("slots_at"), vocab(at_word)),
            slot_mask: b.let_(names.of("slot_mask"), (u(1) << slot_bits.clone()) - 1u32),
            slot_bits,
            build: StepBuild::Standalone,
        }
    }

    /// The pair table of a merge built as `build` says.
    fn emit_pairs(b: &mut BlockBuilder, names: &Names, build: StepBuild) -> SlotTable {
        SlotTable {
            build,
            ..SlotTable::emit(b, names, SlotTable::PAIRS)
        }
    }

    /// Linear probing as the host's `vocabulary::probe`: from the top bits of
    /// `hash`, slot after slot (wrapping), until a slot whose second word is
    /// `empty` ends the loop or `visit` breaks out of it at its key. `visit`
    /// gets the slot's two words, once the slot is known not to be empty.
    ///
    /// Both words are loaded before the test for an empty slot, so the two
    /// loads go out together and a probed slot is one round trip to L2 instead
    /// of two. On the H200 (2026-12-03, the `gpu_encode` bench, two runs
    /// alternating with the build that loaded the first word after the test)
    /// `merge` of 256 KiB went from 39–40 to 37 µs for prose, 140–142 to
    /// 133 µs for CJK and 93 to 88 µs for code. Probing the merge's two pairs
    /// side by side (both probes' slots loaded in one round, a flag each) was
    /// measured in the same runs and not kept: 256 KiB of CJK 144 µs, code
    /// 94 µs, the batch no faster.
    fn emit_probe(
        &self,
        b: &mut BlockBuilder,
        names: &Names,
        hash: Expr,
        empty: u32,
        visit: impl FnOnce(&mut BlockBuilder, Expr, Expr),
    ) {
        let slot_name = names.of("slot");
        let slot = b.let_mut(slot_name.clone(), hash >> (u(32) - self.slot_bits.clone()));
        b.while_(Expr::bool(true), |b| {
            let at = b.let_(
                names.of("slot_at"),
                self.slots_at.clone() + slot.clone() * 2u32,
            );
            let key = b.let_(names.of("key"), vocab(at.clone()));
            let stored = b.let_(names.of("stored"), vocab(at + 1u32));
            b.if_(stored.clone().equals(empty), |b| {
                b.break_();
            });
            visit(b, key, stored);
            b.assign(slot_name, (slot.clone() + 1u32) & self.slot_mask.clone());
        });
    }
}

/// The vocabulary's header words a lookup by bytes reads, as variables (a
/// range's merges look their pairs up by ranks instead, in
/// [`SlotTable::PAIRS`]).
struct LookupHeader {
    max_token_len: Expr,
    slots: SlotTable,
    /// How the lookups are built.
    build: StepBuild,
}

impl LookupHeader {
    fn emit(b: &mut BlockBuilder, names: &Names, build: StepBuild) -> LookupHeader {
        LookupHeader {
            max_token_len: b.let_(names.of("max_token_len"), vocab(header::MAX_TOKEN_LEN)),
            slots: SlotTable::emit(b, names, SlotTable::BY_BYTES),
            build,
        }
    }
}

/// Bytes a fused build's lookup by bytes loads per round ([`StepBuild::Fused`]):
/// its hash and its compare with the token each take one round trip per this
/// many bytes, where one byte an iteration made each byte one (the compare's
/// load of the token's byte is a load from L2 that the next iteration waits
/// behind). On an H100 (2026-12-05, the encode example, three rounds
/// alternating with the build before, the fused kernels' step clocks) `pieces`
/// of 1 KiB took 3.6 against 4.2 µs for prose, 7.5–7.6 against 8.4 for CJK and
/// 5.4–5.5 against 6.4 for code; of 256 KiB 8.8–9.0 against 9.8–10.2 (prose)
/// and 12.1–13.1 against 14.3–15.6 µs (code).
pub const LOOKUP_BYTES_PER_ROUND: u32 = 4;

/// The rank of the `len` bytes of the text at `position` (a variable holding
/// [`NO_TOKEN`] when they are no token): the dense tables for one and two
/// bytes, the hashed table (its words in `vocabulary`) for three up to the
/// longest token, nothing beyond. Exactly
/// [`DeviceVocabulary::lookup`](super::vocabulary::DeviceVocabulary::lookup).
fn emit_lookup(
    b: &mut BlockBuilder,
    names: &Names,
    vocabulary: &LookupHeader,
    position: Expr,
    len: Expr,
) -> Expr {
    let position = b.let_(names.of("position"), position);
    let len = b.let_(names.of("len"), len);
    let rank = b.let_mut(names.of("rank"), NO_TOKEN);
    let byte = |offset: Expr| load(Role::Text, position.clone() + offset);
    b.if_(len.clone().equals(1u32), |b| {
        b.assign(names.of("rank"), vocab(byte(u(0)) + BYTE_RANKS_AT));
    });
    b.if_(len.clone().equals(2u32), |b| {
        b.assign(
            names.of("rank"),
            vocab(((byte(u(0)) << 8u32) | byte(u(1))) + PAIR_RANKS_AT),
        );
    });
    let hashed = len
        .clone()
        .greater_equal(3u32)
        .and(len.clone().less_equal(vocabulary.max_token_len.clone()));
    // Rounds of the fused build: offsets clamped into the range, so every load
    // is in bounds and none waits on a test.
    let rounds = (len.clone() + (LOOKUP_BYTES_PER_ROUND - 1)) / LOOKUP_BYTES_PER_ROUND;
    let clamped =
        |round: &Expr, k: u32| (round.clone() * LOOKUP_BYTES_PER_ROUND + k).min(len.clone() - 1u32);
    b.if_(hashed, |b| {
        let hash_name = names.of("hash");
        let hash = b.let_mut(hash_name.clone(), len.clone() * 0x9E37_79B1u32);
        match vocabulary.build {
            StepBuild::Standalone => {
                b.loop_(names.of("hash_at"), 0u32, len.clone(), |b, at| {
                    b.assign(
                        hash_name.clone(),
                        (hash.clone() ^ byte(at)) * 0x0100_0193u32,
                    );
                });
            }
            StepBuild::Fused => {
                b.loop_(names.of("hash_round"), 0u32, rounds.clone(), |b, round| {
                    let bytes: Vec<Expr> = (0..LOOKUP_BYTES_PER_ROUND)
                        .map(|k| {
                            b.let_(names.of(&format!("hash_byte{k}")), byte(clamped(&round, k)))
                        })
                        .collect();
                    for (k, byte) in bytes.into_iter().enumerate() {
                        let inside = (round.clone() * LOOKUP_BYTES_PER_ROUND + k as u32)
                            .less_than(len.clone());
                        b.assign(
                            hash_name.clone(),
                            inside.select((hash.clone() ^ byte) * 0x0100_0193u32, hash.clone()),
                        );
                    }
                });
            }
        }
        emit_finish(b, &hash_name);
        vocabulary
            .slots
            .emit_probe(b, names, hash.clone(), 0, |b, key, stored| {
                let candidate = b.let_(names.of("candidate"), stored.clone() & MAX_RANK);
                let same_name = names.of("same");
                let same = b.let_mut(
                    same_name.clone(),
                    key.equals(hash.clone())
                        .and((stored.clone() >> 24u32).equals(len.clone())),
                );
                b.if_(same.clone(), |b| {
                    let offset = b.let_(
                        names.of("offset"),
                        vocab(candidate.clone() + TOKENS_AT) >> 8u32,
                    );
                    match vocabulary.build {
                        StepBuild::Standalone => {
                            b.loop_(names.of("compare_at"), 0u32, len.clone(), |b, at| {
                                b.if_(
                                    byte(at.clone())
                                        .not_equals(load(Role::TokenBytes, offset.clone() + at)),
                                    |b| {
                                        b.assign(same_name.clone(), false);
                                        b.break_();
                                    },
                                );
                            });
                        }
                        StepBuild::Fused => {
                            // The candidate's length is `len`: every clamped
                            // offset is inside the token too.
                            b.loop_(
                                names.of("compare_round"),
                                0u32,
                                rounds.clone(),
                                |b, round| {
                                    let pairs: Vec<(Expr, Expr)> = (0..LOOKUP_BYTES_PER_ROUND)
                                        .map(|k| {
                                            let at = clamped(&round, k);
                                            (
                                                b.let_(
                                                    names.of(&format!("text_byte{k}")),
                                                    byte(at.clone()),
                                                ),
                                                b.let_(
                                                    names.of(&format!("token_byte{k}")),
                                                    load(Role::TokenBytes, offset.clone() + at),
                                                ),
                                            )
                                        })
                                        .collect();
                                    let differs = pairs
                                        .into_iter()
                                        .map(|(text, token)| text.not_equals(token))
                                        .reduce(|a, b| a.or(b))
                                        .expect("a round has bytes");
                                    b.if_(differs, |b| {
                                        b.assign(same_name.clone(), false);
                                        b.break_();
                                    });
                                },
                            );
                        }
                    }
                });
                b.if_(same, |b| {
                    b.assign(names.of("rank"), candidate.clone());
                    b.break_();
                });
            });
    });
    rank
}

/// [`finish`](super::vocabulary::finish) applied to the variable `hash_name`.
fn emit_finish(b: &mut BlockBuilder, hash_name: &str) {
    let hash = Expr::var(hash_name);
    b.assign(hash_name, hash.clone() ^ (hash.clone() >> 16u32));
    b.assign(hash_name, hash.clone() * 0x85EB_CA6Bu32);
    b.assign(hash_name, hash.clone() ^ (hash.clone() >> 13u32));
    b.assign(hash_name, hash.clone() * 0xC2B2_AE35u32);
    b.assign(hash_name, hash.clone() ^ (hash >> 16u32));
}

/// The rank of the token whose bytes are those of the token `first` then
/// those of the token `second` (a variable holding [`NO_TOKEN`] when they are
/// no token), from the pair table `table`: one bucket most of the time, never
/// a byte of the text. Exactly
/// [`DeviceVocabulary::pair`](super::vocabulary::DeviceVocabulary::pair).
///
/// A bucket's words are all loaded before any is tested, so they go out
/// together (one sector: one round trip to L2), and the lookup goes on to the
/// next bucket only when this one is full and holds no match. On the H200
/// (2026-12-03, Nsight Compute's stall samples of `merge` on 8 MiB of prose,
/// cl100k) the slot-by-slot probe this replaced took about 28 % of the
/// step's samples, waiting on its loads: a warp's lookup lasts as long as its
/// lanes' longest probe (about five slots a lookup, for 1.4 on a hit and 2.1
/// on a miss on average).
fn emit_pair_rank(
    b: &mut BlockBuilder,
    names: &Names,
    table: &SlotTable,
    [first, second]: [Expr; 2],
) -> Expr {
    let key = PairKey::emit(b, names, table, [first, second]);
    let rank = b.let_mut(names.of("rank"), NO_TOKEN);
    key.emit_probe(b, names, table, key.bucket.clone());
    rank
}

/// The ranks of two pairs, as [`emit_pair_rank`] gives each, with the first
/// bucket of both loaded in one round: a merge needs the merged part's pairs
/// with the part after it and with the part before it, and neither depends on
/// the other, so the second lookup's round trip to L2 no longer waits behind
/// the first's. Only a lookup whose first bucket is full and holds no match
/// goes on, bucket by bucket, alone.
fn emit_pair_ranks_together(
    b: &mut BlockBuilder,
    names: [&Names; 2],
    table: &SlotTable,
    pairs: [[Expr; 2]; 2],
) -> [Expr; 2] {
    let [first_pair, second_pair] = pairs;
    let keys = [
        PairKey::emit(b, names[0], table, first_pair),
        PairKey::emit(b, names[1], table, second_pair),
    ];
    let ranks = [
        b.let_mut(names[0].of("rank"), NO_TOKEN),
        b.let_mut(names[1].of("rank"), NO_TOKEN),
    ];
    let words = [
        emit_bucket_words(b, &names[0].nested("first"), table, keys[0].bucket.clone()),
        emit_bucket_words(b, &names[1].nested("first"), table, keys[1].bucket.clone()),
    ];
    for k in 0..2 {
        let open = keys[k].emit_match(b, &names[k].of("rank"), &words[k]);
        let open = b.let_(names[k].of("first_open"), open);
        b.if_(
            open.logical_not().and(ranks[k].clone().equals(NO_TOKEN)),
            |b| {
                let next = (keys[k].bucket.clone() + 1u32) & table.slot_mask.clone();
                keys[k].emit_probe(b, names[k], table, next);
            },
        );
    }
    ranks
}

/// The words of the pair table's bucket `bucket`, all loaded before any is
/// tested, so they go out together (one sector: one round trip to L2).
fn emit_bucket_words(
    b: &mut BlockBuilder,
    names: &Names,
    table: &SlotTable,
    bucket: Expr,
) -> Vec<Expr> {
    let at = b.let_(
        names.of("bucket_at"),
        table.slots_at.clone() + bucket * (2 * PAIR_BUCKET_SLOTS),
    );
    (0..2 * PAIR_BUCKET_SLOTS)
        .map(|k| b.let_(names.of(&format!("word{k}")), vocab(at.clone() + k)))
        .collect()
}

/// A pair of ranks as the pair table keys it, and the bucket its hash names.
struct PairKey {
    /// The slot's low word (`vocabulary::pair_slot`).
    low: Expr,
    /// The key bits of the slot's high word; an empty slot's high word has
    /// its top bit set.
    high: Expr,
    bucket: Expr,
}

impl PairKey {
    fn emit(
        b: &mut BlockBuilder,
        names: &Names,
        table: &SlotTable,
        [first, second]: [Expr; 2],
    ) -> PairKey {
        let first = b.let_(names.of("first"), first);
        let second = b.let_(names.of("second"), second);
        let low = b.let_(
            names.of("low"),
            first.clone() | (second.clone() << PAIR_RANK_BITS),
        );
        let high = b.let_(names.of("high"), second.clone() >> (32 - PAIR_RANK_BITS));
        let hash_name = names.of("hash");
        let hash = b.let_mut(hash_name.clone(), first * 0x9E37_79B1u32 + second);
        emit_finish(b, &hash_name);
        let bucket = b.let_(
            names.of("first_bucket"),
            hash >> (u(32) - table.slot_bits.clone()),
        );
        PairKey { low, high, bucket }
    }

    /// Assigns the merged rank to the variable `rank_name` if one of a
    /// bucket's slots (`words`) holds this key; returns whether the bucket has
    /// an empty slot (the key is then in no later bucket).
    fn emit_match(&self, b: &mut BlockBuilder, rank_name: &str, words: &[Expr]) -> Expr {
        let mut open = Expr::bool(false);
        for slot in words.chunks(2) {
            let [key, stored] = [&slot[0], &slot[1]];
            let holds = key
                .clone()
                .equals(self.low.clone())
                .and((stored.clone() & PAIR_HOLDS_MASK).equals(self.high.clone()));
            b.if_(holds, |b| {
                b.assign(rank_name, stored.clone() >> PAIR_HIGH_KEY.count_ones());
            });
            open = open.or(stored.clone().equals(NO_TOKEN));
        }
        open
    }

    /// Probes from bucket `from`, bucket after bucket (wrapping), until one
    /// holds the key (its merged rank into `names.of("rank")`) or has an empty
    /// slot.
    fn emit_probe(&self, b: &mut BlockBuilder, names: &Names, table: &SlotTable, from: Expr) {
        let rank_name = names.of("rank");
        let rank = Expr::var(rank_name.clone());
        let bucket_name = names.of("bucket");
        let bucket = b.let_mut(bucket_name.clone(), from);
        b.while_(Expr::bool(true), |b| {
            let words = emit_bucket_words(b, names, table, bucket.clone());
            let open = self.emit_match(b, &rank_name, &words);
            b.if_(open.or(rank.clone().not_equals(NO_TOKEN)), |b| {
                b.break_();
            });
            b.assign(
                bucket_name.clone(),
                (bucket.clone() + 1u32) & table.slot_mask.clone(),
            );
        });
    }
}

/// The length of the token of `rank` (from the vocabulary's token words).
fn token_len(rank: Expr) -> Expr {
    vocab(rank + TOKENS_AT) & 0xFFu32
}

/// Text positions per block of the merge loop's block minima: `log2` of it.
/// Blocks of 8 and 32 positions (a shorter scan against a longer refresh, and
/// the other way round) measured no different on the H200 (2026-12-04, the
/// `gpu_encode` bench, alternating builds), and 8 took the reference work of
/// a run's merges past linear in its length.
const MERGE_BLOCK_SHIFT: u32 = 4;

/// Bits of a `merge_parts` word's pair rank (the bits above them up to the
/// length's are 0). Every rank is below `2^18` (the device vocabulary's
/// bound), so the pair ranks of two words order as their bits do.
const PAIR_BITS: u32 = 20;

/// The merge loop's "no pair": above every rank (the device vocabulary's
/// ranks are below `2^18`), all ones in [`PAIR_BITS`] (what a lookup's
/// [`NO_TOKEN`] leaves there).
const NO_PAIR: u32 = (1 << PAIR_BITS) - 1;

/// Pair ranks from this one up are no pair: [`NO_PAIR`] and every
/// [`back_word`]'s.
const FIRST_NON_RANK: u32 = 1 << PAIR_RANK_BITS;

const _: () = assert!(PAIR_RANK_BITS < PAIR_BITS);

/// The `merge_parts` word of a part of `len` bytes (1..=255: a part is a
/// token) whose pair with the next part has `rank` ([`NO_TOKEN`]: none).
fn part_word(len: Expr, rank: Expr) -> Expr {
    (len << 24u32) | (rank & NO_PAIR)
}

/// The length of the part a `merge_parts` word describes (0: no part starts here).
fn part_len(word: Expr) -> Expr {
    word >> 24u32
}

/// The rank of the pair a `merge_parts` word describes (from
/// [`FIRST_NON_RANK`] up: none).
fn pair_of(word: Expr) -> Expr {
    word & NO_PAIR
}

/// The `merge_parts` word of the last byte of a part of `len` bytes (2..=255)
/// that does not start it: length 0 (no part starts here) and, in the pair
/// bits, a value from [`FIRST_NON_RANK`] up (no pair, to the block minima)
/// whose low byte is `len`, so that a merge finds the part before its first
/// part with one load instead of walking back over the bytes of that part
/// (which took 5 % of `merge`'s stall samples on 8 MiB of code on the H200,
/// 2026-12-04: runs of spaces merge from the left, the part before a merge
/// often eight or more bytes long).
fn back_word(len: Expr) -> Expr {
    u(BACK_WORD_TAG) | len
}

/// Pair bits of every [`back_word`]: no rank, whatever its low byte.
const BACK_WORD_TAG: u32 = NO_PAIR & !0xFF;

const _: () = assert!(BACK_WORD_TAG >= FIRST_NON_RANK);

/// The part length a [`back_word`] holds.
fn back_len(word: Expr) -> Expr {
    word & 0xFFu32
}

/// Bits of a [`block_minimum_word`] below its rank: the part's offset in its
/// block ([`MERGE_BLOCK_SHIFT`] bits, at most 4) above its length (8 bits: a
/// part is a token).
const MINIMUM_RANK_SHIFT: u32 = 12;

const _: () = assert!(MERGE_BLOCK_SHIFT <= 4 && MINIMUM_RANK_SHIFT + PAIR_BITS == 32);

/// A block minimum: the pair `rank` of a `merge_parts` word in the bits above
/// [`MINIMUM_RANK_SHIFT`], the `offset` of its part in the block below them
/// and the part's length `len` in the low 8 bits, so that the least of a
/// block's words is its leftmost pair of lowest rank (offsets in a block
/// differ, so the lengths never decide) and names the merge's first part
/// whole: no load of its word before the merge's other loads go out. A block
/// whose least rank is [`FIRST_NON_RANK`] or more has no pair.
fn block_minimum_word(rank: Expr, offset: Expr, len: Expr) -> Expr {
    (rank << MINIMUM_RANK_SHIFT) | (minimum_offset_of(offset) << 8u32) | len
}

/// The pair rank a [`block_minimum_word`] holds.
fn minimum_rank(word: Expr) -> Expr {
    word >> MINIMUM_RANK_SHIFT
}

/// The offset in its block that a [`block_minimum_word`] holds.
fn minimum_offset(word: Expr) -> Expr {
    minimum_offset_of(word >> 8u32)
}

/// The length of the part a [`block_minimum_word`] names.
fn minimum_len(word: Expr) -> Expr {
    word & 0xFFu32
}

/// A position's offset in its block.
fn minimum_offset_of(position: Expr) -> Expr {
    position & ((1u32 << MERGE_BLOCK_SHIFT) - 1)
}

/// The [`block_minimum_word`] of the part word `word` at `offset` in its
/// block: its pair bits are its top bits once the length's are shifted out.
/// `word` is read twice: pass a variable, or the load is made twice (as it
/// was in a build that took `merge` of 8 MiB of code from 150 to 167 µs on
/// the H200, 2026-12-04: every word of a block recomputed loaded twice).
fn minimum_candidate(word: Expr, offset: Expr) -> Expr {
    (word.clone() << MINIMUM_RANK_SHIFT) | (minimum_offset_of(offset) << 8u32) | part_len(word)
}

/// Stores the leftmost pair of lowest rank of block `block` of the range of
/// `len` bytes at `start` into `merge_minima[start + block]`
/// ([`block_minimum_word`]; a block without a pair holds a rank from
/// [`FIRST_NON_RANK`] up).
fn emit_block_minimum(b: &mut BlockBuilder, names: &Names, [start, len]: [&Expr; 2], block: Expr) {
    let first = b.let_(names.of("first"), block.clone() << MERGE_BLOCK_SHIFT);
    let last = b.let_(
        names.of("last"),
        (first.clone() + (1u32 << MERGE_BLOCK_SHIFT)).min(len.clone()),
    );
    // Every word of the block in rounds of loads that go out together, at
    // offsets clamped into the block (a word read twice changes no minimum).
    let minimum_name = names.of("minimum");
    let minimum = b.let_mut(minimum_name.clone(), u32::MAX);
    let words = 1u32 << MERGE_BLOCK_SHIFT;
    for round in 0..words / LOADS_PER_ROUND {
        let candidates: Vec<Expr> = (0..LOADS_PER_ROUND)
            .map(|k| {
                let at = (first.clone() + (round * LOADS_PER_ROUND + k)).min(last.clone() - 1u32);
                let at = b.let_(names.of(&format!("at{round}_{k}")), at);
                // The word as a variable: the candidate reads it twice, and
                // an expression would load it twice.
                let word = b.let_(
                    names.of(&format!("word{round}_{k}")),
                    load(Role::MergeParts, start.clone() + at.clone()),
                );
                b.let_(
                    names.of(&format!("candidate{round}_{k}")),
                    minimum_candidate(word, at),
                )
            })
            .collect();
        for candidate in candidates {
            b.assign(minimum_name.clone(), minimum.clone().min(candidate));
        }
    }
    b.store(Role::MergeMinima.name(), start.clone() + block, minimum);
}

/// Independent loads the scratch merge issues together before it uses any
/// (a block's words, the range's block minima): a warp stalls at the first
/// instruction whose load has not returned, so a loop that uses each load
/// before it issues the next pays a round trip per load. Four, because
/// `merge` keeps 40 registers (six workgroups per SM): at eight, ptxas
/// spilled inside the merge loop (sm_90, 2026-12-03), and a build that kept
/// two more values live across a merge's pair lookups, spilling 8 bytes more
/// there, took `merge` of an 8 MiB chunk of the batch from 0.33–0.43 to
/// 0.55–0.98 ms on the H200.
const LOADS_PER_ROUND: u32 = 4;

/// The thread's slab of the `merge` step's workgroup buffer [`MERGE_SLAB`]:
/// a range of at most `bytes` bytes merges there (0: none), the buffer holding
/// `bytes` words for each of the workgroup's `threads`.
#[derive(Clone, Copy)]
struct Slab {
    bytes: u32,
    threads: u32,
    /// The range's state in registers instead ([`StepBuild::Fused`]: no
    /// workgroup buffer for them).
    in_registers: bool,
    /// With `in_registers`, a longer range of at most this many bytes merges
    /// in the slab (0: none; the buffer then holds this many words a thread).
    after_registers: u32,
}

impl Slab {
    /// No slab: every range merges in the global scratch arrays (`long`
    /// declares no workgroup buffer).
    const NONE: Slab = Slab {
        bytes: 0,
        threads: 1,
        in_registers: false,
        after_registers: 0,
    };
}

/// How [`emit_encode`] learns whether its whole range is one token.
enum Whole {
    /// Looks the range's bytes up, unless `skip` holds (the caller knows the
    /// range is no token: `pieces` looked the piece up whole).
    LookUp { skip: Expr },
    /// The caller's rank of the whole range (a variable; [`NO_TOKEN`]: none).
    Rank(Expr),
}

/// The workgroup buffer of the `merge` step's slabs: word `k` of thread `t`'s
/// slab at `k · W + t`, so the threads of a warp that touch the same word of
/// their slabs touch 32 different banks.
const MERGE_SLAB: &str = "merge_slab";

/// Merges the `len` bytes (at least 1) of the text at `start` by tiktoken's
/// rule into `token_at` (the module docs give the two ways: a range that fits
/// the thread's slab there, any other in the scratch arrays at
/// `start..start + len`). `whole` says how the range's own lookup, the first
/// link of the chain of dependent loads, is made or skipped. Returns the
/// number of parts left (a variable); the first part's length is then
/// `part_len(merge_parts[start])` when the range merged in the scratch arrays
/// or was one token.
fn emit_encode(
    b: &mut BlockBuilder,
    names: &Names,
    pairs: &SlotTable,
    [start, len]: [Expr; 2],
    whole: Whole,
    slab: Slab,
) -> Expr {
    let start = b.let_(names.of("start"), start);
    let len = b.let_(names.of("len"), len);
    let parts_name = names.of("parts");
    let parts = b.let_mut(parts_name.clone(), 1u32);
    let whole = match whole {
        Whole::Rank(rank) => rank,
        Whole::LookUp { skip } => {
            let whole_name = names.of("whole_token");
            let whole = b.let_mut(whole_name.clone(), NO_TOKEN);
            b.if_(skip.logical_not(), |b| {
                let vocabulary = LookupHeader::emit(b, &names.nested("header"), pairs.build);
                let rank = emit_lookup(
                    b,
                    &names.nested("whole"),
                    &vocabulary,
                    start.clone(),
                    len.clone(),
                );
                b.assign(whole_name.clone(), rank);
            });
            whole
        }
    };
    b.if_else(
        whole.clone().not_equals(NO_TOKEN),
        |b| {
            b.store(
                Role::MergeParts.name(),
                start.clone(),
                part_word(len.clone(), u(NO_PAIR)),
            );
            b.store(Role::TokenAt.name(), start.clone(), whole.clone());
            emit_clear_tokens(
                b,
                &names.of("clear"),
                [start.clone() + 1u32, len.clone() - 1u32],
            );
        },
        |b| {
            b.assign(parts_name.clone(), len.clone());
            let scratch = |b: &mut BlockBuilder| {
                emit_scratch_merge(b, names, pairs, [&start, &len], &parts_name)
            };
            let in_slab = |b: &mut BlockBuilder| {
                emit_slab_merge(b, names, pairs, [&start, &len], slab.threads, &parts_name)
            };
            // A fused build's range too long for its registers merges in its
            // slab if it has one that holds it.
            let past_registers = |b: &mut BlockBuilder| {
                if slab.after_registers > slab.bytes {
                    b.if_else(
                        len.clone().less_equal(slab.after_registers),
                        |b| {
                            emit_keyed_slab_merge(
                                b,
                                names,
                                pairs,
                                [&start, &len],
                                [slab.after_registers, slab.threads],
                                &parts_name,
                            )
                        },
                        scratch,
                    );
                } else {
                    scratch(b);
                }
            };
            if slab.bytes >= 2 {
                b.if_else(
                    len.clone().less_equal(slab.bytes),
                    |b| {
                        if slab.in_registers {
                            emit_register_merge(
                                b,
                                names,
                                pairs,
                                [&start, &len],
                                slab.bytes,
                                &parts_name,
                            )
                        } else {
                            in_slab(b)
                        }
                    },
                    past_registers,
                );
            } else {
                past_registers(b);
            }
        },
    );
    parts
}

/// Writes [`NO_TOKEN`] into `token_at` at the `len` positions from `from`.
fn emit_clear_tokens(b: &mut BlockBuilder, name: &str, [from, len]: [Expr; 2]) {
    b.loop_(name, 0u32, len, |b, at| {
        b.store(Role::TokenAt.name(), from.clone() + at, NO_TOKEN);
    });
}

/// Where a merge loop keeps its part words (one per byte of the range: the
/// module docs give the word).
#[derive(Clone, Copy)]
enum PartWords<'a> {
    /// `merge_parts` at the range's text positions, from `start`.
    Scratch { start: &'a Expr },
    /// The thread's slab of [`MERGE_SLAB`]: word `k` at `k · threads + lane`.
    Slab { threads: u32, lane: &'a Expr },
    /// The same slab holding a [`pair_key`] per byte instead
    /// ([`emit_keyed_slab_merge`]).
    KeyedSlab { threads: u32, lane: &'a Expr },
}

impl PartWords<'_> {
    /// The buffer and index of the word of the range's byte `offset`.
    fn word_at(self, offset: Expr) -> (&'static str, Expr) {
        match self {
            PartWords::Scratch { start } => (Role::MergeParts.name(), start.clone() + offset),
            PartWords::Slab { threads, lane } | PartWords::KeyedSlab { threads, lane } => {
                (MERGE_SLAB, offset * threads + lane.clone())
            }
        }
    }

    /// The first state's word of the range's byte `offset`, a part of one
    /// byte whose pair with the next byte has `pair` ([`NO_TOKEN`] or
    /// [`NO_PAIR`]: none).
    fn first_word(self, offset: Expr, pair: Expr) -> Expr {
        match self {
            PartWords::Scratch { .. } | PartWords::Slab { .. } => part_word(u(1), pair),
            PartWords::KeyedSlab { .. } => pair_key(pair, offset),
        }
    }

    /// The word of the range's byte `offset`.
    fn load(self, offset: Expr) -> Expr {
        let (buffer, index) = self.word_at(offset);
        Expr::load(buffer, index)
    }

    /// Stores `word` as the word of the range's byte `offset`.
    fn store(self, b: &mut BlockBuilder, offset: Expr, word: Expr) {
        let (buffer, index) = self.word_at(offset);
        b.store(buffer, index, word);
    }
}

/// Bytes of a range that [`emit_byte_parts`] reads and writes per round.
const BYTE_PARTS_PER_ROUND: u32 = 4;

/// The first state of a range of `len` bytes that is not one token: every byte
/// a part, its rank in `token_at` and its word in `words` (the pair with the
/// next byte, from the dense 2-byte table: one load, keyed by the two bytes,
/// which is keying by their two ranks; the last has no pair).
///
/// A round takes [`BYTE_PARTS_PER_ROUND`] bytes: it loads the *next* round's
/// bytes and the one after them (at offsets clamped into the range, so every
/// load is in bounds and none waits on a test), then looks up all its own
/// ranks and pair ranks from the bytes the round before loaded (packed four
/// to a word, the fifth alone: two registers across the loop), and only then
/// stores them. A warp issues its loads in order and stalls at the first
/// instruction whose operand is not there yet, so a store between two loads
/// made the next byte's loads wait for the last byte's ranks: one round trip
/// for the bytes and one for the ranks, per byte. On the H200 (2026-12-03,
/// Nsight Compute's stall samples of `merge` on 8 MiB of CJK, cl100k) the
/// two per-byte loops this replaced took 28 % of the step's samples.
///
/// Why a round ahead: with each round loading its own bytes, a round was still
/// two round trips (the bytes, then their ranks), and this loop took about
/// 40 % of `merge`'s warp samples on 8 MiB of CJK (H200, 2026-12-04, Nsight
/// Compute; 7.8 of 32 threads of a warp active). Loaded a round ahead, the
/// bytes arrive while the ranks are looked up. In the same runs (this loop
/// against the one before it, alternating, `merge` alone, eager, median of
/// three) `merge` of 8 MiB of CJK took 590 and 598 against 612 and 618 µs,
/// prose 193 and 194 against 193 and 195, code 152 and 155 against 151 and
/// 152; the 64 MiB batch, on a slow lease, 7.62–7.74 against 7.53–7.76 ms
/// (noise at that size). ptxas: the same 40 registers and spilled bytes.
fn emit_byte_parts(
    b: &mut BlockBuilder,
    names: &Names,
    [start, len]: [&Expr; 2],
    words: PartWords,
) {
    let last = b.let_(names.of("last_byte"), len.clone() - 1u32);
    let rounds = b.let_(
        names.of("init_rounds"),
        (len.clone() + (BYTE_PARTS_PER_ROUND - 1)) / BYTE_PARTS_PER_ROUND,
    );
    // The scratch path's block minima, from the pair ranks in registers: a
    // block's words are all written by the rounds that cover it. (The range's
    // start in the scratch arrays; `None` on the slab path, which keeps none.)
    let minima_start = match words {
        PartWords::Scratch { start } => Some(start),
        PartWords::Slab { .. } | PartWords::KeyedSlab { .. } => None,
    };
    let minimum_name = names.of("init_minimum");
    if minima_start.is_some() {
        b.let_mut(minimum_name.clone(), u32::MAX);
    }
    let minimum = Expr::var(minimum_name.clone());
    // A round's bytes and the one after them, at offsets clamped into the
    // range (so every load is in bounds and none waits on a test).
    let load_bytes = |b: &mut BlockBuilder, first: &Expr, what: &str| -> Vec<Expr> {
        (0..=BYTE_PARTS_PER_ROUND)
            .map(|k| {
                let offset = (first.clone() + k).min(last.clone());
                b.let_(
                    names.of(&format!("{what}{k}")),
                    load(Role::Text, start.clone() + offset),
                )
            })
            .collect()
    };
    // The round's bytes, loaded by the round before (the first round's
    // before the loop): its first four packed into one word, the fifth alone
    // (a word holds four bytes: the assertion below the function).
    let packed_name = names.of("init_packed");
    let fifth_name = names.of("init_fifth");
    let pack = |bytes: &[Expr]| {
        (bytes[0].clone() | (bytes[1].clone() << 8u32))
            | ((bytes[2].clone() << 16u32) | (bytes[3].clone() << 24u32))
    };
    let first_bytes = load_bytes(b, &u(0), "init_first_byte");
    let packed = b.let_mut(packed_name.clone(), pack(&first_bytes));
    let fifth = b.let_mut(fifth_name.clone(), first_bytes[4].clone());
    b.loop_(names.of("init"), 0u32, rounds.clone(), |b, round| {
        let first = b.let_(names.of("init_first"), round.clone() * BYTE_PARTS_PER_ROUND);
        let mut bytes: Vec<Expr> = (0..BYTE_PARTS_PER_ROUND)
            .map(|k| {
                b.let_(
                    names.of(&format!("init_byte{k}")),
                    (packed.clone() >> (8 * k)) & 0xFFu32,
                )
            })
            .collect();
        bytes.push(fifth.clone());
        // The next round's bytes go out before this round's ranks: the warp
        // waits for them only at the round's end, behind the ranks' loads.
        let next_first = b.let_(
            names.of("init_next_first"),
            first.clone() + BYTE_PARTS_PER_ROUND,
        );
        let next_bytes = load_bytes(b, &next_first, "init_next_byte");
        let ranks: Vec<(Expr, Expr)> = (0..BYTE_PARTS_PER_ROUND as usize)
            .map(|k| {
                let rank = b.let_(
                    names.of(&format!("init_rank{k}")),
                    vocab(bytes[k].clone() + BYTE_RANKS_AT),
                );
                let pair = b.let_(
                    names.of(&format!("init_pair{k}")),
                    vocab(((bytes[k].clone() << 8u32) | bytes[k + 1].clone()) + PAIR_RANKS_AT),
                );
                (rank, pair)
            })
            .collect();
        for (k, (rank, pair)) in ranks.into_iter().enumerate() {
            let at = b.let_(names.of(&format!("init_at{k}")), first.clone() + k as u32);
            let pair = b.let_(
                names.of(&format!("init_pair_at{k}")),
                at.clone().less_than(last.clone()).select(pair, u(NO_PAIR)),
            );
            if minima_start.is_some() {
                // (A pair that is no token is `NO_TOKEN` here, whose bits
                // above the minimum's rank shift are all ones: no pair.)
                let candidate = at.clone().less_equal(last.clone()).select(
                    block_minimum_word(pair.clone(), at.clone(), u(1)),
                    u(u32::MAX),
                );
                b.assign(minimum_name.clone(), minimum.clone().min(candidate));
            }
            b.if_(at.clone().less_equal(last.clone()), |b| {
                b.store(Role::TokenAt.name(), start.clone() + at.clone(), rank);
                words.store(b, at.clone(), words.first_word(at, pair));
            });
        }
        if let Some(start) = minima_start {
            let rounds_per_block = (1u32 << MERGE_BLOCK_SHIFT) / BYTE_PARTS_PER_ROUND;
            let next = round.clone() + 1u32;
            b.if_(
                (next.clone() % rounds_per_block)
                    .equals(0u32)
                    .or(next.equals(rounds.clone())),
                |b| {
                    b.store(
                        Role::MergeMinima.name(),
                        start.clone() + (first.clone() >> MERGE_BLOCK_SHIFT),
                        minimum.clone(),
                    );
                    b.assign(minimum_name.clone(), u32::MAX);
                },
            );
        }
        b.assign(packed_name.clone(), pack(&next_bytes));
        b.assign(fifth_name.clone(), next_bytes[4].clone());
    });
}

const _: () = assert!((1u32 << MERGE_BLOCK_SHIFT).is_multiple_of(BYTE_PARTS_PER_ROUND));
const _: () = assert!(
    BYTE_PARTS_PER_ROUND == 4,
    "a round's bytes are packed into one word"
);

/// The parts of one merge, found by the loop that chose it: the first part
/// (its range offset and length), the pair's rank (the merged token), the
/// second part's word and the part before the first (its offset and length;
/// any offset when `first` is 0).
struct MergeSite<'a> {
    first: &'a Expr,
    first_len: &'a Expr,
    merged: &'a Expr,
    second_word: &'a Expr,
    before: &'a Expr,
    before_len: &'a Expr,
}

/// Merges the part at `first` with the next, `second`, into the token
/// `merged` (their pair's rank): `merged` into `token_at` at `first` and "no
/// token" at `second`, the merged part's word (its length and the rank of its
/// pair with the part after it: none at the range's end) and the part
/// before's word (its pair now with the merged part) into `words`. Returns
/// `second` and the offset after the merged part (variables); `second`'s own
/// word is left as it was.
///
/// The ranks of the part after and of the part before are loaded together,
/// before either pair is looked up: both follow from the loop's choice alone,
/// and a warp stalls at the first use of a load that has not returned, so
/// each load issued only after the other's lookup was one more round trip in
/// the merge's chain (on the H200, 2026-12-04, Nsight Compute's stall
/// samples of `merge` on 8 MiB of CJK put about 3 % of them on each link of
/// that chain).
fn emit_merge_pair(
    b: &mut BlockBuilder,
    names: &Names,
    pairs: &SlotTable,
    [start, len]: [&Expr; 2],
    site: MergeSite,
    words: PartWords,
) -> (Expr, Expr) {
    let MergeSite {
        first,
        first_len,
        merged,
        second_word,
        before,
        before_len,
    } = site;
    let second = b.let_(names.of("second"), first.clone() + first_len.clone());
    let merged_len = b.let_(
        names.of("merged_len"),
        first_len.clone() + part_len(second_word.clone()),
    );
    let after = b.let_(names.of("after"), first.clone() + merged_len.clone());
    let has_after = b.let_(names.of("has_after"), after.clone().less_than(len.clone()));
    let has_before = b.let_(names.of("has_before"), first.clone().greater_than(0u32));
    // Both ranks at offsets inside the range, whether or not there is such a
    // part, so that the two loads go out together and neither waits on a test.
    let after_rank = b.let_(
        names.of("after_rank"),
        load(
            Role::TokenAt,
            start.clone() + after.clone().min(len.clone() - 1u32),
        ),
    );
    let before_rank = b.let_(
        names.of("before_rank"),
        load(Role::TokenAt, start.clone() + before.clone()),
    );
    let right_name = names.of("right");
    let right = b.let_mut(right_name.clone(), NO_PAIR);
    let left = match pairs.build {
        StepBuild::Standalone => {
            b.if_(has_after, |b| {
                let rank = emit_pair_rank(
                    b,
                    &names.nested("right"),
                    pairs,
                    [merged.clone(), after_rank],
                );
                b.assign(right_name.clone(), rank);
            });
            None
        }
        StepBuild::Fused => {
            // Both pairs at once, whether or not there is a part after or
            // before (a rank looked up for no part is not used), so that
            // neither lookup waits on a test or on the other.
            let [right_rank, left_rank] = emit_pair_ranks_together(
                b,
                [&names.nested("right"), &names.nested("left")],
                pairs,
                [
                    [merged.clone(), after_rank],
                    [before_rank.clone(), merged.clone()],
                ],
            );
            b.if_(has_after, |b| {
                b.assign(right_name.clone(), right_rank);
            });
            Some(left_rank)
        }
    };
    b.store(
        Role::TokenAt.name(),
        start.clone() + first.clone(),
        merged.clone(),
    );
    b.store(
        Role::TokenAt.name(),
        start.clone() + second.clone(),
        NO_TOKEN,
    );
    words.store(b, first.clone(), part_word(merged_len, right));
    b.if_(has_before, |b| {
        let rank = left.unwrap_or_else(|| {
            emit_pair_rank(
                b,
                &names.nested("left"),
                pairs,
                [before_rank, merged.clone()],
            )
        });
        words.store(b, before.clone(), part_word(before_len.clone(), rank));
    });
    (second, after)
}

/// The merge loop of a range that is not one token in the scratch arrays
/// `merge_parts` and `merge_minima` (the module docs give the layout), its
/// parts' ranks in `token_at`; `parts` (the variable named so, `len` on
/// entry) counts the parts left.
fn emit_scratch_merge(
    b: &mut BlockBuilder,
    names: &Names,
    pairs: &SlotTable,
    [start, len]: [&Expr; 2],
    parts_name: &str,
) {
    let parts = Expr::var(parts_name);
    let words = PartWords::Scratch { start };
    let part = |offset: Expr| words.load(offset);
    emit_byte_parts(b, names, [start, len], words);
    let blocks = b.let_(
        names.of("blocks"),
        (len.clone() + ((1u32 << MERGE_BLOCK_SHIFT) - 1)) >> MERGE_BLOCK_SHIFT,
    );
    b.while_(Expr::bool(true), |b| {
        // The leftmost block of lowest rank (strict `<` keeps the first);
        // its minimum word names the leftmost part in it whose pair has
        // that rank: the leftmost pair of lowest rank.
        let best_name = names.of("best");
        let best_word_name = names.of("best_word");
        let best_block_name = names.of("best_block");
        let best = b.let_mut(best_name.clone(), NO_PAIR);
        let best_word = b.let_mut(best_word_name.clone(), 0u32);
        let best_block = b.let_mut(best_block_name.clone(), 0u32);
        // In rounds of loads that go out together, at blocks clamped into
        // the range (a block read twice is not taken twice: strict `<`).
        let rounds = (blocks.clone() + (LOADS_PER_ROUND - 1)) / LOADS_PER_ROUND;
        b.loop_(names.of("scan"), 0u32, rounds, |b, round| {
            let minima: Vec<(Expr, Expr)> = (0..LOADS_PER_ROUND)
                .map(|k| {
                    let block = b.let_(
                        names.of(&format!("scan_block{k}")),
                        (round.clone() * LOADS_PER_ROUND + k).min(blocks.clone() - 1u32),
                    );
                    let minimum = b.let_(
                        names.of(&format!("scan_minimum{k}")),
                        load(Role::MergeMinima, start.clone() + block.clone()),
                    );
                    (block, minimum)
                })
                .collect();
            for (k, (block, minimum)) in minima.into_iter().enumerate() {
                let rank = b.let_(
                    names.of(&format!("scan_rank{k}")),
                    minimum_rank(minimum.clone()),
                );
                b.if_(rank.clone().less_than(best.clone()), |b| {
                    b.assign(best_name.clone(), rank);
                    b.assign(best_word_name.clone(), minimum);
                    b.assign(best_block_name.clone(), block);
                });
            }
        });
        b.if_(best.clone().greater_equal(FIRST_NON_RANK), |b| {
            b.break_();
        });
        let first = b.let_(
            names.of("first"),
            (best_block.clone() << MERGE_BLOCK_SHIFT) | minimum_offset(best_word.clone()),
        );
        let first_len = b.let_(names.of("first_len"), minimum_len(best_word));
        // The second part's word and the word of the byte before the first
        // part (which names the part before) go out together.
        let second_word = b.let_(
            names.of("second_word"),
            part(first.clone() + first_len.clone()),
        );
        // The part before ends at the byte before the first part: a part's
        // start word there, or its last byte's [`back_word`]. None when
        // `first` is 0 (offset 0 starts a part; `before` is then 0).
        let before_word = b.let_(
            names.of("before_word"),
            part(first.clone().max(1u32) - 1u32),
        );
        let before_len = b.let_(
            names.of("before_len"),
            part_len(before_word.clone())
                .equals(0u32)
                .select(back_len(before_word.clone()), part_len(before_word)),
        );
        let before = b.let_(
            names.of("before"),
            first
                .clone()
                .greater_than(0u32)
                .select(first.clone() - before_len.clone(), u(0)),
        );
        let (second, after) = emit_merge_pair(
            b,
            names,
            pairs,
            [start, len],
            MergeSite {
                first: &first,
                first_len: &first_len,
                merged: &best,
                second_word: &second_word,
                before: &before,
                before_len: &before_len,
            },
            words,
        );
        // The second part's start is a start no more; the merged part's last
        // byte (the second part's last) names its length for a later merge
        // that needs the part before it.
        words.store(b, second.clone(), u(NO_PAIR));
        words.store(b, after.clone() - 1u32, back_word(after - first.clone()));
        // The blocks whose words changed: the first part's always (its
        // minimum was the merged pair); the second part's and the part
        // before's, where they lie in other blocks, only if their minimum
        // named the changed word: otherwise a word that lost its pair leaves
        // the minimum as it was, and the part before's new pair is one
        // candidate more.
        let first_block = b.let_(names.of("first_block"), best_block.clone());
        let before_block = b.let_(
            names.of("before_block"),
            before.clone() >> MERGE_BLOCK_SHIFT,
        );
        b.if_(
            first
                .clone()
                .greater_than(0u32)
                .and(before_block.clone().not_equals(first_block.clone())),
            |b| {
                let old = b.let_(
                    names.of("before_old"),
                    load(Role::MergeMinima, start.clone() + before_block.clone()),
                );
                b.if_else(
                    minimum_offset(old.clone()).equals(minimum_offset_of(before.clone())),
                    |b| {
                        emit_block_minimum(
                            b,
                            &names.nested("before_minimum"),
                            [start, len],
                            before_block.clone(),
                        );
                    },
                    |b| {
                        let word = b.let_(names.of("before_new"), part(before.clone()));
                        let candidate = minimum_candidate(word, before.clone());
                        b.store(
                            Role::MergeMinima.name(),
                            start.clone() + before_block.clone(),
                            old.clone().min(candidate),
                        );
                    },
                );
            },
        );
        emit_block_minimum(
            b,
            &names.nested("first_minimum"),
            [start, len],
            first_block.clone(),
        );
        let second_block = b.let_(
            names.of("second_block"),
            second.clone() >> MERGE_BLOCK_SHIFT,
        );
        b.if_(second_block.clone().not_equals(first_block), |b| {
            let old = load(Role::MergeMinima, start.clone() + second_block.clone());
            b.if_(
                minimum_offset(old).equals(minimum_offset_of(second.clone())),
                |b| {
                    emit_block_minimum(
                        b,
                        &names.nested("second_minimum"),
                        [start, len],
                        second_block,
                    );
                },
            );
        });
        b.assign(parts_name, parts.clone() - 1u32);
    });
}

/// The merge loop of a range of at most the slab's length that is not one
/// token, in the thread's slab of [`MERGE_SLAB`] (one `merge_parts` word per
/// byte, the slab's word `k` for the range's byte `k`), its parts' ranks in
/// `token_at`; `parts` (the variable named so, `len` on entry) counts the
/// parts left. Each merge walks the parts from the first by their lengths (a
/// part's other bytes are never read, so a merge leaves them as they are) for
/// the leftmost pair of lowest rank and the part before it: no block minima
/// and no walk back. The standalone `merge` step's slab (its length may pass
/// a word's 32 start bits); a fused kernel's slab is keyed instead
/// ([`emit_keyed_slab_merge`]).
fn emit_slab_merge(
    b: &mut BlockBuilder,
    names: &Names,
    pairs: &SlotTable,
    [start, len]: [&Expr; 2],
    threads: u32,
    parts_name: &str,
) {
    let parts = Expr::var(parts_name);
    let lane = b.let_(names.of("slab_lane"), Expr::local_id(Axis::X));
    let words = PartWords::Slab {
        threads,
        lane: &lane,
    };
    let part = |offset: Expr| words.load(offset);
    emit_byte_parts(b, &names.nested("slab"), [start, len], words);
    b.while_(Expr::bool(true), |b| {
        // The parts in order; strict `<` keeps the leftmost of lowest rank.
        let best_name = names.of("slab_best");
        let first_name = names.of("slab_first");
        let first_len_name = names.of("slab_first_len");
        let before_name = names.of("slab_before");
        let previous_name = names.of("slab_previous");
        let at_name = names.of("slab_at");
        let best = b.let_mut(best_name.clone(), NO_PAIR);
        let first = b.let_mut(first_name.clone(), 0u32);
        let first_len = b.let_mut(first_len_name.clone(), 0u32);
        let before = b.let_mut(before_name.clone(), 0u32);
        let previous = b.let_mut(previous_name.clone(), 0u32);
        let at = b.let_mut(at_name.clone(), 0u32);
        b.while_(at.clone().less_than(len.clone()), |b| {
            let word = b.let_(names.of("slab_word"), part(at.clone()));
            b.if_(pair_of(word.clone()).less_than(best.clone()), |b| {
                b.assign(best_name.clone(), pair_of(word.clone()));
                b.assign(first_name.clone(), at.clone());
                b.assign(first_len_name.clone(), part_len(word.clone()));
                b.assign(before_name.clone(), previous.clone());
            });
            b.assign(previous_name.clone(), at.clone());
            b.assign(at_name.clone(), at.clone() + part_len(word));
        });
        b.if_(best.clone().equals(NO_PAIR), |b| {
            b.break_();
        });
        // Two words of the slab, loaded together: the second part's, and the
        // part before's (for its length; the walk kept only its offset, one
        // variable fewer in its loop).
        let second_word = b.let_(
            names.of("slab_second_word"),
            part(first.clone() + first_len.clone()),
        );
        let before_len = b.let_(names.of("slab_before_len"), part_len(part(before.clone())));
        emit_merge_pair(
            b,
            &names.nested("slab"),
            pairs,
            [start, len],
            MergeSite {
                first: &first,
                first_len: &first_len,
                merged: &best,
                second_word: &second_word,
                before: &before,
                before_len: &before_len,
            },
            words,
        );
        b.assign(parts_name, parts.clone() - 1u32);
    });
}

/// The merge loop of a range of at most `size` bytes (2 to
/// [`MAX_REGISTER_MERGE_BYTES`]) that is not one token, in the thread's slab
/// of [`MERGE_SLAB`] (`size` words a thread), as a fused kernel merges the
/// ranges too long for its registers; `parts` (the variable named so, `len`
/// on entry) counts the parts left. The slab holds the register merge's keys
/// ([`pair_key`]) at the parts' starts, a *rank word* (the part's rank under
/// [`RANK_WORD_TAG`]) at a longer part's second byte and [`NO_KEY`] at its
/// other bytes, so that every word but a start's reads as no pair; the start
/// bits are one register. A merge loads every word of the slab at once and
/// takes the smallest key by a tree ([`emit_lowest_key`]), the neighbours
/// from the start bits, their ranks from their rank words or, for a part of
/// one byte, from its byte ([`part_rank`]: no load of `token_at`, which every
/// merge still keeps up to date, off the chain), then looks both new pairs up
/// together.
///
/// Why not [`emit_slab_merge`]'s walk: there a merge followed the parts by
/// their lengths, a chain of dependent loads of workgroup memory as long as
/// the range's parts (up to 19 for the 17–19-byte identifiers of code, whose
/// longest chains are 16 merges), then loaded the two neighbours' words and
/// their ranks from `token_at` (a round trip to L2); here the slab's loads
/// are independent, a merge's chain is the tree's depth, and the ranks come
/// from workgroup memory and the byte-rank table (in L1). On an H100
/// (2026-12-07, the `gpu_encode` bench, two runs alternating with the walk's
/// build, the resident kernel's own clock) 256 KiB of code's `merge` took
/// 20.7–21.2 µs against 26.0–26.1, its kernel 64.5–66.4 against 69.8–71.6,
/// its graph with the ids read in place 74.4–77.1 against 78.5–82.3; prose
/// and CJK (few ranges past 16 bytes) did not move. The rank words took
/// nothing off that beyond the keys (a build with the ranks still loaded
/// from `token_at`, and one with them in a second slab, ran the same), but
/// they are what a slab that takes every range leans on (the sweep at
/// [`REGISTER_MERGE_BYTES`]).
fn emit_keyed_slab_merge(
    b: &mut BlockBuilder,
    names: &Names,
    pairs: &SlotTable,
    [start, len]: [&Expr; 2],
    [size, threads]: [u32; 2],
    parts_name: &str,
) {
    debug_assert!(size <= MAX_REGISTER_MERGE_BYTES);
    let names = &names.nested("keyed");
    let parts = Expr::var(parts_name);
    let lane = b.let_(names.of("lane"), Expr::local_id(Axis::X));
    let words = PartWords::KeyedSlab {
        threads,
        lane: &lane,
    };
    emit_byte_parts(b, names, [start, len], words);
    // The words past the range read as no pair too, so that a merge loads
    // every word of the slab at a fixed offset (no clamp into the range).
    for k in 2..size {
        b.if_(u(k).greater_equal(len.clone()), |b| {
            words.store(b, u(k), u(NO_KEY));
        });
    }
    let last = b.let_(names.of("last"), len.clone() - 1u32);
    let starts_name = names.of("starts");
    let starts = b.let_mut(starts_name.clone(), every_byte_starts(len));
    b.while_(Expr::bool(true), |b| {
        // Every word at once (a byte inside a part, or past the range, reads
        // as no pair).
        let keys: Vec<Expr> = (0..size)
            .map(|k| b.let_(names.of(&format!("key{k}")), words.load(u(k))))
            .collect();
        let KeyedMerge {
            first,
            best,
            second,
            after,
            after_end,
            has_before,
            before,
        } = emit_lowest_key(b, names, &keys, &starts);
        let after_len = b.let_(names.of("after_len"), after_end - after.clone());
        let rank_of = |b: &mut BlockBuilder, what: &str, at: &Expr, part_len: Expr| {
            part_rank(b, &names.nested(what), words, [start, &last], at, part_len)
        };
        let after_rank = rank_of(b, "after_rank", &after, after_len);
        let before_rank = rank_of(b, "before_rank", &before, first.clone() - before.clone());
        let [right, left] = emit_pair_ranks_together(
            b,
            [&names.nested("right"), &names.nested("left")],
            pairs,
            [[best.clone(), after_rank], [before_rank, best.clone()]],
        );
        words.store(
            b,
            first.clone(),
            after
                .less_than(len.clone())
                .select(pair_key(right, first.clone()), u(NO_KEY)),
        );
        b.if_(has_before, |b| {
            words.store(b, before.clone(), pair_key(left, before.clone()));
        });
        // The second part's start a start no more, then the merged part's
        // rank in its second byte (which may be that start).
        words.store(b, second.clone(), u(NO_KEY));
        words.store(b, first.clone() + 1u32, u(RANK_WORD_TAG) | best.clone());
        b.store(Role::TokenAt.name(), start.clone() + first, best);
        b.store(
            Role::TokenAt.name(),
            start.clone() + second.clone(),
            NO_TOKEN,
        );
        b.assign(starts_name.clone(), starts.clone() & !(u(1) << second));
        b.assign(parts_name, parts.clone() - 1u32);
    });
}

/// Key bits of a keyed slab's *rank word*, the word of a part's second byte,
/// which holds the part's rank below them: above every key (no pair to the
/// tree of minima).
const RANK_WORD_TAG: u32 = !(FIRST_NON_KEY - 1);

const _: () = assert!(RANK_WORD_TAG & (FIRST_NON_RANK - 1) == 0);

/// The rank of a keyed slab's part at offset `at` of `part_len` bytes (any
/// offset and length where there is no such part: the rank is then not
/// used): a part of one byte is that byte's token, a longer one keeps its rank
/// in its second byte's word. Both sources are loaded (at offsets clamped
/// into the range) and one is selected, so that neither waits on a test.
fn part_rank(
    b: &mut BlockBuilder,
    names: &Names,
    words: PartWords,
    [start, last]: [&Expr; 2],
    at: &Expr,
    part_len: Expr,
) -> Expr {
    let byte = load(Role::Text, start.clone() + at.clone().min(last.clone()));
    let word = b.let_(
        names.of("word"),
        words.load((at.clone() + 1u32).min(last.clone())),
    );
    let byte_rank = b.let_(names.of("byte_rank"), vocab(byte + BYTE_RANKS_AT));
    b.let_(
        names.of("rank"),
        part_len
            .equals(1u32)
            .select(byte_rank, word & !RANK_WORD_TAG),
    )
}

/// The merge loop of a range of at most `size` bytes (at least 2) that is not
/// one token, its whole state in registers ([`StepBuild::Fused`]); `parts`
/// (the variable named so, `len` on entry) counts the parts left. Leaves
/// `token_at` as every merge loop does: each part's rank at its first byte,
/// [`NO_TOKEN`] at its other bytes.
///
/// The state, unrolled over the `size` offsets (a register each): the parts'
/// starts as bits of one word (bit `len` marks the end), at a part's start the
/// part's rank and the *key* of its pair with the next part (the pair's rank
/// above the offset's 5 bits, [`pair_key`]; [`NO_KEY`] for none, and at every
/// offset that starts no part). A merge takes the leftmost pair of lowest rank
/// as the smallest key, a tree of minima (no walk over the parts), finds the
/// second part, the part after and the part before from the start bits, picks
/// their ranks from the rank registers through a tree of selects on the
/// offset's bits (no load of `token_at`), looks both new pairs up together and
/// updates the registers; `token_at` is written once, after the last merge.
/// Why: the slab's merge loop walked its parts through a chain of dependent
/// workgroup-memory loads, read the two neighbours' ranks from `token_at` in
/// global memory and looked the pairs up one after the other, each a round
/// trip in the chain that a 1 KiB text's kernel waits on (its longest piece,
/// eight merges); a fused kernel has the registers to spare ([`StepBuild`]).
/// Why keys and trees: comparing the pair registers one after another (a
/// rank and an offset selected at each) and picking a rank by a chain of
/// selects made every merge's instructions a chain as long as the registers;
/// the trees are as deep as their logarithm. On an H100 (2026-12-05, kernels'
/// own time, median of 200) the keys and trees took 1 KiB of prose from 28.8
/// to 28.2 µs at 12 offsets and from 30.0 to 29.1 at 16, 1 KiB of code from
/// 33.7 to 32.5 at 16.
fn emit_register_merge(
    b: &mut BlockBuilder,
    names: &Names,
    pairs: &SlotTable,
    [start, len]: [&Expr; 2],
    size: u32,
    parts_name: &str,
) {
    debug_assert!(size <= MAX_REGISTER_MERGE_BYTES);
    let names = &names.nested("reg");
    let parts = Expr::var(parts_name);
    let last = b.let_(names.of("last"), len.clone() - 1u32);
    // Every byte at once, at offsets clamped into the range (every load in
    // bounds), then every byte's rank and every pair's, all independent.
    let bytes: Vec<Expr> = (0..size)
        .map(|k| {
            b.let_(
                names.of(&format!("byte{k}")),
                load(Role::Text, start.clone() + u(k).min(last.clone())),
            )
        })
        .collect();
    let rank_names: Vec<String> = (0..size).map(|k| names.of(&format!("rank{k}"))).collect();
    let key_names: Vec<String> = (0..size).map(|k| names.of(&format!("key{k}"))).collect();
    let ranks: Vec<Expr> = (0..size as usize)
        .map(|k| {
            b.let_mut(
                rank_names[k].clone(),
                vocab(bytes[k].clone() + BYTE_RANKS_AT),
            )
        })
        .collect();
    let keys: Vec<Expr> = (0..size as usize)
        .map(|k| {
            let key = if k + 1 < size as usize {
                let pair = b.let_(
                    names.of(&format!("byte_pair{k}")),
                    u(k as u32).less_than(last.clone()).select(
                        vocab(((bytes[k].clone() << 8u32) | bytes[k + 1].clone()) + PAIR_RANKS_AT),
                        u(NO_TOKEN),
                    ),
                );
                pair_key(pair, u(k as u32))
            } else {
                u(NO_KEY)
            };
            b.let_mut(key_names[k].clone(), key)
        })
        .collect();
    let starts_name = names.of("starts");
    let starts = b.let_mut(starts_name.clone(), every_byte_starts(len));
    b.while_(Expr::bool(true), |b| {
        let KeyedMerge {
            first,
            best,
            second,
            after,
            has_before,
            before,
            ..
        } = emit_lowest_key(b, names, &keys, &starts);
        // A rank register by a variable offset, through a tree of selects on
        // the offset's bits (an offset past the last gives some register:
        // its rank is then not used).
        let pick = |b: &mut BlockBuilder, what: &str, at: &Expr| {
            tree(b, names, what, &ranks, |level, pair| {
                ((at.clone() >> level) & 1u32)
                    .equals(1u32)
                    .select(pair[1].clone(), pair[0].clone())
            })
        };
        let after_rank = pick(b, "after_rank", &after);
        let before_rank = pick(b, "before_rank", &before);
        let [right, left] = emit_pair_ranks_together(
            b,
            [&names.nested("right"), &names.nested("left")],
            pairs,
            [[best.clone(), after_rank], [before_rank, best.clone()]],
        );
        let right = b.let_(
            names.of("right_key"),
            after
                .clone()
                .less_than(len.clone())
                .select(pair_key(right, first.clone()), u(NO_KEY)),
        );
        let left = b.let_(
            names.of("left_key"),
            has_before.select(pair_key(left, before.clone()), u(NO_KEY)),
        );
        for k in 0..size as usize {
            let at = u(k as u32);
            b.assign(
                rank_names[k].clone(),
                first
                    .clone()
                    .equals(at.clone())
                    .select(best.clone(), ranks[k].clone()),
            );
            // Only a part's start is ever the part before (`before` is 0
            // when there is none, and then `first` is 0 too).
            b.assign(
                key_names[k].clone(),
                first.clone().equals(at.clone()).select(
                    right.clone(),
                    before.clone().equals(at.clone()).select(
                        left.clone(),
                        second.clone().equals(at).select(u(NO_KEY), keys[k].clone()),
                    ),
                ),
            );
        }
        b.assign(
            starts_name.clone(),
            starts.clone() & !(u(1) << second.clone()),
        );
        b.assign(parts_name, parts.clone() - 1u32);
    });
    for k in 0..size {
        b.if_(u(k).less_than(len.clone()), |b| {
            b.store(
                Role::TokenAt.name(),
                start.clone() + k,
                ((starts.clone() >> k) & 1u32)
                    .equals(1u32)
                    .select(ranks[k as usize].clone(), u(NO_TOKEN)),
            );
        });
    }
}

/// The start bits of a range of `len` (at most 31) bytes whose every byte is
/// a part: bit k, a part starts at offset k; bit `len`, the range's end (for
/// a range of 31 bytes bit 31, since `2 << 31` wraps to 0).
fn every_byte_starts(len: &Expr) -> Expr {
    (u(2) << len.clone()) - 1u32
}

/// The merge a keyed loop takes next and the parts around it, all offsets in
/// the range (variables).
struct KeyedMerge {
    /// The first part's offset: the pair's.
    first: Expr,
    /// The pair's rank: the merged token's.
    best: Expr,
    /// The second part's offset.
    second: Expr,
    /// The offset of the part after the merged one (the range's length if
    /// none).
    after: Expr,
    /// Where that part ends: the next start, or the range's end (any offset
    /// past it where there is no part after).
    after_end: Expr,
    /// Whether a part comes before the first.
    has_before: Expr,
    /// The offset of the part before the first (0 if none).
    before: Expr,
}

/// The leftmost pair of lowest rank among `keys` (a word for each byte of the
/// range: a part's [`pair_key`] at its start, and elsewhere a word above
/// every key) and its neighbours, from the range's start bits (see
/// [`every_byte_starts`]); breaks out of the enclosing loop when no pair is
/// left. The smallest key is a tree of minima (the offset in a key's low bits
/// breaks ties to the left), the neighbours are bit operations on `starts`:
/// no walk over the parts.
fn emit_lowest_key(
    b: &mut BlockBuilder,
    names: &Names,
    keys: &[Expr],
    starts: &Expr,
) -> KeyedMerge {
    let best_key = tree(b, names, "lowest", keys, |_, pair| {
        pair[0].clone().min(pair[1].clone())
    });
    b.if_(best_key.clone().greater_equal(FIRST_NON_KEY), |b| {
        b.break_();
    });
    let first = b.let_(names.of("first"), best_key.clone() & OFFSET_MASK);
    let best = b.let_(names.of("best"), best_key >> KEY_OFFSET_BITS);
    // The starts after `first`: the second part's, then the one after it
    // (`len` when the merged part ends the range).
    let above = b.let_(
        names.of("above"),
        starts.clone() & !((u(2) << first.clone()) - 1u32),
    );
    let second = b.let_(names.of("second"), lowest_set_bit(above.clone()));
    let past_second = b.let_(names.of("past_second"), above.clone() & (above - 1u32));
    let after = b.let_(names.of("after"), lowest_set_bit(past_second.clone()));
    let after_end = b.let_(
        names.of("after_end"),
        lowest_set_bit(past_second.clone() & (past_second - 1u32)),
    );
    let below = b.let_(
        names.of("below"),
        starts.clone() & ((u(1) << first.clone()) - 1u32),
    );
    let has_before = b.let_(names.of("has_before"), below.clone().not_equals(0u32));
    let before = b.let_(
        names.of("before"),
        has_before
            .clone()
            .select(u(31) - below.leading_zeros(), u(0)),
    );
    KeyedMerge {
        first,
        best,
        second,
        after,
        after_end,
        has_before,
        before,
    }
}

/// The index of the lowest set bit of `word` (32 for none).
fn lowest_set_bit(word: Expr) -> Expr {
    ((word.clone() & (!word + 1u32)) - 1u32).count_ones()
}

/// Bits of a register merge's key that hold the pair's offset in its range.
const KEY_OFFSET_BITS: u32 = 5;

/// The offset bits of a key.
const OFFSET_MASK: u32 = (1 << KEY_OFFSET_BITS) - 1;

/// The key of no pair: above every pair's.
const NO_KEY: u32 = u32::MAX;

/// Keys from this one up are no pair ([`NO_KEY`], a keyed slab's rank
/// words): a pair's rank is below [`FIRST_NON_RANK`].
const FIRST_NON_KEY: u32 = FIRST_NON_RANK << KEY_OFFSET_BITS;

// Every offset of a register merge fits its key's offset bits, and a pair's
// rank (below `2^PAIR_RANK_BITS`) the bits above them.
const _: () = assert!(MAX_REGISTER_MERGE_BYTES < 1 << KEY_OFFSET_BITS);
const _: () = assert!(PAIR_RANK_BITS + KEY_OFFSET_BITS <= 32);

/// The key of the pair of rank `rank` at offset `offset` (a register merge's,
/// a keyed slab's): the rank above the offset, so the smallest key is the
/// leftmost pair of lowest rank; [`NO_KEY`] where `rank` is no rank
/// ([`NO_TOKEN`], [`NO_PAIR`]).
fn pair_key(rank: Expr, offset: Expr) -> Expr {
    rank.clone()
        .less_than(FIRST_NON_RANK)
        .select((rank << KEY_OFFSET_BITS) | offset, u(NO_KEY))
}

/// `values` combined pairwise, level by level (`combine(level, [left,
/// right])`; an odd one out goes up alone), into one: a tree as deep as the
/// log of their count, where a chain would be as deep as the count.
fn tree(
    b: &mut BlockBuilder,
    names: &Names,
    what: &str,
    values: &[Expr],
    combine: impl Fn(u32, [&Expr; 2]) -> Expr,
) -> Expr {
    let mut level_values = values.to_vec();
    let mut level = 0u32;
    while level_values.len() > 1 {
        level_values = level_values
            .chunks(2)
            .enumerate()
            .map(|(index, pair)| match pair {
                [left, right] => b.let_(
                    names.of(&format!("{what}{level}_{index}")),
                    combine(level, [left, right]),
                ),
                alone => alone[0].clone(),
            })
            .collect();
        level += 1;
    }
    level_values.pop().unwrap_or_else(|| u(NO_KEY))
}

/// Claims `entries` entries of a list whose fill count is the `params` word
/// `counter` (`param::MERGE_COUNT`, `CHUNK_COUNT` or `LONG_COUNT`): one atomic add
/// on the counter; the count before it, `name`, is the first entry claimed.
fn emit_claim(b: &mut BlockBuilder, name: &str, counter: u32, entries: impl Into<Expr>) -> Expr {
    b.atomic_fetch(name, AtomicOp::Add, Role::Params.name(), counter, entries)
}

/// The start and end of piece `index`: the next piece's start, or the text's end.
fn emit_piece(b: &mut BlockBuilder, names: &Names, index: Expr) -> (Expr, Expr) {
    let index = b.let_(names.of("piece"), index);
    let count = load(Role::PieceCount, 0u32);
    let start = b.let_(
        names.of("piece_start"),
        load(Role::PieceStarts, index.clone()),
    );
    // Both sides of the select are evaluated: the last piece loads its own
    // start again, never the element past the list.
    let next = b.let_(names.of("next_piece"), index.clone() + 1u32);
    let has_next = b.let_(names.of("has_next"), next.clone().less_than(count));
    let end = b.let_(
        names.of("piece_end"),
        has_next.clone().select(
            load(Role::PieceStarts, has_next.select(next, index)),
            param(param::TEXT_LEN),
        ),
    );
    (start, end)
}

/// The start of chunk `index` of the piece `start..end`: `index · C` bytes from
/// its start, moved forward to the next first byte of a character (a byte that
/// is not `10xxxxxx`) within 3 bytes, so cuts do not split characters (which
/// keeps a run of 3-byte characters in step with its tokens), at most `end`.
fn emit_chunk_start(
    b: &mut BlockBuilder,
    name: &str,
    [start, end]: [Expr; 2],
    index: Expr,
    chunk: u32,
) -> Expr {
    let index = b.let_(format!("{name}_index"), index);
    let nominal = b.let_(format!("{name}_nominal"), start + index.clone() * chunk);
    let continuation = |offset: u32| {
        let at = nominal.clone() + offset;
        at.clone()
            .less_than(end.clone())
            .and((load(Role::Text, at) & 0xC0u32).equals(0x80u32))
    };
    let shift = continuation(0).select(
        continuation(1).select(continuation(2).select(u(3), u(2)), u(1)),
        u(0),
    );
    // The first chunk starts at the piece's start, whatever byte is there.
    let shift = b.let_(
        format!("{name}_shift"),
        index.equals(0u32).select(u(0), shift),
    );
    b.let_(name, (nominal + shift).min(end))
}

/// `stage`: the staged parameters, text (as `u64` words) and document ends
/// (the buffer's unused tail padded with the text length: empty documents, as
/// the split reads the buffer to its length) into the device buffers; every
/// thread strides over the words and the ends, so any grid stages them all
/// ([`Geometry::stage_workgroups`] caps it).
pub fn stage(geometry: &Geometry) -> Program {
    stage_program(geometry, StagedTextReads::Words)
}

/// `stage` as the short-text kernel's first step ([`super::fused`]): the same
/// copies, but the text stored byte by byte into the `u8` text buffer that
/// every later step reads, because one program binds each buffer with one
/// element type. Eight byte stores per word cost nothing at the short path's
/// few KiB; the step it replaces was a dispatch of its own (on the H200,
/// 2026-12-02: 13.8 µs of a 1 KiB encode's 83.6, its launch included). It
/// takes the text length from the fused kernel's scalar
/// ([`TEXT_LEN_SCALAR`](super::fused::TEXT_LEN_SCALAR)), not from the staged
/// parameters: on CUDA those are host-mapped memory, and the loads of the
/// text's words waited for that first round trip across PCIe before they
/// could go out (the short-text kernel's `stage` of 1 KiB took 5.2 µs from
/// the kernel's entry on an H100, 2026-12-05, and 2.5–2.7 µs with the scalar
/// on an H200 the same day, against 5.0–5.2 for the build before it). The
/// number of documents comes the same way
/// ([`DOCUMENTS_SCALAR`](super::fused::DOCUMENTS_SCALAR)): every thread
/// needs it, and in the resident grid that was every warp's own load across
/// PCIe.
pub fn short_stage(geometry: &Geometry) -> Program {
    stage_program(geometry, StagedTextReads::Bytes)
}

/// `stage` as the resident-grid kernel's first step ([`super::fused`]):
/// [`short_stage`]'s copies, but each piece of [`TEXT_READY_PIECE_BYTES`] of
/// the staged text is read only once its ready flag ([`Role::TextReady`],
/// [`TEXT_READY_FLAG_WORDS`] words from the next) is nonzero. Why: on CUDA an encoder that feeds its
/// text (`DeviceEncoder::with_text_fed`) gathers it into the host-mapped
/// staging while this kernel already runs (the graph is launched first,
/// `AnyGraph::replay_feeding`), publishing each piece's flag
/// with a release store once the piece is written; a workgroup's first thread
/// polls the flag with a system-scope acquire load, and the workgroup barrier
/// after it carries that acquire to the threads that then read the piece. So
/// the gather, the launch and this step's reads across PCIe overlap instead
/// of following one another. Where the host writes everything before the
/// kernel starts (the reference interpreter, an eager dispatch without the
/// graph), it sets every flag first and each poll succeeds at once.
pub fn ready_stage(geometry: &Geometry) -> Program {
    stage_program(geometry, StagedTextReads::BytesWhenReady)
}

/// How `stage` reads the staged text and stores it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum StagedTextReads {
    /// Word for word into `u64` words; the text length and number of
    /// documents from the staged parameters.
    Words,
    /// Each word's eight bytes, lowest address first, into `u8` bytes; the
    /// text length and number of documents from the fused kernel's scalars.
    Bytes,
    /// [`StagedTextReads::Bytes`], each piece once its ready flag is set.
    BytesWhenReady,
}

/// Bytes of staged text behind one ready flag ([`Role::TextReady`],
/// [`ready_stage`]): 64 flags for 256 KiB, so that the four threads that
/// gather 256 KiB publish a piece every 0.2 µs or so while each flag costs
/// the kernel one poll across PCIe. (1 KiB pieces, a flag for every
/// workgroup, were no faster: on an H100, 2026-12-07, `stage` of 256 KiB
/// 12–27 µs against 12–17.)
pub const TEXT_READY_PIECE_BYTES: u32 = 4096;

/// Words from one ready flag ([`Role::TextReady`]) to the next: 32, one flag
/// per 128-byte line, the words between unused. Why: each workgroup's poll
/// is a system-scope load across PCIe (`LDG.E.STRONG.SYS`), and such loads
/// of one line wait for each other. On an H100 (2026-12-07, the encode
/// example, 256 KiB, three alternating rounds) the resident kernel's `stage`
/// took 22–28 µs with the 64 flags in two lines and 12–17 with a line each
/// (256 KiB eagerly prose 88–92 µs against 101–104, CJK 104–112 against
/// 117–119, code 111 against 122–129); with the text by the copy engine and
/// every flag set before the launch, one poll per workgroup of the packed
/// flags took `stage` from 2.5 µs to 17–22, a plain load instead of the
/// acquire 2.5.
pub const TEXT_READY_FLAG_WORDS: u32 = 32;

/// `stage` reading and storing the text as `reads` says.
fn stage_program(geometry: &Geometry, reads: StagedTextReads) -> Program {
    let workgroup_size = geometry.workgroup_size;
    let fused = reads != StagedTextReads::Words;
    let gated = reads == StagedTextReads::BytesWhenReady;
    let stage_step = if gated { &READY_STAGE } else { step("stage") };
    let mut builder = builder(geometry, stage_step, |role| match role {
        Role::StagedText => ElemType::U64,
        Role::Text if fused => ElemType::U8,
        Role::Text => ElemType::U64,
        _ => ElemType::U32,
    });
    if fused {
        builder = builder
            .scalar(super::fused::TEXT_LEN_SCALAR, ScalarType::U32)
            .scalar(super::fused::DOCUMENTS_SCALAR, ScalarType::U32);
    }
    builder
        .body(|b| {
            let thread = b.let_("thread", Expr::global_id(Axis::X));
            let threads = b.let_("threads", Expr::workgroup_count(Axis::X) * workgroup_size);
            // A parameter from the fused kernel's scalar, or from its word of
            // the staged parameters.
            let parameter = |scalar: &str, word: u32| {
                if fused {
                    Expr::scalar(scalar)
                } else {
                    load(Role::StagedParams, word)
                }
            };
            let text_len = b.let_(
                "text_len",
                parameter(super::fused::TEXT_LEN_SCALAR, param::TEXT_LEN),
            );
            let documents = b.let_(
                "documents",
                parameter(super::fused::DOCUMENTS_SCALAR, param::DOCUMENTS),
            );
            b.if_(thread.clone().less_than(param::WORDS), |b| {
                // The staged parameters are the text length, the number of
                // documents and zeros (counters, step clocks): the fused
                // kernel writes them from its scalars instead of reading the
                // staged copy across PCIe on the way to its first barrier.
                let value = if fused {
                    thread.clone().equals(param::TEXT_LEN).select(
                        text_len.clone(),
                        thread
                            .clone()
                            .equals(param::DOCUMENTS)
                            .select(documents.clone(), 0u32),
                    )
                } else {
                    load(Role::StagedParams, thread.clone())
                };
                b.store(Role::Params.name(), thread.clone(), value);
            });
            let words = b.let_("words", (text_len.clone() + 7u32) >> 3u32);
            let ends = b.let_("ends", Expr::length(Role::DocumentEnds.name()));
            // The word's bytes into the text (as bytes in a fused kernel).
            let store_word = |b: &mut BlockBuilder, item: &Expr, word: Expr| {
                if fused {
                    for byte in 0..8u32 {
                        b.store(
                            Role::Text.name(),
                            item.clone() * 8u32 + byte,
                            (word.clone() >> (8 * byte)).cast(ScalarType::U32),
                        );
                    }
                } else {
                    b.store(Role::Text.name(), item.clone(), word);
                }
            };
            // A document's end, padded past the last document with the text
            // length (empty documents to the buffer's end).
            let store_end = |b: &mut BlockBuilder, item: &Expr, staged_end: Expr| {
                b.store(
                    Role::DocumentEnds.name(),
                    item.clone(),
                    item.clone()
                        .less_than(documents.clone())
                        .select(staged_end, text_len.clone()),
                );
            };
            // The staged end of document `item`: with one document the text
            // length, no load. (A uniform branch on the scalar, so nothing
            // waits for it.)
            let staged_end = |b: &mut BlockBuilder, item: &Expr| {
                if !fused {
                    return b.let_("staged_end", load(Role::StagedDocuments, item.clone()));
                }
                let staged_end = b.let_mut("staged_end", text_len.clone());
                b.if_(documents.clone().greater_than(1u32), |b| {
                    b.assign("staged_end", load(Role::StagedDocuments, item.clone()));
                });
                staged_end
            };
            if gated {
                // The ends first: the host wrote them before the launch.
                let item = b.let_mut("end_item", thread);
                b.while_(item.clone().less_than(ends.clone()), |b| {
                    let end = staged_end(b, &item);
                    store_end(b, &item, end);
                    b.assign("end_item", item.clone() + threads.clone());
                });
                // Then the text, piece by piece as the host publishes it:
                // workgroup `g` of `G` takes pieces `g, g + G, ...`.
                let piece_words = TEXT_READY_PIECE_BYTES / 8;
                let pieces = b.let_(
                    "pieces",
                    (text_len.clone() + (TEXT_READY_PIECE_BYTES - 1)) / TEXT_READY_PIECE_BYTES,
                );
                let local = b.let_("local", Expr::local_id(Axis::X));
                let piece = b.let_mut("piece", Expr::workgroup_id(Axis::X));
                b.while_(piece.clone().less_than(pieces), |b| {
                    b.if_(local.clone().equals(0u32), |b| {
                        let ready = b.let_mut("ready", 0u32);
                        b.while_(ready.clone().equals(0u32), |b| {
                            let seen = b.acquire_load(
                                "seen",
                                Role::TextReady.name(),
                                piece.clone() * TEXT_READY_FLAG_WORDS,
                            );
                            b.assign("ready", seen);
                        });
                    });
                    b.barrier();
                    let first = piece.clone() * piece_words;
                    let end = b.let_(
                        "piece_end",
                        (first.clone() + piece_words).min(words.clone()),
                    );
                    let item = b.let_mut("word_item", first + local.clone());
                    b.while_(item.clone().less_than(end), |b| {
                        let word = b.let_("word", load(Role::StagedText, item.clone()));
                        store_word(b, &item, word);
                        b.assign("word_item", item.clone() + workgroup_size);
                    });
                    b.assign("piece", piece.clone() + Expr::workgroup_count(Axis::X));
                });
                return;
            }
            let items = b.let_("items", words.clone().max(ends.clone()));
            let item = b.let_mut("item", thread);
            b.while_(item.clone().less_than(items), |b| {
                // Both staged loads before either branch: on CUDA they read
                // host-mapped memory across PCIe (below the copy engine's sizes),
                // and the document end's load, issued after the stores of the
                // word's bytes, went out only once the word had come back: two
                // round trips where one does. (On an H100, 2026-12-05, the
                // short-text kernel's `stage` of 1 KiB took 5.2 µs from the
                // kernel's entry; not yet measured since.) An item past either
                // buffer's end loads its element 0, which it does not use.
                let word = b.let_("word", load_inside(Role::StagedText, item.clone(), &words));
                let end_index = b.let_("end_index", index_inside(item.clone(), &ends));
                let end = staged_end(b, &end_index);
                b.if_(item.clone().less_than(words.clone()), |b| {
                    store_word(b, &item, word);
                });
                b.if_(item.clone().less_than(ends.clone()), |b| {
                    store_end(b, &item, end);
                });
                b.assign("item", item.clone() + threads.clone());
            });
        })
        .build()
}

/// `pieces`: workgroup `g` takes the tiles `g, g + G, ...` of `W` pieces
/// (`G` workgroups, [`Grid::PieceTiles`]), thread `t` piece `tile · W + t` of
/// each. A piece that is a token writes it; a piece of up to `C` bytes that is
/// not goes on the merge list; a longer one on the long list, its chunks (`C`
/// bytes from its start) on the chunk list. No later step depends on the order
/// of the lists' entries: `merge` and `long` take each entry alone, and `long`
/// finds a piece's chunk boundaries from its bytes, not from the chunk list.
pub fn pieces(geometry: &Geometry) -> Program {
    pieces_with(geometry, StepBuild::Standalone)
}

/// [`pieces`] built as `build` says.
pub fn pieces_with(geometry: &Geometry, build: StepBuild) -> Program {
    let chunk = geometry.chunk_bytes;
    let workgroup_size = geometry.workgroup_size;
    builder(geometry, step("pieces"), element_type)
        // One word per tile parity: see the store below.
        .buffer(
            "merge_base",
            step("pieces").bindings.len() as u32,
            Access::Workgroup,
            ElemType::U32,
            BufferCount::Static(2),
        )
        .body(|b| {
            // Reduced, so the tile loop, whose body has barriers, has a
            // workgroup-uniform bound.
            let piece_count =
                b.workgroup_reduce("piece_count", ReduceOp::Max, load(Role::PieceCount, 0u32));
            let tiles = b.let_(
                "tiles",
                (piece_count.clone() + (workgroup_size - 1)) / workgroup_size,
            );
            let groups = b.let_("groups", Expr::workgroup_count(Axis::X));
            let vocabulary = LookupHeader::emit(b, &Names::new("header"), build);
            let tile = b.let_mut("tile", Expr::workgroup_id(Axis::X));
            b.while_(tile.clone().less_than(tiles), |b| {
                let piece = b.let_(
                    "piece",
                    tile.clone() * workgroup_size + Expr::local_id(Axis::X),
                );
                let active = b.let_("active", piece.clone().less_than(piece_count.clone()));
                // An inactive thread reads piece 0, never past the list.
                let (start, end) = emit_piece(
                    b,
                    &Names::new("p"),
                    active.clone().select(piece.clone(), 0u32),
                );
                let len = b.let_(
                    "len",
                    active.clone().select(end.clone() - start.clone(), 0u32),
                );
                let long = b.let_("long", len.clone().greater_than(chunk));
                let needs_merge = b.let_mut("needs_merge", 0u32);
                b.if_(long.clone(), |b| {
                    let slot = emit_claim(b, "long_slot", param::LONG_COUNT, 1u32);
                    b.store(Role::LongList.name(), slot, piece.clone());
                    let chunks = b.let_("chunks", (len.clone() + (chunk - 1)) / chunk);
                    let base = emit_claim(b, "chunk_base", param::CHUNK_COUNT, chunks.clone());
                    b.loop_("chunk", 0u32, chunks, |b, index| {
                        let entry = b.let_("entry", (base.clone() + index.clone()) * 2u32);
                        let chunk_start = emit_chunk_start(
                            b,
                            "chunk_start",
                            [start.clone(), end.clone()],
                            index.clone(),
                            chunk,
                        );
                        let chunk_end = emit_chunk_start(
                            b,
                            "chunk_end",
                            [start.clone(), end.clone()],
                            index + 1u32,
                            chunk,
                        );
                        // A last chunk that a character boundary pushed past the
                        // end is an empty range, which `merge` skips.
                        b.store(Role::ChunkList.name(), entry.clone(), chunk_start);
                        b.store(Role::ChunkList.name(), entry + 1u32, chunk_end);
                    });
                });
                b.if_(active.clone().and(long.logical_not()), |b| {
                    let rank = emit_lookup(
                        b,
                        &Names::new("whole"),
                        &vocabulary,
                        start.clone(),
                        len.clone(),
                    );
                    b.if_else(
                        rank.clone().not_equals(NO_TOKEN),
                        |b| {
                            b.store(Role::TokenAt.name(), start.clone(), rank.clone());
                            // Every other byte of the piece (a token has at least one).
                            emit_clear_tokens(
                                b,
                                "clear",
                                [start.clone() + 1u32, len.clone() - 1u32],
                            );
                        },
                        |b| {
                            // A piece of two bytes that is no token has one
                            // pair, itself: its ids are its bytes' (most such
                            // pieces are two bytes between cuts).
                            b.if_else(
                                len.clone().equals(2u32),
                                |b| {
                                    for offset in 0..2u32 {
                                        let at = start.clone() + offset;
                                        let byte = load(Role::Text, at.clone());
                                        b.store(
                                            Role::TokenAt.name(),
                                            at,
                                            vocab(byte + BYTE_RANKS_AT),
                                        );
                                    }
                                },
                                |b| {
                                    b.assign("needs_merge", 1u32);
                                },
                            );
                        },
                    );
                });
                // One atomic per tile claims the tile's merge-list entries (a
                // counter every thread hit would serialize in L2): the last
                // thread's inclusive scan is the tile's total, and each thread's
                // place is its inclusive scan less its own entry (one scan and no
                // reduction per tile).
                let through = b.workgroup_scan(
                    "merge_through",
                    ReduceOp::Sum,
                    ScanKind::Inclusive,
                    needs_merge.clone(),
                );
                let place = b.let_("merge_place", through.clone() - needs_merge.clone());
                // Tiles alternate between two words: the last thread writes tile
                // `k + 2`'s after the barrier of tile `k + 1`, which every thread
                // reaches only after reading tile `k`'s, so no barrier is needed
                // after the reads.
                let base_word = b.let_("base_word", tile.clone() & 1u32);
                b.if_(
                    Expr::local_id(Axis::X)
                        .equals(workgroup_size - 1)
                        .and(through.clone().greater_than(0u32)),
                    |b| {
                        let base =
                            emit_claim(b, "merge_first", param::MERGE_COUNT, through.clone());
                        b.store("merge_base", base_word.clone(), base);
                    },
                );
                b.barrier();
                b.if_(needs_merge.equals(1u32), |b| {
                    b.store(
                        Role::MergeList.name(),
                        Expr::load("merge_base", base_word) + place,
                        piece.clone(),
                    );
                });
                b.assign("tile", tile.clone() + groups.clone());
            });
        })
        .build()
}

/// Lanes of a warp: the unit in which a fused `merge` deals out its lists.
const WARP_LANES: u32 = 32;

/// The first entry of `merge`'s lists that the calling thread takes (then
/// every `G · W`-th after it, `G` workgroups of `W` threads). On its own the
/// step takes them thread by thread (`global_id`); a fused build deals them
/// out a warp's worth at a time across the step's workgroups: lane `l` of
/// warp `k` of workgroup `w` takes entry `(k · G + w) · 32 + l`. Both orders
/// give each entry below `G · W` to exactly one thread; the thread-by-thread
/// one gives the first `32 · G` entries to the first `G / 8` workgroups (at
/// `W` = 256), the dealt one to the first warp of every workgroup.
///
/// Why a fused `merge` takes its lists so: a short list otherwise runs on a
/// few workgroups, a few SMs, while the resident grid's other workgroups wait
/// at the grid sync. 256 KiB of the example's code (cl100k) has 2,829 pieces
/// to merge (prose 32,708, CJK 26,990), which the 128 groups of `merge` took
/// on their first 12 workgroups. On an H100 (2026-12-07, the encode example,
/// 40 encodes, median, four alternating rounds) `merge` then took 42.0–43.4
/// µs of code and 25.8–26.4 dealt out by warps, one eager encode 106.8–111.7
/// against 89.9–97.9; prose 14.6–15.7 against 14.8–15.8, CJK 9.5–10.2 against
/// 9.4–10.2; the `gpu_encode` bench on the day's last H100 host (one round):
/// code's `merge` 25.8 µs, eager 90.2 µs, and the step-by-step `merge`, which
/// keeps the thread-by-thread order, 47.6. Dealt out thread by thread across
/// the workgroups instead (lane `l` of workgroup `w` taking entry `l · G +
/// w`), code's `merge` took the same 25.8–26.2 but prose's 16.7–17.7: a
/// warp's lanes then read the text `G` pieces apart. A step on its own keeps
/// the thread-by-thread order (not measured dealt out): it runs for chunks
/// past the resident grid's 256 KiB, whose grids are many waves, where
/// workgroups with nothing to merge exit at once and leave their SM to the
/// next wave, and dealing would spread a short list's warps over every wave.
fn first_list_entry(build: StepBuild) -> Expr {
    match build {
        StepBuild::Standalone => Expr::global_id(Axis::X),
        StepBuild::Fused => {
            let local = Expr::local_id(Axis::X);
            (local.clone() / WARP_LANES * Expr::workgroup_count(Axis::X)
                + Expr::workgroup_id(Axis::X))
                * WARP_LANES
                + local % WARP_LANES
        }
    }
}

/// `merge`: every thread strides over the merge list and then the chunk list,
/// merging each entry's bytes into `token_at`.
pub fn merge(geometry: &Geometry) -> Program {
    merge_with(geometry, StepBuild::Standalone)
}

/// [`merge`] built as `build` says.
pub fn merge_with(geometry: &Geometry, build: StepBuild) -> Program {
    let workgroup_size = geometry.workgroup_size;
    let mut builder = builder(geometry, step("merge"), element_type);
    let in_registers = build == StepBuild::Fused;
    // A fused build keeps short ranges in registers, and the ranges past them
    // in its own slab if it has one.
    let (slab_bytes, after_registers) = if in_registers {
        let after = geometry.fused_merge_slab_bytes;
        (
            geometry.register_merge_bytes,
            if after > geometry.register_merge_bytes && after >= 2 {
                after
            } else {
                0
            },
        )
    } else {
        (geometry.merge_slab_bytes, 0)
    };
    let slab_words = if in_registers {
        after_registers
    } else if slab_bytes >= 2 {
        slab_bytes
    } else {
        0
    };
    if slab_words > 0 {
        builder = builder.buffer(
            MERGE_SLAB,
            step("merge").bindings.len() as u32,
            Access::Workgroup,
            ElemType::U32,
            BufferCount::Static(slab_words * workgroup_size),
        );
    }
    builder
        .body(|b| {
            let threads = b.let_("threads", Expr::workgroup_count(Axis::X) * workgroup_size);
            let merges = b.let_("merges", param(param::MERGE_COUNT));
            let total = b.let_("total", merges.clone() + param(param::CHUNK_COUNT));
            let pairs = SlotTable::emit_pairs(b, &Names::new("pair_table"), build);
            let entry = b.let_mut("entry", first_list_entry(build));
            b.while_(entry.clone().less_than(total), |b| {
                let listed = b.let_("listed", entry.clone().less_than(merges.clone()));
                // A chunk's entry takes piece 0 for the listed piece it does
                // not use (past the merge list, which it would read).
                let listed_piece = listed.clone().select(
                    load(Role::MergeList, listed.clone().select(entry.clone(), 0u32)),
                    0u32,
                );
                let (piece_start, piece_end) = emit_piece(b, &Names::new("m"), listed_piece);
                // Both sides of the selects below are evaluated: a listed
                // piece's chunk index is 0, not one before the list.
                let chunk = b.let_(
                    "chunk",
                    listed
                        .clone()
                        .select(0u32, (entry.clone() - merges.clone()) * 2u32),
                );
                let start = b.let_(
                    "start",
                    listed
                        .clone()
                        .select(piece_start, load(Role::ChunkList, chunk.clone())),
                );
                let end = b.let_(
                    "end",
                    listed
                        .clone()
                        .select(piece_end, load(Role::ChunkList, chunk + 1u32)),
                );
                b.if_(start.clone().less_than(end.clone()), |b| {
                    // A listed piece is no token: `pieces` looked it up.
                    emit_encode(
                        b,
                        &Names::new("e"),
                        &pairs,
                        [start.clone(), end.clone() - start.clone()],
                        Whole::LookUp {
                            skip: listed.clone(),
                        },
                        Slab {
                            bytes: slab_bytes,
                            threads: workgroup_size,
                            in_registers,
                            after_registers,
                        },
                    );
                });
                b.assign("entry", entry.clone() + threads.clone());
            });
        })
        .build()
}

/// The start of the token that ends just before byte `at` (scanning back over
/// bytes where no token starts; the piece's first byte always starts one).
fn emit_token_before(b: &mut BlockBuilder, name: &str, at: Expr) -> Expr {
    let found = b.let_mut(name, at - 1u32);
    b.while_(load(Role::TokenAt, found.clone()).equals(NO_TOKEN), |b| {
        b.assign(name, found.clone() - 1u32);
    });
    found
}

/// The end of the token that starts at byte `at` (the next byte where a token
/// starts, or `end`).
fn emit_token_after(b: &mut BlockBuilder, name: &str, at: Expr, end: Expr) -> Expr {
    let found = b.let_mut(name, at + 1u32);
    b.while_(
        found
            .clone()
            .less_than(end)
            .and(load(Role::TokenAt, found.clone()).equals(NO_TOKEN)),
        |b| {
            b.assign(name, found.clone() + 1u32);
        },
    );
    found
}

/// The tokens on either side of byte `at` (where a token starts; the token
/// after ends at the next token start or `end`): the start of the one before,
/// the end of the one after, and whether they are compatible.
fn emit_boundary(
    b: &mut BlockBuilder,
    names: &Names,
    pairs: &SlotTable,
    at: Expr,
    end: Expr,
) -> (Expr, Expr, Expr) {
    let at = b.let_(names.of("boundary"), at);
    let before = emit_token_before(b, &names.of("token_before"), at.clone());
    let after = emit_token_after(b, &names.of("token_after"), at.clone(), end);
    let compatible = emit_compatible(
        b,
        &names.nested("pair"),
        pairs,
        [before.clone(), at, after.clone()],
    );
    (before, after, compatible)
}

/// Whether the tokens `first..middle` and `middle..end` of the text (their
/// ranks in `token_at`) are compatible: tiktoken's rule merges their bytes
/// into exactly those two. The merge runs in place in `token_at`, by ranks
/// like every other (whether the two are one token is one probe of the pair
/// table); an incompatible pair's two tokens are written back after it (a
/// compatible pair's merge left exactly them).
fn emit_compatible(
    b: &mut BlockBuilder,
    names: &Names,
    pairs: &SlotTable,
    [first, middle, end]: [Expr; 3],
) -> Expr {
    let first = b.let_(names.of("first"), first);
    let middle = b.let_(names.of("middle"), middle);
    let len = b.let_(names.of("len"), end - first.clone());
    let first_rank = b.let_(names.of("first_rank"), load(Role::TokenAt, first.clone()));
    let second_rank = b.let_(names.of("second_rank"), load(Role::TokenAt, middle.clone()));
    let joined = emit_pair_rank(
        b,
        &names.nested("joined"),
        pairs,
        [first_rank.clone(), second_rank.clone()],
    );
    let parts = emit_encode(
        b,
        &names.nested("pair"),
        pairs,
        [first.clone(), len.clone()],
        Whole::Rank(joined),
        Slab::NONE,
    );
    let compatible = b.let_(
        names.of("compatible"),
        parts.equals(2u32).and(
            part_len(load(Role::MergeParts, first.clone())).equals(middle.clone() - first.clone()),
        ),
    );
    b.if_(compatible.clone().logical_not(), |b| {
        emit_clear_tokens(b, &names.of("restore"), [first.clone(), len]);
        b.store(Role::TokenAt.name(), first, first_rank);
        b.store(Role::TokenAt.name(), middle, second_rank);
    });
    compatible
}

/// `long`: every thread strides over the long list; for each long piece it
/// checks the chunk boundaries left to right, repairs failing ones with a
/// growing window, and merges the whole piece serially when one cannot be
/// repaired.
pub fn long(geometry: &Geometry) -> Program {
    long_with(geometry, StepBuild::Standalone)
}

/// [`long`] built as `build` says.
pub fn long_with(geometry: &Geometry, build: StepBuild) -> Program {
    let workgroup_size = geometry.workgroup_size;
    let chunk = geometry.chunk_bytes;
    let window_limit = geometry.repair_window_bytes;
    let attempts = geometry.repair_attempts;
    builder(geometry, step("long"), element_type)
        .body(|b| {
            let threads = b.let_("threads", Expr::workgroup_count(Axis::X) * workgroup_size);
            let longs = b.let_("longs", param(param::LONG_COUNT));
            let pairs = SlotTable::emit_pairs(b, &Names::new("pair_table"), build);
            let entry = b.let_mut("entry", Expr::global_id(Axis::X));
            b.while_(entry.clone().less_than(longs), |b| {
                let (start, end) =
                    emit_piece(b, &Names::new("l"), load(Role::LongList, entry.clone()));
                let serial = b.let_mut("serial", false);
                let covered = b.let_mut("covered", start.clone());
                let chunk_index = b.let_mut("chunk_index", 1u32);
                let next = emit_chunk_start(
                    b,
                    "first_boundary",
                    [start.clone(), end.clone()],
                    u(1),
                    chunk,
                );
                let boundary = b.let_mut("boundary", next);
                b.while_(
                    serial
                        .clone()
                        .logical_not()
                        .and(boundary.clone().less_than(end.clone())),
                    |b| {
                        b.if_(boundary.clone().greater_equal(covered.clone()), |b| {
                            let (left, right, compatible) = emit_boundary(
                                b,
                                &Names::new("check"),
                                &pairs,
                                boundary.clone(),
                                end.clone(),
                            );
                            b.if_(compatible.logical_not(), |b| {
                                b.atomic(
                                    AtomicOp::Add,
                                    Role::Params.name(),
                                    param::FAILED_BOUNDARIES,
                                    1u32,
                                );
                                emit_repair(
                                    b,
                                    &pairs,
                                    [start.clone(), end.clone()],
                                    [left, right],
                                    window_limit,
                                    attempts,
                                );
                            });
                        });
                        b.assign("chunk_index", chunk_index.clone() + 1u32);
                        let next = emit_chunk_start(
                            b,
                            "next_boundary",
                            [start.clone(), end.clone()],
                            chunk_index.clone(),
                            chunk,
                        );
                        b.assign("boundary", next);
                    },
                );
                b.if_(serial, |b| {
                    b.atomic(
                        AtomicOp::Add,
                        Role::Params.name(),
                        param::SERIAL_PIECES,
                        1u32,
                    );
                    emit_serial(b, &pairs, start.clone(), end.clone());
                });
                b.assign("entry", entry.clone() + threads.clone());
            });
        })
        .build()
}

/// The repair of one failing boundary between the tokens `left..` and `..right`
/// of the piece `start..end`: re-encode the window `window_start..window_end`
/// (written into `token_at`), and accept it once the pairs at both its edges are
/// compatible; otherwise grow it by one token, alternately left and right, up
/// to `window_limit` bytes and `attempts` windows. Sets `covered` to the
/// accepted window's end, or `serial` when none was accepted.
fn emit_repair(
    b: &mut BlockBuilder,
    pairs: &SlotTable,
    [start, end]: [Expr; 2],
    [left, right]: [Expr; 2],
    window_limit: u32,
    attempts: u32,
) {
    let window_start = b.let_mut("span_start", left);
    let window_end = b.let_mut("span_end", right);
    let found = b.let_mut("found", false);
    let attempt = b.let_mut("attempt", 0u32);
    b.while_(
        found
            .clone()
            .logical_not()
            .and(attempt.clone().less_than(attempts)),
        |b| {
            emit_encode(
                b,
                &Names::new("window"),
                pairs,
                [
                    window_start.clone(),
                    window_end.clone() - window_start.clone(),
                ],
                Whole::LookUp {
                    skip: Expr::bool(false),
                },
                Slab::NONE,
            );
            // The edges: the token before the window with the window's first, the
            // window's last with the token after it (none at the piece's ends).
            let left_ok = b.let_mut("left_ok", true);
            let before = b.let_mut("before", window_start.clone());
            let right_ok = b.let_mut("right_ok", true);
            let after = b.let_mut("after", window_end.clone());
            let edges = [
                (
                    "left",
                    window_start.clone(),
                    window_end.clone(),
                    start.clone(),
                ),
                (
                    "right",
                    window_end.clone(),
                    end.clone(),
                    window_start.clone(),
                ),
            ];
            for (side, edge, bound, inside) in edges {
                // No edge at the piece's start or end.
                let exists = match side {
                    "left" => edge.clone().greater_than(inside),
                    _ => edge.clone().less_than(bound.clone()),
                };
                b.if_(exists, |b| {
                    let (token_before, token_after, compatible) =
                        emit_boundary(b, &Names::new(&format!("{side}_edge")), pairs, edge, bound);
                    b.assign(format!("{side}_ok"), compatible);
                    match side {
                        "left" => b.assign("before", token_before),
                        _ => b.assign("after", token_after),
                    };
                });
            }
            b.if_else(
                left_ok.clone().and(right_ok.clone()),
                |b| {
                    b.assign("found", true);
                    b.assign("covered", window_end.clone());
                },
                |b| {
                    // Grow on the side that failed, the left first; then the other.
                    let can_left = window_start
                        .clone()
                        .greater_than(start.clone())
                        .and((window_end.clone() - before.clone()).less_equal(window_limit));
                    let can_right = window_end
                        .clone()
                        .less_than(end.clone())
                        .and((after.clone() - window_start.clone()).less_equal(window_limit));
                    let grow_left = b.let_(
                        "grow_left",
                        can_left.clone().and(
                            left_ok
                                .clone()
                                .logical_not()
                                .or(can_right.clone().logical_not()),
                        ),
                    );
                    b.if_else(
                        grow_left,
                        |b| {
                            b.assign("span_start", before.clone());
                        },
                        |b| {
                            b.if_else(
                                can_right,
                                |b| {
                                    b.assign("span_end", after.clone());
                                },
                                |b| {
                                    b.assign("attempt", u(attempts));
                                },
                            );
                        },
                    );
                },
            );
            b.assign("attempt", attempt.clone() + 1u32);
        },
    );
    b.if_(found.logical_not(), |b| {
        b.assign("serial", true);
    });
}

/// `key(rank, position) = rank << 32 | position` as a `u64`: the heap's order
/// is tiktoken's (lowest rank, then leftmost).
fn heap_key(rank: Expr, position: Expr) -> Expr {
    (rank.cast(ScalarType::U64) << 32u32) | position.cast(ScalarType::U64)
}

/// Writes the heap entry `(rank, position)` at `at` (the serial path's heap: ranks
/// in `merge_parts`, positions in `merge_minima`, at the same index).
fn store_heap_entry(b: &mut BlockBuilder, at: Expr, rank: Expr, position: Expr) {
    b.store(Role::MergeParts.name(), at.clone(), rank);
    b.store(Role::MergeMinima.name(), at, position);
}

/// Pushes `(rank, position)` onto the heap of the piece at `base` (its entries
/// in `merge_parts`/`merge_minima` at `base..`), whose size is the variable `size`.
fn emit_push(
    b: &mut BlockBuilder,
    names: &Names,
    base: &Expr,
    size: &str,
    rank: Expr,
    position: Expr,
) {
    let rank = b.let_(names.of("rank"), rank);
    let position = b.let_(names.of("position"), position);
    let key = b.let_(names.of("key"), heap_key(rank.clone(), position.clone()));
    let hole_name = names.of("hole");
    let hole = b.let_mut(hole_name.clone(), Expr::var(size));
    b.assign(size, Expr::var(size) + 1u32);
    b.while_(hole.clone().greater_than(0u32), |b| {
        let parent = b.let_(names.of("parent"), (hole.clone() - 1u32) >> 1u32);
        let parent_rank = b.let_(
            names.of("parent_rank"),
            load(Role::MergeParts, base.clone() + parent.clone()),
        );
        let parent_position = b.let_(
            names.of("parent_position"),
            load(Role::MergeMinima, base.clone() + parent.clone()),
        );
        b.if_(
            heap_key(parent_rank.clone(), parent_position.clone()).less_equal(key.clone()),
            |b| {
                b.break_();
            },
        );
        store_heap_entry(b, base.clone() + hole.clone(), parent_rank, parent_position);
        b.assign(hole_name.clone(), parent);
    });
    store_heap_entry(b, base.clone() + hole, rank, position);
}

/// Pushes the pair of the part at text position `at` (the token `first`,
/// `first_len` bytes) and the part after it (its rank in `token_at`), if there
/// is one before `end`, onto the heap of the piece at `base` when their bytes
/// are a token (one probe of the pair table by their ranks).
fn emit_push_pair(
    b: &mut BlockBuilder,
    names: &Names,
    (pairs, base, end): (&SlotTable, &Expr, &Expr),
    [at, first, first_len]: [Expr; 3],
) {
    let at = b.let_(names.of("at"), at);
    let next = b.let_(names.of("next"), at.clone() + first_len);
    b.if_(next.clone().less_than(end.clone()), |b| {
        let rank = emit_pair_rank(
            b,
            &names.nested("pair"),
            pairs,
            [first, load(Role::TokenAt, next)],
        );
        b.if_(rank.clone().not_equals(NO_TOKEN), |b| {
            emit_push(
                b,
                &names.nested("push"),
                base,
                "heap_size",
                rank.clone(),
                at - base.clone(),
            );
        });
    });
}

/// The serial path: the piece `start..end` merged from its bytes in tiktoken's
/// exact order, the candidate pairs in a binary min-heap of `(rank, position)`
/// kept in the piece's own scratch range (see the module docs).
fn emit_serial(b: &mut BlockBuilder, pairs: &SlotTable, start: Expr, end: Expr) {
    let start = b.let_("serial_start", start);
    let end = b.let_("serial_end", end);
    let len = b.let_("serial_len", end.clone() - start.clone());
    let byte = |at: Expr| load(Role::Text, at);
    b.loop_("serial_init", 0u32, len.clone(), |b, at| {
        b.store(
            Role::TokenAt.name(),
            start.clone() + at.clone(),
            vocab(byte(start.clone() + at) + BYTE_RANKS_AT),
        );
    });
    let size = b.let_mut("heap_size", 0u32);
    b.loop_("serial_pairs", 0u32, len.clone() - 1u32, |b, at| {
        let rank = b.let_(
            "initial_rank",
            vocab(
                ((byte(start.clone() + at.clone()) << 8u32)
                    | byte(start.clone() + at.clone() + 1u32))
                    + PAIR_RANKS_AT,
            ),
        );
        b.if_(rank.clone().not_equals(NO_TOKEN), |b| {
            emit_push(
                b,
                &Names::new("initial_push"),
                &start,
                "heap_size",
                rank.clone(),
                at.clone(),
            );
        });
    });
    b.while_(size.clone().greater_than(0u32), |b| {
        // Pop the top.
        let rank = b.let_("top_rank", load(Role::MergeParts, start.clone()));
        let position = b.let_("top_position", load(Role::MergeMinima, start.clone()));
        b.assign("heap_size", size.clone() - 1u32);
        let last_rank = b.let_(
            "last_rank",
            load(Role::MergeParts, start.clone() + size.clone()),
        );
        let last_position = b.let_(
            "last_position",
            load(Role::MergeMinima, start.clone() + size.clone()),
        );
        let last_key = b.let_(
            "last_key",
            heap_key(last_rank.clone(), last_position.clone()),
        );
        let hole = b.let_mut("sift", 0u32);
        b.while_(Expr::bool(true), |b| {
            let child = b.let_mut("child", hole.clone() * 2u32 + 1u32);
            b.if_(child.clone().greater_equal(size.clone()), |b| {
                b.break_();
            });
            let key_at = |index: Expr| {
                heap_key(
                    load(Role::MergeParts, start.clone() + index.clone()),
                    load(Role::MergeMinima, start.clone() + index),
                )
            };
            b.if_(
                (child.clone() + 1u32)
                    .less_than(size.clone())
                    .and(key_at(child.clone() + 1u32).less_than(key_at(child.clone()))),
                |b| {
                    b.assign("child", child.clone() + 1u32);
                },
            );
            b.if_(last_key.clone().less_equal(key_at(child.clone())), |b| {
                b.break_();
            });
            store_heap_entry(
                b,
                start.clone() + hole.clone(),
                load(Role::MergeParts, start.clone() + child.clone()),
                load(Role::MergeMinima, start.clone() + child.clone()),
            );
            b.assign("sift", child.clone());
        });
        store_heap_entry(b, start.clone() + hole, last_rank, last_position);
        // Is the popped pair still the pair at its position?
        let at = b.let_("at", start.clone() + position.clone());
        let first_rank = b.let_("first_rank", load(Role::TokenAt, at.clone()));
        b.if_(first_rank.clone().not_equals(NO_TOKEN), |b| {
            let first_len = b.let_("first_len", token_len(first_rank.clone()));
            let second = b.let_("second", at.clone() + first_len.clone());
            b.if_(second.clone().less_than(end.clone()), |b| {
                let second_rank = b.let_("second_rank", load(Role::TokenAt, second.clone()));
                let merged_len = b.let_(
                    "merged_len",
                    first_len.clone() + token_len(second_rank.clone()),
                );
                let current = emit_pair_rank(
                    b,
                    &Names::new("current"),
                    pairs,
                    [first_rank.clone(), second_rank],
                );
                b.if_(current.equals(rank.clone()), |b| {
                    b.store(Role::TokenAt.name(), at.clone(), rank.clone());
                    b.store(Role::TokenAt.name(), second.clone(), NO_TOKEN);
                    b.if_else(
                        (size.clone() + 2u32).greater_than(len.clone()),
                        |b| {
                            // Full: rebuild the heap from the pairs that exist now
                            // (at most one per part, so fewer than `len`).
                            b.assign("heap_size", 0u32);
                            let part = b.let_mut("rebuild_part", start.clone());
                            b.while_(part.clone().less_than(end.clone()), |b| {
                                let part_rank =
                                    b.let_("rebuild_part_rank", load(Role::TokenAt, part.clone()));
                                let part_len =
                                    b.let_("rebuild_part_len", token_len(part_rank.clone()));
                                emit_push_pair(
                                    b,
                                    &Names::new("rebuild"),
                                    (pairs, &start, &end),
                                    [part.clone(), part_rank, part_len.clone()],
                                );
                                b.assign("rebuild_part", part.clone() + part_len);
                            });
                        },
                        |b| {
                            emit_push_pair(
                                b,
                                &Names::new("serial_right"),
                                (pairs, &start, &end),
                                [at.clone(), rank.clone(), merged_len.clone()],
                            );
                            b.if_(at.clone().greater_than(start.clone()), |b| {
                                let previous = emit_token_before(b, "serial_previous", at.clone());
                                emit_push_pair(
                                    b,
                                    &Names::new("serial_left"),
                                    (pairs, &start, &end),
                                    [
                                        previous.clone(),
                                        load(Role::TokenAt, previous.clone()),
                                        at.clone() - previous,
                                    ],
                                );
                            });
                        },
                    );
                });
            });
        });
    });
}

/// Where document `document` starts (`d` starts where `d − 1` ends; document
/// 0 at 0). A select evaluates both sides, so document 0's load is of
/// element 0, never of element −1.
fn document_start(document: Expr) -> Expr {
    document
        .clone()
        .equals(0u32)
        .select(0u32, load(Role::DocumentEnds, document.max(1u32) - 1u32))
}

/// The first document of `from..documents` whose start is at least `at`
/// (`documents` when none is; every document before `from` must start before
/// `at`): a binary search over the document ends.
fn emit_first_document_from(
    b: &mut BlockBuilder,
    names: &Names,
    [from, documents]: [Expr; 2],
    at: Expr,
) -> Expr {
    let at = b.let_(names.of("at"), at);
    let low_name = names.of("low");
    let high_name = names.of("high");
    let low = b.let_mut(low_name.clone(), from);
    let high = b.let_mut(high_name.clone(), documents);
    b.while_(low.clone().less_than(high.clone()), |b| {
        let middle = b.let_(names.of("middle"), (low.clone() + high.clone()) >> 1u32);
        let middle_start = b.let_(names.of("middle_start"), document_start(middle.clone()));
        b.if_else(
            middle_start.less_than(at.clone()),
            |b| {
                b.assign(low_name.clone(), middle.clone() + 1u32);
            },
            |b| {
                b.assign(high_name.clone(), middle.clone());
            },
        );
    });
    low
}

/// This workgroup's tokens in `compact`, summed over the workgroup: every
/// thread counts its bytes of every owned block (`per` blocks from block
/// `first`), `COUNTED_TOGETHER` blocks a round so that their loads are in
/// flight at once.
fn emit_owned_token_count(
    b: &mut BlockBuilder,
    [first, per, text_len, local]: [&Expr; 4],
    block_bytes: u32,
) -> Expr {
    let part = b.let_mut("part", 0u32);
    let rounds = (per.clone() + (COUNTED_TOGETHER - 1)) / COUNTED_TOGETHER;
    b.loop_("counted", 0u32, rounds, |b, round| {
        let mut count = part.clone();
        for together in 0..COUNTED_TOGETHER {
            let owned = round.clone() * COUNTED_TOGETHER + together;
            let inside = b.let_(
                format!("counted_inside{together}"),
                owned.clone().less_than(per.clone()),
            );
            // A block past the ones owned reads the first owned block's
            // bytes again (counted as nothing): lines this thread just
            // asked for, not another workgroup's (for texts of up to
            // 1 MiB a workgroup owns one block, and three of every four
            // loads were another's).
            let own = b.let_(
                format!("counted_own{together}"),
                (first.clone() + inside.clone().select(owned, 0u32)) * block_bytes
                    + local.clone() * BYTES_PER_THREAD,
            );
            for k in 0..BYTES_PER_THREAD {
                let at = own.clone() + k;
                count = count
                    + inside
                        .clone()
                        .and(at.clone().less_than(text_len.clone()))
                        .and(load_inside(Role::TokenAt, at, text_len).not_equals(NO_TOKEN))
                        .cast(ScalarType::U32);
            }
        }
        b.assign("part", count);
    });
    b.workgroup_reduce("owned_counted", ReduceOp::Sum, part)
}

/// `compact`: the workgroup holding ticket `h` (workgroups take tickets in
/// the order they start) owns `per` consecutive blocks. It counts their tokens,
/// gets the tokens of every block before its first from the workgroups before
/// it by a decoupled look-back over the split's status words (the split has
/// left them zero, and `compact` leaves them zero; a lone workgroup, the short
/// texts', has none before it and counts nothing), then, block by block, every
/// thread takes 4 consecutive bytes, an exclusive workgroup scan gives each its
/// place in the block's ids, gathered in workgroup memory, which the workgroup
/// then writes to `ids` in text order, consecutive threads on consecutive
/// words; and each document starting in the block gets the index of its first
/// id (a document starting at the text's end, the total). The workgroup owning
/// the last block writes the total after the documents.
///
/// Why one step and not two: a `count` step of one workgroup per block wrote
/// every block's token count, and `compact`'s workgroups each summed the counts
/// before their first block (up to `B / W` dependent loads a thread). On the
/// H200 (2026-12-04, the 64 MiB cl100k batch's 8 MiB chunks) `count` took
/// 23–80 µs and `compact` 30–89 µs a chunk. Here the counting pass reads the
/// `token_at` words the compaction reads again just after (recently loaded),
/// and a launch and a workgroup per block go: measured alternating with the
/// two steps in the same calls, 8 MiB of each shape eager took 40–45 µs
/// against 47–51 for `count` and `compact`, and the batch's chunks (four
/// sharing the device) 46–72 µs against 54–150 (means 56–58 against 95–98).
/// The counting pass loads four blocks at once (one block a round: 41–45 µs).
///
/// `ids` is host-mapped memory on CUDA, so every store crosses PCIe: each
/// thread storing its own few ids made 4-byte writes scattered over the warp,
/// and `compact` took 14.0 ms of a 16 MiB chunk's 18.2 ms of kernels on the H200
/// (2026-12-01); a warp's 32 consecutive words go out as whole lines.
///
/// Whole lines also in place: a block's ids start at `running`, the ids of
/// the blocks before, which is rarely a multiple of [`IDS_PER_LINE`], so a
/// warp storing `ids[running + local + k · W]` covered the ends of two 128-byte
/// lines, two partial PCIe writes instead of one whole one. The copy counts its
/// offsets from the line `running` falls in instead (`lead = running mod 32`
/// words before it, which it skips): warp `w`'s store `k` is the line at
/// `running − lead + 32w + k · W`, whole but for the block's first and last.
/// That is one more store per thread at most (`lead + block_tokens ≤ 4 · W +
/// 31`). On the H200 (2026-12-02, four 16 MiB cl100k chunks) `compact` took
/// 0.87–1.21 ms per chunk for about 34 MB of ids, against ≥ 0.65 ms at the
/// ~52 GB/s a kernel writes host-mapped memory at.
pub fn compact(geometry: &Geometry) -> Program {
    compact_with(geometry, StepBuild::Standalone)
}

/// Stores 0 into the split's second set of status words, the words of
/// `split_blocks` blocks ([`SplitBuild`]), every thread of the step's `groups`
/// workgroups a word a round.
fn emit_clear_second_set(
    b: &mut BlockBuilder,
    split_blocks: Expr,
    groups: &Expr,
    workgroup_size: u32,
) {
    let base = b.let_("second_set", lookback::second_set());
    let words = b.let_("second_set_words", split_blocks * STATUS_WORDS_PER_BLOCK);
    let threads = b.let_("clearing_threads", groups.clone() * workgroup_size);
    let rounds = (words.clone() + threads.clone() - 1u32) / threads.clone();
    b.loop_("clear_second_set", 0u32, rounds, |b, round| {
        let at = b.let_(
            "second_set_at",
            round * threads.clone() + Expr::global_id(Axis::X),
        );
        b.if_(at.clone().less_than(words.clone()), |b| {
            b.store("statuses", base.clone() + at, Expr::u64(0));
        });
    });
}

/// [`compact`] for `build`: in a fused kernel ([`StepBuild::Fused`]) a group's
/// place is its index, not a ticket, and the step first clears the split's
/// second set of status words, which the split's steps leave to it there
/// ([`SplitBuild`]).
pub fn compact_with(geometry: &Geometry, build: StepBuild) -> Program {
    let workgroup_size = geometry.workgroup_size;
    let block_bytes = geometry.block_bytes();
    builder(geometry, step("compact"), element_type)
        .buffer(
            "thread_base",
            step("compact").bindings.len() as u32,
            Access::Workgroup,
            ElemType::U32,
            BufferCount::Static(workgroup_size + 1),
        )
        .buffer(
            "block_ids",
            step("compact").bindings.len() as u32 + 1,
            Access::Workgroup,
            ElemType::U32,
            BufferCount::Static(block_bytes),
        )
        .body(|b| {
            let local = b.let_("local", Expr::local_id(Axis::X));
            // Reduced, so the block loop's bounds are workgroup-uniform.
            let text_len = b.workgroup_reduce("text_len", ReduceOp::Max, param(param::TEXT_LEN));
            let documents = b.workgroup_reduce("documents", ReduceOp::Max, param(param::DOCUMENTS));
            let blocks = b.let_(
                "blocks",
                (text_len.clone() + (block_bytes - 1)) / block_bytes,
            );
            let groups = b.let_("groups", Expr::workgroup_count(Axis::X));
            let per = b.let_(
                "per",
                (blocks.clone() + (groups.clone() - 1u32)) / groups.clone(),
            );
            // The position in the text comes from the ticket, never from the
            // hardware's workgroup index: a workgroup then waits in the
            // look-back only for workgroups that are already running (in a
            // fused kernel the index is that order).
            let group = match build {
                StepBuild::Standalone => lookback::position(b, SplitBuild::Dispatched),
                StepBuild::Fused => {
                    let split_blocks = (text_len.clone() + (geometry.split.block_bytes() - 1))
                        / geometry.split.block_bytes();
                    emit_clear_second_set(b, split_blocks, &groups, workgroup_size);
                    lookback::position(b, SplitBuild::Fused)
                }
            };
            let first = b.let_("first", group.clone() * per.clone());
            // This workgroup's token count only feeds the look-back, which a
            // lone workgroup (every short text's) leaves out: no count and no
            // reduction for it there.
            let owned_tokens = lookback::published(b, "owned_tokens", 0u32, |b| {
                emit_owned_token_count(b, [&first, &per, &text_len, &local], block_bytes)
            });
            let look_back = LookBack {
                prefix: "tokens",
                workgroup_size,
                region: u(0),
                block: group,
                blocks: groups.clone(),
                direction: Direction::Backward,
                channels: &[(Combine::Sum, owned_tokens.clone())],
            };
            let carried = look_back.carries(b).remove(0);
            let before = b.let_("before", carried);
            look_back.publish_inclusive(b, &[before.clone() + owned_tokens]);
            // No status word is read after this: the last workgroup to get
            // here clears them (and the ticket) for the next dispatch.
            lookback::finish(b, workgroup_size, 1);
            let running = b.let_mut("running", before);
            // The first document starting in or after the first block; each
            // block then starts from where the one before ended its search.
            let cursor = emit_first_document_from(
                b,
                &Names::new("first_document"),
                [u(0), documents.clone()],
                first.clone() * block_bytes,
            );
            let cursor = b.let_mut("document_cursor", cursor);
            b.loop_("owned", 0u32, per.clone(), |b, owned| {
                let block = b.let_("block", first.clone() + owned);
                b.if_(block.clone().less_than(blocks.clone()), |b| {
                    let block_start = b.let_("block_start", block.clone() * block_bytes);
                    let own = b.let_(
                        "own",
                        block_start.clone() + local.clone() * BYTES_PER_THREAD,
                    );
                    let mut tokens = Vec::new();
                    let mut count = u(0);
                    for k in 0..BYTES_PER_THREAD {
                        let at = own.clone() + k;
                        let token = b.let_(
                            format!("token{k}"),
                            at.clone()
                                .less_than(text_len.clone())
                                .select(load_inside(Role::TokenAt, at, &text_len), NO_TOKEN),
                        );
                        count = count + token.clone().not_equals(NO_TOKEN).cast(ScalarType::U32);
                        tokens.push(token);
                    }
                    let count = b.let_("thread_tokens", count);
                    let base = b.workgroup_scan(
                        "thread_offset",
                        ReduceOp::Sum,
                        ScanKind::Exclusive,
                        count.clone(),
                    );
                    b.store("thread_base", local.clone(), base.clone());
                    // The block's total after every thread's base.
                    b.if_(local.clone().equals(workgroup_size - 1), |b| {
                        b.store("thread_base", workgroup_size, base.clone() + count);
                    });
                    let slot = b.let_mut("slot", base);
                    for token in tokens {
                        b.if_(token.clone().not_equals(NO_TOKEN), |b| {
                            b.store("block_ids", slot.clone(), token.clone());
                            b.assign("slot", slot.clone() + 1u32);
                        });
                    }
                    b.barrier();
                    let block_tokens =
                        b.let_("block_tokens", Expr::load("thread_base", workgroup_size));
                    // Whole lines: offsets from the line `running` falls in, so
                    // every warp's 32 threads store one aligned line (the ids
                    // before `running` in it are the blocks' before, left alone).
                    let lead = b.let_("lead", running.clone() & (IDS_PER_LINE - 1));
                    let line_start = b.let_("line_start", running.clone() - lead.clone());
                    let lead_end = b.let_("lead_end", lead.clone() + block_tokens.clone());
                    // `lead + block_tokens < 4 · W + 32`: one more pass at most.
                    for k in 0..=BYTES_PER_THREAD {
                        let at = b.let_(format!("copy{k}"), local.clone() + k * workgroup_size);
                        b.if_(
                            at.clone()
                                .greater_equal(lead.clone())
                                .and(at.clone().less_than(lead_end.clone())),
                            |b| {
                                b.store(
                                    Role::Ids.name(),
                                    line_start.clone() + at.clone(),
                                    Expr::load("block_ids", at.clone() - lead.clone()),
                                );
                            },
                        );
                    }
                    // The documents that start in this block (the last block: also
                    // those starting at the text's end).
                    // `document_cursor` is the first document starting at or after
                    // the block's start; one load says whether any starts in the
                    // block (most blocks: none), and only then a search finds the
                    // first after it. Two binary searches a block, about ten
                    // dependent loads each for a chunk of a thousand documents, had
                    // `compact` of the batch's 8 MiB chunks at 56–110 µs (27 for one
                    // document); with the cursor 52–91 against 56–110 (means 70 and
                    // 90; H200, 2026-12-04, chunks 1–4 of two quick bench runs each,
                    // alternating).
                    let last = b.let_("last", (block.clone() + 1u32).equals(blocks.clone()));
                    let low = b.let_("low", cursor.clone());
                    let block_end = b.let_("block_end", block_start.clone() + block_bytes);
                    b.if_(
                        low.clone()
                            .less_than(documents.clone())
                            .and(document_start(low.clone()).less_than(block_end.clone())),
                        |b| {
                            let after = emit_first_document_from(
                                b,
                                &Names::new("after"),
                                [low.clone() + 1u32, documents.clone()],
                                block_end.clone(),
                            );
                            b.assign("document_cursor", after);
                        },
                    );
                    let high = b.let_("high", last.select(documents.clone(), cursor.clone()));
                    let document = b.let_mut("document", low + local.clone());
                    b.while_(document.clone().less_than(high), |b| {
                        let offset = b.let_(
                            "document_offset",
                            document_start(document.clone()) - block_start.clone(),
                        );
                        let owner = b.let_(
                            "owner",
                            (offset.clone() / BYTES_PER_THREAD).min(workgroup_size - 1),
                        );
                        let owner_start = b.let_(
                            "owner_start",
                            block_start.clone() + owner.clone() * BYTES_PER_THREAD,
                        );
                        let mut rank = Expr::load("thread_base", owner.clone());
                        for k in 0..BYTES_PER_THREAD {
                            let at = owner_start.clone() + k;
                            rank = rank
                                + (at.clone() - block_start.clone())
                                    .less_than(offset.clone())
                                    .and(at.clone().less_than(text_len.clone()))
                                    .and(
                                        load_inside(Role::TokenAt, at, &text_len)
                                            .not_equals(NO_TOKEN),
                                    )
                                    .cast(ScalarType::U32);
                        }
                        b.store(
                            Role::DocumentTokenStarts.name(),
                            document.clone(),
                            running.clone() + rank,
                        );
                        b.assign("document", document.clone() + workgroup_size);
                    });
                    b.assign("running", running.clone() + block_tokens);
                    // Every thread has read `thread_base` and `block_ids` before
                    // the next block.
                    b.barrier();
                });
            });
            let owns_last = first
                .clone()
                .less_than(blocks.clone())
                .and((first + per).greater_equal(blocks));
            b.if_(owns_last.and(local.equals(0u32)), |b| {
                b.store(Role::DocumentTokenStarts.name(), documents, running);
            });
        })
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;
    use vyre_cuda::backend::{AnyBackend, Binding, Dispatch};
    use vyre_cuda::DispatchConfig;

    /// Which workgroup takes each entry of a list as `first_entry` deals it
    /// out, on a grid of `groups` workgroups of 64 threads (two warps), on the
    /// reference interpreter: `None` for an entry no thread took.
    fn owners(first_entry: Expr, groups: u32) -> Vec<Option<u32>> {
        let threads = 64 * groups;
        let program = Program::builder([64, 1, 1])
            .buffer(
                "owner",
                0,
                Access::ReadWrite,
                ElemType::U32,
                BufferCount::Runtime,
            )
            .body(|b| {
                let entry = b.let_("entry", first_entry);
                b.store("owner", entry, Expr::workgroup_id(Axis::X));
            })
            .build();
        let backend = AnyBackend::reference();
        let kernel = backend
            .compile(&program, &DispatchConfig::linear(threads))
            .unwrap();
        let owner = backend
            .buffer_from(&vec![u32::MAX; threads as usize])
            .unwrap();
        backend
            .run(Dispatch::new(&kernel, &[Binding::from(&owner)]).workgroups([groups, 1, 1]))
            .unwrap();
        let owners = backend.read::<u32>(&owner).unwrap();
        owners
            .into_iter()
            .map(|owner| (owner != u32::MAX).then_some(owner))
            .collect()
    }

    /// Which workgroup takes each warp's worth of `merge`'s lists as `build`
    /// deals them out on three workgroups of two warps, each entry taken once.
    fn warp_owners(build: StepBuild) -> Vec<u32> {
        let owners = owners(first_list_entry(build), 3);
        assert!(
            owners.iter().all(Option::is_some),
            "{build:?}: an entry no thread took: {owners:?}"
        );
        owners
            .chunks(WARP_LANES as usize)
            .map(|warp| {
                assert!(
                    warp.iter().all(|&owner| owner == warp[0]),
                    "{build:?}: a warp split: {warp:?}"
                );
                warp[0].unwrap()
            })
            .collect()
    }

    /// Locks out a fused `merge` that takes its lists thread by thread, so a
    /// short merge list (256 KiB of code: 2,829 entries for 128 groups) runs
    /// on its first few workgroups while the others wait at the grid sync:
    /// dealt out by warps, entries 0–31 go to workgroup 0, 32–63 to
    /// workgroup 1, 64–95 to workgroup 2, and only then 96–127 to workgroup
    /// 0's second warp, and every entry below the grid's threads has its
    /// thread; on its own the step keeps the thread-by-thread order (each
    /// workgroup's two warps first). Negative controls (run): with the fused
    /// build taking `global_id` this test fails (`[0, 0, 1, 1, 2, 2]`), and
    /// with `global_id + 1` entry 0 has no thread and it fails.
    #[test]
    fn a_fused_merge_deals_its_lists_out_a_warp_per_workgroup() {
        assert_eq!(warp_owners(StepBuild::Fused), [0, 1, 2, 0, 1, 2]);
        assert_eq!(warp_owners(StepBuild::Standalone), [0, 0, 1, 1, 2, 2]);
    }
}
