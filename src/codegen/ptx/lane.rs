//! The lane module: a resident server kernel and the bodies of a set of programs in
//! one PTX module, so a host can run dispatches through host-mapped memory instead of
//! a launch each.
//!
//! # Why it exists
//!
//! Every launch path sits near launch + synchronize, which on the H200 is 3.7–3.9 µs
//! of `cuLaunchKernel` plus about 5.5 µs of `cuStreamSynchronize` (8.5–10.2 µs in all,
//! measured 2026-12-01). A persistent one-block kernel polling a host-mapped doorbell
//! with `ld.acquire.sys`, doing a small store per thread and answering through a
//! host-mapped word, round-tripped in 3.14 µs the same day (p99 3.14, p99.9 11.2)
//! against 10.20 µs for launch + synchronize of the same work. The floor of a launch
//! belongs to the launch path, not to the hardware; a lane removes the launch.
//!
//! # Module layout
//!
//! One header and opaque zero (as every module), then:
//!
//! - `.shared .align 16 .b8 vyre_lane_record[4096]` ([`LANE_RECORD_SYMBOL`]) and
//!   `.shared .align 16 .b8 vyre_lane_earlier_record[4096]`: two copies of a record
//!   ([`RECORD_BYTES`], layout below) in each block's shared memory, one the current
//!   request's, the other the record before the previous distinct one. Every thread
//!   holds which is which as two addresses (the first starts as the current one),
//!   passes the current one to the body it calls ([`LANE_RECORD_PARAMETER`]), and
//!   exchanges the two when the roles change, so no record is copied between them.
//!   Two requests that alternate (a chain of two steps, as a short encode is) would
//!   otherwise read their record from the slot's cache in device memory every time:
//!   on the H200 (2026-12-02) each request of such a chain spent 2.46 µs in the
//!   server against 1.50 µs for a request whose record was the previous one. A first
//!   build kept the roles fixed and exchanged the copies' contents, so every request
//!   of a chain copied its record twice through one thread's registers (0.64 µs of
//!   record and prologue against 0.26 µs for a repeated request, H200, 2026-12-03);
//! - `.shared .align 8 .b8 vyre_lane_state[16]`: the block's view of the current
//!   request (the doorbell value its leader saw, whether it publishes);
//! - `.shared .align 8 .b8 vyre_lane_watch[24]` (only in a lane with doorbell
//!   pollers, "Doorbell pollers" below): the ticket block 0's leader waits for and the
//!   doorbell value a poller saw for it;
//! - `.shared .align 16 .b8 vyre_lane_workgroup[N]` ([`LANE_WORKGROUP_SYMBOL`], only
//!   when a body has workgroup buffers): one pool for every body's workgroup buffers,
//!   as large as the largest body's (each body lays its buffers out from the pool's
//!   start and zeroes them at entry, as a launch's kernel does);
//! - body `k` ([`lane_body_name`]): a `.func vyre_lane_body_k` taking the workgroup id
//!   ([`LANE_GROUP_PARAMETERS`]) and the record's address, reading its buffer
//!   addresses, element counts, scalar parameters' values ([`record_scalar_at`]) and
//!   the grid from the record, otherwise
//!   exactly the program's kernel (its `return`s return to the server);
//! - the server, `.visible .entry vyre_lane` ([`LANE_ENTRY_NAME`]) with
//!   `.reqntid` of the lane's one workgroup shape: every body of a lane has that
//!   shape, so local ids, barriers and subgroup operations mean what they mean in a
//!   launch. With doorbell pollers the block is one-dimensional: the workgroup's
//!   warps (threads past the workgroup in its last warp leave at once) and then the
//!   pollers' warps ([`lane_block_shape`]); every barrier of the server (barrier 1)
//!   and of the bodies (barrier 0) then names the workgroup's warps' threads, and a
//!   body's global id takes the workgroup's size, not `%ntid`.
//!
//! # The server's parameters
//!
//! `vyre_lane_completion` (u64 host-mapped word: the last ticket served),
//! `vyre_lane_doorbells` (copy `k` of slot `s`'s u64 doorbell at `(c s + k) * 128`,
//! `c` copies a slot: [`lane_doorbell_copies`]), `vyre_lane_records`
//! (slot `s`'s record at `s * 4096`), `vyre_lane_areas` (slot `s`'s result area at
//! `s * area stride`), `vyre_lane_staging` (slot `s`'s input staging at `s * staging
//! stride`) — all host-mapped, in the first of the lane's memory candidates — then
//! `vyre_lane_candidate_1` to `_3` (each further candidate's address minus the first's;
//! the layouts are the same), `vyre_lane_device` (device memory, [`DEVICE_ARRIVALS`]
//! and the words after it, [`lane_device_bytes`]), then the u32s
//! `vyre_lane_slots`, `vyre_lane_area_stride`, `vyre_lane_staging_stride`,
//! `vyre_lane_poll_sleep` (nanoseconds between polls; 0 spins) and
//! `vyre_lane_candidates` (1 to [`MAX_LANE_CANDIDATES`]).
//!
//! # Placement
//!
//! With more than one candidate, before anything else block 0's thread 0 times loads
//! of each candidate's completion line, doorbell copies and first result-area line of
//! every slot (the least of [`PLACEMENT_SAMPLES`] each, summed), keeps the least
//! total, and stores its index plus one into the device word [`DEVICE_PLACEMENT`]
//! (`st.release.gpu`, which the other blocks' leaders acquire) and into the first
//! candidate's [`HOST_PLACEMENT`] word (`st.relaxed.sys`; the host waits for it
//! before it rings anything); each block's threads learn it through shared memory
//! after a barrier of the whole block, pollers included, and move their five
//! host-mapped addresses by its distance. Nothing of a request has happened yet, so
//! the choice needs no ordering beyond its own word. `backend::lane`'s docs give the
//! measurement that makes the choice worth its 0.1 ms per candidate.
//!
//! # The protocol
//!
//! Requests are numbered from 0 (ticket `n`); request `n` uses slot `n % slots`. The
//! host writes the slot's record (when it changed) and the input bytes of host
//! bindings into the slot's staging, then stores the slot's doorbell with release
//! semantics: bits 0–31 `n + 1`, bits 32–47 the record's length in 16-byte chunks,
//! [`DOORBELL_RELOAD`] (the record differs from the one this slot held: read it from
//! host memory), [`DOORBELL_SAME`] (it equals the previous request's: the blocks'
//! shared copies are current), [`DOORBELL_EARLIER`] (it equals the record before the
//! previous distinct one, which every block keeps in a second shared copy: the two
//! copies change roles, and no record byte is read or copied) and
//! [`DOORBELL_STOP`] (leave), into every copy of the slot's doorbell. Block 0's thread 0
//! polls the doorbell with `ld.acquire.sys` (or, with doorbell pollers, waits for one
//! of them to see it: below); block 0 reads the record into the shared copy that held
//! the earlier record, which the one it held becomes (and into the device-memory cache of the slot when
//! reloading; 16-byte chunks, all of a thread's share in flight up to sixteen), then,
//! with more than one block, waits until the previous request is published
//! ([`DEVICE_PUBLISHED`], `ld.acquire.gpu`; "Requests of one lane" below) and hands the
//! doorbell value to the others through the go word (`st.release.gpu`, polled with
//! `ld.acquire.gpu`; a stop goes the same way, after the same wait, with no record).
//! The scalar values are words of the record: a request that differs from the previous
//! one only in its values has another record (so neither "same" nor the slot's cache
//! serves it stale), and a new value is new record bytes, never new PTX. Every block
//! then
//!
//! 1. runs the prologue: zero fills (`WriteOnly` bindings and zeroed transients:
//!    "starts zeroed", as a launch's clears) and copies of host inputs from the
//!    slot's staging into transient device buffers, spread over every thread of the
//!    lane, then waits for the whole lane (when there was any);
//! 2. runs its workgroups, `block, block + blocks, ...` below the request's total,
//!    each a call of the requested body with that workgroup's id (its number itself
//!    on a grid along x alone; two divisions otherwise), a block-wide
//!    barrier (`barrier.sync 1`; bodies use barrier 0, non-aligned) after each, for each of the
//!    request's fixpoint iterations with a lane-wide barrier between iterations;
//! 3. arrives at the device arrival counter (more than one block): the last block to
//!    arrive publishes. The arrival is an `atom.inc` that wraps at the last arrival's
//!    count, so the last arrival resets the counter in the same atomic operation, with
//!    no second write to order (before block 0 waited for each request's publication, a
//!    store of 0 could erase the arrival of a block already serving the next request,
//!    and a separate take-back was a store in flight that nothing ordered before the
//!    header words). The publishing block writes the readback ranges into the slot's
//!    result area as flagged words ([`FLAGGED_WORD_BYTES`]: 4 data bytes and the flag
//!    [`area_flag`] of the request in each 8-byte word; windows — a range inside one
//!    aligned 16-byte block — with one vector load and two
//!    `st.relaxed.sys.global.v2.u64` each, all of a thread's windows in flight up to
//!    sixteen; other ranges in 16-byte units or word by word, eight in flight per
//!    thread), the leader writes the area's header as twelve flagged words (status,
//!    ticket and the phase stamps below), runs `fence.acq_rel.gpu` (the publish fence)
//!    and then stores `n + 1` into the completion word with `st.relaxed.sys`, and (more
//!    than one block) into the published word with `st.release.gpu`. Nothing waits for
//!    host memory: the host knows a word arrived when its flag is the request's, in any
//!    order, and delivers once every word of the header and the readbacks did. The
//!    completion word says what delivery does not: that the request's outputs in device
//!    memory are visible to later device work (below), so the host's waits that order
//!    an eager dispatch, a blocking copy or clear, a graph replay or another lane's
//!    request after this one wait for it, and so does the host's release of the
//!    request's memory; it also answers the fault report's "which request was being
//!    served".
//!
//! # Doorbell pollers
//!
//! A poll is a load from host memory: one PCIe round trip, about 1 µs. With one
//! polling thread, a ring waits on average half a round trip for the next load to
//! reach host memory, then half a round trip for the answer. A lane may hold poller
//! warps beside its workgroup (`LaneOptions::poller_warps` on the host; only for a
//! one-dimensional workgroup with room in a block of 1,024 threads:
//! [`lane_poller_warps`]). The first thread of each polls block 0's doorbell, on a copy
//! of its own (one line each: the host stores every copy), and poller `p` of `P` starts
//! each ticket's polling `p / P` of a round trip (timed at the kernel's start) after the
//! leader asked for it, so their loads reach host memory spread over a round trip. The
//! leader writes the ticket it waits for into the pollers' word and spins on the answer
//! word of the ticket's parity in shared memory; the poller that sees the ticket stores
//! the doorbell's value there with a release after its `ld.acquire.sys`, and the
//! leader's acquire of it orders everything after it behind what the host released
//! with the doorbell. Every access to the pollers' words once they start clear is an
//! atomic of the block's scope (a read is an `or` of 0): plain loads and stores with
//! the same orderings are as correct under the memory model, but compute-sanitizer's
//! racecheck reports each pair of them as a shared-memory hazard (856 reports in the
//! lane tests, H200, 2026-12-02), and atomics it does not. Two answer words, by
//! parity, so that a poller's late answer for the previous ticket cannot overwrite the
//! answer for the current one. Between tickets the pollers `nanosleep` on the leader's
//! word (no loads of host memory, no issue slots taken, while a request runs), and they
//! leave on a stop.
//!
//! Measured (2026-12-02, the dispatch bench, one process, minima of rotated rounds):
//! on an H200, pollers that all loaded the same doorbell line made a request no faster
//! than one polling thread (4.36–5.21 µs against 4.21–4.42 µs), as if loads of one
//! line in flight are served as one; with a copy per poller, on an H100 in two runs, a
//! lane of four pollers served the three bench shapes in 4.13–5.28 µs against
//! 4.36–5.51 µs for the same lane with none (0.350–0.465 × launch + sync against
//! 0.436–0.503 ×). One or two pollers were no better than none, most likely because
//! the hand-over through shared memory costs about what two loads in flight save.
//!
//!
//! The header carries `%globaltimer` stamps of each phase, so one run on the device
//! says where a request's time goes (the host's `Timings::lane_stamps`): the start
//! (block 0 saw the doorbell), the first workgroup (record and prologue done), every
//! workgroup done (with several blocks: the last arrived) and the end (the readback
//! words issued). With more than one block and a request queued behind another, the
//! setup (start to first workgroup) includes block 0's wait for the previous request's
//! publication. Until the flagged words, a `st.release.sys` of the completion word
//! held the publishing thread 0.61 µs (H200, 2026-12-01) while the area's writes
//! reached host memory, before the word even left; no system-scope fence is left on a
//! request's path. What the stamps do not cover is the doorbell's and the result
//! words' trips over PCIe and the host's own work: the host's wait minus the stamps.
//! Block 0's stamps reach another publishing block through the slot's device words
//! ([`DEVICE_STAMPS_AT`]), written before block 0's arrival and read after the
//! publisher's acquire.
//!
//! # Why the publish fence follows the result words
//!
//! With the publish fence before the first result word, the readback phase took
//! 0.96–1.06 µs on the H200 (2026-12-02, the dispatch bench's three lane shapes), of
//! which the fence held the publishing thread about 0.3 µs (0.29 µs stamped before
//! its first readback loads; 0.58–0.61 µs when placed after them, because it waits
//! for those loads too, with the phase unchanged). Every result word waited for it,
//! and so did the host's delivery, although the host reads none of those outputs from
//! device memory. Behind the result words the fence overlaps their trip over PCIe,
//! and the host delivers without it; an earlier build of this order measured the
//! readback phase at 0.64–0.74 µs. The stamp of the fence's hold went with it: the
//! header is written before the fence.
//!
//! # Why the host sees every byte, and later work every output
//!
//! **The result area.** Every word the host waits for (the header's twelve and those
//! of every readback item) is written whole by one strong 8-byte access (an element of
//! a `st.relaxed.sys` vector store: the PTX memory model treats a vector access as
//! accesses of its elements, each 8-byte aligned element single-copy atomic), its data
//! and its flag together, so a word whose flag the host reads as the request's holds
//! that request's data, whatever the order in which the words arrive. The data are
//! right when written: the publishing threads load the outputs after a
//! `barrier.sync 1` that follows every body store of their block, and (more than one
//! block) after the last arriving leader's `atom.acq_rel.gpu` that acquired every
//! other block's `fence.acq_rel.gpu` + arrival, with `ld.relaxed.gpu`. No fence is
//! needed for that: a load that follows the barriers and the acquire reads the
//! outputs whether or not they are visible at GPU scope yet. Strong stores at system
//! scope, not weak ones, so no word waits in a GPU cache for a fence. No word of
//! another request can pass: flags are the ticket, and a slot's stale words belong to
//! tickets less than 2^32 before (the host scrubs a slot's area once per 2^31 of its
//! tickets; `backend::lane::flagged` argues it).
//!
//! **Outputs in device memory** (owned buffers that the host copies or later eager
//! dispatches and lane requests read, and transient buffers the pool hands out again).
//! The publishing leader's `fence.acq_rel.gpu` comes after the barriers (and the
//! arrival's acquire) through which it observed every body store of the request, and
//! before it stores the completion word; fences are cumulative, so every output is
//! visible at GPU scope (in L2, the point of coherence every kernel and copy engine
//! reads device memory through) before the completion word can be seen. Delivery
//! promises nothing of the kind: the result words go out before the fence, so when the
//! host has them an output may still be on its way to L2. So the host treats a
//! delivered request as retired only once the completion word covers it
//! (`backend::lane`): its order-book entries stay until then, and every reader of
//! device memory after it (an eager dispatch, a blocking copy or clear, a graph replay,
//! another lane's request) waits for the completion word first. Every such reader is on
//! the GPU and starts after the host saw the completion word, so GPU scope suffices; a
//! system-scope fence would add a wait for host memory (the stall this protocol
//! removed). This leans on one property of the hardware that PTX's memory model does
//! not state, since the host is no thread of it: a store issued after a
//! `fence.acq_rel.gpu` leaves the SM only once the fence completed, so the host cannot
//! see the completion word before the outputs are in L2. The GPU test of readers right
//! after a delivery (`gpu_lane_outputs_reach_device_readers_right_after_delivery`, 2,000
//! rounds on lanes of one and four blocks) would see it fail. The fence runs after the leader's result words are issued, so it may wait
//! for them as well as for device memory; nothing waits for the fence but the
//! completion word.
//!
//! **Requests of one lane.** With one block, request `n + 1` runs on the threads that
//! ran request `n`, each of which passed a `barrier.sync 1` after its last body store
//! of `n` (after every workgroup, after the readback copy) and another before its first
//! access of `n + 1` (after the doorbell's poll): the barriers order every access of
//! `n` before every access of `n + 1` at block scope. With more than one block, no
//! block starts `n + 1` before `n` is published. Every block's leader arrives for `n`
//! with `fence.acq_rel.gpu` + `atom.acq_rel.gpu` after a block barrier that follows the
//! block's last access of `n`; the last to arrive acquires them all, its block loads
//! the readbacks, passes a barrier, and its leader, after the result words, the publish
//! fence and the completion word, stores `n + 1` into the published word
//! ([`DEVICE_PUBLISHED`]) with `st.release.gpu`. Block 0's leader, once it has the
//! doorbell and record of `n + 1`, waits with `ld.acquire.gpu` until the word shows `n`
//! published, before the block barrier after which block 0 runs anything of `n + 1` and
//! before its `st.release.gpu` of the go word, which every other block acquires before
//! its first access of `n + 1`. Release, acquire and barriers chain, so every access of
//! `n` by every block (the publisher's readback loads included) happens before every
//! access of `n + 1` at GPU scope. Either way `n + 1` reads what `n` wrote and does not
//! overwrite what `n` still reads, with no host-side order: the host skips its own
//! lane's entries in the order book, whatever the lane's blocks.
//!
//! The chain also keeps two requests out of each other's device words. Before the wait,
//! a block that was not the last to arrive went on to the next request at once: it
//! could arrive for `n + 1` before a slower block arrived for `n`, and the arrival
//! counter cannot tell the two requests' arrivals apart (`n + 1` could be published
//! with part of its work undone, and `n` never), or block 0 could overwrite the go word
//! before a slower block had read it. Now every arrival for `n + 1` (at a lane barrier
//! or the completion) comes after the last arrival for `n`, which wrapped the counter
//! to 0 before the publish it decided; the go word takes `n + 1`'s value only after
//! every block took `n`'s (a block arrives for `n` only after); and the completion
//! word, stored by whichever block arrived last for each request, never goes back
//! (`n`'s store precedes the release that `n + 1`'s publisher acquired through block 0,
//! so it precedes `n + 1`'s store). Block 0's stamps for `n + 1` are written after the
//! wait, so no publisher reads another request's. Block 0 fills the slot's record cache
//! before it waits, so that with requests queued the record's reads overlap the
//! previous request's publication: the cache of `n + 1`'s slot was last read for
//! request `n + 1 - slots`, which with two slots or more block 0 saw published before
//! it started `n`, and with one slot was delivered before the slot's doorbell rang
//! again (as for the slot's host record, staging and area).
//!
//! The cost: with one block none (block 0 publishes every request itself; the wait and
//! the published word are skipped). With more than one block, one acquire load by
//! block 0 per request, normally already satisfied (with one request in flight the host
//! rings the next doorbell only after it saw the result words, and the publisher stores
//! the published word one fence after them, well inside the round trip over PCIe that
//! the doorbell's ring and poll take), and a second GPU-scope release by the publisher
//! after the completion word, which nothing the host waits for follows. With requests
//! queued, block 0 reads the next doorbell and record while the previous request's
//! publisher finishes, then waits for it: the lane serves one request at a time, as a
//! lane of one block does.
//!
//! The wait cannot hang a healthy lane: it waits for the previous request's blocks,
//! which wait for nothing but each other, never for the host. A body that never ends
//! keeps the kernel from leaving with or without the wait (the host's waits end at
//! `LaneOptions::timeout`, and a stop waits at most that long and abandons the kernel);
//! a fault ends the kernel. The host rings a stop behind every request it submitted,
//! and block 0 hands it on after the same wait, so every block reads it as the go word
//! after the one it last took.
//!
//! In the other direction, the host's record, staging and input writes precede its
//! release store of the doorbell; block 0's `ld.acquire.sys` that reads it orders every
//! later load of the lane after them (other blocks through block 0's `st.release.gpu`
//! of the go word and their `ld.acquire.gpu` of it, plus a `fence.acq_rel.sys`), so no
//! block reads a stale record, staging byte or input, and no L1 line of an earlier
//! request survives the acquire. Loads of host memory use `ld.relaxed.sys`.

use std::fmt::{self, Write};

use super::writer::{module_header, Writer};
use super::{check_target, codegen_limits, CodegenError, MAX_PTX_BYTES};
use crate::config::CodegenOptions;
use crate::ir::{self, BufferDecl, Node, Program, ProgramForm};

/// The server's entry name.
pub const LANE_ENTRY_NAME: &str = "vyre_lane";

/// The request record in shared memory (module scope).
pub const LANE_RECORD_SYMBOL: &str = "vyre_lane_record";

/// The record of the request before the previous distinct one, in shared memory
/// (module scope): a request that alternates with another (the two steps of a short
/// encode) finds its record there instead of reading its slot's cache.
const LANE_EARLIER_SYMBOL: &str = "vyre_lane_earlier_record";

/// The workgroup-buffer pool every body shares (module scope).
pub const LANE_WORKGROUP_SYMBOL: &str = "vyre_lane_workgroup";

/// The block's view of the current request (module scope).
const LANE_STATE_SYMBOL: &str = "vyre_lane_state";

/// A body's last parameter (`.b64`), with its role: the shared address of the
/// request's record, which is either of the block's two record copies (they change
/// roles instead of contents; "Module layout" in the module docs).
pub const LANE_RECORD_PARAMETER: (&str, &str) = (
    "vyre_lane_record_at",
    "shared address of the request's record",
);

/// A body's first parameters: its workgroup id on each axis, with their roles.
pub const LANE_GROUP_PARAMETERS: [(&str, &str); 3] = [
    ("vyre_lane_group_x", "workgroup id, x"),
    ("vyre_lane_group_y", "workgroup id, y"),
    ("vyre_lane_group_z", "workgroup id, z"),
];

/// The device function name of body `index`.
pub fn lane_body_name(index: usize) -> String {
    format!("vyre_lane_body_{index}")
}

// ----- the request record (little-endian; offsets in bytes) -----------------------

/// Bytes of one request record (and of its shared-memory copy).
pub const RECORD_BYTES: usize = 4096;
/// u32: the body to run (its index in the lane).
pub const RECORD_KERNEL: usize = 0;
/// u32: fixpoint iterations (at least 1).
pub const RECORD_ITERATIONS: usize = 4;
/// u32 × 3: the grid (workgroups on x, y, z).
pub const RECORD_GRID: usize = 8;
/// u32: workgroups in all (x · y · z, at least 1).
pub const RECORD_WORKGROUPS: usize = 20;
/// u32: binding entries.
pub const RECORD_BINDING_COUNT: usize = 24;
/// u32: scalar words, one per scalar parameter the body's program declares.
pub const RECORD_SCALAR_COUNT: usize = 28;
/// u32: prologue entries.
pub const RECORD_PROLOGUE_COUNT: usize = 32;
/// u32: how many of the leading readback descriptors are windows.
pub const RECORD_WINDOW_COUNT: usize = 36;
/// u32: readback descriptors.
pub const RECORD_READBACK_COUNT: usize = 40;
/// u32: byte offset of the prologue table.
pub const RECORD_PROLOGUE_AT: usize = 44;
/// u32: byte offset of the readback table.
pub const RECORD_READBACK_AT: usize = 48;
/// u32: byte offset of the scalar words ([`record_scalar_at`] of scalar 0).
pub const RECORD_SCALARS_AT: usize = 52;
/// The binding table's offset: binding `i` at `64 + 16 i` (u64 device address, u32
/// element count, u32 reserved).
pub const RECORD_BINDINGS_AT: usize = 64;
/// Bytes of one binding entry.
pub const RECORD_BINDING_BYTES: usize = 16;
/// Bytes of one scalar word: the value's bit pattern zero-extended to a u64, as a
/// launch passes it (a 32-bit value, `f32` bits and a `bool`'s 0 or 1 in the low
/// 4 bytes).
pub const RECORD_SCALAR_BYTES: usize = 8;

/// Where scalar parameter `position` (declaration order) of a body with `bindings`
/// global buffers lies in its request record: the scalar words follow the binding
/// table, one [`RECORD_SCALAR_BYTES`] word each (8-byte aligned, as the table is
/// 16-byte aligned). The host writes each value there and the body reads it there,
/// where a launch's kernel reads its `vyre_scalar_<position>` parameter.
pub const fn record_scalar_at(bindings: usize, position: usize) -> usize {
    RECORD_BINDINGS_AT + RECORD_BINDING_BYTES * bindings + RECORD_SCALAR_BYTES * position
}
/// Bytes of one prologue entry (u64 destination, u32 bytes, u32 staging offset or
/// [`PROLOGUE_ZERO`]) and of one readback descriptor (u64 source, u32 bytes, u32
/// offset in the slot's result area; a window's source is its 16-byte block).
pub const RECORD_ENTRY_BYTES: usize = 16;
/// A prologue entry's source that means "zero fill".
pub const PROLOGUE_ZERO: u32 = u32::MAX;
/// Most global buffers a lane body binds.
pub const MAX_LANE_BINDINGS: usize = 64;
/// Most scalar words a record carries (a program declares at most
/// [`MAX_SCALARS`](crate::ir::validate::MAX_SCALARS), fewer).
pub const MAX_LANE_SCALARS: usize = 64;
/// Most prologue entries (zero fills and input copies) of one request.
pub const MAX_LANE_PROLOGUE: usize = 64;
/// Most readback items of one request.
pub const MAX_LANE_READBACKS: usize = 64;

const _: () = assert!(
    RECORD_BINDINGS_AT
        + RECORD_BINDING_BYTES * MAX_LANE_BINDINGS
        + RECORD_SCALAR_BYTES * MAX_LANE_SCALARS
        + RECORD_ENTRY_BYTES * (MAX_LANE_PROLOGUE + MAX_LANE_READBACKS)
        <= RECORD_BYTES
);
// Every valid program's scalar values fit a record.
const _: () = assert!(ir::validate::MAX_SCALARS <= MAX_LANE_SCALARS);

// ----- doorbells, areas, device words ----------------------------------------------

/// Bytes of one doorbell's line: a slot's doorbell copies lie this far apart, and
/// slot `s`'s first copy at `s * copies * DOORBELL_STRIDE` ([`lane_doorbell_copies`]).
pub const DOORBELL_STRIDE: usize = 128;

/// Copies of each slot's doorbell in a lane of `poller_warps` poller warps: one per
/// poller (poller `p` polls copy `p`, each on its own line, so the pollers' loads are
/// loads of different lines), one without pollers.
pub const fn lane_doorbell_copies(poller_warps: u32) -> usize {
    if poller_warps == 0 {
        1
    } else {
        poller_warps as usize
    }
}
/// Doorbell bits 32–47: the record's length in 16-byte chunks.
pub const DOORBELL_CHUNKS_SHIFT: u32 = 32;
/// Doorbell bit: the record differs from the slot's cached copy (read host memory).
pub const DOORBELL_RELOAD: u64 = 1 << 48;
/// Doorbell bit: leave the server loop.
pub const DOORBELL_STOP: u64 = 1 << 49;
/// Doorbell bit: the record equals the previous request's (shared copies are current).
pub const DOORBELL_SAME: u64 = 1 << 50;
/// Doorbell bit: the record equals the one before the previous request's (the blocks'
/// earlier copies hold it: they exchange their two copies; the chunk count is then the
/// larger of the two records').
pub const DOORBELL_EARLIER: u64 = 1 << 51;

/// Bytes of a result area's header, in logical bytes (see [`FLAGGED_WORD_BYTES`] for
/// where they lie in the area): u64 start stamp (the doorbell seen), u64 end stamp
/// (the readback words issued), u32 status, u32 ticket (`n + 1`), the phase stamps
/// ([`AREA_WORKGROUPS_BEGUN`], [`AREA_WORKGROUPS_DONE`]), then [`AREA_RESERVED`]
/// (zero) up to 48 bytes, so the readback bytes that follow stay 16-byte aligned.
/// There is no stamp of the publish fence: the header's words go out before it.
pub const AREA_HEADER_BYTES: usize = 48;
/// Area header u32: nanoseconds from the start stamp to the first workgroup (the
/// record's copy and the prologue), saturating.
pub const AREA_WORKGROUPS_BEGUN: usize = 24;
/// Area header u32: nanoseconds from the start stamp to the moment every workgroup
/// of every iteration finished (with several blocks: the last block arrived),
/// saturating.
pub const AREA_WORKGROUPS_DONE: usize = 28;
/// Area header: the first reserved byte (bytes `32..48`, written as zero). Byte 32
/// held the publish fence's hold until the fence moved behind the header's words.
pub const AREA_RESERVED: usize = 32;
/// Bytes of one flagged word of a result area: 4 data bytes (logical bytes `4 i ..
/// 4 i + 4` of the area, little-endian) in its low half and the request's flag
/// ([`area_flag`]) in its high half, at byte `8 i` of the slot's area, so a slot's
/// area takes twice its logical bytes. The server writes every word with a strong
/// 8-byte store (two per `st.relaxed.sys.global.v2.u64`), so the host knows a word
/// arrived when its flag is the request's, in any order, with no fence between data
/// and flag.
pub const FLAGGED_WORD_BYTES: usize = 8;
/// Logical area bytes one flagged word carries.
pub const FLAGGED_DATA_BYTES: usize = 4;

/// The flag of request `ticket`'s area words: the low 32 bits of `ticket + 1` (the
/// doorbell's ticket field).
pub const fn area_flag(ticket: u64) -> u32 {
    ticket.wrapping_add(1) as u32
}
/// Area status: the record named a body the lane does not have (nothing ran).
pub const AREA_STATUS_UNKNOWN_KERNEL: u32 = 1;

/// Device word (u32): blocks arrived at the current lane barrier or completion.
pub const DEVICE_ARRIVALS: usize = 0;
/// Device word (u32): lane barrier generation.
pub const DEVICE_GENERATION: usize = 4;
/// Device word (u64): the doorbell value block 0 hands to the other blocks.
pub const DEVICE_GO: usize = 8;
/// Device word (u32): `c + 1` once block 0 chose candidate `c` of the lane's host-mapped
/// allocations (see [`Server::place`]); the other blocks wait for it. In its own 32-byte
/// sector.
pub const DEVICE_PLACEMENT: usize = 32;
/// Byte of the completion line of candidate 0's allocation where block 0's leader
/// stores `c + 1` (u64, `st.relaxed.sys`) once it chose candidate `c`; the host waits
/// for it before the lane serves anything.
pub const HOST_PLACEMENT: usize = 64;
/// Most host-mapped allocations a lane's server chooses among.
pub const MAX_LANE_CANDIDATES: u32 = 4;
/// Loads of each line a candidate is timed by; the least counts. One PCIe round
/// trip is about a microsecond, so a candidate of a default lane (21 lines) takes
/// about 0.1 ms.
const PLACEMENT_SAMPLES: u32 = 4;
/// Device word (u32): the ticket field (`n + 1`) of the last request whose publisher
/// finished (its result words, publish fence and completion word issued), stored with
/// `st.release.gpu` by a publisher of a lane of several blocks; block 0 waits for it to
/// show request `n` with `ld.acquire.gpu` before it lets any block start request `n + 1`
/// (or leave on a stop). Unused with one block (block 0 publishes every request itself).
/// In its own 32-byte sector, away from the words the arrivals and the go word's polls
/// hit.
pub const DEVICE_PUBLISHED: usize = 64;
/// Offset of the per-slot stamps in the device words: slot `s`'s u64 start and u64
/// first-workgroup stamps (block 0's, for a publishing block of another index) at
/// `DEVICE_STAMPS_AT + 16 s`. Block 0 writes request `n + 1`'s only after it acquired
/// request `n`'s publication ([`DEVICE_PUBLISHED`]), which follows the publisher's load
/// of `n`'s stamps, so one pair would do; they stay per slot (they were per slot when
/// block 0 could run ahead of a publisher).
pub const DEVICE_STAMPS_AT: usize = 128;
/// Bytes of one slot's stamps.
pub const DEVICE_STAMP_BYTES: usize = 16;
/// Most slots the device words hold stamps for.
pub const MAX_STAMPED_SLOTS: usize = 16;
/// Offset of the per-slot record cache in the device words.
pub const DEVICE_CACHE_AT: usize = DEVICE_STAMPS_AT + DEVICE_STAMP_BYTES * MAX_STAMPED_SLOTS;

/// Bytes of the device memory a lane of `slots` slots (at most
/// [`MAX_STAMPED_SLOTS`]) needs (zeroed before launch).
pub fn lane_device_bytes(slots: usize) -> usize {
    DEVICE_CACHE_AT + slots * RECORD_BYTES
}

/// Where a workgroup buffer goes in a lane's workgroup pool that ends at `end`: its
/// offset (aligned for its elements) and the pool's new end. Workgroup buffers have a
/// validated static count whose padded size fits a `u32`.
pub(super) fn pool_place(end: u32, decl: &BufferDecl) -> (u32, u32) {
    let padded = u32::try_from(decl.padded_size_bytes()).unwrap_or(!3);
    let align = decl.elem.size_bytes().max(4);
    let offset = end.div_ceil(align).saturating_mul(align);
    (offset, offset.saturating_add(padded))
}

/// Bytes of a lane's workgroup pool that `program` (lowered) uses: its workgroup
/// buffers in binding order, each placed as its body places it.
pub fn lane_pool_bytes(program: &Program) -> u32 {
    super::workgroup_memory::workgroup_buffers(program)
        .into_iter()
        .fold(0, |end, decl| pool_place(end, decl).1)
}

/// Static shared memory per block of a lane whose largest body's pool is `pool`
/// bytes: the two records, the block state, the doorbell pollers' words (counted
/// whether the lane holds pollers or not, so a lane's shared memory, and a refusal
/// for too much of it, does not depend on the device's poller count: the reference
/// lane answers as a CUDA lane does) and the pool (16-byte rounded).
pub fn lane_shared_bytes(pool: u32) -> u32 {
    (2 * RECORD_BYTES + STATE_BYTES + WATCH_BYTES.div_ceil(16) * 16) as u32
        + pool.div_ceil(16).saturating_mul(16)
}

/// The server's parameters, in order, with their declarations and roles.
pub const LANE_PARAMETERS: [(&str, &str); 14] = [
    (
        ".u64 vyre_lane_completion",
        "host-mapped u64: the last ticket served (n + 1)",
    ),
    (
        ".u64 vyre_lane_doorbells",
        "host-mapped: copy k of slot s's u64 doorbell at (copies * s + k) * 128",
    ),
    (
        ".u64 vyre_lane_records",
        "host-mapped: slot s's request record at s * 4096",
    ),
    (
        ".u64 vyre_lane_areas",
        "host-mapped: slot s's result area (flagged words) at s * area stride",
    ),
    (
        ".u64 vyre_lane_staging",
        "host-mapped: slot s's input staging at s * staging stride",
    ),
    (
        ".u64 vyre_lane_candidate_1",
        "candidate 1's host-mapped allocation's address minus the one above (0 unused)",
    ),
    (".u64 vyre_lane_candidate_2", "candidate 2's, the same"),
    (".u64 vyre_lane_candidate_3", "candidate 3's, the same"),
    (
        ".u64 vyre_lane_device",
        "device: [0] arrivals, [4] generation, [8] go, [32] placement, [64] published, [128] \
         stamps per slot, [384] record cache per slot",
    ),
    (".u32 vyre_lane_slots", "request slots"),
    (
        ".u32 vyre_lane_area_stride",
        "bytes between result areas (twice their logical bytes)",
    ),
    (
        ".u32 vyre_lane_staging_stride",
        "bytes between staging areas",
    ),
    (
        ".u32 vyre_lane_poll_sleep",
        "nanoseconds between polls (0: spin)",
    ),
    (
        ".u32 vyre_lane_candidates",
        "host-mapped allocations the server chooses among (1: the one above)",
    ),
];

/// Units a thread keeps in flight in the server's copy loops of the prologue and of
/// readback ranges (record chunks and windows: [`batch_for`]): with one thread per block a loop of dependent load → store
/// pairs would pay one memory round trip per unit (one PCIe round trip per 16 bytes
/// of a host input).
const IN_FLIGHT: usize = 8;

/// Most units one thread keeps in flight in the loops over the record's chunks and
/// the readback windows (four registers each).
const MOST_IN_FLIGHT: usize = 16;

/// Units per thread in one batch of a loop over at most `most` units spread over
/// `threads` threads: all of a thread's share at once where that is at most
/// [`MOST_IN_FLIGHT`]. A batch's loads wait for the previous batch's (its stores
/// need their values first), so with one thread per block, as the measurement
/// fixture's lane has, eight in flight served 16 windows in two memory round trips
/// and a 600-byte record from host memory in five PCIe round trips; sixteen take one
/// and three.
fn batch_for(most: usize, threads: u32) -> usize {
    most.div_ceil(threads.max(1) as usize)
        .clamp(1, MOST_IN_FLIGHT)
}

/// Writes the bodies of a lane and its server into one module (see the module docs).
///
/// ```
/// use vyre_cuda::codegen::ptx::LaneModuleBuilder;
/// use vyre_cuda::config::CodegenOptions;
/// use vyre_cuda::ir::*;
///
/// let double = Program::builder([32, 1, 1])
///     .buffer("x", 0, Access::ReadWrite, ElemType::U32, BufferCount::Runtime)
///     .body(|b| {
///         let i = b.let_("i", Expr::global_id(Axis::X));
///         b.if_(i.clone().less_than(Expr::length("x")), |b| {
///             b.store("x", i.clone(), Expr::load("x", i.clone()) * 2u32);
///         });
///     })
///     .build();
/// let mut lane = LaneModuleBuilder::new(90, 32, [32, 1, 1]);
/// assert_eq!(lane.push(&double, &CodegenOptions::default())?, 0);
/// let ptx = lane.finish();
/// assert!(ptx.contains(".func vyre_lane_body_0("));
/// assert!(ptx.contains(".visible .entry vyre_lane("));
/// # Ok::<(), vyre_cuda::codegen::CodegenError>(())
/// ```
#[derive(Clone, Debug)]
pub struct LaneModuleBuilder {
    sm: u32,
    subgroup_size: u32,
    workgroup_size: [u32; 3],
    /// Doorbell-polling warps beside the workgroup in each block ([`lane_poller_warps`]).
    poller_warps: u32,
    bodies: String,
    count: usize,
    workgroup_bytes: u32,
    /// A body ends an acquire load with `fence.acquire.sys`, which needs PTX ISA
    /// 8.6 in the header.
    acquire_only_fences: bool,
}

impl LaneModuleBuilder {
    /// An empty lane for compute capability `sm`, `subgroup_size` and blocks of
    /// `workgroup_size` (every body must have that shape).
    pub fn new(sm: u32, subgroup_size: u32, workgroup_size: [u32; 3]) -> Self {
        Self::with_poller_warps(sm, subgroup_size, workgroup_size, 0)
    }

    /// An empty lane as [`LaneModuleBuilder::new`], whose blocks hold up to
    /// `poller_warps` doorbell-polling warps beside the workgroup (as many as fit: none
    /// unless the workgroup is one-dimensional, and no more than a block of 1,024
    /// threads holds beside the workgroup's warps, nor more than eight;
    /// [`LaneModuleBuilder::poller_warps`] says how many).
    /// The block is then launched as [`LaneModuleBuilder::block_shape`] says.
    pub fn with_poller_warps(
        sm: u32,
        subgroup_size: u32,
        workgroup_size: [u32; 3],
        poller_warps: u32,
    ) -> Self {
        LaneModuleBuilder {
            sm,
            subgroup_size,
            workgroup_size,
            poller_warps: lane_poller_warps(workgroup_size, poller_warps, subgroup_size),
            bodies: String::new(),
            count: 0,
            workgroup_bytes: 0,
            acquire_only_fences: false,
        }
    }

    /// Write `program` (lowered) as the next body with its own code generation
    /// options; returns its index. Checked as [`super::program_to_ptx`] checks a
    /// program (target, lowering, validation before any other walk), then refused
    /// with [`CodegenError::LaneBody`] when its workgroup shape is not the lane's or it
    /// has a grid sync, and with [`CodegenError::ModuleFull`] past
    /// [`MAX_PTX_BYTES`]. On any error the builder is unchanged.
    pub fn push(
        &mut self,
        program: &Program,
        options: &CodegenOptions,
    ) -> Result<usize, CodegenError> {
        check_target(program, self.sm, self.subgroup_size)?;
        let valid = ir::validate_unmemoised(program, &codegen_limits(), ProgramForm::Lowered)
            .map_err(CodegenError::Invalid)?;
        if program.workgroup_size() != self.workgroup_size {
            return Err(CodegenError::LaneBody {
                program: program.display_name(),
                reason: format!(
                    "build another lane for workgroup size {:?}: this lane's blocks have the shape {:?}, \
                     and every body of a lane runs in them",
                    program.workgroup_size(),
                    self.workgroup_size
                ),
            });
        }
        if ir::any_node(program.entry(), |node| matches!(node, Node::GridSync)) {
            return Err(CodegenError::LaneBody {
                program: program.display_name(),
                reason: "dispatch it with a launch (CudaBackend::run): a lane runs a grid's workgroups \
                         in turn on its resident blocks, so a grid sync would wait for workgroups that \
                         have not started"
                    .into(),
            });
        }
        let index = self.count;
        let barrier_threads = (self.poller_warps > 0)
            .then(|| workgroup_warp_threads(self.workgroup_size, self.subgroup_size));
        let (text, bytes, facts) = Writer::new(&valid, *options, self.sm, false)
            .for_lane_body(index, barrier_threads)
            .finish_lane_body()?;
        if HEADER_BYTES + SERVER_BYTES + self.bodies.len() + 1 + text.len() > MAX_PTX_BYTES {
            return Err(CodegenError::ModuleFull {
                kernels: self.count,
                limit_bytes: MAX_PTX_BYTES,
            });
        }
        self.bodies.push('\n');
        self.bodies.push_str(&text);
        self.count += 1;
        self.workgroup_bytes = self.workgroup_bytes.max(bytes);
        self.acquire_only_fences |= facts.acquire_only_fences;
        Ok(index)
    }

    /// Bodies pushed so far.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether no body was pushed yet.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Doorbell-polling warps each block holds beside the workgroup (0: block 0's
    /// first thread polls the doorbell itself).
    pub fn poller_warps(&self) -> u32 {
        self.poller_warps
    }

    /// The block shape the server kernel is launched with: the workgroup's, or, with
    /// poller warps, one dimension of the workgroup's whole warps and the pollers'.
    pub fn block_shape(&self) -> [u32; 3] {
        lane_block_shape(self.workgroup_size, self.poller_warps, self.subgroup_size)
    }

    /// Bytes of the workgroup pool (the largest body's workgroup buffers).
    pub fn workgroup_bytes(&self) -> u32 {
        self.workgroup_bytes
    }

    /// Static shared memory the server takes per block: the record, the state and
    /// the workgroup pool.
    pub fn shared_bytes(&self) -> u32 {
        lane_shared_bytes(self.workgroup_bytes)
    }

    /// The module text: header, shared declarations, bodies, server.
    pub fn finish(self) -> String {
        let mut out = String::with_capacity(HEADER_BYTES + SERVER_BYTES + self.bodies.len());
        let [x, y, z] = self.workgroup_size;
        let _ = writeln!(
            out,
            "//\n// vyre-cuda lane: a resident server of {} bodies, workgroup size [{x}, {y}, {z}]\n//",
            self.count
        );
        module_header(&mut out, self.sm, self.acquire_only_fences);
        let _ = writeln!(
            out,
            "// the current request's record (header, bindings, scalars, prologue, readbacks)\n\
             .shared .align 16 .b8 {LANE_RECORD_SYMBOL}[{RECORD_BYTES}];\n\
             // the record before the previous distinct one (a request that alternates with another)\n\
             .shared .align 16 .b8 {LANE_EARLIER_SYMBOL}[{RECORD_BYTES}];\n\
             // this block's view of the request: [0] doorbell value, [8] u32 publishes\n\
             .shared .align 8 .b8 {LANE_STATE_SYMBOL}[{STATE_BYTES}];"
        );
        if self.poller_warps > 0 {
            let _ = writeln!(
                out,
                "// the doorbell pollers' words: [0] u32 the ticket field block 0 waits for, \
                 [8] the doorbell seen for an odd one, [16] for an even one\n\
                 .shared .align 8 .b8 {LANE_WATCH_SYMBOL}[{WATCH_BYTES}];"
            );
        }
        if self.workgroup_bytes > 0 {
            let _ = writeln!(
                out,
                "// every body's workgroup buffers (the largest body's)\n\
                 .shared .align 16 .b8 {LANE_WORKGROUP_SYMBOL}[{}];",
                self.workgroup_bytes.div_ceil(16) * 16
            );
        }
        out.push_str(&self.bodies);
        out.push('\n');
        let threads = x * y * z;
        let pollers = (self.poller_warps > 0).then(|| Pollers {
            warps: self.poller_warps,
            first_thread: workgroup_warp_threads(self.workgroup_size, self.subgroup_size),
            block_threads: self.block_shape()[0],
        });
        let mut server = Server {
            out,
            labels: 0,
            threads,
            pollers,
            record_batch: batch_for(RECORD_BYTES / 16, threads),
            window_batch: batch_for(MAX_LANE_READBACKS, threads),
        };
        server.entry(self.workgroup_size, self.count);
        server.out
    }
}

/// Bytes of the block state in shared memory.
const STATE_BYTES: usize = 16;

/// The doorbell pollers' words in shared memory (module scope, only in a lane with
/// poller warps): the ticket field block 0's leader waits for, and the doorbell value
/// a poller saw for it, in one of two words by the field's parity.
const LANE_WATCH_SYMBOL: &str = "vyre_lane_watch";

/// Bytes of the pollers' words.
const WATCH_BYTES: usize = 24;

/// Where the pollers' two answer words begin, after the u32 ticket field the leader
/// waits for (at 0): the answer for ticket field `w` is the u64 at
/// `WATCH_ANSWERS_AT + 8 (w & 1)` ([`Server::answer_word`]).
const WATCH_ANSWERS_AT: usize = 8;

/// Nanoseconds a poller sleeps between looks at the leader's word while no ticket is
/// wanted (a request runs): the next ring comes a PCIe round trip or more after the
/// leader asks for its ticket, so the pollers wake long before it, and meanwhile they
/// take no issue slots from the workgroup's warps.
const POLLER_IDLE_SLEEP_NS: u32 = 100;

/// Most doorbell-polling warps a lane's block holds beside its workgroup.
pub const MAX_LANE_POLLER_WARPS: u32 = 8;

/// Most threads of one block on every device a lane runs on.
const MAX_BLOCK_THREADS: u32 = 1024;

/// Round trips to host memory each poller times when the lane starts; the least of
/// them sets the pollers' stagger for the lane's life. One timing (it used to be one
/// of three dependent loads) takes in whatever else crossed PCIe meanwhile, say the
/// host still writing the lane's memory, and a stagger too long spreads the pollers'
/// loads over more than a round trip; the least of several drops only with an
/// undisturbed sample. (It did not explain, on the H200 on 2026-12-03, why lanes of
/// the same options served (17, 62) in about 4.2 µs or about 4.85 µs, one mode per
/// lane: that stayed.)
const ROUND_TRIP_SAMPLES: u32 = 16;

/// Threads of a workgroup's warps, whole: where a block's poller warps begin.
fn workgroup_warp_threads([x, y, z]: [u32; 3], warp: u32) -> u32 {
    let warp = warp.max(1);
    (x * y * z).div_ceil(warp) * warp
}

/// How many of `requested` doorbell-polling warps a lane of workgroup shape `shape`
/// holds (warps of `warp` threads): none unless the workgroup is one-dimensional (the
/// block is then launched flat, so a body thread's local id is its thread index), and
/// no more than fit a block of 1,024 threads beside the workgroup's warps, nor more
/// than [`MAX_LANE_POLLER_WARPS`].
pub fn lane_poller_warps(shape: [u32; 3], requested: u32, warp: u32) -> u32 {
    let [_, y, z] = shape;
    if y != 1 || z != 1 || warp == 0 {
        return 0;
    }
    let room = MAX_BLOCK_THREADS.saturating_sub(workgroup_warp_threads(shape, warp)) / warp;
    requested.min(room).min(MAX_LANE_POLLER_WARPS)
}

/// The block shape of a lane of workgroup shape `shape` with `poller_warps` (as
/// [`lane_poller_warps`] gave them): the workgroup's shape without pollers; with them,
/// the workgroup's warps and the pollers' along x.
pub fn lane_block_shape(shape: [u32; 3], poller_warps: u32, warp: u32) -> [u32; 3] {
    if poller_warps == 0 {
        return shape;
    }
    [
        workgroup_warp_threads(shape, warp) + poller_warps * warp.max(1),
        1,
        1,
    ]
}

/// A lane's doorbell pollers: `warps` warps whose first thread each polls block 0's
/// doorbell, from thread `first_thread` of the block (the end of the workgroup's
/// warps).
#[derive(Clone, Copy, Debug)]
struct Pollers {
    warps: u32,
    first_thread: u32,
    /// Threads of the block: the workgroup's warps and the pollers'.
    block_threads: u32,
}

/// Registers of the pollers (declared only in a lane that has them).
const POLLER_PREDICATES: &[&str] = &["%beyond", "%poller_rest", "%poller_hit", "%poller_wait"];
const POLLER_WORDS: &[&str] = &[
    "%poller_want",
    "%poller_done",
    "%poller_seen",
    "%poller_slot",
    "%poller_index",
];
const POLLER_DOUBLES: &[&str] = &[
    "%watch",
    "%watch_seen",
    "%poller_bell",
    "%poller_bell_at",
    "%poller_seen_at",
    "%poller_offset",
    "%poller_stagger",
    "%poller_now",
    "%poller_until",
];

/// Room reserved for the header and shared declarations (module size check).
const HEADER_BYTES: usize = 1024;

/// Room reserved for the server entry (module size check; it is about 30 KiB).
const SERVER_BYTES: usize = 64 * 1024;

/// Emits the server entry.
struct Server {
    out: String,
    labels: u32,
    /// Threads per workgroup.
    threads: u32,
    /// The doorbell pollers beside the workgroup, if any.
    pollers: Option<Pollers>,
    /// Record chunks per thread per batch ([`batch_for`]).
    record_batch: usize,
    /// Readback windows per thread per batch ([`batch_for`]).
    window_batch: usize,
}

/// Registers of the server, declared by name at its top.
const PREDICATES: &[&str] = &[
    "%leader",
    "%dispatcher",
    "%multi",
    "%stop",
    "%same",
    "%reload",
    "%zero",
    "%found",
    "%sleeping",
    "%past",
    "%live",
    "%take",
    "%wide_unit",
    "%word_unit",
    "%flat",
    "%whole",
    "%bytewise",
    "%earlier",
    "%placing",
];
const WORDS: &[&str] = &[
    "%lin",
    "%block",
    "%blocks",
    "%everyone",
    "%global",
    "%last_arrival",
    "%ticket",
    "%want",
    "%seen",
    "%slot",
    "%slots",
    "%area_stride",
    "%staging_stride",
    "%sleep",
    "%chunks",
    "%index",
    "%kernel",
    "%iterations",
    "%iteration",
    "%grid_x",
    "%grid_y",
    "%total",
    "%group",
    "%group_x",
    "%group_y",
    "%group_z",
    "%rest",
    "%prologue",
    "%prologue_at",
    "%windows",
    "%readbacks",
    "%readback_at",
    "%entry",
    "%op",
    "%bytes",
    "%source",
    "%units",
    "%done_units",
    "%value",
    "%low",
    "%align",
    "%status",
    "%arrived",
    "%generation",
    "%current",
    "%publishing",
    "%stride",
    "%tid_x",
    "%tid_y",
    "%tid_z",
    "%plane",
    "%begun_ns",
    "%done_ns",
    "%start_low",
    "%start_high",
    "%end_low",
    "%end_high",
    "%words",
    "%published",
    "%candidates",
    "%candidate",
    "%choice",
    "%line",
    "%sample",
    "%last_window",
    "%window_unit",
];
const DOUBLES: &[&str] = &[
    "%completion",
    "%doorbells",
    "%records",
    "%areas",
    "%staging",
    "%device",
    "%record",
    "%state",
    "%bell",
    "%flag",
    "%wide",
    "%bell_address",
    "%cache",
    "%host_record",
    "%origin",
    "%offset",
    "%at",
    "%from",
    "%to",
    "%area",
    "%inputs",
    "%destination",
    "%source_address",
    "%start",
    "%end",
    "%served",
    "%begun",
    "%done",
    "%stamps",
    "%pair_a",
    "%pair_b",
    "%earlier_record",
    "%delta",
    "%delta_1",
    "%delta_2",
    "%delta_3",
    "%score",
    "%least",
    "%timed",
];

impl Server {
    fn line(&mut self, text: fmt::Arguments<'_>) {
        self.out.push('\t');
        let _ = self.out.write_fmt(text);
        self.out.push('\n');
    }

    fn comment(&mut self, text: &str) {
        let _ = writeln!(self.out, "\t// {text}");
    }

    fn label(&mut self, kind: &str) -> String {
        self.labels += 1;
        format!("$L_lane_{kind}_{}", self.labels)
    }

    fn place(&mut self, label: &str) {
        let _ = writeln!(self.out, "{label}:");
    }

    fn entry(&mut self, [x, y, z]: [u32; 3], bodies: usize) {
        let _ = write!(self.out, ".visible .entry {LANE_ENTRY_NAME}(");
        for (index, (declaration, role)) in LANE_PARAMETERS.iter().enumerate() {
            let comma = if index + 1 < LANE_PARAMETERS.len() {
                ","
            } else {
                ""
            };
            let _ = write!(self.out, "\n\t.param {declaration}{comma} // {role}");
        }
        match self.pollers {
            None => {
                let _ = writeln!(self.out, "\n)\n.reqntid {x}, {y}, {z}\n{{");
            }
            Some(pollers) => {
                let _ = writeln!(
                    self.out,
                    "\n)\n.reqntid {}, 1, 1\n{{",
                    pollers.block_threads
                );
            }
        }
        for (kind, names) in [(".pred", PREDICATES), (".b32", WORDS), (".b64", DOUBLES)] {
            let _ = writeln!(self.out, "\t.reg {kind} {};", names.join(", "));
        }
        if self.pollers.is_some() {
            for (kind, names) in [
                (".pred", POLLER_PREDICATES),
                (".b32", POLLER_WORDS),
                (".b64", POLLER_DOUBLES),
            ] {
                let _ = writeln!(self.out, "\t.reg {kind} {};", names.join(", "));
            }
        }
        // Batch registers of the copy loops: unit indices, then four words per unit.
        let batch = IN_FLIGHT.max(self.record_batch).max(self.window_batch);
        let _ = writeln!(self.out, "\t.reg .b32 %unit<{batch}>, %v<{}>;\n", 4 * batch);
        self.prologue([x, y, z]);
        self.place_memory();
        self.part_ways();
        self.wait_for_request();
        self.read_record();
        self.header();
        self.run_prologue();
        self.run_workgroups(bodies);
        self.complete();
        self.poll_for_block_zero();
        self.out.push_str("}\n");
    }

    /// Parameters, the thread's place in the lane, ticket 0.
    fn prologue(&mut self, [x, y, _]: [u32; 3]) {
        let t = self.threads;
        for (name, register) in [
            ("vyre_lane_completion", "%completion"),
            ("vyre_lane_doorbells", "%doorbells"),
            ("vyre_lane_records", "%records"),
            ("vyre_lane_areas", "%areas"),
            ("vyre_lane_staging", "%staging"),
            ("vyre_lane_device", "%device"),
        ] {
            self.line(format_args!("ld.param.u64 {register}, [{name}];"));
            self.line(format_args!("cvta.to.global.u64 {register}, {register};"));
        }
        for (name, register) in [
            ("vyre_lane_slots", "%slots"),
            ("vyre_lane_area_stride", "%area_stride"),
            ("vyre_lane_staging_stride", "%staging_stride"),
            ("vyre_lane_poll_sleep", "%sleep"),
            ("vyre_lane_candidates", "%candidates"),
        ] {
            self.line(format_args!("ld.param.u32 {register}, [{name}];"));
        }
        for (name, register) in [
            ("vyre_lane_candidate_1", "%delta_1"),
            ("vyre_lane_candidate_2", "%delta_2"),
            ("vyre_lane_candidate_3", "%delta_3"),
        ] {
            self.line(format_args!("ld.param.u64 {register}, [{name}];"));
        }
        self.comment("this thread's place: local linear id, block, index in the lane");
        self.line(format_args!("mov.u32 %tid_x, %tid.x;"));
        self.line(format_args!("mov.u32 %tid_y, %tid.y;"));
        self.line(format_args!("mov.u32 %tid_z, %tid.z;"));
        self.line(format_args!("mad.lo.u32 %plane, %tid_z, {y}, %tid_y;"));
        self.line(format_args!("mad.lo.u32 %lin, %plane, {x}, %tid_x;"));
        self.line(format_args!("mov.u32 %block, %ctaid.x;"));
        self.line(format_args!("mov.u32 %blocks, %nctaid.x;"));
        self.line(format_args!("setp.eq.u32 %leader, %lin, 0;"));
        self.line(format_args!("setp.eq.u32 %dispatcher, %block, 0;"));
        self.line(format_args!("setp.gt.u32 %multi, %blocks, 1;"));
        self.line(format_args!("setp.ne.u32 %sleeping, %sleep, 0;"));
        self.line(format_args!("sub.u32 %last_arrival, %blocks, 1;"));
        self.line(format_args!("mul.lo.u32 %everyone, %blocks, {t};"));
        self.line(format_args!("mad.lo.u32 %global, %block, {t}, %lin;"));
        self.line(format_args!("mov.u64 %record, {LANE_RECORD_SYMBOL};"));
        self.line(format_args!(
            "mov.u64 %earlier_record, {LANE_EARLIER_SYMBOL};"
        ));
        self.line(format_args!("mov.u64 %state, {LANE_STATE_SYMBOL};"));
        self.line(format_args!("mov.u32 %ticket, 0;"));
    }

    /// Barrier 1 over the workgroup's threads: every thread of the block, or with
    /// poller warps beside the workgroup, the workgroup's warps (the pollers never
    /// arrive).
    fn block_barrier(&mut self) {
        match self.pollers {
            None => self.line(format_args!("barrier.sync 1;")),
            Some(pollers) => self.line(format_args!("barrier.sync 1, {};", pollers.first_thread)),
        }
    }

    /// Choose the host-mapped allocation the lane serves through (see the module docs'
    /// "Placement"): block 0's leader times loads of every candidate's lines that each
    /// request touches from its own SM (the completion line, every doorbell copy, each
    /// slot's first area line; the least of [`PLACEMENT_SAMPLES`] loads each), keeps the
    /// candidate of least total, stores `c + 1` into the device word
    /// [`DEVICE_PLACEMENT`] for the other blocks and into candidate 0's
    /// [`HOST_PLACEMENT`] word for the host; every thread then moves its five
    /// host-mapped addresses to candidate `c`. With one candidate, nothing is timed.
    fn place_memory(&mut self) {
        let _ = writeln!(
            self.out,
            "\n\t// ---- placement: block 0's leader chooses the host-mapped allocation its SM reaches soonest"
        );
        self.line(format_args!("setp.gt.u32 %placing, %candidates, 1;"));
        self.line(format_args!("@!%placing bra $L_lane_placed;"));
        self.line(format_args!("@!%leader bra $L_lane_placement_shared;"));
        self.line(format_args!("@!%dispatcher bra $L_lane_placement_wait;"));
        self.lines(&[
            "mov.u32 %candidate, 0;",
            "mov.u32 %choice, 0;",
            "mov.u64 %least, -1;",
        ]);
        self.place("$L_lane_placement_candidate");
        self.candidate_delta("%candidate");
        self.line(format_args!("mov.u64 %score, 0;"));
        // Lines 0: the completion line; 1..=slots·copies: the doorbell copies;
        // then one per slot: its area's first line.
        let copies = self.pollers.map_or(1, |pollers| pollers.warps.max(1));
        self.line(format_args!("mul.lo.u32 %units, %slots, {copies};"));
        self.line(format_args!("add.u32 %done_units, %units, %slots;"));
        self.line(format_args!("mov.u32 %line, 0;"));
        self.place("$L_lane_placement_line");
        self.lines(&[
            "add.s64 %at, %completion, %delta;",
            "setp.eq.u32 %past, %line, 0;",
            "@%past bra $L_lane_placement_timed;",
            "sub.u32 %index, %line, 1;",
            "setp.lt.u32 %past, %index, %units;",
        ]);
        self.line(format_args!(
            "mul.wide.u32 %offset, %index, {DOORBELL_STRIDE};"
        ));
        self.lines(&[
            "add.s64 %at, %doorbells, %offset;",
            "add.s64 %at, %at, %delta;",
            "@%past bra $L_lane_placement_timed;",
            "sub.u32 %index, %index, %units;",
            "mul.wide.u32 %offset, %index, %area_stride;",
            "add.s64 %at, %areas, %offset;",
            "add.s64 %at, %at, %delta;",
        ]);
        self.place("$L_lane_placement_timed");
        self.comment(
            "the least of a few loads of the line: the time once its value is in. The \
             second timer read follows a branch on the value (no timed word is all ones at \
             launch), so it cannot be read before the value arrives: read after an \
             arithmetic use of the value instead, it read 0 on the H200 (ptxas may move a \
             timer read above a use it does not depend on)",
        );
        self.lines(&["mov.u64 %timed, -1;", "mov.u32 %sample, 0;"]);
        self.place("$L_lane_placement_sample");
        self.lines(&[
            "mov.u64 %start, %globaltimer;",
            "ld.relaxed.sys.global.u64 %wide, [%at];",
            "setp.eq.u64 %past, %wide, -1;",
            "@%past bra $L_lane_placement_sample;",
            "mov.u64 %end, %globaltimer;",
            "sub.u64 %end, %end, %start;",
            "min.u64 %timed, %timed, %end;",
            "add.u32 %sample, %sample, 1;",
        ]);
        self.line(format_args!(
            "setp.lt.u32 %past, %sample, {PLACEMENT_SAMPLES};"
        ));
        self.lines(&[
            "@%past bra $L_lane_placement_sample;",
            "add.u64 %score, %score, %timed;",
            "add.u32 %line, %line, 1;",
            "setp.lt.u32 %past, %line, %done_units;",
            "@%past bra $L_lane_placement_line;",
            "setp.lt.u64 %past, %score, %least;",
            "@%past mov.u32 %choice, %candidate;",
            "@%past mov.u64 %least, %score;",
            "add.u32 %candidate, %candidate, 1;",
            "setp.lt.u32 %past, %candidate, %candidates;",
            "@%past bra $L_lane_placement_candidate;",
            "add.u32 %value, %choice, 1;",
        ]);
        self.line(format_args!(
            "st.release.gpu.global.u32 [%device+{DEVICE_PLACEMENT}], %value;"
        ));
        self.line(format_args!("cvt.u64.u32 %wide, %value;"));
        self.line(format_args!(
            "st.relaxed.sys.global.u64 [%completion+{HOST_PLACEMENT}], %wide;"
        ));
        self.line(format_args!("bra $L_lane_placement_chosen;"));
        self.place("$L_lane_placement_wait");
        self.line(format_args!(
            "ld.acquire.gpu.global.u32 %value, [%device+{DEVICE_PLACEMENT}];"
        ));
        self.lines(&[
            "setp.eq.u32 %past, %value, 0;",
            "@%past nanosleep.u32 100;",
            "@%past bra $L_lane_placement_wait;",
            "sub.u32 %choice, %value, 1;",
        ]);
        self.place("$L_lane_placement_chosen");
        self.line(format_args!("st.shared.u32 [%state+12], %choice;"));
        self.place("$L_lane_placement_shared");
        self.comment("every thread of the block (pollers too) learns the choice");
        self.line(format_args!("barrier.sync 2;"));
        self.line(format_args!("ld.shared.u32 %choice, [%state+12];"));
        self.candidate_delta("%choice");
        for register in [
            "%completion",
            "%doorbells",
            "%records",
            "%areas",
            "%staging",
        ] {
            self.line(format_args!("add.s64 {register}, {register}, %delta;"));
        }
        self.place("$L_lane_placed");
    }

    /// `%delta` = candidate `index`'s address minus candidate 0's (0 for candidate 0).
    fn candidate_delta(&mut self, index: &str) {
        self.line(format_args!("mov.u64 %delta, 0;"));
        for (candidate, register) in [(1, "%delta_1"), (2, "%delta_2"), (3, "%delta_3")] {
            self.line(format_args!("setp.eq.u32 %past, {index}, {candidate};"));
            self.line(format_args!("@%past mov.u64 %delta, {register};"));
        }
    }

    /// With poller warps: the pollers' words start clear, then the pollers go to their
    /// loop and the threads that only fill the workgroup's last warp leave (the
    /// barriers count whole warps, and a warp's exited threads do not hold one up).
    fn part_ways(&mut self) {
        let Some(pollers) = self.pollers else {
            return;
        };
        self.comment("the pollers' words start clear before any poller reads them");
        self.line(format_args!("mov.u64 %watch, {LANE_WATCH_SYMBOL};"));
        self.line(format_args!("@%leader st.shared.u32 [%watch], 0;"));
        self.line(format_args!(
            "@%leader st.shared.u64 [%watch+{WATCH_ANSWERS_AT}], 0;"
        ));
        self.line(format_args!(
            "@%leader st.shared.u64 [%watch+{}], 0;",
            WATCH_ANSWERS_AT + 8
        ));
        self.line(format_args!("barrier.sync 2;"));
        self.line(format_args!(
            "setp.ge.u32 %beyond, %lin, {};",
            pollers.first_thread
        ));
        self.line(format_args!("@%beyond bra $L_lane_poller;"));
        let threads = self.threads;
        self.line(format_args!("setp.ge.u32 %beyond, %lin, {threads};"));
        self.line(format_args!("@%beyond bra $L_lane_stop;"));
    }

    /// Block 0's leader polls the slot's doorbell (or, with poller warps, waits for
    /// one of them to see it); every other block's leader polls the go word; the block
    /// learns the doorbell value through shared memory.
    fn wait_for_request(&mut self) {
        let _ = writeln!(
            self.out,
            "\n\t// ---- wait for request `ticket` (block 0: its doorbell; others: block 0's go word)"
        );
        self.place("$L_lane_next");
        self.line(format_args!("add.u32 %want, %ticket, 1;"));
        self.line(format_args!("rem.u32 %slot, %ticket, %slots;"));
        self.line(format_args!("@!%leader bra $L_lane_announced;"));
        self.line(format_args!("@!%dispatcher bra $L_lane_poll_go;"));
        if self.pollers.is_some() {
            self.comment(
                "the pollers look for this ticket; the one that sees it releases the doorbell's value \
                 into the word of the ticket's parity, after its ld.acquire.sys of it",
            );
            self.line(format_args!(
                "atom.relaxed.cta.shared.exch.b32 %seen, [%watch], %want;"
            ));
            self.answer_word(["%want", "%seen", "%offset", "%watch_seen"]);
            self.poll(
                "$L_lane_poll_bell",
                "atom.acquire.cta.shared.or.b64 %bell, [%watch_seen], 0;",
                "$L_lane_rung",
            );
        } else {
            self.line(format_args!(
                "mul.wide.u32 %offset, %slot, {DOORBELL_STRIDE};"
            ));
            self.line(format_args!("add.s64 %bell_address, %doorbells, %offset;"));
            self.poll(
                "$L_lane_poll_bell",
                "ld.acquire.sys.global.u64 %bell, [%bell_address];",
                "$L_lane_rung",
            );
        }
        self.line(format_args!("mov.u64 %start, %globaltimer;"));
        self.comment(
            "a stop goes to the other blocks as soon as the previous request is published (there \
             is no record to wait for): the go word changes only once every block took the last one",
        );
        self.line(format_args!("and.b64 %flag, %bell, {DOORBELL_STOP};"));
        self.line(format_args!("setp.ne.u64 %stop, %flag, 0;"));
        self.line(format_args!("and.pred %take, %stop, %multi;"));
        self.line(format_args!("@!%take bra $L_lane_stop_handed;"));
        self.wait_for_published("$L_lane_stop_wait", "$L_lane_stop_published");
        self.line(format_args!(
            "st.release.gpu.global.u64 [%device+{DEVICE_GO}], %bell;"
        ));
        self.place("$L_lane_stop_handed");
        self.line(format_args!("st.shared.u64 [%state], %bell;"));
        self.line(format_args!("bra $L_lane_announced;"));
        self.poll(
            "$L_lane_poll_go",
            &format!("ld.acquire.gpu.global.u64 %bell, [%device+{DEVICE_GO}];"),
            "$L_lane_go",
        );
        self.comment(
            "what block 0 acquired from the host (record, staging, inputs) is ordered before this block's loads",
        );
        self.line(format_args!("fence.acq_rel.sys;"));
        self.line(format_args!("st.shared.u64 [%state], %bell;"));
        self.place("$L_lane_announced");
        self.block_barrier();
        self.line(format_args!("ld.shared.u64 %bell, [%state];"));
        self.line(format_args!("and.b64 %flag, %bell, {DOORBELL_STOP};"));
        self.line(format_args!("setp.ne.u64 %stop, %flag, 0;"));
        self.line(format_args!("@%stop bra $L_lane_stop;"));
    }

    /// Block 0's leader (of a lane of several blocks; the caller branches around it
    /// otherwise) waits until the previous request is published: an `ld.acquire.gpu`
    /// of [`DEVICE_PUBLISHED`] until it holds `%ticket` (request `%ticket - 1`'s ticket
    /// field; 0, as the device words start, before request 0), sleeping `%sleep` ns
    /// between loads when asked. What the publisher did before its release (every
    /// block's accesses of that request, through its arrival) happens before what this
    /// thread does after, and before what any block does once it took the next go word.
    /// The loop's labels are `top` and `done` (named, not numbered, so that the other
    /// labels of the server keep their numbers).
    fn wait_for_published(&mut self, top: &str, done: &str) {
        self.spin(
            top,
            &[&format!(
                "ld.acquire.gpu.global.u32 %published, [%device+{DEVICE_PUBLISHED}];"
            )],
            "%published, %ticket",
            done,
        );
    }

    /// A polling loop at `top`: `load` into `%bell` until its low 32 bits are `%want`
    /// (sleeping `%sleep` ns between loads when asked), then on at `found`.
    fn poll(&mut self, top: &str, load: &str, found: &str) {
        self.spin(
            top,
            &[load, "cvt.u32.u64 %seen, %bell;"],
            "%seen, %want",
            found,
        );
    }

    /// The one spinning loop of the server: at `top`, the `reads` (the last leaves the
    /// value in a u32 register) until `compared` (that register, then the value it
    /// waits for) are equal, sleeping `%sleep` ns between reads when asked; then on at
    /// `found`.
    fn spin(&mut self, top: &str, reads: &[&str], compared: &str, found: &str) {
        self.place(top);
        for read in reads {
            self.line(format_args!("{read}"));
        }
        self.line(format_args!("setp.eq.u32 %found, {compared};"));
        self.line(format_args!("@%found bra {found};"));
        self.line(format_args!("@%sleeping nanosleep.u32 %sleep;"));
        self.line(format_args!("bra {top};"));
        self.place(found);
    }

    /// The record into shared memory: nothing when it equals the previous request's;
    /// an exchange of the blocks' two copies' roles when it equals the one before that;
    /// otherwise the held record becomes the earlier one (roles again) and the new one
    /// comes from host memory (block 0, also into the slot's cache) when it changed,
    /// from the slot's cache otherwise, into the copy that held the earlier record
    /// (which nothing reads until a later exchange). Then block 0 lets the other blocks
    /// go.
    ///
    /// With more than one block, block 0's leader waits for the previous request's
    /// publication before the barrier (the module docs, "Requests of one lane").
    fn read_record(&mut self) {
        self.comment("the record: its length in 16-byte chunks and where it comes from");
        self.line(format_args!(
            "shr.u64 %wide, %bell, {DOORBELL_CHUNKS_SHIFT};"
        ));
        self.line(format_args!("cvt.u32.u64 %chunks, %wide;"));
        self.line(format_args!("and.b32 %chunks, %chunks, 65535;"));
        self.line(format_args!("and.b64 %flag, %bell, {DOORBELL_SAME};"));
        self.line(format_args!("setp.ne.u64 %same, %flag, 0;"));
        self.line(format_args!("@%same bra $L_lane_record_ready;"));
        self.line(format_args!("and.b64 %flag, %bell, {DOORBELL_EARLIER};"));
        self.line(format_args!("setp.ne.u64 %earlier, %flag, 0;"));
        self.line(format_args!("@%earlier bra $L_lane_exchange_record;"));
        self.line(format_args!("and.b64 %flag, %bell, {DOORBELL_RELOAD};"));
        self.line(format_args!("setp.ne.u64 %reload, %flag, 0;"));
        self.line(format_args!("and.pred %reload, %reload, %dispatcher;"));
        self.line(format_args!("mul.wide.u32 %offset, %slot, {RECORD_BYTES};"));
        self.line(format_args!("add.s64 %cache, %device, {DEVICE_CACHE_AT};"));
        self.line(format_args!("add.s64 %cache, %cache, %offset;"));
        self.line(format_args!("add.s64 %host_record, %records, %offset;"));
        self.line(format_args!(
            "selp.b64 %origin, %host_record, %cache, %reload;"
        ));
        self.comment(
            "the held record becomes the earlier one: the two copies change roles, and the new \
             record is read into the copy that held the earlier one",
        );
        self.exchange_records();
        let batch = self.record_batch;
        self.chunk_loop(
            "record",
            "%chunks",
            batch,
            |this, k| {
                this.chunk_address("%from", "%origin", k);
                let v = vector(k);
                this.line(format_args!(
                    "@%live ld.relaxed.sys.global.v4.u32 {v}, [%from];"
                ));
            },
            |this, k| {
                this.chunk_address("%to", "%record", k);
                let v = vector(k);
                this.line(format_args!("@%live st.shared.v4.u32 [%to], {v};"));
                this.line(format_args!("and.pred %take, %live, %reload;"));
                this.line(format_args!("add.s64 %to, %cache, %at;"));
                this.line(format_args!("@%take st.global.v4.u32 [%to], {v};"));
            },
        );
        self.line(format_args!("bra $L_lane_record_ready;"));
        self.place("$L_lane_exchange_record");
        self.comment("the earlier record is this request's: the two copies change roles");
        self.exchange_records();
        self.place("$L_lane_record_ready");
        self.comment(
            "block 0 starts this request (and lets the others start it) only once the previous \
             one is published: every block arrived for it and its readbacks are loaded, so no \
             block touches this request's memory while a block still serves the previous one, \
             and no arrival for this request meets one for the previous",
        );
        self.line(format_args!("and.pred %take, %leader, %dispatcher;"));
        self.line(format_args!("and.pred %take, %take, %multi;"));
        self.line(format_args!("@!%take bra $L_lane_previous_published;"));
        self.wait_for_published("$L_lane_wait_published", "$L_lane_previous_published");
        self.block_barrier();
        self.comment("block 0 lets the other blocks go once the slot's cache holds the record");
        self.block_zero_leader_with_others(&format!(
            "st.release.gpu.global.u64 [%device+{DEVICE_GO}], %bell;"
        ));
    }

    /// The current and the earlier record exchange roles (a chain request's record and
    /// prologue phase went from 0.64 to 0.29 µs, H200, 2026-12-03): every thread of the block
    /// swaps the two shared addresses it holds (all of them take the same branch of the
    /// same doorbell value, so they agree), and the bodies read the record through the
    /// address the server passes them. Nothing is copied.
    fn exchange_records(&mut self) {
        self.line(format_args!("mov.u64 %wide, %record;"));
        self.line(format_args!("mov.u64 %record, %earlier_record;"));
        self.line(format_args!("mov.u64 %earlier_record, %wide;"));
    }

    /// [`Server::thread_batches`] over the record's 16-byte chunks below `count`: each
    /// batch's `load`s for every slot, then its `store`s (each called with `%live` set
    /// for slot `k`).
    fn chunk_loop(
        &mut self,
        kind: &str,
        count: &str,
        batch: usize,
        load: impl Fn(&mut Self, usize),
        store: impl Fn(&mut Self, usize),
    ) {
        self.thread_batches(kind, count, batch, |this| {
            for k in 0..batch {
                this.live(k, count);
                load(this, k);
            }
            for k in 0..batch {
                this.live(k, count);
                store(this, k);
            }
        });
    }

    /// `into` = `base + 16 · %unit{k}` (and `%at` the offset).
    fn chunk_address(&mut self, into: &str, base: &str, k: usize) {
        self.line(format_args!("mul.wide.u32 %at, %unit{k}, 16;"));
        self.line(format_args!("add.s64 {into}, {base}, %at;"));
    }

    /// `store`, by block 0's leader only and only when the lane has other blocks.
    fn block_zero_leader_with_others(&mut self, store: &str) {
        self.line(format_args!("and.pred %take, %leader, %dispatcher;"));
        self.line(format_args!("and.pred %take, %take, %multi;"));
        self.line(format_args!("@%take {store}"));
    }

    /// `%unit{k} = first + k * stride` for every slot of a batch.
    fn batch_indices(&mut self, first: &str, stride: u32, batch: usize) {
        for k in 0..batch {
            self.line(format_args!(
                "add.u32 %unit{k}, {first}, {};",
                stride as usize * k
            ));
        }
    }

    /// `%unit{k} = first + k * stride` with a register stride.
    fn batch_indices_register(&mut self, first: &str, stride: &str) {
        for k in 0..IN_FLIGHT {
            self.line(format_args!("mad.lo.u32 %unit{k}, {stride}, {k}, {first};"));
        }
    }

    /// `%live`: batch slot `k` is below `bound`.
    fn live(&mut self, k: usize, bound: &str) {
        self.line(format_args!("setp.lt.u32 %live, %unit{k}, {bound};"));
    }

    /// The header fields every thread needs, and the slot's area and staging.
    fn header(&mut self) {
        self.comment("the request's header");
        for (register, field) in [
            ("%kernel", RECORD_KERNEL),
            ("%iterations", RECORD_ITERATIONS),
            ("%grid_x", RECORD_GRID),
            ("%grid_y", RECORD_GRID + 4),
            ("%total", RECORD_WORKGROUPS),
            ("%prologue", RECORD_PROLOGUE_COUNT),
            ("%windows", RECORD_WINDOW_COUNT),
            ("%readbacks", RECORD_READBACK_COUNT),
            ("%prologue_at", RECORD_PROLOGUE_AT),
            ("%readback_at", RECORD_READBACK_AT),
        ] {
            self.line(format_args!("ld.shared.u32 {register}, [%record+{field}];"));
        }
        self.line(format_args!("mul.wide.u32 %offset, %slot, %area_stride;"));
        self.line(format_args!("add.s64 %area, %areas, %offset;"));
        self.line(format_args!(
            "mul.wide.u32 %offset, %slot, %staging_stride;"
        ));
        self.line(format_args!("add.s64 %inputs, %staging, %offset;"));
        self.line(format_args!(
            "mul.wide.u32 %offset, %slot, {DEVICE_STAMP_BYTES};"
        ));
        self.line(format_args!("add.s64 %stamps, %device, %offset;"));
        self.line(format_args!(
            "add.s64 %stamps, %stamps, {DEVICE_STAMPS_AT};"
        ));
        self.line(format_args!("mov.u32 %status, 0;"));
        self.comment("a grid on x alone: a workgroup's id is its number, no division");
        self.line(format_args!("setp.eq.u32 %flat, %grid_x, %total;"));
    }

    /// A loop (labels named after `kind`) over the entries `%op = from .. count` of the
    /// record table whose offset register is `table`: each entry's device address is
    /// loaded into `address` and made global, then `body` runs with the label it falls
    /// through to (the loop's `next`), as [`prologue_copy`](Self::prologue_copy) and
    /// [`flagged_copy`](Self::flagged_copy) do.
    fn for_each_entry(
        &mut self,
        kind: &str,
        table: &str,
        from: &str,
        count: &str,
        address: &str,
        body: impl FnOnce(&mut Self, &str),
    ) {
        let top = self.label(kind);
        let next = self.label(&format!("{kind}_next"));
        let done = self.label(&format!("{kind}_done"));
        self.line(format_args!("mov.u32 %op, {from};"));
        self.place(&top);
        self.line(format_args!("setp.ge.u32 %past, %op, {count};"));
        self.line(format_args!("@%past bra {done};"));
        self.load_entry(table, address);
        self.line(format_args!("cvta.to.global.u64 {address}, {address};"));
        body(self, &next);
        self.place(&next);
        self.line(format_args!("add.u32 %op, %op, 1;"));
        self.line(format_args!("bra {top};"));
        self.place(&done);
    }

    /// `%at`: the shared-memory address of entry `index` of the record's table at
    /// byte offset `table`.
    fn entry_at(&mut self, index: &str, table: &str) {
        self.line(format_args!(
            "mad.lo.u32 %entry, {index}, {RECORD_ENTRY_BYTES}, {table};"
        ));
        self.line(format_args!("cvt.u64.u32 %at, %entry;"));
        self.line(format_args!("add.s64 %at, %record, %at;"));
    }

    /// Entry `%op` of the record's table at byte `table` (a prologue or readback
    /// table): its u64 address into `address`, its u32 byte count into `%bytes` and its
    /// last u32 (staging or area offset) into `%source`.
    fn load_entry(&mut self, table: &str, address: &str) {
        self.entry_at("%op", table);
        self.line(format_args!("ld.shared.u64 {address}, [%at];"));
        self.line(format_args!("ld.shared.u32 %bytes, [%at+8];"));
        self.line(format_args!("ld.shared.u32 %source, [%at+12];"));
    }

    /// Zero fills and input copies over every thread of the lane, then a lane-wide
    /// barrier when there were any.
    fn run_prologue(&mut self) {
        let _ = writeln!(
            self.out,
            "\n\t// ---- prologue: zero fills and host inputs, over every thread of the lane"
        );
        self.for_each_entry(
            "prologue",
            "%prologue_at",
            "0",
            "%prologue",
            "%destination",
            |this, next| {
                this.line(format_args!("setp.eq.u32 %zero, %source, {PROLOGUE_ZERO};"));
                this.line(format_args!("cvt.u64.u32 %offset, %source;"));
                this.line(format_args!("add.s64 %source_address, %inputs, %offset;"));
                this.prologue_copy(next);
            },
        );
        let run = self.label("run");
        self.line(format_args!("setp.eq.u32 %past, %prologue, 0;"));
        self.line(format_args!("@%past bra {run};"));
        self.lane_barrier();
        self.place(&run);
    }

    /// One prologue entry: copy `%bytes` bytes from `%source_address` (host staging or
    /// device memory, read `ld.relaxed.sys`) to `%destination`, or zeroes when `%zero`
    /// is set, units `%global, %global + %everyone, ...` of this thread (every thread
    /// of the lane), eight in flight: 16-byte units when both ends are 16-byte
    /// aligned, 4-byte units when 4-byte aligned, bytes otherwise, then the tail in
    /// bytes. Falls through to `after`'s predecessor (the caller places `after`).
    fn prologue_copy(&mut self, after: &str) {
        let words = self.label("copy_words");
        let bytes = self.label("copy_bytes");
        let tail = self.label("copy_tail");
        self.line(format_args!("cvt.u32.u64 %low, %destination;"));
        self.line(format_args!("cvt.u32.u64 %align, %source_address;"));
        // A zero fill reads nothing: only the destination's alignment counts.
        self.line(format_args!("selp.b32 %align, 0, %align, %zero;"));
        self.line(format_args!("or.b32 %align, %align, %low;"));
        self.line(format_args!("and.b32 %low, %align, 15;"));
        self.line(format_args!("setp.eq.u32 %wide_unit, %low, 0;"));
        self.line(format_args!("and.b32 %low, %align, 3;"));
        self.line(format_args!("setp.eq.u32 %word_unit, %low, 0;"));
        self.line(format_args!("@!%wide_unit bra {words};"));
        self.line(format_args!("shr.u32 %units, %bytes, 4;"));
        self.prologue_units(16);
        self.line(format_args!("shl.b32 %done_units, %units, 4;"));
        self.line(format_args!("bra {tail};"));
        self.place(&words);
        self.line(format_args!("@!%word_unit bra {bytes};"));
        self.line(format_args!("shr.u32 %units, %bytes, 2;"));
        self.prologue_units(4);
        self.line(format_args!("shl.b32 %done_units, %units, 2;"));
        self.line(format_args!("bra {tail};"));
        self.place(&bytes);
        self.line(format_args!("mov.u32 %done_units, 0;"));
        self.place(&tail);
        // The tail (and a byte-aligned copy): bytes from %done_units to %bytes.
        self.line(format_args!("sub.u32 %units, %bytes, %done_units;"));
        self.prologue_units(1);
        self.line(format_args!("bra {after};"));
    }

    /// The batched loop of [`Server::prologue_copy`] for one unit size: units
    /// `[0, %units)` (bytes: starting at byte `%done_units`), this thread's share.
    fn prologue_units(&mut self, unit: u32) {
        let top = self.label("units");
        let done = self.label("units_done");
        let (ty, shift) = match unit {
            16 => ("v4.u32", 4),
            4 => ("u32", 2),
            _ => ("u8", 0),
        };
        self.line(format_args!("mov.u32 %index, %global;"));
        self.place(&top);
        self.line(format_args!("setp.ge.u32 %past, %index, %units;"));
        self.line(format_args!("@%past bra {done};"));
        self.batch_indices_register("%index", "%everyone");
        // Byte offsets of the batch's units (the tail starts at %done_units).
        let offset = |server: &mut Self, k: usize| {
            server.line(format_args!("cvt.u64.u32 %at, %unit{k};"));
            if shift > 0 {
                server.line(format_args!("shl.b64 %at, %at, {shift};"));
            } else {
                server.line(format_args!("cvt.u64.u32 %offset, %done_units;"));
                server.line(format_args!("add.s64 %at, %at, %offset;"));
            }
        };
        for k in 0..IN_FLIGHT {
            let v = value_operand(unit, k);
            for word in 0..(unit.div_ceil(4).min(4)) {
                self.line(format_args!("mov.u32 %v{}, 0;", 4 * k + word as usize));
            }
            self.live(k, "%units");
            self.line(format_args!("and.pred %live, %live, !%zero;"));
            offset(self, k);
            self.line(format_args!("add.s64 %from, %source_address, %at;"));
            self.line(format_args!(
                "@%live ld.relaxed.sys.global.{ty} {v}, [%from];"
            ));
        }
        for k in 0..IN_FLIGHT {
            let v = value_operand(unit, k);
            self.live(k, "%units");
            offset(self, k);
            self.line(format_args!("add.s64 %to, %destination, %at;"));
            self.line(format_args!("@%live st.global.{ty} [%to], {v};"));
        }
        self.line(format_args!(
            "mad.lo.u32 %index, %everyone, {IN_FLIGHT}, %index;"
        ));
        self.line(format_args!("bra {top};"));
        self.place(&done);
    }

    /// Every block of the lane waits here until all have arrived (one block: the
    /// block barrier alone). The arrival counter's last arriver resets it and bumps
    /// the generation the others spin on.
    fn lane_barrier(&mut self) {
        let done = self.label("barrier_done");
        let waited = self.label("barrier_waited");
        let spin = self.label("barrier_spin");
        let leave = self.label("barrier_leave");
        self.block_barrier();
        self.line(format_args!("@!%multi bra {done};"));
        self.line(format_args!("@!%leader bra {waited};"));
        self.line(format_args!("fence.acq_rel.gpu;"));
        self.line(format_args!(
            "ld.acquire.gpu.global.u32 %generation, [%device+{DEVICE_GENERATION}];"
        ));
        self.line(format_args!(
            "atom.acq_rel.gpu.global.add.u32 %arrived, [%device+{DEVICE_ARRIVALS}], 1;"
        ));
        self.line(format_args!("setp.ne.u32 %past, %arrived, %last_arrival;"));
        self.line(format_args!("@%past bra {spin};"));
        self.line(format_args!(
            "st.relaxed.gpu.global.u32 [%device+{DEVICE_ARRIVALS}], 0;"
        ));
        self.line(format_args!(
            "red.release.gpu.global.add.u32 [%device+{DEVICE_GENERATION}], 1;"
        ));
        self.line(format_args!("bra {leave};"));
        self.place(&spin);
        self.line(format_args!(
            "ld.acquire.gpu.global.u32 %current, [%device+{DEVICE_GENERATION}];"
        ));
        self.line(format_args!("setp.eq.u32 %past, %current, %generation;"));
        self.line(format_args!("@%past bra {spin};"));
        self.place(&leave);
        self.line(format_args!("fence.acq_rel.gpu;"));
        self.place(&waited);
        self.block_barrier();
        self.place(&done);
    }

    /// Every fixpoint iteration: this block's workgroups, each a call of the
    /// requested body and a block barrier; a lane barrier between iterations.
    fn run_workgroups(&mut self, bodies: usize) {
        let _ = writeln!(
            self.out,
            "\n\t// ---- the grid: this block's workgroups, every iteration"
        );
        self.line(format_args!("mov.u64 %begun, %globaltimer;"));
        self.comment("block 0's stamps, for a publisher of another block (before block 0 arrives)");
        self.block_zero_leader_with_others(
            "st.relaxed.gpu.global.v2.u64 [%stamps], {%start, %begun};",
        );
        self.line(format_args!("mov.u32 %iteration, 0;"));
        self.place("$L_lane_iteration");
        self.line(format_args!("mov.u32 %group, %block;"));
        self.place("$L_lane_group");
        self.line(format_args!("setp.ge.u32 %past, %group, %total;"));
        self.line(format_args!("@%past bra $L_lane_groups_done;"));
        self.line(format_args!("mov.u32 %group_x, %group;"));
        self.line(format_args!("mov.u32 %group_y, 0;"));
        self.line(format_args!("mov.u32 %group_z, 0;"));
        self.line(format_args!("@%flat bra $L_lane_group_ready;"));
        self.line(format_args!("rem.u32 %group_x, %group, %grid_x;"));
        self.line(format_args!("div.u32 %rest, %group, %grid_x;"));
        self.line(format_args!("rem.u32 %group_y, %rest, %grid_y;"));
        self.line(format_args!("div.u32 %group_z, %rest, %grid_y;"));
        self.place("$L_lane_group_ready");
        for body in 0..bodies {
            self.line(format_args!("setp.eq.u32 %take, %kernel, {body};"));
            self.line(format_args!("@%take bra.uni $L_lane_body_{body};"));
        }
        self.comment("no such body: nothing runs, the status says so");
        self.line(format_args!(
            "mov.u32 %status, {AREA_STATUS_UNKNOWN_KERNEL};"
        ));
        self.line(format_args!("bra.uni $L_lane_body_done;"));
        for body in 0..bodies {
            let name = lane_body_name(body);
            self.place(&format!("$L_lane_body_{body}"));
            self.line(format_args!("{{"));
            let params: Vec<String> = ["x", "y", "z"]
                .iter()
                .map(|axis| format!("vyre_lane_argument_{axis}"))
                .collect();
            for (param, register) in params.iter().zip(["%group_x", "%group_y", "%group_z"]) {
                self.line(format_args!(".param .b32 {param};"));
                self.line(format_args!("st.param.b32 [{param}], {register};"));
            }
            self.line(format_args!(".param .b64 vyre_lane_argument_record;"));
            self.line(format_args!(
                "st.param.b64 [vyre_lane_argument_record], %record;"
            ));
            self.line(format_args!(
                "call {name}, ({}, vyre_lane_argument_record);",
                params.join(", ")
            ));
            self.line(format_args!("}}"));
            self.line(format_args!("bra.uni $L_lane_body_done;"));
        }
        self.place("$L_lane_body_done");
        self.comment("no thread starts the next workgroup (or zeroes its memory) before all finished this one");
        self.block_barrier();
        self.line(format_args!("add.u32 %group, %group, %blocks;"));
        self.line(format_args!("bra $L_lane_group;"));
        self.place("$L_lane_groups_done");
        self.line(format_args!("add.u32 %iteration, %iteration, 1;"));
        self.line(format_args!("setp.ge.u32 %past, %iteration, %iterations;"));
        self.line(format_args!("@%past bra $L_lane_complete;"));
        self.lane_barrier();
        self.line(format_args!("bra $L_lane_iteration;"));
    }

    /// Arrival (more than one block: the last arriving block publishes), the
    /// readback copies, the area header, the publish fence and the completion word;
    /// then the next ticket. The stop path ends the kernel.
    fn complete(&mut self) {
        let _ = writeln!(
            self.out,
            "\n\t// ---- completion: the last block to arrive copies the readbacks and publishes"
        );
        self.place("$L_lane_complete");
        self.line(format_args!("@!%multi bra $L_lane_publish;"));
        self.block_barrier();
        self.line(format_args!("@!%leader bra $L_lane_arrived;"));
        self.line(format_args!("fence.acq_rel.gpu;"));
        self.comment(
            "the last arrival resets the counter inside its own atomic (inc wraps at the last \
             arrival's count): no second write of the counter (a store of 0, a take-back) that \
             the next request's first arrival would have to follow; the reset is performed when \
             the arrival returns, before the publish it decides",
        );
        self.line(format_args!(
            "atom.acq_rel.gpu.global.inc.u32 %arrived, [%device+{DEVICE_ARRIVALS}], %last_arrival;"
        ));
        self.line(format_args!("setp.eq.u32 %take, %arrived, %last_arrival;"));
        self.line(format_args!("selp.u32 %publishing, 1, 0, %take;"));
        self.line(format_args!("st.shared.u32 [%state+8], %publishing;"));
        self.place("$L_lane_arrived");
        self.block_barrier();
        self.line(format_args!("ld.shared.u32 %publishing, [%state+8];"));
        self.line(format_args!("setp.eq.u32 %past, %publishing, 0;"));
        self.line(format_args!("@%past bra $L_lane_served;"));
        self.place("$L_lane_publish");
        self.line(format_args!("mov.u64 %done, %globaltimer;"));
        self.windows();
        // Ranges after the windows: this block's threads, each range in turn.
        self.for_each_entry(
            "ranges",
            "%readback_at",
            "%windows",
            "%readbacks",
            "%source_address",
            |this, next| {
                this.line(format_args!("cvt.u64.u32 %offset, %source;"));
                this.line(format_args!("shl.b64 %offset, %offset, 1;"));
                this.line(format_args!("add.s64 %destination, %area, %offset;"));
                this.flagged_copy(next);
            },
        );
        self.block_barrier();
        self.line(format_args!("@!%leader bra $L_lane_served;"));
        self.line(format_args!("mov.u64 %end, %globaltimer;"));
        self.comment(
            "block 0's leader holds the start and first-workgroup stamps; another publisher reads \
             them back",
        );
        self.line(format_args!(
            "@!%dispatcher ld.relaxed.gpu.global.v2.u64 {{%start, %begun}}, [%stamps];"
        ));
        self.nanoseconds_since("%begun_ns", "%begun", "%start");
        self.nanoseconds_since("%done_ns", "%done", "%start");
        self.line(format_args!("mov.u32 %value, 0;"));
        self.line(format_args!("mov.b64 {{%start_low, %start_high}}, %start;"));
        self.line(format_args!("mov.b64 {{%end_low, %end_high}}, %end;"));
        self.comment(
            "the header's twelve flagged words; the host delivers once every word of the header \
             and the readbacks carries this request's flag",
        );
        // The named words up to the reserved bytes, then zeros to the header's end.
        let named = [
            "%start_low",
            "%start_high",
            "%end_low",
            "%end_high",
            "%status",
            "%want",
            "%begun_ns",
            "%done_ns",
        ];
        const _: () = assert!(AREA_RESERVED == 8 * FLAGGED_DATA_BYTES);
        const _: () = assert!((AREA_HEADER_BYTES / FLAGGED_DATA_BYTES).is_multiple_of(2));
        let reserved = (AREA_HEADER_BYTES - AREA_RESERVED) / FLAGGED_DATA_BYTES;
        let header: Vec<&str> = named
            .into_iter()
            .chain(std::iter::repeat_n("%value", reserved))
            .collect();
        for (pair, words) in header.chunks(2).enumerate() {
            self.line(format_args!("mov.b64 %pair_a, {{{}, %want}};", words[0]));
            self.line(format_args!("mov.b64 %pair_b, {{{}, %want}};", words[1]));
            self.line(format_args!(
                "st.relaxed.sys.global.v2.u64 [%area+{}], {{%pair_a, %pair_b}};",
                2 * FLAGGED_WORD_BYTES * pair
            ));
        }
        self.comment(
            "the publish fence, after every result word (the host's delivery does not wait for \
             it) and before the completion word: every output in device memory is visible at \
             GPU scope before the completion word can be seen (the leader observed every \
             thread's stores through the barriers, and every other block's through the \
             arrival; fences are cumulative)",
        );
        self.line(format_args!("fence.acq_rel.gpu;"));
        self.comment(
            "the last ticket served, for the host's waits that order later device work after \
             this request and retire it; relaxed: nothing waits for host memory",
        );
        self.line(format_args!("cvt.u64.u32 %served, %want;"));
        self.line(format_args!(
            "st.relaxed.sys.global.u64 [%completion], %served;"
        ));
        self.line(format_args!("@!%multi bra $L_lane_served;"));
        self.comment(
            "several blocks: the request is published, for block 0's wait before the next \
             request; a release, so it follows every access of this request by every block (the \
             barriers and the arrival) and the completion word (whose next store, by the next \
             request's publisher, then comes after this one)",
        );
        self.line(format_args!(
            "st.release.gpu.global.u32 [%device+{DEVICE_PUBLISHED}], %want;"
        ));
        self.place("$L_lane_served");
        self.line(format_args!("add.u32 %ticket, %ticket, 1;"));
        self.line(format_args!("bra $L_lane_next;"));
        self.place("$L_lane_stop");
        self.line(format_args!("exit;"));
    }

    /// The poller warps' loop (block 0; the other blocks' pollers leave, as do every
    /// poller warp's threads but its first). A poller times [`ROUND_TRIP_SAMPLES`]
    /// loads of its first doorbell copy and keeps the shortest as one round trip to
    /// host memory; poller `p` of `P` then starts each ticket's polling `p / P` of that
    /// round trip after the leader asked for it, so the pollers' loads reach host memory
    /// spread over a round trip, and a ring waits for the next of them rather than for
    /// one poller's next load. Each poller loads the slot's doorbell with
    /// `ld.acquire.sys` until its ticket field is the one the leader waits for, or
    /// another poller saw it first; the one that sees it stores the value into the
    /// ticket's word with a release exchange (the leader's acquire of it orders every
    /// later access after what the host released with the doorbell). Between tickets a
    /// poller sleeps on the leader's word with `nanosleep` (no global loads while a
    /// request runs), and a poller that learns of a stop leaves.
    fn poll_for_block_zero(&mut self) {
        let Some(Pollers {
            warps,
            first_thread,
            ..
        }) = self.pollers
        else {
            return;
        };
        let _ = writeln!(
            self.out,
            "\n\t// ---- doorbell pollers: the first thread of each poller warp of block 0"
        );
        self.place("$L_lane_poller");
        self.lines(&[
            "@!%dispatcher bra $L_lane_stop;",
            "and.b32 %poller_seen, %lin, 31;",
            "setp.ne.u32 %beyond, %poller_seen, 0;",
            "@%beyond bra $L_lane_stop;",
        ]);
        self.comment(
            "one round trip to host memory, the least of several: a load, then the time once its \
             value is in (the acquire's cache invalidation waits for the load before the \
             timer read: CCTL.IVALL in the H200's SASS; bit 63 of a doorbell is 0 until a stop)",
        );
        self.line(format_args!("sub.u32 %poller_index, %lin, {first_thread};"));
        self.line(format_args!("shr.u32 %poller_index, %poller_index, 5;"));
        self.line(format_args!(
            "mul.wide.u32 %poller_offset, %poller_index, {DOORBELL_STRIDE};"
        ));
        self.lines(&[
            "add.s64 %poller_seen_at, %doorbells, %poller_offset;",
            "mov.u64 %poller_stagger, -1;",
            "mov.u32 %poller_want, 0;",
        ]);
        self.place("$L_lane_poller_round_trip");
        self.lines(&[
            "mov.u64 %poller_now, %globaltimer;",
            "ld.acquire.sys.global.u64 %poller_bell, [%poller_seen_at];",
            "shr.u64 %poller_offset, %poller_bell, 63;",
            "mov.u64 %poller_until, %globaltimer;",
            "setp.ne.u64 %beyond, %poller_offset, 0;",
            "@%beyond bra $L_lane_stop;",
            "sub.u64 %poller_until, %poller_until, %poller_now;",
            "min.u64 %poller_stagger, %poller_stagger, %poller_until;",
            "add.u32 %poller_want, %poller_want, 1;",
        ]);
        self.line(format_args!(
            "setp.lt.u32 %poller_wait, %poller_want, {ROUND_TRIP_SAMPLES};"
        ));
        self.lines(&[
            "@%poller_wait bra $L_lane_poller_round_trip;",
            "cvt.u64.u32 %poller_offset, %poller_index;",
            "mul.lo.u64 %poller_stagger, %poller_stagger, %poller_offset;",
        ]);
        self.line(format_args!(
            "div.u64 %poller_stagger, %poller_stagger, {warps};"
        ));
        self.line(format_args!("mov.u32 %poller_done, 0;"));
        self.place("$L_lane_poller_idle");
        self.lines(&[
            "atom.relaxed.cta.shared.or.b32 %poller_want, [%watch], 0;",
            "setp.eq.u32 %poller_rest, %poller_want, %poller_done;",
            "@!%poller_rest bra $L_lane_poller_new;",
        ]);
        self.line(format_args!("nanosleep.u32 {POLLER_IDLE_SLEEP_NS};"));
        self.lines(&["bra $L_lane_poller_idle;"]);
        self.place("$L_lane_poller_new");
        self.answer_word([
            "%poller_want",
            "%poller_seen",
            "%poller_offset",
            "%poller_seen_at",
        ]);
        self.lines(&[
            "sub.u32 %poller_slot, %poller_want, 1;",
            "rem.u32 %poller_slot, %poller_slot, %slots;",
        ]);
        self.comment("this poller's copy of the slot's doorbell");
        self.line(format_args!(
            "mad.lo.u32 %poller_slot, %poller_slot, {warps}, %poller_index;"
        ));
        self.line(format_args!(
            "mul.wide.u32 %poller_offset, %poller_slot, {DOORBELL_STRIDE};"
        ));
        self.lines(&[
            "add.s64 %poller_bell_at, %doorbells, %poller_offset;",
            "mov.u64 %poller_now, %globaltimer;",
            "add.u64 %poller_until, %poller_now, %poller_stagger;",
        ]);
        self.comment("this poller's share of the round trip (another may see the ring meanwhile)");
        self.place("$L_lane_poller_stagger");
        self.answered_by_another();
        self.lines(&[
            "mov.u64 %poller_now, %globaltimer;",
            "setp.lt.u64 %poller_wait, %poller_now, %poller_until;",
            "@%poller_wait bra $L_lane_poller_stagger;",
        ]);
        self.place("$L_lane_poller_poll");
        self.lines(&[
            "ld.acquire.sys.global.u64 %poller_bell, [%poller_bell_at];",
            "cvt.u32.u64 %poller_seen, %poller_bell;",
            "setp.eq.u32 %poller_hit, %poller_seen, %poller_want;",
            "@%poller_hit atom.release.cta.shared.exch.b64 %poller_offset, [%poller_seen_at], %poller_bell;",
            "@%poller_hit bra $L_lane_poller_answered;",
        ]);
        self.answered_by_another();
        self.lines(&[
            "@%sleeping nanosleep.u32 %sleep;",
            "bra $L_lane_poller_poll;",
        ]);
        self.place("$L_lane_poller_answered");
        self.line(format_args!("mov.u32 %poller_done, %poller_want;"));
        self.line(format_args!(
            "and.b64 %poller_offset, %poller_bell, {DOORBELL_STOP};"
        ));
        self.lines(&[
            "setp.ne.u64 %beyond, %poller_offset, 0;",
            "@%beyond bra $L_lane_stop;",
            "bra $L_lane_poller_idle;",
        ]);
    }

    /// `into` = the address of the answer word for the ticket field in register `want`
    /// ([`WATCH_ANSWERS_AT`]), with `parity` and `offset` as scratch: the one place
    /// that says where a ticket's answer lies, for the leader that waits on it and the
    /// pollers that write it.
    fn answer_word(&mut self, [want, parity, offset, into]: [&str; 4]) {
        self.line(format_args!("and.b32 {parity}, {want}, 1;"));
        self.line(format_args!("mul.wide.u32 {offset}, {parity}, 8;"));
        self.line(format_args!("add.s64 {into}, %watch, {offset};"));
        self.line(format_args!("add.s64 {into}, {into}, {WATCH_ANSWERS_AT};"));
    }

    /// A poller's look at the answer word of its ticket: on to
    /// `$L_lane_poller_answered` (the doorbell's value in `%poller_bell`) when another
    /// poller already saw the ticket.
    fn answered_by_another(&mut self) {
        self.lines(&[
            "atom.relaxed.cta.shared.or.b64 %poller_bell, [%poller_seen_at], 0;",
            "cvt.u32.u64 %poller_seen, %poller_bell;",
            "setp.eq.u32 %poller_hit, %poller_seen, %poller_want;",
            "@%poller_hit bra $L_lane_poller_answered;",
        ]);
    }

    /// Lines of constant text, one instruction each.
    fn lines(&mut self, lines: &[&str]) {
        for line in lines {
            self.line(format_args!("{line}"));
        }
    }

    /// `into` (u32) = `later - earlier` nanoseconds (u64 stamps), saturating at
    /// `u32::MAX`.
    fn nanoseconds_since(&mut self, into: &str, later: &str, earlier: &str) {
        self.line(format_args!("sub.u64 %wide, {later}, {earlier};"));
        self.line(format_args!("min.u64 %wide, %wide, {};", u32::MAX));
        self.line(format_args!("cvt.u32.u64 {into}, %wide;"));
    }

    /// The windows: descriptor `w < %windows` names an aligned 16-byte block; this
    /// block's threads take windows `lin, lin + T, ...`, [`batch_for`] in flight each: the
    /// descriptors, then the loads, then the stores.
    ///
    /// Every slot of a batch reads a descriptor, the last one where its own is past
    /// `%windows`, and loads that window: nothing is predicated before the stores. A
    /// predicated load into a register the slots share made ptxas carry the register's
    /// old value from slot to slot, so each slot's shared-memory load waited for the
    /// previous slot's (two chains of sixteen in the SASS of a one-thread lane), and
    /// the last window's global load started only after them (the dispatch bench's
    /// readback phase, H200, 2026-12-03: 0.80 and 0.93 µs for 8 and 16 windows then,
    /// 0.61 and 0.74 µs now). A slot past the count
    /// loads the last window again, which is a real window of the request, and stores
    /// nothing. The descriptor lands in the registers its window's bytes then replace,
    /// and its area offset in the slot's unit index (the stores take their slot's
    /// liveness from the loop's index), so the batch needs no register more than the
    /// chained form did (with two 64-bit registers more a slot, ptxas spilled).
    fn windows(&mut self) {
        let batch = self.window_batch;
        self.line(format_args!("sub.u32 %last_window, %windows, 1;"));
        self.thread_batches("windows", "%windows", batch, |this| {
            for k in 0..batch {
                this.line(format_args!(
                    "min.u32 %window_unit, %unit{k}, %last_window;"
                ));
                this.entry_at("%window_unit", "%readback_at");
                let v = vector(k);
                this.line(format_args!("ld.shared.v4.u32 {v}, [%at];"));
            }
            for k in 0..batch {
                let [low, high, _, offset] = [0, 1, 2, 3].map(|word| format!("%v{}", 4 * k + word));
                this.line(format_args!("mov.u32 %unit{k}, {offset};"));
                this.line(format_args!("mov.b64 %from, {{{low}, {high}}};"));
                this.line(format_args!("cvta.to.global.u64 %from, %from;"));
                let v = vector(k);
                this.line(format_args!("ld.relaxed.gpu.global.v4.u32 {v}, [%from];"));
            }
            let threads = this.threads as usize;
            for k in 0..batch {
                this.line(format_args!(
                    "add.u32 %window_unit, %index, {};",
                    threads * k
                ));
                this.line(format_args!("setp.lt.u32 %live, %window_unit, %windows;"));
                this.line(format_args!("cvt.u64.u32 %offset, %unit{k};"));
                this.line(format_args!("shl.b64 %offset, %offset, 1;"));
                this.line(format_args!("add.s64 %to, %area, %offset;"));
                this.store_flagged_block(k, "%live");
            }
        });
    }

    /// Batch slot `k`'s vector (16 logical bytes) as four flagged words at `%to`: two
    /// strong 16-byte stores, each word's data and flag in one 8-byte element.
    fn store_flagged_block(&mut self, k: usize, predicate: &str) {
        for half in 0..2 {
            let first = 4 * k + 2 * half;
            self.line(format_args!("mov.b64 %pair_a, {{%v{first}, %want}};"));
            self.line(format_args!("mov.b64 %pair_b, {{%v{}, %want}};", first + 1));
            self.line(format_args!(
                "@{predicate} st.relaxed.sys.global.v2.u64 [%to+{}], {{%pair_a, %pair_b}};",
                2 * FLAGGED_WORD_BYTES * half
            ));
        }
    }

    /// A readback range as flagged words: `%bytes` bytes from `%source_address` to the
    /// words at `%destination` (its logical offset doubled), this block's threads
    /// sharing the work, [`IN_FLIGHT`] units in flight each. Whole 16-byte units when
    /// the source is 16-byte aligned, then word by word (a 4-byte load when the source
    /// is 4-byte aligned and the word whole, bytes otherwise: a last partial word's
    /// missing bytes are zero). Falls through to `after`'s predecessor.
    fn flagged_copy(&mut self, after: &str) {
        let words = self.label("flagged_words");
        self.line(format_args!("add.u32 %words, %bytes, 3;"));
        self.line(format_args!("shr.u32 %words, %words, 2;"));
        self.line(format_args!("cvt.u32.u64 %align, %source_address;"));
        self.line(format_args!("and.b32 %low, %align, 15;"));
        self.line(format_args!("setp.eq.u32 %wide_unit, %low, 0;"));
        self.line(format_args!("and.b32 %low, %align, 3;"));
        self.line(format_args!("setp.eq.u32 %word_unit, %low, 0;"));
        self.line(format_args!("mov.u32 %done_units, 0;"));
        self.line(format_args!("@!%wide_unit bra {words};"));
        // Whole 16-byte units: one vector load, four flagged words.
        self.line(format_args!("shr.u32 %units, %bytes, 4;"));
        self.thread_batches("flagged_blocks", "%units", IN_FLIGHT, |this| {
            this.flagged_blocks()
        });
        self.line(format_args!("shl.b32 %done_units, %units, 2;"));
        // The words left: word `%done_units + u` for units `u < %units`.
        self.place(&words);
        self.line(format_args!("sub.u32 %units, %words, %done_units;"));
        self.thread_batches("flagged_word", "%units", IN_FLIGHT, |this| {
            this.flagged_words()
        });
        self.line(format_args!("bra {after};"));
    }

    /// A loop over units `%lin, %lin + T, ...` below `count` of this block's threads,
    /// `batch` a batch (`%unit{k}`), each batch written by `body` (its loads, then its
    /// stores: the next batch's loads wait for them).
    fn thread_batches(&mut self, kind: &str, count: &str, batch: usize, body: impl Fn(&mut Self)) {
        let t = self.threads;
        let top = self.label(kind);
        let done = self.label(&format!("{kind}_done"));
        self.line(format_args!("mov.u32 %index, %lin;"));
        self.place(&top);
        self.line(format_args!("setp.ge.u32 %past, %index, {count};"));
        self.line(format_args!("@%past bra {done};"));
        self.batch_indices("%index", t, batch);
        body(self);
        self.line(format_args!(
            "add.u32 %index, %index, {};",
            t as usize * batch
        ));
        self.line(format_args!("bra {top};"));
        self.place(&done);
    }

    /// One batch of whole 16-byte units: a vector load each, four flagged words.
    fn flagged_blocks(&mut self) {
        for k in 0..IN_FLIGHT {
            self.live(k, "%units");
            self.line(format_args!("mul.wide.u32 %at, %unit{k}, 16;"));
            self.line(format_args!("add.s64 %from, %source_address, %at;"));
            let v = vector(k);
            self.line(format_args!(
                "@%live ld.relaxed.gpu.global.v4.u32 {v}, [%from];"
            ));
        }
        for k in 0..IN_FLIGHT {
            self.live(k, "%units");
            self.line(format_args!("mul.wide.u32 %at, %unit{k}, 32;"));
            self.line(format_args!("add.s64 %to, %destination, %at;"));
            self.store_flagged_block(k, "%live");
        }
    }

    /// One batch of words: a 4-byte load for a whole word of a 4-byte aligned source,
    /// byte loads otherwise (a last partial word's missing bytes are zero).
    fn flagged_words(&mut self) {
        for k in 0..IN_FLIGHT {
            let base = 4 * k;
            self.live(k, "%units");
            self.line(format_args!("add.u32 %unit{k}, %unit{k}, %done_units;"));
            for word in 0..4 {
                self.line(format_args!("mov.u32 %v{}, 0;", base + word));
            }
            self.line(format_args!("shl.b32 %low, %unit{k}, 2;"));
            self.line(format_args!("cvt.u64.u32 %at, %low;"));
            self.line(format_args!("add.s64 %from, %source_address, %at;"));
            self.line(format_args!("add.u32 %align, %low, 4;"));
            self.line(format_args!("setp.le.u32 %whole, %align, %bytes;"));
            self.line(format_args!("and.pred %whole, %whole, %word_unit;"));
            self.line(format_args!("and.pred %whole, %whole, %live;"));
            self.line(format_args!(
                "@%whole ld.relaxed.gpu.global.u32 %v{base}, [%from];"
            ));
            self.line(format_args!("and.pred %bytewise, %live, !%whole;"));
            for byte in 0..4 {
                self.line(format_args!("add.u32 %align, %low, {byte};"));
                self.line(format_args!("setp.lt.u32 %take, %align, %bytes;"));
                self.line(format_args!("and.pred %take, %take, %bytewise;"));
                self.line(format_args!(
                    "@%take ld.relaxed.gpu.global.u8 %v{}, [%from+{byte}];",
                    base + byte
                ));
            }
        }
        for k in 0..IN_FLIGHT {
            let base = 4 * k;
            self.line(format_args!("sub.u32 %rest, %unit{k}, %done_units;"));
            self.line(format_args!("setp.lt.u32 %live, %rest, %units;"));
            for byte in 1..4 {
                self.line(format_args!(
                    "shl.b32 %v{}, %v{}, {};",
                    base + byte,
                    base + byte,
                    8 * byte
                ));
                self.line(format_args!(
                    "or.b32 %v{base}, %v{base}, %v{};",
                    base + byte
                ));
            }
            self.line(format_args!("mov.b64 %pair_a, {{%v{base}, %want}};"));
            self.line(format_args!(
                "mul.wide.u32 %at, %unit{k}, {FLAGGED_WORD_BYTES};"
            ));
            self.line(format_args!("add.s64 %to, %destination, %at;"));
            self.line(format_args!(
                "@%live st.relaxed.sys.global.u64 [%to], %pair_a;"
            ));
        }
    }
}

/// `{%v4k, %v4k+1, %v4k+2, %v4k+3}`: batch slot `k`'s vector.
fn vector(k: usize) -> String {
    let base = 4 * k;
    format!(
        "{{%v{}, %v{}, %v{}, %v{}}}",
        base,
        base + 1,
        base + 2,
        base + 3
    )
}

/// Batch slot `k`'s value operand for a unit of `unit` bytes.
fn value_operand(unit: u32, k: usize) -> String {
    if unit == 16 {
        vector(k)
    } else {
        format!("%v{}", 4 * k)
    }
}
