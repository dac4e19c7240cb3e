//! Small IR helpers the batch programs share: kind-set tests, guarded loads and
//! broadcasts.

use vyre_cuda::ir::{Axis, BlockBuilder, Expr, ScalarType};

use crate::pretokenize::unicode::KindSet;

/// `kind` (a `u32` kind code; 19 is `Kind::End`, 31 a byte inside a character)
/// is in `set`: one shift and one mask. A code past the last kind is in no set
/// unless the set holds `Kind::End` ([`super::rules::END`]) and the code is 19.
pub(super) fn in_set(kind: &Expr, set: KindSet) -> Expr {
    ((Expr::u32(set.bits()) >> kind.clone()) & 1u32).equals(1u32)
}

/// Bit `bit` of `value` is set.
pub(super) fn has_bit(value: &Expr, bit: u32) -> Expr {
    (value.clone() & bit).not_equals(0u32)
}

/// A `bool` as a `u32`, 0 or 1.
pub(super) fn as_u32(condition: Expr) -> Expr {
    condition.cast(ScalarType::U32)
}

/// Declares `name` = `buffer[index]` where `condition` holds and 0 elsewhere;
/// the load itself runs only where `condition` holds, so an index that is out
/// of range there is never read (the programs never rely on bounds checks).
pub(super) fn load_where(
    b: &mut BlockBuilder,
    name: &str,
    buffer: &str,
    index: Expr,
    condition: Expr,
) -> Expr {
    let value = b.let_mut(name, 0u32);
    b.if_(condition, |b| {
        b.assign(name, Expr::load(buffer, index));
    });
    value
}

/// This thread's index in its workgroup.
pub(super) fn local() -> Expr {
    Expr::local_id(Axis::X)
}
