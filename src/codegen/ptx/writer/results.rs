//! The result ABI's prologue and epilogue (see `ptx::results` in the module docs of
//! [`crate::codegen::ptx`]): the kernel stamps its own device time with
//! `%globaltimer` and its last finishing thread copies the small readback ranges into
//! host-mapped memory, so a dispatch needs no event records and no DMA copy per
//! output.
//!
//! Finding the last thread costs one same-address atomic on the control word per
//! group of converged lanes when each group counts itself there, and such atomics
//! serialise at one L2 slice: a 16 MiB tokenizer chunk ran about 1.02 M of them
//! (`pieces` 524 K warps, `classify`, `phases` and `count` 131 K each), an estimated
//! 0.5–1 ms of its ~5 ms of kernels. So a block of several warps counts its finished
//! threads in shared memory first, and only the group that completes the block
//! fences at device scope and adds the whole block to the control word: one device
//! atomic per block (`count_block`, whose comment holds the memory-model argument).

use std::fmt::Write;

use super::workgroup_memory::{self, MAX_STATIC_SHARED_BYTES};
use super::{RegClass, Writer, RESULT_RANGE_SLOTS};

/// The label every thread reaches when it is done with the body (the normal end and
/// every `return`).
pub(super) const RESULTS_LABEL: &str = "$L_vyre_results";

/// Units (words or bytes) each lane of the strided loop has in flight at once.
const UNROLL: u32 = 4;

/// Bytes of one range descriptor in `vyre_ranges`: a window's u64 source block and
/// u64 destination address, or a looped range's u64 source address, u32 length and
/// u32 destination offset.
const DESCRIPTOR_BYTES: usize = 16;

const _: () = assert!(RESULT_RANGE_SLOTS * DESCRIPTOR_BYTES == 256);

/// Window slots the leader handles per group: one branch out per group, then the
/// group's descriptor words read back to back and its copies predicated per slot.
/// Reading each slot's descriptor after its own branch made every vector load wait
/// for its own constant load (measured on the H200, 2026-12-01, one-thread fixture:
/// 16 windows cost 1.06 µs that way, against 0.4 µs for 16 vector copies with
/// their addresses at hand, `EpilogueAnatomy`).
const WINDOW_GROUP: usize = 8;

const _: () = assert!(RESULT_RANGE_SLOTS.is_multiple_of(WINDOW_GROUP));

/// The extra kernel parameters, after the element counts, with their roles.
pub(super) const RESULT_PARAMETERS: [(&str, &str); 5] = [
    (
        ".u64 vyre_control",
        "device control block: [0] u64 finished threads, [8] u64 earliest block start",
    ),
    (
        ".u64 vyre_results",
        "host-mapped result area: [0] u64 start stamp, [8] u64 end stamp, then readback bytes",
    ),
    (
        ".u32 vyre_launch_flags",
        "bit 0: write the start stamp, bit 1: the end stamp; bits 8-15: leading descriptors that are 16-byte windows",
    ),
    (
        ".u32 vyre_range_count",
        "valid descriptors in vyre_ranges (copied by the last thread)",
    ),
    (
        ".align 8 .b8 vyre_ranges[256]",
        "16 descriptors: windows (u64 source block, u64 destination), then ranges (u64 source, u32 bytes, u32 offset)",
    ),
];

/// The shared word a block's finished threads are counted in (kernel `i` of a
/// module of several: `vyre_block_finished_<i>`; `.shared` symbols are
/// module-scope). No workgroup buffer's symbol starts this way (theirs are
/// `vyre_shared_...`), and kernels that use the dynamic pool never declare it.
const BLOCK_COUNTER_SYMBOL: &str = "vyre_block_finished";

/// Bytes of static shared memory the block counter adds to a kernel.
const BLOCK_COUNTER_BYTES: u32 = 4;

/// Lanes of a warp: a block of at most this many threads is one warp, which the
/// per-group count already finishes with one global atomic when it converges.
const WARP_LANES: u32 = 32;

impl Writer<'_> {
    /// Decides whether this kernel counts finished threads per block and, if so,
    /// stores the counter's zero from local thread 0; the caller follows it with
    /// the entry barrier. Says whether it did.
    ///
    /// Counting per block needs a block of more than one warp (a one-warp block's
    /// converged warp is already one atomic) and room for the counter in static
    /// shared memory: a kernel whose workgroup buffers are within
    /// [`BLOCK_COUNTER_BYTES`] of the static limit, or past it (the dynamic pool,
    /// sized up to the device's opt-in limit), keeps one global atomic per group.
    ///
    /// Why a store and a barrier at entry: shared memory starts undefined in every
    /// block, and an early `return` can bring a warp to the epilogue while another
    /// warp of its block has not started its body, so the zero must be in place
    /// before any thread can pass the entry. At entry every thread of the block is
    /// present and none has returned, so the barrier cannot wait on an exited or
    /// waiting thread; the epilogue itself stays free of barriers (a thread that
    /// waited there would hold up threads still waiting at a body barrier for it).
    /// A kernel with workgroup buffers already waits at entry (after zeroing them),
    /// so for it the counter costs one store.
    pub(super) fn zero_block_counter(&mut self) -> bool {
        let program = self.program;
        let threads = program.threads_per_workgroup().unwrap_or(1);
        let (_, workgroup_bytes) = workgroup_memory::layout(program);
        let room = workgroup_bytes
            .checked_add(BLOCK_COUNTER_BYTES)
            .is_some_and(|bytes| bytes <= MAX_STATIC_SHARED_BYTES);
        if threads <= WARP_LANES || !room {
            return false;
        }
        self.block_counter = true;
        emit!(
            self,
            "// result ABI: local thread 0 zeroes the block's finished-thread counter"
        );
        let linear = self.local_linear_id();
        let first = self.reg(RegClass::Pred);
        emit!(self, "setp.eq.u32 {first}, {linear}, 0;");
        emit!(
            self,
            "@{first} st.shared.u32 [{}], 0;",
            self.block_counter_symbol()
        );
        true
    }

    /// The block counter's declaration (module text, before the entry).
    pub(super) fn declare_block_counter(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "// result ABI: threads of this block that finished\n\
             .shared .align 4 .u32 {};",
            self.block_counter_symbol()
        );
    }

    /// [`BLOCK_COUNTER_SYMBOL`], or kernel `index`'s own in a module of several.
    fn block_counter_symbol(&self) -> std::borrow::Cow<'static, str> {
        match self.module_kernel {
            None => BLOCK_COUNTER_SYMBOL.into(),
            Some(kernel) => format!("{BLOCK_COUNTER_SYMBOL}_{kernel}").into(),
        }
    }

    /// The first thread of every block folds its start time into the control block's
    /// earliest-start word (`red.min`), so the last thread can read the earliest one.
    pub(super) fn result_prologue(&mut self) {
        emit!(
            self,
            "// result ABI: the first thread of each block records its start time"
        );
        let linear = self.local_linear_id();
        let not_first = self.reg(RegClass::Pred);
        let skip = self.label("start_stamped");
        emit!(self, "setp.ne.u32 {not_first}, {linear}, 0;");
        emit!(self, "@{not_first} bra {skip};");
        let control = self.reg(RegClass::B64);
        let now = self.reg(RegClass::B64);
        emit!(self, "ld.param.u64 {control}, [vyre_control];");
        emit!(self, "cvta.to.global.u64 {control}, {control};");
        emit!(self, "mov.u64 {now}, %globaltimer;");
        emit!(self, "red.relaxed.gpu.global.min.u64 [{control}+8], {now};");
        self.place(skip);
        self.result_start = Some(now);
    }

    /// Every thread counts itself finished (one atomic per group of converged lanes,
    /// after a release fence; with a block counter, into the block's counter first,
    /// and the block's last group adds the block to the grid's count); the group
    /// holding the last thread of the grid takes the end stamp, writes both stamps,
    /// resets the control block for the next launch and copies the readback ranges
    /// into the mapped area; the host reads them after the stream is synchronised
    /// (kernel completion makes mapped stores visible).
    pub(super) fn result_epilogue(&mut self) {
        let threads = u64::from(self.program.threads_per_workgroup().unwrap_or(1));
        let _ = writeln!(self.body, "{RESULTS_LABEL}:");
        emit!(
            self,
            "// result ABI epilogue: count finished threads; the last copies results out"
        );
        let r = |w: &mut Self, class| w.reg(class);
        let mask = r(self, RegClass::B32);
        let lane = r(self, RegClass::B32);
        let negated = r(self, RegClass::B32);
        let lowest = r(self, RegClass::B32);
        let leader = r(self, RegClass::B32);
        let group = r(self, RegClass::B32);
        let is_leader = r(self, RegClass::Pred);
        let control = r(self, RegClass::B64);
        let single = r(self, RegClass::Pred);
        let last = self.label("results_last");
        // One warp, one block, no lane synchronisation in the body: every lane
        // reaches this point (returns branch here), so one bar.warp.sync over the
        // whole warp finds the last thread without any atomic, and lane 0's own start
        // register is the earliest start (no control-block round trips).
        let start_register = self.result_start;
        match start_register {
            Some(entry_start) if threads <= 32 && !self.synchronises => {
                let whole = if threads == 32 {
                    u32::MAX
                } else {
                    (1u32 << threads) - 1
                };
                let general = self.label("results_general");
                // One block: nctaid is (1, 1, 1) (compared per axis: a product could wrap).
                let mut first = true;
                for axis in ["x", "y", "z"] {
                    let count = self.special("nctaid", axis);
                    if first {
                        emit!(self, "setp.eq.u32 {single}, {count}, 1;");
                        first = false;
                    } else {
                        emit!(self, "setp.eq.and.u32 {single}, {count}, 1, {single};");
                    }
                }
                emit!(self, "@!{single} bra {general};");
                emit!(self, "bar.warp.sync {whole};");
                emit!(self, "mov.u32 {mask}, {whole};");
                emit!(self, "mov.u32 {lane}, %laneid;");
                emit!(self, "mov.u32 {group}, {threads};");
                emit!(self, "setp.eq.u32 {is_leader}, {lane}, 0;");
                emit!(self, "ld.param.u64 {control}, [vyre_control];");
                emit!(self, "cvta.to.global.u64 {control}, {control};");
                let _ = entry_start;
                emit!(self, "bra {last};");
                self.place(general);
            }
            _ => {
                let zero = r(self, RegClass::B32);
                emit!(self, "mov.u32 {zero}, 0;");
                emit!(self, "setp.ne.u32 {single}, {zero}, 0;");
            }
        }
        // With a block counter a group first releases at block scope only; the
        // group that completes its block then releases at device scope for all of
        // them (see `count_block`).
        let first_fence = if self.block_counter { "cta" } else { "gpu" };
        emit!(self, "fence.acq_rel.{first_fence};");
        emit!(self, "activemask.b32 {mask};");
        emit!(self, "mov.u32 {lane}, %laneid;");
        emit!(self, "neg.s32 {negated}, {mask};");
        emit!(self, "and.b32 {lowest}, {mask}, {negated};");
        emit!(self, "bfind.u32 {leader}, {lowest};");
        emit!(self, "popc.b32 {group}, {mask};");
        emit!(self, "setp.eq.u32 {is_leader}, {lane}, {leader};");
        emit!(self, "bar.warp.sync {mask};");
        let done = self.label("results_done");
        // Threads this group adds to the grid's count: its own lanes, or with a
        // block counter its whole block (only the block's last group gets here).
        let added = r(self, RegClass::B64);
        if self.block_counter {
            let group = Group {
                mask,
                leader,
                lanes: group,
                is_leader,
            };
            self.count_block(group, threads, done);
            emit!(self, "mov.u64 {added}, {threads};");
        } else {
            emit!(self, "cvt.u64.u32 {added}, {group};");
        }
        let before = r(self, RegClass::B64);
        emit!(self, "ld.param.u64 {control}, [vyre_control];");
        emit!(self, "cvta.to.global.u64 {control}, {control};");
        emit!(self, "mov.u64 {before}, 0;");
        emit!(
            self,
            "@{is_leader} atom.acq_rel.gpu.global.add.u64 {before}, [{control}], {added};"
        );
        let low = r(self, RegClass::B32);
        let high = r(self, RegClass::B32);
        emit!(self, "mov.b64 {{{low}, {high}}}, {before};");
        emit!(
            self,
            "shfl.sync.idx.b32 {low}, {low}, {leader}, 31, {mask};"
        );
        emit!(
            self,
            "shfl.sync.idx.b32 {high}, {high}, {leader}, 31, {mask};"
        );
        emit!(self, "mov.b64 {before}, {{{low}, {high}}};");
        // Orders the group's later loads after its leader's acquiring atomic
        // (bar.warp.sync guarantees memory ordering among its participants).
        emit!(self, "bar.warp.sync {mask};");
        let blocks = r(self, RegClass::B64);
        for axis in ["x", "y", "z"] {
            let count = self.special("nctaid", axis);
            let wide = r(self, RegClass::B64);
            emit!(self, "cvt.u64.u32 {wide}, {count};");
            if axis == "x" {
                emit!(self, "mov.u64 {blocks}, {wide};");
            } else {
                emit!(self, "mul.lo.u64 {blocks}, {blocks}, {wide};");
            }
        }
        let total = r(self, RegClass::B64);
        let arrived = r(self, RegClass::B64);
        let not_last = r(self, RegClass::Pred);
        emit!(self, "mul.lo.u64 {total}, {blocks}, {threads};");
        emit!(self, "add.u64 {arrived}, {before}, {added};");
        emit!(self, "setp.ne.u64 {not_last}, {arrived}, {total};");
        emit!(self, "@{not_last} bra {done};");

        emit!(
            self,
            "// the last group: every other thread's stores are visible from here on"
        );
        emit!(self, "fence.acq_rel.gpu;");
        self.place(last);
        let results = r(self, RegClass::B64);
        let flags = r(self, RegClass::B32);
        emit!(self, "ld.param.u64 {results}, [vyre_results];");
        emit!(self, "cvta.to.global.u64 {results}, {results};");
        emit!(self, "ld.param.u32 {flags}, [vyre_launch_flags];");
        let count = r(self, RegClass::B32);
        emit!(self, "ld.param.u32 {count}, [vyre_range_count];");
        emit!(self, "min.u32 {count}, {count}, {RESULT_RANGE_SLOTS};");
        // The leading descriptors the host marked as windows (flags bits 8-15) are
        // the leader's; the strided loop copies the rest.
        let windows = r(self, RegClass::B32);
        emit!(self, "bfe.u32 {windows}, {flags}, 8, 8;");
        emit!(self, "min.u32 {windows}, {windows}, {count};");
        let copies = self.label("results_copies");
        emit!(self, "@!{is_leader} bra {copies};");
        let end = r(self, RegClass::B64);
        let start = r(self, RegClass::B64);
        let bit = r(self, RegClass::B32);
        let set = r(self, RegClass::Pred);
        let idle = r(self, RegClass::B64);
        emit!(self, "mov.u64 {end}, %globaltimer;");
        // Every load of the leader (the earliest start, the windows) is issued
        // before any store, so together they cost one L2 round trip.
        emit!(
            self,
            "@!{single} ld.relaxed.gpu.global.u64 {start}, [{control}+8];"
        );
        if let Some(entry_start) = start_register {
            emit!(self, "@{single} mov.u64 {start}, {entry_start};");
        }
        let window_words = self.result_window_loads(windows);
        emit!(self, "and.b32 {bit}, {flags}, 1;");
        emit!(self, "setp.ne.u32 {set}, {bit}, 0;");
        emit!(self, "@{set} st.global.u64 [{results}], {start};");
        let bit = r(self, RegClass::B32);
        let set = r(self, RegClass::Pred);
        emit!(self, "and.b32 {bit}, {flags}, 2;");
        emit!(self, "setp.ne.u32 {set}, {bit}, 0;");
        emit!(self, "@{set} st.global.u64 [{results}+8], {end};");
        emit!(self, "mov.u64 {idle}, 0xffffffffffffffff;");
        emit!(self, "st.relaxed.gpu.global.u64 [{control}], 0;");
        emit!(self, "st.relaxed.gpu.global.u64 [{control}+8], {idle};");
        self.result_window_stores(window_words);
        self.place(copies);

        // Each lane of the group copies a strided share of every range after the
        // windows: words when source, length and destination are 4-byte aligned,
        // bytes otherwise.
        let below = r(self, RegClass::B32);
        let rank = r(self, RegClass::B32);
        let descriptor = r(self, RegClass::B64);
        let index = r(self, RegClass::B32);
        emit!(self, "mov.u32 {below}, %lanemask_lt;");
        emit!(self, "and.b32 {below}, {below}, {mask};");
        emit!(self, "popc.b32 {rank}, {below};");
        let skipped = r(self, RegClass::B64);
        emit!(self, "mov.u64 {descriptor}, vyre_ranges;");
        emit!(
            self,
            "mul.wide.u32 {skipped}, {windows}, {DESCRIPTOR_BYTES};"
        );
        emit!(self, "add.s64 {descriptor}, {descriptor}, {skipped};");
        emit!(self, "mov.u32 {index}, {windows};");
        let range = self.label("results_range");
        let copied = self.label("results_copied");
        let next = self.label("results_next");
        let bytes_path = self.label("results_bytes");
        self.place(range);
        let finished = r(self, RegClass::Pred);
        emit!(self, "setp.ge.u32 {finished}, {index}, {count};");
        emit!(self, "@{finished} bra {copied};");
        let source = r(self, RegClass::B64);
        let length = r(self, RegClass::B32);
        let offset = r(self, RegClass::B32);
        let destination = r(self, RegClass::B64);
        let offset_wide = r(self, RegClass::B64);
        emit!(self, "ld.param.u64 {source}, [{descriptor}];");
        emit!(self, "ld.param.u32 {length}, [{descriptor}+8];");
        emit!(self, "ld.param.u32 {offset}, [{descriptor}+12];");
        emit!(self, "cvta.to.global.u64 {source}, {source};");
        emit!(self, "cvt.u64.u32 {offset_wide}, {offset};");
        emit!(self, "add.s64 {destination}, {results}, {offset_wide};");
        let source_low = r(self, RegClass::B32);
        let alignment = r(self, RegClass::B32);
        let unaligned = r(self, RegClass::Pred);
        emit!(self, "cvt.u32.u64 {source_low}, {source};");
        emit!(self, "or.b32 {alignment}, {source_low}, {length};");
        emit!(self, "or.b32 {alignment}, {alignment}, {offset};");
        emit!(self, "and.b32 {alignment}, {alignment}, 3;");
        emit!(self, "setp.ne.u32 {unaligned}, {alignment}, 0;");
        emit!(self, "@{unaligned} bra {bytes_path};");
        for (unit, shift, ty, path_end) in [(4u32, 2u32, "u32", true), (1, 0, "u8", false)] {
            if !path_end {
                self.place(bytes_path);
            }
            let units = r(self, RegClass::B32);
            let position = r(self, RegClass::B32);
            emit!(self, "shr.u32 {units}, {length}, {shift};");
            emit!(self, "mov.u32 {position}, {rank};");
            let top = self.label("results_copy");
            self.place(top);
            let past = r(self, RegClass::Pred);
            emit!(self, "setp.ge.u32 {past}, {position}, {units};");
            emit!(self, "@{past} bra {next};");
            // UNROLL independent loads in flight per lane, then their stores: one
            // L2 round trip per UNROLL units instead of one per unit.
            let mut pending = Vec::with_capacity(UNROLL as usize);
            for step in 0..UNROLL {
                let at = r(self, RegClass::B32);
                let inside = r(self, RegClass::Pred);
                let byte_offset = r(self, RegClass::B64);
                let from = r(self, RegClass::B64);
                let to = r(self, RegClass::B64);
                let value = r(self, RegClass::B32);
                if step == 0 {
                    emit!(self, "mov.u32 {at}, {position};");
                } else {
                    emit!(self, "mad.lo.u32 {at}, {group}, {step}, {position};");
                }
                emit!(self, "setp.lt.u32 {inside}, {at}, {units};");
                emit!(self, "mul.wide.u32 {byte_offset}, {at}, {unit};");
                emit!(self, "add.s64 {from}, {source}, {byte_offset};");
                emit!(self, "add.s64 {to}, {destination}, {byte_offset};");
                emit!(
                    self,
                    "@{inside} ld.relaxed.gpu.global.{ty} {value}, [{from}];"
                );
                pending.push((inside, to, value));
            }
            for (inside, to, value) in pending {
                emit!(self, "@{inside} st.global.{ty} [{to}], {value};");
            }
            let stride = r(self, RegClass::B32);
            emit!(self, "mul.lo.u32 {stride}, {group}, {UNROLL};");
            emit!(self, "add.u32 {position}, {position}, {stride};");
            emit!(self, "bra {top};");
        }
        self.place(next);
        emit!(self, "add.u32 {index}, {index}, 1;");
        emit!(
            self,
            "add.s64 {descriptor}, {descriptor}, {DESCRIPTOR_BYTES};"
        );
        emit!(self, "bra {range};");
        // No system-scope fence: the host reads the area only after the stream is
        // synchronised, and a kernel's stores to mapped memory are visible to the host
        // once the kernel has completed (CUDA's zero-copy rule).
        self.place(copied);
        self.place(done);
        emit!(self, "ret;");
    }

    /// The block stage of the count: the group's leader adds the group's lanes to
    /// the block's shared counter; every group but the one that brings it to the
    /// block's `threads` branches to `done`, and that one fences at device scope
    /// before its leader adds the whole block to the grid's count. One device-scope
    /// fence and one same-address global atomic per block instead of per group
    /// (per warp, in practice).
    ///
    /// Why every thread's stores still reach the grid's last group (PTX memory
    /// consistency model; every step below is one of its synchronizes-with edges
    /// or program order, and causality order is transitive whatever the scope
    /// of each edge, which is what makes fences and releases cumulative):
    /// 1. A lane's stores precede, in program order, its `fence.acq_rel.cta` and
    ///    the group's `bar.warp.sync`, which orders memory among its lanes, so
    ///    they precede the leader's `atom.acq_rel.cta` on the counter.
    /// 2. Every group's counter atomic is a read-modify-write of the same word, at
    ///    the same (block) scope, by threads of one block: each later one reads
    ///    through that chain of atomics, so each earlier release synchronizes
    ///    with the acquire of the block's last group's atomic.
    /// 3. That group's lanes fence at device scope and its leader's
    ///    `atom.acq_rel.gpu` on the control word follows in program order: a
    ///    device-scope release that covers everything before it in causality
    ///    order, the whole block's stores included.
    /// 4. Those device-scope atomics again form one read-modify-write chain on one
    ///    word, so the grid's last group's acquire synchronizes with every
    ///    block's release: its copies read every thread's final stores, and the
    ///    host reads the area only after the kernel completed.
    ///
    /// The counter needs no reset: the entry zeroes it in every block, and each
    /// of the block's threads adds itself exactly once (the epilogue is the only
    /// way out), so exactly one group sees the count reach `threads`.
    fn count_block(&mut self, group: Group, threads: u64, done: super::Label) {
        let Group {
            mask,
            leader,
            lanes,
            is_leader,
        } = group;
        let before = self.reg(RegClass::B32);
        let arrived = self.reg(RegClass::B32);
        let unfinished = self.reg(RegClass::Pred);
        let counter = self.block_counter_symbol();
        emit!(self, "mov.u32 {before}, 0;");
        emit!(
            self,
            "@{is_leader} atom.acq_rel.cta.shared.add.u32 {before}, [{counter}], {lanes};"
        );
        emit!(
            self,
            "shfl.sync.idx.b32 {before}, {before}, {leader}, 31, {mask};"
        );
        emit!(self, "add.u32 {arrived}, {before}, {lanes};");
        emit!(self, "setp.ne.u32 {unfinished}, {arrived}, {threads};");
        emit!(self, "@{unfinished} bra {done};");
        emit!(
            self,
            "// the block's last group: release the whole block at device scope"
        );
        emit!(self, "fence.acq_rel.gpu;");
        emit!(self, "bar.warp.sync {mask};");
    }

    /// The leader's window copies, loads: descriptor `k < windows` names an aligned
    /// 16-byte block of a buffer (the host checked it lies inside the buffer), so
    /// each slot is one vector load with no length or alignment arithmetic. Returns
    /// each group's skip predicate and, per slot, its loaded words.
    ///
    /// Each group of [`WINDOW_GROUP`] slots is jumped over when `windows` does not
    /// reach it, with every later group: predicated-off work is not free (measured
    /// on the H200, 2026-12-01, one-thread fixture: 16 unguarded slots cost 1.5 µs
    /// per dispatch with no range described, against 0.1 µs guarded;
    /// `EpilogueAnatomy`). Inside a group, slots past the count are predicated off.
    fn result_window_loads(&mut self, windows: super::Reg) -> WindowSlots {
        let mut slots = WindowSlots {
            groups: Vec::with_capacity(RESULT_RANGE_SLOTS / WINDOW_GROUP),
            words: Vec::with_capacity(RESULT_RANGE_SLOTS),
            windows,
        };
        let loaded = self.label("results_windows_loaded");
        for group in 0..RESULT_RANGE_SLOTS / WINDOW_GROUP {
            let first = group * WINDOW_GROUP;
            let beyond = self.reg(RegClass::Pred);
            emit!(self, "setp.le.u32 {beyond}, {windows}, {first};");
            emit!(self, "@{beyond} bra {loaded};");
            slots.groups.push(beyond);
            let sources = self.window_group_addresses(first, 0);
            for (slot, source) in (first..).zip(sources) {
                let live = self.window_live(windows, slot);
                let words = [(); 4].map(|()| self.reg(RegClass::B32));
                let [a, b, c, d] = &words;
                emit!(self, "cvta.to.global.u64 {source}, {source};");
                emit!(
                    self,
                    "@{live} ld.relaxed.gpu.global.v4.u32 {{{a}, {b}, {c}, {d}}}, [{source}];"
                );
                slots.words.push(words);
            }
        }
        self.place(loaded);
        slots
    }

    /// The leader's window copies, stores (after every load was issued), grouped
    /// and predicated like the loads. The per-slot predicates are set again rather
    /// than kept from the loads: sixteen of them live across the stamps would exceed
    /// the hardware's predicate registers and be spilled.
    fn result_window_stores(&mut self, slots: WindowSlots) {
        let stored = self.label("results_windows_stored");
        let WindowSlots {
            groups,
            words,
            windows,
        } = slots;
        for (group, beyond) in groups.into_iter().enumerate() {
            let first = group * WINDOW_GROUP;
            emit!(self, "@{beyond} bra {stored};");
            let destinations = self.window_group_addresses(first, 8);
            for (slot, destination) in (first..).zip(destinations) {
                let live = self.window_live(windows, slot);
                let [a, b, c, d] = &words[slot];
                emit!(self, "cvta.to.global.u64 {destination}, {destination};");
                emit!(
                    self,
                    "@{live} st.global.v4.u32 [{destination}], {{{a}, {b}, {c}, {d}}};"
                );
            }
        }
        self.place(stored);
    }

    /// One address word (byte `word` of each descriptor: 0 the source block, 8 the
    /// destination) of every slot of the group starting at slot `first`, read back
    /// to back so no copy waits for its own constant load.
    fn window_group_addresses(&mut self, first: usize, word: usize) -> Vec<super::Reg> {
        (first..first + WINDOW_GROUP)
            .map(|slot| {
                let address = self.reg(RegClass::B64);
                emit!(
                    self,
                    "ld.param.u64 {address}, [vyre_ranges+{}];",
                    DESCRIPTOR_BYTES * slot + word
                );
                address
            })
            .collect()
    }

    /// A predicate set when window slot `slot` is below the window count.
    fn window_live(&mut self, windows: super::Reg, slot: usize) -> super::Reg {
        let live = self.reg(RegClass::Pred);
        emit!(self, "setp.gt.u32 {live}, {windows}, {slot};");
        live
    }
}

/// The lanes that reached the epilogue together (`activemask`) and their leader.
struct Group {
    /// The lanes, as a warp mask.
    mask: super::Reg,
    /// The leader's lane (the lowest in `mask`).
    leader: super::Reg,
    /// How many lanes (`popc` of `mask`).
    lanes: super::Reg,
    /// Set in the leader.
    is_leader: super::Reg,
}

/// The leader's window slots between the loads and the stores.
struct WindowSlots {
    /// Per group of [`WINDOW_GROUP`] slots: set when the window count does not reach
    /// it (it and every later group are skipped).
    groups: Vec<super::Reg>,
    /// Per slot, the four loaded words.
    words: Vec<[super::Reg; 4]>,
    /// The window count register.
    windows: super::Reg,
}
