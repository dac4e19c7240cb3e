//! A device fault during an encode, alone in its binary: a trap loses the
//! process's CUDA context, so no other test may share it. Run on the GPU
//! machine (`cargo test --release -p vyre-tokenizer --test gpu_encode_fault --
//! --ignored`).

#[path = "support/device_batches.rs"]
mod device_batches;
mod oracle;
mod split_corpus;

use vyre_cuda::backend::{AnyBackend, BackendError, CudaBackend};
use vyre_tokenizer::{Encoding, ErrorKind, Tokenizer};

/// Locks out a kernel fault that is lost or misreported: with every `while`
/// loop capped at 4 iterations, a 1,000-byte piece traps in a BPE program, and
/// the encode is an `Err` of kind `Backend` starting `Fix:` whose source is the
/// backend's `KernelFault` naming that program (`bpe.`); (negative control)
/// before it, a text of whole tokens under the cap encodes.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_kernel_fault_surfaces_as_kernel_fault_naming_the_program() {
    let cpu = Tokenizer::for_encoding(Encoding::R50kBase).unwrap();
    let gpu = CudaBackend::acquire().expect("gpu test needs a CUDA device");
    let encoder = device_batches::capped_encoder(AnyBackend::Cuda(gpu), &cpu);
    let fine = "short pieces, each a token";
    assert_eq!(
        encoder.encode_batch(&[fine]).unwrap(),
        [cpu.encode_ordinary(fine)]
    );
    let error = encoder.encode_batch(&[&"x".repeat(1000)]).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Backend);
    assert!(error.message().starts_with("Fix:"), "{error}");
    let source = std::error::Error::source(&error).expect("the backend's error");
    let backend = source
        .downcast_ref::<BackendError>()
        .unwrap_or_else(|| panic!("source is not a BackendError: {source}"));
    assert!(
        matches!(backend, BackendError::KernelFault { .. }) && backend.to_string().contains("bpe."),
        "{backend:?}"
    );
}
