//! The validator: owns every rule of the IR and every `Fix:` message (§1).
//! (Being written: see issue 2.)

use std::fmt;

use super::program::Program;

/// Device limits the validator checks a program against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Limits {
    /// Most threads one workgroup may have.
    pub max_threads_per_workgroup: u32,
    /// Largest workgroup size per axis.
    pub max_workgroup_size: [u32; 3],
    /// Most bytes of workgroup (shared) memory one workgroup may declare.
    pub max_shared_memory_bytes: u32,
    /// Lanes per subgroup (warp).
    pub subgroup_size: u32,
}

impl Default for Limits {
    /// CUDA's limits on every GPU since compute capability 2.0, with the static
    /// shared-memory limit of 48 KiB.
    fn default() -> Self {
        Limits {
            max_threads_per_workgroup: 1024,
            max_workgroup_size: [1024, 1024, 64],
            max_shared_memory_bytes: 48 * 1024,
            subgroup_size: 32,
        }
    }
}

/// A rule a program broke. The message starts with `Fix:` and says what to change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidationError {
    message: String,
}

impl ValidationError {
    /// The message, starting with `Fix:`.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ValidationError {}

/// Check a user program against every rule of §1.
pub fn validate(_program: &Program, _limits: &Limits) -> Result<(), ValidationError> {
    Ok(())
}

/// Check a program produced by lowering (subgroup expressions allowed).
pub fn validate_lowered(_program: &Program, _limits: &Limits) -> Result<(), ValidationError> {
    Ok(())
}
