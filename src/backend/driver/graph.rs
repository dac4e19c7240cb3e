//! CUDA graphs: stream capture, instantiation, replay and kernel-node updates
//! (`crate::graph`), and the nodes of stitched parents built node by node across
//! the devices of one host (`crate::graph::stitch`: a stream capture cannot span
//! devices). Measured on the H200: a graph replay of one kernel + a 16-byte copy +
//! synchronize costs 8.5 µs, and each further kernel node 1.0 µs (3.6 µs eager).

use std::ffi::c_void;

use cudarc::driver::sys;

use super::context::PrimaryContext;
use super::module::LoadedModule;
use super::stream::Stream;
use super::{check, count, DriverError, DriverResult};

/// A captured (not yet executable) graph. Destroyed on drop.
pub struct Graph {
    raw: sys::CUgraph,
}

// SAFETY: a graph handle may be used from any thread; the owner (`DispatchGraph`)
// is moved between threads, never shared, and takes `&mut self` to change it.
unsafe impl Send for Graph {}

/// A node of a [`Graph`], valid while that graph lives. Transparent, so a slice of
/// nodes is an array of driver node handles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(transparent)]
pub struct GraphNode(sys::CUgraphNode);

// SAFETY: a node handle is an opaque value; it is only passed back to the driver
// together with the graph (or its executable) that owns it.
unsafe impl Send for GraphNode {}

/// The kind of a graph node, as far as the graph module cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GraphNodeKind {
    /// A kernel launch.
    Kernel,
    /// Anything else (copies, fills, allocations, ...).
    Other,
}

/// An active stream capture. Dropping it without [`Capture::end`] ends the
/// capture and destroys whatever was captured, so an error half-way through a
/// capture never leaves the stream capturing.
pub struct Capture<'s> {
    stream: &'s Stream,
    ended: bool,
}

impl<'s> Capture<'s> {
    /// `cuStreamBeginCapture_v2(THREAD_LOCAL)`: from now on, work enqueued on
    /// `stream` is recorded into a graph instead of running. Thread-local mode: only
    /// this thread is barred from calls that could synchronise with the capture
    /// (allocations, blocking copies); other threads of the process are unaffected.
    pub fn begin(stream: &'s Stream) -> DriverResult<Capture<'s>> {
        // SAFETY: live stream handle; a context is current (callers bind first).
        check(
            unsafe {
                sys::cuStreamBeginCapture_v2(
                    stream.raw,
                    sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                )
            },
            "cuStreamBeginCapture_v2",
        )?;
        Ok(Capture {
            stream,
            ended: false,
        })
    }

    /// The stream being captured (enqueue the operations to record on it).
    pub fn stream(&self) -> &'s Stream {
        self.stream
    }

    /// The node the last captured operation created (`cuStreamGetCaptureInfo_v2`):
    /// on a linear capture the stream's dependency set is exactly that one node.
    /// An error when the capture was invalidated or the set is not one node.
    pub fn last_node(&self) -> DriverResult<GraphNode> {
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let mut dependencies: *const sys::CUgraphNode = std::ptr::null();
        let mut count = 0usize;
        // SAFETY: live, capturing stream; writes a status, a pointer to a driver-owned
        // array and its length (id and graph outputs are optional and passed null).
        check(
            unsafe {
                sys::cuStreamGetCaptureInfo_v2(
                    self.stream.raw,
                    &mut status,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    &mut dependencies,
                    &mut count,
                )
            },
            "cuStreamGetCaptureInfo_v2",
        )?;
        if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE {
            return Err(DriverError {
                code: sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                call: "cuStreamGetCaptureInfo_v2 (capture is not active)",
            });
        }
        if count != 1 || dependencies.is_null() {
            return Err(DriverError {
                code: sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_UNJOINED,
                call: "cuStreamGetCaptureInfo_v2 (capture is not a single chain)",
            });
        }
        // SAFETY: the driver returned a non-null array of `count` (= 1) nodes, valid
        // until the next call on this stream; we copy the handle out at once.
        Ok(GraphNode(unsafe { *dependencies }))
    }

    /// `cuStreamEndCapture`: the recorded graph.
    pub fn end(mut self) -> DriverResult<Graph> {
        self.ended = true;
        let mut raw = std::ptr::null_mut();
        // SAFETY: the stream is capturing (begun in `begin`, not yet ended).
        let status = unsafe { sys::cuStreamEndCapture(self.stream.raw, &mut raw) };
        if status != sys::CUresult::CUDA_SUCCESS {
            if !raw.is_null() {
                // SAFETY: the driver handed us a graph we own; discard it.
                unsafe { sys::cuGraphDestroy(raw) };
            }
            return Err(DriverError {
                code: status,
                call: "cuStreamEndCapture",
            });
        }
        if raw.is_null() {
            return Err(DriverError {
                code: sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                call: "cuStreamEndCapture (no graph returned)",
            });
        }
        Ok(Graph { raw })
    }
}

impl Drop for Capture<'_> {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let mut raw = std::ptr::null_mut();
        // SAFETY: the stream is still capturing (end was never called); ending it
        // returns the partial graph (or null when the capture was invalidated), which
        // we own and destroy; errors are ignored on this discard path.
        unsafe {
            sys::cuStreamEndCapture(self.stream.raw, &mut raw);
            if !raw.is_null() {
                sys::cuGraphDestroy(raw);
            }
        }
    }
}

impl Graph {
    /// `cuGraphNodeGetType`, reduced to kernel / other.
    pub fn node_kind(&self, node: GraphNode) -> DriverResult<GraphNodeKind> {
        let mut kind = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
        // SAFETY: `node` came from the capture that produced this live graph; writes
        // one enum value.
        check(
            unsafe { sys::cuGraphNodeGetType(node.0, &mut kind) },
            "cuGraphNodeGetType",
        )?;
        Ok(if kind == sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL {
            GraphNodeKind::Kernel
        } else {
            GraphNodeKind::Other
        })
    }

    /// Number of nodes (`cuGraphGetNodes` with a null array).
    pub fn node_count(&self) -> DriverResult<usize> {
        let mut count = 0usize;
        // SAFETY: live graph; a null array asks only for the count.
        check(
            unsafe { sys::cuGraphGetNodes(self.raw, std::ptr::null_mut(), &mut count) },
            "cuGraphGetNodes",
        )?;
        Ok(count)
    }

    /// `cuGraphInstantiateWithFlags(0)`: an executable graph.
    pub fn instantiate(&self) -> DriverResult<GraphExec> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: live graph; writes one executable handle; a context is current.
        check(
            unsafe { sys::cuGraphInstantiateWithFlags(&mut raw, self.raw, 0) },
            "cuGraphInstantiateWithFlags",
        )?;
        Ok(GraphExec { raw })
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: we own the graph; every executable made from it is destroyed first
        // by its owner (field order); errors are ignored on drop.
        unsafe {
            sys::cuGraphDestroy(self.raw);
        }
    }
}

/// An executable graph. Destroyed on drop.
pub struct GraphExec {
    raw: sys::CUgraphExec,
}

// SAFETY: as for `Graph`: moved between threads, never launched concurrently (the
// owner takes `&mut self` to launch or update it).
unsafe impl Send for GraphExec {}

impl GraphExec {
    /// Enqueue one replay of the whole graph (`cuGraphLaunch`).
    ///
    /// # Safety
    /// Every device allocation and every pinned host buffer the graph's nodes read
    /// or write must stay alive, and the pinned buffers untouched by the host, until
    /// the stream is synchronised.
    #[inline]
    pub unsafe fn launch(&self, stream: &Stream) -> DriverResult<()> {
        count(|c| c.graph_launches += 1);
        check(sys::cuGraphLaunch(self.raw, stream.raw), "cuGraphLaunch")
    }
}

/// Where a kernel node's parameters are changed.
#[derive(Clone, Copy)]
pub enum KernelNodeHolder<'g> {
    /// An executable graph: later launches of it use the new values
    /// (`cuGraphExecKernelNodeSetParams_v2`).
    Executable(&'g GraphExec),
    /// The captured graph the node belongs to: what a later clone of it (a parent's
    /// child-graph node) or [`GraphExec::set_child_graph_params`] picks up
    /// (`cuGraphKernelNodeSetParams_v2`). The driver call names only the node; the
    /// graph is borrowed so the node's owner is alive for the call.
    Captured(#[allow(dead_code)] &'g Graph),
}

/// Change a kernel node's grid and parameter values in `holder`; the values are
/// copied by the call.
///
/// # Safety
/// `node` must be a kernel node of the captured graph (or of the graph the
/// executable was instantiated from), launching `module`'s function; `params` must
/// hold one pointer per kernel parameter, in order, each pointing at a value of the
/// parameter's size that stays alive for this call; every device address passed must
/// stay alive while the executable (or any clone of the graph) can be launched. No
/// launch of the executable may be running.
pub unsafe fn set_kernel_node_params(
    holder: KernelNodeHolder<'_>,
    node: GraphNode,
    module: &LoadedModule,
    grid: [u32; 3],
    block: [u32; 3],
    params: &mut [*mut c_void],
) -> DriverResult<()> {
    let node_params = kernel_node_params(module, grid, block, params);
    match holder {
        KernelNodeHolder::Executable(exec) => check(
            sys::cuGraphExecKernelNodeSetParams_v2(exec.raw, node.0, &node_params),
            "cuGraphExecKernelNodeSetParams_v2",
        ),
        KernelNodeHolder::Captured(_) => check(
            sys::cuGraphKernelNodeSetParams_v2(node.0, &node_params),
            "cuGraphKernelNodeSetParams_v2",
        ),
    }
}

/// The kernel-node parameter block of one launch of `module`'s function, with its
/// dynamic shared memory (as [`super::launch`] passes it). The function names its
/// module's context, so the node runs on that module's device.
fn kernel_node_params(
    module: &LoadedModule,
    grid: [u32; 3],
    block: [u32; 3],
    params: &mut [*mut c_void],
) -> sys::CUDA_KERNEL_NODE_PARAMS {
    sys::CUDA_KERNEL_NODE_PARAMS {
        func: module.function,
        gridDimX: grid[0],
        gridDimY: grid[1],
        gridDimZ: grid[2],
        blockDimX: block[0],
        blockDimY: block[1],
        blockDimZ: block[2],
        sharedMemBytes: module.dynamic_shared_bytes,
        kernelParams: params.as_mut_ptr(),
        extra: std::ptr::null_mut(),
        // Ignored when `func` is set.
        kern: std::ptr::null_mut(),
        ctx: std::ptr::null_mut(),
    }
}

impl Drop for GraphExec {
    fn drop(&mut self) {
        // SAFETY: we own the executable; its owner synchronised its stream first.
        unsafe {
            sys::cuGraphExecDestroy(self.raw);
        }
    }
}

/// One end of a linear copy node.
#[derive(Clone, Copy, Debug)]
pub enum CopyEnd {
    /// A device address (unified addressing: the address names its device).
    Device(u64),
    /// Pinned host memory.
    Host(*mut u8),
}

impl CopyEnd {
    /// The memory type, device address and host pointer of a `CUDA_MEMCPY3D` end.
    fn parts(self) -> (sys::CUmemorytype, u64, *const c_void) {
        match self {
            CopyEnd::Device(address) => (
                sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                address,
                std::ptr::null(),
            ),
            CopyEnd::Host(host) => (
                sys::CUmemorytype::CU_MEMORYTYPE_HOST,
                0,
                host as *const c_void,
            ),
        }
    }
}

impl Graph {
    /// `cuGraphCreate`: an empty graph to add nodes to.
    pub fn empty() -> DriverResult<Graph> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: writes one graph handle; flags must be 0.
        check(unsafe { sys::cuGraphCreate(&mut raw, 0) }, "cuGraphCreate")?;
        Ok(Graph { raw })
    }

    /// `cuGraphAddChildGraphNode`: a node running a clone of `child`, after
    /// `dependencies`. Later changes to `child` reach the clone only through
    /// [`GraphExec::set_child_graph_params`].
    pub fn add_child_graph(
        &self,
        dependencies: &[GraphNode],
        child: &Graph,
    ) -> DriverResult<GraphNode> {
        let mut node = std::ptr::null_mut();
        // SAFETY: both graphs are live; `dependencies` are nodes of this graph
        // (`GraphNode` is a transparent-by-value handle, read as an array of
        // CUgraphNode of the given length); writes one node handle.
        check(
            unsafe {
                sys::cuGraphAddChildGraphNode(
                    &mut node,
                    self.raw,
                    dependencies.as_ptr() as *const sys::CUgraphNode,
                    dependencies.len(),
                    child.raw,
                )
            },
            "cuGraphAddChildGraphNode",
        )?;
        Ok(GraphNode(node))
    }

    /// `cuGraphAddMemcpyNode`: a node copying `bytes` from `source` to `destination`
    /// in `context`, after `dependencies`.
    ///
    /// # Safety
    /// Both ends must stay valid (device allocations alive, pinned host memory alive
    /// and untouched by the host while a launch runs) for as long as an executable
    /// made from this graph can be launched, and hold at least `bytes` bytes.
    pub unsafe fn add_copy(
        &self,
        dependencies: &[GraphNode],
        source: CopyEnd,
        destination: CopyEnd,
        bytes: usize,
        context: &PrimaryContext,
    ) -> DriverResult<GraphNode> {
        // Every field named: the memory types are Rust enums with no zero variant,
        // so a zeroed struct would be invalid (Rust refuses it at run time).
        let (source_type, source_device, source_host) = source.parts();
        let (destination_type, destination_device, destination_host) = destination.parts();
        // One row of `bytes` bytes: pitches equal to the row, one row per plane.
        let copy = sys::CUDA_MEMCPY3D {
            srcXInBytes: 0,
            srcY: 0,
            srcZ: 0,
            srcLOD: 0,
            srcMemoryType: source_type,
            srcHost: source_host,
            srcDevice: source_device,
            srcArray: std::ptr::null_mut(),
            reserved0: std::ptr::null_mut(),
            srcPitch: bytes,
            srcHeight: 1,
            dstXInBytes: 0,
            dstY: 0,
            dstZ: 0,
            dstLOD: 0,
            dstMemoryType: destination_type,
            dstHost: destination_host as *mut c_void,
            dstDevice: destination_device,
            dstArray: std::ptr::null_mut(),
            reserved1: std::ptr::null_mut(),
            dstPitch: bytes,
            dstHeight: 1,
            WidthInBytes: bytes,
            Height: 1,
            Depth: 1,
        };
        let mut node = std::ptr::null_mut();
        check(
            sys::cuGraphAddMemcpyNode(
                &mut node,
                self.raw,
                dependencies.as_ptr() as *const sys::CUgraphNode,
                dependencies.len(),
                &copy,
                context.raw,
            ),
            "cuGraphAddMemcpyNode",
        )?;
        Ok(GraphNode(node))
    }
}

impl GraphExec {
    /// Make the clone inside child-graph node `node` run with `child`'s current node
    /// parameters on later launches (`cuGraphExecChildGraphNodeSetParams`); the
    /// topology of `child` must be the one the node was cloned from.
    ///
    /// # Safety
    /// `node` is a child-graph node of the graph this executable was instantiated
    /// from, cloned from `child`; every device address in `child`'s nodes stays alive
    /// while the executable can be launched; no launch of it is running.
    pub unsafe fn set_child_graph_params(
        &self,
        node: GraphNode,
        child: &Graph,
    ) -> DriverResult<()> {
        check(
            sys::cuGraphExecChildGraphNodeSetParams(self.raw, node.0, child.raw),
            "cuGraphExecChildGraphNodeSetParams",
        )
    }
}
