//! CUDA backend (§4). Being written: see issue 3.
