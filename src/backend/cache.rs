//! Caches: validation, PTX source, module and plan caches, with the keys
//! that decide identity and the hit/miss counters that prove they work.
//!
//! Identity: a PTX source is keyed by the (lowered) program's content digest, the
//! dispatch-policy digest, the target SM, the subgroup size and the pipeline
//! feature flags; a module is keyed by a digest of that PTX key. Because the
//! program digest is memoised inside the program value (and lowering memoises its
//! result), a warm lookup hashes ~60 bytes and walks no program. The reference
//! dispatch backend we measured re-walked the program per dispatch (44 → 110 µs
//! from 64 to 4,096 nodes); this is what keeps ours flat.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::ir::{Digest, ValidationError};

use super::caps::PipelineFeatures;

/// Identity of one PTX source text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PtxKey {
    /// Content digest of the lowered program.
    pub program: Digest,
    /// Dispatch-policy (code-generation options) digest.
    pub policy: u64,
    /// PTX `.target sm_XX`.
    pub sm: u32,
    /// Lanes per subgroup.
    pub subgroup_size: u32,
    /// Pipeline feature flags.
    pub features: PipelineFeatures,
}

/// Identity of one loaded module: a 128-bit digest of its [`PtxKey`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ModuleKey(pub u128);

impl PtxKey {
    /// The module key: two independent 64-bit mixes of every key byte. The program
    /// digest inside is already a SHA-256, so this only needs to spread, not resist
    /// attack; it costs tens of nanoseconds instead of a second SHA-256 per dispatch.
    pub fn module_key(&self) -> ModuleKey {
        let mut words = [0u64; 7];
        for (i, chunk) in self.program.0.chunks_exact(8).enumerate() {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            words[i] = u64::from_le_bytes(b);
        }
        words[4] = self.policy;
        words[5] = ((self.sm as u64) << 32) | self.subgroup_size as u64;
        words[6] = self.features.0 as u64;
        let mix = |seed: u64| {
            let mut h = seed;
            for w in words {
                h ^= w;
                h = h.wrapping_mul(0x9E37_79B9_7F4A_7C15);
                h ^= h >> 29;
                h = h.wrapping_mul(0xBF58_476D_1CE4_E5B9);
                h ^= h >> 32;
            }
            h
        };
        ModuleKey(((mix(0x243F_6A88_85A3_08D3) as u128) << 64) | mix(0x1319_8A2E_0370_7344) as u128)
    }
}

/// A hit/miss counter pair.
#[derive(Default, Debug)]
pub(in crate::backend) struct Counter {
    hits: AtomicU64,
    misses: AtomicU64,
}

impl Counter {
    #[inline]
    pub(in crate::backend) fn hit(&self) {
        self.hits.fetch_add(1, Ordering::Relaxed);
    }
    #[inline]
    pub(in crate::backend) fn miss(&self) {
        self.misses.fetch_add(1, Ordering::Relaxed);
    }
    pub(in crate::backend) fn read(&self) -> HitMiss {
        HitMiss {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
        }
    }
}

/// Hits and misses of one cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HitMiss {
    /// Lookups served from the cache.
    pub hits: u64,
    /// Lookups that had to build the value.
    pub misses: u64,
}

/// Counters of every cache of a backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CacheStats {
    /// Validation cache (programs validated once).
    pub validation: HitMiss,
    /// PTX source cache.
    pub ptx: HitMiss,
    /// Module cache (driver JIT once per PTX).
    pub module: HitMiss,
    /// Launch-plan cache.
    pub plan: HitMiss,
    /// Entries in the PTX cache.
    pub ptx_entries: u64,
    /// Entries in the module cache.
    pub module_entries: u64,
}

/// A concurrent map with counters: readers share, a miss builds outside any lock
/// and the first insert wins (so concurrent misses of one key agree on one value).
pub(in crate::backend) struct CountedCache<K, V> {
    map: RwLock<HashMap<K, V, BuildHasherDefault<DigestHasher>>>,
    pub(in crate::backend) counter: Counter,
}

impl<K: Hash + Eq + Copy, V: Clone> CountedCache<K, V> {
    pub(in crate::backend) fn new() -> Self {
        CountedCache {
            map: RwLock::new(HashMap::default()),
            counter: Counter::default(),
        }
    }

    #[inline]
    pub(in crate::backend) fn get(&self, key: &K) -> Option<V> {
        let found = self
            .map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned();
        match found {
            Some(_) => self.counter.hit(),
            None => self.counter.miss(),
        }
        found
    }

    /// Insert unless present; returns the value that is in the map afterwards.
    pub(in crate::backend) fn insert(&self, key: K, value: V) -> V {
        self.map
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key)
            .or_insert(value)
            .clone()
    }

    pub(in crate::backend) fn len(&self) -> u64 {
        self.map.read().unwrap_or_else(|p| p.into_inner()).len() as u64
    }

    /// Empty the map; when `leak` is set the values are forgotten, not dropped
    /// (their driver handles died with a reset context).
    pub(in crate::backend) fn clear(&self, leak: bool) {
        let drained = std::mem::take(&mut *self.map.write().unwrap_or_else(|p| p.into_inner()));
        if leak {
            std::mem::forget(drained);
        }
    }
}

/// Validation results by program digest.
pub(in crate::backend) type ValidationCache =
    CountedCache<Digest, Result<(), Arc<ValidationError>>>;

/// A hasher for keys that are already digests: never used for attacker-chosen
/// keys, and faster than SipHash on the hot path.
#[derive(Default)]
pub(in crate::backend) struct DigestHasher(u64);

impl Hasher for DigestHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.0 = (self.0 ^ u64::from_le_bytes(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> PtxKey {
        PtxKey {
            program: Digest([7; 32]),
            policy: 1,
            sm: 90,
            subgroup_size: 32,
            features: PipelineFeatures(7),
        }
    }

    /// Locks out a PTX key component that does not take part in identity: changing
    /// any one component must change both the PTX key and the module key.
    #[test]
    fn every_key_component_moves_the_keys() {
        let base = key();
        let mut program = base;
        program.program.0[31] ^= 1;
        let variants = [
            program,
            PtxKey { policy: 2, ..base },
            PtxKey { sm: 89, ..base },
            PtxKey {
                subgroup_size: 64,
                ..base
            },
            PtxKey {
                features: PipelineFeatures(3),
                ..base
            },
        ];
        for v in variants {
            assert_ne!(v, base);
            assert_ne!(v.module_key(), base.module_key(), "{v:?}");
        }
        assert_eq!(
            base.module_key(),
            key().module_key(),
            "module key is deterministic"
        );
    }

    /// Locks out counters that do not count: a miss then a hit are both recorded, and
    /// concurrent inserts of one key agree on the first value.
    #[test]
    fn counted_cache_counts_and_first_insert_wins() {
        let cache: CountedCache<u32, &str> = CountedCache::new();
        assert_eq!(cache.get(&1), None);
        assert_eq!(cache.insert(1, "first"), "first");
        assert_eq!(cache.insert(1, "second"), "first");
        assert_eq!(cache.get(&1), Some("first"));
        assert_eq!(cache.counter.read(), HitMiss { hits: 1, misses: 1 });
        assert_eq!(cache.len(), 1);
    }
}
