//! The bytes one dispatch read back, in one allocation, addressable by buffer name
//! and by binding.
//!
//! # Why
//!
//! A dispatch's outputs used to come back as `Vec<Vec<u8>>`: one heap allocation (and
//! one free when the caller drops it) per readback item. For the small outputs the
//! result ABI delivers at the physical limit that became a visible share of the host
//! cost: measured on the build machine (2026-12-01), 16 output `Vec`s of 16 bytes
//! allocated, filled and dropped cost 0.50 µs; on the H200 the 17-buffer fixture's
//! dispatch over device buffers spent 3.4 µs above the raw result-ABI floor, and its readback
//! phase grew by 0.58 µs from 1 output to 16. [`Outputs`] keeps every item's bytes
//! back to back in one `Vec<u8>` and their end offsets and bindings inline (no
//! allocation for up to [`INLINE_ITEMS`] items), so a dispatch allocates once, and
//! not at all when it reads nothing back.
//!
//! An item is found by what the caller knows: the buffer's name in the program
//! ([`Outputs::get`]), its binding slot ([`Outputs::binding`]), or its position
//! among the readback items ([`Outputs::item`]: with
//! [`ReadbackPolicy::Ranges`](crate::ReadbackPolicy) one buffer can give several).
//! [`Outputs::read`] copies an item into typed host values.

use std::fmt;

use bytemuck::Pod;
use smallvec::SmallVec;

use super::{BackendError, Kernel};

/// Readback items an [`Outputs`] records without a heap allocation for their offsets.
pub const INLINE_ITEMS: usize = 16;

/// The bytes a dispatch read back: one item per readback item (see
/// [`ReadbackPolicy`](crate::ReadbackPolicy)), in order, stored back to back, each
/// with the binding slot of the buffer it came from.
#[derive(Clone, Default)]
pub struct Outputs {
    bytes: Vec<u8>,
    /// End offset in `bytes` of each item.
    ends: SmallVec<[usize; INLINE_ITEMS]>,
    /// Binding slot of each item's buffer.
    bindings: SmallVec<[u32; INLINE_ITEMS]>,
    /// The kernel that ran, for lookups by buffer name (`None` for outputs built
    /// by hand).
    kernel: Option<Kernel>,
}

impl Outputs {
    /// No items yet, room for `bytes` bytes, names from `kernel`.
    pub(in crate::backend) fn with_capacity(bytes: usize, kernel: Option<Kernel>) -> Outputs {
        Outputs {
            bytes: Vec::with_capacity(bytes),
            ends: SmallVec::new(),
            bindings: SmallVec::new(),
            kernel,
        }
    }

    /// No items yet, room for `bytes` bytes, and the binding slot of each item to
    /// come, in order: the dispatch path then appends every item's bytes with
    /// [`Outputs::push_item`], in the same order (one copy and one end offset per
    /// item; the bindings are copied once).
    pub(in crate::backend) fn for_items(bytes: usize, bindings: &[u32]) -> Outputs {
        Outputs {
            bytes: Vec::with_capacity(bytes),
            ends: SmallVec::with_capacity(bindings.len()),
            bindings: SmallVec::from_slice(bindings),
            kernel: None,
        }
    }

    /// Append the bytes of the next item of [`Outputs::for_items`].
    #[inline]
    pub(in crate::backend) fn push_item(&mut self, item: &[u8]) {
        self.bytes.extend_from_slice(item);
        self.ends.push(self.bytes.len());
    }

    /// Name the items by `kernel`'s buffers (for [`Outputs::get`]).
    pub(in crate::backend) fn name_by(&mut self, kernel: Kernel) {
        self.kernel = Some(kernel);
    }

    /// Append one item read from the buffer at binding slot `binding`.
    #[inline]
    pub(in crate::backend) fn push(&mut self, binding: u32, item: &[u8]) {
        self.bytes.extend_from_slice(item);
        self.ends.push(self.bytes.len());
        self.bindings.push(binding);
    }

    /// Append items, each `(binding slot of its buffer, length)`, whose bytes `fill`
    /// writes back to back in one call (a lane copies its result area straight in,
    /// items adjacent in the area with one copy).
    pub(in crate::backend) fn push_filled(
        &mut self,
        items: impl IntoIterator<Item = (u32, usize)>,
        fill: impl FnOnce(&mut [u8]),
    ) {
        let start = self.bytes.len();
        let mut end = start;
        for (binding, len) in items {
            end += len;
            self.ends.push(end);
            self.bindings.push(binding);
        }
        self.bytes.resize(end, 0);
        fill(&mut self.bytes[start..]);
    }

    /// How many items (readback items of the dispatch).
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether the dispatch read nothing back.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Item `index`'s bytes (readback items in order), or `None` past the last.
    pub fn item(&self, index: usize) -> Option<&[u8]> {
        let end = *self.ends.get(index)?;
        let start = if index == 0 { 0 } else { self.ends[index - 1] };
        Some(&self.bytes[start..end])
    }

    /// The binding slot of item `index`'s buffer.
    pub fn item_binding(&self, index: usize) -> Option<u32> {
        self.bindings.get(index).copied()
    }

    /// The bytes read back from the buffer at binding slot `binding`. An `Err`
    /// starting `Fix:` when nothing was read from it (not an output, or not in the
    /// readback policy) or when several ranges were (take them by position with
    /// [`Outputs::item`]).
    pub fn binding(&self, binding: u32) -> Result<&[u8], BackendError> {
        let mut found = self
            .bindings
            .iter()
            .enumerate()
            .filter(|(_, &b)| b == binding);
        match (found.next(), found.next()) {
            (Some((index, _)), None) => self.item(index).ok_or_else(|| {
                BackendError::internal("an output item has a binding but no bytes")
            }),
            (Some(_), Some(_)) => Err(BackendError::bad_input(format!(
                "Fix: several readback ranges came from binding {binding}; take them by position \
                 with Outputs::item"
            ))),
            (None, _) => Err(BackendError::bad_input(format!(
                "Fix: nothing was read back from binding {binding} (items came from bindings {:?}); \
                 name an output buffer the readback policy reads",
                self.bindings.as_slice()
            ))),
        }
    }

    /// The bytes read back from the buffer the program names `name`: as
    /// [`Outputs::binding`], with the buffer named as in the program.
    pub fn get(&self, name: &str) -> Result<&[u8], BackendError> {
        let Some(kernel) = &self.kernel else {
            return Err(BackendError::bad_input(format!(
                "Fix: these outputs carry no buffer names; look '{name}' up by binding with \
                 Outputs::binding"
            )));
        };
        match kernel.binding_named(name) {
            Some(binding) => self.binding(binding),
            None => Err(BackendError::bad_input(format!(
                "Fix: {} has no global buffer named '{name}'; name one of its buffers",
                kernel.name()
            ))),
        }
    }

    /// [`Outputs::get`] as typed values (a copy; `T` is any plain-old-data type such
    /// as `u32` or `f32`, little-endian as the device wrote it). An `Err` starting
    /// `Fix:` when the item's length is not a whole number of `T`.
    pub fn read<T: Pod>(&self, name: &str) -> Result<Vec<T>, BackendError> {
        typed(self.get(name)?, name)
    }

    /// Every item's bytes, back to back (the items' lengths are the readback plan's).
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The items in order.
    pub fn iter(&self) -> Items<'_> {
        Items {
            outputs: self,
            next: 0,
        }
    }

    /// One `Vec` per item (allocates once per item).
    pub fn into_vecs(self) -> Vec<Vec<u8>> {
        self.iter().map(<[u8]>::to_vec).collect()
    }
}

/// `bytes` as values of `T`, copied into a properly aligned `Vec`.
pub(in crate::backend) fn typed<T: Pod>(bytes: &[u8], what: &str) -> Result<Vec<T>, BackendError> {
    let size = std::mem::size_of::<T>();
    if size == 0 || !bytes.len().is_multiple_of(size) {
        return Err(BackendError::bad_input(format!(
            "Fix: '{what}' holds {} bytes, not a whole number of {size}-byte values; read it as \
             a type whose size divides its length (bytes as u8)",
            bytes.len()
        )));
    }
    let mut values = vec![T::zeroed(); bytes.len() / size];
    bytemuck::cast_slice_mut::<T, u8>(&mut values).copy_from_slice(bytes);
    Ok(values)
}

/// The items of an [`Outputs`], in order.
#[derive(Clone, Debug)]
pub struct Items<'o> {
    outputs: &'o Outputs,
    next: usize,
}

impl<'o> Iterator for Items<'o> {
    type Item = &'o [u8];

    fn next(&mut self) -> Option<&'o [u8]> {
        let item = self.outputs.item(self.next)?;
        self.next += 1;
        Some(item)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.outputs.len() - self.next;
        (left, Some(left))
    }
}

impl ExactSizeIterator for Items<'_> {}

impl<'o> IntoIterator for &'o Outputs {
    type Item = &'o [u8];
    type IntoIter = Items<'o>;

    fn into_iter(self) -> Items<'o> {
        self.iter()
    }
}

impl From<Outputs> for Vec<Vec<u8>> {
    fn from(outputs: Outputs) -> Vec<Vec<u8>> {
        outputs.into_vecs()
    }
}

impl PartialEq for Outputs {
    /// The same items (bytes, boundaries and bindings); the kernel is not compared.
    fn eq(&self, other: &Outputs) -> bool {
        self.bytes == other.bytes && self.ends == other.ends && self.bindings == other.bindings
    }
}

impl Eq for Outputs {}

impl PartialEq<Vec<Vec<u8>>> for Outputs {
    /// The same bytes cut into the same items (the reference interpreter's form).
    fn eq(&self, other: &Vec<Vec<u8>>) -> bool {
        self.len() == other.len() && self.iter().zip(other).all(|(a, b)| a == b.as_slice())
    }
}

impl PartialEq<Outputs> for Vec<Vec<u8>> {
    fn eq(&self, other: &Outputs) -> bool {
        other == self
    }
}

impl fmt::Debug for Outputs {
    /// A list of byte lists, like the `Vec<Vec<u8>>` the reference returns.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outputs(items: &[(u32, &[u8])]) -> Outputs {
        let mut outputs = Outputs::with_capacity(0, None);
        for &(binding, bytes) in items {
            outputs.push(binding, bytes);
        }
        outputs
    }

    /// Locks out items that bleed into each other or lose their order, their
    /// boundaries (empty items included) or their bindings, and a comparison with
    /// the reference's `Vec<Vec<u8>>` that ignores a split: the same bytes cut
    /// differently are not equal.
    #[test]
    fn items_keep_their_bytes_order_boundaries_and_bindings() {
        let items: Vec<Vec<u8>> = vec![vec![1, 2, 3], vec![], vec![4], vec![5, 6]];
        let outputs = outputs(&[(1, &[1, 2, 3]), (2, &[]), (5, &[4]), (7, &[5, 6])]);
        assert_eq!(outputs.len(), 4);
        assert!(!outputs.is_empty());
        assert_eq!(outputs.item(0), Some(&[1u8, 2, 3][..]));
        assert_eq!(outputs.item(1), Some(&[][..]));
        assert_eq!(outputs.item(3), Some(&[5u8, 6][..]));
        assert_eq!(outputs.item(4), None);
        assert_eq!(outputs.item_binding(2), Some(5));
        assert_eq!(outputs.binding(7).unwrap(), &[5, 6]);
        assert_eq!(outputs.iter().len(), 4);
        assert_eq!(outputs, items);
        assert_eq!(items, outputs);
        assert_eq!(outputs.as_bytes(), &[1, 2, 3, 4, 5, 6]);
        assert_eq!(format!("{outputs:?}"), format!("{items:?}"));
        assert_eq!(outputs.clone().into_vecs(), items);
        let split_elsewhere: Vec<Vec<u8>> = vec![vec![1, 2], vec![3], vec![4], vec![5, 6]];
        assert_ne!(outputs, split_elsewhere);
        assert_ne!(outputs, items[..3].to_vec());
        assert!(Outputs::default().is_empty());
    }

    /// Locks out a lookup by binding that answers with another buffer's bytes or
    /// guesses among several ranges of one buffer: a binding nothing was read from
    /// and a binding read twice are both `Fix:` errors, never some item's bytes.
    #[test]
    fn lookups_by_binding_refuse_missing_and_ambiguous_items() {
        let outputs = outputs(&[(1, &[1]), (3, &[2]), (3, &[3])]);
        assert_eq!(outputs.binding(1).unwrap(), &[1]);
        for binding in [0, 3] {
            let message = outputs.binding(binding).unwrap_err().to_string();
            assert!(message.starts_with("Fix:"), "{message}");
        }
        let message = outputs.get("out").unwrap_err().to_string();
        assert!(message.contains("Outputs::binding"), "{message}");
    }

    /// Locks out a one-call fill that misplaces item boundaries or bindings: items
    /// filled back to back by one call equal the same items pushed one by one, after
    /// an earlier item and with an empty item among them.
    #[test]
    fn items_filled_in_one_call_equal_items_pushed_one_by_one() {
        let one_by_one = outputs(&[(4, &[9]), (1, &[1, 2, 3]), (2, &[]), (5, &[4, 5])]);
        let mut filled = outputs(&[(4, &[9])]);
        filled.push_filled([(1, 3), (2, 0), (5, 2)], |bytes| {
            bytes.copy_from_slice(&[1, 2, 3, 4, 5])
        });
        assert_eq!(filled.as_bytes(), one_by_one.as_bytes());
        assert_eq!(filled.len(), one_by_one.len());
        for index in 0..one_by_one.len() {
            assert_eq!(filled.item(index), one_by_one.item(index));
            assert_eq!(filled.item_binding(index), one_by_one.item_binding(index));
        }
    }

    /// Locks out typed reads that misalign or truncate: whole words come back in
    /// order, and a length that is not a whole number of values is a `Fix:` error.
    #[test]
    fn typed_reads_copy_whole_values_only() {
        let bytes: Vec<u8> = [7u32, u32::MAX]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        // From an odd offset: the copy realigns instead of failing or misreading.
        let mut shifted = vec![0u8];
        shifted.extend_from_slice(&bytes);
        if cfg!(target_endian = "little") {
            assert_eq!(typed::<u32>(&shifted[1..], "x").unwrap(), [7, u32::MAX]);
        }
        let message = typed::<u32>(&bytes[..6], "x").unwrap_err().to_string();
        assert!(message.starts_with("Fix:"), "{message}");
    }
}
