//! # vyre-tokenizer
//!
//! Byte-level BPE tokenization exactly as tiktoken does it, on the CPU and on the
//! GPU through vyre-cuda's public API. This crate is vyre-cuda's first user, built
//! as a user would build it: it links the backend like any other dependency.
//!
//! Today it holds GPT-2's pre-tokenizer ([`pretokenize`]): the split that
//! byte-level BPE tokenizers run before merging, on the GPU in two dispatches and
//! on the CPU, identical to the regex engine tiktoken's Rust core uses.

#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod pretokenize;
