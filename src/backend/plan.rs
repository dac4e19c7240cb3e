//! The binding plan: which buffers a kernel takes, in which order, which of them
//! come back, and where each read-back range lands in staging.
//!
//! Pure arithmetic over the program's declarations, kept apart from the driver so
//! every rule is tested on the CPU, and shared by the CUDA backend and the
//! reference interpreter's backend so both refuse the same request with the same
//! `Fix:` error at the same point ([`plan_request`]): a dispatch's bindings are
//! checked against the kernel (count, exact static sizes, runtime sizes a multiple
//! of the element, no written buffer bound twice), and its readback policy is turned
//! into byte ranges with checked bounds, before anything is enqueued.

use smallvec::SmallVec;

use crate::config::ReadbackPolicy;
use crate::ir::validate::{shown, MAX_SCALARS};
use crate::ir::{Access, BufferCount, ElemType, Literal, Name, Program, ScalarDecl};

use super::request::ScalarProblem;
use super::{BackendError, Binding, DeviceBuffer, Dispatch};

/// Bindings (and readback items) one dispatch keeps inline, off the heap: the lists
/// of the dispatch path that grow with every binding or readback item (sizes,
/// addresses, buffer holds, kernel parameters, order-book accesses, readback
/// plans, routes and deliveries) are [`PerBinding`]s. With 16 the measurement
/// fixture's 17-buffer shape spilled six of them to the heap on every dispatch (an
/// allocation and a free each). Lists only host, zeroed or pinned bindings add to
/// (transient buffers, uploads, clears) keep 16 inline.
pub(in crate::backend) const INLINE_BINDINGS: usize = 32;

/// A per-binding list of the dispatch path, inline up to [`INLINE_BINDINGS`].
pub(in crate::backend) type PerBinding<T> = smallvec::SmallVec<[T; INLINE_BINDINGS]>;

/// The driver's kernel parameter array: two values per binding, then the result
/// ABI's five, then the scalars, inline up to [`INLINE_BINDINGS`] bindings.
pub(in crate::backend) type ParameterArray =
    smallvec::SmallVec<[*mut std::ffi::c_void; 2 * INLINE_BINDINGS + 5 + MAX_SCALARS]>;

/// The scalar parameter words of one launch, in declaration order (always inline).
pub(in crate::backend) type ScalarWords = smallvec::SmallVec<[u64; MAX_SCALARS]>;

/// One kernel parameter slot (a global buffer), in binding order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::backend) struct ParamSlot {
    pub(in crate::backend) binding: u32,
    pub(in crate::backend) name: Name,
    pub(in crate::backend) elem: ElemType,
    pub(in crate::backend) count: BufferCount,
    pub(in crate::backend) access: Access,
}

/// The parameter slots of a (lowered) program and the indices of its outputs.
pub(in crate::backend) fn binding_slots(
    program: &Program,
) -> (SmallVec<[ParamSlot; 16]>, SmallVec<[u16; 16]>) {
    let slots: SmallVec<[ParamSlot; 16]> = program
        .global_buffers()
        .into_iter()
        .map(|b| ParamSlot {
            binding: b.binding,
            name: b.name.clone(),
            elem: b.elem,
            count: b.count,
            access: b.access,
        })
        .collect();
    let outputs = slots
        .iter()
        .enumerate()
        .filter(|(_, s)| s.access.is_output())
        .map(|(i, _)| i as u16)
        .collect();
    (slots, outputs)
}

/// One range to read back, with its place in staging.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::backend) struct ReadItem {
    /// Index into the slots.
    pub(in crate::backend) slot: u16,
    pub(in crate::backend) offset: u64,
    pub(in crate::backend) len: u64,
    pub(in crate::backend) staging_offset: usize,
}

/// Staging sections start on this alignment (the copy engines' preference).
pub(in crate::backend) const STAGING_ALIGN: usize = 256;

/// `v` rounded up to [`STAGING_ALIGN`].
pub(in crate::backend) fn align_up(v: usize) -> usize {
    v.div_ceil(STAGING_ALIGN).saturating_mul(STAGING_ALIGN)
}

/// Checks bound byte sizes (one per slot) and the replay count against the slots.
pub(in crate::backend) fn check_binding_sizes(
    kernel_name: &str,
    slots: &[ParamSlot],
    sizes: &[u64],
    fixpoint_iterations: u32,
) -> Result<(), BackendError> {
    if sizes.len() != slots.len() {
        let expected: Vec<String> = slots
            .iter()
            .map(|s| format!("{} (binding {})", s.name, s.binding))
            .collect();
        return Err(BackendError::bad_input(format!(
            "Fix: {kernel_name} takes {} buffers in binding order [{}] but {} were given",
            slots.len(),
            expected.join(", "),
            sizes.len()
        )));
    }
    if fixpoint_iterations == 0 {
        return Err(BackendError::bad_input(
            "Fix: the dispatch's fixpoint_iterations is 0; use at least 1",
        ));
    }
    for (slot, &bytes) in slots.iter().zip(sizes) {
        let elem = slot.elem.size_bytes() as u64;
        match slot.count {
            BufferCount::Static(n) if bytes != n as u64 * elem => {
                return Err(BackendError::bad_input(format!(
                    "Fix: buffer '{}' (binding {}) of {kernel_name} is declared {} × {} = {} bytes but {} bytes \
                     were bound; bind exactly {} bytes",
                    slot.name,
                    slot.binding,
                    n,
                    slot.elem.name(),
                    n as u64 * elem,
                    bytes,
                    n as u64 * elem
                )))
            }
            BufferCount::Runtime if bytes % elem != 0 || bytes / elem > u32::MAX as u64 => {
                return Err(BackendError::bad_input(format!(
                    "Fix: buffer '{}' (binding {}) of {kernel_name} holds {} elements, so its byte length must \
                     be a multiple of {elem} and at most {} bytes, but {bytes} bytes were bound",
                    slot.name,
                    slot.binding,
                    slot.elem.name(),
                    u32::MAX as u64 * elem
                )))
            }
            _ => {}
        }
    }
    Ok(())
}

/// Turns a readback policy into ranges placed in staging from `staging_start` on
/// (each aligned); returns the end of the last one.
pub(in crate::backend) fn plan_readback(
    kernel_name: &str,
    slots: &[ParamSlot],
    outputs: &[u16],
    sizes: &[u64],
    policy: &ReadbackPolicy,
    staging_start: usize,
    reads: &mut PerBinding<ReadItem>,
) -> Result<usize, BackendError> {
    let mut staging = staging_start;
    let mut push = |slot: u16, offset: u64, len: u64, reads: &mut PerBinding<ReadItem>| {
        reads.push(ReadItem {
            slot,
            offset,
            len,
            staging_offset: staging,
        });
        staging = staging.saturating_add(align_up(len as usize));
    };
    match policy {
        ReadbackPolicy::AllOutputs => {
            for &slot in outputs {
                push(slot, 0, sizes[slot as usize], reads);
            }
        }
        ReadbackPolicy::None => {}
        ReadbackPolicy::Ranges(ranges) => {
            for range in ranges {
                let Some(slot) = outputs
                    .iter()
                    .copied()
                    .find(|&s| slots[s as usize].binding == range.binding)
                else {
                    return Err(BackendError::bad_input(format!(
                        "Fix: readback range names binding {}, which is not an output (read_write or \
                         write_only) buffer of {kernel_name}; name one of its output bindings",
                        range.binding
                    )));
                };
                let size = sizes[slot as usize];
                let end = range.offset.checked_add(range.len);
                if end.is_none_or(|end| end > size) {
                    return Err(BackendError::bad_input(format!(
                        "Fix: readback range {}..+{} of binding {} is past the buffer's {size} bytes; \
                         keep offset + len within the buffer",
                        range.offset, range.len, range.binding
                    )));
                }
                push(slot, range.offset, range.len, reads);
            }
        }
    }
    Ok(staging)
}

/// What [`plan_request`] found: the bytes bound per slot and the readback items,
/// with the staging the uploads and readbacks need.
#[derive(Default)]
pub(in crate::backend) struct RequestPlan {
    /// Bytes bound per slot, in binding order.
    pub(in crate::backend) sizes: PerBinding<u64>,
    /// The readback items, in order, each placed in staging after the uploads.
    pub(in crate::backend) reads: PerBinding<ReadItem>,
    /// Staging bytes the host uploads take (each aligned).
    pub(in crate::backend) upload_bytes: usize,
    /// The end of the last readback's staging range.
    pub(in crate::backend) staging_bytes: usize,
}

/// The checks and plans every backend makes of a request before it touches any
/// memory, in one order: binding count and sizes, fixpoint iterations, buffers
/// bound twice, the readback policy. Pure; `plan` is filled in place (it is large:
/// the dispatch path keeps it on its stack).
pub(in crate::backend) fn plan_request(
    kernel_name: &str,
    (slots, scalars): (&[ParamSlot], &[ScalarDecl]),
    outputs: &[u16],
    request: &Dispatch<'_>,
    plan: &mut RequestPlan,
) -> Result<(), BackendError> {
    plan.sizes.extend(request.bindings.iter().map(Binding::len));
    check_binding_sizes(kernel_name, slots, &plan.sizes, request.fixpoint_iterations)?;
    check_aliasing(kernel_name, slots, request.bindings)?;
    check_request_scalars(kernel_name, scalars, request)?;
    plan.upload_bytes = 0;
    for (slot, binding) in slots.iter().zip(request.bindings) {
        if let Binding::Host(bytes) = binding {
            if slot.access != Access::WriteOnly {
                plan.upload_bytes = plan.upload_bytes.saturating_add(align_up(bytes.len()));
            }
        }
    }
    plan.staging_bytes = plan_readback(
        kernel_name,
        slots,
        outputs,
        &plan.sizes,
        request.readback,
        plan.upload_bytes,
        &mut plan.reads,
    )?;
    Ok(())
}

/// The scalar values of a request against the kernel's declarations (`scalars`):
/// the first value [`Dispatch::scalar`] could not take (a name not declared, a value
/// of another type), then the first declared scalar without a value. O(1) when all
/// is well (one mask test): the names were matched when the request was built.
pub(in crate::backend) fn check_request_scalars(
    kernel_name: &str,
    scalars: &[ScalarDecl],
    request: &Dispatch<'_>,
) -> Result<(), BackendError> {
    match request.scalar_problem {
        Some(ScalarProblem::Undeclared(name)) => {
            return Err(undeclared_scalar(kernel_name, scalars, name))
        }
        Some(ScalarProblem::WrongType { position, given }) => {
            let decl = scalars.get(position).ok_or_else(|| {
                BackendError::internal("a scalar problem names a position the kernel lacks")
            })?;
            return Err(mistyped_scalar(kernel_name, decl, given));
        }
        None => {}
    }
    match request.scalars.first_missing(scalars.len()) {
        Some(position) => {
            let decl = &scalars[position];
            Err(BackendError::bad_input(format!(
                "Fix: the request gives no value for scalar `{}` ({}) of {kernel_name}; add \
                 .scalar(\"{0}\", value) to the Dispatch (every declared scalar needs one: {})",
                shown(&decl.name),
                decl.ty.name(),
                declared_scalars(scalars)
            )))
        }
        None => Ok(()),
    }
}

/// The position of the scalar `name` among `scalars` when `value` fits its type: a
/// graph step's value update checks it as a request's value is checked, with the
/// same errors.
pub(in crate::backend) fn scalar_position(
    kernel_name: &str,
    scalars: &[ScalarDecl],
    name: &str,
    value: Literal,
) -> Result<usize, BackendError> {
    let position = scalars
        .iter()
        .position(|decl| &*decl.name == name)
        .ok_or_else(|| undeclared_scalar(kernel_name, scalars, name))?;
    let decl = &scalars[position];
    if decl.ty != value.ty() {
        return Err(mistyped_scalar(kernel_name, decl, value));
    }
    Ok(position)
}

/// `[name: type, ...]` of a kernel's scalars, for messages.
fn declared_scalars(scalars: &[ScalarDecl]) -> String {
    let list: Vec<String> = scalars
        .iter()
        .map(|decl| format!("{}: {}", shown(&decl.name), decl.ty.name()))
        .collect();
    format!("[{}]", list.join(", "))
}

/// The `Fix:` error for a scalar name the kernel does not declare.
pub(in crate::backend) fn undeclared_scalar(
    kernel_name: &str,
    scalars: &[ScalarDecl],
    name: &str,
) -> BackendError {
    BackendError::bad_input(format!(
        "Fix: {kernel_name} declares no scalar named `{}` (its scalars: {}); give values only \
         to declared scalars",
        shown(name),
        declared_scalars(scalars)
    ))
}

/// The `Fix:` error for a scalar value of another type than declared.
fn mistyped_scalar(kernel_name: &str, decl: &ScalarDecl, given: Literal) -> BackendError {
    BackendError::bad_input(format!(
        "Fix: scalar `{}` of {kernel_name} is declared {} but was given {given}, a {}; pass a \
         {1} value (typed literals: 5u32, -5i32, 0.5f32, true, 5u64, -5i64)",
        shown(&decl.name),
        decl.ty.name(),
        given.ty().name()
    ))
}

/// The one rule for a buffer bound twice in one dispatch: allowed when no slot it
/// is bound to writes it (two names for one read-only table), refused otherwise.
/// Through two names, one written, the result would depend on the order threads
/// run and on whether a backend stages copies (a CUDA kernel writes the memory the
/// other name reads, the interpreter used to read a copy), so no backend accepts
/// it. Pure: owned buffers cannot share memory, so buffer identity is the address
/// of the `DeviceBuffer` bound.
pub(in crate::backend) fn check_aliasing(
    kernel_name: &str,
    slots: &[ParamSlot],
    bindings: &[Binding<'_>],
) -> Result<(), BackendError> {
    // The common case (no buffer bound twice) is one sort of the buffers' addresses:
    // a pair-by-pair walk of the bindings cost 172 ns at 17 bindings on the build
    // machine (the `host_cost_request_building_and_planning` instrument), this about
    // 50 ns. Only a repeated address looks at the slots.
    let address = |binding: &Binding<'_>| match binding {
        Binding::Buffer(buffer) => Some(*buffer as *const DeviceBuffer as usize),
        _ => None,
    };
    let mut sorted: PerBinding<usize> = bindings.iter().filter_map(address).collect();
    sorted.sort_unstable();
    if !sorted.windows(2).any(|pair| pair[0] == pair[1]) {
        return Ok(());
    }
    for (first, (slot, binding)) in slots.iter().zip(bindings).enumerate() {
        let Some(this) = address(binding) else {
            continue;
        };
        for (other_slot, other) in slots.iter().zip(bindings).skip(first + 1) {
            let same = address(other) == Some(this);
            if same && (slot.access.is_output() || other_slot.access.is_output()) {
                return Err(BackendError::bad_input(format!(
                    "Fix: one DeviceBuffer is bound to both '{}' (binding {}) and '{}' (binding {}) \
                     of {kernel_name}, and the kernel writes it through one of them, so the result \
                     would depend on thread order; bind separate buffers (copy the input into a \
                     second buffer first)",
                    slot.name, slot.binding, other_slot.name, other_slot.binding
                )));
            }
        }
    }
    Ok(())
}

/// The rules of binding another buffer at `slot` of a recorded dispatch of
/// `kernel_name` (`DispatchGraph::set_buffer`, the reference graph's twin),
/// the same on both backends: the step was recorded over `recorded_bytes` there
/// and the new buffer holds `new_bytes`; `also_bound_at` are the step's other
/// slots already bound to the new buffer; `transfers_touch_old` says whether an
/// upload or a read-back of the graph touches the buffer it replaces.
pub(in crate::backend) fn check_rebind(
    kernel_name: &str,
    slots: &[ParamSlot],
    slot: usize,
    (recorded_bytes, new_bytes): (u64, u64),
    also_bound_at: &[usize],
    transfers_touch_old: bool,
) -> Result<(), BackendError> {
    let this = &slots[slot];
    let named = format!(
        "'{}' (binding {}) of {kernel_name}",
        this.name, this.binding
    );
    if this.access == Access::WriteOnly {
        return Err(BackendError::bad_input(format!(
            "Fix: {named} is write-only, which the graph clears before each launch at the \
             address it was recorded with; record the graph again over the other buffer"
        )));
    }
    if new_bytes < recorded_bytes {
        return Err(BackendError::bad_input(format!(
            "Fix: {named} was recorded over {recorded_bytes} bytes and the new buffer \
             holds {new_bytes}; bind a buffer of at least {recorded_bytes} bytes"
        )));
    }
    if let Some(other) = also_bound_at
        .iter()
        .map(|&other| &slots[other])
        .find(|other| this.access.is_output() || other.access.is_output())
    {
        return Err(BackendError::bad_input(format!(
            "Fix: the new buffer of {named} is already bound to '{}' (binding {}) of that \
             dispatch, and the kernel writes it through one of them, so the result would \
             depend on thread order; bind a buffer of its own",
            other.name, other.binding
        )));
    }
    if transfers_touch_old {
        return Err(BackendError::bad_input(format!(
            "Fix: the graph also uploads into or reads back from the buffer that {named} \
             passes, and those copies keep its address; record the graph again over the \
             other buffer"
        )));
    }
    Ok(())
}

/// Checks caller output slices against the readback items: one per item, each
/// exactly the item's length (the into-caller-buffers path allocates nothing, so
/// it cannot resize them).
pub(in crate::backend) fn check_output_slices(
    reads: &[ReadItem],
    outputs: &[&mut [u8]],
) -> Result<(), BackendError> {
    if outputs.len() == reads.len()
        && outputs
            .iter()
            .zip(reads)
            .all(|(o, r)| o.len() as u64 == r.len)
    {
        return Ok(());
    }
    let wanted: Vec<u64> = reads.iter().map(|r| r.len).collect();
    let got: Vec<usize> = outputs.iter().map(|o| o.len()).collect();
    Err(BackendError::bad_input(format!(
        "Fix: run_into needs {} output slices of lengths {wanted:?} (one per readback item) but \
         got lengths {got:?}",
        reads.len()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ByteRange;
    use crate::ir::Program;

    /// in (read-only u32×4, binding 3), out (write-only u8, runtime, binding 0),
    /// acc (read-write u32 runtime, binding 7): declared out of binding order.
    fn program() -> Program {
        Program::builder([1, 1, 1])
            .buffer(
                "in",
                3,
                Access::ReadOnly,
                ElemType::U32,
                BufferCount::Static(4),
            )
            .buffer(
                "out",
                0,
                Access::WriteOnly,
                ElemType::U8,
                BufferCount::Runtime,
            )
            .buffer(
                "acc",
                7,
                Access::ReadWrite,
                ElemType::U32,
                BufferCount::Runtime,
            )
            .buffer(
                "shared",
                9,
                Access::Workgroup,
                ElemType::U32,
                BufferCount::Static(8),
            )
            .build()
    }

    /// Locks out the two answers the backends used to give for one buffer bound as
    /// input and as write-only output ([2,2,2,2] on the interpreter, [0,0,0,0] on
    /// CUDA): a buffer bound to two slots one of which writes it is a `Fix:` error
    /// naming both; two read-only names of one buffer are allowed. Negative control:
    /// two distinct buffers in the same slots pass.
    #[test]
    fn a_written_buffer_bound_twice_is_refused() {
        let backend = crate::backend::ReferenceBackend::new();
        let (a, b) = (backend.buffer(16).unwrap(), backend.buffer(16).unwrap());
        let slot = |binding: u32, access| ParamSlot {
            binding,
            name: Name::from(format!("s{binding}").as_str()),
            elem: ElemType::U32,
            count: BufferCount::Runtime,
            access,
        };
        let read_write = [slot(0, Access::ReadOnly), slot(1, Access::WriteOnly)];
        let message = check_aliasing("p", &read_write, &[Binding::from(&a), Binding::from(&a)])
            .unwrap_err()
            .to_string();
        assert!(
            message.starts_with("Fix:") && message.contains("'s0'") && message.contains("'s1'"),
            "{message}"
        );
        assert!(check_aliasing("p", &read_write, &[Binding::from(&a), Binding::from(&b)]).is_ok());
        let both_read = [slot(0, Access::ReadOnly), slot(1, Access::ReadOnly)];
        assert!(check_aliasing("p", &both_read, &[Binding::from(&a), Binding::from(&a)]).is_ok());
        let host = [1u8; 16];
        assert!(check_aliasing(
            "p",
            &read_write,
            &[Binding::Host(&host), Binding::Host(&host)]
        )
        .is_ok());
    }

    /// Locks out a plan that follows declaration order or includes workgroup memory:
    /// slots are the global buffers in binding order, outputs are their indices.
    #[test]
    fn slots_follow_binding_order_and_skip_workgroup_memory() {
        let (slots, outputs) = binding_slots(&program());
        let names: Vec<&str> = slots.iter().map(|s| &*s.name).collect();
        assert_eq!(names, ["out", "in", "acc"]);
        assert_eq!(outputs.as_slice(), &[0, 2]);
    }

    /// Locks out unchecked binding sizes: a wrong count, a static size off by one, a
    /// runtime size that is not a whole number of elements, and zero replays are Fix
    /// errors naming the buffer; exact sizes pass (the control).
    #[test]
    fn binding_sizes_are_checked_exactly() {
        let (slots, _) = binding_slots(&program());
        assert!(check_binding_sizes("p", &slots, &[3, 16, 8], 1).is_ok());
        let cases: [(&[u64], u32, &str); 5] = [
            (&[3, 16], 1, "takes 3 buffers"),
            (&[3, 15, 8], 1, "'in'"),
            (&[3, 16, 6], 1, "'acc'"),
            (&[3, 16, 8], 0, "fixpoint_iterations is 0"),
            (&[3, 17, 8], 1, "bind exactly 16 bytes"),
        ];
        for (sizes, fixpoint, needle) in cases {
            let message = check_binding_sizes("p", &slots, sizes, fixpoint)
                .unwrap_err()
                .to_string();
            assert!(
                message.starts_with("Fix:") && message.contains(needle),
                "{message} lacks {needle}"
            );
        }
        // A runtime buffer longer than u32::MAX elements cannot be described by its length word.
        let too_long = (u32::MAX as u64 + 1) * 4;
        assert!(check_binding_sizes("p", &slots, &[3, 16, too_long], 1).is_err());
    }

    /// Locks out readback ranges that land on top of each other or outside their
    /// buffer: all outputs come back in binding order at aligned staging offsets,
    /// ranges keep the order asked, and a non-output or out-of-range request
    /// (including one whose end overflows u64) is a Fix error.
    #[test]
    fn readback_plans_are_aligned_ordered_and_bounded() {
        let (slots, outputs) = binding_slots(&program());
        let sizes = [300u64, 16, 1000];
        let mut reads = SmallVec::new();
        let end = plan_readback(
            "p",
            &slots,
            &outputs,
            &sizes,
            &ReadbackPolicy::AllOutputs,
            512,
            &mut reads,
        )
        .unwrap();
        assert_eq!(
            reads.as_slice(),
            &[
                ReadItem {
                    slot: 0,
                    offset: 0,
                    len: 300,
                    staging_offset: 512
                },
                ReadItem {
                    slot: 2,
                    offset: 0,
                    len: 1000,
                    staging_offset: 512 + 512
                },
            ]
        );
        assert_eq!(end, 512 + 512 + 1024);

        let mut reads = SmallVec::new();
        let ranges = ReadbackPolicy::Ranges(smallvec::smallvec![
            ByteRange {
                binding: 7,
                offset: 996,
                len: 4
            },
            ByteRange {
                binding: 0,
                offset: 0,
                len: 1
            },
        ]);
        plan_readback("p", &slots, &outputs, &sizes, &ranges, 0, &mut reads).unwrap();
        assert_eq!(
            reads.as_slice(),
            &[
                ReadItem {
                    slot: 2,
                    offset: 996,
                    len: 4,
                    staging_offset: 0
                },
                ReadItem {
                    slot: 0,
                    offset: 0,
                    len: 1,
                    staging_offset: 256
                },
            ]
        );

        let mut none = SmallVec::new();
        assert_eq!(
            plan_readback(
                "p",
                &slots,
                &outputs,
                &sizes,
                &ReadbackPolicy::None,
                64,
                &mut none
            )
            .unwrap(),
            64
        );
        assert!(none.is_empty());

        for (range, needle) in [
            (
                ByteRange {
                    binding: 3,
                    offset: 0,
                    len: 4,
                },
                "not an output",
            ),
            (
                ByteRange {
                    binding: 7,
                    offset: 997,
                    len: 4,
                },
                "past the buffer",
            ),
            (
                ByteRange {
                    binding: 7,
                    offset: u64::MAX,
                    len: 2,
                },
                "past the buffer",
            ),
        ] {
            let mut reads = SmallVec::new();
            let policy = ReadbackPolicy::Ranges(smallvec::smallvec![range]);
            let message = plan_readback("p", &slots, &outputs, &sizes, &policy, 0, &mut reads)
                .unwrap_err()
                .to_string();
            assert!(
                message.starts_with("Fix:") && message.contains(needle),
                "{message}"
            );
        }
    }
}
