//! # vyre-cuda
//!
//! A CUDA compute-dispatch backend for small GPU programs that a host calls
//! thousands of times (a GPU-resident tokenizer is the first user), with
//! instruments that attribute every nanosecond of a dispatch's host cost.
//!
//! Write a kernel in the [`ir`], compile it once, and run it with one request:
//! a [`backend::Dispatch`] names the kernel (or a program), its bindings, the grid,
//! what to read back, how to time and what to run after, and a backend finishes it
//! by blocking (`run`: outputs and timings), by submitting (`submit`: a pending
//! result whose `wait` gives the same) or by writing into caller buffers
//! (`run_into`). [`backend::AnyBackend`] is the CUDA backend where there is a driver
//! and a device and the bit-identical CPU [`reference`](mod@reference) interpreter
//! otherwise, answering every request the same way (errors included), so the code
//! is written once:
//!
//! ```
//! use vyre_cuda::backend::{AnyBackend, Binding, Dispatch};
//! use vyre_cuda::ir::*;
//! use vyre_cuda::DispatchConfig;
//!
//! # fn main() -> Result<(), vyre_cuda::backend::BackendError> {
//! let program = Program::builder([64, 1, 1])
//!     .buffer("input", 0, Access::ReadOnly, ElemType::U32, BufferCount::Runtime)
//!     .buffer("output", 1, Access::WriteOnly, ElemType::U32, BufferCount::Runtime)
//!     .body(|b| {
//!         let i = b.let_("i", Expr::global_id(Axis::X));
//!         b.if_(i.clone().less_than(Expr::length("output")), |b| {
//!             b.store("output", i.clone(), Expr::load("input", i.clone()) * 2u32);
//!         });
//!     })
//!     .build();
//!
//! // CUDA where there is a driver and a device, the reference interpreter otherwise.
//! let backend = AnyBackend::cuda_or_reference();
//! println!("{}", backend.notice()); // which one, in one line
//! let kernel = backend.compile(&program, &DispatchConfig::new([4, 1, 1]))?;
//!
//! let input: Vec<u32> = (0..256).collect();
//! let bindings = [
//!     Binding::host(&input),    // typed host data, staged for this dispatch
//!     Binding::Zeroed(4 * 256), // a write-only output, stated by its length
//! ];
//! let request = Dispatch::new(&kernel, &bindings).workgroups([4, 1, 1]); // 4 × 64 threads
//! let finished = backend.run(request)?;
//! let doubled: Vec<u32> = finished.outputs.read("output")?; // by buffer name
//! assert_eq!(doubled[..4], [0, 2, 4, 6]);
//!
//! // Owned buffers keep their bytes between dispatches and free themselves on drop.
//! let x = backend.buffer_from(&input)?;
//! let pending = backend.submit(Dispatch::new(&kernel, &[Binding::from(&x), Binding::Zeroed(1024)]))?;
//! assert_eq!(pending.wait()?.outputs.read::<u32>("output")?[1], 2);
//! # Ok(())
//! # }
//! ```
//!
//! Modules, in the order a dispatch meets them: [`ir`] (program, builder,
//! validator), [`lower`], [`codegen`], [`backend`] (the request, buffers, caches,
//! pools, dispatch, graphs, the reference backend and [`backend::AnyBackend`] over
//! both); beside them [`reference`](mod@reference), [`probe`] (the
//! `VYRE_CUDA_DISPATCH_PHASE_PROBE` phase probe), and [`host_cost`] (the estimator
//! library behind the `host_cost_*` instruments). Its first user, the
//! `vyre-tokenizer` crate of this workspace, links it through this public API.
//! `ARCHITECTURE.md` maps them and states the invariants.

#![warn(missing_docs)]

pub mod backend;
pub mod codegen;
pub mod config;
#[cfg(feature = "testing")]
pub mod fixtures;
pub mod host_cost;
pub mod ir;
pub mod lower;
pub mod probe;
pub mod reference;

pub use backend::graph;
pub use config::{AcquireFence, ByteRange, CodegenOptions, DispatchConfig, ReadbackPolicy};

/// The README's code blocks, compiled and run as doctests so the quick start
/// cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
