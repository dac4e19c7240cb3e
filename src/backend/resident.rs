//! Resident buffers (§4.3): device memory that outlives dispatches, named by
//! generation-checked handles.
//!
//! A handle is a plain `Copy` value (backend id, slot, generation), so misuse is
//! detectable without unsafe: a double free, a stale handle (its slot was reused)
//! or a handle from another backend is an `Err`, never a use of freed memory.
//! Memory is held in an `Arc`: a dispatch in flight keeps its buffers alive even if
//! another thread frees the handle meanwhile.

use std::sync::Arc;

use super::driver::DeviceMemory;
use super::error::BackendError;

/// A handle to a resident device buffer. Cheap to copy; checked on every use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ResidentBuffer {
    pub(crate) backend_id: u64,
    pub(crate) slot: u32,
    pub(crate) generation: u32,
    pub(crate) bytes: u64,
}

impl ResidentBuffer {
    /// Size in bytes.
    pub fn len(&self) -> u64 {
        self.bytes
    }

    /// True for a zero-byte buffer.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
}

/// Storage behind a slot. Generic so the generation logic is tested without a GPU.
pub(crate) struct Slot<M> {
    generation: u32,
    memory: Option<Arc<M>>,
    bytes: u64,
}

/// The table of resident buffers of one backend.
pub(crate) struct ResidentTable<M = DeviceMemory> {
    backend_id: u64,
    slots: Vec<Slot<M>>,
    free_slots: Vec<u32>,
    live_bytes: u64,
    live_count: u64,
}

impl<M> ResidentTable<M> {
    pub(crate) fn new(backend_id: u64) -> Self {
        ResidentTable {
            backend_id,
            slots: Vec::new(),
            free_slots: Vec::new(),
            live_bytes: 0,
            live_count: 0,
        }
    }

    /// Bytes held by live buffers.
    pub(crate) fn live_bytes(&self) -> u64 {
        self.live_bytes
    }

    /// Number of live buffers.
    pub(crate) fn live_count(&self) -> u64 {
        self.live_count
    }

    pub(crate) fn insert(&mut self, memory: M, bytes: u64) -> ResidentBuffer {
        let slot = match self.free_slots.pop() {
            Some(s) => s,
            None => {
                self.slots.push(Slot {
                    generation: 0,
                    memory: None,
                    bytes: 0,
                });
                (self.slots.len() - 1) as u32
            }
        };
        let entry = &mut self.slots[slot as usize];
        entry.memory = Some(Arc::new(memory));
        entry.bytes = bytes;
        self.live_bytes = self.live_bytes.saturating_add(bytes);
        self.live_count += 1;
        ResidentBuffer {
            backend_id: self.backend_id,
            slot,
            generation: entry.generation,
            bytes,
        }
    }

    fn check(&self, handle: &ResidentBuffer, verb: &str) -> Result<&Slot<M>, BackendError> {
        if handle.backend_id != self.backend_id {
            return Err(BackendError::InvalidHandle {
                message: format!(
                    "Fix: cannot {verb} a resident buffer that belongs to another CudaBackend \
                     (backend {} vs this one, {}); use the backend that allocated it",
                    handle.backend_id, self.backend_id
                ),
            });
        }
        let slot =
            self.slots
                .get(handle.slot as usize)
                .ok_or_else(|| BackendError::InvalidHandle {
                    message: format!(
                    "Fix: cannot {verb} resident buffer slot {}: no such slot in this backend; \
                     the handle was forged or corrupted",
                    handle.slot
                ),
                })?;
        if slot.generation != handle.generation || slot.memory.is_none() {
            return Err(BackendError::InvalidHandle {
                message: format!(
                    "Fix: cannot {verb} resident buffer slot {} generation {}: it was already freed \
                     (double free or stale handle; the slot is now at generation {}); keep using only \
                     handles returned by allocate_resident since their last free",
                    handle.slot, handle.generation, slot.generation
                ),
            });
        }
        Ok(slot)
    }

    /// The memory behind a live handle (kept alive by the returned `Arc`).
    pub(crate) fn get(&self, handle: &ResidentBuffer, verb: &str) -> Result<&Arc<M>, BackendError> {
        let slot = self.check(handle, verb)?;
        slot.memory
            .as_ref()
            .ok_or_else(|| BackendError::internal("a live resident slot has no memory"))
    }

    /// Free a handle's slot; the memory is released once no dispatch holds it.
    pub(crate) fn remove(&mut self, handle: &ResidentBuffer) -> Result<Arc<M>, BackendError> {
        self.check(handle, "free")?;
        let entry = &mut self.slots[handle.slot as usize];
        let memory = entry.memory.take();
        entry.generation = entry.generation.wrapping_add(1);
        self.live_bytes = self.live_bytes.saturating_sub(entry.bytes);
        self.live_count = self.live_count.saturating_sub(1);
        entry.bytes = 0;
        self.free_slots.push(handle.slot);
        memory.ok_or_else(|| BackendError::internal("a live resident slot has no memory"))
    }

    /// Drop every buffer (without freeing through the driver when `leak` is set,
    /// used after a context reset made the addresses meaningless).
    pub(crate) fn clear(&mut self, leak: bool) {
        for slot in &mut self.slots {
            if let Some(memory) = slot.memory.take() {
                if leak {
                    std::mem::forget(memory);
                }
            }
            slot.generation = slot.generation.wrapping_add(1);
        }
        self.live_bytes = 0;
        self.live_count = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(e: BackendError) -> String {
        e.to_string()
    }

    /// Locks out use-after-free through handles: double free, stale handles after slot
    /// reuse and handles from another backend must all be errors with a Fix message.
    #[test]
    fn generations_reject_double_free_stale_and_foreign_handles() {
        let mut table: ResidentTable<Vec<u8>> = ResidentTable::new(7);
        let a = table.insert(vec![1, 2, 3], 3);
        assert_eq!(table.live_bytes(), 3);
        assert_eq!(**table.get(&a, "read").unwrap(), vec![1, 2, 3]);
        table.remove(&a).unwrap();
        assert_eq!(table.live_bytes(), 0);

        // Double free.
        let m = message(table.remove(&a).unwrap_err());
        assert!(m.starts_with("Fix:") && m.contains("already freed"), "{m}");

        // The slot is reused: the old handle is stale, the new one works.
        let b = table.insert(vec![9], 1);
        assert_eq!(b.slot, a.slot);
        assert_ne!(b.generation, a.generation);
        let m = message(table.get(&a, "read").unwrap_err());
        assert!(m.contains("stale handle"), "{m}");
        assert_eq!(**table.get(&b, "read").unwrap(), vec![9]);

        // Foreign backend.
        let other: ResidentTable<Vec<u8>> = ResidentTable::new(8);
        let m = message(other.get(&b, "read").unwrap_err());
        assert!(
            m.starts_with("Fix:") && m.contains("another CudaBackend"),
            "{m}"
        );

        // Forged slot.
        let forged = ResidentBuffer { slot: 999, ..b };
        assert!(message(table.get(&forged, "read").unwrap_err()).contains("no such slot"));
    }

    /// Locks out freeing memory a dispatch still uses: the Arc taken by a dispatch
    /// keeps the memory alive after the handle is freed.
    #[test]
    fn in_flight_reference_outlives_free() {
        let mut table: ResidentTable<Vec<u8>> = ResidentTable::new(1);
        let a = table.insert(vec![5; 4], 4);
        let in_flight = Arc::clone(table.get(&a, "dispatch").unwrap());
        let freed = table.remove(&a).unwrap();
        drop(freed);
        assert_eq!(*in_flight, vec![5; 4]);
        assert_eq!(table.live_count(), 0);
    }
}
