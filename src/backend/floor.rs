//! The raw-driver floor (§9): the same work a dispatch does, done with nothing but
//! prebuilt driver calls, so every bench and instrument can quote its figures as a
//! ratio to the floor measured in the same run on the same machine.
//!
//! It loads the program's PTX once, allocates its buffers once and prebuilds the
//! parameter array; each measured operation is then only the driver calls named
//! in its doc comment. This is the "launch + async DtoH + one synchronize" row of
//! §0, reproduced live.

use std::ffi::c_void;

use crate::codegen::{self, ENTRY_NAME};
use crate::config::CodegenOptions;
use crate::ir::Program;

use smallvec::SmallVec;

use super::driver::{self, DeviceMemory, Event, LoadedModule, PinnedMemory, Stream};
use super::stream_ops::LaunchParameters;
use super::{BackendError, CudaBackend};

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
    /// Boxed so the pointers in `params` stay valid when the floor moves.
    parameters: Box<LaunchParameters>,
    params: SmallVec<[*mut c_void; 32]>,
    grid: [u32; 3],
    block: [u32; 3],
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
        let ptx = codegen::program_to_ptx(
            program,
            &CodegenOptions::default(),
            caps.ptx_target_sm(),
            caps.warp_size,
        )
        .map_err(|error| BackendError::Codegen {
            program: program.display_name(),
            error,
        })?;
        let module = LoadedModule::load(&ptx, ENTRY_NAME, None).map_err(|error| {
            BackendError::ModuleLoad {
                program: program.display_name(),
                sm: caps.ptx_target_sm(),
                error,
            }
        })?;
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
        let mut parameters = Box::new(LaunchParameters {
            addresses: buffers.iter().map(|b| b.address()).collect(),
            counts: lengths.into_iter().collect(),
        });
        let params = parameters.pointer_array();
        let staging = PinnedMemory::allocate(64 * 1024)
            .map_err(|e| BackendError::driver("allocating floor staging", e))?;
        let event = || Event::new().map_err(|e| BackendError::driver("creating floor events", e));
        let events = [event()?, event()?, event()?, event()?];
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
            backend: backend.clone(),
        })
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
    /// the queue never fills (amortised into the figure, as in §0's row).
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
    /// floor of a resident dispatch that reads back `reads` outputs.
    pub fn launch_async_reads_sync(&mut self, reads: usize) -> Result<u64, BackendError> {
        self.launch()?;
        self.async_reads(reads)?;
        self.sync()?;
        Ok(u64::from_le_bytes(
            self.staging.slice(0, 8).try_into().unwrap_or([0; 8]),
        ))
    }

    /// The timed floor: what `dispatch_resident_timed` asks of the driver, and nothing
    /// else — outer and inner event pairs around the launch and the `reads` async
    /// copies, one synchronize, two elapsed-time queries. The gap between this and
    /// [`RawFloor::launch_async_reads_sync`] is the price of device timing itself.
    pub fn launch_timed_async_reads_sync(&mut self, reads: usize) -> Result<u64, BackendError> {
        let record = |event: &Event, stream: &Stream| {
            event
                .record(stream)
                .map_err(|e| BackendError::driver("raw floor event record", e))
        };
        // All-resident: nothing precedes the launch, so one event opens both windows
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

    /// Number of parameters of the prebuilt launch.
    pub fn parameter_count(&self) -> usize {
        self.parameters.addresses.len() + self.parameters.counts.len()
    }
}
