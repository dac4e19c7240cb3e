//! Stitched graphs: recorded per-device [`DispatchGraph`]s placed
//! as child-graph nodes under one parent graph, ordered by explicit dependency
//! edges, with copy nodes carrying bytes between them, replayed with one
//! `cuGraphLaunch` and one synchronize.
//!
//! # Why this module exists
//!
//! A tokenizer that shards its input across the GPUs of one host runs one chain per
//! device and joins them. A stream capture cannot span devices: a cross-device
//! event join inside a capture fails with `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`
//! and leaves the origin stream unusable for later captures (measured by the
//! seed's probe on a two-GPU host). So each device's part is recorded on its own
//! backend ([`CudaBackend::acquire_device`]), and this module builds the parent
//! node by node: one child-graph node per recording (`cuGraphAddChildGraphNode`,
//! which clones it), copy nodes (`cuGraphAddMemcpyNode`) between them, and the
//! edges. Measured on the H200: a graph's per-kernel-node cost is 1.0 µs against 3.6 µs for
//! an eager launch; a parent keeps that shape across devices instead of paying one
//! launch and one synchronize per device per encode. What one cross-device edge
//! costs against a same-device one is what the `host_cost_graph_cross_device`
//! instrument (tests/host_cost_instruments.rs, section 7) measures; its figures are
//! quoted once a two-GPU machine has run it.
//!
//! # Shape
//!
//! ```no_run
//! # use vyre_cuda::backend::{BackendError, Binding, CudaBackend, DeviceBuffer, Dispatch, Kernel};
//! # use vyre_cuda::graph::{StitchBuilder, InputSlot, OutputSlot};
//! # use vyre_cuda::DispatchConfig;
//! # fn chain(
//! #     gpu0: &CudaBackend, gpu1: &CudaBackend,
//! #     scale0: &Kernel, scale1: &Kernel, reduce0: &Kernel,
//! #     [a, b]: [&DeviceBuffer; 2], [c, d]: [&DeviceBuffer; 2], [e, sum]: [&DeviceBuffer; 2],
//! #     config: &DispatchConfig,
//! # ) -> Result<(), BackendError> {
//! let on = |x, y| [Binding::Buffer(x), Binding::Buffer(y)];
//! let mut slots = None;
//! let first = gpu0.record(|rec| {
//!     let input = rec.upload(a, a.len())?;
//!     rec.dispatch(Dispatch::new(scale0, &on(a, b)).config(config))?;
//!     slots = Some(input);
//!     Ok(())
//! })?;
//! let second =
//!     gpu1.record(|rec| rec.dispatch(Dispatch::new(scale1, &on(c, d)).config(config)).map(drop))?;
//! let mut result = None;
//! let third = gpu0.record(|rec| {
//!     rec.dispatch(Dispatch::new(reduce0, &on(e, sum)).config(config))?;
//!     result = Some(rec.read_back(sum, 0, 4)?);
//!     Ok(())
//! })?;
//! let mut stitch = StitchBuilder::new();
//! let (first, second, third) = (stitch.child(first), stitch.child(second), stitch.child(third));
//! stitch.transfer(first, b, second, c, b.len())?; // device 0 → device 1
//! stitch.transfer(second, d, third, e, d.len())?; // device 1 → device 0
//! let mut parent = stitch.build()?;
//! println!("{parent}"); // which edge went peer-to-peer, which through the host
//! parent.input_mut(first, slots.unwrap())?.fill(1);
//! parent.replay()?;
//! let total = parent.output(third, result.unwrap())?;
//! # let _ = total;
//! # Ok(())
//! # }
//! ```
//!
//! # Edges and transfers
//!
//! [`StitchBuilder::depend`] orders two children (every node of the first finishes
//! before any node of the second starts). [`StitchBuilder::transfer`] copies bytes
//! from a buffer of one child's device into a buffer of another's, after the first
//! and before the second; its route is chosen at build time and reported by
//! [`StitchedGraph::edges`] (and `Display`):
//!
//! - [`TransferRoute::SameDevice`]: both ends on one device, one device-to-device
//!   copy node;
//! - [`TransferRoute::Peer`]: different devices and `cuDeviceCanAccessPeer` says the
//!   destination can address the source: peer access is enabled (once; asking again
//!   is harmless) and one copy node runs in the destination's context;
//! - [`TransferRoute::HostBounce`]: otherwise (or when asked for with
//!   [`StitchBuilder::transfer_through_host`]): a device → pinned host copy on the
//!   source device, then a pinned host → device copy on the destination, through a
//!   pinned buffer the parent owns.
//!
//! Edges may form any directed acyclic graph; a cycle is refused with the children
//! on it named. Children not ordered by any edge may run concurrently, exactly like
//! two graphs replayed at once: order children that touch the same buffers.
//!
//! # Refusals
//!
//! - A recording binds or waits on only its own device's work: a buffer or kernel of
//!   another device's backend inside [`CudaBackend::record`] is a `Fix:` error that
//!   points here (the recorder has no cross-device wait to misuse: ordering across
//!   devices exists only as a parent's edges).
//! - A transfer's source must belong to its `from` child's backend and its
//!   destination to its `to` child's (another device's buffer is the same
//!   cross-device error), both large enough.
//! - A child with scratch buffers: the driver refuses allocation nodes inside child
//!   graphs, so record it over device buffers instead.
//! - A broken child (a failed parameter update) and a child whose backend lost its
//!   context.
//!
//! # Lifetimes: no use after free by construction
//!
//! A stitch takes its children by value: each still holds `Arc` clones of every
//! buffer's memory it touches (see [`DispatchGraph`]), and the parent holds those of
//! its transfers' ends. Freeing a handle or dropping a buffer after stitching frees
//! nothing under the parent; the memory goes when the parent does (gpu_ test
//! `gpu_stitch_survives_freeing_every_handle`). Drop order: the parent's executable
//! and graph (after a synchronize), then bounce staging and transfer memory, then
//! the children, then the backends.
//!
//! # Replays and updates
//!
//! [`StitchedGraph::replay`]: each child's result stamps are cleared, the parent is
//! launched on a stream of its first child's device, one synchronize, then each
//! child's stamps are checked (its folded read-backs are trusted only if its last
//! kernel wrote its end stamp). Fresh inputs go into the children's pinned input
//! slots ([`StitchedGraph::input_mut`]); outputs are read in place
//! ([`StitchedGraph::output`]). [`StitchedGraph::set_element_count`] and
//! [`StitchedGraph::set_workgroups`] change a child's step without re-capture: the
//! child writes its kernel nodes (its executable and its captured graph), then the
//! parent's clone is updated from the captured graph with
//! `cuGraphExecChildGraphNodeSetParams` (documented for exactly this; a kernel node
//! inside a child-graph node is not one the parent's executable exposes to
//! `cuGraphExecKernelNodeSetParams`). A failed update marks the parent broken.
//! With the phase probe on, each replay prints one line like a graph replay's
//! (`prepare`: checks, binds and the children's stamp clears; `launch`; `release`:
//! the synchronize; `readback`: the children's stamp checks; counts summed over every
//! child's steps). `event_window_ns` is `None` (no events) and `kernel_stamps_ns` is the sum of
//! the children's stamped kernel spans (devices' timers are not one clock).

use std::sync::Arc;
use std::time::Instant;

use smallvec::SmallVec;

use crate::backend::driver::{
    self, CopyEnd, DeviceMemory, GraphExec, GraphNode, PinnedMemory, Stream,
};
use crate::backend::{BackendError, CudaBackend, DeviceBuffer, Timings};
use crate::ir::Literal;
use crate::probe::{self, Phase};

use super::record::hold_memory;
use super::{next_graph_id, DispatchGraph, InputSlot, OutputSlot, StepId};

/// One child of a stitch: returned by [`StitchBuilder::child`], valid for that
/// stitch and the [`StitchedGraph`] it builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ChildId {
    stitch: u64,
    index: u32,
}

impl ChildId {
    /// The child's position in the stitch (the order [`StitchBuilder::child`] was
    /// called in).
    pub fn index(self) -> usize {
        self.index as usize
    }
}

/// How a transfer's bytes cross between two children's buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TransferRoute {
    /// Both buffers on one device: one device-to-device copy node.
    SameDevice,
    /// Peer-to-peer between two devices: one copy node in the destination's context,
    /// with peer access enabled.
    Peer,
    /// Through pinned host memory: device → host on the source device, then host →
    /// device on the destination.
    HostBounce,
}

impl std::fmt::Display for TransferRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TransferRoute::SameDevice => "same-device copy",
            TransferRoute::Peer => "peer copy",
            TransferRoute::HostBounce => "host bounce through pinned memory",
        })
    }
}

/// What an edge of a stitched graph carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EdgeKind {
    /// Order only ([`StitchBuilder::depend`]).
    Order,
    /// A copy of `bytes` bytes between the children ([`StitchBuilder::transfer`]).
    Transfer {
        /// Bytes copied.
        bytes: u64,
        /// The route chosen at build time.
        route: TransferRoute,
    },
}

/// One edge of a stitched graph: child `before` finishes before child `after`
/// starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StitchEdge {
    /// Index of the earlier child.
    pub before: usize,
    /// Its device.
    pub before_device: usize,
    /// Index of the later child.
    pub after: usize,
    /// Its device.
    pub after_device: usize,
    /// Order only, or a transfer and its route.
    pub kind: EdgeKind,
}

impl std::fmt::Display for StitchEdge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "child {} (device {}) → child {} (device {}): ",
            self.before, self.before_device, self.after, self.after_device
        )?;
        match self.kind {
            EdgeKind::Order => f.write_str("order only"),
            EdgeKind::Transfer { bytes, route } => write!(f, "{route} of {bytes} bytes"),
        }
    }
}

/// A transfer described to the builder.
struct TransferPlan {
    from: u32,
    to: u32,
    source: Arc<DeviceMemory>,
    destination: Arc<DeviceMemory>,
    bytes: u64,
    through_host: bool,
}

/// Builds a [`StitchedGraph`] from recorded per-device graphs. Every method
/// validates at once and returns an `Err` starting `Fix:`; nothing touches the
/// driver until [`StitchBuilder::build`].
pub struct StitchBuilder {
    id: u64,
    children: Vec<DispatchGraph>,
    dependencies: Vec<(u32, u32)>,
    transfers: Vec<TransferPlan>,
}

impl Default for StitchBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for StitchBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StitchBuilder")
            .field("id", &self.id)
            .field("children", &self.children.len())
            .field("dependencies", &self.dependencies)
            .field("transfers", &self.transfers.len())
            .finish()
    }
}

impl Drop for StitchBuilder {
    /// A stitch that was not built releases its transfers' memory, each end in its
    /// own device's context (forgotten when that context is gone); the children drop
    /// themselves.
    fn drop(&mut self) {
        for transfer in self.transfers.drain(..) {
            for (child, memory) in [
                (transfer.from, transfer.source),
                (transfer.to, transfer.destination),
            ] {
                release_in_context(&self.children[child as usize], memory);
            }
        }
    }
}

/// Drop `memory` with `owner`'s context bound, or forget it when that context is gone
/// (its allocations went with it).
fn release_in_context(owner: &DispatchGraph, memory: Arc<DeviceMemory>) {
    let inner = owner.backend.shared();
    if inner.check_alive().is_ok() && inner.bind().is_ok() {
        drop(memory);
    } else {
        std::mem::forget(memory);
    }
}

impl StitchBuilder {
    /// An empty stitch.
    pub fn new() -> Self {
        StitchBuilder {
            id: next_graph_id(),
            children: Vec::new(),
            dependencies: Vec::new(),
            transfers: Vec::new(),
        }
    }

    /// Add a recorded graph as a child (taken by value: the stitch holds it, and
    /// with it every buffer it touches). The first child's device is where the
    /// parent launches.
    pub fn child(&mut self, graph: DispatchGraph) -> ChildId {
        let index = self.children.len() as u32;
        self.children.push(graph);
        ChildId {
            stitch: self.id,
            index,
        }
    }

    /// Child `before` finishes before child `after` starts.
    pub fn depend(&mut self, before: ChildId, after: ChildId) -> Result<(), BackendError> {
        let (from, to) = (self.index(before)?, self.index(after)?);
        if from == to {
            return Err(BackendError::bad_input(format!(
                "Fix: child {from} cannot depend on itself; order two different children"
            )));
        }
        self.dependencies.push((from, to));
        Ok(())
    }

    /// After child `from` and before child `to`, copy the first `bytes` bytes of
    /// `source` (a buffer of `from`'s backend) to the start of `destination` (a
    /// buffer of `to`'s backend): peer-to-peer when the devices allow it, through
    /// pinned host memory when not, one device copy on one device.
    pub fn transfer(
        &mut self,
        from: ChildId,
        source: &DeviceBuffer,
        to: ChildId,
        destination: &DeviceBuffer,
        bytes: u64,
    ) -> Result<(), BackendError> {
        self.add_transfer(from, source, to, destination, bytes, false)
    }

    /// [`StitchBuilder::transfer`] that always bounces through pinned host memory
    /// (for devices whose peer path is slower than the host's, and to compare the
    /// routes).
    pub fn transfer_through_host(
        &mut self,
        from: ChildId,
        source: &DeviceBuffer,
        to: ChildId,
        destination: &DeviceBuffer,
        bytes: u64,
    ) -> Result<(), BackendError> {
        self.add_transfer(from, source, to, destination, bytes, true)
    }

    fn add_transfer(
        &mut self,
        from: ChildId,
        source: &DeviceBuffer,
        to: ChildId,
        destination: &DeviceBuffer,
        bytes: u64,
        through_host: bool,
    ) -> Result<(), BackendError> {
        let (from, to) = (self.index(from)?, self.index(to)?);
        if from == to {
            return Err(BackendError::bad_input(format!(
                "Fix: a transfer from child {from} to itself orders nothing; record the copy as a dispatch \
                 inside that child, or transfer between two different children"
            )));
        }
        if bytes == 0 {
            return Err(BackendError::bad_input(
                "Fix: a transfer of 0 bytes copies nothing; transfer at least 1 byte or use depend",
            ));
        }
        let mut held = SmallVec::<[(Arc<DeviceMemory>, u64); 2]>::new();
        for (end, child, buffer, verb) in [
            ("source", from, source, "transfer from"),
            ("destination", to, destination, "transfer into"),
        ] {
            let inner = self.children[child as usize].backend.shared();
            if let Some(device) = buffer.device_ordinal() {
                check_transfer_end(end, child, device, inner.caps.ordinal)?;
            }
            held.push(hold_memory(inner, buffer, verb)?);
        }
        let [(source, source_len), (destination, destination_len)]: [_; 2] = held
            .into_inner()
            .map_err(|_| BackendError::internal("a transfer has two ends"))?;
        for (end, len) in [("source", source_len), ("destination", destination_len)] {
            if bytes > len {
                return Err(BackendError::bad_input(format!(
                    "Fix: cannot transfer {bytes} bytes: the {end} buffer holds {len} bytes; transfer at most \
                     that many or allocate a larger buffer"
                )));
            }
        }
        usize::try_from(bytes).map_err(|_| {
            BackendError::bad_input(format!(
                "Fix: a transfer of {bytes} bytes does not fit this host's address space; split it"
            ))
        })?;
        self.transfers.push(TransferPlan {
            from,
            to,
            source,
            destination,
            bytes,
            through_host,
        });
        Ok(())
    }

    fn index(&self, child: ChildId) -> Result<u32, BackendError> {
        check_child(child, self.id, self.children.len())
    }

    /// Build the parent graph: children as child-graph nodes in dependency order,
    /// transfers as copy nodes, then instantiate it in the first child's context.
    pub fn build(mut self) -> Result<StitchedGraph, BackendError> {
        if self.children.is_empty() {
            return Err(BackendError::bad_input(
                "Fix: the stitch has no children; add recorded graphs with StitchBuilder::child",
            ));
        }
        driver::load_stitch_symbols().map_err(|e| BackendError::NoDriver {
            detail: format!(
                "libcuda.so lacks what stitched graphs need ({e:?}); single-device graphs still work; \
                 upgrade the driver or replay each device's graph on its own"
            ),
        })?;
        for (index, child) in self.children.iter().enumerate() {
            child.usable()?;
            child.backend.shared().check_alive()?;
            if child.scratch_buffers > 0 {
                return Err(BackendError::bad_input(format!(
                    "Fix: child {index} ({}) has {} scratch buffer(s), and the driver refuses allocation \
                     nodes inside a child graph; record it over DeviceBuffers instead",
                    child.name, child.scratch_buffers
                )));
            }
        }
        let mut edges: Vec<(u32, u32)> = self.dependencies.clone();
        edges.extend(self.transfers.iter().map(|t| (t.from, t.to)));
        let order = topological_order(self.children.len(), &edges)?;
        let devices: Vec<usize> = self.children.iter().map(|c| c.backend.ordinal()).collect();
        let routes = self.choose_routes(&devices)?;

        let home = self.children[0].backend.clone();
        let home_inner = Arc::clone(home.shared());
        home_inner.bind()?;
        let name = format!(
            "stitched graph #{} [{}]",
            self.id,
            self.children
                .iter()
                .zip(&devices)
                .map(|(child, device)| format!("device {device}: {}", child.name))
                .collect::<Vec<_>>()
                .join(" | ")
        );
        let failed = |what: &str, e: driver::DriverError| {
            BackendError::driver(format!("{what} while building {name}"), e)
        };
        let graph = driver::Graph::empty().map_err(|e| failed("creating the parent graph", e))?;
        let mut bounce: Vec<PinnedMemory> = Vec::new();
        let mut child_nodes: Vec<Option<GraphNode>> = vec![None; self.children.len()];
        // The node each transfer ends with (what its `to` child waits for).
        let mut transfer_ends: Vec<Option<GraphNode>> = vec![None; self.transfers.len()];
        for &child in &order {
            let mut dependencies: SmallVec<[GraphNode; 8]> = SmallVec::new();
            let mut wait_for = |node: Option<GraphNode>| {
                if let Some(node) = node {
                    if !dependencies.contains(&node) {
                        dependencies.push(node);
                    }
                }
            };
            for &(before, after) in &self.dependencies {
                if after == child {
                    wait_for(child_nodes[before as usize]);
                }
            }
            for (index, transfer) in self.transfers.iter().enumerate() {
                if transfer.to == child {
                    wait_for(transfer_ends[index]);
                }
            }
            let captured = &self.children[child as usize]
                .resources
                .as_ref()
                .ok_or_else(super::dropping)?
                .graph;
            let node = graph
                .add_child_graph(&dependencies, captured)
                .map_err(|e| failed("adding a child graph node", e))?;
            child_nodes[child as usize] = Some(node);
            for (index, transfer) in self.transfers.iter().enumerate() {
                if transfer.from != child {
                    continue;
                }
                let source_context = &self.children[transfer.from as usize]
                    .backend
                    .shared()
                    .context;
                let destination_context =
                    &self.children[transfer.to as usize].backend.shared().context;
                let source = CopyEnd::Device(transfer.source.address());
                let destination = CopyEnd::Device(transfer.destination.address());
                let len = transfer.bytes as usize;
                let end = match routes[index] {
                    // SAFETY: both ends are device allocations held by the parent (in
                    // `transfers`) for as long as its executable exists, each at least
                    // `len` bytes (checked by add_transfer).
                    TransferRoute::SameDevice => unsafe {
                        graph.add_copy(&[node], source, destination, len, source_context)
                    },
                    // SAFETY: as above; peer access from the destination's context to
                    // the source's was enabled by choose_routes.
                    TransferRoute::Peer => unsafe {
                        graph.add_copy(&[node], source, destination, len, destination_context)
                    },
                    TransferRoute::HostBounce => {
                        let staging = PinnedMemory::allocate(len)
                            .map_err(|e| failed("allocating pinned bounce staging", e))?;
                        let host = CopyEnd::Host(staging.address(0));
                        // SAFETY: the source is held by the parent; the staging (portable
                        // pinned memory, usable from every context) is owned by the parent,
                        // `len` bytes, and never touched by the host.
                        let down =
                            unsafe { graph.add_copy(&[node], source, host, len, source_context) }
                                .map_err(|e| failed("adding a device-to-host bounce copy", e))?;
                        bounce.push(staging);
                        // SAFETY: as above, for the destination and the same staging.
                        unsafe {
                            graph.add_copy(&[down], host, destination, len, destination_context)
                        }
                    }
                }
                .map_err(|e| failed("adding a transfer copy node", e))?;
                transfer_ends[index] = Some(end);
            }
        }
        home_inner.bind()?;
        let graph_nodes = graph
            .node_count()
            .map_err(|e| failed("counting the parent's nodes", e))?;
        let exec = graph
            .instantiate()
            .map_err(|e| failed("instantiating the parent graph", e))?;
        let stream = Stream::new().map_err(|e| failed("creating the parent's stream", e))?;
        let edges = self.edge_reports(&devices, &routes);
        let child_nodes = child_nodes
            .into_iter()
            .map(|node| {
                node.ok_or_else(|| BackendError::internal("a child was left out of the order"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let transfer_memory = std::mem::take(&mut self.transfers)
            .into_iter()
            .map(|t| (t.from, t.source, t.to, t.destination))
            .collect();
        Ok(StitchedGraph {
            id: self.id,
            name,
            driver: Some(ParentResources {
                exec,
                graph,
                stream,
                bounce,
            }),
            child_nodes,
            edges,
            graph_nodes,
            broken: None,
            transfer_memory,
            children: std::mem::take(&mut self.children),
            devices,
            home,
        })
    }

    /// Each transfer's route (see [`choose_route`]); enables peer access where the
    /// route is peer-to-peer.
    fn choose_routes(&self, devices: &[usize]) -> Result<Vec<TransferRoute>, BackendError> {
        let mut routes = Vec::with_capacity(self.transfers.len());
        for transfer in &self.transfers {
            let source = &self.children[transfer.from as usize].backend;
            let destination = &self.children[transfer.to as usize].backend;
            let (from_device, to_device) = (
                devices[transfer.from as usize],
                devices[transfer.to as usize],
            );
            let peer = if from_device != to_device && !transfer.through_host {
                driver::can_access_peer(
                    destination.shared().context.device(),
                    source.shared().context.device(),
                )
                .map_err(|e| {
                    BackendError::driver("asking whether two devices can access each other", e)
                })?
            } else {
                false
            };
            let route = choose_route(from_device, to_device, peer, transfer.through_host);
            if route == TransferRoute::Peer {
                destination
                    .shared()
                    .context
                    .enable_peer_access(&source.shared().context)
                    .map_err(|e| {
                        BackendError::driver(
                            format!("enabling peer access from device {to_device} to device {from_device}"),
                            e,
                        )
                    })?;
            }
            routes.push(route);
        }
        Ok(routes)
    }

    fn edge_reports(&self, devices: &[usize], routes: &[TransferRoute]) -> Vec<StitchEdge> {
        let edge = |before: u32, after: u32, kind| StitchEdge {
            before: before as usize,
            before_device: devices[before as usize],
            after: after as usize,
            after_device: devices[after as usize],
            kind,
        };
        let mut edges: Vec<StitchEdge> = Vec::new();
        for &(before, after) in &self.dependencies {
            let order = edge(before, after, EdgeKind::Order);
            if !edges.contains(&order) {
                edges.push(order);
            }
        }
        for (transfer, &route) in self.transfers.iter().zip(routes) {
            edges.push(edge(
                transfer.from,
                transfer.to,
                EdgeKind::Transfer {
                    bytes: transfer.bytes,
                    route,
                },
            ));
        }
        edges
    }
}

/// The route of one transfer (pure): forced through the host, else one device copy
/// on one device, else peer-to-peer where the destination can address the source,
/// else through the host.
pub(in crate::backend) fn choose_route(
    from_device: usize,
    to_device: usize,
    peer_access: bool,
    through_host: bool,
) -> TransferRoute {
    if through_host {
        TransferRoute::HostBounce
    } else if from_device == to_device {
        TransferRoute::SameDevice
    } else if peer_access {
        TransferRoute::Peer
    } else {
        TransferRoute::HostBounce
    }
}

/// `Ok` when a transfer's `end` buffer (on `buffer_device`) lives on the device of
/// the child it belongs to (`child`, on `child_device`), else a `Fix:` error (pure).
/// The source is read where its child wrote it, the destination written where its
/// child reads it; the transfer itself is what crosses devices.
pub(in crate::backend) fn check_transfer_end(
    end: &str,
    child: u32,
    buffer_device: usize,
    child_device: usize,
) -> Result<(), BackendError> {
    if buffer_device == child_device {
        return Ok(());
    }
    Err(BackendError::bad_input(format!(
        "Fix: the transfer's {end} buffer is of device {buffer_device}, but child {child} runs on device \
         {child_device}; pass a buffer of child {child}'s backend (the transfer copies between the two \
         children's devices itself)"
    )))
}

/// `child`'s index, checked to belong to stitch `stitch` of `children` children.
fn check_child(child: ChildId, stitch: u64, children: usize) -> Result<u32, BackendError> {
    if child.stitch != stitch {
        return Err(BackendError::bad_input(format!(
            "Fix: a child of stitch #{} was passed to stitch #{stitch}; use the ids each StitchBuilder \
             returned with that builder and the graph it built only",
            child.stitch
        )));
    }
    if child.index as usize >= children {
        return Err(BackendError::bad_input(format!(
            "Fix: child {} does not exist in stitch #{stitch}; the value was forged or corrupted",
            child.index
        )));
    }
    Ok(child.index)
}

/// The children in an order that respects every edge `(before, after)` (pure; Kahn's
/// algorithm, lowest index first among the ready ones). A cycle is a `Fix:` error
/// naming the children on it.
pub(in crate::backend) fn topological_order(
    children: usize,
    edges: &[(u32, u32)],
) -> Result<Vec<u32>, BackendError> {
    let mut waiting = vec![0usize; children];
    for &(before, after) in edges {
        if before as usize >= children || after as usize >= children {
            return Err(BackendError::internal(
                "an edge names a child that does not exist",
            ));
        }
        waiting[after as usize] += 1;
    }
    let mut ready: std::collections::BTreeSet<u32> = (0..children as u32)
        .filter(|&c| waiting[c as usize] == 0)
        .collect();
    let mut order = Vec::with_capacity(children);
    while let Some(child) = ready.pop_first() {
        order.push(child);
        for &(before, after) in edges {
            if before == child {
                waiting[after as usize] -= 1;
                if waiting[after as usize] == 0 {
                    ready.insert(after);
                }
            }
        }
    }
    if order.len() == children {
        return Ok(order);
    }
    let cycle = cycle_through(children, edges, &waiting);
    Err(BackendError::bad_input(format!(
        "Fix: the stitch's edges form a cycle: {}; a parent graph must be acyclic, so remove one of \
         those depend or transfer edges",
        cycle
            .iter()
            .map(|c| format!("child {c}"))
            .collect::<Vec<_>>()
            .join(" → ")
    )))
}

/// One cycle among the children Kahn's algorithm could not place (`waiting > 0`):
/// walk backwards along edges between such children until a child repeats.
fn cycle_through(children: usize, edges: &[(u32, u32)], waiting: &[usize]) -> Vec<u32> {
    let stuck = |c: u32| waiting[c as usize] > 0;
    let Some(start) = (0..children as u32).find(|&c| stuck(c)) else {
        return Vec::new();
    };
    let mut path = vec![start];
    let mut current = start;
    loop {
        // Every stuck child has a stuck predecessor (otherwise it would have been placed).
        let Some(&(before, _)) = edges
            .iter()
            .find(|&&(before, after)| after == current && stuck(before))
        else {
            return path;
        };
        if let Some(at) = path.iter().position(|&c| c == before) {
            // The path runs against the edges: reverse it, start at the lowest child.
            let mut cycle: Vec<u32> = path[at..].to_vec();
            cycle.reverse();
            let lowest = (0..cycle.len()).min_by_key(|&i| cycle[i]).unwrap_or(0);
            cycle.rotate_left(lowest);
            cycle.push(cycle[0]);
            return cycle;
        }
        path.push(before);
        current = before;
    }
}

/// Driver resources of a parent, in drop order.
struct ParentResources {
    exec: GraphExec,
    /// The parent graph `exec` was instantiated from: owned only to outlive `exec`
    /// (the child-node handles point into it).
    #[allow(dead_code)]
    graph: driver::Graph,
    stream: Stream,
    /// Pinned staging of the host-bounce transfers: owned only so the copy nodes'
    /// host ends stay valid while `exec` exists.
    #[allow(dead_code)]
    bounce: Vec<PinnedMemory>,
}

/// Per-device child graphs under one parent graph, replayed with one launch and
/// one synchronize. Built by [`StitchBuilder::build`]; see the module docs.
pub struct StitchedGraph {
    id: u64,
    name: String,
    /// `Some` until drop.
    driver: Option<ParentResources>,
    /// The child-graph node of each child.
    child_nodes: Vec<GraphNode>,
    edges: Vec<StitchEdge>,
    graph_nodes: usize,
    broken: Option<String>,
    /// Each transfer's ends: (source child, source memory, destination child,
    /// destination memory), freed in their own device's context.
    transfer_memory: Vec<(u32, Arc<DeviceMemory>, u32, Arc<DeviceMemory>)>,
    children: Vec<DispatchGraph>,
    devices: Vec<usize>,
    // Last: the parent's context outlives every handle above.
    home: CudaBackend,
}

impl std::fmt::Debug for StitchedGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StitchedGraph")
            .field("name", &self.name)
            .field("devices", &self.devices)
            .field("edges", &self.edges)
            .field("graph_nodes", &self.graph_nodes)
            .finish()
    }
}

impl std::fmt::Display for StitchedGraph {
    /// The children with their devices, then one line per edge (with each
    /// transfer's route).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "stitched graph #{}: {} children, {} parent nodes",
            self.id,
            self.children.len(),
            self.graph_nodes
        )?;
        for (index, (child, device)) in self.children.iter().zip(&self.devices).enumerate() {
            writeln!(f, "  child {index} on device {device}: {}", child.name)?;
        }
        for edge in &self.edges {
            writeln!(f, "  {edge}")?;
        }
        Ok(())
    }
}

impl StitchedGraph {
    /// Diagnostic name: the stitch's number and its children's names and devices.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Every edge, with each transfer's route.
    pub fn edges(&self) -> &[StitchEdge] {
        &self.edges
    }

    /// The route each transfer took, in the order the transfers were added.
    pub fn transfer_routes(&self) -> Vec<TransferRoute> {
        self.edges
            .iter()
            .filter_map(|edge| match edge.kind {
                EdgeKind::Transfer { route, .. } => Some(route),
                EdgeKind::Order => None,
            })
            .collect()
    }

    /// The device of each child, in child order.
    pub fn devices(&self) -> &[usize] {
        &self.devices
    }

    /// Nodes of the parent graph (one per child, one per copy).
    pub fn graph_nodes(&self) -> usize {
        self.graph_nodes
    }

    /// A child, to read its name, steps, element counts and outputs.
    pub fn child(&self, child: ChildId) -> Result<&DispatchGraph, BackendError> {
        let index = check_child(child, self.id, self.children.len())?;
        Ok(&self.children[index as usize])
    }

    /// The pinned bytes `slot` of `child` uploads on every replay (see
    /// [`DispatchGraph::input_mut`]).
    pub fn input_mut(
        &mut self,
        child: ChildId,
        slot: InputSlot,
    ) -> Result<&mut [u8], BackendError> {
        let index = check_child(child, self.id, self.children.len())?;
        self.children[index as usize].input_mut(slot)
    }

    /// The bytes `slot` of `child` read back during the last replay.
    pub fn output(&self, child: ChildId, slot: OutputSlot) -> Result<&[u8], BackendError> {
        self.child(child)?.output(slot)
    }

    /// Change the element count a step of `child` passes for `binding`, without
    /// re-capture (see [`DispatchGraph::set_element_count`]); the parent's clone of
    /// the child is updated too.
    pub fn set_element_count(
        &mut self,
        child: ChildId,
        step: StepId,
        binding: u32,
        elements: u32,
    ) -> Result<(), BackendError> {
        self.update_child(child, |graph| {
            graph.set_element_count(step, binding, elements)
        })
    }

    /// Change the workgroups a step of `child` launches, without re-capture (see
    /// [`DispatchGraph::set_workgroups`]); the parent's clone is updated too.
    pub fn set_workgroups(
        &mut self,
        child: ChildId,
        step: StepId,
        workgroups: [u32; 3],
    ) -> Result<(), BackendError> {
        self.update_child(child, |graph| graph.set_workgroups(step, workgroups))
    }

    /// Change the value a step of `child` passes for its scalar parameter `name`,
    /// without re-capture (see [`DispatchGraph::set_scalar`]); the parent's clone is
    /// updated too.
    pub fn set_scalar(
        &mut self,
        child: ChildId,
        step: StepId,
        name: &str,
        value: impl Into<Literal>,
    ) -> Result<(), BackendError> {
        let value = value.into();
        self.update_child(child, |graph| graph.set_scalar(step, name, value))
    }

    /// Apply `update` to the child (which validates it and writes its executable and
    /// captured graph), then copy the child's captured graph into the parent's clone.
    fn update_child(
        &mut self,
        child: ChildId,
        update: impl FnOnce(&mut DispatchGraph) -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        self.usable()?;
        let index = check_child(child, self.id, self.children.len())? as usize;
        update(&mut self.children[index])?;
        let inner = Arc::clone(self.home.shared());
        inner.check_alive()?;
        inner.bind()?;
        let node = self.child_nodes[index];
        let parent = self.driver.as_ref().ok_or_else(dropping)?;
        let captured = &self.children[index]
            .resources
            .as_ref()
            .ok_or_else(super::dropping)?
            .graph;
        // SAFETY: `node` is the child-graph node cloned from `captured` (same topology:
        // updates change parameters only); every address in it is held by the child;
        // replays synchronise before returning, so no launch of `exec` is running.
        let result = unsafe { parent.exec.set_child_graph_params(node, captured) };
        result.map_err(|error| {
            if error.is_sticky() {
                inner.mark_context_lost(format!("updating {} failed: {error}", self.name));
            }
            self.broken = Some(format!(
                "child {index} was updated but the parent's copy of it was not ({error})"
            ));
            BackendError::driver(format!("updating child {index} of {}", self.name), error)
        })
    }

    /// Replay the whole parent: one `cuGraphLaunch` on the first child's device and
    /// one synchronize (plus, only where a child's result area is not host-mapped,
    /// one fill before and one copy after on that child's stream).
    pub fn replay(&mut self) -> Result<Timings, BackendError> {
        let dispatch_probe = probe::begin_dispatch();
        let start = Instant::now();
        let mark = probe::mark();
        self.usable()?;
        if dispatch_probe.is_some() {
            super::count_steps_for_probe(self.children.iter().flat_map(|c| c.steps.iter()));
        }
        for child in &mut self.children {
            child.check_grid_syncs_fit()?;
            child.arm_as_child()?;
        }
        let inner = Arc::clone(self.home.shared());
        inner.check_alive()?;
        inner.bind()?;
        let mark = probe::charge_and_mark(Phase::Prepare, mark);
        let name = &self.name;
        let parent = self.driver.as_ref().ok_or_else(dropping)?;
        // SAFETY: every device allocation a node touches is held by a child (its
        // buffers) or by `transfer_memory`; pinned staging (children's slots, bounce
        // buffers) is owned by the children and `parent` and reachable by the host only
        // through `&mut self`/`&self` methods, which cannot run before the synchronize
        // below returns.
        unsafe { parent.exec.launch(&parent.stream) }
            .map_err(|e| inner.stream_failed(name, "launching the parent graph", e))?;
        let enqueued = Instant::now();
        let mark = probe::charge_and_mark(Phase::Launch, mark);
        let wait_ns = inner.synchronize_with(name, || parent.stream.synchronize())?;
        let mark = probe::charge_and_mark(Phase::Release, mark);
        let mut kernel_ns = 0u64;
        for child in &mut self.children {
            child.backend.shared().check_alive()?;
            kernel_ns = kernel_ns.saturating_add(child.collect_as_child()?);
        }
        // Outputs are read in place; the readback phase is the children's stamp
        // checks (and, without host-mapped areas, their copies back).
        probe::charge(Phase::Readback, mark);
        let timing = Timings {
            wall_ns: super::elapsed_ns(start),
            enqueue_ns: u64::try_from(enqueued.duration_since(start).as_nanos())
                .unwrap_or(u64::MAX),
            wait_ns,
            kernel_stamps_ns: kernel_ns,
            event_window_ns: None,
            lane_stamps: None,
        };
        if let Some(dispatch_probe) = dispatch_probe {
            dispatch_probe.finish(timing.probe());
        }
        Ok(timing)
    }

    fn usable(&self) -> Result<(), BackendError> {
        if let Some(why) = &self.broken {
            return Err(BackendError::bad_input(format!(
                "Fix: {} cannot replay: {why}; record the children again and stitch them anew",
                self.name
            )));
        }
        for child in &self.children {
            child.usable()?;
        }
        Ok(())
    }
}

fn dropping() -> BackendError {
    BackendError::internal("the stitched graph's resources are gone before its drop")
}

impl Drop for StitchedGraph {
    fn drop(&mut self) {
        let Some(parent) = self.driver.take() else {
            return;
        };
        let home = self.home.shared();
        let alive = home.check_alive().is_ok() && home.bind().is_ok();
        if alive && parent.stream.synchronize().is_ok() {
            drop(parent);
        } else {
            std::mem::forget(parent);
        }
        // Transfer memory is freed in its own device's context (or forgotten when
        // that context is gone); the children drop themselves afterwards.
        for (from, source, to, destination) in self.transfer_memory.drain(..) {
            for (child, memory) in [(from, source), (to, destination)] {
                release_in_context(&self.children[child as usize], memory);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(error: BackendError) -> String {
        let message = error.to_string();
        assert!(message.starts_with("Fix:"), "not a Fix message: {message}");
        message
    }

    /// Locks out an order that breaks an edge (a child cloned into the parent before
    /// a child it waits for, which `cuGraphAddChildGraphNode` cannot express): every
    /// edge's `before` comes first, unordered children keep their index order, and
    /// a diamond is ordered.
    #[test]
    fn topological_order_respects_every_edge() {
        let edges = [(2, 1), (0, 2), (3, 1), (0, 3)];
        let order = topological_order(5, &edges).unwrap();
        assert_eq!(order, [0, 2, 3, 1, 4]);
        let position = |c: u32| order.iter().position(|&o| o == c).unwrap();
        for (before, after) in edges {
            assert!(
                position(before) < position(after),
                "{before} → {after} in {order:?}"
            );
        }
        assert_eq!(topological_order(3, &[]).unwrap(), [0, 1, 2]);
        // Duplicate edges are harmless.
        assert_eq!(topological_order(2, &[(1, 0), (1, 0)]).unwrap(), [1, 0]);
    }

    /// Locks out a cyclic parent reaching the driver (instantiation would fail, or a
    /// replay would deadlock across devices): a cycle is a Fix error naming the
    /// children on it in edge order; negative control: the same edges minus one are
    /// accepted.
    #[test]
    fn cycles_are_refused_with_the_cycle_named() {
        let edges = [(0, 1), (1, 2), (2, 3), (3, 1)];
        let m = message(topological_order(5, &edges).unwrap_err());
        assert!(m.contains("child 1 → child 2 → child 3 → child 1"), "{m}");
        assert!(topological_order(5, &edges[..3]).is_ok());
        let m = message(topological_order(2, &[(0, 1), (1, 0)]).unwrap_err());
        assert!(m.contains("cycle"), "{m}");
    }

    /// Locks out a route choice that sends a cross-device copy peer-to-peer where the
    /// driver said no (a fault at replay), or bounces a same-device copy through the
    /// host unasked: the four cases, and the forced bounce winning over everything.
    #[test]
    fn routes_follow_devices_and_peer_access() {
        assert_eq!(choose_route(0, 0, false, false), TransferRoute::SameDevice);
        assert_eq!(choose_route(0, 0, true, false), TransferRoute::SameDevice);
        assert_eq!(choose_route(0, 1, true, false), TransferRoute::Peer);
        assert_eq!(choose_route(1, 0, false, false), TransferRoute::HostBounce);
        assert_eq!(choose_route(0, 1, true, true), TransferRoute::HostBounce);
        assert_eq!(choose_route(0, 0, false, true), TransferRoute::HostBounce);
    }

    /// Locks out an edge report that hides which route a transfer took: each route
    /// and an order-only edge print what they are, with devices and bytes.
    #[test]
    fn edges_say_which_route_was_used() {
        let edge = |kind| StitchEdge {
            before: 0,
            before_device: 0,
            after: 1,
            after_device: 1,
            kind,
        };
        let transfer = |route| EdgeKind::Transfer { bytes: 4000, route };
        assert_eq!(
            edge(transfer(TransferRoute::Peer)).to_string(),
            "child 0 (device 0) → child 1 (device 1): peer copy of 4000 bytes"
        );
        assert_eq!(
            edge(transfer(TransferRoute::HostBounce)).to_string(),
            "child 0 (device 0) → child 1 (device 1): host bounce through pinned memory of 4000 bytes"
        );
        assert!(edge(transfer(TransferRoute::SameDevice))
            .to_string()
            .ends_with("same-device copy of 4000 bytes"));
        assert!(edge(EdgeKind::Order).to_string().ends_with("order only"));
    }

    /// Locks out ids that a stitch accepts from another stitch (its nodes would be
    /// some other graph's) or past its children.
    #[test]
    fn foreign_and_forged_children_are_refused() {
        let mut builder = StitchBuilder::new();
        let other = StitchBuilder::new();
        let foreign = ChildId {
            stitch: other.id,
            index: 0,
        };
        let m = message(builder.depend(foreign, foreign).unwrap_err());
        assert!(m.contains("was passed to stitch"), "{m}");
        let forged = ChildId {
            stitch: builder.id,
            index: 3,
        };
        let m = message(builder.depend(forged, forged).unwrap_err());
        assert!(m.contains("does not exist"), "{m}");
        assert_eq!(check_child(forged, builder.id, 4).unwrap(), 3);
    }

    /// Locks out building an empty stitch (nothing to launch; the driver would be
    /// handed an empty parent) — refused before any driver call, so it runs here.
    #[test]
    fn an_empty_stitch_is_refused() {
        let m = message(StitchBuilder::new().build().unwrap_err());
        assert!(m.contains("no children"), "{m}");
    }

    /// Locks out a recording that binds another device's buffer or kernel (its
    /// capture would fail in the driver and could leave the stream unusable): the
    /// message names both devices and the way out; negative control: the same
    /// device passes.
    #[test]
    fn cross_device_use_in_a_recording_is_refused() {
        let m = message(super::super::record::check_device("a buffer", 1, 0).unwrap_err());
        assert!(m.contains("of device 1"), "{m}");
        assert!(m.contains("recording on device 0"), "{m}");
        assert!(
            m.contains("acquire_device(1)") && m.contains("StitchBuilder"),
            "{m}"
        );
        assert!(super::super::record::check_device("a buffer", 2, 2).is_ok());
    }

    /// Locks out a transfer whose end lives on another device than its child (the
    /// copy node would read bytes its child never wrote, or write where the next child
    /// does not read): the message names the end, both devices and the child;
    /// negative control: matching devices pass.
    #[test]
    fn transfer_ends_must_live_on_their_childs_device() {
        let m = message(check_transfer_end("source", 2, 1, 0).unwrap_err());
        assert!(m.contains("source buffer is of device 1"), "{m}");
        assert!(m.contains("child 2 runs on device 0"), "{m}");
        assert!(check_transfer_end("destination", 0, 3, 3).is_ok());
    }
}
