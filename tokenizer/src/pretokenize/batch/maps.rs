//! Transition maps over eight states in IR: the device side of
//! [`rules`](super::rules) (`IDENTITY_MAP`, `compose`, `apply`), and the
//! workgroup's inclusive scan of maps, which the IR's own scans (sum, minimum,
//! maximum of `u32`) do not cover.
//!
//! A map's nibble `s` (bits `4s..4s + 4`) is the state it sends state `s` to,
//! so a map is also a selector for [`Expr::permute_bytes`]: composing `first`
//! then `then` spreads `then`'s nibbles into eight bytes, picks the bytes that
//! `first`'s nibbles name (two permutes, four states each) and packs the bytes
//! back into nibbles, about 16 instructions where eight three-bit lookups took
//! about 48 (see [`SLOT_BITS`] for the measurement). The
//! scan is Hillis–Steele over a shared array of `W` words: `log2 W` rounds of one
//! composition and two barriers, or one barrier where the caller lends a second
//! array of `W` words for the rounds to alternate between.

use vyre_cuda::ir::{BlockBuilder, Expr, ScalarType};

use super::ir::local;
use super::rules::{IDENTITY_MAP, MAX_STATES, SLOT_BITS};

/// States of a map.
pub(super) const STATES: u32 = MAX_STATES;

/// The identity map.
pub(super) const IDENTITY: u32 = IDENTITY_MAP;

/// The map sending every state to `state` (a `u32` below 8).
pub(super) fn constant(state: &Expr) -> Expr {
    state.clone() * 0x1111_1111u32
}

/// Whether `map` sends every state to one state (a `bool`): then it is the
/// whole of every composition that ends with it, whatever came before.
pub(super) fn is_constant(map: &Expr) -> Expr {
    constant(&(map.clone() & (STATES - 1))).equals(map.clone())
}

/// The state `map` sends `state` to.
pub(super) fn apply(map: &Expr, state: &Expr) -> Expr {
    (map.clone() >> (state.clone() * SLOT_BITS)) & (STATES - 1)
}

/// The `u64` whose low word is `low` and high word `high` (both `u32`): the
/// source of a byte permute, which PTX takes as the two words themselves.
fn pair(low: Expr, high: Expr) -> Expr {
    (high.cast(ScalarType::U64) << 32u32) | low.cast(ScalarType::U64)
}

/// Emits `first` then `then` (both maps) into variables named after `name`;
/// returns the composed map.
pub(super) fn compose(b: &mut BlockBuilder, name: &str, first: &Expr, then: &Expr) -> Expr {
    // `then`'s slots as bytes: slots 0..4 in the low word, 4..8 in the high one.
    // A permute doubles each byte of `then` (two slots), then the masks keep the
    // low slot of the first copy and the high slot of the second.
    let then_wide = b.let_(format!("{name}_then"), then.clone().cast(ScalarType::U64));
    let mut halves = Vec::new();
    for (half, doubling) in [("low", 0x1100u32), ("high", 0x3322)] {
        let doubled = b.let_(
            format!("{name}_doubled_{half}"),
            then_wide.clone().permute_bytes(doubling),
        );
        halves.push(b.let_(
            format!("{name}_bytes_{half}"),
            (doubled.clone() & 0x000F_000Fu32) | ((doubled >> 4u32) & 0x0F00_0F00u32),
        ));
    }
    let [low, high] = [halves[0].clone(), halves[1].clone()];
    let table = b.let_(format!("{name}_table"), pair(low, high));
    // Byte `k` of the picks is `then`'s state for `first`'s slot `k` (0..4, then
    // 4..8): each byte below 8, so a byte ORed with the next one shifted down by
    // a nibble holds two slots in its low byte.
    let mut packed = Vec::new();
    for (half, selector) in [("low", first.clone()), ("high", first.clone() >> 16u32)] {
        let picked = b.let_(
            format!("{name}_picked_{half}"),
            table.clone().permute_bytes(selector),
        );
        packed.push(b.let_(
            format!("{name}_packed_{half}"),
            picked.clone() | (picked >> 4u32),
        ));
    }
    let [low, high] = [packed[0].clone(), packed[1].clone()];
    // Bytes 0 and 2 of each packed word: slots 0..4, then 4..8.
    b.let_(name, pair(low, high).permute_bytes(0x6420u32))
}

/// Emits an inclusive scan of `value` (a map per thread) over the workgroup in
/// thread order through the shared array `scratch` of `workgroup_size` words,
/// where every thread has already stored its `value` at `scratch[t]` and a
/// barrier has passed since; returns this thread's prefix (the maps of threads
/// `0..=t` composed in order). Afterwards `scratch[t]` holds thread `t`'s
/// prefix for every `t`. Needs workgroup-uniform control flow.
///
/// With `partner` (another shared array of `workgroup_size` words whose
/// contents the caller does not need), the rounds alternate between the two
/// arrays, each reading the one the round before wrote: one barrier a round
/// instead of two (the barrier after a round's stores also orders its reads
/// before the next round's stores into the array they read), and one more
/// copy and barrier at the end when the round count is odd, so the prefixes
/// still end in `scratch`. Why: a block of 256 threads scanned its maps with
/// sixteen barriers, 16 of the 27 that `phases` reaches per warp in the
/// 1 KiB short-text kernel (Nsight Compute on an H100, 2026-12-05).
pub(super) fn scan_inclusive_stored(
    b: &mut BlockBuilder,
    prefix: &str,
    scratch: &str,
    partner: Option<&str>,
    workgroup_size: u32,
    value: Expr,
) -> Expr {
    let name = format!("{prefix}_scan");
    let own = b.let_mut(name.as_str(), value);
    // Without a partner every round reads and writes `scratch` (the exchange
    // below then changes nothing).
    let mut arrays = [scratch, partner.unwrap_or(scratch)];
    let mut distance = 1;
    while distance < workgroup_size {
        let [read_from, write_to] = arrays;
        let has = local().greater_equal(distance);
        let read = Expr::load(read_from, has.clone().select(local() - distance, 0u32));
        let earlier = b.let_(
            format!("{prefix}_earlier{distance}"),
            has.select(read, IDENTITY),
        );
        if partner.is_none() {
            // Every thread's read before any store over it.
            b.barrier();
        }
        let composed = compose(b, &format!("{prefix}_composed{distance}"), &earlier, &own);
        b.assign(name.as_str(), composed);
        b.store(write_to, local(), own.clone());
        b.barrier();
        arrays = [write_to, read_from];
        distance *= 2;
    }
    if arrays[0] != scratch {
        b.store(scratch, local(), own.clone());
        b.barrier();
    }
    own
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pretokenize::batch::rules;
    use vyre_cuda::backend::{AnyBackend, Binding, Dispatch};
    use vyre_cuda::ir::{Access, BufferCount, ElemType, Program};
    use vyre_cuda::DispatchConfig;

    /// A workgroup of `threads` that stores `input[t]` into `scratch`, scans
    /// it (with `partner` or without) and writes each thread's prefix to
    /// `output` and `scratch[t]` afterwards to `after`.
    fn scan_program(threads: u32, partner: bool) -> Program {
        let mut builder = Program::builder([threads, 1, 1])
            .entry_op_id("maps_scan_test")
            .buffer(
                "input",
                0,
                Access::ReadOnly,
                ElemType::U32,
                BufferCount::Runtime,
            )
            .buffer(
                "output",
                1,
                Access::WriteOnly,
                ElemType::U32,
                BufferCount::Runtime,
            )
            .buffer(
                "after",
                2,
                Access::WriteOnly,
                ElemType::U32,
                BufferCount::Runtime,
            )
            .buffer(
                "scratch",
                3,
                Access::Workgroup,
                ElemType::U32,
                BufferCount::Static(threads),
            );
        if partner {
            builder = builder.buffer(
                "partner",
                4,
                Access::Workgroup,
                ElemType::U32,
                BufferCount::Static(threads),
            );
        }
        builder
            .body(|b| {
                let value = b.let_("value", Expr::load("input", local()));
                b.store("scratch", local(), value.clone());
                b.barrier();
                let prefix = scan_inclusive_stored(
                    b,
                    "test",
                    "scratch",
                    partner.then_some("partner"),
                    threads,
                    value,
                );
                b.store("output", local(), prefix);
                b.store("after", local(), Expr::load("scratch", local()));
            })
            .build()
    }

    /// Locks out a scan of maps that loses or reorders a composition, or
    /// leaves the prefixes anywhere but `scratch` (the callers read it after
    /// the scan), when the rounds alternate between two arrays: for
    /// workgroups whose round counts are odd and even (32, 64, 256, 512
    /// threads) and random maps, both ways give every thread the maps of
    /// threads `0..=t` composed in order, as the host's `rules::compose`
    /// does, and leave them in `scratch`. And locks out a return to two
    /// barriers a round: with a partner the scan reaches `log2 W` barriers
    /// (one more for an odd count), without one `2 · log2 W` (the control).
    #[test]
    fn scans_with_a_partner_equal_the_host_with_one_barrier_a_round() {
        let backend = AnyBackend::reference();
        let mut random = crate::pretokenize::text::SplitMix64::new(0x9E37_79B9);
        for threads in [32u32, 64, 256, 512] {
            let maps: Vec<u32> = (0..threads)
                .map(|_| {
                    // Random maps over the eight states, one nibble each.
                    (0..MAX_STATES).fold(0, |map, slot| {
                        map | random.below(MAX_STATES) << (SLOT_BITS * slot)
                    })
                })
                .collect();
            let expected: Vec<u32> = maps
                .iter()
                .scan(IDENTITY, |prefix, &map| {
                    *prefix = rules::compose(*prefix, map);
                    Some(*prefix)
                })
                .collect();
            let rounds = threads.trailing_zeros() as usize;
            for partner in [true, false] {
                let program = scan_program(threads, partner);
                let barriers = program.to_string().matches("workgroup_barrier()").count();
                // One barrier before the scan, in the program itself.
                let expected_barriers = 1 + if partner {
                    rounds + rounds % 2
                } else {
                    2 * rounds
                };
                assert_eq!(
                    barriers, expected_barriers,
                    "{threads} threads, partner {partner}"
                );
                let kernel = backend
                    .compile(&program, &DispatchConfig::linear(1))
                    .expect("compiles");
                let input = backend.buffer_from(&maps).expect("input");
                let output = backend.buffer(u64::from(threads) * 4).expect("output");
                let after = backend.buffer(u64::from(threads) * 4).expect("after");
                let bindings = [
                    Binding::from(&input),
                    Binding::from(&output),
                    Binding::from(&after),
                ];
                backend
                    .run(Dispatch::new(&kernel, &bindings).workgroups([1, 1, 1]))
                    .expect("runs");
                assert_eq!(
                    backend.read::<u32>(&output).expect("read"),
                    expected,
                    "{threads} threads, partner {partner}"
                );
                assert_eq!(
                    backend.read::<u32>(&after).expect("read"),
                    expected,
                    "{threads} threads, partner {partner}: scratch afterwards"
                );
            }
        }
    }
}
