//! The GPU half of [`Backend::Gpu`](crate::Backend::Gpu): GPT-2's pre-tokenizer
//! on a CUDA device through [`CudaPipeline`], the BPE after it on the CPU.
//!
//! # Why this module exists, and what it does not do yet
//!
//! The split is where a byte-level BPE tokenizer spends most of its CPU time
//! (the pre-tokenizer module's docs give the figures), and vyre-cuda runs
//! GPT-2's split on the device in two dispatches (measured on the H200: about
//! 56 µs per 256 KiB encode as one graph). The merge loop has no GPU program yet,
//! so a GPU encode is: text up, piece starts back through host-mapped memory,
//! BPE on the calling thread. Only GPT-2's pattern (r50k_base, p50k_base) has a
//! GPU program; cl100k and o200k have none.
//!
//! A [`CudaPipeline`] is built for one text length (its buffers are sized for
//! it, and a padded text would split differently), so this module keeps the few
//! most recently used pipelines by length, each built on first use, and never
//! caches one for a text over [`CACHED_PIPELINE_MAX_BYTES`] (its device buffers
//! are several bytes per text byte). An encode takes its pipeline out of the
//! cache while it runs, so threads encoding texts of other lengths do not wait
//! for it. Every use of vyre-cuda's dispatch API by the tokenizer is here and in
//! the pipeline, so a port to another dispatch API touches only these two.

use std::sync::Mutex;

use vyre_cuda::backend::CudaBackend;

use crate::error::{ErrorKind, TokenizerError};
use crate::pretokenize::pipeline::CudaPipeline;
use crate::pretokenize::programs::{programs, Programs};

/// Pipelines kept for reuse (most recently used first).
pub const CACHED_PIPELINES: usize = 4;

/// Largest text length whose pipeline is kept after the encode (16 MiB).
pub const CACHED_PIPELINE_MAX_BYTES: usize = 16 << 20;

/// The device, the programs and the pipeline cache.
pub(crate) struct GpuSplitter {
    backend: CudaBackend,
    programs: Programs,
    /// (text length, pipeline), most recently used first.
    pipelines: Mutex<Vec<(usize, CudaPipeline)>>,
}

impl std::fmt::Debug for GpuSplitter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuSplitter")
            .field("device", &self.backend.caps().name)
            .finish_non_exhaustive()
    }
}

impl GpuSplitter {
    /// Device 0, or an `Err` saying why there is none.
    pub(crate) fn acquire() -> Result<Self, TokenizerError> {
        let backend = CudaBackend::acquire().map_err(|error| {
            TokenizerError::new(
                ErrorKind::Backend,
                format!(
                    "Fix: Backend::Gpu needs a CUDA device, and none answered ({error}); \
                     use Backend::Auto or Backend::Cpu on this machine"
                ),
            )
            .with_source(error)
        })?;
        Ok(GpuSplitter {
            backend,
            programs: programs(),
            pipelines: Mutex::new(Vec::new()),
        })
    }

    /// The device's name.
    pub(crate) fn device_name(&self) -> &str {
        &self.backend.caps().name
    }

    /// Appends the piece starts of `text` (at most
    /// [`MAX_TEXT_BYTES`](crate::pretokenize::MAX_TEXT_BYTES) bytes) to `starts`.
    pub(crate) fn split_into(
        &self,
        text: &[u8],
        starts: &mut Vec<u32>,
    ) -> Result<(), TokenizerError> {
        if text.is_empty() {
            return Ok(());
        }
        let cached = {
            let mut pipelines = self
                .pipelines
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            pipelines
                .iter()
                .position(|(len, _)| *len == text.len())
                .map(|index| pipelines.remove(index).1)
        };
        let mut pipeline = match cached {
            Some(pipeline) => pipeline,
            None => CudaPipeline::new(&self.backend, &self.programs, text.len())?,
        };
        pipeline.encode(text)?;
        starts.extend_from_slice(pipeline.piece_starts());
        if text.len() <= CACHED_PIPELINE_MAX_BYTES {
            let mut pipelines = self
                .pipelines
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            pipelines.insert(0, (text.len(), pipeline));
            pipelines.truncate(CACHED_PIPELINES);
        }
        Ok(())
    }
}
