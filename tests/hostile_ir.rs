//! Hostile programs through every public walk of the IR: a program
//! nested 10⁶ deep, walked on a spawned thread with a 2 MiB stack (what a caller on a
//! worker pool has), and a program of 64 levels of shared blocks (`b = [If { then:
//! b, else: b }]`, a tree of 2⁶⁴ nodes in a few kilobytes). Each walk must finish
//! with its answer or the validator's error: never a stack overflow (the process
//! aborts), never a walk of 2⁶⁴ nodes.
//!
//! No test asserts a wall-clock bound; the work done is asserted instead (counts,
//! output sizes), and the 2⁶⁴-node cases could only finish by not walking the tree.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use vyre_cuda::ir::validate::{Rule, MAX_NESTING_DEPTH, MESSAGE_NAME_MAX_BYTES};
use vyre_cuda::ir::*;

/// The nesting depth every walk must survive.
const DEPTH: usize = 1_000_000;

/// Stack of the thread each walk runs on: a worker pool's usual 2 MiB.
const STACK_BYTES: usize = 2 << 20;

/// Runs `f` on a fresh thread with a 2 MiB stack and returns its result (a panic in
/// `f` fails the test; a stack overflow would abort the whole test process).
fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .stack_size(STACK_BYTES)
        .spawn(f)
        .expect("spawn a 2 MiB thread")
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// `~~~…~1u`, `depth` operators deep, with `leaf` at the bottom.
fn deep_expr(depth: usize, leaf: u32) -> Expr {
    let mut expr = Expr::u32(leaf);
    for _ in 0..depth {
        expr = Expr::Unary {
            op: UnaryOp::BitNot,
            operand: Box::new(expr),
        };
    }
    expr
}

/// `let x = ~~…~leaf;` as a one-node program.
fn deep_expr_program(depth: usize, leaf: u32) -> Program {
    Program::new(
        Vec::new(),
        [1, 1, 1],
        vec![Node::Let {
            name: "x".into(),
            mutable: false,
            value: deep_expr(depth, leaf),
        }],
    )
}

/// `if true { if true { … { barrier or return } } }`, `depth` ifs deep.
fn deep_block_nodes(depth: usize, innermost: Node) -> Vec<Node> {
    let empty: Block = Arc::from(Vec::<Node>::new());
    let mut nodes = vec![innermost];
    for _ in 0..depth {
        nodes = vec![Node::If {
            condition: Expr::bool(true),
            then_body: Arc::from(nodes),
            else_body: empty.clone(),
        }];
    }
    nodes
}

fn deep_block_program(depth: usize, innermost: Node) -> Program {
    Program::new(Vec::new(), [1, 1, 1], deep_block_nodes(depth, innermost))
}

/// `b = [If { then: b, else: b }]`, `levels` times, around `innermost`.
fn shared_block_nodes(levels: usize, innermost: Node) -> Vec<Node> {
    let mut block: Block = Arc::from(vec![innermost]);
    for _ in 0..levels {
        block = Arc::from(vec![Node::If {
            condition: Expr::bool(true),
            then_body: block.clone(),
            else_body: block,
        }]);
    }
    block.to_vec()
}

fn shared_program(levels: usize, innermost: Node) -> Program {
    Program::new(Vec::new(), [1, 1, 1], shared_block_nodes(levels, innermost))
}

/// The same tree as [`shared_block_nodes`], with every block its own allocation.
fn unshared_block_nodes(levels: usize, innermost: &Node) -> Vec<Node> {
    if levels == 0 {
        return vec![innermost.clone()];
    }
    vec![Node::If {
        condition: Expr::bool(true),
        then_body: unshared_block_nodes(levels - 1, innermost).into(),
        else_body: unshared_block_nodes(levels - 1, innermost).into(),
    }]
}

fn hash_of<T: Hash>(value: &T) -> u64 {
    let mut hasher = DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

// ---- depth 10⁶ on a 2 MiB stack ----------------------------------------------------------

/// Nesting of the block chain the digest test hashes: past the 13k levels at which
/// the recursive digest overflowed a 2 MiB stack, but not 10⁶, because the Merkle
/// digest finishes one SHA-256 per block and an unoptimised (debug) SHA-256 costs
/// about 36 µs a block. The expression chain below is 10⁶ deep.
const DIGEST_BLOCK_DEPTH: usize = 40_000;

/// Locks out a recursive digest (it overflowed a 2 MiB stack at 13k levels): a 10⁶
/// deep expression and a deep block chain digest, and the bottom leaf still changes
/// the digest (the walk reaches it; equal content gives equal digests).
#[test]
fn digest_of_a_million_levels_on_a_small_stack() {
    on_small_stack(|| {
        let a = deep_expr_program(DEPTH, 1).digest();
        assert_ne!(deep_expr_program(DEPTH, 2).digest(), a);
        let b = deep_block_program(DIGEST_BLOCK_DEPTH, Node::Barrier).digest();
        assert_ne!(
            deep_block_program(DIGEST_BLOCK_DEPTH, Node::Return).digest(),
            b
        );
        let c = deep_expr_program(1_000, 1).digest();
        assert_eq!(deep_expr_program(1_000, 1).digest(), c);
    });
}

/// Locks out a recursive, unbounded `Display` (it overflowed at expression depth 10k
/// and wrote 400 MB of indentation at block depth 10⁴): the listing ends, is small,
/// and marks where it elided.
#[test]
fn display_of_a_million_levels_on_a_small_stack() {
    on_small_stack(|| {
        for program in [
            deep_expr_program(DEPTH, 1),
            deep_block_program(DEPTH, Node::Barrier),
        ] {
            let text = program.to_string();
            assert!(text.len() < 64 * 1024, "{} bytes", text.len());
            assert!(text.contains('…'), "no elision marker:\n{text}");
            assert!(text.ends_with("}\n"));
        }
        let expr = deep_expr(DEPTH, 1).to_string();
        assert!(expr.len() < 1024 && expr.ends_with('…'), "{expr}");
    });
}

/// Locks out a recursive `Debug` (derived `Debug` recursed like `Display`).
#[test]
fn debug_of_a_million_levels_on_a_small_stack() {
    on_small_stack(|| {
        let program = deep_block_program(DEPTH, Node::Barrier);
        let text = format!("{program:?}");
        assert_eq!(text, program.to_string());
        let node = format!("{:?}", program.entry()[0]);
        assert!(node.len() < 64 * 1024 && node.contains('…'));
        let expr = format!("{:?}", deep_expr(DEPTH, 1));
        assert!(expr.len() < 1024);
    });
}

/// Locks out a recursive `==` (it overflowed at 18.7k levels): equal deep values are
/// equal, and a difference at the very bottom is found (negative control: the
/// comparison does walk all the way down).
#[test]
fn equality_of_a_million_levels_on_a_small_stack() {
    on_small_stack(|| {
        assert_eq!(deep_expr(DEPTH, 1), deep_expr(DEPTH, 1));
        assert_ne!(deep_expr(DEPTH, 1), deep_expr(DEPTH, 2));
        let a = deep_block_program(DEPTH, Node::Barrier);
        assert_eq!(a, deep_block_program(DEPTH, Node::Barrier));
        assert_ne!(a, deep_block_program(DEPTH, Node::Return));
        assert_eq!(a.entry()[0], a.entry()[0].clone());
    });
}

/// Locks out a recursive `Hash` (it overflowed at 32k levels): hashing ends and equal
/// values hash equally.
#[test]
fn hash_of_a_million_levels_on_a_small_stack() {
    on_small_stack(|| {
        assert_eq!(hash_of(&deep_expr(DEPTH, 1)), hash_of(&deep_expr(DEPTH, 1)));
        let a = deep_block_nodes(DEPTH, Node::Barrier);
        let b = deep_block_nodes(DEPTH, Node::Barrier);
        assert_eq!(hash_of(&a[0]), hash_of(&b[0]));
        // Shallow differences still separate hashes (the prefix is really hashed).
        assert_ne!(hash_of(&Expr::u32(1)), hash_of(&Expr::u32(2)));
    });
}

/// Locks out a recursive `Clone` (it overflowed at 18.7k levels): a deep expression
/// and a node holding one clone into equal, independent values.
#[test]
fn clone_of_a_million_levels_on_a_small_stack() {
    on_small_stack(|| {
        let expr = deep_expr(DEPTH, 7);
        let copy = expr.clone();
        assert_eq!(copy, expr);
        drop(expr);
        assert_eq!(copy, deep_expr(DEPTH, 7));
        let node = Node::Let {
            name: "x".into(),
            mutable: false,
            value: copy,
        };
        assert_eq!(node.clone(), node);
    });
}

/// Locks out a recursive `Drop` (letting a deep program go out of scope aborted the
/// process at 21.6k levels on a 2 MiB thread): deep expressions, deep blocks and a
/// deep program are dropped, and a block still shared elsewhere survives the drop
/// of one holder intact.
#[test]
fn drop_of_a_million_levels_on_a_small_stack() {
    on_small_stack(|| {
        drop(deep_expr(DEPTH, 1));
        drop(deep_block_nodes(DEPTH, Node::Barrier));
        drop(deep_expr_program(DEPTH, 1));
        let program = deep_block_program(DEPTH, Node::Barrier);
        let kept: Block = match &program.entry()[0] {
            Node::If { then_body, .. } => then_body.clone(),
            _ => unreachable!("deep_block_program starts with an if"),
        };
        drop(program);
        // The kept inner block still holds DEPTH - 1 ifs and the barrier.
        let rebuilt = Program::new(Vec::new(), [1, 1, 1], kept.to_vec());
        assert_eq!(rebuilt.node_count(), 2 * (DEPTH as u64 - 1) + 1);
    });
}

/// Locks out a recursive `node_count` (it overflowed at 44k levels): exact counts.
#[test]
fn node_count_of_a_million_levels_on_a_small_stack() {
    on_small_stack(|| {
        // One let plus DEPTH operators plus the literal.
        assert_eq!(deep_expr_program(DEPTH, 1).node_count(), DEPTH as u64 + 2);
        // Each if is a node and a condition; plus the barrier.
        assert_eq!(
            deep_block_program(DEPTH, Node::Barrier).node_count(),
            2 * DEPTH as u64 + 1
        );
    });
}

/// Locks out the validator recursing with the program (or any walk before it):
/// both deep shapes get `NestingTooDeep` with a `Fix:` message.
#[test]
fn validation_of_a_million_levels_on_a_small_stack() {
    on_small_stack(|| {
        for program in [
            deep_expr_program(DEPTH, 1),
            deep_block_program(DEPTH, Node::Barrier),
        ] {
            let error = validate(&program, &Limits::default()).expect_err("too deep");
            assert_eq!(error.rule(), Rule::NestingTooDeep, "{error}");
            assert!(error.message().starts_with("Fix:"));
            let lowered = validate_lowered(&program, &Limits::default()).expect_err("deep");
            assert_eq!(lowered.rule(), Rule::NestingTooDeep);
        }
        // Negative control: at the limit the same shape is valid.
        let at_limit = deep_block_program(MAX_NESTING_DEPTH as usize - 1, Node::Barrier);
        validate(&at_limit, &Limits::default()).expect("within the nesting limit");
    });
}

// ---- 64 levels of shared blocks (2⁶⁴ nodes as a tree) ---------------------------------

/// Locks out a digest that walks the tree (2⁶⁴ nodes): the shared program digests,
/// and sharing does not change a digest: a 12-level shared program and the same
/// tree built without sharing (4,096 leaves) have one digest.
#[test]
fn digest_of_shared_blocks_walks_each_block_once() {
    let a = shared_program(64, Node::Barrier).digest();
    assert_eq!(shared_program(64, Node::Barrier).digest(), a);
    assert_ne!(shared_program(64, Node::Return).digest(), a);
    assert_ne!(shared_program(63, Node::Barrier).digest(), a);
    let shared = shared_program(12, Node::Barrier);
    let unshared = Program::new(
        Vec::new(),
        [1, 1, 1],
        unshared_block_nodes(12, &Node::Barrier),
    );
    assert_eq!(shared.digest(), unshared.digest());
    assert_eq!(shared, unshared);
}

/// Locks out a node count that walks the tree or overflows: it saturates at
/// `u64::MAX` for 64 levels and is exact where it fits (checked against the same
/// tree built without sharing).
#[test]
fn node_count_of_shared_blocks_saturates_without_walking_the_tree() {
    assert_eq!(shared_program(64, Node::Barrier).node_count(), u64::MAX);
    // count(levels) = 2 + 2 * count(levels - 1), count(0) = 1.
    let mut expected = 1u64;
    for _ in 0..12 {
        expected = 2 + 2 * expected;
    }
    assert_eq!(shared_program(12, Node::Barrier).node_count(), expected);
    let unshared = Program::new(
        Vec::new(),
        [1, 1, 1],
        unshared_block_nodes(12, &Node::Barrier),
    );
    assert_eq!(unshared.node_count(), expected);
}

/// Locks out `==` walking both trees (2⁶⁴ pairs): two separately built shared
/// programs compare equal, and a difference at the bottom is still found.
#[test]
fn equality_of_shared_blocks_compares_each_pair_once() {
    let a = shared_program(64, Node::Barrier);
    assert_eq!(a, shared_program(64, Node::Barrier));
    assert_ne!(a, shared_program(64, Node::Return));
    assert_eq!(a.entry()[0], shared_block_nodes(64, Node::Barrier)[0]);
}

/// Locks out `Hash` walking the tree: shared programs' nodes hash, equal ones equally.
#[test]
fn hash_of_shared_blocks_is_bounded() {
    let a = shared_block_nodes(64, Node::Barrier);
    let b = shared_block_nodes(64, Node::Barrier);
    assert_eq!(hash_of(&a[0]), hash_of(&b[0]));
}

/// Locks out `Display`/`Debug` printing the tree (over 3 GB): the listing stops at
/// the byte budget with a marker saying so.
#[test]
fn display_of_shared_blocks_stops_at_the_budget() {
    let program = shared_program(64, Node::Barrier);
    for text in [program.to_string(), format!("{program:?}")] {
        assert!(text.len() <= DISPLAY_MAX_BYTES + 64, "{} bytes", text.len());
        assert!(text.contains("output elided"), "no budget marker");
    }
    // Negative control: a small program is printed whole, without the marker.
    let small = shared_program(3, Node::Barrier).to_string();
    assert!(!small.contains('…'), "{small}");
    assert_eq!(small.matches("workgroup_barrier();").count(), 8);
}

/// Locks out `Clone` and `Drop` of shared programs touching the tree: clones share,
/// and dropping every holder in any order frees it (the drop ends).
#[test]
fn clone_and_drop_of_shared_blocks() {
    let program = shared_program(64, Node::Barrier);
    let node = program.entry()[0].clone();
    let copy = program.clone();
    drop(program);
    assert_eq!(copy.entry()[0], node);
    drop(node);
    drop(copy);
    on_small_stack(|| drop(shared_program(DEPTH, Node::Barrier)));
}

/// Locks out a validator that walks 2²⁴ nodes of a shared tree before giving up:
/// it refuses the 64-level program as `TooManyNodes` from the node count (one step
/// per block), and a shared program within the limit validates.
#[test]
fn validation_of_shared_blocks_refuses_the_expanded_size() {
    let program = shared_program(64, Node::Barrier);
    let before = walks_on_current_thread();
    let error = validate(&program, &Limits::default()).expect_err("2^64 nodes");
    assert_eq!(error.rule(), Rule::TooManyNodes, "{error}");
    assert!(error.message().contains("more than 2^64"), "{error}");
    assert_eq!(walks_on_current_thread(), before + 1);
    // Negative control: the same shape, small enough, is valid.
    validate(&shared_program(10, Node::Barrier), &Limits::default()).expect("small");
}

fn walks_on_current_thread() -> u64 {
    vyre_cuda::ir::validate::walks_on_current_thread()
}

// ---- output size and names ---------------------------------------------------------------

/// Locks out quadratic `Display` output (indentation grew with depth: 400 MB at
/// depth 10⁴): bytes per node stay bounded from depth 10 to depth 10,000.
#[test]
fn display_output_is_linear_in_program_size() {
    for depth in [10, 60, 100, 1_000, 10_000] {
        let program = deep_block_program(depth, Node::Barrier);
        let bytes = program.to_string().len() as u64;
        let per_node = bytes / program.node_count();
        assert!(
            per_node <= 80,
            "depth {depth}: {bytes} bytes, {per_node}/node"
        );
    }
    // Indentation stops growing: a line at depth 60 is no longer than at depth 16.
    let text = deep_block_program(60, Node::Barrier).to_string();
    let widest = text.lines().map(str::len).max().unwrap_or(0);
    assert!(widest <= 4 * DISPLAY_MAX_INDENT_LEVELS + 32, "{widest}");
    // Negative control: below the cap, indentation does grow with depth.
    let shallow = deep_block_program(8, Node::Barrier).to_string();
    assert!(shallow.contains(&format!("{}workgroup_barrier();", "    ".repeat(9))));
}

/// Locks out two printers that disagree (the validator described `min(a, b)` as
/// `(a min b)`): the error message quotes the node as `Display` prints it.
#[test]
fn validator_descriptions_use_the_display_printer() {
    let value = Expr::binary(BinaryOp::Min, Expr::u32(1), Expr::i32(2));
    let node = Node::Let {
        name: "m".into(),
        mutable: false,
        value: value.clone(),
    };
    let program = Program::new(Vec::new(), [1, 1, 1], vec![node]);
    let error = validate(&program, &Limits::default()).expect_err("u32 min i32");
    assert_eq!(error.rule(), Rule::TypeMismatch);
    assert!(
        error.message().contains(&format!("let m = {value}")),
        "{error}"
    );
    assert_eq!(value.to_string(), "min(1u, 2i)");
}

/// Locks out error messages that copy a whole name (a 1 MiB name gave a 1 MiB
/// message): the name is cut at `MESSAGE_NAME_MAX_BYTES` with its length stated.
#[test]
fn error_messages_cap_names() {
    let name = "n".repeat(1 << 20);
    let program = Program::new(
        Vec::new(),
        [1, 1, 1],
        vec![Node::Assign {
            name: name.as_str().into(),
            value: Expr::u32(1),
        }],
    );
    let error = validate(&program, &Limits::default()).expect_err("unknown variable");
    assert_eq!(error.rule(), Rule::UnknownVariable);
    assert!(
        error.message().len() < 2_000,
        "{} bytes",
        error.message().len()
    );
    assert!(error
        .message()
        .contains(&"n".repeat(MESSAGE_NAME_MAX_BYTES)));
    assert!(error.message().contains("(1048576 bytes)"), "{error}");
    // Negative control: a short name is quoted whole.
    let short = Program::new(
        Vec::new(),
        [1, 1, 1],
        vec![Node::Assign {
            name: "short".into(),
            value: Expr::u32(1),
        }],
    );
    let error = validate(&short, &Limits::default()).expect_err("unknown variable");
    assert!(error.message().contains("`short`"), "{error}");
}

// ---- crafted hash collisions -------------------------------------------------------------

/// The validator's former name hasher (an unkeyed Fx-style multiply-rotate),
/// reimplemented to prove the names below really collide under it.
#[derive(Default)]
struct FormerNameHasher {
    hash: u64,
}

const FORMER_MULTIPLIER: u64 = 0x517c_c1b7_2722_0a95;

impl Hasher for FormerNameHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }
    fn write_u8(&mut self, value: u8) {
        self.write_u64(value as u64);
    }
    fn write_u64(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(FORMER_MULTIPLIER);
    }
    fn finish(&self) -> u64 {
        let mut h = self.hash;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^ (h >> 33)
    }
}

/// `count` distinct 16-byte ASCII names with one hash under [`FormerNameHasher`]:
/// the second word cancels the first (`w2 = rotl(w1 * K, 5)` makes the state 0).
fn colliding_names(count: usize) -> Vec<String> {
    let mut names = Vec::with_capacity(count);
    let mut counter = 0u64;
    while names.len() < count {
        counter += 1;
        // Eight letters from the counter (base 26): an ASCII first word.
        let mut first = [0u8; 8];
        let mut rest = counter;
        for byte in first.iter_mut() {
            *byte = b'a' + (rest % 26) as u8;
            rest /= 26;
        }
        let w1 = u64::from_le_bytes(first);
        let w2 = w1.wrapping_mul(FORMER_MULTIPLIER).rotate_left(5);
        let second = w2.to_le_bytes();
        if second.iter().all(|b| b.is_ascii()) {
            let mut name = first.to_vec();
            name.extend_from_slice(&second);
            names.push(String::from_utf8(name).expect("ASCII"));
        }
    }
    names
}

/// Locks out a validator name table that is quadratic under crafted collisions
/// (80,000 names colliding under the former unkeyed hasher took 64 s): 20,000 such
/// names, declared as variables and each read back, validate. The test bounds no
/// time; before the fix its 2·10⁸ colliding probes would not finish in a test run.
#[test]
fn colliding_names_validate_without_quadratic_probing() {
    let names = colliding_names(20_000);
    // Negative control: the input really is adversarial for the former hasher.
    let hash = |name: &str| {
        let mut hasher = FormerNameHasher::default();
        name.hash(&mut hasher);
        hasher.finish()
    };
    let first = hash(&names[0]);
    assert!(names.iter().all(|n| hash(n) == first));
    let distinct: std::collections::HashSet<&String> = names.iter().collect();
    assert_eq!(distinct.len(), names.len());

    let mut body: Vec<Node> = names
        .iter()
        .map(|name| Node::Let {
            name: name.as_str().into(),
            mutable: true,
            value: Expr::u32(1),
        })
        .collect();
    body.extend(names.iter().map(|name| Node::Assign {
        name: name.as_str().into(),
        value: Expr::var(name.as_str()),
    }));
    let program = Program::new(Vec::new(), [1, 1, 1], body);
    validate(&program, &Limits::default()).expect("distinct names validate");
}

/// Counts what a `Hash` implementation feeds the hasher.
#[derive(Default)]
struct CountingHasher {
    writes: u64,
}

impl Hasher for CountingHasher {
    fn write(&mut self, _bytes: &[u8]) {
        self.writes += 1;
    }
    fn finish(&self) -> u64 {
        self.writes
    }
}

fn hash_writes<T: Hash>(value: &T) -> u64 {
    let mut hasher = CountingHasher::default();
    value.hash(&mut hasher);
    hasher.writes
}

/// Locks out a `Hash` whose work grows with the program (a wide block pushed whole,
/// or a deep tree walked whole): a node over 10⁶ siblings and a 10⁶-deep expression
/// feed the hasher no more than a program of `HASH_ITEM_BUDGET` items does.
#[test]
fn hash_work_is_bounded_by_the_item_budget() {
    let wide = Node::If {
        condition: Expr::bool(true),
        then_body: vec![Node::Barrier; DEPTH].into(),
        else_body: Vec::new().into(),
    };
    let bound = 8 * HASH_ITEM_BUDGET as u64;
    assert!(hash_writes(&wide) <= bound, "{}", hash_writes(&wide));
    let deep = deep_expr(DEPTH, 1);
    assert!(hash_writes(&deep) <= bound, "{}", hash_writes(&deep));
    // Negative control: below the budget, more items mean more hashing.
    assert!(hash_writes(&deep_expr(10, 1)) > hash_writes(&deep_expr(1, 1)));
}
