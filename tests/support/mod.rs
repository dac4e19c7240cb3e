//! Helpers shared by the GPU test binaries.
#![allow(dead_code)]

pub mod lane;
pub mod parity;
pub mod sanitizer;
pub mod stitch;
pub mod wide_shared;

use vyre_cuda::backend::{CudaBackend, DeviceBuffer};
use vyre_cuda::ir::{Access, Axis, BufferCount, ElemType, Expr, Program};
use vyre_cuda::DispatchConfig;

/// The backend of device 0; GPU tests are ignored unless run on a CUDA machine,
/// where a missing device is a real failure.
pub fn backend() -> CudaBackend {
    CudaBackend::acquire().unwrap_or_else(|e| panic!("gpu test needs a CUDA device: {e}"))
}

/// A device buffer holding a copy of each input, in order.
pub fn buffer_copies(gpu: &CudaBackend, inputs: &[Vec<u8>]) -> Vec<DeviceBuffer> {
    inputs.iter().map(|v| gpu.buffer_from(v).unwrap()).collect()
}

/// Bindings of every buffer in `buffers`, in order.
pub fn bindings(buffers: &[DeviceBuffer]) -> Vec<vyre_cuda::backend::Binding<'_>> {
    buffers
        .iter()
        .map(vyre_cuda::backend::Binding::from)
        .collect()
}

/// Host bindings of every input in `inputs`, in order.
pub fn host_bindings(inputs: &[Vec<u8>]) -> Vec<vyre_cuda::backend::Binding<'_>> {
    inputs
        .iter()
        .map(|v| vyre_cuda::backend::Binding::Host(v))
        .collect()
}

/// Run `program` over host inputs (one per global buffer, in binding order) and
/// wait: what the tests call "a dispatch of borrowed bytes".
pub fn run_host(
    gpu: &CudaBackend,
    program: &Program,
    inputs: &[&[u8]],
    config: &DispatchConfig,
) -> Result<vyre_cuda::backend::Outputs, vyre_cuda::backend::BackendError> {
    let bindings: Vec<vyre_cuda::backend::Binding> = inputs
        .iter()
        .map(|bytes| vyre_cuda::backend::Binding::Host(bytes))
        .collect();
    gpu.run(vyre_cuda::backend::Dispatch::program(program, &bindings).config(config))
        .map(|finished| finished.outputs)
}

/// Run `program` over device buffers (one per global buffer, in binding order) and
/// wait: outputs stay in the buffers and come back per `config.readback`.
pub fn run_buffers(
    gpu: &CudaBackend,
    program: &Program,
    buffers: &[DeviceBuffer],
    config: &DispatchConfig,
) -> Result<vyre_cuda::backend::Finished, vyre_cuda::backend::BackendError> {
    let bound = bindings(buffers);
    gpu.run(vyre_cuda::backend::Dispatch::program(program, &bound).config(config))
}

/// [`run_host`] of a generated case with `scalars` (one value per scalar parameter).
pub fn run_case_host(
    gpu: &CudaBackend,
    case: &vyre_cuda::ir::generate::RandomCase,
    scalars: &[vyre_cuda::ir::Literal],
) -> Result<vyre_cuda::backend::Outputs, vyre_cuda::backend::BackendError> {
    let bindings = host_bindings(&case.inputs);
    let request = vyre_cuda::backend::Dispatch::program(&case.program, &bindings);
    gpu.run(with_scalars(request, &case.program, scalars).config(&case.config))
        .map(|finished| finished.outputs)
}

/// [`run_buffers`] of a generated case with its own scalar values.
pub fn run_case_buffers(
    gpu: &CudaBackend,
    case: &vyre_cuda::ir::generate::RandomCase,
    buffers: &[DeviceBuffer],
) -> Result<vyre_cuda::backend::Finished, vyre_cuda::backend::BackendError> {
    let bound = bindings(buffers);
    let request = vyre_cuda::backend::Dispatch::program(&case.program, &bound);
    gpu.run(with_scalars(request, &case.program, &case.scalars).config(&case.config))
}

/// Inputs of the measurement fixture (`vyre_cuda::fixtures::host_cost_fixture`): every
/// global buffer zeroed at its static size, with `x` in the first word of `in`.
pub fn fixture_inputs(program: &Program, x: u32) -> Vec<Vec<u8>> {
    let mut inputs = static_zeros(program);
    for (decl, input) in program.global_buffers().iter().zip(&mut inputs) {
        if &*decl.name == "in" {
            input[..4].copy_from_slice(&x.to_le_bytes());
        }
    }
    inputs
}

/// One zeroed input per global buffer of `program` (all of static count), at its
/// size, in binding order.
pub fn static_zeros(program: &Program) -> Vec<Vec<u8>> {
    program
        .global_buffers()
        .iter()
        .map(|decl| vec![0; decl.static_size_bytes().expect("a static count") as usize])
        .collect()
}

/// Outputs of the reference interpreter for the same request.
pub fn reference(program: &Program, inputs: &[Vec<u8>], config: &DispatchConfig) -> Vec<Vec<u8>> {
    let borrowed: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
    vyre_cuda::reference::run(program, &borrowed, config)
        .unwrap_or_else(|e| panic!("reference failed: {e}\n{program}"))
}

/// The reference interpreter's outputs for a generated case with `scalars` (its own
/// values, or another draw of `RandomCase::scalar_values`).
pub fn case_reference(
    case: &vyre_cuda::ir::generate::RandomCase,
    scalars: &[vyre_cuda::ir::Literal],
) -> Vec<Vec<u8>> {
    let options = vyre_cuda::reference::ReferenceOptions::default();
    vyre_cuda::reference::run_with_scalars(
        &case.program,
        &case.input_slices(),
        scalars,
        &case.config,
        &options,
    )
    .map(|(outputs, _)| outputs)
    .unwrap_or_else(|e| {
        panic!(
            "seed {}: reference failed: {e}\n{}",
            case.seed, case.program
        )
    })
}

/// `request` with one value per scalar parameter of `program`, in declaration order.
pub fn with_scalars<'a>(
    mut request: vyre_cuda::backend::Dispatch<'a>,
    program: &'a Program,
    values: &[vyre_cuda::ir::Literal],
) -> vyre_cuda::backend::Dispatch<'a> {
    for (decl, &value) in program.scalars().iter().zip(values) {
        request = request.scalar(&decl.name, value);
    }
    request
}

/// The scalar values each generated case is dispatched with: its own, and for a
/// program with scalar parameters one more draw (the same kernel must follow new
/// values).
pub fn value_draws(
    case: &vyre_cuda::ir::generate::RandomCase,
) -> impl Iterator<Item = Vec<vyre_cuda::ir::Literal>> + '_ {
    let draws = if case.program.scalars().is_empty() {
        1
    } else {
        2
    };
    (0..draws).map(|draw| case.scalar_values(draw))
}

/// One scalar parameter of every type (`s_u32`, `s_i32`, `s_f32`, `s_bool`, `s_u64`,
/// `s_i64`), each written by every thread with its id mixed in into its own static
/// 8-element output (`out_u32`, ...; `bool` as a `u32` 0 or 1), over 8 threads:
/// `u + i`, `s - i`, `f * i`, `b`, `w + i`, `x - i`.
pub fn every_scalar_type() -> Program {
    use vyre_cuda::ir::ScalarType::{self, *};
    let elem = |ty: ScalarType| match ty {
        U32 | Bool => ElemType::U32,
        I32 => ElemType::I32,
        F32 => ElemType::F32,
        U64 => ElemType::U64,
        I64 => ElemType::I64,
    };
    let mut builder = Program::builder([8, 1, 1]);
    for (binding, ty) in [U32, I32, F32, Bool, U64, I64].into_iter().enumerate() {
        builder = builder
            .buffer(
                format!("out_{}", ty.name()),
                binding as u32,
                Access::WriteOnly,
                elem(ty),
                BufferCount::Static(8),
            )
            .scalar(format!("s_{}", ty.name()), ty);
    }
    builder
        .body(|b| {
            let i = b.let_("i", Expr::global_id(Axis::X));
            let s = |ty: ScalarType| Expr::scalar(format!("s_{}", ty.name()));
            b.store("out_u32", i.clone(), s(U32) + i.clone());
            b.store("out_i32", i.clone(), s(I32) - i.clone().cast(I32));
            b.store("out_f32", i.clone(), s(F32) * i.clone().cast(F32));
            b.store("out_bool", i.clone(), s(Bool).cast(U32));
            b.store("out_u64", i.clone(), s(U64) + i.clone().cast(U64));
            b.store("out_i64", i.clone(), s(I64) - i.clone().cast(I64));
        })
        .build()
}

/// A kernel request of [`every_scalar_type`] repeated over the same owned buffers of
/// `backend`, once per set of `values`, alternately through `run` and `run_into`:
/// the request a blocking CUDA dispatch reuses the plan, addresses and readback
/// routes of, while its scalar values change. Then the same request once more
/// without its last value. Returns what each round read back, and the last round's
/// error message.
pub fn repeated_scalar_requests(
    backend: &vyre_cuda::backend::AnyBackend,
    values: &[[vyre_cuda::ir::Literal; 6]],
) -> (Vec<Vec<Vec<u8>>>, String) {
    use vyre_cuda::backend::Dispatch;
    let program = every_scalar_type();
    let config = DispatchConfig::linear(1);
    let kernel = backend.compile(&program, &config).expect("compile");
    let buffers: Vec<DeviceBuffer> = static_zeros(&program)
        .iter()
        .map(|zeros| backend.buffer_from(zeros).expect("buffer"))
        .collect();
    let bound = bindings(&buffers);
    let request = Dispatch::new(&kernel, &bound).config(&config);
    let mut rounds = Vec::new();
    for (round, values) in values.iter().enumerate() {
        let request = with_scalars(request, &program, values);
        if round % 2 == 0 {
            let finished = backend.run(request).expect("run");
            rounds.push(finished.outputs.iter().map(<[u8]>::to_vec).collect());
        } else {
            let mut storage: Vec<Vec<u8>> = static_zeros(&program);
            let mut outs: Vec<&mut [u8]> = storage.iter_mut().map(Vec::as_mut_slice).collect();
            backend.run_into(request, &mut outs).expect("run_into");
            rounds.push(storage);
        }
    }
    let last = values.last().expect("at least one set of values");
    let missing = with_scalars(request, &program, &last[..5]);
    let error = backend
        .run(missing)
        .expect_err("a missing value is refused");
    (rounds, error.to_string())
}

/// The value sets of the repeated-request test: every value changes from one set
/// to the next, and the last set is the first again.
pub fn repeated_scalar_values() -> Vec<[vyre_cuda::ir::Literal; 6]> {
    [
        (7u32, -3i32, 0.5f32, true, 1u64 << 40, i64::MIN),
        (u32::MAX, i32::MIN, -2.25, false, u64::MAX, 5),
        (1, 1, 1.5, true, 1, 1),
        (7, -3, 0.5, true, 1 << 40, i64::MIN),
    ]
    .into_iter()
    .map(every_scalar_value)
    .collect()
}

/// The reference interpreter's outputs of [`every_scalar_type`] for each set
/// of values.
pub fn expected_scalar_rounds(values: &[[vyre_cuda::ir::Literal; 6]]) -> Vec<Vec<Vec<u8>>> {
    let program = every_scalar_type();
    let zeros = static_zeros(&program);
    let inputs: Vec<&[u8]> = zeros.iter().map(Vec::as_slice).collect();
    let config = DispatchConfig::linear(1);
    let options = vyre_cuda::reference::ReferenceOptions::default();
    values
        .iter()
        .map(|values| {
            vyre_cuda::reference::run_with_scalars(&program, &inputs, values, &config, &options)
                .expect("reference")
                .0
        })
        .collect()
}

/// `acc[i] = acc[i] + scalar(k)` for each of 8 threads over a static `u32[8]`: run
/// twice per dispatch (two launch nodes in a graph), it adds `2k`.
pub fn add_k() -> Program {
    Program::builder([8, 1, 1])
        .buffer(
            "acc",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(8),
        )
        .scalar("k", vyre_cuda::ir::ScalarType::U32)
        .body(|b| {
            let i = b.let_("i", Expr::global_id(Axis::X));
            b.store(
                "acc",
                i.clone(),
                Expr::load("acc", i.clone()) + Expr::scalar("k"),
            );
        })
        .build()
}

/// The values of [`every_scalar_type`]'s six scalars, in declaration order.
pub fn every_scalar_value(
    (u, s, f, b, w, x): (u32, i32, f32, bool, u64, i64),
) -> [vyre_cuda::ir::Literal; 6] {
    use vyre_cuda::ir::Literal;
    [
        Literal::U32(u),
        Literal::I32(s),
        Literal::F32(f),
        Literal::Bool(b),
        Literal::U64(w),
        Literal::I64(x),
    ]
}

/// u32 words of a byte buffer.
pub fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Bytes of u32 words.
pub fn bytes(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// `y[i] = 3·x[i] + 1` (x read-write: also `x[i] += 1`), `z[i] = i` (write-only).
pub fn portable_program() -> Program {
    use vyre_cuda::ir::*;
    Program::builder([64, 1, 1])
        .buffer(
            "x",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "y",
            1,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "z",
            2,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            let i = b.let_("i", Expr::global_id(Axis::X));
            b.if_(i.clone().less_than(Expr::length("x")), |b| {
                let v = b.let_("v", Expr::load("x", i.clone()));
                b.store("y", i.clone(), v.clone() * 3u32 + 1u32);
                b.store("x", i.clone(), v + 1u32);
                b.store("z", i.clone(), i.clone());
            });
        })
        .build()
}

/// Every observable result of one session through the portable interface: buffers
/// (upload, read), a blocking dispatch under each readback policy, submitted
/// dispatches, a graph's replays, and the text of errors a caller can cause. The
/// same session must give the same list on every backend.
pub fn portable_session(backend: &vyre_cuda::backend::AnyBackend) -> Vec<Vec<u8>> {
    use vyre_cuda::backend::{Binding, Dispatch};
    use vyre_cuda::{ByteRange, ReadbackPolicy};
    let n = 100u32;
    let program = portable_program();
    let config = DispatchConfig::linear(2);
    let kernel = backend.compile(&program, &config).unwrap();
    let x = backend.buffer_from(&(0..n).collect::<Vec<_>>()).unwrap();
    let y = backend.buffer(4 * n as u64).unwrap();
    // Bound to a write-only buffer, host bytes give only its length.
    let z_garbage = vec![0xEEu8; 4 * n as usize];
    let mut seen = Vec::new();
    seen.push(backend.read::<u8>(&y).unwrap()); // zeroed
    let bindings = [
        Binding::from(&x),
        Binding::from(&y),
        Binding::Host(&z_garbage),
    ];
    let request = Dispatch::new(&kernel, &bindings).config(&config);
    let ranges = ReadbackPolicy::Ranges(smallvec::smallvec![
        ByteRange {
            binding: 2,
            offset: 8,
            len: 12
        },
        ByteRange {
            binding: 0,
            offset: 0,
            len: 4
        },
    ]);
    for policy in [ReadbackPolicy::AllOutputs, ReadbackPolicy::None, ranges] {
        let finished = backend.run(request.readback(&policy)).unwrap();
        seen.push(vec![finished.outputs.len() as u8]);
        for index in 0..finished.outputs.len() {
            seen.push(vec![finished.outputs.item_binding(index).unwrap() as u8]);
        }
        seen.extend(finished.outputs.into_vecs());
    }
    seen.push(backend.read::<u8>(&x).unwrap()); // three dispatches: x + 3
    let first = backend.submit(request).unwrap();
    let second = backend.submit(request.after(&first)).unwrap();
    let second = second.wait().unwrap();
    seen.extend(first.wait().unwrap().outputs.into_vecs());
    seen.extend(second.outputs.into_vecs());
    // Outputs by buffer name: the same bytes as by binding.
    let finished = backend.run(request).unwrap();
    assert_eq!(
        finished.outputs.get("z").unwrap(),
        finished.outputs.binding(2).unwrap()
    );
    seen.push(bytes(&finished.outputs.read::<u32>("y").unwrap()));
    let past = ReadbackPolicy::Ranges(smallvec::smallvec![ByteRange {
        binding: 1,
        offset: 4 * n as u64 - 2,
        len: 4
    }]);
    let error = backend
        .run(request.readback(&past))
        .unwrap_err()
        .to_string();
    assert!(error.starts_with("Fix:"), "{error}");
    seen.push(error.into_bytes());
    let graph_config = config.clone().with_readback(ReadbackPolicy::None);
    let z = backend.buffer(4 * n as u64).unwrap();
    let graph_bindings = [Binding::from(&x), Binding::from(&y), Binding::from(&z)];
    let step_request = Dispatch::new(&kernel, &graph_bindings).config(&graph_config);
    let mut slots = None;
    let mut graph = backend
        .record(|rec| {
            let input = rec.upload(&x, 4 * n as u64)?;
            let step = rec.dispatch(step_request)?;
            rec.dispatch(step_request)?;
            let output = rec.read_back(&y, 4, 8)?;
            slots = Some((input, output, step));
            Ok(())
        })
        .unwrap();
    let (input, output, step) = slots.unwrap();
    for round in 0..3u32 {
        let values: Vec<u32> = (0..n).map(|i| i * 10 + round).collect();
        graph
            .input_mut(input)
            .unwrap()
            .copy_from_slice(&bytes(&values));
        if round == 1 {
            graph.submit().unwrap().wait().unwrap();
        } else {
            graph.replay().unwrap();
        }
        seen.push(graph.output(output).unwrap().to_vec());
    }
    seen.push(backend.read::<u8>(&x).unwrap());
    seen.push(backend.read::<u8>(&z).unwrap());
    // Parameter update without re-capture: the first step now passes 10 elements of x
    // (its kernel loops over length(x)); z is write-only, so it is cleared whole.
    graph.set_element_count(step, 0, 10).unwrap();
    let values: Vec<u32> = (0..n).map(|i| 1000 + i).collect();
    graph
        .input_mut(input)
        .unwrap()
        .copy_from_slice(&bytes(&values));
    graph.replay().unwrap();
    seen.push(graph.output(output).unwrap().to_vec());
    seen.push(backend.read::<u8>(&x).unwrap());
    seen.push(backend.read::<u8>(&z).unwrap());
    let error = graph
        .set_element_count(step, 0, n + 1)
        .unwrap_err()
        .to_string();
    assert!(
        error.starts_with("Fix:") && error.contains("cannot pass"),
        "{error}"
    );
    let error = graph.set_element_count(step, 7, 1).unwrap_err().to_string();
    assert!(error.starts_with("Fix:"), "{error}");
    seen
}

/// A program whose 32 threads store far outside their 16-byte buffer: with bounds
/// checks off ([`unchecked_config`]) it faults the kernel with an illegal address,
/// which is sticky (the whole process's context for the device is lost).
pub fn wild_store_program() -> Program {
    use vyre_cuda::ir::{Access, Axis, BufferCount, ElemType, Expr};
    Program::builder([32, 1, 1])
        .entry_op_id("wild_store")
        .buffer(
            "out",
            0,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            b.store(
                "out",
                Expr::global_id(Axis::X) * 0x0400_0000u32 + 0x3FFF_0000u32,
                1u32,
            );
        })
        .build()
}

/// One workgroup with bounds checks off, so [`wild_store_program`] really faults.
pub fn unchecked_config() -> DispatchConfig {
    DispatchConfig::linear(1)
        .with_codegen(vyre_cuda::CodegenOptions::default().with_bounds_checks(false))
}

/// Asserts `error` is a sticky `KernelFault` naming `name`, whose message starts
/// `Fix:` and says the context is lost.
pub fn assert_sticky_fault(error: &vyre_cuda::backend::BackendError, name: &str) {
    use vyre_cuda::backend::BackendError;
    let message = error.to_string();
    match error {
        BackendError::KernelFault {
            program,
            context_usable,
            ..
        } => {
            assert!(program.contains(name), "{message}");
            assert!(!context_usable, "an illegal address is sticky: {message}");
        }
        other => panic!("expected a kernel fault, got {other:?}"),
    }
    assert!(
        message.starts_with("Fix:") && message.contains("context is lost"),
        "{message}"
    );
}

/// Asserts a backend of the faulted device reports the loss: not usable, and a
/// dispatch is refused with `ContextLost` (invariant 9: a sticky fault poisons every
/// backend of that device, not only the one that launched the kernel).
pub fn assert_reports_context_lost(gpu: &CudaBackend) {
    use vyre_cuda::backend::BackendError;
    assert!(
        !gpu.is_usable(),
        "a backend of the faulted device claims to be usable"
    );
    let program = wild_store_program();
    let bindings = [vyre_cuda::backend::Binding::Zeroed(16)];
    let after = gpu
        .run(vyre_cuda::backend::Dispatch::program(&program, &bindings))
        .unwrap_err();
    assert!(
        matches!(after, BackendError::ContextLost { .. }),
        "{after:?}"
    );
}

/// The negative control of the fault tests: the same shape as
/// [`wild_store_program`], storing 7 into its buffer's first word.
pub fn in_bounds_store_program() -> Program {
    use vyre_cuda::ir::{Access, BufferCount, ElemType};
    Program::builder([32, 1, 1])
        .entry_op_id("in_bounds_store")
        .buffer(
            "out",
            0,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            b.store("out", 0u32, 7u32);
        })
        .build()
}

/// Whether this run is under compute-sanitizer (`scripts/gpu-sanitize` exports
/// `VYRE_UNDER_SANITIZER=1`); if so, prints that `test` skips and `why`. Only for
/// tests that compare two clocks: the tools' instrumentation stretches kernels, so
/// their timing is not the device's (the normal run still checks them).
pub fn skipped_under_sanitizer(test: &str, why: &str) -> bool {
    let under = sanitizer::under_sanitizer();
    if under {
        eprintln!("{test}: skipped under compute-sanitizer (VYRE_UNDER_SANITIZER=1): {why}");
    }
    under
}

/// [`vyre_cuda::ir::ProgramBuilder::buffer`] of a `u32` buffer, on one line: the
/// declaration most test programs make (`use support::U32Buffer;` to call it).
pub trait U32Buffer {
    /// Declare the `u32` buffer `name` at `binding`, with `access` and `count`.
    fn u32_buffer(self, name: &str, binding: u32, access: Access, count: BufferCount) -> Self;
}

impl U32Buffer for vyre_cuda::ir::ProgramBuilder {
    fn u32_buffer(self, name: &str, binding: u32, access: Access, count: BufferCount) -> Self {
        self.buffer(name, binding, access, ElemType::U32, count)
    }
}

/// `dst[i] = f(src[i])` for `i < length(dst)`: `src` read-only, `dst` write-only,
/// both runtime-sized `u32`, workgroup `[workgroup, 1, 1]`.
pub fn elementwise(name: &str, workgroup: u32, f: impl FnOnce(Expr) -> Expr) -> Program {
    elementwise_with_scalars(name, workgroup, &[], f)
}

/// [`elementwise`] of a program that also declares the scalar parameters `scalars`
/// (name, type), which `f` may read.
pub fn elementwise_with_scalars(
    name: &str,
    workgroup: u32,
    scalars: &[(&str, vyre_cuda::ir::ScalarType)],
    f: impl FnOnce(Expr) -> Expr,
) -> Program {
    elementwise_program(name, workgroup, Access::WriteOnly, scalars, f)
}

/// [`elementwise_with_scalars`] with `dst` declared `dst_access`.
fn elementwise_program(
    name: &str,
    workgroup: u32,
    dst_access: Access,
    scalars: &[(&str, vyre_cuda::ir::ScalarType)],
    f: impl FnOnce(Expr) -> Expr,
) -> Program {
    let mut builder = Program::builder([workgroup, 1, 1])
        .entry_op_id(name)
        .buffer(
            "src",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer("dst", 1, dst_access, ElemType::U32, BufferCount::Runtime);
    for &(scalar, ty) in scalars {
        builder = builder.scalar(scalar, ty);
    }
    builder
        .body(|b| {
            let i = b.let_("i", Expr::global_id(Axis::X));
            b.if_(i.clone().less_than(Expr::length("dst")), |b| {
                let v = b.let_("v", Expr::load("src", i.clone()));
                b.store("dst", i.clone(), f(v));
            });
        })
        .build()
}

/// Deterministic pseudo-random words (xorshift64*), different per seed.
pub fn random_words(seed: u64, n: usize) -> Vec<u32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            (state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32) as u32
        })
        .collect()
}

/// `to[i] = f^rounds(from[i])` with `f(v) = 3·v + 1` (wrapping), 256-thread
/// workgroups: `from` read-only, `to` read-write. With many rounds the kernel
/// runs long enough that an unordered second dispatch would overlap it.
pub fn triple_plus_one_program(rounds: u32) -> Program {
    use vyre_cuda::ir::{Access, Axis, BufferCount, ElemType, Expr};
    Program::builder([256, 1, 1])
        .buffer(
            "from",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "to",
            1,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            let i = b.let_("i", Expr::global_id(Axis::X));
            b.if_(i.clone().less_than(Expr::length("to")), |b| {
                let value = b.let_mut("value", Expr::load("from", i.clone()));
                b.loop_("round", 0u32, rounds, |b, _| {
                    b.assign("value", value.clone() * 3u32 + 1u32);
                });
                b.store("to", i.clone(), value);
            });
        })
        .build()
}

/// What [`triple_plus_one_program`] computes for one word.
pub fn triple_plus_one(mut value: u32, rounds: u32) -> u32 {
    for _ in 0..rounds {
        value = value.wrapping_mul(3).wrapping_add(1);
    }
    value
}

/// Ends the whole test process with a message when it is not disarmed within
/// `seconds`: a lane test that hangs (a driver call waiting for the lane's kernel, a
/// request that never completes) then fails with a line saying what hung, instead of
/// holding the GPU machine until its limit.
pub struct Watchdog {
    armed: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// Arm a [`Watchdog`] for `what`.
pub fn watchdog(seconds: u64, what: &'static str) -> Watchdog {
    use std::sync::atomic::{AtomicBool, Ordering};
    let armed = std::sync::Arc::new(AtomicBool::new(true));
    let flag = std::sync::Arc::clone(&armed);
    std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(seconds);
        while std::time::Instant::now() < deadline {
            if !flag.load(Ordering::Acquire) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        if flag.load(Ordering::Acquire) {
            eprintln!(
                "watchdog: {what} did not finish within {seconds} s; ending the test process"
            );
            std::process::exit(101);
        }
    });
    Watchdog { armed }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.armed
            .store(false, std::sync::atomic::Ordering::Release);
    }
}

/// 32 threads; thread `gid` counts `n` up from `first` while `keep_going(gid, n)`
/// holds, then stores `n` (the fault binaries' loops: bounded, or runaway past an
/// iteration cap).
pub fn counting_program(name: &str, first: u32, keep_going: fn(Expr, Expr) -> Expr) -> Program {
    Program::builder([32, 1, 1])
        .entry_op_id(name)
        .buffer(
            "out",
            0,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Static(32),
        )
        .body(|b| {
            let gid = b.let_("gid", Expr::global_id(Axis::X));
            let n = b.let_mut("n", first);
            b.while_(keep_going(gid.clone(), n.clone()), |b| {
                b.assign("n", n.clone() + 1u32);
            });
            b.store("out", gid, n);
        })
        .build()
}

/// `dst[i] = src[i] + 1` with `dst` read-write (a write-only one keeps its
/// recorded clear), 64-thread workgroups.
pub fn plus_one_into_read_write() -> Program {
    elementwise_program("plus_one_rw", 64, Access::ReadWrite, &[], |v| {
        v + Expr::u32(1)
    })
}

/// Asserts `set_buffer` on `backend`'s graphs (the reference test and the CUDA
/// one share it): `dst = src + 1` over 256 words recorded over `first`
/// (`make` gives each destination buffer, 256 words of 7), rebound to
/// `second`: the replay writes `second` and leaves `first` as it was, and back
/// to `first` again; then, each a `Fix:` error after which the next replay
/// still writes where it did: a smaller buffer, a binding the kernel lacks,
/// the source buffer (bound at another slot, and `dst` is written), the
/// write-only destination of a kernel that clears it, and a destination the
/// graph also reads back from. Returns the graph and its step (bound to
/// `first`) for the caller's own checks.
pub fn assert_graph_rebinds_a_buffer(
    backend: &vyre_cuda::backend::AnyBackend,
    make: &dyn Fn(u64) -> DeviceBuffer,
) -> (
    vyre_cuda::backend::AnyGraph,
    vyre_cuda::graph::StepId,
    [DeviceBuffer; 3],
) {
    use vyre_cuda::backend::{Binding, Dispatch};
    let config = DispatchConfig::linear(4).with_readback(vyre_cuda::ReadbackPolicy::None);
    let kernel = backend
        .compile(&plus_one_into_read_write(), &config)
        .unwrap();
    let source = backend
        .buffer_from(&(0..256u32).collect::<Vec<_>>())
        .unwrap();
    let sevens = vec![7u32; 256];
    let fill = |buffer: &DeviceBuffer| backend.upload(buffer, &sevens).unwrap();
    let [first, second] = [make(4 * 256), make(4 * 256)];
    fill(&first);
    fill(&second);
    let bindings = [Binding::from(&source), Binding::from(&first)];
    let mut step = None;
    let mut graph = backend
        .record(|rec| {
            step = Some(rec.dispatch(Dispatch::new(&kernel, &bindings).config(&config))?);
            Ok(())
        })
        .unwrap();
    let step = step.unwrap();
    let plus_one: Vec<u32> = (1..=256).collect();
    let read = |buffer: &DeviceBuffer| backend.read::<u32>(buffer).unwrap();
    graph.set_buffer(step, 1, &second).unwrap();
    graph.replay().unwrap();
    assert_eq!(read(&second), plus_one, "the rebound buffer is written");
    assert_eq!(read(&first), sevens, "the recorded one is not");
    fill(&second);
    graph.set_buffer(step, 1, &first).unwrap();
    let small = make(4 * 255);
    let refusals: [(&str, Result<(), vyre_cuda::backend::BackendError>); 3] = [
        ("holds 1020", graph.set_buffer(step, 1, &small)),
        ("binding 9", graph.set_buffer(step, 9, &second)),
        ("already bound", graph.set_buffer(step, 1, &source)),
    ];
    for (expected, refused) in refusals {
        let message = refused.unwrap_err().to_string();
        assert!(
            message.starts_with("Fix:") && message.contains(expected),
            "{expected}: {message}"
        );
    }
    graph.replay().unwrap();
    assert_eq!(read(&first), plus_one, "refusals changed nothing");
    assert_eq!(read(&second), sevens, "refusals changed nothing");
    let write_only = backend
        .compile(
            &elementwise("plus_one_wo", 64, |v| v + Expr::u32(1)),
            &config,
        )
        .unwrap();
    let third = make(4 * 256);
    let mut read_back_slot = None;
    let mut others = backend
        .record(|rec| {
            let wo = rec.dispatch(
                Dispatch::new(
                    &write_only,
                    &[Binding::from(&source), Binding::from(&second)],
                )
                .config(&config),
            )?;
            let rw = rec.dispatch(
                Dispatch::new(&kernel, &[Binding::from(&source), Binding::from(&third)])
                    .config(&config),
            )?;
            rec.read_back(&third, 0, 16)?;
            read_back_slot = Some((wo, rw));
            Ok(())
        })
        .unwrap();
    let (wo, rw) = read_back_slot.unwrap();
    for (expected, refused) in [
        ("write-only", others.set_buffer(wo, 1, &small)),
        ("reads back", others.set_buffer(rw, 1, &second)),
    ] {
        let message = refused.unwrap_err().to_string();
        assert!(
            message.starts_with("Fix:") && message.contains(expected),
            "{expected}: {message}"
        );
    }
    (graph, step, [first, second, third])
}

/// `out[i] = 3 · data[i] + 1` over pieces of 64 words, workgroup `w` taking
/// piece `w` once `ready[w]` is nonzero: its first thread polls the flag with
/// an acquire load, and a barrier carries what it saw to the others.
pub fn copy_when_ready() -> Program {
    Program::builder([64, 1, 1])
        .entry_op_id("copy_when_ready")
        .buffer(
            "data",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "ready",
            1,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "out",
            2,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            let piece = b.let_("piece", Expr::workgroup_id(Axis::X));
            b.if_(Expr::local_id(Axis::X).equals(0u32), |b| {
                let seen = b.let_mut("seen", 0u32);
                b.while_(seen.clone().equals(0u32), |b| {
                    let flag = b.acquire_load("flag", "ready", piece.clone());
                    b.assign("seen", flag);
                });
            });
            b.barrier();
            let i = b.let_("i", Expr::global_id(Axis::X));
            b.if_(i.clone().less_than(Expr::length("out")), |b| {
                b.store(
                    "out",
                    i.clone(),
                    Expr::load("data", i.clone()) * 3u32 + 1u32,
                );
            });
        })
        .build()
}

/// Asserts `replay_feeding` on `backend`'s graphs (the reference test and the
/// CUDA one share it): [`copy_when_ready`] over 256 words in 4 pieces,
/// recorded over `data` and `ready` from `make` (host-mapped on CUDA). Three
/// rounds, each clearing the flags, then replaying while `beside` waits
/// `delay` (so that on CUDA the kernel is already polling), writes the
/// round's words and publishes each piece's flag with a release store
/// ([`DeviceBuffer::host_words`]; where the buffer has no host words, the
/// reference's, the flags are uploaded set before the replay, which runs
/// `beside` first): every round's output is computed from its own words.
/// Then, each a `Fix:` error that launches nothing: feeding `out` (written by
/// the step), a buffer the graph uploads into, and `data` while another
/// graph also binds it.
pub fn assert_graph_feeds_a_running_replay(
    backend: &vyre_cuda::backend::AnyBackend,
    make: &dyn Fn(u64) -> DeviceBuffer,
    delay: std::time::Duration,
) {
    use std::sync::atomic::Ordering;
    use vyre_cuda::backend::{Binding, Dispatch};
    const WORDS: u32 = 256;
    const PIECES: usize = 4;
    let config =
        DispatchConfig::linear(PIECES as u32).with_readback(vyre_cuda::ReadbackPolicy::None);
    let kernel = backend.compile(&copy_when_ready(), &config).unwrap();
    let mut data = make(4 * u64::from(WORDS));
    let ready = make(4 * PIECES as u64);
    let mut out = make(4 * u64::from(WORDS));
    let record = |data: &DeviceBuffer, ready: &DeviceBuffer, out: &DeviceBuffer| {
        let bindings = [
            Binding::from(data),
            Binding::from(ready),
            Binding::from(out),
        ];
        backend
            .record(|rec| {
                rec.dispatch(Dispatch::new(&kernel, &bindings).config(&config))?;
                Ok(())
            })
            .unwrap()
    };
    let mut graph = record(&data, &ready, &out);
    for round in 1..=3u32 {
        let words: Vec<u32> = (0..WORDS).map(|i| i * 5 + round).collect();
        let flags = ready.host_words().ok();
        match flags {
            Some(flags) => flags
                .iter()
                .for_each(|flag| flag.store(0, Ordering::Relaxed)),
            None => backend.upload(&ready, &[1u32; PIECES]).unwrap(),
        }
        let (_, ()) = graph
            .replay_feeding(&mut data, |bytes| {
                std::thread::sleep(delay);
                let bytes = &mut bytes[..4 * WORDS as usize];
                for (piece, part) in bytes.chunks_mut(4 * 64).enumerate() {
                    let first = piece * 64;
                    part.copy_from_slice(bytemuck::cast_slice(&words[first..first + 64]));
                    if let Some(flags) = flags {
                        flags[piece].store(1, Ordering::Release);
                    }
                }
            })
            .unwrap();
        let expected: Vec<u32> = words.iter().map(|&w| 3 * w + 1).collect();
        assert_eq!(
            backend.read::<u32>(&out).unwrap(),
            expected,
            "round {round}: the output of the words fed during the replay"
        );
    }
    let refused = graph
        .replay_feeding(&mut out, |_| ())
        .unwrap_err()
        .to_string();
    assert!(
        refused.starts_with("Fix:") && refused.contains("read_write access"),
        "{refused}"
    );
    let mut uploaded = make(4 * u64::from(WORDS));
    let mut uploads = backend
        .record(|rec| {
            rec.upload(&uploaded, 16)?;
            rec.dispatch(
                Dispatch::new(
                    &kernel,
                    &[
                        Binding::from(&uploaded),
                        Binding::from(&ready),
                        Binding::from(&out),
                    ],
                )
                .config(&config),
            )?;
            Ok(())
        })
        .unwrap();
    let refused = uploads
        .replay_feeding(&mut uploaded, |_| ())
        .unwrap_err()
        .to_string();
    assert!(
        refused.starts_with("Fix:") && refused.contains("uploads into"),
        "{refused}"
    );
    let second = record(&data, &ready, &out);
    let refused = graph
        .replay_feeding(&mut data, |_| ())
        .unwrap_err()
        .to_string();
    assert!(
        refused.starts_with("Fix:") && refused.contains("another DispatchGraph"),
        "{refused}"
    );
    drop(second);
}

/// `dst[i] = a · src[i] + b` for `i < length(dst)`, `dst` read-write (elements
/// past the grid keep what they held), scalars `a` and `b` (`u32`).
pub fn scale_and_add_into_read_write() -> Program {
    use vyre_cuda::ir::ScalarType;
    elementwise_program(
        "scale_and_add_rw",
        64,
        Access::ReadWrite,
        &[("a", ScalarType::U32), ("b", ScalarType::U32)],
        |v| v * Expr::scalar("a") + Expr::scalar("b"),
    )
}

/// Asserts `set_launch` on `backend`'s graphs (the reference test and the CUDA
/// one share it): `dst = a · src + b` over 256 words (`make` gives the
/// destination, filled with 7s) recorded with `a = 1, b = 0` on 4 workgroups of
/// 64; one `set_launch` gives `a = 3, b = 5` and 2 workgroups, and the replay
/// writes `3 · src + 5` to the first 128 words and leaves the rest; then three
/// calls that each carry one bad change beside a good one (a value of another
/// type, an undeclared scalar, a grid with an axis of 0) are each a `Fix:`
/// error that changes nothing, neither the good change beside it (the next
/// replay still writes the first 128 words with `a = 3`); last, the grid alone
/// back to 4 workgroups writes every word.
pub fn assert_graph_set_launch_changes_all_or_nothing(
    backend: &vyre_cuda::backend::AnyBackend,
    make: &dyn Fn(u64) -> DeviceBuffer,
) {
    use vyre_cuda::backend::{Binding, Dispatch};
    use vyre_cuda::ir::Literal;
    let config = DispatchConfig::linear(4).with_readback(vyre_cuda::ReadbackPolicy::None);
    let kernel = backend
        .compile(&scale_and_add_into_read_write(), &config)
        .unwrap();
    let source: Vec<u32> = (0..256).collect();
    let source_buffer = backend.buffer_from(&source).unwrap();
    let destination = make(4 * 256);
    let sevens = vec![7u32; 256];
    let fill = || backend.upload(&destination, &sevens).unwrap();
    let read = || backend.read::<u32>(&destination).unwrap();
    let bindings = [Binding::from(&source_buffer), Binding::from(&destination)];
    let mut step = None;
    let mut graph = backend
        .record(|rec| {
            step = Some(
                rec.dispatch(
                    Dispatch::new(&kernel, &bindings)
                        .config(&config)
                        .scalar("a", 1u32)
                        .scalar("b", 0u32),
                )?,
            );
            Ok(())
        })
        .unwrap();
    let step = step.unwrap();
    let expected = |threads: usize| -> Vec<u32> {
        (0..256u32)
            .map(|i| if (i as usize) < threads { 3 * i + 5 } else { 7 })
            .collect()
    };
    fill();
    graph
        .set_launch(
            step,
            &[("a", Literal::from(3u32)), ("b", Literal::from(5u32))],
            Some([2, 1, 1]),
        )
        .unwrap();
    graph.replay().unwrap();
    assert_eq!(read(), expected(128), "both scalars and the grid at once");
    /// What a refused call is for, the scalars it carries and the grid beside them.
    type Refusal<'a> = (&'a str, &'a [(&'a str, Literal)], Option<[u32; 3]>);
    let refusals: [Refusal<'_>; 3] = [
        (
            "of another type",
            &[("a", Literal::from(4u32)), ("b", Literal::from(6i32))],
            None,
        ),
        (
            "undeclared",
            &[("a", Literal::from(4u32)), ("c", Literal::from(6u32))],
            None,
        ),
        ("axis of 0", &[("a", Literal::from(4u32))], Some([0, 1, 1])),
    ];
    for (what, scalars, workgroups) in refusals {
        let message = graph
            .set_launch(step, scalars, workgroups)
            .unwrap_err()
            .to_string();
        assert!(message.starts_with("Fix:"), "{what}: {message}");
    }
    assert_eq!(
        graph.scalar(step, "a").unwrap(),
        Literal::from(3u32),
        "a refused change left the scalar beside it alone"
    );
    fill();
    graph.replay().unwrap();
    assert_eq!(read(), expected(128), "refused changes changed nothing");
    graph.set_launch(step, &[], Some([4, 1, 1])).unwrap();
    graph.replay().unwrap();
    assert_eq!(read(), expected(256), "the grid alone");
}
