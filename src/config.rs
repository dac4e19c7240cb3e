//! What one dispatch asks for beyond the program itself: grid size, replay count,
//! which bytes come back, and code-generation policy. Shared by the reference
//! interpreter and the CUDA backend so both run exactly the same request.

use smallvec::SmallVec;

/// Code-generation policy. It changes the emitted PTX, so it is part of the PTX
/// cache key (the "dispatch-policy digest"). Non-exhaustive: later versions may add
/// policies; build it with [`CodegenOptions::new`] (also usable in `const` items) or
/// `Default`, and the `with_*` methods.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct CodegenOptions {
    /// Guard every load, store and atomic with a bounds check (out-of-range loads read
    /// 0, stores and atomics do nothing). On by default; turning it off makes an
    /// out-of-range access a real memory fault on the GPU.
    pub bounds_checks: bool,
    /// Most iterations one run of a `while` loop (`Node::While`) may make in one
    /// thread; `None` (the default) puts no cap on it. A thread that starts
    /// iteration `cap + 1` executes `trap`: the dispatch fails with
    /// `BackendError::KernelFault` naming the program, and like any trap it loses the
    /// CUDA context (the next `CudaBackend::acquire` resets the device). The
    /// reference interpreter stops at the same iteration with an `Err` naming the
    /// cap. Use it while developing a loop that might not terminate: it costs one
    /// add, one compare and a predicated trap per iteration. Bounded `for` loops
    /// (`Node::Loop`) are not counted.
    pub max_loop_iterations: Option<u32>,
    /// How many workgroups of this kernel must fit on one multiprocessor at once as
    /// far as registers go; `None` (the default) lets the assembler spend registers
    /// as it likes. `Some(n)` declares `.minnctapersm n` on the kernel's entry (next
    /// to its `.reqntid`), so ptxas keeps each thread within
    /// `65536 / (n × threads per workgroup)` registers (rounded down to its
    /// allocation unit) and spills what does not fit to local memory.
    ///
    /// Why: every backend kernel carries the result ABI's epilogue, whose unrolled
    /// readback copies keep 64 registers live, so ptxas gives most kernels 80
    /// registers per thread whatever their bodies need (23–32 for the tokenizer's
    /// steps, measured with `ptxas -v` for `sm_90`): at 256 threads only 3 blocks
    /// fit an SM. Capped, the spills land in that epilogue, which only the grid's
    /// last warp runs (see the `codegen::ptx` module docs for the figures). It only
    /// bounds registers: workgroup memory can still hold fewer blocks per SM.
    ///
    /// Code generation refuses (`Fix:`) 0, more blocks than the target holds per
    /// multiprocessor, and more threads than it holds
    /// ([`codegen::ptx::multiprocessor_limits`](crate::codegen::ptx::multiprocessor_limits)),
    /// rather than let ptxas drop the directive with a warning. A lane's server
    /// ignores it: a lane's bodies are device functions of one resident kernel
    /// whose block count the lane fixes.
    pub min_blocks_per_multiprocessor: Option<u32>,
    /// The fence after an acquire load's system-scope load
    /// ([`Node::AcquireLoad`](crate::ir::Node::AcquireLoad)); the default is the one
    /// every driver and target takes. The CUDA backend asks for
    /// [`AcquireFence::AcquireOnly`] itself where the device and driver take it.
    pub acquire_fence: AcquireFence,
}

/// The fence that makes an acquire load's relaxed system-scope load an acquire
/// (the memory model's acquire pattern). Non-exhaustive.
///
/// Why two: `fence.acq_rel.sys` is a full system-scope barrier (`MEMBAR.ALL.SYS` in
/// the `sm_90` SASS), which waits for the thread's earlier memory operations to
/// reach the whole system, a round trip across PCIe; an acquire needs only that
/// later loads see what the releasing writer wrote, which `fence.acquire.sys`
/// gives as an L1 invalidation (`CCTL.IVALL`). The tokenizer's resident kernel
/// polls its text's ready flags with acquire loads: on an H100 host (2026-12-07,
/// the encode example, two rounds, 256 KiB) its `stage` took 21.1–24.5 µs with
/// the acquire-only fence against 25.8–31.3 with the full one, and one document
/// 98.0–99.3 µs eagerly against 102.4–103.9 (prose; CJK 112.6–113.6 against
/// 118.4–120.4, code 120.2–121.6 against 127.1–127.8).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AcquireFence {
    /// `fence.acq_rel.sys`: any PTX version and target.
    #[default]
    AcquireRelease,
    /// `fence.acquire.sys` on `sm_90` and newer, in a module of PTX ISA 8.6 or
    /// later (a driver of CUDA 12.8 or later loads it); an older target gets
    /// `fence.acq_rel.sys`.
    AcquireOnly,
}

impl Default for CodegenOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl CodegenOptions {
    /// The default policy: bounds checks on.
    pub const fn new() -> Self {
        CodegenOptions {
            bounds_checks: true,
            max_loop_iterations: None,
            min_blocks_per_multiprocessor: None,
            acquire_fence: AcquireFence::AcquireRelease,
        }
    }

    /// The same options with bounds checks on or off.
    pub const fn with_bounds_checks(mut self, bounds_checks: bool) -> Self {
        self.bounds_checks = bounds_checks;
        self
    }

    /// The same options with a cap on `while` loop iterations (`None`: no cap).
    pub const fn with_max_loop_iterations(mut self, cap: Option<u32>) -> Self {
        self.max_loop_iterations = cap;
        self
    }

    /// The same options asking for `blocks` workgroups per multiprocessor (`None`:
    /// no occupancy request); see
    /// [`min_blocks_per_multiprocessor`](Self::min_blocks_per_multiprocessor).
    pub const fn with_min_blocks_per_multiprocessor(mut self, blocks: Option<u32>) -> Self {
        self.min_blocks_per_multiprocessor = blocks;
        self
    }

    /// The same options with `fence` after each acquire load.
    pub const fn with_acquire_fence(mut self, fence: AcquireFence) -> Self {
        self.acquire_fence = fence;
        self
    }

    /// A stable 64-bit digest of the policy, for cache keys.
    pub fn policy_digest(&self) -> u64 {
        // Versioned so a future field can never collide with an old key: without a
        // loop cap or an occupancy request the digest is the first version's, with
        // only a loop cap the second's (the cap in the low 32 bits). An occupancy
        // request has a tag of its own: bit 41 says whether a loop cap is present
        // (its value in the low 32 bits), bits 42-47 hold the blocks, saturated at
        // 63. Every valid count (1 to 32) keeps its own value; the counts that
        // share 63 are all refused by code generation, so no PTX is ever cached
        // under that key.
        // The acquire-only fence flips bit 55 of whichever tag: 0x7679 becomes
        // 0x76F9 and 0x7603 0x7683, tags no other combination has.
        let fence = match self.acquire_fence {
            AcquireFence::AcquireRelease => 0,
            AcquireFence::AcquireOnly => 1 << 55,
        };
        let checks = self.bounds_checks as u64;
        fence
            ^ match (self.min_blocks_per_multiprocessor, self.max_loop_iterations) {
                (None, None) => 0x7679_7265_0001_0000 | checks,
                (None, Some(cap)) => 0x7679_0002_0000_0000 | checks << 40 | cap as u64,
                (Some(blocks), cap) => {
                    0x7603_0000_0000_0000
                        | checks << 40
                        | (cap.is_some() as u64) << 41
                        | (blocks.min(63) as u64) << 42
                        | cap.unwrap_or(0) as u64
                }
            }
    }
}

/// One byte range of one output buffer to read back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ByteRange {
    /// Binding slot of the output buffer.
    pub binding: u32,
    /// First byte.
    pub offset: u64,
    /// Number of bytes.
    pub len: u64,
}

/// Which outputs a dispatch copies back to the host. Non-exhaustive: later versions
/// may add policies.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ReadbackPolicy {
    /// Every `ReadWrite` and `WriteOnly` buffer, whole, in binding order.
    #[default]
    AllOutputs,
    /// Nothing: outputs stay on the device (device buffers keep them).
    None,
    /// Only these byte ranges, in the order given.
    Ranges(SmallVec<[ByteRange; 4]>),
}

/// One dispatch's parameters. Non-exhaustive: build it with [`DispatchConfig::new`]
/// or [`DispatchConfig::linear`] and the `with_*` methods.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct DispatchConfig {
    /// Number of workgroups on each axis.
    pub workgroups: [u32; 3],
    /// How many times the kernel runs back to back inside the dispatch (at least 1);
    /// each run sees the buffers the previous one left.
    pub fixpoint_iterations: u32,
    /// Which outputs come back.
    pub readback: ReadbackPolicy,
    /// Code-generation policy.
    pub codegen: CodegenOptions,
}

impl DispatchConfig {
    /// One run over `workgroups`, every output read back, bounds checks on.
    pub fn new(workgroups: [u32; 3]) -> Self {
        DispatchConfig {
            workgroups,
            fixpoint_iterations: 1,
            readback: ReadbackPolicy::AllOutputs,
            codegen: CodegenOptions::default(),
        }
    }

    /// A one-dimensional grid of `n` workgroups.
    pub fn linear(n: u32) -> Self {
        Self::new([n, 1, 1])
    }

    /// The same config with `n` fixpoint iterations.
    pub fn with_fixpoint_iterations(mut self, n: u32) -> Self {
        self.fixpoint_iterations = n;
        self
    }

    /// The same config with another readback policy.
    pub fn with_readback(mut self, readback: ReadbackPolicy) -> Self {
        self.readback = readback;
        self
    }

    /// The same config with other code-generation options.
    pub fn with_codegen(mut self, codegen: CodegenOptions) -> Self {
        self.codegen = codegen;
        self
    }
}
