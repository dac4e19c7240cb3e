//! A blocking dispatch reuses the plan, the resolved bindings and the readback routes
//! of the previous blocking dispatch on its thread when it is the same request: the
//! same kernel, grid, fixpoint count and readback over the same owned buffers.
//!
//! # Why
//!
//! A tokenizer's hot loop (and the dispatch bench) runs one compiled kernel over the
//! same device buffers thousands of times. Planning such a request again (binding
//! sizes, the rule for a buffer bound twice, the readback plan, the launch plan
//! behind its mutex) and routing its readback again (placement in the result area,
//! one result-ABI descriptor per item, the deliveries) gave the same answer every
//! time, and it was what grew with bindings: measured on the build machine
//! (callgrind, warm `run` of the 17-buffer fixture with a stand-in driver), planning
//! took 2,100 and routing 1,700 of a dispatch's 15,000 host instructions. The check
//! that the answer still holds costs one comparison per binding, made while
//! resolving each buffer's memory, which every dispatch does anyway.
//!
//! # What is reused, and when
//!
//! Every blocking `run` and `run_into` takes this thread's [`Bookkeeping`] (one
//! allocation per thread, kept between dispatches) and gives it back when done. Its
//! [`Memo`] says which request its plan and resolved bindings were made for; the
//! routes say which result area (so which lane) they place items in. A request
//! matches when every binding is the same [`DeviceBuffer`] (its address: what the
//! rule for a buffer bound twice compares) with the same
//! length and device memory, the kernel has the same backend and module key (so the
//! same slots), and grid, fixpoint count and readback policy (every output or none;
//! byte ranges are planned each time) are equal. Then the plan (the request checks
//! passed for exactly these values) and the addresses stand; the scalar values are
//! not part of the match (a loop that changes a value each time reuses its plan as
//! well): they are checked again, and the launch passes the words of the request
//! being dispatched; the caller's output
//! slices are still checked, and the stream operations are still described by
//! `StreamOps::dispatch` from the reused values, as a graph step's are. The routes
//! stand too when the dispatch leased the lane that holds their result area (a loop
//! on one thread gets the same lane back from the pool); the area's stamps are
//! cleared for every dispatch all the same. Anything else plans and routes anew,
//! and the memo stays invalid from the start of a dispatch until it has routed its
//! readback, so a dispatch that failed halfway leaves nothing to reuse. A
//! submission never reuses: its bookkeeping is its own and it holds its buffers.
//!
//! A persistent lane (`backend::lane`) keeps a [`Memo`] for each of its last four
//! distinct requests under its lock for the same purpose: a repeat of one reuses that
//! request's plan, bindings, zero fills and readback placement, and writes its record
//! anew unless it repeats the request that rang last with the same scalar values.
//!
//! `Memo::describes` takes the request apart field by field, so a field added to
//! [`Dispatch`] does not compile until it is placed: in the key, or among the fields
//! the plan does not depend on. A value the plan checks but the key leaves out must be
//! checked again by `BackendInner::replan`, which runs instead of the plan.

use std::cell::Cell;

use crate::config::ReadbackPolicy;

use super::super::kernel::KernelInner;
use super::super::{BackendInner, Binding, DeviceBuffer, Dispatch, ModuleKey, PerBinding};
use super::stage::Bookkeeping;

thread_local! {
    /// This thread's bookkeeping for blocking dispatches, between two of them.
    static BOOKS: Cell<Option<Box<Bookkeeping>>> = const { Cell::new(None) };
}

/// This thread's bookkeeping (a new one on first use, or while a dispatch nested in
/// another one on this thread has it).
pub(super) fn take_thread_books() -> Box<Bookkeeping> {
    BOOKS
        .try_with(Cell::take)
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Keep `books` for this thread's next blocking dispatch.
pub(super) fn keep_thread_books(books: Box<Bookkeeping>) {
    let _ = BOOKS.try_with(|cell| cell.set(Some(books)));
}

/// What names a kernel's binding plan in a [`Memo`]: its backend and module key.
pub(in crate::backend) fn kernel_identity(kernel: &KernelInner) -> (u64, ModuleKey) {
    (kernel.backend_id, kernel.module_key)
}

/// The device address of `buffer`'s memory on `inner`'s backend (`None` for a
/// buffer of another backend).
pub(in crate::backend) fn address_on(inner: &BackendInner, buffer: &DeviceBuffer) -> Option<u64> {
    buffer
        .memory_for(inner, "dispatch with")
        .ok()
        .map(|memory| memory.address())
}

/// The request a bookkeeping's plan and resolved bindings were made for.
#[derive(Default)]
pub(in crate::backend) struct Memo {
    /// Whether the plan, the resolved bindings and the routes are those of the
    /// request below: set once a blocking dispatch has routed its readback, cleared
    /// when the next dispatch begins.
    valid: bool,
    /// The backend and module key of the kernel (which fix its slots).
    kernel: Option<(u64, ModuleKey)>,
    workgroups: [u32; 3],
    fixpoint_iterations: u32,
    /// `ReadbackPolicy::AllOutputs` (true) or `ReadbackPolicy::None` (false).
    reads_all_outputs: bool,
    /// Per binding: the address of the `DeviceBuffer` bound, its bytes, and the
    /// device address of its memory.
    bindings: PerBinding<(usize, u64, u64)>,
}

/// Whether a readback policy can be reused (every output, or none) and which.
fn reads_all_outputs(policy: &ReadbackPolicy) -> Option<bool> {
    match policy {
        ReadbackPolicy::AllOutputs => Some(true),
        ReadbackPolicy::None => Some(false),
        _ => None,
    }
}

impl Memo {
    /// Whether `request` of the kernel `kernel` (its backend and module key) is the
    /// request the memo describes (see the module docs). `address_of` resolves a
    /// bound buffer's memory to its device address (`None` for a buffer of another
    /// backend: no match, and planning it again gives its error).
    pub(in crate::backend) fn describes(
        &self,
        kernel: (u64, ModuleKey),
        request: &Dispatch<'_>,
        address_of: impl Fn(&DeviceBuffer) -> Option<u64>,
    ) -> bool {
        // Every field of the request, so a new one cannot be forgotten here: the
        // target is `kernel` (checked below), the code-generation options only
        // choose it, timing and the predecessor change what is enqueued around the
        // launch, never the plan or the routes, and the scalar values are never
        // reused: `replan` checks them again and the launch takes its words from
        // the request being dispatched.
        let Dispatch {
            target: _,
            bindings,
            workgroups,
            fixpoint_iterations,
            readback,
            codegen: _,
            timing: _,
            after: _,
            scalars: _,
            scalar_problem: _,
        } = *request;
        if !self.valid
            || self.kernel != Some(kernel)
            || self.workgroups != workgroups
            || self.fixpoint_iterations != fixpoint_iterations
            || reads_all_outputs(readback) != Some(self.reads_all_outputs)
            || self.bindings.len() != bindings.len()
        {
            return false;
        }
        bindings.iter().zip(&self.bindings).all(
            |(binding, &(buffer, bytes, address))| match binding {
                Binding::Buffer(bound) => {
                    *bound as *const DeviceBuffer as usize == buffer
                        && bound.len() == bytes
                        && address_of(bound) == Some(address)
                }
                _ => false,
            },
        )
    }

    /// Start a dispatch: nothing is valid until it has routed its readback.
    pub(in crate::backend) fn invalidate(&mut self) {
        self.valid = false;
    }

    /// Remember that the bookkeeping now describes `request` of `kernel`, its
    /// bindings resolved to `addresses` (it did already when the dispatch `reused`
    /// it); a request that
    /// cannot be reused (a binding other than an owned buffer, readback by byte
    /// ranges) leaves the memo invalid.
    pub(in crate::backend) fn record(
        &mut self,
        kernel: (u64, ModuleKey),
        request: &Dispatch<'_>,
        (addresses, reused): (&[u64], bool),
    ) {
        if reused {
            self.valid = true;
            return;
        }
        let Some(reads_all_outputs) = reads_all_outputs(request.readback) else {
            return;
        };
        self.bindings.clear();
        for (binding, &address) in request.bindings.iter().zip(addresses) {
            let Binding::Buffer(buffer) = binding else {
                return;
            };
            self.bindings.push((
                *buffer as *const DeviceBuffer as usize,
                buffer.len(),
                address,
            ));
        }
        self.kernel = Some(kernel);
        self.workgroups = request.workgroups;
        self.fixpoint_iterations = request.fixpoint_iterations;
        self.reads_all_outputs = reads_all_outputs;
        self.valid = true;
    }
}

impl Bookkeeping {
    /// Begin a dispatch on this bookkeeping: no transfers yet, and unless it
    /// `reuse`s the plan and resolved bindings, none of those either (`route` makes
    /// its routes anew unless it reuses them).
    pub(super) fn begin(&mut self, reuse: bool) {
        self.memo.invalidate();
        let transfers = &mut self.transfers;
        transfers.uploads.clear();
        transfers.pinned_uploads.clear();
        transfers.clears.clear();
        if reuse {
            return;
        }
        self.plan.request.sizes.clear();
        self.plan.request.reads.clear();
        self.staged.addresses.clear();
        self.staged.accesses.reads.clear();
        self.staged.accesses.writes.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Kernel, ReferenceBackend, Timing};
    use crate::config::{ByteRange, CodegenOptions};

    /// The measurement fixture at `bindings` buffers, compiled on the reference
    /// backend, and `buffers` buffers of 16 bytes on the same backend.
    fn fixture(bindings: u32, buffers: usize) -> (Kernel, Vec<DeviceBuffer>) {
        let backend = ReferenceBackend::new();
        let program = crate::fixtures::host_cost_fixture(bindings, 4);
        let kernel = backend
            .compile(&program, &CodegenOptions::new())
            .expect("compile");
        let buffers = (0..buffers).map(|_| backend.buffer(16).unwrap()).collect();
        (kernel, buffers)
    }

    /// A fake device address per buffer: its index among `buffers`, shifted.
    fn addresses<'a>(buffers: &'a [DeviceBuffer]) -> impl Fn(&DeviceBuffer) -> Option<u64> + 'a {
        move |buffer| {
            buffers
                .iter()
                .position(|b| std::ptr::eq(b, buffer))
                .map(|index| 0x1000 * (index as u64 + 1))
        }
    }

    /// Locks out a reused plan or route for a request it was not made for: after a
    /// request is recorded, the same request matches (the control), and changing
    /// any one thing its plan or routes depend on does not: the kernel's backend or
    /// module, the grid, the fixpoint count, the readback policy, a binding's buffer
    /// (another one of the same length), its device memory, its being resolvable,
    /// the binding count; an invalidated memo matches nothing until recorded again.
    #[test]
    fn only_the_recorded_request_matches() {
        let (kernel, buffers) = fixture(3, 4);
        let bindings: Vec<Binding> = buffers[..3].iter().map(Binding::from).collect();
        let request = Dispatch::new(&kernel, &bindings);
        let identity = (7, ModuleKey(42));
        let address_of = addresses(&buffers);
        let mut memo = Memo::default();
        assert!(!memo.describes(identity, &request, &address_of));
        let resolved = [0x1000, 0x2000, 0x3000];
        memo.record(identity, &request, (&resolved, false));
        assert!(memo.describes(identity, &request, &address_of));
        // Timing and the code generation options change nothing the memo holds.
        let timed = request.timing(Timing::EventWindow);
        assert!(memo.describes(identity, &timed, &address_of));

        assert!(!memo.describes((8, ModuleKey(42)), &request, &address_of));
        assert!(!memo.describes((7, ModuleKey(43)), &request, &address_of));
        let grid = request.workgroups([2, 1, 1]);
        assert!(!memo.describes(identity, &grid, &address_of));
        let fixpoint = request.fixpoint_iterations(2);
        assert!(!memo.describes(identity, &fixpoint, &address_of));
        let none = ReadbackPolicy::None;
        assert!(!memo.describes(identity, &request.readback(&none), &address_of));
        let ranges = ReadbackPolicy::Ranges(smallvec::smallvec![ByteRange {
            binding: 1,
            offset: 0,
            len: 4
        }]);
        assert!(!memo.describes(identity, &request.readback(&ranges), &address_of));
        let swapped = [
            Binding::from(&buffers[0]),
            Binding::from(&buffers[3]),
            Binding::from(&buffers[2]),
        ];
        assert!(!memo.describes(identity, &Dispatch::new(&kernel, &swapped), &address_of));
        let moved = |buffer: &DeviceBuffer| address_of(buffer).map(|a| a + 256);
        assert!(!memo.describes(identity, &request, moved));
        assert!(!memo.describes(identity, &request, |_: &DeviceBuffer| None));
        let fewer = Dispatch::new(&kernel, &bindings[..2]);
        assert!(!memo.describes(identity, &fewer, &address_of));

        memo.invalidate();
        assert!(!memo.describes(identity, &request, &address_of));
        memo.record(identity, &request, (&resolved, true));
        assert!(memo.describes(identity, &request, &address_of));
    }

    /// Locks out reuse of a request whose plan depends on more than its buffers and
    /// shape: one with a host binding (its transient and upload differ per
    /// dispatch) or with readback by byte ranges is never recorded, and recording
    /// it forgets what was recorded before. Control: the all-buffer request with
    /// every output read back is recorded.
    #[test]
    fn requests_with_transients_or_ranges_are_never_recorded() {
        let (kernel, buffers) = fixture(2, 2);
        let bindings: Vec<Binding> = buffers.iter().map(Binding::from).collect();
        let address_of = addresses(&buffers);
        let identity = (1, ModuleKey(1));
        let resolved = [0x1000, 0x2000];
        let mut memo = Memo::default();
        let request = Dispatch::new(&kernel, &bindings);
        memo.record(identity, &request, (&resolved, false));
        assert!(memo.describes(identity, &request, &address_of));

        let host = [0u8; 16];
        let mixed = [Binding::from(&buffers[0]), Binding::Host(&host)];
        memo.invalidate();
        memo.record(
            identity,
            &Dispatch::new(&kernel, &mixed),
            (&resolved, false),
        );
        assert!(!memo.describes(identity, &Dispatch::new(&kernel, &mixed), &address_of));
        assert!(!memo.describes(identity, &request, &address_of));

        let ranges = ReadbackPolicy::Ranges(smallvec::smallvec![ByteRange {
            binding: 1,
            offset: 0,
            len: 4
        }]);
        memo.record(identity, &request.readback(&ranges), (&resolved, false));
        assert!(!memo.describes(identity, &request.readback(&ranges), &address_of));
    }

    /// Locks out a dispatch that inherits another's transfers, or plans on top of
    /// an earlier plan: beginning always empties the transfers and invalidates the
    /// memo; without reuse it also empties every list the plan and staging fill,
    /// with reuse it keeps them (the control).
    #[test]
    fn beginning_a_dispatch_clears_what_it_will_fill() {
        use crate::backend::plan::ReadItem;
        use crate::backend::stream_ops::{Clear, StagedCopy};
        let fill = |books: &mut Bookkeeping| {
            books.plan.request.sizes.push(16);
            books.plan.request.reads.push(ReadItem {
                slot: 0,
                offset: 0,
                len: 16,
                staging_offset: 0,
            });
            books.staged.addresses.push(0x1000);
            books.staged.accesses.reads.push(0x1000);
            books.staged.accesses.writes.push(0x2000);
            books.transfers.uploads.push(StagedCopy {
                device: 0x1000,
                staging_offset: 0,
                len: 16,
            });
            books.transfers.clears.push(Clear {
                device: 0x2000,
                bytes: 16,
            });
            books.memo.valid = true;
        };
        let mut books = Bookkeeping::default();
        fill(&mut books);
        books.begin(true);
        assert!(books.transfers.uploads.is_empty() && books.transfers.clears.is_empty());
        assert!(!books.memo.valid);
        assert_eq!(books.plan.request.sizes.as_slice(), &[16]);
        assert_eq!(books.staged.addresses.as_slice(), &[0x1000]);

        fill(&mut books);
        books.begin(false);
        assert!(books.transfers.uploads.is_empty() && books.transfers.clears.is_empty());
        assert!(!books.memo.valid);
        assert!(books.plan.request.sizes.is_empty() && books.plan.request.reads.is_empty());
        assert!(books.staged.addresses.is_empty() && books.staged.accesses.is_empty());
    }

    /// Locks out a thread's bookkeeping that is lost or shared: what one blocking
    /// dispatch keeps, the next one on the thread takes back (the same allocation),
    /// and while it is taken a nested dispatch gets its own.
    #[test]
    fn a_thread_keeps_one_bookkeeping_between_dispatches() {
        let first = take_thread_books();
        let address = &*first as *const Bookkeeping;
        let nested = take_thread_books();
        assert!(!std::ptr::eq(&*nested, address));
        drop(nested);
        keep_thread_books(first);
        let again = take_thread_books();
        assert!(std::ptr::eq(&*again, address));
        keep_thread_books(again);
    }
}
