//! Dispatch phase probe (§5). Being written: see issue 4.
