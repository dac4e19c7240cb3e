//! Several programs in one PTX module, so the driver JIT-compiles them in one
//! `cuModuleLoadData`.
//!
//! Why it exists: every module load is a driver JIT call, and a user with many
//! kernels (a tokenizer compiles its 4–6 at start-up; the differential test compiles
//! 10,000 random programs) makes one per kernel when every program is its own
//! module. Measured on the H200: once the writer hid constants from the
//! JIT (the opaque zero word), one program per module cost about 44 ms of JIT, and
//! the loads of concurrent threads did not overlap, so 2,500 programs took more than
//! 110 s. [`PtxModuleBuilder`] writes many kernels into one module instead, so the
//! per-call part is paid once (the compile work stays per kernel: ptxas on the build
//! machine took 9.1 s for 64 generated kernels in one module, 10.6 s in 64).
//!
//! # Module layout
//!
//! The module header (`.version`, `.target`, `.address_size`) and the opaque zero
//! word are written once. Kernel `i` (in the order pushed, from 0) is the entry
//! [`module_entry_name`]`(i)` (`vyre_entry_i`), and its module-scope symbols carry
//! the index too: its grid-barrier word is [`module_grid_barrier_symbol`]`(i)`
//! (`vyre_grid_barrier_i`, present only when the program has a grid sync, with the
//! protocol of the [`super`] module docs) and its workgroup buffers
//! `vyre_shared_i_<position>_<name>`. Every kernel's text is exactly what
//! [`super::program_to_ptx`] (or [`super::program_to_ptx_with_results`]) writes for
//! it, but for those names; a module of one program is not byte-identical to the
//! single-program module (a different header comment and entry name).
//!
//! The module stays under [`MAX_PTX_BYTES`]: a program that would pass it is refused
//! with [`CodegenError::ModuleFull`] and the builder is left as it was, so the caller
//! finishes this module and starts another.

use std::fmt::Write;

use super::writer::{module_header, Writer};
use super::{check_target, codegen_limits, CodegenError, MAX_PTX_BYTES};
use crate::config::CodegenOptions;
use crate::ir::{self, Program, ProgramForm};

/// Bytes the module header takes at most (comment, version, target, opaque zero);
/// reserved so the finished module stays under [`MAX_PTX_BYTES`].
const HEADER_BYTES: usize = 512;

/// The entry name of kernel `index` of a module written by [`PtxModuleBuilder`].
pub fn module_entry_name(index: usize) -> String {
    format!("{}_{index}", super::ENTRY_NAME)
}

/// The grid-barrier symbol of kernel `index` of a module written by
/// [`PtxModuleBuilder`] ([`super::GRID_BARRIER_WORDS`] word, its arrival bits zero
/// at every launch of that kernel: the protocol in the module docs).
pub fn module_grid_barrier_symbol(index: usize) -> String {
    format!("{}_{index}", super::GRID_BARRIER_SYMBOL)
}

/// Where one pushed program lives in the module.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ModuleEntry {
    /// Its position in the module (0 for the first program pushed).
    pub index: usize,
    /// Its `.entry` name ([`module_entry_name`]).
    pub entry: String,
    /// Its grid-barrier symbol, when the program has a grid sync
    /// ([`module_grid_barrier_symbol`]).
    pub grid_barrier: Option<String>,
}

/// Writes several lowered programs into one PTX module (see the module docs).
///
/// ```
/// use vyre_cuda::codegen::ptx::PtxModuleBuilder;
/// use vyre_cuda::config::CodegenOptions;
/// use vyre_cuda::ir::generate::{valid_program, GeneratorOptions};
/// use vyre_cuda::lower::{lower_workgroup_reductions, LoweringCaps};
///
/// let caps = LoweringCaps::new(true, 32).expect("32-lane subgroups");
/// let mut module = PtxModuleBuilder::new(&CodegenOptions::default(), 90, 32);
/// for seed in 0..3 {
///     let case = valid_program(seed, &GeneratorOptions::default());
///     let lowered = lower_workgroup_reductions(&case.program, &caps);
///     let entry = module.push(&lowered)?;
///     assert_eq!(entry.entry, format!("vyre_entry_{seed}"));
/// }
/// let ptx = module.finish();
/// assert_eq!(ptx.matches(".visible .entry").count(), 3);
/// # Ok::<(), vyre_cuda::codegen::CodegenError>(())
/// ```
#[derive(Clone, Debug)]
pub struct PtxModuleBuilder {
    options: CodegenOptions,
    sm: u32,
    subgroup_size: u32,
    results: bool,
    /// The kernels written so far, in order.
    kernels: String,
    count: usize,
    /// A kernel ends an acquire load with `fence.acquire.sys`, which needs PTX ISA
    /// 8.6 in the header.
    acquire_only_fences: bool,
}

impl PtxModuleBuilder {
    /// An empty module of plain-ABI kernels (as [`super::program_to_ptx`]) for
    /// compute capability `sm` (`major * 10 + minor`) and `subgroup_size`; the target
    /// is checked at each [`PtxModuleBuilder::push`].
    pub fn new(options: &CodegenOptions, sm: u32, subgroup_size: u32) -> Self {
        PtxModuleBuilder {
            options: *options,
            sm,
            subgroup_size,
            results: false,
            kernels: String::new(),
            count: 0,
            acquire_only_fences: false,
        }
    }

    /// An empty module of result-ABI kernels (as
    /// [`super::program_to_ptx_with_results`]): what the CUDA backend loads.
    pub fn with_results(options: &CodegenOptions, sm: u32, subgroup_size: u32) -> Self {
        PtxModuleBuilder {
            results: true,
            ..Self::new(options, sm, subgroup_size)
        }
    }

    /// Write `program` as the next kernel. It is checked exactly as
    /// [`super::program_to_ptx`] checks it (target, lowering, validation against
    /// [`codegen_limits`] before any other walk) and gets the same errors; a program
    /// that would take the module past [`MAX_PTX_BYTES`] gets
    /// [`CodegenError::ModuleFull`] (finish this module and push it into a new one).
    /// On any error the builder is unchanged.
    pub fn push(&mut self, program: &Program) -> Result<ModuleEntry, CodegenError> {
        check_target(program, self.sm, self.subgroup_size)?;
        let valid = ir::validate_unmemoised(program, &codegen_limits(), ProgramForm::Lowered)
            .map_err(CodegenError::Invalid)?;
        let index = self.count;
        let (text, facts) = Writer::new(&valid, self.options, self.sm, self.results)
            .for_module_kernel(index)
            .finish_kernel()?;
        if HEADER_BYTES + self.kernels.len() + 1 + text.len() > MAX_PTX_BYTES {
            return Err(CodegenError::ModuleFull {
                kernels: self.count,
                limit_bytes: MAX_PTX_BYTES,
            });
        }
        self.kernels.push('\n');
        self.kernels.push_str(&text);
        self.count += 1;
        self.acquire_only_fences |= facts.acquire_only_fences;
        Ok(ModuleEntry {
            index,
            entry: module_entry_name(index),
            grid_barrier: facts
                .uses_grid_sync
                .then(|| module_grid_barrier_symbol(index)),
        })
    }

    /// Kernels pushed so far.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether no kernel was pushed yet.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The module text: the header once, then every kernel in the order pushed.
    pub fn finish(self) -> String {
        let mut out = String::with_capacity(HEADER_BYTES + self.kernels.len());
        let _ = writeln!(out, "//\n// vyre-cuda module of {} kernels\n//", self.count);
        module_header(&mut out, self.sm, self.acquire_only_fences);
        out.push_str(&self.kernels);
        out
    }
}
