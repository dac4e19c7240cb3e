//! Host-cost attribution harness (§6). Being written: see issue 5.
