//! Constants lowering computes from module weights (packed GEMM panels), kept for the
//! other compiles of the same model: a dynamic executable's buckets are the one model
//! at other sizes, whose weights are the same memory and whose panels are the same
//! bytes — computed once, held once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use smelt_ir::AlignedBuf;

/// What identifies a computed constant: the weight it was computed from (the address
/// and length of its elements) and how (a recipe naming every parameter the computation
/// reads).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ConstantKey {
    source: (usize, usize),
    recipe: String,
}

impl ConstantKey {
    /// The key of `recipe` applied to `source`.
    pub(crate) fn new(source: &AlignedBuf, recipe: String) -> ConstantKey {
        let bytes = source.as_bytes();
        ConstantKey {
            source: (bytes.as_ptr() as usize, bytes.len()),
            recipe,
        }
    }
}

/// One cached constant and the weight it came from, held so that its memory — the key's
/// address — cannot be freed and reused by another weight while the entry lives.
struct Entry {
    _source: Arc<AlignedBuf>,
    computed: Arc<AlignedBuf>,
}

/// Computed constants shared by the compiles that are given the same cache
/// ([`LowerOptions::constants`](super::LowerOptions::constants)); safe to share across
/// threads. It holds at most one copy of each, for as long as it lives.
#[derive(Default)]
pub struct ConstantCache {
    entries: Mutex<HashMap<ConstantKey, Entry>>,
    /// Lookups that found their constant.
    hits: std::sync::atomic::AtomicUsize,
}

/// What a [`ConstantCache`] holds and has saved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConstantUsage {
    /// Constants held.
    pub constants: usize,
    /// Their bytes.
    pub bytes: usize,
    /// Constants a compile took from the cache instead of computing them.
    pub hits: usize,
}

impl ConstantCache {
    /// An empty cache.
    pub fn new() -> ConstantCache {
        ConstantCache::default()
    }

    /// The constant computed for `key`, if any.
    pub(crate) fn get(&self, key: &ConstantKey) -> Option<Arc<AlignedBuf>> {
        let entries = self.entries.lock().ok()?;
        let found = entries.get(key).map(|e| e.computed.clone());
        if found.is_some() {
            self.hits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        found
    }

    /// Keeps `computed`, made from `source` as `key` says.
    pub(crate) fn insert(
        &self,
        key: ConstantKey,
        source: Arc<AlignedBuf>,
        computed: Arc<AlignedBuf>,
    ) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.entry(key).or_insert(Entry {
                _source: source,
                computed,
            });
        }
    }

    /// What it holds and has saved.
    pub fn usage(&self) -> ConstantUsage {
        let hits = self.hits.load(std::sync::atomic::Ordering::Relaxed);
        self.entries
            .lock()
            .map_or(ConstantUsage::default(), |e| ConstantUsage {
                constants: e.len(),
                bytes: e.values().map(|v| v.computed.len_bytes()).sum(),
                hits,
            })
    }
}

impl std::fmt::Debug for ConstantCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let u = self.usage();
        write!(
            f,
            "ConstantCache({} constants, {} bytes)",
            u.constants, u.bytes
        )
    }
}

/// Caches compare by identity: two options are the same when they share one.
impl PartialEq for ConstantCache {
    fn eq(&self, other: &ConstantCache) -> bool {
        std::ptr::eq(self, other)
    }
}

impl Eq for ConstantCache {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key names its source by address: the same bytes elsewhere, or the same source
    /// with another recipe, are other constants; an entry keeps its source alive.
    #[test]
    fn keys_name_the_source_memory_and_the_recipe() {
        let cache = ConstantCache::new();
        let a = Arc::new(AlignedBuf::from_f32(&[1.0, 2.0]));
        let b = Arc::new(AlignedBuf::from_f32(&[1.0, 2.0]));
        let key = ConstantKey::new(&a, "pack 2".into());
        cache.insert(
            key.clone(),
            a.clone(),
            Arc::new(AlignedBuf::from_f32(&[9.0])),
        );
        assert_eq!(
            cache.get(&key).map(|c| c.as_f32().to_vec()),
            Some(vec![9.0])
        );
        assert!(cache.get(&ConstantKey::new(&b, "pack 2".into())).is_none());
        assert!(cache.get(&ConstantKey::new(&a, "pack 3".into())).is_none());
        let usage = cache.usage();
        assert_eq!((usage.constants, usage.bytes, usage.hits), (1, 4, 1));
        assert_eq!(Arc::strong_count(&a), 2, "the entry holds its source");
    }
}
