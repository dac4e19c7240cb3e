//! Lowering (§2). Being written: see issue 2.
