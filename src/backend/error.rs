//! One error type for the backend. Every message starts with `Fix:` and says what
//! the caller should change; a kernel fault also says whether the context survived.
//! Typed causes stay typed: a validation error keeps its [`Rule`](crate::ir::validate::Rule),
//! a code generation error its [`CodegenError`], a driver failure its
//! [`DriverError`], each reachable through [`std::error::Error::source`].

use std::fmt;

use super::driver::DriverError;
use crate::codegen::CodegenError;
use crate::ir::ValidationError;
use crate::reference::ReferenceError;

/// Everything that can go wrong in a backend (CUDA, the reference backend, `AnyBackend`).
/// Non-exhaustive: later versions may add variants.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum BackendError {
    /// libcuda could not be loaded or initialised.
    NoDriver {
        /// What was missing.
        detail: String,
    },
    /// The requested device ordinal does not exist.
    NoDevice {
        /// Requested ordinal.
        ordinal: usize,
        /// Devices present.
        available: usize,
    },
    /// A driver call failed outside a kernel's execution.
    Driver {
        /// What the backend was doing.
        during: String,
        /// The failing call and status.
        error: DriverError,
    },
    /// The program broke an IR rule.
    InvalidProgram {
        /// The program's diagnostic name.
        program: String,
        /// The validator's error: its rule and its `Fix:` message.
        error: ValidationError,
    },
    /// Code generation refused the (valid) program.
    Codegen {
        /// The program's diagnostic name.
        program: String,
        /// What code generation refused.
        error: CodegenError,
    },
    /// The reference interpreter refused or stopped (the reference backend's
    /// implementation).
    Reference {
        /// The program's diagnostic name.
        program: String,
        /// The interpreter's error (starts with `Fix:`).
        error: ReferenceError,
    },
    /// The driver rejected generated PTX (a code generation bug, or a device too old).
    ModuleLoad {
        /// The program's diagnostic name.
        program: String,
        /// Target SM.
        sm: u32,
        /// The failing call and status.
        error: DriverError,
    },
    /// Inputs, handles or config do not match the program.
    BadInput {
        /// The full message, starting with `Fix:`.
        message: String,
    },
    /// The launch geometry is impossible on this device, or overflows.
    Launch {
        /// The full message, starting with `Fix:`.
        message: String,
    },
    /// A grid-sync program's grid cannot be resident on the device all at once.
    GridTooLargeForGridSync {
        /// The program's diagnostic name.
        program: String,
        /// Workgroups requested.
        grid_blocks: u64,
        /// Most workgroups that can be co-resident now (beside running lanes).
        max_coresident: u64,
    },
    /// An allocation or dispatch needs more device memory than the budget allows.
    OverBudget {
        /// Bytes needed (a dispatch's transient buffers bucketed).
        required: u64,
        /// Bytes the budget leaves.
        available: u64,
    },
    /// A buffer, kernel or pending dispatch of another backend was passed.
    InvalidHandle {
        /// The full message, starting with `Fix:`.
        message: String,
    },
    /// The kernel faulted while running.
    KernelFault {
        /// The program's diagnostic name.
        program: String,
        /// The status the driver reported.
        error: DriverError,
        /// Whether the CUDA context can still be used. `false` after a sticky fault
        /// (illegal address, trap): this backend refuses further work, and the next
        /// `CudaBackend::acquire` resets the device's primary context.
        context_usable: bool,
    },
    /// The grid-sync barrier counter was not balanced after a launch.
    GridBarrierAudit {
        /// The program's diagnostic name.
        program: String,
        /// The barrier word read back: the phase bit with the phase's arrivals
        /// below it.
        word: u32,
        /// Workgroups in the grid.
        grid_blocks: u64,
    },
    /// An earlier sticky fault left the device unusable for this whole process, and
    /// the driver refused to reset it (CUDA documents such errors as needing a restart).
    DeviceUnrecoverable {
        /// Device ordinal.
        ordinal: usize,
        /// The call that failed during the reset attempt.
        error: DriverError,
    },
    /// An earlier kernel fault destroyed this backend's context.
    ContextLost {
        /// What faulted.
        cause: String,
    },
    /// A broken internal invariant: a bug in this crate, never the caller's input.
    Internal {
        /// What broke.
        message: String,
    },
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendError::NoDriver { detail } => write!(
                f,
                "Fix: no usable CUDA driver ({detail}); install the NVIDIA driver (libcuda.so), \
                 or run on the CPU with AnyBackend::reference (AnyBackend::cuda_or_reference falls \
                 back by itself)"
            ),
            BackendError::NoDevice { ordinal, available } => write!(
                f,
                "Fix: CUDA device {ordinal} does not exist ({available} present); pass an ordinal below {available}"
            ),
            BackendError::Driver { during, error } => write!(
                f,
                "Fix: the CUDA driver failed while {during}: {error}; check the device with nvidia-smi \
                 and that no other process holds all its memory"
            ),
            BackendError::InvalidProgram { program, error } => {
                write!(f, "{} (in {program})", error.message())
            }
            BackendError::Codegen { program, error } => write!(f, "{error} (in {program})"),
            BackendError::Reference { program, error } => write!(f, "{error} (in {program})"),
            BackendError::ModuleLoad { program, sm, error } => write!(
                f,
                "Fix: the driver rejected the PTX generated for {program} (sm_{sm}): {error}; \
                 this is a code generation bug: report it with the program's Display output"
            ),
            BackendError::BadInput { message }
            | BackendError::Launch { message }
            | BackendError::InvalidHandle { message } => f.write_str(message),
            BackendError::GridTooLargeForGridSync {
                program,
                grid_blocks,
                max_coresident,
            } => write!(
                f,
                "Fix: {program} uses grid_sync, so all {grid_blocks} workgroups must be resident at once, \
                 but this device holds at most {max_coresident} now (fewer while persistent lanes run: their \
                 blocks keep their multiprocessors); dispatch at most {max_coresident} workgroups (loop inside \
                 the kernel over the rest), stop the lanes, or remove grid_sync"
            ),
            BackendError::OverBudget {
                required,
                available,
            } => write!(
                f,
                "Fix: {required} bytes of device memory are needed but the budget leaves {available} \
                 (90% of the device's memory minus the bytes buffers and the transient pool hold, capped \
                 by 90% of its free memory; the reference interpreter's device memory is \
                 ReferenceOptions::max_memory_bytes); drop buffers you no longer need, allocate or \
                 dispatch less, or keep inputs in device buffers"
            ),
            BackendError::KernelFault {
                program,
                error,
                context_usable,
            } => {
                if *context_usable {
                    write!(
                        f,
                        "Fix: {program} failed on the GPU: {error}; the context is still usable; check the \
                         program's indices and inputs against the reference interpreter"
                    )
                } else {
                    write!(
                        f,
                        "Fix: {program} faulted on the GPU: {error}; the CUDA context is lost: drop every \
                         CudaBackend of this device; CudaBackend::acquire resets the device where the driver \
                         allows it and otherwise says the process must restart; find the bad access, or the \
                         `while` loop that passed config.codegen.max_loop_iterations (a trap), with the \
                         reference interpreter (run it with the same config and bounds_checks = false)"
                    )
                }
            }
            BackendError::GridBarrierAudit {
                program,
                word,
                grid_blocks,
            } => write!(
                f,
                "Fix: the grid barrier of {program} was unbalanced after launch (arrivals in the last phase {}, \
                 grid {grid_blocks} workgroups); every workgroup must reach every grid_sync: report this with \
                 the program's Display output",
                word & !crate::codegen::GRID_BARRIER_PHASE_BIT
            ),
            BackendError::DeviceUnrecoverable { ordinal, error } => write!(
                f,
                "Fix: an earlier kernel fault left CUDA device {ordinal} unusable in this process ({error}) and \
                 the driver allows no recovery inside one process: restart the process (keep faulting \
                 experiments in a child process if the parent must survive them)"
            ),
            BackendError::Internal { message } => write!(
                f,
                "Fix: internal error in vyre-cuda ({message}); this is a bug in the crate, not in your \
                 input: report it with the program's Display output"
            ),
            BackendError::ContextLost { cause } => write!(
                f,
                "Fix: this backend's CUDA context was lost ({cause}); drop it and call CudaBackend::acquire again"
            ),
        }
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BackendError::InvalidProgram { error, .. } => Some(error),
            BackendError::Codegen { error, .. } => Some(error),
            BackendError::Reference { error, .. } => Some(error),
            BackendError::Driver { error, .. }
            | BackendError::ModuleLoad { error, .. }
            | BackendError::KernelFault { error, .. }
            | BackendError::DeviceUnrecoverable { error, .. } => Some(error),
            _ => None,
        }
    }
}

impl BackendError {
    pub(in crate::backend) fn driver(during: impl Into<String>, error: DriverError) -> Self {
        BackendError::Driver {
            during: during.into(),
            error,
        }
    }

    /// A broken internal invariant (a bug in this crate, not the caller's input).
    pub(in crate::backend) fn internal(what: impl Into<String>) -> Self {
        BackendError::Internal {
            message: what.into(),
        }
    }

    pub(in crate::backend) fn bad_input(message: impl Into<String>) -> Self {
        BackendError::BadInput {
            message: message.into(),
        }
    }

    /// The error of a failed module load for `program` (a name for messages): the
    /// driver refusing the generated PTX, or the driver layer refusing the load
    /// because a lane runs under lazy module loading (a `Fix:` saying what to do
    /// instead of a hang; `driver`'s `module` docs say why).
    pub(in crate::backend) fn module_load(program: String, sm: u32, error: DriverError) -> Self {
        if !error.is_module_load_refused_beside_a_lane() {
            return BackendError::ModuleLoad { program, sm, error };
        }
        BackendError::bad_input(format!(
            "Fix: {program} needs a module load, and a lane of this device is running: with lazy \
             module loading (CUDA_MODULE_LOADING=LAZY, the driver's default since CUDA 12.2) the load \
             would wait for the lane's kernel, which runs until the lane stops, so the host would \
             hang. Compile every kernel (and build every lane) before starting a lane, stop the \
             lane first, or run the process with CUDA_MODULE_LOADING=EAGER"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error;

    /// Locks out a module load refused beside a lane surfacing as "a code generation
    /// bug" (the generic module-load message) instead of a `Fix:` naming what to do:
    /// the refusal becomes a `BadInput` naming the program, lazy loading and
    /// `CUDA_MODULE_LOADING=EAGER`. Negative control: a driver rejection of the PTX
    /// stays a `ModuleLoad` error (its message needs the driver's status name, so it
    /// is not formatted here, where no driver may be installed).
    #[test]
    fn a_module_load_refused_beside_a_lane_is_a_fix_error() {
        let refused = BackendError::module_load(
            "copy_word".into(),
            90,
            DriverError::module_load_refused_beside_a_lane(),
        );
        let message = refused.to_string();
        assert!(
            matches!(refused, BackendError::BadInput { .. }),
            "{refused:?}"
        );
        assert!(
            message.starts_with("Fix: copy_word needs a module load")
                && message.contains("lazy module loading")
                && message.contains("CUDA_MODULE_LOADING=EAGER")
                && message.contains("before starting a lane"),
            "{message}"
        );
        let rejected = DriverError::not_found("cuModuleGetFunction");
        let rejected = BackendError::module_load("copy_word".into(), 90, rejected);
        assert!(
            matches!(rejected, BackendError::ModuleLoad { .. }),
            "{rejected:?}"
        );
    }

    /// Locks out flattening typed causes into strings: a validation failure keeps
    /// its `ValidationError` (and its rule) behind `source()`, a driver failure its
    /// `DriverError`, and an internal failure is its own variant whose message
    /// still starts with `Fix:` but never blames the caller's input.
    #[test]
    fn typed_causes_survive_behind_source() {
        use crate::ir::*;
        let program = Program::builder([64, 1, 1])
            .body(|b| {
                b.store("missing", 0u32, 1u32);
            })
            .build();
        let validation = validate(&program, &Limits::default()).unwrap_err();
        let error = BackendError::InvalidProgram {
            program: program.display_name(),
            error: validation.clone(),
        };
        let source = error
            .source()
            .and_then(|s| s.downcast_ref::<ValidationError>())
            .expect("the validation error is the source");
        assert_eq!(source.rule(), validation.rule());
        assert!(error.to_string().starts_with("Fix:"), "{error}");

        let driver = BackendError::driver("testing", DriverError::not_found("cuTest"));
        assert!(driver
            .source()
            .and_then(|s| s.downcast_ref::<DriverError>())
            .is_some_and(|d| d.call() == "cuTest"));

        let internal = BackendError::internal("an invariant broke");
        let message = internal.to_string();
        assert!(
            message.starts_with("Fix:") && message.contains("bug in the crate"),
            "{message}"
        );
        assert!(internal.source().is_none());
        // Negative control: bad input has no typed cause to expose.
        assert!(BackendError::bad_input("Fix: x").source().is_none());
    }
}
