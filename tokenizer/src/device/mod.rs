//! The whole encode on a device: text up, token ids down.
//!
//! [`pipeline::DeviceEncoder`] runs the BPE half of an encode as vyre-cuda
//! programs ([`programs`]) over the resident vocabulary ([`vocabulary`]) on a
//! CUDA device or the reference interpreter, through one `AnyBackend`.

pub mod pipeline;
pub mod programs;
pub mod vocabulary;

pub use pipeline::{ChunkLimits, ChunkTimings, DeviceEncoder, EncodeCounts};
pub use programs::Geometry;
pub use vocabulary::DeviceVocabulary;
