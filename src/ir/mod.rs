//! The program IR: the language a kernel author writes in (§1).
//!
//! This module is the language reference: each node's and expression's doc comment
//! says what it means at run time. [`validate`](mod@validate) owns every rule and every error
//! message; everything downstream (lowering, code generation, the reference
//! interpreter, the backend) may assume a program it receives has passed it.

mod builder;
mod digest;
mod display;
#[cfg(feature = "testing")]
pub mod generate;
mod program;
pub mod validate;

pub use builder::{BlockBuilder, ProgramBuilder};
pub use digest::{computations_on_current_thread, computations_total, sha256, Digest};
pub use program::*;
pub use validate::{validate, validate_lowered, Limits, ValidationError};
