//! GPU tests of host-mapped owned buffers (`CudaBackend::host_mapped_buffer`):
//! kernels store straight into host memory, the host reads it in place after the
//! synchronize, and reading or writing it while a dispatch or graph holds it is a
//! `Fix:` error; and of `Dispatch::after`, a dependent dispatch submitted at once
//! behind another and waited for with one blocking synchronize; and of `copy`
//! and `download`, the copy engine bringing device bytes into host memory.
//! Ignored by default; run on the GPU machine with `bash .gpu/run.sh gpu_`.

mod support;

use support::{triple_plus_one, triple_plus_one_program, words};
use vyre_cuda::backend::{
    thread_driver_calls, Binding, CudaBackend, DeviceBuffer, Dispatch, Timing,
};
use vyre_cuda::{DispatchConfig, ReadbackPolicy};

const WORDS: u32 = 1024;

fn setup(gpu: &CudaBackend) -> (vyre_cuda::backend::Kernel, DispatchConfig, Vec<u8>) {
    let config = DispatchConfig::linear(WORDS / 256).with_readback(ReadbackPolicy::None);
    let kernel = gpu.compile(&triple_plus_one_program(1), &config).unwrap();
    let input: Vec<u8> = (0..WORDS).flat_map(|i| (i * 7).to_le_bytes()).collect();
    (kernel, config, input)
}

/// The bindings of `buffers`, in order.
fn on<'a>(buffers: &[&'a DeviceBuffer]) -> Vec<Binding<'a>> {
    buffers
        .iter()
        .map(|&buffer| Binding::from(buffer))
        .collect()
}

fn expected() -> Vec<u32> {
    (0..WORDS).map(|i| triple_plus_one(i * 7, 1)).collect()
}

/// Locks out a host-mapped buffer whose kernel stores do not reach the host (or
/// need a copy): after one dispatch the host reads exactly the kernel's words in
/// place, with one synchronize and no async copy beyond the input's upload.
/// Negative control: the same dispatch into a device-memory buffer leaves nothing
/// readable in place (a `Fix:` error) and must be copied back.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_host_mapped_buffer_receives_kernel_stores_without_a_copy() {
    let gpu = support::backend();
    let (kernel, config, input) = setup(&gpu);
    let input_buffer = gpu.buffer_from(&input).unwrap();
    let mut mapped = gpu.host_mapped_buffer(4 * WORDS as u64).unwrap();
    assert!(mapped.is_host_mapped());
    assert_eq!(
        mapped.mapped_bytes().unwrap(),
        &vec![0u8; 4 * WORDS as usize][..]
    );
    // Warm the lane first.
    gpu.run(Dispatch::new(&kernel, &on(&[&input_buffer, &mapped])).config(&config))
        .unwrap();
    mapped.mapped_bytes_mut().unwrap().fill(0);
    let before = thread_driver_calls();
    gpu.run(Dispatch::new(&kernel, &on(&[&input_buffer, &mapped])).config(&config))
        .unwrap();
    let after = thread_driver_calls();
    assert_eq!(after.synchronizes - before.synchronizes, 1);
    assert_eq!(
        after.async_copies - before.async_copies,
        0,
        "no copy at all"
    );
    assert_eq!(words(mapped.mapped_bytes().unwrap()), expected());
    // The same bytes through the copy path (the mapped memory is addressable by DMA too).
    assert_eq!(gpu.read::<u32>(&mapped).unwrap(), expected());

    let mut device = gpu.buffer(4 * WORDS as u64).unwrap();
    assert!(!device.is_host_mapped());
    gpu.run(Dispatch::new(&kernel, &on(&[&input_buffer, &device])).config(&config))
        .unwrap();
    let error = device.mapped_bytes().unwrap_err();
    assert!(error.to_string().starts_with("Fix:"), "{error}");
    assert_eq!(gpu.read::<u32>(&device).unwrap(), expected());
}

/// Locks out torn reads and host writes racing the device: while a submitted
/// dispatch or a graph holds the buffer, reading or writing it in place is a
/// `Fix:` error; after `wait` (or once the graph is dropped) it works, and a
/// graph replay's stores are there. Host writes into the mapped memory are what a
/// kernel then reads in place.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_host_mapped_buffer_is_refused_while_held() {
    let gpu = support::backend();
    let (kernel, config, input) = setup(&gpu);
    let mut mapped_input = gpu.host_mapped_buffer(input.len() as u64).unwrap();
    mapped_input
        .mapped_bytes_mut()
        .unwrap()
        .copy_from_slice(&input);
    let mut out = gpu.host_mapped_buffer(4 * WORDS as u64).unwrap();

    let pending = gpu
        .submit(Dispatch::new(&kernel, &on(&[&mapped_input, &out])).config(&config))
        .unwrap();
    for error in [
        out.mapped_bytes().map(|_| ()).unwrap_err(),
        out.mapped_bytes_mut().map(|_| ()).unwrap_err(),
        mapped_input.mapped_bytes_mut().map(|_| ()).unwrap_err(),
    ] {
        assert!(error.to_string().starts_with("Fix:"), "{error}");
    }
    pending.wait().unwrap();
    assert_eq!(words(out.mapped_bytes().unwrap()), expected());

    out.mapped_bytes_mut().unwrap().fill(0);
    let mut graph = gpu
        .record(|rec| {
            rec.dispatch(Dispatch::new(&kernel, &on(&[&mapped_input, &out])).config(&config))?;
            Ok(())
        })
        .unwrap();
    graph.replay().unwrap();
    let error = out.mapped_bytes().unwrap_err();
    assert!(error.to_string().starts_with("Fix:"), "{error}");
    drop(graph);
    assert_eq!(words(out.mapped_bytes().unwrap()), expected());
}

/// Locks out a `MappedView` made while the device may still write the buffer, or
/// one that loses the buffer: taken while a submitted dispatch holds the buffer
/// it is a `Fix:` error that gives the buffer back (negative control: the same
/// call after `wait` succeeds), and so is one taken while a graph binds it; the
/// view reads the kernel's words through `&self`, from another thread too, and
/// `into_buffer` gives back a buffer a dispatch binds again, whose next stores
/// the next view reads; a device-memory buffer is refused, unchanged.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_mapped_view_reads_in_place_once_nothing_holds_the_buffer() {
    let gpu = support::backend();
    let (kernel, config, input) = setup(&gpu);
    let input_buffer = gpu.buffer_from(&input).unwrap();
    let out = gpu.host_mapped_buffer(4 * WORDS as u64).unwrap();
    let pending = gpu
        .submit(Dispatch::new(&kernel, &on(&[&input_buffer, &out])).config(&config))
        .unwrap();
    let (out, error) = out.into_mapped_view().unwrap_err();
    assert!(error.to_string().starts_with("Fix:"), "{error}");
    pending.wait().unwrap();
    let view = out.into_mapped_view().unwrap();
    assert_eq!(view.len(), 4 * WORDS as u64);
    assert_eq!(words(view.bytes()), expected());
    std::thread::scope(|scope| {
        let view = &view;
        let other = scope.spawn(move || words(view.bytes()));
        assert_eq!(other.join().unwrap(), expected());
    });

    let mut out = view.into_buffer();
    out.mapped_bytes_mut().unwrap().fill(0);
    let graph = gpu
        .record(|rec| {
            rec.dispatch(Dispatch::new(&kernel, &on(&[&input_buffer, &out])).config(&config))?;
            Ok(())
        })
        .unwrap();
    let (out, error) = out.into_mapped_view().unwrap_err();
    assert!(error.to_string().starts_with("Fix:"), "{error}");
    drop(graph);
    gpu.run(Dispatch::new(&kernel, &on(&[&input_buffer, &out])).config(&config))
        .unwrap();
    assert_eq!(words(out.into_mapped_view().unwrap().bytes()), expected());

    let device = gpu.buffer(16).unwrap();
    let (device, error) = device.into_mapped_view().unwrap_err();
    assert!(error.to_string().starts_with("Fix:"), "{error}");
    assert_eq!(device.len(), 16);
}

/// Locks out a graph's owner that cannot read a host-mapped output in place
/// between replays (the pre-tokenizer's piece starts: a copy would cost as much as
/// its kernels), and a view that lets anyone else write under it:
/// `mapped_bytes_beside(&graph)` sees the replay's stores while `mapped_bytes`
/// refuses; (negative controls) a second graph that binds the buffer, or a
/// dispatch in flight, makes it a `Fix:` error, and a graph that does not bind
/// the buffer subtracts nothing.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_host_mapped_buffer_is_read_beside_the_graph_that_binds_it() {
    let gpu = support::backend();
    let (kernel, config, input) = setup(&gpu);
    let input_buffer = gpu.buffer_from(&input).unwrap();
    let mut out = gpu.host_mapped_buffer(4 * WORDS as u64).unwrap();
    let record = |out: &vyre_cuda::backend::DeviceBuffer| {
        gpu.record(|rec| {
            rec.dispatch(Dispatch::new(&kernel, &on(&[&input_buffer, out])).config(&config))?;
            Ok(())
        })
        .unwrap()
    };
    let mut graph = record(&out);
    graph.replay().unwrap();
    assert!(out.mapped_bytes().is_err());
    assert_eq!(words(out.mapped_bytes_beside(&graph).unwrap()), expected());

    let other_buffer = gpu.host_mapped_buffer(4 * WORDS as u64).unwrap();
    let unrelated = record(&other_buffer);
    let error = out.mapped_bytes_beside(&unrelated).unwrap_err();
    assert!(error.to_string().starts_with("Fix:"), "{error}");

    let second = record(&out);
    let error = out.mapped_bytes_beside(&graph).unwrap_err();
    assert!(error.to_string().starts_with("Fix:"), "{error}");
    drop(second);

    let pending = gpu
        .submit(Dispatch::new(&kernel, &on(&[&input_buffer, &out])).config(&config))
        .unwrap();
    let error = out.mapped_bytes_beside(&graph).unwrap_err();
    assert!(error.to_string().starts_with("Fix:"), "{error}");
    pending.wait().unwrap();
    assert_eq!(words(out.mapped_bytes_beside(&graph).unwrap()), expected());
}

/// Locks out a graph whose host-mapped input cannot be set between replays
/// without a copy node (a short text the kernel reads in place), and a writable
/// view that anything else could reach: `mapped_bytes_mut_beside(&mut graph)`
/// sets the input, and each replay computes from the words written before it
/// (three rounds of different words, so a replay that read stale input fails);
/// `mapped_bytes_mut` refuses while the graph lives; (negative controls) a
/// second graph that binds the input, or a dispatch in flight over it, makes it
/// a `Fix:` error.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_host_mapped_input_is_written_beside_the_graph_that_binds_it() {
    let gpu = support::backend();
    let (kernel, config, _) = setup(&gpu);
    let mut input = gpu.host_mapped_buffer(4 * WORDS as u64).unwrap();
    let mut out = gpu.host_mapped_buffer(4 * WORDS as u64).unwrap();
    let record = |input: &DeviceBuffer, out: &DeviceBuffer| {
        gpu.record(|rec| {
            rec.dispatch(Dispatch::new(&kernel, &on(&[input, out])).config(&config))?;
            Ok(())
        })
        .unwrap()
    };
    let mut graph = record(&input, &out);
    assert!(input.mapped_bytes_mut().is_err());
    for round in 1..=3u32 {
        let words_in: Vec<u32> = (0..WORDS).map(|i| i * 7 + round).collect();
        input
            .mapped_bytes_mut_beside(&mut graph)
            .unwrap()
            .copy_from_slice(bytemuck::cast_slice(&words_in));
        graph.replay().unwrap();
        let expected: Vec<u32> = words_in.iter().map(|&w| triple_plus_one(w, 1)).collect();
        assert_eq!(words(out.mapped_bytes_beside(&graph).unwrap()), expected);
    }

    let second = record(&input, &out);
    let error = input.mapped_bytes_mut_beside(&mut graph).unwrap_err();
    assert!(error.to_string().starts_with("Fix:"), "{error}");
    drop(second);

    let other = gpu.host_mapped_buffer(4 * WORDS as u64).unwrap();
    let pending = gpu
        .submit(Dispatch::new(&kernel, &on(&[&input, &other])).config(&config))
        .unwrap();
    let error = input.mapped_bytes_mut_beside(&mut graph).unwrap_err();
    assert!(error.to_string().starts_with("Fix:"), "{error}");
    pending.wait().unwrap();
    assert!(input.mapped_bytes_mut_beside(&mut graph).is_ok());
}

const CHAIN_WORDS: u32 = 1 << 20;
const ROUNDS: u32 = 500;

/// Locks out a chained submission that is not ordered on the device, or that
/// still waits on the host: the second dispatch reads what the first wrote
/// (every word right), its device window starts after the first one's ends,
/// submitting both costs no synchronize (the waits: one blocking, one idle), and
/// the second waits on the device once although two rules order it (it names the
/// first, and it reads what the first writes).
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_submit_after_orders_a_dependent_dispatch_on_the_device() {
    let gpu = support::backend();
    let config = DispatchConfig::linear(CHAIN_WORDS / 256).with_readback(ReadbackPolicy::None);
    let slow = gpu
        .compile(&triple_plus_one_program(ROUNDS), &config)
        .unwrap();
    let fast = gpu.compile(&triple_plus_one_program(1), &config).unwrap();
    let input: Vec<u8> = (0..CHAIN_WORDS).flat_map(|i| i.to_le_bytes()).collect();
    let source = gpu.buffer_from(&input).unwrap();
    let middle = gpu.buffer(4 * CHAIN_WORDS as u64).unwrap();
    let mut last = gpu.host_mapped_buffer(4 * CHAIN_WORDS as u64).unwrap();
    let expected: Vec<u32> = (0..CHAIN_WORDS)
        .map(|i| triple_plus_one(i, ROUNDS + 1))
        .collect();
    let clock = gpu.device_clock().unwrap();
    for round in 0..3 {
        let before = thread_driver_calls();
        let first = gpu
            .submit(
                Dispatch::new(&slow, &on(&[&source, &middle]))
                    .config(&config)
                    .timing(Timing::EventWindow),
            )
            .unwrap();
        let second = gpu
            .submit(
                Dispatch::new(&fast, &on(&[&middle, &last]))
                    .config(&config)
                    .timing(Timing::EventWindow)
                    .after(&first),
            )
            .unwrap();
        let submitted = thread_driver_calls();
        assert_eq!(
            submitted.synchronizes - before.synchronizes,
            0,
            "submitting waits for nothing"
        );
        // The second dispatch both names the first and reads what it writes: one
        // device wait, not one per ordering rule (the order book and the explicit
        // predecessor are one mechanism).
        assert_eq!(
            submitted.stream_waits - before.stream_waits,
            1,
            "round {round}: the dependent dispatch waits on the device exactly once"
        );
        let (_, second_spans) = second.wait_spans(&clock).unwrap();
        let (_, first_spans) = first.wait_spans(&clock).unwrap();
        assert!(
            second_spans.window_start_ns >= first_spans.window_end_ns,
            "round {round}: the second dispatch started at {} ns, before the first ended at {} ns",
            second_spans.window_start_ns,
            first_spans.window_end_ns
        );
        assert!(
            words(last.mapped_bytes().unwrap()) == expected,
            "round {round}: the second dispatch read unfinished words"
        );
        last.mapped_bytes_mut().unwrap().fill(0);
    }
}

/// Words of the slow writer's buffers.
const SMALL_WORDS: u32 = 256;

/// The slow writer's rounds per word.
const SLOW_ROUNDS: u32 = 400_000;

/// A slow writer and a fast reader of 256 words, one workgroup each (so the device
/// has room to run a disjoint submission beside the writer; the writer's threads
/// loop long enough, about 1 ms, to be caught): `source` → `middle` by `slow`,
/// `middle` → `last` (host-mapped) by `fast`, and `other_source` → `other_last`
/// disjoint from both; `expected` is what `last` holds after the two.
struct SlowWriter {
    gpu: CudaBackend,
    config: DispatchConfig,
    slow: vyre_cuda::backend::Kernel,
    fast: vyre_cuda::backend::Kernel,
    source: DeviceBuffer,
    middle: DeviceBuffer,
    other_source: DeviceBuffer,
    other_last: DeviceBuffer,
    last: DeviceBuffer,
    expected: Vec<u32>,
}

impl SlowWriter {
    fn new() -> Self {
        let gpu = support::backend();
        let config = DispatchConfig::linear(1).with_readback(ReadbackPolicy::None);
        let slow = gpu
            .compile(&triple_plus_one_program(SLOW_ROUNDS), &config)
            .unwrap();
        let fast = gpu.compile(&triple_plus_one_program(1), &config).unwrap();
        let input: Vec<u8> = (0..SMALL_WORDS).flat_map(|i| i.to_le_bytes()).collect();
        let bytes = 4 * SMALL_WORDS as u64;
        SlowWriter {
            source: gpu.buffer_from(&input).unwrap(),
            middle: gpu.buffer(bytes).unwrap(),
            other_source: gpu.buffer_from(&input).unwrap(),
            other_last: gpu.buffer(bytes).unwrap(),
            last: gpu.host_mapped_buffer(bytes).unwrap(),
            expected: (0..SMALL_WORDS)
                .map(|i| triple_plus_one(i, SLOW_ROUNDS + 1))
                .collect(),
            gpu,
            config,
            slow,
            fast,
        }
    }

    /// Submits `kernel` over `buffers` with an event window, after `after` if given.
    fn submit(
        &self,
        kernel: &vyre_cuda::backend::Kernel,
        buffers: &[&DeviceBuffer],
        after: Option<&vyre_cuda::backend::PendingDispatch>,
    ) -> vyre_cuda::backend::PendingDispatch {
        let bound = on(buffers);
        let request = Dispatch::new(kernel, &bound)
            .config(&self.config)
            .timing(Timing::EventWindow);
        match after {
            Some(previous) => self.gpu.submit(request.after(previous)),
            None => self.gpu.submit(request),
        }
        .unwrap()
    }
}

/// Locks out two submissions in flight that run at once over memory one of them
/// writes (found under compute-sanitizer: two pending increments of one buffer left
/// it one short): a submission reading the buffer the previous one writes, with no
/// explicit `Dispatch::after`, starts on the device only after the writer ended
/// and reads its finished words. Negative control: the same submission over
/// disjoint buffers starts while the writer still runs, so the order seen above is
/// the order book's doing, not the device's habit.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_submissions_sharing_written_memory_run_in_order() {
    let mut fixture = SlowWriter::new();
    let clock = fixture.gpu.device_clock().unwrap();
    for round in 0..3 {
        let f = &fixture;
        let writer = f.submit(&f.slow, &[&f.source, &f.middle], None);
        let reader = f.submit(&f.fast, &[&f.middle, &f.last], None);
        let disjoint = f.submit(&f.fast, &[&f.other_source, &f.other_last], None);
        let (_, reader_spans) = reader.wait_spans(&clock).unwrap();
        let (_, disjoint_spans) = disjoint.wait_spans(&clock).unwrap();
        let (_, writer_spans) = writer.wait_spans(&clock).unwrap();
        assert!(
            reader_spans.window_start_ns >= writer_spans.window_end_ns,
            "round {round}: the reader started at {} ns, before the writer ended at {} ns",
            reader_spans.window_start_ns,
            writer_spans.window_end_ns
        );
        assert!(
            words(fixture.last.mapped_bytes().unwrap()) == fixture.expected,
            "round {round}: the reader read unfinished words"
        );
        assert!(
            disjoint_spans.window_start_ns < writer_spans.window_end_ns,
            "round {round}: negative control: a submission over disjoint memory waited for the writer \
             ({} ns vs {} ns)",
            disjoint_spans.window_start_ns,
            writer_spans.window_end_ns
        );
        fixture.last.mapped_bytes_mut().unwrap().fill(0);
    }
}

/// Locks out a chain that waits on the device again for what its named
/// predecessor already waits for, and a pruning of that wait that lets a step run
/// before a writer it depends on: `A` writes `middle` slowly, `B` (over other
/// buffers) runs after `A` by name, `C` reads `middle` and runs after `B` by name.
/// `C` waits on the device once (on `B`, which waited on `A`), starts after `A`
/// ended and reads `A`'s finished words. Negative control: when `B` is not
/// ordered after `A`, the same `C` waits twice (on `B`, and on `A` because it reads
/// what `A` writes), so the single wait above is the pruning's doing, and only
/// where the predecessor implies it.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_a_chain_step_waits_once_yet_after_every_writer() {
    let mut fixture = SlowWriter::new();
    let clock = fixture.gpu.device_clock().unwrap();
    for (round, named) in [true, false, true].into_iter().enumerate() {
        let f = &fixture;
        let a = f.submit(&f.slow, &[&f.source, &f.middle], None);
        let b = f.submit(
            &f.fast,
            &[&f.other_source, &f.other_last],
            named.then_some(&a),
        );
        let before = thread_driver_calls();
        let c = f.submit(&f.fast, &[&f.middle, &f.last], Some(&b));
        let waits = thread_driver_calls().stream_waits - before.stream_waits;
        let (_, c_spans) = c.wait_spans(&clock).unwrap();
        let (_, b_spans) = b.wait_spans(&clock).unwrap();
        let (_, a_spans) = a.wait_spans(&clock).unwrap();
        assert_eq!(
            waits,
            if named { 1 } else { 2 },
            "round {round}: B named A: {named}"
        );
        assert!(
            c_spans.window_start_ns >= a_spans.window_end_ns
                && c_spans.window_start_ns >= b_spans.window_end_ns,
            "round {round}: C started at {} ns, before A ({}) or B ({}) ended",
            c_spans.window_start_ns,
            a_spans.window_end_ns,
            b_spans.window_end_ns
        );
        assert!(
            words(fixture.last.mapped_bytes().unwrap()) == fixture.expected,
            "round {round}: C read unfinished words"
        );
        fixture.last.mapped_bytes_mut().unwrap().fill(0);
    }
}

/// Locks out a buffer copy that overtakes the submitted dispatch writing its source
/// (each runs on its own stream, so only the order book orders them) or that does
/// not reach host-mapped memory: a dispatch into device memory is submitted and not
/// waited for, and `copy` into a host-mapped buffer then finds the kernel's words
/// there, by one async copy and one synchronize; copied on into a second device
/// buffer (mapped → device) and read back, they are the same. Negative control:
/// the words read before the dispatch ran are not the kernel's.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_copy_lands_after_the_dispatch_that_writes_its_source() {
    let gpu = support::backend();
    let (kernel, config, input) = setup(&gpu);
    let input_buffer = gpu.buffer_from(&input).unwrap();
    let device = gpu.buffer(4 * WORDS as u64).unwrap();
    let mut mapped = gpu.host_mapped_buffer(4 * WORDS as u64).unwrap();
    let again = gpu.buffer(4 * WORDS as u64).unwrap();
    let untouched = words(&gpu.read::<u8>(&device).unwrap());
    assert_ne!(untouched, expected(), "negative control");
    for _ in 0..3 {
        mapped.mapped_bytes_mut().unwrap().fill(0);
        let pending = gpu
            .submit(Dispatch::new(&kernel, &on(&[&input_buffer, &device])).config(&config))
            .unwrap();
        let before = thread_driver_calls();
        gpu.copy(&device, 0, &mapped, 0, 4 * WORDS as u64).unwrap();
        let after = thread_driver_calls();
        assert_eq!(after.async_copies - before.async_copies, 1);
        assert_eq!(after.synchronizes - before.synchronizes, 1);
        assert_eq!(words(mapped.mapped_bytes().unwrap()), expected());
        pending.wait().unwrap();
        gpu.copy(&mapped, 8, &again, 0, 4 * WORDS as u64 - 8)
            .unwrap();
        assert_eq!(
            words(&gpu.read::<u8>(&again).unwrap())[..WORDS as usize - 2],
            expected()[2..]
        );
    }
}

/// Locks out blocking transfers that overtake a submission still in flight over
/// the same buffer (each runs on its own stream, so only the order book orders
/// them; the reference backend, which runs a submission at once, never could):
/// with the slow writer submitted and not waited for, `read` of the buffer it
/// writes returns its finished words, and an `upload` into that buffer lands after
/// the writer's stores, so the uploaded bytes are what remain. Negative control:
/// the buffer holds other words before the writer runs (zeros, then the upload's),
/// so stale bytes would fail both checks.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_blocking_transfers_wait_for_the_submission_they_conflict_with() {
    let fixture = SlowWriter::new();
    let f = &fixture;
    let finished: Vec<u32> = (0..SMALL_WORDS)
        .map(|i| triple_plus_one(i, SLOW_ROUNDS))
        .collect();
    let uploaded: Vec<u32> = (0..SMALL_WORDS).map(|i| i ^ 0x5a5a_5a5a).collect();
    let zeros = vec![0u32; SMALL_WORDS as usize];
    for round in 0..3 {
        f.gpu.upload(&f.middle, &zeros).unwrap();
        let before: Vec<u32> = f.gpu.read(&f.middle).unwrap();
        assert_ne!(before, finished, "round {round}: negative control");
        let writer = f.submit(&f.slow, &[&f.source, &f.middle], None);
        let read: Vec<u32> = f.gpu.read(&f.middle).unwrap();
        assert!(
            read == finished,
            "round {round}: the read ran before the writer ended"
        );
        writer.wait().unwrap();

        let writer = f.submit(&f.slow, &[&f.source, &f.middle], None);
        f.gpu.upload(&f.middle, &uploaded).unwrap();
        writer.wait().unwrap();
        let after: Vec<u32> = f.gpu.read(&f.middle).unwrap();
        assert_ne!(uploaded, finished, "negative control");
        assert!(
            after == uploaded,
            "round {round}: the upload landed before the writer's stores"
        );
    }
}

/// Locks out a download into caller pinned memory that overtakes the submitted
/// dispatch writing its source, lands at the wrong place, or writes under a
/// dispatch still uploading from the destination: with the writer submitted and
/// not waited for, `download` brings exactly the kernel's words (by one async copy
/// and one synchronize) to the offset asked for and leaves the bytes before it;
/// a range past either end is a `Fix:` error, and so is a destination that a
/// dispatch in flight still reads (it can take the bytes once that dispatch is
/// waited for). The reference backend answers the range errors alike and then
/// refuses the pinned buffer as another backend's. Negative control: the words
/// read before the dispatch ran are not the kernel's.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_download_lands_in_pinned_memory_after_the_dispatch_that_writes_its_source() {
    let gpu = support::backend();
    let (kernel, config, input) = setup(&gpu);
    let input_buffer = gpu.buffer_from(&input).unwrap();
    let device = gpu.buffer(4 * WORDS as u64).unwrap();
    let bytes = 4 * WORDS as u64;
    let mut pinned = gpu.pinned_buffer(bytes as usize + 8).unwrap();
    let untouched = words(&gpu.read::<u8>(&device).unwrap());
    assert_ne!(untouched, expected(), "negative control");
    for round in 0..3u8 {
        pinned.as_mut_slice().unwrap().fill(round);
        let pending = gpu
            .submit(Dispatch::new(&kernel, &on(&[&input_buffer, &device])).config(&config))
            .unwrap();
        let before = thread_driver_calls();
        gpu.download(&device, 0, &mut pinned, 8, bytes).unwrap();
        let calls = thread_driver_calls().since(&before);
        assert_eq!(
            (calls.async_copies, calls.synchronizes),
            (1, 1),
            "{calls:?}"
        );
        assert_eq!(pinned.as_slice()[..8], [round; 8], "round {round}");
        assert_eq!(words(&pinned.as_slice()[8..]), expected(), "round {round}");
        pending.wait().unwrap();
    }
    for (from_offset, to_offset, len) in [(4, 0, bytes), (0, 16, bytes), (u64::MAX - 3, 0, 8)] {
        let message = gpu
            .download(&device, from_offset, &mut pinned, to_offset, len)
            .unwrap_err()
            .to_string();
        assert!(
            message.starts_with("Fix:") && message.contains("offset"),
            "{message}"
        );
    }
    let pending = gpu
        .submit(Dispatch::new(&kernel, &[pinned.binding(), Binding::from(&device)]).config(&config))
        .unwrap();
    let message = gpu
        .download(&device, 0, &mut pinned, 0, 4)
        .unwrap_err()
        .to_string();
    assert!(
        message.starts_with("Fix:") && message.contains("in flight"),
        "{message}"
    );
    pending.wait().unwrap();
    gpu.download(&device, 0, &mut pinned, 0, 4).unwrap();
    let reference = vyre_cuda::backend::AnyBackend::reference();
    let on_reference = reference.buffer(bytes).unwrap();
    let message = reference
        .download(&on_reference, 4, &mut pinned, 0, bytes)
        .unwrap_err()
        .to_string();
    assert!(
        message.starts_with("Fix:") && message.contains("offset"),
        "{message}"
    );
    let message = reference
        .download(&on_reference, 0, &mut pinned, 0, 4)
        .unwrap_err()
        .to_string();
    assert!(
        message.starts_with("Fix:") && message.contains("another backend"),
        "{message}"
    );
}
