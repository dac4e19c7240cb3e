//! # vyre-cuda
//!
//! A CUDA compute-dispatch backend for small GPU programs that a host calls
//! thousands of times, with instruments that attribute every nanosecond of a
//! dispatch's host cost. See `README.md` and `ARCHITECTURE.md`.

#![warn(missing_docs)]

pub mod codegen;
pub mod config;
pub mod fixtures;
pub mod ir;
pub mod lower;
pub mod pretokenize;
pub mod reference;

pub use config::{ByteRange, CodegenOptions, DispatchConfig, ReadbackPolicy};
pub mod backend;
pub mod host_cost;
pub mod probe;
