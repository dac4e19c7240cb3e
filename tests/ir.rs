//! The program value's contract: the content digest is computed at most once per
//! value and shared by clones, is pinned byte for byte, moves when any field that
//! affects code generation moves, and rewrites get fresh values; `Display` is legible;
//! the structural rebuild (`Rebuild`) keeps every part its hooks do not map and maps
//! every buffer reference.

use vyre_cuda::fixtures::host_cost_fixture;
use vyre_cuda::ir::*;

/// The host-cost fixture written out by hand: `in`, `out`, `scratch1..scratch3`,
/// `acc0 = in[0]`, `accK = acc(K-1) + K` for K in 1..=4, `out[0] = acc4`.
fn fixture() -> Program {
    Program::builder([1, 1, 1])
        .buffer(
            "in",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Static(4),
        )
        .buffer(
            "out",
            1,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(4),
        )
        .buffer(
            "scratch1",
            2,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(4),
        )
        .buffer(
            "scratch2",
            3,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(4),
        )
        .buffer(
            "scratch3",
            4,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Static(4),
        )
        .body(|b| {
            let acc0 = b.let_("acc0", Expr::load("in", 0u32));
            let acc1 = b.let_("acc1", acc0 + 1u32);
            let acc2 = b.let_("acc2", acc1 + 2u32);
            let acc3 = b.let_("acc3", acc2 + 3u32);
            let acc4 = b.let_("acc4", acc3 + 4u32);
            b.store("out", 0u32, acc4);
        })
        .build()
}

/// Locks out re-walking a program for its digest on every use (measured: per-dispatch cost
/// growing with program size): 1,000 clones digested cost exactly one computation.
#[test]
fn digest_is_computed_once_and_shared_by_clones() {
    let program = fixture();
    let clones: Vec<Program> = (0..1000).map(|_| program.clone()).collect();
    assert!(!program.digest_is_memoised());
    let before = computations_on_current_thread();
    let digests: Vec<Digest> = clones.iter().map(Program::digest).collect();
    assert_eq!(computations_on_current_thread() - before, 1);
    assert!(digests.iter().all(|d| *d == digests[0]));
    assert!(program.digest_is_memoised());
    assert_eq!(program.digest(), digests[0]);
    assert_eq!(computations_on_current_thread() - before, 1);
    // Negative control: separately built equal values are separate memos, so the
    // counter does count computations.
    let before = computations_on_current_thread();
    let a = fixture();
    let b = fixture();
    assert_eq!(a.digest(), b.digest());
    assert_eq!(computations_on_current_thread() - before, 2);
}

/// Locks out an accidental change of the canonical encoding or the hash (every
/// PTX and module cache key derives from it): the fixture's digest, pinned.
#[test]
fn fixture_digest_is_pinned() {
    assert_eq!(
        fixture().digest().to_hex(),
        "855d2f9b44b32b39989a887180f6664d8cfa511e73edf397b20b0fc6bfcc8bf4"
    );
    // The crate's shared fixture is the same program (it adds an entry op id).
    let shared = host_cost_fixture(5, 4);
    assert_eq!(shared.buffers(), fixture().buffers());
    assert_eq!(shared.entry(), fixture().entry());
    assert_eq!(shared.workgroup_size(), fixture().workgroup_size());
}

/// The documented encoding of a program's start, up to its entry op id: one
/// buffer `name` at `binding`, `codes` its access, element type and count
/// codes, then the workgroup size.
fn one_buffer_header(name: &[u8], binding: u32, codes: [u8; 3], workgroup: [u32; 3]) -> Vec<u8> {
    let mut bytes = b"vyre-cuda program v2".to_vec();
    bytes.extend(1u32.to_le_bytes()); // buffer count
    bytes.extend((name.len() as u32).to_le_bytes());
    bytes.extend(name);
    bytes.extend(binding.to_le_bytes());
    bytes.extend(codes);
    for w in workgroup {
        bytes.extend(w.to_le_bytes());
    }
    bytes
}

/// Locks out a drift between the documented canonical encoding and the digest: a
/// tiny program encoded by hand, byte by byte, hashes to its digest.
#[test]
fn digest_is_sha256_of_the_documented_encoding() {
    let program = Program::builder([2, 3, 4])
        .buffer(
            "b",
            7,
            Access::WriteOnly,
            ElemType::F32,
            BufferCount::Runtime,
        )
        .body(|b| {
            b.store("b", 1u32, -0.0f32);
        })
        .build();
    // The entry block, Merkle-style: its own digest enters the program's encoding.
    let mut block = b"block".to_vec();
    block.extend(1u32.to_le_bytes()); // entry block length
    block.push(2); // store
    block.extend(1u32.to_le_bytes());
    block.extend(b"b");
    block.extend([0, 0]); // index: literal u32
    block.extend(1u32.to_le_bytes());
    block.extend([0, 2]); // value: literal f32
    block.extend((-0.0f32).to_bits().to_le_bytes());
    // write_only, f32, runtime count
    let mut bytes = one_buffer_header(b"b", 7, [2, 3, 1], [2, 3, 4]);
    bytes.push(0); // no entry op id
    bytes.push(0); // composable
    bytes.extend(sha256(&block)); // the entry block's digest
    assert_eq!(program.digest().0, sha256(&bytes));
}

/// Locks out an acquire load that prints, compares or hashes as an atomic load
/// (the two would share a PTX cache entry, and one would be emitted as the other),
/// or whose tag reuses another node's: it prints as `acquire_load`, differs from
/// the same atomic load, and its digest is that of the encoding by hand with its
/// own tag, 19 (every earlier tag is kept, so no earlier program's digest moves).
#[test]
fn acquire_load_prints_and_hashes_as_its_own_node() {
    let with = |acquire: bool| {
        Program::builder([1, 1, 1])
            .buffer(
                "f",
                0,
                Access::ReadOnly,
                ElemType::U32,
                BufferCount::Runtime,
            )
            .body(|b| {
                if acquire {
                    b.acquire_load("r", "f", 3u32);
                } else {
                    b.atomic_load("r", "f", 3u32);
                }
            })
            .build()
    };
    let acquire = with(true);
    let text = acquire.to_string();
    assert!(
        text.lines()
            .any(|line| line.trim() == "let r = acquire_load(&f[3u]);"),
        "{text}"
    );
    let relaxed = with(false);
    assert!(relaxed.to_string().contains("let r = atomic_load(&f[3u]);"));
    assert_ne!(acquire, relaxed);
    assert_ne!(acquire.digest(), relaxed.digest());
    assert_eq!(acquire, with(true));

    let mut block = b"block".to_vec();
    block.extend(1u32.to_le_bytes()); // entry block length
    block.push(19); // acquire load
    block.extend(1u32.to_le_bytes());
    block.extend(b"r");
    block.extend(1u32.to_le_bytes());
    block.extend(b"f");
    block.extend([0, 0]); // index: literal u32
    block.extend(3u32.to_le_bytes());
    // read_only, u32, runtime count
    let mut bytes = one_buffer_header(b"f", 0, [0, 1, 1], [1, 1, 1]);
    bytes.push(0); // no entry op id
    bytes.push(0); // composable
    bytes.extend(sha256(&block)); // the entry block's digest
    assert_eq!(acquire.digest().0, sha256(&bytes));
}

// ---- sensitivity -------------------------------------------------------------------------

fn lit_u32(v: u32) -> Expr {
    Expr::u32(v)
}

fn buffers() -> Vec<BufferDecl> {
    vec![
        BufferDecl::new(
            "in",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Static(4),
        ),
        BufferDecl::new(
            "out",
            1,
            Access::ReadWrite,
            ElemType::U32,
            BufferCount::Runtime,
        ),
    ]
}

/// A body with every node kind and every expression kind.
fn body() -> Vec<Node> {
    vec![
        // 0
        Node::Let {
            name: "a".into(),
            mutable: true,
            value: Expr::load("in", Expr::global_id(Axis::X)),
        },
        // 1
        Node::Assign {
            name: "a".into(),
            value: Expr::var("a") + 1u32,
        },
        // 2
        Node::Store {
            buffer: "out".into(),
            index: lit_u32(0),
            value: Expr::var("a"),
        },
        // 3
        Node::If {
            condition: Expr::var("a").less_than(3u32),
            then_body: vec![Node::Barrier].into(),
            else_body: vec![Node::Return].into(),
        },
        // 4
        Node::Loop {
            variable: "i".into(),
            start: lit_u32(0),
            end: Expr::length("out"),
            body: vec![Node::GridSync].into(),
        },
        // 5
        Node::Atomic {
            op: AtomicOp::Add,
            buffer: "out".into(),
            index: lit_u32(1),
            value: lit_u32(2),
        },
        // 6
        Node::WorkgroupReduce {
            name: "r".into(),
            op: ReduceOp::Sum,
            value: Expr::local_id(Axis::Y),
        },
        // 7
        Node::Let {
            name: "f".into(),
            mutable: false,
            value: Expr::bool(true).select(1.0f32, 0.0f32),
        },
        // 8
        Node::Let {
            name: "c".into(),
            mutable: false,
            value: Expr::unary(UnaryOp::BitNot, Expr::workgroup_id(Axis::Z)).cast(ScalarType::F32),
        },
        // 9
        Node::Let {
            name: "s".into(),
            mutable: false,
            value: Expr::SubgroupShuffleXor {
                value: Box::new(lit_u32(1)),
                lane_mask: 1,
            },
        },
        // 10
        Node::Let {
            name: "t".into(),
            mutable: false,
            value: Expr::SubgroupReduce {
                op: ReduceOp::Max,
                value: Box::new(Expr::workgroup_count(Axis::X)),
            },
        },
    ]
}

fn program(buffers: Vec<BufferDecl>, size: [u32; 3], body: Vec<Node>) -> Program {
    Program::new(buffers, size, body)
}

fn with_buffer(edit: impl FnOnce(&mut BufferDecl)) -> Program {
    let mut b = buffers();
    edit(&mut b[0]);
    program(b, [8, 2, 1], body())
}

fn with_node(index: usize, node: Node) -> Program {
    let mut nodes = body();
    nodes[index] = node;
    program(buffers(), [8, 2, 1], nodes)
}

fn with_size(size: [u32; 3]) -> Program {
    program(buffers(), size, body())
}

/// Locks out a digest blind to any field that changes generated code (two different
/// programs would share a PTX cache entry): every variant below differs from the base
/// and from each other; a rebuilt equal program (negative control) does not differ.
#[test]
fn every_codegen_field_moves_the_digest() {
    let base = program(buffers(), [8, 2, 1], body());
    let mut variants: Vec<(&str, Program)> = vec![
        ("buffer name", with_buffer(|b| b.name = "input".into())),
        ("buffer binding", with_buffer(|b| b.binding = 5)),
        (
            "buffer access",
            with_buffer(|b| b.access = Access::ReadWrite),
        ),
        ("buffer elem", with_buffer(|b| b.elem = ElemType::I32)),
        (
            "buffer count",
            with_buffer(|b| b.count = BufferCount::Static(5)),
        ),
        (
            "buffer runtime",
            with_buffer(|b| b.count = BufferCount::Runtime),
        ),
        ("buffer order", {
            let mut b = buffers();
            b.reverse();
            program(b, [8, 2, 1], body())
        }),
        ("workgroup x", with_size([9, 2, 1])),
        ("workgroup y", with_size([8, 3, 1])),
        ("workgroup z", with_size([8, 2, 2])),
        ("workgroup transposed", with_size([2, 8, 1])),
        (
            "let name",
            with_node(
                0,
                Node::Let {
                    name: "b".into(),
                    mutable: true,
                    value: Expr::load("in", Expr::global_id(Axis::X)),
                },
            ),
        ),
        (
            "let mutable",
            with_node(
                0,
                Node::Let {
                    name: "a".into(),
                    mutable: false,
                    value: Expr::load("in", Expr::global_id(Axis::X)),
                },
            ),
        ),
        (
            "load buffer",
            with_node(
                0,
                Node::Let {
                    name: "a".into(),
                    mutable: true,
                    value: Expr::load("out", Expr::global_id(Axis::X)),
                },
            ),
        ),
        (
            "builtin axis",
            with_node(
                0,
                Node::Let {
                    name: "a".into(),
                    mutable: true,
                    value: Expr::load("in", Expr::global_id(Axis::Y)),
                },
            ),
        ),
        (
            "builtin kind",
            with_node(
                0,
                Node::Let {
                    name: "a".into(),
                    mutable: true,
                    value: Expr::load("in", Expr::local_id(Axis::X)),
                },
            ),
        ),
        (
            "assign name",
            with_node(
                1,
                Node::Assign {
                    name: "b".into(),
                    value: Expr::var("a") + 1u32,
                },
            ),
        ),
        (
            "binary op",
            with_node(
                1,
                Node::Assign {
                    name: "a".into(),
                    value: Expr::var("a") - 1u32,
                },
            ),
        ),
        (
            "operand order",
            with_node(
                1,
                Node::Assign {
                    name: "a".into(),
                    value: Expr::u32(1) + Expr::var("a"),
                },
            ),
        ),
        (
            "literal type tag",
            with_node(
                1,
                Node::Assign {
                    name: "a".into(),
                    value: Expr::var("a") + 1i32,
                },
            ),
        ),
        (
            "variable name",
            with_node(
                1,
                Node::Assign {
                    name: "a".into(),
                    value: Expr::var("b") + 1u32,
                },
            ),
        ),
        (
            "store buffer",
            with_node(
                2,
                Node::Store {
                    buffer: "in".into(),
                    index: lit_u32(0),
                    value: Expr::var("a"),
                },
            ),
        ),
        (
            "store index",
            with_node(
                2,
                Node::Store {
                    buffer: "out".into(),
                    index: lit_u32(1),
                    value: Expr::var("a"),
                },
            ),
        ),
        (
            "store value",
            with_node(
                2,
                Node::Store {
                    buffer: "out".into(),
                    index: lit_u32(0),
                    value: lit_u32(0),
                },
            ),
        ),
        (
            "if condition",
            with_node(
                3,
                Node::If {
                    condition: Expr::var("a").less_equal(3u32),
                    then_body: vec![Node::Barrier].into(),
                    else_body: vec![Node::Return].into(),
                },
            ),
        ),
        (
            "if branches swapped",
            with_node(
                3,
                Node::If {
                    condition: Expr::var("a").less_than(3u32),
                    then_body: vec![Node::Return].into(),
                    else_body: vec![Node::Barrier].into(),
                },
            ),
        ),
        (
            "if block boundary",
            with_node(
                3,
                Node::If {
                    condition: Expr::var("a").less_than(3u32),
                    then_body: vec![Node::Barrier, Node::Return].into(),
                    else_body: Vec::new().into(),
                },
            ),
        ),
        (
            "barrier becomes grid sync",
            with_node(
                3,
                Node::If {
                    condition: Expr::var("a").less_than(3u32),
                    then_body: vec![Node::GridSync].into(),
                    else_body: vec![Node::Return].into(),
                },
            ),
        ),
        (
            "loop variable",
            with_node(
                4,
                Node::Loop {
                    variable: "j".into(),
                    start: lit_u32(0),
                    end: Expr::length("out"),
                    body: vec![Node::GridSync].into(),
                },
            ),
        ),
        (
            "loop start",
            with_node(
                4,
                Node::Loop {
                    variable: "i".into(),
                    start: lit_u32(1),
                    end: Expr::length("out"),
                    body: vec![Node::GridSync].into(),
                },
            ),
        ),
        (
            "loop end (length buffer)",
            with_node(
                4,
                Node::Loop {
                    variable: "i".into(),
                    start: lit_u32(0),
                    end: Expr::length("in"),
                    body: vec![Node::GridSync].into(),
                },
            ),
        ),
        (
            "loop body",
            with_node(
                4,
                Node::Loop {
                    variable: "i".into(),
                    start: lit_u32(0),
                    end: Expr::length("out"),
                    body: vec![Node::GridSync, Node::GridSync].into(),
                },
            ),
        ),
        (
            "atomic op",
            with_node(
                5,
                Node::Atomic {
                    op: AtomicOp::Or,
                    buffer: "out".into(),
                    index: lit_u32(1),
                    value: lit_u32(2),
                },
            ),
        ),
        (
            "atomic buffer",
            with_node(
                5,
                Node::Atomic {
                    op: AtomicOp::Add,
                    buffer: "in".into(),
                    index: lit_u32(1),
                    value: lit_u32(2),
                },
            ),
        ),
        (
            "atomic index",
            with_node(
                5,
                Node::Atomic {
                    op: AtomicOp::Add,
                    buffer: "out".into(),
                    index: lit_u32(2),
                    value: lit_u32(2),
                },
            ),
        ),
        (
            "atomic value",
            with_node(
                5,
                Node::Atomic {
                    op: AtomicOp::Add,
                    buffer: "out".into(),
                    index: lit_u32(1),
                    value: lit_u32(3),
                },
            ),
        ),
        (
            "reduce name",
            with_node(
                6,
                Node::WorkgroupReduce {
                    name: "q".into(),
                    op: ReduceOp::Sum,
                    value: Expr::local_id(Axis::Y),
                },
            ),
        ),
        (
            "reduce op",
            with_node(
                6,
                Node::WorkgroupReduce {
                    name: "r".into(),
                    op: ReduceOp::Min,
                    value: Expr::local_id(Axis::Y),
                },
            ),
        ),
        (
            "reduce value",
            with_node(
                6,
                Node::WorkgroupReduce {
                    name: "r".into(),
                    op: ReduceOp::Sum,
                    value: Expr::local_id(Axis::Z),
                },
            ),
        ),
        (
            "f32 -0.0 vs 0.0",
            with_node(
                7,
                Node::Let {
                    name: "f".into(),
                    mutable: false,
                    value: Expr::bool(true).select(1.0f32, -0.0f32),
                },
            ),
        ),
        (
            "bool literal",
            with_node(
                7,
                Node::Let {
                    name: "f".into(),
                    mutable: false,
                    value: Expr::bool(false).select(1.0f32, 0.0f32),
                },
            ),
        ),
        (
            "select arms",
            with_node(
                7,
                Node::Let {
                    name: "f".into(),
                    mutable: false,
                    value: Expr::bool(true).select(0.0f32, 1.0f32),
                },
            ),
        ),
        (
            "cast target",
            with_node(
                8,
                Node::Let {
                    name: "c".into(),
                    mutable: false,
                    value: Expr::unary(UnaryOp::BitNot, Expr::workgroup_id(Axis::Z))
                        .cast(ScalarType::I32),
                },
            ),
        ),
        (
            "unary op",
            with_node(
                8,
                Node::Let {
                    name: "c".into(),
                    mutable: false,
                    value: Expr::unary(UnaryOp::CountOnes, Expr::workgroup_id(Axis::Z))
                        .cast(ScalarType::F32),
                },
            ),
        ),
        (
            "lane mask",
            with_node(
                9,
                Node::Let {
                    name: "s".into(),
                    mutable: false,
                    value: Expr::SubgroupShuffleXor {
                        value: Box::new(lit_u32(1)),
                        lane_mask: 2,
                    },
                },
            ),
        ),
        (
            "subgroup reduce op",
            with_node(
                10,
                Node::Let {
                    name: "t".into(),
                    mutable: false,
                    value: Expr::SubgroupReduce {
                        op: ReduceOp::Sum,
                        value: Box::new(Expr::workgroup_count(Axis::X)),
                    },
                },
            ),
        ),
        ("node removed", {
            let mut nodes = body();
            nodes.pop();
            program(buffers(), [8, 2, 1], nodes)
        }),
    ];
    variants.push(("entry op id", base.with_entry_op_id("op")));
    variants.push(("other entry op id", base.with_entry_op_id("oq")));
    variants.push(("empty entry op id", base.with_entry_op_id("")));
    variants.push((
        "non_composable_with_self",
        base.with_non_composable_with_self(true),
    ));

    let mut seen = std::collections::HashMap::new();
    seen.insert(base.digest(), "base");
    for (what, variant) in &variants {
        assert_ne!(
            variant, &base,
            "{what}: the variant must differ structurally"
        );
        if let Some(previous) = seen.insert(variant.digest(), what) {
            panic!("{what} has the same digest as {previous}");
        }
    }
    // Negative control: rebuilding the same program gives the same digest.
    let rebuilt = program(buffers(), [8, 2, 1], body());
    assert!(!Program::ptr_eq(&rebuilt, &base));
    assert_eq!(rebuilt.digest(), base.digest());
    assert_eq!(
        base.with_non_composable_with_self(false).digest(),
        base.digest()
    );
}

/// Locks out clones that copy the program instead of sharing it.
#[test]
fn clones_share_one_allocation() {
    let program = fixture();
    let clone = program.clone();
    assert!(Program::ptr_eq(&program, &clone));
    assert!(Arc::ptr_eq(program.entry(), clone.entry()));
    // Negative control: an equal program built separately is equal but not shared.
    let rebuilt = fixture();
    assert_eq!(rebuilt, program);
    assert!(!Program::ptr_eq(&rebuilt, &program));
}

use std::sync::Arc;

/// Locks out a rewrite reusing the original's memoised digest (a renamed program
/// would be served the old program's cache entries).
#[test]
fn rewrites_get_a_fresh_digest() {
    let program = fixture();
    let original = program.digest();
    let renamed = program.with_entry_op_id("tokenize.classify");
    assert!(!Program::ptr_eq(&renamed, &program));
    assert!(!renamed.digest_is_memoised());
    let before = computations_on_current_thread();
    assert_ne!(renamed.digest(), original);
    assert_eq!(computations_on_current_thread() - before, 1);
    assert_eq!(renamed.entry_op_id(), Some("tokenize.classify"));
    assert_eq!(renamed.display_name(), "'tokenize.classify'");
    // The rewrite shares the untouched parts and leaves the original's memo alone.
    assert!(Arc::ptr_eq(renamed.entry(), program.entry()));
    assert_eq!(program.digest(), original);
    let flagged = program.with_non_composable_with_self(true);
    assert!(!flagged.digest_is_memoised());
    assert_ne!(flagged.digest(), original);
    // Same id again: equal content, equal digest, separate value.
    let again = program.with_entry_op_id("tokenize.classify");
    assert_eq!(again.digest(), renamed.digest());
    assert!(!Program::ptr_eq(&again, &renamed));
}

/// Locks out an illegible `Display` (test failures and logs print programs).
#[test]
fn display_of_the_fixture_is_legible() {
    let text = fixture().to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "program workgroup_size [1, 1, 1]");
    assert_eq!(lines[1], "  @binding(0) read_only in: u32[4]");
    assert_eq!(lines[2], "  @binding(1) read_write out: u32[4]");
    assert_eq!(lines[5], "  @binding(4) read_write scratch3: u32[4]");
    assert!(lines.contains(&"    let acc0 = in[0u];"), "{text}");
    assert!(lines.contains(&"    let acc4 = (acc3 + 4u);"), "{text}");
    assert!(lines.contains(&"    out[0u] = acc4;"), "{text}");
    assert_eq!(lines.last(), Some(&"}"));
    // Debug reads the same, so assertion failures show programs.
    assert_eq!(format!("{:?}", fixture()), text);
    let named = fixture()
        .with_entry_op_id("bench")
        .with_non_composable_with_self(true);
    assert!(named
        .to_string()
        .starts_with("program 'bench' workgroup_size [1, 1, 1] non_composable_with_self"));
}

/// Locks out the fixture being invalid (the host-cost instruments dispatch it).
#[test]
fn the_fixture_validates() {
    assert_eq!(validate(&fixture(), &Limits::default()).map(|_| ()), Ok(()));
    for (buffers, steps) in [(2, 0), (5, 1), (9, 128), (17, 1024)] {
        let p = host_cost_fixture(buffers, steps);
        assert_eq!(p.buffers().len(), buffers as usize);
        assert_eq!(p.entry().len(), steps as usize + 2);
        assert_eq!(validate(&p, &Limits::default()).map(|_| ()), Ok(()));
    }
}

// ---- scalar parameters ------------------------------------------------------------

/// `out[0] = scalar(first) + u32(scalar(second))` over scalars declared in `order`.
fn with_scalars(scalars: &[(&str, ScalarType)], read: &str) -> Program {
    let mut builder = Program::builder([1, 1, 1]).buffer(
        "out",
        0,
        Access::WriteOnly,
        ElemType::U32,
        BufferCount::Static(1),
    );
    for &(name, ty) in scalars {
        builder = builder.scalar(name, ty);
    }
    builder
        .body(|b| {
            b.store(
                "out",
                0u32,
                Expr::scalar(read) + Expr::scalar("second").cast(ScalarType::U32),
            );
        })
        .build()
}

/// Locks out a digest blind to the scalar declarations (two kernels with other
/// parameter lists would share one PTX cache entry and be launched with the wrong
/// parameters): the name, the type, the order and the number of declarations and
/// which scalar an expression reads each move the digest. Negative controls: a
/// rebuilt equal program keeps it, and a program without scalars keeps the encoding
/// it had before scalars existed (`digest_is_sha256_of_the_documented_encoding`,
/// `core_only_generator_options_reproduce_earlier_programs`).
#[test]
fn scalar_declarations_move_the_digest() {
    use ScalarType::*;
    let base = with_scalars(&[("first", U32), ("second", F32)], "first");
    let variants = [
        (
            "name",
            with_scalars(&[("other", U32), ("second", F32)], "first"),
        ),
        (
            "type",
            with_scalars(&[("first", U32), ("second", I32)], "first"),
        ),
        (
            "order",
            with_scalars(&[("second", F32), ("first", U32)], "first"),
        ),
        (
            "one more",
            with_scalars(&[("first", U32), ("second", F32), ("third", Bool)], "first"),
        ),
        (
            "read",
            with_scalars(&[("first", U32), ("second", F32)], "second"),
        ),
    ];
    let mut seen = std::collections::HashMap::new();
    seen.insert(base.digest(), "base");
    for (what, variant) in &variants {
        assert_ne!(variant, &base, "{what}");
        if let Some(previous) = seen.insert(variant.digest(), what) {
            panic!("{what} has the same digest as {previous}");
        }
    }
    let rebuilt = with_scalars(&[("first", U32), ("second", F32)], "first");
    assert_eq!(rebuilt.digest(), base.digest());
    assert_eq!(rebuilt, base);
}

/// Locks out a drift between the documented encoding of scalar declarations and the
/// digest: bit 1 of the flags byte, the count, then each name and type tag, and an
/// `Expr::Scalar` as tag 12 and its name.
#[test]
fn scalar_encoding_is_the_documented_one() {
    let program = Program::builder([1, 1, 1])
        .buffer(
            "o",
            0,
            Access::WriteOnly,
            ElemType::U64,
            BufferCount::Runtime,
        )
        .scalar("k", ScalarType::U64)
        .body(|b| {
            b.store("o", 0u32, Expr::scalar("k"));
        })
        .build();
    let mut block = b"block".to_vec();
    block.extend(1u32.to_le_bytes());
    block.push(2); // store
    block.extend(1u32.to_le_bytes());
    block.extend(b"o");
    block.extend([0, 0]); // index: literal u32
    block.extend(0u32.to_le_bytes());
    block.push(12); // value: scalar
    block.extend(1u32.to_le_bytes());
    block.extend(b"k");
    // write_only, u64, runtime
    let mut bytes = one_buffer_header(b"o", 0, [2, 4, 1], [1, 1, 1]);
    bytes.push(0); // no entry op id
    bytes.push(2); // composable, scalars follow
    bytes.extend(1u32.to_le_bytes());
    bytes.extend(1u32.to_le_bytes());
    bytes.extend(b"k");
    bytes.push(ScalarType::U64 as u8);
    bytes.extend(sha256(&block));
    assert_eq!(program.digest().0, sha256(&bytes));
}

/// Locks out scalar parameters the printer hides (a failing test would show a
/// program without the parameters it reads): each declaration is a line after the
/// buffers, in order, and a read prints as `scalar(name)`; the builder's lookups
/// give positions in declaration order.
#[test]
fn scalar_parameters_print_and_resolve() {
    let program = with_scalars(
        &[("first", ScalarType::U32), ("second", ScalarType::F32)],
        "first",
    );
    let text = program.to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[1], "  @binding(0) write_only out: u32[1]");
    assert_eq!(lines[2], "  scalar first: u32");
    assert_eq!(lines[3], "  scalar second: f32");
    assert!(
        text.contains("out[0u] = (scalar(first) + u32(scalar(second)));"),
        "{text}"
    );
    assert_eq!(program.scalars().len(), 2);
    let (position, decl) = program.scalar("second").expect("declared");
    assert_eq!((position, decl.ty), (1, ScalarType::F32));
    assert!(program.scalar("third").is_none());
    assert_eq!(
        ScalarDecl::new("k", ScalarType::Bool).to_string(),
        "scalar k: bool"
    );
    // Values are literals: every type round-trips through its bit pattern.
    for value in [
        Literal::U32(7),
        Literal::I32(-7),
        Literal::F32(-0.5),
        Literal::Bool(true),
        Literal::U64(u64::MAX),
        Literal::I64(i64::MIN),
    ] {
        assert_eq!(Literal::from_bits(value.ty(), value.bits()), value);
    }
    assert_eq!(Literal::from(2u64), Literal::U64(2));
}

// ---- Rebuild ------------------------------------------------------------------------

/// Generated valid programs (grid syncs allowed) and arbitrary ones: between them
/// every node and expression variant.
fn rebuild_corpus() -> Vec<Program> {
    use vyre_cuda::ir::generate::{arbitrary_program, valid_program, GeneratorOptions};
    let options = GeneratorOptions {
        allow_grid_sync: true,
        ..GeneratorOptions::default()
    };
    (0..150)
        .map(|seed| valid_program(seed, &options).program)
        .chain((0..150).map(arbitrary_program))
        .collect()
}

/// The rebuild with every hook at its default.
struct Identity;

impl Rebuild for Identity {
    type Error = std::convert::Infallible;
}

/// Locks out a `Node::map_parts` or `Expr::map_children` that loses or alters a
/// field (an operator, a flag, a variable name, a block): rebuilt with every hook at
/// its default, each program of the corpus comes back equal, digest and all.
#[test]
fn rebuild_with_default_hooks_is_the_identity() {
    for program in rebuild_corpus() {
        let Ok(entry) = Identity.block(program.entry());
        assert!(entry[..] == program.entry()[..], "{program}");
        let rebuilt = program.with_entry(program.buffers_shared().clone(), entry);
        assert_eq!(rebuilt.digest(), program.digest(), "{program}");
    }
}

/// Renames every buffer `name` to `renamed_name`.
struct RenameBuffers;

impl Rebuild for RenameBuffers {
    type Error = std::convert::Infallible;

    fn buffer(&mut self, buffer: &Name) -> Name {
        format!("renamed_{buffer}").into()
    }
}

/// Locks out a rebuild that misses a buffer a node or an expression addresses (a
/// store, an atomic, a load, a length at any depth): the valid programs, their
/// declarations and bodies renamed, still validate. Negative control: with the
/// declarations renamed and the body not, they do not.
#[test]
fn rebuild_maps_every_buffer_a_program_addresses() {
    use vyre_cuda::ir::generate::{valid_program, GeneratorOptions};
    let options = GeneratorOptions {
        allow_grid_sync: true,
        ..GeneratorOptions::default()
    };
    let mut rejected_unrenamed = 0;
    for seed in 0..150 {
        let program = valid_program(seed, &options).program;
        let renamed_decls: Vec<BufferDecl> = program
            .buffers()
            .iter()
            .map(|decl| BufferDecl {
                name: RenameBuffers.buffer(&decl.name),
                ..decl.clone()
            })
            .collect();
        let Ok(entry) = RenameBuffers.block(program.entry());
        let renamed = program.with_entry(renamed_decls.clone().into(), entry);
        validate(&renamed, &Limits::default()).unwrap_or_else(|e| panic!("{e}\n{renamed}"));
        let unrenamed = program.with_entry(renamed_decls.into(), program.entry().clone());
        if validate(&unrenamed, &Limits::default()).is_err() {
            rejected_unrenamed += 1;
        }
    }
    assert!(rejected_unrenamed > 100, "{rejected_unrenamed}");
}
