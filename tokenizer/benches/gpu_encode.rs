//! The whole encode on the GPU against the host's copy bound and tiktoken-rs,
//! every figure measured in the same run (cl100k_base):
//!
//! - a 64 MiB batch of documents of 1–16 KiB (the three generated shapes in
//!   turn), from the caller's `&str`s to each document's ids in the caller's
//!   hands, against the copy bound of the same bytes measured here (the text up
//!   plus the ids down, from pinned memory and from ordinary pageable memory),
//!   against tiktoken-rs on all of the host's cores, and per chunk size (8, 4,
//!   6, 12 and 16 MiB in rotated rounds, through `encode_batch_ids`), with
//!   each chunk's size and timeline (when it was staged, submitted, found done
//!   and handed out, from the call's start; how long the staging itself took)
//!   and its ids' copy to the host; the copy bound's ids down also by
//!   `CudaBackend::copy` into host-mapped memory, the way the encoder brings a
//!   large chunk's ids up;
//! - what one 262,144-byte document's eager wait holds besides its kernel,
//!   each alone: the text's upload from pinned memory (with a one-thread
//!   kernel; and that kernel alone, its input on the device) and a
//!   cooperative launch of the encode's workgroup count doing one grid sync
//!   (and a plain launch of as many);
//! - one 262,144-byte document, eager (into a reused vector and into a reused
//!   `BatchIds`) and as a graph (its ids into a new vector,
//!   into one vector reused, as the eager rows' `wait_into`, and read where
//!   the graph left them, `EncodeGraph::encode_in_place`; in two rounds the
//!   ids of the `BatchIds` and in-place rows read by the host after every
//!   encode, as a caller who uses them does, against after the last only,
//!   after every encode then flushed from the CPU's caches, and after every
//!   encode then demoted from the reading core's caches to the shared one),
//!   with each kernel step's time (`stage`, the split's `classify` and `phases`, the
//!   BPE steps; a fused kernel's steps by its own clock, from counted
//!   encodes; eager again with the resident grid's `compact` in a group
//!   per 1 KiB block instead of the batch's cap, eager after an encode of
//!   another length (its slot graph rewritten first), and eager as the cooperative
//!   dispatch instead of a replay of the graph the chunk's slot keeps,
//!   `DeviceEncoder::with_fused_graphs(false)`; and three rounds of eager,
//!   graph-into-a-reused-vector, graph-read-in-place and
//!   into-a-reused-`BatchIds` encodes with the text gathered while the
//!   kernel runs and read across PCIe as each piece is ready
//!   (`DeviceEncoder::with_text_fed(true)`, the default) against the text
//!   gathered before the launch and against the text brought up by the copy
//!   engine before the kernel (`DeviceEncoder::with_text_copy_engine_from`),
//!   all with three hand-out helpers, with the staging's (and its gather's),
//!   the hand-out's and the kernel's times);
//!   one 1,024-byte document as a graph (ids into a new vector
//!   and read in place) and eager, through the
//!   short-text kernel and with every step its own dispatch (where each one's
//!   time goes), with tiktoken-rs's time beside, and three alternating rounds
//!   of it in a batch of one with the fused kernels' bounds checks off (the
//!   default) and on, each with the
//!   short-text kernel's steps by their own clock.
//!   `VYRE_BENCH_SINGLE_ONLY=1`
//!   runs this part alone (after the launch floor);
//! - the host's copies alone at the batch's sizes, the floor the pipeline
//!   overlaps with the kernels: the 64 MiB gather from the caller's strings
//!   into host-mapped pinned memory, and the ids' hand-out from host-mapped
//!   memory into reused and into new vectors, each on the copy pool the
//!   pipeline uses and on threads spawned per copy (what the pipeline did
//!   before the pool), beside `encode_batch_into` with reused vectors (the
//!   headline's `encode_batch` allocates new ones);
//! - device memory per input byte;
//! - one chunk of 1 to 16 MiB with the split's bulk blocks and with its
//!   default ones, which places the bulk split's threshold
//!   (`VYRE_BENCH_BULK=0` leaves it out);
//! - one chunk of 1 to 16 MiB through step kernels without bounds checks
//!   (`BoundsChecks::Nowhere`) and with them (the default keeps them there),
//!   in turn, the ids checked (`VYRE_BENCH_STEP_CHECKS=0` leaves it out);
//! - the 64 MiB batch again at other workgroup shapes (the split's threads and
//!   bytes per thread, the BPE steps' threads), each step's kernel time in the
//!   first chunk: the split's steps and the merge each run near 1 ms per 16 MiB
//!   chunk at the default shape (16–18 GB/s, H200, 2026-12-01), with 16,384
//!   blocks of 1 KiB per chunk whose fixed costs (a ticket, a look-back,
//!   eighteen barriers) a larger block spreads over more bytes. `VYRE_BENCH_SHAPES=0`
//!   leaves it out;
//! - the 64 MiB batch again with `stage` and `compact` capped to fewer
//!   workgroups (`Geometry::stage_workgroups`, `compact_workgroups`), the
//!   default first (and last) and each row's time as a ratio to it: both steps
//!   wait on PCIe (the text read from and the ids written to host-mapped
//!   memory) while their grids hold the SMs that the other chunks' steps need.
//!   `VYRE_BENCH_CAPS=0` leaves it out;
//! - one 1 KiB and one 4 KiB document eager through the short-text kernel in
//!   workgroups of other shapes (`Geometry::short_text`: threads and the
//!   split's bytes per thread), each with the kernel's own time: the kernel is
//!   one workgroup, so its time is its warps' serial depth, which more threads
//!   shorten. `VYRE_BENCH_SHORT=0` leaves it out;
//! - one document of 1 KiB to 2 MiB eager through the resident-grid kernel
//!   (every step in one cooperative dispatch) and with every step its own
//!   dispatch, and up to 4 KiB through the short-text kernel.
//!   `VYRE_BENCH_RESIDENT=0` leaves it out;
//! - 1 KiB and 256 KiB of each shape eager with the fused kernels' `merge`
//!   keeping ranges of other lengths in registers
//!   (`Geometry::register_merge_bytes` and `ShortText::register_merge_bytes`:
//!   longer ones merge in global scratch,
//!   or up to `Geometry::fused_merge_slab_bytes` in a slab of workgroup memory),
//!   each with the kernels' own time, then the 64 MiB batch (its steps on
//!   their own) with the `merge` step's slab at other lengths
//!   (`Geometry::merge_slab_bytes`: the pieces of at most that many bytes
//!   merge in workgroup memory; the default first and last, each row's time
//!   as a ratio to the first). `VYRE_BENCH_SLAB=0` leaves both out;
//!   `VYRE_BENCH_MERGE_REGISTERS_ONLY=1` runs the fused kernels' part alone
//!   (after the launch floor);
//! - 64 KiB and 256 KiB of each shape through the resident-grid kernel in
//!   other workgroup shapes and grid caps. `VYRE_BENCH_RESIDENT_SHAPES=0`
//!   leaves it out;
//! - the merge registers' texts with long pieces cut into chunks of other lengths
//!   (`Geometry::chunk_bytes`: one thread merges each chunk, `long` checks
//!   and repairs their boundaries), then the 64 MiB batch at the same and
//!   shorter chunk lengths. `VYRE_BENCH_CHUNK=0` leaves both out.
//!
//! bpe-openai is not linked here (its tables would keep this binary from the
//! GPU machine): its figures come from the `encode` bench. Without a CUDA
//! device it says so and measures nothing. `VYRE_BENCH_QUICK=1` takes fewer
//! rounds. Run: `cargo bench -p vyre-tokenizer --bench gpu_encode`.

#[path = "../tests/support/peers.rs"]
mod peers;

use std::time::Instant;

use peers::{median_seconds as median, Peer};
use vyre_cuda::backend::floor::{RawFloor, ReadbackSweep};
use vyre_cuda::backend::host_cache::demote_from_core_caches;
use vyre_cuda::backend::{AnyBackend, Binding, CudaBackend, Dispatch, Timings};
use vyre_cuda::ir::{Access, Axis, BufferCount, ElemType, Expr, Program};
use vyre_cuda::{DispatchConfig, ReadbackPolicy};
use vyre_tokenizer::device::fused::SHORT_TEXT_BYTES;
use vyre_tokenizer::device::pipeline::{CHUNK_TEXT_BYTES, HAND_OUT_HELPERS};
use vyre_tokenizer::device::programs::MAX_REGISTER_MERGE_BYTES;
use vyre_tokenizer::device::{
    host_copy, BatchIds, BoundsChecks, BulkSplit, ChunkLimits, ChunkTimings, DeviceEncoder,
    EncodeGraph, Geometry, ShortText,
};
use vyre_tokenizer::occupancy::Occupancy;
use vyre_tokenizer::pretokenize::text::{generate, Shape, SplitMix64};
use vyre_tokenizer::{Backend, Encoding, Tokenizer};

const BATCH_BYTES: usize = 64 << 20;

/// Documents of 1–16 KiB, the shapes in turn, until `bytes`.
fn documents(bytes: usize) -> Vec<String> {
    let mut random = SplitMix64::new(0x64);
    let mut texts = Vec::new();
    let mut total = 0;
    while total < bytes {
        let len = (1024 + random.below(15 << 10) as usize)
            .min(bytes - total)
            .max(1);
        let shape = Shape::ALL[texts.len() % 3];
        let text = String::from_utf8(generate(shape, len, texts.len() as u64)).expect("UTF-8");
        total += text.len();
        texts.push(text);
    }
    texts
}

/// What a resident-grid encode of `text_bytes` bytes waits for besides its
/// kernel, each alone (median of `rounds`): the text's upload from pinned
/// memory with a one-thread kernel after it, and the same dispatch with its
/// input already on the device (their difference is the DMA); a cooperative
/// launch of as many workgroups as the encode's grid (one per 1 KiB split
/// block, at most what the device holds) that do nothing but one grid sync,
/// the same doing eight (what each further sync costs: the resident kernel
/// ends every step with one), and a plain launch of as many that do nothing
/// (their difference is the cooperative launch and its sync). Why: on the H200 (2026-12-05) one 256 KiB
/// eager encode waited 107.5 µs for a 74.2 µs kernel, and the upload with its
/// kernel took 18.5 µs against 8.8 for launch + synchronize.
fn print_wait_floors(gpu: &CudaBackend, text_bytes: usize, rounds: usize) {
    let upload = pinned_upload_seconds(gpu, text_bytes, rounds);
    let resident = gpu.buffer(text_bytes as u64).expect("device buffer");
    let resident_input = dispatch_seconds(
        gpu,
        &touch_program(),
        &[Binding::Buffer(&resident), Binding::Zeroed(4)],
        1,
        rounds,
    );
    let grid_sync = first_thread_writes(1);
    let config = DispatchConfig::linear(1).with_readback(ReadbackPolicy::None);
    let blocks = text_bytes.div_ceil(Geometry::default().split.block_bytes() as usize) as u64;
    let coresident = gpu
        .compile(&grid_sync, &config)
        .expect("compile a grid sync")
        .max_coresident_workgroups()
        .unwrap_or(1);
    let workgroups = blocks.min(coresident).max(1) as u32;
    let flags = [Binding::Zeroed(4)];
    let cooperative = dispatch_seconds(gpu, &grid_sync, &flags, workgroups, rounds);
    let eight = dispatch_seconds(gpu, &first_thread_writes(8), &flags, workgroups, rounds);
    let plain = dispatch_seconds(gpu, &first_thread_writes(0), &flags, workgroups, rounds);
    println!(
        "
what a {text_bytes}-byte resident encode waits for besides its kernel, each alone (median of {rounds}): the text's upload from pinned memory and a one-thread kernel {:.1} µs (the same with the text already on the device {:.1}); a cooperative launch of {workgroups} workgroups doing one grid sync {:.1} µs, eight {:.1} µs (each sync after the first {:.2} µs; the resident kernel ends each of its steps with one) (a plain launch of as many doing nothing {:.1})",
        upload * 1e6,
        resident_input * 1e6,
        cooperative * 1e6,
        eight * 1e6,
        (eight - cooperative) / 7.0 * 1e6,
        plain * 1e6
    );
}

/// Seconds of one dispatch of `program` over `workgroups` workgroups with
/// `bindings`, median of `rounds` (compiled once, nothing read back).
fn dispatch_seconds(
    gpu: &CudaBackend,
    program: &Program,
    bindings: &[Binding<'_>],
    workgroups: u32,
    rounds: usize,
) -> f64 {
    // The config sets the grid: `Dispatch::config` replaces an earlier
    // `workgroups` (the first run of the wait floors launched one workgroup).
    let config = DispatchConfig::linear(workgroups).with_readback(ReadbackPolicy::None);
    let kernel = gpu.compile(program, &config).expect("compile");
    median(rounds, || {
        gpu.run(Dispatch::new(&kernel, bindings).config(&config))
            .expect("dispatch")
    })
    .0
}

/// Seconds of one dispatch that binds `bytes` of pinned memory (one DMA up)
/// and runs [`touch_program`] after it, median of `rounds`.
fn pinned_upload_seconds(gpu: &CudaBackend, bytes: usize, rounds: usize) -> f64 {
    let mut pinned = gpu.pinned_buffer(bytes).expect("pinned buffer");
    pinned.as_mut_slice().expect("idle").fill(b'x');
    let bindings = [Binding::Pinned(&pinned), Binding::Zeroed(4)];
    dispatch_seconds(gpu, &touch_program(), &bindings, 1, rounds)
}

/// Workgroups of 256 threads, after `grid_syncs` grid syncs; thread 0 of the
/// first then writes a word (so the dispatch has an output).
fn first_thread_writes(grid_syncs: u32) -> Program {
    Program::builder([256, 1, 1])
        .buffer(
            "done",
            0,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Static(1),
        )
        .body(|b| {
            for _ in 0..grid_syncs {
                b.grid_sync();
            }
            b.if_(Expr::global_id(Axis::X).equals(0u32), |b| {
                b.store("done", 0u32, 1u32);
            });
        })
        .build()
}

/// A kernel that reads one byte of its input: what the pinned upload and the
/// raw floor dispatch.
fn touch_program() -> Program {
    Program::builder([32, 1, 1])
        .buffer(
            "input",
            0,
            Access::ReadOnly,
            ElemType::U8,
            BufferCount::Runtime,
        )
        .buffer(
            "first",
            1,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Static(1),
        )
        .body(|b| {
            b.if_(Expr::global_id(Axis::X).equals(0u32), |b| {
                b.store("first", 0u32, Expr::load("input", 0u32));
            });
        })
        .build()
}

fn gb_per_s(bytes: usize, seconds: f64) -> f64 {
    bytes as f64 / seconds / 1e9
}

/// The host's copy bound for `text` bytes up and `ids` bytes down, through
/// vyre-cuda's public API: from pinned memory (a dispatch binding a pinned
/// buffer: one DMA up; `ReadbackSweep`'s one DMA down, and its kernel writing
/// host-mapped memory, the route the ids take) and from pageable memory
/// (`upload` and `read_into` of ordinary vectors).
struct CopyBound {
    pinned_up: f64,
    pinned_down: f64,
    mapped_down: f64,
    /// `CudaBackend::copy` from device memory into host-mapped memory (how the
    /// encoder brings a large chunk's ids to the host).
    copied_down: f64,
    pageable_up: f64,
    pageable_down: f64,
}

impl CopyBound {
    fn measure(gpu: &CudaBackend, text: usize, ids: usize, rounds: usize) -> CopyBound {
        let pinned_up = pinned_upload_seconds(gpu, text, rounds);
        let ids = ids.next_multiple_of(4).max(4);
        let mut sweep = ReadbackSweep::new(gpu, ids).expect("readback sweep");
        let (pinned_down, _) = median(rounds, || sweep.copy_sweep(ids).expect("copy"));
        let (mapped_down, _) = median(rounds, || sweep.mapped_write_sweep(ids).expect("mapped"));
        let from = gpu.buffer(ids as u64).expect("device buffer");
        let into = gpu
            .host_mapped_buffer(ids as u64)
            .expect("host-mapped buffer");
        let (copied_down, _) = median(rounds, || {
            gpu.copy(&from, 0, &into, 0, ids as u64).expect("copy")
        });
        // Large enough for the text going up and for the ids coming down (cl100k
        // gives about half a token per byte: 4 bytes of ids per 2 bytes of text).
        let device = gpu.buffer(text.max(ids) as u64).expect("device buffer");
        let host = vec![b'y'; text];
        let (pageable_up, _) = median(rounds, || gpu.upload(&device, &host).expect("upload"));
        let mut back = vec![0u8; ids];
        let (pageable_down, _) =
            median(rounds, || gpu.read_into(&device, &mut back).expect("read"));
        CopyBound {
            pinned_up,
            pinned_down,
            mapped_down,
            copied_down,
            pageable_up,
            pageable_down,
        }
    }
}

fn main() {
    let quick = std::env::var_os("VYRE_BENCH_QUICK").is_some();
    let rounds = if quick { 3 } else { 9 };
    let small_rounds = if quick { 200 } else { 1000 };
    let gpu = match CudaBackend::acquire() {
        Ok(gpu) => gpu,
        Err(error) => {
            println!("gpu_encode: no CUDA device ({error}); nothing to measure");
            return;
        }
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "gpu_encode: {} ({threads} host threads), cl100k_base",
        gpu.caps().name
    );
    let cpu = Tokenizer::for_encoding(Encoding::Cl100kBase).expect("cl100k");
    let tokenizer = cpu
        .clone()
        .with_backend(Backend::Gpu)
        .expect("the GPU backend");
    let encoder = tokenizer.device_encoder().expect("device encoder");

    // The floor of one dispatch, for scale.
    let mut floor = RawFloor::new(&gpu, &touch_program(), [1, 1, 1]).expect("raw floor");
    // `launch_sync` answers a count, not a time: the median's seconds are the figure.
    let (launch_sync_seconds, _) = median(rounds * 50, || floor.launch_sync().expect("floor"));
    println!(
        "launch + synchronize (raw driver): {:.2} µs",
        launch_sync_seconds * 1e6
    );

    let tiktoken = Peer::Tiktoken(tiktoken_rs::cl100k_base_singleton());
    // Every step its own dispatch.
    let step_by_step = encoder_with_limits(
        &gpu,
        &cpu,
        ChunkLimits {
            short_text_bytes: 0,
            resident_text_bytes: 0,
            ..ChunkLimits::default()
        },
    );
    if std::env::var_os("VYRE_BENCH_SINGLE_ONLY").is_some() {
        single_documents(&gpu, &cpu, encoder, &tiktoken, &step_by_step, small_rounds);
        return;
    }
    if std::env::var_os("VYRE_BENCH_MERGE_REGISTERS_ONLY").is_some() {
        merge_register_lengths(&gpu, &cpu, small_rounds);
        return;
    }

    // 1. The 64 MiB batch.
    let texts = documents(BATCH_BYTES);
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let bytes: usize = refs.iter().map(|text| text.len()).sum();
    let expected = cpu.encode_batch(&refs);
    let got = encoder.encode_batch(&refs).expect("device batch");
    assert!(
        got == expected,
        "the device's ids differ from the CPU encoder's on the batch"
    );
    let tokens: usize = expected.iter().map(Vec::len).sum();
    println!(
        "\n64 MiB batch: {} documents, {bytes} bytes, {tokens} tokens; ids identical to the CPU encoder",
        texts.len()
    );
    let copy = CopyBound::measure(&gpu, bytes, tokens * 4, rounds);
    let pinned = copy.pinned_up + copy.mapped_down.min(copy.pinned_down);
    let pageable = copy.pageable_up + copy.pageable_down;
    println!(
        "  copy bound, pinned: text up {:.1} GB/s, ids down {:.1} GB/s by DMA ({:.1} GB/s as a kernel writing mapped memory, {:.1} GB/s by `copy` into mapped memory) → {:.2} ms, {:.2} GB/s of text",
        gb_per_s(bytes, copy.pinned_up),
        gb_per_s(tokens * 4, copy.pinned_down),
        gb_per_s(tokens * 4, copy.mapped_down),
        gb_per_s(tokens * 4, copy.copied_down),
        pinned * 1e3,
        gb_per_s(bytes, pinned)
    );
    println!(
        "  copy bound, pageable: text up {:.1} GB/s, ids down {:.1} GB/s → {:.2} ms, {:.2} GB/s of text",
        gb_per_s(bytes, copy.pageable_up),
        gb_per_s(tokens * 4, copy.pageable_down),
        pageable * 1e3,
        gb_per_s(bytes, pageable)
    );
    let (ours, _) = median(rounds, || {
        encoder.encode_batch(&refs).expect("device batch")
    });
    let (peer, peer_ids) = median(rounds.min(3), || tiktoken.encode_chunks(&refs));
    assert!(peer_ids == expected, "tiktoken-rs differs on the batch");
    println!(
        "  vyre-tokenizer on the GPU: {:.2} ms, {:.2} GB/s (target ≥ 10): {:.2} × the pinned copy bound, {:.2} × the pageable one",
        ours * 1e3,
        gb_per_s(bytes, ours),
        pinned / ours,
        pageable / ours
    );
    println!(
        "  tiktoken-rs on {threads} threads: {:.1} ms, {:.3} GB/s: the GPU {:.1} × faster (bpe-openai: see the encode bench)",
        peer * 1e3,
        gb_per_s(bytes, peer),
        peer / ours
    );
    let mut timings = Vec::new();
    let mut results = vec![Vec::new(); texts.len()];
    let byte_refs: Vec<&[u8]> = refs.iter().map(|text| text.as_bytes()).collect();
    let (reused, chunk_timings) = median(rounds, || {
        encoder
            .encode_batch_into(&byte_refs, &mut results)
            .expect("device batch")
    });
    println!(
        "  encode_batch_into, reused result vectors: {:.2} ms, {:.2} GB/s",
        reused * 1e3,
        gb_per_s(bytes, reused)
    );
    timings.extend(chunk_timings);
    // The same batch into one reused flat result: the copy engine brings each
    // chunk's ids into its pinned memory, the host copies none.
    let mut flat = BatchIds::new();
    encoder
        .encode_batch_ids(&byte_refs, &mut flat)
        .expect("device batch");
    assert!(
        flat.iter().eq(expected.iter().map(Vec::as_slice)),
        "the flat batch ids differ from the CPU encoder's"
    );
    let (flat_seconds, flat_timings) = median(rounds, || {
        encoder
            .encode_batch_ids(&byte_refs, &mut flat)
            .expect("device batch")
    });
    println!(
        "  encode_batch_ids, one reused BatchIds (no host copy of the ids): {:.2} ms, {:.2} GB/s (target ≥ 10): {:.2} × the pinned copy bound, the GPU {:.1} × tiktoken-rs",
        flat_seconds * 1e3,
        gb_per_s(bytes, flat_seconds),
        pinned / flat_seconds,
        peer / flat_seconds
    );
    print_timeline("flat ", &flat_timings);
    let chunk_bytes = chunk_sizes(encoder, &byte_refs);
    host_copies(&gpu, &byte_refs, &expected, rounds);
    for (index, chunk) in timings.iter().enumerate() {
        println!(
            "    chunk {index}: {:.2} MiB, wall {:.2} ms, host staging and submitting {:.2} ms (staging {:.2}), handing out ids {:.2} ms (their copy {:.2}), kernels {:.2} ms ({})",
            chunk_bytes.get(index).copied().unwrap_or(0) as f64 / (1 << 20) as f64,
            chunk.wall_ns as f64 / 1e6,
            chunk.submit_ns as f64 / 1e6,
            chunk.staged_ns as f64 / 1e6,
            chunk.scatter_ns as f64 / 1e6,
            chunk.copy_ns as f64 / 1e6,
            chunk.kernel_ns() as f64 / 1e6,
            chunk.kernel_line()
        );
    }
    print_timeline("", &timings);
    chunk_sizes_rotated(&gpu, &cpu, &byte_refs, rounds);

    // 2. One 256 KiB document, eager and as a graph; one 1 KiB document.
    single_documents(&gpu, &cpu, encoder, &tiktoken, &step_by_step, small_rounds);

    // 3. Memory.
    let (device, host) = encoder.chunk_buffer_bytes(16 << 20, 4096);
    println!(
        "\ndevice memory per input byte (a 16 MiB chunk's buffers): {:.1} bytes on the device, {:.1} bytes of host-mapped memory; the resident vocabulary {:.2} MiB",
        device as f64 / (16 << 20) as f64,
        host as f64 / (16 << 20) as f64,
        encoder.vocabulary_bytes() as f64 / (1 << 20) as f64
    );

    // 4. The bulk split by chunk size.
    if !skipped("VYRE_BENCH_BULK") {
        bulk_split_by_chunk_size(&gpu, &cpu, rounds);
    }
    if !skipped("VYRE_BENCH_STEP_CHECKS") {
        step_checks_by_chunk_size(&gpu, &cpu, rounds);
    }

    // 5. Workgroup shapes.
    let batch = Batch {
        gpu: &gpu,
        cpu: &cpu,
        texts: &byte_refs,
        expected: &expected,
        bytes,
        rounds,
    };
    if !skipped("VYRE_BENCH_SHAPES") {
        println!("\nthe 64 MiB batch at other workgroup shapes (chunk 0's kernels, median round):");
        for geometry in workgroup_shapes() {
            // The split a 16 MiB chunk runs (the bulk split's, where it takes one).
            let bulk = geometry
                .bulk_split
                .filter(|bulk| bulk.from_bytes <= ChunkLimits::default().text_bytes);
            let split = bulk.map_or(geometry.split, |bulk| bulk.split);
            let label = format!(
                "split {} threads × {} bytes{}, BPE {} threads, {:?}",
                split.workgroup_size,
                split.bytes_per_thread,
                if bulk.is_some() { " (bulk)" } else { "" },
                geometry.workgroup_size,
                geometry.occupancy
            );
            batch.row(geometry, &label, &mut results, None);
        }
    }

    // 6. Stage and compact grid caps.
    if !skipped("VYRE_BENCH_CAPS") {
        println!(
            "\nthe 64 MiB batch with `stage` and `compact` capped (both wait on PCIe, host-mapped text in and ids out; chunk 0's kernels, median round):"
        );
        batch.rows_against_the_first(&mut results, grid_caps(), |geometry| {
            format!(
                "stage ≤ {} workgroups{}, compact ≤ {}",
                geometry.stage_workgroups,
                if geometry.stage_workgroups == UNCAPPED_STAGE {
                    " (uncapped)"
                } else {
                    ""
                },
                geometry.compact_workgroups
            )
        });
    }

    // 7. The short-text kernel's workgroup, and the resident grid by size.
    if !skipped("VYRE_BENCH_SHORT") {
        short_text_shapes(&gpu, &cpu, small_rounds);
    }
    if !skipped("VYRE_BENCH_RESIDENT") {
        resident_by_size(&gpu, &cpu, &step_by_step, small_rounds / 4);
    }

    // 8. The fused kernels' merge registers (short texts) and the merge
    // slab's length (the batch's steps on their own).
    if !skipped("VYRE_BENCH_SLAB") {
        merge_register_lengths(&gpu, &cpu, small_rounds);
        println!("\nthe 64 MiB batch with the merge slab at other lengths (chunk 0's kernels, median round):");
        // At 256 KiB a short text waits on its longest chains, but the batch's
        // `merge` (0.39–0.51 ms of an 8 MiB chunk's ~1.1 ms of kernels on the
        // H200, 2026-12-03) has every SM full of pieces, and a piece of up to
        // the slab's length reads and writes its parts in workgroup memory
        // instead of global scratch. Slabs of 4 · S bytes per thread (48 KiB at
        // 48 bytes and 256 threads) take the device's opt-in workgroup memory.
        // First run (H200, 2026-12-03, ratio to the default's time): none
        // 1.056, 6 bytes 1.037, 16 0.986, 24 1.027, 32 1.092, 48 1.128, the
        // default again 1.018; chunk 0's `merge` 406 µs at 12 bytes, 444–470 at
        // none and 6, 440–450 at 16 and 24, 545 and 585 at 32 and 48. The
        // default stays.
        let rows = around_the_default(&[0, 6, 16, 24, 32, 48], |geometry, bytes| {
            geometry.merge_slab_bytes = bytes
        });
        batch.rows_against_the_first(&mut results, rows, |geometry| {
            format!("{:>2} bytes", geometry.merge_slab_bytes)
        });
    }

    // 9. The resident grid's shapes.
    if !skipped("VYRE_BENCH_RESIDENT_SHAPES") {
        resident_shapes(&gpu, &cpu, small_rounds);
    }

    // 10. The long pieces' chunk length, for short texts and for the batch.
    if !skipped("VYRE_BENCH_CHUNK") {
        merge_chunk_lengths(&gpu, &cpu, small_rounds);
        println!("\nthe 64 MiB batch with long pieces cut into chunks of other lengths (chunk 0's kernels, median round):");
        // The batch's pieces are short (its CJK runs end at punctuation within
        // about 100 bytes), so at the default every piece merges whole, one
        // thread each, a chain of about two merges per ideograph. Chunks
        // shorter than those pieces merge their parts in parallel and leave
        // `long` to check and repair the boundaries; at 256 KiB (a text whose
        // `merge` waits on its longest chains) that did not pay, and these rows
        // say whether it pays where every SM is full. First run (H200,
        // 2026-12-03, ratio to the default's time): 24 bytes 0.975, 48 0.966,
        // 96 1.102, 192 0.976, the default again 0.958; `long` 73–91 µs of
        // chunk 0 at 24–48 bytes against 5 at the default. The default stays.
        let rows = around_the_default(&[24, 48, 96, 192], |geometry, bytes| {
            geometry.chunk_bytes = bytes
        });
        batch.rows_against_the_first(&mut results, rows, |geometry| {
            format!("{:>3} bytes", geometry.chunk_bytes)
        });
    }
}

/// 1 KiB (the short-text kernel) and 256 KiB (the resident grid) of each
/// shape eager with the fused kernels' `merge` keeping ranges of other lengths
/// in registers, and then the longer ones in a slab of workgroup memory, the
/// default first (16 bytes of registers in the short-text kernel, none in the
/// resident grid; every other row gives both kernels its lengths): a short
/// text waits on its longest piece's chain of merges, a piece longer than the
/// registers (and the slab) takes the scratch arrays, and every register
/// costs every merge its instructions, where a slab's merge loads its keys
/// from workgroup memory (the rows with fewer registers or none before a slab
/// ask which costs a short range less).
fn merge_register_lengths(gpu: &CudaBackend, cpu: &Tokenizer, rounds: usize) {
    let default = Geometry::default();
    let slab = |fused_merge_slab_bytes: u32| match fused_merge_slab_bytes {
        0 => "no slab".to_owned(),
        bytes => format!("then a {bytes}-byte slab"),
    };
    let then_slab = |register_merge_bytes: u32, fused_merge_slab_bytes: u32| {
        (
            format!(
                "{register_merge_bytes:>2} bytes, {}",
                slab(fused_merge_slab_bytes)
            ),
            Geometry {
                register_merge_bytes,
                fused_merge_slab_bytes,
                short_text: ShortText {
                    register_merge_bytes,
                    ..default.short_text
                },
                ..default
            },
        )
    };
    let default_row = (
        format!(
            "{} bytes in the short-text kernel, {} in the resident grid, {}",
            default.short_text.register_merge_bytes,
            default.register_merge_bytes,
            slab(default.fused_merge_slab_bytes)
        ),
        default,
    );
    geometry_sweep(
        gpu,
        cpu,
        rounds,
        "the fused kernels' merge registers at other lengths",
        [
            default_row,
            then_slab(16, 20),
            then_slab(0, 20),
            then_slab(16, 0),
            then_slab(20, 0),
            then_slab(12, 0),
            then_slab(0, 0),
            then_slab(0, 24),
            then_slab(0, MAX_REGISTER_MERGE_BYTES),
            then_slab(8, 20),
            then_slab(12, 20),
        ],
    );
}

/// The same texts as [`merge_register_lengths`] with long pieces cut into chunks
/// of other lengths (`Geometry::chunk_bytes`), the default first: one thread
/// merges a chunk, each merge a pass over the chunk's 16-byte blocks, so a
/// chunk's serial depth grows with the square of its length, while shorter
/// chunks leave more boundaries for `long` to check and repair. A run of CJK
/// ideographs is one long piece (256 KiB of CJK spent 137–141 of its 219–225
/// µs of kernels in `merge` on the H200, 2026-12-02).
fn merge_chunk_lengths(gpu: &CudaBackend, cpu: &Tokenizer, rounds: usize) {
    let default = Geometry::default().chunk_bytes;
    geometry_sweep(
        gpu,
        cpu,
        rounds,
        "long pieces cut into chunks of other lengths",
        [default, 48, 96, 192, 768].map(|chunk_bytes| {
            let geometry = Geometry {
                chunk_bytes,
                ..Geometry::default()
            };
            (format!("{chunk_bytes:>3} bytes"), geometry)
        }),
    );
}

/// One row per `(label, geometry)` of `rows` (the default first; a later row
/// equal to it is left out): 1 KiB and 256 KiB of each shape eager.
fn geometry_sweep<const N: usize>(
    gpu: &CudaBackend,
    cpu: &Tokenizer,
    rounds: usize,
    title: &str,
    rows: [(String, Geometry); N],
) {
    geometry_sweep_at(gpu, cpu, rounds, title, &[(1, 5), (256, 47)], rows);
}

/// [`geometry_sweep`] over one document of each shape at each of `sizes`
/// (`(KiB, seed)`); a row whose encoder runs the largest size step by step
/// instead of through the resident grid says so.
fn geometry_sweep_at<const N: usize>(
    gpu: &CudaBackend,
    cpu: &Tokenizer,
    rounds: usize,
    title: &str,
    sizes: &[(usize, u64)],
    rows: [(String, Geometry); N],
) {
    println!("\n{title} (eager, median of {rounds}; kernels' own time in brackets):");
    let texts: Vec<(String, Vec<u8>)> = sizes
        .iter()
        .flat_map(|&(kib, seed)| {
            Shape::ALL.into_iter().map(move |shape| {
                (
                    format!("{kib} KiB {shape}"),
                    generate(shape, kib << 10, seed),
                )
            })
        })
        .collect();
    let largest = sizes
        .iter()
        .map(|&(kib, _)| (kib as u64) << 10)
        .max()
        .unwrap_or(0);
    let default = Geometry::default();
    for (index, (label, geometry)) in rows.into_iter().enumerate() {
        if index > 0 && geometry == default {
            continue;
        }
        let encoder = match DeviceEncoder::with_geometry(
            AnyBackend::Cuda(gpu.clone()),
            cpu,
            geometry,
            ChunkLimits::default(),
        ) {
            Ok(encoder) => encoder,
            Err(error) => {
                println!("  {label}: {error}");
                continue;
            }
        };
        let stepped = if encoder.runs_resident(largest) || encoder.runs_short(largest) {
            ""
        } else {
            " (its steps one by one: no fused kernel at this shape)"
        };
        let head = format!("  {label}{}{stepped}:", default_mark(geometry == default));
        println!("{}", eager_row(head, &encoder, cpu, &texts, rounds));
    }
}

/// 64 KiB and 256 KiB of each shape eager through the resident-grid kernel in
/// other shapes, the default first: every step's workgroup (the split's
/// threads and bytes per thread, the BPE steps' threads, one size for every
/// step of a fused kernel) and the grid's workgroups. The kernel ends each of
/// its steps with a grid sync (about 1.8 µs each for 256 workgroups on the
/// H100, 2026-12-06, this bench's wait floors), and a split block pays a
/// ticket and a look-back whatever its size: fewer, larger blocks pay fewer
/// of both, but each workgroup's serial depth grows with its bytes.
///
/// First run (H100, 2026-12-06, median of 1,000; a host whose wait floors
/// read about 20 % above the same day's other H100), the kernel's own time at
/// 256 KiB prose / CJK / code: the default 59.8 / 72.3 / 88.5 µs; 256 × 8
/// bytes 63.4 / 71.5 / 79.2; 128 × 8 64.6 / 73.6 / 81.5; 512 × 4 67.2 / 71.6
/// / 92.1; 256 × 2 81.9 / 85.8 / 98.9; 512 × 2 80.9 / 83.3 / 93.7; 1,024 × 2
/// 92.8 / 87.6 / 132.7; at most 128 workgroups 70.1 / 77.9 / 85.0, at most
/// 64 105.2 / 126.6 / 113.5. At 64 KiB every row but the default's 1 KiB
/// blocks (50.0 / 49.0 / 69.1) and the caps was slower by 10–40 µs. Blocks of
/// 8 bytes a thread shorten code's `merge` chains (its kernels 79–82 against
/// 88.5) but lengthen prose and every 64 KiB text; the default stays.
fn resident_shapes(gpu: &CudaBackend, cpu: &Tokenizer, rounds: usize) {
    let default = Geometry::default();
    let shape = |threads: u32, bytes_per_thread: u32| {
        let geometry = Geometry {
            workgroup_size: threads,
            ..default.with_split_workgroups(threads, bytes_per_thread)
        };
        (
            format!("{threads:>4} threads × {bytes_per_thread} bytes"),
            geometry,
        )
    };
    let capped = |workgroups: u32| {
        (
            format!("at most {workgroups} workgroups"),
            Geometry {
                resident_workgroups: Some(workgroups),
                ..default
            },
        )
    };
    let (threads, bytes_per_thread) = (default.workgroup_size, default.split.bytes_per_thread);
    geometry_sweep_at(
        gpu,
        cpu,
        rounds,
        "the resident-grid kernel in other shapes",
        &[(64, 47), (256, 47)],
        [
            shape(threads, bytes_per_thread),
            shape(256, 8),
            shape(256, 2),
            shape(512, 4),
            shape(512, 2),
            shape(128, 8),
            shape(1024, 2),
            capped(128),
            capped(64),
        ],
    );
}

/// `head` and one [`eager_cell`] per text of `texts` (`(label, text)` each).
fn eager_row(
    head: String,
    encoder: &DeviceEncoder,
    cpu: &Tokenizer,
    texts: &[(String, Vec<u8>)],
    rounds: usize,
) -> String {
    let mut row = head;
    for (label, text) in texts {
        let ids = cpu.encode_ordinary_bytes(text);
        row += &eager_cell(encoder, text, &ids, rounds, label);
    }
    row
}

/// What a row of a sweep says after its setting when the setting is the default.
fn default_mark(is_default: bool) -> &'static str {
    if is_default {
        " (default)"
    } else {
        ""
    }
}

/// One 1 KiB and one 4 KiB document of prose (and 4 KiB of CJK, whose
/// pieces are longer) eager through the short-text kernel in each workgroup
/// shape: the encode's median time and the kernel's own, the default first.
fn short_text_shapes(gpu: &CudaBackend, cpu: &Tokenizer, rounds: usize) {
    println!("
the short-text kernel in other workgroups (eager, median of {rounds}; the kernel's own time in brackets):");
    let texts: Vec<(String, Vec<u8>)> = [
        (Shape::Prose, 1024),
        (Shape::Prose, 4096),
        (Shape::Cjk, 4096),
    ]
    .into_iter()
    .map(|(shape, bytes)| (format!("{bytes} B {shape}"), generate(shape, bytes, 5)))
    .collect();
    let default = ShortText::default();
    let shapes = [
        default,
        ShortText {
            workgroup_size: 256,
            bytes_per_thread: 8,
            ..default
        },
        ShortText {
            workgroup_size: 512,
            bytes_per_thread: 2,
            ..default
        },
        ShortText {
            workgroup_size: 512,
            bytes_per_thread: 4,
            ..default
        },
        ShortText {
            workgroup_size: 512,
            bytes_per_thread: 8,
            ..default
        },
        ShortText {
            workgroup_size: 1024,
            bytes_per_thread: 1,
            ..default
        },
        ShortText {
            workgroup_size: 1024,
            bytes_per_thread: 2,
            ..default
        },
        ShortText {
            workgroup_size: 1024,
            bytes_per_thread: 4,
            ..default
        },
    ];
    for (index, short_text) in shapes.into_iter().enumerate() {
        if index > 0 && short_text == default {
            continue;
        }
        let geometry = Geometry {
            short_text,
            ..Geometry::default()
        };
        // Its texts go up to 4 KiB, past the default limit of the short path.
        let limits = ChunkLimits {
            short_text_bytes: SHORT_TEXT_BYTES,
            ..ChunkLimits::default()
        };
        let encoder = match DeviceEncoder::with_geometry(
            AnyBackend::Cuda(gpu.clone()),
            cpu,
            geometry,
            limits,
        ) {
            Ok(encoder) if encoder.runs_short(SHORT_TEXT_BYTES) => encoder,
            Ok(_) => {
                println!("  {short_text:?}: the device refused the short-text kernel");
                continue;
            }
            Err(error) => {
                println!("  {short_text:?}: {error}");
                continue;
            }
        };
        let head = format!(
            "  {:>4} threads × {} bytes{}:",
            short_text.workgroup_size,
            short_text.bytes_per_thread,
            default_mark(short_text == default)
        );
        println!("{}", eager_row(head, &encoder, cpu, &texts, rounds));
    }
}

/// One document of each shape, 1 KiB to 2 MiB, eager through the
/// resident-grid kernel and step by step (`step_by_step`), and up to 4 KiB
/// through the short-text kernel, each with the kernels' own time: where the
/// one cooperative dispatch stops paying, which places `RESIDENT_TEXT_BYTES`,
/// and where it overtakes the one workgroup of the short-text kernel, which
/// places `SHORT_TEXT_BYTES`.
fn resident_by_size(
    gpu: &CudaBackend,
    cpu: &Tokenizer,
    step_by_step: &DeviceEncoder,
    rounds: usize,
) {
    let only = |limits| encoder_with_limits(gpu, cpu, limits);
    let resident = only(ChunkLimits {
        short_text_bytes: 0,
        resident_text_bytes: 4 << 20,
        ..ChunkLimits::default()
    });
    let short = only(ChunkLimits {
        resident_text_bytes: 0,
        ..ChunkLimits::default()
    });
    println!("\nthe resident-grid kernel against every step its own dispatch and the short-text kernel (eager, median of {rounds}; kernels' own time in brackets):");
    let sizes = [1usize, 2, 3, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048];
    for (shape, kib) in Shape::ALL
        .into_iter()
        .flat_map(|shape| sizes.map(|kib| (shape, kib)))
    {
        let text = generate(shape, kib << 10, 47);
        let ids = cpu.encode_ordinary_bytes(&text);
        let mut row = format!("  {shape:>5} {kib:>5} KiB:");
        for (label, encoder) in [("resident", &resident), ("step by step", step_by_step)] {
            row += &eager_cell(encoder, &text, &ids, rounds, label);
        }
        if short.runs_short(text.len() as u64) {
            row += &eager_cell(&short, &text, &ids, rounds, "short");
        }
        println!("{row}");
    }
}

/// An encoder on `gpu` at `geometry` with `limits` (a bench row cannot go on
/// without it).
fn cuda_encoder(
    gpu: &CudaBackend,
    cpu: &Tokenizer,
    geometry: Geometry,
    limits: ChunkLimits,
) -> DeviceEncoder {
    DeviceEncoder::with_geometry(AnyBackend::Cuda(gpu.clone()), cpu, geometry, limits)
        .unwrap_or_else(|error| panic!("encoder at {geometry:?}, {limits:?}: {error}"))
}

/// An encoder on `gpu` at the default geometry with `limits`.
fn encoder_with_limits(gpu: &CudaBackend, cpu: &Tokenizer, limits: ChunkLimits) -> DeviceEncoder {
    cuda_encoder(gpu, cpu, Geometry::default(), limits)
}

/// `text` encoded as a batch of one into a reused vector (median of `rounds`),
/// its ids checked against `ids`: the time and the chunk's timings.
fn batch_of_one_median(
    encoder: &DeviceEncoder,
    text: &[u8],
    ids: &[u32],
    rounds: usize,
    label: &str,
) -> (f64, ChunkTimings) {
    let mut one = [Vec::new()];
    let measured = median(rounds, || {
        encoder
            .encode_batch_into(&[text], &mut one)
            .expect("encode a batch of one")
            .remove(0)
    });
    assert_eq!(one[0], ids, "{label}");
    measured
}

/// The default encoder with its kernels' bounds checks as `bounds_checks`
/// says (the default leaves them out of the fused kernels: [`BoundsChecks`]).
fn encoder_with_checks(
    gpu: &CudaBackend,
    cpu: &Tokenizer,
    bounds_checks: BoundsChecks,
) -> DeviceEncoder {
    let geometry = Geometry {
        bounds_checks,
        ..Geometry::default()
    };
    cuda_encoder(gpu, cpu, geometry, ChunkLimits::default())
}

/// One eager encode of `text` with `encoder` (median of `rounds`), its ids
/// checked against `ids`, as a row's cell: `label`, the time and the kernels'
/// own time in brackets.
fn eager_cell(
    encoder: &DeviceEncoder,
    text: &[u8],
    ids: &[u32],
    rounds: usize,
    label: &str,
) -> String {
    let (eager, parts) = eager_median(encoder, text, ids, rounds, label);
    format!(
        "  {label} {:.1} µs [{:.1}]",
        eager * 1e6,
        parts.kernel_ns() as f64 / 1e3
    )
}

/// One 256 KiB document of each shape eager, into a reused `BatchIds` and as
/// a graph (with the hand-out helpers' rounds); one 1 KiB document.
fn single_documents(
    gpu: &CudaBackend,
    cpu: &Tokenizer,
    encoder: &DeviceEncoder,
    tiktoken: &Peer,
    step_by_step: &DeviceEncoder,
    small_rounds: usize,
) {
    // The resident grid with `compact` in a group per 1 KiB block of 256 KiB
    // instead of the default cap, which was measured for the batch (where
    // other chunks' steps want the SMs), never for one document alone.
    let compact_groups = 256;
    let wide_compact = cuda_encoder(
        gpu,
        cpu,
        Geometry {
            compact_workgroups: compact_groups,
            ..Geometry::default()
        },
        ChunkLimits::default(),
    );
    // The resident grid as a cooperative dispatch per chunk instead of a
    // replay of the graph its slot keeps.
    let dispatching =
        encoder_with_limits(gpu, cpu, ChunkLimits::default()).with_fused_graphs(false);
    // The text gathered while the kernel runs, which reads each piece across
    // PCIe once it is ready (the default), against the text gathered before
    // the launch and against the text brought up by the copy engine before the
    // kernel (`with_text_copy_engine_from`: a slot of 256 KiB takes the DMA),
    // all with the default three hand-out helpers: the kernels' reads across
    // PCIe ran 2–3 times slower on some H100 hosts than on others (256 KiB in
    // the resident kernel's `stage` in 7.7 µs on one of 2026-12-06, in the
    // step-by-step `stage` in 13–22 µs on one of 2026-12-07, whose fed
    // resident `stage` took 29–38), so the DMA is measured again beside them,
    // on each host. (No helpers and one helper,
    // measured on 2026-12-06, are documented at `HAND_OUT_HELPERS`; the
    // fused kernels with bounds checks, on 2026-12-07, at `BoundsChecks`.)
    let defaults = || encoder_with_limits(gpu, cpu, ChunkLimits::default());
    let fed = defaults().with_text_fed(true);
    let gathered = defaults().with_text_fed(false);
    let by_copy_engine = defaults()
        .with_text_copy_engine_from(256 << 10)
        .expect("a copy-engine threshold of 256 KiB");
    // The same kernels with bounds checks, for the 1 KiB rounds below.
    let checked = encoder_with_checks(gpu, cpu, BoundsChecks::Everywhere);
    let text_ways: [(String, &DeviceEncoder); 3] = [
        (
            format!("the text fed while the kernel runs ({HAND_OUT_HELPERS} helpers)"),
            &fed,
        ),
        (
            format!("the text gathered before the launch ({HAND_OUT_HELPERS} helpers)"),
            &gathered,
        ),
        (
            format!("the text by the copy engine before the kernel ({HAND_OUT_HELPERS} helpers)"),
            &by_copy_engine,
        ),
    ];
    print_wait_floors(gpu, 262_144, small_rounds);
    for shape in Shape::ALL {
        let text = generate(shape, 262_144, 42);
        let ids = cpu.encode_ordinary_bytes(&text);
        let (eager, step_timings) =
            eager_median(encoder, &text, &ids, small_rounds, &format!("{shape}"));
        let (stepped, stepped_timings) = eager_median(
            step_by_step,
            &text,
            &ids,
            small_rounds,
            &format!("{shape}, step by step"),
        );
        // Into one `BatchIds` again and again: its part takes the chunk's
        // host-mapped ids instead of copying them.
        let (into_batch_ids, _) =
            batch_ids_median(encoder, &text, &ids, small_rounds, &format!("{shape}"));
        let mut graph = encoder.graph(text.len()).expect("graph");
        let (graphed, (graph_ids, _)) = median(small_rounds, || {
            graph.encode_timed(&text).expect("graph encode")
        });
        assert_eq!(graph_ids, ids, "{shape}: graph ids");
        // Into one vector again and again, as the eager rows' `wait_into`.
        let mut reused_ids = Vec::new();
        let (graphed_into, _) = median(small_rounds, || {
            graph
                .encode_into(&text, &mut reused_ids)
                .expect("graph encode")
        });
        assert_eq!(reused_ids, ids, "{shape}: graph ids into a reused vector");
        let (graphed_in_place, _) = graph_in_place_median(&mut graph, &text, &ids, small_rounds);
        println!(
            "\n262,144 bytes of {shape}: eager {:.1} µs (target ≤ 100; kernels {:.1} µs: {}), into a reused BatchIds {:.1} µs; graph {:.1} µs, into a reused vector {:.1} µs, ids read in place {:.1} µs (target ≤ 75); eager step by step {:.1} µs, kernels {:.1} µs ({})",
            eager * 1e6,
            step_timings.kernel_ns() as f64 / 1e3,
            step_timings.kernel_line(),
            into_batch_ids * 1e6,
            graphed * 1e6,
            graphed_into * 1e6,
            graphed_in_place * 1e6,
            stepped * 1e6,
            stepped_timings.kernel_ns() as f64 / 1e3,
            stepped_timings.kernel_line()
        );
        println!("  one eager encode: {}", step_timings.wall_line());
        // Ids left in host-mapped memory, read by the host after every round
        // (as a caller who uses them does), after the last only, after every
        // round then flushed from the CPU's caches, and after every round
        // then demoted to the shared cache: whether the host's reads of one
        // encode's ids slow the next, and why.
        let reads = [
            IdsRead::EachRound,
            IdsRead::LastRound,
            IdsRead::EachRoundFlushed,
            IdsRead::EachRoundDemoted,
        ];
        for round in 1..=2 {
            let in_batch_ids = reads
                .map(|read| batch_ids_read_median(encoder, &text, &ids, small_rounds, read) * 1e6);
            let in_place = reads.map(|read| {
                let (time, timings) =
                    graph_in_place_read_median(&mut graph, &text, &ids, small_rounds, read);
                (time * 1e6, timings.kernel_stamps_ns as f64 / 1e3)
            });
            println!(
                "  ids read after every round / after the last only / after every round and flushed / after every round and demoted, round {round}: into a reused BatchIds {:.1} / {:.1} / {:.1} / {:.1} µs, graph in place {:.1} / {:.1} / {:.1} / {:.1} µs (its last round's kernel {:.1} / {:.1} / {:.1} / {:.1})",
                in_batch_ids[0],
                in_batch_ids[1],
                in_batch_ids[2],
                in_batch_ids[3],
                in_place[0].0,
                in_place[1].0,
                in_place[2].0,
                in_place[3].0,
                in_place[0].1,
                in_place[1].1,
                in_place[2].1,
                in_place[3].1
            );
        }
        for round in 1..=3 {
            let mut line = format!("  how the text goes up, round {round}:");
            for (variant, way) in &text_ways {
                let label = format!("{shape}, {variant}");
                let (eager, timings) = eager_median(way, &text, &ids, small_rounds, &label);
                let mut graph = way.graph(text.len()).expect("graph");
                let mut into = Vec::new();
                let (graphed, _) = median(small_rounds, || {
                    graph.encode_into(&text, &mut into).expect("graph encode")
                });
                assert_eq!(into, ids, "{label}: graph ids");
                let (graph_in_place, graph_timings) =
                    graph_in_place_median(&mut graph, &text, &ids, small_rounds);
                let (in_place, batch_timings) =
                    batch_ids_median(way, &text, &ids, small_rounds, &label);
                line.push_str(&format!(
                    " {variant}: eager {:.1} µs (staging {:.1}, of it the gather {:.1}, hand-out {:.1}, kernel {:.1}), graph into a reused vector {:.1}, graph in place {:.1} (kernel {:.1}), into a reused BatchIds {:.1} (staging {:.1});",
                    eager * 1e6,
                    timings.staged_ns as f64 / 1e3,
                    timings.gathered_ns as f64 / 1e3,
                    timings.scatter_ns as f64 / 1e3,
                    timings.kernel_ns() as f64 / 1e3,
                    graphed * 1e6,
                    graph_in_place * 1e6,
                    graph_timings.kernel_stamps_ns as f64 / 1e3,
                    in_place * 1e6,
                    batch_timings
                        .first()
                        .map_or(0.0, |chunk| chunk.staged_ns as f64 / 1e3)
                ));
            }
            println!("{line}");
        }
        println!(
            "  eager after an encode of its first {OTHER_LENGTH} bytes (the slot graph's kernel node takes the new length and grid first, as a caller's documents of many lengths ask): {:.1} µs",
            eager_after_another_length(encoder, &text, &ids, small_rounds) * 1e6
        );
        println!(
            "  its kernel's steps by their own clock: {}",
            counted_kernel_line(encoder, &text, &ids, small_rounds)
        );
        let (wide, _) = eager_median(
            &wide_compact,
            &text,
            &ids,
            small_rounds,
            &format!("{shape}, compact in {compact_groups} groups"),
        );
        println!(
            "  with compact in {compact_groups} groups instead of {}: eager {:.1} µs; {}",
            Geometry::default().compact_workgroups,
            wide * 1e6,
            counted_kernel_line(&wide_compact, &text, &ids, small_rounds)
        );
        let (dispatched, dispatched_timings) = eager_median(
            &dispatching,
            &text,
            &ids,
            small_rounds,
            &format!("{shape}, the cooperative dispatch"),
        );
        println!(
            "  the cooperative dispatch instead of the slot's graph: eager {:.1} µs; one encode: {}",
            dispatched * 1e6,
            dispatched_timings.wall_line()
        );
    }
    let small = String::from_utf8(generate(Shape::Prose, 1024, 5)).expect("UTF-8");
    let small_ids = cpu.encode_ordinary(&small);
    let mut graph = encoder.graph(small.len()).expect("graph");
    let (graphed, (graph_ids, _)) = median(small_rounds, || {
        graph.encode_timed(small.as_bytes()).expect("graph encode")
    });
    assert_eq!(graph_ids, small_ids, "1 KiB: graph ids");
    let (small_in_place, _) =
        graph_in_place_median(&mut graph, small.as_bytes(), &small_ids, small_rounds);
    let (peer, _) = median(small_rounds, || tiktoken.encode(&small));
    println!(
        "1,024 bytes of prose: graph {:.1} µs (ids read in place {:.1} µs), tiktoken-rs {:.1} µs on one thread; eager (target ≤ 25):",
        graphed * 1e6,
        small_in_place * 1e6,
        peer * 1e6
    );
    for (label, eager_encoder) in [
        ("stage + the short-text kernel", encoder),
        ("every step its own dispatch", step_by_step),
    ] {
        let (eager, parts) = eager_median(
            eager_encoder,
            small.as_bytes(),
            &small_ids,
            small_rounds,
            &format!("1 KiB, {label}"),
        );
        println!(
            "  {label}: {:.1} µs; one encode: {}",
            eager * 1e6,
            parts.wall_line()
        );
    }
    // The default (no bounds checks in the fused kernels) against the kernels
    // with them, in alternating rounds: a batch of one, and the short-text
    // kernel's own clock.
    for round in 1..=3 {
        let mut line = format!("  the fused kernels' bounds checks off or on, round {round}:");
        for (label, rounds_encoder) in [("off (the default)", encoder), ("on", &checked)] {
            let (batched, _) = batch_of_one_median(
                rounds_encoder,
                small.as_bytes(),
                &small_ids,
                small_rounds,
                &format!("1 KiB, bounds checks {label}"),
            );
            line.push_str(&format!(
                " {label}: a batch of one {:.1} µs, steps {};",
                batched * 1e6,
                counted_kernel_line(rounds_encoder, small.as_bytes(), &small_ids, small_rounds)
            ));
        }
        println!("{line}");
    }
    // A batch of one chunk, whose caller waits at once: the short-text
    // kernel's graph that the chunk's slot keeps, replayed.
    let (batched, batched_timings) = batch_of_one_median(
        encoder,
        small.as_bytes(),
        &small_ids,
        small_rounds,
        "1 KiB: a batch of one",
    );
    println!(
        "  encode_batch_into of one document (the slot's graph of the short-text kernel replayed: {}): {:.1} µs; one encode: {}",
        batched_timings.replayed,
        batched * 1e6,
        batched_timings.wall_line()
    );
    println!(
        "  the short-text kernel's steps by their own clock: {}",
        counted_kernel_line(encoder, small.as_bytes(), &small_ids, small_rounds)
    );
}

/// One document's eager encode with `encoder` (`submit_bytes`, then
/// `wait_into`), median of `rounds`: its seconds and the last round's
/// timings; the ids are checked against `ids` (`label` names the encode when
/// they differ).
fn eager_median(
    encoder: &DeviceEncoder,
    text: &[u8],
    ids: &[u32],
    rounds: usize,
    label: &str,
) -> (f64, ChunkTimings) {
    let mut results = [Vec::new()];
    let (eager, timings) = median(rounds, || {
        encoder
            .submit_bytes(&[text])
            .and_then(|pending| pending.wait_into(&mut results))
            .expect("eager encode")
    });
    assert_eq!(results[0], ids, "{label}: eager ids");
    (eager, timings)
}

/// The median time of `rounds` encodes of `text` into one reused `BatchIds`
/// (whose part takes the chunk's host-mapped ids instead of copying them),
/// with the median run's chunk timings; the ids are checked against `ids`
/// after the last round.
fn batch_ids_median(
    encoder: &DeviceEncoder,
    text: &[u8],
    ids: &[u32],
    rounds: usize,
    label: &str,
) -> (f64, Vec<ChunkTimings>) {
    let mut batch_ids = BatchIds::new();
    let measured = median(rounds, || {
        encoder
            .encode_batch_ids(&[text], &mut batch_ids)
            .expect("encode into BatchIds")
    });
    assert_eq!(batch_ids.get(0), Some(ids), "{label}: BatchIds");
    measured
}

/// When a timed row of ids left in host-mapped memory (a `BatchIds` part,
/// [`EncodeGraph::encode_in_place`]) reads them, always outside its clock.
#[derive(Clone, Copy, PartialEq, Eq)]
enum IdsRead {
    /// After every round, as a caller who uses each encode's ids does.
    EachRound,
    /// After the last round only: the device writes ids that no CPU core
    /// has read since they were last written.
    LastRound,
    /// After every round, then each of their cache lines flushed from the
    /// CPU's caches (x86-64's `clflush`; elsewhere as `EachRound`): whether
    /// what slows the next encode is its writes to lines a core still holds.
    EachRoundFlushed,
    /// After every round, then each of their cache lines demoted from the
    /// reading core's caches to the shared last-level cache
    /// (`demote_from_core_caches`): whether the next encode writes faster
    /// into lines that no core holds but the shared cache still does. (An
    /// in-place graph demotes the ids it lent at its next encode itself, and
    /// a `BatchIds` of one chunk those of the encode before, each cut to what
    /// the kernel outlasts, so the rows read every round and demoted should
    /// agree, but for the third of CJK's ids the cut leaves.)
    EachRoundDemoted,
}

impl IdsRead {
    /// Whether round `round` of `rounds` reads the ids.
    fn reads(self, round: usize, rounds: usize) -> bool {
        self != IdsRead::LastRound || round + 1 == rounds
    }

    /// After a read of `ids`, what this way of reading does to them.
    fn after_read(self, ids: &[u32]) {
        match self {
            IdsRead::EachRoundFlushed => flush_from_cpu_caches(ids),
            IdsRead::EachRoundDemoted => demote_from_core_caches(ids),
            IdsRead::EachRound | IdsRead::LastRound => {}
        }
    }
}

/// Flushes every cache line that holds a byte of `ids` from the CPU's caches
/// (x86-64 only).
fn flush_from_cpu_caches(ids: &[u32]) {
    #[cfg(target_arch = "x86_64")]
    {
        const LINE_BYTES: usize = 64;
        let bytes: &[u8] = bytemuck::cast_slice(ids);
        let start = bytes.as_ptr() as usize;
        // The slice's first byte, then the first byte of each later line.
        let later_lines = (start / LINE_BYTES + 1) * LINE_BYTES - start;
        let firsts = std::iter::once(0).chain((later_lines..bytes.len()).step_by(LINE_BYTES));
        for first in firsts.filter(|&first| first < bytes.len()) {
            // SAFETY: `first` is below the slice's length, so the address is
            // a byte of a live slice; `clflush` changes no byte's value (it
            // writes a dirty line back and evicts it), and SSE2, which has
            // it, is part of x86-64.
            unsafe { std::arch::x86_64::_mm_clflush(&bytes[first]) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = ids;
}

/// The median time of `rounds` encodes of `text` into one reused `BatchIds`,
/// its ids checked against `ids` (read) as `read` says.
fn batch_ids_read_median(
    encoder: &DeviceEncoder,
    text: &[u8],
    ids: &[u32],
    rounds: usize,
    read: IdsRead,
) -> f64 {
    let mut batch_ids = BatchIds::new();
    // One encode first, as `median` runs, so no timed round records the
    // slot's graph.
    encoder
        .encode_batch_ids(&[text], &mut batch_ids)
        .expect("encode into BatchIds");
    let rounds = rounds.max(1);
    let mut times = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let start = Instant::now();
        encoder
            .encode_batch_ids(&[text], &mut batch_ids)
            .expect("encode into BatchIds");
        times.push(start.elapsed().as_secs_f64());
        if read.reads(round, rounds) {
            assert_eq!(batch_ids.get(0), Some(ids), "BatchIds read in place");
            read.after_read(batch_ids.get(0).unwrap_or_default());
        }
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// The length of the text [`eager_after_another_length`] encodes between the
/// timed ones: another grid (one workgroup per 1 KiB block) and another length.
const OTHER_LENGTH: usize = 250_000;

/// The median time of `rounds` eager encodes of `text` (as [`eager_median`]),
/// each after an untimed encode of its first [`OTHER_LENGTH`] bytes, so that
/// every timed encode finds its slot's graph set for another length; the ids
/// are checked against `ids`.
fn eager_after_another_length(
    encoder: &DeviceEncoder,
    text: &[u8],
    ids: &[u32],
    rounds: usize,
) -> f64 {
    let encode = |bytes: &[u8], results: &mut [Vec<u32>; 1]| {
        encoder
            .submit_bytes(&[bytes])
            .and_then(|pending| pending.wait_into(results))
            .expect("eager encode");
    };
    let (mut other, mut results) = ([Vec::new()], [Vec::new()]);
    let seconds = median_after(
        rounds,
        || encode(&text[..OTHER_LENGTH.min(text.len())], &mut other),
        |_| encode(text, &mut results),
    );
    assert_eq!(results[0], ids, "eager after another length");
    seconds
}

/// The kernel line of the median (by kernel time) of `rounds` counted encodes
/// of `text`, each checked against `ids`: a fused kernel's steps by its own
/// clock in brackets (`DeviceEncoder::encode_counted` reads them with the
/// counts, which the timed rows leave out).
fn counted_kernel_line(encoder: &DeviceEncoder, text: &[u8], ids: &[u32], rounds: usize) -> String {
    let mut counted: Vec<ChunkTimings> = (0..rounds.max(1))
        .map(|_| {
            let (encoded, timings) = encoder.encode_counted(&[text]).expect("counted encode");
            assert_eq!(encoded[0], ids, "counted encode");
            timings
        })
        .collect();
    counted.sort_by_key(ChunkTimings::kernel_ns);
    counted[counted.len() / 2].kernel_line()
}

/// The median time of `rounds` graph replays of `text` whose ids are read where
/// the graph left them ([`EncodeGraph::encode_in_place`]), each checked against
/// `ids` after its clock stopped (compared inside it, some 60,000 ids read
/// from host-mapped memory made in place look slower than into a vector:
/// 113–117 against 100–106 µs for prose on an H100, 2026-12-06), and the last
/// replay's timings.
fn graph_in_place_median(
    graph: &mut EncodeGraph<'_>,
    text: &[u8],
    ids: &[u32],
    rounds: usize,
) -> (f64, Timings) {
    graph_in_place_read_median(graph, text, ids, rounds, IdsRead::EachRound)
}

/// [`graph_in_place_median`] with its ids read (checked against `ids`) as
/// `read` says.
fn graph_in_place_read_median(
    graph: &mut EncodeGraph<'_>,
    text: &[u8],
    ids: &[u32],
    rounds: usize,
    read: IdsRead,
) -> (f64, Timings) {
    let rounds = rounds.max(1);
    let mut times = Vec::with_capacity(rounds);
    let mut last = None;
    for round in 0..rounds {
        let start = Instant::now();
        let (in_place, timings) = graph.encode_in_place(text).expect("graph encode in place");
        times.push(start.elapsed().as_secs_f64());
        if read.reads(round, rounds) {
            assert!(in_place == ids, "graph ids read in place");
            read.after_read(in_place);
        }
        last = Some(timings);
    }
    times.sort_by(f64::total_cmp);
    (times[times.len() / 2], last.expect("at least one round"))
}

/// Whether the environment variable `name` is `0` (its section left out).
fn skipped(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|value| value == "0")
}

/// The 64 MiB batch and what a row of it at another geometry needs.
struct Batch<'a> {
    gpu: &'a CudaBackend,
    cpu: &'a Tokenizer,
    texts: &'a [&'a [u8]],
    expected: &'a [Vec<u32>],
    bytes: usize,
    rounds: usize,
}

impl Batch<'_> {
    /// One row per geometry of `rows`, each labelled by `label` and with its
    /// time as a ratio to the first row's (the section's baseline).
    fn rows_against_the_first(
        &self,
        results: &mut [Vec<u32>],
        rows: impl IntoIterator<Item = Geometry>,
        label: impl Fn(&Geometry) -> String,
    ) {
        let mut first_seconds = None;
        for geometry in rows {
            let seconds = self.row(geometry, &label(&geometry), results, first_seconds);
            first_seconds = first_seconds.or(seconds);
        }
    }

    /// One row: the batch through `encode_batch_into` at `geometry` (ids held
    /// to the CPU encoder's), its median time and chunk 0's kernels, and its
    /// ratio to `baseline` seconds (the section's first row) when given; the
    /// median seconds, or `None` when the device refuses the geometry.
    fn row(
        &self,
        geometry: Geometry,
        label: &str,
        results: &mut [Vec<u32>],
        baseline: Option<f64>,
    ) -> Option<f64> {
        let encoder = match DeviceEncoder::with_geometry(
            AnyBackend::Cuda(self.gpu.clone()),
            self.cpu,
            geometry,
            ChunkLimits::default(),
        ) {
            Ok(encoder) => encoder,
            Err(error) => {
                println!("  {label}: refused: {error}");
                return None;
            }
        };
        let (seconds, chunks) = median(self.rounds, || {
            encoder
                .encode_batch_into(self.texts, results)
                .expect("device batch")
        });
        assert!(
            results == self.expected,
            "the device's ids differ from the CPU encoder's at {geometry:?}"
        );
        let ratio = baseline.map_or(String::new(), |baseline| {
            format!(" ({:.3} × the first row's time)", seconds / baseline)
        });
        let first = &chunks[0];
        println!(
            "  {label}: {:.2} ms, {:.2} GB/s{ratio}; kernels {:.2} ms ({})",
            seconds * 1e3,
            gb_per_s(self.bytes, seconds),
            first.kernel_ns() as f64 / 1e6,
            first.kernel_line()
        );
        Some(seconds)
    }
}

/// The default geometry, the default with `set` applied for each of `values`,
/// then the default again (how far the device drifted over the rows).
fn around_the_default(values: &[u32], set: fn(&mut Geometry, u32)) -> Vec<Geometry> {
    let default = Geometry::default();
    let mut rows = vec![default];
    rows.extend(values.iter().map(|&value| {
        let mut geometry = default;
        set(&mut geometry, value);
        geometry
    }));
    rows.push(default);
    rows
}

/// A `stage` cap that caps no chunk: a 16 MiB chunk's `stage` is 4,096
/// workgroups of 256 threads, the largest chunk's (256 MiB) 65,536.
const UNCAPPED_STAGE: u32 = 65_536;

/// The default first, then every pair of `stage` caps (64, 128, 256, 1,024
/// workgroups and uncapped, [`UNCAPPED_STAGE`]) and `compact` caps (64, 128,
/// 256, 1,024), then the default again (the drift over the rows): on the H200
/// (2026-12-02) `stage` (4,096 workgroups per 16 MiB chunk) took 0.39–0.76 ms
/// and `compact` (1,024) 0.87–1.21 ms per chunk against PCIe floors of 0.31
/// and 0.65 ms, holding SMs the other chunks' compute needs while they wait;
/// these rows chose the defaults and show, run after run, whether they still
/// hold.
fn grid_caps() -> Vec<Geometry> {
    let default = Geometry::default();
    let mut caps = vec![default];
    for stage_workgroups in [64, 128, 256, 1024, UNCAPPED_STAGE] {
        for compact_workgroups in [64, 128, 256, 1024] {
            let geometry = Geometry {
                stage_workgroups,
                compact_workgroups,
                ..default
            };
            if geometry != default {
                caps.push(geometry);
            }
        }
    }
    // The default again: how far the device drifted over the section.
    caps.push(default);
    caps
}

/// The default shape first, then larger blocks of the split (more bytes per
/// thread, more threads) and other BPE workgroup sizes, one change at a time;
/// then the default, the largest split blocks and 512-thread BPE steps without
/// an occupancy request (`Occupancy::Unrequested`: most steps at the 80
/// registers the result ABI's epilogue pins), and the default with every step
/// at 8 blocks per SM (phases, merge and long then spill in their bodies).
/// Blocks of 4 and 8 KiB and BPE workgroups of 512 threads with 12-byte slabs
/// need more than 48 KiB of workgroup memory (49,304 bytes for the split's 4 KiB
/// blocks, 24 KiB of slabs): kernels get the device's opt-in limit (227 KiB on
/// an H200) as dynamic shared memory.
fn workgroup_shapes() -> Vec<Geometry> {
    // Every row but the first at one split shape for every chunk.
    let default = Geometry {
        bulk_split: None,
        ..Geometry::default()
    };
    let split = |workgroup_size, bytes_per_thread| {
        default.with_split_workgroups(workgroup_size, bytes_per_thread)
    };
    // The merge's slabs are workgroup memory per thread.
    let bpe = |workgroup_size, merge_slab_bytes| Geometry {
        workgroup_size,
        merge_slab_bytes,
        ..default
    };
    vec![
        Geometry::default(),
        default,
        split(256, 8),
        split(512, 4),
        split(512, 8),
        split(1024, 4),
        split(1024, 8),
        bpe(128, default.merge_slab_bytes),
        bpe(512, 6),
        bpe(512, default.merge_slab_bytes),
        unrequested(default),
        unrequested(split(1024, 8)),
        unrequested(bpe(512, default.merge_slab_bytes)),
        Geometry {
            occupancy: Occupancy::BlocksPerMultiprocessor(8),
            ..default
        },
    ]
}

/// `geometry` with no occupancy request.
fn unrequested(geometry: Geometry) -> Geometry {
    Geometry {
        occupancy: Occupancy::Unrequested,
        ..geometry
    }
}

/// One chunk of 1 to 16 MiB of documents of 1–16 KiB, with the bulk split for
/// every chunk and without one: where its larger blocks start to pay, which
/// sets [`BulkSplit::from_bytes`]'s default.
fn bulk_split_by_chunk_size(gpu: &CudaBackend, cpu: &Tokenizer, rounds: usize) {
    let encoder = |bulk_split| {
        let geometry = Geometry {
            bulk_split,
            ..Geometry::default()
        };
        cuda_encoder(gpu, cpu, geometry, ChunkLimits::default())
    };
    let always = encoder(Some(BulkSplit {
        from_bytes: 0,
        ..BulkSplit::default()
    }));
    let never = encoder(None);
    for mib in ONE_CHUNK_MIB {
        assert!(always.runs_bulk((mib << 20) as u64) && !never.runs_bulk((mib << 20) as u64));
    }
    let bulk = BulkSplit::default().split;
    let split = Geometry::default().split;
    println!(
        "
one chunk, the split's blocks of {} × {} bytes (bulk) against {} × {} (median round; the default takes the bulk split from {} bytes):",
        bulk.workgroup_size,
        bulk.bytes_per_thread,
        split.workgroup_size,
        split.bytes_per_thread,
        BulkSplit::default().from_bytes
    );
    one_chunk_by_size(
        cpu,
        rounds,
        &[("bulk", &always), ("default blocks", &never)],
    );
}

/// The step kernels without bounds checks against the default, which keeps
/// them there ([`BoundsChecks`]): one chunk of each size, which the step
/// kernels take, the bulk split's from 1 MiB included.
fn step_checks_by_chunk_size(gpu: &CudaBackend, cpu: &Tokenizer, rounds: usize) {
    let unchecked = encoder_with_checks(gpu, cpu, BoundsChecks::Nowhere);
    let default = encoder_with_checks(gpu, cpu, BoundsChecks::default());
    println!(
        "
one chunk through the step kernels without bounds checks against with them (the default; median round):"
    );
    one_chunk_by_size(
        cpu,
        rounds,
        &[("no bounds checks", &unchecked), ("the default", &default)],
    );
}

/// The sizes of [`one_chunk_by_size`]'s chunks, in MiB.
const ONE_CHUNK_MIB: [usize; 5] = [1, 2, 4, 8, 16];

/// One chunk of each of [`ONE_CHUNK_MIB`] through each of `variants`, in turn
/// (median of `rounds` each, the ids checked against the CPU encoder's): a
/// row per size with each variant's time, throughput and kernels.
fn one_chunk_by_size(cpu: &Tokenizer, rounds: usize, variants: &[(&str, &DeviceEncoder)]) {
    for mib in ONE_CHUNK_MIB {
        let texts = documents(mib << 20);
        let refs: Vec<&[u8]> = texts.iter().map(|text| text.as_bytes()).collect();
        let expected: Vec<Vec<u32>> = refs
            .iter()
            .map(|text| cpu.encode_ordinary_bytes(text))
            .collect();
        let mut results = vec![Vec::new(); refs.len()];
        let mut row = Vec::new();
        for (label, encoder) in variants {
            let (seconds, chunks) = median(rounds, || {
                encoder
                    .encode_batch_into(&refs, &mut results)
                    .expect("device chunk")
            });
            assert!(results == expected, "{mib} MiB, {label}: ids differ");
            row.push(format!(
                "{label} {:.3} ms ({:.2} GB/s; kernels {})",
                seconds * 1e3,
                gb_per_s(mib << 20, seconds),
                chunks[0].kernel_line()
            ));
        }
        println!("  {mib} MiB: {}", row.join("; "));
    }
}

/// Median of `rounds` runs of `run` on what `setup` makes, timing `run` alone
/// (what it returns is dropped after the clock stops).
fn median_after<S, T>(
    rounds: usize,
    mut setup: impl FnMut() -> S,
    mut run: impl FnMut(&mut S) -> T,
) -> f64 {
    let mut times = Vec::with_capacity(rounds);
    for _ in 0..rounds.max(1) {
        let mut state = setup();
        let start = Instant::now();
        let kept = run(&mut state);
        times.push(start.elapsed().as_secs_f64());
        drop((kept, state));
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// Each chunk's text bytes, as `encoder` cuts `texts` into chunks.
fn chunk_sizes(encoder: &DeviceEncoder, texts: &[&[u8]]) -> Vec<usize> {
    encoder
        .chunks(texts)
        .into_iter()
        .map(|range| texts[range].iter().map(|text| text.len()).sum())
        .collect()
}

/// The batch through `encode_batch_ids` (the target's row: one reused
/// [`BatchIds`] per size) in chunks of other sizes (the default,
/// [`CHUNK_TEXT_BYTES`], first), in rotated rounds (each size once per round,
/// so a slow stretch of the host falls on all of them): the minimum and median
/// of each, and how the encoder cut the batch. Sizes that are no power of two
/// take slots of the next one.
fn chunk_sizes_rotated(gpu: &CudaBackend, cpu: &Tokenizer, texts: &[&[u8]], rounds: usize) {
    let bytes: usize = texts.iter().map(|text| text.len()).sum();
    let encoders: Vec<DeviceEncoder> = [CHUNK_TEXT_BYTES, 4 << 20, 6 << 20, 8 << 20, 16 << 20]
        .into_iter()
        .map(|text_bytes| {
            let limits = ChunkLimits {
                text_bytes,
                ..ChunkLimits::default()
            };
            encoder_with_limits(gpu, cpu, limits)
        })
        .collect();
    let mut results: Vec<BatchIds> = encoders.iter().map(|_| BatchIds::new()).collect();
    let mut times = vec![Vec::new(); encoders.len()];
    for _ in 0..rounds {
        for ((encoder, times), ids) in encoders.iter().zip(&mut times).zip(&mut results) {
            let start = Instant::now();
            encoder.encode_batch_ids(texts, ids).expect("device batch");
            times.push(start.elapsed().as_secs_f64());
        }
    }
    println!("  chunk sizes, encode_batch_ids, {rounds} rotated rounds (min / median):");
    for (encoder, times) in encoders.iter().zip(&mut times) {
        times.sort_by(f64::total_cmp);
        let sizes = chunk_sizes(encoder, texts);
        println!(
            "    chunks of {:.0} MiB: {:.2} / {:.2} ms, {:.2} GB/s at the median; {} chunks, the last {:.2} MiB",
            encoder.limits().text_bytes as f64 / (1 << 20) as f64,
            times[0] * 1e3,
            times[times.len() / 2] * 1e3,
            gb_per_s(bytes, times[times.len() / 2]),
            sizes.len(),
            sizes.last().copied().unwrap_or(0) as f64 / (1 << 20) as f64,
        );
    }
}

/// The host's copies alone at the batch's sizes, on the copy pool and on
/// threads spawned per copy: the gather of `texts` from ordinary memory into
/// host-mapped pinned memory, and the hand-out of their ids (`expected`) from
/// host-mapped memory into reused and into new vectors.
fn host_copies(gpu: &CudaBackend, texts: &[&[u8]], expected: &[Vec<u32>], rounds: usize) {
    let bytes: usize = texts.iter().map(|text| text.len()).sum();
    let ids: Vec<u32> = expected.concat();
    let mut starts = vec![0u32];
    for document in expected {
        starts.push(starts[starts.len() - 1] + document.len() as u32);
    }
    let (Ok(mut staged), Ok(mut mapped_ids)) = (
        gpu.host_mapped_buffer(bytes as u64),
        gpu.host_mapped_buffer(ids.len() as u64 * 4),
    ) else {
        println!("  host copies: no host-mapped memory on this device; not measured");
        return;
    };
    let staged = staged.mapped_bytes_mut().expect("mapped text");
    let mapped = mapped_ids.mapped_bytes_mut().expect("mapped ids");
    for (word, id) in mapped.chunks_exact_mut(4).zip(&ids) {
        word.copy_from_slice(&id.to_le_bytes());
    }
    let mapped: &[u32] = bytemuck::cast_slice(&*mapped);
    let gather_pool = median_after(
        rounds,
        || (),
        |_| host_copy::gather(staged, texts).expect("gather"),
    );
    assert_eq!(&staged[..texts[0].len()], texts[0]);
    let gather_spawned = median_after(rounds, || (), |_| spawned_gather(staged, texts));
    let fresh = || vec![Vec::new(); expected.len()];
    let mut reused_results = fresh();
    let into_reused = |results: &mut Vec<Vec<u32>>| {
        host_copy::hand_out(mapped, &starts, results).expect("hand-out")
    };
    let reused_pool = median_after(rounds, || (), |_| into_reused(&mut reused_results));
    assert!(reused_results == expected, "the pool's hand-out differs");
    let reused_spawned = median_after(
        rounds,
        || (),
        |_| spawned_hand_out(mapped, &starts, &mut reused_results),
    );
    assert!(reused_results == expected, "the spawned hand-out differs");
    let new_pool = median_after(rounds, fresh, into_reused);
    let new_spawned = median_after(rounds, fresh, |results| {
        spawned_hand_out(mapped, &starts, results)
    });
    let id_bytes = ids.len() * 4;
    let line = |what: &str, moved: usize, pool: f64, spawned: f64| {
        println!(
            "    {what}: pool {:.2} ms ({:.1} GB/s), threads spawned per copy {:.2} ms ({:.1} GB/s)",
            pool * 1e3,
            gb_per_s(moved, pool),
            spawned * 1e3,
            gb_per_s(moved, spawned)
        );
    };
    println!(
        "  host copies alone ({} pool threads; the pipeline overlaps them with the kernels):",
        host_copy::copy_threads()
    );
    line(
        "gather of the text, ordinary → host-mapped pinned",
        bytes,
        gather_pool,
        gather_spawned,
    );
    line(
        "hand-out of the ids, host-mapped → reused vectors",
        id_bytes,
        reused_pool,
        reused_spawned,
    );
    line(
        "hand-out of the ids, host-mapped → new vectors",
        id_bytes,
        new_pool,
        new_spawned,
    );
    println!(
        "    host floor of the batch (gather + hand-out into reused vectors, on the pool, not overlapped): {:.2} ms, {:.2} GB/s of text",
        (gather_pool + reused_pool) * 1e3,
        gb_per_s(bytes, gather_pool + reused_pool)
    );
}

/// Threads of the spawned-per-copy baseline: what the pipeline used before
/// the pool (all of the host's threads, at least 256 KiB each).
fn spawned_threads(bytes: usize) -> usize {
    std::thread::available_parallelism()
        .map_or(1, |threads| threads.get())
        .min(bytes / (256 << 10))
        .max(1)
}

/// The baseline gather: consecutive runs of whole texts of about equal bytes,
/// one thread spawned per run for this copy.
fn spawned_gather(out: &mut [u8], texts: &[&[u8]]) {
    let share = out.len().div_ceil(spawned_threads(out.len()));
    std::thread::scope(|scope| {
        let mut rest = out;
        let mut first = 0;
        while first < texts.len() {
            let mut last = first;
            let mut run_bytes = 0;
            while last < texts.len() && (run_bytes < share || last == first) {
                run_bytes += texts[last].len();
                last += 1;
            }
            let run = &texts[first..last];
            let (mine, after) = std::mem::take(&mut rest).split_at_mut(run_bytes);
            rest = after;
            scope.spawn(move || {
                let mut at = 0;
                for text in run {
                    mine[at..at + text.len()].copy_from_slice(text);
                    at += text.len();
                }
            });
            first = last;
        }
    });
}

/// The baseline hand-out: equal numbers of documents per thread, one thread
/// spawned per share for this copy.
fn spawned_hand_out(ids: &[u32], starts: &[u32], results: &mut [Vec<u32>]) {
    let per = results
        .len()
        .div_ceil(spawned_threads(ids.len() * 4))
        .max(1);
    std::thread::scope(|scope| {
        for (index, part) in results.chunks_mut(per).enumerate() {
            scope.spawn(move || {
                for (offset, result) in part.iter_mut().enumerate() {
                    let document = index * per + offset;
                    result.clear();
                    result.extend_from_slice(
                        &ids[starts[document] as usize..starts[document + 1] as usize],
                    );
                }
            });
        }
    });
}

/// When each chunk's stages happened, from the call's start (ms): where the
/// batch's time goes between the host's work and the device's. `kind` starts
/// each line (which call's chunks).
fn print_timeline(kind: &str, timings: &[ChunkTimings]) {
    for (index, chunk) in timings.iter().enumerate() {
        let at = |ns: u64| (chunk.began_ns + ns) as f64 / 1e6;
        println!(
            "    {kind}chunk {index} timeline, ms: staging {:.2}, gathered {:.2}, submitted {:.2}, steps done {:.2}, hand-out began {:.2}, ids handed out {:.2} (their copy {:.2})",
            at(0),
            at(chunk.staged_ns),
            at(chunk.submit_ns),
            at(chunk.ready_ns),
            at(chunk.wall_ns.saturating_sub(chunk.scatter_ns)),
            at(chunk.wall_ns),
            chunk.copy_ns as f64 / 1e6
        );
    }
}
