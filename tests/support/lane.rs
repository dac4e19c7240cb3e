//! Programs and checks the lane tests share, CPU and GPU binaries alike (through
//! `support::lane`).
#![allow(dead_code)]

use vyre_cuda::backend::{AnyBackend, AnyLane, Binding, Dispatch, Kernel, LaneOptions};
use vyre_cuda::ir::{Access, Axis, BufferCount, ElemType, Expr, Program};
use vyre_cuda::{ByteRange, DispatchConfig, ReadbackPolicy};

/// Values of [`super::every_scalar_type`]'s scalars (for [`super::every_scalar_value`])
/// at both ends of each type: a value cut to 32 bits, read unsigned or as another
/// type shows in one of them.
pub const EVERY_SCALAR_VALUE_SETS: [(u32, i32, f32, bool, u64, i64); 3] = [
    (7, -3, 1.5, true, 1 << 40, -(1 << 40)),
    (0, i32::MIN, -0.0, false, u64::MAX, i64::MIN),
    (u32::MAX, i32::MAX, f32::MAX, true, 0, i64::MAX),
];

/// Asserts that `lane`, holding `kernel` of [`super::parity::plus_k`], follows the
/// scalar `k` request by request over `bindings` (`src` holding `source`, then
/// `dst`): each `k` of `ks` run in turn, then the first `in_flight` of them submitted
/// back to back, give `src[i] + k` of their own `k`.
pub fn assert_plus_k_follows_each_value(
    (lane, kernel): (&AnyLane, &Kernel),
    (bindings, source): (&[Binding<'_>], &[u32]),
    ks: &[u32],
    in_flight: usize,
    label: &str,
) {
    let config = DispatchConfig::linear(1);
    let request = |k: u32| {
        Dispatch::new(kernel, bindings)
            .config(&config)
            .scalar("k", k)
            .scalar("on", true)
    };
    let expected = |k: u32| source.iter().map(|v| v + k).collect::<Vec<u32>>();
    let dst = |finished: vyre_cuda::backend::Finished| finished.outputs.read::<u32>("dst");
    for (round, &k) in ks.iter().enumerate() {
        let got = lane.run(request(k)).and_then(dst);
        assert_eq!(got.unwrap(), expected(k), "{label}: round {round}, k {k}");
    }
    let pending: Vec<_> = ks
        .iter()
        .take(in_flight)
        .map(|&k| (k, lane.submit(request(k)).unwrap()))
        .collect();
    for (k, pending) in pending {
        let got = pending.wait().and_then(dst);
        assert_eq!(got.unwrap(), expected(k), "{label}: submitted k {k}");
    }
}

/// Asserts that lanes of 1, 2 and 4 slots on `backend`, holding [`super::parity::plus_k`],
/// deliver each request's own bytes while two requests whose records differ in the
/// value of `k` and in length (one reads `dst` whole, the other two ranges of it: one
/// readback entry more) alternate, with a repeat and a third record between them: on
/// a CUDA lane alternation takes the blocks' earlier record copy (an exchange of as
/// many chunks as the longer record has), the repeat the held copy, the third record a
/// reload or its slot's copy. Every delivery is `src[i] + k` of its own `k` over its
/// own ranges.
pub fn assert_alternating_records_deliver_their_own_bytes(backend: &AnyBackend) {
    let config = DispatchConfig::linear(1);
    let plus_k = backend.compile(&super::parity::plus_k(), &config).unwrap();
    let source: Vec<u32> = (0..64).map(|i| i * 1000 + 7).collect();
    let src = backend.buffer_from(&source).unwrap();
    let dst = backend.buffer(4 * 64).unwrap();
    let bound = [Binding::from(&src), Binding::from(&dst)];
    let spans = [(8usize, 20usize), (100, 64)];
    let ranges = ReadbackPolicy::Ranges(
        spans
            .iter()
            .map(|&(offset, len)| ByteRange {
                binding: 1,
                offset: offset as u64,
                len: len as u64,
            })
            .collect(),
    );
    // (k, whether it reads the two ranges instead of `dst` whole)
    let sequence = [
        (1, false),
        (2, true),
        (1, false),
        (2, true),
        (2, true),
        (1, false),
        (3, false),
        (1, false),
        (3, false),
        (1, false),
        (2, true),
    ];
    for slots in [1, 2, 4] {
        let lane = backend
            .lane(&[&plus_k], LaneOptions::new().slots(slots))
            .unwrap();
        for (round, &(k, ranged)) in sequence.iter().enumerate() {
            let request = Dispatch::new(&plus_k, &bound)
                .config(&config)
                .scalar("k", k)
                .scalar("on", true);
            let request = if ranged {
                request.readback(&ranges)
            } else {
                request
            };
            let bytes: Vec<u8> = source.iter().flat_map(|v| (v + k).to_le_bytes()).collect();
            let expected: Vec<Vec<u8>> = if ranged {
                spans
                    .iter()
                    .map(|&(offset, len)| bytes[offset..offset + len].to_vec())
                    .collect()
            } else {
                vec![bytes]
            };
            let got = lane.run(request).unwrap().outputs.into_vecs();
            assert_eq!(got, expected, "{slots} slots, round {round}, k {k}");
        }
    }
}

/// `y[i] = f(x[i])` over 64-thread workgroups (`x` read-only, `y` write-only), named
/// `name`.
pub fn elementwise(name: &str, f: fn(Expr) -> Expr) -> Program {
    Program::builder([64, 1, 1])
        .entry_op_id(name)
        .buffer(
            "x",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "y",
            1,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            let i = b.let_("i", Expr::global_id(Axis::X));
            b.if_(i.clone().less_than(Expr::length("x")), |b| {
                b.store("y", i.clone(), f(Expr::load("x", i.clone())));
            });
        })
        .build()
}

/// `y[i] = x[i] + 1`.
pub fn increment() -> Program {
    elementwise("lane_increment", |x| x + 1u32)
}

/// `y[i] = x[i] * 3`.
pub fn triple() -> Program {
    elementwise("lane_triple", |x| x * 3u32)
}

/// `x[local_id.x] = 1` in workgroups of `shape`, after a grid sync when asked: a
/// kernel a lane of another shape, or any lane, refuses.
pub fn store_one(shape: [u32; 3], grid_sync: bool) -> Program {
    Program::builder(shape)
        .buffer(
            "x",
            0,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .body(|b| {
            if grid_sync {
                b.grid_sync();
            }
            b.store("x", Expr::local_id(Axis::X), 1u32);
        })
        .build()
}
