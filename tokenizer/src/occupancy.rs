//! How many workgroups of each device step an SM must hold at once, as
//! registers go: the steps' [`CodegenOptions::min_blocks_per_multiprocessor`].
//!
//! # Why it exists
//!
//! Every kernel the backend loads carries the result ABI's epilogue, whose
//! unrolled readback copies keep 64 registers live. Left alone, ptxas gives
//! `stage`, `classify`, `phases`, `pieces` and `compact` 80 registers
//! per thread (`ptxas -v`, `sm_90`, 256 threads), so an SM holds 3 of their
//! blocks (37.5 % occupancy) although their bodies need 23 to 64. On the H200
//! each split step then ran about 41 waves of about 22 µs per 16 MiB chunk.
//!
//! Each step therefore states the registers its body needs
//! ([`KernelStep::body_registers`](crate::device::programs::KernelStep::body_registers),
//! [`SplitStep::body_registers`](crate::pretokenize::batch::SplitStep::body_registers)),
//! and by default ([`Occupancy::BodyRegisters`]) asks for as many blocks per SM
//! as that count allows. ptxas then caps the whole kernel there and spills the
//! rest, which lands in the epilogue that only the grid's last warp runs.
//! Figures, `ptxas -v` and `nvdisasm` for `sm_90` at the default geometry
//! (registers, spill bytes stored / loaded, spill instructions before the
//! epilogue's finishing atomic):
//!
//! | step | unrequested | requested (blocks) | body spills |
//! |---|---|---|---|
//! | stage, pieces, compact | 80, 0 / 0 | 32 (8), 468 / 644 | none (`compact` since it counts its own tokens: the same bytes as `stage`'s, the epilogue's) |
//! | classify | 80, 0 / 0 | 32 (8), 480 / 656 | one word, outside its loops |
//! | phases | 80, 0 / 0 | 64 (4), 108 / 140 | none (at 48 registers: 14 instructions) |
//! | merge | 48, 304 / 400 | 40 (6), 400 / 528 | two words stored at entry, loaded once per list entry (at 32: 6 instructions in a loop) |
//! | long | 48, 304 / 400 | 40 (6), 500 / 680 | none (at 32: 27 in loops) |
//! | split (GPT-2) | 80, 0 / 0 | 32 (8), 476 / 652 | none |
//!
//! The spilled bytes are a per-thread local frame (up to 296 bytes) that the
//! driver reserves for every thread the device can hold (about 80 MB on an
//! H200); only the last warp touches it. Workgroup memory still bounds some
//! steps below the request (none at the default geometry on an H200).

use vyre_cuda::backend::AnyBackend;
use vyre_cuda::codegen::MultiprocessorLimits;
use vyre_cuda::CodegenOptions;

/// What the device steps ask of ptxas about registers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Occupancy {
    /// No request: ptxas chooses (80 registers for most steps, see the module docs).
    Unrequested,
    /// Each step asks for as many blocks per SM as its body's registers allow
    /// ([`MultiprocessorLimits::blocks_for_registers`]), so the body keeps them.
    #[default]
    BodyRegisters,
    /// Every step asks for this many blocks per SM, capped at what its workgroup
    /// shape allows on the device (at least 1). For sweeps.
    BlocksPerMultiprocessor(u32),
}

impl Occupancy {
    /// The blocks a step of `threads_per_block` threads whose body needs
    /// `body_registers` registers asks for on a device whose SMs hold `limits`.
    pub fn blocks(
        self,
        body_registers: u32,
        threads_per_block: u32,
        limits: &MultiprocessorLimits,
    ) -> Option<u32> {
        match self {
            Occupancy::Unrequested => None,
            Occupancy::BodyRegisters => {
                Some(limits.blocks_for_registers(body_registers, threads_per_block))
            }
            Occupancy::BlocksPerMultiprocessor(blocks) => {
                Some(blocks.clamp(1, limits.most_blocks(threads_per_block)))
            }
        }
    }

    /// `options` with this request for such a step; the same options where
    /// `limits` is `None` (the reference interpreter has no registers).
    pub fn codegen(
        self,
        options: CodegenOptions,
        body_registers: u32,
        threads_per_block: u32,
        limits: Option<&MultiprocessorLimits>,
    ) -> CodegenOptions {
        let blocks =
            limits.and_then(|limits| self.blocks(body_registers, threads_per_block, limits));
        options.with_min_blocks_per_multiprocessor(blocks)
    }
}

/// What one SM of `backend`'s device holds; `None` on the reference interpreter.
pub fn multiprocessor_limits(backend: &AnyBackend) -> Option<MultiprocessorLimits> {
    match backend {
        AnyBackend::Cuda(cuda) => Some(cuda.caps().multiprocessor_limits()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Locks out a request the device would refuse or ignore: the blocks asked
    /// for never pass what an SM holds of the step's shape, and a body's
    /// registers set them (control: the H200's 256-thread steps).
    #[test]
    fn requests_stay_within_what_an_sm_holds() {
        let h200 = vyre_cuda::codegen::multiprocessor_limits(90);
        let body = Occupancy::BodyRegisters;
        assert_eq!(body.blocks(32, 256, &h200), Some(8));
        assert_eq!(body.blocks(40, 256, &h200), Some(6));
        assert_eq!(body.blocks(64, 256, &h200), Some(4));
        assert_eq!(body.blocks(64, 1024, &h200), Some(1));
        assert_eq!(body.blocks(16, 32, &h200), Some(32));
        let ada = vyre_cuda::codegen::multiprocessor_limits(89);
        assert_eq!(body.blocks(32, 256, &ada), Some(6));
        let fixed = Occupancy::BlocksPerMultiprocessor(64);
        assert_eq!(fixed.blocks(32, 512, &h200), Some(4));
        assert_eq!(
            Occupancy::BlocksPerMultiprocessor(0).blocks(32, 256, &h200),
            Some(1)
        );
        assert_eq!(Occupancy::Unrequested.blocks(32, 256, &h200), None);
        for threads in (32..=1024).step_by(32) {
            for registers in [1, 23, 32, 40, 64, 255] {
                let blocks = body.blocks(registers, threads, &h200).unwrap();
                assert!(h200.holds(blocks, threads), "{registers} × {threads}");
            }
        }
    }
}
