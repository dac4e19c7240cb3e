//! # vyre-cuda
//!
//! A CUDA compute-dispatch backend for small GPU programs that a host calls
//! thousands of times (a GPU-resident tokenizer is the first user), with
//! instruments that attribute every nanosecond of a dispatch's host cost.
//!
//! Write a kernel in the [`ir`], dispatch it with [`backend::CudaBackend`], and
//! fall back to the bit-identical CPU [`reference`](mod@reference) interpreter where there is no
//! CUDA driver. [`backend::AnyBackend`] puts both behind one interface (buffers,
//! compiled kernels, dispatches, submissions, graphs), so the code is written once:
//!
//! ```
//! use vyre_cuda::backend::{AnyBackend, AnyBinding};
//! use vyre_cuda::ir::*;
//! use vyre_cuda::DispatchConfig;
//!
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
//! let input: Vec<u8> = (0..256u32).flat_map(|v| v.to_le_bytes()).collect();
//! let output_size = vec![0u8; input.len()]; // write-only: only its length matters
//! let config = DispatchConfig::linear(4); // 4 workgroups × 64 threads
//!
//! // CUDA where there is a driver and a device, the reference interpreter otherwise.
//! let backend = AnyBackend::cuda_or_reference();
//! let kernel = backend.compile(&program, &config).unwrap();
//! let bindings = [AnyBinding::Bytes(&input), AnyBinding::Bytes(&output_size)];
//! let results = backend.dispatch(&kernel, &bindings, &config).unwrap().outputs;
//! let doubled: Vec<u32> = results[0]
//!     .chunks_exact(4)
//!     .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
//!     .collect();
//! assert_eq!(doubled[..4], [0, 2, 4, 6]);
//! ```
//!
//! Modules, in the order a dispatch meets them: [`ir`] (program, builder,
//! validator), [`lower`], [`codegen`], [`backend`] (caps, caches, resident buffers,
//! pools, dispatch, memory budget); beside them [`reference`](mod@reference), [`probe`] (the
//! `VYRE_CUDA_DISPATCH_PHASE_PROBE` phase probe), and [`host_cost`] (the estimator
//! library behind the `host_cost_*` instruments). Its first user, the
//! `vyre-tokenizer` crate of this workspace, links it through this public API. `ARCHITECTURE.md` maps them and states the invariants.

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
pub use config::{ByteRange, CodegenOptions, DispatchConfig, ReadbackPolicy};

/// The README's code blocks, compiled and run as doctests so the quick start
/// cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
