//! Transition maps over eight states of three bits in IR: the device side of
//! [`rules`](super::rules) (`IDENTITY_MAP`, `compose`, `apply`), and the
//! workgroup's inclusive scan of maps, which the IR's own scans (sum, minimum,
//! maximum of `u32`) do not cover.
//!
//! A map's bits `3s..3s + 3` are the state it sends state `s` to; composing
//! two is eight three-bit lookups (about 56 integer operations). The scan is
//! Hillis–Steele over a shared array of `W` words: `log2 W` rounds of one
//! composition and two barriers.

use vyre_cuda::ir::{BlockBuilder, Expr};

use super::ir::local;
use super::rules::{IDENTITY_MAP, MAX_STATES, STATE_BITS};

/// States of a map.
pub(super) const STATES: u32 = MAX_STATES;

/// The identity map.
pub(super) const IDENTITY: u32 = IDENTITY_MAP;

/// The map sending every state to `state` (a `u32` below 8).
pub(super) fn constant(state: &Expr) -> Expr {
    state.clone() * 0x24_9249u32
}

/// The state `map` sends `state` to.
pub(super) fn apply(map: &Expr, state: &Expr) -> Expr {
    (map.clone() >> (state.clone() * STATE_BITS)) & (STATES - 1)
}

/// `first` then `then` (both maps; pass variables: each is read eight times).
pub(super) fn compose(first: &Expr, then: &Expr) -> Expr {
    let mut map = Expr::u32(0);
    for state in 0..STATES {
        let middle = (first.clone() >> (state * STATE_BITS)) & (STATES - 1);
        map = map | (apply(then, &middle) << (state * STATE_BITS));
    }
    map
}

/// Emits an inclusive scan of `value` (a map per thread) over the workgroup in
/// thread order through the shared array `scratch` of `workgroup_size` words;
/// returns this thread's prefix (the maps of threads `0..=t` composed in order).
/// Afterwards `scratch[t]` holds thread `t`'s prefix for every `t`. Needs
/// workgroup-uniform control flow.
pub(super) fn scan_inclusive(
    b: &mut BlockBuilder,
    prefix: &str,
    scratch: &str,
    workgroup_size: u32,
    value: Expr,
) -> Expr {
    let name = format!("{prefix}_scan");
    let own = b.let_mut(name.as_str(), value);
    b.store(scratch, local(), own.clone());
    b.barrier();
    let mut distance = 1;
    while distance < workgroup_size {
        let has = local().greater_equal(distance);
        let read = Expr::load(scratch, has.clone().select(local() - distance, 0u32));
        let earlier = b.let_(
            format!("{prefix}_earlier{distance}"),
            has.select(read, IDENTITY),
        );
        b.barrier();
        b.assign(name.as_str(), compose(&earlier, &own));
        b.store(scratch, local(), own.clone());
        b.barrier();
        distance *= 2;
    }
    own
}
