//! The raw-driver floor: the same work a dispatch does, done with nothing but
//! prebuilt driver calls, so every bench and instrument can quote its figures as a
//! ratio to the floor measured in the same run on the same machine.
//!
//! It loads the program's PTX once, allocates its buffers once and prebuilds the
//! parameter array; each measured operation is then only the driver calls named
//! in its doc comment. This is the "launch + async DtoH + one synchronize" row of
//! the raw-driver measurements on the H200, reproduced live.
//!
//! Three floors every dispatch figure is quoted against, measured in
//! the same run:
//!
//! - the physical floor, [`RawFloor::launch_sync`]: one launch, one synchronize,
//!   no bytes back;
//! - the best raw readback, [`RawFloor::launch_mapped_sync`]: the plain kernel's
//!   outputs bound straight to host-mapped memory (the raw measurements' "kernel writes host-mapped
//!   pinned memory" column), and beside it [`RawFloor::launch_result_abi_sync`], the
//!   backend's own mechanism with nothing else around it (the result-ABI kernel's
//!   last thread copying the outputs into a mapped area);
//! - the per-output-copy floor, [`RawFloor::launch_async_reads_sync`]: one async
//!   16-byte copy per output and one synchronize (what dispatches did before).
//!
//! [`ReadbackSweep`] measures the size crossover between the mapped route and one
//! DMA copy (`readback::MAPPED_RANGE_MAX_BYTES`). [`LaunchParameterSweep`] and
//! [`EpilogueAnatomy`] take a launch apart (parameter bytes; each instruction the
//! result ABI adds), and [`RawFloor::launch_result_abi_flags_sync`] the result ABI's
//! parts: on the H200 (2026-12-01) 8 to 4,000 parameter bytes cost the same, every
//! single epilogue instruction under 0.5 µs, while 16 unguarded descriptor slots cost
//! 1.5 µs with no range described (now guarded; see `codegen::ptx`).

use std::ffi::c_void;

use crate::codegen;
use crate::config::CodegenOptions;
use crate::ir::Program;

use super::driver::{self, DeviceMemory, Event, LoadedModule, MappedMemory, PinnedMemory, Stream};
use super::readback::{ResultArea, ResultParams, RESULT_AREA_BYTES, STAMP_BYTES};
use super::stream_ops::LaunchParameters;
use super::{BackendError, CudaBackend};
use super::{ParameterArray, PerBinding};

/// Prebuilt launch of one program over its own device buffers.
pub struct RawFloor {
    // Field order matters for drop: buffers and module before the backend's context.
    module: LoadedModule,
    stream: Stream,
    buffers: Vec<DeviceMemory>,
    staging: PinnedMemory,
    /// Outer start (unused when nothing precedes the launch), inner start, inner end,
    /// outer end: the timed dispatch's events.
    events: [Event; 4],
    /// Boxed so the pointers in `params` stay valid when the floor moves (likewise
    /// the mapped and result-ABI parameter sets below).
    parameters: Box<LaunchParameters>,
    params: ParameterArray,
    grid: [u32; 3],
    block: [u32; 3],
    /// Host-mapped memory the output buffers are bound to in `mapped_params`.
    mapped: MappedMemory,
    mapped_parameters: Box<LaunchParameters>,
    mapped_params: ParameterArray,
    /// The result-ABI build of the same program, its area and parameters (one
    /// descriptor per output buffer after the first binding, 16 bytes each).
    result_module: LoadedModule,
    result_area: ResultArea,
    result_parameters: Box<LaunchParameters>,
    result_params: ParameterArray,
    backend: CudaBackend,
}

impl RawFloor {
    /// Prepare `program` (a valid program with no workgroup reductions) for raw
    /// launches over `workgroups`, each global buffer sized as declared (runtime
    /// buffers get 16 bytes).
    pub fn new(
        backend: &CudaBackend,
        program: &Program,
        workgroups: [u32; 3],
    ) -> Result<RawFloor, BackendError> {
        let inner = &backend.inner;
        inner.check_alive()?;
        inner.bind()?;
        let caps = backend.caps();
        // The plain ABI and the result ABI of the same program, emitted and loaded the
        // same way.
        let load = |emit: fn(&Program, &CodegenOptions, u32, u32) -> Result<String, _>| {
            let ptx = emit(
                program,
                &CodegenOptions::default(),
                caps.ptx_target_sm(),
                caps.warp_size,
            )
            .map_err(|error| BackendError::Codegen {
                program: program.display_name(),
                error,
            })?;
            LoadedModule::load(&ptx, &codegen::entry_symbol(program), None).map_err(|error| {
                BackendError::module_load(program.display_name(), caps.ptx_target_sm(), error)
            })
        };
        let module = load(codegen::program_to_ptx)?;
        let stream =
            Stream::new().map_err(|e| BackendError::driver("creating the floor stream", e))?;
        let globals = program.global_buffers();
        let mut buffers = Vec::new();
        let mut lengths = Vec::new();
        for b in &globals {
            let bytes = b.static_size_bytes().unwrap_or(16);
            buffers.push(
                DeviceMemory::allocate(bytes)
                    .map_err(|e| BackendError::driver("allocating floor buffers", e))?,
            );
            lengths.push((bytes / b.elem.size_bytes() as u64) as u32);
        }
        let counts: PerBinding<u32> = lengths.into_iter().collect();
        let mut parameters = Box::new(LaunchParameters {
            addresses: buffers.iter().map(|b| b.address()).collect(),
            counts: counts.clone(),
            results: None,
            scalars: Default::default(),
        });
        let params = parameters.pointer_array();
        let staging = PinnedMemory::allocate(64 * 1024)
            .map_err(|e| BackendError::driver("allocating floor staging", e))?;
        let event = || Event::new().map_err(|e| BackendError::driver("creating floor events", e));
        let events = [event()?, event()?, event()?, event()?];

        // Outputs bound to mapped memory: binding 0 (the fixture's input) stays in
        // device memory, every other buffer gets 256 mapped bytes of its own.
        let mapped = MappedMemory::allocate(256 * globals.len().max(1))
            .map_err(|e| BackendError::driver("allocating floor mapped memory", e))?;
        let mut mapped_parameters = Box::new(LaunchParameters {
            addresses: buffers
                .iter()
                .enumerate()
                .map(|(i, b)| {
                    if i == 0 || b.size() > 256 {
                        b.address()
                    } else {
                        mapped.device_address(256 * i)
                    }
                })
                .collect(),
            counts: counts.clone(),
            results: None,
            scalars: Default::default(),
        });
        let mapped_params = mapped_parameters.pointer_array();

        let result_module = load(codegen::program_to_ptx_with_results)?;
        let result_area = ResultArea::new()
            .map_err(|e| BackendError::driver("allocating the floor result area", e))?;
        let mut results = result_area.params();
        for (i, b) in buffers.iter().enumerate().skip(1) {
            let offset = (STAMP_BYTES + 16 * (i - 1)) as u32;
            let memory = b.address()..b.address() + b.size();
            results.describe(b.address(), 16.min(b.size() as u32), offset, memory);
        }
        let mut result_parameters = Box::new(LaunchParameters {
            addresses: parameters.addresses.clone(),
            counts,
            results: Some(results),
            scalars: Default::default(),
        });
        let result_params = result_parameters.pointer_array();
        Ok(RawFloor {
            module,
            stream,
            buffers,
            staging,
            events,
            parameters,
            params,
            grid: workgroups,
            block: program.workgroup_size(),
            mapped,
            mapped_parameters,
            mapped_params,
            result_module,
            result_area,
            result_parameters,
            result_params,
            backend: backend.clone(),
        })
    }

    /// The physical floor: launch + one synchronize, nothing read back.
    pub fn launch_sync(&mut self) -> Result<u64, BackendError> {
        self.launch()?;
        self.sync()?;
        Ok(1)
    }

    /// The best raw readback: the plain kernel with its outputs bound to host-mapped
    /// memory (it writes them there itself), launch + one synchronize, then the host
    /// reads 8 bytes of the first output.
    pub fn launch_mapped_sync(&mut self) -> Result<u64, BackendError> {
        // SAFETY: mapped_params points into self.mapped_parameters (boxed, stable),
        // one per parameter in codegen's order; every address is a live device buffer
        // or 256 bytes of self.mapped (each output holds ≤ 256 bytes).
        unsafe {
            driver::launch(
                &self.module,
                self.grid,
                self.block,
                &self.stream,
                &mut self.mapped_params,
                false,
            )
        }
        .map_err(|e| BackendError::driver("raw floor mapped launch", e))?;
        self.sync()?;
        let first = self.mapped_parameters.addresses.len().min(2) - 1;
        Ok(u64::from_le_bytes(
            self.mapped
                .slice(256 * first, 8)
                .try_into()
                .unwrap_or([0; 8]),
        ))
    }

    /// The backend's mechanism and nothing else: the result-ABI kernel, whose last
    /// thread stamps and copies `reads` 16-byte outputs (at most 16) into the mapped
    /// result area; launch + one synchronize, then the host reads the end stamp.
    pub fn launch_result_abi_sync(&mut self, reads: usize) -> Result<u64, BackendError> {
        self.launch_result_abi_flags_sync(
            super::readback::FLAG_START_STAMP | super::readback::FLAG_END_STAMP,
            reads,
        )
    }

    /// [`RawFloor::launch_result_abi_sync`] with the launch flags given (0: neither
    /// stamp, so the epilogue only counts finished threads), to take the mechanism's
    /// cost apart: the counting, the stamps and each range's copy.
    pub fn launch_result_abi_flags_sync(
        &mut self,
        flags: u32,
        reads: usize,
    ) -> Result<u64, BackendError> {
        self.launch_result_abi_flags(flags, reads)?;
        self.sync()?;
        let stamps = self.result_area.stamps().unwrap_or((0, 0));
        Ok(stamps.1 ^ stamps.0)
    }

    /// The plain launch alone (no synchronize): with [`RawFloor::synchronize`], to
    /// time the launch call and the wait apart.
    pub fn launch_only(&mut self) -> Result<(), BackendError> {
        self.launch()
    }

    /// One synchronize of the floor's stream.
    pub fn synchronize(&self) -> Result<(), BackendError> {
        self.sync()
    }

    /// The result-ABI launch of [`RawFloor::launch_result_abi_flags_sync`] alone (no
    /// synchronize); follow with [`RawFloor::synchronize`].
    pub fn launch_result_abi_flags(
        &mut self,
        flags: u32,
        reads: usize,
    ) -> Result<(), BackendError> {
        self.result_area
            .arm(&self.stream)
            .map_err(|e| BackendError::driver("raw floor result arming", e))?;
        if let Some(results) = &self.result_parameters.results {
            results.set_raw(flags, reads as u32);
        }
        // SAFETY: result_params points into the boxed self.result_parameters
        // (stable), in the result ABI's order; every
        // descriptor names 16 bytes of a live floor buffer and a destination inside
        // the area; the area lives as long as self.
        unsafe {
            driver::launch(
                &self.result_module,
                self.grid,
                self.block,
                &self.stream,
                &mut self.result_params,
                false,
            )
        }
        .map_err(|e| BackendError::driver("raw floor result-ABI launch", e))?;
        if !self.result_area.is_mapped() {
            return Err(BackendError::Launch {
                message: "Fix: this device cannot map host memory, so the result-ABI floor does not apply"
                    .to_string(),
            });
        }
        Ok(())
    }

    /// The kernel time the result-ABI floor's last launch stamped (end − start), in
    /// ns; 0 before any.
    pub fn result_abi_kernel_ns(&self) -> u64 {
        super::readback::stamp_kernel_ns(self.result_area.stamps())
    }

    fn launch(&mut self) -> Result<(), BackendError> {
        // SAFETY: params points into self.parameters (boxed, so its addresses are
        // stable), one per kernel parameter in codegen's order; the buffers live as
        // long as self.
        unsafe {
            driver::launch(
                &self.module,
                self.grid,
                self.block,
                &self.stream,
                &mut self.params,
                false,
            )
        }
        .map_err(|e| BackendError::driver("raw floor launch", e))
    }

    fn sync(&self) -> Result<(), BackendError> {
        self.stream
            .synchronize()
            .map_err(|e| BackendError::driver("raw floor synchronize", e))
    }

    fn async_reads(&mut self, reads: usize) -> Result<(), BackendError> {
        for i in 0..reads {
            let source = self.buffers[i % self.buffers.len()].address();
            // SAFETY: 16 bytes at offset 16*i of 64 KiB staging (reads ≤ 4096), and
            // every floor buffer holds at least 16 bytes.
            unsafe {
                driver::copy_to_host_async(
                    self.staging.address((16 * i) % 65_536),
                    source,
                    16,
                    &self.stream,
                )
            }
            .map_err(|e| BackendError::driver("raw floor readback", e))?;
        }
        Ok(())
    }

    /// `cuLaunchKernel` issue only, params prebuilt; synchronizes every 256 calls so
    /// the queue never fills (amortised into the figure, as in the raw measurements' row).
    pub fn launch_issue_only(&mut self, calls: u64) -> Result<u64, BackendError> {
        for i in 0..calls {
            self.launch()?;
            if i % 256 == 255 {
                self.sync()?;
            }
        }
        self.sync()?;
        Ok(calls)
    }

    /// `cuStreamSynchronize` on an idle stream.
    pub fn idle_synchronize(&self) -> Result<u64, BackendError> {
        self.sync()?;
        Ok(1)
    }

    /// Launch + `reads` async 16-byte device→host copies + one synchronize: the
    /// floor of a dispatch over device buffers that reads back `reads` outputs.
    pub fn launch_async_reads_sync(&mut self, reads: usize) -> Result<u64, BackendError> {
        self.launch()?;
        self.async_reads(reads)?;
        self.sync()?;
        Ok(u64::from_le_bytes(
            self.staging.slice(0, 8).try_into().unwrap_or([0; 8]),
        ))
    }

    /// The timed floor: what a request with `Timing::EventWindow` asks of the driver, and nothing
    /// else — outer and inner event pairs around the launch and the `reads` async
    /// copies, one synchronize, two elapsed-time queries. The gap between this and
    /// [`RawFloor::launch_async_reads_sync`] is the price of device timing itself.
    pub fn launch_timed_async_reads_sync(&mut self, reads: usize) -> Result<u64, BackendError> {
        let record = |event: &Event, stream: &Stream| {
            event
                .record(stream)
                .map_err(|e| BackendError::driver("raw floor event record", e))
        };
        // All device buffers: nothing precedes the launch, so one event opens both windows
        // (as the backend does).
        record(&self.events[1], &self.stream)?;
        self.launch()?;
        record(&self.events[2], &self.stream)?;
        self.async_reads(reads)?;
        record(&self.events[3], &self.stream)?;
        self.sync()?;
        let window = Event::elapsed_ns(&self.events[1], &self.events[3])
            .map_err(|e| BackendError::driver("raw floor elapsed time", e))?;
        let kernel = Event::elapsed_ns(&self.events[1], &self.events[2])
            .map_err(|e| BackendError::driver("raw floor elapsed time", e))?;
        Ok(window ^ kernel)
    }

    /// Launch + synchronize + `reads` blocking 16-byte copies.
    pub fn launch_sync_blocking_reads(&mut self, reads: usize) -> Result<u64, BackendError> {
        self.launch()?;
        self.sync()?;
        self.blocking_reads(reads)
    }

    /// `reads` blocking 16-byte copies (readback strategy, blocking arm).
    pub fn blocking_reads(&mut self, reads: usize) -> Result<u64, BackendError> {
        let mut out = [0u8; 16];
        for i in 0..reads {
            let source = self.buffers[i % self.buffers.len()].address();
            // SAFETY: every floor buffer holds at least 16 bytes.
            unsafe { driver::copy_to_host_blocking_raw(&mut out, source) }
                .map_err(|e| BackendError::driver("raw floor blocking readback", e))?;
        }
        Ok(u64::from_le_bytes(out[..8].try_into().unwrap_or([0; 8])))
    }

    /// `reads` async 16-byte copies + one synchronize (readback strategy, async arm).
    pub fn async_reads_one_sync(&mut self, reads: usize) -> Result<u64, BackendError> {
        self.async_reads(reads)?;
        self.sync()?;
        Ok(u64::from_le_bytes(
            self.staging.slice(0, 8).try_into().unwrap_or([0; 8]),
        ))
    }

    /// Bind the context (for a thread that did not create the floor).
    pub fn bind(&self) -> Result<(), BackendError> {
        self.backend.inner.bind()
    }

    /// Bytes the floor's result-ABI area returned at `offset` (tests compare them with
    /// the plain kernel's outputs).
    pub fn result_bytes(&self, offset: usize, len: usize) -> Vec<u8> {
        self.result_area.bytes(offset, len).to_vec()
    }

    /// Bytes the per-copy floor staged at `offset` (copy `i` lands at `16 * i`).
    pub fn staged_bytes(&self, offset: usize, len: usize) -> Vec<u8> {
        self.staging.slice(offset, len).to_vec()
    }

    /// The first `len` bytes the mapped floor's kernel wrote for buffer `index`.
    pub fn mapped_output(&self, index: usize, len: usize) -> Vec<u8> {
        self.mapped.slice(256 * index, len).to_vec()
    }

    /// Number of parameters of the prebuilt launch.
    pub fn parameter_count(&self) -> usize {
        self.parameters.addresses.len() + self.parameters.counts.len()
    }
}

/// The size sweep behind `readback::MAPPED_RANGE_MAX_BYTES`: one fill kernel
/// (`out[i] = i`, 256 threads per block) over a buffer of `bytes`, its bytes then
/// reaching the host three ways: one DMA copy, the result ABI's last-thread copy into
/// the mapped area (at most the area's capacity), and the plain kernel writing
/// host-mapped memory directly (every thread its own word).
pub struct ReadbackSweep {
    plain: LoadedModule,
    results: LoadedModule,
    stream: Stream,
    device: DeviceMemory,
    mapped: MappedMemory,
    staging: PinnedMemory,
    area: ResultArea,
    capacity: usize,
    backend: CudaBackend,
}

impl ReadbackSweep {
    /// Largest size the area route can carry.
    pub const AREA_CAPACITY: usize = RESULT_AREA_BYTES - STAMP_BYTES;

    /// Prepare buffers for sizes up to `max_bytes` (a multiple of 4).
    pub fn new(backend: &CudaBackend, max_bytes: usize) -> Result<ReadbackSweep, BackendError> {
        use crate::ir::{Access, Axis, BufferCount, ElemType, Expr};
        let inner = &backend.inner;
        inner.check_alive()?;
        inner.bind()?;
        let program = Program::builder([256, 1, 1])
            .entry_op_id("readback_sweep_fill")
            .buffer(
                "out",
                0,
                Access::ReadWrite,
                ElemType::U32,
                BufferCount::Runtime,
            )
            .body(|b| {
                let i = b.let_("i", Expr::global_id(Axis::X));
                b.if_(i.clone().less_than(Expr::length("out")), |b| {
                    b.store("out", i.clone(), i.clone());
                });
            })
            .build();
        let caps = backend.caps();
        let load = |results: bool| -> Result<LoadedModule, BackendError> {
            let options = CodegenOptions::default();
            let ptx = if results {
                codegen::program_to_ptx_with_results(
                    &program,
                    &options,
                    caps.ptx_target_sm(),
                    caps.warp_size,
                )
            } else {
                codegen::program_to_ptx(&program, &options, caps.ptx_target_sm(), caps.warp_size)
            }
            .map_err(|error| BackendError::Codegen {
                program: program.display_name(),
                error,
            })?;
            LoadedModule::load(&ptx, &codegen::entry_symbol(&program), None).map_err(|error| {
                BackendError::module_load(program.display_name(), caps.ptx_target_sm(), error)
            })
        };
        let failed = |what: &'static str| move |e| BackendError::driver(what, e);
        Ok(ReadbackSweep {
            plain: load(false)?,
            results: load(true)?,
            stream: Stream::new().map_err(failed("creating the sweep stream"))?,
            device: DeviceMemory::allocate(max_bytes as u64)
                .map_err(failed("allocating the sweep buffer"))?,
            mapped: MappedMemory::allocate(max_bytes)
                .map_err(failed("allocating sweep mapped memory"))?,
            staging: PinnedMemory::allocate(max_bytes)
                .map_err(failed("allocating sweep staging"))?,
            area: ResultArea::new().map_err(failed("allocating the sweep result area"))?,
            capacity: max_bytes,
            backend: backend.clone(),
        })
    }

    fn grid(bytes: usize) -> [u32; 3] {
        [((bytes / 4).div_ceil(256)).max(1) as u32, 1, 1]
    }

    fn check(&self, bytes: usize) -> Result<(), BackendError> {
        if bytes == 0 || !bytes.is_multiple_of(4) || bytes > self.capacity {
            return Err(BackendError::bad_input(format!(
                "Fix: sweep sizes must be positive multiples of 4 up to the {} bytes prepared; got {bytes}",
                self.capacity
            )));
        }
        Ok(())
    }

    fn run(
        &mut self,
        module_is_results: bool,
        address: u64,
        bytes: usize,
        results: Option<&ResultParams>,
    ) -> Result<(), BackendError> {
        let mut address = address;
        let mut length = (bytes / 4) as u32;
        let mut params: smallvec::SmallVec<[*mut c_void; 8]> = smallvec::SmallVec::new();
        params.push(&mut address as *mut u64 as *mut c_void);
        params.push(&mut length as *mut u32 as *mut c_void);
        if let Some(results) = results {
            results.push_pointers(&mut params);
        }
        let module = if module_is_results {
            &self.results
        } else {
            &self.plain
        };
        // SAFETY: params points at the locals above (and `results`, borrowed for the
        // call), in the kernel's parameter order; `address` holds at least `bytes`
        // (checked against the capacity), and any descriptor names `bytes` of the
        // device buffer and a destination inside the area.
        unsafe {
            driver::launch(
                module,
                Self::grid(bytes),
                [256, 1, 1],
                &self.stream,
                &mut params,
                false,
            )
        }
        .map_err(|e| BackendError::driver("sweep launch", e))
    }

    fn sync(&self) -> Result<(), BackendError> {
        self.stream
            .synchronize()
            .map_err(|e| BackendError::driver("sweep synchronize", e))
    }

    /// Fill `bytes` of device memory, one async DMA copy of them, one synchronize.
    pub fn copy_sweep(&mut self, bytes: usize) -> Result<u64, BackendError> {
        self.check(bytes)?;
        let device = self.device.address();
        self.run(false, device, bytes, None)?;
        // SAFETY: staging and the device buffer hold `capacity` ≥ bytes; staging is
        // read only after the synchronize.
        unsafe { driver::copy_to_host_async(self.staging.address(0), device, bytes, &self.stream) }
            .map_err(|e| BackendError::driver("sweep copy", e))?;
        self.sync()?;
        Ok(u64::from(self.staging.slice(bytes - 4, 1)[0]))
    }

    /// Fill `bytes` of device memory with the result-ABI kernel, whose last thread
    /// copies them into the mapped area; one synchronize. At most
    /// [`ReadbackSweep::AREA_CAPACITY`] bytes.
    pub fn area_sweep(&mut self, bytes: usize) -> Result<u64, BackendError> {
        self.check(bytes)?;
        if bytes > Self::AREA_CAPACITY {
            return Err(BackendError::bad_input(format!(
                "Fix: the result area carries at most {} bytes; sweep the area route below that",
                Self::AREA_CAPACITY
            )));
        }
        self.area
            .arm(&self.stream)
            .map_err(|e| BackendError::driver("sweep arming", e))?;
        let mut values = self.area.params();
        let device = self.device.address();
        let memory = device..device + self.device.size();
        values.describe(device, bytes as u32, STAMP_BYTES as u32, memory);
        values.set_launch(0, 1);
        self.run(true, device, bytes, Some(&values))?;
        self.sync()?;
        Ok(u64::from(self.area.bytes(STAMP_BYTES + bytes - 4, 1)[0]))
    }

    /// The plain fill kernel writing `bytes` of host-mapped memory directly; one
    /// synchronize.
    pub fn mapped_write_sweep(&mut self, bytes: usize) -> Result<u64, BackendError> {
        self.check(bytes)?;
        let mapped = self.mapped.device_address(0);
        self.run(false, mapped, bytes, None)?;
        self.sync()?;
        Ok(u64::from(self.mapped.slice(bytes - 4, 1)[0]))
    }

    /// Bytes the last area sweep delivered (tests compare them with the copy route).
    pub fn area_bytes(&self, bytes: usize) -> Vec<u8> {
        self.area.bytes(STAMP_BYTES, bytes).to_vec()
    }

    /// Bytes the last copy sweep delivered.
    pub fn copied_bytes(&self, bytes: usize) -> Vec<u8> {
        self.staging.slice(0, bytes).to_vec()
    }

    /// Bytes the last mapped-write sweep delivered.
    pub fn mapped_bytes(&self, bytes: usize) -> Vec<u8> {
        self.mapped.slice(0, bytes).to_vec()
    }

    /// Bind the context (for a thread that did not create the sweep).
    pub fn bind(&self) -> Result<(), BackendError> {
        self.backend.inner.bind()
    }
}

/// What the launch call itself costs per byte of kernel parameters: one trivial
/// kernel per size in [`LaunchParameterSweep::SIZES`], taking an output address and
/// a parameter block of that many bytes, whose one thread stores the block's last
/// word. Launch + one synchronize each. The result ABI's 256-byte descriptor table
/// travels in the parameters; this sweep says whether that size costs anything.
pub struct LaunchParameterSweep {
    modules: Vec<(usize, LoadedModule)>,
    stream: Stream,
    output: DeviceMemory,
    block: Box<[u64; 512]>,
    backend: CudaBackend,
}

impl LaunchParameterSweep {
    /// Parameter block sizes swept, in bytes (plus the 8-byte output address), each
    /// with the byte offset where the kernel starts reading and how many u64 words
    /// it reads (and folds into its one store).
    pub const SIZES: [(usize, usize, usize); 12] = [
        (8, 0, 1),
        (256, 248, 1),
        (512, 504, 1),
        (1024, 1016, 1),
        (4000, 3992, 1),
        (256, 0, 32),
        (512, 0, 32),
        (512, 256, 32),
        (1024, 768, 32),
        (4000, 3744, 32),
        (512, 256, 8),
        (512, 256, 16),
    ];

    /// Load one module per size.
    pub fn new(backend: &CudaBackend) -> Result<LaunchParameterSweep, BackendError> {
        let inner = &backend.inner;
        inner.check_alive()?;
        inner.bind()?;
        let sm = backend.caps().ptx_target_sm();
        let failed = |what: &'static str| move |e| BackendError::driver(what, e);
        let mut modules = Vec::with_capacity(Self::SIZES.len());
        for &(size, first, words) in &Self::SIZES {
            let loads: String = (0..words)
                .map(|w| {
                    format!(
                        "ld.param.u64 %rd2, [block+{}];\nxor.b64 %rd1, %rd1, %rd2;\n",
                        first + 8 * w
                    )
                })
                .collect();
            let ptx = format!(
                ".version {version}\n.target sm_{sm}\n.address_size 64\n\
                 .visible .entry vyre_parameter_sweep(.param .u64 out, .param .align 8 .b8 block[{size}])\n{{\n\
                 .reg .b64 %rd<3>;\n\
                 ld.param.u64 %rd0, [out];\n\
                 cvta.to.global.u64 %rd0, %rd0;\n\
                 mov.u64 %rd1, 0;\n\
                 {loads}\
                 st.global.u64 [%rd0], %rd1;\n\
                 ret;\n}}\n",
                version = codegen::ptx::ptx_version(sm, false),
            );
            let module = load_hand_written(
                &ptx,
                "vyre_parameter_sweep",
                format!("parameter sweep kernel ({size} parameter bytes)"),
                sm,
            )?;
            modules.push((size, module));
        }
        Ok(LaunchParameterSweep {
            modules,
            stream: Stream::new().map_err(failed("creating the parameter sweep stream"))?,
            output: DeviceMemory::allocate(8)
                .map_err(failed("allocating the parameter sweep output"))?,
            block: Box::new([7; 512]),
            backend: backend.clone(),
        })
    }

    /// Launch the kernel of [`LaunchParameterSweep::SIZES`]`[index]` once, one
    /// synchronize.
    pub fn launch_sync(&mut self, index: usize) -> Result<u64, BackendError> {
        let Some((size, module)) = self.modules.get(index) else {
            return Err(BackendError::bad_input(format!(
                "Fix: the parameter sweep has {} sizes; index {index} is past them",
                self.modules.len()
            )));
        };
        let mut out = self.output.address();
        self.block[size / 8 - 1] = index as u64;
        let mut params = [
            &mut out as *mut u64 as *mut c_void,
            self.block.as_mut_ptr() as *mut c_void,
        ];
        // SAFETY: the kernel takes a u64 and a `size`-byte block; `out` is a local
        // and `block` holds 4096 bytes ≥ size, both alive for the call; the output
        // allocation (8 bytes) outlives the synchronize inside.
        unsafe { launch_one_thread_sync(module, &self.stream, &mut params, "parameter sweep") }?;
        Ok(*size as u64)
    }

    /// Bind the context (for a thread that did not create the sweep).
    pub fn bind(&self) -> Result<(), BackendError> {
        self.backend.inner.bind()
    }
}

/// What each instruction the result ABI's epilogue adds costs a one-thread kernel:
/// launch + one synchronize of hand-written kernels that each do one of them
/// (reading `%globaltimer`, a `red.min` into device memory, an acquire-release
/// atomic, a GPU-scope fence, 16 bytes stored into host-mapped memory), against an
/// empty kernel. The dispatch bench prints the table.
pub struct EpilogueAnatomy {
    /// Name, module, and what the kernel's first parameter points at.
    kernels: Vec<(String, LoadedModule, Operand)>,
    stream: Stream,
    scratch: DeviceMemory,
    table: DeviceMemory,
    _separate: Vec<DeviceMemory>,
    mapped: MappedMemory,
    backend: CudaBackend,
}

/// What an anatomy kernel's first parameter points at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Operand {
    /// 8 KiB of device scratch.
    Scratch,
    /// A table of the addresses of 16 separate 256-byte allocations.
    Table,
}

impl EpilogueAnatomy {
    /// The kernels' names and bodies; `%rd0` holds a device scratch address (16
    /// bytes), `%rd1` a host-mapped one.
    const BODIES: [(&'static str, &'static str); 9] = [
        ("empty kernel", ""),
        ("2 × %globaltimer → device memory", "mov.u64 %rd2, %globaltimer;\nmov.u64 %rd3, %globaltimer;\nst.global.v2.u64 [%rd0], {%rd2, %rd3};\n"),
        ("2 × %globaltimer → mapped memory", "mov.u64 %rd2, %globaltimer;\nmov.u64 %rd3, %globaltimer;\nst.global.v2.u64 [%rd1], {%rd2, %rd3};\n"),
        ("16 B stored into mapped memory", "mov.u64 %rd2, 5;\nst.global.v2.u64 [%rd1], {%rd2, %rd2};\n"),
        ("red.min.u64 into device memory", "mov.u64 %rd2, 5;\nred.relaxed.gpu.global.min.u64 [%rd0+8], %rd2;\n"),
        ("red.min, then reset stores", "mov.u64 %rd2, 5;\nred.relaxed.gpu.global.min.u64 [%rd0+8], %rd2;\nmov.u64 %rd3, -1;\nst.global.u64 [%rd0+8], %rd3;\n"),
        ("atom.acq_rel.gpu add (result stored)", "mov.u64 %rd2, 1;\natom.acq_rel.gpu.global.add.u64 %rd3, [%rd0], %rd2;\nst.global.u64 [%rd0+8], %rd3;\n"),
        ("fence.acq_rel.gpu", "fence.acq_rel.gpu;\n"),
        ("load 16 B of device memory → mapped", "ld.relaxed.gpu.global.v2.u64 {%rd2, %rd3}, [%rd0];\nst.global.v2.u64 [%rd1], {%rd2, %rd3};\n"),
    ];

    /// Load every kernel.
    pub fn new(backend: &CudaBackend) -> Result<EpilogueAnatomy, BackendError> {
        let inner = &backend.inner;
        inner.check_alive()?;
        inner.bind()?;
        let sm = backend.caps().ptx_target_sm();
        let failed = |what: &'static str| move |e| BackendError::driver(what, e);
        let mut kernels = Vec::with_capacity(Self::BODIES.len());
        // Code size: 640 predicated-off loads (what 16 unrolled range copies execute
        // when no range is described), and the same code jumped over.
        let predicated: String = (0..640)
            .map(|i| format!("@%p0 ld.global.u32 %r0, [%rd0+{}];\n", 4 * (i % 4)))
            .collect();
        let stores = |stride: usize, vector: bool| -> String {
            (0..16)
                .map(|i| {
                    if vector {
                        format!(
                            "st.global.v4.u32 [%rd1+{}], {{%r0, %r0, %r0, %r0}};\n",
                            stride * i
                        )
                    } else {
                        (0..4)
                            .map(|w| format!("st.global.u32 [%rd1+{}], %r0;\n", stride * i + 4 * w))
                            .collect()
                    }
                })
                .collect()
        };
        let loads_to = |strong: bool, mapped: bool| -> String {
            let kind = if strong {
                "ld.relaxed.gpu.global"
            } else {
                "ld.global"
            };
            let target = if mapped { "%rd1" } else { "%rd0" };
            let loads: String = (0..16)
                .map(|i| {
                    format!(
                        "{kind}.v4.u32 {{%v{a}, %v{b}, %v{c}, %v{d}}}, [%rd0+{}];\n",
                        256 * i,
                        a = 4 * i,
                        b = 4 * i + 1,
                        c = 4 * i + 2,
                        d = 4 * i + 3
                    )
                })
                .collect();
            let stores: String = (0..16)
                .map(|i| {
                    format!(
                        "st.global.v4.u32 [{target}+{}], {{%v{a}, %v{b}, %v{c}, %v{d}}};\n",
                        if mapped { 16 * i } else { 4096 + 16 * i },
                        a = 4 * i,
                        b = 4 * i + 1,
                        c = 4 * i + 2,
                        d = 4 * i + 3
                    )
                })
                .collect();
            format!(".reg .b32 %v<64>;\n{loads}{stores}")
        };
        // Loads from 16 separate allocations, whose addresses the kernel first reads
        // from a table (as the epilogue reads its descriptors).
        let separate = |words: bool| -> String {
            let per = if words { 4 } else { 1 };
            let mut text = String::from(".reg .b64 %a<16>;\n.reg .b32 %w<64>;\n");
            for i in 0..16 {
                text += &format!(
                    "ld.global.u64 %a{i}, [%rd0+{}];\ncvta.to.global.u64 %a{i}, %a{i};\n",
                    8 * i
                );
            }
            for i in 0..16 {
                for w in 0..per {
                    text += &format!(
                        "ld.relaxed.gpu.global.u32 %w{}, [%a{i}+{}];\n",
                        per * i + w,
                        4 * w
                    );
                }
            }
            for i in 0..16 * per {
                text += &format!("st.global.u32 [%rd1+{}], %w{i};\n", 4 * i);
            }
            text
        };
        let bodies = Self::BODIES
            .iter()
            .map(|(name, body)| (name.to_string(), body.to_string(), Operand::Scratch))
            .chain([
                (
                    "16 × v4 stores → mapped, contiguous".to_string(),
                    format!("mov.u32 %r0, 3;\n{}", stores(16, true)),
                    Operand::Scratch,
                ),
                (
                    "64 × u32 stores → mapped, contiguous".to_string(),
                    format!("mov.u32 %r0, 3;\n{}", stores(16, false)),
                    Operand::Scratch,
                ),
                (
                    "16 × v4 stores → mapped, 64-B stride".to_string(),
                    format!("mov.u32 %r0, 3;\n{}", stores(64, true)),
                    Operand::Scratch,
                ),
                (
                    "16 strong v4 loads (16 lines) → device".to_string(),
                    loads_to(true, false),
                    Operand::Scratch,
                ),
                (
                    "16 weak v4 loads (16 lines) → device".to_string(),
                    loads_to(false, false),
                    Operand::Scratch,
                ),
                (
                    "16 strong v4 loads → mapped contiguous".to_string(),
                    loads_to(true, true),
                    Operand::Scratch,
                ),
                (
                    "16 weak v4 loads → mapped contiguous".to_string(),
                    loads_to(false, true),
                    Operand::Scratch,
                ),
                (
                    "16 allocations via a table: 16 u32 loads → mapped".to_string(),
                    separate(false),
                    Operand::Table,
                ),
                (
                    "16 allocations via a table: 64 u32 loads → mapped".to_string(),
                    separate(true),
                    Operand::Table,
                ),
                (
                    "64 u32 loads (16 lines) → 64 u32 mapped stores".to_string(),
                    format!(
                        ".reg .b32 %w<64>;\n{}{}",
                        (0..64)
                            .map(|i| format!(
                                "ld.relaxed.gpu.global.u32 %w{i}, [%rd0+{}];\n",
                                256 * (i / 4) + 4 * (i % 4)
                            ))
                            .collect::<String>(),
                        (0..64)
                            .map(|i| format!("st.global.u32 [%rd1+{}], %w{i};\n", 4 * i))
                            .collect::<String>()
                    ),
                    Operand::Scratch,
                ),
                (
                    "16 device stores, then strong loads → mapped".to_string(),
                    format!(
                        "mov.u32 %r0, 3;\n{}{}",
                        (0..16)
                            .map(|i| format!("st.global.u32 [%rd0+{}], %r0;\n", 256 * i))
                            .collect::<String>(),
                        loads_to(true, true)
                    ),
                    Operand::Scratch,
                ),
            ])
            .chain([
                (
                    "640 predicated-off loads".to_string(),
                    format!("setp.eq.u64 %p0, %rd0, 0;\n{predicated}"),
                    Operand::Scratch,
                ),
                (
                    "the same 640 loads branched over".to_string(),
                    format!("setp.eq.u64 %p0, %rd0, 0;\n@!%p0 bra $L_end;\n{predicated}$L_end:\n"),
                    Operand::Scratch,
                ),
            ]);
        for (name, body, operand) in bodies {
            let ptx = format!(
                ".version {version}\n.target sm_{sm}\n.address_size 64\n\
                 .visible .entry vyre_epilogue_anatomy(.param .u64 scratch, .param .u64 mapped)\n{{\n\
                 .reg .b64 %rd<4>;\n.reg .b32 %r<1>;\n.reg .pred %p<1>;\n\
                 ld.param.u64 %rd0, [scratch];\ncvta.to.global.u64 %rd0, %rd0;\n\
                 ld.param.u64 %rd1, [mapped];\ncvta.to.global.u64 %rd1, %rd1;\n\
                 {body}ret;\n}}\n",
                version = codegen::ptx::ptx_version(sm, false),
            );
            let module = load_hand_written(
                &ptx,
                "vyre_epilogue_anatomy",
                format!("epilogue anatomy kernel ({name})"),
                sm,
            )?;
            kernels.push((name, module, operand));
        }
        let separate_memory = (0..16)
            .map(|_| DeviceMemory::allocate(256))
            .collect::<Result<Vec<_>, _>>()
            .map_err(failed("allocating anatomy buffers"))?;
        let table = DeviceMemory::allocate(128).map_err(failed("allocating the anatomy table"))?;
        let addresses: Vec<u8> = separate_memory
            .iter()
            .flat_map(|m| m.address().to_le_bytes())
            .collect();
        driver::copy_to_device_blocking(&table, &addresses)
            .map_err(failed("writing the anatomy table"))?;
        Ok(EpilogueAnatomy {
            kernels,
            table,
            _separate: separate_memory,
            stream: Stream::new().map_err(failed("creating the anatomy stream"))?,
            scratch: DeviceMemory::allocate(8192).map_err(failed("allocating anatomy scratch"))?,
            mapped: MappedMemory::allocate(4096)
                .map_err(failed("allocating anatomy mapped memory"))?,
            backend: backend.clone(),
        })
    }

    /// The kernels' names, in [`EpilogueAnatomy::launch_sync`]'s index order.
    pub fn names(&self) -> Vec<String> {
        self.kernels
            .iter()
            .map(|(name, _, _)| name.clone())
            .collect()
    }

    /// Launch kernel `index` (one thread) and synchronize.
    pub fn launch_sync(&mut self, index: usize) -> Result<u64, BackendError> {
        let Some((_, module, operand)) = self.kernels.get(index) else {
            return Err(BackendError::bad_input(format!(
                "Fix: the epilogue anatomy has {} kernels; index {index} is past them",
                self.kernels.len()
            )));
        };
        let mut scratch = match operand {
            Operand::Table => self.table.address(),
            Operand::Scratch => self.scratch.address(),
        };
        let mut mapped = self.mapped.device_address(0);
        let mut params = [
            &mut scratch as *mut u64 as *mut c_void,
            &mut mapped as *mut u64 as *mut c_void,
        ];
        // SAFETY: every anatomy kernel's parameters are two u64 addresses, held by
        // the locals for the call; a kernel touches at most 4,352 bytes of `scratch`
        // (8,192 allocated), 256 of `mapped` (4,096) or, through `table`, 4 bytes of
        // each 256-byte allocation, all of which outlive the synchronize inside.
        unsafe { launch_one_thread_sync(module, &self.stream, &mut params, "anatomy") }?;
        Ok(index as u64)
    }

    /// Bind the context (for a thread that did not create it).
    pub fn bind(&self) -> Result<(), BackendError> {
        self.backend.inner.bind()
    }
}

/// JIT-load one hand-written measurement kernel; errors name `what`.
fn load_hand_written(
    ptx: &str,
    entry: &str,
    what: String,
    sm: u32,
) -> Result<LoadedModule, BackendError> {
    LoadedModule::load(ptx, entry, None).map_err(|error| BackendError::module_load(what, sm, error))
}

/// Launch `module` as one thread on `stream` and synchronize; errors name `what`.
///
/// # Safety
/// `params` must hold one pointer per kernel parameter, each to a value of the
/// parameter's size alive for the call, and every address the kernel touches must
/// stay valid until this returns.
unsafe fn launch_one_thread_sync(
    module: &LoadedModule,
    stream: &Stream,
    params: &mut [*mut c_void],
    what: &str,
) -> Result<(), BackendError> {
    // SAFETY: the caller's contract above is the driver launch's.
    unsafe { driver::launch(module, [1, 1, 1], [1, 1, 1], stream, params, false) }
        .map_err(|e| BackendError::driver(format!("{what} launch"), e))?;
    stream
        .synchronize()
        .map_err(|e| BackendError::driver(format!("{what} synchronize"), e))
}
