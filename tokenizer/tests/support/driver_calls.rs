//! The driver calls of one eager and one graph encode of a pre-tokenizer pipeline,
//! from the backend's test support (`thread_driver_calls`): what the example, the
//! bench and the GPU tests print and check. Include it with
//! `#[path = "…/support/driver_calls.rs"] mod driver_calls;`.
#![allow(dead_code)]

use vyre_tokenizer::pretokenize::pipeline::CudaPipeline;
use vyre_tokenizer::pretokenize::PretokenizeError;

/// The driver calls of one eager and one graph encode of `text` on this thread
/// (test support, like [`vyre_cuda::backend::thread_driver_calls`]): what the example,
/// the bench and the GPU tests print and check (eager: one synchronize per
/// dispatch, all but the last on an idle stream, and the text's one upload;
/// graph: one graph launch and one synchronize, nothing after it).
pub fn encode_driver_calls(
    pipeline: &mut CudaPipeline,
    text: &[u8],
) -> Result<[vyre_cuda::backend::DriverCallCounts; 2], PretokenizeError> {
    use vyre_cuda::backend::thread_driver_calls;
    let before = thread_driver_calls();
    pipeline.encode(text)?;
    let eager = thread_driver_calls().since(&before);
    let before = thread_driver_calls();
    pipeline.encode_graph(text)?;
    let graph = thread_driver_calls().since(&before);
    Ok([eager, graph])
}

/// One line describing [`encode_driver_calls`]' counts.
pub fn describe_driver_calls(calls: &[vyre_cuda::backend::DriverCallCounts; 2]) -> String {
    let [eager, graph] = calls;
    format!(
        "driver calls per encode: eager {} synchronizes (one blocking, the rest on streams already \
         idle), {} kernel launches, {} device waits (each step after the previous one), {} async \
         copies (the text up; the piece count and starts come through host-mapped memory); graph {} \
         graph launch, {} synchronize, {} async copies",
        eager.synchronizes,
        eager.launches,
        eager.stream_waits,
        eager.async_copies,
        graph.graph_launches,
        graph.synchronizes,
        graph.async_copies
    )
}
