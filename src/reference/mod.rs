//! The CPU reference interpreter (§3). Being written: see issue 2.
