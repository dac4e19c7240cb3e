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
mod structural;
pub mod validate;

pub use builder::{BlockBuilder, ProgramBuilder};
pub use digest::{computations_on_current_thread, computations_total, sha256, Digest};
pub use display::{
    DISPLAY_MAX_BYTES, DISPLAY_MAX_DEPTH, DISPLAY_MAX_EXPR_DEPTH, DISPLAY_MAX_INDENT_LEVELS,
};
pub(crate) use program::LoweringMemo;
pub use program::*;
pub(crate) use structural::any_node;
pub use structural::HASH_ITEM_BUDGET;
pub use validate::{
    validate, validate_lowered, validate_unmemoised, Limits, ValidProgram, ValidationError,
};
