//! The content digest: SHA-256 of a canonical byte encoding of every program field
//! that affects code generation (buffers, scalar declarations, workgroup size, body,
//! entry op id, flags). Scalar *values* are a dispatch's, never a program's, so no
//! value can reach a digest or a cache key.
//! Blocks are hashed Merkle-style (a nested block enters its parent's encoding as its
//! own 32-byte digest), by an explicit stack and with a memo per shared allocation:
//! a hostile test measured the recursive v1 walk overflowing a 2 MiB stack at 13k levels
//! and walking 2⁶⁴ nodes on 64 levels of shared blocks.
//!
//! It is the root of every cache key in the backend, so it must be stable across
//! runs and platforms (fixed little-endian encoding, tagged variants, length
//! prefixes) and computed at most once per program value (the memo lives in the
//! shared `Program` allocation). The per-thread counter below lets tests prove the
//! "at most once" rule by counting rather than timing.

use std::cell::Cell;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use smallvec::SmallVec;

use super::program::*;
use super::structural::{block_key, expr_children, node_blocks};

/// A 32-byte content digest.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    /// Lower-case hex, 64 characters.
    pub fn to_hex(&self) -> String {
        let mut s = String::with_capacity(64);
        for b in self.0 {
            s.push_str(&format!("{b:02x}"));
        }
        s
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", self.to_hex())
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

thread_local! {
    static COMPUTATIONS_ON_THREAD: Cell<u64> = const { Cell::new(0) };
}
static COMPUTATIONS_TOTAL: AtomicU64 = AtomicU64::new(0);

/// Number of whole-program digest computations performed on the calling thread.
/// Tests use it to prove that clones and cache hits never re-walk a program.
pub fn computations_on_current_thread() -> u64 {
    COMPUTATIONS_ON_THREAD.with(|c| c.get())
}

/// Number of whole-program digest computations in this process.
pub fn computations_total() -> u64 {
    COMPUTATIONS_TOTAL.load(Ordering::Relaxed)
}

pub(crate) fn compute_digest(program: &Program) -> Digest {
    COMPUTATIONS_ON_THREAD.with(|c| c.set(c.get().saturating_add(1)));
    COMPUTATIONS_TOTAL.fetch_add(1, Ordering::Relaxed);
    let mut enc = Encoder::new();
    enc.bytes(b"vyre-cuda program v2");
    let inner = &program.inner;
    enc.u32(inner.buffers.len() as u32);
    for b in inner.buffers.iter() {
        enc.name(&b.name);
        enc.u32(b.binding);
        enc.u8(match b.access {
            Access::ReadOnly => 0,
            Access::ReadWrite => 1,
            Access::WriteOnly => 2,
            Access::Workgroup => 3,
            Access::Local => 4,
        });
        enc.u8(match b.elem {
            ElemType::U8 => 0,
            ElemType::U32 => 1,
            ElemType::I32 => 2,
            ElemType::F32 => 3,
            ElemType::U64 => 4,
            ElemType::I64 => 5,
        });
        match b.count {
            BufferCount::Static(n) => {
                enc.u8(0);
                enc.u32(n);
            }
            BufferCount::Runtime => enc.u8(1),
        }
    }
    for w in inner.workgroup_size {
        enc.u32(w);
    }
    match &inner.entry_op_id {
        Some(id) => {
            enc.u8(1);
            enc.name(id);
        }
        None => enc.u8(0),
    }
    // Bit 1 of the flags byte says scalar declarations follow, so a program without
    // scalars keeps the encoding (and digest) it had before they existed.
    let has_scalars = !inner.scalars.is_empty();
    enc.u8(inner.non_composable_with_self as u8 | (has_scalars as u8) << 1);
    if has_scalars {
        enc.u32(inner.scalars.len() as u32);
        for scalar in inner.scalars.iter() {
            enc.name(&scalar.name);
            enc.u8(scalar.ty as u8);
        }
    }
    enc.bytes(&block_digest(&inner.entry));
    Digest(enc.hasher.finish())
}

/// The Merkle digest of a block: SHA-256 of `"block"`, the node count and each
/// node's encoding, where a nested block is written as its own block digest.
///
/// Post-order over blocks by an explicit stack (no recursion at any depth), with a
/// memo by allocation for shared blocks, so a block shared by many parents is
/// hashed once: `b = [If { then: b, else: b }]` nested 64 times costs 64 block
/// hashes, not 2⁶⁴. The result depends only on content, never on sharing.
fn block_digest(root: &Block) -> [u8; 32] {
    enum Frame<'a> {
        Enter(&'a Block),
        Exit(&'a Block, usize),
    }
    let mut memo: HashMap<(usize, usize), [u8; 32]> = HashMap::new();
    let mut frames: SmallVec<[Frame<'_>; 8]> = SmallVec::new();
    frames.push(Frame::Enter(root));
    let mut done: SmallVec<[[u8; 32]; 4]> = SmallVec::new();
    let mut exprs: Vec<&Expr> = Vec::new();
    let empty = empty_block_digest();
    while let Some(frame) = frames.pop() {
        match frame {
            Frame::Enter(block) => {
                if Arc::strong_count(block) > 1 {
                    if let Some(digest) = memo.get(&block_key(block)) {
                        done.push(*digest);
                        continue;
                    }
                }
                // Empty blocks have one digest (`empty`), computed once: no frame.
                let children = block
                    .iter()
                    .map(|node| {
                        node_blocks(node)
                            .into_iter()
                            .flatten()
                            .filter(|b| !b.is_empty())
                            .count()
                    })
                    .sum();
                frames.push(Frame::Exit(block, children));
                for node in block.iter() {
                    for child in node_blocks(node).into_iter().flatten() {
                        if !child.is_empty() {
                            frames.push(Frame::Enter(child));
                        }
                    }
                }
            }
            Frame::Exit(block, children) => {
                // The last child pushed was entered first, so the first child's
                // digest is on top: reversed, the list is in program order.
                let start = done.len().saturating_sub(children);
                let nested: Vec<[u8; 32]> = done.drain(start..).rev().collect();
                let mut nested = nested.iter();
                let mut enc = Encoder::new();
                enc.bytes(b"block");
                enc.u32(block.len() as u32);
                for node in block.iter() {
                    enc.node(node, &empty, &mut nested, &mut exprs);
                }
                let digest = enc.hasher.finish();
                if Arc::strong_count(block) > 1 {
                    memo.insert(block_key(block), digest);
                }
                done.push(digest);
            }
        }
    }
    done.pop().unwrap_or([0; 32])
}

/// The digest of an empty block (every `else {}`), computed once per process.
fn empty_block_digest() -> [u8; 32] {
    static EMPTY: std::sync::OnceLock<[u8; 32]> = std::sync::OnceLock::new();
    *EMPTY.get_or_init(|| {
        let mut enc = Encoder::new();
        enc.bytes(b"block");
        enc.u32(0);
        enc.hasher.finish()
    })
}

struct Encoder {
    hasher: Sha256,
}

impl Encoder {
    fn new() -> Self {
        Encoder {
            hasher: Sha256::new(),
        }
    }
    fn bytes(&mut self, b: &[u8]) {
        self.hasher.update(b);
    }
    fn u8(&mut self, v: u8) {
        self.hasher.update(&[v]);
    }
    fn u32(&mut self, v: u32) {
        self.hasher.update(&v.to_le_bytes());
    }
    fn name(&mut self, n: &str) {
        self.u32(n.len() as u32);
        self.bytes(n.as_bytes());
    }
    /// One node; each nested block is written as the next digest of `nested`.
    fn node<'a>(
        &mut self,
        node: &'a Node,
        empty: &[u8; 32],
        nested: &mut std::slice::Iter<'_, [u8; 32]>,
        scratch: &mut Vec<&'a Expr>,
    ) {
        let mut block = |enc: &mut Encoder, block: &Block| {
            let digest = if block.is_empty() {
                *empty
            } else {
                nested.next().copied().unwrap_or([0; 32])
            };
            enc.bytes(&digest);
        };
        match node {
            Node::Let {
                name,
                mutable,
                value,
            } => {
                self.u8(0);
                self.name(name);
                self.u8(*mutable as u8);
                self.expr(value, scratch);
            }
            Node::Assign { name, value } => {
                self.u8(1);
                self.name(name);
                self.expr(value, scratch);
            }
            Node::Store {
                buffer,
                index,
                value,
            } => {
                self.u8(2);
                self.name(buffer);
                self.expr(index, scratch);
                self.expr(value, scratch);
            }
            Node::If {
                condition,
                then_body,
                else_body,
            } => {
                self.u8(3);
                self.expr(condition, scratch);
                block(self, then_body);
                block(self, else_body);
            }
            Node::Loop {
                variable,
                start,
                end,
                body,
            } => {
                self.u8(4);
                self.name(variable);
                self.expr(start, scratch);
                self.expr(end, scratch);
                block(self, body);
            }
            Node::Barrier => self.u8(5),
            Node::GridSync => self.u8(6),
            Node::Fence => self.u8(16),
            Node::WorkgroupFence => self.u8(18),
            Node::Atomic {
                op,
                buffer,
                index,
                value,
            } => {
                self.u8(7);
                self.u8(*op as u8);
                self.name(buffer);
                self.expr(index, scratch);
                self.expr(value, scratch);
            }
            Node::WorkgroupReduce { name, op, value } => {
                self.u8(8);
                self.name(name);
                self.u8(*op as u8);
                self.expr(value, scratch);
            }
            Node::Return => self.u8(9),
            Node::While { condition, body } => {
                self.u8(10);
                self.expr(condition, scratch);
                block(self, body);
            }
            Node::Break => self.u8(11),
            Node::Continue => self.u8(12),
            Node::AtomicFetch {
                name,
                op,
                buffer,
                index,
                value,
            } => {
                self.u8(13);
                self.name(name);
                self.u8(*op as u8);
                self.name(buffer);
                self.expr(index, scratch);
                self.expr(value, scratch);
            }
            Node::WorkgroupScan {
                name,
                op,
                kind,
                value,
            } => {
                self.u8(15);
                self.name(name);
                self.u8(*op as u8);
                self.u8(*kind as u8);
                self.expr(value, scratch);
            }
            Node::CompareExchange {
                name,
                buffer,
                index,
                expected,
                value,
            } => {
                self.u8(14);
                self.name(name);
                self.name(buffer);
                self.expr(index, scratch);
                self.expr(expected, scratch);
                self.expr(value, scratch);
            }
            Node::AtomicLoad {
                name,
                buffer,
                index,
            } => {
                self.u8(17);
                self.name(name);
                self.name(buffer);
                self.expr(index, scratch);
            }
            Node::AcquireLoad {
                name,
                buffer,
                index,
            } => {
                self.u8(19);
                self.name(name);
                self.name(buffer);
                self.expr(index, scratch);
            }
        }
    }
    /// Pre-order encoding of an expression tree by an explicit stack.
    fn expr<'a>(&mut self, root: &'a Expr, stack: &mut Vec<&'a Expr>) {
        stack.clear();
        stack.push(root);
        while let Some(expr) = stack.pop() {
            self.expr_fields(expr);
            stack.extend(expr_children(expr).into_iter().flatten().rev());
        }
    }
    /// An expression's tag and own fields (its children follow in pre-order).
    fn expr_fields(&mut self, expr: &Expr) {
        match expr {
            Expr::Literal(lit) => {
                self.u8(0);
                self.u8(lit.ty() as u8);
                // 32-bit types keep the first encoding's four bytes.
                if lit.ty().is_wide() {
                    self.hasher.update(&lit.bits().to_le_bytes());
                } else {
                    self.u32(lit.bits() as u32);
                }
            }
            Expr::Var(name) => {
                self.u8(1);
                self.name(name);
            }
            Expr::Load { buffer, .. } => {
                self.u8(2);
                self.name(buffer);
            }
            Expr::Length { buffer } => {
                self.u8(3);
                self.name(buffer);
            }
            Expr::Binary { op, .. } => {
                self.u8(4);
                self.u8(*op as u8);
            }
            Expr::Unary { op, .. } => {
                self.u8(5);
                self.u8(*op as u8);
            }
            Expr::Select { .. } => self.u8(6),
            Expr::Cast { to, .. } => {
                self.u8(7);
                self.u8(*to as u8);
            }
            Expr::Builtin(b) => {
                self.u8(8);
                let (kind, axis) = match b {
                    Builtin::GlobalId(a) => (0, a.index()),
                    Builtin::LocalId(a) => (1, a.index()),
                    Builtin::WorkgroupId(a) => (2, a.index()),
                    Builtin::WorkgroupCount(a) => (3, a.index()),
                    Builtin::Clock => (4, 0),
                };
                self.u8(kind);
                self.u8(axis as u8);
            }
            Expr::SubgroupShuffleXor { lane_mask, .. } => {
                self.u8(9);
                self.u32(*lane_mask);
            }
            Expr::SubgroupReduce { op, .. } => {
                self.u8(10);
                self.u8(*op as u8);
            }
            Expr::SubgroupScan { op, kind, .. } => {
                self.u8(11);
                self.u8(*op as u8);
                self.u8(*kind as u8);
            }
            Expr::Scalar(name) => {
                self.u8(12);
                self.name(name);
            }
        }
    }
}

/// A plain SHA-256 (FIPS 180-4), streaming. Written here rather than taken from a
/// crate because the project keeps its dependency list to cudarc, tracing and smallvec.
pub(crate) struct Sha256 {
    state: [u32; 8],
    buffer: [u8; 64],
    buffered: usize,
    length_bytes: u64,
}

const K: [u32; 64] = [
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
];

impl Sha256 {
    pub(crate) fn new() -> Self {
        Sha256 {
            state: [
                0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
                0x5be0cd19,
            ],
            buffer: [0; 64],
            buffered: 0,
            length_bytes: 0,
        }
    }

    pub(crate) fn update(&mut self, mut data: &[u8]) {
        self.length_bytes = self.length_bytes.wrapping_add(data.len() as u64);
        if self.buffered > 0 {
            let take = (64 - self.buffered).min(data.len());
            self.buffer[self.buffered..self.buffered + take].copy_from_slice(&data[..take]);
            self.buffered += take;
            data = &data[take..];
            if self.buffered < 64 {
                return;
            }
            let block = self.buffer;
            self.compress(&block);
            self.buffered = 0;
        }
        while data.len() >= 64 {
            let (block, rest) = data.split_at(64);
            self.compress(block.try_into().expect("split_at(64) gives 64 bytes"));
            data = rest;
        }
        self.buffer[..data.len()].copy_from_slice(data);
        self.buffered = data.len();
    }

    pub(crate) fn finish(mut self) -> [u8; 32] {
        let bit_length = self.length_bytes.wrapping_mul(8);
        // 0x80, then zeros up to 56 bytes into a block, in one update.
        let padding = [0u8; 64];
        let zeros = (64 + 56 - (self.buffered + 1) % 64) % 64;
        self.update(&[0x80]);
        self.update(&padding[..zeros]);
        self.update(&bit_length.to_be_bytes());
        let mut out = [0u8; 32];
        for (i, word) in self.state.iter().enumerate() {
            out[i * 4..i * 4 + 4].copy_from_slice(&word.to_be_bytes());
        }
        out
    }

    fn compress(&mut self, block: &[u8; 64]) {
        let mut w = [0u32; 64];
        for i in 0..16 {
            w[i] = u32::from_be_bytes([
                block[i * 4],
                block[i * 4 + 1],
                block[i * 4 + 2],
                block[i * 4 + 3],
            ]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16]
                .wrapping_add(s0)
                .wrapping_add(w[i - 7])
                .wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut h] = self.state;
        for i in 0..64 {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = h
                .wrapping_add(s1)
                .wrapping_add(ch)
                .wrapping_add(K[i])
                .wrapping_add(w[i]);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            let t2 = s0.wrapping_add(maj);
            h = g;
            g = f;
            f = e;
            e = d.wrapping_add(t1);
            d = c;
            c = b;
            b = a;
            a = t1.wrapping_add(t2);
        }
        for (s, v) in self.state.iter_mut().zip([a, b, c, d, e, f, g, h]) {
            *s = s.wrapping_add(v);
        }
    }
}

/// SHA-256 of a byte string (used by the backend to derive module keys).
pub fn sha256(data: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(data);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Locks out a wrong SHA-256 (padding, endianness): the FIPS 180-4 test vectors.
    #[test]
    fn sha256_matches_fips_vectors() {
        let hex = |d: [u8; 32]| Digest(d).to_hex();
        assert_eq!(
            hex(sha256(b"")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            hex(sha256(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            hex(sha256(
                b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"
            )),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
        // Streaming in odd pieces gives the same answer as one call.
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let mut h = Sha256::new();
        for chunk in data.chunks(13) {
            h.update(chunk);
        }
        assert_eq!(h.finish(), sha256(&data));
    }
}
