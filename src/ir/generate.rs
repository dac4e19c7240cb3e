//! Seeded program generators for fuzzing and differential testing.
//! (Being written: see issue 2.)
