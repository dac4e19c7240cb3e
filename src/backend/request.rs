//! One dispatch request: what runs ([`Kernel`] or [`Program`]), over which
//! [`Binding`]s, on which grid, what comes back, how it is timed, and after which
//! pending dispatch.
//!
//! # Why this module exists
//!
//! The backend used to offer twelve dispatch and submit methods (`dispatch`,
//! `dispatch_resident`, `_timed`, `dispatch_kernel`, `dispatch_kernel_into`,
//! `submit_kernel_after`, …), each a different subset of the same few choices, and
//! `_timed` meant kernel stamps on one and CUDA events on another. A [`Dispatch`] is
//! those choices as one value, and every backend finishes it in one of three ways:
//! blocking (`run`: outputs and [`Timings`]), submitting (`submit`: a
//! [`PendingDispatch`] whose `wait` gives the same) or writing into caller buffers
//! (`run_into`: no allocation). [`CudaBackend`](super::CudaBackend),
//! [`AnyBackend`](super::AnyBackend) and graph recording
//! ([`GraphRecorder::dispatch`](super::graph::GraphRecorder::dispatch)) all take the
//! same value.
//!
//! A request is a small `Copy` value that borrows everything it names (no
//! allocation, nothing cloned): building one costs a few nanoseconds, planning it
//! (sizes, buffers bound twice, readback) a few dozen at 17 bindings (measured on the
//! build machine by the `host_cost_request_building_and_planning` instrument below;
//! figures in ARCHITECTURE.md). It is the place later
//! per-dispatch choices go, as one more builder method each, without a new dispatch
//! method: the values of a program's scalar parameters came that way
//! ([`Dispatch::scalar`]). They are resolved against the kernel's declarations when
//! the request is built and kept inline ([`ScalarValues`], 16 words), so a request
//! with scalars allocates nothing either; a bad value is remembered and refused with
//! a `Fix:` error when the request is planned, by the same code on every backend.

use bytemuck::Pod;

use crate::config::{CodegenOptions, DispatchConfig, ReadbackPolicy};
use crate::ir::validate::MAX_SCALARS;
use crate::ir::{Literal, Program, ScalarDecl, ScalarType};

use super::graph::ScratchBuffer;
use super::{DeviceBuffer, Kernel, Outputs, PendingDispatch, PinnedBuffer};

/// The readback every request starts with: every output buffer, whole.
static ALL_OUTPUTS: ReadbackPolicy = ReadbackPolicy::AllOutputs;

/// What a request runs.
#[derive(Clone, Copy, Debug)]
pub(in crate::backend) enum Target<'a> {
    /// A compiled kernel: no lookup at all.
    Kernel(&'a Kernel),
    /// A program, compiled through the backend's caches (a warm lookup walks no
    /// program).
    Program(&'a Program),
}

impl<'a> Target<'a> {
    /// The scalar parameters of what runs, in declaration order.
    pub(in crate::backend) fn scalars(self) -> &'a [ScalarDecl] {
        match self {
            Target::Kernel(kernel) => kernel.scalars(),
            Target::Program(program) => program.scalars(),
        }
    }
}

/// The values of a dispatch's scalar parameters, in the program's declaration order:
/// each value's bit pattern zero-extended to a `u64` word
/// ([`Literal::bits`]), and which positions have one. A fixed inline array, so a
/// request stays a `Copy` value that allocates nothing; a launch passes word `i` as
/// the kernel's scalar parameter `i` (a 32-bit parameter reads the word's low half:
/// the host is little-endian, as CUDA requires).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ScalarValues {
    words: [u64; MAX_SCALARS],
    /// Bit `i` set: position `i` has a value.
    supplied: u16,
}

// One supplied bit per scalar.
const _: () = assert!(MAX_SCALARS <= u16::BITS as usize);

impl ScalarValues {
    /// Every word, by declaration position (0 where no value was given).
    pub fn words(&self) -> &[u64; MAX_SCALARS] {
        &self.words
    }

    /// Whether position `position` has a value.
    pub fn is_supplied(&self, position: usize) -> bool {
        position < MAX_SCALARS && self.supplied & (1 << position) != 0
    }

    /// The value at `position` as a literal of `ty` (its declared type), if given.
    pub fn get(&self, position: usize, ty: ScalarType) -> Option<Literal> {
        self.is_supplied(position)
            .then(|| Literal::from_bits(ty, self.words[position]))
    }

    /// Give position `position` (below [`MAX_SCALARS`]) the value `value`.
    pub(in crate::backend) fn set(&mut self, position: usize, value: Literal) {
        if let Some(word) = self.words.get_mut(position) {
            *word = value.bits();
            self.supplied |= 1 << position;
        }
    }

    /// The first of the first `count` positions without a value (one mask test).
    pub(in crate::backend) fn first_missing(&self, count: usize) -> Option<usize> {
        let wanted = u16::MAX.checked_shr(u16::BITS - count.min(MAX_SCALARS) as u32);
        let missing = wanted.unwrap_or(0) & !self.supplied;
        (missing != 0).then(|| missing.trailing_zeros() as usize)
    }
}

/// A scalar value a request was given that its kernel cannot take, remembered by
/// [`Dispatch::scalar`] (which returns the request, not a `Result`) and refused when
/// the request is planned (`plan::check_request_scalars`).
#[derive(Clone, Copy, Debug)]
pub(in crate::backend) enum ScalarProblem<'a> {
    /// No scalar of this name is declared.
    Undeclared(&'a str),
    /// The scalar at `position` is declared with another type than `given`'s.
    WrongType { position: usize, given: Literal },
}

/// One dispatch: build it, then finish it with a backend's `run`, `submit` or
/// `run_into` (or record it into a graph). Cheap to copy; borrows what it names.
///
/// Defaults: one workgroup, one kernel run (`fixpoint_iterations` 1), every output
/// buffer read back whole, default code generation (for a program), timing by the
/// kernel's own stamps only, no predecessor.
///
/// ```
/// use vyre_cuda::backend::{AnyBackend, Binding, Dispatch, Timing};
/// use vyre_cuda::ir::*;
/// use vyre_cuda::DispatchConfig;
///
/// # fn main() -> Result<(), vyre_cuda::backend::BackendError> {
/// let program = Program::builder([64, 1, 1])
///     .buffer("x", 0, Access::ReadWrite, ElemType::U32, BufferCount::Runtime)
///     .body(|b| {
///         let i = b.let_("i", Expr::global_id(Axis::X));
///         b.if_(i.clone().less_than(Expr::length("x")), |b| {
///             b.store("x", i.clone(), Expr::load("x", i.clone()) + 1u32);
///         });
///     })
///     .build();
/// let backend = AnyBackend::cuda_or_reference();
/// let kernel = backend.compile(&program, &DispatchConfig::linear(1))?;
/// let x = backend.buffer_from(&[0u32; 64])?;
/// let bindings = [Binding::from(&x)];
/// let request = Dispatch::new(&kernel, &bindings).workgroups([1, 1, 1]);
/// let first = backend.submit(request)?; // returns at once
/// // Ordered after the first on the device; nothing waits on the host.
/// let second = backend.submit(request.after(&first).timing(Timing::EventWindow))?;
/// let finished = second.wait()?;
/// first.wait()?;
/// assert_eq!(finished.outputs.read::<u32>("x")?[..2], [2, 2]);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug)]
#[must_use = "a request does nothing until a backend runs, submits or records it"]
pub struct Dispatch<'a> {
    pub(in crate::backend) target: Target<'a>,
    pub(in crate::backend) bindings: &'a [Binding<'a>],
    pub(in crate::backend) workgroups: [u32; 3],
    pub(in crate::backend) fixpoint_iterations: u32,
    pub(in crate::backend) readback: &'a ReadbackPolicy,
    pub(in crate::backend) codegen: CodegenOptions,
    pub(in crate::backend) timing: Timing,
    pub(in crate::backend) after: Option<&'a PendingDispatch>,
    pub(in crate::backend) scalars: ScalarValues,
    /// The first value [`Dispatch::scalar`] could not take.
    pub(in crate::backend) scalar_problem: Option<ScalarProblem<'a>>,
}

impl<'a> Dispatch<'a> {
    /// A dispatch of a compiled `kernel` over `bindings`, one per global buffer of
    /// its program in binding order ([`Program::global_buffers`]).
    pub fn new(kernel: &'a Kernel, bindings: &'a [Binding<'a>]) -> Self {
        Self::of(Target::Kernel(kernel), bindings)
    }

    /// A dispatch of `program`, compiled on first use through the backend's caches
    /// (validated once, its PTX and module cached; later requests find it with a few
    /// hash lookups and walk no program). Keep the [`Kernel`] from `compile` and use
    /// [`Dispatch::new`] to skip even those lookups.
    pub fn program(program: &'a Program, bindings: &'a [Binding<'a>]) -> Self {
        Self::of(Target::Program(program), bindings)
    }

    fn of(target: Target<'a>, bindings: &'a [Binding<'a>]) -> Self {
        Dispatch {
            target,
            bindings,
            workgroups: [1, 1, 1],
            fixpoint_iterations: 1,
            readback: &ALL_OUTPUTS,
            codegen: CodegenOptions::new(),
            timing: Timing::KernelStamps,
            after: None,
            scalars: ScalarValues::default(),
            scalar_problem: None,
        }
    }

    /// The number of workgroups on each axis.
    pub fn workgroups(mut self, workgroups: [u32; 3]) -> Self {
        self.workgroups = workgroups;
        self
    }

    /// Run the kernel `n` times back to back inside the dispatch (at least 1); each
    /// run sees the buffers the previous one left.
    pub fn fixpoint_iterations(mut self, n: u32) -> Self {
        self.fixpoint_iterations = n;
        self
    }

    /// Which outputs come back (default: every output buffer, whole).
    pub fn readback(mut self, policy: &'a ReadbackPolicy) -> Self {
        self.readback = policy;
        self
    }

    /// Code-generation options for a [`Dispatch::program`] request (a kernel keeps
    /// the options it was compiled with).
    pub fn codegen(mut self, codegen: CodegenOptions) -> Self {
        self.codegen = codegen;
        self
    }

    /// Grid, fixpoint iterations, readback and code generation from `config`,
    /// replacing whatever an earlier call set (a [`Dispatch::workgroups`] before
    /// this one is lost: call it after `config` to launch another grid).
    pub fn config(mut self, config: &'a DispatchConfig) -> Self {
        self.workgroups = config.workgroups;
        self.fixpoint_iterations = config.fixpoint_iterations;
        self.readback = &config.readback;
        self.codegen = config.codegen;
        self
    }

    /// How the dispatch is timed (default [`Timing::KernelStamps`], which costs
    /// nothing).
    pub fn timing(mut self, timing: Timing) -> Self {
        self.timing = timing;
        self
    }

    /// Run after `previous` on the device: this dispatch's operations (uploads
    /// included) start only once everything `previous` enqueued has finished, and
    /// nothing waits on the host (an event recorded on `previous`'s stream and waited
    /// on by this one's). So a chain of dependent dispatches is submitted back to
    /// back and waited for once: wait for the last one first; the earlier ones' waits
    /// then find their streams idle. `previous` must come from the same backend.
    pub fn after(mut self, previous: &'a PendingDispatch) -> Self {
        self.after = Some(previous);
        self
    }

    /// [`Dispatch::after`] the last of `chain` (the steps of a chain submitted so
    /// far), or after nothing when `chain` is empty: a loop submitting dependent
    /// steps pushes each pending step and builds the next one with this.
    pub fn after_last(mut self, chain: &'a [PendingDispatch]) -> Self {
        self.after = chain.last();
        self
    }

    /// The value of the program's scalar parameter `name` for this dispatch (see
    /// [`ScalarDecl`]): a typed value (`5u32`, `-1i32`, `0.5f32`, `true`, `7u64`,
    /// `-7i64`, or a [`Literal`]) of exactly the declared type (no conversion:
    /// `5` is an `i32`). Every declared scalar needs a value; giving one twice keeps
    /// the last. A name the program does not declare, or a value of another type,
    /// makes the dispatch an `Err` starting `Fix:` (on every backend, from `run`,
    /// `submit`, `run_into` and graph recording alike; a later good value does not
    /// undo it). The name is matched against the declarations of what the request
    /// runs here, once, so planning the request checks a mask. A new value needs no
    /// new PTX and no new JIT: values are never part of a cache key.
    ///
    /// ```
    /// use vyre_cuda::backend::{AnyBackend, Binding, Dispatch};
    /// use vyre_cuda::ir::*;
    /// use vyre_cuda::DispatchConfig;
    ///
    /// # fn main() -> Result<(), vyre_cuda::backend::BackendError> {
    /// let scale = Program::builder([64, 1, 1])
    ///     .buffer("x", 0, Access::ReadWrite, ElemType::F32, BufferCount::Runtime)
    ///     .scalar("factor", ScalarType::F32)
    ///     .body(|b| {
    ///         let i = b.let_("i", Expr::global_id(Axis::X));
    ///         b.if_(i.clone().less_than(Expr::length("x")), |b| {
    ///             b.store("x", i.clone(), Expr::load("x", i.clone()) * Expr::scalar("factor"));
    ///         });
    ///     })
    ///     .build();
    /// let backend = AnyBackend::cuda_or_reference();
    /// let kernel = backend.compile(&scale, &DispatchConfig::linear(1))?;
    /// let x = backend.buffer_from(&[1.5f32; 64])?;
    /// let bindings = [Binding::from(&x)];
    /// let request = Dispatch::new(&kernel, &bindings);
    /// backend.run(request.scalar("factor", 2.0f32))?; // one kernel, any value
    /// backend.run(request.scalar("factor", 0.5f32))?;
    /// assert_eq!(backend.read::<f32>(&x)?[0], 1.5);
    /// let error = backend.run(request.scalar("factor", 2u32)).unwrap_err();
    /// assert!(error.to_string().starts_with("Fix:"), "{error}");
    /// # Ok(())
    /// # }
    /// ```
    pub fn scalar(mut self, name: &'a str, value: impl Into<Literal>) -> Self {
        let value = value.into();
        let declared = self.target.scalars();
        let problem = match declared.iter().position(|decl| &*decl.name == name) {
            Some(position) if declared[position].ty == value.ty() => {
                self.scalars.set(position, value);
                None
            }
            Some(position) => Some(ScalarProblem::WrongType {
                position,
                given: value,
            }),
            None => Some(ScalarProblem::Undeclared(name)),
        };
        if self.scalar_problem.is_none() {
            self.scalar_problem = problem;
        }
        self
    }

    /// The bindings, in binding order.
    pub fn bindings(&self) -> &'a [Binding<'a>] {
        self.bindings
    }

    /// The scalar values given so far ([`Dispatch::scalar`]), by declaration position.
    pub fn scalar_values(&self) -> &ScalarValues {
        &self.scalars
    }
}

/// One buffer binding of a [`Dispatch`], in the program's binding order.
/// Non-exhaustive: later versions may add binding kinds.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum Binding<'a> {
    /// A buffer of the backend, used in place: outputs stay in it (and are also
    /// read back per the readback policy). A dispatch in flight keeps its memory
    /// alive even if the buffer is dropped meanwhile.
    Buffer(&'a DeviceBuffer),
    /// Host bytes staged into a transient device buffer for this dispatch only
    /// (copied before `submit` returns, so the slice may be reused at once). Bound
    /// to a `WriteOnly` buffer only its length counts. See [`Binding::host`] for
    /// typed values.
    Host(&'a [u8]),
    /// A transient buffer of this many bytes that starts zeroed, for this dispatch
    /// only: an output stated by its length (read it back through the readback
    /// policy), or a zeroed scratch input.
    Zeroed(u64),
    /// Host bytes in caller-owned pinned memory, copied by DMA straight from it into
    /// a transient device buffer (no copy into staging). The dispatch holds the
    /// pinned memory until it is done, so it cannot be rewritten meanwhile
    /// ([`PinnedBuffer::as_mut_slice`] says `Fix:` while it is in flight). CUDA only.
    Pinned(&'a PinnedBuffer),
    /// A scratch buffer of the graph being recorded (graph recordings only).
    Scratch(ScratchBuffer),
}

impl<'a> Binding<'a> {
    /// Typed host values (`u32`, `f32`, any plain-old-data type), bound as their
    /// little-endian bytes: [`Binding::Host`] without a byte conversion.
    pub fn host<T: Pod>(values: &'a [T]) -> Self {
        Binding::Host(bytemuck::cast_slice(values))
    }

    /// [`Binding::Zeroed`] of `count` values of `T` (saturating: a length past
    /// `u64::MAX` is refused by the memory budget, never wrapped).
    pub fn zeroed<T: Pod>(count: u64) -> Self {
        Binding::Zeroed(count.saturating_mul(std::mem::size_of::<T>() as u64))
    }

    /// Bytes bound.
    pub fn len(&self) -> u64 {
        match self {
            Binding::Buffer(buffer) => buffer.len(),
            Binding::Host(bytes) => bytes.len() as u64,
            Binding::Zeroed(bytes) => *bytes,
            Binding::Pinned(pinned) => pinned.len() as u64,
            Binding::Scratch(scratch) => scratch.len(),
        }
    }

    /// True when no byte is bound.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the binding is a fresh transient buffer of this dispatch (host bytes,
    /// zeroed or pinned), which the memory preflight counts.
    pub(in crate::backend) fn is_transient(&self) -> bool {
        matches!(
            self,
            Binding::Host(_) | Binding::Zeroed(_) | Binding::Pinned(_)
        )
    }
}

impl<'a> From<&'a DeviceBuffer> for Binding<'a> {
    fn from(buffer: &'a DeviceBuffer) -> Self {
        Binding::Buffer(buffer)
    }
}

impl<'a> From<&'a PinnedBuffer> for Binding<'a> {
    fn from(buffer: &'a PinnedBuffer) -> Self {
        Binding::Pinned(buffer)
    }
}

impl From<ScratchBuffer> for Binding<'_> {
    fn from(scratch: ScratchBuffer) -> Self {
        Binding::Scratch(scratch)
    }
}

/// How a dispatch is timed. Both ways measure the kernel by its own stamps; the
/// difference is whether CUDA events are recorded too. Non-exhaustive.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Timing {
    /// The kernel's own `%globaltimer` stamps only ([`Timings::kernel_stamps_ns`]):
    /// measured on every dispatch at no cost.
    #[default]
    KernelStamps,
    /// The stamps plus a CUDA event pair around everything the dispatch enqueues
    /// (uploads, clears, launches, copies: [`Timings::event_window_ns`]) and the
    /// device instants [`PendingDispatch::wait_spans`] reports. On driver 580 the
    /// event records and elapsed-time queries cost about 10 µs of host time, more
    /// than the launch itself. On the reference interpreter there are no events.
    EventWindow,
}

/// How long one dispatch (or graph replay) took, each figure named by what
/// measured it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Timings {
    /// The whole call, host clock (for a submission: from `submit` to the end of
    /// `wait`).
    pub wall_ns: u64,
    /// Host time until the last asynchronous operation was enqueued.
    pub enqueue_ns: u64,
    /// Host time blocked in the one synchronize.
    pub wait_ns: u64,
    /// Device time of the launch loop from the kernel's own `%globaltimer` stamps:
    /// the earliest block start of the first launch to the moment the last thread of
    /// the last launch finished (32 ns ticks on the H200). Always measured, at no
    /// cost; 0 on the reference interpreter.
    pub kernel_stamps_ns: u64,
    /// Device time between a CUDA event pair around everything the dispatch
    /// enqueued: `Some` with [`Timing::EventWindow`] (or while the phase probe is on),
    /// `None` otherwise and on the reference interpreter.
    pub event_window_ns: Option<u64>,
    /// Where a lane request's device time went ([`LaneStamps`], from the lane
    /// server's `%globaltimer` stamps in its result area): `Some` for a request served
    /// by a CUDA lane, `None` otherwise and on the reference interpreter.
    pub lane_stamps: Option<LaneStamps>,
}

/// The phases of one lane request on the device, in nanoseconds (32 ns ticks on the
/// H200), from the stamps the lane's server writes into the result area's header
/// (each saturating at `u32::MAX`). Their sum is the server's part of the round trip;
/// the host's wait minus that is the doorbell's and the result words' trips over PCIe.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct LaneStamps {
    /// From the doorbell seen to the first workgroup: the record's copy (none when
    /// it equals the previous request's) and the prologue (zero fills, host inputs).
    pub setup_ns: u64,
    /// From the first workgroup to every workgroup of every fixpoint iteration done
    /// (with several blocks: the last one arrived).
    pub workgroups_ns: u64,
    /// From every workgroup done to the result words (readback bytes and their flags)
    /// issued to the result area (the end of [`Timings::kernel_stamps_ns`]). The
    /// server's GPU-scope publish fence comes after these words and before the
    /// completion word, which the delivery does not wait for, so no stamp holds it.
    pub readback_ns: u64,
}

/// What a blocking dispatch returns (and a pending one's `wait`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Finished {
    /// The bytes read back per the readback policy, in one allocation; look them up
    /// by buffer name ([`Outputs::get`], [`Outputs::read`]) or binding.
    pub outputs: Outputs,
    /// How long it took.
    pub timings: Timings,
}

impl Timings {
    /// The probe's record of these timings (its field names are the probe line's).
    pub(in crate::backend) fn probe(&self) -> crate::probe::DispatchTiming {
        crate::probe::DispatchTiming {
            wall_ns: self.wall_ns,
            enqueue_ns: self.enqueue_ns,
            wait_ns: self.wait_ns,
            device_window_ns: self.event_window_ns.unwrap_or(0),
            kernel_ns: self.kernel_stamps_ns,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DispatchConfig;

    /// Locks out a request that copies what it names or grows with its bindings: it
    /// is a few words that borrow (a fixed size whatever the binding count), and
    /// `Copy`, so finishing one request several ways needs no clone.
    #[test]
    fn a_request_is_small_and_copy() {
        fn assert_copy<T: Copy>() {}
        assert_copy::<Dispatch<'_>>();
        assert_copy::<Binding<'_>>();
        // 96 bytes before scalar parameters, plus the inline values (16 words and
        // their mask) and the remembered problem: `host_cost_request_building_and_planning`
        // measures what building and planning it costs.
        assert!(std::mem::size_of::<Dispatch<'_>>() <= 96 + 136 + 32);
    }

    /// Measures what building and planning a request cost on the host (the CPU half
    /// of the dispatch path that this API added or changed): a request value, the
    /// same with four scalar values (each `.scalar` matches its name against the
    /// kernel's declarations), the binding array from buffers, the shared plan
    /// (`plan_request`: sizes, buffers bound twice, scalars, readback) of a program
    /// without scalars and of one with four, its aliasing check alone, and the kernel handle
    /// `Outputs` keeps for lookups by name (one reference count up and down), at 9
    /// and 17 bindings; it prints the request's size. Run: `cargo test --release
    /// --lib host_cost_request -- --ignored --nocapture`.
    #[test]
    #[cfg(feature = "testing")]
    #[ignore = "host-cost instrument: run with --ignored --nocapture host_cost"]
    fn host_cost_request_building_and_planning() {
        use crate::backend::plan::{check_aliasing, plan_request, RequestPlan};
        use crate::backend::reference_backend::ReferenceKernel;
        use crate::backend::ReferenceBackend;
        use crate::host_cost::{Cell, CellOptions};
        use std::hint::black_box;
        use std::time::Duration;
        let options =
            CellOptions::with_targets(Duration::from_millis(200), Duration::from_millis(20));
        let backend = ReferenceBackend::new();
        println!(
            "Dispatch: {} bytes ({} of them ScalarValues)",
            std::mem::size_of::<Dispatch<'_>>(),
            std::mem::size_of::<ScalarValues>()
        );
        const NAMES: [&str; 4] = ["first", "second", "third", "fourth"];
        for buffers in [9u32, 17] {
            let plain = crate::fixtures::host_cost_fixture(buffers, 16);
            let scalars: Vec<ScalarDecl> = NAMES
                .iter()
                .map(|name| ScalarDecl::new(*name, ScalarType::U32))
                .collect();
            let program = Program::from_parts(
                plain.buffers_shared().clone(),
                scalars.into(),
                plain.workgroup_size(),
                plain.entry().clone(),
                None,
                false,
            );
            let compile = |program: &Program| {
                backend
                    .compile(program, &CodegenOptions::new())
                    .expect("compile")
            };
            let (kernel, plain_kernel) = (compile(&program), compile(&plain));
            let device: Vec<DeviceBuffer> = (0..buffers)
                .map(|_| backend.buffer(16).expect("buffer"))
                .collect();
            let bindings: Vec<Binding> = device.iter().map(Binding::from).collect();
            let config = DispatchConfig::linear(1);
            let reference = backend.reference_kernel(&kernel).expect("reference kernel");
            let plain_reference = backend
                .reference_kernel(&plain_kernel)
                .expect("reference kernel");
            fn with_scalars(request: Dispatch<'_>, round: u32) -> Dispatch<'_> {
                NAMES
                    .iter()
                    .fold(request, |request, &name| request.scalar(name, round))
            }
            let plan = |reference: &ReferenceKernel, request: &Dispatch<'_>| {
                let mut plan = RequestPlan::default();
                let slots = (&reference.slots[..], reference.program.scalars());
                plan_request(
                    &reference.name,
                    slots,
                    &reference.outputs,
                    request,
                    &mut plan,
                )
                .expect("plan");
                plan.staging_bytes as u64
            };
            let (kernel, plain_kernel) = (&kernel, &plain_kernel);
            let (bindings, config) = (&bindings[..], &config);
            // Planned again and again (a request is `Copy`): the plan alone.
            let plain_request = Dispatch::new(plain_kernel, bindings).config(config);
            let scalar_request = with_scalars(Dispatch::new(kernel, bindings).config(config), 7);
            let cells = [
                Cell::measure(
                    &format!("request value ({buffers} bindings)"),
                    &options,
                    |n| {
                        (0..n).fold(0u64, |acc, _| {
                            let request =
                                Dispatch::new(black_box(plain_kernel), black_box(bindings))
                                    .config(black_box(config))
                                    .timing(Timing::KernelStamps);
                            acc ^ black_box(request).bindings.len() as u64
                        })
                    },
                ),
                Cell::measure(
                    &format!("request value + 4 scalars ({buffers} bindings)"),
                    &options,
                    |n| {
                        (0..n).fold(0u64, |acc, round| {
                            let request = Dispatch::new(black_box(kernel), black_box(bindings))
                                .config(black_box(config));
                            let request = with_scalars(request, black_box(round as u32));
                            acc ^ black_box(request).scalars.words[3]
                        })
                    },
                ),
                Cell::measure(
                    &format!("binding array ({buffers} buffers)"),
                    &options,
                    |n| {
                        (0..n).fold(0u64, |acc, _| {
                            let array: crate::backend::PerBinding<Binding> =
                                black_box(&device).iter().map(Binding::from).collect();
                            acc ^ black_box(&array).len() as u64
                        })
                    },
                ),
                Cell::measure(
                    &format!("plan_request ({buffers} bindings)"),
                    &options,
                    |n| {
                        (0..n).fold(0u64, |acc, _| {
                            acc ^ plan(plain_reference, black_box(&plain_request))
                        })
                    },
                ),
                Cell::measure(
                    &format!("plan_request ({buffers} bindings, 4 scalars)"),
                    &options,
                    |n| {
                        (0..n).fold(0u64, |acc, _| {
                            acc ^ plan(reference, black_box(&scalar_request))
                        })
                    },
                ),
                Cell::measure(
                    &format!("check_aliasing alone ({buffers} bindings)"),
                    &options,
                    |n| {
                        (0..n).fold(0u64, |acc, _| {
                            check_aliasing(&reference.name, &reference.slots, black_box(bindings))
                                .expect("no aliasing");
                            acc ^ 1
                        })
                    },
                ),
                Cell::measure(
                    "kernel handle clone + drop (Outputs' names)",
                    &options,
                    |n| {
                        (0..n).fold(0u64, |acc, _| {
                            let handle = black_box(kernel).clone();
                            acc ^ black_box(&handle).name().len() as u64
                        })
                    },
                ),
            ];
            for cell in cells {
                let cell = cell.expect("measured");
                println!(
                    "{:<48} {:>8.1} ns (rsd {:.1} %)",
                    cell.name,
                    cell.minimum_ns_per_unit,
                    100.0 * cell.relative_std_dev.unwrap_or(0.0)
                );
            }
        }
    }

    /// Locks out a request that loses a value, reports the wrong scalar as missing
    /// or forgets a bad value: values land at their declaration positions (the last
    /// of two kept), the first missing position is found by the mask at every count
    /// up to 16 (0 and 16 included), and the first problem a request was given stays
    /// (a later good value does not hide it). Negative control: a request with every
    /// value and no problem has nothing missing.
    #[test]
    fn scalar_values_keep_positions_and_problems() {
        let mut values = ScalarValues::default();
        assert_eq!(values.first_missing(0), None);
        assert_eq!(values.first_missing(1), Some(0));
        for position in 0..MAX_SCALARS {
            values.set(position, Literal::U32(position as u32));
            assert_eq!(
                values.first_missing(MAX_SCALARS),
                (position + 1 < MAX_SCALARS).then_some(position + 1)
            );
        }
        assert_eq!(values.first_missing(MAX_SCALARS), None);
        values.set(3, Literal::I64(-1));
        assert_eq!(values.get(3, ScalarType::I64), Some(Literal::I64(-1)));
        assert_eq!(values.words()[3], u64::MAX);
        let mut sparse = ScalarValues::default();
        sparse.set(0, Literal::Bool(true));
        sparse.set(2, Literal::F32(0.5));
        assert_eq!(sparse.first_missing(3), Some(1));
        assert_eq!(sparse.get(1, ScalarType::U32), None);
        assert_eq!(sparse.get(2, ScalarType::F32), Some(Literal::F32(0.5)));

        let program = Program::builder([1, 1, 1])
            .scalar("a", ScalarType::U32)
            .scalar("b", ScalarType::F32)
            .build();
        let request = Dispatch::program(&program, &[]);
        let good = request
            .scalar("b", 1.0f32)
            .scalar("a", 1u32)
            .scalar("a", 2u32);
        assert!(good.scalar_problem.is_none());
        assert_eq!(good.scalars.first_missing(2), None);
        assert_eq!(good.scalars.get(0, ScalarType::U32), Some(Literal::U32(2)));
        let bad = request
            .scalar("a", 1i32)
            .scalar("c", 1u32)
            .scalar("a", 1u32);
        assert!(matches!(
            bad.scalar_problem,
            Some(ScalarProblem::WrongType {
                position: 0,
                given: Literal::I32(1)
            })
        ));
        let unknown = request.scalar("c", 1u32).scalar("a", 1i32);
        assert!(matches!(
            unknown.scalar_problem,
            Some(ScalarProblem::Undeclared("c"))
        ));
    }

    /// Locks out a typed binding that reinterprets the values' length: `host` binds
    /// the values' bytes exactly, `zeroed` counts bytes of the type, and a count past
    /// `u64::MAX` bytes saturates instead of wrapping to a small buffer.
    #[test]
    fn typed_bindings_count_bytes() {
        let words = [1u32, 2, 3];
        assert_eq!(Binding::host(&words).len(), 12);
        assert_eq!(Binding::zeroed::<u32>(5).len(), 20);
        assert_eq!(Binding::zeroed::<u64>(u64::MAX).len(), u64::MAX);
        assert!(Binding::Zeroed(0).is_empty());
    }
}
