//! The bytes one dispatch read back, in one allocation.
//!
//! # Why
//!
//! A dispatch's outputs used to come back as `Vec<Vec<u8>>`: one heap allocation (and
//! one free when the caller drops it) per readback item. For the small outputs the
//! result ABI delivers at the physical limit that became a visible share of the host
//! cost: measured on the build machine (2026-12-01), 16 output `Vec`s of 16 bytes
//! allocated, filled and dropped cost 0.50 µs; on the H200 the 17-buffer fixture's
//! resident dispatch spent 3.4 µs above the raw result-ABI floor, and its readback
//! phase grew by 0.58 µs from 1 output to 16. [`Outputs`] keeps
//! every item's bytes back to back in one `Vec<u8>` and their end offsets inline (no
//! allocation for up to [`INLINE_ITEMS`] items), so a dispatch allocates once, and
//! not at all when it reads nothing back.
//!
//! It reads like the old type: `outputs[i]` is item `i`'s bytes, `outputs.len()` the
//! item count, `&outputs` iterates the items, and it compares equal to a
//! `Vec<Vec<u8>>` (the reference interpreter's form) holding the same bytes;
//! [`Outputs::into_vecs`] converts.

use std::fmt;
use std::ops::Index;

use smallvec::SmallVec;

/// Readback items an [`Outputs`] records without a heap allocation for their offsets.
pub const INLINE_ITEMS: usize = 16;

/// The bytes a dispatch read back: one item per readback item (see
/// [`ReadbackPolicy`](crate::ReadbackPolicy)), in order, stored back to back.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Outputs {
    bytes: Vec<u8>,
    /// End offset in `bytes` of each item.
    ends: SmallVec<[usize; INLINE_ITEMS]>,
}

impl Outputs {
    /// No items yet, room for `bytes` bytes.
    pub(crate) fn with_capacity(bytes: usize) -> Outputs {
        Outputs {
            bytes: Vec::with_capacity(bytes),
            ends: SmallVec::new(),
        }
    }

    /// Append one item.
    pub(crate) fn push(&mut self, item: &[u8]) {
        self.bytes.extend_from_slice(item);
        self.ends.push(self.bytes.len());
    }

    /// How many items (readback items of the dispatch).
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether the dispatch read nothing back.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Item `index`'s bytes, or `None` past the last item.
    pub fn get(&self, index: usize) -> Option<&[u8]> {
        let end = *self.ends.get(index)?;
        let start = if index == 0 { 0 } else { self.ends[index - 1] };
        Some(&self.bytes[start..end])
    }

    /// The items in order.
    pub fn iter(&self) -> Items<'_> {
        Items {
            outputs: self,
            next: 0,
        }
    }

    /// Every item's bytes, back to back (the items' lengths are the readback plan's).
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// One `Vec` per item (allocates once per item).
    pub fn into_vecs(self) -> Vec<Vec<u8>> {
        self.iter().map(<[u8]>::to_vec).collect()
    }
}

impl Index<usize> for Outputs {
    type Output = [u8];

    /// Item `index`'s bytes. Panics past the last item, like indexing a `Vec`; use
    /// [`Outputs::get`] for a checked lookup.
    fn index(&self, index: usize) -> &[u8] {
        match self.get(index) {
            Some(item) => item,
            None => panic!(
                "readback item {index} of a dispatch with {} items",
                self.len()
            ),
        }
    }
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
        let item = self.outputs.get(self.next)?;
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

impl IntoIterator for Outputs {
    type Item = Vec<u8>;
    type IntoIter = std::vec::IntoIter<Vec<u8>>;

    /// Owned items (one allocation each), for code that keeps them apart.
    fn into_iter(self) -> Self::IntoIter {
        self.into_vecs().into_iter()
    }
}

impl From<Outputs> for Vec<Vec<u8>> {
    fn from(outputs: Outputs) -> Vec<Vec<u8>> {
        outputs.into_vecs()
    }
}

impl From<&[Vec<u8>]> for Outputs {
    fn from(items: &[Vec<u8>]) -> Outputs {
        let mut outputs = Outputs::with_capacity(items.iter().map(Vec::len).sum());
        for item in items {
            outputs.push(item);
        }
        outputs
    }
}

impl PartialEq<Vec<Vec<u8>>> for Outputs {
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
    /// Like the `Vec<Vec<u8>>` it replaces: a list of byte lists.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Locks out items that bleed into each other or lose their order or their
    /// boundaries (empty items included), and a comparison with the reference's
    /// `Vec<Vec<u8>>` that ignores a split: the same bytes cut differently are not
    /// equal.
    #[test]
    fn items_keep_their_bytes_order_and_boundaries() {
        let items: Vec<Vec<u8>> = vec![vec![1, 2, 3], vec![], vec![4], vec![5, 6]];
        let outputs = Outputs::from(&items[..]);
        assert_eq!(outputs.len(), 4);
        assert!(!outputs.is_empty());
        assert_eq!(&outputs[0], &[1, 2, 3]);
        assert_eq!(&outputs[1], &[] as &[u8]);
        assert_eq!(outputs.get(3), Some(&[5u8, 6][..]));
        assert_eq!(outputs.get(4), None);
        assert_eq!(outputs.iter().len(), 4);
        assert_eq!(outputs, items);
        assert_eq!(items, outputs);
        assert_eq!(outputs.as_bytes(), &[1, 2, 3, 4, 5, 6]);
        assert_eq!(format!("{outputs:?}"), format!("{items:?}"));
        assert_eq!(outputs.clone().into_vecs(), items);
        assert_eq!(outputs.clone().into_iter().collect::<Vec<_>>(), items);
        let split_elsewhere: Vec<Vec<u8>> = vec![vec![1, 2], vec![3], vec![4], vec![5, 6]];
        assert_ne!(outputs, split_elsewhere);
        assert_ne!(outputs, items[..3].to_vec());
        assert!(Outputs::default().is_empty());
    }

    /// Locks out an index past the end that returns some other item's bytes.
    #[test]
    #[should_panic(expected = "readback item 2 of a dispatch with 2 items")]
    fn indexing_past_the_last_item_panics_like_a_vec() {
        let outputs = Outputs::from(&[vec![1u8], vec![2]][..]);
        let _ = &outputs[2];
    }
}
