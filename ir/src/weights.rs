//! Weights: immutable, 64-byte-aligned, shared tensors addressed by id.

use std::collections::HashMap;
use std::sync::Arc;

use crate::aligned_memory::{Chunks, Line, Lines, MAPPED_MIN_BYTES};
use crate::types::TensorType;

/// Index of a weight in its module's [`WeightStore`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WeightId(pub u32);

/// Constants with at most this many elements are interned by value, so rules can
/// match them and equal small constants share one id.
pub const SMALL_CONSTANT_LIMIT: usize = 16;

/// An immutable byte buffer whose start is 64-byte aligned (one cache line, and enough
/// for any vector load), readable as `f32` or `i64` elements.
///
/// The bytes either belong to the buffer or are a 64-byte-aligned window of a larger
/// shared buffer ([`AlignedBuf::share`], [`AlignedBuf::slice`]): the ONNX importer reads
/// a model file once and its weights become windows of it, with no copy. A window keeps
/// its whole base alive. A third kind is computed on first read by a [`Derivation`]
/// that a pass defines ([`AlignedBuf::derived`]), so that a reader that rearranges the
/// values anyway (a weight packer) can apply the transform as it goes instead of
/// writing the intermediate result out once more.
#[derive(Clone)]
pub struct AlignedBuf {
    storage: Storage,
    /// Offset of the first byte in `storage`, a multiple of 64.
    start: usize,
    len_bytes: usize,
}

#[derive(Clone)]
enum Storage {
    Owned(Lines),
    Shared(Arc<Lines>),
    Derived(Arc<Derived>),
}

impl Storage {
    fn lines(&self) -> &[Line] {
        match self {
            Storage::Owned(v) => v.as_slice(),
            Storage::Shared(v) => v.as_slice(),
            Storage::Derived(d) => d.lines(),
        }
    }
}

/// The recipe of a buffer computed on first read ([`AlignedBuf::derived`]): a weight
/// transform a pass defines (BN folding scales the rows of a conv's weights), kept
/// unevaluated so that its readers can find it again ([`AlignedBuf::derivation`]).
pub trait Derivation: std::any::Any + Send + Sync {
    /// Bytes of the result.
    fn len_bytes(&self) -> usize;
    /// Writes the result into `out`: zeroed, exactly [`Derivation::len_bytes`] long.
    fn compute(&self, out: &mut [u8]);
}

struct Derived {
    recipe: Arc<dyn Derivation>,
    data: std::sync::OnceLock<Lines>,
}

impl Derived {
    fn lines(&self) -> &[Line] {
        self.data
            .get_or_init(|| {
                let len = self.recipe.len_bytes();
                let mut lines = Lines::zeroed(len.div_ceil(64));
                self.recipe.compute(
                    &mut bytemuck::cast_slice_mut::<Line, u8>(lines.as_mut_slice())[..len],
                );
                lines
            })
            .as_slice()
    }
}

impl AlignedBuf {
    fn owned(lines: Lines, len_bytes: usize) -> AlignedBuf {
        AlignedBuf {
            storage: Storage::Owned(lines),
            start: 0,
            len_bytes,
        }
    }

    /// Copies `values` into a new aligned buffer.
    pub fn from_f32(values: &[f32]) -> AlignedBuf {
        Self::from_bytes(bytemuck::cast_slice(values))
    }

    /// Copies `values` into a new aligned buffer.
    pub fn from_i64(values: &[i64]) -> AlignedBuf {
        Self::from_bytes(bytemuck::cast_slice(values))
    }

    /// Copies typed elements into a new aligned buffer (little-endian; `i1` as bytes 0/1).
    pub fn from_data(data: &crate::tensor::TensorData) -> AlignedBuf {
        match data {
            crate::tensor::TensorData::F32(v) => Self::from_f32(v),
            crate::tensor::TensorData::I64(v) => Self::from_i64(v),
            other => Self::from_bytes(&other.to_le_bytes()),
        }
    }

    /// Copies raw little-endian bytes into a new aligned buffer. Zeroed memory comes
    /// fresh from the allocator without a fill pass, so each byte is written once.
    pub fn from_bytes(bytes: &[u8]) -> AlignedBuf {
        let mut buf = AlignedBuf::zeroed(bytes.len());
        if let Some(dst) = buf.as_bytes_mut() {
            dst.copy_from_slice(bytes);
        }
        buf
    }

    /// A buffer of `len_bytes` zero bytes, owned (so [`AlignedBuf::as_bytes_mut`] gives
    /// access to them until it is shared).
    pub fn zeroed(len_bytes: usize) -> AlignedBuf {
        AlignedBuf::owned(Lines::zeroed(len_bytes.div_ceil(64)), len_bytes)
    }

    /// A buffer of `len_bytes` unspecified bytes (zeros, or bytes an earlier buffer of
    /// this process held) for a caller that overwrites all of them before reading any,
    /// as a file read does: a large one reuses memory without clearing it first.
    pub fn for_overwrite(len_bytes: usize) -> AlignedBuf {
        AlignedBuf::owned(Lines::for_overwrite(len_bytes.div_ceil(64)), len_bytes)
    }

    /// A buffer of `len` f32 elements written by `fill`, which receives them zeroed. The
    /// zeroed pages come from the allocator untouched, so the data is written once — no
    /// staging vector, no copy (what const folding of large weights needs).
    pub fn from_f32_with(len: usize, fill: impl FnOnce(&mut [f32])) -> AlignedBuf {
        AlignedBuf::filled(Lines::zeroed, len, fill)
    }

    /// `len` f32 elements in zeroed lines from `zeroed`, written by `fill`.
    fn filled(
        zeroed: impl FnOnce(usize) -> Lines,
        len: usize,
        fill: impl FnOnce(&mut [f32]),
    ) -> AlignedBuf {
        let len_bytes = len * 4;
        let mut lines = zeroed(len_bytes.div_ceil(64));
        fill(&mut bytemuck::cast_slice_mut::<Line, f32>(lines.as_mut_slice())[..len]);
        AlignedBuf::owned(lines, len_bytes)
    }

    /// A buffer computed from `recipe` on first read. Nothing is computed until the
    /// bytes are first read; a reader that knows the recipe's type can find it with
    /// [`AlignedBuf::derivation`] and apply it itself.
    pub fn derived(recipe: Arc<dyn Derivation>) -> AlignedBuf {
        AlignedBuf {
            start: 0,
            len_bytes: recipe.len_bytes(),
            storage: Storage::Derived(Arc::new(Derived {
                recipe,
                data: std::sync::OnceLock::new(),
            })),
        }
    }

    /// For a buffer made by [`AlignedBuf::derived`] with a recipe of type `T`: the recipe.
    pub fn derivation<T: Derivation>(&self) -> Option<&T> {
        match &self.storage {
            Storage::Derived(d) => (d.recipe.as_ref() as &dyn std::any::Any).downcast_ref(),
            _ => None,
        }
    }

    /// The bytes, writable, while the buffer owns them alone: `None` once it has been
    /// shared ([`AlignedBuf::share`]), when it is a window of another buffer, or when it
    /// is computed ([`AlignedBuf::derived`]).
    pub fn as_bytes_mut(&mut self) -> Option<&mut [u8]> {
        let lines = match &mut self.storage {
            Storage::Owned(v) => v.as_mut_slice(),
            Storage::Shared(a) => Arc::get_mut(a)?.as_mut_slice(),
            Storage::Derived(_) => return None,
        };
        let end = self.start + self.len_bytes;
        Some(&mut bytemuck::cast_slice_mut::<Line, u8>(lines)[self.start..end])
    }

    /// The same bytes, now shareable: clones and [`AlignedBuf::slice`]s of the result
    /// refer to them instead of copying.
    pub fn share(self) -> AlignedBuf {
        match self.storage {
            Storage::Owned(v) => AlignedBuf {
                storage: Storage::Shared(Arc::new(v)),
                ..self
            },
            Storage::Shared(_) | Storage::Derived(_) => self,
        }
    }

    /// `len` bytes from byte `start` (a multiple of 64, else `None`; `None` out of
    /// bounds too): a window of a shared buffer (no copy), a copy of an owned one.
    pub fn slice(&self, start: usize, len: usize) -> Option<AlignedBuf> {
        if !start.is_multiple_of(64) || start.checked_add(len)? > self.len_bytes {
            return None;
        }
        match &self.storage {
            Storage::Owned(_) | Storage::Derived(_) => {
                Some(AlignedBuf::from_bytes(&self.as_bytes()[start..start + len]))
            }
            Storage::Shared(a) => Some(AlignedBuf {
                storage: Storage::Shared(a.clone()),
                start: self.start + start,
                len_bytes: len,
            }),
        }
    }

    /// `buf` itself, unless it is a window of less than half of a shared base or is
    /// computed from other data ([`AlignedBuf::derived`]): then an owned copy, so
    /// that whoever keeps it for long (an executable) does not keep the whole base (a
    /// model file) alive.
    pub fn detached(buf: &Arc<AlignedBuf>) -> Arc<AlignedBuf> {
        match &buf.storage {
            Storage::Shared(base) if buf.len_bytes < base.len() * 64 / 2 => {
                Arc::new(AlignedBuf::from_bytes(buf.as_bytes()))
            }
            Storage::Derived(_) => Arc::new(AlignedBuf::from_bytes(buf.as_bytes())),
            _ => buf.clone(),
        }
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &bytemuck::cast_slice::<Line, u8>(self.storage.lines())
            [self.start..self.start + self.len_bytes]
    }

    /// The buffer as `f32` elements (trailing bytes that do not fill an element are ignored).
    pub fn as_f32(&self) -> &[f32] {
        let bytes = self.as_bytes();
        bytemuck::cast_slice(&bytes[..bytes.len() / 4 * 4])
    }

    /// The buffer as `i64` elements.
    pub fn as_i64(&self) -> &[i64] {
        let bytes = self.as_bytes();
        bytemuck::cast_slice(&bytes[..bytes.len() / 8 * 8])
    }

    /// Length in bytes.
    pub fn len_bytes(&self) -> usize {
        self.len_bytes
    }
}

/// Memory for the many constant buffers that live as long as each other (the packed
/// weights of one executable), carved out of a few large mappings with 2 MiB pages
/// rather than allocated one by one. Why: every first write to a fresh 4 KiB page is a
/// fault, ≈ 2.5 µs on the reference VM, and packing writes all of a model's weights
/// into fresh memory; with 2 MiB pages the same megabytes fault 512 times less often
/// (a fresh 32 MB buffer: 21–28 ms with 4 KiB pages, 4–5 ms with 2 MiB ones). A
/// buffer keeps its chunk alive, so buffers that outlive the others would hold it.
pub struct ConstantSlab {
    chunks: Chunks,
}

impl ConstantSlab {
    /// The largest chunk a slab maps at once.
    const MAX_CHUNK_BYTES: usize = 64 << 20;

    /// A slab for buffers of about `expected_bytes` in all: chunks of that size (at
    /// most 64 MiB), or none below 4 MiB, where each buffer gets memory of its own as
    /// [`AlignedBuf::from_f32_with`]'s do (a small model would not fill a 2 MiB page).
    pub fn new(expected_bytes: usize) -> ConstantSlab {
        let chunk = match expected_bytes {
            b if b < MAPPED_MIN_BYTES => 0,
            b => b.min(Self::MAX_CHUNK_BYTES),
        };
        ConstantSlab {
            chunks: Chunks::new(chunk),
        }
    }

    /// A buffer of `len` f32 elements written by `fill`, which receives them zeroed (as
    /// [`AlignedBuf::from_f32_with`]), carved out of the slab.
    pub fn f32_with(&self, len: usize, fill: impl FnOnce(&mut [f32])) -> AlignedBuf {
        AlignedBuf::filled(|lines| self.chunks.zeroed(lines), len, fill)
    }

    /// [`ConstantSlab::f32_with`] for a `fill` that writes every one of the `len`
    /// elements: it receives them holding anything (zeros, or what an earlier buffer of
    /// this process left), so reused memory is not cleared first (Winograd's transformed
    /// weights: ≈ 0.1 ms per MB). The bytes past `len` in the last line are zeroed.
    pub fn f32_overwritten(&self, len: usize, fill: impl FnOnce(&mut [f32])) -> AlignedBuf {
        let len_bytes = len * 4;
        let mut lines = self.chunks.for_overwrite(len_bytes.div_ceil(64));
        let all = bytemuck::cast_slice_mut::<Line, f32>(lines.as_mut_slice());
        let (ours, past) = all.split_at_mut(len);
        past.fill(0.0);
        fill(ours);
        AlignedBuf::owned(lines, len_bytes)
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len_bytes)
    }
}

/// Where a weight's data came from; the printer uses it to write the weight back the same way.
#[derive(Clone, Debug, PartialEq)]
pub enum WeightOrigin {
    /// Written out element by element (`dense<[...]>`) or as a splat (`dense<1.0>`).
    Inline,
    /// Deterministic pseudo-random values (`random<seed = S, min = A, max = B>`),
    /// for test cases and the demo.
    Random {
        /// Generator seed.
        seed: u64,
        /// Smallest value.
        min: f32,
        /// Largest value.
        max: f32,
    },
    /// A named tensor in a sidecar file beside the text file.
    External {
        /// File name, relative to the text file's directory.
        file: String,
        /// Tensor name inside the file.
        key: String,
    },
    /// Made by a pass or an importer; has no textual origin.
    Computed,
}

/// One weight: a name, a type, immutable data.
#[derive(Clone, Debug)]
pub struct Weight {
    /// Name without the `@`; unique in the module.
    pub name: String,
    /// Type of the data (row-major unless the weight is a packed format).
    pub ty: TensorType,
    /// The elements, in `ty`'s storage order.
    pub data: Arc<AlignedBuf>,
    /// How the text form writes it.
    pub origin: WeightOrigin,
}

impl Weight {
    /// The data as f32 values.
    pub fn f32s(&self) -> &[f32] {
        self.data.as_f32()
    }

    /// The stored elements, typed by the weight's element type (storage order); `None`
    /// when the bytes are not a whole number of elements or an `i1` byte is not 0 or 1.
    pub fn elements(&self) -> Option<crate::tensor::TensorData> {
        crate::tensor::TensorData::from_le_bytes(self.ty.dtype, self.data.as_bytes())
    }

    /// A short stable content hash (FNV-1a 64 over type and bytes), printed for elided weights.
    pub fn content_hash(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |b: u8| {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        };
        for b in self
            .ty
            .to_string()
            .bytes()
            .chain(self.data.as_bytes().iter().copied())
        {
            eat(b);
        }
        h
    }
}

/// All weights of a module, addressed by [`WeightId`].
#[derive(Clone, Debug, Default)]
pub struct WeightStore {
    weights: Vec<Weight>,
    by_name: HashMap<String, WeightId>,
    small: HashMap<(TensorType, Vec<u8>), WeightId>,
    /// Bytes of every weight's type (a derived weight counts before it is computed).
    bytes: u64,
    /// The memory budget; `None` is [`crate::budget::default_memory_budget`].
    budget: Option<u64>,
}

impl WeightStore {
    /// An empty store.
    pub fn new() -> WeightStore {
        WeightStore::default()
    }

    /// Adds a weight under `name`. Small weights equal in type and bytes to an existing
    /// small weight return that weight's id instead. Fails if the name is taken or the
    /// data length does not match the type.
    pub fn add(
        &mut self,
        name: impl Into<String>,
        ty: TensorType,
        data: AlignedBuf,
        origin: WeightOrigin,
    ) -> Result<WeightId, String> {
        self.add_shared(name, ty, Arc::new(data), origin)
    }

    /// Like [`WeightStore::add`], sharing an existing buffer instead of copying it
    /// (used when a pass rebuilds a store from another).
    pub fn add_shared(
        &mut self,
        name: impl Into<String>,
        ty: TensorType,
        data: Arc<AlignedBuf>,
        origin: WeightOrigin,
    ) -> Result<WeightId, String> {
        let name = name.into();
        ty.check_size()?;
        let want = ty.storage_len() * ty.dtype.size_bytes();
        if data.len_bytes() != want {
            return Err(format!(
                "weight @{name} of type {ty} needs {want} bytes of data, got {}",
                data.len_bytes()
            ));
        }
        let small_key = (ty.num_elements() <= SMALL_CONSTANT_LIMIT)
            .then(|| (ty.clone(), data.as_bytes().to_vec()));
        if let Some(id) = small_key.as_ref().and_then(|k| self.small.get(k)) {
            let id = *id;
            self.by_name.entry(name).or_insert(id);
            return Ok(id);
        }
        if self.by_name.contains_key(&name) {
            return Err(format!("weight @{name} is defined twice"));
        }
        let id = WeightId(self.weights.len() as u32);
        self.by_name.insert(name.clone(), id);
        if let Some(k) = small_key {
            self.small.insert(k, id);
        }
        self.bytes = self.bytes.saturating_add(want as u64);
        self.weights.push(Weight {
            name,
            ty,
            data,
            origin,
        });
        Ok(id)
    }

    /// Adds a computed weight of any element type under a fresh name derived from `hint`.
    pub fn add_computed_data(
        &mut self,
        hint: &str,
        ty: TensorType,
        values: &crate::tensor::TensorData,
    ) -> Result<WeightId, String> {
        if values.dtype() != ty.dtype {
            return Err(format!(
                "computed weight {hint} of type {ty} was given {} elements",
                values.dtype()
            ));
        }
        let name = self.fresh_name(hint);
        self.add(
            name,
            ty,
            AlignedBuf::from_data(values),
            WeightOrigin::Computed,
        )
    }

    /// An empty store with this store's memory budget (for a pass that rebuilds one).
    pub fn empty_like(&self) -> WeightStore {
        WeightStore {
            budget: self.budget,
            ..WeightStore::default()
        }
    }

    /// The memory budget in bytes that loading, const_fold and compilation check
    /// against (see [`crate::budget`]).
    pub fn memory_budget(&self) -> u64 {
        self.budget
            .unwrap_or_else(crate::budget::default_memory_budget)
    }

    /// Sets the memory budget (`None`: the machine's default).
    pub fn set_memory_budget(&mut self, budget: Option<u64>) {
        self.budget = budget;
    }

    /// Bytes held by the weights (by their types).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Checks, before allocating, that `bytes` more fit beside the weights within the
    /// budget; the error names `what` and the bytes.
    pub fn check_room(&self, what: &str, bytes: u64) -> Result<(), String> {
        crate::budget::check(what, bytes, self.bytes, self.memory_budget())
    }

    /// Adds a computed f32 weight under a fresh name derived from `hint`.
    pub fn add_computed(
        &mut self,
        hint: &str,
        ty: TensorType,
        values: &[f32],
    ) -> Result<WeightId, String> {
        let name = self.fresh_name(hint);
        self.add(
            name,
            ty,
            AlignedBuf::from_f32(values),
            WeightOrigin::Computed,
        )
    }

    /// A name starting with `hint` not used by any weight.
    pub fn fresh_name(&self, hint: &str) -> String {
        if !self.by_name.contains_key(hint) {
            return hint.to_string();
        }
        (1..)
            .map(|i| format!("{hint}_{i}"))
            .find(|n| !self.by_name.contains_key(n))
            .expect("some suffix is free")
    }

    /// The weight with this id.
    pub fn get(&self, id: WeightId) -> Option<&Weight> {
        self.weights.get(id.0 as usize)
    }

    /// The id of the weight named `name`.
    pub fn lookup(&self, name: &str) -> Option<WeightId> {
        self.by_name.get(name).copied()
    }

    /// Type of a weight.
    pub fn type_of(&self, id: WeightId) -> Option<TensorType> {
        self.get(id).map(|w| w.ty.clone())
    }

    /// All weights in id order.
    pub fn iter(&self) -> impl Iterator<Item = (WeightId, &Weight)> {
        self.weights
            .iter()
            .enumerate()
            .map(|(i, w)| (WeightId(i as u32), w))
    }

    /// Number of weights.
    pub fn len(&self) -> usize {
        self.weights.len()
    }

    /// Whether there are no weights.
    pub fn is_empty(&self) -> bool {
        self.weights.is_empty()
    }
}

/// Deterministic pseudo-random f32 values in `[min, max]` (SplitMix64), identical on
/// every platform: the generator behind `random<...>` weights and the demo's inputs.
pub fn random_f32(seed: u64, len: usize, min: f32, max: f32) -> Vec<f32> {
    let mut state = seed;
    (0..len)
        .map(|_| {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            let unit = (z >> 40) as f32 / (1u64 << 24) as f32;
            min + (max - min) * unit
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aligned_memory::MAPPED_MIN_BYTES;

    #[test]
    fn buffers_are_aligned_and_round_trip() {
        let v: Vec<f32> = (0..37).map(|i| i as f32).collect();
        let b = AlignedBuf::from_f32(&v);
        assert_eq!(b.as_f32(), &v[..]);
        assert_eq!(b.as_f32().as_ptr() as usize % 64, 0);
    }

    /// Large buffers come from an anonymous mapping (see `aligned_memory`): zeroed, aligned,
    /// writable while owned, and cloned, windowed and dropped like small ones.
    #[test]
    fn large_buffers_are_zeroed_aligned_and_independent() {
        let len = (MAPPED_MIN_BYTES / 4) + 3;
        let b = AlignedBuf::from_f32_with(len, |out| {
            assert!(out.iter().all(|&x| x == 0.0), "fresh memory is zeroed");
            for (i, x) in out.iter_mut().enumerate() {
                *x = i as f32;
            }
        });
        assert_eq!(b.as_f32().len(), len);
        assert_eq!(b.as_f32().as_ptr() as usize % 64, 0);
        assert_eq!(b.as_f32()[len - 1], (len - 1) as f32);
        let mut copy = b.clone();
        copy.as_bytes_mut().expect("a clone owns its bytes")[..4]
            .copy_from_slice(&7.0f32.to_le_bytes());
        assert_eq!(copy.as_f32()[0], 7.0);
        assert_eq!(b.as_f32()[0], 0.0, "the original is untouched");
        let shared = b.share();
        let window = shared.slice(64, 64).expect("aligned window");
        assert_eq!(window.as_f32()[0], 16.0);
        drop(shared);
        assert_eq!(window.as_f32()[15], 31.0, "a window keeps its base alive");
        let empty = AlignedBuf::zeroed(0);
        assert!(empty.as_bytes().is_empty());
    }

    #[test]
    fn windows_of_a_shared_buffer_are_aligned_views() {
        let v: Vec<f32> = (0..100).map(|i| i as f32).collect();
        let mut owned = AlignedBuf::from_f32(&v);
        assert!(owned.as_bytes_mut().is_some());
        // an owned buffer's window is a copy
        let copy = owned.slice(64, 16).unwrap();
        assert_eq!(copy.as_f32(), &v[16..20]);
        let shared = owned.share();
        let w = shared.slice(128, 160).unwrap();
        assert_eq!(w.as_f32(), &v[32..72]);
        assert_eq!(w.as_f32().as_ptr(), shared.as_f32()[32..].as_ptr());
        assert_eq!(w.slice(64, 8).unwrap().as_f32(), &v[48..50]);
        assert!(shared.slice(4, 8).is_none(), "misaligned start");
        assert!(shared.slice(384, 32).is_none(), "past the end");
        let small = Arc::new(w.clone());
        let kept = AlignedBuf::detached(&small);
        assert!(!Arc::ptr_eq(&kept, &small), "a small window is copied");
        assert_eq!(kept.as_f32(), &v[32..72]);
        let whole = Arc::new(shared.clone());
        assert!(Arc::ptr_eq(&AlignedBuf::detached(&whole), &whole));
        let mut w = w;
        assert!(w.as_bytes_mut().is_none(), "the base is shared");
    }

    /// A recipe for tests: `len` f32 values `0, 1, 2, ...`, counting its evaluations.
    struct Iota {
        len: usize,
        runs: std::sync::atomic::AtomicUsize,
    }

    impl Derivation for Iota {
        fn len_bytes(&self) -> usize {
            self.len * 4
        }
        fn compute(&self, out: &mut [u8]) {
            self.runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            for (i, v) in out.chunks_exact_mut(4).enumerate() {
                v.copy_from_slice(&(i as f32).to_le_bytes());
            }
        }
    }

    /// A derived buffer is computed once, on first read; it gives its recipe back,
    /// refuses writes, and is copied when detached (it would keep its sources alive).
    #[test]
    fn derived_buffers_compute_once_on_first_read() {
        let recipe = Arc::new(Iota {
            len: 20,
            runs: Default::default(),
        });
        let mut b = AlignedBuf::derived(recipe.clone());
        let runs = || recipe.runs.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(b.len_bytes(), 80);
        assert_eq!(runs(), 0, "nothing computed before the first read");
        assert!(b.derivation::<Iota>().is_some_and(|r| r.len == 20));
        let want: Vec<f32> = (0..20).map(|i| i as f32).collect();
        assert_eq!(b.as_f32(), &want[..]);
        assert_eq!(b.as_f32().as_ptr() as usize % 64, 0);
        assert_eq!(b.slice(64, 16).unwrap().as_f32(), &want[16..20]);
        assert_eq!(runs(), 1, "computed once");
        assert!(b.as_bytes_mut().is_none());
        let b = Arc::new(b);
        let kept = AlignedBuf::detached(&b);
        assert!(kept.derivation::<Iota>().is_none(), "an owned copy");
        assert_eq!(kept.as_f32(), &want[..]);
        assert!(AlignedBuf::from_f32(&want).derivation::<Iota>().is_none());
    }

    #[test]
    fn small_constants_are_interned_by_value() {
        let mut s = WeightStore::new();
        let t = TensorType::f32([2]);
        let a = s
            .add(
                "a",
                t.clone(),
                AlignedBuf::from_f32(&[1.0, 2.0]),
                WeightOrigin::Inline,
            )
            .unwrap();
        let b = s
            .add(
                "b",
                t.clone(),
                AlignedBuf::from_f32(&[1.0, 2.0]),
                WeightOrigin::Inline,
            )
            .unwrap();
        let c = s
            .add(
                "c",
                t,
                AlignedBuf::from_f32(&[1.0, 3.0]),
                WeightOrigin::Inline,
            )
            .unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(s.lookup("b"), Some(a));
    }

    #[test]
    fn wrong_data_length_is_an_error() {
        let mut s = WeightStore::new();
        let r = s.add(
            "w",
            TensorType::f32([3]),
            AlignedBuf::from_f32(&[1.0]),
            WeightOrigin::Inline,
        );
        assert!(r.is_err());
    }

    #[test]
    fn random_is_deterministic_and_in_range() {
        let a = random_f32(7, 100, -1.0, 1.0);
        assert_eq!(a, random_f32(7, 100, -1.0, 1.0));
        assert!(a.iter().all(|v| (-1.0..=1.0).contains(v)));
    }
}
