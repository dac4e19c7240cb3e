//! Helpers shared by the GPU test binaries.
#![allow(dead_code)]

use vyre_cuda::backend::{CudaBackend, ResidentBuffer};
use vyre_cuda::ir::Program;
use vyre_cuda::DispatchConfig;

/// The backend of device 0; GPU tests are ignored unless run on a CUDA machine,
/// where a missing device is a real failure.
pub fn backend() -> CudaBackend {
    CudaBackend::acquire().unwrap_or_else(|e| panic!("gpu test needs a CUDA device: {e}"))
}

/// A resident buffer holding a copy of each input, in order.
pub fn resident_copies(gpu: &CudaBackend, inputs: &[Vec<u8>]) -> Vec<ResidentBuffer> {
    inputs
        .iter()
        .map(|v| {
            let h = gpu.allocate_resident(v.len() as u64).unwrap();
            gpu.upload_resident(&h, v).unwrap();
            h
        })
        .collect()
}

/// Outputs of the reference interpreter for the same request.
pub fn reference(program: &Program, inputs: &[Vec<u8>], config: &DispatchConfig) -> Vec<Vec<u8>> {
    let borrowed: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
    vyre_cuda::reference::run(program, &borrowed, config)
        .unwrap_or_else(|e| panic!("reference failed: {e}\n{program}"))
}

/// u32 words of a byte buffer.
pub fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Bytes of u32 words.
pub fn bytes(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}
