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
//! composition and two barriers.

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
pub(super) fn scan_inclusive_stored(
    b: &mut BlockBuilder,
    prefix: &str,
    scratch: &str,
    workgroup_size: u32,
    value: Expr,
) -> Expr {
    let name = format!("{prefix}_scan");
    let own = b.let_mut(name.as_str(), value);
    let mut distance = 1;
    while distance < workgroup_size {
        let has = local().greater_equal(distance);
        let read = Expr::load(scratch, has.clone().select(local() - distance, 0u32));
        let earlier = b.let_(
            format!("{prefix}_earlier{distance}"),
            has.select(read, IDENTITY),
        );
        b.barrier();
        let composed = compose(b, &format!("{prefix}_composed{distance}"), &earlier, &own);
        b.assign(name.as_str(), composed);
        b.store(scratch, local(), own.clone());
        b.barrier();
        distance *= 2;
    }
    own
}
