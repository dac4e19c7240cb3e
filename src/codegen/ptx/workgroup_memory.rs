//! Where a kernel's workgroup buffers live: static `.shared` arrays up to
//! [`MAX_STATIC_SHARED_BYTES`], one dynamic pool beyond.
//!
//! Why it exists: a static `.shared` declaration is capped at 48 KiB per kernel on
//! every CUDA device (ptxas refuses more: "too much shared data (..., 0xc000
//! max)"), while an H200 gives one block up to 227 KiB (232,448 bytes,
//! `CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN`) of *dynamic* shared
//! memory once the function opts in
//! (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`). The tokenizer's split in
//! blocks of 4 KiB (512 threads × 8 bytes) needs 49,304 bytes and was refused.
//!
//! So a kernel whose workgroup buffers together pass 48 KiB declares one
//! `.extern .shared .align 16 .b8 vyre_dynamic_shared[]` ([`DYNAMIC_SHARED_SYMBOL`];
//! `vyre_dynamic_shared_<i>` for kernel `i` of a module of several) and places its
//! buffers in it at the offsets [`layout`] gives; the backend reads the pool's size
//! from [`dynamic_shared_bytes`], opts the function in once when it loads it and
//! passes the size at every launch. A kernel within 48 KiB keeps its static arrays
//! (its PTX is what it was before the pool existed): ptxas reports the same registers
//! and no difference but the static `smem` line for the two forms of a 16 KiB
//! kernel, so the pool is used only where it is needed and every existing kernel,
//! snapshot and measurement stays as it was. Lanes keep static workgroup memory (up
//! to 48 KiB, their own pool in `lane`).
//!
//! The layout needs no alignment padding: buffers of 8-byte elements come first (in
//! binding order; their sizes are multiples of 8), then the others (in binding
//! order), each taking its size rounded up to a whole 4-byte word. The pool's size
//! is therefore the sum the validator checks against the device's limit
//! (`ir::validate`, `Rule::SharedMemoryOverLimit`), byte for byte.

use crate::ir::{Access, BufferDecl, Program};

/// Most bytes of static `.shared` memory one kernel may declare on every CUDA
/// device; a kernel whose workgroup buffers take more uses the dynamic pool.
pub const MAX_STATIC_SHARED_BYTES: u32 = 48 * 1024;

/// The dynamic shared-memory pool of a single-program kernel (kernel `i` of a
/// module of several: `vyre_dynamic_shared_<i>`).
pub const DYNAMIC_SHARED_SYMBOL: &str = "vyre_dynamic_shared";

/// The workgroup buffers of `program` in binding order (the order a kernel's and a
/// lane body's pools both start from).
pub fn workgroup_buffers(program: &Program) -> Vec<&BufferDecl> {
    let mut buffers: Vec<&BufferDecl> = program
        .buffers()
        .iter()
        .filter(|b| b.access == Access::Workgroup)
        .collect();
    buffers.sort_by_key(|b| b.binding);
    buffers
}

/// The workgroup buffers of `program` in binding order, each with its byte offset in
/// the pool, and the pool's size (the sum of their [`BufferDecl::padded_size_bytes`]). For a valid
/// program the size fits in a `u32` (the validator's limit is at most `!3`).
pub fn layout(program: &Program) -> (Vec<(&BufferDecl, u32)>, u32) {
    let mut placed: Vec<(&BufferDecl, u32)> = workgroup_buffers(program)
        .into_iter()
        .map(|decl| (decl, 0))
        .collect();
    let mut end: u64 = 0;
    for wide in [true, false] {
        for (decl, offset) in placed.iter_mut() {
            if (decl.elem.size_bytes() == 8) == wide {
                *offset = u32::try_from(end).unwrap_or(u32::MAX);
                end = end.saturating_add(decl.padded_size_bytes());
            }
        }
    }
    (placed, u32::try_from(end).unwrap_or(u32::MAX))
}

/// Bytes of dynamic shared memory every launch of `program`'s kernel passes (and
/// its function is opted in to): its pool's size when its workgroup buffers pass
/// [`MAX_STATIC_SHARED_BYTES`], 0 when they fit in static arrays. `program` is the
/// lowered program the kernel was written from (lowering adds workgroup buffers).
pub fn dynamic_shared_bytes(program: &Program) -> u32 {
    pool_at_launch(layout(program).1)
}

/// Dynamic shared memory of a kernel whose workgroup buffers take `pool` bytes (a
/// [`layout`]'s size): `pool` past [`MAX_STATIC_SHARED_BYTES`], 0 within it (static
/// arrays). The one place the rule is written, for the writer and the backend alike.
pub(super) fn pool_at_launch(pool: u32) -> u32 {
    if pool > MAX_STATIC_SHARED_BYTES {
        pool
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{BufferCount, ElemType};

    fn workgroup(name: &str, binding: u32, elem: ElemType, count: u32) -> BufferDecl {
        BufferDecl::new(
            name,
            binding,
            Access::Workgroup,
            elem,
            BufferCount::Static(count),
        )
    }

    /// Locks out a pool layout that misaligns an 8-byte buffer or overlaps two
    /// buffers: a `u8` buffer of 5 bytes, a `u64` buffer and a `u32` buffer get
    /// offsets 8-byte aligned for the `u64` one, 4-byte for the rest, disjoint, and
    /// the pool is the sum of the padded sizes (8 + 24 + 12 = 44 bytes). Negative
    /// control: after a 12-byte `u8` buffer, binding order would misalign the `u64`
    /// one; the layout puts it first.
    #[test]
    fn the_pool_places_wide_buffers_first_without_padding() {
        let program = Program::new(
            vec![
                workgroup("bytes", 0, ElemType::U8, 5),
                workgroup("wide", 1, ElemType::U64, 3),
                workgroup("words", 2, ElemType::U32, 3),
            ],
            [1, 1, 1],
            vec![],
        );
        let (placed, bytes) = layout(&program);
        let offsets: Vec<(&str, u32)> = placed.iter().map(|(d, o)| (&*d.name, *o)).collect();
        assert_eq!(offsets, [("bytes", 24), ("wide", 0), ("words", 32)]);
        assert_eq!(bytes, 44);
        assert_eq!(dynamic_shared_bytes(&program), 0, "44 bytes fit statically");

        // Negative control: in binding order the u64 buffer would follow 12 bytes
        // of `u8`s, at an offset that is no multiple of 8; the layout puts it first.
        let program = Program::new(
            vec![
                workgroup("bytes", 0, ElemType::U8, 12),
                workgroup("wide", 1, ElemType::U64, 1),
            ],
            [1, 1, 1],
            vec![],
        );
        let in_binding_order = program.buffers()[0].padded_size_bytes();
        assert_ne!(in_binding_order % 8, 0);
        let (placed, bytes) = layout(&program);
        assert_eq!((placed[0].1, placed[1].1, bytes), (8, 0, 20));
    }

    /// Locks out a kernel that uses the pool below the static limit (changing every
    /// existing kernel's PTX) or static arrays above it (ptxas refuses them): 48 KiB
    /// exactly is static, one word more is a pool of 48 KiB + 4.
    #[test]
    fn the_pool_starts_past_the_static_limit() {
        let words = MAX_STATIC_SHARED_BYTES / 4;
        let at = |count| {
            Program::new(
                vec![workgroup("pool", 0, ElemType::U32, count)],
                [1, 1, 1],
                vec![],
            )
        };
        assert_eq!(dynamic_shared_bytes(&at(words)), 0);
        assert_eq!(
            dynamic_shared_bytes(&at(words + 1)),
            MAX_STATIC_SHARED_BYTES + 4
        );
    }
}
