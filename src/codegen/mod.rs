//! Code generation: turns a lowered, validated [`Program`](crate::ir::Program)
//! into text the GPU driver compiles.
//!
//! The only target is PTX ([`ptx`]), the virtual ISA every CUDA driver accepts and
//! JIT-compiles for the device it runs on. Emitting plain PTX text (instead of linking
//! NVRTC or LLVM) keeps code generation a pure, allocation-light string walk, which
//! matters because a cache miss on the dispatch path pays for it.

pub mod ptx;

pub use ptx::{
    codegen_limits, entry_symbol, multiprocessor_limits, program_to_ptx,
    program_to_ptx_with_results, CodegenError, MultiprocessorLimits, ENTRY_NAME,
    ENTRY_SYMBOL_ID_BYTES, GRID_BARRIER_PHASE_BIT, GRID_BARRIER_SYMBOL, GRID_BARRIER_WORDS,
    RESULT_RANGE_SLOTS,
};
pub use ptx::{
    lane_body_name, module_entry_name, module_grid_barrier_symbol, LaneModuleBuilder, ModuleEntry,
    PtxModuleBuilder, LANE_ENTRY_NAME,
};
