//! The stitched chain of the seed probe: device 0 scales (×3), device 1
//! scales (×5), device 0 reduces (a wrapping sum), recorded per device and stitched
//! under one parent. Shared by `gpu_stitch` (correctness) and the
//! `host_cost_graph_cross_device` instrument (stitched replay against its eager
//! parts), so both measure and check the very same chain.

use super::bytes;
use vyre_cuda::backend::{Binding, CudaBackend, DeviceBuffer, Dispatch, Kernel};
use vyre_cuda::graph::{ChildId, InputSlot, OutputSlot, StepId, StitchBuilder, StitchedGraph};
use vyre_cuda::ir::*;
use vyre_cuda::{DispatchConfig, ReadbackPolicy};

/// Elements per buffer (not a multiple of the workgroup, so the length guards matter).
pub const N: usize = 1000;
pub const WORKGROUP: u32 = 64;

pub fn blocks_for(n: usize) -> u32 {
    (n as u32).div_ceil(WORKGROUP)
}

/// `dst[i] = src[i] * factor` for `i < length(dst)` (`super::elementwise`).
pub fn scale(name: &str, factor: u32) -> Program {
    super::elementwise(name, WORKGROUP, |v| v * factor)
}

/// `sum[0] = src[0] + … + src[length(src) − 1]` (wrapping), one thread.
pub fn reduce_sum() -> Program {
    Program::builder([1, 1, 1])
        .entry_op_id("reduce_sum")
        .buffer(
            "src",
            0,
            Access::ReadOnly,
            ElemType::U32,
            BufferCount::Runtime,
        )
        .buffer(
            "sum",
            1,
            Access::WriteOnly,
            ElemType::U32,
            BufferCount::Static(1),
        )
        .body(|b| {
            b.let_mut("acc", 0u32);
            b.loop_("k", 0u32, Expr::length("src"), |b, k| {
                b.assign("acc", Expr::var("acc") + Expr::load("src", k));
            });
            b.store("sum", 0u32, Expr::var("acc"));
        })
        .build()
}

pub fn scale_config() -> DispatchConfig {
    DispatchConfig::linear(blocks_for(N)).with_readback(ReadbackPolicy::None)
}

pub fn reduce_config() -> DispatchConfig {
    DispatchConfig::linear(1).with_readback(ReadbackPolicy::None)
}

/// The chain on the reference interpreter over `input` (its length is the element
/// count): the scaled words that reach the reduction, and the sum's 4 bytes.
pub fn reference_chain(input: &[u32]) -> (Vec<u8>, Vec<u8>) {
    let n = input.len();
    let config = DispatchConfig::linear(blocks_for(n.max(1)));
    let run = |program: &Program, inputs: &[&[u8]], config: &DispatchConfig| {
        let mut outputs = vyre_cuda::reference::run(program, inputs, config)
            .unwrap_or_else(|e| panic!("reference failed: {e}\n{program}"));
        assert_eq!(outputs.len(), 1, "one output per program");
        outputs.remove(0)
    };
    let zeros = vec![0u8; 4 * n];
    let tripled = run(&scale("times3", 3), &[&bytes(input), &zeros], &config);
    let scaled = run(&scale("times5", 5), &[&tripled, &zeros], &config);
    let sum = run(
        &reduce_sum(),
        &[&scaled, &[0u8; 4]],
        &DispatchConfig::linear(1),
    );
    (scaled, sum)
}

/// Kernels and device buffers of the chain: `input → x` on `first`, `y → z` on
/// `second`, `w → sum` on `first` (each `N` words, `sum` one word).
pub struct Chain {
    pub first: CudaBackend,
    pub second: CudaBackend,
    pub times3: Kernel,
    pub times5: Kernel,
    pub reduce: Kernel,
    pub input: DeviceBuffer,
    pub x: DeviceBuffer,
    pub y: DeviceBuffer,
    pub z: DeviceBuffer,
    pub w: DeviceBuffer,
    pub sum: DeviceBuffer,
}

/// The ids a stitched chain hands back.
pub struct Stitched {
    pub graph: StitchedGraph,
    pub children: [ChildId; 3],
    pub steps: [StepId; 3],
    pub input: InputSlot,
    pub scaled: OutputSlot,
    pub sum: OutputSlot,
}

impl Chain {
    pub fn new(first: &CudaBackend, second: &CudaBackend) -> Chain {
        let words = |gpu: &CudaBackend| gpu.buffer(4 * N as u64).unwrap();
        Chain {
            times3: first.compile(&scale("times3", 3), &scale_config()).unwrap(),
            times5: second
                .compile(&scale("times5", 5), &scale_config())
                .unwrap(),
            reduce: first.compile(&reduce_sum(), &reduce_config()).unwrap(),
            input: words(first),
            x: words(first),
            y: words(second),
            z: words(second),
            w: words(first),
            sum: first.buffer(4).unwrap(),
            first: first.clone(),
            second: second.clone(),
        }
    }

    /// Record the three children and stitch them: `x → y` and `z → w` transfers
    /// (the second forced through the host when `bounce_back` is set).
    pub fn stitch(&self, bounce_back: bool) -> Stitched {
        let bytes = 4 * N as u64;
        let mut ids = None;
        let first = self
            .first
            .record(|rec| {
                let input = rec.upload(&self.input, bytes)?;
                let bindings = [Binding::from(&self.input), Binding::from(&self.x)];
                let step =
                    rec.dispatch(Dispatch::new(&self.times3, &bindings).config(&scale_config()))?;
                ids = Some((input, step));
                Ok(())
            })
            .unwrap();
        let (input, step_first) = ids.unwrap();
        let mut step_second = None;
        let second = self
            .second
            .record(|rec| {
                let bindings = [Binding::from(&self.y), Binding::from(&self.z)];
                step_second = Some(
                    rec.dispatch(Dispatch::new(&self.times5, &bindings).config(&scale_config()))?,
                );
                Ok(())
            })
            .unwrap();
        let mut reads = None;
        let third = self
            .first
            .record(|rec| {
                let bindings = [Binding::from(&self.w), Binding::from(&self.sum)];
                let step =
                    rec.dispatch(Dispatch::new(&self.reduce, &bindings).config(&reduce_config()))?;
                let sum = rec.read_back(&self.sum, 0, 4)?;
                let scaled = rec.read_back(&self.w, 0, bytes)?;
                reads = Some((step, sum, scaled));
                Ok(())
            })
            .unwrap();
        let (step_third, sum, scaled) = reads.unwrap();
        let mut stitch = StitchBuilder::new();
        let children = [
            stitch.child(first),
            stitch.child(second),
            stitch.child(third),
        ];
        stitch
            .transfer(children[0], &self.x, children[1], &self.y, bytes)
            .unwrap();
        if bounce_back {
            stitch
                .transfer_through_host(children[1], &self.z, children[2], &self.w, bytes)
                .unwrap();
        } else {
            stitch
                .transfer(children[1], &self.z, children[2], &self.w, bytes)
                .unwrap();
        }
        let graph = stitch.build().unwrap();
        println!("{graph}");
        Stitched {
            graph,
            children,
            steps: [step_first, step_second.unwrap(), step_third],
            input,
            scaled,
            sum,
        }
    }

    /// The same chain run eagerly: upload, three dispatches with a synchronize each,
    /// and the two transfers as a read to the host and an upload to the other device;
    /// returns the sum's word.
    pub fn run_eagerly(&self, input: &[u8]) -> Result<u32, vyre_cuda::backend::BackendError> {
        self.first.upload(&self.input, input)?;
        // (backend, kernel, source, destination, config, the bytes to bring in first).
        let stages = [
            (
                &self.first,
                &self.times3,
                &self.input,
                &self.x,
                scale_config(),
                None,
            ),
            (
                &self.second,
                &self.times5,
                &self.y,
                &self.z,
                scale_config(),
                Some((&self.first, &self.x)),
            ),
            (
                &self.first,
                &self.reduce,
                &self.w,
                &self.sum,
                reduce_config(),
                Some((&self.second, &self.z)),
            ),
        ];
        for (gpu, kernel, source, destination, config, incoming) in stages {
            if let Some((from, buffer)) = incoming {
                gpu.upload(source, &from.read::<u8>(buffer)?)?;
            }
            let bindings = [Binding::from(source), Binding::from(destination)];
            gpu.run(Dispatch::new(kernel, &bindings).config(&config))?;
        }
        Ok(self.first.read::<u32>(&self.sum)?[0])
    }

    /// Drop the chain: its buffers free themselves (a graph or parent that binds
    /// them keeps their memory until it goes).
    pub fn free(self) {}
}
