//! The fallback-parity cases: requests and allocations a caller can make through
//! `AnyBackend`, each run the same way on any backend, with what came back recorded
//! in a form two backends can be compared by (outputs, or the error's kind and
//! message). `tests/portable.rs` checks the reference backend's answers against the
//! expected ones; `gpu_fallback_answers_exactly_as_cuda` (tests/gpu_backend.rs)
//! checks that CUDA and the reference give the same list.

use vyre_cuda::backend::{AnyBackend, BackendError, Binding, Dispatch, MAX_PENDING};
use vyre_cuda::ir::*;
use vyre_cuda::{ByteRange, DispatchConfig, ReadbackPolicy};

/// What one case observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The request ran: its read-back items (or, for allocations, nothing).
    Ran(Vec<Vec<u8>>),
    /// It was refused: the error's kind and message. Memory-budget messages name the
    /// bytes the budget leaves, which are the machine's, so their digits are masked.
    Refused { kind: String, message: String },
}

impl Outcome {
    pub fn refused(&self) -> Option<(&str, &str)> {
        match self {
            Outcome::Refused { kind, message } => Some((kind, message)),
            Outcome::Ran(_) => None,
        }
    }
}

fn refused(error: &BackendError) -> Outcome {
    let kind = format!("{error:?}")
        .split([' ', '{', '('])
        .next()
        .unwrap_or("")
        .to_string();
    let mut message = error.to_string();
    if matches!(error, BackendError::OverBudget { .. }) {
        let mut masked = String::with_capacity(message.len());
        for c in message.chars() {
            if !c.is_ascii_digit() {
                masked.push(c);
            } else if !masked.ends_with('#') {
                masked.push('#');
            }
        }
        message = masked;
    }
    Outcome::Refused { kind, message }
}

fn observe<T>(result: Result<T, BackendError>, ran: impl FnOnce(T) -> Vec<Vec<u8>>) -> Outcome {
    match result {
        Ok(value) => Outcome::Ran(ran(value)),
        Err(error) => refused(&error),
    }
}

/// `dst[i] = src[i] + 1` over 64-thread workgroups, runtime-sized `u32`s.
fn plus_one() -> Program {
    super::elementwise("plus_one", 64, |v| v + Expr::u32(1))
}

/// Every case, in order, with its name.
pub fn cases(backend: &AnyBackend) -> Vec<(&'static str, Outcome)> {
    let mut seen = Vec::new();
    compile_cases(backend, &mut seen);
    request_cases(backend, &mut seen);
    limit_cases(backend, &mut seen);
    scalar_cases(backend, &mut seen);
    shared_memory_cases(backend, &mut seen);
    copy_cases(backend, &mut seen);
    seen
}

/// The same copies between owned buffers: the bytes that arrive, and the same
/// refusals (past either end, an offset that overflows, overlap within one
/// buffer, a buffer of another backend).
fn copy_cases(backend: &AnyBackend, seen: &mut Vec<(&'static str, Outcome)>) {
    let words: Vec<u32> = (0..64u32).map(|i| i * 3 + 1).collect();
    let source = backend.buffer_from(&words).expect("buffer");
    let destination = backend.buffer(4 * 64).expect("buffer");
    let read =
        |buffer: &vyre_cuda::backend::DeviceBuffer| vec![backend.read::<u8>(buffer).expect("read")];
    seen.push((
        "copy: 40 bytes between two buffers",
        observe(backend.copy(&source, 8, &destination, 100, 40), |()| {
            read(&destination)
        }),
    ));
    seen.push((
        "copy: within one buffer, ranges apart",
        observe(backend.copy(&source, 0, &source, 128, 64), |()| {
            read(&source)
        }),
    ));
    seen.push((
        "copy: zero bytes at the end",
        observe(backend.copy(&source, 256, &destination, 256, 0), |()| {
            read(&destination)
        }),
    ));
    seen.push((
        "copy: past the source's end",
        observe(backend.copy(&source, 200, &destination, 0, 60), |()| vec![]),
    ));
    seen.push((
        "copy: past the destination's end",
        observe(backend.copy(&source, 0, &destination, 250, 8), |()| vec![]),
    ));
    seen.push((
        "copy: an offset that overflows",
        observe(
            backend.copy(&source, u64::MAX - 3, &destination, 0, 8),
            |()| vec![],
        ),
    ));
    seen.push((
        "copy: overlapping ranges of one buffer",
        observe(backend.copy(&source, 0, &source, 16, 32), |()| vec![]),
    ));
    let foreign = another_backend_like(backend)
        .buffer(4 * 64)
        .expect("buffer");
    seen.push((
        "copy: into a buffer of another backend",
        observe(backend.copy(&source, 0, &foreign, 0, 4), |()| vec![]),
    ));
}

/// A program the validator refuses: it stores into its read-only buffer `x`.
pub fn store_to_read_only() -> Program {
    Program::builder([1, 1, 1])
        .buffer(
            "x",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Static(1),
        )
        .body(|b| {
            b.store("x", 0u32, 1u32);
        })
        .build()
}

/// A second backend of `backend`'s kind, whose buffers `backend` must refuse.
fn another_backend_like(backend: &AnyBackend) -> AnyBackend {
    match backend {
        AnyBackend::Cuda(_) => {
            AnyBackend::Cuda(vyre_cuda::backend::CudaBackend::acquire().expect("cuda"))
        }
        _ => AnyBackend::reference(),
    }
}

/// The same validation at `compile`.
fn compile_cases(backend: &AnyBackend, seen: &mut Vec<(&'static str, Outcome)>) {
    let config = DispatchConfig::linear(1);
    let store_to_read_only = store_to_read_only();
    seen.push((
        "compile: a store into a read-only buffer",
        observe(backend.compile(&store_to_read_only, &config), |_| vec![]),
    ));
    let too_wide = Program::builder([2048, 1, 1]).build();
    seen.push((
        "compile: 2048 threads per workgroup",
        observe(backend.compile(&too_wide, &config), |_| vec![]),
    ));
    seen.push((
        "compile: a valid program",
        observe(backend.compile(&plus_one(), &config), |_| vec![]),
    ));
}

/// The same checks of a request, and the same outputs of good ones.
fn request_cases(backend: &AnyBackend, seen: &mut Vec<(&'static str, Outcome)>) {
    let config = DispatchConfig::linear(1);
    let kernel = backend.compile(&plus_one(), &config).expect("compile");
    let values: Vec<u32> = (0..64).collect();
    let source = backend.buffer_from(&values).expect("buffer");
    let destination = backend.buffer(4 * 64).expect("buffer");
    let outputs = |finished: vyre_cuda::backend::Finished| finished.outputs.into_vecs();
    let run = |bindings: &[Binding<'_>]| backend.run(Dispatch::new(&kernel, bindings));

    let good = [Binding::from(&source), Binding::from(&destination)];
    seen.push(("run: buffers", observe(run(&good), outputs)));
    let stated = [Binding::host(&values), Binding::zeroed::<u32>(64)];
    seen.push((
        "run: host values, an output stated by its length",
        observe(run(&stated), outputs),
    ));
    seen.push((
        "run: output by name, typed",
        observe(run(&good), |finished| {
            let words: Vec<u32> = finished.outputs.read("dst").expect("dst");
            vec![bytemuck_bytes(&words)]
        }),
    ));
    // Blocking transfers take their place after a submission still in flight
    // over the same buffer, as the reference's immediate run does.
    let pending = backend.submit(Dispatch::new(&kernel, &good));
    let early = backend.read::<u8>(&destination);
    seen.push((
        "read right after an unwaited submission that writes the buffer",
        observe(early, |bytes| vec![bytes]),
    ));
    seen.push((
        "the submission, waited",
        observe(pending, |p| outputs(p.wait().expect("wait"))),
    ));
    let pending = backend.submit(Dispatch::new(&kernel, &good));
    let replaced: Vec<u32> = (0..64).map(|i| 1000 + i).collect();
    let uploaded = backend.upload(&source, &replaced);
    let waited = pending.and_then(|pending| pending.wait());
    seen.push((
        "upload right after an unwaited submission that reads the buffer",
        observe(uploaded.and(waited), |finished| {
            let mut seen = outputs(finished);
            seen.push(backend.read::<u8>(&source).expect("read"));
            seen
        }),
    ));
    backend.upload(&source, &values).expect("upload");
    let aliased = [Binding::from(&source), Binding::from(&source)];
    seen.push((
        "run: one buffer as input and write-only output",
        observe(run(&aliased), outputs),
    ));
    seen.push(("run: too few bindings", observe(run(&good[..1]), outputs)));
    let odd = [Binding::Host(&[0u8; 6]), Binding::from(&destination)];
    seen.push((
        "run: a size that is not a whole number of elements",
        observe(run(&odd), outputs),
    ));
    seen.push((
        "run: zero fixpoint iterations",
        observe(
            backend.run(Dispatch::new(&kernel, &good).fixpoint_iterations(0)),
            outputs,
        ),
    ));
    let past = ReadbackPolicy::Ranges(
        [ByteRange {
            binding: 1,
            offset: 252,
            len: 8,
        }]
        .into_iter()
        .collect(),
    );
    seen.push((
        "run: a readback range past the buffer",
        observe(
            backend.run(Dispatch::new(&kernel, &good).readback(&past)),
            outputs,
        ),
    ));
    let mut short = [0u8; 8];
    seen.push((
        "run_into: an output slice of the wrong length",
        observe(
            backend.run_into(Dispatch::new(&kernel, &good), &mut [&mut short]),
            |_| vec![],
        ),
    ));
    let foreign = another_backend_like(backend)
        .buffer(4 * 64)
        .expect("buffer");
    let mixed = [Binding::from(&source), Binding::from(&foreign)];
    seen.push((
        "run: a buffer of another backend",
        observe(run(&mixed), outputs),
    ));
    seen.push((
        "read: a buffer of another backend",
        observe(backend.read::<u8>(&foreign), |bytes| vec![bytes]),
    ));
}

/// The same limits: grids, pending submissions, memory.
fn limit_cases(backend: &AnyBackend, seen: &mut Vec<(&'static str, Outcome)>) {
    let config = DispatchConfig::linear(1);
    let kernel = backend.compile(&plus_one(), &config).expect("compile");
    let source = backend.buffer(4 * 64).expect("buffer");
    let destination = backend.buffer(4 * 64).expect("buffer");
    let good = [Binding::from(&source), Binding::from(&destination)];
    let outputs = |finished: vyre_cuda::backend::Finished| finished.outputs.into_vecs();
    for (name, workgroups) in [
        ("grid: y = 70,000 workgroups", [1, 70_000, 1]),
        ("grid: an axis of 0 workgroups", [0, 1, 1]),
    ] {
        seen.push((
            name,
            observe(
                backend.run(Dispatch::new(&kernel, &good).workgroups(workgroups)),
                outputs,
            ),
        ));
    }
    // MAX_PENDING + 4 submissions: MAX_PENDING are accepted, the next are refused.
    let mut pending = Vec::new();
    let mut refusal = None;
    for _ in 0..MAX_PENDING + 4 {
        match backend.submit(Dispatch::new(&kernel, &good)) {
            Ok(submitted) => pending.push(submitted),
            Err(error) => {
                refusal.get_or_insert(refused(&error));
            }
        }
    }
    seen.push((
        "submit: pending submissions accepted of MAX_PENDING + 4",
        Outcome::Ran(vec![vec![pending.len() as u8]]),
    ));
    assert_eq!(pending.len(), MAX_PENDING);
    seen.push((
        "submit: the one past MAX_PENDING",
        refusal.unwrap_or(Outcome::Ran(vec![])),
    ));
    for submitted in pending {
        submitted.wait().expect("wait");
    }
    for (name, bytes) in [
        ("buffer: u64::MAX bytes", u64::MAX),
        ("buffer: 1 << 40 bytes", 1 << 40),
    ] {
        seen.push((name, observe(backend.buffer(bytes), |_| vec![])));
    }
    let huge = [Binding::Zeroed(1 << 40), Binding::from(&destination)];
    seen.push((
        "run: a zeroed binding of 1 << 40 bytes",
        observe(backend.run(Dispatch::new(&kernel, &huge)), outputs),
    ));
}

/// `dst[i] = on ? src[i] + k : src[i]` over 64-thread workgroups, with the scalar
/// parameters `k: u32` and `on: bool`.
pub fn plus_k() -> Program {
    let scalars = [("k", ScalarType::U32), ("on", ScalarType::Bool)];
    super::elementwise_with_scalars("plus_k", 64, &scalars, |v| {
        Expr::scalar("on").select(v.clone() + Expr::scalar("k"), v)
    })
}

/// The same scalar values and the same refusals: values reach the kernel (a new
/// value through the same kernel), a missing, mistyped or undeclared value is
/// refused by every way of finishing a request, and a graph step's value changes
/// between replays without re-capture, checked as a request's is.
fn scalar_cases(backend: &AnyBackend, seen: &mut Vec<(&'static str, Outcome)>) {
    let config = DispatchConfig::linear(1);
    let kernel = backend.compile(&plus_k(), &config).expect("compile");
    let values: Vec<u32> = (0..64).collect();
    let source = backend.buffer_from(&values).expect("buffer");
    let destination = backend.buffer(4 * 64).expect("buffer");
    let good = [Binding::from(&source), Binding::from(&destination)];
    let outputs = |finished: vyre_cuda::backend::Finished| finished.outputs.into_vecs();
    let request = Dispatch::new(&kernel, &good);
    seen.push((
        "scalar: values reach the kernel",
        observe(
            backend.run(request.scalar("k", 5u32).scalar("on", true)),
            outputs,
        ),
    ));
    seen.push((
        "scalar: new values, the same kernel",
        observe(
            backend.run(request.scalar("on", true).scalar("k", 1000u32)),
            outputs,
        ),
    ));
    seen.push((
        "scalar: the last of two values",
        observe(
            backend.run(
                request
                    .scalar("k", 1u32)
                    .scalar("on", false)
                    .scalar("on", true),
            ),
            outputs,
        ),
    ));
    seen.push((
        "scalar: a program request",
        observe(
            backend.run(
                Dispatch::program(&plus_k(), &good)
                    .scalar("k", 7u32)
                    .scalar("on", true),
            ),
            outputs,
        ),
    ));
    seen.push((
        "scalar: no value for one",
        observe(backend.run(request.scalar("k", 5u32)), outputs),
    ));
    seen.push((
        "scalar: a value of another type",
        observe(
            backend.run(request.scalar("k", 5i32).scalar("on", true)),
            outputs,
        ),
    ));
    seen.push((
        "scalar: an undeclared name",
        observe(
            backend.run(
                request
                    .scalar("k", 5u32)
                    .scalar("on", true)
                    .scalar("kk", 5u32),
            ),
            outputs,
        ),
    ));
    seen.push((
        "scalar: submit without a value",
        observe(backend.submit(request.scalar("on", true)), |pending| {
            pending.wait().expect("wait").outputs.into_vecs()
        }),
    ));
    let mut out = [0u8; 256];
    seen.push((
        "scalar: run_into with values",
        observe(
            backend.run_into(
                request.scalar("k", 2u32).scalar("on", true),
                &mut [&mut out],
            ),
            |_| vec![out.to_vec()],
        ),
    ));
    let none = ReadbackPolicy::None;
    let step = request.readback(&none);
    seen.push((
        "scalar: record without a value",
        observe(
            backend.record(|rec| rec.dispatch(step.scalar("k", 1u32)).map(drop)),
            |_| vec![],
        ),
    ));
    let mut recorded = None;
    let graph = backend.record(|rec| {
        let id = rec.dispatch(step.scalar("k", 3u32).scalar("on", true))?;
        let read = rec.read_back(&destination, 0, 16)?;
        recorded = Some((id, read));
        Ok(())
    });
    let Ok(mut graph) = graph else {
        seen.push(("graph: scalar step", observe(graph.map(drop), |_| vec![])));
        return;
    };
    let (id, read) = recorded.expect("recorded");
    let mut replays = Vec::new();
    let mut replay = |graph: &mut vyre_cuda::backend::AnyGraph| {
        graph.replay().expect("replay");
        replays.push(graph.output(read).expect("output").to_vec());
    };
    replay(&mut graph);
    graph.set_scalar(id, "k", 40u32).expect("set k");
    replay(&mut graph);
    graph.set_scalar(id, "on", false).expect("set on");
    replay(&mut graph);
    let current = graph.scalar(id, "k").expect("k");
    replays.push(current.bits().to_le_bytes().to_vec());
    seen.push((
        "graph: a step's scalars set between replays",
        Outcome::Ran(replays),
    ));
    seen.push((
        "graph: set_scalar of another type",
        observe(graph.set_scalar(id, "k", 1.0f32), |_| vec![]),
    ));
    seen.push((
        "graph: set_scalar of an undeclared name",
        observe(graph.set_scalar(id, "kk", 1u32), |_| vec![]),
    ));
    seen.push((
        "graph: the value a refused update left",
        observe(graph.scalar(id, "k"), |value| {
            vec![value.bits().to_le_bytes().to_vec()]
        }),
    ));
}

fn bytemuck_bytes(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// The same workgroup-memory limit: a kernel's is the device's opt-in limit (227 KiB
/// on an H200, dynamic shared memory past 48 KiB), so a program of 100 KiB runs
/// with the same bytes, and one of 16 bytes past the limit is refused at `compile`
/// with the same message.
fn shared_memory_cases(backend: &AnyBackend, seen: &mut Vec<(&'static str, Outcome)>) {
    let groups = 2;
    let config = DispatchConfig::linear(groups);
    let source = super::wide_shared::source(groups);
    let dst = Binding::zeroed::<u32>(source.len() as u64);
    let totals = Binding::zeroed::<u32>(u64::from(groups));
    let bindings = [Binding::host(&source), dst, totals];
    let program = super::wide_shared::program();
    seen.push((
        "run: 100 KiB of workgroup memory",
        observe(
            backend.run(Dispatch::program(&program, &bindings).config(&config)),
            |finished| finished.outputs.into_vecs(),
        ),
    ));
    seen.push((
        "compile: workgroup memory 16 bytes past the opt-in limit",
        observe(
            backend.compile(&past_the_opt_in_limit(), &config),
            |_| vec![],
        ),
    ));
    seen.push((
        "compile: a reduction whose lowering passes the opt-in limit",
        observe(
            backend.compile(&reduction_past_the_limit_once_lowered(), &config),
            |_| vec![],
        ),
    ));
}

/// A program 4 bytes under an H200's opt-in limit of 232,448 bytes of workgroup
/// memory, with a workgroup reduction whose lowering adds its scratch buffers (a
/// word per subgroup): the program passes the limit only once lowered.
pub fn reduction_past_the_limit_once_lowered() -> Program {
    Program::builder([256, 1, 1])
        .buffer(
            "out",
            0,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "pool",
            1,
            Access::Workgroup,
            ElemType::U32,
            BufferCount::Static(232_448 / 4 - 1),
        )
        .body(|b| {
            let total = b.workgroup_reduce("total", ReduceOp::Sum, Expr::local_id(Axis::X));
            b.store("pool", 0u32, total);
            b.store("out", 0u32, Expr::load("pool", 0u32));
        })
        .build()
}

/// A program whose one workgroup buffer is 16 bytes past an H200's opt-in limit of
/// 232,448 bytes.
pub fn past_the_opt_in_limit() -> Program {
    Program::builder([32, 1, 1])
        .buffer(
            "pool",
            0,
            Access::Workgroup,
            ElemType::U32,
            BufferCount::Static((232_448 + 16) / 4),
        )
        .body(|b| {
            b.store("pool", Expr::local_id(Axis::X), 1u32);
        })
        .build()
}
